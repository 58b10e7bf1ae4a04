/*
 * algorithms/hook_kernels.c — the per-element passes of the 16-bit
 * compression hook and of the int8 hook, each fused into one pass over
 * the bucket and vectorised for the instruction set core chose at run time
 * (tdist__get_isa: AVX-512, AVX2 + F16C, or portable C; TDIST_KERNELS
 * forces one). Every path gives the bits of the portable one, which is the
 * definition written out step by step:
 *
 *   16-bit hook cast  h = wire(fl(float(wire(g)) / W)), then a NaN h made
 *                     c10's scalar NaN (f16 sign|0x7E00, bf16 0x7FC0);
 *                     wire() rounds to nearest even (core's converters:
 *                     F16C for f16, integer arithmetic for bf16); the
 *                     division is one IEEE division per element;
 *   int8 block scale  s = max |x| over the finite x of the block, / 127;
 *   int8 code         -128 for a non-finite x; 0 when s == 0; else
 *                     x / s rounded half away from zero, clamped to
 *                     [-127, 127] (trunc(q), plus sign(q) when
 *                     |q - trunc(q)| >= 0.5: q - trunc(q) is exact, so this
 *                     is roundf(q));
 *   int8 value        code * s (NaN for -128); sums add in the caller's
 *                     order, one rounding per addition.
 * No pass contracts a * b + c (ISO C mode), so each step rounds once as
 * written; MXCSR is the caller's for every path alike.
 */
#include <float.h>
#include <math.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_X86 1
#endif

#include "algorithms/internal.h"
#include "core/kernels.h"

#ifdef HAVE_X86
#define ATTR_AVX2 __attribute__((target("avx2,f16c,fma")))
#define ATTR_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,f16c,fma")))
#endif

/* ------------------------------------------------------- the 16-bit hook */

TDIST__INLINE uint16_t hook16_one(float g, float dv, tdist_dtype_t wire)
{
    if (wire == TDIST_F16) {
        uint16_t h = tdist__f2h(tdist__h2f(tdist__f2h(g)) / dv);
        return (h & 0x7fffu) > 0x7c00u ? (uint16_t)((h & 0x8000u) | 0x7e00u) : h;
    }
    uint16_t h = tdist__f2bf(tdist__bf2f(tdist__f2bf(g)) / dv);
    return (h & 0x7fffu) > 0x7f80u ? 0x7fc0u : h;
}

/* The portable loop from element i on (bf16 on AVX2: it vectorises). */
#define HOOK16_LOOP(SUF, ATTR)                                                                   \
    ATTR static void hook16_loop_##SUF(uint16_t *restrict dst, const float *restrict src,        \
                                       size_t i, size_t n, float dv, tdist_dtype_t wire)         \
    {                                                                                            \
        for (; i < n; i++) dst[i] = hook16_one(src[i], dv, wire);                                \
    }
HOOK16_LOOP(generic, )

