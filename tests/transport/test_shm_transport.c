/* tests/transport/test_shm_transport.c — the shared-memory transport on
 * real processes: full-mesh exchange at several world sizes with every
 * byte checked, a 16 MiB ring, 64 MiB sendrecv both ways (bigger than a
 * ring), ordering of many small messages, set-up deadlines, peers that
 * are killed, exit or stop, abort from another thread, no /dev/shm
 * segment and no fd left behind, 8 ranks on 2 cores without livelock.
 *
 * Ranks exchange transport addresses through the harness's store:
 * tdist_init("env://"), set "tp/<rank>", multi_get every rank's key. */
#include <dirent.h>
#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "mesh.h"

#define TAG 0x7464697374303031ull

/* This file's mesh: shm. */
static void tp_open(tp_rank_t *t, int rank, int n, const char *bind, uint64_t tag)
{
    mesh_open(t, TDIST__TP_SHM, rank, n, bind, tag);
}

/* Wait until every rank has set "<name>/<rank>". */
static void store_barrier(tp_rank_t *t, const char *name) { mesh_barrier(t, name, t->n); }

/* The pid in a published shm address "shm:/<name>:<pid>". */
static int addr_pid(const char *addr)
{
    const char *c = strrchr(addr, ':');
    if (!c) FAIL("address \"%s\" has no pid", addr);
    return atoi(c + 1);
}

/* Whether the segment an address "shm:/<name>:<pid>" names is still in
 * /dev/shm (its exact name: another, stale segment of an earlier process
 * with the same pid does not count). */
static bool addr_segment_exists(const char *addr)
{
    const char *from = strchr(addr, '/'), *to = strrchr(addr, ':');
    if (!from || !to || to < from) FAIL("address \"%s\" names no segment", addr);
    char path[128];
    snprintf(path, sizeof path, "/dev/shm%.*s", (int)(to - from), from);
    return access(path, F_OK) == 0;
}

/* Entries /dev/shm/tdist-<pid>-* of this pid. */
static int shm_entries(int pid)
{
    char pre[32];
    int n = snprintf(pre, sizeof pre, "tdist-%d-", pid);
    DIR *d = opendir("/dev/shm");
    if (!d) FAIL("opendir /dev/shm: %s", strerror(errno));
    int found = 0;
    for (struct dirent *e = readdir(d); e; e = readdir(d))
        if (strncmp(e->d_name, pre, (size_t)n) == 0) found++;
    closedir(d);
    return found;
}

/* ---------------------------------------------- every pair, every size */

static const size_t pair_sizes[] = {0, 1, 7, 4096, (1u << 20) + 3};
#define NSIZES ((int)(sizeof pair_sizes / sizeof pair_sizes[0]))

static void pairs_body(int rank, int n, void *arg)
{
    (void)arg;
    int fds_before = tdist_test_count_fds();
    tp_rank_t t;
    tp_open(&t, rank, n, NULL, TAG);
    tp_connect(&t);
    int nreq = 2 * NSIZES * (n - 1), k = 0;
    tdist__tp_req_t *reqs = calloc((size_t)TDIST_MAX(nreq, 1), sizeof *reqs);
    tdist__tp_req_t **rp = calloc((size_t)TDIST_MAX(nreq, 1), sizeof *rp);
    uint8_t **bufs = calloc((size_t)TDIST_MAX(nreq, 1), sizeof *bufs);
    ASSERT_TRUE(reqs && rp && bufs);
    /* Post everything, sends and receives interleaved, then wait once. */
    for (int i = 0; i < NSIZES; i++) {
        for (int d = 1; d < n; d++) {
            int to = (rank + d) % n, from = (rank - d + n) % n;
            size_t len = pair_sizes[i];
            bufs[k] = malloc(len + 1);
            ASSERT_TRUE(bufs[k] != NULL);
            mesh_fill(bufs[k], len, rank, to, i);
            ASSERT_OK(tdist__tp_post_send(t.tp, &reqs[k], to, bufs[k], len));
            rp[k] = &reqs[k];
            k++;
            bufs[k] = malloc(len + 1);
            ASSERT_TRUE(bufs[k] != NULL);
            memset(bufs[k], 0xee, len + 1);
            ASSERT_OK(tdist__tp_post_recv(t.tp, &reqs[k], from, bufs[k], len));
            rp[k] = &reqs[k];
            k++;
        }
    }
    ASSERT_EQ(k, nreq);
    ASSERT_OK(tdist__tp_wait(t.tp, rp, (size_t)nreq, deadline_in(20000)));
    /* Every peer is through connect: every segment is unlinked. */
    for (int r = 0; r < n; r++)
        if (addr_segment_exists(t.addrs[r]))
            FAIL("rank %d's segment (%s) is still in /dev/shm after connect", r, t.addrs[r]);
    k = 0;
    for (int i = 0; i < NSIZES; i++) {
        for (int d = 1; d < n; d++) {
            int from = (rank - d + n) % n;
            ASSERT_TRUE(tdist__tp_req_done(&reqs[k]));
            ASSERT_OK(tdist__tp_req_status(&reqs[k]));
            k++;
            ASSERT_TRUE(tdist__tp_req_done(&reqs[k]));
            ASSERT_OK(tdist__tp_req_status(&reqs[k]));
            mesh_check(bufs[k], pair_sizes[i], from, rank, i);
            ASSERT_EQ(bufs[k][pair_sizes[i]], 0xee); /* nothing past len */
            k++;
        }
    }
    for (int i = 0; i < nreq; i++) free(bufs[i]);
    free(bufs);
    free(reqs);
    free(rp);
    store_barrier(&t, "pairs-done"); /* nobody closes while others still read */
    tp_close(&t);
    ASSERT_EQ(tdist_test_count_fds(), fds_before);
}

