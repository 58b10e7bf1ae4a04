/*
 * bench/zero_step.c — ZeRO against DDP + Adam: training-step time and
 * optimizer state per rank, on the MLPs of bench_ddp_step
 * (bench/compare/zero.sh runs it beside PyTorch's ZeroRedundancyOptimizer).
 *
 *   tdistrun --nproc-per-node 2 bench_zero_step [options]
 *
 * options:
 *   --model 3M|25M|all  3M: 1024 -> 3 x Linear(1024)+ReLU -> Linear(10);
 *                     25M: 2048 -> 6 x Linear(2048)+ReLU -> Linear(10)
 *                     (default all)
 *   -n N, -w W        timed and warm-up steps per mode (defaults: 3M 30 + 5,
 *                     25M 10 + 3)
 *   --block K         timed steps per block (default 5)
 *   --batch B         samples per rank (default 64)
 *   --part BYTES      the ZeRO objects' overlap_part_bytes (default: the
 *                     option's default; 0: whole slices)
 *
 * Three modes over one model, in ONE run, each with its own reducer (default
 * options) and its own Adam (lr 1e-3, tdist_optim's exact arithmetic):
 *   ddp           DDP + a whole-model Adam on every rank (tdist_optim_step)
 *   zero_overlap  DDP + ZeRO's overlap hook (tdist_zero_register_overlap):
 *                 reduce_scatter, step and all_gather per bucket inside
 *                 backward_end; no separate step. Its reducer has
 *                 gradient_as_bucket_view (the model writes its gradients
 *                 into the buckets: a hook's path otherwise copies every
 *                 gradient into its bucket and back, which DDP's own
 *                 averaging, in place over the gradients, does not)
 *   zero          DDP + ZeRO without overlap (tdist_zero_step: the shard's
 *                 step, then the broadcast from the owners)
 * After the warm-up of every mode, the timed steps go in blocks of K steps,
 * one block per mode in turn (the order rotated every round), so whatever
 * else runs on the machine hits every mode alike. A step is [forward_begin,
 * forward, loss, backward with grad_ready, backward_end, the optimizer
 * step]. Per step the slowest rank counts (one all_reduce MAX after the
 * loop); a mode's time is the median over its steps.
 *
 * State bytes per rank (Adam's exp_avg and exp_avg_sq): the whole model's
 * (DDP + Adam keeps them on every rank) against tdist_zero_state_bytes, the
 * largest over ranks, of the overlap mode (its shard: this rank's slice of
 * every bucket) and of the two partitions without overlap.
 *
 * Output (rank 0): comment lines and
 *   RESULT zero_<model>_ddp_adam_ms, zero_<model>_overlap_ms, zero_<model>_nooverlap_ms
 *   RESULT zero_<model>_step_ratio             zero_overlap / ddp
 *   RESULT zero_<model>_nooverlap_step_ratio   zero / ddp
 *   RESULT zero_adam_state_bytes_ratio_<W>r    overlap shard / whole (first model run;
 *                                              the same for every model, a slice per bucket)
 *   RESULT zero_adam_state_bytes_ratio_by_params_<model>_<W>r, ..._flat_<model>_<W>r
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <tdist/nn.h>
#include "tdist/tdist.h"

#define CLASSES 10
#define NBATCHES 4
#define NMODES 3
#define MAX_STEPS 10000

typedef struct model_spec {
    const char *name;
    size_t din, hidden;
    int layers, steps, warmup;
} model_spec_t;

static const model_spec_t MODELS[] = {
    {"3M", 1024, 1024, 3, 30, 5},
    {"25M", 2048, 2048, 6, 10, 3},
};

static const char *const MODE_NAME[NMODES] = {"ddp", "zero_overlap", "zero"};

typedef struct ready_ctx {
    tdist_ddp_t *ddp;
    tdist_status_t st;
} ready_ctx_t;

/* Everything one run over a model holds. */
typedef struct run {
    nn_seq_t *m;
    nn_param_t *p;
    float **own_grad;         /* the model's own gradient memory, per parameter */
    size_t np, nparams, B, din;
    float *x, *dlogits;
    int *labels;
    tdist_ddp_t *ddp[NMODES];
    tdist_optim_t *adam;      /* mode ddp */
    tdist_zero_t *zero[NMODES]; /* [1] overlap, [2] no overlap */
    ready_ctx_t ready;
} run_t;

