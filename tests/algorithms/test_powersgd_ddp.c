/* tests/algorithms/test_powersgd_ddp.c — PowerSGD under the DDP reducer
 * on a synthetic model (7 parameters: matrices of several shapes, 1-D
 * ones, a single column), 2 and 3 real ranks:
 *
 * 1. which tensors are compressed (PyTorch's rule), and 1-D tensors
 *    never: with 2 ranks their average is bit for bit fl(fl(x0 + x1) / 2)
 *    with x = g + e (PyTorch's error quirk) or x = g (quirk off);
 * 2. ranks whose options differ fail together before any gradient moves;
 * 3. checkpointing: 6 steps equal 3 steps, save, a new reducer and state,
 *    load, 3 steps, bit for bit — also when the new reducer rebuilds its
 *    buckets into another layout while error buffers exist (the errors
 *    are kept per parameter); damaged, truncated and foreign states fail;
 * 4. Join: a joined rank runs the hook on zeros, and every rank's result
 *    and state equal those of a run where the rank feeds zeros itself;
 * 5. the batched hook: the same output on every rank, the error of the
 *    padding kept, output + error = input, and the output and this
 *    rank's error (padding included) of every step against the
 *    reference (powersgd_ref.h) on the zero-padded square matrix;
 * 6. serial and pipelined modes give the same bits; step times of both
 *    with several buckets are printed;
 * 7. a matrix that is 0 on every rank in the first compressed step (the
 *    batched hook: a bucket), with epsilon 0 and warm start: NaN for good
 *    by default (PyTorch's behaviour), and with repair_zero 0 in that
 *    step, finite and not 0 once used again, the same bits on every rank,
 *    and every other tensor's bits as without it. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "powersgd_ref.h"
#include "tdist/algorithms.h"

#define SYN_NP 7
#define SYN_N  679
static const size_t syn_count[SYN_NP] = {240, 24, 144, 200, 6, 40, 25};
static const size_t syn_rows[SYN_NP] = {24, 0, 6, 10, 0, 40, 5};
static const char *const syn_name[SYN_NP] = {"w1", "b1", "w2", "w3", "b2", "thin", "w4"};

typedef struct syn {
    float p[SYN_N], g[SYN_N];
    tdist_ddp_param_t params[SYN_NP];
} syn_t;

static uint32_t bits_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static size_t syn_off(size_t p)
{
    size_t off = 0;
    for (size_t j = 0; j < p; j++) off += syn_count[j];
    return off;
}

static void syn_init(syn_t *m)
{
    memset(m, 0, sizeof *m);
    for (size_t j = 0; j < SYN_NP; j++)
        m->params[j] = (tdist_ddp_param_t){m->p + syn_off(j), m->g + syn_off(j), syn_count[j],
                                           TDIST_F32, syn_name[j]};
}

static float syn_grad(int rank, int k, size_t i)
{
    return (float)(0.01 * sin(0.37 * (double)i + 1.3 * k + 0.7 * rank) +
                   0.004 * cos(0.05 * (double)i * (k + 1) - rank));
}

static void open_group(tdist_world_t **w, tdist_pg_t **pg)
{
    tdist_test_open_world(w, pg, (int64_t)(20000 * tdist_test_timeout_mult()));
}

static void syn_opts(tdist_powersgd_opts_t *o, int rank_r, double rate)
{
    tdist_powersgd_opts_init(o);
    o->matrix_approximation_rank = rank_r;
    o->start_powerSGD_iter = 2;
    o->min_compression_rate = rate;
    o->random_seed = 7;
    o->param_rows = syn_rows;
    o->num_params = SYN_NP;
}

static tdist_ddp_t *syn_ddp(tdist_pg_t *pg, syn_t *m, size_t cap)
{
    tdist_ddp_opts_t o;
    tdist_ddp_opts_init(&o);
    if (cap) o.bucket_cap_bytes = o.first_bucket_bytes = cap;
    tdist_ddp_t *ddp;
    ASSERT_OK(tdist_ddp_create(pg, m->params, SYN_NP, NULL, 0, &o, &ddp));
    return ddp;
}

/* One iteration: rank's gradients of step k (zeros if zero), ready in
 * `order` (NULL: reverse). */