TEST(transport_shm_pairs_w1, 30) { tdist_test_run_ranks(1, pairs_body, NULL); }
TEST(transport_shm_pairs_w2, 30) { tdist_test_run_ranks(2, pairs_body, NULL); }
TEST(transport_shm_pairs_w3, 30) { tdist_test_run_ranks(3, pairs_body, NULL); }
TEST(transport_shm_pairs_w5, 40) { tdist_test_run_ranks(5, pairs_body, NULL); }
TEST(transport_shm_pairs_w8, 60) { tdist_test_run_ranks(8, pairs_body, NULL); }

/* ------------------------------------------------------ 16 MiB ring */

#define RING_BYTES (16u << 20)

static uint8_t ring_byte(int origin, size_t off)
{
    return (uint8_t)((unsigned)origin * 29u + off * 7u + (off >> 12) * 13u);
}

static uint64_t fnv(const uint8_t *b, size_t len)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < len; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

static uint64_t ring_expected(int origin)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < RING_BYTES; i++) h = (h ^ ring_byte(origin, i)) * 1099511628211ull;
    return h;
}

static void ring_body(int rank, int n, void *arg)
{
    (void)arg;
    tp_rank_t t;
    tp_open(&t, rank, n, NULL, TAG);
    tp_connect(&t);
    uint8_t *cur = malloc(RING_BYTES), *nxt = malloc(RING_BYTES);
    ASSERT_TRUE(cur && nxt);
    for (size_t i = 0; i < RING_BYTES; i++) cur[i] = ring_byte(rank, i);
    int right = (rank + 1) % n, left = (rank - 1 + n) % n;
    /* n-1 steps: each rank forwards what it got, so every block visits
     * every rank; the checksum says whose block arrived intact. */
    for (int step = 0; step < n - 1; step++) {
        ASSERT_OK(tdist__tp_sendrecv(t.tp, right, cur, RING_BYTES, left, nxt, RING_BYTES,
                                     deadline_in(20000)));
        int origin = (rank - step - 1 + 2 * n) % n;
        uint64_t got = fnv(nxt, RING_BYTES), want = ring_expected(origin);
        if (got != want)
            FAIL("ring step %d: block of rank %d has checksum %016llx, expected %016llx", step,
                 origin, (unsigned long long)got, (unsigned long long)want);
        uint8_t *tmp = cur;
        cur = nxt;
        nxt = tmp;
    }
    free(cur);
    free(nxt);
    store_barrier(&t, "ring-done");
    tp_close(&t);
}

TEST(transport_shm_ring_16mib_4_ranks, 60) { tdist_test_run_ranks(4, ring_body, NULL); }

/* -------------------------------------------- 64 MiB sendrecv both ways */

#define BIG_BYTES (64u << 20)

static void sendrecv_big_body(int rank, int n, void *arg)
{
    (void)arg;
    tp_rank_t t;
    tp_open(&t, rank, n, NULL, TAG);
    tp_connect(&t);
    int peer = 1 - rank;
    uint8_t *s = malloc(BIG_BYTES), *r = malloc(BIG_BYTES);
    ASSERT_TRUE(s && r);
    mesh_fill(s, BIG_BYTES, rank, peer, 5);
    /* to == from, both ranks at once: no deadlock however large. */
    ASSERT_OK(tdist__tp_sendrecv(t.tp, peer, s, BIG_BYTES, peer, r, BIG_BYTES, deadline_in(30000)));
    mesh_check(r, BIG_BYTES, peer, rank, 5);
    /* Uneven halves: one sends 64 MiB, the other 1 byte. */
    size_t slen = rank == 0 ? BIG_BYTES : 1, rlen = rank == 0 ? 1 : BIG_BYTES;
    mesh_fill(s, slen, rank, peer, 6);
    ASSERT_OK(tdist__tp_sendrecv(t.tp, peer, s, slen, peer, r, rlen, deadline_in(30000)));
    mesh_check(r, rlen, peer, rank, 6);
    free(s);
    free(r);
    store_barrier(&t, "big-done");
    tp_close(&t);
}

TEST(transport_shm_sendrecv_64mib_both_ways, 60) { tdist_test_run_ranks(2, sendrecv_big_body, NULL); }

/* ------------------------------------------ many small messages in order */

#define NSMALL 10000
#define BATCH 1000

