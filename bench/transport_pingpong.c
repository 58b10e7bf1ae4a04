/*
 * bench/transport_pingpong.c — a transport between two processes (fork):
 * TCP on 127.0.0.1 or shared memory; round-trip latency of an 8-byte
 * ping-pong and one-way bandwidth of a 64 MiB message (acknowledged by 1
 * byte).
 *
 * Usage: bench_transport_pingpong [pingpong_iters] [bw_reps] [tcp|shm]
 * Latency: median of pingpong_iters (default 20000) timed round trips
 * after 1000 warm-up ones. Bandwidth: median of bw_reps (default 7)
 * timed transfers after one warm-up. Ends with RESULT lines.
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "transport/transport.h"

#define BW_BYTES (64u << 20)
#define WARMUP 1000

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static void die(const char *what, tdist_status_t st)
{
    fprintf(stderr, "transport_pingpong: %s: %s: %s\n", what, tdist_status_str(st),
            tdist_last_error());
    exit(1);
}

#define CHECK(what, expr)                                                      \
    do {                                                                       \
        tdist_status_t st_ = (expr);                                           \
        if (st_ != TDIST_OK) die(what, st_);                                   \
    } while (0)

/* Both ranks run this; rank 0 times. */
static void run(tdist__tp_t *tp, int rank, int iters, int reps, const char *kind)
{
    int peer = 1 - rank;
    int64_t dl = tdist__now_ms() + 120000;
    uint64_t v = 0;
    double *lat = malloc((size_t)iters * sizeof *lat);
    double *bw = malloc((size_t)reps * sizeof *bw);
    uint8_t *big = malloc(BW_BYTES);
    if (!lat || !bw || !big) die("out of memory", TDIST_ERR_NO_MEMORY);
    memset(big, rank + 1, BW_BYTES);
    for (int i = -WARMUP; i < iters; i++) {
        uint64_t t0 = tdist__now_ns();
        if (rank == 0) {
            v = (uint64_t)i;
            CHECK("ping send", tdist__tp_send(tp, peer, &v, 8, dl));
            CHECK("pong recv", tdist__tp_recv(tp, peer, &v, 8, dl));
            if (v != (uint64_t)i + 1) die("pong value", TDIST_ERR_INTERNAL);
        } else {
            CHECK("ping recv", tdist__tp_recv(tp, peer, &v, 8, dl));
            v++;
            CHECK("pong send", tdist__tp_send(tp, peer, &v, 8, dl));
        }
        if (i >= 0) lat[i] = (double)(tdist__now_ns() - t0) / 1e3;
    }
    char ack = 'a';
    for (int r = -1; r < reps; r++) {
        uint64_t t0 = tdist__now_ns();
        if (rank == 0) {
            CHECK("bw send", tdist__tp_send(tp, peer, big, BW_BYTES, dl));
            CHECK("bw ack", tdist__tp_recv(tp, peer, &ack, 1, dl));
        } else {
            CHECK("bw recv", tdist__tp_recv(tp, peer, big, BW_BYTES, dl));
            CHECK("bw ack", tdist__tp_send(tp, peer, &ack, 1, dl));
        }
        if (r >= 0) bw[r] = BW_BYTES / ((double)(tdist__now_ns() - t0) / 1e9) / 1e9;
    }
    if (rank == 0) {
        double l = median(lat, iters), b = median(bw, reps);
        printf("8 B round trip: median %.2f us over %d; 64 MiB one way: median %.2f GB/s over %d\n",
               l, iters, b, reps);
        printf("RESULT transport_%s_pingpong_8B_rtt %.2f us\n", kind, l);
        printf("RESULT transport_%s_oneway_64MiB_bw %.3f GB/s\n", kind, b);
    }
    free(lat);
    free(bw);
    free(big);
}

int main(int argc, char **argv)
{
    int iters = argc > 1 ? atoi(argv[1]) : 20000;
    int reps = argc > 2 ? atoi(argv[2]) : 7;
    const char *kind = argc > 3 ? argv[3] : "tcp";
    bool shm = strcmp(kind, "shm") == 0;
    if (iters < 1 || reps < 1 || (!shm && strcmp(kind, "tcp") != 0)) {
        fprintf(stderr, "usage: %s [pingpong_iters >= 1] [bw_reps >= 1] [tcp|shm]\n", argv[0]);
        return 2;
    }
    /* Each end listens after the fork (a shared-memory segment belongs to
     * its process) and the two swap addresses through pipes. */
    int to_child[2], to_parent[2];
    if (pipe(to_child) != 0 || pipe(to_parent) != 0) {
        perror("pipe");
        return 1;
    }
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) {
        perror("fork");
        return 1;
    }
    int rank = pid == 0 ? 1 : 0;
    tdist__tp_opts_t o = {.bind_addr = "127.0.0.1", .tag = 0x62656e6368ull};
    tdist__tp_t *tp;
    CHECK("listen", tdist__tp_listen(shm ? TDIST__TP_SHM : TDIST__TP_TCP, rank, 2, &o, &tp));
    char mine[128] = {0}, theirs[128] = {0};
    snprintf(mine, sizeof mine, "%s", tdist__tp_address(tp));
    int wfd = rank == 0 ? to_child[1] : to_parent[1], rfd = rank == 0 ? to_parent[0] : to_child[0];
    if (write(wfd, mine, sizeof mine) != (ssize_t)sizeof mine ||
        read(rfd, theirs, sizeof theirs) != (ssize_t)sizeof theirs) {
        perror("address exchange");
        return 1;
    }
    close(to_child[0]);
    close(to_child[1]);
    close(to_parent[0]);
    close(to_parent[1]);
    const char *addrs[2] = {rank == 0 ? mine : theirs, rank == 0 ? theirs : mine};
    CHECK("connect", tdist__tp_connect(tp, addrs, tdist__now_ms() + 30000));
    run(tp, rank, iters, reps, kind);
    tdist__tp_destroy(tp);
    if (rank == 1) return 0;
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}