static void syn_step(tdist_ddp_t *ddp, syn_t *m, int rank, int k, const size_t *order, bool zero)
{
    ASSERT_OK(tdist_ddp_forward_begin(ddp));
    for (size_t i = 0; i < SYN_N; i++) m->g[i] = zero ? 0.0f : syn_grad(rank, k, i);
    for (size_t j = 0; j < SYN_NP; j++)
        ASSERT_OK(tdist_ddp_grad_ready(ddp, order ? order[j] : SYN_NP - 1 - j));
    ASSERT_OK(tdist_ddp_backward_end(ddp));
}

/* ============================== 1. compression decision, 1-D tensors */

typedef struct lens {
    size_t p_local, q_local, error;
    int calls;
} lens_t;

static void lens_observe(void *arg, const tdist_ddp_bucket_t *b, tdist_powersgd_stage_t st,
                         const float *data, size_t n)
{
    (void)b;
    (void)data;
    lens_t *l = arg;
    if (st == TDIST_POWERSGD_P_LOCAL) l->p_local = n, l->calls++;
    if (st == TDIST_POWERSGD_Q_LOCAL) l->q_local = n;
    if (st == TDIST_POWERSGD_ERROR) l->error = n;
}

/* The exact average of the 1-D tensors over 2 ranks, step by step, with
 * the error kept for them (quirk) or not. */
static void check_1d(const syn_t *m, int k, float e[2][SYN_N], bool quirk)
{
    const size_t one_d[2] = {1, 4};
    for (int t = 0; t < 2; t++)
        for (size_t i = syn_off(one_d[t]); i < syn_off(one_d[t]) + syn_count[one_d[t]]; i++) {
            float x0 = syn_grad(0, k, i), x1 = syn_grad(1, k, i);
            if (k > 2 && quirk) x0 = x0 + e[0][i], x1 = x1 + e[1][i];
            float avg = k < 2 ? x0 / 2.0f + x1 / 2.0f : (x0 + x1) / 2.0f;
            if (bits_of(m->g[i]) != bits_of(avg))
                FAIL("step %d '%s' element %zu: %.9g, the exact average %.9g", k,
                     syn_name[one_d[t]], i - syn_off(one_d[t]), (double)m->g[i], (double)avg);
            if (k >= 2) e[0][i] = x0 - avg, e[1][i] = x1 - avg;
        }
}

static void decision_body(int rank, int n, void *arg)
{
    (void)arg;
    ASSERT_EQ(n, 2);
    tdist_world_t *w;
    tdist_pg_t *pg;
    open_group(&w, &pg);
    static syn_t m;
    static float e[2][SYN_N];
    /* r = 2, rate 2: w1, w2, w3 compressed; w4 (5x5), thin (40x1) and the
     * 1-D ones not. rate 0: every 2-D tensor, never the 1-D ones. */
    const struct {
        double rate;
        bool quirk;
        size_t u, p, q;
    } cs[3] = {{2, true, 24 + 6 + 40 + 25, 24 * 2 + 6 * 2 + 10 * 2, 10 * 2 + 24 * 2 + 20 * 2},
               {0, true, 24 + 6, 80 + 40 + 10, 108 + 1 + 10},
               {0, false, 24 + 6, 80 + 40 + 10, 108 + 1 + 10}};
    for (int c = 0; c < 3; c++) {
        syn_init(&m);
        memset(e, 0, sizeof e);
        tdist_ddp_t *ddp = syn_ddp(pg, &m, 0);
        lens_t l = {0};
        tdist_powersgd_opts_t o;
        syn_opts(&o, 2, cs[c].rate);
        o.error_feedback_uncompressed = cs[c].quirk;
        o.observe = lens_observe;
        o.observe_arg = &l;
        tdist_powersgd_t *s;
        ASSERT_OK(tdist_powersgd_create(&o, &s));
        ASSERT_OK(tdist_powersgd_register(ddp, s));
        for (int k = 0; k < 5; k++) {
            syn_step(ddp, &m, rank, k, NULL, false);
            ASSERT_EQ(l.calls, k < 2 ? 0 : k - 1);
            if (k >= 2) {
                ASSERT_EQ(l.p_local, cs[c].u + cs[c].p);
                ASSERT_EQ(l.q_local, cs[c].q);
                ASSERT_EQ(l.error, SYN_N);
            }
            check_1d(&m, k, e, cs[c].quirk);
        }
        tdist_ddp_destroy(ddp);
        tdist_powersgd_destroy(s);
    }
    tdist_pg_destroy(pg);
    tdist_world_destroy(w);
}

