/*
 * tests/core/test_reduce.c — reduction kernels, scale, divide, identity fill.
 *
 * Every dtype x op is checked against a straightforward reference loop
 * written here (integers computed wide and wrapped by masking; floats
 * element by element, f16/bf16 through the exhaustively tested scalar
 * conversions), out of place, in place (dst == a, dst == b, dst == a == b),
 * a == b, with unaligned pointers, for counts 0, 1, 7, chunk edges and
 * 1000003, on every kernel instruction set the CPU has.
 */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/kernels.h"
#include "harness.h"
#include "tbuf.h"

/* ------------------------------------------------------------ helpers */

#define NELEM(a) (sizeof(a) / sizeof((a)[0]))

static uint64_t rng_state;

static uint64_t rnd(void)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    uint64_t x = rng_state;
    x ^= x >> 29;
    return x * 0xbf58476d1ce4e5b9ull ^ (x >> 32);
}

/* A float with an interesting mix: ordinary values of varied magnitude, and
 * now and then a NaN, an infinity, a signed zero, a subnormal, a huge one. */
static double rnd_real(int allow_special)
{
    uint64_t r = rnd();
    if (allow_special && r % 61 == 0) {
        switch ((r >> 8) % 8) {
        case 0: return NAN;
        case 1: return INFINITY;
        case 2: return -INFINITY;
        case 3: return 0.0;
        case 4: return -0.0;
        case 5: return 0x1p-140;  /* f32 subnormal */
        case 6: return -0x1p-20;  /* f16 subnormal */
        default: return 3e38;
        }
    }
    double m = (double)(r >> 11) / 9007199254740992.0; /* [0, 1) */
    int e = (int)((r >> 3) % 16) - 8;
    double v = ldexp(m, e);
    return (r & 1) ? -v : v;
}

static void gen(void *buf, size_t n, tdist_dtype_t dt, int allow_special)
{
    unsigned char *p = buf;
    for (size_t i = 0; i < n; i++) {
        switch (dt) {
        case TDIST_F32: { float v = (float)rnd_real(allow_special); memcpy(p + 4 * i, &v, 4); break; }
        case TDIST_F64: { double v = rnd_real(allow_special); memcpy(p + 8 * i, &v, 8); break; }
        case TDIST_F16: {
            uint16_t h = allow_special && rnd() % 4 == 0 ? (uint16_t)rnd() /* any pattern */
                                                          : tdist_f32_to_f16((float)rnd_real(0));
            memcpy(p + 2 * i, &h, 2);
            break;
        }
        case TDIST_BF16: {
            uint16_t h = allow_special && rnd() % 4 == 0 ? (uint16_t)rnd() : tdist_f32_to_bf16((float)rnd_real(0));
            memcpy(p + 2 * i, &h, 2);
            break;
        }
        case TDIST_I8:
        case TDIST_U8: p[i] = (unsigned char)rnd(); break;
        case TDIST_I32: { uint32_t v = (uint32_t)rnd(); if (rnd() % 3 == 0) v %= 100; memcpy(p + 4 * i, &v, 4); break; }
        case TDIST_I64: { uint64_t v = rnd(); if (rnd() % 3 == 0) v %= 1000; memcpy(p + 8 * i, &v, 8); break; }
        default: FAIL("bad dtype");
        }
    }
}

/* --------------------------------------------------------- reference */

static double ref_minmax(double x, double y, int is_min)
{
    if (isnan(x)) return x;
    if (isnan(y)) return y;
    if (x == 0 && y == 0) { /* -0 < +0 */
        if (is_min) return signbit(x) ? x : y;
        return signbit(x) ? y : x;
    }
    if (is_min) return x < y ? x : y;
    return x > y ? x : y;
}

static double ref_float(double x, double y, tdist_redop_t op, int is_f32)
{
    switch (op) {
    case TDIST_SUM:
    case TDIST_AVG:
    case TDIST_PREMUL_SUM: return is_f32 ? (double)((float)x + (float)y) : x + y;
    case TDIST_PROD: return is_f32 ? (double)((float)x * (float)y) : x * y;
    case TDIST_MIN: return ref_minmax(x, y, 1);
    case TDIST_MAX: return ref_minmax(x, y, 0);
    default: FAIL("float op %d", op);
    }
}

/* Integer op computed in 128 bits; the caller wraps by masking. */
static __int128 ref_int(__int128 x, __int128 y, tdist_redop_t op)
{
    switch (op) {
    case TDIST_SUM:
    case TDIST_AVG:
    case TDIST_PREMUL_SUM: return x + y;
    case TDIST_PROD: return x * y;
    case TDIST_MIN: return x < y ? x : y;
    case TDIST_MAX: return x > y ? x : y;
    case TDIST_BAND: return x & y;
    case TDIST_BOR: return x | y;
    case TDIST_BXOR: return x ^ y;
    default: FAIL("int op %d", op);
    }
}

