"""Exact results of the dist stores over a grid of clusters, on real processes
(``tests/python/dist/grid_worker.py``, started by ``mxkv-launch`` through test_dist.launch:
127.0.0.1, ports chosen at run time, the launcher's --timeout plus a deadline on the launcher,
leftovers killed by pid).

* ``sums``: {1, 2, 4 workers} x {1, 2 servers} x {int, str keys} on dist_sync, plus 3 x 3,
  and four cells on dist_device_sync / dist_sync_device: float32 (two devices' values),
  float64, float16 keys, keys above MXNET_KVSTORE_BIGARRAY_BOUND (set to 200, so they are
  split over every server) in float32, float16 and float64, irregular shapes (3,7,5) and
  (5,7,6) (the latter split); three rounds of push + pull and pushpull with per-worker,
  per-round values that are multiples of 1/4, so every sum is exact in every dtype. Each
  worker checks every pulled array against the numpy sum and prints a sha256 digest of what
  it pulled; the whole scenario runs 4 times per job (fresh keys each time) and the digests
  must be identical, and equal to the digest this file computes from the inputs alone. One
  cell also runs as 4 separate jobs.
* ``sgd``: the same keys and rounds with ``set_optimizer(SGD(learning_rate=0.5))`` on sync
  stores: every pull and pushpull is w - 0.5 * (the sum of that step's pushes), exact.
* ``rsp_sgd``: row_sparse keys ((6,3), and (41,7) split by rows) with SGD on sync and async
  servers, each round's pushes leaving some rows out: 1 worker equals a local store at every
  pull; sync pulls after each round and the async end equal w0 - 0.5 * (every pushed row).
* ``async``: dist_async with ``set_optimizer(SGD(learning_rate=0.5))`` (MXNet sends only
  optimizers to dist servers; ``_set_updater`` stays local). With 1 worker the order is fixed:
  every pull after every push equals a local store running the same optimizer on the same
  pushes, bit for bit (float32 gradients not dyadic; float16/float64 keys get dyadic ones,
  since a dist server keeps them in float32 as MXNet 1.9.1's does and a local store does not).
  With 2 and 4 workers the pushes interleave; dyadic gradients make the result independent of
  the order: after every worker's pushes were answered and a barrier, the weights equal
  w0 - 0.5 * (sum of all gradients).
* ``rsp`` and ``2bit`` run on an all-mxkv cluster and on an all-real-MXNet-1.9.1 cluster
  (``T_LIB=mxnet``: the same script, whose ``import mxnet`` serves the scheduler and server
  roles), and every pulled value must be the same (equal digests, and equal to this file's).
  A real MXNet server races: a pull right after a push may read the stored value before the
  update landed, and with an updater its Python optimizer may not have run yet when the push
  is answered. So what is compared with MXNet is what that race cannot change: no updater
  (sync mode assigns the sum of the round), and every value is read after ``kv._barrier()``
  following the round's pushes, with a second barrier before the next round. ``rsp`` also
  pushes and pulls (after the barrier) the dense keys of ``sums``; float16 and float64 sums
  are exact in float32, so a real server's float32 copies of them give the same values.
  row_sparse: MXNet's server, without an updater, replaces its table by the merged pushed rows
  (rows nobody pushed disappear and later pulls read past the shrunk table; libmxkv keeps the
  table whole with zeros there: README deviation list, src/dist/server.rs). So in every round
  the workers' pushed rows together cover every row (each worker pushes its share of a
  partition of the rows, plus one row every worker pushes, so overlapping rows are summed),
  and the table stays whole on both; ``row_sparse_pull`` of all rows and of rows [0, 2, last]
  is compared, on a (6, 3) key and a (41, 7) key split by rows over the servers.
  2-bit: threshold 0.5, a (5, 7) key pushed as two devices' values and a (31, 7) key above
  the bound (217 values, not a multiple of 16, so the last server's part is shorter; at least
  16 values per server: MXNet's compressed split of fewer wraps a size_t); the
  pulled value of each round is the sum over workers of the dequantized pushes (the workers'
  residuals are simulated in numpy float32).
  Not compared with real MXNet: pulls right after a push, pushpull and any updater (racy on
  a real server, see above: a 4-worker dist_async job with SGD on row_sparse keys pulled rows
  without their last updates after the final barrier on real MXNet; they are checked on mxkv
  clusters against numpy and a local store),
  float16/float64 values that are not exact in float32 (a real server keeps them in float32,
  as ours does), and row_sparse rounds that leave rows out (MXNet's table then shrinks).
"""
import os
import re
import sys

