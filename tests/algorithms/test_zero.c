/*
 * tests/algorithms/test_zero.c — ZeRO (tdist_zero_* in tdist/algorithms.h),
 * every multi-rank test as real processes.
 *
 * 1. Against PyTorch (oracle_h5.h, from DDP + ZeroRedundancyOptimizer):
 *    - H5_sgd_w2 (2 ranks x 4 steps, SGD lr 0.1 momentum 0.9): the
 *      partition, DDP's averaged gradients, the parameters after every
 *      step and the consolidated state after every step, BIT FOR BIT; with
 *      the default options, with parameters_as_bucket_view, with the
 *      all_gather sync and with the FLAT partition (the same numbers, not
 *      the same partition).
 *    - H5_adam_w3 (3 ranks x 4 steps, Adam lr 0.01): DDP's averages to
 *      rounding (Gloo's ring sums in its own order); then, fed PyTorch's
 *      averaged gradients, the parameters and state after every step and
 *      the consolidation bit for bit.
 * 2. Join with uneven inputs (2 ranks, 3 and 5 batches; BY_PARAMS with the
 *    broadcast sync, which switches to all_gather once a rank has joined,
 *    and FLAT): every rank ends with the parameters of a single-process
 *    replay (joined ranks contribute zeros), bit for bit; 3 ranks with 2, 4
 *    and 3 batches (rank 0 joins first): equal on every rank, a replay's to
 *    rounding. (Adam with BY_PARAMS, AdamW with FLAT; SGD with Nesterov and
 *    weight decay, FLAT, without Join: bit for bit too.)
 * 3. Bad input: optimizer kind and parameter shape mismatches fail on every
 *    rank with a message naming them.
 * 4. Checkpoints: shards saved at 2 ranks (BY_PARAMS) load at 3 ranks (FLAT)
 *    and the run continues bit for bit as one that never stopped; loading
 *    another model's shards names the first differing parameter.
 * 5. Overlap with DDP: the comm hook (several buckets; per bucket the
 *    slices reduced to their owners, stepped, broadcast back; in parts of
 *    11 elements at 2 ranks, whole slices at 3; under Join, once a rank has
 *    joined, reduce_scatter + all_gather) equals DDP + a whole-model
 *    optimizer bit for bit at 2 ranks, also under Join; to rounding at 3.
 * 6. State bytes: the shards' state adds up to the whole model's.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "oracle_h5.h"
#include "tdist/algorithms.h"
#include "tdist/join.h"
#include "tdist/optim.h"

static uint32_t bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static void open_pg(tdist_world_t **w, tdist_pg_t **pg)
{
    tdist_test_open_world(w, pg, (int64_t)(20000 * tdist_test_timeout_mult()));
}

static size_t h5_off(size_t j)
{
    size_t at = 0;
    for (size_t i = 0; i < j; i++) at += h5_counts[i];
    return at;
}

/* The MLP3 of the references: parameters, gradients, their optim view. */
typedef struct model {
    float p[H5_N], g[H5_N];
    tdist_optim_param_t op[H5_NPARAMS];
} model_t;

static void model_init(model_t *m, const uint32_t *init)
{
    for (size_t i = 0; i < H5_N; i++) m->p[i] = f32(init[i]), m->g[i] = 0.0f;
    for (size_t j = 0; j < H5_NPARAMS; j++)
        m->op[j] = (tdist_optim_param_t){m->p + h5_off(j), m->g + h5_off(j), h5_counts[j], h5_names[j]};
}

static tdist_ddp_t *make_ddp(tdist_pg_t *pg, tdist_zero_t *z, model_t *m, size_t cap_bytes)
{
    tdist_ddp_param_t dp[H5_NPARAMS];
    for (size_t j = 0; j < H5_NPARAMS; j++)
        dp[j] = (tdist_ddp_param_t){z ? tdist_zero_param_ptr(z, j) : m->op[j].param,
                                    m->g + h5_off(j), h5_counts[j], TDIST_F32, h5_names[j]};
    tdist_ddp_opts_t o;
    tdist_ddp_opts_init(&o);
    if (cap_bytes) o.bucket_cap_bytes = o.first_bucket_bytes = cap_bytes;
    tdist_ddp_t *ddp = NULL;
    ASSERT_OK(tdist_ddp_create(pg, dp, H5_NPARAMS, NULL, 0, &o, &ddp));
    return ddp;
}

/* Gradients in, every grad_ready (reverse order), backward_end. */
static void ddp_iteration(tdist_ddp_t *ddp, model_t *m, const float *grads)
{
    ASSERT_OK(tdist_ddp_forward_begin(ddp));
    memcpy(m->g, grads, sizeof m->g);
    for (size_t j = H5_NPARAMS; j-- > 0;) ASSERT_OK(tdist_ddp_grad_ready(ddp, j));
    ASSERT_OK(tdist_ddp_backward_end(ddp));
}

/* ==================================================== 1. against PyTorch */

typedef struct h5_case {
    const char *name;
    int world, steps, nstate, adam;
    double lr;
    const int (*partition)[H5_NPARAMS];
    const uint32_t *init, *local, *grads, *after, *state, *cons;
    const int *steps_of, *cons_steps;
} h5_case_t;

static const h5_case_t h5s = {"H5_sgd_w2", H5S_WORLD, H5S_STEPS, H5S_NSTATE, 0, H5S_LR,
                              h5s_partition, h5s_init, h5s_local, h5s_grads, h5s_after,
                              h5s_state, h5s_cons, h5s_steps, h5s_cons_steps};
