/* tests/algorithms/test_hook_kernels.c — the fused element passes of the
 * 16-bit compression hook (core/wire16.c, which the all_reduce over a
 * 16-bit wire shares) and of the int8 hook (algorithms/hook_kernels.c)
 * on every instruction-set path this CPU has (generic, AVX2, AVX-512),
 * bit for bit against references written here from the rules (scalar
 * code, core's scalar converters, the C library's roundf), on large
 * buffers so that every vector loop and its tail run:
 *  - the hook cast wire(fl(float(wire(g)) / W)) with c10's NaN, over
 *    about a million f32 bit patterns of both signs (every 4099th of 2^32,
 *    so NaN payloads, infinities, subnormals and ties all occur) and six
 *    divisors (powers of two take a multiply: the same bits);
 *  - int8 quantisation (scales, codes, residuals, the count of values that
 *    are not finite) and dequantisation (plain and adding), over blocks of
 *    ordinary values, exact ties of the rounding, non-finite values, all
 *    zero blocks, blocks whose scale underflows to 0, and several block
 *    sizes (tails shorter than a vector). */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "algorithms/internal.h"
#include "compress_ref.h"
#include "core/kernels.h"
#include "harness.h"

static const tdist__isa_t isas[] = {TDIST__ISA_GENERIC, TDIST__ISA_AVX2, TDIST__ISA_AVX512};
#define NISA (sizeof isas / sizeof isas[0])

TEST(hook_kernels_hook16_every_path, 120)
{
    const size_t n = (size_t)(UINT32_MAX / 4099u) + 1 + 37; /* + 37: an odd tail */
    float *g = malloc(n * sizeof *g);
    uint16_t *got = malloc(n * sizeof *got), *want = malloc(n * sizeof *want);
    ASSERT_TRUE(g && got && want);
    for (size_t i = 0; i < n; i++) g[i] = f32_of((uint32_t)(i * 4099u));
    const int64_t divisors[] = {1, 2, 3, 4, 7, 1024}; /* powers of two multiply */
    for (size_t w = 0; w < 2; w++) {
        tdist_dtype_t wire = w ? TDIST_BF16 : TDIST_F16;
        for (size_t d = 0; d < sizeof divisors / sizeof *divisors; d++) {
            for (size_t i = 0; i < n; i++) want[i] = ref_hook16(g[i], divisors[d], wire);
            for (size_t k = 0; k < NISA; k++) {
                tdist__isa_t isa = tdist__set_isa(isas[k]);
                if (isa != isas[k]) continue; /* this CPU lacks it */
                memset(got, 0xa5, n * sizeof *got);
                tdist__wire16_pack(got, g, n, (float)divisors[d], wire);
                for (size_t i = 0; i < n; i++)
                    if (got[i] != want[i])
                        FAIL("%s %s / %lld, element %zu (0x%08x): got 0x%04x, want 0x%04x",
                             tdist__isa_name(isa), tdist_dtype_name(wire),
                             (long long)divisors[d], i, bits32(g[i]), got[i], want[i]);
            }
        }
    }
    tdist__set_isa(tdist__best_isa());
    free(g);
    free(got);
    free(want);
}

/* ----------------------------------------------------------------- int8 */

/* The rules, scalar and plain (roundf for the rounding). */
static size_t ref_quantise(int8_t *codes, float *scales, const float *src, float *resid, size_t n,
                           size_t block)
{
    size_t bad = 0;
    for (size_t b0 = 0, k = 0; b0 < n; b0 += block, k++) {
        size_t m = n - b0 < block ? n - b0 : block;
        float mx = 0.0f;
        for (size_t i = b0; i < b0 + m; i++)
            if (isfinite(src[i]) && fabsf(src[i]) > mx) mx = fabsf(src[i]);
        float s = mx / 127.0f;
        scales[k] = s;
        for (size_t i = b0; i < b0 + m; i++) {
            float x = src[i];
            int c;
            if (!isfinite(x)) {
                c = -128;
                bad++;
            } else if (s == 0.0f) {
                c = 0;
            } else {
                float q = roundf(x / s);
                c = q > 127.0f ? 127 : q < -127.0f ? -127 : (int)q;
            }
            codes[i] = (int8_t)c;
            if (resid) resid[i] = c == -128 ? 0.0f : x - (float)c * s;
        }
    }
    return bad;
}