#ifdef HAVE_X86
ATTR_AVX512 static size_t hook16_avx512(uint16_t *dst, const float *src, size_t n, float dv,
                                        tdist_dtype_t wire)
{
    const __m512 d = _mm512_set1_ps(dv);
    size_t i = 0;
    if (wire == TDIST_F16) {
        const __m256i sign = _mm256_set1_epi16((short)0x8000), qnan = _mm256_set1_epi16(0x7e00);
        for (; i + 16 <= n; i += 16) {
            __m256i h = _mm512_cvtps_ph(_mm512_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
            __m512 q = _mm512_div_ps(_mm512_cvtph_ps(h), d);
            h = _mm512_cvtps_ph(q, _MM_FROUND_TO_NEAREST_INT);
            __mmask16 nan = _mm512_cmp_ps_mask(q, q, _CMP_UNORD_Q);
            h = _mm256_mask_blend_epi16(nan, h, _mm256_or_si256(_mm256_and_si256(h, sign), qnan));
            _mm256_storeu_si256((__m256i *)(void *)(dst + i), h);
        }
        return i;
    }
    const __m512i one = _mm512_set1_epi32(1), bias = _mm512_set1_epi32(0x7fff);
    for (; i + 16 <= n; i += 16) {
        __m512i x = _mm512_castps_si512(_mm512_loadu_ps(src + i));
        __m512i r = _mm512_add_epi32(_mm512_add_epi32(x, bias),
                                     _mm512_and_si512(_mm512_srli_epi32(x, 16), one));
        r = _mm512_srli_epi32(r, 16);
        __mmask16 nan_in = _mm512_cmp_ps_mask(_mm512_castsi512_ps(x), _mm512_castsi512_ps(x),
                                              _CMP_UNORD_Q);
        /* a NaN input: (x >> 16) | 0x40; its value is NaN, as is q's */
        __m512 g = _mm512_castsi512_ps(_mm512_slli_epi32(r, 16));
        g = _mm512_mask_blend_ps(nan_in, g, _mm512_castsi512_ps(_mm512_set1_epi32(0x7fc00000)));
        __m512 q = _mm512_div_ps(g, d);
        __m512i y = _mm512_castps_si512(q);
        __m512i o = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(y, bias),
                                                        _mm512_and_si512(_mm512_srli_epi32(y, 16), one)),
                                      16);
        __mmask16 nan = _mm512_cmp_ps_mask(q, q, _CMP_UNORD_Q);
        o = _mm512_mask_blend_epi32(nan, o, _mm512_set1_epi32(0x7fc0));
        _mm256_storeu_si256((__m256i *)(void *)(dst + i), _mm512_cvtepi32_epi16(o));
    }
    return i;
}

HOOK16_LOOP(avx2, ATTR_AVX2)

ATTR_AVX2 static size_t hook16_avx2(uint16_t *dst, const float *src, size_t n, float dv,
                                    tdist_dtype_t wire)
{
    if (wire != TDIST_F16) {
        hook16_loop_avx2(dst, src, 0, n, dv, wire);
        return n;
    }
    const __m256 d = _mm256_set1_ps(dv);
    const __m128i sign = _mm_set1_epi16((short)0x8000), qnan = _mm_set1_epi16(0x7e00);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
        __m256 q = _mm256_div_ps(_mm256_cvtph_ps(h), d);
        h = _mm256_cvtps_ph(q, _MM_FROUND_TO_NEAREST_INT);
        __m256i nan32 = _mm256_castps_si256(_mm256_cmp_ps(q, q, _CMP_UNORD_Q));
        __m128i nan = _mm_packs_epi32(_mm256_castsi256_si128(nan32), _mm256_extracti128_si256(nan32, 1));
        h = _mm_blendv_epi8(h, _mm_or_si128(_mm_and_si128(h, sign), qnan), nan);
        _mm_storeu_si128((__m128i *)(void *)(dst + i), h);
    }
    return i;
}
#endif

void tdist__hook16_cast(uint16_t *dst, const float *src, size_t n, float divisor,
                        tdist_dtype_t wire)
{
    size_t i = 0;
#ifdef HAVE_X86
    switch (tdist__get_isa()) {
    case TDIST__ISA_AVX512: i = hook16_avx512(dst, src, n, divisor, wire); break;
    case TDIST__ISA_AVX2: i = hook16_avx2(dst, src, n, divisor, wire); break;
    default: break;
    }
#endif
    hook16_loop_generic(dst, src, i, n, divisor, wire);
}

/* ------------------------------------------------------------------ int8 */

#define QMAX 127.0f
#define NONFINITE_CODE (-128)

TDIST__INLINE int finite_f(float x) { return fabsf(x) <= FLT_MAX; }

/* The code of a finite x for scale s > 0 (see the top). */
TDIST__INLINE int code_finite(float x, float s)
{
    float q = x / s;
    float t = truncf(q);
    float f = q - t;
    float r = fabsf(f) >= 0.5f ? t + copysignf(1.0f, q) : t;
    r = r > QMAX ? QMAX : r;
    r = r < -QMAX ? -QMAX : r;
    return (int)r;
}

