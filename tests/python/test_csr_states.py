"""Optimizer states of csr weights saved and loaded (Updater.get_states / set_states,
KVStore.save_optimizer_states / load_optimizer_states), then the training continued, as
MXNet 1.9.1 does it: the optimizers keep csr states (and csr float32 master copies with
multi_precision) for csr weights, so a state file holds pickled CSRNDArrays.  mxkv
pickles them in its own encoding (the parts as stored, like its dense and row_sparse
arrays); MXNet's state files (MXNDArraySaveRawBytes) load into mxkv too.  Before, mxkv's
CSRNDArray refused to be pickled (MXNetError), so every save here failed."""
import pickle
import warnings

import numpy as np
import pytest

from conftest import assert_same_bits
from test_csr_writes import A, OPTIMIZERS, _grad, _parts

# Adamax's states hold NaN after the first step (0 / 0), and which NaN a later step
# computes may differ from MXNet (see test_csr_writes); 'test' keeps no state
NAMES = sorted(set(OPTIMIZERS) - {'adamax', 'test'})
SAVE_AFTER, CONTINUE = 2, 3


def _create(mx, name, multi_precision=False):
    opt_name, kwargs = OPTIMIZERS[name]
    kwargs = dict(kwargs, multi_precision=multi_precision)
    aggregate_num = kwargs.pop('aggregate_num', None)
    kwargs.setdefault('learning_rate', 0.1)
    opt = mx.optimizer.create(opt_name, **kwargs)
    if aggregate_num is not None:
        opt.aggregate_num = aggregate_num
    return opt


def _states(st):
    return [_parts(s) for s in (st if isinstance(st, (tuple, list)) else [st])]


def _csr(mx, parts, dtype):
    _, data, indices, indptr = parts
    return mx.nd.sparse.csr_matrix((data, indices, indptr), shape=(3, 3), dtype=dtype)


def _quiet(fn, *args):
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        return fn(*args)


def updater_saved(mx, name, dtype, multi_precision, dump_optimizer):
    """SAVE_AFTER updates of a csr weight, then (weight parts, get_states bytes)"""
    upd = mx.optimizer.get_updater(_create(mx, name, multi_precision))
    w = mx.nd.array(A, dtype=dtype).tostype('csr')
    for step in range(SAVE_AFTER):
        _quiet(upd, 0, _grad(mx, step, dtype), w)
    mx.nd.waitall()
    return _parts(w), upd.get_states(dump_optimizer)


def updater_continued(mx, saved, name, dtype, multi_precision):
    """a new updater loads the states, then CONTINUE more updates: the loaded states'
    parts, then the weight's and states' parts after each update"""
    weight, blob = saved
    upd = mx.optimizer.get_updater(_create(mx, name, multi_precision))
    upd.set_states(blob)
    res = [_states(upd.states[0])]
    w = _csr(mx, weight, dtype)
    for step in range(SAVE_AFTER, SAVE_AFTER + CONTINUE):
        _quiet(upd, 0, _grad(mx, step, dtype), w)
        mx.nd.waitall()
        res.append([_parts(w)] + _states(upd.states[0]))
    return res


@pytest.mark.parametrize('dump_optimizer', [False, True])
@pytest.mark.parametrize('name', NAMES)
def test_updater_states_of_a_csr_weight_round_trip(both, name, dump_optimizer):
    mxnet, mxkv = both
    for saver in (mxkv, mxnet):   # mxkv's own file, and MXNet's file read by mxkv
        got = updater_continued(mxkv, updater_saved(saver, name, 'float32', False,
                                                    dump_optimizer), name, 'float32', False)
        want = updater_continued(mxnet, updater_saved(mxnet, name, 'float32', False,
                                                      dump_optimizer), name, 'float32', False)
        assert_same_bits(want, got, '%s saved by %s' % (name, saver.__name__))


@pytest.mark.parametrize('name', NAMES)
def test_updater_states_of_a_float16_csr_weight_multi_precision_round_trip(both, name):
    """float16 csr weights with multi_precision: the float32 csr master copy is saved
    with the states and the loaded one is what later updates start from"""
    mxnet, mxkv = both
    for saver in (mxkv, mxnet):
        got = updater_continued(mxkv, updater_saved(saver, name, 'float16', True, False),
                                name, 'float16', True)
        want = updater_continued(mxnet, updater_saved(mxnet, name, 'float16', True, False),
                                 name, 'float16', True)
        assert_same_bits(want, got, '%s saved by %s' % (name, saver.__name__))


def store_saved(mx, kind, name, fname, dtype='float32'):
    kv = mx.kv.create(kind)
    kv.init(0, mx.nd.array(A, dtype=dtype).tostype('csr'))
    kv.set_optimizer(_create(mx, name, multi_precision=dtype == 'float16'))
    for step in range(SAVE_AFTER):
        _quiet(kv.push, 0, _grad(mx, step, dtype))
    out = mx.nd.sparse.zeros('csr', (3, 3), dtype=dtype)
    kv.pull(0, out=out, ignore_sparse=False)
    kv.save_optimizer_states(fname)
    return _parts(out)


