"""The optimizer trajectories of the differential suites, with MXNet 1.9.1 run in the
reference venv (numpy 1.23.5) and mxkv in a child of this interpreter.

The in-process differential tests (``both`` fixture) need mxnet importable here, so an
interpreter with numpy 2 (which MXNet 1.9.1 does not run on, and which a user installing
the wheel gets) skips them all.  Here each side runs in its own interpreter: run under
numpy 2, this suite checks that mxkv's numbers do not depend on numpy's version (numpy
1.24+ changed e.g. np.power's last bits, see test_optimizer_libm.py).  One child per
library computes every case.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import BINDINGS, REPO, assert_same_bits
import test_optimizer_more
import test_optimizer_mp
import test_optimizer_rsp
import test_optimizers

REF_PYTHON = os.path.join(REPO, '.venv', 'bin', 'python')
TESTS = os.path.dirname(os.path.abspath(__file__))

# argv: lib (mxnet / mxkv), jobs file, results file.  A job: [module, function, args];
# the function is called with the library's module first.
CHILD = r'''
import json, sys, warnings
warnings.simplefilter('ignore')
lib, jobs_file, out_file = sys.argv[1:4]
sys.path.insert(0, %(tests)r)
import numpy as np
if lib == 'mxnet':
    sys.modules['mxkv'] = None
    import mxnet as mx
else:
    import mxkv as mx
import importlib


def enc(tree):
    if isinstance(tree, (list, tuple)):
        return [enc(x) for x in tree]
    arr = np.ascontiguousarray(np.asarray(tree))
    return {'dtype': arr.dtype.str, 'shape': list(arr.shape), 'hex': arr.tobytes().hex()}


results = []
for module, function, args in json.load(open(jobs_file)):
    try:
        res = enc(getattr(importlib.import_module(module), function)(mx, *args))
    except Exception as exc:  # compared as such: both libraries must fail alike
        res = {'error': type(exc).__name__}
    results.append(res)
json.dump({'results': results, 'numpy': np.__version__}, open(out_file, 'w'))
''' % {'tests': TESTS}


def _dec(tree):
    if isinstance(tree, list):
        return [_dec(x) for x in tree]
    if 'error' in tree:
        return tree['error']
    return np.frombuffer(bytes.fromhex(tree['hex']), dtype=tree['dtype']).reshape(
        tree['shape'])


def lars_lamb_rsp(mx, name, kwargs, dtype, rows):
    """LARS / LAMB on row_sparse gradients of `rows` x 7 (LAMB: and weights): their norm
    of a sparse array is the BLAS dot of its stored values, whose summation order shows
    from 32 or so elements on"""
    rng = np.random.RandomState(3)
    shape = (rows, 7)
    stype = 'row_sparse' if name == 'lamb' else 'default'
    kv = mx.kv.create('local')
    kv.init(0, mx.nd.array(rng.randn(*shape).astype(dtype), dtype=dtype).tostype(stype))
    kv.set_optimizer(mx.optimizer.create(name, **kwargs))
    out = []
    for step in range(4):
        idx = np.sort(rng.choice(rows, rows - step, replace=False)).astype(np.int64)
        grad = mx.nd.sparse.row_sparse_array(
            (rng.randn(len(idx), shape[1]).astype(dtype), idx), shape=shape, dtype=dtype)
        kv.push(0, grad)
        if stype == 'row_sparse':
            res = mx.nd.sparse.zeros('row_sparse', shape, dtype=dtype)
            kv.row_sparse_pull(0, out=res, row_ids=mx.nd.array(np.arange(rows), dtype='int64'))
            out.append([res.indices.asnumpy(), res.data.asnumpy()])
        else:
            res = mx.nd.zeros(shape, dtype=dtype)
            kv.pull(0, out=res)
            out.append(res.asnumpy())
    return out


def lbsgd_big(mx, dtype, shape):
    """LBSGD(warmup_strategy='lars'): its factor comes from numpy sums of the squares
    (multiply(v, v).asnumpy().sum() in MXNet), which numpy 2 orders otherwise above 8192
    values"""
    rng = np.random.RandomState(8)
    kv = mx.kv.create('local')
    kv.init(0, mx.nd.array(rng.randn(*shape) * 0.5, dtype=dtype))
    kv.set_optimizer(mx.optimizer.create('lbsgd', warmup_strategy='lars', momentum=0.9,
                                         learning_rate=0.1, wd=0.001))
    out = []
    for _ in range(3):
        kv.push(0, mx.nd.array(rng.randn(*shape), dtype=dtype))
        res = mx.nd.zeros(shape, dtype=dtype)
        kv.pull(0, out=res)
        out.append(res.asnumpy())
    return out


def _numpy_hyper_cases(mx):
    f = np.float32
    return [
        ('sgd', dict(learning_rate=f(0.1), momentum=f(0.9), wd=f(0.001), rescale_grad=f(0.25))),
        ('sgd', dict(learning_rate=np.float16(0.1), wd=np.float64(0.01))),
        ('nag', dict(learning_rate=f(0.1), momentum=f(0.9), wd=f(0.001))),
        ('adam', dict(learning_rate=f(0.01), wd=f(0.003), beta1=f(0.8), beta2=f(0.99))),
        ('adagrad', dict(learning_rate=f(0.1), eps=f(1e-6))),
        ('rmsprop', dict(learning_rate=f(0.01), gamma1=f(0.8), centered=True)),
        ('adadelta', dict(rho=f(0.8), epsilon=f(1e-4))),
        ('signum', dict(learning_rate=f(0.01), momentum=f(0.8), wd_lh=f(0.01))),
        ('ftrl', dict(learning_rate=f(0.1), lamda1=f(0.01), beta=f(0.5))),
        ('ftml', dict(learning_rate=f(0.01), beta1=f(0.7), beta2=f(0.99))),
        ('adamax', dict(learning_rate=f(0.01), beta1=f(0.7))),
        ('nadam', dict(learning_rate=f(0.01), beta1=f(0.8), beta2=f(0.99))),
        ('dcasgd', dict(learning_rate=f(0.1), lamda=f(0.1))),
        ('lamb', dict(learning_rate=f(0.01), beta1=f(0.8), beta2=f(0.99))),
        ('lars', dict(learning_rate=f(0.1), eta=f(0.01), momentum=f(0.9))),
        ('lbsgd', dict(learning_rate=f(0.1), momentum=f(0.9), warmup_strategy='lars')),
        ('sgd', dict(learning_rate=0.1, lr_scheduler=mx.lr_scheduler.FactorScheduler(
            step=2, factor=f(0.7), base_lr=f(0.1)))),
    ]


NUMPY_HYPER_CASES = 17


def numpy_hyper(mx, case):
    """hyper-parameters given as numpy scalars, with lr and wd multipliers: MXNet's Python
    mixes them with Python floats under numpy 1.x's promotion (a float32 times 0.7 is a
    float64; numpy 2 keeps float32)"""
    name, kwargs = _numpy_hyper_cases(mx)[case]
    rng = np.random.RandomState(case)
    kv = mx.kv.create('local')
    kv.init([0, 1], [mx.nd.array(rng.randn(4, 5)) for _ in range(2)])
    opt = mx.optimizer.create(name, **kwargs)
    opt.set_lr_mult({0: 0.7})
    opt.set_wd_mult({1: 3})
    kv.set_optimizer(opt)
    out = []
    for _ in range(6):
        kv.push([0, 1], [mx.nd.array(rng.randn(4, 5)) for _ in range(2)])
        res = [mx.nd.zeros((4, 5)) for _ in range(2)]
        kv.pull([0, 1], out=res)
        out.append([r.asnumpy() for r in res])
    return out


def _jobs():
    jobs = []
    for name, kwargs in test_optimizers.CASES:
        jobs.append(('test_optimizers', 'trajectory', [name, kwargs]))
    for name, kwargs in test_optimizer_more.CASES:
        jobs.append(('test_optimizers', 'trajectory', [name, kwargs]))
        if name != 'ftrl':
            for dtype in ('float64', 'float16'):
                jobs.append(('test_optimizers', 'trajectory', [name, kwargs, 'int', dtype]))
    for name, kwargs in test_optimizer_rsp.CASES:
        for dtype in ('float32', 'float64'):
            if dtype == 'float64' and name in ('adagrad', 'rmsprop', 'adadelta'):
                continue
            for stype in ('default', 'row_sparse'):
                jobs.append(('test_optimizer_rsp', 'trajectory',
                             [name, kwargs, dtype, 1, stype]))
    for name, kwargs in test_optimizer_more.RSP_CASES:
        for dtype in ('float32', 'float64'):
            if name == 'ftrl' and dtype == 'float64':
                continue
            for stype in ('default', 'row_sparse'):
                if dtype == 'float64' and stype == 'row_sparse' and name in ('adamax',
                                                                             'nadam'):
                    continue
                jobs.append(('test_optimizer_rsp', 'trajectory',
                             [name, kwargs, dtype, 1, stype]))
    for name, kwargs in test_optimizer_mp.CASES:   # float16 with float32 master copies
        jobs.append(('test_optimizers', 'trajectory',
                     [name, dict(kwargs, multi_precision=True), 'int', 'float16']))
    for name, kwargs in test_optimizer_mp.RSP_CASES:
        for stype in ('default', 'row_sparse'):
            jobs.append(('test_optimizer_rsp', 'trajectory',
                         [name, dict(kwargs, multi_precision=True), 'float16', 1, stype]))
    for dtype in ('float32', 'float16', 'float64'):
        for shape in ((100, 90), (3, 7001)):
            jobs.append(('test_optimizer_ref_venv', 'lbsgd_big', [dtype, shape]))
    for case in range(NUMPY_HYPER_CASES):
        jobs.append(('test_optimizer_ref_venv', 'numpy_hyper', [case]))
    for rows in (5, 7, 13, 19, 40):
        for dtype in ('float32', 'float64'):
            jobs.append(('test_optimizer_ref_venv', 'lars_lamb_rsp',
                         ['lamb', {'learning_rate': 0.01, 'wd': 0.01}, dtype, rows]))
            jobs.append(('test_optimizer_ref_venv', 'lars_lamb_rsp',
                         ['lars', {'learning_rate': 0.1, 'eta': 0.1, 'momentum': 0.9},
                          dtype, rows]))
    return jobs


JOBS = _jobs()


def _env(lib):
    env = {k: v for k, v in os.environ.items() if not k.startswith(('PYTHON', 'DMLC_'))}
    if lib == 'mxkv':
        env['PYTHONPATH'] = BINDINGS
        env.setdefault('MXKV_LIBRARY_PATH',
                       os.path.join(REPO, 'target', 'release', 'libmxkv.so'))
    else:
        env = {k: v for k, v in env.items() if not k.startswith('MXKV_')}
    return env


def _run(python, lib, tmp):
    jobs_file, out_file = str(tmp / 'jobs.json'), str(tmp / (lib + '.json'))
    with open(jobs_file, 'w') as f:
        json.dump(JOBS, f)
    proc = subprocess.run([python, '-c', CHILD, lib, jobs_file, out_file], cwd=str(tmp),
                          capture_output=True, text=True, timeout=900, env=_env(lib))
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(out_file) as f:
        got = json.load(f)
    return [_dec(r) for r in got['results']], got['numpy']


@pytest.fixture(scope='module')
def results(tmp_path_factory):
    if not os.path.exists(REF_PYTHON):
        pytest.skip('no reference venv (make venv-ref)')
    proc = subprocess.run([REF_PYTHON, '-c', 'import mxnet'], capture_output=True,
                          timeout=120, env=_env('mxnet'))
    if proc.returncode != 0:
        pytest.skip('mxnet 1.9.1 is not installed in the reference venv')
    tmp = tmp_path_factory.mktemp('ref_venv')
    return _run(REF_PYTHON, 'mxnet', tmp), _run(sys.executable, 'mxkv', tmp)


def _one_nan(tree):
    if isinstance(tree, list):
        return [_one_nan(x) for x in tree]
    if isinstance(tree, np.ndarray) and tree.dtype.kind == 'f':
        return np.where(np.isnan(tree), np.array(np.nan, tree.dtype), tree)
    return tree


@pytest.mark.parametrize('job', range(len(JOBS)),
                         ids=['%d-%s-%s' % (i, j[2][0] if j[1] == 'trajectory' else j[1],
                                            '-'.join(str(a) for a in j[2][2:]))
                              for i, j in enumerate(JOBS)])
def test_same_bits_as_mxnet_under_this_numpy(results, job):
    (theirs, _), (ours, numpy_version) = results
    # (the lars_lamb_rsp jobs' sparse norms no longer use numpy's BLAS dot: libmxkv's
    # MXKVBlasDot sums in MXNet's OpenBLAS order, so they hold under numpy 2 too)
    expected, got = theirs[job], ours[job]
    if JOBS[job][2][0] == 'adamax':   # which NaN 0 / 0 gives (see test_optimizer_more)
        expected, got = _one_nan(expected), _one_nan(got)
    assert_same_bits(expected, got, '%r (mxkv on numpy %s)' % (JOBS[job], numpy_version))


def test_the_cases_ran(results):
    """(errors compare equal too: most jobs must have produced arrays)"""
    (theirs, _), (ours, _) = results
    errors = [r for r in theirs if isinstance(r, str)]
    assert len(errors) <= 2, errors
    assert sum(isinstance(r, str) for r in ours) == len(errors)


def test_numpy_hyper_cases_all_listed(mxkv):
    assert len(_numpy_hyper_cases(mxkv)) == NUMPY_HYPER_CASES
