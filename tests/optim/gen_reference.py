#!/usr/bin/python3
"""Generate tests/optim/reference_values.h: parameters after torch.optim steps.

Run with Debian's python3-torch (not needed by the test suite itself):

    /usr/bin/python3 tests/optim/gen_reference.py > tests/optim/reference_values.h

Each case runs one torch optimizer (CPU, float32, foreach=False: the
single-tensor code path) over two parameters of OPTIM_REF_N0 and
OPTIM_REF_N1 elements for OPTIM_REF_STEPS steps and records the final
parameters as float32 bit patterns. Parameters and gradients come from
closed formulas, each value rounded once to float32, which
tests/optim/test_optim_reference.c recomputes (the same libm sin and cos):

    param0[b][i]  = f32(((i odd ? -1 : 1) * (2 + 0.25 * (i % 8) + 0.5 * b) + 0.1 * sin(3i + b)) / 64)
    grad[t][b][i] = f32((((5*i + 3*t + 7*b) % 13) - 6) / 8 + 0.0625 * t + 0.05 * cos(7i + 5t + b))
                                                                     (t = 1..STEPS)

The values are not short binary fractions, so every rounding shows: a
fused multiply-add where PyTorch rounds twice (or the reverse) changes
bits, and the test compares bits. The parameters are small (about the
size of a few Adam updates), so an ulp of exp_avg or exp_avg_sq reaches
the parameters' bits too.

A case with lr_change_step = k > 0 sets the learning rate to lr_new just
before step k (what a scheduler does).
"""
import math
import struct
import sys

import torch

STEPS = 8
SIZES = (7, 61)

SGD, ADAM, ADAMW = 1, 2, 3  # tdist_optim_kind_t

# name, kind, options, (lr_change_step, lr_new)
CASES = [
    ("sgd_plain", SGD, dict(lr=0.05), (0, 0.0)),
    ("sgd_weight_decay", SGD, dict(lr=0.05, weight_decay=0.1), (0, 0.0)),
    ("sgd_momentum", SGD, dict(lr=0.05, momentum=0.9), (0, 0.0)),
    ("sgd_dampening", SGD, dict(lr=0.05, momentum=0.9, dampening=0.3), (0, 0.0)),
    ("sgd_nesterov", SGD, dict(lr=0.05, momentum=0.9, nesterov=True), (0, 0.0)),
    ("sgd_nesterov_wd", SGD, dict(lr=0.04, momentum=0.8, nesterov=True, weight_decay=0.05), (0, 0.0)),
    ("sgd_momentum_wd_damp", SGD, dict(lr=0.03, momentum=0.7, dampening=0.5, weight_decay=0.02), (0, 0.0)),
    ("sgd_maximize", SGD, dict(lr=0.05, momentum=0.5, maximize=True), (0, 0.0)),
    ("sgd_nesterov_wd_maximize", SGD, dict(lr=0.07, momentum=0.6, nesterov=True, weight_decay=0.3, maximize=True), (0, 0.0)),
    ("sgd_wd_only", SGD, dict(lr=0.03, weight_decay=0.7), (0, 0.0)),
    ("sgd_lr_change", SGD, dict(lr=0.05, momentum=0.9), (3, 0.01)),
    ("adam_default", ADAM, dict(), (0, 0.0)),
    ("adam", ADAM, dict(lr=0.01), (0, 0.0)),
    ("adam_weight_decay", ADAM, dict(lr=0.01, weight_decay=0.1), (0, 0.0)),
    ("adam_betas_eps", ADAM, dict(lr=0.02, betas=(0.8, 0.95), eps=1e-3), (0, 0.0)),
    ("adam_amsgrad", ADAM, dict(lr=0.01, betas=(0.8, 0.99), amsgrad=True), (0, 0.0)),
    ("adam_amsgrad_wd", ADAM, dict(lr=0.01, betas=(0.7, 0.9), weight_decay=0.05, amsgrad=True), (0, 0.0)),
    ("adam_maximize", ADAM, dict(lr=0.01, maximize=True), (0, 0.0)),
    ("adam_wd_maximize_amsgrad", ADAM, dict(lr=0.03, weight_decay=0.2, maximize=True, amsgrad=True), (0, 0.0)),
    ("adam_lr_change", ADAM, dict(lr=0.01), (4, 0.003)),
    ("adamw_default", ADAMW, dict(), (0, 0.0)),
    ("adamw", ADAMW, dict(lr=0.01, weight_decay=0.1), (0, 0.0)),
    ("adamw_amsgrad", ADAMW, dict(lr=0.01, betas=(0.8, 0.99), weight_decay=0.2, amsgrad=True), (0, 0.0)),
    ("adamw_maximize", ADAMW, dict(lr=0.01, weight_decay=0.1, maximize=True), (0, 0.0)),
    ("adamw_lr_change", ADAMW, dict(lr=0.02, weight_decay=0.3), (2, 0.005)),
]


