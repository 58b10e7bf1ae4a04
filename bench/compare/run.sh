#!/usr/bin/env bash
# bench/compare/run.sh — tdist's collectives side by side with Open MPI and
# PyTorch's Gloo backend, the same ops and sizes in the same run.
#
#   bench/compare/run.sh            # full: every op, 3 runs, 20 iterations, 8 B .. 64 MiB x2
#   bench/compare/run.sh -O "all_gather broadcast"   # a subset of the ops
#   bench/compare/run.sh -q         # smoke test: 1 run, 5 iterations
#   bench/compare/run.sh -h         # every option
#
# Ops (-O): all_reduce broadcast reduce all_gather reduce_scatter all_to_all
# gather scatter barrier, f32 (SUM where it reduces), tdist-bench's buffer
# conventions. Peers, all measured the way tools/tdist-bench does
# (barrier, warm-up, timed samples of BATCH calls each -- by default as many
# calls as last ~100 us, so a sub-microsecond call is not one clock read
# long --, max over ranks of each rank's median sample):
#   tdist : tools/tdist-bench under tools/tdistrun, TDIST_TRANSPORT=shm|tcp
#   ompi  : bench/compare/mpi_coll.c under mpirun (default transport = vader
#           shared memory; tcp = --mca btl tcp,self over the loopback)
#   gloo  : bench/compare/gloo_coll.py, torch.distributed "gloo" (TCP loopback;
#           every op but reduce_scatter, which Gloo lacks)
# Each run interleaves the peers (tdist, ompi, gloo, tdist, ompi, ...); the
# tables quote the median over runs of each run's time. Ratios are
# "speed-up" = peer time / tdist time (= tdist busbw / peer busbw): > 1
# means tdist is faster. One PNG chart per op, transport and rank count
# (busbw against size, one line per peer; gnuplot). See docs/bench-compare.md.
set -u -o pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
HERE="$REPO/bench/compare"
PY=/usr/bin/python3 # Debian's interpreter: python3-torch lives there
PACKAGES=(openmpi-bin libopenmpi-dev python3-torch libopenblas0-pthread gnuplot-nox)
ALL_OPS="all_reduce broadcast reduce all_gather reduce_scatter all_to_all gather scatter barrier"

D_MIN=8 D_MAX=64M D_FACTOR=2 D_ITERS=20 D_WARMUP=5 D_RUNS=3 D_BATCH=auto
D_RANKS="2 4" D_TRANSPORTS="shm tcp" D_PEERS="tdist ompi gloo" D_TIMEOUT=600 D_OPS=$ALL_OPS
MIN=$D_MIN MAX=$D_MAX FACTOR=$D_FACTOR ITERS=$D_ITERS WARMUP=$D_WARMUP RUNS=$D_RUNS BATCH=$D_BATCH
RANKS=$D_RANKS TRANSPORTS=$D_TRANSPORTS PEERS=$D_PEERS PEER_TIMEOUT=$D_TIMEOUT OUTDIR="" INSTALL=1 BUILD_TDIST=1 MPI_EXTRA=""
OPS=$D_OPS CHARTS=1
BUILD="$REPO/build/bench-release"
BUILD_TRIES=${BUILD_TRIES:-10} # the tree may be mid-edit: retry, 60 s apart
QUICK=0 set_n=0 set_w=0 set_r=0

