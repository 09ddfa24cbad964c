"""Arithmetic between dense and row_sparse arrays (issue 9, section 5).

``dense += row_sparse`` used to raise "RowSparseNDArray has no dense buffer", so an updater
or optimizer adding a row_sparse gradient into a dense weight failed.  Every scenario
runs on real MXNet 1.9.1 and on mxkv; results (storage type, dtype, shape, every bit,
and the stored rows of row_sparse results) must match.  What MXNet does:

* ``dense <op> rsp`` and ``dense <op>= rsp`` (``+ - * /``): ``broadcast_*`` with a
  storage fallback (the row_sparse operand densified), a dense result;
* ``rsp + dense`` / ``rsp - dense`` (and ``mx.nd.sparse.add/subtract`` in either order):
  ``elemwise_add/sub``, a dense result whose unstored rows are the dense operand's
  values (``-dense`` for ``rsp - dense``), so ``-0.0`` survives where the fallback gives
  ``+0.0``;
* ``rsp * dense`` (and ``sparse.multiply`` in either order): ``elemwise_mul``, a
  row_sparse result over the rsp's rows; ``rsp * rsp``: over the union of the rows;
* ``rsp / dense``: the fallback (dense); ``rsp += dense`` etc.: ``(rsp + dense)``
  copied back into the row_sparse array (the non-zero rows);
* ``mx.nd.add/subtract/multiply/divide``: always the fallback.
"""
import numpy as np
import pytest

from conftest import assert_same_bits

NAN, INF = float('nan'), float('inf')
DENSE = [[-0.0, NAN, INF], [-0.0, 1.0, 2.0], [3.0, -0.0, NAN], [5.0, 6.0, 7.0]]
RSP_ROWS = ([[0.0, 1.0, -0.0], [2.0, 0.0, 4.0]], [1, 2])


def run_both(both, scenario, *args):
    mxnet, mxkv = both
    expected = scenario(mxnet, *args)
    got = scenario(mxkv, *args)
    assert_same_bits(expected, got, '%s%r' % (scenario.__name__, args))
    return got


def _result(res):
    """what must match: class name, stype, dense bits, stored rows"""
    out = {'stype': res.stype, 'dense': res.asnumpy(), 'cls': type(res).__name__}
    if res.stype == 'row_sparse':
        out['indices'] = res.indices.asnumpy()
        out['data'] = res.data.asnumpy()
    return out


def _operands(mx, dtype='float32', empty=False):
    dense = mx.nd.array(DENSE, dtype=dtype) if dtype.startswith('float') else \
        mx.nd.array(np.arange(12).reshape(4, 3) - 5, dtype=dtype)
    if empty:
        rsp = mx.nd.sparse.zeros('row_sparse', (4, 3), dtype=dtype)
    else:
        rsp = mx.nd.sparse.row_sparse_array(RSP_ROWS, shape=(4, 3), dtype=dtype)
    return dense, rsp


OPS = {
    'd+r': lambda mx, d, r: d + r,
    'd-r': lambda mx, d, r: d - r,
    'd*r': lambda mx, d, r: d * r,
    'd/r': lambda mx, d, r: d / r,
    'r+d': lambda mx, d, r: r + d,
    'r-d': lambda mx, d, r: r - d,
    'r*d': lambda mx, d, r: r * d,
    'r/d': lambda mx, d, r: r / d,
    'sparse.add(d,r)': lambda mx, d, r: mx.nd.sparse.add(d, r),
    'sparse.add(r,d)': lambda mx, d, r: mx.nd.sparse.add(r, d),
    'sparse.subtract(d,r)': lambda mx, d, r: mx.nd.sparse.subtract(d, r),
    'sparse.subtract(r,d)': lambda mx, d, r: mx.nd.sparse.subtract(r, d),
    'sparse.multiply(d,r)': lambda mx, d, r: mx.nd.sparse.multiply(d, r),
    'sparse.multiply(r,d)': lambda mx, d, r: mx.nd.sparse.multiply(r, d),
    'sparse.divide(r,d)': lambda mx, d, r: mx.nd.sparse.divide(r, d),
    'nd.add(d,r)': lambda mx, d, r: mx.nd.add(d, r),
    'nd.add(r,d)': lambda mx, d, r: mx.nd.add(r, d),
    'nd.subtract(d,r)': lambda mx, d, r: mx.nd.subtract(d, r),
    'nd.subtract(r,d)': lambda mx, d, r: mx.nd.subtract(r, d),
    'nd.multiply(r,d)': lambda mx, d, r: mx.nd.multiply(r, d),
    'r+r': lambda mx, d, r: r + r,
    'r*r': lambda mx, d, r: r * (r * 2),
    'd+r*2': lambda mx, d, r: d + r * 2,
    'r+row': lambda mx, d, r: r + mx.nd.ones((1, 3), dtype=d.dtype),
    'row-r': lambda mx, d, r: mx.nd.ones((1, 3), dtype=d.dtype) - r,
}


