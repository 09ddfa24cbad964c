"""A dist worker for tests/python/test_audit_dist.py: one script for ``import mxnet as mx``
(real MXNet 1.9.1) and ``import mxkv as mx``, chosen by ``T_LIB`` (default ``mxkv``); every
node runs it (the import serves the scheduler and server roles).

Prints one ``RESULT <name> <values>`` line per case, for a job of 1 worker and 1 server:

``rsp``     row_sparse_pull of keys [2, 1] into one output: MXNet writes the keys in
            ascending order, so the output ends with key 2's rows.
``shared``  pushpull of keys [5, 6] with outputs [[X, Y], X]: Y is key 5's alone.
``pull``    pull of keys [7, 5, 6] into [[X, Y], X, [Y, X]]: X and Y end with key 7's value,
            the largest key's.
"""
import os

import numpy as np

if os.environ.get('T_LIB') == 'mxnet':
    import mxnet as mx
else:
    import mxkv as mx


def main():
    kv = mx.kv.create('dist_sync')
    rows = 4

    def rsp(v):
        return mx.nd.sparse.row_sparse_array(
            (np.full((rows, 2), v, dtype='float32'), np.arange(rows)), shape=(rows, 2))

    kv.init([1, 2], [rsp(1.0), rsp(2.0)])
    kv.init([5, 6], [mx.nd.zeros((3,)), mx.nd.zeros((3,))])
    kv._barrier()
    out = mx.nd.sparse.zeros('row_sparse', (rows, 2))
    kv.row_sparse_pull([2, 1], out=[out, out], row_ids=[mx.nd.array([0]), mx.nd.array([1])])
    print('RESULT rsp', out.indices.asnumpy().tolist(), out.data.asnumpy().tolist(),
          flush=True)
    x, y = mx.nd.zeros((3,)), mx.nd.zeros((3,), dtype='float64')
    kv.pushpull([5, 6], [mx.nd.ones((3,)), mx.nd.ones((3,)) * 20], out=[[x, y], x])
    print('RESULT shared', x.asnumpy().tolist(), y.asnumpy().tolist(), flush=True)
    kv.init(7, mx.nd.ones((3,)) * 7)
    y = mx.nd.zeros((3,), dtype='int32')
    kv.pull([7, 5, 6], out=[[x, y], x, [y, x]])
    print('RESULT pull', x.asnumpy().tolist(), y.asnumpy().tolist(), flush=True)


main()
