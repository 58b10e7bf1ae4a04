/*
 * tests/net/netns.h — two "hosts" on this machine for the net tests: two
 * Linux network namespaces made by the test itself, joined by a veth
 * pair with private addresses, and ranks (or launchers) started inside
 * them.
 *
 *   host A: namespace tdist-<pid>-a, veth tdv<pid>a, 10.231.<x>.1/24, lo up
 *   host B: namespace tdist-<pid>-b, veth tdv<pid>b, 10.231.<x>.2/24, lo up
 *
 * (<pid> is the test process's, <x> = pid % 250 + 1: names are unique per
 * run; the addresses exist only inside these namespaces, so no other
 * address is ever a target and no traffic leaves them.)
 *
 * netns_setup() needs `ip` (iproute2) and the privilege to create
 * namespaces (CAP_SYS_ADMIN, CAP_NET_ADMIN: root); without them it undoes
 * what it made and ends the test with SKIP (ctest lists it as skipped).
 *
 * Clean-up, also on failure: netns_setup() forks a guardian that leaves
 * the test's process group (setsid), so the runner's kill at the deadline
 * does not reach it, and waits on a pipe whose only writer is the test
 * process. netns_teardown() deletes both namespaces (which removes the
 * veth pair) and tells the guardian it is done; if the test process ends
 * any other way (FAIL's _exit, a crash, SIGKILL), the pipe closes without
 * that word and the guardian deletes the namespaces itself.
 *
 * Everything is static: each tests/net/test_netns*.c includes this file.
 */
#ifndef TDIST_TEST_NETNS_H
#define TDIST_TEST_NETNS_H

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

#define NETNS_FN static __attribute__((unused))

/* The store's port on host A: the namespaces are new, so nothing else
 * listens there. */
#define NETNS_STORE_PORT 29500

typedef struct netns_topo {
    char ns[2][40];    /* namespace names */
    char veth[2][16];  /* veth end inside ns[i] */
    char addr[2][32];  /* its IPv4 address */
    char prefix[12];   /* common prefix of both veth names ("tdv<pid>") */
    const char *ip;    /* path of the ip tool */
    int guard_fd;      /* write end of the guardian's pipe (-1: none) */
    pid_t guard_pid;
    pid_t owner;       /* the test process */
    bool up;
} netns_topo_t;

static netns_topo_t *netns_current; /* for ranks: which fd to close */

NETNS_FN const char *netns_find_tool(const char *name)
{
    static char found[4][64];
    static int next;
    const char *dirs[] = {"/usr/sbin", "/sbin", "/usr/bin", "/bin"};
    for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) {
        char *p = found[next % 4];
        snprintf(p, sizeof found[0], "%s/%s", dirs[i], name);
        if (access(p, X_OK) == 0) {
            next++;
            return p;
        }
    }
    return NULL;
}

/* Run argv (argv[0] a path) with stdout+stderr into out[0..n) (may be
 * NULL); wait at most timeout_ms. Returns the exit status, or -1 if it
 * could not run or was killed at the deadline. */
NETNS_FN int netns_cmd(const char *const argv[], char *out, size_t n, double timeout_ms)
{
    char path[512];
    snprintf(path, sizeof path, "%s/netns-cmd.%d.out", tdist_test_tmpdir(), (int)getpid());
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        int fd = open(out ? path : "/dev/null", O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd < 0) fd = open("/dev/null", O_WRONLY | O_CLOEXEC);
        if (fd >= 0) {
            dup2(fd, STDOUT_FILENO);
            dup2(fd, STDERR_FILENO);
        }
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    int status = 0;
    double end = tdist_test_now_ms() + timeout_ms;
    for (;;) {
        pid_t w = waitpid(pid, &status, WNOHANG);
        if (w == pid) break;
        if (w < 0 && errno != EINTR) return -1;
        if (tdist_test_now_ms() > end) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            status = -1;
            break;
        }
        usleep(1000);
    }
    if (out && n) {
        out[0] = '\0';
        FILE *f = fopen(path, "r");
        if (f) {
            size_t got = fread(out, 1, n - 1, f);
            out[got] = '\0';
            while (got > 0 && (out[got - 1] == '\n' || out[got - 1] == ' ')) out[--got] = '\0';
            fclose(f);
        }
    }
    unlink(path);
    if (status == -1) return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* ip <args...> (NULL-terminated), 10 s x multiplier. */
