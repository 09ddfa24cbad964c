"""How MXNet 1.9.1 turns Python numbers into the constants its kernels use.

MXNet's Python frontend passes every operator argument as ``str(value)``; the
C++ side parses it again:

* ``float`` / ``double`` fields of operator parameter structs go through
  dmlc-core's own fast parser (``dmlc::stof`` / ``dmlc::stod``), which is *not*
  correctly rounded: e.g. ``lr=5.692038748222122e-09`` becomes the float32 one
  ulp away from ``numpy.float32(5.692038748222122e-09)``;
* elements of ``Tuple<float>`` fields (``lrs``, ``wds`` of ``multi_sgd_update``)
  are read with ``std::istream >> float`` (glibc ``strtof``, correctly rounded).

To be bit-identical to MXNet the optimizers of this package go through the
same string round trip.  The algorithm below reproduces dmlc-core's
documented parsing steps (integer part, up to 19 fraction digits divided in
double precision, then scaling by powers of ten in the target precision).
"""
import ctypes
import ctypes.util
from fractions import Fraction
import math
import operator

import numpy as np

from .base import MXNetError

__all__ = ['dmlc_float', 'dmlc_double', 'strtof', 'param_str', 'c_pow', 'numpy1_sum',
           'np1_scalar_op']

_MAX_DIGITS = 19
_DIGITS = '0123456789'  # dmlc::isdigit (str.isdigit takes other scripts' digits too)


def param_str(value):
    """The string MXNet's frontend sends for an operator argument."""
    return str(value)


def _int_to(ftype, number):
    """static_cast<ftype>(uint64 number): rounded once to nearest even (numpy's float32
    of a Python int goes through double, which rounds twice)"""
    if ftype is np.float32 and number.bit_length() > 24:
        shift = number.bit_length() - 24
        quot, rem = divmod(number, 1 << shift)
        half = 1 << (shift - 1)
        if rem > half or (rem == half and quot & 1):
            quot += 1
        number = quot << shift  # 25 bits at most: a double holds it exactly
    return ftype(float(number))


def _dmlc_parse(text, ftype, name):
    """MXNet's parameter parser for a float / double field (dmlc::FieldEntry<float /
    double>::Set: dmlc::stof / stod, ParseFloat<ftype, CheckRange=true>) on `text`;
    returns a numpy scalar.  MXNetError where it throws: no character read ("No
    conversion could be performed"), characters left after the number ("Some trailing
    characters could not be parsed"), an exponent beyond 38 / 308 (std::out_of_range,
    e.g. 1e-39 for a float or 1e-320 for a double, whatever the sign of the value)."""
    is_double = ftype is np.float64
    kind = 'double' if is_double else 'float'
    max_exp = 308 if is_double else 38
    max_sig = ftype(1.79769313486231570 if is_double else np.float32(3.402823466))
    max_sig_neg = ftype(2.22507385850720139 if is_double else np.float32(1.175494351))
    n = len(text)
    i = n - len(text.lstrip(' \t\r\n\f'))  # dmlc::isspace
    positive = True
    if i < n and text[i] in '+-':
        positive = text[i] == '+'
        i += 1

    def digits(i):
        j = i
        while j < n and text[j] in _DIGITS:
            j += 1
        return j

    low = text[i:i + 8].lower()
    matched = 0
    while matched < len(low) and low[matched] == 'infinity'[matched]:
        matched += 1
    if matched in (3, 8):  # "inf" or "infinity"
        value, i = ftype(np.inf), i + matched
    elif low.startswith('nan'):  # NaN's sign is dropped
        value, i = ftype(np.nan), i + 3
        if i < n and text[i] == '(':  # nan(chars)
            j = i + 1
            while j < n and (text[j] in _DIGITS or text[j] == '_' or
                             'a' <= text[j].lower() <= 'z'):
                j += 1
            if j >= n or text[j] != ')':
                raise MXNetError("Invalid NAN literal for %s: '%s'" % (name, text))
            i = j + 1
    else:
        j = digits(i)
        predec = int(text[i:j] or '0') & 0xFFFFFFFFFFFFFFFF
        value, i = _int_to(ftype, predec), j
        if i < n and text[i] == '.':
            j = digits(i + 1)
            kept = text[i + 1:j][:_MAX_DIGITS]  # digits past 19 are read and dropped
            if kept:
                value = ftype(value + ftype(float(int(kept)) / float(10 ** len(kept))))
            i = j
        if i < n and text[i] in 'eE':
            i += 1
            negative_exp = False
            if i < n and text[i] in '+-':
                negative_exp = text[i] == '-'
                i += 1
            j = digits(i)
            expon = int(text[i:j] or '0') & 0xFFFFFFFF
            i = j
            if expon > max_exp or (expon == max_exp and (
                    value < max_sig_neg if negative_exp else value > max_sig)):
                raise MXNetError("Out of range value for %s, value='%s' (%s)" % (name, text, kind))
            scale = ftype(1.0)
            with np.errstate(over='ignore', under='ignore'):
                while expon >= 8:
                    scale = ftype(scale * ftype(1e8))
                    expon -= 8
                while expon > 0:
                    scale = ftype(scale * ftype(10.0))
                    expon -= 1
                value = ftype(value / scale) if negative_exp else ftype(value * scale)
        if i < n and text[i] in 'fF':  # a C float suffix
            i += 1
    if i == 0:
        raise MXNetError("Invalid Parameter format for %s expect %s but value='%s'"
                         % (name, kind, text))
    if i < n:
        raise MXNetError("Some trailing characters could not be parsed: '%s' (%s, value='%s')"
                         % (text[i:], name, text))
    return value if positive else ftype(-value)


