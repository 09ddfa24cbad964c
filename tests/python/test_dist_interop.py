"""Interoperation of our dist store with real MXNet 1.9.1 nodes, end to end through
``mxkv-launch`` (tests/python/test_dist.py's ``launch``: 127.0.0.1, ports chosen at run time,
the launcher's own --timeout plus a deadline on the launcher, leftovers killed by pid).

Every node runs ``tests/python/dist/mixed_worker.py`` through a role switch: a worker whose
DMLC_TASK_ID (= its rank: the launcher pins ports in rank order) is listed in
T_REAL_WORKERS runs as a real MXNet worker (``import mxnet``), the others as ours
(``import mxkv``); the scheduler and servers are real MXNet (``python -c 'import mxnet'``)
with T_REAL_NODES=1, else ours (``python -c 'import mxkv'``).

Against real MXNet servers only what their asynchronous copy into the stored value cannot
change is asserted: sums without an updater and values read after a barrier that follows
every worker's answered push; with an optimizer, that each value is one the optimizer's
trajectory takes (and not one a server without it would hold); and a clean completion.

Several dist stores in one process: real MXNet 1.9.1 cannot create a second ``dist_sync``
store in a worker. Probed with two real MXNet workers and a real scheduler and server
(``mx.kv.create('dist_sync')`` twice): the first call returns, the second never does
(MXNet's KVStoreDist constructor waits on a barrier of all nodes under a new customer id,
which the servers and the scheduler never join); the job ran into the launcher's timeout.
libmxkv refuses the second store with a clear error instead (its servers share one key
space, so a second store could not be independent of the first).
"""
import os
import pickle
import re
import subprocess

import numpy as np
import pytest

from test_dist import PY, _has_mxnet, launch

pytestmark = [
    pytest.mark.skipif(not os.path.isdir('/proc/self'), reason='needs Linux /proc'),
]

ROLE_SWITCH = (
    'if [ "$DMLC_ROLE" = worker ]; then '
    '  case " $T_REAL_WORKERS " in *" $DMLC_TASK_ID "*) T_IMPL=mxnet;; *) T_IMPL=mxkv;; esac; '
    '  export T_IMPL; exec "$0" "$1"; '
    'elif [ "$T_REAL_NODES" = 1 ] || { [ "$DMLC_ROLE" = scheduler ] && '
    '    [ "$T_REAL_SCHEDULER" = 1 ]; }; then echo "node: mxnet"; exec "$0" -c "import mxnet"; '
    'else echo "node: mxkv"; exec "$0" -c "import mxkv"; fi')


@pytest.fixture(scope='module')
def real_mxnet():
    if not _has_mxnet():
        pytest.skip('no mxnet 1.9.1 in this Python (make venv-ref)')


def mixed(case, workers, servers, real_workers=(), real_nodes=False, env=None, timeout=100):
    """Runs mixed_worker.py's `case`; (exit code, output)."""
    e = {'T_CASE': case,
         'T_REAL_WORKERS': ' '.join(str(r) for r in real_workers),
         'T_REAL_NODES': '1' if real_nodes else '',
         'MXNET_KVSTORE_BIGARRAY_BOUND': '20',
         'OMP_NUM_THREADS': '1'}
    if real_nodes:
        e['T_SAFE'] = '1'
    e.update(env or {})
    return launch('mixed_worker.py', workers, servers, e, timeout=timeout,
                  command=['sh', '-c', ROLE_SWITCH, PY])


def check_nodes(out, servers, real_nodes):
    """the scheduler and every server ran the implementation the test asked for"""
    kind = 'mxnet' if real_nodes else 'mxkv'
    for label in ['scheduler'] + ['server %d' % s for s in range(servers)]:
        assert '[%s] node: %s' % (label, kind) in out, out


def impl(rank, real_workers):
    return 'mxnet' if rank in real_workers else 'mxkv'


# --- 1. exact sums ----------------------------------------------------------------------

