"""A seeded scenario fuzz of the distributed store, differential against MXNet 1.9.1.

From a seed, :func:`generate` makes one job: a store type (``dist_sync``,
``dist_device_sync``, ``dist_async``), 1-2 workers, 1-2 servers, a low
``MXNET_KVSTORE_BIGARRAY_BOUND`` (so some keys are split over the servers), int or str keys
of random shapes and float dtypes (float32/float64/float16, dense and row_sparse), maybe
2-bit gradient compression and maybe ``set_optimizer(SGD)`` with or without momentum, and a
list of operations every worker runs: init (one call or several, or a broadcast), rounds of
push / pushpull (several devices' values, row_sparse rows) followed by ``kv._barrier()``,
then pull / row_sparse_pull / broadcast reads, misuse at the call, and a barrier before the
next round. Values depend on the worker's rank, the operation and the device, and are
multiples of 1/8 (1/4 with compression), so every sum is exact in every dtype and order.

The same scenario runs on an all-MXNet cluster (``import mxnet as mx``) and an all-mxkv
cluster (``import mxkv as mx``), both started by ``mxkv_launch.py`` on 127.0.0.1 with ports
chosen at run time, under the launcher's ``--timeout`` and a deadline on the launcher; every
node carries a tag and leftovers are killed by pid. Each worker writes one JSON line per
operation: the outputs it wrote (storage type, dtype, shape, bytes, row indices) or the
exception (class hierarchy, message; at the call or at the wait after it).
:func:`compare` then checks, worker by worker, operation by operation: MXNet's exception
class among mxkv's classes, and outputs bit for bit where the comparison means something;
and on mxkv alone, that every worker read the same values (every read follows a barrier).

``ext`` scenarios (a second random stream, so the plain scenario of a seed stays the same)
add priorities, init values on cpu(1)/cpu(2)/cpu_pinned(0), a key twice in one pull, the
``dist_sync_device`` spelling and pushes on ``dist_async`` with SGD on the servers. ``wild``
scenarios keep the output dtypes MXNet crashes on (below): mxkv runs them, and its outputs
must be MXNet's outputs of the plain scenario converted.

What a real MXNet cluster does not give deterministically, and is therefore not compared
(the generator marks it, ``cmp`` False, or avoids it; reason in the op's ``why``):

* values read with an optimizer on the servers (MXNet's server runs the Python optimizer
  asynchronously: a pull may see the weight before the update landed) -- their exception
  classes are still compared;
* pushpull outputs (a real server may answer the pull part before the round's sum is
  stored); the sum itself is compared through the pulls after the next barrier;
* pushes on ``dist_async`` (without an updater MXNet's server aborts on them: so async jobs
  only init, pull, broadcast and row_sparse_pull);
* integer dtypes (MXNet's server dies on them; mxkv refuses them, README deviation 14);
* row_sparse rounds that leave rows out (MXNet's server table shrinks to the pushed rows,
  README deviation 14): every round's pushes cover every row;
* compression on row_sparse or non-float32 keys, pushpull with compression (refused by
  both, at different moments: deviation 14), compressed keys of fewer than 16 values per
  server (MXNet's split wraps a size_t);
* pulls of keys never initialised (MXNet's server aborts), row_sparse keys pulled into dense
  outputs (MXNet's server aborts; deviation 22), ``pull(ignore_sparse=False)`` (deviation 22);
* a push of more values for a key than its first push (MXNet's worker segfaults, deviation
  6): every push of a key has the same number of values;
* on jobs of 2 workers, pull / broadcast outputs whose first output has another dtype than
  the key, and row_sparse_pull outputs of another dtype: MXNet's worker of rank 1 sizes the
  request by the output's dtype, the server answers in the key's, and the worker aborts
  (ps-lite kv_app.h:689 ``vals->size() == total_val``) or reads the bytes as the other dtype
  (row_sparse_pull); rank 0 is safe (it sized the key at its init push). Probed on 1 and 2
  servers, small and split keys, float16/32/64: every mixed pair aborts on rank 1. mxkv
  converts (1-worker jobs still pull into other dtypes);
* with compression on, pull outputs other than float32 (MXNet's server aborts: 'Gradient
  compression is currently supported for fp32 only'), and pushes of another shape (MXNet's
  compressed push takes them; deviation 3);
* multi-key pushpulls whose first output of a key has another dtype (MXNet refuses the call
  when it reaches that key, having pushed the keys before it; mxkv refuses it whole before
  sending anything, deviation 22): the first outputs of such calls have the key's dtype;
* misuse that MXNet refuses but that breaks its store afterwards (a push or pull of another
  shape leaves MXNet's buffers of that shape, and later pulls of the key fail; a
  row_sparse_pull of a dense key fails at the wait and a later push of the key crashed the
  worker): at most one, after the last reads.

CLI: ``python dist_fuzz.py drive FIRST COUNT [wild]`` runs seeds FIRST..FIRST+COUNT-1 and
prints every difference (``wild``: mxkv runs the wild scenario, which keeps the pull output
dtypes MXNet crashes on, and its outputs must be MXNet's tame ones converted); ``show SEED`` prints a scenario; ``explain SEED`` runs it and prints both
results of every operation. Node side: ``python dist_fuzz.py node`` (run by the launcher).
"""
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import uuid