usage() {
    cat <<EOF
usage: bench/compare/run.sh [options]
  -b MIN        smallest size in bytes, K/M/G suffixes (default $D_MIN)
  -e MAX        largest size (default $D_MAX); MAX is always the last size
  -f FACTOR     size step, integer >= 2 (default $D_FACTOR: 8 B, 16 B, ... 4 MiB ... 64 MiB)
  -n ITERS      timed samples per size (default $D_ITERS)
  -k BATCH      calls per timed sample, every peer: auto (default: per size, as
                many calls as last ~100 us, from the warm-up's median call) or
                1..1000 (1: every call timed on its own)
  -w WARMUP     untimed warm-up iterations per size (default $D_WARMUP)
  -r RUNS       runs; the tables quote the median over runs (default $D_RUNS)
  -q            quick smoke test: 1 run, 5 iterations, 1 warm-up (-r/-n/-w still win)
  -p "RANKS"    rank counts (default "$D_RANKS")
  -t "TRANSP"   transports, subset of "shm tcp" (default "$D_TRANSPORTS")
  -P "PEERS"    peers, subset of "tdist ompi gloo" (default "$D_PEERS"; Gloo has no reduce_scatter)
  -O "OPS"      collectives, subset of "$ALL_OPS" (default: all)
  -C            no PNG charts
  -T SECONDS    deadline of every single peer invocation (default $D_TIMEOUT)
  -o DIR        keep the raw outputs in DIR (default: a new directory under
                $BUILD/bench-compare/runs)
  -B BIND      process binding of every peer: auto (default: one rank per core
                when ranks <= CPUs, as mpirun does by default for small jobs;
                unbound otherwise), core, or none
  -m "ARGS"     extra mpirun arguments
  -x            do not check or install Debian packages
  -s            do not (re)build tdist; use the binaries already in $BUILD
  -h            this help
Prints one table per op and configuration, writes charts (DIR/charts/*.png) and ends with
RESULT <name> <value> [unit] lines: <op>_<transport>_<N>r_<size>_vs_ompi for every cell and
min_ratio_vs_ompi naming the worst.
Exit 0 when every peer ran and every element was right, 1 otherwise, 2 on bad flags.
EOF
}

die() { echo "run.sh: $*" >&2; exit 1; }
# shellcheck source=bench/compare/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
is_uint() { [[ "$1" =~ ^[0-9]+$ ]]; }

while getopts ":b:e:f:n:w:k:r:qp:t:P:O:CT:o:m:B:xsh" opt; do
    case "$opt" in
    b) MIN=$OPTARG ;;
    e) MAX=$OPTARG ;;
    f) FACTOR=$OPTARG ;;
    n) ITERS=$OPTARG set_n=1 ;;
    w) WARMUP=$OPTARG set_w=1 ;;
    k) BATCH=$OPTARG ;;
    r) RUNS=$OPTARG set_r=1 ;;
    q) QUICK=1 ;;
    p) RANKS=$OPTARG ;;
    t) TRANSPORTS=$OPTARG ;;
    P) PEERS=$OPTARG ;;
    O) OPS=$OPTARG ;;
    C) CHARTS=0 ;;
    T) PEER_TIMEOUT=$OPTARG ;;
    o) OUTDIR=$OPTARG ;;
    m) MPI_EXTRA=$OPTARG ;;
    B) BIND=$OPTARG ;;
    x) INSTALL=0 ;;
    s) BUILD_TDIST=0 ;;
    h) usage; exit 0 ;;
    :) echo "run.sh: option -$OPTARG needs a value" >&2; usage >&2; exit 2 ;;
    *) echo "run.sh: unknown option -$OPTARG" >&2; usage >&2; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
[ $# -eq 0 ] || { echo "run.sh: unexpected argument '$1'" >&2; usage >&2; exit 2; }
if [ "$QUICK" = 1 ]; then
    [ "$set_r" = 1 ] || RUNS=1
    [ "$set_n" = 1 ] || ITERS=5
    [ "$set_w" = 1 ] || WARMUP=1
fi
case "${BIND:=auto}" in auto | core | none) ;; *) echo "run.sh: bad -B '$BIND'" >&2; exit 2 ;; esac
bad() { echo "run.sh: $*" >&2; usage >&2; exit 2; }
size_ok() { [[ "$1" =~ ^[0-9]+([kKmMgG]i?)?[bB]?$ ]]; }
size_ok "$MIN" || bad "bad -b '$MIN'"
size_ok "$MAX" || bad "bad -e '$MAX'"
{ is_uint "$FACTOR" && [ "$FACTOR" -ge 2 ]; } || bad "bad -f '$FACTOR'"
{ is_uint "$ITERS" && [ "$ITERS" -ge 1 ] && [ "$ITERS" -le 1000000 ]; } || bad "bad -n '$ITERS'"
{ is_uint "$WARMUP" && [ "$WARMUP" -le 1000000 ]; } || bad "bad -w '$WARMUP'"
{ [ "$BATCH" = auto ] || { is_uint "$BATCH" && [ "$BATCH" -ge 1 ] && [ "$BATCH" -le 1000 ]; }; } ||
    bad "bad -k '$BATCH'"
{ is_uint "$RUNS" && [ "$RUNS" -ge 1 ] && [ "$RUNS" -le 100 ]; } || bad "bad -r '$RUNS'"
{ is_uint "$PEER_TIMEOUT" && [ "$PEER_TIMEOUT" -ge 10 ]; } || bad "bad -T '$PEER_TIMEOUT' (>= 10)"
for np in $RANKS; do
    { is_uint "$np" && [ "$np" -ge 2 ] && [ "$np" -le 64 ]; } || bad "bad rank count '$np' (2..64)"
done
for t in $TRANSPORTS; do [[ "$t" == shm || "$t" == tcp ]] || bad "bad transport '$t'"; done
for p in $PEERS; do [[ "$p" == tdist || "$p" == ompi || "$p" == gloo ]] || bad "bad peer '$p'"; done
for o in $OPS; do [[ " $ALL_OPS " == *" $o "* ]] || bad "bad op '$o'"; done
if [ -z "$RANKS" ] || [ -z "$TRANSPORTS" ] || [ -z "$PEERS" ] || [ -z "$OPS" ]; then
    bad "empty -p, -t, -P or -O"
fi
has_peer() { [[ " $PEERS " == *" $1 "* ]]; }

# ------------------------------------------------------------ packages
[ "$INSTALL" = 1 ] && install_missing "${PACKAGES[@]}"

# ------------------------------------------------------------ builds
TDISTRUN="$BUILD/tools/tdistrun/tdistrun"
TDIST_BENCH="$BUILD/tools/tdist-bench/tdist-bench"
if has_peer tdist && [ "$BUILD_TDIST" = 1 ]; then
    build_tdist "$REPO" "$BUILD" "$REPO/build/.bench-compare-cmake.log" "$BUILD_TRIES" tdist-bench tdistrun \
        bench_latency_floor
fi
if has_peer tdist; then
    if [ ! -x "$TDISTRUN" ] || [ ! -x "$TDIST_BENCH" ]; then
        die "no $TDISTRUN or $TDIST_BENCH (drop -s)"
    fi
fi
MPI_COLL="$BUILD/bench-compare/mpi_coll"
if has_peer ompi; then
    if ! command -v mpicc >/dev/null || ! command -v mpirun >/dev/null; then
        die "mpicc/mpirun not found (openmpi-bin, libopenmpi-dev)"
    fi
    mkdir -p "$BUILD/bench-compare"
    timeout -k 10 300 mpicc -O2 -std=c11 -Wall -Wextra -Werror -Wshadow -o "$MPI_COLL" \
        "$HERE/mpi_coll.c" || die "mpicc bench/compare/mpi_coll.c failed"
fi
if has_peer gloo; then
    timeout -k 10 120 "$PY" -c 'import torch.distributed as d; assert d.is_gloo_available()' ||
        die "$PY cannot import torch with Gloo (python3-torch, libopenblas0-pthread)"
fi

# ------------------------------------------------------------ runs
[ -n "$OUTDIR" ] || OUTDIR="$BUILD/bench-compare/runs/$(date +%Y%m%d-%H%M%S)-$$"
mkdir -p "$OUTDIR" || die "cannot create $OUTDIR"
DATA="$OUTDIR/rows.txt"   # np transport peer run bytes time_us wrong op
STATUS="$OUTDIR/status.txt" # np transport peer run exit_status op
PLACE="$OUTDIR/placement.txt" # np transport peer run floor_before_ns floor_after_ns op
: >"$DATA"
: >"$STATUS"
: >"$PLACE"
NCPU=$(nproc 2>/dev/null || echo 1)
FLOOR="$BUILD/bench/bench_latency_floor"

# The placement probe: the 2-CPU cache-line round trip (bench_latency_floor's
# spin2, 20,000 calls, a few ms) in ns, or "-". This VM's hypervisor moves
# its two vCPUs between near (~75-95 ns) and far (~400 ns) pairs of host
# cores, now and then within seconds; every peer invocation is bracketed by
# one probe, so a ratio can be read against the placement of both peers.
floor_ns() {
    local v=""
    if [ -x "$FLOOR" ] && [ "$NCPU" -ge 2 ]; then
        v=$(timeout -k 5 20 "$FLOOR" 20000 1 2>/dev/null | sed -n 's/.*spin2 \([0-9.]*\) ns.*/\1/p' | head -n 1)
    fi
    echo "${v:--}"
}
if [ "$(id -u)" = 0 ]; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
SWEEP=(-b "$MIN" -e "$MAX" -f "$FACTOR" -n "$ITERS" -w "$WARMUP" -k "$BATCH")

# run_peer NP TRANSPORT PEER RUN OP: one invocation, rows appended to $DATA.
run_peer() {
    local np=$1 tr=$2 peer=$3 run=$4 op=$5 rc
    local base="$OUTDIR/${op}_np${np}_${tr}_${peer}_run${run}"
    local mpiopts=() bind=$BIND f0
    f0=$(floor_ns)
    if [ "$bind" = auto ]; then
        if [ "$np" -le "$NCPU" ]; then bind=core; else bind=none; fi
    fi
    case "$peer" in
    tdist)
        TDIST_TRANSPORT=$tr timeout -k 15 "$PEER_TIMEOUT" "$TDISTRUN" -q --nproc-per-node "$np" \
            --bind-to "$bind" \
            "$TDIST_BENCH" -o "$op" "${SWEEP[@]}" >"$base.out" 2>"$base.err"
        rc=$?
        ;;
    ompi)
        [ "$np" -gt "$NCPU" ] && mpiopts+=(--oversubscribe)
        # more ranks than CPUs: Open MPI refuses to bind two to a core
        # unless told it may (tdistrun and gloo_coll place rank r on CPU r % CPUs)
        if [ "$bind" = core ] && [ "$np" -gt "$NCPU" ]; then
            mpiopts+=(--bind-to core:overload-allowed)
        else
            mpiopts+=(--bind-to "$bind")
        fi
        [ "$tr" = tcp ] && mpiopts+=(--mca btl "tcp,self" --mca btl_tcp_if_include lo)
        # shellcheck disable=SC2086 # MPI_EXTRA is a list of words on purpose
        timeout -k 15 "$PEER_TIMEOUT" mpirun -np "$np" "${mpiopts[@]}" $MPI_EXTRA \
            "$MPI_COLL" -o "$op" "${SWEEP[@]}" >"$base.out" 2>"$base.err"
        rc=$?
        ;;
    gloo)
        timeout -k 15 "$PEER_TIMEOUT" "$PY" "$HERE/gloo_coll.py" -o "$op" --nproc "$np" --bind "$bind" \
            --timeout $((PEER_TIMEOUT - 5)) "${SWEEP[@]}" >"$base.out" 2>"$base.err"
        rc=$?
        ;;
    esac
    echo "$np $tr $peer $run $rc $op" >>"$STATUS"
    echo "$np $tr $peer $run $f0 $(floor_ns) $op" >>"$PLACE"
    # Rows of the shared format (tdistrun adds "[rank 0] "): 8 fields, f32.
    sed -E 's/^\[rank [0-9]+\] //' "$base.out" |
        awk -v np="$np" -v tr="$tr" -v peer="$peer" -v run="$run" -v op="$op" \
            'NF == 8 && $1 ~ /^[0-9]+$/ && $3 == "f32" { print np, tr, peer, run, $1, $5, $8, op }' \
            >>"$DATA"
    if [ "$rc" != 0 ]; then
        echo "# $peer $op ($np ranks, $tr, run $run) exited with status $rc; last lines of $base.err:" >&2
        tail -n 5 "$base.err" | sed 's/^/#   /' >&2
    fi
}

