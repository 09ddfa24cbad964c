"""A dist worker for tests/python/test_dist_pull_outputs.py: one script for ``import mxnet``
(real MXNet 1.9.1) and ``import mxkv``, chosen by ``T_LIB`` (default ``mxkv``). Every node
runs it; the import serves the scheduler and server roles and exits there.

It runs the cases :func:`cases` lists (on MXNet all but those :func:`mxnet_crashes` names;
``T_KVTYPE``: the store type, default ``dist_sync``) on a 1-worker job, each on a fresh key: the key is initialised, then after ``kv._barrier()`` pulled, pushpulled,
row_sparse_pulled or broadcast into outputs of several storage types, dtypes and contexts
that are filled with a marker first. A pushpull pushes the key's own value, so the result
does not depend on whether a real MXNet server answered before or after it stored the sum.
Per case one line ``CASE <json>``: the error raised by the call, the error raised by waiting
on the outputs (MXNet fails there for errors of its engine), and every output afterwards
(storage type, dtype, context, its dense value as hex bytes), or the error reading it.
"""
import importlib
import json
import os
import sys
import traceback

import numpy as np

SHAPE = (4, 3)
MARK = 7.0
CTXS = ('cpu0', 'cpu1', 'pinned')
DTYPES = ('float32', 'float64', 'float16')
STYPES = ('default', 'row_sparse', 'csr')


def key_value(dtype):
    """values every dtype rounds: float16 keeps 11 bits, float32 24 of float64's"""
    v = (np.arange(12, dtype=np.float64).reshape(SHAPE) + 1) * 0.1 + 1.0 / 3
    return v.astype(dtype)


def cases():
    """(op, key, outputs): key = (stype, dtype, ctx of the init value), outputs =
    [(stype, dtype, ctx)]; op one of pull, pull_nois (ignore_sparse=False), pushpull,
    rsp_pull (rows [0, 2]), broadcast (of the key's value: no init before)"""
    out = []
    every = [(s, d, c) for s in STYPES for d in DTYPES for c in CTXS]
    for kd in DTYPES:
        dense = ('default', kd, 'cpu0')
        # a dense key into one output of every kind, then as a later output after one of
        # the key's dtype, and before one
        for op in ('pull', 'pushpull'):
            for o in every:
                out.append((op, dense, [o]))
            for o in every:
                out.append((op, dense, [('default', kd, 'cpu0'), o]))
            for o in [(s, d, 'cpu0') for s in ('row_sparse', 'csr') for d in DTYPES]:
                out.append((op, dense, [o, ('default', kd, 'cpu1')]))
                out.append((op, dense, [o, ('default', 'float64' if kd != 'float64'
                                            else 'float32', 'cpu0')]))
        # the init value on another context (where MXNet receives the pull)
        for ic in ('cpu1', 'pinned'):
            for o in [('default', d, c) for d in DTYPES for c in CTXS]:
                out.append(('pull', ('default', kd, ic), [o]))
            for o in [('row_sparse', kd, 'cpu0'), ('csr', kd, ic)]:
                out.append(('pull', ('default', kd, ic), [('default', kd, ic), o]))
        for o in [(s, d, 'cpu0') for s in STYPES for d in DTYPES]:
            out.append(('pull_nois', dense, [o]))
            out.append(('rsp_pull', dense, [o]))
        for o in every:
            out.append(('broadcast', dense, [o]))
        # a row_sparse key
        for ic in ('cpu0', 'cpu1'):
            for o in every:
                out.append(('rsp_pull', ('row_sparse', kd, ic), [o]))
        for o in [(s, kd, c) for s in STYPES for c in ('cpu0', 'pinned')]:
            out.append(('pull', ('row_sparse', kd, 'cpu0'), [o]))
            out.append(('broadcast', ('row_sparse', kd, 'cpu0'), [o]))
        out.append(('pull', ('row_sparse', kd, 'cpu0'),
                    [('row_sparse', kd, 'cpu0'), ('default', kd, 'cpu0')]))
    return out


def mxnet_crashes(case):
    """MXNet 1.9.1 sends a dense pull of a row_sparse key when one of its pull outputs is
    dense (a pull, or a broadcast's pull): its server aborts (kvstore_dist_server.h:697
    Check failed: req_data.keys.size() == (size_t)1)"""
    op, key, outs = case
    return (op in ('pull', 'broadcast') and key[0] == 'row_sparse'
            and any(o[0] == 'default' for o in outs))


