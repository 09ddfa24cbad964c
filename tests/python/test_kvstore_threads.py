"""KVStore's Python updater used from several threads (bindings/python/mxkv/kvstore/kvstore.py).

The library keeps calling the updater a push took when it started, so the ctypes callbacks
the binding installs must outlive any replacement (``_set_updater``, ``set_optimizer``) and
``close()``; a freed callback is a SIGSEGV, so those cases run in a child process. An
exception raised by an updater belongs to the call on the thread that ran it.

Threads meet through events with timeouts (nothing waits forever); every child process has
a timeout.
"""
import os
import subprocess
import sys
import threading

import pytest

from conftest import BINDINGS

TIMEOUT = 60


def run_child(code):
    env = dict(os.environ)
    env['PYTHONPATH'] = BINDINGS + os.pathsep + env.get('PYTHONPATH', '')
    r = subprocess.run([sys.executable, '-c', code], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, timeout=TIMEOUT, env=env)
    assert r.returncode == 0, 'child exited %d\nstdout:\n%s\nstderr:\n%s' % (
        r.returncode, r.stdout.decode(), r.stderr.decode())
    return r.stdout.decode()


# Thread A pushes keys 1 and 2 (one call); the updater for key 1 stops in the middle and
# lets the main thread do ACTION; then key 2 goes through the updater the push took at its
# start. The freed callback's memory is reused before the push goes on.
SWAP = r'''
import gc, threading
import mxkv as mx
kv = mx.kv.create('local')
kv.init([1, 2], [mx.nd.zeros((3,)), mx.nd.zeros((3,))])
calls = []
in_update, go_on = threading.Event(), threading.Event()

def old(key, recv, local):
    calls.append(('old', key))
    if key == 1:
        in_update.set()
        assert go_on.wait(30), 'main thread did not answer'
    local[:] = local + recv

def new(key, recv, local):
    calls.append(('new', key))
    local[:] = local + 10 * recv

kv._set_updater(old)
errors = []
def pusher():
    try:
        kv.push([1, 2], [mx.nd.ones((3,)), mx.nd.ones((3,))])
    except Exception as e:
        errors.append(repr(e))
t = threading.Thread(target=pusher)
t.start()
assert in_update.wait(30), 'the push did not reach the updater'
ACTION
gc.collect()
junk = [mx.kv.KVStore.__init__ for _ in range(2000)]  # reuse freed memory
junk2 = [(lambda k, r, l: None) for _ in range(2000)]
go_on.set()
t.join(30)
assert not t.is_alive()
print(sorted(calls), errors)
'''


def test_set_updater_while_a_push_on_another_thread_is_in_the_updater():
    out = run_child(SWAP.replace('ACTION', 'kv._set_updater(new)'))
    # the push in flight finished with the updater it started with
    assert out.strip() == "[('old', 1), ('old', 2)] []"
    # ... and the next push uses the new one
    out = run_child(SWAP.replace('ACTION', 'kv._set_updater(new)') + r'''
kv.push(2, mx.nd.ones((3,)))
o = mx.nd.zeros((3,))
kv.pull(2, out=o)
print(calls[-1], o.asnumpy().tolist())
''')
    assert out.splitlines()[-1] == "('new', 2) [11.0, 11.0, 11.0]"


def test_set_optimizer_repeatedly_while_a_push_is_in_the_updater():
    out = run_child(SWAP.replace('ACTION', '''
for _ in range(5):
    kv.set_optimizer(mx.optimizer.SGD(learning_rate=0.1))'''))
    assert out.strip() == "[('old', 1), ('old', 2)] []"


def test_close_while_a_push_on_another_thread_is_in_the_updater():
    out = run_child(SWAP.replace('ACTION', 'kv.close()'))
    lines = out.splitlines()
    # the push finished (key 2 through the same updater) or reported an error; no crash
    assert lines[-1].startswith("[('old', 1), ('old', 2)]") or \
        lines[-1].startswith("[('old', 1)] ['"), out


