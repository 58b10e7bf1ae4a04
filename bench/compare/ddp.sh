#!/usr/bin/env bash
# bench/compare/ddp.sh — DDP training-step time: tdist DDP against the same
# step in one process, and PyTorch DDP (Gloo) against PyTorch in one
# process, on the same MLPs in the same run (docs/bench-ddp.md).
#
#   bench/compare/ddp.sh            # 3 runs, models 3M and 25M, 2 ranks
#   bench/compare/ddp.sh -q         # smoke test: 1 run, 8 timed steps + 2 warm-up
#   bench/compare/ddp.sh -H "allreduce fp16 bf16 powersgd1 powersgd4 int8"   # comm hooks
#   bench/compare/ddp.sh -h         # every option
#
# Peers (both: batch 64 per rank, softmax cross-entropy, SGD lr 0.01, one
# BLAS/intra-op thread per process, step time = median over steps of the
# slowest rank's step):
#   tdist : bench/ddp_step.c (bench_ddp_step, Release) under tools/tdistrun,
#           --mode local (1 process) and --mode ddp (2 ranks, default options)
#   torch : bench/compare/ddp_torch.py with /usr/bin/python3 (Debian's
#           python3-torch): local (1 process) and DistributedDataParallel on
#           "gloo" (2 processes, FileStore)
# Each run interleaves, per model: tdist local, tdist ddp, torch local,
# torch ddp (and, with -c, each peer's local mode on 2 processes at once).
# With -H HOOKS, per model and peer: local, then DDP with each comm hook in
# turn (torch only for the hooks it has: allreduce, fp16, powersgdR), and a
# table of step time, DDP/local and bytes sent per iteration per hook.
# The table quotes medians over runs. See docs/bench-ddp.md.
set -u -o pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
HERE="$REPO/bench/compare"
PY=/usr/bin/python3 # Debian's interpreter: python3-torch lives there
PACKAGES=(python3-torch libopenblas0-pthread libopenblas-dev)
BUILD="$REPO/build/bench-release"
BUILD_TRIES=${BUILD_TRIES:-10} # the tree may be mid-edit: retry, 60 s apart

D_RUNS=3 D_MODELS="3M 25M" D_NP=2 D_TIMEOUT=300
RUNS=$D_RUNS MODELS=$D_MODELS NP=$D_NP PEER_TIMEOUT=$D_TIMEOUT
STEPS="" WARMUP="" OUTDIR="" TDIST_EXTRA="" INSTALL=1 BUILD_TDIST=1 CONTENTION=0 PEERS="tdist torch"
QUICK=0 set_r=0 HOOKS=

usage() {
    cat <<EOF
usage: bench/compare/ddp.sh [options]
  -r RUNS       runs; the table quotes the median over runs (default $D_RUNS)
  -q            quick smoke test: 1 run, 8 timed steps + 2 warm-up (-r/-n/-w still win)
  -n STEPS      timed steps per model (default: 3M 30, 25M 10)
  -w WARMUP     warm-up steps per model (default: 3M 5, 25M 3)
  -m "MODELS"   subset of "3M 25M" (default "$D_MODELS")
  -p RANKS      DDP ranks (default $D_NP)
  -P "PEERS"    subset of "tdist torch" (default both)
  -A "ARGS"     extra bench_ddp_step arguments for tdist's DDP runs, for experiments
                (e.g. -A "--view" or -A "--cap 4"); the default options otherwise
  -H "HOOKS"    comm hooks instead of the default DDP run, each a DDP run of its own:
                allreduce (the reducer's own averaging; torch: no hook),
                allreduce_hook (tdist only: tdist_ddp_allreduce_hook registered),
                allreduce_grads (tdist only: the same, with TDIST_DDP_HOOK_GRADS),
                fp16, bf16 (tdist only: PyTorch 1.13's Gloo has no bf16 all_reduce),
                fp16_bucket (tdist only: the fp16 hook on the bucket, with DDP's copies),
                powersgdR (rank R, start_powerSGD_iter 2, error feedback, warm start),
                int8 (tdist only); prints step time, DDP/local, bytes per iteration
  -c            also run each peer's local mode on RANKS processes at once (no
                communication): what sharing the machine alone costs
  -B BIND       auto (default: one rank per core when ranks <= CPUs, as
                bench/compare/run.sh), core, or none — for both peers
  -T SECONDS    deadline of every single invocation (default $D_TIMEOUT)
  -o DIR        keep the raw outputs in DIR (default: a new directory under
                $BUILD/bench-ddp/runs)
  -x            do not check or install Debian packages
  -s            do not (re)build tdist; use the binaries already in $BUILD
  -h            this help
Prints a table and ends with RESULT <name> <value> <unit> lines.
Exit 0 when every invocation succeeded, 1 otherwise, 2 on bad flags.
EOF
}

die() { echo "ddp.sh: $*" >&2; exit 1; }
# shellcheck source=bench/compare/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
bad() { echo "ddp.sh: $*" >&2; usage >&2; exit 2; }
is_uint() { [[ "$1" =~ ^[0-9]+$ ]]; }

while getopts ":r:qn:w:m:p:P:A:H:cB:T:o:xsh" opt; do
    case "$opt" in
    r) RUNS=$OPTARG set_r=1 ;;
    q) QUICK=1 ;;
    n) STEPS=$OPTARG ;;
    w) WARMUP=$OPTARG ;;
    m) MODELS=$OPTARG ;;
    p) NP=$OPTARG ;;
    P) PEERS=$OPTARG ;;
    A) TDIST_EXTRA=$OPTARG ;;
    H) HOOKS=$OPTARG ;;
    c) CONTENTION=1 ;;
    B) BIND=$OPTARG ;;
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
    [ -n "$STEPS" ] || STEPS=8
    [ -n "$WARMUP" ] || WARMUP=2
