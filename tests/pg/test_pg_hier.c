/* tests/pg/test_pg_hier.c — hierarchical collectives (pg/hier.c) for a
 * group that spans hosts. TDIST_HOSTNAME splits this machine into "hosts"
 * (the world's co-location rule and the group's host keys both read it):
 * the group is then TCP, with a shared-memory subgroup per host and a TCP
 * subgroup of the hosts' first ranks. TDIST_HIER_MIN_BYTES=0 sends every
 * all_reduce, all_reduce_coalesced and broadcast through them. Every dtype
 * x reduce op at counts 1 .. 70000, in place and out of place, broadcast
 * from every root, against each rank's locally computed reference
 * (tests/harness/gen.h: small integers, exact in any order); layouts with
 * 2+2, interleaved 2+3 and a host with a single rank; and a rank killed
 * before a collective fails the others fast. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gen.h"
#include "harness.h"
#include "pg/internal.h"
#include "tdist/pg.h"

#define PREMUL 0.25

/* layout[r] names rank r's host */
static void open_hosts(int rank, const char *layout, tdist_world_t **w, tdist_pg_t **pg,
                       int64_t timeout_ms)
{
    unsetenv("LOCAL_RANK");
    unsetenv("LOCAL_WORLD_SIZE");
    char host[32];
    snprintf(host, sizeof host, "hier-host-%c", layout[rank]);
    setenv("TDIST_HOSTNAME", host, 1);
    setenv("TDIST_HIER_MIN_BYTES", "0", 1);
    ASSERT_OK(tdist_init("env://", NULL, w));
    tdist_pg_opts_t o;
    tdist_pg_opts_init(&o);
    o.timeout_ms = timeout_ms;
    ASSERT_OK(tdist_pg_create_world(*w, &o, pg));
}

static void expect_same(const void *got, const void *want, size_t bytes, const char *what,
                        tdist_dtype_t dt, int op, size_t count)
{
    if (memcmp(got, want, bytes) != 0)
        FAIL("%s %s op %d count %zu: differs from the reference", what, tdist_dtype_name(dt), op,
             count);
}

static void hier_body(int rank, int n, void *arg)
{
    const char *layout = arg;
    ASSERT_EQ((int)strlen(layout), n);
    tdist_world_t *w;
    tdist_pg_t *pg;
    open_hosts(rank, layout, &w, &pg, (int64_t)(30000 * tdist_test_timeout_mult()));
    /* the group really is hierarchical, with the expected subgroups */
    ASSERT_TRUE(pg->coll.hier_run != NULL);
    int mine = 0, first = -1;
    for (int r = 0; r < n; r++)
        if (layout[r] == layout[rank]) {
            if (first < 0) first = r;
            mine++;
        }
    ASSERT_TRUE((pg->hier.local != NULL) == (mine > 1));
    ASSERT_TRUE((pg->hier.cross != NULL) == (first == rank));
    if (pg->hier.local) ASSERT_EQ(tdist_pg_size(pg->hier.local), mine);

    tdist_coll_opts_t co;
    tdist_coll_opts_init(&co);
    co.premul_factor = PREMUL;
    static const size_t counts[] = {1, 3, 1000, 70000};
    uint64_t seed = 500;
    for (int dt = 0; dt < TDIST_DTYPE_COUNT; dt++) {
        size_t es = tdist_dtype_size((tdist_dtype_t)dt);
        for (size_t ci = 0; ci < sizeof counts / sizeof counts[0]; ci++) {
            size_t count = counts[ci], bytes = count * es;
            uint8_t *want = malloc(bytes), *in = malloc(bytes), *out = malloc(bytes);
            ASSERT_TRUE(want && in && out);
            for (int op = 0; op < TDIST_REDOP_COUNT; op++) {
                tdist_redop_t ro = (tdist_redop_t)op;
                if (!tgen_op_valid(ro, (tdist_dtype_t)dt)) continue;
                if (count == 70000 && ro != TDIST_SUM && ro != TDIST_AVG && ro != TDIST_MIN)
                    continue; /* runtime */
                tgen_reference(want, count, (tdist_dtype_t)dt, ro, n, seed, PREMUL);
                tgen_fill(in, count, (tdist_dtype_t)dt, ro, rank, seed);
                ASSERT_OK(tdist_all_reduce(pg, in, out, count, (tdist_dtype_t)dt, ro, &co, NULL));
                expect_same(out, want, bytes, "all_reduce", (tdist_dtype_t)dt, op, count);
                ASSERT_OK(tdist_all_reduce(pg, in, in, count, (tdist_dtype_t)dt, ro, &co, NULL));
                expect_same(in, want, bytes, "all_reduce in place", (tdist_dtype_t)dt, op, count);
                seed++;
            }
            /* broadcast from every root */
            for (int root = 0; root < n; root++) {
                tgen_fill(want, count, (tdist_dtype_t)dt, TDIST_SUM, root, seed);
                if (rank == root)
                    memcpy(out, want, bytes);
                else
                    memset(out, 0x77, bytes);
                ASSERT_OK(tdist_broadcast(pg, out, count, (tdist_dtype_t)dt, root, NULL, NULL));
                expect_same(out, want, bytes, "broadcast", (tdist_dtype_t)dt, root, count);
            }
            free(want);
            free(in);
            free(out);
        }
    }
    /* coalesced: three buffers, SUM */
    float a[5], b[3000], c[1];
    void *bufs[3] = {a, b, c};
    size_t cnts[3] = {5, 3000, 1};
    for (size_t i = 0; i < 5; i++) a[i] = (float)(rank + i);
    for (size_t i = 0; i < 3000; i++) b[i] = (float)(rank * (i % 5));
    c[0] = (float)rank;
    ASSERT_OK(tdist_all_reduce_coalesced(pg, bufs, cnts, 3, TDIST_F32, TDIST_SUM, NULL, NULL));
    float rs = (float)(n * (n - 1) / 2);
    for (size_t i = 0; i < 5; i++) ASSERT_TRUE(a[i] == rs + (float)(n * i));
    for (size_t i = 0; i < 3000; i++) ASSERT_TRUE(b[i] == rs * (float)(i % 5));
    ASSERT_TRUE(c[0] == rs);
    /* a mismatch is still caught on the whole group first (rule 2) */
    double x = 1.0;
    if (rank == n - 1)
        ASSERT_STATUS(tdist_broadcast(pg, &x, 1, TDIST_F64, 0, NULL, NULL), TDIST_ERR_MISMATCH);
    else
        ASSERT_STATUS(tdist_all_reduce(pg, &x, &x, 1, TDIST_F64, TDIST_SUM, NULL, NULL),
                      TDIST_ERR_MISMATCH);
    ASSERT_CONTAINS(tdist_last_error(), "collective mismatch");
    tdist_pg_destroy(pg);
    tdist_world_destroy(w);
}

