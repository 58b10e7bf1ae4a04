/* tests/join/test_join.c — DDP under Join with uneven inputs on 2, 3 and 4
 * ranks (including ranks with no input at all), against a serial reference
 * every rank computes itself; throw_on_early_termination; enable = false;
 * argument checks.
 *
 * The model: out = W x + b (W 2x3, b 2) plus `extra` (2) added to the
 * output only on rank 0 (an unused parameter elsewhere, in the
 * find_unused_parameters runs), loss 0.5 |out - t|^2, f64, plain SGD
 * applied by the test. A f64 buffer `cnt` gets rank + 1 added after each
 * forward_begin, so its value after each broadcast tells which rank was the
 * broadcast root. Rank r has counts[r] steps of `micro` micro-batches (all
 * but the last under no_sync).
 *
 * Reference: in step k the active ranks are A_k = {r : counts[r] > k}; the
 * averaged gradient is sum over A_k of each rank's gradient divided by the
 * world size (divide_by_initial_world_size) or by |A_k|. Every rank checks
 * its parameters after each of its steps and, after tdist_join_end, the
 * reference after every step of every rank (the last joiner's model). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "harness.h"
#include "tdist/join.h"

#include "join_model.h"

/* Join the job and create the world group (timeout 20 s, scaled). */
static void open_pg(tdist_world_t **w, tdist_pg_t **pg)
{
    tdist_test_open_world(w, pg, (int64_t)(20000 * tdist_test_timeout_mult()));
}


static void uneven_body(int rank, int n, void *arg)
{
    const scen_t *sc = arg;
    ASSERT_EQ(n, sc->n);
    static model_t ref[64];
    int K = ref_run(sc, ref, 64);

    tdist_world_t *w;
    tdist_pg_t *pg;
    open_pg(&w, &pg);
    model_t md;
    init_model(&md, rank);
    tdist_ddp_param_t params[3];
    model_params(&md, params);
    tdist_ddp_buffer_t bufs[1] = {{&md.cnt, 1, TDIST_F64, "cnt"}};
    tdist_ddp_opts_t o;
    tdist_ddp_opts_init(&o);
    if (sc->find_unused) {
        o.find_unused_parameters = true;
        o.bucket_cap_bytes = o.first_bucket_bytes = 8;
    }
    /* ranks may choose differently: the same collectives either way */
    if (sc->overlap_off && rank % 2) o.overlap = TDIST_DDP_OVERLAP_OFF;
    tdist_ddp_t *ddp;
    ASSERT_OK(tdist_ddp_create(pg, params, 3, bufs, 1, &o, &ddp));
    ASSERT_TRUE(md.cnt == 0.0);
    tdist_joinable_t j;
    ASSERT_OK(tdist_ddp_joinable(ddp, &j));
    ASSERT_TRUE(j.ctx == ddp && j.pg == pg);
    tdist_join_opts_t jo;
    tdist_join_opts_init(&jo);
    jo.divide_by_initial_world_size = sc->divide_initial;
    tdist_join_t *join;
    ASSERT_OK(tdist_join_begin(&j, 1, &jo, &join));

    /* the buffer value forward f broadcasts from root l_f: V_0 = 0 (rank 0's
     * after create), V_f = V_{f-1} + l_f + 1 (the root's value after its
     * previous forward, active then too) */
    double v = 0;
    bool first_fwd = true;
    int last = n - 1;
    for (int k = 0; k < K; k++) {
        int lowest = -1;
        for (int r = 0; r < n; r++)
            if (sc->counts[r] > k) {
                if (lowest < 0) lowest = r;
                last = r;
            }
        for (int m = 0; m < sc->micro; m++) {
            if (!first_fwd) v += lowest + 1;
            first_fwd = false;
            if (k < sc->counts[rank]) {
                if (m == 0) {
                    model_zero_grad(&md);
                }
                ASSERT_OK(tdist_ddp_set_no_sync(ddp, m + 1 < sc->micro));
                ASSERT_OK(tdist_ddp_forward_begin(ddp));
                if (md.cnt != v)
                    FAIL("step %d micro %d: buffer %.17g after the broadcast, expected %.17g (root "
                         "rank %d)",
                         k, m, md.cnt, v, lowest);
                md.cnt += rank + 1;
                grad(&md, rank, k, m, 1.0, md.gw, md.gb, md.gex);
                ASSERT_OK(tdist_ddp_grad_ready(ddp, 1));
                ASSERT_OK(tdist_ddp_grad_ready(ddp, 0));
                if (rank == 0)
                    ASSERT_OK(tdist_ddp_grad_ready(ddp, 2));
                else if (!sc->find_unused)
                    ASSERT_OK(tdist_ddp_grad_ready(ddp, 2)); /* zeros */
                ASSERT_OK(tdist_ddp_backward_end(ddp));
            }
        }
        if (k < sc->counts[rank]) {
            model_sgd(&md);
            expect_model(k, &md, &ref[k]);
        }
    }
    ASSERT_OK(tdist_join_end(join));
    /* every rank ends with the last joiner's model and buffer */
    expect_model(-1, &md, &ref[K ? K - 1 : 0]);
    double want_cnt = 0.0;
    if (K) want_cnt = v + last + 1; /* the last joiner's: last broadcast value + its rank + 1 */
    if (md.cnt != want_cnt)
        FAIL("final buffer %.17g, expected %.17g (last joiner rank %d)", md.cnt, want_cnt, last);
    /* the reducer works normally after the Join (no hook left behind) */
    ASSERT_OK(tdist_ddp_set_no_sync(ddp, false));
    ASSERT_OK(tdist_ddp_forward_begin(ddp));
    ASSERT_TRUE(md.cnt == want_cnt);
    for (int i = 0; i < 3; i++)
        ASSERT_OK(tdist_ddp_grad_ready(ddp, (size_t)i));
    ASSERT_OK(tdist_ddp_backward_end(ddp));
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

TEST(join_uneven_2_ranks, 60)
{
    static const int c[][2] = {{3, 5}, {0, 3}, {4, 0}, {2, 2}, {0, 0}};
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        scen_t sc = {.n = 2, .micro = 1};
        memcpy(sc.counts, c[i], sizeof c[i]);
        run_both_modes(sc);
    }
}

