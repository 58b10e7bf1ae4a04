#!/usr/bin/env bash
# tests/install/check_install.sh BUILD_DIR CC "SAN_FLAGS"
# Install the build into a temporary prefix and use it the ways a user
# would: build a program with pkg-config (shared, and static against
# libtdist.a with `pkg-config --static`), with CMake's find_package (shared
# and static targets), build the examples (with nn/) outside the source
# tree, and run the installed tools with no LD_LIBRARY_PATH. The installed
# libraries must need nothing beyond libc, libm and pthreads (the MPI
# backend is a module of its own). Every step must succeed and the
# programs must print the right numbers.
set -euo pipefail
build="$1" cc="$2" san="${3:-}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
src="$(cd "$here/../.." && pwd)"
work="$(mktemp -d /tmp/tdist-install-XXXXXX)"
trap 'rm -rf "$work"' EXIT
prefix="$work/prefix"
unset LD_LIBRARY_PATH TDIST_MPI_MODULE TDIST_BACKEND

cmake --install "$build" --prefix "$prefix" >/dev/null
libdir="$(ls -d "$prefix"/lib*/ | head -n1)"; libdir="${libdir%/}"
for f in "$libdir/libtdist.so" "$libdir/libtdist.a" "$prefix/include/tdist/tdist.h" \
         "$prefix/include/tdist/core.h" "$prefix/include/tdist/store.h" "$prefix/include/tdist/init.h" \
         "$libdir/cmake/tdist/tdistConfig.cmake" "$libdir/cmake/tdist/tdistConfigVersion.cmake" \
         "$libdir/pkgconfig/tdist.pc" "$prefix/bin/tdistrun" "$prefix/bin/tdist-bench" \
         "$libdir/libtdist_nn.so" "$libdir/libtdist_nn.a" "$prefix/include/tdist/nn.h" \
         "$libdir/pkgconfig/tdist_nn.pc"; do
    [ -e "$f" ] || { echo "missing after install: $f"; exit 1; }
done

# 0. What the installed libraries need: libc, libm, pthreads (and the
#    sanitizer runtimes in a sanitizer build); never MPI.
needed() { readelf -d "$1" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | tr '\n' ' '; }
echo "libtdist.so needs: $(needed "$libdir/libtdist.so")"
for lib in $(needed "$libdir/libtdist.so"); do
    case "$lib" in
        libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|ld-linux*|libasan.so.*|libubsan.so.*|libtsan.so.*) ;;
        *) echo "libtdist.so needs $lib: only libc, libm and pthreads are allowed"; exit 1 ;;
    esac
done
if nm "$libdir/libtdist.a" 2>/dev/null | grep -Eq ' U (P?MPI_|ompi_)'; then
    echo "libtdist.a calls MPI: $(nm "$libdir/libtdist.a" | grep -E ' U (P?MPI_|ompi_)' | head -n 5 | tr '\n' ' ')"
    exit 1
fi
mod="$libdir/tdist/libtdist_mpi.so"
if [ -e "$build/tdist/libtdist_mpi.so" ]; then
    [ -e "$mod" ] || { echo "the MPI module was built but not installed as $mod"; exit 1; }
    echo "libtdist_mpi.so needs: $(needed "$mod")"
    needed "$mod" | grep -q "libmpi" || { echo "$mod does not link MPI"; exit 1; }
    needed "$mod" | grep -q "libtdist" && { echo "$mod links libtdist (it must not)"; exit 1; }
fi

# 1. pkg-config, shared library.
export PKG_CONFIG_PATH="$libdir/pkgconfig"
# shellcheck disable=SC2046,SC2086
"$cc" -std=c11 -Wall -Wextra -Werror $san "$here/consumer.c" -o "$work/consumer_pc" \
      $(pkg-config --cflags --libs tdist)
out="$(LD_LIBRARY_PATH="$libdir" "$work/consumer_pc")"
echo "pkg-config: $out"
[[ "$out" == *"add=42 sum=3.75 bad=TDIST_ERR_INVALID_ARG"* ]]

# 2. pkg-config --static: the archive, with the flags it prints. A fully
#    static program where the toolchain allows it (not with sanitizers),
#    else the archive inside a dynamic program (-Bstatic around -ltdist).
static_libs="$(pkg-config --static --libs tdist)"
echo "pkg-config --static --libs tdist: $static_libs"
if [ -z "$san" ]; then
    # shellcheck disable=SC2046,SC2086
    "$cc" -std=c11 -static "$here/consumer.c" -o "$work/consumer_static_pc" \
          $(pkg-config --cflags tdist) $static_libs
    readelf -d "$work/consumer_static_pc" 2>/dev/null | grep -q NEEDED &&
        { echo "the -static program still needs shared libraries"; exit 1; }