echo "# $OPS; f32: sizes $MIN..$MAX x$FACTOR, $ITERS samples of $BATCH call(s) (+$WARMUP warm-up)," \
    "$RUNS run(s), ranks: $RANKS, transports: $TRANSPORTS, peers: $PEERS; raw output in $OUTDIR" >&2
for ((run = 1; run <= RUNS; run++)); do
    for np in $RANKS; do
        for tr in $TRANSPORTS; do
            for op in $OPS; do
                for peer in $PEERS; do
                    # Gloo runs over TCP only: measure it once per run and rank
                    # count (with the first transport), quote it in both tables;
                    # Gloo has no reduce_scatter.
                    if [ "$peer" = gloo ] && { [ "$tr" != "${TRANSPORTS%% *}" ] || [ "$op" = reduce_scatter ]; }; then
                        continue
                    fi
                    echo "# run $run/$RUNS: $op, $peer, $np ranks, $tr" >&2
                    run_peer "$np" "$tr" "$peer" "$run" "$op"
                done
            done
        done
    done
done

# ------------------------------------------------------------ tables
"$PY" - "$DATA" "$STATUS" "$RUNS" "$RANKS" "$TRANSPORTS" "$PEERS" "$PLACE" "$OPS" "$OUTDIR" "$CHARTS" <<'PYEOF'
import os
import shutil
import statistics
import subprocess
import sys

