/* tests/algorithms/test_averager.c — model averagers and the
 * post-local-SGD optimizer.
 *
 * 1. Against PyTorch (oracle_h4.h: 4 ranks x 8 steps, post_localSGD_hook
 *    with start_localSGD_iter 2 and subgroups {0,1}, {2,3}, then
 *    PostLocalSGDOptimizer(SGD lr 0.1 momentum 0.9,
 *    PeriodicModelAverager(period 2, warmup_steps 2))):
 *    a. the rules in C alone, bit for bit: SGD's buf = fl(fl(buf * 0.9) +
 *       g), p = fmaf(fl(-lr), buf, p); the averager's Gloo ring sum of
 *       fl(p / 4) in the steps PyTorch averaged;
 *    b. tdist stage by stage, each stage fed PyTorch's previous stage:
 *       tdist's SGD (parameters and momentum buffers, bit for bit), then
 *       tdist's averager (its 4-rank sum is not in Gloo's ring order: to
 *       rounding; the steps that do not average: bit for bit, untouched),
 *       the averager's schedule and counter;
 *    c. end to end: DDP + the post-local-SGD hook + the post-local-SGD
 *       optimizer fed only the recorded local gradients, every step's
 *       parameters to rounding.
 * 2. The hierarchical averager: the step -> group size schedule of
 *    PyTorch's {2: 2, 4: 4} with warm-up 2, and the averages themselves
 *    (exact: dyadic values) in subgroups {0,1}, {2,3} and in the world;
 *    buffers without a gradient are not averaged.
 * 3. average_optimizer_state: the momentum buffers are averaged too, only
 *    with the option; Adam's states end equal on every rank with it.
 * 4. Under Join: a joined rank's parameters enter the averages, in the
 *    world and in subgroups.
 * 5. Bad options fail at create; ranks with different schedules fail
 *    together. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "oracle_h4.h"
#include "oracle_util.h"
#include "tdist/algorithms.h"
#include "tdist/join.h"

static void open_pg(tdist_world_t **w, tdist_pg_t **pg)
{
    tdist_test_open_world(w, pg, (int64_t)(20000 * tdist_test_timeout_mult()));
}

/* ==================================================== 1. against PyTorch */

#define LOCAL(k, g, i) f32(H4_OPT(h4_local_params, k, g, i))
#define AFTER(k, g, i) f32(H4_OPT(h4_params, k, g, i))
#define MOM(k, g, i) f32(H4_OPT(h4_momentum, k, g, i))

/* PyTorch's parameters before step k on subgroup g's ranks. */
static float before(int k, int g, size_t i) { return k == 0 ? f32(h4_init[i]) : AFTER(k - 1, g, i); }

static void h4_rules(void)
{
    static float q[H4_RANKS][H4_N];
    for (int k = 0; k < H4_STEPS; k++)
        for (int g = 0; g < H4_GROUPS; g++)
            for (size_t i = 0; i < H4_N; i++) {
                float gr = f32(H4_GRAD(k, g, i));
                float buf = k == 0 ? gr : MOM(k - 1, g, i) * 0.9f + gr;
                float p = fmaf(-0.1f, buf, before(k, g, i));
                if (bits(buf) != bits(MOM(k, g, i)) || bits(p) != bits(LOCAL(k, g, i)))
                    FAIL("rule check: step %d subgroup %d element %zu: SGD", k, g, i);
            }
    for (int k = 0; k < H4_STEPS; k++) {
        for (int r = 0; r < H4_RANKS; r++)
            for (size_t i = 0; i < H4_N; i++) q[r][i] = LOCAL(k, r / 2, i) / 4.0f;
        for (int g = 0; g < H4_GROUPS; g++)
            for (size_t i = 0; i < H4_N; i++) {
                float want = h4_averaged[k] ? ring_sum(&q[0][0], H4_N, 4, H4_N, i) : LOCAL(k, g, i);
                if (bits(want) != bits(AFTER(k, g, i)))
                    FAIL("rule check: step %d subgroup %d element %zu: averaging", k, g, i);
            }
    }
}

