/* tests/ddp/test_ddp.c — DDP on N ranks (1..4), each on its shard of a
 * batch, equals one process on the whole batch.
 *
 * The model is a hand-written MLP (Linear(8,16) -> ReLU -> Linear(16,4),
 * MSE loss averaged over the batch), plus an optional extra bias `extra`
 * added to the output of some samples only (the unused-parameter cases),
 * and two buffers (a f32 running mean of the hidden layer, an i64 batch
 * counter that grows by rank+1 per forward, so ranks differ unless the
 * buffers are broadcast).
 *
 * Every rank computes the single-process reference itself, on the full
 * batch, and after every synchronised step compares every gradient and
 * every parameter (after `p -= lr * g`, applied by the test) with it:
 * |ddp - ref| <= 1e-6 * max|ref| per tensor (f32; the reduction order of
 * the sums differs, so bit equality is not expected). Parameters start
 * different on every rank (seed rank + 1) and must equal rank 0's after
 * create. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "tdist/ddp.h"

#define DIN 8
#define HID 16
#define DOUT 4
#define BATCH 24 /* divisible by 1, 2, 3, 4 */
#define NPAR 5
#define TOL 1e-6
#define LR 0.1f
#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

enum { P_W1, P_B1, P_W2, P_B2, P_EX };
static const size_t pcount[NPAR] = {HID * DIN, HID, DOUT * HID, DOUT, DOUT};
static const char *pname[NPAR] = {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "extra"};

typedef struct model {
    float p[NPAR][HID * DIN];
    float g[NPAR][HID * DIN];
    float running[HID]; /* buffer: running mean of h */
    int64_t batches;    /* buffer: counter */
} model_t;

typedef struct scenario {
    tdist_ddp_opts_t opts;
    int steps;
    int micro;         /* micro-batches per step; all but the last under no_sync */
    int extra;         /* 0: no extra param; 1: never used; 2: used for shard 0's samples only */
    int order;         /* 0: reverse order; 1: another order, rank dependent */
    int hook;          /* 0: default; 1: all_reduce sum then x2 in a continuation; 2: wraps the public default;
                        * 3: the public default registered with TDIST_DDP_HOOK_GRADS */
    bool check_stats;
} scenario_t;

/* ------------------------------------------------------------ helpers */

static uint64_t rng_state;
static float frand(void)
{
    rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((double)(rng_state >> 40) / (double)(1ULL << 24)) * 2.0f - 1.0f;
}

static void init_model(model_t *m, uint64_t seed)
{
    memset(m, 0, sizeof *m);
    rng_state = seed * 7919 + 1;
    for (int i = 0; i < NPAR; i++)
        for (size_t j = 0; j < pcount[i]; j++) m->p[i][j] = 0.5f * frand();
    for (int j = 0; j < HID; j++) m->running[j] = (float)seed;
    m->batches = (int64_t)seed * 100;
}

static void make_batch(float *x, float *y, int step, int micro)
{
    rng_state = (uint64_t)(1000 * step + micro) * 104729 + 17;
    for (int i = 0; i < BATCH * DIN; i++) x[i] = frand();
    for (int i = 0; i < BATCH * DOUT; i++) y[i] = frand();
}

/* Forward + backward over rows [r0, r1) with loss scale `norm` per row;
 * gradients are ADDED to g. Samples with row < ex_end use the extra bias
 * (if has_extra). With ddp, calls grad_ready for the layer-2 parameters
 * (in ord2) once their gradients are final, then for layer 1 (ord1). */
static void fwd_bwd(model_t *m, float *const *g, const float *x, const float *y, int r0, int r1,
                    float norm, bool has_extra, int ex_end, tdist_ddp_t *ddp, const int *ord2,
                    int n2, const int *ord1, int n1, int bump)
{
    float hpre[BATCH][HID], h[BATCH][HID], d[BATCH][DOUT];
    bool ex_used = false;
    for (int s = r0; s < r1; s++) {
        for (int j = 0; j < HID; j++) {
            float a = m->p[P_B1][j];
            for (int k = 0; k < DIN; k++) a += m->p[P_W1][j * DIN + k] * x[s * DIN + k];
            hpre[s][j] = a;
            h[s][j] = a > 0 ? a : 0;
        }
        bool ue = has_extra && s < ex_end;
        ex_used |= ue;
        for (int o = 0; o < DOUT; o++) {
            float a = m->p[P_B2][o] + (ue ? m->p[P_EX][o] : 0.0f);
            for (int j = 0; j < HID; j++) a += m->p[P_W2][o * HID + j] * h[s][j];
            d[s][o] = (a - y[s * DOUT + o]) * norm;
        }
    }
    /* buffers: running mean over this rank's rows, counter */
    for (int j = 0; j < HID; j++) {
        float mean = 0;
        for (int s = r0; s < r1; s++) mean += h[s][j];
        if (r1 > r0) mean /= (float)(r1 - r0);
        m->running[j] = 0.9f * m->running[j] + 0.1f * mean;
    }
    m->batches += bump;

    /* layer 2 */
    for (int s = r0; s < r1; s++)
        for (int o = 0; o < DOUT; o++) {
            g[P_B2][o] += d[s][o];
            if (has_extra && s < ex_end) g[P_EX][o] += d[s][o];
            for (int j = 0; j < HID; j++) g[P_W2][o * HID + j] += d[s][o] * h[s][j];
        }
    if (ddp)
        for (int i = 0; i < n2; i++) {
            if (ord2[i] == P_EX && !ex_used) continue;
            ASSERT_OK(tdist_ddp_grad_ready(ddp, (size_t)ord2[i]));
        }
    /* layer 1 */
    for (int s = r0; s < r1; s++)
        for (int j = 0; j < HID; j++) {
            if (hpre[s][j] <= 0) continue;
            float dh = 0;
            for (int o = 0; o < DOUT; o++) dh += m->p[P_W2][o * HID + j] * d[s][o];
            g[P_B1][j] += dh;
            for (int k = 0; k < DIN; k++) g[P_W1][j * DIN + k] += dh * x[s * DIN + k];
        }
    if (ddp)
        for (int i = 0; i < n1; i++) ASSERT_OK(tdist_ddp_grad_ready(ddp, (size_t)ord1[i]));
}

