/*
 * tests/algorithms/powersgd_ref.h — an independent PowerSGD for the
 * tests: PyTorch 1.13's powerSGD_hook and batched_powerSGD_hook written
 * from their definition (docs/algorithms.md, "PowerSGD") as plain loops,
 * every rank simulated in one process (each rank's gradients are known to
 * every rank). Each stage is a tensor of f32 values, as in PyTorch, but
 * computed in double and rounded once, so the reference shares none of
 * tdist's orders of summation: tdist agrees with it to rounding, every
 * value within PSREF_TOL of the largest magnitude of its vector (the
 * tolerance of the comparison with PyTorch itself, test_powersgd.c).
 *
 * Per tensor M (n x m, rank r' = min(n, m, r)), with x_w = g_w (+ e_w
 * once an error exists) on rank w of W:
 *   Q = orth(kept Q (warm start) or a fresh draw);
 *   P = orth(sum_w x_w Q);  Q = (sum_w x_w^T P) / W, kept;
 *   out = P Q^T;  e_w = x_w - out.
 * Uncompressed tensors: out = (sum_w x_w) / W; their error is x_w - out
 * (PyTorch's quirk) or 0. orth is Gram-Schmidt: each column divided by
 * its norm + epsilon, the later columns lose their projection on it.
 * Before start_powerSGD_iter: out = sum_w (g_w / W). The fresh Q is the
 * injected opts.initial_q or the documented generator (splitmix64 and
 * Box-Muller, written again here from the documentation). The batched
 * hook: the bucket as one zero-padded side x side matrix, keyed by the
 * bucket index; its error covers the padding.
 * Header-only (static inline).
 */
#ifndef TDIST_TEST_POWERSGD_REF_H
#define TDIST_TEST_POWERSGD_REF_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "tdist/algorithms.h"

#define PSREF_TOL       5e-6
#define PSREF_MAX_RANKS 4
#define PSREF_MAX_KEYS  16

typedef struct psref_key {
    float *err[PSREF_MAX_RANKS]; /* elen floats per rank when has_err */
    size_t elen;
    bool has_err;
    float *q; /* qlen floats (m x r', row-major) when has_q */
    size_t qlen;
    bool has_q;
} psref_key_t;

typedef struct psref {
    tdist_powersgd_opts_t o;
    int world;
    int64_t iter; /* PyTorch's state.iter */
    psref_key_t key[PSREF_MAX_KEYS];
} psref_t;

static inline void psref_init(psref_t *s, const tdist_powersgd_opts_t *o, int world)
{
    memset(s, 0, sizeof *s);
    s->o = *o;
    s->world = world;
    ASSERT_TRUE(world >= 1 && world <= PSREF_MAX_RANKS);
}

static inline void psref_fini(psref_t *s)
{
    for (int k = 0; k < PSREF_MAX_KEYS; k++) {
        for (int w = 0; w < PSREF_MAX_RANKS; w++) free(s->key[k].err[w]);
        free(s->key[k].q);
    }
    memset(s, 0, sizeof *s);
}

static inline float *psref_floats(size_t n)
{
    float *v = calloc(n ? n : 1, sizeof *v);
    ASSERT_TRUE(v != NULL);
    return v;
}

/* ---------------------------------------------------- the initial Q */

static inline uint64_t psref_splitmix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

/* A fresh Q of `key` drawn at iteration `draw`: injected, or generated. */
static inline void psref_draw(const psref_t *s, float *q, size_t n, uint64_t draw, size_t key)
{
    if (key < s->o.num_initial_q && s->o.initial_q[key]) {
        memcpy(q, s->o.initial_q[key], n * sizeof *q);
        return;
    }
    const double two_pi = 6.283185307179586476925286766559;
    uint64_t seed = psref_splitmix(s->o.random_seed ^ psref_splitmix(draw * 4294967296ULL + key));
    for (size_t e = 0; e < n; e++) {
        double u1 = (double)((psref_splitmix(seed + 2 * e) >> 11) + 1) / 9007199254740992.0;
        double u2 = (double)(psref_splitmix(seed + 2 * e + 1) >> 11) / 9007199254740992.0;
        q[e] = (float)(sqrt(-2.0 * log(u1)) * cos(two_pi * u2));
    }
}

/* --------------------------------------------------------- the stages */

