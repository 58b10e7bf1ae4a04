#!/usr/bin/python3
"""bench/compare/gloo_coll.py -- the PyTorch Gloo side of bench/compare/run.sh.

Measures torch.distributed.all_reduce (f32, SUM) on the "gloo" backend the
way tools/tdist-bench measures tdist_all_reduce (see docs/bench-compare.md):

  for each size: a barrier; WARMUP warm-up calls; ITERS samples of BATCH
  consecutive calls each (-k, default 1), timed with time.perf_counter_ns
  (CLOCK_MONOTONIC on Linux; no barrier between them; a sample is its time /
  BATCH); each rank takes the median of its ITERS samples; the row's time is
  the maximum over ranks of these medians (an all_reduce MAX). -k auto picks
  BATCH per size as tdist-bench does: as many calls as last about 100 us,
  from the warm-up calls' median (max over ranks).
  algbw = bytes / time; busbw = algbw * 2(n-1)/n (GB/s = 1e9 B/s).

torch's all_reduce is in place only, so before every call (warm-up and timed)
the input is copied into the output tensor, OUTSIDE the timed region: only the
all_reduce is timed. With BATCH > 1 the copy is made before each sample only
(the calls of a sample reduce the previous call's result), and one more
untimed call on a fresh copy gives the result that is checked. Inputs are
tdist-bench's (rank r, index i holds
((i % 1000003) * 7 + r * 3) % 5 + 1); the output is poisoned (-12345) before
the warm-up; after the timed loop every rank counts the elements that differ
from the sum computed locally (integer arithmetic); the row shows the worst rank.

Run with Debian's interpreter (/usr/bin/python3, which has python3-torch):

  /usr/bin/python3 gloo_coll.py --nproc 2 -b 8 -e 64M -f 2 -n 20 -w 5

This process is only the launcher: it starts NPROC worker processes (this
same file with --worker RANK), which meet through a torch FileStore in a
private temporary directory (no port is chosen by anyone; Gloo's own
connections use ephemeral ports on the loopback interface, GLOO_SOCKET_IFNAME=lo).
Rank 0 prints rows in tdist-bench's format. Exit status: 0; 1 if any element
was wrong or a worker failed or the deadline (--timeout) passed; 2 for bad
arguments.
"""

import argparse
import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_launch  # noqa: E402
from torch_launch import bounded_int  # noqa: E402

MAX_BYTES = 1 << 30
MAX_SIZES = 64
MAX_BATCH = 1000  # as tdist-bench's -k
AUTO_SAMPLE_US = 100.0  # as tdist-bench's -k auto
POISON = -12345.0


def parse_size(s):
    m = re.fullmatch(r"(\d+)([kKmMgG]?)(i?)([bB]?)", s)
    if not m or (m.group(3) and not m.group(2)):
        raise argparse.ArgumentTypeError("bad size '%s'" % s)
    mult = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[m.group(2).lower()]
    v = int(m.group(1)) * mult
    if v <= 0 or v > MAX_BYTES:
        raise argparse.ArgumentTypeError("size '%s' out of range (1..1G)" % s)
    return v


def sizes(a):
    out, b = [], a.min
    for _ in range(MAX_SIZES):
        out.append(b)
        if b >= a.max:
            break
        b = a.max if b > a.max // a.factor else b * a.factor
    return out


