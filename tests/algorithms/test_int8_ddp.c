/* tests/algorithms/test_int8_ddp.c — the int8 quantised all_reduce hook
 * under the DDP reducer (test_int8.c calls it directly).
 *
 * 1. no_sync, find_unused_parameters (a parameter used on rank 0 only,
 *    one used nowhere: untouched), gradient_as_bucket_view, f32 and f64
 *    parameters, several buckets and the rebuild, with and without error
 *    feedback, on 3 ranks: every gradient within the quantisation bound
 *    of the float64 average (with the largest scale of any block) and
 *    bit-identical on every rank.
 *    The hook on the gradients equals the hook on the bucket bit for bit.
 * 2. Ranks with different block sizes or error feedback fail on every rank
 *    before any gradient is reduced, naming both.
 * 3. Training a small linear model on 3 ranks with SGD: the int8 hook ends
 *    within a few percent of the loss DDP's own all_reduce reaches, with
 *    identical parameters on every rank.
 * 4. Join on 3 ranks with uneven inputs (a rank joins before the first
 *    iteration), both divisors, with and without error feedback: the
 *    active ranks' results within the bound and bit-identical; every rank
 *    ran the hook in every iteration. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "synth_model.h"
#include "tdist/algorithms.h"
#include "tdist/join.h"
#include "tdist/optim.h"

static void open_pg(tdist_world_t **w, tdist_pg_t **pg)
{
    tdist_test_open_world(w, pg, (int64_t)(20000 * tdist_test_timeout_mult()));
}

/* ============================================================ the model */

#define SENTINEL 42.0

static double value(int r, int k, int m, int p, size_t i)
{
    double mag = pow(10.0, (double)((int)(i % 4) - 2));
    return mag * sin(1.3 * r + 0.7 * k + 0.37 * m + 0.11 * p + 0.013 * (double)i + 0.5);
}

/* Rank r's gradient after `micro` micro-batches, accumulated in the dtype. */
static double local(int r, int k, int micro, int p, size_t i)
{
    double a = 0;
    for (int m = 0; m < micro; m++)
        a = sm_dtype[p] == TDIST_F32 ? (double)((float)a + (float)value(r, k, m, p, i)) : a + value(r, k, m, p, i);
    return a;
}

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++) h = (h ^ c[i]) * 1099511628211ULL;
    return h;
}

/* Every rank's hash equal to rank 0's. */
static void same_everywhere(tdist_pg_t *pg, uint64_t h, const char *what)
{
    int64_t mine, all[8];
    memcpy(&mine, &h, sizeof mine);
    ASSERT_OK(tdist_all_gather(pg, &mine, all, 1, TDIST_I64, NULL, NULL));
    for (int r = 1; r < tdist_pg_size(pg); r++)
        if (all[r] != all[0]) FAIL("%s: rank %d's result differs from rank 0's", what, r);
}

/* |got - exact| <= (sum_r max_r / 254) / d + max_out / 254 (+ f32 slack):
 * the bound with every block's scale replaced by the largest. */
static void check_loose(int k, int p, size_t i, double got, double exact, double sum_max, double out_max, int64_t d)
{
    double bound = sum_max / 254 / (double)d + out_max / 254;
    if (!(fabs(got - exact) <= bound * (1 + 1e-4) + 1e-12))
        FAIL("step %d parameter %d [%zu]: %.9g, exact average %.9g, bound %.3g", k, p, i, got, exact, bound);
}

/* ======================================== 1. no_sync, find_unused, views */

typedef struct opt_scen {
    bool no_sync, find_unused, view, ef;
} opt_scen_t;

static void *grad_of(const opt_scen_t *sc, tdist_ddp_t *ddp, sm_model_t *md, int p)
{
    return sm_grad(ddp, md, sc->view, p);
}

static void opt_step(const opt_scen_t *sc, int rank, int k, tdist_ddp_t *ddp, sm_model_t *md)
{
    sm_ddp_step(ddp, md, rank, k, sc->no_sync, sc->find_unused, sc->view, value);
}

