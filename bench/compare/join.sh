#!/usr/bin/env bash
# bench/compare/join.sh — what Join costs (docs/bench-join.md), for tdist and,
# beside it, PyTorch's own Join:
#
#   (1) the DDP step with the loop inside a Join and even inputs, against the
#       same step without Join (target <= 1.02x; PyTorch measures ~1.0x);
#   (2) the throughput of the active ranks when one of 4 ranks has no inputs
#       at all (it spends the run shadowing in tdist_join_end), against all 4
#       with even inputs (target >= 0.95x).
#
#   bench/compare/join.sh            # 5 runs, 3M model, 2 and 4 ranks, tdist and torch
#   bench/compare/join.sh -q         # smoke test: 1 run, 8 timed steps + 2 warm-up
#   bench/compare/join.sh -P tdist   # tdist only (no python3-torch needed)
#   bench/compare/join.sh -h         # every option
#
# Peers (both: the MLP step of bench/compare/ddp.sh, batch 64 per rank, one
# BLAS/intra-op thread per process, step time = median over steps of the
# slowest active rank's step):
#   tdist : bench_ddp_step (Release) under tools/tdistrun --bind-to BIND,
#           --mode ddp, plus --join, --join-disabled, --join-empty-rank R
#   torch : bench/compare/join_torch.py with /usr/bin/python3: DDP on gloo,
#           with and without torch.distributed.algorithms.join.Join
# Two ways of alternating, both in every run, for every world size and peer:
#   one process ("alt", the headline figures): ONE invocation runs all modes
#       in blocks of K steps in turn (bench_ddp_step --join-alternate,
#       join_torch.py --mode alternate): whatever else runs on the machine
#       hits every mode alike; per run, the median over rounds of the
#       per-round ratio;
#   separate processes ("sep"): one invocation per mode, in an order rotated
#       from run to run; per run, the ratio between invocations of that run.
# The table quotes medians over runs. See docs/bench-join.md.
set -u -o pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
HERE="$REPO/bench/compare"
PY=/usr/bin/python3 # Debian's interpreter: python3-torch lives there
PACKAGES=(python3-torch libopenblas0-pthread libopenblas-dev)
BUILD_TRIES=${BUILD_TRIES:-10} # the tree may be mid-edit: retry, 60 s apart

D_RUNS=5 D_MODEL=3M D_NPS="2 4" D_EMPTY_NPS="4" D_TIMEOUT=300 D_STEPS=50 D_WARMUP=5 D_BLOCK=5
RUNS=$D_RUNS MODEL=$D_MODEL NPS=$D_NPS EMPTY_NPS=$D_EMPTY_NPS PEER_TIMEOUT=$D_TIMEOUT
STEPS=$D_STEPS WARMUP=$D_WARMUP BLOCK=$D_BLOCK SEPARATE=1 EMPTY_RANK="" OUTDIR="" INSTALL=1 BUILD_TDIST=1
PEERS="tdist torch" BIND=core BUILD="$REPO/build/bench-release" QUICK=0 set_r=0 set_n=0 set_w=0

usage() {
    cat <<EOF
usage: bench/compare/join.sh [options]
  -r RUNS       runs; ratios are per run, the table quotes medians (default $D_RUNS)
  -q            quick smoke test: 1 run, 8 timed steps + 2 warm-up (-r/-n/-w still win)
  -n STEPS      timed steps per mode and invocation (default $D_STEPS)
  -w WARMUP     warm-up steps per invocation (default $D_WARMUP)
  -K STEPS      block length of the one-process alternation (default $D_BLOCK)
  -S            only the one-process alternation (skip the separate processes)
  -m MODEL      3M or 25M (default $D_MODEL)
  -p "RANKS"    world sizes for the even-input Join overhead (default "$D_NPS")
  -e "RANKS"    world sizes that also run the one-empty-rank mode (default "$D_EMPTY_NPS";
                each must be in -p)
  -E R          the rank without inputs (default: the last rank)
  -P "PEERS"    subset of "tdist torch" (default both)
  -B BIND       core (default: rank r on CPU r mod CPUs, both peers) or none
  -b DIR        tdist Release build directory (default $BUILD)
  -T SECONDS    deadline of every single invocation (default $D_TIMEOUT)
  -o DIR        keep the raw outputs in DIR (default: a new directory under
                BUILD/bench-join/runs)
  -x            do not check or install Debian packages
  -s            do not (re)build tdist; use the binaries already in BUILD
  -h            this help
Prints a table and ends with RESULT <name> <value> <unit> lines.
Exit 0 when every invocation succeeded, 1 otherwise, 2 on bad flags.
EOF
}

