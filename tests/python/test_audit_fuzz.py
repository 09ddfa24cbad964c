"""Audit (session 12): a randomized differential fuzz of the local stores, run with fixed
seeds through MXNet 1.9.1 and mxkv in this process; every result (pulled values,
pushpull outputs, what an updater is given, which calls fail, and after every call the
value of every key) must be identical bit for bit.

Four generators:

* ``gen_dense``: every local store type, int keys (negative and large too) or str keys,
  dtypes float16/32/64, int8/32/64, uint8, values on cpu(0..3), single and multi-value
  pushes (up to 40 values in one call, several keys, sums whose float result depends on
  the order), pulls into outputs of other dtypes and devices, pushpull with and without
  `out`, broadcast, lists of keys, optimizers, a Python updater, 2-bit gradient
  compression, save/load of optimizer states.
* ``gen_rsp``: row_sparse keys (or dense ones) of float32 on `local` and `device`:
  row_sparse pushes of one or several values, `row_sparse_pull` with duplicate, unsorted,
  float or int64 row ids into one or several outputs, pulls with ignore_sparse=False,
  pushpull, and the optimizers' row_sparse kernels and fallbacks.
* ``run_c_pushpull``: MXKVStorePushPull and MXKVStoreBroadcast through the C API, with
  output keys of their own, outputs shared by several keys and outputs that are pushed
  values.
* ``run_c_row_sparse_pull``: MXKVStorePullRowSparse with outputs shared by keys and
  repeated for a key, up to 30 triples a call.

The generators stay out of what MXNet 1.9.1 does wrong as README's list of
deviations (the cases where MXNet crashes, overruns its copy buffers, keeps the merge
buffer or the caller's array as the stored value, or swallows an updater's exception);
the seeds were run beforehand in separate processes, so none of them crashes MXNet.
"""
import os
import random

import numpy as np
import pytest

KINDS = ['local', 'device', 'local_update_cpu', 'local_allreduce_cpu', 'local_allreduce_device']
DTYPES = ['float32', 'float64', 'float16', 'int32', 'int64', 'uint8', 'int8']
SHAPES = [(3,), (2, 3), (4, 2), (1,)]


