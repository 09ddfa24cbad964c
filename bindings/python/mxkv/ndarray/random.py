"""Random sampling (``mxnet.nd.random``): uniform, normal, randn, randint, seeded by
``mxkv.random.seed``.

libmxkv has no operators: the samples are computed here (the engines' numbers by the
library's MXKVMTSeed / MXKVMTDraw, or by numpy with the same arithmetic when the library
lacks them, as a real libmxnet.so does) and copied into a new (or the given ``out``)
NDArray.  On CPU contexts they are MXNet 1.9.1's numbers, bit for bit:
the same 1024 std::mt19937 engines seeded the same way, the same split of a draw over
them, libstdc++'s distributions and the C library's log, MXNet's arithmetic with the
parameters (see the notes above ``_MTBank``).  GPU contexts draw from numpy's PCG64 (MXNet
uses cuRAND's Philox there), seeded reproducibly but not MXNet's numbers.  The API follows
MXNet 1.9.1: parameters as numbers (every element from one distribution) or as NDArrays
(one distribution per element, ``shape`` more samples each), ``dtype``
float16/float32/float64 (int32/int64 for randint), ``ctx``, ``out``; the parameter checks
MXNet's operators make raise MXNetError with MXNet's wording.  Seeding works as in MXNet:
one generator for all CPU contexts (``seed(s)`` and ``seed(s, ctx=mx.cpu(k))`` are the
same), one per GPU (``seed(s)`` gives each GPU its own stream, ``seed(s, ctx=mx.gpu(i))``
the stream of ``s`` alone), seeds taken modulo 2**32 (MXNet passes them as a C int), and a
fresh process draws the same numbers as one seeded with 0.
"""
import ctypes
import ctypes.util
import math
import os
import threading

import numpy as np

from ..base import MXNetError, MXKVUsageError, integer_types, numeric_types, _Null
from ..context import Context, current_context
from .ndarray import NDArray, array, _shape_tuple, _op_context

__all__ = ['uniform', 'normal', 'randn', 'randint', 'seed']

_LOCK = threading.Lock()
_GENERATORS = {}          # generator key -> np.random.Generator
_SEED = [0]               # the last global seed (applies to generators created later)
_FLOAT_DTYPES = ('float16', 'float32', 'float64')
_INT_DTYPES = ('int32', 'int64')


# --- MXNet 1.9.1's CPU sampler ---------------------------------------------------------
# MXNet's CPU parallel random resource (src/resource.cc, include/mxnet/random_generator.h,
# src/operator/random/sampler.h): MXNET_CPU_PARALLEL_RAND_COPY (default 1) copies of a
# RandGenerator shared by all CPU contexts, each holding kNumRandomStates = 1024
# std::mt19937 engines; the engine j of copy i is std::mt19937(base + j),
# base = i * 16 + seed * 127 (mod 2**32; seed 0 in a fresh process).  Each sampling
# operator takes the next copy round robin (copy 1 first after a seed, then 2, ..., 0).
# An operator drawing N numbers splits them into
# nthread = min(ceil(N / 64), 1024) chunks of step = ceil(N / nthread) consecutive outputs;
# chunk j draws with engine j, which keeps its state for the next operator.  The result
# does not depend on the number of OpenMP threads.  Each number comes from libstdc++'s
# distributions constructed afresh per number: uniform_real_distribution<FType> (FType =
# float for float32 outputs, double for float64 and float16), normal_distribution<FType>
# (Marsaglia's polar method; a fresh distribution returns y * mult and drops the cached
# x * mult), and randint's (w1 << 31) + w2 modulo (high - low).
_MT_N = 624
_MT_M = 397
_NUM_STATES = 1024
_MIN_PER_THREAD = 64
_RAND_MAGIC = 127
_U32 = np.uint32


