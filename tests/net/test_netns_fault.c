/* tests/net/test_netns_fault.c — tdist on a bad network: two hosts x 2
 * ranks (network namespaces) joined by tdist_netfault's userspace link
 * (tests/net/netfault.h), on kernels without netem.
 *
 * net_fault_bad_link_bit_identical: the same work on a clean link and on
 * one with 50 ms +- 10 ms one-way delay, 3% loss and a 10 Mbit/s limit
 * from the start, the group's set-up included. The group's deadline is
 * T = 20 x the worst round trip (2.4 s), its set-up deadline S = 60 s
 * (setting up takes tens of round trips, more than T on the bad link);
 * the set-up and every call must succeed (no spurious timeout) and every
 * result must be the same bits as on the clean link. The work: all_reduce at four sizes (tiny, fused, larger,
 * AVG), a broadcast from a rank on the other host, and a DDP run (three
 * parameters in several buckets, SGD with momentum, a buffer broadcast
 * from rank 0). The relay's counters must show losses both ways, and
 * five tiny all_reduces must take at least two round trips (the link
 * really was slow).
 *
 * net_fault_blackhole_fails_like_stopped_peer: the link starts dropping
 * everything while the ranks loop on all_reduce (T = 2 s): every rank's
 * pending collective fails with a timeout, as with a SIGSTOPped peer, in
 * [0.9 T, T + 1 s] from its start and within T + 1 s of the cut. (The
 * store lives on host A; store calls are bounded at 10 s so the test
 * ends where a failure path waits on an unreachable store.)
 *
 * net_fault_setup_deadline_bounds_a_dead_link: the link starts dropping
 * everything just before the ranks create their group, with T = 60 s and
 * a set-up deadline S = 2 s: every rank's creation fails with a timeout
 * in [0.9 S, S + 1 s] — bounded by S, not by T nor by the store's timeout.
 *
 * net_fault_stall_shorter_than_deadline: the link holds every packet for
 * 1 s while collectives run (T = 4 s); every call succeeds with the
 * right sum. net_fault_reset_fails_not_hangs: both ends of every TCP
 * connection get a reset mid-loop; every rank fails with an error long
 * before T (20 s). net_fault_relay_shapes_the_link checks the link itself
 * with one TCP transfer: delay, rate and loss as asked. */
#include <inttypes.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/socket.h>

#include "core/internal.h" /* tdist__fnv1a: the library's one hash */
#include "mesh.h"
#include "netfault.h"
#include "tdist/ddp.h"
#include "tdist/optim.h"

#define NR 4
#define PER_HOST 2
#define NHASH 7 /* 4 all_reduce results, broadcast, DDP params, DDP buffer */
#define RTT_MAX_MS (2 * (50 + 10))
#define SETUP_MS 60000 /* the bad-link test's set-up deadline */

typedef struct shared {
    double t_cut;          /* when the fault was asked for (ms, test clock) */
    double elapsed[NR];    /* the failing call's duration */
    double latency[NR];    /* its end minus t_cut */
    double tiny_ms[NR];    /* fastest tiny all_reduce */
    double setup_ms[NR];   /* the group's creation */
    int status[NR];        /* its status */
    char msg[NR][400];
    atomic_int past_barrier; /* ranks out of the barrier before the fault */
} shared_t;

typedef struct arg {
    const char *phase;
    int64_t timeout_ms;
    const netfault_t *f;
    shared_t *sh;
    bool survive; /* fault_body: the fault must not fail a call */
    int64_t setup_timeout_ms; /* the group's set-up deadline (0: the same as timeout_ms) */
} arg_t;

static void fill(float *x, size_t cnt, uint64_t seed)
{
    uint64_t r = seed * 0x9e3779b97f4a7c15ull + 1;
    for (size_t i = 0; i < cnt; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((double)(r >> 11) / 9007199254740992.0 - 0.5) * (float)(1 + i % 97);
    }
}

/* The world group's options: timeout_ms the deadline of every collective,
 * setup_ms the set-up's (0: the same). */
