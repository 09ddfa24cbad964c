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
    """what must match between mxnet and mxkv (see the module docstring)"""
    try:
        res = fn(mx)
    except Exception as exc:  # pylint: disable=broad-except
        if isinstance(exc, AssertionError):
            return ('raise', 'AssertionError')
        names = [c.__name__ for c in type(exc).__mro__]
        return ('raise', 'MXNetError' if 'MXNetError' in names else type(exc).__name__)
    if hasattr(res, 'asnumpy'):
        arr = res.asnumpy()
        return ('nd', type(res).__name__, res.stype, arr.dtype.str, arr.shape,
                np.ascontiguousarray(arr).tobytes())
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