static void expect_close(const char *what, const char *name, int step, const float *a,
                         const float *ref, size_t n, double scale)
{
    double maxref = 0, maxerr = 0;
    size_t worst = 0;
    for (size_t i = 0; i < n; i++) maxref = fmax(maxref, fabs((double)ref[i] * scale));
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - (double)ref[i] * scale);
        if (e > maxerr) {
            maxerr = e;
            worst = i;
        }
    }
    if (maxerr > TOL * fmax(maxref, 1e-30))
        FAIL("step %d %s of '%s': element %zu is %.9g, reference %.9g (max |ref| %.3g, "
             "relative error %.3g > %g)",
             step, what, name, worst, (double)a[worst], (double)ref[worst] * scale, maxref,
             maxerr / fmax(maxref, 1e-30), TOL);
}

/* Join the job and create the world group (timeout 20 s, scaled). */
static void open_pg(tdist_world_t **w, tdist_pg_t **pg)
{
    tdist_test_open_world(w, pg, (int64_t)(20000 * tdist_test_timeout_mult()));
}

/* -------------------------------------------------------- comm hooks */

typedef struct hook_state {
    tdist_ddp_t *ddp;
    size_t expect_next;  /* next bucket index expected */
    size_t calls, thens;
    int mode;
} hook_state_t;

static tdist_status_t times_two(void *state, const tdist_ddp_bucket_t *b, tdist_ddp_hook_result_t *next)
{
    hook_state_t *hs = state;
    hs->thens++;
    (void)next;
    return tdist_scale(b->buffer, b->count, b->dtype, 2.0);
}

static tdist_status_t test_hook(void *state, const tdist_ddp_bucket_t *b, tdist_ddp_hook_result_t *r)
{
    hook_state_t *hs = state;
    /* buckets arrive in index order, every iteration */
    if (b->index != hs->expect_next) FAIL("hook got bucket %zu, expected %zu", b->index, hs->expect_next);
    if (b->is_last != (b->index + 1 == b->num_buckets)) FAIL("is_last wrong for bucket %zu", b->index);
    hs->expect_next = b->is_last ? 0 : b->index + 1;
    hs->calls++;
    ASSERT_EQ(b->num_buckets, tdist_ddp_num_buckets(hs->ddp));
    ASSERT_EQ(b->dtype, TDIST_F32);
    ASSERT_EQ(b->divisor, tdist_pg_size(b->pg));
    size_t idx[NPAR];
    ASSERT_EQ(tdist_ddp_bucket_params(hs->ddp, b->index, idx, NPAR), b->num_params);
    size_t off = 0;
    for (size_t j = 0; j < b->num_params; j++) {
        ASSERT_EQ(b->param_indices[j], idx[j]);
        ASSERT_EQ(b->offsets[j], off);
        ASSERT_EQ(b->counts[j], pcount[idx[j]]);
        off += b->counts[j];
    }
    ASSERT_EQ(off, b->count);
    if ((b->grads != NULL) != (hs->mode == 3)) FAIL("bucket %zu: grads %p in mode %d", b->index, (void *)b->grads, hs->mode);
    if (hs->mode == 3) {
        /* each gradient where it lives: the caller's, or its slot with bucket views */
        for (size_t j = 0; j < b->num_params; j++)
            if (b->grads[j] != tdist_ddp_grad_ptr(hs->ddp, idx[j]))
                FAIL("bucket %zu: grads[%zu] is not parameter %zu's gradient", b->index, j, idx[j]);
    }
    if (hs->mode == 2 || hs->mode == 3) return tdist_ddp_allreduce_hook(NULL, b, r);
    r->then = times_two;
    return tdist_all_reduce(b->pg, b->buffer, b->buffer, b->count, b->dtype, TDIST_SUM, NULL, &r->work);
}

