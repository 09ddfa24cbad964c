"""A dist worker: SGD with momentum on the servers equals it on a local store (tests/python/test_dist.py)."""
import os
import numpy as np
import mxkv as mx

kv = mx.kv.create(os.environ.get('T_KVTYPE', 'dist_sync'))
r, n = kv.rank, kv.num_workers
shape = (3, 4)
w0 = np.arange(12, dtype=np.float32).reshape(shape) / 7
kv.set_optimizer(mx.optimizer.SGD(learning_rate=0.1, momentum=0.9, wd=0.01))
kv.init(5, mx.nd.array(w0))
def grad(rank, t):
    return (np.arange(12, dtype=np.float32).reshape(shape) * (rank + 1) + t) / 3
out = mx.nd.zeros(shape)
for t in range(4):
    kv.push(5, mx.nd.array(grad(r, t)))
    kv.pull(5, out=out)
# the same optimizer on a local store fed the same summed gradients
loc = mx.kv.create('local')
loc.set_optimizer(mx.optimizer.SGD(learning_rate=0.1, momentum=0.9, wd=0.01))
loc.init(5, mx.nd.array(w0))
want = mx.nd.zeros(shape)
for t in range(4):
    g = [mx.nd.array(grad(rr, t)) for rr in range(n)]
    s = g[0]
    for x in g[1:]:
        s = s + x
    loc.push(5, s)
    loc.pull(5, out=want)
assert out.asnumpy().tobytes() == want.asnumpy().tobytes(), (out.asnumpy(), want.asnumpy())
print('OPT OK rank %d' % r)
