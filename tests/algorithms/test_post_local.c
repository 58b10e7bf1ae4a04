/* tests/algorithms/test_post_local.c — the post-local-SGD hook.
 *
 * 1. Against PyTorch (oracle_h4.h: 4 ranks x 8 steps, start_localSGD_iter
 *    2, subgroups {0,1}, {2,3}; the hook's part of the recording): first
 *    the rules in C alone (Gloo's ring of fl(g / 4) over the bucket, then
 *    fl(g_a / 2) + fl(g_b / 2)); then tdist fed the recorded local
 *    gradients: the 2-rank subgroup averages bit for bit, the 4-rank
 *    global ones to rounding (tdist's sum order is not Gloo's ring), and
 *    the iteration counter as PyTorch's state.iter.
 * 2. The reducer's options: no_sync (accumulated micro-batches; no_sync
 *    iterations do not count), find_unused_parameters (a parameter used on
 *    rank 0 only, one used nowhere), gradient_as_bucket_view, several
 *    buckets; post_local_gradient_allreduce false (no averaging after the
 *    switch). Exact: at most two non-zero terms per sum, or dyadic values.
 * 3. Join: ranks with 4, 2, 3 and 0 inputs; joined ranks run the hook on
 *    zeros, their shadow iterations count, every rank switches together.
 * 4. Options and agreement errors. */
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

/* pos[i]: where element i sits in step k's bucket (parameter order in
 * step 0, reversed after). */
static void h4_positions(int k, size_t *pos)
{
    size_t off[H4_NPARAMS], at = 0;
    for (size_t j = 0; j < H4_NPARAMS; j++) off[j] = j ? off[j - 1] + h4_counts[j - 1] : 0;
    for (size_t j = 0; j < H4_NPARAMS; j++) {
        size_t p = k == 0 ? j : H4_NPARAMS - 1 - j;
        for (size_t e = 0; e < h4_counts[p]; e++) pos[off[p] + e] = at++;
    }
}

static void h4_check_rules(void)
{
    static float q[H4_RANKS][H4_N];
    static size_t pos[H4_N];
    for (int k = 0; k < H4_STEPS; k++) {
        h4_positions(k, pos);
        int w = k < H4_START ? 4 : 2;
        for (int r = 0; r < H4_RANKS; r++)
            for (size_t i = 0; i < H4_N; i++) q[r][pos[i]] = f32(H4_LOCAL(r, k, i)) / (float)w;
        for (int g = 0; g < H4_GROUPS; g++)
            for (size_t i = 0; i < H4_N; i++) {
                float s = k < H4_START ? ring_sum(&q[0][0], H4_N, 4, H4_N, pos[i])
                                       : ring_sum(&q[2 * g][0], H4_N, 2, H4_N, pos[i]);
                if (bits(s) != H4_GRAD(k, g, i))
                    FAIL("rule check: step %d subgroup %d grad %zu: 0x%08x, PyTorch 0x%08x", k, g,
                         i, bits(s), H4_GRAD(k, g, i));
            }
    }
}

static void h4_body(int rank, int n, void *arg)
{
    (void)arg;
    ASSERT_EQ(n, H4_RANKS);
    h4_check_rules();
    static float p[H4_N], g[H4_N];
    tdist_world_t *w;
    tdist_pg_t *pg, *sub;
    open_pg(&w, &pg);
    ASSERT_OK(tdist_pg_split(pg, rank / 2, rank, NULL, &sub));
    tdist_ddp_param_t params[H4_NPARAMS];
    for (size_t j = 0, off = 0; j < H4_NPARAMS; off += h4_counts[j], j++)
        params[j] = (tdist_ddp_param_t){p + off, g + off, h4_counts[j], TDIST_F32, h4_names[j]};
    tdist_ddp_t *ddp;
    ASSERT_OK(tdist_ddp_create(pg, params, H4_NPARAMS, NULL, 0, NULL, &ddp));
    tdist_post_local_opts_t po;
    tdist_post_local_opts_init(&po);
    po.subgroup = sub;
    po.start_localSGD_iter = H4_START;
    tdist_post_local_t *s;
    ASSERT_OK(tdist_post_local_create(&po, &s));
    ASSERT_OK(tdist_post_local_register(ddp, s));
    for (int k = 0; k < H4_STEPS; k++) {
        ASSERT_OK(tdist_ddp_forward_begin(ddp));
        for (size_t i = 0; i < H4_N; i++) g[i] = f32(H4_LOCAL(rank, k, i));
        for (size_t j = H4_NPARAMS; j-- > 0;) ASSERT_OK(tdist_ddp_grad_ready(ddp, j));
        ASSERT_OK(tdist_ddp_backward_end(ddp));
        for (size_t i = 0; i < H4_N; i++) {
            float want = f32(H4_GRAD(k, rank / 2, i));
            if (k >= H4_START) {
                if (bits(g[i]) != bits(want))
                    FAIL("step %d grad %zu: tdist 0x%08x, PyTorch 0x%08x (subgroup: bit for bit)",
                         k, i, bits(g[i]), bits(want));
                continue;
            }
            double scale = 0;
            for (int r = 0; r < H4_RANKS; r++) scale += fabs(f32(H4_LOCAL(r, k, i)) / 4.0);
            if (fabs((double)g[i] - want) > 4 * 6e-8 * scale)
                FAIL("step %d grad %zu: tdist %.9g, PyTorch %.9g", k, i, g[i], want);
        }
        int64_t it;
        ASSERT_OK(tdist_post_local_iter(s, &it));
        ASSERT_EQ(it, h4_iter_after[k]);
    }
    tdist_ddp_destroy(ddp);
    tdist_post_local_destroy(s);
    tdist_pg_destroy(sub);
    tdist_pg_destroy(pg);
    tdist_world_destroy(w);
}