die() { echo "join.sh: $*" >&2; exit 1; }
# shellcheck source=bench/compare/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
bad() { echo "join.sh: $*" >&2; usage >&2; exit 2; }
is_uint() { [[ "$1" =~ ^[0-9]+$ ]]; }

while getopts ":r:qn:w:K:Sm:p:e:E:P:B:b:T:o:xsh" opt; do
    case "$opt" in
    r) RUNS=$OPTARG set_r=1 ;;
    q) QUICK=1 ;;
    n) STEPS=$OPTARG set_n=1 ;;
    w) WARMUP=$OPTARG set_w=1 ;;
    K) BLOCK=$OPTARG ;;
    S) SEPARATE=0 ;;
    m) MODEL=$OPTARG ;;
    p) NPS=$OPTARG ;;
    e) EMPTY_NPS=$OPTARG ;;
    E) EMPTY_RANK=$OPTARG ;;
    P) PEERS=$OPTARG ;;
    B) BIND=$OPTARG ;;
    b) BUILD=$OPTARG ;;
    T) PEER_TIMEOUT=$OPTARG ;;
    o) OUTDIR=$OPTARG ;;
    x) INSTALL=0 ;;
    s) BUILD_TDIST=0 ;;
    h) usage; exit 0 ;;
    :) bad "option -$OPTARG needs a value" ;;
    *) bad "unknown option -$OPTARG" ;;
    esac
done
shift $((OPTIND - 1))
[ $# -eq 0 ] || bad "unexpected argument '$1'"
if [ "$QUICK" = 1 ]; then
    [ "$set_r" = 1 ] || RUNS=1
    [ "$set_n" = 1 ] || STEPS=8
    [ "$set_w" = 1 ] || WARMUP=2
fi
case "$BIND" in core | none) ;; *) bad "bad -B '$BIND'" ;; esac
{ is_uint "$RUNS" && [ "$RUNS" -ge 1 ] && [ "$RUNS" -le 100 ]; } || bad "bad -r '$RUNS'"
{ is_uint "$STEPS" && [ "$STEPS" -ge 1 ] && [ "$STEPS" -le 100000 ]; } || bad "bad -n '$STEPS'"
{ is_uint "$WARMUP" && [ "$WARMUP" -ge 1 ] && [ "$WARMUP" -le 100000 ]; } || bad "bad -w '$WARMUP' (>= 1)"
{ is_uint "$BLOCK" && [ "$BLOCK" -ge 1 ] && [ "$BLOCK" -le 100000 ]; } || bad "bad -K '$BLOCK'"
{ is_uint "$PEER_TIMEOUT" && [ "$PEER_TIMEOUT" -ge 10 ]; } || bad "bad -T '$PEER_TIMEOUT' (>= 10)"
[[ "$MODEL" == 3M || "$MODEL" == 25M ]] || bad "bad -m '$MODEL'"
[ -n "$NPS" ] || bad "empty -p"
for np in $NPS; do { is_uint "$np" && [ "$np" -ge 2 ] && [ "$np" -le 64 ]; } || bad "bad world size '$np'"; done
for np in $EMPTY_NPS; do
    [[ " $NPS " == *" $np "* ]] || bad "-e: world size $np is not in -p \"$NPS\""