def median(v):
    v = sorted(v)
    k = len(v)
    return v[k // 2] if k % 2 else 0.5 * (v[k // 2 - 1] + v[k // 2])


def auto_batch(call_us):
    """-k auto, as tdist-bench: calls per sample for calls of call_us each."""
    if not call_us > 0:
        return 1
    return int(max(1, min(MAX_BATCH, AUTO_SAMPLE_US / call_us)))


def batch_arg(s):
    if s == "auto":
        return 0
    return bounded_int(1, MAX_BATCH)(s)


def worker(a):
    import datetime
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    rank, n = a.worker, a.nproc
    if a.bind == "core":  # rank r on the r-th allowed CPU, like tdistrun --bind-to core
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpus[rank % len(cpus)]})
    store = dist.FileStore(a.store, n)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=n,
                            timeout=datetime.timedelta(seconds=a.timeout))
    if rank == 0:
        print("# gloo_coll all_reduce: %d ranks, dtype f32, redop sum, %d iterations "
              "(+%d warm-up), check on, torch %s" % (n, a.iters, a.warmup, torch.__version__))
        if a.batch == 1:
            print("# time: max over ranks of each rank's median; GB/s = 1e9 B/s")
        elif a.batch > 1:
            print("# time: max over ranks of each rank's median sample of %d calls (its "
                  "time / %d); GB/s = 1e9 B/s" % (a.batch, a.batch))
        else:
            print("# time: max over ranks of each rank's median sample (batch time / calls; "
                  "calls per sample chosen per size, ~%.0f us); GB/s = 1e9 B/s" % AUTO_SAMPLE_US)
        print("# %12s %12s %5s %10s %12s %11s %11s %8s" % (
            "bytes", "count", "type", "redop", "time(us)", "algbw(GB/s)", "busbw(GB/s)",
            "wrong"))
        sys.stdout.flush()
    status = 0
    for b in sizes(a):
        count = max(b // 4, 1)
        ii = torch.arange(count, dtype=torch.int64) % 1000003
        send = ((ii * 7 + rank * 3) % 5 + 1).to(torch.float32)
        expected = torch.zeros(count, dtype=torch.int64)
        for r in range(n):
            expected += (ii * 7 + r * 3) % 5 + 1
        expected = expected.to(torch.float32)
        del ii
        recv = torch.full((count,), POISON, dtype=torch.float32)
        times = []
        dist.barrier()
        for _ in range(a.warmup):
            recv.copy_(send)
            t0 = time.perf_counter_ns()
            dist.all_reduce(recv, op=dist.ReduceOp.SUM)
            times.append((time.perf_counter_ns() - t0) / 1e3)
        batch = a.batch
        if batch == 0:
            call = torch.tensor([median(times) if times else 0.0], dtype=torch.float64)
            dist.all_reduce(call, op=dist.ReduceOp.MAX)
            batch = auto_batch(call.item())
        times = []
        for _ in range(a.iters):
            recv.copy_(send)
            t0 = time.perf_counter_ns()
            for _ in range(batch):
                dist.all_reduce(recv, op=dist.ReduceOp.SUM)
            times.append((time.perf_counter_ns() - t0) / 1e3 / batch)
        med = median(times)
        if batch > 1:  # the checked result: one call on a fresh copy
            recv.copy_(send)
            dist.all_reduce(recv, op=dist.ReduceOp.SUM)
        wrong = int((recv != expected).sum().item())
        agg = torch.tensor([med, float(wrong)], dtype=torch.float64)
        dist.all_reduce(agg, op=dist.ReduceOp.MAX)
        max_med, max_wrong = agg[0].item(), int(agg[1].item())
        nbytes = count * 4
        algbw = nbytes / (max_med * 1e3) if max_med > 0 else 0.0
        busbw = algbw * 2.0 * (n - 1) / n
        if rank == 0:
            if a.batch == 0:
                print("# %d bytes: %d calls per sample" % (nbytes, batch))
            print("  %12d %12d %5s %10s %12.3f %11.3f %11.3f %8d" % (
                nbytes, count, "f32", "sum", max_med, algbw, busbw, max_wrong))
            sys.stdout.flush()
        if max_wrong:
            status = 1
        del send, recv, expected
    if status and rank == 0:
        print("gloo_coll: wrong elements found", file=sys.stderr)
    dist.destroy_process_group()
    return status


def launch(a, argv):
    return torch_launch.launch(__file__, "gloo_coll", a.nproc, a.timeout, argv, {"OMP_NUM_THREADS": "1"})


def main():
    ap = argparse.ArgumentParser(description="f32 SUM all_reduce on torch.distributed gloo, "
                                 "measured like tdist-bench")
    ap.add_argument("--nproc", type=bounded_int(1, 64), default=2, help="ranks (default 2)")
    ap.add_argument("-b", dest="min", type=parse_size, default=8, help="smallest size (8)")
    ap.add_argument("-e", dest="max", type=parse_size, default=64 << 20,
                    help="largest size (64M)")
    ap.add_argument("-f", dest="factor", type=bounded_int(2, 1 << 20), default=2,
                    help="size factor (2); MAX is always the last size")
    ap.add_argument("-n", dest="iters", type=bounded_int(1, 1000000), default=20,
                    help="timed iterations (20)")
    ap.add_argument("-w", dest="warmup", type=bounded_int(0, 1000000), default=5,
                    help="warm-up iterations (5)")
    ap.add_argument("-k", dest="batch", type=batch_arg, default=1,
                    help="calls per timed sample, 1..%d or auto (1)" % MAX_BATCH)
    ap.add_argument("--bind", choices=("core", "none"), default="none",
                    help="core: pin rank r to the r-th allowed CPU (default none)")
    ap.add_argument("--timeout", type=bounded_int(1, 86400), default=600,
                    help="seconds before everything is stopped (600)")
    ap.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--store", default=None, help=argparse.SUPPRESS)
    args = sys.argv[1:]
    a = ap.parse_args(args)
    if a.min > a.max:
        ap.error("-b is larger than -e")
    if a.worker is not None:
        return worker(a)
    return launch(a, args)


if __name__ == "__main__":
    sys.exit(main())
