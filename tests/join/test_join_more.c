/* tests/join/test_join_more.c — more Join tests: uneven DDP training at world
 * size 8; a registered comm hook under Join (called on joined ranks too,
 * same math); and six two-rank Linear(1,1) loop variants:
 * Join with a plain loop, with a barrier after every backward, with the
 * loss all_reduced in every forward (the last two need rule 4: the joined
 * rank shadows them); no Join with the short rank exiting, with the short
 * rank issuing a barrier, with a barrier in every iteration and the short
 * rank exiting. With Join every variant finishes with the reference model;
 * without, rank 1 fails fast with a clear error and applies no garbage.
 *
 * The model of the first two tests is test_join.c's (copied: its helpers
 * are file-static): out = W x + b (W 2x3, b 2) plus `extra` (2) added to the
 * output only on rank 0, loss 0.5 |out - t|^2, f64, plain SGD applied by the
 * test; a f64 buffer `cnt` gets rank + 1 added after each forward_begin.
 * Reference: in step k the active ranks are A_k = {r : counts[r] > k}; the
 * averaged gradient is the sum over A_k of each rank's gradient times
 * hook_scale / divisor, divisor = world size (divide_by_initial_world_size)
 * or |A_k|. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "harness.h"
#include "tdist/join.h"

#include "join_model.h"


/* ------------------------------------------------------------ the hook */

/* Per process (each rank is a process). */
typedef struct hook_log {
    const scen_t *sc;
    bool in_join_end;    /* set by the test around tdist_join_end */
    int active_calls;    /* hook calls while this rank was in its loop */
    int shadow_calls;    /* hook calls from tdist_join_end (joined) */
    int then_calls;
    int cur_iter;        /* the test's step index of the active call, else -1 */
    char err[512];       /* first inconsistency seen inside the hook */
} hook_log_t;

static hook_log_t g_hook;

static void hook_err(const char *msg, long long a, long long b)
{
    if (!g_hook.err[0]) snprintf(g_hook.err, sizeof g_hook.err, "%s (%lld vs %lld)", msg, a, b);
}

static tdist_status_t hook_then_x2(void *state, const tdist_ddp_bucket_t *bucket,
                                   tdist_ddp_hook_result_t *next)
{
    (void)next;
    if (state != &g_hook) hook_err("continuation state", 0, 1);
    g_hook.then_calls++;
    if (bucket->dtype != TDIST_F64) hook_err("bucket dtype", bucket->dtype, TDIST_F64);
    double *d = bucket->buffer;
    for (size_t i = 0; i < bucket->count; i++)
        d[i] *= 2.0;
    return TDIST_OK;
}

static tdist_status_t hook_allreduce_x2(void *state, const tdist_ddp_bucket_t *bucket,
                                        tdist_ddp_hook_result_t *result)
{
    hook_log_t *hl = state;
    if (hl != &g_hook) hook_err("hook state", 0, 1);
    const scen_t *sc = hl->sc;
    int nb = (int)bucket->num_buckets;
    int iter; /* the step this call belongs to */
    if (hl->in_join_end) {
        /* a joined rank: its shadowed steps follow its own ones */
        iter = sc->counts[tdist_test_rank] + hl->shadow_calls / nb;
        hl->shadow_calls++;
        /* a joined rank contributes zero gradients */
        const double *d = bucket->buffer;
        for (size_t i = 0; i < bucket->count; i++)
            if (d[i] != 0.0) hook_err("joined rank's bucket is not zero at element", (long long)i, 0);
    } else {
        iter = hl->cur_iter;
        hl->active_calls++;
    }
    if (iter >= 0 && iter < max_count(sc)) {
        int want = sc->divide_initial ? sc->n : active_at(sc, iter);
        if (bucket->divisor != want) hook_err("bucket divisor", bucket->divisor, want);
    } else {
        hook_err("hook called for a step beyond the last", iter, max_count(sc));
    }
    tdist_status_t st = tdist_ddp_allreduce_hook(NULL, bucket, result);
    if (st != TDIST_OK) return st;
    if (result->then != NULL) hook_err("default hook set a continuation", 1, 0);
    result->then = hook_then_x2;
    return TDIST_OK;
}

