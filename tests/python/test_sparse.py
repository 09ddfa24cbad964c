"""row_sparse values, differential: each scenario runs with ``mx = mxnet`` (real MXNet 1.9.1)
and with ``mx = mxkv``; indices, data bits, storage types, shapes, dtypes, contexts and
which calls raise must be identical.  See README.md, deviation 12.

Ground rules taken from MXNet's behaviour, so that MXNet itself is only run where it is sound:
* a key always gets the same number of values in its multi-value pushes (MXNet's local store
  sizes a key's copy buffers on the first one and overruns them later: segfault);
* a custom updater is installed before the key's first multi-value push (otherwise MXNet's
  store *is* the merge buffer and the updater sees ``local`` already overwritten by ``recv``);
* MXNet is never asked to densify (``asnumpy``, dense pull) an array with out-of-range rows.

The deliberate deviations (libmxkv raises where MXNet silently misbehaves) are at the end.
"""
import os

import numpy as np
import pytest

from conftest import assert_same_bits

S = (6, 2)


def run_both(both, scenario, *args):
    mxnet, mxkv = both
    expected = scenario(mxnet, *args)
    got = scenario(mxkv, *args)
    assert_same_bits(expected, got, scenario.__name__)
    return got


# --- helpers ---------------------------------------------------------------------------
def state(arr):
    """Everything observable about an array, exactly."""
    res = {'stype': arr.stype, 'shape': repr(arr.shape), 'dtype': np.dtype(arr.dtype).name,
           'ctx': str(arr.context)}
    if arr.stype == 'row_sparse':
        res['indices'] = arr.indices.asnumpy()
        res['data'] = arr.data.asnumpy()
    else:
        res['dense'] = arr.asnumpy()
    return res


def rsp(mx, rows, idx, shape=S, ctx=None, dtype='float32'):
    """row_sparse array of `shape` holding `rows` at row numbers `idx`"""
    data = np.array(rows, dtype=dtype).reshape((len(idx),) + tuple(shape[1:]))
    return mx.nd.sparse.row_sparse_array((data, np.array(idx, dtype=np.int64)), shape=shape,
                                         ctx=ctx, dtype=dtype)


def peek(mx, kv, key, shape=S, dtype='float32'):
    """the stored value as stored (PullWithSparse, ignore_sparse=False, into row_sparse)"""
    out = mx.nd.sparse.zeros('row_sparse', shape, dtype=dtype)
    kv.pull(key, out=out, ignore_sparse=False)
    return state(out)


class Outcomes(object):
    """Runs calls that may raise; records 'ok' or 'error' for each."""

    def __init__(self, mx):
        self.errors = (mx.base.MXNetError, AssertionError)
        self.log = []

    def __call__(self, fn, *args, **kwargs):
        try:
            fn(*args, **kwargs)
            self.log.append('ok')
        except self.errors:
            self.log.append('error')
        return self.log[-1]


# fiddly float32 values: sums depend on the order, -0.0 + 0.0 is +0.0
F = [0.1, 0.2, 0.3, 1e8, -1e8, 1.0, -0.0, 1e-8, 3.0, -3.0]


# --- NDArray level -------------------------------------------------------------------------
def creation(mx):
    res = {}
    a = mx.nd.sparse.row_sparse_array(([[1, 2], [3, 4]], [1, 4]), shape=(6, 2))
    res['lists'] = state(a)
    res['dense_of_lists'] = a.asnumpy()
    res['repr'] = repr(a)
    res['type'] = type(a).__name__
    res['inferred_shape'] = state(mx.nd.sparse.row_sparse_array(([[1, 2], [3, 4]], [0, 2])))
    res['numpy_parts'] = state(mx.nd.sparse.row_sparse_array(
        (np.array([[0.1, -0.0]], np.float64), np.array([3], np.int32)), shape=(5, 2)))
    res['ndarray_parts'] = state(mx.nd.sparse.row_sparse_array(
        (mx.nd.array([[0.1, 0.2, 0.3]]), mx.nd.array([2], dtype='int64')), shape=(3, 3),
        ctx=mx.cpu(1)))
    res['dtype_arg'] = state(mx.nd.sparse.row_sparse_array(([[1.5, 2]], [0]), shape=(2, 2),
                                                          dtype='float16'))
    res['three_d'] = state(mx.nd.sparse.row_sparse_array(
        (np.arange(12, dtype=np.float32).reshape(2, 2, 3), [0, 3]), shape=(4, 2, 3)))
    dense = np.array([[0, 0], [1, -0.0], [0, 2], [-0.0, 0], [np.nan, 0]], np.float32)
    res['from_numpy'] = state(mx.nd.sparse.row_sparse_array(dense))
    res['from_ndarray'] = state(mx.nd.sparse.row_sparse_array(mx.nd.array(dense, dtype='float64')))
    res['from_lists'] = state(mx.nd.sparse.row_sparse_array([[0, 0], [0, 7]]))
    res['from_rsp'] = state(mx.nd.sparse.row_sparse_array(a, dtype='float64'))
    res['from_rsp_ctx'] = state(mx.nd.sparse.row_sparse_array(a, ctx=mx.cpu(3)))
    res['empty_shape'] = state(mx.nd.sparse.row_sparse_array((4, 3)))
    res['zeros'] = state(mx.nd.sparse.zeros('row_sparse', (3, 2)))
    res['zeros_f16_ctx'] = state(mx.nd.sparse.zeros('row_sparse', (1, 2), ctx=mx.cpu(2),
                                                    dtype='float16'))
    res['zeros_dense'] = state(mx.nd.sparse.zeros('default', (2, 2)))
    res['nd_zeros_stype'] = state(mx.nd.zeros((3, 4), stype='row_sparse'))
    res['nd_zeros_stype_args'] = state(mx.nd.zeros((1, 2), mx.cpu(), 'float64',
                                                   stype='row_sparse'))
    res['zeros_asnumpy'] = mx.nd.sparse.zeros('row_sparse', (2, 3), dtype='float16').asnumpy()
    res['csr_zeros'] = [type(mx.nd.sparse.zeros('csr', (2, 3))).__name__,
                        mx.nd.sparse.zeros('csr', (2, 3)).stype, repr(mx.nd.zeros((1, 2),
                                                                                  stype='csr'))]
    res['aux_dtype'] = np.dtype(a.indices.dtype).name
    res['array_copy'] = state(mx.nd.array(a))
    res['sparse_array'] = state(mx.nd.sparse.array(a, dtype='float64'))
    res['int32_index_array'] = state(mx.nd.sparse.row_sparse_array(
        ([[1, 1], [2, 2]], mx.nd.array([0, 3], dtype='int32')), shape=(4, 2)))
    res['float_index_array'] = state(mx.nd.sparse.row_sparse_array(
        ([[1, 1], [2, 2]], mx.nd.array([0, 3])), shape=(4, 2)))
    out = Outcomes(mx)
    out(mx.nd.sparse.row_sparse_array, ([[1, 1], [2, 2]], [0, 1, 2]), shape=(4, 2))
    out(mx.nd.sparse.row_sparse_array, ([[1, 1], [2, 2]], [0]), shape=(4, 2))
    res['parts_of_different_lengths'] = out.log
    return res


