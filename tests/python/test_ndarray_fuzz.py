"""A small differential sweep of what KVStore users do with NDArrays, against MXNet 1.9.1:
creating arrays of every dtype (array, zeros, ones, full, arange), astype between every
pair of dtypes, basic and advanced indexing (get and set), copyto between dtypes, and
storage conversions (tostype to row_sparse and csr and back, with their parts).  Each
case's result (class, storage type, dtype, shape, bytes) or error class must be MXNet's.
"""
import itertools

import numpy as np
import pytest

from conftest import assert_same_bits

BF16 = np.dtype([('bfloat16', np.uint16)])
DTYPES = ['float32', 'float64', 'float16', 'uint8', 'int8', 'int32', 'int64', 'bool']


def _result(res, mx):
    if isinstance(res, mx.nd.NDArray):
        arr = res.asnumpy()
        if arr.dtype == BF16:
            arr = arr.view(np.uint16)
        out = {'class': type(res).__name__, 'stype': res.stype, 'shape': res.shape,
               'dtype': arr.dtype.str, 'bits': np.ascontiguousarray(arr).tobytes()}
        if res.stype == 'csr':
            out['parts'] = [_result(p, mx) for p in (res.data, res.indptr, res.indices)]
        elif res.stype == 'row_sparse':
            out['parts'] = [_result(p, mx) for p in (res.data, res.indices)]
        return out
    return repr(res)


def _outcome(mx, fn):
    try:
        res = fn(mx)
        return res if isinstance(res, list) else _result(res, mx)
    except Exception as exc:  # pylint: disable=broad-except
        names = [c.__name__ for c in type(exc).__mro__]
        return 'MXNetError' if 'MXNetError' in names else type(exc).__name__


def _same(both, fn, what):
    mxnet, mxkv = both
    assert_same_bits(_outcome(mxnet, fn), _outcome(mxkv, fn), what)


SOURCES = {
    'floats': np.array([[1.5, -2.25, 0.0], [np.inf, -0.0, 3e9]]),
    'ints': np.array([[1, -2, 300], [70000, -5, 0]]),
    'bools': np.array([True, False, True]),
    'list': [[1, 2], [3, 4]],
    'f16': np.array([1, 2, 65504], np.float16),
    'u8': np.array([1, 255], np.uint8),
    'big ints': np.array([2 ** 40, -2 ** 53 - 1]),
    'nan': np.array([np.nan, 1.0]),
}


@pytest.mark.parametrize('name', sorted(SOURCES))
@pytest.mark.parametrize('dtype', DTYPES + [None])
def test_array_of_every_dtype(both, name, dtype):
    src = SOURCES[name]
    _same(both, lambda mx: mx.nd.array(src, dtype=dtype) if dtype else mx.nd.array(src),
          '%s %s' % (name, dtype))


@pytest.mark.parametrize('dtype', DTYPES)
def test_constructors_of_every_dtype(both, dtype):
    for ctor in ('zeros', 'ones'):
        _same(both, lambda mx: getattr(mx.nd, ctor)((2, 3), dtype=dtype), ctor)
    _same(both, lambda mx: mx.nd.full((2, 3), 7.9, dtype=dtype), 'full')
    _same(both, lambda mx: mx.nd.empty((2, 3), dtype=dtype).shape, 'empty')
    _same(both, lambda mx: mx.nd.arange(0, 5, 1.5, dtype=dtype), 'arange')


@pytest.mark.parametrize('args', [(0, 5, 0.7), (0.5, 5, 1.5), (-1.7, 2, 1.0), (0, -3, -1.5),
                                  (0, 5000, 2049.7), (65519.0, 65600, 30), (0, 5, 1.5, 2),
                                  (3e9, 3e9 + 4, 1), (-3e9, -3e9 + 2, 1)])
