"""``sum`` as MXNet 1.9.1's CPU operator computes it, bit for bit.

MXNet's ``sum`` (src/operator/tensor/broadcast_reduce_op.h: ReduceAxesCompute with
safe_acc false; broadcast_reduce-inl.h: seq_reduce_compute / seq_reduce_assign) gives
each output element its own sequential reduction over the reduced coordinates in
row-major order, in the element type (no wider accumulator), with mshadow's
``red::sum`` Kahan step (3rdparty/mshadow/mshadow/base.h)::

    y = x - r;  t = s + y;  r = isinf(t) ? 0 : (t - s) - y;  s = t    (s = r = 0 first)

every operation rounded to the element type (float16 as half_t: float arithmetic then
RNE to half; bfloat16 as bf16_t: float arithmetic then truncation to the high half).
mshadow's ``isinf_typed::IsInf`` is false for every bf16_t, so a bfloat16 sum keeps
the residual of an infinite t (inf - inf: 1 + inf + 2 sums to NaN there).
Integer sums wrap (the residual is always 0) and a bool sum is a logical or.

One output's steps form a single dependency chain (each step needs the previous
residual), which no reordering may shorten.  So:

* many outputs (an axis sum): the chains run side by side, one numpy operation per
  step over all of them (``_lanes``);
* few outputs (a whole-array sum): each chain runs in a plain Python loop over Python
  floats (doubles), rounded to float32 through a ``memoryview`` cast (C's float
  conversion: round to nearest even, overflow to inf, NaN bits kept; about 0.15 s per
  million elements).  A float32 sum or difference computed in double and rounded to
  float32 is the float32 operation's result (double rounding is innocuous for + and -
  since 53 >= 2 * 24 + 2; the same holds for float16 through float), so the loop
  reproduces the kernel.  Where |y| <= |s| the residual ``(t - s) - y`` is exact
  (Fast2Sum) and needs no rounding.  NaN results of the lanes are computed again in
  the loop, whose operand order for two NaNs is the kernel's.
"""
import math
import struct

import numpy as np

__all__ = ['kahan_sum_rows', 'reduce_shape', 'sum_values', 'sum', 'sum_axis']

# below this many outputs the per-chain Python loop beats one numpy call per step
_LANES_MIN = 32


def _bf16_rounder():
    buf = bytearray(4)
    as_f32, as_u32 = memoryview(buf).cast('f'), memoryview(buf).cast('I')

    def rnd(value):
        as_f32[0] = value
        as_u32[0] &= 0xFFFF0000
        return as_f32[0]
    return rnd


def _f16_round(value):
    return float(np.float16(value))


_HALF = struct.Struct('<e')


def _chain_f16(values):
    """one float16 Kahan chain, rounded through struct's 'e' format (round to nearest
    even, as half_t(float)); that refuses a finite value rounding to inf and makes every
    NaN one NaN, so such chains run again with numpy's conversion"""
    pack, unpack = _HALF.pack, _HALF.unpack
    s = c = 0.0
    try:
        for x in values:
            y, = unpack(pack(x - c))
            t, = unpack(pack(s + y))
            if t - t != 0:  # inf or NaN
                raise OverflowError
            if -s <= y <= s or s <= y <= -s:  # Fast2Sum: (t - s) - y is exact
                c = (t - s) - y
            else:
                c, = unpack(pack(t - s))
                c, = unpack(pack(c - y))
            s = t
    except OverflowError:
        return _chain(values, _f16_round, True)
    return s


def _chain_f64(values):
    """one Kahan chain in double (Python floats are doubles: nothing to round)"""
    s = c = 0.0
    for x in values:
        y = x - c
        t = s + y
        if t - t != 0 and t == t:  # +-inf
            c = 0.0
        else:
            c = (t - s) - y
        s = t
    return s


def _chain_f32(values):
    """one float32 Kahan chain; the rounding inlined (this is the hot loop)"""
    view = memoryview(bytearray(4)).cast('f')
    s = c = 0.0
    for x in values:
        view[0] = x - c
        y = view[0]
        view[0] = s + y
        t = view[0]
        if t - t != 0 and t == t:  # +-inf
            c = 0.0
        elif -s <= y <= s or s <= y <= -s:  # Fast2Sum: (t - s) - y is exact
            c = (t - s) - y
        else:
            view[0] = t - s
            view[0] = view[0] - y
            c = view[0]
        s = t
    return s


