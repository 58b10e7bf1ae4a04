/* tests/pg/test_pg_api.c — process groups through the public API on real
 * processes: create/destroy at world sizes 1..8 without fd or thread
 * leaks, a smoke check of every collective against a local reference,
 * async works (50 outstanding, in order, on_complete once each),
 * argument checks (nothing sent, the next collective still works),
 * subgroups and split, collectives on two groups at once, p2p. */
#include <dirent.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "harness.h"
#include "tdist/pg.h"


typedef struct ctx {
    tdist_world_t *w;
    tdist_pg_t *pg;
} ctx_t;

static void open_world(ctx_t *c, int64_t timeout_ms)
{
    ASSERT_OK(tdist_init("env://", NULL, &c->w));
    tdist_pg_opts_t o;
    tdist_pg_opts_init(&o);
    o.timeout_ms = (int64_t)(timeout_ms * tdist_test_timeout_mult());
    ASSERT_OK(tdist_pg_create_world(c->w, &o, &c->pg));
}

static void close_world(ctx_t *c)
{
    tdist_pg_destroy(c->pg);
    tdist_world_destroy(c->w);
}

/* --------------------------------------------------- create / destroy */

static void sizes_body(int rank, int n, void *arg)
{
    (void)arg;
    tdist_world_t *w;
    ASSERT_OK(tdist_init("env://", NULL, &w));
    int fds = tdist_test_count_fds(), thr = tdist_test_count_threads();
    for (int round = 0; round < 2; round++) {
        tdist_pg_t *pg = NULL;
        tdist_pg_opts_t o;
        tdist_pg_opts_init(&o);
        o.timeout_ms = 20000;
        ASSERT_OK(tdist_pg_create_world(w, &o, &pg));
        ASSERT_EQ(tdist_pg_rank(pg), rank);
        ASSERT_EQ(tdist_pg_size(pg), n);
        ASSERT_STREQ(tdist_pg_name(pg), "world");
        ASSERT_EQ(tdist_pg_world_rank(pg, n - 1), n - 1);
        ASSERT_EQ(tdist_pg_world_rank(pg, n), -1);
        int32_t v = rank + 1, out = 0;
        ASSERT_OK(tdist_all_reduce(pg, &v, &out, 1, TDIST_I32, TDIST_SUM, NULL, NULL));
        ASSERT_EQ(out, n * (n + 1) / 2);
        ASSERT_OK(tdist_pg_error(pg, NULL, 0));
        if (n > 1) { /* start the p2p thread too: destroy must join it */
            int32_t s = rank, r = -1;
            tdist_work_t *wr = NULL;
            ASSERT_OK(tdist_recv(pg, &r, 1, TDIST_I32, (rank + n - 1) % n, NULL, &wr));
            ASSERT_OK(tdist_send(pg, &s, 1, TDIST_I32, (rank + 1) % n, NULL, NULL));
            ASSERT_OK(tdist_work_wait(wr, 20000));
            tdist_work_free(wr);
            ASSERT_EQ(r, (rank + n - 1) % n);
            ASSERT_OK(tdist_barrier(pg, NULL, NULL));
        }
        tdist_pg_destroy(pg);
        ASSERT_EQ(tdist_test_count_fds(), fds);
        ASSERT_EQ(tdist_test_threads_settled(thr), thr);
    }
    tdist_world_destroy(w);
}

TEST(pg_world_sizes_1_to_4, 60)
{
    for (int n = 1; n <= 4; n++) tdist_test_run_ranks(n, sizes_body, NULL);
}
TEST(pg_world_sizes_5_to_8, 90)
{
    for (int n = 5; n <= 8; n++) tdist_test_run_ranks(n, sizes_body, NULL);
}

/* ----------------------------------------------- every collective, smoke */

static int32_t val(int r, size_t i) { return (int32_t)(r * 100 + (int)i + 1); }

