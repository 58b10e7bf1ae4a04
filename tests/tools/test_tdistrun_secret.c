/* tests/tools/test_tdistrun_secret.c — tdistrun makes a secret per job:
 * its workers get it in their environment (never on a command line), the
 * job runs, and a local process without it can neither read nor write the
 * job's store. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "store/wire.h"
#include "tdist/store.h"
#include "test_tdistrun_helpers.h"

/* A socket listening on 127.0.0.1 on a port the kernel picked (kept open:
 * handed to the launcher as TDIST_STORE_LISTEN_FD). */
static int listener(uint16_t *port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_TRUE(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    ASSERT_EQ(listen(fd, 128), 0);
    socklen_t alen = sizeof a;
    ASSERT_EQ(getsockname(fd, (struct sockaddr *)&a, &alen), 0);
    *port = ntohs(a.sin_port);
    return fd;
}

/* Send HELLO, then frame op for key (GET with timeout 0, or SET to
 * "stranger") without proving anything; true if the store closed the
 * connection and nothing it sent holds value_mark. */
static bool stranger_refused(uint16_t port, uint8_t op, const char *key, const char *value_mark)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_TRUE(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    tdist__wbuf_t b = {0};
    size_t off = tdist__wbuf_begin_frame(&b, TDIST_WIRE_HELLO, 0);
    tdist__wbuf_put_u32(&b, TDIST_WIRE_MAGIC);
    tdist__wbuf_put_u32(&b, TDIST_WIRE_VERSION);
    tdist__wbuf_put_bytes(&b, "nonce-of-a-stranger-0123456789ab", 32);
    tdist__wbuf_end_frame(&b, off);
    off = tdist__wbuf_begin_frame(&b, op, 0);
    if (op == TDIST_WIRE_GET) tdist__wbuf_put_i64(&b, 0);
    tdist__wbuf_put_bytes(&b, key, strlen(key));
    if (op == TDIST_WIRE_SET) tdist__wbuf_put_bytes(&b, "stranger", 8);
    tdist__wbuf_end_frame(&b, off);
    ASSERT_EQ(send(fd, b.data, b.len, MSG_NOSIGNAL), (ssize_t)b.len);
    tdist__wbuf_free(&b);
    char got[8192];
    size_t n = 0;
    bool closed = false;
    double end = tdist_test_now_ms() + 5000 * tdist_test_timeout_mult();
    while (!closed && tdist_test_now_ms() < end) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 50) <= 0) continue;
        ssize_t r = recv(fd, got + n, sizeof got - 1 - n, 0);
        if (r > 0) n += (size_t)r;
        closed = r == 0 || (r < 0 && errno != EINTR) || n == sizeof got - 1;
    }
    close(fd);
    return closed && memmem(got, n, value_mark, strlen(value_mark)) == NULL;
}

TEST(tdistrun_job_secret_keeps_strangers_out, 90)
{
    unsetenv("TDIST_JOB_SECRET");
    unsetenv("TDIST_STORE_TOKEN");
    trun_set_dir_env();
    uint16_t port = 0;
    int lfd = listener(&port);
    char fdtxt[16], porttxt[16];
    snprintf(fdtxt, sizeof fdtxt, "%d", lfd);
    snprintf(porttxt, sizeof porttxt, "%u", (unsigned)port);
    /* each worker leaves its pid, runs launcher_hello (rendezvous, then
     * "hello/R" in the store, checked by rank 0), then waits for the go
     * file (bounded) while the store stays up */
    const char *script = "echo $$ > $T_DIR/pid.$RANK; " HELLO " > $T_DIR/hello.$RANK || exit 3; "
                         "echo done > $T_DIR/first.$RANK; " TRUN_SH_AWAIT("go");
    const char *argv[] = {TDISTRUN, "--nproc-per-node", "2", "--master-port", porttxt,
                          "--grace-period", "1", "/bin/sh", "-c", script, NULL};
    setenv("TDIST_STORE_LISTEN_FD", fdtxt, 1);
    double start = tdist_test_now_ms();
    pid_t p = spawn(argv, "secret");
    unsetenv("TDIST_STORE_LISTEN_FD");
    close(lfd);
    trun_wait_files("first", 2, 30000 * tdist_test_timeout_mult());

    /* the workers hold the secret in their environment, not in argv */
    pid_t pids[2];
    trun_read_pids(2, pids);
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/environ", (int)pids[0]);
    FILE *f = fopen(path, "r");
    ASSERT_TRUE(f != NULL);
    char env[65536];
    size_t envn = fread(env, 1, sizeof env - 1, f);
    fclose(f);
    const char *sec = memmem(env, envn, "TDIST_JOB_SECRET=", 17);
    ASSERT_TRUE(sec != NULL);
    char secret[256];
    snprintf(secret, sizeof secret, "%s", sec + 17);
    ASSERT_EQ(strlen(secret), 64); /* 32 random bytes in hex */
    snprintf(path, sizeof path, "/proc/%d/cmdline", (int)pids[0]);
    char *cmd = slurp(path);
    ASSERT_TRUE(cmd != NULL && strstr(cmd, secret) == NULL);
    free(cmd);

    /* a stranger: no secret, a wrong one, raw frames that skip the proof */
    tdist_store_opts_t o;
    tdist_store_opts_init(&o);
    o.timeout_ms = (int64_t)(10000 * tdist_test_timeout_mult());
    o.token = "";
    tdist_store_t *s = NULL;
    ASSERT_STATUS(tdist_store_tcp_connect("127.0.0.1", port, &o, &s), TDIST_ERR_AUTH);
    o.token = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    ASSERT_STATUS(tdist_store_tcp_connect("127.0.0.1", port, &o, &s), TDIST_ERR_AUTH);
    ASSERT_TRUE(stranger_refused(port, TDIST_WIRE_GET, "tdist/g0/user/hello/0", "hello from rank"));
    ASSERT_TRUE(stranger_refused(port, TDIST_WIRE_SET, "tdist/g0/user/hello/1", "no mark"));
    /* with the secret (read from a worker, as only its own user can): served,
     * and the stranger's value is not there */
    o.token = secret;
    ASSERT_OK(tdist_store_tcp_connect("127.0.0.1", port, &o, &s));
    void *v = NULL;
    size_t vlen = 0;
    ASSERT_OK(tdist_store_get(s, "tdist/g0/user/hello/1", &v, &vlen));
    ASSERT_EQ(vlen, strlen("hello from rank 1"));
    ASSERT_MEMEQ(v, "hello from rank 1", vlen);
    free(v);
    tdist_store_destroy(s);
    char *said = tmp_path("hello.0");
    char *text = slurp(said);
    ASSERT_TRUE(text != NULL);
    ASSERT_CONTAINS(text, "all 2 ranks checked in");
    free(text);

    /* the workers leave; the job succeeds */
    trun_touch("go");
    run_t r;
    wait_for(p, 60000 * tdist_test_timeout_mult(), "secret", start, &r);
    ASSERT_EXIT(r, 0);
    run_free(&r);
}

