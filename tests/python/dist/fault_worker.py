"""A dist worker for tests/python/test_dist_faults.py.

Runs T_ROUNDS rounds (T_ROUNDS_<rank> for this rank, if set) of: push two keys (key 3,
and key 99, which is split over the servers), print ``rank R round T pushed``, pull both and
check the exact sums over the workers, print ``rank R round T done``. Every line is flushed
at once: the test synchronises on them. With T_WAIT_AFTER=T the worker reads one line from
stdin after round T (the test's go-ahead) before going on. A failed round prints ``rank R
round failed: <error>`` (on one line, on stdout: the library logs on stderr). Then the worker closes the store (barrier, shutdown) and prints
``rank R closed``, or ``rank R close failed: <error>`` and exits 1 (2 when only a round
failed). With T_NO_CLOSE=1 a worker whose rounds passed prints ``rank R ends without close``
and exits 0, leaving the store to be closed at exit. With T_SIGPIPE_DEFAULT=1 the process
takes SIGPIPE's default action (death), as a C program does (Python ignores it): the
library must never raise it.
"""
import os
import signal
import sys

import mxkv as mx


def say(text):
    print(text, flush=True)


def one_line(err):
    # the binding's message may carry a second line ("  in KVStore.pull (key 3)")
    return ' '.join(str(err).split())


if os.environ.get('T_SIGPIPE_DEFAULT') == '1':
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
kv = mx.kv.create(os.environ.get('T_KVTYPE', 'dist_sync'))
r, n = kv.rank, kv.num_workers
say('rank %d of %d started pid %d' % (r, n, os.getpid()))
rounds = int(os.environ.get('T_ROUNDS_%d' % r, os.environ.get('T_ROUNDS', '3')))
wait_after = int(os.environ.get('T_WAIT_AFTER', '-1'))
bound = int(os.environ.get('MXNET_KVSTORE_BIGARRAY_BOUND', '1000000'))
shape, big = (4, 3), (bound // 10 + 7, 10)
kv.init(3, mx.nd.zeros(shape))
kv.init(99, mx.nd.zeros(big))
failed = False


def stalled_send():
    """Whether a TCP connection of this machine has over 1 MiB queued to send."""
    for name in ('/proc/net/tcp', '/proc/net/tcp6'):
        try:
            with open(name) as f:
                rows = f.readlines()[1:]
        except OSError:
            continue
        for row in rows:
            if int(row.split()[4].split(':')[0], 16) > 1 << 20:
                return True
    return False


if os.environ.get('T_PUSH_TO_A_STOPPED_SERVER') == '1':
    # a 64 MB push to a server that stopped reading (SIGSTOP), then killed (SIGKILL) while
    # the push is still writing: the write fails (EPIPE), the push and the next pull fail
    # naming the server
    import threading
    import time
    big5 = (16 << 20,)
    kv.init(5, mx.nd.zeros(big5))
    say('rank %d give me the server' % r)
    pgid = int(sys.stdin.readline())
    os.killpg(pgid, signal.SIGSTOP)
    errors = []

    def push():
        try:
            kv.push(5, mx.nd.ones(big5))
        except mx.base.MXNetError as e:
            errors.append(e)
    pusher = threading.Thread(target=push)
    pusher.start()
    deadline = time.monotonic() + 60
    while not stalled_send():
        assert time.monotonic() < deadline, 'the push never filled its socket'
        time.sleep(0.01)   # polling /proc, not a synchronisation
    os.killpg(pgid, signal.SIGKILL)
    pusher.join()
    try:
        kv.pull(5, out=mx.nd.zeros(big5))
        say('rank %d pull after the kill passed' % r)
    except mx.base.MXNetError as e:
        say('rank %d round failed: %s' % (r, one_line(errors[0] if errors else e)))
        failed = True
    rounds = 0
try:
    for t in range(rounds):
        kv.push(3, mx.nd.ones(shape) * (r + 1) * (t + 1))
        kv.push(99, mx.nd.ones(big) * (r + 1) * (t + 1))
        say('rank %d round %d pushed' % (r, t))
        want = (t + 1) * n * (n + 1) // 2
        for key, s in ((3, shape), (99, big)):
            out = mx.nd.zeros(s)
            kv.pull(key, out=out)
            got = out.asnumpy()
            assert (got == want).all(), (r, t, key, got.ravel()[:4], want)
        say('rank %d round %d done' % (r, t))
        if t == wait_after:
            say('rank %d waiting' % r)
            line = sys.stdin.readline()
            assert line.strip() == 'go', repr(line)
except mx.base.MXNetError as e:
    say('rank %d round failed: %s' % (r, one_line(e)))
    failed = True
if os.environ.get('T_NO_CLOSE') and not failed:
    say('rank %d ends without close' % r)
    sys.exit(0)   # the store is closed at exit (atexit: MXNotifyShutdown)
# what MXNet's KVStoreDist destructor does: the workers' barrier, rank 0 stops the servers,
# the node finalizes; after a failure it must fail too, naming the same cause
try:
    kv.close()
except mx.base.MXNetError as e:
    say('rank %d close failed: %s' % (r, one_line(e)))
    sys.exit(1)
if failed:
    sys.exit(2)
say('rank %d closed' % r)
