"""A `local` or `device` store's value after a push without an updater takes the merged
value's storage type and context, as in MXNet 1.9.1 (kv fuzz finding F2), run through
real MXNet (the reference venv) and mxkv, one child process per library, compared
exactly: every output's storage type, dtype, parts and value bits, and the exception
class of every failing call.

MXNet's KVStoreLocal::PushImpl without an updater stores the merged value itself when
its storage type is the stored value's (`local = merged`), else a copy of it on the
stored value's context (`local = merged.Copy(local.ctx())`). The merged value is the
pushed array for one dense value on `local` (CommCPU::Reduce) and for any one value on
`device` (CommDevice::Reduce), else the key's merge buffer (`cpu_pinned(0)` on `local`,
the context the placement gave the key on `device`). Later pulls copy from it, so the
copies between storage types MXNet fails (README deviation 25: within one context the
dtype must not change, across contexts only float32 converts) depend on where it is;
a `device` store pulls through the key's merge buffer once its buffers are placed, and
before that into output `key % n` first and from it into the others. An updater sees
the stored value on that context too. Before: mxkv kept the value on `cpu_pinned(0)`
and checked every output against it, so e.g. a float16 dense pull into a row_sparse
output after a one-value push, a pushpull of dense values into a float16 csr key and a
`device` pull into [float64 dense, float32 dense, float64 csr] outputs were refused
where MXNet copies (and some outputs MXNet refuses were written).

Outside the comparison (README deviations): a first pushed value of another dtype than
the key's (3), multi-value pushes whose values' storage types MXNet's copy buffers
refuse or whose count exceeds the first one's (6, 23), multi-value row_sparse or
mixed pushes of non-float32 keys on `local` (23), updaters on csr keys (the frontend's
copyto), and everything after a pushpull whose pull half fails: mxkv checks the
outputs before pushing and pushes nothing (4), MXNet has pushed and fails at the next
wait.
"""
import random

from conftest import CHILD_PRELUDE, compare_children


CHILD = CHILD_PRELUDE + r'''
BASE = np.array([[1, 2], [0, 0], [3, 4]], dtype=np.float64)
ST = {'d': 'default', 'r': 'row_sparse', 'c': 'csr'}


def value(st, dt, fill, dev=0):
    a = mx.nd.array(BASE * fill, dtype=dt, ctx=mx.cpu(dev))
    return a if st == 'd' else a.tostype(ST[st])


def zeros(st, dt, dev=0):
    if st == 'd':
        return mx.nd.zeros((3, 2), dtype=dt, ctx=mx.cpu(dev))
    return mx.nd.sparse.zeros(ST[st], (3, 2), dtype=dt, ctx=mx.cpu(dev))


def show(o):
    r = [o.stype, np.dtype(o.dtype).name, str(o.context), o.asnumpy().tobytes().hex()]
    if o.stype == 'row_sparse':
        r.append(o.indices.asnumpy().tolist())
    if o.stype == 'csr':
        r += [o.indptr.asnumpy().tolist(), o.indices.asnumpy().tolist()]
    return r


def one(xs):
    return xs if len(xs) > 1 else xs[0]


def run(case):
    key = case['key']
    kv = mx.kv.create(case['kind'])
    kv.init(key, value(case['init'][0], case['init'][1], 1))
    kv.init(99, value('d', 'float32', 1))
    seen = []
    log = []
    for op in case['ops']:
        try:
            if op[0] == 'updater':
                def upd(k, recv, local):
                    seen.append([local.stype, str(local.context), recv.stype])
                    recv.copyto(local)
                kv._set_updater(upd)
                log.append('ok')
                continue
            del seen[:]
            if op[0] == 'push_other':
                # two values for another key: a device store places its merge buffers
                kv.push(99, [value('d', 'float32', 1), value('d', 'float32', 2)])
                mx.nd.waitall()
                log.append('ok')
            elif op[0] == 'push':
                kv.push(key, one([value(*v) for v in op[1]]))
                mx.nd.waitall()
                log.append(['pushed', list(seen)])
            elif op[0] == 'pushpull':
                outs = [zeros(*o) for o in op[2]]
                kv.pushpull(key, one([value(*v) for v in op[1]]), out=one(outs))
                mx.nd.waitall()
                log.append([[show(o) for o in outs], list(seen)])
            elif op[0] == 'pull':
                outs = [zeros(*o) for o in op[1]]
                kv.pull(key, out=one(outs), ignore_sparse=op[2])
                mx.nd.waitall()
                log.append([show(o) for o in outs])
            else:
                outs = [zeros('r', dt) for dt in op[1]]
                rows = [mx.nd.array(op[2], dtype='int64') for _ in outs]
                kv.row_sparse_pull(key, out=one(outs), row_ids=one(rows))
                mx.nd.waitall()
                log.append([show(o) for o in outs])
        except Exception as e:  # pylint: disable=broad-except
            try:
                mx.nd.waitall()
            except Exception:  # pylint: disable=broad-except
                pass
            log.append('raise ' + type(e).__name__)
            if op[0] == 'pushpull':
                break   # README deviation 4: MXNet has pushed, mxkv has not
    return log


cases = json.loads(sys.argv[2])
print(json.dumps({name: run(case) for name, case in cases.items()}))
'''

