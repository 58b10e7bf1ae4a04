/*
 * examples/train_gpt.c — the README's main job: a small GPT (nn's
 * nn_gpt_t, llm.c style) trained byte by byte on English text with tdist's
 * DDP under Join, on the ranks tdistrun starts.
 *
 *   tdistrun --nproc-per-node 4 train_gpt fortunes.txt [options]
 *
 * The text: Debian's `fortunes` package (scripts/fortunes_corpus.sh joins
 * its files into one; fortunes are separated by lines holding "%"). A
 * fixed split puts every tenth fortune (by a hash of its index) into the
 * validation text, the rest into the training text. Tokens are bytes
 * (vocabulary 256).
 *
 * Uneven data under Join. The training text is cut into uneven shards
 * (rank r's share grows with r + 2). Training runs in rounds of R
 * iterations (--round, default 50): in a round rank r takes
 * ceil(R (r+2) / (world+1)) batches from its shard, the last rank R of
 * them; a rank that has taken its batches leaves the loop and shadows the
 * others' collectives (Join) until the round ends. Every round is one
 * Join of two joinables: DDP, and the optimizers, whose post hook hands
 * every rank the optimizer state of the last rank to join (the only one
 * that stepped every iteration of the round; DDP's own post hook does the
 * same for the parameters). A batch's windows are drawn from the rank's
 * shard by a counter-based generator of (seed, rank, iteration, row), so
 * the data position is the iteration number.
 *
 * Training: AdamW (betas 0.9/0.95, weight decay 0.1 on the matrices and
 * embeddings only: two tdist optimizers), gradient clipping at global
 * norm 1, learning rate warmed up over the first 5% of the iterations then
 * cosine-decayed to a tenth. The validation loss is measured at the end
 * of every round on fixed windows of the validation text, and compared
 * with the unigram baseline (the cross-entropy of the validation bytes
 * under the training bytes' frequencies).
 *
 * Output: the last rank (whose shard is the largest, so it is in every
 * iteration) shows progress: a bar on a terminal (stdout a terminal, or
 * TDIST_PROGRESS=bar), else a line every --log-every iterations, with
 * iteration, loss, tokens/s, the share of DDP's communication hidden
 * behind backward, and the time left. Rank 0 prints the validation losses,
 * a generated sample, and at the end
 *   final val_loss=<x> unigram=<y> params_identical=yes
 *
 * Checkpoints (--ckpt FILE --ckpt-every N): model, both optimizers'
 * state, the iteration (the data position), the generator seeds and the
 * sampler's state, in one file written by the lowest rank still active at
 * that iteration (it stepped every iteration) to FILE.tmp and renamed over
 * FILE. --resume continues from FILE; --stop-after N ends the run after
 * iteration N's checkpoint, as an interruption would. A comm hook's own
 * state (PowerSGD's and int8's error feedback) is not in the file: with
 * those hooks a resumed run starts it afresh.
 *
 * Other options: --hook (DDP comm hook, as train_digits), --checkpoint-
 * activations (recompute each block's activations in backward),
 * --offload (keep them in bf16), and instead of plain DDP + AdamW
 * (tdist/algorithms.h), each with one object per AdamW group:
 *   --zero: each group's AdamW is a ZeRO object (whole parameters per
 *     rank, synchronised by broadcast from their owners; under Join by
 *     all_gather, a joined rank stepping its shard from the lowest active
 *     rank's clipped gradients at the iteration's learning rate). Not the
 *     overlap hook: clipping by global norm needs every averaged gradient
 *     before any step, and the hook steps each bucket as it arrives.
 *     Checkpoints hold every rank's shard (gathered; rank 0 writes); a
 *     checkpoint due inside a round ends that round's Join there.
 *   --local-sgd K: post-local SGD: DDP averages the gradients in the first
 *     round, then each rank steps alone and the parameters are averaged
 *     every K steps (a post-local-SGD optimizer per group, joinables after
 *     DDP's); DDP's post hook ends each round with the last joiner's.
 *   --diloco H[:bf16|:int8]: DiLoCo without DDP: H inner AdamW steps, then
 *     an outer Nesterov step on the averaged pseudo-gradient; a last
 *     synchronisation ends every round.
 * With --local-sgd and --diloco every rank keeps its own AdamW state (as
 * PyTorch's post-local-SGD optimizer), and checkpoints are refused.
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime, fileno, fsync */

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <tdist/nn.h>
#include <tdist/tdist.h>

#define EXAMPLE_NAME "train_gpt"
#include "example_util.h"

#define VOCAB 256
#define VAL_ROWS 64 /* validation windows */
#define CKPT_MAGIC 0x54445347504b4331ull      /* "TDSGPKC1" */
#define CKPT_MAGIC_ZERO 0x54445347504b5a31ull /* "TDSGPKZ1": written with --zero */

/* splitmix64's output for state z: a hash of z (the counter-based
 * generator of the batches' windows, and the sampler). */
static uint64_t mix(uint64_t z) { return rng_next(&z); }

/* ------------------------------------------------------- the command line */

/* What is communicated, and when. */
typedef enum mode {
    MODE_DDP,       /* averaged gradients every step (with --hook's hook) */
    MODE_ZERO,      /* the same, with the optimizer state sharded (ZeRO) */
    MODE_LOCAL_SGD, /* post-local SGD: parameters every K steps */
    MODE_DILOCO     /* DiLoCo: pseudo-gradients every H steps */
} train_mode_t;

typedef struct args {
    const char *corpus;
    long steps, round, log_every, ckpt_every, stop_after, batch, seq, layers, embd, heads, sample;
    const char *hook, *ckpt;
    bool resume, recompute, offload;
    double lr;
    train_mode_t mode;
    long period;        /* --local-sgd K, --diloco H */
    tdist_dtype_t wire; /* DiLoCo's pseudo-gradient: f32, bf16 or i8 */
} args_t;

static void usage(FILE *f, const char *prog)
{
    fprintf(f,
            "usage: tdistrun --nproc-per-node N %s CORPUS [options]\n"
            "  --steps N        iterations (default: TDIST_STEPS, else 300)\n"
            "  --round N        iterations per round, one Join each (default 50)\n"
            "  --batch B --seq T --layers L --embd C --heads H   model and batch\n"
            "                   (default 8 64 4 128 4)\n"
            "  --lr LR          peak learning rate (default 2e-3)\n"
            "  --hook HOOK      allreduce (default), fp16, bf16, powersgd:R, int8\n"
            "  --checkpoint-activations   recompute block activations in backward\n"
            "  --offload        keep block activations in bf16\n"
            "  --ckpt FILE      checkpoint file (default gpt.ckpt)\n"
            "  --ckpt-every N   write it every N iterations (default 0: never)\n"
            "  --resume         continue from --ckpt's file\n"
            "  --stop-after N   stop after iteration N (its checkpoint written)\n"
            "  --log-every N    a progress line every N iterations (default 10)\n"
            "  --sample N       bytes of generated text at the end (default 300)\n"
            "  --zero           shard the AdamW state over the ranks (ZeRO)\n"
            "  --local-sgd K    post-local SGD: gradients averaged in the first round,\n"
            "                   then the parameters every K = 1..10000 steps\n"
            "  --diloco H[:bf16|:int8]   DiLoCo: an outer Nesterov step every H = 1..10000\n"
            "                   inner AdamW steps (pseudo-gradient as f32, bf16 or int8)\n",
            prog);
}

