"""2-bit gradient compression (MXNet 1.9.1's 2-bit scheme: src/kvstore/gradient_compression.cc).

Differential: the same push/pull sequences on a compressed ``device`` store run with
``mx = mxnet`` (real MXNet 1.9.1) and ``mx = mxkv`` and must give identical bits.  The
observed vectors in tests/vectors/compression are reproduced too, and the bad input MXNet
mishandles (row_sparse or non-float32 values, a device count that changes between pushes)
must raise MXNetError naming the key, or, for the device count, simply work.

MXNet is only run where it is sound: compression is always set before a key's first push
(a key pushed uncompressed from >= 2 devices and then compressed segfaults), and a key keeps
its number of pushed devices.
"""
import ctypes
import json
import os

import numpy as np
import pytest

from conftest import assert_same_bits, REPO

VECTORS = os.path.join(REPO, 'tests', 'vectors', 'compression')


def run_both(both, scenario, *args):
    mxnet, mxkv = both
    expected = scenario(mxnet, *args)
    got = scenario(mxkv, *args)
    assert_same_bits(expected, got, scenario.__name__)
    return got


def _on_real_mxnet(mxkv):
    return 'libmxnet' in os.path.basename(mxkv.base.library_path)


@pytest.fixture
def mxkv_only(mxkv):
    if _on_real_mxnet(mxkv):
        pytest.skip('deliberate deviation from MXNet 1.9.1')
    return mxkv


class Outcomes(object):
    def __init__(self, mx):
        self.errors = (mx.base.MXNetError, AssertionError, Exception)
        self.log = []

    def __call__(self, fn, *args, **kwargs):
        try:
            fn(*args, **kwargs)
            self.log.append('ok')
        except self.errors:
            self.log.append('error')
        return self.log[-1]


# --- gradients -----------------------------------------------------------------------------
def _f32(x):
    return np.float32(x)


def gradients(threshold, n, steps, devices, seed):
    """per step, per device: float32 gradients around +-threshold, with exact ties,
    values one ulp either side of them, zeros, -0.0 and large values"""
    rng = np.random.RandomState(seed)
    t = _f32(threshold)
    special = np.array([t, -t, np.nextafter(t, _f32(0)), -np.nextafter(t, _f32(0)),
                        np.nextafter(t, _f32(10)), t / 2, -t / 2, 0, -0.0, 10 * t, -10 * t,
                        t * _f32(0.999), 3 * t, _f32(1e-8)], dtype=np.float32)
    res = []
    for step in range(steps):
        row = []
        for dev in range(devices):
            g = (rng.uniform(-1.6, 1.6, n) * threshold).astype(np.float32)
            pick = rng.rand(n) < 0.4
            g[pick] = special[rng.randint(0, len(special), pick.sum())]
            if step == 1 and dev == 0:
                g[:] = 0                                   # an all-zero gradient
            row.append(g)
        res.append(row)
    return res


# --- a numpy model of the kernel, for cases MXNet cannot run ----------------------------------
def model_quantize(residual, grad, threshold):
    """one 2-bit step (float32, in place on residual) -> the dequantized array"""
    t = _f32(threshold)
    residual += grad
    out = np.zeros_like(residual)
    pos = residual >= t
    neg = ~pos & (residual <= -t)
    out[pos] = t
    residual[pos] -= t
    out[neg] = -t
    residual[neg] += t
    return out


def model_sum(arrays):
    total = arrays[0].copy()
    for arr in arrays[1:]:
        total = total + arr
    return total


