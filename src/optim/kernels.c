/*
 * optim/kernels.c — the f32 update loops of SGD, Adam and AdamW.
 *
 * Each loop does, per element, the same f32 operations in the same order
 * as PyTorch's single-tensor implementation (torch/optim/sgd.py, adam.py,
 * adamw.py): Python-float hyperparameters become f32 scalars, bias
 * corrections and the step size are computed in double as in Python and
 * rounded to f32 once.
 *
 * Plain loops over restrict pointers, no intrinsics. GCC 12 vectorises the
 * SGD loops at -O2 and -O3 (checked with -fopt-info-vec). The Adam loops
 * vectorise too when this file is built with -fno-math-errno (which changes
 * no result: it only stops sqrtf from setting errno on a negative input,
 * and the argument here is never negative); without it they run scalar
 * with an inline sqrtss, still correct. Vectorised or not, each element
 * gets the same operations, so results do not depend on the buffer's
 * length or alignment.
 *
 * Weight decay 0 is applied as "+ 0 * param" rather than skipped as in
 * PyTorch: identical for every finite parameter, and one loop instead of
 * two.
 */
#include <math.h>

#include "optim/internal.h"

/* ------------------------------------------------------------------ SGD */

/* Loops run in blocks of BLOCK elements (a constant trip count GCC's
 * cheap -O2 vectoriser accepts), then a scalar tail. The per-element
 * bodies are static inline functions so the two loops share one text. */
#define BLOCK 16

#define BLOCKED_LOOP(n, i, body)                                               \
    do {                                                                       \
        size_t i_ = 0;                                                         \
        for (; i_ + BLOCK <= (n); i_ += BLOCK)                                 \
            for (size_t i = i_; i < i_ + BLOCK; i++) body;                     \
        for (size_t i = i_; i < (n); i++) body;                                \
    } while (0)

/* d = s * g + wd * p: the gradient with maximize and L2 decay applied. */
static inline float sgd_grad(float g, float p, float sign, float wd) { return sign * g + wd * p; }

/* No momentum: p += -lr * d. */
static void sgd_plain(float *restrict p, const float *restrict g, size_t n, float sign,
                      float wd, float neg_lr)
{
    BLOCKED_LOOP(n, i, {
        float d = sgd_grad(g[i], p[i], sign, wd);
        p[i] = p[i] + neg_lr * d;
    });
}

/* First step with momentum: buf = d (torch clones the gradient). */
static void sgd_momentum_first(float *restrict p, const float *restrict g, float *restrict buf,
                               size_t n, float sign, float wd, float neg_lr, float mom,
                               int nesterov)
{
    if (nesterov) {
        BLOCKED_LOOP(n, i, {
            float d = sgd_grad(g[i], p[i], sign, wd);
            buf[i] = d;
            p[i] = p[i] + neg_lr * (d + mom * d);
        });
    } else {
        BLOCKED_LOOP(n, i, {
            float d = sgd_grad(g[i], p[i], sign, wd);
            buf[i] = d;
            p[i] = p[i] + neg_lr * d;
        });
    }
}

/* Later steps: buf = mom * buf + (1 - dampening) * d. */
static void sgd_momentum(float *restrict p, const float *restrict g, float *restrict buf, size_t n,
                         float sign, float wd, float neg_lr, float mom, float one_minus_damp,
                         int nesterov)
{
    if (nesterov) {
        BLOCKED_LOOP(n, i, {
            float d = sgd_grad(g[i], p[i], sign, wd);
            float b = buf[i] * mom + one_minus_damp * d;
            buf[i] = b;
            p[i] = p[i] + neg_lr * (d + mom * b);
        });
    } else {
        BLOCKED_LOOP(n, i, {
            float d = sgd_grad(g[i], p[i], sign, wd);
            float b = buf[i] * mom + one_minus_damp * d;
            buf[i] = b;
            p[i] = p[i] + neg_lr * b;
        });
    }
}

void tdist__optim_sgd_update(const tdist_optim_sgd_opts_t *o, double lr, uint64_t step,
                             float *p, const float *g, float *momentum_buf, size_t n)
{
    const float sign = o->maximize ? -1.0f : 1.0f;
    const float wd = (float)o->weight_decay;
    const float neg_lr = (float)(-lr);
    const float mom = (float)o->momentum;
    if (o->momentum == 0.0) {
        sgd_plain(p, g, n, sign, wd, neg_lr);
    } else if (step == 1) {
        sgd_momentum_first(p, g, momentum_buf, n, sign, wd, neg_lr, mom, o->nesterov);
    } else {
        sgd_momentum(p, g, momentum_buf, n, sign, wd, neg_lr, mom, (float)(1.0 - o->dampening),
                     o->nesterov);
    }
}

