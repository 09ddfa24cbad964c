"""Captures the expected values of src/ndarray/blas_dot.rs's unit tests from the OpenBLAS
in MXNet 1.9.1's wheel (the cblas_sdot / cblas_ddot its sparse norm calls), one kernel
table per run:

    for c in Zen Sandybridge Nehalem Prescott; do
        OPENBLAS_CORETYPE=$c .venv/bin/python tests/python/blas_dot_capture.py
    done

and prints Rust table rows (kernel, dtype, n, threads, bits of the dot).  The vectors
come from the LCG that the Rust test (`lcg_vector`) uses too."""
import ctypes
import os

import mxnet

LIB = os.path.join(os.path.dirname(mxnet.__file__), 'libopenblas.so.0')
ob = ctypes.CDLL(LIB)
for f, t in (('cblas_sdot', ctypes.c_float), ('cblas_ddot', ctypes.c_double)):
    getattr(ob, f).restype = t
    getattr(ob, f).argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p,
                               ctypes.c_int]
ob.openblas_get_corename.restype = ctypes.c_char_p
ob.openblas_set_num_threads.argtypes = [ctypes.c_int]
KERNEL = {b'Zen': 'Haswell', b'Haswell': 'Haswell', b'Sandybridge': 'Sandy',
          b'Nehalem': 'Nehalem', b'Prescott': 'Generic'}[ob.openblas_get_corename()]
M = (1 << 64) - 1


def lcg_vector(n, seed):
    """n doubles: x <- x * 6364136223846793005 + 1442695040888963407 (mod 2^64), the
    value ((x >> 40) / 2^24 - 0.5) * 2^(((x >> 20) & 15) - 8)"""
    x, out = seed, []
    for _ in range(n):
        x = (x * 6364136223846793005 + 1442695040888963407) & M
        out.append(((x >> 40) / float(1 << 24) - 0.5) * 2.0 ** (((x >> 20) & 15) - 8))
    return out


import numpy as np  # noqa: E402

for n in (0, 1, 5, 7, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 1000, 4097):
    for dt, fn, name in ((np.float32, ob.cblas_sdot, 'F32'), (np.float64, ob.cblas_ddot, 'F64')):
        v = np.array(lcg_vector(n, n + 1), dtype=dt)
        dot = dt(fn(n, v.ctypes.data, 1, v.ctypes.data, 1))
        bits = dot.view(np.uint32 if dt == np.float32 else np.uint64)
        print('    (Kernel::%s, %s, %d, 1, 0x%x),' % (KERNEL, name, n, int(bits)))
for threads in (2, 3):
    ob.openblas_set_num_threads(threads)
    for n in (10001, 20003):
        v = np.array(lcg_vector(n, n + 1), dtype=np.float64)
        dot = np.float64(ob.cblas_ddot(n, v.ctypes.data, 1, v.ctypes.data, 1))
        if KERNEL != 'Generic' or threads == 2:
            print('    (Kernel::%s, F64, %d, %d, 0x%x),' % (KERNEL, n, threads,
                                                           int(dot.view(np.uint64))))
