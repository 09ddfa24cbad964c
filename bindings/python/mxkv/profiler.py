"""The part of ``mxnet.profiler`` the KVStore frontend touches."""
_STATE = {'kvstore_handle': None}


def set_kvstore_handle(handle):
    """Remember the store whose servers profiler commands would go to (no-op otherwise)."""
    _STATE['kvstore_handle'] = handle