static void smoke_body(int rank, int n, void *arg)
{
    (void)arg;
    ctx_t c;
    open_world(&c, 20000);
    tdist_pg_t *pg = c.pg;
    enum { K = 5 };
    int32_t send[8 * K], recv[8 * K], ref[8 * K];
    for (int i = 0; i < n * K; i++) send[i] = val(rank, (size_t)i);

    /* broadcast from the last rank */
    int32_t b[K];
    for (int i = 0; i < K; i++) b[i] = rank == n - 1 ? val(n - 1, (size_t)i) : -1;
    ASSERT_OK(tdist_broadcast(pg, b, K, TDIST_I32, n - 1, NULL, NULL));
    for (int i = 0; i < K; i++) ASSERT_EQ(b[i], val(n - 1, (size_t)i));

    /* all_reduce sum, max, in place */
    ASSERT_OK(tdist_all_reduce(pg, send, recv, K, TDIST_I32, TDIST_SUM, NULL, NULL));
    for (int i = 0; i < K; i++) {
        int32_t s = 0;
        for (int r = 0; r < n; r++) s += val(r, (size_t)i);
        ASSERT_EQ(recv[i], s);
    }
    memcpy(recv, send, sizeof send);
    ASSERT_OK(tdist_all_reduce(pg, recv, recv, K, TDIST_I32, TDIST_MAX, NULL, NULL));
    for (int i = 0; i < K; i++) ASSERT_EQ(recv[i], val(n - 1, (size_t)i));

    /* premul_sum on f32 */
    float fs[3] = {1, 2, 3}, fr[3];
    tdist_coll_opts_t co;
    tdist_coll_opts_init(&co);
    co.premul_factor = 0.5;
    ASSERT_OK(tdist_all_reduce(pg, fs, fr, 3, TDIST_F32, TDIST_PREMUL_SUM, &co, NULL));
    for (int i = 0; i < 3; i++) ASSERT_TRUE(fr[i] == 0.5f * (float)(i + 1) * (float)n);

    /* avg on f64: small (one exchange with the fingerprint) and large
     * (coll algorithm) paths */
    for (int len = 3; len <= 300; len += 297) {
        double *d = malloc((size_t)len * sizeof(double));
        ASSERT_TRUE(d != NULL);
        for (int i = 0; i < len; i++) d[i] = (double)(rank * 4 + i);
        ASSERT_OK(tdist_all_reduce(pg, d, d, (size_t)len, TDIST_F64, TDIST_AVG, NULL, NULL));
        for (int i = 0; i < len; i++) {
            double want = (double)(4 * (n - 1)) / 2.0 + (double)i;
            if (d[i] != want) FAIL("avg len %d element %d: %g, expected %g", len, i, d[i], want);
        }
        free(d);
    }
    /* prod / bxor on i64, small path */
    int64_t qv[2] = {rank + 1, (int64_t)1 << rank};
    ASSERT_OK(tdist_all_reduce(pg, qv, qv, 1, TDIST_I64, TDIST_PROD, NULL, NULL));
    int64_t fact = 1;
    for (int r = 1; r <= n; r++) fact *= r;
    ASSERT_EQ(qv[0], fact);
    ASSERT_OK(tdist_all_reduce(pg, qv + 1, qv + 1, 1, TDIST_I64, TDIST_BXOR, NULL, NULL));
    ASSERT_EQ(qv[1], ((int64_t)1 << n) - 1);

    /* reduce to rank 1 % n */
    int root = 1 % n;
    memset(recv, 0, sizeof recv);
    ASSERT_OK(tdist_reduce_to(pg, send, rank == root ? recv : NULL, K, TDIST_I32, TDIST_SUM, root,
                              NULL, NULL));
    if (rank == root)
        for (int i = 0; i < K; i++) {
            int32_t s = 0;
            for (int r = 0; r < n; r++) s += val(r, (size_t)i);
            ASSERT_EQ(recv[i], s);
        }

    /* all_gather */
    ASSERT_OK(tdist_all_gather(pg, send, recv, K, TDIST_I32, NULL, NULL));
    for (int r = 0; r < n; r++)
        for (int i = 0; i < K; i++) ASSERT_EQ(recv[r * K + i], val(r, (size_t)i));

    /* all_gatherv: rank r gives r + 1 elements */
    size_t counts[8];
    size_t tot = 0;
    for (int r = 0; r < n; r++) tot += (counts[r] = (size_t)r + 1);
    ASSERT_OK(tdist_all_gatherv(pg, send, recv, counts, TDIST_I32, NULL, NULL));
    size_t off = 0;
    for (int r = 0; r < n; r++)
        for (size_t i = 0; i < counts[r]; i++) ASSERT_EQ(recv[off++], val(r, i));
    ASSERT_EQ(off, tot);

    /* gather / scatter at root n - 1 */
    memset(recv, 0, sizeof recv);
    ASSERT_OK(tdist_gather(pg, send, recv, K, TDIST_I32, n - 1, NULL, NULL));
    if (rank == n - 1)
        for (int r = 0; r < n; r++)
            for (int i = 0; i < K; i++) ASSERT_EQ(recv[r * K + i], val(r, (size_t)i));
    ASSERT_OK(tdist_scatter(pg, send, recv, K, TDIST_I32, 0, NULL, NULL));
    for (int i = 0; i < K; i++) ASSERT_EQ(recv[i], val(0, (size_t)(rank * K + i)));

    /* reduce_scatter: block r summed */
    ASSERT_OK(tdist_reduce_scatter(pg, send, recv, K, TDIST_I32, TDIST_SUM, NULL, NULL));
    for (int i = 0; i < K; i++) {
        int32_t s = 0;
        for (int r = 0; r < n; r++) s += val(r, (size_t)(rank * K + i));
        ASSERT_EQ(recv[i], s);
    }

    /* all_to_all: block p of rank r goes to p */
    ASSERT_OK(tdist_all_to_all(pg, send, recv, K, TDIST_I32, NULL, NULL));
    for (int r = 0; r < n; r++)
        for (int i = 0; i < K; i++) ASSERT_EQ(recv[r * K + i], val(r, (size_t)(rank * K + i)));
    /* in place */
    memcpy(ref, send, sizeof send);
    ASSERT_OK(tdist_all_to_all(pg, ref, ref, K, TDIST_I32, NULL, NULL));
    ASSERT_MEMEQ(ref, recv, (size_t)(n * K) * sizeof(int32_t));

    /* all_to_allv: rank r sends (r + p) % 3 elements to p */
    size_t sc[8], rc[8];
    for (int p = 0; p < n; p++) {
        sc[p] = (size_t)((rank + p) % 3);
        rc[p] = (size_t)((p + rank) % 3);
    }
    ASSERT_OK(tdist_all_to_allv(pg, send, sc, recv, rc, TDIST_I32, NULL, NULL));
    off = 0;
    for (int p = 0; p < n; p++) {
        size_t soff = 0; /* offset of block for me in p's sendbuf */
        for (int q = 0; q < rank; q++) soff += (size_t)((p + q) % 3);
        for (size_t i = 0; i < rc[p]; i++) ASSERT_EQ(recv[off++], val(p, soff + i));
    }

    /* barriers */
    ASSERT_OK(tdist_barrier(pg, NULL, NULL));
    ASSERT_OK(tdist_monitored_barrier(pg, NULL));

    /* coalesced */
    int32_t c1[3], c2[1], c3[4];
    void *bufs[3] = {c1, c2, c3};
    size_t cc[3] = {3, 1, 4};
    for (int i = 0; i < 3; i++) c1[i] = rank + i;
    c2[0] = rank * 10;
    for (int i = 0; i < 4; i++) c3[i] = rank == 0 ? 7 : 1;
    ASSERT_OK(tdist_all_reduce_coalesced(pg, bufs, cc, 3, TDIST_I32, TDIST_SUM, NULL, NULL));
    int32_t rs = n * (n - 1) / 2;
    for (int i = 0; i < 3; i++) ASSERT_EQ(c1[i], rs + n * i);
    ASSERT_EQ(c2[0], 10 * rs);
    for (int i = 0; i < 4; i++) ASSERT_EQ(c3[i], 7 + (n - 1));
    for (int i = 0; i < 3; i++) c1[i] = rank == 0 ? 40 + i : 0;
    c2[0] = rank == 0 ? 99 : 0;
    ASSERT_OK(tdist_broadcast_coalesced(pg, bufs, cc, 2, TDIST_I32, 0, NULL, NULL));
    for (int i = 0; i < 3; i++) ASSERT_EQ(c1[i], 40 + i);
    ASSERT_EQ(c2[0], 99);

    /* p2p ring: irecv from the left, isend to the right (both ranks
     * receive first: must not deadlock) */
    if (n > 1) {
        int right = (rank + 1) % n, left = (rank - 1 + n) % n;
        for (int round = 0; round < 3; round++) {
            int32_t out[K], in[K];
            for (int i = 0; i < K; i++) out[i] = val(rank, (size_t)(i + round));
            tdist_work_t *wr = NULL, *ws = NULL;
            ASSERT_OK(tdist_recv(pg, in, K, TDIST_I32, left, NULL, &wr));
            ASSERT_OK(tdist_send(pg, out, K, TDIST_I32, right, NULL, &ws));
            ASSERT_OK(tdist_work_wait(wr, 10000));
            ASSERT_OK(tdist_work_wait(ws, 10000));
            tdist_work_free(wr);
            tdist_work_free(ws);
            for (int i = 0; i < K; i++) ASSERT_EQ(in[i], val(left, (size_t)(i + round)));
        }
        /* blocking, rank 0 <-> 1 */
        if (rank < 2) {
            int32_t x = rank == 0 ? 4242 : 0;
            if (rank == 0)
                ASSERT_OK(tdist_send(pg, &x, 1, TDIST_I32, 1, NULL, NULL));
            else {
                ASSERT_OK(tdist_recv(pg, &x, 1, TDIST_I32, 0, NULL, NULL));
                ASSERT_EQ(x, 4242);
            }
        }
    }
    ASSERT_OK(tdist_barrier(pg, NULL, NULL));
    close_world(&c);
}

