/* tests/algorithms/test_compress_ddp.c — the 16-bit compression hooks
 * with the reducer's options and under Join, and the cross-rank agreement
 * of the hooks.
 *
 * 1. no_sync (gradients accumulated over micro-batches),
 *    find_unused_parameters (a parameter used on rank 0 only, one used
 *    nowhere: untouched) and gradient_as_bucket_view, each and together,
 *    hook and wrapper, f16 and bf16: bit for bit against the reference of
 *    compress_ref.h (2 ranks).
 * 2. Join: 3 ranks with 3, 1 and 0 inputs (the third joins before the
 *    first iteration, so the agreement itself runs in its shadow
 *    iteration), divisor the initial world size or the active ranks; hook
 *    and wrapper around a custom hook. At most two ranks contribute
 *    non-zero values in any iteration, so the sum has one rounding and the
 *    check is bit for bit. The joined ranks run the hook on zeros.
 * 3. Ranks that register different hooks, or the same hook with other
 *    options, fail on every rank with an error naming both, before any
 *    gradient is reduced: f16 against bf16, hook against wrapper, wrappers
 *    of different hooks, and a rank with the default hook (a collective
 *    mismatch). The gradients are left as they were. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compress_ref.h"
#include "harness.h"
#include "tdist/algorithms.h"
#include "tdist/join.h"

/* The custom inner hook of the wrappers below: all_reduce SUM of the
 * 16-bit bucket, then a division by the divisor in a continuation. */
static tdist_status_t div_then(void *state, const tdist_ddp_bucket_t *b, tdist_ddp_hook_result_t *next)
{
    (void)state;
    (void)next;
    return tdist_divide(b->buffer, b->count, b->dtype, b->divisor);
}

static tdist_status_t sum_div_hook(void *state, const tdist_ddp_bucket_t *b, tdist_ddp_hook_result_t *res)
{
    (void)state;
    res->then = div_then;
    return tdist_all_reduce(b->pg, b->buffer, b->buffer, b->count, b->dtype, TDIST_SUM, NULL, &res->work);
}

/* What a rank registers. */
typedef enum kind {
    K_DEFAULT = 0, /* no hook: DDP's own averaging */
    K_HOOK,        /* tdist_compress_hook_create */
    K_WRAP_ALLREDUCE,
    K_WRAP_SUM_DIV /* wrapper around sum_div_hook */
} kind_t;

static tdist_compress_t *make_state(kind_t k, tdist_dtype_t wire, const char *inner_name)
{
    tdist_compress_opts_t co;
    tdist_compress_opts_init(&co);
    co.wire = wire;
    tdist_compress_t *c = NULL;
    if (k == K_HOOK) ASSERT_OK(tdist_compress_hook_create(&co, &c));
    if (k == K_WRAP_ALLREDUCE)
        ASSERT_OK(tdist_compress_wrapper_create(tdist_ddp_allreduce_hook, NULL, NULL, &co, &c));
    if (k == K_WRAP_SUM_DIV)
        ASSERT_OK(tdist_compress_wrapper_create(sum_div_hook, NULL, inner_name ? inner_name : "sum_div_hook", &co, &c));
    return c;
}

/* The value on the wire from rank r (divisor d) and its contribution to
 * the 16-bit sum: hook wire(g/d); wrappers wire(g), scaled by 1/d inside
 * tdist_ddp_allreduce_hook (only used with d = 2, where that is exact). */
static uint16_t contribution(kind_t k, tdist_dtype_t wire, double g, int p, int64_t d)
{
    if (k == K_HOOK) return ref_hook16((float)g, d, wire);
    uint16_t h = ref_cast16((float)g, sm_dtype[p] == TDIST_F32, wire);
    if (k == K_WRAP_ALLREDUCE) h = to16(from16(h, wire) * (float)(1.0 / (double)d), wire);
    return h;
}

/* The result of summing contributions (in any order: at most two are
 * non-zero in the tests that use more than two ranks). */
static uint16_t finish16(kind_t k, tdist_dtype_t wire, uint16_t sum, int64_t d)
{
    if (k == K_WRAP_SUM_DIV) return to16(from16(sum, wire) / (float)d, wire);
    return sum;
}

/* ================================= 1. no_sync, find_unused, bucket views */

