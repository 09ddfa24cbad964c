"""MXNet 1.9.1's own KVStore tests, restated for mxkv (issue 9, section 5).

The checks of apache/mxnet 1.9.1's ``tests/python/unittest/test_kvstore.py``,
``tests/python/unittest/test_kvstore_custom.py`` and ``tests/nightly/test_kvstore.py``
(the single-machine parts, GPU contexts replaced by CPU ones, smaller shapes), rewritten
here, plus the store registry of ``python/mxnet/kvstore/base.py``.  Every test runs
twice: on mxkv (``import mxkv as mx``) and on real MXNet 1.9.1, so a check that MXNet
itself does not pass cannot creep in.  Running these through mxkv found the gaps of
issue 9 section 5: no ``teststore`` (``create('teststore')`` gave a native local
store), ``dense += row_sparse`` raising (updaters and the Test optimizer with row_sparse
gradients), and no ``mx.random``.
"""
import copy
import warnings

import numpy as np
import pytest

SHAPE = (4, 4)
KEYS = [5, 7, 11]
STR_KEYS = ['b', 'c', 'd']
NUM_DEVS = 4


@pytest.fixture(params=['mxkv', 'mxnet'])
def mx(request):
    """the library under test: mxkv, then real MXNet running the same test"""
    mod = request.getfixturevalue(request.param)
    np.random.seed(1)
    mod.random.seed(1)
    return mod


def check_diff_to_scalar(arr, value):
    """every element of `arr` equals `value` exactly"""
    assert np.sum(np.abs((arr - value).asnumpy())) == 0, (arr.asnumpy(), value)


def rand_rsp(mx, shape, ctx=None):
    """a random row_sparse array: float32 rows in [-1, 1), about half the rows stored"""
    dense = np.random.uniform(-1, 1, shape).astype(np.float32)
    dense[np.random.rand(shape[0]) < 0.5] = 0
    arr = mx.nd.array(dense, ctx=ctx)
    return arr.tostype('row_sparse')


def devices(mx):
    return [mx.Context('cpu', i) for i in range(NUM_DEVS)]


def int_store(mx, stype='default'):
    kv = mx.kv.create()
    kv.init(3, mx.nd.zeros(shape=SHAPE, stype=stype))
    kv.init(KEYS, [mx.nd.zeros(shape=SHAPE, stype=stype)] * len(KEYS))
    return kv


def str_store(mx, stype='default'):
    kv = mx.kv.create()
    kv.init('a', mx.nd.zeros(SHAPE, stype=stype))
    kv.init(STR_KEYS, [mx.nd.zeros(shape=SHAPE, stype=stype)] * len(STR_KEYS))
    return kv


# === unittest/test_kvstore.py ===========================================================
@pytest.mark.parametrize('stype', ['default', 'row_sparse'])
def test_single_kv_pair(mx, stype):
    for kv, key in ((int_store(mx), 3), (str_store(mx), 'a')):
        kv.push(key, mx.nd.ones(SHAPE).tostype(stype))
        val = mx.nd.empty(SHAPE)
        kv.pull(key, out=val)
        check_diff_to_scalar(val, 1)