/* The model's four buffers over p (params) and g (grads). */
static void h4_buffers(tdist_optim_param_t *op, float *p, float *g)
{
    for (size_t j = 0, off = 0; j < H4_NPARAMS; off += h4_counts[j], j++)
        op[j] = (tdist_optim_param_t){p + off, g + off, h4_counts[j], h4_names[j]};
}

/* The SGD's momentum buffers, in buffer order, from its saved state
 * (tdist_optim_save's version-1 layout: 96 + 16 per buffer bytes of
 * header, then the buffers' momentum). */
static void momentum_of(tdist_optim_t *opt, float *out, size_t n)
{
    size_t size;
    ASSERT_OK(tdist_optim_state_size(opt, &size));
    unsigned char *b = malloc(size);
    ASSERT_TRUE(b != NULL);
    ASSERT_OK(tdist_optim_save(opt, b, size));
    size_t nbuf;
    ASSERT_OK(tdist_optim_num_buffers(opt, &nbuf));
    ASSERT_EQ(size, 96 + 16 * nbuf + n * sizeof(float) + 8);
    memcpy(out, b + 96 + 16 * nbuf, n * sizeof(float));
    free(b);
}

/* |a - b| within a few roundings of a sum of 4 terms of magnitude scale */
static void near(float got, float want, double scale, const char *what, int k, size_t i)
{
    if (fabs((double)got - (double)want) > 4 * 6e-8 * scale)
        FAIL("%s: step %d element %zu: tdist %.9g, PyTorch %.9g", what, k, i, got, want);
}

static tdist_optim_t *h4_sgd(tdist_optim_param_t *op)
{
    tdist_optim_sgd_opts_t so;
    tdist_optim_sgd_opts_init(&so);
    so.lr = 0.1;
    so.momentum = 0.9;
    tdist_optim_t *opt;
    ASSERT_OK(tdist_optim_create_sgd(op, H4_NPARAMS, &so, &opt));
    return opt;
}

static tdist_averager_t *h4_averager(tdist_pg_t *pg)
{
    tdist_averager_opts_t ao;
    tdist_averager_opts_init(&ao);
    ao.period = 2;
    ao.warmup_steps = 2;
    tdist_averager_t *a;
    ASSERT_OK(tdist_periodic_averager_create(pg, &ao, &a));
    return a;
}

static void h4_stages(int rank, int n, void *arg)
{
    (void)arg;
    ASSERT_EQ(n, H4_RANKS);
    h4_rules();
    static float p[H4_N], g[H4_N], mom[H4_N];
    tdist_world_t *w;
    tdist_pg_t *pg;
    open_pg(&w, &pg);
    tdist_optim_param_t op[H4_NPARAMS];
    h4_buffers(op, p, g);
    tdist_optim_t *opt = h4_sgd(op);
    tdist_averager_t *a = h4_averager(pg);
    int sub = rank / 2;
    for (int k = 0; k < H4_STEPS; k++) {
        ASSERT_EQ(tdist_averager_group_size_at(a, k), h4_averaged[k] ? 4 : 0);
        for (size_t i = 0; i < H4_N; i++) {
            p[i] = before(k, sub, i);
            g[i] = f32(H4_GRAD(k, sub, i));
        }
        ASSERT_OK(tdist_optim_step(opt));
        momentum_of(opt, mom, H4_N);
        for (size_t i = 0; i < H4_N; i++) {
            if (bits(mom[i]) != bits(MOM(k, sub, i)))
                FAIL("step %d momentum %zu: tdist 0x%08x, PyTorch 0x%08x", k, i, bits(mom[i]),
                     bits(MOM(k, sub, i)));
            if (bits(p[i]) != bits(LOCAL(k, sub, i)))
                FAIL("step %d local SGD step, parameter %zu: tdist 0x%08x (%.9g), PyTorch 0x%08x "
                     "(%.9g)", k, i, bits(p[i]), p[i], bits(LOCAL(k, sub, i)), LOCAL(k, sub, i));
        }
        int gs = -1;
        ASSERT_OK(tdist_averager_average(a, op, H4_NPARAMS, &gs));
        ASSERT_EQ(gs, h4_averaged[k] ? 4 : 0);
        ASSERT_EQ(tdist_averager_step(a), k + 1);
        for (size_t i = 0; i < H4_N; i++) {
            if (!h4_averaged[k]) {
                ASSERT_EQ(bits(p[i]), bits(AFTER(k, sub, i)));
                continue;
            }
            double scale = 0;
            for (int r = 0; r < H4_RANKS; r++) scale += fabs(LOCAL(k, r / 2, i) / 4.0);
            near(p[i], AFTER(k, sub, i), scale, "averaged parameters", k, i);
        }
    }
    tdist_averager_destroy(a);
    tdist_optim_destroy(opt);
    tdist_pg_destroy(pg);
    tdist_world_destroy(w);
}

