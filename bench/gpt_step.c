/*
 * bench/gpt_step.c — tokens per second of the main job's GPT training step
 * (nn_gpt_t: forward, cross-entropy, backward, DDP, clipping at norm 1,
 * AdamW), alone (--mode local) or with tdist's DDP (--mode ddp), on the
 * ranks tdistrun starts. bench/compare/gpt.sh runs it beside the same model
 * in PyTorch (bench/compare/gpt_torch.py).
 *
 *   tdistrun --nproc-per-node 2 bench_gpt_step --mode ddp [-n 20] [-w 3]
 *            [--batch 8 --seq 64 --layers 4 --embd 128 --heads 4]
 *
 * Data: random byte tokens, seeded per rank. Timing: each rank's wall
 * time over the timed steps, the slowest rank's (all_reduce MAX); tokens
 * per second = world x batch x seq x steps / that time. Rank 0 prints
 *   ROW tdist <mode> <world> <tokens_per_s> <ms_per_step> <overlap>
 * (overlap: DDP's share of communication hidden behind backward; local: -).
 */
#define _POSIX_C_SOURCE 200809L

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <tdist/nn.h>
#include <tdist/tdist.h>

#define DIE(...)                                                                                   \
    do {                                                                                           \
        fprintf(stderr, "bench_gpt_step: " __VA_ARGS__);                                          \
        fputc('\n', stderr);                                                                       \
        exit(1);                                                                                   \
    } while (0)
#define CHECK(c)                                                                                   \
    do {                                                                                           \
        tdist_status_t s_ = (c);                                                                   \
        if (s_ != TDIST_OK) DIE("%s: %s", #c, tdist_last_error());                                 \
    } while (0)

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef struct ctx {
    tdist_ddp_t *ddp;
    tdist_status_t st;
} ctx_t;

static void on_ready(void *arg, size_t i)
{
    ctx_t *c = arg;
    if (c->ddp && c->st == TDIST_OK) c->st = tdist_ddp_grad_ready(c->ddp, i);
}

int main(int argc, char **argv)
{
    long steps = 20, warm = 3, B = 8, T = 64, L = 4, C = 128, H = 4;
    int ddp_mode = -1;
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        long *dst = !strcmp(s, "-n") ? &steps : !strcmp(s, "-w") ? &warm
                  : !strcmp(s, "--batch") ? &B : !strcmp(s, "--seq") ? &T
                  : !strcmp(s, "--layers") ? &L : !strcmp(s, "--embd") ? &C
                  : !strcmp(s, "--heads") ? &H : NULL;
        if (!strcmp(s, "--mode") && v) {
            ddp_mode = !strcmp(v, "ddp") ? 1 : !strcmp(v, "local") ? 0 : -1;
            i++;
        } else if (dst && v && atol(v) > 0 && atol(v) <= 100000) {
            *dst = atol(v);
            i++;
        } else {
            ddp_mode = -1;
            break;
        }
    }
    if (ddp_mode < 0) {
        fprintf(stderr, "usage: bench_gpt_step --mode local|ddp [-n STEPS] [-w WARMUP] [--batch B] "
                        "[--seq T] [--layers L] [--embd C] [--heads H]\n");
        return 2;
    }
    tdist_world_t *world;
    CHECK(tdist_init("env://", NULL, &world));
    int rank = tdist_world_rank(world), size = tdist_world_size(world);
    tdist_pg_t *pg;
    CHECK(tdist_pg_create_world(world, NULL, &pg));
    nn_set_num_threads(1);

    nn_gpt_config_t cfg = {256, (size_t)T, (size_t)L, (size_t)H, (size_t)C};
    nn_gpt_t *g = nn_gpt_create(&cfg, (size_t)B, NN_ACT_KEEP, 1337);
    if (!g) DIE("%s", nn_last_error());
    size_t np;
    nn_param_t *p = nn_gpt_params(g, &np);
    tdist_ddp_param_t *dp = calloc(np, sizeof *dp);
    tdist_optim_param_t *op[2] = {calloc(np, sizeof *op[0]), calloc(np, sizeof *op[1])};
    size_t n[2] = {0, 0};
    int *tok = malloc((size_t)(B * T) * sizeof *tok), *tgt = malloc((size_t)(B * T) * sizeof *tgt);
    if (!dp || !op[0] || !op[1] || !tok || !tgt) DIE("out of memory");
    for (size_t i = 0; i < np; i++) {
        dp[i] = (tdist_ddp_param_t){p[i].data, p[i].grad, p[i].count, TDIST_F32, p[i].name};
        int k = strstr(p[i].name, "bias") || strstr(p[i].name, "ln_") ? 1 : 0;
        op[k][n[k]++] = (tdist_optim_param_t){p[i].data, p[i].grad, p[i].count, p[i].name};
    }
    tdist_optim_t *opt[2];
    for (int k = 0; k < 2; k++) {
        tdist_optim_adam_opts_t o;
        tdist_optim_adamw_opts_init(&o);
        o.lr = 1e-3;
        o.beta2 = 0.95;
        o.weight_decay = k == 0 ? 0.1 : 0.0;
        CHECK(tdist_optim_create_adamw(op[k], n[k], &o, &opt[k]));
    }
    ctx_t c = {NULL, TDIST_OK};
    if (ddp_mode) CHECK(tdist_ddp_create(pg, dp, np, NULL, 0, NULL, &c.ddp));
    nn_gpt_set_grad_ready_hook(g, on_ready, &c);
    uint64_t s = 1000 + (uint64_t)rank;
    double t0 = 0;
    for (long it = 0; it < warm + steps; it++) {
        if (it == warm) t0 = now_s();
        for (long i = 0; i < B * T; i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            tok[i] = (int)(s >> 56);
            tgt[i] = (int)((s >> 48) & 255);
        }
        if (c.ddp) CHECK(tdist_ddp_forward_begin(c.ddp));
        nn_gpt_zero_grad(g);
        float loss;
        if (!nn_gpt_forward(g, tok, tgt, (size_t)B, (size_t)T, &loss)) DIE("%s", nn_last_error());
        if (nn_gpt_backward(g) != 0) DIE("%s", nn_last_error());
        CHECK(c.st);
        if (c.ddp) CHECK(tdist_ddp_backward_end(c.ddp));
        nn_clip_grad_norm(p, np, 1.0);
        for (int k = 0; k < 2; k++) CHECK(tdist_optim_step(opt[k]));
    }
    double el = now_s() - t0;
    CHECK(tdist_all_reduce(pg, &el, &el, 1, TDIST_F64, TDIST_MAX, NULL, NULL));
    if (rank == 0) {
        char ov[16] = "-";
        if (c.ddp) {
            tdist_ddp_stats_t ds;
            CHECK(tdist_ddp_get_stats(c.ddp, &ds));
            snprintf(ov, sizeof ov, "%.2f", ds.overlap_fraction);
        }
        printf("ROW tdist %s %d %.1f %.2f %s\n", ddp_mode ? "ddp" : "local", size,
               (double)size * (double)(B * T * steps) / el, 1e3 * el / (double)steps, ov);
    }
    tdist_ddp_destroy(c.ddp);
    for (int k = 0; k < 2; k++) tdist_optim_destroy(opt[k]), free(op[k]);
    free(dp), free(tok), free(tgt);
    nn_gpt_destroy(g);
    tdist_pg_destroy(pg);
    tdist_world_destroy(world);
    return 0;
}
