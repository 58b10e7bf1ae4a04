#!/usr/bin/python3
"""bench/compare/gloo_coll.py -- the PyTorch Gloo side of bench/compare/run.sh.

Measures one torch.distributed collective (-o: all_reduce (default),
broadcast, reduce, all_gather, gather, scatter, all_to_all (all_to_all_single),
barrier; f32, SUM, roots 0; Gloo has no reduce_scatter) on the "gloo" backend
the way tools/tdist-bench measures tdist's, with its buffer conventions (see
docs/bench-compare.md):

  for each size: a barrier; WARMUP warm-up calls; ITERS samples of BATCH
  consecutive calls each (-k, default 1), timed with time.perf_counter_ns
  (CLOCK_MONOTONIC on Linux; no barrier between them; a sample is its time /
  BATCH); each rank takes the median of its ITERS samples; the row's time is
  the maximum over ranks of these medians (an all_reduce MAX). -k auto picks
  BATCH per size as tdist-bench does: as many calls as last about 100 us,
  from the warm-up calls' median (max over ranks).
  algbw = bytes / time; busbw = algbw * tdist-bench's factor (GB/s = 1e9 B/s).

torch's all_reduce, reduce and broadcast are in place only, so before every
call (warm-up and timed) the input is copied into the output tensor, OUTSIDE
the timed region: only the collective is timed. With BATCH > 1 the copy is made before each sample only
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


BUS = {"broadcast": 1.0, "reduce": 1.0, "barrier": 0.0}
OPS = ("all_reduce", "broadcast", "reduce", "all_gather", "gather", "scatter", "all_to_all",
       "barrier")


class Case:
    """One size of one op, with tdist-bench's buffers (bytes = the per-rank
    big buffer: all_gather's and gather's output, scatter's and
    all_to_all's input; blocks of bytes / n; roots 0). prep() restores the
    inputs of the in-place ops (all_reduce, reduce, broadcast) outside the
    timed region; call() is the timed call; wrong() counts this rank's
    wrong output elements."""

    def __init__(self, op, rank, n, nbytes, torch, dist):
        self.op, self.rank, self.n, self.dist, self.torch = op, rank, n, dist, torch
        count = max(nbytes // 4, 1)
        chunked = op in ("all_gather", "gather", "scatter", "all_to_all")
        self.chunk = max(count // n, 1) if chunked else count
        self.count = self.chunk * n if chunked else count
        ii = torch.arange(self.count, dtype=torch.int64) % 1000003

        def value(r, idx):  # tdist-bench's input formula
            return ((idx * 7 + r * 3) % 5 + 1).to(torch.float32)

        f32 = torch.float32
        self.send = self.recv = self.want = None
        self.sends = self.recvs = None
        if op in ("all_reduce", "reduce"):
            self.send = value(rank, ii)
            acc = torch.zeros(self.count, dtype=torch.int64)
            for r in range(n):
                acc += (ii * 7 + r * 3) % 5 + 1
            self.want = acc.to(f32) if op == "all_reduce" or rank == 0 else None
            self.recv = torch.full((self.count,), POISON, dtype=f32)
        elif op == "broadcast":
            self.want = value(0, ii)
            self.recv = torch.full((self.count,), POISON, dtype=f32)
        elif op in ("all_gather", "gather"):
            self.send = value(rank, torch.arange(self.chunk) % 1000003)
            self.recvs = [torch.full((self.chunk,), POISON, dtype=f32) for _ in range(n)]
            if op == "all_gather" or rank == 0:
                self.want = torch.cat([value(r, torch.arange(self.chunk) % 1000003)
                                       for r in range(n)])
        elif op == "scatter":
            self.sends = [value(0, torch.arange(p * self.chunk, (p + 1) * self.chunk) % 1000003)
                          for p in range(n)] if rank == 0 else None
            self.recv = torch.full((self.chunk,), POISON, dtype=f32)
            self.want = value(0, torch.arange(rank * self.chunk, (rank + 1) * self.chunk) % 1000003)
        elif op == "all_to_all":
            self.send = value(rank, ii)
            self.recv = torch.full((self.count,), POISON, dtype=f32)
            blk = torch.arange(rank * self.chunk, (rank + 1) * self.chunk) % 1000003
            self.want = torch.cat([value(p, blk) for p in range(n)])

    def prep(self):
        if self.op in ("all_reduce", "reduce"):
            self.recv.copy_(self.send)
        elif self.op == "broadcast":
            if self.rank == 0:
                self.recv.copy_(self.want)

    def call(self):
        d, op = self.dist, self.op
        if op in ("all_reduce",):
            d.all_reduce(self.recv, op=d.ReduceOp.SUM)
        elif op == "reduce":
            d.reduce(self.recv, 0, op=d.ReduceOp.SUM)
        elif op == "broadcast":
            d.broadcast(self.recv, 0)
        elif op == "all_gather":
            d.all_gather(self.recvs, self.send)
        elif op == "gather":
            d.gather(self.send, self.recvs if self.rank == 0 else None, dst=0)
        elif op == "scatter":
            d.scatter(self.recv, self.sends, src=0)
        elif op == "all_to_all":
            d.all_to_all_single(self.recv, self.send)
        else:
            d.barrier()

    def wrong(self):
        if self.op == "barrier" or self.want is None:
            return 0
        got = self.recv if self.recvs is None else self.torch.cat(self.recvs)
        return int((got != self.want).sum().item())


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
        print("# gloo_coll %s: %d ranks, dtype f32, redop sum, %d iterations "
              "(+%d warm-up), check on, torch %s" % (a.op, n, a.iters, a.warmup,
                                                     torch.__version__))
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
    for b in (sizes(a) if a.op != "barrier" else [0]):
        c = Case(a.op, rank, n, b, torch, dist)
        times = []
        dist.barrier()
        for _ in range(a.warmup):
            c.prep()
            t0 = time.perf_counter_ns()
            c.call()
            times.append((time.perf_counter_ns() - t0) / 1e3)
        batch = a.batch
        if batch == 0:
            call = torch.tensor([median(times) if times else 0.0], dtype=torch.float64)
            dist.all_reduce(call, op=dist.ReduceOp.MAX)
            batch = auto_batch(call.item())
        times = []
        for _ in range(a.iters):
            c.prep()
            t0 = time.perf_counter_ns()
            for _ in range(batch):
                c.call()
            times.append((time.perf_counter_ns() - t0) / 1e3 / batch)
        med = median(times)
        if batch > 1:  # the checked result: one call on fresh inputs
            c.prep()
            c.call()
        wrong = c.wrong()
        agg = torch.tensor([med, float(wrong)], dtype=torch.float64)
        dist.all_reduce(agg, op=dist.ReduceOp.MAX)
        max_med, max_wrong = agg[0].item(), int(agg[1].item())
        nbytes = c.count * 4 if a.op != "barrier" else 0
        algbw = nbytes / (max_med * 1e3) if max_med > 0 else 0.0
        factor = 2.0 * (n - 1) / n if a.op == "all_reduce" else BUS.get(a.op, (n - 1.0) / n)
        busbw = algbw * factor
        if rank == 0:
            if a.batch == 0:
                print("# %d bytes: %d calls per sample" % (nbytes, batch))
            print("  %12d %12d %5s %10s %12.3f %11.3f %11.3f %8d" % (
                nbytes, c.count if nbytes else 0, "f32",
                "sum" if a.op in ("all_reduce", "reduce") else "-", max_med, algbw, busbw,
                max_wrong))
            sys.stdout.flush()
        if max_wrong:
            status = 1
        del c
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
    ap.add_argument("-o", dest="op", choices=OPS, default="all_reduce",
                    help="collective (all_reduce); Gloo has no reduce_scatter")
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
