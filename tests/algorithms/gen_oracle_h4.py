#!/usr/bin/python3
"""Extract the comm hook's part of PyTorch's recording of post-local SGD
(H4.json: PyTorch 1.13, Gloo, 4 ranks x 8 steps, MLP16,
post_localSGD_hook with start_localSGD_iter 2 and subgroups {0,1}, {2,3})
into a C header of hex bit patterns for tests/algorithms/test_post_local.c
(the hook) and tests/algorithms/test_averager.c (PostLocalSGDOptimizer:
SGD lr 0.1 momentum 0.9, then PeriodicModelAverager(period 2, warmup 2)):
each rank's local gradients, the gradients after the hook, the hook's
iteration counter, the initial parameters, and per step the parameters
after the local SGD step, the momentum buffers, whether the averager ran
and the parameters after it. Run by hand when the recording changes; the
header is committed:

    /usr/bin/python3 tests/algorithms/gen_oracle_h4.py \
        /work/shared/oracle2/H4.json > tests/algorithms/oracle_h4.h

Only the json module. The gradients after the hook are checked to be
equal on the ranks that averaged together (all four while the counter is
below start_localSGD_iter, each subgroup after) and written once per
subgroup; so are the parameters and momentum buffers, which are equal
inside a subgroup because its ranks start equal and step with equal
gradients.
"""
import json
import sys

PARAMS = ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
RANKS = 4
GROUPS = [[0, 1], [2, 3]]


def fail(msg):
    sys.stderr.write("gen_oracle_h4.py: %s\n" % msg)
    sys.exit(1)


def flat(tensors):
    out = []
    for name in PARAMS:
        out.extend(tensors[name]["hex"])
    return out


def emit(name, dims, rows, comment):
    print("/* %s */" % comment)
    print("static const uint32_t %s[%s] = {" % (name, " * ".join(dims)))
    for i in range(0, len(rows), 10):
        print(",".join("0x%08x" % int(h, 16) for h in rows[i:i + 10]) + ",")
    print("};")
    print()


