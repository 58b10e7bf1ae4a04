/*
 * tests/core/test_half.c — f16 / bf16 <-> f32 conversion, checked
 * exhaustively over all 65,536 bit patterns against references computed
 * here by other methods:
 *   - half -> f32: ldexp() arithmetic on the decoded fields;
 *   - f32 -> half: every half value round-trips; for every adjacent pair of
 *     halves the exact midpoint (ties to even), midpoint +/- 1 f32 ulp; a
 *     binary search over the sorted halves (nearest, ties to even) for
 *     random floats; values near overflow and underflow; NaN payloads;
 *   - GCC's _Float16 (libgcc soft conversion) as a third opinion.
 * Every available kernel instruction set (portable, AVX2+F16C, AVX-512) must
 * give the same bits through the bulk functions.
 */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

#include "core/kernels.h"
#include "harness.h"

static uint32_t bits_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float float_of(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* ---------------------------------------------------------- references */

/* Format description: exponent bits, mantissa bits. */
typedef struct fmt {
    const char *name;
    int ebits, mbits;
    uint16_t (*to)(float);
    float (*from)(uint16_t);
    void (*to_n)(uint16_t *, const float *, size_t);
    void (*from_n)(float *, const uint16_t *, size_t);
} fmt_t;

static const fmt_t F16 = {"f16", 5, 10, tdist_f32_to_f16, tdist_f16_to_f32, tdist_f32_to_f16_n,
                          tdist_f16_to_f32_n};
static const fmt_t BF16 = {"bf16", 8, 7, tdist_f32_to_bf16, tdist_bf16_to_f32, tdist_f32_to_bf16_n,
                           tdist_bf16_to_f32_n};

static int is_nan_pattern(const fmt_t *f, uint16_t h)
{
    int emax = (1 << f->ebits) - 1;
    int e = (h >> f->mbits) & emax;
    return e == emax && (h & ((1u << f->mbits) - 1)) != 0;
}

/* Value of a non-NaN half pattern by ldexp (inf for the all-ones exponent). */
static double ref_value(const fmt_t *f, uint16_t h)
{
    int emax = (1 << f->ebits) - 1;
    int bias = emax / 2;
    int sign = (h >> 15) & 1;
    int e = (h >> f->mbits) & emax;
    int m = h & ((1 << f->mbits) - 1);
    double v;
    if (e == emax) v = INFINITY;
    else if (e == 0) v = ldexp((double)m, 1 - bias - f->mbits);
    else v = ldexp((double)((1 << f->mbits) + m), e - bias - f->mbits);
    return sign ? -v : v;
}

/* Magnitude of pattern k (0 <= k <= inf pattern), where the infinity
 * pattern stands for the next power of two above the largest finite value
 * (the value rounding must use to decide overflow). */
static double ref_mag_ext(const fmt_t *f, uint16_t k)
{
    int emax = (1 << f->ebits) - 1;
    uint16_t inf = (uint16_t)(emax << f->mbits);
    if (k == inf) return ldexp(1.0, emax - emax / 2);
    return ref_value(f, k);
}

/* f32 -> half by search: the largest pattern whose value <= |x|, then
 * nearest with ties to even. Finite, non-NaN x only. */
static uint16_t ref_round(const fmt_t *f, float x)
{
    int emax = (1 << f->ebits) - 1;
    uint16_t inf = (uint16_t)(emax << f->mbits);
    uint16_t sign = signbit(x) ? 0x8000 : 0;
    double a = fabs((double)x);
    if (a >= ref_mag_ext(f, inf)) return sign | inf;
    uint16_t lo = 0, hi = inf; /* value(lo) <= a < value(hi) */
    while (hi - lo > 1) {
        uint16_t mid = (uint16_t)((lo + hi) / 2);
        if (ref_mag_ext(f, mid) <= a) lo = mid;
        else hi = mid;
    }
    double dl = a - ref_mag_ext(f, lo), dh = ref_mag_ext(f, hi) - a;
    uint16_t r = dl < dh ? lo : dh < dl ? hi : (lo & 1) ? hi : lo;
    return sign | r;
}

/* Every bulk path on every instruction set must agree with the scalar. */
static void check_bulk_agrees(const fmt_t *f)
{
    uint16_t *hs = malloc(65536 * sizeof *hs), *back = malloc(65536 * sizeof *back);
    float *fs = malloc(65536 * sizeof *fs), *fs2 = malloc(65536 * sizeof *fs2);
    ASSERT_TRUE(hs && back && fs && fs2);
    for (uint32_t i = 0; i < 65536; i++) {
        hs[i] = (uint16_t)i;
        fs2[i] = f->from((uint16_t)i);
    }
    tdist__isa_t best = tdist__best_isa();
    for (int isa = 0; isa <= (int)best; isa++) {
        ASSERT_EQ(tdist__set_isa((tdist__isa_t)isa), isa);
        /* odd n and an offset start exercise the vector tails */
        memset(fs, 0, 65536 * sizeof *fs);
        f->from_n(fs + 1, hs + 1, 65535);
        f->from_n(fs, hs, 1);
        for (uint32_t i = 0; i < 65536; i++)
            if (bits_of(fs[i]) != bits_of(fs2[i]))
                FAIL("%s isa %s: bulk to f32 of 0x%04x gave 0x%08x, scalar 0x%08x", f->name,
                     tdist__isa_name((tdist__isa_t)isa), i, bits_of(fs[i]), bits_of(fs2[i]));
        /* f32 -> half on three input sets: exact values, exact ties (the
         * bit below the half's last bit set), random bit patterns */
        for (int set = 0; set < 3; set++) {
            uint64_t rs = 77;
            for (uint32_t i = 0; i < 65536; i++) {
                uint32_t u = bits_of(fs2[i]);
                if (set == 1) u += 1u << (22 - f->mbits);
                if (set == 2) {
                    rs = rs * 6364136223846793005ull + 1442695040888963407ull;
                    u = (uint32_t)(rs >> 32);
                }
                fs[i] = float_of(u);
            }
            f->to_n(back, fs, 65533);
            f->to_n(back + 65533, fs + 65533, 3);
            for (uint32_t i = 0; i < 65536; i++)
                if (back[i] != f->to(fs[i]))
                    FAIL("%s isa %s: bulk from f32 0x%08x gave 0x%04x, scalar 0x%04x", f->name,
                         tdist__isa_name((tdist__isa_t)isa), bits_of(fs[i]), back[i], f->to(fs[i]));
        }
    }
    tdist__set_isa(best);
    free(hs);
    free(back);
    free(fs);
    free(fs2);
}

/* half -> f32 over all 65,536 patterns against ldexp. */
static void check_to_f32_exhaustive(const fmt_t *f)
{
    int shift = 23 - f->mbits;
    for (uint32_t i = 0; i < 65536; i++) {
        uint16_t h = (uint16_t)i;
        float got = f->from(h);
        if (is_nan_pattern(f, h)) {
            /* quiet NaN, sign and payload kept */
            uint32_t want = ((uint32_t)(h & 0x8000) << 16) | 0x7fc00000u |
                            ((uint32_t)(h & ((1u << f->mbits) - 1)) << shift);
            if (!isnan(got) || bits_of(got) != want)
                FAIL("%s 0x%04x -> 0x%08x, want quiet NaN 0x%08x", f->name, h, bits_of(got), want);
            continue;
        }
        double want = ref_value(f, h);
        if ((double)got != want || !signbit(got) != !signbit(want))
            FAIL("%s 0x%04x -> %a, want %a", f->name, h, (double)got, want);
    }
}

/* f32 -> half: round trips, midpoints, +/- 1 ulp, both signs. */
static void check_from_f32_exhaustive(const fmt_t *f)
{
    int emax = (1 << f->ebits) - 1;
    uint16_t inf = (uint16_t)(emax << f->mbits);
    long checked = 0;
    for (uint32_t i = 0; i < 65536; i++) {
        uint16_t h = (uint16_t)i;
        if (is_nan_pattern(f, h)) continue;
        /* every value round-trips (including +-0 and +-inf) */
        float v = (float)ref_value(f, h);
        ASSERT_EQ(f->to(v), h);
        uint16_t mag = h & 0x7fff;
        if (mag >= inf) continue;
        /* the pair (mag, mag+1); mag+1 == inf stands for 2^(emax-bias) */
        uint16_t sign = h & 0x8000;
        double lo = ref_mag_ext(f, mag), hi = ref_mag_ext(f, (uint16_t)(mag + 1));
        double mid = (lo + hi) / 2; /* exact: one more bit than the half has */
        float fm = (float)mid;
        if ((double)fm != mid) FAIL("%s: midpoint %a not exact in f32", f->name, mid);
        if (sign) fm = -fm;
        uint16_t even = (mag & 1) ? (uint16_t)(mag + 1) : mag;
        uint16_t got = f->to(fm);
        if (got != (sign | even))
            FAIL("%s: midpoint %a of 0x%04x/0x%04x -> 0x%04x, want 0x%04x (ties to even)", f->name,
                 (double)fm, sign | mag, sign | (mag + 1), got, sign | even);
        float above = nextafterf(fm, sign ? -INFINITY : INFINITY);
        float below = nextafterf(fm, 0.0f);
        got = f->to(above);
        if (got != (sign | (uint16_t)(mag + 1)))
            FAIL("%s: midpoint+ulp %a -> 0x%04x, want 0x%04x", f->name, (double)above, got, sign | (mag + 1));
        got = f->to(below);
        if (got != (sign | mag))
            FAIL("%s: midpoint-ulp %a -> 0x%04x, want 0x%04x", f->name, (double)below, got, sign | mag);
        /* the search reference agrees on these three as well */
        ASSERT_EQ(ref_round(f, fm), sign | even);
        checked++;
    }
    ASSERT_EQ(checked, 2 * (long)inf);
}

/* Random floats (all exponents) against the search reference, and NaNs. */
static void check_random(const fmt_t *f, long n)
{
    uint64_t s = 0x9e3779b97f4a7c15ull;
    for (long i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        uint32_t u = (uint32_t)(s >> 32);
        float x = float_of(u);
        uint16_t got = f->to(x);
        if (isnan(x)) {
            uint16_t want = (uint16_t)(((u >> 16) & 0x8000) | (0x7fffu & ~((1u << f->mbits) - 1)) |
                                       (1u << (f->mbits - 1)) | ((u & 0x7fffff) >> (23 - f->mbits)));
            if (got != want) FAIL("%s: NaN 0x%08x -> 0x%04x, want 0x%04x", f->name, u, got, want);
            continue;
        }
        uint16_t want = ref_round(f, x);
        if (got != want) FAIL("%s: %a (0x%08x) -> 0x%04x, want 0x%04x", f->name, (double)x, u, got, want);
    }
}

TEST(core_half_f16_to_f32_exhaustive, 60)
{
    check_to_f32_exhaustive(&F16);
    /* spot values a reader can check by eye */
    ASSERT_TRUE(tdist_f16_to_f32(0x3c00) == 1.0f);
    ASSERT_TRUE(tdist_f16_to_f32(0xc000) == -2.0f);
    ASSERT_TRUE(tdist_f16_to_f32(0x7bff) == 65504.0f);
    ASSERT_TRUE(tdist_f16_to_f32(0x0001) == 0x1p-24f);
    ASSERT_TRUE(tdist_f16_to_f32(0x0400) == 0x1p-14f);
    ASSERT_EQ(bits_of(tdist_f16_to_f32(0x8000)), 0x80000000u);
    ASSERT_TRUE(isinf(tdist_f16_to_f32(0xfc00)) && tdist_f16_to_f32(0xfc00) < 0);
    /* a signalling NaN comes back quiet with its payload */
    ASSERT_EQ(bits_of(tdist_f16_to_f32(0x7c01)), 0x7fc02000u);
}

TEST(core_half_f32_to_f16_exhaustive, 120)
{
    check_from_f32_exhaustive(&F16);
    check_random(&F16, 200000);
    /* near overflow: 65504 is the largest finite, 65520 the tie to inf */
    ASSERT_EQ(tdist_f32_to_f16(65504.0f), 0x7bff);
    ASSERT_EQ(tdist_f32_to_f16(nextafterf(65520.0f, 0.0f)), 0x7bff);
    ASSERT_EQ(tdist_f32_to_f16(65520.0f), 0x7c00);
    ASSERT_EQ(tdist_f32_to_f16(-65520.0f), 0xfc00);
    ASSERT_EQ(tdist_f32_to_f16(FLT_MAX), 0x7c00);
    ASSERT_EQ(tdist_f32_to_f16(-INFINITY), 0xfc00);
    /* near underflow: 2^-25 is the tie between 0 and the smallest subnormal */
    ASSERT_EQ(tdist_f32_to_f16(0x1p-25f), 0x0000);
    ASSERT_EQ(tdist_f32_to_f16(nextafterf(0x1p-25f, 1.0f)), 0x0001);
    ASSERT_EQ(tdist_f32_to_f16(0x1.8p-24f), 0x0002); /* 1.5 units: tie to even 2 */
    ASSERT_EQ(tdist_f32_to_f16(0x1p-26f), 0x0000);
    ASSERT_EQ(tdist_f32_to_f16(-0x1p-149f), 0x8000); /* signed zero kept */
    ASSERT_EQ(tdist_f32_to_f16(-0.0f), 0x8000);
    ASSERT_EQ(tdist_f32_to_f16(nextafterf(0x1p-14f, 0.0f)), 0x0400); /* rounds up into normal */
    /* NaN stays NaN, quiet, sign and top payload kept */
    ASSERT_EQ(tdist_f32_to_f16(float_of(0x7f800001u)), 0x7e00);
    ASSERT_EQ(tdist_f32_to_f16(float_of(0xffa00000u)), 0xff00);
    ASSERT_EQ(tdist_f32_to_f16(NAN) & 0x7e00, 0x7e00);
}

TEST(core_half_bf16_exhaustive, 120)
{
    check_to_f32_exhaustive(&BF16);
    check_from_f32_exhaustive(&BF16);
    check_random(&BF16, 200000);
    ASSERT_EQ(tdist_f32_to_bf16(1.0f), 0x3f80);
    ASSERT_EQ(tdist_f32_to_bf16(float_of(0x3f808000u)), 0x3f80); /* tie, even stays */
    ASSERT_EQ(tdist_f32_to_bf16(float_of(0x3f818000u)), 0x3f82); /* tie, odd rounds up */
    ASSERT_EQ(tdist_f32_to_bf16(float_of(0x3f808001u)), 0x3f81);
    ASSERT_EQ(tdist_f32_to_bf16(FLT_MAX), 0x7f80);                /* overflow to inf */
    ASSERT_EQ(tdist_f32_to_bf16(float_of(0x7f7f7fffu)), 0x7f7f);
    ASSERT_EQ(tdist_f32_to_bf16(0x1p-149f), 0x0000);              /* f32 subnormal tie -> 0 */
    ASSERT_EQ(tdist_f32_to_bf16(float_of(0x00008001u)), 0x0001);  /* bf16 subnormal, exact */
    ASSERT_EQ(tdist_f32_to_bf16(-0.0f), 0x8000);
    ASSERT_EQ(tdist_f32_to_bf16(float_of(0x7f800001u)), 0x7fc0);  /* sNaN -> qNaN */
    ASSERT_EQ(tdist_f32_to_bf16(float_of(0xff812345u)), 0xffc1);
    ASSERT_EQ(bits_of(tdist_bf16_to_f32(0x7f81)), 0x7fc10000u);
}

/* The bulk functions on every instruction set give the scalar's bits. */
TEST(core_half_bulk_every_isa, 60)
{
    check_bulk_agrees(&F16);
    check_bulk_agrees(&BF16);
    /* n == 0 and NULL buffers are ignored, never dereferenced */
    tdist_f32_to_f16_n(NULL, NULL, 0);
    tdist_f16_to_f32_n(NULL, NULL, 5);
    tdist_f32_to_bf16_n(NULL, NULL, 5);
    tdist_bf16_to_f32_n(NULL, NULL, 0);
}

/* _Float16 (GCC 12 on x86-64: libgcc soft conversions) as a third reference. */
TEST(core_half_matches_float16_type, 60)
{
#if defined(__FLT16_MAX__)
    for (uint32_t i = 0; i < 65536; i++) {
        uint16_t h = (uint16_t)i;
        if (is_nan_pattern(&F16, h)) continue;
        _Float16 v;
        memcpy(&v, &h, 2);
        float want = (float)v;
        ASSERT_EQ(bits_of(tdist_f16_to_f32(h)), bits_of(want));
    }
    uint64_t s = 12345;
    for (int i = 0; i < 300000; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        /* mostly in and around the f16 range, sometimes anything */
        uint32_t u = (uint32_t)(s >> 32);
        if (i % 4) u = (u & 0x807fffffu) | ((uint32_t)(100 + (s >> 20) % 45) << 23);
        float x = float_of(u);
        if (isnan(x)) continue;
        _Float16 r = (_Float16)x;
        uint16_t want;
        memcpy(&want, &r, 2);
        if (tdist_f32_to_f16(x) != want)
            FAIL("%a (0x%08x): tdist 0x%04x, _Float16 0x%04x", (double)x, u, tdist_f32_to_f16(x), want);
    }
#else
    fprintf(stderr, "no _Float16 in this compiler; covered by the other references\n");
#endif
}

/* The conversions do not depend on MXCSR flush-to-zero / denormals-are-zero. */
TEST(core_half_ignores_ftz_daz, 60)
{
#if defined(__x86_64__)
    unsigned int saved = _mm_getcsr();
    _mm_setcsr(saved | 0x8040); /* FTZ | DAZ */
    tdist__isa_t best = tdist__best_isa();
    uint16_t *hs = malloc(65536 * sizeof *hs), *back = malloc(65536 * sizeof *back);
    float *fs = malloc(65536 * sizeof *fs);
    ASSERT_TRUE(hs && back && fs);
    for (uint32_t i = 0; i < 65536; i++) hs[i] = (uint16_t)i;
    for (int isa = 0; isa <= (int)best; isa++) {
        tdist__set_isa((tdist__isa_t)isa);
        tdist_f16_to_f32_n(fs, hs, 65536);
        tdist_f32_to_f16_n(back, fs, 65536);
        for (uint32_t i = 0; i < 65536; i++) {
            uint16_t want = is_nan_pattern(&F16, (uint16_t)i) ? (uint16_t)(i | 0x0200) : (uint16_t)i;
            if (back[i] != want) {
                _mm_setcsr(saved);
                FAIL("isa %s FTZ/DAZ: f16 0x%04x round trip gave 0x%04x", tdist__isa_name((tdist__isa_t)isa), i,
                     back[i]);
            }
        }
        /* f16 subnormals come out exact (as normal f32) */
        if (fs[1] != 0x1p-24f) {
            _mm_setcsr(saved);
            FAIL("isa %s FTZ/DAZ: f16 0x0001 -> %a", tdist__isa_name((tdist__isa_t)isa), (double)fs[1]);
        }
    }
    tdist__set_isa(best);
    _mm_setcsr(saved);
    free(hs);
    free(back);
    free(fs);
#endif
}
