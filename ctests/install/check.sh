#!/usr/bin/env bash
# Installs libmxkv into a temporary prefix and builds a program written for
# MXNet's <mxnet/c_api.h> with `pkg-config --cflags --libs libmxkv` only, as
# C11 and as C++17 (-Wall -Werror), runs it, links it statically, uninstalls
# and checks that nothing is left; then links it straight against
# target/release. Also: a relative PREFIX is refused, and install and uninstall (as root)
# refresh the linker cache. Run from the repository root: `make install-check`.
set -euo pipefail
command -v pkg-config >/dev/null || { echo "install-check: pkg-config is missing (make tools)"; exit 1; }
tmp=$(mktemp -d /tmp/mxkv-install.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
prefix="$tmp/prefix"
prog=ctests/install/mxnet_program.c

# A relative PREFIX would go into the pkg-config file and the rpath as is (a program built
# elsewhere then finds neither the header nor the library): refused, nothing written.
rel="mxkv-relative-prefix.$$"
if make -s install PREFIX="$rel" > "$tmp/rel.log" 2>&1; then
  rm -rf "$rel"; echo "install-check: make install took the relative PREFIX $rel"; exit 1
fi
grep -q 'PREFIX must be an absolute path' "$tmp/rel.log" || { cat "$tmp/rel.log"; exit 1; }
[ ! -e "$rel" ] || { rm -rf "$rel"; echo "install-check: refused install wrote $rel"; exit 1; }
make -s uninstall PREFIX="$rel" > "$tmp/rel.log" 2>&1 && { echo "install-check: uninstall took a relative PREFIX"; exit 1; }

# ldconfig is a stub that logs its calls: as root (DESTDIR empty) install and uninstall each
# refresh the linker cache once (before, uninstall left libmxkv.so.0 listed by `ldconfig -p`
# after deleting it); as another user neither calls it. The real cache is left alone.
mkdir "$tmp/bin"
printf '#!/bin/sh\necho ldconfig >> "%s"\n' "$tmp/ldconfig.log" > "$tmp/bin/ldconfig"
chmod +x "$tmp/bin/ldconfig"
: > "$tmp/ldconfig.log"
if [ "$(id -u)" = 0 ]; then want_install=1; want_uninstall=2; else want_install=0; want_uninstall=0; fi
ldconfig_calls() { wc -l < "$tmp/ldconfig.log" | tr -d ' '; }

PATH="$tmp/bin:$PATH" make -s install PREFIX="$prefix"
[ "$(ldconfig_calls)" = "$want_install" ] || { echo "install-check: install ran ldconfig $(ldconfig_calls) times, want $want_install"; exit 1; }
for f in lib/libmxkv.so.0 lib/libmxkv.so lib/libmxkv.a include/mxkv/c_api.h include/mxnet/c_api.h \
         lib/pkgconfig/libmxkv.pc; do
  [ -e "$prefix/$f" ] || { echo "install-check: $f was not installed"; exit 1; }
done
[ "$(readlink "$prefix/lib/libmxkv.so")" = libmxkv.so.0 ] || { echo "install-check: libmxkv.so link"; exit 1; }
# Installed without debug information (cargo's release build keeps line tables: 53 MB .so),
# the exported symbols kept.
for f in lib/libmxkv.so.0 lib/libmxkv.a; do
  ! readelf -S "$prefix/$f" | grep -q '\.debug_' || { echo "install-check: $f was installed with debug information"; exit 1; }
done
nm -D --defined-only "$prefix/lib/libmxkv.so.0" | grep -q ' T MXKVStoreCreate$' || { echo "install-check: MXKVStoreCreate is not exported"; exit 1; }
# The allocator the library's own malloc/free/realloc calls are linked to (build.rs) is hidden.
! nm -D --defined-only "$prefix/lib/libmxkv.so.0" | grep -q __wrap_ || { echo "install-check: __wrap_* is exported"; exit 1; }

export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
cflags=$(pkg-config --cflags libmxkv)
libs=$(pkg-config --libs libmxkv)
echo "install-check: pkg-config --cflags --libs libmxkv = $cflags $libs"

gcc -std=c11 -Wall -Wextra -Werror $cflags "$prog" -o "$tmp/prog_c" $libs
g++ -std=c++17 -Wall -Wextra -Werror -x c++ $cflags "$prog" -o "$tmp/prog_cpp" $libs
env -u LD_LIBRARY_PATH "$tmp/prog_c"
env -u LD_LIBRARY_PATH "$tmp/prog_cpp"
# The binaries ask for the soname, which the prefix has.
readelf -d "$tmp/prog_c" | grep -q 'Shared library: \[libmxkv.so.0\]'

# Static: libmxkv.a and its private libraries, no libmxkv.so needed at run time.
gcc -std=c11 -Wall -Werror $cflags "$prog" -o "$tmp/prog_static" \
    "$prefix/lib/libmxkv.a" $(pkg-config --static --libs-only-l libmxkv | sed 's/-lmxkv//')
! readelf -d "$tmp/prog_static" | grep -q 'libmxkv' || { echo "install-check: static link still needs libmxkv.so"; exit 1; }
"$tmp/prog_static"

PATH="$tmp/bin:$PATH" make -s uninstall PREFIX="$prefix"
[ "$(ldconfig_calls)" = "$want_uninstall" ] || { echo "install-check: after uninstall ldconfig ran $(ldconfig_calls) times in all, want $want_uninstall"; exit 1; }
left=$(find "$prefix" -type f -o -type l)
[ -z "$left" ] || { echo "install-check: uninstall left: $left"; exit 1; }

# Straight against cargo's output directory (no make build, no install).
gcc -std=c11 -Wall -Werror -Iinclude "$prog" -o "$tmp/prog_target" \
    -Ltarget/release -lmxkv -Wl,-rpath,"$PWD/target/release"
env -u LD_LIBRARY_PATH "$tmp/prog_target"
echo "install-check: install, pkg-config (C and C++), static link, uninstall, target/release: all passed"