/* ------------------------------------------------------------ the run */

/* After a synchronised backward_end: every bucket's timeline is in order
 * (ready <= launch <= done), except in the first iteration, whose rebuild
 * may start the buckets afresh; gradient copies only on the copy path. */
static void check_timeline(tdist_ddp_t *ddp, const scenario_t *sc, int step)
{
    tdist_ddp_bucket_timeline_t t;
    size_t nb = tdist_ddp_num_buckets(ddp);
    ASSERT_STATUS(tdist_ddp_bucket_timeline(ddp, nb, &t), TDIST_ERR_INVALID_ARG);
    ASSERT_STATUS(tdist_ddp_bucket_timeline(ddp, 0, NULL), TDIST_ERR_INVALID_ARG);
    for (size_t b = 0; b < nb && step > 0; b++) {
        ASSERT_OK(tdist_ddp_bucket_timeline(ddp, b, &t));
        if (!(t.ready_ms > 0 && t.ready_ms <= t.launch_ms && t.launch_ms <= t.done_ms))
            FAIL("step %d bucket %zu: timeline ready %.6f launch %.6f done %.6f out of order", step,
                 b, t.ready_ms, t.launch_ms, t.done_ms);
    }
    tdist_ddp_stats_t st;
    ASSERT_OK(tdist_ddp_get_stats(ddp, &st));
    bool copies = !sc->opts.gradient_as_bucket_view &&
                  (sc->hook == 1 || sc->hook == 2 || (sc->hook == 0 && sc->opts.find_unused_parameters));
    if (copies ? !(st.last_copy_ms > 0) : st.last_copy_ms != 0)
        FAIL("step %d: last_copy_ms %.6f on the %s path", step, st.last_copy_ms,
             copies ? "copy" : "in-place");
    ASSERT_TRUE(st.total_copy_ms >= st.last_copy_ms);
}

