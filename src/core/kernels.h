/*
 * core/kernels.h — internal to core: scalar half-precision conversions
 * (inline, portable, bit-identical to x86 F16C), the instruction-set switch
 * shared by the conversion and reduction kernels, and the bulk conversion
 * entry points reduce.c uses.
 *
 * Policy shared by every path (portable C, F16C, AVX2):
 *  - f32 -> f16/bf16 rounds to nearest, ties to even, on the bits (never
 *    depends on MXCSR FTZ/DAZ or the FP rounding mode);
 *  - a NaN stays NaN: sign kept, quiet bit set, the top payload bits kept
 *    (exactly what vcvtps2ph / vcvtph2ps do);
 *  - infinities and signed zeros are kept; beyond range -> infinity;
 *  - f16/bf16 -> f32 is exact (subnormal halves become normal floats);
 *    a signalling NaN comes back quiet.
 */
#ifndef TDIST_CORE_KERNELS_H
#define TDIST_CORE_KERNELS_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "tdist/core.h"

/* Forced inline so the kernels stay optimised (and vectorised, without
 * sanitizers) even in -O0 Debug builds: GCC does not inline plain `inline`
 * helpers there. Under ASan GCC cannot vectorise any loop (its checks
 * clobber memory); the kernels keep full ASan/UBSan checking there. */
#if defined(__GNUC__)
#define TDIST__INLINE static inline __attribute__((always_inline))
#else
#define TDIST__INLINE static inline
#endif


TDIST__INLINE uint32_t tdist__f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

TDIST__INLINE float tdist__f32_from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* binary16 -> binary32, exact. Branch-free so loops over it vectorise. */
TDIST__INLINE float tdist__h2f(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu;
    uint32_t m = h & 0x3ffu;
    /* normal: rebias exponent 15 -> 127 */
    uint32_t normal = ((e + 112u) << 23) | (m << 13);
    /* inf / NaN: all-ones exponent, NaN gets the quiet bit */
    uint32_t special = 0x7f800000u | (m << 13) | (m ? 0x00400000u : 0u);
    /* zero / subnormal: m * 2^-24 is exact in f32 (and a normal f32) */
    uint32_t sub = tdist__f32_bits((float)m * 0x1p-24f);
    uint32_t mag = e == 31u ? special : e == 0u ? sub : normal;
    return tdist__f32_from_bits(sign | mag);
}

/* binary32 -> binary16, round to nearest even, integer arithmetic only. */
TDIST__INLINE uint16_t tdist__f2h(float f)
{
    uint32_t x = tdist__f32_bits(f);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t ax = x & 0x7fffffffu;
    uint32_t nan = 0x7e00u | ((ax >> 13) & 0x3ffu);
    /* normal f16 range [2^-14, 65520): rebias 127 -> 15, round on bit 13;
     * a carry out of the mantissa bumps the exponent (up to inf) correctly */
    uint32_t normal = (ax - 0x38000000u + 0xfffu + ((ax >> 13) & 1u)) >> 13;
    /* below 2^-14: result is round(|f| * 2^24) units of the f16 subnormal
     * step. |f| = m * 2^(e-150), so shift the 24-bit significand right by
     * 126-e (clamped to 25: everything below 2^-25 rounds to zero). */
    uint32_t e = ax >> 23;
    uint32_t ec = e > 112u ? 112u : e < 101u ? 101u : e; /* keeps s in [14, 25] */
    uint32_t s = 126u - ec;
    uint32_t m = (ax & 0x7fffffu) | 0x800000u;
    uint32_t q = m >> s;
    uint32_t rem = m & ((1u << s) - 1u);
    uint32_t half = 1u << (s - 1u);
    uint32_t sub = q + ((rem > half) | ((rem == half) & q & 1u));
    uint32_t r = ax > 0x7f800000u   ? nan
                 : ax >= 0x47800000u ? 0x7c00u /* >= 65536 and inf */
                 : ax >= 0x38800000u ? normal
                                     : sub;
    return (uint16_t)(sign | r);
}

