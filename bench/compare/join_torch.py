#!/usr/bin/python3
"""bench/compare/join_torch.py -- the PyTorch side of bench/compare/join.sh.

The DDP training step of bench/compare/ddp_torch.py (same MLPs, data, loss,
SGD, timing; its helpers are imported, not copied) with and without
torch.distributed.algorithms.join.Join, as bench_ddp_step --join /
--join-empty-rank measures tdist:

  --mode ddp         DistributedDataParallel (default options) on "gloo", no Join
  --mode join        the whole loop (warm-up included) inside `with Join([ddp]):`,
                     every rank the same number of steps (even inputs)
  --mode join --empty-rank R
                     the same, but rank R has no inputs at all: its loop is
                     empty, so it spends the run inside Join's __exit__,
                     shadowing the others' iterations (DDP's join hook)

  --mode alternate [--empty-rank R] [--block K]
                     all of ddp, join (and empty, rank R, default the last)
                     in ONE run, like bench_ddp_step --join-alternate: after
                     the warm-up (no Join) the timed steps go in blocks of K
                     (default 5) steps, one block per mode in turn, the order
                     rotated every round, each Join block its own
                     `with Join([ddp]):`; prints each mode's median and the
                     median over rounds of the per-round ratio to ddp

Timing: time.perf_counter_ns around each whole step (zero_grad, forward,
loss, backward, SGD step); every rank keeps its timed steps' times (the
empty rank zeros); after the Join one all_reduce MAX gives the slowest
(active) rank per step; the step time is the median over steps.

  /usr/bin/python3 join_torch.py --mode join --nproc 4 --empty-rank 3 --bind core --model 3M

Rank 0 prints comment lines and one row per model

  ROW torch <mode> <model> <world> <median_ms> <min_ms> <max_ms> - - - -

(<mode>: ddp, ddp_join or ddp_join_empty<R>, as bench_ddp_step names them)
and RESULT lines. Exit status 0; 1 if a worker failed or the deadline
passed; 2 for bad arguments.
"""

import argparse
import os
import sys
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ddp_torch  # noqa: E402  (build, median, MODELS, constants)
import torch_launch  # noqa: E402
from torch_launch import bounded_int  # noqa: E402


def mode_name(a):
    if a.mode == "ddp":
        return "ddp"
    return "ddp_join_empty%d" % a.empty_rank if a.empty_rank is not None else "ddp_join"