TEST(post_local_pytorch_h4_4_ranks, 90) { tdist_test_run_ranks(H4_RANKS, h4_body, NULL); }

/* ============================================ 2. reducer options, 3. Join */

#define NP 4
static const size_t cnt[NP] = {200, 9, 64, 5};
static const char *const pname[NP] = {"w0", "b0", "w1", "b1"};
#define P_RANK0 1 /* find_unused: used on rank 0 only */
#define P_NONE 3  /* find_unused: used nowhere */
#define SENTINEL 42.0f
#define STEPS 4
#define START 2

typedef struct scen {
    bool no_sync, find_unused, view, allreduce_after;
    int counts[4]; /* Join: inputs per rank; all 0: no Join */
} scen_t;

/* Gradients that sum exactly in any order: multiples of 1/64 below 8, so
 * every average of up to 4 of them (divided by 2 or 4) is exact. */
static float gval(int rank, int k, int m, int p, size_t i)
{
    return (float)((int)((i * 7 + (size_t)p * 5 + (size_t)rank * 11 + (size_t)k * 3 + (size_t)m) % 97) - 48) / 64.0f;
}

static bool used(const scen_t *sc, int r, int p)
{
    if (!sc->find_unused) return true;
    return p != P_NONE && (p != P_RANK0 || r == 0);
}

static bool active(const scen_t *sc, int r, int k)
{
    bool join = sc->counts[0] || sc->counts[1] || sc->counts[2] || sc->counts[3];
    return !join || k < sc->counts[r];
}

/* Rank r's gradient after the micro-batches of step k (0 when unused or
 * joined). */
static float local(const scen_t *sc, int r, int k, int p, size_t i)
{
    if (!used(sc, r, p) || !active(sc, r, k)) return 0.0f;
    int micro = sc->no_sync ? 3 : 1;
    float v = 0;
    for (int m = 0; m < micro; m++) v += gval(r, k, m, p, i);
    return v;
}

static float expected(const scen_t *sc, int rank, int k, int p, size_t i)
{
    if (sc->find_unused && p == P_NONE) return SENTINEL;
    if (k < START) {
        float s = 0;
        for (int r = 0; r < 4; r++) s += local(sc, r, k, p, i) / 4.0f;
        return s;
    }
    if (!sc->allreduce_after) return local(sc, rank, k, p, i);
    int a = rank & ~1;
    return local(sc, a, k, p, i) / 2.0f + local(sc, a + 1, k, p, i) / 2.0f;
}

static void run_step(const scen_t *sc, tdist_ddp_t *ddp, float **g, int rank, int k)
{
    int micro = sc->no_sync ? 3 : 1;
    for (int m = 0; m < micro; m++) {
        ASSERT_OK(tdist_ddp_set_no_sync(ddp, m + 1 < micro));
        ASSERT_OK(tdist_ddp_forward_begin(ddp));
        for (int p = NP; p-- > 0;) {
            if (!used(sc, rank, p)) continue;
            float *gp = sc->view ? tdist_ddp_grad_ptr(ddp, (size_t)p) : g[p];
            for (size_t i = 0; i < cnt[p]; i++) gp[i] = (m ? gp[i] : 0.0f) + gval(rank, k, m, p, i);
            ASSERT_OK(tdist_ddp_grad_ready(ddp, (size_t)p));
        }
        ASSERT_OK(tdist_ddp_backward_end(ddp));
    }
}

