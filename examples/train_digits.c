/*
 * examples/train_digits.c — the README's main job: data-parallel training
 * of a small CNN on the handwritten digits of Debian's python3-sklearn
 * (sklearn/datasets/data/digits.csv.gz, 1,797 8x8 images, 10 classes),
 * with tdist's DDP reducer, on the ranks tdistrun starts.
 *
 *   tdistrun --nproc-per-node 4 train_digits digits.csv [epochs] [--hook HOOK]
 *                                  [--local-sgd K | --diloco H]
 *
 * (scripts/demo.sh finds the data set in the package, unpacks it and runs
 * exactly this.) A fixed seeded split keeps 1,437 images for training and
 * 360 for the test. Each rank gets a deliberately uneven shard of the
 * training images (rank r's share grows with r) and goes through all of
 * it every epoch, so ranks run out of batches at different times: each
 * epoch is one Join (tdist/join.h). A rank that has run out shadows the
 * others' DDP collectives with zero gradients, and their per-step
 * all_reduce of the running loss and accuracy with zeros, until every rank
 * is done; then every rank takes the parameters of the last rank to
 * finish.
 *
 * The model: Conv(1->16, 3x3, pad 1) BN ReLU MaxPool2 Conv(16->32, 3x3,
 * pad 1) BN ReLU MaxPool2 Flatten Linear(128->10); softmax cross-entropy;
 * SGD with momentum. nn's backward reports each parameter's gradient as
 * soon as it is final and the grad-ready hook hands it to DDP, which
 * all-reduces buckets while the earlier layers' backward still runs. The
 * BatchNorm running statistics are DDP buffers (broadcast from rank 0).
 *
 * --hook picks DDP's comm hook (tdist/algorithms.h; the same on every
 * rank): allreduce (DDP's own averaging, the default), fp16 or bf16 (the
 * buckets cross as 16-bit values), powersgd:R (PowerSGD of rank R, plain
 * averaging for the first two epochs' iterations) or int8 (int8 codes
 * with error feedback). Every hook works under Join: a rank that has run
 * out runs it on zeros. A bad command line exits 2 with the usage.
 *
 * Instead of averaging gradients every step (tdist/algorithms.h):
 * --local-sgd K is post-local SGD: DDP averages the gradients for the
 * first two epochs' iterations (the post-local-SGD hook), then each rank
 * steps alone and a periodic model averager averages the parameters every
 * K steps (the post-local-SGD optimizer, a second joinable of each
 * epoch's Join). --diloco H is DiLoCo without DDP: H inner steps of the
 * same SGD, then an outer Nesterov step (lr 0.7, momentum 0.9) on the
 * averaged pseudo-gradient (H:bf16 or H:int8: sent as bf16, or as int8
 * blocks with error feedback); DiLoCo is the epoch's joinable, and a last
 * synchronisation ends every epoch. In both, the loss and accuracy totals
 * are summed once per epoch instead of every step.
 *
 * Each rank's first line names the hook. Rank 0 prints one line per
 * epoch (loss, train accuracy, samples/s and how much of the
 * communication DDP hid behind backward), then the hook's bytes per
 * iteration, the test accuracy and whether every rank ends with identical
 * parameters:
 *   final test_accuracy=0.97 params_identical=yes
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <tdist/nn.h>
#include <tdist/tdist.h>

#define EXAMPLE_NAME "train_digits"
#include "example_util.h"

#define IMG 64
#define CLASSES 10
#define CONV1 16 /* output channels of the two convolutions */
#define CONV2 32
#define MAX_PSGD_RANK 32
#define N_TEST 360
#define LOCAL_BATCH 16
#define MAX_SAMPLES 4096

typedef struct data {
    float x[MAX_SAMPLES][IMG];
    int y[MAX_SAMPLES];
    size_t n;
} data_t;

static void shuffle(size_t *idx, size_t n, uint64_t *s)
{
    for (size_t i = n; i > 1; i--) {
        size_t j = (size_t)(rng_next(s) % i);
        size_t t = idx[i - 1];
        idx[i - 1] = idx[j];
        idx[j] = t;
    }
}

/* digits.csv: 64 pixel values (0..16) then the label, comma-separated. */
static void load(const char *path, data_t *d)
{
    FILE *f = fopen(path, "r");
    if (!f) DIE("cannot open %s (scripts/demo.sh unpacks it from python3-sklearn)", path);
    char line[1024];
    d->n = 0;
    while (fgets(line, sizeof line, f) && d->n < MAX_SAMPLES) {
        char *p = line, *end;
        float v[IMG + 1];
        int k = 0;
        for (; k < IMG + 1; k++) {
            v[k] = strtof(p, &end);
            if (end == p) break;
            p = end;
            while (*p == ',' || *p == ' ') p++;
        }
        if (k != IMG + 1) continue; /* a header or blank line */
        for (int i = 0; i < IMG; i++) d->x[d->n][i] = v[i] / 16.0f;
        d->y[d->n] = (int)v[IMG];
        if (d->y[d->n] < 0 || d->y[d->n] >= CLASSES) DIE("%s: bad label on row %zu", path, d->n);
        d->n++;
    }
    fclose(f);
    if (d->n < N_TEST + 100) DIE("%s: only %zu images", path, d->n);
}

