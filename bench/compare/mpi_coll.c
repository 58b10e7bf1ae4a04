/*
 * bench/compare/mpi_coll.c — the Open MPI side of bench/compare/run.sh.
 *
 * Measures one MPI collective (-o: all_reduce, broadcast, reduce,
 * all_gather, reduce_scatter, all_to_all, gather, scatter, barrier; f32,
 * SUM, out of place except broadcast; roots 0) exactly the way
 * tools/tdist-bench measures tdist's, with its buffer conventions (bytes
 * = the per-rank big buffer: all_gather's and gather's receive buffer,
 * reduce_scatter's, scatter's and all_to_all's send buffer; a block of
 * bytes / ranks per rank), so the two can be put side by side (see
 * docs/bench-compare.md):
 *
 *   for each size: MPI_Barrier; WARMUP warm-up calls; ITERS samples of
 *   BATCH consecutive calls each (-k, default 1), timed with
 *   CLOCK_MONOTONIC (no barrier between them; a sample is its time /
 *   BATCH); each rank takes the median of its ITERS samples; the row's time
 *   is the maximum over ranks of these medians (an MPI_Allreduce MAX).
 *   -k auto picks BATCH per size as tdist-bench does: as many calls as
 *   last about 100 us, from the warm-up calls' median (max over ranks).
 *   algbw = bytes / time; busbw = algbw * tdist-bench's factor (all_reduce
 *   2(n-1)/n; all_gather, reduce_scatter, all_to_all, gather, scatter
 *   (n-1)/n; broadcast, reduce 1; GB/s = 1e9 B/s). barrier: one row, 0
 *   bytes.
 *
 * Inputs are tdist-bench's: rank r, index i holds ((i % 1000003) * 7 +
 * r * 3) % 5 + 1; the output buffer is poisoned (-12345) before the
 * warm-up; after the timed loop every rank counts the elements of its
 * output that differ from what it computes locally; the row shows the
 * worst rank.
 *
 * Not part of the CMake build: run.sh compiles it with mpicc.
 *
 *   mpirun -np 2 ./mpi_coll -o all_gather -b 8 -e 64M -f 2 -n 20 -w 5
 *
 * Rank 0 prints rows in tdist-bench's format. Exit 0; 1 if any element
 * was wrong or a call failed; 2 for bad flags.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <mpi.h>

#define MAX_BYTES ((size_t)1 << 30)
#define MAX_SIZES 64
#define MAX_ITERS 1000000
#define MAX_BATCH 1000       /* as tdist-bench's -k */
#define AUTO_SAMPLE_US 100.0 /* as tdist-bench's -k auto */
#define POISON (-12345.0f)

typedef enum op {
    OP_ALL_REDUCE, OP_BROADCAST, OP_REDUCE, OP_ALL_GATHER, OP_REDUCE_SCATTER, OP_ALL_TO_ALL,
    OP_BARRIER, OP_GATHER, OP_SCATTER, OP_COUNT_
} op_t;

static const char *const op_names[OP_COUNT_] = {
    "all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter",
    "all_to_all", "barrier",   "gather", "scatter",
};

typedef struct cfg {
    op_t op;
    size_t min_bytes, max_bytes, factor;
    int iters, warmup;
    int batch; /* 0 = auto */
} cfg_t;

static void usage(FILE *f)
{
    fprintf(f, "usage: mpirun -np N mpi_coll [-o OP] [-b MIN] [-e MAX] [-f FACTOR] [-n ITERS]"
               " [-w WARMUP] [-k BATCH|auto]\n"
               "  OP: all_reduce (default) broadcast reduce all_gather reduce_scatter all_to_all\n"
               "      gather scatter barrier; f32 SUM, measured like tdist-bench\n"
               "  (defaults 8, 64M, 2, 20, 5, 1)\n");
}

/* "64M" -> 67108864 (K/M/G = powers of 1024, optional i and B), as tdist-bench. */
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
    if (*end || v > (1ULL << 40) / mult) return false;
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