static void run_scenario(int rank, int n, const scenario_t *sc, tdist_pg_t *pg)
{
    static model_t dm, rm; /* DDP model (this rank) and the reference */
    init_model(&dm, (uint64_t)rank + 1);
    init_model(&rm, 1);
    /* rank 0's buffers as the reference tracks them (for broadcast checks) */
    model_t r0buf = rm;
    int np = sc->extra ? NPAR : NPAR - 1;
    if (sc->extra == 1) { /* a sentinel that must survive (globally unused) */
        for (size_t j = 0; j < DOUT; j++) dm.g[P_EX][j] = rm.g[P_EX][j] = 7.0f;
    }

    tdist_ddp_param_t params[NPAR];
    for (int i = 0; i < np; i++)
        params[i] = (tdist_ddp_param_t){dm.p[i], dm.g[i], pcount[i], TDIST_F32, pname[i]};
    tdist_ddp_buffer_t bufs[2] = {{dm.running, HID, TDIST_F32, "bn.running_mean"},
                                  {&dm.batches, 1, TDIST_I64, "bn.num_batches"}};
    tdist_ddp_t *ddp = NULL;
    ASSERT_OK(tdist_ddp_create(pg, params, (size_t)np, bufs, 2, &sc->opts, &ddp));
    /* rank 0's parameters and buffers everywhere */
    if (sc->opts.sync_at_create) {
        for (int i = 0; i < np; i++) ASSERT_MEMEQ(dm.p[i], rm.p[i], pcount[i] * sizeof(float));
        ASSERT_MEMEQ(dm.running, rm.running, sizeof dm.running);
        ASSERT_EQ(dm.batches, rm.batches);
    }
    hook_state_t hs = {ddp, 0, 0, 0, sc->hook};
    if (sc->hook)
        ASSERT_OK(tdist_ddp_register_comm_hook_flags(ddp, &hs, test_hook,
                                                     sc->hook == 3 ? TDIST_DDP_HOOK_GRADS : 0));
    double gscale = sc->hook == 1 ? 2.0 * n : 1.0;

    /* grad_ready orders */
    int ord2[3], n2 = 0, ord1[2];
    if (sc->order == 0 || rank != 0) {
        if (sc->extra) ord2[n2++] = P_EX;
        ord2[n2++] = P_B2;
        ord2[n2++] = P_W2;
        ord1[0] = P_B1;
        ord1[1] = P_W1;
        if (sc->order == 1) { /* other ranks: yet another order */
            ord2[n2 - 2] = P_W2;
            ord2[n2 - 1] = P_B2;
        }
    } else { /* rank 0, order 1: weights first, extra last */
        ord2[n2++] = P_W2;
        ord2[n2++] = P_B2;
        if (sc->extra) ord2[n2++] = P_EX;
        ord1[0] = P_W1;
        ord1[1] = P_B1;
    }
    int r0 = rank * BATCH / n, r1 = (rank + 1) * BATCH / n;
    int ex_end = sc->extra == 2 ? BATCH / n : sc->extra == 1 ? 0 : BATCH;
    bool view = sc->opts.gradient_as_bucket_view;
    size_t total_bytes = 0;
    for (int i = 0; i < np; i++) total_bytes += pcount[i] * sizeof(float);
    uint64_t buckets_launched = 0;

    for (int step = 0; step < sc->steps; step++) {
        for (int mi = 0; mi < sc->micro; mi++) {
            bool last = mi == sc->micro - 1;
            float x[BATCH * DIN], y[BATCH * DOUT];
            make_batch(x, y, step, mi);
            ASSERT_OK(tdist_ddp_set_no_sync(ddp, !last));
            ASSERT_OK(tdist_ddp_forward_begin(ddp));
            if (sc->opts.broadcast_buffers) {
                ASSERT_EQ(dm.batches, r0buf.batches);
                expect_close("buffer", "bn.running_mean", step, dm.running, r0buf.running, HID, 1);
            } else {
                ASSERT_EQ(dm.batches, 100 + (rank + 1) * (step * sc->micro + mi));
            }
            float *g[NPAR];
            for (int i = 0; i < np; i++) g[i] = view ? tdist_ddp_grad_ptr(ddp, (size_t)i) : dm.g[i];
            if (np < NPAR) g[P_EX] = dm.g[P_EX];
            size_t nb_before = tdist_ddp_num_buckets(ddp);
            fwd_bwd(&dm, g, x, y, r0, r1, 1.0f / (float)(r1 - r0), sc->extra != 0, ex_end, ddp,
                    ord2, n2, ord1, 2, rank + 1);
            ASSERT_OK(tdist_ddp_backward_end(ddp));
            if (last) check_timeline(ddp, sc, step);
            /* the reference: whole batch; rank 0's buffers: rank 0's rows */
            float *rg[NPAR];
            for (int i = 0; i < NPAR; i++) rg[i] = rm.g[i];
            model_t before = rm;
            fwd_bwd(&rm, rg, x, y, 0, BATCH, 1.0f / BATCH, sc->extra != 0,
                    sc->extra == 2 ? BATCH / n : ex_end, NULL, NULL, 0, NULL, 0, 1);
            memcpy(rm.running, before.running, sizeof rm.running); /* only r0buf tracks buffers */
            {
                model_t t = rm;
                memcpy(t.running, r0buf.running, sizeof t.running);
                float *tg[NPAR];
                static float scratch[NPAR][HID * DIN];
                for (int i = 0; i < NPAR; i++) tg[i] = scratch[i];
                fwd_bwd(&t, tg, x, y, 0, BATCH / n, 1.0f, false, 0, NULL, NULL, 0, NULL, 0, 1);
                memcpy(r0buf.running, t.running, sizeof t.running);
                r0buf.batches += 1;
            }
            if (!last) continue;
            buckets_launched += nb_before;

            /* gradients */
            for (int i = 0; i < np; i++) {
                if (view) g[i] = tdist_ddp_grad_ptr(ddp, (size_t)i);
                if (i == P_EX && sc->extra == 1) {
                    for (size_t j = 0; j < DOUT; j++)
                        if (g[i][j] != 7.0f)
                            FAIL("step %d: grad of globally unused 'extra'[%zu] changed to %g",
                                 step, j, (double)g[i][j]);
                    continue;
                }
                expect_close("gradient", pname[i], step, g[i], rm.g[i], pcount[i], gscale);
            }
            /* SGD on both, then zero the gradients */
            for (int i = 0; i < np; i++) {
                if (i == P_EX && sc->extra == 1) continue;
                for (size_t j = 0; j < pcount[i]; j++) {
                    dm.p[i][j] -= LR * g[i][j];
                    rm.p[i][j] -= LR * (float)(rm.g[i][j] * gscale);
                }
                memset(g[i], 0, pcount[i] * sizeof(float));
                memset(rm.g[i], 0, pcount[i] * sizeof(float));
            }
            for (int i = 0; i < np; i++) expect_close("parameter", pname[i], step, dm.p[i], rm.p[i], pcount[i], 1);
        }
    }

    if (sc->order == 1 && sc->steps > 0) {
        /* rebuilt in rank 0's order: W2, B2, [EX], W1, B1 */
        int want[NPAR], k = 0;
        want[k++] = P_W2;
        want[k++] = P_B2;
        if (sc->extra == 2) want[k++] = P_EX;
        want[k++] = P_W1;
        want[k++] = P_B1;
        if (sc->extra == 1) want[k++] = P_EX; /* unused: appended */
        size_t idx[NPAR], got = 0;
        for (size_t b = 0; b < tdist_ddp_num_buckets(ddp); b++)
            got += tdist_ddp_bucket_params(ddp, b, idx + got, NPAR - got);
        ASSERT_EQ(got, np);
        for (int i = 0; i < np; i++)
            if ((int)idx[i] != want[i]) FAIL("after the rebuild, position %d holds parameter %zu, expected %d", i, idx[i], want[i]);
    }
    tdist_ddp_stats_t st;
    ASSERT_OK(tdist_ddp_get_stats(ddp, &st));
    ASSERT_EQ(st.iterations, sc->steps * sc->micro);
    ASSERT_EQ(st.sync_iterations, sc->steps);
    ASSERT_EQ(st.buckets_reduced, buckets_launched);
    ASSERT_EQ(st.bytes_reduced, total_bytes * (uint64_t)sc->steps);
    ASSERT_EQ(st.num_buckets, tdist_ddp_num_buckets(ddp));
    if (sc->order == 1) ASSERT_EQ(st.bucket_rebuilds, 1);
    if (sc->order == 0 && sc->extra == 0) ASSERT_EQ(st.bucket_rebuilds, 0);
    if (sc->hook) {
        ASSERT_EQ(hs.calls, buckets_launched);
        if (sc->hook == 1) ASSERT_EQ(hs.thens, buckets_launched);
    }
    if (sc->check_stats) {
        ASSERT_TRUE(st.last_compute_ms >= 0 && st.last_wait_ms >= 0);
        ASSERT_TRUE(st.last_wait_ms <= st.last_backward_end_ms + 1e-9);
        ASSERT_TRUE(st.total_compute_ms >= st.last_compute_ms);
        ASSERT_TRUE(n == 1 ? st.total_comm_ms >= 0 : st.total_comm_ms > 0);
        ASSERT_TRUE(st.overlap_fraction >= 0 && st.overlap_fraction <= 1);
        ASSERT_EQ(st.unused_parameters, 0);
    }
    if (sc->extra && sc->opts.find_unused_parameters)
        ASSERT_EQ(st.unused_parameters, sc->extra == 1 || rank != 0 ? 1 : 0);
    tdist_ddp_destroy(ddp);
}

