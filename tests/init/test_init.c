/* tests/init/test_init.c — tdist_init from env://, tcp:// and file:// on real
 * processes; store hosting (listen fd adoption, port in use); malformed URLs
 * and environment values; options winning over the environment. */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include "harness.h"
#include "init_env.h"

/* Each rank sets "k/<rank>", then reads every rank's key (blocking get). */
static void check_shared_store_named(tdist_world_t *w, const char *counter)
{
    tdist_store_t *s = tdist_world_store(w);
    ASSERT_TRUE(s != NULL);
    int rank = tdist_world_rank(w), n = tdist_world_size(w);
    char key[64], val[64];
    snprintf(key, sizeof key, "k/%d", rank);
    snprintf(val, sizeof val, "value of rank %d", rank);
    ASSERT_OK(tdist_store_set(s, key, val, strlen(val)));
    for (int r = 0; r < n; r++) {
        snprintf(key, sizeof key, "k/%d", r);
        snprintf(val, sizeof val, "value of rank %d", r);
        void *v = NULL;
        size_t len = 0;
        ASSERT_OK(tdist_store_get(s, key, &v, &len));
        ASSERT_EQ(len, strlen(val));
        ASSERT_MEMEQ(v, val, len);
        free(v);
    }
    int64_t sum = 0;
    ASSERT_OK(tdist_store_add(s, counter, rank + 1, NULL));
    /* every rank adds rank+1: wait until the total is n(n+1)/2 */
    for (int i = 0; i < 3000; i++) {
        ASSERT_OK(tdist_store_add(s, counter, 0, &sum));
        if (sum == (int64_t)n * (n + 1) / 2) break;
        usleep(5000);
    }
    ASSERT_EQ(sum, (int64_t)n * (n + 1) / 2);
}

static void check_shared_store(tdist_world_t *w) { check_shared_store_named(w, "counter"); }

/* ------------------------------------------------------------ env:// */

static void env_body(int rank, int n, void *arg)
{
    (void)arg;
    tdist_init_opts_t o;
    tdist_init_opts_init(&o);
    o.timeout_ms = 30000;
    int fds = tdist_test_count_fds(), threads = tdist_test_count_threads();
    tdist_world_t *w = NULL;
    ASSERT_OK(tdist_init(rank % 2 ? "env://" : NULL, &o, &w));
    ASSERT_EQ(tdist_world_rank(w), rank);
    ASSERT_EQ(tdist_world_size(w), n);
    ASSERT_EQ(tdist_world_local_rank(w), rank); /* one host */
    ASSERT_EQ(tdist_world_local_size(w), n);
    check_shared_store(w);
    tdist_world_destroy(w);
    /* nothing left behind */
    ASSERT_EQ(tdist_test_count_fds(), fds);
    ASSERT_EQ(tdist_test_threads_settled(threads), threads);
}

TEST(init_env_1_rank, 30) { tdist_test_run_ranks(1, env_body, NULL); }
TEST(init_env_2_ranks, 30) { tdist_test_run_ranks(2, env_body, NULL); }
TEST(init_env_4_ranks, 40) { tdist_test_run_ranks(4, env_body, NULL); }
TEST(init_env_8_ranks, 60) { tdist_test_run_ranks(8, env_body, NULL); }

/* opts.rank / opts.world_size win over RANK / WORLD_SIZE (even garbage ones). */
static void opts_body(int rank, int n, void *arg)
{
    (void)arg;
    setenv("RANK", "not-a-number", 1);
    setenv("WORLD_SIZE", "-3", 1);
    unsetenv("LOCAL_RANK");
    unsetenv("LOCAL_WORLD_SIZE");
    tdist_init_opts_t o;
    tdist_init_opts_init(&o);
    o.timeout_ms = 30000;
    o.rank = n - 1 - rank;
    o.world_size = n;
    tdist_world_t *w = NULL;
    ASSERT_OK(tdist_init("env://", &o, &w));
    ASSERT_EQ(tdist_world_rank(w), n - 1 - rank);
    ASSERT_EQ(tdist_world_size(w), n);
    ASSERT_EQ(tdist_world_local_rank(w), n - 1 - rank);
    check_shared_store(w);
    tdist_world_destroy(w);
}

