/* tests/net/test_netns_coll.c — 2 hosts x 2 ranks in two network
 * namespaces (tests/net/netns.h): the store on host A's address, the
 * rendezvous telling the hosts apart by namespace (both have this
 * machine's host name), each rank's process groups bound to its own
 * veth address (the default: the route to the store; or
 * TDIST_SOCKET_IFNAME), and every collective of pg.h correct, each rank
 * computing the expected result itself. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "init/internal.h"
#include "netns.h"

#define NR 4        /* ranks */
#define PER_HOST 2
#define K 5
#define BIG (1 << 18) /* 1 MiB of f32: the TCP algorithms for large messages */

typedef struct coll_arg {
    const netns_topo_t *t;
} coll_arg_t;

static int32_t val(int r, size_t i) { return (int32_t)(r * 100 + (int)i + 1); }

/* Exactly representable f32 values, so any summation order is exact. */
static float fval(int r, size_t i) { return (float)((int)((i * 7 + (size_t)r * 13) % 1001) - 500); }

static void check_big(tdist_pg_t *pg, int rank, int n)
{
    float *a = malloc(BIG * sizeof *a), *b = malloc((size_t)n * BIG / 4 * sizeof *b);
    ASSERT_TRUE(a && b);
    /* all_reduce: large (ring / halving-doubling over TCP), async */
    for (size_t i = 0; i < BIG; i++) a[i] = fval(rank, i);
    tdist_work_t *wk = NULL;
    ASSERT_OK(tdist_all_reduce(pg, a, a, BIG, TDIST_F32, TDIST_SUM, NULL, &wk));
    ASSERT_OK(tdist_work_wait(wk, (int64_t)(30000 * tdist_test_timeout_mult())));
    tdist_work_free(wk);
    for (size_t i = 0; i < BIG; i++) {
        float s = 0;
        for (int r = 0; r < n; r++) s += fval(r, i);
        if (a[i] != s) FAIL("rank %d: big all_reduce [%zu] = %g, expected %g", rank, i, a[i], s);
    }
    /* broadcast from a rank of host B */
    int root = n - 1;
    for (size_t i = 0; i < BIG; i++) a[i] = rank == root ? fval(root, i) : -1.0f;
    ASSERT_OK(tdist_broadcast(pg, a, BIG, TDIST_F32, root, NULL, NULL));
    for (size_t i = 0; i < BIG; i++)
        if (a[i] != fval(root, i)) FAIL("rank %d: big broadcast [%zu] = %g", rank, i, a[i]);
    /* all_gather of a quarter each */
    size_t q = BIG / 4;
    for (size_t i = 0; i < q; i++) a[i] = fval(rank, i);
    ASSERT_OK(tdist_all_gather(pg, a, b, q, TDIST_F32, NULL, NULL));
    for (int r = 0; r < n; r++)
        for (size_t i = 0; i < q; i++)
            if (b[(size_t)r * q + i] != fval(r, i)) FAIL("rank %d: big all_gather block %d [%zu]", rank, r, i);
    /* reduce_scatter of the same size */
    for (size_t i = 0; i < (size_t)n * q; i++) b[i] = fval(rank, i);
    ASSERT_OK(tdist_reduce_scatter(pg, b, a, q, TDIST_F32, TDIST_SUM, NULL, NULL));
    for (size_t i = 0; i < q; i++) {
        float s = 0;
        for (int r = 0; r < n; r++) s += fval(r, (size_t)rank * q + i);
        if (a[i] != s) FAIL("rank %d: big reduce_scatter [%zu] = %g, expected %g", rank, i, a[i], s);
    }
    free(a);
    free(b);
}