/* ------------------------------------------------------ uneven training */

static void uneven_body(int rank, int n, void *arg)
{
    const scen_t *sc = arg;
    ASSERT_EQ(n, sc->n);
    static model_t ref[64];
    int K = ref_run(sc, ref, 64);

    tdist_world_t *w;
    tdist_pg_t *pg;
    tdist_test_open_world(&w, &pg, (int64_t)(20000 * tdist_test_timeout_mult()));
    model_t md;
    init_model(&md, rank);
    tdist_ddp_param_t params[3];
    model_params(&md, params);
    tdist_ddp_buffer_t bufs[1] = {{&md.cnt, 1, TDIST_F64, "cnt"}};
    tdist_ddp_opts_t o;
    tdist_ddp_opts_init(&o);
    if (sc->per_param) o.bucket_cap_bytes = o.first_bucket_bytes = 8;
    tdist_ddp_t *ddp;
    ASSERT_OK(tdist_ddp_create(pg, params, 3, bufs, 1, &o, &ddp));
    ASSERT_TRUE(md.cnt == 0.0);
    int nb = (int)tdist_ddp_num_buckets(ddp);
    ASSERT_EQ(nb, sc->per_param ? 3 : 1);
    memset(&g_hook, 0, sizeof g_hook);
    g_hook.sc = sc;
    g_hook.cur_iter = -1;
    if (sc->hook) ASSERT_OK(tdist_ddp_register_comm_hook(ddp, &g_hook, hook_allreduce_x2));
    tdist_joinable_t j;
    ASSERT_OK(tdist_ddp_joinable(ddp, &j));
    tdist_join_opts_t jo;
    tdist_join_opts_init(&jo);
    jo.divide_by_initial_world_size = sc->divide_initial;
    tdist_join_t *join;
    ASSERT_OK(tdist_join_begin(&j, 1, &jo, &join));

    /* buffer value broadcast at step f from root l_f (the lowest active
     * rank): V_0 = 0, V_f = V_{f-1} + l_f + 1 */
    double v = 0;
    int last = n - 1;
    for (int k = 0; k < K; k++) {
        int lowest = -1;
        for (int r = 0; r < n; r++)
            if (sc->counts[r] > k) {
                if (lowest < 0) lowest = r;
                last = r;
            }
        if (k > 0) v += lowest + 1;
        if (k >= sc->counts[rank]) continue;
        memset(md.gw, 0, sizeof md.gw);
        memset(md.gb, 0, sizeof md.gb);
        memset(md.gex, 0, sizeof md.gex);
        g_hook.cur_iter = k;
        ASSERT_OK(tdist_ddp_forward_begin(ddp));
        if (md.cnt != v)
            FAIL("step %d: buffer %.17g after the broadcast, expected %.17g (root rank %d)", k,
                 md.cnt, v, lowest);
        md.cnt += rank + 1;
        grad(&md, rank, k, 0, 1.0, md.gw, md.gb, md.gex);
        ASSERT_OK(tdist_ddp_grad_ready(ddp, 2));
        ASSERT_OK(tdist_ddp_grad_ready(ddp, 1));
        ASSERT_OK(tdist_ddp_grad_ready(ddp, 0));
        ASSERT_OK(tdist_ddp_backward_end(ddp));
        for (int i = 0; i < NO * NI; i++)
            md.w[i] -= LR * md.gw[i];
        for (int oo = 0; oo < NO; oo++) {
            md.b[oo] -= LR * md.gb[oo];
            md.ex[oo] -= LR * md.gex[oo];
        }
        expect_model(k, &md, &ref[k]);
    }
    g_hook.cur_iter = -1;
    g_hook.in_join_end = true;
    ASSERT_OK(tdist_join_end(join));
    g_hook.in_join_end = false;
    /* every rank ends with the last joiner's model and buffer */
    expect_model(-1, &md, &ref[K ? K - 1 : 0]);
    double want_cnt = K ? v + last + 1 : 0.0;
    if (md.cnt != want_cnt)
        FAIL("final buffer %.17g, expected %.17g (last joiner rank %d)", md.cnt, want_cnt, last);
    if (sc->hook) {
        if (g_hook.err[0]) FAIL("inside the comm hook: %s", g_hook.err);
        /* called on every step: its own ones, and shadowed ones once joined */
        ASSERT_EQ(g_hook.active_calls, sc->counts[rank] * nb);
        ASSERT_EQ(g_hook.shadow_calls, (K - sc->counts[rank]) * nb);
        ASSERT_EQ(g_hook.active_calls + g_hook.shadow_calls, K * nb);
        ASSERT_EQ(g_hook.then_calls, K * nb);
    }
    tdist_ddp_destroy(ddp);
    tdist_pg_destroy(pg);
    tdist_world_destroy(w);
}