TEST(init_opts_override_env, 30) { tdist_test_run_ranks(3, opts_body, NULL); }

/* ------------------------------------------------------------ tcp:// */

typedef struct tcp_arg {
    int fd;          /* listening socket made before fork; rank 0 hosts on it */
    uint16_t port;
    const char *host; /* as written in the URL */
    bool env_url;     /* env:// with TDIST_STORE_LISTEN_FD instead of tcp:// + opts */
} tcp_arg_t;

static void tcp_body(int rank, int n, void *arg)
{
    tcp_arg_t *a = arg;
    clear_init_env();
    tdist_init_opts_t o;
    tdist_init_opts_init(&o);
    o.timeout_ms = 30000;
    char url[256], buf[32];
    if (a->env_url) {
        snprintf(url, sizeof url, "env://");
        setenv("MASTER_ADDR", a->host, 1);
        snprintf(buf, sizeof buf, "%u", (unsigned)a->port);
        setenv("MASTER_PORT", buf, 1);
        snprintf(buf, sizeof buf, "%d", rank);
        setenv("RANK", buf, 1);
        snprintf(buf, sizeof buf, "%d", n);
        setenv("WORLD_SIZE", buf, 1);
        if (rank == 0) {
            snprintf(buf, sizeof buf, "%d", a->fd);
            setenv("TDIST_STORE_LISTEN_FD", buf, 1);
        }
    } else {
        snprintf(url, sizeof url, "tcp://%s:%u?rank=%d&world_size=%d", a->host, (unsigned)a->port,
                 rank, n);
        if (rank == 0) o.listen_fd = a->fd;
    }
    if (rank != 0) close(a->fd);
    int fds = tdist_test_count_fds(), threads = tdist_test_count_threads();
    tdist_world_t *w = NULL;
    ASSERT_OK(tdist_init(url, &o, &w));
    if (rank == 0) {
        /* ownership of the listening socket passed to tdist_init */
        errno = 0;
        ASSERT_EQ(fcntl(a->fd, F_GETFD), -1);
        ASSERT_EQ(errno, EBADF);
    }
    ASSERT_EQ(tdist_world_rank(w), rank);
    ASSERT_EQ(tdist_world_size(w), n);
    ASSERT_EQ(tdist_world_local_rank(w), rank);
    ASSERT_EQ(tdist_world_local_size(w), n);
    check_shared_store(w);
    if (rank != 0) {
        /* Rank 0 is already leaving: its server must stay up until we left. */
        usleep(300 * 1000);
        ASSERT_OK(tdist_store_set(tdist_world_store(w), "late", "x", 1));
    } else {
        ASSERT_EQ(tdist_test_count_threads(), threads + 1); /* the server's loop */
    }
    tdist_world_destroy(w);
    /* no fd or thread left behind; rank 0's listening socket went with its server */
    ASSERT_EQ(tdist_test_count_fds(), rank == 0 ? fds - 1 : fds);
    ASSERT_EQ(tdist_test_threads_settled(threads), threads);
}

static void run_tcp(int family, const char *host, bool env_url, int n)
{
    tcp_arg_t a = {.host = host, .env_url = env_url};
    a.fd = listen_local(family, &a.port);
    ASSERT_TRUE(a.fd >= 0);
    tdist_ranks_opts_t ro;
    tdist_ranks_opts_init(&ro, n);
    ro.with_store = false;
    tdist_rank_result_t res[8];
    int failed = tdist_test_spawn_ranks(&ro, tcp_body, &a, res);
    close(a.fd);
    char buf[128];
    for (int r = 0; r < n; r++)
        if (!(res[r].exited && res[r].code == 0))
            FAIL("rank %d %s", r, tdist_test_describe(&res[r], buf, sizeof buf));
    ASSERT_EQ(failed, 0);
}