# --- scenarios ------------------------------------------------------------------------------
def compressed_sequence(mx, kind, threshold, devices, updater, n=37, steps=5, order='before'):
    """several pushes of `devices` gradients; pull after each (pull before the first too)"""
    kv = mx.kv.create(kind)
    params = {'type': '2bit', 'threshold': threshold}
    if order == 'before':
        kv.set_gradient_compression(params)
    kv.init(0, mx.nd.array(np.linspace(-1, 1, n)))
    if order == 'after':                             # setting it after init also applies
        kv.set_gradient_compression(params)
    seen = []
    if updater:
        def upd(key, recv, local):
            seen.append(recv.asnumpy())
            local += recv * 2
        kv._set_updater(upd)
    ctxs = [mx.cpu(i) for i in range(devices)]
    outs = [mx.nd.ones((n,), ctx=c) * 9 for c in ctxs]
    kv.pull(0, out=outs)
    res = {'before': [o.asnumpy() for o in outs], 'pulled': []}
    for row in gradients(threshold, n, steps, devices, seed=devices * 10 + int(threshold * 4)):
        kv.push(0, [mx.nd.array(g, ctx=c) for g, c in zip(row, ctxs)])
        kv.pull(0, out=outs)
        res['pulled'].append([o.asnumpy() for o in outs])
    res['recv'] = seen
    return res


def several_keys(mx, str_keys):
    """a list of keys in one push; each key (and each device) keeps its own residual"""
    kv = mx.kv.create('device')
    kv.set_gradient_compression({'type': '2bit', 'threshold': 0.5})
    keys = ['a', 'b', 'c'] if str_keys else [3, 1, 2]
    shapes = [(2, 3), (17,), (4, 4, 2)]
    kv.init(keys, [mx.nd.zeros(s) for s in shapes])
    res = []
    for step in range(4):
        vals = []
        for i, s in enumerate(shapes):
            size = int(np.prod(s))
            g = (np.sin(np.arange(size) * (i + 1) + step) * 0.7).astype(np.float32).reshape(s)
            vals.append([mx.nd.array(g, ctx=mx.cpu(d)) for d in range(2)])
        kv.push(keys, vals)
        outs = [mx.nd.zeros(s) for s in shapes]
        kv.pull(keys, out=outs)
        res.append([o.asnumpy() for o in outs])
    return res


def reset_threshold(mx):
    """a second call replaces the settings (the residuals stay)"""
    kv = mx.kv.create('device')
    kv.set_gradient_compression({'type': '2bit', 'threshold': 0.5})
    kv.init(0, mx.nd.zeros((5,)))
    g = mx.nd.array([0.3, 0.6, -0.7, 1.2, 2.5])
    res = []
    for step in range(5):
        if step == 2:
            kv.set_gradient_compression({'type': '2bit', 'threshold': 2.0})
        if step == 4:
            kv.set_gradient_compression({'type': '2bit'})          # default 0.5
        kv.push(0, g)
        out = mx.nd.zeros((5,))
        kv.pull(0, out=out)
        res.append(out.asnumpy())
    return res


def parameters(mx):
    """which parameter dictionaries are accepted"""
    out = Outcomes(mx)
    kv = mx.kv.create('device')
    for params in ({'type': '2bit'}, {'type': '2bit', 'threshold': 1e-3},
                   {'type': '2bit', 'threshold': ' 0.25'}, {'type': '2bit', 'threshold': '1e-3'},
                   {'type': '2bit', 'threshold': 2, 'unknown_key': 'x'},
                   {},                                            # no type
                   {'threshold': 0.5},
                   {'type': 'foo'}, {'type': '2BIT'}, {'type': 'none'}, {'type': ''},
                   {'type': '2bit', 'threshold': 0}, {'type': '2bit', 'threshold': -1},
                   {'type': '2bit', 'threshold': -0.0},
                   {'type': '2bit', 'threshold': 'abc'}, {'type': '2bit', 'threshold': '0.5x'},
                   {'type': '2bit', 'threshold': ''}):
        out(kv.set_gradient_compression, params)
    for name in ('local', 'local_allreduce_cpu', 'local_update_cpu', 'LOCAL'):
        out(mx.kv.create(name).set_gradient_compression, {'type': '2bit'})  # refused in Python
    for name in ('device', 'local_allreduce_device', 'Device'):
        out(mx.kv.create(name).set_gradient_compression, {'type': '2bit'})
    # the store still works, compressed with the last accepted settings (threshold 2)
    kv.init(0, mx.nd.zeros((3,)))
    kv.push(0, mx.nd.array([1.9, 2.0, -2.5]))
    res = mx.nd.zeros((3,))
    kv.pull(0, out=res)
    return {'outcomes': out.log, 'after': res.asnumpy()}


