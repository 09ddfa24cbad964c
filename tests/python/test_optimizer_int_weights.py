"""The built-in optimizers on integer weights (int32, int64, uint8, int8), run through real
MXNet 1.9.1 (the reference venv) and mxkv, one child process per library, compared
exactly: the error class, its text where MXNet's kernels refuse the dtype, the weight and
state bits after it, the optimizer's update counts.

MXNet's optimizer kernels (sgd_update, sgd_mom_update, multi_sgd_*, nag_mom_update,
adam_update, signsgd/signum_update, ftml_update, lamb_update_phase1, the preloaded
multi_sgd ops of LARS, ...) dispatch on MSHADOW_REAL_TYPE_SWITCH and fail an integer weight
with mshadow's 'This operation only support floating point types, not int32' ('... types
not uint8' for the 8-bit ones) before writing anything.  mxkv ran its kernels in the
weight's dtype instead (the learning rate cast to the integer type) and wrote the weight:
SGD, NAG, Signum, Adam, FTML, LAMB, LARS, LBSGD and ccSGD returned normally.  Optimizers
built from NDArray operations (Adamax, Test, DCASGD) run on integers in both; AdaGrad,
RMSProp, AdaDelta, Ftrl and SGLD fail earlier, in type inference (their float32 states:
mxkv said 'Incompatible attr: input 2 has dtype float32, expected int32' or 'operands have
different dtypes', now MXNet's ElemwiseType text with its input position) or in a random
operator.  Also a weight and gradient of two dtypes: the first failing operator input
(ftrl_update's gradient before its states; sgd_update's type inference before its dtype
switch; AdaGrad's and AdaDelta's `div + wd * weight` after their states were written, as
MXNet's NDArray operations run).

Three paths: Optimizer.update_multi_precision with its created state, an Updater, and a
local store's set_optimizer + push + pull.  MXNet's local store prints and swallows an
error raised by the Python updater (type inference, DCASGD's ambiguous truth value) while
mxkv raises it from the push (README deviation: an updater that fails); such a case is
accepted when the same case fails through the Updater and the weights agree.  Nadam is left
out: its integer update divides by zero, which kills MXNet with SIGFPE.

MXNet's kernels fail in its engine, after the Python call returned: an Updater given
several weights (or a store pushing several keys) goes on with the others and the error
comes at the next wait.  mxkv's Updater stopped at the first integer weight, leaving the
float weights after it (in another dtype group, or any later one without aggregation)
not updated.  (Not emulated: a failed kernel that takes one of MXNet's 4 round-robin temp
space copies (adam_update, the LAMB phases, LARS's multi_sum_sq) poisons that copy's engine
variable until the next wait, so the 4th, 8th... such kernel after it is skipped; those
cases are left out.)
"""
import json
import sys

from conftest import REF_PYTHON, run_child


