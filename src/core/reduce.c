/*
 * core/reduce.c — local reduction kernels: dst = a op b, scale, divide,
 * identity fill.
 *
 * How it is fast: every (dtype, op) has three plain C loops — out of place
 * (dst, a, b all restrict), in place (dst op= src) and self (dst op= dst) —
 * that GCC vectorises. They are compiled once per instruction set (portable,
 * AVX2, AVX-512 via target attributes) and the set the CPU supports is picked
 * at run time (core/isa.c). f16/bf16 are converted in L1-sized chunks to f32
 * with the hardware converters, reduced with the f32 kernel and rounded back
 * once. Misaligned buffers go through an aligned bounce buffer. An out-of-
 * place reduction whose dst is larger than the last-level cache (so dst
 * cannot stay cached anyway) is computed block by block into an L1 buffer
 * and written with non-temporal stores: that saves the read-for-ownership of
 * every dst line (about a quarter of the memory traffic).
 *
 * Semantics chosen here:
 *  - integer SUM/PROD wrap modulo 2^bits (two's complement), as in NCCL and
 *    PyTorch; never undefined behaviour.
 *  - float MIN/MAX follow IEEE 754-2019 minimum/maximum: a NaN in either
 *    input gives NaN (like torch.minimum/maximum), and -0 < +0, so the result
 *    does not depend on operand order (ranks reducing in different orders
 *    get the same bits; which NaN payload survives is unspecified).
 */
#include <inttypes.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/kernel_unit.h"

#ifdef HAVE_X86
#define ATTR_AVX2 __attribute__((target("avx2,f16c")))
#define ATTR_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,f16c")))
#endif

/* Elements per chunk for the f16/bf16 and bounce paths (fits L1 twice). */
#define CHUNK 1024

/* ------------------------------------------------------------- elem ops */

TDIST__INLINE uint64_t f64_bits(double d)
{
    uint64_t u;
    memcpy(&u, &d, sizeof u);
    return u;
}

TDIST__INLINE double f64_from_bits(uint64_t u)
{
    double d;
    memcpy(&d, &u, sizeof d);
    return d;
}

/* IEEE 754-2019 minimum/maximum: NaN propagates; on equality (only -0/+0
 * differ in bits) OR of the bits picks -0 for min, AND picks +0 for max. */
TDIST__INLINE float min_f32(float x, float y)
{
    float r = x < y ? x : y;
    r = x == y ? tdist__f32_from_bits(tdist__f32_bits(x) | tdist__f32_bits(y)) : r;
    return x != x ? x : r;
}

TDIST__INLINE float max_f32(float x, float y)
{
    float r = x > y ? x : y;
    r = x == y ? tdist__f32_from_bits(tdist__f32_bits(x) & tdist__f32_bits(y)) : r;
    return x != x ? x : r;
}

TDIST__INLINE double min_f64(double x, double y)
{
    double r = x < y ? x : y;
    r = x == y ? f64_from_bits(f64_bits(x) | f64_bits(y)) : r;
    return x != x ? x : r;
}

TDIST__INLINE double max_f64(double x, double y)
{
    double r = x > y ? x : y;
    r = x == y ? f64_from_bits(f64_bits(x) & f64_bits(y)) : r;
    return x != x ? x : r;
}

/* ---------------------------------------------------------- kernel bodies */

typedef void (*oop_fn)(void *restrict d, const void *restrict a, const void *restrict b, size_t n);
typedef void (*ip_fn)(void *restrict d, const void *restrict s, size_t n);
typedef void (*self_fn)(void *d, size_t n);

typedef struct kern {
    oop_fn oop;   /* d = a op b, nothing aliases */
    ip_fn ip;     /* d = d op s, d and s distinct */
    self_fn self; /* d = d op d */
} kern_t;

