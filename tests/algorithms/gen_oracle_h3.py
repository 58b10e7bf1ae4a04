#!/usr/bin/python3
"""Extract what tests/algorithms/test_powersgd.c needs from PyTorch's
recording of powerSGD_hook under DDP (H3_r1.json: PyTorch 1.13, Gloo,
3 ranks x 6 steps, MLP16, matrix_approximation_rank 1,
start_powerSGD_iter 2, min_compression_rate 2, error feedback, warm start,
random_seed 42) into a C header of hex bit patterns. Run by hand when the
recording changes; the header is committed and the test never reads the
JSON:

    /usr/bin/python3 tests/algorithms/gen_oracle_h3.py \
        /work/shared/oracle2/H3_r1.json > tests/algorithms/oracle_h3.h

Only the json module. Per-rank values: the local gradients (the test's
input), and each rank's P and Q before their all_reduce and its error
buffer. Values every rank shares (checked equal here) are written once:
the reduced and orthogonalised P, the Q used and the averaged Q, the
averaged uncompressed values and the gradients. Everything the hook sees is
in bucket order (fc2.bias, fc2.weight, fc1.bias, fc1.weight: the rebuilt
order); local gradients and gradients are in model.parameters() order.
"""
import json
import sys

PARAMS = ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
BUCKET = ["fc2.bias", "fc2.weight", "fc1.bias", "fc1.weight"]
COMPRESSED = ["fc2.weight", "fc1.weight"]  # P/Q memory order (shape groups)


def fail(msg):
    sys.stderr.write("gen_oracle_h3.py: %s\n" % msg)
    sys.exit(1)


def emit(name, rows, comment):
    shape = []
    x = rows
    while isinstance(x, list) and x and isinstance(x[0], list):
        shape.append(len(x))
        x = x[0]
    shape.append(len(x))
    print("/* %s */" % comment)
    print("static const uint32_t %s%s = {" % (name, "".join("[%d]" % d for d in shape)))

    def body(v, depth):
        if isinstance(v[0], list):
            for sub in v:
                print("  " * depth + "{")
                body(sub, depth + 1)
                print("  " * depth + "},")
        else:
            for i in range(0, len(v), 10):
                print("  " * depth + ",".join("0x%08x" % int(h, 16) for h in v[i:i + 10]) + ",")

    body(rows, 1)
    print("};")
    print()


def same(values, what):
    for v in values[1:]:
        if v != values[0]:
            fail("%s differs between ranks" % what)
    return values[0]


def trace(step):
    """The hook's all_reduces and orthogonalisations of one compressed step."""
    ar = [e for e in step["hook_trace"] if e["op"] == "all_reduce"]
    orth = [e for e in step["hook_trace"] if e["op"] == "orthogonalize"]
    if [e["numel"] for e in ar] != [35, 35, 48] or len(orth) != 4:
        fail("step %d: unexpected hook trace" % step["step"])
    return ar, orth


def cat(events, key):
    out = []
    for e in events:
        out.extend(e[key]["hex"])
    return out


