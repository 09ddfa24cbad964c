"""NDArray frontend parity with real MXNet 1.9.1 (differential: every scenario runs on
``mxnet`` and on ``mxkv`` and the outcomes must be equal bit for bit).

An outcome is the result's class, dtype, shape and bytes, or, when the call raises, the
kind of exception: ``AssertionError`` (mxkv's ``MXKVUsageError`` is one), else
``MXNetError`` for any subclass of the frontend's ``MXNetError``, else the exception's
class name.  Messages are not compared.

What MXNet does, per group:

* out-of-range parameters: dmlc-core's ``stof``/``stod`` throw ``std::out_of_range`` for
  an exponent beyond 38 (``float`` fields: ``lr``, ``epsilon``, ``a_min`` ...) or 308
  (``double`` fields: the ``scalar`` of ``_mul_scalar`` ..., the ``value`` of ``_full``),
  so ``nd.ones(2) * 1e-320`` and ``Adam(epsilon=1e-40)`` raise ``MXNetError``
  ("Out of range value for ...") instead of computing with infinity.
"""
import numpy as np
import pytest

from conftest import assert_same_bits


def outcome(mx, fn):
    """what must match between mxnet and mxkv (see the module docstring); MXNet reports
    some errors at the next read (asnumpy), so that is inside the try too"""
    try:
        res = fn(mx)
        if hasattr(res, 'asnumpy'):
            arr = res.asnumpy()
            return ('nd', type(res).__name__, res.stype, arr.dtype.str, arr.shape,
                    np.ascontiguousarray(arr).tobytes())
    except Exception as exc:  # pylint: disable=broad-except
        if isinstance(exc, AssertionError):
            return ('raise', 'AssertionError')
        names = [c.__name__ for c in type(exc).__mro__]
        return ('raise', 'MXNetError' if 'MXNetError' in names else type(exc).__name__)
    if isinstance(res, np.ndarray):
        return ('np', res.dtype.str, res.shape, np.ascontiguousarray(res).tobytes())
    return ('value', res)


def run_both(both, fn, what):
    mxnet, mxkv = both
    expected = outcome(mxnet, fn)
    got = outcome(mxkv, fn)
    assert_same_bits(repr(expected), repr(got), what)
    return got


def _assign(arr, key, value):
    arr[key] = value
    return arr


def _update(mx, opt, dtype='float32'):
    upd = mx.optimizer.get_updater(opt)
    weight = mx.nd.array([1.0, 2.0], dtype=dtype)
    upd(0, mx.nd.array([0.5, -0.5], dtype=dtype), weight)
    return weight


# --- 1. out-of-range parameters -------------------------------------------------------
RANGE = {
    'adam eps=1e-40': lambda mx: _update(mx, mx.optimizer.Adam(epsilon=1e-40)),
    'adam lr=1e-39': lambda mx: _update(mx, mx.optimizer.Adam(learning_rate=1e-39)),
    'adam eps=1e-38': lambda mx: _update(mx, mx.optimizer.Adam(epsilon=1e-38)),
    'adam eps=1.2e-38': lambda mx: _update(mx, mx.optimizer.Adam(epsilon=1.2e-38)),
    'nag lr=1e-39': lambda mx: _update(mx, mx.optimizer.NAG(learning_rate=1e-39, momentum=0.9)),
    'rmsprop eps=1e-39': lambda mx: _update(mx, mx.optimizer.RMSProp(epsilon=1e-39)),
    'signum lr=1e-39': lambda mx: _update(mx, mx.optimizer.Signum(learning_rate=1e-39)),
    'sgd rescale=1e-39': lambda mx: _update(mx, mx.optimizer.SGD(learning_rate=0.1,
                                                                  rescale_grad=1e-39)),
    'sgd clip=1e-39': lambda mx: _update(mx, mx.optimizer.SGD(learning_rate=0.1, momentum=0.9,
                                                               clip_gradient=1e-39)),
    'sgd clip=1e39': lambda mx: _update(mx, mx.optimizer.SGD(learning_rate=0.1, momentum=0.9,
                                                              clip_gradient=1e39)),
    'sgd lr=1e-39 (Tuple<float>)': lambda mx: _update(mx, mx.optimizer.SGD(learning_rate=1e-39)),
    'f32 * 1e-39': lambda mx: mx.nd.ones((2,)) * 1e-39,
    'f32 * 1e-320': lambda mx: mx.nd.ones((2,)) * 1e-320,
    'f32 + -1e-320': lambda mx: mx.nd.ones((2,)) + -1e-320,
    'f32 * 1e+309 literal': lambda mx: mx.nd.ones((2,)) * float('inf'),
    'f64 * 1e-308': lambda mx: mx.nd.ones((2,), dtype='float64') * 1e-308,
    'f64 * 2.3e-308': lambda mx: mx.nd.ones((2,), dtype='float64') * 2.3e-308,
    'f64 * 1.7976931348623157e308': lambda mx: mx.nd.ones((2,), dtype='float64')
    * 1.7976931348623157e308,
    'f32 [:]=1e-39': lambda mx: _assign(mx.nd.ones((2,)), slice(None), 1e-39),
    'f32 [:]=1e-320': lambda mx: _assign(mx.nd.ones((2,)), slice(None), 1e-320),
    'i32 [:]=1e-320': lambda mx: _assign(mx.nd.ones((2,), dtype='int32'), slice(None), 1e-320),
    'full 1e-320': lambda mx: mx.nd.full((2,), 1e-320),
    'clip 1e-39': lambda mx: mx.nd.clip(mx.nd.array([1.0, -1.0]), -1e-39, 1e-39),
    'clip 1e-38': lambda mx: mx.nd.clip(mx.nd.array([1.0, -1.0]), -1e-38, 1e-38),
}


@pytest.mark.parametrize('name', sorted(RANGE))
def test_out_of_range_parameters(both, name):
    run_both(both, RANGE[name], name)


def test_out_of_range_parameter_message(mxkv):
    with pytest.raises(mxkv.base.MXNetError, match=r"Out of range value for scalar, "
                                                    r"value='1e-320'"):
        mxkv.nd.ones((2,)) * 1e-320


# --- 2. bfloat16 values ----------------------------------------------------------------
# MXNet's bf16_t keeps the high half of static_cast<float>(value) (truncation: no rounding,
# NaN payloads kept, so 0x7f800001 becomes infinity); reading widens to float32.  Arrays
# hold the raw bits; numpy sources of nd.array / a[:] = ... are taken as raw bits (MXNet's
# frontend converts them with numpy to the structured uint16 dtype).
BF16 = np.dtype([('bfloat16', np.uint16)])
F32_EDGE = np.concatenate([
    np.array([1.0, 1.00390625, 1.01171875, -0.5, np.nan, -np.nan, np.inf, -np.inf, 3.4e38,
              3.39e38, 1e-40, -1e-45, 0.0, -0.0, 300.0, -2.5, 1e10, -1e10, 255.5, 256.0],
             dtype=np.float32),
    np.array([0x7f800001, 0xffc00001, 0x7fbfffff, 0x7f7fffff], np.uint32).view(np.float32)])
SOURCES = {
    'float64': np.array([1 + 2 ** -7 - 2 ** -30, 1 + 2 ** -8, 1e300, np.nan, -3.75]),
    'float16': np.array([1.0, 65504, np.nan, 3.01171875, -0.0]),
    'int32': np.array([257, 259, -257, 2 ** 31 - 1, -2 ** 31, 16777217]),
    'int64': np.array([2 ** 62 + 2 ** 40, 16777217 + 2 ** 30, -7]),
    'uint8': np.array([255, 3, 0]),
    'int8': np.array([-128, 127, 5]),
    'bool': np.array([1, 0, 1]),
}


def _bits(arr):
    return arr.asnumpy().view(np.uint16)


BFLOAT16 = {
    'ones': lambda mx: _bits(mx.nd.ones((3,), dtype=BF16)),
    'zeros': lambda mx: _bits(mx.nd.zeros((3,), dtype=BF16)),
    'float32 astype': lambda mx: _bits(mx.nd.array(F32_EDGE).astype(BF16)),
    'float32 copyto': lambda mx: _bits(mx.nd.array(F32_EDGE).copyto(
        mx.nd.zeros(F32_EDGE.shape, dtype=BF16))),
    'float32 [:]= NDArray': lambda mx: _bits(_assign(mx.nd.zeros(F32_EDGE.shape, dtype=BF16),
                                                     slice(None), mx.nd.array(F32_EDGE))),
    'float32 [1:]= NDArray': lambda mx: _bits(_assign(
        mx.nd.zeros(F32_EDGE.shape, dtype=BF16), slice(1, None), mx.nd.array(F32_EDGE[1:]))),
    'float32 round trip': lambda mx: mx.nd.array(F32_EDGE).astype(BF16).astype('float32'),
    'full 1+2^-7-2^-30': lambda mx: _bits(mx.nd.full((2,), 1 + 2 ** -7 - 2 ** -30, dtype=BF16)),
    'full 3.3': lambda mx: _bits(mx.nd.full((2,), 3.3, dtype=BF16)),
    'full nan': lambda mx: _bits(mx.nd.full((2,), float('nan'), dtype=BF16)),
    '[:]= 2.5': lambda mx: _bits(_assign(mx.nd.zeros((3,), dtype=BF16), slice(None), 2.5)),
    '[1]= 3.3': lambda mx: _bits(_assign(mx.nd.zeros((3,), dtype=BF16), 1, 3.3)),
    '[1:]= -1e30': lambda mx: _bits(_assign(mx.nd.zeros((3,), dtype=BF16), slice(1, None),
                                            -1e30)),
    '[:]= numpy (raw bits)': lambda mx: _bits(_assign(mx.nd.zeros((3,), dtype=BF16),
                                                      slice(None), np.array([1., 2., 3.]))),
    '[:]= list (raw bits)': lambda mx: _bits(_assign(mx.nd.zeros((3,), dtype=BF16),
                                                     slice(None), [2.5, 3, 1])),
    'array numpy (raw bits)': lambda mx: _bits(mx.nd.array(np.array([1.0, 2.0]), dtype=BF16)),
    'bfloat16 -> float32 [1:]': lambda mx: _assign(mx.nd.zeros((3,)), slice(1, None),
                                                   mx.nd.array([3.0, 1.01171875]).astype(BF16)),
}
for _src, _vals in SOURCES.items():
    BFLOAT16['%s astype' % _src] = (lambda v, t: lambda mx: _bits(
        mx.nd.array(v, dtype=t).astype(BF16)))(_vals, _src)