static void ref_reduce(void *out, const void *a, const void *b, size_t n, tdist_dtype_t dt, tdist_redop_t op)
{
    const unsigned char *pa = a, *pb = b;
    unsigned char *po = out;
    for (size_t i = 0; i < n; i++) {
        switch (dt) {
        case TDIST_F32: {
            float x, y, r;
            memcpy(&x, pa + 4 * i, 4);
            memcpy(&y, pb + 4 * i, 4);
            r = (float)ref_float(x, y, op, 1);
            memcpy(po + 4 * i, &r, 4);
            break;
        }
        case TDIST_F64: {
            double x, y, r;
            memcpy(&x, pa + 8 * i, 8);
            memcpy(&y, pb + 8 * i, 8);
            r = ref_float(x, y, op, 0);
            memcpy(po + 8 * i, &r, 8);
            break;
        }
        case TDIST_F16:
        case TDIST_BF16: {
            uint16_t hx, hy, hr;
            memcpy(&hx, pa + 2 * i, 2);
            memcpy(&hy, pb + 2 * i, 2);
            int f16 = dt == TDIST_F16;
            float x = f16 ? tdist_f16_to_f32(hx) : tdist_bf16_to_f32(hx);
            float y = f16 ? tdist_f16_to_f32(hy) : tdist_bf16_to_f32(hy);
            float r = (float)ref_float(x, y, op, 1); /* computed in f32, rounded once */
            hr = f16 ? tdist_f32_to_f16(r) : tdist_f32_to_bf16(r);
            memcpy(po + 2 * i, &hr, 2);
            break;
        }
        case TDIST_I8: {
            int8_t x = (int8_t)pa[i], y = (int8_t)pb[i];
            po[i] = (unsigned char)(ref_int(x, y, op) & 0xff);
            break;
        }
        case TDIST_U8: po[i] = (unsigned char)(ref_int(pa[i], pb[i], op) & 0xff); break;
        case TDIST_I32: {
            int32_t x, y;
            memcpy(&x, pa + 4 * i, 4);
            memcpy(&y, pb + 4 * i, 4);
            uint32_t r = (uint32_t)(ref_int(x, y, op) & 0xffffffff);
            memcpy(po + 4 * i, &r, 4);
            break;
        }
        case TDIST_I64: {
            int64_t x, y;
            memcpy(&x, pa + 8 * i, 8);
            memcpy(&y, pb + 8 * i, 8);
            uint64_t r = (uint64_t)(ref_int(x, y, op) & (__int128)UINT64_MAX);
            memcpy(po + 8 * i, &r, 8);
            break;
        }
        default: FAIL("bad dtype");
        }
    }
}

static int elem_is_nan(const unsigned char *p, tdist_dtype_t dt)
{
    switch (dt) {
    case TDIST_F32: { float f; memcpy(&f, p, 4); return isnan(f); }
    case TDIST_F64: { double d; memcpy(&d, p, 8); return isnan(d); }
    case TDIST_F16: { uint16_t h; memcpy(&h, p, 2); return (h & 0x7fff) > 0x7c00; }
    case TDIST_BF16: { uint16_t h; memcpy(&h, p, 2); return (h & 0x7fff) > 0x7f80; }
    default: return 0;
    }
}

/* Bitwise equal, except that any NaN matches any NaN (payloads unspecified). */
static void expect_equal(const char *what, const void *got, const void *want, size_t n, tdist_dtype_t dt,
                         tdist_redop_t op)
{
    size_t es = tdist_dtype_size(dt);
    const unsigned char *g = got, *w = want;
    if (memcmp(g, w, n * es) == 0) return; /* the usual case, at one call's cost */
    for (size_t i = 0; i < n; i++) {
        if (memcmp(g + i * es, w + i * es, es) == 0) continue;
        if (elem_is_nan(g + i * es, dt) && elem_is_nan(w + i * es, dt)) continue;
        uint64_t gv = 0, wv = 0;
        memcpy(&gv, g + i * es, es);
        memcpy(&wv, w + i * es, es);
        FAIL("%s: %s %s isa %s, element %zu of %zu: got 0x%llx, want 0x%llx", what, tdist_dtype_name(dt),
             tdist_redop_name(op), tdist__isa_name(tdist__get_isa()), i, n, (unsigned long long)gv,
             (unsigned long long)wv);
    }
}

#define GUARD 64
#define GUARD_BYTE 0xa5

/* A buffer of n elements at byte offset off inside a block with guard bytes
 * on both sides, so an overrun shows even where ASan's redzone would not. */
typedef struct gbuf {
    unsigned char *block;
    unsigned char *p;
    size_t bytes;
} gbuf_t;

static gbuf_t gbuf_new(size_t bytes, size_t off)
{
    gbuf_t g;
    g.bytes = bytes;
    g.block = tbuf_alloc(bytes + 2 * GUARD + 16);
    ASSERT_TRUE(g.block != NULL);
    memset(g.block, GUARD_BYTE, bytes + 2 * GUARD + 16);
    g.p = g.block + GUARD + off;
    return g;
}