/* One (type, op) kernel triple; EXPR combines x and y. */
#define KERN(SUF, ATTR, NAME, T, EXPR)                                         \
    ATTR static void NAME##_oop_##SUF(void *restrict dv, const void *restrict av, \
                                      const void *restrict bv, size_t n)       \
    {                                                                          \
        T *restrict d = dv;                                                    \
        const T *restrict a = av;                                              \
        const T *restrict b = bv;                                              \
        for (size_t i = 0; i < n; i++) {                                       \
            T x = a[i], y = b[i];                                              \
            d[i] = (T)(EXPR);                                                  \
        }                                                                      \
    }                                                                          \
    ATTR static void NAME##_ip_##SUF(void *restrict dv, const void *restrict sv, size_t n) \
    {                                                                          \
        T *restrict d = dv;                                                    \
        const T *restrict s = sv;                                              \
        for (size_t i = 0; i < n; i++) {                                       \
            T x = d[i], y = s[i];                                              \
            d[i] = (T)(EXPR);                                                  \
        }                                                                      \
    }                                                                          \
    ATTR static void NAME##_self_##SUF(void *dv, size_t n)                     \
    {                                                                          \
        T *d = dv;                                                             \
        for (size_t i = 0; i < n; i++) {                                       \
            T x = d[i], y = x;                                                 \
            d[i] = (T)(EXPR);                                                  \
        }                                                                      \
    }

