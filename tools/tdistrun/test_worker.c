/* tools/tdistrun/test_worker.c — tdistrun_test_worker: a worker for the
 * launcher's tests (tests/tools/test_tdistrun*.c), built beside tdistrun
 * and never installed. It is linked with libtdist but does not call
 * tdist_init: what it shows is what any program linked with the library
 * gets from being started by tdistrun.
 *
 *   tdistrun_test_worker lines-then-crash abort|segv
 *       printf three lines to stdout (a pipe: block-buffered unless
 *       something made it line-buffered) and die of SIGABRT or SIGSEGV.
 *
 *   tdistrun_test_worker kill-race DIR [exit]
 *       every rank but the last opens the FIFO DIR/race.fifo for reading,
 *       creates DIR/ready.<rank> and waits until the FIFO's writer is gone,
 *       then exits 1 at once (_exit: as fast as a process can notice a
 *       death and fail); the last rank waits for every ready file, opens
 *       the FIFO for writing and SIGKILLs itself (with "exit": exits 5).
 *       The launcher must name the last rank as the first failure.
 *
 *   tdistrun_test_worker hang RANK SECS TIMEOUT_MS
 *       joins the job (env://), runs five 8-byte all_reduces with a group
 *       timeout of TIMEOUT_MS; then rank RANK sleeps SECS seconds in its
 *       own code before the sixth, where the others fail at the timeout
 *       and exit 3. The launcher's report must name RANK and seq 6.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tdist/tdist.h"

#define WAIT_MS 20000 /* longest wait for the other ranks */

static long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int env_int(const char *name)
{
    const char *v = getenv(name);
    return v ? atoi(v) : -1;
}

static int lines_then_crash(const char *how)
{
    for (int i = 1; i <= 3; i++) printf("line %d of 3 before the crash\n", i);
    if (strcmp(how, "segv") == 0) {
        raise(SIGSEGV);
    }
    abort();
}

static bool all_ready(const char *dir, int n)
{
    for (int r = 0; r < n; r++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/ready.%d", dir, r);
        if (access(path, F_OK) != 0) return false;
    }
    return true;
}

static int kill_race(const char *dir, bool by_exit)
{
    int rank = env_int("RANK"), n = env_int("WORLD_SIZE");
    if (rank < 0 || n < 2) {
        fprintf(stderr, "kill-race needs RANK and WORLD_SIZE >= 2 (run it under tdistrun)\n");
        return 2;
    }
    char fifo[4096];
    snprintf(fifo, sizeof fifo, "%s/race.fifo", dir);
    if (rank != n - 1) {
        int fd = open(fifo, O_RDONLY | O_NONBLOCK);
        char ready[4096];
        snprintf(ready, sizeof ready, "%s/ready.%d", dir, rank);
        int rfd = open(ready, O_WRONLY | O_CREAT, 0644);
        if (fd < 0 || rfd < 0) {
            fprintf(stderr, "kill-race rank %d: %s: %s\n", rank, fd < 0 ? fifo : ready,
                    strerror(errno));
            return 2;
        }
        close(rfd);
        /* POLLHUP once the writer has come and gone */
        struct pollfd p = {.fd = fd, .events = POLLIN};
        for (long long end = now_ms() + WAIT_MS; now_ms() < end;) {
            if (poll(&p, 1, 100) > 0 && (p.revents & POLLHUP)) _exit(1);
        }
        return 3;
    }
    for (long long end = now_ms() + WAIT_MS; !all_ready(dir, n - 1);) {
        if (now_ms() > end) return 4;
        usleep(1000);
    }
    int fd = open(fifo, O_WRONLY);
    if (fd < 0) {
        fprintf(stderr, "kill-race rank %d: %s: %s\n", rank, fifo, strerror(errno));
        return 2;
    }
    if (by_exit) _exit(5);
    raise(SIGKILL);
    return 5;
}

static int hang(int who, int secs, long timeout_ms)
{
    tdist_world_t *w = NULL;
    tdist_pg_t *pg = NULL;
    tdist_pg_opts_t o;
    tdist_pg_opts_init(&o);
    o.timeout_ms = timeout_ms;
    if (tdist_init("env://", NULL, &w) != TDIST_OK || tdist_pg_create_world(w, &o, &pg) != TDIST_OK) {
        fprintf(stderr, "hang: %s\n", tdist_last_error());
        return 2;
    }
    float x[2] = {1, 2};
    for (int i = 0; i < 6; i++) {
        if (i == 5 && tdist_world_rank(w) == who)
            for (int s = 0; s < secs * 10; s++) usleep(100 * 1000);
        if (tdist_all_reduce(pg, x, x, 2, TDIST_F32, TDIST_SUM, NULL, NULL) != TDIST_OK) {
            fprintf(stderr, "hang: %s\n", tdist_last_error());
            return 3;
        }
    }
    tdist_pg_destroy(pg);
    tdist_world_destroy(w);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 5 && strcmp(argv[1], "hang") == 0)
        return hang(atoi(argv[2]), atoi(argv[3]), atol(argv[4]));
    if (argc == 3 && strcmp(argv[1], "lines-then-crash") == 0) return lines_then_crash(argv[2]);
    if ((argc == 3 || argc == 4) && strcmp(argv[1], "kill-race") == 0)
        return kill_race(argv[2], argc == 4 && strcmp(argv[3], "exit") == 0);
    fprintf(stderr,
            "usage: tdistrun_test_worker lines-then-crash abort|segv\n"
            "       tdistrun_test_worker kill-race DIR [exit]\n"
            "       tdistrun_test_worker hang RANK SECS TIMEOUT_MS\n"
            "(a worker for tdistrun's tests; linked with tdist %s)\n",
            tdist_version());
    return 2;
}