static tdist_pg_opts_t group_opts(int64_t timeout_ms, int64_t setup_ms)
{
    tdist_pg_opts_t o;
    tdist_pg_opts_init(&o);
    o.timeout_ms = timeout_ms;
    o.setup_timeout_ms = setup_ms;
    return o;
}

/* The world (two hosts) and its group; *setup_ms (may be NULL) gets how
 * long the group's creation took. */
static tdist_pg_t *open_group(tdist_world_t **w, int64_t timeout_ms, int64_t setup_timeout_ms,
                              double *setup_ms)
{
    ASSERT_OK(tdist_init("env://", NULL, w));
    ASSERT_EQ(tdist_world_local_size(*w), PER_HOST); /* two hosts */
    tdist_pg_opts_t o = group_opts(timeout_ms, setup_timeout_ms);
    tdist_pg_t *pg = NULL;
    double t0 = tdist_test_now_ms();
    ASSERT_OK(tdist_pg_create_world(*w, &o, &pg));
    if (setup_ms) *setup_ms = tdist_test_now_ms() - t0;
    return pg;
}

/* A DDP run without a model: gradients are a fixed function of the
 * parameters, the rank and the step; SGD with momentum. */
static void ddp_run(tdist_pg_t *pg, int rank, uint64_t *hp, uint64_t *hb)
{
    enum { NP = 3, STEPS = 3 };
    const size_t cnt[NP] = {3000, 200, 5000};
    float *p[NP], *g[NP], buf[64];
    tdist_ddp_param_t dp[NP];
    tdist_optim_param_t op[NP];
    for (int i = 0; i < NP; i++) {
        p[i] = malloc(cnt[i] * sizeof(float));
        g[i] = malloc(cnt[i] * sizeof(float));
        ASSERT_TRUE(p[i] && g[i]);
        fill(p[i], cnt[i], 100 + (uint64_t)i); /* the same start everywhere */
        dp[i] = (tdist_ddp_param_t){p[i], g[i], cnt[i], TDIST_F32, "p"};
        op[i] = (tdist_optim_param_t){.param = p[i], .grad = g[i], .count = cnt[i], .name = "p"};
    }
    fill(buf, 64, 500 + (uint64_t)rank); /* differs: DDP broadcasts rank 0's */
    tdist_ddp_buffer_t db = {buf, 64, TDIST_F32, "running_mean"};
    tdist_ddp_opts_t o;
    tdist_ddp_opts_init(&o);
    o.bucket_cap_bytes = 8192; /* several buckets, several async all_reduces */
    o.first_bucket_bytes = 4096;
    tdist_ddp_t *ddp;
    ASSERT_OK(tdist_ddp_create(pg, dp, NP, &db, 1, &o, &ddp));
    tdist_optim_sgd_opts_t so;
    tdist_optim_sgd_opts_init(&so);
    so.lr = 0.05;
    so.momentum = 0.9;
    tdist_optim_t *opt;
    ASSERT_OK(tdist_optim_create_sgd(op, NP, &so, &opt));
    for (int step = 0; step < STEPS; step++) {
        ASSERT_OK(tdist_ddp_forward_begin(ddp));
        for (int i = NP - 1; i >= 0; i--) {
            for (size_t k = 0; k < cnt[i]; k++)
                g[i][k] = sinf(p[i][k] * (float)(rank + 1) + (float)step) * (float)(1 + k % 7) +
                          buf[k % 64] * 0.001f;
            ASSERT_OK(tdist_ddp_grad_ready(ddp, (size_t)i));
        }
        ASSERT_OK(tdist_ddp_backward_end(ddp));
        ASSERT_OK(tdist_optim_step(opt));
    }
    *hp = TDIST__FNV_INIT;
    for (int i = 0; i < NP; i++) *hp = tdist__fnv1a(*hp, p[i], cnt[i] * sizeof(float));
    *hb = tdist__fnv1a(TDIST__FNV_INIT, buf, sizeof buf);
    tdist_optim_destroy(opt);
    tdist_ddp_destroy(ddp);
    for (int i = 0; i < NP; i++) {
        free(p[i]);
        free(g[i]);
    }
}

