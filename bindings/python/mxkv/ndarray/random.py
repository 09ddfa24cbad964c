"""Random sampling (``mxnet.nd.random``): uniform, normal, randn, randint, seeded by
``mxkv.random.seed``.

libmxkv has no operators, so samples come from numpy's PCG64 generator and are copied
into a new (or the given ``out``) NDArray.  The API follows MXNet 1.9.1: parameters as
numbers (every element from one distribution) or as NDArrays (one distribution per
element, ``shape`` more samples each), ``dtype`` float16/float32/float64 (int32/int64
for randint), ``ctx``, ``out``; the parameter checks MXNet's operators make raise
MXNetError with MXNet's wording.  Seeding works as in MXNet: one generator for all CPU
contexts (``seed(s)`` and ``seed(s, ctx=mx.cpu(k))`` are the same), one per GPU
(``seed(s)`` gives each GPU its own stream, ``seed(s, ctx=mx.gpu(i))`` the stream of
``s`` alone), seeds taken modulo 2**32 (MXNet passes them as a C int), and a fresh
process draws the same numbers as one seeded with 0.  The numbers themselves are not
MXNet's (MXNet's CPU sampler runs several mt19937 streams in parallel chunks): a seed
makes mxkv reproducible, not bit-identical to MXNet.
"""
import ctypes
import threading

import numpy as np

from ..base import MXNetError, MXKVUsageError, integer_types, numeric_types, _Null
from ..context import Context, current_context
from .ndarray import NDArray, array, _shape_tuple

__all__ = ['uniform', 'normal', 'randn', 'randint', 'seed']

_LOCK = threading.Lock()
_GENERATORS = {}          # generator key -> np.random.Generator
_SEED = [0]               # the last global seed (applies to generators created later)
_FLOAT_DTYPES = ('float16', 'float32', 'float64')
_INT_DTYPES = ('int32', 'int64')


def _key(ctx):
    """CPU-like contexts share one generator (as in MXNet); a GPU has its own."""
    if ctx.device_type == 'gpu':
        return ('gpu', ctx.device_id)
    return ('cpu', 0)


def _new_generator(key, seed_state, global_seed):
    if key[0] == 'gpu' and global_seed:  # seed(s): each GPU's stream also depends on its id
        material = [seed_state, 2, key[1]]
    else:
        material = [seed_state]
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(material)))


def _generator(ctx):
    key = _key(ctx)
    gen = _GENERATORS.get(key)
    if gen is None:
        gen = _GENERATORS[key] = _new_generator(key, _SEED[0], True)
    return gen


def seed(seed_state, ctx='all'):
    """Seed the generators of all contexts (``ctx='all'``) or of the one `ctx` uses."""
    if isinstance(seed_state, bool) or not isinstance(seed_state, integer_types):
        raise ValueError('seed_state must be int')
    state = ctypes.c_int(int(seed_state)).value & 0xFFFFFFFF  # MXNet: a C int
    with _LOCK:
        if isinstance(ctx, str) and ctx == 'all':
            _SEED[0] = state
            _GENERATORS.clear()
        else:
            ctx = ctx if isinstance(ctx, Context) else Context(ctx)
            key = _key(ctx)
            _GENERATORS[key] = _new_generator(key, state, False)


def _dtype_name(dtype, allowed, default, op):
    if dtype is _Null or dtype is None or (isinstance(dtype, str) and dtype == 'None'):
        return default
    try:
        name = np.dtype(dtype).name
    except TypeError:
        name = str(dtype)
    if name not in allowed:
        raise MXNetError("Invalid Input: '%s', valid values are: {%s}, in operator %s"
                         % (name, ', '.join("'%s'" % a for a in ('None',) + allowed), op))
    return name


def _out_shape(shape, out, op):
    """the sample shape: `shape`, else out's, else (1,) (MXNet's frontend default)"""
    if shape is _Null or shape is None:
        return out.shape if out is not None else None
    shape = _shape_tuple(shape)
    if out is not None and out.shape != shape:
        raise MXNetError('Shape inconsistent, Provided = %s, inferred shape=%s (in operator '
                         '%s)' % (list(out.shape), list(shape), op))
    return shape


