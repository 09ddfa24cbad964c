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

Which NaN an operation passes on: MXNet's x86 code gives ``a``'s for ``a - b`` and
``a + b`` with two NaN operands.  CPython's ``a - b`` does too, but its ``a + b`` gives
``b``'s until the interpreter specialises the addition for floats (the first few times
an addition runs in a process), then ``a``'s: the loops set ``t = s`` themselves where
both are NaN.

With libmxkv (not a real libmxnet.so), float16, float32 and float64 sums of
``kahan_sum_rows`` run in the library instead: ``MXKVKahanSumColumns`` (src/ndarray/
kahan.rs) computes these same chains, bit for bit (NaN operands included), a step in a
few nanoseconds.  The Python code above stays for bfloat16, for sums of runs (csr), and
for libraries without that function.
"""
import math
import struct

import numpy as np

__all__ = ['kahan_sum_rows', 'kernel_sum_rows', 'python_sum_rows', 'kahan_sum_runs',
           'reduce_shape', 'sum_values', 'sum', 'sum_axis']

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


def _chain_f16(values, s=0.0, c=0.0):
    """one float16 Kahan chain (from the state s, c), rounded through struct's 'e'
    format (round to nearest even, as half_t(float)); that refuses a finite value
    rounding to inf and makes every NaN one NaN, so such chains run again with numpy's
    conversion"""
    pack, unpack = _HALF.pack, _HALF.unpack
    s0, c0 = s, c
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
        return _chain(values, _f16_round, True, s0, c0)
    return s


def _chain_f64(values, s=0.0, c=0.0):
    """one Kahan chain in double (Python floats are doubles: nothing to round)"""
    for x in values:
        y = x - c
        t = s + y
        if t != t and s != s:  # two NaNs: s's (see the module's docstring)
            t = s
        if t - t != 0 and t == t:  # +-inf
            c = 0.0
        else:
            c = (t - s) - y
        s = t
    return s


def _chain_f32(values, s=0.0, c=0.0):
    """one float32 Kahan chain (from the state s, c); the rounding inlined (this is
    the hot loop)"""
    view = memoryview(bytearray(4)).cast('f')
    for x in values:
        view[0] = x - c
        y = view[0]
        view[0] = s + y
        t = view[0]
        if t != t and s != s:  # two NaNs: s's (see the module's docstring)
            t = s
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


def _chain(values, rnd, nearest, s=0.0, c=0.0):
    """one Kahan chain (from the state s, c) with every result rounded by `rnd`;
    `nearest`: the rounding is to nearest (float16), so the residual is exact where
    |y| <= |s| and an infinite t resets it; else (bfloat16) neither"""
    for x in values:
        y = rnd(x - c)
        t = rnd(s + y)
        if t != t and s != s:  # two NaNs: s's (see the module's docstring)
            t = s
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


def _chain_of(kind):
    """the one-chain function for a float element kind"""
    if kind == 'float32':
        return _chain_f32
    if kind == 'float64':
        return _chain_f64
    if kind == 'float16':
        return _chain_f16

    def chain(values, s=0.0, c=0.0):
        return _chain(values, _bf16_rounder(), False, s, c)
    return chain


# dtype codes of the element kinds MXKVKahanSumColumns sums
_KERNEL_CODES = {'float32': 0, 'float64': 1, 'float16': 2}
_KERNEL = []  # [the library's function, or None], once looked up


def _kernel():
    """libmxkv's MXKVKahanSumColumns, or None (a real libmxnet.so has no such function)"""
    if not _KERNEL:
        from ..base import _LIB
        missing = getattr(_LIB, '_mxkv_missing', None)
        _KERNEL.append(None if missing is None or 'MXKVKahanSumColumns' in missing
                       else _LIB.MXKVKahanSumColumns)
    return _KERNEL[0]


def kernel_sum_rows(rows, kind):
    """kahan_sum_rows(rows, kind) computed by the library (MXKVKahanSumColumns), or
    None where it cannot be (another kind, or no such function)"""
    fn = _kernel()
    if fn is None or kind not in _KERNEL_CODES or rows.dtype.name != kind:
        return None
    from ..base import check_call
    rows = np.ascontiguousarray(rows)
    sums = np.empty(rows.shape[1], rows.dtype)
    check_call(fn(_KERNEL_CODES[kind], rows.ctypes.data, rows.shape[0], rows.shape[1],
                  sums.ctypes.data))
    return sums


