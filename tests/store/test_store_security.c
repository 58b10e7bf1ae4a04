/* tests/store/test_store_security.c — the TCP store against strangers and
 * floods: a process without the job's secret can neither read nor write a
 * key; caps on what the store holds; unauthenticated connections cannot
 * lock clients out; a declared frame size is not reserved before its
 * bytes arrive; a client fails at once when the store's host dies. The
 * servers under attack run in a child process, so that their memory and
 * file descriptors are their own. */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/internal.h"
#include "harness.h"
#include "store/wire.h"

#ifdef TDIST_TEST_ASAN
/* from the sanitizer runtime (its header is not always installed) */
size_t __sanitizer_get_current_allocated_bytes(void);
#else
#include <malloc.h>
#endif

/* Bytes this process has allocated with malloc and not freed. */
static uint64_t heap_in_use(void)
{
#ifdef TDIST_TEST_ASAN
    return (uint64_t)__sanitizer_get_current_allocated_bytes();
#else
    struct mallinfo2 mi = mallinfo2();
    return (uint64_t)mi.uordblks + (uint64_t)mi.hblkhd;
#endif
}

/* A store server in a child process. secret NULL: none. */
typedef struct child_srv {
    pid_t pid;
    uint16_t port;
    int keep; /* the parent's end of a pipe: the child serves until it closes */
    int ans;  /* the child's answers (heap in use) */
} child_srv_t;

static child_srv_t start_child_server(const char *secret, uint64_t max_bytes, uint64_t max_keys)
{
    int p[2], k[2];
    ASSERT_EQ(pipe(p), 0);
    ASSERT_EQ(pipe(k), 0);
    pid_t pid = fork();
    ASSERT_TRUE(pid >= 0);
    if (pid == 0) {
        close(p[0]);
        close(k[1]);
        tdist_store_server_opts_t so;
        tdist_store_server_opts_init(&so);
        so.token = secret ? secret : "";
        if (max_bytes) so.max_total_bytes = max_bytes;
        if (max_keys) so.max_total_keys = max_keys;
        tdist_store_server_t *srv = NULL;
        if (tdist_store_server_create("127.0.0.1", 0, &so, &srv) != TDIST_OK) _exit(3);
        uint16_t port = tdist_store_server_port(srv);
        if (write(p[1], &port, sizeof port) != (ssize_t)sizeof port) _exit(4);
        for (;;) {
            char c;
            ssize_t r = read(k[0], &c, 1);
            if (r < 0 && errno == EINTR) continue;
            if (r != 1) break;
            uint64_t used = heap_in_use(); /* asked by heap_of() */
            if (write(p[1], &used, sizeof used) != (ssize_t)sizeof used) break;
        }
        tdist_store_server_destroy(srv);
        _exit(0);
    }
    close(p[1]);
    close(k[0]);
    child_srv_t c = {.pid = pid, .keep = k[1], .ans = p[0]};
    ASSERT_EQ(read(p[0], &c.port, sizeof c.port), (ssize_t)sizeof c.port);
    return c;
}

/* The heap the child server has in use, in bytes. */
static uint64_t heap_of(child_srv_t *c)
{
    uint64_t used = 0;
    ASSERT_EQ(write(c->keep, "m", 1), 1);
    ASSERT_EQ(read(c->ans, &used, sizeof used), (ssize_t)sizeof used);
    return used;
}

static void stop_child_server(child_srv_t *c)
{
    if (c->keep >= 0) close(c->keep);
    if (c->ans >= 0) close(c->ans);
    c->keep = c->ans = -1;
    int status = 0;
    double end = tdist_test_now_ms() + 10000 * tdist_test_timeout_mult();
    while (waitpid(c->pid, &status, WNOHANG) == 0) {
        if (tdist_test_now_ms() > end) {
            kill(c->pid, SIGKILL);
            waitpid(c->pid, &status, 0);
            break;
        }
        usleep(5000);
    }
}