static long num_arg(const char *opt, const char *v, long lo, long hi)
{
    char *end;
    long x = v ? strtol(v, &end, 10) : 0;
    if (!v || *v == '\0' || *end != '\0' || x < lo || x > hi) {
        fprintf(stderr, "train_gpt: %s needs a number in %ld..%ld\n", opt, lo, hi);
        exit(2);
    }
    return x;
}

/* --zero, --local-sgd K or --diloco H[:bf16|:int8] (v: K or H; "" for
 * --zero); only one of them. */
static void parse_mode(args_t *a, const char *opt, const char *v)
{
    char *end = NULL;
    long p = v && *v ? strtol(v, &end, 10) : 0;
    a->wire = TDIST_F32;
    if (opt[2] == 'd' && end && strcmp(end, ":bf16") == 0) a->wire = TDIST_BF16;
    if (opt[2] == 'd' && end && strcmp(end, ":int8") == 0) a->wire = TDIST_I8;
    if (a->wire != TDIST_F32) end += strlen(end);
    if (a->mode != MODE_DDP || !v || (opt[2] != 'z' && (*v == '\0' || *end != '\0' || p < 1 ||
                                                        p > 10000))) {
        fprintf(stderr, "train_gpt: %s: %s\n", opt,
                a->mode != MODE_DDP ? "--zero, --local-sgd and --diloco exclude each other"
                                    : "needs a period in 1..10000 (--diloco: H, H:bf16 or H:int8)");
        exit(2);
    }
    a->mode = opt[2] == 'z' ? MODE_ZERO : opt[2] == 'l' ? MODE_LOCAL_SGD : MODE_DILOCO;
    a->period = p;
}

static void parse_args(int argc, char **argv, args_t *a)
{
    const char *prog = argv[0] ? argv[0] : "train_gpt";
    const char *env = getenv("TDIST_STEPS");
    *a = (args_t){.steps = env ? num_arg("TDIST_STEPS", env, 1, 10000000) : 300, .round = 50,
                  .log_every = 10, .batch = 8, .seq = 64, .layers = 4, .embd = 128, .heads = 4,
                  .sample = 300, .hook = "allreduce", .ckpt = "gpt.ckpt", .stop_after = -1,
                  .lr = 2e-3};
    static const struct {
        const char *name;
        size_t off;
        long lo, hi;
    } nums[] = {
        {"--steps", offsetof(args_t, steps), 1, 10000000},
        {"--round", offsetof(args_t, round), 1, 1000000},
        {"--log-every", offsetof(args_t, log_every), 1, 1000000},
        {"--ckpt-every", offsetof(args_t, ckpt_every), 0, 10000000},
        {"--stop-after", offsetof(args_t, stop_after), 1, 10000000},
        {"--batch", offsetof(args_t, batch), 1, 1024},
        {"--seq", offsetof(args_t, seq), 2, 1024},
        {"--layers", offsetof(args_t, layers), 1, 48},
        {"--embd", offsetof(args_t, embd), 1, 4096},
        {"--heads", offsetof(args_t, heads), 1, 64},
        {"--sample", offsetof(args_t, sample), 0, 100000},
    };
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i];
        bool done = false;
        for (size_t k = 0; k < sizeof nums / sizeof nums[0] && !done; k++)
            if (strcmp(s, nums[k].name) == 0) {
                *(long *)((char *)a + nums[k].off) =
                    num_arg(s, i + 1 < argc ? argv[++i] : NULL, nums[k].lo, nums[k].hi);
                done = true;
            }
        if (done) continue;
        if (strcmp(s, "-h") == 0 || strcmp(s, "--help") == 0) {
            usage(stdout, prog);
            exit(0);
        } else if (strcmp(s, "--hook") == 0 || strcmp(s, "--ckpt") == 0) {
            if (i + 1 >= argc) {
                fprintf(stderr, "train_gpt: %s needs a value\n", s);
                usage(stderr, prog);
                exit(2);
            }
            *(s[2] == 'h' ? &a->hook : &a->ckpt) = argv[++i];
        } else if (strcmp(s, "--lr") == 0) {
            char *end;
            a->lr = i + 1 < argc ? strtod(argv[++i], &end) : 0;
            if (!(a->lr > 0 && a->lr < 1) || *end != '\0') {
                fprintf(stderr, "train_gpt: --lr needs a number in (0, 1)\n");
                exit(2);
            }
        } else if (strcmp(s, "--resume") == 0) {
            a->resume = true;
        } else if (strcmp(s, "--checkpoint-activations") == 0) {
            a->recompute = true;
        } else if (strcmp(s, "--offload") == 0) {
            a->offload = true;
        } else if (strcmp(s, "--zero") == 0 || strcmp(s, "--local-sgd") == 0 ||
                   strcmp(s, "--diloco") == 0) {
            parse_mode(a, s, s[2] == 'z' ? "" : i + 1 < argc ? argv[++i] : NULL);
        } else if (s[0] == '-' || a->corpus) {
            fprintf(stderr, "train_gpt: unknown option or extra argument '%s'\n", s);
            usage(stderr, prog);
            exit(2);
        } else {
            a->corpus = s;
        }
    }
    if (!a->corpus) {
        usage(stderr, prog);
        exit(2);
    }
    bool hook_ok = strcmp(a->hook, "allreduce") == 0 || strcmp(a->hook, "fp16") == 0 ||
                   strcmp(a->hook, "bf16") == 0 || strcmp(a->hook, "int8") == 0;
    if (strncmp(a->hook, "powersgd:", 9) == 0) {
        char *end;
        long r = strtol(a->hook + 9, &end, 10);
        hook_ok = a->hook[9] >= '0' && a->hook[9] <= '9' && *end == '\0' && r >= 1 && r <= 32;
    }
    if (!hook_ok) {
        fprintf(stderr, "train_gpt: bad --hook '%s'\n", a->hook);
        usage(stderr, prog);
        exit(2);
    }
    if (a->mode >= MODE_LOCAL_SGD && strcmp(a->hook, "allreduce") != 0) {
        fprintf(stderr, "train_gpt: --hook is for gradient averaging, not with --local-sgd or "
                "--diloco\n");
        exit(2);
    }
    if (a->mode >= MODE_LOCAL_SGD && (a->ckpt_every || a->stop_after > 0 || a->resume)) {
        fprintf(stderr, "train_gpt: --ckpt-every, --stop-after and --resume are not available "
                "with --local-sgd or --diloco (the replicas differ between synchronisations; "
                "a checkpoint holds one)\n");
        exit(2);
    }
    if (a->recompute && a->offload) {
        fprintf(stderr, "train_gpt: --checkpoint-activations and --offload exclude each other\n");
        exit(2);
    }
}