/* The work of the bit-identity test; its hashes go to <tmp>/<phase>.<rank>. */
static void work_body(int rank, int n, void *argp)
{
    const arg_t *a = argp;
    tdist_world_t *w;
    /* set up within S, however long past T that takes on the bad link;
     * from here every call has the group's deadline T */
    tdist_pg_t *pg = open_group(&w, a->timeout_ms, a->setup_timeout_ms, &a->sh->setup_ms[rank]);
    uint64_t h[NHASH];
    const size_t sizes[4] = {2, 1000, 16384, 4099};
    float *x = malloc(16384 * sizeof *x);
    ASSERT_TRUE(x != NULL);
    /* five tiny all_reduces, each needing the previous one's answer from
     * the other host: at least two round trips on the bad link */
    double t0 = tdist_test_now_ms();
    for (int k = 0; k < 5; k++) {
        float v[2] = {1, (float)rank};
        ASSERT_OK(tdist_all_reduce(pg, v, v, 2, TDIST_F32, TDIST_SUM, NULL, NULL));
        ASSERT_TRUE(v[0] == (float)n);
    }
    a->sh->tiny_ms[rank] = tdist_test_now_ms() - t0;
    double slowest = 0; /* for the log: the margin to T */
    for (int s = 0; s < 4; s++) {
        fill(x, sizes[s], (uint64_t)(rank * 10 + s));
        t0 = tdist_test_now_ms();
        ASSERT_OK(tdist_all_reduce(pg, x, x, sizes[s], TDIST_F32, s < 3 ? TDIST_SUM : TDIST_AVG,
                                   NULL, NULL));
        slowest = fmax(slowest, tdist_test_now_ms() - t0);
        h[s] = tdist__fnv1a(TDIST__FNV_INIT, x, sizes[s] * sizeof *x);
    }
    fill(x, 16384, (uint64_t)(rank + 77));
    t0 = tdist_test_now_ms();
    ASSERT_OK(tdist_broadcast(pg, x, 16384, TDIST_F32, 2, NULL, NULL)); /* root on host B */
    slowest = fmax(slowest, tdist_test_now_ms() - t0);
    h[4] = tdist__fnv1a(TDIST__FNV_INIT, x, 16384 * sizeof *x);
    t0 = tdist_test_now_ms();
    ddp_run(pg, rank, &h[5], &h[6]);
    fprintf(stderr, "%s rank %d: slowest all_reduce/broadcast %.0f ms, DDP (3 steps) %.0f ms; "
            "T %lld ms\n", a->phase, rank, slowest, tdist_test_now_ms() - t0,
            (long long)a->timeout_ms);
    uint64_t all[NR][NHASH];
    ASSERT_OK(tdist_all_gather(pg, h, all, NHASH, TDIST_I64, NULL, NULL));
    for (int q = 0; q < n; q++)
        for (int s = 0; s < NHASH; s++)
            if (all[q][s] != h[s])
                FAIL("%s: rank %d result %d hashes to %016" PRIx64 ", rank %d's to %016" PRIx64,
                     a->phase, rank, s, h[s], q, all[q][s]);
    char path[512];
    snprintf(path, sizeof path, "%s/%s.%d", tdist_test_tmpdir(), a->phase, rank);
    FILE *f = fopen(path, "w");
    ASSERT_TRUE(f != NULL);
    for (int s = 0; s < NHASH; s++) fprintf(f, "%016" PRIx64 "\n", h[s]);
    ASSERT_EQ(fclose(f), 0);
    free(x);
    tdist_pg_destroy(pg);
    tdist_world_destroy(w);
}