#define NETNS_IP(t, out, n, ...)                                                               \
    netns_cmd((const char *const[]){(t)->ip, __VA_ARGS__, NULL}, (out), (n),                    \
              10000 * tdist_test_timeout_mult())

/* Delete both namespaces (their veth ends go with them). Quiet. */
NETNS_FN void netns_delete_all(const netns_topo_t *t)
{
    for (int i = 0; i < 2; i++) NETNS_IP(t, NULL, 0, "netns", "delete", t->ns[i]);
}

/* The guardian: wait for "done" or EOF; on EOF delete the namespaces. */
static void netns_guardian(netns_topo_t *t, int rfd)
{
    setsid(); /* out of the test's process group: survives its SIGKILL */
    struct pollfd p = {.fd = rfd, .events = POLLIN};
    /* bounded: a test never lives this long */
    int r;
    do {
        r = poll(&p, 1, 30 * 60 * 1000);
    } while (r < 0 && errno == EINTR);
    char c = 0;
    ssize_t got = r > 0 ? read(rfd, &c, 1) : 0;
    if (got == 1 && c == 'd') _exit(0); /* the test cleaned up itself */
    netns_delete_all(t);
    _exit(0);
}

/* Delete the namespaces and stop the guardian (bounded). */
NETNS_FN void netns_teardown(netns_topo_t *t)
{
    if (t->up) netns_delete_all(t);
    t->up = false;
    if (t->guard_fd >= 0) {
        char c = 'd';
        if (write(t->guard_fd, &c, 1) != 1) { /* the guardian then cleans up on EOF */ }
        close(t->guard_fd);
        t->guard_fd = -1;
    }
    if (t->guard_pid > 0) {
        int status;
        double end = tdist_test_now_ms() + 20000 * tdist_test_timeout_mult();
        while (waitpid(t->guard_pid, &status, WNOHANG) == 0 && tdist_test_now_ms() < end)
            usleep(2000);
        t->guard_pid = 0;
    }
    netns_current = NULL;
}

/* Make both hosts and return true; when the test cannot run here (no ip
 * tool, no privilege, no veth) end it with SKIP, after undoing what was
 * made. Fails the test on errors that are not about privilege or tools. */
NETNS_FN bool netns_setup(netns_topo_t *t, const char *test)
{
    memset(t, 0, sizeof *t);
    t->guard_fd = -1;
    t->owner = getpid();
    t->ip = netns_find_tool("ip");
    if (!t->ip) {
        SKIP("the ip tool (iproute2) is not installed; the network-namespace tests "
             "need it (apt-get install iproute2)");
    }
    int pid = (int)getpid();
    snprintf(t->ns[0], sizeof t->ns[0], "tdist-%d-a", pid);
    snprintf(t->ns[1], sizeof t->ns[1], "tdist-%d-b", pid);
    snprintf(t->prefix, sizeof t->prefix, "tdv%d", pid);
    snprintf(t->veth[0], sizeof t->veth[0], "%sa", t->prefix);
    snprintf(t->veth[1], sizeof t->veth[1], "%sb", t->prefix);
    int x = pid % 250 + 1;
    snprintf(t->addr[0], sizeof t->addr[0], "10.231.%d.1", x);
    snprintf(t->addr[1], sizeof t->addr[1], "10.231.%d.2", x);

    /* the guardian first, so that nothing created below can leak */
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) FAIL("pipe2: %s", strerror(errno));
    fflush(stdout);
    fflush(stderr);
    pid_t g = fork();
    if (g < 0) FAIL("fork: %s", strerror(errno));
    if (g == 0) {
        close(p[1]);
        netns_guardian(t, p[0]);
    }
    close(p[0]);
    t->guard_fd = p[1];
    t->guard_pid = g;
    netns_current = t;

    char out[1024];
    netns_delete_all(t); /* a stale pair from a killed run with this pid */
    if (NETNS_IP(t, out, sizeof out, "netns", "add", t->ns[0]) != 0) {
        t->up = true; /* delete whatever half-exists, stop the guardian */
        netns_teardown(t);
        SKIP("cannot create a network namespace (needs root: CAP_SYS_ADMIN and "
             "CAP_NET_ADMIN): ip netns add: %s", out);
    }
    t->up = true;
    if (NETNS_IP(t, out, sizeof out, "netns", "add", t->ns[1]) != 0)
        FAIL("ip netns add %s: %s", t->ns[1], out);
    if (NETNS_IP(t, out, sizeof out, "link", "add", t->veth[0], "netns", t->ns[0], "type", "veth",
                 "peer", "name", t->veth[1], "netns", t->ns[1]) != 0) {
        netns_teardown(t);
        SKIP("cannot create a veth pair (kernel without veth?): %s", out);
    }
    for (int i = 0; i < 2; i++) {
        char cidr[40];
        snprintf(cidr, sizeof cidr, "%s/24", t->addr[i]);
        if (NETNS_IP(t, out, sizeof out, "-n", t->ns[i], "addr", "add", cidr, "dev", t->veth[i]) != 0)
            FAIL("ip -n %s addr add %s dev %s: %s", t->ns[i], cidr, t->veth[i], out);
        if (NETNS_IP(t, out, sizeof out, "-n", t->ns[i], "link", "set", t->veth[i], "up") != 0)
            FAIL("ip -n %s link set %s up: %s", t->ns[i], t->veth[i], out);
        if (NETNS_IP(t, out, sizeof out, "-n", t->ns[i], "link", "set", "lo", "up") != 0)
            FAIL("ip -n %s link set lo up: %s", t->ns[i], out);
    }
    return true;
}

