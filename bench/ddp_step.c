/*
 * bench/ddp_step.c — training-step time of an MLP with tdist DDP against the
 * same step in one process (bench/compare/ddp.sh runs it next to PyTorch DDP
 * on Gloo and prints the table; docs/bench-ddp.md).
 *
 *   tdistrun --nproc-per-node 1 bench_ddp_step --mode local [options]
 *   tdistrun --nproc-per-node 2 bench_ddp_step --mode ddp   [options]
 *
 * options:
 *   --mode local|ddp  local: forward, loss, backward, SGD step; no reducer,
 *                     no communication in the loop (with several ranks each
 *                     trains alone: shows what sharing the machine costs).
 *                     ddp: the same with tdist DDP (default options), nn's
 *                     grad-ready hook calling tdist_ddp_grad_ready, so
 *                     buckets are reduced while backward goes on.
 *   --model 3M|25M|all  3M: 1024 -> 3 x Linear(1024)+ReLU -> Linear(10),
 *                     3,159,050 parameters; 25M: 2048 -> 6 x Linear(2048)+ReLU
 *                     -> Linear(10), 25,198,602 parameters (default all)
 *   -n N, -w W        timed and warm-up steps (defaults: 3M 30 + 5, 25M 10 + 3)
 *   --batch B         samples per rank (default 64)
 *   --threads T       OpenBLAS threads per process (default 1)
 *   --overlap on|off|inline|auto  the reducer's opts.overlap (default: the
 *                     reducer's default, on; on: buckets reduced by the
 *                     engine thread beside backward; off: in backward_end
 *                     on the training thread; inline: on the training
 *                     thread in the grad_ready completing the bucket)
 *   --cap MiB, --first MiB, --view   reducer options (defaults: 25, 1, off);
 *                     for experiments only, the table uses the defaults
 *   --no-probe        skip the stand-alone all_reduce of each bucket
 *   --trace           replace the default comm hook by an identical one
 *                     (PREMUL_SUM 1/world all_reduce, completion time taken
 *                     by the same kind of callback) that records when each
 *                     bucket is launched and done: prints the last step's
 *                     timeline and the comm busy time (union of the
 *                     buckets' launch..done intervals) next to the blocked
 *                     wait, i.e. how much communication really was hidden
 *   --hook H          (--mode ddp) reduce the buckets with a comm hook
 *                     (tdist/algorithms.h), registered before the first
 *                     forward_begin; H is one of
 *                       allreduce       the reducer's own averaging (no hook
 *                                       registered: the default, as without
 *                                       --hook)
 *                       allreduce_hook  tdist_ddp_allreduce_hook registered
 *                                       explicitly (the same all_reduce,
 *                                       through the hook path: bucket copies)
 *                       allreduce_grads the same hook registered with
 *                                       TDIST_DDP_HOOK_GRADS (one coalesced
 *                                       all_reduce of the gradients where
 *                                       they are: no bucket copies)
 *                       fp16, bf16      tdist_compress_hook (16-bit wire),
 *                                       tdist_compress_register (the casts
 *                                       read and write the gradients)
 *                       fp16_bucket     the fp16 hook registered with the
 *                                       plain tdist_ddp_register_comm_hook
 *                                       (the bucket path, with copies)
 *                       powersgdR       tdist_powersgd_hook, matrix rank R
 *                                       (1..64), start_powerSGD_iter
 *                                       --psgd-start (default 2), error
 *                                       feedback and warm start on, other
 *                                       options PyTorch's defaults;
 *                                       param_rows = out features of each
 *                                       Linear weight, 0 for the biases
 *                       int8            tdist_int8_hook, default options
 *                                       (block 256, no error feedback)
 *                     and prints the bytes this rank sends per timed
 *                     iteration (one BYTES line, below): allreduce,
 *                     allreduce_hook: what a ring all_reduce of the f32
 *                     buckets sends, 2 (W-1)/W x 4 x elements; fp16, bf16:
 *                     the same ring all_reduce of 2-byte elements;
 *                     powersgdR: the ring formula over the elements of the
 *                     two f32 all_reduces the hook posts per bucket,
 *                     [uncompressed | P] and Q, counted by the hook's
 *                     observer (and checked against the sizes computed from
 *                     the shapes); int8: tdist_int8_get_stats bytes_sent
 *                     (its all_to_all and all_gather messages). The
 *                     timed steps must come after start_powerSGD_iter:
 *                     the warm-up is raised to start + 1 if shorter
 *   --psgd-start N    start_powerSGD_iter for --hook powersgdR (>= 2,
 *                     default 2)
 *   --join            (--mode ddp) the whole loop, warm-up included, inside a
 *                     Join (tdist/join.h: tdist_join_begin before it,
 *                     tdist_join_end after it; default Join options). Every
 *                     rank has the same number of steps (even inputs), so
 *                     this measures what the Join costs: one all_gather of
 *                     one int64 per rank in every forward_begin
 *                     (bench/compare/join.sh, docs/bench-join.md)
 *   --join-disabled   the same with tdist_join_opts.enable = false (must cost
 *                     nothing)
 *   --join-empty-rank R  --join, and rank R has no inputs at all: it calls
 *                     tdist_join_begin and at once tdist_join_end, which
 *                     shadows every iteration of the others (bucket
 *                     all_reduces on zeros). The step time and the DDP
 *                     statistics are then those of the active ranks only
 *   --join-alternate M1,M2,...  (--mode ddp) all modes in ONE run: after the
 *                     warm-up (no Join), the timed steps go in blocks of
 *                     --block K steps (default 5), one block per mode in
 *                     turn (the order rotated every round), until every mode
 *                     has -n steps. Modes: ddp (no Join), join (the block
 *                     inside a Join), off (a Join with enable = false),
 *                     empty (a Join in which rank --join-empty-rank R,
 *                     default the last, has no inputs: it enters
 *                     tdist_join_end at once and shadows the block),
 *                     serial (no Join, a second reducer over the same
 *                     parameters with opts.overlap off: the buckets reduced
 *                     in backward_end; not with --view), inline and on (the
 *                     same with overlap inline / on). Whatever
 *                     else runs on the machine hits every mode alike, so
 *                     the ratios are steadier than between processes. The
 *                     Join's begin and end (a notification, the final
 *                     broadcast) are outside the timed steps, as with --join
 *
 * Without the env:// variables (RANK, WORLD_SIZE, ...) --mode local runs as a
 * single process without tdist at all.
 *
 * Data: synthetic, seeded: every rank its own 4 batches of B samples (inputs
 * uniform in [-1, 1), labels uniform in 0..9), cycled. Model parameters
 * from seed 1234 on every rank (equal, as after DDP's broadcast). SGD lr
 * 0.01 (tdist_optim). Cross-entropy over 10 classes.
 *
 * Timing: a step is [forward_begin, forward, loss, zero_grad, backward,
 * backward_end, SGD step], CLOCK_MONOTONIC around all of it. Each rank keeps
 * the time of every timed step; after the loop one all_reduce MAX over the
 * array gives, per step, the slowest rank; the step time is the median over
 * steps of that maximum (no collective inside the timed region besides the
 * reducer's). Phase times (forward+loss, backward, backward_end, step) are
 * medians over steps of the slowest rank as well.
 *
 * The DDP statistics (tdist_ddp_get_stats) are averaged over the timed
 * steps (difference of the totals) on each rank and the mean over ranks is
 * printed; overlap = 1 - wait / comm. After the loop, with --mode ddp, each
 * bucket's size is all_reduced alone (PREMUL_SUM 1/world, as the default
 * hook) to show what one bucket costs without computation beside it.
 *
 * With --join-empty-rank the empty rank keeps no step times (zeros), so the
 * MAX is over the active ranks; the statistics are averaged over the active
 * ranks. Active-rank throughput = active ranks x batch / step time.
 *
 * Output (rank 0): comment lines, one machine-readable row
 *   ROW tdist <mode> <model> <world> <median_ms> <min_ms> <max_ms> <overlap> <wait_ms> <comm_ms> <compute_ms>
 * ("-" where a field does not apply; <mode> is local, ddp, ddp_join,
 * ddp_joinoff, ddp_join_empty<R> or, with --hook H, ddp_H), with --hook one
 *   BYTES tdist <mode> <model> <world> <hook_bytes_per_iter> <f32_ring_bytes_per_iter>
 * (this rank's bytes per timed iteration, mean over ranks; the second is
 * what a ring all_reduce of the same f32 buckets sends), and RESULT lines.
 */
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <tdist/nn.h>
#include "tdist/tdist.h"

#define CLASSES 10
#define NBATCHES 4
#define MAX_STEPS 100000
#define LR 0.01