data_path, status_path, runs, ranks, transports, peers, place_path, ops, outdir, charts = sys.argv[1:11]
runs = int(runs)
ranks = [int(x) for x in ranks.split()]
transports = transports.split()
peers = peers.split()
ops = ops.split()
gloo_tr = transports[0]

times = {}   # (op, np, tr, peer, bytes) -> {run: time}
wrong = {}   # (op, np, tr, peer, bytes) -> total wrong elements over runs
for line in open(data_path):
    f = line.split()
    if len(f) != 8:
        continue
    key = (f[7], int(f[0]), f[1], f[2], int(f[4]))
    times.setdefault(key, {})[int(f[3])] = float(f[5])
    wrong[key] = wrong.get(key, 0) + int(f[6])
failed = [l.split() for l in open(status_path) if len(l.split()) == 6 and l.split()[4] != "0"]

# Placement of each invocation from the probes before and after it:
# "near", "far" (both probes on one side of FAR_NS) or "mixed" / "?".
FAR_NS = 150.0  # as the shm collectives' own probe (TDIST_SHMC_FAR_NS)
placement = {}  # (op, np, tr, peer, run) -> (class, before, after)
for line in open(place_path):
    f = line.split()
    if len(f) != 7:
        continue
    sides = set()
    for v in f[4:6]:
        try:
            sides.add("far" if float(v) >= FAR_NS else "near")
        except ValueError:
            sides.add("?")
    cls = sides.pop() if len(sides) == 1 else "mixed"
    placement[(f[6], int(f[0]), f[1], f[2], int(f[3]))] = (cls, f[4], f[5])