static void opt_check(const opt_scen_t *sc, int k, int w, tdist_pg_t *pg, tdist_ddp_t *ddp, sm_model_t *md)
{
    int micro = sc->no_sync ? 3 : 1;
    double sum_max = 0, out_max = 0;
    for (int r = 0; r < w; r++) {
        double m = 0;
        for (int p = 0; p < SM_NP; p++)
            for (size_t i = 0; i < sm_count[p] && sm_used(sc->find_unused, r, p); i++) m = fmax(m, fabs(local(r, k, micro, p, i)));
        sum_max += m;
    }
    uint64_t h = 1469598103934665603ULL;
    for (int p = 0; p < SM_NP; p++) {
        const void *g = grad_of(sc, ddp, md, p);
        h = fnv(h, g, sm_count[p] * (sm_dtype[p] == TDIST_F32 ? 4 : 8));
        for (size_t i = 0; i < sm_count[p] && !(sc->find_unused && p == SM_P_NONE); i++) out_max = fmax(out_max, fabs(sm_get(g, sm_dtype[p], i)));
    }
    same_everywhere(pg, h, "bucket results");
    if (sc->ef) return; /* the residuals move the result; identity checked above */
    for (int p = 0; p < SM_NP; p++) {
        const void *g = grad_of(sc, ddp, md, p);
        for (size_t i = 0; i < sm_count[p]; i++) {
            double got = sm_get(g, sm_dtype[p], i);
            if (sc->find_unused && p == SM_P_NONE) {
                if (got != SENTINEL) FAIL("step %d: the unused parameter's gradient became %.9g", k, got);
                continue;
            }
            double exact = 0;
            for (int r = 0; r < w; r++) exact += sm_used(sc->find_unused, r, p) ? local(r, k, micro, p, i) : 0.0;
            check_loose(k, p, i, got, exact / w, sum_max, out_max, w);
        }
    }
}

static void opt_body(int rank, int w, void *arg)
{
    const opt_scen_t *sc = arg;
    static sm_model_t md;
    sm_init(&md, 0);
    for (size_t i = 0; i < sm_count[SM_P_NONE]; i++) sm_set(md.grad[SM_P_NONE], sm_dtype[SM_P_NONE], i, SENTINEL);
    tdist_world_t *wd;
    tdist_pg_t *pg;
    open_pg(&wd, &pg);
    tdist_ddp_opts_t o;
    tdist_ddp_opts_init(&o);
    o.bucket_cap_bytes = o.first_bucket_bytes = 400;
    o.find_unused_parameters = sc->find_unused;
    o.gradient_as_bucket_view = sc->view;
    tdist_ddp_t *ddp;
    ASSERT_OK(tdist_ddp_create(pg, md.params, SM_NP, NULL, 0, &o, &ddp));
    tdist_int8_opts_t io;
    tdist_int8_opts_init(&io);
    io.block_size = 16;
    io.error_feedback = io.sum_error_feedback = sc->ef;
    tdist_int8_t *st;
    ASSERT_OK(tdist_int8_hook_create(&io, &st));
    ASSERT_OK(tdist_int8_register(ddp, st));
    for (int k = 0; k < 4; k++) {
        opt_step(sc, rank, k, ddp, &md);
        opt_check(sc, k, w, pg, ddp, &md);
    }
    tdist_ddp_stats_t ds;
    ASSERT_OK(tdist_ddp_get_stats(ddp, &ds));
    ASSERT_EQ(ds.sync_iterations, 4);
    tdist_int8_stats_t is;
    ASSERT_OK(tdist_int8_get_stats(st, &is));
    ASSERT_EQ(is.buckets, ds.buckets_reduced);
    tdist_ddp_destroy(ddp);
    tdist_int8_destroy(st);
    tdist_pg_destroy(pg);
    tdist_world_destroy(wd);
}

/* The hook on the gradients (tdist_int8_register: TDIST_DDP_HOOK_GRADS)
 * against the hook on the bucket (registered without the flag), side by
 * side on the same gradients, with and without error feedback: bit for
 * bit (the shards and blocks follow the bucket's layout either way; with
 * 16-value blocks and 400-byte buckets many blocks span two parameters). */