def local_store_c_api(mx):
    """through the C API a local store accepts the settings and does not compress"""
    kv = mx.kv.create('local')
    keys = (ctypes.c_char_p * 2)(b'type', b'threshold')
    vals = (ctypes.c_char_p * 2)(b'2bit', b'0.5')
    rc = mx.base._LIB.MXKVStoreSetGradientCompression(kv.handle, ctypes.c_uint(2), keys, vals)
    kv.init(0, mx.nd.zeros((4,)))
    kv.push(0, [mx.nd.array([0.3, 0.6, -0.7, 1.2], ctx=mx.cpu(i)) for i in range(2)])
    out = mx.nd.zeros((4,))
    kv.pull(0, out=out)
    return {'rc': rc, 'out': out.asnumpy()}


def pushpull_compressed(mx):
    """local/device PushPull on a compressed device store"""
    kv = mx.kv.create('device')
    kv.set_gradient_compression({'type': '2bit', 'threshold': 0.5})
    kv.init(0, mx.nd.zeros((4,)))
    res = []
    for _ in range(3):
        out = mx.nd.zeros((4,))
        kv.pushpull(0, [mx.nd.array([0.3, 0.6, -0.7, 1.2], ctx=mx.cpu(i)) for i in range(2)],
                    out=out)
        res.append(out.asnumpy())
    return res


def row_sparse_key_unaffected(mx):
    """a compressed device store still inits row_sparse keys and serves row_sparse_pull"""
    kv = mx.kv.create('device')
    kv.set_gradient_compression({'type': '2bit', 'threshold': 0.5})
    kv.init('emb', mx.nd.sparse.row_sparse_array(([[0.3, 0.7], [-0.2, 1.2]], [1, 4]),
                                                 shape=(6, 2)))
    out = mx.nd.sparse.zeros('row_sparse', (6, 2))
    kv.row_sparse_pull('emb', out=out, row_ids=mx.nd.array([4, 0, 1]))
    dense = mx.nd.zeros((6, 2))
    kv.pull('emb', out=dense)
    return [out.indices.asnumpy(), out.data.asnumpy(), dense.asnumpy()]


# --- tests ------------------------------------------------------------------------------------
@pytest.mark.parametrize('updater', [False, True])
@pytest.mark.parametrize('devices', [1, 2, 3])
@pytest.mark.parametrize('threshold', [0.5, 2.0])
def test_sequences(both, threshold, devices, updater):
    run_both(both, compressed_sequence, 'device', threshold, devices, updater)


@pytest.mark.parametrize('kind', ['local_allreduce_device', 'device_sync'])
def test_sequences_other_device_names(both, kind):
    run_both(both, compressed_sequence, kind, 0.5, 2, False)


@pytest.mark.parametrize('devices', [1, 2])
def test_set_after_init(both, devices):
    run_both(both, compressed_sequence, 'device', 0.5, devices, False, 37, 4, 'after')


@pytest.mark.parametrize('n', [1, 15, 16, 17, 33, 1000])
def test_sizes(both, n):
    run_both(both, compressed_sequence, 'device', 0.5, 2, False, n, 3)


@pytest.mark.parametrize('str_keys', [False, True])
def test_several_keys(both, str_keys):
    run_both(both, several_keys, str_keys)


def test_reset_threshold(both):
    run_both(both, reset_threshold)


