"""Audit (session 12): three cases where a dist_sync worker of mxkv writes other values into
shared outputs than a worker of a real MXNet 1.9.1 cluster (1 worker, 1 server, each job
all MXNet or all mxkv). They were bugs of src/dist, pinned as strict xfails, unmarked as
they were fixed.

* ``rsp``: row_sparse_pull([2, 1], out=[o, o], row_ids=[[0], [1]]) left key 1's rows
  in o; MXNet (and libmxkv's local stores, since 49db683) leave key 2's, the keys being
  written in ascending order.
* ``shared``: pushpull([5, 6], [a, b], out=[[x, y], x]) with y of another dtype: y is
  key 5's output alone and must hold a (1.0); mxkv gave it b (20.0), copied from x after
  key 6's reply overwrote x.
* ``pull``: pull([7, 5, 6], out=[[x, y], x, [y, x]]) left key 6's value in x and y
  (the key listed last); MXNet leaves key 7's (the largest).
* ``pushed``: pushpull([8, 9, 9], [a, b0, b1], out=[b0, c, c]): MXNet pushes and pulls key
  by key, so key 9 sums b0 as key 8's result left it (1 + 12 = 13); mxkv pushed every
  key's values at once (10 + 12 = 22).
* ``dtype``: MXNet's dist pushpull refuses a key whose first output is not of the key's
  dtype ("Output buffer dtype is different") and converts into its later outputs; mxkv
  converted into both.
"""
import os
import re

import pytest

from test_dist import launch, _has_mxnet

pytestmark = pytest.mark.skipif(not os.path.isdir('/proc/self'), reason='needs Linux /proc')

_RESULT = re.compile(r'^\[worker 0\] RESULT (\w+) (.*)$', re.M)
_RUNS = {}


def results(lib):
    if lib not in _RUNS:
        code, out = launch('audit_order_worker.py', 1, 1, {'T_LIB': lib}, timeout=100,
                           node_timeout=60)
        assert code == 0, out
        _RUNS[lib] = dict(_RESULT.findall(out))
        assert sorted(_RUNS[lib]) == ['dtype', 'pull', 'pushed', 'rsp', 'shared'], out
    return _RUNS[lib]


@pytest.mark.parametrize('case', ['rsp', 'shared', 'pull', 'pushed', 'dtype'])
def test_dist_shared_outputs_as_mxnet(case):
    if not _has_mxnet():
        pytest.skip('no mxnet 1.9.1 in this Python (make venv-ref)')
    assert results('mxkv')[case] == results('mxnet')[case]
