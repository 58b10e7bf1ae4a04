/*
 * tools/tdist-bench/main.c — collective benchmark in the spirit of
 * nccl-tests, run under tdistrun. See docs/tdist-bench.md.
 *
 *   tdistrun --nproc-per-node 2 tdist-bench -o all_reduce -b 8 -e 64M -f 4 \
 *            -n 20 -w 5 -d f32 -r sum
 *
 * Uses the public API only (include/tdist/tdist.h). For each size: a
 * barrier, WARMUP warm-up calls, ITERS timed samples of BATCH consecutive
 * blocking calls each (-k; no barrier between them; a sample is its time /
 * BATCH); the reported time is the max over ranks of each rank's median
 * sample. Every result is checked against values computed
 * locally from the same formula of (rank, index); the wrong-element count
 * is all-reduced (MAX) so rank 0 reports the worst rank.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tdist/tdist.h"

#define BENCH_MAX_BYTES ((size_t)1 << 30) /* largest buffer we agree to allocate */
#define BENCH_MAX_SIZES 64                /* at most this many rows */
#define BENCH_MAX_ITERS 1000000
#define BENCH_MAX_BATCH 1000    /* calls per timed sample, -k */
#define AUTO_SAMPLE_US 100.0    /* -k auto: a sample lasts about this long */
#define EXIT_USAGE 2

typedef enum op {
    OP_ALL_REDUCE,
    OP_BROADCAST,
    OP_REDUCE,
    OP_ALL_GATHER,
    OP_REDUCE_SCATTER,
    OP_ALL_TO_ALL,
    OP_BARRIER,
    OP_GATHER,
    OP_SCATTER,
    OP_COUNT_
} op_t;

static const char *const op_names[OP_COUNT_] = {
    "all_reduce", "broadcast", "reduce",  "all_gather", "reduce_scatter",
    "all_to_all", "barrier",   "gather",  "scatter",
};

static const char *const dtype_names[] = {"f32", "f64", "f16", "bf16", "i8", "u8", "i32", "i64"};
static const tdist_dtype_t dtype_vals[] = {TDIST_F32, TDIST_F64, TDIST_F16, TDIST_BF16,
                                           TDIST_I8,  TDIST_U8,  TDIST_I32, TDIST_I64};
static const char *const redop_names[] = {"sum", "prod", "min",  "max",       "avg",
                                          "band", "bor", "bxor", "premul_sum"};
static const tdist_redop_t redop_vals[] = {TDIST_SUM, TDIST_PROD, TDIST_MIN,  TDIST_MAX,
                                           TDIST_AVG, TDIST_BAND, TDIST_BOR, TDIST_BXOR,
                                           TDIST_PREMUL_SUM};
#define N_DTYPES (sizeof dtype_names / sizeof dtype_names[0])
#define N_REDOPS (sizeof redop_names / sizeof redop_names[0])

#define PREMUL_FACTOR 2.0

typedef struct cfg {
    op_t op;
    size_t min_bytes, max_bytes;
    size_t factor;
    int iters, warmup;
    int batch; /* calls per timed sample; 0 = auto */
    tdist_dtype_t dtype;
    int dtype_idx;
    tdist_redop_t redop;
    int redop_idx;
    bool check;
} cfg_t;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: tdistrun --nproc-per-node N tdist-bench [options]\n"
            "  -o OP      all_reduce (default), broadcast, reduce, all_gather, reduce_scatter,\n"
            "             all_to_all, barrier, gather, scatter\n"
            "  -b MIN     smallest size in bytes (K/M/G suffix = 1024^1..3; default 8)\n"
            "  -e MAX     largest size in bytes (default 64M; at most 1G)\n"
            "  -f FACTOR  multiplicative step between sizes, >= 2 (default 2); MAX is always\n"
            "             the last size\n"
            "  -n ITERS   timed iterations per size, >= 1 (default 20)\n"
            "  -w WARMUP  untimed warm-up iterations per size, >= 0 (default 5)\n"
            "  -k BATCH   calls per timed sample, 1..%d or auto (default 1: every call\n"
            "             timed on its own); a sample is the batch's time / BATCH. auto:\n"
            "             per size, as many calls as last about %.0f us, from the warm-up\n"
            "             calls' median (max over ranks; 1 without warm-up)\n"
            "  -d DTYPE   f32 (default) f64 f16 bf16 i8 u8 i32 i64\n"
            "  -r REDOP   sum (default) prod min max avg band bor bxor premul_sum\n"
            "  -c 0|1     check every result (default 1)\n"
            "  -h         this help\n"
            "Bytes are the per-rank buffer size as in nccl-tests (for all_gather, gather:\n"
            "the receive buffer; reduce_scatter, scatter, all_to_all: the send buffer).\n"
            "Rank 0 prints one row per size and RESULT lines; exit 1 if any element is wrong.\n",
            BENCH_MAX_BATCH, AUTO_SAMPLE_US);
}

