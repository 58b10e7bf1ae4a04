/* tests/join/test_join_fr.c — Join's notifications in the flight
 * recorder. DDP under Join on 2 ranks with uneven inputs (rank 0 has
 * ACTIVE0 iterations, rank 1 one): every notification a rank takes part
 * in is in its group's ring as a mark, "join_notify" while the rank is
 * active and "joined_notify" once it has joined, with the Join iteration
 * as its argument, before that iteration's bucket all_reduce (the joined
 * rank's shadow of it, marked "bucket_shadow", included); the timeline
 * (TDIST_TRACE) has them as events; tdist-fr finds both rings telling the
 * same story. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fr.h"
#include "harness.h"
#include "proc.h"
#include "tdist/ddp.h"
#include "tdist/join.h"
#include "tdist/pg.h"

#define COUNT 16
#define ACTIVE0 3 /* rank 0's iterations; rank 1 has one */

static void join_fr_body(int rank, int n, void *arg)
{
    (void)n;
    (void)arg;
    tdist_world_t *w;
    tdist_pg_t *pg;
    tdist_test_open_world(&w, &pg, (int64_t)(20000 * tdist_test_timeout_mult()));
    static float data[COUNT], grad[COUNT];
    tdist_ddp_param_t p = {data, grad, COUNT, TDIST_F32, NULL};
    tdist_ddp_opts_t o;
    tdist_ddp_opts_init(&o);
    tdist_ddp_t *ddp;
    ASSERT_OK(tdist_ddp_create(pg, &p, 1, NULL, 0, &o, &ddp));
    tdist_joinable_t j;
    ASSERT_OK(tdist_ddp_joinable(ddp, &j));
    tdist_join_t *join;
    ASSERT_OK(tdist_join_begin(&j, 1, NULL, &join));
    int mine = rank == 0 ? ACTIVE0 : 1;
    for (int k = 0; k < mine; k++) {
        for (int i = 0; i < COUNT; i++) grad[i] = (float)(rank + 1);
        ASSERT_OK(tdist_ddp_forward_begin(ddp));
        ASSERT_OK(tdist_ddp_grad_ready(ddp, 0));
        ASSERT_OK(tdist_ddp_backward_end(ddp));
    }
    ASSERT_OK(tdist_join_end(join));
    char *dump = fr_dump_world(rank);
    /* Iterations 1..ACTIVE0 have a bucket all_reduce on both ranks (rank
     * 1 shadows 2..ACTIVE0); iteration ACTIVE0 + 1 is the notification
     * that finds every rank joined, and ends the Join. */
    long at = 0;
    for (int it = 1; it <= ACTIVE0 + 1; it++) {
        bool active = it <= mine;
        char want[32];
        snprintf(want, sizeof want, "\"arg\":%d,", it);
        const char *what = active ? "\"what\":\"join_notify\"" : "\"what\":\"joined_notify\"";
        long m = find_line(dump, at, what, want);
        if (m < 0)
            FAIL("rank %d: no %s mark for iteration %d after offset %ld in:\n%s", rank, what, it,
                 at, dump);
        if (it > ACTIVE0) break;
        /* that iteration's bucket, launched (or shadowed) and reduced
         * after its notification */
        const char *launch =
            active ? "\"what\":\"bucket_launched\"" : "\"what\":\"bucket_shadow\"";
        long l = find_line(dump, m, launch, "\"arg\":0,");
        if (l < 0)
            FAIL("rank %d: no %s after the notification of iteration %d in:\n%s", rank, launch,
                 it, dump);
        long ar = find_line(dump, l, "\"op\":\"all_reduce", "\"count\":16,");
        if (ar < 0)
            FAIL("rank %d: no all_reduce after the notification of iteration %d in:\n%s", rank,
                 it, dump);
        at = ar;
    }
    free(dump);
    tdist_ddp_destroy(ddp);
    tdist_pg_destroy(pg);
    tdist_world_destroy(w);
}

TEST(join_fr_notifications_recorded, 60)
{
    fr_run_ranks(2, join_fr_body);

    /* the analyzer: both rings hold the same collectives, nothing diverges */
    const char *argv[] = {FR_TOOL, fr_dir(), NULL};
    run_t r;
    run(argv, 30, "tdist-fr", &r);
    printf("tdist-fr:\n%s%s", r.out, r.err);
    ASSERT_TRUE(r.exited && r.code == 0);
    run_free(&r);

    char *kinds = fr_trace_kinds(tmp_path("trace.r0.json"), tmp_path("trace.r1.json"));
    if (!kinds) return;
    /* rank 0: 3 active + 1 joined; rank 1: 1 active + 3 joined */
    ASSERT_CONTAINS(kinds, "event join_notify 4\n");
    ASSERT_CONTAINS(kinds, "event joined_notify 4\n");
    ASSERT_CONTAINS(kinds, "event bucket_launched 4\n"); /* 3 + 1 */
    ASSERT_CONTAINS(kinds, "event bucket_shadow 2\n");   /* rank 1's of iterations 2 and 3 */
    free(kinds);
}
