"""The KVStore scenario fuzz (kv_fuzz.py) with a fixed list of seeds: each scenario runs in
a worker process through MXNet 1.9.1 and another through mxkv; every operation's outputs
(bytes), exception class, updater calls and the snapshot of every key must agree
(kv_fuzz.compare).  The seeds are scenarios of the tame generator (nothing that reaches
README's deliberate deviations or the MXNet failures the fuzz found), chosen to cover every
store type, dtype, operation and misuse case; none of them crashes MXNet.  SEEDS_EXT are
scenarios of the ext generator (session 15: calls of no keys and empty lists next to keys,
csr init/push/broadcast values and csr pull/pushpull/broadcast outputs, cpu_pinned values,
more misuse), chosen by greedy cover of kv_fuzz.ext_features over seeds 100000-101999.

More seeds: ``python tests/python/kv_fuzz.py drive FIRST COUNT tame [ext]`` (or without
``tame`` for the generator that also reaches the deviations, tagged).
"""
import pytest

import kv_fuzz

SEEDS = [20005, 20011, 20016, 20029, 20041, 20042, 20044, 20045, 20050, 20058, 20060, 20066,
         20068, 20076, 20079, 20082, 20085, 20098, 20106, 20109, 20113, 20137, 20147, 20153,
         20156, 20161, 20171, 20177, 20178, 20179, 20207, 20233, 20243, 20258, 20263, 20269,
         20294, 20296, 20307, 20308, 20309, 20314, 20322, 20339, 20345, 20375, 20388, 20394]
SEEDS_EXT = [100033, 100056, 100104, 100358, 100361, 100373, 100541, 100546, 100579, 100667, 100675,
             100766, 100782, 100789, 100809, 100843, 100887, 100965, 101166, 101220, 101341, 101400,
             101440, 101549, 101664, 101992]


@pytest.fixture(scope='module')
def results():
    pytest.importorskip('mxnet')
    scs = [kv_fuzz.generate(s, wild=False) for s in SEEDS]
    scs += [kv_fuzz.generate(s, wild=False, ext=True) for s in SEEDS_EXT]
    return scs, kv_fuzz.run_scenarios('mxnet', scs), kv_fuzz.run_scenarios('mxkv', scs)


def test_scenarios_agree(results):
    scs, ra, rb = results
    bad = []
    for sc in scs:
        a, b = ra.get(sc['seed'], []), rb.get(sc['seed'], [])
        assert len(a) == len(sc['ops']), 'seed %d: MXNet ran %d of %d ops' % (
            sc['seed'], len(a), len(sc['ops']))
        d = kv_fuzz.compare(sc, a, b)
        if d is not None:
            bad.append('seed %d op %d (%s): %s\n  mxnet: %s\n  mxkv:  %s' % (
                d['seed'], d['i'], d['why'], d['op'], str(d['mxnet'])[:800],
                str(d['mxkv'])[:800]))
    assert not bad, '\n'.join(bad)


def test_the_seeds_cover_the_generator(results):
    """the fixed seeds still reach every operation, store type and outcome (a change of
    the generator that lost them would make the comparison above vacuous)"""
    scs, ra, _ = results
    seen = set()
    for sc in scs:
        seen.add(sc['kind'])
        for op, r in zip(sc['ops'], ra[sc['seed']]):
            seen.add((op['op'], 'err' in r))
            if op['op'] == 'misuse':
                seen.add(op['case'])
            if r.get('log'):
                seen.add('updater called')
    want = set(kv_fuzz.KINDS) | {'teststore', 'updater called'}
    want |= {(o, ok) for o in ('init', 'push', 'pull', 'pushpull', 'row_sparse_pull', 'gc',
                               'save', 'load') for ok in (True, False)}
    want |= {('broadcast', False), ('set_optimizer', False), ('set_updater', False)}
    want |= {'none_value', 'big_key', 'gc_int_name', 'str_priority', 'empty_push',
             'nested_keys', 'set_value', 'iter_value', 'props'}
    assert want <= seen, sorted(map(str, want - seen))


def test_the_ext_seeds_cover_the_ext_generator(results):
    """SEEDS_EXT reach every addition of the ext generator (kv_fuzz.ext_features) on every
    store type, and calls of no keys that MXNet takes and refuses"""
    scs, ra, _ = results
    seen = set()
    for sc in scs:
        if sc['seed'] not in SEEDS_EXT:
            continue
        seen |= kv_fuzz.ext_features(sc)
        seen.add(('kind', sc['kind']))
        for op, r in zip(sc['ops'], ra[sc['seed']]):
            if op['op'] == 'empty':
                seen.add(('empty', op['form'] in ('list', 'tuple', 'nested'), 'err' in r))
    calls = ['push', 'pull', 'pushpull', 'pushpull_out', 'row_sparse_pull', 'broadcast', 'init']
    ops = ['init', 'push', 'pull', 'pushpull', 'row_sparse_pull', 'broadcast']
    want = {('kind', k) for k in kv_fuzz.KINDS}
    want |= {('empty call', c) for c in calls}
    want |= {('empty form', f) for f in ('list', 'tuple', 'nested', 'lead', 'trail')}
    want |= {('no keys', o) for o in ops}
    want |= {('a key with an empty list', o) for o in ops}
    want |= {('csr val', o) for o in ('init', 'push', 'pushpull', 'broadcast')}
    want |= {('csr out', o) for o in ('pull', 'pushpull', 'broadcast')}
    want |= {('misuse', c) for c in kv_fuzz.MISUSE_EXT}
    want |= {'cpu_pinned value', ('empty', False, False), ('empty', False, True)}
    want |= {('empty', True, False), ('empty', True, True)}
    assert want <= seen, sorted(map(str, want - seen))


def test_compare_sees_differences(results):
    """kv_fuzz.compare reports a changed byte, a changed exception class and a dead worker"""
    scs, ra, _ = results
    sc = next(s for s in scs if any('out' in r and r['out'] for r in ra[s['seed']]))
    a = ra[sc['seed']]
    assert kv_fuzz.compare(sc, a, a) is None
    i = next(j for j, r in enumerate(a) if r.get('out'))
    b = [dict(r) for r in a]
    out = [list(x) for x in b[i]['out']]
    out[0][-1] = ('1' if out[0][-1][:1] != '1' else '2') + out[0][-1][1:]
    b[i]['out'] = out
    assert kv_fuzz.compare(sc, a, b)['why'] == 'outputs'
    j = next(k for k, r in enumerate(a) if 'err' in r) if any('err' in r for r in a) else None
    if j is not None:
        b = [dict(r) for r in a]
        b[j]['err'] = ['KeyError', 'Exception']
        assert kv_fuzz.compare(sc, a, b)['why'].startswith('exception class')
    b = a[:1] + [{'died': 'died (exit -11)'}]
    assert kv_fuzz.compare(sc, a, b)['why'].startswith('mxkv died')