/* "64M" -> 67108864. K/M/G are powers of 1024; an optional trailing B/iB. */
static bool parse_size(const char *s, size_t *out)
{
    if (!s || !*s || *s == '-') return false;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s) return false;
    unsigned long long mult = 1;
    switch (*end) {
    case 'k': case 'K': mult = 1ULL << 10; end++; break;
    case 'm': case 'M': mult = 1ULL << 20; end++; break;
    case 'g': case 'G': mult = 1ULL << 30; end++; break;
    default: break;
    }
    if (mult > 1 && *end == 'i') end++;
    if (*end == 'B' || *end == 'b') end++;
    if (*end) return false;
    if (v > (1ULL << 40) / mult) return false;
    *out = (size_t)(v * mult);
    return true;
}

static bool parse_int(const char *s, long lo, long hi, long *out)
{
    if (!s || !*s) return false;
    errno = 0;
    char *end;
    long v = strtol(s, &end, 10);
    if (errno || *end || v < lo || v > hi) return false;
    *out = v;
    return true;
}

static int lookup(const char *s, const char *const *names, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(s, names[i]) == 0) return (int)i;
    return -1;
}

/* 0: ok; 1: help printed (exit 0); 2: usage error (printed). */
static int parse_args(int argc, char **argv, cfg_t *c)
{
    c->op = OP_ALL_REDUCE;
    c->min_bytes = 8;
    c->max_bytes = (size_t)64 << 20;
    c->factor = 2;
    c->iters = 20;
    c->warmup = 5;
    c->batch = 1;
    c->dtype_idx = 0;
    c->redop_idx = 0;
    c->check = true;
    int opt;
    long v;
    opterr = 0;
    while ((opt = getopt(argc, argv, ":o:b:e:f:n:w:k:d:r:c:h")) != -1) {
        switch (opt) {
        case 'o': {
            int i = lookup(optarg, op_names, OP_COUNT_);
            if (i < 0) {
                fprintf(stderr, "tdist-bench: unknown op '%s'\n", optarg);
                goto bad;
            }
            c->op = (op_t)i;
            break;
        }
        case 'b':
            if (!parse_size(optarg, &c->min_bytes) || c->min_bytes == 0) {
                fprintf(stderr, "tdist-bench: bad -b size '%s'\n", optarg);
                goto bad;
            }
            break;
        case 'e':
            if (!parse_size(optarg, &c->max_bytes) || c->max_bytes == 0) {
                fprintf(stderr, "tdist-bench: bad -e size '%s'\n", optarg);
                goto bad;
            }
            break;
        case 'f':
            if (!parse_int(optarg, 2, 1 << 20, &v)) {
                fprintf(stderr, "tdist-bench: bad -f factor '%s' (an integer >= 2)\n", optarg);
                goto bad;
            }
            c->factor = (size_t)v;
            break;
        case 'n':
            if (!parse_int(optarg, 1, BENCH_MAX_ITERS, &v)) {
                fprintf(stderr, "tdist-bench: bad -n iterations '%s' (1..%d)\n", optarg,
                        BENCH_MAX_ITERS);
                goto bad;
            }
            c->iters = (int)v;
            break;
        case 'w':
            if (!parse_int(optarg, 0, BENCH_MAX_ITERS, &v)) {
                fprintf(stderr, "tdist-bench: bad -w warm-up '%s' (0..%d)\n", optarg,
                        BENCH_MAX_ITERS);
                goto bad;
            }
            c->warmup = (int)v;
            break;
        case 'k':
            if (strcmp(optarg, "auto") == 0) {
                c->batch = 0;
            } else if (parse_int(optarg, 1, BENCH_MAX_BATCH, &v)) {
                c->batch = (int)v;
            } else {
                fprintf(stderr, "tdist-bench: bad -k batch '%s' (1..%d or auto)\n", optarg,
                        BENCH_MAX_BATCH);
                goto bad;
            }
            break;
        case 'd':
            c->dtype_idx = lookup(optarg, dtype_names, N_DTYPES);
            if (c->dtype_idx < 0) {
                fprintf(stderr, "tdist-bench: unknown dtype '%s'\n", optarg);
                goto bad;
            }
            break;
        case 'r':
            c->redop_idx = lookup(optarg, redop_names, N_REDOPS);
            if (c->redop_idx < 0) {
                fprintf(stderr, "tdist-bench: unknown reduce op '%s'\n", optarg);
                goto bad;
            }
            break;
        case 'c':
            if (!parse_int(optarg, 0, 1, &v)) {
                fprintf(stderr, "tdist-bench: bad -c '%s' (0 or 1)\n", optarg);
                goto bad;
            }
            c->check = v != 0;
            break;
        case 'h':
            usage(stdout);
            return 1;
        case ':':
            fprintf(stderr, "tdist-bench: option -%c needs a value\n", optopt);
            goto bad;
        default:
            fprintf(stderr, "tdist-bench: unknown option -%c\n", optopt);
            goto bad;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "tdist-bench: unexpected argument '%s'\n", argv[optind]);
        goto bad;
    }
    c->dtype = dtype_vals[c->dtype_idx];
    c->redop = redop_vals[c->redop_idx];
    if (c->max_bytes > BENCH_MAX_BYTES) {
        fprintf(stderr, "tdist-bench: -e %zu bytes is above the 1 GiB per-buffer limit\n",
                c->max_bytes);
        goto bad;
    }
    if (c->min_bytes > c->max_bytes) {
        fprintf(stderr, "tdist-bench: -b %zu is larger than -e %zu\n", c->min_bytes,
                c->max_bytes);
        goto bad;
    }
    if (c->op == OP_ALL_REDUCE || c->op == OP_REDUCE || c->op == OP_REDUCE_SCATTER) {
        if (tdist_redop_check(c->redop, c->dtype) != TDIST_OK) {
            fprintf(stderr, "tdist-bench: %s\n", tdist_last_error());
            goto bad;
        }
        if (c->redop == TDIST_PREMUL_SUM && !tdist_dtype_is_float(c->dtype)) {
            fprintf(stderr, "tdist-bench: premul_sum is defined for floating dtypes only\n");
            goto bad;
        }
    }
    return 0;
bad:
    usage(stderr);
    return 2;
}