def conversions(mx):
    res = {}
    dense = mx.nd.array([[0, 0, 0], [1, 2, -0.0], [0, 0, 0], [-0.0, 0, 0], [0, 0, 5e-8]])
    r = dense.tostype('row_sparse')
    res['tostype_rsp'] = state(r)
    res['back'] = state(r.tostype('default'))
    res['rsp_to_rsp'] = state(r.tostype('row_sparse'))
    res['all_zero'] = state(mx.nd.zeros((3, 2)).tostype('row_sparse'))
    res['one_d'] = state(mx.nd.array([0, 3, 0, -1]).tostype('row_sparse'))
    res['copyto_ctx'] = state(r.copyto(mx.cpu(2)))
    out = mx.nd.ones((5, 3))
    r.copyto(out)
    res['copyto_dense'] = state(out)
    o2 = mx.nd.sparse.row_sparse_array(([[9, 9, 9]], [4]), shape=(5, 3))
    r.copyto(o2)
    res['copyto_rsp'] = state(o2)
    o3 = mx.nd.sparse.zeros('row_sparse', (5, 3))
    dense.copyto(o3)
    res['dense_copyto_rsp'] = state(o3)
    o4 = mx.nd.sparse.zeros('row_sparse', (5, 3))
    o4[:] = dense
    res['setitem_dense'] = state(o4)
    o4[:] = mx.nd.sparse.row_sparse_array(([[1, 1, 1]], [1]), shape=(5, 3))
    res['setitem_rsp'] = state(o4)
    res['astype'] = state(r.astype('float64'))
    res['astype_nocopy'] = r.astype('float32', copy=False) is r
    res['copy'] = state(r.copy())
    dup = mx.nd.sparse.row_sparse_array(([[1, 1, 1], [2, 2, 2]], [3, 3]), shape=(5, 3))
    res['dup_densify_later_wins'] = dup.asnumpy()
    unsorted = mx.nd.sparse.row_sparse_array(([[1, 1, 1], [2, 2, 2]], [3, 0]), shape=(5, 3))
    res['unsorted_densify'] = unsorted.asnumpy()
    out = Outcomes(mx)
    out(r.check_format)
    out(dup.check_format)
    out(unsorted.check_format)
    out(mx.nd.sparse.row_sparse_array(([[1, 1, 1]], [7]), shape=(5, 3)).check_format)
    out(mx.nd.sparse.row_sparse_array(([[1, 1, 1]], [-1]), shape=(5, 3)).check_format)
    out(r.check_format, False)
    res['check_format'] = out.log
    parts = mx.nd.sparse.row_sparse_array(([[1, 2], [3, 4]], [1, 4]), shape=(6, 2))
    data, idx = parts.data, parts.indices       # copies: writing them leaves the array
    data[:] = 7
    idx[:] = 0
    res['parts_are_copies'] = [state(parts), data.asnumpy(), idx.asnumpy()]
    return res


def arithmetic(mx):
    """the sparse arithmetic an updater writes (``local += recv`` ...)"""
    a = rsp(mx, [[1, 2], [0.1, -0.0]], [1, 3])
    b = rsp(mx, [[10, 20], [0.2, 0.0], [5, 5]], [3, 4, 5])
    res = {'add': state(a + b), 'sub': state(a - b), 'mul_scalar': state(a * 3),
           'rmul_scalar': state(0.1 * a), 'div_scalar': state(a / 3)}
    c = a.copy()
    c += b
    res['iadd'] = state(c)
    c -= a
    res['isub'] = state(c)
    c *= 0.5
    res['imul'] = state(c)
    d = rsp(mx, [[1, 2]], [1])
    d += mx.nd.array(np.arange(12, dtype=np.float32).reshape(S) * 0.1)
    res['iadd_dense'] = state(d)
    res['add_dense'] = state(a + mx.nd.ones(S))
    e = rsp(mx, [[1, 2]], [1])
    e += mx.nd.zeros(S)
    res['iadd_zeros'] = state(e)
    empty = mx.nd.sparse.zeros('row_sparse', S)
    res['empty_plus'] = state(empty + a)
    return res