def run_alternate(a, name, rank, n, torch, dist):
    from torch.distributed.algorithms.join import Join

    din, hidden, layers, d_steps, d_warm = ddp_torch.MODELS[name]
    steps = a.steps if a.steps else d_steps
    warmup = a.warmup if a.warmup is not None else d_warm
    B, K = a.batch, a.block
    empty_rank = a.empty_rank if a.empty_rank is not None else n - 1
    modes = ["ddp", "join"] + (["empty"] if a.with_empty else [])
    rounds = (steps + K - 1) // K
    per = rounds * K
    torch.manual_seed(1234)
    model = ddp_torch.build(torch, din, hidden, layers)
    net = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(net.parameters(), lr=ddp_torch.LR)
    g = torch.Generator().manual_seed(0x5EED0000 + rank * 7919)
    xs = torch.rand(ddp_torch.NBATCHES, B, din, generator=g) * 2 - 1
    ys = torch.randint(0, ddp_torch.CLASSES, (ddp_torch.NBATCHES, B), generator=g)
    loss_fn = torch.nn.functional.cross_entropy
    t = [[0.0] * per for _ in modes]
    it = 0

    def step():
        nonlocal it
        x, y = xs[it % ddp_torch.NBATCHES], ys[it % ddp_torch.NBATCHES]
        it += 1
        t0 = time.perf_counter_ns()
        opt.zero_grad()
        lo = loss_fn(net(x), y)
        lo.backward()
        opt.step()
        return (time.perf_counter_ns() - t0) / 1e6

    for _ in range(warmup):
        step()
    for r in range(rounds):
        for q in range(len(modes)):
            mi = (q + r) % len(modes)
            mode = modes[mi]
            idle = mode == "empty" and rank == empty_rank

            def block():
                for s in range(K):
                    if not idle:
                        t[mi][r * K + s] = step()

            if mode == "ddp":
                block()
            else:
                with Join([net]):
                    block()
    tt = torch.tensor(t, dtype=torch.float64)
    dist.all_reduce(tt, op=dist.ReduceOp.MAX)
    t = tt.tolist()
    if rank == 0:
        print("# model %s, batch %d per rank, world %d, alternate: %d rounds of %s (%d steps each;"
              " order rotated per round), %d warm-up steps; empty rank %d; torch %s threads %d"
              % (name, B, n, rounds, " ".join(modes), K, warmup, empty_rank, torch.__version__,
                 torch.get_num_threads()))
        meds = [ddp_torch.median(v) for v in t]
        for mi, mode in enumerate(modes):
            print("ROW torch alt_%s %s %d %.4f %.4f %.4f - - - -"
                  % (mode, name, n, meds[mi], min(t[mi]), max(t[mi])))
            print("RESULT torch_step_%s_ddp%d_alt_%s_ms %.3f ms" % (name, n, mode, meds[mi]))
        for mi in range(1, len(modes)):
            pr = [ddp_torch.median(t[mi][r * K:(r + 1) * K]) /
                  ddp_torch.median(t[0][r * K:(r + 1) * K]) for r in range(rounds)]
            rmed = ddp_torch.median(pr)
            print("# %s/ddp: ratio of the medians %.4f, median of the %d per-round ratios %.4f"
                  % (modes[mi], meds[mi] / meds[0], rounds, rmed))
            print("RESULT torch_step_%s_ddp%d_alt_%s_over_ddp %.4f x" % (name, n, modes[mi], rmed))
            if modes[mi] == "empty":
                print("RESULT torch_step_%s_ddp%d_alt_empty_throughput_vs_ddp %.4f x"
                      % (name, n, 1 / rmed))
        sys.stdout.flush()
    del net, model, opt


def run_model(a, name, rank, n, torch, dist):
    from torch.distributed.algorithms.join import Join

    din, hidden, layers, d_steps, d_warm = ddp_torch.MODELS[name]
    steps = a.steps if a.steps else d_steps
    warmup = a.warmup if a.warmup is not None else d_warm
    B = a.batch
    torch.manual_seed(1234)
    model = ddp_torch.build(torch, din, hidden, layers)
    net = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(net.parameters(), lr=ddp_torch.LR)
    g = torch.Generator().manual_seed(0x5EED0000 + rank * 7919)
    xs = torch.rand(ddp_torch.NBATCHES, B, din, generator=g) * 2 - 1
    ys = torch.randint(0, ddp_torch.CLASSES, (ddp_torch.NBATCHES, B), generator=g)
    loss_fn = torch.nn.functional.cross_entropy
    empty = a.mode == "join" and a.empty_rank == rank
    total = 0 if empty else warmup + steps

    t = [0.0] * steps
    loss = None

    def loop():
        nonlocal loss
        for it in range(total):
            x, y = xs[it % ddp_torch.NBATCHES], ys[it % ddp_torch.NBATCHES]
            t0 = time.perf_counter_ns()
            opt.zero_grad()
            lo = loss_fn(net(x), y)
            lo.backward()
            opt.step()
            t1 = time.perf_counter_ns()
            loss = lo.item()
            if it >= warmup:
                t[it - warmup] = (t1 - t0) / 1e6

    if a.mode == "join":
        with Join([net]):
            loop()
    else:
        loop()
    tt = torch.tensor(t, dtype=torch.float64)
    dist.all_reduce(tt, op=dist.ReduceOp.MAX)
    t = tt.tolist()
    active = torch.tensor([0.0 if empty else 1.0])
    dist.all_reduce(active)
    active = int(active.item())
    med, mn, mx = ddp_torch.median(t), min(t), max(t)
    if rank == 0:
        mode = mode_name(a)
        print("# model %s, batch %d per rank, mode %s, world %d (%d active), %d timed steps "
              "(+%d warm-up), torch %s threads %d; last loss %.4f"
              % (name, B, mode, n, active, steps, warmup, torch.__version__,
                 torch.get_num_threads(), loss if loss is not None else float("nan")))
        print("# step time (max over %s ranks per step): median %.3f ms, min %.3f, max %.3f; "
              "active-rank throughput %.1f samples/s"
              % ("the active" if active < n else "all", med, mn, mx,
                 active * B * 1e3 / med if med > 0 else 0.0))
        print("ROW torch %s %s %d %.4f %.4f %.4f - - - -" % (mode, name, n, med, mn, mx))
        tag = "ddp%d%s" % (n, "" if a.mode == "ddp" else "_" + mode[4:])
        print("RESULT torch_step_%s_%s_ms %.3f ms" % (name, tag, med))
        sys.stdout.flush()
    del net, model, opt