/* Gram-Schmidt on the columns of a (rows x r, row-major). */
static inline void psref_orth(float *a, size_t rows, size_t r, float eps)
{
    for (size_t c = 0; c < r; c++) {
        double ss = 0;
        for (size_t i = 0; i < rows; i++) ss += (double)a[i * r + c] * a[i * r + c];
        float norm = (float)sqrt(ss);
        norm = norm + eps;
        for (size_t i = 0; i < rows; i++) a[i * r + c] = (float)((double)a[i * r + c] / norm);
        for (size_t d = c + 1; d < r; d++) {
            double dot = 0;
            for (size_t i = 0; i < rows; i++) dot += (double)a[i * r + c] * a[i * r + d];
            float fdot = (float)dot;
            for (size_t i = 0; i < rows; i++)
                a[i * r + d] = (float)((double)a[i * r + d] - (double)fdot * a[i * r + c]);
        }
    }
}

/* sum over the W ranks of the dot product of x[w][at + t * step] and
 * v[t * vstride], t < len: each rank's product an f32 tensor, then their
 * f32 sum. */
static inline float psref_rank_dot(float *const *x, int W, size_t at, size_t step, size_t len,
                                   const float *v, size_t vstride)
{
    double sum = 0;
    for (int w = 0; w < W; w++) {
        double acc = 0;
        for (size_t t = 0; t < len; t++) acc += (double)x[w][at + t * step] * v[t * vstride];
        sum += (float)acc;
    }
    return (float)sum;
}

/* One tensor of `cnt` values (n x m when compressed) under key k: x[w] is
 * rank w's input (already with its error), out the result. */
static inline void psref_tensor(psref_t *s, size_t k, float *const *x, size_t n, size_t m,
                                bool compress, float *out, int64_t divisor)
{
    const int W = s->world;
    const size_t cnt = n * m;
    psref_key_t *key = &s->key[k];
    if (!compress) {
        for (size_t i = 0; i < cnt; i++) {
            double sum = 0;
            for (int w = 0; w < W; w++) sum += x[w][i];
            out[i] = (float)((double)(float)sum / (double)divisor);
        }
        return;
    }
    size_t r = (size_t)s->o.matrix_approximation_rank;
    r = r < n ? r : n;
    r = r < m ? r : m;
    if (key->qlen != m * r) {
        free(key->q);
        key->q = psref_floats(m * r);
        key->qlen = m * r;
        key->has_q = false;
    }
    if (!s->o.warm_start || !key->has_q) psref_draw(s, key->q, m * r, (uint64_t)s->iter, k);
    float *q = key->q, *p = psref_floats(n * r);
    psref_orth(q, m, r, s->o.orthogonalization_epsilon);
    for (size_t i = 0; i < n; i++) /* P = sum_w x_w Q */
        for (size_t c = 0; c < r; c++) p[i * r + c] = psref_rank_dot(x, W, i * m, 1, m, q + c, r);
    psref_orth(p, n, r, s->o.orthogonalization_epsilon);
    for (size_t j = 0; j < m; j++) /* Q = sum_w x_w^T P / W */
        for (size_t c = 0; c < r; c++)
            q[j * r + c] = (float)((double)psref_rank_dot(x, W, j, m, n, p + c, r) / (double)divisor);
    key->has_q = true;
    for (size_t i = 0; i < n; i++) /* out = P Q^T */
        for (size_t j = 0; j < m; j++) {
            double acc = 0;
            for (size_t c = 0; c < r; c++) acc += (double)p[i * r + c] * q[j * r + c];
            out[i * m + j] = (float)acc;
        }
    free(p);
}

/* x[w] = in[w] + rank w's error of key k (once one exists); error
 * feedback off: x[w] = in[w]. */
static inline void psref_input(psref_t *s, size_t k, const float *const *in, size_t len,
                               float **x)
{
    psref_key_t *key = &s->key[k];
    bool add = s->o.use_error_feedback && key->has_err && key->elen == len;
    for (int w = 0; w < s->world; w++) {
        x[w] = psref_floats(len);
        for (size_t i = 0; i < len; i++) x[w][i] = add ? in[w][i] + key->err[w][i] : in[w][i];
    }
}