fi
case "${BIND:=auto}" in auto | core | none) ;; *) bad "bad -B '$BIND'" ;; esac
{ is_uint "$RUNS" && [ "$RUNS" -ge 1 ] && [ "$RUNS" -le 100 ]; } || bad "bad -r '$RUNS'"
[ -z "$STEPS" ] || { is_uint "$STEPS" && [ "$STEPS" -ge 1 ] && [ "$STEPS" -le 100000 ]; } ||
    bad "bad -n '$STEPS'"
[ -z "$WARMUP" ] || { is_uint "$WARMUP" && [ "$WARMUP" -le 100000 ]; } || bad "bad -w '$WARMUP'"
{ is_uint "$NP" && [ "$NP" -ge 2 ] && [ "$NP" -le 64 ]; } || bad "bad -p '$NP' (2..64)"
{ is_uint "$PEER_TIMEOUT" && [ "$PEER_TIMEOUT" -ge 10 ]; } || bad "bad -T '$PEER_TIMEOUT' (>= 10)"
[ -n "$MODELS" ] || bad "empty -m"
for m in $MODELS; do [[ "$m" == 3M || "$m" == 25M ]] || bad "bad model '$m'"; done
[ -n "$PEERS" ] || bad "empty -P"
for p in $PEERS; do [[ "$p" == tdist || "$p" == torch ]] || bad "bad peer '$p'"; done
has_peer() { [[ " $PEERS " == *" $1 "* ]]; }
for h in $HOOKS; do
    [[ "$h" =~ ^(allreduce|allreduce_hook|allreduce_grads|fp16|fp16_bucket|bf16|int8|powersgd[1-9][0-9]?)$ ]] ||
        bad "bad hook '$h'"
done
# The hooks PyTorch's side runs (bench/compare/ddp_torch.py --hook).
torch_has_hook() { [[ "$1" =~ ^(allreduce|fp16|powersgd[1248])$ ]]; }

# ------------------------------------------------------------ packages
[ "$INSTALL" = 1 ] && install_missing "${PACKAGES[@]}"

# ------------------------------------------------------------ build
TDISTRUN="$BUILD/tools/tdistrun/tdistrun"
DDP_STEP="$BUILD/bench/bench_ddp_step"
if has_peer tdist && [ "$BUILD_TDIST" = 1 ]; then
    mkdir -p "$REPO/build"
    LOG="$REPO/build/.bench-ddp-cmake.log"
    build_tdist "$REPO" "$BUILD" "$LOG" "$BUILD_TRIES" bench_ddp_step tdistrun
fi
if has_peer tdist && { [ ! -x "$TDISTRUN" ] || [ ! -x "$DDP_STEP" ]; }; then
    die "no $TDISTRUN or $DDP_STEP (drop -s)"
fi
if has_peer torch; then
    timeout -k 10 120 "$PY" -c 'import torch.distributed as d; assert d.is_gloo_available()' ||
        die "$PY cannot import torch with Gloo (python3-torch, libopenblas0-pthread)"
fi