TEST(init_tcp_rank0_hosts, 60) { run_tcp(AF_INET, "127.0.0.1", false, 3); }

TEST(init_env_rank0_hosts_on_listen_fd_env, 60) { run_tcp(AF_INET, "127.0.0.1", true, 4); }

TEST(init_tcp_ipv6, 60)
{
    uint16_t port;
    int probe = listen_local(AF_INET6, &port);
    if (probe < 0) {
        SKIP("no IPv6 loopback here (%s)", strerror(errno));
    }
    close(probe);
    run_tcp(AF_INET6, "[::1]", false, 2);
}

/* The store port is taken: rank 0 fails with ADDR_IN_USE naming host:port. */
TEST(init_tcp_port_in_use, 30)
{
    clear_init_env();
    uint16_t port;
    int fd = listen_local(AF_INET, &port);
    ASSERT_TRUE(fd >= 0);
    char url[128], hostport[64];
    snprintf(url, sizeof url, "tcp://127.0.0.1:%u?rank=0&world_size=1", (unsigned)port);
    snprintf(hostport, sizeof hostport, "127.0.0.1:%u", (unsigned)port);
    tdist_init_opts_t o;
    tdist_init_opts_init(&o);
    o.timeout_ms = 5000;
    tdist_world_t *w = (tdist_world_t *)&o; /* must stay untouched */
    ASSERT_STATUS(tdist_init(url, &o, &w), TDIST_ERR_ADDR_IN_USE);
    ASSERT_TRUE(w == (tdist_world_t *)&o);
    ASSERT_CONTAINS(tdist_last_error(), hostport);
    ASSERT_CONTAINS(tdist_last_error(), "already in use");
    ASSERT_CONTAINS(tdist_last_error(), "TDIST_LAUNCHER_STORE=1");

    /* env:// the same way, the message pointing at MASTER_PORT */
    char buf[32];
    snprintf(buf, sizeof buf, "%u", (unsigned)port);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", buf, 1);
    setenv("RANK", "0", 1);
    setenv("WORLD_SIZE", "1", 1);
    ASSERT_STATUS(tdist_init(NULL, &o, &w), TDIST_ERR_ADDR_IN_USE);
    ASSERT_CONTAINS(tdist_last_error(), hostport);
    ASSERT_CONTAINS(tdist_last_error(), "MASTER_PORT");
    close(fd);
}

/* opts.token reaches both the server rank 0 hosts and every client: a
 * process with the wrong secret is refused (AUTH) and does not disturb the
 * job, which forms with the right one. */
typedef struct token_arg {
    int fd;
    uint16_t port;
    char done_path[512]; /* the intruder creates it when it is done */
} token_arg_t;

