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


def _copy_package(dest):
    """A copy of the mxkv package (without any library) at dest/mxkv."""
    import shutil
    shutil.copytree(os.path.join(BINDINGS, 'mxkv'), os.path.join(str(dest), 'mxkv'),
                    ignore=shutil.ignore_patterns('__pycache__', '*.so', '*.dylib', '*.dll'))
    return str(dest)


def _import_error(path_entry, cwd):
    env = dict(os.environ)
    env.pop('MXKV_LIBRARY_PATH', None)
    env['PYTHONPATH'] = path_entry
    proc = subprocess.run([sys.executable, '-c', 'import mxkv'], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, env=env, cwd=str(cwd),
                          universal_newlines=True, timeout=120)
    assert proc.returncode != 0, proc.stdout
    return proc.stderr


def test_missing_library_in_installed_package_says_reinstall_the_wheel(tmp_path):
    site = tmp_path / 'venv' / 'lib' / 'python3' / 'site-packages'
    site.mkdir(parents=True)
    _copy_package(site)
    (site / 'mxkv-0.1.0.dist-info').mkdir()
    err = _import_error(str(site), tmp_path)
    assert 'libmxkv.so not found' in err
    assert 'installed mxkv package' in err and 'wheel' in err and 'MXKV_LIBRARY_PATH' in err
    assert 'cargo' not in err  # a wheel user has nothing to build


def test_missing_library_in_source_checkout_says_cargo_build(tmp_path):
    repo = tmp_path / 'clone'
    (repo / 'bindings' / 'python').mkdir(parents=True)
    (repo / 'Cargo.toml').write_text('[package]\nname = "mxkv"\n')
    _copy_package(repo / 'bindings' / 'python')
    err = _import_error(str(repo / 'bindings' / 'python'), tmp_path)
    assert 'cargo build --release' in err
    assert os.path.join(str(repo), 'target', 'release', 'libmxkv.so') in err


def test_missing_library_in_copied_package_does_not_say_cargo(tmp_path):
    _copy_package(tmp_path / 'somewhere')
    err = _import_error(str(tmp_path / 'somewhere'), tmp_path)
    assert 'libmxkv.so not found' in err and 'MXKV_LIBRARY_PATH' in err
    assert 'cargo' not in err


def test_installation_kind_of_this_checkout():
    from mxkv import _lib
    assert _lib.installation() == ('checkout', REPO)