def store_continued(mx, kind, name, weight, fname, dtype='float32'):
    kv = mx.kv.create(kind)
    kv.init(0, _csr(mx, weight, dtype))
    kv.set_optimizer(_create(mx, name, multi_precision=dtype == 'float16'))
    kv.load_optimizer_states(fname)
    res = []
    for step in range(SAVE_AFTER, SAVE_AFTER + CONTINUE):
        _quiet(kv.push, 0, _grad(mx, step, dtype))
        out = mx.nd.sparse.zeros('csr', (3, 3), dtype=dtype)
        kv.pull(0, out=out, ignore_sparse=False)
        res.append(_parts(out))
    return res


@pytest.mark.parametrize('name', ['sgd_mom', 'nag_mom', 'adam', 'lamb', 'rmsprop',
                                  'lars_mom', 'ftml', 'sgd_mom_dense_state'])
@pytest.mark.parametrize('kind', ['local', 'device'])
def test_store_states_of_a_csr_key_round_trip(both, tmp_path, kind, name):
    mxnet, mxkv = both
    ref = str(tmp_path / 'mxnet-ref.states')
    want = store_continued(mxnet, kind, name, store_saved(mxnet, kind, name, ref), ref)
    for saver in (mxkv, mxnet):
        fname = str(tmp_path / ('%s.states' % saver.__name__))
        weight = store_saved(saver, kind, name, fname)
        assert_same_bits(want, store_continued(mxkv, kind, name, weight, fname),
                         '%s saved by %s' % (name, saver.__name__))


@pytest.mark.parametrize('name', ['sgd_mom', 'nag_mom', 'ftml', 'sgd_mom_dense_state',
                                  'adam', 'lamb'])
@pytest.mark.parametrize('kind', ['local', 'device'])
def test_store_states_of_a_float16_csr_key_multi_precision_round_trip(both, tmp_path,
                                                                      kind, name):
    """a float16 csr key with multi_precision: the states file holds the float32 csr
    master copy"""
    mxnet, mxkv = both
    ref = str(tmp_path / 'mxnet-ref.states')
    want = store_continued(mxnet, kind, name, store_saved(mxnet, kind, name, ref, 'float16'),
                           ref, 'float16')
    for saver in (mxkv, mxnet):
        fname = str(tmp_path / ('%s.states' % saver.__name__))
        weight = store_saved(saver, kind, name, fname, 'float16')
        assert_same_bits(want, store_continued(mxkv, kind, name, weight, fname, 'float16'),
                         '%s saved by %s' % (name, saver.__name__))


def _raw(mx, arr):
    """(stype, dtype, shape, data bits, indptr, indices) of a csr array"""
    data = arr.data
    bits = data.asnumpy().view(data._np_dtype) if hasattr(data, '_np_dtype') \
        else data.asnumpy()
    return [arr.stype, str(np.dtype(arr.dtype).name) if arr.dtype is not
            mx.nd.ndarray.bfloat16 else 'bfloat16', list(arr.shape), bits,
            arr.indptr.asnumpy(), arr.indices.asnumpy(), arr.indptr.dtype.__name__,
            arr.indices.dtype.__name__]


@pytest.mark.parametrize('dtype', ['float32', 'float64', 'float16', 'bfloat16', 'int32',
                                   'int64', 'uint8', 'int8'])
def test_csr_pickle_round_trip_is_exact(mxkv, dtype):
    """stored zeros, -0.0 and NaN bits, an uninitialized (all-zero) array, one with an
    empty indptr, a sliced one and an array with no rows: parts, dtypes, shape and
    context unchanged"""
    mx = mxkv
    dt = mx.nd.ndarray.bfloat16 if dtype == 'bfloat16' else dtype
    vals = np.array([[0, 1.5, np.nan], [0, -0.0, 0], [2, 0, -3], [0, 0, 0]])
    if np.dtype(dtype if dtype != 'bfloat16' else 'float32').kind in 'iu':
        vals = np.nan_to_num(vals)
    dense = mx.nd.array(vals).astype(dt)
    arrays = [dense.tostype('csr'), mx.nd.sparse.zeros('csr', (3, 5), dtype=dt),
              dense.tostype('csr')[1:3], mx.nd.sparse.zeros('csr', (0, 4), dtype=dt)]
    stored_zero = dense.tostype('csr') * 0      # stored zeros are kept (MXNet's kernel)
    arrays.append(stored_zero)
    arrays.append(abs(mx.nd.sparse.zeros('csr', (3, 5), dtype=dt)))   # indptr []
    assert arrays[-1].indptr.shape == (0,)
    for arr in arrays:
        back = pickle.loads(pickle.dumps(arr))
        assert type(back) is type(arr) and back.context == arr.context
        assert_same_bits(_raw(mx, arr), _raw(mx, back), dtype)
        assert_same_bits(arr.asnumpy(), back.asnumpy(), dtype)


def test_closed_csr_pickles_as_closed(mxkv):
    arr = mxkv.nd.sparse.zeros('csr', (2, 2))
    arr.close()
    back = pickle.loads(pickle.dumps(arr))
    assert type(back).__name__ == 'CSRNDArray' and back.handle is None