static tdist_store_t *client(uint16_t port, const char *secret, int64_t timeout_ms)
{
    tdist_store_opts_t o;
    tdist_store_opts_init(&o);
    o.timeout_ms = timeout_ms;
    o.connect_timeout_ms = timeout_ms;
    o.token = secret ? secret : "";
    tdist_store_t *s = NULL;
    ASSERT_OK(tdist_store_tcp_connect("127.0.0.1", port, &o, &s));
    return s;
}

static int64_t tmo(void) { return (int64_t)(20000 * tdist_test_timeout_mult()); }

static int raw_connect(uint16_t port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ASSERT_TRUE(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    return fd;
}

static void raw_send_buf(int fd, tdist__wbuf_t *b)
{
    size_t off = 0;
    while (off < b->len) {
        ssize_t w = send(fd, b->data + off, b->len - off, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) break; /* the server may have closed: fine */
        off += (size_t)w;
    }
    tdist__wbuf_free(b);
}

static void raw_hello(int fd)
{
    tdist__wbuf_t b = {0};
    size_t off = tdist__wbuf_begin_frame(&b, TDIST_WIRE_HELLO, 0);
    tdist__wbuf_put_u32(&b, TDIST_WIRE_MAGIC);
    tdist__wbuf_put_u32(&b, TDIST_WIRE_VERSION);
    tdist__wbuf_put_bytes(&b, "0123456789abcdef0123456789abcdef", 32);
    tdist__wbuf_end_frame(&b, off);
    raw_send_buf(fd, &b);
}

/* Read what the server sends on fd until it closes (bounded): the bytes
 * read into buf (at most n) and whether it closed. */
static bool read_until_closed(int fd, uint8_t *buf, size_t n, size_t *got)
{
    double end = tdist_test_now_ms() + 5000 * tdist_test_timeout_mult();
    *got = 0;
    while (tdist_test_now_ms() < end) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 50) <= 0) continue;
        uint8_t tmp[4096];
        ssize_t r = recv(fd, tmp, sizeof tmp, 0);
        if (r == 0 || (r < 0 && errno != EINTR && errno != EAGAIN)) return true;
        if (r > 0) {
            size_t take = TDIST_MIN((size_t)r, n - *got);
            memcpy(buf + *got, tmp, take);
            *got += take;
        }
    }
    return false;
}

/* A key frame: SET key = value. */
static void put_set(tdist__wbuf_t *b, const char *key, const char *value)
{
    size_t off = tdist__wbuf_begin_frame(b, TDIST_WIRE_SET, 0);
    tdist__wbuf_put_bytes(b, key, strlen(key));
    tdist__wbuf_put_bytes(b, value, strlen(value));
    tdist__wbuf_end_frame(b, off);
}

static void expect_value(tdist_store_t *s, const char *key, const char *want)
{
    void *v = NULL;
    size_t n = 0;
    ASSERT_OK(tdist_store_get(s, key, &v, &n));
    ASSERT_EQ(n, strlen(want));
    ASSERT_MEMEQ(v, want, n);
    free(v);
}

/* A stranger (no secret) can neither read nor write: through the API,
 * and with raw frames that skip, fake or replay the proof. */