for _dst in ('float64', 'float16', 'int32', 'int64', 'int8', 'uint8', 'bool'):
    BFLOAT16['to %s' % _dst] = (lambda t: lambda mx: mx.nd.array(F32_EDGE).astype(BF16)
                                .astype(t))(_dst)


@pytest.mark.parametrize('name', sorted(BFLOAT16))
def test_bfloat16_values(both, name):
    run_both(both, BFLOAT16[name], name)


# --- 3. reshape: MXNet's special values and reverse --------------------------------------
# (source shape, positional args, keyword args); MXNet's frontend raises ValueError when
# the size changes, MXNDArrayReshape64 MXNetError when its checks fail or the target is
# larger than the source.
RESHAPES = [
    ((2, 3, 4), [(0, -1)], {}), ((2, 3, 4), [(-2,)], {}), ((2, 3, 4), [(6, -2)], {}),
    ((2, 3, 4), [(-3, 4)], {}), ((2, 3, 4), [(2, -3)], {}), ((2, 3, 4), [(-4, 1, 2, -2)], {}),
    ((2, 3, 4), [(0, 0, -1)], {}), ((2, 3, 4), [(4, 0, 2)], {}), ((2, 3, 4), [(-1, 0)], {}),
    ((2, 3, 4), [(2, 3)], {}), ((2, 3, 4), [(5, -1)], {}), ((2, 3, 4), [(-5, 2)], {}),
    ((2, 3, 4), [(0, 0, 0, 0)], {}), ((2, 3, 4), [(-3, -3)], {}), ((2, 3, 4), [(-3, -2)], {}),
    ((2, 3, 4), [(-2, -3)], {}), ((2, 3, 4), [(-4, -1, 2, -2)], {}),
    ((2, 3, 4), [(-4, 2, -1, -2)], {}), ((2, 3, 4), [(-4, -1, -1, -2)], {}),
    ((2, 3, 4), [(-4, 3, 2, -2)], {}), ((2, 3, 4), [(-4, 1)], {}),
    ((2, 3, 4), [(2, -4, 3, 1, 4)], {}), ((2, 3, 4), [(-4, -1, -2, -2)], {}),
    ((2, 3, 4), [(-1, -1)], {}), ((2, 3, 4), [(-1,)], {}), ((2, 3, 4), [(24,)], {}),
    ((2, 3, 4), [(25,)], {}), ((2, 3, 4), [(0, -1)], {'reverse': True}),
    ((2, 3, 4), [(-1, 0)], {'reverse': True}), ((2, 3, 4), [(-3, 0)], {'reverse': True}),
    ((2, 3, 4), [(0, -3)], {'reverse': True}), ((2, 3, 4), [(-4, 2, 2, 0, 0)], {'reverse': True}),
    ((2, 3, 4), [(0, 0, -4, 2, 2)], {'reverse': True}), ((2, 3, 4), [(0, -4, 3, -1, 0)],
                                                          {'reverse': True}),
    ((2, 3, 4), [(-2, 1)], {}), ((2, 3, 4), [(1, -2)], {}), ((2, 3, 4), [(1, -2, 1)], {}),
    ((2, 3, 4), [(-2, -2)], {}), ((2, 3, 4), [(2, 12)], {}), ((2, 3, 4), [2, 12], {}),
    ((2, 3, 4), [], {'shape': (4, 6)}), ((2, 3, 4), [], {'shape': (4, 0), 'reverse': True}),
    ((2, 3, 4), [], {}), ((2, 3, 4), [()], {}), ((2, 3, 4), [(2, 12)], {'foo': 1}),
    ((0, 3), [(-1,)], {}), ((0, 3), [(-1, 0)], {}), ((0, 3), [(3, 0)], {}), ((4,), [(-1, 0)], {}),
    ((2, 3, 4), [(2, 3, 4, 1, 1)], {}), ((2, 3, 4), [(0, 3, 4, 0)], {}),
    ((2, 3, 4), [(-1, 5)], {}), ((2, 3, 4), [(np.int64(4), 6)], {}), ((2, 3, 4), [[4, 6]], {}),
    ((2, 3, 4), [(4.0, 6)], {}), ((2, 3, 4), [(True, 24)], {}), ((2, 3, 4), [(-4, 2, 1, 12)], {}),
    ((2, 3, 4), [(-4, 0, 2, 12)], {}), ((2, 3, 4), [(-4, 2, 0, 12)], {}), ((2, 3, 4), [(-3,)], {}),
    ((2, 3, 4), [(0, -3, -3)], {}), ((2, 3, 4), [(2 ** 33, 3)], {}),
    ((2, 3, 4), [(-1, 2 ** 33)], {}),
]


def _reshape(mx, shape, args, kwargs):
    src = mx.nd.array(np.arange(int(np.prod(shape))).reshape(shape))
    return src.reshape(*args, **kwargs)


@pytest.mark.parametrize('case', RESHAPES, ids=repr)
def test_reshape_special_values(both, case):
    run_both(both, lambda mx: _reshape(mx, *case), repr(case))


@pytest.mark.parametrize('case', [((0, 3), [(0, -1)], {}), ((2, 3, 4), [(-4, -1, 0, 12)], {}),
                                  ((2, 3, 4), [(-4, 0, -1, -2)], {})], ids=repr)
def test_reshape_division_by_zero_raises(mxkv, case):
    """MXNet divides by zero (SIGFPE, the process dies); mxkv raises"""
    with pytest.raises(mxkv.base.MXNetError, match='zero'):
        _reshape(mxkv, *case)


# --- 4. indexing keys ------------------------------------------------------------------
# MXNet's legacy indexing turns index arrays into int32 arrays (bool arrays count as 0/1,
# floats are truncated), refuses bool NDArrays, empty and 0-d numpy index arrays, and
# scalar keys other than int / numpy.int32 / numpy.int64; a[2:1] and tuple keys selecting
# nothing along a later axis raise MXNetError, writing to an empty region AssertionError.
S = slice
INDEX_KEYS = {
    'np bool': lambda mx: np.array([True, False, True]),
    'np bool all false': lambda mx: np.array([False, False, False]),
    'np bool short': lambda mx: np.array([True, False]),
    'np bool 2d': lambda mx: np.ones((3, 4), bool),
    'list bool': lambda mx: [True, False, True],
    'np float': lambda mx: np.array([0.0, 2.7]),
    'list float': lambda mx: [0.0, 2.0],
    'list mixed': lambda mx: [0, 2.0],
    'nd float': lambda mx: mx.nd.array([0, 2.9]),
    'nd f64': lambda mx: mx.nd.array([0, 2], dtype='float64'),
    'nd f16': lambda mx: mx.nd.array([0, 2], dtype='float16'),
    'nd u8': lambda mx: mx.nd.array([0, 2], dtype='uint8'),
    'nd int32': lambda mx: mx.nd.array([0, 2], dtype='int32'),
    'nd bool': lambda mx: mx.nd.array([1, 0, 1], dtype='bool'),
    'nd 2d': lambda mx: mx.nd.array([[0, 1], [2, 0]]),
    'nd 1 element': lambda mx: mx.nd.array([1]),
    'tuple nd int': lambda mx: (mx.nd.array([0, 2]), 1),
    'tuple nd nd': lambda mx: (mx.nd.array([0, 2]), mx.nd.array([1, 3])),
    'tuple np bool': lambda mx: (np.array([True, False, True]), 1),
    'tuple slice np bool': lambda mx: (S(None), np.array([True, False, True, False])),
    'tuple lists': lambda mx: ([0, 2], [1, 3]),
    'float': lambda mx: 1.0,
    'np.float64': lambda mx: np.float64(1),
    'np.int16': lambda mx: np.int16(1),
    'np.uint8': lambda mx: np.uint8(1),
    'np.int32': lambda mx: np.int32(1),
    'np.int64': lambda mx: np.int64(-1),
    'np.bool_': lambda mx: np.bool_(True),
    'True': lambda mx: True,
    'False': lambda mx: False,
    'tuple True 1': lambda mx: (True, 1),
    'tuple 1 True': lambda mx: (1, True),
    'np 0-d int': lambda mx: np.array(1),
    'str': lambda mx: 'a',
    'list of lists': lambda mx: [[0, 1], [1, 2]],
    'empty list': lambda mx: [],
    'empty np': lambda mx: np.array([], dtype=np.int64),
    'empty np float': lambda mx: np.array([]),
    'None': lambda mx: None,
    'two ellipses': lambda mx: (Ellipsis, Ellipsis),
    'range': lambda mx: range(0, 3, 2),
    'int out of bounds': lambda mx: 3,
    'slice 2:1': lambda mx: S(2, 1),
    'slice 2:1:1': lambda mx: S(2, 1, 1),
    'slice 2:2': lambda mx: S(2, 2),
    'slice 5:6': lambda mx: S(5, 6),
    'slice -1:-2': lambda mx: S(-1, -2),
    'slice 2:1:2': lambda mx: S(2, 1, 2),
    'slice 0:2:-1': lambda mx: S(0, 2, -1),
    'slice float': lambda mx: S(0.0, 2),
    'slice np ints': lambda mx: S(np.int64(0), np.int64(2)),
    '(:, 2:2)': lambda mx: (S(None), S(2, 2)),
    '(:, 3:1)': lambda mx: (S(None), S(3, 1)),
    '(2:1, 0)': lambda mx: (S(2, 1), 0),
    '(1:1, :)': lambda mx: (S(1, 1), S(None)),
    '(0, 2:2)': lambda mx: (0, S(2, 2)),
    '(:, 3:1:2)': lambda mx: (S(None), S(3, 1, 2)),
    '(:, 0:4:-1)': lambda mx: (S(None), S(0, 4, -1)),
    '(:, 2:1:-1)': lambda mx: (S(None), S(2, 1, -1)),
    '(1:1, 0:2)': lambda mx: (S(1, 1), S(0, 2)),
    '(..., None, 1)': lambda mx: (Ellipsis, None, 1),
}


