"""A daemon thread inside kv.push (a Python updater running) when the interpreter exits.

CPython 3.11 ends a daemon thread that takes the GIL during interpreter finalisation with
pthread_exit, whose forced unwind starts inside the updater and has to pass through the
library's frames below it. MXNet 1.9.1 lets it through (the process exits 0). libmxkv
aborted with "FATAL: exception not rethrown" before it ran such calls on a second stack
(csrc/callbacks.cc): Rust may not be unwound by it. Each scenario runs in its own process
under a deadline, on MXNet too when it is installed.
"""
import os
import subprocess
import sys

import pytest

from conftest import BINDINGS

SCRIPT = r'''
import sys, threading
if sys.argv[1] == 'mxnet':
    import mxnet as mx
else:
    import mxkv as mx
kv = mx.kv.create('local')
kv.init(0, mx.nd.ones((256, 256)))
if sys.argv[2] == 'optimizer':
    kv.set_optimizer(mx.optimizer.Adam(learning_rate=0.01))
else:
    def upd(key, recv, stored):
        # several calls into the library, each of which gives up the GIL
        for _ in range(20):
            stored[:] += recv
    kv._set_updater(upd)
g = mx.nd.ones((256, 256))
pushes = [0]
busy = threading.Event()
def bg():
    while True:
        kv.push(0, g)
        pushes[0] += 1
        if pushes[0] == 3:
            busy.set()
threading.Thread(target=bg, daemon=True).start()
assert busy.wait(60), 'the daemon thread did not push'
print('main exits', flush=True)
'''


def impls():
    out = ['mxkv']
    try:
        import mxnet  # noqa: F401
        out.append('mxnet')
    except ImportError:
        pass
    return out


@pytest.mark.parametrize('updater', ['optimizer', 'python'])
@pytest.mark.parametrize('impl', impls())
def test_daemon_thread_pushing_at_exit(impl, updater):
    env = dict(os.environ, PYTHONPATH=BINDINGS)
    for attempt in range(3):
        p = subprocess.run([sys.executable, '-c', SCRIPT, impl, updater], env=env,
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 0 and 'main exits' in p.stdout, \
            'run %d: exit %d\nstdout: %s\nstderr: %s' % (attempt, p.returncode, p.stdout,
                                                         p.stderr[-2000:])
        assert 'FATAL' not in p.stderr, p.stderr[-2000:]
