#!/usr/bin/env bash
# Installs libmxkv into a temporary prefix and builds a program written for
# MXNet's <mxnet/c_api.h> with `pkg-config --cflags --libs libmxkv` only, as
# C11 and as C++17 (-Wall -Werror), runs it, links it statically, uninstalls
# and checks that nothing is left; then links it straight against
# target/release. Run from the repository root: `make install-check`.
set -euo pipefail
command -v pkg-config >/dev/null || { echo "install-check: pkg-config is missing (make tools)"; exit 1; }
tmp=$(mktemp -d /tmp/mxkv-install.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
prefix="$tmp/prefix"
prog=ctests/install/mxnet_program.c

make -s install PREFIX="$prefix"
for f in lib/libmxkv.so.0 lib/libmxkv.so lib/libmxkv.a include/mxkv/c_api.h include/mxnet/c_api.h \
         lib/pkgconfig/libmxkv.pc; do
  [ -e "$prefix/$f" ] || { echo "install-check: $f was not installed"; exit 1; }
done
[ "$(readlink "$prefix/lib/libmxkv.so")" = libmxkv.so.0 ] || { echo "install-check: libmxkv.so link"; exit 1; }

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

make -s uninstall PREFIX="$prefix"
left=$(find "$prefix" -type f -o -type l)
[ -z "$left" ] || { echo "install-check: uninstall left: $left"; exit 1; }

# Straight against cargo's output directory (no make build, no install).
gcc -std=c11 -Wall -Werror -Iinclude "$prog" -o "$tmp/prog_target" \
    -Ltarget/release -lmxkv -Wl,-rpath,"$PWD/target/release"
env -u LD_LIBRARY_PATH "$tmp/prog_target"
echo "install-check: install, pkg-config (C and C++), static link, uninstall, target/release: all passed"
