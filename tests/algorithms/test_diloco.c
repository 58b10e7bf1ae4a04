/* tests/algorithms/test_diloco.c — DiLoCo against a reference computed
 * here.
 *
 * The model: two buffers (5 and 3 values) and a quadratic loss per rank,
 * gradient g = p - t_r (every rank pulls towards its own target t_r), the
 * same starting parameters everywhere. The reference simulates every rank
 * in each process: its inner steps with an optimizer of its own of the
 * same kind and options (the inner step is the optimizer's, not DiLoCo's),
 * then, in plain C, the pseudo-gradients d_r = synced - p_r, their
 * average (sum over ranks of fl(d_r / W); bf16: the compression hook's
 * bf16 arithmetic), the outer SGD (Nesterov: buf = d, then fl(fl(buf m) +
 * d); step d + fl(m buf); p = fmaf(fl(-lr), step, p)), and every rank
 * adopting the result.
 *
 * Compared: every rank's parameters after every inner step and every
 * synchronisation, within 2e-6 (tdist's SGD may round -lr * step once more
 * than PyTorch's fmaf, and a 3-rank sum may associate otherwise; both are
 * ulps, far below what a wrong rule gives), and the counters.
 *
 * 1. 2 ranks, AdamW (DiLoCo's default inner optimizer), H 3, f32 and bf16.
 * 2. 3 ranks, a caller's inner SGD, outer momentum without Nesterov.
 * 3. int8 pseudo-gradients: the same on every rank, close to f32's.
 * 4. Join with uneven inputs: a rank that runs out takes part in the
 *    synchronisations with its progress, then zeros; a last one when any
 *    rank has unsynchronised steps.
 * 5. Bad options fail at create; ranks with different options fail
 *    together at the first synchronisation.
 * 6. Checkpoints: 4 steps, save, a new state, load, 3 steps = 7 steps,
 *    bit for bit; loading into other options, a damaged or a truncated
 *    state fails and changes nothing. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "tdist/algorithms.h"
#include "tdist/join.h"

#define NB 2
#define NT 8
#define MAXW 4
static const size_t bcnt[NB] = {5, 3};
static const size_t boff[NB] = {0, 5};

static void open_pg(tdist_world_t **w, tdist_pg_t **pg)
{
    tdist_test_open_world(w, pg, (int64_t)(20000 * tdist_test_timeout_mult()));
}

static float target(int r, size_t e) { return (float)sin(1.0 + 0.7 * r + 0.31 * (double)e); }
static float start(size_t e) { return (float)cos(0.5 * (double)e); }

static void grad_of(int r, const float *p, float *g)
{
    for (size_t e = 0; e < NT; e++) g[e] = p[e] - target(r, e);
}

static void buffers(tdist_optim_param_t *op, float *p, float *g)
{
    for (int b = 0; b < NB; b++) op[b] = (tdist_optim_param_t){p + boff[b], g + boff[b], bcnt[b], NULL};
}

typedef struct scen {
    int w;
    int64_t h;
    bool sgd_inner;          /* a caller's inner SGD instead of DiLoCo's AdamW */
    bool nesterov;
    double momentum;
    tdist_dtype_t wire;
    int steps[MAXW];         /* inner steps per rank; under Join when join */
    bool join;
} scen_t;

/* ============================================================ the reference */

typedef struct ref {
    float p[MAXW][NT], g[MAXW][NT], synced[NT], buf[NT];
    bool has_buf;
    tdist_optim_t *inner[MAXW];
} ref_t;

static tdist_optim_t *make_inner(const scen_t *sc, float *p, float *g)
{
    tdist_optim_param_t op[NB];
    buffers(op, p, g);
    tdist_optim_t *o;
    if (sc->sgd_inner) {
        tdist_optim_sgd_opts_t so;
        tdist_optim_sgd_opts_init(&so);
        so.lr = 0.1;
        so.momentum = 0.5;
        ASSERT_OK(tdist_optim_create_sgd(op, NB, &so, &o));
    } else {
        tdist_optim_adam_opts_t ao;
        tdist_optim_adamw_opts_init(&ao);
        ao.lr = 0.05;
        ASSERT_OK(tdist_optim_create_adamw(op, NB, &ao, &o));
    }
    return o;
}

