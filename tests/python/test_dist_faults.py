"""Faults in a cluster of real OS processes (libmxkv through ``import mxkv``) on 127.0.0.1.

The scheduler and the servers run ``python -c 'import mxkv'`` with ``DMLC_ROLE=scheduler`` /
``server`` (the role runs at import, as with ``import mxnet``); the workers run
``tests/python/dist/fault_worker.py``. The nodes get the environment ``mxkv-launch`` would give
them (``mxkv_launch.build_nodes``: ports free at run time, pinned so that a node's rank is the
rank the launcher gave it), but each is started here, on its own, so that the test can see what
every node reports when another one fails, and can kill one by its process group.

Each case: every node that survives ends on its own, with an error naming the cause (the lost
node's role and rank, the key where it applies), well before its deadline; nothing is left
behind. Synchronisation is on the nodes' output lines (a worker prints ``rank 1 round 2
pushed`` and the test waits for that line before it kills), never on a sleep. Bounds: each node
runs under ``timeout(1)`` in its own process group, each test under SIGALRM; at the end the
group of every node still running is killed by its id, and any process still carrying the
test's tag is reported (the test fails) and killed by its pid.

``T_FAULTS_REPORT=1`` prints every node's output with the time of each line.
"""
import os
import re
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import uuid

import pytest

from conftest import BINDINGS, REPO
from distproc import tagged

import mxkv_launch  # from BINDINGS (conftest); stdlib only: builds the nodes' environments

PY = sys.executable
WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'dist', 'fault_worker.py')
SERVE = 'import mxkv'  # a server or scheduler node: the role runs at import, then exits
NODE_LIMIT = 50        # timeout(1) on every node, seconds
TEST_ALARM = 75        # SIGALRM on every test, seconds
WAIT = 40              # the longest the test waits for a line or an exit

pytestmark = pytest.mark.skipif(not os.path.isdir('/proc/self'), reason='needs Linux /proc')


class Alarm(Exception):
    """The test's hard deadline passed."""


@pytest.fixture(autouse=True)
def hard_alarm():
    def ring(signum, frame):
        raise Alarm('the test did not end within %d s' % TEST_ALARM)
    old = signal.signal(signal.SIGALRM, ring)
    signal.alarm(TEST_ALARM)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