done
[ -z "$EMPTY_RANK" ] || is_uint "$EMPTY_RANK" || bad "bad -E '$EMPTY_RANK'"
[ -n "$PEERS" ] || bad "empty -P"
for p in $PEERS; do [[ "$p" == tdist || "$p" == torch ]] || bad "bad peer '$p'"; done
has_peer() { [[ " $PEERS " == *" $1 "* ]]; }
empty_rank_of() { if [ -n "$EMPTY_RANK" ]; then echo "$EMPTY_RANK"; else echo $(($1 - 1)); fi; }
for np in $EMPTY_NPS; do [ "$(empty_rank_of "$np")" -lt "$np" ] || bad "-E $EMPTY_RANK: not below $np"; done

# ------------------------------------------------------------ packages
if [ "$INSTALL" = 1 ]; then
    if has_peer torch; then install_missing "${PACKAGES[@]}"; else install_missing libopenblas-dev; fi
fi

# ------------------------------------------------------------ build
TDISTRUN="$BUILD/tools/tdistrun/tdistrun"
DDP_STEP="$BUILD/bench/bench_ddp_step"
if has_peer tdist && [ "$BUILD_TDIST" = 1 ]; then
    mkdir -p "$BUILD"
    LOG="$BUILD/bench-join-build.log"
    build_tdist "$REPO" "$BUILD" "$LOG" "$BUILD_TRIES" bench_ddp_step tdistrun
fi
if has_peer tdist && { [ ! -x "$TDISTRUN" ] || [ ! -x "$DDP_STEP" ]; }; then
    die "no $TDISTRUN or $DDP_STEP (drop -s)"
fi
if has_peer torch; then
    timeout -k 10 120 "$PY" -c 'from torch.distributed.algorithms.join import Join; import torch.distributed as d; assert d.is_gloo_available()' ||
        die "$PY cannot import torch with Gloo and Join (python3-torch, libopenblas0-pthread)"
fi

# ------------------------------------------------------------ runs
[ -n "$OUTDIR" ] || OUTDIR="$BUILD/bench-join/runs/$(date +%Y%m%d-%H%M%S)-$$"
mkdir -p "$OUTDIR" || die "cannot create $OUTDIR"
DATA="$OUTDIR/rows.txt"     # run peer mode model world median min max ...
ALT="$OUTDIR/alt.txt"       # run peer world mode ratio_over_ddp (one-process alternation)
STATUS="$OUTDIR/status.txt" # run peer mode world exit_status
: >"$DATA"
: >"$ALT"
: >"$STATUS"
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 # one thread per process, both peers

