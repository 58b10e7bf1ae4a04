/*
 * bench/optim_step.c — time of one optimizer step over a large flat buffer,
 * one thread, for each update rule of optim/.
 *
 *   bench_optim_step [-n ELEMENTS] [-r REPEATS] [--plain]
 *
 * --plain runs the loops compiled without the AVX2 + FMA target (what a CPU
 * without FMA runs: fmaf is then a C library call per element).
 *
 * Defaults: 16,777,216 elements (64 MiB of parameters), 20 timed steps after
 * 2 warm-up steps, each rule on its own optimizer. Prints, per rule, the
 * median step time and the bandwidth it implies over the bytes the step
 * must read and write (param, grad and state, 4 bytes each):
 *   RESULT optim_<rule>_step_ms <ms> ms
 *   RESULT optim_<rule>_gbps <GB/s> GB/s
 * Rules: sgd (no momentum), sgd_momentum, sgd_nesterov_wd, adam, adamw,
 * adam_amsgrad. Every loop is bounded by the repeat count.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "optim/internal.h"
#include "tdist/optim.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

typedef struct rule {
    const char *name;
    int kind;       /* tdist_optim_kind_t */
    double momentum, weight_decay;
    int nesterov, amsgrad;
    int streams;    /* float arrays read or written per element */
} rule_t;

static const rule_t rules[] = {
    {"sgd", TDIST_OPTIM_SGD, 0.0, 0.0, 0, 0, 3},
    {"sgd_momentum", TDIST_OPTIM_SGD, 0.9, 0.0, 0, 0, 5},
    {"sgd_nesterov_wd", TDIST_OPTIM_SGD, 0.9, 1e-4, 1, 0, 5},
    {"adam", TDIST_OPTIM_ADAM, 0.0, 0.0, 0, 0, 7},
    {"adamw", TDIST_OPTIM_ADAMW, 0.0, 1e-2, 0, 0, 7},
    {"adam_amsgrad", TDIST_OPTIM_ADAM, 0.0, 0.0, 0, 1, 9},
};

static tdist_optim_t *make(const rule_t *r, tdist_optim_param_t *prm)
{
    tdist_optim_t *opt = NULL;
    tdist_status_t st;
    if (r->kind == TDIST_OPTIM_SGD) {
        tdist_optim_sgd_opts_t o;
        tdist_optim_sgd_opts_init(&o);
        o.lr = 1e-3;
        o.momentum = r->momentum;
        o.weight_decay = r->weight_decay;
        o.nesterov = r->nesterov != 0;
        st = tdist_optim_create_sgd(prm, 1, &o, &opt);
    } else {
        tdist_optim_adam_opts_t o;
        tdist_optim_adam_opts_init(&o);
        o.weight_decay = r->weight_decay;
        o.amsgrad = r->amsgrad != 0;
        st = r->kind == TDIST_OPTIM_ADAM ? tdist_optim_create_adam(prm, 1, &o, &opt)
                                         : tdist_optim_create_adamw(prm, 1, &o, &opt);
    }
    if (st != TDIST_OK) {
        fprintf(stderr, "create %s: %s\n", r->name, tdist_last_error());
        return NULL;
    }
    return opt;
}

int main(int argc, char **argv)
{
    size_t n = (size_t)1 << 24;
    int reps = 20;
    int plain = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--plain") == 0) plain = 1;
        else if (i + 1 < argc && strcmp(argv[i], "-n") == 0) n = (size_t)strtoull(argv[++i], NULL, 10);
        else if (i + 1 < argc && strcmp(argv[i], "-r") == 0) reps = atoi(argv[++i]);
        else reps = -1;
    }
    if (n == 0 || reps < 1 || reps > 1000) {
        fprintf(stderr, "usage: bench_optim_step [-n ELEMENTS] [-r REPEATS (1..1000)] [--plain]\n");
        return 2;
    }
    int fma = tdist__optim_use_fma(!plain);
    float *p = malloc(n * sizeof *p), *g = malloc(n * sizeof *g);
    double *t = malloc((size_t)reps * sizeof *t);
    if (!p || !g || !t) return 1;
    for (size_t i = 0; i < n; i++) {
        p[i] = 0.01f * (float)(i % 97) - 0.5f;
        g[i] = 0.001f * (float)(i % 89) - 0.04f;
    }
    tdist_optim_param_t prm = {.param = p, .grad = g, .count = n, .name = "flat"};
    printf("elements %zu, %d timed steps per rule, one thread, %s loops\n", n, reps,
           fma ? "AVX2 + FMA" : "plain");
    for (size_t k = 0; k < sizeof rules / sizeof rules[0]; k++) {
        const rule_t *r = &rules[k];
        tdist_optim_t *opt = make(r, &prm);
        if (!opt) return 1;
        for (int w = 0; w < 2; w++) tdist_optim_step(opt);
        for (int i = 0; i < reps; i++) {
            double t0 = now_s();
            tdist_optim_step(opt);
            t[i] = now_s() - t0;
        }
        qsort(t, (size_t)reps, sizeof *t, cmp_double);
        double med = t[reps / 2];
        double gbps = (double)r->streams * 4.0 * (double)n / med / 1e9;
        printf("RESULT optim_%s_step_ms %.3f ms\n", r->name, med * 1e3);
        printf("RESULT optim_%s_gbps %.2f GB/s\n", r->name, gbps);
        tdist_optim_destroy(opt);
    }
    free(p);
    free(g);
    free(t);
    return 0;
}