def _index_source(mx):
    return mx.nd.array(np.arange(12).reshape(3, 4))


@pytest.mark.parametrize('name', sorted(INDEX_KEYS))
def test_getitem_keys(both, name):
    run_both(both, lambda mx: _index_source(mx)[INDEX_KEYS[name](mx)], name)


@pytest.mark.parametrize('value', ['scalar', 'nd'])
@pytest.mark.parametrize('name', sorted(INDEX_KEYS))
def test_setitem_keys(both, name, value):
    def scenario(mx):
        arr = _index_source(mx)
        arr[INDEX_KEYS[name](mx)] = -1 if value == 'scalar' else mx.nd.array([-5.0])
        return arr
    run_both(both, scenario, '%s = %s' % (name, value))


@pytest.mark.parametrize('key', [np.array([-1.5]), [-1], (np.array([-1], np.int8),)],
                         ids=repr)
def test_setitem_negative_index_arrays_wrap(mxkv, key):
    """MXNet 1.9.1 scatters to a negative index without wrapping it (writing before the
    buffer: heap corruption, the process aborts later); mxkv wraps it, as reading does"""
    arr = _index_source(mxkv)
    arr[key] = -1
    expected = np.arange(12, dtype=np.float32).reshape(3, 4)
    expected[2] = -1
    assert (arr.asnumpy() == expected).all()
    assert (_index_source(mxkv)[key].asnumpy() == np.arange(8, 12)).all()


@pytest.mark.parametrize('key', [np.array([3.0]), np.array([np.nan], np.float32)], ids=repr)
def test_setitem_out_of_bounds_index_arrays_raise(mxkv, key):
    """MXNet writes out of bounds (3) or to row 0 (NaN: INT_MIN); mxkv raises IndexError,
    as both do when reading"""
    arr = _index_source(mxkv)
    with pytest.raises(IndexError):
        arr[mxkv.nd.array(key)] = -1
    assert (arr.asnumpy() == np.arange(12).reshape(3, 4)).all()


# --- 5. scalars: str(value) for _full, str(float(value)) for scalar operators ----------
# MXNet's frontend sends str(value) to _full (nd.full, a[:] = v, a region covering the
# whole array, the values of an advanced-index write) and str(float(value)) to scalar
# operators (arithmetic, partial slice writes); dmlc parses a double, the kernel casts it
# with C's conversion (NaN/overflow -> INT_MIN), _full writes 0 with memset (-0.0 -> +0.0),
# and str(numpy.bool_(True)) = 'True' is refused by _full.
SCALARS = [np.bool_(True), np.float32('nan'), np.int8(-3), np.float32(0.1), np.float16(0.1),
           np.float32(0.33333334), -0.0, np.float32(-0.0), 0.0, True, False, np.uint64(2 ** 63 + 5),
           np.float32(3e38), float('nan'), float('inf'), -float('inf'), 1e10, -1e10, 300.5,
           -1.5, 2 ** 62 + 1, -2 ** 63, 2 ** 64]
SCALAR_WRITES = {
    'full': lambda mx, dt, v: mx.nd.full((2,), v, dtype=dt),
    '[:]=': lambda mx, dt, v: _assign(_scalar_target(mx, dt), S(None), v),
    '[0:3]=': lambda mx, dt, v: _assign(_scalar_target(mx, dt), S(0, 3), v),
    '[::-1]=': lambda mx, dt, v: _assign(_scalar_target(mx, dt), S(None, None, -1), v),
    '[1:]=': lambda mx, dt, v: _assign(_scalar_target(mx, dt), S(1, None), v),
    '[1]=': lambda mx, dt, v: _assign(_scalar_target(mx, dt), 1, v),
    '[[0,2]]=': lambda mx, dt, v: _assign(_scalar_target(mx, dt), [0, 2], v),
    '+': lambda mx, dt, v: mx.nd.array([1, 2], dtype=dt) + v,
}


def _scalar_target(mx, dtype):
    return mx.nd.array(np.arange(6).reshape(3, 2) + 1, dtype=dtype)


@pytest.mark.parametrize('dtype', ['float32', 'float64', 'float16', 'int32', 'int8', 'uint8',
                                   'int64', 'bool'])
@pytest.mark.parametrize('op', sorted(SCALAR_WRITES))
def test_scalar_conversion(both, op, dtype):
    if op == '+' and dtype == 'bool':
        pytest.skip('MXNet adds to a bool array in int64 (not matched by mxkv)')
    for value in SCALARS:
        run_both(both, lambda mx: SCALAR_WRITES[op](mx, dtype, value),
                 '%s %s %r (%s)' % (dtype, op, value, type(value).__name__))


# --- 6. 0-d arrays -------------------------------------------------------------------------
# nd.array of a scalar or a 0-d numpy array has shape () in MXNet 1.9.1 (its frontend fills
# a (1,) array and reshapes it); a[()] and a[:] are the array, other keys IndexError
# (ValueError for ... and None); writes take a[()] / a[:] and one value.
def _zero_d(mx, value=5.0, dtype=None):
    return mx.nd.array(value, dtype=dtype) if dtype else mx.nd.array(value)


def _zero_d_set(mx, key, value):
    arr = _zero_d(mx)
    arr[key] = value
    return arr


def _kv_zero_d(mx):
    store = mx.kv.create('local')
    store.init(1, _zero_d(mx))
    out = _zero_d(mx, 0.0)
    store.push(1, [_zero_d(mx, 1.0), _zero_d(mx, 2.5)])
    store.pull(1, out=out)
    return out


ZERO_D = {
    'array(5.0)': lambda mx: _zero_d(mx),
    'array(3, int32)': lambda mx: _zero_d(mx, 3, 'int32'),
    'array(True, bool)': lambda mx: _zero_d(mx, True, 'bool'),
    'array(np 0-d)': lambda mx: mx.nd.array(np.array(2.5)),
    'array(np 0-d, float64)': lambda mx: mx.nd.array(np.array(2.5), dtype='float64'),
    'array(np.float32)': lambda mx: mx.nd.array(np.float32(1.5)),
    'shape': lambda mx: _zero_d(mx).shape,
    'ndim': lambda mx: _zero_d(mx).ndim,
    'size': lambda mx: _zero_d(mx).size,
    'asnumpy': lambda mx: _zero_d(mx).asnumpy(),
    'asscalar': lambda mx: _zero_d(mx).asscalar(),
    'bool()': lambda mx: bool(_zero_d(mx)),
    'reshape (1,)': lambda mx: _zero_d(mx).reshape((1,)),
    'reshape -1': lambda mx: _zero_d(mx).reshape((-1,)),
    '[()]': lambda mx: _zero_d(mx)[()],
    '[:]': lambda mx: _zero_d(mx)[:],
    '[...]': lambda mx: _zero_d(mx)[...],
    '[None]': lambda mx: _zero_d(mx)[None],
    '[0]': lambda mx: _zero_d(mx)[0],
    '[(0,)]': lambda mx: _zero_d(mx)[(0,)],
    '[0:1]': lambda mx: _zero_d(mx)[0:1],
    '[[0]]': lambda mx: _zero_d(mx)[[0]],
    '[(:,)]': lambda mx: _zero_d(mx)[(slice(None),)],
    'set [...]': lambda mx: _zero_d_set(mx, Ellipsis, 3),
    'set [0]': lambda mx: _zero_d_set(mx, 0, 3),
    'set [(0,)]': lambda mx: _zero_d_set(mx, (0,), 3),
    'set np 0-d': lambda mx: _zero_d_set(mx, (), np.array(2.0)),
    'set np (1,)': lambda mx: _zero_d_set(mx, (), np.array([2.0])),
    'set np (2,)': lambda mx: _zero_d_set(mx, (), np.array([2.0, 3.0])),
    'set list': lambda mx: _zero_d_set(mx, (), [1]),
    'kv init/push/pull': _kv_zero_d,
}