#define FLOAT_KERNS(SUF, ATTR, TN, T)                                          \
    KERN(SUF, ATTR, TN##_sum, T, x + y)                                        \
    KERN(SUF, ATTR, TN##_prod, T, x * y)                                       \
    KERN(SUF, ATTR, TN##_min, T, min_##TN(x, y))                               \
    KERN(SUF, ATTR, TN##_max, T, max_##TN(x, y))

/* U is the unsigned type of the same width: SUM and PROD wrap. */
#define INT_KERNS(SUF, ATTR, TN, T, U)                                         \
    KERN(SUF, ATTR, TN##_sum, T, (U)x + (U)y)                                  \
    KERN(SUF, ATTR, TN##_prod, T, (U)x * (U)y)                                 \
    KERN(SUF, ATTR, TN##_min, T, x < y ? x : y)                                \
    KERN(SUF, ATTR, TN##_max, T, x > y ? x : y)                                \
    KERN(SUF, ATTR, TN##_band, T, x & y)                                       \
    KERN(SUF, ATTR, TN##_bor, T, x | y)                                        \
    KERN(SUF, ATTR, TN##_bxor, T, x ^ y)

#define ALL_KERNS(SUF, ATTR)                                                   \
    FLOAT_KERNS(SUF, ATTR, f32, float)                                         \
    FLOAT_KERNS(SUF, ATTR, f64, double)                                        \
    INT_KERNS(SUF, ATTR, i8, int8_t, uint8_t)                                  \
    INT_KERNS(SUF, ATTR, u8, uint8_t, uint8_t)                                 \
    INT_KERNS(SUF, ATTR, i32, int32_t, uint32_t)                               \
    INT_KERNS(SUF, ATTR, i64, int64_t, uint64_t)

ALL_KERNS(generic, )
#ifdef HAVE_X86
ALL_KERNS(avx2, ATTR_AVX2)
ALL_KERNS(avx512, ATTR_AVX512)
#endif

/* ------------------------------------------------------------------ table */

#define K(SUF, NAME) {NAME##_oop_##SUF, NAME##_ip_##SUF, NAME##_self_##SUF}

/* AVG and PREMUL_SUM reduce as SUM. f16/bf16 rows stay empty: they run
 * through the f32 row (reduce_half). */
#define FLOAT_ROW(ISA, SUF, DT, TN)                                            \
    [ISA][DT][TDIST_SUM] = K(SUF, TN##_sum), [ISA][DT][TDIST_AVG] = K(SUF, TN##_sum), \
    [ISA][DT][TDIST_PREMUL_SUM] = K(SUF, TN##_sum), [ISA][DT][TDIST_PROD] = K(SUF, TN##_prod), \
    [ISA][DT][TDIST_MIN] = K(SUF, TN##_min), [ISA][DT][TDIST_MAX] = K(SUF, TN##_max)

#define INT_ROW(ISA, SUF, DT, TN)                                              \
    FLOAT_ROW(ISA, SUF, DT, TN), [ISA][DT][TDIST_BAND] = K(SUF, TN##_band),    \
    [ISA][DT][TDIST_BOR] = K(SUF, TN##_bor), [ISA][DT][TDIST_BXOR] = K(SUF, TN##_bxor)

#define ISA_ROWS(ISA, SUF)                                                     \
    FLOAT_ROW(ISA, SUF, TDIST_F32, f32), FLOAT_ROW(ISA, SUF, TDIST_F64, f64),  \
    INT_ROW(ISA, SUF, TDIST_I8, i8), INT_ROW(ISA, SUF, TDIST_U8, u8),          \
    INT_ROW(ISA, SUF, TDIST_I32, i32), INT_ROW(ISA, SUF, TDIST_I64, i64)

static const kern_t kernels[TDIST__ISA_COUNT][TDIST_DTYPE_COUNT][TDIST_REDOP_COUNT] = {
    ISA_ROWS(TDIST__ISA_GENERIC, generic),
#ifdef HAVE_X86
    ISA_ROWS(TDIST__ISA_AVX2, avx2),
    ISA_ROWS(TDIST__ISA_AVX512, avx512),
#endif
};

static const kern_t *kernel_for(tdist_dtype_t dtype, tdist_redop_t op)
{
    tdist__isa_t isa = tdist__get_isa();
    const kern_t *k = &kernels[isa][dtype][op];
    if (!k->oop) k = &kernels[TDIST__ISA_GENERIC][dtype][op];
    return k;
}

/* ------------------------------------------------------------------ paths */

static size_t dtype_align(tdist_dtype_t dtype)
{
    switch (dtype) {
    case TDIST_F32: return _Alignof(float);
    case TDIST_F64: return _Alignof(double);
    case TDIST_F16:
    case TDIST_BF16: return _Alignof(uint16_t);
    case TDIST_I32: return _Alignof(int32_t);
    case TDIST_I64: return _Alignof(int64_t);
    default: return 1;
    }
}

static int is_aligned(const void *p, size_t align) { return ((uintptr_t)p & (align - 1)) == 0; }

static void run_kern(const kern_t *k, void *d, const void *a, const void *b, size_t n)
{
    if (d == a && d == b) k->self(d, n);
    else if (d == a) k->ip(d, b, n);
    else if (d == b) k->ip(d, a, n); /* every op is commutative */
    else k->oop(d, a, b, n);
}

/* f16/bf16: widen a chunk of each input to f32, reduce in f32, round once. */
static void reduce_half(uint16_t *d, const uint16_t *a, const uint16_t *b, size_t n,
                        tdist_dtype_t dtype, tdist_redop_t op)
{
    alignas(64) float ta[CHUNK];
    alignas(64) float tb[CHUNK];
    const kern_t *k = kernel_for(TDIST_F32, op);
    int f16 = dtype == TDIST_F16;
    for (size_t i = 0; i < n; i += CHUNK) {
        size_t c = TDIST_MIN(n - i, (size_t)CHUNK);
        if (f16) tdist__f16_to_f32_k(ta, a + i, c);
        else tdist__bf16_to_f32_k(ta, a + i, c);
        if (b == a) {
            k->self(ta, c);
        } else {
            if (f16) tdist__f16_to_f32_k(tb, b + i, c);
            else tdist__bf16_to_f32_k(tb, b + i, c);
            k->ip(ta, tb, c);
        }
        if (f16) tdist__f32_to_f16_k(d + i, ta, c);
        else tdist__f32_to_bf16_k(d + i, ta, c);
    }
}

/* All pointers aligned for dtype. */
static void reduce_aligned(void *d, const void *a, const void *b, size_t n, tdist_dtype_t dtype,
                           tdist_redop_t op)
{
    if (dtype == TDIST_F16 || dtype == TDIST_BF16) reduce_half(d, a, b, n, dtype, op);
    else run_kern(kernel_for(dtype, op), d, a, b, n);
}

/* Some pointer misaligned: copy chunks into aligned buffers first. */
static void reduce_bounce(void *d, const void *a, const void *b, size_t n, size_t esize,
                          tdist_dtype_t dtype, tdist_redop_t op)
{
    alignas(64) unsigned char ba[CHUNK * 8];
    alignas(64) unsigned char bb[CHUNK * 8];
    size_t per = sizeof ba / esize;
    for (size_t i = 0; i < n; i += per) {
        size_t c = TDIST_MIN(n - i, per);
        memcpy(ba, (const unsigned char *)a + i * esize, c * esize);
        memcpy(bb, (const unsigned char *)b + i * esize, c * esize);
        reduce_aligned(ba, ba, bb, c, dtype, op);
        memcpy((unsigned char *)d + i * esize, ba, c * esize);
    }
}

/* ------------------------------------------------------ streaming stores */

static _Atomic size_t nt_threshold; /* 0: not decided yet */

size_t tdist__reduce_nt_threshold(void)
{
    size_t t = atomic_load_explicit(&nt_threshold, memory_order_relaxed);
    if (t) return t;
    /* The last-level cache one core sees: sysfs (what lscpu shows); some
     * VMs report the whole host's L3 through sysconf, so that comes second. */
    long l3 = -1;
    FILE *f = fopen("/sys/devices/system/cpu/cpu0/cache/index3/size", "r");
    if (f) {
        char unit = 0;
        long v = -1;
        if (fscanf(f, "%ld%c", &v, &unit) >= 1 && v > 0)
            l3 = unit == 'K' ? v << 10 : unit == 'M' ? v << 20 : v;
        fclose(f);
    }
#ifdef _SC_LEVEL3_CACHE_SIZE
    if (l3 <= 0) l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
#endif
    t = l3 > 0 ? (size_t)l3 : (size_t)16 << 20;
    if (t < ((size_t)1 << 20)) t = (size_t)1 << 20;
    atomic_store(&nt_threshold, t);
    return t;
}

void tdist__reduce_set_nt_threshold(size_t bytes)
{
    atomic_store(&nt_threshold, bytes ? bytes : SIZE_MAX);
}

/* Copy src to dst with non-temporal stores where dst is aligned, as wide as
 * the isa allows (SSE2 exists on every x86-64). The caller fences once. */
#ifdef HAVE_X86
#define STREAM_COPY(SUF, ATTR, W, VT, LOAD, STREAM)                            \
    ATTR static void stream_copy_##SUF(unsigned char *d, const unsigned char *s, size_t bytes) \
    {                                                                          \
        size_t head = ((W) - ((uintptr_t)d & ((W) - 1))) & ((W) - 1);          \
        if (head > bytes) head = bytes;                                        \
        memcpy(d, s, head);                                                    \
        d += head;                                                             \
        s += head;                                                             \
        bytes -= head;                                                         \
        for (; bytes >= (W); bytes -= (W), d += (W), s += (W))                 \
            STREAM((VT *)(void *)d, LOAD((const VT *)(const void *)s));        \
        memcpy(d, s, bytes);                                                   \
    }
STREAM_COPY(sse2, , 16, __m128i, _mm_loadu_si128, _mm_stream_si128)
STREAM_COPY(avx2, ATTR_AVX2, 32, __m256i, _mm256_loadu_si256, _mm256_stream_si256)
STREAM_COPY(avx512, ATTR_AVX512, 64, __m512i, _mm512_loadu_si512, _mm512_stream_si512)

/* f32 SUM (also AVG, PREMUL_SUM) out of place, streamed straight from the
 * registers: the hot case (gradients) gets no extra pass through L1. */
#define STREAM_SUM_F32(SUF, ATTR, W, VT, LOADU, ADD, STREAM)                   \
    ATTR static void stream_sum_f32_##SUF(float *d, const float *a, const float *b, size_t n) \
    {                                                                          \
        size_t i = 0;                                                          \
        for (; i < n && ((uintptr_t)(d + i) & ((W) - 1)); i++) d[i] = a[i] + b[i]; \
        for (; i + (W) / 4 <= n; i += (W) / 4)                                 \
            STREAM(d + i, ADD(LOADU(a + i), LOADU(b + i)));                    \
        for (; i < n; i++) d[i] = a[i] + b[i];                                 \
    }
STREAM_SUM_F32(avx2, ATTR_AVX2, 32, __m256, _mm256_loadu_ps, _mm256_add_ps, _mm256_stream_ps)
STREAM_SUM_F32(avx512, ATTR_AVX512, 64, __m512, _mm512_loadu_ps, _mm512_add_ps, _mm512_stream_ps)
#endif

static void stream_copy(void *dst, const void *src, size_t bytes)
{
#ifdef HAVE_X86
    switch (tdist__get_isa()) {
    case TDIST__ISA_AVX512: stream_copy_avx512(dst, src, bytes); return;
    case TDIST__ISA_AVX2: stream_copy_avx2(dst, src, bytes); return;
    default: stream_copy_sse2(dst, src, bytes); return;
    }
#else
    memcpy(dst, src, bytes);
#endif
}

static void reduce_any(void *d, const void *a, const void *b, size_t n, size_t esize, tdist_dtype_t dtype,
                       tdist_redop_t op);

/* Out of place, dst beyond the cache: reduce a block into an L1 buffer,
 * stream it out. a and b may be misaligned (reduce_any handles it). */
static void reduce_streaming(void *d, const void *a, const void *b, size_t n, size_t esize,
                             tdist_dtype_t dtype, tdist_redop_t op)
{
#ifdef HAVE_X86
    tdist__isa_t isa = tdist__get_isa();
    int sum = op == TDIST_SUM || op == TDIST_AVG || op == TDIST_PREMUL_SUM;
    if (dtype == TDIST_F32 && sum && isa >= TDIST__ISA_AVX2 && is_aligned(d, 4) && is_aligned(a, 4) &&
        is_aligned(b, 4)) {
        if (isa == TDIST__ISA_AVX512) stream_sum_f32_avx512(d, a, b, n);
        else stream_sum_f32_avx2(d, a, b, n);
        _mm_sfence();
        return;
    }
#endif
    alignas(64) unsigned char tmp[CHUNK * 8];
    size_t per = sizeof tmp / esize;
    for (size_t i = 0; i < n; i += per) {
        size_t c = TDIST_MIN(n - i, per);
        reduce_any(tmp, (const unsigned char *)a + i * esize, (const unsigned char *)b + i * esize, c, esize,
                   dtype, op);
        stream_copy((unsigned char *)d + i * esize, tmp, c * esize);
    }
#ifdef HAVE_X86
    _mm_sfence(); /* streamed stores visible before we return */
#endif
}

static void reduce_any(void *d, const void *a, const void *b, size_t n, size_t esize, tdist_dtype_t dtype,
                       tdist_redop_t op)
{
    size_t al = dtype_align(dtype);
    if (is_aligned(d, al) && is_aligned(a, al) && is_aligned(b, al))
        reduce_aligned(d, a, b, n, dtype, op);
    else
        reduce_bounce(d, a, b, n, esize, dtype, op);
}

/* The f32 sum kernel, looked up once (any thread may race to store the
 * same pointer). */
static _Atomic(oop_fn) sum_f32_k;

void tdist__sum_f32(float *dst, const float *a, const float *b, size_t count)
{
    oop_fn f = atomic_load_explicit(&sum_f32_k, memory_order_relaxed);
    if (__builtin_expect(!f, 0)) {
        f = kernel_for(TDIST_F32, TDIST_SUM)->oop;
        atomic_store_explicit(&sum_f32_k, f, memory_order_relaxed);
    }
    f(dst, a, b, count);
}

void tdist__reduce_unchecked(void *dst, const void *a, const void *b, size_t count,
                             tdist_dtype_t dtype, tdist_redop_t op)
{
    if (tdist__sum_few(dst, a, b, count, dtype, op)) return;
    reduce_any(dst, a, b, count, tdist_dtype_size(dtype), dtype, op);
}

static int overlap(const void *p, const void *q, size_t bytes)
{
    uintptr_t x = (uintptr_t)p, y = (uintptr_t)q;
    return x < y + bytes && y < x + bytes;
}

/* Common argument checks for the buffer functions. */
static tdist_status_t check_buf(const char *fn, const void *buf, size_t count, tdist_dtype_t dtype)
{
    if ((unsigned)dtype >= TDIST_DTYPE_COUNT)
        return tdist__error(TDIST_ERR_INVALID_ARG, "%s: invalid dtype %d (valid: 0..%d)", fn,
                            (int)dtype, TDIST_DTYPE_COUNT - 1);
    if (count > SIZE_MAX / tdist_dtype_size(dtype))
        return tdist__error(TDIST_ERR_INVALID_ARG, "%s: count %zu of %s overflows the address space",
                            fn, count, tdist_dtype_name(dtype));
    if (count > 0 && !buf)
        return tdist__error(TDIST_ERR_INVALID_ARG, "%s: NULL buffer with count %zu", fn, count);
    return TDIST_OK;
}

tdist_status_t tdist_reduce(void *dst, const void *a, const void *b, size_t count, tdist_dtype_t dtype,
                            tdist_redop_t op)
{
    TDIST_CHECK(tdist_redop_check(op, dtype));
    if (count > SIZE_MAX / tdist_dtype_size(dtype))
        return tdist__error(TDIST_ERR_INVALID_ARG, "tdist_reduce: count %zu of %s overflows the address space",
                            count, tdist_dtype_name(dtype));
    if (count == 0) return TDIST_OK;
    if (!dst || !a || !b)
        return tdist__error(TDIST_ERR_INVALID_ARG,
                            "tdist_reduce(%s, %s, count %zu): NULL buffer (dst %p, a %p, b %p)",
                            tdist_dtype_name(dtype), tdist_redop_name(op), count, dst, a, b);
    size_t esize = tdist_dtype_size(dtype);
    size_t bytes = count * esize;
    if ((dst != a && overlap(dst, a, bytes)) || (dst != b && overlap(dst, b, bytes)))
        return tdist__error(TDIST_ERR_INVALID_ARG,
                            "tdist_reduce(%s, %s, count %zu): dst partially overlaps an input "
                            "(only dst == a or dst == b may alias)",
                            tdist_dtype_name(dtype), tdist_redop_name(op), count);
    if (dst != a && dst != b && bytes >= tdist__reduce_nt_threshold())
        reduce_streaming(dst, a, b, count, esize, dtype, op);
    else
        reduce_any(dst, a, b, count, esize, dtype, op);
    return TDIST_OK;
}

/* ------------------------------------------------------- scale and divide */

typedef struct unary {
    double factor;   /* scale */
    int64_t divisor; /* divide; 0 means scale */
} unary_t;

static void unary_f32(float *restrict p, size_t n, const unary_t *u)
{
    if (u->divisor) {
        double dv = (double)u->divisor;
        /* correctly rounded: f32 / exact double, rounded once more to f32 */
        for (size_t i = 0; i < n; i++) p[i] = (float)((double)p[i] / dv);
    } else {
        double f = u->factor;
        for (size_t i = 0; i < n; i++) p[i] = (float)((double)p[i] * f);
    }
}

static void unary_f64(double *restrict p, size_t n, const unary_t *u)
{
    if (u->divisor) {
        double dv = (double)u->divisor;
        for (size_t i = 0; i < n; i++) p[i] = p[i] / dv;
    } else {
        double f = u->factor;
        for (size_t i = 0; i < n; i++) p[i] = p[i] * f;
    }
}

/* f16/bf16 computed in f32 (division of an f16/bf16 value by an integer up
 * to 2^24 is then correctly rounded: f32 has more than 2p+2 bits). */
static void unary_half(uint16_t *p, size_t n, tdist_dtype_t dtype, const unary_t *u)
{
    alignas(64) float t[CHUNK];
    int f16 = dtype == TDIST_F16;
    float dv = (float)u->divisor, f = (float)u->factor;
    for (size_t i = 0; i < n; i += CHUNK) {
        size_t c = TDIST_MIN(n - i, (size_t)CHUNK);
        if (f16) tdist__f16_to_f32_k(t, p + i, c);
        else tdist__bf16_to_f32_k(t, p + i, c);
        if (u->divisor)
            for (size_t j = 0; j < c; j++) t[j] = t[j] / dv;
        else
            for (size_t j = 0; j < c; j++) t[j] = t[j] * f;
        if (f16) tdist__f32_to_f16_k(p + i, t, c);
        else tdist__f32_to_bf16_k(p + i, t, c);
    }
}

#define INT_DIVIDE(T, p, n, dv)                                                \
    do {                                                                       \
        T *restrict q_ = (T *)(p);                                             \
        for (size_t i_ = 0; i_ < (n); i_++) q_[i_] = (T)((int64_t)q_[i_] / (dv)); \
    } while (0)

static void unary_aligned(void *p, size_t n, tdist_dtype_t dtype, const unary_t *u)
{
    switch (dtype) {
    case TDIST_F32: unary_f32(p, n, u); break;
    case TDIST_F64: unary_f64(p, n, u); break;
    case TDIST_F16:
    case TDIST_BF16: unary_half(p, n, dtype, u); break;
    case TDIST_I8: INT_DIVIDE(int8_t, p, n, u->divisor); break;
    case TDIST_U8: INT_DIVIDE(uint8_t, p, n, u->divisor); break;
    case TDIST_I32: INT_DIVIDE(int32_t, p, n, u->divisor); break;
    case TDIST_I64: INT_DIVIDE(int64_t, p, n, u->divisor); break;
    default: break;
    }
}

static void unary_run(void *buf, size_t n, tdist_dtype_t dtype, const unary_t *u)
{
    size_t esize = tdist_dtype_size(dtype);
    if (is_aligned(buf, dtype_align(dtype))) {
        unary_aligned(buf, n, dtype, u);
        return;
    }
    alignas(64) unsigned char tmp[CHUNK * 8];
    size_t per = sizeof tmp / esize;
    for (size_t i = 0; i < n; i += per) {
        size_t c = TDIST_MIN(n - i, per);
        unsigned char *p = (unsigned char *)buf + i * esize;
        memcpy(tmp, p, c * esize);
        unary_aligned(tmp, c, dtype, u);
        memcpy(p, tmp, c * esize);
    }
}

tdist_status_t tdist_scale(void *buf, size_t count, tdist_dtype_t dtype, double factor)
{
    TDIST_CHECK(check_buf("tdist_scale", buf, count, dtype));
    if (!tdist_dtype_is_float(dtype))
        return tdist__error(TDIST_ERR_INVALID_ARG,
                            "tdist_scale is defined for floating dtypes only, got %s (use tdist_divide)",
                            tdist_dtype_name(dtype));
    if (count == 0) return TDIST_OK;
    unary_t u = {factor, 0};
    unary_run(buf, count, dtype, &u);
    return TDIST_OK;
}

tdist_status_t tdist_divide(void *buf, size_t count, tdist_dtype_t dtype, int64_t divisor)
{
    TDIST_CHECK(check_buf("tdist_divide", buf, count, dtype));
    if (divisor <= 0)
        return tdist__error(TDIST_ERR_INVALID_ARG, "tdist_divide(%s): divisor must be > 0, got %" PRId64,
                            tdist_dtype_name(dtype), divisor);
    if (count == 0 || divisor == 1) return TDIST_OK;
    unary_t u = {0.0, divisor};
    unary_run(buf, count, dtype, &u);
    return TDIST_OK;
}

/* --------------------------------------------------------- identity fill */

#define FILL(T, p, n, v)                                                       \
    do {                                                                       \
        T v_ = (v);                                                            \
        unsigned char *q_ = (unsigned char *)(p);                              \
        for (size_t i_ = 0; i_ < (n); i_++) memcpy(q_ + i_ * sizeof(T), &v_, sizeof(T)); \
    } while (0)

tdist_status_t tdist_fill_identity(void *buf, size_t count, tdist_dtype_t dtype, tdist_redop_t op)
{
    TDIST_CHECK(tdist_redop_check(op, dtype));
    TDIST_CHECK(check_buf("tdist_fill_identity", buf, count, dtype));
    if (count == 0) return TDIST_OK;
    enum { ZERO, ONE, TOP, BOTTOM, ONES } kind = ZERO;
    switch (op) {
    case TDIST_PROD: kind = ONE; break;
    case TDIST_MIN: kind = TOP; break;
    case TDIST_MAX: kind = BOTTOM; break;
    case TDIST_BAND: kind = ONES; break;
    default: kind = ZERO; break;
    }
    if (kind == ZERO) {
        memset(buf, 0, count * tdist_dtype_size(dtype)); /* 0 / +0.0 in every dtype */
        return TDIST_OK;
    }
    if (kind == ONES) {
        memset(buf, 0xff, count * tdist_dtype_size(dtype));
        return TDIST_OK;
    }
    switch (dtype) {
    case TDIST_F32:
        FILL(float, buf, count, kind == ONE ? 1.0f : kind == TOP ? tdist__f32_from_bits(0x7f800000u)
                                                                : tdist__f32_from_bits(0xff800000u));
        break;
    case TDIST_F64:
        FILL(double, buf, count, kind == ONE ? 1.0 : kind == TOP ? f64_from_bits(0x7ff0000000000000ull)
                                                                : f64_from_bits(0xfff0000000000000ull));
        break;
    case TDIST_F16:
        FILL(uint16_t, buf, count, (uint16_t)(kind == ONE ? 0x3c00u : kind == TOP ? 0x7c00u : 0xfc00u));
        break;
    case TDIST_BF16:
        FILL(uint16_t, buf, count, (uint16_t)(kind == ONE ? 0x3f80u : kind == TOP ? 0x7f80u : 0xff80u));
        break;
    case TDIST_I8: FILL(int8_t, buf, count, (int8_t)(kind == ONE ? 1 : kind == TOP ? INT8_MAX : INT8_MIN)); break;
    case TDIST_U8: FILL(uint8_t, buf, count, (uint8_t)(kind == ONE ? 1 : kind == TOP ? UINT8_MAX : 0)); break;
    case TDIST_I32:
        FILL(int32_t, buf, count, (int32_t)(kind == ONE ? 1 : kind == TOP ? INT32_MAX : INT32_MIN));
        break;
    case TDIST_I64:
        FILL(int64_t, buf, count, (int64_t)(kind == ONE ? 1 : kind == TOP ? INT64_MAX : INT64_MIN));
        break;
    default: break;
    }
    return TDIST_OK;
}