TEST(pg_hier_2x2, 120) { tdist_test_run_ranks(4, hier_body, (void *)"aabb"); }
TEST(pg_hier_interleaved_2_3, 150) { tdist_test_run_ranks(5, hier_body, (void *)"ababb"); }
TEST(pg_hier_single_rank_host, 150) { tdist_test_run_ranks(5, hier_body, (void *)"aabcc"); }

/* Rule 3 through the subgroups: rank 3 (host b, not its leader) is
 * killed; the others' 1 MiB all_reduce fails fast, none hangs. */
static void hier_death_body(int rank, int n, void *arg)
{
    (void)arg;
    ASSERT_EQ(n, 4);
    tdist_world_t *w;
    tdist_pg_t *pg;
    open_hosts(rank, "aabb", &w, &pg, 20000);
    ASSERT_TRUE(pg->coll.hier_run != NULL);
    ASSERT_OK(tdist_barrier(pg, NULL, NULL));
    if (rank == 3) raise(SIGKILL);
    size_t count = 1 << 18;
    float *v = calloc(count, sizeof *v);
    ASSERT_TRUE(v != NULL);
    double t0 = tdist_test_now_ms();
    tdist_status_t st = TDIST_OK;
    for (int i = 0; i < 50 && st == TDIST_OK; i++)
        st = tdist_all_reduce(pg, v, v, count, TDIST_F32, TDIST_SUM, NULL, NULL);
    double dt = tdist_test_now_ms() - t0;
    if (st == TDIST_OK) FAIL("50 all_reduces succeeded without rank 3");
    if (dt > 5000) FAIL("failed after %.0f ms (timeout 20 s): %s", dt, tdist_last_error());
    fprintf(stderr, "rank %d: failed after %.1f ms: %s\n", rank, dt, tdist_last_error());
    free(v);
    tdist_pg_destroy(pg);
    tdist_world_destroy(w);
}

TEST(pg_hier_killed_rank_fails_others_fast, 60)
{
    tdist_ranks_opts_t o;
    tdist_ranks_opts_init(&o, 4);
    o.kill_others_after_ms = -1; /* rank 3's death is the test: let the others report */
    o.timeout_ms = (int)(30000 * tdist_test_timeout_mult());
    tdist_rank_result_t res[4];
    tdist_test_spawn_ranks(&o, hier_death_body, NULL, res);
    char d[128];
    ASSERT_TRUE(res[3].signaled && res[3].sig == SIGKILL);
    for (int r = 0; r < 3; r++)
        if (!res[r].exited || res[r].code != 0)
            FAIL("rank %d %s", r, tdist_test_describe(&res[r], d, sizeof d));
}