typedef struct hook_ctx {
    tdist_ddp_t *ddp;
    tdist_status_t st;
} hook_ctx_t;

/* nn's grad-ready hook: hand the gradient to DDP the moment it is final. */
static void on_grad_ready(void *arg, size_t i)
{
    hook_ctx_t *h = arg;
    tdist_status_t st = tdist_ddp_grad_ready(h->ddp, i);
    if (st != TDIST_OK && h->st == TDIST_OK) h->st = st;
}

/* ------------------------------------------------------- the command line */

typedef enum hook_kind {
    HOOK_ALLREDUCE,
    HOOK_FP16,
    HOOK_BF16,
    HOOK_POWERSGD,
    HOOK_INT8
} hook_kind_t;

/* What is averaged, and when. */
typedef enum mode {
    MODE_DDP,       /* gradients, every step (with --hook's hook) */
    MODE_LOCAL_SGD, /* post-local SGD: parameters every K steps */
    MODE_DILOCO     /* DiLoCo: pseudo-gradients every H steps */
} train_mode_t;

typedef struct args {
    const char *csv;
    int epochs;
    train_mode_t mode;
    int period;    /* K or H */
    tdist_dtype_t wire; /* DiLoCo: how the pseudo-gradient crosses (f32, bf16, i8) */
    hook_kind_t hook;
    int psgd_rank; /* powersgd:R */
    char hook_name[32];
} args_t;

static void usage(FILE *f, const char *prog)
{
    fprintf(f,
            "usage: tdistrun --nproc-per-node N %s digits.csv [epochs] [--hook HOOK]\n"
            "           [--local-sgd K | --diloco H]\n"
            "  epochs  1..1000 (default 20)\n"
            "  HOOK    DDP's comm hook: allreduce (default), fp16, bf16, powersgd:R\n"
            "          (PowerSGD of rank R = 1..%d), int8 (with error feedback)\n"
            "  K       post-local SGD: average the parameters every K = 1..10000 steps\n"
            "  H       DiLoCo: an outer step every H = 1..10000 inner steps; H:bf16 or\n"
            "          H:int8 sends the pseudo-gradient as bf16 or int8 blocks\n",
            prog, MAX_PSGD_RANK);
}

/* One of the names above, exactly: 0, or -1 for anything else. */
static int parse_hook(const char *s, args_t *a)
{
    static const struct {
        const char *name;
        hook_kind_t kind;
    } plain[] = {{"allreduce", HOOK_ALLREDUCE}, {"fp16", HOOK_FP16}, {"bf16", HOOK_BF16},
                 {"int8", HOOK_INT8}};
    for (size_t i = 0; i < sizeof plain / sizeof plain[0]; i++)
        if (strcmp(s, plain[i].name) == 0) {
            a->hook = plain[i].kind;
            snprintf(a->hook_name, sizeof a->hook_name, "%s", s);
            return 0;
        }
    if (strncmp(s, "powersgd:", 9) != 0) return -1;
    const char *r = s + 9;
    long v = 0;
    for (; *r >= '0' && *r <= '9' && v <= MAX_PSGD_RANK; r++) v = v * 10 + (*r - '0');
    if (r == s + 9 || *r != '\0' || v < 1 || v > MAX_PSGD_RANK) return -1;
    a->hook = HOOK_POWERSGD;
    a->psgd_rank = (int)v;
    snprintf(a->hook_name, sizeof a->hook_name, "powersgd:%d", a->psgd_rank);
    return 0;
}

/* digits.csv [epochs] with --hook HOOK (or --hook=HOOK) anywhere; the
 * epochs are read as they always were (atoi; outside 1..1000, a negative
 * number included: 20). Anything else starting with '-' is an unknown
 * option. A bad command line exits 2 with the usage, before any
 * rendezvous. */
