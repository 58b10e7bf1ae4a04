/* tests/algorithms/test_hook_optim.c — hook-then-optimizer and the
 * dividing all_reduce hook.
 *
 * 1. Against PyTorch (oracle_h6.h, 3 ranks x 5 steps,
 *    _hook_then_optimizer(allreduce_hook, SGD momentum)): first the rules
 *    themselves, in C alone: Gloo's ring sum of fl(g / 3) gives PyTorch's
 *    averaged gradients bit for bit, and SGD as PyTorch rounds it
 *    (fmaf(-lr, buf, p)) gives its parameters bit for bit. Then tdist, fed
 *    the recorded local gradients: its averaged gradients agree to
 *    rounding (tdist's 3-rank sum is not Gloo's ring order), its
 *    parameters to 1 ulp (the sum's rounding, carried by momentum; tdist's
 *    SGD itself rounds as PyTorch's, one fmaf).
 * 2. Bit for bit against the plain path: hook-then-optimizer over a hook
 *    equals that hook followed by a full tdist_optim_step of the same
 *    optimizer (parameters, averaged gradients, optimizer state blobs),
 *    with SGD momentum, Adam and AdamW, several buckets, 2 and 3 ranks,
 *    no_sync, find_unused_parameters, gradient_as_bucket_view, and inner
 *    hooks tdist_ddp_allreduce_hook and fp16 compression.
 * 3. Join: ranks with 3, 1 and 0 inputs; the joined ranks' optimizers step
 *    with the averaged gradients too, so parameters and optimizer state are
 *    equal on every rank, and the final parameters equal the plain path's.
 * 4. Options and agreement errors. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "oracle_h6.h"
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

/* ulp distance of two finite floats of the same sign (or both zero). */
static int64_t ulps(float a, float b)
{
    uint32_t x = bits(a), y = bits(b);
    if ((x ^ y) >> 31) return (x << 1 == 0 && y << 1 == 0) ? 0 : INT64_MAX;
    return x > y ? (int64_t)(x - y) : (int64_t)(y - x);
}

/* ==================================================== 1. against PyTorch */

/* Gloo's ring all_reduce (SUM) of v[r][i], r < w: element i in chunk c
 * (chunks of 2s, s = ceil(n / 2w)) is v_c + (v_c+1 + (... + (v_c-2 + v_c-1))). */
static float ring_sum(const float *v, size_t stride, int w, size_t n, size_t i)
{
    size_t s = (n + 2 * (size_t)w - 1) / (2 * (size_t)w);
    int c = (int)(i / (2 * s));
    float acc = v[(size_t)((c + w - 1) % w) * stride + i];
    for (int j = w - 2; j >= 0; j--) acc = v[(size_t)((c + j) % w) * stride + i] + acc;
    return acc;
}

/* pos[i]: where element i (parameter order) sits in step k's bucket. */
static void h6_positions(int k, size_t *pos)
{
    size_t off[H6_NPARAMS], at = 0;
    for (size_t j = 0; j < H6_NPARAMS; j++) off[j] = j ? off[j - 1] + h6_counts[j - 1] : 0;
    for (size_t j = 0; j < H6_NPARAMS; j++) {
        int p = h6_order[k][j];
        for (size_t e = 0; e < h6_counts[p]; e++) pos[off[p] + e] = at++;
    }
}

/* The rules, in C alone: the ring of fl(g / 3) over the bucket and
 * PyTorch's SGD rebuild every recorded gradient and parameter. */
static void h6_check_rules(void)
{
    static float q[H6_RANKS][H6_N], p[H6_N], buf[H6_N];
    static size_t pos[H6_N];
    for (size_t i = 0; i < H6_N; i++) p[i] = f32(h6_init[i]);
    for (int k = 0; k < H6_STEPS; k++) {
        h6_positions(k, pos);
        for (int r = 0; r < H6_RANKS; r++)
            for (size_t i = 0; i < H6_N; i++) q[r][pos[i]] = f32(H6_LOCAL(r, k, i)) / 3.0f;
        for (size_t i = 0; i < H6_N; i++) {
            float g = ring_sum(&q[0][0], H6_N, H6_RANKS, H6_N, pos[i]);
            if (bits(g) != H6_GRAD(k, i))
                FAIL("rule check: step %d grad %zu: ring 0x%08x, PyTorch 0x%08x", k, i, bits(g),
                     H6_GRAD(k, i));
            buf[i] = k == 0 ? g : buf[i] * 0.9f + g;
            p[i] = fmaf(-0.1f, buf[i], p[i]);
            if (bits(p[i]) != H6_PARAM(k, i))
                FAIL("rule check: step %d param %zu: 0x%08x, PyTorch 0x%08x", k, i, bits(p[i]),
                     H6_PARAM(k, i));
        }
    }
}