def save_load(mx, tmp_path):
    arrays = {'partial': rsp(mx, [[1, 2], [3, 4]], [1, 4]),
              'full': mx.nd.array(np.arange(12).reshape(S)).tostype('row_sparse'),
              'empty': mx.nd.sparse.zeros('row_sparse', (3, 2)),
              'f64': rsp(mx, [[0.1, 0.2]], [2], dtype='float64'),
              'three_d': mx.nd.sparse.row_sparse_array(
                  (np.ones((1, 2, 3), np.float32), [2]), shape=(4, 2, 3)),
              'dense': mx.nd.array([1, 2, 3])}
    fname = str(tmp_path / ('sparse_%s.params' % mx.__name__))
    mx.nd.save(fname, arrays)
    with open(fname, 'rb') as fin:
        raw = fin.read()
    loaded = mx.nd.load(fname)
    fname2 = str(tmp_path / ('sparse_list_%s.params' % mx.__name__))
    mx.nd.save(fname2, [arrays['partial'], arrays['dense'], arrays['empty']])
    return {'bytes': raw, 'dict': {k: state(v) for k, v in loaded.items()},
            'types': sorted(type(v).__name__ for v in loaded.values()),
            'list': [state(v) for v in mx.nd.load(fname2)]}


# --- store: init -----------------------------------------------------------------------
def init_row_sparse(mx, kind, str_keys):
    kv = mx.kv.create(kind)
    k = (lambda i: 'k%d' % i) if str_keys else (lambda i: i)
    src = rsp(mx, [[0.1, 0.2], [-0.0, 1e8]], [1, 4])
    kv.init(k(0), src)
    src[:] = mx.nd.ones(S)                         # the store holds a copy
    kv.init([k(1), k(2), k(3)], [mx.nd.sparse.zeros('row_sparse', S),
                                 mx.nd.ones(S).tostype('row_sparse'),
                                 rsp(mx, [[1, 2]], [5], dtype='float64')])
    kv.init(k(4), mx.nd.array(np.arange(12).reshape(S)).tostype('row_sparse'))
    res = {'stored': [peek(mx, kv, k(i)) for i in range(3)],
           'stored_f64': peek(mx, kv, k(3), dtype='float64'),
           'source_after': state(src)}
    # (MXNet cannot densify a float64 row_sparse value into a dense output: key 3 skipped)
    dense = [mx.nd.ones(S) * 7 for _ in range(4)]
    kv.pull([k(0), k(1), k(2), k(4)], out=dense)
    res['dense_pull'] = [state(d) for d in dense]
    # (the nnz-0 key 1 is pulled by row_sparse_pull_from_empty_store)
    dtypes = ['float32', 'float32', 'float64', 'float32']
    outs = [mx.nd.sparse.zeros('row_sparse', S, dtype=dt) for dt in dtypes]
    kv.row_sparse_pull([k(0), k(2), k(3), k(4)], out=outs,
                       row_ids=[mx.nd.array([4, 1, 0], dtype='int64')] * 4)
    res['rsp_pull'] = [state(o) for o in outs]
    out = Outcomes(mx)
    out(kv.init, k(0), rsp(mx, [[1, 1]], [0]))     # duplicate init
    res['dup_init'] = out.log
    res['after'] = peek(mx, kv, k(0))
    return res


# --- store: push -----------------------------------------------------------------------
def push_one_value(mx, kind):
    """a single row_sparse value replaces the stored rows (default assign)"""
    kv = mx.kv.create(kind)
    kv.init(0, mx.nd.array(np.arange(12).reshape(S) + 1).tostype('row_sparse'))
    res = [peek(mx, kv, 0)]
    kv.push(0, rsp(mx, [[0.5, -0.0]], [1]))
    res.append(peek(mx, kv, 0))
    kv.push(0, rsp(mx, [[1, 2], [3, 4], [5, 6]], [0, 2, 5], ctx=mx.cpu(1)))
    res.append(peek(mx, kv, 0))
    kv.push(0, mx.nd.sparse.zeros('row_sparse', S))
    res.append(peek(mx, kv, 0))
    kv.push(0, rsp(mx, [[F[0], F[1]]], [3]))
    res.append(peek(mx, kv, 0))
    o = mx.nd.sparse.zeros('row_sparse', S)
    kv.row_sparse_pull(0, out=o, row_ids=mx.nd.array([3, 2]))
    res.append(state(o))
    d = mx.nd.zeros(S)
    kv.pull(0, out=d)
    res.append(state(d))
    return res


MANY = [  # (values as (rows, idx) pairs, pushed from cpu(0), cpu(1), ...)
    [([[1, 1], [2, 2]], [0, 2]), ([[10, 10], [3, 3]], [2, 3])],
    [([[4, 4]], [4]), ([[0.5, 0.5]], [0]), ([[4, 4]], [4])],
    [([], []), ([[1, 2]], [1])],
    [([], []), ([], [])],
    [([[1e8, 1]], [2]), ([[1, 1e8]], [2]), ([[-1e8, 1]], [2]), ([[1, -1e8]], [2])],
    [([[0.1, -0.0], [0.2, 0.3]], [0, 5]), ([[0.2, -0.0]], [0]), ([[0.3, 1e-8], [1, 1]], [0, 1])],
    [([[F[i % 10], F[(i + 3) % 10]] for i in range(6)], list(range(6))),
     ([[0.7, 0.7]], [3])],
]


def push_many_values(mx, kind):
    """two or more row_sparse values of one key: sum over the sorted union of their rows"""
    kv = mx.kv.create(kind)
    res = []
    for key, values in enumerate(MANY):
        kv.init(key, mx.nd.sparse.zeros('row_sparse', S))
        vals = [rsp(mx, rows, idx, ctx=mx.cpu(i)) for i, (rows, idx) in enumerate(values)]
        kv.push(key, vals)
        res.append(peek(mx, kv, key))
        vals = [rsp(mx, [[F[i], F[i + 1]]], [i], ctx=mx.cpu(i)) for i in range(len(values))]
        kv.push(key, vals)                       # again, same number of values
        res.append(peek(mx, kv, key))
    return res