from distproc import communicate_or_stop, reap

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, '..', '..'))
BINDINGS = os.path.join(REPO, 'bindings', 'python')
LAUNCH = os.path.join(BINDINGS, 'mxkv_launch.py')
PY = sys.executable

KVTYPES = ['dist_sync', 'dist_sync', 'dist_sync', 'dist_device_sync', 'dist_device_sync',
           'dist_async']
DTYPES = ['float32', 'float32', 'float64', 'float16']
INT_KEYS = [0, 1, 2, 3, 5, 7, 9, 12, 17, 100]
STR_KEYS = ['a', 'b', 'w0', 'w1', 'bias', 'x.y', 'emb', 'k9', 'fc1_weight', 'z']
THRESHOLD = 0.5


# --- the generator -----------------------------------------------------------------
class _Gen(object):
    def __init__(self, seed, wild=False, ext=False):
        r = self.r = random.Random(seed)
        self.seed = seed
        self.wild = wild
        # ext: additions drawn from a second random stream, so that the ext scenario is the
        # plain one plus them (the committed seeds keep their scenarios)
        self.ext = ext
        x = self.x = random.Random(seed * 7919 + 17)
        self.kvtype = r.choice(KVTYPES)
        self.workers = r.randint(1, 2)
        self.servers = r.randint(1, 2)
        self.bound = r.choice([16, 24, 40])
        self.str_keys = r.random() < 0.5
        sync = self.kvtype != 'dist_async'
        self.gc = sync and r.random() < 0.3
        self.opt = None
        if sync and r.random() < 0.25:
            self.opt = {'learning_rate': 0.5, 'momentum': r.choice([0.0, 0.9])}
        self.async_opt = False
        if ext:
            if self.kvtype == 'dist_device_sync' and x.random() < 0.5:
                self.kvtype = 'dist_sync_device'
            if not sync and x.random() < 0.6:
                # pushes on dist_async with SGD on the servers (MXNet's server needs an
                # updater in async mode); the values are racy on MXNet: not compared
                self.async_opt = True
                self.opt = {'learning_rate': 0.5, 'momentum': x.choice([0.0, 0.9])}
        pool = list(STR_KEYS if self.str_keys else INT_KEYS)
        r.shuffle(pool)
        self.keys = pool[:r.randint(2, 5)]
        self.meta = {}
        for k in self.keys:
            big = r.random() < 0.4
            if not self.gc and r.random() < 0.3:
                rows = r.randint(self.bound // 3 + 2, self.bound // 2 + 8) if big \
                    else r.randint(2, 5)
                cols = r.randint(2, 4)
                self.meta[k] = {'st': 'r', 'shape': [rows, cols], 'dt': r.choice(DTYPES)}
                continue
            if self.gc:
                dt = 'float32'
                if big:   # at least 16 values per server
                    n = max(self.bound + 1, 16 * self.servers + 4) + r.randint(0, 9)
                    shape = [n] if r.random() < 0.5 else [n // 3 + 1, 3]
                else:
                    shape = r.choice([[3], [2, 3], [4, 2], [5]])
            else:
                dt = r.choice(DTYPES)
                if big:
                    n = self.bound + r.randint(1, 30)
                    shape = r.choice([[n], [n // 4 + 1, 4], [n // 6 + 1, 2, 3]])
                else:
                    shape = r.choice([[3], [2, 3], [4, 2], [5], [1], [2, 2, 2]])
            self.meta[k] = {'st': 'd', 'shape': shape, 'dt': dt}
        for k in self.keys:
            # every push of a key has the same number of values: MXNet's copy buffer has
            # the size of the first push, and a later push of more values overruns it
            # (segfault; README deviation 6)
            self.meta[k]['nval'] = self.ndev()
        self.ops = []

    def ndev(self):
        return self.r.choice([1, 1, 2, 3])

    def add(self, op, **kw):
        op.update(kw)
        op['i'] = len(self.ops)
        if self.ext:
            x = self.x
            if op['op'] in ('push', 'pull', 'pushpull', 'rsp_pull') and x.random() < 0.3:
                op['prio'] = x.randint(-3, 3)
            if op['op'] in ('init', 'broadcast') and x.random() < 0.4:
                # init values on another context: cpu(1), cpu(2) or cpu_pinned(0)
                op['ctx'] = [x.choice([1, 2, -1]) for _ in op['keys']]
        self.ops.append(op)

    # --- values: described here, made by the worker (see _value) ---
    def init_ops(self):
        r = self.r
        left = list(self.keys)
        r.shuffle(left)
        while left:
            n = r.randint(1, len(left))
            ks, left = left[:n], left[n:]
            dense = [k for k in ks if self.meta[k]['st'] == 'd']
            if len(ks) == len(dense) and r.random() < 0.3:
                # broadcast: init + pull into outputs (after the init's barrier: exact)
                outs = [self.outs(k) for k in ks]
                self.add({'op': 'broadcast', 'keys': ks, 'outs': outs,
                          'cmp': self.opt is None})
            else:
                self.add({'op': 'init', 'keys': ks, 'single': len(ks) == 1 and
                          r.random() < 0.5})

    def outs(self, k, n=None):
        """pull outputs of dense key k: 1-3 dense outputs, any float dtype and cpu device"""
        r, m = self.r, self.meta[k]
        n = n or self.ndev()
        if self.gc:
            # with compression on, MXNet's server aborts on a pull whose output is not
            # float32 ('Gradient compression is currently supported for fp32 only', seed 8)
            outs = [{'dt': 'float32', 'dev': r.randint(0, 2)} for _ in range(n)]
            if self.wild:   # (no random draws: the tame scenario stays the same)
                for j, o in enumerate(outs):
                    if (len(self.ops) + j) % 3 == 1:
                        self.fix(o, ('float16', 'float64')[j % 2], 'float32')
            return outs
        outs = [{'dt': m['dt'] if r.random() < 0.7 else r.choice(DTYPES),
                 'dev': r.randint(0, 2)} for _ in range(n)]
        if self.workers > 1:
            # a worker of rank >= 1 whose pull's first output has another dtype than the
            # key aborts in MXNet 1.9.1 (ps-lite kv_app.h:689 'vals->size() == total_val':
            # its request is sized by the output's dtype, the server answers in the key's;
            # rank 0 sized the key at its init push). mxkv converts (seeds 9 and 17)
            self.fix(outs[0], outs[0]['dt'], m['dt'])
        return outs

    def fix(self, o, wild, tame):
        """output o gets dtype tame (what MXNet runs without crashing), or in a wild
        scenario dtype wild, noting the tame one (mxkv's wild output must be MXNet's tame
        output converted)"""
        o['dt'] = wild if self.wild else tame
        if self.wild and wild != tame:
            o['tame'] = tame

    def rsp_outs(self, k):
        r, m = self.r, self.meta[k]
        n = 1
        rows = m['shape'][0]
        ids = []
        for _ in range(n):
            c = r.random()
            if c < 0.3:
                ids.append(list(range(rows)))
            elif c < 0.8:
                ids.append(sorted(r.sample(range(rows), r.randint(1, rows))))
            else:   # unsorted, with repeats
                ids.append([r.randrange(rows) for _ in range(r.randint(1, rows + 2))])
        outs = [{'dt': m['dt'] if r.random() < 0.7 else r.choice(DTYPES),
                 'dev': r.randint(0, 2), 'ids': i} for i in ids]
        if self.workers > 1:
            # the same on row_sparse_pull: MXNet's worker of rank 1 read a float32 key's
            # rows into a float64 output as raw float32 pairs (seed 34); mxkv converts
            for o in outs:
                self.fix(o, o['dt'], m['dt'])
        return outs

    def round(self, rnd):
        r = self.r
        sync = self.kvtype != 'dist_async'
        if self.async_opt:
            x = self.x
            ks = [k for k in self.keys if x.random() < 0.75]
            if ks:
                self.add({'op': 'push', 'keys': ks,
                          'nval': [self.meta[k]['nval'] for k in ks]})
        if sync:
            ks = [k for k in self.keys if r.random() < 0.75]
            r.shuffle(ks)
            while ks:
                n = r.randint(1, len(ks))
                group, ks = ks[:n], ks[n:]
                dense = all(self.meta[k]['st'] == 'd' for k in group)
                if dense and not self.gc and r.random() < 0.3:
                    outs = [self.outs(k) for k in group]
                    for o in [o for os_ in outs for o in os_ if 'tame' in o]:
                        o['dt'] = o.pop('tame')   # a pushpull's first output: pushed dtype
                    if len(group) > 1:
                        # a first output of another dtype fails MXNet's pushpull when it
                        # reaches that key, after the keys before it (in key order) were
                        # pushed and pulled (README deviation 22: mxkv refuses the call
                        # before anything is sent; seed 419)
                        for k, o in zip(group, outs):
                            o[0]['dt'] = self.meta[k]['dt']
                    self.add({'op': 'pushpull', 'keys': group,
                              'nval': [self.meta[k]['nval'] for k in group],
                              'outs': outs, 'cmp': False,
                              'why': 'pushpull outputs: a real server may answer before '
                                     'the sum is stored'})
                else:
                    self.add({'op': 'push', 'keys': group,
                              'nval': [self.meta[k]['nval'] for k in group]})
        self.add({'op': 'barrier'})
        # reads, after every push of the round was applied
        ks = [k for k in self.keys if r.random() < 0.8]
        r.shuffle(ks)
        cmpv = self.opt is None
        why = None if cmpv else 'values under a server optimizer (MXNet runs it racily)'
        if self.async_opt:
            self.add({'op': 'barrier'})
        while ks:
            n = r.randint(1, len(ks))
            group, ks = ks[:n], ks[n:]
            dense = [k for k in group if self.meta[k]['st'] == 'd']
            rsp = [k for k in group if self.meta[k]['st'] == 'r']
            if dense:
                outs = [self.outs(k) for k in dense]
                if self.ext and self.x.random() < 0.25:
                    # a key twice in one pull: both outputs get the value
                    dense = dense + [dense[0]]
                    outs = outs + [[{'dt': self.meta[dense[0]]['dt'], 'dev': self.x.randint(0, 2)}]]
                self.add({'op': 'pull', 'keys': dense, 'outs': outs, 'cmp': cmpv, 'why': why})
            if rsp:
                self.add({'op': 'rsp_pull', 'keys': rsp,
                          'outs': [self.rsp_outs(k)[0] for k in rsp], 'cmp': cmpv, 'why': why})
        if r.random() < 0.6:
            self.misuse()
        self.add({'op': 'barrier'})

    def misuse(self):
        """misuse at the call that leaves MXNet's store as it was"""
        r = self.r
        dense = [k for k in self.keys if self.meta[k]['st'] == 'd']
        case = r.choice(['other_key_type'] + (['pull_dense_into_rsp'] if dense else []))
        k = r.choice(dense if case == 'pull_dense_into_rsp' else self.keys)
        self.add({'op': 'misuse', 'case': case, 'keys': [k], 'cmp': True})

    def last_misuse(self):
        """misuse after the last reads: MXNet refuses these too, but its store is broken
        afterwards (README deviation 3: a refused push leaves MXNet's buffers of the pushed
        shape and its later pulls of the key fail, seed 9 of the first generator; a
        row_sparse_pull of a dense key fails at the wait and a later push of the key
        crashed MXNet's worker, seed 1), so only one, and nothing reads after it"""
        r = self.r
        dense = [k for k in self.keys if self.meta[k]['st'] == 'd']
        cases = ['pull_wrong_shape']
        if dense:
            cases += ['rsp_pull_dense']
            if self.gc:
                cases += ['pushpull_gc']
        if self.kvtype != 'dist_async' and not self.gc:
            # with compression on, MXNet's push takes a value of another shape (deviation 3)
            cases += ['push_wrong_shape']
        case = r.choice(cases)
        k = r.choice(dense if case in ('rsp_pull_dense', 'pushpull_gc') else self.keys)
        self.add({'op': 'misuse', 'case': case, 'keys': [k], 'cmp': True})

    def scenario(self):
        r = self.r
        self.add({'op': 'create'})
        if self.gc:
            self.add({'op': 'gc'})
        if self.opt:
            self.add({'op': 'set_optimizer'})
        self.init_ops()
        self.add({'op': 'barrier'})
        for rnd in range(r.randint(2, 4)):
            self.round(rnd)
        # final reads of everything
        dense = [k for k in self.keys if self.meta[k]['st'] == 'd']
        rsp = [k for k in self.keys if self.meta[k]['st'] == 'r']
        cmpv = self.opt is None
        if dense:
            self.add({'op': 'pull', 'keys': dense, 'outs': [self.outs(k, 1) for k in dense],
                      'cmp': cmpv})
        for k in rsp:
            m = self.meta[k]
            self.add({'op': 'rsp_pull', 'keys': [k], 'cmp': cmpv,
                      'outs': [{'dt': m['dt'], 'dev': 0,
                                'ids': list(range(m['shape'][0]))}]})
        if r.random() < 0.7:
            self.last_misuse()
        self.add({'op': 'barrier'})
        return {'seed': self.seed, 'kvtype': self.kvtype, 'workers': self.workers,
                'servers': self.servers, 'bound': self.bound, 'str_keys': self.str_keys,
                'gc': self.gc, 'opt': self.opt, 'meta': [[k, self.meta[k]] for k in self.keys],
                'ops': self.ops}


def generate(seed, wild=False, ext=False):
    """the scenario of seed; wild: the same scenario, but with the pull outputs of other
    dtypes that MXNet crashes on (marked 'tame': the dtype of the same output in the tame
    scenario)"""
    sc = _Gen(seed, wild, ext).scenario()
    sc['wild'] = wild
    sc['ext'] = ext
    return sc


# --- the worker ----------------------------------------------------------------------
def _value(np, op_i, key_i, dev, rank, shape, dt, gc):
    n = 1
    for s in shape:
        n *= s
    a = (np.arange(n, dtype=np.int64) * 3 + op_i * 5 + key_i * 7 + dev * 11 + rank * 13) % 17
    a = (a - 8) / (4.0 if gc else 8.0)
    if gc:
        a = np.clip(a, -1.0, 1.0)
    return a.reshape(shape).astype(dt)


def _rows_of(rank, workers, rows, dev):
    """the rows a worker's device pushes: the worker's share of a partition of the rows
    (row i goes to worker i % workers), plus row 0 (everybody's); every round covers
    every row"""
    mine = [i for i in range(rows) if i % workers == rank or i == 0]
    return mine


def _exc(e):
    return [c.__name__ for c in type(e).__mro__ if c.__name__ not in ('object',)]


def node():
    lib = os.environ['T_LIB']
    role = os.environ.get('DMLC_ROLE', 'worker')
    import importlib
    mx = importlib.import_module(lib)   # scheduler and server nodes serve and exit here
    if role in ('scheduler', 'server'):
        print('import %s returned on a %s node' % (lib, role))
        return 3
    import numpy as np
    with open(os.environ['T_SCEN']) as f:
        sc = json.load(f)
    meta = dict((k, m) for k, m in sc['meta'])
    kidx = dict((k, j) for j, (k, _) in enumerate(sc['meta']))
    kv = None
    rank = None
    workers = sc['workers']
    out = None
    device = 'device' in sc['kvtype']

    def val(op, k, d):
        m = meta[k]
        v = _value(np, op['i'], kidx[k], d, rank, m['shape'], m['dt'], sc['gc'])
        ctx = mx.cpu(d) if device else mx.cpu(0)
        if op.get('ctx'):
            c = op['ctx'][op['keys'].index(k)]
            ctx = mx.cpu_pinned(0) if c == -1 else mx.cpu(c)
        if m['st'] == 'r':
            rows = _rows_of(rank, workers, m['shape'][0], d)
            if op['op'] in ('init', 'broadcast'):
                rows = list(range(m['shape'][0]))
            return mx.nd.sparse.row_sparse_array((v[rows], np.array(rows, dtype='int64')),
                                                 shape=tuple(m['shape']), ctx=ctx,
                                                 dtype=m['dt'])
        return mx.nd.array(v, ctx=ctx, dtype=m['dt'])

    def dense_out(k, o, shape=None):
        return mx.nd.full(tuple(shape or meta[k]['shape']), 7.0, ctx=mx.cpu(o['dev']),
                          dtype=o['dt'])

    def rsp_out(k, o):
        return mx.nd.sparse.zeros('row_sparse', tuple(meta[k]['shape']), ctx=mx.cpu(o['dev']),
                                  dtype=o['dt'])

    def desc(a):
        d = {'st': a.stype, 'dt': str(a.dtype.__name__ if hasattr(a.dtype, '__name__')
                                      else a.dtype), 'shape': list(a.shape),
             'ctx': str(a.context)}
        d['hex'] = a.asnumpy().tobytes().hex()
        if a.stype == 'row_sparse':
            d['idx'] = a.indices.asnumpy().astype('int64').tolist()
        return d

    for op in sc['ops']:
        kind = op['op']
        rec = {'i': op['i']}
        outs = []
        prio = {'priority': op['prio']} if 'prio' in op else {}
        try:
            if kind == 'create':
                kv = mx.kv.create(sc['kvtype'])
                rank = kv.rank
                rec['rank'] = rank
                rec['n'] = kv.num_workers
                out = open(os.path.join(os.environ['T_OUT'], 'w%d.jsonl' % rank), 'w')
            elif kind == 'gc':
                kv.set_gradient_compression({'type': '2bit', 'threshold': THRESHOLD})
            elif kind == 'set_optimizer':
                kv.set_optimizer(mx.optimizer.SGD(**sc['opt']))
            elif kind == 'barrier':
                kv._barrier()
            elif kind == 'init':
                ks = op['keys']
                if op['single']:
                    kv.init(ks[0], val(op, ks[0], 0))
                else:
                    kv.init(ks, [val(op, k, 0) for k in ks])
            elif kind == 'broadcast':
                ks = op['keys']
                vals = [val(op, k, 0) for k in ks]
                outs = [[dense_out(k, o) for o in os_] for k, os_ in zip(ks, op['outs'])]
                kv.broadcast(ks, vals, outs)
            elif kind in ('push', 'pushpull'):
                ks = op['keys']
                vals = [[val(op, k, d) for d in range(n)] for k, n in zip(ks, op['nval'])]
                if kind == 'push':
                    kv.push(ks, vals, **prio)
                else:
                    outs = [[dense_out(k, o) for o in os_] for k, os_ in zip(ks, op['outs'])]
                    kv.pushpull(ks, vals, outs, **prio)
            elif kind == 'pull':
                ks = op['keys']
                outs = [[dense_out(k, o) for o in os_] for k, os_ in zip(ks, op['outs'])]
                kv.pull(ks, out=outs, **prio)
            elif kind == 'rsp_pull':
                ks = op['keys']
                outs = [rsp_out(k, o) for k, o in zip(ks, op['outs'])]
                ids = [mx.nd.array(o['ids'], dtype='int64') for o in op['outs']]
                kv.row_sparse_pull(ks, out=outs, row_ids=ids, **prio)
            elif kind == 'misuse':
                k = op['keys'][0]
                c = op['case']
                m = meta[k]
                if c == 'other_key_type':
                    other = 3 if sc['str_keys'] else 'q'
                    o = mx.nd.zeros((2,))
                    outs = [o]
                    kv.pull(other, out=o)
                elif c == 'pull_wrong_shape':
                    if m['st'] == 'd':
                        o = dense_out(k, {'dt': m['dt'], 'dev': 0}, [7])
                        outs = [o]
                        kv.pull(k, out=o)
                    else:
                        o = mx.nd.sparse.zeros('row_sparse', (m['shape'][0] + 1, m['shape'][1]),
                                               dtype=m['dt'])
                        outs = [o]
                        kv.row_sparse_pull(k, out=o, row_ids=mx.nd.array([0], dtype='int64'))
                elif c == 'rsp_pull_dense':
                    o = rsp_out(k, {'dt': m['dt'], 'dev': 0})
                    outs = [o]
                    kv.row_sparse_pull(k, out=o, row_ids=mx.nd.array([0], dtype='int64'))
                elif c == 'pull_dense_into_rsp':
                    o = rsp_out(k, {'dt': m['dt'], 'dev': 0})
                    outs = [o]
                    kv.pull(k, out=o)
                elif c == 'push_wrong_shape':
                    v = mx.nd.ones((7, 1), dtype=m['dt'])
                    kv.push(k, v)
                elif c == 'pushpull_gc':
                    o = dense_out(k, {'dt': m['dt'], 'dev': 0})
                    outs = [o]
                    kv.pushpull(k, val(op, k, 0), out=o)
                elif c == 'pull_rsp_ignore_sparse':
                    o = rsp_out(k, {'dt': m['dt'], 'dev': 0}) if m['st'] == 'r' \
                        else dense_out(k, {'dt': m['dt'], 'dev': 0})
                    outs = [o]
                    kv.pull(k, out=o, ignore_sparse=False)
            else:
                raise SystemExit('unknown op %r' % kind)
        except Exception as e:   # noqa: BLE001  (recorded, compared)
            rec['err'] = _exc(e)
            rec['msg'] = str(e)[-400:]
        else:
            try:
                mx.nd.waitall()
                flat = []
                for o in outs:
                    flat.extend(o if isinstance(o, list) else [o])
                rec['out'] = [desc(a) for a in flat]
            except Exception as e:   # noqa: BLE001
                rec['err'] = _exc(e)
                rec['wait'] = True
                rec['msg'] = str(e)[-400:]
        if out is not None:
            out.write(json.dumps(rec) + '\n')
            out.flush()
    print('DIST FUZZ DONE rank %s' % rank)
    return 0


# --- the driver ----------------------------------------------------------------------
def run_cluster(sc, lib, timeout=90):
    """runs scenario sc on a cluster of lib ('mxnet' or 'mxkv'); returns
    {'code', 'out' (the launcher's output), 'res': {rank: [records]}}"""
    tmp = tempfile.mkdtemp(prefix='distfuzz_')
    try:
        path = os.path.join(tmp, 'sc.json')
        with open(path, 'w') as f:
            json.dump(sc, f)
        tag = uuid.uuid4().hex
        env = dict(os.environ)
        env['PYTHONPATH'] = BINDINGS + os.pathsep + env.get('PYTHONPATH', '')
        env.setdefault('MXKV_LIBRARY_PATH', os.path.join(REPO, 'target', 'release',
                                                         'libmxkv.so'))
        for k in list(env):
            if k.startswith('DMLC_') or k == 'PORT':
                del env[k]
        env.update({'MXKV_TEST_TAG': tag, 'MXKV_TIMEOUT_S': str(timeout), 'T_LIB': lib,
                    'T_SCEN': path, 'T_OUT': tmp, 'OMP_NUM_THREADS': '1',
                    'MXNET_KVSTORE_BIGARRAY_BOUND': str(sc['bound'])})
        cmd = [PY, LAUNCH, '-n', str(sc['workers']), '-s', str(sc['servers']),
               '--timeout', str(timeout), '--', PY, os.path.abspath(__file__), 'node']
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                             start_new_session=True)
        try:
            out, finished = communicate_or_stop(p, timeout + 30)
            code = p.returncode if finished else 'hung'
        finally:
            reap(tag)
        res = {}
        for r in range(sc['workers']):
            fn = os.path.join(tmp, 'w%d.jsonl' % r)
            if os.path.exists(fn):
                with open(fn) as f:
                    res[r] = [json.loads(line) for line in f if line.strip()]
        return {'code': code, 'out': out.decode(errors='replace'), 'res': res}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run_both(sc, timeout=90, sc_mxkv=None):
    """the MXNet and the mxkv cluster of one scenario (mxkv's: sc_mxkv if given, the wild
    version of sc), at the same time"""
    import threading
    got = {}

    def go(lib):
        got[lib] = run_cluster(sc_mxkv if lib == 'mxkv' and sc_mxkv else sc, lib, timeout)
    ts = [threading.Thread(target=go, args=(lib,)) for lib in ('mxnet', 'mxkv')]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return got['mxnet'], got['mxkv']


def compare(sc, a, b, soft=None):
    """differences between MXNet's run a and mxkv's run b: a list of dicts (rank, i, why,
    op, mxnet, mxkv); outputs of operations not compared (``cmp`` False: racy on MXNet)
    that differ go to the list ``soft`` if one is given"""
    diffs = []
    ops = sc['ops']
    a = _as_wild(sc, a)
    for rank in range(sc['workers']):
        ra = dict((r['i'], r) for r in a['res'].get(rank, []))
        rb = dict((r['i'], r) for r in b['res'].get(rank, []))
        for i, op in enumerate(ops):
            x, y = ra.get(i), rb.get(i)
            if x is None:
                diffs.append({'rank': rank, 'i': i, 'why': 'mxnet stopped (code %s)'
                              % a['code'], 'op': op, 'mxnet': None, 'mxkv': y,
                              'mxnet_only': True})
                break
            if y is None:
                diffs.append({'rank': rank, 'i': i, 'why': 'mxkv stopped (code %s)'
                              % b['code'], 'op': op, 'mxnet': x, 'mxkv': None})
                break
            if 'err' in x:
                if 'err' not in y or x['err'][0] not in y['err']:
                    diffs.append({'rank': rank, 'i': i, 'why': 'exception class',
                                  'op': op, 'mxnet': x, 'mxkv': y})
            elif 'err' in y:
                diffs.append({'rank': rank, 'i': i, 'why': 'mxkv raised', 'op': op,
                              'mxnet': x, 'mxkv': y})
            elif x.get('out') != y.get('out'):
                if op.get('cmp'):
                    diffs.append({'rank': rank, 'i': i, 'why': 'outputs', 'op': op,
                                  'mxnet': x, 'mxkv': y})
                elif soft is not None:
                    soft.append({'rank': rank, 'i': i, 'why': 'racy outputs differ: %s'
                                 % op.get('why'), 'op': op, 'mxnet': x, 'mxkv': y})
    # mxkv alone: every worker runs the same reads after barriers (the pushpulls of a sync
    # round answer every worker with the round's sum), so all ranks pulled the same
    r0 = dict((r['i'], r) for r in b['res'].get(0, []))
    for rank in range(1, sc['workers']):
        for r in b['res'].get(rank, []):
            op, z = ops[r['i']], r0.get(r['i'])
            if op['op'] in ('pull', 'rsp_pull', 'broadcast', 'pushpull') and z is not None \
                    and 'out' in r and 'out' in z and r['out'] != z['out']:
                diffs.append({'rank': rank, 'i': r['i'], 'why': 'mxkv ranks 0 and %d pulled '
                              'different values' % rank, 'op': op, 'mxnet': z, 'mxkv': r})
    return diffs


def _flat_specs(op):
    outs = op.get('outs') or []
    if op['op'] == 'rsp_pull':
        return outs
    return [o for os_ in outs for o in os_]


def _as_wild(sc, a):
    """MXNet's run of the tame scenario as mxkv's run of sc should be: outputs marked
    'tame' converted to sc's dtype (values are exact in every float dtype)"""
    if not sc.get('wild'):
        return a
    import numpy as np
    res = {}
    for rank, recs in a['res'].items():
        new = []
        for rec in recs:
            specs = _flat_specs(sc['ops'][rec['i']])
            if rec.get('out') and any('tame' in o for o in specs):
                rec = dict(rec, out=[dict(d) for d in rec['out']])
                for o, d in zip(specs, rec['out']):
                    if 'tame' in o:
                        assert d['dt'] == o['tame'], (o, d)
                        v = np.frombuffer(bytes.fromhex(d['hex']), dtype=o['tame'])
                        d['hex'] = v.astype(o['dt']).tobytes().hex()
                        d['dt'] = o['dt']
            new.append(rec)
        res[rank] = new
    return dict(a, res=res)


def show_diff(sc, d):
    return 'seed %d rank %d op %d (%s): %s\n  mxnet: %s\n  mxkv:  %s' % (
        sc['seed'], d['rank'], d['i'], d['why'], json.dumps(d['op'])[:400],
        json.dumps(d['mxnet'])[:700], json.dumps(d['mxkv'])[:700])


def describe(sc):
    return 'seed %d%s%s: %s %dw %ds bound %d %s keys%s%s, %d ops' % (
        sc['seed'], ' (wild)' if sc.get('wild') else '', ' (ext)' if sc.get('ext') else '', sc['kvtype'], sc['workers'], sc['servers'], sc['bound'],
        'str' if sc['str_keys'] else 'int', ' 2bit' if sc['gc'] else '',
        ' sgd%s' % json.dumps(sc['opt']) if sc['opt'] else '', len(sc['ops']))


def main(argv):
    if argv[:1] == ['node']:
        return node()
    if argv[:1] == ['show']:
        print(json.dumps(generate(int(argv[1])), indent=1))
        return 0
    if argv[:1] == ['explain']:
        sc = generate(int(argv[1]), False, 'ext' in argv[2:])
        a, b = run_both(sc)
        print(describe(sc), 'codes', a['code'], b['code'])
        for rank in range(sc['workers']):
            for i, op in enumerate(sc['ops']):
                ra = dict((r['i'], r) for r in a['res'].get(rank, []))
                rb = dict((r['i'], r) for r in b['res'].get(rank, []))
                print(rank, i, json.dumps(op)[:300])
                print('   mxnet', json.dumps(ra.get(i))[:500])
                print('   mxkv ', json.dumps(rb.get(i))[:500])
        for d in compare(sc, a, b):
            print('DIFF', show_diff(sc, d))
        if 'out' in argv[2:]:
            print(a['out'][-3000:])
            print(b['out'][-3000:])
        return 0
    if argv[:1] == ['drive']:
        first, count = int(argv[1]), int(argv[2])
        bad = 0
        wild, ext = 'wild' in argv[3:], 'ext' in argv[3:]
        for seed in range(first, first + count):
            sc = generate(seed, wild, ext)
            t = time.time()
            a, b = run_both(generate(seed, False, ext), sc_mxkv=sc)
            soft = []
            ds = compare(sc, a, b, soft)
            print('%s codes %s/%s %.1fs %d diffs, %d racy outputs differ (of %d)' % (
                describe(sc), a['code'], b['code'], time.time() - t, len(ds), len(soft),
                sum(not op.get('cmp', True) for op in sc['ops'])), flush=True)
            if os.environ.get('DISTFUZZ_SOFT'):
                ds += soft
            for d in ds:
                print('  ' + show_diff(sc, d).replace('\n', '\n  '), flush=True)
            bad += bool(ds)
        print('%d of %d seeds differ' % (bad, count))
        return 0
    print(__doc__)
    return 2


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
