/*
 * tests/net/netfault.c — tdist_netfault, a userspace link between two
 * network namespaces, with faults: the net tests' and bench/netfault.sh's
 * replacement for netem (which not every kernel has).
 *
 * It makes one tun device in each of two existing namespaces (the caller
 * made them, and gives them addresses afterwards: everything the link
 * carries is between addresses the caller created there) and forwards
 * every IP packet read from one to the other, after the faults:
 *
 *   --delay MS --jitter MS   one-way delay, uniform in [delay - jitter,
 *                            delay + jitter]; packets stay in order
 *   --loss PCT               each packet dropped with this probability
 *   --rate MBIT              a bottleneck: packets leave one after the
 *                            other at this rate, behind a queue of
 *                            --queue-ms (default 100) worth of bytes;
 *                            a packet that finds it full is dropped
 *   --seed N                 the loss and jitter generator's seed
 *
 * and, at run time, through the control FIFO (--ctl PATH; one command
 * per line, any process may write it):
 *
 *   drop                     drop every packet from now on (a cut cable)
 *   pass                     forward again
 *   stall MS                 hold every packet for MS ms, then deliver
 *                            them in order (a link that pauses)
 *   reset MS                 for MS ms, answer every TCP segment that is
 *                            not itself a reset with a reset to both ends
 *                            of its connection (the segment is dropped)
 *   set delay|jitter|loss|rate|queue VALUE
 *                            change a fault
 *
 * Readiness: when both devices exist it writes "ready\n" to --ready-fd.
 * It ends on SIGTERM or SIGINT, when its parent dies, or after
 * --max-seconds (default 900), and then prints its counters on stdout
 * ("netfault: a>b in N fwd N loss N queue N blackhole N reset N bytes N
 * err N"; err: writes the receiving device refused).
 *
 * Needs CAP_NET_ADMIN (root) and /dev/net/tun. Single-threaded; every
 * loop is bounded by the packet queues' sizes or the deadline.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define PKT_MAX 2048
#define QCAP 8192 /* packets queued per direction */

typedef struct pkt {
    uint64_t due; /* delivery time, ns */
    uint16_t len;
    unsigned char data[PKT_MAX];
} pkt_t;

typedef struct counters {
    uint64_t in, fwd, loss, queue, blackhole, reset, bytes, err;
} counters_t;

/* One direction: packets read from dev[from], written to dev[!from]. */
typedef struct dir {
    pkt_t *q;
    size_t head, n;
    uint64_t link_free; /* when the bottleneck is free again, ns */
    uint64_t last_due;  /* keeps the order */
    counters_t c;
} dir_t;

typedef struct cfg {
    double delay_ms, jitter_ms, loss_pct, rate_mbit, queue_ms;
} cfg_t;

static volatile sig_atomic_t stop;
static cfg_t cfg = {.queue_ms = 100};
static bool blackhole;
static uint64_t stall_until, reset_until;
static uint64_t rng = 0x9e3779b97f4a7c15ull;
static int tun[2] = {-1, -1};
static dir_t dirs[2];

static void on_signal(int sig)
{
    (void)sig;
    stop = 1;
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static double urand(void) /* [0, 1) */
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0;
}

static void die(const char *what)
{
    fprintf(stderr, "tdist_netfault: %s: %s\n", what, strerror(errno));
    exit(2);
}

/* Open a tun device named dev inside namespace ns. */
static int open_tun(const char *ns, const char *dev, int home)
{
    char path[256];
    snprintf(path, sizeof path, "/run/netns/%s", ns);
    int nfd = open(path, O_RDONLY | O_CLOEXEC);
    if (nfd < 0) die(path);
    if (setns(nfd, CLONE_NEWNET) != 0) die("setns");
    close(nfd);
    int fd = open("/dev/net/tun", O_RDWR | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) die("/dev/net/tun");
    struct ifreq ifr;
    memset(&ifr, 0, sizeof ifr);
    ifr.ifr_flags = IFF_TUN | IFF_NO_PI;
    snprintf(ifr.ifr_name, IFNAMSIZ, "%s", dev);
    if (ioctl(fd, TUNSETIFF, &ifr) != 0) die("TUNSETIFF");
    if (setns(home, CLONE_NEWNET) != 0) die("setns back");
    return fd;
}

