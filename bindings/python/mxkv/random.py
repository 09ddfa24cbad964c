"""``mxkv.random`` (``mxnet.random``): ``seed`` and the samplers of ``mxkv.nd.random``.

Samples come from numpy (libmxkv has no operators): a seed makes mxkv's draws
reproducible, but they are not the numbers MXNet draws for the same seed.
"""
from .ndarray.random import seed, uniform, normal, randn, randint  # noqa: F401

__all__ = ['seed', 'uniform', 'normal', 'randn', 'randint']