def check_step(k, per, start, n):
    """The hook's all_reduce group of step k; fails on anything unexpected."""
    for r, s in enumerate(per):
        t = [e for e in s["grad_trace"] if e["op"] == "all_reduce"]
        want = [0, 1, 2, 3] if k < start else GROUPS[r // 2]
        if len(t) != 1 or t[0]["group_ranks"] != want or t[0]["numel"] != n:
            fail("step %d rank %d: expected one all_reduce over %r" % (k, r, want))
        if s["hook_state_iter_after"] != min(k + 1, start):
            fail("step %d rank %d: unexpected state.iter %r" % (k, r, s["hook_state_iter_after"]))


def check_averager(k, per):
    """Whether the averager ran in step k (on every rank alike, over all 4)."""
    ran = [s["averaged"] for s in per]
    if len(set(ran)) != 1:
        fail("step %d: the ranks disagree on averaging" % k)
    for s in per:
        calls = s["average_calls"]
        if ran[0] and (len(calls) != 1 or calls[0]["group_ranks"] != [0, 1, 2, 3]
                       or calls[0]["param_names"] != PARAMS):
            fail("step %d: unexpected averaging call %r" % (k, calls))
        if s["averager_step_after"] != k + 1:
            fail("step %d: averager step %r" % (k, s["averager_step_after"]))
    return "1" if ran[0] else "0"


def main():
    if len(sys.argv) != 2:
        fail("usage: gen_oracle_h4.py H4.json > oracle_h4.h")
    d = json.load(open(sys.argv[1]))
    spec = d["spec"]
    if spec["world_size"] != RANKS or spec["hook"]["name"] != "post_localSGD_hook":
        fail("not the H4 scenario")
    start = spec["start_localSGD_iter"]
    if start != 2 or spec["subgroup_size"] != 2 or not spec["post_local_gradient_allreduce"]:
        fail("unexpected hook options")
    if [p["name"] for p in spec["params"]] != PARAMS:
        fail("unexpected parameters")
    counts = [len(p["init"]["hex"]) for p in spec["params"]]
    n = sum(counts)
    ranks = d["results"]["per_rank"]
    nsteps = len(ranks[0]["steps"])
    local, grads, iters = [[] for _ in range(RANKS)], [], []
    avg, opt = [], {"local": [], "after": [], "mom": []}
    av = spec["averager"]
    if av["type"] != "PeriodicModelAverager" or av["kwargs"] != {"period": 2, "warmup_steps": 2}:
        fail("unexpected averager")
    if spec["optimizer"]["kwargs"]["lr"] != 0.1 or spec["optimizer"]["kwargs"]["momentum"] != 0.9:
        fail("unexpected optimizer")
    init = []
    for p in spec["params"]:
        init.extend(p["init"]["hex"])
    for k in range(nsteps):
        per = [r["steps"][k] for r in ranks]
        check_step(k, per, start, n)
        want = PARAMS if k == 0 else PARAMS[::-1]
        if any(s["hook_calls"][0]["params"] != want for s in per):
            fail("step %d: the bucket is not in %s order" % (k, "parameter" if k == 0 else "reverse"))
        for g in GROUPS:
            same = [0, 1, 2, 3] if k < start else g
            if any(flat(per[r]["grads"]) != flat(per[g[0]]["grads"]) for r in same):
                fail("step %d: the averaged gradients differ inside %r" % (k, same))
            grads.extend(flat(per[g[0]]["grads"]))
        for r in range(RANKS):
            local[r].extend(flat(per[r]["local_grads"]))
        iters.append(str(per[0]["hook_state_iter_after"]))
        avg.append(check_averager(k, per))
        for g in GROUPS:
            for name, key in (("local", "params_after_local_step"), ("after", "params_after"),
                              ("mom", "momentum_buffers")):
                vals = [flat(per[r][key] if per[r][key] is not None else per[r]["params_after"])
                        for r in g]
                if any(v != vals[0] for v in vals):
                    fail("step %d: %s differs inside %r" % (k, key, g))
                opt[name].extend(vals[0])

    print("/* tests/algorithms/oracle_h4.h — generated by gen_oracle_h4.py from")
    print(" * PyTorch 1.13's recording of post-local SGD under DDP (H4.json: Gloo,")
    print(" * 4 ranks x %d steps, MLP16, start_localSGD_iter %d, subgroups {0,1}, {2,3});" % (nsteps, start))
    print(" * the hook, SGD and the averager. Do not edit: regenerate. f32 values as uint32 bit")
    print(" * patterns; arrays of H4_N are fc1.weight, fc1.bias, fc2.weight, fc2.bias")
    print(" * concatenated. */")
    print("#ifndef TDIST_TEST_ORACLE_H4_H")
    print("#define TDIST_TEST_ORACLE_H4_H")
    print()
    print("#include <stddef.h>")
    print("#include <stdint.h>")
    print()
    print("#define H4_RANKS %d" % RANKS)
    print("#define H4_STEPS %d" % nsteps)
    print("#define H4_N %d" % n)
    print("#define H4_NPARAMS %d" % len(PARAMS))
    print("#define H4_START %d /* start_localSGD_iter */" % start)
    print("#define H4_GROUPS %d /* subgroup g holds ranks 2g and 2g + 1 */" % len(GROUPS))
    print()
    print("static const char *const h4_names[H4_NPARAMS] = {%s};"
          % ", ".join('"%s"' % p for p in PARAMS))
    print("static const size_t h4_counts[H4_NPARAMS] = {%s};" % ", ".join(map(str, counts)))
    print("/* the bucket holds the parameters in order in step 0, reversed after */")
    print("/* state.iter after each step's backward */")
    print("static const int h4_iter_after[H4_STEPS] = {%s};" % ", ".join(iters))
    print()
    emit("h4_local_grads", ["H4_RANKS", "H4_STEPS", "H4_N"], sum(local, []),
         "[rank][step]: each rank's own gradients, before communication")
    emit("h4_grads", ["H4_STEPS", "H4_GROUPS", "H4_N"], grads,
         "[step][subgroup]: p.grad after the hook on the subgroup's ranks (before "
         "H4_START: the global average, the same for both)")
    print("/* bits of element i of rank r's local gradients in step k, and of")
    print(" * subgroup g's gradients after the hook in step k */")
    print("#define H4_LOCAL(r, k, i) h4_local_grads[((size_t)(r) * H4_STEPS + (size_t)(k)) * H4_N + (i)]")
    print("#define H4_GRAD(k, g, i) h4_grads[((size_t)(k) * H4_GROUPS + (size_t)(g)) * H4_N + (i)]")
    print()
    print("/* The optimizer and the averager (all arrays in parameter order). */")
    print("static const int h4_averaged[H4_STEPS] = {%s};" % ", ".join(avg))
    emit("h4_init", ["H4_N"], init, "the parameters at the start, on every rank")
    emit("h4_local_params", ["H4_STEPS", "H4_GROUPS", "H4_N"], opt["local"],
         "[step][subgroup]: parameters after the local SGD step (before averaging)")
    emit("h4_params", ["H4_STEPS", "H4_GROUPS", "H4_N"], opt["after"],
         "[step][subgroup]: parameters after the step (after averaging, if it ran)")
    emit("h4_momentum", ["H4_STEPS", "H4_GROUPS", "H4_N"], opt["mom"],
         "[step][subgroup]: SGD's momentum buffers after the step")
    print("#define H4_OPT(a, k, g, i) a[((size_t)(k) * H4_GROUPS + (size_t)(g)) * H4_N + (i)]")
    print()
    print("#endif /* TDIST_TEST_ORACLE_H4_H */")


main()
