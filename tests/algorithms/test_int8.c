/* tests/algorithms/test_int8.c — the int8 quantised all_reduce hook,
 * called directly on hand-made buckets (test_int8_ddp.c runs it under the
 * reducer).
 *
 * 1. Quantisation alone: the round-trip error of every value is at most
 *    half its block's scale; scales, half-away rounding, zero blocks,
 *    NaN/inf marked with code -128, uneven last blocks.
 * 2. The hook on 1, 3 and 4 ranks, bucket sizes that W divides and does
 *    not, smaller than W, empty: every element within the stated bound of
 *    the float64 average, (sum_r s_r / 2) / divisor + s_f / 2 (s_r: rank
 *    r's scale of the element's block, s_f: the scale of the block of the
 *    average); the result bit-identical on every rank; bytes counted
 *    <= 1/3 of an f32 ring all_reduce's.
 * 3. NaN and inf inputs: those elements (only those) are NaN everywhere.
 * 4. Error feedback: the sum over 24 steps of the averaged gradients is
 *    closer to the exact sum with the input's feedback, and much closer
 *    with the input's and the average's.
 * 5. Option and call errors, before any communication.
 * 6. The bytes on the wire, counted on a private loopback interface:
 *    the hook against an f32 all_reduce of the same bucket over TCP. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "harness.h"
#include "loopback.h"
#include "tdist/algorithms.h"

static void open_world(tdist_world_t **w, tdist_pg_t **pg, const char *transport)
{
    ASSERT_OK(tdist_init("env://", NULL, w));
    tdist_pg_opts_t o;
    tdist_pg_opts_init(&o);
    o.timeout_ms = (int64_t)(20000 * tdist_test_timeout_mult());
    o.transport = transport;
    ASSERT_OK(tdist_pg_create_world(*w, &o, pg));
}

/* Run the hook and its chain as the reducer does. */
static void drive(tdist_int8_t *st, const tdist_ddp_bucket_t *b)
{
    tdist_ddp_hook_result_t r = {0};
    ASSERT_OK(tdist_int8_hook(st, b, &r));
    while (r.work || r.then) {
        if (r.work) {
            ASSERT_OK(tdist_work_wait(r.work, -1));
            tdist_work_free(r.work);
        }
        tdist_ddp_then_fn fn = r.then;
        memset(&r, 0, sizeof r);
        if (fn) ASSERT_OK(fn(st, b, &r));
    }
}

static size_t idx0 = 0, off0 = 0;

/* A one-parameter bucket of n f32 values at buf. */
static tdist_ddp_bucket_t bucket_of(tdist_pg_t *pg, float *buf, const size_t *n, uint64_t it)
{
    tdist_ddp_bucket_t b;
    memset(&b, 0, sizeof b);
    b.num_buckets = 1;
    b.is_last = true;
    b.buffer = buf;
    b.count = *n;
    b.dtype = TDIST_F32;
    b.num_params = 1;
    b.param_indices = &idx0;
    b.offsets = &off0;
    b.counts = n;
    b.iteration = it;
    b.divisor = tdist_pg_size(pg);
    b.pg = pg;
    return b;
}

/* Rank r's gradient element i in step k: magnitudes 1e-3 .. 1e1 mixed
 * inside blocks, and whole zero blocks (elements 256 .. 511). */
static float grad(int r, int k, size_t i)
{
    if (i >= 256 && i < 512) return 0.0f;
    double mag = pow(10.0, (double)((int)((i * 7) % 5) - 3));
    return (float)(mag * sin(0.9 * r + 0.31 * k + 0.017 * (double)i + 0.2));
}

/* ================================================ 1. quantisation alone */