typedef struct model_spec {
    const char *name;
    size_t din, hidden;
    int layers; /* hidden Linear+ReLU layers */
    int steps, warmup;
} model_spec_t;

static const model_spec_t MODELS[] = {
    {"3M", 1024, 1024, 3, 30, 5},
    {"25M", 2048, 2048, 6, 10, 3},
};

typedef struct cfg {
    int ddp;
    int model_mask; /* bit i: MODELS[i] */
    int steps, warmup;
    size_t batch;
    int threads;
    double cap_mib, first_mib;
    int view;
    int overlap; /* --overlap: tdist_ddp_overlap_t, -1: the reducer's default */
    int probe;
    int trace;
    int join;       /* 0: no Join; 1: Join enabled; 2: Join with enable = false */
    int join_empty; /* rank without inputs under --join, or -1 */
    int alt[16];    /* --join-alternate: modes (ALT_*), alt_n of them */
    int alt_n;
    int block;      /* --block */
    int hook;       /* --hook: HOOK_* */
    int psgd_rank;  /* --hook powersgdR: R */
    int psgd_start; /* --psgd-start */
} cfg_t;

enum { HOOK_NONE, HOOK_ALLREDUCE, HOOK_ALLREDUCE_HOOK, HOOK_FP16, HOOK_BF16, HOOK_POWERSGD,
       HOOK_INT8, HOOK_ALLREDUCE_GRADS, HOOK_FP16_BUCKET };

/* --hook powersgdR: elements of the two all_reduces per bucket, summed
 * (the observer sees [uncompressed | P] and Q just before they are posted). */
typedef struct psgd_count {
    uint64_t pu_elems, q_elems, calls;
} psgd_count_t;

static void psgd_observe(void *arg, const tdist_ddp_bucket_t *b, tdist_powersgd_stage_t stage,
                         const float *data, size_t count)
{
    (void)b;
    (void)data;
    psgd_count_t *c = arg;
    if (stage == TDIST_POWERSGD_P_LOCAL) {
        c->pu_elems += count;
        c->calls++;
    } else if (stage == TDIST_POWERSGD_Q_LOCAL) {
        c->q_elems += count;
    }
}

enum { NTIMES = 11 }; /* per-step arrays of run_model */
enum { ALT_DDP, ALT_JOIN, ALT_OFF, ALT_EMPTY, ALT_SERIAL, ALT_INLINE, ALT_ON, ALT_COUNT };
static const char *const ALT_NAME[ALT_COUNT] = {"ddp", "join", "off", "empty", "serial", "inline", "on"};
/* The reducer overlap of the modes that have a reducer of their own (-1: the main one). */
static const int ALT_OVERLAP[ALT_COUNT] = {-1, -1, -1, -1, TDIST_DDP_OVERLAP_OFF, TDIST_DDP_OVERLAP_INLINE, TDIST_DDP_OVERLAP_ON};

/* --trace: per-bucket launch / completion times of the current step (ns,
 * CLOCK_MONOTONIC). done[] is written by the group's engine thread. */
#define TRACE_MAX_BUCKETS 64
typedef struct trace {
    uint64_t launch[TRACE_MAX_BUCKETS];
    _Atomic uint64_t done[TRACE_MAX_BUCKETS];
    uint64_t count[TRACE_MAX_BUCKETS];
    size_t nb;
} trace_t;

typedef struct ready_ctx {
    tdist_ddp_t *ddp;
    tdist_status_t st;
} ready_ctx_t;

static int g_rank;

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void trace_done(tdist_status_t st, void *user_data)
{
    (void)st;
    atomic_store((_Atomic uint64_t *)user_data, now_ns());
}

/* The default hook (tdist_ddp_allreduce_hook's all_reduce) plus timestamps. */
static tdist_status_t trace_hook(void *state, const tdist_ddp_bucket_t *b,
                                 tdist_ddp_hook_result_t *r)
{
    trace_t *t = state;
    size_t i = b->index < TRACE_MAX_BUCKETS ? b->index : TRACE_MAX_BUCKETS - 1;
    if (b->index + 1 > t->nb) t->nb = b->index + 1 < TRACE_MAX_BUCKETS ? b->index + 1 : TRACE_MAX_BUCKETS;
    t->launch[i] = now_ns();
    t->count[i] = b->count;
    atomic_store(&t->done[i], 0);
    tdist_coll_opts_t o;
    tdist_coll_opts_init(&o);
    o.premul_factor = 1.0 / (double)b->divisor;
    o.on_complete = trace_done;
    o.user_data = &t->done[i];
    return tdist_all_reduce(b->pg, b->buffer, b->buffer, b->count, b->dtype, TDIST_PREMUL_SUM, &o,
                            &r->work);
}

/* Union of the buckets' [launch, done] intervals, in ms (buckets run one at
 * a time in index order, so the intervals are taken in that order). */