static int parse_args(int argc, char **argv, cfg_t *c)
{
    c->op = OP_ALL_REDUCE;
    c->min_bytes = 8;
    c->max_bytes = (size_t)64 << 20;
    c->factor = 2;
    c->iters = 20;
    c->warmup = 5;
    c->batch = 1;
    long v;
    int opt;
    opterr = 0;
    while ((opt = getopt(argc, argv, ":o:b:e:f:n:w:k:h")) != -1) {
        switch (opt) {
        case 'o': {
            int k = 0;
            while (k < OP_COUNT_ && strcmp(optarg, op_names[k]) != 0) k++;
            if (k == OP_COUNT_) goto bad;
            c->op = (op_t)k;
            break;
        }
        case 'b':
            if (!parse_size(optarg, &c->min_bytes) || c->min_bytes == 0) goto bad;
            break;
        case 'e':
            if (!parse_size(optarg, &c->max_bytes) || c->max_bytes == 0) goto bad;
            break;
        case 'f':
            if (!parse_int(optarg, 2, 1 << 20, &v)) goto bad;
            c->factor = (size_t)v;
            break;
        case 'n':
            if (!parse_int(optarg, 1, MAX_ITERS, &v)) goto bad;
            c->iters = (int)v;
            break;
        case 'w':
            if (!parse_int(optarg, 0, MAX_ITERS, &v)) goto bad;
            c->warmup = (int)v;
            break;
        case 'k':
            if (strcmp(optarg, "auto") == 0)
                c->batch = 0;
            else if (parse_int(optarg, 1, MAX_BATCH, &v))
                c->batch = (int)v;
            else
                goto bad;
            break;
        case 'h': usage(stdout); return 1;
        default: goto bad;
        }
    }
    if (optind < argc || c->max_bytes > MAX_BYTES || c->min_bytes > c->max_bytes) goto bad;
    return 0;
bad:
    fprintf(stderr, "mpi_coll: bad arguments\n");
    usage(stderr);
    return 2;
}

static float input_value(int r, size_t i)
{
    int64_t ii = (int64_t)(i % 1000003);
    return (float)((ii * 7 + r * 3) % 5 + 1);
}

static float expected(int n, size_t i)
{
    int64_t acc = 0;
    for (int r = 0; r < n; r++) acc += (int64_t)input_value(r, i);
    return (float)acc;
}

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