def gen_dense(rng):
    kind = rng.choice(KINDS)
    str_keys = rng.random() < 0.5
    nkeys = rng.randint(1, 4)
    keys = []
    for i in range(nkeys):
        keys.append(('k%d' % i) if str_keys else rng.choice([0, 1, 2, 3, 7, -3, 100]) + i * 1000)
    meta = {k: (rng.choice(SHAPES), rng.choice(DTYPES)) for k in keys}
    ops = []
    inited = set()
    # init some keys
    order = list(keys)
    rng.shuffle(order)
    for k in order:
        if rng.random() < 0.5 or not inited:
            ops.append(('init', [k], [rng.randint(-5, 5)]))
        else:
            ops.append(('init_list', [k], [rng.randint(-5, 5)]))
        inited.add(k)
    first_multi = {}
    gc_on = False
    gc_count = {}
    multi_seen = []

    def count(k, ndev):
        if gc_on:
            if k not in gc_count:
                gc_count[k] = ndev
            return gc_count[k]
        if ndev > 1:
            multi_seen.append(k)
            first_multi.setdefault(k, ndev)
            return min(ndev, first_multi[k])
        return ndev
    for _ in range(rng.randint(3, 12)):
        r = rng.random()
        k = rng.choice(keys)
        if r < 0.35:
            ndev = count(k, rng.choice([1, 1, 2, 3, 4, 5]))
            vals = [(rng.randint(0, 3), rng.uniform(-4, 4), rng.choice([None, None, 'float32', 'float64', 'float16', 'int32']) if j else None) for j in range(ndev)]
            ops.append(('push', k, vals))
        elif r < 0.5:
            ops.append(('pull', k, [(rng.randint(0, 3), rng.choice([None, 'float32', 'float64', 'float16', 'int32', 'uint8'])) for _ in range(rng.randint(1, 3))]))
        elif r < 0.65:
            ndev = count(k, rng.choice([1, 2, 3]))
            vals = [(rng.randint(0, 3), rng.uniform(-4, 4), None) for _ in range(ndev)]
            ops.append(('pushpull', k, vals, rng.random() < 0.5))
        elif r < 0.72 and rng.random() < 0.6 and not gc_on:
            ks = []
            for _ in range(rng.randint(2, 40)):
                ks.append(rng.choice(keys))
            cnt = {}
            for x in ks:
                cnt[x] = cnt.get(x, 0) + 1
            ok = []
            for x in ks:
                c = cnt[x]
                if c > 1:
                    first_multi.setdefault(x, c)
                    if c > first_multi[x]:
                        continue
                    multi_seen.append(x)
                ok.append(x)
            if not ok:
                continue
            ops.append(('multi_push', ok, [(rng.randint(0, 3), rng.choice([1e8, -1e8, 1.0, 0.1, 3e-8, -7.0, 1e4])) for _ in ok]))
        elif r < 0.72:
            ks = rng.sample(keys, rng.randint(1, len(keys)))
            if gc_on and any(gc_count.setdefault(x, 1) != 1 for x in ks):
                continue
            if len(set(ks)) != len(ks):
                multi_seen.append(ks[0])
            ops.append(('multi_push', ks, [(rng.randint(0, 3), rng.uniform(-4, 4)) for _ in ks]))
        elif r < 0.78:
            if multi_seen:
                continue
            dts = set(m[1] for m in meta.values())
            if dts - {'float32', 'float64'}:
                continue
            names = ['sgd', 'sgdm', 'adam', 'nag', 'signum', 'test']
            if dts == {'float32'}:
                names += ['rmsprop', 'adagrad', 'adadelta']
            ops.append(('set_opt', rng.choice(names)))
        elif r < 0.83:
            if multi_seen:
                continue
            ops.append(('updater_add',))
        elif r < 0.88:
            if 'device' in kind and set(m[1] for m in meta.values()) != {'float32'}:
                continue
            if 'device' in kind:
                if gc_on or multi_seen or first_multi:
                    continue
                gc_on = True
            ops.append(('gc', rng.choice(['0.5', '1', '0.25', '2'])))
        elif r < 0.93:
            ops.append(('broadcast', 'b%d' % len(ops) if str_keys else 500 + len(ops), rng.uniform(-3, 3), [rng.randint(0, 3) for _ in range(rng.randint(1, 3))]))
        else:
            ops.append(('save_load',))
    return kind, str_keys, keys, meta, ops