def test_float16_arange_takes_start_and_step_as_ints(both, args):
    """MXNet 1.9.1's float16 arange truncates start and step to C ints (the length comes
    from the real values): its answer, deterministic, is the one to give"""
    kwargs = {'repeat': args[3]} if len(args) > 3 else {}
    _same(both, lambda mx: mx.nd.arange(*args[:3], dtype='float16', **kwargs), str(args))


@pytest.mark.parametrize('src,dst', list(itertools.product(DTYPES, DTYPES)))
def test_astype_and_copyto_between_dtypes(both, src, dst):
    base = np.array([[1.7, -2.5, 300.2], [-1e10, 0.5, np.inf]])
    _same(both, lambda mx: mx.nd.array(base, dtype=src).astype(dst), 'astype')

    def copyto(mx):
        out = mx.nd.zeros((2, 3), dtype=dst)
        mx.nd.array(base, dtype=src).copyto(out)
        return out
    _same(both, copyto, 'copyto')


KEYS = [0, -1, 2, slice(1, 3), slice(None, None, 2), (0, 1), (slice(0, 2), 1),
        (1, slice(1, 3), 2), (Ellipsis, 1), (None,), np.int64(1),
        (slice(None), slice(None), slice(1, 4, 2)), 3, -4, [0, 2], np.array([1, 0]), (0, 0, 0)]


@pytest.mark.parametrize('key', range(len(KEYS)))
def test_indexing(both, key):
    values = np.arange(60, dtype=np.float32).reshape(3, 4, 5)
    k = KEYS[key]
    _same(both, lambda mx: mx.nd.array(values)[k], 'get %r' % (k,))

    def set_scalar(mx):
        arr = mx.nd.array(values)
        arr[k] = 7
        return arr
    _same(both, set_scalar, 'set %r' % (k,))


DENSE = np.array([[0, 1.5, -0.0], [0, 0, 0], [-2, 0, np.nan], [0, 0, 4]])


@pytest.mark.parametrize('dtype', DTYPES + ['bf16'])
@pytest.mark.parametrize('stype', ['row_sparse', 'csr'])
def test_tostype_and_back(both, dtype, stype):
    def dense(mx):
        if dtype == 'bf16':
            return mx.nd.array(DENSE).astype(BF16)
        return mx.nd.array(DENSE, dtype=dtype)
    _same(both, lambda mx: dense(mx).tostype(stype), 'tostype')
    _same(both, lambda mx: dense(mx).tostype(stype).tostype('default'), 'and back')
    _same(both, lambda mx: dense(mx).tostype(stype).asnumpy(), 'asnumpy')


@pytest.mark.parametrize('shape', [(2, 3, 4), (5,), (1, 1), (4, 1)])
def test_tostype_csr_shapes(both, shape):
    _same(both, lambda mx: mx.nd.ones(shape).tostype('csr'), str(shape))


def test_bool_to_row_sparse_by_copyto(both):
    def run(mx):
        out = mx.nd.sparse.zeros('row_sparse', (2, 2), dtype='bool')
        mx.nd.array([[1, 0], [0, 0]], dtype='bool').copyto(out)
        return out
    _same(both, run, 'bool copyto')


# --- csr_matrix, retain, csr copies (mxkv had no csr_matrix nor retain, and refused
# every copy of a csr array) ---------------------------------------------------------------
SPARSE_DTYPES = [d for d in DTYPES if d != 'bool']  # (MXNet cannot densify bool ones)
ROWS = np.array([[0, 1.5], [0, 0], [-2, 0], [3, 4]])


def _rsp(mx, dtype):
    return mx.nd.sparse.row_sparse_array(([[1, 2], [3, 4]], [1, 3]), shape=(4, 2), dtype=dtype)