static void small_body(int rank, int n, void *arg)
{
    (void)arg;
    tp_rank_t t;
    tp_open(&t, rank, n, NULL, TAG);
    tp_connect(&t);
    uint64_t *vals = calloc(NSMALL, sizeof *vals);
    tdist__tp_req_t *reqs = calloc(NSMALL, sizeof *reqs);
    tdist__tp_req_t **rp = calloc(NSMALL, sizeof *rp);
    ASSERT_TRUE(vals && reqs && rp);
    for (int i = 0; i < NSMALL; i++) rp[i] = &reqs[i];
    if (rank == 0) {
        /* All 10k sends posted at once; rank 1 receives in batches, so
         * most bytes wait in the kernel with no receive posted. */
        for (int i = 0; i < NSMALL; i++) {
            vals[i] = 0x5eed000000000000ull + (uint64_t)i * 2654435761u;
            ASSERT_OK(tdist__tp_post_send(t.tp, &reqs[i], 1, &vals[i], 8));
        }
        ASSERT_OK(tdist__tp_wait(t.tp, rp, NSMALL, deadline_in(20000)));
        /* The way back: blocking one-by-one receives. */
        for (int i = 0; i < BATCH; i++) {
            uint64_t v = 0;
            ASSERT_OK(tdist__tp_recv(t.tp, 1, &v, 8, deadline_in(10000)));
            ASSERT_EQ(v, (uint64_t)i * 3 + 1);
        }
    } else {
        for (int b = 0; b < NSMALL / BATCH; b++) {
            for (int i = b * BATCH; i < (b + 1) * BATCH; i++)
                ASSERT_OK(tdist__tp_post_recv(t.tp, &reqs[i], 0, &vals[i], 8));
            ASSERT_OK(tdist__tp_wait(t.tp, rp + b * BATCH, BATCH, deadline_in(20000)));
            if (b == 0) tdist__sleep_ms(20); /* let the sender fill the socket */
        }
        for (int i = 0; i < NSMALL; i++)
            if (vals[i] != 0x5eed000000000000ull + (uint64_t)i * 2654435761u)
                FAIL("small message %d arrived out of order or corrupt: %016llx", i,
                     (unsigned long long)vals[i]);
        for (int i = 0; i < BATCH; i++) {
            uint64_t v = (uint64_t)i * 3 + 1;
            ASSERT_OK(tdist__tp_send(t.tp, 0, &v, 8, deadline_in(10000)));
        }
    }
    free(vals);
    free(reqs);
    free(rp);
    store_barrier(&t, "small-done");
    tp_close(&t);
}

TEST(transport_shm_small_messages_in_order, 40) { tdist_test_run_ranks(2, small_body, NULL); }

/* ------------------------------------------- set-up deadline, missing peer */

#define SETUP_MS 1000

static void missing_body(int rank, int n, void *arg)
{
    int missing = *(const int *)arg;
    tp_rank_t t;
    tp_open(&t, rank, n, NULL, TAG);
    if (rank == missing) {
        /* Listens and publishes, but never calls connect. */
        store_barrier(&t, "missing-done");
        tp_close(&t);
        return;
    }
    double t0 = tdist_test_now_ms();
    tdist_status_t st = tdist__tp_connect(t.tp, t.ap, tdist__now_ms() + SETUP_MS);
    double took = tdist_test_now_ms() - t0;
    ASSERT_STATUS(st, TDIST_ERR_TIMEOUT);
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", tdist_last_error());
    char want[160];
    snprintf(want, sizeof want, "peer rank %d (pid %d): has not mapped this rank's segment yet",
             missing, addr_pid(t.addrs[missing]));
    ASSERT_CONTAINS(msg, want);
    for (int r = 0; r < n; r++) {
        snprintf(want, sizeof want, "peer rank %d", r);
        if (r != missing && strstr(msg, want))
            FAIL("rank %d names a peer that did connect: %s", rank, msg);
    }
    ASSERT_GE(took, SETUP_MS - 5);
    ASSERT_LE(took, SETUP_MS + 1000 * tdist_test_timeout_mult());
    printf("rank %d: %s (after %.0f ms)\n", rank, msg, took);
    store_barrier(&t, "missing-done");
    tp_close(&t);
}

TEST(transport_shm_setup_deadline_names_missing_peers, 30)
{
    int missing = 2; /* it would connect to the others */
    tdist_test_run_ranks(3, missing_body, &missing);
}

TEST(transport_shm_setup_deadline_names_missing_rank_0, 30)
{
    int missing = 0; /* the others connect to it; it never answers */
    tdist_test_run_ranks(3, missing_body, &missing);
}

/* A peer that finished and left is not an error until a request needs it. */
static void departed_body(int rank, int n, void *arg)
{
    (void)arg;
    tp_rank_t t;
    tp_open(&t, rank, n, NULL, TAG);
    tp_connect(&t);
    uint8_t s[MAXR][64], r[MAXR][64];
    tdist__tp_req_t reqs[2 * MAXR], *rp[2 * MAXR];
    int k = 0;
    for (int p = 0; p < n; p++) {
        if (p == rank) continue;
        mesh_fill(s[p], 64, rank, p, 1);
        ASSERT_OK(tdist__tp_post_send(t.tp, &reqs[k], p, s[p], 64));
        rp[k] = &reqs[k];
        k++;
        ASSERT_OK(tdist__tp_post_recv(t.tp, &reqs[k], p, r[p], 64));
        rp[k] = &reqs[k];
        k++;
    }
    ASSERT_OK(tdist__tp_wait(t.tp, rp, (size_t)k, deadline_in(10000)));
    for (int p = 0; p < n; p++)
        if (p != rank) mesh_check(r[p], 64, p, rank, 1);
    if (rank == 2) {
        tdist__tp_destroy(t.tp); /* leaves; then tells the others */
        t.tp = NULL;
        store_barrier(&t, "left");
        tp_close(&t);
        return;
    }
    store_barrier(&t, "left");
    /* Ranks 0 and 1 go on; progress sees rank 2's channel close. */
    ASSERT_OK(tdist__tp_progress(t.tp, 100));
    ASSERT_OK(tdist__tp_progress(t.tp, 100));
    int other = 1 - rank;
    mesh_fill(s[other], 64, rank, other, 2);
    ASSERT_OK(tdist__tp_sendrecv(t.tp, other, s[other], 64, other, r[other], 64,
                                 deadline_in(10000)));
    mesh_check(r[other], 64, other, rank, 2);
    /* Now one of them needs rank 2: a send (rank 0) or a receive (rank 1). */
    char want[160];
    snprintf(want, sizeof want, "rank %d: peer rank 2 (pid %d) ", rank, addr_pid(t.addrs[2]));
    tdist_status_t st = rank == 0 ? tdist__tp_send(t.tp, 2, s[0], 64, deadline_in(10000))
                                  : tdist__tp_recv(t.tp, 2, r[0], 64, deadline_in(10000));
    ASSERT_STATUS(st, TDIST_ERR_CONNECTION);
    ASSERT_CONTAINS(tdist_last_error(), want);
    tp_close(&t);
}