TEST(averager_pytorch_h4_stages, 90) { tdist_test_run_ranks(H4_RANKS, h4_stages, NULL); }

static void h4_end_to_end(int rank, int n, void *arg)
{
    (void)arg;
    ASSERT_EQ(n, H4_RANKS);
    static float p[H4_N], g[H4_N];
    for (size_t i = 0; i < H4_N; i++) p[i] = f32(h4_init[i]);
    tdist_world_t *w;
    tdist_pg_t *pg, *sub;
    open_pg(&w, &pg);
    ASSERT_OK(tdist_pg_split(pg, rank / 2, rank, NULL, &sub));
    tdist_ddp_param_t dp[H4_NPARAMS];
    for (size_t j = 0, off = 0; j < H4_NPARAMS; off += h4_counts[j], j++)
        dp[j] = (tdist_ddp_param_t){p + off, g + off, h4_counts[j], TDIST_F32, h4_names[j]};
    tdist_ddp_t *ddp;
    ASSERT_OK(tdist_ddp_create(pg, dp, H4_NPARAMS, NULL, 0, NULL, &ddp));
    tdist_post_local_opts_t po;
    tdist_post_local_opts_init(&po);
    po.subgroup = sub;
    po.start_localSGD_iter = H4_START;
    tdist_post_local_t *hook;
    ASSERT_OK(tdist_post_local_create(&po, &hook));
    ASSERT_OK(tdist_post_local_register(ddp, hook));
    tdist_optim_param_t op[H4_NPARAMS];
    h4_buffers(op, p, g);
    tdist_optim_t *opt = h4_sgd(op);
    tdist_averager_t *a = h4_averager(pg);
    tdist_post_local_optim_t *plo;
    ASSERT_OK(tdist_post_local_optim_create(opt, op, H4_NPARAMS, a, NULL, &plo));
    for (int k = 0; k < H4_STEPS; k++) {
        ASSERT_OK(tdist_ddp_forward_begin(ddp));
        for (size_t i = 0; i < H4_N; i++) g[i] = f32(H4_LOCAL(rank, k, i));
        for (size_t j = H4_NPARAMS; j-- > 0;) ASSERT_OK(tdist_ddp_grad_ready(ddp, j));
        ASSERT_OK(tdist_ddp_backward_end(ddp));
        ASSERT_OK(tdist_post_local_optim_step(plo));
        /* tdist's 4-rank sums (steps 0 and 1's gradients, the averages)
         * round in their own order; the differences stay at rounding */
        for (size_t i = 0; i < H4_N; i++) {
            float want = AFTER(k, rank / 2, i);
            if (fabs((double)p[i] - want) > 1e-6 * (fabs(want) + 1e-2))
                FAIL("step %d parameter %zu: tdist %.9g, PyTorch %.9g", k, i, p[i], want);
        }
    }
    ASSERT_EQ(tdist_averager_step(a), H4_STEPS);
    tdist_ddp_destroy(ddp);
    tdist_post_local_destroy(hook);
    tdist_post_local_optim_destroy(plo);
    tdist_averager_destroy(a);
    tdist_optim_destroy(opt);
    tdist_pg_destroy(sub);
    tdist_pg_destroy(pg);
    tdist_world_destroy(w);
}

TEST(averager_pytorch_h4_end_to_end, 90) { tdist_test_run_ranks(H4_RANKS, h4_end_to_end, NULL); }

/* ======================================= 2. hierarchical, 3. optimizer state */

