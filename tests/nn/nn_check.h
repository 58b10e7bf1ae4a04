/*
 * tests/nn/nn_check.h — helpers the nn tests share: a seeded generator and
 * a central finite-difference check of every gradient a model computes.
 */
#ifndef TDIST_TEST_NN_CHECK_H
#define TDIST_TEST_NN_CHECK_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include <tdist/nn.h>

static inline uint64_t t_rand_u64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [lo, hi). */
static inline float t_rand(uint64_t *s, float lo, float hi)
{
    return lo + (hi - lo) * (float)((double)(t_rand_u64(s) >> 11) * (1.0 / 9007199254740992.0));
}

static inline void t_fill(float *x, size_t n, uint64_t *s, float lo, float hi)
{
    for (size_t i = 0; i < n; i++) x[i] = t_rand(s, lo, hi);
}

/* A fresh buffer (the caller frees it) of n seeded uniform values in [lo, hi). */
static inline float *t_rand_input(size_t n, uint64_t seed, float lo, float hi)
{
    float *x = malloc(n * sizeof *x);
    ASSERT_TRUE(x != NULL);
    uint64_t s = seed;
    t_fill(x, n, &s, lo, hi);
    return x;
}

/* L = sum(w * forward(x)), in double. */
static inline double t_loss(nn_seq_t *m, const float *x, size_t batch, const float *w)
{
    float *y = nn_forward(m, x, batch);
    if (!y) FAIL("nn_forward: %s", nn_last_error());
    size_t n = batch * nn_output_size(m);
    double l = 0.0;
    for (size_t i = 0; i < n; i++) l += (double)w[i] * (double)y[i];
    return l;
}

/* |a - n| <= rtol * max(|a|, |n|) + atol, else fail naming what. */
static inline void t_close(const char *what, size_t i, double a, double num, double rtol, double atol)
{
    double diff = fabs(a - num), scale = fmax(fabs(a), fabs(num));
    if (!(diff <= rtol * scale + atol))
        FAIL("%s[%zu]: analytic %.6g vs finite difference %.6g (diff %.3g)", what, i, a, num, diff);
}

/* Check every parameter gradient and (if check_input) the input gradient
 * of the model against central differences of L = sum(w * y), with w a
 * random seeded weight. At most `max_per` elements of each tensor are
 * checked (spread evenly). eps is the step: 1e-2 suits smooth layers; a
 * model with ReLU and max-pooling after other layers needs a smaller one so
 * that no step crosses a kink. Returns how many elements were checked. */
static inline size_t t_check_grads(nn_seq_t *m, float *x, size_t batch, int check_input,
                                   uint64_t seed, size_t max_per, double eps)
{
    const double rtol = 1e-2, atol = 2e-3;
    uint64_t s = seed;
    size_t nout = batch * nn_output_size(m), nin = batch * nn_input_size(m);
    float *w = malloc(nout * sizeof *w);
    ASSERT_TRUE(w != NULL);
    t_fill(w, nout, &s, -1.0f, 1.0f);

    size_t np = 0;
    nn_param_t *p = nn_params(m, &np);
    ASSERT_TRUE(p != NULL);
    nn_zero_grad(m);
    nn_set_input_grad(m, check_input != 0);
    t_loss(m, x, batch, w);
    ASSERT_EQ(nn_backward(m, w), 0);

    size_t pf = 0;
    float *g = nn_flat_grads(m, &pf);
    float *grads = malloc((pf ? pf : 1) * sizeof *grads);
    float *dx = malloc(nin * sizeof *dx);
    ASSERT_TRUE(grads && dx);
    memcpy(grads, g, pf * sizeof *grads);
    if (check_input) {
        const float *ig = nn_input_grad(m);
        ASSERT_TRUE(ig != NULL);
        memcpy(dx, ig, nin * sizeof *dx);
    }

    size_t checked = 0, off = 0;
    for (size_t k = 0; k < np; k++) {
        size_t step = p[k].count > max_per ? (p[k].count + max_per - 1) / max_per : 1;
        for (size_t i = 0; i < p[k].count; i += step) {
            float keep = p[k].data[i];
            p[k].data[i] = keep + (float)eps;
            double lp = t_loss(m, x, batch, w);
            p[k].data[i] = keep - (float)eps;
            double lm = t_loss(m, x, batch, w);
            p[k].data[i] = keep;
            t_close(p[k].name, i, grads[off + i], (lp - lm) / (2 * eps), rtol, atol);
            checked++;
        }
        off += p[k].count;
    }
    if (check_input) {
        size_t step = nin > max_per ? (nin + max_per - 1) / max_per : 1;
        for (size_t i = 0; i < nin; i += step) {
            float keep = x[i];
            x[i] = keep + (float)eps;
            double lp = t_loss(m, x, batch, w);
            x[i] = keep - (float)eps;
            double lm = t_loss(m, x, batch, w);
            x[i] = keep;
            t_close("input", i, dx[i], (lp - lm) / (2 * eps), rtol, atol);
            checked++;
        }
    }
    /* A gradient that is zero everywhere would pass trivially: require some. */
    double norm = 0.0;
    for (size_t i = 0; i < pf; i++) norm += fabs(grads[i]);
    if (check_input)
        for (size_t i = 0; i < nin; i++) norm += fabs(dx[i]);
    ASSERT_TRUE(norm > 1e-3);
    free(w);
    free(grads);
    free(dx);
    return checked;
}

#endif /* TDIST_TEST_NN_CHECK_H */