class Node(object):
    """A started node: its process (``timeout`` leading its own process group) and its
    output lines, stdout and stderr in the order they were read (by a thread each: two pipes,
    so that a line the library logs on stderr, which it may write in several pieces, never
    splits a line the script prints)."""

    def __init__(self, label, argv, env, stdin, t0):
        self.label = label
        self.t0 = t0
        self.proc = subprocess.Popen(
            ['timeout', '-k', '5', str(NODE_LIMIT)] + argv, env=env,
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        self.pgid = self.proc.pid
        self.lines = []
        self.stamps = []   # when each line was read, seconds since the cluster was made
        self.ended = None  # when the output ended
        self.open_pipes = 2
        self.eof = False
        self.cond = threading.Condition()
        self.readers = [threading.Thread(target=self._read, args=(pipe,), daemon=True)
                        for pipe in (self.proc.stdout, self.proc.stderr)]
        for t in self.readers:
            t.start()

    def _read(self, pipe):
        for raw in iter(pipe.readline, b''):
            with self.cond:
                self.lines.append(raw.decode('utf-8', 'replace').rstrip('\n'))
                self.stamps.append(time.monotonic() - self.t0)
                self.cond.notify_all()
        with self.cond:
            self.open_pipes -= 1
            if self.open_pipes == 0:
                self.eof = True
                self.ended = time.monotonic() - self.t0
            self.cond.notify_all()

    def output(self):
        with self.cond:
            return '\n'.join(self.lines)

    def timed_output(self):
        with self.cond:
            out = ['%6.2f %s' % (t, l) for t, l in zip(self.stamps, self.lines)]
            if self.ended is not None:
                out.append('%6.2f (output ended)' % self.ended)
            return '\n'.join(out)

    def wait_line(self, pattern, timeout=WAIT):
        """The first output line matching `pattern` (a regex); fails when the node's output
        ends without one, or after `timeout` seconds."""
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        seen = 0
        with self.cond:
            while True:
                for line in self.lines[seen:]:
                    if rx.search(line):
                        return line
                seen = len(self.lines)
                if self.eof:
                    pytest.fail('%s ended without a line matching %r:\n%s'
                                % (self.label, pattern, '\n'.join(self.lines)))
                left = deadline - time.monotonic()
                if left <= 0:
                    pytest.fail('%s printed no line matching %r in %d s:\n%s'
                                % (self.label, pattern, timeout, '\n'.join(self.lines)))
                self.cond.wait(left)

    def wait_exit(self, timeout=WAIT):
        """The node's exit status; fails if it is still running after `timeout` seconds."""
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pytest.fail('%s still running after %d s (a hang):\n%s'
                        % (self.label, timeout, self.output()))
        self.join_readers()
        assert code not in (124, 128 + signal.SIGKILL, -signal.SIGKILL), \
            '%s was stopped by timeout(1) (exit %d):\n%s' % (self.label, code, self.output())
        return code

    def join_readers(self):
        for t in self.readers:
            t.join(10)
        return not any(t.is_alive() for t in self.readers)

    def send(self, text):
        self.proc.stdin.write(text.encode())
        self.proc.stdin.flush()

    def kill(self):
        """SIGKILL to the node's process group (timeout(1) and the node)."""
        try:
            os.killpg(self.pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class Cluster(object):
    """`workers` x `servers` (and a scheduler unless told not to) on 127.0.0.1."""

    def __init__(self, workers, servers, env=None, timeout_s=20):
        self.tag = uuid.uuid4().hex
        self.t0 = time.monotonic()
        ports = mxkv_launch.free_ports(1 + workers + servers)
        self.root_port = ports[0]
        base = dict(os.environ)
        for k in list(base):
            if k.startswith(('DMLC_', 'PS_')) or k in ('PORT', 'MXKV_TIMEOUT_S'):
                del base[k]
        base.update({
            'PYTHONPATH': BINDINGS + os.pathsep + os.environ.get('PYTHONPATH', ''),
            'MXKV_LIBRARY_PATH': os.environ.get(
                'MXKV_LIBRARY_PATH', os.path.join(REPO, 'target', 'release', 'libmxkv.so')),
            'MXKV_TEST_TAG': self.tag,
            'MXKV_TIMEOUT_S': str(timeout_s),
            'PYTHONUNBUFFERED': '1',
            'MXNET_KVSTORE_BIGARRAY_BOUND': '100',
        })
        base.update(env or {})
        self.specs = {}
        for n in mxkv_launch.build_nodes(workers, servers, self.root_port, ports[1:]):
            self.specs[n.label] = dict(base, **n.env)
        self.nodes = {}

    def port(self, label):
        return self.root_port if label == 'scheduler' else int(self.specs[label]['PORT'])

    def start(self, label, stdin=False):
        argv = [PY, WORKER] if label.startswith('worker') else [PY, '-c', SERVE]
        self.nodes[label] = Node(label, argv, self.specs[label], stdin, self.t0)
        return self.nodes[label]

    def start_all(self, scheduler=True, stdin=False):
        for label in self.specs:
            if scheduler or label != 'scheduler':
                self.start(label, stdin=stdin and label.startswith('worker'))
        return self.nodes

    def __getitem__(self, label):
        return self.nodes[label]

    def report(self):
        """Every node's exit status and output lines, with the time each was read."""
        return '\n'.join('--- %s (exit %r):\n%s' % (l, n.proc.returncode, n.timed_output())
                         for l, n in self.nodes.items())

    def cleanup(self):
        """Kills the process group of every node still running (a test that failed half
        way), then reports and kills, by pid, any process still carrying the tag: a node's
        child that outlived it, or a node that escaped its group."""
        killed = set()
        for n in self.nodes.values():
            if n.proc.poll() is None:
                n.kill()
                killed.add(n.pgid)
                try:
                    n.proc.wait(10)
                except subprocess.TimeoutExpired:
                    pass
        # the other members of a group killed here may take a moment to die
        deadline = time.monotonic() + 10
        for pid in tagged(self.tag):
            try:
                if os.getpgid(pid) in killed:
                    wait_gone(pid, deadline)
            except OSError:
                pass
        left = tagged(self.tag)
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        for n in self.nodes.values():
            done = n.join_readers()
            if n.proc.stdin is not None:
                try:
                    n.proc.stdin.close()
                except OSError:
                    pass   # a node that is gone (EPIPE on the flush)
            if done:
                n.proc.stdout.close()
                n.proc.stderr.close()
        assert not left, 'processes left behind: %r\n%s' % (left, self.report())
        if os.environ.get('T_FAULTS_REPORT'):
            sys.stderr.write('\n%s\n' % self.report())


def wait_gone(pid, deadline):
    """Waits until process `pid` (not a child of ours) has exited, at most until `deadline`
    (time.monotonic)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
    finally:
        os.close(fd)


@pytest.fixture
def cluster():
    made = []

    def make(*args, **kwargs):
        c = Cluster(*args, **kwargs)
        made.append(c)
        return c
    yield make
    for c in made:
        c.cleanup()


def failed_with(node, *texts, code=None):
    """`node` exited non-zero (or with `code`) and its output holds every one of `texts`."""
    got = node.wait_exit()
    out = node.output()
    if code is None:
        assert got != 0, '%s exited 0:\n%s' % (node.label, out)
    else:
        assert got == code, '%s exited %d, not %d:\n%s' % (node.label, got, code, out)
    for t in texts:
        assert re.search(t, out, re.M), '%s: no %r in its output:\n%s' % (node.label, t, out)
    return out


def error_line(node):
    """The MXNetError line of the exception that ended a scheduler or server node."""
    out = node.output()
    lines = [l for l in out.splitlines() if l.startswith('mxkv.base.MXNetError: ')]
    assert lines, '%s raised no MXNetError:\n%s' % (node.label, out)
    return lines[0]


def worker_failed(node, rank, *causes):
    """Worker `rank` exited 1 after a round failed (in a push or pull whose key the error
    names) and then its close failed, both errors matching every regex of `causes`."""
    failed_with(node, code=1)
    out = node.output()
    for what in ('round', 'close'):
        m = re.search(r'^rank %d %s failed: (.*)$' % (rank, what), out, re.M)
        assert m, '%s: no "%s failed" line:\n%s' % (node.label, what, out)
        for cause in causes + ((r'in KVStore\.pu(sh|ll) \(key (3|99)\)$',) if what == 'round'
                               else ()):
            assert re.search(cause, m.group(1)), \
                '%s: the %s error does not match %r:\n%s' % (node.label, what, cause, out)


def zmtp_peer(port, identity):
    """A ZeroMQ DEALER spoken by hand (ZMTP 3.0, NULL mechanism) with `identity`, its
    handshake done: send frames with ``sock.sendall(frames(...))``."""
    def prop(name, value):
        return bytes([len(name)]) + name + struct.pack('>I', len(value)) + value
    sock = socket.create_connection(('127.0.0.1', port), timeout=WAIT)
    sock.sendall(b'\xff' + b'\0' * 8 + b'\x7f' + b'\x03\x00' + b'NULL'.ljust(20, b'\0')
                 + b'\0' * 32)
    got = b''
    while len(got) < 64:   # the node's greeting
        chunk = sock.recv(64 - len(got))
        assert chunk, 'the node closed the ZMTP connection during the greeting'
        got += chunk
    ready = b'\x05READY' + prop(b'Socket-Type', b'DEALER') + prop(b'Identity', identity)
    sock.sendall(bytes([0x04, len(ready)]) + ready)
    return sock


def frames(*parts):
    """ZMTP 3.0 short frames, MORE set on all but the last."""
    return b''.join(bytes([1 if i + 1 < len(parts) else 0, len(p)]) + p
                    for i, p in enumerate(parts))


def pb_varint(n):
    out = b''
    while True:
        b, n = n & 0x7f, n >> 7
        if not n:
            return out + bytes([b])
        out += bytes([b | 0x80])


def ps_meta(head, request=True, push=False, pull=False, simple_app=False, body=None,
            timestamp=0, data_type=None):
    """ps-lite's Meta protobuf as MXNet's workers send it (app 0, customer 0)."""
    def field(tag, v):
        return pb_varint(tag << 3) + pb_varint(v)

    def blob(tag, b):
        return pb_varint(tag << 3 | 2) + pb_varint(len(b)) + b
    m = field(1, head)
    if body is not None:
        m += blob(2, body)
    m += field(4, int(request)) + field(5, int(push)) + field(6, int(simple_app))
    m += field(7, 0) + field(8, timestamp)
    if data_type is not None:
        m += blob(9, b''.join(pb_varint(x) for x in data_type))
    return m + field(10, 0) + field(12, int(pull))


# --- the cases ----------------------------------------------------------------------------

def kill_and_scheduler_reports(c, label, lost):
    """SIGKILLs node `label`; the scheduler fails naming it (`lost`, a pattern, returned)"""
    c[label].kill()
    assert c[label].proc.wait(WAIT) == -signal.SIGKILL
    failed_with(c['scheduler'], r'scheduler rank 0 lost %s: its connection closed' % lost)
    return lost


def test_scheduler_absent(cluster):
    """no scheduler at DMLC_PS_ROOT_PORT: the server and both workers fail at the deadline
    naming the scheduler's address"""
    c = cluster(2, 1, timeout_s=4)
    c.start_all(scheduler=False)
    where = r'waiting for the scheduler at tcp://127\.0\.0\.1:%d' % c.root_port
    for label in ('server 0', 'worker 0', 'worker 1'):
        role = label.split()[0]
        failed_with(c[label], r'MXNetError: MXKV\w+: %s timed out after 4\.0 s ' % role, where)


def test_a_worker_killed_mid_round(cluster):
    """worker 1 is SIGKILLed right after its push of round 2 (its pull never comes). The
    scheduler, both servers and worker 0 (blocked in a sync round) fail naming worker 1"""
    c = cluster(2, 2, env={'T_ROUNDS': '1000'})
    c.start_all()
    c['worker 1'].wait_line(r'^rank 1 round 2 pushed$')
    lost = kill_and_scheduler_reports(c, 'worker 1', r'worker 1 \(id 11\)')
    worker_failed(c['worker 0'], 0, lost)
    for label in ('server 0', 'server 1'):
        out = failed_with(c[label], 'every worker is gone, nobody is left to serve: ')
        assert re.search(lost, error_line(c[label])), out


@pytest.mark.parametrize('sigpipe', ['ignored', 'default'])
def test_a_server_killed(cluster, sigpipe):
    """server 0 is SIGKILLed between rounds (after round 2). Both workers' next pull fails
    naming server 0; the scheduler fails naming it; server 1 hears of it from the scheduler,
    and ends when the workers have gone. With SIGPIPE at its default action in the workers
    (as in a C program) the same: writing to the dead server's lane gives an error, never
    the signal"""
    c = cluster(2, 2, env={'T_ROUNDS': '1000',
                           'T_SIGPIPE_DEFAULT': '1' if sigpipe == 'default' else '0'})
    c.start_all()
    c['worker 1'].wait_line(r'^rank 1 round 2 done$')
    lost = kill_and_scheduler_reports(c, 'server 0', r'server 0 \(id 8\)')
    for r in (0, 1):
        worker_failed(c['worker %d' % r], r, lost)
    out = failed_with(c['server 1'], 'every worker is gone, nobody is left to serve: ')
    assert re.search(r'server rank 1: the scheduler reports: scheduler rank 0 lost %s' % lost,
                     out), out


def test_a_server_killed_while_a_push_is_writing_to_it(cluster):
    """1 + 1: the server is stopped (SIGSTOP), the worker starts a 64 MB push (its socket
    fills), and the server is killed (SIGKILL) while the push is still writing. The worker,
    which takes SIGPIPE's default action as a C program does, must not die of the write to
    the closed connection: the push fails, the pull fails naming server 0, close fails,
    exit 1"""
    c = cluster(1, 1, env={'T_PUSH_TO_A_STOPPED_SERVER': '1', 'T_SIGPIPE_DEFAULT': '1'})
    c.start_all(stdin=True)
    w = c['worker 0']
    w.wait_line(r'^rank 0 give me the server$')
    w.send('%d\n' % c['server 0'].pgid)
    code = w.wait_exit()
    out = w.output()
    assert code != 128 + signal.SIGPIPE and code != -signal.SIGPIPE, \
        'the worker died of SIGPIPE:\n' + out
    assert code == 1, out
    assert re.search(r'^rank 0 round failed: .*server 0 \(id 8\)', out, re.M), out


def test_unequal_step_counts(cluster):
    """worker 0 pushes 3 rounds and closes the store, worker 1 pushes 5: worker 1's 4th round
    cannot complete and the server fails it before worker 1's own deadline, naming the key
    and worker 0; worker 0's closing barrier fails (at its deadline, or earlier once the
    scheduler reports worker 1 gone); the server and the scheduler end non-zero"""
    c = cluster(2, 1, timeout_s=10, env={'T_ROUNDS_0': '3', 'T_ROUNDS_1': '5'})
    c.start_all()
    c['worker 0'].wait_line(r'^rank 0 round 2 done$')
    worker_failed(c['worker 1'], 1, r'server 0: sync round of key (3|99) timed out after 8s: '
                  r'1 of 2 pushes arrived; no push from worker 0 \(id 9\)')
    out = c['worker 1'].output()
    assert 'rank 1 round 3 pushed' in out and 'rank 1 round 3 done' not in out, out
    failed_with(c['worker 0'], r'^rank 0 round 2 done$', code=1)
    m = re.search(r'^rank 0 close failed: (.*)$', c['worker 0'].output(), re.M)
    assert m and re.search(r'MXKVStoreFree: .*barrier on group 4 \(workers\) (timed out after '
                           r'10\.0 s|cannot complete: .*lost worker 1 \(id 11\))', m.group(1)), \
        c['worker 0'].output()
    failed_with(c['server 0'], r'every worker is gone, nobody is left to serve: .*worker 1 '
                r'\(id 11\)', r'worker 0 \(id 9\)')
    failed_with(c['scheduler'], r'scheduler rank 0 lost worker [01] \(id (9|11)\)')


def test_a_store_left_open_that_fails_at_exit_fails_the_process(cluster):
    """worker 1 ends its script without closing the store; at exit its closing barrier waits
    for worker 0, which is SIGKILLed: worker 1 exits 1 naming worker 0 (Python alone would
    print the atexit error and exit 0, and the job would pass for a success)"""
    c = cluster(2, 1, env={'T_ROUNDS': '3', 'T_WAIT_AFTER': '2', 'T_NO_CLOSE': '1'})
    c.start_all(stdin=True)
    for r in (0, 1):
        c['worker %d' % r].wait_line(r'^rank %d waiting$' % r)
    c['worker 1'].send('go\n')
    c['worker 1'].wait_line(r'^rank 1 ends without close$')
    c['worker 0'].kill()
    assert c['worker 0'].proc.wait(WAIT) == -signal.SIGKILL
    failed_with(c['worker 1'], r'^mxkv: at exit: .*worker 0 \(id 9\)', code=1)


def test_garbage_and_half_open_connections_are_dropped_and_the_cluster_goes_on(cluster):
    """after round 0 the workers wait; meanwhile the server's and the scheduler's ports get
    raw garbage and a half-open TCP connection (kept open to the end), the server's port a
    ZMTP handshake cut after the greeting and a well-formed ZeroMQ peer sending frames that
    are not ps-lite messages (each dropped with a log line naming the peer), and the server's
    lane port (libmxkv's direct connections, which the workers use) garbage and a half-open
    connection too. Then the workers go on: 4 rounds of exact sums, a clean shutdown, every
    node exits 0"""
    c = cluster(2, 1, env={'T_ROUNDS': '4', 'T_WAIT_AFTER': '0', 'PS_VERBOSE': '1'})
    c.start_all(stdin=True)
    for r in (0, 1):
        c['worker %d' % r].wait_line(r'^rank %d waiting$' % r)
    keep = []
    try:
        for label in ('server 0', 'scheduler'):
            addr = ('127.0.0.1', c.port(label))
            g = socket.create_connection(addr, timeout=WAIT)
            keep.append(g)
            g.sendall(b'GET / HTTP/1.0\r\n\r\n\xff\x00garbage' + bytes(range(256)) * 4)
            keep.append(socket.create_connection(addr, timeout=WAIT))   # half-open
        cut = socket.create_connection(('127.0.0.1', c.port('server 0')), timeout=WAIT)
        keep.append(cut)
        cut.sendall(b'\xff' + b'\0' * 8 + b'\x7f\x03')   # a greeting that stops half way
        z = zmtp_peer(c.port('server 0'), b'ps999')
        keep.append(z)
        z.sendall(frames(b'\xff\xff\xff\xff'))              # not protobuf
        z.sendall(frames(b'\x1a\x02\x08', b'x'))             # a truncated meta and a data part
        # libzmq takes a first byte that is not 0xff for a ZMTP 1.0 peer (frame length 'G',
        # flags 'E', identity "T / HTTP/1.0..."), so the raw garbage arrives as messages: dropped
        c['scheduler'].wait_line(r'^\[mxkv scheduler\] dropped a message from identity '
                                 r'54202f20485454502f')
        server = c['server 0']
        server.wait_line(r'^\[mxkv server\] dropped a message from identity ps999 \(4 bytes')
        server.wait_line(r'^\[mxkv server\] dropped a message from identity ps999 \(3 bytes')
        # the lane port, which worker 0 names (PS_VERBOSE=1)
        line = c['worker 0'].wait_line(r'^\[mxkv worker\] lane to server 0 \(id 8\) at 127\.0\.0\.1:\d+$')
        lane = ('127.0.0.1', int(line.rsplit(':', 1)[1]))
        g = socket.create_connection(lane, timeout=WAIT)
        keep.append(g)
        g.sendall(b'GET / HTTP/1.0\r\n\r\n\xff\x00garbage' + bytes(range(256)) * 4)
        keep.append(socket.create_connection(lane, timeout=WAIT))   # half-open
        server.wait_line(r'^\[mxkv server\] dropped a lane connection from 127\.0\.0\.1:\d+: '
                         r'not an mxkv lane handshake')
        for r in (0, 1):
            c['worker %d' % r].send('go\n')
        # the half-open connections stay open until every node has exited
        for label in ('worker 0', 'worker 1', 'server 0', 'scheduler'):
            code = c[label].wait_exit()
            assert code == 0, '%s exited %d:\n%s' % (label, code, c.report())
    finally:
        for s in keep:
            s.close()
    for r in (0, 1):
        out = c['worker %d' % r].output()
        assert 'rank %d round 3 done' % r in out and 'rank %d closed' % r in out, out
    for label in ('server 0', 'scheduler'):
        assert 'Error' not in c[label].output(), c.report()


def test_requests_from_outside_the_cluster_are_dropped(cluster):
    """after round 0 the workers wait; meanwhile ZeroMQ peers that are no workers of this
    2-worker cluster (identities ps13, ps15, ps99) send server 0 what a real worker sends: a
    push of key 3 (100s), kStopServer, kSetGradientCompression. The server drops each, with
    one log line per sender, and the workers go on: 4 rounds of exact sums (the push would
    have been counted in round 1, kStopServer would have ended the serving), a clean
    shutdown, every node exits 0"""
    c = cluster(2, 1, env={'T_ROUNDS': '4', 'T_WAIT_AFTER': '0'})
    c.start_all(stdin=True)
    for r in (0, 1):
        c['worker %d' % r].wait_line(r'^rank %d waiting$' % r)
    push = ps_meta(0, push=True, timestamp=1, data_type=[8, 11, 3])
    sends = [
        (b'ps13', frames(push, struct.pack('<Q', 3), struct.pack('<12f', *[100.0] * 12),
                         struct.pack('<i', 48))),
        (b'ps15', frames(ps_meta(2, simple_app=True, timestamp=2))),
        (b'ps99', frames(ps_meta(4, simple_app=True, body=b'2,0.5', timestamp=3))),
    ]
    keep = []
    try:
        for identity, data in sends:
            z = zmtp_peer(c.port('server 0'), identity)
            keep.append(z)
            z.sendall(data)
        server = c['server 0']
        for what, id in (('data request', 13), (r'command kStopServer \(2\)', 15),
                         (r'command kSetGradientCompression \(4\)', 99)):
            server.wait_line(r'^\[mxkv server\] server 0 dropped a %s from node id %d: not a '
                             r'worker of this cluster \(workers: ids 9\.\.=11\)' % (what, id))
        for r in (0, 1):
            c['worker %d' % r].send('go\n')
        for label in ('worker 0', 'worker 1', 'server 0', 'scheduler'):
            code = c[label].wait_exit()
            assert code == 0, '%s exited %d:\n%s' % (label, code, c.report())
    finally:
        for s in keep:
            s.close()
    for r in (0, 1):
        out = c['worker %d' % r].output()
        assert 'rank %d round 3 done' % r in out and 'rank %d closed' % r in out, out
    assert len(re.findall(r'dropped a', c['server 0'].output())) == 3, c.report()


def test_a_worker_frozen_mid_round_is_lost_by_heartbeat(cluster):
    """worker 1 is SIGSTOPped right after its push of round 2: its connections stay open, so
    only the heartbeats (PS_HEARTBEAT_INTERVAL, PS_HEARTBEAT_TIMEOUT) tell: the scheduler
    declares it lost, tells the others, and everyone else ends naming worker 1, long before
    the node deadline (MXKV_TIMEOUT_S, 40 s here, beyond the test's waits)"""
    c = cluster(2, 1, timeout_s=40, env={'T_ROUNDS': '1000', 'PS_HEARTBEAT_INTERVAL': '0.5',
                                         'PS_HEARTBEAT_TIMEOUT': '6'})
    c.start_all()
    c['worker 1'].wait_line(r'^rank 1 round 2 pushed$')
    os.killpg(c['worker 1'].pgid, signal.SIGSTOP)
    lost = r'worker 1 \(id 11\)'
    failed_with(c['scheduler'], r'scheduler rank 0 lost %s: no heartbeat for \d' % lost)
    worker_failed(c['worker 0'], 0, lost, 'no heartbeat')
    out = failed_with(c['server 0'], 'every worker is gone, nobody is left to serve: ')
    assert re.search(lost + r': no heartbeat', error_line(c['server 0'])), out
    assert c['worker 1'].proc.poll() is None   # still frozen: the cleanup kills it