def push_key_lists(mx, kind, str_keys):
    """duplicate keys in one list, several keys, lists of lists"""
    kv = mx.kv.create(kind)
    k = (lambda i: 'k%d' % i) if str_keys else (lambda i: i)
    for i in range(4):
        kv.init(k(i), mx.nd.sparse.zeros('row_sparse', S))
    a = rsp(mx, [[1, 2]], [0])
    b = rsp(mx, [[0.1, 0.2], [3, 4]], [0, 5], ctx=mx.cpu(1))
    c = rsp(mx, [[0.3, -0.0]], [2], ctx=mx.cpu(2))
    kv.push([k(2), k(0), k(2), k(1)], [a, b, c, c])   # k2 gets [a, c]; k0 b; k1 c
    res = [peek(mx, kv, k(i)) for i in range(4)]
    kv.push([k(3), k(2)], [[a, b, c], [b, a]])          # k3 gets 3 values, k2 2 again
    res += [peek(mx, kv, k(i)) for i in range(4)]
    kv.push([k(2), k(3), k(3), k(2)], [c, [b, c], a, b])  # k2 [c, b], k3 [b, c, a]
    res += [peek(mx, kv, k(i)) for i in range(4)]
    return res


def dense_and_sparse_mix(mx, kind):
    """the first value decides: [dense, rsp] sums densely, [rsp, dense] as row_sparse"""
    kv = mx.kv.create(kind)
    # every row has a non-zero element (zero rows: see dense_to_row_sparse_in_store)
    dense = mx.nd.array([[0.5, 0], [1, 2], [0, -1], [0.1, 0.2], [-0.0, 1e-8], [3, 3]],
                        ctx=mx.cpu(1))
    part = rsp(mx, [[0.2, 0.1], [5, 5]], [3, 4])
    res = {}
    out = Outcomes(mx)
    # rsp key, one dense value -> the key becomes dense
    kv.init(0, rsp(mx, [[1, 1]], [2]))
    kv.push(0, dense)
    d = mx.nd.zeros(S)
    kv.pull(0, out=d)
    res['rsp_key_dense_push'] = [state(d), peek(mx, kv, 0)]
    o = mx.nd.sparse.zeros('row_sparse', S)
    out(kv.row_sparse_pull, 0, out=o, row_ids=mx.nd.array([1]))   # dense key now
    # dense key, one rsp value -> the key becomes row_sparse
    kv.init(1, mx.nd.ones(S))
    kv.push(1, part)
    res['dense_key_rsp_push'] = peek(mx, kv, 1)
    kv.row_sparse_pull(1, out=o, row_ids=mx.nd.array([4, 0]))
    res['dense_key_rsp_push_pull'] = state(o)
    # [dense, rsp] into a row_sparse key -> dense sum
    kv.init(2, rsp(mx, [[1, 1]], [2]))
    kv.push(2, [dense, part])
    d = mx.nd.zeros(S)
    kv.pull(2, out=d)
    res['dense_first'] = [state(d), peek(mx, kv, 2)]
    # [rsp, dense] into a dense key -> row_sparse sum over all rows
    kv.init(3, mx.nd.ones(S))
    kv.push(3, [part, dense])
    res['rsp_first'] = peek(mx, kv, 3)
    # [rsp, dense, rsp] into a row_sparse key
    kv.init(4, rsp(mx, [[1, 1]], [2]))
    kv.push(4, [part, dense, rsp(mx, [[1e8, -0.0]], [0], ctx=mx.cpu(2))])
    res['rsp_dense_rsp'] = peek(mx, kv, 4)
    res['outcomes'] = out.log
    return res


# --- store: updater ---------------------------------------------------------------------
def dense_to_row_sparse_in_store(mx, kind):
    """where the store turns a dense value into a row_sparse one it keeps the rows with a
    non-zero element, as cast_storage does (-0.0 counts as zero)"""
    kv = mx.kv.create(kind)
    dense = mx.nd.array([[0, 0], [1, 2], [0, 0], [0.1, 0.2], [-0.0, 0], [3, 3]], ctx=mx.cpu(1))
    part = rsp(mx, [[0.2, 0.1], [5, 5]], [3, 4])
    res = {}
    kv.init(0, mx.nd.array([[0, 0], [1, 2], [0, 0], [3, 4], [0, 0], [-0.0, 0]]))
    res['pull_dense_key'] = peek(mx, kv, 0)
    kv.init(1, mx.nd.ones(S))
    kv.push(1, [part, dense])                              # [rsp, dense]: row_sparse sum
    res['rsp_first'] = peek(mx, kv, 1)
    kv.init(2, rsp(mx, [[1, 1]], [2]))
    kv.push(2, [part, dense, rsp(mx, [[1e8, -0.0]], [0], ctx=mx.cpu(2))])
    res['rsp_dense_rsp'] = peek(mx, kv, 2)
    kv.init(3, rsp(mx, [[1, 1]], [2]))
    kv.push(3, dense)                                      # the key becomes dense
    res['dense_push'] = peek(mx, kv, 3)
    kv.init(4, mx.nd.zeros(S))
    res['all_zero_key'] = peek(mx, kv, 4)
    return res