/* ------------------------------------------------------------------ data */

typedef struct text {
    int *train, *val;
    size_t ntrain, nval;
} text_t;

static void append(int **buf, size_t *n, size_t *cap, const unsigned char *p, size_t len)
{
    if (*n + len > *cap) {
        *cap = (*n + len) * 2;
        *buf = realloc(*buf, *cap * sizeof **buf);
        if (!*buf) DIE("out of memory");
    }
    for (size_t i = 0; i < len; i++) (*buf)[(*n)++] = p[i];
}

/* Fortunes end at a line holding "%"; each goes whole (with its "%" line)
 * to the validation text when mix(its index) % 10 == 0. */
static void load_text(const char *path, text_t *t)
{
    FILE *f = fopen(path, "rb");
    if (!f) DIE("cannot open %s (scripts/fortunes_corpus.sh makes it)", path);
    size_t tcap = 0, vcap = 0, idx = 0, len = 0, cap = 1 << 16;
    unsigned char *cur = malloc(cap);
    char line[4096];
    *t = (text_t){0};
    if (!cur) DIE("out of memory");
    while (fgets(line, sizeof line, f)) {
        size_t n = strlen(line);
        if (len + n > cap && !(cur = realloc(cur, cap = 2 * (len + n)))) DIE("out of memory");
        memcpy(cur + len, line, n);
        len += n;
        if (strcmp(line, "%\n") == 0) {
            if (mix(idx++) % 10 == 0) append(&t->val, &t->nval, &vcap, cur, len);
            else append(&t->train, &t->ntrain, &tcap, cur, len);
            len = 0;
        }
    }
    if (len) append(&t->train, &t->ntrain, &tcap, cur, len);
    fclose(f);
    free(cur);
    if (t->ntrain < 10000 || t->nval < 1000)
        DIE("%s: too little text (%zu training, %zu validation bytes)", path, t->ntrain, t->nval);
}

/* Cross-entropy (nats) of the validation bytes under the training bytes'
 * frequencies (add-one smoothed): what a model that ignores context gets. */
static double unigram_baseline(const text_t *t)
{
    double cnt[VOCAB];
    for (int i = 0; i < VOCAB; i++) cnt[i] = 1.0;
    for (size_t i = 0; i < t->ntrain; i++) cnt[t->train[i]] += 1.0;
    double total = (double)t->ntrain + VOCAB, ce = 0.0;
    for (size_t i = 0; i < t->nval; i++) ce -= log(cnt[t->val[i]] / total);
    return ce / (double)t->nval;
}

/* ------------------------------------------------------------- the job */

typedef struct job {
    args_t a;
    int rank, size;
    tdist_pg_t *pg;
    nn_gpt_t *g;
    nn_param_t *params;
    size_t np;
    tdist_ddp_t *ddp;
    tdist_optim_t *opt[2]; /* decayed (matrices, embeddings), not decayed (not with --zero) */
    tdist_optim_param_t *op[2]; /* the two groups' buffers */
    size_t nop[2];
    /* --zero, --local-sgd, --diloco: one object per AdamW group */
    tdist_zero_t *zero[2];
    tdist_joinable_t zero_jn[2];
    tdist_post_local_t *plh;         /* local SGD: DDP's post-local-SGD hook */
    tdist_averager_t *avg[2];        /* local SGD: the periodic averagers */
    tdist_post_local_optim_t *plo[2];
    tdist_diloco_t *dl[2];
    text_t text;
    size_t shard_lo, shard_n;
    int *tok, *tgt;
    uint64_t seed, sampler;
    long it;               /* next iteration to run */
    tdist_status_t hook_st;
    tdist_compress_t *comp;
    tdist_powersgd_t *psgd;
    tdist_int8_t *q;
    size_t *rows;
} job_t;

static void on_grad_ready(void *arg, size_t i)
{
    job_t *j = arg;
    tdist_status_t st = tdist_ddp_grad_ready(j->ddp, i);
    if (st != TDIST_OK && j->hook_st == TDIST_OK) j->hook_st = st;
}

/* Batches rank r takes in a round of len iterations (the last rank: len). */
static long batches_in_round(long len, int r, int size)
{
    return (len * (r + 2) + size) / (size + 1);
}

static void make_batch(job_t *j, long it)
{
    size_t B = (size_t)j->a.batch, T = (size_t)j->a.seq, span = j->shard_n - T - 1;
    for (size_t b = 0; b < B; b++) {
        uint64_t h = mix(j->seed ^ mix(((uint64_t)j->rank << 48) ^ ((uint64_t)it << 12) ^ b));
        const int *src = j->text.train + j->shard_lo + h % span;
        memcpy(j->tok + b * T, src, T * sizeof(int));
        memcpy(j->tgt + b * T, src + 1, T * sizeof(int));
    }
}

/* ------------------------------------------------------------ comm hook */

static void hook_setup(job_t *j)
{
    const char *h = j->a.hook;
    if (strcmp(h, "allreduce") == 0) return;
    if (strcmp(h, "fp16") == 0 || strcmp(h, "bf16") == 0) {
        tdist_compress_opts_t o;
        tdist_compress_opts_init(&o);
        o.wire = h[0] == 'f' ? TDIST_F16 : TDIST_BF16;
        CHECK(tdist_compress_hook_create(&o, &j->comp));
        CHECK(tdist_compress_register(j->ddp, j->comp));
    } else if (strncmp(h, "powersgd:", 9) == 0) {
        long r = strtol(h + 9, NULL, 10); /* checked by parse_args */
        /* shape[0] of each matrix (PyTorch's Linear: out x in); 1-D: 0 */
        j->rows = calloc(j->np, sizeof *j->rows);
        if (!j->rows) DIE("out of memory");
        for (size_t i = 0; i < j->np; i++) {
            size_t C = (size_t)j->a.embd, cnt = j->params[i].count;
            bool mat = strstr(j->params[i].name, "weight") && !strstr(j->params[i].name, "ln_");
            j->rows[i] = i == 0                                       ? VOCAB
                         : i == 1                                     ? (size_t)j->a.seq
                         : strstr(j->params[i].name, "mlp.c_proj.w") ? C
                         : mat                                        ? cnt / C
                                                                      : 0;
        }
        tdist_powersgd_opts_t o;
        tdist_powersgd_opts_init(&o);
        o.matrix_approximation_rank = (int)r;
        o.start_powerSGD_iter = j->a.round > 2 ? j->a.round : 2; /* plain averaging first */
        o.param_rows = j->rows;
        o.num_params = j->np;
        CHECK(tdist_powersgd_create(&o, &j->psgd));
        CHECK(tdist_powersgd_register(j->ddp, j->psgd));
    } else if (strcmp(h, "int8") == 0) {
        tdist_int8_opts_t o;
        tdist_int8_opts_init(&o);
        o.error_feedback = true;
        o.sum_error_feedback = true;
        CHECK(tdist_int8_hook_create(&o, &j->q));
        CHECK(tdist_int8_register(j->ddp, j->q));
    }
}

/* ------------------------------------------------------------ optimizers */