static void run_both_modes(scen_t sc)
{
    for (int d = 0; d < 2; d++) {
        sc.divide_initial = d == 0;
        tdist_test_run_ranks(sc.n, uneven_body, &sc);
    }
}

/* 8 ranks, two with no input at all (rank 0 among them: never iterates,
 * never rebuilds its buckets, never the root of a broadcast) */
TEST(join_world_size_8, 90)
{
    scen_t sc = {.n = 8, .counts = {0, 3, 5, 1, 2, 4, 0, 2}};
    run_both_modes(sc);
}

/* A comm hook wrapping the default all_reduce, with a continuation that
 * doubles: joined ranks call it too (on zeros), with the same divisor. */
TEST(join_with_comm_hook, 90)
{
    scen_t a = {.n = 3, .counts = {2, 4, 0}, .hook = true};
    run_both_modes(a);
    scen_t b = {.n = 4, .counts = {3, 1, 0, 5}, .hook = true, .per_param = true};
    run_both_modes(b);
    scen_t c = {.n = 2, .counts = {5, 6}, .hook = true, .per_param = true};
    run_both_modes(c);
}

/* -------------------------------------- two-rank Linear(1,1) variants */

/* Rank r has 5 + r inputs; Linear(1,1) (weight w, bias b), loss
 * 0.5 (w x + b - t)^2, SGD lr 0.1, f64. */
#define LIN_LR 0.1

typedef enum lin_variant {
    LIN_JOIN,           /* (a) Join, plain loop: finishes, identical params */
    LIN_NOJOIN_EXIT,    /* (b) no Join: rank 0 leaves the loop and exits */
    LIN_NOJOIN_BARRIER, /* (c) no Join: rank 0 then calls tdist_barrier */
    LIN_JOIN_BARRIER,   /* (d) Join, a barrier after every backward (rule 4) */
    LIN_JOIN_ALLREDUCE, /* (e) Join, the loss all_reduced in every forward (rule 4) */
    LIN_NOJOIN_LOOP_BARRIER, /* (f) no Join, a barrier in every iteration; rank 0 exits */
} lin_variant_t;

static void lin_data(int r, int k, double *x, double *t)
{
    *x = 0.5 + 0.25 * k + r;
    *t = 2.0 * *x - 1.0 + 0.1 * r;
}

/* reference (averaged over the initial world size 2) after `steps` steps */
static void lin_ref(int steps, double *w, double *b)
{
    *w = 0.3;
    *b = -0.2;
    for (int k = 0; k < steps; k++) {
        double gw = 0, gb = 0;
        for (int r = 0; r < 2; r++) {
            if (k >= 5 + r) continue;
            double x, t;
            lin_data(r, k, &x, &t);
            double e = *w * x + *b - t;
            gw += e * x * 0.5;
            gb += e * 0.5;
        }
        *w -= LIN_LR * gw;
        *b -= LIN_LR * gb;
    }
}