TEST(store_secret_stranger_cannot_read_or_write, 60)
{
    const char *secret = "a1b2c3d4e5f60718293a4b5c6d7e8f90";
    child_srv_t c = start_child_server(secret, 0, 0);
    tdist_store_t *job = client(c.port, secret, tmo());
    ASSERT_OK(tdist_store_set(job, "rdzv/record", "pids nonce host", 15));

    tdist_store_opts_t o;
    tdist_store_opts_init(&o);
    o.timeout_ms = tmo();
    o.token = "";
    tdist_store_t *s = NULL;
    ASSERT_STATUS(tdist_store_tcp_connect("127.0.0.1", c.port, &o, &s), TDIST_ERR_AUTH);
    o.token = "guess";
    ASSERT_STATUS(tdist_store_tcp_connect("127.0.0.1", c.port, &o, &s), TDIST_ERR_AUTH);
    ASSERT_CONTAINS(tdist_last_error(), "wrong secret");

    /* raw: a GET or SET as the first frame, after HELLO in place of AUTH,
     * and an AUTH with a made-up proof: each closes the connection with no
     * value in any reply */
    for (int mode = 0; mode < 4; mode++) {
        int fd = raw_connect(c.port);
        tdist__wbuf_t b = {0};
        if (mode >= 1) raw_hello(fd);
        if (mode == 0 || mode == 1) {
            size_t off = tdist__wbuf_begin_frame(&b, TDIST_WIRE_GET, 0);
            tdist__wbuf_put_i64(&b, 0);
            tdist__wbuf_put_bytes(&b, "rdzv/record", 11);
            tdist__wbuf_end_frame(&b, off);
        } else if (mode == 2) {
            put_set(&b, "rdzv/record", "stranger");
        } else {
            size_t off = tdist__wbuf_begin_frame(&b, TDIST_WIRE_AUTH, 0);
            uint8_t proof[32] = {1, 2, 3};
            tdist__wbuf_put_bytes(&b, proof, sizeof proof);
            tdist__wbuf_end_frame(&b, off);
            put_set(&b, "rdzv/record", "stranger");
        }
        raw_send_buf(fd, &b);
        uint8_t got[4096];
        size_t n = 0;
        ASSERT_TRUE(read_until_closed(fd, got, sizeof got, &n));
        ASSERT_TRUE(memmem(got, n, "pids", 4) == NULL);
        close(fd);
    }
    expect_value(job, "rdzv/record", "pids nonce host");
    tdist_store_destroy(job);
    stop_child_server(&c);
}

/* Caps on keys and bytes: a write beyond fails with a clear error and
 * changes nothing; the server goes on. */
TEST(store_caps_total_bytes_and_keys, 60)
{
    /* the defaults, and the environment's */
    tdist_store_server_opts_t so;
    unsetenv("TDIST_STORE_MAX_BYTES");
    unsetenv("TDIST_STORE_MAX_NUM_KEYS");
    tdist_store_server_opts_init(&so);
    ASSERT_TRUE(so.max_total_bytes == (1ull << 30) && so.max_total_keys == (1ull << 20));
    ASSERT_EQ(so.max_unauthenticated, 256);
    setenv("TDIST_STORE_MAX_BYTES", "5000", 1);
    setenv("TDIST_STORE_MAX_NUM_KEYS", "abc", 1); /* not a number: the default */
    tdist_store_server_opts_init(&so);
    ASSERT_TRUE(so.max_total_bytes == 5000 && so.max_total_keys == (1ull << 20));
    unsetenv("TDIST_STORE_MAX_BYTES");
    unsetenv("TDIST_STORE_MAX_NUM_KEYS");
    so.max_total_keys = 0;
    tdist_store_server_t *bad = NULL;
    ASSERT_STATUS(tdist_store_server_create("127.0.0.1", 0, &so, &bad), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "max_total_keys (0)");

    child_srv_t c = start_child_server(NULL, 64 * 1024, 100);
    tdist_store_t *s = client(c.port, NULL, tmo());
    char key[32];
    int i = 0;
    tdist_status_t st = TDIST_OK;
    for (; i < 200 && st == TDIST_OK; i++) {
        snprintf(key, sizeof key, "k%d", i);
        st = tdist_store_set(s, key, "v", 1);
    }
    ASSERT_STATUS(st, TDIST_ERR_INVALID_ARG);
    ASSERT_EQ(i, 101); /* keys 0..99 fit, the 101st does not */
    ASSERT_CONTAINS(tdist_last_error(), "the store is full");
    ASSERT_CONTAINS(tdist_last_error(), "100 keys");
    int64_t n = 0;
    ASSERT_OK(tdist_store_num_keys(s, &n));
    ASSERT_EQ(n, 100);
    /* replacing a key is fine; add of a new key is not */
    ASSERT_OK(tdist_store_set(s, "k5", "w", 1));
    ASSERT_STATUS(tdist_store_add(s, "counter", 1, NULL), TDIST_ERR_INVALID_ARG);
    bool deleted = false;
    ASSERT_OK(tdist_store_delete_key(s, "k0", &deleted));
    ASSERT_TRUE(deleted);
    ASSERT_OK(tdist_store_add(s, "counter", 1, NULL));
    /* bytes: a value that would pass 64 KiB in all */
    char *big = malloc(70 * 1024);
    ASSERT_TRUE(big != NULL);
    memset(big, 'x', 70 * 1024);
    ASSERT_STATUS(tdist_store_set(s, "k7", big, 70 * 1024), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "bytes");
    ASSERT_OK(tdist_store_set(s, "k7", big, 32 * 1024));
    ASSERT_STATUS(tdist_store_append(s, "k7", big, 40 * 1024), TDIST_ERR_INVALID_ARG);
    const char *keys[2] = {"k8", "k9"};
    const void *vals[2] = {big, big};
    size_t lens[2] = {20 * 1024, 20 * 1024};
    ASSERT_STATUS(tdist_store_multi_set(s, keys, vals, lens, 2), TDIST_ERR_INVALID_ARG);
    free(big);
    expect_value(s, "k8", "v"); /* unchanged, and the server still serves */
    tdist_store_destroy(s);
    stop_child_server(&c);
}