/* AdamW over the matrices and embeddings (decayed) and over the biases and
 * LayerNorm parameters (not decayed), as nanoGPT's two groups. With
 * --zero each group is a ZeRO object (its AdamW state sharded over the
 * ranks) instead of an optimizer. */
static void make_optimizers(job_t *j)
{
    for (int k = 0; k < 2; k++)
        if (!(j->op[k] = calloc(j->np, sizeof *j->op[k]))) DIE("out of memory");
    for (size_t i = 0; i < j->np; i++) {
        const nn_param_t *p = &j->params[i];
        int k = strstr(p->name, "bias") || strstr(p->name, "ln_") ? 1 : 0;
        j->op[k][j->nop[k]++] = (tdist_optim_param_t){.param = p->data, .grad = p->grad,
                                                      .count = p->count, .name = p->name};
    }
    for (int k = 0; k < 2; k++) {
        tdist_optim_adam_opts_t o;
        tdist_optim_adamw_opts_init(&o);
        o.beta2 = 0.95;
        o.weight_decay = k == 0 ? 0.1 : 0.0;
        if (j->a.mode != MODE_ZERO) {
            CHECK(tdist_optim_create_adamw(j->op[k], j->nop[k], &o, &j->opt[k]));
            continue;
        }
        tdist_zero_opts_t zo; /* whole parameters per rank, synchronised by broadcast */
        tdist_zero_opts_init(&zo);
        zo.kind = TDIST_OPTIM_ADAMW;
        zo.adam = o;
        CHECK(tdist_zero_create(j->pg, j->op[k], j->nop[k], &zo, &j->zero[k]));
        CHECK(tdist_zero_joinable(j->zero[k], &j->zero_jn[k]));
    }
}

/* The learning rate of iteration it: warm-up, then cosine to a tenth. */
static double lr_at(const job_t *j, long it)
{
    long warm = j->a.steps / 20 + 1;
    return nn_lr_warmup_cosine((size_t)it, (size_t)warm, (size_t)j->a.steps, j->a.lr,
                               j->a.lr / 10);
}

static void set_lr(job_t *j, double lr)
{
    for (int k = 0; k < 2; k++)
        CHECK(j->zero[k] ? tdist_zero_set_lr(j->zero[k], lr) : tdist_optim_set_lr(j->opt[k], lr));
}

/* The step of both groups, by mode. */
static void optim_step(job_t *j)
{
    for (int k = 0; k < 2; k++) {
        switch (j->a.mode) {
        case MODE_DDP: CHECK(tdist_optim_step(j->opt[k])); break;
        case MODE_ZERO: CHECK(tdist_zero_step(j->zero[k])); break;
        case MODE_LOCAL_SGD: CHECK(tdist_post_local_optim_step(j->plo[k])); break;
        case MODE_DILOCO: CHECK(tdist_diloco_step(j->dl[k])); break;
        }
    }
}

/* ZeRO under Join: both ZeRO objects' joinables in one, which first sets
 * the learning rate of the iteration the active ranks are running (a
 * joined rank still steps its shard, from the lowest active rank's
 * clipped gradients; its scheduler must follow). j->it counts the
 * iterations on. */
static void zero_join_attach(void *ctx, tdist_join_t *join)
{
    job_t *j = ctx;
    for (int k = 0; k < 2; k++) j->zero_jn[k].attach(j->zero_jn[k].ctx, join);
}

static tdist_status_t zero_main_hook(void *ctx, const tdist_join_state_t *st)
{
    job_t *j = ctx;
    tdist_status_t s = TDIST_OK;
    for (int k = 0; k < 2 && s == TDIST_OK; k++) s = tdist_zero_set_lr(j->zero[k], lr_at(j, j->it));
    for (int k = 0; k < 2 && s == TDIST_OK; k++) s = j->zero_jn[k].main_hook(j->zero_jn[k].ctx, st);
    j->it++;
    return s;
}

/* Local SGD: DDP averages the gradients in the first round (the
 * post-local-SGD hook), then no more; from then on each group's periodic
 * averager averages its parameters every K steps (a post-local-SGD
 * optimizer per AdamW group). DiLoCo: a DiLoCo state per group, whose
 * inner optimizer is the group's AdamW; both synchronise on the same
 * steps. */
static void averaging_setup(job_t *j)
{
    int64_t start = j->a.round;
    if (j->a.mode == MODE_LOCAL_SGD) {
        tdist_post_local_opts_t po;
        tdist_post_local_opts_init(&po);
        po.start_localSGD_iter = start;
        po.post_local_gradient_allreduce = false;
        CHECK(tdist_post_local_create(&po, &j->plh));
        CHECK(tdist_post_local_register(j->ddp, j->plh));
    }
    for (int k = 0; k < 2 && j->a.mode >= MODE_LOCAL_SGD; k++) {
        if (j->a.mode == MODE_LOCAL_SGD) {
            tdist_averager_opts_t ao;
            tdist_averager_opts_init(&ao);
            ao.period = j->a.period;
            ao.warmup_steps = start;
            CHECK(tdist_periodic_averager_create(j->pg, &ao, &j->avg[k]));
            CHECK(tdist_post_local_optim_create(j->opt[k], j->op[k], j->nop[k], j->avg[k], NULL,
                                                &j->plo[k]));
        } else {
            tdist_diloco_opts_t o; /* outer: Nesterov, lr 0.7, momentum 0.9 (the defaults) */
            tdist_diloco_opts_init(&o);
            o.inner_steps = j->a.period;
            o.wire = j->a.wire;
            o.int8_error_feedback = true;
            CHECK(tdist_diloco_create(j->pg, j->op[k], j->nop[k], j->opt[k], &o, &j->dl[k]));
        }
    }
}


/* The optimizers as a joinable: no collectives while others train (they
 * issue none), and once the round is over every rank loads the state of
 * the last rank to join, which stepped in every iteration. */
static tdist_status_t optim_post_hook(void *ctx, bool is_last_joiner, const tdist_join_state_t *st)
{
    (void)is_last_joiner;
    job_t *j = ctx;
    for (int k = 0; k < 2; k++) {
        size_t n;
        tdist_status_t s = tdist_optim_state_size(j->opt[k], &n);
        if (s != TDIST_OK) return s;
        unsigned char *buf = malloc(n);
        if (!buf) return TDIST_ERR_NO_MEMORY;
        if ((s = tdist_optim_save(j->opt[k], buf, n)) == TDIST_OK &&
            (s = tdist_broadcast(j->pg, buf, n, TDIST_U8, st->last_joiner, NULL, NULL)) == TDIST_OK)
            s = tdist_optim_load(j->opt[k], buf, n);
        free(buf);
        if (s != TDIST_OK) return s;
    }
    return TDIST_OK;
}