static void gbuf_check_free(gbuf_t *g, const char *what)
{
    size_t total = g->bytes + 2 * GUARD + 16;
    for (unsigned char *q = g->block; q < g->p; q++)
        if (*q != GUARD_BYTE) FAIL("%s: wrote %td bytes before the buffer", what, g->p - q);
    for (unsigned char *q = g->p + g->bytes; q < g->block + total; q++)
        if (*q != GUARD_BYTE) FAIL("%s: wrote past the end of the buffer (+%td)", what, q - (g->p + g->bytes));
    tbuf_free(g->block);
}

/* All aliasing and alignment forms of one (dtype, op, count). */
static void check_case(tdist_dtype_t dt, tdist_redop_t op, size_t n)
{
    size_t es = tdist_dtype_size(dt);
    size_t bytes = n * es;
    unsigned char *A = tbuf_alloc(bytes + 1), *B = tbuf_alloc(bytes + 1);
    unsigned char *R = tbuf_alloc(bytes + 1), *RS = tbuf_alloc(bytes + 1);
    ASSERT_TRUE(A && B && R && RS);
    gen(A, n, dt, 1);
    gen(B, n, dt, 1);
    ref_reduce(R, A, B, n, dt, op);
    ref_reduce(RS, A, A, n, dt, op); /* for a == b and dst == a == b */

    /* offsets: aligned, then all misaligned differently */
    static const size_t offs[][3] = {{0, 0, 0}, {1, 3, 5}, {0, 1, 0}, {2, 2, 2}};
    for (size_t k = 0; k < sizeof offs / sizeof offs[0]; k++) {
        if (k > 0 && es == 1) break;
        if (k > 1 && n > 100000) break; /* big counts: aligned and all-misaligned only */
        gbuf_t d = gbuf_new(bytes, offs[k][0]), a = gbuf_new(bytes, offs[k][1]), b = gbuf_new(bytes, offs[k][2]);
        char what[64];

        /* out of place; inputs untouched */
        memcpy(a.p, A, bytes);
        memcpy(b.p, B, bytes);
        snprintf(what, sizeof what, "out of place, offsets %zu/%zu/%zu", offs[k][0], offs[k][1], offs[k][2]);
        ASSERT_OK(tdist_reduce(d.p, a.p, b.p, n, dt, op));
        expect_equal(what, d.p, R, n, dt, op);
        ASSERT_MEMEQ(a.p, A, bytes);
        ASSERT_MEMEQ(b.p, B, bytes);

        /* dst == a */
        snprintf(what, sizeof what, "dst == a, offset %zu", offs[k][1]);
        ASSERT_OK(tdist_reduce(a.p, a.p, b.p, n, dt, op));
        expect_equal(what, a.p, R, n, dt, op);
        ASSERT_MEMEQ(b.p, B, bytes);

        /* dst == b */
        memcpy(a.p, A, bytes);
        snprintf(what, sizeof what, "dst == b, offset %zu", offs[k][2]);
        ASSERT_OK(tdist_reduce(b.p, a.p, b.p, n, dt, op));
        expect_equal(what, b.p, R, n, dt, op);
        ASSERT_MEMEQ(a.p, A, bytes);

        /* a == b, separate dst */
        snprintf(what, sizeof what, "a == b, offsets %zu/%zu", offs[k][0], offs[k][1]);
        ASSERT_OK(tdist_reduce(d.p, a.p, a.p, n, dt, op));
        expect_equal(what, d.p, RS, n, dt, op);

        /* dst == a == b */
        snprintf(what, sizeof what, "dst == a == b, offset %zu", offs[k][1]);
        ASSERT_OK(tdist_reduce(a.p, a.p, a.p, n, dt, op));
        expect_equal(what, a.p, RS, n, dt, op);

        gbuf_check_free(&d, "dst");
        gbuf_check_free(&a, "a");
        gbuf_check_free(&b, "b");
    }
    tbuf_free(A);
    tbuf_free(B);
    tbuf_free(R);
    tbuf_free(RS);
}

static int op_valid(tdist_redop_t op, tdist_dtype_t dt)
{
    return !((op == TDIST_BAND || op == TDIST_BOR || op == TDIST_BXOR) && tdist_dtype_is_float(dt));
}

/* Every dtype x op at the given counts on one instruction set. */
static void check_all_on(tdist__isa_t isa, const size_t *counts, size_t ncounts)
{
    if (isa > tdist__best_isa()) {
        SKIP("this CPU has no %s kernels (best: %s)", tdist__isa_name(isa),
             tdist__isa_name(tdist__best_isa()));
    }
    ASSERT_EQ(tdist__set_isa(isa), isa);
    ASSERT_EQ(tdist__get_isa(), isa);
    rng_state = 42 + (uint64_t)isa;
    for (size_t c = 0; c < ncounts; c++)
        for (int dt = 0; dt < TDIST_DTYPE_COUNT; dt++)
            for (int op = 0; op < TDIST_REDOP_COUNT; op++)
                if (op_valid((tdist_redop_t)op, (tdist_dtype_t)dt))
                    check_case((tdist_dtype_t)dt, (tdist_redop_t)op, counts[c]);
}