static uint64_t rng = 0x9e3779b97f4a7c15ULL;
static uint32_t next32(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}

/* Blocks of kinds: ordinary magnitudes, exact ties (scale 1), specials,
 * zeros, a scale that underflows to 0. */
static void fill_int8_input(float *x, size_t n, size_t block)
{
    for (size_t b0 = 0, k = 0; b0 < n; b0 += block, k++) {
        size_t m = n - b0 < block ? n - b0 : block;
        for (size_t i = 0; i < m; i++) {
            float u = (float)(next32() % 2000001u) / 1e6f - 1.0f; /* [-1, 1] */
            float *v = &x[b0 + i];
            switch (k % 6) {
            case 0: *v = u * powf(10.0f, (float)((int)(next32() % 9u) - 6)); break;
            case 1: *v = i == 0 ? 127.0f : (float)((int)(next32() % 254u) - 127) + 0.5f * (float)(next32() % 2u); break;
            case 2: {
                static const uint32_t sp[] = {0x7fc00000u, 0xff800000u, 0x7f800000u, 0x7f800001u,
                                              0x80000000u, 0x00000001u, 0x7f7fffffu};
                *v = next32() % 3u ? u : f32_of(sp[next32() % 7u]);
                break;
            }
            case 3: *v = next32() % 2u ? 0.0f : -0.0f; break;
            case 4: *v = f32_of(next32() % 64u); break; /* max 63 * 2^-149: s underflows to 0 */
            default: *v = u * 1e3f; break;
            }
        }
    }
}

static void check_int8(size_t n, size_t block)
{
    size_t nb = n / block + (n % block != 0);
    float *x = malloc(n * sizeof *x), *want_res = malloc(n * sizeof *x), *got_res = malloc(n * sizeof *x);
    float *want_s = malloc(nb * sizeof *want_s), *got_s = malloc(nb * sizeof *got_s);
    int8_t *want_c = malloc(n), *got_c = malloc(n);
    float *want_d = malloc(n * sizeof *x), *got_d = malloc(n * sizeof *x);
    ASSERT_TRUE(x && want_res && got_res && want_s && got_s && want_c && got_c && want_d && got_d);
    fill_int8_input(x, n, block);
    size_t want_bad = ref_quantise(want_c, want_s, x, want_res, n, block);
    for (size_t k = 0; k < NISA; k++) {
        tdist__isa_t isa = tdist__set_isa(isas[k]);
        if (isa != isas[k]) continue;
        memcpy(got_res, x, n * sizeof *x); /* in place, as the hook's error feedback does */
        size_t bad = tdist__int8_quantise(got_c, (unsigned char *)got_s, got_res, got_res, n, block);
        ASSERT_EQ(bad, want_bad);
        ASSERT_TRUE(memcmp(got_s, want_s, nb * sizeof *got_s) == 0);
        for (size_t i = 0; i < n; i++)
            if (got_c[i] != want_c[i] || bits32(got_res[i]) != bits32(want_res[i]))
                FAIL("%s block %zu element %zu (x 0x%08x, scale %g): code %d residual 0x%08x, "
                     "want %d 0x%08x", tdist__isa_name(isa), block, i, bits32(x[i]),
                     (double)want_s[i / block], got_c[i], bits32(got_res[i]), want_c[i],
                     bits32(want_res[i]));
        ASSERT_EQ(tdist__int8_quantise(got_c, (unsigned char *)got_s, x, NULL, n, block), want_bad);
        for (int add = 0; add < 2; add++) {
            for (size_t i = 0; i < n; i++) want_d[i] = got_d[i] = add ? x[i] : 0.0f;
            for (size_t i = 0; i < n; i++) {
                float v = want_c[i] == -128 ? NAN : (float)want_c[i] * want_s[i / block];
                want_d[i] = add ? want_d[i] + v : v;
            }
            tdist__int8_dequantise(got_d, want_c, (const unsigned char *)want_s, n, block, add);
            for (size_t i = 0; i < n; i++)
                if (isnan(want_d[i]) ? !isnan(got_d[i]) : bits32(got_d[i]) != bits32(want_d[i]))
                    FAIL("%s dequantise (add %d) block %zu element %zu: got %.9g, want %.9g",
                         tdist__isa_name(isa), add, block, i, (double)got_d[i], (double)want_d[i]);
        }
    }
    tdist__set_isa(tdist__best_isa());
    free(x);
    free(want_res);
    free(got_res);
    free(want_s);
    free(got_s);
    free(want_c);
    free(got_c);
    free(want_d);
    free(got_d);
}