static void parse_args(int argc, char **argv, args_t *a)
{
    const char *prog = argv[0] ? argv[0] : "train_digits";
    const char *pos[2] = {NULL, NULL};
    int npos = 0;
    bool options = true;
    *a = (args_t){.hook = HOOK_ALLREDUCE, .hook_name = "allreduce"};
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i], *hook = NULL, *per = NULL;
        if (options && strcmp(s, "--") == 0) {
            options = false;
        } else if (options && (strcmp(s, "-h") == 0 || strcmp(s, "--help") == 0)) {
            usage(stdout, prog);
            exit(0);
        } else if (options && strcmp(s, "--hook") == 0) {
            if (i + 1 >= argc) {
                fprintf(stderr, "train_digits: --hook needs a value\n");
                usage(stderr, prog);
                exit(2);
            }
            hook = argv[++i];
        } else if (options && strncmp(s, "--hook=", 7) == 0) {
            hook = s + 7;
        } else if (options && (strcmp(s, "--local-sgd") == 0 || strcmp(s, "--diloco") == 0)) {
            if (i + 1 >= argc || a->mode != MODE_DDP) {
                fprintf(stderr, "train_digits: %s needs a value, once (not with the other)\n", s);
                usage(stderr, prog);
                exit(2);
            }
            a->mode = s[2] == 'l' ? MODE_LOCAL_SGD : MODE_DILOCO;
            per = argv[++i];
        } else if (options && s[0] == '-' && s[1] != '\0' && !(s[1] >= '0' && s[1] <= '9')) {
            fprintf(stderr, "train_digits: unknown option '%s'\n", s);
            usage(stderr, prog);
            exit(2);
        } else if (npos < 2) {
            pos[npos++] = s;
        } else {
            fprintf(stderr, "train_digits: unexpected argument '%s'\n", s);
            usage(stderr, prog);
            exit(2);
        }
        if (hook && parse_hook(hook, a) != 0) {
            fprintf(stderr, "train_digits: bad --hook '%s'\n", hook);
            usage(stderr, prog);
            exit(2);
        }
        if (per) {
            char *end;
            long v = strtol(per, &end, 10);
            a->wire = TDIST_F32;
            if (a->mode == MODE_DILOCO && strcmp(end, ":bf16") == 0) a->wire = TDIST_BF16;
            if (a->mode == MODE_DILOCO && strcmp(end, ":int8") == 0) a->wire = TDIST_I8;
            if (a->wire != TDIST_F32) end += strlen(end);
            if (*per == '\0' || *end != '\0' || v < 1 || v > 10000) {
                fprintf(stderr, "train_digits: bad period '%s'\n", per);
                usage(stderr, prog);
                exit(2);
            }
            a->period = (int)v;
        }
    }
    if (a->mode != MODE_DDP && a->hook != HOOK_ALLREDUCE) {
        fprintf(stderr, "train_digits: --hook is for gradient averaging, not with --local-sgd or "
                "--diloco\n");
        usage(stderr, prog);
        exit(2);
    }
    if (npos < 1) {
        usage(stderr, prog);
        exit(2);
    }
    a->csv = pos[0];
    a->epochs = npos > 1 ? atoi(pos[1]) : 20;
    if (a->epochs < 1 || a->epochs > 1000) a->epochs = 20;
}

/* ------------------------------------------------------------ the comm hook */

/* The hook's state, and what this rank put into the collectives. */
typedef struct comm {
    hook_kind_t kind;
    tdist_compress_t *c;
    tdist_powersgd_t *psgd;
    tdist_int8_t *q;
    size_t *rows;       /* PowerSGD: shape[0] of each parameter */
    int64_t psgd_start; /* PowerSGD: start_powerSGD_iter */
    uint64_t bytes;     /* fp16/bf16/PowerSGD: bytes of the (compressed) gradient sent */
    uint64_t iters;     /* ... in this many iterations (shadow ones included) */
} comm_t;

static void on_compress(void *arg, const tdist_ddp_bucket_t *b, const uint16_t *wire, bool reduced)
{
    (void)wire;
    comm_t *cm = arg;
    if (reduced) return;
    cm->bytes += 2 * (uint64_t)b->count;
    cm->iters += b->is_last;
}

/* PowerSGD's compressed iterations: [uncompressed | P] and Q, in f32. */
static void on_powersgd(void *arg, const tdist_ddp_bucket_t *b, tdist_powersgd_stage_t stage,
                        const float *data, size_t count)
{
    (void)data;
    comm_t *cm = arg;
    if (stage != TDIST_POWERSGD_P_LOCAL && stage != TDIST_POWERSGD_Q_LOCAL) return;
    cm->bytes += 4 * (uint64_t)count;
    cm->iters += stage == TDIST_POWERSGD_P_LOCAL && b->is_last;
}

/* Create and register the hook --hook names (allreduce: none, DDP's own).
 * params: the model's, in tdist_ddp_create's order; iters_per_epoch: the
 * iterations every rank runs per epoch (the longest shard's steps). */
