"""A forked child's copy of its parent's dist store, used through the C API itself (what a C
or C++ frontend does; the Python frontend already forgets such stores in the child, see
test_dist_fork.py). Every call on it fails naming the parent's process, ``MXKVStoreFree`` and
``MXNotifyShutdown`` return 0 and leave the parent's node alone, and the parent's job goes on
to a clean end. Before the library checked the creating process, the child's calls went to
the parent's sockets and its Free tore down the parent's ZeroMQ context (the parent aborted
in libzmq, 'Assertion failed: ok (mailbox.cpp:99)', review probes p19_fork.py / p19c.py).

MXNet 1.9.1's child hangs at exit instead (review probe p19m_fork_mxnet.py ran into the
launcher's 100 s timeout).
"""
import os

import pytest

from test_dist import launch

pytestmark = pytest.mark.skipif(not hasattr(os, 'fork'), reason='needs os.fork')

WORKER = r'''
import ctypes, os, sys
import mxkv as mx
from mxkv.base import _LIB

kv = mx.kv.create('dist_sync')
kv.init(3, mx.nd.zeros((4,)))
handle = ctypes.c_void_p(kv.handle.value)
pid = os.fork()
if pid == 0:
    code = 0
    key = ctypes.c_int(3)
    one = mx.nd.ones((4,))
    out = mx.nd.zeros((4,))
    owner = 'this dist kvstore belongs to process %d; a forked child (process %d)' % (
        os.getppid(), os.getpid())
    for name, call in (
            ('MXKVStorePush', lambda: _LIB.MXKVStorePush(
                handle, 1, ctypes.byref(key), ctypes.byref(one.handle), 0)),
            ('MXKVStorePull', lambda: _LIB.MXKVStorePull(
                handle, 1, ctypes.byref(key), ctypes.byref(out.handle), 0)),
            ('MXKVStoreBarrier', lambda: _LIB.MXKVStoreBarrier(handle))):
        rc = call()
        err = (_LIB.MXGetLastError() or b'').decode()
        print('child %s rc=%d: %s' % (name, rc, err), flush=True)
        if rc != -1 or owner not in err or name not in err:
            code = 5
    rc = _LIB.MXKVStoreFree(handle)
    print('child MXKVStoreFree rc=%d' % rc, flush=True)
    rc2 = _LIB.MXNotifyShutdown()
    print('child MXNotifyShutdown rc=%d' % rc2, flush=True)
    if rc != 0 or rc2 != 0:
        code = 6
    os._exit(code)
_, status = os.waitpid(pid, 0)
kv.push(3, mx.nd.ones((4,)))
out = mx.nd.zeros((4,))
kv.pull(3, out=out)
kv.push(3, mx.nd.ones((4,)) * 2)
kv.pull(3, out=out)
print('child status %d; parent pulled %s' % (status, out.asnumpy().tolist()), flush=True)
kv.close()
print('parent closed', flush=True)
'''


def test_a_forked_child_using_the_c_api_leaves_the_parents_node_alone(tmp_path):
    script = tmp_path / 'fork_capi_worker.py'
    script.write_text(WORKER)
    code, out = launch(str(script), 1, 1, timeout=60, node_timeout=20)
    assert code == 0, out
    assert '[worker 0] child status 0; parent pulled [2.0, 2.0, 2.0, 2.0]' in out, out
    assert '[worker 0] parent closed' in out, out
    assert '[worker 0] child MXKVStoreFree rc=0' in out, out