def test_parameters(both):
    res = run_both(both, parameters)
    assert res['outcomes'][:5] == ['ok'] * 5 and res['outcomes'][5:17] == ['error'] * 12


def test_local_store_does_not_compress(both):
    res = run_both(both, local_store_c_api)
    assert res['rc'] == 0


def test_pushpull(both):
    run_both(both, pushpull_compressed)


def test_row_sparse_key_unaffected(both):
    run_both(both, row_sparse_key_unaffected)


# --- the observed vectors -------------------------------------------------------------------
def _load(name):
    path = os.path.join(VECTORS, name)
    with open(path) as fin:
        return json.load(fin)


def _device_sequence_ids():
    try:
        return [s['name'] for s in _load('device_store_sequences.json')['sequences']]
    except BaseException:  # pylint: disable=broad-except
        return []


@pytest.mark.parametrize('name', _device_sequence_ids())
def test_vectors_device_store(mxkv, name):
    seq = [s for s in _load('device_store_sequences.json')['sequences'] if s['name'] == name][0]
    mx = mxkv
    kv = mx.kv.create(seq['store'])
    kv.set_gradient_compression({'type': '2bit', 'threshold': seq['threshold']})
    kv.init(0, mx.nd.array(seq['init']))
    if seq['updater'] == 'stored += recv':
        kv._set_updater(lambda key, recv, local: local.__iadd__(recv))
    else:
        assert seq['updater'] is None
    for pushes, expected in zip(seq['pushes'], seq['pulled_after_each_push']):
        kv.push(0, [mx.nd.array(g, ctx=mx.cpu(d)) for d, g in enumerate(pushes)])
        out = mx.nd.zeros((len(seq['init']),))
        kv.pull(0, out=out)
        assert_same_bits(np.array(expected, dtype=np.float32), out.asnumpy(), name)


def _kernel_case_ids():
    try:
        return [c['name'] for c in _load('quantize_kernel.json')['cases']]
    except BaseException:  # pylint: disable=broad-except
        return []


@pytest.mark.parametrize('name', _kernel_case_ids())
def test_vectors_kernel_through_one_device(mxkv, name):
    """each kernel step's dequantized array is what a 1-device store returns"""
    case = [c for c in _load('quantize_kernel.json')['cases'] if c['name'] == name][0]
    mx = mxkv
    kv = mx.kv.create('device')
    kv.set_gradient_compression({'type': '2bit', 'threshold': repr(case['threshold'])})
    kv.init(0, mx.nd.zeros((case['n'],)))
    for step in case['steps']:
        grad = np.array([float(x) for x in step['grad']], dtype=np.float32)
        kv.push(0, mx.nd.array(grad))
        out = mx.nd.zeros((case['n'],))
        kv.pull(0, out=out)
        expected = np.array([float(x) for x in step['dequantized']], dtype=np.float32)
        assert_same_bits(expected, out.asnumpy(), name)


def test_model_matches_mxnet(mxnet):
    """the numpy model used below reproduces MXNet (so it may stand in for it)"""
    got = compressed_sequence(mxnet, 'device', 0.5, 3, False)
    grads = gradients(0.5, 37, 5, 3, seed=3 * 10 + 2)
    residuals = [np.zeros(37, np.float32) for _ in range(3)]
    for row, pulled in zip(grads, got['pulled']):
        expected = model_sum([model_quantize(r, g, 0.5) for r, g in zip(residuals, row)])
        assert_same_bits(expected, pulled[0])


# --- bad input: libmxkv raises naming the key (MXNet corrupts or fails later) ----------------
def _raises_naming(mx, key, fn, *args, **kwargs):
    with pytest.raises(mx.base.MXNetError) as info:
        fn(*args, **kwargs)
    msg = str(info.value)
    assert repr(key) in msg or ('key %s' % key) in msg, msg
    return msg


def _compressed_store(mx, key, value):
    kv = mx.kv.create('device')
    kv.set_gradient_compression({'type': '2bit', 'threshold': 0.5})
    kv.init(key, value)
    return kv


