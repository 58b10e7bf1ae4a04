/*
 * optim/kernels.c — the f32 update loops of SGD, Adam and AdamW.
 *
 * Each loop does, per element, the f32 operations PyTorch 1.13's
 * single-tensor implementation (torch/optim/sgd.py, adam.py, adamw.py) does
 * on x86-64 CPUs with AVX2, in the same order and with the same roundings,
 * so the results agree bit for bit. Python-float hyperparameters become f32
 * scalars once; bias corrections and the step size are computed in double
 * as in Python and rounded to f32 once. Where ATen's CPU kernel is a fused
 * multiply-add, so is ours (fmaf: one rounding):
 *   - x.add(y, alpha=a) and x.add_(y, alpha=a): ATen's add is
 *     vec::fmadd(y, a, x), i.e. fmaf(y, fl(a), x). That covers SGD's weight
 *     decay (d = fmaf(p, wd, d)), the momentum update's second half
 *     (buf = fmaf(d, fl(1 - dampening), fl(buf * momentum))), Nesterov
 *     (d = fmaf(buf, momentum, d)), the parameter update
 *     (p = fmaf(fl(-lr), d, p)), Adam's L2 decay and exp_avg's update;
 *   - addcmul_(g, g, value=c): self + c * g * g contracted by the compiler,
 *     fmaf(fl(c * g), g, self) (exp_avg_sq);
 *   - addcdiv_ has a division, which never fuses:
 *     p = fl(p + fl(fl(-step_size * m) / denom));
 *   - mul_ by a scalar (momentum, betas, AdamW's 1 - lr * wd) is one
 *     rounding; sqrt and the division by sqrt(bias_correction2) are IEEE.
 * A weight decay of 0 is skipped, as PyTorch skips it (adding 0 * p would
 * turn -0 into +0 and spread an infinite p's NaN).
 *
 * fmaf is the processor's FMA instruction where there is one: every loop is
 * compiled twice, once for x86-64 with AVX2 + FMA (chosen at run time when
 * the CPU has them; GCC vectorises it, fmaf included) and once plain (there
 * __builtin_fmaf may be a call into the C library: slower, the same
 * results). The loops run in blocks of BLOCK elements (a constant trip
 * count GCC's cheap -O2 vectoriser accepts), then a scalar tail; each
 * element gets the same operations either way, so results depend neither on
 * the buffer's length or alignment nor on the path. This file is built with
 * -fno-math-errno so sqrtf vectorises (the argument is never negative).
 */
#include <math.h>
#include <stdatomic.h>

#include "optim/internal.h"

#define BLOCK 16

#define BLOCKED_LOOP(n, i, body)                                               \
    do {                                                                       \
        size_t i_ = 0;                                                         \
        for (; i_ + BLOCK <= (n); i_ += BLOCK)                                 \
            for (size_t i = i_; i < i_ + BLOCK; i++) body;                     \
        for (size_t i = i_; i < (n); i++) body;                                \
    } while (0)

#if defined(__x86_64__) && defined(__GNUC__)
#define FMA_TARGET __attribute__((target("avx2,fma")))
#define HAVE_FMA_PATH 1
#else
#define FMA_TARGET
#define HAVE_FMA_PATH 0
#endif
#define INLINE static inline __attribute__((always_inline))

static _Atomic int fma_known = -1; /* every thread computes the same value */

static int cpu_has_fma(void)
{
#if HAVE_FMA_PATH
    __builtin_cpu_init();
    return (__builtin_cpu_supports("fma") && __builtin_cpu_supports("avx2")) ? 1 : 0;
#else
    return 0;
#endif
}

static int use_fma_path(void)
{
    int v = atomic_load_explicit(&fma_known, memory_order_relaxed);
    if (v < 0) {
        v = cpu_has_fma();
        atomic_store_explicit(&fma_known, v, memory_order_relaxed);
    }
    return v;
}

int tdist__optim_use_fma(int on)
{
    int v = on && cpu_has_fma();
    atomic_store_explicit(&fma_known, v, memory_order_relaxed);
    return v;
}

/* ------------------------------------------------------------------ SGD */

typedef struct sgd_scalars {
    float sign;           /* -1 when maximizing: d = -g is exact */
    float wd;             /* used only when has_wd */
    float neg_lr;         /* fl(-lr) */
    float mom;            /* fl(momentum) */
    float one_minus_damp; /* fl(1 - dampening) */
} sgd_scalars_t;