/* One iteration: TDIST_OK or the first error (its message in msg). */
static tdist_status_t lin_step(tdist_ddp_t *ddp, tdist_pg_t *pg, int rank, int k, double *p,
                               double *g, lin_variant_t var, char *msg, size_t len)
{
    msg[0] = '\0';
    tdist_status_t st = tdist_ddp_forward_begin(ddp);
    if (st == TDIST_OK) {
        double x, t;
        lin_data(rank, k, &x, &t);
        double e = p[0] * x + p[1] - t;
        if (var == LIN_JOIN_ALLREDUCE) {
            /* the summed loss of the ranks still active at step k */
            double loss = 0.5 * e * e, want = 0;
            for (int r = 0; r < 2; r++) {
                if (k >= 5 + r) continue;
                double xr, tr;
                lin_data(r, k, &xr, &tr);
                double er = p[0] * xr + p[1] - tr;
                want += 0.5 * er * er;
            }
            st = tdist_all_reduce(pg, &loss, &loss, 1, TDIST_F64, TDIST_SUM, NULL, NULL);
            if (st == TDIST_OK && fabs(loss - want) > TOL) {
                snprintf(msg, len, "step %d: summed loss %.17g, want %.17g", k, loss, want);
                return TDIST_ERR_INTERNAL;
            }
        }
    }
    if (st == TDIST_OK) {
        double x, t;
        lin_data(rank, k, &x, &t);
        double e = p[0] * x + p[1] - t;
        g[0] = e * x;
        g[1] = e;
        st = tdist_ddp_grad_ready(ddp, 1);
        if (st == TDIST_OK) st = tdist_ddp_grad_ready(ddp, 0);
        if (st != TDIST_OK) {
            snprintf(msg, len, "%s", tdist_last_error());
            (void)tdist_ddp_backward_end(ddp); /* let the reducer close the iteration */
            return st;
        }
        st = tdist_ddp_backward_end(ddp);
        if (st == TDIST_OK && (var == LIN_JOIN_BARRIER || var == LIN_NOJOIN_LOOP_BARRIER))
            st = tdist_barrier(pg, NULL, NULL);
    }
    if (st != TDIST_OK) {
        if (!msg[0]) snprintf(msg, len, "%s", tdist_last_error());
        return st;
    }
    p[0] -= LIN_LR * g[0];
    p[1] -= LIN_LR * g[1];
    return TDIST_OK;
}

static void expect_lin(const char *when, const double *p, int steps)
{
    double w, b;
    lin_ref(steps, &w, &b);
    if (fabs(p[0] - w) > TOL || fabs(p[1] - b) > TOL)
        FAIL("%s: (w, b) = (%.17g, %.17g), reference after %d steps (%.17g, %.17g)", when, p[0],
             p[1], steps, w, b);
}

