/* tests/harness/gen.c — seeded inputs every rank can compute for every
 * rank, and the reduction over ranks of them (see gen.h). */
#include "gen.h"

#include <stdlib.h>
#include <string.h>

#include "harness.h"


uint64_t tgen_mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

void tgen_put(void *buf, size_t i, tdist_dtype_t dt, double v)
{
    uint8_t *b = buf;
    switch (dt) {
    case TDIST_F32: { float f = (float)v; memcpy(b + i * 4, &f, 4); break; }
    case TDIST_F64: memcpy(b + i * 8, &v, 8); break;
    case TDIST_F16: { uint16_t h = tdist_f32_to_f16((float)v); memcpy(b + i * 2, &h, 2); break; }
    case TDIST_BF16: { uint16_t h = tdist_f32_to_bf16((float)v); memcpy(b + i * 2, &h, 2); break; }
    case TDIST_I8: { int8_t x = (int8_t)(int64_t)v; b[i] = (uint8_t)x; break; }
    case TDIST_U8: b[i] = (uint8_t)(int64_t)v; break;
    case TDIST_I32: { int32_t x = (int32_t)(int64_t)v; memcpy(b + i * 4, &x, 4); break; }
    case TDIST_I64: { int64_t x = (int64_t)v; memcpy(b + i * 8, &x, 8); break; }
    default: FAIL("dtype %d", (int)dt);
    }
}

/* Rank `rank`'s input for a case: small integers (exact in every dtype and
 * in any summation order); PROD draws from {1, -1, 2, -2}; bitwise ops use
 * full-width patterns. */
void tgen_fill(void *buf, size_t count, tdist_dtype_t dt, tdist_redop_t op, int rank,
                uint64_t seed)
{
    static const double prodv[8] = {1, -1, 2, 1, -2, 1, 1, -1};
    bool is_unsigned = dt == TDIST_U8;
    for (size_t i = 0; i < count; i++) {
        uint64_t h = tgen_mix(seed * 1000003u + (uint64_t)rank * 7919u + i);
        double v;
        if (op == TDIST_PROD) {
            v = prodv[h % 8];
            if (is_unsigned && v < 0) v = -v;
        } else if (op == TDIST_BAND || op == TDIST_BOR || op == TDIST_BXOR) {
            int64_t x = (int64_t)(h & 0x7fffffff);
            if (op == TDIST_BAND) x |= (int64_t)((h >> 40) & 0x7fff0f0f); /* keep bits set */
            v = (double)(dt == TDIST_U8 ? (x & 0xff) : dt == TDIST_I8 ? (int8_t)(x & 0xff) : x);
        } else if (!tdist_dtype_is_float(dt)) {
            v = is_unsigned ? (double)(h % 201) : (double)((int64_t)(h % 201) - 100);
        } else {
            v = (double)((int64_t)(h % 17) - 8);
        }
        tgen_put(buf, i, dt, v);
    }
}

/* The reduction over ranks [0, n) of their inputs, in rank order. */
void tgen_reference(void *out, size_t count, tdist_dtype_t dt, tdist_redop_t op, int n,
                    uint64_t seed, double premul)
{
    size_t bytes = count * tdist_dtype_size(dt);
    uint8_t *tmp = malloc(bytes ? bytes : 1);
    ASSERT_TRUE(tmp != NULL);
    for (int r = 0; r < n; r++) {
        tgen_fill(r == 0 ? out : tmp, count, dt, op, r, seed);
        if (op == TDIST_PREMUL_SUM && count) ASSERT_OK(tdist_scale(r == 0 ? out : tmp, count, dt, premul));
        if (r > 0 && count) ASSERT_OK(tdist_reduce(out, out, tmp, count, dt, op));
    }
    if (op == TDIST_AVG && count) ASSERT_OK(tdist_divide(out, count, dt, n));
    free(tmp);
}


bool tgen_op_valid(tdist_redop_t op, tdist_dtype_t dt)
{
    if (op == TDIST_PREMUL_SUM) return tdist_dtype_is_float(dt);
    if (tdist_redop_check(op, dt) != TDIST_OK) {
        tdist_clear_error();
        return false;
    }
    return true;
}