#define HN 3 /* buffers: 0 and 2 averaged, 1 has no gradient */
static const size_t hcnt[HN] = {5, 4, 7};

/* Rank r's value of buffer b element i before step k: dyadic, so every
 * average over 2 or 4 ranks is exact. */
static float hval(int r, int b, size_t i) { return (float)(r * 16 + b * 4) + (float)i / 8.0f; }

static void hier_body(int rank, int n, void *arg)
{
    (void)arg;
    ASSERT_EQ(n, 4);
    tdist_world_t *w;
    tdist_pg_t *pg;
    open_pg(&w, &pg);
    static const tdist_averager_level_t lv[2] = {{2, 2}, {4, 4}};
    tdist_averager_opts_t ao;
    tdist_averager_opts_init(&ao);
    ao.levels = lv;
    ao.num_levels = 2;
    ao.warmup_steps = 2;
    tdist_averager_t *a;
    ASSERT_OK(tdist_hierarchical_averager_create(pg, &ao, &a));
    /* PyTorch's schedule (R4): steps 2 -> 2, 4 -> 4, 6 -> 2, 8 -> 4 */
    static const int want[10] = {0, 0, 2, 0, 4, 0, 2, 0, 4, 0};
    for (int k = 0; k < 10; k++) ASSERT_EQ(tdist_averager_group_size_at(a, k), want[k]);
    float v[HN][8];
    float dummy = 0;
    tdist_optim_param_t op[HN];
    for (int b = 0; b < HN; b++)
        op[b] = (tdist_optim_param_t){v[b], b == 1 ? NULL : &dummy, hcnt[b], NULL};
    for (int k = 0; k < 10; k++) {
        for (int b = 0; b < HN; b++)
            for (size_t i = 0; i < hcnt[b]; i++) v[b][i] = hval(rank, b, i) + (float)k;
        int gs = -1;
        ASSERT_OK(tdist_averager_average(a, op, HN, &gs));
        ASSERT_EQ(gs, want[k]);
        for (int b = 0; b < HN; b++)
            for (size_t i = 0; i < hcnt[b]; i++) {
                float e = hval(rank, b, i) + (float)k;
                if (gs && b != 1) {
                    int first = gs == 2 ? rank & ~1 : 0;
                    e = 0;
                    for (int r = first; r < first + gs; r++) e += hval(r, b, i) / (float)gs;
                    e += (float)k;
                }
                if (v[b][i] != e)
                    FAIL("step %d buffer %d element %zu: %.9g, expected %.9g", k, b, i, v[b][i], e);
            }
    }
    ASSERT_EQ(tdist_averager_step(a), 10);
    ASSERT_OK(tdist_averager_set_step(a, 4));
    ASSERT_EQ(tdist_averager_step(a), 4);
    tdist_averager_destroy(a);
    tdist_pg_destroy(pg);
    tdist_world_destroy(w);
}

TEST(averager_hierarchical_schedule_and_values, 60) { tdist_test_run_ranks(4, hier_body, NULL); }