static void scenario_body(int rank, int n, void *arg)
{
    tdist_world_t *w;
    tdist_pg_t *pg;
    open_pg(&w, &pg);
    run_scenario(rank, n, arg, pg);
    tdist_pg_destroy(pg);
    tdist_world_destroy(w);
}

static void scenario_defaults(scenario_t *sc)
{
    memset(sc, 0, sizeof *sc);
    tdist_ddp_opts_init(&sc->opts);
    sc->steps = 3;
    sc->micro = 1;
}

static void run_1_to_4(const scenario_t *sc)
{
    for (int n = 1; n <= 4; n++) tdist_test_run_ranks(n, scenario_body, (void *)sc);
}

/* ------------------------------------------------------------- tests */

TEST(ddp_opts_defaults, 5)
{
    tdist_ddp_opts_t o;
    memset(&o, 0xff, sizeof o);
    tdist_ddp_opts_init(&o);
    ASSERT_EQ(o.bucket_cap_bytes, 25 << 20);
    ASSERT_EQ(o.first_bucket_bytes, 1 << 20);
    ASSERT_TRUE(o.sync_at_create && o.broadcast_buffers);
    ASSERT_FALSE(o.find_unused_parameters || o.gradient_as_bucket_view || o.static_graph);
    ASSERT_EQ(o.overlap, TDIST_DDP_OVERLAP_ON);
}

TEST(ddp_mlp_matches_single_process, 60)
{
    scenario_t sc;
    scenario_defaults(&sc);
    sc.check_stats = true;
    run_1_to_4(&sc);
}

/* one bucket per parameter, tiny caps, a small first bucket, the default */
static void caps_body(int rank, int n, void *arg)
{
    (void)arg;
    tdist_world_t *w;
    tdist_pg_t *pg;
    open_pg(&w, &pg);
    static const size_t caps[][2] = {{1, 1}, {64, 16}, {300, 64}, {600, 1 << 20}, {25 << 20, 1 << 20}};
    for (size_t c = 0; c < ARRAY_SIZE(caps); c++) {
        scenario_t sc;
        scenario_defaults(&sc);
        sc.opts.bucket_cap_bytes = caps[c][0];
        sc.opts.first_bucket_bytes = caps[c][1];
        sc.steps = 2;
        run_scenario(rank, n, &sc, pg);
    }
    tdist_pg_destroy(pg);
    tdist_world_destroy(w);
}
TEST(ddp_bucket_caps, 90)
{
    for (int n = 1; n <= 4; n++) tdist_test_run_ranks(n, caps_body, NULL);
}