typedef struct opt_scen {
    kind_t kind;
    tdist_dtype_t wire;
    bool no_sync, find_unused, view;
    /* registered with the plain tdist_ddp_register_comm_hook: the hook
     * works on the bucket, the reducer copies the gradients in and out
     * (tdist_compress_register: on the gradients where they are) */
    bool bucket_path;
} opt_scen_t;

#define SENTINEL 42.0 /* the unused-everywhere parameter's gradient */
#define P_RANK0 SM_P_RANK0
#define P_NONE SM_P_NONE

static bool used(const opt_scen_t *sc, int r, int p) { return sm_used(sc->find_unused, r, p); }

static void *grad_of(const opt_scen_t *sc, tdist_ddp_t *ddp, sm_model_t *md, int p)
{
    return sm_grad(ddp, md, sc->view, p);
}

static void opt_step(const opt_scen_t *sc, int rank, int k, tdist_ddp_t *ddp, sm_model_t *md)
{
    sm_ddp_step(ddp, md, rank, k, sc->no_sync, sc->find_unused, sc->view, sm_value);
}

static void opt_check(const opt_scen_t *sc, int k, tdist_ddp_t *ddp, sm_model_t *md)
{
    int micro = sc->no_sync ? 3 : 1;
    for (int p = 0; p < SM_NP; p++) {
        const void *g = grad_of(sc, ddp, md, p);
        for (size_t i = 0; i < sm_count[p]; i++) {
            double got = sm_get(g, sm_dtype[p], i);
            if (sc->find_unused && p == P_NONE) {
                if (got != SENTINEL) FAIL("step %d: the unused parameter's gradient became %.9g", k, got);
                continue;
            }
            uint16_t s = 0;
            for (int r = 0; r < 2; r++) {
                uint16_t c = used(sc, r, p) ? contribution(sc->kind, sc->wire, sm_local(r, k, micro, p, i), p, 2) : 0;
                s = r == 0 ? c : ref_add16(s, c, sc->wire);
            }
            expect_value("reduced", k, p, i, got, finish16(sc->kind, sc->wire, s, 2), sc->wire);
        }
    }
}

static void opt_body(int rank, int n, void *arg)
{
    const opt_scen_t *sc = arg;
    ASSERT_EQ(n, 2);
    static sm_model_t md;
    sm_init(&md, rank);
    for (size_t i = 0; i < sm_count[P_NONE]; i++) sm_set(md.grad[P_NONE], sm_dtype[P_NONE], i, SENTINEL);
    tdist_world_t *w;
    tdist_pg_t *pg;
    open_pg(&w, &pg);
    tdist_ddp_opts_t o;
    tdist_ddp_opts_init(&o);
    o.bucket_cap_bytes = o.first_bucket_bytes = 400;
    o.find_unused_parameters = sc->find_unused;
    o.gradient_as_bucket_view = sc->view;
    tdist_ddp_t *ddp;
    ASSERT_OK(tdist_ddp_create(pg, md.params, SM_NP, NULL, 0, &o, &ddp));
    tdist_compress_t *c = make_state(sc->kind, sc->wire, NULL);
    if (sc->bucket_path)
        ASSERT_OK(tdist_ddp_register_comm_hook(ddp, c, tdist_compress_hook));
    else
        ASSERT_OK(tdist_compress_register(ddp, c));
    for (int k = 0; k < 3; k++) {
        opt_step(sc, rank, k, ddp, &md);
        opt_check(sc, k, ddp, &md);
    }
    tdist_ddp_stats_t st;
    ASSERT_OK(tdist_ddp_get_stats(ddp, &st));
    ASSERT_EQ(st.sync_iterations, 3);
    tdist_ddp_destroy(ddp);
    tdist_compress_destroy(c);
    tdist_pg_destroy(pg);
    tdist_world_destroy(w);
}

TEST(compress_fp16_hook_no_sync, 60)
{
    static const opt_scen_t sc = {K_HOOK, TDIST_F16, true, false, false, false};
    tdist_test_run_ranks(2, opt_body, (void *)&sc);
}

TEST(compress_fp16_hook_find_unused, 60)
{
    static const opt_scen_t sc = {K_HOOK, TDIST_F16, false, true, false, false};
    tdist_test_run_ranks(2, opt_body, (void *)&sc);
}