static void h6_body(int rank, int n, void *arg)
{
    (void)arg;
    ASSERT_EQ(n, H6_RANKS);
    h6_check_rules();
    static float p[H6_N], g[H6_N];
    for (size_t i = 0; i < H6_N; i++) p[i] = f32(h6_init[i]);
    tdist_world_t *w;
    tdist_pg_t *pg;
    open_pg(&w, &pg);
    tdist_ddp_param_t params[H6_NPARAMS];
    tdist_optim_param_t op[H6_NPARAMS];
    for (size_t j = 0, off = 0; j < H6_NPARAMS; off += h6_counts[j], j++) {
        params[j] = (tdist_ddp_param_t){p + off, g + off, h6_counts[j], TDIST_F32, h6_names[j]};
        op[j] = (tdist_optim_param_t){p + off, g + off, h6_counts[j], h6_names[j]};
    }
    tdist_ddp_t *ddp;
    ASSERT_OK(tdist_ddp_create(pg, params, H6_NPARAMS, NULL, 0, NULL, &ddp));
    tdist_optim_sgd_opts_t so;
    tdist_optim_sgd_opts_init(&so);
    so.lr = H6_LR;
    so.momentum = H6_MOMENTUM;
    tdist_optim_t *opt;
    ASSERT_OK(tdist_optim_create_sgd(op, H6_NPARAMS, &so, &opt));
    tdist_hook_optim_t *h;
    ASSERT_OK(tdist_hook_optim_create(opt, NULL, &h)); /* PyTorch's allreduce_hook */
    ASSERT_OK(tdist_hook_optim_register(ddp, h));
    int64_t worst_g = 0, worst_p = 0;
    for (int k = 0; k < H6_STEPS; k++) {
        ASSERT_OK(tdist_ddp_forward_begin(ddp));
        for (size_t i = 0; i < H6_N; i++) g[i] = f32(H6_LOCAL(rank, k, i));
        for (size_t j = H6_NPARAMS; j-- > 0;) ASSERT_OK(tdist_ddp_grad_ready(ddp, j));
        ASSERT_OK(tdist_ddp_backward_end(ddp)); /* steps the parameters: no optim_step */
        for (size_t i = 0; i < H6_N; i++) {
            float want = f32(H6_GRAD(k, i));
            double scale = 0; /* the sum's rounding: a few ulp of its largest term */
            for (int r = 0; r < H6_RANKS; r++) scale += fabs(f32(H6_LOCAL(r, k, i)) / 3.0);
            if (fabs((double)g[i] - want) > 4 * 6e-8 * scale)
                FAIL("step %d grad %zu: tdist %.9g, PyTorch %.9g", k, i, g[i], want);
            int64_t du = ulps(g[i], want), dp = ulps(p[i], f32(H6_PARAM(k, i)));
            if (du > worst_g && du != INT64_MAX) worst_g = du;
            if (dp > 1)
                FAIL("step %d param %zu: tdist 0x%08x, PyTorch 0x%08x (%lld ulp, more than 1)", k, i, bits(p[i]),
                     H6_PARAM(k, i), (long long)dp);
            if (dp > worst_p) worst_p = dp;
        }
    }
    if (rank == 0)
        fprintf(stderr, "note: against PyTorch: averaged gradients within %lld ulp, parameters "
                        "within %lld ulp\n", (long long)worst_g, (long long)worst_p);
    tdist_ddp_destroy(ddp);
    tdist_hook_optim_destroy(h);
    tdist_optim_destroy(opt);
    tdist_pg_destroy(pg);
    tdist_world_destroy(w);
}