TEST(powersgd_compression_decision_and_1d_tensors_exact, 60)
{
    tdist_test_run_ranks(2, decision_body, NULL);
}

/* ======================================================= 2. agreement */

static void mismatch_body(int rank, int n, void *arg)
{
    (void)arg;
    tdist_world_t *w;
    tdist_pg_t *pg;
    open_group(&w, &pg);
    static syn_t m;
    syn_init(&m);
    tdist_ddp_t *ddp = syn_ddp(pg, &m, 0);
    tdist_powersgd_opts_t o;
    syn_opts(&o, rank == n - 1 ? 2 : 1, 2);
    tdist_powersgd_t *s;
    ASSERT_OK(tdist_powersgd_create(&o, &s));
    ASSERT_OK(tdist_powersgd_register(ddp, s));
    ASSERT_OK(tdist_ddp_forward_begin(ddp));
    for (size_t i = 0; i < SYN_N; i++) m.g[i] = syn_grad(rank, 0, i);
    for (size_t j = SYN_NP; j-- > 1;) ASSERT_OK(tdist_ddp_grad_ready(ddp, j));
    ASSERT_STATUS(tdist_ddp_grad_ready(ddp, 0), TDIST_ERR_MISMATCH);
    ASSERT_STATUS(tdist_ddp_backward_end(ddp), TDIST_ERR_MISMATCH);
    char want[256];
    snprintf(want, sizeof want,
             "comm hook mismatch: rank 0 runs powerSGD_hook(rank 1, start 2, rate 2, ef, warm), "
             "rank %d runs powerSGD_hook(rank 2, start 2, rate 2, ef, warm)",
             n - 1);
    ASSERT_CONTAINS(tdist_last_error(), want);
    ASSERT_CONTAINS(tdist_last_error(), "tdist_powersgd_hook: rank");
    for (size_t i = 0; i < SYN_N; i++)
        ASSERT_TRUE(m.g[i] == syn_grad(rank, 0, i)); /* nothing sent */
    ASSERT_OK(tdist_barrier(pg, NULL, NULL));        /* the group is still usable */
    tdist_ddp_destroy(ddp);
    tdist_powersgd_destroy(s);
    tdist_pg_destroy(pg);
    tdist_world_destroy(w);
}

TEST(powersgd_ranks_with_other_options_fail_together, 60)
{
    tdist_test_run_ranks(3, mismatch_body, NULL);
}

/* ====================================================== 3. checkpoints */

typedef struct resume_scen {
    size_t cap;   /* bucket cap: several buckets */
    bool reorder; /* grad_ready in another order: the rebuild changes the layout */
    bool batched;
} resume_scen_t;

static const size_t syn_order[SYN_NP] = {2, 6, 0, 4, 1, 5, 3};

static uint64_t layout_sig(const tdist_ddp_t *ddp)
{
    uint64_t h = 1469598103934665603ULL;
    size_t nb = tdist_ddp_num_buckets(ddp), idx[SYN_NP];
    for (size_t b = 0; b < nb; b++) {
        size_t np = tdist_ddp_bucket_params(ddp, b, idx, SYN_NP);
        for (size_t j = 0; j < np; j++) h = (h ^ (idx[j] + 1000 * b)) * 1099511628211ULL;
        h = (h ^ 0xff) * 1099511628211ULL;
    }
    return h;
}

/* Steps [k0, k1) on a new reducer over s; the gradients of step k to
 * out[k]; whether the reducer's bucket layout changed on the way. */
static bool run_steps(tdist_pg_t *pg, tdist_powersgd_t *s, const resume_scen_t *sc, int rank,
                      int k0, int k1, float (*out)[SYN_N])
{
    static syn_t m;
    syn_init(&m);
    tdist_ddp_t *ddp = syn_ddp(pg, &m, sc->cap);
    ASSERT_OK(tdist_powersgd_register(ddp, s));
    uint64_t before = layout_sig(ddp);
    ASSERT_TRUE(tdist_ddp_num_buckets(ddp) > 1);
    for (int k = k0; k < k1; k++) {
        syn_step(ddp, &m, rank, k, sc->reorder ? syn_order : NULL, false);
        memcpy(out[k], m.g, sizeof m.g);
    }
    bool changed = layout_sig(ddp) != before;
    tdist_ddp_destroy(ddp);
    return changed;
}