TEST(pg_smoke_every_collective_3_ranks, 60) { tdist_test_run_ranks(3, smoke_body, NULL); }
TEST(pg_smoke_every_collective_4_ranks, 60) { tdist_test_run_ranks(4, smoke_body, NULL); }
TEST(pg_smoke_every_collective_1_rank, 30) { tdist_test_run_ranks(1, smoke_body, NULL); }

/* ------------------------------------------------------------- async */

#define NASYNC 50

typedef struct async_state {
    atomic_int calls[NASYNC];
    atomic_int order[NASYNC];
    atomic_int next;
} async_state_t;

static async_state_t g_async;

static void on_done(tdist_status_t st, void *ud)
{
    int i = (int)(intptr_t)ud;
    if (st == TDIST_OK) {
        atomic_fetch_add(&g_async.calls[i], 1);
        int k = atomic_fetch_add(&g_async.next, 1);
        atomic_store(&g_async.order[k], i);
    } else {
        atomic_fetch_add(&g_async.calls[i], 1000);
    }
}

static void async_body(int rank, int n, void *arg)
{
    (void)arg;
    ctx_t c;
    open_world(&c, 20000);
    enum { CNT = 257 };
    float *in = malloc(NASYNC * CNT * sizeof(float)), *out = malloc(NASYNC * CNT * sizeof(float));
    ASSERT_TRUE(in && out);
    for (int k = 0; k < NASYNC; k++)
        for (int i = 0; i < CNT; i++) in[k * CNT + i] = (float)(rank + k + i);
    tdist_work_t *works[NASYNC];
    for (int k = 0; k < NASYNC; k++) {
        tdist_coll_opts_t o;
        tdist_coll_opts_init(&o);
        o.on_complete = on_done;
        o.user_data = (void *)(intptr_t)k;
        ASSERT_OK(tdist_all_reduce(c.pg, in + k * CNT, out + k * CNT, CNT, TDIST_F32, TDIST_SUM,
                                   &o, &works[k]));
    }
    /* wait in reverse order; free some before they are waited */
    for (int k = NASYNC - 1; k >= 0; k--) {
        if (k % 7 == 3) continue;
        ASSERT_OK(tdist_work_wait(works[k], 20000));
        ASSERT_EQ(tdist_work_status(works[k]), TDIST_OK);
        ASSERT_STREQ(tdist_work_error(works[k]), "");
    }
    for (int k = 0; k < NASYNC; k++) tdist_work_free(works[k]);
    ASSERT_OK(tdist_barrier(c.pg, NULL, NULL)); /* after every earlier work */
    for (int k = 0; k < NASYNC; k++) {
        ASSERT_EQ(atomic_load(&g_async.calls[k]), 1);
        ASSERT_EQ(atomic_load(&g_async.order[k]), k);
        for (int i = 0; i < CNT; i++) {
            float want = (float)(n * (k + i) + n * (n - 1) / 2);
            if (out[k * CNT + i] != want)
                FAIL("work %d element %d: %g, expected %g", k, i, (double)out[k * CNT + i],
                     (double)want);
        }
    }
    /* a wait with a short timeout on a work that cannot finish yet */
    if (rank == 0 && n > 1) {
        tdist_work_t *w = NULL;
        float x = 1, y = 0;
        ASSERT_OK(tdist_all_reduce(c.pg, &x, &y, 1, TDIST_F32, TDIST_SUM, NULL, &w));
        ASSERT_STATUS(tdist_work_wait(w, 50), TDIST_ERR_TIMEOUT);
        ASSERT_EQ(tdist_work_status(w), TDIST_INPROGRESS);
        ASSERT_OK(tdist_work_wait(w, 20000));
        ASSERT_OK(tdist_barrier(c.pg, NULL, NULL));
        ASSERT_TRUE(y == (float)n);
        tdist_work_free(w);
    } else if (n > 1) {
        usleep(300 * 1000); /* rank 0's short wait times out meanwhile */
        float x = 1, y = 0;
        ASSERT_OK(tdist_all_reduce(c.pg, &x, &y, 1, TDIST_F32, TDIST_SUM, NULL, NULL));
        ASSERT_TRUE(y == (float)n);
        ASSERT_OK(tdist_barrier(c.pg, NULL, NULL));
    }
    free(in);
    free(out);
    close_world(&c);
}