static int g_rank;
static long long g_part = -1; /* --part: overlap_part_bytes, -1: the default */
static double g_phase[2]; /* the last step's backward_end and optimizer step, ms */

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static int cmp_double(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static int fail(const char *what, tdist_status_t st)
{
    fprintf(stderr, "bench_zero_step: rank %d: %s failed: %s: %s\n", g_rank, what,
            tdist_status_str(st), tdist_last_error());
    return 1;
}

static void on_grad_ready(void *ctx, size_t i)
{
    ready_ctx_t *r = ctx;
    tdist_status_t st = tdist_ddp_grad_ready(r->ddp, i);
    if (st != TDIST_OK && r->st == TDIST_OK) r->st = st;
}

static nn_seq_t *build_model(const model_spec_t *ms)
{
    nn_seq_t *m = nn_seq_create(1, 1, ms->din, 1234);
    if (!m) return NULL;
    for (int l = 0; l < ms->layers; l++)
        if (nn_linear(m, ms->hidden) != 0 || nn_relu(m) != 0) goto bad;
    if (nn_linear(m, CLASSES) != 0) goto bad;
    return m;
bad:
    nn_seq_destroy(m);
    return NULL;
}

static tdist_status_t make_zero(run_t *r, tdist_pg_t *pg, tdist_zero_partition_t part,
                                tdist_zero_t **out)
{
    tdist_optim_param_t *op = calloc(r->np, sizeof *op);
    if (!op) return TDIST_ERR_NO_MEMORY;
    for (size_t i = 0; i < r->np; i++)
        op[i] = (tdist_optim_param_t){r->p[i].data, r->p[i].grad, r->p[i].count, r->p[i].name};
    tdist_zero_opts_t o;
    tdist_zero_opts_init(&o);
    o.kind = TDIST_OPTIM_ADAM;
    o.partition = part;
    if (g_part >= 0) o.overlap_part_bytes = (size_t)g_part;
    tdist_status_t st = tdist_zero_create(pg, op, r->np, &o, out);
    free(op);
    return st;
}

/* The three reducers, the Adam, the two ZeRO objects. */
static int setup(run_t *r, tdist_pg_t *pg)
{
    tdist_ddp_param_t *dp = calloc(r->np, sizeof *dp);
    tdist_optim_param_t *op = calloc(r->np, sizeof *op);
    tdist_status_t st = (!dp || !op) ? TDIST_ERR_NO_MEMORY : TDIST_OK;
    for (size_t i = 0; st == TDIST_OK && i < r->np; i++) {
        dp[i] = (tdist_ddp_param_t){r->p[i].data, r->p[i].grad, r->p[i].count, TDIST_F32, r->p[i].name};
        op[i] = (tdist_optim_param_t){r->p[i].data, r->p[i].grad, r->p[i].count, r->p[i].name};
    }
    tdist_ddp_opts_t view;
    tdist_ddp_opts_init(&view);
    view.gradient_as_bucket_view = true; /* the hook path without bucket copies */
    for (int k = 0; k < NMODES && st == TDIST_OK; k++)
        st = tdist_ddp_create(pg, dp, r->np, NULL, 0, k == 1 ? &view : NULL, &r->ddp[k]);
    if (st == TDIST_OK) st = tdist_optim_create_adam(op, r->np, NULL, &r->adam);
    if (st == TDIST_OK) st = make_zero(r, pg, TDIST_ZERO_BY_PARAMS, &r->zero[1]);
    if (st == TDIST_OK) st = make_zero(r, pg, TDIST_ZERO_BY_PARAMS, &r->zero[2]);
    if (st == TDIST_OK) st = tdist_zero_register_overlap(r->zero[1], r->ddp[1]);
    free(dp);
    free(op);
    return st == TDIST_OK ? 0 : fail("setting up the reducers and optimizers", st);
}

/* One step of mode k on batch it: its time in ms, or -1. */
static double one_step(run_t *r, int k, int it)
{
    const float *xb = r->x + (size_t)(it % NBATCHES) * r->B * r->din;
    const int *lb = r->labels + (size_t)(it % NBATCHES) * r->B;
    float loss;
    tdist_status_t st;
    r->ready.ddp = r->ddp[k];
    /* the overlap mode's reducer keeps the gradients in its buckets (they
     * move once, at its rebuild); the others use the model's own memory */
    for (size_t i = 0; i < r->np; i++)
        r->p[i].grad = k == 1 ? tdist_ddp_grad_ptr(r->ddp[1], i) : r->own_grad[i];
    double t0 = now_ms();
    if ((st = tdist_ddp_forward_begin(r->ddp[k])) != TDIST_OK) return fail("forward_begin", st), -1;
    float *logits = nn_forward(r->m, xb, r->B);
    if (!logits || nn_cross_entropy(logits, lb, r->B, CLASSES, &loss, r->dlogits) != 0) return -1;
    nn_zero_grad(r->m);
    if (nn_backward(r->m, r->dlogits) != 0) return -1;
    if (r->ready.st != TDIST_OK) return fail("grad_ready", r->ready.st), -1;
    double t1 = now_ms();
    if ((st = tdist_ddp_backward_end(r->ddp[k])) != TDIST_OK) return fail("backward_end", st), -1;
    double t2 = now_ms();
    st = k == 0 ? tdist_optim_step(r->adam) : tdist_zero_step(r->zero[k]);
    if (st != TDIST_OK) return fail("the optimizer step", st), -1;
    double t3 = now_ms(), t = t3 - t0;
    g_phase[0] = t2 - t1;
    g_phase[1] = t3 - t2;
    return isfinite(loss) ? t : -1;
}

/* Warm-up, then the blocks; times[k][s] per mode, then the same for the
 * backward_end and step phases (3 arrays of NMODES x steps). 0 on success. */
static int timed_loop(run_t *r, tdist_pg_t *pg, int steps, int warmup, int K, double *times)
{
    size_t n = (size_t)NMODES * (size_t)steps;
    int it = 0;
    for (int k = 0; k < NMODES; k++)
        for (int w = 0; w < warmup; w++)
            if (one_step(r, k, it++) < 0) return 1;
    int done[NMODES] = {0};
    for (int round = 0; done[0] < steps || done[1] < steps || done[2] < steps; round++)
        for (int q = 0; q < NMODES; q++) {
            int k = (q + round) % NMODES;
            for (int b = 0; b < K && done[k] < steps; b++) {
                double t = one_step(r, k, it++);
                if (t < 0) return 1;
                size_t at = (size_t)k * (size_t)steps + (size_t)done[k]++;
                times[at] = t;
                times[n + at] = g_phase[0];
                times[2 * n + at] = g_phase[1];
            }
        }
    tdist_status_t st = tdist_all_reduce(pg, times, times, 3 * n, TDIST_F64, TDIST_MAX, NULL, NULL);
    return st == TDIST_OK ? 0 : fail("all_reduce MAX of the step times", st);
}

/* Largest tdist_zero_state_bytes over ranks, over the whole model's. */
static double state_ratio(run_t *r, tdist_pg_t *pg, tdist_zero_t *z)
{
    double b = (double)tdist_zero_state_bytes(z);
    if (tdist_all_reduce(pg, &b, &b, 1, TDIST_F64, TDIST_MAX, NULL, NULL) != TDIST_OK) return -1;
    return b / (2.0 * 4.0 * (double)r->nparams);
}

static void report(run_t *r, tdist_pg_t *pg, const model_spec_t *ms, int world, int steps,
                   double *times, int first)
{
    double med[NMODES], ph[2][NMODES];
    size_t n = (size_t)NMODES * (size_t)steps;
    for (int k = 0; k < NMODES; k++) {
        med[k] = median(times + (size_t)k * (size_t)steps, steps);
        ph[0][k] = median(times + n + (size_t)k * (size_t)steps, steps);
        ph[1][k] = median(times + 2 * n + (size_t)k * (size_t)steps, steps);
    }
    tdist_zero_t *flat = NULL;
    double rs = state_ratio(r, pg, r->zero[1]), rp = state_ratio(r, pg, r->zero[2]), rf = -1;
    if (make_zero(r, pg, TDIST_ZERO_FLAT, &flat) == TDIST_OK) rf = state_ratio(r, pg, flat);
    tdist_zero_destroy(flat);
    if (g_rank != 0) return;
    printf("# model %s: %zu parameters, batch %zu per rank, world %d, %d timed steps per mode in "
           "blocks, Adam lr 1e-3\n", ms->name, r->nparams, r->B, world, steps);
    for (int k = 0; k < NMODES; k++)
        printf("# %-13s median %.3f ms (slowest rank per step); backward_end %.3f ms, step %.3f ms\n",
               MODE_NAME[k], med[k], ph[0][k], ph[1][k]);
    printf("# Adam state per rank / DDP + Adam's: overlap %.4f, by_params %.4f, flat %.4f "
           "(1/W = %.4f)\n", rs, rp, rf, 1.0 / world);
    printf("RESULT zero_%s_ddp_adam_ms %.3f ms\n", ms->name, med[0]);
    printf("RESULT zero_%s_overlap_ms %.3f ms\n", ms->name, med[1]);
    printf("RESULT zero_%s_nooverlap_ms %.3f ms\n", ms->name, med[2]);
    printf("RESULT zero_%s_step_ratio %.4f x\n", ms->name, med[1] / med[0]);
    printf("RESULT zero_%s_nooverlap_step_ratio %.4f x\n", ms->name, med[2] / med[0]);
    if (first) printf("RESULT zero_adam_state_bytes_ratio_%dr %.4f x\n", world, rs);
    printf("RESULT zero_adam_state_bytes_ratio_by_params_%s_%dr %.4f x\n", ms->name, world, rp);
    printf("RESULT zero_adam_state_bytes_ratio_flat_%s_%dr %.4f x\n", ms->name, world, rf);
    fflush(stdout);
}

static void teardown(run_t *r)
{
    for (int k = 0; k < NMODES; k++) tdist_ddp_destroy(r->ddp[k]);
    for (int k = 0; k < NMODES; k++) tdist_zero_destroy(r->zero[k]);
    tdist_optim_destroy(r->adam);
    nn_seq_destroy(r->m);
    free(r->x);
    free(r->labels);
    free(r->dlogits);
    free(r->own_grad);
}

static int run_model(const model_spec_t *ms, tdist_pg_t *pg, int world, int steps, int warmup,
                     int K, size_t B, int first)
{
    run_t r;
    memset(&r, 0, sizeof r);
    r.B = B;
    r.din = ms->din;
    steps = steps > 0 ? steps : ms->steps;
    warmup = warmup >= 0 ? warmup : ms->warmup;
    int rc = 1;
    double *times = calloc(3 * (size_t)NMODES * (size_t)steps, sizeof *times);
    r.m = build_model(ms);
    r.x = malloc(NBATCHES * B * ms->din * sizeof *r.x);
    r.labels = malloc(NBATCHES * B * sizeof *r.labels);
    r.dlogits = malloc(B * CLASSES * sizeof *r.dlogits);
    if (!times || !r.m || !r.x || !r.labels || !r.dlogits || !(r.p = nn_params(r.m, &r.np))) {
        fprintf(stderr, "bench_zero_step: out of memory or bad model\n");
        goto out;
    }
    for (size_t i = 0; i < r.np; i++) r.nparams += r.p[i].count;
    if (!(r.own_grad = calloc(r.np, sizeof *r.own_grad))) goto out;
    for (size_t i = 0; i < r.np; i++) r.own_grad[i] = r.p[i].grad;
    uint64_t seed = 0x5eed0000ull + (uint64_t)g_rank * 7919u;
    for (size_t i = 0; i < NBATCHES * B * ms->din; i++)
        r.x[i] = (float)((double)(rng_next(&seed) >> 11) * 0x1.0p-52 - 1.0);
    for (size_t i = 0; i < NBATCHES * B; i++) r.labels[i] = (int)(rng_next(&seed) % CLASSES);
    nn_set_grad_ready_hook(r.m, on_grad_ready, &r.ready);
    if (setup(&r, pg) != 0 || timed_loop(&r, pg, steps, warmup, K, times) != 0) goto out;
    report(&r, pg, ms, world, steps, times, first);
    rc = 0;
out:
    teardown(&r);
    free(times);
    return rc;
}

int main(int argc, char **argv)
{
    int mask = 3, steps = 0, warmup = -1, K = 5;
    size_t B = 64;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) goto bad;
        if (!strcmp(a, "--model")) mask = !strcmp(v, "3M") ? 1 : !strcmp(v, "25M") ? 2 : !strcmp(v, "all") ? 3 : 0;
        else if (!strcmp(a, "-n")) steps = atoi(v);
        else if (!strcmp(a, "-w")) warmup = atoi(v);
        else if (!strcmp(a, "--block")) K = atoi(v);
        else if (!strcmp(a, "--batch")) B = (size_t)atoi(v);
        else if (!strcmp(a, "--part")) g_part = atoll(v);
        else goto bad;
        i++;
    }
    if (!mask || steps < 0 || steps > MAX_STEPS || warmup > MAX_STEPS || K < 1 || B < 1) goto bad;
    nn_set_num_threads(1);
    tdist_world_t *world = NULL;
    tdist_pg_t *pg = NULL;
    tdist_status_t st = tdist_init("env://", NULL, &world);
    if (st != TDIST_OK) return fail("tdist_init(env://) (run under tdistrun)", st);
    g_rank = tdist_world_rank(world);
    if ((st = tdist_pg_create_world(world, NULL, &pg)) != TDIST_OK) {
        fail("tdist_pg_create_world", st);
        tdist_world_destroy(world);
        return 1;
    }
    int rc = 0, first = 1;
    for (size_t k = 0; k < sizeof MODELS / sizeof MODELS[0] && rc == 0; k++)
        if (mask & (1 << k)) {
            rc = run_model(&MODELS[k], pg, tdist_world_size(world), steps, warmup, K, B, first);
            first = 0;
        }
    tdist_pg_destroy(pg);
    tdist_world_destroy(world);
    return rc;
bad:
    fprintf(stderr, "usage: tdistrun --nproc-per-node W bench_zero_step [--model 3M|25M|all] "
                    "[-n STEPS (0..%d)] [-w WARMUP] [--block K] [--batch B] [--part BYTES]\n", MAX_STEPS);
    return 2;
}
