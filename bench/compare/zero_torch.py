#!/usr/bin/python3
"""bench/compare/zero_torch.py -- the PyTorch side of bench/compare/zero.sh.

The step of bench/zero_step.c in PyTorch 1.13 on Gloo: the same MLPs
(ddp_torch.py's), batch, loss, Adam(lr=1e-3, foreach=False), two modes in
ONE run over one DistributedDataParallel model (default options):

  ddp   DDP + torch.optim.Adam over every parameter on every rank
  zero  DDP + ZeroRedundancyOptimizer(Adam) (PyTorch's partition, the
        parameters broadcast from their owners after each step; Gloo has no
        overlap_with_ddp: PyTorch 1.13 refuses it on anything but NCCL)

After every mode's warm-up, the timed steps go in blocks of --block steps,
one block per mode in turn (the order rotated every round). A step is
zero_grad, forward, cross_entropy, backward, step; time.perf_counter_ns
around it; per step the slowest rank (all_reduce MAX), median over steps.
Also the Adam state bytes per rank (exp_avg + exp_avg_sq) of each, the
largest over ranks.

  /usr/bin/python3 zero_torch.py --nproc 2 [--model 3M|25M|all] [-n N] [-w W]

Output (rank 0): comment lines and RESULT torch_zero_<model>_ddp_adam_ms,
torch_zero_<model>_zero_ms, torch_zero_<model>_step_ratio (zero / ddp),
torch_zero_adam_state_bytes_ratio_<W>r.
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_launch  # noqa: E402
from ddp_torch import MODELS, NBATCHES, CLASSES, build, median  # noqa: E402
from torch_launch import bounded_int  # noqa: E402


def state_bytes(opt, torch):
    n = 0
    for st in opt.state.values():
        for k in ("exp_avg", "exp_avg_sq"):
            if k in st:
                n += st[k].numel() * st[k].element_size()
    return n


def run_model(a, name, rank, n, torch, dist):
    from torch.distributed.optim import ZeroRedundancyOptimizer
    din, hidden, layers, d_steps, d_warm = MODELS[name]
    steps = a.steps if a.steps else d_steps
    warmup = a.warmup if a.warmup is not None else d_warm
    B = a.batch
    torch.manual_seed(1234)
    model = build(torch, din, hidden, layers)
    nparams = sum(p.numel() for p in model.parameters())
    net = torch.nn.parallel.DistributedDataParallel(model)
    opts = [torch.optim.Adam(net.parameters(), lr=1e-3, foreach=False),
            ZeroRedundancyOptimizer(net.parameters(), optimizer_class=torch.optim.Adam,
                                    lr=1e-3, foreach=False)]
    g = torch.Generator().manual_seed(0x5EED0000 + rank * 7919)
    xs = torch.rand(NBATCHES, B, din, generator=g) * 2 - 1
    ys = torch.randint(0, CLASSES, (NBATCHES, B), generator=g)
    loss_fn = torch.nn.functional.cross_entropy
    it = [0]

    def step(k):
        x, y = xs[it[0] % NBATCHES], ys[it[0] % NBATCHES]
        it[0] += 1
        t0 = time.perf_counter_ns()
        opts[k].zero_grad()
        lo = loss_fn(net(x), y)
        lo.backward()
        opts[k].step()
        return (time.perf_counter_ns() - t0) / 1e6

    for k in range(2):
        for _ in range(warmup):
            step(k)
    t = [[0.0] * steps for _ in range(2)]
    done = [0, 0]
    rnd = 0
    while min(done) < steps:  # bounded: every pass adds steps to a mode below `steps`
        for q in range(2):
            k = (q + rnd) % 2
            for _ in range(a.block):
                if done[k] < steps:
                    t[k][done[k]] = step(k)
                    done[k] += 1
        rnd += 1
    tt = torch.tensor(t, dtype=torch.float64)
    dist.all_reduce(tt, op=dist.ReduceOp.MAX)
    t = tt.tolist()
    sb = torch.tensor([float(state_bytes(opts[0], torch)), float(state_bytes(opts[1].optim, torch))],
                      dtype=torch.float64)
    dist.all_reduce(sb, op=dist.ReduceOp.MAX)
    if rank == 0:
        m = [median(t[0]), median(t[1])]
        print("# model %s: %d parameters, batch %d per rank, world %d, %d timed steps per mode, "
              "torch %s, Gloo" % (name, nparams, B, n, steps, torch.__version__))
        print("# ddp  (DDP + Adam)                   median %.3f ms" % m[0])
        print("# zero (DDP + ZeroRedundancyOptimizer) median %.3f ms" % m[1])
        print("# Adam state per rank: ddp %d bytes, zero %d bytes (ratio %.4f)"
              % (sb[0], sb[1], sb[1] / sb[0]))
        print("RESULT torch_zero_%s_ddp_adam_ms %.3f ms" % (name, m[0]))
        print("RESULT torch_zero_%s_zero_ms %.3f ms" % (name, m[1]))
        print("RESULT torch_zero_%s_step_ratio %.4f x" % (name, m[1] / m[0]))
        print("RESULT torch_zero_adam_state_bytes_ratio_%s_%dr %.4f x" % (name, n, sb[1] / sb[0]))
        sys.stdout.flush()
    del net, model, opts


def worker(a):
    import datetime
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    rank, n = a.worker, a.nproc
    store = dist.FileStore(a.store, n)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=n,
                            timeout=datetime.timedelta(seconds=a.timeout))
    for name in (["3M", "25M"] if a.model == "all" else [a.model]):
        run_model(a, name, rank, n, torch, dist)
    dist.barrier()
    dist.destroy_process_group()
    return 0


def main():
    ap = argparse.ArgumentParser(description="DDP + Adam vs ZeroRedundancyOptimizer, PyTorch on Gloo")
    ap.add_argument("--model", choices=("3M", "25M", "all"), default="all")
    ap.add_argument("--nproc", type=bounded_int(2, 64), default=2)
    ap.add_argument("-n", dest="steps", type=bounded_int(1, 100000), default=0)
    ap.add_argument("-w", dest="warmup", type=bounded_int(0, 100000), default=None)
    ap.add_argument("--block", type=bounded_int(1, 1000), default=5)
    ap.add_argument("--batch", type=bounded_int(1, 1 << 16), default=64)
    ap.add_argument("--timeout", type=bounded_int(1, 86400), default=900)
    ap.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--store", default=None, help=argparse.SUPPRESS)
    args = sys.argv[1:]
    a = ap.parse_args(args)
    if a.worker is not None:
        return worker(a)
    return torch_launch.launch(__file__, "zero_torch", a.nproc, a.timeout, args,
                               {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"})


if __name__ == "__main__":
    sys.exit(main())
