/* tests/algorithms/compress_ref.h — what the 16-bit compression tests
 * (test_compress.c, test_compress_ddp.c) share: an independent reference of
 * PyTorch 1.13's casts (written from its rules, on core's scalar
 * converters, not on the hook's code), and a synthetic model whose
 * gradients every rank can compute for every rank.
 *
 * The model: five parameters of 300, 7, 64, 5 and 33 elements, f32, f32,
 * f64, f32, f64 (the f64 ones get buckets of their own); the gradient of
 * element i of parameter p on rank r in step k, micro-batch m, spans
 * magnitudes 1e-5 .. 1e2 (f16 subnormals included). With micro-batches
 * (no_sync) a rank's gradient is the sum of its micro-batches' values,
 * added in the parameter's dtype in micro-batch order, as the model does
 * it. */
#ifndef TDIST_TEST_COMPRESS_REF_H
#define TDIST_TEST_COMPRESS_REF_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "harness.h"
#include "tdist/algorithms.h"

static inline uint32_t bits32(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float f32_of(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline bool nan16(uint16_t h, tdist_dtype_t wire)
{
    return wire == TDIST_F16 ? (h & 0x7fffu) > 0x7c00u : (h & 0x7fffu) > 0x7f80u;
}

static inline uint16_t to16(float f, tdist_dtype_t wire)
{
    return wire == TDIST_F16 ? tdist_f32_to_f16(f) : tdist_f32_to_bf16(f);
}

static inline float from16(uint16_t h, tdist_dtype_t wire)
{
    return wire == TDIST_F16 ? tdist_f16_to_f32(h) : tdist_bf16_to_f32(h);
}

/* fp16/bf16_compress_hook's input: wire(fl(float(wire(g)) / W)); the
 * division's result through c10's scalar conversion (NaN: f16 sign|0x7E00,
 * bf16 0x7FC0). */
static inline uint16_t ref_hook16(float g, int64_t w, tdist_dtype_t wire)
{
    float q = from16(to16(g, wire), wire) / (float)w;
    uint16_t h = to16(q, wire);
    if (nan16(h, wire)) h = wire == TDIST_F16 ? (uint16_t)((h & 0x8000u) | 0x7e00u) : 0x7fc0u;
    return h;
}

/* The wrappers' cast, Tensor.to(): f16 keeps a NaN's sign and top payload
 * bits; bf16 NaN is 0xFFFF from f32 (ATen's vectorised path), 0x7FC0 from
 * f64 (the scalar one). */
static inline uint16_t ref_cast16(float g, bool from_f32, tdist_dtype_t wire)
{
    uint16_t h = to16(g, wire);
    if (wire == TDIST_BF16 && nan16(h, wire)) h = from_f32 ? 0xffffu : 0x7fc0u;
    return h;
}

/* One addition of the 16-bit sum: wire(float(a) + float(b)). */
static inline uint16_t ref_add16(uint16_t a, uint16_t b, tdist_dtype_t wire)
{
    return to16(from16(a, wire) + from16(b, wire), wire);
}

/* ------------------------------------------------------------- the model */

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

/* Open the job's world group (timeout 20 s, scaled). */
static inline void open_pg(tdist_world_t **w, tdist_pg_t **pg)
{
    tdist_test_open_world(w, pg, (int64_t)(20000 * tdist_test_timeout_mult()));
}

/* Compare a reduced gradient with the expected 16-bit value: the same
 * f32/f64 value (bits, up to the sign of zero), or both NaN. */
static inline void expect_value(const char *what, int step, int p, size_t i, double got,
                                uint16_t want, tdist_dtype_t wire)
{
    double w = (double)from16(want, wire);
    if (nan16(want, wire) ? isnan(got) : got == w) return;
    FAIL("%s step %d '%s'[%zu]: got %.9g, expected %.9g (wire 0x%04x)", what, step, sm_name[p],
         i, got, w, want);
}

#endif /* TDIST_TEST_COMPRESS_REF_H */
