#!/usr/bin/env bash
# bench/compare/hier.sh — hierarchical against flat all_reduce on two
# "hosts" of two ranks each: two network namespaces joined by a veth pair
# (made here, removed on exit; needs root), one tdistrun per namespace
# (--nnodes 2), tdist-bench all_reduce. Flat: TDIST_HIERARCHICAL=0 (every
# pair over TCP, also the two ranks of one host); hierarchical: the default
# (shared memory inside each host, TCP only between the hosts' first
# ranks). The two modes alternate, RUNS times each; the table quotes
# medians. Ends with RESULT lines.
#
# usage: bench/compare/hier.sh [-r RUNS] [-n ITERS] [-b MIN] [-e MAX] [-s]
#   -s  do not (re)build; use build/bench-release as it is
set -u -o pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUILD="$REPO/build/bench-release"
RUNS=3 ITERS=10 MIN=1M MAX=64M BUILD_IT=1
while getopts "r:n:b:e:sh" o; do
    case "$o" in
    r) RUNS=$OPTARG ;;
    n) ITERS=$OPTARG ;;
    b) MIN=$OPTARG ;;
    e) MAX=$OPTARG ;;
    s) BUILD_IT=0 ;;
    h) sed -n 2,14p "$0"; exit 0 ;;
    *) exit 2 ;;
    esac
done
die() { echo "hier.sh: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "needs root (ip netns)"
command -v ip >/dev/null || die "needs ip (iproute2)"

if [ "$BUILD_IT" = 1 ]; then
    cmake -S "$REPO" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTDIST_BUILD_TESTS=OFF \
          >/dev/null || die "cmake failed"
    cmake --build "$BUILD" --target tdistrun tdist-bench >/dev/null || die "build failed"
fi
RUN="$BUILD/tools/tdistrun/tdistrun"
BENCH="$BUILD/tools/tdist-bench/tdist-bench"
[ -x "$RUN" ] && [ -x "$BENCH" ] || die "no tdistrun / tdist-bench in $BUILD"

tag="th$$"
A="$tag-a" B="$tag-b" VA="${tag}va" VB="${tag}vb"
cleanup() { ip netns del "$A" 2>/dev/null; ip netns del "$B" 2>/dev/null; }
trap cleanup EXIT
ip netns add "$A" && ip netns add "$B" || die "cannot create namespaces"
ip link add "$VA" type veth peer name "$VB" || die "cannot create the veth pair"
ip link set "$VA" netns "$A" && ip link set "$VB" netns "$B"
ip -n "$A" addr add 10.232.7.1/24 dev "$VA" && ip -n "$B" addr add 10.232.7.2/24 dev "$VB"
for ns in "$A" "$B"; do ip -n "$ns" link set lo up; done
ip -n "$A" link set "$VA" up && ip -n "$B" link set "$VB" up
out=$(mktemp -d /tmp/tdist-hier-XXXXXX)

# one job: 2 nodes x 2 ranks; prints the output of node 0 (rank 0's table)
job() { # mode run
    local mode=$1 run=$2 port=$((20000 + RANDOM % 20000)) hier=1
    [ "$mode" = flat ] && hier=0
    local common=(--nproc-per-node 2 --nnodes 2 --master-addr 10.232.7.1 --master-port "$port"
                  --no-prefix -q)
    TDIST_HIERARCHICAL=$hier timeout -k 5 300 ip netns exec "$B" "$RUN" "${common[@]}" \
        --node-rank 1 "$BENCH" -b "$MIN" -e "$MAX" -n "$ITERS" -w 2 -c 0 \
        >"$out/$mode.$run.b" 2>&1 &
    local pb=$!
    TDIST_HIERARCHICAL=$hier timeout -k 5 300 ip netns exec "$A" "$RUN" "${common[@]}" \
        --node-rank 0 "$BENCH" -b "$MIN" -e "$MAX" -n "$ITERS" -w 2 -c 0 \
        >"$out/$mode.$run.a" 2>&1
    local ra=$?
    wait "$pb"; local rb=$?
    [ $ra = 0 ] && [ $rb = 0 ] || { cat "$out/$mode.$run.a" "$out/$mode.$run.b" >&2; die "$mode run $run failed"; }
}
# the store port is picked at random in the namespace (nothing else listens
# there): a collision only fails that run

for run in $(seq 1 "$RUNS"); do
    job flat "$run"
    job hier "$run"
done

# rank 0 prints "RESULT all_reduce_f32_sum_time_<size> <us> us" lines
median() { sort -g | awk '{a[NR]=$1} END {if (NR % 2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }
keys=$(grep -h '^RESULT all_reduce_f32_sum_time_' "$out"/flat.1.a | awk '{print $2}')
[ -n "$keys" ] || { cat "$out"/flat.1.a >&2; die "no RESULT lines from tdist-bench"; }
printf '%-14s %12s %12s %10s\n' "2x2, f32 sum" "flat us" "hier us" "flat/hier"
: >"$out/results"
for key in $keys; do
    f=$(grep -h "^RESULT $key " "$out"/flat.*.a | awk '{print $3}' | median)
    h=$(grep -h "^RESULT $key " "$out"/hier.*.a | awk '{print $3}' | median)
    r=$(awk -v f="$f" -v h="$h" 'BEGIN {printf "%.2f", f / h}')
    printf '%-14s %12s %12s %10s\n' "${key#all_reduce_f32_sum_time_}" "$f" "$h" "$r"
    echo "RESULT hier_vs_flat_all_reduce_${key#all_reduce_f32_sum_time_} $r x" >>"$out/results"
done
cat "$out/results"
rm -rf "$out"
