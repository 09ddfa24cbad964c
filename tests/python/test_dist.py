"""The dist stores through Python, end to end: ``mxkv-launch`` starts a scheduler, servers and
workers of ``mxkv`` (the worker scripts in ``tests/python/dist/``) on 127.0.0.1, with ports
chosen at run time. Servers and the scheduler are the same script: ``import mxkv`` with
``DMLC_ROLE=server``/``scheduler`` runs that role (``mxkv/kvstore/kvstore_server.py``).

Every run is bounded twice: the launcher's own ``--timeout`` (it stops every node and exits
124) and this file's deadline on the launcher, after which the launcher is stopped by its pid
(SIGTERM, then SIGKILL). Each run's processes carry a unique tag in their environment; after
the run, any process still carrying it is reported and killed by its pid.
"""
import os
import re
import subprocess
import sys
import time
import uuid

import pytest

from conftest import BINDINGS, REPO
from distproc import communicate_or_stop, reap

LAUNCH = os.path.join(BINDINGS, 'mxkv_launch.py')
SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'dist')
PY = sys.executable

pytestmark = pytest.mark.skipif(not os.path.isdir('/proc/self'), reason='needs Linux /proc')


def launch(script, workers, servers, env_extra=None, timeout=120, node_timeout=None,
           command=None):
    """Runs `script` on a cluster of `workers` x `servers`; (exit code, output)."""
    tag = uuid.uuid4().hex
    env = dict(os.environ)
    env['PYTHONPATH'] = BINDINGS + os.pathsep + env.get('PYTHONPATH', '')
    env.setdefault('MXKV_LIBRARY_PATH', os.path.join(REPO, 'target', 'release', 'libmxkv.so'))
    env['MXKV_TEST_TAG'] = tag
    env['MXKV_TIMEOUT_S'] = str(node_timeout or timeout)
    for k in list(env):
        if k.startswith('DMLC_') or k == 'PORT':
            del env[k]
    env.update(env_extra or {})
    cmd = [PY, LAUNCH, '-n', str(workers), '-s', str(servers), '--timeout', str(timeout),
           '--'] + (command or [PY]) + [os.path.join(SCRIPTS, script)]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                         start_new_session=True)
    try:
        out, finished = communicate_or_stop(p, timeout + 30)
        if not finished:
            pytest.fail('the cluster did not finish in %d s:\n%s' % (timeout + 30,
                                                                     out.decode()))
    finally:
        left = reap(tag)
    assert not left, 'processes left behind: %r' % left
    return p.returncode, out.decode()


@pytest.mark.parametrize('kvtype,keys,workers,servers', [
    ('dist_sync', 'int', 2, 2),
    ('dist_sync', 'str', 2, 2),
    ('dist_device_sync', 'int', 2, 1),
    ('dist_sync_device', 'str', 1, 2),
])
def test_exact_sums_over_rounds(kvtype, keys, workers, servers):
    """init/push (two devices' values per key)/pull/pushpull, a key split over the servers
    (above MXNET_KVSTORE_BIGARRAY_BOUND), a float64 key, an int32 push refused at the call"""
    code, out = launch('sums_worker.py', workers, servers, {
        'T_KVTYPE': kvtype, 'T_KEYS': keys, 'MXNET_KVSTORE_BIGARRAY_BOUND': '1000'})
    assert code == 0, out
    for r in range(workers):
        assert '[worker %d] OK rank %d of %d' % (r, r, workers) in out, out


@pytest.mark.parametrize('lane', ['1', '0'])
def test_our_workers_and_servers_talk_over_lanes_unless_told_not_to(lane):
    """libmxkv's workers reach libmxkv's servers over lanes (direct connections beside the
    van, one per worker and server) unless MXKV_LANE=0; the sums are the same either way"""
    code, out = launch('sums_worker.py', 2, 2, {
        'T_KVTYPE': 'dist_sync', 'T_KEYS': 'int', 'MXNET_KVSTORE_BIGARRAY_BOUND': '1000',
        'MXKV_LANE': lane, 'PS_VERBOSE': '1'})
    assert code == 0, out
    for r in range(2):
        assert '[worker %d] OK rank %d of 2' % (r, r) in out, out
    lanes = re.findall(r'\[mxkv worker\] lane to server (\d) \(id \d+\) at 127\.0\.0\.1:\d+$',
                       out, re.M)
    assert sorted(lanes) == (['0', '0', '1', '1'] if lane == '1' else []), out


