/*
 * tests/algorithms/synth_model.h — the synthetic model the DDP-level hook
 * tests train: five parameters of f32 and f64 (one with 300 elements, one
 * of 5), and one DDP step driven the way a training loop would, under the
 * DDP options the tests vary (no_sync micro-batches, unused parameters,
 * gradients as bucket views). Header-only (static inline).
 */
#ifndef TDIST_TEST_SYNTH_MODEL_H
#define TDIST_TEST_SYNTH_MODEL_H

#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "harness.h"
#include "tdist/ddp.h"


#define SM_NP 5
#define SM_MAX 300
static const size_t sm_count[SM_NP] = {300, 7, 64, 5, 33};
static const tdist_dtype_t sm_dtype[SM_NP] = {TDIST_F32, TDIST_F32, TDIST_F64, TDIST_F32, TDIST_F64};
static const char *const sm_name[SM_NP] = {"enc.weight", "enc.bias", "mid.weight", "dec.bias",
                                           "dec.weight"};

typedef struct sm_model {
    _Alignas(64) unsigned char data[SM_NP][SM_MAX * 8];
    _Alignas(64) unsigned char grad[SM_NP][SM_MAX * 8];
    tdist_ddp_param_t params[SM_NP];
} sm_model_t;

static inline double sm_get(const void *buf, tdist_dtype_t dt, size_t i)
{
    if (dt == TDIST_F32) {
        float f;
        memcpy(&f, (const unsigned char *)buf + 4 * i, 4);
        return f;
    }
    double d;
    memcpy(&d, (const unsigned char *)buf + 8 * i, 8);
    return d;
}

static inline void sm_set(void *buf, tdist_dtype_t dt, size_t i, double v)
{
    if (dt == TDIST_F32) {
        float f = (float)v;
        memcpy((unsigned char *)buf + 4 * i, &f, 4);
    } else {
        memcpy((unsigned char *)buf + 8 * i, &v, 8);
    }
}

/* One micro-batch's gradient value (before rounding to the dtype). */
static inline double sm_value(int r, int k, int m, int p, size_t i)
{
    double mag = pow(10.0, (double)((int)(i % 8) - 5));
    return mag * sin(1.3 * r + 0.7 * k + 0.37 * m + 0.11 * p + 0.013 * (double)i + 0.5);
}

/* Rank r's gradient after `micro` micro-batches of step k, accumulated in
 * the parameter's dtype. */
static inline double sm_local(int r, int k, int micro, int p, size_t i)
{
    if (sm_dtype[p] == TDIST_F32) {
        float a = 0;
        for (int m = 0; m < micro; m++) a = a + (float)sm_value(r, k, m, p, i);
        return a;
    }
    double a = 0;
    for (int m = 0; m < micro; m++) a = a + sm_value(r, k, m, p, i);
    return a;
}

static inline void sm_init(sm_model_t *md, int rank)
{
    memset(md, 0, sizeof *md);
    for (int p = 0; p < SM_NP; p++) {
        for (size_t i = 0; i < sm_count[p]; i++) sm_set(md->data[p], sm_dtype[p], i, 0.01 * (double)(i + (size_t)rank));
        md->params[p] = (tdist_ddp_param_t){md->data[p], md->grad[p], sm_count[p], sm_dtype[p],
                                            sm_name[p]};
    }
}

#define SM_P_RANK0 1 /* find_unused: used on rank 0 only */
#define SM_P_NONE 3  /* find_unused: used nowhere */

/* Whether rank r uses parameter p (with find_unused, some do not). */
static inline bool sm_used(bool find_unused, int r, int p)
{
    if (!find_unused) return true;
    return p != SM_P_NONE && (p != SM_P_RANK0 || r == 0);
}

/* Where parameter p's gradient lives: the bucket view or the model's. */
static inline void *sm_grad(tdist_ddp_t *ddp, sm_model_t *md, bool view, int p)
{
    return view ? tdist_ddp_grad_ptr(ddp, (size_t)p) : md->grad[p];
}

/* A micro-batch's gradient value of (rank, step, micro-batch, parameter, element). */
typedef double (*sm_value_fn)(int r, int k, int m, int p, size_t i);

/* One step of rank `rank`: 3 micro-batches with no_sync (all but the last
 * under no_sync), else 1; each adds value()'s gradient in the parameter's
 * dtype, parameters ready in reverse order, then backward_end. */
static inline void sm_ddp_step(tdist_ddp_t *ddp, sm_model_t *md, int rank, int k, bool no_sync,
                               bool find_unused, bool view, sm_value_fn value)
{
    int micro = no_sync ? 3 : 1;
    for (int m = 0; m < micro; m++) {
        ASSERT_OK(tdist_ddp_set_no_sync(ddp, m + 1 < micro));
        ASSERT_OK(tdist_ddp_forward_begin(ddp));
        for (int p = SM_NP; p-- > 0;) {
            if (!sm_used(find_unused, rank, p)) continue;
            void *g = sm_grad(ddp, md, view, p);
            for (size_t i = 0; i < sm_count[p]; i++) {
                double prev = m == 0 ? 0.0 : sm_get(g, sm_dtype[p], i);
                double v = sm_dtype[p] == TDIST_F32 ? (double)((float)prev + (float)value(rank, k, m, p, i))
                                                    : prev + value(rank, k, m, p, i);
                sm_set(g, sm_dtype[p], i, v);
            }
            ASSERT_OK(tdist_ddp_grad_ready(ddp, (size_t)p));
        }
        ASSERT_OK(tdist_ddp_backward_end(ddp));
    }
}

#endif /* TDIST_TEST_SYNTH_MODEL_H */
