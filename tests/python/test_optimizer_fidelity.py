"""Optimizer corner cases where mxkv failed otherwise than MXNet 1.9.1, each run through
real MXNet (the reference venv, numpy 1.23) and through mxkv (this interpreter: numpy 1
in the reference venv, numpy 2 under ``make pytest-numpy2``), one child process per
library, and compared exactly: the same exception class (mxkv's may derive from more,
e.g. MXKVUsageError is an AssertionError and an MXNetError) with the same text (for
Python-level errors; an MXNetError's text is MXNet's C++ check, mxkv's names the problem
its own way), or the same bits of every result.

1. ``Updater.set_states`` of states written by a ``multi_precision=True`` optimizer for
   float16 weights (float32 master copies in a tuple) into a ``multi_precision=False`` one,
   and the other way round.  mxkv failed with AttributeError ('tuple' object has no
   attribute 'stype') where MXNet's operator functions assert their NDArray arguments
   ('Argument mom must have NDArray type, but got (...)'), ValueError where MXNet's
   LAMB reaches its kernel (MXNetError), and it updated nothing where MXNet's LBSGD
   (whose update takes any tuple state for a multi-precision one) updates.
2. The optimizers computed with NDArray operations (SGLD, Adamax, Nadam, DCASGD, Test) on a
   row_sparse weight of a store (whose values MXNet keeps on cpu_pinned) that is not
   float32: MXNet's results of operations are on cpu(0), and copying a dense one into the
   row_sparse weight on cpu_pinned fails its data type check (TBlob.get_with_shape:
   'Expected: float v.s. given double') for any source dtype but float32, leaving the
   weight as it was.  MXNet reports it at the next wait (waitall, a pull's read), mxkv at
   the push (README deviation 9); mxkv updated the weight.  SGLD's noise is drawn in MXNet
   either way (the random operator does not wait on the weight): the random numbers after
   it are the same.
3. lr schedulers given numpy scalars (base_lr np.float32 / np.float16 / np.float64, or a
   numpy final_lr, factor, warmup_begin_lr): MXNet's Python runs on numpy 1, where a
   numpy scalar with a Python number computes in float64 (np.float32(0.1) - 0 is a
   float64); numpy 2 (NEP 50) keeps float32.  Under numpy 2, mxkv's Poly and Cosine
   rates (and Factor, MultiFactor, the warmup) differed from MXNet's in their last bits
   and type.  Each rate is compared with its type.
"""
import sys

import pytest

from conftest import REF_PYTHON, run_child