static void round_trip(size_t n, size_t block)
{
    float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y);
    int8_t *q = malloc(n);
    size_t nb = (n + block - 1) / block;
    float *s = malloc((nb ? nb : 1) * sizeof *s);
    ASSERT_TRUE(x && y && q && s);
    for (size_t i = 0; i < n; i++) x[i] = grad(1, 2, i);
    ASSERT_OK(tdist_int8_quantize(q, s, x, n, block));
    ASSERT_OK(tdist_int8_dequantize(y, q, s, n, block));
    for (size_t b = 0; b < nb; b++) {
        double m = 0;
        int top = 0;
        for (size_t i = b * block; i < n && i < (b + 1) * block; i++) {
            m = fmax(m, fabs((double)x[i]));
            top = abs(q[i]) > top ? abs(q[i]) : top;
        }
        if (fabs((double)s[b] - m / 127.0) > m / 127.0 * 1e-6) FAIL("block %zu: scale %.9g, max %.9g", b, s[b], m);
        ASSERT_EQ(top, m > 0 ? 127 : 0); /* the largest value gets the largest code */
        for (size_t i = b * block; i < n && i < (b + 1) * block; i++) {
            double err = fabs((double)x[i] - (double)y[i]);
            if (err > (double)s[b] / 2 * (1 + 1e-6))
                FAIL("n %zu block %zu: value %zu: %.9g came back as %.9g (scale %.9g)", n, block, i,
                     x[i], y[i], s[b]);
        }
    }
    free(x), free(y), free(q), free(s);
}

TEST(int8_quantize_round_trip_error_bound, 30)
{
    static const size_t ns[] = {1, 7, 255, 256, 257, 1000, 4099};
    static const size_t blocks[] = {1, 3, 64, 256, 1000};
    for (size_t a = 0; a < sizeof ns / sizeof *ns; a++)
        for (size_t b = 0; b < sizeof blocks / sizeof *blocks; b++) round_trip(ns[a], blocks[b]);
}

TEST(int8_quantize_rounding_zeros_and_nonfinite, 30)
{
    /* scale 1: ties go away from zero */
    const float x[8] = {127.0f, 2.5f, -2.5f, 0.5f, -0.5f, 1.49f, -126.5f, 0.0f};
    int8_t q[8];
    float s[2], y[8];
    ASSERT_OK(tdist_int8_quantize(q, s, x, 8, 8));
    ASSERT_TRUE(s[0] == 1.0f);
    static const int8_t want[8] = {127, 3, -3, 1, -1, 1, -127, 0};
    for (int i = 0; i < 8; i++) ASSERT_EQ(q[i], want[i]);
    /* a zero block: scale 0, codes 0, values +0 */
    const float z[4] = {0.0f, -0.0f, 0.0f, 0.0f};
    ASSERT_OK(tdist_int8_quantize(q, s, z, 4, 4));
    ASSERT_TRUE(s[0] == 0.0f);
    ASSERT_OK(tdist_int8_dequantize(y, q, s, 4, 4));
    for (int i = 0; i < 4; i++) ASSERT_TRUE(q[i] == 0 && y[i] == 0.0f);
    /* NaN and +-inf: code -128, NaN back; they do not enter the scale */
    const float f[6] = {NAN, 2.0f, INFINITY, -1.0f, -INFINITY, 0.5f};
    ASSERT_OK(tdist_int8_quantize(q, s, f, 6, 3));
    ASSERT_TRUE(s[0] == 2.0f / 127.0f && s[1] == 1.0f / 127.0f);
    ASSERT_OK(tdist_int8_dequantize(y, q, s, 6, 3));
    ASSERT_TRUE(q[0] == -128 && q[2] == -128 && q[4] == -128);
    ASSERT_TRUE(isnan(y[0]) && isnan(y[2]) && isnan(y[4]));
    ASSERT_TRUE(y[1] == 2.0f && y[3] == -1.0f && fabsf(y[5] - 0.5f) <= s[1] / 2);
    /* a block of NaNs only: scale 0 */
    const float nn[2] = {NAN, NAN};
    ASSERT_OK(tdist_int8_quantize(q, s, nn, 2, 2));
    ASSERT_TRUE(s[0] == 0.0f && q[0] == -128 && q[1] == -128);
    /* argument errors */
    ASSERT_STATUS(tdist_int8_quantize(q, s, x, 8, 0), TDIST_ERR_INVALID_ARG);
    ASSERT_STATUS(tdist_int8_quantize(NULL, s, x, 8, 4), TDIST_ERR_INVALID_ARG);
    ASSERT_STATUS(tdist_int8_dequantize(y, q, NULL, 8, 4), TDIST_ERR_INVALID_ARG);
    ASSERT_OK(tdist_int8_quantize(NULL, NULL, NULL, 0, 4));
}