def run_dense(mx, prog, tmpdir):
    kind, str_keys, keys, meta, ops = prog
    res = []
    try:
        kv = mx.kv.create(kind)
    except Exception:  # pylint: disable=broad-except
        return [('create-error',)]
    shapes = dict(meta)

    def val(k, dev, x, dt=None):
        shp, kdt = shapes[k]
        dt = dt or kdt
        a = np.arange(int(np.prod(shp)), dtype='float64').reshape(shp) * 0.37 + x
        return mx.nd.array(a, ctx=mx.cpu(dev), dtype=dt)

    inited = []

    def snapshot():
        out = [repr(inited)]
        for k in inited:
            shp, kdt = shapes[k]
            o = mx.nd.zeros(shp, dtype=kdt)
            try:
                kv.pull(k, out=o)
                out.append(o.asnumpy())
            except Exception:  # pylint: disable=broad-except
                out.append('pull-error')
        return out

    for i, op in enumerate(ops):
        tag = op[0]
        try:
            if tag == 'init':
                k = op[1][0]
                kv.init(k, val(k, 0, op[2][0]))
                inited.append(k)
            elif tag == 'init_list':
                k = op[1][0]
                kv.init([k], [val(k, 0, op[2][0])])
                inited.append(k)
            elif tag == 'push':
                k = op[1]
                vs = [val(k, d, x, dt) for d, x, dt in op[2]]
                kv.push(k, vs if len(vs) > 1 else vs[0])
            elif tag == 'pull':
                k = op[1]
                shp, kdt = shapes[k]
                outs = [mx.nd.zeros(shp, ctx=mx.cpu(d), dtype=dt or kdt) for d, dt in op[2]]
                kv.pull(k, out=outs if len(outs) > 1 else outs[0])
                res.append((i, [o.asnumpy() for o in outs]))
            elif tag == 'pushpull':
                k = op[1]
                vs = [val(k, d, x, dt) for d, x, dt in op[2]]
                if op[3]:
                    kv.pushpull(k, vs if len(vs) > 1 else vs[0])
                    res.append((i, [v.asnumpy() for v in vs]))
                else:
                    shp, kdt = shapes[k]
                    outs = [mx.nd.zeros(shp, ctx=mx.cpu(d), dtype=kdt) for d, _, _ in op[2]]
                    kv.pushpull(k, vs if len(vs) > 1 else vs[0], out=outs if len(outs) > 1 else outs[0])
                    res.append((i, [o.asnumpy() for o in outs]))
            elif tag == 'multi_push':
                ks = op[1]
                vs = [val(k, d, x) for k, (d, x) in zip(ks, op[2])]
                kv.push(ks, vs)
            elif tag == 'set_opt':
                name = op[1]
                if name == 'sgdm':
                    o = mx.optimizer.create('sgd', momentum=0.9, learning_rate=0.1)
                else:
                    o = mx.optimizer.create(name)
                kv.set_optimizer(o)
            elif tag == 'updater_add':
                def upd(key, recv, local):
                    res.append(('upd', str(key), str(recv.context), str(recv.dtype), recv.stype, str(local.dtype), recv.asnumpy()))
                    local += recv * 2
                kv._set_updater(upd)
            elif tag == 'gc':
                kv.set_gradient_compression({'type': '2bit', 'threshold': op[1]})
            elif tag == 'broadcast':
                k = op[1]
                shapes[k] = ((2, 2), 'float32')
                outs = [mx.nd.zeros((2, 2), ctx=mx.cpu(d)) for d in op[3]]
                kv.broadcast(k, val(k, 0, op[2]), out=outs)
                inited.append(k)
                res.append((i, [o.asnumpy() for o in outs]))
            elif tag == 'save_load':
                fn = os.path.join(tmpdir, '%s_%d.st' % (mx.__name__, i))
                kv.save_optimizer_states(fn)
                kv.load_optimizer_states(fn)
            mx.nd.waitall()
            res.append((i, 'ok'))
        except Exception:  # pylint: disable=broad-except
            res.append((i, 'error'))
            try:
                mx.nd.waitall()
            except Exception:  # pylint: disable=broad-except
                pass
        res.append((i, 'snap', snapshot()))
    return res


RSP_SHAPES = [(6, 2), (5, 3), (4, 1)]


def gen_rsp(rng):
    kind = rng.choice(['local', 'device'])
    nkeys = rng.randint(1, 3)
    keys = list(range(nkeys))
    meta = {}
    for k in keys:
        meta[k] = (rng.choice(RSP_SHAPES), rng.choice(['rsp', 'rsp', 'dense']), rng.choice([1, 2, 3]))
    ops = []
    allfull = True
    pushed = False
    for k in keys:
        shp, st, cnt = meta[k]
        full = rng.random() < 0.5
        allfull = allfull and (full or st == 'dense')
        rows = list(range(shp[0])) if full else sorted(rng.sample(range(shp[0]), rng.randint(0, shp[0])))
        ops.append(('init', k, rows, rng.uniform(-2, 2)))
    multi = False
    for _ in range(rng.randint(3, 14)):
        r = rng.random()
        k = rng.choice(keys)
        shp, st, cnt = meta[k]
        if r < 0.4:
            pushed = True
            n = cnt if rng.random() < 0.7 else 1
            if n > 1:
                multi = True
            vals = []
            for _ in range(n):
                rows = sorted(rng.sample(range(shp[0]), rng.randint(0, shp[0])))
                vals.append((rows, rng.uniform(-3, 3), rng.randint(0, 3)))
            ops.append(('push', k, vals))
        elif r < 0.6:
            ids = [rng.randint(0, shp[0] - 1) for _ in range(rng.randint(0, 6))]
            ops.append(('rsp_pull', k, ids, rng.choice(['float32', 'int64']), rng.randint(1, 3)))
        elif r < 0.7:
            ops.append(('pull', k))
        elif r < 0.8:
            if multi or pushed or not allfull:
                continue
            name = rng.choice(['sgd', 'sgd_lazy_mom', 'sgd_std_mom', 'adam', 'adam_std', 'adagrad', 'nag', 'signum', 'rmsprop'])
            ops.append(('opt', name))
        elif r < 0.9:
            ks = [rng.choice(keys) for _ in range(rng.randint(1, 4))]
            ops.append(('rsp_pull_multi', ks, [[rng.randint(0, meta[x][0][0] - 1) for _ in range(3)] for x in ks]))
        else:
            pushed = True
            n = cnt
            vals = []
            for _ in range(n):
                rows = sorted(rng.sample(range(shp[0]), rng.randint(0, shp[0])))
                vals.append((rows, rng.uniform(-3, 3), rng.randint(0, 3)))
            if n > 1:
                multi = True
            ops.append(('pushpull', k, vals))
    return kind, meta, ops


