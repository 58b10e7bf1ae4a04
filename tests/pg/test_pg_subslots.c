/* tests/pg/test_pg_subslots.c — one-shot collectives that share the
 * shared-memory staging sub-slots: rooted broadcasts whose root leaves
 * once it has posted (so it can run ahead by several exchanges) between
 * all_reduces and all_gathers that every rank waits for (which take two
 * sub-slots in turn). Whatever order the exchanges land in, no rank may
 * stage over data a slower rank has yet to read: every result is checked,
 * every round. Values are small integers, exact in any summation order. */
#include <stdio.h>
#include <stdlib.h>

#include "harness.h"
#include "tdist/pg.h"

#define ROUNDS 300
#define BC 1000 /* 4000 bytes: a rooted one-shot broadcast's sub-slot */
#define AR 200  /* 800 bytes: past the line, an all_reduce through a sub-slot */
#define AG 120  /* 480 bytes a rank: an all_gather through a sub-slot */

static void check(float got, float want, const char *what, int round, int j)
{
    if (got != want) FAIL("round %d: %s[%d] = %g, want %g", round, what, j, got, want);
}

static void subslot_body(int rank, int n, void *arg)
{
    (void)arg;
    tdist_world_t *w;
    tdist_pg_t *pg;
    tdist_test_open_world(&w, &pg, (int64_t)(20000 * tdist_test_timeout_mult()));
    float *bc = malloc(BC * sizeof *bc), *ar = malloc(AR * sizeof *ar);
    float *ag = malloc(AG * sizeof *ag), *all = malloc((size_t)n * AG * sizeof *all);
    ASSERT_TRUE(bc && ar && ag && all);
    for (int i = 0; i < ROUNDS; i++) {
        /* 0 to 4 broadcasts in a row from changing roots */
        for (int b = 0; b < i % 5; b++) {
            int root = (i + b) % n;
            for (int j = 0; j < BC; j++) bc[j] = rank == root ? (float)(i * 7 + b * 3 + j) : -1.0f;
            ASSERT_OK(tdist_broadcast(pg, bc, BC, TDIST_F32, root, NULL, NULL));
            for (int j = 0; j < BC; j++) check(bc[j], (float)(i * 7 + b * 3 + j), "broadcast", i, j);
        }
        for (int j = 0; j < AR; j++) ar[j] = (float)(rank + i + j);
        ASSERT_OK(tdist_all_reduce(pg, ar, ar, AR, TDIST_F32, TDIST_SUM, NULL, NULL));
        for (int j = 0; j < AR; j++)
            check(ar[j], (float)(n * (i + j) + n * (n - 1) / 2), "all_reduce", i, j);
        for (int j = 0; j < AG; j++) ag[j] = (float)(rank * 1000 + i + j);
        ASSERT_OK(tdist_all_gather(pg, ag, all, AG, TDIST_F32, NULL, NULL));
        for (int r = 0; r < n; r++)
            for (int j = 0; j < AG; j++)
                check(all[r * AG + j], (float)(r * 1000 + i + j), "all_gather", i, r * AG + j);
    }
    free(bc);
    free(ar);
    free(ag);
    free(all);
    tdist_pg_destroy(pg);
    tdist_world_destroy(w);
}

TEST(pg_subslots_rooted_between_all_waiting_2_ranks, 60)
{
    tdist_test_run_ranks(2, subslot_body, NULL);
}
TEST(pg_subslots_rooted_between_all_waiting_3_ranks, 90)
{
    tdist_test_run_ranks(3, subslot_body, NULL);
}
TEST(pg_subslots_rooted_between_all_waiting_4_ranks, 120)
{
    tdist_test_run_ranks(4, subslot_body, NULL);
}
