/*
 * tests/net/netfault.h — the two hosts of netns.h joined by a faulty link:
 * the fault-injection layer of the net tests.
 *
 * netfault_setup() makes the two namespaces as netns_setup() does, then
 * replaces their veth pair by a tun device in each namespace, with the
 * same addresses (t->addr), read and written by tdist_netfault
 * (tests/net/netfault.c), a userspace link that forwards every packet
 * with the faults asked for: delay with jitter, random loss, a bandwidth
 * limit behind a bounded queue, and at run time drop-everything, stalls
 * and TCP resets (netfault_ctl). So netns_run_ranks() runs ranks on a
 * link that behaves like a bad network, on a kernel without netem; the
 * addresses are still only the test's own, inside its own namespaces.
 *
 * netfault_stop() ends the relay and returns its counters (how many
 * packets it forwarded and dropped, and why), so a test can check that
 * the faults it asked for happened. netns_teardown() still removes the
 * namespaces; the relay also ends when the test process dies.
 */
#ifndef TDIST_TEST_NETFAULT_H
#define TDIST_TEST_NETFAULT_H

#include <sys/stat.h>

#include "netns.h"
#include "proc.h"

typedef struct netfault_opts {
    double delay_ms, jitter_ms, loss_pct, rate_mbit;
    unsigned seed;
} netfault_opts_t;

typedef struct netfault {
    pid_t pid;
    char ctl[512]; /* the relay's control FIFO */
    char out[512]; /* its stdout: the counters at the end */
} netfault_t;

/* One direction's counters (netfault.c's). */
typedef struct netfault_counts {
    unsigned long long in, fwd, loss, queue, blackhole, reset, bytes, err;
} netfault_counts_t;

/* The relay's path, or NULL (after saying why on stderr) when it is
 * missing: the caller tears its namespaces down and SKIPs. */
NETNS_FN const char *netfault_relay(const char *test)
{
    static const char path[] = TDIST_BIN_DIR "/tests/net/tdist_netfault";
    if (access(path, X_OK) == 0) return path;
    fprintf(stderr, "%s: %s was not built\n", test, path);
    return NULL;
}

/* Start the relay with o's faults and move t's addresses onto its tun
 * devices. false (after saying why on stderr) when this machine cannot:
 * the caller tears its namespaces down and SKIPs. */
