"""Audit (session 12) of the local stores: differential checks against MXNet 1.9.1 found
by a randomized differential fuzz, each a case where libmxkv differed."""
import random

import pytest

from conftest import assert_same_bits


def merge_buffer_placement(mx, seed):
    """The device store places every key's merge buffer on the least-loaded pushing
    device, largest keys first (CommDevice::InitMergeBuffer). MXNet sorts its list of
    keys in place, so after a later init the new keys are sorted together with the list
    as the previous placement left it (libstdc++'s std::sort is not stable beyond 16
    elements): the devices an updater's `recv` lives on show the placement."""
    rng = random.Random(seed)
    kv = mx.kv.create('device')
    seen = []

    def upd(key, recv, local):
        seen.append((key, str(recv.context)))
        local[:] = recv

    kv._set_updater(upd)
    shapes = {}
    nkeys = 0
    for _ in range(4):
        new = list(range(nkeys, nkeys + rng.randint(5, 25)))
        nkeys = new[-1] + 1
        for k in new:
            shapes[k] = (rng.choice([2, 2, 2, 3, 4]),)
        kv.init(new, [mx.nd.zeros(shapes[k]) for k in new])
        # three values per push in every round (MXNet 1.9.1 overruns its copy buffers
        # when a key later gets more values than at its first multi-value push)
        devs = [rng.randint(0, 3) for _ in range(3)]
        for k in rng.sample(range(nkeys), rng.randint(1, nkeys)):
            kv.push(k, [mx.nd.ones(shapes[k], ctx=mx.cpu(d)) for d in devs])
    return seen


@pytest.mark.parametrize('seed', range(6))
def test_device_merge_buffers_after_later_inits(both, seed):
    mxnet, mxkv = both
    assert_same_bits(merge_buffer_placement(mxnet, seed), merge_buffer_placement(mxkv, seed),
                     'seed %d' % seed)


def compressed_single_pushes(mx):
    """With gradient compression, MXNet's device store places the merge buffers even for
    a push of one value (ReduceCompressed calls InitBuffersAndComm first) and hands the
    updater the dequantized value on the merge buffer's device."""
    kv = mx.kv.create('device')
    kv.set_gradient_compression({'type': '2bit', 'threshold': 0.5})
    seen = []

    def upd(key, recv, local):
        seen.append((key, str(recv.context), recv.asnumpy()))
        local[:] = recv

    kv.init([0, 1, 2, 3], [mx.nd.zeros((4,)), mx.nd.zeros((3,)), mx.nd.zeros((2,)),
                           mx.nd.zeros((5,))])
    kv._set_updater(upd)
    kv.push(1, mx.nd.ones((3,), ctx=mx.cpu(2)))
    kv.push(0, mx.nd.ones((4,), ctx=mx.cpu(3)) * -2)
    # the placement made by the first push holds for later multi-value pushes
    kv.push(2, [mx.nd.ones((2,), ctx=mx.cpu(0)), mx.nd.ones((2,), ctx=mx.cpu(1))])
    kv.push(3, [mx.nd.ones((5,), ctx=mx.cpu(1)), mx.nd.ones((5,), ctx=mx.cpu(0))])
    out = [mx.nd.zeros((n,)) for n in (4, 3, 2, 5)]
    kv.pull([0, 1, 2, 3], out=out)
    return {'seen': seen, 'stored': [o.asnumpy() for o in out]}


def test_device_compressed_single_push_places_merge_buffers(both):
    mxnet, mxkv = both
    assert_same_bits(compressed_single_pushes(mxnet), compressed_single_pushes(mxkv))


def bool_keys(mx):
    """MXNet's frontend takes any int, bool included (True is key 1, False key 0)."""
    kv = mx.kv.create('local')
    kv.init(True, mx.nd.ones((2,)) * 3)
    kv.init([False, 5], [mx.nd.ones((2,)) * 4, mx.nd.ones((2,))])
    kv.push(1, [mx.nd.ones((2,)), mx.nd.ones((2,))])
    kv.push([True, False], [mx.nd.ones((2,)) * 7, mx.nd.ones((2,)) * 8])
    outs = [mx.nd.zeros((2,)) for _ in range(3)]
    kv.pull([True, 0, 5], out=outs)
    res = [o.asnumpy() for o in outs]
    o = mx.nd.zeros((2,))
    kv.pushpull(False, mx.nd.ones((2,)) * 9, out=o)
    res.append(o.asnumpy())
    return res


def test_bool_keys_are_int_keys(both):
    mxnet, mxkv = both
    assert_same_bits(bool_keys(mxnet), bool_keys(mxkv))