DTYPES = ['float32', 'float16', 'float64']


def _single_push_cases():
    """Each stored storage type and dtype, each push (one or two values, dense or
    row_sparse, of the key's dtype), then pulls of every kind."""
    cases = {}
    for kind in ['local', 'device']:
        for ist in 'drc':
            for idt in DTYPES:
                pushes = {'d1': 'd', 'r1': 'r', 'dd': 'dd', 'rr': 'rr', 'dr': 'dr', 'rd': 'rd'}
                for name, sts in pushes.items():
                    if kind == 'local' and idt != 'float32' and name in ('rr', 'dr', 'rd'):
                        continue   # MXNet's float32 buffer fails (README deviation 23)
                    p = [(st, idt, 2 + i, 0) for i, st in enumerate(sts)]
                    ops = [['push', p], ['pull', [('d', idt, 0)], True],
                           ['pull', [('r', idt, 0)], False], ['pull', [('c', idt, 0)], False],
                           ['rsp_pull', [idt], [0, 2]],
                           ['pull', [('d', 'float32', 0), ('d', 'float64', 0)], True],
                           ['pull', [('r', 'float32', 1), ('c', 'float64', 0)], False],
                           ['push', p], ['pull', [('d', idt, 0)], True]]
                    cases['%s-%s%s-%s' % (kind, ist, idt[5:], name)] = {
                        'kind': kind, 'init': [ist, idt], 'ops': ops, 'key': 5}
    return cases


def _named_cases():
    """The examples of finding F2."""
    return {
        # dense values pushed into a float16 csr key, pulled into a float16 output
        'local-pushpull-dense-into-f16-csr': {
            'kind': 'local', 'init': ['c', 'float16'], 'key': 5,
            'ops': [['pushpull', [('d', 'float16', 2, 0)], [('d', 'float16', 0)]],
                    ['pushpull', [('d', 'float16', 2, 0), ('d', 'float16', 3, 0)],
                     [('d', 'float16', 0), ('d', 'float32', 1)]]]},
        'device-pushpull-dense-into-f16-csr': {
            'kind': 'device', 'init': ['c', 'float16'], 'key': 5,
            'ops': [['pushpull', [('d', 'float16', 2, 0)], [('d', 'float16', 0)]],
                    ['pull', [('r', 'float16', 0)], False]]},
        # output key % 3 = 2 (the csr one) is written first, the others from it
        'device-pull-f64d-f32d-f64c': {
            'kind': 'device', 'init': ['d', 'float32'], 'key': 5,
            'ops': [['push', [('d', 'float32', 2, 0)]],
                    ['pull', [('d', 'float64', 0), ('d', 'float32', 0), ('c', 'float64', 0)],
                     False]]},
        'device-pull-f64d-f32d-f64c-f64-key': {
            'kind': 'device', 'init': ['d', 'float64'], 'key': 5,
            'ops': [['push', [('d', 'float64', 2, 0)]],
                    ['pull', [('d', 'float64', 0), ('d', 'float32', 0), ('c', 'float64', 0)],
                     False],
                    ['push', [('d', 'float64', 2, 0), ('d', 'float64', 3, 0)]],
                    ['pull', [('d', 'float64', 0), ('d', 'float32', 0), ('c', 'float64', 0)],
                     False]]},
        # the stored value follows the pushed value's context, also for an updater
        'device-cpu1-values-and-updater': {
            'kind': 'device', 'init': ['r', 'float64'], 'key': 3,
            'ops': [['push', [('r', 'float64', 2, 1)]], ['updater'],
                    ['push', [('d', 'float64', 2, 1), ('d', 'float64', 1, 1)]],
                    ['push', [('r', 'float64', 3, 0)]],
                    ['pull', [('d', 'float64', 1), ('d', 'float64', 0)], False]]},
        # a device store with placed merge buffers pulls through them: none for csr
        'device-csr-key-after-placement': {
            'kind': 'device', 'init': ['c', 'float32'], 'key': 1,
            'ops': [['pull', [('d', 'float32', 0)], True], ['push_other'],
                    ['pull', [('d', 'float32', 0)], True],
                    ['pull', [('d', 'float32', 0), ('d', 'float16', 1)], True],
                    ['pushpull', [('d', 'float32', 2, 0)], [('d', 'float32', 0)]],
                    ['pull', [('r', 'float32', 0), ('d', 'float64', 1)], False]]},
        'device-f16-rsp-key-after-placement': {
            'kind': 'device', 'init': ['r', 'float16'], 'key': 4,
            'ops': [['pull', [('d', 'float16', 0), ('d', 'float16', 1)], False],
                    ['push_other'],
                    ['pull', [('d', 'float16', 0), ('d', 'float16', 1)], False],
                    ['push', [('r', 'float16', 2, 1)]],
                    ['pull', [('d', 'float16', 0), ('d', 'float16', 1)], False]]},
        'local-dense-then-updater': {
            'kind': 'local', 'init': ['d', 'float64'], 'key': 6,
            'ops': [['push', [('d', 'float64', 2, 1)]], ['updater'],
                    ['push', [('r', 'float64', 2, 0)]],
                    ['push', [('d', 'float64', 3, 0), ('d', 'float64', 1, 1)]],
                    ['pushpull', [('r', 'float64', 2, 0)], [('d', 'float64', 0)]]]},
    }


