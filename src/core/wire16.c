/*
 * core/wire16.c — packing f32 values onto a 16-bit wire (f16 or bf16) and
 * back: the element passes of the 16-bit compression hook and of the
 * all_reduce over a 16-bit wire (coll/all_reduce_wire.c), one fused pass
 * each, vectorised for the instruction set core chose (tdist__get_isa).
 * Every path gives the bits of the portable one, which is the definition:
 *
 *   pack    h = wire(fl(float(wire(x)) / d)), then a NaN h made the
 *           wire's scalar quiet NaN (f16 sign|0x7E00, bf16 0x7FC0);
 *           wire() rounds to nearest even (F16C for f16, integer
 *           arithmetic for bf16). d = 1 is a plain cast (float(wire(x))
 *           is exact). A power-of-two d multiplies by 1/d instead of
 *           dividing: both are one correctly rounded operation on the same
 *           exact quotient, so the bits are the same, and a multiply costs
 *           a fraction of a division;
 *   unpack  x = float(h), exact.
 * No pass contracts a * b + c; MXCSR is the caller's for every path alike.
 */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#include "core/kernel_unit.h"

#ifdef HAVE_X86
#define ATTR_AVX2 __attribute__((target("avx2,f16c,fma")))
#define ATTR_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,f16c,fma")))
#endif

/* The divisor as the passes use it: d itself, or 1/d when that is exact. */
typedef struct divisor {
    float d, inv;
    bool mul;
} divisor_t;

static divisor_t divisor_of(float d)
{
    int e = 0;
    float m = frexpf(d, &e);
    bool pow2 = m == 0.5f && e > -120 && e < 120;
    return (divisor_t){d, pow2 ? 1.0f / d : 1.0f, pow2};
}

TDIST__INLINE float quot(float x, divisor_t dv) { return dv.mul ? x * dv.inv : x / dv.d; }

TDIST__INLINE uint16_t pack_one(float g, divisor_t dv, tdist_dtype_t wire)
{
    if (wire == TDIST_F16) {
        uint16_t h = tdist__f2h(quot(tdist__h2f(tdist__f2h(g)), dv));
        return (h & 0x7fffu) > 0x7c00u ? (uint16_t)((h & 0x8000u) | 0x7e00u) : h;
    }
    uint16_t h = tdist__f2bf(quot(tdist__bf2f(tdist__f2bf(g)), dv));
    return (h & 0x7fffu) > 0x7f80u ? 0x7fc0u : h;
}

/* The portable loop from element i on (bf16 on AVX2: it vectorises). */
#define PACK_LOOP(SUF, ATTR)                                                                     \
    ATTR static void pack_loop_##SUF(uint16_t *restrict dst, const float *restrict src,          \
                                     size_t i, size_t n, divisor_t dv, tdist_dtype_t wire)       \
    {                                                                                            \
        for (; i < n; i++) dst[i] = pack_one(src[i], dv, wire);                                  \
    }
PACK_LOOP(generic, )

#ifdef HAVE_X86
ATTR_AVX512 static inline __m512 quot512(__m512 x, divisor_t dv)
{
    return dv.mul ? _mm512_mul_ps(x, _mm512_set1_ps(dv.inv)) : _mm512_div_ps(x, _mm512_set1_ps(dv.d));
}

ATTR_AVX512 static size_t pack_f16_avx512(uint16_t *dst, const float *src, size_t n, divisor_t dv)
{
    const __m256i sign = _mm256_set1_epi16((short)0x8000), qnan = _mm256_set1_epi16(0x7e00);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i h = _mm512_cvtps_ph(_mm512_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
        __m512 q = quot512(_mm512_cvtph_ps(h), dv);
        h = _mm512_cvtps_ph(q, _MM_FROUND_TO_NEAREST_INT);
        __mmask16 nan = _mm512_cmp_ps_mask(q, q, _CMP_UNORD_Q);
        h = _mm256_mask_blend_epi16(nan, h, _mm256_or_si256(_mm256_and_si256(h, sign), qnan));
        _mm256_storeu_si256((__m256i *)(void *)(dst + i), h);
    }
    return i;
}

