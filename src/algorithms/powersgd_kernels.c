/*
 * algorithms/powersgd_kernels.c — the arithmetic of PowerSGD: the small
 * matrix products, the Gram-Schmidt orthogonalisation and the generator of
 * the random initial Q matrices. Plain loops (libtdist depends on no BLAS).
 *
 * The orders of operations are PyTorch 1.13's on x86-64 with AVX2 and
 * OpenBLAS Haswell (the reference's machine), so tdist rounds where PyTorch
 * rounds:
 *   - products (torch.bmm / matmul): a product whose contraction x rows x
 *     columns is below 400 takes ATen's naive kernel, acc = fl(acc +
 *     fl(a * b)) over k in increasing order; a larger one, and every 2-D
 *     matmul (the batched hook), OpenBLAS's sgemm: a fmaf chain over k in
 *     increasing order from 0;
 *   - norm of a column: for a contiguous column (rank 1) ATen's vectorised
 *     norm (8 lanes of fmaf, then the tail as rounded squares in groups of
 *     4 and fmaf for the last n % 4); for a strided column a sequential
 *     fmaf chain; then sqrtf;
 *   - the dot products of Gram-Schmidt: ATen's cascade sum of the rounded
 *     products (4 accumulators of 8 lanes, levels of 16 rows, the scalar
 *     tail first, then the lanes);
 *   - col / norm as an IEEE division (not a multiplication by 1 / norm).
 * Compiled without contraction of a * b + c (ISO C mode, no -mfma), so
 * every fl() above is a rounding. The large products have AVX-512 forms
 * (chosen at run time, core's instruction-set switch) that keep every
 * chain and only change which chains advance together, so that the
 * matrix is read in long contiguous runs.
 *
 * The generator: a counter-based one, so that every rank draws the same
 * values without communicating and independently of bucket layouts.
 * Draw d (the hook's iteration count when the Q is drawn) of tensor key t
 * (the parameter index, or the bucket index for the batched hook), element
 * e — so a parameter's Q does not depend on the bucket layout:
 *     s  = splitmix64(seed ^ splitmix64(d * 2^32 + t))
 *     u1 = (top 53 bits of splitmix64(s + 2e) + 1) / 2^53      (0, 1]
 *     u2 = (top 53 bits of splitmix64(s + 2e + 1)) / 2^53      [0, 1)
 *     z  = (float)(sqrt(-2 ln u1) * cos(2 pi u2))              (Box-Muller)
 * standard normal values, as torch.randn gives (not the same ones).
 */
#include <math.h>
#include <stdatomic.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#include "algorithms/internal.h"
#include "core/kernels.h"

/* ------------------------------------------------------------ products */

static int use_naive(size_t n, size_t k, size_t m, bool blas_only)
{
    return !blas_only && (double)n * (double)k * (double)m < 400.0;
}

/* The fmaf chains of a large product, with the processor's FMA
 * instruction (the C library's fmaf is a call per multiply-add): eight
 * independent chains at a time, each still over k in increasing order from
 * 0, so every element is the same correctly rounded chain as fmaf's. */
#if defined(__x86_64__) || defined(__i386__)
#define GEMM_FMA_TARGET __attribute__((target("fma")))
#else
#define GEMM_FMA_TARGET
#endif
#define GEMM_ROWS 8

/* Eight columns' chains of row i at a time (wide outputs: the product of
 * the decompression, P Q^T, whose k is the rank). */
GEMM_FMA_TARGET static void gemm_row_chains(float *c, const float *a, const float *b, size_t n,
                                            size_t k, size_t m, int ta, int tb)
{
    for (size_t i = 0; i < n; i++)
        for (size_t j0 = 0; j0 < m; j0 += GEMM_ROWS) {
            size_t cols = m - j0 < GEMM_ROWS ? m - j0 : GEMM_ROWS;
            float acc[GEMM_ROWS] = {0};
            for (size_t kk = 0; kk < k; kk++) {
                float x = ta ? a[kk * n + i] : a[i * k + kk];
                for (size_t t = 0; t < cols; t++) {
                    float y = tb ? b[(j0 + t) * k + kk] : b[kk * m + j0 + t];
                    acc[t] = __builtin_fmaf(x, y, acc[t]);
                }
            }
            memcpy(c + i * m + j0, acc, cols * sizeof *acc);
        }
}

