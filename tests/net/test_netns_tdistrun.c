/* tests/net/test_netns_tdistrun.c — `tdistrun --nnodes 2` across two
 * hosts (network namespaces, tests/net/netns.h): one launcher per
 * namespace, node 0 hosting the store on host A's address, 2 workers
 * each. The program is this test binary's hidden test
 * net_netns_tdistrun_worker: it joins with env://, checks that the
 * rendezvous sees two hosts, builds the world group and runs
 * collectives across the hosts, and prints what it found; the test then
 * checks both launchers' output. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "init/internal.h"
#include "netns.h"
#include "proc.h"

#define TDISTRUN TDIST_BIN_DIR "/tools/tdistrun/tdistrun"
#define ADDR_LEN 32

/* Run by the launchers only (TDIST_NETNS_WORKER=1), never by ctest. */
TEST_HIDDEN(net_netns_tdistrun_worker, 60)
{
    if (!getenv("TDIST_NETNS_WORKER")) {
        SKIP("a worker that net_netns_tdistrun_two_nodes starts through tdistrun");
    }
    tdist_world_t *w;
    ASSERT_OK(tdist_init("env://", NULL, &w));
    int rank = tdist_world_rank(w), n = tdist_world_size(w);
    ASSERT_EQ(n, 4);
    ASSERT_EQ(tdist_world_local_size(w), 2); /* two hosts with one host name */
    tdist_pg_opts_t o;
    tdist_pg_opts_init(&o);
    o.timeout_ms = (int64_t)(20000 * tdist_test_timeout_mult());
    tdist_pg_t *pg = NULL;
    ASSERT_OK(tdist_pg_create_world(w, &o, &pg));
    const char *bind = NULL;
    ASSERT_OK(tdist__world_bind_addr(w, &bind));

    int64_t v = rank + 1, sum = 0;
    ASSERT_OK(tdist_all_reduce(pg, &v, &sum, 1, TDIST_I64, TDIST_SUM, NULL, NULL));
    ASSERT_EQ(sum, 10);
    char mine[ADDR_LEN] = {0}, all[4][ADDR_LEN];
    snprintf(mine, sizeof mine, "%s", bind);
    ASSERT_OK(tdist_all_gather(pg, mine, all, ADDR_LEN, TDIST_U8, NULL, NULL));
    float big[4096];
    for (int i = 0; i < 4096; i++) big[i] = (float)(rank * 4096 + i);
    ASSERT_OK(tdist_all_reduce(pg, big, big, 4096, TDIST_F32, TDIST_MAX, NULL, NULL));
    for (int i = 0; i < 4096; i++) ASSERT_TRUE(big[i] == (float)(3 * 4096 + i));
    printf("rank %d/%d local %d/%d bind %s sum %lld addrs %s %s %s %s\n", rank, n,
           tdist_world_local_rank(w), tdist_world_local_size(w), bind, (long long)sum, all[0],
           all[1], all[2], all[3]);
    fflush(stdout);
    tdist_pg_destroy(pg);
    tdist_world_destroy(w);
}

#define ASSERT_EXIT0(r, who)                                                   \
    do {                                                                       \
        if (!(r).exited || (r).code != 0)                                      \
            FAIL("%s: expected exit 0, got %s %d\n--- stdout:\n%s\n--- stderr:\n%s", who, \
                 (r).exited ? "exit" : "signal", (r).exited ? (r).code : (r).sig, (r).out, \
                 (r).err);                                                     \
    } while (0)

TEST(net_netns_tdistrun_two_nodes, 90)
{
    netns_topo_t t;
    if (!netns_setup(&t, "net_netns_tdistrun_two_nodes")) return;
    if (access(TDISTRUN, X_OK) != 0) FAIL("%s is not built", TDISTRUN);
    char self[512];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    ASSERT_TRUE(len > 0);
    self[len] = '\0';
    char port[16];
    snprintf(port, sizeof port, "%d", NETNS_STORE_PORT);
    const char *env[] = {"TDIST_NETNS_WORKER=1", NULL};
    const char *node0[] = {TDISTRUN, "--nnodes", "2", "--node-rank", "0", "--nproc-per-node", "2",
                           "--master-addr", t.addr[0], "--master-port", port, "--grace-period",
                           "1", self, "net_netns_tdistrun_worker", NULL};
    const char *node1[] = {TDISTRUN, "--nnodes", "2", "--node-rank", "1", "--nproc-per-node", "2",
                           "--master-addr", t.addr[0], "--master-port", port, "--grace-period",
                           "1", self, "net_netns_tdistrun_worker", NULL};
    double start = tdist_test_now_ms();
    pid_t p1 = netns_spawn(t.ns[1], node1, env, "node1"); /* retries until the store is up */
    pid_t p0 = netns_spawn(t.ns[0], node0, env, "node0");
    run_t r0, r1;
    wait_for(p0, 60000 * tdist_test_timeout_mult(), "node0", start, &r0);
    wait_for(p1, 60000 * tdist_test_timeout_mult(), "node1", start, &r1);
    ASSERT_EXIT0(r0, "node 0");
    ASSERT_EXIT0(r1, "node 1");
    char want[256];
    snprintf(want, sizeof want, "store hosted here on %s:%d", t.addr[0], NETNS_STORE_PORT);
    ASSERT_CONTAINS(r0.err, want);
    snprintf(want, sizeof want, "store of node 0 at %s:%d", t.addr[0], NETNS_STORE_PORT);
    ASSERT_CONTAINS(r1.err, want);
    ASSERT_CONTAINS(r0.err, "all 2 nodes finished");
    ASSERT_CONTAINS(r1.err, "all 2 nodes finished");
    /* every worker: two hosts, its own host's address, the same view of all four */
    const char *out[2] = {r0.out, r1.out};
    for (int r = 0; r < 4; r++) {
        int h = r / 2;
        snprintf(want, sizeof want,
                 "[rank %d] rank %d/4 local %d/2 bind %s sum 10 addrs %s %s %s %s\n", r, r, r % 2,
                 t.addr[h], t.addr[0], t.addr[0], t.addr[1], t.addr[1]);
        ASSERT_CONTAINS(out[h], want);
        snprintf(want, sizeof want, "[rank %d] PASS net_netns_tdistrun_worker", r);
        ASSERT_CONTAINS(out[h], want);
    }
    run_free(&r0);
    run_free(&r1);
    netns_teardown(&t);
}