TEST(pg_async_50_outstanding, 60) { tdist_test_run_ranks(3, async_body, NULL); }

/* ------------------------------------------------------ argument checks */

static void args_body(int rank, int n, void *arg)
{
    (void)arg;
    ctx_t c;
    open_world(&c, 20000);
    tdist_pg_t *pg = c.pg;
    if (rank == 1) {
        float f[4] = {0};
        int32_t i4[4] = {0};
        tdist_work_t *w = (tdist_work_t *)(uintptr_t)0x1;
        ASSERT_STATUS(tdist_all_reduce(NULL, f, f, 4, TDIST_F32, TDIST_SUM, NULL, NULL),
                      TDIST_ERR_INVALID_ARG);
        ASSERT_CONTAINS(tdist_last_error(), "tdist_all_reduce");
        ASSERT_STATUS(tdist_all_reduce(pg, f, f, 4, TDIST_F32, TDIST_BAND, NULL, &w),
                      TDIST_ERR_INVALID_ARG);
        ASSERT_CONTAINS(tdist_last_error(), "tdist_all_reduce: rank 1 group world");
        ASSERT_TRUE(w == (tdist_work_t *)(uintptr_t)0x1); /* untouched */
        ASSERT_STATUS(tdist_all_reduce(pg, i4, i4, 4, TDIST_I32, TDIST_PREMUL_SUM, NULL, NULL),
                      TDIST_ERR_INVALID_ARG);
        ASSERT_CONTAINS(tdist_last_error(), "premul_sum");
        ASSERT_STATUS(tdist_all_reduce(pg, f, f, 4, (tdist_dtype_t)99, TDIST_SUM, NULL, NULL),
                      TDIST_ERR_INVALID_ARG);
        ASSERT_CONTAINS(tdist_last_error(), "dtype");
        ASSERT_STATUS(tdist_all_reduce(pg, NULL, f, 4, TDIST_F32, TDIST_SUM, NULL, NULL),
                      TDIST_ERR_INVALID_ARG);
        ASSERT_CONTAINS(tdist_last_error(), "sendbuf is NULL");
        ASSERT_STATUS(tdist_broadcast(pg, f, 4, TDIST_F32, n, NULL, NULL), TDIST_ERR_INVALID_ARG);
        ASSERT_CONTAINS(tdist_last_error(), "root");
        ASSERT_STATUS(tdist_reduce_to(pg, f, f, 4, TDIST_F32, TDIST_SUM, -1, NULL, NULL),
                      TDIST_ERR_INVALID_ARG);
        ASSERT_STATUS(tdist_all_gather(pg, f, f, SIZE_MAX / 8, TDIST_F32, NULL, NULL),
                      TDIST_ERR_INVALID_ARG);
        ASSERT_CONTAINS(tdist_last_error(), "overflow");
        ASSERT_STATUS(tdist_all_gatherv(pg, f, f, NULL, TDIST_F32, NULL, NULL),
                      TDIST_ERR_INVALID_ARG);
        ASSERT_CONTAINS(tdist_last_error(), "recvcounts is NULL");
        ASSERT_STATUS(tdist_all_to_allv(pg, f, NULL, f, NULL, TDIST_F32, NULL, NULL),
                      TDIST_ERR_INVALID_ARG);
        ASSERT_STATUS(tdist_send(pg, f, 1, TDIST_F32, 1, NULL, NULL), TDIST_ERR_INVALID_ARG);
        ASSERT_CONTAINS(tdist_last_error(), "this rank");
        ASSERT_STATUS(tdist_recv(pg, f, 1, TDIST_F32, 17, NULL, NULL), TDIST_ERR_INVALID_ARG);
        size_t cnt = 2;
        ASSERT_STATUS(tdist_all_reduce_coalesced(pg, NULL, &cnt, 1, TDIST_F32, TDIST_SUM, NULL, NULL),
                      TDIST_ERR_INVALID_ARG);
        ASSERT_STATUS(tdist_work_wait(NULL, 0), TDIST_ERR_INVALID_ARG);
        tdist_work_free(NULL);
        tdist_pg_destroy(NULL);
        ASSERT_EQ(tdist_pg_rank(NULL), -1);
    }
    /* nothing was sent and no sequence number was used: this works */
    int32_t v = rank, out = -1;
    ASSERT_OK(tdist_all_reduce(pg, &v, &out, 1, TDIST_I32, TDIST_SUM, NULL, NULL));
    ASSERT_EQ(out, n * (n - 1) / 2);
    ASSERT_OK(tdist_pg_error(pg, NULL, 0));
    close_world(&c);
}

TEST(pg_bad_arguments_send_nothing, 30) { tdist_test_run_ranks(3, args_body, NULL); }