/* Eight rows' chains of every column at a time (narrow outputs: P = M Q
 * and Q = M^T P, whose m is the rank, at most GEMM_ROWS here), so M is
 * read once whatever the rank. */
GEMM_FMA_TARGET static void gemm_col_chains(float *c, const float *a, const float *b, size_t n,
                                            size_t k, size_t m, int ta, int tb)
{
    for (size_t i0 = 0; i0 < n; i0 += GEMM_ROWS) {
        size_t rows = n - i0 < GEMM_ROWS ? n - i0 : GEMM_ROWS;
        float acc[GEMM_ROWS][GEMM_ROWS] = {{0}}; /* [column][row] */
        for (size_t kk = 0; kk < k; kk++) {
            float x[GEMM_ROWS];
            for (size_t t = 0; t < rows; t++) x[t] = ta ? a[kk * n + i0 + t] : a[(i0 + t) * k + kk];
            for (size_t j = 0; j < m; j++) {
                float y = tb ? b[j * k + kk] : b[kk * m + j];
                for (size_t t = 0; t < rows; t++) acc[j][t] = __builtin_fmaf(x[t], y, acc[j][t]);
            }
        }
        for (size_t t = 0; t < rows; t++)
            for (size_t j = 0; j < m; j++) c[(i0 + t) * m + j] = acc[j][t];
    }
}

/* One column (rank 1): eight rows' chains at a time, the loads inline so
 * the compiler vectorises the contiguous (transposed) case. */
GEMM_FMA_TARGET static void gemm_col1_chains(float *c, const float *a, const float *b, size_t n,
                                             size_t k, int ta)
{
    for (size_t i0 = 0; i0 < n; i0 += GEMM_ROWS) {
        size_t rows = n - i0 < GEMM_ROWS ? n - i0 : GEMM_ROWS;
        float acc[GEMM_ROWS] = {0};
        for (size_t kk = 0; kk < k; kk++) {
            float y = b[kk]; /* one column: b(kk, 0) is b[kk] stored either way */
            if (ta) {
                const float *x = a + kk * n + i0;
                for (size_t t = 0; t < rows; t++) acc[t] = __builtin_fmaf(x[t], y, acc[t]);
            } else {
                const float *x = a + i0 * k + kk;
                for (size_t t = 0; t < rows; t++) acc[t] = __builtin_fmaf(x[t * k], y, acc[t]);
            }
        }
        memcpy(c + i0, acc, rows * sizeof *acc);
    }
}

#if defined(__x86_64__) && defined(__GNUC__)
/* AVX-512 forms of the three large products, the same chains (each
 * element a fmaf chain over k in increasing order from 0), with the work
 * laid out so that memory is read in long contiguous runs: */
#define ATTR_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma")))
#define IBLOCK 512 /* outputs per block of the wide kernels (stack: 8 x 2 KiB) */

/* c (n x m, m <= GEMM_ROWS) = a^T b, a stored k x n, b k x m: every row
 * kk of a is read contiguously once per block of IBLOCK outputs; the
 * block's chains (column j of the output in acc[j]) advance by one kk. */
ATTR_AVX512 static void gemm_tn_narrow_avx512(float *c, const float *a, const float *b, size_t n,
                                              size_t k, size_t m)
{
    float acc[GEMM_ROWS][IBLOCK] __attribute__((aligned(64)));
    for (size_t i0 = 0; i0 < n; i0 += IBLOCK) {
        const size_t w = n - i0 < IBLOCK ? n - i0 : IBLOCK, wv = w / 16 * 16;
        const __mmask16 tail = (__mmask16)((1u << (w - wv)) - 1u);
        for (size_t j = 0; j < m; j++) memset(acc[j], 0, w * sizeof(float));
        for (size_t kk = 0; kk < k; kk++) {
            const float *x = a + kk * n + i0;
            for (size_t j = 0; j < m; j++) {
                const __m512 y = _mm512_set1_ps(b[kk * m + j]);
                float *ac = acc[j];
                size_t i = 0;
                for (; i < wv; i += 16)
                    _mm512_store_ps(ac + i, _mm512_fmadd_ps(_mm512_loadu_ps(x + i), y,
                                                            _mm512_load_ps(ac + i)));
                if (tail)
                    _mm512_mask_storeu_ps(ac + i, tail,
                                          _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, x + i), y,
                                                          _mm512_maskz_loadu_ps(tail, ac + i)));
            }
        }
        for (size_t i = 0; i < w; i++)
            for (size_t j = 0; j < m; j++) c[(i0 + i) * m + j] = acc[j][i];
    }
}