static void check_step(const scen_t *sc, tdist_ddp_t *ddp, float **g, int rank, int k)
{
    for (int p = 0; p < NP; p++) {
        const float *gp = sc->view ? tdist_ddp_grad_ptr(ddp, (size_t)p) : g[p];
        for (size_t i = 0; i < cnt[p]; i++) {
            float want = expected(sc, rank, k, p, i);
            if (bits(gp[i]) != bits(want) && !(gp[i] == 0 && want == 0))
                FAIL("step %d '%s'[%zu]: %.9g, expected %.9g", k, pname[p], i, gp[i], want);
        }
    }
}

static void opt_body(int rank, int n, void *arg)
{
    const scen_t *sc = arg;
    ASSERT_EQ(n, 4);
    tdist_world_t *w;
    tdist_pg_t *pg, *sub;
    open_pg(&w, &pg);
    ASSERT_OK(tdist_pg_split(pg, rank / 2, rank, NULL, &sub));
    static float *pv[NP], *g[NP];
    tdist_ddp_param_t dp[NP];
    for (int p = 0; p < NP; p++) {
        pv[p] = calloc(cnt[p], sizeof(float));
        g[p] = calloc(cnt[p], sizeof(float));
        ASSERT_TRUE(pv[p] && g[p]);
        if (p == P_NONE) for (size_t i = 0; i < cnt[p]; i++) g[p][i] = SENTINEL;
        dp[p] = (tdist_ddp_param_t){pv[p], g[p], cnt[p], TDIST_F32, pname[p]};
    }
    tdist_ddp_opts_t o;
    tdist_ddp_opts_init(&o);
    o.bucket_cap_bytes = o.first_bucket_bytes = 300;
    o.find_unused_parameters = sc->find_unused;
    o.gradient_as_bucket_view = sc->view;
    tdist_ddp_t *ddp;
    ASSERT_OK(tdist_ddp_create(pg, dp, NP, NULL, 0, &o, &ddp));
    ASSERT_TRUE(tdist_ddp_num_buckets(ddp) >= 2);
    tdist_post_local_opts_t po;
    tdist_post_local_opts_init(&po);
    po.subgroup = sub;
    po.start_localSGD_iter = START;
    po.post_local_gradient_allreduce = sc->allreduce_after;
    tdist_post_local_t *s;
    ASSERT_OK(tdist_post_local_create(&po, &s));
    ASSERT_OK(tdist_post_local_register(ddp, s));
    bool join = sc->counts[0] || sc->counts[1] || sc->counts[2] || sc->counts[3];
    tdist_join_t *jn = NULL;
    if (join) {
        tdist_joinable_t j;
        ASSERT_OK(tdist_ddp_joinable(ddp, &j));
        ASSERT_OK(tdist_join_begin(&j, 1, NULL, &jn));
    }
    for (int k = 0; k < STEPS && active(sc, rank, k); k++) {
        run_step(sc, ddp, g, rank, k);
        check_step(sc, ddp, g, rank, k);
        int64_t it;
        ASSERT_OK(tdist_post_local_iter(s, &it));
        ASSERT_EQ(it, k + 1 < START ? k + 1 : START);
    }
    if (join) ASSERT_OK(tdist_join_end(jn));
    int64_t it; /* joined ranks counted their shadow iterations */
    ASSERT_OK(tdist_post_local_iter(s, &it));
    ASSERT_EQ(it, START);
    tdist_ddp_destroy(ddp);
    tdist_post_local_destroy(s);
    for (int p = 0; p < NP; p++) {
        free(pv[p]);
        free(g[p]);
    }
    tdist_pg_destroy(sub);
    tdist_pg_destroy(pg);
    tdist_world_destroy(w);
}

#define RUN(...)                                                                         \
    do {                                                                                 \
        static const scen_t sc = __VA_ARGS__;                                            \
        tdist_test_run_ranks(4, opt_body, (void *)&sc);                                  \
    } while (0)

TEST(post_local_several_buckets, 60) { RUN({false, false, false, true, {0}}); }
TEST(post_local_no_sync, 60) { RUN({true, false, false, true, {0}}); }
TEST(post_local_find_unused, 60) { RUN({false, true, false, true, {0}}); }
TEST(post_local_bucket_view, 60) { RUN({false, false, true, true, {0}}); }
TEST(post_local_no_sync_find_unused_bucket_view, 60) { RUN({true, true, true, true, {0}}); }
TEST(post_local_no_allreduce_after_switch, 60) { RUN({false, false, false, false, {0}}); }
TEST(post_local_join, 90) { RUN({false, false, false, true, {4, 2, 3, 0}}); }
/* rank 0, the only user of 'b0', stays active: a parameter no rank uses
 * would keep its old gradient */