/* One all_reduce on a fresh world group made with opts (NULL: defaults). */
static void one_all_reduce(tdist_world_t *w, const tdist_pg_opts_t *o, int n)
{
    tdist_pg_t *pg = NULL;
    ASSERT_OK(tdist_pg_create_world(w, o, &pg));
    int32_t v = tdist_pg_rank(pg) + 1, out = 0;
    ASSERT_OK(tdist_all_reduce(pg, &v, &out, 1, TDIST_I32, TDIST_SUM, NULL, NULL));
    ASSERT_EQ(out, n * (n + 1) / 2);
    tdist_pg_destroy(pg);
}

static void transport_env_body(int rank, int n, void *arg)
{
    (void)rank;
    (void)arg;
    tdist_world_t *w;
    ASSERT_OK(tdist_init("env://", NULL, &w));
    tdist_pg_t *pg = NULL;
    tdist_pg_opts_t o;
    tdist_pg_opts_init(&o);
    unsetenv("TDIST_TRANSPORT");
    one_all_reduce(w, NULL, n); /* auto: shared memory on one host */
    o.transport = "shm";
    one_all_reduce(w, &o, n);
    o.transport = "tcp";
    one_all_reduce(w, &o, n);
    o.transport = "carrier-pigeon";
    ASSERT_STATUS(tdist_pg_create_world(w, &o, &pg), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "unknown transport \"carrier-pigeon\"");
    setenv("TDIST_TRANSPORT", "tcp", 1);
    one_all_reduce(w, NULL, n);
    setenv("TDIST_TRANSPORT", "bogus", 1);
    ASSERT_STATUS(tdist_pg_create_world(w, NULL, &pg), TDIST_ERR_INVALID_ARG);
    unsetenv("TDIST_TRANSPORT");
    o.transport = "tcp";
    o.timeout_ms = 0;
    ASSERT_STATUS(tdist_pg_create_world(w, &o, &pg), TDIST_ERR_INVALID_ARG);
    ASSERT_TRUE(pg == NULL);
    tdist_world_destroy(w);
}

TEST(pg_transport_option_checked, 30) { tdist_test_run_ranks(2, transport_env_body, NULL); }

/* The set-up deadline is not the collectives': rank 1 calls neither
 * tdist_pg_new_group nor a second tdist_pg_create_world, and rank 0's
 * creations fail at their 300 ms set-up deadline, naming it, though the
 * group's timeout is a minute (the test's own limit is half of that). */
static void setup_deadline_body(int rank, int n, void *arg)
{
    (void)n;
    (void)arg;
    tdist_world_t *w;
    ASSERT_OK(tdist_init("env://", NULL, &w));
    tdist_store_t *s = tdist_world_store(w);
    tdist_pg_t *pg = NULL, *other = NULL;
    ASSERT_OK(tdist_pg_create_world(w, NULL, &pg));
    const char *done = "setup_deadline/done";
    if (rank == 0) {
        tdist_pg_opts_t o;
        tdist_pg_opts_init(&o);
        o.timeout_ms = 60000;
        o.setup_timeout_ms = 300;
        const int both[2] = {0, 1};
        ASSERT_STATUS(tdist_pg_new_group(pg, both, 2, &o, &other), TDIST_ERR_TIMEOUT);
        ASSERT_CONTAINS(tdist_last_error(), "did not call tdist_pg_new_group within 300 ms (the "
                                            "set-up deadline)");
        ASSERT_STATUS(tdist_pg_create_world(w, &o, &other), TDIST_ERR_TIMEOUT);
        ASSERT_CONTAINS(tdist_last_error(), "set-up timed out after 300 ms (the set-up deadline)");
        o.setup_timeout_ms = -1;
        ASSERT_STATUS(tdist_pg_create_world(w, &o, &other), TDIST_ERR_INVALID_ARG);
        ASSERT_CONTAINS(tdist_last_error(), "opts.setup_timeout_ms must be >= 0");
        setenv("TDIST_SETUP_TIMEOUT_MS", "2s", 1);
        ASSERT_STATUS(tdist_pg_create_world(w, NULL, &other), TDIST_ERR_INVALID_ARG);
        ASSERT_CONTAINS(tdist_last_error(), "TDIST_SETUP_TIMEOUT_MS");
        setenv("TDIST_SETUP_TIMEOUT_MS", "300", 1); /* NULL opts: from the environment */
        ASSERT_STATUS(tdist_pg_create_world(w, NULL, &other), TDIST_ERR_TIMEOUT);
        ASSERT_CONTAINS(tdist_last_error(), "(the set-up deadline)");
        unsetenv("TDIST_SETUP_TIMEOUT_MS");
        ASSERT_TRUE(other == NULL);
        ASSERT_OK(tdist_store_set(s, done, "1", 1));
    } else {
        ASSERT_OK(tdist_store_wait(s, &done, 1, 20000));
    }
    tdist_pg_destroy(pg);
    tdist_world_destroy(w);
}

TEST(pg_setup_deadline_apart_from_timeout, 30)
{
    tdist_test_run_ranks(2, setup_deadline_body, NULL);
}

/* --------------------------------------------------- subgroups and split */

