"""The norm of a row_sparse / csr array (LARS's and LAMB's sparse norms) against MXNet
1.9.1's, bit for bit, now that mxkv sums its BLAS dot in libmxkv (ndarray/_blas.py,
src/ndarray/blas_dot.rs) in the order of the OpenBLAS in MXNet's wheel, not with numpy's
BLAS.  MXNet runs in the reference venv and mxkv in a child of this interpreter (so the
suite also runs under numpy 2), both with the same OPENBLAS_CORETYPE (each kernel table
of the wheel this CPU can run) and OpenMP environment."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import BINDINGS, REPO

REF_PYTHON = os.path.join(REPO, '.venv', 'bin', 'python')

# argv: lib, vectors (.npz), output (.json).  Each vector v is stored as a 1 x n
# row_sparse array (and, every third one, as a 1 x n csr matrix too); the output is the
# bits of each norm and the kernel table's name.
CHILD = r'''
import json, sys, warnings
warnings.simplefilter('ignore')
import numpy as np
lib, vectors, out_file = sys.argv[1:4]
if lib == 'mxnet':
    sys.modules['mxkv'] = None
    import ctypes, os
    import mxnet as mx
    ob = ctypes.CDLL(os.path.join(os.path.dirname(mx.__file__), 'libopenblas.so.0'))
    ob.openblas_get_corename.restype = ctypes.c_char_p
    core = ob.openblas_get_corename().decode()
    norm = lambda a: a.norm().asnumpy()[0]
else:
    import mxkv as mx
    from mxkv.optimizer.optimizer import _sparse_norm as norm
    from mxkv.ndarray._blas import blas_core_name
    core = blas_core_name()
bits = []
with np.load(vectors) as z:
    for i in range(len(z.files)):
        v = z['v%d' % i]
        n, dt = v.size, v.dtype.name
        if n == 0:
            arrays = [mx.nd.sparse.zeros('row_sparse', (1, 1), dtype=dt)]
        else:
            arrays = [mx.nd.sparse.row_sparse_array((v.reshape(1, n), [0]), shape=(1, n),
                                                    dtype=dt)]
            if i % 3 == 0:
                arrays.append(mx.nd.sparse.csr_matrix((v, np.arange(n), [0, n]),
                                                      shape=(1, n), dtype=dt))
        bits.append([np.asarray(norm(a), dtype=dt).tobytes().hex() for a in arrays])
json.dump({'core': core, 'bits': bits}, open(out_file, 'w'))
'''


def _env(lib, extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(('PYTHON', 'DMLC_', 'OPENBLAS_', 'OMP_', 'MXNET_'))}
    env.update(extra)
    if lib == 'mxkv':
        env['PYTHONPATH'] = BINDINGS
        env.setdefault('MXKV_LIBRARY_PATH',
                       os.path.join(REPO, 'target', 'release', 'libmxkv.so'))
    else:
        env = {k: v for k, v in env.items() if not k.startswith('MXKV_')}
    return env


def _norms(lib, vectors, tmp, extra):
    python = REF_PYTHON if lib == 'mxnet' else sys.executable
    out = str(tmp / ('%s.json' % lib))
    proc = subprocess.run([python, '-c', CHILD, lib, vectors, out], cwd=str(tmp),
                          capture_output=True, text=True, timeout=600, env=_env(lib, extra))
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(out) as f:
        return json.load(f)


@pytest.fixture(scope='module')
def reference():
    if not os.path.exists(REF_PYTHON):
        pytest.skip('no reference venv (make venv-ref)')
    proc = subprocess.run([REF_PYTHON, '-c', 'import mxnet'], capture_output=True,
                          timeout=120, env=_env('mxnet', {}))
    if proc.returncode != 0:
        pytest.skip('mxnet 1.9.1 is not installed in the reference venv')


def _vectors(lengths, seed):
    rng = np.random.RandomState(seed)
    out = []
    for k, n in enumerate(lengths):
        for dt in (np.float32, np.float64):
            kind = (k + (dt == np.float64)) % 3
            if kind == 0:
                v = rng.randn(n)
            elif kind == 1:   # magnitudes over 40 binades: the order shows in every bit
                v = rng.randn(n) * 10.0 ** rng.randint(-20, 20, n)
            else:             # gradients of one sign and scale, like LARS's
                v = rng.uniform(0, 1e-3, n)
            out.append(v.astype(dt))
    return out


def _compare(tmp, vectors, extra):
    path = str(tmp / 'vectors.npz')
    np.savez(path, **{'v%d' % i: v for i, v in enumerate(vectors)})
    theirs = _norms('mxnet', path, tmp, extra)
    ours = _norms('mxkv', path, tmp, extra)
    assert ours['core'] == theirs['core']
    bad = [(v.dtype.name, v.size, t, o) for v, t, o in zip(vectors, theirs['bits'], ours['bits'])
           if t != o]
    assert not bad, '%d of %d norms differ from MXNet (%s), e.g. %r' % (
        len(bad), len(vectors), theirs['core'], bad[:5])
    return theirs['core']


SPECIAL = [0, 1, 2, 3, 7, 8, 15, 16, 17, 31, 32, 33, 47, 48, 49, 63, 64, 65, 95, 96, 97,
           127, 128, 129, 255, 256, 257, 1023, 1024, 1025, 4095, 4096, 4097, 5000]


@pytest.mark.parametrize('coretype', [None, 'Haswell', 'SkylakeX', 'Sandybridge', 'Nehalem',
                                      'Prescott', 'Core2', 'Barcelona', 'Cooperlake'])
def test_sparse_norms_same_bits_as_mxnet(reference, tmp_path, coretype):
    """every length 0..160, the lengths around the kernels' blocks of 16, 32 and 64, and
    random lengths up to 5000; float32 and float64"""
    rng = np.random.RandomState(11)
    lengths = list(range(161)) + SPECIAL + sorted(rng.randint(0, 5001, 120).tolist())
    if coretype not in (None, 'Haswell'):   # the other tables: a lighter set
        lengths = lengths[::3]
    extra = {} if coretype is None else {'OPENBLAS_CORETYPE': coretype}
    core = _compare(tmp_path, _vectors(lengths, 5), extra)
    if coretype == 'SkylakeX':
        assert core == 'Haswell'   # the wheel has no AVX-512 kernels


@pytest.mark.parametrize('env', [{}, {'OMP_NUM_THREADS': '2'}, {'OMP_NUM_THREADS': '3'},
                                 {'MXNET_OMP_MAX_THREADS': '3'},
                                 {'MXNET_ENGINE_TYPE': 'NaiveEngine'}])
def test_float64_norms_split_over_mxnets_threads(reference, tmp_path, env):
    """float64 dots of more than 10,000 values are split over OpenBLAS's OpenMP threads,
    as many as MXNet's operator threads have (ndarray/_blas.py: _mxnet_blas_threads)"""
    lengths = [10000, 10001, 10003, 20001, 100003]
    vectors = [v for v in _vectors(lengths, 9) if v.dtype == np.float64]
    _compare(tmp_path, vectors, dict(env))