def peer_tr(peer, tr):
    return gloo_tr if peer == "gloo" else tr

def med(op, np, tr, peer, b):
    v = times.get((op, np, peer_tr(peer, tr), peer, b))
    return statistics.median(v.values()) if v else None

def run_ratios(op, np, tr, peer, b):
    """Speed-up of tdist over peer within each run (both measured)."""
    a = times.get((op, np, peer_tr(peer, tr), peer, b), {})
    t = times.get((op, np, tr, "tdist", b), {})
    return ["%.2f" % (a[k] / t[k]) for k in sorted(a) if k in t and t[k] > 0]

BUS = {"all_reduce": lambda n: 2.0 * (n - 1) / n, "broadcast": lambda n: 1.0,
       "reduce": lambda n: 1.0, "barrier": lambda n: 0.0}

def busbw(op, np, b, t):
    f = BUS.get(op, lambda n: (n - 1.0) / n)(np)
    return b / (t * 1e3) * f if t else None

def label(b):
    for shift, suf in ((30, "G"), (20, "M"), (10, "K")):
        if b >= 1 << shift and b % (1 << shift) == 0:
            return "%d%s" % (b >> shift, suf)
    return "%dB" % b

def pretty(b):
    for shift, suf in ((30, "GiB"), (20, "MiB"), (10, "KiB")):
        if b >= 1 << shift and b % (1 << shift) == 0:
            return "%d %s" % (b >> shift, suf)
    return "%d B" % b