/* ======================================= 2. the hook against float64 */

/* Shard and block of element i, as the hook lays out a bucket of n on w
 * ranks: the block's range [*lo, *hi). */
static void block_of(size_t n, int w, size_t block, size_t i, size_t *lo, size_t *hi)
{
    size_t base = n / (size_t)w, rem = n % (size_t)w, off = 0, len = 0;
    for (size_t r = 0; r < (size_t)w; r++) {
        off = r * base + (r < rem ? r : rem);
        len = base + (r < rem);
        if (i < off + len) break;
    }
    *lo = off + (i - off) / block * block;
    *hi = *lo + block < off + len ? *lo + block : off + len;
}

static double max_abs(const float *x, size_t lo, size_t hi)
{
    double m = 0;
    for (size_t i = lo; i < hi; i++) m = fmax(m, fabs((double)x[i]));
    return m;
}

/* Every element within the bound of the exact average of all ranks'
 * inputs (all_in: w rows of n). */
static void check_bound(const float *out, const float *all_in, size_t n, int w, size_t block, int64_t d)
{
    for (size_t i = 0; i < n; i++) {
        size_t lo, hi;
        block_of(n, w, block, i, &lo, &hi);
        double exact = 0, s_in = 0;
        for (int r = 0; r < w; r++) {
            exact += (double)all_in[(size_t)r * n + i];
            s_in += max_abs(all_in + (size_t)r * n, lo, hi) / 127.0;
        }
        exact /= (double)d;
        double s_f = max_abs(out, lo, hi) / 127.0;
        double bound = s_in / 2 / (double)d + s_f / 2;
        double slack = 1e-5 * (127 * s_in / (double)d + 127 * s_f) + 1e-30;
        if (!(fabs((double)out[i] - exact) <= bound + slack))
            FAIL("n %zu on %d ranks, element %zu: %.9g, exact %.9g, bound %.3g", n, w, i, out[i],
                 exact, bound);
    }
}

/* The result is the same bytes on every rank. */
static void check_identical(tdist_pg_t *pg, const float *out, size_t n)
{
    int w = tdist_pg_size(pg);
    float *all = malloc((size_t)w * n * sizeof *all + 1);
    ASSERT_TRUE(all);
    ASSERT_OK(tdist_all_gather(pg, out, all, n, TDIST_F32, NULL, NULL));
    for (int r = 1; r < w; r++)
        if (memcmp(all, all + (size_t)r * n, n * sizeof *all) != 0)
            FAIL("the result of %zu elements differs between rank 0 and rank %d", n, r);
    free(all);
}

/* The same bucket given as its gradients (TDIST_DDP_HOOK_GRADS: three
 * parameters in separate arrays, a gap of 5 elements between the last
 * two, as a bucket's alignment may leave; shards and blocks span them,
 * shards of several chunks): the bucket path's result bit for bit,
 * written into the gradients; the bucket's buffer is neither read nor
 * written. */