static void compare_phases(const char *a, const char *b)
{
    for (int r = 0; r < NR; r++) {
        char pa[512], pb[512];
        snprintf(pa, sizeof pa, "%s/%s.%d", tdist_test_tmpdir(), a, r);
        snprintf(pb, sizeof pb, "%s/%s.%d", tdist_test_tmpdir(), b, r);
        char *x = slurp(pa), *y = slurp(pb);
        ASSERT_EQ(strlen(x), NHASH * 17);
        if (strcmp(x, y) != 0)
            FAIL("rank %d: results differ (0-3 all_reduce, 4 broadcast, 5-6 DDP):\n%s:\n%s%s:\n%s",
                 r, a, x, b, y);
        free(x);
        free(y);
    }
}

/* One phase: relay with o's faults, the ranks, the relay's counters.
 * false (after SKIP and the teardown) when the relay cannot run here. */
static bool run_phase(netns_topo_t *t, const netfault_opts_t *fo, int port, tdist_rank_fn body,
                      arg_t *a, netfault_counts_t c[2], const char *test)
{
    netfault_t f;
    if (!netfault_start(t, &f, fo, test)) {
        netns_teardown(t);
        SKIP("the fault relay cannot run here (its reason is above)");
    }
    a->f = &f;
    netns_ranks_t o = {.n = NR, .per_host = PER_HOST, .port = port,
                       .timeout_ms = 120000 * tdist_test_timeout_mult()};
    double t0 = tdist_test_now_ms();
    netns_run_ranks(t, &o, body, a);
    fprintf(stderr, "%s: %s phase %.0f ms\n", test, a->phase, tdist_test_now_ms() - t0);
    netfault_stop(&f, c);
    return true;
}

TEST(net_fault_bad_link_bit_identical, 150)
{
    const char *name = "net_fault_bad_link_bit_identical";
    netns_topo_t t;
    if (!netns_setup(&t, name)) return;
    shared_t *sh = shared_alloc(sizeof *sh);
    netfault_counts_t c[2];
    arg_t a = {.phase = "clean", .timeout_ms = 20 * RTT_MAX_MS, .sh = sh,
               .setup_timeout_ms = SETUP_MS};
    netfault_opts_t clean = {0};
    if (!run_phase(&t, &clean, NETNS_STORE_PORT, work_body, &a, c, name)) return;
    fprintf(stderr, "%s: clean link: set-up %.0f %.0f %.0f %.0f ms\n", name, sh->setup_ms[0],
            sh->setup_ms[1], sh->setup_ms[2], sh->setup_ms[3]);
    ASSERT_EQ(c[0].loss + c[1].loss + c[0].queue + c[1].queue, 0);

    /* the bad link; rebuilt, so it starts empty */
    netns_teardown(&t);
    if (!netns_setup(&t, name)) return;
    netfault_opts_t bad = {.delay_ms = 50, .jitter_ms = 10, .loss_pct = 3, .rate_mbit = 10};
    a.phase = "bad";
    if (!run_phase(&t, &bad, NETNS_STORE_PORT, work_body, &a, c, name)) return;
    fprintf(stderr, "%s: bad link: set-up %.0f %.0f %.0f %.0f ms (T %lld ms, set-up deadline "
            "%d ms)\n", name, sh->setup_ms[0], sh->setup_ms[1], sh->setup_ms[2], sh->setup_ms[3],
            (long long)a.timeout_ms, SETUP_MS);
    unsigned long long in = c[0].in + c[1].in, lost = c[0].loss + c[1].loss;
    fprintf(stderr, "%s: bad link: %llu packets, %llu lost (%.2f%%), %llu dropped at the queue; "
            "5 tiny all_reduces per rank %.1f %.1f %.1f %.1f ms\n", name, in, lost,
            in ? 100.0 * (double)lost / (double)in : 0.0, c[0].queue + c[1].queue, sh->tiny_ms[0],
            sh->tiny_ms[1], sh->tiny_ms[2], sh->tiny_ms[3]);
    ASSERT_TRUE(c[0].loss > 0 && c[1].loss > 0); /* losses both ways */
    /* five dependent exchanges take at least two round trips */
    for (int r = 0; r < NR; r++) ASSERT_TRUE(sh->tiny_ms[r] >= 2 * 2 * (50 - 10));
    compare_phases("clean", "bad");
    munmap(sh, sizeof *sh);
    netns_teardown(&t);
}

