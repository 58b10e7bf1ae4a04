/* tests/join/test_join_shadow.c — rule 4 of docs/design.md: under a Join,
 * ranks that have run out of inputs shadow every collective the active
 * ranks issue on the group, not only DDP's.
 *
 * Each step of the loop issues, besides DDP's own collectives: user
 * all_reduces with every kind of identity (SUM, MAX on negative i32, MIN on
 * f32, PROD, AVG, BAND), a SyncBatchNorm-style all_gather of statistics, a
 * large all_reduce (the staged / ring path), reduce_scatter, all_to_all, a
 * broadcast and a gather rooted at the lowest active rank, and a barrier
 * after backward. Every rank computes what each must return from the
 * scenario's input counts (joined ranks count as the identity, their
 * all_gather / all_to_all / gather slots as zeros, AVG divides by the
 * Join's divisor) and the model is checked against join_model.h's serial
 * reference. Then the calls that cannot be shadowed: a root or a p2p peer
 * that has joined, the v-forms, monitored_barrier, and collectives before
 * the iteration's notification — each a clear error, never a hang. */
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "tdist/join.h"

#include "join_model.h"

#define BIG 70000 /* f32 elements: past the line and the first staging chunk */

static bool act(const scen_t *sc, int r, int k) { return sc->counts[r] > k; }

static int lowest_active(const scen_t *sc, int k)
{
    for (int r = 0; r < sc->n; r++)
        if (act(sc, r, k)) return r;
    return -1;
}