def run_rsp(mx, prog):
    kind, meta, ops = prog
    kv = mx.kv.create(kind)
    res = []

    def mk(k, rows, x, dev=0):
        shp, st, _ = meta[k]
        data = (np.arange(len(rows) * shp[1]).reshape(len(rows), shp[1]) * 0.25 + x).astype('float32')
        if st == 'dense':
            d = np.zeros(shp, dtype='float32')
            if rows:
                d[rows] = data
            return mx.nd.array(d, ctx=mx.cpu(dev))
        return mx.nd.sparse.row_sparse_array((data, np.array(rows, dtype='int64')), shape=shp, ctx=mx.cpu(dev))

    def show(a):
        if a.stype == 'row_sparse':
            return ('rsp', a.indices.asnumpy(), a.data.asnumpy())
        return a.asnumpy()

    inited = []
    for i, op in enumerate(ops):
        try:
            t = op[0]
            if t == 'init':
                kv.init(op[1], mk(op[1], op[2], op[3]))
                inited.append(op[1])
            elif t == 'push':
                vs = [mk(op[1], r, x, d) for r, x, d in op[2]]
                kv.push(op[1], vs if len(vs) > 1 else vs[0])
            elif t == 'pushpull':
                vs = [mk(op[1], r, x, d) for r, x, d in op[2]]
                kv.pushpull(op[1], vs if len(vs) > 1 else vs[0])
                res.append((i, [show(v) for v in vs]))
            elif t == 'rsp_pull':
                shp = meta[op[1]][0]
                outs = [mx.nd.sparse.zeros('row_sparse', shp) for _ in range(op[4])]
                kv.row_sparse_pull(op[1], out=outs if len(outs) > 1 else outs[0],
                                   row_ids=mx.nd.array(op[2], dtype=op[3]))
                res.append((i, [show(o) for o in outs]))
            elif t == 'rsp_pull_multi':
                outs = [mx.nd.sparse.zeros('row_sparse', meta[k][0]) for k in op[1]]
                kv.row_sparse_pull(op[1], out=outs, row_ids=[mx.nd.array(r) for r in op[2]])
                res.append((i, [show(o) for o in outs]))
            elif t == 'pull':
                shp = meta[op[1]][0]
                o = mx.nd.zeros(shp)
                kv.pull(op[1], out=o, ignore_sparse=False)
                res.append((i, show(o)))
            elif t == 'opt':
                n = op[1]
                o = {'sgd': lambda: mx.optimizer.SGD(learning_rate=0.5),
                     'sgd_lazy_mom': lambda: mx.optimizer.SGD(learning_rate=0.5, momentum=0.9, wd=0.1),
                     'sgd_std_mom': lambda: mx.optimizer.SGD(learning_rate=0.5, momentum=0.9, lazy_update=False, wd=0.1),
                     'adam': lambda: mx.optimizer.Adam(learning_rate=0.1, wd=0.01),
                     'adam_std': lambda: mx.optimizer.Adam(learning_rate=0.1, lazy_update=False),
                     'adagrad': lambda: mx.optimizer.AdaGrad(learning_rate=0.1),
                     'nag': lambda: mx.optimizer.NAG(learning_rate=0.1, momentum=0.5),
                     'signum': lambda: mx.optimizer.Signum(learning_rate=0.1),
                     'rmsprop': lambda: mx.optimizer.RMSProp(learning_rate=0.1)}[n]()
                kv.set_optimizer(o)
            mx.nd.waitall()
            res.append((i, 'ok'))
        except Exception:  # pylint: disable=broad-except
            res.append((i, 'error'))
            try:
                mx.nd.waitall()
            except Exception:  # pylint: disable=broad-except
                pass
        snap = []
        for k in inited:
            o = mx.nd.zeros(meta[k][0])
            try:
                kv.pull(k, out=o, ignore_sparse=False)
                snap.append(o.asnumpy())
            except Exception:  # pylint: disable=broad-except
                snap.append('pull-error')
        res.append((i, 'snap', snap))
    return res