CHILD = r'''
import json, sys, warnings
warnings.simplefilter('ignore')
lib, cases = sys.argv[1], json.loads(sys.argv[2])
import numpy as np
if lib == 'mxnet':
    sys.modules['mxkv'] = None
    import mxnet as mx
else:
    import mxkv as mx
nd = mx.nd


def arrays(tree):
    if isinstance(tree, (list, tuple)):
        return [arrays(x) for x in tree]
    if tree is None:
        return None
    arr = tree.asnumpy()
    return [arr.dtype.str, list(arr.shape), arr.tobytes().hex()]


def mp_switch(name, kwargs, mp_from, mp_to, shapes):
    """an updater of `name` with multi_precision=mp_from updates float16 weights once;
    another with mp_to loads its states (set_states) and updates them again"""
    rng = np.random.RandomState(0)
    ws = [nd.array(rng.randn(*s), dtype='float16') for s in shapes]
    gs = [nd.array(rng.randn(*s), dtype='float16') for s in shapes]
    keys = list(range(len(shapes)))
    first = mx.optimizer.get_updater(mx.optimizer.create(
        name, learning_rate=0.1, multi_precision=mp_from, **kwargs))
    second = mx.optimizer.get_updater(mx.optimizer.create(
        name, learning_rate=0.1, multi_precision=mp_to, **kwargs))
    out = {}
    try:
        first(keys, gs, ws)   # (fails for some optimizers: compared as well)
        second.set_states(first.get_states())
        second(keys, gs, ws)
    except Exception as exc:
        out['error'] = [c.__name__ for c in type(exc).__mro__]
        out['text'] = str(exc)
    out['weights'] = arrays(ws)
    out['states'] = arrays([second.states.get(k) for k in keys])
    return out


def store_step(name, kwargs, dtype, grad_stype, store):
    """one push of a `grad_stype` gradient into a row_sparse `dtype` key with `name` as the
    store's optimizer: the error of the push or of the wait after it, the stored rows, and
    the next random numbers"""
    mx.random.seed(7)
    rng = np.random.RandomState(0)
    kv = mx.kv.create(store)
    kv.init(0, nd.array(rng.randn(3, 4), dtype=dtype).tostype('row_sparse'))
    kv.set_optimizer(mx.optimizer.create(name, learning_rate=0.1, **kwargs))
    grad = nd.array(rng.randn(3, 4), dtype=dtype).tostype(grad_stype)
    out = {}
    try:
        kv.push(0, grad)
        nd.waitall()
    except Exception as exc:
        out['error'] = [c.__name__ for c in type(exc).__mro__]
        out['text'] = str(exc)
    pulled = nd.sparse.zeros('row_sparse', (3, 4), dtype=dtype)
    kv.row_sparse_pull(0, out=pulled, row_ids=nd.array([0, 1, 2], dtype='int64'))
    out['weights'] = arrays([pulled])
    out['states'] = arrays([nd.random.normal(0, 1, shape=(5,))])
    return out


def _num(x):
    return [type(x).__name__, np.asarray(x).dtype.str, np.asarray(x).tobytes().hex()]


def _np_value(spec):
    """[numpy type name, value] or a plain Python number"""
    if isinstance(spec, list) and spec and isinstance(spec[0], str):
        return getattr(np, spec[0])(spec[1])
    return spec


def schedule(name, kwargs, steps):
    """the rates of a scheduler made with `kwargs` (numpy scalars as [type, value])"""
    kwargs = {k: _np_value(v) for k, v in kwargs.items()}
    sched = getattr(mx.lr_scheduler, name)(**kwargs)
    return {'weights': [_num(sched(n)) for n in steps], 'states': []}


def make_schedule(name, kwargs):
    """a scheduler's constructor on arguments it refuses"""
    out = {'weights': [], 'states': []}
    try:
        getattr(mx.lr_scheduler, name)(**{k: _np_value(v) for k, v in kwargs.items()})
    except Exception as exc:
        out['error'] = [c.__name__ for c in type(exc).__mro__]
        out['text'] = str(exc)
    return out


def sgd_with_schedule(name, kwargs, learning_rate):
    """SGD with momentum fed `name`'s rates (its base_lr set by the optimizer to
    `learning_rate`, as MXNet does), 6 updates of a float32 weight"""
    kwargs = {k: _np_value(v) for k, v in kwargs.items()}
    sched = getattr(mx.lr_scheduler, name)(**kwargs)
    opt = mx.optimizer.SGD(learning_rate=_np_value(learning_rate), momentum=0.9,
                           lr_scheduler=sched)
    upd = mx.optimizer.get_updater(opt)
    rng = np.random.RandomState(1)
    weight = nd.array(rng.randn(5).astype('float32'))
    for _ in range(6):
        upd(0, nd.array(rng.randn(5).astype('float32')), weight)
    return {'weights': arrays([weight]), 'states': [_num(opt.learning_rate)]}


res = []
for case in cases:
    res.append(globals()[case[0]](*case[1:]))
print(json.dumps(res))
'''


def _run(python, lib, cases, env=None):
    return run_child(python, CHILD, lib, cases, env)


def _compare(cases, ref, got):
    diffs = []
    for case, r, g in zip(cases, ref, got):
        if 'error' in r:
            if 'error' not in g or r['error'][0] not in g['error']:
                diffs.append((case, 'MXNet raised %s: %r; mxkv %s' % (
                    r['error'][0], r['text'][:300],
                    ('raised %s: %r' % (g['error'][0], g['text'][:300]))
                    if 'error' in g else 'did not')))
                continue
            if r['error'][0] != 'MXNetError' and r['text'] and r['text'] != g['text']:
                diffs.append((case, 'texts differ: %r vs %r' % (r['text'], g['text'])))
                continue
        elif 'error' in g:
            diffs.append((case, 'mxkv raised %s: %r; MXNet did not' % (g['error'][0],
                                                                      g['text'][:300])))
            continue
        if r['weights'] != g['weights'] or r['states'] != g['states']:
            diffs.append((case, 'weights or states differ'))
    assert not diffs, '\n'.join('%s: %s' % d for d in diffs)


MP_OPTIMIZERS = [
    ('sgd', {'momentum': 0.9}), ('sgd', {}), ('nag', {'momentum': 0.9}), ('nag', {}),
    ('adam', {}), ('lamb', {}), ('lars', {'momentum': 0.9}), ('lars', {}),
    ('rmsprop', {}), ('rmsprop', {'centered': True}), ('adagrad', {}), ('signum', {}),
    ('ftml', {}), ('lbsgd', {'momentum': 0.9}), ('lbsgd', {}), ('dcasgd', {}),
    ('adadelta', {}), ('nadam', {}), ('adamax', {}), ('ftrl', {}), ('sgld', {}),
]
MP_CASES = [['mp_switch', name, kwargs, mp_from, not mp_from, shapes]
            for name, kwargs in MP_OPTIMIZERS
            for mp_from in (True, False)
            for shapes in ([[3, 4]], [[2]], [[3, 4], [1]])]


@pytest.mark.parametrize('aggregation', [None, '0'])
def test_states_of_a_multi_precision_optimizer_loaded_into_a_plain_one(aggregation):
    """both directions, every optimizer; MXNET_OPTIMIZER_AGGREGATION_SIZE=0 takes the
    per-weight operators (sgd_mom_update, mp_sgd_update ...) instead of the multi_* ones"""
    env = {'MXNET_OPTIMIZER_AGGREGATION_SIZE': aggregation} if aggregation else {}
    ref = _run(REF_PYTHON, 'mxnet', MP_CASES, env)
    got = _run(sys.executable, 'mxkv', MP_CASES, env)
    _compare(MP_CASES, ref, got)