static void ref_init(ref_t *rf, const scen_t *sc)
{
    memset(rf, 0, sizeof *rf);
    for (size_t e = 0; e < NT; e++) rf->synced[e] = start(e);
    for (int r = 0; r < sc->w; r++) {
        memcpy(rf->p[r], rf->synced, sizeof rf->synced);
        rf->inner[r] = make_inner(sc, rf->p[r], rf->g[r]);
    }
}

static void ref_fini(ref_t *rf, const scen_t *sc)
{
    for (int r = 0; r < sc->w; r++) tdist_optim_destroy(rf->inner[r]);
}

static void ref_inner(ref_t *rf, int r)
{
    grad_of(r, rf->p[r], rf->g[r]);
    ASSERT_OK(tdist_optim_step(rf->inner[r]));
}

/* One pseudo-gradient value on the wire and back: fl(d / W) for f32; the
 * bf16 hook's h = bf16(fl(float(bf16(d)) / W)). */
static float ref_part(const scen_t *sc, float d)
{
    if (sc->wire != TDIST_BF16) return d / (float)sc->w;
    return tdist_bf16_to_f32(tdist_f32_to_bf16(tdist_bf16_to_f32(tdist_f32_to_bf16(d)) / (float)sc->w));
}

static void ref_sync(ref_t *rf, const scen_t *sc)
{
    const float m = (float)sc->momentum, neg_lr = -0.7f;
    for (size_t e = 0; e < NT; e++) {
        float avg = ref_part(sc, rf->synced[e] - rf->p[0][e]);
        for (int r = 1; r < sc->w; r++) {
            avg = avg + ref_part(sc, rf->synced[e] - rf->p[r][e]);
            if (sc->wire == TDIST_BF16) avg = tdist_bf16_to_f32(tdist_f32_to_bf16(avg));
        }
        float b = rf->has_buf ? rf->buf[e] * m + avg : avg;
        rf->buf[e] = b;
        float step = sc->nesterov ? avg + m * b : b;
        rf->synced[e] = fmaf(neg_lr, step, rf->synced[e]);
    }
    rf->has_buf = true;
    for (int r = 0; r < sc->w; r++) memcpy(rf->p[r], rf->synced, sizeof rf->synced);
}

/* Inner steps of rank r in round j (1-based) under the Join rule. */
static int round_steps(const scen_t *sc, int r, int j)
{
    int left = sc->steps[r] - (j - 1) * (int)sc->h;
    return left < 0 ? 0 : left < sc->h ? left : (int)sc->h;
}

/* ================================================================ the run */

static void check(const float *p, const float *want, const char *what, int step)
{
    for (size_t e = 0; e < NT; e++)
        if (fabs((double)p[e] - (double)want[e]) > 2e-6 * (1.0 + fabs(want[e])))
            FAIL("%s %d element %zu: tdist %.9g, reference %.9g", what, step, e, p[e], want[e]);
}

static tdist_diloco_t *make_diloco(const scen_t *sc, tdist_pg_t *pg, float *p, float *g,
                                   tdist_optim_t **inner)
{
    tdist_optim_param_t op[NB];
    buffers(op, p, g);
    *inner = sc->sgd_inner ? make_inner(sc, p, g) : NULL;
    tdist_diloco_opts_t o;
    tdist_diloco_opts_init(&o);
    o.inner_steps = sc->h;
    o.outer_nesterov = sc->nesterov;
    o.outer_momentum = sc->momentum;
    o.wire = sc->wire;
    o.inner_adamw.lr = 0.05;
    tdist_diloco_t *d;
    ASSERT_OK(tdist_diloco_create(pg, op, NB, *inner, &o, &d));
    return d;
}