/* The user's collectives of step k on an active rank, each checked. */
static void user_collectives(tdist_pg_t *pg, const scen_t *sc, int rank, int k)
{
    int n = sc->n, low = lowest_active(sc, k), nact = active_at(sc, k);
    int divisor = sc->divide_initial ? n : nact;

    /* SUM f64 */
    double s = (rank + 1) * (k + 1.0), s_want = 0;
    for (int r = 0; r < n; r++)
        if (act(sc, r, k)) s_want += (r + 1) * (k + 1.0);
    ASSERT_OK(tdist_all_reduce(pg, &s, &s, 1, TDIST_F64, TDIST_SUM, NULL, NULL));
    if (s != s_want) FAIL("step %d: SUM %.17g, want %.17g", k, s, s_want);

    /* MAX i32 of negative values: a joined rank's 0 would win */
    int32_t mx = -(rank + 1) * 10 - k;
    ASSERT_OK(tdist_all_reduce(pg, &mx, &mx, 1, TDIST_I32, TDIST_MAX, NULL, NULL));
    ASSERT_EQ(mx, -(low + 1) * 10 - k);

    /* MIN f32 of positive values */
    float mn = (float)(rank + 1 + k);
    ASSERT_OK(tdist_all_reduce(pg, &mn, &mn, 1, TDIST_F32, TDIST_MIN, NULL, NULL));
    ASSERT_TRUE(mn == (float)(low + 1 + k));

    /* PROD f64 */
    double p = rank + 2.0, p_want = 1.0;
    for (int r = 0; r < n; r++)
        if (act(sc, r, k)) p_want *= r + 2.0;
    ASSERT_OK(tdist_all_reduce(pg, &p, &p, 1, TDIST_F64, TDIST_PROD, NULL, NULL));
    if (p != p_want) FAIL("step %d: PROD %.17g, want %.17g", k, p, p_want);

    /* AVG f64: over the Join's divisor */
    double a = rank + 1.0, a_sum = 0;
    for (int r = 0; r < n; r++)
        if (act(sc, r, k)) a_sum += r + 1.0;
    ASSERT_OK(tdist_all_reduce(pg, &a, &a, 1, TDIST_F64, TDIST_AVG, NULL, NULL));
    if (fabs(a - a_sum / divisor) > 1e-15)
        FAIL("step %d: AVG %.17g, want %.17g (divisor %d)", k, a, a_sum / divisor, divisor);

    /* BAND i64: each rank clears its own bit */
    int64_t band = ~((int64_t)1 << rank), band_want = ~(int64_t)0;
    for (int r = 0; r < n; r++)
        if (act(sc, r, k)) band_want &= ~((int64_t)1 << r);
    ASSERT_OK(tdist_all_reduce(pg, &band, &band, 1, TDIST_I64, TDIST_BAND, NULL, NULL));
    ASSERT_EQ(band, band_want);

    /* SyncBatchNorm-style: all_gather (mean, var) of every rank */
    double stats[2] = {rank + k + 0.5, 1.0 + rank}, all[2 * MAXR];
    memset(all, 0xff, sizeof all);
    ASSERT_OK(tdist_all_gather(pg, stats, all, 2, TDIST_F64, NULL, NULL));
    for (int r = 0; r < n; r++) {
        double m = act(sc, r, k) ? r + k + 0.5 : 0.0, v = act(sc, r, k) ? 1.0 + r : 0.0;
        if (all[2 * r] != m || all[2 * r + 1] != v)
            FAIL("step %d: all_gather slot of rank %d = (%g, %g), want (%g, %g)", k, r,
                 all[2 * r], all[2 * r + 1], m, v);
    }

    /* a large all_reduce: the staged (shm) / ring (tcp) path */
    float *big = malloc(BIG * sizeof *big);
    ASSERT_TRUE(big != NULL);
    for (int i = 0; i < BIG; i++) big[i] = (float)(rank + 1 + (i % 7));
    ASSERT_OK(tdist_all_reduce(pg, big, big, BIG, TDIST_F32, TDIST_SUM, NULL, NULL));
    for (int i = 0; i < BIG; i++) {
        float want = 0;
        for (int r = 0; r < n; r++)
            if (act(sc, r, k)) want += (float)(r + 1 + (i % 7));
        if (big[i] != want) FAIL("step %d: big[%d] = %g, want %g", k, i, big[i], want);
    }
    free(big);

    /* reduce_scatter SUM: block q of rank r's input is r + q + 1 */
    double rs_in[3 * MAXR], rs_out[3];
    for (int q = 0; q < n; q++)
        for (int i = 0; i < 3; i++) rs_in[3 * q + i] = rank + q + 1 + 0.25 * i;
    ASSERT_OK(tdist_reduce_scatter(pg, rs_in, rs_out, 3, TDIST_F64, TDIST_SUM, NULL, NULL));
    for (int i = 0; i < 3; i++) {
        double want = 0;
        for (int r = 0; r < n; r++)
            if (act(sc, r, k)) want += r + rank + 1 + 0.25 * i;
        if (rs_out[i] != want) FAIL("step %d: reduce_scatter[%d] %g, want %g", k, i, rs_out[i], want);
    }

    /* all_to_all: rank r sends 100 r + q to rank q */
    int32_t a2a_in[MAXR], a2a_out[MAXR];
    for (int q = 0; q < n; q++) a2a_in[q] = 100 * rank + q;
    ASSERT_OK(tdist_all_to_all(pg, a2a_in, a2a_out, 1, TDIST_I32, NULL, NULL));
    for (int q = 0; q < n; q++) ASSERT_EQ(a2a_out[q], act(sc, q, k) ? 100 * q + rank : 0);

    /* broadcast and gather rooted at the lowest active rank */
    double bc[5];
    for (int i = 0; i < 5; i++) bc[i] = rank == low ? k + 0.5 * i : -1.0;
    ASSERT_OK(tdist_broadcast(pg, bc, 5, TDIST_F64, low, NULL, NULL));
    for (int i = 0; i < 5; i++) ASSERT_TRUE(bc[i] == k + 0.5 * i);
    int64_t g = 7 + rank, gall[MAXR];
    ASSERT_OK(tdist_gather(pg, &g, gall, 1, TDIST_I64, low, NULL, NULL));
    if (rank == low)
        for (int r = 0; r < n; r++) ASSERT_EQ(gall[r], act(sc, r, k) ? 7 + r : 0);
}

/* One rank's set-up: the world group, the model (rank 0's wins at
 * create), DDP over it, a Join with divide mode `divide_initial`. */
typedef struct rig {
    tdist_world_t *w;
    tdist_pg_t *pg;
    model_t md;
    tdist_ddp_t *ddp;
    tdist_joinable_t j;
    tdist_join_t *join;
} rig_t;

static void rig_open(rig_t *g, int rank, bool divide_initial)
{
    tdist_test_open_world(&g->w, &g->pg, (int64_t)(30000 * tdist_test_timeout_mult()));
    init_model(&g->md, rank);
    tdist_ddp_param_t params[3];
    model_params(&g->md, params);
    ASSERT_OK(tdist_ddp_create(g->pg, params, 3, NULL, 0, NULL, &g->ddp));
    ASSERT_OK(tdist_ddp_joinable(g->ddp, &g->j));
    tdist_join_opts_t jo;
    tdist_join_opts_init(&jo);
    jo.divide_by_initial_world_size = divide_initial;
    ASSERT_OK(tdist_join_begin(&g->j, 1, &jo, &g->join));
}

