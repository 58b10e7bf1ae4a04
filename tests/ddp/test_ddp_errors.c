/* tests/ddp/test_ddp_errors.c — what the reducer refuses, and how it says
 * so: a missing grad_ready (on every rank, and on one rank only: no hang),
 * shapes or options that differ across ranks (every rank fails, naming the
 * parameter and the ranks), misuse of the loop calls, argument checks, a
 * failing comm hook. Also f64 and mixed-dtype parameters, and the shadow
 * iteration Join will replay on a rank without input. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ddp/internal.h"
#include "harness.h"
#include "tdist/ddp.h"

/* Join the job and create the world group (timeout 20 s, scaled). */
static void open_pg(tdist_world_t **w, tdist_pg_t **pg)
{
    tdist_test_open_world(w, pg, (int64_t)(20000 * tdist_test_timeout_mult()));
}

/* A toy model: 4 parameters of sizes 6, 3, 5, 2 (f32). */
#define NP 4
static const size_t cnt[NP] = {6, 3, 5, 2};
static const char *nm[NP] = {"enc.weight", "enc.bias", "dec.weight", "dec.bias"};
typedef struct toy {
    float p[NP][8], g[NP][8];
    tdist_ddp_param_t params[NP];
} toy_t;

static void toy_init(toy_t *t, int rank)
{
    memset(t, 0, sizeof *t);
    for (int i = 0; i < NP; i++) {
        for (size_t j = 0; j < cnt[i]; j++) t->p[i][j] = (float)(rank + i + j);
        t->params[i] = (tdist_ddp_param_t){t->p[i], t->g[i], cnt[i], TDIST_F32, nm[i]};
    }
}

/* gradient of parameter i on rank r: r + 1 + i + j / 8 */
static void toy_grads(toy_t *t, int rank)
{
    for (int i = 0; i < NP; i++)
        for (size_t j = 0; j < cnt[i]; j++) t->g[i][j] = (float)(rank + 1 + i) + (float)j / 8;
}

static char prefix[64];
static const char *rank_prefix(int rank, uint64_t it)
{
    snprintf(prefix, sizeof prefix, "rank %d group world iteration %llu", rank, (unsigned long long)it);
    return prefix;
}

/* ---------------------------------------------------- missing grad_ready */

static void missing_body(int rank, int n, void *arg)
{
    (void)arg;
    tdist_world_t *w;
    tdist_pg_t *pg;
    open_pg(&w, &pg);
    static toy_t t;
    toy_init(&t, rank);
    tdist_ddp_opts_t o;
    tdist_ddp_opts_init(&o);
    o.bucket_cap_bytes = 16; /* several buckets */
    tdist_ddp_t *ddp;
    ASSERT_OK(tdist_ddp_create(pg, t.params, NP, NULL, 0, &o, &ddp));
    /* iteration 1: nobody calls grad_ready for 1 and 3 */
    ASSERT_OK(tdist_ddp_forward_begin(ddp));
    toy_grads(&t, rank);
    ASSERT_OK(tdist_ddp_grad_ready(ddp, 2));
    ASSERT_OK(tdist_ddp_grad_ready(ddp, 0));
    ASSERT_STATUS(tdist_ddp_backward_end(ddp), TDIST_ERR_INVALID_ARG);
    const char *e = tdist_last_error();
    ASSERT_CONTAINS(e, "tdist_ddp_backward_end");
    ASSERT_CONTAINS(e, rank_prefix(rank, 1));
    ASSERT_CONTAINS(e, "2 parameters never became ready");
    ASSERT_CONTAINS(e, "'enc.bias' (index 1)");
    ASSERT_CONTAINS(e, "'dec.bias' (index 3)");
    ASSERT_CONTAINS(e, "find_unused_parameters");
    /* the reducer goes on: a complete iteration 2 averages correctly */
    ASSERT_OK(tdist_ddp_forward_begin(ddp));
    toy_grads(&t, rank);
    for (int i = NP - 1; i >= 0; i--) ASSERT_OK(tdist_ddp_grad_ready(ddp, (size_t)i));
    ASSERT_OK(tdist_ddp_backward_end(ddp));
    for (int i = 0; i < NP; i++)
        for (size_t j = 0; j < cnt[i]; j++) {
            float want = (float)(n + 1) / 2 + (float)i + (float)j / 8;
            if (fabsf(t.g[i][j] - want) > 1e-6f * want) FAIL("grad %d.%zu = %g, want %g", i, j, (double)t.g[i][j], (double)want);
        }
    tdist_ddp_destroy(ddp);
    tdist_pg_destroy(pg);
    tdist_world_destroy(w);
}
TEST(ddp_missing_grad_ready_error, 60)
{
    for (int n = 1; n <= 3; n++) tdist_test_run_ranks(n, missing_body, NULL);
}

