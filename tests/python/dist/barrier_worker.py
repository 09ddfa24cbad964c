"""Worker for test_dist_barriers.py; T_CASE selects what it does. Prints 'rank R ...' lines.

threads: rank 0 calls kv._barrier() on two threads at once; rank 1 waits for a line on stdin,
then calls kv._barrier() twice. Then both init key 3, push ones and pull (want 2.0, the sum).
counts: init key 3, push ones, pull (the test starts one node with other DMLC_NUM_* values).
"""
import os
import sys
import threading

import mxkv as mx

case = os.environ['T_CASE']
kv = mx.kv.create('dist_sync')
r = kv.rank


def say(*a):
    print('rank %d' % r, *a, flush=True)


def barrier(what):
    try:
        kv._barrier()
        say(what, 'returned')
    except Exception as e:  # the test reads the line
        say(what, 'ERROR', str(e).replace('\n', ' | '))


if case == 'threads':
    if r == 0:
        ts = [threading.Thread(target=barrier, args=('thread %d barrier' % i,)) for i in range(2)]
        [t.start() for t in ts]
        say('started two barriers')
        [t.join() for t in ts]
    else:
        sys.stdin.readline()
        barrier('barrier 1')
        barrier('barrier 2')
kv.init(3, mx.nd.zeros((4,)))
kv.push(3, mx.nd.ones((4,)))
out = mx.nd.zeros((4,))
kv.pull(3, out=out)
say('pulled', out.asnumpy().tolist())