static void rig_close(rig_t *g)
{
    tdist_ddp_destroy(g->ddp);
    tdist_pg_destroy(g->pg);
    tdist_world_destroy(g->w);
}

/* One DDP step of the model on an active rank: gradients, the reducer's
 * backward (parameters in reverse order), SGD. */
static void rig_backward_step(rig_t *g, int rank, int k)
{
    grad(&g->md, rank, k, 0, 1.0, g->md.gw, g->md.gb, g->md.gex);
    ASSERT_OK(tdist_ddp_grad_ready(g->ddp, 2));
    ASSERT_OK(tdist_ddp_grad_ready(g->ddp, 1));
    ASSERT_OK(tdist_ddp_grad_ready(g->ddp, 0));
    ASSERT_OK(tdist_ddp_backward_end(g->ddp));
}

static void shadow_body(int rank, int n, void *arg)
{
    const scen_t *sc = arg;
    ASSERT_EQ(n, sc->n);
    static model_t ref[64];
    int K = ref_run(sc, ref, 64);
    rig_t g;
    rig_open(&g, rank, sc->divide_initial);
    for (int k = 0; k < sc->counts[rank]; k++) {
        model_zero_grad(&g.md);
        ASSERT_OK(tdist_ddp_forward_begin(g.ddp));
        /* the state the notification found (no communication) */
        tdist_join_state_t js;
        ASSERT_OK(tdist_join_get_state(g.join, &js));
        ASSERT_EQ(js.active, active_at(sc, k));
        ASSERT_EQ(js.lowest_active, lowest_active(sc, k));
        user_collectives(g.pg, sc, rank, k);
        rig_backward_step(&g, rank, k);
        ASSERT_OK(tdist_barrier(g.pg, NULL, NULL)); /* after backward */
        model_sgd(&g.md);
        expect_model(k, &g.md, &ref[k]);
    }
    ASSERT_OK(tdist_join_end(g.join));
    expect_model(-1, &g.md, &ref[K ? K - 1 : 0]);
    /* the group works normally afterwards */
    double one = 1.0;
    ASSERT_OK(tdist_all_reduce(g.pg, &one, &one, 1, TDIST_F64, TDIST_SUM, NULL, NULL));
    ASSERT_TRUE(one == (double)n);
    rig_close(&g);
}

static void run_shadow(scen_t sc)
{
    for (int d = 0; d < 2; d++) {
        sc.divide_initial = d == 0;
        tdist_test_run_ranks(sc.n, shadow_body, &sc);
    }
}

TEST(join_shadow_user_collectives_2, 60) { run_shadow((scen_t){.n = 2, .counts = {2, 4}}); }
TEST(join_shadow_user_collectives_3, 60) { run_shadow((scen_t){.n = 3, .counts = {3, 0, 5}}); }
TEST(join_shadow_user_collectives_4, 90) { run_shadow((scen_t){.n = 4, .counts = {1, 4, 0, 3}}); }
TEST(join_shadow_user_collectives_8, 150)
{
    run_shadow((scen_t){.n = 8, .counts = {0, 3, 2, 1, 2, 4, 0, 2}});
}

/* ------------------------------------------------ what cannot be shadowed */

/* 3 ranks with 1, 3 and 3 inputs. Before the first notification every
 * collective is refused; from step 1 on, rank 0 has joined: a broadcast,
 * scatter, reduce or gather rooted at it, p2p with it, all_gatherv,
 * all_to_allv and monitored_barrier are refused on the calling ranks, at
 * once; the loop then goes on and finishes. */
