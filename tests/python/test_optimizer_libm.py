"""MXNet's kernels take beta**t from the C library, not from numpy.

FTML's ``FTMLKernel`` and LAMB's ``MultiLAMBKernelStep1`` (bias correction) compute
``power::Map(beta, t)``, which is ``::powf`` for float32 / float16 and ``::pow`` for
float64 (src/operator/math_functions-inl.h).  mxkv called ``np.power`` on the scalars:
numpy's power equals glibc's up to numpy 1.23, but from numpy 1.24 (SIMD dispatched, the
scalars too) it differs in the last bit for about a sixth of the (beta, t) pairs of a
training, so with the numpy a user gets (2.x) FTML(lr=0.01, rescale_grad=0.5) ended
``0x3ece3208 0x3f79a138`` where MXNet has ``0x3ece320a 0x3f79a136``.  Now both call the
C library's powf / pow (``mxkv._numerics.c_pow``).

The differential test runs MXNet 1.9.1 in the reference venv (numpy 1.23.5) and mxkv
under this interpreter's numpy, so it checks the numpy-2 case when this suite runs under
numpy 2; the perturbation test checks under any numpy that no result depends on
numpy's power.
"""
import ctypes
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import BINDINGS, REPO

REF_PYTHON = os.path.join(REPO, '.venv', 'bin', 'python')

# argv: lib (mxnet / mxkv), case as JSON [name, kwargs, dtype]; prints the weight's bits
# after every step
SCRIPT = r'''
import json, sys, warnings
import numpy as np
warnings.simplefilter('ignore')
lib, (name, kwargs, dtype) = sys.argv[1], json.loads(sys.argv[2])
if lib == 'mxnet':
    import mxnet as mx
else:
    import mxkv as mx
view = {'float16': 'uint16', 'float32': 'uint32', 'float64': 'uint64'}[dtype]
rng = np.random.RandomState(0)
kv = mx.kv.create('local')
kv.init(0, mx.nd.array(rng.randn(4, 5), dtype=dtype))
kv.set_optimizer(mx.optimizer.create(name, **kwargs))
out = mx.nd.zeros((4, 5), dtype=dtype)
steps = []
for step in range(12):
    kv.push(0, mx.nd.array(rng.randn(4, 5), dtype=dtype))
    kv.pull(0, out=out)
    steps.append([hex(b) for b in out.asnumpy().view(view).ravel().tolist()])
print(json.dumps({'steps': steps, 'numpy': np.__version__,
                  'mxnet imported': 'mxnet' in sys.modules}))
'''

CASES = [
    ('ftml', {'learning_rate': 0.01, 'rescale_grad': 0.5}, 'float32'),
    ('ftml', {'beta1': 0.9, 'beta2': 0.99, 'wd': 0.01}, 'float32'),
    ('ftml', {'learning_rate': 0.01, 'rescale_grad': 0.5}, 'float64'),
    ('ftml', {'beta1': 0.7, 'learning_rate': 0.05}, 'float16'),
    ('lamb', {'learning_rate': 0.01}, 'float32'),
    ('lamb', {'beta1': 0.8, 'beta2': 0.99, 'wd': 0.01}, 'float64'),
    ('lamb', {'learning_rate': 0.01, 'multi_precision': True}, 'float16'),
]


def _env(lib):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(('PYTHON', 'DMLC_', 'MXKV_') if lib == 'mxnet'
                               else ('PYTHON', 'DMLC_'))}
    if lib == 'mxkv':
        env['PYTHONPATH'] = BINDINGS
        env.setdefault('MXKV_LIBRARY_PATH',
                       os.path.join(REPO, 'target', 'release', 'libmxkv.so'))
    return env


def _run(python, lib, case, cwd):
    proc = subprocess.run([python, '-c', SCRIPT, lib, json.dumps(case)], cwd=str(cwd),
                          capture_output=True, text=True, timeout=120, env=_env(lib))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope='module')
def ref():
    if not os.path.exists(REF_PYTHON):
        pytest.skip('no reference venv (make venv-ref)')
    proc = subprocess.run([REF_PYTHON, '-c', 'import mxnet'], capture_output=True,
                          timeout=120, env=_env('mxnet'))
    if proc.returncode != 0:
        pytest.skip('mxnet 1.9.1 is not installed in the reference venv')
    return REF_PYTHON


@pytest.mark.parametrize('case', CASES, ids=['%s-%s-%d' % (c[0], c[2], i)
                                             for i, c in enumerate(CASES)])