static void token_body(int proc, int n, void *arg)
{
    (void)n;
    token_arg_t *a = arg;
    clear_init_env();
    if (proc != 0) close(a->fd);
    int rank = proc == 2 ? 1 : proc; /* process 2 tries to take rank 1 */
    char url[128];
    snprintf(url, sizeof url, "tcp://127.0.0.1:%u?rank=%d&world_size=2", (unsigned)a->port, rank);
    tdist_init_opts_t o;
    tdist_init_opts_init(&o);
    o.timeout_ms = 30000;
    o.token = proc == 2 ? "wrong secret" : "s3cret";
    if (proc == 0) o.listen_fd = a->fd;
    tdist_world_t *w = NULL;
    if (proc == 2) {
        usleep(100 * 1000); /* rank 0's server is up by now, or soon */
        tdist_status_t st = tdist_init(url, &o, &w);
        int fd = open(a->done_path, O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
        if (fd >= 0) close(fd);
        if (st != TDIST_ERR_AUTH)
            FAIL("wrong token: got %s (%s), expected TDIST_ERR_AUTH", tdist_status_str(st),
                 tdist_last_error());
        ASSERT_TRUE(w == NULL);
        return;
    }
    ASSERT_OK(tdist_init(url, &o, &w));
    ASSERT_EQ(tdist_world_rank(w), rank);
    check_shared_store(w);
    /* keep the store up until the intruder has tried */
    for (int i = 0; i < 2000 && access(a->done_path, F_OK) != 0; i++) usleep(5000);
    ASSERT_EQ(access(a->done_path, F_OK), 0);
    tdist_world_destroy(w);
}

TEST(init_tcp_token, 60)
{
    token_arg_t a;
    a.fd = listen_local(AF_INET, &a.port);
    ASSERT_TRUE(a.fd >= 0);
    snprintf(a.done_path, sizeof a.done_path, "%s/intruder-done", tdist_test_tmpdir());
    tdist_ranks_opts_t ro;
    tdist_ranks_opts_init(&ro, 3);
    ro.with_store = false;
    int failed = tdist_test_spawn_ranks(&ro, token_body, &a, NULL);
    close(a.fd);
    ASSERT_EQ(failed, 0);
}

/* Nobody hosts the store: a non-zero rank gives up at its deadline with an
 * error naming host:port. (The port was the kernel's pick a moment ago and
 * is closed now.) */
TEST(init_tcp_store_unreachable, 30)
{
    clear_init_env();
    uint16_t port;
    int fd = listen_local(AF_INET, &port);
    ASSERT_TRUE(fd >= 0);
    close(fd);
    char url[128], hostport[64];
    snprintf(url, sizeof url, "tcp://127.0.0.1:%u?rank=1&world_size=2", (unsigned)port);
    snprintf(hostport, sizeof hostport, "127.0.0.1:%u", (unsigned)port);
    tdist_init_opts_t o;
    tdist_init_opts_init(&o);
    o.timeout_ms = 1000;
    tdist_world_t *w = NULL;
    double t0 = tdist_test_now_ms();
    tdist_status_t st = tdist_init(url, &o, &w);
    double el = tdist_test_now_ms() - t0;
    if (st != TDIST_ERR_TIMEOUT && st != TDIST_ERR_CONNECTION)
        FAIL("got %s (%s), expected TIMEOUT or CONNECTION", tdist_status_str(st), tdist_last_error());
    ASSERT_CONTAINS(tdist_last_error(), "cannot reach the store at");
    ASSERT_CONTAINS(tdist_last_error(), hostport);
    ASSERT_TRUE(w == NULL);
    ASSERT_LE(el, 1000 + 1000);
    ASSERT_GE(el, 1000 - 100); /* refused connections are retried until the deadline */
}

/* ------------------------------------------------------------ file:// */

typedef struct file_arg {
    char path[512];
    const char *counter; /* a fresh counter key per job on the same file */
} file_arg_t;

static void file_body(int rank, int n, void *arg)
{
    const file_arg_t *a = arg;
    const char *path = a->path;
    clear_init_env();
    char url[1024];
    snprintf(url, sizeof url, "file://%s?rank=%d&world_size=%d", path, rank, n);
    tdist_init_opts_t o;
    tdist_init_opts_init(&o);
    o.timeout_ms = 30000;
    int fds = tdist_test_count_fds();
    tdist_world_t *w = NULL;
    ASSERT_OK(tdist_init(url, &o, &w));
    ASSERT_EQ(tdist_world_rank(w), rank);
    ASSERT_EQ(tdist_world_size(w), n);
    ASSERT_EQ(tdist_world_local_rank(w), rank);
    ASSERT_EQ(tdist_world_local_size(w), n);
    check_shared_store_named(w, a->counter);
    tdist_world_destroy(w);
    ASSERT_EQ(tdist_test_count_fds(), fds);
}

TEST(init_file_4_ranks, 60)
{
    file_arg_t a = {.counter = "counter"};
    snprintf(a.path, sizeof a.path, "%s/store", tdist_test_tmpdir());
    const char *path = a.path;
    tdist_ranks_opts_t ro;
    tdist_ranks_opts_init(&ro, 4);
    ro.with_store = false;
    ASSERT_EQ(tdist_test_spawn_ranks(&ro, file_body, &a, NULL), 0);

    /* The last rank to leave removed the rendezvous keys; the user's stay. */
    tdist_store_t *s = NULL;
    ASSERT_OK(tdist_store_file_create(path, NULL, &s));
    const char *rdzv[] = {"tdist/g0/rdzv/rank/0", "tdist/g0/rdzv/rank/3",
                          "tdist/g0/rdzv/arrived", "tdist/g0/rdzv/left"};
    for (size_t i = 0; i < 4; i++) {
        bool exists = true;
        ASSERT_OK(tdist_store_check(s, &rdzv[i], 1, &exists));
        if (exists) FAIL("rendezvous key %s left in the file store", rdzv[i]);
    }
    const char *user[] = {"tdist/g0/user/k/0", "tdist/g0/user/k/3", "tdist/g0/user/counter"};
    bool exists = false;
    ASSERT_OK(tdist_store_check(s, user, 3, &exists));
    ASSERT_TRUE(exists);
    int64_t count = 0;
    ASSERT_OK(tdist_store_num_keys(s, &count));
    ASSERT_EQ(count, 5); /* k/0..k/3 and counter */
    tdist_store_destroy(s);

    /* The same file serves a second job once the first has left. */
    a.counter = "counter2";
    ASSERT_EQ(tdist_test_spawn_ranks(&ro, file_body, &a, NULL), 0);
}

/* ------------------------------------------------------------ bad input */

typedef struct bad_case {
    const char *url;
    const char *needle;
} bad_case_t;

TEST(init_malformed_urls, 30)
{
    clear_init_env();
    tdist_init_opts_t o;
    tdist_init_opts_init(&o);
    o.timeout_ms = 2000;
    static const bad_case_t cases[] = {
        {"", "unsupported scheme"},
        {"foo://x:1?rank=0&world_size=1", "unsupported scheme"},
        {"tcp:/127.0.0.1:5?rank=0&world_size=1", "unsupported scheme"},
        {"tcp://", "missing \":PORT\""},
        {"tcp://127.0.0.1?rank=0&world_size=1", "missing \":PORT\""},
        {"tcp://127.0.0.1:?rank=0&world_size=1", "port \"\""},
        {"tcp://127.0.0.1:0?rank=0&world_size=1", "port \"0\""},
        {"tcp://127.0.0.1:99999?rank=0&world_size=1", "port \"99999\""},
        {"tcp://127.0.0.1:12x?rank=0&world_size=1", "port \"12x\""},
        {"tcp://:1234?rank=0&world_size=1", "empty host"},
        {"tcp://::1:1234?rank=0&world_size=1", "brackets"},
        {"tcp://[::1:1234?rank=0&world_size=1", "closing ']'"},
        {"tcp://[::1]1234?rank=0&world_size=1", "missing \":PORT\""},
        {"tcp://[]:1234?rank=0&world_size=1", "empty host"},
        {"tcp://h/x:1234?rank=0&world_size=1", "invalid character"},
        {"tcp://127.0.0.1:1234", "has no rank"},
        {"tcp://127.0.0.1:1234?world_size=2", "has no rank"},
        {"tcp://127.0.0.1:1234?rank=0", "has no world_size"},
        {"tcp://127.0.0.1:1234?rank=-1&world_size=2", "rank=\"-1\""},
        {"tcp://127.0.0.1:1234?rank=2&world_size=2", "rank 2 is not below the world size 2"},
        {"tcp://127.0.0.1:1234?rank=0&world_size=0", "world_size=\"0\""},
        {"tcp://127.0.0.1:1234?rank=0&world_size=abc", "world_size=\"abc\""},
        {"tcp://127.0.0.1:1234?rank=0&world_size=2&foo=1", "unknown parameter \"foo\""},
        {"tcp://127.0.0.1:1234?rank=0&rank=1&world_size=2", "rank given twice"},
        {"tcp://127.0.0.1:1234?rank&world_size=2", "has no value"},
        {"file://relative/path?rank=0&world_size=1", "absolute path"},
        {"file://?rank=0&world_size=1", "absolute path"},
        {"file:///?rank=0&world_size=1", "only \"/\""},
        {"file:///tmp/x", "has no rank"},
        {"env://host:1234", "env:// takes no host"},
        {"env://?bogus=1", "unknown parameter \"bogus\""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        tdist_world_t *w = (tdist_world_t *)&o;
        tdist_status_t st = tdist_init(cases[i].url, &o, &w);
        if (st != TDIST_ERR_INVALID_ARG)
            FAIL("\"%s\": got %s (%s), expected TDIST_ERR_INVALID_ARG", cases[i].url,
                 tdist_status_str(st), tdist_last_error());
        if (!strstr(tdist_last_error(), cases[i].needle))
            FAIL("\"%s\": message \"%s\" lacks \"%s\"", cases[i].url, tdist_last_error(),
                 cases[i].needle);
        ASSERT_TRUE(w == (tdist_world_t *)&o);
    }
    /* a URL error names the URL */
    ASSERT_STATUS(tdist_init("tcp://127.0.0.1:0?rank=0&world_size=1", &o, &(tdist_world_t *){NULL}),
                  TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "\"tcp://127.0.0.1:0?rank=0&world_size=1\"");

    /* too long */
    size_t n = 5000;
    char *lng = malloc(n + 1);
    ASSERT_TRUE(lng != NULL);
    memcpy(lng, "tcp://", 6);
    memset(lng + 6, 'a', n - 6);
    lng[n] = '\0';
    tdist_world_t *w = NULL;
    ASSERT_STATUS(tdist_init(lng, &o, &w), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "longer than 4096");
    free(lng);

    /* bad options */
    ASSERT_STATUS(tdist_init("env://", &o, NULL), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "out is NULL");
    tdist_init_opts_t bad = o;
    bad.rank = -5;
    ASSERT_STATUS(tdist_init("env://", &bad, &w), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "opts.rank");
    bad = o;
    bad.world_size = 0;
    ASSERT_STATUS(tdist_init("env://", &bad, &w), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "opts.world_size");
    bad = o;
    bad.timeout_ms = 0;
    ASSERT_STATUS(tdist_init("env://", &bad, &w), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "opts.timeout_ms");
    bad = o;
    bad.listen_fd = -7;
    ASSERT_STATUS(tdist_init("env://", &bad, &w), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "opts.listen_fd");
    bad = o;
    bad.rank = 3;
    bad.world_size = 3;
    ASSERT_STATUS(tdist_init("tcp://127.0.0.1:5", &bad, &w), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "rank 3 is not below the world size 3");
    ASSERT_TRUE(w == NULL);

    /* NULL world: accessors and destroy do nothing */
    tdist_world_destroy(NULL);
    ASSERT_EQ(tdist_world_rank(NULL), -1);
    ASSERT_EQ(tdist_world_size(NULL), -1);
    ASSERT_TRUE(tdist_world_store(NULL) == NULL);
}

typedef struct env_case {
    const char *name;  /* variable to change */
    const char *value; /* NULL: unset it */
    const char *needle;
} env_case_t;

static void set_good_env(void)
{
    clear_init_env();
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", "1", 1);
    setenv("RANK", "0", 1);
    setenv("WORLD_SIZE", "2", 1);
}

TEST(init_bad_env_values, 30)
{
    static const env_case_t cases[] = {
        {"MASTER_ADDR", NULL, "MASTER_ADDR is not set"},
        {"MASTER_ADDR", "", "MASTER_ADDR is not set"},
        {"MASTER_PORT", NULL, "MASTER_PORT is not set"},
        {"MASTER_PORT", "abc", "MASTER_PORT=\"abc\""},
        {"MASTER_PORT", "70000", "MASTER_PORT=\"70000\""},
        {"MASTER_PORT", "0", "MASTER_PORT=\"0\""},
        {"RANK", NULL, "RANK is not set"},
        {"RANK", "x", "RANK=\"x\""},
        {"RANK", "-1", "RANK=\"-1\""},
        {"RANK", "2", "rank 2 is not below the world size 2"},
        {"WORLD_SIZE", NULL, "WORLD_SIZE is not set"},
        {"WORLD_SIZE", "0", "WORLD_SIZE=\"0\""},
        {"WORLD_SIZE", "2x", "WORLD_SIZE=\"2x\""},
        {"LOCAL_RANK", "abc", "LOCAL_RANK=\"abc\""},
        {"LOCAL_WORLD_SIZE", "0", "LOCAL_WORLD_SIZE=\"0\""},
        {"TDIST_RESTART_COUNT", "-1", "TDIST_RESTART_COUNT=\"-1\""},
        {"TDIST_RESTART_COUNT", "one", "TDIST_RESTART_COUNT=\"one\""},
        {"TDIST_LAUNCHER_STORE", "yes", "TDIST_LAUNCHER_STORE=\"yes\""},
        {"TDIST_STORE_LISTEN_FD", "x", "TDIST_STORE_LISTEN_FD=\"x\""},
        {"TDIST_HOSTNAME", "", "TDIST_HOSTNAME"},
        {"TDIST_TIMEOUT_MS", "10s", "TDIST_TIMEOUT_MS=\"10s\""},
        {"TDIST_TIMEOUT_MS", "0", "TDIST_TIMEOUT_MS=\"0\""},
    };
    tdist_init_opts_t o;
    tdist_init_opts_init(&o);
    o.timeout_ms = 2000;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        set_good_env();
        if (cases[i].value)
            setenv(cases[i].name, cases[i].value, 1);
        else
            unsetenv(cases[i].name);
        tdist_world_t *w = NULL;
        tdist_status_t st = tdist_init("env://", &o, &w);
        if (st != TDIST_ERR_INVALID_ARG)
            FAIL("%s=%s: got %s (%s), expected TDIST_ERR_INVALID_ARG", cases[i].name,
                 cases[i].value ? cases[i].value : "(unset)", tdist_status_str(st), tdist_last_error());
        if (!strstr(tdist_last_error(), cases[i].needle))
            FAIL("%s: message \"%s\" lacks \"%s\"", cases[i].name, tdist_last_error(), cases[i].needle);
        ASSERT_TRUE(w == NULL);
    }
    /* LOCAL_RANK must be below LOCAL_WORLD_SIZE */
    set_good_env();
    setenv("LOCAL_RANK", "2", 1);
    setenv("LOCAL_WORLD_SIZE", "2", 1);
    tdist_world_t *w = NULL;
    ASSERT_STATUS(tdist_init(NULL, &o, &w), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "LOCAL_RANK=2 is not below LOCAL_WORLD_SIZE=2");
    /* an unusable listen fd on rank 0 is an error naming it, not a crash */
    set_good_env();
    tdist_init_opts_t o2 = o;
    o2.listen_fd = 1000;
    ASSERT_TRUE(fcntl(1000, F_GETFD) == -1);
    tdist_status_t st = tdist_init(NULL, &o2, &w);
    ASSERT_TRUE(st != TDIST_OK);
    ASSERT_CONTAINS(tdist_last_error(), "listen fd 1000");
    ASSERT_TRUE(w == NULL);
}