static const h5_case_t h5a = {"H5_adam_w3", H5A_WORLD, H5A_STEPS, H5A_NSTATE, 1, H5A_LR,
                              h5a_partition, h5a_init, h5a_local, h5a_grads, h5a_after,
                              h5a_state, h5a_cons, h5a_steps, h5a_cons_steps};

typedef struct h5_variant {
    const h5_case_t *c;
    tdist_zero_partition_t partition;
    tdist_zero_sync_t sync;
    bool view;
} h5_variant_t;

static tdist_zero_t *h5_zero(tdist_pg_t *pg, const h5_variant_t *v, model_t *m)
{
    tdist_zero_opts_t o;
    tdist_zero_opts_init(&o);
    if (v->c->adam) {
        o.kind = TDIST_OPTIM_ADAM;
        o.adam.lr = v->c->lr;
    } else {
        o.sgd.lr = v->c->lr;
        o.sgd.momentum = 0.9;
    }
    o.partition = v->partition;
    o.sync = v->sync;
    o.parameters_as_bucket_view = v->view;
    tdist_zero_t *z = NULL;
    ASSERT_OK(tdist_zero_create(pg, m->op, H5_NPARAMS, &o, &z));
    return z;
}

static void h5_check_partition(const h5_variant_t *v, tdist_zero_t *z)
{
    if (v->partition != TDIST_ZERO_BY_PARAMS) return;
    for (int r = 0; r < v->c->world; r++) {
        size_t got[H5_NPARAMS];
        size_t np = tdist_zero_rank_params(z, r, got, H5_NPARAMS);
        for (size_t k = 0; k < H5_NPARAMS; k++) {
            int want = v->c->partition[r][k];
            if (want < 0) {
                ASSERT_EQ(np, k);
                break;
            }
            if (k >= np || (int)got[k] != want)
                FAIL("%s: rank %d's partition entry %zu: %d, PyTorch %d", v->c->name, r, k,
                     k < np ? (int)got[k] : -1, want);
        }
    }
}

/* The checks every variant shares, against the bits of a reference
 * (PyTorch's recording or a single-process replay), named `what`. */

/* z's parameters (the caller's model without z) against want (H5_N). */
static void expect_param_bits(const char *what, tdist_zero_t *z, const model_t *m,
                              const uint32_t *want)
{
    for (size_t j = 0; j < H5_NPARAMS; j++) {
        const float *p = z ? tdist_zero_param_ptr(z, j) : m->op[j].param;
        for (size_t e = 0; e < h5_counts[j]; e++)
            if (bits(p[e]) != want[h5_off(j) + e])
                FAIL("%s: %s[%zu] 0x%08x, reference 0x%08x", what, h5_names[j], e, bits(p[e]),
                     want[h5_off(j) + e]);
    }
}

/* On rank 0 after tdist_zero_consolidate_state_dict(z, 0): the whole state
 * against want (slot-major, H5_N each) and the step counts. */
static void expect_state_bits(const char *what, tdist_zero_t *z, int nstate, const uint32_t *want,
                              const uint64_t *want_steps)
{
    for (int s = 0; s < nstate; s++)
        for (size_t j = 0; j < H5_NPARAMS; j++) {
            const float *data = NULL;
            uint64_t steps = 0;
            ASSERT_OK(tdist_zero_consolidated_state(z, j, s, &data, &steps));
            ASSERT_EQ(steps, want_steps[j]);
            for (size_t e = 0; e < h5_counts[j]; e++) {
                uint32_t w = want[(size_t)s * H5_N + h5_off(j) + e];
                if (bits(data[e]) != w)
                    FAIL("%s: state slot %d of %s[%zu]: 0x%08x, reference 0x%08x", what, s,
                         h5_names[j], e, bits(data[e]), w);
            }
        }
}

/* A recording's state after step k against z's (rank 0, consolidated). */
static void h5_check_state(const h5_case_t *c, tdist_zero_t *z, int k, const uint32_t *want,
                           const int *want_steps)
{
    char what[64];
    snprintf(what, sizeof what, "%s step %d", c->name, k);
    uint64_t steps[H5_NPARAMS];
    for (size_t j = 0; j < H5_NPARAMS; j++) steps[j] = (uint64_t)want_steps[j];
    expect_state_bits(what, z, c->nstate, want, steps);
}

static void h5_check_grads(const h5_case_t *c, int k, const float *g)
{
    for (size_t i = 0; i < H5_N; i++) {
        float want = f32(c->grads[(size_t)k * H5_N + i]);
        if (c->world == 2) {
            if (bits(g[i]) != bits(want))
                FAIL("%s step %d grad %zu: 0x%08x, PyTorch 0x%08x", c->name, k, i, bits(g[i]),
                     bits(want));
            continue;
        }
        double scale = 0; /* the sum's rounding: a few ulp of its largest term */
        for (int r = 0; r < c->world; r++)
            scale += fabs(f32(c->local[((size_t)r * (size_t)c->steps + (size_t)k) * H5_N + i]) / c->world);
        if (fabs((double)g[i] - want) > 4 * 6e-8 * scale)
            FAIL("%s step %d grad %zu: %.9g, PyTorch %.9g", c->name, k, i, g[i], want);
    }
}