static void refuse_body(int rank, int n, void *arg)
{
    (void)arg;
    ASSERT_EQ(n, 3);
    scen_t sc = {.n = 3, .counts = {1, 3, 3}, .divide_initial = true};
    static model_t ref[8];
    int K = ref_run(&sc, ref, 8);
    rig_t g;
    rig_open(&g, rank, true);
    tdist_pg_t *pg = g.pg;
    tdist_join_t *join = g.join;
    tdist_joinable_t j = g.j;
    /* a second Join on the same group is refused */
    tdist_join_t *again = NULL;
    ASSERT_STATUS(tdist_join_begin(&j, 1, NULL, &again), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "already in a Join");
    tdist_join_state_t js;
    ASSERT_STATUS(tdist_join_get_state(NULL, &js), TDIST_ERR_INVALID_ARG);
    ASSERT_STATUS(tdist_join_get_state(join, NULL), TDIST_ERR_INVALID_ARG);
    ASSERT_OK(tdist_join_get_state(join, &js));
    ASSERT_TRUE(js.iteration == 0 && js.active == 3);

    /* before the first notification */
    double x = 1.0;
    double t0 = tdist_test_now_ms();
    ASSERT_STATUS(tdist_all_reduce(pg, &x, &x, 1, TDIST_F64, TDIST_SUM, NULL, NULL),
                  TDIST_ERR_JOINED);
    ASSERT_CONTAINS(tdist_last_error(), "before this rank's first notification");
    ASSERT_CONTAINS(tdist_last_error(), "all_reduce(f64, 1, sum)");
    ASSERT_STATUS(tdist_barrier(pg, NULL, NULL), TDIST_ERR_JOINED);
    ASSERT_LE(tdist_test_now_ms() - t0, 1000.0);

    for (int k = 0; k < sc.counts[rank]; k++) {
        model_zero_grad(&g.md);
        ASSERT_OK(tdist_ddp_forward_begin(g.ddp));
        if (k >= 1) { /* rank 0 has joined */
            double v[3] = {1, 2, 3}, out[9];
            size_t cnt[3] = {1, 1, 1};
            t0 = tdist_test_now_ms();
            ASSERT_STATUS(tdist_broadcast(pg, v, 3, TDIST_F64, 0, NULL, NULL), TDIST_ERR_JOINED);
            ASSERT_CONTAINS(tdist_last_error(), "root rank 0 has run out of inputs");
            ASSERT_CONTAINS(tdist_last_error(), "broadcast(f64, 3, root 0)");
            ASSERT_CONTAINS(tdist_last_error(), "group world");
            ASSERT_STATUS(tdist_scatter(pg, v, out, 1, TDIST_F64, 0, NULL, NULL),
                          TDIST_ERR_JOINED);
            ASSERT_STATUS(tdist_reduce_to(pg, v, out, 1, TDIST_F64, TDIST_SUM, 0, NULL, NULL),
                          TDIST_ERR_JOINED);
            ASSERT_STATUS(tdist_gather(pg, v, out, 1, TDIST_F64, 0, NULL, NULL),
                          TDIST_ERR_JOINED);
            ASSERT_STATUS(tdist_send(pg, v, 1, TDIST_F64, 0, NULL, NULL), TDIST_ERR_JOINED);
            ASSERT_CONTAINS(tdist_last_error(), "peer rank 0");
            ASSERT_STATUS(tdist_recv(pg, v, 1, TDIST_F64, 0, NULL, NULL), TDIST_ERR_JOINED);
            ASSERT_STATUS(tdist_all_gatherv(pg, v, out, cnt, TDIST_F64, NULL, NULL),
                          TDIST_ERR_JOINED);
            ASSERT_STATUS(tdist_all_to_allv(pg, v, cnt, out, cnt, TDIST_F64, NULL, NULL),
                          TDIST_ERR_JOINED);
            ASSERT_STATUS(tdist_monitored_barrier(pg, NULL), TDIST_ERR_JOINED);
            ASSERT_CONTAINS(tdist_last_error(), "use barrier");
            ASSERT_LE(tdist_test_now_ms() - t0, 1000.0);
            /* p2p between active ranks still works */
            double pv = rank;
            int peer = rank == 1 ? 2 : 1;
            if (rank == 1) {
                ASSERT_OK(tdist_send(pg, &pv, 1, TDIST_F64, peer, NULL, NULL));
            } else {
                ASSERT_OK(tdist_recv(pg, &pv, 1, TDIST_F64, peer, NULL, NULL));
                ASSERT_TRUE(pv == 1.0);
            }
            /* and a broadcast from an active rank is shadowed */
            v[0] = rank == 2 ? 42.0 : 0.0;
            ASSERT_OK(tdist_broadcast(pg, v, 1, TDIST_F64, 2, NULL, NULL));
            ASSERT_TRUE(v[0] == 42.0);
        }
        rig_backward_step(&g, rank, k);
        model_sgd(&g.md);
        expect_model(k, &g.md, &ref[k]);
    }
    ASSERT_OK(tdist_join_end(join));
    expect_model(-1, &g.md, &ref[K - 1]);
    rig_close(&g);
}

