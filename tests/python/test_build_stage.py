"""`make build` stages the library in build/lib without touching the file a running
process has mapped.

Tests run against build/lib while someone may rebuild; `cp -f` over build/lib/libmxkv.so.0
rewrote the mapped file in place, so a running test's code pages changed under it (SIGBUS
on the truncated pages, or garbage instructions). The build now copies to a temporary name
in build/lib and renames it over the old one: the old file (its inode) stays intact for
whoever has it mapped.

The recipe runs here with `CARGO=true` (no compile), into a temporary LIBDIR, staging
first the real library, then, while a process has it loaded, a file of the same size
holding only int3 bytes (as a rebuild that changed every byte); the process then calls
into its library again and must still work.
"""
import os
import subprocess
import sys

import pytest

from conftest import REPO

SO = os.path.join(REPO, 'target', 'release', 'libmxkv.so')
A = os.path.join(REPO, 'target', 'release', 'libmxkv.a')

CHILD = r'''
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
assert lib.MXGetVersion(ctypes.byref(ctypes.c_int())) == 0
print('loaded', flush=True)
sys.stdin.readline()
# code the process has not run yet, and code it has
h = ctypes.c_void_p()
shape = (ctypes.c_uint * 1)(1 << 16)
assert lib.MXNDArrayCreateEx(shape, 1, 1, 0, 0, 0, ctypes.byref(h)) == 0
kv = ctypes.c_void_p()
assert lib.MXKVStoreCreate(b'local', ctypes.byref(kv)) == 0
v = ctypes.c_int()
assert lib.MXGetVersion(ctypes.byref(v)) == 0 and v.value == 10901
assert lib.MXKVStoreFree(kv) == 0 and lib.MXNDArrayFree(h) == 0
print('still works', flush=True)
'''


def stage(libdir, so):
    subprocess.run(['make', '-s', '-C', REPO, 'build', 'CARGO=true', 'LIBDIR=' + libdir,
                    'SO=' + so], check=True, timeout=300, stdout=subprocess.DEVNULL)


@pytest.mark.skipif(not (os.path.exists(SO) and os.path.exists(A)),
                    reason='needs target/release/libmxkv.{so,a} (cargo build --release)')
def test_a_rebuild_leaves_a_loaded_library_intact(tmp_path):
    libdir = str(tmp_path / 'lib')
    stage(libdir, SO)
    staged = os.path.join(libdir, 'libmxkv.so.0')
    assert os.path.realpath(os.path.join(libdir, 'libmxkv.so')) == os.path.realpath(staged)
    with open(SO, 'rb') as f1, open(staged, 'rb') as f2:
        assert f1.read() == f2.read()
    inode = os.stat(staged).st_ino

    other = str(tmp_path / 'other.so')
    with open(other, 'wb') as f:
        f.write(b'\xcc' * os.path.getsize(SO))

    p = subprocess.Popen([sys.executable, '-c', CHILD, staged], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == 'loaded'
        stage(libdir, other)
        out, err = p.communicate('go\n', timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 0 and out.strip() == 'still works', (p.returncode, out, err)
    assert os.stat(staged).st_ino != inode, 'the staged library was rewritten in place'
    with open(staged, 'rb') as f:
        assert f.read(4) == b'\xcc' * 4, 'the new file is in place'
    leftovers = [n for n in os.listdir(libdir) if n.startswith('.')]
    assert leftovers == [], leftovers