def worker(a):
    import datetime
    import torch
    import torch.distributed as dist

    torch.set_num_threads(a.threads)
    rank, n = a.worker, a.nproc
    if a.bind == "core":  # rank r on the r-th allowed CPU (modulo), like tdistrun --bind-to core
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpus[rank % len(cpus)]})
    store = dist.FileStore(a.store, n)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=n,
                            timeout=datetime.timedelta(seconds=a.timeout))
    for name in (["3M", "25M"] if a.model == "all" else [a.model]):
        if a.mode == "alternate":
            run_alternate(a, name, rank, n, torch, dist)
        else:
            run_model(a, name, rank, n, torch, dist)
    dist.destroy_process_group()
    return 0


def main():
    ap = argparse.ArgumentParser(description="PyTorch DDP step time with and without Join (gloo)")
    ap.add_argument("--mode", choices=("ddp", "join", "alternate"), required=True)
    ap.add_argument("--empty-rank", type=bounded_int(0, 63), default=None,
                    help="with --mode join: this rank has no inputs (alternate: the empty "
                    "mode's empty rank, default the last)")
    ap.add_argument("--with-empty", action="store_true",
                    help="with --mode alternate: also the empty mode")
    ap.add_argument("--block", type=bounded_int(1, 100000), default=5,
                    help="with --mode alternate: steps per block (5)")
    ap.add_argument("--model", choices=("3M", "25M", "all"), default="3M")
    ap.add_argument("--nproc", type=bounded_int(2, 64), default=2, help="processes (default 2)")
    ap.add_argument("-n", dest="steps", type=bounded_int(1, 100000), default=0,
                    help="timed steps (default: 3M 30, 25M 10)")
    ap.add_argument("-w", dest="warmup", type=bounded_int(0, 100000), default=None,
                    help="warm-up steps (default: 3M 5, 25M 3)")
    ap.add_argument("--batch", type=bounded_int(1, 1 << 16), default=64)
    ap.add_argument("--threads", type=bounded_int(1, 1024), default=1)
    ap.add_argument("--bind", choices=("core", "none"), default="none")
    ap.add_argument("--timeout", type=bounded_int(1, 86400), default=600)
    ap.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--store", default=None, help=argparse.SUPPRESS)
    args = sys.argv[1:]
    a = ap.parse_args(args)
    if a.empty_rank is not None and (a.mode == "ddp" or a.empty_rank >= a.nproc):
        ap.error("--empty-rank needs --mode join or alternate and a rank below --nproc")
    if a.worker is not None:
        return worker(a)
    return torch_launch.launch(__file__, "join_torch", a.nproc, a.timeout, args,
                               {"OMP_NUM_THREADS": str(a.threads),
                                "OPENBLAS_NUM_THREADS": str(a.threads)})


if __name__ == "__main__":
    sys.exit(main())
