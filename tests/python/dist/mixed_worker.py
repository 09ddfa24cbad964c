"""A dist worker of tests/python/test_dist_interop.py that runs as a real MXNet 1.9.1
worker (T_IMPL=mxnet: `import mxnet`) or as ours (T_IMPL=mxkv: `import mxkv`), in one
cluster with workers of the other kind. T_CASE picks what it does:

  sums     exact sums over rounds: a small key, a key of an irregular shape above
           MXNET_KVSTORE_BIGARRAY_BOUND (split over the servers), two devices' values per
           push; int or string keys (T_KEYS). T_SAFE=1 (real MXNet servers): every worker's
           push is answered before a barrier, values are read after it, and another barrier
           ends the round (what a real server's asynchronous copy cannot race with).
  sgd      set_optimizer(SGD with momentum), init, T_ROUNDS rounds of push/pull; the pulled
           weights of every round go to T_OUT/w<rank>.npy (the test compares them with local
           stores fed the summed gradients). With T_SAFE=1, as in sums.
  gc       2-bit gradient compression (threshold 0.5) on the split key over rounds: each
           pulled value is the sum of every worker's quantised push, computed here with MXNet's
           2-bit rule (residual per worker). T_SAFE=1 as in sums.
  rsp      row_sparse pushes of rows {rank, 20} of a table split over the servers and
           row_sparse_pull of the pushed rows (our servers, no updater): the round's sums.
  command  the worker of rank T_SENDER sends T_PAYLOAD (a file holding a protocol-0 pickle)
           as command 0 (kController) to the servers; then every worker checks plain sums
           (no updater may have been installed).
  two      a second dist_sync store in this process (T_IMPL=mxkv): a refusal's text goes
           to the output; every store that exists (each with its own keys) sums right.

The store type is T_KVTYPE (default dist_sync). Rank r is the worker with DMLC_TASK_ID r
(mxkv-launch pins ports in rank order).
"""
import os
import sys

import numpy as np

if os.environ['T_IMPL'] == 'mxnet':
    import mxnet as mx
else:
    import mxkv as mx

CASE = os.environ['T_CASE']
SAFE = os.environ.get('T_SAFE') == '1'
K = (lambda k: 'k%d' % k) if os.environ.get('T_KEYS') == 'str' else (lambda k: k)
SHAPE = (2, 3)
IRREGULAR = (3, 5, 7)      # 105 values: above the bound the test sets, split over the servers

kv = mx.kv.create(os.environ.get('T_KVTYPE', 'dist_sync'))
r, n = kv.rank, kv.num_workers
assert r == int(os.environ['DMLC_TASK_ID']), (r, os.environ['DMLC_TASK_ID'])
TAG = '%s rank %d' % (os.environ['T_IMPL'], r)


def answered():
    """A real MXNet worker: every push of it answered (its engine runs pushes
    asynchronously; an answer means the round is complete on the servers). Ours needs
    nothing: its pull of a key waits for the answer to its earlier push of the key."""
    mx.nd.waitall()


def round_end_then_read():
    """Real MXNet servers: read only after every worker's push of the round was answered."""
    if SAFE:
        answered()
        kv._barrier()


def read_done():
    if SAFE:
        kv._barrier()


def f32(a):
    return mx.nd.array(np.asarray(a, np.float32))


def grad(rank, t):
    return (np.arange(105, dtype=np.float32).reshape(IRREGULAR) * (rank + 1) + t) / 3


if CASE == 'sums':
    kv.init([K(3), K(99)], [mx.nd.zeros(SHAPE), mx.nd.zeros(IRREGULAR)])
    s = n * (n + 1) // 2
    base = np.arange(105, dtype=np.float32).reshape(IRREGULAR)
    for t in range(4):
        kv.push(K(3), [mx.nd.ones(SHAPE) * (r + 1), mx.nd.ones(SHAPE) * t])
        kv.push(K(99), f32(base * (r + 1) + t))
        round_end_then_read()
        a, b = mx.nd.zeros(SHAPE), mx.nd.zeros(IRREGULAR)
        kv.pull(K(3), out=a)
        kv.pull(K(99), out=b)
        assert (a.asnumpy() == s + n * t).all(), (t, a.asnumpy())
        assert np.array_equal(b.asnumpy(), base * s + n * t), (t, b.asnumpy())
        read_done()
    if not SAFE:
        # pushpull of the split key: the round's sum comes back in one call
        out = mx.nd.zeros(IRREGULAR)
        kv.pushpull(K(99), f32(base * (r + 1)), out=out)
        assert np.array_equal(out.asnumpy(), base * s), out.asnumpy()
    print('MIX SUMS OK %s of %d' % (TAG, n))

elif CASE == 'sgd':
    rounds = int(os.environ['T_ROUNDS'])
    kv.set_optimizer(mx.optimizer.SGD(learning_rate=0.1, momentum=0.9, wd=0.01))
    w0 = np.arange(105, dtype=np.float32).reshape(IRREGULAR) / 7
    kv.init(K(5), f32(w0))
    out = mx.nd.zeros(IRREGULAR)
    seen = []
    for t in range(rounds):
        kv.push(K(5), f32(grad(r, t)))
        round_end_then_read()
        kv.pull(K(5), out=out)
        seen.append(out.asnumpy().copy())
        read_done()
    np.save(os.path.join(os.environ['T_OUT'], 'w%d.npy' % r), np.stack(seen))
    print('MIX SGD DONE %s' % TAG)