static void sub_body(int rank, int n, void *arg)
{
    (void)arg;
    ctx_t c;
    open_world(&c, 20000);
    int fds = tdist_test_count_fds(), thr = tdist_test_count_threads();
    const int members[2] = {1, 3};
    tdist_pg_t *sub = NULL;
    ASSERT_OK(tdist_pg_new_group(c.pg, members, 2, NULL, &sub));
    bool in = rank == 1 || rank == 3;
    ASSERT_EQ(sub != NULL, in);
    if (in) {
        ASSERT_EQ(tdist_pg_rank(sub), rank == 1 ? 0 : 1);
        ASSERT_EQ(tdist_pg_size(sub), 2);
        ASSERT_STREQ(tdist_pg_name(sub), "world.0");
        ASSERT_EQ(tdist_pg_world_rank(sub, 1), 3);
    }
    /* interleaved world and subgroup collectives, some async at once */
    for (int it = 0; it < 10; it++) {
        int32_t v = rank + it, out = 0, sv = rank * 10 + it, sout = 0;
        tdist_work_t *ww = NULL, *sw = NULL;
        ASSERT_OK(tdist_all_reduce(c.pg, &v, &out, 1, TDIST_I32, TDIST_SUM, NULL, &ww));
        if (in) ASSERT_OK(tdist_all_reduce(sub, &sv, &sout, 1, TDIST_I32, TDIST_SUM, NULL, &sw));
        ASSERT_OK(tdist_work_wait(ww, 20000));
        ASSERT_EQ(out, n * (n - 1) / 2 + n * it);
        if (in) {
            ASSERT_OK(tdist_work_wait(sw, 20000));
            ASSERT_EQ(sout, 10 + 30 + 2 * it);
        }
        tdist_work_free(ww);
        tdist_work_free(sw);
    }
    /* split: even / odd, ordered by key = -rank (reverse) */
    tdist_pg_t *half = NULL;
    ASSERT_OK(tdist_pg_split(c.pg, rank % 2, -rank, NULL, &half));
    ASSERT_TRUE(half != NULL);
    ASSERT_EQ(tdist_pg_size(half), 2);
    ASSERT_EQ(tdist_pg_rank(half), rank >= 2 ? 0 : 1);
    ASSERT_EQ(tdist_pg_world_rank(half, 0), rank % 2 + 2);
    int32_t hv = rank, hout = 0;
    ASSERT_OK(tdist_all_reduce(half, &hv, &hout, 1, TDIST_I32, TDIST_SUM, NULL, NULL));
    ASSERT_EQ(hout, rank % 2 == 0 ? 0 + 2 : 1 + 3);
    /* color < 0: no group */
    tdist_pg_t *none = (tdist_pg_t *)(uintptr_t)1;
    ASSERT_OK(tdist_pg_split(c.pg, rank == 0 ? -1 : 5, 0, NULL, &none));
    ASSERT_EQ(none == NULL, rank == 0);
    if (none) {
        ASSERT_EQ(tdist_pg_size(none), n - 1);
        ASSERT_OK(tdist_barrier(none, NULL, NULL));
    }
    tdist_pg_destroy(none);
    tdist_pg_destroy(half);
    tdist_pg_destroy(sub);
    ASSERT_EQ(tdist_test_count_fds(), fds);
    ASSERT_EQ(tdist_test_threads_settled(thr), thr);
    ASSERT_OK(tdist_barrier(c.pg, NULL, NULL));
    close_world(&c);
}

TEST(pg_subgroups_and_split, 60) { tdist_test_run_ranks(4, sub_body, NULL); }

static void sub_mismatch_body(int rank, int n, void *arg)
{
    (void)n;
    (void)arg;
    ctx_t c;
    open_world(&c, 5000);
    const int a[2] = {0, 1}, b[2] = {1, 0};
    tdist_pg_t *sub = NULL;
    tdist_status_t st = tdist_pg_new_group(c.pg, rank == 0 ? a : b, 2, NULL, &sub);
    ASSERT_STATUS(st, TDIST_ERR_MISMATCH);
    ASSERT_CONTAINS(tdist_last_error(), "was given ranks");
    ASSERT_TRUE(sub == NULL);
    ASSERT_OK(tdist_barrier(c.pg, NULL, NULL));
    close_world(&c);
}

TEST(pg_new_group_list_mismatch, 30) { tdist_test_run_ranks(2, sub_mismatch_body, NULL); }

/* ---------------------------------------------------------------- p2p */

static void p2p_mismatch_body(int rank, int n, void *arg)
{
    (void)n;
    (void)arg;
    ctx_t c;
    open_world(&c, 10000);
    float f[12] = {0};
    if (rank == 0) {
        ASSERT_OK(tdist_send(c.pg, f, 10, TDIST_F32, 1, NULL, NULL));
    } else {
        ASSERT_STATUS(tdist_recv(c.pg, f, 12, TDIST_F32, 0, NULL, NULL), TDIST_ERR_MISMATCH);
        ASSERT_CONTAINS(tdist_last_error(), "p2p mismatch: rank 0 sent #1 send(f32, 10)");
        ASSERT_STATUS(tdist_recv(c.pg, f, 12, TDIST_F32, 0, NULL, NULL), TDIST_ERR_MISMATCH);
        char buf[512];
        ASSERT_STATUS(tdist_pg_error(c.pg, buf, sizeof buf), TDIST_ERR_MISMATCH);
    }
    /* collectives are not affected by the p2p failure */
    ASSERT_OK(tdist_barrier(c.pg, NULL, NULL));
    close_world(&c);
}

TEST(pg_p2p_header_mismatch, 30) { tdist_test_run_ranks(2, p2p_mismatch_body, NULL); }

/* ------------------------------------------------------------ options */