/* The Join's participants, by mode; returns how many. */
static size_t joinables(job_t *j, tdist_joinable_t *jn)
{
    size_t n = 0;
    if (j->ddp) CHECK(tdist_ddp_joinable(j->ddp, &jn[n++]));
    switch (j->a.mode) {
    case MODE_DDP: jn[n++] = (tdist_joinable_t){.ctx = j, .pg = j->pg, .post_hook = optim_post_hook}; break;
    case MODE_ZERO:
        jn[n++] = (tdist_joinable_t){.ctx = j, .pg = j->pg, .attach = zero_join_attach,
                                     .main_hook = zero_main_hook};
        break;
    case MODE_LOCAL_SGD:
        for (int k = 0; k < 2; k++) CHECK(tdist_post_local_optim_joinable(j->plo[k], &jn[n++]));
        break;
    case MODE_DILOCO:
        for (int k = 0; k < 2; k++) CHECK(tdist_diloco_joinable(j->dl[k], &jn[n++]));
        break;
    }
    return n;
}

/* ------------------------------------------------------------ checkpoint */

typedef struct ckpt_head {
    uint64_t magic, it, seed, sampler;
    int64_t shape[8]; /* batch seq layers embd heads world steps round */
    uint64_t nparams, opt_bytes[2];
} ckpt_head_t;

static void ckpt_shape(const job_t *j, int64_t *s)
{
    const args_t *a = &j->a;
    int64_t v[8] = {a->batch, a->seq, a->layers, a->embd, a->heads, j->size, a->steps, a->round};
    memcpy(s, v, sizeof v);
}

/* Group k's optimizer state as it goes into the file: the optimizer's
 * saved state; with --zero, every rank's ZeRO shard, gathered here
 * (collective: every rank calls it), as the rank count, the W blob sizes
 * (uint64) and the W blobs. The caller frees it. */
static unsigned char *opt_blob(job_t *j, int k, size_t *len)
{
    size_t n;
    unsigned char *b;
    if (!j->zero[k]) {
        CHECK(tdist_optim_state_size(j->opt[k], &n));
        if (!(b = malloc(n ? n : 1))) DIE("out of memory");
        CHECK(tdist_optim_save(j->opt[k], b, n));
        *len = n;
        return b;
    }
    size_t W = (size_t)j->size, mx = 0, at = (1 + W) * sizeof(uint64_t);
    CHECK(tdist_zero_shard_size(j->zero[k], &n));
    uint64_t mine = n, *sz = calloc(W, sizeof *sz);
    if (!sz) DIE("out of memory");
    CHECK(tdist_all_gather(j->pg, &mine, sz, 1, TDIST_I64, NULL, NULL));
    for (size_t r = 0; r < W; r++) mx = sz[r] > mx ? sz[r] : mx, at += sz[r];
    unsigned char *pad = calloc(mx, 1), *all = malloc(mx * W);
    if (!pad || !all || !(b = malloc(at))) DIE("out of memory");
    CHECK(tdist_zero_save_shard(j->zero[k], pad, n));
    CHECK(tdist_all_gather(j->pg, pad, all, mx, TDIST_U8, NULL, NULL));
    uint64_t w = W;
    memcpy(b, &w, sizeof w);
    memcpy(b + sizeof w, sz, W * sizeof *sz);
    at = (1 + W) * sizeof(uint64_t);
    for (size_t r = 0; r < W; at += sz[r], r++) memcpy(b + at, all + r * mx, sz[r]);
    *len = at;
    free(sz), free(pad), free(all);
    return b;
}

/* Load group k's state from what opt_blob wrote (len bytes of b). */
static void opt_unblob(job_t *j, int k, const unsigned char *b, size_t len)
{
    if (!j->zero[k]) {
        CHECK(tdist_optim_load(j->opt[k], b, len));
        return;
    }
    uint64_t W;
    if (len < sizeof W) DIE("%s: ZeRO state truncated", j->a.ckpt);
    memcpy(&W, b, sizeof W);
    size_t at = (1 + W) * sizeof(uint64_t);
    if (W < 1 || W > 1u << 20 || len < at) DIE("%s: ZeRO state damaged", j->a.ckpt);
    size_t *sz = calloc(W, sizeof *sz);
    const void **blobs = calloc(W, sizeof *blobs);
    if (!sz || !blobs) DIE("out of memory");
    for (size_t r = 0; r < W; at += sz[r], r++) {
        uint64_t v;
        memcpy(&v, b + (1 + r) * sizeof v, sizeof v);
        if (v > len - at) DIE("%s: ZeRO state damaged", j->a.ckpt);
        sz[r] = v;
        blobs[r] = b + at;
    }
    CHECK(tdist_zero_load_shards(j->zero[k], blobs, sz, W));
    free(sz);
    free(blobs);
}

/* One file: header, parameters, the two optimizer blobs; written to
 * FILE.tmp, flushed to disk, renamed over FILE (never half a file). With
 * --zero every rank calls it (the shards are gathered) and rank 0 writes. */
static void ckpt_save(job_t *j)
{
    ckpt_head_t h = {.magic = j->zero[0] ? CKPT_MAGIC_ZERO : CKPT_MAGIC, .it = (uint64_t)j->it,
                     .seed = j->seed, .sampler = j->sampler};
    ckpt_shape(j, h.shape);
    size_t pc;
    const float *p = nn_gpt_flat_params(j->g, &pc);
    h.nparams = pc;
    unsigned char *blob[2];
    for (int k = 0; k < 2; k++) {
        size_t n;
        blob[k] = opt_blob(j, k, &n);
        h.opt_bytes[k] = n;
    }
    if (j->zero[0] && j->rank != 0) {
        free(blob[0]);
        free(blob[1]);
        return;
    }
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", j->a.ckpt);
    FILE *f = fopen(tmp, "wb");
    if (!f) DIE("cannot write %s", tmp);
    bool ok = fwrite(&h, sizeof h, 1, f) == 1 && fwrite(p, sizeof *p, pc, f) == pc &&
              fwrite(blob[0], 1, h.opt_bytes[0], f) == h.opt_bytes[0] &&
              fwrite(blob[1], 1, h.opt_bytes[1], f) == h.opt_bytes[1] && fflush(f) == 0 &&
              fsync(fileno(f)) == 0;
    if (fclose(f) != 0 || !ok || rename(tmp, j->a.ckpt) != 0) DIE("writing %s failed", j->a.ckpt);
    free(blob[0]);
    free(blob[1]);
}

