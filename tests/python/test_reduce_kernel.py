"""MXNet's Kahan sums (mxkv/ndarray/_reduce.py) against MXNet 1.9.1, bit for bit:

* the compiled chains (MXKVKahanSumColumns, src/ndarray/kahan.rs) against the Python
  chains and MXNet's sum over many shapes, dtypes and seeds, with infinities, NaN
  payloads (signalling ones too), negative zeros and values near the maximum;
* the C function's refusals;
* the Python loops where they could go astray: which NaN a sum of two NaNs passes on,
  in a process whose interpreter has not yet specialised the loops' float additions
  (CPython's generic ``a + b`` gives ``b``'s NaN, the specialised one and MXNet ``a``'s).
"""
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import BINDINGS, assert_same_bits

BF16 = np.dtype([('bfloat16', np.uint16)])

# two NaN payloads meet in `s + y` (the third element), then a third NaN
_NANS = {
    'float32': np.array([0x7fc00001, 0x3fc00000, 0xffc12345, 0x7fc00000], np.uint32),
    'float64': np.array([0x7ff8000000000001, 0x3ff8000000000000, 0xfff8000012345000,
                         0x7ff8000000000000], np.uint64),
    'float16': np.array([0x7e01, 0x3e00, 0xfe55, 0x7e00], np.uint16),
    # (bfloat16 keeps the high half of the float32 values: payloads there)
    'bfloat16': np.array([0x7fc10000, 0x3fc00000, 0xffc20000, 0x7fc00000], np.uint32),
}
_VIEW = {'float32': np.float32, 'float64': np.float64, 'float16': np.float16,
         'bfloat16': np.float32}

# each case in a fresh interpreter: its first chain is the interpreter's first
_COLD = r'''
import sys
import numpy as np
from mxkv.ndarray import _reduce
kind, how, bits = sys.argv[1], sys.argv[2], [int(b) for b in sys.argv[3:]]
utype = {'float32': np.uint32, 'float64': np.uint64, 'float16': np.uint16,
         'bfloat16': np.uint32}[kind]
ftype = {'float32': np.float32, 'float64': np.float64, 'float16': np.float16,
         'bfloat16': np.float32}[kind]
values = np.array(bits, utype).view(ftype)
if how == 'chain':
    out = np.array([_reduce._chain_of(kind)(values.tolist())], ftype)
else:  # the stored values of one csr row
    out = _reduce.kahan_sum_runs(values, [len(values)], kind)
if kind == 'bfloat16':
    out = out.view(np.uint32) >> 16
print(int(out.view(utype)[0]) if kind != 'bfloat16' else int(out[0]))
'''


def _cold(kind, how):
    env = dict(os.environ, PYTHONPATH=BINDINGS)
    done = subprocess.run([sys.executable, '-c', _COLD, kind, how] +
                          [str(int(b)) for b in _NANS[kind]],
                          capture_output=True, text=True, timeout=120, env=env, check=False)
    assert done.returncode == 0, done.stderr
    return int(done.stdout)


def _mxnet_sum(mx, kind):
    values = _NANS[kind].view(_VIEW[kind])
    if kind == 'bfloat16':
        return int(mx.nd.array(values).astype(BF16).sum().asnumpy().view(np.uint16)[0])
    res = mx.nd.array(values, dtype=kind).sum().asnumpy()
    return int(res.view(_NANS[kind].dtype)[0])


@pytest.mark.parametrize('kind', sorted(_NANS))
def test_cold_chain_passes_nans_on_as_mxnet(mxnet, kind):
    expected = _mxnet_sum(mxnet, kind)
    assert _cold(kind, 'chain') == expected, hex(expected)


def test_cold_csr_row_sum_passes_nans_on_as_mxnet(mxnet):
    values = _NANS['float32'].view(np.float32)
    csr = mxnet.nd.sparse.csr_matrix((values, [0, 1, 2, 3], [0, 4]), shape=(1, 4))
    expected = int(csr.sum(axis=1).asnumpy().view(np.uint32)[0])
    assert expected == _mxnet_sum(mxnet, 'float32')
    assert _cold('float32', 'runs') == expected, hex(expected)


# --- the compiled chains ----------------------------------------------------------------
KINDS = ('float16', 'float32', 'float64')
_UINT = {'float16': np.uint16, 'float32': np.uint32, 'float64': np.uint64}
# (bit patterns: infinities, quiet NaNs of both signs, a signalling NaN, -0.0, the largest
# finite values, the smallest subnormal)
_SPECIAL_BITS = {
    'float16': [0x7c00, 0xfc00, 0x7e01, 0xfe55, 0x7c01, 0x8000, 0x7bff, 0xfbff, 0x0001],
    'float32': [0x7f800000, 0xff800000, 0x7fc00001, 0xffc12345, 0x7f800001, 0x80000000,
                0x7f7fffff, 0xff7fffff, 0x00000001],
    'float64': [0x7ff0000000000000, 0xfff0000000000000, 0x7ff8000000000001,
                0xfff8000012345000, 0x7ff0000000000001, 0x8000000000000000,
                0x7fefffffffffffff, 0xffefffffffffffff, 0x0000000000000001],
}
# which of them a case sprinkles in: none, the non-NaN ones, all
_SPECIALS = {'none': [], 'inf': [0, 1, 5, 6, 7, 8], 'nan': list(range(9))}
# (rows, columns): a whole-array sum is one column
SHAPES = [(0, 1), (1, 1), (2, 1), (3, 1), (17, 1), (1000, 1), (4097, 1), (100000, 1),
          (0, 4), (1, 5), (5, 3), (300, 40), (40, 300), (2000, 7)]