static void paths_body(int rank, int w, void *arg)
{
    (void)arg;
    (void)w;
    static sm_model_t on_grads, on_bucket;
    tdist_world_t *wd;
    tdist_pg_t *pg;
    open_pg(&wd, &pg);
    for (int ef = 0; ef < 2; ef++) {
        sm_init(&on_grads, 0);
        sm_init(&on_bucket, 0);
        tdist_ddp_opts_t o;
        tdist_ddp_opts_init(&o);
        o.bucket_cap_bytes = o.first_bucket_bytes = 400;
        tdist_ddp_t *dg, *db;
        ASSERT_OK(tdist_ddp_create(pg, on_grads.params, SM_NP, NULL, 0, &o, &dg));
        ASSERT_OK(tdist_ddp_create(pg, on_bucket.params, SM_NP, NULL, 0, &o, &db));
        tdist_int8_opts_t io;
        tdist_int8_opts_init(&io);
        io.block_size = 16;
        io.error_feedback = io.sum_error_feedback = ef;
        tdist_int8_t *sg, *sb;
        ASSERT_OK(tdist_int8_hook_create(&io, &sg));
        ASSERT_OK(tdist_int8_hook_create(&io, &sb));
        ASSERT_OK(tdist_int8_register(dg, sg));
        ASSERT_OK(tdist_ddp_register_comm_hook(db, sb, tdist_int8_hook));
        for (int k = 0; k < 3; k++) {
            sm_ddp_step(dg, &on_grads, rank, k, false, false, false, value);
            sm_ddp_step(db, &on_bucket, rank, k, false, false, false, value);
            for (int p = 0; p < SM_NP; p++)
                if (memcmp(on_grads.grad[p], on_bucket.grad[p],
                           sm_count[p] * (sm_dtype[p] == TDIST_F32 ? 4 : 8)) != 0)
                    FAIL("error feedback %d step %d parameter %d: the hook on the gradients and "
                         "on the bucket differ", ef, k, p);
        }
        tdist_ddp_destroy(dg);
        tdist_ddp_destroy(db);
        tdist_int8_destroy(sg);
        tdist_int8_destroy(sb);
    }
    tdist_pg_destroy(pg);
    tdist_world_destroy(wd);
}

TEST(int8_ddp_gradients_path_equals_bucket_path, 90) { tdist_test_run_ranks(3, paths_body, NULL); }

TEST(int8_ddp_no_sync, 90)
{
    static const opt_scen_t sc = {true, false, false, false};
    tdist_test_run_ranks(3, opt_body, (void *)&sc);
}

TEST(int8_ddp_find_unused, 90)
{
    static const opt_scen_t sc = {false, true, false, false};
    tdist_test_run_ranks(3, opt_body, (void *)&sc);
}

TEST(int8_ddp_bucket_view, 90)
{
    static const opt_scen_t sc = {false, false, true, false};
    tdist_test_run_ranks(3, opt_body, (void *)&sc);
}

TEST(int8_ddp_all_options, 90)
{
    static const opt_scen_t sc = {true, true, true, false};
    tdist_test_run_ranks(3, opt_body, (void *)&sc);
}

TEST(int8_ddp_all_options_error_feedback, 90)
{
    static const opt_scen_t sc = {true, true, true, true};
    tdist_test_run_ranks(3, opt_body, (void *)&sc);
}

/* ====================================================== 2. the agreement */

typedef struct mm_scen {
    tdist_int8_opts_t o[2];
    const char *want;
} mm_scen_t;