static uint16_t csum_fold(uint32_t s)
{
    while (s >> 16) s = (s & 0xffff) + (s >> 16);
    return (uint16_t)~s;
}

static uint32_t csum_add(uint32_t s, const unsigned char *p, size_t n)
{
    for (size_t i = 0; i + 1 < n; i += 2) s += (uint32_t)(p[i] << 8 | p[i + 1]);
    if (n & 1) s += (uint32_t)(p[n - 1] << 8);
    return s;
}

/* A bare TCP reset from src to dst (addresses and ports as in the
 * segment's bytes) with sequence number seq, into out[40]. */
static void make_rst(unsigned char *out, const unsigned char *src, const unsigned char *dst,
                     const unsigned char *sport, const unsigned char *dport, uint32_t seq)
{
    memset(out, 0, 40);
    out[0] = 0x45;
    out[3] = 40;
    out[8] = 64;
    out[9] = 6;
    memcpy(out + 12, src, 4);
    memcpy(out + 16, dst, 4);
    uint16_t ic = csum_fold(csum_add(0, out, 20));
    out[10] = (unsigned char)(ic >> 8);
    out[11] = (unsigned char)ic;
    unsigned char *t = out + 20;
    memcpy(t, sport, 2);
    memcpy(t + 2, dport, 2);
    t[4] = (unsigned char)(seq >> 24);
    t[5] = (unsigned char)(seq >> 16);
    t[6] = (unsigned char)(seq >> 8);
    t[7] = (unsigned char)seq;
    t[12] = 5 << 4;
    t[13] = 0x04; /* RST */
    uint32_t s = csum_add(0, out + 12, 8) + 6 + 20;
    uint16_t tc = csum_fold(csum_add(s, t, 20));
    t[16] = (unsigned char)(tc >> 8);
    t[17] = (unsigned char)tc;
}

static uint32_t be32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* Queue a packet for delivery in direction d at the link's pace. */
static void enqueue(dir_t *d, const unsigned char *p, size_t len, uint64_t now)
{
    if (d->n == QCAP) {
        d->c.queue++;
        return;
    }
    uint64_t start = d->link_free > now ? d->link_free : now;
    if (cfg.rate_mbit > 0) {
        if ((double)(start - now) > cfg.queue_ms * 1e6) {
            d->c.queue++;
            return;
        }
        d->link_free = start + (uint64_t)((double)len * 8e3 / cfg.rate_mbit);
        start = d->link_free;
    }
    double ms = cfg.delay_ms + cfg.jitter_ms * (2 * urand() - 1);
    uint64_t due = start + (uint64_t)(ms > 0 ? ms * 1e6 : 0);
    if (due < d->last_due) due = d->last_due;
    d->last_due = due;
    pkt_t *k = &d->q[(d->head + d->n) % QCAP];
    k->due = due;
    k->len = (uint16_t)len;
    memcpy(k->data, p, len);
    d->n++;
}

/* A TCP segment during a reset window: resets to both ends instead. */
static bool reset_segment(int from, const unsigned char *p, size_t len, uint64_t now)
{
    if (len < 40 || (p[0] >> 4) != 4 || p[9] != 6) return false;
    size_t ihl = (size_t)(p[0] & 15) * 4;
    if (len < ihl + 20) return false;
    const unsigned char *t = p + ihl;
    if (t[13] & 0x04) return false; /* already a reset */
    unsigned char rst[40];
    /* to the receiver, behind what is already on its way: in order, its
     * sequence number is then the one the receiver expects */
    make_rst(rst, p + 12, p + 16, t, t + 2, be32(t + 4));
    enqueue(&dirs[from], rst, sizeof rst, now);
    /* to the sender at once, with the number it acknowledged last */
    if (t[13] & 0x10) {
        make_rst(rst, p + 16, p + 12, t + 2, t, be32(t + 8));
        if (write(tun[from], rst, sizeof rst) < 0) { /* the sender's retransmission meets a reset */ }
    }
    dirs[from].c.reset++;
    return true;
}