static void on_grads(tdist_int8_t *st, tdist_pg_t *pg, const float *in, size_t n, uint64_t it)
{
    const size_t idx[3] = {0, 1, 2};
    const size_t offs[3] = {0, n / 3, n / 2 + 5};
    const size_t cnts[3] = {n / 3, n / 2 - n / 3, n - n / 2 - 5};
    float *g[3];
    for (int j = 0; j < 3; j++) {
        g[j] = malloc(cnts[j] * sizeof *g[j] + 4);
        ASSERT_TRUE(g[j]);
        memcpy(g[j], in + offs[j], cnts[j] * sizeof *g[j]);
    }
    float *flat = calloc(n, sizeof *flat); /* the bucket: zeros in the gap */
    ASSERT_TRUE(flat);
    for (int j = 0; j < 3; j++) memcpy(flat + offs[j], in + offs[j], cnts[j] * sizeof *flat);
    /* the bucket path on the gapped layout, then the gradient path */
    tdist_ddp_bucket_t b = bucket_of(pg, flat, &n, it);
    b.num_params = 3;
    b.param_indices = idx;
    b.offsets = offs;
    b.counts = cnts;
    drive(st, &b);
    void *gv[3] = {g[0], g[1], g[2]};
    float *poison = malloc(n * sizeof *poison);
    ASSERT_TRUE(poison);
    for (size_t i = 0; i < n; i++) poison[i] = NAN;
    b.grads = gv;
    b.buffer = poison;
    drive(st, &b);
    for (size_t i = 0; i < n; i++) ASSERT_TRUE(isnan(poison[i]));
    free(poison);
    for (int j = 0; j < 3; j++) {
        if (memcmp(g[j], flat + offs[j], cnts[j] * sizeof *flat) != 0)
            FAIL("n %zu: parameter %d on the gradients differs from the bucket path", n, j);
        free(g[j]);
    }
    free(flat);
}

static void bound_body(int rank, int w, void *arg)
{
    (void)arg;
    tdist_world_t *wd;
    tdist_pg_t *pg;
    open_world(&wd, &pg, NULL);
    static const size_t ns[] = {4096, 1001, 3, 2, 1, 0, 40000};
    static const size_t blocks[] = {256, 100, 1};
    for (size_t bi = 0; bi < sizeof blocks / sizeof *blocks; bi++) {
        tdist_int8_opts_t o;
        tdist_int8_opts_init(&o);
        o.block_size = blocks[bi];
        tdist_int8_t *st;
        ASSERT_OK(tdist_int8_hook_create(&o, &st));
        uint64_t extra = 0; /* buckets on_grads reduces */
        for (size_t a = 0; a < sizeof ns / sizeof *ns; a++) {
            size_t n = ns[a];
            float *buf = malloc(n * sizeof *buf + 4), *all = malloc((size_t)w * n * sizeof *all + 4);
            ASSERT_TRUE(buf && all);
            for (int r = 0; r < w; r++)
                for (size_t i = 0; i < n; i++) all[(size_t)r * n + i] = grad(r, (int)a, i);
            memcpy(buf, all + (size_t)rank * n, n * sizeof *buf);
            tdist_ddp_bucket_t b = bucket_of(pg, buf, &n, a + 1);
            drive(st, &b);
            check_bound(buf, all, n, w, blocks[bi], w);
            check_identical(pg, buf, n);
            if (n >= 1000) {
                on_grads(st, pg, all + (size_t)rank * n, n, a + 1);
                extra += 2;
            }
            free(buf), free(all);
        }
        tdist_int8_stats_t s;
        ASSERT_OK(tdist_int8_get_stats(st, &s));
        ASSERT_EQ(s.buckets, sizeof ns / sizeof *ns + extra);
        if (w > 1 && blocks[bi] == 256) {
            /* the last bucket (40000 elements) dominates: over all of them <= 1/3 */
            if (rank == 0)
                printf("%d ranks, block 256: %llu bytes sent, an f32 ring all_reduce %llu: ratio %.4f\n",
                       w, (unsigned long long)s.bytes_sent, (unsigned long long)s.f32_ring_bytes,
                       (double)s.bytes_sent / (double)s.f32_ring_bytes);
            ASSERT_LE(3 * s.bytes_sent, s.f32_ring_bytes);
        }
        if (w == 1) ASSERT_EQ(s.bytes_sent, 0);
        tdist_int8_destroy(st);
    }
    tdist_pg_destroy(pg);
    tdist_world_destroy(wd);
}

TEST(int8_hook_within_bound_3_ranks, 90) { tdist_test_run_ranks(3, bound_body, NULL); }
TEST(int8_hook_within_bound_4_ranks, 90) { tdist_test_run_ranks(4, bound_body, NULL); }
TEST(int8_hook_within_bound_1_rank, 60) { tdist_test_run_ranks(1, bound_body, NULL); }