elif CASE == 'gc':
    # every worker sets 2-bit compression (rank 0's call tells the servers); the split key's
    # pushes are quantised on each worker with its own residual, the servers sum the
    # dequantised values (no updater: the stored value is the round's sum)
    th = 0.5
    kv.set_gradient_compression({'type': '2bit', 'threshold': th})
    kv.init(K(8), mx.nd.zeros(IRREGULAR))
    base = ((np.arange(105) % 7) - 3).astype(np.float32).reshape(IRREGULAR)
    res = [np.zeros(IRREGULAR, np.float32) for _ in range(n)]

    def quantised(rank, t):
        """MXNet's 2-bit kernel on worker `rank`'s residual (float32 throughout)"""
        g = base * np.float32(0.3 * (rank + 1)) + np.float32(0.1 * t)
        res[rank] += g
        q = np.zeros(IRREGULAR, np.float32)
        up, down = res[rank] >= th, res[rank] <= -th
        q[up], q[down] = th, -th
        res[rank][up] -= np.float32(th)
        res[rank][down] += np.float32(th)
        return g, q

    for t in range(4):
        want = np.zeros(IRREGULAR, np.float32)
        for rr in range(n):
            g, q = quantised(rr, t)
            want += q
            if rr == r:
                mine = g
        kv.push(K(8), f32(mine))
        round_end_then_read()
        o = mx.nd.zeros(IRREGULAR)
        kv.pull(K(8), out=o)
        assert np.array_equal(o.asnumpy(), want), (t, o.asnumpy().ravel()[:8], want.ravel()[:8])
        read_done()
    print('MIX GC OK %s' % TAG)

elif CASE == 'rsp':
    # row_sparse on a (30, 2) table (60 values: above the bound, rows split over the
    # servers), inited with every row stored (a real MXNet worker sends no rows for a table
    # without stored rows, on which a real MXNet 1.9.1 server aborts: "init with empty data
    # is not supported"); each worker pushes rows {rank, 20}; a row_sparse_pull of rows
    # 20, 0, 1 sees the round's sums (our servers, no updater)
    kv.init(K(11), mx.nd.ones((30, 2)).tostype('row_sparse'))
    for t in range(2):
        g = mx.nd.sparse.row_sparse_array(
            (np.full((2, 2), r + 1 + t, np.float32), [r, 20]), shape=(30, 2))
        kv.push(K(11), g)
        out = mx.nd.sparse.zeros('row_sparse', (30, 2))
        kv.row_sparse_pull(K(11), out=out, row_ids=mx.nd.array([20, 0, 1], dtype='int64'))
        want = np.zeros((30, 2), np.float32)
        for rr in range(n):
            want[rr] += rr + 1 + t
            want[20] += rr + 1 + t
        assert np.array_equal(out.asnumpy(), want), (t, out.asnumpy(), want)
    print('MIX RSP OK %s' % TAG)

elif CASE == 'command':
    if r == int(os.environ['T_SENDER']):
        with open(os.environ['T_PAYLOAD'], 'rb') as f:
            payload = f.read().decode('ascii')
        kv._send_command_to_servers(0, payload)
        print('PAYLOAD SENT %s' % TAG)
    kv.init(K(4), mx.nd.ones(IRREGULAR))
    for t in range(2):
        kv.push(K(4), mx.nd.ones(IRREGULAR) * (r + 1 + t))
        round_end_then_read()
        o = mx.nd.zeros(IRREGULAR)
        kv.pull(K(4), out=o)
        want = sum(rr + 1 + t for rr in range(n))
        assert (o.asnumpy() == want).all(), (t, o.asnumpy().ravel()[:4], want)
        read_done()
    print('PLAIN SUMS OK %s' % TAG)

elif CASE == 'two':
    try:
        kv2 = mx.kv.create('dist_sync')
    except Exception as e:  # pylint: disable=broad-except
        kv2 = None
        print('SECOND STORE REFUSED: %s' % str(e).replace('\n', ' | '))
    stores = [kv] if kv2 is None else [kv, kv2]
    if kv2 is not None:
        print('SECOND STORE CREATED %s' % TAG)
    # each store its own keys; the sums must be right in every store that exists
    for i, st in enumerate(stores):
        st.init(K(6 + i), mx.nd.zeros(SHAPE))
    for t in range(2):
        for i, st in enumerate(stores):
            st.push(K(6 + i), mx.nd.ones(SHAPE) * (r + 1) * (10 ** i))
        for i, st in enumerate(stores):
            o = mx.nd.zeros(SHAPE)
            st.pull(K(6 + i), out=o)
            want = n * (n + 1) // 2 * (10 ** i)
            assert (o.asnumpy() == want).all(), ('store', i, 'round', t, o.asnumpy(), want)
    print('STORES OK %s (%d)' % (TAG, len(stores)))

else:
    raise SystemExit('unknown T_CASE %r' % CASE)