static void read_side(int from, uint64_t now)
{
    unsigned char buf[PKT_MAX];
    dir_t *d = &dirs[from];
    for (int i = 0; i < QCAP; i++) { /* bounded: at most one queue's worth per wake */
        ssize_t got = read(tun[from], buf, sizeof buf);
        if (got <= 0) return;
        d->c.in++;
        if (blackhole) {
            d->c.blackhole++;
            continue;
        }
        if (now < reset_until && reset_segment(from, buf, (size_t)got, now)) continue;
        if (cfg.loss_pct > 0 && urand() * 100 < cfg.loss_pct) {
            d->c.loss++;
            continue;
        }
        enqueue(d, buf, (size_t)got, now);
    }
}

/* Deliver what is due; returns the time of the next due packet (0: none). */
static uint64_t deliver(uint64_t now)
{
    uint64_t next = 0;
    for (int from = 0; from < 2; from++) {
        dir_t *d = &dirs[from];
        while (d->n > 0) {
            pkt_t *k = &d->q[d->head];
            uint64_t due = k->due > stall_until ? k->due : stall_until;
            if (due > now) {
                if (!next || due < next) next = due;
                break;
            }
            if (write(tun[!from], k->data, k->len) == (ssize_t)k->len) {
                d->c.fwd++;
                d->c.bytes += k->len;
            } else {
                d->c.err++; /* the receiving device is not up (yet) */
            }
            d->head = (d->head + 1) % QCAP;
            d->n--;
        }
    }
    return next;
}

static bool set_value(const char *key, double v)
{
    if (strcmp(key, "delay") == 0) cfg.delay_ms = v;
    else if (strcmp(key, "jitter") == 0) cfg.jitter_ms = v;
    else if (strcmp(key, "loss") == 0) cfg.loss_pct = v;
    else if (strcmp(key, "rate") == 0) cfg.rate_mbit = v;
    else if (strcmp(key, "queue") == 0) cfg.queue_ms = v;
    else return false;
    return true;
}

static void command(char *line, uint64_t now)
{
    char key[32] = "";
    double v = 0;
    if (strcmp(line, "drop") == 0) blackhole = true;
    else if (strcmp(line, "pass") == 0) blackhole = false;
    else if (sscanf(line, "stall %lf", &v) == 1) stall_until = now + (uint64_t)(v * 1e6);
    else if (sscanf(line, "reset %lf", &v) == 1) reset_until = now + (uint64_t)(v * 1e6);
    else if (sscanf(line, "set %31s %lf", key, &v) == 2 && set_value(key, v)) {}
    else fprintf(stderr, "tdist_netfault: unknown command '%s'\n", line);
}

static void read_ctl(int fd, char *acc, size_t *n, uint64_t now)
{
    ssize_t got = read(fd, acc + *n, 255 - *n);
    if (got <= 0) return;
    *n += (size_t)got;
    acc[*n] = '\0';
    char *nl;
    while ((nl = strchr(acc, '\n')) != NULL) {
        *nl = '\0';
        command(acc, now);
        size_t rest = *n - (size_t)(nl + 1 - acc);
        memmove(acc, nl + 1, rest + 1);
        *n = rest;
    }
    if (*n == 255) *n = 0; /* a line too long: dropped */
}

static void usage(void)
{
    fprintf(stderr, "usage: tdist_netfault --ns-a NS --dev-a DEV --ns-b NS --dev-b DEV [--ctl FIFO]\n"
                    "  [--ready-fd FD] [--delay MS] [--jitter MS] [--loss PCT] [--rate MBIT]\n"
                    "  [--queue-ms MS] [--seed N] [--max-seconds S]\n");
    exit(2);
}