TEST(transport_shm_departed_peer_fails_only_when_needed, 30)
{
    tdist_test_run_ranks(3, departed_body, NULL);
}

/* ------------------------------------------------ peers that die or stop */

typedef struct death {
    atomic_int waiting;   /* survivors blocked in wait */
    double died_ms;       /* when the victim went (tdist_test_now_ms) */
    double latency[MAXR]; /* survivor's error time - died_ms */
    int pid[MAXR];
    atomic_int stopping;
} death_t;

#define DEATH_BYTES (4u << 20)
static tdist__tp_t *g_keep_tp;       /* the exiting victim's, for LSan */
static tdist_world_t *g_keep_world;
static void *g_keep_bufs[2 * MAXR];

enum { DIE_KILL, DIE_EXIT };

typedef struct death_arg {
    death_t *d;
    int victim;
    int how;
} death_arg_t;

static void death_body(int rank, int n, void *argp)
{
    death_arg_t *a = argp;
    death_t *d = a->d;
    tp_rank_t t;
    tp_open(&t, rank, n, NULL, TAG);
    tp_connect(&t);
    d->pid[rank] = getpid();
    if (rank == a->victim) {
        /* Send half of every message, wait until the survivors are
         * blocked, then die mid-transfer. */
        tdist__tp_req_t *reqs = calloc((size_t)n, sizeof *reqs);
        tdist__tp_req_t **rp = calloc((size_t)n, sizeof *rp);
        uint8_t *b = malloc(DEATH_BYTES / 2);
        ASSERT_TRUE(reqs && rp && b);
        g_keep_bufs[0] = reqs;
        g_keep_bufs[1] = rp;
        g_keep_bufs[2] = b;
        mesh_fill(b, DEATH_BYTES / 2, rank, 0, 0);
        int k = 0;
        for (int p = 0; p < n; p++) {
            if (p == rank) continue;
            ASSERT_OK(tdist__tp_post_send(t.tp, &reqs[k], p, b, DEATH_BYTES / 2));
            rp[k] = &reqs[k];
            k++;
        }
        for (int i = 0; i < 20000 && atomic_load(&d->waiting) < n - 1; i++) tdist__sleep_ms(1);
        ASSERT_OK(tdist__tp_wait(t.tp, rp, (size_t)k, deadline_in(10000)));
        tdist__sleep_ms(100); /* the survivors are asleep in poll */
        g_keep_tp = t.tp;
        g_keep_world = t.w;
        fflush(stdout);
        if (a->how != DIE_KILL) tdist_test_leak_check_now(); /* not inside the timed exit */
        d->died_ms = tdist_test_now_ms();
        if (a->how == DIE_KILL) raise(SIGKILL);
        exit(0);
    }
    /* Survivors: a full exchange with everyone, the victim included. */
    int nreq = 2 * (n - 1), k = 0;
    tdist__tp_req_t *reqs = calloc((size_t)nreq, sizeof *reqs);
    tdist__tp_req_t **rp = calloc((size_t)nreq, sizeof *rp);
    uint8_t **bufs = calloc((size_t)nreq, sizeof *bufs);
    ASSERT_TRUE(reqs && rp && bufs);
    for (int p = 0; p < n; p++) {
        if (p == rank) continue;
        bufs[k] = malloc(DEATH_BYTES);
        ASSERT_TRUE(bufs[k] != NULL);
        mesh_fill(bufs[k], DEATH_BYTES, rank, p, 0);
        ASSERT_OK(tdist__tp_post_send(t.tp, &reqs[k], p, bufs[k], DEATH_BYTES));
        rp[k] = &reqs[k];
        k++;
        bufs[k] = malloc(DEATH_BYTES);
        ASSERT_TRUE(bufs[k] != NULL);
        ASSERT_OK(tdist__tp_post_recv(t.tp, &reqs[k], p, bufs[k], DEATH_BYTES));
        rp[k] = &reqs[k];
        k++;
    }
    atomic_fetch_add(&d->waiting, 1);
    tdist_status_t st = tdist__tp_wait(t.tp, rp, (size_t)nreq, deadline_in(15000));
    double seen = tdist_test_now_ms();
    ASSERT_STATUS(st, TDIST_ERR_CONNECTION);
    char want[160];
    snprintf(want, sizeof want, "rank %d: peer rank %d (pid %d) exited", rank, a->victim,
             addr_pid(t.addrs[a->victim]));
    ASSERT_CONTAINS(tdist_last_error(), want);
    ASSERT_TRUE(d->died_ms > 0);
    d->latency[rank] = seen - d->died_ms;
    printf("rank %d: %.1f ms after the victim %s: %s\n", rank, d->latency[rank],
           a->how == DIE_KILL ? "was killed" : "exited", tdist_last_error());
    /* a reaction through the victim's and the other ranks' processes: the
     * sanitizers' slowdown of all of them (docs/testing.md) */
    ASSERT_LE(d->latency[rank], 100 * tdist_test_timeout_mult() * tdist_test_latency_mult());
    ASSERT_EQ(shm_entries(d->pid[a->victim]), 0);
    /* Every request has finished with the error; later posts fail at once. */
    for (int i = 0; i < nreq; i++) {
        ASSERT_TRUE(tdist__tp_req_done(&reqs[i]));
        tdist_status_t rs = tdist__tp_req_status(&reqs[i]);
        if (rs != TDIST_OK) ASSERT_STATUS(rs, TDIST_ERR_CONNECTION);
    }
    tdist__tp_req_t late;
    ASSERT_STATUS(tdist__tp_post_recv(t.tp, &late, (rank + 1) % n == a->victim ? (rank + 2) % n
                                                                                : (rank + 1) % n,
                                      bufs[0], 1),
                  TDIST_ERR_CONNECTION);
    ASSERT_CONTAINS(tdist_last_error(), want);
    ASSERT_STATUS(tdist__tp_progress(t.tp, 10), TDIST_ERR_CONNECTION);
    for (int i = 0; i < nreq; i++) free(bufs[i]);
    free(bufs);
    free(reqs);
    free(rp);
    /* No wait for the other survivors: one still waiting then sees this
     * rank close its transport as well as the victim's exit, and must name
     * the exit (the transport serves exited peers first). */
    tp_close(&t);
}