/* Raise the open-file limit to the hard limit; returns the soft limit. */
static long raise_nofile(void)
{
    struct rlimit r;
    ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &r), 0);
    r.rlim_cur = r.rlim_max;
    setrlimit(RLIMIT_NOFILE, &r);
    ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &r), 0);
    return (long)r.rlim_cur;
}

/* 4200 idle connections that never authenticate do not keep a client of
 * the job out: it connects and is served long before their 30 s hello
 * deadline. */
TEST(store_unauthenticated_flood_does_not_lock_out, 120)
{
    const char *secret = "flood-secret-0123456789";
    long lim = raise_nofile();
    child_srv_t c = start_child_server(secret, 0, 0);
    int want = (int)TDIST_MIN(4200L, lim - 64);
    if (want < 1000) {
        stop_child_server(&c);
        SKIP("open-file limit %ld", lim);
    }
    int *fds = malloc((size_t)want * sizeof *fds);
    ASSERT_TRUE(fds != NULL);
    int opened = 0;
    for (; opened < want; opened++) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        ASSERT_TRUE(fd >= 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(c.port)};
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        ASSERT_EQ(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
        fds[opened] = fd;
    }
    /* half of them even say HELLO and sit on the challenge */
    for (int i = 0; i < opened; i += 2) raw_hello(fds[i]);
    double t0 = tdist_test_now_ms();
    tdist_store_t *s = client(c.port, secret, (int64_t)(10000 * tdist_test_timeout_mult()));
    ASSERT_OK(tdist_store_set(s, "ok", "1", 1));
    expect_value(s, "ok", "1");
    printf("client served after %d idle unauthenticated connections in %.0f ms\n", opened,
           tdist_test_now_ms() - t0);
    tdist_store_destroy(s);
    for (int i = 0; i < opened; i++) close(fds[i]);
    free(fds);
    stop_child_server(&c);
}

/* Virtual memory of pid in KiB (VmSize), -1 if unknown. */
static long vm_kib(pid_t pid)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    long kib = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmSize: %ld kB", &kib) == 1) break;
    fclose(f);
    return kib;
}

/* 50 connections each declaring a 129 MiB frame and sending 8 KiB of it:
 * the server reserves what arrived, not what was declared. */