/* 16 x 16 transpose in registers: r[t] (row t) becomes column t. */
ATTR_AVX512 static void transpose16(__m512 r[16])
{
    __m512 t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_shuffle_ps(t[i], t[i + 2], 0x44);
        r[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], 0xee);
        r[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        r[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0xee);
    }
    for (int h = 0; h < 16; h += 8)
        for (int i = 0; i < 4; i++) {
            t[h + i] = _mm512_shuffle_f32x4(r[h + i], r[h + i + 4], 0x88);
            t[h + i + 4] = _mm512_shuffle_f32x4(r[h + i], r[h + i + 4], 0xdd);
        }
    for (int i = 0; i < 8; i++) {
        r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
        r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xdd);
    }
}

/* c (n x m, m <= GEMM_ROWS) = a b, a stored n x k: sixteen rows of a at a
 * time, each read contiguously; a 16 x 16 tile transposed in registers
 * gives, for each kk in turn, the sixteen rows' a(i, kk) in one vector. */
ATTR_AVX512 static void gemm_nn_narrow_avx512(float *c, const float *a, const float *b, size_t n,
                                              size_t k, size_t m)
{
    const size_t kv = k / 16 * 16;
    size_t i0 = 0;
    for (; i0 + 16 <= n; i0 += 16) {
        __m512 acc[GEMM_ROWS];
        for (size_t j = 0; j < m; j++) acc[j] = _mm512_setzero_ps();
        for (size_t k0 = 0; k0 < kv; k0 += 16) {
            __m512 r[16];
            for (int t = 0; t < 16; t++) r[t] = _mm512_loadu_ps(a + (i0 + (size_t)t) * k + k0);
            transpose16(r);
            for (int t = 0; t < 16; t++)
                for (size_t j = 0; j < m; j++)
                    acc[j] = _mm512_fmadd_ps(r[t], _mm512_set1_ps(b[(k0 + (size_t)t) * m + j]), acc[j]);
        }
        float out[GEMM_ROWS][16];
        for (size_t j = 0; j < m; j++) _mm512_storeu_ps(out[j], acc[j]);
        for (size_t kk = kv; kk < k; kk++) /* the tail of every chain, in order */
            for (size_t t = 0; t < 16; t++)
                for (size_t j = 0; j < m; j++)
                    out[j][t] = __builtin_fmaf(a[(i0 + t) * k + kk], b[kk * m + j], out[j][t]);
        for (size_t t = 0; t < 16; t++)
            for (size_t j = 0; j < m; j++) c[(i0 + t) * m + j] = out[j][t];
    }
    for (; i0 < n; i0++) /* the last rows, one chain each */
        for (size_t j = 0; j < m; j++) {
            float s = 0.0f;
            for (size_t kk = 0; kk < k; kk++) s = __builtin_fmaf(a[i0 * k + kk], b[kk * m + j], s);
            c[i0 * m + j] = s;
        }
}

/* c (n x m) = a b^T with a small k (the decompression P Q^T: k is the
 * rank), a stored n x k, b stored m x k: a block of IBLOCK columns of b
 * transposed onto the stack, then every row's block written contiguously. */
ATTR_AVX512 static void gemm_nt_wide_avx512(float *c, const float *a, const float *b, size_t n,
                                            size_t k, size_t m)
{
    float bt[GEMM_ROWS][IBLOCK] __attribute__((aligned(64)));
    for (size_t j0 = 0; j0 < m; j0 += IBLOCK) {
        const size_t w = m - j0 < IBLOCK ? m - j0 : IBLOCK, wv = w / 16 * 16;
        const __mmask16 tail = (__mmask16)((1u << (w - wv)) - 1u);
        for (size_t j = 0; j < w; j++)
            for (size_t kk = 0; kk < k; kk++) bt[kk][j] = b[(j0 + j) * k + kk];
        for (size_t i = 0; i < n; i++) {
            float *ci = c + i * m + j0;
            size_t j = 0;
            for (; j < wv; j += 16) {
                __m512 s = _mm512_setzero_ps();
                for (size_t kk = 0; kk < k; kk++)
                    s = _mm512_fmadd_ps(_mm512_set1_ps(a[i * k + kk]), _mm512_load_ps(bt[kk] + j), s);
                _mm512_storeu_ps(ci + j, s);
            }
            if (tail) {
                __m512 s = _mm512_setzero_ps();
                for (size_t kk = 0; kk < k; kk++)
                    s = _mm512_fmadd_ps(_mm512_set1_ps(a[i * k + kk]),
                                        _mm512_maskz_loadu_ps(tail, bt[kk] + j), s);
                _mm512_mask_storeu_ps(ci + j, tail, s);
            }
        }
    }
}

