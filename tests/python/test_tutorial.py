"""examples/tutorial.py prints exactly what the same script prints on real MXNet 1.9.1."""
import os
import subprocess
import sys

import pytest

from conftest import REPO, BINDINGS

TUTORIAL = os.path.join(REPO, 'examples', 'tutorial.py')


def _run(backend):
    env = dict(os.environ)
    env['MXKV_TUTORIAL_BACKEND'] = backend
    env['PYTHONPATH'] = BINDINGS + os.pathsep + env.get('PYTHONPATH', '')
    proc = subprocess.run([sys.executable, TUTORIAL], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr.decode(errors='replace')
    return proc.stdout


def test_tutorial_output_is_byte_identical_to_mxnet():
    pytest.importorskip('mxnet')
    ours = _run('mxkv')
    theirs = _run('mxnet')
    assert ours == theirs
    assert ours.count(b'update on key:') == 7


def test_tutorial_uses_mxkv():
    with open(TUTORIAL) as fin:
        assert 'import mxkv as mx' in fin.read()