NETNS_FN bool netfault_start(netns_topo_t *t, netfault_t *f, const netfault_opts_t *o,
                             const char *test)
{
    const char *relay = netfault_relay(test);
    if (!relay) return false;
    if (access("/dev/net/tun", R_OK | W_OK) != 0) {
        fprintf(stderr, "%s: no /dev/net/tun (%s)\n", test, strerror(errno));
        return false;
    }
    char out[1024], dev[2][16], num[6][32];
    for (int i = 0; i < 2; i++) {
        /* the veth pair goes: the tun link carries the addresses */
        if (NETNS_IP(t, out, sizeof out, "-n", t->ns[i], "link", "del", t->veth[i]) != 0 && i == 0)
            FAIL("ip -n %s link del %s: %s", t->ns[i], t->veth[i], out);
        snprintf(dev[i], sizeof dev[i], "tdf%d%c", (int)t->owner, 'a' + i);
    }
    snprintf(f->ctl, sizeof f->ctl, "%s/netfault.ctl", tdist_test_tmpdir());
    snprintf(f->out, sizeof f->out, "%s/netfault.out", tdist_test_tmpdir());
    unlink(f->ctl);
    if (mkfifo(f->ctl, 0600) != 0) FAIL("mkfifo %s: %s", f->ctl, strerror(errno));
    snprintf(num[0], sizeof num[0], "%g", o->delay_ms);
    snprintf(num[1], sizeof num[1], "%g", o->jitter_ms);
    snprintf(num[2], sizeof num[2], "%g", o->loss_pct);
    snprintf(num[3], sizeof num[3], "%g", o->rate_mbit);
    snprintf(num[4], sizeof num[4], "%u", o->seed ? o->seed : 12345u);
    int p[2];
    if (pipe(p) != 0) FAIL("pipe: %s", strerror(errno));
    snprintf(num[5], sizeof num[5], "%d", p[1]);
    /* it opens each device inside its namespace itself; started in A */
    const char *const argv[] = {relay, "--ns-a", t->ns[0], "--dev-a", dev[0], "--ns-b",
                                t->ns[1], "--dev-b", dev[1], "--ctl", f->ctl, "--delay", num[0],
                                "--jitter", num[1], "--loss", num[2], "--rate", num[3], "--seed",
                                num[4], "--ready-fd", num[5], "--max-seconds", "1800", NULL};
    pid_t pid = netns_spawn(t->ns[0], argv, NULL, "netfault");
    close(p[1]);
    f->pid = pid;
    struct pollfd pf = {.fd = p[0], .events = POLLIN};
    char ready[8] = "";
    if (poll(&pf, 1, (int)(10000 * tdist_test_timeout_mult())) != 1 ||
        read(p[0], ready, sizeof ready - 1) < 5) {
        char err[512];
        snprintf(err, sizeof err, "%s/netfault.err", tdist_test_tmpdir());
        char *why = slurp(err);
        FAIL("tdist_netfault did not start: %s", why);
    }
    close(p[0]);
    for (int i = 0; i < 2; i++) {
        char cidr[40];
        snprintf(cidr, sizeof cidr, "%s/24", t->addr[i]);
        if (NETNS_IP(t, out, sizeof out, "-n", t->ns[i], "addr", "add", cidr, "dev", dev[i]) != 0)
            FAIL("ip -n %s addr add %s dev %s: %s", t->ns[i], cidr, dev[i], out);
        if (NETNS_IP(t, out, sizeof out, "-n", t->ns[i], "link", "set", dev[i], "up") != 0)
            FAIL("ip -n %s link set %s up: %s", t->ns[i], dev[i], out);
    }
    return true;
}

/* Send the relay one command ("drop", "pass", "stall MS", "reset MS",
 * "set loss 3", ...; see netfault.c). Callable from ranks. */
NETNS_FN void netfault_ctl(const netfault_t *f, const char *cmd)
{
    int fd = open(f->ctl, O_WRONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) FAIL("open %s: %s", f->ctl, strerror(errno));
    char line[128];
    int n = snprintf(line, sizeof line, "%s\n", cmd);
    if (write(fd, line, (size_t)n) != n) FAIL("netfault command %s: %s", cmd, strerror(errno));
    close(fd);
}

/* End the relay; its counters per direction (0: a to b, 1: b to a). */
NETNS_FN void netfault_stop(netfault_t *f, netfault_counts_t c[2])
{
    memset(c, 0, 2 * sizeof *c);
    if (f->pid <= 0) return;
    kill(f->pid, SIGTERM);
    int status;
    double end = tdist_test_now_ms() + 10000 * tdist_test_timeout_mult();
    while (waitpid(f->pid, &status, WNOHANG) == 0) {
        if (tdist_test_now_ms() > end) {
            kill(f->pid, SIGKILL);
            waitpid(f->pid, &status, 0);
            FAIL("tdist_netfault did not end on SIGTERM");
        }
        usleep(2000);
    }
    f->pid = 0;
    char *s = slurp(f->out);
    for (int i = 0; i < 2; i++) {
        const char *line = strstr(s, i == 0 ? "netfault: a>b" : "netfault: b>a");
        if (!line ||
            sscanf(line + 13, " in %llu fwd %llu loss %llu queue %llu blackhole %llu reset %llu "
                              "bytes %llu err %llu", &c[i].in, &c[i].fwd, &c[i].loss, &c[i].queue,
                   &c[i].blackhole, &c[i].reset, &c[i].bytes, &c[i].err) != 8)
            FAIL("tdist_netfault's counters are missing: %s", s);
    }
    fprintf(stderr, "%s", s);
    free(s);
    unlink(f->ctl);
}

#endif /* TDIST_TEST_NETFAULT_H */