def _same(a, b, where):
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        assert isinstance(a, np.ndarray) and isinstance(b, np.ndarray), where
        assert (a.dtype, a.shape, a.tobytes()) == (b.dtype, b.shape, b.tobytes()), \
            '%s:\n mxnet: %r\n mxkv:  %r' % (where, a, b)
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), \
            '%s:\n mxnet: %r\n mxkv:  %r' % (where, a, b)
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, '%s[%d]' % (where, i))
    else:
        assert a == b, '%s:\n mxnet: %r\n mxkv:  %r' % (where, a, b)


def _compare(prog, a, b, seed):
    ops = prog[-1]
    for x, y in zip(a, b):
        op = ops[x[0]] if isinstance(x[0], int) and x[0] < len(ops) else x[:2]
        _same(x, y, 'seed %d, op %r' % (seed, op))
    assert len(a) == len(b), 'seed %d: %d results from MXNet, %d from mxkv' % (seed, len(a), len(b))


@pytest.mark.parametrize('chunk', range(4))
def test_dense_fuzz(both, tmp_path, chunk):
    mxnet, mxkv = both
    for seed in range(chunk * 40, chunk * 40 + 40):
        prog = gen_dense(random.Random(seed))
        _compare(prog, run_dense(mxnet, prog, str(tmp_path)), run_dense(mxkv, prog, str(tmp_path)),
                 seed)


@pytest.mark.parametrize('chunk', range(4))
def test_row_sparse_fuzz(both, chunk):
    mxnet, mxkv = both
    for seed in range(chunk * 40, chunk * 40 + 40):
        prog = gen_rsp(random.Random(seed))
        _compare(prog, run_rsp(mxnet, prog), run_rsp(mxkv, prog), seed)