TEST(hook_optim_pytorch_h6_3_ranks, 90) { tdist_test_run_ranks(H6_RANKS, h6_body, NULL); }

/* ================================================= 2. against the plain path */

#define NP 5
static const size_t cnt[NP] = {300, 17, 64, 5, 129};
static const char *const pname[NP] = {"w0", "b0", "w1", "b1", "w2"};
#define P_RANK0 1 /* find_unused: used on rank 0 only */
#define P_NONE 3  /* find_unused: used nowhere */
#define STEPS 4

typedef enum inner { IN_DIV = 0, IN_PREMUL, IN_FP16 } inner_t;

typedef struct scen {
    tdist_optim_kind_t kind;
    inner_t inner;
    bool no_sync, find_unused, view;
} scen_t;

/* One replica of the model: parameters, gradients, reducer, optimizer. */
typedef struct replica {
    float *p[NP], *g[NP];
    tdist_ddp_t *ddp;
    tdist_optim_t *opt;
    tdist_hook_optim_t *h;
    tdist_compress_t *c;
} replica_t;

static float gval(int rank, int k, int m, int p, size_t i)
{
    double mag = (p % 2) ? 1e-3 : 0.5;
    return (float)(mag * sin(1.3 * (double)i + 0.7 * p + 2.1 * rank + 0.37 * k + 0.11 * m + 0.5));
}

static bool used(const scen_t *sc, int r, int p)
{
    if (!sc->find_unused) return true;
    return p != P_NONE && (p != P_RANK0 || r == 0);
}

static float *grad_of(const scen_t *sc, replica_t *rp, int p)
{
    return sc->view ? tdist_ddp_grad_ptr(rp->ddp, (size_t)p) : rp->g[p];
}

static tdist_optim_t *make_optim(tdist_optim_kind_t kind, const tdist_optim_param_t *op)
{
    tdist_optim_t *o = NULL;
    if (kind == TDIST_OPTIM_SGD) {
        tdist_optim_sgd_opts_t so;
        tdist_optim_sgd_opts_init(&so);
        so.lr = 0.05;
        so.momentum = 0.9;
        so.weight_decay = 1e-3;
        ASSERT_OK(tdist_optim_create_sgd(op, NP, &so, &o));
    } else {
        tdist_optim_adam_opts_t ao;
        if (kind == TDIST_OPTIM_ADAM) tdist_optim_adam_opts_init(&ao);
        else tdist_optim_adamw_opts_init(&ao);
        ao.lr = 1e-2;
        if (kind == TDIST_OPTIM_ADAM) ASSERT_OK(tdist_optim_create_adam(op, NP, &ao, &o));
        else ASSERT_OK(tdist_optim_create_adamw(op, NP, &ao, &o));
    }
    return o;
}

/* Point the optimizer at where the gradients live now (bucket views move
 * at the first backward_end's rebuild). */
static void repoint(const scen_t *sc, replica_t *rp)
{
    for (int p = 0; p < NP; p++) ASSERT_OK(tdist_optim_set_grad(rp->opt, (size_t)p, grad_of(sc, rp, p)));
}