@pytest.mark.parametrize('dtype', SPARSE_DTYPES)
def test_csr_matrix(both, dtype):
    _same(both, lambda mx: mx.nd.sparse.csr_matrix(ROWS.astype(dtype)), 'of numpy')
    _same(both, lambda mx: mx.nd.sparse.csr_matrix(mx.nd.array(ROWS), dtype=dtype), 'of nd')
    _same(both, lambda mx: mx.nd.sparse.csr_matrix(
        ([1, 2, 3], [1, 0, 1], [0, 1, 1, 2, 3]), shape=(4, 2), dtype=dtype), 'of parts')
    _same(both, lambda mx: mx.nd.sparse.csr_matrix(
        ([1, 2, 3], [1, 0, 1], [0, 1, 1, 2, 3]), dtype=dtype), 'of parts, shape inferred')
    _same(both, lambda mx: mx.nd.sparse.csr_matrix((3, 5), dtype=dtype), 'of a shape')
    _same(both, lambda mx: mx.nd.sparse.csr_matrix(
        mx.nd.sparse.csr_matrix(ROWS), dtype=dtype), 'of a csr')


@pytest.mark.parametrize('name,call', [
    ('rsp', lambda mx: mx.nd.sparse.csr_matrix(_rsp(mx, 'float32'))),
    ('3-d', lambda mx: mx.nd.sparse.csr_matrix(np.ones((2, 2, 2)))),
    ('4 parts', lambda mx: mx.nd.sparse.csr_matrix(([1], [0], [0, 1], [0]))),
    ('shape mismatch', lambda mx: mx.nd.sparse.csr_matrix(ROWS, shape=(2, 4))),
    ('2-d data', lambda mx: mx.nd.sparse.csr_matrix(([[1]], [0], [0, 1]), shape=(1, 1))),
    ('no indices, no shape', lambda mx: mx.nd.sparse.csr_matrix(([], [], [0]))),
])
def test_csr_matrix_refusals(both, name, call):
    _same(both, call, name)


@pytest.mark.parametrize('dtype', SPARSE_DTYPES)
@pytest.mark.parametrize('rows', [[1, 3], [0], [], [3, 1], [2], [0, 3, 3]])
def test_retain(both, dtype, rows):
    _same(both, lambda mx: mx.nd.sparse.retain(_rsp(mx, dtype), mx.nd.array(rows, dtype='int64')),
          'retain %s' % rows)


def test_retain_float_indices_and_dense_data(both):
    _same(both, lambda mx: mx.nd.sparse.retain(_rsp(mx, 'float32'), mx.nd.array([1.7, 3])),
          'float indices')
    _same(both, lambda mx: mx.nd.sparse.retain(mx.nd.ones((4, 2)), mx.nd.array([1])), 'dense')


@pytest.mark.parametrize('dtype', SPARSE_DTYPES)
def test_csr_copies(both, dtype):
    def csr(mx):
        return mx.nd.array(ROWS).tostype('csr')
    _same(both, lambda mx: csr(mx).astype(dtype), 'astype')
    _same(both, lambda mx: csr(mx).copy(), 'copy')
    _same(both, lambda mx: csr(mx).copyto(mx.cpu(1)), 'copyto a context')

    def into_csr(mx):
        out = mx.nd.sparse.zeros('csr', (4, 2), dtype=dtype)
        csr(mx).copyto(out)
        return out
    _same(both, into_csr, 'copyto csr')

    def into_dense(mx):
        out = mx.nd.zeros((4, 2))
        csr(mx).copyto(out)
        return out
    _same(both, into_dense, 'copyto dense')
    _same(both, lambda mx: csr(mx).copyto(mx.nd.zeros((2, 4))), 'copyto another shape')
    _same(both, lambda mx: csr(mx).tostype('row_sparse'), 'tostype row_sparse')


CSR_KEYS = [slice(1, 3), 1, 0, -1, -2, 3, 5, -5, slice(None), slice(-2, None), slice(1, 10),
            slice(3, 1), slice(2, 2), slice(0, 0), slice(None, 0), slice(0, -1),
            slice(1, 3, 1), slice(0, 4, 2), (1,), np.int64(1), [0, 1]]


