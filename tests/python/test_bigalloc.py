"""The shared library's own allocations go to its allocator (src/capi/bigalloc.rs).

libmxkv.so is linked with ``--wrap=malloc,--wrap=free,--wrap=realloc`` (build.rs), so the
library imports none of the three: its code, Rust's standard library and the bundled libzmq
call the library's allocator, which keeps big blocks for reuse; the program's allocator is
left alone. With ``-Bsymbolic-functions`` those calls are bound inside the library, so a
program that defines functions of the same names cannot take them over (the dist test test_big_replies_land_in_memory_the_library_keeps shows the
effect)."""
import os
import shutil
import subprocess

import pytest

from conftest import REPO

SO = os.environ.get('MXKV_LIBRARY_PATH') or os.path.join(REPO, 'target', 'release', 'libmxkv.so')


def dynamic_symbols(undefined):
    if not shutil.which('nm'):
        pytest.fail('nm (binutils) is needed to read the library\'s symbols')
    flag = '--undefined-only' if undefined else '--defined-only'
    out = subprocess.run(['nm', '-D', flag, SO], check=True, stdout=subprocess.PIPE,
                         universal_newlines=True).stdout
    return {line.split()[-1].split('@')[0] for line in out.splitlines() if line.strip()}


def test_the_library_imports_no_malloc_free_or_realloc():
    if not os.path.basename(SO).startswith('libmxkv'):
        pytest.skip('MXKV_LIBRARY_PATH is not libmxkv')
    imported = dynamic_symbols(undefined=True)
    assert not {'malloc', 'free', 'realloc'} & imported, sorted(imported)
    # the wrappers the calls are linked to are in the library, hidden (not exported:
    # another library's or the program's --wrap could bind to them)
    wrappers = {'__wrap_malloc', '__wrap_free', '__wrap_realloc'}
    assert not wrappers & dynamic_symbols(False)
    out = subprocess.run(['nm', SO], check=True, stdout=subprocess.PIPE,
                         universal_newlines=True).stdout
    local_text = {line.split()[-1] for line in out.splitlines()
                  if len(line.split()) == 3 and line.split()[1] == 't'}
    assert wrappers <= local_text


def test_the_library_binds_its_allocator_calls_itself():
    if not os.path.basename(SO).startswith('libmxkv'):
        pytest.skip('MXKV_LIBRARY_PATH is not libmxkv')
    if not shutil.which('readelf'):
        pytest.fail('readelf (binutils) is needed to read the library\'s relocations')
    relocs = subprocess.run(['readelf', '-rW', SO], check=True, stdout=subprocess.PIPE,
                            universal_newlines=True).stdout
    assert [line for line in relocs.splitlines() if '__wrap_' in line] == []