/* 1025 and 4099 cross the f16 chunk (1024) and bounce (8 KiB) edges. */
static const size_t small_counts[] = {0, 1, 7, 64, 1025, 4099};

TEST(core_reduce_every_dtype_op_generic, 120)
{
    check_all_on(TDIST__ISA_GENERIC, small_counts, NELEM(small_counts));
}

TEST(core_reduce_every_dtype_op_avx2, 120)
{
    check_all_on(TDIST__ISA_AVX2, small_counts, NELEM(small_counts));
}

TEST(core_reduce_every_dtype_op_avx512, 120)
{
    check_all_on(TDIST__ISA_AVX512, small_counts, NELEM(small_counts));
}

/* Out-of-place calls with non-temporal stores (normally only for dst
 * larger than the last-level cache): force them for every size. */
TEST(core_reduce_every_dtype_op_streaming, 120)
{
    tdist__reduce_set_nt_threshold(1);
    ASSERT_EQ(tdist__reduce_nt_threshold(), 1);
    for (int isa = 0; isa <= (int)tdist__best_isa(); isa++)
        check_all_on((tdist__isa_t)isa, small_counts, NELEM(small_counts));
    tdist__reduce_set_nt_threshold(0); /* off */
    ASSERT_EQ(tdist__reduce_nt_threshold(), SIZE_MAX);
}

/* The big count on the kernels the machine would really use. */
TEST(core_reduce_every_dtype_op_large, 300)
{
    static const size_t big[] = {1000003};
    check_all_on(tdist__best_isa(), big, 1);
}

/* ------------------------------------------------------ NaN and zeros */

TEST(core_reduce_min_max_nan_and_signed_zero, 30)
{
    /* MIN/MAX: NaN in either input propagates (like torch.minimum);
     * -0 < +0 whichever side it is on. */
    float a[] = {NAN, 1.0f, -0.0f, 0.0f, -INFINITY, 2.0f, NAN};
    float b[] = {1.0f, NAN, 0.0f, -0.0f, 3.0f, 2.0f, -NAN};
    float mn[7], mx[7];
    for (int isa = 0; isa <= (int)tdist__best_isa(); isa++) {
        tdist__set_isa((tdist__isa_t)isa);
        ASSERT_OK(tdist_reduce(mn, a, b, 7, TDIST_F32, TDIST_MIN));
        ASSERT_OK(tdist_reduce(mx, a, b, 7, TDIST_F32, TDIST_MAX));
        ASSERT_TRUE(isnan(mn[0]) && isnan(mn[1]) && isnan(mn[6]));
        ASSERT_TRUE(isnan(mx[0]) && isnan(mx[1]) && isnan(mx[6]));
        ASSERT_TRUE(mn[2] == 0 && signbit(mn[2]) && mn[3] == 0 && signbit(mn[3]));
        ASSERT_TRUE(mx[2] == 0 && !signbit(mx[2]) && mx[3] == 0 && !signbit(mx[3]));
        ASSERT_TRUE(mn[4] == -INFINITY && mx[4] == 3.0f && mn[5] == 2.0f && mx[5] == 2.0f);

        double da[] = {NAN, -0.0, 5.0}, db[] = {-1.0, 0.0, NAN}, dr[3];
        ASSERT_OK(tdist_reduce(dr, da, db, 3, TDIST_F64, TDIST_MIN));
        ASSERT_TRUE(isnan(dr[0]) && dr[1] == 0 && signbit(dr[1]) && isnan(dr[2]));
        ASSERT_OK(tdist_reduce(dr, db, da, 3, TDIST_F64, TDIST_MAX));
        ASSERT_TRUE(isnan(dr[0]) && dr[1] == 0 && !signbit(dr[1]) && isnan(dr[2]));

        uint16_t ha[] = {0x7e00, 0x8000, 0x3c00}, hb[] = {0x3c00, 0x0000, 0x7c01}, hr[3];
        ASSERT_OK(tdist_reduce(hr, ha, hb, 3, TDIST_F16, TDIST_MIN));
        ASSERT_TRUE((hr[0] & 0x7fff) > 0x7c00 && hr[1] == 0x8000 && (hr[2] & 0x7fff) > 0x7c00);
        ASSERT_OK(tdist_reduce(hr, hb, ha, 3, TDIST_F16, TDIST_MAX));
        ASSERT_TRUE((hr[0] & 0x7fff) > 0x7c00 && hr[1] == 0x0000 && (hr[2] & 0x7fff) > 0x7c00);
        uint16_t ba[] = {0x7fc0, 0x8000}, bb[] = {0x3f80, 0x0000}, br[2];
        ASSERT_OK(tdist_reduce(br, bb, ba, 2, TDIST_BF16, TDIST_MIN));
        ASSERT_TRUE((br[0] & 0x7fff) > 0x7f80 && br[1] == 0x8000);
    }
    tdist__set_isa(tdist__best_isa());
}

