"""Shapes with dimensions of 2**31 and more reach the library whole (issue 9, item 4.5).

The binding used to pack every dim into a uint32, so ``mx.nd.zeros((2**32 + 5,))`` became
an array of shape ``(5,)``.  Dims that fit in uint32 still go through MXNet's ``mx_uint``
entry points; larger ones through the 64-bit ones (``MXNDArrayCreateEx64``,
``MXNDArrayCreateSparseEx64``); shapes are read with ``MXNDArrayGetShapeEx64``.

Every shape here either has a zero-width dim or is a row_sparse array with at most a
couple of stored uint8 rows, so nothing large is allocated.

MXNet 1.9.1's own frontend (a build without USE_INT64_TENSOR_SIZE) refuses every such
shape with ``OverflowError: unsigned int is greater than maximum``, and reads dims in
[2**31, 2**32) back wrapped to negative numbers (``MXNDArrayGetShapeEx``), so there is
nothing to compare against bit for bit.  When this suite runs on real libmxnet.so
(``MXKV_LIBRARY_PATH``) the binding must still never truncate: zero-size shapes work,
and arrays of more than 2**31 elements raise MXNetError (that build's limit).
"""
import os

import numpy as np
import pytest

BIG = 2 ** 32 + 5          # wraps to 5 in a uint32
MID = 2 ** 31 + 5          # fits a uint32, not an int (MXNDArrayGetShapeEx)
HUGE = 2 ** 40 + 3


def _on_real_mxnet(mxkv):
    return 'libmxnet' in os.path.basename(mxkv.base.library_path)


def _big_sparse_or_raise(mxkv, make):
    """`make()`'s result, or None after checking that real MXNet (which cannot hold more
    than 2**31 elements in this build) refused it with an error instead of truncating."""
    if not _on_real_mxnet(mxkv):
        return make()
    with pytest.raises(mxkv.base.MXNetError, match='2\\^31'):
        make().shape  # pylint: disable=expression-not-assigned
    return None


# --- dense creation paths ---------------------------------------------------------------
@pytest.mark.parametrize('shape', [(BIG, 0), (0, BIG), (MID, 0), (HUGE, 0), (0, HUGE),
                                   (BIG, 0, 3), (3, BIG, 0), (2 ** 32, 0), (2 ** 32 - 1, 0)])
@pytest.mark.parametrize('make', ['zeros', 'empty', 'ones', 'full', 'array', 'zeros_u8'])
def test_dense_creation_keeps_every_dim(mxkv, shape, make):
    mx = mxkv
    if make == 'zeros':
        arr = mx.nd.zeros(shape)
    elif make == 'zeros_u8':
        arr = mx.nd.zeros(shape, dtype='uint8')
    elif make == 'empty':
        arr = mx.nd.empty(shape)
    elif make == 'ones':
        arr = mx.nd.ones(shape)
    elif make == 'full':
        arr = mx.nd.full(shape, 7)
    else:
        arr = mx.nd.array(np.zeros(shape, np.float32))
    assert arr.shape == shape
    assert arr.size == 0
    assert arr.asnumpy().shape == shape
    copy = arr.copy()
    assert copy.shape == shape


def test_dims_beyond_int64_raise(mxkv):
    with pytest.raises(OverflowError):
        mxkv.nd.zeros((2 ** 64, 0))
    with pytest.raises(OverflowError):
        mxkv.nd.sparse.zeros('row_sparse', (2 ** 63, 1))
    with pytest.raises(mxkv.base.MXNetError):
        mxkv.nd.zeros((-1, 2))


# --- sparse creation paths --------------------------------------------------------------
@pytest.mark.parametrize('make', ['sparse.zeros', 'sparse.empty', 'nd.zeros', 'nd.empty',
                                  'row_sparse_array(shape)', 'csr'])
def test_sparse_zeros_keep_every_dim(mxkv, make):
    mx = mxkv
    shape = (BIG, 1)

    def build():
        if make == 'sparse.zeros':
            return mx.nd.sparse.zeros('row_sparse', shape, dtype='uint8')
        if make == 'sparse.empty':
            return mx.nd.sparse.empty('row_sparse', shape, dtype='uint8')
        if make == 'nd.zeros':
            return mx.nd.zeros(shape, stype='row_sparse', dtype='uint8')
        if make == 'nd.empty':
            return mx.nd.empty(shape, stype='row_sparse', dtype='uint8')
        if make == 'csr':
            return mx.nd.sparse.zeros('csr', shape, dtype='uint8')
        return mx.nd.sparse.row_sparse_array(shape, dtype='uint8')

    arr = _big_sparse_or_raise(mx, build)
    if arr is None:
        return
    assert arr.shape == shape
    if make != 'csr':
        assert arr.stype == 'row_sparse'
        assert arr.indices.shape == (0,)
        assert arr.data.shape == (0, 1)


def test_sparse_zero_width_on_both_libraries(mxkv):
    """(BIG, 0) row_sparse holds no element: accepted by real MXNet too, shape intact"""
    arr = mxkv.nd.sparse.zeros('row_sparse', (BIG, 0))
    assert arr.shape == (BIG, 0)
    dense = arr.tostype('default')
    assert dense.shape == (BIG, 0)
    back = dense.tostype('row_sparse')
    assert back.shape == (BIG, 0) and back.indices.shape == (0,)