static void comm_setup(comm_t *cm, const args_t *a, tdist_ddp_t *ddp, const nn_param_t *params,
                       size_t np, size_t iters_per_epoch)
{
    *cm = (comm_t){.kind = a->hook};
    if (a->hook == HOOK_FP16 || a->hook == HOOK_BF16) {
        tdist_compress_opts_t o;
        tdist_compress_opts_init(&o);
        o.wire = a->hook == HOOK_FP16 ? TDIST_F16 : TDIST_BF16;
        o.observe = on_compress;
        o.observe_arg = cm;
        CHECK(tdist_compress_hook_create(&o, &cm->c));
        CHECK(tdist_compress_register(ddp, cm->c));
    } else if (a->hook == HOOK_POWERSGD) {
        /* shape[0]: the convolutions' weights are [out, in*k*k], the
         * linear one's [out, in]; biases and BatchNorm's are 1-D (0) */
        cm->rows = calloc(np, sizeof *cm->rows);
        if (!cm->rows) DIE("out of memory");
        static const struct {
            const char *name;
            size_t rows;
        } mats[] = {{"0.weight", CONV1}, {"4.weight", CONV2}, {"9.weight", CLASSES}};
        size_t found = 0;
        for (size_t i = 0; i < np; i++)
            for (size_t k = 0; k < sizeof mats / sizeof mats[0]; k++)
                if (strcmp(params[i].name, mats[k].name) == 0 &&
                    params[i].count % mats[k].rows == 0) {
                    cm->rows[i] = mats[k].rows;
                    found++;
                }
        if (found != sizeof mats / sizeof mats[0]) DIE("PowerSGD: the model's weights changed");
        tdist_powersgd_opts_t o;
        tdist_powersgd_opts_init(&o);
        o.matrix_approximation_rank = a->psgd_rank;
        /* plain averaging in the first two epochs' iterations (the model
         * moves most then: iterations 0 .. start - 1), compressed after
         * that; error feedback and warm start on (the defaults) */
        cm->psgd_start = 2 * (int64_t)iters_per_epoch; /* >= 2 */
        o.start_powerSGD_iter = cm->psgd_start;
        o.param_rows = cm->rows;
        o.num_params = np;
        o.observe = on_powersgd;
        o.observe_arg = cm;
        CHECK(tdist_powersgd_create(&o, &cm->psgd));
        CHECK(tdist_powersgd_register(ddp, cm->psgd));
    } else if (a->hook == HOOK_INT8) {
        tdist_int8_opts_t o;
        tdist_int8_opts_init(&o);
        o.error_feedback = true;
        o.sum_error_feedback = true;
        CHECK(tdist_int8_hook_create(&o, &cm->q));
        CHECK(tdist_int8_register(ddp, cm->q));
    }
}

/* What the hook does, for rank 0's first line. */
static void comm_describe(const comm_t *cm, const args_t *a, char *buf, size_t cap)
{
    switch (cm->kind) {
    case HOOK_ALLREDUCE: snprintf(buf, cap, "DDP's f32 averaging"); break;
    case HOOK_FP16: snprintf(buf, cap, "fp16_compress_hook"); break;
    case HOOK_BF16: snprintf(buf, cap, "bf16_compress_hook"); break;
    case HOOK_POWERSGD:
        snprintf(buf, cap, "powerSGD_hook, rank %d, plain averaging for the first %lld "
                 "iterations, error feedback, warm start", a->psgd_rank,
                 (long long)cm->psgd_start);
        break;
    case HOOK_INT8: snprintf(buf, cap, "int8 codes, blocks of %d, error feedback",
                             TDIST_INT8_DEFAULT_BLOCK); break;
    }
}

/* Bytes of gradient this rank sent into the collectives per iteration:
 * the f32 buckets (allreduce), their 16-bit copies (fp16, bf16),
 * [uncompressed | P] and Q once PowerSGD compresses, int8's codes and
 * scales of the whole bucket (its all_to_all's input). */
static double comm_bytes_per_iter(const comm_t *cm, const tdist_ddp_stats_t *ds, int size)
{
    if (cm->kind == HOOK_INT8) {
        tdist_int8_stats_t s;
        CHECK(tdist_int8_get_stats(cm->q, &s));
        if (size < 2 || s.buckets == 0) return 0;
        double iters = (double)s.buckets / (double)ds->num_buckets;
        return (double)s.bytes_sent * size / (2.0 * (size - 1)) / iters;
    }
    if (cm->kind == HOOK_ALLREDUCE)
        return ds->sync_iterations ? (double)ds->bytes_reduced / (double)ds->sync_iterations : 0;
    return cm->iters ? (double)cm->bytes / (double)cm->iters : 0;
}

static void comm_destroy(comm_t *cm)
{
    tdist_compress_destroy(cm->c);
    tdist_powersgd_destroy(cm->psgd);
    tdist_int8_destroy(cm->q);
    free(cm->rows);
}

