"""save / load of NDArrays in MXNet's ``.params`` format (MXNDArraySave / MXNDArrayLoad)."""
import ctypes
import os

from ..base import _LIB, check_call, c_str, c_str_array, c_handle_array, NDArrayHandle, \
    string_types, py_str, MXKVUsageError
from .ndarray import NDArray, _ndarray_cls

__all__ = ['save', 'load', 'load_frombuffer']


def save(fname, data):
    """Save an NDArray, a list of NDArrays or a dict str -> NDArray to `fname` (MXNet's
    checks: TypeError for other keys or values, ValueError for other containers)."""
    if isinstance(data, NDArray):
        data = [data]
    if isinstance(data, dict):
        keys = list(data.keys())
        vals = [data[k] for k in keys]
        if any(not isinstance(k, string_types) for k in keys) or \
                any(not isinstance(v, NDArray) for v in vals):
            raise TypeError('save only accept dict str->NDArray or list of NDArray')
        ckeys = c_str_array(keys)
    elif isinstance(data, list):
        if any(not isinstance(v, NDArray) for v in data):
            raise TypeError('save only accept dict str->NDArray or list of NDArray')
        vals, ckeys = list(data), None
    else:
        raise ValueError('data needs to either be a NDArray, dict of str, NDArray pairs '
                         'or a list of NDarrays.')
    check_call(_LIB.MXNDArraySave(c_str(fname), len(vals), c_handle_array(vals), ckeys))


def load(fname):
    """Load what :func:`save` wrote: a list, or a dict when names were saved."""
    if not isinstance(fname, string_types):
        raise TypeError('fname required to be a string')
    out_size = ctypes.c_uint32()
    out_name_size = ctypes.c_uint32()
    handles = ctypes.POINTER(ctypes.c_void_p)()
    names = ctypes.POINTER(ctypes.c_char_p)()
    check_call(_LIB.MXNDArrayLoad(c_str(fname), ctypes.byref(out_size), ctypes.byref(handles),
                                  ctypes.byref(out_name_size), ctypes.byref(names)))
    return _loaded(out_size, handles, out_name_size, names)


def load_frombuffer(buf):
    """Load what :func:`save` wrote from the bytes of a file, as MXNet's
    ``nd.load_frombuffer`` (which reads ``len(buf) % 2**32`` bytes: its length argument is
    an mx_uint; a str goes as ctypes passes it, a wchar_t string), through
    MXNDArrayLoadFromBuffer; a library without it (an older libmxkv) loads the bytes
    through an in-memory file (memfd)."""
    if not isinstance(buf, string_types + (bytes,)):
        raise TypeError('buf required to be a string or bytes')
    size = len(buf) % 2 ** 32
    data = buf.encode('utf-32-le')[:size] if isinstance(buf, str) else buf[:size]
    out_size = ctypes.c_uint32()
    out_name_size = ctypes.c_uint32()
    handles = ctypes.POINTER(ctypes.c_void_p)()
    names = ctypes.POINTER(ctypes.c_char_p)()
    try:
        from_buffer = getattr(_LIB, 'MXNDArrayLoadFromBuffer')
    except AttributeError:
        from_buffer = None
    if from_buffer is not None:
        check_call(from_buffer(data, size, ctypes.byref(out_size),
                               ctypes.byref(handles), ctypes.byref(out_name_size),
                               ctypes.byref(names)))
        return _loaded(out_size, handles, out_name_size, names)
    fd = os.memfd_create('mxkv-load-frombuffer', os.MFD_CLOEXEC)
    try:
        with os.fdopen(fd, 'wb', closefd=False) as memfile:
            memfile.write(data)
        check_call(_LIB.MXNDArrayLoad(c_str('/proc/self/fd/%d' % fd), ctypes.byref(out_size),
                                      ctypes.byref(handles), ctypes.byref(out_name_size),
                                      ctypes.byref(names)))
    finally:
        os.close(fd)
    return _loaded(out_size, handles, out_name_size, names)


def _storage_types(handles, num):
    """the storage types of `num` handles in one call (libmxkv's MXKVNDArrayGetStorageTypes),
    or None (a real libmxnet.so has no such function: each array asks its own)"""
    missing = getattr(_LIB, '_mxkv_missing', None)
    if num == 0 or missing is None or 'MXKVNDArrayGetStorageTypes' in missing:
        return None
    codes = (ctypes.c_int * num)()
    check_call(_LIB.MXKVNDArrayGetStorageTypes(num, handles, codes))
    return codes[:]


def _loaded(out_size, handles, out_name_size, names):
    """the arrays (and names) MXNDArrayLoad returned"""
    num = out_size.value
    stypes = _storage_types(handles, num)
    if stypes is None:
        arrays = [_ndarray_cls(NDArrayHandle(handles[i])) for i in range(num)]
    else:
        arrays = [_ndarray_cls(NDArrayHandle(h), stype=s)
                  for h, s in zip(handles[:num], stypes)]
    if out_name_size.value == 0:
        return arrays
    if out_name_size.value != out_size.value:
        raise MXKVUsageError('corrupt file: %d names for %d arrays'
                             % (out_name_size.value, out_size.value))
    return {py_str(names[i]): arrays[i] for i in range(out_size.value)}