# ------------------------------------------------------------ runs
[ -n "$OUTDIR" ] || OUTDIR="$BUILD/bench-ddp/runs/$(date +%Y%m%d-%H%M%S)-$$"
mkdir -p "$OUTDIR" || die "cannot create $OUTDIR"
DATA="$OUTDIR/rows.txt"     # run peer mode model world median min max overlap wait comm compute
STATUS="$OUTDIR/status.txt" # run peer mode model world exit_status
BYTES="$OUTDIR/bytes.txt"   # run peer mode model world hook_bytes f32_ring_bytes (per iteration)
: >"$DATA"
: >"$STATUS"
: >"$BYTES"
NCPU=$(nproc 2>/dev/null || echo 1)
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 # one thread per process, both peers
STEP_ARGS=()
[ -n "$STEPS" ] && STEP_ARGS+=(-n "$STEPS")
[ -n "$WARMUP" ] && STEP_ARGS+=(-w "$WARMUP")

# run_one RUN PEER MODE MODEL NPROC [HOOK]: one invocation; its ROW appended
# to $DATA (and with a HOOK its BYTES line to $BYTES).
run_one() {
    local run=$1 peer=$2 mode=$3 model=$4 np=$5 hook=${6:-} rc bind=$BIND extra=() textra=()
    # shellcheck disable=SC2206 # TDIST_EXTRA is a list of words on purpose
    [ "$mode" = ddp ] && extra=($TDIST_EXTRA)
    if [ -n "$hook" ]; then
        extra+=(--hook "$hook" --no-probe)
        textra=(--hook "$hook")
    fi
    local base="$OUTDIR/${model}_${peer}_${mode}${np}${hook:+_$hook}_run${run}"
    if [ "$bind" = auto ]; then
        if [ "$np" -le "$NCPU" ]; then bind=core; else bind=none; fi
    fi
    case "$peer" in
    tdist)
        timeout -k 15 "$PEER_TIMEOUT" "$TDISTRUN" -q --nproc-per-node "$np" --bind-to "$bind" \
            "$DDP_STEP" --mode "$mode" --model "$model" --threads 1 "${STEP_ARGS[@]}" \
            "${extra[@]}" >"$base.out" 2>"$base.err"
        rc=$?
        ;;
    torch)
        timeout -k 15 "$PEER_TIMEOUT" "$PY" "$HERE/ddp_torch.py" --mode "$mode" --model "$model" \
            --nproc "$np" --bind "$bind" --threads 1 --timeout $((PEER_TIMEOUT - 5)) \
            "${STEP_ARGS[@]}" "${textra[@]}" >"$base.out" 2>"$base.err"
        rc=$?
        ;;
    esac
    echo "$run $peer $mode${hook:+_$hook} $model $np $rc" >>"$STATUS"
    # "ROW peer mode model world median min max overlap wait comm compute"
    # (tdistrun prefixes "[rank 0] ").
    sed -E 's/^\[rank [0-9]+\] //' "$base.out" |
        awk -v run="$run" '$1 == "ROW" && NF == 12 { $1 = run; print }' >>"$DATA"
    # "BYTES peer mode model world hook_bytes f32_ring_bytes"
    sed -E 's/^\[rank [0-9]+\] //' "$base.out" |
        awk -v run="$run" '$1 == "BYTES" && NF == 7 { $1 = run; print }' >>"$BYTES"
    if [ "$rc" != 0 ]; then
        echo "# $peer $mode ($np processes, $model, run $run) exited with status $rc;" \
            "last lines of $base.err:" >&2
        tail -n 5 "$base.err" | sed 's/^/#   /' >&2
    fi
}

echo "# DDP step time: models $MODELS, $NP ranks, $RUNS run(s), peers: $PEERS, bind $BIND;" \
    "tdist DDP options: ${TDIST_EXTRA:-defaults}${HOOKS:+; comm hooks: $HOOKS}; raw output in $OUTDIR" >&2
for ((run = 1; run <= RUNS; run++)); do
    for model in $MODELS; do
        for peer in $PEERS; do
            echo "# run $run/$RUNS: $model, $peer local and ddp${HOOKS:+ ($HOOKS)}" >&2
            run_one "$run" "$peer" local "$model" 1
            if [ -z "$HOOKS" ]; then
                run_one "$run" "$peer" ddp "$model" "$NP"
            fi
            for h in $HOOKS; do
                if [ "$peer" = torch ] && ! torch_has_hook "$h"; then continue; fi
                run_one "$run" "$peer" ddp "$model" "$NP" "$h"
            done
            if [ "$CONTENTION" = 1 ]; then run_one "$run" "$peer" local "$model" "$NP"; fi
        done
    done