def test_row_sparse_array_from_parts_keeps_every_dim(mxkv):
    mx = mxkv

    def build():
        return mx.nd.sparse.row_sparse_array(([[3], [4]], [0, BIG - 1]), shape=(BIG, 1),
                                             dtype='uint8')

    arr = _big_sparse_or_raise(mx, build)
    if arr is None:
        return
    assert arr.shape == (BIG, 1)
    assert arr.indices.asnumpy().tolist() == [0, BIG - 1]
    assert arr.data.asnumpy().tolist() == [[3], [4]]
    arr.check_format()  # row BIG-1 is in range only if the shape was kept
    with pytest.raises(mx.base.MXNetError):
        mx.nd.sparse.row_sparse_array(([[3]], [BIG]), shape=(BIG, 1), dtype='uint8').check_format()


def test_save_load_keeps_every_dim(mxkv, tmp_path):
    """shapes read back from a loaded file (MXNDArrayGetShapeEx64)"""
    mx = mxkv
    fname = str(tmp_path / 'big.params')
    arrays = {'dense': mx.nd.zeros((BIG, 0)), 'mid': mx.nd.zeros((0, MID))}
    if not _on_real_mxnet(mx):
        arrays['rsp'] = mx.nd.sparse.row_sparse_array(([[7]], [BIG - 1]), shape=(BIG, 1),
                                                      dtype='uint8')
    mx.nd.save(fname, arrays)
    back = mx.nd.load(fname)
    assert back['dense'].shape == (BIG, 0) and back['mid'].shape == (0, MID)
    if 'rsp' in arrays:
        assert back['rsp'].shape == (BIG, 1)
        assert back['rsp'].indices.asnumpy().tolist() == [BIG - 1]
        assert back['rsp'].data.asnumpy().tolist() == [[7]]


# --- the store -------------------------------------------------------------------------
def test_kv_init_dense_keeps_every_dim(mxkv):
    mx = mxkv
    kv = mx.kv.create('local')
    kv.init(3, mx.nd.zeros((BIG, 0)))
    out = mx.nd.zeros((BIG, 0))
    kv.pull(3, out=out)
    assert out.shape == (BIG, 0)
    # before the fix the key was (5, 0): a (5, 0) output was accepted
    with pytest.raises(mx.base.MXNetError):
        kv.pull(3, out=mx.nd.zeros((5, 0)))


def test_kv_init_row_sparse_keeps_every_dim(mxkv):
    mx = mxkv
    if _on_real_mxnet(mx):
        pytest.skip('MXNet 1.9.1 (no USE_INT64_TENSOR_SIZE) cannot create the value')
    kv = mx.kv.create('local')
    kv.init('emb', mx.nd.sparse.zeros('row_sparse', (BIG, 1), dtype='uint8'))
    kv.push('emb', mx.nd.sparse.row_sparse_array(([[9], [8]], [1, BIG - 1]), shape=(BIG, 1),
                                                 dtype='uint8'))
    out = mx.nd.sparse.zeros('row_sparse', (BIG, 1), dtype='uint8')
    kv.row_sparse_pull('emb', out=out, row_ids=mx.nd.array([BIG - 1, 0], dtype='int64'))
    assert out.shape == (BIG, 1)
    assert out.indices.asnumpy().tolist() == [0, BIG - 1]
    assert out.data.asnumpy().tolist() == [[0], [8]]
    # the key is (BIG, 1), not (5, 1)
    small = mx.nd.sparse.zeros('row_sparse', (5, 1), dtype='uint8')
    with pytest.raises(mx.base.MXNetError):
        kv.row_sparse_pull('emb', out=small, row_ids=mx.nd.array([0], dtype='int64'))


@pytest.mark.parametrize('shape', [(2.7, 3), (2.0, 3), (True, 2), (np.float32(2),), 2.5])
@pytest.mark.parametrize('make', ['zeros', 'empty', 'sparse.zeros', 'row_sparse_array'])
def test_non_integer_dims_are_refused(mxkv, shape, make):
    """int() used to truncate 2.7 to 2 (MXNet refuses float and bool dims)"""
    mx = mxkv
    with pytest.raises(TypeError):
        if make == 'zeros':
            mx.nd.zeros(shape)
        elif make == 'empty':
            mx.nd.empty(shape)
        elif make == 'sparse.zeros':
            mx.nd.sparse.zeros('row_sparse', shape)
        else:
            mx.nd.sparse.row_sparse_array(([[1.0] * 3], [0]), shape=(3, 3.5))


def test_numpy_integer_dims_are_accepted(mxkv):
    arr = mxkv.nd.zeros((np.int64(2), np.uint32(3)))
    assert arr.shape == (2, 3) and all(type(d) is int for d in arr.shape)
    assert mxkv.nd.sparse.zeros('row_sparse', (np.int32(4), 2)).shape == (4, 2)