static void h5_body(int rank, int n, void *arg)
{
    const h5_variant_t *v = arg;
    const h5_case_t *c = v->c;
    ASSERT_EQ(n, c->world);
    static model_t m;
    model_init(&m, c->init);
    tdist_world_t *w;
    tdist_pg_t *pg;
    open_pg(&w, &pg);
    tdist_zero_t *z = h5_zero(pg, v, &m);
    tdist_ddp_t *ddp = make_ddp(pg, z, &m, 0);
    h5_check_partition(v, z);
    static float local[H5_N];
    for (int k = 0; k < c->steps; k++) {
        for (size_t i = 0; i < H5_N; i++)
            local[i] = f32(c->local[((size_t)rank * (size_t)c->steps + (size_t)k) * H5_N + i]);
        ddp_iteration(ddp, &m, local);
        h5_check_grads(c, k, m.g);
        /* downstream of the average, from PyTorch's own average */
        for (size_t i = 0; i < H5_N; i++) m.g[i] = f32(c->grads[(size_t)k * H5_N + i]);
        ASSERT_OK(tdist_zero_step(z));
        char what[64];
        snprintf(what, sizeof what, "%s step %d (reference: PyTorch)", c->name, k);
        expect_param_bits(what, z, &m, c->after + (size_t)k * H5_N);
        ASSERT_OK(tdist_zero_consolidate_state_dict(z, 0));
        if (rank == 0) h5_check_state(c, z, k, c->state + (size_t)k * (size_t)c->nstate * H5_N,
                                      c->steps_of + (size_t)k * H5_NPARAMS);
    }
    if (rank == 0) h5_check_state(c, z, c->steps - 1, c->cons, c->cons_steps);
    else ASSERT_STATUS(tdist_zero_consolidated_state(z, 0, 0, NULL, NULL), TDIST_ERR_INVALID_ARG);
    tdist_ddp_destroy(ddp);
    tdist_zero_destroy(z);
    tdist_pg_destroy(pg);
    tdist_world_destroy(w);
}

static void h5_run(const h5_case_t *c, tdist_zero_partition_t part, tdist_zero_sync_t sync,
                   bool view)
{
    h5_variant_t v = {c, part, sync, view};
    tdist_test_run_ranks(c->world, h5_body, &v);
}

#define BY_PARAMS TDIST_ZERO_BY_PARAMS
#define FLAT TDIST_ZERO_FLAT
#define AUTO TDIST_ZERO_SYNC_AUTO
TEST(zero_pytorch_h5_sgd_2_ranks, 90) { h5_run(&h5s, BY_PARAMS, AUTO, false); }
TEST(zero_pytorch_h5_sgd_2_ranks_bucket_view, 90) { h5_run(&h5s, BY_PARAMS, AUTO, true); }
TEST(zero_pytorch_h5_sgd_2_ranks_all_gather, 90)
{
    h5_run(&h5s, BY_PARAMS, TDIST_ZERO_SYNC_ALL_GATHER, false);
}
TEST(zero_pytorch_h5_sgd_2_ranks_flat, 90) { h5_run(&h5s, FLAT, AUTO, true); }
TEST(zero_pytorch_h5_adam_3_ranks, 90) { h5_run(&h5a, BY_PARAMS, AUTO, false); }
TEST(zero_pytorch_h5_adam_3_ranks_flat_view, 90) { h5_run(&h5a, FLAT, AUTO, true); }

/* ======================================= synthetic runs and their replay */

/* Rank r's gradient in iteration k (not short binary fractions). */
static float synth_grad(int r, int k, size_t i)
{
    return (float)(0.02 * sin(0.37 * (double)i + 1.3 * r + 0.71 * k) + 0.001 * r);
}

static void synth_grads(float *g, int r, int k)
{
    for (size_t i = 0; i < H5_N; i++) g[i] = synth_grad(r, k, i);
}

static void adam_opts(tdist_zero_opts_t *o)
{
    tdist_zero_opts_init(o);
    o->kind = TDIST_OPTIM_ADAM;
    o->adam.lr = 0.01;
    o->adam.weight_decay = 0.01;
}

/* A rank's start of most tests: the model, the group, Adam's options. */
static void adam_setup(model_t *m, tdist_world_t **w, tdist_pg_t **pg, tdist_zero_opts_t *o)
{
    model_init(m, h5a_init);
    open_pg(w, pg);
    adam_opts(o);
}

/* The single-process replay: a whole-model optimizer (z's options) stepped
 * with DDP's average of the ranks active in each iteration (2 ranks, so
 * one order: fl(g0 * 0.5) + fl(g1 * 0.5); a joined rank gives 0). */
static void replay_keep(model_t *ref, const tdist_zero_opts_t *o, const int *batches, int world,
                        int iters, tdist_optim_t **keep)
{
    model_init(ref, h5a_init);
    tdist_optim_t *opt = NULL;
    if (o->kind == TDIST_OPTIM_SGD)
        ASSERT_OK(tdist_optim_create_sgd(ref->op, H5_NPARAMS, &o->sgd, &opt));
    else if (o->kind == TDIST_OPTIM_ADAMW)
        ASSERT_OK(tdist_optim_create_adamw(ref->op, H5_NPARAMS, &o->adam, &opt));
    else
        ASSERT_OK(tdist_optim_create_adam(ref->op, H5_NPARAMS, &o->adam, &opt));
    ASSERT_EQ(world, 2);
    for (int k = 0; k < iters; k++) {
        for (size_t i = 0; i < H5_N; i++) {
            float a = batches[0] > k ? synth_grad(0, k, i) * 0.5f : 0.0f;
            float b = batches[1] > k ? synth_grad(1, k, i) * 0.5f : 0.0f;
            ref->g[i] = a + b;
        }
        ASSERT_OK(tdist_optim_step(opt));
    }
    if (keep) *keep = opt;
    else tdist_optim_destroy(opt);
}