static void run_death(int n, int victim, int how)
{
    death_t *d = shared_alloc(sizeof *d);
    death_arg_t a = {d, victim, how};
    tdist_ranks_opts_t o;
    tdist_ranks_opts_init(&o, n);
    o.kill_others_after_ms = -1; /* the victim's end is expected */
    tdist_rank_result_t res[MAXR];
    tdist_test_spawn_ranks(&o, death_body, &a, res);
    char buf[128];
    for (int r = 0; r < n; r++) {
        if (r == victim) {
            if (how == DIE_KILL && !(res[r].signaled && res[r].sig == SIGKILL))
                FAIL("victim rank %d: %s", r, tdist_test_describe(&res[r], buf, sizeof buf));
            if (how == DIE_EXIT && !(res[r].exited && res[r].code == 0))
                FAIL("victim rank %d: %s", r, tdist_test_describe(&res[r], buf, sizeof buf));
            continue;
        }
        if (!(res[r].exited && res[r].code == 0))
            FAIL("survivor rank %d: %s", r, tdist_test_describe(&res[r], buf, sizeof buf));
        printf("%s: rank %d failed %.1f ms after the victim's end\n",
               how == DIE_KILL ? "SIGKILL" : "exit(0)", r, d->latency[r]);
    }
    for (int r = 0; r < n; r++) ASSERT_EQ(shm_entries(d->pid[r]), 0);
    munmap(d, sizeof *d);
}

TEST(transport_shm_peer_sigkill_fails_others_fast, 40) { run_death(4, 2, DIE_KILL); }
TEST(transport_shm_peer_exit0_fails_others_fast, 40) { run_death(3, 1, DIE_EXIT); }

#define STOP_MS 1500
#define STOP_BYTES ((1u << 20) + 3)

/* Whether process pid is stopped (state T in /proc/pid/stat). */
static bool is_stopped(int pid)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f) return false;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')');
    return p && p[1] == ' ' && (p[2] == 'T' || p[2] == 't');
}

static void stop_body(int rank, int n, void *arg)
{
    death_t *d = arg;
    tp_rank_t t;
    tp_open(&t, rank, n, NULL, TAG);
    tp_connect(&t);
    uint8_t *b = malloc(STOP_BYTES);
    ASSERT_TRUE(b != NULL);
    if (rank == 1) {
        d->pid[1] = getpid();
        atomic_store(&d->stopping, 1);
        raise(SIGSTOP); /* rank 0 continues us after its deadline */
        mesh_fill(b, STOP_BYTES, 1, 0, 3);
        ASSERT_OK(tdist__tp_send(t.tp, 0, b, STOP_BYTES, deadline_in(10000)));
        char c = 0;
        ASSERT_OK(tdist__tp_recv(t.tp, 0, &c, 1, deadline_in(10000)));
        ASSERT_EQ(c, 'k');
    } else {
        tdist__tp_req_t req, *rp = &req;
        ASSERT_OK(tdist__tp_post_recv(t.tp, &req, 1, b, STOP_BYTES));
        double t0 = tdist_test_now_ms();
        tdist_status_t st = tdist__tp_wait(t.tp, &rp, 1, tdist__now_ms() + STOP_MS);
        double took = tdist_test_now_ms() - t0;
        ASSERT_STATUS(st, TDIST_ERR_TIMEOUT);
        printf("rank 0: %s (after %.0f ms)\n", tdist_last_error(), took);
        char want[160];
        snprintf(want, sizeof want, "receive from peer rank 1 (pid %d) 0/%u bytes",
                 addr_pid(t.addrs[1]), STOP_BYTES);
        ASSERT_CONTAINS(tdist_last_error(), want);
        ASSERT_GE(took, STOP_MS - 5);
        ASSERT_LE(took, STOP_MS + 1000 * tdist_test_timeout_mult());
        ASSERT_FALSE(tdist__tp_req_done(&req));
        ASSERT_STATUS(tdist__tp_req_status(&req), TDIST_INPROGRESS);
        /* Continue the stopped peer: the request stayed posted and
         * completes now. */
        for (int i = 0; i < 5000 && !(atomic_load(&d->stopping) && is_stopped(d->pid[1])); i++)
            tdist__sleep_ms(1);
        ASSERT_TRUE(is_stopped(d->pid[1]));
        ASSERT_EQ(kill(d->pid[1], SIGCONT), 0);
        ASSERT_OK(tdist__tp_wait(t.tp, &rp, 1, deadline_in(10000)));
        mesh_check(b, STOP_BYTES, 1, 0, 3);
        char c = 'k';
        ASSERT_OK(tdist__tp_send(t.tp, 1, &c, 1, deadline_in(10000)));
    }
    free(b);
    store_barrier(&t, "stop-done");
    tp_close(&t);
}

