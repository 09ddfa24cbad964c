"""Differential suite: each scenario runs once with ``mx = mxnet`` (real MXNet 1.9.1)
and once with ``mx = mxkv``; the results must be identical bit for bit.

The scenarios restate MXNet's tests/python/unittest/test_kvstore.py (dense
parts) in our own words, plus a few more corners of the local store.
"""
import numpy as np
import pytest

from conftest import assert_same_bits

SHAPE = (4, 4)
KEYS = [5, 7, 11]
STR_KEYS = ['b', 'c', 'd']


def run_both(both, scenario, *args):
    mxnet, mxkv = both
    expected = scenario(mxnet, *args)
    got = scenario(mxkv, *args)
    assert_same_bits(expected, got, scenario.__name__)
    return got


def _store(mx, kind='local', str_keys=False):
    kv = mx.kv.create(kind)
    if str_keys:
        kv.init('a', mx.nd.zeros(SHAPE))
        kv.init(STR_KEYS, [mx.nd.zeros(SHAPE)] * len(STR_KEYS))
    else:
        kv.init(3, mx.nd.zeros(SHAPE))
        kv.init(KEYS, [mx.nd.zeros(SHAPE)] * len(KEYS))
    return kv


# --- scenarios -------------------------------------------------------------------
def single_pair(mx, str_keys):
    kv = _store(mx, str_keys=str_keys)
    key = 'a' if str_keys else 3
    kv.push(key, mx.nd.ones(SHAPE))
    out = mx.nd.empty(SHAPE)
    kv.pull(key, out=out)
    return out.asnumpy()


def init_then_pull(mx, key):
    kv = mx.kv.create()
    kv.init(key, mx.nd.ones(SHAPE) * 4)
    out = mx.nd.zeros(SHAPE)
    kv.pull(key, out=out)
    return out.asnumpy()


def pull_into_many(mx, kind):
    kv = mx.kv.create(kind)
    src = mx.nd.ones(SHAPE)
    kv.init('1', mx.nd.zeros(SHAPE))
    kv.push('1', [src, src, src, src])
    outs = [mx.nd.ones(SHAPE) for _ in range(4)]
    kv.pull('1', outs)
    kv.init('2', mx.nd.zeros(SHAPE))
    kv.pull('2', outs)
    return [o.asnumpy() for o in outs]


def list_pairs(mx, str_keys):
    kv = _store(mx, str_keys=str_keys)
    keys = STR_KEYS if str_keys else KEYS
    kv.push(keys, [mx.nd.ones(SHAPE) * 4] * len(keys))
    outs = [mx.nd.empty(SHAPE) for _ in keys]
    kv.pull(keys, out=outs)
    return [o.asnumpy() for o in outs]


def aggregation(mx, str_keys, kind):
    kv = _store(mx, kind, str_keys)
    key, keys = ('a', STR_KEYS) if str_keys else (3, KEYS)
    devs = [mx.Context('cpu', i) for i in range(4)]
    vals = [mx.nd.ones(SHAPE, d) for d in devs]
    outs = [mx.nd.empty(SHAPE, d) for d in devs]
    kv.push(key, vals)
    kv.pull(key, out=outs)
    res = [o.asnumpy() for o in outs]
    vals = [[mx.nd.ones(SHAPE, d) * 2.0 for d in devs]] * len(keys)
    outs = [[mx.nd.empty(SHAPE, d) for d in devs] for _ in keys]
    kv.push(keys, vals)
    kv.pull(keys, out=outs)
    res += [o.asnumpy() for row in outs for o in row]
    return res


def float_sum_order(mx, kind):
    """sums whose float32 result depends on the reduction order"""
    # one key per list: MXNet 1.9.1's local store sizes a key's copy buffers on its
    # first multi-value push and overruns them if a later push has more values
    kv = mx.kv.create(kind)
    res = []
    for key, values in enumerate(([1.0, 1e8, -1e8], [1e8, 1.0, 1.0, -1e8, 1.0], [0.1] * 7,
                                  [3.0, 1e-8, 1e-8, 1e-8, 1e-8, 1e-8, -3.0])):
        kv.init(key, mx.nd.zeros((1,)))
        vals = [mx.nd.array([v], ctx=mx.cpu(i)) for i, v in enumerate(values)]
        kv.push(key, vals)
        out = mx.nd.zeros((1,))
        kv.pull(key, out=out)
        res.append(out.asnumpy())
    return res


def updater_int_and_str(mx, str_keys, kind):
    seen = []

    def upd(key, recv, local):
        if isinstance(key, bytes):
            key = key.decode()
        seen.append(key)
        local += recv

    kv = _store(mx, kind, str_keys)
    kv._set_updater(upd)
    key, keys = ('a', STR_KEYS) if str_keys else (3, KEYS)
    devs = [mx.cpu(i) for i in range(4)]
    kv.push(key, [mx.nd.ones(SHAPE, d) for d in devs])
    outs = [mx.nd.empty(SHAPE, d) for d in devs]
    kv.pull(key, out=outs)
    res = [o.asnumpy() for o in outs]
    vals = [[mx.nd.ones(SHAPE, d) for d in devs]] * len(keys)
    for _ in range(4):
        kv.push(keys, vals)
    outs = [[mx.nd.empty(SHAPE, d) for d in devs] for _ in keys]
    kv.pull(keys, out=outs)
    res += [o.asnumpy() for row in outs for o in row]
    return {'values': res, 'keys': [str(k) for k in seen]}


