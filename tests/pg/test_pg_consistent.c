/* tests/pg/test_pg_consistent.c — one story on every rank: a collective
 * that one rank reports failed fails on every rank of the group, at the
 * latest on that rank's next call on the group, and the error names the
 * group and the sequence number. The case that broke it: blocking
 * collectives on two groups issued in opposite orders (rank 0: A then B;
 * rank 1: B then A), where rank 0's A timed out while rank 1's A, issued
 * after its own B had timed out, found rank 0's contribution waiting and
 * returned a sum. Blocking and with work handles, on both transports (the
 * __tcp twins). */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

#include "harness.h"
#include "tdist/pg.h"

#define T_MS 1500

typedef struct outcome {
    int st[2][2];       /* [group A/B][first call, next call] */
    char msg[2][2][400];
    int64_t took_ms;
} outcome_t;

static outcome_t *g_out; /* shared between the rank processes */

static tdist_status_t call(tdist_pg_t *pg, bool handle, float *buf, char *msg, size_t n)
{
    tdist_status_t st;
    if (handle) {
        tdist_work_t *wk = NULL;
        st = tdist_all_reduce(pg, buf, buf, 4, TDIST_F32, TDIST_SUM, NULL, &wk);
        if (st == TDIST_OK) {
            st = tdist_work_wait(wk, -1);
            tdist_work_free(wk);
        }
    } else {
        st = tdist_all_reduce(pg, buf, buf, 4, TDIST_F32, TDIST_SUM, NULL, NULL);
    }
    snprintf(msg, n, "%s", st == TDIST_OK ? "" : tdist_last_error());
    return st;
}

static void body(int rank, int n, void *arg)
{
    (void)n;
    bool handle = *(const bool *)arg;
    tdist_world_t *w;
    ASSERT_OK(tdist_init("env://", NULL, &w));
    tdist_pg_opts_t o;
    tdist_pg_opts_init(&o);
    o.timeout_ms = T_MS;
    tdist_pg_t *world = NULL, *g[2] = {NULL, NULL};
    ASSERT_OK(tdist_pg_create_world(w, &o, &world));
    int both[2] = {0, 1};
    o.name = "A";
    ASSERT_OK(tdist_pg_new_group(world, both, 2, &o, &g[0]));
    o.name = "B";
    ASSERT_OK(tdist_pg_new_group(world, both, 2, &o, &g[1]));
    ASSERT_OK(tdist_barrier(world, NULL, NULL));
    outcome_t *out = &g_out[rank];
    int64_t t0 = tdist_test_now_ms();
    float buf[4] = {1, 2, 3, 4};
    /* first calls in opposite orders: both ranks wait for the other */
    for (int k = 0; k < 2; k++) {
        int x = rank == 0 ? k : 1 - k;
        out->st[x][0] = call(g[x], handle, buf, out->msg[x][0], sizeof out->msg[x][0]);
    }
    /* next calls, in one order */
    for (int x = 0; x < 2; x++)
        out->st[x][1] = call(g[x], handle, buf, out->msg[x][1], sizeof out->msg[x][1]);
    out->took_ms = tdist_test_now_ms() - t0;
    tdist_pg_destroy(g[0]);
    tdist_pg_destroy(g[1]);
    tdist_pg_destroy(world);
    tdist_world_destroy(w);
}

static void run(bool handle)
{
    g_out = mmap(NULL, 2 * sizeof *g_out, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1,
                 0);
    if (g_out == MAP_FAILED) FAIL("mmap: %s", strerror(errno));
    memset(g_out, 0, 2 * sizeof *g_out);
    tdist_test_run_ranks(2, body, &handle);
    const char *names[2] = {"A", "B"};
    for (int x = 0; x < 2; x++) {
        bool any_failed = g_out[0].st[x][0] != TDIST_OK || g_out[1].st[x][0] != TDIST_OK;
        for (int r = 0; r < 2; r++) {
            const outcome_t *o = &g_out[r];
            fprintf(stderr, "rank %d group %s: first %d (%s), next %d (%s)\n", r, names[x],
                    o->st[x][0], o->msg[x][0], o->st[x][1], o->msg[x][1]);
            if (!any_failed) continue;
            /* this rank's first call failed too, or its next call does */
            ASSERT_TRUE(o->st[x][0] != TDIST_OK || o->st[x][1] != TDIST_OK);
            int k = o->st[x][0] != TDIST_OK ? 0 : 1;
            char want[32];
            snprintf(want, sizeof want, "group %s seq", names[x]);
            ASSERT_CONTAINS(o->msg[x][k], want);
        }
    }
    /* two timeouts at most, and the rest fails fast */
    for (int r = 0; r < 2; r++) ASSERT_TRUE(g_out[r].took_ms < 2 * T_MS + 2000);
    munmap(g_out, 2 * sizeof *g_out);
}

TEST(pg_opposite_order_one_story_blocking, 40) { run(false); }
TEST(pg_opposite_order_one_story_work_handles, 40) { run(true); }
