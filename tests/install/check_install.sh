#!/usr/bin/env bash
# tests/install/check_install.sh BUILD_DIR CC "SAN_FLAGS"
# Install the build into a temporary prefix and build a program against it
# the three ways a user would: pkg-config, CMake find_package (shared and
# static). Every step must succeed and the program must print the right
# numbers.
set -euo pipefail
build="$1" cc="$2" san="${3:-}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
work="$(mktemp -d /tmp/tdist-install-XXXXXX)"
trap 'rm -rf "$work"' EXIT
prefix="$work/prefix"

cmake --install "$build" --prefix "$prefix" >/dev/null
libdir="$(ls -d "$prefix"/lib*/ | head -n1)"; libdir="${libdir%/}"
for f in "$libdir/libtdist.so" "$libdir/libtdist.a" "$prefix/include/tdist/tdist.h" \
         "$prefix/include/tdist/core.h" "$prefix/include/tdist/store.h" "$prefix/include/tdist/init.h" \
         "$libdir/cmake/tdist/tdistConfig.cmake" "$libdir/cmake/tdist/tdistConfigVersion.cmake" \
         "$libdir/pkgconfig/tdist.pc" "$prefix/bin/tdistrun"; do
    [ -e "$f" ] || { echo "missing after install: $f"; exit 1; }
done

# 1. pkg-config, shared library.
export PKG_CONFIG_PATH="$libdir/pkgconfig"
# shellcheck disable=SC2046,SC2086
"$cc" -std=c11 -Wall -Wextra -Werror $san "$here/consumer.c" -o "$work/consumer_pc" \
      $(pkg-config --cflags --libs tdist)
out="$(LD_LIBRARY_PATH="$libdir" "$work/consumer_pc")"
echo "pkg-config: $out"
[[ "$out" == *"add=42 sum=3.75 bad=TDIST_ERR_INVALID_ARG"* ]]

# 2. CMake find_package, static and shared targets.
mkdir -p "$work/consumer"
cp "$here/consumer.c" "$work/consumer/"
cp "$here/CMakeLists.txt.in" "$work/consumer/CMakeLists.txt"
cmake -S "$work/consumer" -B "$work/consumer/build" -DCMAKE_PREFIX_PATH="$prefix" \
      -DCMAKE_C_COMPILER="$cc" -DCMAKE_C_FLAGS="$san" >/dev/null
cmake --build "$work/consumer/build" >/dev/null
out="$("$work/consumer/build/consumer_static")"
echo "cmake static: $out"
[[ "$out" == *"add=42 sum=3.75"* ]]
out="$(LD_LIBRARY_PATH="$libdir" "$work/consumer/build/consumer_shared")"
echo "cmake shared: $out"
[[ "$out" == *"add=42 sum=3.75"* ]]
echo "install check passed"