def updater_arguments(mx):
    """what an updater is given: key type, shapes, dtypes, contexts, and in-place effect"""
    info = []

    def upd(key, recv, local):
        info.append((type(key).__name__, recv.shape, np.dtype(recv.dtype).name,
                     str(recv.context), local.shape, str(local.context)))
        local[:] = local * 0.5 + recv * 3

    kv = mx.kv.create('local')
    kv.init(9, mx.nd.array([[1, 2], [3, 4]]))
    kv._set_updater(upd)
    kv.push(9, mx.nd.array([[1, 1], [2, 2]]))
    kv.push(9, [mx.nd.ones((2, 2), mx.cpu(1)), mx.nd.ones((2, 2), mx.cpu(2))])
    out = mx.nd.zeros((2, 2))
    kv.pull(9, out=out)
    return {'out': out.asnumpy(), 'info': [repr(i) for i in info]}


def str_updater_key_type(mx):
    got = []
    kv = mx.kv.create()
    kv.init('w', mx.nd.ones((2,)))
    kv._set_updater(lambda k, r, l: got.append(repr(k)))
    kv.push('w', mx.nd.ones((2,)))
    return got


def get_type(mx, name):
    return mx.kv.create(name).type


def rank_and_workers(mx):
    kv = mx.kv.create('local')
    kv._barrier()
    kv._send_command_to_servers(0, 'hello')
    return [kv.rank, kv.num_workers, kv.is_capable('optimizer')]


def pushpull_and_broadcast(mx, str_keys):
    kv = mx.kv.create()
    k = ['x', 'y'] if str_keys else [1, 2]
    a = mx.nd.ones((3,)) * 2
    outs = [mx.nd.zeros((3,)), mx.nd.zeros((3,))]
    kv.broadcast(k[0], a, out=outs)
    res = [o.asnumpy() for o in outs]
    kv.init(k[1], mx.nd.zeros((2, 2)))
    vals = [mx.nd.array([[1, 2], [3, 4]]), mx.nd.array([[10, 20], [30, 40]])]
    kv.pushpull(k[1], vals)            # out omitted: written back into vals
    res += [v.asnumpy() for v in vals]
    out = mx.nd.zeros((2, 2))
    kv.pushpull(k[1], mx.nd.ones((2, 2)) * 7, out=out)
    res.append(out.asnumpy())
    return res


def pull_dtype_conversion(mx):
    kv = mx.kv.create()
    kv.init(4, mx.nd.array([1.7, -2.7, 3.5]))
    res = []
    for dt in ('float64', 'float16', 'int32', 'int64', 'uint8'):
        out = mx.nd.zeros((3,), dtype=dt)
        kv.pull(4, out=out)
        res.append(out.asnumpy())
    return res


def dtypes_roundtrip(mx):
    res = []
    for dt in ('float32', 'float64', 'float16', 'int32', 'int64', 'int8', 'uint8'):
        kv = mx.kv.create()
        kv.init(1, mx.nd.array([1, 2, 3], dtype=dt))
        kv.push(1, [mx.nd.array([1, 1, 1], dtype=dt, ctx=mx.cpu(i)) for i in range(3)])
        out = mx.nd.zeros((3,), dtype=dt)
        kv.pull(1, out=out)
        res.append(out.asnumpy())
    return res


def ndarray_basics(mx):
    a = mx.nd.array([[1.5, -2.25, 3.0], [0.1, 0.2, 0.3]])
    b = mx.nd.ones((2, 3)) * 0.7
    c = a + b
    c += 1
    d = (a * 3.3 - b / 7.1) * a
    e = 2.5 - a
    f = 1.0 / (b + 0.1)
    g = a.copy()
    g[:] = 0.1
    h = mx.nd.zeros((2, 3), dtype='float64')
    h[:] = 0.1
    i = mx.nd.full((2, 2), 0.3)
    j = a.astype('int32')
    k = -a
    return [x.asnumpy() for x in (a, b, c, d, e, f, g, h, i, j, k)] + \
        [repr(a), repr(mx.nd.zeros((2,), ctx=mx.cpu(3))), str(a.shape), str(a.context),
         np.dtype(j.dtype).name, a.stype, str(a.size)]


