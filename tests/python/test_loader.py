"""Library discovery and loading (mxkv._lib)."""
import os
import subprocess
import sys

from conftest import BINDINGS, REPO


def _probe(env_path, code='import mxkv; print(mxkv.base.library_path)'):
    env = dict(os.environ)
    env.pop('MXKV_LIBRARY_PATH', None)
    if env_path is not None:
        env['MXKV_LIBRARY_PATH'] = env_path
    env['PYTHONPATH'] = BINDINGS
    return subprocess.run([sys.executable, '-c', code], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, env=env, universal_newlines=True, timeout=120)


def test_explicit_path_is_used(mxkv):
    assert os.path.samefile(mxkv.base.library_path,
                            os.environ.get('MXKV_LIBRARY_PATH', mxkv.base.library_path))


def test_missing_explicit_path_fails_clearly(tmp_path):
    proc = _probe(str(tmp_path / 'nope.so'))
    assert proc.returncode != 0
    assert 'MXKV_LIBRARY_PATH' in proc.stderr and 'nope.so' in proc.stderr


def test_library_without_the_api_is_refused(tmp_path):
    libc = '/lib/x86_64-linux-gnu/libc.so.6'
    if not os.path.exists(libc):
        return
    proc = _probe(libc)
    assert proc.returncode != 0 and 'does not export' in proc.stderr


def test_build_folder_search_order():
    from mxkv import _lib
    saved = os.environ.pop('MXKV_LIBRARY_PATH', None)
    try:
        cands = [p for p, _ in _lib._candidates()]
    finally:
        if saved is not None:
            os.environ['MXKV_LIBRARY_PATH'] = saved
    pkg = os.path.join(BINDINGS, 'mxkv')
    assert cands[0] == os.path.join(pkg, 'libmxkv.so')
    assert os.path.join(REPO, 'target', 'release', 'libmxkv.so') in cands


def test_version(mxkv):
    assert mxkv.base.version() == 10901