def test_beta_power_t_is_mxnets_under_this_numpy(ref, tmp_path, case):
    theirs = _run(ref, 'mxnet', case, tmp_path)
    ours = _run(sys.executable, 'mxkv', case, tmp_path)
    assert ours['mxnet imported'] is False
    for step, (a, b) in enumerate(zip(theirs['steps'], ours['steps'])):
        assert a == b, 'step %d (mxkv on numpy %s):\n mxnet %s\n mxkv  %s' % (
            step, ours['numpy'], a, b)


def _libm():
    lib = ctypes.CDLL('libm.so.6')
    lib.powf.restype, lib.powf.argtypes = ctypes.c_float, [ctypes.c_float, ctypes.c_float]
    lib.pow.restype, lib.pow.argtypes = ctypes.c_double, [ctypes.c_double, ctypes.c_double]
    return lib


def test_c_pow_is_the_c_librarys_powf_and_pow():
    from mxkv._numerics import c_pow
    libm = _libm()
    for beta in (0.5, 0.6, 0.8, 0.9, 0.99, 0.999, 0.9999):
        for t in list(range(1, 300)) + [1000, 4097, 60000]:
            b32 = np.float32(beta)
            got = c_pow(b32, np.float32(t))
            assert type(got) is np.float32
            assert got.tobytes() == np.float32(libm.powf(b32, t)).tobytes(), (beta, t)
            got = c_pow(np.float64(beta), np.float64(t))
            assert type(got) is np.float64
            assert got.tobytes() == np.float64(libm.pow(beta, t)).tobytes(), (beta, t)
            b16 = np.float16(beta)
            got = c_pow(b16, np.float16(t))
            assert type(got) is np.float16
            # half_t(powf(float(a), float(b)))
            want = np.float16(np.float32(libm.powf(float(b16), float(np.float16(t)))))
            assert got.tobytes() == want.tobytes(), (beta, t)
    assert math.isnan(c_pow(np.float32(-0.5), np.float32(0.5)))


@pytest.mark.filterwarnings('ignore:Accumulating with float16')
@pytest.mark.parametrize('name,kwargs,dtype', CASES)
def test_no_result_depends_on_numpys_power(mxkv, monkeypatch, name, kwargs, dtype):
    """numpy's power made one ulp off (as numpy >= 1.24's is for some (beta, t)): the
    optimizers' results do not change"""
    def run():
        rng = np.random.RandomState(0)
        kv = mxkv.kv.create('local')
        kv.init(0, mxkv.nd.array(rng.randn(4, 5), dtype=dtype))
        kv.set_optimizer(mxkv.optimizer.create(name, **kwargs))
        out = mxkv.nd.zeros((4, 5), dtype=dtype)
        for _ in range(6):
            kv.push(0, mxkv.nd.array(rng.randn(4, 5), dtype=dtype))
        kv.pull(0, out=out)
        return out.asnumpy().tobytes()

    before = run()
    real_power = np.power

    def off_by_one_ulp(*args, **kw):
        res = real_power(*args, **kw)
        return np.nextafter(res, np.asarray(res).dtype.type(np.inf))

    monkeypatch.setattr(np, 'power', off_by_one_ulp)
    assert np.power(np.float32(0.9), np.float32(3)) != real_power(np.float32(0.9),
                                                                   np.float32(3))
    assert run() == before


SUMS = r'''
import json, sys
import numpy as np
rng = np.random.RandomState(4)
out = []
for n in list(range(0, 140)) + [255, 256, 1000, 8192, 8193, 8194, 9000, 16384, 16385, 30001]:
    for dt in ('float32', 'float16', 'float64'):
        x = rng.randn(n).astype(dt)
        x = x * x
        out.append(x.sum().tobytes().hex())
print(json.dumps(out))
'''


def test_numpy1_sum_is_numpy_1_23s_sum(ref):
    """LBSGD's LARS factor is MXNet's Python on numpy sums (multiply(v, v).asnumpy().sum());
    numpy 2 sums more than 8192 values in another order: mxkv computes numpy 1.23's sum
    whatever numpy it runs on"""
    from mxkv._numerics import numpy1_sum
    proc = subprocess.run([ref, '-c', SUMS], capture_output=True,
                          text=True, timeout=120, env=_env('mxnet'))
    assert proc.returncode == 0, proc.stderr[-2000:]
    theirs = json.loads(proc.stdout)
    scope = {}
    exec(SUMS.replace('x.sum()', 'numpy1_sum(x)').replace('print(json.dumps(out))', ''),
         {'numpy1_sum': numpy1_sum}, scope)  # pylint: disable=exec-used
    assert scope['out'] == theirs