def ratio(t_peer, t_tdist):
    return t_peer / t_tdist if t_peer and t_tdist else None

def fmt(v, spec, width):
    return (spec % v).rjust(width) if v is not None else "-".rjust(width)

names = {"tdist": "tdist", "ompi": "OMPI", "gloo": "Gloo"}
tr_desc = {
    "shm": "shared memory: tdist TDIST_TRANSPORT=shm, Open MPI default (vader)",
    "tcp": "TCP loopback: tdist TDIST_TRANSPORT=tcp, Open MPI --mca btl tcp,self",
}

def sizes_of(op, np, tr):
    return sorted({k[4] for k in times if k[0] == op and k[1] == np and
                   (k[2] == tr or k[3] == "gloo")})

def op_peers(op):
    return [p for p in peers if p != "gloo" or op != "reduce_scatter"]

results = []
cells = []  # (ratio, op, tr, np, bytes): every cell with tdist and Open MPI
for op in ops:
    for tr in transports:
        for np in ranks:
            sizes = sizes_of(op, np, tr)
            if not sizes:
                continue
            pp = op_peers(op)
            print()
            print("== %s f32%s, %d ranks, %s%s; median of %d run(s) ==" % (
                op, " sum" if op in ("all_reduce", "reduce", "reduce_scatter") else "", np,
                tr_desc[tr], ", Gloo (TCP loopback)" if "gloo" in pp else "", runs))
            head = "%10s" % "size"
            for p in pp:
                head += " | %10s %8s" % (names[p] + " us", "busbw")
            for p in pp:
                if p != "tdist" and "tdist" in pp:
                    head += " | %11s" % ("vs " + names[p])
            print(head)
            print("-" * len(head))
            for b in sizes:
                row = "%10s" % pretty(b)
                for p in pp:
                    t = med(op, np, tr, p, b)
                    mark = "!" if wrong.get((op, np, peer_tr(p, tr), p, b), 0) else " "
                    row += " | %10s %7s%s" % (fmt(t, "%.3f" if t and t < 10 else "%.2f", 10),
                                              fmt(busbw(op, np, b, t), "%.3f", 7), mark)
                for p in pp:
                    if p != "tdist" and "tdist" in pp:
                        r = ratio(med(op, np, tr, p, b), med(op, np, tr, "tdist", b))
                        row += " | %10s " % fmt(r, "%.2fx", 10)
                        if p == "ompi" and r is not None:
                            cells.append((r, op, tr, np, b))
                            results.append(("%s_%s_%dr_%s_vs_ompi" % (op, tr, np, label(b)),
                                            "%.2f" % r, "x"))
                print(row)
            if op != "all_reduce":
                continue
            # Headline figures: 8 B, 4 MiB, 64 MiB when swept, else the ends.
            heads = [b for b in (8, 4 << 20, 64 << 20) if b in sizes] or sorted({sizes[0], sizes[-1]})
            for b in heads:
                small = b < 64 << 10
                stem = "allreduce_%s_%dr_%s" % (tr, np, label(b))
                for p in pp:
                    if p != "tdist" and "tdist" in pp:
                        r = ratio(med(op, np, tr, p, b), med(op, np, tr, "tdist", b))
                        if r is not None:
                            results.append(("%s_vs_%s" % (stem, p), "%.2f" % r, "x"))
                for p in pp:
                    t = med(op, np, tr, p, b)
                    if t is None:
                        continue
                    if small:
                        results.append(("%s_%s_us" % (stem, p), ("%.3f" if t < 10 else "%.2f") % t, "us"))
                    else:
                        results.append(("%s_%s_busbw" % (stem, p), "%.3f" % busbw(op, np, b, t), "GB/s"))

