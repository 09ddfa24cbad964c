"""Copies between dense and sparse (row_sparse, csr) arrays, and what rests on them, run
through real MXNet 1.9.1 (the reference venv) and through mxkv, one child process per
library, compared exactly.

1. MXNet's CopyFromToImpl between storage types casts the storage straight into the
   destination when both arrays are on one context (cast_storage: the dtypes must be the
   same), and across contexts (cpu(0), cpu(1), cpu_pinned(0)) into a temporary of the
   destination's storage type and the default dtype, float32, which it then copies over
   converting the values.  So ``dense.copyto(sparse)``, ``sparse[:] = dense``,
   ``sparse[:] = numpy array`` (a float32 array on cpu(0) first) and
   ``sparse.copyto(dense)`` fail on any dtype change within one context and, across
   contexts, for every source dtype but float32, which is converted.  MXNet fails at the
   next wait (README deviation 9: mxkv raises at the call); across contexts it leaves
   the destination as it was, on one context partly overwritten (mxkv leaves it).
   Before: mxkv converted every dense -> row_sparse and row_sparse/csr -> dense copy and
   refused every dense -> csr dtype change, float32 across contexts too.
2. A pull (``ignore_sparse=False``) from a ``local`` or ``device`` store into an output
   of another storage type (a csr or row_sparse key into a dense output, a dense key
   into a sparse one) is such a copy from the key's value, which lives on cpu_pinned(0):
   into an output on another context it fails for keys that are not float32 (mxkv
   pulled them), into one on cpu_pinned(0) on a dtype change.
3. Aggregated optimizer updates (SGD's multi_(mp_)sgd(_mom)_update, LAMB's
   multi_(mp_)lamb_update, LARS's preloaded_multi_* after multi_sum_sq), given a list of
   weights by an Updater: MXNet's fused operator infers the shapes and dtypes of all its
   arrays and fails before writing any; mxkv updated the weights one at a time, so a
   gradient or state of another shape or dtype on a later weight left the earlier ones
   (and their states) updated, with a ValueError for shapes.
"""
import sys

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
CTX = {'c': mx.cpu(0), 'p': mx.cpu_pinned(0), 'c1': mx.cpu(1)}
VALUES = np.array([[0, 1.1, 0, 2.5], [0, 0, 0, 0], [3, 0, -1e-9, -1.5]])


def parts(arr):
    if arr.stype == 'row_sparse':
        pieces = [arr.indices, arr.data]
    elif arr.stype == 'csr':
        pieces = [arr.indptr, arr.indices, arr.data]
    else:
        pieces = [arr]
    return [[p.asnumpy().dtype.str, p.asnumpy().tobytes().hex()] for p in pieces]


def sparse_dst(stype, ctx, dtype):
    if stype == 'row_sparse':
        return nd.sparse.row_sparse_array(
            (np.array([[7, 0, 0, 0], [0, 0, 8, 0]]), np.array([0, 1])), shape=(3, 4),
            ctx=CTX[ctx], dtype=dtype)
    return nd.sparse.csr_matrix((np.array([7, 8]), np.array([0, 2]), np.array([0, 1, 2, 2])),
                                shape=(3, 4), ctx=CTX[ctx], dtype=dtype)


def copy_case(op, stype, sdt, sctx, ddt, dctx):
    """returns (destination, the call)"""
    if op in ('copyto', 'setitem'):            # dense -> sparse
        src = nd.array(VALUES, dtype=sdt, ctx=CTX[sctx])
        dst = sparse_dst(stype, dctx, ddt)
        if op == 'copyto':
            return dst, lambda: src.copyto(dst)
        def call():
            dst[:] = src
        return dst, call
    if op == 'setitem_np':                     # numpy -> sparse (via float32 on cpu(0))
        dst = sparse_dst(stype, dctx, ddt)
        def call():
            dst[:] = VALUES.astype(sdt)
        return dst, call
    # op == 'to_dense': sparse -> dense
    src = sparse_dst(stype, sctx, sdt)
    dst = nd.ones((3, 4), dtype=ddt, ctx=CTX[dctx])
    return dst, lambda: src.copyto(dst)