def updater_sees_row_sparse(mx, kind, str_keys):
    seen = []

    def upd(key, recv, local):
        seen.append({'key': repr(key), 'recv': state(recv), 'local': state(local),
                     'classes': [type(recv).__name__, type(local).__name__]})
        local += recv

    kv = mx.kv.create(kind)
    k = (lambda i: 'k%d' % i) if str_keys else (lambda i: i)
    kv.init(k(0), rsp(mx, [[1, 1], [2, 2]], [0, 3]))
    kv.init(k(1), rsp(mx, [[1, 1]], [5]))
    kv.init(k(2), mx.nd.sparse.zeros('row_sparse', S))
    kv._set_updater(upd)
    kv.push(k(0), rsp(mx, [[0.1, 0.2]], [3]))                           # one value
    kv.push(k(0), [rsp(mx, [[1, 2]], [1]), rsp(mx, [[3, 4], [0.1, 0.2]], [1, 2],
                                                    ctx=mx.cpu(1))])        # two values
    kv.push(k(0), [rsp(mx, [[-0.0, 0.3]], [0]), rsp(mx, [], [], ctx=mx.cpu(1))])
    kv.push(k(1), mx.nd.ones(S) * 0.5)                                  # dense recv
    kv.push([k(2), k(1)], [rsp(mx, [[1e8, 1]], [4]), rsp(mx, [[1, 1]], [0])])
    kv.push(k(2), [rsp(mx, [[1, 1]], [4]), rsp(mx, [[-1e8, 1]], [4], ctx=mx.cpu(2))])
    res = {'seen': seen, 'stored': [peek(mx, kv, k(i)) for i in range(3)]}
    o = mx.nd.sparse.zeros('row_sparse', S)
    kv.row_sparse_pull(k(0), out=o, row_ids=mx.nd.array([0, 1, 2, 3, 4]))
    res['pulled'] = state(o)
    return res


def updater_replaces(mx, kind):
    """an updater that writes a new row set into `local` (local[:] = ...)"""
    seen = []

    def upd(key, recv, local):
        seen.append([state(recv), state(local)])
        local[:] = recv * 2

    kv = mx.kv.create(kind)
    kv.init(7, rsp(mx, [[1, 1], [2, 2]], [0, 3]))
    kv._set_updater(upd)
    kv.push(7, [rsp(mx, [[0.1, 0.3]], [4]), rsp(mx, [[0.2, 0.1]], [4], ctx=mx.cpu(1))])
    kv.push(7, [rsp(mx, [], []), rsp(mx, [[0.2, 0.1]], [5], ctx=mx.cpu(1))])
    return {'seen': seen, 'stored': peek(mx, kv, 7)}


# --- store: row_sparse_pull ----------------------------------------------------------------
def _row_ids(mx):
    return [
        mx.nd.array([3, 1, 3], dtype='int64'),
        mx.nd.array([5, 0, 2], dtype='int64'),
        mx.nd.array([2.7, 0.2]),                          # float32: truncated
        mx.nd.array([5, 4], dtype='float64'),
        mx.nd.array([1, 0, 1], dtype='int32'),
        mx.nd.array([3], dtype='uint8'),
        mx.nd.array([], dtype='int64'),                   # empty
        mx.nd.array([[1, 0], [3, 3]], dtype='int64'),     # 2-D, flattened
        mx.nd.array([0, 1, 2, 3, 4, 5]),                  # all
        mx.nd.array([4, 2], ctx=mx.cpu(3)),               # on another device
    ]


def row_sparse_pull_ids(mx, kind):
    kv = mx.kv.create(kind)
    kv.init(0, rsp(mx, [[1, 1.5], [3, 3.5], [4, 4.5]], [0, 2, 3]))   # partial
    kv.init(1, mx.nd.array(np.arange(12).reshape(S) * 0.1).tostype('row_sparse'))  # all rows
    ids = _row_ids(mx)
    res = []
    for key in range(2):
        for r in ids:
            o = rsp(mx, [[9, 9], [9, 9]], [1, 2])        # previous content is discarded
            kv.row_sparse_pull(key, out=o, row_ids=r)
            res.append(state(o))
    return res


def row_sparse_pull_from_empty_store(mx, kind):
    """a stored value with nnz 0 gives outputs with nnz 0, whatever the ids (spec A.6.2)"""
    kv = mx.kv.create(kind)
    kv.init(2, mx.nd.sparse.zeros('row_sparse', S))
    kv.init(3, rsp(mx, [[1, 1]], [2]))
    kv.push(3, mx.nd.sparse.zeros('row_sparse', S))     # assign: nnz 0 now
    res = []
    for key in (2, 3):
        for r in _row_ids(mx):
            o = rsp(mx, [[9, 9], [9, 9]], [1, 2])
            kv.row_sparse_pull(key, out=o, row_ids=r)
            res.append(state(o))
    return res


def row_sparse_pull_outputs(mx, kind, str_keys):
    """several outputs: one row_ids for all (pull then copy), one per output, several keys"""
    kv = mx.kv.create(kind)
    k = (lambda i: 'k%d' % i) if str_keys else (lambda i: i)
    kv.init(k(0), rsp(mx, [[1, 1.5], [3, 3.5], [4, 4.5]], [0, 2, 3]))
    kv.init(k(1), mx.nd.array(np.arange(12).reshape(S) * 0.1).tostype('row_sparse'))
    res = {}
    outs = [mx.nd.sparse.zeros('row_sparse', S, ctx=mx.cpu(i)) for i in range(3)]
    kv.row_sparse_pull(k(0), out=outs, row_ids=mx.nd.array([3, 0, 5]))
    res['single_ids'] = [state(o) for o in outs]
    kv.row_sparse_pull(k(0), out=outs, row_ids=[mx.nd.array([3]), mx.nd.array([]),
                                               mx.nd.array([2, 2, 1])])
    res['ids_per_output'] = [state(o) for o in outs]
    kv.row_sparse_pull(k(0), out=outs, row_ids=[mx.nd.array([0, 1])])
    res['single_id_list'] = [state(o) for o in outs]
    o1, o2, o3 = [mx.nd.sparse.zeros('row_sparse', S) for _ in range(3)]
    kv.row_sparse_pull([k(1), k(0), k(1)], out=[o1, o2, o3],
                       row_ids=[mx.nd.array([5, 1]), mx.nd.array([2]), mx.nd.array([0])])
    res['several_keys'] = [state(o) for o in (o1, o2, o3)]
    grid = [[mx.nd.sparse.zeros('row_sparse', S, ctx=mx.cpu(i)) for i in range(2)]
            for _ in range(2)]
    kv.row_sparse_pull([k(0), k(1)], out=grid,
                       row_ids=[[mx.nd.array([0]), mx.nd.array([2])],
                                [mx.nd.array([3]), mx.nd.array([4, 1])]])
    res['grid'] = [state(o) for row in grid for o in row]
    o = mx.nd.sparse.zeros('row_sparse', S)
    kv.row_sparse_pull(k(1), o, 0, mx.nd.array([1]))      # positional arguments
    res['positional'] = state(o)
    return res