/* ----------------------------------------------------------- Adam/AdamW */

typedef struct adam_scalars {
    float sign;       /* -1 when maximizing */
    float l2;         /* Adam: wd added to the gradient as wd * p; AdamW: 0 */
    float decay;      /* AdamW: p *= 1 - lr * wd first; Adam: 1 */
    float beta1, one_minus_beta1;
    float beta2, one_minus_beta2;
    float bc2_sqrt;   /* sqrt(1 - beta2^t) */
    float eps;
    float neg_step;   /* -lr / (1 - beta1^t) */
} adam_scalars_t;

static void adam_loop(const adam_scalars_t *s, float *restrict p, const float *restrict g,
                      float *restrict m, float *restrict v, size_t n)
{
    const float sign = s->sign, l2 = s->l2, decay = s->decay;
    const float b1 = s->beta1, omb1 = s->one_minus_beta1;
    const float b2 = s->beta2, omb2 = s->one_minus_beta2;
    const float bc2s = s->bc2_sqrt, eps = s->eps, neg_step = s->neg_step;
    BLOCKED_LOOP(n, i, {
        float pi = p[i] * decay;
        float gi = sign * g[i] + l2 * pi;
        float mi = m[i] * b1 + omb1 * gi;
        float vi = v[i] * b2 + omb2 * gi * gi;
        m[i] = mi;
        v[i] = vi;
        float denom = sqrtf(vi) / bc2s + eps;
        p[i] = pi + neg_step * mi / denom;
    });
}

static void adam_loop_amsgrad(const adam_scalars_t *s, float *restrict p, const float *restrict g,
                              float *restrict m, float *restrict v, float *restrict vmax, size_t n)
{
    const float sign = s->sign, l2 = s->l2, decay = s->decay;
    const float b1 = s->beta1, omb1 = s->one_minus_beta1;
    const float b2 = s->beta2, omb2 = s->one_minus_beta2;
    const float bc2s = s->bc2_sqrt, eps = s->eps, neg_step = s->neg_step;
    BLOCKED_LOOP(n, i, {
        float pi = p[i] * decay;
        float gi = sign * g[i] + l2 * pi;
        float mi = m[i] * b1 + omb1 * gi;
        float vi = v[i] * b2 + omb2 * gi * gi;
        /* torch.maximum: a NaN on either side propagates */
        float old = vmax[i];
        float mx = (vi > old || vi != vi) ? vi : old;
        m[i] = mi;
        v[i] = vi;
        vmax[i] = mx;
        float denom = sqrtf(mx) / bc2s + eps;
        p[i] = pi + neg_step * mi / denom;
    });
}

void tdist__optim_adam_update(const tdist_optim_adam_opts_t *o, int decoupled, double lr,
                              uint64_t step, float *p, const float *g, float *exp_avg,
                              float *exp_avg_sq, float *max_exp_avg_sq, size_t n)
{
    const double t = (double)step;
    const double bc1 = 1.0 - pow(o->beta1, t);
    const double bc2 = 1.0 - pow(o->beta2, t);
    adam_scalars_t s = {
        .sign = o->maximize ? -1.0f : 1.0f,
        .l2 = decoupled ? 0.0f : (float)o->weight_decay,
        .decay = decoupled ? (float)(1.0 - lr * o->weight_decay) : 1.0f,
        .beta1 = (float)o->beta1,
        .one_minus_beta1 = (float)(1.0 - o->beta1),
        .beta2 = (float)o->beta2,
        .one_minus_beta2 = (float)(1.0 - o->beta2),
        .bc2_sqrt = (float)sqrt(bc2),
        .eps = (float)o->eps,
        .neg_step = (float)(-(lr / bc1)),
    };
    if (o->amsgrad)
        adam_loop_amsgrad(&s, p, g, exp_avg, exp_avg_sq, max_exp_avg_sq, n);
    else
        adam_loop(&s, p, g, exp_avg, exp_avg_sq, n);
}