/* A replica over pg; hooked: hook-then-optimizer, else the inner hook alone. */
static void replica_init(replica_t *rp, const scen_t *sc, tdist_pg_t *pg, bool hooked)
{
    memset(rp, 0, sizeof *rp);
    tdist_ddp_param_t dp[NP];
    tdist_optim_param_t op[NP];
    for (int p = 0; p < NP; p++) {
        rp->p[p] = calloc(cnt[p], sizeof(float));
        rp->g[p] = calloc(cnt[p], sizeof(float));
        ASSERT_TRUE(rp->p[p] && rp->g[p]);
        for (size_t i = 0; i < cnt[p]; i++) rp->p[p][i] = (float)(0.3 * cos(0.9 * (double)i + p));
        dp[p] = (tdist_ddp_param_t){rp->p[p], rp->g[p], cnt[p], TDIST_F32, pname[p]};
    }
    tdist_ddp_opts_t o;
    tdist_ddp_opts_init(&o);
    o.bucket_cap_bytes = o.first_bucket_bytes = 400;
    o.find_unused_parameters = sc->find_unused;
    o.gradient_as_bucket_view = sc->view;
    ASSERT_OK(tdist_ddp_create(pg, dp, NP, NULL, 0, &o, &rp->ddp));
    ASSERT_TRUE(tdist_ddp_num_buckets(rp->ddp) >= 3);
    for (int p = 0; p < NP; p++) op[p] = (tdist_optim_param_t){rp->p[p], grad_of(sc, rp, p), cnt[p], pname[p]};
    rp->opt = make_optim(sc->kind, op);
    tdist_ddp_comm_hook_fn fn = sc->inner == IN_DIV ? tdist_allreduce_div_hook
                                : sc->inner == IN_PREMUL ? tdist_ddp_allreduce_hook : tdist_compress_hook;
    if (sc->inner == IN_FP16) ASSERT_OK(tdist_compress_hook_create(NULL, &rp->c));
    if (!hooked) {
        ASSERT_OK(tdist_ddp_register_comm_hook(rp->ddp, rp->c, fn));
        return;
    }
    tdist_hook_optim_opts_t ho;
    tdist_hook_optim_opts_init(&ho);
    ho.hook = fn;
    ho.hook_state = rp->c;
    ASSERT_OK(tdist_hook_optim_create(rp->opt, &ho, &rp->h));
    ASSERT_OK(tdist_hook_optim_register(rp->ddp, rp->h));
}

static void replica_fini(replica_t *rp)
{
    tdist_ddp_destroy(rp->ddp);
    tdist_hook_optim_destroy(rp->h);
    tdist_compress_destroy(rp->c);
    tdist_optim_destroy(rp->opt);
    for (int p = 0; p < NP; p++) {
        free(rp->p[p]);
        free(rp->g[p]);
    }
}

/* One training step: micro-batches (all but the last under no_sync); the
 * model zeroes its gradients first and adds each micro-batch's. */
static void run_step(const scen_t *sc, replica_t *rp, int rank, int k)
{
    int micro = sc->no_sync ? 3 : 1;
    for (int m = 0; m < micro; m++) {
        ASSERT_OK(tdist_ddp_set_no_sync(rp->ddp, m + 1 < micro));
        ASSERT_OK(tdist_ddp_forward_begin(rp->ddp));
        if (m == 0)
            for (int p = 0; p < NP; p++) memset(grad_of(sc, rp, p), 0, cnt[p] * sizeof(float));
        for (int p = NP; p-- > 0;) {
            if (!used(sc, rank, p)) continue;
            float *g = grad_of(sc, rp, p);
            for (size_t i = 0; i < cnt[p]; i++) g[i] += gval(rank, k, m, p, i);
            ASSERT_OK(tdist_ddp_grad_ready(rp->ddp, (size_t)p));
        }
        ASSERT_OK(tdist_ddp_backward_end(rp->ddp));
    }
}

/* The optimizer's state blob (caller frees). */
static unsigned char *blob_of(const tdist_optim_t *o, size_t *size)
{
    ASSERT_OK(tdist_optim_state_size(o, size));
    unsigned char *b = malloc(*size);
    ASSERT_TRUE(b != NULL);
    ASSERT_OK(tdist_optim_save(o, b, *size));
    return b;
}

static void expect_same(const scen_t *sc, replica_t *a, replica_t *b, int k)
{
    for (int p = 0; p < NP; p++) {
        const float *ga = grad_of(sc, a, p), *gb = grad_of(sc, b, p);
        for (size_t i = 0; i < cnt[p]; i++) {
            if (bits(a->p[p][i]) != bits(b->p[p][i]))
                FAIL("step %d '%s'[%zu]: hook-then-optimizer 0x%08x, plain 0x%08x", k, pname[p], i,
                     bits(a->p[p][i]), bits(b->p[p][i]));
            if (bits(ga[i]) != bits(gb[i]))
                FAIL("step %d '%s'[%zu]: averaged gradient 0x%08x vs 0x%08x", k, pname[p], i,
                     bits(ga[i]), bits(gb[i]));
        }
    }
    size_t na, nb;
    unsigned char *ba = blob_of(a->opt, &na), *bb = blob_of(b->opt, &nb);
    ASSERT_EQ(na, nb);
    if (memcmp(ba, bb, na) != 0) FAIL("step %d: the optimizers' states differ", k);
    free(ba);
    free(bb);
}