def test_c_api_checks_its_arguments(mxkv):
    import ctypes
    from mxkv.base import _LIB
    from mxkv.ndarray._blas import blas_dot
    if 'MXKVBlasDot' in getattr(_LIB, '_mxkv_missing', ('MXKVBlasDot',)):
        pytest.skip('not libmxkv')
    x = np.arange(1, 6, dtype=np.float32)
    out = np.zeros(1, np.float64)
    assert _LIB.MXKVBlasDot(0, x.ctypes.data, x.ctypes.data, 5, 1, out.ctypes.data) == 0
    assert out.view(np.float32)[0] == 55   # one float32 written, the rest untouched
    assert out.view(np.float32)[1] == 0
    for args in ((2, x.ctypes.data, x.ctypes.data, 5, 1, out.ctypes.data),   # float16
                 (0, None, x.ctypes.data, 5, 1, out.ctypes.data),
                 (0, x.ctypes.data, x.ctypes.data, 5, 0, out.ctypes.data),       # threads
                 (0, x.ctypes.data, x.ctypes.data, 5, 1, None),
                 (1, x.ctypes.data, x.ctypes.data, 1 << 62, 1, out.ctypes.data)):
        assert _LIB.MXKVBlasDot(*args) == -1
        assert _LIB.MXGetLastError()
    assert _LIB.MXKVBlasDot(1, None, None, 0, 1, out.ctypes.data) == 0 and out[0] == 0
    # unaligned values are read as well as aligned ones
    raw = np.zeros(8 * 41 + 1, np.uint8)
    vals = np.frombuffer(raw[1:].data, np.float64)
    vals[:] = np.linspace(-3, 7, 41)
    assert blas_dot(vals) == blas_dot(vals.copy())
    assert blas_dot(vals).dtype == np.float64
    name = ctypes.c_char_p()
    assert _LIB.MXKVBlasCoreName(ctypes.byref(name)) == 0 and name.value