def main():
    if len(sys.argv) != 2:
        fail("usage: gen_oracle_h3.py H3_r1.json > oracle_h3.h")
    d = json.load(open(sys.argv[1]))
    spec = d["spec"]
    kw = spec["hook"]["state"]["kwargs"]
    want = {"matrix_approximation_rank": 1, "start_powerSGD_iter": 2, "min_compression_rate": 2,
            "use_error_feedback": True, "warm_start": True, "orthogonalization_epsilon": 0,
            "random_seed": 42, "batch_tensors_with_same_shape": False}
    if spec["world_size"] != 3 or spec["hook"]["name"] != "powerSGD_hook":
        fail("not the H3_r1 scenario")
    for k, v in want.items():
        if kw[k] != v:
            fail("unexpected %s = %r" % (k, kw[k]))
    if [p["name"] for p in spec["params"]] != PARAMS:
        fail("unexpected parameters")
    ranks = d["results"]["per_rank"]
    nsteps = len(ranks[0]["steps"])
    comp = [k for k in range(nsteps) if any(e["op"] == "should_compress"
                                            for e in ranks[0]["steps"][k]["hook_trace"])]
    if comp != list(range(2, nsteps)):
        fail("compressed steps %r" % comp)
    for r in ranks:
        for s in r["steps"][1:]:
            if s["hook_calls"][0]["params"] != BUCKET:
                fail("bucket order %r" % s["hook_calls"][0]["params"])

    def model_order(tensors):
        out = []
        for name in PARAMS:
            out.extend(tensors[name]["hex"])
        return out

    local = [[model_order(s["local_grads"]) for s in r["steps"]] for r in ranks]
    grads = [same([model_order(r["steps"][k]["grads"]) for r in ranks], "grads") for k in range(nsteps)]
    u_in, p_in, q_in, err = [], [], [], []
    u_out, p_out, p_orth, q_used, q_avg = [], [], [], [], []
    for k in comp:
        per = [trace(r["steps"][k]) for r in ranks]
        u_in.append([ar[0]["in"]["hex"] for ar, _ in per])
        p_in.append([ar[1]["in"]["hex"] for ar, _ in per])
        q_in.append([ar[2]["in"]["hex"] for ar, _ in per])
        err.append([r["steps"][k]["psgd_state_after"]["error_dict"]["0"]["hex"] for r in ranks])
        u_out.append(same([ar[0]["out"]["hex"] for ar, _ in per], "uncompressed sum"))
        p_out.append(same([ar[1]["out"]["hex"] for ar, _ in per], "P sum"))
        p_orth.append(same([cat(o[2:4], "out") for _, o in per], "orthogonalised P"))
        q_used.append(same([cat(o[0:2], "out") for _, o in per], "Q used"))
        q_avg.append(same([r["steps"][k]["psgd_state_after"]["q_memory_dict"]["0"]["hex"]
                           for r in ranks], "averaged Q"))
    init_q = d["results"]["summary"]["initial_Q"]
    if [q["tensor"] for q in init_q] != COMPRESSED:
        fail("initial_Q order")

    print("/* tests/algorithms/oracle_h3.h — generated by gen_oracle_h3.py from PyTorch 1.13's")
    print(" * recording H3_r1.json (powerSGD_hook, 3 ranks x 6 steps). Do not edit. */")
    print("#ifndef TDIST_TEST_ORACLE_H3_H")
    print("#define TDIST_TEST_ORACLE_H3_H")
    print("#include <stddef.h>")
    print("#include <stdint.h>")
    print()
    print("#define H3_RANKS %d" % len(ranks))
    print("#define H3_STEPS %d" % nsteps)
    print("#define H3_FIRST_COMPRESSED %d" % comp[0])
    print("#define H3_NCOMP %d" % len(comp))
    print("#define H3_N 643")
    print("#define H3_NPARAMS 4")
    print("#define H3_NU 35 /* uncompressed values: fc2.bias, fc1.bias */")
    print("#define H3_NP 35 /* P: fc2.weight 3x1, fc1.weight 32x1 */")
    print("#define H3_NQ 48 /* Q: fc2.weight 32x1, fc1.weight 16x1 */")
    print('static const char *const h3_names[H3_NPARAMS] = {"fc1.weight", "fc1.bias", '
          '"fc2.weight", "fc2.bias"};')
    print("static const size_t h3_counts[H3_NPARAMS] = {512, 32, 96, 3};")
    print("static const size_t h3_rows[H3_NPARAMS] = {32, 0, 3, 0}; /* shape[0]; 0: 1-D */")
    print()
    emit("h3_raw_q_fc2", init_q[0]["raw_randn"]["hex"], "torch.randn(1, 32, 1): fc2.weight's initial Q")
    emit("h3_raw_q_fc1", init_q[1]["raw_randn"]["hex"], "torch.randn(1, 16, 1): fc1.weight's initial Q")
    emit("h3_local_grads", local, "[rank][step][model order]: the hook's input")
    emit("h3_grads", grads, "[step][model order]: p.grad after the hook (every rank)")
    emit("h3_u_in", u_in, "[compressed step][rank]: uncompressed values before the sum")
    emit("h3_p_in", p_in, "[compressed step][rank]: P before the sum")
    emit("h3_q_in", q_in, "[compressed step][rank]: Q = M^T P before the sum")
    emit("h3_u_out", u_out, "[compressed step]: the uncompressed values summed")
    emit("h3_p_out", p_out, "[compressed step]: P summed")
    emit("h3_p_orth", p_orth, "[compressed step]: P orthogonalised")
    emit("h3_q_used", q_used, "[compressed step]: Q orthogonalised, as used for P = M Q")
    emit("h3_q_avg", q_avg, "[compressed step]: Q summed / 3")
    emit("h3_err", err, "[compressed step][rank]: the error buffer after the step (bucket order)")
    print("#endif /* TDIST_TEST_ORACLE_H3_H */")


if __name__ == "__main__":
    main()