def kahan_sum_rows(rows, kind):
    """MXNet's sum of each column of `rows` (M x N numpy values, top to bottom) for an
    NDArray of element kind `kind`: 'float16', 'float32', 'float64', 'bfloat16' (rows
    hold the float32 values), else an integer or bool numpy dtype name.  Returns N sums
    as a numpy array of the rows' dtype."""
    sums = kernel_sum_rows(rows, kind)
    return python_sum_rows(rows, kind) if sums is None else sums


def python_sum_rows(rows, kind):
    """kahan_sum_rows computed in numpy and Python (see the module's docstring)"""
    if kind not in ('float16', 'float32', 'float64', 'bfloat16'):
        with np.errstate(all='ignore'):
            return rows.sum(axis=0, dtype=rows.dtype)  # wraps; bool: or
    chain = _chain_of(kind)
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


def _ragged_lanes(values, starts, lengths, bf16):
    """The Kahan chains of runs of `values` (run i: `lengths[i]` values from
    `starts[i]`) side by side, longest first: at step k the runs longer than k are
    lanes [0, a) (a shrinking), one numpy operation per step over them, as `_lanes`.
    Stops where fewer than _LANES_MIN runs go on; returns (order: run of each lane,
    s, c: the lanes' states, k: the steps taken, a: the lanes not finished)."""
    dtype, count = values.dtype, len(lengths)
    fix = _truncate_bf16 if bf16 else (lambda arr: None)
    order = np.argsort(-lengths, kind='stable')
    ends, begins = -lengths[order], starts[order]
    s, c = np.zeros(count, dtype), np.zeros(count, dtype)
    y, t = np.empty(count, dtype), np.empty(count, dtype)
    inf = np.empty(count, np.bool_)
    k = 0
    with np.errstate(all='ignore'):
        while True:
            a = int(np.searchsorted(ends, -k, side='left'))  # runs longer than k
            if a < _LANES_MIN:
                break
            s_a, c_a, y_a, t_a = s[:a], c[:a], y[:a], t[:a]
            fix(np.subtract(values[begins[:a] + k], c_a, out=y_a))
            fix(np.add(s_a, y_a, out=t_a))
            fix(np.subtract(t_a, s_a, out=c_a))
            fix(np.subtract(c_a, y_a, out=c_a))
            if not bf16:  # IsInf(bf16_t) is false
                np.copyto(c_a, 0, where=np.isinf(t_a, out=inf[:a]))
            np.copyto(s_a, t_a)
            k += 1
    return order, s, c, k, a


def kahan_sum_runs(values, lengths, kind):
    """MXNet's Kahan sums of consecutive runs of the 1-d numpy `values` (run i: the
    next `lengths[i]` values, in order; an empty run sums to 0), each run one chain
    from (s, r) = (0, 0) as mshadow's red::sum (sum(csr) over an axis: the stored
    values of each row or column).  `kind` as for kahan_sum_rows.  Returns a numpy
    array of len(lengths) sums of the values' dtype."""
    lengths = np.asarray(lengths, np.int64)
    starts = np.zeros(len(lengths), np.int64)
    np.cumsum(lengths[:-1], out=starts[1:])
    if kind not in ('float16', 'float32', 'float64', 'bfloat16'):
        # integers wrap: differences of the wrapped running sums are the wrapped sums
        with np.errstate(all='ignore'):
            running = np.concatenate((np.zeros(1, values.dtype),
                                      np.cumsum(values, dtype=values.dtype)))
            return running[starts + lengths] - running[starts]
    chain = _chain_of(kind)
    sums = np.zeros(len(lengths), values.dtype)
    redo = range(len(lengths))
    if len(lengths) >= _LANES_MIN:
        order, s, c, k, a = _ragged_lanes(values, starts, lengths, kind == 'bfloat16')
        for j in range(a):  # the few long runs go on one by one
            i = order[j]
            s[j] = chain(values[starts[i] + k:starts[i] + lengths[i]].tolist(),
                         float(s[j]), float(c[j]))
        sums[order] = s
        # (NaN results again in the loop, whose operand order is the kernel's)
        redo = np.flatnonzero(np.isnan(sums))
    for i in redo:
        if lengths[i]:
            sums[i] = chain(values[starts[i]:starts[i] + lengths[i]].tolist())
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