/* Loop on all_reduce; at iteration 10 rank 0 asks the relay for the
 * fault in a->phase ("drop", "reset 3000", "stall 1000"); record the
 * first failure. With a->survive, 40 iterations must all succeed. */
static void fault_body(int rank, int n, void *argp)
{
    const arg_t *a = argp;
    tdist_world_t *w;
    setenv("TDIST_TIMEOUT_MS", "10000", 1);
    tdist_pg_t *pg = open_group(&w, a->timeout_ms, 0, NULL);
    enum { CNT = 4096 };
    float *x = malloc(CNT * sizeof *x);
    ASSERT_TRUE(x != NULL);
    double limit = tdist_test_now_ms() + 60000 * tdist_test_timeout_mult();
    bool failed = false;
    for (int it = 0; it < (a->survive ? 40 : 1000) && tdist_test_now_ms() < limit && !failed; it++) {
        if (it == 10) {
            ASSERT_OK(tdist_barrier(pg, NULL, NULL));
            atomic_fetch_add(&a->sh->past_barrier, 1);
            if (rank == 0) {
                /* A rank leaves the barrier once it has heard from every
                 * rank, while another's last barrier message may still be
                 * on the link: cut it only when every rank is out. */
                for (int i = 0; i < 20000 && atomic_load(&a->sh->past_barrier) < n; i++)
                    usleep(1000);
                a->sh->t_cut = tdist_test_now_ms();
                netfault_ctl(a->f, a->phase);
            }
        }
        for (int i = 0; i < CNT; i++) x[i] = (float)(rank + 1);
        double t0 = tdist_test_now_ms();
        tdist_status_t st = tdist_all_reduce(pg, x, x, CNT, TDIST_F32, TDIST_SUM, NULL, NULL);
        double t1 = tdist_test_now_ms();
        if (st == TDIST_OK) {
            if (x[0] != (float)(n * (n + 1) / 2)) FAIL("iteration %d: wrong sum %g", it, (double)x[0]);
            continue;
        }
        if (a->sh->t_cut == 0 || a->survive)
            FAIL("iteration %d: all_reduce failed %s the fault \"%s\" (%.0f ms): %s", it,
                 a->sh->t_cut == 0 ? "before" : "after", a->phase, t1 - t0, tdist_last_error());
        a->sh->status[rank] = st;
        a->sh->elapsed[rank] = t1 - t0;
        a->sh->latency[rank] = t1 - a->sh->t_cut;
        snprintf(a->sh->msg[rank], sizeof a->sh->msg[rank], "%s", tdist_last_error());
        failed = true;
    }
    if (!failed && !a->survive) FAIL("no all_reduce failed after the fault \"%s\"", a->phase);
    if (a->survive) a->sh->latency[rank] = tdist_test_now_ms() - a->sh->t_cut;
    free(x);
    /* the link may still be cut: what destroy does then belongs to the
     * store's own tests; this rank's answer is recorded */
    fflush(stderr);
    _exit(0);
}

/* Two fresh hosts on a 1 ms link, fault_body on them with a; false
 * when skipped. */
static bool fault_run(const char *name, arg_t *a, netfault_counts_t c[2])
{
    netns_topo_t t;
    if (!netns_setup(&t, name)) return false;
    netfault_opts_t fo = {.delay_ms = 1};
    if (!run_phase(&t, &fo, NETNS_STORE_PORT, fault_body, a, c, name)) return false;
    netns_teardown(&t);
    for (int r = 0; r < NR && !a->survive; r++)
        fprintf(stderr, "rank %d: %s after %.0f ms (%.0f ms after the fault): %s\n", r,
                tdist_status_str(a->sh->status[r]), a->sh->elapsed[r], a->sh->latency[r],
                a->sh->msg[r]);
    return true;
}

