"""Bad calls raise mxkv.base.MXNetError naming the key; nothing crashes the interpreter."""
import gc
import os

import numpy as np
import pytest


@pytest.fixture
def kv(mxkv):
    store = mxkv.kv.create('local')
    store.init(3, mxkv.nd.zeros((2, 3)))
    yield store
    store.close()


def _raises(mxkv, fn, *args, match=None, **kwargs):
    with pytest.raises(mxkv.base.MXNetError) as info:
        fn(*args, **kwargs)
    if match is not None:
        assert match in str(info.value), str(info.value)
    return str(info.value)


def _on_real_mxnet(mxkv):
    return 'libmxnet' in os.path.basename(mxkv.base.library_path)


def test_uninitialised_key(mxkv, kv):
    msg = _raises(mxkv, kv.pull, 99, out=mxkv.nd.zeros((2, 3)))
    assert '99' in msg


def test_push_many_values_to_uninitialised_key(mxkv, kv):
    if _on_real_mxnet(mxkv):
        pytest.skip('MXNet 1.9.1 segfaults here (spec section 14, item 2); libmxkv must not')
    _raises(mxkv, kv.push, 98, [mxkv.nd.ones((2, 3)), mxkv.nd.ones((2, 3))], match='98')


def test_wrong_shapes(mxkv, kv):
    _raises(mxkv, kv.pull, 3, out=mxkv.nd.zeros((3, 2)), match='3')
    _raises(mxkv, kv.push, 3, [mxkv.nd.ones((2, 2)), mxkv.nd.ones((2, 2))], match='3')


def test_duplicate_init(mxkv, kv):
    _raises(mxkv, kv.init, 3, mxkv.nd.zeros((2, 3)), match='3')


def test_mixed_key_types(mxkv, kv):
    _raises(mxkv, kv.push, [3, 'x'], [mxkv.nd.ones((2, 3))] * 2, match="'x'")
    _raises(mxkv, kv.init, 'w', mxkv.nd.ones((2, 3)), match='w')
    _raises(mxkv, kv.pull, 'w', out=mxkv.nd.ones((2, 3)), match='w')


def test_out_list_of_wrong_length(mxkv, kv):
    _raises(mxkv, kv.pull, [3, 3], out=[mxkv.nd.zeros((2, 3))], match='[3, 3]')
    _raises(mxkv, kv.push, [3], [mxkv.nd.zeros((2, 3))] * 2, match='[3]')


def test_bad_key_and_value_types(mxkv, kv):
    _raises(mxkv, kv.push, 3.5, mxkv.nd.ones((2, 3)), match='3.5')
    _raises(mxkv, kv.push, 3, np.ones((2, 3)), match='key 3')
    _raises(mxkv, kv.pull, 3, out=None, match='3')
    _raises(mxkv, kv.init, 2 ** 40, mxkv.nd.ones((1,)), match=str(2 ** 40))


def test_closed_store(mxkv):
    store = mxkv.kv.create()
    store.init('k', mxkv.nd.ones((2,)))
    store.close()
    store.close()  # idempotent
    _raises(mxkv, store.pull, 'k', out=mxkv.nd.zeros((2,)), match="'k'")
    _raises(mxkv, store.push, 'k', mxkv.nd.zeros((2,)), match='closed')
    with mxkv.kv.create() as other:
        other.init(1, mxkv.nd.ones((1,)))
    assert other.handle is None


def test_closed_ndarray(mxkv, kv):
    arr = mxkv.nd.ones((2, 3))
    arr.close()
    _raises(mxkv, kv.push, 3, arr, match='closed')
    _raises(mxkv, arr.asnumpy, match='closed')


def test_updater_exception_is_reraised(mxkv, kv):
    def bad(key, recv, local):
        raise KeyError('boom %d' % key)
    kv._set_updater(bad)
    with pytest.raises(KeyError, match='boom 3'):
        kv.push(3, mxkv.nd.ones((2, 3)))
    kv._set_updater(lambda k, r, l: l.__iadd__(r))
    kv.push(3, mxkv.nd.ones((2, 3)))
    out = mxkv.nd.zeros((2, 3))
    kv.pull(3, out=out)
    assert (out.asnumpy() == 1).all()


def test_gradient_compression_refused_on_local(mxkv, kv):
    _raises(mxkv, kv.set_gradient_compression, {'type': '2bit'}, match='not supported')


def test_updater_handles_are_freed(mxkv, kv):
    kept = []
    kv._set_updater(lambda k, r, l: kept.append((r, l)))
    kv.push(3, mxkv.nd.ones((2, 3)))
    recv, local = kept.pop()
    assert recv.handle is not None and local.shape == (2, 3)  # still valid after the call
    del recv, local
    gc.collect()


def test_error_message_from_library(mxkv):
    try:
        mxkv.kv.create('local').pull(7, out=mxkv.nd.zeros((1,)))
    except mxkv.base.MXNetError as err:
        assert 'key 7' in str(err) or '7' in str(err)
    else:
        raise AssertionError('expected an error')