/* Every rank holds rank 0's parameters (checked with one all_gather). */
static void expect_equal_across(tdist_pg_t *pg, replica_t *rp, int n)
{
    size_t total = 0;
    for (int p = 0; p < NP; p++) total += cnt[p];
    float *mine = malloc(total * sizeof(float)), *all = malloc(total * (size_t)n * sizeof(float));
    ASSERT_TRUE(mine && all);
    for (int p = 0, off = 0; p < NP; off += (int)cnt[p], p++) memcpy(mine + off, rp->p[p], cnt[p] * sizeof(float));
    ASSERT_OK(tdist_all_gather(pg, mine, all, total, TDIST_F32, NULL, NULL));
    for (int r = 1; r < n; r++)
        if (memcmp(all, all + (size_t)r * total, total * sizeof(float)) != 0)
            FAIL("rank %d's parameters differ from rank 0's", r);
    free(mine);
    free(all);
}

static void plain_body(int rank, int n, void *arg)
{
    const scen_t *sc = arg;
    tdist_world_t *w;
    tdist_pg_t *pg;
    open_pg(&w, &pg);
    static replica_t a, b;
    replica_init(&a, sc, pg, true);
    replica_init(&b, sc, pg, false);
    for (int k = 0; k < STEPS; k++) {
        run_step(sc, &a, rank, k);
        run_step(sc, &b, rank, k);
        repoint(sc, &b);
        ASSERT_OK(tdist_optim_step(b.opt));
        expect_same(sc, &a, &b, k);
        uint64_t steps;
        ASSERT_OK(tdist_optim_step_count(a.opt, 0, &steps));
        ASSERT_EQ(steps, (uint64_t)k + 1);
    }
    expect_equal_across(pg, &a, n);
    replica_fini(&a);
    replica_fini(&b);
    tdist_pg_destroy(pg);
    tdist_world_destroy(w);
}

#define PLAIN(name, ranks, ...)                                                          \
    static void name##_run(void)                                                         \
    {                                                                                    \
        static const scen_t sc = {__VA_ARGS__};                                          \
        tdist_test_run_ranks(ranks, plain_body, (void *)&sc);                            \
    }

PLAIN(sgd2, 2, TDIST_OPTIM_SGD, IN_DIV, false, false, false)
PLAIN(sgd3, 3, TDIST_OPTIM_SGD, IN_DIV, false, false, false)
PLAIN(adam2, 2, TDIST_OPTIM_ADAM, IN_DIV, false, false, false)
PLAIN(adam3, 3, TDIST_OPTIM_ADAM, IN_PREMUL, false, false, false)
PLAIN(adamw2, 2, TDIST_OPTIM_ADAMW, IN_PREMUL, false, false, false)
PLAIN(adamw3, 3, TDIST_OPTIM_ADAMW, IN_DIV, false, false, false)
PLAIN(nosync, 2, TDIST_OPTIM_SGD, IN_DIV, true, false, false)
PLAIN(unused, 3, TDIST_OPTIM_ADAM, IN_DIV, false, true, false)
PLAIN(view, 2, TDIST_OPTIM_ADAMW, IN_DIV, false, false, true)
PLAIN(all3, 3, TDIST_OPTIM_SGD, IN_DIV, true, true, true)
PLAIN(fp16, 2, TDIST_OPTIM_SGD, IN_FP16, false, true, true)

TEST(hook_optim_sgd_momentum_2_ranks, 60) { sgd2_run(); }
TEST(hook_optim_sgd_momentum_3_ranks, 60) { sgd3_run(); }
TEST(hook_optim_adam_2_ranks, 60) { adam2_run(); }
TEST(hook_optim_adam_3_ranks_premul_hook, 60) { adam3_run(); }
TEST(hook_optim_adamw_2_ranks_premul_hook, 60) { adamw2_run(); }
TEST(hook_optim_adamw_3_ranks, 60) { adamw3_run(); }
TEST(hook_optim_no_sync, 60) { nosync_run(); }
TEST(hook_optim_find_unused, 60) { unused_run(); }
TEST(hook_optim_bucket_view, 60) { view_run(); }
TEST(hook_optim_no_sync_find_unused_bucket_view_3_ranks, 60) { all3_run(); }
TEST(hook_optim_around_fp16_compression, 60) { fp16_run(); }