def row_sparse_pull_float64_output(mx):
    """local converts the output dtype"""
    kv = mx.kv.create('local')
    kv.init(0, rsp(mx, [[0.1, 0.2], [0.3, 1e8]], [1, 4]))
    o = mx.nd.sparse.zeros('row_sparse', S, dtype='float64')
    kv.row_sparse_pull(0, out=o, row_ids=mx.nd.array([4, 1, 0]))
    return state(o)


# --- store: plain pull ---------------------------------------------------------------------
def pull_ignore_sparse(mx, kind):
    kv = mx.kv.create(kind)
    kv.init(0, rsp(mx, [[1, 1.5], [-0.0, 3.5]], [1, 3]))
    kv.init(1, mx.nd.array([[0, 1], [1, 2], [1e-8, 0], [3, 4], [-1, 0], [0, 0.1]]))
    res = {}
    for ignore in (True, False):
        for key in (0, 1):
            dense = mx.nd.ones(S) * 7
            sparse = rsp(mx, [[9, 9]], [5])
            kv.pull(key, out=dense, ignore_sparse=ignore)
            kv.pull(key, out=sparse, ignore_sparse=ignore)
            res['%s_%d' % (ignore, key)] = [state(dense), state(sparse)]
        mixed = [rsp(mx, [[9, 9]], [5]), mx.nd.zeros(S, ctx=mx.cpu(1)),
                 rsp(mx, [[8, 8]], [4], ctx=mx.cpu(2))]
        kv.pull(0, out=mixed, ignore_sparse=ignore)
        res['mixed_%s' % ignore] = [state(m) for m in mixed]
    default = rsp(mx, [[9, 9]], [5])
    kv.pull(0, out=default)                               # default: ignore_sparse=True
    res['default'] = state(default)
    # pushpull pulls with ignore_sparse=True: row_sparse outputs are not written
    out = rsp(mx, [[9, 9]], [5])
    kv.pushpull(0, rsp(mx, [[2, 2]], [2]), out=out)
    res['pushpull'] = [state(out), peek(mx, kv, 0)]
    dense_out = mx.nd.zeros(S)
    kv.pushpull(0, rsp(mx, [[3, 3]], [1]), out=dense_out)
    res['pushpull_dense_out'] = state(dense_out)
    return res


# --- misuse both reject -------------------------------------------------------------------
def misuse(mx, kind):
    kv = mx.kv.create(kind)
    kv.init(0, rsp(mx, [[1, 1]], [2]))
    kv.init(1, mx.nd.ones(S))
    out = Outcomes(mx)
    ids = mx.nd.array([1, 2])
    out(kv.row_sparse_pull, 0, out=mx.nd.zeros(S), row_ids=ids)            # dense output
    o = mx.nd.sparse.zeros('row_sparse', S)
    out(kv.row_sparse_pull, 0, out=o, row_ids=ids.tostype('row_sparse'))  # rsp row ids
    out(kv.row_sparse_pull, 0, out=o, row_ids=mx.nd.sparse.zeros('csr', (2, 2)))
    out(kv.row_sparse_pull, 1, out=o, row_ids=ids)                         # dense stored key
    out(kv.row_sparse_pull, 9, out=o, row_ids=ids)                         # uninitialised
    out(kv.row_sparse_pull, [0, 1], out=[o, mx.nd.sparse.zeros('row_sparse', S)],
        row_ids=[ids, ids])                                                # one bad key
    out(kv.row_sparse_pull, 0, out=[o, o], row_ids=[ids, ids, ids])        # ids count
    out(kv.push, 0, mx.nd.sparse.zeros('csr', S))                          # csr push
    out(kv.push, 8, rsp(mx, [[1, 1]], [2]))                                # uninitialised
    out(kv.init, 0, rsp(mx, [[1, 1]], [2]))                                # duplicate init
    if kind == 'local':
        out(kv.push, 0, rsp(mx, [[1, 1]], [2], shape=(7, 2)))              # shape (local)
    out(kv.pull, 0, out=mx.nd.zeros((7, 2)))                               # dense out shape
    skv = mx.kv.create(kind)
    skv.init('w', rsp(mx, [[1, 1]], [2]))
    out(skv.row_sparse_pull, 'nope', out=o, row_ids=ids)                   # unknown str key
    out(skv.row_sparse_pull, 3, out=o, row_ids=ids)                        # int key, str store
    out(skv.push, 'nope', rsp(mx, [[1, 1]], [2]))
    return {'outcomes': out.log, 'stored': [peek(mx, kv, 0), peek(mx, skv, 'w')]}


def misuse_uninitialised_push(mx, kind, n):
    kv = mx.kv.create(kind)
    out = Outcomes(mx)
    out(kv.push, 5, [rsp(mx, [[1, 1]], [2], ctx=mx.cpu(i)) for i in range(n)])
    return out.log


# --- tests ---------------------------------------------------------------------------------
KINDS = ['local', 'device']


def test_creation(both):
    run_both(both, creation)


def test_conversions(both):
    run_both(both, conversions)


def test_arithmetic(both):
    run_both(both, arithmetic)


def test_save_load(both, tmp_path):
    run_both(both, save_load, tmp_path)