def _random_case(seed):
    """A random scenario within the compared contract (see the module text)."""
    r = random.Random(seed)
    kind = r.choice(['local', 'device'])
    ist = r.choice('drc')
    idt = r.choice(['float32', 'float32', 'float16', 'float64'])
    key = r.choice([0, 3, 5, 6])
    upd = ist == 'c'
    nmulti = r.choice([2, 3])
    fmulti = r.choice('dr') if kind == 'device' or idt == 'float32' else 'd'
    ops = []
    for _ in range(r.randint(3, 7)):
        op = r.choice(['push', 'push', 'pushpull', 'pull', 'pull', 'rsp_pull']
                      + ([] if upd else ['updater']))
        if op == 'updater':
            upd = True
            ops.append(['updater'])
        elif op in ('push', 'pushpull'):
            n = r.choice([1, 1, nmulti])
            devs = [r.choice([0, 0, 1]) for _ in range(n)]
            if n > 1 and idt != 'float32':
                devs = [0] * n
            first = r.choice('dr') if n == 1 else fmulti
            mixed = idt == 'float32' or kind == 'device'
            sts = [first] + [r.choice('dr') if mixed else first for _ in range(n - 1)]
            vals = [(st, idt, r.randint(1, 4), dv) for st, dv in zip(sts, devs)]
            if op == 'push':
                ops.append(['push', vals])
            else:
                outs = [('d', r.choice([idt, idt, 'float32', 'float64', 'float16']),
                         r.choice([0, 0, 1])) for _ in range(r.choice([1, 1, 2, 3]))]
                ops.append(['pushpull', vals, outs])
        elif op == 'pull':
            outs = [(r.choice('ddrc'), r.choice([idt, idt, 'float32', 'float64', 'float16']),
                     r.choice([0, 0, 1])) for _ in range(r.choice([1, 1, 2, 3]))]
            ops.append(['pull', outs, r.choice([True, False, False])])
        else:
            # a device store's row_sparse_pull into another dtype: README deviation 23
            dts = [idt if kind == 'device' else r.choice([idt, idt, 'float32', 'float64'])
                   for _ in range(r.choice([1, 2]))]
            ops.append(['rsp_pull', dts, sorted({r.randrange(3) for _ in range(r.randint(0, 3))})])
    return {'kind': kind, 'init': [ist, idt], 'ops': ops, 'key': key}


def test_single_pushes_then_pulls():
    compare_children(CHILD, _single_push_cases(), width=400)


def test_named_cases_of_finding_f2():
    compare_children(CHILD, _named_cases(), width=400)


def test_random_scenarios():
    compare_children(CHILD, {'s%d' % i: _random_case(i) for i in range(240)}, width=400)