done
# Keep the detailed lines of the last run (phases, CPU time and where it went,
# DDP statistics with the reducer's schedule, breakdown, bucket probe).
for model in $MODELS; do
    for f in "$OUTDIR/${model}_tdist_ddp${NP}_run${RUNS}.out" "$OUTDIR/${model}_torch_ddp${NP}_run${RUNS}.out"; do
        [ -f "$f" ] && sed -E 's/^\[rank [0-9]+\] //' "$f" |
            grep -E '^# (phases|cpu time|ddp statistics|breakdown|DDP logging|stand-alone)' |
            sed "s/^# /# $model $(basename "$f" | cut -d_ -f2) ddp: /"
    done
    for h in $HOOKS; do
        for f in "$OUTDIR/${model}_tdist_ddp${NP}_${h}_run${RUNS}.out" "$OUTDIR/${model}_torch_ddp${NP}_${h}_run${RUNS}.out"; do
            [ -f "$f" ] && sed -E 's/^\[rank [0-9]+\] //' "$f" |
                grep -E '^# (phases|ddp statistics|DDP logging|comm hook|powersgd|int8)' |
                sed "s/^# /# $model $(basename "$f" | cut -d_ -f2) $h: /"
        done
    done
done

# ------------------------------------------------------------ table
"$PY" - "$DATA" "$STATUS" "$RUNS" "$MODELS" "$NP" "$PEERS" "$CONTENTION" "$TDIST_EXTRA" \
    "$BYTES" "$HOOKS" <<'PYEOF'
import statistics
import sys

data_path, status_path, runs, models, np_, peers, contention, extra = sys.argv[1:9]
bytes_path, hooks = sys.argv[9], sys.argv[10].split()
runs, np_ = int(runs), int(np_)
models, peers = models.split(), peers.split()
rows = {}  # (peer, mode, model, world) -> {run: fields}
for line in open(data_path):
    f = line.split()
    if len(f) != 12:
        continue
    key = (f[1], f[2], f[3], int(f[4]))
    rows.setdefault(key, {})[int(f[0])] = [None if x == "-" else float(x) for x in f[5:]]
failed = [l.split() for l in open(status_path) if len(l.split()) == 6 and l.split()[5] != "0"]

def med(peer, mode, model, world, field=0):
    v = [r[field] for r in rows.get((peer, mode, model, world), {}).values() if r[field] is not None]
    return statistics.median(v) if v else None

def run_ratios(peer, model):
    a = rows.get((peer, "ddp", model, np_), {})
    b = rows.get((peer, "local", model, 1), {})
    return [a[k][0] / b[k][0] for k in sorted(a) if k in b and b[k][0]]

def fmt(v, spec="%.2f", w=8):
    return (spec % v).rjust(w) if v is not None else "-".rjust(w)

def div(a, b):
    return a / b if a is not None and b else None

nbytes = {}  # (peer, mode, model) -> [hook_bytes, f32_ring_bytes] per run
for line in open(bytes_path):
    f = line.split()
    if len(f) == 7:
        nbytes.setdefault((f[1], f[2], f[3]), []).append((float(f[5]), float(f[6])))

def med_bytes(peer, hook, model, k=0):
    v = [b[k] for b in nbytes.get((peer, "ddp_" + hook, model), [])]
    return statistics.median(v) if v else None

