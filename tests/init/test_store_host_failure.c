/* tests/init/test_store_host_failure.c — failures never wait on the store.
 * Rank 0 hosts the world's store (env:// without a launcher's store) and
 * is the one that fails: SIGSTOPped or SIGKILLed in the middle of an
 * all_reduce loop, or SIGKILLed while every rank is idle. With a group
 * timeout T = 2 s, every other rank's collective fails within T + 1 s of
 * the victim's end (the announcement of the failure through the stopped or
 * dead store is bounded), and every other process is gone — world
 * destroyed, store calls included — within T + 2 s. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "harness.h"
#include "init_env.h"
#include "tdist/pg.h"

#define T_MS 2000
#define N 3

typedef enum how { H_STOP, H_KILL, H_KILL_IDLE } how_t;

typedef struct shared {
    double t_end;          /* when the victim stopped / died */
    int victim_pid;
    double t_error[N];     /* when each survivor's collective failed */
    double t_gone[N];      /* when each survivor's world was destroyed */
    char msg[N][600];
} shared_t;

typedef struct arg {
    how_t how;
    shared_t *sh;
    int fd;        /* rank 0's store listens here (bound to 127.0.0.1:0 by the test) */
    uint16_t port;
} arg_t;

static void victim(shared_t *sh, how_t how)
{
    sh->victim_pid = getpid();
    sh->t_end = tdist_test_now_ms();
    raise(how == H_STOP ? SIGSTOP : SIGKILL);
    FAIL("victim still running");
}

static void body(int rank, int n, void *argp)
{
    arg_t *a = argp;
    shared_t *sh = a->sh;
    char v[32];
    clear_init_env();
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    snprintf(v, sizeof v, "%u", (unsigned)a->port);
    setenv("MASTER_PORT", v, 1);
    snprintf(v, sizeof v, "%d", rank);
    setenv("RANK", v, 1);
    snprintf(v, sizeof v, "%d", n);
    setenv("WORLD_SIZE", v, 1);
    if (rank == 0) {
        snprintf(v, sizeof v, "%d", a->fd);
        setenv("TDIST_STORE_LISTEN_FD", v, 1);
    } else {
        close(a->fd);
    }
    tdist_world_t *w;
    ASSERT_OK(tdist_init("env://", NULL, &w));
    tdist_pg_opts_t o;
    tdist_pg_opts_init(&o);
    o.timeout_ms = T_MS;
    tdist_pg_t *pg = NULL;
    ASSERT_OK(tdist_pg_create_world(w, &o, &pg));
    float buf[1024];
    double limit = tdist_test_now_ms() + 20000 * tdist_test_timeout_mult();
    for (int it = 0; it < 100000 && tdist_test_now_ms() < limit; it++) {
        if (a->how == H_KILL_IDLE && it == 20) {
            /* everyone idle: the victim dies while nobody waits on it */
            if (rank == 0) victim(sh, a->how);
            while (sh->t_end == 0 && tdist_test_now_ms() < limit) usleep(1000);
            usleep(200 * 1000);
        } else if (rank == 0 && it == 20) {
            victim(sh, a->how);
        }
        for (int i = 0; i < 1024; i++) buf[i] = (float)(rank + 1);
        tdist_status_t st = tdist_all_reduce(pg, buf, buf, 1024, TDIST_F32, TDIST_SUM, NULL, NULL);
        if (st == TDIST_OK) continue;
        sh->t_error[rank] = tdist_test_now_ms();
        snprintf(sh->msg[rank], sizeof sh->msg[rank], "%s", tdist_last_error());
        break;
    }
    if (sh->t_error[rank] == 0) FAIL("no collective failed");
    tdist_pg_destroy(pg);
    tdist_world_destroy(w);
    sh->t_gone[rank] = tdist_test_now_ms();
    if (rank == 1 && a->how == H_STOP) kill(sh->victim_pid, SIGKILL);
}

static void run(how_t how)
{
    shared_t *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED) FAIL("mmap: %s", strerror(errno));
    memset(sh, 0, sizeof *sh);
    arg_t a = {how, sh, -1, 0};
    a.fd = listen_local(AF_INET, &a.port);
    ASSERT_TRUE(a.fd >= 0);
    tdist_ranks_opts_t o;
    tdist_ranks_opts_init(&o, N);
    o.with_store = false;          /* rank 0 hosts the store */
    o.kill_others_after_ms = -1;   /* the victim's end is expected */
    tdist_rank_result_t res[N];
    tdist_test_spawn_ranks(&o, body, &a, res);
    close(a.fd);
    char buf[128];
    for (int r = 1; r < N; r++) {
        if (!res[r].exited || res[r].code != 0)
            FAIL("rank %d %s (its error: %s)", r, tdist_test_describe(&res[r], buf, sizeof buf),
                 sh->msg[r]);
        double err = sh->t_error[r] - sh->t_end, gone = sh->t_gone[r] - sh->t_end;
        fprintf(stderr, "rank %d: error %.0f ms, gone %.0f ms after the store host's end: %s\n", r,
                err, gone, sh->msg[r]);
        double slack = 200 * tdist_test_timeout_mult();
        ASSERT_TRUE(err <= T_MS + 1000 + slack);
        ASSERT_TRUE(gone <= T_MS + 2000 + slack);
    }
    munmap(sh, sizeof *sh);
}

TEST(init_store_host_sigstop_bounded, 40) { run(H_STOP); }
TEST(init_store_host_sigkill_mid_loop_bounded, 40) { run(H_KILL); }
TEST(init_store_host_sigkill_idle_bounded, 40) { run(H_KILL_IDLE); }
