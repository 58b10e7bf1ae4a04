#!/usr/bin/env bash
# bench/compare/zero.sh — ZeRO against DDP + Adam, tdist and PyTorch side by
# side (docs/algorithms.md, "ZeRO"):
#   - step time on the 3M and 25M MLPs, 2 ranks: tdist's bench_zero_step
#     (DDP + Adam, ZeRO with the overlap hook, ZeRO without, interleaved in
#     one run) and bench/compare/zero_torch.py (DDP + Adam and
#     ZeroRedundancyOptimizer(Adam) on Gloo, which has no overlap, interleaved
#     in one run);
#   - Adam state bytes per rank, ZeRO / DDP + Adam, at 2 and 4 ranks.
#
#   bench/compare/zero.sh           # 3 runs, 3M and 25M, 2 ranks; state at 2 and 4 ranks
#   bench/compare/zero.sh -q        # smoke test: 1 run, 8 timed steps + 2 warm-up, 3M only
#   options: -r RUNS, -m "MODELS", -n STEPS, -w WARMUP, -s (do not build), -h
#
# Prints each run's lines, a summary (medians over runs) and RESULT lines:
#   zero_<model>_step_ratio (tdist ZeRO with overlap / tdist DDP + Adam),
#   zero_<model>_nooverlap_step_ratio, torch_zero_<model>_step_ratio,
#   zero_adam_state_bytes_ratio_<W>r (W = 2, 4; the overlap shard),
#   zero_adam_state_bytes_ratio_{by_params,flat}_<model>_<W>r (4 ranks: 3M only).
# Every invocation is bounded by timeout.
set -u -o pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
HERE="$REPO/bench/compare"
PY=/usr/bin/python3
BUILD="$REPO/build/bench-release"
RUNS=3 MODELS="3M 25M" STEPS="" WARMUP="" BUILD_TDIST=1 TMO=900

die() { echo "zero.sh: $*" >&2; exit 1; }
usage() { sed -n '2,20p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }
# shellcheck source=bench/compare/common.sh
. "$HERE/common.sh"

while getopts ":r:qm:n:w:sh" opt; do
    case "$opt" in
    r) RUNS=$OPTARG ;;
    q) RUNS=1 MODELS=3M STEPS=8 WARMUP=2 ;;
    m) MODELS=$OPTARG ;;
    n) STEPS=$OPTARG ;;
    w) WARMUP=$OPTARG ;;
    s) BUILD_TDIST=0 ;;
    h) usage; exit 0 ;;
    *) usage >&2; exit 2 ;;
    esac
done
[[ "$RUNS" =~ ^[1-9][0-9]?$ ]] || die "bad -r '$RUNS'"

TDISTRUN="$BUILD/tools/tdistrun/tdistrun"
ZSTEP="$BUILD/bench/bench_zero_step"
if [ "$BUILD_TDIST" = 1 ]; then
    mkdir -p "$REPO/build"
    build_tdist "$REPO" "$BUILD" "$REPO/build/.bench-zero-cmake.log" 3 bench_zero_step tdistrun
fi
[ -x "$TDISTRUN" ] && [ -x "$ZSTEP" ] || die "no $TDISTRUN or $ZSTEP (drop -s)"
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
ARGS=()
[ -n "$STEPS" ] && ARGS+=(-n "$STEPS")
[ -n "$WARMUP" ] && ARGS+=(-w "$WARMUP")
OUT=$(mktemp -d "${TMPDIR:-/tmp}/tdist-zero-XXXXXX") || die "mktemp"
RC=0

results() { sed -E 's/^\[rank [0-9]+\] //' "$1" | grep '^RESULT ' || true; }

for ((run = 1; run <= RUNS; run++)); do
    for model in $MODELS; do
        timeout -k 15 "$TMO" "$TDISTRUN" -q --nproc-per-node 2 "$ZSTEP" --model "$model" \
            "${ARGS[@]}" >"$OUT/t_${model}_$run" 2>&1 || { RC=1; cat "$OUT/t_${model}_$run" >&2; }
        timeout -k 15 "$TMO" "$PY" "$HERE/zero_torch.py" --nproc 2 --model "$model" \
            "${ARGS[@]}" >"$OUT/p_${model}_$run" 2>&1 || { RC=1; cat "$OUT/p_${model}_$run" >&2; }
        sed -E 's/^\[rank [0-9]+\] //' "$OUT/t_${model}_$run" | grep '^#' || true
        grep '^#' "$OUT/p_${model}_$run" || true
    done
done
# state bytes at 4 ranks: a short run of the 3M model
timeout -k 15 "$TMO" "$TDISTRUN" -q --nproc-per-node 4 "$ZSTEP" --model 3M -n 2 -w 1 \
    >"$OUT/t_state4" 2>&1 || { RC=1; cat "$OUT/t_state4" >&2; }

# medians over runs of every RESULT name (the 4-rank run gives only its state lines)
{
    for f in "$OUT"/t_*M_* "$OUT"/p_*; do [ -f "$f" ] && results "$f"; done
    results "$OUT/t_state4" | grep 'state_bytes'
} | "$PY" -c '
import sys
vals, unit = {}, {}
for line in sys.stdin:
    f = line.split()
    if len(f) >= 3:
        vals.setdefault(f[1], []).append(float(f[2]))
        unit[f[1]] = f[3] if len(f) > 3 else ""
for k in sorted(vals):
    v = sorted(vals[k])
    n = len(v)
    m = v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])
    print("RESULT %s %.4f %s" % (k, m, unit[k]))
'
rm -rf "$OUT"
exit $RC
