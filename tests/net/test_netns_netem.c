/* tests/net/test_netns_netem.c — results stay bit-identical on a bad link.
 *
 * Two hosts x 2 ranks in network namespaces (tests/net/netns.h). Each
 * rank all_reduces f32 data whose sums depend on the order of the
 * additions (random values, not exactly representable sums) at three
 * sizes (the small, medium and large TCP algorithms), plus one AVG, and
 * hashes the results (FNV-1a over the bytes). The ranks run once on the
 * clean veth link and once after `tc qdisc add dev <veth> root netem
 * delay 2ms loss 1%` on both ends; every rank's hashes must be the same
 * in both runs (and the same on every rank). Where the kernel has no
 * netem queueing discipline (or tc is missing), the test skips (SKIP,
 * with tc's message). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "netns.h"
#include "proc.h"

#define NR 4
#define PER_HOST 2
#define NSIZES 3
static const size_t sizes[NSIZES] = {1000, 1 << 16, 1 << 20};

typedef struct netem_arg {
    const char *phase; /* "clean" or "netem": file name prefix */
} netem_arg_t;

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 1099511628211ull;
    }
    return h;
}

static void body(int rank, int n, void *arg)
{
    const netem_arg_t *a = arg;
    tdist_world_t *w;
    ASSERT_OK(tdist_init("env://", NULL, &w));
    ASSERT_EQ(tdist_world_local_size(w), PER_HOST);
    tdist_pg_opts_t o;
    tdist_pg_opts_init(&o);
    o.timeout_ms = (int64_t)(40000 * tdist_test_timeout_mult());
    tdist_pg_t *pg = NULL;
    ASSERT_OK(tdist_pg_create_world(w, &o, &pg));
    uint64_t h[NSIZES + 1];
    float *x = malloc(sizes[NSIZES - 1] * sizeof *x);
    ASSERT_TRUE(x != NULL);
    for (int s = 0; s <= NSIZES; s++) {
        size_t cnt = s < NSIZES ? sizes[s] : 4099;
        uint64_t r = 0x9e3779b97f4a7c15ull * (uint64_t)(rank + 1) + (uint64_t)s;
        for (size_t i = 0; i < cnt; i++) {
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            x[i] = (float)((double)(r >> 11) / 9007199254740992.0 - 0.5) * (float)(1 + i % 97);
        }
        ASSERT_OK(tdist_all_reduce(pg, x, x, cnt, TDIST_F32, s < NSIZES ? TDIST_SUM : TDIST_AVG,
                                   NULL, NULL));
        h[s] = fnv(1469598103934665603ull, x, cnt * sizeof *x);
    }
    /* the same bits on every rank */
    uint64_t all[NR][NSIZES + 1];
    ASSERT_OK(tdist_all_gather(pg, h, all, NSIZES + 1, TDIST_I64, NULL, NULL));
    for (int q = 0; q < n; q++)
        for (int s = 0; s <= NSIZES; s++)
            if (all[q][s] != h[s])
                FAIL("%s: rank %d result %d hashes to %016" PRIx64 ", rank %d's to %016" PRIx64,
                     a->phase, rank, s, h[s], q, all[q][s]);
    char path[512];
    snprintf(path, sizeof path, "%s/%s.%d", tdist_test_tmpdir(), a->phase, rank);
    FILE *f = fopen(path, "w");
    ASSERT_TRUE(f != NULL);
    for (int s = 0; s <= NSIZES; s++) fprintf(f, "%016" PRIx64 "\n", h[s]);
    ASSERT_EQ(fclose(f), 0);
    free(x);
    tdist_pg_destroy(pg);
    tdist_world_destroy(w);
}

/* Add netem on both veth ends; false (after printing why) when the
 * kernel or the tools cannot. */
static bool add_netem(netns_topo_t *t, const char *test)
{
    const char *tc = netns_find_tool("tc");
    if (!tc) {
        printf("%s: the tc tool (iproute2) is not installed\n", test);
        return false;
    }
    for (int i = 0; i < 2; i++) {
        char out[1024];
        int rc = netns_cmd((const char *const[]){tc, "-n", t->ns[i], "qdisc", "add", "dev",
                                                 t->veth[i], "root", "netem", "delay", "2ms",
                                                 "loss", "1%", NULL},
                           out, sizeof out, 10000 * tdist_test_timeout_mult());
        if (rc != 0) {
            if (i == 1) FAIL("netem works on %s but not on %s: %s", t->veth[0], t->veth[1], out);
            printf("%s: this kernel has no netem queueing discipline (tc qdisc add dev %s "
                   "root netem delay 2ms loss 1%%: %s)\n", test, t->veth[i], out);
            return false;
        }
    }
    /* it is really there */
    char out[1024];
    int rc = netns_cmd((const char *const[]){tc, "-n", t->ns[0], "qdisc", "show", "dev",
                                             t->veth[0], NULL},
                       out, sizeof out, 10000 * tdist_test_timeout_mult());
    ASSERT_EQ(rc, 0);
    ASSERT_CONTAINS(out, "netem");
    ASSERT_CONTAINS(out, "loss 1%");
    return true;
}

static void compare_phases(void)
{
    for (int r = 0; r < NR; r++) {
        char a[512], b[512];
        snprintf(a, sizeof a, "%s/clean.%d", tdist_test_tmpdir(), r);
        snprintf(b, sizeof b, "%s/netem.%d", tdist_test_tmpdir(), r);
        char *x = slurp(a), *y = slurp(b);
        if (strcmp(x, y) != 0)
            FAIL("rank %d: results differ with netem (delay 2ms, loss 1%%):\nclean:\n%snetem:\n%s", r,
                 x, y);
        ASSERT_EQ(strlen(x), (NSIZES + 1) * 17);
        free(x);
        free(y);
    }
}

TEST(net_netns_netem_bit_identical, 120)
{
    const char *name = "net_netns_netem_bit_identical";
    netns_topo_t t;
    if (!netns_setup(&t, name)) return;
    /* probe first: skip before running anything where netem is missing */
    const char *tc = netns_find_tool("tc");
    char out[1024] = "";
    int rc = tc ? netns_cmd((const char *const[]){tc, "-n", t.ns[0], "qdisc", "add", "dev",
                                                  t.veth[0], "root", "netem", "delay", "0ms", NULL},
                            out, sizeof out, 10000 * tdist_test_timeout_mult())
                : -1;
    if (rc != 0) {
        netns_teardown(&t);
        if (!tc) SKIP("the tc tool (iproute2) is not installed");
        SKIP("this kernel has no netem queueing discipline (tc qdisc add dev %s root netem: %s)",
             t.veth[0], out);
    }
    rc = netns_cmd((const char *const[]){tc, "-n", t.ns[0], "qdisc", "del", "dev", t.veth[0],
                                         "root", NULL},
                   out, sizeof out, 10000 * tdist_test_timeout_mult());
    if (rc != 0) FAIL("tc qdisc del dev %s root: %s", t.veth[0], out);

    netem_arg_t clean = {.phase = "clean"}, bad = {.phase = "netem"};
    netns_ranks_t o = {.n = NR, .per_host = PER_HOST, .port = NETNS_STORE_PORT,
                       .timeout_ms = 60000 * tdist_test_timeout_mult()};
    netns_run_ranks(&t, &o, body, &clean);
    if (!add_netem(&t, name)) {
        netns_teardown(&t);
        SKIP("netem could not be added (why is above)");
    }
    o.port = NETNS_STORE_PORT + 1;
    netns_run_ranks(&t, &o, body, &bad);
    compare_phases();
    netns_teardown(&t);
}