TEST(join_uneven_3_ranks, 60)
{
    static const int c[][3] = {{0, 4, 2}, {5, 1, 3}, {2, 3, 3}};
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        scen_t sc = {.n = 3, .micro = 1};
        memcpy(sc.counts, c[i], sizeof c[i]);
        run_both_modes(sc);
    }
}

TEST(join_uneven_overlap_off_on_odd_ranks, 60)
{
    static const int c[][4] = {{2, 0, 5, 3}, {4, 1, 0, 3}};
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        scen_t sc = {.n = 4, .micro = 1, .overlap_off = true, .find_unused = i == 1};
        memcpy(sc.counts, c[i], sizeof c[i]);
        run_both_modes(sc);
    }
}

TEST(join_uneven_4_ranks, 60)
{
    static const int c[][4] = {{2, 0, 5, 3}, {0, 0, 1, 0}, {3, 3, 1, 3}};
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        scen_t sc = {.n = 4, .micro = 1};
        memcpy(sc.counts, c[i], sizeof c[i]);
        run_both_modes(sc);
    }
}

/* find_unused_parameters (the used-set agreement is shadowed), one bucket
 * per parameter, and no_sync accumulation over 2 micro-batches */
TEST(join_uneven_find_unused_no_sync, 60)
{
    static const int c3[3] = {0, 3, 1}, c4[4] = {1, 4, 0, 2};
    scen_t sc = {.n = 3, .micro = 2, .find_unused = true};
    memcpy(sc.counts, c3, sizeof c3);
    run_both_modes(sc);
    scen_t sc4 = {.n = 4, .micro = 2, .find_unused = true};
    memcpy(sc4.counts, c4, sizeof c4);
    run_both_modes(sc4);
    scen_t sc2 = {.n = 2, .micro = 2};
    sc2.counts[0] = 2;
    sc2.counts[1] = 0;
    run_both_modes(sc2);
}

/* ------------------------------------------------ early termination */

typedef struct throw_case {
    int n;
    int counts[MAXR];
} throw_case_t;