@pytest.mark.parametrize('name', sorted(ZERO_D))
def test_zero_d_arrays(both, name):
    run_both(both, ZERO_D[name], name)


def test_zero_d_operations_mxnet_refuses(mxkv):
    """MXNet 1.9.1's legacy operators fail on a 0-d array (a[()] = 3, a + 1, copy ...);
    mxkv computes them"""
    arr = _zero_d(mxkv)
    arr[()] = 3
    assert arr.shape == () and arr.asscalar() == 3.0
    arr[:] = mxkv.nd.array([4.0])
    assert (arr + 1).asnumpy() == np.float32(5.0) and (arr + 1).shape == ()
    assert arr.copy().shape == () and arr.astype('int32').asscalar() == 4


# --- 7. arithmetic kernels -------------------------------------------------------------------
# mod (%): the divisor's sign, fmod in double, x % 0 = 0; power: powf on float32 operands
# (pow in double for float64), cast back with C's conversion (int 2 ** -1 = 0); sign(NaN)
# = 0; an int array's sqrt is sqrtf cast back; numpy operands are refused (TypeError);
# concatenate asserts one dtype and agreeing shapes.
_F_VALUES = [7.5, -7.5, 3.0, 0.0, -0.0, 100.0, -128.0, 1.0, float('nan'), float('inf'),
             -float('inf'), 1e30, 5.0]
_I_VALUES = [7, -7, 3, 0, 100, -128, 1, 127, -1]
ARITH = {}
for _dt in ['float16', 'float32', 'float64', 'int32', 'int64', 'uint8', 'int8']:
    _vals = _F_VALUES if _dt.startswith('float') else _I_VALUES
    _scalars = [3, -3, 0, 2.5, -2.5, 1e-3, float('nan'), float('inf')] if _dt.startswith(
        'float') else [3, -3, 0, 2.5, -2.5, 2, -2, 39, 0.5]
    for _s in _scalars:
        ARITH['%s %% %r' % (_dt, _s)] = (lambda d, v, s: lambda mx: mx.nd.array(v, dtype=d) % s)(
            _dt, _vals, _s)
        ARITH['%r %% %s' % (_s, _dt)] = (lambda d, v, s: lambda mx: s % mx.nd.array(v, dtype=d))(
            _dt, _vals, _s)
        ARITH['%s ** %r' % (_dt, _s)] = (lambda d, v, s: lambda mx: mx.nd.array(v, dtype=d)
                                         ** s)(_dt, _vals, _s)
        ARITH['%r ** %s' % (_s, _dt)] = (lambda d, v, s: lambda mx: s
                                         ** mx.nd.array(v, dtype=d))(_dt, _vals, _s)
    ARITH['%s %% nd' % _dt] = (lambda d, v: lambda mx: mx.nd.array(v, dtype=d)
                               % mx.nd.array(v[::-1], dtype=d))(_dt, _vals)
    ARITH['%s ** nd' % _dt] = (lambda d, v: lambda mx: mx.nd.array(v, dtype=d)
                               ** mx.nd.array(v[::-1], dtype=d))(_dt, _vals)
    ARITH['%s %%= 3' % _dt] = (lambda d, v: lambda mx: _inplace(mx.nd.array(v, dtype=d),
                                                               '__imod__', 3))(_dt, _vals)
    ARITH['%s sign' % _dt] = (lambda d, v: lambda mx: mx.nd.sign(mx.nd.array(v, dtype=d)))(
        _dt, _vals)
    ARITH['%s sqrt' % _dt] = (lambda d, v: lambda mx: mx.nd.sqrt(mx.nd.array(v, dtype=d)))(
        _dt, _vals)
    ARITH['%s 3 ** 39' % _dt] = (lambda d: lambda mx: mx.nd.array([3, 7, 11], dtype=d)
                                 ** mx.nd.array([39, 22, 17], dtype=d))(_dt)
ARITH.update({
    'concatenate f32 f64': lambda mx: mx.nd.concatenate([mx.nd.ones((1,)),
                                                         mx.nd.zeros((1,), dtype='float64')]),
    'concatenate bad shapes': lambda mx: mx.nd.concatenate([mx.nd.ones((2, 1)),
                                                            mx.nd.zeros((3, 2))], axis=1),
    'concatenate axis 1': lambda mx: mx.nd.concatenate([mx.nd.ones((2, 1)),
                                                        mx.nd.zeros((2, 2))], axis=1),
    'concatenate []': lambda mx: mx.nd.concatenate([]),
    'nd + numpy': lambda mx: mx.nd.ones((2,)) + np.ones(2),
    'numpy + nd': lambda mx: np.ones(2) + mx.nd.ones((2,)),
    'nd * numpy': lambda mx: mx.nd.ones((2,)) * np.ones(2),
    'nd += numpy': lambda mx: _inplace(mx.nd.ones((2,)), '__iadd__', np.ones(2)),
    'nd + list': lambda mx: mx.nd.ones((2,)) + [1, 2],
})


def _inplace(arr, method, other):
    getattr(arr, method)(other)
    return arr


@pytest.mark.parametrize('name', sorted(ARITH))
def test_arithmetic_kernels(both, name):
    run_both(both, ARITH[name], name)


# mx.nd.add / subtract / multiply / divide / modulo / power / maximum / minimum take
# (lhs, rhs) only (no out=), numbers on either side, and run the operators' kernels
def _fn_out(mx, name):
    out = mx.nd.zeros((2,))
    getattr(mx.nd, name)(mx.nd.array([1.0, 2.0]), mx.nd.array([3.0, 4.0]), out=out)
    return out


FUNCTIONS = {
    'add out=': lambda mx: _fn_out(mx, 'add'),
    'maximum out=': lambda mx: _fn_out(mx, 'maximum'),
    'divide int arrays': lambda mx: mx.nd.divide(mx.nd.array([7, -7, 0], dtype='int32'),
                                                 mx.nd.array([2, 2, 3], dtype='int32')),
    'divide int': lambda mx: mx.nd.divide(mx.nd.array([7, -7], dtype='int32'), 2),
    'divide scalars': lambda mx: mx.nd.divide(7, 2),
    'modulo': lambda mx: mx.nd.modulo(mx.nd.array([7.5, -7.5]), 2),
    'modulo left scalar': lambda mx: mx.nd.modulo(7, mx.nd.array([2, -3], dtype='int32')),
    'power int': lambda mx: mx.nd.power(mx.nd.array([2, 3], dtype='int32'), -1),
    'power left scalar': lambda mx: mx.nd.power(2, mx.nd.array([0.5, 3.0])),
    'maximum scalars': lambda mx: mx.nd.maximum(2, 3),
    'minimum left scalar': lambda mx: mx.nd.minimum(3, mx.nd.array([1.0, 5.0])),
    'subtract left scalar': lambda mx: mx.nd.subtract(10, mx.nd.array([1.0, 2.0])),
    'add numpy': lambda mx: mx.nd.add(mx.nd.ones((2,)), np.ones(2)),
}


@pytest.mark.parametrize('name', sorted(FUNCTIONS))
def test_binary_functions(both, name):
    run_both(both, FUNCTIONS[name], name)


# --- save / load -------------------------------------------------------------------------------
# nd.save: TypeError for a dict with other keys or values, or a list with other values;
# ValueError for other containers (a tuple too).  csr arrays load and densify.
SAVE_CALLS = {
    'dict int keys': lambda mx, path: mx.nd.save(path, {1: mx.nd.ones((1,))}),
    'dict None value': lambda mx, path: mx.nd.save(path, {'a': None}),
    'list with None': lambda mx, path: mx.nd.save(path, [mx.nd.ones((1,)), None]),
    'list of ints': lambda mx, path: mx.nd.save(path, [1, 2]),
    'str data': lambda mx, path: mx.nd.save(path, 'abc'),
    'tuple': lambda mx, path: mx.nd.save(path, (mx.nd.ones((1,)),)),
    'list': lambda mx, path: (mx.nd.save(path, [mx.nd.ones((2,))]), mx.nd.load(path))[1][0],
    'one array': lambda mx, path: (mx.nd.save(path, mx.nd.ones((2,))), mx.nd.load(path))[1][0],
}


@pytest.mark.parametrize('name', sorted(SAVE_CALLS))
def test_save_arguments(both, tmp_path, name):
    run_both(both, lambda mx: SAVE_CALLS[name](mx, str(tmp_path / mx.__name__)), name)


def test_csr_loads_and_densifies(both, tmp_path):
    """a csr array saved by MXNet or by mxkv loads as a CSRNDArray whose asnumpy() is its
    dense value (mxkv refused to densify csr arrays)"""
    mxnet, mxkv = both
    for saver in (mxnet, mxkv):
        path = str(tmp_path / ('csr.' + saver.__name__))
        saver.nd.save(path, [saver.nd.sparse.zeros('csr', (3, 4))])
        expected = [outcome(mxnet, lambda mx, a=a: a) for a in mxnet.nd.load(path)]
        got = [outcome(mxkv, lambda mx, a=a: a) for a in mxkv.nd.load(path)]
        assert_same_bits(repr(expected), repr(got), 'csr saved by ' + saver.__name__)