def test_close_inside_the_updater_of_a_two_key_push():
    out = run_child(r'''
import gc
import mxkv as mx
kv = mx.kv.create('local')
kv.init([1, 2], [mx.nd.ones((2,)), mx.nd.ones((2,))])
calls = []
def upd(key, recv, local):
    calls.append(key)
    if len(calls) == 1:
        kv.close()
        gc.collect()
        junk = [mx.kv.KVStore.__init__ for _ in range(2000)]
    local[:] = local + recv
kv._set_updater(upd)
try:
    kv.push([1, 2], [mx.nd.ones((2,)), mx.nd.ones((2,))])
    print('returned', calls)
except Exception as e:
    print('raised', calls, type(e).__name__)
''')
    assert out.strip() in ('returned [1, 2]', 'raised [1] MXKVUsageError',
                           'raised [1] MXNetError'), out


def test_set_updater_from_inside_the_updater():
    # the same thread replaces the updater while the library is between two keys
    out = run_child(r'''
import gc
import mxkv as mx
kv = mx.kv.create('local')
kv.init([1, 2], [mx.nd.zeros((2,)), mx.nd.zeros((2,))])
calls = []
def new(key, recv, local):
    calls.append(('new', key))
    local[:] = recv
def old(key, recv, local):
    calls.append(('old', key))
    if key == 1:
        kv._set_updater(new)
        gc.collect()
        junk = [mx.kv.KVStore.__init__ for _ in range(2000)]
    local[:] = local + recv
kv._set_updater(old)
kv.push([1, 2], [mx.nd.ones((2,)), mx.nd.ones((2,))])
kv.push(1, mx.nd.ones((2,)))
print(calls)
''')
    assert out.strip() == "[('old', 1), ('old', 2), ('new', 1)]"


# --- an updater's exception is raised on the thread whose call ran the updater ---------------

@pytest.mark.parametrize('pull_kind', ['fast', 'general'])
def test_updater_error_goes_to_the_pushing_thread(mxkv, pull_kind):
    kv = mxkv.kv.create('local')
    kv.init([1, 2, 3], [mxkv.nd.zeros((2,)) for _ in range(3)])
    reached, pulled = threading.Event(), threading.Event()

    def upd(key, recv, local):
        if key == 1:
            raise ValueError('updater failed on key 1')
        # key 2, same push, after key 1's error: let another thread pull meanwhile
        reached.set()
        assert pulled.wait(30), 'the pulling thread did not answer'
        local[:] = local + recv

    kv._set_updater(upd)
    pull_result = []

    def puller():
        assert reached.wait(30)
        out = mxkv.nd.zeros((2,))
        try:
            if pull_kind == 'fast':
                kv.pull(3, out=out)
            else:
                kv.pull([3], out=[out])
            pull_result.append('ok')
        except ValueError as e:
            pull_result.append('raised %s' % e)
        finally:
            pulled.set()

    t = threading.Thread(target=puller)
    t.start()
    with pytest.raises(ValueError, match='updater failed on key 1'):
        kv.push([1, 2], [mxkv.nd.ones((2,)), mxkv.nd.ones((2,))])
    t.join(30)
    assert not t.is_alive()
    assert pull_result == ['ok']
    # key 2 was updated despite key 1's error; the error is not raised again
    out = mxkv.nd.zeros((2,))
    kv.pull(2, out=out)
    assert out.asnumpy().tolist() == [1.0, 1.0]
    kv.close()


def test_updater_errors_on_many_threads_each_raised_once_on_its_own_thread(mxkv):
    kv = mxkv.kv.create('local')
    nthreads, rounds = 4, 200
    kv.init(list(range(nthreads)), [mxkv.nd.zeros((2,)) for _ in range(nthreads)])

    def upd(key, recv, local):
        local[:] = local + recv
        if int(local.asnumpy()[0]) % 2:
            raise ValueError('odd %d' % key)

    kv._set_updater(upd)
    results = {}

    def worker(k):
        got = []
        for _ in range(rounds):
            try:
                kv.push(k, mxkv.nd.ones((2,)))
                got.append(None)
            except ValueError as e:
                got.append(str(e))
        results[k] = got

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(nthreads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    for k in range(nthreads):
        # push i (from 1) leaves i in the store: odd ones raise, with this thread's key
        assert results[k] == [('odd %d' % k) if i % 2 else None
                              for i in range(1, rounds + 1)], k
    kv.close()
