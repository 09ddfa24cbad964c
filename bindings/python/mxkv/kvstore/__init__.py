"""``mxkv.kv``: key-value stores (the ``mxnet.kvstore`` API)."""
from .kvstore import KVStore
from .base import create, KVStoreBase

__all__ = ['KVStore', 'KVStoreBase', 'create']