static void check_bad_loads(const tdist_powersgd_opts_t *o, const unsigned char *buf, size_t len)
{
    tdist_powersgd_t *s;
    ASSERT_OK(tdist_powersgd_create(o, &s));
    size_t empty = tdist_powersgd_state_size(s);
    unsigned char *bad = malloc(len);
    ASSERT_TRUE(bad != NULL);
    ASSERT_STATUS(tdist_powersgd_load(s, buf, len - 1), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "damaged or truncated");
    ASSERT_STATUS(tdist_powersgd_load(s, buf, 20), TDIST_ERR_INVALID_ARG);
    memcpy(bad, buf, len);
    bad[0] ^= 1;
    ASSERT_STATUS(tdist_powersgd_load(s, bad, len), TDIST_ERR_INVALID_ARG);
    ASSERT_EQ(tdist_powersgd_state_size(s), empty); /* unchanged */
    ASSERT_EQ(tdist_powersgd_iteration(s), 0);
    tdist_powersgd_destroy(s);
    tdist_powersgd_opts_t other = *o;
    other.random_seed++;
    ASSERT_OK(tdist_powersgd_create(&other, &s));
    ASSERT_STATUS(tdist_powersgd_load(s, buf, len), TDIST_ERR_MISMATCH);
    ASSERT_CONTAINS(tdist_last_error(), "saved with other options");
    ASSERT_STATUS(tdist_powersgd_save(s, bad, 4, NULL), TDIST_ERR_INVALID_ARG);
    tdist_powersgd_destroy(s);
    free(bad);
}

static void resume_body(int rank, int n, void *arg)
{
    const resume_scen_t *sc = arg;
    ASSERT_EQ(n, 2);
    tdist_world_t *w;
    tdist_pg_t *pg;
    open_group(&w, &pg);
    static float a[6][SYN_N], b[6][SYN_N];
    tdist_powersgd_opts_t o;
    syn_opts(&o, 2, 1);
    o.batched = sc->batched;
    tdist_powersgd_t *s;
    ASSERT_OK(tdist_powersgd_create(&o, &s));
    ASSERT_EQ(run_steps(pg, s, sc, rank, 0, 6, a), sc->reorder);
    tdist_powersgd_destroy(s);
    ASSERT_OK(tdist_powersgd_create(&o, &s));
    run_steps(pg, s, sc, rank, 0, 3, b);
    size_t len = tdist_powersgd_state_size(s), written = 0;
    unsigned char *buf = malloc(len), *again = malloc(len);
    ASSERT_TRUE(buf && again);
    ASSERT_OK(tdist_powersgd_save(s, buf, len, &written));
    ASSERT_EQ(written, len);
    tdist_powersgd_destroy(s);
    check_bad_loads(&o, buf, len);
    ASSERT_OK(tdist_powersgd_create(&o, &s));
    ASSERT_OK(tdist_powersgd_load(s, buf, len));
    ASSERT_EQ(tdist_powersgd_iteration(s), 3);
    ASSERT_EQ(tdist_powersgd_state_size(s), len);
    ASSERT_OK(tdist_powersgd_save(s, again, len, NULL));
    ASSERT_MEMEQ(buf, again, len);
    /* the resumed reducer starts from the initial layout and, with
     * reorder, rebuilds into another one while the errors exist */
    ASSERT_EQ(run_steps(pg, s, sc, rank, 3, 6, b), sc->reorder);
    ASSERT_EQ(tdist_powersgd_iteration(s), 6);
    for (int k = 3; k < 6; k++)
        for (size_t i = 0; i < SYN_N; i++)
            if (bits_of(a[k][i]) != bits_of(b[k][i]))
                FAIL("step %d element %zu: 6 steps give %.9g, 3 + save + load + 3 give %.9g", k, i,
                     (double)a[k][i], (double)b[k][i]);
    free(buf);
    free(again);
    tdist_powersgd_destroy(s);
    tdist_pg_destroy(pg);
    tdist_world_destroy(w);
}

TEST(powersgd_save_load_resume_bitwise, 90)
{
    static const resume_scen_t sc = {1200, false, false};
    tdist_test_run_ranks(2, resume_body, (void *)&sc);
}

TEST(powersgd_error_buffers_survive_bucket_rebuild, 90)
{
    static const resume_scen_t sc = {1200, true, false};
    tdist_test_run_ranks(2, resume_body, (void *)&sc);
}