/* Median of v[0..n) (sorts v); n >= 1. */
static double median_of(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* -k auto, as tdist-bench: calls per sample for calls of call_us each. */
static int auto_batch(double call_us)
{
    if (!(call_us > 0)) return 1;
    double k = AUTO_SAMPLE_US / call_us;
    return k < 1 ? 1 : k > MAX_BATCH ? MAX_BATCH : (int)k;
}

static bool chunked(op_t op)
{
    return op == OP_ALL_GATHER || op == OP_REDUCE_SCATTER || op == OP_ALL_TO_ALL ||
           op == OP_GATHER || op == OP_SCATTER;
}

static double bus_factor(op_t op, int n)
{
    switch (op) {
    case OP_ALL_REDUCE: return 2.0 * (n - 1) / n;
    case OP_BROADCAST:
    case OP_REDUCE: return 1.0;
    case OP_BARRIER: return 0.0;
    default: return (double)(n - 1) / n;
    }
}

/* A size's buffers, as tdist-bench sizes them (count: the big buffer's
 * elements; chunk: a rank's block). */
typedef struct run {
    size_t count, chunk, send_n, recv_n;
    float *send, *recv;
} run_t;

static bool setup(op_t op, int rank, int n, size_t bytes, run_t *r)
{
    memset(r, 0, sizeof *r);
    size_t count = bytes / sizeof(float);
    if (count == 0) count = 1;
    r->chunk = count;
    if (chunked(op)) {
        r->chunk = count / (size_t)n ? count / (size_t)n : 1;
        count = r->chunk * (size_t)n;
    }
    r->count = count;
    switch (op) {
    case OP_ALL_REDUCE: r->send_n = r->recv_n = count; break;
    case OP_REDUCE: r->send_n = count; r->recv_n = rank == 0 ? count : 0; break;
    case OP_BROADCAST: r->send_n = count; break; /* in place */
    case OP_ALL_GATHER: r->send_n = r->chunk; r->recv_n = count; break;
    case OP_GATHER: r->send_n = r->chunk; r->recv_n = rank == 0 ? count : 0; break;
    case OP_REDUCE_SCATTER: r->send_n = count; r->recv_n = r->chunk; break;
    case OP_SCATTER: r->send_n = rank == 0 ? count : 0; r->recv_n = r->chunk; break;
    case OP_ALL_TO_ALL: r->send_n = r->recv_n = count; break;
    default: break;
    }
    if (r->send_n && !(r->send = malloc(r->send_n * sizeof(float)))) return false;
    if (r->recv_n && !(r->recv = malloc(r->recv_n * sizeof(float)))) return false;
    int src = op == OP_BROADCAST || op == OP_SCATTER ? 0 : rank;
    for (size_t i = 0; i < r->send_n; i++) r->send[i] = input_value(src, i);
    if (op == OP_BROADCAST && rank != 0)
        for (size_t i = 0; i < r->send_n; i++) r->send[i] = POISON;
    for (size_t i = 0; i < r->recv_n; i++) r->recv[i] = POISON;
    return true;
}

static int one_call(op_t op, const run_t *r)
{
    int cnt = (int)r->count, ch = (int)r->chunk;
    MPI_Comm w = MPI_COMM_WORLD;
    switch (op) {
    case OP_ALL_REDUCE: return MPI_Allreduce(r->send, r->recv, cnt, MPI_FLOAT, MPI_SUM, w);
    case OP_BROADCAST: return MPI_Bcast(r->send, cnt, MPI_FLOAT, 0, w);
    case OP_REDUCE: return MPI_Reduce(r->send, r->recv, cnt, MPI_FLOAT, MPI_SUM, 0, w);
    case OP_ALL_GATHER: return MPI_Allgather(r->send, ch, MPI_FLOAT, r->recv, ch, MPI_FLOAT, w);
    case OP_REDUCE_SCATTER:
        return MPI_Reduce_scatter_block(r->send, r->recv, ch, MPI_FLOAT, MPI_SUM, w);
    case OP_ALL_TO_ALL: return MPI_Alltoall(r->send, ch, MPI_FLOAT, r->recv, ch, MPI_FLOAT, w);
    case OP_GATHER: return MPI_Gather(r->send, ch, MPI_FLOAT, r->recv, ch, MPI_FLOAT, 0, w);
    case OP_SCATTER: return MPI_Scatter(r->send, ch, MPI_FLOAT, r->recv, ch, MPI_FLOAT, 0, w);
    default: return MPI_Barrier(w);
    }
}

/* Wrong elements of this rank's output after the last call. */
static int64_t count_wrong(op_t op, int rank, int n, const run_t *r)
{
    int64_t wrong = 0;
    size_t ch = r->chunk, me = (size_t)rank * ch;
    for (size_t k = 0; k < r->recv_n; k++) {
        float want = 0;
        switch (op) {
        case OP_ALL_REDUCE:
        case OP_REDUCE: want = expected(n, k); break;
        case OP_REDUCE_SCATTER: want = expected(n, me + k); break;
        case OP_ALL_GATHER:
        case OP_GATHER: want = input_value((int)(k / ch), k % ch); break;
        case OP_SCATTER: want = input_value(0, me + k); break;
        case OP_ALL_TO_ALL: want = input_value((int)(k / ch), me + k % ch); break;
        default: break;
        }
        wrong += r->recv[k] != want;
    }
    if (op == OP_BROADCAST)
        for (size_t i = 0; i < r->send_n; i++) wrong += r->send[i] != input_value(0, i);
    return wrong;
}

/* One size; 0 ok, 1 wrong elements, -1 failed (message printed). */
static int bench_size(const cfg_t *c, int rank, int n, size_t bytes, double *times, FILE *out)
{
    run_t r;
    int rc = -1;
    if (bytes / sizeof(float) > (size_t)INT32_MAX) return -1;
    if (!setup(c->op, rank, n, bytes, &r)) {
        fprintf(stderr, "mpi_coll: rank %d: out of memory for %zu bytes\n", rank, bytes);
        goto done;
    }
    if (MPI_Barrier(MPI_COMM_WORLD) != MPI_SUCCESS) goto fail;
    int wt = 0; /* warm-up times (for -k auto) go into times[], overwritten below */
    for (int i = 0; i < c->warmup; i++) {
        double t0 = now_us();
        if (one_call(c->op, &r) != MPI_SUCCESS) goto fail;
        if (wt < c->iters) times[wt++] = now_us() - t0;
    }
    int batch = c->batch;
    if (batch == 0) {
        double call_us = wt ? median_of(times, wt) : 0, max_us = 0;
        if (MPI_Allreduce(&call_us, &max_us, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD) !=
            MPI_SUCCESS)
            goto fail;
        batch = auto_batch(max_us);
    }
    for (int i = 0; i < c->iters; i++) {
        double t0 = now_us();
        for (int j = 0; j < batch; j++)
            if (one_call(c->op, &r) != MPI_SUCCESS) goto fail;
        times[i] = (now_us() - t0) / batch;
    }
    double med = median_of(times, c->iters);
    int64_t wrong = count_wrong(c->op, rank, n, &r);
    double max_med = 0;
    int64_t max_wrong = 0;
    if (MPI_Allreduce(&med, &max_med, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD) != MPI_SUCCESS ||
        MPI_Allreduce(&wrong, &max_wrong, 1, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD) != MPI_SUCCESS)
        goto fail;
    size_t b = c->op == OP_BARRIER ? 0 : r.count * sizeof(float);
    double algbw = max_med > 0 ? (double)b / (max_med * 1e3) : 0.0;
    double busbw = algbw * bus_factor(c->op, n);
    if (rank == 0) {
        if (c->batch == 0) fprintf(out, "# %zu bytes: %d calls per sample\n", b, batch);
        fprintf(out, "  %12zu %12zu %5s %10s %12.3f %11.3f %11.3f %8" PRId64 "\n", b,
                c->op == OP_BARRIER ? (size_t)0 : r.count, "f32",
                c->op == OP_ALL_REDUCE || c->op == OP_REDUCE || c->op == OP_REDUCE_SCATTER
                    ? "sum" : "-",
                max_med, algbw, busbw, max_wrong);
        fflush(out);
    }
    rc = max_wrong ? 1 : 0;
    goto done;
fail:
    fprintf(stderr, "mpi_coll: rank %d: MPI call failed at %zu bytes\n", rank, bytes);
    rc = -1;
done:
    free(r.send);
    free(r.recv);
    return rc;
}

int main(int argc, char **argv)
{
    cfg_t c;
    int pr = parse_args(argc, argv, &c);
    if (pr == 1) return 0;
    if (pr != 0) return 2;
    if (MPI_Init(&argc, &argv) != MPI_SUCCESS) {
        fprintf(stderr, "mpi_coll: MPI_Init failed\n");
        return 1;
    }
    int rank, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    double *times = malloc((size_t)c.iters * sizeof *times);
    int status = 0;
    if (!times) {
        fprintf(stderr, "mpi_coll: rank %d: out of memory\n", rank);
        MPI_Abort(MPI_COMM_WORLD, 1);
        return 1;
    }
    if (rank == 0) {
        printf("# mpi_coll %s: %d ranks, dtype f32, redop sum, %d iterations (+%d "
               "warm-up), check on\n",
               op_names[c.op], n, c.iters, c.warmup);
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
    for (int s = 0; s < MAX_SIZES; s++) {
        int rc = bench_size(&c, rank, n, bytes, times, stdout);
        if (rc < 0) {
            free(times);
            MPI_Abort(MPI_COMM_WORLD, 1);
            return 1;
        }
        if (rc > 0) status = 1;
        if (bytes >= c.max_bytes || c.op == OP_BARRIER) break; /* sizes do not apply */
        bytes = bytes > c.max_bytes / c.factor ? c.max_bytes : bytes * c.factor;
    }
    if (status && rank == 0) fprintf(stderr, "mpi_coll: wrong elements found\n");
    free(times);
    MPI_Finalize();
    return status;
}
