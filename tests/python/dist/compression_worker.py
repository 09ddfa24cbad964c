"""An mxkv worker replaying one of tests/vectors/compression/dist_sync_sequences.json (captured
from a real MXNet 1.9.1 cluster): 2-bit compressed pushes, pulled values after each step must
be those MXNet's cluster pulled (tests/python/test_dist.py)."""
import json
import os

import numpy as np
import mxkv as mx

with open(os.environ['T_VECTORS']) as f:
    seq = [s for s in json.load(f)['sequences'] if s['name'] == os.environ['T_CASE']][0]
kv = mx.kv.create(seq['store'])
r = kv.rank
assert kv.num_workers == int(seq['workers'])
kv.set_gradient_compression({'type': '2bit', 'threshold': float(seq['threshold'])})
if seq['optimizer'] is not None:
    kv.set_optimizer(mx.optimizer.create('test', rescale_grad=2))
kv.init(0, mx.nd.array(seq['init']))
kv.init(1, mx.nd.ones(4))
devices = int(seq['devices_per_worker'])
pushes = seq['pushes_per_rank'][str(r)]
want = seq['pulled_after_each_push']
out = mx.nd.zeros(4)
for step, g in enumerate(pushes):
    vals = [mx.nd.array(g, ctx=mx.cpu(d)) for d in range(devices)]
    kv.push(0, vals if devices > 1 else vals[0])
    kv.pull(0, out=out)
    assert np.array_equal(out.asnumpy(), np.array(want[step], np.float32)), \
        (step, out.asnumpy().tolist(), want[step])
ones = mx.nd.zeros(4)
kv.pull(1, out=ones)
assert ones.asnumpy().tolist() == seq['init_of_other_key_with_ones_pulled']
print('GC OK rank %d' % r)