# run_one RUN PEER MODE NPROC: one invocation (MODE: ddp, join, joinoff,
# empty, or alt: all of them in one process); its ROWs appended to $DATA,
# alt's per-round ratios to $ALT.
run_one() {
    local run=$1 peer=$2 mode=$3 np=$4 rc args=() with_empty=0
    local base="$OUTDIR/${peer}_${mode}${np}_run${run}"
    [[ " $EMPTY_NPS " == *" $np "* ]] && with_empty=1
    case "$peer" in
    tdist)
        case "$mode" in
        join) args=(--join) ;;
        joinoff) args=(--join-disabled) ;;
        empty) args=(--join-empty-rank "$(empty_rank_of "$np")") ;;
        alt)
            args=(--block "$BLOCK" --join-alternate "ddp,join,off")
            [ "$with_empty" = 1 ] &&
                args=(--block "$BLOCK" --join-alternate "ddp,join,off,empty" --join-empty-rank "$(empty_rank_of "$np")")
            ;;
        esac
        timeout -k 15 "$PEER_TIMEOUT" "$TDISTRUN" -q --nproc-per-node "$np" --bind-to "$BIND" \
            "$DDP_STEP" --mode ddp --model "$MODEL" --threads 1 -n "$STEPS" -w "$WARMUP" \
            --no-probe "${args[@]}" >"$base.out" 2>"$base.err"
        rc=$?
        ;;
    torch)
        case "$mode" in
        ddp) args=(--mode ddp) ;;
        join) args=(--mode join) ;;
        empty) args=(--mode join --empty-rank "$(empty_rank_of "$np")") ;;
        alt)
            args=(--mode alternate --block "$BLOCK")
            [ "$with_empty" = 1 ] && args+=(--with-empty --empty-rank "$(empty_rank_of "$np")")
            ;;
        esac
        timeout -k 15 "$PEER_TIMEOUT" "$PY" "$HERE/join_torch.py" "${args[@]}" --model "$MODEL" \
            --nproc "$np" --bind "$BIND" --threads 1 -n "$STEPS" -w "$WARMUP" \
            --timeout $((PEER_TIMEOUT - 5)) >"$base.out" 2>"$base.err"
        rc=$?
        ;;
    esac
    echo "$run $peer $mode $np $rc" >>"$STATUS"
    # "ROW peer mode model world median min max ..." (tdistrun prefixes "[rank 0] ")
    sed -E 's/^\[rank [0-9]+\] //' "$base.out" |
        awk -v run="$run" -v m="$mode" '$1 == "ROW" && NF == 12 { $1 = run; if (m != "alt") $3 = m; print }' >>"$DATA"
    # "RESULT [torch_]step_<model>_ddp<np>_alt_<mode>_over_ddp <ratio> x"
    sed -E 's/^\[rank [0-9]+\] //' "$base.out" |
        sed -nE "s/^RESULT (torch_)?(ddp_)?step_[0-9A-Z]+_ddp${np}_alt_([a-z]+)_over_ddp ([0-9.]+) x\$/$run $peer $np \3 \4/p" >>"$ALT"
    if [ "$rc" != 0 ]; then
        echo "# $peer $mode ($np processes, run $run) exited with status $rc; last lines of" \
            "$base.err:" >&2
        tail -n 5 "$base.err" | sed 's/^/#   /' >&2
    fi
}

# busy CPU seconds of the whole machine (/proc/stat: user nice system irq softirq steal)
busy_cpu_s() { awk '$1 == "cpu" { printf "%.2f", ($2 + $3 + $4 + $7 + $8 + $9) / 100 }' /proc/stat; }
# CPU seconds of this script's finished children (bash's `times`, second line;
# run in this shell, not in a command substitution's subshell)
children_cpu_s() {
    times >"$OUTDIR/times.txt"
    awk 'NR == 2 { split($1, u, /[ms]/); split($2, s, /[ms]/); printf "%.2f", u[1] * 60 + u[2] + s[1] * 60 + s[2] }' "$OUTDIR/times.txt"
}
children_cpu_s >"$OUTDIR/kids0.txt"
BUSY0=$(busy_cpu_s) KIDS0=$(cat "$OUTDIR/kids0.txt") WALL0=$(date +%s.%N)
echo "# Join benchmark: model $MODEL, world sizes $NPS (one empty rank: $EMPTY_NPS), $RUNS" \
    "run(s), $STEPS timed + $WARMUP warm-up steps, peers: $PEERS, bind $BIND; raw output in" \
    "$OUTDIR" >&2