def _chain(values, rnd, nearest):
    """one Kahan chain with every result rounded by `rnd`; `nearest`: the rounding is
    to nearest (float16), so the residual is exact where |y| <= |s| and an infinite t
    resets it; else (bfloat16) neither"""
    s = c = 0.0
    for x in values:
        y = rnd(x - c)
        t = rnd(s + y)
        if nearest and t - t != 0 and t == t:  # +-inf
            c = 0.0
        elif nearest and (-s <= y <= s or s <= y <= -s):
            c = (t - s) - y
        else:
            c = rnd(rnd(t - s) - y)
        s = t
    return s


def _truncate_bf16(arr):
    """float32 values as bf16_t keeps them (the high half), in place"""
    bits = arr.view(np.uint32)
    np.bitwise_and(bits, np.uint32(0xFFFF0000), out=bits)


def _lanes(rows, bf16):
    """the Kahan chains of the columns of `rows` (M x N, float16/32/64, or float32
    holding bfloat16 values), side by side"""
    dtype, lanes = rows.dtype, rows.shape[1]
    fix = _truncate_bf16 if bf16 else (lambda arr: None)
    s, c = np.zeros(lanes, dtype), np.zeros(lanes, dtype)
    y, t = np.empty(lanes, dtype), np.empty(lanes, dtype)
    inf = np.empty(lanes, np.bool_)
    with np.errstate(all='ignore'):
        for x in rows:
            fix(np.subtract(x, c, out=y))
            fix(np.add(s, y, out=t))
            fix(np.subtract(t, s, out=c))
            fix(np.subtract(c, y, out=c))
            if not bf16:  # IsInf(bf16_t) is false
                np.copyto(c, 0, where=np.isinf(t, out=inf))
            s, t = t, s
    return s


_CHUNK_ELEMENTS = 1 << 20  # at most this many elements per step of _unrounded_sums