def main():
    lib = os.environ.get('T_LIB', 'mxkv')
    role = os.environ.get('DMLC_ROLE', 'worker')
    mx = importlib.import_module(lib)   # scheduler and server nodes serve and exit here
    if role in ('scheduler', 'server'):
        print('import %s returned on a %s node' % (lib, role))
        return 3
    ctxs = {'cpu0': mx.cpu(0), 'cpu1': mx.cpu(1), 'pinned': mx.cpu_pinned(0)}
    kv = mx.kv.create(os.environ.get('T_KVTYPE', 'dist_sync'))
    local = mx.kv.create('local')
    assert kv.num_workers == 1, kv.num_workers
    all_cases = cases()
    idx = [i for i, c in enumerate(all_cases) if lib == 'mxkv' or not mxnet_crashes(c)]

    def make(stype, dtype, ctx, value):
        """made by constructors that keep the context in both libraries (MXNet's
        tostype of a cpu_pinned array is on cpu(0))"""
        c = ctxs[ctx]
        if stype == 'default':
            return mx.nd.array(value, ctx=c, dtype=dtype)
        rows = np.flatnonzero((value != 0).any(axis=1))
        if stype == 'row_sparse':
            return mx.nd.sparse.row_sparse_array((value[rows], rows), shape=SHAPE, ctx=c,
                                                 dtype=dtype)
        nz = value != 0
        return mx.nd.sparse.csr_matrix(
            (value[nz], np.nonzero(nz)[1], np.concatenate([[0], np.cumsum(nz.sum(axis=1))])),
            shape=SHAPE, ctx=c, dtype=dtype)


    for i in idx:
        op, (kst, kd, kc), outs = all_cases[i]
        key = 100 + i
        v = key_value(kd)
        value = make(kst, kd, kc, v)
        arrays = [make(s, d, c, np.full(SHAPE, MARK)) for (s, d, c) in outs]
        res = {'case': i, 'before': read(arrays)}
        try:
            if op != 'broadcast':
                kv.init(key, value)
            kv._barrier()
            if op == 'pull':
                kv.pull(key, out=arrays if len(arrays) > 1 else arrays[0])
            elif op == 'pull_nois':
                kv.pull(key, out=arrays[0], ignore_sparse=False)
            elif op == 'pushpull':
                kv.pushpull(key, make(kst, kd, 'cpu0', v),
                            out=arrays if len(arrays) > 1 else arrays[0])
            elif op == 'rsp_pull':
                kv.row_sparse_pull(key, out=arrays[0],
                                   row_ids=mx.nd.array([0, 2], dtype='int64'))
            elif op == 'broadcast':
                kv.broadcast(key, value, out=arrays if len(arrays) > 1 else arrays[0])
            res['call'] = None
        except Exception as e:   # noqa: BLE001  (MXNetError and the frontend's own)
            res['call'] = err(e)
            if op == 'broadcast':    # the key was inited, or not
                try:
                    kv.init(key, value)
                    res['inited'] = False
                except Exception:   # noqa: BLE001
                    res['inited'] = True
        try:
            for a in arrays:
                a.wait_to_read()
            res['wait'] = None
        except Exception as e:   # noqa: BLE001
            res['wait'] = err(e)
        try:
            mx.nd.waitall()
        except Exception as e:   # noqa: BLE001
            res['wait'] = res['wait'] or err(e)
        res['outs'] = read(arrays)
        if op == 'pull_nois':
            # what a dist store does with the call MXNet's refuses (README deviation 22) is
            # what the local store does with it, given the value the servers hold (a dist
            # server keeps float64 values in float32)
            held = mx.nd.zeros(SHAPE, dtype=kd)
            kv.pull(key, out=held)
            arrays = [make(s, d, c, np.full(SHAPE, MARK)) for (s, d, c) in outs]
            try:
                local.init(key, held)
                local.pull(key, out=arrays[0], ignore_sparse=False)
                for a in arrays:
                    a.wait_to_read()
                res['local'] = None
            except Exception as e:   # noqa: BLE001
                res['local'] = err(e)
            try:
                mx.nd.waitall()
            except Exception as e:   # noqa: BLE001
                res['local'] = res['local'] or err(e)
            res['local_outs'] = read(arrays)
        print('CASE ' + json.dumps(res), flush=True)
    kv._barrier()
    print('PULL OUTPUTS DONE %d' % len(idx), flush=True)
    return 0


def err(e):
    """MXNet's check (its text has a traceback first), else the first line"""
    lines = [x.strip() for x in str(e).splitlines() if x.strip()]
    checks = [x for x in lines if 'Check failed' in x]
    return '%s: %s' % (type(e).__name__, (checks or lines or [''])[0])


def read(arrays):
    """each array's storage type, dtype, context, dense value (hex) and indices"""
    got = []
    for a in arrays:
        try:
            d = a.asnumpy()
            aux = ([a.indices.asnumpy().tolist()] if a.stype == 'row_sparse' else
                   [a.indptr.asnumpy().tolist(), a.indices.asnumpy().tolist()]
                   if a.stype == 'csr' else [])
            got.append([a.stype, np.dtype(a.dtype).name, str(a.context), d.tobytes().hex(),
                        aux])
        except Exception as e:   # noqa: BLE001
            got.append(err(e))
    return got


if __name__ == '__main__':
    try:
        sys.exit(main())
    except SystemExit:
        raise
    except BaseException:
        traceback.print_exc()
        sys.exit(1)