static void plain_body(int rank, int n, void *arg)
{
    const scen_t *sc = arg;
    ASSERT_EQ(n, sc->w);
    tdist_world_t *w;
    tdist_pg_t *pg;
    open_pg(&w, &pg);
    static ref_t rf;
    ref_init(&rf, sc);
    float p[NT], g[NT];
    for (size_t e = 0; e < NT; e++) p[e] = start(e);
    tdist_optim_t *inner;
    tdist_diloco_t *d = make_diloco(sc, pg, p, g, &inner);
    int steps = sc->steps[0];
    for (int k = 1; k <= steps; k++) {
        grad_of(rank, p, g);
        ASSERT_OK(tdist_diloco_step(d));
        for (int r = 0; r < sc->w; r++) ref_inner(&rf, r);
        if (k % sc->h == 0) ref_sync(&rf, sc);
        check(p, rf.p[rank], k % sc->h ? "inner step" : "synchronisation after step", k);
        if (k % sc->h == 0) check(tdist_diloco_synced(d, 0), rf.synced, "synced copy", k);
    }
    tdist_diloco_stats_t s;
    ASSERT_OK(tdist_diloco_get_stats(d, &s));
    ASSERT_EQ(s.inner_steps, steps);
    ASSERT_EQ(s.outer_steps, steps / sc->h);
    ASSERT_EQ(s.elements, NT);
    ASSERT_EQ(s.wire_bytes, (uint64_t)(steps / sc->h) * NT * (sc->wire == TDIST_F32 ? 4 : 2));
    /* tdist_diloco_sync at the end: one more outer step, everywhere */
    grad_of(rank, p, g);
    ASSERT_OK(tdist_optim_step(tdist_diloco_inner(d)));
    for (int r = 0; r < sc->w; r++) ref_inner(&rf, r);
    ASSERT_OK(tdist_diloco_sync(d));
    ref_sync(&rf, sc);
    check(p, rf.p[rank], "final synchronisation", steps + 1);
    tdist_diloco_destroy(d);
    tdist_optim_destroy(inner);
    ref_fini(&rf, sc);
    tdist_pg_destroy(pg);
    tdist_world_destroy(w);
}

#define RUN(body, ...)                                                                   \
    do {                                                                                 \
        static const scen_t sc = __VA_ARGS__;                                            \
        tdist_test_run_ranks(sc.w, body, (void *)&sc);                                   \
    } while (0)

TEST(diloco_adamw_2_ranks_reference, 60)
{
    RUN(plain_body, {.w = 2, .h = 3, .nesterov = true, .momentum = 0.9, .wire = TDIST_F32, .steps = {12}});
}
TEST(diloco_bf16_2_ranks_reference, 60)
{
    RUN(plain_body, {.w = 2, .h = 3, .nesterov = true, .momentum = 0.9, .wire = TDIST_BF16, .steps = {12}});
}
TEST(diloco_sgd_inner_3_ranks_reference, 60)
{
    RUN(plain_body, {.w = 3, .h = 2, .sgd_inner = true, .momentum = 0.5, .wire = TDIST_F32, .steps = {8}});
}

/* ================================================================ 3. int8 */