def _unrounded_sums(rows, bf16):
    """(sums, exact) for the Kahan chains of the columns of `rows` (M x N): `exact[j]`
    where no step of column j rounds, i.e. every partial sum (from +0.0) is a value of
    the element type, so each t = s + x is exact and every residual +0.0 (sums of small
    integers, masks, counts ...); `sums[j]` is then its sum (float64, exact).  The
    partial sums come from a float64 cumulative sum and are checked against the
    kernel's own step, operation by operation in the element type and bit for bit, so
    an exact column's sum is the kernel's.  Checked in chunks of rows growing from 16
    (most data fails in the first), on the columns still exact, until none is left."""
    fix = _truncate_bf16 if bf16 else (lambda arr: None)
    bits = {2: np.uint16, 4: np.uint32, 8: np.uint64}[rows.dtype.itemsize]
    count, lanes = rows.shape
    exact = np.ones(lanes, np.bool_)
    total = np.zeros(lanes, np.float64)
    cols = np.arange(lanes)  # the columns still exact
    start, size = 0, 16
    while start < count and len(cols):
        part = rows[start:start + max(1, min(size, _CHUNK_ELEMENTS // len(cols)))]
        start, size = start + len(part), size * 8
        if len(cols) < lanes:
            part = part[:, cols]
        with np.errstate(all='ignore'):
            # the float64 sums continue sequentially from the last chunk's
            partial = np.cumsum(np.concatenate((total[None, cols], part.astype(np.float64))),
                                axis=0)
            sums = partial.astype(rows.dtype)
            fix(sums)
            # the kernel's step from (s, r = +0.0): y = x - 0 = x; t = s + y; r = (t - s) - y
            t = part + sums[:-1]
            fix(t)
            resid = t - sums[:-1]
            fix(resid)
            resid -= part
            fix(resid)
        still = (t.view(bits) == sums[1:].view(bits)).all(axis=0)
        still &= ~resid.view(bits).any(axis=0)
        total[cols] = partial[-1]
        exact[cols[~still]] = False
        cols = cols[still]
    return total, exact


def kahan_sum_rows(rows, kind):
    """MXNet's sum of each column of `rows` (M x N numpy values, top to bottom) for an
    NDArray of element kind `kind`: 'float16', 'float32', 'float64', 'bfloat16' (rows
    hold the float32 values), else an integer or bool numpy dtype name.  Returns N sums
    as a numpy array of the rows' dtype."""
    if kind not in ('float16', 'float32', 'float64', 'bfloat16'):
        with np.errstate(all='ignore'):
            return rows.sum(axis=0, dtype=rows.dtype)  # wraps; bool: or
    if kind == 'float32':
        chain = _chain_f32
    elif kind == 'float64':
        chain = _chain_f64
    elif kind == 'float16':
        chain = _chain_f16
    else:
        def chain(values):
            return _chain(values, _bf16_rounder(), False)
    total, exact = _unrounded_sums(rows, kind == 'bfloat16')
    with np.errstate(all='ignore'):  # (the exact columns' sums are values of the dtype)
        sums = total.astype(rows.dtype)
    rest = np.flatnonzero(~exact)
    if len(rest) >= _LANES_MIN:
        sums[rest] = _lanes(rows if len(rest) == len(exact) else rows[:, rest],
                            kind == 'bfloat16')
        # which of two NaN operands an operation passes on depends on how the compiled
        # loop orders them; numpy's loops do not always order them as MXNet's kernel,
        # the Python loop does: NaN results are computed again there
        rest = rest[np.isnan(sums[rest])]
    for j in rest:
        sums[j] = chain(rows[:, j].tolist())
    return sums


def _bool_param(value, name):
    """dmlc's bool parameter: True / False / 1 / 0 (as str(value) says them)"""
    text = str(value).strip().lower()
    if text in ('true', '1'):
        return True
    if text in ('false', '0'):
        return False
    from ..base import MXNetError
    raise MXNetError("Invalid Parameter format for %s expect boolean but value='%s'"
                     % (name, value))


def _axis_param(axis):
    """`axis` as MXNet's optional Shape parameter takes it: None, an int or a sequence
    of ints (a float, a bool or a string is refused)"""
    from ..base import MXNetError

    def dim(value):
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
            raise MXNetError("Invalid Parameter format for axis expect Shape or None but "
                             "value='%s'" % (axis,))
        return int(value)
    if axis is None:
        return None
    if isinstance(axis, (list, tuple)):
        return tuple(dim(a) for a in axis)
    return (dim(axis),)


def reduce_shape(shape, axis, keepdims, exclude):
    """(axes reduced, output shape) of MXNet's ReduceAxesShapeImpl for an input of
    `shape`; MXNetError for bad parameters or axes"""
    from ..base import MXNetError
    axes = _axis_param(axis)
    keepdims, exclude = _bool_param(keepdims, 'keepdims'), _bool_param(exclude, 'exclude')
    ndim = len(shape)
    if not axes:
        return tuple(range(ndim)), ((1,) * ndim if keepdims else (1,))
    norm = sorted(a + ndim if a < 0 else a for a in axes)
    if any(a == b for a, b in zip(norm, norm[1:])):
        raise MXNetError('Reduction axes have duplicates %s' % (axes,))
    if norm[-1] >= ndim or norm[0] < 0:
        raise MXNetError('Reduction axis %s exceeds input dimensions %s' % (axes, shape))
    reduced = tuple(a for a in range(ndim) if (a in norm) != exclude)
    if keepdims:
        out = tuple(1 if a in reduced else d for a, d in enumerate(shape))
    else:
        out = tuple(d for a, d in enumerate(shape) if a not in reduced) or (1,)
    return reduced, out


def sum_values(values, reduced, kind):
    """MXNet's sum of the numpy array `values` over the axes `reduced` (each output's
    elements in row-major order of the reduced axes), as a flat numpy array of the
    kept axes' elements in row-major order"""
    kept = [a for a in range(values.ndim) if a not in reduced]
    count = math.prod(values.shape[a] for a in reduced)
    rows = np.moveaxis(values, list(reduced), list(range(len(reduced))))
    return kahan_sum_rows(rows.reshape(count, math.prod(values.shape[a] for a in kept)),
                          kind)


def sum(data, *args, **kwargs):  # pylint: disable=redefined-builtin
    """mx.nd.sum(data, axis=None, keepdims=False, exclude=False, out=None): data.sum(...)"""
    return data.sum(*args, **kwargs)


sum_axis = sum
