"""mxkv-launch out of file descriptors (a low ``ulimit -n``, many nodes).

The launcher binds one socket per node at once to choose free ports, and holds two pipes
per running node. Out of descriptors, choosing the ports ended in a Python traceback
(``OSError: [Errno 24] Too many open files`` from ``socket.socket``), and a node that could
not be started was reported as 'not executable' (exit 126). Now either is one line naming
the open-file limit and what the job needs, the nodes already started are stopped (none is
left behind) and the exit status is 1.
"""
import os
import re
import resource
import subprocess
import sys
import uuid

import pytest

from conftest import BINDINGS
from distproc import tagged

LAUNCH = os.path.join(BINDINGS, 'mxkv_launch.py')

pytestmark = pytest.mark.skipif(not os.path.isdir('/proc/self'), reason='needs Linux /proc')


def _launch(limit, args, tag):
    def lower():
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))
    env = dict(os.environ)
    env['MXKV_TEST_TAG'] = tag
    return subprocess.run([sys.executable, LAUNCH] + args, capture_output=True, text=True,
                          timeout=90, env=env, preexec_fn=lower, start_new_session=True)


def _kill_tagged(tag):
    for pid in tagged(tag):
        try:
            os.kill(pid, 9)
        except OSError:
            pass


def test_too_few_descriptors_to_choose_the_ports():
    tag = uuid.uuid4().hex
    try:
        r = _launch(12, ['-n', '40', '-s', '10', '--timeout', '30', '--', 'sleep', '30'], tag)
    finally:
        _kill_tagged(tag)
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert 'Traceback' not in r.stderr, r.stderr
    assert r.stderr.splitlines() == [
        'mxkv-launch: error: cannot choose free ports: too many open files (the open-file '
        'limit, ulimit -n, is 12; the launcher needs about 118 for 51 nodes: two pipes per '
        'node)'], r.stderr
    assert r.stdout == ''


def test_too_few_descriptors_to_start_every_node_stops_the_started_ones():
    tag = uuid.uuid4().hex
    try:
        r = _launch(64, ['-n', '40', '-s', '10', '--timeout', '60', '--grace', '2', '--',
                         'sleep', '30'], tag)
        left = tagged(tag)
    finally:
        _kill_tagged(tag)
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert 'Traceback' not in r.stderr, r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    assert re.match(r'\[mxkv-launch\] cannot start worker \d+: too many open files \(the '
                    r'open-file limit, ulimit -n, is 64; the launcher needs about 118 for 51 '
                    r'nodes: two pipes per node\); stopping scheduler, server 0, ', lines[0]), \
        lines[0]
    assert left == [], 'processes left behind: %r' % left


def test_no_thread_for_a_started_node_ends_it_at_once():
    """Out of threads (here: 256 MiB thread stacks under a 1 GiB address space) after a
    node's process was started: nothing read its output or waited for it, so the job
    waited --grace, then 10 s after SIGKILL, and said the node 'did not end ... giving up
    on them' (it was a zombie nobody reaped). Now the node is killed and reaped where it
    was started, and the job ends at once."""
    def lower():
        resource.setrlimit(resource.RLIMIT_STACK, (256 << 20, 256 << 20))
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
    probe = subprocess.run(
        [sys.executable, '-c', 'import threading, time\n'
         'ts = [threading.Thread(target=time.sleep, args=(1,), daemon=True) for _ in range(8)]\n'
         'for t in ts: t.start()'], capture_output=True, text=True, timeout=60,
        preexec_fn=lower)
    if probe.returncode == 0:
        pytest.skip('threads do not take their stack size from RLIMIT_STACK here')
    tag = uuid.uuid4().hex
    env = dict(os.environ)
    env['MXKV_TEST_TAG'] = tag
    try:
        r = subprocess.run([sys.executable, LAUNCH, '-n', '3', '-s', '2', '--timeout', '60',
                            '--grace', '5', '--', 'sleep', '30'], capture_output=True,
                           text=True, timeout=90, env=env, preexec_fn=lower,
                           start_new_session=True)
        left = tagged(tag)
    finally:
        _kill_tagged(tag)
    assert r.returncode == 1, (r.returncode, r.stderr)
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    m = re.match(r"\[mxkv-launch\] cannot start (scheduler|server \d|worker \d): can't start "
                 r"new thread(; stopping (.*))?$", lines[0])
    assert m, lines[0]
    # the node that could not get its threads is not among those still to stop
    assert m.group(1) not in (m.group(3) or '').split(', '), lines[0]
    assert left == [], 'processes left behind: %r' % left
