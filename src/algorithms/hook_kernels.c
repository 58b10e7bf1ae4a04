/*
 * algorithms/hook_kernels.c — the per-element passes of the int8 hook,
 * each fused into one pass over the bucket and vectorised for the
 * instruction set core chose at run time (tdist__get_isa: AVX-512, AVX2 +
 * F16C, or portable C; TDIST_KERNELS forces one). Every path gives the
 * bits of the portable one, which is the definition written out step by
 * step (the 16-bit hook's cast is core's tdist__wire16_pack, shared with
 * the all_reduce over a 16-bit wire):
 *
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
