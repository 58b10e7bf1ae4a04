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
  hooks    --hook H (ddp): allreduce = no hook (DDP's built-in all_reduce);
           fp16 = fp16_compress_hook; powersgdR = powerSGD_hook with
           PowerSGDState(matrix_approximation_rank=R, start_powerSGD_iter=2,
           min_compression_rate=2, use_error_feedback=True, warm_start=True),
           the warm-up raised to start_powerSGD_iter + 1 if shorter, each
           bucket's future waited for before the next bucket is hooked
           (without that, Gloo fails: see ByteCounter.wrap). Not
           here: bf16 (PyTorch 1.13's Gloo refuses a bf16 all_reduce) and
           int8 (no PyTorch hook). Every hook is wrapped by a counter of the
           bytes it sends, by the same rule as bench/ddp_step.c: a ring
           all_reduce of E elements of S bytes sends 2 (W-1)/W x E x S
           (fp16: the bucket in 2-byte values; powerSGD, once compressing:
           the uncompressed tensors, P and Q, by PowerSGD's own rule
           _should_compress; before: the f32 bucket).
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

(the last four from DDP's own logging data when it has them, else "-";
<mode> is local, ddp, or ddp_<H> with --hook H), with --hook one

  BYTES torch <mode> <model> <world> <hook_bytes_per_iter> <f32_ring_bytes_per_iter>

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
PSGD_START = 2  # start_powerSGD_iter of --hook powersgdR
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


class ByteCounter:
    """Bytes one rank sends per iteration under the hook (ring formula)."""

    def __init__(self, world):
        self.ring = 2.0 * (world - 1) / world
        self.hook = 0.0  # bytes the hook sends, summed over buckets and steps
        self.f32 = 0.0   # a ring all_reduce of the same f32 buckets
        self.prev = None  # powerSGD: the previous bucket's future (see wrap)

    def wrap(self, kind, rank_r, hook):
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as ps

        def counted(state, bucket):
            numel = bucket.buffer().numel()
            self.f32 += self.ring * 4 * numel
            if kind == "fp16":
                self.hook += self.ring * 2 * numel
            elif kind == "powersgd" and state.iter >= state.start_powerSGD_iter:
                elems = 0  # uncompressed tensors, P and Q: f32 all_reduces
                for t in bucket.gradients():
                    mat = t.view(t.shape[0], -1)
                    nr, nc = mat.shape
                    r = min(nr, nc, rank_r)
                    if ps._should_compress(nr, nc, r, state.min_compression_rate)[0]:
                        elems += (nr + nc) * r
                    else:
                        elems += t.numel()
                self.hook += self.ring * 4 * elems
            else:  # plain all_reduce (also powerSGD before start_powerSGD_iter)
                self.hook += self.ring * 4 * numel
            if kind == "powersgd":
                # powerSGD_hook chains its all_reduces (uncompressed, P, Q)
                # in future callbacks that Gloo runs on its own threads: with
                # several buckets in flight, the ranks issue them in
                # different orders and Gloo fails ("op.preamble.length <=
                # op.nbytes"). Ordered: a bucket's chain completes before
                # the next bucket is hooked (it still overlaps the backward
                # compute until then).
                if self.prev is not None:
                    self.prev.wait()
                self.prev = hook(state, bucket)
                return self.prev
            return hook(state, bucket)
        return counted


def register_hook(a, net, n, torch):
    """Register --hook on the DDP module; returns the byte counter or None."""
    if a.hook == "allreduce":
        return None
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook as ps
    bc = ByteCounter(n)
    if a.hook == "fp16":
        net.register_comm_hook(None, bc.wrap("fp16", 0, default_hooks.fp16_compress_hook))
    else:
        r = int(a.hook[len("powersgd"):])
        state = ps.PowerSGDState(process_group=None, matrix_approximation_rank=r,
                                 start_powerSGD_iter=PSGD_START, min_compression_rate=2,
                                 use_error_feedback=True, warm_start=True, random_seed=0)
        net.register_comm_hook(state, bc.wrap("powersgd", r, ps.powerSGD_hook))
    return bc


def run_model(a, name, rank, n, torch, dist):
    din, hidden, layers, d_steps, d_warm = MODELS[name]
    steps = a.steps if a.steps else d_steps
    warmup = a.warmup if a.warmup is not None else d_warm
    B = a.batch
    torch.manual_seed(1234)  # equal on every rank (DDP also broadcasts from rank 0)
    model = build(torch, din, hidden, layers)
    nparams = sum(p.numel() for p in model.parameters())
    net = model
    bc = None
    hook = a.hook if a.mode == "ddp" else None
    if hook and hook.startswith("powersgd") and warmup < PSGD_START + 1:
        if rank == 0:
            print("# powersgd: warm-up raised from %d to %d steps (start_powerSGD_iter %d + 1)"
                  % (warmup, PSGD_START + 1, PSGD_START))
        warmup = PSGD_START + 1
    if a.mode == "ddp":
        net = torch.nn.parallel.DistributedDataParallel(model)
        if hook:
            bc = register_hook(a, net, n, torch)
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
        if it == warmup - 1 and bc is not None:
            b0 = (bc.hook, bc.f32)  # the counts before the first timed step
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
    if bc is not None:
        bc.prev = None  # every future has completed (backward waited for them)
    hb = None
    if hook:
        if bc is None:  # built-in all_reduce: every parameter once per iteration
            f32 = 2.0 * (n - 1) / n * 4 * nparams
            hb = [f32, f32]
        else:
            h0, f0 = b0 if warmup > 0 else (0.0, 0.0)
            hb = [(bc.hook - h0) / steps, (bc.f32 - f0) / steps]
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
        mode = a.mode + ("_" + hook if hook else "")
        print("ROW torch %s %s %d %.4f %.4f %.4f %s" % (mode, name, n, med, mn, mx, ov))
        tag = "local" if (a.mode == "local" and n == 1) else "%s%d" % (a.mode, n)
        if hook:
            tag += "_" + hook
            print("# comm hook %s: %.4f MB sent per iteration by each rank, %.4f of a ring "
                  "all_reduce of the f32 buckets (%.4f MB)" % (
                      hook, hb[0] * 1e-6, hb[0] / hb[1] if hb[1] else 0.0, hb[1] * 1e-6))
            print("BYTES torch %s %s %d %.1f %.1f" % (mode, name, n, hb[0], hb[1]))
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
        dist.barrier()  # no rank tears Gloo down while another still talks to it
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
    ap.add_argument("--hook", choices=("allreduce", "fp16", "powersgd1", "powersgd2",
                                       "powersgd4", "powersgd8"), default=None,
                    help="(ddp) comm hook: allreduce (none: DDP's built-in), fp16 "
                         "(fp16_compress_hook), powersgdR (powerSGD_hook, rank R); "
                         "bf16 and int8 are not available (see the module doc)")
    ap.add_argument("--timeout", type=bounded_int(1, 86400), default=600,
                    help="seconds before everything is stopped (600)")
    ap.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--store", default=None, help=argparse.SUPPRESS)
    args = sys.argv[1:]
    a = ap.parse_args(args)
    if a.mode == "ddp" and a.nproc < 2:
        ap.error("--mode ddp needs --nproc >= 2")
    if a.hook and a.mode != "ddp":
        ap.error("--hook needs --mode ddp")
    if a.worker is not None:
        return worker(a)
    return launch(a, args)


if __name__ == "__main__":
    sys.exit(main())