TEST(core_reduce_half_rounds_once, 30)
{
    /* f16: 2048 + 1 is a tie between 2048 and 2050: ties to even -> 2048;
     * 2050 + 1 -> 2052. Computed in f32 (exact), rounded once. */
    uint16_t a[] = {tdist_f32_to_f16(2048.0f), tdist_f32_to_f16(2050.0f), 0x7bff, 0x0001};
    uint16_t b[] = {tdist_f32_to_f16(1.0f), tdist_f32_to_f16(1.0f), 0x7bff, 0x0001};
    uint16_t r[4];
    ASSERT_OK(tdist_reduce(r, a, b, 4, TDIST_F16, TDIST_SUM));
    ASSERT_TRUE(tdist_f16_to_f32(r[0]) == 2048.0f);
    ASSERT_TRUE(tdist_f16_to_f32(r[1]) == 2052.0f);
    ASSERT_EQ(r[2], 0x7c00); /* 65504 + 65504 overflows to inf */
    ASSERT_EQ(r[3], 0x0002); /* subnormals add exactly */
    /* integers wrap */
    int8_t i8a[] = {127, -128}, i8b[] = {1, -1}, i8r[2];
    ASSERT_OK(tdist_reduce(i8r, i8a, i8b, 2, TDIST_I8, TDIST_SUM));
    ASSERT_EQ(i8r[0], -128);
    ASSERT_EQ(i8r[1], 127);
    int64_t i64a[] = {INT64_MAX, INT64_MIN}, i64b[] = {2, -1}, i64r[2];
    ASSERT_OK(tdist_reduce(i64r, i64a, i64b, 2, TDIST_I64, TDIST_PROD));
    ASSERT_EQ(i64r[0], -2);
    ASSERT_EQ(i64r[1], INT64_MIN);
}

/* -------------------------------------------------------- identities */

TEST(core_reduce_fill_identity, 30)
{
    for (int dt = 0; dt < TDIST_DTYPE_COUNT; dt++) {
        for (int op = 0; op < TDIST_REDOP_COUNT; op++) {
            tdist_dtype_t d = (tdist_dtype_t)dt;
            tdist_redop_t o = (tdist_redop_t)op;
            size_t es = tdist_dtype_size(d), n = 13;
            unsigned char buf[13 * 8 + 8];
            if (!op_valid(o, d)) {
                ASSERT_STATUS(tdist_fill_identity(buf, n, d, o), TDIST_ERR_INVALID_ARG);
                ASSERT_CONTAINS(tdist_last_error(), "integer dtypes only");
                continue;
            }
            /* the expected element, written out by hand */
            unsigned char want[8] = {0};
            int kind = op == TDIST_PROD ? 1 : op == TDIST_MIN ? 2 : op == TDIST_MAX ? 3 : op == TDIST_BAND ? 4 : 0;
            switch (d) {
            case TDIST_F32: { float v = kind == 1 ? 1.0f : kind == 2 ? INFINITY : kind == 3 ? -INFINITY : 0.0f; memcpy(want, &v, 4); break; }
            case TDIST_F64: { double v = kind == 1 ? 1.0 : kind == 2 ? INFINITY : kind == 3 ? -INFINITY : 0.0; memcpy(want, &v, 8); break; }
            case TDIST_F16: { uint16_t v = kind == 1 ? 0x3c00 : kind == 2 ? 0x7c00 : kind == 3 ? 0xfc00 : 0; memcpy(want, &v, 2); break; }
            case TDIST_BF16: { uint16_t v = kind == 1 ? 0x3f80 : kind == 2 ? 0x7f80 : kind == 3 ? 0xff80 : 0; memcpy(want, &v, 2); break; }
            case TDIST_I8: { int8_t v = kind == 1 ? 1 : kind == 2 ? 127 : kind == 3 ? -128 : kind == 4 ? -1 : 0; memcpy(want, &v, 1); break; }
            case TDIST_U8: { uint8_t v = kind == 1 ? 1 : kind == 2 ? 255 : kind == 3 ? 0 : kind == 4 ? 255 : 0; memcpy(want, &v, 1); break; }
            case TDIST_I32: { int32_t v = kind == 1 ? 1 : kind == 2 ? INT32_MAX : kind == 3 ? INT32_MIN : kind == 4 ? -1 : 0; memcpy(want, &v, 4); break; }
            case TDIST_I64: { int64_t v = kind == 1 ? 1 : kind == 2 ? INT64_MAX : kind == 3 ? INT64_MIN : kind == 4 ? -1 : 0; memcpy(want, &v, 8); break; }
            default: FAIL("dtype");
            }
            for (size_t off = 0; off < 2; off++) { /* aligned and unaligned */
                memset(buf, 0x5a, sizeof buf);
                ASSERT_OK(tdist_fill_identity(buf + off, n, d, o));
                for (size_t i = 0; i < n; i++)
                    if (memcmp(buf + off + i * es, want, es) != 0)
                        FAIL("identity %s %s element %zu wrong", tdist_dtype_name(d), tdist_redop_name(o), i);
                if (buf[off + n * es] != 0x5a) FAIL("identity %s %s wrote past the end", tdist_dtype_name(d), tdist_redop_name(o));
            }
            /* and it is the identity: id op x == x (numerically; NaN stays NaN) */
            unsigned char x[64 * 8], r[64 * 8];
            rng_state = 7;
            gen(x, 64, d, 1);
            ASSERT_OK(tdist_fill_identity(buf, 13, d, o));
            unsigned char id[64 * 8];
            for (size_t i = 0; i < 64; i++) memcpy(id + i * es, buf, es);
            ASSERT_OK(tdist_reduce(r, id, x, 64, d, o));
            for (size_t i = 0; i < 64; i++) {
                if (memcmp(r + i * es, x + i * es, es) == 0) continue;
                if (elem_is_nan(r + i * es, d) && elem_is_nan(x + i * es, d)) continue;
                /* +0 + -0 = +0: equal as numbers */
                int zero_ok = 0;
                if (d == TDIST_F32 || d == TDIST_F64 || d == TDIST_F16 || d == TDIST_BF16) {
                    uint64_t rv = 0, xv = 0;
                    memcpy(&rv, r + i * es, es);
                    memcpy(&xv, x + i * es, es);
                    uint64_t sign = 1ull << (8 * es - 1);
                    zero_ok = (rv & ~sign) == 0 && (xv & ~sign) == 0;
                }
                if (!zero_ok) FAIL("identity of %s %s changed element %zu", tdist_dtype_name(d), tdist_redop_name(o), i);
            }
        }
    }
    ASSERT_OK(tdist_fill_identity(NULL, 0, TDIST_F32, TDIST_SUM));
    ASSERT_STATUS(tdist_fill_identity(NULL, 3, TDIST_F32, TDIST_SUM), TDIST_ERR_INVALID_ARG);
    ASSERT_STATUS(tdist_fill_identity(NULL, 3, (tdist_dtype_t)77, TDIST_SUM), TDIST_ERR_INVALID_ARG);
}