static void throw_body(int rank, int n, void *arg)
{
    const throw_case_t *tc = arg;
    int first_out = 1 << 30;
    for (int r = 0; r < n; r++)
        first_out = tc->counts[r] < first_out ? tc->counts[r] : first_out;
    int maxc = 0;
    for (int r = 0; r < n; r++)
        maxc = tc->counts[r] > maxc ? tc->counts[r] : maxc;
    bool expect_throw = first_out < maxc;

    tdist_world_t *w;
    tdist_pg_t *pg;
    open_pg(&w, &pg);
    double p = 1.0, g = 0;
    tdist_ddp_param_t prm = {&p, &g, 1, TDIST_F64, "p"};
    tdist_ddp_t *ddp;
    ASSERT_OK(tdist_ddp_create(pg, &prm, 1, NULL, 0, NULL, &ddp));
    tdist_joinable_t j;
    ASSERT_OK(tdist_ddp_joinable(ddp, &j));
    tdist_join_opts_t jo;
    tdist_join_opts_init(&jo);
    jo.throw_on_early_termination = true;
    tdist_join_t *join;
    ASSERT_OK(tdist_join_begin(&j, 1, &jo, &join));
    double t0 = tdist_test_now_ms();
    int failed_at = -1;
    tdist_status_t st = TDIST_OK;
    for (int k = 0; k < tc->counts[rank]; k++) {
        st = tdist_ddp_forward_begin(ddp);
        if (st != TDIST_OK) {
            failed_at = k;
            break;
        }
        g = 1.0;
        ASSERT_OK(tdist_ddp_grad_ready(ddp, 0));
        ASSERT_OK(tdist_ddp_backward_end(ddp));
        p -= 0.1 * g;
    }
    char msg[1024] = "";
    if (failed_at >= 0) {
        ASSERT_EQ(st, TDIST_ERR_EARLY_TERMINATION);
        snprintf(msg, sizeof msg, "%s", tdist_last_error());
        /* end after the failure: the same error, no communication */
        ASSERT_STATUS(tdist_join_end(join), TDIST_ERR_EARLY_TERMINATION);
    } else {
        st = tdist_join_end(join);
        if (expect_throw) {
            ASSERT_EQ(st, TDIST_ERR_EARLY_TERMINATION);
            snprintf(msg, sizeof msg, "%s", tdist_last_error());
            failed_at = tc->counts[rank];
        } else {
            ASSERT_OK(st);
        }
    }
    if (expect_throw) {
        /* every rank fails in the iteration the first rank ran out */
        if (failed_at != first_out)
            FAIL("failed at iteration %d, expected %d: %s", failed_at, first_out, msg);
        ASSERT_CONTAINS(msg, "ran out of inputs");
        ASSERT_CONTAINS(msg, "throw_on_early_termination");
        char who[64];
        for (int r = 0; r < n; r++)
            if (tc->counts[r] == first_out) {
                snprintf(who, sizeof who, "%d", r);
                ASSERT_CONTAINS(msg, who);
            }
        ASSERT_CONTAINS(msg, "tdist_join_");
        ASSERT_CONTAINS(msg, "group world");
        double want = 1.0; /* no update after the failure: first_out steps, same arithmetic */
        for (int k = 0; k < first_out; k++) want -= 0.1 * 1.0;
        if (p != want) FAIL("p = %.17g after the failure, want %.17g (%d steps)", p, want, first_out);
    } else {
        ASSERT_EQ(failed_at, -1);
    }
    ASSERT_TRUE(tdist_test_now_ms() - t0 < 10000 * tdist_test_timeout_mult());
    /* nobody is left inside a collective: the group still works */
    ASSERT_OK(tdist_barrier(pg, NULL, NULL));
    tdist_ddp_destroy(ddp);
    tdist_pg_destroy(pg);
    tdist_world_destroy(w);
}

TEST(join_throw_on_early_termination, 90)
{
    throw_case_t a = {.n = 3, .counts = {3, 1, 3}};
    tdist_test_run_ranks(3, throw_body, &a);
    throw_case_t b = {.n = 2, .counts = {0, 2}};
    tdist_test_run_ranks(2, throw_body, &b);
    throw_case_t c = {.n = 4, .counts = {4, 2, 5, 2}};
    tdist_test_run_ranks(4, throw_body, &c);
    throw_case_t d = {.n = 2, .counts = {2, 2}}; /* even: no error */
    tdist_test_run_ranks(2, throw_body, &d);
    throw_case_t e = {.n = 8, .counts = {5, 3, 6, 3, 7, 4, 5, 6}}; /* ranks 1 and 3 run out */
    tdist_test_run_ranks(8, throw_body, &e);
}

/* --------------------------------------------------- enable = false */