TEST(store_declared_frame_size_not_reserved, 120)
{
    child_srv_t c = start_child_server(NULL, 0, 0);
    tdist_store_t *s = client(c.port, NULL, tmo());
    ASSERT_OK(tdist_store_set(s, "warm", "1", 1));
    long before = vm_kib(c.pid);
    uint64_t heap0 = heap_of(&c);
    ASSERT_TRUE(before > 0);
    int fds[50];
    uint8_t junk[4096];
    memset(junk, 'j', sizeof junk);
    for (int i = 0; i < 50; i++) {
        fds[i] = raw_connect(c.port);
        raw_hello(fds[i]);
        tdist__wbuf_t b = {0};
        size_t off = tdist__wbuf_begin_frame(&b, TDIST_WIRE_SET, 0);
        tdist__wbuf_end_frame(&b, off);
        tdist__wire_set_u32(b.data + off, TDIST_WIRE_MAX_FRAME); /* declared, never sent */
        tdist__wbuf_put_raw(&b, junk, sizeof junk);
        raw_send_buf(fds[i], &b);
    }
    /* a round trip on another connection once the loop has the headers,
     * then more of each body (a server that reserves the declared size
     * does so when the next bytes come), then a moment to read them */
    ASSERT_OK(tdist_store_set(s, "after", "1", 1));
    usleep(100000);
    for (int i = 0; i < 50; i++) {
        tdist__wbuf_t b = {0};
        tdist__wbuf_put_raw(&b, junk, sizeof junk);
        raw_send_buf(fds[i], &b);
    }
    ASSERT_OK(tdist_store_set(s, "after", "1", 1));
    usleep(200000);
    ASSERT_OK(tdist_store_set(s, "after", "2", 1));
    long after = vm_kib(c.pid);
    uint64_t heap1 = heap_of(&c);
    double grew = ((double)heap1 - (double)heap0) / 1048576.0;
    printf("server heap in use %.1f -> %.1f MiB (%+.1f MiB), VmSize %+ld KiB, with 50 declared "
           "frames of %u bytes\n", (double)heap0 / 1048576.0, (double)heap1 / 1048576.0, grew,
           after - before, TDIST_WIRE_MAX_FRAME);
    ASSERT_TRUE(grew < 256.0);                   /* reserving them: +6450 MiB */
    ASSERT_TRUE(after - before < 1024L * 1024); /* KiB */
    for (int i = 0; i < 50; i++) close(fds[i]);
    tdist_store_destroy(s);
    stop_child_server(&c);
}

typedef struct killer {
    pid_t pid;
    int after_ms;
} killer_t;

static void *kill_later(void *arg)
{
    killer_t *k = arg;
    usleep((useconds_t)k->after_ms * 1000);
    kill(k->pid, SIGKILL);
    return NULL;
}

/* Every store call after the store's host died fails at once (no retry
 * for the store's timeout, 60 s here), naming host:port and "lost". */
static void calls_fail_fast(tdist_store_t *s, uint16_t port, const char *when, double first_ms)
{
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%u", (unsigned)port);
    double worst = 0;
    for (int i = 0; i < 20; i++) {
        double t0 = tdist_test_now_ms();
        tdist_status_t st = i % 2 ? tdist_store_set(s, "k", "v", 1) : tdist_store_add(s, "n", 1, NULL);
        double dt = tdist_test_now_ms() - t0;
        if (dt > worst) worst = dt;
        ASSERT_STATUS(st, TDIST_ERR_CONNECTION);
        ASSERT_CONTAINS(tdist_last_error(), addr);
        ASSERT_CONTAINS(tdist_last_error(), "lost the store");
        ASSERT_TRUE(dt < 1000.0 * tdist_test_timeout_mult());
    }
    if (first_ms >= 0)
        printf("store SIGKILLed %s: the call that met it failed in %.1f ms; 20 later calls each "
               "within %.1f ms\n", when, first_ms, worst);
    else
        printf("store SIGKILLed %s: 20 later calls each failed within %.1f ms\n", when, worst);
}