/* Does the namespace still exist (for the leftover check)? */
NETNS_FN bool netns_exists(const char *name)
{
    char path[128];
    snprintf(path, sizeof path, "/run/netns/%s", name);
    if (access(path, F_OK) == 0) return true;
    snprintf(path, sizeof path, "/var/run/netns/%s", name);
    return access(path, F_OK) == 0;
}

/* In a child: move this (single-threaded) process into namespace name.
 * _exit(98) after printing why if it cannot. */
NETNS_FN void netns_enter(const char *name)
{
    char path[128];
    snprintf(path, sizeof path, "/run/netns/%s", name);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        snprintf(path, sizeof path, "/var/run/netns/%s", name);
        fd = open(path, O_RDONLY | O_CLOEXEC);
    }
    if (fd < 0 || setns(fd, CLONE_NEWNET) != 0) {
        fprintf(stderr, "cannot enter network namespace %s: %s\n", name, strerror(errno));
        _exit(98);
    }
    close(fd);
}

/* In a forked child: drop the test's guardian pipe, die with the parent. */
NETNS_FN void netns_child_init(pid_t parent)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(99);
    if (netns_current && netns_current->guard_fd >= 0) close(netns_current->guard_fd);
}

/* ------------------------------------------------------------ ranks */

typedef struct netns_ranks {
    int n;             /* ranks; rank r runs on host r / per_host */
    int per_host;
    const char *const *env; /* extra NAME=VALUE for every rank (NULL-terminated) */
    int port;          /* store port on host A (0: NETNS_STORE_PORT) */
    double timeout_ms; /* kill every rank after this long */
} netns_ranks_t;

/* Run body on n ranks, each a forked process inside its host's namespace,
 * with env:// set: rank 0 hosts the store on host A's address, port
 * o->port (default NETNS_STORE_PORT); LOCAL_RANK / LOCAL_WORLD_SIZE as the two hosts give
 * them (init checks them against the rendezvous, which must therefore
 * see two hosts although both have this machine's host name). Fails the
 * test naming the first rank that failed. */
