"""NDArray.sum / nd.sum against real MXNet 1.9.1, bit for bit.

MXNet's CPU sum gives each output element one sequential Kahan reduction in the element
type (src/operator/tensor/broadcast_reduce-inl.h, seq_reduce_assign with mshadow's
red::sum), so the bits depend on the order and on the rounding of every step.  The data
here is chosen to expose any other order: wide dynamic ranges and sizes up to 1e6, and
each float case first checks that a plain sequential sum and numpy's pairwise sum give
other bits than MXNet's (so a test passing is not an accident of easy data).
"""
import numpy as np
import pytest

from conftest import assert_same_bits

BF16 = np.dtype([('bfloat16', np.uint16)])
FLOATS = ('float32', 'float16', 'float64', 'bf16')


def _values(dtype, size, seed, spread=None):
    """`size` values of `dtype` ('bf16': float32 values to convert), floats spread over
    many binades (magnitudes e**-spread .. e**spread) and of both signs"""
    rng = np.random.RandomState(seed)
    if dtype in FLOATS:
        spread = spread or {'float16': 6, 'bf16': 20, 'float32': 25, 'float64': 60}[dtype]
        vals = rng.randn(size) * np.exp(rng.uniform(-spread, spread, size))
        return vals.astype('float32' if dtype == 'bf16' else dtype)
    if dtype == 'bool':
        return rng.rand(size) < 0.3
    info = np.iinfo(dtype)
    return rng.randint(info.min, info.max + 1, size, dtype=dtype)


def _array(mx, values, dtype):
    if dtype == 'bf16':
        return mx.nd.array(values).astype(BF16)
    return mx.nd.array(values, dtype=dtype)


def _result(res):
    arr = res.asnumpy()
    if arr.dtype == BF16:
        arr = arr.view(np.uint16)
    return {'class': type(res).__name__, 'dtype': arr.dtype.str, 'shape': arr.shape,
            'bits': np.ascontiguousarray(arr).tobytes()}


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


def _other_orders(values, dtype):
    """bits of a plain sequential sum and of numpy's pairwise sum, in the element type"""
    if dtype == 'bf16':  # (as float32: the orders differ there already)
        values = values.astype(np.float32)
    with np.errstate(all='ignore'):
        seq = np.add.accumulate(values)[-1]
        pairwise = values.sum(dtype=values.dtype)
    if dtype == 'bf16':
        seq, pairwise = [np.float32(v).view(np.uint32) >> 16 for v in (seq, pairwise)]
        return [np.uint16(seq).tobytes(), np.uint16(pairwise).tobytes()]
    return [seq.tobytes(), pairwise.tobytes()]


# --- whole-array sums: one chain of up to a million steps -------------------------------
@pytest.mark.parametrize('dtype,size', [('float32', 10 ** 6), ('float32', 4097),
                                        ('float64', 10 ** 6), ('float16', 200000),
                                        ('bf16', 200000), ('float16', 4097)])
def test_whole_sum_bits(both, dtype, size):
    values = _values(dtype, size, seed=size)
    expected = _same(both, lambda mx: _array(mx, values, dtype).sum(), '%s[%d]' % (dtype, size))
    for other in _other_orders(values, dtype):  # the data tells the orders apart
        assert other != expected['bits'], (dtype, size)


@pytest.mark.parametrize('dtype', ['int8', 'uint8', 'int32', 'int64', 'bool'])
def test_integer_sums_wrap(both, dtype):
    values = _values(dtype, 10 ** 6, seed=7)
    _same(both, lambda mx: _array(mx, values, dtype).sum(), dtype)
    _same(both, lambda mx: _array(mx, values.reshape(1000, 1000), dtype).sum(axis=1), dtype)