results = []
if hooks:
    print()
    print("== comm hooks: MLP training step, batch 64 per rank, SGD, 1 thread per process; "
          "%d-rank DDP vs one process; median of %d run(s) ==" % (np_, runs))
    head = ("%-5s %-14s | %9s %7s %9s %7s | %9s %7s %9s %7s | %8s" % (
        "model", "hook", "tdist DDP", "ratio", "sent/it", "bytes", "torch DDP", "ratio",
        "sent/it", "bytes", "torch/td"))
    print(head)
    print("%-5s %-14s | %9s %7s %9s %7s | %9s %7s %9s %7s | %8s" % (
        "", "", "ms", "DDP/1p", "MB", "vs AR", "ms", "DDP/1p", "MB", "vs AR", "DDP"))
    print("-" * len(head))
    for m in models:
        tl, ql = med("tdist", "local", m, 1), med("torch", "local", m, 1)
        if tl is not None:
            results.append(("ddp_%s_local_ms" % m, tl, "ms"))
        if ql is not None:
            results.append(("torch_ddp_%s_local_ms" % m, ql, "ms"))
        for h in hooks:
            cells, line = {}, []
            for p, local in (("tdist", tl), ("torch", ql)):
                t = med(p, "ddp_" + h, m, np_)
                hb = med_bytes(p, h, m)
                ar = med_bytes(p, "allreduce", m) or med_bytes(p, h, m, 1)
                br = div(hb, ar)
                cells[p] = (t, div(t, local), hb, br)
                line.append("%s %s %s %s" % (fmt(t, w=9), fmt(div(t, local), "%.2fx", 7),
                                             fmt(hb * 1e-6 if hb is not None else None,
                                                 "%.4f", 9), fmt(br, "%.4f", 7)))
                pre = "ddp" if p == "tdist" else "torch_ddp"
                for name, v, unit in (("ms", t, "ms"), ("ratio", div(t, local), "x"),
                                      ("bytes_per_iter", hb, "bytes"), ("bytes_ratio", br, "x")):
                    if v is not None:
                        results.append(("%s_%s_%s_%s" % (pre, m, h, name), v, unit))
            print("%-5s %-14s | %s | %s | %s" % (m, h, line[0], line[1],
                                                 fmt(div(cells["torch"][0], cells["tdist"][0]),
                                                     "%.2fx", 8)))
    print()
    print("# 1p = one process; DDP = %d ranks with the comm hook (tdist: shared memory; torch: "
          "gloo over TCP loopback); -: not run (PyTorch 1.13's Gloo has no bf16 all_reduce; "
          "no int8 hook in PyTorch)." % np_)
    print("# sent/it = bytes one rank sends per iteration: allreduce 2(W-1)/W x 4 x elements (a "
          "ring all_reduce of the f32 buckets); fp16/bf16 the same with 2-byte elements;")
    print("#   powersgdR the ring formula over the elements of its f32 all_reduces "
          "([uncompressed | P], Q); int8 tdist_int8_get_stats bytes_sent. bytes vs AR = "
          "sent/it / the allreduce hook's.")
    for m in models:
        for h in hooks:
            for p in peers:
                a = rows.get((p, "ddp_" + h, m, np_), {})
                b = rows.get((p, "local", m, 1), {})
                rr = [a[k][0] / b[k][0] for k in sorted(a) if k in b and b[k][0]]
                if rr:
                    print("# per-run DDP/1p ratios, %s %s %s: %s" % (
                        m, h, p, " ".join("%.2f" % r for r in rr)))
    # the targets, reported (never adjusted)
    def bratio(h, m):
        return div(med_bytes("tdist", h, m), med_bytes("tdist", "allreduce", m) or
                   med_bytes("tdist", h, m, 1))
    for h in ("fp16", "bf16"):
        for m in models:
            r = bratio(h, m)
            if r is not None:
                print("# target, %s %s bytes vs allreduce 0.5: %.4f %s" % (
                    m, h, r, "met" if abs(r - 0.5) < 0.005 else "MISSED"))
    if "25M" in models and bratio("powersgd1", "25M") is not None:
        r = bratio("powersgd1", "25M")
        print("# target, 25M powersgd1 bytes vs allreduce <= 0.05: %.4f %s" % (
            r, "met" if r <= 0.05 else "MISSED"))
    for m in models:
        r = bratio("int8", m)
        if r is not None:
            print("# target, %s int8 bytes vs allreduce <= 0.35: %.4f %s" % (
                m, r, "met" if r <= 0.35 else "MISSED"))
    ar25 = med("tdist", "ddp_allreduce", "25M", np_)
    for h in hooks:
        t = med("tdist", "ddp_" + h, "25M", np_)
        if h not in ("allreduce", "allreduce_hook", "allreduce_grads") and t is not None and ar25:
            print("# target, 25M %s step not slower than allreduce (%.2f ms): %.2f ms (%.2fx) %s" % (
                h, ar25, t, t / ar25, "met" if t <= ar25 else "MISSED"))
    for m in models:
        for h in hooks:
            if h.startswith("powersgd"):
                a, b = med("tdist", "ddp_" + h, m, np_), med("torch", "ddp_" + h, m, np_)
                if a is not None and b is not None:
                    print("# target, %s %s tdist step faster than PyTorch's: %.2f vs %.2f ms "
                          "(torch/tdist %.2fx) %s" % (m, h, a, b, b / a, "met" if a < b else "MISSED"))