int main(int argc, char **argv)
{
    const char *ns[2] = {NULL, NULL}, *dev[2] = {NULL, NULL}, *ctl = NULL;
    int ready_fd = -1;
    double max_s = 900;
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *k = argv[i], *v = argv[i + 1];
        if (strcmp(k, "--ns-a") == 0) ns[0] = v;
        else if (strcmp(k, "--ns-b") == 0) ns[1] = v;
        else if (strcmp(k, "--dev-a") == 0) dev[0] = v;
        else if (strcmp(k, "--dev-b") == 0) dev[1] = v;
        else if (strcmp(k, "--ctl") == 0) ctl = v;
        else if (strcmp(k, "--ready-fd") == 0) ready_fd = atoi(v);
        else if (strcmp(k, "--seed") == 0) rng = strtoull(v, NULL, 0) | 1;
        else if (strcmp(k, "--max-seconds") == 0) max_s = atof(v);
        else if (strcmp(k, "--queue-ms") == 0) cfg.queue_ms = atof(v);
        else if (strncmp(k, "--", 2) != 0 || !set_value(k + 2, atof(v))) usage();
    }
    if (argc % 2 == 0 || !ns[0] || !ns[1] || !dev[0] || !dev[1]) usage();
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
    signal(SIGPIPE, SIG_IGN);
    int home = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
    if (home < 0) die("/proc/self/ns/net");
    for (int i = 0; i < 2; i++) {
        tun[i] = open_tun(ns[i], dev[i], home);
        dirs[i].q = malloc(QCAP * sizeof(pkt_t));
        if (!dirs[i].q) die("malloc");
    }
    close(home);
    int cfd = -1;
    if (ctl) {
        cfd = open(ctl, O_RDWR | O_NONBLOCK | O_CLOEXEC); /* RDWR: never sees EOF */
        if (cfd < 0) die(ctl);
    }
    if (ready_fd >= 0) {
        if (write(ready_fd, "ready\n", 6) != 6) die("ready-fd");
        close(ready_fd);
    }
    char acc[256];
    size_t acc_n = 0;
    uint64_t end = now_ns() + (uint64_t)(max_s * 1e9);
    while (!stop) {
        uint64_t now = now_ns();
        if (now > end) break;
        uint64_t next = deliver(now);
        int64_t wait_ns = next ? (int64_t)(next - now) : 100000000;
        if (wait_ns > 100000000) wait_ns = 100000000;
        struct pollfd p[3] = {{.fd = tun[0], .events = POLLIN},
                              {.fd = tun[1], .events = POLLIN},
                              {.fd = cfd, .events = POLLIN}};
        struct timespec ts = {wait_ns / 1000000000, wait_ns % 1000000000};
        int r = ppoll(p, cfd >= 0 ? 3 : 2, &ts, NULL);
        if (r < 0 && errno != EINTR) die("ppoll");
        if (r <= 0) continue;
        now = now_ns();
        if (cfd >= 0 && (p[2].revents & POLLIN)) read_ctl(cfd, acc, &acc_n, now);
        for (int i = 0; i < 2; i++)
            if (p[i].revents & POLLIN) read_side(i, now);
    }
    for (int i = 0; i < 2; i++) {
        const counters_t *c = &dirs[i].c;
        printf("netfault: %s in %llu fwd %llu loss %llu queue %llu blackhole %llu reset %llu "
               "bytes %llu err %llu\n", i == 0 ? "a>b" : "b>a", (unsigned long long)c->in,
               (unsigned long long)c->fwd, (unsigned long long)c->loss,
               (unsigned long long)c->queue, (unsigned long long)c->blackhole,
               (unsigned long long)c->reset, (unsigned long long)c->bytes,
               (unsigned long long)c->err);
        free(dirs[i].q);
    }
    fflush(stdout);
    return 0;
}
