/* tests/init/test_rendezvous.c — the rendezvous on real processes: missing
 * ranks at the deadline, duplicate ranks, world-size disagreement, restart
 * generations, local rank from host names. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include "harness.h"

/* Write "<status> <elapsed ms>\n<message>" to <tmpdir>/<tag>.<proc>. */
static void record(const char *tag, int proc, tdist_status_t st, double elapsed_ms)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s.%d", tdist_test_tmpdir(), tag, proc);
    FILE *f = fopen(path, "w");
    if (!f) FAIL("fopen %s: %s", path, strerror(errno));
    fprintf(f, "%d %.0f\n%s", (int)st, elapsed_ms, tdist_last_error());
    fclose(f);
}

/* Read what record() wrote. msg gets the message. */
static void read_record(const char *tag, int proc, int *st, double *elapsed_ms, char *msg, size_t n)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s.%d", tdist_test_tmpdir(), tag, proc);
    FILE *f = fopen(path, "r");
    if (!f) FAIL("process %d left no record (%s)", proc, path);
    if (fscanf(f, "%d %lf\n", st, elapsed_ms) != 2) FAIL("bad record %s", path);
    size_t got = fread(msg, 1, n - 1, f);
    msg[got] = '\0';
    fclose(f);
}

static int listen_local(uint16_t *port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (bind(fd, (struct sockaddr *)&a, len) != 0 || listen(fd, 128) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
        close(fd);
        return -1;
    }
    *port = ntohs(a.sin_port);
    return fd;
}

/* ------------------------------------------------------------ missing ranks */

#define SHORT_TIMEOUT_MS 2000

/* Every present rank fails with TIMEOUT naming the missing ranks, within
 * deadline + 1 s and not much before the deadline. */
static void expect_timeout(tdist_status_t st, double elapsed, const char *missing, const char *arrived)
{
    if (st != TDIST_ERR_TIMEOUT)
        FAIL("tdist_init returned %s, expected TDIST_ERR_TIMEOUT (%s)", tdist_status_str(st),
             tdist_last_error());
    ASSERT_CONTAINS(tdist_last_error(), missing);
    ASSERT_CONTAINS(tdist_last_error(), arrived);
    ASSERT_CONTAINS(tdist_last_error(), "timed out after 2000 ms");
    ASSERT_LE(elapsed, SHORT_TIMEOUT_MS + 1000);
    ASSERT_GE(elapsed, SHORT_TIMEOUT_MS - 500);
}

static void missing_body(int rank, int n, void *arg)
{
    (void)n;
    (void)arg;
    if (rank == 2) return; /* rank 2 never shows up */
    tdist_init_opts_t o;
    tdist_init_opts_init(&o);
    o.timeout_ms = SHORT_TIMEOUT_MS;
    tdist_world_t *w = NULL;
    double t0 = tdist_test_now_ms();
    tdist_status_t st = tdist_init(NULL, &o, &w);
    expect_timeout(st, tdist_test_now_ms() - t0, "missing ranks: 2", "3 of 4 ranks arrived");
    ASSERT_TRUE(w == NULL);
}

TEST(init_missing_rank_timeout, 30)
{
    tdist_ranks_opts_t ro;
    tdist_ranks_opts_init(&ro, 4);
    ro.kill_others_after_ms = -1;
    ASSERT_EQ(tdist_test_spawn_ranks(&ro, missing_body, NULL, NULL), 0);
}

/* The same when rank 0 hosts the store: it keeps the server up until the
 * others have seen the failure, so they too get the missing-rank list. */
typedef struct host_arg {
    int fd;
    uint16_t port;
} host_arg_t;

static void missing_hosted_body(int rank, int n, void *arg)
{
    host_arg_t *a = arg;
    unsetenv("TDIST_LAUNCHER_STORE");
    if (rank != 0) close(a->fd);
    if (rank == 1 || rank == 3) return;
    char url[128];
    snprintf(url, sizeof url, "tcp://127.0.0.1:%u?rank=%d&world_size=%d", (unsigned)a->port, rank, n);
    tdist_init_opts_t o;
    tdist_init_opts_init(&o);
    o.timeout_ms = SHORT_TIMEOUT_MS;
    if (rank == 0) o.listen_fd = a->fd;
    tdist_world_t *w = NULL;
    double t0 = tdist_test_now_ms();
    tdist_status_t st = tdist_init(url, &o, &w);
    expect_timeout(st, tdist_test_now_ms() - t0, "missing ranks: 1, 3", "3 of 5 ranks arrived");
    if (rank == 0) {
        /* on failure the caller keeps its listening socket */
        ASSERT_TRUE(fcntl(a->fd, F_GETFD) != -1);
        close(a->fd);
    }
}

TEST(init_missing_rank_timeout_rank0_hosts, 30)
{
    host_arg_t a;
    a.fd = listen_local(&a.port);
    ASSERT_TRUE(a.fd >= 0);
    tdist_ranks_opts_t ro;
    tdist_ranks_opts_init(&ro, 5);
    ro.with_store = false;
    ro.kill_others_after_ms = -1;
    int failed = tdist_test_spawn_ranks(&ro, missing_hosted_body, &a, NULL);
    close(a.fd);
    ASSERT_EQ(failed, 0);
}