@pytest.mark.parametrize('dtype', ['int16', 'uint16', 'uint32', 'uint64'])
def test_integer_sums_wrap_mxkv_only(mxkv, dtype):
    """dtypes MXNet 1.9.1's frontend has no name for (its sum wraps as for the others)"""
    if not getattr(mxkv.base._LIB, '_mxkv_synchronous', False):
        pytest.skip('libmxnet.so has no %s arrays (Unknown type enum)' % dtype)
    values = _values(dtype, 10 ** 5, seed=8)
    expected = np.add.accumulate(values.astype(np.uint64)).astype(dtype)[-1]
    got = mxkv.nd.array(values, dtype=dtype).sum().asnumpy()
    assert got.dtype == values.dtype and got.tobytes() == expected.tobytes()
    info = np.iinfo(dtype)
    assert not info.min <= sum(int(v) for v in values) <= info.max  # it did wrap


def test_float16_overflow_and_cancellation(both):
    """float16 partial sums overflow (and reset the residual) where a wider accumulator
    would not; a later cancellation cannot bring them back"""
    values = np.array([60000, 60000, -60000, -60000, 1, 2, 0.5] * 50, np.float16)
    _same(both, lambda mx: mx.nd.array(values, dtype='float16').sum(), 'f16 overflow')
    rows = np.tile(values[:, None], (1, 40))
    _same(both, lambda mx: mx.nd.array(rows, dtype='float16').sum(axis=0), 'f16 overflow lanes')


# --- axis sums: many chains side by side or a few long ones -----------------------------
AXIS_CASES = [
    ((300, 200), {'axis': 0}), ((300, 200), {'axis': 1}), ((300, 200), {'axis': -1}),
    ((5, 20000), {'axis': 1}),                    # few long chains
    ((20000, 5), {'axis': 0}),                    # few long chains, strided
    ((3, 40, 500), {'axis': (0, 2)}),             # the chain runs over two axes
    ((3, 40, 500), {'axis': (2, 0), 'keepdims': True}),
    ((3, 40, 500), {'axis': 1, 'exclude': True}),
    ((3, 40, 500), {'axis': 1, 'exclude': True, 'keepdims': True}),
    ((60, 1, 70), {'axis': 1}),                   # one element per chain: 0 + x
    ((60, 70), {'axis': ()}), ((60, 70), {'axis': None, 'keepdims': True}),
    ((6, 7, 8), {'axis': (0, 1, 2), 'exclude': True}),
]


@pytest.mark.parametrize('dtype', FLOATS)
@pytest.mark.parametrize('case', range(len(AXIS_CASES)))
def test_axis_sum_bits(both, dtype, case):
    shape, kwargs = AXIS_CASES[case]
    values = _values(dtype, int(np.prod(shape)), seed=case).reshape(shape)
    _same(both, lambda mx: _array(mx, values, dtype).sum(**kwargs),
          '%s%s.sum(%s)' % (dtype, shape, kwargs))


# --- infinities and NaNs: an infinite t resets the residual (not for bfloat16, whose
# IsInf is always false: 1 + inf + 2 is NaN there); NaN bits pass through as on x86 ----
def _special(dtype):
    nan1 = np.array([0x7fc00001, 0xffc12345], np.uint32).view(np.float32)
    base = np.array([1.5, np.inf, 2.0, -3.0, np.nan, 4.0, -np.inf, 1e-3, nan1[0], nan1[1],
                     3e38, 3e38, -1.0, 65000.0, 65000.0, -0.0], np.float32)
    return base if dtype in ('float32', 'bf16') else base.astype(dtype)


SPECIAL_PICKS = {
    'inf then finite': [0, 1, 2, 3], 'inf - inf': [1, 3, 6, 0], 'nan': [0, 4, 5],
    'nan payloads': [8, 0, 9, 4], 'negative nan first': [9, 8], 'overflow': [10, 11, 12, 0],
    'f16 overflow': [13, 14, 12, 0], 'inf and nan': [1, 9], 'negative zeros': [15, 15],
}