import pytest

from test_dist import SCRIPTS, launch, _has_mxnet

if SCRIPTS not in sys.path:
    sys.path.insert(0, SCRIPTS)
import grid_worker  # noqa: E402  (numpy only: the expected values and digests)

pytestmark = pytest.mark.skipif(not os.path.isdir('/proc/self'), reason='needs Linux /proc')

BOUND = 200
ROUNDS = 3
REPEATS = 4
_OK = re.compile(r'^\[worker (\d+)\] GRID OK (\w+) rank (\d+) of (\d+) digest ([0-9a-f]{64})$',
                 re.M)
_DIGEST = re.compile(r'^\[worker (\d+)\] DIGEST (\w+) (\d+) ([0-9a-f]{64})$', re.M)


def run_grid(scenario, workers, servers, keys='int', kvtype=None, lib='mxkv',
             repeats=REPEATS, timeout=120, bound=BOUND):
    """Runs grid_worker.py; {rank: digest}, after checking every worker's lines."""
    env = {'T_SCENARIO': scenario, 'T_KEYS': keys, 'T_LIB': lib, 'T_REPEATS': str(repeats),
           'T_ROUNDS': str(ROUNDS), 'MXNET_KVSTORE_BIGARRAY_BOUND': str(bound)}
    if kvtype:
        env['T_KVTYPE'] = kvtype
    code, out = launch('grid_worker.py', workers, servers, env, timeout=timeout,
                       node_timeout=60)
    assert code == 0, out
    oks = {int(m[0]): m for m in _OK.findall(out)}
    assert sorted(oks) == list(range(workers)), out
    digests = {}
    for label, (rank, scen, rank2, n, digest) in oks.items():
        assert (scen, int(rank2), int(n)) == (scenario, label, workers), out
        reps = [d for (w, s, _, d) in _DIGEST.findall(out) if int(w) == label]
        assert reps == [digest] * repeats, out     # every repeat pulled the same
        digests[label] = digest
    return digests


def expected(scenario, workers, bound=BOUND):
    return grid_worker.expected_digest(scenario, workers, ROUNDS, bound)


GRID = [('dist_sync', w, s, k) for w in (1, 2, 4) for s in (1, 2) for k in ('int', 'str')]
GRID += [('dist_sync', 3, 3, 'int'),                 # splits into thirds
         ('dist_sync_device', 2, 2, 'str'),
         ('dist_device_sync', 1, 2, 'str'), ('dist_device_sync', 2, 1, 'int'),
         ('dist_device_sync', 4, 2, 'int')]


@pytest.mark.parametrize('kvtype,workers,servers,keys', GRID)
def test_exact_sums_grid(kvtype, workers, servers, keys):
    """every pulled and pushpulled value is the exact sum; 4 repeats in the job agree"""
    digests = run_grid('sums', workers, servers, keys, kvtype)
    assert set(digests.values()) == {expected('sums', workers)}


def test_exact_sums_with_keys_above_the_default_bound():
    """MXNet's default bound (10^6 values): the big keys are 4-8 MB, split over 2 servers"""
    digests = run_grid('sums', 2, 2, 'int', 'dist_sync', repeats=1, bound=1000000)
    assert set(digests.values()) == {expected('sums', 2, 1000000)}