def test_csr_zeros_have_an_indptr_and_save(both, tmp_path):
    """sparse.zeros/empty('csr') hold rows + 1 zero offsets, as MXNet's zeros operator
    makes them, so they save and load back (with indptr left empty, save refused them)"""
    def scenario(mx):
        res = {}
        for make in ('zeros', 'empty'):
            a = getattr(mx.nd.sparse, make)('csr', (3, 4))
            res[make] = [a.indptr.asnumpy(), a.indices.asnumpy(), a.data.asnumpy()]
            fname = str(tmp_path / ('%s_%s.params' % (mx.__name__, make)))
            mx.nd.save(fname, [a])
            b = mx.nd.load(fname)[0]
            res[make + '_loaded'] = [b.stype, repr(b.shape), b.indptr.asnumpy(),
                                     b.indices.asnumpy(), b.data.asnumpy()]
        return res
    run_both(both, scenario)


def test_load_mxnet_file(both, tmp_path):
    """a .params file written by MXNet loads in mxkv with the same parts, and back"""
    mxnet, mxkv = both
    fname = str(tmp_path / 'from_mxnet.params')
    mxnet.nd.save(fname, {'w': rsp(mxnet, [[1, 2], [0.1, -0.0]], [0, 5]),
                          'e': mxnet.nd.sparse.zeros('row_sparse', (3, 4))})
    got = {k: state(v) for k, v in mxkv.nd.load(fname).items()}
    expected = {k: state(v) for k, v in mxnet.nd.load(fname).items()}
    assert_same_bits(expected, got)
    fname2 = str(tmp_path / 'from_mxkv.params')
    mxkv.nd.save(fname2, mxkv.nd.load(fname))
    assert_same_bits(expected, {k: state(v) for k, v in mxnet.nd.load(fname2).items()})


@pytest.mark.parametrize('str_keys', [False, True])
@pytest.mark.parametrize('kind', KINDS)
def test_init(both, kind, str_keys):
    run_both(both, init_row_sparse, kind, str_keys)


@pytest.mark.parametrize('kind', KINDS)
def test_push_one_value_assigns(both, kind):
    run_both(both, push_one_value, kind)


@pytest.mark.parametrize('kind', KINDS)
def test_push_many_values(both, kind):
    run_both(both, push_many_values, kind)


@pytest.mark.parametrize('str_keys', [False, True])
@pytest.mark.parametrize('kind', KINDS)
def test_push_key_lists(both, kind, str_keys):
    run_both(both, push_key_lists, kind, str_keys)


@pytest.mark.parametrize('kind', KINDS)
def test_dense_and_sparse_mix(both, kind):
    run_both(both, dense_and_sparse_mix, kind)


@pytest.mark.parametrize('kind', KINDS)
def test_dense_to_row_sparse_in_store(both, kind):
    run_both(both, dense_to_row_sparse_in_store, kind)


@pytest.mark.parametrize('str_keys', [False, True])
@pytest.mark.parametrize('kind', KINDS)
def test_updater_sees_row_sparse(both, kind, str_keys):
    res = run_both(both, updater_sees_row_sparse, kind, str_keys)
    assert res['seen'][0]['recv']['stype'] == 'row_sparse'


@pytest.mark.parametrize('kind', KINDS)
def test_updater_replaces(both, kind):
    run_both(both, updater_replaces, kind)


@pytest.mark.parametrize('kind', KINDS)
def test_row_sparse_pull_ids(both, kind):
    run_both(both, row_sparse_pull_ids, kind)


@pytest.mark.parametrize('kind', KINDS)
def test_row_sparse_pull_from_empty_store(both, kind):
    run_both(both, row_sparse_pull_from_empty_store, kind)


@pytest.mark.parametrize('str_keys', [False, True])
@pytest.mark.parametrize('kind', KINDS)
def test_row_sparse_pull_outputs(both, kind, str_keys):
    run_both(both, row_sparse_pull_outputs, kind, str_keys)


def test_row_sparse_pull_float64_output_local(both):
    run_both(both, row_sparse_pull_float64_output)


@pytest.mark.parametrize('kind', KINDS)
def test_pull_ignore_sparse(both, kind):
    run_both(both, pull_ignore_sparse, kind)


@pytest.mark.parametrize('kind', KINDS)
def test_misuse_is_rejected(both, kind):
    res = run_both(both, misuse, kind)
    assert 'ok' not in res['outcomes']


@pytest.mark.parametrize('n', [1, 2])
@pytest.mark.parametrize('kind', KINDS)
def test_push_to_uninitialised_key(both, kind, n):
    assert run_both(both, misuse_uninitialised_push, kind, n) == ['error']


# --- deliberate deviations: libmxkv raises (naming the key) and keeps the store -------------
def _on_real_mxnet(mxkv):
    return 'libmxnet' in os.path.basename(mxkv.base.library_path)


@pytest.fixture
def mxkv_only(mxkv):
    if _on_real_mxnet(mxkv):
        pytest.skip('deliberate deviation from MXNet 1.9.1')
    return mxkv


def _raises_naming(mx, key, fn, *args, **kwargs):
    with pytest.raises(mx.base.MXNetError) as info:
        fn(*args, **kwargs)
    msg = str(info.value)
    assert repr(key) in msg or ('key %s' % key) in msg, msg
    return msg


BAD_INDICES = {'unsorted': [3, 0], 'duplicated': [1, 1], 'past_end': [2, 6],
               'far_past_end': [2, 1000000], 'negative': [-1, 2]}


@pytest.mark.parametrize('bad', sorted(BAD_INDICES))
@pytest.mark.parametrize('kind', KINDS)
def test_deviation_bad_indices_in_init(mxkv_only, kind, bad):
    mx = mxkv_only
    kv = mx.kv.create(kind)
    _raises_naming(mx, 4, kv.init, 4, rsp(mx, [[1, 1], [2, 2]], BAD_INDICES[bad]))
    _raises_naming(mx, 4, kv.pull, 4, out=mx.nd.zeros(S))     # nothing was stored
    kv.init(4, rsp(mx, [[1, 1]], [0]))
    assert peek(mx, kv, 4)['indices'].tolist() == [0]
    skv = mx.kv.create(kind)
    _raises_naming(mx, 'emb', skv.init, 'emb', rsp(mx, [[1, 1], [2, 2]], BAD_INDICES[bad]))