TEST(powersgd_batched_save_load_resume_bitwise, 90)
{
    static const resume_scen_t sc = {1200, false, true};
    tdist_test_run_ranks(2, resume_body, (void *)&sc);
}

/* ================================================================ 4. Join */

static const int join_counts[3] = {4, 2, 0};

static void join_body(int rank, int n, void *arg)
{
    const bool batched = arg != NULL;
    ASSERT_EQ(n, 3);
    tdist_world_t *w;
    tdist_pg_t *pg;
    open_group(&w, &pg);
    static syn_t m;
    static float got[4][SYN_N], want[4][SYN_N];
    unsigned char *st[2];
    size_t len[2];
    for (int run = 0; run < 2; run++) { /* 0: under Join; 1: zeros fed by hand */
        syn_init(&m);
        tdist_ddp_t *ddp = syn_ddp(pg, &m, 1200);
        tdist_powersgd_opts_t o;
        syn_opts(&o, 1, 1);
        o.batched = batched;
        tdist_powersgd_t *s;
        ASSERT_OK(tdist_powersgd_create(&o, &s));
        ASSERT_OK(tdist_powersgd_register(ddp, s));
        tdist_join_t *join = NULL;
        if (run == 0) {
            tdist_joinable_t j;
            ASSERT_OK(tdist_ddp_joinable(ddp, &j));
            tdist_join_opts_t jo;
            tdist_join_opts_init(&jo);
            jo.divide_by_initial_world_size = true;
            ASSERT_OK(tdist_join_begin(&j, 1, &jo, &join));
        }
        int steps = run == 0 ? join_counts[rank] : 4;
        for (int k = 0; k < steps; k++) {
            syn_step(ddp, &m, rank, k, NULL, k >= join_counts[rank]);
            memcpy(run == 0 ? got[k] : want[k], m.g, sizeof m.g);
        }
        if (join) ASSERT_OK(tdist_join_end(join));
        ASSERT_EQ(tdist_powersgd_iteration(s), 4); /* joined or not, every rank's state ran 4 */
        len[run] = tdist_powersgd_state_size(s);
        st[run] = malloc(len[run]);
        ASSERT_TRUE(st[run] != NULL);
        ASSERT_OK(tdist_powersgd_save(s, st[run], len[run], NULL));
        tdist_ddp_destroy(ddp);
        tdist_powersgd_destroy(s);
    }
    for (int k = 0; k < join_counts[rank]; k++)
        for (size_t i = 0; i < SYN_N; i++)
            if (bits_of(got[k][i]) != bits_of(want[k][i]))
                FAIL("step %d element %zu: under Join %.9g, with zeros fed by hand %.9g", k, i,
                     (double)got[k][i], (double)want[k][i]);
    /* the same state evolution: errors, Q, iteration, bit for bit */
    ASSERT_EQ(len[0], len[1]);
    ASSERT_MEMEQ(st[0], st[1], len[0]);
    free(st[0]);
    free(st[1]);
    tdist_pg_destroy(pg);
    tdist_world_destroy(w);
}

TEST(powersgd_join_joined_ranks_run_on_zeros, 90)
{
    tdist_test_run_ranks(3, join_body, NULL);
}

TEST(powersgd_batched_join_joined_ranks_run_on_zeros, 90)
{
    tdist_test_run_ranks(3, join_body, (void *)1);
}

/* ==================================================== 5. the batched hook */

typedef struct bt_rec {
    float out[4][SYN_N];
    float err[4][1024];
    size_t nerr[4], count[4], side2[4];
    size_t first_param[4];
    int calls;
} bt_rec_t;

static void bt_observe(void *arg, const tdist_ddp_bucket_t *b, tdist_powersgd_stage_t st,
                       const float *data, size_t n)
{
    bt_rec_t *r = arg;
    ASSERT_LE(b->index, 3);
    if (st == TDIST_POWERSGD_OUTPUT) {
        ASSERT_EQ(n, b->count);
        memcpy(r->out[b->index], data, n * sizeof *data);
        r->count[b->index] = n;
        r->calls++;
    }
    if (st == TDIST_POWERSGD_ERROR) {
        ASSERT_LE(n, 1024);
        memcpy(r->err[b->index], data, n * sizeof *data);
        r->nerr[b->index] = n;
    }
}

/* Step k against the reference, bucket by bucket: the gradients (plain
 * averaging too) and, once compressing, this rank's error of the padded
 * matrix as the observer saw it. */