static void replay(model_t *ref, const tdist_zero_opts_t *o, const int *batches, int world,
                   int iters)
{
    replay_keep(ref, o, batches, world, iters, NULL);
}

/* After tdist_zero_consolidate_state_dict(z, 0), on rank 0: the whole state
 * equals the replay optimizer's, bit for bit. */
static void expect_state(const char *what, tdist_zero_t *z, tdist_optim_t *ref)
{
    static uint32_t want[2 * H5_N];
    uint64_t steps[H5_NPARAMS];
    for (size_t j = 0; j < H5_NPARAMS; j++) {
        ASSERT_OK(tdist_optim_step_count(ref, j, &steps[j]));
        for (int s = 0; s < 2; s++) {
            float *v = NULL;
            ASSERT_OK(tdist_optim_state_ptr(ref, j, s, &v));
            for (size_t e = 0; e < h5_counts[j]; e++)
                want[(size_t)s * H5_N + h5_off(j) + e] = bits(v[e]);
        }
    }
    expect_state_bits(what, z, 2, want, steps);
}

/* z's parameters against the replay's, bit for bit. */
static void expect_params(const char *what, tdist_zero_t *z, const model_t *ref)
{
    static uint32_t want[H5_N];
    for (size_t i = 0; i < H5_N; i++) want[i] = bits(ref->p[i]);
    expect_param_bits(what, z, ref, want);
}

/* One rank's synthetic run: group, ZeRO (options o), DDP (bucket cap,
 * 0: default; overlap: ZeRO's hook registered), `iters` iterations of
 * rank's synthetic gradients, each followed by tdist_zero_step, inside a
 * Join {ddp, zero} when join. */
typedef struct zrun {
    tdist_world_t *w;
    tdist_pg_t *pg;
    tdist_zero_t *z;
    tdist_ddp_t *ddp;
} zrun_t;

static void zrun_open(zrun_t *r, model_t *m, const tdist_zero_opts_t *o, size_t cap, bool overlap)
{
    model_init(m, h5a_init);
    open_pg(&r->w, &r->pg);
    r->z = NULL;
    ASSERT_OK(tdist_zero_create(r->pg, m->op, H5_NPARAMS, o, &r->z));
    r->ddp = make_ddp(r->pg, r->z, m, cap);
    if (overlap) ASSERT_OK(tdist_zero_register_overlap(r->z, r->ddp));
}

static void zrun_train(zrun_t *r, model_t *m, int rank, int iters, bool join)
{
    tdist_join_t *jn = NULL;
    if (join) {
        tdist_joinable_t j[2];
        ASSERT_OK(tdist_ddp_joinable(r->ddp, &j[0]));
        ASSERT_OK(tdist_zero_joinable(r->z, &j[1]));
        ASSERT_OK(tdist_join_begin(j, 2, NULL, &jn));
    }
    static float g[H5_N];
    for (int k = 0; k < iters; k++) {
        synth_grads(g, rank, k);
        ddp_iteration(r->ddp, m, g);
        ASSERT_OK(tdist_zero_step(r->z));
    }
    if (jn) ASSERT_OK(tdist_join_end(jn));
}

static void zrun_close(zrun_t *r)
{
    tdist_ddp_destroy(r->ddp);
    tdist_zero_destroy(r->z);
    tdist_pg_destroy(r->pg);
    tdist_world_destroy(r->w);
}

/* ================================================================ 2. Join */

static const int join_batches[2] = {3, 5};

static void join_body(int rank, int n, void *arg)
{
    const tdist_zero_partition_t *part = arg;
    static model_t m, ref;
    tdist_zero_opts_t o;
    adam_opts(&o);
    o.partition = *part;
    if (*part == TDIST_ZERO_FLAT) { /* AdamW with FLAT (Adam with BY_PARAMS) */
        o.kind = TDIST_OPTIM_ADAMW;
        o.adam.weight_decay = 0.1;
    }
    zrun_t r;
    zrun_open(&r, &m, &o, 0, false);
    zrun_train(&r, &m, rank, join_batches[rank], true);
    replay(&ref, &o, join_batches, n, join_batches[1]);
    expect_params("ZeRO under Join", r.z, &ref);
    zrun_close(&r);
}

static void join_run(tdist_zero_partition_t p) { tdist_test_run_ranks(2, join_body, &p); }

TEST(zero_join_uneven_inputs_by_params, 90) { join_run(BY_PARAMS); }
TEST(zero_join_uneven_inputs_flat, 90) { join_run(FLAT); }

/* SGD with Nesterov momentum and weight decay, FLAT, all_gather: without
 * Join, every rank against the replay, bit for bit. */
static void sgd_body(int rank, int n, void *arg)
{
    (void)arg;
    static model_t m, ref;
    tdist_zero_opts_t o;
    tdist_zero_opts_init(&o);
    o.sgd.lr = 0.05;
    o.sgd.momentum = 0.8;
    o.sgd.nesterov = true;
    o.sgd.weight_decay = 0.01;
    o.partition = TDIST_ZERO_FLAT;
    zrun_t r;
    zrun_open(&r, &m, &o, 0, false);
    zrun_train(&r, &m, rank, 4, false);
    static const int four[2] = {4, 4};
    replay(&ref, &o, four, n, 4);
    expect_params("ZeRO SGD Nesterov FLAT", r.z, &ref);
    zrun_close(&r);
}