/* ------------------------------------------------------------ duplicates */

/* Four processes claim ranks 0, 1, 1, 2 of a world of 4. */
static const int dup_claims[4] = {0, 1, 1, 2};
#define DUP_TIMEOUT_MS 20000

static void dup_body(int proc, int n, void *arg)
{
    (void)n;
    (void)arg;
    char buf[16];
    snprintf(buf, sizeof buf, "%d", dup_claims[proc]);
    setenv("RANK", buf, 1);
    tdist_init_opts_t o;
    tdist_init_opts_init(&o);
    o.timeout_ms = DUP_TIMEOUT_MS;
    tdist_world_t *w = NULL;
    double t0 = tdist_test_now_ms();
    tdist_status_t st = tdist_init(NULL, &o, &w);
    record("dup", proc, st, tdist_test_now_ms() - t0);
    ASSERT_TRUE(w == NULL);
}

TEST(init_duplicate_rank, 60)
{
    tdist_ranks_opts_t ro;
    tdist_ranks_opts_init(&ro, 4);
    ro.kill_others_after_ms = -1;
    tdist_rank_result_t res[4];
    ASSERT_EQ(tdist_test_spawn_ranks(&ro, dup_body, NULL, res), 0);
    char pid1[32], pid2[32];
    snprintf(pid1, sizeof pid1, "pid %d ", res[1].pid);
    snprintf(pid2, sizeof pid2, "pid %d ", res[2].pid);
    for (int p = 0; p < 4; p++) {
        int st;
        double el;
        char msg[2048];
        read_record("dup", p, &st, &el, msg, sizeof msg);
        if (st != TDIST_ERR_DUPLICATE)
            FAIL("process %d (rank %d): %s (%s), expected TDIST_ERR_DUPLICATE", p, dup_claims[p],
                 tdist_status_str((tdist_status_t)st), msg);
        ASSERT_CONTAINS(msg, "rank 1 is claimed by two processes");
        /* both claimants and the bystanders name both processes */
        ASSERT_CONTAINS(msg, pid1);
        ASSERT_CONTAINS(msg, pid2);
        /* quickly, not at the deadline */
        ASSERT_LE(el, DUP_TIMEOUT_MS / 4);
    }
}

/* ------------------------------------------------------------ world size */

#define MISMATCH_TIMEOUT_MS 20000

static void mismatch_body(int rank, int n, void *arg)
{
    (void)n;
    (void)arg;
    setenv("WORLD_SIZE", rank == 0 ? "2" : "3", 1);
    tdist_init_opts_t o;
    tdist_init_opts_init(&o);
    o.timeout_ms = MISMATCH_TIMEOUT_MS;
    tdist_world_t *w = NULL;
    double t0 = tdist_test_now_ms();
    tdist_status_t st = tdist_init(NULL, &o, &w);
    double el = tdist_test_now_ms() - t0;
    if (st != TDIST_ERR_MISMATCH)
        FAIL("got %s (%s), expected TDIST_ERR_MISMATCH", tdist_status_str(st), tdist_last_error());
    ASSERT_CONTAINS(tdist_last_error(), "world size mismatch");
    ASSERT_CONTAINS(tdist_last_error(), "rank 0 (pid");
    ASSERT_CONTAINS(tdist_last_error(), "rank 1 (pid");
    ASSERT_CONTAINS(tdist_last_error(), "has world_size 2");
    ASSERT_CONTAINS(tdist_last_error(), "has world_size 3");
    ASSERT_LE(el, MISMATCH_TIMEOUT_MS / 4);
    ASSERT_TRUE(w == NULL);
}

TEST(init_world_size_mismatch, 60)
{
    tdist_ranks_opts_t ro;
    tdist_ranks_opts_init(&ro, 2);
    ro.kill_others_after_ms = -1;
    ASSERT_EQ(tdist_test_spawn_ranks(&ro, mismatch_body, NULL, NULL), 0);
}

/* ------------------------------------------------------------ generations */