static void state_body(int rank, int n, void *arg)
{
    (void)arg;
    ASSERT_EQ(n, 4);
    tdist_world_t *w;
    tdist_pg_t *pg;
    open_pg(&w, &pg);
    for (int with = 0; with < 2; with++) {
        float p[6], g[6], m[6];
        for (int i = 0; i < 6; i++) p[i] = 1.0f;
        tdist_optim_param_t op[2] = {{p, g, 4, "a"}, {p + 4, g + 4, 2, "b"}};
        tdist_optim_sgd_opts_t so;
        tdist_optim_sgd_opts_init(&so);
        so.lr = 0.25;
        so.momentum = 0.5;
        tdist_optim_t *opt;
        ASSERT_OK(tdist_optim_create_sgd(op, 2, &so, &opt));
        tdist_averager_opts_t ao;
        tdist_averager_opts_init(&ao);
        ao.period = 2;
        tdist_averager_t *a;
        ASSERT_OK(tdist_periodic_averager_create(pg, &ao, &a));
        tdist_post_local_optim_opts_t oo;
        tdist_post_local_optim_opts_init(&oo);
        oo.average_optimizer_state = with;
        tdist_post_local_optim_t *plo;
        ASSERT_OK(tdist_post_local_optim_create(opt, op, 2, a, &oo, &plo));
        /* step 0 averages (warm-up 0): momentum = this rank's gradient,
         * 4 * rank + i; averaged: 6 + i (exact) */
        for (int i = 0; i < 6; i++) g[i] = (float)(4 * rank + i);
        ASSERT_OK(tdist_post_local_optim_step(plo));
        momentum_of(opt, m, 6);
        for (int i = 0; i < 6; i++) {
            float e = with ? (float)(6 + i) : (float)(4 * rank + i);
            if (m[i] != e) FAIL("option %d: momentum %d: %g, expected %g", with, i, m[i], e);
            float pe = 1.0f - 0.25f * (float)(6 + i); /* the parameters are averaged either way */
            if (p[i] != pe) FAIL("option %d: parameter %d: %g, expected %g", with, i, p[i], pe);
        }
        tdist_post_local_optim_destroy(plo);
        tdist_averager_destroy(a);
        tdist_optim_destroy(opt);
    }
    tdist_pg_destroy(pg);
    tdist_world_destroy(w);
}

TEST(post_local_optim_average_optimizer_state, 60) { tdist_test_run_ranks(4, state_body, NULL); }

/* Adam: with the option, every state array is averaged, so the saved
 * states (step counts, moments, hyperparameters) end equal on every
 * rank; without it they differ (each rank's gradient differs). */
static void adam_state_body(int rank, int n, void *arg)
{
    (void)arg;
    tdist_world_t *w;
    tdist_pg_t *pg;
    open_pg(&w, &pg);
    for (int with = 0; with < 2; with++) {
        float p[5] = {0}, g[5];
        tdist_optim_param_t op[2] = {{p, g, 3, "a"}, {p + 3, g + 3, 2, "b"}};
        tdist_optim_t *opt;
        ASSERT_OK(tdist_optim_create_adam(op, 2, NULL, &opt));
        tdist_averager_opts_t ao;
        tdist_averager_opts_init(&ao);
        ao.period = 1;
        tdist_averager_t *a;
        ASSERT_OK(tdist_periodic_averager_create(pg, &ao, &a));
        tdist_post_local_optim_opts_t oo;
        tdist_post_local_optim_opts_init(&oo);
        oo.average_optimizer_state = with;
        tdist_post_local_optim_t *plo;
        ASSERT_OK(tdist_post_local_optim_create(opt, op, 2, a, &oo, &plo));
        for (int k = 0; k < 3; k++) {
            for (int i = 0; i < 5; i++) g[i] = (float)sin(rank + 0.3 * i + k);
            ASSERT_OK(tdist_post_local_optim_step(plo));
        }
        size_t size;
        ASSERT_OK(tdist_optim_state_size(opt, &size));
        unsigned char *mine = malloc(size), *all = malloc(size * (size_t)n);
        ASSERT_TRUE(mine && all);
        ASSERT_OK(tdist_optim_save(opt, mine, size));
        ASSERT_OK(tdist_all_gather(pg, mine, all, size, TDIST_U8, NULL, NULL));
        bool same = true;
        for (int r = 1; r < n; r++) same = same && memcmp(all, all + (size_t)r * size, size) == 0;
        if (same != (bool)with) FAIL("option %d: the Adam states are %s", with, same ? "equal" : "different");
        free(mine);
        free(all);
        tdist_post_local_optim_destroy(plo);
        tdist_averager_destroy(a);
        tdist_optim_destroy(opt);
    }
    tdist_pg_destroy(pg);
    tdist_world_destroy(w);
}

TEST(post_local_optim_average_adam_state, 60) { tdist_test_run_ranks(3, adam_state_body, NULL); }

/* ================================================================ 4. Join */

#define JN 6
static const int jsteps[4] = {5, 1, 3, 0};

/* What an active rank holds after step k: its own start (8 rank + i),
 * an average over all four (12 + i), or over its pair ({0,1}: 4 + i,
 * {2,3}: 20 + i). */