static void every_collective(tdist_pg_t *pg)
{
    int rank = tdist_pg_rank(pg), n = tdist_pg_size(pg);
    int32_t send[NR * K], recv[NR * K], ref[NR * K];
    for (int i = 0; i < n * K; i++) send[i] = val(rank, (size_t)i);

    int32_t b[K];
    for (int i = 0; i < K; i++) b[i] = rank == n - 1 ? val(n - 1, (size_t)i) : -1;
    ASSERT_OK(tdist_broadcast(pg, b, K, TDIST_I32, n - 1, NULL, NULL));
    for (int i = 0; i < K; i++) ASSERT_EQ(b[i], val(n - 1, (size_t)i));

    ASSERT_OK(tdist_all_reduce(pg, send, recv, K, TDIST_I32, TDIST_SUM, NULL, NULL));
    for (int i = 0; i < K; i++) {
        int32_t s = 0;
        for (int r = 0; r < n; r++) s += val(r, (size_t)i);
        ASSERT_EQ(recv[i], s);
    }
    memcpy(recv, send, sizeof send);
    ASSERT_OK(tdist_all_reduce(pg, recv, recv, K, TDIST_I32, TDIST_MAX, NULL, NULL));
    for (int i = 0; i < K; i++) ASSERT_EQ(recv[i], val(n - 1, (size_t)i));
    memcpy(recv, send, sizeof send);
    ASSERT_OK(tdist_all_reduce(pg, recv, recv, K, TDIST_I32, TDIST_MIN, NULL, NULL));
    for (int i = 0; i < K; i++) ASSERT_EQ(recv[i], val(0, (size_t)i));

    float fs[3] = {1, 2, 3}, fr[3];
    tdist_coll_opts_t co;
    tdist_coll_opts_init(&co);
    co.premul_factor = 0.5;
    ASSERT_OK(tdist_all_reduce(pg, fs, fr, 3, TDIST_F32, TDIST_PREMUL_SUM, &co, NULL));
    for (int i = 0; i < 3; i++) ASSERT_TRUE(fr[i] == 0.5f * (float)(i + 1) * (float)n);
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
    int64_t qv[2] = {rank + 1, (int64_t)1 << rank};
    ASSERT_OK(tdist_all_reduce(pg, qv, qv, 1, TDIST_I64, TDIST_PROD, NULL, NULL));
    int64_t fact = 1;
    for (int r = 1; r <= n; r++) fact *= r;
    ASSERT_EQ(qv[0], fact);
    ASSERT_OK(tdist_all_reduce(pg, qv + 1, qv + 1, 1, TDIST_I64, TDIST_BXOR, NULL, NULL));
    ASSERT_EQ(qv[1], ((int64_t)1 << n) - 1);

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

    ASSERT_OK(tdist_all_gather(pg, send, recv, K, TDIST_I32, NULL, NULL));
    for (int r = 0; r < n; r++)
        for (int i = 0; i < K; i++) ASSERT_EQ(recv[r * K + i], val(r, (size_t)i));

    size_t counts[NR];
    for (int r = 0; r < n; r++) counts[r] = (size_t)r + 1;
    ASSERT_OK(tdist_all_gatherv(pg, send, recv, counts, TDIST_I32, NULL, NULL));
    size_t off = 0;
    for (int r = 0; r < n; r++)
        for (size_t i = 0; i < counts[r]; i++) ASSERT_EQ(recv[off++], val(r, i));

    memset(recv, 0, sizeof recv);
    ASSERT_OK(tdist_gather(pg, send, rank == n - 1 ? recv : NULL, K, TDIST_I32, n - 1, NULL, NULL));
    if (rank == n - 1)
        for (int r = 0; r < n; r++)
            for (int i = 0; i < K; i++) ASSERT_EQ(recv[r * K + i], val(r, (size_t)i));
    ASSERT_OK(tdist_scatter(pg, rank == 0 ? send : NULL, recv, K, TDIST_I32, 0, NULL, NULL));
    for (int i = 0; i < K; i++) ASSERT_EQ(recv[i], val(0, (size_t)(rank * K + i)));

    ASSERT_OK(tdist_reduce_scatter(pg, send, recv, K, TDIST_I32, TDIST_SUM, NULL, NULL));
    for (int i = 0; i < K; i++) {
        int32_t s = 0;
        for (int r = 0; r < n; r++) s += val(r, (size_t)(rank * K + i));
        ASSERT_EQ(recv[i], s);
    }

    ASSERT_OK(tdist_all_to_all(pg, send, recv, K, TDIST_I32, NULL, NULL));
    for (int r = 0; r < n; r++)
        for (int i = 0; i < K; i++) ASSERT_EQ(recv[r * K + i], val(r, (size_t)(rank * K + i)));
    memcpy(ref, send, sizeof send);
    ASSERT_OK(tdist_all_to_all(pg, ref, ref, K, TDIST_I32, NULL, NULL));
    ASSERT_MEMEQ(ref, recv, (size_t)(n * K) * sizeof(int32_t));

    size_t sc[NR], rc[NR];
    for (int p = 0; p < n; p++) {
        sc[p] = (size_t)((rank + p) % 3);
        rc[p] = (size_t)((p + rank) % 3);
    }
    ASSERT_OK(tdist_all_to_allv(pg, send, sc, recv, rc, TDIST_I32, NULL, NULL));
    off = 0;
    for (int p = 0; p < n; p++) {
        size_t soff = 0;
        for (int q = 0; q < rank; q++) soff += (size_t)((p + q) % 3);
        for (size_t i = 0; i < rc[p]; i++) ASSERT_EQ(recv[off++], val(p, soff + i));
    }

    ASSERT_OK(tdist_barrier(pg, NULL, NULL));
    ASSERT_OK(tdist_monitored_barrier(pg, NULL));

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

    /* p2p ring (crosses the hosts twice) */
    if (n > 1) {
        int right = (rank + 1) % n, left = (rank - 1 + n) % n;
        for (int round = 0; round < 3; round++) {
            int32_t out[K], in[K];
            for (int i = 0; i < K; i++) out[i] = val(rank, (size_t)(i + round));
            tdist_work_t *wr = NULL, *ws = NULL;
            ASSERT_OK(tdist_recv(pg, in, K, TDIST_I32, left, NULL, &wr));
            ASSERT_OK(tdist_send(pg, out, K, TDIST_I32, right, NULL, &ws));
            ASSERT_OK(tdist_work_wait(wr, (int64_t)(10000 * tdist_test_timeout_mult())));
            ASSERT_OK(tdist_work_wait(ws, (int64_t)(10000 * tdist_test_timeout_mult())));
            tdist_work_free(wr);
            tdist_work_free(ws);
            for (int i = 0; i < K; i++) ASSERT_EQ(in[i], val(left, (size_t)(i + round)));
        }
    }
    ASSERT_OK(tdist_barrier(pg, NULL, NULL));
}