/* The byte counter for one bucket, exactly: 2 (W-1) messages of
 * 4 * ceil(L / block) + L bytes rounded up to 4, L = ceil(n / W). */
static void bytes_body(int rank, int w, void *arg)
{
    (void)rank, (void)arg;
    tdist_world_t *wd;
    tdist_pg_t *pg;
    open_world(&wd, &pg, NULL);
    size_t n = 1u << 16;
    float *buf = calloc(n, sizeof *buf);
    ASSERT_TRUE(buf);
    tdist_int8_t *st;
    ASSERT_OK(tdist_int8_hook_create(NULL, &st));
    tdist_ddp_bucket_t b = bucket_of(pg, buf, &n, 1);
    drive(st, &b);
    tdist_int8_stats_t s;
    ASSERT_OK(tdist_int8_get_stats(st, &s));
    size_t len = (n + (size_t)w - 1) / (size_t)w, msg = 4 * ((len + 255) / 256) + len;
    msg = (msg + 3) / 4 * 4;
    ASSERT_EQ(s.bytes_sent, 2 * ((size_t)w - 1) * msg);
    ASSERT_EQ(s.f32_ring_bytes, 2 * ((size_t)w - 1) * 4 * n / (size_t)w);
    double ratio = (double)s.bytes_sent / (double)s.f32_ring_bytes;
    if (ratio > 1.0 / 3) FAIL("ratio %.4f", ratio);
    if (rank == 0) printf("%d ranks, %zu elements: ratio %.4f of f32 all_reduce's bytes\n", w, n, ratio);
    tdist_int8_destroy(st);
    free(buf);
    tdist_pg_destroy(pg);
    tdist_world_destroy(wd);
}

TEST(int8_hook_bytes_counted_2_and_5_ranks, 90)
{
    tdist_test_run_ranks(2, bytes_body, NULL);
    tdist_test_run_ranks(5, bytes_body, NULL);
}

/* ======================================================== 3. NaN, inf */

static void nonfinite_body(int rank, int w, void *arg)
{
    (void)arg;
    tdist_world_t *wd;
    tdist_pg_t *pg;
    open_world(&wd, &pg, NULL);
    size_t n = 1000;
    float buf[1000], all[3 * 1000];
    for (int r = 0; r < w; r++)
        for (size_t i = 0; i < n; i++) all[(size_t)r * n + i] = grad(r, 0, i);
    all[0 * n + 5] = NAN;       /* rank 0: NaN */
    all[1 * n + 17] = INFINITY; /* rank 1: +inf */
    all[2 * n + 600] = -INFINITY;
    all[1 * n + 600] = INFINITY; /* inf - inf */
    memcpy(buf, all + (size_t)rank * n, sizeof buf);
    tdist_int8_t *st;
    ASSERT_OK(tdist_int8_hook_create(NULL, &st));
    tdist_ddp_bucket_t b = bucket_of(pg, buf, &n, 1);
    drive(st, &b);
    check_identical(pg, buf, n);
    for (size_t i = 0; i < n; i++) {
        bool bad = i == 5 || i == 17 || i == 600;
        if (bad != (bool)isnan(buf[i])) FAIL("element %zu: %.9g", i, buf[i]);
        if (bad) all[i] = all[n + i] = all[2 * n + i] = 0.0f, buf[i] = 0.0f;
    }
    /* the other elements of those blocks are as accurate as ever */
    check_bound(buf, all, n, w, 256, w);
    tdist_int8_stats_t s;
    ASSERT_OK(tdist_int8_get_stats(st, &s));
    ASSERT_EQ(s.nonfinite_in, rank == 0 ? 1 : rank == 1 ? 2 : 1);
    tdist_int8_destroy(st);
    tdist_pg_destroy(pg);
    tdist_world_destroy(wd);
}

TEST(int8_hook_nan_and_inf, 60) { tdist_test_run_ranks(3, nonfinite_body, NULL); }