@pytest.mark.parametrize('dtype', FLOATS)
@pytest.mark.parametrize('pick', sorted(SPECIAL_PICKS))
def test_non_finite_sums(both, dtype, pick):
    values = _special(dtype)[SPECIAL_PICKS[pick]]
    _same(both, lambda mx: _array(mx, values, dtype).sum(), '%s %s' % (dtype, pick))
    lanes = np.tile(values[:, None], (1, 40))  # the same chain in 40 columns at once
    lanes[:, 1::2] = values[::-1, None]
    _same(both, lambda mx: _array(mx, lanes, dtype).sum(axis=0), '%s %s lanes' % (dtype, pick))


# --- parameters, out, functions ---------------------------------------------------------
PARAMS = {
    'axis 3': {'axis': 3}, 'axis -4': {'axis': -4}, 'dup axes': {'axis': (1, 1)},
    'dup negative': {'axis': (1, -2)}, 'float axis': {'axis': 1.0}, 'bool axis': {'axis': True},
    'list axis': {'axis': [2]}, 'numpy axis': {'axis': np.int64(1)},
    'keepdims 1': {'keepdims': 1}, "keepdims 'x'": {'keepdims': 'x'},
    'exclude 0': {'axis': 1, 'exclude': 0}, 'exclude 2': {'axis': 1, 'exclude': 2},
}


@pytest.mark.parametrize('name', sorted(PARAMS))
def test_sum_parameters(both, name):
    values = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    _same(both, lambda mx: mx.nd.array(values).sum(**PARAMS[name]), name)


def _with_out(mx, shape, dtype='float32'):
    out = mx.nd.ones(shape, dtype=dtype)
    res = mx.nd.array(np.arange(24).reshape(2, 3, 4)).sum(axis=1, out=out)
    assert res is out
    return out


CALLS = {
    'out': lambda mx: _with_out(mx, (2, 4)),
    'out of another shape': lambda mx: _with_out(mx, (2, 5)),
    'out of another dtype': lambda mx: _with_out(mx, (2, 4), 'float64'),
    'positional': lambda mx: mx.nd.array(np.arange(24).reshape(2, 3, 4)).sum(1, True),
    'nd.sum': lambda mx: mx.nd.sum(mx.nd.array(np.arange(24).reshape(2, 3, 4)), axis=0),
    'nd.sum_axis': lambda mx: mx.nd.sum_axis(mx.nd.array(np.arange(6).reshape(2, 3)), axis=1),
    'row_sparse axis 0': lambda mx: mx.nd.sparse.row_sparse_array(
        ([[1.5, -2.0], [3.0, 0.25]], [1, 3]), shape=(4, 2)).sum(axis=0),
    'row_sparse keepdims': lambda mx: mx.nd.sparse.row_sparse_array(
        ([[1.5, -2.0], [3.0, 0.25]], [1, 3]), shape=(4, 2)).sum(axis=1, keepdims=True),
}


@pytest.mark.parametrize('name', sorted(CALLS))
def test_sum_calls(both, name):
    _same(both, CALLS[name], name)


# --- sums whose steps never round (integers, masks): the partial sums are taken from a
# cumulative sum and checked step by step against the kernel; data that rounds somewhere
# (past 2**24 in float32, a fraction late in the array) must still give MXNet's bits
def _unrounded_cases():
    rng = np.random.RandomState(3)
    mask = (rng.rand(10 ** 6) < 0.5).astype(np.float32)
    small = rng.randint(-50, 50, 10 ** 6).astype(np.float32)
    grows = np.full(10 ** 6, 100.0, np.float32)          # passes 2**24 after 167773 steps
    late = small.copy()
    late[-3] = 0.1                                         # rounds only near the end
    zeros = np.array([-0.0] * 2000 + [1.0, -1.0, -0.0], np.float32)
    halves = (rng.randint(-8, 8, 4000) / 8.0).astype(np.float32)
    return {'mask': (mask, True), 'small ints': (small, True), 'past 2**24': (grows, False),
            'late fraction': (late, False), 'negative zeros': (zeros, True),
            'eighths': (halves, True)}