def test_the_same_cluster_launched_four_times_pulls_the_same():
    """2 workers x 2 servers, str keys, as 4 separate jobs: the same digest each time"""
    runs = [run_grid('sums', 2, 2, 'str', 'dist_sync', repeats=1) for _ in range(4)]
    assert all(r == runs[0] for r in runs), runs
    assert set(runs[0].values()) == {expected('sums', 2)}


@pytest.mark.parametrize('kvtype,workers,servers,keys', [
    ('dist_sync', 1, 1, 'int'), ('dist_sync', 2, 2, 'str'), ('dist_sync', 4, 1, 'int'),
    ('dist_device_sync', 2, 2, 'int')])
def test_sync_sgd_on_the_servers(kvtype, workers, servers, keys):
    """the grid's keys with SGD on the servers: each pull / pushpull is w - lr * (the sum of
    that step's pushes), exact in every dtype"""
    digests = run_grid('sgd', workers, servers, keys, kvtype)
    assert set(digests.values()) == {expected('sgd', workers)}


def test_async_one_worker_equals_a_local_store():
    """1 worker: each pull after each push equals a local store with the same SGD (checked
    by the worker, bit for bit); the int-key and str-key jobs pull the same values"""
    a = run_grid('async', 1, 2, 'int')
    b = run_grid('async', 1, 1, 'str')
    assert a == b, (a, b)


@pytest.mark.parametrize('workers,servers,keys', [(2, 2, 'int'), (4, 2, 'str'), (4, 1, 'int')])
def test_async_several_workers_sum_every_update(workers, servers, keys):
    """the updates of every worker's pushes all land: w0 - lr * sum of every gradient"""
    digests = run_grid('async', workers, servers, keys)
    assert set(digests.values()) == {expected('async', workers)}


@pytest.mark.parametrize('kvtype,workers,servers,keys', [
    ('dist_sync', 1, 2, 'int'), ('dist_sync', 2, 2, 'str'), ('dist_sync', 4, 1, 'int'),
    ('dist_async', 1, 1, 'str'), ('dist_async', 4, 2, 'int')])
def test_row_sparse_with_sgd_on_the_servers(kvtype, workers, servers, keys):
    """row_sparse pushes leaving rows out, SGD on the servers: only pushed rows move;
    1 worker equals a local store, sync rounds and the async end are w0 - lr * rows pushed"""
    digests = run_grid('rsp_sgd', workers, servers, keys, kvtype)
    assert set(digests.values()) == {expected('rsp_sgd', workers)}


def _need_mxnet():
    if not _has_mxnet():
        pytest.skip('no mxnet 1.9.1 in this Python (make venv-ref)')


@pytest.mark.parametrize('scenario,workers,servers,keys,kvtype', [
    ('rsp', 1, 2, 'str', 'dist_sync'), ('rsp', 2, 1, 'int', 'dist_sync'),
    ('rsp', 4, 2, 'int', 'dist_sync'),
    ('2bit', 2, 2, 'str', 'dist_sync'),
    ('2bit', 4, 2, 'int', 'dist_sync'), ('2bit', 2, 1, 'int', 'dist_device_sync'),
    ('rsp', 3, 3, 'str', 'dist_sync'), ('2bit', 3, 3, 'int', 'dist_sync'),   # uneven splits
])
def test_rsp_and_2bit_pull_what_a_real_mxnet_cluster_pulls(scenario, workers, servers, keys,
                                                            kvtype):
    """the same job on real MXNet 1.9.1 nodes and on mxkv nodes: every pulled value equal
    (what is compared and why: the module docstring)"""
    _need_mxnet()
    ours = run_grid(scenario, workers, servers, keys, kvtype)
    theirs = run_grid(scenario, workers, servers, keys, kvtype, lib='mxnet')
    assert ours == theirs, (ours, theirs)
    assert set(ours.values()) == {expected(scenario, workers)}