def param0(b, n):
    return [((-1.0 if i % 2 else 1.0) * (2.0 + 0.25 * (i % 8) + 0.5 * b) + 0.1 * math.sin(3 * i + b)) / 64.0
            for i in range(n)]


def grad(t, b, n):
    return [(((5 * i + 3 * t + 7 * b) % 13) - 6) / 8.0 + 0.0625 * t + 0.05 * math.cos(7 * i + 5 * t + b)
            for i in range(n)]


def run(kind, opts, lr_change):
    params = [torch.tensor(param0(b, n), dtype=torch.float32, requires_grad=True)
              for b, n in enumerate(SIZES)]
    if kind == SGD:
        opt = torch.optim.SGD(params, foreach=False, **opts)
    elif kind == ADAM:
        opt = torch.optim.Adam(params, foreach=False, **opts)
    else:
        opt = torch.optim.AdamW(params, foreach=False, **opts)
    for t in range(1, STEPS + 1):
        if lr_change[0] == t:
            for group in opt.param_groups:
                group["lr"] = lr_change[1]
        for b, (p, n) in enumerate(zip(params, SIZES)):
            p.grad = torch.tensor(grad(t, b, n), dtype=torch.float32)
        opt.step()
    return [p.detach().tolist() for p in params]


def full_opts(kind, opts):
    """Every hyperparameter, with torch's defaults filled in."""
    if kind == SGD:
        d = dict(lr=None, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False, maximize=False)
    else:
        d = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
                 weight_decay=0.0 if kind == ADAM else 1e-2, amsgrad=False, maximize=False)
    d.update(opts)
    return d


def c_bits(values):
    bits = [struct.unpack("<I", struct.pack("<f", v))[0] for v in values]
    return "{" + ", ".join("0x%08x" % b for b in bits) + "}"


def main():
    out = sys.stdout
    out.write("/*\n")
    out.write(" * tests/optim/reference_values.h — GENERATED, do not edit.\n")
    out.write(" *\n")
    out.write(" * Parameters after %d steps of torch.optim (PyTorch %s, CPU, float32,\n" % (STEPS, torch.__version__))
    out.write(" * foreach=False), written by\n")
    out.write(" *     /usr/bin/python3 tests/optim/gen_reference.py > tests/optim/reference_values.h\n")
    out.write(" * See that script for the parameter and gradient formulas.\n")
    out.write(" */\n")
    out.write("#ifndef TDIST_TESTS_OPTIM_REFERENCE_VALUES_H\n#define TDIST_TESTS_OPTIM_REFERENCE_VALUES_H\n\n#include <stdint.h>\n\n")
    out.write("#define OPTIM_REF_STEPS %d\n#define OPTIM_REF_N0 %d\n#define OPTIM_REF_N1 %d\n\n" % ((STEPS,) + SIZES))
    out.write("typedef struct optim_ref_case {\n")
    out.write("    const char *name;\n")
    out.write("    int kind; /* tdist_optim_kind_t */\n")
    out.write("    double lr, momentum, dampening, weight_decay, beta1, beta2, eps;\n")
    out.write("    int nesterov, amsgrad, maximize;\n")
    out.write("    int lr_change_step; /* before this step (1-based) lr becomes lr_new; 0: never */\n")
    out.write("    double lr_new;\n")
    out.write("    uint32_t want0[OPTIM_REF_N0]; /* float32 bit patterns */\n")
    out.write("    uint32_t want1[OPTIM_REF_N1];\n")
    out.write("} optim_ref_case_t;\n\n")
    out.write("static const optim_ref_case_t optim_ref_cases[] = {\n")
    for name, kind, opts, lr_change in CASES:
        o = full_opts(kind, opts)
        p = run(kind, opts, lr_change)
        if kind == SGD:
            hyper = (o["lr"], o["momentum"], o["dampening"], o["weight_decay"], 0.0, 0.0, 0.0)
            flags = (int(o["nesterov"]), 0, int(o["maximize"]))
        else:
            hyper = (o["lr"], 0.0, 0.0, o["weight_decay"], o["betas"][0], o["betas"][1], o["eps"])
            flags = (0, int(o["amsgrad"]), int(o["maximize"]))
        out.write("    {\"%s\", %d,\n" % (name, kind))
        out.write("     %s,\n" % ", ".join(repr(float(h)) for h in hyper))
        out.write("     %d, %d, %d, %d, %r,\n" % (flags + (lr_change[0], float(lr_change[1]))))
        out.write("     %s,\n" % c_bits(p[0]))
        out.write("     %s},\n" % c_bits(p[1]))
    out.write("};\n\n#endif /* TDIST_TESTS_OPTIM_REFERENCE_VALUES_H */\n")


if __name__ == "__main__":
    main()