static void int8_body(int rank, int n, void *arg)
{
    (void)arg;
    ASSERT_EQ(n, 3);
    tdist_world_t *w;
    tdist_pg_t *pg;
    open_pg(&w, &pg);
    static const scen_t sc = {.w = 3, .h = 4, .nesterov = true, .momentum = 0.9, .wire = TDIST_F32};
    static ref_t rf;
    ref_init(&rf, &sc);
    float p[NT], g[NT], all[3 * NT];
    for (size_t e = 0; e < NT; e++) p[e] = start(e);
    scen_t s8 = sc;
    s8.wire = TDIST_I8;
    tdist_optim_t *inner;
    tdist_diloco_t *d = make_diloco(&s8, pg, p, g, &inner);
    for (int k = 0; k < 4; k++) {
        grad_of(rank, p, g);
        ASSERT_OK(tdist_diloco_step(d));
        for (int r = 0; r < 3; r++) ref_inner(&rf, r);
    }
    ref_sync(&rf, &sc);
    /* one int8 round: the same bits on every rank; the error of the
     * average is within the blocks' scales (at most max|d| / 127 per
     * rank and for the average), times the outer step's 0.7 (1 + 0.9) */
    ASSERT_OK(tdist_all_gather(pg, p, all, NT, TDIST_F32, NULL, NULL));
    ASSERT_MEMEQ(all, all + NT, sizeof p);
    ASSERT_MEMEQ(all, all + 2 * NT, sizeof p);
    double dmax = 0;
    for (size_t e = 0; e < NT; e++) dmax = fmax(dmax, fabs((double)rf.synced[e] - start(e)));
    for (size_t e = 0; e < NT; e++)
        if (fabs((double)p[e] - rf.synced[e]) > dmax * 2.0 / 127.0 + 1e-6)
            FAIL("int8 element %zu: %.9g, f32 reference %.9g", e, p[e], rf.synced[e]);
    tdist_diloco_stats_t s;
    ASSERT_OK(tdist_diloco_get_stats(d, &s));
    ASSERT_EQ(s.outer_steps, 1);
    ASSERT_TRUE(s.wire_bytes > 0 && s.wire_bytes < 4 * NT);
    tdist_diloco_destroy(d);
    ref_fini(&rf, &sc);
    tdist_pg_destroy(pg);
    tdist_world_destroy(w);
}

TEST(diloco_int8_3_ranks, 60) { tdist_test_run_ranks(3, int8_body, NULL); }

/* ================================================================ 4. Join */

static void join_body(int rank, int n, void *arg)
{
    const scen_t *sc = arg;
    ASSERT_EQ(n, sc->w);
    tdist_world_t *w;
    tdist_pg_t *pg;
    open_pg(&w, &pg);
    static ref_t rf;
    ref_init(&rf, sc);
    int rounds = 0;
    for (int r = 0; r < sc->w; r++) {
        int c = (sc->steps[r] + (int)sc->h - 1) / (int)sc->h;
        if (c > rounds) rounds = c;
    }
    for (int j = 1; j <= rounds; j++) {
        for (int r = 0; r < sc->w; r++)
            for (int s = 0; s < round_steps(sc, r, j); s++) ref_inner(&rf, r);
        ref_sync(&rf, sc);
    }
    float p[NT], g[NT];
    for (size_t e = 0; e < NT; e++) p[e] = start(e);
    tdist_optim_t *inner;
    tdist_diloco_t *d = make_diloco(sc, pg, p, g, &inner);
    tdist_joinable_t j;
    ASSERT_OK(tdist_diloco_joinable(d, &j));
    tdist_join_t *jn;
    ASSERT_OK(tdist_join_begin(&j, 1, NULL, &jn));
    for (int k = 0; k < sc->steps[rank]; k++) {
        grad_of(rank, p, g);
        ASSERT_OK(tdist_diloco_step(d));
    }
    ASSERT_OK(tdist_join_end(jn));
    check(p, rf.synced, "after the Join, rounds:", rounds);
    tdist_diloco_stats_t s;
    ASSERT_OK(tdist_diloco_get_stats(d, &s));
    ASSERT_EQ(s.outer_steps, rounds);
    ASSERT_EQ(s.inner_steps, sc->steps[rank]);
    tdist_diloco_destroy(d);
    tdist_optim_destroy(inner);
    ref_fini(&rf, sc);
    tdist_pg_destroy(pg);
    tdist_world_destroy(w);
}

/* rank 1 runs out in the middle of round 2; rank 0 ends one step into
 * round 3 (the final synchronisation) */
TEST(diloco_join_uneven_2_ranks, 60)
{
    RUN(join_body, {.w = 2, .h = 3, .nesterov = true, .momentum = 0.9, .wire = TDIST_F32,
                    .steps = {7, 4}, .join = true});
}
/* a rank with no input at all; the others end on round boundaries, so
 * no final synchronisation */