/* ===================================================== 4. error feedback */

#define EF_N 3000
#define EF_STEPS 24

/* max |sum over steps of the result - exact sum| with the given options. */
static double ef_error(tdist_pg_t *pg, int rank, int w, bool ef_in, bool ef_sum)
{
    tdist_int8_opts_t o;
    tdist_int8_opts_init(&o);
    o.error_feedback = ef_in;
    o.sum_error_feedback = ef_sum;
    tdist_int8_t *st;
    ASSERT_OK(tdist_int8_hook_create(&o, &st));
    static double got[EF_N], want[EF_N];
    static float buf[EF_N];
    memset(got, 0, sizeof got);
    memset(want, 0, sizeof want);
    size_t n = EF_N;
    for (int k = 0; k < EF_STEPS; k++) {
        for (size_t i = 0; i < n; i++) {
            buf[i] = grad(rank, k % 3, i);
            for (int r = 0; r < w; r++) want[i] += (double)grad(r, k % 3, i) / w;
        }
        tdist_ddp_bucket_t b = bucket_of(pg, buf, &n, (uint64_t)k + 1);
        drive(st, &b);
        for (size_t i = 0; i < n; i++) got[i] += buf[i];
    }
    double err = 0;
    for (size_t i = 0; i < n; i++) err = fmax(err, fabs(got[i] - want[i]));
    tdist_int8_destroy(st);
    return err;
}

static void ef_body(int rank, int w, void *arg)
{
    (void)arg;
    tdist_world_t *wd;
    tdist_pg_t *pg;
    open_world(&wd, &pg, NULL);
    double none = ef_error(pg, rank, w, false, false);
    double in = ef_error(pg, rank, w, true, false);
    double both = ef_error(pg, rank, w, true, true);
    if (rank == 0)
        printf("accumulated error over %d steps: none %.4g, input feedback %.4g, input+sum %.4g\n",
               EF_STEPS, none, in, both);
    /* the input feedback alone leaves the (systematic) error of quantising
     * the average; with both, the accumulated error stays about one
     * step's */
    if (!(in < 0.75 * none) || !(both < 0.15 * none))
        FAIL("error feedback did not help: none %.4g, in %.4g, in+sum %.4g", none, in, both);
    tdist_pg_destroy(pg);
    tdist_world_destroy(wd);
}

TEST(int8_error_feedback_reduces_accumulated_error, 90) { tdist_test_run_ranks(3, ef_body, NULL); }

/* ================================================ 5. option, call errors */

TEST(int8_option_errors, 30)
{
    tdist_int8_opts_t o;
    tdist_int8_opts_init(&o);
    ASSERT_EQ(o.block_size, 256);
    tdist_int8_t *st = NULL;
    o.block_size = 0;
    ASSERT_STATUS(tdist_int8_hook_create(&o, &st), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "opts.block_size is 0");
    ASSERT_TRUE(st == NULL);
    o.block_size = (size_t)TDIST_INT8_MAX_BLOCK + 1;
    ASSERT_STATUS(tdist_int8_hook_create(&o, &st), TDIST_ERR_INVALID_ARG);
    ASSERT_STATUS(tdist_int8_hook_create(NULL, NULL), TDIST_ERR_INVALID_ARG);
    ASSERT_STATUS(tdist_int8_register(NULL, NULL), TDIST_ERR_INVALID_ARG);
    ASSERT_STATUS(tdist_int8_get_stats(NULL, NULL), TDIST_ERR_INVALID_ARG);
    tdist_int8_destroy(NULL);
    tdist_int8_opts_init(NULL);
}

/* Bad calls fail before anything is sent: the group is still usable and
 * in step afterwards (a barrier), and the bucket untouched. */