@pytest.mark.parametrize('keys', ['int', 'str'])
@pytest.mark.parametrize('servers', [1, 2])
@pytest.mark.parametrize('real_rank', [0, 1])
def test_mixed_workers_on_our_servers_sum_exactly(real_mxnet, real_rank, servers, keys):
    """one real MXNet worker and one of ours, our scheduler and servers: four rounds of
    push (two devices' values) and pull without barriers, a (3, 5, 7) key above the bound
    (split when there are 2 servers), pushpull; every value exact on both workers"""
    code, out = mixed('sums', 2, servers, [real_rank], env={'T_KEYS': keys})
    assert code == 0, out
    check_nodes(out, servers, False)
    for r in range(2):
        assert '[worker %d] MIX SUMS OK %s rank %d of 2' % (r, impl(r, [real_rank]), r) in out, out


@pytest.mark.parametrize('scheduler', ['mxnet', 'mxkv'])
def test_our_workers_and_servers_take_lanes_only_through_our_scheduler(real_mxnet, scheduler):
    """our workers and servers under a real MXNet scheduler, which drops the lane port
    from our servers' registrations: no lanes, everything through ZeroMQ, sums exact; under
    our scheduler each worker has a lane to each server"""
    code, out = mixed('sums', 2, 2, [], env={
        'T_KEYS': 'int', 'PS_VERBOSE': '1',
        'T_REAL_SCHEDULER': '1' if scheduler == 'mxnet' else ''})
    assert code == 0, out
    assert '[scheduler] node: %s' % scheduler in out, out
    for r in range(2):
        assert '[worker %d] MIX SUMS OK mxkv rank %d of 2' % (r, r) in out, out
    lanes = re.findall(r'\[mxkv worker\] lane to server \d \(id \d+\) at', out)
    assert len(lanes) == (0 if scheduler == 'mxnet' else 4), out


@pytest.mark.parametrize('real_rank', [0, 1])
def test_mixed_workers_dist_device_sync_and_row_sparse(real_mxnet, real_rank):
    """the mix on dist_device_sync (sums as above, 2 servers), and row_sparse pushes with
    row_sparse_pull on dist_sync (sums of the pushed rows)"""
    code, out = mixed('sums', 2, 2, [real_rank], env={'T_KVTYPE': 'dist_device_sync'})
    assert code == 0, out
    for r in range(2):
        assert '[worker %d] MIX SUMS OK %s rank %d of 2' % (r, impl(r, [real_rank]), r) in out, out
    code, out = mixed('rsp', 2, 2, [real_rank])
    assert code == 0, out
    for r in range(2):
        assert '[worker %d] MIX RSP OK %s rank %d' % (r, impl(r, [real_rank]), r) in out, out


@pytest.mark.parametrize('servers', [1, 2])
def test_mixed_workers_on_real_mxnet_servers(real_mxnet, servers):
    """the same mix with a real MXNet scheduler and real servers: sums read after a barrier
    that follows every answered push, and every node exits 0"""
    code, out = mixed('sums', 2, servers, [0], real_nodes=True)
    assert code == 0, out
    check_nodes(out, servers, True)
    assert '[worker 0] MIX SUMS OK mxnet rank 0 of 2' in out, out
    assert '[worker 1] MIX SUMS OK mxkv rank 1 of 2' in out, out


@pytest.mark.parametrize('real_nodes', [False, True])
@pytest.mark.parametrize('real_rank', [0, 1])
def test_mixed_workers_2bit_compressed_pushes(real_mxnet, real_rank, real_nodes):
    """2-bit compression across the mix (rank 0, real or ours, tells the servers): four
    rounds of compressed pushes of a key split over 2 servers; each worker quantises with
    its own residual, every pulled value is the sum of both quantised pushes (our servers,
    or real ones read after a barrier)"""
    code, out = mixed('gc', 2, 2, [real_rank], real_nodes=real_nodes)
    assert code == 0, out
    check_nodes(out, 2, real_nodes)
    for r in range(2):
        assert '[worker %d] MIX GC OK %s rank %d' % (r, impl(r, [real_rank]), r) in out, out