print()
print("# speed-up 'vs X' = X's time / tdist's time = tdist busbw / X's busbw (same bytes,")
print("# same factor): > 1 means tdist is faster. Times in us: max over ranks of each rank's")
print("# median over ITERS samples (a sample: one batch of calls, its time / its calls; -k),")
print("# then the median over runs. busbw = bytes/time * tdist-bench's factor (all_reduce")
print("# 2(n-1)/n; broadcast, reduce 1; the others (n-1)/n), GB/s.")
if any(wrong.values()):
    print("# '!' marks sizes with wrong elements in at least one run")
# The all_reduce targets tdist holds itself to (shared memory unless stated),
# as speed-ups over Open MPI (docs/bench-compare.md).
targets = [("shm", 2, 64 << 20, 2.0), ("shm", 4, 64 << 20, 2.0),
           ("shm", 2, 4 << 20, 1.3), ("shm", 4, 4 << 20, 1.8),
           ("shm", 2, 8, 2.0), ("shm", 4, 8, 2.0), ("tcp", 2, 64 << 20, 1.2)]

def same_placement_ratios(op, np, tr, b):
    """Per-run speed-ups over Open MPI where both invocations of the run
    stayed in one placement, the same for both: {"near": [...], "far": [...]}."""
    a = times.get((op, np, tr, "ompi", b), {})
    t = times.get((op, np, tr, "tdist", b), {})
    out = {"near": [], "far": []}
    for k in sorted(a):
        if k not in t or t[k] <= 0:
            continue
        pt = placement.get((op, np, tr, "tdist", k), ("?",))[0]
        po = placement.get((op, np, tr, "ompi", k), ("?",))[0]
        if pt == po and pt in out:
            out[pt].append(a[k] / t[k])
    return out

if placement:
    print("# placement (2-CPU cache-line round trip in ns before/after each invocation;")
    print("# >= %.0f ns: far):" % FAR_NS)
    for (op, np, tr, peer, run) in sorted(placement):
        cls, f0, f1 = placement[(op, np, tr, peer, run)]
        print("#   %-14s %dr %s %-5s run %d: %s/%s %s" % (op, np, tr, peer, run, f0, f1, cls))
met = total = met_runs = met_same = 0
if "tdist" in peers and "ompi" in peers and "all_reduce" in ops:
    print("# all_reduce targets (speed-up over Open MPI, same run):")
    for tr, np, b, want in targets:
        if tr not in transports or np not in ranks:
            continue
        r = ratio(med("all_reduce", np, tr, "ompi", b), med("all_reduce", np, tr, "tdist", b))
        if r is None:
            print("#   %s %dr %-7s >= %.1fx: not measured" % (tr, np, pretty(b), want))
            continue
        total += 1
        met += r >= want
        # the table's ratio is of median times; the median of the per-run
        # ratios can differ when the peers' runs land in different states
        per = run_ratios("all_reduce", np, tr, "ompi", b)
        rm = statistics.median(float(x) for x in per) if per else None
        met_runs += rm is not None and rm >= want
        print("#   %s %dr %-7s >= %.1fx: %.2fx %-6s (per run: %s; their median %s)" % (
            tr, np, pretty(b), want, r, "met" if r >= want else "MISSED", " ".join(per),
            "%.2fx" % rm if rm is not None else "-"))
        sp = same_placement_ratios("all_reduce", np, tr, b)
        parts = []
        for cls in ("near", "far"):
            if sp[cls]:
                parts.append("%s %s (median %.2fx)" % (
                    cls, " ".join("%.2f" % x for x in sp[cls]), statistics.median(sp[cls])))
        every = [statistics.median(v) for v in sp.values() if v]
        met_same += bool(every) and min(every) >= want
        print("#       same placement for both: %s" % ("; ".join(parts) if parts else "no run"))