def _init_genrand(seeds):
    """std::mt19937(seed).seed() key arrays for each of `seeds` (uint32), shape (len, 624)"""
    key = np.empty((len(seeds), _MT_N), dtype=np.uint64)
    prev = np.asarray(seeds, dtype=np.uint64) & np.uint64(0xFFFFFFFF)
    key[:, 0] = prev
    mul, mask = np.uint64(1812433253), np.uint64(0xFFFFFFFF)
    for i in range(1, _MT_N):
        prev = (mul * (prev ^ (prev >> np.uint64(30))) + np.uint64(i)) & mask
        key[:, i] = prev
    return key.astype(_U32)


def _twist(old):
    """the next block of mt19937 key words, for every row at once"""
    new = np.empty_like(old)
    upper, lower, mat = _U32(0x80000000), _U32(0x7FFFFFFF), _U32(0x9908B0DF)

    def step(cur, nxt, far):
        y = (cur & upper) | (nxt & lower)
        return far ^ (y >> _U32(1)) ^ ((y & _U32(1)) * mat)

    d = _MT_N - _MT_M  # 227
    new[:, :d] = step(old[:, :d], old[:, 1:d + 1], old[:, _MT_M:])
    new[:, d:2 * d] = step(old[:, d:2 * d], old[:, d + 1:2 * d + 1], new[:, :d])
    new[:, 2 * d:_MT_N - 1] = step(old[:, 2 * d:_MT_N - 1], old[:, 2 * d + 1:],
                                   new[:, d:_MT_N - 1 - d])
    new[:, _MT_N - 1] = step(old[:, _MT_N - 1], new[:, 0], new[:, _MT_M - 1])
    return new


def _temper(key):
    y = key ^ (key >> _U32(11))
    y ^= (y << _U32(7)) & _U32(0x9D2C5680)
    y ^= (y << _U32(15)) & _U32(0xEFC60000)
    return y ^ (y >> _U32(18))