def _deliver(values, out, dtype, ctx):
    """`values` (numpy) into `out` or a new NDArray"""
    if out is not None:
        out[:] = values.astype(out._np_dtype, copy=False)
        return out
    return array(values.astype(dtype, copy=False), ctx=ctx, dtype=dtype)


def _draw(kind, ctx, size, params):
    """numpy samples (float64, or int64 for randint) of `size` from the generator of `ctx`"""
    with _LOCK:
        gen = _generator(ctx)
        if kind == 'uniform':
            low, high = params
            unit = gen.random(size)
            return low + (high - low) * unit
        if kind == 'normal':
            loc, scale = params
            return loc + scale * gen.standard_normal(size)
        low, high = params
        return gen.integers(low, high, size=size, dtype=np.int64, endpoint=False)


def _below_high(values, low, high, dtype):
    """round-to-dtype may carry a uniform sample up to `high`: keep [low, high)"""
    res = values.astype(dtype)
    hi = np.broadcast_to(np.asarray(high, dtype=dtype), res.shape)
    lo = np.broadcast_to(np.asarray(low, dtype=dtype), res.shape)
    bad = (res >= hi) & (hi > lo)
    if bad.any():
        res[bad] = np.nextafter(hi[bad], lo[bad])
    return res


def _sample(kind, params, shape, dtype, ctx, out, op, check):
    """one distribution for all samples (numbers) or one per element (NDArrays)"""
    if isinstance(params[0], NDArray):
        for par in params[1:]:
            if not isinstance(par, NDArray):
                raise MXKVUsageError('Distribution parameters must all have the same type, '
                                     'but got both %s and %s.' % (type(params[0]), type(par)))
        base_shape = params[0].shape
        for par in params[1:]:
            if par.shape != base_shape:
                raise MXNetError('%s: parameter shapes differ: %s vs %s'
                                 % (op, base_shape, par.shape))
        extra = () if shape is _Null or shape is None else _shape_tuple(shape)
        full = base_shape + extra
        if out is not None and out.shape != full:
            raise MXNetError('Shape inconsistent, Provided = %s, inferred shape=%s (in '
                             'operator %s)' % (list(out.shape), list(full), op))
        pars = [p.asnumpy().astype(np.float64).reshape(base_shape + (1,) * len(extra))
                for p in params]
        ctx = params[0].context if out is None else out.context
        values = _draw(kind, ctx, full, pars)
        if kind == 'uniform':
            values = _below_high(values, pars[0], pars[1], dtype)
        return _deliver(values, out, dtype, ctx)
    if isinstance(params[0], numeric_types) and not isinstance(params[0], bool):
        for par in params[1:]:
            if not isinstance(par, numeric_types) or isinstance(par, bool):
                raise MXKVUsageError('Distribution parameters must all have the same type, '
                                     'but got both %s and %s.' % (type(params[0]), type(par)))
        pars = [float(p) for p in params]
        check(*pars)
        if out is None and (shape is _Null or shape is None):
            shape = 1
        size = _out_shape(shape, out, op)
        ctx = (out.context if out is not None else
               current_context() if ctx is None or ctx is _Null else ctx)
        values = _draw(kind, ctx, size, pars)
        if kind == 'uniform':
            values = _below_high(values, pars[0], pars[1],
                                 out._np_dtype if out is not None else dtype)
        return _deliver(values, out, dtype, ctx)
    raise ValueError('Distribution parameters must be either NDArray or numbers, but got %s.'
                     % type(params[0]))


def _check_uniform(low, high):
    if not high >= low:
        raise MXNetError('Check failed: param.high >= param.low (%s vs. %s) : low must be '
                         'less or equal to high in uniform distribution' % (high, low))


def _check_normal(_loc, scale):
    if not scale > 0:
        raise MXNetError('Check failed: param.scale > 0 (%s vs. 0) : scale parameter in '
                         'gaussian has to be positive' % (scale,))


def uniform(low=0, high=1, shape=_Null, dtype=_Null, ctx=None, out=None, **kwargs):
    """Samples from the uniform distribution on [low, high) (numbers or NDArrays)."""
    _no_kwargs(kwargs, 'uniform')
    dtype = _dtype_name(dtype, _FLOAT_DTYPES, _default_dtype(out), '_random_uniform')
    return _sample('uniform', [low, high], shape, dtype, ctx, out, '_random_uniform',
                   _check_uniform)