TEST(net_fault_blackhole_fails_like_stopped_peer, 60)
{
    shared_t *sh = shared_alloc(sizeof *sh);
    const int64_t T = 2000;
    arg_t a = {.phase = "drop", .timeout_ms = T, .sh = sh};
    netfault_counts_t c[2];
    if (!fault_run("net_fault_blackhole_fails_like_stopped_peer", &a, c)) return;
    for (int r = 0; r < NR; r++) {
        if (sh->status[r] != TDIST_ERR_TIMEOUT)
            FAIL("rank %d: %s, not a timeout: %s", r, tdist_status_str(sh->status[r]), sh->msg[r]);
        if (sh->elapsed[r] < 0.9 * (double)T)
            FAIL("rank %d failed after %.0f ms, before 0.9 T (T = %lld ms)", r, sh->elapsed[r],
                 (long long)T);
        if (sh->latency[r] > (double)T + 1000)
            FAIL("rank %d failed %.0f ms after the cut (T = %lld ms)", r, sh->latency[r],
                 (long long)T);
    }
    ASSERT_TRUE(c[0].blackhole + c[1].blackhole > 0);
    munmap(sh, sizeof *sh);
}

/* A barrier on the world's store under the name what: every rank sets
 * <what>/<rank> and waits for every rank's. */
static void store_barrier(tdist_store_t *s, const char *what, int rank, int n)
{
    char *keys[NR];
    for (int r = 0; r < n; r++) {
        keys[r] = malloc(64);
        ASSERT_TRUE(keys[r] != NULL);
        snprintf(keys[r], 64, "%s/%d", what, r);
    }
    ASSERT_OK(tdist_store_set(s, keys[rank], "1", 1));
    ASSERT_OK(tdist_store_wait(s, (const char *const *)keys, (size_t)n, 20000));
    for (int r = 0; r < n; r++) free(keys[r]);
}

/* The group's creation over a link that rank 0 cuts once every rank has
 * joined the world and knows it (two barriers on the store, and 50 ms for
 * the last replies to cross the 1 ms link): record how long it took and
 * how it failed. */
static void setup_body(int rank, int n, void *argp)
{
    const arg_t *a = argp;
    tdist_world_t *w;
    setenv("TDIST_TIMEOUT_MS", "30000", 1); /* the store's own: far past the set-up deadline */
    ASSERT_OK(tdist_init("env://", NULL, &w));
    tdist_store_t *s = tdist_world_store(w);
    store_barrier(s, "joined", rank, n);
    if (rank == 0) {
        const char *k[NR] = {"passed/0", "passed/1", "passed/2", "passed/3"};
        ASSERT_OK(tdist_store_set(s, k[0], "1", 1));
        ASSERT_OK(tdist_store_wait(s, k, (size_t)n, 20000));
        usleep(50000);
        a->sh->t_cut = tdist_test_now_ms();
        netfault_ctl(a->f, a->phase);
    } else {
        char key[32];
        snprintf(key, sizeof key, "passed/%d", rank);
        ASSERT_OK(tdist_store_set(s, key, "1", 1));
    }
    tdist_pg_opts_t o = group_opts(a->timeout_ms, a->setup_timeout_ms);
    tdist_pg_t *pg = NULL;
    double t0 = tdist_test_now_ms();
    tdist_status_t st = tdist_pg_create_world(w, &o, &pg);
    a->sh->elapsed[rank] = tdist_test_now_ms() - t0;
    a->sh->status[rank] = st;
    snprintf(a->sh->msg[rank], sizeof a->sh->msg[rank], "%s",
             st == TDIST_OK ? "set up" : tdist_last_error());
    fflush(stderr);
    _exit(0); /* the store may be out of reach: no destroy */
}