CHILD = r'''
import json, sys, warnings
warnings.simplefilter('ignore')
import logging
logging.disable(logging.CRITICAL)
lib, cases = sys.argv[1], json.loads(sys.argv[2])
import numpy as np
if lib == 'mxnet':
    sys.modules['mxkv'] = None
    import mxnet as mx
else:
    import mxkv as mx
nd = mx.nd


def bits(tree):
    if isinstance(tree, (list, tuple)):
        return [bits(x) for x in tree]
    if tree is None:
        return None
    arr = tree.asnumpy()
    return [arr.dtype.str, list(arr.shape), arr.tobytes().hex()]


def last_line(text):
    lines = [l for l in str(text).strip().splitlines() if l.strip()]
    line = lines[-1] if lines else ''
    return line[len('MXNetError: '):] if line.startswith('MXNetError: ') else line


def run(name, kwargs, dtype, path, values):
    opt = mx.optimizer.create(name, **kwargs)
    wdt, gdt = (dtype.split('/') + [dtype])[:2]   # 'weight dtype/gradient dtype'
    weight = nd.array(values[0], dtype=wdt)
    grad = nd.array(values[1], dtype=gdt)
    out = {}
    states = None
    try:
        if path == 'opt':
            states = opt.create_state_multi_precision(0, weight)
            opt.update_multi_precision(0, weight, grad, states)
        elif path == 'updater':
            upd = mx.optimizer.get_updater(opt)
            try:
                upd(0, grad, weight)
            finally:
                states = upd.states.get(0)
        else:
            kv = mx.kv.create('local')
            kv.set_optimizer(opt)
            kv.init(0, weight)
            kv.push(0, grad)
            kv.pull(0, out=weight)
        nd.waitall()
    except Exception as exc:
        out['error'] = [c.__name__ for c in type(exc).__mro__]
        out['text'] = last_line(exc)
        try:
            nd.waitall()
        except Exception:
            pass
        if path == 'kv':
            kv.pull(0, out=weight, ignore_sparse=False)
            try:
                nd.waitall()
            except Exception:
                pass
    out['weights'] = bits([weight])
    out['states'] = bits(states) if path != 'kv' else []
    out['counts'] = sorted(opt._index_update_count.items()) if path != 'kv' else []
    return out


def mixed(name, kwargs, path, dtypes):
    """one Updater call (or one store push) for several weights of `dtypes`"""
    opt = mx.optimizer.create(name, **kwargs)
    rng = np.random.RandomState(3)
    weights = [nd.array(rng.randint(-5, 6, size=(3,)), dtype=dt) for dt in dtypes]
    grads = [nd.array(rng.randint(-5, 6, size=(3,)), dtype=dt) for dt in dtypes]
    keys = list(range(len(dtypes)))
    out = {}
    upd = None
    try:
        if path == 'updater':
            upd = mx.optimizer.get_updater(opt)
            upd(keys, grads, weights)
        else:
            kv = mx.kv.create(path)
            kv.set_optimizer(opt)
            kv.init(keys, weights)
            kv.push(keys, grads)
        nd.waitall()
    except Exception as exc:
        out['error'] = [c.__name__ for c in type(exc).__mro__]
        out['text'] = last_line(exc)
    if path != 'updater':
        kv.pull(keys, out=weights)
        nd.waitall()
    out['weights'] = bits(weights)
    out['states'] = bits([upd.states.get(k) for k in keys]) if upd is not None else []
    out['counts'] = sorted(opt._index_update_count.items()) if upd is not None else []
    return out


print(json.dumps([mixed(*case[1:]) if case[0] == 'mixed' else run(*case)
                  for case in cases]))
'''

# the errors whose text mxkv gives as MXNet: the kernels' dtype switch and the type
# inference of an update operator or an NDArray operation on a float32 state
EXACT_TEXTS = ('This operation only support floating point types',
               'Incompatible attr in node  at ')

OPTIMIZERS = [
    ('sgd', {}), ('sgd', {'momentum': 0.9}), ('sgd', {'lazy_update': False}),
    ('sgd', {'multi_precision': True}), ('sgd', {'momentum': 0.9, 'wd': 0.1}),
    ('signum', {}), ('signum', {'momentum': 0.0}), ('nag', {}), ('nag', {'momentum': 0.9}),
    ('adam', {}), ('adam', {'lazy_update': False}), ('ftml', {}), ('lamb', {}),
    ('lars', {}), ('lars', {'momentum': 0.9}), ('lbsgd', {}), ('lbsgd', {'momentum': 0.9}),
    ('ccsgd', {}), ('adamax', {}), ('test', {}), ('dcasgd', {}), ('dcasgd', {'momentum': 0.9}),
    ('adagrad', {}), ('rmsprop', {}), ('rmsprop', {'centered': True}), ('adadelta', {}),
    ('ftrl', {}), ('sgld', {}),
]
VALUES = {
    'int32': [[1, -2, 3, 2147483647], [2, 4, -6, 1]],
    'int64': [[1, -2, 3, 9], [2, 4, -6, 1]],
    'uint8': [[1, 2, 3, 255], [2, 4, 6, 1]],
    'int8': [[1, -2, 3, 127], [2, 4, -6, 1]],
}
CASES = [[name, dict(kwargs, learning_rate=lr), dtype, path, VALUES[dtype]]
         for name, kwargs in OPTIMIZERS
         for lr in (0.5, 2.0)
         for dtype in ('int32', 'int64', 'uint8', 'int8')
         for path in ('opt', 'updater', 'kv')] + \
    [[name, dict(kwargs, learning_rate=0.5), dtypes, 'opt', VALUES['int32']]
     for name, kwargs in OPTIMIZERS
     for dtypes in ('int32/float32', 'float32/int32', 'float64/float32', 'float16/float32')]