TEST(transport_shm_stopped_peer_times_out_at_deadline, 30)
{
    death_t *d = shared_alloc(sizeof *d);
    tdist_test_run_ranks(2, stop_body, d);
    munmap(d, sizeof *d);
}

/* ---------------------------------------------------------------- abort */

typedef struct aborter {
    tdist__tp_t *tp;
    double at;
} aborter_t;

static void *abort_later(void *p)
{
    aborter_t *a = p;
    tdist__sleep_ms(300);
    a->at = tdist_test_now_ms();
    tdist__tp_abort(a->tp);
    tdist__tp_abort(a->tp); /* idempotent */
    return NULL;
}

static void abort_body(int rank, int n, void *arg)
{
    (void)arg;
    tp_rank_t t;
    tp_open(&t, rank, n, NULL, TAG);
    tp_connect(&t);
    char buf[16];
    tdist__tp_req_t req, *rp = &req;
    if (rank == 0) {
        aborter_t a = {t.tp, 0};
        pthread_t th;
        ASSERT_OK(tdist__tp_post_recv(t.tp, &req, 1, buf, sizeof buf)); /* never sent */
        ASSERT_EQ(pthread_create(&th, NULL, abort_later, &a), 0);
        tdist_status_t st = tdist__tp_wait(t.tp, &rp, 1, deadline_in(10000));
        double woke = tdist_test_now_ms();
        ASSERT_EQ(pthread_join(th, NULL), 0);
        ASSERT_STATUS(st, TDIST_ERR_ABORTED);
        ASSERT_CONTAINS(tdist_last_error(), "rank 0: transport aborted");
        printf("rank 0: wait woke %.2f ms after tdist__tp_abort\n", woke - a.at);
        ASSERT_TRUE(a.at > 0);
        ASSERT_LE(woke - a.at, 100);
        ASSERT_TRUE(tdist__tp_req_done(&req));
        ASSERT_STATUS(tdist__tp_req_status(&req), TDIST_ERR_ABORTED);
        ASSERT_STATUS(tdist__tp_post_send(t.tp, &req, 1, buf, 1), TDIST_ERR_ABORTED);
        ASSERT_STATUS(tdist__tp_progress(t.tp, 0), TDIST_ERR_ABORTED);
        ASSERT_STATUS(tdist__tp_send(t.tp, 1, buf, 1, deadline_in(1000)), TDIST_ERR_ABORTED);
        tdist__tp_destroy(t.tp); /* closes rank 1's channel */
        t.tp = NULL;
    } else {
        /* Rank 0 closes its end without sending: a receive that is owed
         * bytes fails naming it. */
        ASSERT_OK(tdist__tp_post_recv(t.tp, &req, 0, buf, 1));
        ASSERT_STATUS(tdist__tp_wait(t.tp, &rp, 1, deadline_in(10000)), TDIST_ERR_CONNECTION);
        char want[160];
        snprintf(want, sizeof want, "rank 1: peer rank 0 (pid %d) ", addr_pid(t.addrs[0]));
        ASSERT_CONTAINS(tdist_last_error(), want);
    }
    tp_close(&t);
}

TEST(transport_shm_abort_wakes_blocked_wait, 30) { tdist_test_run_ranks(2, abort_body, NULL); }

/* ------------------------------------- 8 ranks on 2 cores, no livelock */

#define OVER_ITERS 2000

static void over_body(int rank, int n, void *arg)
{
    double *took = arg;
    tp_rank_t t;
    tp_open(&t, rank, n, NULL, TAG);
    tp_connect(&t);
    int right = (rank + 1) % n, left = (rank - 1 + n) % n;
    double t0 = tdist_test_now_ms();
    for (int i = 0; i < OVER_ITERS; i++) {
        uint64_t s = ((uint64_t)rank << 32) | (uint64_t)i, r = 0;
        ASSERT_OK(tdist__tp_sendrecv(t.tp, right, &s, 8, left, &r, 8, deadline_in(10000)));
        if (r != (((uint64_t)left << 32) | (uint64_t)i))
            FAIL("iteration %d: got %016llx from rank %d", i, (unsigned long long)r, left);
    }
    took[rank] = tdist_test_now_ms() - t0;
    printf("rank %d: %d ring steps of 8 B in %.0f ms (%.1f us each)\n", rank, OVER_ITERS,
           took[rank], 1000.0 * took[rank] / OVER_ITERS);
    store_barrier(&t, "over-done");
    tp_close(&t);
}

