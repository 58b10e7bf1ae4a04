#!/usr/bin/env bash
# bench/compare/gpt.sh — tokens per second of the main job's GPT training
# step: tdist DDP (bench/gpt_step.c under tdistrun) against the same model,
# shapes and batch in PyTorch DDP on Gloo (bench/compare/gpt_torch.py), in
# the same run, each also alone in one process (DDP/local).
#
#   bench/compare/gpt.sh [-r RUNS] [-n STEPS] [-w WARMUP] [-p RANKS] [-x] [-s]
#
# Model (both): 4 layers, 4 heads, 128 channels, context 64, byte
# vocabulary; batch 8 x 64 per rank; AdamW, clipping at norm 1; one
# BLAS/intra-op thread per process. Each run interleaves, per peer: local
# (1 process), local on RANKS processes at once (no communication), ddp;
# the figures are medians over runs.
# -x: do not check or install Debian packages; -s: do not (re)build.
# Ends with
#   RESULT gpt_tokens_per_s_vs_torch <tdist ddp / torch ddp tokens/s> ratio
#   RESULT gpt_tdist_ddp_tokens_per_s <x> tokens/s   (and torch's)
#   RESULT gpt_tdist_ddp_over_local <ddp step time / local step time> ratio   (and torch's)
#   RESULT gpt_tdist_ddp_over_local_shared <ddp step time / step time of RANKS
#          local processes at once, no communication> ratio   (and torch's):
#          what DDP costs beyond the ranks sharing the machine
set -u -o pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PY=/usr/bin/python3
BUILD="$REPO/build/bench-release"
RUNS=3 STEPS=20 WARMUP=3 NP=2 INSTALL=1 BUILD_IT=1
while getopts ":r:n:w:p:xsh" o; do
    case "$o" in
    r) RUNS=$OPTARG ;; n) STEPS=$OPTARG ;; w) WARMUP=$OPTARG ;; p) NP=$OPTARG ;;
    x) INSTALL=0 ;; s) BUILD_IT=0 ;;
    h) sed -n '2,21p' "$0"; exit 0 ;;
    *) echo "gpt.sh: bad option (see -h)" >&2; exit 2 ;;
    esac
done
for v in "$RUNS" "$STEPS" "$WARMUP" "$NP"; do
    [[ "$v" =~ ^[0-9]+$ ]] && ((v >= 1 && v <= 100000)) || { echo "gpt.sh: bad number '$v'" >&2; exit 2; }
done
if ((INSTALL)); then
    # shellcheck source=scripts/deps.sh
    . "$REPO/scripts/deps.sh"
    ensure_packages "${TDIST_BUILD_PACKAGES[@]}" python3-torch || exit 1
fi
if ((BUILD_IT)); then
    cmake -S "$REPO" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTDIST_BUILD_TESTS=OFF \
          -DTDIST_BUILD_BENCH=ON >/dev/null || exit 1
    cmake --build "$BUILD" --parallel 2 --target tdistrun bench_gpt_step >/dev/null || exit 1
fi
TDISTRUN="$BUILD/tools/tdistrun/tdistrun" BENCH="$BUILD/bench/bench_gpt_step"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
args=(-n "$STEPS" -w "$WARMUP")
fail=0
for ((r = 1; r <= RUNS; r++)); do
    for n in 1 "$NP"; do # alone, and NP at once without communication
        timeout 600 "$TDISTRUN" -q --nproc-per-node "$n" "$BENCH" --mode local "${args[@]}" >>"$out/rows" || fail=1
    done
    timeout 600 "$TDISTRUN" -q --nproc-per-node "$NP" "$BENCH" --mode ddp "${args[@]}" >>"$out/rows" || fail=1
    for n in 1 "$NP"; do
        timeout 600 "$PY" "$REPO/bench/compare/gpt_torch.py" --mode local --nproc "$n" "${args[@]}" >>"$out/rows" || fail=1
    done
    timeout 600 "$PY" "$REPO/bench/compare/gpt_torch.py" --mode ddp --nproc "$NP" "${args[@]}" >>"$out/rows" || fail=1
done
sed 's/^\[rank 0\] //' "$out/rows" | grep '^ROW ' >"$out/r" || true
med() { # med PEER MODE RANKS FIELD: the median of a column over runs
    awk -v p="$1" -v m="$2" -v n="$3" -v f="$4" '$2 == p && $3 == m && $4 == n { print $f }' "$out/r" | sort -g |
        awk '{ v[NR] = $1 } END { if (NR) print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'
}
printf "%-6s %-6s %6s %12s %10s %8s\n" peer mode ranks tokens/s ms/step hidden
for p in tdist torch; do
    for mn in "local 1" "local $NP" "ddp $NP"; do
        # shellcheck disable=SC2086
        set -- $mn # split "MODE RANKS"
        printf "%-6s %-6s %6s %12s %10s %8s\n" $p "$1" "$2" "$(med $p "$1" "$2" 5)" \
            "$(med $p "$1" "$2" 6)" "$(med $p "$1" "$2" 7)"
    done
done
td=$(med tdist ddp "$NP" 5) tt=$(med torch ddp "$NP" 5)
if [ -n "$td" ] && [ -n "$tt" ]; then
    echo "RESULT gpt_tokens_per_s_vs_torch $(awk -v a="$td" -v b="$tt" 'BEGIN { printf "%.3f", a / b }') ratio"
    echo "RESULT gpt_tdist_ddp_tokens_per_s $td tokens/s"
    echo "RESULT gpt_torch_ddp_tokens_per_s $tt tokens/s"
    for p in tdist torch; do
        d=$(med $p ddp "$NP" 6)
        echo "RESULT gpt_${p}_ddp_over_local $(awk -v a="$d" -v b="$(med $p local 1 6)" 'BEGIN { printf "%.3f", a / b }') ratio"
        echo "RESULT gpt_${p}_ddp_over_local_shared $(awk -v a="$d" -v b="$(med $p local "$NP" 6)" 'BEGIN { printf "%.3f", a / b }') ratio"
    done
else
    fail=1
fi
exit $fail