def _kernel_module():
    from mxkv.ndarray import _reduce
    if _reduce._kernel() is None:
        pytest.skip('the library has no MXKVKahanSumColumns (not libmxkv)')
    return _reduce


def _rows(kind, shape, seed, special):
    """`shape` values of `kind` over many binades (as test_ndarray_sum.py's), one in 40
    replaced by a special value"""
    rng = np.random.RandomState(seed)
    count = shape[0] * shape[1]
    spread = {'float16': 6, 'float32': 25, 'float64': 60}[kind]
    with np.errstate(all='ignore'):
        values = (rng.randn(count) * np.exp(rng.uniform(-spread, spread, count))).astype(kind)
    picks = _SPECIALS[special]
    if picks and count:
        specials = np.array([_SPECIAL_BITS[kind][i] for i in picks], _UINT[kind]).view(kind)
        at = rng.rand(count) < 1 / 40
        values[at] = specials[rng.randint(0, len(specials), at.sum())]
    return values.reshape(shape)


def _bits(arr):
    return np.ascontiguousarray(arr).view(_UINT[arr.dtype.name]).tolist()


@pytest.mark.parametrize('special', sorted(_SPECIALS))
@pytest.mark.parametrize('seed', [0, 1])
@pytest.mark.parametrize('shape', SHAPES)
@pytest.mark.parametrize('kind', KINDS)
def test_kernel_as_python_and_mxnet(mxnet, mxkv, kind, shape, seed, special):
    reduce = _kernel_module()
    rows = _rows(kind, shape, seed * 1000 + shape[0] + shape[1], special)
    kernel = reduce.kernel_sum_rows(rows, kind)
    assert kernel.dtype == rows.dtype and kernel.shape == (shape[1],)
    what = '%s %s seed %d %s' % (kind, shape, seed, special)
    assert_same_bits(_bits(reduce.python_sum_rows(rows, kind)), _bits(kernel), what)
    if shape[0] == 0:
        return
    # the same sums from MXNet's operator, and from mxkv's NDArray.sum (kernel or not)
    for lib in (mxnet, mxkv):
        if shape[1] == 1:  # a whole-array sum
            res = lib.nd.array(rows[:, 0], dtype=kind).sum()
        else:
            res = lib.nd.array(rows, dtype=kind).sum(axis=0)
        assert_same_bits(_bits(res.asnumpy()), _bits(kernel), '%s: %s' % (lib.__name__, what))


def test_kernel_of_strided_and_transposed_rows(mxnet):
    """rows that are not C-contiguous (a transposed matrix, every other row) are summed
    as the same values laid out contiguously"""
    reduce = _kernel_module()
    rows = _rows('float32', (400, 30), 5, 'inf')
    for view in (rows.T, rows[::2], rows[:, ::3]):
        got = reduce.kernel_sum_rows(view, 'float32')
        assert _bits(got) == _bits(reduce.kernel_sum_rows(view.copy(), 'float32'))
        want = mxnet.nd.array(view.copy()).sum(axis=0).asnumpy()
        assert _bits(got) == _bits(want)


def test_kernel_leaves_other_kinds_to_python():
    reduce = _kernel_module()
    assert reduce.kernel_sum_rows(np.ones((3, 2), np.int32), 'int32') is None
    assert reduce.kernel_sum_rows(np.ones((3, 2), np.float32), 'bfloat16') is None
    # (rows of another dtype than the kind named)
    assert reduce.kernel_sum_rows(np.ones((3, 2), np.float64), 'float32') is None


def test_kernel_refusals(mxkv):
    """MXKVKahanSumColumns refuses what it cannot sum, writing nothing"""
    _kernel_module()
    lib = mxkv.base._LIB
    fn = lib.MXKVKahanSumColumns
    rows = np.arange(6, dtype=np.float32)
    out = np.full(3, 7, np.float32)

    def fails(code, rows_ptr, num_rows, num_cols, out_ptr, text):
        assert fn(code, rows_ptr, num_rows, num_cols, out_ptr) == -1
        msg = lib.MXGetLastError().decode()
        assert msg.startswith('MXKVKahanSumColumns: ') and text in msg, msg
        assert out.tolist() == [7, 7, 7]

    data, dest = rows.ctypes.data, out.ctypes.data
    fails(4, data, 2, 3, dest, 'for float16, float32 and float64 elements, not int32')
    fails(12, data, 2, 3, dest, 'not bfloat16')
    fails(13, data, 2, 3, dest, 'Unknown type enum 13')
    fails(0, None, 2, 3, dest, 'rows is NULL')
    fails(0, data, 2, 3, None, 'out (output pointer) is NULL')
    fails(0, data, 2, 3, data + 8, 'out overlaps rows')
    fails(0, data, 2 ** 62, 2 ** 3, dest, 'do not fit in memory')
    fails(0, data, 1, 2 ** 63, dest, 'do not fit in memory')
    # nothing announced: nothing read or written (NULL pointers allowed)
    assert fn(0, None, 0, 0, None) == 0
    assert fn(0, None, 0, 3, dest) == 0 and out.tolist() == [0, 0, 0]
    assert fn(0, data, 2, 3, dest) == 0 and out.tolist() == [3, 5, 7]
    assert fn(1, None, 5, 0, None) == 0