static void ckpt_load(job_t *j)
{
    FILE *f = fopen(j->a.ckpt, "rb");
    if (!f) DIE("--resume: cannot open %s", j->a.ckpt);
    ckpt_head_t h;
    int64_t want[8];
    ckpt_shape(j, want);
    size_t pc;
    float *p = nn_gpt_flat_params(j->g, &pc);
    if (fread(&h, sizeof h, 1, f) != 1 || (h.magic != CKPT_MAGIC && h.magic != CKPT_MAGIC_ZERO))
        DIE("%s is not a train_gpt checkpoint", j->a.ckpt);
    if ((h.magic == CKPT_MAGIC_ZERO) != (j->zero[0] != NULL))
        DIE("%s was written %s --zero: resume %s it", j->a.ckpt,
            h.magic == CKPT_MAGIC_ZERO ? "with" : "without",
            h.magic == CKPT_MAGIC_ZERO ? "with" : "without");
    if (memcmp(h.shape, want, sizeof want) != 0 || h.nparams != pc)
        DIE("%s was written by another configuration (batch seq layers embd heads world steps "
            "round: %lld %lld %lld %lld %lld %lld %lld %lld)", j->a.ckpt, (long long)h.shape[0],
            (long long)h.shape[1], (long long)h.shape[2], (long long)h.shape[3],
            (long long)h.shape[4], (long long)h.shape[5], (long long)h.shape[6],
            (long long)h.shape[7]);
    if (fread(p, sizeof *p, pc, f) != pc) DIE("%s is truncated", j->a.ckpt);
    for (int k = 0; k < 2; k++) {
        unsigned char *b = malloc(h.opt_bytes[k] ? h.opt_bytes[k] : 1);
        if (!b) DIE("out of memory");
        if (fread(b, 1, h.opt_bytes[k], f) != h.opt_bytes[k]) DIE("%s is truncated", j->a.ckpt);
        opt_unblob(j, k, b, h.opt_bytes[k]);
        free(b);
    }
    fclose(f);
    j->it = (long)h.it;
    j->seed = h.seed;
    j->sampler = h.sampler;
}

/* ------------------------------------------------- validation, sampling */

/* Mean loss over VAL_ROWS fixed windows spread over the validation text,
 * each rank taking every size-th window (outside any Join). */
static double val_loss(job_t *j)
{
    size_t T = (size_t)j->a.seq, span = j->text.nval - T - 1;
    double acc[2] = {0, 0};
    for (size_t w = (size_t)j->rank; w < VAL_ROWS; w += (size_t)j->size) {
        const int *src = j->text.val + span * w / VAL_ROWS;
        float loss;
        if (!nn_gpt_forward(j->g, src, src + 1, 1, T, &loss)) DIE("forward: %s", nn_last_error());
        acc[0] += loss;
        acc[1] += 1;
    }
    CHECK(tdist_all_reduce(j->pg, acc, acc, 2, TDIST_F64, TDIST_SUM, NULL, NULL));
    return acc[0] / acc[1];
}

/* n bytes after "\n", temperature 0.8, from the checkpointed sampler. */
static void sample(job_t *j, long n)
{
    size_t T = (size_t)j->a.seq;
    int *ctx = calloc(T, sizeof *ctx);
    char *outb = malloc((size_t)n + 1);
    if (!ctx || !outb) DIE("out of memory");
    size_t len = 1;
    ctx[0] = '\n';
    for (long i = 0; i < n; i++) {
        const float *logits = nn_gpt_forward(j->g, ctx, NULL, 1, len, NULL);
        if (!logits) DIE("forward: %s", nn_last_error());
        const float *z = logits + (len - 1) * VOCAB;
        double mx = z[0], sum = 0, pr[VOCAB];
        for (int v = 1; v < VOCAB; v++) mx = z[v] > mx ? z[v] : mx;
        for (int v = 0; v < VOCAB; v++) sum += pr[v] = exp((z[v] - mx) / 0.8);
        double u = (double)(mix(j->sampler++) >> 11) / 9007199254740992.0 * sum;
        int v = 0;
        while (v < VOCAB - 1 && (u -= pr[v]) > 0) v++;
        outb[i] = (char)(v == '\n' || v == '\t' || (v >= 32 && v < 127) ? v : '?');
        if (len == T) memmove(ctx, ctx + 1, (T - 1) * sizeof *ctx);
        else len++;
        ctx[len - 1] = v;
    }
    outb[n] = '\0';
    printf("sample (%ld bytes, temperature 0.8):\n%s\n", n, outb);
    free(ctx);
    free(outb);
}

/* -------------------------------------------------------------- progress */

typedef struct progress {
    bool bar;
    double t0, tokens, last_t;
    long first_it;
} progress_t;

static void show(job_t *j, progress_t *pr, long it, double loss, double lr)
{
    double t = now_s(), el = t - pr->t0;
    long done = it - pr->first_it, left = j->a.steps - it;
    bool last = it == j->a.steps;
    if (!pr->bar && it % j->a.log_every != 0 && !last) return;
    if (pr->bar && t - pr->last_t < 0.2 && !last) return;
    pr->last_t = t;
    tdist_ddp_stats_t ds = {0};
    if (j->ddp) CHECK(tdist_ddp_get_stats(j->ddp, &ds));
    double eta = done > 0 ? el / (double)done * (double)left : 0, tps = el > 0 ? pr->tokens / el : 0;
    if (pr->bar) {
        int w = 24, fill = (int)(w * it / j->a.steps);
        char bar[32];
        for (int i = 0; i < w; i++) bar[i] = i < fill ? '#' : '.';
        bar[w] = '\0';
        printf("\r[%s] it %ld/%ld  loss %.4f  %.0f tok/s  comm hidden %3.0f%%  ETA %3.0f s ", bar,
               it, j->a.steps, loss, tps, 100 * ds.overlap_fraction, eta);
        if (last) printf("\n");
        fflush(stdout);
    } else {
        printf("it %ld/%ld loss %.6f lr %.2e %.0f tok/s comm hidden %.0f%% ETA %.0f s\n", it,
               j->a.steps, loss, lr, tps, 100 * ds.overlap_fraction, eta);
    }
}

/* ------------------------------------------------------------ training */

/* One iteration on this rank (its batch for iteration `it`); returns the
 * job's mean loss over the ranks active in it, and how many were. DiLoCo
 * communicates only when it synchronises (no DDP, and Join is notified
 * only then): there the loss is this rank's own, and the number of ranks
 * active comes from the shards' schedule. */
static double train_step(job_t *j, long it, double lr, double *active)
{
    size_t B = (size_t)j->a.batch, T = (size_t)j->a.seq;
    set_lr(j, lr);
    make_batch(j, it);
    if (j->ddp) CHECK(tdist_ddp_forward_begin(j->ddp));
    nn_gpt_zero_grad(j->g);
    float loss;
    if (!nn_gpt_forward(j->g, j->tok, j->tgt, B, T, &loss)) DIE("forward: %s", nn_last_error());
    /* ranks that have run out add zeros (Join's rule for any collective) */
    double st[2] = {loss, 1};
    if (j->ddp) {
        CHECK(tdist_all_reduce(j->pg, st, st, 2, TDIST_F64, TDIST_SUM, NULL, NULL));
    } else {
        long R = j->a.round, k = it / R, len = R < j->a.steps - k * R ? R : j->a.steps - k * R;
        st[1] = 0;
        for (int r = 0; r < j->size; r++) st[1] += batches_in_round(len, r, j->size) > it - k * R;
        st[0] = loss * st[1];
    }
    if (nn_gpt_backward(j->g) != 0) DIE("backward: %s", nn_last_error());
    CHECK(j->hook_st);
    if (j->ddp) CHECK(tdist_ddp_backward_end(j->ddp));
    nn_clip_grad_norm(j->params, j->np, 1.0);
    optim_step(j);
    *active = st[1];
    return st[0] / st[1];
}

/* One Join over iterations [j->it, end) of round k: this rank's batches
 * (those of the round it takes that fall before end), then shadowing until
 * every rank is at end. */