class _MTBank(object):
    """MXNet's 1024 std::mt19937 engines of one CPU parallel random resource"""

    def __init__(self, base, compiled=True):
        seed = _kernel('MXKVMTSeed') if compiled else None
        if seed is None:
            self.key = _init_genrand((np.arange(_NUM_STATES, dtype=np.uint64) + base))
            self.pos = np.full(_NUM_STATES, _MT_N, dtype=np.int64)  # 624: twist before use
        else:
            from ..base import check_call
            self.key = np.empty((_NUM_STATES, _MT_N), dtype=_U32)
            self.pos = np.empty(_NUM_STATES, dtype=np.int64)
            check_call(seed(base & 0xFFFFFFFF, *_states(self), _NUM_STATES))
        self._pending = None

    def peek(self, m, n):
        """the next `n` 32-bit outputs of engines 0..m-1, shape (m, n), without consuming"""
        pos = self.pos[:m]
        nblocks = max(1, -(-int(pos.max() + n) // _MT_N))
        keys = [self.key[:m]]
        for _ in range(nblocks - 1):
            keys.append(_twist(keys[-1]))
        stream = np.concatenate([_temper(k) for k in keys], axis=1)
        self._pending = (m, keys)
        first = int(pos[0])
        if (pos == first).all():  # after a seed, and for fixed-size draws
            return stream[:, first:first + n]
        idx = pos[:, None] + np.arange(n, dtype=np.int64)[None, :]
        return np.take_along_axis(stream, idx, axis=1)

    def consume(self, counts):
        """engines 0..m-1 of the last peek move on by counts[j] outputs"""
        m, keys = self._pending
        self._pending = None
        newp = self.pos[:m] + np.asarray(counts, dtype=np.int64)
        blk = newp // _MT_N
        rem = newp - blk * _MT_N
        back = (rem == 0) & (blk > 0)
        blk[back] -= 1
        rem[back] = _MT_N
        stacked = np.stack(keys)
        self.key[:m] = stacked[blk, np.arange(m)]
        self.pos[:m] = rem


class _CPUResource(object):
    """the copies of MXNet's CPU parallel random resource, seeded with `seed`"""

    def __init__(self, seed_state):
        self.seed_state = seed_state
        self.banks = [None] * _NUM_COPIES
        self.ptr = 0

    def next_bank(self):
        """ResourceParallelRandom::GetNext: ++ptr % copies"""
        self.ptr = (self.ptr + 1) % _NUM_COPIES
        if self.banks[self.ptr] is None:
            base = (self.ptr * _MAX_NUM_GPUS + self.seed_state * _RAND_MAGIC) & 0xFFFFFFFF
            self.banks[self.ptr] = _MTBank(base)
        return self.banks[self.ptr]


def _num_copies():
    try:
        return max(1, int(os.environ.get('MXNET_CPU_PARALLEL_RAND_COPY', '1')))
    except ValueError:
        return 1


_NUM_COPIES = _num_copies()  # MXNet reads it once, when the library loads
_MAX_NUM_GPUS = 16

_LOGF = []  # the C library's logf, loaded at the first float32 normal draw


def _logf():
    if not _LOGF:
        fn = None
        for name in ('libm.so.6', ctypes.util.find_library('m')):
            try:
                fn = ctypes.CDLL(name).logf
                break
            except (OSError, TypeError, AttributeError):
                continue
        if fn is not None:
            fn.restype = ctypes.c_float
            fn.argtypes = [ctypes.c_float]
        _LOGF.append(fn)
    return _LOGF[0]


def _log(values):
    """the C library's log (double) / logf (float) of each value: MXNet's numbers come from
    them, numpy's own (SIMD) log differs in the last bit for about a fifth of them"""
    if values.dtype == np.float32:
        logf = _logf()
        if logf is None:  # pragma: no cover - no C math library: not MXNet's last bits
            return np.log(values)
        return np.array(list(map(logf, values.tolist())), dtype=np.float32)
    return np.array(list(map(math.log, values.tolist())), dtype=np.float64)


def _canonical(words, ftype):
    """libstdc++'s generate_canonical<FType> from std::mt19937 outputs: one word for float,
    two (low word first) for double.  MXNet's build does not clamp a sum that rounds up
    to 1 (later libstdc++ returns the number below 1): a float32 uniform() can be 1.0"""
    if ftype == np.float32:
        return words.astype(np.float32) / np.float32(4294967296.0)
    return (words[..., 0::2].astype(np.float64)
            + words[..., 1::2].astype(np.float64) * 4294967296.0) / 18446744073709551616.0


def _split(n):
    """LaunchRNG's chunks: (number of engines, outputs per engine)"""
    nthread = min(-(-n // _MIN_PER_THREAD), _NUM_STATES)
    return nthread, -(-n // nthread)


_ROUND = 1024  # outputs per engine drawn at once (bounds the memory for big draws)


_KERNELS = {}  # libmxkv's MXKVMTSeed / MXKVMTDraw (None: a real libmxnet.so lacks them)


def _kernel(name):
    """libmxkv's compiled MXKVMTSeed or MXKVMTDraw, or None (a real libmxnet.so has
    neither: numpy then computes the same numbers)"""
    if name not in _KERNELS:
        from ..base import _LIB
        missing = getattr(_LIB, '_mxkv_missing', None)
        _KERNELS[name] = (None if missing is None or name in missing
                          else getattr(_LIB, name))
    return _KERNELS[name]


def _states(bank):
    key, pos = bank.key, bank.pos
    assert key.flags.c_contiguous and key.dtype == _U32 and key.shape == (_NUM_STATES, _MT_N)
    assert pos.flags.c_contiguous and pos.dtype == np.int64 and pos.shape == (_NUM_STATES,)
    return (key.ctypes.data_as(ctypes.POINTER(ctypes.c_uint32)),
            pos.ctypes.data_as(ctypes.POINTER(ctypes.c_int64)))


_DRAW_KIND = {'uniform': 0, 'normal': 1, 'randint': 2}


def _compiled_draw(bank, kind, n, ftype):
    """_mt_draw(bank, kind, n, ftype) drawn by the library (the same engines, split and
    arithmetic, the C library's log), or None without MXKVMTDraw"""
    fn = _kernel('MXKVMTDraw')
    if fn is None:
        return None
    from ..base import check_call
    if kind == 'randint':
        res, flag = np.empty(n, dtype=np.int64), 6
    else:
        res, flag = np.empty(n, dtype=ftype), (0 if ftype == np.float32 else 1)
    check_call(fn(_DRAW_KIND[kind], flag, *_states(bank), _NUM_STATES, n, res.ctypes.data))
    return res


def _mt_draw(bank, kind, n, ftype, compiled=True):
    """MXNet's n draws before the parameters are applied: canonical uniforms (FType),
    standard normals (FType), or randint's int64 (w1 << 31) + w2.  They come from the
    library (MXKVMTDraw) unless `compiled` is false or it lacks it."""
    if compiled and n > 0:
        res = _compiled_draw(bank, kind, n, ftype)
        if res is not None:
            return res
    res = np.empty(n, dtype=np.int64 if kind == 'randint' else ftype)
    if n <= 0:
        return res
    nthread, step = _split(n)
    starts = np.arange(nthread, dtype=np.int64) * step
    remaining = np.maximum(np.minimum(starts + step, n) - starts, 0)
    filled = np.zeros(nthread, dtype=np.int64)
    while remaining.any():
        want = np.minimum(remaining, _ROUND)
        top = int(want.max())
        if kind == 'normal':
            per = 1 if ftype == np.float32 else 2
            npairs = top + top // 3 + 32
            words = bank.peek(nthread, 2 * per * npairs)
            u = _canonical(words, ftype).reshape(nthread, npairs, 2)
            two, one = ftype(2), ftype(1)
            x = two * u[:, :, 0] - one
            y = two * u[:, :, 1] - one
            r2 = x * x + y * y
            ok = (r2 <= one) & (r2 != ftype(0))
            rank = np.cumsum(ok, axis=1)
            take = ok & (rank <= want[:, None])
            got = np.minimum(rank[:, -1], want)
            # pairs consumed: up to the want-th accepted one, or all of them
            used = np.where(rank[:, -1] >= want, np.argmax(rank >= want[:, None], axis=1) + 1,
                            npairs)
            used[want == 0] = 0
            bank.consume(used * 2 * per)
            rr = r2[take]
            mult = np.sqrt(ftype(-2) * _log(rr) / rr)
            vals = y[take] * mult
            dest = (starts + filled)[:, None] + rank - 1
            res[dest[take]] = vals
        else:
            per = 1 if (kind == 'uniform' and ftype == np.float32) else 2
            words = bank.peek(nthread, per * top)
            bank.consume(want * per)
            if kind == 'uniform':
                vals = _canonical(words, ftype)
            else:
                w = words.astype(np.uint64)
                vals = ((w[:, 0::2] << np.uint64(31)) + w[:, 1::2]).view(np.int64)
            take = np.arange(top)[None, :] < want[:, None]
            dest = (starts + filled)[:, None] + np.arange(top)[None, :]
            res[dest[take]] = vals[take]
            got = want
        filled += got
        remaining -= got
    return res


def _key(ctx):
    """CPU-like contexts share one generator (as in MXNet); a GPU has its own."""
    if ctx.device_type == 'gpu':
        return ('gpu', ctx.device_id)
    return ('cpu', 0)


def _new_generator(key, seed_state, global_seed):
    if key[0] == 'cpu':  # MXNet's CPU resource: engines seeded with seed * 127 + j
        return _CPUResource(seed_state)
    if global_seed:  # seed(s): each GPU's stream also depends on its id
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


def _as_ftype(par, ftype):
    """a parameter in the C++ arithmetic with FType: integers convert to FType first"""
    return par.astype(ftype) if par.dtype.kind in 'iub' else par


def _to_otype(values, otype):
    """OType(value): mshadow's half_t converts a double through float"""
    if otype == 'float16' and values.dtype == np.float64:
        values = values.astype(np.float32)
    return values.astype(otype)


def _draw(kind, ctx, shape, params, otype):
    """the samples of `shape` in dtype `otype` from the generator of `ctx`; params are flat
    numpy arrays (one element: one distribution; else one per element, MXNet's nBatch
    consecutive samples each)"""
    size = int(np.prod(shape, dtype=np.int64))
    with _LOCK:
        gen = _generator(ctx)
        if isinstance(gen, _CPUResource):
            ftype = np.float32 if otype == 'float32' else np.float64
            raw = _mt_draw(gen.next_bank(), kind, size, ftype)
        else:
            raw = None
            if kind == 'uniform':
                unit = gen.random(size)
            elif kind == 'normal':
                unit = gen.standard_normal(size)
    nparm = params[0].size
    if nparm == 1:
        pars = [p.reshape(()) for p in params]
    else:
        idx = np.arange(size, dtype=np.int64) // (1 + (size - 1) // nparm)
        pars = [p[idx] for p in params]
    if raw is None:  # a GPU: numpy's generator, not MXNet's numbers
        if kind == 'randint':
            with _LOCK:
                vals = gen.integers(pars[0], pars[1], size=size, dtype=np.int64)
        elif kind == 'uniform':
            vals = pars[0].astype(np.float64) + (pars[1].astype(np.float64)
                                                 - pars[0].astype(np.float64)) * unit
            vals = _below_high(vals, pars[0], pars[1], otype)
        else:
            vals = pars[0].astype(np.float64) + pars[1].astype(np.float64) * unit
        return _to_otype(np.asarray(vals), otype).reshape(shape)
    if pars[0].dtype == np.float16:  # mshadow's half_t: each operation in float, to half
        h, f = np.float16, np.float32
        raw = raw.astype(f)
        if kind == 'uniform':
            vals = ((pars[1] - pars[0]).astype(f) * raw).astype(h)
            vals = (pars[0].astype(f) + vals.astype(f)).astype(h)
        else:
            vals = (raw * pars[1].astype(f)).astype(h)
            vals = (vals.astype(f) + pars[0].astype(f)).astype(h)
    elif kind == 'uniform':  # lower + (upper - lower) * uniform()
        low, high = pars
        if low.dtype.kind in 'iub':
            vals = low.astype(raw.dtype) + (high - low).astype(raw.dtype) * raw
        else:
            vals = low + (high - low) * raw
    elif kind == 'normal':  # normal() * std + mean
        vals = raw * _as_ftype(pars[1], raw.dtype) + _as_ftype(pars[0], raw.dtype)
    else:  # lower + rand_int64() % (upper - lower), C's truncating remainder
        vals = pars[0] + np.fmod(raw, pars[1] - pars[0])
    return _to_otype(np.asarray(vals), otype).reshape(shape)


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
        pars = [p.asnumpy().reshape(-1) for p in params]
        # NDArray parameters: the operator's result is on cpu(k) for cpu_pinned(k)
        ctx = _op_context(params[0].context) if out is None else out.context
        otype = out._np_dtype.name if out is not None else dtype
        return _deliver(_draw(kind, ctx, full, pars, otype), out, dtype, ctx)
    if isinstance(params[0], numeric_types) and not isinstance(params[0], bool):
        for par in params[1:]:
            if not isinstance(par, numeric_types) or isinstance(par, bool):
                raise MXKVUsageError('Distribution parameters must all have the same type, '
                                     'but got both %s and %s.' % (type(params[0]), type(par)))
        check(*[float(p) for p in params])
        if out is None and (shape is _Null or shape is None):
            shape = 1
        size = _out_shape(shape, out, op)
        ctx = (out.context if out is not None else
               current_context() if ctx is None or ctx is _Null else ctx)
        # MXNet passes the parameters as float (randint: int64) tensors
        ptype = np.int64 if kind == 'randint' else np.float32
        pars = [np.array([p], dtype=ptype) for p in params]
        otype = out._np_dtype.name if out is not None else dtype
        return _deliver(_draw(kind, ctx, _shape_tuple(size), pars, otype), out, dtype, ctx)
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