TEST(transport_shm_8_ranks_on_2_cores_no_livelock, 60)
{
    double *took = shared_alloc(MAXR * sizeof *took);
    tdist_test_run_ranks(8, over_body, took);
    for (int r = 0; r < 8; r++) {
        ASSERT_TRUE(took[r] > 0);
        ASSERT_LE(took[r], 15000 * tdist_test_timeout_mult());
    }
    munmap(took, MAXR * sizeof *took);
}

/* ------------------------------------------ fds, segments, arguments */

TEST(transport_shm_no_fd_or_segment_leak_on_any_path, 30)
{
    int before = tdist_test_count_fds(), me = getpid();
    ASSERT_EQ(shm_entries(me), 0);
    tdist__tp_opts_t o = {.tag = TAG};
    tdist__tp_t *tp = NULL;
    /* listen, destroy: the segment exists until destroy */
    ASSERT_OK(tdist__tp_listen(TDIST__TP_SHM, 0, 4, &o, &tp));
    ASSERT_EQ(shm_entries(me), 1);
    ASSERT_EQ(addr_pid(tdist__tp_address(tp)), me);
    ASSERT_TRUE(strncmp(tdist__tp_address(tp), "shm:/tdist-", 11) == 0);
    tdist__tp_destroy(tp);
    ASSERT_EQ(shm_entries(me), 0);
    ASSERT_EQ(tdist_test_count_fds(), before);
    /* world of one: connect unlinks at once */
    ASSERT_OK(tdist__tp_listen(TDIST__TP_SHM, 0, 1, &o, &tp));
    const char *self[1] = {NULL};
    ASSERT_OK(tdist__tp_connect(tp, self, tdist__now_ms() + 1000));
    ASSERT_EQ(shm_entries(me), 0);
    ASSERT_OK(tdist__tp_wait(tp, NULL, 0, tdist__now_ms()));
    tdist__tp_destroy(tp);
    ASSERT_EQ(tdist_test_count_fds(), before);
    /* rank 1 of 2, peer rank 0's segment does not exist: retried until
     * the deadline, which names the peer and why; then unlinked. */
    char dead[96];
    snprintf(dead, sizeof dead, "shm:/tdist-%d-nosuchsegment:%d", me, me);
    ASSERT_OK(tdist__tp_listen(TDIST__TP_SHM, 1, 2, &o, &tp));
    const char *addrs[2] = {dead, NULL};
    int64_t t0 = tdist__now_ms();
    ASSERT_STATUS(tdist__tp_connect(tp, addrs, t0 + 400), TDIST_ERR_TIMEOUT);
    ASSERT_GE(tdist__now_ms() - t0, 400);
    ASSERT_CONTAINS(tdist_last_error(), "peer rank 0");
    ASSERT_CONTAINS(tdist_last_error(), "No such file");
    ASSERT_EQ(shm_entries(me), 0);
    tdist__tp_destroy(tp);
    ASSERT_EQ(tdist_test_count_fds(), before);
    /* abort during set-up (abort itself only sets a flag and wakes: it is
     * async-signal-safe): connect fails at once and unlinks */
    ASSERT_OK(tdist__tp_listen(TDIST__TP_SHM, 0, 2, &o, &tp));
    tdist__tp_abort(tp);
    const char *addrs2[2] = {NULL, dead};
    ASSERT_STATUS(tdist__tp_connect(tp, addrs2, deadline_in(5000)), TDIST_ERR_ABORTED);
    ASSERT_EQ(shm_entries(me), 0);
    tdist__tp_destroy(tp);
    ASSERT_EQ(tdist_test_count_fds(), before);
    ASSERT_EQ(shm_entries(me), 0);
}