TEST(zero_sgd_nesterov_flat_2_ranks, 90) { tdist_test_run_ranks(2, sgd_body, NULL); }

/* 3 ranks with 2, 4 and 3 batches: rank 0 joins first, so the lowest
 * active rank (the root of the gradient broadcast) is rank 1. Every rank
 * ends with the same parameters, a replay's to rounding (the 3-rank sum's
 * order is tdist's). */
static const int join3_batches[3] = {2, 4, 3};

/* The replay of 3 ranks with the given batches: the average of the active
 * ranks' gradients over 3, in double, rounded once. */
static void replay3(model_t *ref, const tdist_zero_opts_t *o, const int *batches, int iters)
{
    model_init(ref, h5a_init);
    tdist_optim_t *opt = NULL;
    ASSERT_OK(tdist_optim_create_adam(ref->op, H5_NPARAMS, &o->adam, &opt));
    for (int k = 0; k < iters; k++) {
        for (size_t i = 0; i < H5_N; i++) {
            double s = 0;
            for (int r = 0; r < 3; r++)
                if (!batches || batches[r] > k) s += synth_grad(r, k, i) / 3.0;
            ref->g[i] = (float)s;
        }
        ASSERT_OK(tdist_optim_step(opt));
    }
    tdist_optim_destroy(opt);
}

/* z's parameters against ref's to rounding. */
static void expect_close(const char *what, tdist_zero_t *z, const model_t *ref)
{
    for (size_t j = 0; j < H5_NPARAMS; j++)
        for (size_t e = 0; e < h5_counts[j]; e++) {
            float p = tdist_zero_param_ptr(z, j)[e], q = ref->op[j].param[e];
            if (fabs((double)p - q) > 1e-5 * (fabs((double)q) + 0.01))
                FAIL("%s: %s[%zu] %.9g, replay %.9g", what, h5_names[j], e, p, q);
        }
}

static void join3_body(int rank, int n, void *arg)
{
    (void)arg;
    static model_t m, ref;
    tdist_zero_opts_t o;
    adam_opts(&o);
    zrun_t r;
    zrun_open(&r, &m, &o, 0, false);
    zrun_train(&r, &m, rank, join3_batches[rank], true);
    replay3(&ref, &o, join3_batches, 4);
    float mine = tdist_zero_param_ptr(r.z, 0)[7], all[3];
    ASSERT_OK(tdist_all_gather(r.pg, &mine, all, 1, TDIST_F32, NULL, NULL));
    for (int q = 0; q < n; q++) ASSERT_TRUE(bits(all[q]) == bits(mine));
    expect_close("3 ranks under Join", r.z, &ref);
    zrun_close(&r);
}

TEST(zero_join_uneven_inputs_3_ranks, 90) { tdist_test_run_ranks(3, join3_body, NULL); }

/* ========================================================= 3. bad input */

typedef enum { BAD_KIND, BAD_SHAPE, BAD_COUNT } bad_t;

static void bad_body(int rank, int n, void *arg)
{
    (void)n;
    bad_t bad = *(const bad_t *)arg;
    static model_t m;
    tdist_world_t *w;
    tdist_pg_t *pg;
    tdist_zero_opts_t o;
    adam_setup(&m, &w, &pg, &o);
    size_t np = H5_NPARAMS;
    if (rank == 1 && bad == BAD_KIND) o.kind = TDIST_OPTIM_SGD;
    if (rank == 1 && bad == BAD_SHAPE) m.op[3].count = 15;
    if (rank == 1 && bad == BAD_COUNT) np = 5;
    tdist_zero_t *z = NULL;
    ASSERT_STATUS(tdist_zero_create(pg, m.op, np, &o, &z), TDIST_ERR_MISMATCH);
    ASSERT_TRUE(z == NULL);
    const char *msg = tdist_last_error();
    const char *want = bad == BAD_KIND ? "optimizer kind mismatch: rank 0 uses adam, rank 1 uses sgd"
                       : bad == BAD_SHAPE ? "parameter 3 (fc2.bias here): 16 elements on rank 0, 15 on rank 1"
                                          : "rank 0 has 6 parameters, rank 1 has 5";
    if (!strstr(msg, want) || !strstr(msg, "tdist_zero_create: rank"))
        FAIL("message \"%s\" lacks \"%s\"", msg, want);
    /* the group is still usable */
    ASSERT_OK(tdist_barrier(pg, NULL, NULL));
    tdist_pg_destroy(pg);
    tdist_world_destroy(w);
}

static void bad_run(bad_t b) { tdist_test_run_ranks(2, bad_body, &b); }

TEST(zero_mismatch_optimizer_kind, 60) { bad_run(BAD_KIND); }
TEST(zero_mismatch_param_shape, 60) { bad_run(BAD_SHAPE); }
TEST(zero_mismatch_param_count, 60) { bad_run(BAD_COUNT); }

/* ========================================================= 4. checkpoints */

/* Every rank steps with the same gradients (no DDP): ZeRO then equals a
 * whole-model optimizer bit for bit. */
static void same_grads(float *g, int k)
{
    for (size_t i = 0; i < H5_N; i++) g[i] = synth_grad(0, k, i);
}

static char *path_of(const char *what, int r)
{
    static char buf[4][512];
    static int next;
    char *b = buf[next++ % 4];
    snprintf(b, 512, "%s/%s%d", tdist_test_tmpdir(), what, r);
    return b;
}

static void write_file(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    ASSERT_TRUE(f != NULL);
    ASSERT_EQ(fwrite(data, 1, len, f), len);
    ASSERT_EQ(fclose(f), 0);
}