static void run_span(job_t *j, long k, long end, tdist_joinable_t *jn, size_t njn, progress_t *pr)
{
    long R = j->a.round, len = R < j->a.steps - k * R ? R : j->a.steps - k * R;
    long mine = batches_in_round(len, j->rank, j->size);
    bool ckpt_here = j->a.mode != MODE_ZERO; /* ZeRO's is written after the Join */
    tdist_join_t *join;
    CHECK(tdist_join_begin(jn, njn, NULL, &join));
    for (long s = j->it - k * R; s < mine && k * R + s < end; s++) {
        long it = k * R + s;
        double lr = lr_at(j, it), active, loss = train_step(j, it, lr, &active);
        j->it = it + 1;
        pr->tokens += active * (double)(j->a.batch * j->a.seq);
        if (ckpt_here && ((j->a.ckpt_every && j->it % j->a.ckpt_every == 0) ||
                          j->it == j->a.stop_after)) {
            tdist_join_state_t st;
            CHECK(tdist_join_get_state(join, &st));
            if (st.lowest_active == j->rank) { /* it stepped in every iteration */
                ckpt_save(j);
                printf("checkpoint: iteration %ld written to %s by rank %d (%d ranks active)\n",
                       j->it, j->a.ckpt, j->rank, st.active);
            }
        }
        if (j->rank == j->size - 1) show(j, pr, j->it, loss, lr);
    }
    CHECK(tdist_join_end(join)); /* the last joiner's parameters (and optimizer state) */
    j->it = end;
}

/* Round k: one Join (run_span) up to the round's end, or up to
 * --stop-after inside it. With --zero a checkpoint due inside the round
 * also ends a Join there: writing it gathers every rank's shard, which
 * needs every rank out of the Join. Returns false when --stop-after ended
 * the run. */
static bool run_round(job_t *j, long k, tdist_joinable_t *jn, size_t njn, progress_t *pr)
{
    long R = j->a.round, len = R < j->a.steps - k * R ? R : j->a.steps - k * R;
    while (j->it < k * R + len) {
        long end = k * R + len, ce = j->a.ckpt_every;
        if (j->a.stop_after > j->it && j->a.stop_after < end) end = j->a.stop_after;
        if (j->a.mode == MODE_ZERO && ce && (j->it / ce + 1) * ce < end) end = (j->it / ce + 1) * ce;
        run_span(j, k, end, jn, njn, pr);
        if (j->a.mode == MODE_ZERO && ((ce && j->it % ce == 0) || j->it == j->a.stop_after)) {
            ckpt_save(j);
            if (j->rank == 0)
                printf("checkpoint: iteration %ld written to %s by rank 0 (ZeRO: the %d ranks' "
                       "shards gathered)\n", j->it, j->a.ckpt, j->size);
        }
        if (j->it == j->a.stop_after) return false;
    }
    return true;
}

/* Build the model, DDP, the hook and the optimizers; resume if asked. */
static void setup(job_t *j)
{
    const args_t *a = &j->a;
    nn_gpt_config_t cfg = {.vocab = VOCAB, .max_seq = (size_t)a->seq, .n_layer = (size_t)a->layers,
                           .n_head = (size_t)a->heads, .n_embd = (size_t)a->embd};
    nn_act_mode_t mode = a->recompute ? NN_ACT_RECOMPUTE : a->offload ? NN_ACT_OFFLOAD_BF16
                                                                       : NN_ACT_KEEP;
    j->g = nn_gpt_create(&cfg, (size_t)a->batch, mode, 1337);
    if (!j->g) DIE("model: %s", nn_last_error());
    j->params = nn_gpt_params(j->g, &j->np);
    j->tok = malloc((size_t)(a->batch * a->seq) * sizeof *j->tok);
    j->tgt = malloc((size_t)(a->batch * a->seq) * sizeof *j->tgt);
    tdist_ddp_param_t *dp = calloc(j->np, sizeof *dp);
    if (!j->tok || !j->tgt || !dp) DIE("out of memory");
    make_optimizers(j);
    j->seed = 0x5eed;
    j->sampler = 42;
    if (a->resume) ckpt_load(j); /* every rank reads the same file */
    for (size_t i = 0; i < j->np; i++)
        dp[i] = (tdist_ddp_param_t){j->params[i].data, j->params[i].grad, j->params[i].count,
                                    TDIST_F32, j->params[i].name};
    if (a->mode == MODE_DILOCO) { /* no DDP: start from rank 0's parameters */
        size_t pc;
        float *flat = nn_gpt_flat_params(j->g, &pc);
        CHECK(tdist_broadcast(j->pg, flat, pc, TDIST_F32, 0, NULL, NULL));
    } else {
        tdist_ddp_opts_t o;
        tdist_ddp_opts_init(&o);
        CHECK(tdist_ddp_create(j->pg, dp, j->np, NULL, 0, &o, &j->ddp));
        hook_setup(j);
        nn_gpt_set_grad_ready_hook(j->g, on_grad_ready, j);
    }
    free(dp);
    averaging_setup(j);
}

/* The uneven shards: rank r's share of the training text grows with r + 2. */
static void shard(job_t *j)
{
    size_t n = j->text.ntrain, wsum = 0, lo = 0;
    for (int r = 0; r < j->size; r++) wsum += (size_t)r + 2;
    for (int r = 0; r < j->rank; r++) lo += (size_t)r + 2;
    j->shard_lo = n * lo / wsum;
    j->shard_n = n * (lo + (size_t)j->rank + 2) / wsum - j->shard_lo;
    if (j->shard_n < (size_t)j->a.seq + 2) DIE("shard of %zu bytes is too small", j->shard_n);
}

static void report_start(job_t *j, double unigram)
{
    printf("train_gpt: rank %d of %d: shard of %zu training bytes, %ld of every %ld iterations\n",
           j->rank, j->size, j->shard_n, batches_in_round(j->a.round, j->rank, j->size),
           j->a.round);
    if (j->rank != 0) return;
    size_t pc;
    nn_gpt_flat_params(j->g, &pc);
    printf("train_gpt: %d ranks; %zu training / %zu validation bytes; GPT %ld layers, %ld heads, "
           "%ld channels, context %ld: %zu parameters; batch %ld x %ld per rank; %ld iterations "
           "in rounds of %ld (one Join each); hook %s\n",
           j->size, j->text.ntrain, j->text.nval, j->a.layers, j->a.heads, j->a.embd, j->a.seq,
           pc, j->a.batch, j->a.seq, j->a.steps, j->a.round, j->a.hook);
    if (j->a.mode == MODE_ZERO)
        printf("zero: AdamW state sharded over %d ranks (whole parameters per rank, two ZeRO "
               "objects: decayed, not decayed): %zu of %zu parameters' state on rank 0\n",
               j->size, tdist_zero_rank_elems(j->zero[0], 0) + tdist_zero_rank_elems(j->zero[1], 0),
               pc);
    if (j->a.mode == MODE_LOCAL_SGD)
        printf("local-sgd: gradients averaged for the first %ld iterations, then the parameters "
               "every %ld steps\n", j->a.round, j->a.period);
    if (j->a.mode == MODE_DILOCO)
        printf("diloco: %ld inner AdamW steps per outer Nesterov step (lr 0.7, momentum 0.9), "
               "pseudo-gradient as %s\n", j->a.period, tdist_dtype_name(j->a.wire));
    printf("activations: %.1f MB held (%s; keeping all in f32: %.1f MB)\n",
           (double)nn_gpt_activation_bytes(j->g) / 1e6,
           j->a.recompute ? "--checkpoint-activations" : j->a.offload ? "--offload bf16" : "all kept",
           (double)nn_gpt_activation_bytes_keep(j->g) / 1e6);
    printf("unigram baseline: val_loss=%.4f nats/byte\n", unigram);
    if (j->it) printf("resumed from %s at iteration %ld\n", j->a.ckpt, j->it);
}

