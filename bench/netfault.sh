#!/usr/bin/env bash
# bench/netfault.sh — throughput and latency over tdist_netfault's faulty
# link (tests/net/netfault.c), one fault at a time: the figures behind
# the net tests' bad link. Needs root (network namespaces, tun).
#
# Two namespaces joined by the relay; for each fault:
#   tcp      one TCP stream's goodput through the link (4 MiB, python3)
#   bcast    tdist broadcast of 1 MiB between the two namespaces (2 ranks,
#            tdist-bench, median of 5): its algorithm bandwidth
#   ar8      tdist all_reduce of 8 bytes: median time per call
# and prints `RESULT netfault_<fault>_<what> <value> <unit>` lines.
#
#   bench/netfault.sh [BUILD_DIR]     (default build/rel; built if needed)
#
# Every step is bounded by `timeout`; the namespaces and the relay go on
# exit.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-$here/build/rel}"
py=/usr/bin/python3
die() { echo "netfault.sh: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "needs root (network namespaces and tun devices)"
[ -x "$py" ] || die "needs $py"

cmake -S "$here" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTDIST_BUILD_TESTS=OFF >/dev/null
timeout 1200 ninja -C "$build" tdist-bench >/dev/null
bench_bin="$(find "$build/tools" -type f -name tdist-bench -perm -u+x | head -1)"
[ -n "$bench_bin" ] || die "tdist-bench not found under $build/tools"
relay="$build/tdist_netfault"
cc -O2 -Wall -o "$relay" "$here/tests/net/netfault.c"

tag="nfb$$"
nsa="$tag-a" nsb="$tag-b"
x=$(( $$ % 250 + 1 ))
addr_a="10.232.$x.1" addr_b="10.232.$x.2"
tmp="$(mktemp -d)"
relay_pid=""
cleanup() {
    if [ -n "$relay_pid" ]; then
        kill "$relay_pid" 2>/dev/null || true
        wait "$relay_pid" 2>/dev/null || true
        cat "$tmp/relay.out" >&2 || true # the relay's counters
    fi
    ip netns delete "$nsa" 2>/dev/null || true
    ip netns delete "$nsb" 2>/dev/null || true
    rm -rf "$tmp"
}
trap cleanup EXIT
ip netns add "$nsa"
ip netns add "$nsb"
mkfifo "$tmp/ctl"
"$relay" --ns-a "$nsa" --dev-a "${tag}a" --ns-b "$nsb" --dev-b "${tag}b" --ctl "$tmp/ctl" \
    --ready-fd 3 --max-seconds 1800 3>"$tmp/ready" >"$tmp/relay.out" 2>&1 &
relay_pid=$!
for _ in $(seq 100); do [ -s "$tmp/ready" ] && break; sleep 0.05; done
[ -s "$tmp/ready" ] || die "the relay did not start: $(cat "$tmp/relay.out")"
ip -n "$nsa" addr add "$addr_a/24" dev "${tag}a"
ip -n "$nsb" addr add "$addr_b/24" dev "${tag}b"
for ns in "$nsa" "$nsb"; do ip -n "$ns" link set lo up; done
ip -n "$nsa" link set "${tag}a" up
ip -n "$nsb" link set "${tag}b" up

ctl() { echo "$*" >"$tmp/ctl"; }

cat >"$tmp/tcp.py" <<'EOF'
import socket, sys, time
if sys.argv[1] == "serve":
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((sys.argv[2], 5001)); s.listen(1); s.settimeout(60)
    c, _ = s.accept(); c.settimeout(60)
    while c.recv(1 << 16): pass
    c.sendall(b"k"); c.close()
else:
    c = socket.create_connection((sys.argv[2], 5001), timeout=60)
    n, buf, sent = int(sys.argv[3]), b"a" * 65536, 0
    t0 = time.monotonic()
    while sent < n: c.sendall(buf); sent += len(buf)
    c.shutdown(socket.SHUT_WR); c.recv(1)
    print("%.3f" % (sent * 8 / (time.monotonic() - t0) / 1e6))
EOF

port=29600
# run_bench OP SIZE: tdist-bench on two ranks, one per namespace; prints its row
run_bench() {
    local op=$1 size=$2 r pids=()
    port=$((port + 1))
    for r in 0 1; do
        local ns=$nsa; [ $r = 1 ] && ns=$nsb
        ip netns exec "$ns" env MASTER_ADDR="$addr_a" MASTER_PORT=$port RANK=$r WORLD_SIZE=2 \
            LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 TDIST_LAUNCHER_STORE=0 TDIST_TIMEOUT_MS=60000 \
            timeout 120 "$bench_bin" -o "$op" -b "$size" -e "$size" -n 5 -w 1 \
            >"$tmp/bench.$r" 2>&1 &
        pids+=($!)
    done
    wait "${pids[0]}" || die "tdist-bench rank 0 failed: $(cat "$tmp/bench.0")"
    wait "${pids[1]}" || die "tdist-bench rank 1 failed: $(cat "$tmp/bench.1")"
    grep -v '^#' "$tmp/bench.0" | awk 'NF >= 7 && $1 ~ /^[0-9]+$/ {print; exit}'
}

measure() {
    local name=$1 spid mbit row
    ip netns exec "$nsb" timeout 90 "$py" "$tmp/tcp.py" serve "$addr_b" & spid=$!
    sleep 0.3
    mbit=$(ip netns exec "$nsa" timeout 90 "$py" "$tmp/tcp.py" send "$addr_b" $((4 << 20)))
    wait "$spid" || true
    echo "RESULT netfault_${name}_tcp $mbit Mbit/s"
    row=$(run_bench broadcast 1M)
    # columns: size count type redop time_us algbw_GBps busbw_GBps ...
    echo "RESULT netfault_${name}_bcast1M $(awk '{printf "%.2f", 8388608 / $5}' <<<"$row") Mbit/s"
    row=$(run_bench all_reduce 8)
    echo "RESULT netfault_${name}_ar8 $(awk '{printf "%.2f", $5 / 1000}' <<<"$row") ms"
}

clean() { ctl "set delay 0"; ctl "set jitter 0"; ctl "set loss 0"; ctl "set rate 0"; ctl pass; }

clean
measure clean
ctl "set delay 50"; ctl "set jitter 10"; measure delay50j10; clean
ctl "set loss 3"; measure loss3; clean
ctl "set rate 10"; measure rate10; clean
ctl "set delay 50"; ctl "set jitter 10"; ctl "set loss 3"; ctl "set rate 10"
measure all; clean
