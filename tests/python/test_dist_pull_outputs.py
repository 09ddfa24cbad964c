"""Dist pulls, pushpulls, row_sparse_pulls and broadcasts into outputs of other storage types,
dtypes and contexts (cpu(0), cpu(1), cpu_pinned(0)), against real MXNet 1.9.1 clusters.

``tests/python/dist/pull_outputs_worker.py`` runs the same cases (each on a fresh key, after
a barrier; a pushpull pushes the key's own value, so a real server's race between storing the
sum and answering cannot change what is pulled) on a 1-worker, 1-server job of real MXNet
nodes and of mxkv nodes (test_dist.launch: 127.0.0.1, ports chosen at run time, the launcher's
--timeout plus a deadline on it, leftovers killed by pid).

What MXNet 1.9.1's KVStoreDist does (src/kvstore/kvstore_dist.h, kvstore_local.h):

* pull / pushpull / broadcast group their outputs with ``GroupKVPairsPull(ignore_sparse=
  true)``: sparse outputs are left out (a warning once per key), not written; a pushpull key
  left without outputs fails ``List of push and pull keys are different``. The value lands in
  a receive buffer and ``comm_->Broadcast`` copies it to the dense outputs, converting any
  dtype on any context (dense -> dense). A pushpull's first output must have the pushed dtype.
* row_sparse_pull: the output must be row_sparse (a dense or csr one fails at the call); the
  rows are copied row_sparse -> row_sparse, converting any dtype on any context. Of a dense
  key it fails (at the next wait).
* a plain pull (or broadcast) of a row_sparse key into a dense output sends a dense pull of
  the row_sparse key: the server aborts. mxkv refuses it at the call, naming
  row_sparse_pull (a broadcast before its init), and writes nothing.
* ``pull(ignore_sparse=False)`` fails at the call; mxkv takes it (README deviation 22) and
  does what the local store does with it (MXNet's local store is the reference here).

mxkv raises where MXNet fails, at the call (MXNet may fail at the next wait: README
deviation 9) and writes nothing. Before the fix, sparse outputs of dense keys were written
(pull, broadcast) or the whole pushpull refused, row_sparse_pull into another dtype was
refused, and a row_sparse key's pull into a dense output was silently skipped.
"""
import json
import os
import re
import sys

import pytest

from test_dist import SCRIPTS, _has_mxnet, launch

if SCRIPTS not in sys.path:
    sys.path.insert(0, SCRIPTS)
import pull_outputs_worker as worker  # noqa: E402  (the case list; numpy only)

pytestmark = pytest.mark.skipif(not os.path.isdir('/proc/self'), reason='needs Linux /proc')

CASES = worker.cases()
_CASE = re.compile(r'^\[worker 0\] CASE (.*)$', re.M)
KVTYPES = ['dist_sync', 'dist_device_sync']

# MXNet's check text -> what mxkv's message says about the same problem
SAME_PROBLEM = {
    'Output buffer dtype is different': 'Output buffer dtype is different',
    'List of push and pull keys are different': 'List of push and pull keys are different',
    'Expected row_sparse storage type for row_sparse_pull values':
        'Expected row_sparse storage type for row_sparse_pull values',
    'CheckAndAlloc(aux_shapes) is not intended for kDefaultStorage':
        'PullRowSparse expects a row_sparse key',
}


def run(lib, kvtype):
    code, out = launch('pull_outputs_worker.py', 1, 1,
                       {'T_LIB': lib, 'T_KVTYPE': kvtype, 'OMP_NUM_THREADS': '1'},
                       timeout=300, node_timeout=120)
    assert code == 0, out[-5000:]
    res = {}
    for line in _CASE.findall(out):
        d = json.loads(line)
        res[d['case']] = d
    want = [i for i, c in enumerate(CASES) if lib == 'mxkv' or not worker.mxnet_crashes(c)]
    assert sorted(res) == want, out[-5000:]
    return res


@pytest.fixture(scope='module', params=KVTYPES)
def runs(request):
    if not _has_mxnet():
        pytest.skip('no mxnet 1.9.1 in this Python (make venv-ref)')
    return request.param, run('mxnet', request.param), run('mxkv', request.param)


def failed(r):
    return r['call'] or r['wait']


def show(i, theirs, ours):
    return '%d %r\n  mxnet %s\n  mxkv  %s' % (i, CASES[i], json.dumps(theirs)[:900],
                                              json.dumps(ours)[:900])


def test_outputs_and_errors_are_mxnets(runs):
    """every case MXNet completes: mxkv completes and every output (storage type, dtype,
    context, values bit for bit, indices) is MXNet's; every case MXNet fails (at the call
    or the next wait): mxkv fails at the call, naming the same problem, its outputs as
    they were"""
    _, theirs, ours = runs
    bad = []
    n = 0
    for i, t in sorted(theirs.items()):
        if CASES[i][0] == 'pull_nois':
            continue
        n += 1
        o = ours[i]
        if o['wait']:
            bad.append('failed at the wait: ' + show(i, t, o))
        elif not failed(t):
            if o['call'] or o['outs'] != t['outs']:
                bad.append(show(i, t, o))
        elif not o['call'] or o['outs'] != o['before']:
            bad.append(show(i, t, o))
        else:
            check = failed(t).split(' : ')[-1]
            said = [v for k, v in SAME_PROBLEM.items() if k in check]
            if not said or said[0] not in o['call']:
                bad.append('another problem named: ' + show(i, t, o))
    assert n > 700
    assert not bad, '%d of %d cases differ:\n%s' % (len(bad), n, '\n'.join(bad[:8]))


def test_a_row_sparse_keys_pull_into_a_dense_output_is_refused(runs):
    """MXNet's server aborts on it (not run there); mxkv refuses it at the call naming
    row_sparse_pull, writes nothing, and a broadcast refused so has not inited its key"""
    _, _, ours = runs
    crashes = [i for i, c in enumerate(CASES) if worker.mxnet_crashes(c)]
    assert len(crashes) == 15
    for i in crashes:
        o = ours[i]
        assert o['call'] and 'row_sparse_pull' in o['call'] and 'server aborts' in o['call'], \
            show(i, None, o)
        assert o['outs'] == o['before'], show(i, None, o)
        if CASES[i][0] == 'broadcast':
            assert o['inited'] is False, show(i, None, o)


def test_pull_without_ignore_sparse_is_the_local_stores(runs):
    """MXNet's dist store refuses pull(ignore_sparse=False); mxkv's does what MXNet's local
    store does with it (README deviation 22): the same outputs, or a failure where the
    local store's copy into a sparse output fails (a dtype change)"""
    _, theirs, ours = runs
    cases = [i for i, c in enumerate(CASES) if c[0] == 'pull_nois']
    assert len(cases) == 27
    for i in cases:
        t, o = theirs[i], ours[i]
        assert t['call'] and 'ignore_sparse' in t['call'], show(i, t, o)
        if failed({'call': t['local'], 'wait': None}):
            assert o['call'] and o['outs'] == o['before'], show(i, t, o)
        else:
            assert not failed(o) and o['outs'] == t['local_outs'], show(i, t, o)
        # mxkv's own local store agrees
        assert bool(o['local']) == bool(t['local']), show(i, t, o)