TEST(pg_options_defaults, 10)
{
    tdist_pg_opts_t o;
    unsetenv("TDIST_TIMEOUT_MS");
    tdist_pg_opts_init(&o);
    ASSERT_EQ(o.timeout_ms, TDIST_PG_DEFAULT_TIMEOUT_MS);
    ASSERT_TRUE(o.name == NULL && o.transport == NULL && o.bind_addr == NULL);
    setenv("TDIST_TIMEOUT_MS", "1234", 1);
    tdist_pg_opts_init(&o);
    ASSERT_EQ(o.timeout_ms, 1234);
    unsetenv("TDIST_TIMEOUT_MS");
    ASSERT_EQ(o.setup_timeout_ms, 0); /* the same as timeout_ms */
    setenv("TDIST_SETUP_TIMEOUT_MS", "4321", 1);
    tdist_pg_opts_init(&o);
    ASSERT_EQ(o.setup_timeout_ms, 4321);
    setenv("TDIST_SETUP_TIMEOUT_MS", "2s", 1); /* malformed: the default here, refused at creation */
    tdist_pg_opts_init(&o);
    ASSERT_EQ(o.setup_timeout_ms, 0);
    unsetenv("TDIST_SETUP_TIMEOUT_MS");
    tdist_coll_opts_t c;
    tdist_coll_opts_init(&c);
    ASSERT_TRUE(c.timeout_ms < 0);
    ASSERT_TRUE(c.premul_factor == 1.0);
    ASSERT_TRUE(c.on_complete == NULL);
    ASSERT_EQ(tdist_pg_size(NULL), -1);
    ASSERT_TRUE(tdist_pg_name(NULL) == NULL);
    ASSERT_STATUS(tdist_pg_abort(NULL), TDIST_ERR_INVALID_ARG);
    ASSERT_STATUS(tdist_pg_error(NULL, NULL, 0), TDIST_ERR_INVALID_ARG);
    ASSERT_STATUS(tdist_pg_create_world(NULL, NULL, NULL), TDIST_ERR_INVALID_ARG);
    ASSERT_STREQ(tdist_work_error(NULL), "");
}

/* Two simulated hosts: without opts.bind_addr the group picks the
 * interface that reaches the store (127.0.0.1 here); shared memory is
 * refused; an explicit bind_addr works too. */
static void two_hosts_body(int rank, int n, void *arg)
{
    (void)n;
    (void)arg;
    unsetenv("LOCAL_RANK");
    unsetenv("LOCAL_WORLD_SIZE");
    setenv("TDIST_HOSTNAME", rank % 2 ? "pg-host-b" : "pg-host-a", 1);
    tdist_world_t *w;
    ASSERT_OK(tdist_init("env://", NULL, &w));
    ASSERT_EQ(tdist_world_local_size(w), 1);
    tdist_pg_t *pg = NULL;
    ASSERT_OK(tdist_pg_create_world(w, NULL, &pg));
    int32_t one = 1, two = 0;
    ASSERT_OK(tdist_all_reduce(pg, &one, &two, 1, TDIST_I32, TDIST_SUM, NULL, NULL));
    ASSERT_EQ(two, 2);
    tdist_pg_destroy(pg);
    pg = NULL;
    tdist_pg_opts_t o;
    tdist_pg_opts_init(&o);
    o.transport = "shm"; /* shared memory cannot span hosts */
    ASSERT_STATUS(tdist_pg_create_world(w, &o, &pg), TDIST_ERR_NOT_SUPPORTED);
    ASSERT_CONTAINS(tdist_last_error(), "needs every rank on one host");
    o.transport = NULL;
    o.bind_addr = "127.0.0.1";
    o.timeout_ms = 20000;
    ASSERT_OK(tdist_pg_create_world(w, &o, &pg));
    int32_t v = 1, out = 0;
    ASSERT_OK(tdist_all_reduce(pg, &v, &out, 1, TDIST_I32, TDIST_SUM, NULL, NULL));
    ASSERT_EQ(out, 2);
    tdist_pg_destroy(pg);
    tdist_world_destroy(w);
}

TEST(pg_multi_host_picks_interface, 30) { tdist_test_run_ranks(2, two_hosts_body, NULL); }

/* A world group's identity comes from its own world: rank 0 first makes
 * and destroys a group on a 1-rank world of its own; both ranks' groups on
 * the shared world must still find each other (their n-th world group on
 * that world is the same group, whatever else the process created). */
static void world_groups_per_world_body(int rank, int n, void *arg)
{
    (void)n;
    (void)arg;
    tdist_pg_opts_t o;
    tdist_pg_opts_init(&o);
    o.timeout_ms = 5000;
    if (rank == 0) {
        char url[600];
        snprintf(url, sizeof url, "file://%s/solo_world?rank=0&world_size=1", tdist_test_tmpdir());
        /* this world's one rank is alone on the host: not the launcher's local rank */
        char lr[32], lws[32];
        snprintf(lr, sizeof lr, "%s", getenv("LOCAL_RANK") ? getenv("LOCAL_RANK") : "");
        snprintf(lws, sizeof lws, "%s", getenv("LOCAL_WORLD_SIZE") ? getenv("LOCAL_WORLD_SIZE") : "");
        unsetenv("LOCAL_RANK");
        unsetenv("LOCAL_WORLD_SIZE");
        tdist_world_t *solo = NULL;
        ASSERT_OK(tdist_init(url, NULL, &solo));
        if (lr[0]) setenv("LOCAL_RANK", lr, 1);
        if (lws[0]) setenv("LOCAL_WORLD_SIZE", lws, 1);
        tdist_pg_t *g = NULL;
        ASSERT_OK(tdist_pg_create_world(solo, &o, &g));
        ASSERT_OK(tdist_barrier(g, NULL, NULL));
        tdist_pg_destroy(g);
        tdist_world_destroy(solo);
    }
    tdist_world_t *w = NULL;
    ASSERT_OK(tdist_init("env://", NULL, &w));
    for (int k = 0; k < 2; k++) { /* the first and the second world group of w */
        tdist_pg_t *pg = NULL;
        ASSERT_OK(tdist_pg_create_world(w, &o, &pg));
        float x = (float)(rank + 1);
        ASSERT_OK(tdist_all_reduce(pg, &x, &x, 1, TDIST_F32, TDIST_SUM, NULL, NULL));
        ASSERT_EQ(x, 3.0f);
        tdist_pg_destroy(pg);
    }
    tdist_world_destroy(w);
}