static void batched_reference(psref_t *ref, tdist_ddp_t *ddp, const syn_t *m, const bt_rec_t *rec,
                              int rank, int k)
{
    static float in[2][SYN_N], want[SYN_N], got[SYN_N];
    const float *fin[2] = {in[0], in[1]};
    for (size_t b = 0; b < tdist_ddp_num_buckets(ddp); b++) {
        size_t idx[SYN_NP], cnt[SYN_NP], np = tdist_ddp_bucket_params(ddp, b, idx, SYN_NP), len = 0;
        for (size_t j = 0; j < np; j++) {
            cnt[j] = syn_count[idx[j]];
            for (size_t i = 0; i < cnt[j]; i++, len++) {
                for (int r = 0; r < 2; r++) in[r][len] = syn_grad(r, k, syn_off(idx[j]) + i);
                got[len] = m->g[syn_off(idx[j]) + i];
            }
        }
        psref_bucket(ref, b, idx, cnt, np, fin, want);
        char what[48];
        snprintf(what, sizeof what, "bucket %zu output", b);
        psref_check(what, k, got, want, len, PSREF_TOL);
        if (k < 2) continue;
        snprintf(what, sizeof what, "bucket %zu error (padded)", b);
        ASSERT_EQ(rec->nerr[b], ref->key[b].elen);
        psref_check(what, k, rec->err[b], ref->key[b].err[rank], rec->nerr[b], PSREF_TOL);
    }
    psref_end_iteration(ref);
}

static void batched_body(int rank, int n, void *arg)
{
    (void)arg;
    tdist_world_t *w;
    tdist_pg_t *pg;
    open_group(&w, &pg);
    static syn_t m;
    static float all[2][SYN_N];
    static bt_rec_t rec;
    syn_init(&m);
    tdist_ddp_t *ddp = syn_ddp(pg, &m, 1200);
    tdist_powersgd_opts_t o;
    syn_opts(&o, 2, 1);
    o.batched = true;
    o.param_rows = NULL; /* the batched hook needs no shapes */
    o.num_params = 0;
    o.observe = bt_observe;
    o.observe_arg = &rec;
    tdist_powersgd_t *s;
    ASSERT_OK(tdist_powersgd_create(&o, &s));
    ASSERT_OK(tdist_powersgd_register(ddp, s));
    size_t nb = tdist_ddp_num_buckets(ddp);
    ASSERT_TRUE(nb > 1 && nb <= 4);
    static psref_t ref;
    psref_init(&ref, &o, n);
    for (int k = 0; k < 5; k++) {
        memset(&rec, 0, sizeof rec);
        syn_step(ddp, &m, rank, k, NULL, false);
        ASSERT_EQ(rec.calls, k < 2 ? 0 : (int)nb);
        ASSERT_OK(tdist_all_gather(pg, m.g, all, SYN_N, TDIST_F32, NULL, NULL));
        ASSERT_MEMEQ(all[0], all[1], sizeof all[0]); /* the same output on every rank */
        batched_reference(&ref, ddp, &m, &rec, rank, k);
        if (k < 2) continue;
        bool pad_err = false;
        for (size_t b = 0; b < nb; b++) {
            size_t cnt = rec.count[b], side = 1;
            while (side * side < cnt) side++;
            ASSERT_EQ(rec.nerr[b], side * side); /* the padding carries error too */
            for (size_t i = cnt; i < side * side; i++) pad_err |= rec.err[b][i] != 0.0f;
            if (k != 2) continue;
            /* first compressed step: the input is the gradient itself */
            size_t idx[SYN_NP], np = tdist_ddp_bucket_params(ddp, b, idx, SYN_NP), off = 0;
            for (size_t j = 0; j < np; off += syn_count[idx[j]], j++)
                for (size_t i = 0; i < syn_count[idx[j]]; i++) {
                    float g = syn_grad(rank, k, syn_off(idx[j]) + i);
                    float sum = rec.out[b][off + i] + rec.err[b][off + i];
                    if (fabsf(sum - g) > 1e-8f)
                        FAIL("bucket %zu: output + error = %.9g, input %.9g", b, (double)sum,
                             (double)g);
                }
        }
        ASSERT_TRUE(pad_err || k == 2);
    }
    psref_fini(&ref);
    tdist_ddp_destroy(ddp);
    tdist_powersgd_destroy(s);
    tdist_pg_destroy(pg);
    tdist_world_destroy(w);
}