static void mm_body(int rank, int w, void *arg)
{
    const mm_scen_t *sc = arg;
    (void)w;
    tdist_world_t *wd;
    tdist_pg_t *pg;
    open_pg(&wd, &pg);
    float p[40] = {0}, g[40];
    tdist_ddp_param_t param = {p, g, 40, TDIST_F32, "w"};
    tdist_ddp_t *ddp;
    ASSERT_OK(tdist_ddp_create(pg, &param, 1, NULL, 0, NULL, &ddp));
    tdist_int8_t *st;
    ASSERT_OK(tdist_int8_hook_create(&sc->o[rank], &st));
    ASSERT_OK(tdist_int8_register(ddp, st));
    for (int it = 0; it < 2; it++) {
        ASSERT_OK(tdist_ddp_forward_begin(ddp));
        for (int i = 0; i < 40; i++) g[i] = (float)(rank + 1) * 0.25f * (float)(i + 1);
        ASSERT_STATUS(tdist_ddp_grad_ready(ddp, 0), TDIST_ERR_MISMATCH);
        ASSERT_CONTAINS(tdist_last_error(), sc->want);
        ASSERT_CONTAINS(tdist_last_error(), "tdist_int8_hook: rank ");
        ASSERT_STATUS(tdist_ddp_backward_end(ddp), TDIST_ERR_MISMATCH);
        for (int i = 0; i < 40; i++) ASSERT_TRUE(g[i] == (float)(rank + 1) * 0.25f * (float)(i + 1));
    }
    ASSERT_OK(tdist_barrier(pg, NULL, NULL)); /* the group is still usable */
    tdist_int8_stats_t is;
    ASSERT_OK(tdist_int8_get_stats(st, &is));
    ASSERT_EQ(is.buckets, 0);
    tdist_ddp_destroy(ddp);
    tdist_int8_destroy(st);
    tdist_pg_destroy(pg);
    tdist_world_destroy(wd);
}

TEST(int8_mismatch_block_size, 60)
{
    static const mm_scen_t sc = {{{256, false, false}, {128, false, false}},
                                 "comm hook mismatch: rank 0 runs int8_allreduce(block 256), rank 1 "
                                 "runs int8_allreduce(block 128) (ranks differing from rank 0: 1)"};
    tdist_test_run_ranks(2, mm_body, (void *)&sc);
}

TEST(int8_mismatch_error_feedback, 60)
{
    static const mm_scen_t sc = {{{64, true, true}, {64, true, false}},
                                 "rank 0 runs int8_allreduce(block 64, error feedback in+sum), rank 1 "
                                 "runs int8_allreduce(block 64, error feedback in)"};
    tdist_test_run_ranks(2, mm_body, (void *)&sc);
}

/* ============================================================ 3. training */

/* A linear model y = x W + b (IN x OUT, OUT) fit to a teacher's outputs by
 * least squares; each rank has its own SAMPLES inputs. */
#define IN 48
#define OUT 12
#define SAMPLES 64
#define STEPS 60

typedef struct lin {
    float w[IN * OUT], b[OUT], gw[IN * OUT], gb[OUT];
} lin_t;

static float input(int r, int s, int j) { return (float)sin(0.37 * r * SAMPLES + 1.1 * s + 0.73 * j); }

static float teacher(int s, int r, int o)
{
    double y = 0.3 * o - 1;
    for (int j = 0; j < IN; j++) y += input(r, s, j) * 0.5 * cos(0.21 * j * (o + 1) + 0.4);
    return (float)y;
}

/* Loss over this rank's samples; gradients (mean over samples) into gw, gb. */
static double lin_step(lin_t *m, int r)
{
    memset(m->gw, 0, sizeof m->gw);
    memset(m->gb, 0, sizeof m->gb);
    double loss = 0;
    for (int s = 0; s < SAMPLES; s++) {
        float x[IN];
        for (int j = 0; j < IN; j++) x[j] = input(r, s, j);
        for (int o = 0; o < OUT; o++) {
            float y = m->b[o];
            for (int j = 0; j < IN; j++) y += x[j] * m->w[j * OUT + o];
            float e = y - teacher(s, r, o);
            loss += (double)e * e / SAMPLES;
            m->gb[o] += 2 * e / SAMPLES;
            for (int j = 0; j < IN; j++) m->gw[j * OUT + o] += 2 * e * x[j] / SAMPLES;
        }
    }
    return loss;
}

