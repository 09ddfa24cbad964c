"""A dist cluster whose every process takes a SIGALRM every 50 us (a handler installed by
``signal.signal``, as a sampling profiler or a watchdog does: Python installs handlers without
SA_RESTART, so a signal makes a blocking system call of any thread fail with EINTR).

ps-lite retries ``zmq_msg_send`` / ``zmq_msg_recv`` when they fail with EINTR
(``src/zmq_van.h``, ``SendMsg`` / ``RecvMsg``); libmxkv's van did not: a push or pull failed
with 'Interrupted system call' (the review probe: 672 of 30,000 pulls), a multipart message
could be left half sent, and a receive thread interrupted between two frames dropped the rest
of a message. Every round trip here must go through with the exact values, on the worker
(sending) and on the server (receiving, and sending its answers).
"""
import os

import pytest

from test_dist import launch

pytestmark = pytest.mark.skipif(not hasattr(os, 'fork'), reason='needs POSIX signals')

WORKER = r'''
import atexit, os, signal, sys, time

hits = [0]
def on_alarm(signum, frame):
    hits[0] += 1

# before the import: a server or the scheduler runs its role inside it, signals and all
signal.signal(signal.SIGALRM, on_alarm)
period = float(os.environ['T_PERIOD'])
signal.setitimer(signal.ITIMER_REAL, period, period)
# off before the interpreter puts the default action (end the process) back
atexit.register(signal.setitimer, signal.ITIMER_REAL, 0, 0)

import numpy as np
import mxkv as mx

kv = mx.kv.create('dist_sync')
kv.init(3, mx.nd.zeros((1000,)))
kv.init(5, mx.nd.zeros((70000,)))       # a value above 64 KiB: sent without a copy
n = int(os.environ['T_N'])
failures = {}
wrong = 0
t0 = time.time()
for i in range(n):
    key, size = (5, 70000) if i % 10 == 0 else (3, 1000)
    want = float(i % 7 + 1)
    out = mx.nd.zeros((size,))
    try:
        kv.push(key, mx.nd.ones((size,)) * want)
        kv.pull(key, out=out)
        if not (out.asnumpy() == want).all():
            wrong += 1
    except mx.base.MXNetError as err:
        text = str(err)
        why = 'Interrupted' if 'Interrupted' in text else text[:200]
        failures[why] = failures.get(why, 0) + 1
signal.setitimer(signal.ITIMER_REAL, 0, 0)
print('round trips %d, failures %s, wrong values %d, signals %d, %.1f s'
      % (n, failures, wrong, hits[0], time.time() - t0), flush=True)
kv.close()
print('closed', flush=True)
'''


def test_signals_do_not_fail_or_tear_messages(tmp_path):
    script = tmp_path / 'signal_worker.py'
    script.write_text(WORKER)
    n = 3000
    code, out = launch(str(script), 1, 1, {'T_N': str(n), 'T_PERIOD': '0.00005'},
                       timeout=120, node_timeout=10)
    assert code == 0, out
    assert '[worker 0] round trips %d, failures {}, wrong values 0,' % n in out, out
    assert '[worker 0] closed' in out, out
    assert 'dropped' not in out, out            # no node dropped a message