# --- MXKVStorePushPull / MXKVStoreBroadcast through the C API -------------------------
# (the Python frontend always pulls the keys it pushes): keys of their own for the
# outputs, outputs of other dtypes, outputs shared by several keys, outputs that are
# pushed values (where MXNet's stored value is not the caller's array: several values
# of that key, or an updater).
def run_c_pushpull(mx, seed, trials):
    import ctypes
    rng = random.Random(seed)
    out = []

    def ckeys(ks):
        return (ctypes.c_int * max(len(ks), 1))(*ks)

    def handles(arrs):
        return (ctypes.c_void_p * max(len(arrs), 1))(*[a.handle.value for a in arrs])

    for trial in range(trials):
        kind = rng.choice(['local', 'device'])
        kv = mx.kv.create(kind)
        nk = rng.randint(1, 4)
        shapes = {k: (rng.choice([2, 3]),) for k in range(nk)}
        kv.init(list(range(nk)),
                [mx.nd.array(np.arange(shapes[k][0]) + k * 10.0) for k in range(nk)])
        has_upd = rng.random() < 0.3
        if has_upd:
            def upd(key, recv, local):
                local[:] = local * 2 + recv
            kv._set_updater(upd)
        res = []
        first = {}   # values of a key at its first multi-value push (MXNet's buffers)
        for step in range(4):
            op = rng.choice(['pushpull', 'broadcast'])
            vk = [rng.randrange(nk) for _ in range(rng.randint(0, 3))]
            if op == 'broadcast':
                vk = []
            keep = []
            for k in vk:
                if vk.count(k) > 1 and vk.count(k) > first.setdefault(k, vk.count(k)):
                    continue
                keep.append(k)
            vk = keep
            if op == 'broadcast':
                shapes[100 + step] = (2,)
                vk = [100 + step]
            ok = [rng.choice(list(shapes)) for _ in range(rng.randint(0, 3))]
            vals = [mx.nd.array(np.ones(shapes[k]) * rng.uniform(-3, 3),
                                ctx=mx.cpu(rng.randint(0, 2))) for k in vk]
            outs = [mx.nd.zeros(shapes[k], dtype=rng.choice(['float32', 'float64', 'int32']))
                    for k in ok]
            if outs and vals and rng.random() < 0.5:
                i, j = rng.randrange(len(outs)), rng.randrange(len(vals))
                if (op == 'pushpull' and shapes[ok[i]] == shapes[vk[j]]
                        and (has_upd or vk.count(vk[j]) > 1)):
                    outs[i] = vals[j]
            if len(outs) > 1 and rng.random() < 0.5:
                i, j = rng.randrange(len(outs)), rng.randrange(len(outs))
                if shapes[ok[i]] == shapes[ok[j]] and not any(outs[j] is v for v in vals):
                    outs[i] = outs[j]
            fn = mx.base._LIB.MXKVStorePushPull if op == 'pushpull' \
                else mx.base._LIB.MXKVStoreBroadcast
            rc = fn(kv.handle, len(vk), ckeys(vk), len(ok), ckeys(ok), handles(vals),
                    handles(outs), 0)
            try:
                mx.nd.waitall()
            except Exception:  # pylint: disable=broad-except
                rc = 'async error'
            snap = []
            for k in sorted(shapes):
                o = mx.nd.zeros(shapes[k])
                try:
                    kv.pull(k, out=o)
                    snap.append(o.asnumpy())
                except Exception:  # pylint: disable=broad-except
                    snap.append('pull-error')
            res.append((op, vk, ok, rc, [o.asnumpy() for o in outs], snap))
        out.append((trial, kind, res))
    return out


@pytest.mark.parametrize('seed', range(1, 4))
def test_c_pushpull_broadcast_fuzz(both, seed):
    mxnet, mxkv = both
    _same(run_c_pushpull(mxnet, seed, 100), run_c_pushpull(mxkv, seed, 100), 'seed %d' % seed)


# --- MXKVStorePullRowSparse with many (key, output, row ids) triples ---------------------
# outputs shared by keys and repeated for one key, more than 16 triples (libstdc++'s
# std::sort then permutes a key's triples), empty row ids.
def run_c_row_sparse_pull(mx, seed, trials):
    import ctypes
    rng = random.Random(seed)
    res = []
    rows_n = 6
    for trial in range(trials):
        kind = rng.choice(['local', 'device'])
        kv = mx.kv.create(kind)
        nk = rng.randint(1, 3)
        kv.init(list(range(nk)), [mx.nd.sparse.row_sparse_array(
            (np.arange(rows_n * 2).reshape(rows_n, 2).astype('float32') + 100 * k,
             np.arange(rows_n)), shape=(rows_n, 2)) for k in range(nk)])
        pool = [mx.nd.sparse.zeros('row_sparse', (rows_n, 2)) for _ in range(rng.randint(1, 4))]
        n = rng.choice([1, 2, 5, 17, 20, 30])
        keys = [rng.randrange(nk) for _ in range(n)]
        outs = [rng.choice(pool) for _ in range(n)]
        rows = [mx.nd.array(sorted(rng.sample(range(rows_n), rng.randint(0, rows_n))),
                            dtype='int64') for _ in range(n)]
        rc = mx.base._LIB.MXKVStorePullRowSparse(
            kv.handle, n, (ctypes.c_int * n)(*keys),
            (ctypes.c_void_p * n)(*[o.handle.value for o in outs]),
            (ctypes.c_void_p * n)(*[r.handle.value for r in rows]), 0)
        mx.nd.waitall()
        res.append((trial, kind, n, rc, [(p.indices.asnumpy(), p.data.asnumpy()) for p in pool]))
    return res


def test_c_row_sparse_pull_fuzz(both):
    mxnet, mxkv = both
    _same(run_c_row_sparse_pull(mxnet, 1, 200), run_c_row_sparse_pull(mxkv, 1, 200), 'seed 1')
