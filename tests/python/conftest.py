"""Shared setup for the mxkv pytest suites.

The library under test is chosen with MXKV_LIBRARY_PATH (default: the build
folder, target/release/libmxkv.so).  Pointing it at the venv's libmxnet.so
validates the binding against real MXNet.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..'))
BINDINGS = os.path.join(REPO, 'bindings', 'python')
if BINDINGS not in sys.path:
    sys.path.insert(0, BINDINGS)

CACHE = os.environ.get('MXKV_CACHE', os.path.join(REPO, '.cache'))
REF_PYTHON = os.path.join(REPO, '.venv', 'bin', 'python')  # MXNet 1.9.1's venv

# The start of a differential child script (run by run_child / compare_children): argv[1]
# names the library ('mxnet' or 'mxkv'), imported as `mx` (`nd` = mx.nd) with the other
# one kept out; warnings and log lines silenced.
CHILD_PRELUDE = r'''
import json, sys, warnings
warnings.simplefilter('ignore')
import logging
logging.disable(logging.CRITICAL)
lib = sys.argv[1]
import numpy as np
if lib == 'mxnet':
    sys.modules['mxkv'] = None
    import mxnet as mx
else:
    import mxkv as mx
nd = mx.nd
'''


def run_child(python, child, lib, cases, env=None):
    """Run the script `child` under `python` with argv ['mxnet' or 'mxkv', JSON of
    `cases`] (the bindings on its path, `env` added to the environment) and return the
    JSON its last output line holds; it must exit 0 within 600 s."""
    full_env = dict(os.environ, PYTHONPATH=BINDINGS, **(env or {}))
    proc = subprocess.run([python, '-c', child, lib, json.dumps(cases)], env=full_env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def compare_children(child, cases, width=150, shown=40):
    """run_child of `child` through MXNet (REF_PYTHON) and mxkv (this Python), each
    returning a dict case name -> result; assert both name the same cases with equal
    results (differences shown `width` characters each, the first `shown`) and return
    MXNet's dict"""
    ref = run_child(REF_PYTHON, child, 'mxnet', cases)
    got = run_child(sys.executable, child, 'mxkv', cases)
    assert sorted(ref) == sorted(got)
    bad = ['%s: mxnet %s, mxkv %s' % (k, str(ref[k])[:width], str(got[k])[:width])
           for k in sorted(ref) if ref[k] != got[k]]
    assert not bad, '%d of %d differ:\n%s' % (len(bad), len(ref), '\n'.join(bad[:shown]))
    return ref


def bits(value):
    """Comparable raw representation: (dtype, shape, bytes) of a numpy value."""
    arr = np.asarray(value)
    return (arr.dtype.str, arr.shape, np.ascontiguousarray(arr).tobytes())


def assert_same_bits(a, b, what=''):
    """Exact comparison of two results (numpy arrays, scalars, or nested dict/list)."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and sorted(a) == sorted(b), what
        for k in a:
            assert_same_bits(a[k], b[k], '%s[%r]' % (what, k))
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), what
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same_bits(x, y, '%s[%d]' % (what, i))
    elif isinstance(a, (str, bytes, type(None), bool)):
        assert a == b, '%s: %r != %r' % (what, a, b)
    else:
        ba, bb = bits(a), bits(b)
        assert ba == bb, '%s differs:\n mxnet: %r\n mxkv:  %r' % (what, a, b)


@pytest.fixture(scope='session')
def mxkv():
    import mxkv as m
    return m


@pytest.fixture(scope='session')
def mxnet():
    return pytest.importorskip('mxnet')


@pytest.fixture(scope='session')
def both(mxnet, mxkv):
    """(mxnet, mxkv) for differential tests"""
    return mxnet, mxkv
