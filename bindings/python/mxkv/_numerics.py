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
from fractions import Fraction
import math

import numpy as np

from .base import MXNetError

__all__ = ['dmlc_float', 'dmlc_double', 'strtof', 'param_str']

_MAX_DIGITS = 19


def param_str(value):
    """The string MXNet's frontend sends for an operator argument."""
    return str(value)


def _dmlc_parse(text, ftype, name):
    """dmlc::stof / dmlc::stod (ParseFloat<ftype, CheckRange=true>) on `text`; returns a
    numpy scalar, raises MXNetError where they throw std::out_of_range (an exponent
    beyond 38 / 308, e.g. 1e-39 for a float or 1e-320 for a double)."""
    is_double = ftype is np.float64
    max_exp = 308 if is_double else 38
    max_sig = ftype(1.79769313486231570 if is_double else np.float32(3.402823466))
    max_sig_neg = ftype(2.22507385850720139 if is_double else np.float32(1.175494351))
    s = text.lstrip()
    i, n = 0, len(s)
    positive = True
    if i < n and s[i] in '+-':
        positive = s[i] == '+'
        i += 1
    if i == 0 and len(s) == len(text) and not s[:1].isdigit() and not s[:1] == '.' and \
            not s.lower().startswith(('inf', 'nan')):
        # dmlc::stof / stod: "No conversion could be performed" (std::invalid_argument)
        raise MXNetError("Invalid Parameter format for %s expect %s but value='%s'"
                         % (name, 'float' if ftype is np.float32 else 'double', text))
    low = s[i:].lower()
    if low.startswith('inf'):
        return ftype(np.inf if positive else -np.inf)
    if low.startswith('nan'):
        return ftype(np.nan)
    predec = 0
    while i < n and s[i].isdigit():
        predec = (predec * 10 + ord(s[i]) - 48) & 0xFFFFFFFFFFFFFFFF
        i += 1
    value = ftype(float(predec)) if predec < (1 << 53) else ftype(predec)
    if i < n and s[i] == '.':
        i += 1
        val2, pow10, cnt = 0, 1, 0
        while i < n and s[i].isdigit():
            if cnt < _MAX_DIGITS:
                val2 = val2 * 10 + ord(s[i]) - 48
                pow10 *= 10
            i += 1
            cnt += 1
        value = ftype(value + ftype(float(val2) / float(pow10)))
    if i < n and s[i] in 'eE':
        i += 1
        frac = False
        if i < n and s[i] in '+-':
            frac = s[i] == '-'
            i += 1
        expon = 0
        while i < n and s[i].isdigit():
            expon = (expon * 10 + ord(s[i]) - 48) & 0xFFFFFFFF
            i += 1
        # ParseFloat<CheckRange=true> sets ERANGE here and dmlc::stof / stod throw
        # std::out_of_range, which MXNet's parameter parser reports as
        # "Out of range value for <field>" (whatever the sign of the value)
        if expon > max_exp or (expon == max_exp and ((not frac and value > max_sig)
                                                     or (frac and value < max_sig_neg))):
            raise MXNetError("Out of range value for %s, value='%s' (%s)"
                             % (name, text, 'float' if ftype is np.float32 else 'double'))
        scale = ftype(1.0)
        with np.errstate(over='ignore', under='ignore'):
            while expon >= 8:
                scale = ftype(scale * ftype(1e8))
                expon -= 8
            while expon > 0:
                scale = ftype(scale * ftype(10.0))
                expon -= 1
            value = ftype(value / scale) if frac else ftype(value * scale)
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
