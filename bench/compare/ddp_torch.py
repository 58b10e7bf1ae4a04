#!/usr/bin/python3
"""bench/compare/ddp_torch.py -- the PyTorch side of bench/compare/ddp.sh.

The training step of bench/ddp_step.c in PyTorch: the same MLPs, batch,
loss and SGD, timed the same way.

  models   3M : 1024 -> 3 x (Linear(1024), ReLU) -> Linear(10), 3,159,050 parameters
           25M: 2048 -> 6 x (Linear(2048), ReLU) -> Linear(10), 25,198,602 parameters
  data     synthetic, seeded per rank: 4 batches of B samples (inputs uniform
           in [-1, 1), labels uniform in 0..9), cycled
  step     zero_grad, forward, cross_entropy, backward, SGD(lr=0.01).step()
  modes    local: one process per rank, each trains alone (no DDP);
           ddp: torch.nn.parallel.DistributedDataParallel with default
           options (bucket_cap_mb 25, first bucket 1 MiB) on "gloo"
  timing   time.perf_counter_ns around each whole step; each rank keeps every
           timed step's time; after the loop one all_reduce MAX gives the
           slowest rank per step; the step time is the median over steps.
  threads  torch.set_num_threads(1), OMP_NUM_THREADS=1, OPENBLAS_NUM_THREADS=1
           (the same as bench_ddp_step --threads 1)

Run with Debian's interpreter (/usr/bin/python3 has python3-torch):

  /usr/bin/python3 ddp_torch.py --mode local --nproc 1
  /usr/bin/python3 ddp_torch.py --mode ddp --nproc 2 --bind core

This process is the launcher: it starts NPROC workers (this file with
--worker RANK) that meet through a torch FileStore in a private temporary
directory (no port chosen by anyone; Gloo uses ephemeral loopback ports,
GLOO_SOCKET_IFNAME=lo). Rank 0 prints comment lines, one row per model

  ROW torch <mode> <model> <world> <median_ms> <min_ms> <max_ms> <overlap> <wait_ms> <comm_ms> <compute_ms>

(the last four from DDP's own logging data when it has them, else "-")
and RESULT lines. Exit status 0; 1 if a worker failed or the deadline
(--timeout) passed; 2 for bad arguments.
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_launch  # noqa: E402
from torch_launch import bounded_int  # noqa: E402

CLASSES = 10
NBATCHES = 4
LR = 0.01
# name: (input, hidden, hidden layers, default steps, default warm-up)
MODELS = {"3M": (1024, 1024, 3, 30, 5), "25M": (2048, 2048, 6, 10, 3)}


def median(v):
    s = sorted(v)
    k = len(s)
    return s[k // 2] if k % 2 else 0.5 * (s[k // 2 - 1] + s[k // 2])


def build(torch, din, hidden, layers):
    mods = []
    width = din
    for _ in range(layers):
        mods += [torch.nn.Linear(width, hidden), torch.nn.ReLU()]
        width = hidden
    mods.append(torch.nn.Linear(width, CLASSES))
    return torch.nn.Sequential(*mods)


def run_model(a, name, rank, n, torch, dist):
    din, hidden, layers, d_steps, d_warm = MODELS[name]
    steps = a.steps if a.steps else d_steps
    warmup = a.warmup if a.warmup is not None else d_warm
    B = a.batch
    torch.manual_seed(1234)  # equal on every rank (DDP also broadcasts from rank 0)
    model = build(torch, din, hidden, layers)
    nparams = sum(p.numel() for p in model.parameters())
    net = model
    if a.mode == "ddp":
        net = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(net.parameters(), lr=LR)
    g = torch.Generator().manual_seed(0x5EED0000 + rank * 7919)
    xs = torch.rand(NBATCHES, B, din, generator=g) * 2 - 1
    ys = torch.randint(0, CLASSES, (NBATCHES, B), generator=g)
    loss_fn = torch.nn.functional.cross_entropy

    t = [[0.0] * steps for _ in range(4)]  # total, fwd+loss+zero_grad, backward, step
    first_loss = loss = None
    for it in range(warmup + steps):
        x, y = xs[it % NBATCHES], ys[it % NBATCHES]
        t0 = time.perf_counter_ns()
        opt.zero_grad()
        out = net(x)
        lo = loss_fn(out, y)
        t1 = time.perf_counter_ns()
        lo.backward()
        t2 = time.perf_counter_ns()
        opt.step()
        t3 = time.perf_counter_ns()
        loss = lo.item()
        if first_loss is None:
            first_loss = loss
        if it >= warmup:
            k = it - warmup
            t[0][k] = (t3 - t0) / 1e6
            t[1][k] = (t1 - t0) / 1e6
            t[2][k] = (t2 - t1) / 1e6
            t[3][k] = (t3 - t2) / 1e6
    # DDP's own timing (CPU timers; sampled at iterations < 10 and every 100th).
    stats = None
    if a.mode == "ddp":
        try:
            d = net._get_ddp_logging_data()
            comp = d.get("avg_backward_compute_time", 0) / 1e6
            comm = d.get("avg_backward_comm_time", 0) / 1e6
            ovl = d.get("avg_backward_compute_comm_overlap_time", 0) / 1e6
            if comm > 0:
                stats = (ovl / comm, comm - ovl, comm, comp)
        except Exception:  # private API; absent or different in other versions
            stats = None
    if n > 1:
        tt = torch.tensor(t, dtype=torch.float64)
        dist.all_reduce(tt, op=dist.ReduceOp.MAX)
        t = tt.tolist()
    med, mn, mx = median(t[0]), min(t[0]), max(t[0])
    if rank == 0:
        print("# model %s: %d parameters (%d -> %d x Linear(%d)+ReLU -> Linear(%d)), batch %d per "
              "rank, mode %s, world %d, %d timed steps (+%d warm-up), torch %s threads %d; "
              "loss %.4f -> %.4f" % (name, nparams, din, layers, hidden, CLASSES, B, a.mode, n,
                                     steps, warmup, torch.__version__, torch.get_num_threads(),
                                     first_loss, loss))
        print("# step time (max over ranks per step): median %.3f ms, min %.3f, max %.3f"
              % (med, mn, mx))
        print("# phases (median over steps of the slowest rank): zero_grad+forward+loss %.3f ms, "
              "backward (incl. DDP's wait) %.3f ms, sgd step %.3f ms"
              % (median(t[1]), median(t[2]), median(t[3])))
        if stats:
            print("# DDP logging data (rank 0, sampled iterations): backward compute %.3f ms, "
                  "comm %.3f ms, comm overlapped with compute %.3f ms (%.3f); exposed %.3f ms"
                  % (stats[3], stats[2], stats[2] - stats[1], stats[0], stats[1]))
        ov = ("%.4f %.4f %.4f %.4f" % stats) if stats else "- - - -"
        print("ROW torch %s %s %d %.4f %.4f %.4f %s" % (a.mode, name, n, med, mn, mx, ov))
        tag = "local" if (a.mode == "local" and n == 1) else "%s%d" % (a.mode, n)
        print("RESULT torch_step_%s_%s_ms %.3f ms" % (name, tag, med))
        sys.stdout.flush()
    del net, model, opt


def worker(a):
    import datetime
    import torch
    import torch.distributed as dist

    torch.set_num_threads(a.threads)
    rank, n = a.worker, a.nproc
    if a.bind == "core":  # rank r on the r-th allowed CPU, like tdistrun --bind-to core
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpus[rank % len(cpus)]})
    if n > 1 or a.mode == "ddp":
        store = dist.FileStore(a.store, n)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=n,
                                timeout=datetime.timedelta(seconds=a.timeout))
    for name in (["3M", "25M"] if a.model == "all" else [a.model]):
        run_model(a, name, rank, n, torch, dist)
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


def launch(a, argv):
    return torch_launch.launch(__file__, "ddp_torch", a.nproc, a.timeout, argv, {"OMP_NUM_THREADS": str(a.threads), "OPENBLAS_NUM_THREADS": str(a.threads)})


def main():
    ap = argparse.ArgumentParser(description="MLP training-step time, PyTorch local vs DDP (gloo)")
    ap.add_argument("--mode", choices=("local", "ddp"), required=True)
    ap.add_argument("--model", choices=("3M", "25M", "all"), default="all")
    ap.add_argument("--nproc", type=bounded_int(1, 64), default=1, help="processes (default 1)")
    ap.add_argument("-n", dest="steps", type=bounded_int(1, 100000), default=0,
                    help="timed steps (default: 3M 30, 25M 10)")
    ap.add_argument("-w", dest="warmup", type=bounded_int(0, 100000), default=None,
                    help="warm-up steps (default: 3M 5, 25M 3)")
    ap.add_argument("--batch", type=bounded_int(1, 1 << 16), default=64,
                    help="samples per rank (64)")
    ap.add_argument("--threads", type=bounded_int(1, 1024), default=1,
                    help="intra-op threads per process (1)")
    ap.add_argument("--bind", choices=("core", "none"), default="none",
                    help="core: pin rank r to the r-th allowed CPU (default none)")
    ap.add_argument("--timeout", type=bounded_int(1, 86400), default=600,
                    help="seconds before everything is stopped (600)")
    ap.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--store", default=None, help=argparse.SUPPRESS)
    args = sys.argv[1:]
    a = ap.parse_args(args)
    if a.mode == "ddp" and a.nproc < 2:
        ap.error("--mode ddp needs --nproc >= 2")
    if a.worker is not None:
        return worker(a)
    return launch(a, args)


if __name__ == "__main__":
    sys.exit(main())
