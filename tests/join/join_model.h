/* tests/join/join_model.h — the model the DDP + Join tests train and its
 * serial reference (test_join.c, test_join_more.c): y = W x + b (+ an
 * extra bias on rank 0's samples only), squared-error gradient, seeded
 * inputs per (rank, step, micro-batch), SGD; the reference applies the
 * same averaging rule (premultiplied by 1/initial world size or 1/active
 * ranks) in double precision. */
#ifndef TDIST_TEST_JOIN_MODEL_H
#define TDIST_TEST_JOIN_MODEL_H

#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "harness.h"
#include "tdist/ddp.h"

#define MAXR 8
#define NI 3
#define NO 2
#define LR 0.05
#define TOL 1e-12

typedef struct scen {
    int n;
    int counts[MAXR];
    bool divide_initial;
    bool find_unused; /* also: one bucket per parameter */
    int micro;        /* micro-batches per step (0 means 1); all but the last under no_sync */
    bool hook;        /* test_join_more.c: a comm hook whose continuation doubles */
    bool per_param;   /* test_join_more.c: one bucket per parameter */
    bool overlap_off; /* test_join.c: odd ranks reduce in backward_end (opts.overlap off) */
} scen_t;

typedef struct model {
    double w[NO * NI], b[NO], ex[NO];
    double gw[NO * NI], gb[NO], gex[NO];
    double cnt;
} model_t;

static inline void data(int r, int k, int m, double x[NI], double t[NO])
{
    for (int i = 0; i < NI; i++)
        x[i] = sin(1.0 + 0.7 * r + 1.3 * k + 0.37 * m + 0.11 * i);
    for (int o = 0; o < NO; o++)
        t[o] = cos(0.5 + 0.3 * r - 0.9 * k + 0.21 * m + 0.5 * o);
}

static inline void init_model(model_t *md, int rank)
{
    memset(md, 0, sizeof *md);
    for (int i = 0; i < NO * NI; i++)
        md->w[i] = 0.1 * (i + 1) - 0.3 + rank; /* rank 0's wins at create */
    for (int o = 0; o < NO; o++) {
        md->b[o] = 0.2 * o - 0.1;
        md->ex[o] = 0.05 * (o + 1);
    }
    md->cnt = 1000.0 * rank;
}

/* The model's three parameters for tdist_ddp_create: W, b, extra. */
static inline void model_params(model_t *md, tdist_ddp_param_t p[3])
{
    p[0] = (tdist_ddp_param_t){md->w, md->gw, NO * NI, TDIST_F64, "W"};
    p[1] = (tdist_ddp_param_t){md->b, md->gb, NO, TDIST_F64, "b"};
    p[2] = (tdist_ddp_param_t){md->ex, md->gex, NO, TDIST_F64, "extra"};
}

static inline void model_zero_grad(model_t *md)
{
    memset(md->gw, 0, sizeof md->gw);
    memset(md->gb, 0, sizeof md->gb);
    memset(md->gex, 0, sizeof md->gex);
}

/* Plain SGD with the (averaged) gradients. */
static inline void model_sgd(model_t *md)
{
    for (int i = 0; i < NO * NI; i++)
        md->w[i] -= LR * md->gw[i];
    for (int o = 0; o < NO; o++) {
        md->b[o] -= LR * md->gb[o];
        md->ex[o] -= LR * md->gex[o];
    }
}

/* add rank r's gradient for (k, m) at parameters `at` into g (scaled by s) */
static inline void grad(const model_t *at, int r, int k, int m, double s, double *gw, double *gb,
                 double *gex)
{
    double x[NI], t[NO];
    data(r, k, m, x, t);
    for (int o = 0; o < NO; o++) {
        double out = at->b[o] + (r == 0 ? at->ex[o] : 0.0);
        for (int i = 0; i < NI; i++)
            out += at->w[o * NI + i] * x[i];
        double e = out - t[o];
        gb[o] += s * e;
        if (r == 0) gex[o] += s * e;
        for (int i = 0; i < NI; i++)
            gw[o * NI + i] += s * e * x[i];
    }
}

static inline void expect_near(const char *what, int step, const double *a, const double *ref, int n)
{
    for (int i = 0; i < n; i++)
        if (fabs(a[i] - ref[i]) > TOL * fmax(1.0, fabs(ref[i])))
            FAIL("step %d: %s[%d] = %.17g, reference %.17g", step, what, i, a[i], ref[i]);
}

static inline void expect_model(int step, const model_t *a, const model_t *ref)
{
    expect_near("W", step, a->w, ref->w, NO * NI);
    expect_near("b", step, a->b, ref->b, NO);
    expect_near("extra", step, a->ex, ref->ex, NO);
}

/* The number of steps (the most inputs of any rank), and how many ranks
 * are still active at step k. */
static inline int max_count(const scen_t *sc)
{
    int K = 0;
    for (int r = 0; r < sc->n; r++)
        K = sc->counts[r] > K ? sc->counts[r] : K;
    return K;
}

static inline int active_at(const scen_t *sc, int k)
{
    int act = 0;
    for (int r = 0; r < sc->n; r++)
        act += sc->counts[r] > k;
    return act;
}


/* Reference after `steps` steps (ref_after[k] = parameters after step k). */
static inline int ref_run(const scen_t *sc, model_t *ref_after, int cap)
{
    model_t p;
    init_model(&p, 0);
    int K = max_count(sc);
    ASSERT_LE(K, cap);
    for (int k = 0; k < K; k++) {
        double s = 1.0 / (double)(sc->divide_initial ? sc->n : active_at(sc, k));
        double gw[NO * NI] = {0}, gb[NO] = {0}, gex[NO] = {0};
        for (int r = 0; r < sc->n; r++) {
            if (sc->counts[r] <= k) continue;
            double lw[NO * NI] = {0}, lb[NO] = {0}, lex[NO] = {0};
            for (int m = 0; m < (sc->micro ? sc->micro : 1); m++)
                grad(&p, r, k, m, 1.0, lw, lb, lex);
            /* each rank's (accumulated) gradient is premultiplied, then summed */
            for (int i = 0; i < NO * NI; i++)
                gw[i] += lw[i] * s;
            for (int o = 0; o < NO; o++) {
                gb[o] += lb[o] * s;
                gex[o] += lex[o] * s;
            }
        }
        double hs = sc->hook ? 2.0 : 1.0; /* the hook's continuation doubles (exact) */
        for (int i = 0; i < NO * NI; i++)
            p.w[i] -= LR * (hs * gw[i]);
        for (int o = 0; o < NO; o++) {
            p.b[o] -= LR * (hs * gb[o]);
            p.ex[o] -= LR * (hs * gex[o]);
        }
        ref_after[k] = p;
    }
    if (K == 0) ref_after[0] = p;
    return K;
}

#endif /* TDIST_TEST_JOIN_MODEL_H */