NETNS_FN void netns_run_ranks(const netns_topo_t *t, const netns_ranks_t *o, tdist_rank_fn body,
                              void *arg)
{
    int n = o->n;
    if (n < 1 || n > 16 || o->per_host < 1 || (n + o->per_host - 1) / o->per_host > 2)
        FAIL("netns_run_ranks: bad layout n=%d per_host=%d", n, o->per_host);
    pid_t pids[16] = {0};
    fflush(stdout);
    fflush(stderr);
    pid_t parent = getpid();
    for (int r = 0; r < n; r++) {
        pid_t pid = fork();
        if (pid < 0) FAIL("fork: %s", strerror(errno));
        if (pid == 0) {
            netns_child_init(parent);
            tdist_test_rank = r;
            int host = r / o->per_host;
            netns_enter(t->ns[host]);
            char buf[32];
            setenv("MASTER_ADDR", t->addr[0], 1);
            snprintf(buf, sizeof buf, "%d", o->port > 0 ? o->port : NETNS_STORE_PORT);
            setenv("MASTER_PORT", buf, 1);
            setenv("TDIST_LAUNCHER_STORE", "0", 1); /* rank 0 hosts it */
            snprintf(buf, sizeof buf, "%d", r);
            setenv("RANK", buf, 1);
            snprintf(buf, sizeof buf, "%d", n);
            setenv("WORLD_SIZE", buf, 1);
            snprintf(buf, sizeof buf, "%d", r % o->per_host);
            setenv("LOCAL_RANK", buf, 1);
            int local = n - host * o->per_host;
            snprintf(buf, sizeof buf, "%d", local < o->per_host ? local : o->per_host);
            setenv("LOCAL_WORLD_SIZE", buf, 1);
            /* both hosts keep this machine's host name: only the
             * namespaces tell them apart */
            unsetenv("TDIST_HOSTNAME");
            unsetenv("TDIST_TRANSPORT");
            unsetenv("TDIST_SOCKET_IFNAME");
            unsetenv("TDIST_RESTART_COUNT");
            /* the flight-recorder rings of a rank that leaves without
             * destroying its groups stay in the test's directory, which
             * the runner removes, not in /tmp */
            setenv("TMPDIR", tdist_test_tmpdir(), 1);
            for (const char *const *e = o->env; e && *e; e++) putenv((char *)*e);
            body(r, n, arg);
            fflush(stdout);
            fflush(stderr);
            exit(0);
        }
        pids[r] = pid;
    }
    double end = tdist_test_now_ms() + o->timeout_ms;
    int remaining = n, first = -1;
    char why[160] = "";
    while (remaining > 0) {
        int status;
        pid_t w = waitpid(-1, &status, WNOHANG);
        if (w > 0) {
            for (int r = 0; r < n; r++) {
                if (pids[r] != w) continue;
                pids[r] = 0;
                remaining--;
                bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
                if (!ok && first < 0) {
                    first = r;
                    if (WIFEXITED(status))
                        snprintf(why, sizeof why, "exited with status %d", WEXITSTATUS(status));
                    else
                        snprintf(why, sizeof why, "was killed by signal %d",
                                 WIFSIGNALED(status) ? WTERMSIG(status) : 0);
                    for (int q = 0; q < n; q++)
                        if (pids[q] > 0) kill(pids[q], SIGKILL);
                }
            }
            continue;
        }
        if (w < 0 && errno == ECHILD) break;
        if (tdist_test_now_ms() > end) {
            for (int q = 0; q < n; q++)
                if (pids[q] > 0) kill(pids[q], SIGKILL);
            if (first < 0) {
                first = n; /* marker: deadline */
                snprintf(why, sizeof why, "still running after %.0f ms", o->timeout_ms);
            }
            end = 1e300; /* reap what is left */
        }
        usleep(2000);
    }
    if (first == n) FAIL("ranks %s: killed", why);
    if (first >= 0) FAIL("rank %d (host %c) %s", first, 'A' + first / o->per_host, why);
}

/* --------------------------------------------------------- processes */

/* Start argv (argv[0] a path) inside namespace ns, stdout/stderr to
 * <tmpdir>/<tag>.out / .err (read them back with proc.h's wait_for);
 * TDIST_HOSTNAME, TDIST_TRANSPORT and TDIST_SOCKET_IFNAME are removed
 * from its environment, then env's NAME=VALUE entries added. */
NETNS_FN pid_t netns_spawn(const char *ns, const char *const argv[], const char *const *env,
                           const char *tag)
{
    char out[512], err[512];
    snprintf(out, sizeof out, "%s/%s.out", tdist_test_tmpdir(), tag);
    snprintf(err, sizeof err, "%s/%s.err", tdist_test_tmpdir(), tag);
    fflush(stdout);
    fflush(stderr);
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) FAIL("fork: %s", strerror(errno));
    if (pid == 0) {
        netns_child_init(parent);
        int fo = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        int fe = open(err, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fo < 0 || fe < 0) _exit(120);
        dup2(fo, STDOUT_FILENO);
        dup2(fe, STDERR_FILENO);
        close(fo);
        close(fe);
        netns_enter(ns);
        /* both hosts keep this machine's host name; defaults everywhere */
        unsetenv("TDIST_HOSTNAME");
        unsetenv("TDIST_TRANSPORT");
        unsetenv("TDIST_SOCKET_IFNAME");
        for (const char *const *e = env; e && *e; e++) putenv((char *)*e);
        execv(argv[0], (char *const *)argv);
        _exit(121);
    }
    return pid;
}

#endif /* TDIST_TEST_NETNS_H */
