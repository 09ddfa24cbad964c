"""save / load of NDArrays in MXNet's ``.params`` format (MXNDArraySave / MXNDArrayLoad)."""
import ctypes

from ..base import _LIB, check_call, c_str, c_str_array, c_handle_array, NDArrayHandle, \
    string_types, py_str, MXKVUsageError
from .ndarray import NDArray, _ndarray_cls

__all__ = ['save', 'load']


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
    arrays = [_ndarray_cls(NDArrayHandle(handles[i])) for i in range(out_size.value)]
    if out_name_size.value == 0:
        return arrays
    if out_name_size.value != out_size.value:
        raise MXKVUsageError('corrupt file: %d names for %d arrays'
                             % (out_name_size.value, out_size.value))
    return {py_str(names[i]): arrays[i] for i in range(out_size.value)}
