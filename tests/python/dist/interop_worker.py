"""An mxkv worker in a cluster whose scheduler and servers are real MXNet 1.9.1 nodes
(tests/python/test_dist.py): sums without an updater, read after a barrier (what a real
server's asynchronous update cannot race with)."""
import numpy as np
import mxkv as mx

kv = mx.kv.create('dist_sync')
r, n = kv.rank, kv.num_workers
kv.init(3, mx.nd.zeros((2, 3)))
kv.init(7, mx.nd.zeros(15))                  # split over the servers (bound 10)
kv.init(9, mx.nd.zeros(4, dtype='float64'))
s = n * (n + 1) // 2
for t in range(3):
    kv.push(3, [mx.nd.ones((2, 3)) * (r + 1), mx.nd.ones((2, 3)) * t])
    kv.push(7, mx.nd.arange(15) * (r + 1))
    kv.push(9, mx.nd.ones(4, dtype='float64') * (r + 1))
    kv._barrier()
    a, b, c = mx.nd.zeros((2, 3)), mx.nd.zeros(15), mx.nd.zeros(4, dtype='float64')
    kv.pull(3, out=a)
    kv.pull(7, out=b)
    kv.pull(9, out=c)
    assert (a.asnumpy() == s + n * t).all(), (t, a.asnumpy())
    assert np.array_equal(b.asnumpy(), np.arange(15, dtype=np.float32) * s), b.asnumpy()
    assert (c.asnumpy() == s).all(), c.asnumpy()
    kv._barrier()
print('INTEROP OK rank %d of %d' % (r, n))
