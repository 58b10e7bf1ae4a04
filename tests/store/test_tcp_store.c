/*
 * tests/store/test_tcp_store.c — the TCP store server and client: every
 * operation, many concurrent clients, waiters and timeouts, the shared
 * secret, dead and missing servers, address in use, fd leaks, lazy
 * reconnection. (Bad frames are in test_tcp_frames.c.)
 */
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "store_clients.h"

/* ------------------------------------------------------------- helpers */

/* A server on 127.0.0.1:0 with default options (or opts). */
static tdist_store_server_t *start_server(const tdist_store_server_opts_t *opts)
{
    tdist_store_server_t *srv = NULL;
    ASSERT_OK(tdist_store_server_create("127.0.0.1", 0, opts, &srv));
    ASSERT_TRUE(tdist_store_server_port(srv) != 0);
    return srv;
}

/* A client of srv with timeout_ms (connect timeout the same). */
static tdist_store_t *connect_to(uint16_t port, int64_t timeout_ms, const char *token)
{
    tdist_store_opts_t o;
    tdist_store_opts_init(&o);
    o.timeout_ms = timeout_ms;
    o.connect_timeout_ms = timeout_ms;
    o.token = token;
    tdist_store_t *s = NULL;
    ASSERT_OK(tdist_store_tcp_connect("127.0.0.1", port, &o, &s));
    return s;
}

static int64_t default_timeout(void) { return (int64_t)(20000 * tdist_test_timeout_mult()); }

/* Get key and compare with the string want. */
static void expect_value(tdist_store_t *s, const char *key, const char *want)
{
    void *v = NULL;
    size_t n = 0;
    ASSERT_OK(tdist_store_get(s, key, &v, &n));
    ASSERT_EQ(n, strlen(want));
    ASSERT_MEMEQ(v, want, n);
    free(v);
}

/* ------------------------------------------------------------- basics */

TEST(store_tcp_every_op_roundtrip, 30)
{
    tdist_store_server_t *srv = start_server(NULL);
    tdist_store_t *s = connect_to(tdist_store_server_port(srv), default_timeout(), NULL);
    ASSERT_EQ(tdist_store_server_num_clients(srv), 1);

    ASSERT_OK(tdist_store_set(s, "a", "hello", 5));
    expect_value(s, "a", "hello");
    ASSERT_OK(tdist_store_set(s, "empty", NULL, 0));
    expect_value(s, "empty", "");

    int64_t r = 0;
    ASSERT_OK(tdist_store_add(s, "cnt", 5, &r));
    ASSERT_EQ(r, 5);
    ASSERT_OK(tdist_store_add(s, "cnt", -7, &r));
    ASSERT_EQ(r, -2);
    expect_value(s, "cnt", "-2");
    ASSERT_STATUS(tdist_store_add(s, "a", 1, &r), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "not an integer");
    ASSERT_CONTAINS(tdist_last_error(), "127.0.0.1:");

    /* compare_set, torch.distributed's rule */
    void *cur = NULL;
    size_t cl = 0;
    ASSERT_OK(tdist_store_compare_set(s, "cas", "x", 1, "y", 1, &cur, &cl)); /* missing, expected set */
    ASSERT_EQ(cl, 1);
    ASSERT_MEMEQ(cur, "x", 1);
    free(cur);
    bool ok = true;
    ASSERT_OK(tdist_store_check(s, (const char *[]){"cas"}, 1, &ok));
    ASSERT_FALSE(ok);
    ASSERT_OK(tdist_store_compare_set(s, "cas", NULL, 0, "v1", 2, &cur, &cl)); /* missing, empty expected */
    ASSERT_EQ(cl, 2);
    ASSERT_MEMEQ(cur, "v1", 2);
    free(cur);
    ASSERT_OK(tdist_store_compare_set(s, "cas", "no", 2, "v2", 2, &cur, &cl)); /* mismatch */
    ASSERT_MEMEQ(cur, "v1", 2);
    free(cur);
    ASSERT_OK(tdist_store_compare_set(s, "cas", "v1", 2, "v2", 2, &cur, &cl)); /* match */
    ASSERT_MEMEQ(cur, "v2", 2);
    free(cur);
    ASSERT_OK(tdist_store_compare_set(s, "cas", "v2", 2, "v3", 2, NULL, NULL));
    expect_value(s, "cas", "v3");

    const char *keys[] = {"a", "cnt", "cas"};
    ASSERT_OK(tdist_store_check(s, keys, 3, &ok));
    ASSERT_TRUE(ok);
    ASSERT_OK(tdist_store_wait(s, keys, 3, 1000));

    int64_t count = 0;
    ASSERT_OK(tdist_store_num_keys(s, &count));
    ASSERT_EQ(count, 4); /* a, empty, cnt, cas */
    bool deleted = false;
    ASSERT_OK(tdist_store_delete_key(s, "empty", &deleted));
    ASSERT_TRUE(deleted);
    ASSERT_OK(tdist_store_delete_key(s, "empty", &deleted));
    ASSERT_FALSE(deleted);
    ASSERT_OK(tdist_store_num_keys(s, &count));
    ASSERT_EQ(count, 3);

    ASSERT_OK(tdist_store_append(s, "app", "ab", 2));
    ASSERT_OK(tdist_store_append(s, "app", "cd", 2));
    ASSERT_OK(tdist_store_append(s, "app", NULL, 0));
    expect_value(s, "app", "abcd");

    const char *mk[] = {"m1", "m2", "m3"};
    const void *mv[] = {"one", "", "three"};
    size_t ml[] = {3, 0, 5};
    ASSERT_OK(tdist_store_multi_set(s, mk, mv, ml, 3));
    void *vals[3] = {0};
    size_t lens[3] = {0};
    ASSERT_OK(tdist_store_multi_get(s, mk, 3, vals, lens));
    for (int i = 0; i < 3; i++) {
        ASSERT_EQ(lens[i], ml[i]);
        ASSERT_MEMEQ(vals[i], mv[i], ml[i]);
        ASSERT_TRUE(vals[i] != NULL);
        free(vals[i]);
    }

    /* a big value goes through in one piece */
    size_t big = 8u << 20;
    unsigned char *bv = malloc(big);
    ASSERT_TRUE(bv != NULL);
    for (size_t i = 0; i < big; i++) bv[i] = (unsigned char)(i * 131u + 7u);
    ASSERT_OK(tdist_store_set(s, "big", bv, big));
    void *got = NULL;
    size_t gl = 0;
    ASSERT_OK(tdist_store_get(s, "big", &got, &gl));
    ASSERT_EQ(gl, big);
    ASSERT_MEMEQ(got, bv, big);
    free(got);
    free(bv);

    /* a key of the maximum length works; one byte more is refused locally */
    char *lk = malloc(TDIST_STORE_MAX_KEY + 2);
    memset(lk, 'k', TDIST_STORE_MAX_KEY + 1);
    lk[TDIST_STORE_MAX_KEY] = '\0';
    ASSERT_OK(tdist_store_set(s, lk, "v", 1));
    expect_value(s, lk, "v");
    lk[TDIST_STORE_MAX_KEY] = 'k';
    lk[TDIST_STORE_MAX_KEY + 1] = '\0';
    ASSERT_STATUS(tdist_store_set(s, lk, "v", 1), TDIST_ERR_INVALID_ARG);
    free(lk);

    tdist_store_destroy(s);
    wait_clients(srv, 0);
    tdist_store_server_destroy(srv);
}