TEST(net_fault_setup_deadline_bounds_a_dead_link, 60)
{
    const char *name = "net_fault_setup_deadline_bounds_a_dead_link";
    shared_t *sh = shared_alloc(sizeof *sh);
    const int64_t S = 2000;
    arg_t a = {.phase = "drop", .timeout_ms = 60000, .setup_timeout_ms = S, .sh = sh};
    netns_topo_t t;
    if (!netns_setup(&t, name)) return;
    netfault_opts_t fo = {.delay_ms = 1};
    netfault_counts_t c[2];
    if (!run_phase(&t, &fo, NETNS_STORE_PORT, setup_body, &a, c, name)) return;
    netns_teardown(&t);
    for (int r = 0; r < NR; r++)
        fprintf(stderr, "rank %d: %s after %.0f ms: %s\n", r, tdist_status_str(sh->status[r]),
                sh->elapsed[r], sh->msg[r]);
    for (int r = 0; r < NR; r++) {
        if (sh->status[r] != TDIST_ERR_TIMEOUT)
            FAIL("rank %d: %s, not a timeout: %s", r, tdist_status_str(sh->status[r]), sh->msg[r]);
        if (sh->elapsed[r] < 0.9 * (double)S || sh->elapsed[r] > (double)S + 1000)
            FAIL("rank %d: the set-up failed after %.0f ms, not in [0.9 S, S + 1 s] (S = %lld "
                 "ms)", r, sh->elapsed[r], (long long)S);
    }
    ASSERT_TRUE(c[0].blackhole + c[1].blackhole > 0);
    munmap(sh, sizeof *sh);
}

TEST(net_fault_stall_shorter_than_deadline, 60)
{
    shared_t *sh = shared_alloc(sizeof *sh);
    arg_t a = {.phase = "stall 1000", .timeout_ms = 4000, .sh = sh, .survive = true};
    netfault_counts_t c[2];
    if (!fault_run("net_fault_stall_shorter_than_deadline", &a, c)) return;
    /* the stall happened: a rank's next call needs data sent after it */
    for (int r = 0; r < NR; r++)
        if (sh->latency[r] < 950)
            FAIL("rank %d ran its 30 calls after the stall in %.0f ms: the link did not stall", r,
                 sh->latency[r]);
    munmap(sh, sizeof *sh);
}

TEST(net_fault_reset_fails_not_hangs, 60)
{
    shared_t *sh = shared_alloc(sizeof *sh);
    const int64_t T = 20000;
    arg_t a = {.phase = "reset 3000", .timeout_ms = T, .sh = sh};
    netfault_counts_t c[2];
    if (!fault_run("net_fault_reset_fails_not_hangs", &a, c)) return;
    for (int r = 0; r < NR; r++)
        if (sh->latency[r] >= (double)T)
            FAIL("rank %d failed only at the deadline: %s", r, sh->msg[r]);
    ASSERT_TRUE(c[0].reset + c[1].reset > 0);
    munmap(sh, sizeof *sh);
}

/* The link itself: a TCP transfer from host A to host B through a relay
 * with 20 ms delay, 3% loss and 10 Mbit/s. The handshake takes at least
 * one round trip, 2 MiB at least 2 MiB / 10 Mbit/s (the load of the
 * machine can only make both longer), and the relay's loss counter is
 * 3% of its packets give or take 2 points (over a thousand packets:
 * several standard deviations). */
enum { SHAPE_BYTES = 2 << 20, SHAPE_PORT = 5001 };

static void shape_server(const netns_topo_t *t)
{
    int ls = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(SHAPE_PORT)};
    inet_pton(AF_INET, t->addr[1], &sa.sin_addr);
    if (ls < 0 || bind(ls, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(ls, 1) != 0) _exit(3);
    struct pollfd p = {.fd = ls, .events = POLLIN};
    if (poll(&p, 1, 30000) != 1) _exit(4);
    int c = accept(ls, NULL, NULL);
    if (c < 0) _exit(5);
    char buf[65536];
    size_t got = 0;
    for (int i = 0; i < 100000; i++) { /* bounded: SHAPE_BYTES arrive in far fewer reads */
        ssize_t r = read(c, buf, sizeof buf);
        if (r <= 0) break;
        got += (size_t)r;
    }
    if (got != SHAPE_BYTES || write(c, "k", 1) != 1) _exit(6);
    close(c);
    _exit(0);
}