/* The AVX-512 form of a large product when there is one (returns 1). */
static int gemm_avx512(float *c, const float *a, const float *b, size_t n, size_t k, size_t m,
                       int ta, int tb)
{
    if (tdist__get_isa() != TDIST__ISA_AVX512) return 0;
    if (m <= GEMM_ROWS && ta && !tb) {
        gemm_tn_narrow_avx512(c, a, b, n, k, m);
        return 1;
    }
    if (m <= GEMM_ROWS && !ta && !tb) {
        gemm_nn_narrow_avx512(c, a, b, n, k, m);
        return 1;
    }
    if (k <= GEMM_ROWS && !ta && tb) {
        gemm_nt_wide_avx512(c, a, b, n, k, m);
        return 1;
    }
    return 0;
}
#else
static int gemm_avx512(float *c, const float *a, const float *b, size_t n, size_t k, size_t m,
                       int ta, int tb)
{
    (void)c, (void)a, (void)b, (void)n, (void)k, (void)m, (void)ta, (void)tb;
    return 0;
}
#endif

static int have_fma(void)
{
#if defined(__x86_64__) || defined(__i386__)
    static _Atomic int known = -1; /* every thread computes the same value */
    int v = atomic_load_explicit(&known, memory_order_relaxed);
    if (v < 0) {
        v = __builtin_cpu_supports("fma") ? 1 : 0;
        atomic_store_explicit(&known, v, memory_order_relaxed);
    }
    return v;
#else
    return 0;
#endif
}

void tdist__psgd_gemm(float *c, const float *a, const float *b, size_t n, size_t k, size_t m,
                      int ta, int tb, bool blas_only)
{
    /* a(i, kk) = ta ? a[kk * n + i] : a[i * k + kk];
     * b(kk, j) = tb ? b[j * k + kk] : b[kk * m + j] */
    const int naive = use_naive(n, k, m, blas_only);
    if (!naive && have_fma()) {
        if (gemm_avx512(c, a, b, n, k, m, ta, tb)) return;
        if (m >= GEMM_ROWS)
            gemm_row_chains(c, a, b, n, k, m, ta, tb);
        else if (m == 1)
            gemm_col1_chains(c, a, b, n, k, ta);
        else
            gemm_col_chains(c, a, b, n, k, m, ta, tb);
        return;
    }
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < m; j++) {
            float acc = 0.0f;
            for (size_t kk = 0; kk < k; kk++) {
                float x = ta ? a[kk * n + i] : a[i * k + kk];
                float y = tb ? b[j * k + kk] : b[kk * m + j];
                if (naive) {
                    float p = x * y;
                    acc = acc + p;
                } else {
                    acc = fmaf(x, y, acc);
                }
            }
            c[i * m + j] = acc;
        }
}

/* ------------------------------------------------------------ reductions */

static unsigned ceil_log2(size_t x)
{
    if (x <= 2) return 1;
    unsigned b = 0;
    for (size_t v = x - 1; v; v >>= 1) b++;
    return b;
}

/* ATen's row_sum over nv vectors of w lanes (w = 8: vectors; w = 1:
 * scalars): 4 interleaved accumulators over rows of 4 vectors, with the
 * cascade levels of multi_row_sum; leftover vectors into accumulator 0;
 * then ((a0 + a1) + a2) + a3, lane by lane, into out[0..w). */