TEST(store_tcp_bad_arguments, 10)
{
    tdist_store_t *s = NULL;
    ASSERT_STATUS(tdist_store_tcp_connect(NULL, 1, NULL, &s), TDIST_ERR_INVALID_ARG);
    ASSERT_STATUS(tdist_store_tcp_connect("127.0.0.1", 0, NULL, &s), TDIST_ERR_INVALID_ARG);
    ASSERT_STATUS(tdist_store_tcp_connect("127.0.0.1", 1, NULL, NULL), TDIST_ERR_INVALID_ARG);
    ASSERT_TRUE(s == NULL);
    tdist_store_server_t *srv = NULL;
    ASSERT_STATUS(tdist_store_server_create(NULL, 0, NULL, &srv), TDIST_ERR_INVALID_ARG);
    ASSERT_STATUS(tdist_store_server_create("127.0.0.1", 0, NULL, NULL), TDIST_ERR_INVALID_ARG);
    tdist_store_server_opts_t so;
    tdist_store_server_opts_init(&so);
    so.max_clients = 0;
    ASSERT_STATUS(tdist_store_server_create("127.0.0.1", 0, &so, &srv), TDIST_ERR_INVALID_ARG);
    ASSERT_TRUE(srv == NULL);
    ASSERT_EQ(tdist_store_server_port(NULL), 0);
    ASSERT_EQ(tdist_store_server_num_clients(NULL), 0);
    tdist_store_server_destroy(NULL);
    ASSERT_STATUS(tdist_store_server_create("not a host name!", 0, NULL, &srv), TDIST_ERR_CONNECTION);
    ASSERT_CONTAINS(tdist_last_error(), "not a host name!:0");
}

/* ----------------------------------------------------------- concurrency */

#define HAMMER_THREADS 64
#define HAMMER_ITERS 50

typedef struct hammer_arg {
    uint16_t port;
    int id;
    int failed;
    char err[512];
} hammer_arg_t;

/* One of 64 clients: adds to a shared counter, sets its own keys and reads
 * its own and a neighbour's. */