static void *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    ASSERT_TRUE(f != NULL);
    ASSERT_EQ(fseek(f, 0, SEEK_END), 0);
    long l = ftell(f);
    ASSERT_TRUE(l > 0);
    rewind(f);
    void *data = malloc((size_t)l);
    ASSERT_TRUE(data != NULL);
    ASSERT_EQ(fread(data, 1, (size_t)l, f), (size_t)l);
    fclose(f);
    *len = (size_t)l;
    return data;
}

static void save_body(int rank, int n, void *arg)
{
    (void)arg;
    (void)n;
    static model_t m;
    tdist_world_t *w;
    tdist_pg_t *pg;
    tdist_zero_opts_t o;
    adam_setup(&m, &w, &pg, &o);
    tdist_zero_t *z = NULL;
    ASSERT_OK(tdist_zero_create(pg, m.op, H5_NPARAMS, &o, &z));
    for (int k = 0; k < 2; k++) {
        same_grads(m.g, k);
        ASSERT_OK(tdist_zero_step(z));
    }
    size_t size = 0;
    ASSERT_OK(tdist_zero_shard_size(z, &size));
    void *blob = malloc(size);
    ASSERT_TRUE(blob != NULL);
    ASSERT_STATUS(tdist_zero_save_shard(z, blob, size - 1), TDIST_ERR_INVALID_ARG);
    ASSERT_OK(tdist_zero_save_shard(z, blob, size));
    write_file(path_of("shard", rank), blob, size);
    if (rank == 0) write_file(path_of("params", 0), m.p, sizeof m.p);
    free(blob);
    tdist_zero_destroy(z);
    tdist_pg_destroy(pg);
    tdist_world_destroy(w);
}

static void load_body(int rank, int n, void *arg)
{
    (void)arg;
    static model_t m, ref, other;
    model_init(&m, h5a_init);
    size_t len = 0;
    void *params = read_file(path_of("params", 0), &len);
    ASSERT_EQ(len, sizeof m.p);
    memcpy(m.p, params, len);
    free(params);
    const void *blobs[2];
    size_t sizes[2];
    for (int r = 0; r < 2; r++) blobs[r] = read_file(path_of("shard", r), &sizes[r]);
    tdist_world_t *w;
    tdist_pg_t *pg;
    open_pg(&w, &pg);
    tdist_zero_opts_t o;
    adam_opts(&o);
    o.adam.lr = 0.5; /* the checkpoint's learning rate replaces it */
    o.partition = TDIST_ZERO_FLAT;
    /* another model: fc2.bias has 17 elements */
    model_init(&other, h5a_init);
    other.op[3].count = 17;
    tdist_zero_t *z = NULL;
    ASSERT_OK(tdist_zero_create(pg, other.op, H5_NPARAMS, &o, &z));
    ASSERT_STATUS(tdist_zero_load_shards(z, blobs, sizes, 2), TDIST_ERR_MISMATCH);
    if (!strstr(tdist_last_error(), "parameter 3 (fc2.bias): 16 elements in the checkpoint, 17 here"))
        FAIL("message: %s", tdist_last_error());
    tdist_zero_destroy(z);
    ASSERT_OK(tdist_zero_create(pg, m.op, H5_NPARAMS, &o, &z));
    /* one shard is not enough for every rank's range */
    tdist_status_t st = tdist_zero_load_shards(z, blobs, sizes, 1);
    if (st != TDIST_OK && !strstr(tdist_last_error(), "pass every shard"))
        FAIL("message: %s", tdist_last_error());
    int64_t failed = st != TDIST_OK, failures = 0;
    ASSERT_OK(tdist_all_reduce(pg, &failed, &failures, 1, TDIST_I64, TDIST_SUM, NULL, NULL));
    ASSERT_TRUE(failures >= 1); /* old rank 1's parameters are in some new rank's range */
    size_t bad_size = sizes[1] - 3;
    ASSERT_STATUS(tdist_zero_load_shards(z, &blobs[1], &bad_size, 1), TDIST_ERR_INVALID_ARG);
    /* the same shards twice (several ranks may hold the same elements) */
    const void *twice[4] = {blobs[0], blobs[1], blobs[0], blobs[1]};
    size_t twice_sizes[4] = {sizes[0], sizes[1], sizes[0], sizes[1]};
    ASSERT_OK(tdist_zero_load_shards(z, twice, twice_sizes, 4));
    for (int k = 2; k < 4; k++) {
        same_grads(m.g, k);
        ASSERT_OK(tdist_zero_step(z));
    }
    /* the same 4 steps without stopping, one process */
    model_init(&ref, h5a_init);
    tdist_optim_t *opt = NULL;
    adam_opts(&o);
    ASSERT_OK(tdist_optim_create_adam(ref.op, H5_NPARAMS, &o.adam, &opt));
    for (int k = 0; k < 4; k++) {
        same_grads(ref.g, k);
        ASSERT_OK(tdist_optim_step(opt));
    }
    expect_params("resumed at 3 ranks", z, &ref);
    ASSERT_EQ(n, 3);
    (void)rank;
    tdist_optim_destroy(opt);
    tdist_zero_destroy(z);
    for (int r = 0; r < 2; r++) free((void *)blobs[r]);
    tdist_pg_destroy(pg);
    tdist_world_destroy(w);
}

TEST(zero_sharded_checkpoint_loads_at_another_world_size, 120)
{
    tdist_test_run_ranks(2, save_body, NULL);
    tdist_test_run_ranks(3, load_body, NULL);
}