TEST(transport_shm_rejects_bad_arguments, 10)
{
    tdist__tp_opts_t o = {.tag = TAG};
    tdist__tp_t *tp = NULL;
    ASSERT_STATUS(tdist__tp_listen(TDIST__TP_SHM, 0, 2, &o, NULL), TDIST_ERR_INVALID_ARG);
    ASSERT_STATUS(tdist__tp_listen(TDIST__TP_SHM, 0, 2, NULL, &tp), TDIST_ERR_INVALID_ARG);
    ASSERT_STATUS(tdist__tp_listen(TDIST__TP_SHM, 2, 2, &o, &tp), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "rank 2 of size 2");
    ASSERT_STATUS(tdist__tp_listen(TDIST__TP_SHM, 0, 0, &o, &tp), TDIST_ERR_INVALID_ARG);
    tdist__tp_opts_t huge = {.tag = TAG, .shm_ring_bytes = (size_t)1 << 31};
    ASSERT_STATUS(tdist__tp_listen(TDIST__TP_SHM, 0, 2, &huge, &tp), TDIST_ERR_INVALID_ARG);
    ASSERT_TRUE(tp == NULL);
    ASSERT_OK(tdist__tp_listen(TDIST__TP_SHM, 0, 2, &o, &tp));
    tdist__tp_req_t req;
    char b[4] = {0};
    ASSERT_STATUS(tdist__tp_post_send(tp, &req, 1, b, 1), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "not connected");
    ASSERT_STATUS(tdist__tp_progress(tp, 0), TDIST_ERR_INVALID_ARG);
    ASSERT_STATUS(tdist__tp_post_send(tp, &req, 0, b, 1), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "peer 0 is not another rank");
    ASSERT_STATUS(tdist__tp_post_recv(tp, NULL, 1, b, 1), TDIST_ERR_INVALID_ARG);
    ASSERT_STATUS(tdist__tp_post_recv(tp, &req, 1, NULL, 1), TDIST_ERR_INVALID_ARG);
    const char *a1[2] = {NULL, "nonsense"};
    const char *a2[2] = {NULL, "127.0.0.1:5"};
    const char *a3[2] = {NULL, "shm:/x:notapid"};
    const char *a4[2] = {NULL, NULL};
    ASSERT_STATUS(tdist__tp_connect(tp, NULL, 0), TDIST_ERR_INVALID_ARG);
    ASSERT_STATUS(tdist__tp_connect(tp, (const char *const *)a1, 0), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "address of peer rank 1 (\"nonsense\")");
    ASSERT_STATUS(tdist__tp_connect(tp, (const char *const *)a2, 0), TDIST_ERR_INVALID_ARG);
    ASSERT_STATUS(tdist__tp_connect(tp, (const char *const *)a3, 0), TDIST_ERR_INVALID_ARG);
    ASSERT_STATUS(tdist__tp_connect(tp, (const char *const *)a4, 0), TDIST_ERR_INVALID_ARG);
    tdist__tp_destroy(tp);
}

/* A job whose ranks were all killed before mapping each other's segments
 * leaves them in /dev/shm; the next shm transport this user creates on the
 * host removes those whose owner is gone (and only those). */
TEST(transport_shm_sweeps_segments_of_dead_owners, 30)
{
    tdist__tp_opts_t o = {.tag = TAG};
    int fds[2];
    ASSERT_EQ(pipe(fds), 0);
    pid_t c = fork();
    ASSERT_TRUE(c >= 0);
    if (c == 0) {
        tdist__tp_t *tp = NULL;
        char ok = tdist__tp_listen(TDIST__TP_SHM, 0, 2, &o, &tp) == TDIST_OK ? 'y' : 'n';
        if (write(fds[1], &ok, 1) != 1) _exit(2);
        pause(); /* killed while listening: nobody maps or unlinks its segment */
        _exit(3);
    }
    close(fds[1]);
    char ok = 0;
    ASSERT_EQ(read(fds[0], &ok, 1), 1);
    close(fds[0]);
    ASSERT_EQ(ok, 'y');
    /* a live owner's segment survives a sweep (no sweep before ours: this
     * process has created no transport yet) */
    ASSERT_EQ(shm_entries(c), 1);
    kill(c, SIGKILL);
    int status = 0;
    ASSERT_EQ(waitpid(c, &status, 0), c);
    ASSERT_EQ(shm_entries(c), 1); /* left behind */
    tdist__tp_t *tp = NULL;
    ASSERT_OK(tdist__tp_listen(TDIST__TP_SHM, 0, 2, &o, &tp));
    ASSERT_EQ(shm_entries(c), 0);          /* swept */
    ASSERT_EQ(shm_entries(getpid()), 1);   /* our own is there */
    tdist__tp_destroy(tp);
    ASSERT_EQ(shm_entries(getpid()), 0);
}

/* ------------------------------------------- oversubscription by affinity */

/* Waiters spin only when the ranks have a CPU each. A rank bound to one
 * CPU sees one CPU, but ranks bound to different CPUs are not
 * oversubscribed (tdistrun --bind-to core); ranks on the same CPU are. */
static void affinity_body(int rank, int n, void *arg)
{
    bool same = arg != NULL;
    cpu_set_t all, one;
    ASSERT_EQ(sched_getaffinity(0, sizeof all, &all), 0);
    int cpu[2] = {-1, -1}, k = 0;
    for (int c = 0; c < CPU_SETSIZE && k < 2; c++)
        if (CPU_ISSET(c, &all)) cpu[k++] = c;
    if (k < 2) {
        SKIP("this process may run on one CPU only");
    }
    CPU_ZERO(&one);
    CPU_SET(same ? cpu[0] : cpu[rank], &one);
    ASSERT_EQ(sched_setaffinity(0, sizeof one, &one), 0);
    tp_rank_t t;
    tp_open(&t, rank, n, NULL, TAG);
    tp_connect(&t);
    if (tdist__tp_oversubscribed(t.tp) != same)
        FAIL("rank %d: bound to CPU %d (%s CPU as the peer): oversubscribed = %d, want %d", rank,
             same ? cpu[0] : cpu[rank], same ? "the same" : "another",
             tdist__tp_oversubscribed(t.tp), same);
    store_barrier(&t, "affinity-done");
    tp_close(&t);
    ASSERT_EQ(sched_setaffinity(0, sizeof all, &all), 0);
}

TEST(transport_shm_bound_ranks_are_not_oversubscribed, 30)
{
    tdist_test_run_ranks(2, affinity_body, NULL);
}
TEST(transport_shm_ranks_on_one_cpu_are_oversubscribed, 30)
{
    tdist_test_run_ranks(2, affinity_body, (void *)"same");
}
