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
#include "synth_model.h"

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
