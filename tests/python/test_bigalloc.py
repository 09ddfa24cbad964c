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


WRAPPING_PROGRAM = r'''
#include <stdio.h>
#include <stdlib.h>
void *__real_malloc(size_t);
static int wrapped;
void *__wrap_malloc(size_t n) { wrapped++; return __real_malloc(n); }
int MXGetVersion(int *out);
int main(void) {
  int v = 0;
  if (MXGetVersion(&v) != 0) return 2;
  void *p = malloc(10);
  free(p);
  printf("%d %d\n", v, wrapped > 0);
  return 0;
}
'''


def test_a_program_with_its_own_wrap_links_the_static_library(tmp_path):
    """libmxkv.a defines no __wrap_malloc/free/realloc: the shared library's allocator is
    named so only at its link (build.rs), so a program linking libmxkv.a with its own
    --wrap=malloc keeps its __wrap_malloc (before: 'multiple definition of __wrap_malloc')"""
    archive = os.path.join(os.path.dirname(SO), 'libmxkv.a')
    if not os.path.exists(archive) or not os.path.basename(SO).startswith('libmxkv'):
        pytest.skip('no libmxkv.a beside %s' % SO)
    if not shutil.which('gcc'):
        pytest.fail('gcc is needed to link a program')
    src = tmp_path / 'wrapping.c'
    src.write_text(WRAPPING_PROGRAM)
    exe = str(tmp_path / 'wrapping')
    # the archive's own dependencies (mk/install.mk's PRIVATE_LIBS)
    libs = '-lstdc++ -lgcc_s -lutil -lrt -lpthread -lm -ldl -lc'.split()
    link = subprocess.run(['gcc', str(src), '-o', exe, '-Wl,--wrap=malloc', archive] + libs,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True, timeout=300)
    assert link.returncode == 0, link.stdout
    run = subprocess.run([exe], stdout=subprocess.PIPE, universal_newlines=True, timeout=60)
    assert run.returncode == 0 and run.stdout.split() == ['10901', '1'], run
