"""A dist worker for tests/python/test_audit_dist.py: one script for ``import mxnet as mx``
(real MXNet 1.9.1) and ``import mxkv as mx``, chosen by ``T_LIB`` (default ``mxkv``); every
node runs it (the import serves the scheduler and server roles).

Prints one ``RESULT <name> <values>`` line per case, for a job of 1 worker and 1 server:

``rsp``     row_sparse_pull of keys [2, 1] into one output: MXNet writes the keys in
            ascending order, so the output ends with key 2's rows.
``shared``  pushpull of keys [5, 6] with outputs [[X, Y], X]: Y is key 5's alone.
``pull``    pull of keys [7, 5, 6] into [[X, Y], X, [Y, X]]: X and Y end with key 7's value,
            the largest key's.
``pushed``  pushpull of keys [8, 9, 9] with values [A, B0, B1] and outputs [B0, C, C]: key 9
            sums B0 as key 8's pushpull left it.
``dtype``   pushpull of key 8 into two outputs: refused when the first is not float32 (the
            key's dtype); the other converted.
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
    # an output of key 8 that is a value pushed for key 9: key 9 sums it as key 8's
    # pushpull left it (keys go key by key)
    kv.init([8, 9], [mx.nd.zeros((3,)), mx.nd.zeros((3,))])
    a, b0, b1, c = (mx.nd.ones((3,)) * v for v in (1, 10, 12, 0))
    kv.pushpull([8, 9, 9], [a, b0, b1], out=[b0, c, c])
    print('RESULT pushed', b0.asnumpy().tolist(), c.asnumpy().tolist(), flush=True)
    # a key's first output of another dtype is refused; later outputs are converted
    outs = {}
    for name, dts in (('first', ('float64', 'float32')), ('later', ('float32', 'float64'))):
        o = [mx.nd.zeros((3,), dtype=d) for d in dts]
        try:
            kv.pushpull(8, mx.nd.ones((3,)) * 3, out=o)
            outs[name] = [v.asnumpy().tolist() for v in o]
        except Exception as e:  # MXNetError
            outs[name] = 'refused' if 'Output buffer dtype is different' in str(e) else str(e)
    print('RESULT dtype', outs['first'], outs['later'], flush=True)


main()
