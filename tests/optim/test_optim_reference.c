/*
 * tests/optim/test_optim_reference.c — SGD, Adam and AdamW against the
 * parameters PyTorch's torch.optim produced for the same inputs
 * (reference_values.h, written by gen_reference.py; torch is not needed
 * here). Every element must agree bit for bit: the kernels follow PyTorch
 * 1.13's roundings and fused multiply-adds on x86-64 (optim/kernels.c), and
 * the inputs are not short binary fractions, so a rounding done differently
 * shows. The S1 run of the DDP + Join reference (SGD lr 0.01 on the averaged
 * gradients of a Linear(1,1)) must end at PyTorch's bits too.
 *
 * Also checks that the other ways of stepping — per-buffer / partial
 * tdist_optim_step_range(), gradients re-pointed every step with
 * tdist_optim_set_grad(), parameters re-pointed with set_param — give the
 * same numbers.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "optim/internal.h"
#include "reference_values.h"

#define NCASES (sizeof optim_ref_cases / sizeof optim_ref_cases[0])

static const size_t sizes[2] = {OPTIM_REF_N0, OPTIM_REF_N1};

/* The formulas of gen_reference.py, each value rounded once to f32. */
static float ref_param0(size_t b, size_t i)
{
    return (float)(((i % 2 ? -1.0 : 1.0) * (2.0 + 0.25 * (double)(i % 8) + 0.5 * (double)b) +
                    0.1 * sin((double)(3 * i + b))) /
                   64.0);
}

static float ref_grad(int t, size_t b, size_t i)
{
    return (float)((double)((int)((5 * i + 3 * (size_t)t + 7 * b) % 13) - 6) / 8.0 + 0.0625 * t +
                   0.05 * cos((double)(7 * i + 5 * (size_t)t + b)));
}