static void layout_body(int rank, int n, void *arg)
{
    (void)arg;
    tdist_world_t *w;
    tdist_pg_t *pg;
    open_pg(&w, &pg);
    static model_t m;
    init_model(&m, 1);
    tdist_ddp_param_t params[4];
    for (int i = 0; i < 4; i++) params[i] = (tdist_ddp_param_t){m.p[i], m.g[i], pcount[i], TDIST_F32, pname[i]};
    /* reverse order sizes: b2 16 B, W2 256 B, b1 64 B, W1 512 B */
    static const struct {
        size_t cap, first;
        size_t nb;
        int layout[4]; /* bucket of param 3, 2, 1, 0 */
    } cases[] = {
        {1, 1, 4, {0, 1, 2, 3}},      /* one bucket per parameter */
        {320, 16, 3, {0, 1, 1, 2}},   /* b2 | W2 + b1 = 320 | W1 */
        {600, 272, 2, {0, 0, 1, 1}},  /* b2 + W2 = 272 fill the first | b1 + W1 = 576 */
        {25 << 20, 1 << 20, 1, {0, 0, 0, 0}},
    };
    for (size_t c = 0; c < ARRAY_SIZE(cases); c++) {
        tdist_ddp_opts_t o;
        tdist_ddp_opts_init(&o);
        o.bucket_cap_bytes = cases[c].cap;
        o.first_bucket_bytes = cases[c].first;
        tdist_ddp_t *ddp;
        ASSERT_OK(tdist_ddp_create(pg, params, 4, NULL, 0, &o, &ddp));
        size_t nb = tdist_ddp_num_buckets(ddp);
        ASSERT_EQ(nb, cases[c].nb);
        size_t pos = 0;
        for (size_t b = 0; b < nb; b++) {
            size_t idx[4];
            size_t k = tdist_ddp_bucket_params(ddp, b, idx, 4);
            for (size_t j = 0; j < k; j++, pos++) {
                ASSERT_EQ(idx[j], 3 - pos); /* reverse parameter order */
                ASSERT_EQ(cases[c].layout[pos], b);
            }
        }
        ASSERT_EQ(pos, 4);
        tdist_ddp_destroy(ddp);
    }
    (void)rank;
    (void)n;
    tdist_pg_destroy(pg);
    tdist_world_destroy(w);
}
TEST(ddp_bucket_layout, 30)
{
    tdist_test_run_ranks(1, layout_body, NULL);
    tdist_test_run_ranks(2, layout_body, NULL);
}

TEST(ddp_unused_parameter_find_unused, 90)
{
    scenario_t sc;
    scenario_defaults(&sc);
    sc.opts.find_unused_parameters = true;
    sc.extra = 2; /* used by rank 0's samples only */
    run_1_to_4(&sc);
    sc.extra = 1; /* used nowhere: grad untouched */
    sc.opts.bucket_cap_bytes = 1;
    run_1_to_4(&sc);
}

TEST(ddp_unused_parameter_static_graph, 60)
{
    scenario_t sc;
    scenario_defaults(&sc);
    sc.opts.find_unused_parameters = true;
    sc.opts.static_graph = true;
    sc.extra = 2;
    run_1_to_4(&sc);
}

TEST(ddp_no_sync_accumulation, 60)
{
    scenario_t sc;
    scenario_defaults(&sc);
    sc.micro = 3;
    sc.opts.bucket_cap_bytes = 300;
    sc.opts.first_bucket_bytes = 64;
    run_1_to_4(&sc);
}

TEST(ddp_no_sync_with_unused_parameter, 60)
{
    scenario_t sc;
    scenario_defaults(&sc);
    sc.micro = 2;
    sc.extra = 2;
    sc.opts.find_unused_parameters = true;
    sc.opts.gradient_as_bucket_view = true;
    run_1_to_4(&sc);
}

TEST(ddp_bucket_rebuild, 60)
{
    scenario_t sc;
    scenario_defaults(&sc);
    sc.order = 1;
    sc.opts.bucket_cap_bytes = 1; /* one bucket per parameter: the order is the layout */
    run_1_to_4(&sc);
    sc.opts.bucket_cap_bytes = 300;
    sc.opts.first_bucket_bytes = 300;
    sc.extra = 2;
    sc.opts.find_unused_parameters = true;
    run_1_to_4(&sc);
}

TEST(ddp_gradient_as_bucket_view, 90)
{
    scenario_t sc;
    scenario_defaults(&sc);
    sc.opts.gradient_as_bucket_view = true;
    run_1_to_4(&sc);
    /* with a rebuild that moves the gradients, and an unused parameter */
    sc.order = 1;
    sc.extra = 1;
    sc.opts.find_unused_parameters = true;
    sc.opts.bucket_cap_bytes = 200;
    run_1_to_4(&sc);
}

TEST(ddp_buffer_broadcast_off, 60)
{
    scenario_t sc;
    scenario_defaults(&sc);
    sc.opts.broadcast_buffers = false;
    run_1_to_4(&sc);
}

TEST(ddp_comm_hook_times_two, 60)
{
    scenario_t sc;
    scenario_defaults(&sc);
    sc.hook = 1;
    sc.opts.bucket_cap_bytes = 100;
    sc.opts.first_bucket_bytes = 16;
    run_1_to_4(&sc);
}

TEST(ddp_comm_hook_wrapping_default, 60)
{
    scenario_t sc;
    scenario_defaults(&sc);
    sc.hook = 2;
    sc.order = 1;
    sc.opts.bucket_cap_bytes = 1;
    run_1_to_4(&sc);
}