/* ------------------------------------------------------------ the data */

static bool is_reduction(op_t op)
{
    return op == OP_ALL_REDUCE || op == OP_REDUCE || op == OP_REDUCE_SCATTER;
}

/* The input of rank r at index i: a small integer, exact in every dtype.
 * The domain depends on the reduce op so that every result is exact too
 * (see docs/tdist-bench.md for the rank limits). */
static int64_t input_value(const cfg_t *c, int n, int r, size_t i)
{
    int64_t ii = (int64_t)(i % 1000003);
    if (!is_reduction(c->op)) return (ii * 3 + r * 5) % 101;
    switch (c->redop) {
    case TDIST_SUM:
    case TDIST_PREMUL_SUM:
        return (ii * 7 + r * 3) % 5 + 1;
    case TDIST_AVG: {
        /* b(i) + d(r) with sum over r of d(r) == 0: avg is exactly b(i). */
        int64_t b = ii % 5 + 2;
        int64_t d = (n % 2 == 1 && r == n - 1) ? 0 : (r % 2 == 0 ? 1 : -1);
        return b + d;
    }
    case TDIST_PROD:
        if (r == (int)(i % (size_t)n)) return 2 + ii % 3;
        if (r == (int)((i + 1) % (size_t)n)) return 2;
        return 1;
    case TDIST_MIN:
    case TDIST_MAX: {
        int64_t v = (ii * 3 + r * 5) % 101;
        return c->dtype == TDIST_U8 ? v : v - 50;
    }
    default: /* band, bor, bxor */
        return (ii * 37 + r * 101) & 0x7f;
    }
}