def dmlc_float(value, name='a float parameter'):
    """float32 that an MXNet ``float`` operator parameter (`name`) holds when given
    `value`; MXNetError where MXNet refuses it as out of range."""
    return _dmlc_parse(param_str(value), np.float32, name)


def dmlc_double(value, name='a double parameter'):
    """float64 that an MXNet ``double`` operator parameter (`name`) holds when given
    `value`; MXNetError where MXNet refuses it as out of range."""
    return _dmlc_parse(param_str(value), np.float64, name)


def strtof(value):
    """Correctly rounded decimal -> float32 of ``str(value)`` (glibc strtof)."""
    text = param_str(value)
    d = float(text)
    f = np.float32(d)
    if not math.isfinite(d) or not np.isfinite(f):
        return f
    exact = Fraction(text)
    cands = (np.nextafter(f, np.float32(-np.inf)), f, np.nextafter(f, np.float32(np.inf)))
    return min(cands, key=lambda c: (abs(Fraction(float(c)) - exact),
                                     int(np.array(c, np.float32).view(np.uint32)) & 1))


_LIBM_POW = []  # (powf, pow) of the C library, loaded at the first c_pow


def _libm_pow():
    if not _LIBM_POW:
        fns = None
        for name in ('libm.so.6', ctypes.util.find_library('m')):
            try:
                lib = ctypes.CDLL(name)
                fns = (lib.powf, lib.pow)
                break
            except (OSError, TypeError, AttributeError):
                continue
        if fns is not None:
            fns[0].restype = ctypes.c_float
            fns[0].argtypes = [ctypes.c_float, ctypes.c_float]
            fns[1].restype = ctypes.c_double
            fns[1].argtypes = [ctypes.c_double, ctypes.c_double]
        _LIBM_POW.append(fns)
    return _LIBM_POW[0]


def c_pow(base, exponent):
    """MXNet's ``math::pow(a, b)`` (mshadow_op::power) of two numpy scalars of one dtype:
    the C library's ``powf`` on the float values for float32 and float16 (the float result
    rounded to half_t), ``pow`` for float64; returns a scalar of the base's dtype.

    numpy's own power is not libm's: from numpy 1.24 its float32 and float64 loops (SIMD
    dispatched, scalars included) differ from glibc's powf / pow in the last bit for
    about a sixth of an optimizer's (beta, t) pairs."""
    dt = np.asarray(base).dtype
    fns = _libm_pow()
    if fns is None:  # pragma: no cover - no C math library: not MXNet's last bits
        with np.errstate(all='ignore'):
            return dt.type(np.power(base, dt.type(exponent)))
    if dt == np.float64:
        return np.float64(fns[1](float(base), float(exponent)))
    return dt.type(np.float32(fns[0](float(np.float32(base)), float(np.float32(exponent)))))


_PW_BLOCKSIZE = 128   # numpy's PW_BLOCKSIZE
_NPY_BUFSIZE = 8192   # numpy 1.x's reduction chunk (NPY_BUFSIZE)


def _pairwise_split(n):
    half = n // 2
    return half - half % 8


