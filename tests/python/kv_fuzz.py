"""A seeded random scenario generator for the KVStore Python frontend, run out of process.

Each scenario is a short program (a JSON list of operations on one store) that a worker
process runs once with ``import mxnet as mx`` (MXNet 1.9.1) and once with ``import mxkv
as mx``.  After every operation the worker reports its outcome: the bytes of every array it
wrote (pull/pushpull/broadcast/row_sparse_pull outputs), what the Python updater was
given, or the exception (its class hierarchy and message), and then a snapshot of every
key it initialised.  A worker that dies or hangs is noted against the operation it was
in (the driver restarts a worker for the next scenario).

What this covers beyond tests/python/test_audit_fuzz.py (in-process, ok/error only):
exception classes (MXNet's class must be among mxkv's bases), keys given as lists with
repeats, tuples, empty lists and one key with a list of several devices' values, pull
outputs of another shape, dtype or storage type, ignore_sparse, priorities, row_sparse
keys of float16/float64 with several outputs and row ids, updaters that record what they
are given (key type, recv/local dtype, storage, context, values) or raise, optimizers with
rescale_grad/clip_gradient/multi_precision, save/load of optimizer states with and without
the optimizer, bad gradient-compression parameters, init/broadcast of keys already there.
With ``ext`` (session 15; without it a seed's scenario is what it was before) also: calls
of no keys (``[]``, ``()``, ``[[]]``) of every operation, keys given an empty list of
values or outputs, an empty list next to a key (``[[], k]`` is taken, ``[k, []]`` fails
MXNet's key-type assertion), csr values at init and broadcast (csr keys), csr values in
push/pushpull (MXNet refuses them before anything is pushed), csr and row_sparse outputs of
pull/pushpull/broadcast, broadcasts of several row_sparse/csr/dense keys, cpu_pinned
values, calls of the other key type once the store's type is fixed, and more misuse
(_barrier, _send_command_to_servers, create of a bad name, load of a missing file).

Operations that reach one of README's deliberate deviations carry a ``dev`` tag; results
that differ from that operation on are not counted as findings.

CLI: ``python kv_fuzz.py drive FIRST COUNT [tame] [ext]`` runs seeds FIRST..FIRST+COUNT-1
and prints every mismatch (``tame``: the generator without the tagged deviations; ``ext``:
with session 15's operations); ``python kv_fuzz.py show SEED [tame] [ext]`` prints a
scenario, ``explain SEED [tame] [ext]`` runs it and prints both results of every
operation; ``python kv_fuzz.py worker MODULE`` is the worker (scenarios as JSON lines on
stdin).
"""
import json
import os
import random
import selectors
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, '..', '..'))
# the mxkv package the worker imports (another checkout's, to see what a change fixed)
BINDINGS = os.environ.get('KVFUZZ_MXKV_BINDINGS', os.path.join(REPO, 'bindings', 'python'))

KINDS = ['local', 'device', 'local_update_cpu', 'local_allreduce_cpu', 'local_allreduce_device']
DENSE_DTYPES = ['float32', 'float32', 'float64', 'float16', 'int32', 'int64', 'uint8']
RSP_DTYPES = ['float32', 'float32', 'float64', 'float16']
INT_KEYS = [0, 1, 2, 3, 5, 9, 17, -1, 1000003]
STR_KEYS = ['a', 'w0', 'bias', 'x.y', 'k' * 40, '0', '\u00e9t\u00e9']

# misuse cases of the ext generator
MISUSE_EXT = ['barrier', 'send_command', 'create_bad', 'create_int', 'load_missing',
              'init_other_kind', 'rowids_tuple_empty', 'pull_nested_empty']

# (name, kwargs) for mx.optimizer.create; 'fp16' ones only with float16 keys
OPTIMIZERS = [
    ('sgd', {'learning_rate': 0.1}),
    ('sgd', {'learning_rate': 0.1, 'momentum': 0.9, 'wd': 0.01}),
    ('sgd', {'learning_rate': 0.25, 'rescale_grad': 0.5, 'clip_gradient': 1.0}),
    ('sgd', {'learning_rate': 0.1, 'momentum': 0.5, 'multi_precision': True}),
    ('adam', {'learning_rate': 0.01}),
    ('adam', {'learning_rate': 0.01, 'wd': 0.1, 'clip_gradient': 0.5}),
    ('nag', {'learning_rate': 0.1, 'momentum': 0.5}),
    ('signum', {'learning_rate': 0.1, 'momentum': 0.9}),
    ('rmsprop', {'learning_rate': 0.01}),
    ('rmsprop', {'learning_rate': 0.01, 'centered': True}),
    ('adagrad', {'learning_rate': 0.1}),
    ('adadelta', {}),
    ('ftrl', {'learning_rate': 0.1}),
    ('ftml', {'learning_rate': 0.1}),
    ('adamax', {'learning_rate': 0.1}),
    ('nadam', {'learning_rate': 0.1}),
    ('dcasgd', {'learning_rate': 0.1, 'momentum': 0.5}),
    ('test', {}),
]
UPDATERS = ['add2', 'assign', 'record', 'scale', 'raise', 'noop']
GC_PARAMS = [
    {'type': '2bit', 'threshold': 0.5}, {'type': '2bit', 'threshold': 1},
    {'type': '2bit', 'threshold': '0.25'}, {'type': '2bit'},
    {'type': '2bit', 'threshold': 0}, {'type': '2bit', 'threshold': -1},
    {'type': 'none'}, {'type': '3bit'}, {'threshold': 0.5}, {},
    {'type': '2bit', 'threshold': 0.5, 'extra': 1},
]