/* The reduction over every rank of input_value(., i). */
static double expected_reduced(const cfg_t *c, int n, size_t i)
{
    int64_t acc = input_value(c, n, 0, i);
    for (int r = 1; r < n; r++) {
        int64_t v = input_value(c, n, r, i);
        switch (c->redop) {
        case TDIST_SUM:
        case TDIST_PREMUL_SUM:
        case TDIST_AVG: acc += v; break;
        case TDIST_PROD: acc *= v; break;
        case TDIST_MIN: acc = v < acc ? v : acc; break;
        case TDIST_MAX: acc = v > acc ? v : acc; break;
        case TDIST_BAND: acc &= v; break;
        case TDIST_BOR: acc |= v; break;
        default: acc ^= v; break;
        }
    }
    if (c->redop == TDIST_AVG) return (double)(acc / n);
    if (c->redop == TDIST_PREMUL_SUM) return (double)acc * PREMUL_FACTOR;
    return (double)acc;
}

static void store_value(void *buf, tdist_dtype_t dt, size_t i, double v)
{
    switch (dt) {
    case TDIST_F32: ((float *)buf)[i] = (float)v; break;
    case TDIST_F64: ((double *)buf)[i] = v; break;
    case TDIST_F16: ((uint16_t *)buf)[i] = tdist_f32_to_f16((float)v); break;
    case TDIST_BF16: ((uint16_t *)buf)[i] = tdist_f32_to_bf16((float)v); break;
    case TDIST_I8: ((int8_t *)buf)[i] = (int8_t)v; break;
    case TDIST_U8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
    case TDIST_I32: ((int32_t *)buf)[i] = (int32_t)v; break;
    default: ((int64_t *)buf)[i] = (int64_t)v; break;
    }
}

static double load_value(const void *buf, tdist_dtype_t dt, size_t i)
{
    switch (dt) {
    case TDIST_F32: return ((const float *)buf)[i];
    case TDIST_F64: return ((const double *)buf)[i];
    case TDIST_F16: return tdist_f16_to_f32(((const uint16_t *)buf)[i]);
    case TDIST_BF16: return tdist_bf16_to_f32(((const uint16_t *)buf)[i]);
    case TDIST_I8: return ((const int8_t *)buf)[i];
    case TDIST_U8: return ((const uint8_t *)buf)[i];
    case TDIST_I32: return ((const int32_t *)buf)[i];
    default: return (double)((const int64_t *)buf)[i];
    }
}

/* A value no correct result has (inputs are within -50..127, products <= 8,
 * premul sums <= 10 n): poisons the output before the timed loop. */
static double poison_value(tdist_dtype_t dt)
{
    if (dt == TDIST_U8) return 255.0;
    return dt == TDIST_I8 ? -99.0 : -12345.0;
}

static void poison(void *buf, tdist_dtype_t dt, size_t count)
{
    double p = poison_value(dt);
    for (size_t i = 0; i < count; i++) store_value(buf, dt, i, p);
}

/* ------------------------------------------------------------ one size */

typedef struct run {
    size_t count;   /* elements of the per-rank (big) buffer, the row's count */
    size_t chunk;   /* per-peer block for the chunked ops; count otherwise */
    void *send, *recv;
    size_t send_n, recv_n; /* elements */
} run_t;

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static bool chunked(op_t op)
{
    return op == OP_ALL_GATHER || op == OP_REDUCE_SCATTER || op == OP_ALL_TO_ALL ||
           op == OP_GATHER || op == OP_SCATTER;
}

