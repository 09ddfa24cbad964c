"""README deviation: MXNet 1.9.1's ``local`` and ``device`` stores, after a multi-value push
without an updater, keep the merge buffer itself as the key's stored value.  The next
multi-value push reduces the gradients into that buffer, so the weight is overwritten by the
gradient sum before the updater runs, and an SGD-with-momentum run diverges from the math.
libmxkv keeps the stored value and the merge buffer apart.  This test pins both answers: MXNet's
(weight replaced by the gradient sum, then updated) and libmxkv's (the math)."""
import numpy as np
import pytest

LR, MOM = np.float32(0.1), np.float32(0.9)


def run(mx, typ):
    kv = mx.kv.create(typ)
    kv.init(0, mx.nd.ones((4,)))
    first = [mx.nd.array(np.arange(4) + 1.0 + i, ctx=mx.cpu(i)) for i in range(2)]
    kv.push(0, first)                       # no updater: stored = sum
    out = mx.nd.zeros((4,))
    kv.pull(0, out=out)
    pulled = [out.asnumpy().copy()]
    mom = np.zeros(4, np.float32)

    def update(key, recv, local):
        mom[:] = MOM * mom - LR * recv.asnumpy()
        local[:] = local.asnumpy() + mom

    kv._set_updater(update)
    grads = [mx.nd.array(np.full(4, 0.5, np.float32) * (i + 1), ctx=mx.cpu(i)) for i in range(2)]
    for _ in range(3):
        kv.push(0, grads)
        kv.pull(0, out=out)
        pulled.append(out.asnumpy().copy())
    return pulled


def expected(aliased):
    """The float32 math of the run above; ``aliased``: the weight is replaced by the gradient
    sum before each update (MXNet's merge buffer is the stored value)."""
    weight = (np.arange(4) + 1.0).astype(np.float32) + (np.arange(4) + 2.0).astype(np.float32)
    grad = np.full(4, 0.5, np.float32) + np.full(4, 1.0, np.float32)
    mom = np.zeros(4, np.float32)
    out = [weight.copy()]
    for _ in range(3):
        mom = MOM * mom - LR * grad
        weight = (grad if aliased else weight) + mom
        out.append(weight.copy())
    return out


@pytest.mark.parametrize('typ', ['local', 'device'])
def test_mxkv_keeps_weight_and_merge_buffer_apart(mxkv, typ):
    got = run(mxkv, typ)
    for step, (g, e) in enumerate(zip(got, expected(aliased=False))):
        assert g.tobytes() == e.tobytes(), (typ, step, g, e)


@pytest.mark.parametrize('typ', ['local', 'device'])
def test_mxnet_overwrites_weight_with_gradient(mxnet, typ):
    got = run(mxnet, typ)
    for step, (g, e) in enumerate(zip(got, expected(aliased=True))):
        assert g.tobytes() == e.tobytes(), (typ, step, g, e)
    assert got[1].tobytes() != expected(aliased=False)[1].tobytes()