@pytest.mark.parametrize('nvals', [1, 2])
def test_row_sparse_push_rejected(mxkv_only, nvals):
    """MXNet reads the rows as if dense, drops the indices and makes the key dense"""
    mx = mxkv_only
    kv = _compressed_store(mx, 'emb', mx.nd.ones((4, 2)).tostype('row_sparse'))
    vals = [mx.nd.sparse.row_sparse_array(([[0.7, -0.7], [0.6, 0.6]], [2, 3]), shape=(4, 2),
                                          ctx=mx.cpu(i)) for i in range(nvals)]
    msg = _raises_naming(mx, 'emb', kv.push, 'emb', vals)
    assert 'row_sparse' in msg or 'row sparse' in msg, msg
    out = mx.nd.sparse.zeros('row_sparse', (4, 2))
    kv.row_sparse_pull('emb', out=out, row_ids=mx.nd.array([0, 1, 2, 3]))
    assert out.indices.asnumpy().tolist() == [0, 1, 2, 3]
    assert (out.data.asnumpy() == 1).all()       # unchanged
    # a dense key pushed a row_sparse value, and a mix
    kv.init('w', mx.nd.zeros((4, 2)))
    _raises_naming(mx, 'w', kv.push, 'w', [mx.nd.zeros((4, 2)), vals[0]])


@pytest.mark.parametrize('dtype', ['float16', 'float64', 'int32', 'uint8'])
def test_non_float32_push_rejected(mxkv_only, dtype):
    """MXNet fails asynchronously at the next wait and keeps the stored value"""
    mx = mxkv_only
    kv = _compressed_store(mx, 7, mx.nd.ones((3,), dtype=dtype))
    msg = _raises_naming(mx, 7, kv.push, 7, mx.nd.array([0.7, 0.1, -0.6], dtype=dtype))
    assert 'float32' in msg, msg
    _raises_naming(mx, 7, kv.push, 7, [mx.nd.array([1, 1, 1], dtype=dtype, ctx=mx.cpu(i))
                                       for i in range(2)])
    out = mx.nd.zeros((3,), dtype=dtype)
    kv.pull(7, out=out)
    assert (out.asnumpy() == 1).all()
    # a float32 store pushed values of another dtype
    kv.init(8, mx.nd.zeros((3,)))
    _raises_naming(mx, 8, kv.push, 8, mx.nd.array([0.7, 0.1, -0.6], dtype=dtype))


@pytest.mark.parametrize('counts', [(2, 3), (3, 2), (1, 2, 1), (3, 1, 3, 2)])
def test_device_count_may_change(mxkv_only, counts):
    """MXNet segfaults when a key's number of pushed devices changes between compressed
    pushes; libmxkv keeps a residual per device slot and just carries on"""
    mx = mxkv_only
    t = 0.5
    kv = _compressed_store(mx, 0, mx.nd.zeros((20,)))
    residuals = {}
    for step, count in enumerate(counts):
        grads = gradients(t, 20, 1, count, seed=step)[0]
        kv.push(0, [mx.nd.array(g, ctx=mx.cpu(d)) for d, g in enumerate(grads)])
        out = mx.nd.zeros((20,))
        kv.pull(0, out=out)
        deq = [model_quantize(residuals.setdefault(d, np.zeros(20, np.float32)), g, t)
               for d, g in enumerate(grads)]
        assert_same_bits(model_sum(deq), out.asnumpy(), 'step %d' % step)


def test_pushpull_row_sparse_rejected(mxkv_only):
    mx = mxkv_only
    kv = _compressed_store(mx, 2, mx.nd.ones((4, 2)).tostype('row_sparse'))
    _raises_naming(mx, 2, kv.pushpull, 2,
                   mx.nd.sparse.row_sparse_array(([[1, 1]], [1]), shape=(4, 2)))