TEST(diloco_join_uneven_3_ranks, 60)
{
    RUN(join_body, {.w = 3, .h = 2, .nesterov = true, .momentum = 0.9, .wire = TDIST_F32,
                    .steps = {6, 4, 0}, .join = true});
}
TEST(diloco_join_bf16_4_ranks, 60)
{
    RUN(join_body, {.w = 4, .h = 2, .nesterov = true, .momentum = 0.9, .wire = TDIST_BF16,
                    .steps = {5, 2, 3, 1}, .join = true});
}

/* ============================================================== 5. errors */

static void errors_body(int rank, int n, void *arg)
{
    (void)arg;
    ASSERT_EQ(n, 2);
    tdist_world_t *w;
    tdist_pg_t *pg;
    open_pg(&w, &pg);
    float p[NT] = {0}, g[NT] = {0};
    tdist_optim_param_t op[NB];
    buffers(op, p, g);
    tdist_diloco_opts_t o;
    tdist_diloco_t *d = NULL;
    tdist_diloco_opts_init(&o);
    o.inner_steps = 0;
    ASSERT_STATUS(tdist_diloco_create(pg, op, NB, NULL, &o, &d), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "opts.inner_steps is 0");
    tdist_diloco_opts_init(&o);
    o.outer_lr = 0;
    ASSERT_STATUS(tdist_diloco_create(pg, op, NB, NULL, &o, &d), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "opts.outer_lr is 0");
    tdist_diloco_opts_init(&o);
    o.outer_momentum = 1.0;
    ASSERT_STATUS(tdist_diloco_create(pg, op, NB, NULL, &o, &d), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "opts.outer_momentum is 1");
    tdist_diloco_opts_init(&o);
    o.outer_momentum = 0;
    ASSERT_STATUS(tdist_diloco_create(pg, op, NB, NULL, &o, &d), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "outer_nesterov needs");
    tdist_diloco_opts_init(&o);
    o.wire = TDIST_F64;
    ASSERT_STATUS(tdist_diloco_create(pg, op, NB, NULL, &o, &d), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "opts.wire is f64");
    tdist_diloco_opts_init(&o);
    o.wire = TDIST_I8;
    o.int8_block = 0;
    ASSERT_STATUS(tdist_diloco_create(pg, op, NB, NULL, &o, &d), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "opts.int8_block is 0");
    tdist_diloco_opts_init(&o);
    o.inner_adamw.lr = -1;
    ASSERT_STATUS(tdist_diloco_create(pg, op, NB, NULL, &o, &d), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "inner AdamW");
    tdist_optim_t *one;
    ASSERT_OK(tdist_optim_create_sgd(op, 1, NULL, &one));
    tdist_diloco_opts_init(&o);
    ASSERT_STATUS(tdist_diloco_create(pg, op, NB, one, &o, &d), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "the inner optimizer has 1 buffers");
    tdist_optim_destroy(one);
    ASSERT_STATUS(tdist_diloco_create(NULL, op, NB, NULL, &o, &d), TDIST_ERR_INVALID_ARG);
    ASSERT_TRUE(d == NULL);

    /* different outer learning rates: both fail at the first
     * synchronisation, naming both, before any parameter moves */
    tdist_diloco_opts_init(&o);
    o.inner_steps = 1;
    o.outer_lr = rank ? 0.5 : 0.7;
    ASSERT_OK(tdist_diloco_create(pg, op, NB, NULL, &o, &d));
    for (size_t e = 0; e < NT; e++) g[e] = 1.0f;
    ASSERT_STATUS(tdist_diloco_step(d), TDIST_ERR_MISMATCH);
    ASSERT_CONTAINS(tdist_last_error(), "DiLoCo mismatch");
    ASSERT_CONTAINS(tdist_last_error(), "outer lr 0.7");
    ASSERT_CONTAINS(tdist_last_error(), "outer lr 0.5");
    ASSERT_TRUE(tdist_diloco_synced(d, 0)[0] == 0.0f);
    tdist_diloco_destroy(d);
    tdist_diloco_destroy(NULL);
    tdist_pg_destroy(pg);
    tdist_world_destroy(w);
}