def normal(loc=0, scale=1, shape=_Null, dtype=_Null, ctx=None, out=None, **kwargs):
    """Samples from the normal distribution N(loc, scale**2) (numbers or NDArrays)."""
    _no_kwargs(kwargs, 'normal')
    dtype = _dtype_name(dtype, _FLOAT_DTYPES, _default_dtype(out), '_random_normal')
    return _sample('normal', [loc, scale], shape, dtype, ctx, out, '_random_normal',
                   _check_normal)


def randn(*shape, **kwargs):
    """Normal samples of shape `shape` (``loc``, ``scale``, ``dtype``, ``ctx``, ``out``
    as keywords)."""
    loc = kwargs.pop('loc', 0)
    scale = kwargs.pop('scale', 1)
    dtype = kwargs.pop('dtype', _Null)
    ctx = kwargs.pop('ctx', None)
    out = kwargs.pop('out', None)
    if not isinstance(loc, (int, float, NDArray)) or not isinstance(scale, (int, float, NDArray)):
        raise MXKVUsageError('randn: loc and scale must be numbers or NDArrays')
    return normal(loc, scale, shape if shape else _Null, dtype, ctx, out, **kwargs)


def randint(low, high, shape=_Null, dtype=_Null, ctx=None, out=None, **kwargs):
    """Integers drawn uniformly from [low, high) (int32 unless `dtype` says int64)."""
    _no_kwargs(kwargs, 'randint')
    dtype = _dtype_name(dtype, _INT_DTYPES, 'int32', '_random_randint')
    if not isinstance(low, integer_types) or not isinstance(high, integer_types):
        raise MXKVUsageError('randint: low and high must be integers')

    def check(lo, hi):
        if not hi > lo:
            raise MXNetError('Check failed: param.high > param.low (%d vs. %d) : low must be '
                             'less than high in randint distribution' % (hi, lo))

    return _sample('randint', [int(low), int(high)], shape, dtype, ctx, out,
                   '_random_randint', check)


def _default_dtype(out):
    return out._np_dtype.name if out is not None else 'float32'


def _no_kwargs(kwargs, name):
    kwargs.pop('name', None)
    if kwargs:
        raise MXKVUsageError('%s: unexpected arguments %s' % (name, sorted(kwargs)))


# --- the operator-style names of mxnet.nd (random_uniform, random_normal, uniform, normal):
# every argument optional, no default shape (shape or out is required, as in MXNet)
def _op_style(fn, op, defaults):
    def wrapper(*args, **kwargs):
        names = list(defaults)
        params = [defaults[n] for n in names]
        for i, val in enumerate(args[:len(names)]):
            params[i] = val
        for i, nme in enumerate(names):
            if nme in kwargs:
                params[i] = kwargs.pop(nme)
        rest = args[len(names):]
        keys = ['shape', 'ctx', 'dtype', 'out']
        opts = dict(zip(keys, rest))
        for k in keys:
            if k in kwargs:
                opts[k] = kwargs.pop(k)
        kwargs.pop('name', None)
        if kwargs:
            raise MXKVUsageError('%s: unexpected arguments %s' % (op, sorted(kwargs)))
        shape, out = opts.get('shape', _Null), opts.get('out')
        if (shape is _Null or shape is None) and out is None:
            raise MXNetError('Operator %s inferring shapes failed: no shape and no out'
                             % op)
        ctx = opts.get('ctx')
        if isinstance(ctx, str):
            ctx = Context(ctx)
        return fn(params[0], params[1], shape=shape, dtype=opts.get('dtype', _Null),
                  ctx=None if ctx is _Null else ctx, out=out)
    wrapper.__name__ = op
    wrapper.__doc__ = ('%s(%s=%r, %s=%r, shape=_Null, ctx=_Null, dtype=_Null, out=None): '
                       'MXNet\'s operator form of %s (shape or out required)'
                       % ((op,) + tuple(x for kv in defaults.items() for x in kv)
                          + (fn.__name__,)))
    return wrapper


random_uniform = _op_style(uniform, 'random_uniform', {'low': 0, 'high': 1})
random_normal = _op_style(normal, 'random_normal', {'loc': 0, 'scale': 1})
