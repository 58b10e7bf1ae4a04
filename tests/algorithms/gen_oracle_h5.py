#!/usr/bin/python3
"""Extract what tests/algorithms/test_zero.c needs from PyTorch's recordings
of DDP + ZeroRedundancyOptimizer (H5_sgd_w2.json: 2 ranks x 4 steps, SGD
lr 0.1 momentum 0.9; H5_adam_w3.json: 3 ranks x 4 steps, Adam lr 0.01;
PyTorch 1.13, Gloo, MLP3 = Linear(16,32), ReLU, Linear(32,16), ReLU,
Linear(16,3)) into a C header of hex bit patterns. Run by hand when the
recordings change; the header is committed and the test never reads JSON:

    /usr/bin/python3 tests/algorithms/gen_oracle_h5.py \
        /work/shared/oracle2/H5_sgd_w2.json /work/shared/oracle2/H5_adam_w3.json \
        > tests/algorithms/oracle_h5.h

Only the json module. What must be equal on every rank (the averaged
gradients, the parameters after each step) is checked to be equal here and
written once. Each step's optimizer state is the union of the ranks' local
states (each parameter's state lives on its owner only: checked).
"""
import json
import sys

PARAMS = ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "fc3.weight", "fc3.bias"]


def fail(msg):
    sys.stderr.write("gen_oracle_h5.py: %s\n" % msg)
    sys.exit(1)


def flat(tensors):
    out = []
    for name in PARAMS:
        out.extend(tensors[name]["hex"])
    return out


def emit(name, rows, comment):
    print("/* %s */" % comment)
    print("static const uint32_t %s[%d] = {" % (name, len(rows)))
    for i in range(0, len(rows), 10):
        print(",".join("0x%08x" % int(h, 16) for h in rows[i:i + 10]) + ",")
    print("};")
    print()


def state_slots(kind):
    return ["momentum_buffer"] if kind == "SGD" else ["exp_avg", "exp_avg_sq"]


