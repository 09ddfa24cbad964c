"""A dist worker for tests/python/test_dist_grid.py: one script for ``import mxnet as mx``
(real MXNet 1.9.1) and ``import mxkv as mx``, chosen by ``T_LIB`` (default ``mxkv``).

Every node of a job runs this script (the launcher's contract): the import serves the
scheduler/server role and exits on those nodes, so only workers get past it; a library whose
import returns on such a node exits 3.

Environment: ``T_LIB`` (mxnet|mxkv), ``T_SCENARIO`` (below), ``T_KVTYPE`` (store type),
``T_KEYS`` (int|str), ``T_REPEATS`` (times the whole scenario runs in this job, each time on
fresh keys; default 4), ``T_ROUNDS`` (default 3), ``MXNET_KVSTORE_BIGARRAY_BOUND`` (the
"big" keys are made just above it, so they are split over every server).

Scenarios (values are multiples of 1/8, small enough that every sum and update is exact in
float16, float32 and float64 whatever the order of additions, except where said):

``sums``    dist_sync / dist_device_sync, no updater. Keys: float32 (pushed as two devices'
            values), float64, float16, a float32, a float16 and a float64 key above the
            big-array bound, irregular shapes (3,7,5) and (5,7,b//35+1) (the second split at
            an odd boundary). Each round: push every key, pull every key (one call per key on odd
            rounds, one multi-key call on even rounds), then pushpull every key; the
            two-device key is pushed, pushpulled and pulled as two devices' arrays (outputs
            on cpu(0) and cpu(1)). Each pulled array must equal the numpy sum of what the
            workers pushed that round.
``sgd``     as ``sums`` with ``set_optimizer(SGD(learning_rate=0.5))``: each pull and
            pushpull returns w - 0.5 * (the sum of that step's pushes), exact in every dtype.
``async``   dist_async with ``set_optimizer(SGD(learning_rate=0.5))`` (MXNet sends only
            optimizers to dist servers). 1 worker: every pull after every push equals a local
            store running the same optimizer on the same pushes, bit for bit (float32 keys
            get gradients that are not dyadic, so rounding is exercised). Several workers:
            dyadic gradients, and after every worker's pushes are answered (its own pull of
            each key) and a barrier, the weights equal w0 - 0.5 * (sum of every gradient).
``rsp``     dist_sync, no updater, read only after barriers (what a real MXNet server's race
            cannot change): the dense keys of ``sums`` pushed, then after ``kv._barrier()``
            pulled; two float32 row_sparse keys ((6,3) and (b//5+1,7), the second split by
            rows over the servers) initialised with all their rows; each round every worker pushes
            a subset of the rows such that the workers' subsets together cover every row (so
            a real MXNet server's table, which becomes the pushed rows, stays whole) plus one
            row all of them push; after a barrier ``row_sparse_pull`` of all rows and of rows
            [0, 2, last] equal the row-wise sums.
``rsp_sgd`` the two row_sparse keys of ``rsp`` with ``set_optimizer(SGD(learning_rate=0.5))``
            on a sync or async store; each round every worker pushes some rows, leaving
            some rows out (the optimizer updates only pushed rows). 1 worker: every pull
            equals a local store with the same optimizer. Sync: every pull after a round is
            w0 - 0.5 * (every row pushed so far). Async, several workers: that, after the
            last round and a barrier.
``2bit``    dist_sync, ``set_gradient_compression({'type': '2bit', 'threshold': 0.5})``, no
            updater: float32 keys (5,7) (one server, pushed as two devices' values) and one
            (b//7+3,7) above the bound (split, at least 16 values per server, not a multiple
            of 16); gradients are multiples of 0.3 (not exact: the residuals' float32 rounding
            counts); after a barrier the pulled value equals the sum over workers of the
            dequantized pushes, simulated here in numpy float32 (residual += g; >= t sends
            +t, <= -t sends -t, the residual keeps the rest).

Output (the launcher prefixes ``[worker R] ``): one ``DIGEST <scenario> <rep> <sha256>`` line
per repeat (of every array pulled, its dtype and shape), then ``GRID OK <scenario> rank R of
N digest <sha256>``. The worker itself asserts every pulled value and that all repeats have
the same digest. :func:`expected_digest` computes the digest from the inputs alone (the
test compares it with the workers').
"""
import hashlib
import importlib
import os
import sys

import numpy as np