def save_load(mx, tmp_path):
    fname = str(tmp_path / ('arrs_%s.params' % mx.__name__))
    mx.nd.save(fname, {'w': mx.nd.array([[1, 2, 3], [4, 5, 6]]),
                       'bias': mx.nd.array([7], dtype='int64')})
    loaded = mx.nd.load(fname)
    fname2 = str(tmp_path / ('list_%s.params' % mx.__name__))
    mx.nd.save(fname2, [mx.nd.ones((2,)), mx.nd.zeros((1, 1), dtype='float64')])
    with open(fname, 'rb') as fin:
        raw = fin.read()
    return {'dict': {k: v.asnumpy() for k, v in loaded.items()},
            'list': [v.asnumpy() for v in mx.nd.load(fname2)], 'bytes': raw}


# --- tests -------------------------------------------------------------------------
@pytest.mark.parametrize('str_keys', [False, True])
def test_single_kv_pair(both, str_keys):
    run_both(both, single_pair, str_keys)


@pytest.mark.parametrize('key', [3, 'a', -1, 0, 2 ** 31 - 1, '', 'a long key name'])
def test_init(both, key):
    run_both(both, init_then_pull, key)


@pytest.mark.parametrize('kind', ['local', 'device'])
def test_pull(both, kind):
    run_both(both, pull_into_many, kind)


@pytest.mark.parametrize('str_keys', [False, True])
def test_list_kv_pair(both, str_keys):
    run_both(both, list_pairs, str_keys)


@pytest.mark.parametrize('kind', ['local', 'device'])
@pytest.mark.parametrize('str_keys', [False, True])
def test_aggregator(both, str_keys, kind):
    run_both(both, aggregation, str_keys, kind)


@pytest.mark.parametrize('kind', ['local', 'device'])
def test_sum_order(both, kind):
    run_both(both, float_sum_order, kind)


@pytest.mark.parametrize('kind', ['local', 'device'])
@pytest.mark.parametrize('str_keys', [False, True])
def test_updater(both, str_keys, kind):
    run_both(both, updater_int_and_str, str_keys, kind)


def test_updater_arguments(both):
    run_both(both, updater_arguments)


def test_str_updater_gets_bytes(both):
    assert run_both(both, str_updater_key_type) == ["b'w'"]


@pytest.mark.parametrize('name', ['local', 'local_allreduce_cpu', 'local_update_cpu',
                                  'local_allreduce_device', 'device', 'LOCAL', 'Device_Sync'])
def test_get_type(both, name):
    run_both(both, get_type, name)


def test_rank_and_workers(both):
    run_both(both, rank_and_workers)


@pytest.mark.parametrize('str_keys', [False, True])
def test_pushpull_broadcast(both, str_keys):
    run_both(both, pushpull_and_broadcast, str_keys)


def test_pull_dtype_conversion(both):
    run_both(both, pull_dtype_conversion)


def test_dtypes(both):
    run_both(both, dtypes_roundtrip)


def test_ndarray_basics(both):
    run_both(both, ndarray_basics)


def test_save_load(both, tmp_path):
    run_both(both, save_load, tmp_path)


def invalid_use(mx):
    """each bad call raises MXNetError (or an AssertionError in MXNet's Python layer)"""
    outcomes = []
    errors = (mx.base.MXNetError, AssertionError, Exception)  # MXNet raises a bare Exception
    #                                                             for compression on local

    def attempt(fn, *args, **kwargs):
        try:
            fn(*args, **kwargs)
            outcomes.append('ok')
        except errors:
            outcomes.append('error')

    kv = mx.kv.create()
    kv.init(3, mx.nd.zeros(SHAPE))
    attempt(kv.init, 3, mx.nd.zeros(SHAPE))                # duplicate init
    attempt(kv.pull, 99, out=mx.nd.zeros(SHAPE))           # uninitialised key
    attempt(kv.pull, 3, out=mx.nd.zeros((2, 2)))           # wrong out shape
    attempt(kv.init, 'a', mx.nd.zeros(SHAPE))              # str key on an int store
    attempt(kv.push, 'a', mx.nd.zeros(SHAPE))
    attempt(kv.pull, 'a', out=mx.nd.zeros(SHAPE))
    attempt(kv.pull, [3, 3], out=[mx.nd.zeros(SHAPE)])     # out list of wrong length
    attempt(kv.push, [3, 'a'], [mx.nd.zeros(SHAPE)] * 2)   # mixed key types in one call
    skv = mx.kv.create()
    skv.init('w', mx.nd.zeros(SHAPE))
    attempt(skv.init, 1, mx.nd.zeros(SHAPE))               # int key on a str store
    attempt(skv.pull, 'nope', out=mx.nd.zeros(SHAPE))      # unknown str key
    attempt(skv.push, 'nope', mx.nd.zeros(SHAPE))
    attempt(kv.set_gradient_compression, {'type': '2bit'})  # local store refuses
    out = mx.nd.zeros(SHAPE)
    kv.pull(3, out=out)
    return {'outcomes': outcomes, 'store': out.asnumpy()}


def test_invalid_use(both):
    res = run_both(both, invalid_use)
    assert 'ok' not in res['outcomes']
