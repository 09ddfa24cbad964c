"""sum() of csr arrays against real MXNet 1.9.1, bit for bit.

Over axis 0 or 1 alone (no keepdims, no exclude) MXNet 1.9.1 runs its sparse kernel
(src/operator/tensor/broadcast_reduce_op.h: SumOpForwardInferStorageType, SumCsrImpl):
a dense result whose element j is the Kahan sum (mshadow's red::sum, in the element
type) of column j's (axis 0) or row j's (axis 1) *stored* values in storage order.  A
dense sum adds the zeros the array does not store too, and a Kahan step adding 0 to a
sum with a residual can change it: the data here is chosen so that it does, so the two
orders are told apart.  Every other sum of a csr array (no axis, axis -1, keepdims,
exclude, two axes) is MXNet's storage fallback: the dense sum.
"""
import ctypes

import numpy as np
import pytest

from conftest import assert_same_bits

BF16 = np.dtype([('bfloat16', np.uint16)])
DT = {'float32': 0, 'float64': 1, 'float16': 2, 'uint8': 3, 'int32': 4, 'int8': 5,
      'int64': 6, 'bool': 7, 'bf16': 12}


def make_csr(m, shape, dtype, data, indptr, indices):
    """a csr array built in library `m` through its C API (as MXNet's csr_matrix does:
    MXNDArrayCreateSparseEx, then each part copied in)"""
    indptr, indices = np.array(indptr, np.int64), np.array(indices, np.int64)
    aux = (ctypes.c_int * 2)(6, 6)
    aux_ndims = (ctypes.c_uint32 * 2)(1, 1)
    aux_shapes = (ctypes.c_uint32 * 2)(indptr.size, indices.size)
    shp = (ctypes.c_uint32 * 2)(*shape)
    hdl = ctypes.c_void_p()
    m.base.check_call(m.base._LIB.MXNDArrayCreateSparseEx(
        2, shp, 2, 1, 0, 0, DT[dtype], 2, aux, aux_ndims, aux_shapes, ctypes.byref(hdl)))
    arr = m.nd.sparse.CSRNDArray(hdl)
    if dtype == 'bf16':
        values = m.nd.array(np.asarray(data, np.float32)).astype(BF16)
    else:
        values = m.nd.array(np.asarray(data, dtype), dtype=dtype)
    for i, part in [(-1, values), (0, m.nd.array(indptr, dtype='int64')),
                    (1, m.nd.array(indices, dtype='int64'))]:
        m.base.check_call(m.base._LIB.MXNDArraySyncCopyFromNDArray(
            arr.handle, part.handle, ctypes.c_int(i)))
    arr.wait_to_read()
    return arr


def _result(res):
    arr = res.asnumpy()
    if arr.dtype == BF16:
        arr = arr.view(np.uint16)
    return {'class': type(res).__name__, 'stype': res.stype, 'dtype': arr.dtype.str,
            'shape': arr.shape, 'bits': np.ascontiguousarray(arr).tobytes()}


def _outcome(mx, fn):
    try:
        return _result(fn(mx))
    except Exception as exc:  # pylint: disable=broad-except
        names = [c.__name__ for c in type(exc).__mro__]
        return 'MXNetError' if 'MXNetError' in names else type(exc).__name__


def _same(both, fn, what):
    mxnet, mxkv = both
    expected = _outcome(mxnet, fn)
    assert_same_bits(expected, _outcome(mxkv, fn), what)
    return expected


def random_csr(shape, density, dtype, seed, spread=25):
    """(data, indptr, indices) of a canonical csr array: values of both signs over many
    binades, and about a tenth of the stored values explicit zeros"""
    rng = np.random.RandomState(seed)
    mask = rng.rand(*shape) < density
    rows, cols = np.nonzero(mask)
    if dtype in ('float32', 'float64', 'float16', 'bf16'):
        spread = min(spread, 6) if dtype == 'float16' else spread
        vals = rng.randn(rows.size) * np.exp(rng.uniform(-spread, spread, rows.size))
        vals[rng.rand(rows.size) < 0.1] = 0
        vals = vals.astype('float32' if dtype == 'bf16' else dtype)
    else:
        info = np.iinfo(dtype)
        vals = rng.randint(info.min, info.max + 1, rows.size, dtype=dtype)
    indptr = np.concatenate(([0], np.cumsum(mask.sum(axis=1))))
    return vals, indptr, cols


FLOATS = ('float32', 'float64', 'float16', 'bf16')
SHAPES = {
    'many columns': ((400, 300), 0.3),     # lanes side by side
    'few long columns': ((20000, 5), 0.5),  # a Python loop per chain
    'one column': ((5000, 1), 0.7),
    'ragged': ((3000, 200), 0.05),          # lanes, a few going on alone
    'one-row': ((1, 50), 0.8),
}