/* mode: 0 no momentum, 1 the first step with momentum (buf = d, torch
 * clones the gradient), 2 later steps. The flags are constants at every
 * call, so each combination compiles to its own loop. */
INLINE void sgd_body(const sgd_scalars_t *s, float *restrict p, const float *restrict g,
                     float *restrict buf, size_t n, const int has_wd, const int mode,
                     const int nesterov)
{
    const float sign = s->sign, wd = s->wd, neg_lr = s->neg_lr, mom = s->mom;
    const float omd = s->one_minus_damp;
    BLOCKED_LOOP(n, i, {
        float pi = p[i];
        float d = sign * g[i];
        if (has_wd) d = __builtin_fmaf(pi, wd, d);
        if (mode != 0) {
            float b = d;
            if (mode == 2) b = __builtin_fmaf(d, omd, buf[i] * mom);
            buf[i] = b;
            d = nesterov ? __builtin_fmaf(b, mom, d) : b;
        }
        p[i] = __builtin_fmaf(neg_lr, d, pi);
    });
}

/* The twelve combinations, spelled once for both compilations. */
#define SGD_DISPATCH(s, p, g, buf, n, wd_on, mode, nest)                                  \
    do {                                                                                   \
        if (wd_on) {                                                                       \
            if (mode == 0) sgd_body(s, p, g, buf, n, 1, 0, 0);                             \
            else if (mode == 1) nest ? sgd_body(s, p, g, buf, n, 1, 1, 1)                  \
                                     : sgd_body(s, p, g, buf, n, 1, 1, 0);                 \
            else nest ? sgd_body(s, p, g, buf, n, 1, 2, 1) : sgd_body(s, p, g, buf, n, 1, 2, 0); \
        } else {                                                                           \
            if (mode == 0) sgd_body(s, p, g, buf, n, 0, 0, 0);                             \
            else if (mode == 1) nest ? sgd_body(s, p, g, buf, n, 0, 1, 1)                  \
                                     : sgd_body(s, p, g, buf, n, 0, 1, 0);                 \
            else nest ? sgd_body(s, p, g, buf, n, 0, 2, 1) : sgd_body(s, p, g, buf, n, 0, 2, 0); \
        }                                                                                  \
    } while (0)

FMA_TARGET static void sgd_fma(const sgd_scalars_t *s, float *p, const float *g, float *buf,
                               size_t n, int wd_on, int mode, int nest)
{
    SGD_DISPATCH(s, p, g, buf, n, wd_on, mode, nest);
}

static void sgd_plain(const sgd_scalars_t *s, float *p, const float *g, float *buf, size_t n,
                      int wd_on, int mode, int nest)
{
    SGD_DISPATCH(s, p, g, buf, n, wd_on, mode, nest);
}

void tdist__optim_sgd_update(const tdist_optim_sgd_opts_t *o, double lr, uint64_t step,
                             float *p, const float *g, float *momentum_buf, size_t n)
{
    const sgd_scalars_t s = {
        .sign = o->maximize ? -1.0f : 1.0f,
        .wd = (float)o->weight_decay,
        .neg_lr = (float)(-lr),
        .mom = (float)o->momentum,
        .one_minus_damp = (float)(1.0 - o->dampening),
    };
    const int wd_on = o->weight_decay != 0.0;
    const int mode = o->momentum == 0.0 ? 0 : (step == 1 ? 1 : 2);
    const int nest = o->nesterov ? 1 : 0;
    if (use_fma_path())
        sgd_fma(&s, p, g, momentum_buf, n, wd_on, mode, nest);
    else
        sgd_plain(&s, p, g, momentum_buf, n, wd_on, mode, nest);
}

/* ----------------------------------------------------------- Adam/AdamW */

typedef struct adam_scalars {
    float sign;       /* -1 when maximizing */
    float l2;         /* Adam's weight decay (used only when has_l2) */
    float decay;      /* AdamW: fl(1 - lr * wd), applied to p first (always, as torch) */
    float beta1, one_minus_beta1;
    float beta2, one_minus_beta2;
    float bc2_sqrt;   /* fl(sqrt(1 - beta2^t)) */
    float eps;
    float neg_step;   /* fl(-(lr / (1 - beta1^t))) */
} adam_scalars_t;