TEST(join_shadow_refuses_what_it_cannot_shadow, 60) { tdist_test_run_ranks(3, refuse_body, NULL); }

/* 2 ranks with 1 and 2 inputs, a barrier at the top of every iteration,
 * before forward_begin. Iteration 0: refused on both (before the first
 * notification). Iteration 1: rank 0 is in tdist_join_end's first
 * notification, which no collective may meet: rank 1's barrier and rank
 * 0's tdist_join_end both fail with the mismatch, fast, naming the
 * notification. */
static void early_body(int rank, int n, void *arg)
{
    (void)arg;
    ASSERT_EQ(n, 2);
    tdist_world_t *w;
    tdist_pg_t *pg;
    tdist_test_open_world(&w, &pg, 30000); /* a hang would show as 30 s */
    double p[2] = {0.5, -0.5}, g[2] = {0, 0};
    tdist_ddp_param_t prm[2] = {{&p[0], &g[0], 1, TDIST_F64, "weight"},
                                {&p[1], &g[1], 1, TDIST_F64, "bias"}};
    tdist_ddp_t *ddp;
    ASSERT_OK(tdist_ddp_create(pg, prm, 2, NULL, 0, NULL, &ddp));
    tdist_joinable_t j;
    ASSERT_OK(tdist_ddp_joinable(ddp, &j));
    tdist_join_t *join;
    ASSERT_OK(tdist_join_begin(&j, 1, NULL, &join));
    int mine = 1 + rank;
    for (int k = 0; k < mine; k++) {
        double t0 = tdist_test_now_ms();
        tdist_status_t st = tdist_barrier(pg, NULL, NULL);
        double dt = tdist_test_now_ms() - t0;
        if (k == 0) {
            ASSERT_STATUS(st, TDIST_ERR_JOINED);
            ASSERT_CONTAINS(tdist_last_error(), "before this rank's first notification");
        } else {
            ASSERT_STATUS(st, TDIST_ERR_MISMATCH);
            ASSERT_CONTAINS(tdist_last_error(), "join_notification");
            ASSERT_CONTAINS(tdist_last_error(), "barrier()");
            ASSERT_CONTAINS(tdist_last_error(), "after the iteration's notification");
            if (dt > 5000) FAIL("the barrier failed after %.0f ms (limit 5000)", dt);
            break;
        }
        ASSERT_OK(tdist_ddp_forward_begin(ddp));
        g[0] = 1.0;
        g[1] = 1.0;
        ASSERT_OK(tdist_ddp_grad_ready(ddp, 1));
        ASSERT_OK(tdist_ddp_grad_ready(ddp, 0));
        ASSERT_OK(tdist_ddp_backward_end(ddp));
    }
    double t0 = tdist_test_now_ms();
    tdist_status_t st = tdist_join_end(join);
    double dt = tdist_test_now_ms() - t0;
    ASSERT_STATUS(st, TDIST_ERR_MISMATCH);
    if (rank == 0) {
        ASSERT_CONTAINS(tdist_last_error(), "join_notification");
        if (dt > 5000) FAIL("tdist_join_end failed after %.0f ms (limit 5000)", dt);
    } else {
        /* rank 1's group failed at the barrier: join_end reports that */
        ASSERT_CONTAINS(tdist_last_error(), "collective mismatch");
    }
    tdist_ddp_destroy(ddp);
    tdist_pg_destroy(pg);
    tdist_world_destroy(w);
}

TEST(join_shadow_collective_before_notification_fails_fast, 60)
{
    tdist_test_run_ranks(2, early_body, NULL);
}

/* The ranks pass different Join options: the first notification fails on
 * every rank, naming both ranks' options; nothing hangs. */
