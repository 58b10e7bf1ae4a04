/* tests/pg/test_pg_multi.c — the multi-buffer collectives
 * (tdist_all_reduce_multi, _reduce_multi, _broadcast_multi,
 * _all_gather_multi) for k = 1..4 buffers per rank at world sizes 1..4,
 * against a reference each rank computes: buffer i of rank r holds the
 * seeded input of "virtual rank" r x k + i (tests/harness/gen.h: small
 * integers, exact in any summation order), so a reduction over all
 * k x size buffers is tgen_reference over k x size ranks. Then the
 * argument checks. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gen.h"
#include "harness.h"
#include "tdist/pg.h"

#define COUNT 301 /* past the shm line: the one-shot and point-to-point paths too */
#define KMAX 4
#define PREMUL 0.5

static void expect_eq(const void *got, const void *want, size_t bytes, const char *what,
                      size_t k, size_t i)
{
    if (memcmp(got, want, bytes) != 0) FAIL("%s k %zu: buffer %zu differs", what, k, i);
}

static void reductions(tdist_pg_t *pg, int rank, int n, size_t k, uint8_t **bufs, uint8_t *want,
                       uint64_t seed)
{
    static const tdist_redop_t ops[] = {TDIST_SUM, TDIST_AVG, TDIST_MAX, TDIST_PREMUL_SUM};
    tdist_coll_opts_t co;
    tdist_coll_opts_init(&co);
    co.premul_factor = PREMUL;
    size_t bytes = COUNT * sizeof(float);
    int vn = n * (int)k;
    for (size_t o = 0; o < sizeof ops / sizeof ops[0]; o++, seed++) {
        tgen_reference(want, COUNT, TDIST_F32, ops[o], vn, seed, PREMUL);
        for (size_t i = 0; i < k; i++)
            tgen_fill(bufs[i], COUNT, TDIST_F32, ops[o], rank * (int)k + (int)i, seed);
        ASSERT_OK(tdist_all_reduce_multi(pg, (void *const *)bufs, k, COUNT, TDIST_F32, ops[o],
                                         &co));
        for (size_t i = 0; i < k; i++) expect_eq(bufs[i], want, bytes, "all_reduce_multi", k, i);
        /* reduce to the last buffer of the last rank; the others keep their input */
        for (size_t i = 0; i < k; i++)
            tgen_fill(bufs[i], COUNT, TDIST_F32, ops[o], rank * (int)k + (int)i, seed);
        ASSERT_OK(tdist_reduce_multi(pg, (void *const *)bufs, k, COUNT, TDIST_F32, ops[o], n - 1,
                                     k - 1, &co));
        if (rank == n - 1) expect_eq(bufs[k - 1], want, bytes, "reduce_multi", k, k - 1);
        size_t kept = rank == n - 1 ? k - 1 : k;
        for (size_t i = 0; i < kept; i++) {
            tgen_fill(want, COUNT, TDIST_F32, ops[o], rank * (int)k + (int)i, seed);
            expect_eq(bufs[i], want, bytes, "reduce_multi (input kept)", k, i);
        }
    }
}

static void multi_body(int rank, int n, void *arg)
{
    (void)arg;
    tdist_world_t *w;
    tdist_pg_t *pg;
    ASSERT_OK(tdist_init("env://", NULL, &w));
    ASSERT_OK(tdist_pg_create_world(w, NULL, &pg));
    size_t bytes = COUNT * sizeof(float), nk = (size_t)n * KMAX;
    uint8_t *bufs[KMAX], *outs[KMAX], *want = malloc(nk * bytes);
    ASSERT_TRUE(want != NULL);
    for (size_t i = 0; i < KMAX; i++) {
        bufs[i] = malloc(bytes);
        outs[i] = malloc(nk * bytes);
        ASSERT_TRUE(bufs[i] && outs[i]);
    }
    uint64_t seed = 3;
    for (size_t k = 1; k <= KMAX; k++, seed += 10) {
        reductions(pg, rank, n, k, bufs, want, seed);
        /* broadcast from buffer k / 2 of rank 1 % n */
        int root = 1 % n;
        tgen_fill(want, COUNT, TDIST_F32, TDIST_SUM, 99, seed);
        for (size_t i = 0; i < k; i++) memset(bufs[i], 0x33, bytes);
        if (rank == root) memcpy(bufs[k / 2], want, bytes);
        ASSERT_OK(tdist_broadcast_multi(pg, (void *const *)bufs, k, COUNT, TDIST_F32, root, k / 2,
                                        NULL));
        for (size_t i = 0; i < k; i++) expect_eq(bufs[i], want, bytes, "broadcast_multi", k, i);
        /* all_gather: rank r's buffer i lands at (r x k + i) x COUNT */
        for (int r = 0; r < n; r++)
            for (size_t i = 0; i < k; i++)
                tgen_fill(want + ((size_t)r * k + i) * bytes, COUNT, TDIST_F32, TDIST_SUM,
                          r * (int)k + (int)i, seed);
        for (size_t i = 0; i < k; i++) {
            memcpy(bufs[i], want + ((size_t)rank * k + i) * bytes, bytes);
            memset(outs[i], 0x5a, (size_t)n * k * bytes);
        }
        ASSERT_OK(tdist_all_gather_multi(pg, (const void *const *)bufs, (void *const *)outs, k,
                                         COUNT, TDIST_F32, NULL));
        for (size_t i = 0; i < k; i++)
            expect_eq(outs[i], want, (size_t)n * k * bytes, "all_gather_multi", k, i);
    }
    /* argument checks: nothing is sent, the group stays usable */
    ASSERT_STATUS(tdist_all_reduce_multi(pg, (void *const *)bufs, 0, COUNT, TDIST_F32, TDIST_SUM,
                                         NULL), TDIST_ERR_INVALID_ARG);
    uint8_t *holes[2] = {bufs[0], NULL};
    ASSERT_STATUS(tdist_broadcast_multi(pg, (void *const *)holes, 2, COUNT, TDIST_F32, 0, 0, NULL),
                  TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "bufs[1]");
    ASSERT_STATUS(tdist_reduce_multi(pg, (void *const *)bufs, 2, COUNT, TDIST_F32, TDIST_SUM, 0, 2,
                                     NULL), TDIST_ERR_INVALID_ARG);
    ASSERT_OK(tdist_barrier(pg, NULL, NULL));
    for (size_t i = 0; i < KMAX; i++) {
        free(bufs[i]);
        free(outs[i]);
    }
    free(want);
    tdist_pg_destroy(pg);
    tdist_world_destroy(w);
}

TEST(pg_multi_buffer_1_rank, 30) { tdist_test_run_ranks(1, multi_body, NULL); }
TEST(pg_multi_buffer_2_ranks, 60) { tdist_test_run_ranks(2, multi_body, NULL); }
TEST(pg_multi_buffer_3_ranks, 60) { tdist_test_run_ranks(3, multi_body, NULL); }
TEST(pg_multi_buffer_4_ranks, 90) { tdist_test_run_ranks(4, multi_body, NULL); }
