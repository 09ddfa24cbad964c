"""Build of the ``mxkv`` wheel: the Python package plus ``libmxkv.so`` compiled by cargo.

Metadata lives in pyproject.toml; this file only adds the Rust library, which
setuptools-rust builds from the crate at the root of this repository
(``../../Cargo.toml``):

* ``Binding.NoBinding``: libmxkv is a plain C-ABI cdylib that ``mxkv._lib``
  opens with ctypes, not a CPython extension module.  It is therefore shipped
  as ``mxkv/libmxkv.so`` (the name the loader looks for), not under
  setuptools' ``libmxkv.cpython-311-x86_64-linux-gnu.so`` extension name.
* The wheel is tagged ``py3-none-<platform>`` (e.g. ``py3-none-linux_x86_64``):
  nothing in it depends on the CPython ABI, so any Python 3 on the same
  platform can use it, but the library is machine code for that platform.
  The platform tag is the build machine's (``linux_x86_64``), not a
  ``manylinux`` tag: the library links against the build machine's glibc, and
  a manylinux tag is a promise that only ``auditwheel repair`` checks.
* cargo builds into ``build/wheel-target`` at the repository root (or
  ``$MXKV_WHEEL_TARGET_DIR``), never into the developer's ``target/``:
  setuptools-rust builds with other arguments (``cargo rustc --crate-type
  cdylib``), which would invalidate the main build's artifacts.

Editable installs (``pip install -e``) build no library: the package then
loads ``target/release/libmxkv.so`` of the checkout (``cargo build --release``).
"""
import os
import shutil
import sys

from setuptools import setup
from setuptools_rust import Binding, RustExtension, Strip
from setuptools_rust.build import build_rust as _build_rust

from setuptools.command.bdist_wheel import bdist_wheel as _bdist_wheel

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
MANIFEST = os.path.join(REPO, 'Cargo.toml')
LIBRARY = {'darwin': 'libmxkv.dylib', 'win32': 'mxkv.dll'}.get(sys.platform, 'libmxkv.so')


def _crate_manifest():
    """The path of libmxkv's Cargo.toml, or an error saying where it was expected."""
    try:
        with open(MANIFEST) as fin:
            text = fin.read()
    except OSError:
        text = ''
    if 'name = "mxkv"' not in text:
        sys.exit('mxkv: the wheel build compiles libmxkv with cargo from the source '
                 'checkout, but %s is not libmxkv\'s Cargo.toml. Build from a clone of '
                 'the repository (pip install <clone>/bindings/python), not from an sdist.'
                 % MANIFEST)
    return MANIFEST


class build_rust(_build_rust):
    """setuptools-rust's build_rust, installing the cdylib as mxkv/libmxkv.so."""

    def run(self):
        if self.inplace:
            # editable install: the checkout's target/release is found by the loader
            return
        super().run()

    def get_dylib_ext_path(self, ext, target_fname):
        ext_path = super().get_dylib_ext_path(ext, target_fname)
        return os.path.join(os.path.dirname(ext_path), LIBRARY)


class bdist_wheel(_bdist_wheel):
    """A platform wheel that needs no particular CPython ABI (py3-none-<platform>)."""

    def finalize_options(self):
        super().finalize_options()
        self.root_is_pure = False

    def run(self):
        # build_py only adds and refreshes files in build/lib*: start from an empty
        # one so that a module deleted from mxkv/ cannot reach the wheel
        shutil.rmtree(self.get_finalized_command('build').build_lib, ignore_errors=True)
        super().run()

    def get_tag(self):
        _python, _abi, plat = super().get_tag()
        return 'py3', 'none', plat


target_dir = os.environ.get('MXKV_WHEEL_TARGET_DIR') or os.path.join(REPO, 'build', 'wheel-target')

setup(
    rust_extensions=[RustExtension(
        'mxkv.libmxkv',
        path=_crate_manifest(),
        binding=Binding.NoBinding,
        strip=Strip.Debug,  # the release profile keeps line tables (debug = 1): 29 MB -> ~3 MB
        env=dict(os.environ, CARGO_TARGET_DIR=os.path.abspath(target_dir)),
    )],
    cmdclass={'build_rust': build_rust, 'bdist_wheel': bdist_wheel},
    zip_safe=False,
)