UNROUNDED = _unrounded_cases()


@pytest.mark.parametrize('dtype', FLOATS)
@pytest.mark.parametrize('name', sorted(UNROUNDED))
def test_unrounded_sums(both, dtype, name):
    values, _ = UNROUNDED[name]
    if dtype == 'float16':
        values = values[:20000]
    source = values if dtype == 'bf16' else values.astype(dtype)
    _same(both, lambda mx: _array(mx, source, dtype).sum(), '%s %s' % (dtype, name))
    _same(both, lambda mx: _array(mx, source[:6000].reshape(-1, 3), dtype).sum(axis=0),
          '%s %s in 3 columns' % (dtype, name))


def test_unrounded_path_is_taken_only_where_exact():
    from mxkv.ndarray._reduce import _unrounded_sums
    names = sorted(UNROUNDED)
    for name in names:
        values, exact = UNROUNDED[name]
        sums, found = _unrounded_sums(values[:, None], False)
        assert found.tolist() == [exact], name
        if exact:
            assert sums[0] == float(np.sum(values.astype(np.float64))), name
    # the same data side by side in columns (cut to one length): each column as alone
    size = min(len(UNROUNDED[name][0]) for name in names)
    columns = np.stack([UNROUNDED[name][0][-size:] for name in names], axis=1)
    sums, found = _unrounded_sums(columns, False)
    for j in range(len(names)):
        alone = _unrounded_sums(columns[:, j:j + 1].copy(), False)
        assert (found[j], sums[j] if found[j] else None) == \
            (alone[1][0], alone[0][0] if alone[1][0] else None), names[j]
    assert 0 < found.sum() < len(names)


def test_axis_sum_of_many_rows_and_columns(both):
    """a one-hot matrix summed over its rows (class counts): no step rounds, and the
    columns that do round (a fraction in one) still run the kernel's chain"""
    rng = np.random.RandomState(4)
    onehot = np.eye(40, dtype=np.float32)[rng.randint(0, 40, 200000)]
    onehot[123456, 7] = 0.1
    onehot[5, 30] = np.nan
    _same(both, lambda mx: mx.nd.array(onehot).sum(axis=0), 'one-hot counts')


# --- hard chains: subnormal partial sums, alternating huge values (|y| > |s| at every
# step: no Fast2Sum shortcut), cancellation to near zero, partial sums near the maximum
def _hard_cases():
    rng = np.random.RandomState(0)
    return {
        'subnormals': rng.randn(100000) * 1e-39,
        'subnormals and small': np.concatenate([rng.randn(50000) * 1e-39,
                                                rng.randn(50000) * 1e-30]),
        'alternating': np.where(np.arange(100000) % 2, 1, -1) * (1e20 + rng.randn(100000) * 1e15),
        'cancellation': np.concatenate([rng.randn(50000) * 1e10, -rng.randn(50000) * 1e10,
                                        rng.randn(1000)]),
        'near the maximum': rng.rand(1000) * 3e37,
        'tiny and huge': np.array([1e-45, 3e38, -3e38, 1e-45, 2e-45] * 1000),
    }


HARD = _hard_cases()


@pytest.mark.parametrize('dtype', ['float32', 'float64', 'float16'])
@pytest.mark.parametrize('name', sorted(HARD))
def test_hard_chains(both, dtype, name):
    with np.errstate(all='ignore'):
        values = HARD[name].astype(dtype)
    _same(both, lambda mx: mx.nd.array(values, dtype=dtype).sum(), '%s %s' % (dtype, name))
    _same(both, lambda mx: mx.nd.array(values.reshape(-1, 50), dtype=dtype).sum(axis=0),
          '%s %s lanes' % (dtype, name))