def binary(mx, name, dtype, empty):
    dense, rsp = _operands(mx, dtype, empty)
    return _result(OPS[name](mx, dense, rsp))


@pytest.mark.parametrize('name', sorted(OPS))
@pytest.mark.parametrize('dtype', ['float32', 'float64', 'int32'])
def test_binary_matches_mxnet(both, name, dtype):
    if dtype == 'int32' and '/' in name or 'divide' in name and dtype == 'int32':
        pytest.skip('MXNet 1.9.1 dies of SIGFPE dividing int32 arrays by zero')
    run_both(both, binary, name, dtype, False)


@pytest.mark.parametrize('name', ['d+r', 'r+d', 'd-r', 'r-d', 'r*d', 'sparse.add(d,r)'])
def test_binary_with_empty_rsp_matches_mxnet(both, name):
    run_both(both, binary, name, 'float32', True)


def inplace(mx, op, target, dtype):
    dense, rsp = _operands(mx, dtype)
    if target == 'dense':
        x, y = dense, rsp
    else:
        x, y = rsp, dense
    before = x
    if op == '+':
        x += y
    elif op == '-':
        x -= y
    elif op == '*':
        x *= y
    else:
        x /= y
    assert x is before
    return _result(x)


@pytest.mark.parametrize('op', ['+', '-', '*', '/'])
@pytest.mark.parametrize('target', ['dense', 'rsp'])
@pytest.mark.parametrize('dtype', ['float32', 'float64'])
def test_inplace_matches_mxnet(both, op, target, dtype):
    run_both(both, inplace, op, target, dtype)


def slice_iadd(mx):
    """the Test optimizer's ``weight[:] += grad * rescale_grad``"""
    weight, grad = _operands(mx)
    weight[:] += grad * 0.5
    weight[:] -= grad
    return _result(weight)


def test_slice_iadd_matches_mxnet(both):
    run_both(both, slice_iadd)


def dtype_mismatch(mx, name):
    dense = mx.nd.ones((4, 3), dtype='float64')
    rsp = mx.nd.sparse.row_sparse_array(RSP_ROWS, shape=(4, 3))
    try:
        res = OPS[name](mx, dense, rsp)
        res.asnumpy()
    except mx.base.MXNetError:
        return 'MXNetError'
    return 'no error'


@pytest.mark.parametrize('name', ['d+r', 'r+d', 'd-r', 'r-d', 'r*d'])
def test_dtype_mismatch_raises_like_mxnet(both, name):
    assert run_both(both, dtype_mismatch, name) == 'MXNetError'


def shape_mismatch(mx, inplace_op):
    dense = mx.nd.ones((5, 3))
    rsp = mx.nd.sparse.row_sparse_array(RSP_ROWS, shape=(4, 3))
    try:
        if inplace_op:
            dense += rsp
        else:
            (dense + rsp).asnumpy()
    except mx.base.MXNetError:
        return 'MXNetError'
    return 'no error'


@pytest.mark.parametrize('inplace_op', [False, True])
def test_shape_mismatch_raises_like_mxnet(both, inplace_op):
    assert run_both(both, shape_mismatch, inplace_op) == 'MXNetError'


# --- the reason it matters: updaters adding row_sparse gradients into dense weights -----
def updater_rsp_grad(mx, kind):
    kv = mx.kv.create(kind)
    kv.init(3, mx.nd.ones((4, 3)))

    def upd(key, recv, local):
        local += recv

    kv._set_updater(upd)
    grad = mx.nd.sparse.row_sparse_array(RSP_ROWS, shape=(4, 3))
    kv.push(3, grad)
    kv.push(3, [grad, grad * 2])
    out = mx.nd.zeros((4, 3))
    kv.pull(3, out=out)
    return out.asnumpy()


@pytest.mark.parametrize('kind', ['local', 'device'])
def test_updater_adds_row_sparse_grad_into_dense_weight(both, kind):
    got = run_both(both, updater_rsp_grad, kind)
    expect = np.ones((4, 3), np.float32)
    expect[[1, 2]] += 4 * np.array(RSP_ROWS[0], np.float32)
    np.testing.assert_array_equal(got, expect)


def test_optimizer_after_set_optimizer(both):
    def scenario(mx):
        kv = mx.kv.create('local')
        kv.init('w', mx.nd.ones((4, 3)))
        kv.set_optimizer(mx.optimizer.Test(rescale_grad=0.5))
        grad = mx.nd.sparse.row_sparse_array(RSP_ROWS, shape=(4, 3))
        kv.push('w', grad)
        kv.push('w', grad)
        out = mx.nd.zeros((4, 3))
        kv.pull('w', out=out)
        return out.asnumpy()

    got = run_both(both, scenario)
    expect = np.ones((4, 3), np.float32)
    expect[[1, 2]] += np.array(RSP_ROWS[0], np.float32)
    np.testing.assert_array_equal(got, expect)