static void disabled_body(int rank, int n, void *arg)
{
    (void)arg;
    tdist_world_t *w;
    tdist_pg_t *pg;
    open_pg(&w, &pg);
    model_t a, b;
    init_model(&a, rank);
    init_model(&b, rank);
    tdist_ddp_param_t pa[3] = {{a.w, a.gw, NO * NI, TDIST_F64, "W"},
                               {a.b, a.gb, NO, TDIST_F64, "b"},
                               {a.ex, a.gex, NO, TDIST_F64, "extra"}};
    tdist_ddp_param_t pb[3] = {{b.w, b.gw, NO * NI, TDIST_F64, "W"},
                               {b.b, b.gb, NO, TDIST_F64, "b"},
                               {b.ex, b.gex, NO, TDIST_F64, "extra"}};
    tdist_ddp_buffer_t ba = {&a.cnt, 1, TDIST_F64, "cnt"}, bb = {&b.cnt, 1, TDIST_F64, "cnt"};
    tdist_ddp_t *da, *db;
    ASSERT_OK(tdist_ddp_create(pg, pa, 3, &ba, 1, NULL, &da));
    ASSERT_OK(tdist_ddp_create(pg, pb, 3, &bb, 1, NULL, &db));
    tdist_joinable_t j;
    ASSERT_OK(tdist_ddp_joinable(da, &j));
    tdist_join_opts_t jo;
    tdist_join_opts_init(&jo);
    jo.enable = false;
    jo.throw_on_early_termination = true; /* ignored when disabled */
    tdist_join_t *join;
    ASSERT_OK(tdist_join_begin(&j, 1, &jo, &join));
    tdist_join_state_t js;
    ASSERT_OK(tdist_join_notify(join, da, 0, &js)); /* no communication */
    ASSERT_EQ(js.active, n);
    ASSERT_EQ(js.divisor, n);
    for (int k = 0; k < 3; k++) {
        model_t *ms[2] = {&a, &b};
        tdist_ddp_t *ds[2] = {da, db};
        for (int v = 0; v < 2; v++) {
            model_t *m = ms[v];
            memset(m->gw, 0, sizeof m->gw);
            memset(m->gb, 0, sizeof m->gb);
            memset(m->gex, 0, sizeof m->gex);
            ASSERT_OK(tdist_ddp_forward_begin(ds[v]));
            m->cnt += rank + 1;
            grad(m, rank, k, 0, 1.0, m->gw, m->gb, m->gex);
            for (int i = 0; i < 3; i++)
                ASSERT_OK(tdist_ddp_grad_ready(ds[v], (size_t)i));
            ASSERT_OK(tdist_ddp_backward_end(ds[v]));
            for (int i = 0; i < NO * NI; i++)
                m->w[i] -= LR * m->gw[i];
            for (int o = 0; o < NO; o++) {
                m->b[o] -= LR * m->gb[o];
                m->ex[o] -= LR * m->gex[o];
            }
        }
    }
    ASSERT_OK(tdist_join_end(join));
    /* identical, bit for bit, to the run without Join; no final sync
     * (buffers still differ per rank) */
    ASSERT_MEMEQ(a.w, b.w, sizeof a.w);
    ASSERT_MEMEQ(a.b, b.b, sizeof a.b);
    ASSERT_MEMEQ(a.ex, b.ex, sizeof a.ex);
    ASSERT_TRUE(a.cnt == b.cnt);
    tdist_ddp_stats_t sa, sb;
    ASSERT_OK(tdist_ddp_get_stats(da, &sa));
    ASSERT_OK(tdist_ddp_get_stats(db, &sb));
    ASSERT_EQ(sa.sync_iterations, sb.sync_iterations);
    ASSERT_EQ(sa.buckets_reduced, sb.buckets_reduced);
    ASSERT_EQ(sa.bytes_reduced, sb.bytes_reduced);
    tdist_ddp_destroy(da);
    tdist_ddp_destroy(db);
    tdist_pg_destroy(pg);
    tdist_world_destroy(w);
}

TEST(join_disabled_is_no_join, 90)
{
    static const int sizes[] = {2, 3, 4, 8};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        tdist_test_run_ranks(sizes[i], disabled_body, NULL);
}

/* --------------------------------------------------------- arguments */

TEST(join_args, 10)
{
    tdist_join_opts_t o;
    memset(&o, 0xff, sizeof o);
    tdist_join_opts_init(&o);
    ASSERT_TRUE(o.enable && o.divide_by_initial_world_size && !o.throw_on_early_termination);
    tdist_join_t *const sentinel = (tdist_join_t *)&o, *join = sentinel;
    ASSERT_STATUS(tdist_join_begin(NULL, 1, NULL, &join), TDIST_ERR_INVALID_ARG);
    ASSERT_TRUE(join == sentinel); /* out-parameters are written only on success */
    ASSERT_CONTAINS(tdist_last_error(), "joinables is NULL");
    tdist_joinable_t j = {0};
    ASSERT_STATUS(tdist_join_begin(&j, 0, NULL, &join), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "n is 0");
    ASSERT_STATUS(tdist_join_begin(&j, 1, NULL, &join), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "joinable 0 has no group");
    ASSERT_STATUS(tdist_join_begin(&j, 1, NULL, NULL), TDIST_ERR_INVALID_ARG);
    ASSERT_STATUS(tdist_join_end(NULL), TDIST_ERR_INVALID_ARG);
    ASSERT_STATUS(tdist_join_notify(NULL, NULL, 0, NULL), TDIST_ERR_INVALID_ARG);
    ASSERT_STATUS(tdist_ddp_joinable(NULL, &j), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "ddp is NULL");
}

/* the same at 8 ranks on 2 cores: find_unused_parameters with no_sync
 * micro-batches, two ranks without inputs (rank 0 among them) */
TEST(join_uneven_find_unused_no_sync_8, 120)
{
    static const int c8[8] = {0, 2, 4, 1, 3, 0, 2, 1};
    scen_t sc = {.n = 8, .micro = 2, .find_unused = true};
    memcpy(sc.counts, c8, sizeof c8);
    run_both_modes(sc);
}