static void lin_body(int rank, int n, void *arg)
{
    lin_variant_t var = *(const lin_variant_t *)arg;
    ASSERT_EQ(n, 2);
    tdist_world_t *w;
    tdist_pg_t *pg;
    /* long group timeout: a failure must come from the departure or the
     * fingerprint, not from a deadline */
    bool joined = var == LIN_JOIN || var == LIN_JOIN_BARRIER || var == LIN_JOIN_ALLREDUCE;
    tdist_test_open_world(&w, &pg, joined ? (int64_t)(20000 * tdist_test_timeout_mult()) : 30000);
    double p[2] = {0.3 + rank, -0.2 - rank}, g[2] = {0, 0}; /* rank 0's wins at create */
    tdist_ddp_param_t prm[2] = {{&p[0], &g[0], 1, TDIST_F64, "weight"},
                                {&p[1], &g[1], 1, TDIST_F64, "bias"}};
    tdist_ddp_t *ddp;
    ASSERT_OK(tdist_ddp_create(pg, prm, 2, NULL, 0, NULL, &ddp));
    expect_lin("after create", p, 0);
    int mine = 5 + rank;
    char msg[1024] = "";

    if (joined) {
        tdist_joinable_t j;
        ASSERT_OK(tdist_ddp_joinable(ddp, &j));
        tdist_join_t *join;
        ASSERT_OK(tdist_join_begin(&j, 1, NULL, &join));
        for (int k = 0; k < mine; k++) {
            if (lin_step(ddp, pg, rank, k, p, g, var, msg, sizeof msg) != TDIST_OK)
                FAIL("step %d: %s", k, msg);
            expect_lin("during the loop", p, k + 1);
        }
        ASSERT_OK(tdist_join_end(join));
        expect_lin("after tdist_join_end", p, 6); /* rank 1's model, on both */
        tdist_ddp_destroy(ddp);
        tdist_pg_destroy(pg);
        tdist_world_destroy(w);
        return;
    }

    /* without Join: the common 5 steps succeed */
    for (int k = 0; k < 5; k++) {
        if (lin_step(ddp, pg, rank, k, p, g, var, msg, sizeof msg) != TDIST_OK)
            FAIL("step %d: %s", k, msg);
        expect_lin("during the common steps", p, k + 1);
    }
    if (rank == 0) {
        if (var == LIN_NOJOIN_EXIT || var == LIN_NOJOIN_LOOP_BARRIER) {
            /* leave the loop, clean up and exit normally */
            tdist_ddp_destroy(ddp);
            tdist_pg_destroy(pg);
            tdist_world_destroy(w);
            return;
        }
        /* LIN_NOJOIN_BARRIER: a different collective than rank 1's */
        double t0 = tdist_test_now_ms();
        ASSERT_STATUS(tdist_barrier(pg, NULL, NULL), TDIST_ERR_MISMATCH);
        double dt = tdist_test_now_ms() - t0;
        snprintf(msg, sizeof msg, "%s", tdist_last_error());
        if (dt > 5000) FAIL("the barrier failed after %.0f ms (limit 5000 ms): %s", dt, msg);
        ASSERT_CONTAINS(msg, "collective mismatch");
        ASSERT_CONTAINS(msg, "rank 0 barrier()");
        ASSERT_CONTAINS(msg, "rank 1 all_reduce");
        expect_lin("after the failed barrier", p, 5);
    } else {
        /* rank 1's sixth step: DDP's all_reduce with nobody (or a barrier)
         * on the other side */
        double t0 = tdist_test_now_ms();
        tdist_status_t st = lin_step(ddp, pg, rank, 5, p, g, var, msg, sizeof msg);
        double dt = tdist_test_now_ms() - t0;
        if (st == TDIST_OK) FAIL("step 5 succeeded without its peer: (w, b) = (%.17g, %.17g)", p[0], p[1]);
        if (dt > 5000) FAIL("step 5 failed after %.0f ms (limit 5000 ms; timeout 30 s): %s", dt, msg);
        if (var == LIN_NOJOIN_EXIT || var == LIN_NOJOIN_LOOP_BARRIER) {
            ASSERT_TRUE(st != TDIST_ERR_TIMEOUT);
            ASSERT_CONTAINS(msg, "peer rank 0");
        } else {
            ASSERT_STATUS(st, TDIST_ERR_MISMATCH);
            ASSERT_CONTAINS(msg, "collective mismatch");
            ASSERT_CONTAINS(msg, "rank 0 barrier()");
            ASSERT_CONTAINS(msg, "rank 1 all_reduce");
        }
        fprintf(stderr, "variant %d: rank 1 failed after %.1f ms: %s\n", (int)var, dt, msg);
        expect_lin("after the failed step", p, 5); /* no garbage applied */
    }
    tdist_ddp_destroy(ddp);
    tdist_pg_destroy(pg);
    tdist_world_destroy(w);
}

static void run_lin(lin_variant_t var)
{
    tdist_test_run_ranks(2, lin_body, &var);
}

TEST(join_linear_variant_join_plain, 30) { run_lin(LIN_JOIN); }
TEST(join_linear_variant_nojoin_exit_fails_fast, 30) { run_lin(LIN_NOJOIN_EXIT); }
TEST(join_linear_variant_nojoin_barrier_mismatch, 30) { run_lin(LIN_NOJOIN_BARRIER); }
TEST(join_linear_variant_join_barrier_in_loop, 30) { run_lin(LIN_JOIN_BARRIER); }
TEST(join_linear_variant_join_allreduce_in_forward, 30) { run_lin(LIN_JOIN_ALLREDUCE); }
TEST(join_linear_variant_nojoin_barrier_in_loop_exit, 30) { run_lin(LIN_NOJOIN_LOOP_BARRIER); }

/* The comm hook with one bucket per parameter at 8 ranks. */
TEST(join_with_comm_hook_8, 120)
{
    scen_t sc = {.n = 8, .counts = {0, 3, 5, 1, 2, 4, 0, 2}, .hook = true, .per_param = true};
    run_both_modes(sc);
}
