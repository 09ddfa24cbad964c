"""``mxkv.optimizer``: optimizers whose updates match MXNet 1.9.1's kernels bit for bit."""
from . import optimizer
from .optimizer import *  # pylint: disable=wildcard-import
from .optimizer import Optimizer, Updater, create, get_updater, register