/* Sizes the buffers for `bytes` and fills the inputs. */
static bool setup(const cfg_t *c, int rank, int n, size_t bytes, run_t *r)
{
    size_t esz = tdist_dtype_size(c->dtype);
    memset(r, 0, sizeof *r);
    size_t count = bytes / esz;
    if (count == 0) count = 1;
    if (chunked(c->op)) {
        r->chunk = count / (size_t)n;
        if (r->chunk == 0) r->chunk = 1;
        count = r->chunk * (size_t)n;
    } else {
        r->chunk = count;
    }
    r->count = count;
    switch (c->op) {
    case OP_ALL_REDUCE:
    case OP_REDUCE: r->send_n = count; r->recv_n = count; break;
    case OP_BROADCAST: r->send_n = count; r->recv_n = 0; break; /* in place */
    case OP_ALL_GATHER: r->send_n = r->chunk; r->recv_n = count; break;
    case OP_GATHER: r->send_n = r->chunk; r->recv_n = rank == 0 ? count : 0; break;
    case OP_REDUCE_SCATTER: r->send_n = count; r->recv_n = r->chunk; break;
    case OP_SCATTER: r->send_n = rank == 0 ? count : 0; r->recv_n = r->chunk; break;
    case OP_ALL_TO_ALL: r->send_n = count; r->recv_n = count; break;
    default: r->send_n = r->recv_n = 0; break;
    }
    if (c->op == OP_REDUCE && rank != 0) r->recv_n = 0;
    if (r->send_n && !(r->send = malloc(r->send_n * esz))) return false;
    if (r->recv_n && !(r->recv = malloc(r->recv_n * esz))) return false;
    for (size_t i = 0; i < r->send_n; i++) {
        int src = (c->op == OP_BROADCAST || c->op == OP_SCATTER) ? 0 : rank;
        store_value(r->send, c->dtype, i, (double)input_value(c, n, src, i));
    }
    if (c->op == OP_BROADCAST && rank != 0) poison(r->send, c->dtype, r->send_n);
    if (r->recv) poison(r->recv, c->dtype, r->recv_n);
    return true;
}

static void teardown(run_t *r)
{
    free(r->send);
    free(r->recv);
    r->send = r->recv = NULL;
}

static tdist_status_t one_call(const cfg_t *c, tdist_pg_t *pg, run_t *r)
{
    tdist_coll_opts_t o;
    tdist_coll_opts_init(&o);
    o.premul_factor = PREMUL_FACTOR;
    switch (c->op) {
    case OP_ALL_REDUCE:
        return tdist_all_reduce(pg, r->send, r->recv, r->count, c->dtype, c->redop, &o, NULL);
    case OP_BROADCAST: return tdist_broadcast(pg, r->send, r->count, c->dtype, 0, &o, NULL);
    case OP_REDUCE:
        return tdist_reduce_to(pg, r->send, r->recv, r->count, c->dtype, c->redop, 0, &o, NULL);
    case OP_ALL_GATHER:
        return tdist_all_gather(pg, r->send, r->recv, r->chunk, c->dtype, &o, NULL);
    case OP_REDUCE_SCATTER:
        return tdist_reduce_scatter(pg, r->send, r->recv, r->chunk, c->dtype, c->redop, &o,
                                    NULL);
    case OP_ALL_TO_ALL:
        return tdist_all_to_all(pg, r->send, r->recv, r->chunk, c->dtype, &o, NULL);
    case OP_GATHER: return tdist_gather(pg, r->send, r->recv, r->chunk, c->dtype, 0, &o, NULL);
    case OP_SCATTER:
        return tdist_scatter(pg, r->send, r->recv, r->chunk, c->dtype, 0, &o, NULL);
    default: return tdist_barrier(pg, &o, NULL);
    }
}

