#!/usr/bin/env bash
# bench/compare/mpi_backend.sh — tdist's MPI backend against plain Open MPI:
# f32 SUM all_reduce from 4 MiB up, the same sizes, the same mpirun flags,
# interleaved in one run (target: overhead <= 5% at 4 MiB and up).
#
#   bench/compare/mpi_backend.sh            # 5 runs, 20 iterations, 4 MiB .. 64 MiB, 2 ranks
#   bench/compare/mpi_backend.sh -p "2 4" -r 3
#
# Peers (both measured the tdist-bench way: barrier, warm-up, per-call
# times, each rank's median, max over ranks — see bench/compare/mpi_coll.c):
#   ompi  : bench/compare/mpi_coll.c (MPI_Allreduce, blocking), mpicc -O2
#   ompi-i: the same program, MPI_Allreduce replaced by MPI_Iallreduce +
#           MPI_Wait (the non-blocking algorithm the backend uses, minus tdist)
#   tdist : tools/tdist-bench under mpirun with TDIST_BACKEND=mpi: env://
#           becomes an MPI world, the world group runs on the MPI backend
#           (fingerprints as MPI_Isend/MPI_Irecv per peer + MPI_Iallreduce
#           polled with MPI_Test)
# Each run calls ompi, ompi-i, then tdist; the table quotes, per size, the
# median over runs of each run's time and overhead = tdist / peer - 1.
# Ends with RESULT lines. Exit 0 if every run worked and every element was
# right, 1 otherwise, 2 on bad flags.
set -u -o pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
HERE="$REPO/bench/compare"
MIN=4M MAX=64M FACTOR=2 ITERS=20 WARMUP=5 RUNS=5 RANKS="2" TIMEOUT=600
BUILD="$REPO/build/bench-mpi-release" BUILD_TDIST=1 MPI_EXTRA=""
BUILD_TRIES=${BUILD_TRIES:-10}

usage() {
    cat <<EOF
usage: bench/compare/mpi_backend.sh [options]
  -b MIN      smallest size (default $MIN)       -e MAX   largest size (default $MAX)
  -f FACTOR   size step (default $FACTOR)          -n ITERS timed iterations (default $ITERS)
  -w WARMUP   warm-up iterations (default $WARMUP)  -r RUNS  runs (default $RUNS)
  -p "RANKS"  rank counts (default "$RANKS")
  -B DIR      Release build directory (default $BUILD)
  -s          do not (re)build tdist; use the binaries in DIR
  -m "ARGS"   extra mpirun arguments (both peers)
  -T SECONDS  deadline of every single mpirun (default $TIMEOUT)
  -h          this help
EOF
}

die() { echo "mpi_backend.sh: $*" >&2; exit 1; }
# shellcheck source=bench/compare/common.sh
. "$HERE/common.sh"

while getopts ":b:e:f:n:w:r:p:B:sm:T:h" opt; do
    case "$opt" in
    b) MIN=$OPTARG ;; e) MAX=$OPTARG ;; f) FACTOR=$OPTARG ;; n) ITERS=$OPTARG ;;
    w) WARMUP=$OPTARG ;; r) RUNS=$OPTARG ;; p) RANKS=$OPTARG ;; B) BUILD=$OPTARG ;;
    s) BUILD_TDIST=0 ;; m) MPI_EXTRA=$OPTARG ;; T) TIMEOUT=$OPTARG ;;
    h) usage; exit 0 ;;
    *) usage >&2; exit 2 ;;
    esac
done
[[ "$RUNS" =~ ^[1-9][0-9]*$ ]] || { echo "bad -r $RUNS" >&2; exit 2; }

command -v mpirun >/dev/null && command -v mpicc >/dev/null ||
    die "needs mpirun and mpicc (Debian: openmpi-bin libopenmpi-dev)"
if [ "$BUILD_TDIST" = 1 ]; then
    build_tdist "$REPO" "$BUILD" "$BUILD/.mpi-backend-cmake.log" "$BUILD_TRIES" tdist-bench tdist_mpi
fi
BENCH="$BUILD/tools/tdist-bench/tdist-bench"
[ -x "$BENCH" ] || die "$BENCH not built"
[ -e "$BUILD/tdist/libtdist_mpi.so" ] ||
    die "$BUILD/tdist/libtdist_mpi.so (the MPI backend's module) was not built: configure with libopenmpi-dev installed"