/* f32 -> bf16 by round to nearest even on the bits (a NaN is not special
 * here: the callers replace it). */
ATTR_AVX512 static inline __m512i bf16_rne512(__m512i x)
{
    const __m512i one = _mm512_set1_epi32(1), bias = _mm512_set1_epi32(0x7fff);
    return _mm512_srli_epi32(
        _mm512_add_epi32(_mm512_add_epi32(x, bias), _mm512_and_si512(_mm512_srli_epi32(x, 16), one)),
        16);
}

ATTR_AVX512 static size_t pack_bf16_avx512(uint16_t *dst, const float *src, size_t n, divisor_t dv)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512i x = _mm512_castps_si512(_mm512_loadu_ps(src + i));
        __m512i r = bf16_rne512(x);
        __mmask16 nan_in = _mm512_cmp_ps_mask(_mm512_castsi512_ps(x), _mm512_castsi512_ps(x),
                                              _CMP_UNORD_Q);
        /* a NaN input: its value is NaN, as is q's */
        __m512 g = _mm512_castsi512_ps(_mm512_slli_epi32(r, 16));
        g = _mm512_mask_blend_ps(nan_in, g, _mm512_castsi512_ps(_mm512_set1_epi32(0x7fc00000)));
        __m512 q = quot512(g, dv);
        __m512i o = bf16_rne512(_mm512_castps_si512(q));
        __mmask16 nan = _mm512_cmp_ps_mask(q, q, _CMP_UNORD_Q);
        o = _mm512_mask_blend_epi32(nan, o, _mm512_set1_epi32(0x7fc0));
        _mm256_storeu_si256((__m256i *)(void *)(dst + i), _mm512_cvtepi32_epi16(o));
    }
    return i;
}

PACK_LOOP(avx2, ATTR_AVX2)

ATTR_AVX2 static size_t pack_avx2(uint16_t *dst, const float *src, size_t n, divisor_t dv,
                                  tdist_dtype_t wire)
{
    if (wire != TDIST_F16) {
        pack_loop_avx2(dst, src, 0, n, dv, wire);
        return n;
    }
    const __m256 d = _mm256_set1_ps(dv.mul ? dv.inv : dv.d);
    const __m128i sign = _mm_set1_epi16((short)0x8000), qnan = _mm_set1_epi16(0x7e00);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
        __m256 g = _mm256_cvtph_ps(h);
        __m256 q = dv.mul ? _mm256_mul_ps(g, d) : _mm256_div_ps(g, d);
        h = _mm256_cvtps_ph(q, _MM_FROUND_TO_NEAREST_INT);
        __m256i nan32 = _mm256_castps_si256(_mm256_cmp_ps(q, q, _CMP_UNORD_Q));
        __m128i nan = _mm_packs_epi32(_mm256_castsi256_si128(nan32), _mm256_extracti128_si256(nan32, 1));
        h = _mm_blendv_epi8(h, _mm_or_si128(_mm_and_si128(h, sign), qnan), nan);
        _mm_storeu_si128((__m128i *)(void *)(dst + i), h);
    }
    return i;
}
#endif

void tdist__wire16_pack(uint16_t *dst, const float *src, size_t n, float divisor,
                        tdist_dtype_t wire)
{
    divisor_t dv = divisor_of(divisor);
    size_t i = 0;
#ifdef HAVE_X86
    switch (tdist__get_isa()) {
    case TDIST__ISA_AVX512:
        i = wire == TDIST_F16 ? pack_f16_avx512(dst, src, n, dv) : pack_bf16_avx512(dst, src, n, dv);
        break;
    case TDIST__ISA_AVX2: i = pack_avx2(dst, src, n, dv, wire); break;
    default: break;
    }
#endif
    pack_loop_generic(dst, src, i, n, dv, wire);
}

void tdist__wire16_unpack(float *dst, const uint16_t *src, size_t n, tdist_dtype_t wire)
{
    if (wire == TDIST_F16)
        tdist__f16_to_f32_k(dst, src, n);
    else
        tdist__bf16_to_f32_k(dst, src, n);
}