TEST(hook_kernels_int8_every_path, 120)
{
    check_int8(300007, 256); /* the default block; a short last block */
    check_int8(50021, 7);    /* blocks shorter than a vector */
    check_int8(40000, 100);  /* a vector tail in every block */
    check_int8(33, 4096);    /* one block shorter than its size */
}

/* ------------------------------------------------- PowerSGD's products */

/* The definition of a large product: a fmaf chain over k from 0. */
static void ref_gemm(float *c, const float *a, const float *b, size_t n, size_t k, size_t m,
                     int ta, int tb)
{
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < m; j++) {
            float acc = 0.0f;
            for (size_t kk = 0; kk < k; kk++)
                acc = fmaf(ta ? a[kk * n + i] : a[i * k + kk], tb ? b[j * k + kk] : b[kk * m + j], acc);
            c[i * m + j] = acc;
        }
}

/* The three shapes PowerSGD multiplies (P = M Q, Q = M^T P, P Q^T) with
 * sizes around the vector width and the kernels' blocks, every rank up to
 * 8, and inputs whose products do not round alike in another order. */
TEST(hook_kernels_psgd_products_every_path, 120)
{
    static const size_t sizes[][2] = {{1, 1}, {15, 17}, {16, 16}, {33, 47}, {600, 31}, {1031, 529}};
    const size_t maxe = 1031 * 529;
    float *m = malloc(maxe * sizeof *m), *p = malloc(1031 * 8 * sizeof *p), *q = malloc(1031 * 8 * sizeof *q);
    float *got = malloc(maxe * sizeof *got), *want = malloc(maxe * sizeof *want);
    ASSERT_TRUE(m && p && q && got && want);
    for (size_t i = 0; i < maxe; i++) m[i] = (float)((int)(next32() % 2000001u) - 1000000) * 1.37e-6f;
    for (size_t i = 0; i < 1031 * 8; i++) {
        p[i] = (float)((int)(next32() % 2001u) - 1000) * 3.1e-3f;
        q[i] = (float)((int)(next32() % 2001u) - 1000) * 7.3e-4f;
    }
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
        for (size_t r = 1; r <= 8; r++)
            for (int form = 0; form < 3; form++) {
                size_t rows = sizes[s][0], cols = sizes[s][1];
                /* form 0: P (rows x r) = M Q; 1: Q (cols x r) = M^T P; 2: M = P Q^T */
                size_t n = form == 1 ? cols : rows, k = form == 0 ? cols : form == 1 ? rows : r;
                size_t mm = form == 2 ? cols : r;
                const float *a = form == 2 ? p : m, *b = form == 1 ? p : q;
                int ta = form == 1, tb = form == 2;
                ref_gemm(want, a, b, n, k, mm, ta, tb);
                for (size_t i = 0; i < NISA; i++) {
                    tdist__isa_t isa = tdist__set_isa(isas[i]);
                    if (isa != isas[i]) continue;
                    memset(got, 0xa5, n * mm * sizeof *got);
                    tdist__psgd_gemm(got, a, b, n, k, mm, ta, tb, true);
                    for (size_t e = 0; e < n * mm; e++)
                        if (bits32(got[e]) != bits32(want[e]))
                            FAIL("%s form %d %zu x %zu rank %zu: element %zu got %.9g, want %.9g",
                                 tdist__isa_name(isa), form, rows, cols, r, e, (double)got[e],
                                 (double)want[e]);
                }
            }
    tdist__set_isa(tdist__best_isa());
    free(m);
    free(p);
    free(q);
    free(got);
    free(want);
}