/* ------------------------------------------------- scale and divide */

TEST(core_reduce_scale_and_divide, 60)
{
    enum { N = 3001 };
    static float f[N], f0[N];
    static double d[N], d0[N];
    static uint16_t h[N], h0[N];
    for (int isa = 0; isa <= (int)tdist__best_isa(); isa++) {
        tdist__set_isa((tdist__isa_t)isa);
        rng_state = 99;
        gen(f0, N, TDIST_F32, 1);
        gen(d0, N, TDIST_F64, 1);
        /* scale by factors exact in f32: one correctly rounded product */
        static const double factors[] = {0.5, 3.0, -0.125, 0.1f, 1.0 / 1024};
        for (size_t k = 0; k < NELEM(factors); k++) {
            memcpy(f, f0, sizeof f);
            ASSERT_OK(tdist_scale(f, N, TDIST_F32, factors[k]));
            for (int i = 0; i < N; i++) {
                float want = f0[i] * (float)factors[k];
                if (!(f[i] == want && signbit(f[i]) == signbit(want)) && !(isnan(f[i]) && isnan(want)))
                    FAIL("scale f32 %a by %a: got %a want %a", (double)f0[i], factors[k], (double)f[i], (double)want);
            }
            memcpy(d, d0, sizeof d);
            ASSERT_OK(tdist_scale(d, N, TDIST_F64, factors[k]));
            for (int i = 0; i < N; i++) {
                double want = d0[i] * factors[k];
                if (!(d[i] == want) && !(isnan(d[i]) && isnan(want))) FAIL("scale f64 element %d", i);
            }
            for (int bf = 0; bf < 2; bf++) {
                tdist_dtype_t dt = bf ? TDIST_BF16 : TDIST_F16;
                gen(h0, N, dt, 1);
                memcpy(h, h0, sizeof h);
                ASSERT_OK(tdist_scale(h, N, dt, factors[k]));
                for (int i = 0; i < N; i++) {
                    float x = bf ? tdist_bf16_to_f32(h0[i]) : tdist_f16_to_f32(h0[i]);
                    float y = x * (float)factors[k];
                    uint16_t want = bf ? tdist_f32_to_bf16(y) : tdist_f32_to_f16(y);
                    if (h[i] != want && !(elem_is_nan((unsigned char *)&h[i], dt) && isnan(y)))
                        FAIL("scale %s 0x%04x by %a: got 0x%04x want 0x%04x", tdist_dtype_name(dt), h0[i],
                             factors[k], h[i], want);
                }
            }
        }
        /* divide: correctly rounded quotients (reference: long double) */
        static const int64_t divs[] = {1, 2, 3, 7, 1000};
        for (size_t k = 0; k < NELEM(divs); k++) {
            memcpy(f, f0, sizeof f);
            ASSERT_OK(tdist_divide(f, N, TDIST_F32, divs[k]));
            for (int i = 0; i < N; i++) {
                float want = (float)((long double)f0[i] / divs[k]);
                if (!(f[i] == want && signbit(f[i]) == signbit(want)) && !(isnan(f[i]) && isnan(want)))
                    FAIL("divide f32 %a by %lld: got %a want %a", (double)f0[i], (long long)divs[k], (double)f[i],
                         (double)want);
            }
            memcpy(d, d0, sizeof d);
            ASSERT_OK(tdist_divide(d, N, TDIST_F64, divs[k]));
            for (int i = 0; i < N; i++) {
                double want = d0[i] / (double)divs[k];
                if (!(d[i] == want) && !(isnan(d[i]) && isnan(want))) FAIL("divide f64 element %d", i);
            }
            for (int bf = 0; bf < 2; bf++) {
                tdist_dtype_t dt = bf ? TDIST_BF16 : TDIST_F16;
                gen(h0, N, dt, 1);
                memcpy(h, h0, sizeof h);
                ASSERT_OK(tdist_divide(h, N, dt, divs[k]));
                for (int i = 0; i < N; i++) {
                    float x = bf ? tdist_bf16_to_f32(h0[i]) : tdist_f16_to_f32(h0[i]);
                    float y = (float)((long double)x / divs[k]);
                    uint16_t want = bf ? tdist_f32_to_bf16(y) : tdist_f32_to_f16(y);
                    if (h[i] != want && !(elem_is_nan((unsigned char *)&h[i], dt) && isnan(y)))
                        FAIL("divide %s 0x%04x by %lld: got 0x%04x want 0x%04x", tdist_dtype_name(dt), h0[i],
                             (long long)divs[k], h[i], want);
                }
            }
        }
    }
    tdist__set_isa(tdist__best_isa());

    /* integers: truncation toward zero, every integer dtype, unaligned too */
    int8_t i8[] = {-7, 7, -128, 127, 0, -1};
    ASSERT_OK(tdist_divide(i8, 6, TDIST_I8, 2));
    int8_t i8w[] = {-3, 3, -64, 63, 0, 0};
    ASSERT_MEMEQ(i8, i8w, sizeof i8);
    uint8_t u8[] = {255, 7, 1};
    ASSERT_OK(tdist_divide(u8, 3, TDIST_U8, 2));
    ASSERT_TRUE(u8[0] == 127 && u8[1] == 3 && u8[2] == 0);
    ASSERT_OK(tdist_divide(u8, 3, TDIST_U8, 1000)); /* divisor beyond the type */
    ASSERT_TRUE(u8[0] == 0 && u8[1] == 0);
    unsigned char raw[8 * 4 + 1];
    int64_t i64[] = {INT64_MIN, INT64_MAX, -9, 9};
    memcpy(raw + 1, i64, sizeof i64);
    ASSERT_OK(tdist_divide(raw + 1, 4, TDIST_I64, 4));
    memcpy(i64, raw + 1, sizeof i64);
    ASSERT_TRUE(i64[0] == INT64_MIN / 4 && i64[1] == INT64_MAX / 4 && i64[2] == -2 && i64[3] == 2);
    int32_t i32[] = {-2000000001, 5, -5};
    ASSERT_OK(tdist_divide(i32, 3, TDIST_I32, 3));
    ASSERT_TRUE(i32[0] == -666666667 && i32[1] == 1 && i32[2] == -1);
    /* unaligned f32 */
    float one[3] = {1.0f, 2.0f, 3.0f};
    memcpy(raw + 1, one, sizeof one);
    ASSERT_OK(tdist_divide(raw + 1, 3, TDIST_F32, 4));
    ASSERT_OK(tdist_scale(raw + 1, 3, TDIST_F32, 8.0));
    memcpy(one, raw + 1, sizeof one);
    ASSERT_TRUE(one[0] == 2.0f && one[1] == 4.0f && one[2] == 6.0f);

    /* errors */
    ASSERT_STATUS(tdist_scale(i32, 3, TDIST_I32, 0.5), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "floating dtypes only, got i32");
    ASSERT_STATUS(tdist_divide(f, 3, TDIST_F32, 0), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "divisor must be > 0");
    ASSERT_STATUS(tdist_divide(f, 3, TDIST_F32, -2), TDIST_ERR_INVALID_ARG);
    ASSERT_STATUS(tdist_scale(NULL, 3, TDIST_F32, 2.0), TDIST_ERR_INVALID_ARG);
    ASSERT_STATUS(tdist_divide(NULL, 3, TDIST_I32, 2), TDIST_ERR_INVALID_ARG);
    ASSERT_STATUS(tdist_scale(f, 3, (tdist_dtype_t)-1, 2.0), TDIST_ERR_INVALID_ARG);
    ASSERT_STATUS(tdist_divide(f, 3, (tdist_dtype_t)9, 2), TDIST_ERR_INVALID_ARG);
    ASSERT_STATUS(tdist_scale(f, SIZE_MAX, TDIST_F32, 2.0), TDIST_ERR_INVALID_ARG);
    ASSERT_OK(tdist_scale(NULL, 0, TDIST_F32, 2.0));
    ASSERT_OK(tdist_divide(NULL, 0, TDIST_I8, 2));
}