@pytest.mark.parametrize('kvtype,workers,servers', [
    ('dist_sync', 2, 2),
    ('dist_device_sync', 2, 1),
    ('dist_async', 1, 2),      # async: an update per push, deterministic with one worker
])
def test_sgd_momentum_on_the_servers_equals_a_local_store(kvtype, workers, servers):
    """set_optimizer pickles SGD(momentum) to the servers; after 4 rounds each worker's weights
    are bit-identical to the same optimizer on a local store fed the summed gradients"""
    code, out = launch('sgd_worker.py', workers, servers, {'T_KVTYPE': kvtype})
    assert code == 0, out
    for r in range(workers):
        assert '[worker %d] OPT OK rank %d' % (r, r) in out, out


@pytest.mark.parametrize('workers,servers,bound', [
    (1, 1, '1000000'),   # one server: replies adopted by the output
    (2, 2, '1000000'),   # a whole key on one of two servers
    (2, 2, '1000'),      # split over both servers: replies copied into the output
])
def test_large_values_move_without_copies_and_stay_right(workers, servers, bound):
    """pushed arrays written at once still push what they held; a numpy view taken before a
    pull sees the pulled value; adopted replies can be written; pushpull into the pushed array"""
    code, out = launch('zerocopy_worker.py', workers, servers,
                       {'MXNET_KVSTORE_BIGARRAY_BOUND': bound})
    assert code == 0, out
    for r in range(workers):
        assert '[worker %d] ZC OK rank %d of %d' % (r, r, workers) in out, out


@pytest.mark.parametrize('workers,servers', [(1, 1), (2, 1)])
def test_big_replies_land_in_memory_the_library_keeps(workers, servers):
    """after a warm-up, 8 pushpulls of a 32 MB value fault in fewer pages than one reply
    has: libzmq's receive buffers come from blocks the library keeps (without them, glibc
    maps every reply afresh and each one faults in all of its 8192 pages)"""
    code, out = launch('bigblocks_worker.py', workers, servers)
    assert code == 0, out
    for r in range(workers):
        m = re.search(r'\[worker %d\] BB OK rank %d faults (\d+) in 8 pushpulls of (\d+) pages'
                      % (r, r), out)
        assert m, out
        faults, pages = int(m.group(1)), int(m.group(2))
        assert faults < pages, (faults, pages, out)


def test_a_worker_that_leaves_early_fails_the_job_without_a_hang():
    """worker 1 exits (code 3) right after creating the store; worker 0's sync round cannot
    complete: it fails at the node deadline (MXKV_TIMEOUT_S) naming the missing worker, the
    job ends non-zero before the launcher's own timeout, nothing is left behind"""
    t0 = time.time()
    code, out = launch('sums_worker.py', 2, 1, {'T_KVTYPE': 'dist_sync', 'T_FAIL_RANK': '1'},
                       timeout=90, node_timeout=8)
    assert code not in (0, 124), out
    assert 'failing on purpose' in out, out
    assert time.time() - t0 < 80, out


def _has_mxnet():
    r = subprocess.run([PY, '-c', 'import mxnet; print(mxnet.__version__)'],
                       stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=120)
    return r.returncode == 0 and r.stdout.strip() == b'1.9.1'


@pytest.mark.parametrize('servers', [1, 2])
def test_our_workers_with_a_real_mxnet_scheduler_and_servers(servers):
    """the scheduler and servers run `import mxnet` (real MXNet 1.9.1), the workers mxkv"""
    if not _has_mxnet():
        pytest.skip('no mxnet 1.9.1 in this Python (make venv-ref)')
    role_switch = ('if [ "$DMLC_ROLE" = worker ]; then exec "$0" "$1"; '
                   'else exec "$0" -c "import mxnet"; fi')
    code, out = launch('interop_worker.py', 2, servers,
                       {'MXNET_KVSTORE_BIGARRAY_BOUND': '10'}, timeout=100,
                       command=['sh', '-c', role_switch, PY])
    assert code == 0, out
    for r in range(2):
        assert '[worker %d] INTEROP OK rank %d of 2' % (r, r) in out, out


@pytest.mark.parametrize('case', [
    'dist_sync_assign_t0.5', 'dist_sync_optimizer_t0.5', 'dist_sync_device_assign_t0.5',
    'dist_sync_assign_t0.1234567', 'dist_sync_assign_t1e-07'])
def test_2bit_compressed_pushes_pull_what_a_real_mxnet_cluster_pulled(case):
    """tests/vectors/compression/dist_sync_sequences.json, captured from MXNet 1.9.1 (1 server,
    2 workers): every pulled value after each compressed push is the same"""
    vectors = os.path.join(REPO, 'tests', 'vectors', 'compression', 'dist_sync_sequences.json')
    code, out = launch('compression_worker.py', 2, 1, {'T_VECTORS': vectors, 'T_CASE': case})
    assert code == 0, out
    assert '[worker 0] GC OK rank 0' in out and '[worker 1] GC OK rank 1' in out, out