TEST(compress_fp16_hook_no_sync_find_unused, 60)
{
    static const opt_scen_t sc = {K_HOOK, TDIST_F16, true, true, false, false};
    tdist_test_run_ranks(2, opt_body, (void *)&sc);
}

TEST(compress_fp16_hook_bucket_path_no_sync_find_unused, 60)
{
    static const opt_scen_t sc = {K_HOOK, TDIST_F16, true, true, false, true};
    tdist_test_run_ranks(2, opt_body, (void *)&sc);
}

TEST(compress_bf16_wrapper_bucket_path_find_unused, 60)
{
    static const opt_scen_t sc = {K_WRAP_SUM_DIV, TDIST_BF16, false, true, false, true};
    tdist_test_run_ranks(2, opt_body, (void *)&sc);
}

TEST(compress_fp16_hook_bucket_view, 60)
{
    static const opt_scen_t sc = {K_HOOK, TDIST_F16, false, false, true, false};
    tdist_test_run_ranks(2, opt_body, (void *)&sc);
}

TEST(compress_bf16_hook_all_options, 60)
{
    static const opt_scen_t sc = {K_HOOK, TDIST_BF16, true, true, true, false};
    tdist_test_run_ranks(2, opt_body, (void *)&sc);
}

TEST(compress_fp16_wrapper_all_options, 60)
{
    static const opt_scen_t sc = {K_WRAP_ALLREDUCE, TDIST_F16, true, true, true, false};
    tdist_test_run_ranks(2, opt_body, (void *)&sc);
}

TEST(compress_bf16_wrapper_custom_find_unused_view, 60)
{
    static const opt_scen_t sc = {K_WRAP_SUM_DIV, TDIST_BF16, false, true, true, false};
    tdist_test_run_ranks(2, opt_body, (void *)&sc);
}

/* ================================================================ 2. Join */

typedef struct join_scen {
    kind_t kind;
    tdist_dtype_t wire;
    bool divide_initial;
    int counts[3];
} join_scen_t;

typedef struct join_obs {
    int calls;
    bool zeros; /* every compressed value this rank sent while joined was 0 */
    bool joined;
} join_obs_t;

static void join_observe(void *arg, const tdist_ddp_bucket_t *b, const uint16_t *wire, bool reduced)
{
    join_obs_t *o = arg;
    if (reduced) return;
    o->calls++;
    if (o->joined)
        for (size_t i = 0; i < b->count; i++)
            if (wire[i] != 0) o->zeros = false;
}

static void join_check(const join_scen_t *sc, int k, const sm_model_t *md)
{
    int active = 0;
    for (int r = 0; r < 3; r++) active += sc->counts[r] > k;
    int64_t d = sc->divide_initial ? 3 : active;
    for (int p = 0; p < SM_NP; p++)
        for (size_t i = 0; i < sm_count[p]; i++) {
            uint16_t s = 0; /* zeros from the joined ranks change nothing */
            for (int r = 0; r < 3; r++)
                if (sc->counts[r] > k)
                    s = ref_add16(s, contribution(sc->kind, sc->wire, sm_local(r, k, 1, p, i), p, d), sc->wire);
            expect_value("under Join", k, p, i, sm_get(md->grad[p], sm_dtype[p], i),
                         finish16(sc->kind, sc->wire, s, d), sc->wire);
        }
}

