#!/usr/bin/env bash
# bench/compare/algos.sh — measurements behind two choices the library
# makes, through the public API (tdist-bench under tdistrun), never run as
# tests:
#   algos        the time of each native all_reduce algorithm by size over
#                TCP (TDIST_ALGO_ALLREDUCE=ring|rd|direct against auto): the
#                data coll.c's size thresholds are set from;
#   fingerprint  what the always-on fingerprint check costs at 8 bytes:
#                all_reduce and broadcast, shared memory and TCP, with
#                TDIST_CHECK_FINGERPRINT=1 and =0 alternated.
#
#   bench/compare/algos.sh [-w algos|fingerprint|both] [-r RUNS] [-n RANKS]
#                          [-B BUILD] [--no-build]
# RUNS (default 3) alternations; RANKS (default "2 4" for algos, 2 for the
# fingerprint); BUILD (default build/bench-algos, Release). Ends with one
# RESULT line per figure (medians over the runs).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
die() { echo "algos.sh: $*" >&2; exit 1; }
# shellcheck source=bench/compare/common.sh
. "$HERE/common.sh"

WHAT=both RUNS=3 RANKS="" BUILD="$REPO/build/bench-algos" BUILD_TDIST=1
while [ $# -gt 0 ]; do
    case "$1" in
        -w) WHAT=$2; shift 2 ;;
        -r) RUNS=$2; shift 2 ;;
        -n) RANKS=$2; shift 2 ;;
        -B) BUILD=$2; shift 2 ;;
        --no-build) BUILD_TDIST=0; shift ;;
        -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
        *) echo "unknown option $1" >&2; exit 2 ;;
    esac
done
case "$WHAT" in algos|fingerprint|both) ;; *) echo "-w: algos, fingerprint or both" >&2; exit 2 ;; esac
[[ "$RUNS" =~ ^[1-9][0-9]?$ ]] || { echo "-r: 1..99" >&2; exit 2; }
[ "$BUILD_TDIST" = 1 ] && build_tdist "$REPO" "$BUILD" "$BUILD/.algos-build.log" 1 tdistrun tdist-bench
RUN="$BUILD/tools/tdistrun/tdistrun"
BENCH="$BUILD/tools/tdist-bench/tdist-bench"
[ -x "$RUN" ] && [ -x "$BENCH" ] || die "tdistrun / tdist-bench not built in $BUILD"

# one_time NPROC OP BYTES ENV...: tdist-bench's median time (us) of OP at
# BYTES, every result checked (a wrong element fails the run).
one_time() {
    local np=$1 op=$2 bytes=$3 out
    shift 3
    out=$(env "$@" timeout -k 5 300 "$RUN" --nproc-per-node "$np" "$BENCH" -o "$op" \
          -b "$bytes" -e "$bytes" -n 20 -w 5 -k auto 2>&1) || { echo "$out" >&2; die "run failed: $op $bytes $*"; }
    echo "$out" | grep -q "_wrong_elements 0 elements" || { echo "$out" >&2; die "wrong results: $op $bytes $*"; }
    echo "$out" | sed -n 's/.*RESULT [a-z_0-9]*_time_[0-9A-Za-z]* \([0-9.]*\) us.*/\1/p' | head -n 1
}

median() { sort -g | awk '{v[NR]=$1} END {if (NR==0) {print "nan"} else if (NR%2) {print v[(NR+1)/2]} else {print (v[NR/2]+v[NR/2+1])/2}}'; }

declare -A samples
add() { samples[$1]="${samples[$1]:-} $2"; }

if [ "$WHAT" != fingerprint ]; then
    for ((r = 1; r <= RUNS; r++)); do
        for np in ${RANKS:-2 4}; do
            for bytes in 8 256 4096 65536 1048576 16777216; do
                for algo in ring rd direct auto; do
                    [ "$algo" = direct ] && [ "$bytes" -gt 1048576 ] && continue
                    t=$(one_time "$np" all_reduce "$bytes" TDIST_TRANSPORT=tcp TDIST_ALGO_ALLREDUCE="$algo")
                    add "algo_${algo}_tcp_${np}r_${bytes}B" "$t"
                done
            done
        done
    done
fi
if [ "$WHAT" != algos ]; then
    for ((r = 1; r <= RUNS; r++)); do
        for tp in shm tcp; do
            for op in all_reduce broadcast; do
                for chk in 1 0; do
                    t=$(one_time "${RANKS:-2}" "$op" 8 TDIST_TRANSPORT="$tp" TDIST_CHECK_FINGERPRINT="$chk")
                    add "fp_${op}_${tp}_8B_$([ "$chk" = 1 ] && echo checked || echo unchecked)" "$t"
                done
            done
        done
    done
fi
for k in $(printf '%s\n' "${!samples[@]}" | sort); do
    printf 'RESULT %s %s us\n' "$k" "$(printf '%s\n' ${samples[$k]} | median)"
done