/* sc (a reduction path) with several buckets and a rebuild, then with
 * no_sync and a parameter used on rank 0 only, one used nowhere (its
 * gradient untouched), and that with bucket views. */
static void run_option_matrix_on(scenario_t *sc, void (*run)(const scenario_t *))
{
    sc->order = 1;
    sc->opts.bucket_cap_bytes = 300;
    sc->opts.first_bucket_bytes = 64;
    sc->check_stats = true;
    run(sc);
    sc->check_stats = false;
    sc->micro = 2;
    sc->extra = 2;
    sc->opts.find_unused_parameters = true;
    run(sc);
    sc->micro = 1;
    sc->extra = 1;
    run(sc);
    sc->opts.gradient_as_bucket_view = true;
    run(sc);
}

static void run_option_matrix(scenario_t *sc) { run_option_matrix_on(sc, run_1_to_4); }

/* A hook on the gradients where they live: no copies, the same results,
 * with no_sync, unused parameters (one used nowhere keeps its gradient)
 * and bucket views. */
TEST(ddp_comm_hook_on_gradients, 90)
{
    scenario_t sc;
    scenario_defaults(&sc);
    sc.hook = 3;
    run_option_matrix(&sc);
}

/* Overlap off: backward_end reduces the buckets on the training thread;
 * the same results, with the direct path, unused parameters, no_sync and
 * bucket views. */
TEST(ddp_overlap_off, 90)
{
    scenario_t sc;
    scenario_defaults(&sc);
    sc.opts.overlap = TDIST_DDP_OVERLAP_OFF;
    run_option_matrix(&sc);
}

/* body on 2 ranks, then on 3 */
static void on_2_and_3(void (*body)(int, int, void *), void *arg)
{
    for (int n = 2; n <= 3; n++) tdist_test_run_ranks(n, body, arg);
}

static void run_2_and_3(const scenario_t *sc) { on_2_and_3(scenario_body, (void *)sc); }

/* Overlap INLINE: each bucket reduced on the training thread in the
 * grad_ready that completes it; the same results with the same options
 * as above (on 2 and 3 ranks: the paths are those of overlap off). */
TEST(ddp_overlap_inline, 60)
{
    scenario_t sc;
    scenario_defaults(&sc);
    sc.opts.overlap = TDIST_DDP_OVERLAP_INLINE;
    run_option_matrix_on(&sc, run_2_and_3);
}

/* Overlap off, the direct path: nothing is reduced before backward_end
 * (the gradients are still this rank's own after every grad_ready; with
 * overlap on they could already be averaged), and the averages are there
 * after it. */
static void overlap_off_body(int rank, int n, void *arg)
{
    (void)arg;
    tdist_world_t *w;
    tdist_pg_t *pg;
    open_pg(&w, &pg);
    float p[2][3] = {{0}}, g[2][3];
    tdist_ddp_param_t params[2] = {{p[0], g[0], 3, TDIST_F32, "a"}, {p[1], g[1], 3, TDIST_F32, "b"}};
    tdist_ddp_opts_t o;
    tdist_ddp_opts_init(&o);
    o.overlap = TDIST_DDP_OVERLAP_OFF;
    o.bucket_cap_bytes = o.first_bucket_bytes = 12; /* a bucket each */
    tdist_ddp_t *ddp;
    ASSERT_OK(tdist_ddp_create(pg, params, 2, NULL, 0, &o, &ddp));
    for (int step = 0; step < 3; step++) {
        for (int i = 0; i < 2; i++)
            for (int j = 0; j < 3; j++) g[i][j] = (float)((rank + 1) * (j + 1 + 10 * i + step));
        float want[2][3];
        for (int i = 0; i < 2; i++)
            for (int j = 0; j < 3; j++) /* the mean over ranks of (r + 1) x v */
                want[i][j] = (float)((j + 1 + 10 * i + step) * (n + 1)) / 2.0f;
        float own[2][3];
        memcpy(own, g, sizeof own);
        ASSERT_OK(tdist_ddp_forward_begin(ddp));
        ASSERT_OK(tdist_ddp_grad_ready(ddp, 1)); /* bucket 0 */
        ASSERT_OK(tdist_ddp_grad_ready(ddp, 0));
        ASSERT_MEMEQ(g, own, sizeof own);
        tdist_ddp_stats_t st;
        ASSERT_OK(tdist_ddp_get_stats(ddp, &st));
        ASSERT_EQ(st.buckets_reduced, 2 * (uint64_t)step); /* none launched yet */
        ASSERT_OK(tdist_ddp_backward_end(ddp));
        expect_close("gradient", "b", step, g[1], want[1], 3, 1);
        expect_close("gradient", "a", step, g[0], want[0], 3, 1);
    }
    tdist_ddp_destroy(ddp);
    tdist_pg_destroy(pg);
    tdist_world_destroy(w);
}