def _mxkv_csr(mxkv, data, indices, indptr, shape):
    """a csr array filled part by part (MXNDArraySyncCopyFromNDArray: -1 data, 0 indptr,
    1 indices), as a C user fills one (libmxkv only: MXNet checks each part against the
    others and cannot fill a csr created with empty parts)"""
    from mxkv.base import _LIB, check_call
    if not getattr(_LIB, '_mxkv_synchronous', False):
        pytest.skip('filling csr parts one by one needs libmxkv')
    arr = mxkv.nd.sparse.zeros('csr', shape)
    for i, part, dtype in ((-1, data, 'float32'), (0, indptr, 'int64'), (1, indices, 'int64')):
        src = mxkv.nd.array(part, dtype=dtype)
        check_call(_LIB.MXNDArraySyncCopyFromNDArray(arr.handle, src.handle, i))
    return arr


@pytest.mark.parametrize('case', [
    ([1.5, 2.0, -3.0, 4.0], [1, 0, 3, 2], [0, 1, 1, 3, 4], (4, 4)),
    ([7.0], [2], [0, 0, 1], (2, 3)),
    ([], [], [0, 0, 0], (2, 3)),
], ids=repr)
def test_csr_densifies_like_mxnet(both, case):
    mxnet, mxkv = both
    data, indices, indptr, shape = case
    expected = mxnet.nd.sparse.csr_matrix(
        (np.array(data, np.float32), np.array(indices, np.int64), np.array(indptr, np.int64)),
        shape=shape).asnumpy()
    got = _mxkv_csr(mxkv, data, indices, indptr, shape).asnumpy()
    assert_same_bits(expected, got, 'csr %r' % (case,))


def test_csr_with_invalid_parts_raises(mxkv):
    arr = _mxkv_csr(mxkv, [1.0], [5], [0, 1, 1], (2, 3))  # column 5 of 3
    with pytest.raises(mxkv.base.MXNetError, match='invalid parts'):
        arr.asnumpy()


# --- pickling: MXNet loads a pickled CPU array (any device id, pinned or shared) on cpu(0)
@pytest.mark.parametrize('make', ['dense cpu(3)', 'dense cpu_pinned(2)', 'row_sparse cpu(4)',
                                  'int64 deepcopy'])
def test_pickle_context_and_values(both, make):
    import copy
    import pickle

    def scenario(mx):
        if make == 'dense cpu(3)':
            arr = mx.nd.array([1.5, 2.5], ctx=mx.cpu(3))
        elif make == 'dense cpu_pinned(2)':
            arr = mx.nd.array([1.5, 2.5], ctx=mx.cpu_pinned(2))
        elif make == 'row_sparse cpu(4)':
            arr = mx.nd.sparse.row_sparse_array(([[1.0, 2.0]], [1]), shape=(3, 2), ctx=mx.cpu(4))
        else:
            arr = mx.nd.array([1, 2], dtype='int64')
            back = copy.deepcopy(arr)
            back[0] = 9  # independent of arr
            return str(back.context), back.asnumpy(), arr.asnumpy()
        back = pickle.loads(pickle.dumps(arr))
        return str(back.context), back.stype, back.asnumpy()
    mxnet, mxkv = both
    assert_same_bits(scenario(mxnet), scenario(mxkv), make)


# --- bfloat16 arithmetic: bf16_t computes in float and keeps the high half of the result;
# a scalar operand is first made a bf16_t (DType(scalar)).
_BF_A = np.array([1.0, 3.0, 1.0078125, -2.5, 0.0, 1e30, -7.75, np.nan, np.inf, 0.333],
                 np.float32)
_BF_B = np.array([3.0, -1.01171875, 2.0, 0.5, -0.0, 3.0, 2.25, 1.0, -np.inf, 7.0], np.float32)


def _bf(mx, values):
    return mx.nd.array(values).astype(BF16)


BF16_ARITH = {
    'a + b': lambda mx: _bf(mx, _BF_A) + _bf(mx, _BF_B),
    'a - b': lambda mx: _bf(mx, _BF_A) - _bf(mx, _BF_B),
    'a * b': lambda mx: _bf(mx, _BF_A) * _bf(mx, _BF_B),
    'a / b': lambda mx: _bf(mx, _BF_A) / _bf(mx, _BF_B),
    'a ** b': lambda mx: _bf(mx, _BF_A) ** _bf(mx, _BF_B),
    'a % b': lambda mx: _bf(mx, _BF_A) % _bf(mx, _BF_B),
    'a + 1.01171875': lambda mx: _bf(mx, _BF_A) + 1.01171875,
    'a * 1.01171875': lambda mx: _bf(mx, _BF_A) * 1.01171875,
    '3 - a': lambda mx: 3.0234375 - _bf(mx, _BF_A),
    '3 / a': lambda mx: 3 / _bf(mx, _BF_A),
    'a ** 2': lambda mx: _bf(mx, _BF_A) ** 2,
    'a += 1': lambda mx: _inplace(_bf(mx, _BF_A), '__iadd__', 1),
    'a *= b': lambda mx: _inplace(_bf(mx, _BF_A), '__imul__', _bf(mx, _BF_B)),
    '-a': lambda mx: -_bf(mx, _BF_A),
    '-nan': lambda mx: -mx.nd.array(np.array([0x7fc00000, 0xffc00000, 0x7f800001], np.uint32)
                                    .view(np.float32)).astype(BF16),
    'abs(a)': lambda mx: abs(_bf(mx, _BF_A)),
    'sqrt': lambda mx: mx.nd.sqrt(_bf(mx, _BF_A)),
    'square': lambda mx: mx.nd.square(_bf(mx, _BF_A)),
    'sign': lambda mx: mx.nd.sign(_bf(mx, _BF_A)),
    'clip': lambda mx: mx.nd.clip(_bf(mx, _BF_A), -1.01171875, 2.3),
    'maximum': lambda mx: mx.nd.maximum(_bf(mx, _BF_A), 1.5),
    'minimum nd': lambda mx: mx.nd.minimum(_bf(mx, _BF_A), _bf(mx, _BF_B)),
    'a + float32': lambda mx: _bf(mx, _BF_A) + mx.nd.array(_BF_B),
    'a[1:] = 2.3': lambda mx: _assign(_bf(mx, _BF_A), S(1, None), 2.3),
}


@pytest.mark.parametrize('name', sorted(BF16_ARITH))
def test_bfloat16_arithmetic(both, name):
    run_both(both, lambda mx: _bits_or_same(BF16_ARITH[name](mx)), name)


def _bits_or_same(res):
    return res.asnumpy().view(np.uint16) if res.dtype == BF16 else res


# --- NDArray.sum: MXNet reduces in element order with Kahan compensation, each step in the
# element type (float16 sums can overflow to +inf where a pairwise sum gives -inf)
@pytest.mark.parametrize('dtype', ['float32', 'float16', 'float64', 'int32', 'int8', 'uint8',
                                   'bf16'])
@pytest.mark.parametrize('size', [3, 10, 1000, 20000])
def test_sum_order(both, dtype, size):
    rng = np.random.RandomState(size)
    if dtype in ('float32', 'float16', 'float64', 'bf16'):
        values = (rng.randn(size) * 1000).astype('float32' if dtype == 'bf16' else dtype)
    else:
        values = rng.randint(-100 if dtype != 'uint8' else 0, 100, size).astype(dtype)

    def scenario(mx):
        if dtype == 'bf16':
            return mx.nd.array(values).astype(BF16).sum().asnumpy().view(np.uint16)
        return mx.nd.array(values, dtype=dtype).sum()
    run_both(both, scenario, '%s[%d].sum()' % (dtype, size))


# --- row_sparse: rsp[:] = v is MXNet's _set_value (a float parameter, every row stored, 0
# too); rsp + 0, 0 + rsp, rsp - 0 (and += 0, -= 0) stay row_sparse; abs, sqrt, square,
# sign and clip (bounds around 0) work on the stored rows; sum densifies
def _rsp(mx, dtype='float32'):
    return mx.nd.sparse.row_sparse_array(([[1.5, -2.0], [0.0, 0.0]], [1, 3]), shape=(4, 2),
                                         dtype=dtype)


def _rsp_outcome(res):
    out = {'cls': type(res).__name__, 'stype': res.stype, 'dense': res.asnumpy()}
    if res.stype == 'row_sparse':
        out['indices'] = res.indices.asnumpy()
        out['data'] = res.data.asnumpy()
    return out


RSP_CASES = {}
for _v in [0, 0.0, -0.0, 2.5, 1e-39, 1e-320, float('nan'), True, np.float32(0.1), 3]:
    for _dt in ('float32', 'int32'):
        RSP_CASES['%s [:] = %r' % (_dt, _v)] = (lambda v, d: lambda mx: _assign(
            _rsp(mx, d), S(None), v))(_v, _dt)
