/* tests/harness/gen.c — seeded inputs every rank can compute for every
 * rank, and the reduction over ranks of them (see gen.h). */
#include "gen.h"

#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "tbuf.h"


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

/* The value of element i of a case: what tgen_fill documents. */
enum { VAL_PROD, VAL_BITS, VAL_INT, VAL_UINT, VAL_FLOAT };
static inline double value_of(int kind, uint64_t h, tdist_dtype_t dt, tdist_redop_t op)
{
    static const double prodv[8] = {1, -1, 2, 1, -2, 1, 1, -1};
    switch (kind) {
    case VAL_PROD: {
        double v = prodv[h % 8];
        return dt == TDIST_U8 && v < 0 ? -v : v;
    }
    case VAL_BITS: {
        int64_t x = (int64_t)(h & 0x7fffffff);
        if (op == TDIST_BAND) x |= (int64_t)((h >> 40) & 0x7fff0f0f); /* keep bits set */
        return (double)(dt == TDIST_U8 ? (x & 0xff) : dt == TDIST_I8 ? (int8_t)(x & 0xff) : x);
    }
    case VAL_INT: return (double)((int64_t)(h % 201) - 100);
    case VAL_UINT: return (double)(h % 201);
    default: return (double)((int64_t)(h % 17) - 8);
    }
}


/* Rank `rank`'s input for a case: small integers (exact in every dtype and
 * in any summation order); PROD draws from {1, -1, 2, -2}; bitwise ops use
 * full-width patterns. The kind of value is chosen once, not per element:
 * every collective test computes every rank's input this way (the
 * reference: ranks x count elements on each rank), and in the sanitizer
 * builds this loop was the largest part of the 8-rank matrix's time
 * (gen.c is compiled with -O2 there too, tests/CMakeLists.txt). Every kind
 * but the bit patterns takes one of at most 201 values, element i the one
 * that tgen_mix(base + i) picks: each value's bytes in the dtype are made
 * once, and the loop only picks and copies. */
void tgen_fill(void *buf, size_t count, tdist_dtype_t dt, tdist_redop_t op, int rank,
               uint64_t seed)
{
    tgen_fill_part(buf, 0, count, dt, op, rank, seed);
}

void tgen_fill_part(void *buf, size_t first, size_t count, tdist_dtype_t dt, tdist_redop_t op,
                    int rank, uint64_t seed)
{
    int kind = op == TDIST_PROD                                            ? VAL_PROD
               : op == TDIST_BAND || op == TDIST_BOR || op == TDIST_BXOR ? VAL_BITS
               : tdist_dtype_is_float(dt)                                 ? VAL_FLOAT
               : dt == TDIST_U8                                           ? VAL_UINT
                                                                          : VAL_INT;
    uint64_t base = seed * 1000003u + (uint64_t)rank * 7919u + first;
    uint8_t *b = buf; /* may be unaligned (the tests' mode 2): stores go by memcpy */
    if (kind == VAL_BITS) {
        for (size_t i = 0; i < count; i++) tgen_put(b, i, dt, value_of(kind, tgen_mix(base + i), dt, op));
        return;
    }
    /* value_of of these kinds depends on h % m only (m = 8, 17 or 201) */
    uint32_t m = kind == VAL_PROD ? 8 : kind == VAL_FLOAT ? 17 : 201;
    uint8_t tab[201 * 8];
    for (uint32_t k = 0; k < m; k++) tgen_put(tab, k, dt, value_of(kind, k, dt, op));
#define PICK(ES, M)                                                                   \
    for (size_t i = 0; i < count; i++)                                                \
        memcpy(b + i * (ES), tab + (tgen_mix(base + i) % (M)) * (ES), (ES));          \
    return
#define BY_M(ES)                                                                      \
    switch (m) {                                                                      \
    case 8: PICK(ES, 8);                                                              \
    case 17: PICK(ES, 17);                                                            \
    default: PICK(ES, 201);                                                           \
    }
    switch (tdist_dtype_size(dt)) {
    case 1: BY_M(1);
    case 2: BY_M(2);
    case 4: BY_M(4);
    default: BY_M(8);
    }
#undef BY_M
#undef PICK
}

/* The reduction over ranks [0, n) of their inputs, in rank order. */
void tgen_reference(void *out, size_t count, tdist_dtype_t dt, tdist_redop_t op, int n,
                    uint64_t seed, double premul)
{
    tgen_reference_part(out, 0, count, dt, op, n, seed, premul);
}

void tgen_reference_part(void *out, size_t first, size_t count, tdist_dtype_t dt,
                         tdist_redop_t op, int n, uint64_t seed, double premul)
{
    size_t bytes = count * tdist_dtype_size(dt);
    uint8_t *tmp = tbuf_alloc(bytes);
    ASSERT_TRUE(tmp != NULL);
    for (int r = 0; r < n; r++) {
        tgen_fill_part(r == 0 ? out : tmp, first, count, dt, op, r, seed);
        if (op == TDIST_PREMUL_SUM && count) ASSERT_OK(tdist_scale(r == 0 ? out : tmp, count, dt, premul));
        if (r > 0 && count) ASSERT_OK(tdist_reduce(out, out, tmp, count, dt, op));
    }
    if (op == TDIST_AVG && count) ASSERT_OK(tdist_divide(out, count, dt, n));
    tbuf_free(tmp);
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