# --- 2. SGD with momentum on our servers ---------------------------------------------------

ROUNDS = 5
SHAPE = (3, 5, 7)


def _grad(rank, t):
    return (np.arange(105, dtype=np.float32).reshape(SHAPE) * (rank + 1) + t) / 3


def _w0():
    return np.arange(105, dtype=np.float32).reshape(SHAPE) / 7


def _local_trajectory(m, rounds, workers=2):
    """`m`'s local store with SGD(momentum) fed the workers' summed gradients: the weights
    pulled after each round"""
    kv = m.kv.create('local')
    kv.set_optimizer(m.optimizer.SGD(learning_rate=0.1, momentum=0.9, wd=0.01))
    kv.init(5, m.nd.array(_w0()))
    out = m.nd.zeros(SHAPE)
    seen = []
    for t in range(rounds):
        g = _grad(0, t)
        for r in range(1, workers):
            g = g + _grad(r, t)      # float32; with 2 workers the order cannot matter
        kv.push(5, m.nd.array(g))
        kv.pull(5, out=out)
        seen.append(out.asnumpy().copy())
    return np.stack(seen)


@pytest.mark.parametrize('servers', [1, 2])
@pytest.mark.parametrize('real_rank', [0, 1])
def test_sgd_momentum_across_the_mix_equals_local_stores(real_mxnet, mxnet, mxkv, tmp_path,
                                                         real_rank, servers):
    """both workers send their optimizer (the real one MXNet's pickle, ours mxkv's); after
    each of 5 rounds both workers pulled weights bit-identical to mxkv's local store and to
    real MXNet's local store with the same optimizer fed the summed gradients"""
    code, out = mixed('sgd', 2, servers, [real_rank],
                      env={'T_OUT': str(tmp_path), 'T_ROUNDS': str(ROUNDS)})
    assert code == 0, out
    check_nodes(out, servers, False)
    got = [np.load(str(tmp_path / ('w%d.npy' % r))) for r in range(2)]
    want_mxkv = _local_trajectory(mxkv, ROUNDS)
    want_mxnet = _local_trajectory(mxnet, ROUNDS)
    assert want_mxkv.tobytes() == want_mxnet.tobytes()
    assert not np.array_equal(want_mxkv[-1], _w0())
    for r in range(2):
        assert got[r].dtype == np.float32 and got[r].shape == (ROUNDS,) + SHAPE
        for t in range(ROUNDS):
            assert got[r][t].tobytes() == want_mxkv[t].tobytes(), (
                'worker %d (%s) round %d:\n%r\nwant\n%r' % (
                    r, impl(r, [real_rank]), t, got[r][t], want_mxkv[t]))


# --- 3. our optimizer pickle on real MXNet servers -------------------------------------------

def test_our_set_optimizer_runs_on_real_mxnet_servers(real_mxnet, mxnet, tmp_path):
    """our workers' set_optimizer(SGD momentum) pickle is unpickled by real MXNet servers
    (2 servers, the key split over both), which then apply it: every value read after a
    round's barrier is the value that element takes somewhere on the optimizer's trajectory
    (never the plain sum a server without an updater would hold), the last read is past the
    first update, and every node exits 0"""
    code, out = mixed('sgd', 2, 2, [], real_nodes=True,
                      env={'T_OUT': str(tmp_path), 'T_ROUNDS': str(ROUNDS)})
    assert code == 0, out
    check_nodes(out, 2, True)
    traj = np.concatenate([_w0()[None], _local_trajectory(mxnet, ROUNDS)])  # w_0 .. w_N
    flat = traj.reshape(ROUNDS + 1, -1)
    # what a server without the optimizer would hold after the last round: no element of
    # it is a value its element takes on the trajectory past w_0, so it cannot pass
    plain = (_grad(0, ROUNDS - 1) + _grad(1, ROUNDS - 1)).ravel()
    assert not any(v in flat[1:, i] for i, v in enumerate(plain))
    for r in range(2):
        got = np.load(str(tmp_path / ('w%d.npy' % r)))
        for t in range(ROUNDS):
            for i, v in enumerate(got[t].ravel()):
                # a read after round t sees w_0 .. w_(t+1) (t counted from 0) for its element
                assert v in flat[:t + 2, i], (r, t, i, v)
        last = got[-1].ravel()
        assert all(v in flat[1:, i] for i, v in enumerate(last)), (r, last)