OMPI="$BUILD/mpi_coll"
mpicc -O2 -o "$OMPI" "$HERE/mpi_coll.c" || die "mpicc mpi_coll.c failed"
# ompi-i: the same program with every MPI_Allreduce turned into
# MPI_Iallreduce + MPI_Wait (the non-blocking algorithm the backend uses,
# without tdist): separates tdist's own cost from MPI's algorithm choice.
cat >"$BUILD/iallreduce.h" <<'EOF2'
#include <mpi.h>
static inline int tdist_bench_iallreduce(const void *s, void *r, int c, MPI_Datatype t, MPI_Op o,
                                         MPI_Comm m)
{
    MPI_Request q;
    int rc = MPI_Iallreduce(s, r, c, t, o, m, &q);
    return rc != MPI_SUCCESS ? rc : MPI_Wait(&q, MPI_STATUS_IGNORE);
}
#define MPI_Allreduce tdist_bench_iallreduce
EOF2
OMPI_I="$BUILD/mpi_coll_i"
mpicc -O2 -include "$BUILD/iallreduce.h" -o "$OMPI_I" "$HERE/mpi_coll.c" || die "mpicc mpi_coll.c (-i) failed"

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
OUT=$(mktemp -d /tmp/tdist-mpi-backend-XXXXXX)
trap 'rm -rf "$OUT"' EXIT
ok=1
# rows: "bytes count type redop time algbw busbw wrong"
rows() { grep -E '^ *[0-9]+ +[0-9]+ ' "$1" | sed 's/^\[rank 0\] //'; }

for np in $RANKS; do
    flags=(-np "$np" --bind-to none --oversubscribe $MPI_EXTRA)
    args=(-b "$MIN" -e "$MAX" -f "$FACTOR" -n "$ITERS" -w "$WARMUP")
    for ((run = 1; run <= RUNS; run++)); do
        timeout -k 15 "$TIMEOUT" mpirun "${flags[@]}" "$OMPI" "${args[@]}" >"$OUT/ompi.$np.$run" 2>&1 ||
            { echo "# ompi run $run (np $np) failed:"; tail -5 "$OUT/ompi.$np.$run"; ok=0; }
        timeout -k 15 "$TIMEOUT" mpirun "${flags[@]}" "$OMPI_I" "${args[@]}" >"$OUT/ompii.$np.$run" 2>&1 ||
            { echo "# ompi-i run $run (np $np) failed:"; tail -5 "$OUT/ompii.$np.$run"; ok=0; }
        TDIST_BACKEND=mpi timeout -k 15 "$TIMEOUT" mpirun "${flags[@]}" -x TDIST_BACKEND "$BENCH" \
            "${args[@]}" >"$OUT/tdist.$np.$run" 2>&1 ||
            { echo "# tdist run $run (np $np) failed:"; tail -5 "$OUT/tdist.$np.$run"; ok=0; }
    done
    # median over runs per size, for each peer
    for peer in ompi ompii tdist; do
        for ((run = 1; run <= RUNS; run++)); do
            rows "$OUT/$peer.$np.$run" | awk '{print $1, $5, $8}'
        done >"$OUT/$peer.$np.all"
        awk '$3 != 0 {bad = 1} END {exit bad}' "$OUT/$peer.$np.all" ||
            { echo "# $peer ($np ranks): wrong elements"; ok=0; }
        sort -k1,1n -k2,2g "$OUT/$peer.$np.all" | awk '
            function flush() { if (n) print cur, (n % 2) ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2, n }
            $1 != cur { flush(); cur = $1; n = 0 }
            { v[++n] = $2 }
            END { flush() }' >"$OUT/$peer.$np.med"
    done
    echo "# all_reduce f32 sum, $np ranks, median of $RUNS runs x $ITERS iterations (time = max over ranks of per-rank median)"
    printf "# %12s %12s %12s %14s %11s %11s\n" bytes "ompi(us)" "ompi-i(us)" "tdist-mpi(us)" "vs ompi" "vs ompi-i"
    join <(sort -k1,1 "$OUT/ompi.$np.med") <(sort -k1,1 "$OUT/ompii.$np.med") |
        join - <(sort -k1,1 "$OUT/tdist.$np.med") | sort -k1,1n |
        while read -r bytes to no ti ni tt nt; do
            ov=$(awk -v a="$to" -v b="$tt" 'BEGIN {printf "%.1f", (b / a - 1) * 100}')
            oi=$(awk -v a="$ti" -v b="$tt" 'BEGIN {printf "%.1f", (b / a - 1) * 100}')
            printf "  %12s %12.1f %12.1f %14.1f %10s%% %10s%%\n" "$bytes" "$to" "$ti" "$tt" "$ov" "$oi"
            if ((bytes >= 1048576 && bytes % 1048576 == 0)); then mib="$((bytes / 1048576))MiB"
            elif ((bytes >= 1024 && bytes % 1024 == 0)); then mib="$((bytes / 1024))KiB"
            else mib="${bytes}B"; fi
            {
                echo "RESULT mpi_backend_np${np}_${mib}_ompi_time $to us"
                echo "RESULT mpi_backend_np${np}_${mib}_ompi_iallreduce_time $ti us"
                echo "RESULT mpi_backend_np${np}_${mib}_tdist_time $tt us"
                echo "RESULT mpi_backend_np${np}_${mib}_overhead_vs_ompi $ov %"
                echo "RESULT mpi_backend_np${np}_${mib}_overhead_vs_ompi_iallreduce $oi %"
            } >>"$OUT/results"
        done
done
[ -f "$OUT/results" ] && cat "$OUT/results"
[ "$ok" = 1 ] || exit 1
exit 0
