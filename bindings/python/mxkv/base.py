"""ctypes plumbing shared by the mxkv modules (the counterpart of ``mxnet.base``).

Names match ``mxnet.base`` where MXNet's own frontend files import them
(``_LIB``, ``check_call``, ``c_str``, ``c_array``, ``c_str_array``,
``c_array_buf``, ``c_handle_array``, ``mx_uint``, ``py_str``,
``string_types``, ``NDArrayHandle``, ``KVStoreHandle`` ...), so that MXNet's
unmodified ``kvstore.py`` can be loaded on top of this module.
"""
import atexit
import ctypes
import os
import sys

import numpy as _np

from . import _lib

__all__ = ['MXNetError', 'check_call', 'c_str', 'c_str_array', 'c_array', 'c_array_buf',
           'c_handle_array', 'py_str', 'string_types', 'integer_types', 'numeric_types',
           'mx_uint', 'mx_int', 'mx_float', 'NDArrayHandle', 'KVStoreHandle', '_LIB',
           'library_path', 'version']

string_types = (str,)
integer_types = (int, _np.integer)
numeric_types = (float, int, _np.generic)

mx_uint = ctypes.c_uint
mx_int = ctypes.c_int
mx_float = ctypes.c_float
mx_float_p = ctypes.POINTER(mx_float)
mx_real_t = _np.float32
NDArrayHandle = ctypes.c_void_p
KVStoreHandle = ctypes.c_void_p


def py_str(x):
    """bytes from the library -> str"""
    return x.decode('utf-8')


class _NullType(object):
    """Placeholder for arguments"""
    def __repr__(self):
        return '_Null'


_Null = _NullType()


# --- errors ------------------------------------------------------------------
class MXNetError(RuntimeError):
    """Error raised for every failed library call (and for misuse of the API)."""


error_types = {'MXNetError': MXNetError}


def register_error(func_name=None, cls=None):
    """Register an error class under the name a library message may start with."""
    if callable(func_name):
        cls, func_name = func_name, func_name.__name__

    def register(mycls):
        error_types[func_name if isinstance(func_name, str) else mycls.__name__] = mycls
        return mycls
    return register if cls is None else register(cls)


class MXKVUsageError(MXNetError, AssertionError):
    """A call the Python layer rejects before reaching the library (wrong key types,
    mismatched list lengths, closed objects...).  It is an AssertionError too,
    because that is what MXNet's own frontend raises for the same mistakes."""


def _error_name(first_line):
    pos = first_line.find(':')
    if pos <= 0:
        return None
    name = first_line[:pos]
    if all(ch.isalnum() or ch in '_.' for ch in name):
        return name
    return None


def format_library_error(raw):
    """Turn the library's error text into the Python message (MXNet's layout:
    the ``Stack trace:`` block, if any, first as a traceback, then the message)."""
    lines = raw.split('\n')
    if lines and lines[-1] == '':
        lines.pop()
    err_name = _error_name(lines[0]) if lines else None
    message, trace, in_trace = [], [], False
    for line in lines:
        if in_trace and not line.startswith('  '):
            in_trace = False
        if in_trace:
            trace.append(line)
        elif line.startswith('Stack trace'):
            in_trace = True
        else:
            message.append(line)
    text = ''
    if trace:
        text += 'Traceback (most recent call last):\n' + '\n'.join(reversed(trace)) + '\n'
    return text + '\n'.join(message), err_name


def last_error():
    """The library's thread-local error message as an exception object."""
    raw = _LIB.MXGetLastError()
    raw = py_str(raw) if raw else 'unknown error (MXGetLastError returned NULL)'
    msg, name = format_library_error(raw)
    if name is not None and name.startswith('mxnet.error.'):
        name = name[len('mxnet.error.'):]
    return error_types.get(name, MXNetError)(msg)


get_last_ffi_error = last_error


def check_call(ret):
    """Raise the library's error if a C call returned non-zero."""
    if ret != 0:
        raise last_error()


# --- argument helpers (same behaviour as mxnet.base's) -------------------------
def c_str(string):
    """str -> ctypes char*"""
    return ctypes.c_char_p(string.encode('utf-8'))


def c_str_array(strings):
    """list of str -> const char**"""
    arr = (ctypes.c_char_p * len(strings))()
    arr[:] = [s.encode('utf-8') for s in strings]
    return arr


def c_array(ctype, values):
    """list -> ctypes array of `ctype`"""
    out = (ctype * len(values))()
    out[:] = values
    return out


def c_array_buf(ctype, buf):
    """Python buffer (e.g. array.array) -> ctypes array sharing it"""
    return (ctype * len(buf)).from_buffer(buf)


def c_handle_array(objs):
    """list of objects with .handle -> void**"""
    arr = (ctypes.c_void_p * len(objs))()
    arr[:] = [o.handle for o in objs]
    return arr


def ctypes2buffer(cptr, length):
    """Copy `length` bytes from a char pointer."""
    if not isinstance(cptr, ctypes.POINTER(ctypes.c_char)):
        raise TypeError('expected char pointer')
    res = bytearray(length)
    ctypes.memmove((ctypes.c_char * length).from_buffer(res), cptr, length)
    return res


def _as_list(obj):
    return obj if isinstance(obj, (list, tuple)) else [obj]


# --- the library ----------------------------------------------------------------
_LIB = _lib.load()
library_path = _LIB._mxkv_path


def version():
    """MXGetVersion() (10901 for MXNet 1.9.1's API)"""
    out = ctypes.c_int()
    check_call(_LIB.MXGetVersion(ctypes.byref(out)))
    return out.value


__version__ = '1.9.1'


def _same_library_as_mxnet():
    mxbase = sys.modules.get('mxnet.base')
    if mxbase is None or not hasattr(mxbase, '_LIB'):
        return False
    try:
        return os.path.samefile(mxbase._LIB._name, library_path)
    except (OSError, TypeError):
        return False


def _notify_shutdown():
    """Tell the library the interpreter is exiting (unless MXNet itself, sharing the
    very same library, does it)."""
    if _same_library_as_mxnet() or os.getpid() != _IMPORT_PID:
        # a forked child shares no node with its parent: its copies of the parent's stores
        # are not its own to close (a barrier there would only wait out the deadline)
        return
    if _LIB.MXNotifyShutdown() != 0:
        # Only a dist store left open can fail here (its closing barrier or node shutdown,
        # e.g. a peer died). Python prints an exception raised in an atexit handler but keeps
        # the exit status 0, and a launcher would take the job for a success: end with 1.
        sys.stderr.write('mxkv: at exit: %s\n' % last_error())
        if 'logging' in sys.modules:
            sys.modules['logging'].shutdown()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(1)


_IMPORT_PID = os.getpid()
atexit.register(_notify_shutdown)
