"""A dist worker: inits refused on every rank alike, and retried (tests/python/test_dist_init.py).

Every rank makes the same calls; after each refused init the ranks must still be paired at
their barriers (a later sync round gives the exact sum) and the refused keys must not be
registered (a retry is not a "duplicate init", a push is refused as not inited)."""
import os
import mxkv as mx

kv = mx.kv.create('dist_sync')
r, n = kv.rank, kv.num_workers
servers = int(os.environ['DMLC_NUM_SERVER'])


def refused(what, f, text):
    try:
        f()
    except mx.base.MXNetError as e:
        assert text in str(e), (what, str(e))
        print('rank %d: %s refused' % (r, what), flush=True)
    else:
        raise AssertionError('rank %d: %s accepted' % (r, what))


if servers == 3:
    # MXNet's (key * 9973) % 3 overflows for this key: only rank 0 encodes the init
    for attempt in range(2):
        refused('init 215330', lambda: kv.init(215330, mx.nd.ones((3,))), 'cannot be placed')
# a value without elements (MXNet cannot even create it); only rank 0 sends the init
refused('init (0,)', lambda: kv.init(20, mx.nd.zeros((0,))), 'holds no elements')
refused('push of the refused key', lambda: kv.push(20, mx.nd.ones((2,))), 'not been inited')
refused('init (3, 0)', lambda: kv.init([21, 22], [mx.nd.ones((2,)), mx.nd.zeros((3, 0))]),
        'holds no elements')
# the refused keys are free again, and the ranks are still paired
kv.init([20, 21], [mx.nd.zeros((2,)), mx.nd.ones((2,)) * 7])
for t in range(2):
    kv.push(20, mx.nd.ones((2,)) * (r + 1 + t))
    o = mx.nd.zeros((2,))
    kv.pull(20, out=o)
    want = sum(rr + 1 + t for rr in range(n))
    assert (o.asnumpy() == want).all(), (t, o.asnumpy(), want)
o = mx.nd.zeros((2,))
kv.pull(21, out=o)
assert (o.asnumpy() == 7).all(), o.asnumpy()
kv._barrier()
print('OK rank %d of %d' % (r, n), flush=True)