def store_pull(store, kst, ost, kdt, odt, octx):
    kv = mx.kv.create(store)
    key = nd.array(VALUES, dtype=kdt)
    kv.init(0, key if kst == 'default' else key.tostype(kst))
    out = (nd.ones((3, 4), dtype=odt, ctx=CTX[octx]) if ost == 'default'
           else sparse_dst(ost, octx, odt))
    return out, lambda: kv.pull(0, out=out, ignore_sparse=False)


def arrays_of(tree):
    if isinstance(tree, (list, tuple)):
        return [arrays_of(x) for x in tree]
    if tree is None:
        return None
    return parts(tree)


class Updated:
    """an Updater's weights and states, compared as the destination of a copy is"""
    def __init__(self, weights, updater):
        self.weights, self.updater = weights, updater

    @property
    def stype(self):
        return 'updated'


def fused_update(name, kwargs, mp, bad, nweights):
    """an Updater given `nweights` weights at once (one fused operator per chunk of
    MXNET_OPTIMIZER_AGGREGATION_SIZE); `bad`: which array of the last weight is wrong"""
    dtype = 'float16' if mp else 'float32'
    rng = np.random.RandomState(0)
    shapes = [(3, 4), (2, 5), (4,), (2, 2, 2), (6,), (1, 3)][:nweights]
    weights = [nd.array(rng.randn(*s), dtype=dtype) for s in shapes]
    grads = [nd.array(rng.randn(*s), dtype=dtype) for s in shapes]
    last = shapes[-1]
    updater = mx.optimizer.get_updater(mx.optimizer.create(
        name, learning_rate=0.1, multi_precision=mp, **kwargs))
    updater(list(range(nweights)), grads, weights)   # states created, a first step
    if bad == 'grad_shape':
        grads[-1] = nd.array(rng.randn(*last[::-1] if len(last) > 1 else (last[0] + 1,)),
                             dtype=dtype)
    elif bad == 'grad_dtype':
        grads[-1] = nd.array(rng.randn(*last), dtype='float64')
    if bad == 'state_shape':   # a state set for another shape (set_states)
        state = updater.states[nweights - 1]
        other = nd.zeros(last[::-1] if len(last) > 1 else (last[0] + 1,),
                         dtype='float32' if mp else dtype)
        if name == 'lamb':
            updater.states[nweights - 1] = (state[0], (other, state[1][1])) if mp else \
                (other, state[1])
        else:
            updater.states[nweights - 1] = (other, state[1]) if mp else other
    result = Updated(weights, updater)
    return result, lambda: updater(list(range(nweights)), grads, weights)


def parts_of(obj):
    if isinstance(obj, Updated):
        return [arrays_of(obj.weights),
                arrays_of([obj.updater.states[k] for k in sorted(obj.updater.states)])]
    return parts(obj)


res = []
for case in cases:
    dst, call = globals()[case[0]](*case[1:])
    nd.waitall()
    before = parts_of(dst)
    out = {}
    try:
        call()
        nd.waitall()
    except Exception as e:  # MXNet: at the wait; mxkv: at the call
        out['error'] = type(e).__name__
        try:
            nd.waitall()
        except Exception:
            pass
    try:
        out['after'] = parts_of(dst)
    except Exception as e:
        out['after'] = 'read failed: ' + type(e).__name__
    out['unchanged'] = out['after'] == before
    res.append(out)
