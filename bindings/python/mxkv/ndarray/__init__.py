"""``mxkv.nd``: NDArrays backed by libmxkv (the part of ``mxnet.nd`` a KVStore user needs)."""
from . import ndarray, utils, sparse, random
from .ndarray import *  # pylint: disable=wildcard-import
from .ndarray import _ndarray_cls, _new_alloc_handle, bfloat16
from ._update_ops import *  # pylint: disable=wildcard-import
from .utils import save, load, load_frombuffer
from ._reduce import sum, sum_axis  # pylint: disable=redefined-builtin
from .sparse import RowSparseNDArray, CSRNDArray
from .random import random_uniform, random_normal
from .random import random_uniform as uniform, random_normal as normal  # MXNet's operator names