for ((run = 1; run <= RUNS; run++)); do
    for np in $NPS; do
        for peer in $PEERS; do
            echo "# run $run/$RUNS: $np ranks, $peer: all modes in one process" >&2
            run_one "$run" "$peer" alt "$np"
            [ "$SEPARATE" = 1 ] || continue
            modes=(ddp join)
            [ "$peer" = tdist ] && modes+=(joinoff)
            [[ " $EMPTY_NPS " == *" $np "* ]] && modes+=(empty)
            k=${#modes[@]}
            echo "# run $run/$RUNS: $np ranks, $peer: ${modes[*]}, one process each" >&2
            for ((i = 0; i < k; i++)); do # rotated order: no mode always first
                run_one "$run" "$peer" "${modes[$(((i + run - 1) % k))]}" "$np"
            done
        done
    done
done

# Did anything else run? The machine's busy CPU time minus our children's.
children_cpu_s >"$OUTDIR/kids1.txt"
BUSY1=$(busy_cpu_s) KIDS1=$(cat "$OUTDIR/kids1.txt") WALL1=$(date +%s.%N)
OTHER_LINE=$(awk -v b0="$BUSY0" -v b1="$BUSY1" -v k0="$KIDS0" -v k1="$KIDS1" -v w0="$WALL0" \
    -v w1="$WALL1" -v n="$(getconf _NPROCESSORS_ONLN)" 'BEGIN {
        o = (b1 - b0) - (k1 - k0); if (o < 0) o = 0; w = w1 - w0
        printf "# CPU time of other processes during the runs: %.1f s in %.1f s on %d CPUs (%.1f%% of the machine; the benchmark itself used %.1f s)", o, w, n, 100 * o / (w * n), k1 - k0 }')

# ------------------------------------------------------------ table
TABLE_PY=python3
has_peer torch && TABLE_PY=$PY
"$TABLE_PY" - "$DATA" "$ALT" "$STATUS" "$RUNS" "$MODEL" "$NPS" "$EMPTY_NPS" "$PEERS" "$BIND" \
    "$STEPS" "$WARMUP" "$BLOCK" "$SEPARATE" "$OTHER_LINE" <<'PYEOF'
import statistics
import sys

(data, alt, status, runs, model, nps, empty_nps, peers, bind, steps, warmup, block,
 separate, other_line) = sys.argv[1:15]
runs = int(runs)
nps = [int(x) for x in nps.split()]
empty_nps = [int(x) for x in empty_nps.split()]
peers = peers.split()
rows = {}  # (peer, mode, world) -> {run: median_ms}; alt modes are "alt_<mode>"
for line in open(data):
    f = line.split()
    if len(f) != 12:
        continue
    rows.setdefault((f[1], f[2], int(f[4])), {})[int(f[0])] = float(f[5])
altr = {}  # (peer, world, mode) -> {run: per-round ratio over ddp}
for line in open(alt):
    f = line.split()
    if len(f) == 5:
        altr.setdefault((f[1], int(f[2]), f[3]), {})[int(f[0])] = float(f[4])
failed = [l.split() for l in open(status) if len(l.split()) == 5 and l.split()[4] != "0"]


def med(v):
    return statistics.median(v) if v else None


def med_ms(peer, mode, np_):
    return med(list(rows.get((peer, mode, np_), {}).values()))


def sep_ratios(peer, num, den, np_):
    """per-run num/den between separate invocations of the same run"""
    a, b = rows.get((peer, num, np_), {}), rows.get((peer, den, np_), {})
    return [a[k] / b[k] for k in sorted(a) if k in b and b[k] > 0]


def alt_ratios(peer, mode, np_):
    d = altr.get((peer, np_, mode), {})
    return [d[k] for k in sorted(d)]


def fmt(v, spec="%.2f", w=8):
    return (spec % v).rjust(w) if v is not None else "-".rjust(w)


def inv(v):
    return [1 / x for x in v if x > 0]


print()
print("== Join cost, model %s, batch 64 per rank, 1 thread per process, bind %s, %s timed steps"
      " per mode + %s warm-up; median of %d run(s) ==" % (model, bind, steps, warmup, runs))
head = "%-5s %-3s %-3s | %8s %8s %8s %8s | %9s %9s | %10s" % (
    "peer", "np", "how", "DDP", "+Join", "Join off", "1 empty", "Join/DDP", "off/DDP", "thr 1empty")
print(head)
print("%-5s %-3s %-3s | %8s %8s %8s %8s | %9s %9s | %10s" % (
    "", "", "", "ms", "ms", "ms", "ms", "even", "even", "vs DDP"))
print("-" * len(head))
results = []
per_run = []
for np_ in nps:
    for p in peers:
        pre = "" if p == "tdist" else "torch_"
        # one process, all modes in blocks (headline)
        a_ms = [med_ms(p, "alt_" + m, np_) for m in ("ddp", "join", "off", "empty")]
        a_join, a_off = med(alt_ratios(p, "join", np_)), med(alt_ratios(p, "off", np_))
        a_thr = med(inv(alt_ratios(p, "empty", np_)))
        print("%-5s %-3d %-3s | %s %s %s %s | %s %s | %s" % (
            p, np_, "alt", *(fmt(v) for v in a_ms), fmt(a_join, "%.3fx", 9),
            fmt(a_off, "%.3fx", 9), fmt(a_thr, "%.3fx", 10)))
        for name, v in (("join_overhead_even_%dr" % np_, a_join),
                        ("join_disabled_overhead_even_%dr" % np_, a_off),
                        ("join_one_empty_%dr_throughput" % np_, a_thr)):
            if v is not None:
                results.append((pre + name, v, "x"))
        for m, v in zip(("ddp", "join", "joinoff", "one_empty"), a_ms):
            if v is not None:
                results.append(("%sjoin_step_%s_%dr_ms" % (pre, m, np_), v, "ms"))
        for m in ("join", "off", "empty"):
            rr = alt_ratios(p, m, np_)
            if rr:
                per_run.append("# per-run %s/ddp (one process, median of per-round ratios), %s %d "
                               "ranks: %s" % (m, p, np_, " ".join("%.3f" % x for x in rr)))
        if separate != "1":
            continue
        # separate processes
        s_ms = [med_ms(p, m, np_) for m in ("ddp", "join", "joinoff", "empty")]
        s_join = med(sep_ratios(p, "join", "ddp", np_))
        s_off = med(sep_ratios(p, "joinoff", "ddp", np_))
        s_thr = med(inv(sep_ratios(p, "empty", "ddp", np_)))
        print("%-5s %-3d %-3s | %s %s %s %s | %s %s | %s" % (
            p, np_, "sep", *(fmt(v) for v in s_ms), fmt(s_join, "%.3fx", 9),
            fmt(s_off, "%.3fx", 9), fmt(s_thr, "%.3fx", 10)))
        for name, v in (("join_overhead_even_%dr_separate" % np_, s_join),
                        ("join_disabled_overhead_even_%dr_separate" % np_, s_off),
                        ("join_one_empty_%dr_throughput_separate" % np_, s_thr)):
            if v is not None:
                results.append((pre + name, v, "x"))
        for num in ("join", "joinoff", "empty"):
            rr = sep_ratios(p, num, "ddp", np_)
            if rr:
                per_run.append("# per-run %s/ddp (separate processes), %s %d ranks: %s" % (
                    num, p, np_, " ".join("%.3f" % x for x in rr)))
print()
print("# DDP = the DDP step, no Join; +Join = inside a Join, even inputs; Join off ="
      " tdist_join_opts.enable = false (tdist only); 1 empty = one rank (the last unless -E) has"
      " no inputs and shadows in tdist_join_end / Join.__exit__, the others inside the Join.")
print("# how: alt = all modes in one process, blocks of %s steps in turn (the figures in the"
      " RESULT lines without suffix); sep = one process per mode (RESULT ..._separate)." % block)
print("# step time = median over steps of the slowest active rank's step, median over runs."
      " Ratios are per run (alt: median of the per-round ratios; sep: adjacent invocations),"
      " then the median over runs.")
print("# Join/DDP: target <= 1.02x. thr 1empty = active-rank throughput (steps/s of each active"
      " rank) with one rank empty over all ranks even without Join = DDP ms / 1 empty ms;"
      " target >= 0.95x.")
for l in per_run:
    print(l)
print(other_line)
for f in failed:
    print("# FAILED: %s %s, %s processes, run %s: exit status %s" % (f[1], f[2], f[3], f[0], f[4]))
print()
for name, v, unit in results:
    print("RESULT %s %.3f %s" % (name, v, unit))
print("RESULT join_failed_invocations %d count" % len(failed))
sys.exit(1 if failed else 0)
PYEOF