RSP_CASES.update({
    '+ 0': lambda mx: _rsp(mx) + 0, '+ -0.0': lambda mx: _rsp(mx) + -0.0,
    '- 0': lambda mx: _rsp(mx) - 0, '0 +': lambda mx: 0 + _rsp(mx),
    '0 -': lambda mx: 0 - _rsp(mx), '+ 1': lambda mx: _rsp(mx) + 1,
    '+ 1e-320': lambda mx: _rsp(mx) + 1e-320,
    '+= 0': lambda mx: _inplace(_rsp(mx), '__iadd__', 0),
    '-= 0': lambda mx: _inplace(_rsp(mx), '__isub__', 0),
    'abs': lambda mx: abs(_rsp(mx)), 'abs int': lambda mx: abs(_rsp(mx, 'int32')),
    'nd.abs': lambda mx: mx.nd.abs(_rsp(mx)), 'sqrt': lambda mx: mx.nd.sqrt(_rsp(mx)),
    'sqrt int': lambda mx: mx.nd.sqrt(_rsp(mx, 'int32')),
    'square': lambda mx: mx.nd.square(_rsp(mx)), 'sign': lambda mx: mx.nd.sign(_rsp(mx)),
    'clip -1 1': lambda mx: mx.nd.clip(_rsp(mx), -1, 1),
    'clip 1 2': lambda mx: mx.nd.clip(_rsp(mx), 1, 2),
    'clip 0 1': lambda mx: mx.nd.clip(_rsp(mx), 0, 1),
    'abs of empty': lambda mx: abs(mx.nd.sparse.zeros('row_sparse', (3, 2))),
    'sum': lambda mx: _rsp(mx).sum(),
    'neg': lambda mx: -_rsp(mx),
})


@pytest.mark.parametrize('name', sorted(RSP_CASES))
def test_row_sparse_operations(both, name):
    import warnings

    def scenario(mx):
        with warnings.catch_warnings():
            warnings.simplefilter('ignore')
            return _rsp_outcome(RSP_CASES[name](mx))
    mxnet, mxkv = both
    try:
        expected = scenario(mxnet)
    except Exception as exc:  # pylint: disable=broad-except
        expected = type(exc).__name__
    try:
        got = scenario(mxkv)
    except Exception as exc:  # pylint: disable=broad-except
        got = 'MXNetError' if isinstance(exc, mxkv.base.MXNetError) else type(exc).__name__
    if isinstance(expected, str):
        assert got == 'MXNetError' if expected == 'MXNetError' else got == expected, name
    else:
        assert_same_bits(expected, got, name)


METHODS = {
    'abs()': lambda mx: mx.nd.array([-4.0, 9.0, -0.0]).abs(),
    'sqrt()': lambda mx: mx.nd.array([-4.0, 9.0, 2.0]).sqrt(),
    'square()': lambda mx: mx.nd.array([-4, 9, 3], dtype='int32').square(),
    'sign()': lambda mx: mx.nd.array([-4.0, 0.0, float('nan')]).sign(),
    'clip()': lambda mx: mx.nd.array([-4.0, 9.0, 2.0]).clip(0, 5),
    'clip() int': lambda mx: mx.nd.array([-4, 9, 2], dtype='int32').clip(-1.5, 5.5),
    'row_sparse reshape': lambda mx: _rsp(mx).reshape((8,)),
    'row_sparse abs()': lambda mx: _rsp(mx).abs(),
}


@pytest.mark.parametrize('name', sorted(METHODS))
def test_ndarray_methods(both, name):
    run_both(both, METHODS[name], name)


# --- comparisons are elementwise (an array of the dtype: 1 where it holds, else 0); a
# number is cast to the dtype first; None, strings, lists, numpy arrays raise TypeError
_CMP_OPS = {'==': lambda x, y: x == y, '!=': lambda x, y: x != y, '<': lambda x, y: x < y,
            '<=': lambda x, y: x <= y, '>': lambda x, y: x > y, '>=': lambda x, y: x >= y}
COMPARISONS = {}
for _dt in ['float32', 'int32', 'uint8', 'float16', 'float64', 'int64']:
    _nan = float('nan') if _dt.startswith('float') else 7
    for _op, _fn in _CMP_OPS.items():
        COMPARISONS['%s a %s b' % (_dt, _op)] = (lambda d, f, n: lambda mx: f(
            mx.nd.array([1, 2.5, n, -0.0, 3], dtype=d),
            mx.nd.array([1, 2, n, 0.0, 4], dtype=d)))(_dt, _fn, _nan)
        COMPARISONS['%s a %s 2.5' % (_dt, _op)] = (lambda d, f, n: lambda mx: f(
            mx.nd.array([1, 2.5, n, -0.0, 3], dtype=d), 2.5))(_dt, _fn, _nan)
        COMPARISONS['%s 2 %s a' % (_dt, _op)] = (lambda d, f, n: lambda mx: f(
            2, mx.nd.array([1, 2.5, n, -0.0, 3], dtype=d)))(_dt, _fn, _nan)
COMPARISONS.update({
    '== None': lambda mx: mx.nd.ones((2,)) == None,  # noqa: E711 (MXNet raises TypeError)
    '!= None': lambda mx: mx.nd.ones((2,)) != None,  # noqa: E711
    '== str': lambda mx: mx.nd.ones((2,)) == 'x',
    '== list': lambda mx: mx.nd.ones((2,)) == [1, 1],
    '== numpy': lambda mx: mx.nd.ones((2,)) == np.ones(2),
    'in': lambda mx: 1 in mx.nd.array([1, 2]),
    'not in': lambda mx: 3 in mx.nd.array([1, 2]),
    'bool(a == a)': lambda mx: bool(mx.nd.array([1.0]) == mx.nd.array([1.0])),
    'broadcast ==': lambda mx: mx.nd.ones((2, 3)) == mx.nd.ones((3,)),
    'dtypes differ': lambda mx: mx.nd.ones((2,)) == mx.nd.ones((2,), dtype='int32'),
    'list.index': lambda mx: [mx.nd.ones((1,)), mx.nd.zeros((1,))].index(mx.nd.zeros((1,))),
    'row_sparse == 0': lambda mx: _rsp(mx) == 0,
    'bfloat16 == 1': lambda mx: _bits(mx.nd.array([1.0, 2.0]).astype(BF16) == 1),
})


@pytest.mark.parametrize('name', sorted(COMPARISONS))
def test_comparisons(both, name):
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        run_both(both, COMPARISONS[name], name)


# --- creation: nd.zeros / nd.ones refuse a bad shape with MXNetError (their shape is an
# operator parameter), nd.empty / nd.full a negative dim with OverflowError (ctypes)
CREATION = {}
for _fn in ('zeros', 'ones', 'empty'):
    for _shape in [(2.0,), 'abc', (True, 2), (np.int64(2), 3), 3, 3.0, (-1, 2), [2, 3]]:
        if _fn == 'empty' and _shape == (True, 2):
            continue  # MXNet takes True as 1 there; mxkv refuses bool dims everywhere
        CREATION['%s %r' % (_fn, _shape)] = (lambda f, shp: lambda mx: (  # empty: no values
            getattr(mx.nd, f)(shp).shape if f == 'empty' else getattr(mx.nd, f)(shp)))(
                _fn, _shape)
CREATION['full (-1, 2)'] = lambda mx: mx.nd.full((-1, 2), 1)
CREATION['full (2.0,)'] = lambda mx: mx.nd.full((2.0,), 1)


@pytest.mark.parametrize('name', sorted(CREATION))
def test_creation_shapes(both, name):
    run_both(both, CREATION[name], name)


@pytest.mark.parametrize('dtype', ['foo', 'complex64', 'float128', 'U3'])
@pytest.mark.parametrize('make', ['zeros', 'empty', 'array'])
def test_unknown_dtypes(both, make, dtype):
    mxnet, mxkv = both

    def kinds(mx):
        try:
            if make == 'array':
                mx.nd.array([1, 2], dtype=dtype)
            else:
                getattr(mx.nd, make)((2,), dtype=dtype)
        except Exception as exc:  # pylint: disable=broad-except
            return {c.__name__ for c in type(exc).__mro__} & {'TypeError', 'KeyError',
                                                              'MXNetError'}
        return set()
    expected = kinds(mxnet)
    assert expected and expected <= kinds(mxkv), (make, dtype, expected)


# --- random keys (ints, slices with any bounds and steps, lists, numpy arrays, None,
# Ellipsis) read and written with scalars, NDArrays and numpy values: mxkv must give
# MXNet's result or exception kind.  Writes through advanced keys with negative ints or
# None are left out: MXNet scatters those without wrapping (out of its buffer: heap
# corruption that would take the test process down); mxkv wraps or raises IndexError.
def _random_key(rng, shape):
    def comp(n):
        r = rng.random()
        if r < 0.3:
            return rng.randint(-n, n - 1)
        if r < 0.6:
            return slice(rng.choice([None, rng.randint(-n - 1, n + 1)]),
                         rng.choice([None, rng.randint(-n - 1, n + 1)]),
                         rng.choice([None, None, 1, 2, -1, -2]))
        if r < 0.7:
            return [rng.randint(0, n - 1) for _ in range(rng.randint(1, 3))]
        if r < 0.8:
            return np.array([rng.randint(0, n - 1) for _ in range(rng.randint(1, 3))])
        if r < 0.85:
            return None
        return slice(None)
    key = tuple(comp(n) for n in shape[:rng.randint(1, len(shape))])
    if rng.random() < 0.1:
        key = key + (Ellipsis,)
    return key[0] if len(key) == 1 and rng.random() < 0.5 else key


def _random_index_cases(seed, count):
    import random
    rng = random.Random(seed)
    cases = []
    for _ in range(count):
        shape = rng.choice([(3, 4), (2, 3, 4), (5,), (1, 4), (4, 1, 2)])
        dtype = rng.choice(['float32', 'int32', 'float64', 'uint8'])
        key = _random_key(rng, shape)
        value = rng.choice(['scalar', 'nd1', 'ndrow', 'np', 'float'])
        cases.append((shape, dtype, key, value))
    return cases