/* Only the last rank forgets parameter 0: it gets the error; the others'
 * buckets are still reduced (with its zeros), so nobody hangs. */
static void missing_one_body(int rank, int n, void *arg)
{
    (void)arg;
    tdist_world_t *w;
    tdist_pg_t *pg;
    open_pg(&w, &pg);
    static toy_t t;
    toy_init(&t, rank);
    tdist_ddp_t *ddp;
    ASSERT_OK(tdist_ddp_create(pg, t.params, NP, NULL, 0, NULL, &ddp));
    ASSERT_OK(tdist_ddp_forward_begin(ddp));
    toy_grads(&t, rank);
    for (int i = NP - 1; i >= 0; i--)
        if (!(i == 0 && rank == n - 1)) ASSERT_OK(tdist_ddp_grad_ready(ddp, (size_t)i));
    if (rank == n - 1) {
        ASSERT_STATUS(tdist_ddp_backward_end(ddp), TDIST_ERR_INVALID_ARG);
        ASSERT_CONTAINS(tdist_last_error(), "1 parameter never became ready");
        ASSERT_CONTAINS(tdist_last_error(), "'enc.weight' (index 0)");
    } else {
        ASSERT_OK(tdist_ddp_backward_end(ddp));
    }
    ASSERT_OK(tdist_barrier(pg, NULL, NULL)); /* the group is still in step */
    tdist_ddp_destroy(ddp);
    tdist_pg_destroy(pg);
    tdist_world_destroy(w);
}
TEST(ddp_missing_grad_ready_on_one_rank, 30)
{
    tdist_test_run_ranks(2, missing_one_body, NULL);
    tdist_test_run_ranks(3, missing_one_body, NULL);
}

/* ------------------------------------------------------- shape mismatch */

typedef struct mm_case {
    int kind; /* 0 count, 1 dtype, 2 name, 3 number of params, 4 options, 5 buffer count */
} mm_case_t;

static void mismatch_body(int rank, int n, void *arg)
{
    const mm_case_t *c = arg;
    tdist_world_t *w;
    tdist_pg_t *pg;
    open_pg(&w, &pg);
    static toy_t t;
    toy_init(&t, rank);
    double d64[8] = {0}, g64[8] = {0};
    float buf[4] = {0};
    tdist_ddp_buffer_t bufs[1] = {{buf, 4, TDIST_F32, "bn.mean"}};
    bool odd = rank == n - 1; /* the last rank differs */
    size_t np = NP;
    tdist_ddp_opts_t o;
    tdist_ddp_opts_init(&o);
    if (odd) switch (c->kind) {
        case 0: t.params[2].count = 4; break;
        case 1: t.params[2] = (tdist_ddp_param_t){d64, g64, 5, TDIST_F64, "dec.weight"}; break;
        case 2: t.params[2].name = "dec.w"; break;
        case 3: np = NP - 1; break;
        case 4: o.find_unused_parameters = true; break;
        case 5: bufs[0].count = 3; break;
        }
    tdist_ddp_t *ddp = NULL;
    ASSERT_STATUS(tdist_ddp_create(pg, t.params, np, bufs, 1, &o, &ddp), TDIST_ERR_MISMATCH);
    ASSERT_TRUE(ddp == NULL);
    const char *e = tdist_last_error();
    char who[128];
    snprintf(who, sizeof who, "ranks differing from rank 0: %d", n - 1);
    ASSERT_CONTAINS(e, "tdist_ddp_create");
    ASSERT_CONTAINS(e, rank_prefix(rank, 0));
    switch (c->kind) {
    case 0:
        ASSERT_CONTAINS(e, "parameter 2");
        ASSERT_CONTAINS(e, "rank 0 has f32[5]");
        snprintf(who, sizeof who, "rank %d has f32[4] (ranks differing from rank 0: %d)", n - 1, n - 1);
        ASSERT_CONTAINS(e, who);
        break;
    case 1:
        ASSERT_CONTAINS(e, "parameter 2");
        snprintf(who, sizeof who, "rank %d has f64[5]", n - 1);
        ASSERT_CONTAINS(e, who);
        break;
    case 2:
        ASSERT_CONTAINS(e, "parameter 2");
        ASSERT_CONTAINS(e, "name differs");
        ASSERT_CONTAINS(e, who);
        break;
    case 3:
        snprintf(who, sizeof who, "rank 0 has 4 parameters, rank %d has 3", n - 1);
        ASSERT_CONTAINS(e, who);
        break;
    case 4:
        ASSERT_CONTAINS(e, "options");
        snprintf(who, sizeof who, "differ from rank 0's on ranks %d", n - 1);
        ASSERT_CONTAINS(e, who);
        break;
    case 5:
        ASSERT_CONTAINS(e, "buffer 0 ('bn.mean' on this rank)");
        ASSERT_CONTAINS(e, "rank 0 has f32[4]");
        break;
    }
    /* the group is fine afterwards */
    ASSERT_OK(tdist_barrier(pg, NULL, NULL));
    tdist_pg_destroy(pg);
    tdist_world_destroy(w);
}
TEST(ddp_shape_mismatch_fails_on_every_rank, 60)
{
    for (int k = 0; k <= 5; k++) {
        mm_case_t c = {k};
        tdist_test_run_ranks(k % 2 ? 3 : 2, mismatch_body, &c);
    }
}