print(json.dumps(res))
'''


def _run(python, lib, cases, env=None):
    return run_child(python, CHILD, lib, cases, env)


def _compare(cases, same_context, env=None, failed_as_mxnet=False):
    """the same success or failure; after a success the same parts, bit for bit; after a
    failure mxkv's destination unchanged, and MXNet's too where it leaves it (another
    context; on one context MXNet has overwritten part of it), or with `failed_as_mxnet`
    the same exception class and the same arrays as MXNet's after it"""
    ref = _run(REF_PYTHON, 'mxnet', cases, env)
    got = _run(sys.executable, 'mxkv', cases, env)
    diffs = []
    for case, r, g in zip(cases, ref, got):
        if ('error' in r) != ('error' in g):
            diffs.append((case, 'MXNet %s, mxkv %s' % (
                'failed' if 'error' in r else 'copied', 'failed' if 'error' in g else 'copied')))
        elif 'error' in r and failed_as_mxnet:   # (MXNet fails at the call: compared)
            if g['error'] != r['error'] or r['after'] != g['after']:
                diffs.append((case, 'MXNet failed with %s, mxkv with %s; arrays after it %s'
                              % (r['error'], g['error'], 'the same' if r['after'] == g[
                                  'after'] else 'differ')))
        elif 'error' in r:
            if g['error'] != 'MXNetError' or not g['unchanged']:
                diffs.append((case, 'mxkv failed with %s, destination unchanged: %s'
                              % (g['error'], g['unchanged'])))
            elif not same_context(case) and not r['unchanged']:
                diffs.append((case, 'MXNet changed the destination of a failed copy'))
        elif r['after'] != g['after']:
            diffs.append((case, 'results differ: %r vs %r' % (r['after'], g['after'])))
    assert not diffs, '%d of %d differ:\n' % (len(diffs), len(cases)) + '\n'.join(
        '%s: %s' % d for d in diffs)


DTYPES = ('float32', 'float64', 'float16', 'int32', 'uint8')
CONTEXTS = (('c', 'p'), ('p', 'c'), ('p', 'p'), ('c', 'c1'), ('c', 'c'))


def test_dense_to_sparse_copies_fail_and_convert_as_mxnet():
    cases = [['copy_case', op, stype, sdt, sctx, ddt, dctx]
             for op in ('copyto', 'setitem')
             for stype in ('row_sparse', 'csr')
             for sdt in DTYPES for ddt in DTYPES
             for sctx, dctx in CONTEXTS]
    _compare(cases, lambda case: case[4] == case[6])


def test_numpy_assigned_to_sparse_goes_through_a_float32_array_on_cpu0():
    """x[:] = numpy array: MXNet's _array(value) (float32, cpu(0)), then copyto: float16
    destinations get float64 values rounded twice; on cpu(0) only float32 ones take it"""
    cases = [['copy_case', 'setitem_np', stype, sdt, None, ddt, dctx]
             for stype in ('row_sparse', 'csr')
             for sdt in ('float64', 'float32', 'float16')
             for ddt in ('float32', 'float64', 'float16', 'int32')
             for dctx in ('c', 'p', 'c1')]
    _compare(cases, lambda case: case[6] == 'c')


def test_sparse_to_dense_copies_fail_and_convert_as_mxnet():
    cases = [['copy_case', 'to_dense', stype, sdt, sctx, ddt, dctx]
             for stype in ('row_sparse', 'csr')
             for sdt in DTYPES for ddt in ('float32', 'float64', 'float16')
             for sctx, dctx in CONTEXTS]
    _compare(cases, lambda case: case[4] == case[6])


def test_pulls_that_change_the_storage_type_fail_and_convert_as_mxnet():
    """a key's value lives on cpu_pinned(0): pulled into an output of another storage
    type on cpu(0) it converts from float32 only, on cpu_pinned(0) it must keep its
    dtype (a dense key into a csr output there with a dtype change crashes MXNet: not
    run)"""
    stypes = (('csr', 'default'), ('row_sparse', 'default'), ('default', 'row_sparse'),
              ('default', 'csr'))
    cases = [['store_pull', store, kst, ost, kdt, odt, octx]
             for store in ('local', 'device')
             for kst, ost in stypes
             for kdt in ('float32', 'float64', 'float16', 'int32')
             for odt in ('float32', 'float64', 'float16')
             for octx in ('c', 'p', 'c1')
             if not (ost == 'csr' and octx == 'p' and kdt != odt)]
    _compare(cases, lambda case: case[6] == 'p')


FUSED = [('sgd', {}), ('sgd', {'momentum': 0.9}), ('lamb', {}), ('lars', {}),
         ('lars', {'momentum': 0.9})]


def test_a_fused_optimizer_update_that_fails_writes_nothing():
    """3 weights, one operator (aggregation 4): nothing written; 5 weights in chunks of 2:
    the chunks before the failing one are written, as in MXNet"""
    for size, nweights in (('4', 3), ('2', 5)):
        cases = [['fused_update', name, kwargs, mp, bad, nweights]
                 for name, kwargs in FUSED for mp in (False, True)
                 for bad in ('grad_shape', 'grad_dtype', 'state_shape', None)
                 if not (bad == 'state_shape' and name != 'lamb' and
                         not (mp or kwargs.get('momentum')))]
        _compare(cases, lambda case: False, {'MXNET_OPTIMIZER_AGGREGATION_SIZE': size},
                 failed_as_mxnet=True)