TEST(post_local_join_find_unused, 90) { RUN({false, true, false, true, {4, 1, 0, 3}}); }

/* ======================================================= 4. options, errors */

static void errors_body(int rank, int n, void *arg)
{
    (void)arg;
    ASSERT_EQ(n, 3);
    tdist_world_t *w;
    tdist_pg_t *pg, *pair = NULL;
    open_pg(&w, &pg);
    tdist_post_local_opts_t po;
    tdist_post_local_opts_init(&po);
    tdist_post_local_t *s = NULL;
    ASSERT_STATUS(tdist_post_local_create(NULL, &s), TDIST_ERR_INVALID_ARG);
    ASSERT_STATUS(tdist_post_local_create(&po, &s), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "subgroup is NULL");
    po.subgroup = pg;
    po.start_localSGD_iter = 0;
    ASSERT_STATUS(tdist_post_local_create(&po, &s), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "start_localSGD_iter is 0");
    ASSERT_TRUE(s == NULL);
    /* rank 2 is in no pair: tdist_pg_split gives it NULL */
    ASSERT_OK(tdist_pg_split(pg, rank < 2 ? 0 : -1, rank, NULL, &pair));
    po.start_localSGD_iter = 1;
    po.subgroup = pair;
    if (rank == 2) ASSERT_STATUS(tdist_post_local_create(&po, &s), TDIST_ERR_INVALID_ARG);
    po.post_local_gradient_allreduce = false; /* then no subgroup is needed */
    ASSERT_OK(tdist_post_local_create(&po, &s));
    tdist_post_local_destroy(s);

    /* the ranks' options differ: every rank fails, naming both */
    float p[8] = {0}, g[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    tdist_ddp_param_t dp = {p, g, 8, TDIST_F32, "x"};
    tdist_ddp_t *ddp;
    ASSERT_OK(tdist_ddp_create(pg, &dp, 1, NULL, 0, NULL, &ddp));
    tdist_post_local_opts_init(&po);
    po.subgroup = pg;
    po.start_localSGD_iter = rank == 1 ? 3 : 2;
    ASSERT_OK(tdist_post_local_create(&po, &s));
    ASSERT_OK(tdist_post_local_register(ddp, s));
    ASSERT_OK(tdist_ddp_forward_begin(ddp));
    (void)tdist_ddp_grad_ready(ddp, 0);
    ASSERT_STATUS(tdist_ddp_backward_end(ddp), TDIST_ERR_MISMATCH);
    ASSERT_CONTAINS(tdist_last_error(), "post_localSGD_hook(start_localSGD_iter 2)");
    ASSERT_CONTAINS(tdist_last_error(), "post_localSGD_hook(start_localSGD_iter 3)");
    ASSERT_EQ(bits(g[0]), bits(1.0f)); /* nothing was reduced */
    tdist_ddp_destroy(ddp);
    tdist_post_local_destroy(s);

    /* a reducer on the pair {0, 1}, averaging later in the whole world:
     * not a subgroup of the reducer's group, refused on both ranks */
    if (pair) {
        ASSERT_OK(tdist_ddp_create(pair, &dp, 1, NULL, 0, NULL, &ddp));
        tdist_post_local_opts_init(&po);
        po.subgroup = pg;
        ASSERT_OK(tdist_post_local_create(&po, &s));
        ASSERT_OK(tdist_post_local_register(ddp, s));
        ASSERT_OK(tdist_ddp_forward_begin(ddp));
        (void)tdist_ddp_grad_ready(ddp, 0);
        ASSERT_STATUS(tdist_ddp_backward_end(ddp), TDIST_ERR_INVALID_ARG);
        ASSERT_CONTAINS(tdist_last_error(), "is not in the reducer's group");
        tdist_ddp_destroy(ddp);
        tdist_post_local_destroy(s);
    }
    tdist_post_local_destroy(NULL);
    ASSERT_STATUS(tdist_post_local_register(NULL, NULL), TDIST_ERR_INVALID_ARG);
    tdist_pg_destroy(pair);
    tdist_pg_destroy(pg);
    tdist_world_destroy(w);
}

TEST(post_local_options_and_mismatch, 60) { tdist_test_run_ranks(3, errors_body, NULL); }