static void coll_body(int rank, int n, void *arg)
{
    const coll_arg_t *a = arg;
    tdist_world_t *w;
    ASSERT_OK(tdist_init("env://", NULL, &w));
    /* same host name everywhere; the namespaces make two hosts */
    ASSERT_EQ(tdist_world_local_size(w), PER_HOST);
    ASSERT_EQ(tdist_world_local_rank(w), rank % PER_HOST);
    /* traffic stays on the veth pair: each rank listens on its own host's address */
    const char *bind = NULL;
    ASSERT_OK(tdist__world_bind_addr(w, &bind));
    ASSERT_STREQ(bind, a->t->addr[rank / PER_HOST]);

    tdist_pg_opts_t o;
    tdist_pg_opts_init(&o);
    o.timeout_ms = (int64_t)(20000 * tdist_test_timeout_mult());
    tdist_pg_t *pg = NULL;
    ASSERT_OK(tdist_pg_create_world(w, &o, &pg));
    every_collective(pg);
    check_big(pg, rank, n);

    /* subgroups: one per host (split), and one across the hosts */
    tdist_pg_t *host = NULL, *cross = NULL;
    ASSERT_OK(tdist_pg_split(pg, rank / PER_HOST, rank, NULL, &host));
    ASSERT_TRUE(host != NULL);
    ASSERT_EQ(tdist_pg_size(host), PER_HOST);
    int32_t v = rank, s = 0;
    ASSERT_OK(tdist_all_reduce(host, &v, &s, 1, TDIST_I32, TDIST_SUM, NULL, NULL));
    ASSERT_EQ(s, rank / PER_HOST == 0 ? 0 + 1 : 2 + 3);
    int pair[2] = {1, 2}; /* A's second rank and B's first */
    ASSERT_OK(tdist_pg_new_group(pg, pair, 2, NULL, &cross));
    if (rank == 1 || rank == 2) {
        ASSERT_TRUE(cross != NULL);
        every_collective(cross);
    } else {
        ASSERT_TRUE(cross == NULL);
    }
    tdist_pg_destroy(cross);
    tdist_pg_destroy(host);
    ASSERT_OK(tdist_barrier(pg, NULL, NULL));
    tdist_pg_destroy(pg);
    tdist_world_destroy(w);
}