/* ---------------------------------------------------------------- misuse */

static tdist_status_t failing_hook(void *state, const tdist_ddp_bucket_t *b, tdist_ddp_hook_result_t *r)
{
    (void)state;
    (void)r;
    if (b->index == 0) return tdist__error(TDIST_ERR_NOT_SUPPORTED, "this hook refuses bucket 0");
    return tdist_ddp_allreduce_hook(NULL, b, r);
}

static tdist_status_t noop_hook(void *state, const tdist_ddp_bucket_t *b, tdist_ddp_hook_result_t *r)
{
    (void)state;
    (void)b;
    (void)r;
    return TDIST_OK;
}

static void misuse_body(int rank, int n, void *arg)
{
    (void)arg;
    (void)n;
    tdist_world_t *w;
    tdist_pg_t *pg;
    open_pg(&w, &pg);
    static toy_t t;
    toy_init(&t, rank);
    tdist_ddp_t *ddp = NULL;

    /* argument checks at create (local: nothing is sent) */
    ASSERT_STATUS(tdist_ddp_create(NULL, t.params, NP, NULL, 0, NULL, &ddp), TDIST_ERR_INVALID_ARG);
    ASSERT_STATUS(tdist_ddp_create(pg, t.params, NP, NULL, 0, NULL, NULL), TDIST_ERR_INVALID_ARG);
    ASSERT_STATUS(tdist_ddp_create(pg, NULL, NP, NULL, 0, NULL, &ddp), TDIST_ERR_INVALID_ARG);
    ASSERT_STATUS(tdist_ddp_create(pg, t.params, NP, NULL, 1, NULL, &ddp), TDIST_ERR_INVALID_ARG);
    tdist_ddp_param_t bad[NP];
    memcpy(bad, t.params, sizeof bad);
    bad[1].grad = NULL;
    ASSERT_STATUS(tdist_ddp_create(pg, bad, NP, NULL, 0, NULL, &ddp), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "parameter 1 'enc.bias': grad pointer is NULL");
    memcpy(bad, t.params, sizeof bad);
    bad[2].count = 0;
    ASSERT_STATUS(tdist_ddp_create(pg, bad, NP, NULL, 0, NULL, &ddp), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "'dec.weight' has count 0");
    memcpy(bad, t.params, sizeof bad);
    bad[3].dtype = TDIST_F16;
    ASSERT_STATUS(tdist_ddp_create(pg, bad, NP, NULL, 0, NULL, &ddp), TDIST_ERR_NOT_SUPPORTED);
    ASSERT_CONTAINS(tdist_last_error(), "parameter 3 'dec.bias' has dtype f16");
    bad[3].dtype = (tdist_dtype_t)99;
    ASSERT_STATUS(tdist_ddp_create(pg, bad, NP, NULL, 0, NULL, &ddp), TDIST_ERR_NOT_SUPPORTED);
    tdist_ddp_opts_t o;
    tdist_ddp_opts_init(&o);
    o.bucket_cap_bytes = 0;
    ASSERT_STATUS(tdist_ddp_create(pg, t.params, NP, NULL, 0, &o, &ddp), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "bucket_cap_bytes");
    ASSERT_TRUE(ddp == NULL);
    tdist_ddp_opts_init(&o);
    o.overlap = (tdist_ddp_overlap_t)7;
    ASSERT_STATUS(tdist_ddp_create(pg, t.params, NP, NULL, 0, &o, &ddp), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "opts.overlap is 7: expected TDIST_DDP_OVERLAP_ON, _OFF, _INLINE or _AUTO");
    ASSERT_TRUE(ddp == NULL);

    /* NULL reducer everywhere */
    ASSERT_STATUS(tdist_ddp_forward_begin(NULL), TDIST_ERR_INVALID_ARG);
    ASSERT_STATUS(tdist_ddp_grad_ready(NULL, 0), TDIST_ERR_INVALID_ARG);
    ASSERT_STATUS(tdist_ddp_backward_end(NULL), TDIST_ERR_INVALID_ARG);
    ASSERT_STATUS(tdist_ddp_set_no_sync(NULL, true), TDIST_ERR_INVALID_ARG);
    ASSERT_STATUS(tdist_ddp_register_comm_hook(NULL, NULL, noop_hook), TDIST_ERR_INVALID_ARG);
    tdist_ddp_stats_t st;
    ASSERT_STATUS(tdist_ddp_get_stats(NULL, &st), TDIST_ERR_INVALID_ARG);
    ASSERT_TRUE(tdist_ddp_grad_ptr(NULL, 0) == NULL);
    ASSERT_EQ(tdist_ddp_num_buckets(NULL), 0);
    tdist_ddp_destroy(NULL);

    ASSERT_OK(tdist_ddp_create(pg, t.params, NP, NULL, 0, NULL, &ddp));
    ASSERT_TRUE(tdist_ddp_grad_ptr(ddp, 1) == t.g[1]);
    ASSERT_TRUE(tdist_ddp_grad_ptr(ddp, NP) == NULL);
    ASSERT_STATUS(tdist_ddp_get_stats(ddp, NULL), TDIST_ERR_INVALID_ARG);
    ASSERT_STATUS(tdist_ddp_register_comm_hook(ddp, NULL, NULL), TDIST_ERR_INVALID_ARG);
    ASSERT_STATUS(tdist_ddp_register_comm_hook_flags(ddp, NULL, noop_hook, 1u << 7),
                  TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "unknown flags 0x80");

    /* loop calls out of order */
    ASSERT_STATUS(tdist_ddp_grad_ready(ddp, 0), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "call tdist_ddp_forward_begin first");
    ASSERT_STATUS(tdist_ddp_backward_end(ddp), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "tdist_ddp_forward_begin was not called");
    ASSERT_CONTAINS(tdist_last_error(), rank_prefix(rank, 0));

    ASSERT_OK(tdist_ddp_forward_begin(ddp));
    ASSERT_OK(tdist_ddp_forward_begin(ddp)); /* before backward: starts afresh */
    ASSERT_STATUS(tdist_ddp_set_no_sync(ddp, true), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "inside an iteration");
    toy_grads(&t, rank);
    ASSERT_STATUS(tdist_ddp_grad_ready(ddp, NP), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "parameter index 4 out of range (the model has 4 parameters)");
    ASSERT_CONTAINS(tdist_last_error(), rank_prefix(rank, 1));
    ASSERT_OK(tdist_ddp_grad_ready(ddp, 3));
    ASSERT_STATUS(tdist_ddp_grad_ready(ddp, 3), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "tdist_ddp_grad_ready: ");
    ASSERT_CONTAINS(tdist_last_error(), "parameter 3 'dec.bias' was marked ready twice in this iteration");
    ASSERT_STATUS(tdist_ddp_forward_begin(ddp), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "backward_end was not called");
    for (int i = 2; i >= 0; i--) ASSERT_OK(tdist_ddp_grad_ready(ddp, (size_t)i));
    ASSERT_OK(tdist_ddp_backward_end(ddp));
    ASSERT_STATUS(tdist_ddp_backward_end(ddp), TDIST_ERR_INVALID_ARG);
    ASSERT_STATUS(tdist_ddp_register_comm_hook(ddp, NULL, noop_hook), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "before the first iteration");
    ASSERT_OK(tdist_ddp_get_stats(ddp, &st));
    ASSERT_EQ(st.iterations, 1);
    tdist_ddp_destroy(ddp);

    /* a hook is registered once */
    ASSERT_OK(tdist_ddp_create(pg, t.params, NP, NULL, 0, NULL, &ddp));
    ASSERT_OK(tdist_ddp_register_comm_hook(ddp, NULL, noop_hook));
    ASSERT_STATUS(tdist_ddp_register_comm_hook(ddp, NULL, noop_hook), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "already registered");
    tdist_ddp_destroy(ddp);

    /* a failing hook: grad_ready and backward_end report it, naming the bucket */
    tdist_ddp_opts_init(&o);
    o.bucket_cap_bytes = o.first_bucket_bytes = 1;
    ASSERT_OK(tdist_ddp_create(pg, t.params, NP, NULL, 0, &o, &ddp));
    ASSERT_OK(tdist_ddp_register_comm_hook(ddp, NULL, failing_hook));
    ASSERT_OK(tdist_ddp_forward_begin(ddp));
    ASSERT_STATUS(tdist_ddp_grad_ready(ddp, 3), TDIST_ERR_NOT_SUPPORTED);
    ASSERT_CONTAINS(tdist_last_error(), "comm hook of bucket 0");
    ASSERT_CONTAINS(tdist_last_error(), "this hook refuses bucket 0");
    for (int i = 2; i >= 0; i--) ASSERT_OK(tdist_ddp_grad_ready(ddp, (size_t)i));
    ASSERT_STATUS(tdist_ddp_backward_end(ddp), TDIST_ERR_NOT_SUPPORTED);
    ASSERT_CONTAINS(tdist_last_error(), "this hook refuses bucket 0");
    tdist_ddp_destroy(ddp);

    tdist_pg_destroy(pg);
    tdist_world_destroy(w);
}
TEST(ddp_misuse_is_a_clear_error, 30)
{
    tdist_test_run_ranks(1, misuse_body, NULL);
    tdist_test_run_ranks(2, misuse_body, NULL);
}