else
    # shellcheck disable=SC2046,SC2086
    "$cc" -std=c11 $san "$here/consumer.c" -o "$work/consumer_static_pc" \
          $(pkg-config --cflags tdist) -Wl,-Bstatic $(pkg-config --libs-only-L --libs-only-l tdist) \
          -Wl,-Bdynamic $(pkg-config --static --libs-only-l tdist | sed 's/-ltdist//')
fi
needed "$work/consumer_static_pc" | grep -q libtdist && { echo "static program needs libtdist.so"; exit 1; }
out="$("$work/consumer_static_pc")"
echo "pkg-config static: $out"
[[ "$out" == *"add=42 sum=3.75"* ]]

# 3. CMake find_package, static and shared targets.
mkdir -p "$work/consumer"
cp "$here/consumer.c" "$work/consumer/"
cp "$here/CMakeLists.txt.in" "$work/consumer/CMakeLists.txt"
cmake -S "$work/consumer" -B "$work/consumer/build" -DCMAKE_PREFIX_PATH="$prefix" \
      -DCMAKE_C_COMPILER="$cc" -DCMAKE_C_FLAGS="$san" >/dev/null
cmake --build "$work/consumer/build" >/dev/null
out="$("$work/consumer/build/consumer_static")"
echo "cmake static: $out"
[[ "$out" == *"add=42 sum=3.75"* ]]
needed "$work/consumer/build/consumer_static" | grep -q libtdist &&
    { echo "tdist::tdist_static linked libtdist.so"; exit 1; }
out="$(LD_LIBRARY_PATH="$libdir" "$work/consumer/build/consumer_shared")"
echo "cmake shared: $out"
[[ "$out" == *"add=42 sum=3.75"* ]]

# 4. The examples, outside the source tree: with CMake against the
#    installed package (train_digits, train_gpt, launcher_hello), and
#    train_digits by hand with pkg-config.
cp -r "$src/examples" "$work/examples"
cmake -S "$work/examples" -B "$work/examples/build" -DCMAKE_PREFIX_PATH="$prefix" \
      -DCMAKE_C_COMPILER="$cc" -DCMAKE_C_FLAGS="$san" >/dev/null
cmake --build "$work/examples/build" >/dev/null
for ex in train_digits train_gpt launcher_hello; do
    [ -x "$work/examples/build/$ex" ] || { echo "example $ex was not built"; exit 1; }
done
# shellcheck disable=SC2046,SC2086
"$cc" -std=c11 $san "$work/examples/train_digits.c" -o "$work/train_digits_pc" \
      $(pkg-config --cflags --libs tdist tdist_nn) -lm
echo "examples: built with CMake and with pkg-config"

# 5. The installed tools, from the prefix, with no LD_LIBRARY_PATH: a
#    2-rank all_reduce with every result checked.
out="$(timeout -k 5 60 "$prefix/bin/tdistrun" --nproc-per-node 2 "$prefix/bin/tdist-bench" \
       -b 8 -e 64K -n 3 -w 1 2>&1)" || { echo "$out"; echo "installed tdistrun/tdist-bench failed"; exit 1; }
echo "$out" | tail -n 3
echo "$out" | grep -q "RESULT all_reduce_f32_sum_wrong_elements 0 elements" ||
    { echo "$out"; echo "tdist-bench did not report 0 wrong elements"; exit 1; }

# 6. The MPI module from the prefix: a program linked with the installed
#    libtdist.so (beside it: lib/tdist/) and the installed static tools
#    (bin/../lib/tdist/) load it, not the build tree's copy.
if [ -e "$mod" ] && command -v mpirun >/dev/null 2>&1; then
    asan="${ASAN_OPTIONS:-}${ASAN_OPTIONS:+:}detect_leaks=0"
    out="$(ASAN_OPTIONS="$asan" OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
           OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none TDIST_LOG=info \
           TDIST_BACKEND=mpi timeout -k 5 60 mpirun -np 2 --oversubscribe --bind-to none \
           "$prefix/bin/tdist-bench" -b 8 -e 1K -n 2 -w 1 2>&1)" ||
        { echo "$out"; echo "installed tdist-bench under mpirun failed"; exit 1; }
    echo "$out" | grep "loaded the MPI backend's module" | head -n 1
    echo "$out" | grep -q "loaded the MPI backend's module $mod" ||
        { echo "$out"; echo "the installed tools did not load $mod"; exit 1; }
fi
echo "install check passed"