@pytest.mark.parametrize('nvals', [1, 2, 3])
@pytest.mark.parametrize('bad', sorted(BAD_INDICES))
@pytest.mark.parametrize('kind', KINDS)
def test_deviation_bad_indices_in_push(mxkv_only, kind, bad, nvals):
    mx = mxkv_only
    kv = mx.kv.create(kind)
    kv.init(3, rsp(mx, [[1, 1], [2, 2]], [0, 4]))
    before = peek(mx, kv, 3)
    good = [rsp(mx, [[5, 5]], [1], ctx=mx.cpu(i + 1)) for i in range(nvals - 1)]
    _raises_naming(mx, 3, kv.push, 3, good + [rsp(mx, [[7, 7], [8, 8]], BAD_INDICES[bad])])
    assert_same_bits(before, peek(mx, kv, 3))
    # a list of keys where only the second key's value is bad: names that key
    kv.init(5, rsp(mx, [[1, 1]], [2]))
    _raises_naming(mx, 5, kv.push, [3, 5], [rsp(mx, [[3, 3]], [3]),
                                            rsp(mx, [[7, 7], [8, 8]], BAD_INDICES[bad])])
    kv.push(3, rsp(mx, [[3, 3]], [3]))        # the store still works
    assert peek(mx, kv, 3)['indices'].tolist() == [3]


@pytest.mark.parametrize('ids', [[6], [2, 7], [1000], [-1], [-100000000], [0, 6, 6]])
@pytest.mark.parametrize('stored', ['partial', 'full'])
@pytest.mark.parametrize('kind', KINDS)
def test_deviation_row_ids_out_of_range(mxkv_only, kind, stored, ids):
    mx = mxkv_only
    kv = mx.kv.create(kind)
    value = rsp(mx, [[1, 1]], [2]) if stored == 'partial' else mx.nd.ones(S).tostype('row_sparse')
    kv.init('emb', value)
    before = peek(mx, kv, 'emb')
    out = rsp(mx, [[9, 9]], [1])
    _raises_naming(mx, 'emb', kv.row_sparse_pull, 'emb', out=out,
                   row_ids=mx.nd.array(ids, dtype='int64'))
    assert_same_bits(before, peek(mx, kv, 'emb'))
    fid = mx.nd.array([float(i) for i in ids], dtype='float64')
    _raises_naming(mx, 'emb', kv.row_sparse_pull, 'emb', out=out, row_ids=fid)


@pytest.mark.parametrize('out_shape', [(7, 2), (6, 3), (6, 1), (5, 2)])
def test_deviation_device_row_sparse_pull_output_shape(mxkv_only, out_shape):
    """MXNet's device store fills a wrong-shape output with reinterpreted bytes"""
    mx = mxkv_only
    kv = mx.kv.create('device')
    kv.init(2, rsp(mx, [[1, 1]], [2]))
    out = mx.nd.sparse.zeros('row_sparse', out_shape)
    _raises_naming(mx, 2, kv.row_sparse_pull, 2, out=out, row_ids=mx.nd.array([2]))


@pytest.mark.parametrize('dtype', ['float64', 'float16'])
def test_deviation_device_row_sparse_pull_output_dtype(both, dtype):
    """MXNet's device store fails asynchronously for an output of another dtype; libmxkv's
    device store converts it, as MXNet's local store does (compared with MXNet's local)"""
    mxnet, mxkv = both
    if _on_real_mxnet(mxkv):
        pytest.skip('deliberate deviation from MXNet 1.9.1')

    def scenario(mx, kind):
        kv = mx.kv.create(kind)
        kv.init(2, rsp(mx, [[0.1, 1e8], [0.3, -0.0]], [2, 4]))
        out = mx.nd.sparse.zeros('row_sparse', S, dtype=dtype)
        kv.row_sparse_pull(2, out=out, row_ids=mx.nd.array([4, 2, 0]))
        return state(out)
    assert_same_bits(scenario(mxnet, 'local'), scenario(mxkv, 'device'))


def test_deviation_local_row_sparse_pull_output_shape(both):
    """local: MXNet and libmxkv both reject a wrong output shape"""
    def scenario(mx):
        kv = mx.kv.create('local')
        kv.init(2, rsp(mx, [[1, 1]], [2]))
        out = Outcomes(mx)
        out(kv.row_sparse_pull, 2, out=mx.nd.sparse.zeros('row_sparse', (7, 2)),
            row_ids=mx.nd.array([2]))
        return out.log
    assert run_both(both, scenario) == ['error']


def test_mxnet_silently_misbehaves(mxnet):
    """what the deviations above protect against (run on MXNet where it does not crash)"""
    mx = mxnet
    kv = mx.kv.create('local')
    kv.init(0, mx.nd.sparse.zeros('row_sparse', S))
    kv.push(0, [rsp(mx, [[3, 3], [0.5, 0.5]], [3, 0]), rsp(mx, [[1, 1]], [1])])
    st = peek(mx, kv, 0)
    assert st['indices'].tolist() == [0, 1, 3] and st['data'][0].tolist() == [0, 0]  # row lost
    kv.init(1, rsp(mx, [[1, 1]], [2]))
    o = mx.nd.sparse.zeros('row_sparse', S)
    kv.row_sparse_pull(1, out=o, row_ids=mx.nd.array([7], dtype='int64'))  # rc 0
    assert o.indices.asnumpy().tolist() == [7]            # an invalid array, no error