/* Bytes of gradient, parameters or pseudo-gradient this rank (0) put
 * into the collectives per iteration of its own: DDP's measured bucket
 * bytes (after the hook); with --zero plus the parameters synchronised
 * from their owners after every step (the whole model, f32, by
 * broadcast); local SGD: the f32 gradients while DDP averaged them and the
 * f32 parameters at every averaging step; DiLoCo: the measured
 * pseudo-gradient bytes. The per-step loss (16 bytes) is left out. */
static double comm_bytes_per_iter(const job_t *j, const tdist_ddp_stats_t *ds, double f32)
{
    double ddp = ds->iterations ? (double)ds->bytes_reduced / (double)ds->iterations : 0;
    if (j->a.mode == MODE_DDP) return ddp;
    if (j->a.mode == MODE_ZERO) return ddp + f32;
    if (j->a.mode == MODE_LOCAL_SGD) {
        int64_t grad_iters = 0, steps = tdist_averager_step(j->avg[0]), averages = 0;
        CHECK(tdist_post_local_iter(j->plh, &grad_iters));
        for (int64_t s = 0; s < steps; s++) averages += tdist_averager_group_size_at(j->avg[0], s) > 0;
        return steps ? f32 * (double)(grad_iters + averages) / (double)steps : 0;
    }
    double wire = 0;
    for (int k = 0; k < 2; k++) {
        tdist_diloco_stats_t s;
        CHECK(tdist_diloco_get_stats(j->dl[k], &s));
        wire += (double)s.wire_bytes;
    }
    return wire / (double)j->a.steps;
}

static bool finish(job_t *j, double unigram, double vl)
{
    size_t pc;
    const float *flat = nn_gpt_flat_params(j->g, &pc);
    uint64_t mine = hash_floats(flat, pc);
    uint64_t *all = calloc((size_t)j->size, sizeof *all);
    if (!all) DIE("out of memory");
    CHECK(tdist_all_gather(j->pg, &mine, all, 1, TDIST_I64, NULL, NULL));
    bool same = true;
    for (int r = 0; r < j->size; r++) same = same && all[r] == all[0];
    free(all);
    if (j->rank != 0) return same;
    tdist_ddp_stats_t ds = {0};
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    if (j->ddp) {
        CHECK(tdist_ddp_get_stats(j->ddp, &ds));
        printf("ddp (rank 0): %llu iterations of its own, %llu buckets, %.1f MB reduced, %.0f%% "
               "of communication hidden behind backward; peak RSS: %.1f MB\n",
               (unsigned long long)ds.iterations, (unsigned long long)ds.num_buckets,
               (double)ds.bytes_reduced / 1e6, 100.0 * ds.overlap_fraction,
               (double)ru.ru_maxrss / 1e3);
    }
    double f32 = 4.0 * (double)pc;
    printf("comm (rank 0): %.0f bytes into the collectives per iteration (%.3f of DDP's f32 "
           "gradients, %.0f): %s\n", comm_bytes_per_iter(j, &ds, f32),
           comm_bytes_per_iter(j, &ds, f32) / f32, f32,
           j->a.mode == MODE_DDP       ? "DDP's buckets"
           : j->a.mode == MODE_ZERO     ? "DDP's buckets, then every parameter from its owner"
           : j->a.mode == MODE_LOCAL_SGD ? "gradients in the first round, then the averaged "
                                           "parameters"
                                         : "the pseudo-gradients at the synchronisations");
    if (j->a.sample > 0) sample(j, j->a.sample);
    printf("final val_loss=%.4f unigram=%.4f params_hash=%016llx params_identical=%s\n", vl,
           unigram, (unsigned long long)mine, same ? "yes" : "no");
    return same;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    static job_t j;
    parse_args(argc, argv, &j.a);
    tdist_world_t *world;
    CHECK(tdist_init("env://", NULL, &world));
    j.rank = example_rank = tdist_world_rank(world);
    j.size = tdist_world_size(world);
    CHECK(tdist_pg_create_world(world, NULL, &j.pg));
    nn_set_num_threads(1); /* one BLAS thread per rank: the ranks share the cores */
    if (j.a.stop_after > j.a.steps) j.a.stop_after = -1;

    load_text(j.a.corpus, &j.text);
    shard(&j);
    setup(&j);
    double unigram = unigram_baseline(&j.text);
    report_start(&j, unigram);

    tdist_joinable_t jn[3];
    size_t njn = joinables(&j, jn);
    const char *pe = getenv("TDIST_PROGRESS");
    progress_t pr = {.bar = (pe && strcmp(pe, "bar") == 0) || (!pe && isatty(1)), .t0 = now_s(),
                     .first_it = j.it};
    double vl = val_loss(&j);
    if (j.rank == 0) printf("val_loss at iteration %ld: %.4f\n", j.it, vl);
    for (long k = j.it / j.a.round; j.it < j.a.steps; k++) {
        if (!run_round(&j, k, jn, njn, &pr)) {
            if (j.rank == 0) printf("stopped after iteration %ld (checkpoint %s)\n", j.it, j.a.ckpt);
            return 0;
        }
        vl = val_loss(&j);
        if (j.rank == 0) {
            if (pr.bar) printf("\n");
            printf("val_loss at iteration %ld: %.4f (unigram %.4f)\n", j.it, vl, unigram);
        }
    }
    bool same = finish(&j, unigram, vl);
    tdist_ddp_destroy(j.ddp);
    tdist_compress_destroy(j.comp);
    tdist_powersgd_destroy(j.psgd);
    tdist_int8_destroy(j.q);
    for (int k = 0; k < 2; k++) {
        tdist_post_local_optim_destroy(j.plo[k]);
        tdist_averager_destroy(j.avg[k]);
        tdist_diloco_destroy(j.dl[k]);
        tdist_zero_destroy(j.zero[k]);
        tdist_optim_destroy(j.opt[k]);
        free(j.op[k]);
    }
    tdist_post_local_destroy(j.plh);
    nn_gpt_destroy(j.g);
    free(j.rows), free(j.tok), free(j.tgt), free(j.text.train), free(j.text.val);
    tdist_pg_destroy(j.pg);
    tdist_world_destroy(world);
    return same ? 0 : 3;
}