static void opts_body(int rank, int n, void *arg)
{
    (void)arg;
    ASSERT_EQ(n, 3);
    tdist_world_t *w;
    tdist_pg_t *pg;
    tdist_test_open_world(&w, &pg, 30000);
    double p = 1.0, g = 0.0;
    tdist_ddp_param_t prm = {&p, &g, 1, TDIST_F64, "p"};
    tdist_ddp_t *ddp;
    ASSERT_OK(tdist_ddp_create(pg, &prm, 1, NULL, 0, NULL, &ddp));
    tdist_joinable_t j;
    ASSERT_OK(tdist_ddp_joinable(ddp, &j));
    tdist_join_opts_t jo;
    tdist_join_opts_init(&jo);
    jo.divide_by_initial_world_size = rank != 2;
    tdist_join_t *join;
    ASSERT_OK(tdist_join_begin(&j, 1, &jo, &join));
    double t0 = tdist_test_now_ms();
    ASSERT_STATUS(tdist_ddp_forward_begin(ddp), TDIST_ERR_MISMATCH);
    ASSERT_CONTAINS(tdist_last_error(), "different Join options");
    ASSERT_CONTAINS(tdist_last_error(), "rank 0 throw_on_early_termination=0 "
                                        "divide_by_initial_world_size=1, rank 2 "
                                        "throw_on_early_termination=0 "
                                        "divide_by_initial_world_size=0");
    ASSERT_LE(tdist_test_now_ms() - t0, 5000.0);
    ASSERT_STATUS(tdist_join_end(join), TDIST_ERR_MISMATCH);
    /* the group is still usable */
    double one = 1.0;
    ASSERT_OK(tdist_all_reduce(pg, &one, &one, 1, TDIST_F64, TDIST_SUM, NULL, NULL));
    ASSERT_TRUE(one == 3.0);
    tdist_ddp_destroy(ddp);
    tdist_pg_destroy(pg);
    tdist_world_destroy(w);
}

TEST(join_options_must_match, 30) { tdist_test_run_ranks(3, opts_body, NULL); }

/* ----------------------------------------- a generic joinable, per-joinable args */

/* Two joinables without DDP, no main hook: the first notifies, each
 * iteration all_reduces a value (shadowed by rule 4 on joined ranks); the
 * post hooks see their own args and is_last_joiner. */
typedef struct counter {
    int posts;
    bool last;
    const void *args_seen;
    int last_joiner;
} counter_t;

static tdist_status_t counter_post(void *ctx, bool is_last_joiner, const tdist_join_state_t *st)
{
    counter_t *c = ctx;
    c->posts++;
    c->last = is_last_joiner;
    c->args_seen = st->args;
    c->last_joiner = st->last_joiner;
    return TDIST_OK;
}

static void generic_body(int rank, int n, void *arg)
{
    (void)arg;
    tdist_world_t *w;
    tdist_pg_t *pg;
    tdist_test_open_world(&w, &pg, (int64_t)(30000 * tdist_test_timeout_mult()));
    static const int counts[4] = {2, 0, 3, 1};
    static const char args_a[] = "a", args_b[] = "b";
    counter_t ca = {0}, cb = {0};
    tdist_joinable_t js[2] = {
        {.ctx = &ca, .pg = pg, .post_hook = counter_post, .args = args_a},
        {.ctx = &cb, .pg = pg, .post_hook = counter_post, .args = args_b},
    };
    tdist_join_t *join;
    ASSERT_OK(tdist_join_begin(js, 2, NULL, &join));
    for (int k = 0; k < counts[rank]; k++) {
        tdist_join_state_t st;
        ASSERT_OK(tdist_join_notify(join, &ca, 0, &st));
        ASSERT_TRUE(st.args == args_a);
        ASSERT_OK(tdist_join_notify(join, &cb, 0, &st)); /* not the first: reads */
        ASSERT_TRUE(st.args == args_b);
        int64_t v = rank + 1, want = 0;
        for (int r = 0; r < n; r++)
            if (counts[r] > k) want += r + 1;
        ASSERT_OK(tdist_all_reduce(pg, &v, &v, 1, TDIST_I64, TDIST_SUM, NULL, NULL));
        ASSERT_EQ(v, want);
    }
    ASSERT_OK(tdist_join_end(join));
    ASSERT_EQ(ca.posts, 1);
    ASSERT_EQ(cb.posts, 1);
    ASSERT_TRUE(ca.args_seen == args_a && cb.args_seen == args_b);
    ASSERT_EQ(ca.last_joiner, 2);
    ASSERT_TRUE(ca.last == (rank == 2) && cb.last == (rank == 2));
    tdist_pg_destroy(pg);
    tdist_world_destroy(w);
}

TEST(join_generic_joinable_args_and_shadowing, 30) { tdist_test_run_ranks(4, generic_body, NULL); }