TEST(diloco_bad_options_and_mismatch, 60) { tdist_test_run_ranks(2, errors_body, NULL); }

/* ========================================================= 6. checkpoints */

static const scen_t ck = {.w = 2, .h = 3, .nesterov = true, .momentum = 0.9, .wire = TDIST_F32};

static void ck_steps(tdist_diloco_t *d, int rank, float *p, float *g, int n)
{
    for (int k = 0; k < n; k++) {
        grad_of(rank, p, g);
        ASSERT_OK(tdist_diloco_step(d));
    }
}

static void checkpoint_body(int rank, int n, void *arg)
{
    (void)arg;
    ASSERT_EQ(n, 2);
    tdist_world_t *w;
    tdist_pg_t *pg;
    open_pg(&w, &pg);
    float p[NT], g[NT], want_p[NT], want_s[NT], saved_p[NT];
    tdist_optim_t *none;
    /* 7 steps in one go */
    for (size_t e = 0; e < NT; e++) p[e] = start(e);
    tdist_diloco_t *d = make_diloco(&ck, pg, p, g, &none);
    ck_steps(d, rank, p, g, 7);
    memcpy(want_p, p, sizeof p);
    memcpy(want_s, tdist_diloco_synced(d, 0), sizeof want_s);
    tdist_diloco_destroy(d);
    /* 4, save (the model with it), a new state, load, 3 */
    for (size_t e = 0; e < NT; e++) p[e] = start(e);
    d = make_diloco(&ck, pg, p, g, &none);
    ck_steps(d, rank, p, g, 4);
    size_t size = tdist_diloco_state_size(d), written = 0;
    unsigned char *buf = malloc(size);
    ASSERT_TRUE(buf != NULL);
    ASSERT_STATUS(tdist_diloco_save(d, buf, size - 1, &written), TDIST_ERR_INVALID_ARG);
    ASSERT_OK(tdist_diloco_save(d, buf, size, &written));
    ASSERT_EQ(written, size);
    memcpy(saved_p, p, sizeof p);
    tdist_diloco_destroy(d);
    for (size_t e = 0; e < NT; e++) p[e] = 0.5f; /* the synced copy starts elsewhere */
    d = make_diloco(&ck, pg, p, g, &none);
    memcpy(p, saved_p, sizeof p);
    ASSERT_STATUS(tdist_diloco_load(d, buf, size - 3), TDIST_ERR_INVALID_ARG);
    buf[size / 2] ^= 1;
    ASSERT_STATUS(tdist_diloco_load(d, buf, size), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "nothing was changed");
    ASSERT_TRUE(tdist_diloco_synced(d, 0)[0] == 0.5f);
    buf[size / 2] ^= 1;
    ASSERT_OK(tdist_diloco_load(d, buf, size));
    ck_steps(d, rank, p, g, 3);
    ASSERT_MEMEQ(p, want_p, sizeof p);
    ASSERT_MEMEQ(tdist_diloco_synced(d, 0), want_s, sizeof want_s);
    tdist_diloco_stats_t st;
    ASSERT_OK(tdist_diloco_get_stats(d, &st));
    ASSERT_EQ(st.inner_steps, 7);
    ASSERT_EQ(st.outer_steps, 2);
    tdist_diloco_destroy(d);
    /* other options */
    scen_t other = ck;
    other.h = 2;
    d = make_diloco(&other, pg, p, g, &none);
    ASSERT_STATUS(tdist_diloco_load(d, buf, size), TDIST_ERR_MISMATCH);
    ASSERT_CONTAINS(tdist_last_error(), "saved with other options (H 3");
    tdist_diloco_destroy(d);
    free(buf);
    tdist_pg_destroy(pg);
    tdist_world_destroy(w);
}

TEST(diloco_checkpoint_resumes_bit_for_bit, 60) { tdist_test_run_ranks(2, checkpoint_body, NULL); }
