"""A dist worker: values large enough to move without copies (tests/python/test_dist.py).

Arrays of 64 KiB or more are lent to the transport when pushed and adopt the reply when
pulled, unless their address is out (a numpy view, MXNDArrayGetData): what was pushed must
be what the servers sum even when the array is written at once, and a view taken before a
pull must see the pulled value, as with MXNet."""
import os
import numpy as np
import mxkv as mx

kv = mx.kv.create(os.environ.get('T_KVTYPE', 'dist_sync'))
r, n = kv.rank, kv.num_workers
shape = (300, 256)  # 300 KiB of float32; MXNET_KVSTORE_BIGARRAY_BOUND decides the split
kv.init(5, mx.nd.zeros(shape))
p = np.arange(np.prod(shape), dtype=np.float32).reshape(shape) % 1000
# grad and free are only written by whole-array copies (never through a view, which a
# scalar assignment or arithmetic would take): grad is lent when pushed, free adopts a
# one-server reply
grad = mx.nd.zeros(shape)
free = mx.nd.zeros(shape)
pinned = mx.nd.zeros(shape)
view = pinned._view()              # a numpy view of its memory: pins it
for t in range(4):
    grad[:] = p * (r + 1) + t
    kv.push(5, grad)
    grad[:] = np.full(shape, -1e9, np.float32)  # written while its message may be going out
    kv.pull(5, out=pinned)
    want = sum(p * (rr + 1) + t for rr in range(n))
    assert np.array_equal(view, want), (t, view[0, :3], want[0, :3])
    kv.pull(5, out=free)
    assert np.array_equal(free.asnumpy(), want), (t, free.asnumpy()[0, :3])
    free[:] = np.full(shape, 3.0, np.float32)   # an adopted reply written over
    kv._barrier()
    # grad (-1e9 everywhere) as both value and output
    kv.pushpull(5, grad, out=grad)
    assert np.array_equal(grad.asnumpy(), np.full(shape, -1e9 * n, np.float32)), t
    kv._barrier()
print('ZC OK rank %d of %d' % (r, n))