static void restart_body(int rank, int n, void *arg)
{
    (void)arg;
    tdist_init_opts_t o;
    tdist_init_opts_init(&o);
    o.timeout_ms = 30000;
    char key[32], val[32];
    snprintf(key, sizeof key, "x/%d", rank);

    /* attempt 0 */
    setenv("TDIST_RESTART_COUNT", "0", 1);
    tdist_world_t *w = NULL;
    ASSERT_OK(tdist_init(NULL, &o, &w));
    snprintf(val, sizeof val, "g0:%d", rank);
    ASSERT_OK(tdist_store_set(tdist_world_store(w), key, val, strlen(val)));
    tdist_world_destroy(w);

    /* the same generation again on the same store: its keys are still there */
    w = NULL;
    o.timeout_ms = 5000;
    double t0 = tdist_test_now_ms();
    ASSERT_STATUS(tdist_init(NULL, &o, &w), TDIST_ERR_DUPLICATE);
    ASSERT_CONTAINS(tdist_last_error(), "TDIST_RESTART_COUNT");
    ASSERT_LE(tdist_test_now_ms() - t0, 2500);
    ASSERT_TRUE(w == NULL);

    /* attempt 1: a fresh world on the same store */
    setenv("TDIST_RESTART_COUNT", "1", 1);
    o.timeout_ms = 30000;
    ASSERT_OK(tdist_init(NULL, &o, &w));
    ASSERT_EQ(tdist_world_rank(w), rank);
    ASSERT_EQ(tdist_world_size(w), n);
    tdist_store_t *s = tdist_world_store(w);
    const char *keys[1] = {key};
    bool exists = true;
    ASSERT_OK(tdist_store_check(s, keys, 1, &exists));
    ASSERT_FALSE(exists); /* attempt 0's key is invisible */
    snprintf(val, sizeof val, "g1:%d", rank);
    ASSERT_OK(tdist_store_set(s, key, val, strlen(val)));
    tdist_world_destroy(w);

    /* the launcher's store holds both generations side by side */
    tdist_store_t *raw = NULL;
    ASSERT_OK(tdist_store_tcp_connect(getenv("MASTER_ADDR"), (uint16_t)atoi(getenv("MASTER_PORT")),
                                      NULL, &raw));
    for (int g = 0; g < 2; g++) {
        char full[64], want[32];
        snprintf(full, sizeof full, "tdist/g%d/user/x/%d", g, rank);
        snprintf(want, sizeof want, "g%d:%d", g, rank);
        void *v = NULL;
        size_t len = 0;
        ASSERT_OK(tdist_store_get(raw, full, &v, &len));
        ASSERT_EQ(len, strlen(want));
        ASSERT_MEMEQ(v, want, len);
        free(v);
        snprintf(full, sizeof full, "tdist/g%d/rdzv/rank/%d", g, rank);
        const char *k[1] = {full};
        ASSERT_OK(tdist_store_check(raw, k, 1, &exists));
        ASSERT_TRUE(exists);
    }
    tdist_store_destroy(raw);
}

TEST(init_restart_generation_isolation, 60) { tdist_test_run_ranks(2, restart_body, NULL); }

/* ------------------------------------------------------------ local ranks */

/* Four ranks on two simulated hosts: A = {0, 2}, B = {1, 3}. */
static void hosts_body(int rank, int n, void *arg)
{
    (void)n;
    (void)arg;
    setenv("TDIST_HOSTNAME", rank % 2 ? "node-b" : "node-a", 1);
    if (rank < 2) { /* consistent LOCAL_* are accepted */
        char buf[16];
        snprintf(buf, sizeof buf, "%d", rank / 2);
        setenv("LOCAL_RANK", buf, 1);
        setenv("LOCAL_WORLD_SIZE", "2", 1);
    } else {
        unsetenv("LOCAL_RANK");
        unsetenv("LOCAL_WORLD_SIZE");
    }
    tdist_init_opts_t o;
    tdist_init_opts_init(&o);
    o.timeout_ms = 30000;
    tdist_world_t *w = NULL;
    ASSERT_OK(tdist_init(NULL, &o, &w));
    ASSERT_EQ(tdist_world_rank(w), rank);
    ASSERT_EQ(tdist_world_local_rank(w), rank / 2);
    ASSERT_EQ(tdist_world_local_size(w), 2);
    tdist_world_destroy(w);
}

TEST(init_local_rank_from_host_names, 30) { tdist_test_run_ranks(4, hosts_body, NULL); }

/* LOCAL_RANK that contradicts the host names is a MISMATCH on that rank. */
static void local_mismatch_body(int rank, int n, void *arg)
{
    (void)n;
    (void)arg;
    if (rank == 1) setenv("LOCAL_RANK", "0", 1);
    tdist_init_opts_t o;
    tdist_init_opts_init(&o);
    o.timeout_ms = 30000;
    tdist_world_t *w = NULL;
    tdist_status_t st = tdist_init(NULL, &o, &w);
    if (rank == 1) {
        if (st != TDIST_ERR_MISMATCH)
            FAIL("got %s (%s), expected TDIST_ERR_MISMATCH", tdist_status_str(st), tdist_last_error());
        ASSERT_CONTAINS(tdist_last_error(), "LOCAL_RANK=0");
        ASSERT_CONTAINS(tdist_last_error(), "local rank 1 of 2");
        ASSERT_TRUE(w == NULL);
    } else {
        ASSERT_OK(st);
        ASSERT_EQ(tdist_world_local_rank(w), 0);
        tdist_world_destroy(w);
    }
}

TEST(init_local_rank_env_mismatch, 30)
{
    tdist_ranks_opts_t ro;
    tdist_ranks_opts_init(&ro, 2);
    ro.kill_others_after_ms = -1;
    ASSERT_EQ(tdist_test_spawn_ranks(&ro, local_mismatch_body, NULL, NULL), 0);
}