/* decoupled: AdamW. vmax is NULL unless amsgrad. */
INLINE void adam_body(const adam_scalars_t *s, float *restrict p, const float *restrict g,
                      float *restrict m, float *restrict v, float *restrict vmax, size_t n,
                      const int decoupled, const int has_l2, const int amsgrad)
{
    const float sign = s->sign, l2 = s->l2, decay = s->decay;
    const float b1 = s->beta1, omb1 = s->one_minus_beta1;
    const float b2 = s->beta2, omb2 = s->one_minus_beta2;
    const float bc2s = s->bc2_sqrt, eps = s->eps, neg_step = s->neg_step;
    BLOCKED_LOOP(n, i, {
        float pi = p[i];
        if (decoupled) pi = pi * decay;
        float gi = sign * g[i];
        if (has_l2) gi = __builtin_fmaf(pi, l2, gi);
        float mi = __builtin_fmaf(gi, omb1, m[i] * b1);
        float vi = __builtin_fmaf(omb2 * gi, gi, v[i] * b2);
        m[i] = mi;
        v[i] = vi;
        if (amsgrad) {
            /* torch.maximum: a NaN on either side propagates */
            float old = vmax[i];
            vi = (vi > old || vi != vi) ? vi : old;
            vmax[i] = vi;
        }
        float denom = sqrtf(vi) / bc2s + eps;
        p[i] = pi + neg_step * mi / denom;
    });
}

#define ADAM_DISPATCH(s, p, g, m, v, vmax, n, dec, l2_on, ams)                                   \
    do {                                                                                          \
        if (dec) {                                                                                \
            ams ? adam_body(s, p, g, m, v, vmax, n, 1, 0, 1)                                      \
                : adam_body(s, p, g, m, v, vmax, n, 1, 0, 0);                                     \
        } else if (l2_on) {                                                                       \
            ams ? adam_body(s, p, g, m, v, vmax, n, 0, 1, 1)                                      \
                : adam_body(s, p, g, m, v, vmax, n, 0, 1, 0);                                     \
        } else {                                                                                  \
            ams ? adam_body(s, p, g, m, v, vmax, n, 0, 0, 1)                                      \
                : adam_body(s, p, g, m, v, vmax, n, 0, 0, 0);                                     \
        }                                                                                         \
    } while (0)

FMA_TARGET static void adam_fma(const adam_scalars_t *s, float *p, const float *g, float *m,
                                float *v, float *vmax, size_t n, int dec, int l2_on, int ams)
{
    ADAM_DISPATCH(s, p, g, m, v, vmax, n, dec, l2_on, ams);
}

static void adam_plain(const adam_scalars_t *s, float *p, const float *g, float *m, float *v,
                       float *vmax, size_t n, int dec, int l2_on, int ams)
{
    ADAM_DISPATCH(s, p, g, m, v, vmax, n, dec, l2_on, ams);
}

void tdist__optim_adam_update(const tdist_optim_adam_opts_t *o, int decoupled, double lr,
                              uint64_t step, float *p, const float *g, float *exp_avg,
                              float *exp_avg_sq, float *max_exp_avg_sq, size_t n)
{
    const double t = (double)step;
    const double bc1 = 1.0 - pow(o->beta1, t);
    const double bc2 = 1.0 - pow(o->beta2, t);
    const adam_scalars_t s = {
        .sign = o->maximize ? -1.0f : 1.0f,
        .l2 = (float)o->weight_decay,
        .decay = (float)(1.0 - lr * o->weight_decay),
        .beta1 = (float)o->beta1,
        .one_minus_beta1 = (float)(1.0 - o->beta1),
        .beta2 = (float)o->beta2,
        .one_minus_beta2 = (float)(1.0 - o->beta2),
        .bc2_sqrt = (float)sqrt(bc2),
        .eps = (float)o->eps,
        .neg_step = (float)(-(lr / bc1)),
    };
    const int dec = decoupled ? 1 : 0;
    const int l2_on = !decoupled && o->weight_decay != 0.0;
    const int ams = o->amsgrad ? 1 : 0;
    float *vmax = ams ? max_exp_avg_sq : NULL;
    if (use_fma_path())
        adam_fma(&s, p, g, exp_avg, exp_avg_sq, vmax, n, dec, l2_on, ams);
    else
        adam_plain(&s, p, g, exp_avg, exp_avg_sq, vmax, n, dec, l2_on, ams);
}