# Every cell against Open MPI: the ones below 1.0x, and by placement.
below = sorted(c for c in cells if c[0] < 1.0)
if cells:
    print("# cells below 1.0x Open MPI: %d of %d" % (len(below), len(cells)))
    for r, op, tr, np, b in below:
        sp = same_placement_ratios(op, np, tr, b)
        byp = ", ".join("%s %.2fx" % (k, statistics.median(v)) for k, v in sp.items() if v)
        print("#   %-14s %s %dr %-8s %.2fx%s" % (op, tr, np, pretty(b), r,
                                                 " (same placement: %s)" % byp if byp else ""))
for f in failed:
    print("# FAILED: %s %s, %s ranks, %s, run %s: exit status %s" % (f[5], f[2], f[0], f[1], f[3], f[4]))

# Charts: busbw against size, one line per peer, one PNG per op, transport
# and rank count (gnuplot; barrier has no bytes: none).
def chart(op, tr, np):
    sizes = [b for b in sizes_of(op, np, tr) if b > 0]
    pp = op_peers(op)
    if not sizes:
        return None
    base = os.path.join(outdir, "charts", "%s_%s_%dr" % (op, tr, np))
    with open(base + ".dat", "w") as f:
        f.write("# bytes " + " ".join(pp) + "  (busbw, GB/s; - = not measured)\n")
        for b in sizes:
            vals = [busbw(op, np, b, med(op, np, tr, p, b)) for p in pp]
            f.write("%d %s\n" % (b, " ".join("%.6f" % v if v else "-" for v in vals)))
    plots = ", ".join("'%s.dat' using 1:%d with linespoints title '%s'" % (
        base, i + 2, names[p] + (" (TCP)" if p == "gloo" else "")) for i, p in enumerate(pp))
    script = "\n".join([
        "set terminal pngcairo size 900,560 noenhanced" if GP_CAIRO else "set terminal png size 900,560",
        "set output '%s.png'" % base,
        "set title '%s, %d ranks, %s (busbw, median of %d run(s))'" % (op, np, tr, runs),
        "set logscale x 2", "set logscale y 10", "set datafile missing '-'",
        "set xlabel 'bytes (per-rank buffer)'", "set ylabel 'busbw GB/s'",
        "set key top left", "set grid",
        "set xtics (%s)" % ", ".join("'%s' %d" % (pretty(b), b) for b in sizes[::max(1, len(sizes) // 10)]),
        "set format y '%g'",
        "plot " + plots, ""])
    subprocess.run(["gnuplot"], input=script.encode(), check=True, timeout=60)
    return base + ".png"

GP_CAIRO = False
pngs = []
if charts == "1" and shutil.which("gnuplot"):
    os.makedirs(os.path.join(outdir, "charts"), exist_ok=True)
    t = subprocess.run(["gnuplot", "-e", "set terminal"], capture_output=True, timeout=60)
    GP_CAIRO = b"pngcairo" in t.stdout + t.stderr
    for op in ops:
        for tr in transports:
            for np in ranks:
                try:
                    png = chart(op, tr, np)
                except (subprocess.SubprocessError, OSError) as e:
                    print("# chart %s %s %dr failed: %s" % (op, tr, np, e))
                    png = None
                if png:
                    pngs.append(png)
    print("# charts: %d PNG in %s" % (len(pngs), os.path.join(outdir, "charts")))
elif charts == "1":
    print("# charts: no gnuplot (gnuplot-nox)")
print()
for name, value, unit in results:
    print("RESULT %s %s %s" % (name, value, unit))
if cells:
    r, op, tr, np, b = min(cells)
    print("RESULT min_ratio_vs_ompi %.2f (%s %s %dr %s)" % (r, op, tr, np, label(b)))
    print("RESULT cells_below_ompi %d count" % len(below))
if total:
    print("RESULT compare_targets_met %d count" % met)
    print("RESULT compare_targets_met_by_run_median %d count" % met_runs)
    # met in every placement that had a run with both peers in it
    print("RESULT compare_targets_met_same_placement %d count" % met_same)
    print("RESULT compare_targets_measured %d count" % total)
print("RESULT compare_wrong_elements %d elements" % sum(wrong.values()))
print("RESULT compare_failed_invocations %d count" % len(failed))
sys.exit(1 if failed or any(wrong.values()) else 0)
PYEOF