/* Two launchers play two nodes: with the same TDIST_JOB_SECRET the job
 * runs and nobody warns; without one each launcher warns. */
TEST(tdistrun_two_nodes_share_a_secret, 120)
{
    for (int with = 1; with >= 0; with--) {
        if (with)
            setenv("TDIST_JOB_SECRET", "two-node-secret-0123456789abcdef", 1);
        else
            unsetenv("TDIST_JOB_SECRET");
        unsetenv("TDIST_STORE_TOKEN");
        uint16_t port = 0;
        int lfd = listener(&port);
        char fdtxt[16], porttxt[16];
        snprintf(fdtxt, sizeof fdtxt, "%d", lfd);
        snprintf(porttxt, sizeof porttxt, "%u", (unsigned)port);
        const char *node1[] = {TDISTRUN, "--nnodes", "2", "--node-rank", "1", "--nproc-per-node",
                               "1", "--master-port", porttxt, "--grace-period", "1", HELLO, NULL};
        const char *node0[] = {TDISTRUN, "--nnodes", "2", "--node-rank", "0", "--nproc-per-node",
                               "1", "--master-port", porttxt, "--grace-period", "1", HELLO, NULL};
        double start = tdist_test_now_ms();
        setenv("TDIST_HOSTNAME", "fake-node1", 1);
        const char *t0 = with ? "s-node0" : "n-node0", *t1 = with ? "s-node1" : "n-node1";
        pid_t p1 = spawn(node1, t1);
        setenv("TDIST_HOSTNAME", "fake-node0", 1);
        setenv("TDIST_STORE_LISTEN_FD", fdtxt, 1);
        pid_t p0 = spawn(node0, t0);
        unsetenv("TDIST_STORE_LISTEN_FD");
        unsetenv("TDIST_HOSTNAME");
        close(lfd);
        run_t r0, r1;
        wait_for(p0, 60000 * tdist_test_timeout_mult(), t0, start, &r0);
        wait_for(p1, 60000 * tdist_test_timeout_mult(), t1, start, &r1);
        ASSERT_EXIT(r0, 0);
        ASSERT_EXIT(r1, 0);
        ASSERT_CONTAINS(r0.out, "[rank 0] all 2 ranks checked in\n");
        if (with) {
            ASSERT_TRUE(strstr(r0.err, "no TDIST_JOB_SECRET") == NULL);
            ASSERT_TRUE(strstr(r1.err, "no TDIST_JOB_SECRET") == NULL);
        } else {
            ASSERT_CONTAINS(r0.err, "warning: no TDIST_JOB_SECRET for a 2-node job");
            ASSERT_CONTAINS(r1.err, "warning: no TDIST_JOB_SECRET for a 2-node job");
        }
        run_free(&r0);
        run_free(&r1);
    }
    unsetenv("TDIST_JOB_SECRET");
}
