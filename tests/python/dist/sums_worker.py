"""A dist worker: exact sums over rounds (tests/python/test_dist.py)."""
import os, sys
import numpy as np
import mxkv as mx

kv = mx.kv.create(os.environ.get('T_KVTYPE', 'dist_sync'))
if os.environ.get('T_FAIL_RANK') == str(kv.rank):
    print('failing on purpose')
    sys.exit(3)
r, n = kv.rank, kv.num_workers
K = (lambda k: 'k%d' % k) if os.environ.get('T_KEYS') == 'str' else (lambda k: k)
bound = int(os.environ.get('MXNET_KVSTORE_BIGARRAY_BOUND', '1000000'))
shape = (4, 3)
big = (bound // 10 + 7, 10)  # above the bound: split over the servers
kv.init(K(3), mx.nd.zeros(shape))
kv.init(K(99), mx.nd.zeros(big))
kv.init(K(7), mx.nd.ones((5,), dtype='float64'))
kv.init(K(11), mx.nd.sparse.zeros('row_sparse', (6, 2)))
rounds = 3
for t in range(rounds):
    # two devices' values per key, reduced on the worker first
    kv.push(K(3), [mx.nd.ones(shape) * (r + 1), mx.nd.ones(shape) * (t + 1)])
    kv.push(K(99), mx.nd.ones(big) * (r + 1 + t))
    kv.push(K(7), mx.nd.ones((5,), dtype='float64') * 0.5)
    o = mx.nd.zeros(shape)
    kv.pull(K(3), out=o)
    want = sum(rr + 1 + t + 1 for rr in range(n))
    assert (o.asnumpy() == want).all(), (t, o.asnumpy(), want)
    ob = mx.nd.zeros(big)
    kv.pull(K(99), out=ob)
    wantb = sum(rr + 1 + t for rr in range(n))
    assert (ob.asnumpy() == wantb).all(), (t, ob.asnumpy()[:2], wantb)
    ow = mx.nd.zeros((5,), dtype='float64')
    kv.pull(K(7), out=ow)
    assert (ow.asnumpy() == 0.5 * n).all(), ow.asnumpy()
# row_sparse: each worker pushes rows {rank, 4}; a pull of rows 0..5 sees their sum
g = mx.nd.sparse.row_sparse_array((np.full((2, 2), r + 1, np.float32), [r, 4]), shape=(6, 2))
kv.push(K(11), g)
rsp = mx.nd.sparse.zeros('row_sparse', (6, 2))
kv.row_sparse_pull(K(11), out=rsp, row_ids=mx.nd.array([4, 0, 1, 2, 5], dtype='int64'))
want = np.zeros((6, 2), np.float32)
for rr in range(n):
    want[rr] += rr + 1
    want[4] += rr + 1
want[3] = 0
assert np.array_equal(rsp.asnumpy(), want), (rsp.asnumpy(), want)
# pushpull
out = mx.nd.zeros(shape)
kv.pushpull(K(3), mx.nd.ones(shape) * (r + 1), out=out)
assert (out.asnumpy() == sum(rr + 1 for rr in range(n))).all(), out.asnumpy()
try:
    kv.push(K(3), mx.nd.ones(shape, dtype='int32'))
except Exception as e:
    assert 'float' in str(e), str(e)
else:
    raise AssertionError('int32 push accepted')
kv._barrier()
print('OK rank %d of %d' % (r, n))