def _pairwise_leaves(n, start, out):
    if n <= _PW_BLOCKSIZE:
        out.append((start, n))
        return
    n2 = _pairwise_split(n)
    _pairwise_leaves(n2, start, out)
    _pairwise_leaves(n - n2, start + n2, out)


def _pairwise_combine(n, start, sums):
    if n <= _PW_BLOCKSIZE:
        return sums[start]
    n2 = _pairwise_split(n)
    return _pairwise_combine(n2, start, sums) + _pairwise_combine(n - n2, start + n2, sums)


def _pairwise_sum(values, acc):
    """numpy's @TYPE@_pairwise_sum of the 1-D `values` with `acc` accumulators: below 8
    values one after the other; up to 128, eight running sums ((r0+r1)+(r2+r3)) +
    ((r4+r5)+(r6+r7)) then the rest; above, the two halves (the first a multiple of 8)"""
    n = values.size
    values = values.astype(acc)
    if n < 8:
        total = acc(0)
        for v in values:
            total = acc(total + v)
        return total
    leaves = []
    _pairwise_leaves(n, 0, leaves)
    by_len = {}
    for start, m in leaves:
        by_len.setdefault(m, []).append(start)
    sums = {}
    for m, starts in by_len.items():   # the leaves of one length, side by side
        starts = np.array(starts)
        block = values[starts[:, None] + np.arange(m)]
        if m < 8:
            res = np.zeros(len(starts), acc)
            for i in range(m):
                res = res + block[:, i]
        else:
            r = block[:, 0:8].copy()
            top = m - m % 8
            for i in range(8, top, 8):
                r = r + block[:, i:i + 8]
            res = ((r[:, 0] + r[:, 1]) + (r[:, 2] + r[:, 3])) + \
                ((r[:, 4] + r[:, 5]) + (r[:, 6] + r[:, 7]))
            for i in range(top, m):
                res = res + block[:, i]
        sums.update(zip(starts.tolist(), res))
    return _pairwise_combine(n, 0, sums)


def numpy1_sum(array):
    """``array.sum()`` as numpy 1.x (1.23.5, MXNet 1.9.1's) computes it for a contiguous
    float16 / float32 / float64 numpy array: chunks of 8192 values, each a pairwise sum
    (float accumulators for float16, the running total rounded to half between chunks),
    added one after the other.  numpy 2 reduces arrays of more than 8192 values in
    another order, so MXNet-side Python arithmetic on such sums (LBSGD's LARS factor)
    would change with the numpy a user has."""
    flat = np.ascontiguousarray(array).reshape(-1)
    dtype = flat.dtype.type
    acc = np.float32 if dtype is np.float16 else dtype
    total = None
    with np.errstate(over='ignore', invalid='ignore'):
        for start in range(0, max(flat.size, 1), _NPY_BUFSIZE):
            part = _pairwise_sum(flat[start:start + _NPY_BUFSIZE], acc)
            total = part if total is None else acc(acc(total) + part)
            if dtype is np.float16:
                total = np.float16(total)
        return dtype(total)


_NEP50 = int(np.__version__.split('.')[0]) >= 2


def _np1_python_type(value):
    """the numpy type numpy 1.x gives a Python number meeting a numpy scalar"""
    if isinstance(value, bool):
        return np.bool_
    if isinstance(value, int):
        return np.int64 if -2 ** 63 <= value < 2 ** 63 else None
    if isinstance(value, float):
        return np.float64
    return None


def np1_scalar_op(op, a, b):
    """``op(a, b)`` (operator.mul / sub / truediv / pow) as numpy 1.x, which MXNet 1.9.1
    runs on, computes it when one operand is a numpy scalar and the other a Python
    bool / int / float: the Python number counts as a bool_ / int64 / float64 scalar,
    so np.float32(0.8) * 0.5 is a float64 (numpy 2, NEP 50, keeps float32).  A float64
    power is the C library's pow, as numpy 1.23's scalar power.  Otherwise plain
    ``op(a, b)``."""
    if _NEP50 and isinstance(a, np.generic) != isinstance(b, np.generic):
        scalar, number = (a, b) if isinstance(a, np.generic) else (b, a)
        ptype = _np1_python_type(number)
        if ptype is not None and scalar.dtype.kind in 'biuf':
            dt = np.promote_types(scalar.dtype, ptype).type
            a, b = dt(a), dt(b)
            if op is operator.pow and dt is np.float64:
                return c_pow(a, b)
            with np.errstate(all='ignore'):
                return op(a, b)
    return op(a, b)