static void call_err_body(int rank, int w, void *arg)
{
    (void)arg, (void)w;
    tdist_world_t *wd;
    tdist_pg_t *pg;
    open_world(&wd, &pg, NULL);
    tdist_int8_t *st;
    ASSERT_OK(tdist_int8_hook_create(NULL, &st));
    size_t n = 8;
    float buf[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    tdist_ddp_bucket_t b = bucket_of(pg, buf, &n, 3);
    tdist_ddp_hook_result_t r = {0};
    b.dtype = TDIST_F16;
    ASSERT_STATUS(tdist_int8_hook(st, &b, &r), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "tdist_int8_hook: rank ");
    ASSERT_CONTAINS(tdist_last_error(), "iteration 3 bucket 0: int8_allreduce(block 256): the bucket's dtype is f16");
    b.dtype = TDIST_F32;
    b.divisor = 0;
    ASSERT_STATUS(tdist_int8_hook(st, &b, &r), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "divisor 0 < 1");
    b.divisor = 2;
    size_t big = 9;
    b.counts = &big;
    ASSERT_STATUS(tdist_int8_hook(st, &b, &r), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "lies outside the bucket");
    ASSERT_STATUS(tdist_int8_hook(NULL, &b, &r), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "the hook state is NULL");
    ASSERT_STATUS(tdist_int8_hook(st, NULL, &r), TDIST_ERR_INVALID_ARG);
    ASSERT_TRUE(r.work == NULL && r.then == NULL);
    for (int i = 0; i < 8; i++) ASSERT_TRUE(buf[i] == (float)(i + 1));
    ASSERT_OK(tdist_barrier(pg, NULL, NULL));
    /* and the state still works */
    b = bucket_of(pg, buf, &n, 4);
    drive(st, &b);
    ASSERT_TRUE(buf[7] == 8.0f);
    (void)rank;
    tdist_int8_destroy(st);
    tdist_pg_destroy(pg);
    tdist_world_destroy(wd);
}

TEST(int8_call_errors_before_communication, 60) { tdist_test_run_ranks(2, call_err_body, NULL); }

/* ================================================ 6. bytes on the wire */


enum { WIRE_N = 1 << 18 };

static void wire_body(int rank, int w, void *arg)
{
    (void)arg, (void)w;
    tdist_world_t *wd;
    tdist_pg_t *pg;
    open_world(&wd, &pg, "tcp");
    float *buf = malloc(WIRE_N * sizeof *buf);
    ASSERT_TRUE(buf);
    for (size_t i = 0; i < WIRE_N; i++) buf[i] = grad(rank, 0, i);
    tdist_int8_t *st;
    ASSERT_OK(tdist_int8_hook_create(NULL, &st));
    size_t n = WIRE_N;
    tdist_ddp_bucket_t b = bucket_of(pg, buf, &n, 1);
    drive(st, &b); /* the agreement, outside the measurement */
    uint64_t bytes[2];
    for (int k = 0; k < 2; k++) {
        ASSERT_OK(tdist_barrier(pg, NULL, NULL));
        uint64_t before = tdist_test_lo_tx_bytes();
        if (k == 0) drive(st, &b);
        else ASSERT_OK(tdist_all_reduce(pg, buf, buf, WIRE_N, TDIST_F32, TDIST_SUM, NULL, NULL));
        ASSERT_OK(tdist_barrier(pg, NULL, NULL));
        bytes[k] = tdist_test_lo_tx_bytes() - before; /* every rank's bytes: lo is this test's own */
    }
    if (rank == 0) {
        double ratio = (double)bytes[0] / (double)bytes[1];
        printf("on lo: int8 hook %llu bytes, f32 all_reduce %llu bytes: ratio %.4f\n",
               (unsigned long long)bytes[0], (unsigned long long)bytes[1], ratio);
        if (ratio > 1.0 / 3) FAIL("the int8 hook moved %.4f of the f32 all_reduce's bytes", ratio);
    }
    tdist_int8_destroy(st);
    free(buf);
    tdist_pg_destroy(pg);
    tdist_world_destroy(wd);
}


TEST(int8_hook_wire_bytes_vs_f32_all_reduce, 90)
{
    if (!tdist_test_private_loopback("int8_hook_wire_bytes_vs_f32_all_reduce")) return;
    tdist_test_run_ranks(3, wire_body, NULL);
}
