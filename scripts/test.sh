#!/usr/bin/env bash
# scripts/test.sh — build tdist with AddressSanitizer + UndefinedBehaviorSanitizer
# and run the whole test suite (ctest); then build it with ThreadSanitizer
# and run the threaded tests again there. The README's test command;
# .ci/run calls exactly this.
#
#   TDIST_BUILD_DIR   build directory (default: build/test; the ThreadSanitizer
#                     tree is <it>-tsan)
#   TDIST_TEST_JOBS   tests run at once (default: 2)
#   TDIST_TEST_TSAN   1 (default): also the ThreadSanitizer run; 0: skip it
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/deps.sh
. "$here/scripts/deps.sh"

# clang and its runtime build the libFuzzer target for the store's frame parser;
# python3-sklearn ships the digits data set the digits example (and its test) trains on;
# fortunes ships the English text the main job, the GPT (and its test), trains on;
# iproute2 (ip, tc) builds the network namespaces of the net tests (tests/net);
# openmpi-bin + libopenmpi-dev build the MPI backend and run its tests (tests/mpi).
ensure_packages "${TDIST_BUILD_PACKAGES[@]}" clang libclang-rt-14-dev python3-sklearn iproute2 \
    openmpi-bin libopenmpi-dev fortunes

build="${TDIST_BUILD_DIR:-$here/build/test}"
jobs="${TDIST_TEST_JOBS:-2}"
tsan="${TDIST_TEST_TSAN:-1}"
# Warnings are errors here (TDIST_WERROR), never in a user's own build.
# (No benchmarks in the sanitized trees: no test runs them, and the
# optimised tree below compiles them with every warning an error.)
cmake -S "$here" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DTDIST_SANITIZE=ON \
      -DTDIST_WERROR=ON -DTDIST_WITH_NN=ON -DTDIST_BUILD_TESTS=ON -DTDIST_BUILD_FUZZ=ON \
      -DTDIST_BUILD_BENCH=OFF -DTDIST_INSTALL_CHECK_BUILD_DIR="$build-release" >/dev/null
cmake --build "$build" --parallel "$(nproc)"
# The optimised build must compile warning-free too (-O3 finds warnings
# -O0 does not): the main job and the benchmarks use it.
# (Without link-time optimisation: it would add minutes to the test
# command; the main job's build, scripts/demo.sh, has it.)
cmake -S "$here" -B "$build-release" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTDIST_WERROR=ON \
      -DTDIST_LTO=OFF -DTDIST_BUILD_TESTS=OFF >/dev/null
cmake --build "$build-release" --parallel "$(nproc)"
# And the configuration a machine without MPI or OpenBLAS gets (a fresh
# machine running the demo has no MPI): the library, the tools and what
# examples need no nn/, every warning an error. Compiled, not tested.
# It and the ThreadSanitizer tree (which cannot share a build with
# AddressSanitizer) build while the AddressSanitizer tests run, in the
# idle scheduling class: the tests leave part of the two CPUs unused
# (their ranks wait on each other and on deadlines; about a tenth over a
# whole run), and any test process that wakes takes a CPU from an
# idle-class task at once. Their
# output is shown only when a build fails.
# (In a process group of their own, which the script stops if it ends
# early.)
bg_log="$build-bg.log"
set -m
(
    chrt --idle -p 0 "$BASHPID" >/dev/null 2>&1 || renice -n 19 -p "$BASHPID" >/dev/null 2>&1 || true
    cmake -S "$here" -B "$build-minimal" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTDIST_WERROR=ON \
          -DTDIST_LTO=OFF -DTDIST_WITH_MPI=OFF -DTDIST_WITH_NN=OFF -DTDIST_BUILD_TESTS=OFF >/dev/null
    cmake --build "$build-minimal" --parallel "$(nproc)"
    if [ "$tsan" = 1 ]; then
        cmake -S "$here" -B "$build-tsan" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DTDIST_SANITIZE_THREAD=ON \
              -DTDIST_WERROR=ON -DTDIST_WITH_NN=ON -DTDIST_BUILD_TESTS=ON -DTDIST_BUILD_BENCH=OFF >/dev/null
        cmake --build "$build-tsan" --parallel "$(nproc)"
    fi
) >"$bg_log" 2>&1 &
bg_builds=$!
set +m
trap 'kill -TERM -- "-$bg_builds" 2>/dev/null || true' EXIT
# Leak checks on; the runner kills each test at its own deadline.
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
status=0
(cd "$build" && ctest --output-on-failure --parallel "$jobs" --timeout 600) || status=1
if ! wait "$bg_builds"; then
    cat "$bg_log"
    echo "scripts/test.sh: building the minimal configuration or the ThreadSanitizer tree failed" >&2
    exit 1
fi
trap - EXIT
if [ "$tsan" = 1 ]; then
    # The tests whose code runs threads (engine, callbacks, store server,
    # launcher): every label of those layers, less
    # - the fuzzer (a clang AddressSanitizer build in both trees);
    # - the examples' end-to-end training runs (minutes under
    #   ThreadSanitizer; their library paths are the ddp, join and
    #   algorithms tests');
    # - the data-path sweeps and the 16-64 MiB and 8-rank variants: every
    #   dtype, op and size of pg_oneshot_paths_* and pg_reduce_paths_*, the
    #   16 and 64 MiB transfers of the failure and transport tests and the 8-rank
    #   random Join schedules take the same threads through the same
    #   hand-offs as the smaller tests run here (the 2-4-rank schedules, the
    #   SIGKILL/SIGSTOP tests on small messages), at a third of the
    #   ThreadSanitizer run's time;
    # - the TCP twins of the ddp, join and hierarchy tests (*__tcp): DDP,
    #   Join and the hierarchy's subgroups hand work to the same threads
    #   (the engine, the reducer's callbacks, the Join hooks) whichever
    #   transport carries the bytes below pg, and the TCP transport's own
    #   threads and hand-offs are the other pg and the transport tests' TCP
    #   variants, which run here. About a fifth of the run's time.
    # The AddressSanitizer run has them all.
    # A report ends the process at once with status 66, which fails the test.
    export TSAN_OPTIONS="${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1}"
    echo "== ThreadSanitizer: labels pg ddp join store transport tools"
    tsan_skip='store_fuzz_frame_parser|tdistrun_train_(digits|gpt)_.*'
    tsan_skip+='|pg_(oneshot|reduce)_paths_.*|pg_peer_sig(kill|stop)_during_64mib_all_reduce.*'
    tsan_skip+='|transport_(shm|tcp)_sendrecv_64mib_both_ways|join_random_200_runs_8_ranks.*'
    tsan_skip+='|(ddp|join|pg_hier)_.*__tcp|transport_(shm|tcp)_ring_16mib_4_ranks'
    (cd "$build-tsan" && ctest --output-on-failure --parallel "$jobs" --timeout 600 \
        -L '^(pg|ddp|join|store|transport|tools)$' -E "^($tsan_skip)\$") || status=1
fi
exit "$status"