static double trace_busy_ms(const trace_t *t)
{
    double busy = 0;
    uint64_t covered = 0;
    for (size_t b = 0; b < t->nb; b++) {
        uint64_t l = t->launch[b], d = atomic_load(&t->done[b]);
        if (d <= l) continue;
        if (l < covered) l = covered;
        if (d > l) busy += (double)(d - l) * 1e-6;
        if (d > covered) covered = d;
    }
    return busy;
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* CPU time of the calling (training) thread, ms. */
static double thread_cpu_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* CPU time of this process (every thread: training and engine), ms. */
static double cpu_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static int cmp_double(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

/* Median of v[0..n) (sorts a copy). */
static double median(const double *v, int n)
{
    if (n <= 0) return 0;
    double *c = malloc((size_t)n * sizeof *c);
    if (!c) return NAN;
    memcpy(c, v, (size_t)n * sizeof *c);
    qsort(c, (size_t)n, sizeof *c, cmp_double);
    double m = n % 2 ? c[n / 2] : (c[n / 2 - 1] + c[n / 2]) / 2;
    free(c);
    return m;
}

/* The q-quantile (0..1, nearest rank) of v[0..n). */
static double quantile(const double *v, int n, double q)
{
    if (n <= 0) return 0;
    double *c = malloc((size_t)n * sizeof *c);
    if (!c) return NAN;
    memcpy(c, v, (size_t)n * sizeof *c);
    qsort(c, (size_t)n, sizeof *c, cmp_double);
    int k = (int)(q * (n - 1) + 0.5);
    double x = c[k < 0 ? 0 : k >= n ? n - 1 : k];
    free(c);
    return x;
}

static uint64_t rng_next(uint64_t *s)
{
    /* splitmix64 */
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static int fail_tdist(const char *what, tdist_status_t st)
{
    fprintf(stderr, "bench_ddp_step: rank %d: %s failed: %s: %s\n", g_rank, what,
            tdist_status_str(st), tdist_last_error());
    return 1;
}

static int fail_nn(const char *what)
{
    fprintf(stderr, "bench_ddp_step: rank %d: %s failed: %s\n", g_rank, what, nn_last_error());
    return 1;
}

static void on_grad_ready(void *ctx, size_t i)
{
    ready_ctx_t *r = ctx;
    tdist_status_t st = tdist_ddp_grad_ready(r->ddp, i);
    if (st != TDIST_OK && r->st == TDIST_OK) r->st = st;
}

/* Element-wise MAX over ranks of v[0..n) in place (no-op without a group). */
static int max_over_ranks(tdist_pg_t *pg, double *v, size_t n)
{
    if (!pg || n == 0) return 0;
    tdist_status_t st = tdist_all_reduce(pg, v, v, n, TDIST_F64, TDIST_MAX, NULL, NULL);
    return st == TDIST_OK ? 0 : fail_tdist("all_reduce MAX of the step times", st);
}

static int sum_over_ranks(tdist_pg_t *pg, double *v, size_t n)
{
    if (!pg || n == 0) return 0;
    tdist_status_t st = tdist_all_reduce(pg, v, v, n, TDIST_F64, TDIST_SUM, NULL, NULL);
    return st == TDIST_OK ? 0 : fail_tdist("all_reduce SUM of the statistics", st);
}

static nn_seq_t *build_model(const model_spec_t *ms)
{
    nn_seq_t *m = nn_seq_create(1, 1, ms->din, 1234);
    if (!m) return NULL;
    for (int l = 0; l < ms->layers; l++) {
        if (nn_linear(m, ms->hidden) != 0 || nn_relu(m) != 0) goto bad;
    }
    if (nn_linear(m, CLASSES) != 0) goto bad;
    return m;
bad:
    nn_seq_destroy(m);
    return NULL;
}

/* Stand-alone all_reduce of every bucket's size: median of reps, max over ranks. */
static int probe_buckets(tdist_pg_t *pg, tdist_ddp_t *ddp, const nn_param_t *p, size_t np)
{
    size_t nb = tdist_ddp_num_buckets(ddp);
    if (nb == 0 || nb > 256) return 0;
    size_t *idx = malloc(np * sizeof *idx);
    double *ms = calloc(nb, sizeof *ms);
    size_t *counts = calloc(nb, sizeof *counts);
    size_t maxc = 0;
    int rc = 1;
    float *buf = NULL;
    if (!idx || !ms || !counts) goto out;
    for (size_t b = 0; b < nb; b++) {
        size_t k = tdist_ddp_bucket_params(ddp, b, idx, np);
        for (size_t j = 0; j < k && j < np; j++) counts[b] += p[idx[j]].count;
        if (counts[b] > maxc) maxc = counts[b];
    }
    buf = malloc(maxc * sizeof *buf);
    if (!buf) goto out;
    for (size_t i = 0; i < maxc; i++) buf[i] = 1e-3f * (float)(i % 97);
    tdist_coll_opts_t o;
    tdist_coll_opts_init(&o);
    o.premul_factor = 1.0 / tdist_pg_size(pg);
    enum { REPS = 7 };
    for (size_t b = 0; b < nb; b++) {
        double t[REPS];
        for (int r = 0; r < REPS + 1; r++) { /* the first one is a warm-up */
            double t0 = now_ms();
            tdist_status_t st =
                tdist_all_reduce(pg, buf, buf, counts[b], TDIST_F32, TDIST_PREMUL_SUM, &o, NULL);
            if (st != TDIST_OK) {
                fail_tdist("bucket probe all_reduce", st);
                goto out;
            }
            if (r > 0) t[r - 1] = now_ms() - t0;
        }
        ms[b] = median(t, REPS);
    }
    if (max_over_ranks(pg, ms, nb) != 0) goto out;
    if (g_rank == 0) {
        printf("# stand-alone all_reduce of each bucket (PREMUL_SUM f32, median of %d, max over"
               " ranks):",
               REPS);
        for (size_t b = 0; b < nb; b++)
            printf(" b%zu %.2f MB %.2f ms (%.2f GB/s);", b, counts[b] * 4e-6, ms[b],
                   ms[b] > 0 ? counts[b] * 4e-6 / ms[b] : 0.0);
        printf("\n");
    }
    rc = 0;
out:
    free(buf);
    free(idx);
    free(ms);
    free(counts);
    return rc;
}

/* What one training step needs (--join-alternate). */
typedef struct step_ctx {
    nn_seq_t *m;
    tdist_ddp_t *ddp;
    tdist_optim_t *opt;
    ready_ctx_t *rctx;
    const float *x;
    const int *labels;
    float *dlogits;
    size_t B, din;
    tdist_ddp_t **own; /* ALT_COUNT: the reducer of a mode with its own (ALT_OVERLAP), or NULL */
} step_ctx_t;

/* One whole step on batch `it`; its time in ms, or -1 after an error
 * (reported). */
static double one_step(const step_ctx_t *k, int it)
{
    const float *xb = k->x + (size_t)(it % NBATCHES) * k->B * k->din;
    const int *lb = k->labels + (size_t)(it % NBATCHES) * k->B;
    float loss;
    tdist_status_t st;
    double t0 = now_ms();
    if ((st = tdist_ddp_forward_begin(k->ddp)) != TDIST_OK)
        return fail_tdist("tdist_ddp_forward_begin", st), -1;
    float *logits = nn_forward(k->m, xb, k->B);
    if (!logits || nn_cross_entropy(logits, lb, k->B, CLASSES, &loss, k->dlogits) != 0)
        return fail_nn("forward"), -1;
    nn_zero_grad(k->m);
    if (nn_backward(k->m, k->dlogits) != 0) return fail_nn("nn_backward"), -1;
    if (k->rctx->st != TDIST_OK) return fail_tdist("tdist_ddp_grad_ready", k->rctx->st), -1;
    if ((st = tdist_ddp_backward_end(k->ddp)) != TDIST_OK)
        return fail_tdist("tdist_ddp_backward_end", st), -1;
    if ((st = tdist_optim_step(k->opt)) != TDIST_OK) return fail_tdist("tdist_optim_step", st), -1;
    double t = now_ms() - t0;
    if (!isfinite(loss)) {
        fprintf(stderr, "bench_ddp_step: rank %d: loss is %g at step %d\n", g_rank, (double)loss, it);
        return -1;
    }
    return t;
}

/* --join-alternate: the modes in blocks, in one process; 0 on success. */
static int alt_loop(const cfg_t *c, const model_spec_t *ms, const step_ctx_t *k, tdist_pg_t *pg,
                    int world, int steps, int warmup)
{
    int K = c->block, nm = c->alt_n;
    int rounds = (steps + K - 1) / K, per = rounds * K; /* timed steps per mode */
    int empty_rank = c->join_empty >= 0 ? c->join_empty : world - 1;
    double *t = calloc((size_t)nm * (size_t)per, sizeof *t);
    double *rr = calloc((size_t)nm * (size_t)rounds, sizeof *rr);
    double *cpu = calloc((size_t)nm * (size_t)per, sizeof *cpu); /* CPU time per step */
    int rc = 1, it = 0;
    if (!t || !rr || !cpu) {
        fprintf(stderr, "bench_ddp_step: out of memory\n");
        goto out;
    }
    step_ctx_t ks[ALT_COUNT]; /* a mode with its own reducer: the same step on it */
    for (int q = 0; q < ALT_COUNT; q++) {
        ks[q] = *k;
        if (k->own[q]) ks[q].ddp = k->own[q];
    }
    for (int w = 0; w < warmup; w++)
        if (one_step(k, it++) < 0) goto out;
    for (int q = 0; q < ALT_COUNT; q++) {
        if (!k->own[q]) continue;
        k->rctx->ddp = ks[q].ddp;
        for (int w = 0; w < warmup; w++)
            if (one_step(&ks[q], it++) < 0) goto out;
        k->rctx->ddp = k->ddp;
    }
    for (int r = 0; r < rounds; r++) {
        for (int q = 0; q < nm; q++) {
            int mi = (q + r) % nm, mode = c->alt[mi];
            tdist_join_t *join = NULL;
            tdist_status_t st;
            if (mode != ALT_DDP && !k->own[mode]) {
                tdist_joinable_t j;
                tdist_join_opts_t jo;
                tdist_join_opts_init(&jo);
                jo.enable = mode != ALT_OFF;
                if ((st = tdist_ddp_joinable(k->ddp, &j)) != TDIST_OK ||
                    (st = tdist_join_begin(&j, 1, &jo, &join)) != TDIST_OK) {
                    fail_tdist("tdist_join_begin", st);
                    goto out;
                }
            }
            bool idle = mode == ALT_EMPTY && g_rank == empty_rank;
            const step_ctx_t *kk = &ks[mode];
            k->rctx->ddp = kk->ddp;
            for (int s = 0; s < K && !idle; s++) {
                double c0 = cpu_ms();
                double dt = one_step(kk, it++);
                cpu[(size_t)mi * per + (size_t)r * K + s] = cpu_ms() - c0;
                if (dt < 0) {
                    if (join) (void)tdist_join_end(join);
                    goto out;
                }
                t[(size_t)mi * per + (size_t)r * K + s] = dt;
            }
            k->rctx->ddp = k->ddp;
            if (join && (st = tdist_join_end(join)) != TDIST_OK) {
                fail_tdist("tdist_join_end", st);
                goto out;
            }
        }
    }
    if (max_over_ranks(pg, t, (size_t)nm * per) != 0) goto out;
    if (max_over_ranks(pg, cpu, (size_t)nm * per) != 0) goto out;
    double med[ALT_COUNT];
    for (int mi = 0; mi < nm; mi++) {
        med[mi] = median(t + (size_t)mi * per, per);
        for (int r = 0; r < rounds; r++) rr[(size_t)mi * rounds + r] = median(t + (size_t)mi * per + (size_t)r * K, K);
    }
    if (g_rank == 0) {
        printf("# model %s, batch %zu per rank, world %d, --join-alternate: %d rounds of", ms->name,
               k->B, world, rounds);
        for (int mi = 0; mi < nm; mi++) printf(" %s", ALT_NAME[c->alt[mi]]);
        printf(" (%d steps each; order rotated per round), %d warm-up steps; empty rank %d\n", K,
               warmup, empty_rank);
        for (int mi = 0; mi < nm; mi++) {
            int mode = c->alt[mi];
            int act = mode == ALT_EMPTY ? world - 1 : world;
            printf("# %-5s: step median %.3f ms over %d steps (slowest%s rank per step);"
                   " active-rank throughput %.1f samples/s\n",
                   ALT_NAME[mode], med[mi], per, mode == ALT_EMPTY ? " active" : "",
                   med[mi] > 0 ? act * (double)k->B * 1e3 / med[mi] : 0.0);
            double mn = t[(size_t)mi * per], mx = mn;
            for (int j = 1; j < per; j++) {
                double v = t[(size_t)mi * per + j];
                mn = v < mn ? v : mn;
                mx = v > mx ? v : mx;
            }
            printf("# %-5s: step 10th / 25th percentile %.3f / %.3f ms (the machine's quieter"
                   " moments); cpu time per step (process, max over ranks) median %.3f ms\n",
                   ALT_NAME[mode], quantile(t + (size_t)mi * per, per, 0.10),
                   quantile(t + (size_t)mi * per, per, 0.25), median(cpu + (size_t)mi * per, per));
            printf("ROW tdist alt_%s %s %d %.4f %.4f %.4f - - - -\n", ALT_NAME[mode], ms->name,
                   world, med[mi], mn, mx);
            printf("RESULT ddp_step_%s_ddp%d_alt_%s_ms %.3f ms\n", ms->name, world, ALT_NAME[mode],
                   med[mi]);
        }
        /* ratios against the first mode: of the medians, and the median of
         * the per-round ratios (blocks adjacent in time) */
        for (int mi = 1; mi < nm; mi++) {
            double *pr = rr + (size_t)mi * rounds; /* reuse: per-round ratio */
            double tmp[1024];
            int nr = rounds < 1024 ? rounds : 1024;
            for (int r = 0; r < nr; r++) tmp[r] = rr[r] > 0 ? pr[r] / rr[r] : 0;
            const char *a = ALT_NAME[c->alt[mi]], *b = ALT_NAME[c->alt[0]];
            printf("# %s/%s: ratio of the medians %.4f, median of the %d per-round ratios %.4f\n",
                   a, b, med[0] > 0 ? med[mi] / med[0] : 0.0, nr, median(tmp, nr));
            printf("RESULT ddp_step_%s_ddp%d_alt_%s_over_%s %.4f x\n", ms->name, world, a, b,
                   median(tmp, nr));
            if (c->alt[mi] == ALT_EMPTY && median(tmp, nr) > 0)
                printf("RESULT ddp_step_%s_ddp%d_alt_empty_throughput_vs_%s %.4f x\n", ms->name,
                       world, b, 1.0 / median(tmp, nr));
        }
        fflush(stdout);
    }
    rc = 0;
out:
    free(t);
    free(rr);
    free(cpu);
    return rc;
}

/* Where a DDP step's communication time goes (mean over timed steps and
 * ranks: tl holds sums over both, n of them): each bucket's timeline since
 * forward_begin, its start estimated as the later of its launch and the
 * previous bucket's completion (the group runs one collective at a time),
 * so launch -> start is the wait behind earlier buckets, start -> done the
 * reduction itself as it ran beside backward; then the reductions' busy
 * time, the part after backward ended (exposed), the gradient copies and
 * backward_end's blocked wait. */
static void print_breakdown(tdist_ddp_t *ddp, const double *tl, size_t tl_max, double n,
                            double copy_ms, double wait_ms)
{
    size_t nb = tdist_ddp_num_buckets(ddp);
    if (nb > tl_max) nb = tl_max;
    double bwd = tl[3 * tl_max] / n, prev_done = 0, busy = 0, exposed = 0;
    printf("# breakdown (ms since forward_begin, mean over steps and ranks): backward ends %.3f;",
           bwd);
    for (size_t b = 0; b < nb; b++) {
        double ready = tl[3 * b] / n, launch = tl[3 * b + 1] / n, done = tl[3 * b + 2] / n;
        double start = launch > prev_done ? launch : prev_done;
        double run = done > start ? done - start : 0;
        busy += run;
        if (done > bwd) exposed += done - (start > bwd ? start : bwd);
        printf(" b%zu ready %.3f launch %.3f start %.3f done %.3f (runs %.3f);", b, ready, launch,
               start, done, run);
        prev_done = done;
    }
    printf("\n# breakdown: reductions running %.3f ms, of which %.3f after backward ended;"
           " gradient copies %.3f ms; backward_end blocked %.3f ms\n",
           busy, exposed, copy_ms, wait_ms);
}

/* --hook's name as printed: allreduce, allreduce_hook, fp16, bf16, powersgdR, int8,
 * allreduce_grads, fp16_bucket. */
static const char *hook_name(const cfg_t *c, char *buf, size_t cap)
{
    static const char *const names[] = {"none", "allreduce", "allreduce_hook", "fp16", "bf16",
                                         "powersgd", "int8", "allreduce_grads", "fp16_bucket"};
    if (c->hook == HOOK_POWERSGD) snprintf(buf, cap, "powersgd%d", c->psgd_rank);
    else snprintf(buf, cap, "%s", names[c->hook]);
    return buf;
}

/* PowerSGD's elements per iteration from the shapes, by the hook's rule
 * (docs/algorithms.md): a weight n x m with r' = min(n, m, R) is
 * compressed iff (n + m) r' x 2 < n m (min_compression_rate 2): P n r' and
 * Q m r' elements; everything else goes uncompressed with P.
 * ep[0]: [uncompressed | P], ep[1]: Q. */
static void psgd_expected(const cfg_t *c, const nn_param_t *p, size_t np, const size_t *rows,
                          double *ep)
{
    ep[0] = ep[1] = 0;
    for (size_t i = 0; i < np; i++) {
        size_t n = rows ? rows[i] : 0, m = n ? p[i].count / n : 0;
        size_t r = (size_t)c->psgd_rank;
        if (n && r > n) r = n;
        if (m && r > m) r = m;
        if (n && (double)(n + m) * (double)r * 2.0 < (double)n * (double)m) {
            ep[0] += (double)(n * r);
            ep[1] += (double)(m * r);
        } else {
            ep[0] += (double)p[i].count;
        }
    }
}

/* Create and register the comm hook of --hook on ddp (nothing for
 * allreduce: the reducer's own averaging). The states go to *hc / *hp /
 * *hi, owned by the caller. */
static tdist_status_t register_hook(const cfg_t *c, tdist_ddp_t *ddp, const size_t *rows,
                                    size_t np, psgd_count_t *pc, tdist_compress_t **hc,
                                    tdist_powersgd_t **hp, tdist_int8_t **hi)
{
    tdist_status_t st = TDIST_OK;
    switch (c->hook) {
    case HOOK_ALLREDUCE_HOOK:
        st = tdist_ddp_register_comm_hook(ddp, NULL, tdist_ddp_allreduce_hook);
        break;
    case HOOK_ALLREDUCE_GRADS:
        st = tdist_ddp_register_comm_hook_flags(ddp, NULL, tdist_ddp_allreduce_hook,
                                                TDIST_DDP_HOOK_GRADS);
        break;
    case HOOK_FP16:
    case HOOK_BF16:
    case HOOK_FP16_BUCKET: {
        tdist_compress_opts_t o;
        tdist_compress_opts_init(&o);
        o.wire = c->hook == HOOK_BF16 ? TDIST_BF16 : TDIST_F16;
        st = tdist_compress_hook_create(&o, hc);
        if (st == TDIST_OK && c->hook == HOOK_FP16_BUCKET) /* the bucket path, with copies */
            st = tdist_ddp_register_comm_hook(ddp, *hc, tdist_compress_hook);
        else if (st == TDIST_OK)
            st = tdist_compress_register(ddp, *hc);
        break;
    }
    case HOOK_POWERSGD: {
        tdist_powersgd_opts_t o;
        tdist_powersgd_opts_init(&o);
        o.matrix_approximation_rank = c->psgd_rank;
        o.start_powerSGD_iter = c->psgd_start;
        o.use_error_feedback = true;
        o.warm_start = true;
        o.param_rows = rows;
        o.num_params = np;
        o.observe = psgd_observe;
        o.observe_arg = pc;
        st = tdist_powersgd_create(&o, hp);
        if (st == TDIST_OK) st = tdist_powersgd_register(ddp, *hp);
        break;
    }
    case HOOK_INT8:
        st = tdist_int8_hook_create(NULL, hi);
        if (st == TDIST_OK) st = tdist_int8_register(ddp, *hi);
        break;
    default: break;
    }
    return st;
}

/* Run one model; 0 on success. */
static int run_model(const cfg_t *c, const model_spec_t *ms, tdist_pg_t *pg, int world)
{
    int steps = c->steps > 0 ? c->steps : ms->steps;
    int warmup = c->warmup >= 0 ? c->warmup : ms->warmup;
    size_t B = c->batch;
    int rc = 1;
    nn_seq_t *m = build_model(ms);
    tdist_ddp_param_t *dp = NULL;
    tdist_optim_param_t *op = NULL;
    tdist_ddp_t *ddp = NULL, *own[ALT_COUNT] = {0}; /* own: --join-alternate modes' reducers */
    tdist_optim_t *opt = NULL;
    float *x = NULL, *dlogits = NULL;
    int *labels = NULL;
    double *times = NULL; /* NTIMES arrays of steps: total, fwd, bwd, bwd_end, optim, cpu, then the
                           * training thread's CPU time in fwd, bwd, bwd_end, optim */
    trace_t *tr = NULL;
    tdist_join_t *join = NULL;
    tdist_compress_t *hk_c = NULL; /* --hook fp16 / bf16 */
    tdist_powersgd_t *hk_p = NULL; /* --hook powersgdR */
    tdist_int8_t *hk_i = NULL;     /* --hook int8 */
    size_t *rows = NULL;           /* powersgd param_rows */
    psgd_count_t pc = {0, 0, 0}, pc0 = {0, 0, 0};
    tdist_int8_stats_t i8s0, i8s1;
    memset(&i8s0, 0, sizeof i8s0);
    memset(&i8s1, 0, sizeof i8s1);
    /* under --join-empty-rank, this rank has no inputs at all */
    const int empty = c->join == 1 && c->join_empty == g_rank;
    if (!m) return fail_nn("building the model");
    size_t np = 0;
    nn_param_t *p = nn_params(m, &np);
    if (!p) {
        rc = fail_nn("nn_params");
        goto out;
    }
    size_t nparams = 0;
    for (size_t i = 0; i < np; i++) nparams += p[i].count;

    size_t din = ms->din;
    x = malloc(NBATCHES * B * din * sizeof *x);
    labels = malloc(NBATCHES * B * sizeof *labels);
    dlogits = malloc(B * CLASSES * sizeof *dlogits);
    times = calloc(NTIMES * (size_t)steps, sizeof *times);
    dp = calloc(np, sizeof *dp);
    op = calloc(np, sizeof *op);
    if (!x || !labels || !dlogits || !times || !dp || !op) {
        fprintf(stderr, "bench_ddp_step: out of memory\n");
        goto out;
    }
    uint64_t seed = 0x5eed0000ull + (uint64_t)g_rank * 7919u;
    for (size_t i = 0; i < NBATCHES * B * din; i++)
        x[i] = (float)((double)(rng_next(&seed) >> 11) * 0x1.0p-52 - 1.0);
    for (size_t i = 0; i < NBATCHES * B; i++) labels[i] = (int)(rng_next(&seed) % CLASSES);

    for (size_t i = 0; i < np; i++) {
        dp[i] = (tdist_ddp_param_t){p[i].data, p[i].grad, p[i].count, TDIST_F32, p[i].name};
        op[i] = (tdist_optim_param_t){p[i].data, p[i].grad, p[i].count, p[i].name};
    }
    tdist_status_t st;
    tdist_optim_sgd_opts_t so;
    tdist_optim_sgd_opts_init(&so);
    so.lr = LR;
    st = tdist_optim_create_sgd(op, np, &so, &opt);
    if (st != TDIST_OK) {
        rc = fail_tdist("tdist_optim_create_sgd", st);
        goto out;
    }
    ready_ctx_t rctx = {NULL, TDIST_OK};
    if (c->ddp) {
        tdist_ddp_opts_t o;
        tdist_ddp_opts_init(&o);
        if (c->cap_mib > 0) o.bucket_cap_bytes = (size_t)(c->cap_mib * 1048576.0);
        if (c->first_mib > 0) o.first_bucket_bytes = (size_t)(c->first_mib * 1048576.0);
        o.gradient_as_bucket_view = c->view != 0;
        if (c->overlap >= 0) o.overlap = (tdist_ddp_overlap_t)c->overlap;
        st = tdist_ddp_create(pg, dp, np, NULL, 0, &o, &ddp);
        if (st != TDIST_OK) {
            rc = fail_tdist("tdist_ddp_create", st);
            goto out;
        }
        rctx.ddp = ddp;
        nn_set_grad_ready_hook(m, on_grad_ready, &rctx);
        if (c->trace) {
            tr = calloc(1, sizeof *tr);
            if (!tr) {
                fprintf(stderr, "bench_ddp_step: out of memory\n");
                goto out;
            }
            st = tdist_ddp_register_comm_hook(ddp, tr, trace_hook);
            if (st != TDIST_OK) {
                rc = fail_tdist("tdist_ddp_register_comm_hook", st);
                goto out;
            }
        }
        if (c->hook == HOOK_POWERSGD) {
            rows = calloc(np, sizeof *rows);
            if (!rows) {
                fprintf(stderr, "bench_ddp_step: out of memory\n");
                goto out;
            }
            /* nn's parameters: weight, bias of each Linear in order; a
             * weight is out x in (PyTorch's shape[0] = out features) */
            for (size_t i = 0; i + 1 < np; i += 2) {
                size_t l = i / 2;
                rows[i] = l < (size_t)ms->layers ? ms->hidden : CLASSES;
                if (p[i].count % rows[i] != 0 || p[i + 1].count != rows[i]) {
                    fprintf(stderr, "bench_ddp_step: parameter %zu (%s) is not a %zu-row weight\n",
                            i, p[i].name, rows[i]);
                    goto out;
                }
            }
            if (warmup < c->psgd_start + 1) {
                if (g_rank == 0)
                    printf("# powersgd: warm-up raised from %d to %d steps (start_powerSGD_iter %d"
                           " + 1), so that every timed step is compressed with a warm Q\n",
                           warmup, c->psgd_start + 1, c->psgd_start);
                warmup = c->psgd_start + 1;
            }
        }
        st = register_hook(c, ddp, rows, np, &pc, &hk_c, &hk_p, &hk_i);
        if (st != TDIST_OK) {
            rc = fail_tdist("registering the comm hook", st);
            goto out;
        }
    }

    if (c->alt_n > 0) {
        step_ctx_t k = {m, ddp, opt, &rctx, x, labels, dlogits, B, din, own};
        for (int q = 0; q < c->alt_n; q++) {
            int mode = c->alt[q];
            if (ALT_OVERLAP[mode] < 0) continue;
            tdist_ddp_opts_t o;
            tdist_ddp_opts_init(&o);
            if (c->cap_mib > 0) o.bucket_cap_bytes = (size_t)(c->cap_mib * 1048576.0);
            if (c->first_mib > 0) o.first_bucket_bytes = (size_t)(c->first_mib * 1048576.0);
            o.overlap = (tdist_ddp_overlap_t)ALT_OVERLAP[mode];
            if ((st = tdist_ddp_create(pg, dp, np, NULL, 0, &o, &own[mode])) != TDIST_OK) {
                rc = fail_tdist("tdist_ddp_create (a --join-alternate mode)", st);
                goto out;
            }
        }
        rc = alt_loop(c, ms, &k, pg, world, steps, warmup);
        goto out;
    }
    tdist_ddp_stats_t s0, s1;
    memset(&s0, 0, sizeof s0);
    memset(&s1, 0, sizeof s1);
    float loss = 0, first_loss = 0;
    double tr_busy = 0, tr_exposed = 0; /* --trace sums over the timed steps */
    /* the breakdown: sums over the timed steps of each bucket's timeline
     * (tdist_ddp_bucket_timeline) and of when backward ended, ms since
     * forward_begin; [3 * TL_MAX] the backward end */
    enum { TL_MAX = 64 };
    double tl[3 * TL_MAX + 1];
    memset(tl, 0, sizeof tl);
    uint64_t tr_t1 = 0, tr_t2 = 0; /* last step: backward start, backward_end start */
    int total = empty ? 0 : warmup + steps;
    if (ddp && c->join) {
        tdist_joinable_t j;
        tdist_join_opts_t jo;
        tdist_join_opts_init(&jo);
        jo.enable = c->join == 1;
        if ((st = tdist_ddp_joinable(ddp, &j)) != TDIST_OK ||
            (st = tdist_join_begin(&j, 1, &jo, &join)) != TDIST_OK) {
            rc = fail_tdist("tdist_join_begin", st);
            goto out;
        }
    }
    for (int it = 0; it < total; it++) {
        if (ddp && it == warmup) {
            st = tdist_ddp_get_stats(ddp, &s0);
            if (st != TDIST_OK) {
                rc = fail_tdist("tdist_ddp_get_stats", st);
                goto out;
            }
            pc0 = pc;
            if (hk_i && (st = tdist_int8_get_stats(hk_i, &i8s0)) != TDIST_OK) {
                rc = fail_tdist("tdist_int8_get_stats", st);
                goto out;
            }
            if (hk_p && tdist_powersgd_iteration(hk_p) < c->psgd_start) {
                fprintf(stderr, "bench_ddp_step: rank %d: PowerSGD at iteration %lld before the"
                                " timed steps, not yet compressing\n",
                        g_rank, (long long)tdist_powersgd_iteration(hk_p));
                goto out;
            }
        }
        if (ddp && c->view) { /* the rebuild after iteration 1 may move the views */
            for (size_t i = 0; i < np; i++) {
                p[i].grad = tdist_ddp_grad_ptr(ddp, i);
                st = tdist_optim_set_grad(opt, i, p[i].grad);
                if (st != TDIST_OK) {
                    rc = fail_tdist("tdist_optim_set_grad", st);
                    goto out;
                }
            }
        }
        const float *xb = x + (size_t)(it % NBATCHES) * B * din;
        const int *lb = labels + (size_t)(it % NBATCHES) * B;
        double c0 = cpu_ms(), u0 = thread_cpu_ms(), t0 = now_ms();
        if (ddp && (st = tdist_ddp_forward_begin(ddp)) != TDIST_OK) {
            rc = fail_tdist("tdist_ddp_forward_begin", st);
            goto out;
        }
        float *logits = nn_forward(m, xb, B);
        if (!logits || nn_cross_entropy(logits, lb, B, CLASSES, &loss, dlogits) != 0) {
            rc = fail_nn("forward");
            goto out;
        }
        nn_zero_grad(m);
        double t1 = now_ms(), u1 = thread_cpu_ms();
        if (nn_backward(m, dlogits) != 0) {
            rc = fail_nn("nn_backward");
            goto out;
        }
        if (rctx.st != TDIST_OK) {
            rc = fail_tdist("tdist_ddp_grad_ready", rctx.st);
            goto out;
        }
        double t2 = now_ms(), u2 = thread_cpu_ms();
        if (ddp && (st = tdist_ddp_backward_end(ddp)) != TDIST_OK) {
            rc = fail_tdist("tdist_ddp_backward_end", st);
            goto out;
        }
        double t3 = now_ms(), u3 = thread_cpu_ms();
        if ((st = tdist_optim_step(opt)) != TDIST_OK) {
            rc = fail_tdist("tdist_optim_step", st);
            goto out;
        }
        double t4 = now_ms(), c4 = cpu_ms(), u4 = thread_cpu_ms();
        if (it == 0) first_loss = loss;
        if (!isfinite(loss)) {
            fprintf(stderr, "bench_ddp_step: rank %d: loss is %g at step %d\n", g_rank, (double)loss,
                    it);
            goto out;
        }
        if (it >= warmup) {
            int k = it - warmup;
            if (tr) {
                /* ms -> ns on the same clock: now_ms() is CLOCK_MONOTONIC too */
                tr_t1 = (uint64_t)(t1 * 1e6);
                tr_t2 = (uint64_t)(t2 * 1e6);
                uint64_t last_done = 0;
                for (size_t b = 0; b < tr->nb; b++)
                    if (atomic_load(&tr->done[b]) > last_done) last_done = atomic_load(&tr->done[b]);
                tr_busy += trace_busy_ms(tr);
                tr_exposed += last_done > tr_t2 ? (double)(last_done - tr_t2) * 1e-6 : 0.0;
            }
            if (ddp) {
                size_t nbk = tdist_ddp_num_buckets(ddp);
                for (size_t b = 0; b < nbk && b < TL_MAX; b++) {
                    tdist_ddp_bucket_timeline_t bt;
                    if (tdist_ddp_bucket_timeline(ddp, b, &bt) != TDIST_OK) continue;
                    tl[3 * b] += bt.ready_ms;
                    tl[3 * b + 1] += bt.launch_ms;
                    tl[3 * b + 2] += bt.done_ms;
                }
                tl[3 * TL_MAX] += t2 - t0;
            }
            times[k] = t4 - t0;
            times[steps + k] = t1 - t0;
            times[2 * steps + k] = t2 - t1;
            times[3 * steps + k] = t3 - t2;
            times[4 * steps + k] = t4 - t3;
            times[5 * steps + k] = c4 - c0;
            times[6 * steps + k] = u1 - u0;
            times[7 * steps + k] = u2 - u1;
            times[8 * steps + k] = u3 - u2;
            times[9 * steps + k] = u4 - u3;
            times[10 * steps + k] = (c4 - c0) - (u4 - u0);
        }
    }
    if (join) {
        /* an empty rank shadows every iteration in here; the others leave
         * their loops together, so for them it is one notification and the
         * final parameter broadcast (not timed) */
        st = tdist_join_end(join);
        join = NULL; /* freed in every case */
        if (st != TDIST_OK) {
            rc = fail_tdist("tdist_join_end", st);
            goto out;
        }
    }
    if (ddp && (st = tdist_ddp_get_stats(ddp, &s1)) != TDIST_OK) {
        rc = fail_tdist("tdist_ddp_get_stats", st);
        goto out;
    }
    if (hk_i && (st = tdist_int8_get_stats(hk_i, &i8s1)) != TDIST_OK) {
        rc = fail_tdist("tdist_int8_get_stats", st);
        goto out;
    }
    if (max_over_ranks(pg, times, NTIMES * (size_t)steps) != 0) goto out;
    double med = median(times, steps), mn = times[0], mx = times[0];
    for (int k = 1; k < steps; k++) {
        if (times[k] < mn) mn = times[k];
        if (times[k] > mx) mx = times[k];
    }
    double ph[NTIMES - 1]; /* the phases, the CPU time, the training thread's phases, the rest */
    for (int j = 0; j < NTIMES - 1; j++) ph[j] = median(times + (size_t)(j + 1) * steps, steps);

    /* DDP statistics per timed step, mean over the (active) ranks. */
    double dst[7] = {0}; /* compute, comm, wait, backward_end, bytes, buckets, active */
    double n_it = (double)(s1.sync_iterations - s0.sync_iterations);
    if (ddp && !empty && n_it > 0) {
        dst[0] = (s1.total_compute_ms - s0.total_compute_ms) / n_it;
        dst[1] = (s1.total_comm_ms - s0.total_comm_ms) / n_it;
        dst[2] = (s1.total_wait_ms - s0.total_wait_ms) / n_it;
        dst[3] = s1.last_backward_end_ms;
        dst[4] = (double)(s1.bytes_reduced - s0.bytes_reduced) / n_it;
        dst[5] = (double)(s1.buckets_reduced - s0.buckets_reduced) / n_it;
    }
    dst[6] = empty ? 0.0 : 1.0;
    if (sum_over_ranks(ddp ? pg : NULL, dst, 7) != 0) goto out;
    double copy_ms = ddp && !empty && n_it > 0 ? (s1.total_copy_ms - s0.total_copy_ms) / n_it : 0;
    if (sum_over_ranks(ddp ? pg : NULL, &copy_ms, 1) != 0) goto out;
    if (empty) memset(tl, 0, sizeof tl);
    if (sum_over_ranks(ddp ? pg : NULL, tl, 3 * TL_MAX + 1) != 0) goto out;
    int active = ddp ? (int)lround(dst[6]) : world;
    if (ddp && active > 0)
        for (int j = 0; j < 6; j++) dst[j] /= active;
    double overlap = dst[1] > 0 ? 1.0 - dst[2] / dst[1] : 0.0;

    /* --hook: bytes this rank sends per timed iteration (mean over ranks):
     * [0] the hook's, [1] a ring all_reduce of the same f32 buckets,
     * [2], [3] PowerSGD's [uncompressed | P] and Q elements per iteration */
    double hb[4] = {0};
    if (ddp && c->hook != HOOK_NONE && !empty && n_it > 0) {
        double ring = 2.0 * (world - 1) / world; /* bytes a ring all_reduce sends per byte */
        hb[1] = ring * dst[4]; /* dst[4]: f32 bucket bytes per iteration */
        switch (c->hook) {
        case HOOK_FP16:
        case HOOK_FP16_BUCKET:
        case HOOK_BF16: hb[0] = hb[1] / 2; break; /* the same all_reduce of 2-byte values */
        case HOOK_POWERSGD:
            hb[2] = (double)(pc.pu_elems - pc0.pu_elems) / n_it;
            hb[3] = (double)(pc.q_elems - pc0.q_elems) / n_it;
            hb[0] = ring * 4.0 * (hb[2] + hb[3]);
            break;
        case HOOK_INT8:
            hb[0] = (double)(i8s1.bytes_sent - i8s0.bytes_sent) / n_it;
            break;
        default: hb[0] = hb[1]; break;
        }
    }
    if (c->hook != HOOK_NONE && sum_over_ranks(ddp ? pg : NULL, hb, 4) != 0) goto out;
    if (ddp && active > 0)
        for (int j = 0; j < 4; j++) hb[j] /= active;

    char mode[32], hname[24];
    hook_name(c, hname, sizeof hname);
    if (!c->ddp) snprintf(mode, sizeof mode, "local");
    else if (c->join == 2) snprintf(mode, sizeof mode, "ddp_joinoff");
    else if (c->join == 1 && c->join_empty >= 0) snprintf(mode, sizeof mode, "ddp_join_empty%d", c->join_empty);
    else if (c->join == 1) snprintf(mode, sizeof mode, "ddp_join");
    else if (c->hook != HOOK_NONE) snprintf(mode, sizeof mode, "ddp_%s", hname);
    else snprintf(mode, sizeof mode, "ddp");
    if (g_rank == 0) {
        printf("# model %s: %zu parameters in %zu tensors (%zu -> %d x Linear(%zu)+ReLU -> "
               "Linear(%d)), batch %zu per rank, mode %s, world %d, %d timed steps (+%d warm-up), "
               "OpenBLAS threads %d; loss %.4f -> %.4f\n",
               ms->name, nparams, np, din, ms->layers, ms->hidden, CLASSES, B, mode, world, steps,
               warmup, c->threads, (double)first_loss, (double)loss);
        printf("# step time (max over %s ranks per step): median %.3f ms, min %.3f, max %.3f\n",
               active < world ? "the active" : "all", med, mn, mx);
        if (c->join)
            printf("# join: %s; %d of %d ranks active (with inputs); active-rank throughput"
                   " %.1f samples/s (%d x %zu / median step)\n",
                   c->join == 2 ? "Join with enable = false"
                                : "the loop inside a Join (default options)",
                   active, world, med > 0 ? active * (double)B * 1e3 / med : 0.0, active, B);
        printf("# phases (median over steps of the slowest rank): forward+loss+zero_grad %.3f ms,"
               " backward %.3f ms, backward_end %.3f ms, sgd step %.3f ms\n",
               ph[0], ph[1], ph[2], ph[3]);
        printf("# cpu time per step (the process's threads, training and engine; median over"
               " steps of the max over ranks): %.3f ms; the training thread's in forward+loss+zero_grad"
               " %.3f ms, backward %.3f ms, backward_end %.3f ms, sgd step %.3f ms; other threads"
               " (the engine) %.3f ms\n",
               ph[4], ph[5], ph[6], ph[7], ph[8], ph[9]);
        if (ddp) {
            size_t nb = tdist_ddp_num_buckets(ddp);
            static const char *const sched[] = {"on", "off", "inline", "auto"};
            printf("# ddp statistics per timed step (mean over %s ranks): compute %.3f ms, comm"
                   " %.3f ms, blocked wait %.3f ms, overlap %.3f, %.1f buckets, %.2f MB reduced"
                   " (buckets now %zu, rebuilds %llu); schedule (opts.overlap) %s on rank 0\n",
                   active < world ? "the active" : "all", dst[0], dst[1], dst[2], overlap, dst[5], dst[4] * 1e-6, nb,
                   (unsigned long long)s1.bucket_rebuilds,
                   (unsigned)s1.overlap < 4 ? sched[s1.overlap] : "?");
        }
        if (ddp && active > 0 && n_it > 0)
            print_breakdown(ddp, tl, TL_MAX, (double)active * n_it, copy_ms / active, dst[2]);
        if (ddp && c->hook != HOOK_NONE) {
            printf("# comm hook %s: %.4f MB sent per iteration by each rank, %.4f of a ring"
                   " all_reduce of the f32 buckets (%.4f MB = 2 (W-1)/W x %.4f MB)\n",
                   hname, hb[0] * 1e-6, hb[1] > 0 ? hb[0] / hb[1] : 0.0, hb[1] * 1e-6,
                   dst[4] * 1e-6);
            if (c->hook == HOOK_POWERSGD) {
                double ep[2];
                psgd_expected(c, p, np, rows, ep);
                printf("# powersgd rank %d: per iteration %.0f elements in [uncompressed | P]"
                       " and %.0f in Q all_reduced (the observer); from the shapes: %.0f and %.0f"
                       " (%s)\n",
                       c->psgd_rank, hb[2], hb[3], ep[0], ep[1],
                       fabs(hb[2] - ep[0]) < 0.5 && fabs(hb[3] - ep[1]) < 0.5 ? "equal" : "DIFFERENT");
            }
            if (c->hook == HOOK_INT8)
                printf("# int8: tdist_int8_get_stats per iteration: bytes_sent %.0f,"
                       " f32_ring_bytes %.0f\n",
                       (double)(i8s1.bytes_sent - i8s0.bytes_sent) / (n_it > 0 ? n_it : 1),
                       (double)(i8s1.f32_ring_bytes - i8s0.f32_ring_bytes) / (n_it > 0 ? n_it : 1));
        }
        fflush(stdout);
    }
    if (tr) {
        double v[2] = {tr_busy / steps, tr_exposed / steps};
        if (sum_over_ranks(pg, v, 2) != 0) goto out;
        for (int j = 0; j < 2; j++) v[j] /= world;
        if (g_rank == 0) {
            printf("# trace (mean over steps and ranks): comm busy %.3f ms (union of bucket"
                   " launch..done), of which after backward ended (exposed) %.3f ms -> hidden"
                   " behind backward %.3f ms, true overlap %.3f\n",
                   v[0], v[1], v[0] - v[1], v[0] > 0 ? 1.0 - v[1] / v[0] : 0.0);
            printf("# trace of the last step (rank 0, ms from the start of backward; backward"
                   " took %.3f ms):", (double)(tr_t2 - tr_t1) * 1e-6);
            for (size_t b = 0; b < tr->nb; b++)
                printf(" b%zu %.2f MB launch %.3f done %.3f;", b, tr->count[b] * 4e-6,
                       ((double)tr->launch[b] - (double)tr_t1) * 1e-6,
                       ((double)atomic_load(&tr->done[b]) - (double)tr_t1) * 1e-6);
            printf("\n");
        }
    }
    if (ddp && c->probe && probe_buckets(pg, ddp, p, np) != 0) goto out;
    if (g_rank == 0) {
        char tag[64];
        snprintf(tag, sizeof tag, "ddp%d%s%s", world, c->join || c->hook ? "_" : "",
                 c->join || c->hook ? mode + 4 : "");
        if (!c->ddp) snprintf(tag, sizeof tag, "%s%d", mode, world);
        if (ddp)
            printf("ROW tdist %s %s %d %.4f %.4f %.4f %.4f %.4f %.4f %.4f\n", mode, ms->name, world,
                   med, mn, mx, overlap, dst[2], dst[1], dst[0]);
        else
            printf("ROW tdist %s %s %d %.4f %.4f %.4f - - - -\n", mode, ms->name, world, med, mn,
                   mx);
        if (ddp && c->hook != HOOK_NONE) {
            printf("BYTES tdist %s %s %d %.1f %.1f\n", mode, ms->name, world, hb[0], hb[1]);
            printf("RESULT ddp_step_%s_%s_bytes_per_iter %.0f bytes\n", ms->name, tag, hb[0]);
            printf("RESULT ddp_step_%s_%s_bytes_ratio %.4f x\n", ms->name, tag,
                   hb[1] > 0 ? hb[0] / hb[1] : 0.0);
        }
        printf("RESULT ddp_step_%s_%s_ms %.3f ms\n", ms->name, world == 1 ? mode : tag, med);
        if (c->join)
            printf("RESULT ddp_step_%s_%s_samples_per_s %.1f samples/s\n", ms->name, tag,
                   med > 0 ? active * (double)B * 1e3 / med : 0.0);
        if (ddp) {
            printf("RESULT ddp_step_%s_%s_overlap %.3f fraction\n", ms->name, tag, overlap);
            printf("RESULT ddp_step_%s_%s_wait_ms %.3f ms\n", ms->name, tag, dst[2]);
            printf("RESULT ddp_step_%s_%s_comm_ms %.3f ms\n", ms->name, tag, dst[1]);
        }
        fflush(stdout);
    }
    rc = 0;
out:
    if (m) nn_set_grad_ready_hook(m, NULL, NULL);
    if (join) (void)tdist_join_end(join); /* after an error: frees it */
    tdist_ddp_destroy(ddp);
    for (int q = 0; q < ALT_COUNT; q++) tdist_ddp_destroy(own[q]);
    tdist_compress_destroy(hk_c); /* after the reducer */
    tdist_powersgd_destroy(hk_p);
    tdist_int8_destroy(hk_i);
    free(rows);
    free(tr);
    tdist_optim_destroy(opt);
    nn_seq_destroy(m);
    free(x);
    free(labels);
    free(dlogits);
    free(times);
    free(dp);
    free(op);
    return rc;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: bench_ddp_step --mode local|ddp [--model 3M|25M|all] [-n STEPS] [-w WARMUP]\n"
               "                      [--batch B] [--threads T] [--cap MiB] [--first MiB] [--view]\n"
               "                      [--overlap on|off|inline|auto]\n"
               "                      [--no-probe] [--trace]\n"
               "                      [--hook allreduce|allreduce_hook|allreduce_grads|fp16|fp16_bucket|bf16|powersgdR|int8]"
               " [--psgd-start N]\n"
               "                      [--join | --join-disabled | --join-empty-rank R]\n"
               "                      [--join-alternate ddp,join,off,empty,serial,inline,on [--block K]]\n"
               "run under tdistrun (ddp: 2+ ranks); see the comment at the top of bench/ddp_step.c\n");
}

static int parse_int(const char *s, int lo, int hi, int *out)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (*s == '\0' || *end != '\0' || v < lo || v > hi) return -1;
    *out = (int)v;
    return 0;
}

int main(int argc, char **argv)
{
    cfg_t c = {.overlap = -1, .ddp = -1, .model_mask = 3, .steps = 0, .warmup = -1, .batch = 64, .threads = 1,
               .probe = 1, .join_empty = -1, .block = 5, .psgd_start = 2};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int iv;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--overlap")) {
            if (!strcmp(v, "on")) c.overlap = TDIST_DDP_OVERLAP_ON;
            else if (!strcmp(v, "off")) c.overlap = TDIST_DDP_OVERLAP_OFF;
            else if (!strcmp(v, "inline")) c.overlap = TDIST_DDP_OVERLAP_INLINE;
            else if (!strcmp(v, "auto")) c.overlap = TDIST_DDP_OVERLAP_AUTO;
            else goto bad;
            i++;
        } else if (!strcmp(a, "--view")) {
            c.view = 1;
        } else if (!strcmp(a, "--no-probe")) {
            c.probe = 0;
        } else if (!strcmp(a, "--trace")) {
            c.trace = 1;
        } else if (!strcmp(a, "--join")) {
            c.join = 1;
        } else if (!strcmp(a, "--join-disabled")) {
            c.join = 2;
        } else if (!v) {
            fprintf(stderr, "bench_ddp_step: %s needs a value (or is unknown)\n", a);
            usage(stderr);
            return 2;
        } else if (!strcmp(a, "--mode")) {
            if (!strcmp(v, "local")) c.ddp = 0;
            else if (!strcmp(v, "ddp")) c.ddp = 1;
            else goto bad;
            i++;
        } else if (!strcmp(a, "--model")) {
            if (!strcmp(v, "3M")) c.model_mask = 1;
            else if (!strcmp(v, "25M")) c.model_mask = 2;
            else if (!strcmp(v, "all")) c.model_mask = 3;
            else goto bad;
            i++;
        } else if (!strcmp(a, "--join-empty-rank")) {
            if (parse_int(v, 0, 1 << 20, &c.join_empty)) goto bad;
            c.join = 1;
            i++;
        } else if (!strcmp(a, "--hook")) {
            if (!strcmp(v, "allreduce")) c.hook = HOOK_ALLREDUCE;
            else if (!strcmp(v, "allreduce_hook")) c.hook = HOOK_ALLREDUCE_HOOK;
            else if (!strcmp(v, "allreduce_grads")) c.hook = HOOK_ALLREDUCE_GRADS;
            else if (!strcmp(v, "fp16_bucket")) c.hook = HOOK_FP16_BUCKET;
            else if (!strcmp(v, "fp16")) c.hook = HOOK_FP16;
            else if (!strcmp(v, "bf16")) c.hook = HOOK_BF16;
            else if (!strcmp(v, "int8")) c.hook = HOOK_INT8;
            else if (!strncmp(v, "powersgd", 8) && !parse_int(v + 8, 1, 64, &c.psgd_rank))
                c.hook = HOOK_POWERSGD;
            else goto bad;
            i++;
        } else if (!strcmp(a, "--psgd-start")) {
            if (parse_int(v, 2, 1000000, &c.psgd_start)) goto bad;
            i++;
        } else if (!strcmp(a, "--block")) {
            if (parse_int(v, 1, 100000, &c.block)) goto bad;
            i++;
        } else if (!strcmp(a, "--join-alternate")) {
            char buf[128];
            snprintf(buf, sizeof buf, "%s", v);
            c.alt_n = 0;
            for (char *sv = NULL, *tok = strtok_r(buf, ",", &sv); tok; tok = strtok_r(NULL, ",", &sv)) {
                int mode = -1;
                for (int q = 0; q < ALT_COUNT; q++)
                    if (!strcmp(tok, ALT_NAME[q])) mode = q;
                if (mode < 0 || c.alt_n == ALT_COUNT) goto bad;
                for (int q = 0; q < c.alt_n; q++)
                    if (c.alt[q] == mode) goto bad;
                c.alt[c.alt_n++] = mode;
            }
            if (c.alt_n < 2) goto bad;
            i++;
        } else if (!strcmp(a, "-n")) {
            if (parse_int(v, 1, MAX_STEPS, &c.steps)) goto bad;
            i++;
        } else if (!strcmp(a, "-w")) {
            if (parse_int(v, 0, MAX_STEPS, &c.warmup)) goto bad;
            i++;
        } else if (!strcmp(a, "--batch")) {
            if (parse_int(v, 1, 1 << 16, &iv)) goto bad;
            c.batch = (size_t)iv;
            i++;
        } else if (!strcmp(a, "--threads")) {
            if (parse_int(v, 1, 1024, &c.threads)) goto bad;
            i++;
        } else if (!strcmp(a, "--cap") || !strcmp(a, "--first")) {
            char *end;
            double d = strtod(v, &end);
            if (*end != '\0' || !(d > 0 && d <= 4096)) goto bad;
            if (!strcmp(a, "--cap")) c.cap_mib = d;
            else c.first_mib = d;
            i++;
        } else {
            fprintf(stderr, "bench_ddp_step: unknown option %s\n", a);
            usage(stderr);
            return 2;
        }
        continue;
    bad:
        fprintf(stderr, "bench_ddp_step: bad value '%s' for %s\n", v, a);
        usage(stderr);
        return 2;
    }
    if (c.ddp < 0) {
        fprintf(stderr, "bench_ddp_step: --mode local|ddp is required\n");
        usage(stderr);
        return 2;
    }
    if ((c.join || c.alt_n) && !c.ddp) {
        fprintf(stderr, "bench_ddp_step: --join* needs --mode ddp\n");
        return 2;
    }
    if (c.hook != HOOK_NONE && (!c.ddp || c.trace || c.alt_n)) {
        fprintf(stderr, "bench_ddp_step: --hook needs --mode ddp, without --trace and"
                        " --join-alternate\n");
        return 2;
    }
    if (c.alt_n) {
        c.join = 0; /* --join-empty-rank only names the empty rank */
        if (c.trace) {
            fprintf(stderr, "bench_ddp_step: --join-alternate does not go with --trace\n");
            return 2;
        }
        for (int q = 0; q < c.alt_n; q++)
            if (c.view && ALT_OVERLAP[c.alt[q]] >= 0) {
                fprintf(stderr, "bench_ddp_step: --join-alternate %s does not go with --view\n",
                        ALT_NAME[c.alt[q]]);
                return 2;
            }
    }
    nn_set_num_threads(c.threads);

    tdist_world_t *world = NULL;
    tdist_pg_t *pg = NULL;
    int nworld = 1;
    if (c.ddp || getenv("WORLD_SIZE")) {
        tdist_status_t st = tdist_init("env://", NULL, &world);
        if (st != TDIST_OK) return fail_tdist("tdist_init(env://) (run under tdistrun)", st);
        g_rank = tdist_world_rank(world);
        nworld = tdist_world_size(world);
        st = tdist_pg_create_world(world, NULL, &pg);
        if (st != TDIST_OK) {
            fail_tdist("tdist_pg_create_world", st);
            tdist_world_destroy(world);
            return 1;
        }
    }
    int rc = 0;
    if ((c.join == 1 || c.alt_n) && c.join_empty >= nworld) {
        fprintf(stderr, "bench_ddp_step: --join-empty-rank %d: the world has %d ranks\n",
                c.join_empty, nworld);
        rc = 2;
    }
    for (size_t k = 0; k < sizeof MODELS / sizeof MODELS[0] && rc == 0; k++)
        if (c.model_mask & (1 << k)) rc = run_model(&c, &MODELS[k], pg, nworld);
    tdist_pg_destroy(pg);
    tdist_world_destroy(world);
    return rc;
}
