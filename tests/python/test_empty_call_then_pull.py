"""A call with no keys (init([], []), broadcast([], [], out=[]), push/pull/pushpull/
row_sparse_pull of []) changes nothing in MXNet 1.9.1: CommDevice::Init runs once per key,
so its merge buffers stay placed and a later pull of a key into outputs of several dtypes
copies the value into each (after Init of a new key it writes output key % n first and
copies the others from it). mxkv's device comm forgot its placed buffers on any init, also
of no keys, and a later multi-key pull wrote float16/float64 outputs from the int32 one
(all zeros instead of -0.3, 0.07; found by the scenario fuzz). Each case runs through MXNet
and mxkv and compares the outputs bit for bit.
"""
import json
import re

import pytest

EMPTY = {
    'none': lambda kv: None,
    'init': lambda kv: kv.init([], []),
    'broadcast': lambda kv: kv.broadcast([], [], out=[]),
    'push': lambda kv: kv.push([], []),
    'pull': lambda kv: kv.pull([], out=[]),
    'pushpull': lambda kv: kv.pushpull([], [], out=[]),
    'pushpull_into_values': lambda kv: kv.pushpull([], []),
    'row_sparse_pull': lambda kv: kv.row_sparse_pull([], out=[], row_ids=[]),
}
DTYPES = ('float16', 'int32', 'float64', 'uint8')


def _scenario(mx, kind, empty, final, placed):
    kv = mx.kv.create(kind)
    kv.init(17, mx.nd.ones((2, 3), ctx=mx.cpu(3)))
    kv.broadcast([701], [mx.nd.array([-0.3, 0.07], dtype='float16', ctx=mx.cpu(2))],
                 out=[[mx.nd.zeros((2,), dtype='float16', ctx=mx.cpu(1))]])
    if placed:  # a push of two values places the device comm's merge buffers
        kv.push(17, [mx.nd.ones((2, 3), ctx=mx.cpu(3)), mx.nd.ones((2, 3), ctx=mx.cpu(1))])
    error = None
    try:
        EMPTY[empty](kv)
        mx.nd.waitall()
    except Exception as exc:  # pylint: disable=broad-except
        error = type(exc).__name__
    o17 = mx.nd.zeros((2, 3), ctx=mx.cpu(3))
    outs = [mx.nd.full((2,), -3, dtype=d, ctx=mx.cpu(1)) for d in DTYPES]
    if final == 'pull':
        kv.pull([17, 701, 701], out=[[o17], [outs[0]], outs[1:]])
    elif final == 'pull_one_key':
        kv.pull(701, out=outs)
    else:
        kv.pushpull([17, 701],
                    [mx.nd.ones((2, 3), ctx=mx.cpu(3)),
                     [mx.nd.array([0.1, -2.7], dtype='float16', ctx=mx.cpu(2)),
                      mx.nd.array([1.3, 0.4], dtype='float16', ctx=mx.cpu(1))]],
                    out=[[o17], outs])
    mx.nd.waitall()
    return error, [(str(x.dtype), x.asnumpy().tobytes()) for x in outs + [o17]]


@pytest.mark.parametrize('placed', [False, True])
@pytest.mark.parametrize('final', ['pull', 'pull_one_key', 'pushpull'])
@pytest.mark.parametrize('empty', sorted(EMPTY))
@pytest.mark.parametrize('kind', ['local', 'device', 'local_allreduce_device',
                                  'local_allreduce_cpu', 'local_update_cpu'])
def test_a_call_of_no_keys_changes_no_later_pull(both, kind, empty, final, placed):
    mxnet, mxkv = both
    want = _scenario(mxnet, kind, empty, final, placed)
    got = _scenario(mxkv, kind, empty, final, placed)
    assert got == want


def _dist_run(lib, kvtype):
    from test_dist import launch  # pylint: disable=import-outside-toplevel
    code, out = launch('empty_call_worker.py', 1, 1,
                       {'T_LIB': lib, 'T_KVTYPE': kvtype, 'OMP_NUM_THREADS': '1'},
                       timeout=120, node_timeout=60)
    out = out.decode() if isinstance(out, bytes) else out
    found = re.findall(r'^(?:\[worker 0\] )?RESULT (.*)$', out, re.M)
    assert code == 0 and len(found) == 1, out[-5000:]
    return json.loads(found[0])


# dist_device_sync writes a pull's outputs through the same device comm (MXNet's
# KVStoreDist: comm_->Broadcast); dist_sync copies the value into each output.
@pytest.mark.parametrize('kvtype', ['dist_device_sync', 'dist_sync'])
def test_a_call_of_no_keys_changes_no_later_dist_pull(kvtype):
    from test_dist import _has_mxnet  # pylint: disable=import-outside-toplevel
    if not _has_mxnet():
        pytest.skip('no mxnet 1.9.1 in this Python (make venv-ref)')
    assert _dist_run('mxkv', kvtype) == _dist_run('mxnet', kvtype)