/* bfloat16 -> binary32, exact (NaN comes back quiet). */
TDIST__INLINE float tdist__bf2f(uint16_t h)
{
    uint32_t x = (uint32_t)h << 16;
    uint32_t nan = ((h & 0x7fffu) > 0x7f80u) ? 0x00400000u : 0u;
    return tdist__f32_from_bits(x | nan);
}

/* binary32 -> bfloat16, round to nearest even; NaN stays NaN (quiet). */
TDIST__INLINE uint16_t tdist__f2bf(float f)
{
    uint32_t x = tdist__f32_bits(f);
    uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
    uint32_t nan = (x >> 16) | 0x0040u;
    return (uint16_t)(((x & 0x7fffffffu) > 0x7f800000u) ? nan : rounded);
}

/* ------------------------------------------------------- instruction sets */

typedef enum tdist__isa {
    TDIST__ISA_GENERIC = 0, /* portable C (SSE2 on x86-64), auto-vectorised */
    TDIST__ISA_AVX2 = 1,    /* x86-64 AVX2 + F16C */
    TDIST__ISA_AVX512 = 2,  /* x86-64 AVX-512 F/BW/VL + F16C */
    TDIST__ISA_COUNT = 3
} tdist__isa_t;

/* The instruction set the kernels use: the best the CPU supports unless
 * TDIST_KERNELS=generic|avx2|avx512 (capped at what the CPU supports) or
 * tdist__set_isa() said otherwise. Thread-safe (detected once, atomic). */
tdist__isa_t tdist__get_isa(void);

/* Use isa for all later kernel calls (tests and benchmarks compare paths).
 * An isa the CPU lacks is capped to the best it has; returns the isa now in
 * effect. Thread-safe (atomic), but meant for set-up, not concurrent use. */
tdist__isa_t tdist__set_isa(tdist__isa_t isa);

/* The best isa this CPU supports. */
tdist__isa_t tdist__best_isa(void);

/* "generic", "avx2", "avx512". */
const char *tdist__isa_name(tdist__isa_t isa);

/* Out-of-place tdist_reduce() calls whose dst has at least this many bytes
 * write dst with non-temporal stores (default: the last-level cache size of
 * cpu0 from sysfs, else sysconf, else 16 MiB; at least 1 MiB). set(0) turns
 * streaming off; tests and benchmarks set it to compare both paths.
 * Thread-safe (atomic). */
size_t tdist__reduce_nt_threshold(void);
void tdist__reduce_set_nt_threshold(size_t bytes);

/* Bulk conversions on the current isa. No argument checks (callers checked);
 * src and dst must not overlap; uint16_t pointers must be 2-byte aligned. */
void tdist__f16_to_f32_k(float *dst, const uint16_t *src, size_t n);
void tdist__f32_to_f16_k(uint16_t *dst, const float *src, size_t n);
void tdist__bf16_to_f32_k(float *dst, const uint16_t *src, size_t n);
void tdist__f32_to_bf16_k(uint16_t *dst, const float *src, size_t n);

/* A 16-bit wire (core/wire16.c; wire: TDIST_F16 or TDIST_BF16): pack
 * dst[i] = wire(fl(float(wire(src[i])) / divisor)), a NaN made the wire's
 * scalar quiet NaN (f16 sign|0x7E00, bf16 0x7FC0) — divisor 1 is a plain
 * round-to-nearest-even cast; unpack dst[i] = float(src[i]), exact. The
 * same bits on every isa. No overlap; pure, thread-safe. */
void tdist__wire16_pack(uint16_t *dst, const float *src, size_t n, float divisor,
                        tdist_dtype_t wire);
void tdist__wire16_unpack(float *dst, const uint16_t *src, size_t n, tdist_dtype_t wire);

#endif /* TDIST_CORE_KERNELS_H */