TEST(powersgd_batched_hook_consistent_with_padding_error, 60)
{
    tdist_test_run_ranks(2, batched_body, NULL);
}

/* ====================================== 6. pipelined and serial modes */

#define PL_NP    8
#define PL_ROWS  96
#define PL_COLS  128
#define PL_STEPS 23

static double pl_run(tdist_pg_t *pg, int rank, bool serial, float *result)
{
    const size_t cnt = PL_ROWS * PL_COLS;
    float *p = calloc(PL_NP * cnt, sizeof *p), *g = calloc(PL_NP * cnt, sizeof *g);
    ASSERT_TRUE(p && g);
    tdist_ddp_param_t params[PL_NP];
    size_t rows[PL_NP];
    for (size_t j = 0; j < PL_NP; j++) {
        params[j] = (tdist_ddp_param_t){p + j * cnt, g + j * cnt, cnt, TDIST_F32, NULL};
        rows[j] = PL_ROWS;
    }
    tdist_ddp_opts_t d;
    tdist_ddp_opts_init(&d);
    d.bucket_cap_bytes = d.first_bucket_bytes = cnt * sizeof(float); /* one bucket per matrix */
    tdist_ddp_t *ddp;
    ASSERT_OK(tdist_ddp_create(pg, params, PL_NP, NULL, 0, &d, &ddp));
    tdist_powersgd_opts_t o;
    tdist_powersgd_opts_init(&o);
    o.matrix_approximation_rank = 4;
    o.start_powerSGD_iter = 2;
    o.param_rows = rows;
    o.num_params = PL_NP;
    o.serial = serial;
    tdist_powersgd_t *s;
    ASSERT_OK(tdist_powersgd_create(&o, &s));
    ASSERT_OK(tdist_powersgd_register(ddp, s));
    double ms = 0; /* grad_ready (the hooks) to the end of backward_end, steps 3.. */
    for (int k = 0; k < PL_STEPS; k++) {
        ASSERT_OK(tdist_ddp_forward_begin(ddp));
        for (size_t i = 0; i < PL_NP * cnt; i++) g[i] = syn_grad(rank, k, i);
        double t0 = tdist_test_now_ms();
        for (size_t j = PL_NP; j-- > 0;) ASSERT_OK(tdist_ddp_grad_ready(ddp, j));
        ASSERT_OK(tdist_ddp_backward_end(ddp));
        if (k >= 3) ms += (tdist_test_now_ms() - t0) / (PL_STEPS - 3);
    }
    ASSERT_EQ(tdist_ddp_num_buckets(ddp), PL_NP);
    memcpy(result, g, PL_NP * cnt * sizeof *g);
    tdist_ddp_destroy(ddp);
    tdist_powersgd_destroy(s);
    free(p);
    free(g);
    return ms;
}

static void pl_body(int rank, int n, void *arg)
{
    (void)arg;
    (void)n;
    tdist_world_t *w;
    tdist_pg_t *pg;
    open_group(&w, &pg);
    const size_t bytes = PL_NP * PL_ROWS * PL_COLS * sizeof(float);
    float *a = malloc(bytes), *b = malloc(bytes);
    ASSERT_TRUE(a && b);
    double serial = pl_run(pg, rank, true, a);
    double pipelined = pl_run(pg, rank, false, b);
    ASSERT_MEMEQ(a, b, bytes); /* the same bits either way */
    free(a);
    free(b);
    if (rank == 0)
        fprintf(stderr,
                "note: PowerSGD rank 4, %d buckets of %dx%d, 2 ranks: reduction %.2f ms "
                "per step serial, %.2f ms pipelined\n",
                PL_NP, PL_ROWS, PL_COLS, serial, pipelined);
    tdist_pg_destroy(pg);
    tdist_world_destroy(w);
}

TEST(powersgd_pipelined_equals_serial, 120)
{
    tdist_test_run_ranks(2, pl_body, NULL);
}

/* ========================================= 7. a matrix 0 on every rank */

#define RZ_STEPS 6
#define RZ_ZERO_AT 2 /* the first compressed step: no error yet */
#define RZ_P 2       /* w2, 6 x 24 */

/* RZ_STEPS steps; in step RZ_ZERO_AT every rank's gradient of w2 is 0
 * (batched: every gradient, so every bucket's matrix is 0); every 2-D
 * tensor compressed, epsilon 0, warm start; out[k]: the gradients after
 * step k. */