/* Final loss averaged over ranks, training with the int8 hook or not. */
static double train(tdist_pg_t *pg, int rank, bool int8)
{
    static lin_t m;
    memset(&m, 0, sizeof m);
    tdist_ddp_param_t ps[2] = {{m.w, m.gw, IN * OUT, TDIST_F32, "w"}, {m.b, m.gb, OUT, TDIST_F32, "b"}};
    tdist_ddp_opts_t o;
    tdist_ddp_opts_init(&o);
    o.bucket_cap_bytes = o.first_bucket_bytes = 1024; /* several buckets */
    tdist_ddp_t *ddp;
    ASSERT_OK(tdist_ddp_create(pg, ps, 2, NULL, 0, &o, &ddp));
    tdist_int8_t *st = NULL;
    if (int8) {
        tdist_int8_opts_t io;
        tdist_int8_opts_init(&io);
        io.error_feedback = io.sum_error_feedback = true;
        ASSERT_OK(tdist_int8_hook_create(&io, &st));
        ASSERT_OK(tdist_int8_register(ddp, st));
    }
    double loss = 0;
    for (int k = 0; k <= STEPS; k++) {
        ASSERT_OK(tdist_ddp_forward_begin(ddp));
        loss = lin_step(&m, rank);
        ASSERT_OK(tdist_ddp_grad_ready(ddp, 1));
        ASSERT_OK(tdist_ddp_grad_ready(ddp, 0));
        ASSERT_OK(tdist_ddp_backward_end(ddp));
        if (k == STEPS) break; /* the loss of the trained model */
        for (int i = 0; i < IN * OUT; i++) m.w[i] -= 0.05f * m.gw[i];
        for (int i = 0; i < OUT; i++) m.b[i] -= 0.05f * m.gb[i];
    }
    ASSERT_OK(tdist_all_reduce(pg, &loss, &loss, 1, TDIST_F64, TDIST_SUM, NULL, NULL));
    uint64_t h = fnv(fnv(1469598103934665603ULL, m.w, sizeof m.w), m.b, sizeof m.b);
    same_everywhere(pg, h, "parameters after training");
    tdist_ddp_destroy(ddp);
    tdist_int8_destroy(st);
    return loss / tdist_pg_size(pg);
}

static void train_body(int rank, int w, void *arg)
{
    (void)w, (void)arg;
    tdist_world_t *wd;
    tdist_pg_t *pg;
    open_pg(&wd, &pg);
    static lin_t zero;
    double initial = lin_step(&zero, rank);
    ASSERT_OK(tdist_all_reduce(pg, &initial, &initial, 1, TDIST_F64, TDIST_SUM, NULL, NULL));
    initial /= w;
    double plain = train(pg, rank, false);
    double q = train(pg, rank, true);
    if (rank == 0)
        printf("loss: initial %.5f, after %d steps: all_reduce %.5f, int8 hook %.5f\n", initial,
               STEPS, plain, q);
    if (!(plain < 0.1 * initial)) FAIL("the reference run did not train: %.5f -> %.5f", initial, plain);
    if (!(q <= plain * 1.05 + 1e-4 * initial)) FAIL("int8 hook: loss %.6f against all_reduce's %.6f", q, plain);
    tdist_pg_destroy(pg);
    tdist_world_destroy(wd);
}

TEST(int8_ddp_training_close_to_all_reduce, 120) { tdist_test_run_ranks(3, train_body, NULL); }

/* ================================================================ 4. Join */

typedef struct join_scen {
    bool divide_initial, ef;
    int counts[3];
} join_scen_t;

#define JMAX 4

static void join_check(const join_scen_t *sc, int k, const sm_model_t *md)
{
    int active = 0;
    double sum_max = 0, out_max = 0;
    for (int r = 0; r < 3; r++) {
        if (sc->counts[r] <= k) continue;
        active++;
        double m = 0;
        for (int p = 0; p < SM_NP; p++)
            for (size_t i = 0; i < sm_count[p]; i++) m = fmax(m, fabs(local(r, k, 1, p, i)));
        sum_max += m;
    }
    int64_t d = sc->divide_initial ? 3 : active;
    for (int p = 0; p < SM_NP; p++)
        for (size_t i = 0; i < sm_count[p]; i++) out_max = fmax(out_max, fabs(sm_get(md->grad[p], sm_dtype[p], i)));
    for (int p = 0; p < SM_NP; p++)
        for (size_t i = 0; i < sm_count[p]; i++) {
            double exact = 0; /* the joined ranks contribute zeros */
            for (int r = 0; r < 3; r++) exact += sc->counts[r] > k ? local(r, k, 1, p, i) : 0.0;
            check_loose(k, p, i, sm_get(md->grad[p], sm_dtype[p], i), exact / (double)d, sum_max, out_max, d);
        }
}