/* ------------------------------------------------- f64 and mixed dtypes */

static void f64_body(int rank, int n, void *arg)
{
    (void)arg;
    tdist_world_t *w;
    tdist_pg_t *pg;
    open_pg(&w, &pg);
    double a[3] = {1, 2, 3}, ga[3] = {0};
    float b[2] = {4, 5}, gb[2] = {0};
    double c[4] = {6, 7, 8, 9}, gc[4] = {0};
    tdist_ddp_param_t ps[3] = {{a, ga, 3, TDIST_F64, "a"}, {b, gb, 2, TDIST_F32, "b"}, {c, gc, 4, TDIST_F64, "c"}};
    tdist_ddp_opts_t o;
    tdist_ddp_opts_init(&o);
    for (int view = 0; view < 2; view++) {
        o.gradient_as_bucket_view = view;
        tdist_ddp_t *ddp;
        ASSERT_OK(tdist_ddp_create(pg, ps, 3, NULL, 0, &o, &ddp));
        /* f32 and f64 never share a bucket */
        ASSERT_EQ(tdist_ddp_num_buckets(ddp), 2);
        for (int it = 0; it < 2; it++) {
            ASSERT_OK(tdist_ddp_forward_begin(ddp));
            double *pga = tdist_ddp_grad_ptr(ddp, 0), *pgc = tdist_ddp_grad_ptr(ddp, 2);
            float *pgb = tdist_ddp_grad_ptr(ddp, 1);
            for (int j = 0; j < 4; j++) pgc[j] = rank * 3.0 + j + it;
            ASSERT_OK(tdist_ddp_grad_ready(ddp, 2));
            for (int j = 0; j < 2; j++) pgb[j] = (float)(rank + j);
            ASSERT_OK(tdist_ddp_grad_ready(ddp, 1));
            for (int j = 0; j < 3; j++) pga[j] = 1.0 / 3.0 * (rank + 1) + j;
            ASSERT_OK(tdist_ddp_grad_ready(ddp, 0));
            ASSERT_OK(tdist_ddp_backward_end(ddp));
            pga = tdist_ddp_grad_ptr(ddp, 0);
            pgb = tdist_ddp_grad_ptr(ddp, 1);
            pgc = tdist_ddp_grad_ptr(ddp, 2);
            double mr = (n - 1) / 2.0;
            for (int j = 0; j < 4; j++) ASSERT_TRUE(fabs(pgc[j] - (3.0 * mr + j + it)) < 1e-12);
            for (int j = 0; j < 2; j++) ASSERT_TRUE(fabsf(pgb[j] - (float)(mr + j)) < 1e-6f);
            for (int j = 0; j < 3; j++) ASSERT_TRUE(fabs(pga[j] - (1.0 / 3.0 * (mr + 1) + j)) < 1e-12);
        }
        tdist_ddp_destroy(ddp);
    }
    tdist_pg_destroy(pg);
    tdist_world_destroy(w);
}
TEST(ddp_f64_and_mixed_dtypes, 30)
{
    for (int n = 1; n <= 3; n++) tdist_test_run_ranks(n, f64_body, NULL);
}