@pytest.mark.parametrize('key', range(len(CSR_KEYS)))
def test_csr_rows(both, key):
    """(MXNet cannot densify a csr array of no rows: the parts are compared)"""
    k = CSR_KEYS[key]

    def rows(mx):
        res = mx.nd.array(ROWS).tostype('csr')[k]
        return [type(res).__name__, res.shape, res.data, res.indptr, res.indices]
    _same(both, lambda mx: [_result(x, mx) for x in rows(mx)], 'csr[%r]' % (k,))


def test_csr_rows_from_before_the_first(both):
    """MXNet gives csr[-10:2] (shape (2, 2)) wrong parts (offsets of no stored value, or
    garbage read from outside its buffers, which sometimes kills it with SIGSEGV, so it
    runs in a child process): refused"""
    import subprocess
    import sys
    _, mxkv = both
    code = ('import numpy as np, mxnet as mx\n'
            'got = mx.nd.array(np.array(%r)).tostype("csr")[-10:2]\n'
            'print(got.shape == (2, 2) and got.asnumpy().tobytes() != '
            'np.array(%r)[:2].astype("f4").tobytes())\n' % (ROWS.tolist(), ROWS.tolist()))
    child = subprocess.run([sys.executable, '-c', code], capture_output=True, timeout=120)
    # wrong values, or a crash reading outside its buffers (an exit by a signal)
    assert (child.returncode == 0 and child.stdout.split()[-1:] == [b'True']) or \
        child.returncode < 0, (child.returncode, child.stdout[-300:], child.stderr[-500:])
    with pytest.raises(mxkv.base.MXNetError, match='wrong values'):
        mxkv.nd.array(ROWS).tostype('csr')[-10:2]
    assert mxkv.nd.array(ROWS).tostype('csr')[-10:-7].shape == (0, 2)


# --- integer divisions MXNet dies of (SIGFPE): mxkv raises (it gave 0, or INT_MIN) -------
SIGFPE_CASES = {
    'int32 / 0': "mx.nd.array([1, 2], dtype='int32') / 0",
    'int64 /= 0.5': "a = mx.nd.array([1, 2], dtype='int64'); a /= 0.5",
    'uint8 / 1e10': "mx.nd.array([1, 250], dtype='uint8') / 1e10",
    'int8 / nan': "mx.nd.array([1, 2], dtype='int8') / float('nan')",
    'int32 / int32 with a zero': "mx.nd.array([4, 2], dtype='int32') / "
                                 "mx.nd.array([2, 0], dtype='int32')",
    'INT_MIN / -1 int32': "mx.nd.array([-2**31, 4], dtype='int32') / -1",
    'INT64_MIN / -1': "mx.nd.array(np.array([-2**63], np.int64), dtype='int64') / "
                      "mx.nd.array(np.array([-1], np.int64), dtype='int64')",
}


@pytest.mark.parametrize('name', sorted(SIGFPE_CASES))
def test_integer_divisions_mxnet_dies_of_raise(mxkv, name):
    import signal
    import subprocess
    import sys
    code = 'import numpy as np, mxnet as mx\n%s\nmx.nd.waitall()\n' % SIGFPE_CASES[name]
    died = subprocess.run([sys.executable, '-c', code], capture_output=True, timeout=120)
    assert died.returncode == -signal.SIGFPE, (died.returncode, died.stderr[-500:])
    with pytest.raises(mxkv.base.MXNetError, match='SIGFPE'):
        exec(SIGFPE_CASES[name], {'mx': mxkv, 'np': np})  # pylint: disable=exec-used


def test_integer_divisions_that_do_not_trap(both):
    """8-bit values are divided as int (no overflow), numbers / arrays in float32"""
    _same(both, lambda mx: mx.nd.array([-128, 7], dtype='int8') / -1, 'INT8_MIN / -1')
    _same(both, lambda mx: 5 / mx.nd.array([0, 2], dtype='int32'), '5 / int32 with a zero')
    _same(both, lambda mx: mx.nd.array([7, -7], dtype='int32') / 1.5, 'int32 / 1.5 (as 1)')