@pytest.mark.parametrize('dtype', FLOATS)
@pytest.mark.parametrize('name', sorted(SHAPES))
@pytest.mark.parametrize('axis', [0, 1])
def test_csr_axis_sum_bits(both, dtype, name, axis):
    shape, density = SHAPES[name]
    parts = random_csr(shape, density, dtype, seed=len(name) + axis)
    _same(both, lambda mx: make_csr(mx, shape, dtype, *parts).sum(axis=axis),
          '%s %s axis %d' % (dtype, name, axis))


# (shape, density) for which a few chains come out otherwise with the zeros added
TELLING = {('float32', 0): ((60, 300), 0.1), ('float32', 1): ((60, 300), 0.1),
           ('float64', 0): ((60, 300), 0.1), ('float64', 1): ((300, 40), 0.15)}


@pytest.mark.parametrize('dtype,axis', sorted(TELLING))
def test_stored_values_only_not_the_dense_sum(both, dtype, axis):
    """the data tells the sparse kernel's order (stored values only) from the dense sum's
    (every element, zeros included): mxkv must take the first"""
    shape, density = TELLING[dtype, axis]
    parts = random_csr(shape, density, dtype, seed=1, spread=30)
    sparse = _same(both, lambda mx: make_csr(mx, shape, dtype, *parts).sum(axis=axis),
                   'axis %d' % axis)
    dense = _same(both, lambda mx: make_csr(mx, shape, dtype, *parts).sum(axis=axis - 2),
                  'axis %d (fallback)' % (axis - 2))
    assert sparse['bits'] != dense['bits'], axis


@pytest.mark.parametrize('dtype', ['int8', 'uint8', 'int32', 'int64'])
def test_integer_csr_sums_wrap(both, dtype):
    shape = (3000, 40)
    parts = random_csr(shape, 0.5, dtype, seed=2)
    for axis in (0, 1):
        _same(both, lambda mx: make_csr(mx, shape, dtype, *parts).sum(axis=axis),
              '%s axis %d' % (dtype, axis))


def _special():
    nan1 = np.array([0x7fc00001, 0xffc12345], np.uint32).view(np.float32)
    return np.array([1.5, np.inf, 2.0, -3.0, np.nan, 4.0, -np.inf, 1e-3, nan1[0], nan1[1],
                     3e38, 3e38, -1.0, 65000.0, 65000.0, -0.0], np.float32)


@pytest.mark.parametrize('dtype', FLOATS)
@pytest.mark.parametrize('columns', [3, 40])
def test_non_finite_csr_sums(both, dtype, columns):
    """infinities, NaN payloads, overflow; one chain per column and per row"""
    rng = np.random.RandomState(columns)
    rows = 16
    vals = np.concatenate([np.roll(_special(), k) for k in range(columns)])
    with np.errstate(all='ignore'):
        vals = vals if dtype in ('float32', 'bf16') else vals.astype(dtype)
    dense = np.zeros((rows, columns), bool)
    for j in range(columns):
        dense[rng.permutation(rows)[:rows - 2], j] = True
    r, c = np.nonzero(dense)
    vals = vals[:r.size]
    indptr = np.concatenate(([0], np.cumsum(dense.sum(axis=1))))
    for axis in (0, 1):
        _same(both, lambda mx: make_csr(mx, (rows, columns), dtype, vals, indptr, c)
              .sum(axis=axis), '%s axis %d' % (dtype, axis))


SMALL = ((3, 4), [1.5, -2.0, 0.0, 3.25], [0, 2, 2, 4], [0, 3, 1, 2])
CALLS = {
    'axis (0,)': lambda a, mx: a.sum(axis=(0,)),
    'axis [1]': lambda a, mx: a.sum(axis=[1]),
    'axis -1 (fallback)': lambda a, mx: a.sum(axis=-1),
    'axis -2 (fallback)': lambda a, mx: a.sum(axis=-2),
    'no axis (fallback)': lambda a, mx: a.sum(),
    'axis (0, 1) (fallback)': lambda a, mx: a.sum(axis=(0, 1)),
    'keepdims (fallback)': lambda a, mx: a.sum(axis=0, keepdims=True),
    "keepdims '0'": lambda a, mx: a.sum(axis=1, keepdims='0'),
    'exclude (fallback)': lambda a, mx: a.sum(axis=0, exclude=True),
    'axis 2': lambda a, mx: a.sum(axis=2),
    'axis 1.0': lambda a, mx: a.sum(axis=1.0),
    'duplicate axes': lambda a, mx: a.sum(axis=(0, 0)),
    'out': lambda a, mx: a.sum(axis=0, out=mx.nd.ones((4,))),
    'out of another shape': lambda a, mx: a.sum(axis=0, out=mx.nd.ones((3,))),
    'out of another dtype': lambda a, mx: a.sum(axis=1, out=mx.nd.ones((3,), dtype='float64')),
    'nd.sum': lambda a, mx: mx.nd.sum(a, axis=1),
    'positional': lambda a, mx: a.sum(0),
}


