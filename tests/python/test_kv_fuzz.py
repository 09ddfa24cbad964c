"""The KVStore scenario fuzz (kv_fuzz.py) with a fixed list of seeds: each scenario runs in
a worker process through MXNet 1.9.1 and another through mxkv; every operation's outputs
(bytes), exception class, updater calls and the snapshot of every key must agree
(kv_fuzz.compare).  The seeds are scenarios of the tame generator (nothing that reaches
README's deliberate deviations or the MXNet failures the fuzz found), chosen to cover every
store type, dtype, operation and misuse case; none of them crashes MXNet.

More seeds: ``python tests/python/kv_fuzz.py drive FIRST COUNT tame`` (or without ``tame``
for the generator that also reaches the deviations, tagged).
"""
import pytest

import kv_fuzz

SEEDS = [20005, 20011, 20016, 20029, 20041, 20042, 20044, 20045, 20050, 20058, 20060, 20066,
         20068, 20076, 20079, 20082, 20085, 20098, 20106, 20109, 20113, 20137, 20147, 20153,
         20156, 20161, 20171, 20177, 20178, 20179, 20207, 20233, 20243, 20258, 20263, 20269,
         20294, 20296, 20307, 20308, 20309, 20314, 20322, 20339, 20345, 20375, 20388, 20394]


@pytest.fixture(scope='module')
def results():
    pytest.importorskip('mxnet')
    scs = [kv_fuzz.generate(s, wild=False) for s in SEEDS]
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
