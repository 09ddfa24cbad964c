"""A dist worker for tests/python/test_empty_call_then_pull.py: one script for ``import mxnet``
(real MXNet 1.9.1) and ``import mxkv``, chosen by ``T_LIB``; the import serves the scheduler
and server roles and exits there. Per case (no call, init([], []), broadcast([], [], out=[])
after a two-value push) it pulls a float16 key into outputs of four dtypes and prints the
values as one ``RESULT`` JSON line."""
import importlib
import json
import os
import sys

lib = os.environ.get('T_LIB', 'mxkv')
role = os.environ.get('DMLC_ROLE', 'worker')
mx = importlib.import_module(lib)   # scheduler and server nodes serve and exit here
if role in ('scheduler', 'server'):
    sys.exit(0)
kv = mx.kv.create(os.environ['T_KVTYPE'])
res = {}
for n, empty in enumerate(('none', 'init', 'broadcast')):
    k17, k701 = 17 + 1000 * n, 701 + 1000 * n
    kv.init(k17, mx.nd.ones((2, 3), ctx=mx.cpu(3)))
    kv.broadcast([k701], [mx.nd.array([-0.3, 0.07], dtype='float16', ctx=mx.cpu(2))],
                 out=[[mx.nd.zeros((2,), dtype='float16', ctx=mx.cpu(1))]])
    kv.push(k17, [mx.nd.ones((2, 3), ctx=mx.cpu(3)), mx.nd.ones((2, 3), ctx=mx.cpu(1))])
    if empty == 'init':
        kv.init([], [])
    elif empty == 'broadcast':
        kv.broadcast([], [], out=[])
    o17 = mx.nd.zeros((2, 3), ctx=mx.cpu(3))
    outs = [mx.nd.full((2,), -3, dtype=d, ctx=mx.cpu(1))
            for d in ('float16', 'int32', 'float64', 'uint8')]
    kv.pull([k17, k701, k701], out=[[o17], [outs[0]], outs[1:]])
    mx.nd.waitall()
    res[empty] = [x.asnumpy().tobytes().hex() for x in outs + [o17]]
print('RESULT ' + json.dumps(res, sort_keys=True), flush=True)
