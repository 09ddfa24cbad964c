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
"""
import json
import os
import subprocess
import sys

import pytest

from conftest import BINDINGS, REPO

REF_PYTHON = os.path.join(REPO, '.venv', 'bin', 'python')

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


res = []
for case in cases:
    res.append(globals()[case[0]](*case[1:]))
print(json.dumps(res))
'''


def _run(python, lib, cases, env=None):
    full_env = dict(os.environ, PYTHONPATH=BINDINGS, **(env or {}))
    proc = subprocess.run([python, '-c', CHILD, lib, json.dumps(cases)], env=full_env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


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