TEST(net_fault_relay_shapes_the_link, 60)
{
    const char *name = "net_fault_relay_shapes_the_link";
    netns_topo_t t;
    if (!netns_setup(&t, name)) return;
    netfault_t f;
    netfault_opts_t fo = {.delay_ms = 20, .loss_pct = 3, .rate_mbit = 10};
    if (!netfault_start(&t, &f, &fo, name)) {
        netns_teardown(&t);
        SKIP("the fault relay cannot run here (its reason is above)");
    }
    fflush(stdout);
    fflush(stderr);
    pid_t parent = getpid(), srv = fork();
    ASSERT_TRUE(srv >= 0);
    if (srv == 0) {
        netns_child_init(parent);
        netns_enter(t.ns[1]);
        shape_server(&t);
    }
    pid_t cli = fork();
    ASSERT_TRUE(cli >= 0);
    if (cli == 0) { /* host A: connect (retrying until the server listens), send, wait */
        netns_child_init(parent);
        netns_enter(t.ns[0]);
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(SHAPE_PORT)};
        inet_pton(AF_INET, t.addr[1], &sa.sin_addr);
        int s = -1;
        double t0 = 0;
        for (int i = 0; i < 200 && s < 0; i++) {
            s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
            t0 = tdist_test_now_ms();
            if (connect(s, (struct sockaddr *)&sa, sizeof sa) != 0) {
                close(s);
                s = -1;
                usleep(20000);
            }
        }
        if (s < 0) FAIL("cannot connect to %s:%d through the relay", t.addr[1], SHAPE_PORT);
        double t1 = tdist_test_now_ms();
        char *buf = calloc(1, SHAPE_BYTES);
        if (!buf) FAIL("out of memory");
        size_t sent = 0;
        for (int i = 0; i < 100000 && sent < SHAPE_BYTES; i++) {
            ssize_t w = write(s, buf + sent, SHAPE_BYTES - sent);
            if (w <= 0) FAIL("write: %s", strerror(errno));
            sent += (size_t)w;
        }
        free(buf);
        shutdown(s, SHUT_WR);
        char k;
        if (read(s, &k, 1) != 1) FAIL("no answer from the server");
        double t2 = tdist_test_now_ms();
        fprintf(stderr, "%s: handshake %.1f ms, %d bytes in %.0f ms (%.2f Mbit/s)\n", name,
                t1 - t0, SHAPE_BYTES, t2 - t1, SHAPE_BYTES * 8 / (t2 - t1) / 1e3);
        if (t1 - t0 < 2 * 20 * 0.95) FAIL("the handshake took %.1f ms: no delay", t1 - t0);
        if (t2 - t1 < SHAPE_BYTES * 8 / 10e3 * 0.95)
            FAIL("%d bytes in %.0f ms: faster than 10 Mbit/s", SHAPE_BYTES, t2 - t1);
        _exit(0);
    }
    int st_cli = 0, st_srv = 0;
    double end = tdist_test_now_ms() + 40000 * tdist_test_timeout_mult();
    pid_t left[2] = {cli, srv};
    int *sts[2] = {&st_cli, &st_srv};
    for (int k = 0; k < 2; k++) {
        while (waitpid(left[k], sts[k], WNOHANG) == 0) {
            if (tdist_test_now_ms() > end) {
                kill(cli, SIGKILL);
                kill(srv, SIGKILL);
                FAIL("the transfer through the relay did not end");
            }
            usleep(5000);
        }
    }
    netfault_counts_t c[2];
    netfault_stop(&f, c);
    netns_teardown(&t);
    if (!WIFEXITED(st_cli) || WEXITSTATUS(st_cli) != 0) FAIL("the client failed (status %d)", st_cli);
    if (!WIFEXITED(st_srv) || WEXITSTATUS(st_srv) != 0) FAIL("the server failed (status %d)", st_srv);
    double lost = 100.0 * (double)(c[0].loss + c[1].loss) / (double)(c[0].in + c[1].in);
    fprintf(stderr, "%s: %.2f%% of %llu packets lost\n", name, lost, c[0].in + c[1].in);
    ASSERT_TRUE(c[0].in + c[1].in > 1000);
    if (lost < 1 || lost > 5) FAIL("%.2f%% of the packets lost, not 3%%", lost);
}