TEST(store_client_fails_fast_when_store_host_dies, 120)
{
    for (int mid = 0; mid < 2; mid++) {
        child_srv_t c = start_child_server(NULL, 0, 0);
        tdist_store_t *s = client(c.port, NULL, 60000);
        int first_failed = -1;
        double first_ms = -1;
        if (mid) {
            /* SIGKILL while this thread loops on the store */
            killer_t k = {.pid = c.pid, .after_ms = 200};
            pthread_t t;
            ASSERT_EQ(pthread_create(&t, NULL, kill_later, &k), 0);
            double end = tdist_test_now_ms() + 20000 * tdist_test_timeout_mult();
            for (int i = 0; i < 1000000 && tdist_test_now_ms() < end; i++) {
                double t0 = tdist_test_now_ms();
                tdist_status_t st = tdist_store_add(s, "n", 1, NULL);
                if (st != TDIST_OK) {
                    first_ms = tdist_test_now_ms() - t0;
                    ASSERT_STATUS(st, TDIST_ERR_CONNECTION);
                    ASSERT_TRUE(first_ms < 1000.0 * tdist_test_timeout_mult());
                    first_failed = i;
                    break;
                }
            }
            ASSERT_EQ(pthread_join(t, NULL), 0);
            ASSERT_TRUE(first_failed >= 0);
        } else {
            /* SIGKILL while the client is idle */
            ASSERT_OK(tdist_store_set(s, "k", "v", 1));
            kill(c.pid, SIGKILL);
        }
        int status;
        waitpid(c.pid, &status, 0);
        close(c.keep);
        close(c.ans);
        calls_fail_fast(s, c.port, mid ? "mid-loop" : "at idle", first_ms);
        tdist_store_destroy(s);
    }
}

/* Run a server on host with secret and return what it logged at warn level
 * (malloc'd). */
static char *server_warnings(const char *host, const char *secret)
{
    int fds[2];
    ASSERT_EQ(pipe(fds), 0);
    fflush(stderr);
    int saved = dup(STDERR_FILENO);
    ASSERT_TRUE(saved >= 0);
    ASSERT_TRUE(dup2(fds[1], STDERR_FILENO) >= 0);
    tdist_log_set_level(TDIST_LOG_WARN);
    tdist_store_server_opts_t so;
    tdist_store_server_opts_init(&so);
    so.token = secret;
    tdist_store_server_t *srv = NULL;
    tdist_status_t st = tdist_store_server_create(host, 0, &so, &srv);
    tdist_store_server_destroy(srv);
    tdist_log_set_level(TDIST_LOG_OFF);
    fflush(stderr);
    dup2(saved, STDERR_FILENO);
    close(saved);
    close(fds[1]);
    ASSERT_OK(st);
    char *buf = calloc(1, 8192);
    ASSERT_TRUE(buf != NULL);
    size_t n = 0;
    ssize_t r;
    while (n < 8191 && (r = read(fds[0], buf + n, 8191 - n)) > 0) n += (size_t)r;
    close(fds[0]);
    return buf;
}

/* A store reachable from other hosts without a secret warns through
 * tdist's log (and only there); one on loopback or with a secret does not. */
TEST(store_warns_without_secret_off_loopback, 30)
{
    char *w = server_warnings("0.0.0.0", "");
    ASSERT_CONTAINS(w, "runs without the job's secret");
    ASSERT_CONTAINS(w, "TDIST_JOB_SECRET");
    free(w);
    w = server_warnings("0.0.0.0", "some-secret");
    ASSERT_TRUE(strstr(w, "without the job's secret") == NULL);
    free(w);
    w = server_warnings("127.0.0.1", "");
    ASSERT_TRUE(strstr(w, "without the job's secret") == NULL);
    free(w);
}

/* A file store is created readable by its user only: the job's keys are
 * not for other users of the host. */
TEST(store_file_store_created_private, 10)
{
    char path[512];
    snprintf(path, sizeof path, "%s/job.store", tdist_test_tmpdir());
    mode_t old = umask(0);
    tdist_store_t *s = NULL;
    tdist_status_t st = tdist_store_file_create(path, NULL, &s);
    umask(old);
    ASSERT_OK(st);
    ASSERT_OK(tdist_store_set(s, "k", "v", 1));
    struct stat sb;
    ASSERT_EQ(stat(path, &sb), 0);
    ASSERT_EQ(sb.st_mode & 0777, 0600);
    tdist_store_destroy(s);
}
