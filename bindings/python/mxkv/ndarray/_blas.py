"""The BLAS dot product as MXNet 1.9.1 computes it, bit for bit, whatever numpy's BLAS.

MXNet's norm of a row_sparse or csr array (``L2NormComputeSparseImpl``) is
``cblas_sdot`` / ``cblas_ddot`` of its stored values with themselves, then sqrt.  The
OpenBLAS 0.3.13 in MXNet 1.9.1's wheel sums that dot in an order that depends on the
kernel table it picks for the CPU (and, for float64 dots of more than 10,000 values, on
its OpenMP thread count); numpy's ``dot`` gives the same bits only where numpy's BLAS
happens to run the same kernel (numpy 1.23.5's OpenBLAS 0.3.20 mostly does; numpy 2's
0.3.31 does not from 32 values on).  libmxkv's ``MXKVBlasDot`` (src/ndarray/blas_dot.rs)
sums in the wheel's order on this CPU; ``blas_dot`` calls it, and falls back to numpy's
``dot`` where the library has no such function (a real libmxnet.so).
"""
import os
import re

import numpy as np

__all__ = ['blas_dot', 'blas_core_name', 'mxnet_blas_threads']

_CODES = {np.dtype(np.float32): 0, np.dtype(np.float64): 1}
_FUNCTIONS = []  # [(MXKVBlasDot, MXKVBlasCoreName) or None], once looked up


def _functions():
    if not _FUNCTIONS:
        from ..base import _LIB
        missing = getattr(_LIB, '_mxkv_missing', None)
        have = missing is not None and 'MXKVBlasDot' not in missing
        _FUNCTIONS.append((_LIB.MXKVBlasDot, _LIB.MXKVBlasCoreName) if have else None)
    return _FUNCTIONS[0]


def _leading_int(text):
    match = re.match(r'\s*([+-]?\d+)', text)
    return int(match.group(1)) if match else None


def _mxnet_blas_threads(environ):
    """the OpenMP thread count OpenBLAS sees in MXNet 1.9.1's CPU operator threads
    (src/engine/openmp.cc): OMP_NUM_THREADS when set; else the worker threads of the
    threaded engines set min(processors, MXNET_OMP_MAX_THREADS or processors / 2),
    and NaiveEngine's calling thread has processors / 2 (all the processors when
    MXNET_OMP_MAX_THREADS is set, which then leaves it alone).  Measured with float64
    norms of 1,000,003 values: 1 thread by default on 2 processors, 3 with
    OMP_NUM_THREADS=3, 2 with MXNET_OMP_MAX_THREADS=3."""
    try:
        procs = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        procs = os.cpu_count() or 1
    omp = environ.get('OMP_NUM_THREADS')
    if omp is not None:
        n = _leading_int(omp)
        return n if n is not None and n >= 1 else procs  # libgomp ignores a bad value
    limit = environ.get('MXNET_OMP_MAX_THREADS')
    most = _leading_int(limit) if limit is not None else None
    if most is None:
        most = procs >> 1
        if environ.get('MXNET_ENGINE_TYPE') == 'NaiveEngine':
            return max(most, 1)
    elif environ.get('MXNET_ENGINE_TYPE') == 'NaiveEngine':
        return procs
    count = procs if (most == 0 or procs < most) else most
    return max(count, 1)


# read once, as MXNet reads its environment once when it is loaded
_THREADS = _mxnet_blas_threads(os.environ)


def mxnet_blas_threads():
    """the thread count MXNet 1.9.1's OpenBLAS would split a float64 dot over here"""
    return _THREADS


def blas_core_name():
    """the kernel table of MXNet's OpenBLAS whose order ``blas_dot`` reproduces
    (``openblas_get_corename()``'s name), or None with a library without it"""
    fns = _functions()
    if fns is None:
        return None
    import ctypes
    from ..base import check_call
    name = ctypes.c_char_p()
    check_call(fns[1](ctypes.byref(name)))
    return name.value.decode()


def blas_dot(x, y=None):
    """``cblas_sdot`` / ``cblas_ddot`` of the float32 or float64 vectors ``x`` and ``y``
    (default: ``x`` itself) as MXNet 1.9.1's OpenBLAS sums it here: a numpy scalar of
    their dtype."""
    x = np.ascontiguousarray(x).reshape(-1)
    y = x if y is None else np.ascontiguousarray(y, dtype=x.dtype).reshape(-1)
    if x.size != y.size:
        raise ValueError('blas_dot of %d and %d values' % (x.size, y.size))
    fns = _functions()
    code = _CODES.get(x.dtype)
    if fns is None or code is None:
        with np.errstate(all='ignore'):
            return x.dtype.type(np.dot(x, y))
    from ..base import check_call
    out = np.zeros(1, x.dtype)
    check_call(fns[0](code, x.ctypes.data, y.ctypes.data, x.size, _THREADS, out.ctypes.data))
    return out[0]