/* --------------------------------------- the shadow iteration (for Join) */

/* The last rank has no input: it shadows two iterations while the others
 * train; the active ranks' gradients are the sum of their shards divided by
 * the initial world size (Join's default rule). */
static void shadow_body(int rank, int n, void *arg)
{
    const bool *find_unused = arg;
    tdist_world_t *w;
    tdist_pg_t *pg;
    open_pg(&w, &pg);
    static toy_t t;
    toy_init(&t, rank);
    float buf[2] = {(float)rank, (float)rank};
    tdist_ddp_buffer_t bufs[1] = {{buf, 2, TDIST_F32, "stat"}};
    tdist_ddp_opts_t o;
    tdist_ddp_opts_init(&o);
    o.bucket_cap_bytes = 20;
    o.find_unused_parameters = *find_unused;
    tdist_ddp_t *ddp;
    ASSERT_OK(tdist_ddp_create(pg, t.params, NP, bufs, 1, &o, &ddp));
    bool joined = rank == n - 1;
    for (int it = 0; it < 2; it++) {
        if (joined) {
            buf[0] = 99;
            ASSERT_OK(tdist__ddp_shadow_iteration(ddp));
            ASSERT_TRUE(buf[0] == 0.0f); /* rank 0's buffer came in */
            continue;
        }
        buf[0] = (float)(rank * 10);
        ASSERT_OK(tdist_ddp_forward_begin(ddp));
        ASSERT_TRUE(buf[0] == 0.0f);
        toy_grads(&t, rank);
        /* another order than reverse, so the rebuild happens in iteration 1 */
        static const int ord[NP] = {1, 0, 3, 2};
        for (int k = 0; k < NP; k++) {
            if (*find_unused && ord[k] == 3) continue; /* dec.bias unused everywhere */
            ASSERT_OK(tdist_ddp_grad_ready(ddp, (size_t)ord[k]));
        }
        ASSERT_OK(tdist_ddp_backward_end(ddp));
        for (int i = 0; i < NP; i++)
            for (size_t j = 0; j < cnt[i]; j++) {
                float sum = 0;
                for (int r = 0; r < n - 1; r++) sum += (float)(r + 1 + i) + (float)j / 8;
                float want = sum / (float)n;
                if (*find_unused && i == 3) want = (float)(rank + 1 + i) + (float)j / 8; /* untouched */
                if (fabsf(t.g[i][j] - want) > 1e-6f * fabsf(want))
                    FAIL("it %d grad %d.%zu = %g, want %g", it, i, j, (double)t.g[i][j], (double)want);
            }
    }
    /* every rank rebuilt in rank 0's order: 1, 0, [3,] 2 */
    size_t idx[NP], got = 0;
    for (size_t b = 0; b < tdist_ddp_num_buckets(ddp); b++) got += tdist_ddp_bucket_params(ddp, b, idx + got, NP - got);
    ASSERT_EQ(got, NP);
    ASSERT_EQ(idx[0], 1);
    ASSERT_EQ(idx[1], 0);
    ASSERT_EQ(idx[2], *find_unused ? 2 : 3);
    ASSERT_OK(tdist_barrier(pg, NULL, NULL));
    tdist_ddp_destroy(ddp);
    tdist_pg_destroy(pg);
    tdist_world_destroy(w);
}
TEST(ddp_shadow_iteration_for_join, 60)
{
    bool no = false, yes = true;
    for (int n = 2; n <= 3; n++) {
        tdist_test_run_ranks(n, shadow_body, &no);
        tdist_test_run_ranks(n, shadow_body, &yes);
    }
}