TEST(pg_world_group_ids_are_per_world, 40) { tdist_test_run_ranks(2, world_groups_per_world_body, NULL); }

/* Configuration the collectives read is read once, when the group is
 * created: a bad TDIST_ALGO_ALLREDUCE fails the creation on every rank,
 * naming the variable, before anything is sent; a good one set after the
 * creation changes nothing for that group. */
static void algo_env_at_creation_body(int rank, int n, void *arg)
{
    (void)n;
    (void)arg;
    tdist_world_t *w = NULL;
    ASSERT_OK(tdist_init("env://", NULL, &w));
    setenv("TDIST_ALGO_ALLREDUCE", "bogus", 1);
    tdist_pg_t *pg = NULL;
    ASSERT_STATUS(tdist_pg_create_world(w, NULL, &pg), TDIST_ERR_INVALID_ARG);
    ASSERT_TRUE(pg == NULL);
    ASSERT_CONTAINS(tdist_last_error(), "TDIST_ALGO_ALLREDUCE=\"bogus\"");
    unsetenv("TDIST_ALGO_ALLREDUCE");
    ASSERT_OK(tdist_pg_create_world(w, NULL, &pg));
    setenv("TDIST_ALGO_ALLREDUCE", "bogus", 1); /* too late to matter */
    float x = (float)(rank + 1);
    ASSERT_OK(tdist_all_reduce(pg, &x, &x, 1, TDIST_F32, TDIST_SUM, NULL, NULL));
    ASSERT_EQ(x, 3.0f);
    float big[300];
    for (int i = 0; i < 300; i++) big[i] = (float)(rank + i);
    ASSERT_OK(tdist_all_reduce(pg, big, big, 300, TDIST_F32, TDIST_SUM, NULL, NULL));
    ASSERT_EQ(big[299], (float)(2 * 299 + 1));
    unsetenv("TDIST_ALGO_ALLREDUCE");
    tdist_pg_destroy(pg);
    tdist_world_destroy(w);
}

TEST(pg_algo_env_read_at_creation, 30) { tdist_test_run_ranks(2, algo_env_at_creation_body, NULL); }

/* ------------------------------------------ rooted collectives, pipelined
 *
 * Blocking broadcast, scatter, reduce and gather let their senders run
 * ahead of the ranks that read (the check travels with the data): many
 * calls in a row, rotating roots, at sizes that ride in the line (8 B),
 * in a sub-slot (4 KiB) and in a whole slot (32 KiB), mixed with
 * all_reduce, each result against a local reference. Runs past the
 * number of lines, so a sender waits for the readers at least once. */

static float rooted_val(int rank, int call, size_t i)
{
    return (float)((rank * 7 + call * 3 + (int)(i % 13)) % 11);
}

static void rooted_one(tdist_pg_t *pg, int rank, int n, int call, size_t cnt, float *a,
                       float *b)
{
    int root = call % n;
    int kind = (call / n) % 4;
    size_t tot = cnt * (size_t)n;
    for (size_t i = 0; i < tot; i++) a[i] = rooted_val(rank, call, i), b[i] = -1.0f;
    switch (kind) {
    case 0: /* broadcast */
        ASSERT_OK(tdist_broadcast(pg, a, cnt, TDIST_F32, root, NULL, NULL));
        for (size_t i = 0; i < cnt; i++) ASSERT_EQ(a[i], rooted_val(root, call, i));
        break;
    case 1: /* scatter: block r of root's buffer */
        ASSERT_OK(tdist_scatter(pg, a, b, cnt, TDIST_F32, root, NULL, NULL));
        for (size_t i = 0; i < cnt; i++)
            ASSERT_EQ(b[i], rooted_val(root, call, (size_t)rank * cnt + i));
        break;
    case 2: /* reduce to root */
        ASSERT_OK(tdist_reduce_to(pg, a, b, cnt, TDIST_F32, TDIST_SUM, root, NULL, NULL));
        for (size_t i = 0; rank == root && i < cnt; i++) {
            float want = 0;
            for (int r = 0; r < n; r++) want += rooted_val(r, call, i);
            ASSERT_EQ(b[i], want);
        }
        break;
    default: /* gather to root */
        ASSERT_OK(tdist_gather(pg, a, b, cnt, TDIST_F32, root, NULL, NULL));
        for (size_t i = 0; rank == root && i < tot; i++)
            ASSERT_EQ(b[i], rooted_val((int)(i / cnt), call, i % cnt));
        break;
    }
}

static void rooted_body(int rank, int n, void *arg)
{
    (void)arg;
    ctx_t c;
    open_world(&c, 30000);
    static const size_t counts[] = {2, 1024, 8192}; /* 8 B, 4 KiB, 32 KiB */
    float *a = malloc(8192 * sizeof(float) * (size_t)n), *b = malloc(8192 * sizeof(float) * (size_t)n);
    ASSERT_TRUE(a && b);
    for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++) {
        int calls = counts[k] > 1024 ? 40 : 160;
        for (int call = 0; call < calls; call++) {
            rooted_one(c.pg, rank, n, call, counts[k], a, b);
            if (call % 37 == 36) { /* a symmetric collective in between */
                float x = (float)rank, y = 0;
                ASSERT_OK(tdist_all_reduce(c.pg, &x, &y, 1, TDIST_F32, TDIST_SUM, NULL, NULL));
                ASSERT_EQ(y, (float)(n * (n - 1) / 2));
            }
        }
    }
    ASSERT_OK(tdist_barrier(c.pg, NULL, NULL));
    free(a);
    free(b);
    close_world(&c);
}

TEST(pg_rooted_pipelined_3_ranks, 60) { tdist_test_run_ranks(3, rooted_body, NULL); }