@pytest.mark.parametrize('count', [1, 4])
def test_row_sparse_pull(mx, count):
    """row ids as a 2-D float32 array, with repeats; rows not asked for come back zero"""
    kv = str_store(mx, 'row_sparse')
    kv.init('e', mx.nd.ones(SHAPE).tostype('row_sparse'))
    rows = SHAPE[0]
    vals, row_ids = [], []
    for _ in range(count):
        vals.append(mx.nd.zeros(SHAPE).tostype('row_sparse'))
        ids = np.random.randint(rows, size=rows)
        row_ids.append(mx.nd.array(ids).reshape((2, rows // 2)))
    kv.row_sparse_pull('e', out=vals[0] if count == 1 else vals,
                       row_ids=row_ids[0] if count == 1 else row_ids)
    for val, ids in zip(vals, row_ids):
        got = val.asnumpy()
        wanted = set(ids.asnumpy().astype(int).ravel().tolist())
        for row in range(rows):
            np.testing.assert_array_equal(got[row], np.full(SHAPE[1], 1.0 if row in wanted
                                                            else 0.0, np.float32))


@pytest.mark.parametrize('key', [3, 'a'])
def test_init(mx, key):
    kv = mx.kv.create()
    kv.init(key, mx.nd.ones(SHAPE) * 4)
    out = mx.nd.zeros(SHAPE)
    kv.pull(key, out=out)
    check_diff_to_scalar(out, 4)


@pytest.mark.parametrize('kind', ['device', 'local'])
def test_pull(mx, kind):
    kv = mx.kv.create(kind)
    one = mx.nd.ones(SHAPE)
    out = mx.nd.zeros(SHAPE)
    kv.init('1', mx.nd.zeros(SHAPE))
    kv.push('1', [one, one, one, one])
    kv.pull('1', out)
    check_diff_to_scalar(out, 4)
    kv.init('2', mx.nd.zeros(SHAPE))
    kv.pull('2', out)
    check_diff_to_scalar(out, 0)


@pytest.mark.parametrize('stype', ['default', 'row_sparse'])
def test_list_kv_pair(mx, stype):
    for kv, keys in ((int_store(mx), KEYS), (str_store(mx), STR_KEYS)):
        kv.push(keys, [mx.nd.ones(SHAPE).tostype(stype) * 4] * len(keys))
        outs = [mx.nd.empty(SHAPE)] * len(keys)
        kv.pull(keys, out=outs)
        for out in outs:
            check_diff_to_scalar(out, 4)


@pytest.mark.parametrize('stype', ['default', 'row_sparse'])
def test_aggregator(mx, stype):
    devs = devices(mx)
    for kv, key, keys in ((int_store(mx), 3, KEYS), (str_store(mx), 'a', STR_KEYS)):
        vals = [mx.nd.ones(SHAPE, d).tostype(stype) for d in devs]
        outs = [mx.nd.empty(SHAPE, d) for d in devs]
        kv.push(key, vals)
        kv.pull(key, out=outs)
        for out in outs:
            check_diff_to_scalar(out, NUM_DEVS)
        vals = [[mx.nd.ones(SHAPE, d).tostype(stype) * 2.0 for d in devs]] * len(keys)
        outs = [[mx.nd.empty(SHAPE, d) for d in devs]] * len(keys)
        kv.push(keys, vals)
        kv.pull(keys, out=outs)
        for row in outs:
            for out in row:
                check_diff_to_scalar(out, NUM_DEVS * 2.0)


@pytest.mark.parametrize('sparse_pull', [False, True])
def test_sparse_aggregator(mx, sparse_pull):
    kv = str_store(mx, 'row_sparse')
    devs = devices(mx)
    all_rows = mx.nd.array(np.arange(SHAPE[0]))

    def pull(keys, vals):
        if sparse_pull:
            ids = [all_rows] * NUM_DEVS
            kv.row_sparse_pull(keys, out=vals, row_ids=ids if keys == 'a' else [ids] * len(vals))
        else:
            kv.pull(keys, out=vals, ignore_sparse=False)

    vals = [rand_rsp(mx, SHAPE).copyto(d) for d in devs]
    expected = sum(v.asnumpy().astype(np.float64) for v in vals)
    kv.push('a', vals)
    pull('a', vals)
    np.testing.assert_allclose(sum(v.asnumpy() for v in vals), expected * NUM_DEVS,
                               rtol=1e-5, atol=1e-6)

    vals = [[rand_rsp(mx, SHAPE).copyto(d) for d in devs]] * len(STR_KEYS)
    expected = sum(v.asnumpy().astype(np.float64) for v in vals[0])
    kv.push(STR_KEYS, vals)
    pull(STR_KEYS, vals)
    for row in vals:
        np.testing.assert_allclose(sum(v.asnumpy() for v in row), expected * NUM_DEVS,
                                   rtol=1e-5, atol=1e-6)


def _int_updater(key, recv, local):
    assert isinstance(key, int)
    local += recv


def _str_updater(key, recv, local):
    if isinstance(key, bytes):
        key = key.decode('utf-8')
    assert isinstance(key, str)
    local += recv


@pytest.mark.parametrize('stype', ['default', 'row_sparse'])
def test_updater(mx, stype):
    """an updater adding the pushed sum (row_sparse for stype row_sparse: dense weight +=
    row_sparse gradient) into the stored dense value"""
    devs = devices(mx)
    for kv, key, keys, upd in ((int_store(mx), 3, KEYS, _int_updater),
                               (str_store(mx), 'a', STR_KEYS, _str_updater)):
        kv._set_updater(upd)
        vals = [mx.nd.ones(SHAPE, d).tostype(stype) for d in devs]
        outs = [mx.nd.empty(SHAPE, d) for d in devs]
        kv.push(key, vals)
        kv.pull(key, out=outs)
        for out in outs:
            check_diff_to_scalar(out, NUM_DEVS)
        vals = [[mx.nd.ones(SHAPE, d).tostype(stype) for d in devs]] * len(keys)
        outs = [[mx.nd.empty(SHAPE, d) for d in devs]] * len(keys)
        for _ in range(4):
            kv.push(keys, vals)
        kv.pull(keys, out=outs)
        for row in outs:
            for out in row:
                check_diff_to_scalar(out, NUM_DEVS * 4)


def test_get_type(mx):
    assert mx.kv.create('local_allreduce_cpu').type == 'local_allreduce_cpu'


def test_invalid_pull(mx):
    MXNetError = mx.base.MXNetError  # pylint: disable=invalid-name
    kvs = {3: int_store(mx), 'a': str_store(mx)}
    lists = {3: KEYS, 'a': STR_KEYS}
    for key, kv in kvs.items():
        keys = lists[key]
        # a plain pull into row_sparse outputs is ignored: they keep their values
        out = (mx.nd.ones(SHAPE) * 2).tostype('row_sparse')
        kv.pull(key, out=out)
        check_diff_to_scalar(out, 2)
        outs = [(mx.nd.ones(SHAPE) * 2).tostype('row_sparse') for _ in keys]
        kv.pull(keys, out=outs)
        for out in outs:
            check_diff_to_scalar(out, 2)
        # row_sparse_pull into dense outputs is refused
        with pytest.raises(MXNetError):
            kv.row_sparse_pull(key, out=mx.nd.ones(SHAPE) * 2, row_ids=mx.nd.array([1]))
        with pytest.raises(MXNetError):
            kv.row_sparse_pull(keys, out=[mx.nd.ones(SHAPE) * 2] * len(keys),
                               row_ids=[mx.nd.array([1])] * len(keys))
        # a store takes int keys or str keys, not both
        other = 'a' if key == 3 else 3
        other_keys = lists[other]
        dense = mx.nd.ones(SHAPE) * 2
        rsp = dense.tostype('row_sparse')
        for call in (lambda: kv.init(other, dense), lambda: kv.push(other, dense),
                     lambda: kv.pull(other, dense),
                     lambda: kv.row_sparse_pull(other, rsp, row_ids=mx.nd.array([1]))):
            with pytest.raises(MXNetError):
                call()
        dense_l = [dense] * len(other_keys)
        rsp_l = [rsp] * len(other_keys)
        for call in (lambda: kv.init(other_keys, dense_l), lambda: kv.push(other_keys, dense_l),
                     lambda: kv.pull(other_keys, dense_l),
                     lambda: kv.row_sparse_pull(other_keys, rsp_l,
                                                row_ids=[mx.nd.array([1])] * len(other_keys))):
            with pytest.raises(MXNetError):
                call()


# === unittest/test_kvstore_custom.py ====================================================
@pytest.mark.parametrize('name', ['device', 'teststore'])
@pytest.mark.parametrize('key', [3, 'a'])
def test_broadcast_single_kv_pair(mx, name, key):
    kv = mx.kv.create(name)
    ones = mx.nd.ones(SHAPE)
    out = mx.nd.empty(SHAPE)
    kv.broadcast(key, ones, out)
    check_diff_to_scalar(out, 1)
    outs = [mx.nd.empty(SHAPE)] * 3
    kv.broadcast(key + key, ones, outs)   # 6 or 'aa': a new key, three outputs
    for out in outs:
        check_diff_to_scalar(out, 1)


@pytest.mark.parametrize('keys', [KEYS, STR_KEYS])
def test_broadcast_list_kv_pair(mx, keys):
    kv = mx.kv.create('device')
    outs = [mx.nd.empty(SHAPE)] * len(keys)
    kv.broadcast(keys, [mx.nd.ones(SHAPE)] * len(keys), outs)
    for out in outs:
        check_diff_to_scalar(out, 1)
    outs = [[mx.nd.empty(SHAPE)] * 2 for _ in keys]
    kv.broadcast([k + k for k in keys], [mx.nd.ones(SHAPE)] * len(keys), outs)
    for row in outs:
        for out in row:
            check_diff_to_scalar(out, 1)


def _check_pushpull(mx, kv, key, keys, in_place):
    kv.broadcast(key, mx.nd.zeros(SHAPE), out=mx.nd.empty(SHAPE))
    devs = devices(mx)
    vals = [mx.nd.ones(SHAPE, d) for d in devs]
    outs = [mx.nd.empty(SHAPE, d) for d in devs]
    kv.pushpull(key, vals, out=outs)
    for out in outs:
        check_diff_to_scalar(out, NUM_DEVS)
    if in_place:
        kv.pushpull(key, vals)
        for val in vals:
            check_diff_to_scalar(val, NUM_DEVS)
    if keys is None:
        return
    kv.broadcast(keys, [mx.nd.zeros(SHAPE)] * len(keys), out=[mx.nd.empty(SHAPE)] * len(keys))
    vals = [[mx.nd.ones(SHAPE, d) * 2.0 for d in devs]] * len(keys)
    outs = [[mx.nd.empty(SHAPE, d) for d in devs]] * len(keys)
    kv.pushpull(keys, vals, out=outs)
    for row in outs:
        for out in row:
            check_diff_to_scalar(out, NUM_DEVS * 2.0)
    if in_place:
        kv.pushpull(keys, vals)
        for row in vals:
            for val in row:
                check_diff_to_scalar(val, NUM_DEVS * 2.0)


@pytest.mark.parametrize('in_place', [True, False])
def test_pushpull(mx, in_place):
    _check_pushpull(mx, mx.kv.create('device'), 3, KEYS, in_place)
    _check_pushpull(mx, mx.kv.create('device'), 'a', STR_KEYS, in_place)
    _check_pushpull(mx, mx.kv.create('teststore'), 3, None, in_place)
    _check_pushpull(mx, mx.kv.create('teststore'), 'a', None, in_place)


def test_custom_store(mx):
    kv = mx.kv.create('teststore')
    out = mx.nd.empty((1,))
    kv.broadcast(1, mx.nd.ones((1,)), out=out)
    check_diff_to_scalar(out, 1)
    assert type(kv).is_capable('optimizer') is False  # a staticmethod
    kv.broadcast(1, mx.nd.ones((1,)), out=out)
    check_diff_to_scalar(out, 1)
    outs = [mx.nd.empty((1,))] * 2                    # one array, twice
    kv.pushpull(1, [mx.nd.ones((1,))] * 2, out=outs)
    for arr in outs:
        check_diff_to_scalar(arr, 2)
    kv.pushpull(1, outs)                              # 2 + 2 into both entries
    for arr in outs:
        check_diff_to_scalar(arr, 4)


def test_get_type_teststore(mx):
    for name in ('teststore', 'TestStore', 'TESTSTORE'):
        kv = mx.kv.create(name)
        assert kv.type == 'teststore'
        assert (kv.rank, kv.num_workers) == (0, 1)
        assert type(kv).__name__ == 'TestStore'


def test_teststore_unsupported_methods(mx, tmp_path):
    kv = mx.kv.create('teststore')
    assert not kv.is_capable('optimizer')
    assert not kv.is_capable('OPTIMIZER')
    with pytest.raises(ValueError):
        kv.is_capable('compression')
    with pytest.raises(NotImplementedError):
        kv.set_optimizer(mx.optimizer.create('sgd'))
    with pytest.raises(NotImplementedError):
        kv.save_optimizer_states(str(tmp_path / 'test'))
    with pytest.raises(NotImplementedError):
        kv.load_optimizer_states(str(tmp_path / 'test'))
    assert not (tmp_path / 'test').exists()


# === the registry of python/mxnet/kvstore/base.py =======================================
@pytest.fixture
def clean_registry(mx):
    """restore KVStoreBase.kv_registry after a test that registers stores"""
    registry = mx.kv.KVStoreBase.kv_registry
    saved = dict(registry)
    yield registry
    registry.clear()
    registry.update(saved)


def test_native_store_capabilities(mx):
    kv = mx.kv.create('local')
    assert isinstance(kv, mx.kv.KVStoreBase)
    assert kv.is_capable(mx.kv.KVStoreBase.OPTIMIZER)
    with pytest.raises(ValueError):
        kv.is_capable('sparsity')
    assert 'teststore' in mx.kv.KVStoreBase.kv_registry


def test_register_and_create_a_python_store(mx, clean_registry):
    created = []

    class MyAllReduce(mx.kv.KVStoreBase):  # pylint: disable=abstract-method
        def __init__(self):
            created.append(self)

        @property
        def type(self):
            return 'myallreduce'

        def pushpull(self, key, value, out=None, priority=0):
            total = sum(v.asnumpy() for v in value)
            for dst in (value if out is None else out):
                dst[:] = total

    assert mx.kv.KVStoreBase.register(MyAllReduce) is MyAllReduce
    assert clean_registry['myallreduce'] is MyAllReduce
    kv = mx.kv.create('MyAllReduce')
    assert isinstance(kv, MyAllReduce) and created == [kv] and kv.type == 'myallreduce'
    vals = [mx.nd.ones(SHAPE) * i for i in range(1, 4)]
    kv.pushpull(0, vals)
    for val in vals:
        check_diff_to_scalar(val, 6)
    with pytest.raises(NotImplementedError):   # KVStoreBase's own methods
        kv.broadcast(0, vals[0], vals[1])
    with pytest.raises(NotImplementedError):
        kv.is_capable('optimizer')
    with pytest.raises(NotImplementedError):
        kv.rank  # pylint: disable=pointless-statement


def test_registered_store_comes_before_the_native_one(mx, clean_registry):
    @mx.kv.KVStoreBase.register
    class Horovod(mx.kv.KVStoreBase):  # pylint: disable=unused-variable,abstract-method
        @property
        def type(self):
            return 'horovod-like'

    assert mx.kv.create('horovod').type == 'horovod-like'
    del clean_registry['horovod']
    native = mx.kv.create('horovod')       # unregistered: the library's store of that name
    assert type(native).__name__ == 'KVStore' and native.type == 'horovod'


def test_register_override_warns_and_non_class_is_refused(mx, clean_registry):
    class First(mx.kv.KVStoreBase):  # pylint: disable=abstract-method
        pass

    def make_second():
        class First(mx.kv.KVStoreBase):  # pylint: disable=abstract-method,redefined-outer-name
            marker = 2
        return First

    mx.kv.KVStoreBase.register(First)
    second = make_second()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        mx.kv.KVStoreBase.register(second)
    assert any('overriding' in str(w.message) for w in caught)
    assert type(mx.kv.create('first')).marker == 2
    with pytest.raises(AssertionError):
        mx.kv.KVStoreBase.register(First())
    with pytest.raises(TypeError):
        mx.kv.create(3)


# === nightly/test_kvstore.py (single machine, CPU contexts) ============================
NIGHTLY_KEYS = [3, 5, 7]
# the last shape is above MXNET_KVSTORE_BIGARRAY_BOUND (10**6 elements)
NIGHTLY_SHAPES = [(4, 4), (100, 100), (1001, 1000)]
LR = .1
NREPEAT = 2
NIGHTLY_KINDS = ['local_update_cpu', 'local_allreduce_cpu', 'local_allreduce_device']


def _nightly_data():
    rng = np.random.RandomState(7)
    return [[[rng.random_sample(s) * 2 - 1 for _ in range(NUM_DEVS)] for s in NIGHTLY_SHAPES]
            for _ in range(NREPEAT)]


def _close(outs, expect):
    err = sum(np.sum(np.abs(o.asnumpy() - expect)) for o in outs) / np.sum(np.abs(expect))
    assert err < 1e-6, (err, expect.shape)


@pytest.mark.parametrize('kind', NIGHTLY_KINDS)
@pytest.mark.parametrize('stype', ['default', 'row_sparse'])
def test_test_optimizer_per_key(mx, kind, stype):
    """the Test optimizer (weight += rescale_grad * grad) on sums of 4 pushed values"""
    data = _nightly_data()
    kv = mx.kv.create(kind)
    kv.set_optimizer(mx.optimizer.create('test', rescale_grad=LR))
    for key, shape in zip(NIGHTLY_KEYS, NIGHTLY_SHAPES):
        kv.init(key, mx.nd.zeros(shape))
    res = [np.zeros(s) for s in NIGHTLY_SHAPES]
    for rep in range(NREPEAT):
        for j, key in enumerate(NIGHTLY_KEYS):
            kv.push(key, [mx.nd.array(data[rep][j][g], mx.cpu(g)).tostype(stype)
                          for g in range(NUM_DEVS)])
        res = [a + b * LR for a, b in zip(res, [sum(d) for d in data[rep]])]
        for j, key in enumerate(NIGHTLY_KEYS):
            outs = [mx.nd.zeros(NIGHTLY_SHAPES[j], mx.cpu(g)) for g in range(NUM_DEVS)]
            kv.pull(key, out=outs)
            _close(outs, res[j])


@pytest.mark.parametrize('kind', NIGHTLY_KINDS)
@pytest.mark.parametrize('stype', ['default', 'row_sparse'])
def test_test_optimizer_key_groups(mx, kind, stype):
    data = _nightly_data()
    kv = mx.kv.create(kind)
    kv.set_optimizer(mx.optimizer.create('test', rescale_grad=LR))
    kv.init(NIGHTLY_KEYS, [mx.nd.zeros(s) for s in NIGHTLY_SHAPES])
    res = [np.zeros(s) for s in NIGHTLY_SHAPES]
    outs = [[mx.nd.zeros(s, mx.cpu(g)) for g in range(NUM_DEVS)] for s in NIGHTLY_SHAPES]
    for rep in range(NREPEAT):
        kv.push(NIGHTLY_KEYS, [[mx.nd.array(data[rep][j][g], mx.cpu(g)).tostype(stype)
                                for g in range(NUM_DEVS)] for j in range(len(NIGHTLY_KEYS))])
        kv.pull(NIGHTLY_KEYS, out=outs)
        res = [a + b * LR for a, b in zip(res, [sum(d) for d in data[rep]])]
        for expect, row in zip(res, outs):
            _close(row, expect)


def _quantize_2bit(grad, residual, threshold):
    """the dequantized value of MXNet's 2-bit compression, and the new residual"""
    acc = grad + residual
    deq = np.where(acc >= threshold, threshold, np.where(acc <= -threshold, -threshold, 0.0))
    return deq, acc - deq


def test_2bit_compression_with_test_optimizer(mx):
    """nightly test_compress_kvstore: local_allreduce_device, threshold 0.5, Test(rate 2)"""
    threshold, rate, shapes = 0.5, 2, NIGHTLY_SHAPES[:2]
    kv = mx.kv.create('local_allreduce_device')
    kv.set_gradient_compression({'type': '2bit', 'threshold': threshold})
    kv.set_optimizer(mx.optimizer.create('test', rescale_grad=rate))
    keys = NIGHTLY_KEYS[:2]
    for key, shape in zip(keys, shapes):
        kv.init(key, mx.nd.zeros(shape))
    kv.init(9, mx.nd.ones(shapes[0]))              # init is never compressed
    random_keys = [13, 15]
    for key, shape in zip(random_keys, shapes):
        kv.init(key, mx.nd.zeros(shape))

    def pull(key, shape, fill=mx.nd.zeros):
        outs = [fill(shape, mx.cpu(g)) for g in range(NUM_DEVS)]
        kv.pull(key, out=outs)
        return outs

    for out in pull(9, shapes[0]):
        np.testing.assert_array_equal(out.asnumpy(), np.ones(shapes[0], np.float32))
    for key, shape in zip(keys, shapes):
        for out in pull(key, shape, mx.nd.ones):
            check_diff_to_scalar(out, 0)
        kv.push(key, [mx.nd.zeros(shape, mx.cpu(g)) for g in range(NUM_DEVS)])
        for out in pull(key, shape, mx.nd.ones):
            check_diff_to_scalar(out, 0)
    # residuals: 0.4 stays below the threshold; 0.4 + 0.2 crosses it
    for key, shape in zip(keys, shapes):
        curval = 0.0
        for push, crossed in ((0.4, False), (threshold - 0.3, True), (0.2, False),
                              (threshold - 0.3, True)):
            kv.push(key, [mx.nd.ones(shape, mx.cpu(g)) * push for g in range(NUM_DEVS)])
            if crossed:
                curval += threshold * rate * NUM_DEVS
            for out in pull(key, shape):
                check_diff_to_scalar(out, curval)
        for _ in range(NREPEAT):
            curval += rate * NUM_DEVS * -threshold
            kv.push(key, [mx.nd.ones(shape, mx.cpu(g)) * -threshold for g in range(NUM_DEVS)])
            for out in pull(key, shape, mx.nd.ones):
                check_diff_to_scalar(out, curval)
    # random gradients against a numpy model of the quantizer
    for key, shape in zip(random_keys, shapes):
        before = pull(key, shape)
        grads = [mx.nd.random_uniform(-0.6, 0.6, shape=shape, ctx=mx.cpu(g))
                 for g in range(NUM_DEVS)]
        grads_copy = copy.deepcopy(grads)
        kv.push(key, grads)
        after = pull(key, shape)
        expect = np.zeros(shape)
        for grad in grads_copy:
            deq, _ = _quantize_2bit(grad.asnumpy(), np.zeros(shape), threshold)
            expect += deq * rate
        for new, old in zip(after, before):
            np.testing.assert_allclose((new - old).asnumpy(), expect, rtol=1e-5, atol=1e-6)


# === gpu/test_kvstore_gpu.py (its CPU-context parts) ====================================
def _check_rsp_pull(mx, kv, ctxs, sparse_pull, same_rowid=False, use_slice=False):
    rows = SHAPE[0]
    count = len(ctxs)
    vals = [mx.nd.sparse.zeros(shape=SHAPE, ctx=ctx, stype='row_sparse') for ctx in ctxs]
    if same_rowid:
        row_ids = [mx.nd.array(np.random.randint(rows, size=rows))] * count
    elif use_slice:
        total = mx.nd.array(np.random.randint(rows, size=count * rows))
        row_ids = [total[i * rows:(i + 1) * rows] for i in range(count)]
    else:
        row_ids = [mx.nd.array(np.random.randint(rows, size=rows)) for _ in range(count)]
    kv.row_sparse_pull('e', out=vals[0] if count == 1 else vals,
                       row_ids=row_ids[0] if (count == 1 or same_rowid) else row_ids)
    for val, ids in zip(vals, row_ids):
        got = val.asnumpy()
        wanted = set(ids.asnumpy().astype(int).tolist())
        for row in range(rows):
            np.testing.assert_array_equal(got[row], np.full(SHAPE[1], 2.0 if row in wanted
                                                            else 0.0, np.float32))
    if sparse_pull:
        kv.pull('e', out=vals[0] if count == 1 else vals, ignore_sparse=False)
        for val in vals:
            np.testing.assert_array_equal(val.asnumpy(), np.full(SHAPE, 2.0, np.float32))


@pytest.mark.parametrize('kind', ['local', 'device'])
@pytest.mark.parametrize('sparse_pull', [True, False])
def test_rsp_push_pull(mx, kind, sparse_pull):
    kv = mx.kv.create(kind)
    kv.init('a', mx.nd.zeros(SHAPE, stype='row_sparse'))
    kv.init(STR_KEYS, [mx.nd.zeros(shape=SHAPE, stype='row_sparse')] * len(STR_KEYS))
    kv.init('e', mx.nd.ones(SHAPE).tostype('row_sparse'))
    kv.push('e', [mx.nd.ones(SHAPE, ctx=mx.cpu(i)).tostype('row_sparse') for i in range(2)])
    four = [mx.cpu(i) for i in range(4)]
    _check_rsp_pull(mx, kv, [mx.cpu(0)], sparse_pull)
    _check_rsp_pull(mx, kv, four, sparse_pull)
    _check_rsp_pull(mx, kv, four, sparse_pull, same_rowid=True)
    _check_rsp_pull(mx, kv, four, sparse_pull, use_slice=True)


def test_row_sparse_pull_single_device(mx):
    kv = mx.kv.create('device')
    copy = mx.nd.random_normal(shape=(4, 4))
    grad = copy.tostype('row_sparse')
    kv.init(0, grad)
    idx = grad.indices
    kv.push(0, grad)
    kv.row_sparse_pull(0, out=grad, row_ids=idx)
    np.testing.assert_array_equal(grad.asnumpy(), copy.asnumpy())


def test_rsp_push_pull_large_rowid(mx):
    rows = 793470
    val = mx.nd.ones((rows, 1)).tostype('row_sparse')
    kv = mx.kv.create('device')
    kv.init('a', val)
    out = mx.nd.zeros((rows, 1), stype='row_sparse')
    kv.push('a', val)
    kv.row_sparse_pull('a', out=out, row_ids=mx.nd.arange(0, rows, dtype='int64'))
    assert out.indices.shape[0] == rows


ARANGE = [((5,), {}), ((1, 4, 0.5), {}), ((0, 5), {'dtype': 'int64'}), ((3,), {'repeat': 2}),
          ((2.5,), {}), ((0.1, 0.4, 0.1), {}), ((5, 1, -1), {}),
          ((0, 1, 0.1), {'dtype': 'float64'}), ((1e8, 1e8 + 10), {}),
          ((-3, 3, 1.5), {'dtype': 'int32'}), ((0, 7, 2), {'dtype': 'uint8'}),
          ((0, 1, 1e-3), {}), ((5, 1), {}), ((0, 5, 0), {}), ((0, 3), {'ctx': 'cpu1'})]


@pytest.mark.parametrize('case', range(len(ARANGE)))
def test_arange_matches_mxnet(both, case):
    """mx.nd.arange (used by the test above): MXNet's length rule and element formula"""
    args, kwargs = ARANGE[case]

    def run(mod):
        kw = dict(kwargs)
        if kw.get('ctx') == 'cpu1':
            kw['ctx'] = mod.cpu(1)
        try:
            res = mod.nd.arange(*args, **kw)
            arr = res.asnumpy()
        except mod.base.MXNetError:
            return 'MXNetError'
        return (arr.dtype.str, arr.shape, arr.tobytes(), str(res.context))

    mxnet, mxkv = both
    assert run(mxnet) == run(mxkv)
