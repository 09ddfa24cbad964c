"""A dist worker: big values land in memory the library already has (tests/python/test_dist.py).

libzmq receives each message into memory allocated from inside libmxkv; the library keeps
freed big blocks for reuse (src/capi/bigalloc.rs) instead of letting glibc map fresh memory
for every reply, which the kernel zero-fills page by page. After a warm-up, pushpulls of a
32 MB value therefore take almost no page faults in the worker (counted around the calls
only: the checks' numpy arrays are made outside them)."""
import resource
import numpy as np
import mxkv as mx

kv = mx.kv.create('dist_sync')
r, n = kv.rank, kv.num_workers
size = 8 << 20                     # 32 MB of float32
kv.init(7, mx.nd.zeros((size,)))
p = np.arange(size, dtype=np.float32) % 1000
grad = mx.nd.zeros((size,))
out = mx.nd.zeros((size,))
faults, timed = 0, 0
for t in range(12):
    grad[:] = p * (r + 1) + t
    kv._barrier()
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    kv.pushpull(7, grad, out=out)
    out.wait_to_read()
    f1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    if t >= 4:
        faults, timed = faults + f1 - f0, timed + 1
    want = sum(p * (rr + 1) + t for rr in range(n))
    assert np.array_equal(out.asnumpy(), want), (t, out.asnumpy()[:3], want[:3])
pages = size * 4 // resource.getpagesize()
print('BB OK rank %d faults %d in %d pushpulls of %d pages' % (r, faults, timed, pages))