/* Wrong elements of this rank's output after the last call. */
static int64_t count_wrong(const cfg_t *c, int rank, int n, const run_t *r)
{
    int64_t wrong = 0;
    tdist_dtype_t dt = c->dtype;
    switch (c->op) {
    case OP_ALL_REDUCE:
    case OP_REDUCE:
        for (size_t i = 0; i < r->recv_n; i++)
            wrong += load_value(r->recv, dt, i) != expected_reduced(c, n, i);
        break;
    case OP_REDUCE_SCATTER:
        for (size_t j = 0; j < r->recv_n; j++)
            wrong += load_value(r->recv, dt, j) !=
                     expected_reduced(c, n, (size_t)rank * r->chunk + j);
        break;
    case OP_BROADCAST:
        for (size_t i = 0; i < r->send_n; i++)
            wrong += load_value(r->send, dt, i) != (double)input_value(c, n, 0, i);
        break;
    case OP_ALL_GATHER:
    case OP_GATHER:
        for (size_t k = 0; k < r->recv_n; k++)
            wrong += load_value(r->recv, dt, k) !=
                     (double)input_value(c, n, (int)(k / r->chunk), k % r->chunk);
        break;
    case OP_SCATTER:
        for (size_t j = 0; j < r->recv_n; j++)
            wrong += load_value(r->recv, dt, j) !=
                     (double)input_value(c, n, 0, (size_t)rank * r->chunk + j);
        break;
    case OP_ALL_TO_ALL:
        for (size_t k = 0; k < r->recv_n; k++) {
            int p = (int)(k / r->chunk);
            size_t j = k % r->chunk;
            wrong += load_value(r->recv, dt, k) !=
                     (double)input_value(c, n, p, (size_t)rank * r->chunk + j);
        }
        break;
    default: break;
    }
    return wrong;
}

static double bus_factor(op_t op, int n)
{
    double nn = (double)n;
    switch (op) {
    case OP_ALL_REDUCE: return 2.0 * (nn - 1.0) / nn;
    case OP_ALL_GATHER:
    case OP_REDUCE_SCATTER:
    case OP_ALL_TO_ALL:
    case OP_GATHER:
    case OP_SCATTER: return (nn - 1.0) / nn;
    case OP_BROADCAST:
    case OP_REDUCE: return 1.0;
    default: return 0.0;
    }
}

/* "8B", "64KiB", "64MiB", "1GiB", else plain bytes with B. */
static void size_label(size_t b, char *out, size_t n)
{
    if (b >= (1u << 30) && b % (1u << 30) == 0)
        snprintf(out, n, "%zuGiB", b >> 30);
    else if (b >= (1u << 20) && b % (1u << 20) == 0)
        snprintf(out, n, "%zuMiB", b >> 20);
    else if (b >= (1u << 10) && b % (1u << 10) == 0)
        snprintf(out, n, "%zuKiB", b >> 10);
    else
        snprintf(out, n, "%zuB", b);
}

typedef struct row {
    size_t bytes, count;
    double time_us, algbw, busbw;
    int64_t wrong;
    int batch; /* calls per timed sample */
} row_t;

