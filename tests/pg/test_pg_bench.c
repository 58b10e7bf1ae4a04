/* tests/pg/test_pg_bench.c — a measurement, not a test (TEST_HIDDEN: ctest
 * does not run it): the time of an 8-byte all_reduce (2 f32... 1 f32 = 4 B
 * of payload, 8 B with 2 f32) on 2 ranks through the public API, to show
 * what the fingerprint exchange costs. Run in a Release build:
 *   tdist_tests pg_bench_all_reduce_8b                       (checked)
 *   TDIST_CHECK_FINGERPRINT=0 tdist_tests pg_bench_all_reduce_8b
 *   PG_BENCH_OP=broadcast ...   (a collective without the fused path)
 *   PG_BENCH_OP=broadcast ...   (a collective without the fused path)
 * Prints RESULT lines (median of 7 runs of 2000 calls). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "tdist/pg.h"

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void bench_body(int rank, int n, void *arg)
{
    (void)n;
    (void)arg;
    tdist_world_t *w;
    ASSERT_OK(tdist_init("env://", NULL, &w));
    tdist_pg_t *pg = NULL;
    ASSERT_OK(tdist_pg_create_world(w, NULL, &pg));
    float in[2] = {1, 2}, out[2];
    const char *opn = getenv("PG_BENCH_OP"); /* all_reduce (default) or broadcast */
    bool bc = opn && strcmp(opn, "broadcast") == 0;
    enum { RUNS = 7, ITERS = 2000 };
    double us[RUNS];
    for (int i = 0; i < 200; i++)
        ASSERT_OK(bc ? tdist_broadcast(pg, in, 2, TDIST_F32, 0, NULL, NULL)
                     : tdist_all_reduce(pg, in, out, 2, TDIST_F32, TDIST_SUM, NULL, NULL));
    for (int r = 0; r < RUNS; r++) {
        double t0 = tdist_test_now_ms();
        for (int i = 0; i < ITERS; i++)
            ASSERT_OK(bc ? tdist_broadcast(pg, in, 2, TDIST_F32, 0, NULL, NULL)
                         : tdist_all_reduce(pg, in, out, 2, TDIST_F32, TDIST_SUM, NULL, NULL));
        us[r] = (tdist_test_now_ms() - t0) * 1000.0 / ITERS;
    }
    qsort(us, RUNS, sizeof us[0], cmp_d);
    if (rank == 0) {
        const char *e = getenv("TDIST_CHECK_FINGERPRINT");
        printf("RESULT pg_%s_8b_2ranks_%s %.2f us\n", bc ? "broadcast" : "all_reduce",
               e && e[0] == '0' ? "unchecked" : "checked", us[RUNS / 2]);
        fflush(stdout);
    }
    tdist_pg_destroy(pg);
    tdist_world_destroy(w);
}

TEST_HIDDEN(pg_bench_all_reduce_8b, 120) { tdist_test_run_ranks(2, bench_body, NULL); }