def _run(python, lib, cases=None):
    return run_child(python, CHILD, lib, cases or CASES)


def test_optimizers_on_integer_weights_fail_or_compute_as_mxnet():
    ref = _run(REF_PYTHON, 'mxnet')
    got = _run(sys.executable, 'mxkv')
    by_case = {json.dumps(c): r for c, r in zip(CASES, ref)}
    diffs = []
    for case, r, g in zip(CASES, ref, got):
        if 'error' in r:
            if 'error' not in g or r['error'][0] not in g['error']:
                diffs.append((case, 'MXNet raised %s: %r; mxkv %s' % (
                    r['error'][0], r['text'], ('raised %s: %r' % (g['error'][0], g['text']))
                    if 'error' in g else 'did not')))
                continue
            if any(t in r['text'] for t in EXACT_TEXTS) and \
                    not g['text'].startswith(r['text']):   # (+ mxkv's note on fused ops)
                diffs.append((case, 'texts differ: %r vs %r' % (r['text'], g['text'])))
                continue
        elif 'error' in g:
            via_updater = by_case[json.dumps(case[:3] + ['updater'] + case[4:])]
            if not (case[3] == 'kv' and 'error' in via_updater
                    and g['error'][0] == via_updater['error'][0]):
                diffs.append((case, 'mxkv raised %s: %r; MXNet did not' % (g['error'][0],
                                                                          g['text'])))
                continue
        if (r['weights'], r['states'], r['counts']) != (g['weights'], g['states'],
                                                        g['counts']):
            diffs.append((case, 'weights, states or counts differ: %r vs %r' % (
                r['weights'], g['weights'])))
    assert not diffs, '%d of %d cases differ:\n%s' % (
        len(diffs), len(CASES), '\n'.join('%s: %s' % d for d in diffs))


TEMP_SPACE = ('adam', 'lamb', 'lars')   # kernels with MXNet's round-robin temp space
MIXED_CASES = [['mixed', name, dict(kwargs, learning_rate=0.5), path, dtypes]
               for name, kwargs in [('sgd', {}), ('sgd', {'momentum': 0.9}), ('nag', {}),
                                    ('adam', {}), ('signum', {}), ('ftml', {}),
                                    ('lamb', {}), ('lars', {}), ('lbsgd', {})]
               for path in ('updater', 'local', 'device')
               for dtypes in (['int32', 'float32', 'int64', 'float64'],
                              ['float32', 'uint8', 'float32', 'float32', 'float32',
                               'float32', 'int32'],
                              ['float16', 'int8', 'float64'])
               if len(dtypes) < 5 or name not in TEMP_SPACE]


def test_an_integer_weight_among_others_fails_after_the_others_are_updated():
    ref = _run(REF_PYTHON, 'mxnet', MIXED_CASES)
    got = _run(sys.executable, 'mxkv', MIXED_CASES)
    diffs = []
    for case, r, g in zip(MIXED_CASES, ref, got):
        if r.get('error', [None])[0] not in g.get('error', [None]) or \
                r.get('text') != g.get('text'):
            diffs.append((case, 'errors differ: %r vs %r' % (r.get('text'), g.get('text'))))
        elif dict(r, error=None) != dict(g, error=None):
            diffs.append((case, 'weights, states or counts differ'))
    assert not diffs, '%d of %d cases differ:\n%s' % (
        len(diffs), len(MIXED_CASES), '\n'.join('%s: %s' % d for d in diffs))
