#!/usr/bin/python3
"""bench/compare/gpt_torch.py -- the PyTorch side of bench/compare/gpt.sh.

The main job's GPT (examples/train_gpt.c, nn_gpt_t) in PyTorch, with the
same shapes and the same training step as bench/gpt_step.c:

  model    byte vocabulary (256), context T, L pre-LayerNorm blocks of
           causal multi-head attention (c_attn C -> 3C, c_proj C -> C) and a
           4C GELU (tanh) MLP, final LayerNorm, LM head tied to wte
  step     zero_grad, forward, cross_entropy, backward, clip_grad_norm_(1.0),
           AdamW (lr 1e-3, betas 0.9/0.95, weight decay 0.1 on matrices and
           embeddings, 0 on biases and LayerNorm)
  data     random byte tokens, seeded per rank
  modes    local: one process alone; ddp: DistributedDataParallel (default
           options) on "gloo"
  timing   perf_counter around the timed steps on each rank, the slowest
           rank's time (all_reduce MAX); tokens/s = world x B x T x steps / time
  threads  torch.set_num_threads(1), OMP_NUM_THREADS=1, OPENBLAS_NUM_THREADS=1

  /usr/bin/python3 gpt_torch.py --mode ddp --nproc 2 [-n 20] [-w 3]

Rank 0 prints  ROW torch <mode> <world> <tokens_per_s> <ms_per_step> -
"""
import argparse
import datetime
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_launch  # noqa: E402


def build(torch, a):
    nn, F = torch.nn, torch.nn.functional
    C, T, H = a.embd, a.seq, a.heads

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.ln_2 = nn.LayerNorm(C), nn.LayerNorm(C)
            self.c_attn, self.c_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
            self.c_fc, self.mlp_proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)
            self.register_buffer("mask", torch.tril(torch.ones(T, T)).view(1, 1, T, T))

        def forward(self, x):
            B, t, _ = x.shape
            q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
            q, k, v = (z.view(B, t, H, C // H).transpose(1, 2) for z in (q, k, v))
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // H))
            att = F.softmax(att.masked_fill(self.mask[:, :, :t, :t] == 0, float("-inf")), dim=-1)
            y = (att @ v).transpose(1, 2).contiguous().view(B, t, C)
            x = x + self.c_proj(y)
            return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(256, C), nn.Embedding(T, C)
            self.h = nn.ModuleList([Block() for _ in range(a.layers)])
            self.ln_f = nn.LayerNorm(C)

        def forward(self, idx, targets):
            x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
            for b in self.h:
                x = b(x)
            logits = self.ln_f(x) @ self.wte.weight.t()
            return F.cross_entropy(logits.view(-1, 256), targets.view(-1))

    return GPT()


def worker(a):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    torch.manual_seed(1337)
    rank, n = a.worker, a.nproc
    store = dist.FileStore(a.store, n)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=n,
                            timeout=datetime.timedelta(seconds=a.timeout))
    net = build(torch, a)
    decay = [p for name, p in net.named_parameters() if p.dim() >= 2]
    rest = [p for name, p in net.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": rest, "weight_decay": 0.0}], lr=1e-3, betas=(0.9, 0.95))
    model = torch.nn.parallel.DistributedDataParallel(net) if a.mode == "ddp" else net
    g = torch.Generator().manual_seed(1000 + rank)
    t0 = 0.0
    for it in range(a.warmup + a.steps):
        if it == a.warmup:
            t0 = time.perf_counter()
        idx = torch.randint(0, 256, (a.batch, a.seq), generator=g)
        tgt = torch.randint(0, 256, (a.batch, a.seq), generator=g)
        opt.zero_grad(set_to_none=True)
        loss = model(idx, tgt)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        opt.step()
    el = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
    dist.all_reduce(el, op=dist.ReduceOp.MAX)
    el = el.item()
    if rank == 0:
        print("ROW torch %s %d %.1f %.2f -" % (a.mode, n, n * a.batch * a.seq * a.steps / el,
                                               1e3 * el / a.steps), flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0


def main():
    bi = torch_launch.bounded_int
    ap = argparse.ArgumentParser(description="GPT training tokens/s, PyTorch local vs DDP (gloo)")
    ap.add_argument("--mode", choices=("local", "ddp"), required=True)
    ap.add_argument("--nproc", type=bi(1, 64), default=1)
    ap.add_argument("-n", dest="steps", type=bi(1, 100000), default=20)
    ap.add_argument("-w", dest="warmup", type=bi(0, 100000), default=3)
    ap.add_argument("--batch", type=bi(1, 4096), default=8)
    ap.add_argument("--seq", type=bi(2, 4096), default=64)
    ap.add_argument("--layers", type=bi(1, 64), default=4)
    ap.add_argument("--embd", type=bi(1, 8192), default=128)
    ap.add_argument("--heads", type=bi(1, 128), default=4)
    ap.add_argument("--timeout", type=bi(1, 86400), default=600)
    ap.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--store", default=None, help=argparse.SUPPRESS)
    args = sys.argv[1:]
    a = ap.parse_args(args)
    if a.worker is not None:
        return worker(a)
    return torch_launch.launch(__file__, "gpt_torch", a.nproc, a.timeout, args,
                               {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"})


if __name__ == "__main__":
    sys.exit(main())