/* ------------------------------------------ post-local SGD and DiLoCo */

/* What --local-sgd and --diloco use instead of a gradient hook. */
typedef struct avg {
    tdist_post_local_t *hook;      /* local SGD: DDP's post-local-SGD hook */
    tdist_averager_t *averager;    /* local SGD: the periodic averager */
    tdist_post_local_optim_t *plo; /* local SGD: the optimizer + averager */
    tdist_diloco_t *diloco;
    int64_t start;                 /* local SGD: iterations of gradient averaging first */
} avg_t;

/* Local SGD: DDP averages gradients in the first two epochs' iterations,
 * then no more (each rank steps alone); the averager averages the
 * parameters every K steps from then on. */
static void local_sgd_setup(avg_t *av, const args_t *a, tdist_pg_t *pg, tdist_ddp_t *ddp,
                            size_t iters_per_epoch)
{
    av->start = 2 * (int64_t)iters_per_epoch;
    tdist_post_local_opts_t po;
    tdist_post_local_opts_init(&po);
    po.start_localSGD_iter = av->start;
    po.post_local_gradient_allreduce = false;
    CHECK(tdist_post_local_create(&po, &av->hook));
    CHECK(tdist_post_local_register(ddp, av->hook));
    tdist_averager_opts_t ao;
    tdist_averager_opts_init(&ao);
    ao.period = a->period;
    ao.warmup_steps = av->start;
    CHECK(tdist_periodic_averager_create(pg, &ao, &av->averager));
}

/* Bytes of gradient and parameters this rank put into the collectives
 * per iteration: the f32 gradients while DDP averaged them, the f32
 * parameters at every averaging step. */
static double local_sgd_bytes_per_iter(const avg_t *av, double f32)
{
    int64_t grad_iters = 0, steps = tdist_averager_step(av->averager), averages = 0;
    CHECK(tdist_post_local_iter(av->hook, &grad_iters));
    for (int64_t s = 0; s < steps; s++) averages += tdist_averager_group_size_at(av->averager, s) > 0;
    return steps ? f32 * (double)(grad_iters + averages) / (double)steps : 0;
}