static void join_body(int rank, int n, void *arg)
{
    const join_scen_t *sc = arg;
    ASSERT_EQ(n, 3);
    static sm_model_t md;
    sm_init(&md, rank);
    tdist_world_t *w;
    tdist_pg_t *pg;
    open_pg(&w, &pg);
    tdist_ddp_opts_t o;
    tdist_ddp_opts_init(&o);
    o.bucket_cap_bytes = o.first_bucket_bytes = 400;
    tdist_ddp_t *ddp;
    ASSERT_OK(tdist_ddp_create(pg, md.params, SM_NP, NULL, 0, &o, &ddp));
    join_obs_t ob = {0, true, false};
    tdist_compress_opts_t co;
    tdist_compress_opts_init(&co);
    co.wire = sc->wire;
    co.observe = join_observe;
    co.observe_arg = &ob;
    tdist_compress_t *c;
    if (sc->kind == K_HOOK)
        ASSERT_OK(tdist_compress_hook_create(&co, &c));
    else
        ASSERT_OK(tdist_compress_wrapper_create(sum_div_hook, NULL, "sum_div_hook", &co, &c));
    ASSERT_OK(tdist_compress_register(ddp, c));
    tdist_joinable_t j;
    ASSERT_OK(tdist_ddp_joinable(ddp, &j));
    tdist_join_opts_t jo;
    tdist_join_opts_init(&jo);
    jo.divide_by_initial_world_size = sc->divide_initial;
    tdist_join_t *join;
    ASSERT_OK(tdist_join_begin(&j, 1, &jo, &join));
    for (int k = 0; k < sc->counts[rank]; k++) {
        ASSERT_OK(tdist_ddp_forward_begin(ddp));
        for (int p = 0; p < SM_NP; p++)
            for (size_t i = 0; i < sm_count[p]; i++) sm_set(md.grad[p], sm_dtype[p], i, sm_local(rank, k, 1, p, i));
        for (int p = SM_NP; p-- > 0;) ASSERT_OK(tdist_ddp_grad_ready(ddp, (size_t)p));
        ASSERT_OK(tdist_ddp_backward_end(ddp));
        join_check(sc, k, &md);
    }
    ob.joined = true;
    ASSERT_OK(tdist_join_end(join));
    /* every rank ran the hook in every iteration, active or joined */
    int iters = 0;
    for (int r = 0; r < 3; r++) iters = sc->counts[r] > iters ? sc->counts[r] : iters;
    ASSERT_EQ(ob.calls, iters * (int)tdist_ddp_num_buckets(ddp));
    ASSERT_TRUE(ob.zeros);
    tdist_ddp_destroy(ddp);
    tdist_compress_destroy(c);
    tdist_pg_destroy(pg);
    tdist_world_destroy(w);
}

TEST(compress_fp16_hook_join_initial_world_size, 90)
{
    static const join_scen_t sc = {K_HOOK, TDIST_F16, true, {3, 1, 0}};
    tdist_test_run_ranks(3, join_body, (void *)&sc);
}

TEST(compress_bf16_hook_join_active_ranks, 90)
{
    static const join_scen_t sc = {K_HOOK, TDIST_BF16, false, {3, 1, 0}};
    tdist_test_run_ranks(3, join_body, (void *)&sc);
}

TEST(compress_fp16_wrapper_join_rank0_joins_first, 90)
{
    static const join_scen_t sc = {K_WRAP_SUM_DIV, TDIST_F16, true, {0, 2, 3}};
    tdist_test_run_ranks(3, join_body, (void *)&sc);
}

TEST(compress_bf16_wrapper_join_active_ranks, 90)
{
    static const join_scen_t sc = {K_WRAP_SUM_DIV, TDIST_BF16, false, {2, 3, 0}};
    tdist_test_run_ranks(3, join_body, (void *)&sc);
}

/* ====================================================== 3. the agreement */

typedef struct mm_rank {
    kind_t kind;
    tdist_dtype_t wire;
    const char *inner_name;
} mm_rank_t;

typedef struct mm_scen {
    int n;
    mm_rank_t r[4];
    const char *want;  /* in the message of every rank with a layer hook */
    bool group_ok;     /* the group is still usable afterwards */
} mm_scen_t;

/* Every rank's text after "comm hook mismatch:" is the same: compared
 * through a hash all_gathered over the (still usable) group. */
static void same_text_everywhere(tdist_pg_t *pg, const char *msg, int n)
{
    const char *t = strstr(msg, "comm hook mismatch:");
    ASSERT_TRUE(t != NULL);
    uint64_t h = 1469598103934665603ULL;
    int64_t mine, all[4];
    for (; *t; t++) h = (h ^ (unsigned char)*t) * 1099511628211ULL;
    memcpy(&mine, &h, sizeof mine);
    ASSERT_OK(tdist_all_gather(pg, &mine, all, 1, TDIST_I64, NULL, NULL));
    for (int r = 1; r < n; r++) ASSERT_EQ(all[r], all[0]);
}