/* ------------------------------------------------------------ bad args */

TEST(core_reduce_bad_args, 30)
{
    float a[16] = {0}, b[16] = {0}, d[16] = {0};
    /* count 0 works, with or without buffers */
    ASSERT_OK(tdist_reduce(NULL, NULL, NULL, 0, TDIST_F32, TDIST_SUM));
    ASSERT_OK(tdist_reduce(d, a, b, 0, TDIST_I8, TDIST_BXOR));
    /* NULL with count > 0 */
    ASSERT_STATUS(tdist_reduce(NULL, a, b, 4, TDIST_F32, TDIST_SUM), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "NULL buffer");
    ASSERT_STATUS(tdist_reduce(d, NULL, b, 4, TDIST_F32, TDIST_SUM), TDIST_ERR_INVALID_ARG);
    ASSERT_STATUS(tdist_reduce(d, a, NULL, 4, TDIST_F32, TDIST_SUM), TDIST_ERR_INVALID_ARG);
    /* invalid dtype and op */
    int bad_dt[] = {-1, TDIST_DTYPE_COUNT, 1000};
    for (size_t i = 0; i < NELEM(bad_dt); i++) {
        ASSERT_STATUS(tdist_reduce(d, a, b, 4, (tdist_dtype_t)bad_dt[i], TDIST_SUM), TDIST_ERR_INVALID_ARG);
        ASSERT_CONTAINS(tdist_last_error(), "invalid dtype");
    }
    int bad_op[] = {-1, TDIST_REDOP_COUNT, 1000};
    for (size_t i = 0; i < NELEM(bad_op); i++) {
        ASSERT_STATUS(tdist_reduce(d, a, b, 4, TDIST_F32, (tdist_redop_t)bad_op[i]), TDIST_ERR_INVALID_ARG);
        ASSERT_CONTAINS(tdist_last_error(), "invalid reduce op");
    }
    /* bitwise on floats: a clear error, buffers untouched */
    tdist_dtype_t fl[] = {TDIST_F32, TDIST_F64, TDIST_F16, TDIST_BF16};
    tdist_redop_t bw[] = {TDIST_BAND, TDIST_BOR, TDIST_BXOR};
    for (size_t i = 0; i < 4; i++)
        for (size_t j = 0; j < 3; j++) {
            d[0] = 42.0f;
            ASSERT_STATUS(tdist_reduce(d, a, b, 2, fl[i], bw[j]), TDIST_ERR_INVALID_ARG);
            char want[128];
            snprintf(want, sizeof want, "reduce op %s is defined for integer dtypes only, got %s",
                     tdist_redop_name(bw[j]), tdist_dtype_name(fl[i]));
            ASSERT_STREQ(tdist_last_error(), want);
            ASSERT_TRUE(d[0] == 42.0f);
        }
    /* a count whose byte size overflows */
    ASSERT_STATUS(tdist_reduce(d, a, b, SIZE_MAX, TDIST_F32, TDIST_SUM), TDIST_ERR_INVALID_ARG);
    ASSERT_STATUS(tdist_reduce(d, a, b, SIZE_MAX / 2, TDIST_I64, TDIST_SUM), TDIST_ERR_INVALID_ARG);
    /* partial overlap of dst with an input */
    ASSERT_STATUS(tdist_reduce(a + 1, a, b, 8, TDIST_F32, TDIST_SUM), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "overlaps");
    ASSERT_STATUS(tdist_reduce(b, a, b + 2, 8, TDIST_F32, TDIST_SUM), TDIST_ERR_INVALID_ARG);
    /* a and b may overlap each other (both only read) */
    ASSERT_OK(tdist_reduce(d, a, a + 1, 8, TDIST_F32, TDIST_SUM));
}

/* TDIST_KERNELS picks the kernels when the process first uses them. */
TEST(core_reduce_kernels_env, 10)
{
    setenv("TDIST_KERNELS", "generic", 1);
    ASSERT_EQ(tdist__get_isa(), TDIST__ISA_GENERIC);
    float a[3] = {1, 2, 3}, b[3] = {4, 5, 6}, d[3];
    ASSERT_OK(tdist_reduce(d, a, b, 3, TDIST_F32, TDIST_SUM));
    ASSERT_TRUE(d[0] == 5 && d[1] == 7 && d[2] == 9);
    ASSERT_EQ(tdist__set_isa(TDIST__ISA_COUNT), tdist__best_isa()); /* out of range: capped */
    ASSERT_STREQ(tdist__isa_name(TDIST__ISA_AVX2), "avx2");
}