static uint64_t grads_hash(const sm_model_t *md)
{
    uint64_t h = 1469598103934665603ULL;
    for (int p = 0; p < SM_NP; p++) h = fnv(h, md->grad[p], sm_count[p] * (sm_dtype[p] == TDIST_F32 ? 4 : 8));
    return h | 1; /* 0: no result */
}

static void join_body(int rank, int w, void *arg)
{
    const join_scen_t *sc = arg;
    ASSERT_EQ(w, 3);
    static sm_model_t md;
    sm_init(&md, 0);
    tdist_world_t *wd;
    tdist_pg_t *pg;
    open_pg(&wd, &pg);
    tdist_ddp_opts_t o;
    tdist_ddp_opts_init(&o);
    o.bucket_cap_bytes = o.first_bucket_bytes = 400;
    tdist_ddp_t *ddp;
    ASSERT_OK(tdist_ddp_create(pg, md.params, SM_NP, NULL, 0, &o, &ddp));
    tdist_int8_opts_t io;
    tdist_int8_opts_init(&io);
    io.block_size = 32;
    io.error_feedback = io.sum_error_feedback = sc->ef;
    tdist_int8_t *st;
    ASSERT_OK(tdist_int8_hook_create(&io, &st));
    ASSERT_OK(tdist_int8_register(ddp, st));
    tdist_joinable_t j;
    ASSERT_OK(tdist_ddp_joinable(ddp, &j));
    tdist_join_opts_t jo;
    tdist_join_opts_init(&jo);
    jo.divide_by_initial_world_size = sc->divide_initial;
    tdist_join_t *join;
    ASSERT_OK(tdist_join_begin(&j, 1, &jo, &join));
    int64_t hashes[JMAX] = {0};
    for (int k = 0; k < sc->counts[rank]; k++) {
        ASSERT_OK(tdist_ddp_forward_begin(ddp));
        for (int p = 0; p < SM_NP; p++)
            for (size_t i = 0; i < sm_count[p]; i++) sm_set(md.grad[p], sm_dtype[p], i, local(rank, k, 1, p, i));
        for (int p = SM_NP; p-- > 0;) ASSERT_OK(tdist_ddp_grad_ready(ddp, (size_t)p));
        ASSERT_OK(tdist_ddp_backward_end(ddp));
        if (!sc->ef) join_check(sc, k, &md);
        uint64_t h = grads_hash(&md);
        memcpy(&hashes[k], &h, sizeof h);
    }
    ASSERT_OK(tdist_join_end(join));
    /* the active ranks of every iteration got the same bytes */
    int64_t all[3 * JMAX];
    ASSERT_OK(tdist_all_gather(pg, hashes, all, JMAX, TDIST_I64, NULL, NULL));
    int iters = 0;
    for (int r = 0; r < 3; r++) iters = sc->counts[r] > iters ? sc->counts[r] : iters;
    for (int k = 0; k < iters; k++) {
        int64_t first = 0;
        for (int r = 0; r < 3; r++) {
            if (sc->counts[r] <= k) continue;
            if (!first) first = all[r * JMAX + k];
            if (all[r * JMAX + k] != first) FAIL("iteration %d: rank %d's gradients differ", k, r);
        }
    }
    /* every rank ran the hook in every iteration, active or joined */
    tdist_int8_stats_t is;
    ASSERT_OK(tdist_int8_get_stats(st, &is));
    ASSERT_EQ(is.buckets, (uint64_t)iters * tdist_ddp_num_buckets(ddp));
    tdist_ddp_destroy(ddp);
    tdist_int8_destroy(st);
    tdist_pg_destroy(pg);
    tdist_world_destroy(wd);
}

TEST(int8_join_initial_world_size, 90)
{
    static const join_scen_t sc = {true, false, {3, 1, 0}};
    tdist_test_run_ranks(3, join_body, (void *)&sc);
}

TEST(int8_join_active_ranks, 90)
{
    static const join_scen_t sc = {false, false, {2, 3, 1}};
    tdist_test_run_ranks(3, join_body, (void *)&sc);
}

TEST(int8_join_error_feedback_rank0_joins_first, 90)
{
    static const join_scen_t sc = {false, true, {0, 2, 3}};
    tdist_test_run_ranks(3, join_body, (void *)&sc);
}
