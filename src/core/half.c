/*
 * core/half.c — f16 / bf16 <-> f32 conversion: the public scalar and bulk
 * functions and the per-instruction-set bulk kernels (portable C, AVX2+F16C,
 * AVX-512). Every path gives the same bits; see core/kernels.h for the policy.
 */
#include <stddef.h>
#include <stdint.h>

#include "core/kernel_unit.h"

/* ------------------------------------------------------------ scalar API */

uint16_t tdist_f32_to_f16(float f) { return tdist__f2h(f); }
float tdist_f16_to_f32(uint16_t h) { return tdist__h2f(h); }
uint16_t tdist_f32_to_bf16(float f) { return tdist__f2bf(f); }
float tdist_bf16_to_f32(uint16_t h) { return tdist__bf2f(h); }

/* --------------------------------------------------------- portable bulk */

/* f16 loops of the x86 variants are unused: F16C replaces them. */
#define MAYBE_UNUSED __attribute__((unused))
#define PORTABLE_LOOPS(SUF, ATTR)                                              \
    ATTR MAYBE_UNUSED static void h2f_##SUF(float *restrict d, const uint16_t *restrict s, size_t n) \
    {                                                                          \
        for (size_t i = 0; i < n; i++) d[i] = tdist__h2f(s[i]);                \
    }                                                                          \
    ATTR MAYBE_UNUSED static void f2h_##SUF(uint16_t *restrict d, const float *restrict s, size_t n) \
    {                                                                          \
        for (size_t i = 0; i < n; i++) d[i] = tdist__f2h(s[i]);                \
    }                                                                          \
    ATTR MAYBE_UNUSED static void bf2f_##SUF(float *restrict d, const uint16_t *restrict s, size_t n) \
    {                                                                          \
        for (size_t i = 0; i < n; i++) d[i] = tdist__bf2f(s[i]);               \
    }                                                                          \
    ATTR MAYBE_UNUSED static void f2bf_##SUF(uint16_t *restrict d, const float *restrict s, size_t n) \
    {                                                                          \
        for (size_t i = 0; i < n; i++) d[i] = tdist__f2bf(s[i]);               \
    }

PORTABLE_LOOPS(generic, )

#ifdef HAVE_X86
#define ATTR_AVX2 __attribute__((target("avx2,f16c")))
#define ATTR_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,f16c")))

/* bf16 is plain integer work: the portable loops vectorise well per target. */
PORTABLE_LOOPS(avx2, ATTR_AVX2)
PORTABLE_LOOPS(avx512, ATTR_AVX512)

/* f16 uses the hardware converters (round to nearest even, NaN quieted,
 * FTZ/DAZ ignored: the same bits as the portable code). */
ATTR_AVX2 static void h2f_f16c(float *restrict d, const uint16_t *restrict s, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(s + i))));
    for (; i < n; i++) d[i] = tdist__h2f(s[i]);
}

ATTR_AVX2 static void f2h_f16c(uint16_t *restrict d, const float *restrict s, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(void *)(d + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) d[i] = tdist__f2h(s[i]);
}

ATTR_AVX512 static void h2f_avx512f(float *restrict d, const uint16_t *restrict s, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(d + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(s + i))));
    for (; i < n; i++) d[i] = tdist__h2f(s[i]);
}

ATTR_AVX512 static void f2h_avx512f(uint16_t *restrict d, const float *restrict s, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(void *)(d + i),
                            _mm512_cvtps_ph(_mm512_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) d[i] = tdist__f2h(s[i]);
}
#endif

/* -------------------------------------------------------------- dispatch */

void tdist__f16_to_f32_k(float *dst, const uint16_t *src, size_t n)
{
#ifdef HAVE_X86
    switch (tdist__get_isa()) {
    case TDIST__ISA_AVX512: h2f_avx512f(dst, src, n); return;
    case TDIST__ISA_AVX2: h2f_f16c(dst, src, n); return;
    default: break;
    }
#endif
    h2f_generic(dst, src, n);
}

void tdist__f32_to_f16_k(uint16_t *dst, const float *src, size_t n)
{
#ifdef HAVE_X86
    switch (tdist__get_isa()) {
    case TDIST__ISA_AVX512: f2h_avx512f(dst, src, n); return;
    case TDIST__ISA_AVX2: f2h_f16c(dst, src, n); return;
    default: break;
    }
#endif
    f2h_generic(dst, src, n);
}

void tdist__bf16_to_f32_k(float *dst, const uint16_t *src, size_t n)
{
#ifdef HAVE_X86
    switch (tdist__get_isa()) {
    case TDIST__ISA_AVX512: bf2f_avx512(dst, src, n); return;
    case TDIST__ISA_AVX2: bf2f_avx2(dst, src, n); return;
    default: break;
    }
#endif
    bf2f_generic(dst, src, n);
}

void tdist__f32_to_bf16_k(uint16_t *dst, const float *src, size_t n)
{
#ifdef HAVE_X86
    switch (tdist__get_isa()) {
    case TDIST__ISA_AVX512: f2bf_avx512(dst, src, n); return;
    case TDIST__ISA_AVX2: f2bf_avx2(dst, src, n); return;
    default: break;
    }
#endif
    f2bf_generic(dst, src, n);
}

/* ------------------------------------------------------------ public bulk */

/* The bulk forms return nothing, so a NULL buffer with n > 0 is logged and
 * ignored rather than dereferenced. */
#define BULK_GUARD(fn)                                                         \
    do {                                                                       \
        if (n == 0) return;                                                    \
        if (!dst || !src) {                                                    \
            TDIST_LOGW("%s: NULL buffer with n=%zu ignored", (fn), n);         \
            return;                                                            \
        }                                                                      \
    } while (0)

void tdist_f32_to_f16_n(uint16_t *dst, const float *src, size_t n)
{
    BULK_GUARD("tdist_f32_to_f16_n");
    tdist__f32_to_f16_k(dst, src, n);
}

void tdist_f16_to_f32_n(float *dst, const uint16_t *src, size_t n)
{
    BULK_GUARD("tdist_f16_to_f32_n");
    tdist__f16_to_f32_k(dst, src, n);
}

void tdist_f32_to_bf16_n(uint16_t *dst, const float *src, size_t n)
{
    BULK_GUARD("tdist_f32_to_bf16_n");
    tdist__f32_to_bf16_k(dst, src, n);
}

void tdist_bf16_to_f32_n(float *dst, const uint16_t *src, size_t n)
{
    BULK_GUARD("tdist_bf16_to_f32_n");
    tdist__bf16_to_f32_k(dst, src, n);
}