static void *hammer(void *p)
{
    hammer_arg_t *a = p;
    tdist_store_opts_t o;
    tdist_store_opts_init(&o);
    o.timeout_ms = default_timeout();
    o.connect_timeout_ms = o.timeout_ms;
    tdist_store_t *s = NULL;
    char key[64], val[64];
#define HCHECK(expr)                                                                  \
    do {                                                                              \
        if ((expr) != TDIST_OK) {                                                     \
            snprintf(a->err, sizeof a->err, "%s: %s", #expr, tdist_last_error());     \
            a->failed = 1;                                                            \
            goto out;                                                                 \
        }                                                                             \
    } while (0)
    HCHECK(tdist_store_tcp_connect("127.0.0.1", a->port, &o, &s));
    for (int i = 0; i < HAMMER_ITERS; i++) {
        int64_t r;
        HCHECK(tdist_store_add(s, "counter", 1, &r));
        if (r < 1 || r > HAMMER_THREADS * HAMMER_ITERS) {
            snprintf(a->err, sizeof a->err, "add returned %lld", (long long)r);
            a->failed = 1;
            goto out;
        }
        snprintf(key, sizeof key, "t%d/k%d", a->id, i);
        snprintf(val, sizeof val, "v%d-%d", a->id, i);
        HCHECK(tdist_store_set(s, key, val, strlen(val)));
        void *v = NULL;
        size_t n = 0;
        HCHECK(tdist_store_get(s, key, &v, &n));
        int same = n == strlen(val) && memcmp(v, val, n) == 0;
        free(v);
        if (!same) {
            snprintf(a->err, sizeof a->err, "get %s returned the wrong value", key);
            a->failed = 1;
            goto out;
        }
    }
    /* the neighbour's last key: blocks until that thread has set it */
    snprintf(key, sizeof key, "t%d/k%d", (a->id + 1) % HAMMER_THREADS, HAMMER_ITERS - 1);
    void *v = NULL;
    size_t n = 0;
    HCHECK(tdist_store_get(s, key, &v, &n));
    free(v);
    HCHECK(tdist_store_add(s, "done", 1, NULL));
out:
    tdist_store_destroy(s);
    return NULL;
#undef HCHECK
}

TEST(store_tcp_64_concurrent_clients, 120)
{
    tdist_store_server_t *srv = start_server(NULL);
    pthread_t th[HAMMER_THREADS];
    hammer_arg_t args[HAMMER_THREADS];
    for (int i = 0; i < HAMMER_THREADS; i++) {
        args[i] = (hammer_arg_t){.port = tdist_store_server_port(srv), .id = i};
        ASSERT_EQ(pthread_create(&th[i], NULL, hammer, &args[i]), 0);
    }
    for (int i = 0; i < HAMMER_THREADS; i++) ASSERT_EQ(pthread_join(th[i], NULL), 0);
    for (int i = 0; i < HAMMER_THREADS; i++)
        if (args[i].failed) FAIL("client %d: %s", i, args[i].err);
    tdist_store_t *s = connect_to(tdist_store_server_port(srv), default_timeout(), NULL);
    int64_t r = 0;
    ASSERT_OK(tdist_store_add(s, "counter", 0, &r));
    ASSERT_EQ(r, HAMMER_THREADS * HAMMER_ITERS);
    ASSERT_OK(tdist_store_add(s, "done", 0, &r));
    ASSERT_EQ(r, HAMMER_THREADS);
    int64_t count = 0;
    ASSERT_OK(tdist_store_num_keys(s, &count));
    ASSERT_EQ(count, HAMMER_THREADS * HAMMER_ITERS + 2);
    tdist_store_destroy(s);
    wait_clients(srv, 0);
    tdist_store_server_destroy(srv);
}

/* Hundreds of connections open at once on one event loop. */
TEST(store_tcp_300_connections_at_once, 120)
{
    enum { N = 300 };
    tdist_store_server_t *srv = start_server(NULL);
    uint16_t port = tdist_store_server_port(srv);
    tdist_store_t **cl = calloc(N, sizeof *cl);
    ASSERT_TRUE(cl != NULL);
    char key[32], val[32];
    for (int i = 0; i < N; i++) {
        cl[i] = connect_to(port, default_timeout(), NULL);
        snprintf(key, sizeof key, "c%d", i);
        ASSERT_OK(tdist_store_set(cl[i], key, key, strlen(key)));
    }
    ASSERT_EQ(tdist_store_server_num_clients(srv), N);
    for (int i = 0; i < N; i++) {
        snprintf(key, sizeof key, "c%d", (i + 7) % N);
        snprintf(val, sizeof val, "c%d", (i + 7) % N);
        expect_value(cl[i], key, val);
    }
    for (int i = 0; i < N; i++) tdist_store_destroy(cl[i]);
    free(cl);
    wait_clients(srv, 0);
    tdist_store_server_destroy(srv);
}

/* ------------------------------------------------------------- waiting */

typedef struct waiter_arg {
    uint16_t port;
    const char *key;
    int mode; /* 0 get, 1 wait on two keys, 2 multi_get */
    tdist_status_t st;
    char value[64];
} waiter_arg_t;

static void *waiter(void *p)
{
    waiter_arg_t *a = p;
    tdist_store_opts_t o;
    tdist_store_opts_init(&o);
    o.timeout_ms = default_timeout();
    tdist_store_t *s = NULL;
    a->st = tdist_store_tcp_connect("127.0.0.1", a->port, &o, &s);
    if (a->st != TDIST_OK) return NULL;
    if (a->mode == 0) {
        void *v = NULL;
        size_t n = 0;
        a->st = tdist_store_get(s, a->key, &v, &n);
        if (a->st == TDIST_OK) {
            snprintf(a->value, sizeof a->value, "%.*s", (int)n, (char *)v);
            free(v);
        }
    } else if (a->mode == 1) {
        const char *keys[] = {"w1", "w2"};
        a->st = tdist_store_wait(s, keys, 2, -1);
    } else {
        const char *keys[] = {"w2", "w1"};
        void *v[2] = {0};
        size_t n[2] = {0};
        a->st = tdist_store_multi_get(s, keys, 2, v, n);
        if (a->st == TDIST_OK) {
            snprintf(a->value, sizeof a->value, "%.*s+%.*s", (int)n[0], (char *)v[0], (int)n[1],
                     (char *)v[1]);
            free(v[0]);
            free(v[1]);
        }
    }
    tdist_store_destroy(s);
    return NULL;
}

/* Parked get/wait/multi_get are woken by set, add, append, compare_set and
 * multi_set from another client. */
TEST(store_tcp_waiters_woken_by_writes, 60)
{
    tdist_store_server_t *srv = start_server(NULL);
    uint16_t port = tdist_store_server_port(srv);
    enum { NW = 8 };
    pthread_t th[NW];
    waiter_arg_t a[NW];
    const char *keys[NW] = {"g-set", "g-set", "g-add", "g-append", "g-cas", "g-multi", "", ""};
    for (int i = 0; i < NW; i++) {
        a[i] = (waiter_arg_t){.port = port, .key = keys[i], .mode = i < 6 ? 0 : (i == 6 ? 1 : 2)};
        ASSERT_EQ(pthread_create(&th[i], NULL, waiter, &a[i]), 0);
    }
    wait_clients(srv, NW);
    usleep(100 * 1000); /* let them park */
    tdist_store_t *s = connect_to(port, default_timeout(), NULL);
    ASSERT_OK(tdist_store_set(s, "g-set", "S", 1));
    ASSERT_OK(tdist_store_add(s, "g-add", 3, NULL));
    ASSERT_OK(tdist_store_append(s, "g-append", "A", 1));
    ASSERT_OK(tdist_store_compare_set(s, "g-cas", NULL, 0, "C", 1, NULL, NULL));
    const char *mk[] = {"g-multi", "w1"};
    const void *mv[] = {"M", "one"};
    size_t ml[] = {1, 3};
    ASSERT_OK(tdist_store_multi_set(s, mk, mv, ml, 2));
    ASSERT_OK(tdist_store_set(s, "w2", "two", 3));
    for (int i = 0; i < NW; i++) ASSERT_EQ(pthread_join(th[i], NULL), 0);
    const char *want[NW] = {"S", "S", "3", "A", "C", "M", "", "two+one"};
    for (int i = 0; i < NW; i++) {
        if (a[i].st != TDIST_OK) FAIL("waiter %d: %s", i, tdist_status_str(a[i].st));
        ASSERT_STREQ(a[i].value, want[i]);
    }
    tdist_store_destroy(s);
    wait_clients(srv, 0);
    tdist_store_server_destroy(srv);
}

/* get and wait time out at their deadline: not before, and within 1 s. */
TEST(store_tcp_get_wait_timeout_within_deadline, 60)
{
    tdist_store_server_t *srv = start_server(NULL);
    tdist_store_t *s = connect_to(tdist_store_server_port(srv), default_timeout(), NULL);
    const int64_t t = 600;

    ASSERT_OK(tdist_store_set_timeout(s, t));
    void *v = NULL;
    size_t n = 0;
    double t0 = tdist_test_now_ms();
    ASSERT_STATUS(tdist_store_get(s, "missing", &v, &n), TDIST_ERR_TIMEOUT);
    double el = tdist_test_now_ms() - t0;
    ASSERT_CONTAINS(tdist_last_error(), "missing");
    ASSERT_CONTAINS(tdist_last_error(), "127.0.0.1:");
    ASSERT_GE(el, t);
    ASSERT_LE(el, t + 1000);

    const char *keys[] = {"present", "absent"};
    ASSERT_OK(tdist_store_set(s, "present", "1", 1));
    t0 = tdist_test_now_ms();
    ASSERT_STATUS(tdist_store_wait(s, keys, 2, 800), TDIST_ERR_TIMEOUT);
    el = tdist_test_now_ms() - t0;
    ASSERT_CONTAINS(tdist_last_error(), "absent");
    ASSERT_GE(el, 800);
    ASSERT_LE(el, 800 + 1000);

    t0 = tdist_test_now_ms();
    void *vals[2];
    size_t lens[2];
    ASSERT_STATUS(tdist_store_multi_get(s, keys, 2, vals, lens), TDIST_ERR_TIMEOUT);
    el = tdist_test_now_ms() - t0;
    ASSERT_GE(el, t);
    ASSERT_LE(el, t + 1000);

    /* timeout 0: answers at once */
    t0 = tdist_test_now_ms();
    ASSERT_STATUS(tdist_store_wait(s, keys, 2, 0), TDIST_ERR_TIMEOUT);
    ASSERT_LE(tdist_test_now_ms() - t0, 500);

    /* the connection is still good after timeouts, and no entry was left
     * behind by the waiters */
    ASSERT_OK(tdist_store_set_timeout(s, default_timeout()));
    int64_t count = 0;
    ASSERT_OK(tdist_store_num_keys(s, &count));
    ASSERT_EQ(count, 1);
    tdist_store_destroy(s);
    tdist_store_server_destroy(srv);
}

/* ------------------------------------------------------------- secrets */

TEST(store_tcp_token_refused_and_accepted, 30)
{
    tdist_store_server_opts_t so;
    tdist_store_server_opts_init(&so);
    so.token = "s3cret-token";
    tdist_store_server_t *srv = start_server(&so);
    uint16_t port = tdist_store_server_port(srv);
    unsetenv("TDIST_STORE_TOKEN");
    unsetenv("TDIST_JOB_SECRET");

    tdist_store_opts_t o;
    tdist_store_opts_init(&o);
    o.timeout_ms = default_timeout();
    tdist_store_t *s = NULL;
    ASSERT_STATUS(tdist_store_tcp_connect("127.0.0.1", port, &o, &s), TDIST_ERR_AUTH);
    ASSERT_CONTAINS(tdist_last_error(), "requires the job's secret and this process has none");
    ASSERT_CONTAINS(tdist_last_error(), "127.0.0.1:");
    o.token = "s3cret-tokeX";
    ASSERT_STATUS(tdist_store_tcp_connect("127.0.0.1", port, &o, &s), TDIST_ERR_AUTH);
    ASSERT_CONTAINS(tdist_last_error(), "wrong secret");
    o.token = "s3cret-token-longer";
    ASSERT_STATUS(tdist_store_tcp_connect("127.0.0.1", port, &o, &s), TDIST_ERR_AUTH);
    ASSERT_TRUE(s == NULL);
    wait_clients(srv, 0);

    o.token = "s3cret-token";
    ASSERT_OK(tdist_store_tcp_connect("127.0.0.1", port, &o, &s));
    ASSERT_OK(tdist_store_set(s, "k", "v", 1));
    expect_value(s, "k", "v");
    tdist_store_destroy(s);

    /* the token from the environment, on both sides */
    setenv("TDIST_STORE_TOKEN", "s3cret-token", 1);
    o.token = NULL;
    s = NULL;
    ASSERT_OK(tdist_store_tcp_connect("127.0.0.1", port, &o, &s));
    expect_value(s, "k", "v");
    tdist_store_destroy(s);
    tdist_store_server_destroy(srv);

    tdist_store_server_t *srv2 = start_server(NULL); /* token from the environment */
    port = tdist_store_server_port(srv2);
    s = connect_to(port, default_timeout(), NULL);
    tdist_store_destroy(s);
    unsetenv("TDIST_STORE_TOKEN");
    ASSERT_STATUS(tdist_store_tcp_connect("127.0.0.1", port, &o, &s), TDIST_ERR_AUTH);
    tdist_store_server_destroy(srv2);

    /* TDIST_JOB_SECRET wins over TDIST_STORE_TOKEN; a client with a secret
     * refuses a server that asks for none (it is not this job's store) */
    setenv("TDIST_JOB_SECRET", "job-secret", 1);
    setenv("TDIST_STORE_TOKEN", "other", 1);
    srv2 = start_server(NULL);
    port = tdist_store_server_port(srv2);
    o.token = "job-secret";
    ASSERT_OK(tdist_store_tcp_connect("127.0.0.1", port, &o, &s));
    tdist_store_destroy(s);
    o.token = "other";
    ASSERT_STATUS(tdist_store_tcp_connect("127.0.0.1", port, &o, &s), TDIST_ERR_AUTH);
    tdist_store_server_destroy(srv2);
    unsetenv("TDIST_JOB_SECRET");
    unsetenv("TDIST_STORE_TOKEN");
    srv2 = start_server(NULL);
    o.token = "job-secret";
    ASSERT_STATUS(tdist_store_tcp_connect("127.0.0.1", tdist_store_server_port(srv2), &o, &s),
                  TDIST_ERR_AUTH);
    ASSERT_CONTAINS(tdist_last_error(), "does not ask for the job's secret");
    tdist_store_server_destroy(srv2);
}

/* ------------------------------------------------------- failing servers */

typedef struct killer_arg {
    pid_t pid;
    int delay_ms;
} killer_arg_t;

static void *killer(void *p)
{
    killer_arg_t *k = p;
    usleep((useconds_t)k->delay_ms * 1000);
    kill(k->pid, SIGKILL);
    return NULL;
}

/* A server in a child process killed with SIGKILL: a client blocked in get
 * and a client calling afterwards both fail naming 127.0.0.1:<port>, well
 * within their deadline. */
TEST(store_tcp_killed_server_names_address, 60)
{
    int up[2];
    ASSERT_EQ(pipe(up), 0);
    pid_t pid = fork();
    ASSERT_TRUE(pid >= 0);
    if (pid == 0) {
        close(up[0]);
        tdist_store_server_t *srv = NULL;
        if (tdist_store_server_create("127.0.0.1", 0, NULL, &srv) != TDIST_OK) _exit(3);
        uint16_t p = tdist_store_server_port(srv);
        if (write(up[1], &p, sizeof p) != (ssize_t)sizeof p) _exit(4);
        for (int i = 0; i < 600; i++) usleep(100 * 1000); /* killed long before */
        _exit(5);
    }
    close(up[1]);
    uint16_t port = 0;
    ASSERT_EQ(read(up[0], &port, sizeof port), (ssize_t)sizeof port);
    close(up[0]);
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%u", (unsigned)port);

    const int64_t timeout = 5000;
    tdist_store_t *a = connect_to(port, timeout, NULL);
    tdist_store_t *b = connect_to(port, timeout, NULL);
    ASSERT_OK(tdist_store_set(b, "k", "v", 1));

    killer_arg_t k = {.pid = pid, .delay_ms = 300};
    pthread_t th;
    ASSERT_EQ(pthread_create(&th, NULL, killer, &k), 0);
    void *v = NULL;
    size_t n = 0;
    double t0 = tdist_test_now_ms();
    tdist_status_t st = tdist_store_get(a, "never-set", &v, &n);
    double el = tdist_test_now_ms() - t0;
    ASSERT_EQ(pthread_join(th, NULL), 0);
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    ASSERT_TRUE(st == TDIST_ERR_CONNECTION || st == TDIST_ERR_TIMEOUT);
    ASSERT_CONTAINS(tdist_last_error(), addr);
    ASSERT_LE(el, timeout + 1000);

    t0 = tdist_test_now_ms();
    st = tdist_store_set(b, "k", "v2", 2);
    el = tdist_test_now_ms() - t0;
    ASSERT_TRUE(st == TDIST_ERR_CONNECTION || st == TDIST_ERR_TIMEOUT);
    ASSERT_CONTAINS(tdist_last_error(), addr);
    ASSERT_LE(el, timeout + 1000);
    /* and again (now reconnecting to nobody): still bounded, still named */
    t0 = tdist_test_now_ms();
    st = tdist_store_set(b, "k", "v3", 2);
    el = tdist_test_now_ms() - t0;
    ASSERT_TRUE(st == TDIST_ERR_CONNECTION || st == TDIST_ERR_TIMEOUT);
    ASSERT_CONTAINS(tdist_last_error(), addr);
    ASSERT_LE(el, timeout + 1000);
    tdist_store_destroy(a);
    tdist_store_destroy(b);
}

/* A port with no listener (a server's port after it was destroyed). */
static uint16_t unused_port(void)
{
    tdist_store_server_t *srv = start_server(NULL);
    uint16_t port = tdist_store_server_port(srv);
    tdist_store_server_destroy(srv);
    return port;
}

TEST(store_tcp_connect_refused_names_address, 30)
{
    uint16_t port = unused_port();
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%u", (unsigned)port);
    tdist_store_opts_t o;
    tdist_store_opts_init(&o);
    o.timeout_ms = 800;
    o.connect_timeout_ms = 800;
    tdist_store_t *s = NULL;
    double t0 = tdist_test_now_ms();
    tdist_status_t st = tdist_store_tcp_connect("127.0.0.1", port, &o, &s);
    double el = tdist_test_now_ms() - t0;
    ASSERT_TRUE(st == TDIST_ERR_CONNECTION || st == TDIST_ERR_TIMEOUT);
    ASSERT_CONTAINS(tdist_last_error(), addr);
    ASSERT_TRUE(s == NULL);
    ASSERT_GE(el, 700); /* it kept retrying */
    ASSERT_LE(el, 800 + 1000);
}

/* The client retries refused connections while the server starts. */
typedef struct late_arg {
    uint16_t port;
    tdist_store_server_t *srv;
} late_arg_t;

static void *late_server(void *p)
{
    late_arg_t *a = p;
    usleep(400 * 1000);
    if (tdist_store_server_create("127.0.0.1", a->port, NULL, &a->srv) != TDIST_OK) a->srv = NULL;
    return NULL;
}

TEST(store_tcp_connect_waits_for_starting_server, 30)
{
    late_arg_t a = {.port = unused_port()};
    pthread_t th;
    ASSERT_EQ(pthread_create(&th, NULL, late_server, &a), 0);
    tdist_store_t *s = connect_to(a.port, default_timeout(), NULL);
    ASSERT_EQ(pthread_join(th, NULL), 0);
    ASSERT_TRUE(a.srv != NULL);
    ASSERT_OK(tdist_store_set(s, "k", "v", 1));
    tdist_store_destroy(s);
    tdist_store_server_destroy(a.srv);
}

TEST(store_tcp_addr_in_use_names_address, 20)
{
    tdist_store_server_t *srv = start_server(NULL);
    uint16_t port = tdist_store_server_port(srv);
    tdist_store_server_t *srv2 = NULL;
    ASSERT_STATUS(tdist_store_server_create("127.0.0.1", port, NULL, &srv2), TDIST_ERR_ADDR_IN_USE);
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%u", (unsigned)port);
    ASSERT_CONTAINS(tdist_last_error(), addr);
    ASSERT_TRUE(srv2 == NULL);
    tdist_store_server_destroy(srv);
}

/* The server binds only the address it was given. */
TEST(store_tcp_binds_only_given_address, 20)
{
    tdist_store_server_t *srv = start_server(NULL);
    uint16_t port = tdist_store_server_port(srv);
    /* 127.0.0.2 is loopback too, but not the bound address */
    tdist_store_opts_t o;
    tdist_store_opts_init(&o);
    o.timeout_ms = 300;
    o.connect_timeout_ms = 0;
    tdist_store_t *s = NULL;
    ASSERT_TRUE(tdist_store_tcp_connect("127.0.0.2", port, &o, &s) != TDIST_OK);
    ASSERT_CONTAINS(tdist_last_error(), "127.0.0.2:");
    /* and the same port is still free on another loopback address */
    tdist_store_server_t *srv2 = NULL;
    ASSERT_OK(tdist_store_server_create("127.0.0.2", port, NULL, &srv2));
    tdist_store_server_destroy(srv2);
    tdist_store_server_destroy(srv);
}

typedef struct parked_arg {
    tdist_store_t *s;
    tdist_status_t st;
} parked_arg_t;

/* A get of a key nobody sets (fails when the server goes away). */
static void *parked_get(void *p)
{
    parked_arg_t *a = p;
    void *v = NULL;
    size_t n = 0;
    a->st = tdist_store_get(a->s, "never-set", &v, &n);
    if (a->st == TDIST_OK) free(v);
    return NULL;
}

/* create/connect/destroy cycles leave no fd behind. */
TEST(store_tcp_no_fd_leak_over_cycles, 60)
{
    /* warm up lazily created process-wide fds (resolver, ASan, ...) */
    tdist_store_server_t *srv = start_server(NULL);
    tdist_store_t *s = connect_to(tdist_store_server_port(srv), default_timeout(), NULL);
    tdist_store_destroy(s);
    tdist_store_server_destroy(srv);

    int before = tdist_test_count_fds();
    for (int cycle = 0; cycle < 10; cycle++) {
        srv = start_server(NULL);
        tdist_store_t *c[3];
        for (int i = 0; i < 3; i++) {
            c[i] = connect_to(tdist_store_server_port(srv), default_timeout(), NULL);
            ASSERT_OK(tdist_store_set(c[i], "k", "v", 1));
        }
        /* one client parked in a get when the server goes away */
        parked_arg_t pa = {.s = c[0]};
        pthread_t th;
        ASSERT_EQ(pthread_create(&th, NULL, parked_get, &pa), 0);
        tdist_store_destroy(c[1]);
        wait_clients(srv, 2);
        usleep(50 * 1000);
        tdist_store_server_destroy(srv);
        ASSERT_EQ(pthread_join(th, NULL), 0);
        ASSERT_EQ(pa.st, TDIST_ERR_CONNECTION);
        tdist_store_destroy(c[0]);
        tdist_store_destroy(c[2]);
        /* failed connects leak nothing either */
        tdist_store_opts_t o;
        tdist_store_opts_init(&o);
        o.timeout_ms = 100;
        o.connect_timeout_ms = 0;
        tdist_store_t *x = NULL;
        ASSERT_TRUE(tdist_store_tcp_connect("127.0.0.1", unused_port(), &o, &x) != TDIST_OK);
    }
    ASSERT_EQ(tdist_test_count_fds(), before);
}

/* After the server restarts on the same port, a broken client fails once
 * (naming the address) and then reconnects lazily. */
TEST(store_tcp_reconnects_lazily_after_failure, 30)
{
    tdist_store_server_t *srv = start_server(NULL);
    uint16_t port = tdist_store_server_port(srv);
    tdist_store_t *s = connect_to(port, default_timeout(), NULL);
    ASSERT_OK(tdist_store_set(s, "k", "v", 1));
    tdist_store_server_destroy(srv);
    srv = NULL;
    ASSERT_OK(tdist_store_server_create("127.0.0.1", port, NULL, &srv));
    tdist_status_t st = tdist_store_set(s, "k", "v", 1);
    if (st != TDIST_OK) {
        ASSERT_TRUE(st == TDIST_ERR_CONNECTION);
        ASSERT_CONTAINS(tdist_last_error(), "127.0.0.1:");
    }
    ASSERT_OK(tdist_store_set(s, "k2", "w", 1));
    expect_value(s, "k2", "w");
    tdist_store_destroy(s);
    tdist_store_server_destroy(srv);
}

/* Several threads share one client: calls are serialised. */
typedef struct share_arg {
    tdist_store_t *s;
    int failed;
} share_arg_t;

static void *share_worker(void *p)
{
    share_arg_t *a = p;
    for (int i = 0; i < 200; i++)
        if (tdist_store_add(a->s, "shared", 1, NULL) != TDIST_OK) a->failed = 1;
    return NULL;
}

TEST(store_tcp_one_client_many_threads, 60)
{
    tdist_store_server_t *srv = start_server(NULL);
    tdist_store_t *s = connect_to(tdist_store_server_port(srv), default_timeout(), NULL);
    pthread_t th[8];
    share_arg_t a = {.s = s};
    for (int i = 0; i < 8; i++) ASSERT_EQ(pthread_create(&th[i], NULL, share_worker, &a), 0);
    for (int i = 0; i < 8; i++) ASSERT_EQ(pthread_join(th[i], NULL), 0);
    ASSERT_EQ(a.failed, 0);
    int64_t r = 0;
    ASSERT_OK(tdist_store_add(s, "shared", 0, &r));
    ASSERT_EQ(r, 1600);
    ASSERT_EQ(tdist_store_server_num_clients(srv), 1);
    tdist_store_destroy(s);
    tdist_store_server_destroy(srv);
}

/* A server on an already-listening socket; destroy closes it. */
TEST(store_tcp_server_adopts_listening_socket, 20)
{
    int before = tdist_test_count_fds();
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_TRUE(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    tdist_store_server_t *srv = NULL;
    /* not listening yet: refused, and the caller still owns fd */
    ASSERT_STATUS(tdist_store_server_adopt(fd, NULL, &srv), TDIST_ERR_INVALID_ARG);
    ASSERT_EQ(listen(fd, 16), 0);
    socklen_t sl = sizeof a;
    ASSERT_EQ(getsockname(fd, (struct sockaddr *)&a, &sl), 0);
    ASSERT_OK(tdist_store_server_adopt(fd, NULL, &srv));
    ASSERT_EQ(tdist_store_server_port(srv), ntohs(a.sin_port));
    tdist_store_t *s = connect_to(tdist_store_server_port(srv), default_timeout(), NULL);
    ASSERT_OK(tdist_store_set(s, "k", "v", 1));
    expect_value(s, "k", "v");
    tdist_store_destroy(s);
    tdist_store_server_destroy(srv);
    ASSERT_EQ(tdist_test_count_fds(), before);
    ASSERT_STATUS(tdist_store_server_adopt(-1, NULL, &srv), TDIST_ERR_INVALID_ARG);
}

typedef struct many_arg {
    uint16_t port;
    int n;
    tdist_status_t st;
} many_arg_t;

/* wait on keys k0..k(n-1). */
static void *wait_many(void *p)
{
    many_arg_t *a = p;
    char **keys = calloc((size_t)a->n, sizeof *keys);
    for (int i = 0; i < a->n; i++) {
        keys[i] = malloc(16);
        snprintf(keys[i], 16, "k%d", i);
    }
    tdist_store_opts_t o;
    tdist_store_opts_init(&o);
    o.timeout_ms = default_timeout();
    tdist_store_t *s = NULL;
    tdist_status_t st = tdist_store_tcp_connect("127.0.0.1", a->port, &o, &s);
    if (st == TDIST_OK) st = tdist_store_wait(s, (const char *const *)keys, (size_t)a->n, -1);
    __atomic_store_n(&a->st, st, __ATOMIC_SEQ_CST);
    tdist_store_destroy(s);
    for (int i = 0; i < a->n; i++) free(keys[i]);
    free(keys);
    return NULL;
}

/* A wait on thousands of keys completes only when the last one is set;
 * multi_set and multi_get of thousands of keys round-trip. */
TEST(store_tcp_thousands_of_keys, 60)
{
    enum { N = 3000 };
    tdist_store_server_t *srv = start_server(NULL);
    uint16_t port = tdist_store_server_port(srv);
    many_arg_t a = {.port = port, .n = N, .st = TDIST_ERR_INTERNAL};
    pthread_t th;
    ASSERT_EQ(pthread_create(&th, NULL, wait_many, &a), 0);
    tdist_store_t *s = connect_to(port, default_timeout(), NULL);
    char key[16];
    /* every key but k0, in reverse order: the waiter must stay parked */
    for (int i = N - 1; i >= 1; i--) {
        snprintf(key, sizeof key, "k%d", i);
        ASSERT_OK(tdist_store_set(s, key, key, strlen(key)));
    }
    usleep(100 * 1000);
    ASSERT_EQ(__atomic_load_n(&a.st, __ATOMIC_SEQ_CST), TDIST_ERR_INTERNAL);
    ASSERT_OK(tdist_store_set(s, "k0", "k0", 2));
    ASSERT_EQ(pthread_join(th, NULL), 0);
    ASSERT_OK(a.st);

    char **keys = calloc(N, sizeof *keys);
    const void **vals = calloc(N, sizeof *vals);
    size_t *lens = calloc(N, sizeof *lens);
    void **got = calloc(N, sizeof *got);
    size_t *glens = calloc(N, sizeof *glens);
    for (int i = 0; i < N; i++) {
        keys[i] = malloc(16);
        snprintf(keys[i], 16, "m%d", i);
        vals[i] = keys[i];
        lens[i] = strlen(keys[i]);
    }
    ASSERT_OK(tdist_store_multi_set(s, (const char *const *)keys, vals, lens, N));
    ASSERT_OK(tdist_store_multi_get(s, (const char *const *)keys, N, got, glens));
    for (int i = 0; i < N; i++) {
        ASSERT_EQ(glens[i], lens[i]);
        ASSERT_MEMEQ(got[i], keys[i], lens[i]);
        free(got[i]);
        free(keys[i]);
    }
    free(keys);
    free(vals);
    free(lens);
    free(got);
    free(glens);
    int64_t count = 0;
    ASSERT_OK(tdist_store_num_keys(s, &count));
    ASSERT_EQ(count, 2 * N);
    tdist_store_destroy(s);
    tdist_store_server_destroy(srv);
}

/* IPv6 loopback, when the machine has it: "[::1]:port" in messages. */
TEST(store_tcp_ipv6_loopback, 20)
{
    tdist_store_server_t *srv = NULL;
    if (tdist_store_server_create("::1", 0, NULL, &srv) != TDIST_OK) {
        fprintf(stderr, "no IPv6 loopback here (%s); checking the message only\n", tdist_last_error());
        ASSERT_CONTAINS(tdist_last_error(), "[::1]:0");
        return;
    }
    uint16_t port = tdist_store_server_port(srv);
    tdist_store_opts_t o;
    tdist_store_opts_init(&o);
    o.timeout_ms = default_timeout();
    tdist_store_t *s = NULL;
    ASSERT_OK(tdist_store_tcp_connect("::1", port, &o, &s));
    ASSERT_OK(tdist_store_set(s, "k", "v6", 2));
    expect_value(s, "k", "v6");
    ASSERT_OK(tdist_store_set_timeout(s, 100));
    void *v = NULL;
    size_t n = 0;
    ASSERT_STATUS(tdist_store_get(s, "missing", &v, &n), TDIST_ERR_TIMEOUT);
    char addr[64];
    snprintf(addr, sizeof addr, "[::1]:%u", (unsigned)port);
    ASSERT_CONTAINS(tdist_last_error(), addr);
    tdist_store_destroy(s);
    tdist_store_server_destroy(srv);
}