static void row_sum(const float *x, size_t nv, size_t w, float *out)
{
    float acc[4][4][8];
    memset(acc, 0, sizeof acc);
    const size_t rows = nv / 4;
    unsigned lp = ceil_log2(rows) / 4;
    if (lp < 4) lp = 4;
    const size_t step = (size_t)1 << lp, mask = step - 1;
    size_t i = 0;
    while (i + step <= rows) {
        for (size_t j = 0; j < step; j++, i++)
            for (size_t k = 0; k < 4; k++)
                for (size_t l = 0; l < w; l++) acc[0][k][l] += x[(4 * i + k) * w + l];
        for (size_t j = 1; j < 4; j++) {
            for (size_t k = 0; k < 4; k++)
                for (size_t l = 0; l < w; l++) {
                    acc[j][k][l] += acc[j - 1][k][l];
                    acc[j - 1][k][l] = 0.0f;
                }
            if ((i & (mask << (j * lp))) != 0) break;
        }
    }
    for (; i < rows; i++)
        for (size_t k = 0; k < 4; k++)
            for (size_t l = 0; l < w; l++) acc[0][k][l] += x[(4 * i + k) * w + l];
    for (size_t j = 1; j < 4; j++)
        for (size_t k = 0; k < 4; k++)
            for (size_t l = 0; l < w; l++) acc[0][k][l] += acc[j][k][l];
    for (size_t v = rows * 4; v < nv; v++)
        for (size_t l = 0; l < w; l++) acc[0][0][l] += x[v * w + l];
    for (size_t k = 1; k < 4; k++)
        for (size_t l = 0; l < w; l++) acc[0][0][l] += acc[0][k][l];
    memcpy(out, acc[0][0], w * sizeof *out);
}

float tdist__psgd_sum(const float *x, size_t n)
{
    float lanes[8];
    if (n < 8) {
        row_sum(x, n, 1, lanes);
        return 0.0f + lanes[0];
    }
    const size_t nv = n / 8;
    row_sum(x, nv, 8, lanes);
    float s = 0.0f;
    for (size_t i = nv * 8; i < n; i++) s += x[i];
    for (size_t l = 0; l < 8; l++) s += lanes[l];
    return 0.0f + s;
}

/* Euclidean norm of x[0], x[stride], ...: ATen's orders (see the top). */
static float column_norm(const float *x, size_t n, size_t stride)
{
    float s = 0.0f;
    if (stride != 1) {
        for (size_t i = 0; i < n; i++) s = fmaf(x[i * stride], x[i * stride], s);
        return sqrtf(s);
    }
    float lane[8] = {0};
    const size_t full = n / 8 * 8;
    for (size_t i = 0; i < full; i += 8)
        for (size_t j = 0; j < 8; j++) lane[j] = fmaf(x[i + j], x[i + j], lane[j]);
    for (size_t j = 0; j < 8; j++) s += lane[j];
    const size_t groups = full + (n - full) / 4 * 4;
    for (size_t i = full; i < groups; i++) {
        float sq = x[i] * x[i];
        s += sq;
    }
    for (size_t i = groups; i < n; i++) s = fmaf(x[i], x[i], s);
    return sqrtf(s);
}

/* ------------------------------------------------------- Gram-Schmidt */

void tdist__psgd_orthogonalize(float *a, size_t rows, size_t r, float eps, bool keep_zero,
                               float *tmp)
{
    for (size_t c = 0; c < r; c++) {
        float nrm = column_norm(a + c, rows, r);
        if (keep_zero && nrm == 0.0f) continue;
        if (eps != 0.0f) nrm = nrm + eps;
        for (size_t i = 0; i < rows; i++) a[i * r + c] = a[i * r + c] / nrm;
        for (size_t d = c + 1; d < r; d++) {
            for (size_t i = 0; i < rows; i++) tmp[i] = a[i * r + c] * a[i * r + d];
            float dot = tdist__psgd_sum(tmp, rows);
            for (size_t i = 0; i < rows; i++) {
                float p = dot * a[i * r + c];
                a[i * r + d] = a[i * r + d] - p;
            }
        }
    }
}

/* ---------------------------------------------------------- generator */

static uint64_t splitmix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

void tdist__psgd_randn(float *out, size_t n, uint64_t seed, uint64_t draw, uint64_t key)
{
    const double two_pi = 6.283185307179586476925286766559;
    uint64_t s = splitmix64(seed ^ splitmix64((draw << 32) + key));
    for (size_t e = 0; e < n; e++) {
        double u1 = (double)((splitmix64(s + 2 * e) >> 11) + 1) * 0x1p-53;
        double u2 = (double)(splitmix64(s + 2 * e + 1) >> 11) * 0x1p-53;
        out[e] = (float)(sqrt(-2.0 * log(u1)) * cos(two_pi * u2));
    }
}