/* Median of v[0..n) (sorts v); n >= 1. */
static double median_of(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* -k auto: calls per sample for calls of call_us each (every rank passes
 * the same call_us, so every rank makes the same number of calls). */
static int auto_batch(double call_us)
{
    if (!(call_us > 0)) return 1;
    double k = AUTO_SAMPLE_US / call_us;
    return k < 1 ? 1 : k > BENCH_MAX_BATCH ? BENCH_MAX_BATCH : (int)k;
}

static void fail_coll(int rank, const char *what)
{
    fprintf(stderr, "tdist-bench: rank %d: %s failed: %s\n", rank, what, tdist_last_error());
}

/* Run one size: 0 ok, -1 a call failed (message printed). */
static int bench_size(const cfg_t *c, tdist_pg_t *pg, size_t bytes, double *times, row_t *row)
{
    int rank = tdist_pg_rank(pg), n = tdist_pg_size(pg);
    run_t r;
    if (!setup(c, rank, n, bytes, &r)) {
        fprintf(stderr, "tdist-bench: rank %d: out of memory for %zu bytes\n", rank, bytes);
        teardown(&r);
        return -1;
    }
    int rc = -1;
    if (tdist_barrier(pg, NULL, NULL) != TDIST_OK) {
        fail_coll(rank, "barrier");
        goto out;
    }
    /* warm-up calls are timed only for -k auto: the last ITERS of them
     * (the first ones are cold) go into times[], which the timed loop
     * overwrites */
    int wt = 0;
    for (int i = 0; i < c->warmup; i++) {
        double t0 = now_us();
        if (one_call(c, pg, &r) != TDIST_OK) {
            fail_coll(rank, op_names[c->op]);
            goto out;
        }
        times[wt++ % c->iters] = now_us() - t0;
    }
    int batch = c->batch;
    if (batch == 0) {
        int nt = wt < c->iters ? wt : c->iters;
        double call_us = nt ? median_of(times, nt) : 0, max_us = 0;
        if (tdist_all_reduce(pg, &call_us, &max_us, 1, TDIST_F64, TDIST_MAX, NULL, NULL) !=
            TDIST_OK) {
            fail_coll(rank, "all_reduce of the warm-up time");
            goto out;
        }
        batch = auto_batch(max_us);
    }
    for (int i = 0; i < c->iters; i++) {
        double t0 = now_us();
        for (int j = 0; j < batch; j++) {
            if (one_call(c, pg, &r) != TDIST_OK) {
                fail_coll(rank, op_names[c->op]);
                goto out;
            }
        }
        times[i] = (now_us() - t0) / batch;
    }
    double med = median_of(times, c->iters);
    row->batch = batch;
    /* Testing hook: TDIST_BENCH_INJECT_ERROR=R corrupts one output element
     * on rank R after the timed loop, so the check can be seen to fail. */
    const char *inject = getenv("TDIST_BENCH_INJECT_ERROR");
    if (inject && *inject && atoi(inject) == rank) {
        void *out = r.recv ? r.recv : r.send;
        size_t out_n = r.recv ? r.recv_n : r.send_n;
        if (out && out_n) store_value(out, c->dtype, out_n - 1, poison_value(c->dtype));
    }
    int64_t wrong = c->check ? count_wrong(c, rank, n, &r) : 0;
    double max_med = 0;
    int64_t max_wrong = 0;
    if (tdist_all_reduce(pg, &med, &max_med, 1, TDIST_F64, TDIST_MAX, NULL, NULL) != TDIST_OK ||
        tdist_all_reduce(pg, &wrong, &max_wrong, 1, TDIST_I64, TDIST_MAX, NULL, NULL) !=
            TDIST_OK) {
        fail_coll(rank, "all_reduce of the results");
        goto out;
    }
    size_t esz = tdist_dtype_size(c->dtype);
    row->bytes = c->op == OP_BARRIER ? 0 : r.count * esz;
    row->count = c->op == OP_BARRIER ? 0 : r.count;
    row->time_us = max_med;
    row->algbw = max_med > 0 ? (double)row->bytes / (max_med * 1e3) : 0.0;
    row->busbw = row->algbw * bus_factor(c->op, n);
    row->wrong = max_wrong;
    rc = 0;
out:
    teardown(&r);
    return rc;
}

int main(int argc, char **argv)
{
    cfg_t c;
    int pr = parse_args(argc, argv, &c);
    if (pr == 1) return 0;
    if (pr != 0) return EXIT_USAGE;

    tdist_world_t *world = NULL;
    tdist_pg_t *pg = NULL;
    if (tdist_init("env://", NULL, &world) != TDIST_OK) {
        fprintf(stderr, "tdist-bench: tdist_init(env://) failed: %s\n", tdist_last_error());
        return 1;
    }
    if (tdist_pg_create_world(world, NULL, &pg) != TDIST_OK) {
        fprintf(stderr, "tdist-bench: tdist_pg_create_world failed: %s\n", tdist_last_error());
        tdist_world_destroy(world);
        return 1;
    }
    int rank = tdist_pg_rank(pg), n = tdist_pg_size(pg);

    double *times = malloc((size_t)c.iters * sizeof *times);
    row_t *rows = calloc(BENCH_MAX_SIZES, sizeof *rows);
    int nrows = 0, status = 0;
    if (!times || !rows) {
        fprintf(stderr, "tdist-bench: rank %d: out of memory\n", rank);
        status = 1;
        goto done;
    }
    const char *redop = is_reduction(c.op) ? redop_names[c.redop_idx] : "-";
    if (rank == 0) {
        printf("# tdist-bench %s: %d ranks, dtype %s, redop %s, %d iterations (+%d warm-up), "
               "check %s\n",
               op_names[c.op], n, dtype_names[c.dtype_idx], redop, c.iters, c.warmup,
               c.check ? "on" : "off");
        if (c.batch == 1)
            printf("# time: max over ranks of each rank's median; GB/s = 1e9 B/s\n");
        else if (c.batch > 1)
            printf("# time: max over ranks of each rank's median sample of %d calls (its "
                   "time / %d); GB/s = 1e9 B/s\n",
                   c.batch, c.batch);
        else
            printf("# time: max over ranks of each rank's median sample (batch time / calls; "
                   "calls per sample chosen per size, ~%.0f us); GB/s = 1e9 B/s\n",
                   AUTO_SAMPLE_US);
        printf("# %12s %12s %5s %10s %12s %11s %11s %8s\n", "bytes", "count", "type", "redop",
               "time(us)", "algbw(GB/s)", "busbw(GB/s)", "wrong");
        fflush(stdout);
    }
    size_t bytes = c.min_bytes;
    for (int s = 0; s < BENCH_MAX_SIZES; s++) {
        row_t *row = &rows[nrows];
        if (bench_size(&c, pg, bytes, times, row) != 0) {
            status = 1;
            goto done;
        }
        nrows++;
        if (rank == 0) {
            char wrong[32];
            if (c.check)
                snprintf(wrong, sizeof wrong, "%" PRId64, row->wrong);
            else
                snprintf(wrong, sizeof wrong, "-");
            if (c.batch == 0) printf("# %zu bytes: %d calls per sample\n", row->bytes, row->batch);
            printf("  %12zu %12zu %5s %10s %12.3f %11.3f %11.3f %8s\n", row->bytes, row->count,
                   dtype_names[c.dtype_idx], redop, row->time_us, row->algbw, row->busbw, wrong);
            fflush(stdout);
        }
        if (row->wrong) status = 1;
        if (c.op == OP_BARRIER) break; /* sizes do not apply */
        /* Step by the factor; the last row is MAX itself even when it is
         * not min x factor^k (so -b 8 -e 64M -f 4 ends at 64 MiB). */
        if (bytes >= c.max_bytes) break;
        bytes = bytes > c.max_bytes / c.factor ? c.max_bytes : bytes * c.factor;
        if (bytes > c.max_bytes) bytes = c.max_bytes;
    }
    if (rank == 0 && nrows > 0) {
        char name[128], label[32];
        if (is_reduction(c.op))
            snprintf(name, sizeof name, "%s_%s_%s", op_names[c.op], dtype_names[c.dtype_idx],
                     redop);
        else
            snprintf(name, sizeof name, "%s_%s", op_names[c.op], dtype_names[c.dtype_idx]);
        const row_t *lo = &rows[0], *hi = &rows[nrows - 1];
        int64_t total_wrong = 0;
        for (int i = 0; i < nrows; i++) total_wrong += rows[i].wrong;
        size_label(lo->bytes, label, sizeof label);
        printf("RESULT %s_time_%s %.3f us\n", name, label, lo->time_us);
        if (c.op != OP_BARRIER) {
            size_label(hi->bytes, label, sizeof label);
            if (nrows > 1) printf("RESULT %s_time_%s %.3f us\n", name, label, hi->time_us);
            printf("RESULT %s_busbw_%s %.3f GB/s\n", name, label, hi->busbw);
        }
        if (c.check) printf("RESULT %s_wrong_elements %" PRId64 " elements\n", name, total_wrong);
        fflush(stdout);
    }
    if (status != 0 && rank == 0) fprintf(stderr, "tdist-bench: wrong elements found\n");
done:
    free(times);
    free(rows);
    tdist_pg_destroy(pg);
    tdist_world_destroy(world);
    return status;
}
