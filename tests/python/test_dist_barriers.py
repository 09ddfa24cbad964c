"""Barriers and start-up checks in a cluster of real OS processes (libmxkv through ``import
mxkv``) on 127.0.0.1, with the harness of test_dist_faults.py (ports free at run time,
``timeout(1)`` on every node, a SIGALRM deadline on every test, synchronisation on output
lines, nothing left behind).

- Two threads of one worker in ``kv._barrier()`` are two barriers, one after the other: neither
  passes before the other worker arrives, and the counts stay in step (the next sync round
  sums both workers).
- A node started with other ``DMLC_NUM_WORKER`` / ``DMLC_NUM_SERVER`` values than the
  scheduler's fails its start naming the variable and both values, and every other node ends
  with an error (a server with too few workers completed sync rounds on one push before).
"""
import os
import time

import pytest

import test_dist_faults as faults
from test_dist_faults import Cluster, Node, PY, SERVE, hard_alarm  # noqa: F401 (autouse fixture)

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'dist', 'barrier_worker.py')
WINDOW = 2.0   # how long the test gives a wrongly released barrier to show itself

pytestmark = faults.pytestmark


class BarrierCluster(Cluster):
    def start(self, label, stdin=False):
        argv = [PY, WORKER] if label.startswith('worker') else [PY, '-c', SERVE]
        self.nodes[label] = Node(label, argv, self.specs[label], stdin, self.t0)
        return self.nodes[label]


def first_line(node, pattern, timeout):
    """The first output line of `node` containing `pattern`, or None after `timeout` s."""
    deadline = time.monotonic() + timeout
    with node.cond:
        while True:
            hit = [l for l in node.lines if pattern in l]
            if hit:
                return hit[0]
            left = deadline - time.monotonic()
            if left <= 0 or node.eof:
                return None
            node.cond.wait(left)


@pytest.fixture
def cluster_of():
    made = []

    def make(*a, **k):
        c = BarrierCluster(*a, **k)
        made.append(c)
        return c
    yield make
    for c in made:
        c.cleanup()


def test_two_threads_barriers_of_one_worker_wait_for_the_other_worker(cluster_of):
    c = cluster_of(2, 1, env={'T_CASE': 'threads'})
    c.start_all(stdin=True)
    w0, w1 = c['worker 0'], c['worker 1']
    w0.wait_line(r'rank 0 started two barriers')
    early = first_line(w0, 'barrier returned', WINDOW)
    assert early is None, 'worker 0 passed a barrier before worker 1 arrived: %s\n%s' % (
        early, c.report())
    w1.send('go\n')
    for label in c.nodes:
        assert c[label].wait_exit() == 0, c.report()
    out0, out1 = w0.output(), w1.output()
    assert out0.count('barrier returned') == 2, c.report()
    assert 'rank 1 barrier 1 returned' in out1 and 'rank 1 barrier 2 returned' in out1, c.report()
    assert 'rank 0 pulled [2.0, 2.0, 2.0, 2.0]' in out0, c.report()
    assert 'rank 1 pulled [2.0, 2.0, 2.0, 2.0]' in out1, c.report()


@pytest.mark.parametrize('label,var,mine,theirs', [
    ('server 0', 'DMLC_NUM_WORKER', 1, 2),
    ('worker 1', 'DMLC_NUM_SERVER', 2, 1),
])
def test_node_counts_that_disagree_with_the_scheduler_fail_start_up(cluster_of, label, var,
                                                                     mine, theirs):
    c = cluster_of(2, 1, env={'T_CASE': 'counts'}, timeout_s=20)
    c.specs[label][var] = str(mine)
    t0 = time.monotonic()
    c.start_all()
    want = '%s is %d on this %s but %d on the scheduler' % (var, mine, label.split()[0], theirs)
    for l in c.nodes:
        assert c[l].wait_exit() != 0, c.report()
    assert want in c[label].output(), c.report()
    for l in c.nodes:
        assert 'pulled' not in c[l].output(), c.report()
    # well before the 20 s deadline: the others learn it from the lost node
    assert time.monotonic() - t0 < 15, c.report()