def scenario(path, prefix, counts):
    d = json.load(open(path))
    spec = d["spec"]
    if spec["kind"] != "zero" or [p["name"] for p in spec["params"]] != PARAMS:
        fail("%s: not a ZeRO scenario over MLP3" % path)
    kind = spec["optimizer"]["type"]
    slots = state_slots(kind)
    world = spec["world_size"]
    ranks = d["results"]["per_rank"]
    nsteps = len(ranks[0]["steps"])
    offs = [sum(counts[:i]) for i in range(len(counts))]
    n = sum(counts)
    init = []
    for p in spec["params"]:
        init.extend(p["init"]["hex"])
    if any(flat(r["params_before_training"]) != init for r in ranks):
        fail("%s: params_before_training is not the spec's init" % path)
    part = d["results"]["summary"]["partition"]
    if any(r["partition"] != part for r in ranks):
        fail("%s: the ranks' partitions differ" % path)
    local, grads, after, state, steps = [], [], [], [], []
    for r in range(world):
        for k in range(nsteps):
            local.extend(flat(ranks[r]["steps"][k]["local_grads"]))
    for k in range(nsteps):
        per = [r["steps"][k] for r in ranks]
        for what in ("grads", "params_after"):
            if any(flat(s[what]) != flat(per[0][what]) for s in per):
                fail("%s step %d: %s differ across ranks" % (path, k, what))
        grads.extend(flat(per[0]["grads"]))
        after.extend(flat(per[0]["params_after"]))
        merged = {s: ["0x00000000"] * n for s in slots}
        step_of = [0] * len(PARAMS)
        for r, s in enumerate(per):
            for name, st in s["local_optimizer_state"].items():
                j = PARAMS.index(name)
                if name not in part[r]:
                    fail("%s step %d: rank %d holds state of %s it does not own" % (path, k, r, name))
                for sl in slots:
                    merged[sl][offs[j]:offs[j] + counts[j]] = st[sl]["hex"]
                step_of[j] = int(st.get("step", k + 1))
        for sl in slots:
            state.extend(merged[sl])
        steps.extend(step_of)
    cons = ranks[0]["consolidated_state_dict"]
    if any(r.get("consolidated_state_dict") is not None for r in ranks[1:]):
        fail("%s: a rank other than 0 has a consolidated state" % path)
    cstate, csteps = [], []
    for sl in slots:
        for j in range(len(PARAMS)):
            cstate.extend(cons["state"][str(j)][sl]["hex"])
    for j in range(len(PARAMS)):
        st = cons["state"][str(j)].get("step", nsteps)  # SGD keeps no step: the run's
        csteps.append(int(float(st["repr"])) if isinstance(st, dict) else int(st))
    if cons["param_groups"][0]["params"] != list(range(len(PARAMS))):
        fail("%s: the consolidated param group is not [0..5]" % path)
    kw = spec["optimizer"]["kwargs"]
    P = prefix.upper()
    print("/* ---- %s: %s, %d ranks x %d steps, %s %s */" % (P, path.split("/")[-1], world, nsteps,
                                                          kind, json.dumps(kw)))
    print("#define %s_WORLD %d" % (P, world))
    print("#define %s_STEPS %d" % (P, nsteps))
    print("#define %s_NSTATE %d" % (P, len(slots)))
    print("#define %s_LR %r" % (P, kw["lr"]))
    print("/* the partition: rank r's parameters in its optimizer's order, -1 padded */")
    print("static const int %s_partition[%d][H5_NPARAMS] = {%s};" % (
        prefix, world, ", ".join("{%s}" % ", ".join([str(PARAMS.index(x)) for x in p] +
                                                    ["-1"] * (len(PARAMS) - len(p))) for p in part)))
    emit(prefix + "_init", init, "parameters before training (every rank)")
    emit(prefix + "_local", local, "[rank][step][H5_N]: each rank's gradients before communication")
    emit(prefix + "_grads", grads, "[step][H5_N]: p.grad after DDP: fl(g * fl(1/W)) summed (every rank)")
    emit(prefix + "_after", after, "[step][H5_N]: parameters after the step and the sync (every rank)")
    emit(prefix + "_state", state, "[step][slot][H5_N]: the owners' optimizer state after each step "
         "(%s)" % ", ".join(slots))
    print("/* [step][param]: the owners' step counts */")
    print("static const int %s_steps[%d] = {%s};" % (prefix, len(steps), ", ".join(map(str, steps))))
    emit(prefix + "_cons", cstate, "[slot][H5_N]: consolidate_state_dict(to=0) on rank 0, state "
         "keyed by the global parameter index")
    print("static const int %s_cons_steps[H5_NPARAMS] = {%s};" % (prefix, ", ".join(map(str, csteps))))
    print()


def main():
    if len(sys.argv) != 3:
        fail("usage: gen_oracle_h5.py H5_sgd_w2.json H5_adam_w3.json > oracle_h5.h")
    d = json.load(open(sys.argv[1]))
    counts = [len(p["init"]["hex"]) for p in d["spec"]["params"]]
    print("/* tests/algorithms/oracle_h5.h — generated by gen_oracle_h5.py from PyTorch")
    print(" * 1.13's recordings of DDP + ZeroRedundancyOptimizer (Gloo, MLP3). Do not")
    print(" * edit: regenerate. f32 values as uint32 bit patterns; arrays of H5_N are")
    print(" * the six parameters concatenated in model.parameters() order. */")
    print("#ifndef TDIST_TEST_ORACLE_H5_H")
    print("#define TDIST_TEST_ORACLE_H5_H")
    print()
    print("#include <stddef.h>")
    print("#include <stdint.h>")
    print()
    print("#define H5_NPARAMS %d" % len(PARAMS))
    print("#define H5_N %d" % sum(counts))
    print("static const char *const h5_names[H5_NPARAMS] = {%s};"
          % ", ".join('"%s"' % p for p in PARAMS))
    print("static const size_t h5_counts[H5_NPARAMS] = {%s};" % ", ".join(map(str, counts)))
    print()
    scenario(sys.argv[1], "h5s", counts)
    scenario(sys.argv[2], "h5a", counts)
    print("#endif /* TDIST_TEST_ORACLE_H5_H */")


main()