/* ================================================================ 3. Join */

static const int join_counts[3] = {3, 1, 0};

/* One Join over rp: this rank's join_counts[rank] steps, then join_end;
 * the plain replica steps its optimizer after each of its own steps. */
static void join_run(const scen_t *sc, replica_t *rp, bool hooked, int rank)
{
    tdist_joinable_t j;
    ASSERT_OK(tdist_ddp_joinable(rp->ddp, &j));
    tdist_join_t *join;
    ASSERT_OK(tdist_join_begin(&j, 1, NULL, &join));
    for (int k = 0; k < join_counts[rank]; k++) {
        run_step(sc, rp, rank, k);
        if (!hooked) ASSERT_OK(tdist_optim_step(rp->opt));
    }
    ASSERT_OK(tdist_join_end(join));
}

static void join_body(int rank, int n, void *arg)
{
    (void)arg;
    ASSERT_EQ(n, 3);
    static const scen_t sc = {TDIST_OPTIM_SGD, IN_DIV, false, false, false};
    tdist_world_t *w;
    tdist_pg_t *pg;
    open_pg(&w, &pg);
    static replica_t a, b;
    replica_init(&a, &sc, pg, true);
    replica_init(&b, &sc, pg, false);
    join_run(&sc, &b, false, rank);
    join_run(&sc, &a, true, rank);
    /* the last joiner's parameters, equal in both runs */
    for (int p = 0; p < NP; p++)
        for (size_t i = 0; i < cnt[p]; i++)
            if (bits(a.p[p][i]) != bits(b.p[p][i]))
                FAIL("'%s'[%zu]: hook-then-optimizer 0x%08x, plain 0x%08x", pname[p], i,
                     bits(a.p[p][i]), bits(b.p[p][i]));
    /* every optimizer stepped 3 times, with the same gradients: equal state */
    uint64_t steps;
    ASSERT_OK(tdist_optim_step_count(a.opt, 0, &steps));
    ASSERT_EQ(steps, 3);
    size_t sz;
    unsigned char *blob = blob_of(a.opt, &sz);
    unsigned char *all = malloc(sz * 3);
    ASSERT_TRUE(all != NULL);
    ASSERT_OK(tdist_all_gather(pg, blob, all, sz, TDIST_U8, NULL, NULL));
    for (int r = 1; r < 3; r++)
        if (memcmp(all, all + (size_t)r * sz, sz) != 0) FAIL("rank %d's optimizer state differs", r);
    free(all);
    free(blob);
    replica_fini(&a);
    replica_fini(&b);
    tdist_pg_destroy(pg);
    tdist_world_destroy(w);
}

TEST(hook_optim_join_joined_ranks_step_too, 90) { tdist_test_run_ranks(3, join_body, NULL); }

/* ======================================================= 4. options, errors */

static tdist_status_t custom_hook(void *state, const tdist_ddp_bucket_t *b, tdist_ddp_hook_result_t *res)
{
    return tdist_allreduce_div_hook(state, b, res);
}