static float join_expect(bool hier, int rank, int k, int i)
{
    if (!hier) return k == 0 ? (float)(8 * rank + i) : (float)(12 + i);
    if (k == 0) return (float)(8 * rank + i);
    if (k < 4) return (float)((rank < 2 ? 4 : 20) + i);
    return (float)(12 + i);
}

/* lr 0: the steps leave the parameters alone, so each average is the
 * mean of the current values in its group, whoever has joined.
 * Periodic (period 2, warm-up 1): the world at steps 1 and 3.
 * Hierarchical ({1: 2, 4: 4}, warm-up 1): the pairs at steps 1 to 3, the
 * world at step 4; ranks 1 and 3 take part in their pairs' averages from
 * their shadow iterations. */
static void join_body(int rank, int n, void *arg)
{
    bool hier = arg != NULL;
    ASSERT_EQ(n, 4);
    tdist_world_t *w;
    tdist_pg_t *pg;
    open_pg(&w, &pg);
    float p[JN] = {0}, g[JN];
    tdist_ddp_param_t dp = {p, g, JN, TDIST_F32, "w"};
    tdist_ddp_t *ddp;
    ASSERT_OK(tdist_ddp_create(pg, &dp, 1, NULL, 0, NULL, &ddp));
    /* after create, which broadcasts rank 0's parameters: replicas differ */
    for (int i = 0; i < JN; i++) p[i] = (float)(8 * rank + i);
    tdist_optim_param_t op = {p, g, JN, "w"};
    tdist_optim_sgd_opts_t so;
    tdist_optim_sgd_opts_init(&so);
    so.lr = 0;
    tdist_optim_t *opt;
    ASSERT_OK(tdist_optim_create_sgd(&op, 1, &so, &opt));
    static const tdist_averager_level_t lv[2] = {{1, 2}, {4, 4}};
    tdist_averager_opts_t ao;
    tdist_averager_opts_init(&ao);
    ao.warmup_steps = 1;
    tdist_averager_t *a;
    if (hier) {
        ao.levels = lv;
        ao.num_levels = 2;
        ASSERT_OK(tdist_hierarchical_averager_create(pg, &ao, &a));
    } else {
        ao.period = 2;
        ASSERT_OK(tdist_periodic_averager_create(pg, &ao, &a));
    }
    tdist_post_local_optim_t *plo;
    ASSERT_OK(tdist_post_local_optim_create(opt, &op, 1, a, NULL, &plo));
    tdist_joinable_t j[2];
    ASSERT_OK(tdist_ddp_joinable(ddp, &j[0]));
    ASSERT_OK(tdist_post_local_optim_joinable(plo, &j[1]));
    tdist_join_t *jn;
    ASSERT_OK(tdist_join_begin(j, 2, NULL, &jn));
    for (int k = 0; k < jsteps[rank]; k++) {
        ASSERT_OK(tdist_ddp_forward_begin(ddp));
        for (int i = 0; i < JN; i++) g[i] = 1.0f;
        ASSERT_OK(tdist_ddp_grad_ready(ddp, 0));
        ASSERT_OK(tdist_ddp_backward_end(ddp));
        ASSERT_OK(tdist_post_local_optim_step(plo));
        /* rank 1 (joined after step 0) and rank 3 (joined at once)
         * contribute their starting values to the first averages */
        for (int i = 0; i < JN; i++) {
            float e = join_expect(hier, rank, k, i);
            if (p[i] != e) FAIL("step %d element %d: %g, expected %g", k, i, p[i], e);
        }
    }
    ASSERT_OK(tdist_join_end(jn));
    ASSERT_EQ(tdist_averager_step(a), 5); /* every rank took the longest rank's steps */
    for (int i = 0; i < JN; i++) ASSERT_TRUE(p[i] == (float)(12 + i));
    tdist_ddp_destroy(ddp);
    tdist_post_local_optim_destroy(plo);
    tdist_averager_destroy(a);
    tdist_optim_destroy(opt);
    tdist_pg_destroy(pg);
    tdist_world_destroy(w);
}

TEST(post_local_optim_join, 90) { tdist_test_run_ranks(4, join_body, NULL); }
TEST(post_local_optim_join_hierarchical, 90)
{
    static int hier = 1;
    tdist_test_run_ranks(4, join_body, &hier);
}