static void avg_destroy(avg_t *av)
{
    tdist_post_local_optim_destroy(av->plo);
    tdist_averager_destroy(av->averager);
    tdist_post_local_destroy(av->hook);
    tdist_diloco_destroy(av->diloco);
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    args_t args;
    parse_args(argc, argv, &args);
    int epochs = args.epochs;

    tdist_world_t *world;
    CHECK(tdist_init("env://", NULL, &world));
    int rank = tdist_world_rank(world), size = tdist_world_size(world);
    example_rank = rank;
    tdist_pg_t *pg;
    CHECK(tdist_pg_create_world(world, NULL, &pg));
    nn_set_num_threads(1); /* one BLAS thread per rank: the ranks share the cores */

    static data_t d;
    load(args.csv, &d);

    /* The fixed split, then the uneven shards: rank r gets a share
     * proportional to r + 2 of the training images. */
    size_t *idx = malloc(d.n * sizeof *idx);
    if (!idx) DIE("out of memory");
    for (size_t i = 0; i < d.n; i++) idx[i] = i;
    uint64_t split_seed = 42;
    shuffle(idx, d.n, &split_seed);
    size_t n_train = d.n - N_TEST;
    const size_t *train = idx, *test = idx + n_train;
    size_t weight_sum = 0;
    for (int r = 0; r < size; r++) weight_sum += (size_t)r + 2;
    size_t shard_lo = 0, shard_n = 0, min_shard = SIZE_MAX, max_shard = 0;
    for (int r = 0, lo = 0; r < size; r++) {
        size_t hi = r == size - 1 ? n_train : n_train * (size_t)(lo + r + 2) / weight_sum;
        size_t cnt = hi - n_train * (size_t)lo / weight_sum;
        if (r == rank) {
            shard_lo = n_train * (size_t)lo / weight_sum;
            shard_n = cnt;
        }
        if (cnt < min_shard) min_shard = cnt;
        if (cnt > max_shard) max_shard = cnt;
        lo += r + 2;
    }
    size_t steps = shard_n / LOCAL_BATCH; /* this rank's steps per epoch */
    if (min_shard / LOCAL_BATCH == 0) DIE("too many ranks (%d) for %zu training images", size, n_train);

    /* The model (same seed everywhere; DDP broadcasts rank 0's anyway). */
    nn_seq_t *m = nn_seq_create(1, 8, 8, 7);
    if (!m || nn_conv2d(m, CONV1, 3, 1, 1) || nn_batchnorm2d(m) || nn_relu(m) ||
        nn_maxpool2d(m, 2, 2) || nn_conv2d(m, CONV2, 3, 1, 1) || nn_batchnorm2d(m) || nn_relu(m) ||
        nn_maxpool2d(m, 2, 2) || nn_flatten(m) || nn_linear(m, CLASSES))
        DIE("building the model: %s", nn_last_error());
    size_t np = 0, nb = 0;
    nn_param_t *params = nn_params(m, &np);
    nn_buffer_t *bufs = nn_buffers(m, &nb);
    if (!params || !bufs) DIE("model: %s", nn_last_error());

    tdist_ddp_param_t *dp = calloc(np, sizeof *dp);
    tdist_ddp_buffer_t *db = calloc(nb, sizeof *db);
    tdist_optim_param_t *op = calloc(np, sizeof *op);
    if (!dp || !db || !op) DIE("out of memory");
    for (size_t i = 0; i < np; i++) {
        dp[i] = (tdist_ddp_param_t){params[i].data, params[i].grad, params[i].count, TDIST_F32,
                                    params[i].name};
        op[i] = (tdist_optim_param_t){.param = params[i].data, .grad = params[i].grad,
                                      .count = params[i].count, .name = params[i].name};
    }
    for (size_t i = 0; i < nb; i++)
        db[i] = (tdist_ddp_buffer_t){bufs[i].data, bufs[i].count, TDIST_F32, bufs[i].name};
    tdist_ddp_opts_t dopts;
    tdist_ddp_opts_init(&dopts);
    tdist_ddp_t *ddp = NULL;
    /* the comm hook: registered before the first forward_begin; every
     * rank runs max_shard / LOCAL_BATCH iterations per epoch (its own and,
     * once it has run out, Join's shadow ones) */
    comm_t cm = {.kind = HOOK_ALLREDUCE};
    avg_t av = {0};
    hook_ctx_t hook = {NULL, TDIST_OK};
    if (args.mode != MODE_DILOCO) {
        CHECK(tdist_ddp_create(pg, dp, np, db, nb, &dopts, &ddp));
        if (args.mode == MODE_DDP) comm_setup(&cm, &args, ddp, params, np, max_shard / LOCAL_BATCH);
        else local_sgd_setup(&av, &args, pg, ddp, max_shard / LOCAL_BATCH);
        hook.ddp = ddp;
        nn_set_grad_ready_hook(m, on_grad_ready, &hook);
    } else {
        /* no DDP: start from rank 0's parameters */
        void **pp = calloc(np, sizeof *pp);
        size_t *pn = calloc(np, sizeof *pn);
        if (!pp || !pn) DIE("out of memory");
        for (size_t i = 0; i < np; i++) {
            pp[i] = params[i].data;
            pn[i] = params[i].count;
        }
        CHECK(tdist_broadcast_coalesced(pg, pp, pn, np, TDIST_F32, 0, NULL, NULL));
        free(pp);
        free(pn);
    }

    tdist_optim_sgd_opts_t so;
    tdist_optim_sgd_opts_init(&so);
    so.lr = 0.05;
    so.momentum = 0.9;
    so.weight_decay = 1e-4;
    tdist_optim_t *opt;
    CHECK(tdist_optim_create_sgd(op, np, &so, &opt));
    if (args.mode == MODE_LOCAL_SGD)
        CHECK(tdist_post_local_optim_create(opt, op, np, av.averager, NULL, &av.plo));
    if (args.mode == MODE_DILOCO) {
        tdist_diloco_opts_t o; /* outer: Nesterov, lr 0.7, momentum 0.9 (the defaults) */
        tdist_diloco_opts_init(&o);
        o.inner_steps = args.period;
        o.wire = args.wire;
        o.int8_error_feedback = true; /* int8: the rounds' quantisation errors carried over */
        CHECK(tdist_diloco_create(pg, op, np, opt, &o, &av.diloco));
    }

    size_t n_params = 0;
    for (size_t i = 0; i < np; i++) n_params += params[i].count;
    if (args.mode != MODE_DDP)
        snprintf(args.hook_name, sizeof args.hook_name, "%s:%d%s",
                 args.mode == MODE_LOCAL_SGD ? "local-sgd" : "diloco", args.period,
                 args.wire == TDIST_BF16 ? ":bf16" : args.wire == TDIST_I8 ? ":int8" : "");
    printf("train_digits: rank %d of %d: %s %s, shard of %zu training images, %zu steps of "
           "%d per epoch\n", rank, size, args.mode == MODE_DDP ? "hook" : "mode", args.hook_name,
           shard_n, steps, LOCAL_BATCH);
    if (rank == 0) {
        char what[160];
        comm_describe(&cm, &args, what, sizeof what);
        if (args.mode == MODE_LOCAL_SGD)
            snprintf(what, sizeof what, "post-local SGD: gradients averaged for %lld iterations, "
                     "then parameters every %d steps", (long long)av.start, args.period);
        if (args.mode == MODE_DILOCO)
            snprintf(what, sizeof what, "DiLoCo: %d inner SGD steps per outer Nesterov step, "
                     "outer lr 0.7, momentum 0.9, pseudo-gradient as %s", args.period,
                     tdist_dtype_name(args.wire));
        printf("train_digits: %d ranks, %zu training / %d test images, %zu parameters; uneven "
               "shards under Join; %s %s (%s)\n", size, n_train, N_TEST, n_params,
               args.mode == MODE_DDP ? "hook" : "mode", args.hook_name, what);
    }
    tdist_joinable_t joinables[2];
    size_t njoinables = 1;
    if (ddp) CHECK(tdist_ddp_joinable(ddp, &joinables[0]));
    if (av.plo) CHECK(tdist_post_local_optim_joinable(av.plo, &joinables[njoinables++]));
    if (av.diloco) CHECK(tdist_diloco_joinable(av.diloco, &joinables[0]));

    size_t *order = malloc(shard_n * sizeof *order);
    float *xb = malloc((size_t)LOCAL_BATCH * IMG * sizeof *xb);
    float *dl = malloc((size_t)LOCAL_BATCH * CLASSES * sizeof *dl);
    if (!order || !xb || !dl) DIE("out of memory");
    int yb[LOCAL_BATCH];
    uint64_t shuf = 1000 + (uint64_t)rank;
    double train_s = 0; /* the slowest rank's time, epoch by epoch */

    for (int ep = 1; ep <= epochs; ep++) {
        if (ep == epochs * 2 / 3 + 1) CHECK(tdist_optim_set_lr(opt, so.lr * 0.1));
        for (size_t i = 0; i < shard_n; i++) order[i] = train[shard_lo + i];
        shuffle(order, shard_n, &shuf);
        nn_set_training(m, true);
        double t0 = now_s(), stat[3] = {0, 0, 0}; /* loss sum, correct, samples */
        double comm = 0, wait = 0;
        tdist_join_t *join;
        CHECK(tdist_join_begin(joinables, njoinables, NULL, &join));
        for (size_t s = 0; s < steps; s++) {
            for (int b = 0; b < LOCAL_BATCH; b++) {
                size_t k = order[s * LOCAL_BATCH + (size_t)b];
                memcpy(xb + (size_t)b * IMG, d.x[k], sizeof d.x[k]);
                yb[b] = d.y[k];
            }
            if (ddp) CHECK(tdist_ddp_forward_begin(ddp));
            nn_zero_grad(m);
            float *logits = nn_forward(m, xb, LOCAL_BATCH);
            if (!logits) DIE("forward: %s", nn_last_error());
            float loss;
            if (nn_cross_entropy(logits, yb, LOCAL_BATCH, CLASSES, &loss, dl) != 0)
                DIE("loss: %s", nn_last_error());
            /* the job's running totals, summed inside the loop over every
             * rank: one that has run out takes part with zeros (Join's
             * rule 4), so the totals count each sample once */
            double step_stat[3] = {loss * LOCAL_BATCH,
                                   (double)nn_count_correct(logits, yb, LOCAL_BATCH, CLASSES),
                                   LOCAL_BATCH};
            if (args.mode == MODE_DDP)
                CHECK(tdist_all_reduce(pg, step_stat, step_stat, 3, TDIST_F64, TDIST_SUM, NULL, NULL));
            for (int i = 0; i < 3; i++) stat[i] += step_stat[i];
            if (nn_backward(m, dl) != 0) DIE("backward: %s", nn_last_error());
            CHECK(hook.st);
            if (ddp) CHECK(tdist_ddp_backward_end(ddp));
            if (args.mode == MODE_DDP) CHECK(tdist_optim_step(opt));
            if (args.mode == MODE_LOCAL_SGD) CHECK(tdist_post_local_optim_step(av.plo));
            if (args.mode == MODE_DILOCO) CHECK(tdist_diloco_step(av.diloco));
        }
        CHECK(tdist_join_end(join)); /* shadow the others, then take the last joiner's model */
        double secs = now_s() - t0;
        if (ddp) {
            tdist_ddp_stats_t ds;
            CHECK(tdist_ddp_get_stats(ddp, &ds));
            comm = ds.total_comm_ms;
            wait = ds.total_wait_ms;
        }
        /* a rank that ran out stopped adding: the last to finish holds the
         * job's totals, and they only grow, so the MAX over ranks is them
         * (with per-step sums); local totals are summed here otherwise */
        CHECK(tdist_all_reduce(pg, stat, stat, 3, TDIST_F64,
                               args.mode == MODE_DDP ? TDIST_MAX : TDIST_SUM, NULL, NULL));
        double slowest = secs;
        CHECK(tdist_all_reduce(pg, &slowest, &slowest, 1, TDIST_F64, TDIST_MAX, NULL, NULL));
        train_s += slowest;
        if (rank == 0)
            printf("epoch %2d/%d  loss %.4f  train_acc %.3f  %7.0f samples/s  comm %.0f ms, "
                   "%.0f ms of it not hidden (total so far)\n",
                   ep, epochs, stat[0] / stat[2], stat[1] / stat[2], stat[2] / slowest, comm,
                   wait);
    }

    /* The BatchNorm running statistics of the last step are each rank's
     * own (DDP broadcasts buffers at the start of every forward, as
     * PyTorch's does): take rank 0's before evaluating. */
    {
        void **bp = calloc(nb ? nb : 1, sizeof *bp);
        size_t *bn = calloc(nb ? nb : 1, sizeof *bn);
        if (!bp || !bn) DIE("out of memory");
        for (size_t i = 0; i < nb; i++) {
            bp[i] = bufs[i].data;
            bn[i] = bufs[i].count;
        }
        CHECK(tdist_broadcast_coalesced(pg, bp, bn, nb, TDIST_F32, 0, NULL, NULL));
        free(bp);
        free(bn);
    }

    /* Test: every rank evaluates its slice of the test set. */
    nn_set_training(m, false);
    double tc[2] = {0, 0};
    for (size_t i = (size_t)rank; i < N_TEST; i += (size_t)size) {
        const float *logits = nn_forward(m, d.x[test[i]], 1);
        if (!logits) DIE("forward: %s", nn_last_error());
        tc[0] += (double)nn_count_correct(logits, &d.y[test[i]], 1, CLASSES);
        tc[1] += 1;
    }
    CHECK(tdist_all_reduce(pg, tc, tc, 2, TDIST_F64, TDIST_SUM, NULL, NULL));

    /* Identical parameters: every rank's hash of parameters and buffers. */
    size_t pc = 0, bc = 0;
    const float *flat = nn_flat_params(m, &pc), *fb = nn_flat_buffers(m, &bc);
    uint64_t mine = hash_floats(flat, pc) ^ (hash_floats(fb, bc) * 31u);
    uint64_t *all = calloc((size_t)size, sizeof *all);
    if (!all) DIE("out of memory");
    CHECK(tdist_all_gather(pg, &mine, all, 1, TDIST_I64, NULL, NULL));
    bool same = true;
    for (int r = 0; r < size; r++) same = same && all[r] == all[0];
    if (rank == 0) {
        tdist_ddp_stats_t ds = {0};
        if (ddp) {
            CHECK(tdist_ddp_get_stats(ddp, &ds));
            printf("ddp: %llu iterations, %llu buckets, %.1f MB reduced, %.0f%% of communication "
                   "overlapped with backward\n",
                   (unsigned long long)ds.iterations, (unsigned long long)ds.num_buckets,
                   (double)ds.bytes_reduced / 1e6, 100.0 * ds.overlap_fraction);
        }
        double f32 = 4.0 * (double)n_params;
        double per = comm_bytes_per_iter(&cm, &ds, size);
        if (args.mode == MODE_LOCAL_SGD) per = local_sgd_bytes_per_iter(&av, f32);
        if (args.mode == MODE_DILOCO) {
            tdist_diloco_stats_t s;
            CHECK(tdist_diloco_get_stats(av.diloco, &s));
            per = (double)s.wire_bytes / ((double)epochs * (double)(max_shard / LOCAL_BATCH));
        }
        const char *when = "";
        if (cm.kind == HOOK_POWERSGD) {
            when = cm.iters ? " once compressing" : " (never compressed: f32 throughout)";
            if (!cm.iters) per = f32;
        }
        printf("%s %s: %.0f bytes of %s into the collectives per iteration%s (%.3f of "
               "f32's %.0f); training %.2f s; test %.0f/%.0f correct\n",
               args.mode == MODE_DDP ? "hook" : "mode", args.hook_name, per,
               args.mode == MODE_DDP         ? "gradient"
               : args.mode == MODE_DILOCO    ? "pseudo-gradient"
                                             : "gradient and parameters",
               when, per / f32, f32,
               train_s, tc[0], tc[1]);
        printf("final test_accuracy=%.2f params_identical=%s\n", tc[0] / tc[1], same ? "yes" : "no");
    }

    free(all);
    free(order);
    free(xb);
    free(dl);
    free(idx);
    free(dp);
    free(db);
    free(op);
    tdist_optim_destroy(opt);
    tdist_ddp_destroy(ddp);
    comm_destroy(&cm);
    avg_destroy(&av);
    nn_seq_destroy(m);
    tdist_pg_destroy(pg);
    tdist_world_destroy(world);
    return same ? 0 : 3;
}
