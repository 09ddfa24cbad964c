"""Dist inits that fail, through Python on a cluster of real processes (``mxkv-launch`` on
127.0.0.1, ports chosen at run time; the worker script is ``tests/python/dist/init_worker.py``),
and environment values too large for a deadline.

An init that cannot succeed fails on every rank alike (before, only rank 0, which alone encodes
and sends an init, failed: it skipped the workers' barrier, and every later barrier paired with
the wrong one), and registers nothing. Every run is bounded by the launcher's ``--timeout`` and
by ``launch``'s own deadline (``test_dist.launch``), and leaves no process behind.
"""
import os
import subprocess
import sys

import pytest

from conftest import BINDINGS, REPO
from test_dist import launch

pytestmark = pytest.mark.skipif(not os.path.isdir('/proc/self'), reason='needs Linux /proc')


@pytest.mark.parametrize('workers,servers', [(2, 3), (2, 1), (1, 1)])
def test_a_refused_init_fails_on_every_rank_and_keeps_them_paired(workers, servers):
    code, out = launch('init_worker.py', workers, servers, timeout=60, node_timeout=20)
    assert code == 0, out
    assert 'panic' not in out, out
    for r in range(workers):
        assert '[worker %d] OK rank %d of %d' % (r, r, workers) in out, out
        if servers == 3:
            assert out.count('rank %d: init 215330 refused' % r) == 2, out


@pytest.mark.parametrize('var,value', [
    ('MXKV_TIMEOUT_S', '1e20'),
    ('MXKV_TIMEOUT_S', '1e19'),
    ('PS_HEARTBEAT_INTERVAL', '1e19'),
    ('PS_RESEND_TIMEOUT', '18446744073709551615'),
])
def test_a_duration_too_large_is_refused_naming_the_variable(var, value):
    """Before: a panic converting to a Duration, or an overflow adding it to an Instant (on the
    node's thread or the van's). Now create() fails with an error naming the variable; no node
    is started (the configuration is read first), so nothing else is needed."""
    env = dict(os.environ)
    env['PYTHONPATH'] = BINDINGS + os.pathsep + env.get('PYTHONPATH', '')
    env.setdefault('MXKV_LIBRARY_PATH', os.path.join(REPO, 'target', 'release', 'libmxkv.so'))
    for k in list(env):
        if k.startswith(('DMLC_', 'PS_', 'MXKV_TIMEOUT')) or k == 'PORT':
            del env[k]
    env.update(DMLC_ROLE='worker', DMLC_PS_ROOT_URI='127.0.0.1', DMLC_PS_ROOT_PORT='1',
               DMLC_NUM_WORKER='1', DMLC_NUM_SERVER='1', DMLC_NODE_HOST='127.0.0.1')
    env[var] = value
    code = ("import mxkv as mx\n"
            "try:\n"
            "    mx.kv.create('dist_sync')\n"
            "except mx.base.MXNetError as e:\n"
            "    print('REFUSED', e)\n")
    p = subprocess.run([sys.executable, '-c', code], env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=60)
    out = p.stdout.decode()
    assert p.returncode == 0, out
    assert 'REFUSED' in out and var in out, out
    assert 'panic' not in out, out