/* The new error of key k: x[w] - out (zero: 0), then frees x. */
static inline void psref_error(psref_t *s, size_t k, float **x, const float *out, size_t len,
                               bool zero)
{
    psref_key_t *key = &s->key[k];
    for (int w = 0; w < s->world; w++) {
        if (s->o.use_error_feedback) {
            if (key->elen != len || !key->err[w]) {
                free(key->err[w]);
                key->err[w] = psref_floats(len);
            }
            for (size_t i = 0; i < len; i++) key->err[w][i] = zero ? 0.0f : x[w][i] - out[i];
        }
        free(x[w]);
    }
    if (s->o.use_error_feedback) {
        key->elen = len;
        key->has_err = true;
    }
}

/* ------------------------------------------------------------ a bucket */

/* Bucket `index` of the current iteration: np parameters (indices idx,
 * counts cnt, in bucket order); in[w] is rank w's flat bucket, out gets
 * what every rank gets; the divisor is W unless Join says otherwise.
 * Call psref_end_iteration after the iteration's last bucket. */
static inline void psref_bucket(psref_t *s, size_t index, const size_t *idx, const size_t *cnt,
                                size_t np, const float *const *in, float *out)
{
    const int64_t W = s->world;
    size_t count = 0;
    for (size_t j = 0; j < np; j++) count += cnt[j];
    if (s->iter < s->o.start_powerSGD_iter) {
        for (size_t i = 0; i < count; i++) {
            double sum = 0;
            for (int w = 0; w < s->world; w++) sum += (float)((double)in[w][i] / (double)W);
            out[i] = (float)sum;
        }
        return;
    }
    float *x[PSREF_MAX_RANKS];
    if (s->o.batched) {
        size_t side = 1;
        while (side * side < count) side++;
        const float *pad[PSREF_MAX_RANKS];
        for (int w = 0; w < s->world; w++) {
            float *v = psref_floats(side * side); /* zero-padded */
            memcpy(v, in[w], count * sizeof *v);
            pad[w] = v;
        }
        float *full = psref_floats(side * side);
        ASSERT_TRUE(index < PSREF_MAX_KEYS);
        psref_input(s, index, pad, side * side, x);
        psref_tensor(s, index, x, side, side, true, full, W);
        memcpy(out, full, count * sizeof *out);
        psref_error(s, index, x, full, side * side, false);
        for (int w = 0; w < s->world; w++) free((void *)pad[w]);
        free(full);
        return;
    }
    for (size_t j = 0, off = 0; j < np; off += cnt[j], j++) {
        size_t p = idx[j], rows = p < s->o.num_params ? s->o.param_rows[p] : 0;
        ASSERT_TRUE(p < PSREF_MAX_KEYS);
        size_t n = rows ? rows : cnt[j], m = rows ? cnt[j] / rows : 1;
        size_t r = (size_t)s->o.matrix_approximation_rank;
        r = r < n ? r : n;
        r = r < m ? r : m;
        bool compress = rows > 0 && cnt[j] > 0 &&
                        (double)(n + m) * (double)r * s->o.min_compression_rate < (double)n * m;
        const float *part[PSREF_MAX_RANKS];
        for (int w = 0; w < s->world; w++) part[w] = in[w] + off;
        psref_input(s, p, part, cnt[j], x);
        psref_tensor(s, p, x, n, m, compress, out + off, W);
        psref_error(s, p, x, out + off, cnt[j], !compress && !s->o.error_feedback_uncompressed);
    }
}

static inline void psref_end_iteration(psref_t *s)
{
    s->iter++;
}

/* got against want (n values): every |got - want| within tol (PSREF_TOL
 * unless a test says why not) of the largest |want| (1 for a zero
 * vector); returns the largest deviation relative to that scale. */
static inline double psref_check(const char *what, int step, const float *got, const float *want,
                                 size_t n, double tol)
{
    double scale = 0, dev = 0;
    for (size_t i = 0; i < n; i++) scale = fmax(scale, fabs((double)want[i]));
    if (scale == 0) scale = 1;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - (double)want[i]);
        if (!(d <= tol * scale))
            FAIL("step %d %s[%zu]: tdist %.9g, reference %.9g (vector scale %.3g, tolerance %.0e "
                 "of it)",
                 step, what, i, (double)got[i], (double)want[i], scale, tol);
        dev = fmax(dev, d / scale);
    }
    return dev;
}

#endif /* TDIST_TEST_POWERSGD_REF_H */