def _index_value(mx, kind, shape, dtype):
    return {'scalar': lambda: -7, 'float': lambda: 2.5,
            'nd1': lambda: mx.nd.array([-5.0], dtype=dtype),
            'ndrow': lambda: mx.nd.array(np.full(shape[-1:], -3), dtype=dtype),
            'np': lambda: np.full(shape[-1:], -9.5)}[kind]()


@pytest.mark.parametrize('seed', [1, 2, 3])
def test_random_keys(both, seed):
    for shape, dtype, key, kind in _random_index_cases(seed, 300):
        base = np.arange(int(np.prod(shape))).reshape(shape)
        run_both(both, lambda mx: mx.nd.array(base, dtype=dtype)[key],
                 'get %r of %s %s' % (key, shape, dtype))
        parts = key if isinstance(key, tuple) else (key,)
        if any(isinstance(p, (list, np.ndarray)) for p in parts) and any(
                p is None or (isinstance(p, int) and p < 0) for p in parts):
            continue

        def write(mx):
            arr = mx.nd.array(base, dtype=dtype)
            arr[key] = _index_value(mx, kind, shape, dtype)
            return arr
        run_both(both, write, 'set %r of %s %s = %s' % (key, shape, dtype, kind))


# --- integer array / integer array or number is C's exact integer division (it went
# through float64 and lost the low bits of 64-bit values: (2**62 + 1) / 1 gave 2**62);
# astype(copy=False) compares the NDArray dtype, so a bfloat16 array is returned as it is
# for bfloat16 (it was copied)
def _int64(mx, values):
    return mx.nd.array(np.array(values, np.int64), dtype='int64')


_BIG = [2 ** 62 + 1, -(2 ** 62 + 1), 7, -7, 2 ** 53 + 1, -(2 ** 63)]
INT_DIVISION = {
    'int64 / int64': lambda mx: _int64(mx, _BIG) / _int64(mx, [1, 3, -2, 2, 3, 7]),
    'int64 / 3': lambda mx: _int64(mx, _BIG) / 3,
    'int64 / -5': lambda mx: _int64(mx, _BIG) / -5,
    'int64 /= 3': lambda mx: _inplace(_int64(mx, _BIG), '__itruediv__', 3),
    'nd.divide int64': lambda mx: mx.nd.divide(_int64(mx, _BIG), _int64(mx, [3] * 6)),
    # number / integer array is _rdiv_scalar: float32 arithmetic, C's cast back (x / 0 is
    # INT_MIN in int32 / int64, 0 in int8); it was exact, and 0 for x / 0
    '2**62 / int64': lambda mx: 2 ** 62 / _int64(mx, [3, -3, 7, -7, 0]),
    '16777217 / int32': lambda mx: 16777217 / mx.nd.array([1, 3, 0, -2], dtype='int32'),
    '-7.9 / int8': lambda mx: -7.9 / mx.nd.array([3, 0, -2], dtype='int8'),
    '300 / uint8': lambda mx: 300 / mx.nd.array([3, 0, 7], dtype='uint8'),
    'nd.divide(7, int32)': lambda mx: mx.nd.divide(7, mx.nd.array([2, 0, -2], dtype='int32')),
    'int8 / int8': lambda mx: mx.nd.array([-128, 127, -7, 7], dtype='int8')
    / mx.nd.array([-1, -2, 2, -2], dtype='int8'),
    'uint8 / uint8': lambda mx: mx.nd.array([255, 7, 200], dtype='uint8')
    / mx.nd.array([2, 3, 201], dtype='uint8'),
    'bf16 astype bf16 copy=False is self': lambda mx: (lambda a: a.astype(BF16, copy=False)
                                                       is a)(mx.nd.array([1.5]).astype(BF16)),
    'bf16 astype int32 copy=False': lambda mx: mx.nd.array([1.5, -3.0]).astype(BF16).astype(
        'int32', copy=False),
}


@pytest.mark.parametrize('name', sorted(INT_DIVISION))
def test_integer_division_and_astype(both, name):
    run_both(both, INT_DIVISION[name], name)


def test_bfloat16_astype_uint16_copy_false_converts(mxkv):
    """(MXNet 1.9.1's frontend has no uint16): the bits of 1.5 are 16320, the value is 1"""
    if not getattr(mxkv.base._LIB, '_mxkv_synchronous', False):
        pytest.skip('libmxnet.so has no uint16 arrays (Unknown type enum)')
    arr = mxkv.nd.array([1.5, 2.0]).astype(BF16)
    res = arr.astype(np.uint16, copy=False)
    assert res is not arr and res.dtype is np.uint16
    assert res.asnumpy().tolist() == [1, 2]


# --- maximum / minimum are MXNet's IsNan(a) ? a : (a > b ? a : b): of 0.0 and -0.0 the
# second operand comes out (numpy's maximum gave the first for float16 / float64), and a
# number-first call keeps the array's element as a (_maximum_scalar(array, number))
def _zeros_pair(mx, dtype):
    return (mx.nd.array([0.0, -0.0, np.nan, 1.0, -0.0], dtype=dtype),
            mx.nd.array([-0.0, 0.0, 1.0, np.nan, -0.0], dtype=dtype))


EXTREMA = {}
for _dt in ('float16', 'float32', 'float64'):
    for _fn in ('maximum', 'minimum'):
        EXTREMA['%s %s arrays' % (_dt, _fn)] = (lambda d, f: lambda mx: getattr(mx.nd, f)(
            *_zeros_pair(mx, d)))(_dt, _fn)
        EXTREMA['%s %s array, -0.0' % (_dt, _fn)] = (lambda d, f: lambda mx: getattr(mx.nd, f)(
            _zeros_pair(mx, d)[0], -0.0))(_dt, _fn)
        EXTREMA['%s %s -0.0, array' % (_dt, _fn)] = (lambda d, f: lambda mx: getattr(mx.nd, f)(
            -0.0, _zeros_pair(mx, d)[0]))(_dt, _fn)
        EXTREMA['%s %s 0.0, array' % (_dt, _fn)] = (lambda d, f: lambda mx: getattr(mx.nd, f)(
            0.0, _zeros_pair(mx, d)[1]))(_dt, _fn)
        EXTREMA['%s %s nan, array' % (_dt, _fn)] = (lambda d, f: lambda mx: getattr(mx.nd, f)(
            float('nan'), _zeros_pair(mx, d)[1]))(_dt, _fn)


@pytest.mark.parametrize('name', sorted(EXTREMA))
def test_maximum_minimum_operand_order(both, name):
    run_both(both, EXTREMA[name], name)


# --- MXNet's math:: wrappers: sqrt and abs (fabs) of an integer array compute in double,
# square (sqr) in float, each cast back with C's conversion (|2**62 + 1| is 2**62, the
# square of 16777217 INT_MIN); clip compares integer and float16 data with the float
# bounds as C promotes them and writes DType(bound) (the bounds were cast to the dtype
# first: a bound of 3.4e38 became INT_MIN); -x is _mul_scalar(x, -1.0), which leaves a
# NaN's sign as it is (numpy's negative flips it)
_INTS = {'int64': [2 ** 62 + 1, 2 ** 48 - 1, -(2 ** 53 + 1), 16777217, -5],
         'int32': [16777217, -2 ** 31, 2 ** 31 - 1, 46341, -5],
         'int8': [-128, 127, -5, 0, 3], 'uint8': [255, 0, 7, 128, 3]}
MATH = {}
for _dt, _vals in _INTS.items():
    for _fn in ('abs', 'sqrt', 'square'):
        MATH['%s %s' % (_dt, _fn)] = (lambda d, v, f: lambda mx: getattr(mx.nd, f)(
            mx.nd.array(np.array(v, d), dtype=d)))(_dt, _vals, _fn)
    MATH['%s abs()' % _dt] = (lambda d, v: lambda mx: abs(mx.nd.array(np.array(v, d),
                                                                       dtype=d)))(_dt, _vals)
    MATH['%s neg' % _dt] = (lambda d, v: lambda mx: -mx.nd.array(np.array(v, d),
                                                                  dtype=d))(_dt, _vals)
    for _lo, _hi in [(-7, 3.4e38), (0, 16777217), (-1e30, 1e30), (float('nan'), 5), (2.5, 2.7),
                     (-1e10, float('nan'))]:
        MATH['%s clip(%r, %r)' % (_dt, _lo, _hi)] = (lambda d, v, lo, hi: lambda mx: mx.nd.clip(
            mx.nd.array(np.array(v, d), dtype=d), lo, hi))(_dt, _vals, _lo, _hi)
for _dt in ('float16', 'float32', 'float64'):
    MATH['%s neg of NaNs' % _dt] = (lambda d: lambda mx: -mx.nd.array(
        [np.nan, -np.nan, -0.0, 1.5], dtype=d))(_dt)
    MATH['%s clip(1.0001, 3e38)' % _dt] = (lambda d: lambda mx: mx.nd.clip(
        mx.nd.array([1.0, 1.0009765625, 70000.0, -np.nan], dtype=d), 1.0001, 3e38))(_dt)
MATH['row_sparse neg of NaNs'] = lambda mx: -mx.nd.sparse.row_sparse_array(
    ([[np.nan, -1.0]], [1]), shape=(3, 2))


@pytest.mark.parametrize('name', sorted(MATH))
def test_math_wrappers_clip_and_negation(both, name):
    def scenario(mx):
        res = MATH[name](mx)
        return res.tostype('default') if res.stype != 'default' else res
    run_both(both, scenario, name)