/* One block of m values: its scale, codes, and residual (resid may be src
 * or NULL); returns how many values were not finite. The portable loops,
 * also compiled for AVX2 (they vectorise there). */
#define INT8_LOOPS(SUF, ATTR)                                                                    \
    ATTR static size_t qblock_##SUF(int8_t *codes, float *s_out, const float *src, float *resid, \
                                    size_t m)                                                    \
    {                                                                                            \
        float mx = 0.0f;                                                                         \
        for (size_t i = 0; i < m; i++) {                                                         \
            float a = fabsf(src[i]);                                                             \
            mx = a > mx && a <= FLT_MAX ? a : mx;                                                \
        }                                                                                        \
        const float s = mx / QMAX;                                                               \
        *s_out = s;                                                                              \
        size_t bad = 0;                                                                          \
        for (size_t i = 0; i < m; i++) {                                                         \
            float x = src[i];                                                                    \
            int fin = finite_f(x);                                                               \
            int c = !fin ? NONFINITE_CODE : s == 0.0f ? 0 : code_finite(x, s);                   \
            codes[i] = (int8_t)c;                                                                \
            bad += (size_t)!fin;                                                                 \
            if (resid) resid[i] = fin ? x - (float)c * s : 0.0f;                                 \
        }                                                                                        \
        return bad;                                                                              \
    }                                                                                            \
    ATTR static void deq_##SUF(float *restrict dst, const int8_t *restrict codes, float s,       \
                               size_t m, bool add)                                               \
    {                                                                                            \
        const float nan = NAN;                                                                   \
        if (add)                                                                                 \
            for (size_t i = 0; i < m; i++)                                                       \
                dst[i] = dst[i] + (codes[i] == NONFINITE_CODE ? nan : (float)codes[i] * s);      \
        else                                                                                     \
            for (size_t i = 0; i < m; i++)                                                       \
                dst[i] = codes[i] == NONFINITE_CODE ? nan : (float)codes[i] * s;                 \
    }
INT8_LOOPS(generic, )

#ifdef HAVE_X86
INT8_LOOPS(avx2, ATTR_AVX2)

/* and / or of f32 vectors with AVX-512F alone (the _ps forms need DQ). */
ATTR_AVX512 static inline __m512 and512(__m512 a, __m512 b)
{
    return _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(a), _mm512_castps_si512(b)));
}

ATTR_AVX512 static inline __m512 or512(__m512 a, __m512 b)
{
    return _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(a), _mm512_castps_si512(b)));
}

