#!/usr/bin/env bash
# bench/oversub.sh — oversubscription: the time per all_reduce with 8 ranks
# against 2 ranks on the same two CPUs, on shared memory and on TCP.
#
# Both runs are pinned (taskset) to the same two CPUs, so the 8-rank run
# has four ranks per CPU. Each rank's share of a ring or staged all_reduce
# barely changes from 2 to 8 ranks, so the CPU work per op grows about 4x
# (four ranks' work on each CPU): a ratio near 4 means the ranks hand the
# CPUs to each other without waste; far above it, waiting ranks burn the
# CPU the working ones need. Each figure is the median over REPEATS runs
# (2-rank and 8-rank runs alternate) of tdist-bench's time, itself the max
# over ranks of each rank's median.
#
# The 4x holds where each rank's share of the work stays the same: shared
# memory's staged and one-shot paths. Over TCP it does not: a ring moves
# 2(n-1)/n of the buffer through each rank's sockets (1x at 2 ranks, 1.75x
# at 8, so 7x per CPU), and the fingerprint check of every collective (the
# small one-shot collectives ride in it) costs 2 messages at 2 ranks, and
# from 4 ranks 2(n-1) along a tree to rank 0 and back (14 at 8; n(n-1) =
# 56 with TDIST_CHECK_TREE_MIN=0 in the environment, which this script
# passes on: the exchange with every peer). "-o barrier" times the fingerprint
# exchange alone, to see its share.
#
#   bench/oversub.sh [-B BUILD] [-c CPUS] [-n ITERS] [-r REPEATS] [-s "SIZES"] [-t "TRANSPORTS"]
#                    [-o "OPS"]
#     -B BUILD       a Release build tree with tools/ built (default: builds
#                    build/bench-oversub from this checkout)
#     -c CPUS        the two CPUs, taskset form (default: the first two this
#                    shell may run on)
#     -n ITERS       timed iterations per size (default 50; 10 warm-up)
#     -r REPEATS     runs of each (default 3)
#     -s SIZES       bytes per rank (default "8 64K 1M 16M")
#     -t TRANSPORTS  default "shm tcp"
#     -o OPS         tdist-bench operations (default "all_reduce"; e.g.
#                    "barrier all_reduce")
#
# Prints a table and "RESULT oversub_<transport>_<size> <ratio> x" per
# size (oversub_<op>_<transport>_<size> for an op other than all_reduce),
# plus the two times. Every run is bounded (timeout 300 s).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
die() { echo "oversub.sh: $*" >&2; exit 1; }
# shellcheck source=bench/compare/common.sh
. "$here/bench/compare/common.sh"

build="" cpus="" iters=50 repeats=3 sizes="8 64K 1M 16M" transports="shm tcp" ops=all_reduce
while getopts "B:c:n:r:s:t:o:h" o; do
    case $o in
    o) ops=$OPTARG ;;
    r) repeats=$OPTARG ;;
    B) build=$OPTARG ;;
    c) cpus=$OPTARG ;;
    n) iters=$OPTARG ;;
    s) sizes=$OPTARG ;;
    t) transports=$OPTARG ;;
    *) sed -n '2,39p' "$0"; exit 2 ;;
    esac
done
[[ $iters =~ ^[0-9]+$ && $iters -ge 1 && $iters -le 10000 ]] || die "-n wants 1..10000"
[[ $repeats =~ ^[0-9]+$ && $repeats -ge 1 && $repeats -le 100 ]] || die "-r wants 1..100"
if [ -z "$build" ]; then
    build="$here/build/bench-oversub"
    build_tdist "$here" "$build" "$build/build.log" 1 tdist-bench tdistrun
fi
run="$build/tools/tdistrun/tdistrun"
bench="$build/tools/tdist-bench/tdist-bench"
[ -x "$run" ] && [ -x "$bench" ] || die "no tdistrun / tdist-bench under $build/tools"
if [ -z "$cpus" ]; then
    # the first two CPUs of this shell's affinity list ("0-3,6" -> 0,1)
    list=$(taskset -pc $$ | sed 's/.*: //')
    all=()
    IFS=, read -ra parts <<<"$list"
    for p in "${parts[@]}"; do
        if [[ $p == *-* ]]; then
            for ((c = ${p%-*}; c <= ${p#*-} && ${#all[@]} < 2; c++)); do all+=("$c"); done
        else
            all+=("$p")
        fi
        [ ${#all[@]} -ge 2 ] && break
    done
    [ ${#all[@]} -ge 2 ] || die "this shell may run on one CPU only"
    cpus="${all[0]},${all[1]}"
fi

# time_us OP TRANSPORT RANKS SIZE: one tdist-bench run; its time (us) for SIZE.
time_us() {
    local out
    out=$(TDIST_TRANSPORT=$2 timeout -k 10 300 taskset -c "$cpus" "$run" --nproc-per-node "$3" \
        --no-prefix "$bench" -o "$1" -b "$4" -e "$4" -n "$iters" -w 10 -c 0 2>&1) ||
        die "tdist-bench failed ($1, $2, $3 ranks, $4 B): $out"
    grep -q "^# tdist-bench $1: $3 ranks," <<<"$out" || die "not $1 on $3 ranks: $out"
    awk '$1 ~ /^[0-9]+$/ && NF >= 5 { t = $5 } END { if (t == "") exit 1; print t }' <<<"$out" ||
        die "no time in tdist-bench's output: $out"
}

# median of the arguments
median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'; }

echo "# f32 sum, 2 vs 8 ranks on CPUs $cpus, $iters iterations, median of $repeats runs;" \
     "load: $(cut -d' ' -f1-3 /proc/loadavg)"
printf "# %-10s %-9s %10s %14s %14s %8s\n" op transport bytes "2 ranks (us)" "8 ranks (us)" ratio
for op in $ops; do
    name=oversub op_sizes=$sizes
    [ "$op" = all_reduce ] || name="oversub_$op"
    [ "$op" = barrier ] && op_sizes=8 # no data: one size says it all
    for tr in $transports; do
        for s in $op_sizes; do
            a2=() a8=()
            for ((k = 0; k < repeats; k++)); do
                a2+=("$(time_us "$op" "$tr" 2 "$s")")
                a8+=("$(time_us "$op" "$tr" 8 "$s")")
            done
            t2=$(median "${a2[@]}")
            t8=$(median "${a8[@]}")
            ratio=$(awk -v a="$t8" -v b="$t2" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }')
            printf "  %-10s %-9s %10s %14s %14s %8s\n" "$op" "$tr" "$s" "$t2" "$t8" "$ratio"
            echo "RESULT ${name}_${tr}_${s}_2ranks $t2 us"
            echo "RESULT ${name}_${tr}_${s}_8ranks $t8 us"
            echo "RESULT ${name}_${tr}_${s} $ratio x"
        done
    done
done
