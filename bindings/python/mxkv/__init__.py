"""mxkv: MXNet 1.9.1's KVStore API (``mxnet.kv``) over libmxkv.

    import mxkv as mx
    kv = mx.kv.create('local')

The library is found through ``MXKV_LIBRARY_PATH``, next to this package, or
in a ``target/release`` build folder above it (see ``mxkv._lib``).
"""
from . import base
from .base import MXNetError, library_path
from . import error
from .context import Context, cpu, gpu, cpu_pinned, current_context
from . import ndarray
from . import ndarray as nd
from . import lr_scheduler
from . import optimizer
from . import profiler
from . import kvstore
from . import kvstore as kv
from . import random

__version__ = base.__version__

# DMLC_ROLE=server or scheduler: serve until the cluster shuts down, then exit (as MXNet).
from .kvstore import kvstore_server as _kvstore_server
_kvstore_server._init_kvstore_server_module()

__all__ = ['base', 'MXNetError', 'Context', 'cpu', 'gpu', 'cpu_pinned', 'current_context',
           'nd', 'ndarray', 'optimizer', 'lr_scheduler', 'kv', 'kvstore', 'profiler', 'error',
           'random']