/* ============================================================== 5. errors */

static void errors_body(int rank, int n, void *arg)
{
    (void)arg;
    ASSERT_EQ(n, 4);
    tdist_world_t *w;
    tdist_pg_t *pg;
    open_pg(&w, &pg);
    tdist_averager_opts_t ao;
    tdist_averager_opts_init(&ao);
    tdist_averager_t *a = NULL;
    ASSERT_STATUS(tdist_periodic_averager_create(pg, &ao, &a), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "opts.period is 0");
    ao.period = 2;
    ao.warmup_steps = -1;
    ASSERT_STATUS(tdist_periodic_averager_create(pg, &ao, &a), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "warmup_steps is -1");
    ASSERT_STATUS(tdist_periodic_averager_create(NULL, &ao, &a), TDIST_ERR_INVALID_ARG);
    ASSERT_STATUS(tdist_hierarchical_averager_create(pg, &ao, &a), TDIST_ERR_INVALID_ARG);
    ao.period = 0;
    ao.warmup_steps = 0;
    ASSERT_STATUS(tdist_hierarchical_averager_create(pg, &ao, &a), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "opts.levels is empty");
    static const tdist_averager_level_t dec[2] = {{4, 2}, {2, 4}}, odd[2] = {{2, 3}, {4, 4}},
                                        last[2] = {{2, 1}, {4, 2}};
    ao.num_levels = 2;
    ao.levels = dec;
    ASSERT_STATUS(tdist_hierarchical_averager_create(pg, &ao, &a), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "strictly increasing");
    ao.levels = odd;
    ASSERT_STATUS(tdist_hierarchical_averager_create(pg, &ao, &a), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "levels[0].group_size is 3");
    ao.levels = last;
    ASSERT_STATUS(tdist_hierarchical_averager_create(pg, &ao, &a), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "last level's group_size is 2");
    ASSERT_TRUE(a == NULL);

    /* the optimizer and the buffers must match */
    float p[4] = {0}, g[4] = {0};
    tdist_optim_param_t op[2] = {{p, g, 2, "a"}, {p + 2, g + 2, 2, "b"}};
    tdist_optim_t *opt;
    ASSERT_OK(tdist_optim_create_sgd(op, 2, NULL, &opt));
    tdist_averager_opts_init(&ao);
    ao.period = rank == 1 ? 3 : 2; /* rank 1 differs */
    ASSERT_OK(tdist_periodic_averager_create(pg, &ao, &a));
    tdist_post_local_optim_t *plo = NULL;
    ASSERT_STATUS(tdist_post_local_optim_create(opt, op, 1, a, NULL, &plo), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "the optimizer has 2 buffers");
    ASSERT_STATUS(tdist_post_local_optim_create(opt, op, 2, NULL, NULL, &plo), TDIST_ERR_INVALID_ARG);

    /* different schedules: every rank fails on the first call, naming both */
    ASSERT_STATUS(tdist_averager_average(a, op, 2, NULL), TDIST_ERR_MISMATCH);
    ASSERT_CONTAINS(tdist_last_error(), "model averager mismatch");
    ASSERT_CONTAINS(tdist_last_error(), "PeriodicModelAverager(period 2, warmup 0, 4 elements)");
    ASSERT_CONTAINS(tdist_last_error(), "PeriodicModelAverager(period 3, warmup 0, 4 elements)");
    ASSERT_EQ(tdist_averager_step(a), 0);
    ASSERT_STATUS(tdist_averager_average(a, op, 2, NULL), TDIST_ERR_MISMATCH); /* sticky */
    tdist_averager_destroy(a);
    tdist_averager_destroy(NULL);
    tdist_post_local_optim_destroy(NULL);
    tdist_optim_destroy(opt);
    /* the group still works */
    ASSERT_OK(tdist_average_parameters(pg, op, 2));
    tdist_pg_destroy(pg);
    tdist_world_destroy(w);
}

TEST(averager_bad_options_and_mismatch, 60) { tdist_test_run_ranks(4, errors_body, NULL); }