/* ================================================= 5. overlap with DDP */

typedef struct overlap_case {
    int world;
    const int *batches; /* NULL: every rank 4 iterations, no Join */
    size_t part_bytes;  /* overlap_part_bytes (0: the whole slice) */
    bool marks;         /* check the hook's flight-recorder events */
} overlap_case_t;

/* The hook's events in this rank's flight recorder (TDIST_FR_DIR set by
 * the test): a zero_stepped per bucket and a zero_synced per iteration. */
static void expect_marks(int rank)
{
    int files = 0;
    ASSERT_OK(tdist_flight_dump("test", &files));
    ASSERT_TRUE(files >= 1);
    char path[700];
    snprintf(path, sizeof path, "%s/fr/tdist-fr.r%d.world.json", tdist_test_tmpdir(), rank);
    size_t len = 0;
    char *j = read_file(path, &len);
    char *text = malloc(len + 1);
    ASSERT_TRUE(text != NULL);
    memcpy(text, j, len);
    text[len] = 0;
    if (!strstr(text, "\"what\":\"zero_stepped\"") || !strstr(text, "\"what\":\"zero_synced\""))
        FAIL("no zero_stepped / zero_synced event in %s", path);
    free(text);
    free(j);
}

/* The overlap hook's shards (slices of buckets) load into a ZeRO without
 * the hook (PyTorch's partition): the same state. */
static void overlap_reload(tdist_pg_t *pg, int rank, tdist_zero_t *z, model_t *m, tdist_optim_t *ref)
{
    size_t size = 0;
    ASSERT_OK(tdist_zero_shard_size(z, &size));
    void *blob = malloc(size);
    ASSERT_TRUE(blob != NULL);
    ASSERT_OK(tdist_zero_save_shard(z, blob, size));
    write_file(path_of("ovshard", rank), blob, size);
    free(blob);
    ASSERT_OK(tdist_barrier(pg, NULL, NULL));
    const void *blobs[2];
    size_t sizes[2];
    for (int r = 0; r < 2; r++) blobs[r] = read_file(path_of("ovshard", r), &sizes[r]);
    tdist_zero_opts_t o;
    adam_opts(&o);
    tdist_zero_t *z2 = NULL;
    ASSERT_OK(tdist_zero_create(pg, m->op, H5_NPARAMS, &o, &z2));
    ASSERT_OK(tdist_zero_load_shards(z2, blobs, sizes, 2));
    ASSERT_OK(tdist_zero_consolidate_state_dict(z2, 0));
    if (rank == 0) expect_state("overlap shards loaded without the hook", z2, ref);
    tdist_zero_destroy(z2);
    for (int r = 0; r < 2; r++) free((void *)blobs[r]);
}

static void overlap_body(int rank, int n, void *arg)
{
    const overlap_case_t *oc = arg;
    static model_t m, ref;
    tdist_zero_opts_t o;
    adam_opts(&o);
    o.overlap_part_bytes = oc->part_bytes;
    zrun_t r;
    zrun_open(&r, &m, &o, 1024, true); /* several buckets */
    ASSERT_TRUE(tdist_ddp_num_buckets(r.ddp) >= 3);
    ASSERT_STATUS(tdist_zero_register_overlap(r.z, r.ddp), TDIST_ERR_INVALID_ARG);
    static const int four[3] = {4, 4, 4};
    const int *batches = oc->batches ? oc->batches : four;
    /* tdist_zero_step does nothing: the step runs in backward_end */
    zrun_train(&r, &m, rank, batches[rank], oc->batches != NULL);
    if (oc->marks) expect_marks(rank);
    int iters = 0;
    for (int q = 0; q < n; q++) iters = batches[q] > iters ? batches[q] : iters;
    /* the state is sharded: about a third / half of the whole model's */
    size_t whole = 2 * H5_N * sizeof(float), mine = tdist_zero_state_bytes(r.z);
    if (mine > whole / (size_t)n + 2 * 64 * sizeof(float) * tdist_ddp_num_buckets(r.ddp))
        FAIL("state bytes %zu of %zu with %d ranks", mine, whole, n);
    ASSERT_OK(tdist_zero_consolidate_state_dict(r.z, 0));
    if (n == 2) {
        tdist_optim_t *ropt = NULL;
        replay_keep(&ref, &o, batches, n, iters, &ropt);
        expect_params("ZeRO overlapped with DDP", r.z, &ref);
        if (rank == 0) expect_state("ZeRO overlapped with DDP", r.z, ropt);
        if (!oc->batches) overlap_reload(r.pg, rank, r.z, &m, ropt);
        tdist_optim_destroy(ropt);
    } else {
        replay3(&ref, &o, NULL, iters); /* one order of the sum: to rounding */
        expect_close("overlap, 3 ranks", r.z, &ref);
    }
    zrun_close(&r);
}

static void overlap_run(int world, const int *batches, size_t part_bytes)
{
    char dir[600];
    snprintf(dir, sizeof dir, "%s/fr", tdist_test_tmpdir());
    ASSERT_EQ(setenv("TDIST_FR_DIR", dir, 1), 0); /* inherited by the ranks */
    overlap_case_t c = {world, batches, part_bytes, world == 2 && !batches};
    tdist_test_run_ranks(world, overlap_body, &c);
}

/* slices of 128 elements in parts of 11 */
TEST(zero_overlap_with_ddp_2_ranks, 90) { overlap_run(2, NULL, 44); }
TEST(zero_overlap_with_ddp_3_ranks, 90) { overlap_run(3, NULL, 0); }
TEST(zero_overlap_with_ddp_under_join, 90)
{
    static const int b[2] = {2, 4};
    overlap_run(2, b, 1u << 20);
}