TEST(ddp_overlap_off_reduced_in_backward_end, 30) { on_2_and_3(overlap_off_body, NULL); }

/* Overlap INLINE: each bucket is reduced in the grad_ready that completes
 * it, on this thread (the gradients are averaged when it returns; the
 * first bucket with the second), and
 * every schedule (ON, OFF, INLINE, AUTO) gives the same bits: the same
 * collectives over the same gradients, which are random so that the
 * rounding of every average shows. */
#define BITS_N 3
#define BITS_LEN 1000
static void overlap_bits_body(int rank, int n, void *arg)
{
    (void)arg;
    tdist_world_t *w;
    tdist_pg_t *pg;
    open_pg(&w, &pg);
    static const tdist_ddp_overlap_t modes[] = {TDIST_DDP_OVERLAP_ON, TDIST_DDP_OVERLAP_OFF,
                                                TDIST_DDP_OVERLAP_INLINE, TDIST_DDP_OVERLAP_AUTO};
    enum { NM = ARRAY_SIZE(modes) };
    float(*p)[BITS_N][BITS_LEN] = calloc(NM, sizeof *p);
    float(*g)[BITS_N][BITS_LEN] = calloc(NM, sizeof *g);
    float(*own)[BITS_LEN] = calloc(BITS_N, sizeof *own);
    ASSERT_TRUE(p && g && own);
    tdist_ddp_t *ddp[NM];
    const char *tr = getenv("TDIST_TRANSPORT");
    bool shm = !(tr && !strcmp(tr, "tcp"));
    ASSERT_EQ(tdist_pg_shared_memory(pg), shm);
    ASSERT_FALSE(tdist_pg_shared_memory(NULL));
    for (size_t m = 0; m < NM; m++) {
        tdist_ddp_param_t params[BITS_N];
        for (int i = 0; i < BITS_N; i++)
            params[i] = (tdist_ddp_param_t){p[m][i], g[m][i], BITS_LEN, TDIST_F32, pname[i]};
        tdist_ddp_opts_t o;
        tdist_ddp_opts_init(&o);
        o.overlap = modes[m];
        o.bucket_cap_bytes = o.first_bucket_bytes = BITS_LEN * sizeof(float); /* a bucket each */
        ASSERT_OK(tdist_ddp_create(pg, params, BITS_N, NULL, 0, &o, &ddp[m]));
        tdist_ddp_stats_t st;
        ASSERT_OK(tdist_ddp_get_stats(ddp[m], &st));
        if (modes[m] == TDIST_DDP_OVERLAP_AUTO && shm)
            ASSERT_TRUE(st.overlap == TDIST_DDP_OVERLAP_ON || st.overlap == TDIST_DDP_OVERLAP_INLINE);
        else if (modes[m] == TDIST_DDP_OVERLAP_AUTO) /* TCP: the wire overlaps */
            ASSERT_EQ(st.overlap, TDIST_DDP_OVERLAP_ON);
        else
            ASSERT_EQ(st.overlap, modes[m]);
    }
    for (int step = 0; step < 2; step++) {
        rng_state = (uint64_t)(rank + 1) * 1000003 + (uint64_t)step;
        for (int i = 0; i < BITS_N; i++)
            for (int j = 0; j < BITS_LEN; j++) own[i][j] = frand() * (float)(1 + j % 7);
        for (size_t m = 0; m < NM; m++) {
            memcpy(g[m], own, sizeof g[m]);
            ASSERT_OK(tdist_ddp_forward_begin(ddp[m]));
            for (int i = BITS_N; i-- > 0;) { /* bucket 0 holds the last parameter */
                ASSERT_OK(tdist_ddp_grad_ready(ddp[m], (size_t)i));
                tdist_ddp_stats_t st;
                ASSERT_OK(tdist_ddp_get_stats(ddp[m], &st));
                if (modes[m] != TDIST_DDP_OVERLAP_INLINE) continue;
                /* reduced before grad_ready returned; bucket 0 (parameter
                 * BITS_N - 1) with bucket 1 */
                uint64_t done = i == BITS_N - 1 ? 0 : (uint64_t)(BITS_N - i);
                ASSERT_EQ(st.buckets_reduced, (uint64_t)(step * BITS_N) + done);
                if (n > 1 && done)
                    ASSERT_TRUE(memcmp(g[m][BITS_N - 1], own[BITS_N - 1], sizeof own[0]) != 0 &&
                                memcmp(g[m][i], own[i], sizeof own[i]) != 0);
            }
            ASSERT_OK(tdist_ddp_backward_end(ddp[m]));
            if (m > 0) ASSERT_MEMEQ(g[m], g[0], sizeof g[0]);
        }
    }
    for (size_t m = 0; m < NM; m++) tdist_ddp_destroy(ddp[m]);
    free(p);
    free(g);
    free(own);
    tdist_pg_destroy(pg);
    tdist_world_destroy(w);
}

TEST(ddp_overlap_schedules_same_bits, 30) { on_2_and_3(overlap_bits_body, NULL); }
