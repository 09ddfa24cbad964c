"""The Kahan chains of mxkv/ndarray/_reduce.py against MXNet 1.9.1, bit for bit, where
the Python loops could go astray: which NaN a sum of two NaNs passes on, in a process
whose interpreter has not yet specialised the loops' float additions (CPython's generic
``a + b`` gives ``b``'s NaN, the specialised one and MXNet ``a``'s)."""
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import BINDINGS

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