if not hooks:
    print()
    print("== MLP training step, batch 64 per rank, SGD, 1 thread per process; %d-rank DDP vs one "
          "process; median of %d run(s) ==" % (np_, runs))
    head = ("%-5s | %9s %9s %7s | %9s %9s %7s | %7s %7s | %9s" % (
        "model", "tdist 1p", "tdist DDP", "ratio", "torch 1p", "torch DDP", "ratio",
        "overlap", "wait", "torch/td"))
    print(head)
    print("%-5s | %9s %9s %7s | %9s %9s %7s | %7s %7s | %9s" % (
        "", "ms", "ms", "DDP/1p", "ms", "ms", "DDP/1p", "tdist", "ms", "DDP"))
    print("-" * len(head))
    for m in models:
        tl, td = med("tdist", "local", m, 1), med("tdist", "ddp", m, np_)
        ql, qd = med("torch", "local", m, 1), med("torch", "ddp", m, np_)
        ov, wait = med("tdist", "ddp", m, np_, 3), med("tdist", "ddp", m, np_, 4)
        tr, qr = div(td, tl), div(qd, ql)
        print("%-5s | %s %s %s | %s %s %s | %s %s | %s" % (
            m, fmt(tl, w=9), fmt(td, w=9), fmt(tr, "%.2fx", 7), fmt(ql, w=9), fmt(qd, w=9),
            fmt(qr, "%.2fx", 7), fmt(ov, "%.2f", 7), fmt(wait, w=7), fmt(div(qd, td), "%.2fx", 9)))
        for name, v, unit in (("tdist_local_ms", tl, "ms"), ("tdist_ddp%d_ms" % np_, td, "ms"),
                              ("tdist_ratio", tr, "x"), ("torch_local_ms", ql, "ms"),
                              ("torch_ddp%d_ms" % np_, qd, "ms"), ("torch_ratio", qr, "x"),
                              ("tdist_overlap", ov, "fraction"), ("tdist_wait_ms", wait, "ms"),
                              ("tdist_speedup_vs_torch_ddp", div(qd, td), "x")):
            if v is not None:
                results.append(("ddp_%s_%s" % (m, name), v, unit))
if contention == "1":
    print()
    print("# contention check: the local step on %d processes at once (no communication)" % np_)
    for m in models:
        for p in peers:
            one, many = med(p, "local", m, 1), med(p, "local", m, np_)
            print("#   %-4s %-5s: 1 process %s ms, %d processes %s ms (%s)" % (
                m, p, fmt(one, w=0), np_, fmt(many, w=0), fmt(div(many, one), "%.2fx", 0)))
            if many is not None:
                results.append(("ddp_%s_%s_local%d_ms" % (m, p, np_), many, "ms"))
print()
print("# 1p = one process, no DDP; DDP = %d ranks (tdist: shared memory, %s; "
      "torch: gloo, default DDP options)." % (
          np_, "bench_ddp_step " + extra if extra else "default DDP options"))
print("# step time = median over steps of the slowest rank's step, then the median over runs;"
      " ratio = DDP / 1p.")
print("# overlap = tdist_ddp_stats overlap_fraction (1 - blocked wait / comm span); wait = time"
      " backward_end was blocked per step. torch/td = torch DDP time / tdist DDP time.")
for m in models:
    for p in peers:
        rr = run_ratios(p, m)
        if rr:
            print("# per-run DDP/1p ratios, %s %s: %s" % (m, p, " ".join("%.2f" % r for r in rr)))
if "tdist" in peers:
    for m in models:
        r = div(med("tdist", "ddp", m, np_), med("tdist", "local", m, 1))
        if r is not None:
            print("# target, tdist DDP/1p <= 1.10x for the %s model: %.2fx %s" % (
                m, r, "met" if r <= 1.10 else "MISSED"))
if "3M" in models and "torch" in peers:
    r = div(med("torch", "ddp", "3M", np_), med("torch", "local", "3M", 1))
    if r is not None:
        print("# reference, PyTorch DDP/1p 1.7x-2.9x for the 3M model: %.2fx" % r)
for f in failed:
    print("# FAILED: %s %s, %s processes, %s, run %s: exit status %s" % (
        f[1], f[2], f[4], f[3], f[0], f[5]))
print()
for name, v, unit in results:
    spec = "%.0f" if unit == "bytes" else "%.4f" if name.endswith("bytes_ratio") else "%.3f"
    print(("RESULT %s " + spec + " %s") % (name, v, unit))
print("RESULT ddp_failed_invocations %d count" % len(failed))
sys.exit(1 if failed else 0)
PYEOF
