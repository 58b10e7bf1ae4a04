#!/usr/bin/env bash
# bench/compare/local_sgd.sh — how many bytes post-local SGD and DiLoCo
# save against DDP on examples/train_digits, and the test accuracy each
# reaches (the README's main job: 4 ranks under tdistrun, uneven shards,
# a Join per epoch, 20 epochs of SGD with momentum; never run as a test).
#
#   bench/compare/local_sgd.sh [-r RUNS] [-n RANKS] [-e EPOCHS]
#                              [-k "K..."] [-H "H..."] [-B BUILD] [--no-build]
# RUNS (default 3) runs of every configuration; RANKS (default 4); EPOCHS
# (default 20); K: the local-SGD averaging periods (default "4 8 16"); H:
# DiLoCo's inner steps, H or H:bf16 or H:int8 for a compressed
# pseudo-gradient (default "4 8 16 16:bf16 16:int8"); BUILD (default
# build/bench-local-sgd, Release).
#
# What each run prints (train_digits' last lines) and what is taken:
#   bytes   bytes of gradient (DDP), of gradient and parameters (local
#           SGD: the gradients while DDP averages them, then the
#           parameters at each averaging) or of pseudo-gradient (DiLoCo)
#           that each rank puts into the collectives, per iteration;
#   accuracy  the test images classified right, out of 360.
# Ends with RESULT lines, medians over the runs:
#   RESULT <cfg>_bytes_per_step <bytes> B
#   RESULT <cfg>_bytes_ratio_vs_ddp <x> ratio
#   RESULT <cfg>_test_accuracy <percent> %
# with cfg = ddp, local_sgd_k<K>, diloco_h<H>[_bf16|_int8]. Every run is
# bounded (300 s).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
die() { echo "local_sgd.sh: $*" >&2; exit 1; }
# shellcheck source=bench/compare/common.sh
. "$HERE/common.sh"

RUNS=3 RANKS=4 EPOCHS=20 KS="4 8 16" HS="4 8 16 16:bf16 16:int8" BUILD="$REPO/build/bench-local-sgd" BUILD_TDIST=1
while [ $# -gt 0 ]; do
    case "$1" in
        -r) RUNS=$2; shift 2 ;;
        -n) RANKS=$2; shift 2 ;;
        -e) EPOCHS=$2; shift 2 ;;
        -k) KS=$2; shift 2 ;;
        -H) HS=$2; shift 2 ;;
        -B) BUILD=$2; shift 2 ;;
        --no-build) BUILD_TDIST=0; shift ;;
        -h|--help) sed -n '2,26p' "$0"; exit 0 ;;
        *) echo "unknown option $1" >&2; exit 2 ;;
    esac
done
[[ "$RUNS" =~ ^[1-9][0-9]?$ ]] || { echo "-r: 1..99" >&2; exit 2; }
[[ "$RANKS" =~ ^[1-8]$ ]] || { echo "-n: 1..8" >&2; exit 2; }
[[ "$EPOCHS" =~ ^[1-9][0-9]{0,2}$ ]] || { echo "-e: 1..999" >&2; exit 2; }
[ "$BUILD_TDIST" = 1 ] && build_tdist "$REPO" "$BUILD" "$BUILD/.local-sgd-build.log" 1 tdistrun train_digits
RUN="$BUILD/tools/tdistrun/tdistrun"
TRAIN="$BUILD/examples/train_digits"
[ -x "$RUN" ] && [ -x "$TRAIN" ] || die "tdistrun / train_digits not built in $BUILD"
CSV="$BUILD/digits.csv"
if [ ! -s "$CSV" ]; then
    gz="$(dpkg -L python3-sklearn 2>/dev/null | grep '/sklearn/datasets/data/digits.csv.gz$' | head -n 1)"
    [ -n "$gz" ] || die "digits.csv.gz not found (python3-sklearn)"
    gzip -dc "$gz" >"$CSV"
fi

median() { sort -g | awk '{v[NR]=$1} END {if (NR==0) {print "nan"} else if (NR%2) {print v[(NR+1)/2]} else {print (v[NR/2]+v[NR/2+1])/2}}'; }
declare -A samples
add() { samples[$1]="${samples[$1]:-} $2"; }

# one CFG ARGS...: run train_digits once; add its bytes and test count.
one() {
    local cfg=$1 out bytes correct
    shift
    out=$(timeout -k 5 300 "$RUN" --nproc-per-node "$RANKS" "$TRAIN" "$CSV" "$EPOCHS" "$@" 2>&1) ||
        { echo "$out" >&2; die "run failed: $cfg"; }
    echo "$out" | grep -q "params_identical=yes" || { echo "$out" >&2; die "$cfg: parameters differ"; }
    bytes=$(echo "$out" | sed -n 's/.*\[rank 0\] [a-z]* [^ ]*: \([0-9]*\) bytes of .* per iteration.*/\1/p' | head -n 1)
    correct=$(echo "$out" | sed -n 's/.*test \([0-9]*\)\/360 correct.*/\1/p' | head -n 1)
    [ -n "$bytes" ] && [ -n "$correct" ] || { echo "$out" >&2; die "$cfg: no result line"; }
    echo "# $cfg run: $bytes B/step, $correct/360" >&2
    add "${cfg}_bytes" "$bytes"
    add "${cfg}_acc" "$(awk -v c="$correct" 'BEGIN {printf "%.2f", 100 * c / 360}')"
}

cfgs=(ddp)
for ((r = 1; r <= RUNS; r++)); do
    one ddp
    for k in $KS; do one "local_sgd_k$k" --local-sgd "$k"; done
    for h in $HS; do one "diloco_h${h/:/_}" --diloco "$h"; done
done
for k in $KS; do cfgs+=("local_sgd_k$k"); done
for h in $HS; do cfgs+=("diloco_h${h/:/_}"); done

ddp_bytes=$(echo "${samples[ddp_bytes]}" | tr ' ' '\n' | grep . | median)
for c in "${cfgs[@]}"; do
    b=$(echo "${samples[${c}_bytes]}" | tr ' ' '\n' | grep . | median)
    a=$(echo "${samples[${c}_acc]}" | tr ' ' '\n' | grep . | median)
    echo "RESULT ${c}_bytes_per_step $b B"
    echo "RESULT ${c}_bytes_ratio_vs_ddp $(awk -v b="$b" -v d="$ddp_bytes" 'BEGIN {printf "%.3f", b / d}') ratio"
    echo "RESULT ${c}_test_accuracy $a %"
done
