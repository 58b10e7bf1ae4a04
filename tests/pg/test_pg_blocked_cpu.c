/* tests/pg/test_pg_blocked_cpu.c — a rank blocked in a collective gives
 * its CPU away: after its short spin it sleeps, so while a peer is late it
 * uses under 10% of a CPU (all its threads together: the caller's and the
 * group's engine). Checked for a blocking all_reduce (the caller's thread
 * waits) and for an asynchronous one waited on with tdist_work_wait (the
 * engine thread waits), with 2 ranks and with 8 ranks on however many CPUs
 * there are (oversubscribed on a small machine). A loaded machine only
 * lowers what a waiting rank gets to use, so the bound holds under load. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "tdist/pg.h"

#define LATE_MS 1000     /* how long the last rank keeps the others waiting */
#define MAX_CPU_SHARE 0.10

static double process_cpu_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* One all_reduce the last rank joins LATE_MS late; the others check the
 * CPU they used while they waited. */
static void one_round(tdist_pg_t *pg, int rank, int n, bool async, float *buf, size_t count)
{
    for (size_t i = 0; i < count; i++) buf[i] = (float)(rank + 1);
    ASSERT_OK(tdist_barrier(pg, NULL, NULL));
    if (rank == n - 1) usleep(LATE_MS * 1000);
    double t0 = tdist_test_now_ms(), c0 = process_cpu_ms();
    if (async) {
        tdist_work_t *w = NULL;
        ASSERT_OK(tdist_all_reduce(pg, buf, buf, count, TDIST_F32, TDIST_SUM, NULL, &w));
        ASSERT_OK(tdist_work_wait(w, -1));
        tdist_work_free(w);
    } else {
        ASSERT_OK(tdist_all_reduce(pg, buf, buf, count, TDIST_F32, TDIST_SUM, NULL, NULL));
    }
    double wall = tdist_test_now_ms() - t0, cpu = process_cpu_ms() - c0;
    for (size_t i = 0; i < count; i++) ASSERT_EQ(buf[i], n * (n + 1) / 2);
    if (rank == n - 1) return;
    /* the late rank's sleep is what the others waited for */
    ASSERT_GE(wall, LATE_MS / 2);
    fprintf(stderr, "rank %d/%d %s %zu floats: %.1f ms CPU in %.0f ms blocked (%.1f%%)\n", rank, n,
            async ? "async" : "blocking", count, cpu, wall, 100 * cpu / wall);
    if (cpu > MAX_CPU_SHARE * wall)
        FAIL("rank %d of %d used %.1f ms of CPU in %.0f ms blocked in a%s all_reduce of %zu floats "
             "(%.1f%% of a CPU; limit %.0f%%)", rank, n, cpu, wall, async ? "n async" : " blocking",
             count, 100 * cpu / wall, 100 * MAX_CPU_SHARE);
}

static void body(int rank, int n, void *arg)
{
    (void)arg;
    tdist_world_t *w;
    tdist_pg_t *pg;
    tdist_test_open_world(&w, &pg, (int64_t)(30000 * tdist_test_timeout_mult()));
    static const size_t counts[] = {2, 16384}; /* the tiny path and a staged / ring one */
    float *buf = malloc(16384 * sizeof(float));
    ASSERT_TRUE(buf != NULL);
    for (int c = 0; c < 2; c++) {
        one_round(pg, rank, n, false, buf, counts[c]);
        one_round(pg, rank, n, true, buf, counts[c]);
    }
    free(buf);
    tdist_pg_destroy(pg);
    tdist_world_destroy(w);
}

TEST(pg_blocked_rank_uses_little_cpu, 60) { tdist_test_run_ranks(2, body, NULL); }
TEST(pg_blocked_rank_uses_little_cpu_8_ranks, 90) { tdist_test_run_ranks(8, body, NULL); }