# --- reshape: MXNet's InferReshapeShape writes the inferred size to the result dim at the
# -1's position in the *given* shape, another dim than the -1's own after a -2 or -4 (the
# size then differs and the frontend raises ValueError; past the end the -1 stays 1)
RESHAPE_INFER = {}
for _shape, _spec, _rev in [((2, 3), (-2, -1), False), ((2, 3), (-2, -1), True),
                            ((2, 3), (-2, -1, 1), False), ((2, 3), (-2, -1, 1), True),
                            ((2, 3), (2, -2, -1), False), ((2, 3), (2, -2, -1), True),
                            ((2, 3), (-1, -2), False), ((2, 3), (-1, -2), True),
                            ((24,), (-2, -2, -1), False), ((24,), (-4, 24, 1, -1), False),
                            ((2, 3, 4), (-4, 1, 2, -2, -1), False),
                            ((2, 3, 4), (0, -4, 3, 1, -1), True)]:
    RESHAPE_INFER['%s.reshape(%s, reverse=%s)' % (_shape, _spec, _rev)] = (
        lambda sh, sp, rv: lambda mx: mx.nd.array(np.arange(np.prod(sh)).reshape(sh)).reshape(
            sp, reverse=rv))(_shape, _spec, _rev)


@pytest.mark.parametrize('name', sorted(RESHAPE_INFER))
def test_reshape_inferred_dim_position(both, name):
    run_both(both, RESHAPE_INFER[name], name)


# --- a float parameter is read as dmlc::FieldEntry<float>::Set reads it: refused where the
# parser moves past no character (a leading exponent or 'f' suffix is a 0: they were
# refused) and where characters are left after the number (they were ignored: '1.5abc'
# was 1.5); integer parts are rounded once; only ASCII digits are digits, 'inf' / 'infinity' / 'nan(chars)' are whole
# words; an array-like value that numpy cannot read is a TypeError in a[...] = v
CLIP_TEXT = [('e5', 'f'), ('x', 1), ('-', '2'), (' 1', '+'), ('.', '.5e1'), ('1e', 'F'),
             ('inx', 1), ('nan', 'infinity'), ('-INF', '1e3f'), ('  ', 1), ('', 1),
             ('\u0661', 1), ('1\u0662', 3), ('1.5abc', 2), ('1e3f ', 1e4), ('1 ', 2),
             ('nan(abc)', 1), ('nanx', 1), ('infx', 1), ('infin', 1), ('1/3', 1),
             ('0x10', 1), ('1e+', 2), ('1.5e-2.5', 2), ('nan(', 1), ('nan(a-b)', 1),
             ('+-1', 2), ('\t2', 3), ('\v2', 3), ('1ef', 2), ('.e1', 2), ('-.', 2),
             ('00012.500', 20), ('1e-0045', 1), ('0.1234567890123456789012', 1),
             # the integer part is a uint64 rounded once to float (numpy rounds twice)
             ('1152921573326323713', 2e30), ('1152921573326323713.5', 2e30),
             ('18446744073709551615', 2e30), ('18446744073709551617', 2e30)]


@pytest.mark.parametrize('case', range(len(CLIP_TEXT)))
def test_float_parameter_text(both, case):
    lo, hi = CLIP_TEXT[case]
    run_both(both, lambda mx: mx.nd.clip(mx.nd.array([-3.0, 0.5, 4.0]), lo, hi),
             'clip(%r, %r)' % (lo, hi))


@pytest.mark.parametrize('value', ['e5', '2', '1.5abc', ' 1', 'x'])
def test_string_values_written(both, value):
    run_both(both, lambda mx: mx.nd.full((2,), value), 'full %r' % value)
    run_both(both, lambda mx: _assign(mx.nd.zeros((3,)), slice(1, None), value),
             'a[1:] = %r' % value)


# --- dense -> row_sparse with bfloat16: the rows are chosen by value (-0.0 is a zero row),
# the data kept as bits (tostype raised TypeError on the structured dtype); copyto into a
# row_sparse array of another dtype converts values (a bfloat16 source was copied as its
# bits' integers: 1.5 became 16320.0; MXNet 1.9.1 fails on the dtype change there)
def test_bfloat16_dense_tostype_row_sparse(both):
    values = np.array([[1.5, 0], [0, -0.0], [-2.25, 3.0], [1e-40, 0]], np.float32)

    def scenario(mx):
        res = mx.nd.array(values).astype(BF16).tostype('row_sparse')
        return {'indices': res.indices.asnumpy(),
                'data': res.data.asnumpy().view(np.uint16), 'stype': res.stype}
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        mxnet, mxkv = both
        assert_same_bits(scenario(mxnet), scenario(mxkv), 'bf16 tostype row_sparse')


@pytest.mark.parametrize('src_dtype,dst_dtype,expected', [
    ('bf16', 'float32', None),   # a dtype change on one context: MXNet 1.9.1 fails
    ('bf16', 'int32', None),
    ('float64', 'bf16', None),
    ('float32', 'bf16', [[0x3fc0, 0], [0, 0], [0xc010, 0x4040]]),  # float32 across
    ('float32', 'int32', [[1, 0], [0, 0], [-2, 3]]),               # contexts: converted
])
def test_dense_copyto_row_sparse_converts(mxkv, src_dtype, dst_dtype, expected):
    """(test_sparse_copy_fidelity.py compares these rules with MXNet's, bf16 aside)"""
    values = np.array([[1.5, 0], [0, -0.0], [-2.25, 3.0]])
    src = (mxkv.nd.array(values).astype(BF16) if src_dtype == 'bf16'
           else mxkv.nd.array(values, dtype=src_dtype))
    dst = mxkv.nd.sparse.zeros('row_sparse', (3, 2), ctx=mxkv.cpu(0 if expected is None else 1),
                               dtype=BF16 if dst_dtype == 'bf16' else dst_dtype)
    if expected is None:
        with pytest.raises(mxkv.base.MXNetError, match='dtype change'):
            src.copyto(dst)
        assert dst.indices.asnumpy().tolist() == []
        return
    src.copyto(dst)
    dense = dst.tostype('default').asnumpy()
    got = dense.view(np.uint16) if dst_dtype == 'bf16' else dense
    assert got.tolist() == expected
    assert dst.indices.asnumpy().tolist() == [0, 2]


def test_bfloat16_row_sparse_set_number(mxkv):
    arr = mxkv.nd.sparse.zeros('row_sparse', (2, 2), dtype=BF16)
    arr[:] = 2.5
    assert arr.data.asnumpy().view(np.uint16).tolist() == [[0x4020] * 2] * 2


# --- bfloat16 row_sparse arithmetic works on the rows' values (bf16_t computes in float
# and keeps the high half): it computed on the raw bits (abs, sqrt, clip, rsp + rsp gave
# garbage; rsp * 2, -rsp, rsp + dense, astype raised or converted the bits' integers)
def _bf16_rsp(mx):
    return mx.nd.array([[1.5, 0], [0, -0.0], [-2.25, 3.0], [np.nan, 0]]).astype(
        BF16).tostype('row_sparse')


BF16_RSP = {
    '* 2': lambda mx: _bf16_rsp(mx) * 2, '2 *': lambda mx: 2 * _bf16_rsp(mx),
    '/ 2': lambda mx: _bf16_rsp(mx) / 2, '+ 0': lambda mx: _bf16_rsp(mx) + 0,
    '- 0': lambda mx: _bf16_rsp(mx) - 0, '+ 1': lambda mx: _bf16_rsp(mx) + 1,
    'neg': lambda mx: -_bf16_rsp(mx), 'abs': lambda mx: abs(_bf16_rsp(mx)),
    'nd.abs': lambda mx: mx.nd.abs(_bf16_rsp(mx)), 'sqrt': lambda mx: mx.nd.sqrt(_bf16_rsp(mx)),
    'square': lambda mx: mx.nd.square(_bf16_rsp(mx)),
    'sign': lambda mx: mx.nd.sign(_bf16_rsp(mx)),
    'clip': lambda mx: mx.nd.clip(_bf16_rsp(mx), -1, 2), 'sum': lambda mx: _bf16_rsp(mx).sum(),
    'astype float32': lambda mx: _bf16_rsp(mx).astype('float32'),
    'rsp + rsp': lambda mx: _bf16_rsp(mx) + _bf16_rsp(mx),
    'rsp * rsp': lambda mx: _bf16_rsp(mx) * _bf16_rsp(mx),
    'rsp + dense': lambda mx: _bf16_rsp(mx) + mx.nd.ones((4, 2)).astype(BF16),
    'rsp *= 2': lambda mx: _inplace(_bf16_rsp(mx), '__imul__', 2),
    'maximum': lambda mx: mx.nd.maximum(_bf16_rsp(mx), 1.0),
}


@pytest.mark.parametrize('name', sorted(BF16_RSP))
def test_bfloat16_row_sparse_arithmetic(both, name):
    import warnings

    def scenario(mx):
        with warnings.catch_warnings():
            warnings.simplefilter('ignore')
            res = BF16_RSP[name](mx)
            dense = res.tostype('default') if res.stype != 'default' else res
            values = dense.asnumpy()
            return {'stype': res.stype,
                    'dense': values.view(np.uint16) if values.dtype == BF16 else values}
    mxnet, mxkv = both
    assert_same_bits(scenario(mxnet), scenario(mxkv), name)