THRESHOLD = 0.5
LR = 0.5


def bound():
    return int(os.environ.get('MXNET_KVSTORE_BIGARRAY_BOUND', '1000000'))


def dense_specs(b):
    """(name, shape, dtype, devices) of the dense keys; the big ones have more than b values"""
    return [
        ('f32', (4, 3), 'float32', 2),
        ('f64', (5,), 'float64', 1),
        ('f16', (6, 2), 'float16', 1),
        ('big32', (b // 8 + 3, 8), 'float32', 1),
        ('big16', (b // 6 + 1, 6), 'float16', 1),
        ('big64', (b + 1,), 'float64', 1),
        ('odd', (3, 7, 5), 'float32', 1),
        ('oddbig', (5, 7, b // 35 + 1), 'float32', 1),
    ]


def rsp_specs(b):
    """(name, shape) of the row_sparse float32 keys; the second is split by rows"""
    return [('rsp', (6, 3)), ('rspbig', (b // 5 + 1, 7))]


def c2_specs(b):
    """(name, shape, devices) of the compressed float32 keys"""
    return [('c_small', (5, 7), 2), ('c_big', (b // 7 + 3, 7), 1)]


def _pattern(shape, salt):
    n = int(np.prod(shape))
    return (np.arange(n, dtype=np.int64) * 7 + salt).reshape(shape)


def dense_value(j, shape, dtype, r, t):
    """worker r's value of the j-th key in round t: multiples of 1/4 in [-2.75, 2.75]"""
    return ((_pattern(shape, 3 * r + 5 * t + 11 * j) % 23 - 11) * 0.25).astype(dtype)


def device_parts(value, t):
    """two devices' values adding up to `value` exactly"""
    b = ((_pattern(value.shape, t) % 3) * 0.5).astype(value.dtype)
    return [value - b, b]


def init_value(j, shape, dtype):
    return ((_pattern(shape, 13 * j + 1) % 17 - 8) * 0.125).astype(dtype)


def dense_sum(j, shape, dtype, n, t):
    return sum(dense_value(j, shape, dtype, r, t).astype(np.float64)
               for r in range(n)).astype(dtype)


def rsp_rows(rows, n, r, t):
    """rows worker r pushes in round t: its share of a partition of all rows plus row t"""
    own = {i for i in range(rows) if (i + t) % n == r % n}
    own.add(t % rows)
    return sorted(own)


def rsp_data(j, shape, r, t, rows):
    full = ((_pattern(shape, 2 * r + t + 5 * j) % 11 - 5) * 0.5).astype(np.float32)
    return full[rows]


def rsp_sum(j, shape, n, t):
    want = np.zeros(shape, np.float64)
    for r in range(n):
        rows = rsp_rows(shape[0], n, r, t)
        want[rows] += rsp_data(j, shape, r, t, rows)
    return want.astype(np.float32)


def rsp_sgd_rows(rows, n, r, t):
    """with an updater: the rows worker r pushes in round t leave some rows out"""
    own = {i for i in range(rows) if (i + t) % (n + 1) == r}
    own.add(t % rows)
    return sorted(own)


def rsp_sgd_weights(j, shape, n, upto):
    """the rows after rounds 0..upto-1 with SGD(lr): w0 - lr * (every pushed row)"""
    w = init_value(j, shape, 'float32').astype(np.float64)
    for t in range(upto):
        for r in range(n):
            rows = rsp_sgd_rows(shape[0], n, r, t)
            w[rows] -= LR * rsp_data(j, shape, r, t, rows)
    return w.astype(np.float32)


def c2_grad(j, shape, r, t):
    """not dyadic: the residual's float32 rounding matters"""
    return (((_pattern(shape, 5 * r + 3 * t + j) % 9) - 4) * 0.3).astype(np.float32)


def c2_sums(j, shape, n, rounds):
    """per round: the sum over workers of the dequantized 2-bit pushes"""
    th = np.float32(THRESHOLD)
    res = [np.zeros(shape, np.float32) for _ in range(n)]
    out = []
    for t in range(rounds):
        total = np.zeros(shape, np.float32)
        for r in range(n):
            res[r] = res[r] + c2_grad(j, shape, r, t)
            q = np.where(res[r] >= th, th, np.where(res[r] <= -th, -th, np.float32(0)))
            q = q.astype(np.float32)
            res[r] = res[r] - q
            total = total + q
        out.append(total)
    return out


def async_grad(j, shape, dtype, r, t, exact):
    if exact or dtype != 'float32':
        return dense_value(j, shape, dtype, r, t)
    return ((_pattern(shape, 3 * r + 5 * t + j) % 29) / 7.0 - 2).astype(dtype)


def async_w0(j, shape, dtype):
    return init_value(j, shape, dtype)


def async_final(j, shape, dtype, n, rounds):
    w = async_w0(j, shape, dtype).astype(np.float64)
    for t in range(rounds):
        for r in range(n):
            w = w - LR * async_grad(j, shape, dtype, r, t, True).astype(np.float64)
    return w.astype(dtype)


def sgd_sequence(j, shape, dtype, n, rounds):
    """sync mode with SGD(lr) on the servers: [(after round t's pushes, after its
    pushpulls)] -- each is w - lr * (the sum of that step's pushes), from w0 = init_value"""
    w = init_value(j, shape, dtype).astype(np.float64)
    out = []
    for t in range(rounds):
        w = w - LR * dense_sum(j, shape, dtype, n, t).astype(np.float64)
        a = w.astype(dtype)
        w = w - LR * dense_sum(j, shape, dtype, n, t + 10).astype(np.float64)
        out.append((a, w.astype(dtype)))
    return out


class Digest(object):
    def __init__(self):
        self.h = hashlib.sha256()

    def add(self, name, a):
        a = np.ascontiguousarray(a)
        self.h.update(('%s|%s|%s|' % (name, a.dtype.str, a.shape)).encode())
        self.h.update(a.tobytes())

    def hex(self):
        return self.h.hexdigest()


def expected_digest(scenario, n, rounds, b):
    """The digest a worker of an n-worker job prints for one repeat, from the inputs alone."""
    d = Digest()
    if scenario in ('sums', 'sgd'):
        specs = dense_specs(b)
        for j, (name, shape, dt, _) in enumerate(specs):
            d.add('init %s 0' % name, init_value(j, shape, dt))
        seq = [sgd_sequence(j, shape, dt, n, rounds) for j, (_, shape, dt, _) in enumerate(specs)]
        for t in range(rounds):
            for j, (name, shape, dt, _) in enumerate(specs):
                d.add('pull %s %d' % (name, t), dense_sum(j, shape, dt, n, t)
                      if scenario == 'sums' else seq[j][t][0])
            for j, (name, shape, dt, _) in enumerate(specs):
                d.add('pushpull %s %d' % (name, t), dense_sum(j, shape, dt, n, t + 10)
                      if scenario == 'sums' else seq[j][t][1])
    elif scenario == 'rsp':
        specs, rsps = dense_specs(b), rsp_specs(b)
        for t in range(rounds):
            for j, (name, shape, dt, _) in enumerate(specs):
                d.add('pull %s %d' % (name, t), dense_sum(j, shape, dt, n, t))
            for j, (name, shape) in enumerate(rsps):
                s = rsp_sum(j, shape, n, t)
                d.add('rsp %s %d' % (name, t), s)
                d.add('rsp rows %s %d' % (name, t), s[[0, 2, shape[0] - 1]])
    elif scenario == 'rsp_sgd':
        for j, (name, shape) in enumerate(rsp_specs(b)):
            d.add('final %s' % name, rsp_sgd_weights(j, shape, n, rounds))
    elif scenario == '2bit':
        specs = c2_specs(b)
        for j, (name, shape, _) in enumerate(specs):
            d.add('init ' + name, init_value(j, shape, 'float32'))
        sums = [c2_sums(j, shape, n, rounds) for j, (name, shape, _) in enumerate(specs)]
        for t in range(rounds):
            for j, (name, shape, _) in enumerate(specs):
                d.add('pull %s %d' % (name, t), sums[j][t])
    elif scenario == 'async':
        if n != 1:
            for j, (name, shape, dt, _) in enumerate(dense_specs(b)):
                d.add('final %s 0' % name, async_final(j, shape, dt, n, rounds))
        else:
            return None   # the local store's results, not a closed form
    return d.hex()


def check(got, want, what):
    got = np.asarray(got)
    if got.dtype != want.dtype or got.shape != want.shape or not np.array_equal(got, want):
        raise AssertionError('%s: pulled %s %s\n%r\nexpected %s %s\n%r' % (
            what, got.dtype, got.shape, got, want.dtype, want.shape, want))


class Worker(object):
    def __init__(self, mx, kv, rep, keys_str):
        self.mx, self.kv, self.rep = mx, kv, rep
        self.keys_str = keys_str
        self.r, self.n = kv.rank, kv.num_workers
        self.b = bound()
        self.rounds = int(os.environ.get('T_ROUNDS', '3'))
        self.d = Digest()
        self._next = 0

    def key(self, name):
        """a fresh key per repeat: 'r<rep>_<name>' or an int"""
        if self.keys_str:
            return 'r%d_%s' % (self.rep, name)
        if not hasattr(self, '_ints'):
            self._ints = {}
        if name not in self._ints:
            self._ints[name] = 100 * self.rep + len(self._ints) + 1
        return self._ints[name]

    def nd(self, a, dev=0):
        return self.mx.nd.array(a, dtype=a.dtype, ctx=self.mx.cpu(dev))

    def value(self, a, devices, t):
        if devices == 1:
            return self.nd(a)
        return [self.nd(p, d) for d, p in enumerate(device_parts(a, t))]

    def outs_for(self, spec):
        """one output per device of the key (a list for a key pushed from two devices)"""
        _, shape, dt, devices = spec
        o = [self.mx.nd.zeros(shape, ctx=self.mx.cpu(d), dtype=dt) for d in range(devices)]
        return o[0] if devices == 1 else o

    def check_outs(self, o, want, what, tag):
        """every device's output equals want; the first goes into the digest"""
        outs = o if isinstance(o, list) else [o]
        for d, x in enumerate(outs):
            check(x.asnumpy(), want, '%s (device %d)' % (what, d))
        self.d.add(tag, outs[0].asnumpy())

    def pull_dense(self, specs, t, tag, want_of, multi):
        kv = self.kv
        outs = [self.outs_for(s) for s in specs]
        if multi:
            kv.pull([self.key(s[0]) for s in specs], out=outs)
        else:
            for s, o in zip(specs, outs):
                kv.pull(self.key(s[0]), out=o)
        for j, (s, o) in enumerate(zip(specs, outs)):
            self.check_outs(o, want_of(j, s), '%s %s round %d rep %d' % (tag, s[0], t, self.rep),
                            '%s %s %d' % (tag, s[0], t))

    def init_dense(self, specs, value_of):
        keys = [self.key(s[0]) for s in specs]
        self.kv.init(keys, [self.nd(value_of(j, s)) for j, s in enumerate(specs)])

    # -- scenarios ---------------------------------------------------------------------
    def sums(self, sgd=False):
        kv, n = self.kv, self.n
        specs = dense_specs(self.b)
        if sgd:
            seq = [sgd_sequence(j, s[1], s[2], n, self.rounds) for j, s in enumerate(specs)]
            want_pull = lambda j, s, t: seq[j][t][0]
            want_pushpull = lambda j, s, t: seq[j][t][1]
        else:
            want_pull = lambda j, s, t: dense_sum(j, s[1], s[2], n, t)
            want_pushpull = lambda j, s, t: dense_sum(j, s[1], s[2], n, t + 10)
        self.init_dense(specs, lambda j, s: init_value(j, s[1], s[2]))
        self.pull_dense(specs, 0, 'init', lambda j, s: init_value(j, s[1], s[2]), True)
        for t in range(self.rounds):
            vals = [self.value(dense_value(j, s[1], s[2], self.r, t), s[3], t)
                    for j, s in enumerate(specs)]
            if t % 2 == 0:
                kv.push([self.key(s[0]) for s in specs], vals)
            else:
                for s, v in zip(specs, vals):
                    kv.push(self.key(s[0]), v)
            self.pull_dense(specs, t, 'pull', lambda j, s: want_pull(j, s, t), t % 2 == 0)
            outs = [self.outs_for(s) for s in specs]
            pv = [self.value(dense_value(j, s[1], s[2], self.r, t + 10), s[3], t + 1)
                  for j, s in enumerate(specs)]
            if t % 2 == 0:
                kv.pushpull([self.key(s[0]) for s in specs], pv, out=outs)
            else:
                for s, v, o in zip(specs, pv, outs):
                    kv.pushpull(self.key(s[0]), v, out=o)
            for j, (s, o) in enumerate(zip(specs, outs)):
                self.check_outs(o, want_pushpull(j, s, t),
                                'pushpull %s round %d rep %d' % (s[0], t, self.rep),
                                'pushpull %s %d' % (s[0], t))

    def rsp(self):
        mx, kv, n, r = self.mx, self.kv, self.n, self.r
        specs, rsps = dense_specs(self.b), rsp_specs(self.b)
        self.init_dense(specs, lambda j, s: init_value(j, s[1], s[2]))
        for j, (name, shape) in enumerate(rsps):
            full = init_value(j, shape, 'float32')
            kv.init(self.key(name), mx.nd.sparse.row_sparse_array(
                (full, np.arange(shape[0], dtype=np.int64)), shape=shape))
        for t in range(self.rounds):
            for j, s in enumerate(specs):
                kv.push(self.key(s[0]), self.value(dense_value(j, s[1], s[2], r, t), s[3], t))
            for j, (name, shape) in enumerate(rsps):
                rows = rsp_rows(shape[0], n, r, t)
                kv.push(self.key(name), mx.nd.sparse.row_sparse_array(
                    (rsp_data(j, shape, r, t, rows), np.array(rows, np.int64)), shape=shape))
            kv._barrier()
            self.pull_dense(specs, t, 'pull', lambda j, s: dense_sum(j, s[1], s[2], n, t),
                            False)
            for j, (name, shape) in enumerate(rsps):
                want = rsp_sum(j, shape, n, t)
                for tag, ids in (('rsp', list(range(shape[0]))),
                                 ('rsp rows', [0, 2, shape[0] - 1])):
                    out = mx.nd.sparse.zeros('row_sparse', shape)
                    kv.row_sparse_pull(self.key(name), out=out,
                                       row_ids=mx.nd.array(ids, dtype='int64'))
                    got = out.asnumpy()
                    w = np.zeros(shape, np.float32)
                    w[ids] = want[ids]
                    check(got, w, '%s %s round %d rep %d' % (tag, name, t, self.rep))
                    self.d.add('%s %s %d' % (tag, name, t), got[ids])
            kv._barrier()

    def rsp_sgd(self, local):
        """row_sparse keys with SGD on the servers (sync or async)"""
        mx, kv, n, r = self.mx, self.kv, self.n, self.r
        rsps = rsp_specs(self.b)
        keys = [self.key(name) for name, _ in rsps]
        for st in [kv] + ([local] if local is not None else []):
            for j, (name, shape) in enumerate(rsps):
                st.init(keys[j], mx.nd.sparse.row_sparse_array(
                    (init_value(j, shape, 'float32'), np.arange(shape[0], dtype=np.int64)),
                    shape=shape))

        def pull(st, j, shape):
            out = mx.nd.sparse.zeros('row_sparse', shape)
            st.row_sparse_pull(keys[j], out=out,
                               row_ids=mx.nd.array(list(range(shape[0])), dtype='int64'))
            return out.asnumpy()

        sync = 'async' not in kv.type
        for t in range(self.rounds):
            for j, (name, shape) in enumerate(rsps):
                rows = rsp_sgd_rows(shape[0], n, r, t)
                for st in [kv] + ([local] if local is not None else []):
                    st.push(keys[j], mx.nd.sparse.row_sparse_array(
                        (rsp_data(j, shape, r, t, rows), np.array(rows, np.int64)),
                        shape=shape))
                got = pull(kv, j, shape)     # after this worker's push was applied
                what = 'rsp_sgd %s round %d rep %d' % (name, t, self.rep)
                if local is not None:
                    check(got, pull(local, j, shape), what + ' (against a local store)')
                if sync:       # every worker's push of the round was applied
                    check(got, rsp_sgd_weights(j, shape, n, t + 1), what)
        kv._barrier()          # every worker's pushes were applied
        for j, (name, shape) in enumerate(rsps):
            got = pull(kv, j, shape)
            check(got, rsp_sgd_weights(j, shape, n, self.rounds), 'rsp_sgd final ' + name)
            self.d.add('final %s' % name, got)
        kv._barrier()

    def c2(self):
        mx, kv, n, r = self.mx, self.kv, self.n, self.r
        specs = c2_specs(self.b)
        keys = [self.key(s[0]) for s in specs]
        kv.init(keys, [self.nd(init_value(j, s[1], 'float32')) for j, s in enumerate(specs)])
        for j, (name, shape, _) in enumerate(specs):
            o = mx.nd.zeros(shape)
            kv.pull(keys[j], out=o)
            check(o.asnumpy(), init_value(j, shape, 'float32'), 'init %s' % name)
            self.d.add('init ' + name, o.asnumpy())
        sums = [c2_sums(j, s[1], n, self.rounds) for j, s in enumerate(specs)]
        for t in range(self.rounds):
            for j, (name, shape, devices) in enumerate(specs):
                kv.push(keys[j], self.value(c2_grad(j, shape, r, t), devices, t))
            kv._barrier()
            for j, (name, shape, _) in enumerate(specs):
                o = mx.nd.zeros(shape)
                kv.pull(keys[j], out=o)
                got = o.asnumpy()
                check(got, sums[j][t], '2bit %s round %d rep %d' % (name, t, self.rep))
                self.d.add('pull %s %d' % (name, t), got)
            kv._barrier()

    def run_async(self, local):
        mx, kv, n, r = self.mx, self.kv, self.n, self.r
        specs = dense_specs(self.b)
        exact = n != 1
        keys = [self.key(s[0]) for s in specs]
        kv.init(keys, [self.nd(async_w0(j, s[1], s[2])) for j, s in enumerate(specs)])
        if local is not None:
            local.init(keys, [self.nd(async_w0(j, s[1], s[2])) for j, s in enumerate(specs)])
        for t in range(self.rounds):
            for j, (name, shape, dt, devices) in enumerate(specs):
                g = async_grad(j, shape, dt, r, t, exact)
                kv.push(keys[j], self.value(g, devices, t))
                o = mx.nd.zeros(shape, dtype=dt)
                kv.pull(keys[j], out=o)      # after this worker's push was applied
                if local is not None:
                    local.push(keys[j], self.value(g, devices, t))
                    w = mx.nd.zeros(shape, dtype=dt)
                    local.pull(keys[j], out=w)
                    check(o.asnumpy(), w.asnumpy(),
                          'async %s round %d rep %d (against a local store)'
                          % (name, t, self.rep))
                    self.d.add('async %s %d' % (name, t), o.asnumpy())
        kv._barrier()    # every worker's pushes were applied
        if exact:
            self.pull_dense(specs, 0, 'final',
                            lambda j, s: async_final(j, s[1], s[2], n, self.rounds), False)
        kv._barrier()


def main():
    lib = os.environ.get('T_LIB', 'mxkv')
    role = os.environ.get('DMLC_ROLE', 'worker')
    mx = importlib.import_module(lib)   # scheduler and server nodes serve and exit here
    if role in ('scheduler', 'server'):
        print('import %s returned on a %s node' % (lib, role))
        return 3
    scenario = os.environ.get('T_SCENARIO', 'sums')
    kvtype = os.environ.get('T_KVTYPE', 'dist_async' if scenario == 'async' else 'dist_sync')
    keys_str = os.environ.get('T_KEYS', 'int') == 'str'
    repeats = int(os.environ.get('T_REPEATS', '4'))
    kv = mx.kv.create(kvtype)
    n = kv.num_workers
    assert n == int(os.environ['DMLC_NUM_WORKER']), (n, os.environ['DMLC_NUM_WORKER'])
    if scenario == '2bit':
        kv.set_gradient_compression({'type': '2bit', 'threshold': THRESHOLD})
    local = None
    if scenario in ('async', 'sgd', 'rsp_sgd'):
        kv.set_optimizer(mx.optimizer.SGD(learning_rate=LR))
        if n == 1 and scenario in ('async', 'rsp_sgd'):
            local = mx.kv.create('local')
            local.set_optimizer(mx.optimizer.SGD(learning_rate=LR))
    digests = []
    for rep in range(repeats):
        w = Worker(mx, kv, rep, keys_str)
        if scenario in ('sums', 'sgd'):
            w.sums(sgd=scenario == 'sgd')
        elif scenario == 'rsp':
            w.rsp()
        elif scenario == '2bit':
            w.c2()
        elif scenario == 'async':
            w.run_async(local)
        elif scenario == 'rsp_sgd':
            w.rsp_sgd(local)
        else:
            raise SystemExit('unknown T_SCENARIO %r' % scenario)
        digests.append(w.d.hex())
        print('DIGEST %s %d %s' % (scenario, rep, digests[-1]))
    assert len(set(digests)) == 1, digests
    kv._barrier()
    print('GRID OK %s rank %d of %d digest %s' % (scenario, kv.rank, n, digests[0]))
    return 0


if __name__ == '__main__':
    sys.exit(main())