ATTR_AVX512 static size_t qblock_avx512(int8_t *codes, float *s_out, const float *src,
                                        float *resid, size_t m)
{
    const __m512 absmask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
    const __m512 fmax = _mm512_set1_ps(FLT_MAX);
    __m512 mx = _mm512_setzero_ps();
    size_t i = 0;
    for (; i + 16 <= m; i += 16) {
        __m512 a = and512(_mm512_loadu_ps(src + i), absmask);
        __mmask16 fin = _mm512_cmp_ps_mask(a, fmax, _CMP_LE_OQ);
        mx = _mm512_mask_max_ps(mx, fin, mx, a);
    }
    float m0 = _mm512_reduce_max_ps(mx);
    for (; i < m; i++) {
        float a = fabsf(src[i]);
        m0 = a > m0 && a <= FLT_MAX ? a : m0;
    }
    const float s = m0 / QMAX;
    *s_out = s;
    /* s == 0 (no finite value above 2^-149 * 127): every finite code is 0 */
    const __mmask16 nz = s == 0.0f ? 0 : 0xffff;
    const __m512 sv = _mm512_set1_ps(s), half = _mm512_set1_ps(0.5f), one = _mm512_set1_ps(1.0f);
    const __m512 lo = _mm512_set1_ps(-QMAX), hi = _mm512_set1_ps(QMAX);
    const __m512 signbit = _mm512_castsi512_ps(_mm512_set1_epi32((int)0x80000000u));
    size_t bad = 0;
    for (i = 0; i + 16 <= m; i += 16) {
        __m512 x = _mm512_loadu_ps(src + i);
        __mmask16 fin = _mm512_cmp_ps_mask(and512(x, absmask), fmax, _CMP_LE_OQ);
        __m512 q = _mm512_div_ps(x, sv);
        __m512 t = _mm512_roundscale_ps(q, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
        __m512 f = and512(_mm512_sub_ps(q, t), absmask);
        __mmask16 up = _mm512_cmp_ps_mask(f, half, _CMP_GE_OQ);
        __m512 r = _mm512_mask_add_ps(t, up, t, or512(one, and512(q, signbit)));
        r = _mm512_min_ps(_mm512_max_ps(r, lo), hi);
        __m512i c = _mm512_mask_blend_epi32(fin, _mm512_set1_epi32(NONFINITE_CODE),
                                            _mm512_maskz_cvttps_epi32(nz, r));
        _mm_storeu_si128((__m128i *)(void *)(codes + i), _mm512_cvtepi32_epi8(c));
        bad += (size_t)(16 - __builtin_popcount((unsigned)fin));
        if (resid) {
            __m512 v = _mm512_sub_ps(x, _mm512_mul_ps(_mm512_cvtepi32_ps(c), sv));
            _mm512_storeu_ps(resid + i, _mm512_maskz_mov_ps(fin, v));
        }
    }
    for (; i < m; i++) {
        float x = src[i];
        int fin = finite_f(x);
        int c = !fin ? NONFINITE_CODE : s == 0.0f ? 0 : code_finite(x, s);
        codes[i] = (int8_t)c;
        bad += (size_t)!fin;
        if (resid) resid[i] = fin ? x - (float)c * s : 0.0f;
    }
    return bad;
}

ATTR_AVX512 static void deq_avx512(float *restrict dst, const int8_t *restrict codes, float s,
                                   size_t m, bool add)
{
    const __m512 sv = _mm512_set1_ps(s), nan = _mm512_set1_ps(NAN);
    const __m512i bad = _mm512_set1_epi32(NONFINITE_CODE);
    size_t i = 0;
    for (; i + 16 <= m; i += 16) {
        __m512i c = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(const void *)(codes + i)));
        __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(c), sv);
        v = _mm512_mask_blend_ps(_mm512_cmpeq_epi32_mask(c, bad), v, nan);
        if (add) v = _mm512_add_ps(_mm512_loadu_ps(dst + i), v);
        _mm512_storeu_ps(dst + i, v);
    }
    deq_generic(dst + i, codes + i, s, m - i, add);
}
#endif

size_t tdist__int8_quantise(int8_t *codes, unsigned char *scales, const float *src, float *resid,
                            size_t n, size_t block)
{
    size_t (*q)(int8_t *, float *, const float *, float *, size_t) = qblock_generic;
#ifdef HAVE_X86
    switch (tdist__get_isa()) {
    case TDIST__ISA_AVX512: q = qblock_avx512; break;
    case TDIST__ISA_AVX2: q = qblock_avx2; break;
    default: break;
    }
#endif
    size_t bad = 0;
    for (size_t b0 = 0, k = 0; b0 < n; b0 += block, k++) {
        float s;
        bad += q(codes + b0, &s, src + b0, resid ? resid + b0 : NULL, TDIST_MIN(block, n - b0));
        memcpy(scales + k * sizeof s, &s, sizeof s);
    }
    return bad;
}

void tdist__int8_dequantise(float *dst, const int8_t *codes, const unsigned char *scales,
                            size_t n, size_t block, bool add)
{
    void (*d)(float *restrict, const int8_t *restrict, float, size_t, bool) = deq_generic;
#ifdef HAVE_X86
    switch (tdist__get_isa()) {
    case TDIST__ISA_AVX512: d = deq_avx512; break;
    case TDIST__ISA_AVX2: d = deq_avx2; break;
    default: break;
    }
#endif
    for (size_t b0 = 0, k = 0; b0 < n; b0 += block, k++) {
        float s;
        memcpy(&s, scales + k * sizeof s, sizeof s);
        d(dst + b0, codes + b0, s, TDIST_MIN(block, n - b0), add);
    }
}