TEST(hook_optim_create_rejects_bad_options, 30)
{
    float p[4] = {0}, g[4] = {0};
    tdist_optim_param_t op = {p, g, 4, "x"};
    tdist_optim_t *opt;
    ASSERT_OK(tdist_optim_create_sgd(&op, 1, NULL, &opt));
    tdist_hook_optim_t *h = NULL;
    ASSERT_STATUS(tdist_hook_optim_create(NULL, NULL, &h), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "optim is NULL");
    ASSERT_STATUS(tdist_hook_optim_create(opt, NULL, NULL), TDIST_ERR_INVALID_ARG);
    tdist_hook_optim_opts_t ho;
    tdist_hook_optim_opts_init(&ho);
    ho.hook = custom_hook;
    ASSERT_STATUS(tdist_hook_optim_create(opt, &ho, &h), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "hook_name is NULL");
    ho.hook_name = "";
    ASSERT_STATUS(tdist_hook_optim_create(opt, &ho, &h), TDIST_ERR_INVALID_ARG);
    ho.hook = tdist_hook_optim;
    ho.hook_name = "x";
    ASSERT_STATUS(tdist_hook_optim_create(opt, &ho, &h), TDIST_ERR_INVALID_ARG);
    ASSERT_TRUE(h == NULL);
    ho.hook = custom_hook;
    ASSERT_OK(tdist_hook_optim_create(opt, &ho, &h));
    ASSERT_STATUS(tdist_hook_optim_register(NULL, h), TDIST_ERR_INVALID_ARG);
    /* not registered: the hook refuses before communicating */
    tdist_ddp_hook_result_t res = {0};
    tdist_ddp_bucket_t b = {0};
    ASSERT_STATUS(tdist_hook_optim(h, &b, &res), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "bucket->pg is NULL");
    tdist_hook_optim_destroy(h);
    tdist_hook_optim_destroy(NULL);
    tdist_optim_destroy(opt);
}

/* Rank 0 steps SGD, rank 1 Adam: both fail, naming both, before any
 * gradient is sent; nothing steps. Also a buffer-count mismatch at
 * register and a hook called on a state that was never registered. */
static void mismatch_body(int rank, int n, void *arg)
{
    (void)arg;
    ASSERT_EQ(n, 2);
    static const scen_t sc = {TDIST_OPTIM_SGD, IN_DIV, false, false, false};
    tdist_world_t *w;
    tdist_pg_t *pg;
    open_pg(&w, &pg);
    static replica_t a;
    scen_t mine = sc;
    mine.kind = rank == 0 ? TDIST_OPTIM_SGD : TDIST_OPTIM_ADAM;
    replica_init(&a, &mine, pg, true);
    float before = a.p[0][0];
    ASSERT_OK(tdist_ddp_forward_begin(a.ddp));
    for (int p = NP; p-- > 0;) {
        (void)tdist_ddp_grad_ready(a.ddp, (size_t)p);
    }
    ASSERT_STATUS(tdist_ddp_backward_end(a.ddp), TDIST_ERR_MISMATCH);
    ASSERT_CONTAINS(tdist_last_error(), "comm hook mismatch");
    ASSERT_CONTAINS(tdist_last_error(), "hook_then_optimizer(allreduce_hook, sgd");
    ASSERT_CONTAINS(tdist_last_error(), "hook_then_optimizer(allreduce_hook, adam");
    ASSERT_EQ(bits(a.p[0][0]), bits(before));
    replica_fini(&a);

    /* an optimizer over fewer buffers than the reducer has parameters */
    float p[4] = {0}, g[4] = {0};
    tdist_optim_param_t op = {p, g, 4, "x"};
    tdist_optim_t *opt;
    ASSERT_OK(tdist_optim_create_sgd(&op, 1, NULL, &opt));
    tdist_ddp_param_t dp[2] = {{p, g, 2, TDIST_F32, "a"}, {p + 2, g + 2, 2, TDIST_F32, "b"}};
    tdist_ddp_t *ddp;
    ASSERT_OK(tdist_ddp_create(pg, dp, 2, NULL, 0, NULL, &ddp));
    tdist_hook_optim_t *h;
    ASSERT_OK(tdist_hook_optim_create(opt, NULL, &h));
    ASSERT_STATUS(tdist_hook_optim_register(ddp, h), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "1 buffers but the reducer has 2 parameters");
    tdist_ddp_bucket_t b = {.count = 4, .buffer = g, .dtype = TDIST_F32, .divisor = 2, .pg = pg,
                            .iteration = 1};
    tdist_ddp_hook_result_t res = {0};
    ASSERT_STATUS(tdist_hook_optim(h, &b, &res), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "not registered with tdist_hook_optim_register");
    ASSERT_CONTAINS(tdist_last_error(), "iteration 1 bucket 0");
    tdist_hook_optim_destroy(h);
    tdist_ddp_destroy(ddp);
    tdist_optim_destroy(opt);
    tdist_pg_destroy(pg);
    tdist_world_destroy(w);
}

TEST(hook_optim_mismatch_and_register_errors, 60) { tdist_test_run_ranks(2, mismatch_body, NULL); }