/* ======================================================== 6. state bytes */

static void bytes_body(int rank, int n, void *arg)
{
    (void)arg;
    static model_t m;
    tdist_world_t *w;
    tdist_pg_t *pg;
    tdist_zero_opts_t o;
    adam_setup(&m, &w, &pg, &o);
    for (int part = 0; part < 2; part++) {
        o.partition = part ? TDIST_ZERO_FLAT : TDIST_ZERO_BY_PARAMS;
        tdist_zero_t *z = NULL;
        ASSERT_OK(tdist_zero_create(pg, m.op, H5_NPARAMS, &o, &z));
        int64_t mine = (int64_t)tdist_zero_state_bytes(z), all = 0;
        ASSERT_OK(tdist_all_reduce(pg, &mine, &all, 1, TDIST_I64, TDIST_SUM, NULL, NULL));
        ASSERT_EQ(all, (int64_t)(2 * H5_N * sizeof(float)));
        size_t elems = 0;
        for (int r = 0; r < n; r++) elems += tdist_zero_rank_elems(z, r);
        ASSERT_EQ(elems, H5_N);
        ASSERT_EQ((size_t)mine, 2 * tdist_zero_rank_elems(z, rank) * sizeof(float));
        if (part) ASSERT_TRUE(tdist_zero_rank_elems(z, rank) <= (H5_N + 2) / 3);
        tdist_zero_destroy(z);
    }
    tdist_pg_destroy(pg);
    tdist_world_destroy(w);
}

TEST(zero_state_is_sharded, 60) { tdist_test_run_ranks(3, bytes_body, NULL); }

/* ====================================================== 7. bad arguments */

static void args_body(int rank, int n, void *arg)
{
    (void)rank;
    (void)n;
    (void)arg;
    static model_t m;
    model_init(&m, h5a_init);
    tdist_world_t *w;
    tdist_pg_t *pg;
    open_pg(&w, &pg);
    tdist_zero_t *z = NULL;
    tdist_zero_opts_t o;
    tdist_zero_opts_init(&o);
    ASSERT_STATUS(tdist_zero_create(NULL, m.op, H5_NPARAMS, &o, &z), TDIST_ERR_INVALID_ARG);
    ASSERT_STATUS(tdist_zero_create(pg, m.op, 0, &o, &z), TDIST_ERR_INVALID_ARG);
    ASSERT_STATUS(tdist_zero_create(pg, NULL, H5_NPARAMS, &o, &z), TDIST_ERR_INVALID_ARG);
    o.partition = TDIST_ZERO_FLAT;
    o.sync = TDIST_ZERO_SYNC_BROADCAST;
    ASSERT_STATUS(tdist_zero_create(pg, m.op, H5_NPARAMS, &o, &z), TDIST_ERR_INVALID_ARG);
    ASSERT_TRUE(strstr(tdist_last_error(), "FLAT") != NULL);
    tdist_zero_opts_init(&o);
    o.kind = (tdist_optim_kind_t)9;
    ASSERT_STATUS(tdist_zero_create(pg, m.op, H5_NPARAMS, &o, &z), TDIST_ERR_INVALID_ARG);
    tdist_zero_opts_init(&o);
    m.op[2].grad = NULL;
    ASSERT_STATUS(tdist_zero_create(pg, m.op, H5_NPARAMS, &o, &z), TDIST_ERR_INVALID_ARG);
    ASSERT_TRUE(strstr(tdist_last_error(), "parameter 2 (fc2.weight): grad pointer is NULL") != NULL);
    ASSERT_TRUE(z == NULL);
    model_init(&m, h5a_init);
    o.sgd.lr = -1.0; /* optim's own check */
    ASSERT_STATUS(tdist_zero_create(pg, m.op, H5_NPARAMS, &o, &z), TDIST_ERR_INVALID_ARG);
    tdist_zero_opts_init(&o);
    ASSERT_OK(tdist_zero_create(pg, m.op, H5_NPARAMS, &o, &z)); /* one rank owns everything */
    ASSERT_EQ(tdist_zero_rank_elems(z, 0), (size_t)H5_N);
    ASSERT_EQ(tdist_zero_rank_elems(z, 1), 0);
    ASSERT_TRUE(tdist_zero_param_ptr(z, H5_NPARAMS) == NULL);
    ASSERT_STATUS(tdist_zero_consolidated_state(z, 0, 0, NULL, NULL), TDIST_ERR_INVALID_ARG);
    ASSERT_STATUS(tdist_zero_consolidate_state_dict(z, 1), TDIST_ERR_INVALID_ARG);
    ASSERT_STATUS(tdist_zero_set_lr(z, -1.0), TDIST_ERR_INVALID_ARG);
    ASSERT_STATUS(tdist_zero_step(NULL), TDIST_ERR_INVALID_ARG);
    const void *junk[1] = {"not a shard at all, just some bytes of text that are long enough"};
    size_t jl = 66;
    ASSERT_STATUS(tdist_zero_load_shards(z, junk, &jl, 1), TDIST_ERR_INVALID_ARG);
    tdist_zero_destroy(z);
    tdist_zero_destroy(NULL);
    tdist_pg_destroy(pg);
    tdist_world_destroy(w);
}

TEST(zero_bad_arguments, 60) { tdist_test_run_ranks(1, args_body, NULL); }