TEST(net_netns_every_collective_2x2, 60)
{
    netns_topo_t t;
    if (!netns_setup(&t, "net_netns_every_collective_2x2")) return;
    coll_arg_t a = {.t = &t};
    netns_ranks_t o = {.n = NR, .per_host = PER_HOST,
                       .timeout_ms = 50000 * tdist_test_timeout_mult()};
    netns_run_ranks(&t, &o, coll_body, &a);
    netns_teardown(&t);
    ASSERT_FALSE(netns_exists(t.ns[0]));
    ASSERT_FALSE(netns_exists(t.ns[1]));
}

/* TDIST_SOCKET_IFNAME as a prefix both veth ends share ("tdv<pid>"):
 * each host picks its own end; "lo" and the stranger's name are not
 * candidates. */
static void ifname_body(int rank, int n, void *arg)
{
    (void)n;
    const coll_arg_t *a = arg;
    char addr[TDIST__IFADDR_MAX], ifname[TDIST__IFNAME_MAX];
    const char *how = NULL;
    ASSERT_OK(tdist__iface_select(a->t->addr[0], NETNS_STORE_PORT, addr, sizeof addr, ifname,
                                  sizeof ifname, &how));
    ASSERT_STREQ(how, "TDIST_SOCKET_IFNAME");
    ASSERT_STREQ(addr, a->t->addr[rank / PER_HOST]);
    ASSERT_STREQ(ifname, a->t->veth[rank / PER_HOST]);
    tdist_world_t *w;
    ASSERT_OK(tdist_init("env://", NULL, &w));
    tdist_pg_t *pg = NULL;
    tdist_pg_opts_t o;
    tdist_pg_opts_init(&o);
    o.timeout_ms = (int64_t)(20000 * tdist_test_timeout_mult());
    ASSERT_OK(tdist_pg_create_world(w, &o, &pg));
    const char *bind = NULL;
    ASSERT_OK(tdist__world_bind_addr(w, &bind));
    ASSERT_STREQ(bind, a->t->addr[rank / PER_HOST]);
    int32_t v = 1 << rank, s = 0;
    ASSERT_OK(tdist_all_reduce(pg, &v, &s, 1, TDIST_I32, TDIST_BOR, NULL, NULL));
    ASSERT_EQ(s, 15);
    tdist_pg_destroy(pg);
    tdist_world_destroy(w);
}

TEST(net_netns_socket_ifname_prefix, 60)
{
    netns_topo_t t;
    if (!netns_setup(&t, "net_netns_socket_ifname_prefix")) return;
    coll_arg_t a = {.t = &t};
    char var[64];
    snprintf(var, sizeof var, "TDIST_SOCKET_IFNAME=%s", t.prefix);
    const char *env[] = {var, NULL};
    netns_ranks_t o = {.n = NR, .per_host = PER_HOST, .env = env,
                       .timeout_ms = 40000 * tdist_test_timeout_mult()};
    netns_run_ranks(&t, &o, ifname_body, &a);
    netns_teardown(&t);
}