# --- the generator ---------------------------------------------------------------------
class _Gen(object):
    def __init__(self, rng, wild, ext=False):
        self.rng = rng
        self.wild = wild
        # ext: the operations added in session 15 (no-key and empty-list calls, csr
        # values and outputs, cpu_pinned values, more misuse); without it a seed gives
        # the scenario it gave before (the committed seeds of test_kv_fuzz.SEEDS)
        self.ext = ext
        r = rng
        self.kind = r.choice(KINDS) if r.random() > 0.04 else 'teststore'
        self.str_keys = r.random() < 0.5
        pool = list(STR_KEYS if self.str_keys else INT_KEYS)
        r.shuffle(pool)
        self.keys = pool[:r.randint(1, 4)]
        self.meta = {}
        for k in self.keys:
            if r.random() < 0.3:
                self.meta[k] = {'st': 'r', 'shape': [r.randint(1, 5), r.randint(1, 3)],
                                'dt': r.choice(RSP_DTYPES)}
            else:
                shp = r.choice([[3], [2, 3], [1], [4, 2], [5]])
                self.meta[k] = {'st': 'd', 'shape': shp, 'dt': r.choice(DENSE_DTYPES)}
        self.inited = set()
        self.first_multi = {}   # key -> number of values of its first multi-value push
        self.updater = None     # None, 'py' or 'opt'
        self.gc = False
        self.gc_count = {}
        self.merge_is_stored = set()   # keys whose stored value is MXNet's merge buffer
        self.saved = []
        self.opt = None
        self.nbc = 0

    # values -----------------------------------------------------------------------
    def val(self, k, wrong=False, dt=None, st=None):
        r, m = self.rng, self.meta[k]
        shape = list(m['shape'])
        if wrong:
            shape = r.choice([[7], shape + [1], [max(1, shape[0] - 1)] + shape[1:]])
        st = st or m['st']
        if st == 'd' and m.get('csr_init') and m['st'] == 'd' and k not in self.inited:
            st = 'c'
        desc = {'st': st, 'shape': shape, 'dt': dt or m['dt'], 'dev': r.choice([0, 0, 1, 2, 3]),
                'b': r.choice([0.5, -1.25, 3.0, 0.1, 7.0, -0.3, 1e3, 2.0])}
        if self.ext and r.random() < 0.06:
            desc['dev'] = -1   # cpu_pinned(0)
        if st == 'r':
            desc['rows'] = sorted(r.sample(range(shape[0]), r.randint(0, shape[0])))
        return desc

    def out(self, k, dt=None, st=None, wrong=False):
        r, m = self.rng, self.meta[k]
        shape = list(m['shape'])
        if wrong:
            shape = r.choice([[7], shape + [1]])
            if st == 'c':   # csr arrays of MXNet may be 3-d, mxkv's not (finding N3)
                shape = [m['shape'][0] + 1, m['shape'][1]]
        return {'st': st or m['st'], 'shape': shape, 'dt': dt or m['dt'],
                'dev': r.choice([0, 0, 1, 3]), 'out': True}

    # operations ---------------------------------------------------------------------
    def op_init(self):
        r = self.rng
        fresh = [k for k in self.keys if k not in self.inited]
        op = {'op': 'init'}
        # a call of no keys takes the int entry points: as a store's first call it
        # would make a string-key scenario's store an int-key one (as in MXNet)
        if self.ext and (self.inited or not self.str_keys) and r.random() < 0.06:
            op['key'], op['val'], op['tuple'] = [], [], r.random() < 0.3
            return op
        if fresh and (r.random() < 0.85 or not self.wild):
            ks = r.sample(fresh, r.randint(1, len(fresh)))
        elif self.wild:
            ks = [r.choice(self.keys)]
            op['dev'] = 'init of a key that may be there'
        else:
            return None
        for k in ks:
            m = self.meta[k]
            if m['st'] == 'd' and len(m['shape']) == 2 and \
                    r.random() < (0.3 if self.ext else 0.15) \
                    and m['dt'] in ('float32', 'float64', 'float16'):
                m['csr_init'] = True
                self._csr_tags(op, m)
        if len(ks) == 1 and r.random() < 0.5:
            k = ks[0]
            if self.wild and r.random() < 0.1:
                op['key'], op['val'] = k, [self.val(k), self.val(k)]
                op['dev'] = 'init of one key with two values (MXNet inits it, then fails)'
            else:
                op['key'], op['val'] = k, self.val(k)
                if self.wild and r.random() < 0.05:
                    op['val'] = self.val(k, wrong=True)
                    op['dev'] = 'init shape differs from the scenario model'
        else:
            if self.wild and r.random() < 0.1:
                ks = ks + [ks[0]]
                op['dev'] = 'repeated key in init: MXNet inits in part'
            op['key'] = ks
            op['tuple'] = r.random() < 0.2
            op['val'] = [self.val(k) for k in ks]
            if self.ext:
                # a key given no values is not inited (MXNet's init loops over none)
                for j, k in enumerate(ks):
                    if ks.count(k) == 1 and r.random() < 0.1 and (
                            self.inited or sum(v != [] for v in op['val']) > 1):
                        op['val'][j] = []
                ks = [k for k, v in zip(ks, op['val']) if v != []]
        for k in ks:
            self.inited.add(k)
        if 'dev' in op:
            self.inited.update(ks)
        return op

    def _csr_tags(self, op, m):
        """the tags an init of a csr value of a key with meta `m` needs"""
        if m['dt'] != 'float32':
            op['dev'] = ('MXNet: a dense output of a non-float32 csr key fails '
                         'its float32 storage fallback (finding F1)')
        if 'device' in self.kind:
            op['dev'] = ('MXNet device store: a csr key fails every pull after '
                         'the first multi-value push (finding F5)')

    def _count(self, k, n):
        """the number of values a multi-value push of k may have (MXNet's buffers)"""
        if self.gc and 'device' in self.kind:
            return self.gc_count.setdefault(k, n)
        if n > 1:
            self.first_multi.setdefault(k, n)
            return min(n, self.first_multi[k])
        return n

    def _push_vals(self, k, n, op):
        r, m = self.rng, self.meta[k]
        vals = []
        for j in range(n):
            st = m['st']
            if r.random() < 0.1 and self.wild:
                st = 'd' if st == 'r' else 'r'
                if len(m['shape']) != 2 and st == 'r':
                    st = 'd'
                if st != m['st']:
                    op['dev'] = 'value of another storage type than the key'
            dt = None
            if j and r.random() < 0.2:
                dt = r.choice(['float32', 'float64', 'float16', 'int32'])
            wrong = self.wild and r.random() < 0.04
            if self.ext and len(m['shape']) == 2 and r.random() < 0.03 \
                    and (dt or m['dt']) in ('float32', 'float64', 'float16'):
                # MXNet's GroupKVPairsPush refuses csr values before anything is pushed
                st, wrong = 'c', False
                op['csr_push'] = True
            if wrong:
                op['dev'] = 'pushed shape differs (deviation 3)'
            if j == 0 and self.wild and r.random() < 0.04:
                dt = r.choice(['float32', 'float64', 'float16', 'int32'])
                if dt != m['dt']:
                    op['dev'] = 'first pushed dtype differs (deviation 3)'
            vals.append(self.val(k, wrong=wrong, dt=dt, st=st))
            if self.gc and 'device' in self.kind and (vals[-1]['dt'] != 'float32'
                                                      or st == 'r'):
                op['dev'] = 'compression with row_sparse or non-float32 (deviation 13)'
        return vals

    def _note_push(self, ks, counts, op):
        """tags for the deviations a push may reach"""
        for k in set(ks):
            m = self.meta[k]
            n = counts[k]
            if k not in self.inited:
                op['dev'] = 'push of a key not inited (deviation 5)'
            if n == 0:
                continue
            if self.updater == 'opt' and m['st'] == 'r' and m['dt'] != 'float32':
                op['dev'] = ('MXNet: an optimizer\'s storage fallback on a non-float32 '
                             'row_sparse weight fails (finding F3)')
            if self.updater == 'opt' and m['dt'] in ('int32', 'int64', 'uint8'):
                op['dev'] = ('optimizer on an integer weight: MXNet refuses, mxkv updates '
                             '(finding N1)')
            if k not in self.inited:
                op['dev'] = 'push of a key not inited (deviation 5)'
            # a compressed push on `device` goes through the merge buffer even for one value
            merged = n > 1 or m['st'] == 'r' or (self.gc and 'device' in self.kind)
            if merged and self.updater is None:
                self.merge_is_stored.add(k)
            if k in self.merge_is_stored and self.updater is not None and merged:
                op['dev'] = 'MXNet keeps the merge buffer as the stored value (16, 23)'
            if m['st'] == 'r' and n > 1 and m['dt'] != 'float32' and self.kind == 'local':
                op['dev'] = 'multi-value row_sparse push of non-float32 (deviation 23)'
            if self.gc and 'device' in self.kind and (m['st'] == 'r' or m['dt'] != 'float32'):
                op['dev'] = 'compression with row_sparse or non-float32 (deviation 13)'
            if m['st'] == 'r' and n > 1 and m['dt'] != 'float32':
                op['dev'] = 'multi-value row_sparse push of non-float32 (deviation 23)'

    def op_push(self, kind='push'):
        r = self.rng
        op = {'op': kind, 'prio': r.choice([0, 0, 0, 1, -3, 100])}
        before = self._state() if self.ext else None
        if r.random() < 0.6:
            k = r.choice(self.keys)
            n = r.choice([1, 1, 1, 2, 3, 4])
            if self.ext and r.random() < 0.05:
                n = 0   # push(k, []): nothing pushed
            n = self._count(k, n)
            vals = self._push_vals(k, n, op)
            op['key'] = k
            op['val'] = vals[0] if n == 1 and r.random() < 0.7 else vals
            counts = {k: n}
            ks = [k]
        else:
            ks = [r.choice(self.keys) for _ in range(r.randint(0, 4))]
            counts = {}
            for k in ks:
                counts[k] = counts.get(k, 0) + 1
            vals = []
            per = {}
            for k in ks:
                per.setdefault(k, r.choice([0, 1, 1, 2] if self.ext else [1, 1, 2]))
            for k in list(counts):
                if per[k] == 0:   # the key's values are [] each time it is named
                    counts[k] = 0
                    continue
                counts[k] = self._count(k, counts[k] * per[k])
                per[k] = max(1, counts[k] // max(1, ks.count(k)))
                counts[k] = per[k] * ks.count(k)
                if self.gc and 'device' in self.kind:
                    if counts[k] != self.gc_count[k]:
                        op['dev'] = 'compressed push with another number of values (13)'
                elif counts[k] > self.first_multi.get(k, counts[k]):
                    op['dev'] = 'more values than the first multi-value push (deviation 6)'
            for k in ks:
                vs = self._push_vals(k, per[k], op)
                vals.append(vs[0] if per[k] == 1 and r.random() < 0.5 else vs)
            op['key'], op['val'] = ks, vals
            if self.ext and r.random() < 0.1:
                op['tuple'] = True
        self._note_push(ks, counts, op)
        if kind == 'pushpull':
            self._note_pushpull(op, ks)
        if op.get('csr_push'):
            self._restore(before)   # MXNet refuses the whole call: nothing changed
        return op

    def _note_pushpull(self, op, ks):
        r = self.rng
        if r.random() < 0.5:
            op['out'] = None
            return
        outs = []
        vals = op['val'] if isinstance(op['key'], list) else [op['val']]
        for k, v in zip(ks, vals):
            n = len(v) if isinstance(v, list) else 1
            m = self.meta[k]
            o = [self.out(k, dt=r.choice([None, None, 'float64', 'float16']),
                          wrong=self.wild and r.random() < 0.05)
                 for _ in range(r.choice([0, 1, n] if self.ext else [1, n]))]
            if self.ext and len(m['shape']) == 2:
                for x in o:
                    # pushpull pulls with ignore_sparse: sparse outputs of a dense key
                    # are left as they are
                    x['st'] = r.choice([x['st']] * 6 + ['d', 'r', 'c'])
                    if x['st'] == 'd' and m['st'] == 'r' and (
                            m['dt'] != 'float32' or x['dt'] != 'float32'):
                        op['dev'] = ('MXNet: a dense output of a non-float32 row_sparse '
                                     'key fails its float32 storage fallback (finding F1)')
            if any(x['shape'] != self.meta[k]['shape'] for x in o):
                op['dev'] = 'pushpull checks its outputs before pushing (deviation 4)'
            if not o:
                outs.append([])
                continue
            outs.append(o if len(o) > 1 or r.random() < 0.5 else o[0])
        op['out'] = outs if isinstance(op['key'], list) else outs[0]

    def op_pull(self):
        r = self.rng
        op = {'op': 'pull', 'prio': r.choice([0, 0, 2, -1]),
              'ignore_sparse': r.choice([True, True, False])}
        lo = 0 if self.ext and r.random() < 0.15 else 1
        ks = [r.choice(self.keys) for _ in range(r.randint(lo, 3))]
        outs = []
        for k in ks:
            if k not in self.inited:
                op['dev'] = 'pull of a key not inited (deviation 23: MXNet registers it)'
            m = self.meta[k]
            o = []
            for _ in range(r.choice([0, 1, 1, 2, 3] if self.ext else [1, 1, 2, 3])):
                st = m['st']
                if r.random() < 0.15:
                    st = r.choice(['d', 'r', 'c'] if len(m['shape']) == 2 else ['d'])
                dt = r.choice([None, None, None, 'float32', 'float64', 'float16', 'int32',
                               'uint8'])
                if m['st'] == 'r' and dt and dt != m['dt'] and 'device' in self.kind:
                    op['dev'] = 'device row_sparse pull into another dtype (23)'
                o.append(self.out(k, dt=dt, st=st, wrong=r.random() < 0.04))
                if m['st'] == 'r' and st == 'd' and m['dt'] != 'float32':
                    op['dev'] = ('MXNet: a dense output of a non-float32 row_sparse key '
                                 'fails its float32 storage fallback (finding F1)')
            # (finding F2, a pull of a dense key into row_sparse or csr outputs with the
            # key or an output not float32, is compared: the store follows the merged
            # value's storage type and context, test_store_stype_follow.py)
            if not o:
                outs.append([])
                continue
            outs.append(o if len(o) > 1 or r.random() < 0.5 else o[0])
        if len(ks) == 1 and r.random() < 0.6:
            op['key'], op['out'] = ks[0], outs[0]
        else:
            op['key'], op['out'] = ks, outs
            if self.ext and r.random() < 0.1:
                op['tuple'] = True
        return op

    def op_rsp_pull(self):
        r = self.rng
        op = {'op': 'row_sparse_pull', 'prio': r.choice([0, 1])}
        rsp = [k for k in self.keys if self.meta[k]['st'] == 'r']
        pool = rsp if rsp and r.random() < 0.9 else self.keys
        lo = 0 if self.ext and r.random() < 0.1 else 1
        ks = [r.choice(pool) for _ in range(r.randint(lo, 3))]
        single = len(ks) == 1 and r.random() < 0.6
        outs, rids = [], []
        for k in ks:
            m = self.meta[k]
            if k not in self.inited:
                op['dev'] = 'pull of a key not inited (deviation 23: MXNet registers it)'
            n = r.choice([0, 1, 1, 2] if self.ext else [1, 1, 2])
            rows = m['shape'][0]
            o = []
            for _ in range(n):
                dt = None
                if r.random() < 0.15:
                    dt = r.choice(['float32', 'float64', 'float16'])
                    if dt != m['dt'] and 'device' in self.kind:
                        op['dev'] = 'device row_sparse pull into another dtype (23)'
                st = 'r' if r.random() < 0.9 else 'd'
                o.append(self.out(k, dt=dt, st=st))
                if st == 'd' and (m['dt'] != 'float32' or o[-1]['dt'] != 'float32'
                                  or o[0]['dt'] != 'float32'):
                    op['dev'] = ('MXNet: copying row_sparse into a dense array of '
                                 'another dtype fails its float32 fallback (finding F4)')
            ids = [r.randrange(rows) for _ in range(r.randint(0, 5))]
            rid = {'ids': ids, 'dt': r.choice(['int64', 'int64', 'float32', 'int32']),
                   'dev': r.choice([0, 1])}
            nrid = n if (not single and r.random() < 0.9) or r.random() < 0.5 else 1
            if n == 0:
                outs.append([])
                rids.append([] if nrid == 0 else rid)
                continue
            outs.append(o if len(o) > 1 or r.random() < 0.5 else o[0])
            rids.append([dict(rid) for _ in range(nrid)] if nrid > 1 else rid)
        if single:
            op['key'], op['out'], op['row_ids'] = ks[0], outs[0], rids[0]
        else:
            op['key'], op['out'], op['row_ids'] = ks, outs, rids
        return op

    def op_broadcast(self):
        r = self.rng
        op = {'op': 'broadcast', 'prio': r.choice([0, 3])}
        if self.ext and r.random() < 0.4:
            return self._broadcast_ext(op)
        self.nbc += 1
        k = ('bc%d' % self.nbc) if self.str_keys else 700 + self.nbc
        if self.wild and r.random() < 0.15:
            k = r.choice(self.keys)
            op['dev'] = 'broadcast of a key that may be there (init twice)'
        else:
            self.keys.append(k)
            self.meta[k] = {'st': 'd', 'shape': r.choice([[2], [2, 2], [3]]),
                            'dt': r.choice(DENSE_DTYPES)}
        self.inited.add(k)
        op['key'] = k
        op['val'] = self.val(k)
        outs = [self.out(k, dt=r.choice([None, None, 'float64', 'int32']))
                for _ in range(r.randint(1, 3))]
        op['out'] = outs if len(outs) > 1 or r.random() < 0.5 else outs[0]
        if r.random() < 0.2:
            op['key'], op['val'], op['out'] = [k], [op['val']], [op['out']]
        return op

    def _broadcast_ext(self, op):
        """broadcast of no keys, or of 1-3 fresh keys with dense, row_sparse or csr values
        (some given no values) into 0-3 outputs each of any storage type"""
        r = self.rng
        if r.random() < 0.2:
            op['key'], op['val'], op['out'] = [], [], []
            op['tuple'] = r.random() < 0.3
            return op
        ks, vals, outs = [], [], []
        for _ in range(r.randint(1, 3)):
            self.nbc += 1
            k = ('bc%d' % self.nbc) if self.str_keys else 700 + self.nbc
            shape = r.choice([[2], [2, 2], [3], [3, 2]])
            st = r.choice(['d', 'd', 'r', 'c']) if len(shape) == 2 else 'd'
            if st == 'c' and self.kind == 'teststore':
                # TestStore.broadcast assigns the list of values to each output: numpy's
                # conversion of a CSRNDArray in it does not end (MXNet and mxkv)
                st = 'd'
            m = {'st': 'r' if st == 'r' else 'd', 'shape': shape,
                 'dt': r.choice(RSP_DTYPES if st != 'd' else DENSE_DTYPES)}
            self.keys.append(k)
            self.meta[k] = m
            if st == 'c':
                m['csr_init'] = True
                self._csr_tags(op, m)
            v = self.val(k) if r.random() > 0.1 else []
            o = []
            for _ in range(r.choice([0, 1, 1, 2, 3])):
                ost = m['st']
                if len(shape) == 2 and r.random() < 0.3:
                    ost = r.choice(['d', 'r', 'c'])
                x = self.out(k, dt=r.choice([None, None, 'float64', 'float16', 'int32']),
                             st=ost)
                o.append(x)
                if m['st'] == 'r' and ost == 'd' and (m['dt'] != 'float32'
                                                      or x['dt'] != 'float32'):
                    op['dev'] = ('MXNet: a dense output of a non-float32 row_sparse key '
                                 'fails its float32 storage fallback (finding F1)')
            if v == [] and o:
                op['dev'] = ('broadcast of a key given no values: MXNet inits the others, '
                             'then fails (deviation 4)')
            if v != []:
                self.inited.add(k)
            ks.append(k)
            vals.append(v)
            outs.append(o if len(o) != 1 or r.random() < 0.5 else o[0])
        if len(ks) == 1 and vals[0] != [] and r.random() < 0.5:
            op['key'], op['val'], op['out'] = ks[0], vals[0], outs[0]
        else:
            op['key'], op['val'], op['out'] = ks, vals, outs
            op['tuple'] = r.random() < 0.1
        return op

    def op_updater(self):
        r = self.rng
        name = r.choice(UPDATERS)
        op = {'op': 'set_updater', 'name': name}
        if name == 'raise':
            op['dev'] = 'updater raises: MXNet prints it and goes on, mxkv raises'
        if any(self.meta[k]['st'] == 'r' for k in self.keys) and name in ('add2', 'scale'):
            op['dev'] = 'updater arithmetic on row_sparse (ndarray, not the store)'
        self.updater = 'py'
        return op

    def op_optimizer(self):
        r = self.rng
        name, kw = r.choice(OPTIMIZERS)
        self.updater = 'opt'
        op = {'op': 'set_optimizer', 'name': name, 'kw': kw}
        if r.random() < 0.3:
            # names for the keys (int keys through param_idx2name; str keys are names),
            # some '_bias' (wd_mult 0), lr/wd multipliers, an lr scheduler
            names = {}
            for k in self.keys:
                names[str(k)] = r.choice(['w', 'fc_bias', 'bn_gamma', 'x_weight'])
            op['names'] = names
            op['lr_mult'] = {n: r.choice([0.5, 2.0]) for n in set(names.values())
                             if r.random() < 0.5}
            op['wd_mult'] = {n: r.choice([0.0, 3.0]) for n in set(names.values())
                             if r.random() < 0.5}
            op['sched'] = r.choice([None, 'factor', 'multifactor', 'poly'])
        self.opt = json.dumps(op, sort_keys=True)
        return op

    def op_gc(self):
        r = self.rng
        p = r.choice(GC_PARAMS)
        op = {'op': 'gc', 'params': p}
        if 'device' in self.kind and p.get('type') == '2bit' and 'threshold' not in p or \
                float(p.get('threshold', 1)) > 0:
            if 'device' in self.kind and p.get('type') == '2bit':
                if self.first_multi:
                    op['dev'] = 'compression after multi-value pushes (deviation 23)'
                self.gc = True
        return op

    def op_misuse(self):
        """a frontend misuse or corner of the argument marshalling (outcome compared)"""
        r = self.rng
        k = r.choice(self.keys)
        other = r.choice(INT_KEYS if self.str_keys else STR_KEYS)
        case = r.choice(['none_value', 'int_value', 'list_key_none', 'big_key', 'neg_big_key',
                         'gc_int_name', 'gc_bytes_name', 'pull_no_out', 'rsp_no_rowids',
                         'rowids_tuple', 'mixed_keys', 'other_kind_key', 'float_key',
                         'bytes_key', 'none_key', 'bool_key', 'empty_push', 'empty_pull',
                         'empty_init', 'empty_pushpull', 'empty_values_for_key',
                         'out_list_short', 'gc_not_dict', 'capability', 'rsp_empty',
                         'str_priority', 'set_value', 'iter_value', 'props',
                         'nested_keys'] + (MISUSE_EXT if self.ext else []))
        op = {'op': 'misuse', 'case': case, 'key': k, 'other': other,
              'val': self.val(k), 'out': self.out(k)}
        if k not in self.inited:
            op['dev'] = 'a key not inited (deviation 5; MXNet skips sparse outputs first)'
        # MXNet fixes a store's key type at its first call; later calls with the other
        # type fail 'Mixed key types are not allowed' (so does mxkv)
        mixed_ok = self.ext and bool(self.inited)
        if case in ('other_kind_key', 'init_other_kind') and not mixed_ok:
            op['dev'] = 'int and str keys in one store'
        if case == 'bool_key' and self.str_keys and not mixed_ok:
            op['dev'] = 'int and str keys in one store'
        if case == 'bool_key' and True not in self.inited and 1 not in self.inited:
            op['dev'] = 'push of a key not inited (deviation 5)'
        return op

    def op_empty(self):
        """a call with no keys ([], (), [[]]) or with an empty list next to a key
        ([[], k] or [k, []]: MXNet's _ctype_key_value asserts on the latter, its key type
        None after the key's int or str)"""
        r = self.rng
        call = r.choice(['push', 'pull', 'pushpull', 'pushpull_out', 'row_sparse_pull',
                         'broadcast', 'init'])
        form = r.choice(['list', 'tuple', 'nested', 'lead', 'trail'])
        op = {'op': 'empty', 'call': call, 'form': form, 'prio': r.choice([0, 1])}
        if form in ('list', 'tuple', 'nested'):
            return op
        ok = form == 'lead'
        if call in ('init', 'broadcast'):
            self.nbc += 1
            k = ('bc%d' % self.nbc) if self.str_keys else 700 + self.nbc
            self.keys.append(k)
            self.meta[k] = {'st': 'd', 'shape': r.choice([[2], [3]]),
                            'dt': r.choice(DENSE_DTYPES)}
            op['key'], op['val'] = k, self.val(k)
            if call == 'broadcast':
                op['out'] = self.out(k)
            if ok:
                self.inited.add(k)
            return op
        if call == 'row_sparse_pull':
            rsp = [k for k in self.keys if self.meta[k]['st'] == 'r']
            if not rsp:
                return None
            k = r.choice(rsp)
            op['key'], op['out'] = k, self.out(k)
            op['row_ids'] = {'ids': sorted(set(r.randrange(self.meta[k]['shape'][0])
                                               for _ in range(2))), 'dt': 'int64', 'dev': 0}
        else:
            k = r.choice(self.keys)
            op['key'] = k
            if call != 'pull':
                op['val'] = self._push_vals(k, 1, op)[0]
            if op.pop('csr_push', None):
                op['val'] = self.val(k, st=self.meta[k]['st'])
            if call in ('pull', 'pushpull_out'):
                op['out'] = self.out(k)
        if k not in self.inited:
            op['dev'] = 'a key not inited (deviation 5/23)'
        if ok and call != 'pull' and call != 'row_sparse_pull':
            self._note_push([k], {k: 1}, op)
        return op

    def op_save(self):
        r = self.rng
        dump = r.random() < 0.5
        self.saved.append((dump, self.opt if self.updater == 'opt' else None))
        return {'op': 'save', 'file': len(self.saved) - 1, 'dump': dump}

    def op_load(self):
        if not self.saved:
            return None
        i = self.rng.randrange(len(self.saved))
        op = {'op': 'load', 'file': i}
        dump, opt = self.saved[i]
        if dump and opt is not None and self.updater == 'opt':
            if opt != self.opt:
                op['dev'] = ('Updater.set_states takes the loaded optimizer\'s grouping '
                             '(deviation 23)')
            self.opt = opt
        return op

    _STATE = ('keys', 'meta', 'inited', 'first_multi', 'updater', 'gc', 'gc_count',
              'merge_is_stored', 'saved', 'nbc', 'opt')

    def _state(self):
        import copy
        return {n: copy.deepcopy(getattr(self, n)) for n in self._STATE}

    def _restore(self, st):
        for n, v in st.items():
            setattr(self, n, v)

    _NO_KEY_MISUSE = ('empty_push', 'empty_pull', 'empty_init', 'empty_pushpull', 'rsp_empty')

    def _untyped_no_keys(self, op, ops):
        """(ext) a call of no keys in a string-key scenario before any call with keys:
        it takes the int entry points and would make the store an int-key one (MXNet's
        key type is fixed by a store's first call), which the scenario model does not
        follow"""
        if not (self.ext and self.str_keys) or any(
                o.get('key') not in (None, [], ()) and o['op'] != 'misuse'
                and o.get('form') != 'trail' for o in ops):
            return False
        return op.get('key') in ([], ()) or (
            op['op'] == 'empty' and op['form'] in ('list', 'tuple', 'nested')) or (
                op['op'] == 'misuse' and op['case'] in self._NO_KEY_MISUSE)

    def scenario(self):
        r = self.rng
        ops = []
        for _ in range(r.randint(1, 2)):
            saved = self._state()
            op = self.op_init()
            if op is not None and (op.get('dev') and not self.wild
                                   or self._untyped_no_keys(op, ops)):
                self._restore(saved)
                op = None
            if op:
                ops.append(op)
        table = [(0.25, lambda: self.op_push('push')), (0.16, self.op_pull),
                 (0.12, lambda: self.op_push('pushpull')), (0.08, self.op_rsp_pull),
                 (0.06, self.op_broadcast), (0.06, self.op_init), (0.07, self.op_updater),
                 (0.08, self.op_optimizer), (0.05, self.op_gc), (0.04, self.op_save),
                 (0.03, self.op_load), (0.06, self.op_misuse)]
        if self.ext:
            table.append((0.07, self.op_empty))
        for _ in range(r.randint(3, 14)):
            x = r.random() * sum(w for w, _ in table)
            for w, f in table:
                x -= w
                if x <= 0:
                    break
            saved = self._state()
            op = f()
            if op is not None and (op.get('dev') and not self.wild
                                   or self._untyped_no_keys(op, ops)):
                self._restore(saved)
                op = None
            if op is not None:
                ops.append(op)
        return {'kind': self.kind, 'ops': ops}


def generate(seed, wild=True, ext=False):
    """The scenario of `seed` (a JSON-able dict); `ext` adds session 15's operations"""
    sc = _Gen(random.Random(seed), wild, ext).scenario()
    sc['seed'] = seed
    # JSON round trip: tuples become lists in the JSON; keep the marker
    return json.loads(json.dumps(sc, default=list))


def ext_features(sc):
    """what of the ext generator's additions a scenario reaches (static)"""
    seen = set()

    def walk(x, f):
        if isinstance(x, dict):
            f(x)
        elif isinstance(x, list):
            for y in x:
                walk(y, f)
    for op in sc['ops']:
        t = op['op']
        if t == 'empty':
            seen.add(('empty call', op['call']))
            seen.add(('empty form', op['form']))
            continue
        if t == 'misuse':
            seen.add(('misuse', op['case']))

        def f(d, t=t):
            if d.get('st') == 'c':
                seen.add(('csr out' if d.get('out') else 'csr val', t))
            if d.get('dev') == -1:
                seen.add('cpu_pinned value')
        walk(op.get('val'), f)
        walk(op.get('out'), f)
        if isinstance(op.get('key'), list) and t != 'misuse':
            if not op['key']:
                seen.add(('no keys', t))
            per = op.get('val') if t in ('init', 'push', 'pushpull', 'broadcast') \
                else op.get('out')
            if isinstance(per, list) and any(x == [] for x in per) and op['key']:
                seen.add(('a key with an empty list', t))
    return seen


# --- the worker --------------------------------------------------------------------------
def _exc(e):
    return {'err': [c.__name__ for c in type(e).__mro__], 'msg': str(e)[:2000]}


def _misuse(mx, kv, op, mk, outs):
    case, k, other = op['case'], op['key'], op['other']
    v = mk(op['val'])
    o = mk(op['out'])
    if case == 'none_value':
        kv.push(k, None)
    elif case == 'int_value':
        kv.push(k, 5)
    elif case == 'list_key_none':
        kv.pull([k], out=None)
    elif case == 'big_key':
        kv.push(2 ** 31, v)
    elif case == 'neg_big_key':
        kv.pull([k, -2 ** 31 - 1], out=[o, o])
    elif case == 'gc_int_name':
        kv.set_gradient_compression({'type': '2bit', 7: 1})
    elif case == 'gc_bytes_name':
        kv.set_gradient_compression({b'type': '2bit'})
    elif case == 'gc_not_dict':
        kv.set_gradient_compression([('type', '2bit')])
    elif case == 'pull_no_out':
        kv.pull(k)
    elif case == 'rsp_no_rowids':
        kv.row_sparse_pull(k, out=o)
    elif case == 'rowids_tuple':
        kv.row_sparse_pull(k, out=o, row_ids=(mx.nd.array([0]),))
    elif case == 'mixed_keys':
        kv.push([k, other], [v, v])
    elif case == 'other_kind_key':
        kv.pull(other, out=o)
    elif case == 'float_key':
        kv.push(1.0, v)
    elif case == 'bytes_key':
        kv.push(b'a', v)
    elif case == 'none_key':
        kv.pull(None, out=o)
    elif case == 'bool_key':
        kv.pull(True, out=o)
        outs.append(o)
    elif case == 'empty_push':
        kv.push([], [])
    elif case == 'empty_pull':
        kv.pull([], out=[])
    elif case == 'empty_init':
        kv.init([], [])
    elif case == 'empty_pushpull':
        kv.pushpull([], [], out=[])
    elif case == 'empty_values_for_key':
        kv.push(k, [])
    elif case == 'out_list_short':
        kv.pull([k, k], out=[o])
    elif case == 'capability':
        outs.append(mx.nd.array([kv.is_capable('optimizer'), kv.is_capable('OPTIMIZER')]))
        kv.is_capable('compression')
    elif case == 'rsp_empty':
        kv.row_sparse_pull([], out=[], row_ids=[])
    elif case == 'str_priority':
        kv.push(k, v, priority='1')
    elif case == 'set_value':
        kv.pull(k, out={o})
        outs.append(o)
    elif case == 'iter_value':
        kv.pull(k, out=iter([o]))
    elif case == 'props':
        return [kv.type, kv.rank, kv.num_workers]
    elif case == 'nested_keys':
        kv.pull([[k], [k, k]], out=[[o], [o, o]])
        outs.append(o)
    elif case == 'barrier':
        kv._barrier()  # pylint: disable=protected-access
    elif case == 'send_command':
        kv._send_command_to_servers(0, 'x')  # pylint: disable=protected-access
    elif case == 'create_bad':
        mx.kv.create('no_such_store')
    elif case == 'create_int':
        mx.kv.create(3)
    elif case == 'load_missing':
        kv.load_optimizer_states('/nonexistent/kvfuzz.states')
    elif case == 'init_other_kind':
        kv.init(other, v)
    elif case == 'rowids_tuple_empty':
        kv.row_sparse_pull([], out=[], row_ids=())
    elif case == 'pull_nested_empty':
        kv.pull([[], [k]], out=[[], [o]])
        outs.append(o)
    return None


def _empty_call(kv, op, build, rid, outs):
    """an 'empty' op: a call with no keys, or an empty list next to one key"""
    form, call, prio = op['form'], op['call'], op['prio']
    if form in ('list', 'tuple', 'nested'):
        def e():
            return {'list': [], 'tuple': (), 'nested': [[]]}[form]
        keys, vals, o, rows = e(), e(), e(), e()
    else:
        def pair(x):
            return [[], x] if form == 'lead' else [x, []]
        keys = pair(op['key'])
        vals = pair(build(op.get('val'), []))
        o = pair(build(op.get('out'), outs))
        rows = pair(rid(op['row_ids']) if 'row_ids' in op else None)
    if call == 'push':
        kv.push(keys, vals, priority=prio)
    elif call == 'pull':
        kv.pull(keys, out=o, priority=prio)
    elif call == 'pushpull':
        kv.pushpull(keys, vals, priority=prio)
    elif call == 'pushpull_out':
        kv.pushpull(keys, vals, out=o, priority=prio)
    elif call == 'row_sparse_pull':
        kv.row_sparse_pull(keys, out=o, row_ids=rows, priority=prio)
    elif call == 'broadcast':
        kv.broadcast(keys, vals, out=o, priority=prio)
    else:
        kv.init(keys, vals)


def _optimizer(mx, op, sc):
    kw = dict(op['kw'])
    names = op.get('names')
    str_keys = any(isinstance(o.get('key'), str) for o in sc['ops'])
    if names is not None and not str_keys:
        kw['param_idx2name'] = {int(k): n for k, n in names.items()
                                if k.lstrip('-').isdigit()}
    sched = op.get('sched')
    if sched == 'factor':
        kw['lr_scheduler'] = mx.lr_scheduler.FactorScheduler(step=1, factor=0.5)
    elif sched == 'multifactor':
        kw['lr_scheduler'] = mx.lr_scheduler.MultiFactorScheduler(step=[1, 3], factor=0.3)
    elif sched == 'poly':
        kw['lr_scheduler'] = mx.lr_scheduler.PolyScheduler(max_update=5, base_lr=0.1, pwr=2)
    o = mx.optimizer.create(op['name'], **kw)
    if names is not None:
        if op['lr_mult']:
            o.set_lr_mult(dict(op['lr_mult']))
        if op['wd_mult']:
            o.set_wd_mult(dict(op['wd_mult']))
    return o


def _run(mx, sc, tmpdir, emit):
    import numpy as np
    log = []

    def mk(d):
        ctx = mx.cpu_pinned(0) if d['dev'] == -1 else mx.cpu(d['dev'])
        shape = tuple(d['shape'])
        if d.get('out'):
            if d['st'] in ('r', 'c'):
                return mx.nd.sparse.zeros('row_sparse' if d['st'] == 'r' else 'csr', shape,
                                          ctx=ctx, dtype=d['dt'])
            return mx.nd.full(shape, -3, ctx=ctx, dtype=d['dt'])
        n = int(np.prod(shape))
        if d['dt'] in ('int32', 'int64', 'uint8'):
            base = np.arange(n) % 7 + abs(int(d['b'])) % 100
        else:
            base = np.arange(n) * 0.37 + d['b']
        if d['st'] == 'c':
            dense = base.reshape(shape) * (np.arange(n).reshape(shape) % 3 != 1)
            return mx.nd.array(dense, ctx=ctx, dtype=d['dt']).tostype('csr')
        if d['st'] == 'r':
            rows = d['rows']
            cols = int(np.prod(shape[1:]))
            data = base[:len(rows) * cols].reshape((len(rows),) + shape[1:]).astype(d['dt'])
            return mx.nd.sparse.row_sparse_array((data, np.array(rows, dtype='int64')),
                                                 shape=shape, ctx=ctx, dtype=d['dt'])
        return mx.nd.array(base.reshape(shape), ctx=ctx, dtype=d['dt'])

    def build(x, flat):
        if isinstance(x, dict):
            a = mk(x)
            flat.append(a)
            return a
        if x is None:
            return None
        return [build(y, flat) for y in x]

    def rid(x):
        if isinstance(x, list):
            return [rid(y) for y in x]
        return mx.nd.array(x['ids'], ctx=mx.cpu(x['dev']), dtype=x['dt'])

    def show(a):
        if a.stype == 'csr':
            return ['c', str(a.dtype), list(a.shape), a.indptr.asnumpy().tobytes().hex(),
                    a.indices.asnumpy().tobytes().hex(), a.data.asnumpy().tobytes().hex()]
        if a.stype == 'row_sparse':
            return ['r', str(a.dtype), list(a.shape), a.indices.asnumpy().tobytes().hex(),
                    a.data.asnumpy().tobytes().hex()]
        v = a.asnumpy()
        return [a.stype, str(v.dtype), list(v.shape), v.tobytes().hex()]

    def key_of(op):
        k = op['key']
        return tuple(k) if op.get('tuple') else k

    updaters = {}

    def u_add2(key, recv, local):
        local += recv * 2

    def u_assign(key, recv, local):
        local[:] = recv

    def u_record(key, recv, local):
        log.append([repr(key), recv.stype, str(recv.dtype), list(recv.shape), str(recv.context),
                    local.stype, str(local.dtype), show(recv), show(local)])
        local[:] = local + recv

    def u_scale(key, recv, local):
        local *= 0.5
        local += recv

    def u_raise(key, recv, local):
        raise ValueError('updater refuses key %r' % (key,))

    def u_noop(key, recv, local):
        pass
    updaters = {'add2': u_add2, 'assign': u_assign, 'record': u_record, 'scale': u_scale,
                'raise': u_raise, 'noop': u_noop}

    kv = mx.kv.create(sc['kind'])
    inited = []   # (key, shape, dtype) in the order they were first inited successfully
    for i, op in enumerate(sc['ops']):
        res = {'i': i}
        del log[:]
        del _UNRAISABLE[:]
        t = op['op']
        try:
            outs = []
            if t == 'init':
                kv.init(key_of(op), build(op['val'], []))
            elif t == 'push':
                kv.push(key_of(op), build(op['val'], []), priority=op['prio'])
            elif t == 'pull':
                o = build(op['out'], outs)
                kv.pull(key_of(op), out=o, priority=op['prio'],
                        ignore_sparse=op['ignore_sparse'])
            elif t == 'pushpull':
                vflat = []
                v = build(op['val'], vflat)
                o = build(op['out'], outs)
                if o is None:
                    kv.pushpull(key_of(op), v, priority=op['prio'])
                    outs = vflat
                else:
                    kv.pushpull(key_of(op), v, out=o, priority=op['prio'])
            elif t == 'broadcast':
                o = build(op['out'], outs)
                kv.broadcast(key_of(op), build(op['val'], []), out=o, priority=op['prio'])
            elif t == 'row_sparse_pull':
                o = build(op['out'], outs)
                kv.row_sparse_pull(key_of(op), out=o, priority=op['prio'],
                                   row_ids=rid(op['row_ids']))
            elif t == 'set_updater':
                kv._set_updater(updaters[op['name']])  # pylint: disable=protected-access
            elif t == 'set_optimizer':
                kv.set_optimizer(_optimizer(mx, op, sc))
            elif t == 'gc':
                kv.set_gradient_compression(op['params'])
            elif t == 'save':
                kv.save_optimizer_states(os.path.join(tmpdir, 's%d_%d' % (sc['seed'], op['file'])),
                                         dump_optimizer=op['dump'])
            elif t == 'misuse':
                res['info'] = _misuse(mx, kv, op, mk, outs)
            elif t == 'empty':
                _empty_call(kv, op, build, rid, outs)
            elif t == 'load':
                kv.load_optimizer_states(os.path.join(tmpdir, 's%d_%d' % (sc['seed'], op['file'])))
            mx.nd.waitall()
            res['out'] = [show(a) for a in outs]
            if t in ('init', 'broadcast') or (t == 'empty' and op['call'] in (
                    'init', 'broadcast') and op['form'] == 'lead'):
                ks = op['key'] if isinstance(op['key'], list) else [op['key']]
                vs = op['val'] if isinstance(op['key'], list) else [op['val']]
                for k, v in zip(ks, vs):
                    if v == []:
                        continue   # a key given no values is not inited
                    v = v[0] if isinstance(v, list) else v
                    if k not in [x[0] for x in inited]:
                        inited.append((k, v['shape'], v['dt'], v['st']))
        except Exception as e:  # pylint: disable=broad-except
            res.update(_exc(e))
            try:
                mx.nd.waitall()
            except Exception as e2:  # pylint: disable=broad-except
                res['late'] = _exc(e2)
        res['log'] = list(log)
        del log[:]
        if _UNRAISABLE:
            res['unraisable'] = list(_UNRAISABLE)
            del _UNRAISABLE[:]
        snap = []
        for k, shape, dt, st in inited:
            try:
                if st == 'r':
                    o = mx.nd.sparse.zeros('row_sparse', tuple(shape), dtype=dt)
                    kv.row_sparse_pull(k, out=o, row_ids=mx.nd.arange(shape[0], dtype='int64'))
                else:
                    o = mx.nd.full(tuple(shape), -3, dtype=dt)
                    kv.pull(k, out=o)
                mx.nd.waitall()
                snap.append(show(o))
            except Exception as e:  # pylint: disable=broad-except
                snap.append(_exc(e))
                try:
                    mx.nd.waitall()
                except Exception:  # pylint: disable=broad-except
                    pass
        res['snap'] = snap
        res['ulog'] = list(log)   # updater calls during the snapshot (none expected)
        emit(res)
    del kv


_UNRAISABLE = []


def _unraisable(u):
    """an exception a ctypes callback raised (MXNet's updater): noted for the op"""
    _UNRAISABLE.append(_exc(u.exc_value))


def worker(module):
    """Run scenarios (JSON lines on stdin) with `module`; one JSON line per operation."""
    import gc
    import warnings
    import logging
    warnings.simplefilter('ignore')
    logging.disable(logging.CRITICAL)
    if module == 'mxkv':
        sys.path.insert(0, BINDINGS)
    # the results go to the original stdout; anything else printed (by Python or C) to
    # stderr
    out = os.fdopen(os.dup(1), 'w')
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    mx = __import__(module)
    sys.unraisablehook = _unraisable

    def emit(obj):
        out.write(json.dumps(obj) + '\n')
        out.flush()
    tmp = tempfile.mkdtemp(prefix='kvfuzz_%s_' % module)
    for line in sys.stdin:
        sc = json.loads(line)
        emit({'start': sc['seed']})
        _run(mx, sc, tmp, emit)
        gc.collect()
        try:
            mx.nd.waitall()
        except Exception:  # pylint: disable=broad-except
            pass
        emit({'end': sc['seed']})
    for f in os.listdir(tmp):
        os.unlink(os.path.join(tmp, f))
    os.rmdir(tmp)


# --- the driver ----------------------------------------------------------------------------
def run_scenarios(module, scenarios, timeout=20.0, python=None, startup=180.0):
    """{seed: [per-op results]}, with {'died': ...} as the last result of a scenario whose
    worker died or hung (the next scenario gets a new worker).  A worker has `startup`
    seconds for its first output (importing MXNet takes more than `timeout` on a loaded
    machine), then `timeout` seconds between outputs."""
    python = python or sys.executable
    results = {}
    todo = list(scenarios)
    while todo:
        env = dict(os.environ)
        env.setdefault('OMP_NUM_THREADS', '1')
        env['MXNET_ENGINE_TYPE'] = env.get('KVFUZZ_ENGINE', env.get('MXNET_ENGINE_TYPE',
                                                                    'ThreadedEnginePerDevice'))
        proc = subprocess.Popen([python, os.path.abspath(__file__), 'worker', module],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, env=env, text=True)
        # feed everything (small), then read
        sel = selectors.DefaultSelector()
        payload = ''.join(json.dumps(sc) + '\n' for sc in todo)
        import threading
        feeder = threading.Thread(target=_feed, args=(proc, payload), daemon=True)
        feeder.start()
        sel.register(proc.stdout, selectors.EVENT_READ)
        cur = None
        progressed = False
        buf = ''
        deadline = time.monotonic() + max(timeout, startup)
        dead = None
        while True:
            ev = sel.select(max(0.0, deadline - time.monotonic()))
            if not ev:
                dead = 'hang (no output for %.0f s)' % (timeout if progressed else startup)
                proc.kill()
                break
            chunk = os.read(proc.stdout.fileno(), 1 << 16).decode()
            if not chunk:
                rc = proc.wait()
                dead = None if cur is None else 'died (exit %d)' % rc
                break
            buf += chunk
            while '\n' in buf:
                line, buf = buf.split('\n', 1)
                if not line.startswith('{'):
                    continue
                obj = json.loads(line)
                if 'start' in obj:
                    progressed = True
                    cur = obj['start']
                    results[cur] = []
                    deadline = time.monotonic() + timeout
                elif 'end' in obj:
                    todo = [sc for sc in todo if sc['seed'] != cur]
                    cur = None
                else:
                    results[cur].append(obj)
        proc.wait()
        sel.close()
        if cur is not None:
            results[cur].append({'died': dead})
            todo = [sc for sc in todo if sc['seed'] != cur]
        elif not progressed:
            # the worker ran nothing (it failed to start): every scenario left fails so
            raise RuntimeError('the %s worker ran no scenario (%s, exit %s)'
                               % (module, dead or 'no output', proc.returncode))
    return results


def _feed(proc, payload):
    try:
        proc.stdin.write(payload)
        proc.stdin.close()
    except (BrokenPipeError, OSError):
        pass


def _err_compatible(a, b):
    """b (mxkv) is an exception a caller catching a's (MXNet's) class also catches"""
    return a['err'][0] in b['err']


def compare(sc, ra, rb):
    """The first difference between MXNet's results `ra` and mxkv's `rb` of scenario
    `sc`: None, or a dict (op index, op, both results, the deviation tag in force)."""
    ops = sc['ops']
    tag = None
    for i, op in enumerate(ops):
        if op.get('dev') and tag is None:
            tag = op['dev']
        a = ra[i] if i < len(ra) else {'died': 'no result'}
        b = rb[i] if i < len(rb) else {'died': 'no result'}
        why = _differ(a, b)
        if why:
            return {'seed': sc['seed'], 'i': i, 'op': op, 'why': why, 'mxnet': a, 'mxkv': b,
                    'tag': tag}
    return None


def _differ(a, b):
    if 'died' in a or 'died' in b:
        if 'died' in a and 'died' in b:
            return None
        if 'died' in a:
            return 'mxnet %s' % a['died']
        return 'mxkv %s' % b['died']
    if 'unraisable' in a and 'err' not in a and 'err' in b:
        # MXNet's updater raised inside the ctypes callback: MXNet prints it and goes on,
        # mxkv raises it from the push (bindings/python/README.md); the rest must agree
        if a['unraisable'][0]['err'][0] not in b['err']:
            return 'updater exception class: mxnet %s, mxkv %s' % (
                a['unraisable'][0]['err'][0], b['err'])
        a = dict(a, out=b.get('out'))
    elif ('err' in a) != ('err' in b):
        return 'outcome: mxnet %s, mxkv %s' % ('error' if 'err' in a else 'ok',
                                             'error' if 'err' in b else 'ok')
    if 'err' in a and not _err_compatible(a, b):
        return 'exception class: mxnet %s, mxkv %s' % (a['err'][0], b['err'])
    if 'late' in a and 'err' not in a:
        return 'mxnet late error'
    if a.get('info') != b.get('info'):
        return 'returned values'
    if a.get('out') != b.get('out'):
        return 'outputs'
    if a.get('log') != b.get('log'):
        return 'updater calls'
    if len(a['snap']) != len(b['snap']):
        return 'snapshot keys'
    for x, y in zip(a['snap'], b['snap']):
        if isinstance(x, dict) or isinstance(y, dict):
            if not (isinstance(x, dict) and isinstance(y, dict)):
                return 'snapshot outcome'
        elif x != y:
            return 'snapshot values'
    return None


def drive(first, count, wild=True, chunk=50, verbose=True, ext=False):
    scs = [generate(s, wild, ext) for s in range(first, first + count)]
    found = []
    for c in range(0, len(scs), chunk):
        part = scs[c:c + chunk]
        ra = run_scenarios('mxnet', part)
        rb = run_scenarios('mxkv', part)
        for sc in part:
            d = compare(sc, ra.get(sc['seed'], []), rb.get(sc['seed'], []))
            if d:
                found.append(d)
                if verbose:
                    print(json.dumps({'seed': d['seed'], 'i': d['i'], 'why': d['why'],
                                      'tag': d['tag'], 'op': d['op']}), flush=True)
    return scs, found


def explain(seed, wild=True, ext=False):
    """Run one scenario in fresh workers and print every op's results side by side."""
    sc = generate(seed, wild, ext)
    ra = run_scenarios('mxnet', [sc])[seed]
    rb = run_scenarios('mxkv', [sc])[seed]
    for i, op in enumerate(sc['ops']):
        a = ra[i] if i < len(ra) else None
        b = rb[i] if i < len(rb) else None
        print('--- op %d: %s' % (i, json.dumps(op)))
        if a == b:
            print('   same: %s' % json.dumps(a)[:300])
            continue
        print('   mxnet: %s' % json.dumps(a)[:1500])
        print('   mxkv:  %s' % json.dumps(b)[:1500])


def _main():
    if sys.argv[1] == 'worker':
        worker(sys.argv[2])
    elif sys.argv[1] == 'show':
        flags = sys.argv[3:]
        print(json.dumps(generate(int(sys.argv[2]), 'tame' not in flags, 'ext' in flags),
                         indent=1))
    elif sys.argv[1] == 'drive':
        flags = sys.argv[4:]
        _, f = drive(int(sys.argv[2]), int(sys.argv[3]), wild='tame' not in flags,
                     ext='ext' in flags)
        print('%d mismatches' % len(f))
    elif sys.argv[1] == 'explain':
        flags = sys.argv[3:]
        explain(int(sys.argv[2]), wild='tame' not in flags, ext='ext' in flags)


if __name__ == '__main__':
    _main()