static void rz_run(tdist_pg_t *pg, int rank, bool repair, bool batched,
                   float out[RZ_STEPS][SYN_N])
{
    static syn_t m;
    syn_init(&m);
    tdist_ddp_t *ddp = syn_ddp(pg, &m, 0);
    tdist_powersgd_opts_t o;
    syn_opts(&o, 1, 0.0);
    o.repair_zero = repair;
    o.batched = batched;
    tdist_powersgd_t *s;
    ASSERT_OK(tdist_powersgd_create(&o, &s));
    ASSERT_OK(tdist_powersgd_register(ddp, s));
    const size_t zoff = batched ? 0 : syn_off(RZ_P), zlen = batched ? SYN_N : syn_count[RZ_P];
    for (int k = 0; k < RZ_STEPS; k++) {
        ASSERT_OK(tdist_ddp_forward_begin(ddp));
        for (size_t i = 0; i < SYN_N; i++) m.g[i] = syn_grad(rank, k, i);
        if (k == RZ_ZERO_AT) memset(m.g + zoff, 0, zlen * sizeof(float));
        for (size_t j = 0; j < SYN_NP; j++) ASSERT_OK(tdist_ddp_grad_ready(ddp, SYN_NP - 1 - j));
        ASSERT_OK(tdist_ddp_backward_end(ddp));
        memcpy(out[k], m.g, sizeof m.g);
    }
    tdist_ddp_destroy(ddp);
    tdist_powersgd_destroy(s);
}

static void repair_body(int rank, int n, void *arg)
{
    const bool batched = arg != NULL;
    tdist_world_t *w;
    tdist_pg_t *pg;
    open_group(&w, &pg);
    static float def[RZ_STEPS][SYN_N], rep[RZ_STEPS][SYN_N];
    rz_run(pg, rank, false, batched, def);
    rz_run(pg, rank, true, batched, rep);
    const size_t zoff = batched ? 0 : syn_off(RZ_P), zlen = batched ? SYN_N : syn_count[RZ_P];
    /* the default: 0 / 0 in Gram-Schmidt, and the kept Q carries it on */
    bool nan_then = false, nan_last = false;
    for (size_t i = zoff; i < zoff + zlen; i++) {
        nan_then = nan_then || isnan(def[RZ_ZERO_AT][i]);
        nan_last = nan_last || isnan(def[RZ_STEPS - 1][i]);
    }
    ASSERT_TRUE(nan_then);
    ASSERT_TRUE(nan_last);
    for (int k = RZ_ZERO_AT; k < RZ_STEPS; k++) {
        bool nonzero = false;
        for (size_t i = 0; i < SYN_N; i++) {
            ASSERT_TRUE(isfinite(rep[k][i]));
            if (i >= zoff && i < zoff + zlen)
                nonzero = nonzero || rep[k][i] != 0.0f;
            else if (bits_of(rep[k][i]) != bits_of(def[k][i]))
                FAIL("step %d element %zu: %a with repair_zero, %a without", k, i,
                     (double)rep[k][i], (double)def[k][i]);
        }
        /* the step of the zero matrix gives 0; used again, it recovers */
        ASSERT_EQ(nonzero, k != RZ_ZERO_AT);
    }
    /* before it, nothing differs; and every rank decided alike */
    ASSERT_TRUE(memcmp(def, rep, RZ_ZERO_AT * sizeof def[0]) == 0);
    uint64_t h = 1469598103934665603ULL, all[4];
    const unsigned char *bytes = (const unsigned char *)rep;
    for (size_t i = 0; i < sizeof rep; i++) h = (h ^ bytes[i]) * 1099511628211ULL;
    ASSERT_TRUE(n <= 4);
    ASSERT_OK(tdist_all_gather(pg, &h, all, 1, TDIST_I64, NULL, NULL));
    for (int r = 0; r < n; r++) ASSERT_EQ(all[r], h);
    tdist_pg_destroy(pg);
    tdist_world_destroy(w);
}

TEST(powersgd_repair_zero_matrix_recovers, 60)
{
    tdist_test_run_ranks(2, repair_body, NULL);
}

TEST(powersgd_batched_repair_zero_matrix_recovers, 60)
{
    static int batched = 1;
    tdist_test_run_ranks(2, repair_body, &batched);
}