@pytest.mark.parametrize('name', sorted(CALLS))
def test_csr_sum_calls(both, name):
    def run(mx):
        res = CALLS[name](make_csr(mx, SMALL[0], 'float32', *SMALL[1:]), mx)
        return res
    _same(both, run, name)


DEGENERATE = {
    'no stored value': ((3, 4), [], [0, 0, 0, 0], []),
    'empty indptr': ((3, 4), [], [], []),  # made and never filled (mxkv cannot make it)
    'long indptr': ((3, 4), [1, 2], [0, 1, 2, 2, 7], [3, 0]),
    'unsorted columns (axis 1 reads no index)': ((2, 3), [1, 2, 4, 8], [0, 2, 4], [2, 0, 1, 1]),
    'decreasing indptr (axis 1: that row sums nothing)': ((3, 3), [1, 2, 4], [0, 2, 1, 3],
                                                          [0, 1, 2]),
}


@pytest.mark.parametrize('name', sorted(DEGENERATE))
@pytest.mark.parametrize('axis', [0, 1])
def test_degenerate_csr_sums(both, tmp_path, name, axis):
    """arrays MXNet makes, saves and loads; each library sums what it loaded"""
    if axis == 0 and ('unsorted' in name or 'decreasing' in name):
        pytest.skip('MXNet: the result depends on its thread count (refused by mxkv)')
    mxnet, _ = both
    path = str(tmp_path / 'a.params')
    shape, data, indptr, indices = DEGENERATE[name]
    mxnet.nd.save(path, [make_csr(mxnet, shape, 'float32', data, indptr, indices)])
    _same(both, lambda mx: mx.nd.load(path)[0].sum(axis=axis), name)


@pytest.mark.parametrize('shape', [(0, 4), (3, 0)])
def test_csr_sums_of_no_elements(both, shape):
    """MXNet fails to infer any shape with a 0 dim (an unknown dim to it); mxkv makes
    such arrays and sums a csr one as the dense one (zeros, or an empty array)"""
    mxnet, mxkv = both
    for axis in (0, 1):
        with pytest.raises(mxnet.base.MXNetError):
            mxnet.nd.sparse.zeros('csr', shape).sum(axis=axis).asnumpy()
        got = mxkv.nd.sparse.zeros('csr', shape).sum(axis=axis)
        want = mxkv.nd.zeros(shape).sum(axis=axis)
        assert _result(got) == _result(want)
        assert got.shape == (shape[1 - axis],) and not got.asnumpy().any()


def test_csr_sum_over_axis_0_refuses_what_mxnet_answers_by_thread_count(mxkv):
    for indices in ([2, 0, 1, 1], [0, 0, 1, 2], [0, 5, 1, 2], [-1, 0, 1, 2]):
        arr = make_csr(mxkv, (2, 3), 'float32', [1, 2, 4, 8], [0, 2, 4], indices)
        with pytest.raises(mxkv.base.MXNetError, match='thread count'):
            arr.sum(axis=0)


def test_csr_sum_refuses_offsets_outside_the_values(mxkv, tmp_path):
    """MXNet reads outside its buffers there: a clear error"""
    for indptr in ([0, 2, 9], [0, 2], [-1, 1, 2]):
        path = str(tmp_path / 'a.params')
        with open(path, 'wb') as f:  # (mxkv makes no indptr of another length)
            f.write(_csr_file((2, 3), [1, 2], indptr, [0, 1]))
        arr = mxkv.nd.load(path)[0]
        for axis in (0, 1):
            with pytest.raises(mxkv.base.MXNetError, match='outside'):
                arr.sum(axis=axis)


def _csr_file(shape, data, indptr, indices):
    """a .params file of one float32 csr array with these parts (MXNet's V2 format)"""
    import struct

    def shp(dims):
        return struct.pack('<i', len(dims)) + b''.join(struct.pack('<q', d) for d in dims)
    data = np.asarray(data, np.float32)
    body = (struct.pack('<Ii', 0xF993FAC9, 2) + shp([data.size]) + shp(shape) +
            struct.pack('<iii', 1, 0, 0) + struct.pack('<i', 6) + shp([len(indptr)]) +
            struct.pack('<i', 6) + shp([len(indices)]) + data.tobytes() +
            np.asarray(indptr, np.int64).tobytes() + np.asarray(indices, np.int64).tobytes())
    return struct.pack('<QQQ', 0x112, 0, 1) + body + struct.pack('<Q', 0)


def test_bool_csr_has_no_sum_kernel(both):
    _same(both, lambda mx: make_csr(mx, (2, 3), 'bool', [True, True], [0, 1, 2], [0, 0])
          .sum(axis=0).asnumpy(), 'bool')
