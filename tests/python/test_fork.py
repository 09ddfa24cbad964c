"""The library in a forked child, after the parent used it.

A process that used the library (its worker threads started: big sums, copies and
conversions are split over threads), then forks, as Python's multiprocessing does with the
fork start method (Gluon DataLoader workers): the child has none of the parent's threads,
and must still push, pull and compute, with the right values, and not wait forever for a
thread that does not exist. MXNet 1.9.1 gives the same values (the scenario is also run on
it when it is installed).

Every scenario runs in its own process (python -c), in a session of its own, under a
deadline; a child that does not answer in time is killed and reported as hung.
"""
import json
import os
import signal
import subprocess
import sys

import pytest

from conftest import BINDINGS

SCRIPT = r'''
import json, os, select, sys, time, multiprocessing as mp
import numpy as np
if sys.argv[1] == 'mxnet':
    import mxnet as mx
else:
    import mxkv as mx

N = 1 << 22           # 16 MiB of float32: sums, copies and fills are split over threads
ROWS = 1 << 15        # a row_sparse pull of ROWS x 4 elements fills rows in parallel
DEADLINE = 30.0


def parent_use():
    """Use every parallel path once in the parent, so its threads exist before the fork."""
    kv = mx.kv.create('local')
    kv.init(0, mx.nd.ones((N,)))
    kv.push(0, [mx.nd.ones((N,))] * 3)
    out = mx.nd.zeros((N,))
    kv.pull(0, out=out)
    a = mx.nd.ones((N,))
    b = (a + out).asnumpy()
    assert float(b[0]) == 4.0 and float(b[-1]) == 4.0, b[:4]
    return kv


def store_work(i):
    """Local and device stores (with 2-bit compression), row_sparse pulls, NDArray arithmetic."""
    r = {}
    kv = mx.kv.create('local')
    kv.init(0, mx.nd.ones((N,)) * i)
    kv.push(0, [mx.nd.ones((N,)) * (i + 1)] * 3)
    out = mx.nd.zeros((N,))
    kv.pull(0, out=out)
    o = out.asnumpy()
    r['push_pull'] = [float(o[0]), float(o[N // 2]), float(o[-1])]
    c = (out + mx.nd.ones((N,), dtype='float16').astype('float32')) * 2
    c = c.asnumpy()
    r['arith'] = [float(c[0]), float(c[-1])]
    dev = mx.kv.create('device')
    dev.set_gradient_compression({'type': '2bit', 'threshold': 0.5})
    dev.init(1, mx.nd.zeros((N,)))
    dev.push(1, mx.nd.ones((N,)))
    got = mx.nd.zeros((N,))
    dev.pull(1, out=got)
    g = got.asnumpy()
    r['compressed'] = [float(g[0]), float(g[-1])]
    dense = np.arange(ROWS * 4, dtype=np.float32).reshape(ROWS, 4)
    kv.init(2, mx.nd.array(dense).tostype('row_sparse'))
    rsp = mx.nd.zeros((ROWS, 4)).tostype('row_sparse')
    kv.row_sparse_pull(2, out=rsp, row_ids=mx.nd.arange(0, ROWS, dtype='int64'))
    r['row_sparse_equal'] = bool((rsp.asnumpy() == dense).all())
    return r


def batchify(i):
    """What a DataLoader worker does: build, copy and add NDArrays (no store)."""
    a = mx.nd.array(np.full((N,), i, dtype=np.float32))
    b = mx.nd.zeros((N,))
    a.copyto(b)
    c = (a + b).asnumpy()
    return [float(c[0]), float(c[-1])]


def forked(i):
    """store_work(i) in an os.fork() child; its answer, or 'HUNG' after DEADLINE."""
    rd, wr = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(rd)
        try:
            msg = json.dumps(store_work(i))
        except BaseException as e:
            msg = json.dumps('error: %r' % (e,))
        os.write(wr, msg.encode())
        os._exit(0)
    os.close(wr)
    data, end = b'', time.monotonic() + DEADLINE
    while True:
        ready, _, _ = select.select([rd], [], [], max(0.0, end - time.monotonic()))
        if not ready:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            return 'HUNG'
        chunk = os.read(rd, 1 << 16)
        if not chunk:
            break
        data += chunk
    os.close(rd)
    os.waitpid(pid, 0)
    return json.loads(data.decode())


if __name__ == '__main__':
    kv = parent_use()
    result = {'fork': [forked(i) for i in range(2)]}
    with mp.get_context('fork').Pool(2) as p:
        r = p.map_async(batchify, range(4))
        try:
            result['pool'] = r.get(timeout=DEADLINE)
        except mp.TimeoutError:
            result['pool'] = 'HUNG'
            p.terminate()
    # The parent still works after its children are gone.
    kv.push(0, [mx.nd.ones((N,))] * 2)
    out = mx.nd.zeros((N,))
    kv.pull(0, out=out)
    result['parent_after'] = float(out.asnumpy()[-1])
    print(json.dumps(result))
'''


def run_scenario(which):
    env = dict(os.environ)
    env['PYTHONPATH'] = BINDINGS + os.pathsep + env.get('PYTHONPATH', '')
    proc = subprocess.Popen([sys.executable, '-c', SCRIPT, which], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail('%s: the fork scenario did not finish in 180 s' % which)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # any child left behind
        except ProcessLookupError:
            pass
    assert proc.returncode == 0, err.decode()[-3000:]
    return json.loads(out.decode().strip().splitlines()[-1])


def expected():
    store = [{
        'push_pull': [3.0 * (i + 1)] * 3,
        'arith': [2.0 * (3 * (i + 1) + 1)] * 2,
        'compressed': [0.5, 0.5],
        'row_sparse_equal': True,
    } for i in range(2)]
    return {
        'fork': store,
        'pool': [[2.0 * i, 2.0 * i] for i in range(4)],
        'parent_after': 2.0,
    }


def test_forked_children_work(mxkv):
    assert run_scenario('mxkv') == expected()


def test_forked_children_work_on_mxnet(mxnet):
    """The oracle gives the same values."""
    assert run_scenario('mxnet') == expected()