static float f32_of(uint32_t bits)
{
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static uint32_t bits_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

typedef struct model {
    float p[2][OPTIM_REF_N1];
    float g[2][OPTIM_REF_N1];
} model_t;

static void model_init(model_t *m)
{
    memset(m, 0, sizeof *m);
    for (size_t b = 0; b < 2; b++)
        for (size_t i = 0; i < sizes[b]; i++) m->p[b][i] = ref_param0(b, i);
}

static void model_grads(model_t *m, int t)
{
    for (size_t b = 0; b < 2; b++)
        for (size_t i = 0; i < sizes[b]; i++) m->g[b][i] = ref_grad(t, b, i);
}

static tdist_optim_t *create_with(const optim_ref_case_t *c, const tdist_optim_param_t *params,
                                  size_t n)
{
    tdist_optim_t *opt = NULL;
    if (c->kind == TDIST_OPTIM_SGD) {
        tdist_optim_sgd_opts_t o;
        tdist_optim_sgd_opts_init(&o);
        o.lr = c->lr;
        o.momentum = c->momentum;
        o.dampening = c->dampening;
        o.weight_decay = c->weight_decay;
        o.nesterov = c->nesterov != 0;
        o.maximize = c->maximize != 0;
        ASSERT_OK(tdist_optim_create_sgd(params, n, &o, &opt));
    } else {
        tdist_optim_adam_opts_t o;
        if (c->kind == TDIST_OPTIM_ADAM)
            tdist_optim_adam_opts_init(&o);
        else
            tdist_optim_adamw_opts_init(&o);
        o.lr = c->lr;
        o.beta1 = c->beta1;
        o.beta2 = c->beta2;
        o.eps = c->eps;
        o.weight_decay = c->weight_decay;
        o.amsgrad = c->amsgrad != 0;
        o.maximize = c->maximize != 0;
        if (c->kind == TDIST_OPTIM_ADAM)
            ASSERT_OK(tdist_optim_create_adam(params, n, &o, &opt));
        else
            ASSERT_OK(tdist_optim_create_adamw(params, n, &o, &opt));
    }
    ASSERT_TRUE(opt != NULL);
    return opt;
}

static tdist_optim_t *create_for(const optim_ref_case_t *c, model_t *m)
{
    tdist_optim_param_t params[2] = {
        {.param = m->p[0], .grad = m->g[0], .count = sizes[0], .name = "w0"},
        {.param = m->p[1], .grad = m->g[1], .count = sizes[1], .name = "w1"},
    };
    return create_with(c, params, 2);
}

static const uint32_t *want_of(const optim_ref_case_t *c, size_t b)
{
    return b == 0 ? c->want0 : c->want1;
}

/* got[i] vs want[i] for i in [lo, hi); elements outside must still hold
 * their initial values. */
static void check_buffer(const optim_ref_case_t *c, size_t b, const float *got, size_t lo,
                         size_t hi)
{
    const uint32_t *want = want_of(c, b);
    for (size_t i = 0; i < sizes[b]; i++) {
        uint32_t w = (i >= lo && i < hi) ? want[i] : bits_of(ref_param0(b, i));
        if (bits_of(got[i]) != w)
            FAIL("case %s: buffer %zu element %zu: got %.9g (0x%08x), torch %.9g (0x%08x)",
                 c->name, b, i, (double)got[i], bits_of(got[i]), (double)f32_of(w), w);
    }
}

static void apply_lr_schedule(const optim_ref_case_t *c, tdist_optim_t *opt, int t)
{
    if (c->lr_change_step == t) {
        ASSERT_OK(tdist_optim_set_lr(opt, c->lr_new));
        double lr = 0;
        ASSERT_OK(tdist_optim_get_lr(opt, &lr));
        ASSERT_TRUE(lr == c->lr_new);
    }
}

/* The plain loop: tdist_optim_step over both buffers. */
static void run_case(const optim_ref_case_t *c)
{
    model_t m;
    model_init(&m);
    tdist_optim_t *opt = create_for(c, &m);
    for (int t = 1; t <= OPTIM_REF_STEPS; t++) {
        apply_lr_schedule(c, opt, t);
        model_grads(&m, t);
        ASSERT_OK(tdist_optim_step(opt));
    }
    for (size_t b = 0; b < 2; b++) {
        uint64_t steps = 0;
        ASSERT_OK(tdist_optim_step_count(opt, b, &steps));
        ASSERT_EQ(steps, OPTIM_REF_STEPS);
        check_buffer(c, b, m.p[b], 0, sizes[b]);
    }
    tdist_optim_destroy(opt);
}

static int run_kind(int kind)
{
    int n = 0;
    for (size_t k = 0; k < NCASES; k++) {
        if (optim_ref_cases[k].kind != kind) continue;
        run_case(&optim_ref_cases[k]);
        n++;
    }
    return n;
}

TEST(optim_sgd_matches_torch, 20)
{
    ASSERT_GE(run_kind(TDIST_OPTIM_SGD), 10);
}

TEST(optim_adam_matches_torch, 20)
{
    ASSERT_GE(run_kind(TDIST_OPTIM_ADAM), 8);
}

TEST(optim_adamw_matches_torch, 20)
{
    ASSERT_GE(run_kind(TDIST_OPTIM_ADAMW), 5);
}

/* The plain loops (CPUs without FMA: fmaf from the C library) give the
 * same bits as the AVX2 + FMA ones. */
TEST(optim_plain_loops_match_torch, 30)
{
    tdist__optim_use_fma(0);
    ASSERT_GE(run_kind(TDIST_OPTIM_SGD), 10);
    ASSERT_GE(run_kind(TDIST_OPTIM_ADAM), 8);
    ASSERT_GE(run_kind(TDIST_OPTIM_ADAMW), 5);
    tdist__optim_use_fma(1);
}

/* PyTorch's S1 run (the DDP + Join reference): SGD lr 0.01 without
 * momentum on a Linear(1,1) with w = 0.5, b = -0.25 and these averaged
 * gradients {dw, db} per step ends at w = 0x3ea3d70a, b = 0xbe9c28f4; two
 * roundings per update instead of torch's one fused multiply-add end at
 * w = 0x3ea3d70b. Every step's parameters are checked. */
TEST(optim_sgd_s1_run_bit_for_bit, 10)
{
    static const uint32_t grads[6][2] = {
        {0x3f800000, 0x3f800000}, {0x40000000, 0x3f800000}, {0x40400000, 0x3f800000},
        {0x40800000, 0x3f800000}, {0x40a00000, 0x3f800000}, {0x40400000, 0x3f000000},
    };
    static const uint32_t after[6][2] = {
        {0x3efae148, 0xbe851eb8}, {0x3ef0a3d7, 0xbe8a3d70}, {0x3ee147ae, 0xbe8f5c28},
        {0x3ecccccd, 0xbe947ae0}, {0x3eb33333, 0xbe999998}, {0x3ea3d70a, 0xbe9c28f4},
    };
    float w = 0.5f, b = -0.25f, dw = 0.0f, db = 0.0f;
    tdist_optim_param_t params[2] = {
        {.param = &w, .grad = &dw, .count = 1, .name = "weight"},
        {.param = &b, .grad = &db, .count = 1, .name = "bias"},
    };
    tdist_optim_sgd_opts_t o;
    tdist_optim_sgd_opts_init(&o);
    o.lr = 0.01;
    tdist_optim_t *opt = NULL;
    ASSERT_OK(tdist_optim_create_sgd(params, 2, &o, &opt));
    for (int s = 0; s < 6; s++) {
        dw = f32_of(grads[s][0]);
        db = f32_of(grads[s][1]);
        ASSERT_OK(tdist_optim_step(opt));
        if (bits_of(w) != after[s][0] || bits_of(b) != after[s][1])
            FAIL("S1 step %d: w 0x%08x b 0x%08x, torch w 0x%08x b 0x%08x", s, bits_of(w),
                 bits_of(b), after[s][0], after[s][1]);
    }
    tdist_optim_destroy(opt);
}

/* The reference really distinguishes the options: no two cases give the
 * same parameters, so a kernel that ignored an option would fail above. */
TEST(optim_reference_cases_differ, 10)
{
    for (size_t a = 0; a < NCASES; a++)
        for (size_t b = a + 1; b < NCASES; b++)
            if (memcmp(optim_ref_cases[a].want1, optim_ref_cases[b].want1,
                       sizeof optim_ref_cases[a].want1) == 0)
                FAIL("cases %s and %s have identical reference values", optim_ref_cases[a].name,
                     optim_ref_cases[b].name);
}

/* Per-buffer steps in reverse order (what a fused optimizer-in-backward
 * hook does) and gradients re-pointed every step into fresh memory (what
 * gradient_as_bucket_view does) give torch's numbers too. */
TEST(optim_step_range_and_set_grad_match_torch, 20)
{
    for (size_t k = 0; k < NCASES; k++) {
        const optim_ref_case_t *c = &optim_ref_cases[k];
        model_t m;
        model_init(&m);
        tdist_optim_t *opt = create_for(c, &m);
        float *bucket = malloc((sizes[0] + sizes[1]) * sizeof(float));
        ASSERT_TRUE(bucket != NULL);
        for (int t = 1; t <= OPTIM_REF_STEPS; t++) {
            apply_lr_schedule(c, opt, t);
            model_grads(&m, t);
            /* this step's gradients live in the bucket; m.g is poisoned */
            memcpy(bucket, m.g[1], sizes[1] * sizeof(float));
            memcpy(bucket + sizes[1], m.g[0], sizes[0] * sizeof(float));
            for (size_t b = 0; b < 2; b++)
                for (size_t i = 0; i < sizes[b]; i++) m.g[b][i] = NAN;
            ASSERT_OK(tdist_optim_set_grad(opt, 1, bucket));
            ASSERT_OK(tdist_optim_set_grad(opt, 0, bucket + sizes[1]));
            ASSERT_OK(tdist_optim_step_range(opt, 1, 0, sizes[1]));
            ASSERT_OK(tdist_optim_step_range(opt, 0, 0, sizes[0]));
        }
        check_buffer(c, 0, m.p[0], 0, sizes[0]);
        check_buffer(c, 1, m.p[1], 0, sizes[1]);
        free(bucket);
        tdist_optim_destroy(opt);
    }
}

/* A partial range updates exactly that slice (with torch's values) and
 * leaves the rest of the buffer alone: ZeRO's shard step. */
TEST(optim_step_range_partial_slice, 20)
{
    const size_t lo = 5, len = 19;
    for (size_t k = 0; k < NCASES; k++) {
        const optim_ref_case_t *c = &optim_ref_cases[k];
        model_t m;
        model_init(&m);
        tdist_optim_t *opt = create_for(c, &m);
        for (int t = 1; t <= OPTIM_REF_STEPS; t++) {
            apply_lr_schedule(c, opt, t);
            model_grads(&m, t);
            ASSERT_OK(tdist_optim_step_range(opt, 1, lo, len));
        }
        check_buffer(c, 1, m.p[1], lo, lo + len);
        check_buffer(c, 0, m.p[0], 0, 0); /* buffer 0 never stepped */
        uint64_t s0 = 99, s1 = 0;
        ASSERT_OK(tdist_optim_step_count(opt, 0, &s0));
        ASSERT_OK(tdist_optim_step_count(opt, 1, &s1));
        ASSERT_EQ(s0, 0);
        ASSERT_EQ(s1, OPTIM_REF_STEPS);
        tdist_optim_destroy(opt);
    }
}

/* Shards as separate optimizers over param + offset (the other way to do
 * ZeRO) equal the whole, bit for bit. */
TEST(optim_shard_optimizers_equal_whole, 20)
{
    for (size_t k = 0; k < NCASES; k++) {
        const optim_ref_case_t *c = &optim_ref_cases[k];
        model_t whole, shard;
        model_init(&whole);
        model_init(&shard);
        tdist_optim_t *a = create_for(c, &whole);
        /* buffer 1 split into [0, 16) and [16, N1), each its own optimizer */
        tdist_optim_param_t lo = {.param = shard.p[1], .grad = shard.g[1], .count = 16};
        tdist_optim_param_t hi = {.param = shard.p[1] + 16, .grad = shard.g[1] + 16,
                                  .count = sizes[1] - 16};
        tdist_optim_t *s_lo = create_with(c, &lo, 1);
        tdist_optim_t *s_hi = create_with(c, &hi, 1);
        for (int t = 1; t <= OPTIM_REF_STEPS; t++) {
            apply_lr_schedule(c, a, t);
            apply_lr_schedule(c, s_lo, t);
            apply_lr_schedule(c, s_hi, t);
            model_grads(&whole, t);
            model_grads(&shard, t);
            ASSERT_OK(tdist_optim_step(a));
            ASSERT_OK(tdist_optim_step(s_hi));
            ASSERT_OK(tdist_optim_step(s_lo));
        }
        if (memcmp(whole.p[1], shard.p[1], sizes[1] * sizeof(float)) != 0)
            FAIL("case %s: sharded optimizers differ from the whole", c->name);
        check_buffer(c, 1, shard.p[1], 0, sizes[1]);
        tdist_optim_destroy(a);
        tdist_optim_destroy(s_lo);
        tdist_optim_destroy(s_hi);
    }
}