static void mm_body(int rank, int n, void *arg)
{
    const mm_scen_t *sc = arg;
    ASSERT_EQ(n, sc->n);
    const mm_rank_t *me = &sc->r[rank];
    tdist_world_t *w;
    tdist_pg_t *pg;
    open_pg(&w, &pg);
    float p[40] = {0}, g[40];
    tdist_ddp_param_t param = {p, g, 40, TDIST_F32, "w"};
    tdist_ddp_t *ddp;
    ASSERT_OK(tdist_ddp_create(pg, &param, 1, NULL, 0, NULL, &ddp));
    tdist_compress_t *c = make_state(me->kind, me->wire, me->inner_name);
    if (c) ASSERT_OK(tdist_compress_register(ddp, c));
    for (int it = 0; it < 2 && (it == 0 || sc->group_ok); it++) {
        ASSERT_OK(tdist_ddp_forward_begin(ddp));
        for (int i = 0; i < 40; i++) g[i] = (float)(rank + 1) * 0.25f * (float)(i + 1);
        /* a layer hook fails at once, in the grad_ready that launches
         * the bucket; the default hook's all_reduce fails when waited */
        ASSERT_STATUS(tdist_ddp_grad_ready(ddp, 0), c ? TDIST_ERR_MISMATCH : TDIST_OK);
        ASSERT_STATUS(tdist_ddp_backward_end(ddp), TDIST_ERR_MISMATCH);
        char msg[2048];
        snprintf(msg, sizeof msg, "%s", tdist_last_error());
        if (c) ASSERT_CONTAINS(msg, sc->want);
        else ASSERT_CONTAINS(msg, "collective mismatch");
        /* nothing was averaged: the gradients are this rank's own */
        for (int i = 0; i < 40; i++) ASSERT_TRUE(g[i] == (float)(rank + 1) * 0.25f * (float)(i + 1));
        if (sc->group_ok) same_text_everywhere(pg, msg, n);
    }
    if (sc->group_ok) ASSERT_OK(tdist_barrier(pg, NULL, NULL));
    tdist_ddp_destroy(ddp);
    tdist_compress_destroy(c);
    tdist_pg_destroy(pg);
    tdist_world_destroy(w);
}

TEST(compress_mismatch_fp16_vs_bf16, 60)
{
    static const mm_scen_t sc = {
        2, {{K_HOOK, TDIST_F16, NULL}, {K_HOOK, TDIST_BF16, NULL}},
        "comm hook mismatch: rank 0 runs fp16_compress_hook, rank 1 runs bf16_compress_hook "
        "(ranks differing from rank 0: 1); every rank must register the same comm hook",
        true};
    tdist_test_run_ranks(sc.n, mm_body, (void *)&sc);
}

TEST(compress_mismatch_hook_vs_wrapper_3_ranks, 60)
{
    static const mm_scen_t sc = {
        3, {{K_HOOK, TDIST_F16, NULL}, {K_HOOK, TDIST_F16, NULL}, {K_WRAP_ALLREDUCE, TDIST_F16, NULL}},
        "comm hook mismatch: rank 0 runs fp16_compress_hook, rank 2 runs "
        "fp16_compress_wrapper(tdist_ddp_allreduce_hook) (ranks differing from rank 0: 2)",
        true};
    tdist_test_run_ranks(sc.n, mm_body, (void *)&sc);
}

TEST(compress_mismatch_wrappers_of_other_hooks, 60)
{
    static const mm_scen_t sc = {
        2, {{K_WRAP_SUM_DIV, TDIST_BF16, "sum_div_hook"}, {K_WRAP_SUM_DIV, TDIST_BF16, "sum_div_hook_v2"}},
        "comm hook mismatch: rank 0 runs bf16_compress_wrapper(sum_div_hook), rank 1 runs "
        "bf16_compress_wrapper(sum_div_hook_v2)",
        true};
    tdist_test_run_ranks(sc.n, mm_body, (void *)&sc);
}

/* rank 2 never registers a hook: its first collective is DDP's own
 * all_reduce, which meets the others' agreement all_gather */
TEST(compress_mismatch_with_default_hook, 60)
{
    static const mm_scen_t sc = {
        3, {{K_HOOK, TDIST_F16, NULL}, {K_HOOK, TDIST_F16, NULL}, {K_DEFAULT, TDIST_F16, NULL}},
        "the comm hook agreement (one all_gather of i64 x 12 on the hook's first bucket) failed",
        false};
    tdist_test_run_ranks(sc.n, mm_body, (void *)&sc);
}
