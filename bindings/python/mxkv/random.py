"""``mxkv.random`` (``mxnet.random``): ``seed`` and the samplers of ``mxkv.nd.random``.

Samples are computed with numpy (libmxkv has no operators); on CPU contexts they are the
numbers MXNet 1.9.1 draws after the same seed, bit for bit.
"""
from .ndarray.random import seed, uniform, normal, randn, randint  # noqa: F401

__all__ = ['seed', 'uniform', 'normal', 'randn', 'randint']