# --- 4. a pickle that would run code, over the wire -------------------------------------------

class _RunsCode(object):
    """unpickling it calls os.system('touch marker'), or creates a subprocess.Popen (a class)
    running touch"""

    def __init__(self, marker, how):
        self.marker, self.how = marker, how

    def __reduce__(self):
        if self.how == 'os.system':
            return (os.system, ('touch %s' % self.marker,))
        return (subprocess.Popen, (['touch', self.marker],))


@pytest.mark.parametrize('how,named', [('os.system', 'posix.system'),
                                       ('subprocess.Popen', 'subprocess.Popen')])
@pytest.mark.parametrize('sender', ['mxnet', 'mxkv'])
def test_code_running_pickle_refused_by_our_servers(real_mxnet, tmp_path, sender, how, named):
    """a real MXNet worker (`kv._send_command_to_servers(0, payload)`) or ours (the C call
    MXKVStoreSendCommmandToServers with head 0, kController) sends a pickle whose loading
    would run a command (through os.system, or the class subprocess.Popen): both of our
    servers refuse it naming the global, the marker file is never created, no updater is
    installed (the plain sums that follow are exact) and the job ends cleanly"""
    marker = tmp_path / 'ran'
    payload = tmp_path / 'payload'
    payload.write_bytes(pickle.dumps(_RunsCode(str(marker), how), 0))
    # the same payload is live: plain pickle.loads runs it (with another marker)
    control = tmp_path / 'control'
    subprocess.run([PY, '-c', 'import pickle, sys; o = pickle.loads(sys.stdin.buffer.read()); '
                    'getattr(o, "wait", int)()'],     # a Popen: wait for touch to finish
                   input=pickle.dumps(_RunsCode(str(control), how), 0), timeout=60, check=True)
    assert control.exists()
    real = [0]          # the real worker is rank 0, ours rank 1
    sender_rank = 0 if sender == 'mxnet' else 1
    code, out = mixed('command', 2, 2, real,
                      env={'T_SENDER': str(sender_rank), 'T_PAYLOAD': str(payload)})
    assert code == 0, out
    check_nodes(out, 2, False)
    assert '[worker %d] PAYLOAD SENT %s rank %d' % (sender_rank, sender, sender_rank) in out, out
    for r in range(2):
        assert '[worker %d] PLAIN SUMS OK %s rank %d' % (r, impl(r, real), r) in out, out
    for s in range(2):
        lines = [l for l in out.splitlines() if l.startswith('[server %d]' % s)
                 and 'refused' in l]
        # (protocol 0 writes Python 2 names: subprocess.Popen goes as commands.Popen, which
        # the text shows with its Python 3 name)
        assert any('global ' in l and named in l and 'is not allowed' in l for l in lines), out
    assert not marker.exists()


# --- 5. several dist stores in one process ----------------------------------------------

def test_a_second_dist_store_in_a_worker_is_refused_clearly():
    """real MXNet 1.9.1 hangs creating a second dist_sync store in a worker (module
    docstring); ours refuses it at once with an error saying why, and the first store goes
    on summing exactly"""
    code, out = mixed('two', 2, 1, [], timeout=60)
    assert code == 0, out
    for r in range(2):
        assert '[worker %d] SECOND STORE REFUSED: ' % r in out, out
        assert '[worker %d] STORES OK mxkv rank %d (1)' % (r, r) in out, out
    line = [l for l in out.splitlines() if l.startswith('[worker 0] SECOND STORE REFUSED')][0]
    assert 'already has a dist store' in line, line