STORE_CASES = [['store_step', name, kwargs, dtype, grad_stype, store]
               for name, kwargs in [('sgld', {}), ('adamax', {}), ('nadam', {}),
                                    ('dcasgd', {}), ('sgd', {}), ('adam', {})]
               for dtype in ('float64', 'float16', 'float32')
               for grad_stype in ('row_sparse', 'default')
               for store in ('local', 'device')] + \
    [['store_step', 'test', {}, dtype, 'default', store]   # (its `state[:] = weight` raises
     for dtype in ('float64', 'float16')                   # a TypeError MXNet's store prints
     for store in ('local', 'device')]                     # and mxkv raises: deviation)


def test_ndarray_optimizers_on_row_sparse_weights_of_a_store_that_are_not_float32():
    """SGLD, Adamax, Nadam, DCASGD, Test (SGD and Adam for contrast: their update operators
    write the weight themselves) on float64 / float16 / float32 row_sparse keys"""
    ref = _run(REF_PYTHON, 'mxnet', STORE_CASES)
    got = _run(sys.executable, 'mxkv', STORE_CASES)
    _compare(STORE_CASES, ref, got)


_SCALARS = [['float32', 0.1], ['float64', 0.1], ['float16', 0.1], ['float32', 0.0375], 0.1]
_STEPS = [0, 1, 2, 3, 5, 7, 9, 10, 11, 20]
SCHEDULE_CASES = (
    [['schedule', 'PolyScheduler', dict(max_update=10, base_lr=lr, pwr=p, final_lr=f), _STEPS]
     for lr in _SCALARS for p in (2, 0.5) for f in (0, 0.001, ['float32', 0.001])] +
    [['schedule', 'PolyScheduler', dict(max_update=10, base_lr=lr, warmup_steps=3,
                                        warmup_begin_lr=b, warmup_mode=m), _STEPS]
     for lr in _SCALARS for b in (0, ['float32', 0.01]) for m in ('linear', 'constant')] +
    [['schedule', 'CosineScheduler', dict(max_update=10, base_lr=lr, final_lr=f,
                                          warmup_steps=w), _STEPS]
     for lr in _SCALARS for f in (0, 0.001, ['float16', 0.001]) for w in (0, 2)] +
    [['schedule', 'FactorScheduler', dict(step=2, factor=fa, base_lr=lr,
                                          stop_factor_lr=st), _STEPS]
     for lr in _SCALARS for fa in (0.5, 0.9, ['float32', 0.7]) for st in (1e-8, 0.05)] +
    [['schedule', 'MultiFactorScheduler', dict(step=[2, 5, 9], factor=fa, base_lr=lr,
                                               warmup_steps=1), _STEPS]
     for lr in _SCALARS for fa in (0.5, ['float64', 0.3])] +
    [['sgd_with_schedule', name, kw, lr]
     for name, kw in [('FactorScheduler', dict(step=2, factor=0.7)),
                      ('PolyScheduler', dict(max_update=5, base_lr=['float32', 0.05])),
                      ('CosineScheduler', dict(max_update=5, base_lr=['float32', 0.05],
                                               final_lr=0.001)),
                      ('MultiFactorScheduler', dict(step=[2, 4], factor=0.5))]
     for lr in (['float32', 0.05], ['float16', 0.05], 0.05)] +
    [['make_schedule', name, kw] for name, kw in [
        ('PolyScheduler', dict(max_update=10, warmup_steps=2.0)),
        ('PolyScheduler', dict(max_update=10.0)), ('PolyScheduler', dict(max_update=0)),
        ('CosineScheduler', dict(max_update=2.5)), ('CosineScheduler', dict(max_update=-1)),
        ('MultiFactorScheduler', dict(step=3)), ('MultiFactorScheduler', dict(step=[])),
        ('MultiFactorScheduler', dict(step=[3, 2])),
        ('MultiFactorScheduler', dict(step=[2], factor=['float32', 1.5])),
        ('FactorScheduler', dict(step=0)), ('FactorScheduler', dict(step=2, factor=1.5)),
        ('FactorScheduler', dict(step=2, base_lr=['float32', 0.01], warmup_begin_lr=0.02)),
        ('FactorScheduler', dict(step=2, warmup_steps=-1)),
        ('FactorScheduler', dict(step=2, warmup_mode='cubic'))]])


def test_lr_schedulers_with_numpy_scalars_give_mxnets_rates():
    """under numpy 1 (.venv) and numpy 2 (make pytest-numpy2) alike"""
    ref = _run(REF_PYTHON, 'mxnet', SCHEDULE_CASES)
    got = _run(sys.executable, 'mxkv', SCHEDULE_CASES)
    _compare(SCHEDULE_CASES, ref, got)
