/*
 * bench/fr_cost.c — what the flight recorder costs an 8-byte all_reduce:
 * the same processes, two world groups, one recording (the default) and
 * one with its recorder off, timed in interleaved blocks.
 *
 *   tdistrun --nproc-per-node 2 bench_fr_cost [CALLS] [ROUNDS]   (defaults 20000, 21)
 *
 * Each round times CALLS all_reduces (2 x f32, sum) on one group, then
 * CALLS on the other (which goes first alternates by round), after a
 * barrier on each. Figures are per call: the median over ROUNDS, on rank 0,
 * for each group; the cost is their difference. The minima (the fastest
 * blocks of each) are printed too: on a loaded machine they move less. Every loop is bounded in
 * count; every call has the group's deadline.
 */
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>

#include "core/internal.h" /* tdist__now_ns */
#include "fr/fr.h"
#include "tdist/tdist.h"

static int cmp_double(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

/* ns per call of calls 8-byte all_reduces on pg; < 0 on failure. */
static double block(tdist_pg_t *pg, long calls)
{
    float x[2] = {1, 2};
    if (tdist_barrier(pg, NULL, NULL) != TDIST_OK) return -1;
    uint64_t t0 = tdist__now_ns();
    for (long i = 0; i < calls; i++) {
        x[0] = x[1] = 1;
        if (tdist_all_reduce(pg, x, x, 2, TDIST_F32, TDIST_SUM, NULL, NULL) != TDIST_OK) return -1;
    }
    return (double)(tdist__now_ns() - t0) / (double)calls;
}

static int fail(const char *what)
{
    fprintf(stderr, "bench_fr_cost: %s: %s\n", what, tdist_last_error());
    return 1;
}

int main(int argc, char **argv)
{
    long calls = argc > 1 ? atol(argv[1]) : 20000;
    int rounds = argc > 2 ? atoi(argv[2]) : 21;
    if (calls < 1 || calls > 10000000 || rounds < 1 || rounds > 1000) {
        fprintf(stderr, "usage: bench_fr_cost [CALLS 1..1e7] [ROUNDS 1..1000]\n");
        return 2;
    }
    tdist_world_t *w = NULL;
    tdist_pg_t *on = NULL, *off = NULL;
    if (tdist_init("env://", NULL, &w) != TDIST_OK) return fail("tdist_init (run under tdistrun)");
    if (tdist_pg_create_world(w, NULL, &on) != TDIST_OK) return fail("world group");
    tdist__fr_enable(false);
    if (tdist_pg_create_world(w, NULL, &off) != TDIST_OK) return fail("second world group");
    tdist__fr_enable(true);
    double *t_on = calloc((size_t)rounds, sizeof *t_on), *t_off = calloc((size_t)rounds, sizeof *t_off);
    if (!t_on || !t_off) return fail("out of memory");
    (void)block(on, calls / 10 + 1); /* warm-up */
    (void)block(off, calls / 10 + 1);
    for (int r = 0; r < rounds; r++) {
        bool on_first = r % 2 == 0;
        double a = block(on_first ? on : off, calls), b = block(on_first ? off : on, calls);
        if (a < 0 || b < 0) return fail("all_reduce");
        t_on[r] = on_first ? a : b;
        t_off[r] = on_first ? b : a;
    }
    qsort(t_on, (size_t)rounds, sizeof *t_on, cmp_double);
    qsort(t_off, (size_t)rounds, sizeof *t_off, cmp_double);
    double m_on = t_on[rounds / 2], m_off = t_off[rounds / 2];
    if (tdist_world_rank(w) == 0) {
        printf("%ld calls x %d rounds, 2 ranks, 8-byte all_reduce (medians of interleaved blocks)\n",
               calls, rounds);
        printf("RESULT fr_on_ns %.1f ns\n", m_on);
        printf("RESULT fr_off_ns %.1f ns\n", m_off);
        printf("RESULT fr_cost_ns %.1f ns\n", m_on - m_off);
        printf("RESULT fr_cost_pct %.2f %%\n", 100.0 * (m_on - m_off) / m_off);
        /* the fastest blocks: what the path costs when no other process
         * takes the CPUs (a loaded machine moves the medians) */
        printf("RESULT fr_on_min_ns %.1f ns\n", t_on[0]);
        printf("RESULT fr_off_min_ns %.1f ns\n", t_off[0]);
        printf("RESULT fr_cost_min_ns %.1f ns\n", t_on[0] - t_off[0]);
    }
    free(t_on);
    free(t_off);
    tdist_pg_destroy(off);
    tdist_pg_destroy(on);
    tdist_world_destroy(w);
    return 0;
}
