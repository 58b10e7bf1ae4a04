/* tests/tools/test_tdistrun_fr.c — the launcher and the flight recorder:
 * on a timeout its failure report says which rank everyone waited for
 * (tdist-fr on the workers' TDIST_FR_DIR, under --log-dir), and SIGUSR1
 * to the launcher makes every worker dump its rings without stopping. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"
#include "proc.h"
#include "test_tdistrun_helpers.h"

static bool exists(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0;
}

/* Wait (bounded) until dir/tdist-fr.r<r>.world.<ext> exists for r < n. */
static void wait_fr_files(const char *dir, const char *ext, int n)
{
    double t0 = tdist_test_now_ms();
    for (int r = 0; r < n; r++) {
        char p[700];
        snprintf(p, sizeof p, "%s/tdist-fr.r%d.world.%s", dir, r, ext);
        while (!exists(p) && tdist_test_now_ms() - t0 < 20000 * tdist_test_timeout_mult())
            usleep(20 * 1000);
        if (!exists(p)) FAIL("no %s", p);
    }
}

/* Start tdistrun (argv) whose workers write $T_DIR/pid.$RANK and wait
 * for $T_DIR/go; once both pid files exist, wait before_ms, send SIGUSR1
 * to the launcher, wait after_ms, create go, and wait for the end (r). */
static void usr1_then_go(const char *const argv[], const char *tag, int before_ms, int after_ms,
                         run_t *r)
{
    double start = tdist_test_now_ms();
    pid_t pid = spawn(argv, tag);
    trun_wait_files("pid", 2, 10000 * tdist_test_timeout_mult());
    usleep((useconds_t)before_ms * 1000);
    ASSERT_EQ(kill(pid, SIGUSR1), 0);
    usleep((useconds_t)after_ms * 1000);
    trun_touch("go");
    wait_for(pid, 30000 * tdist_test_timeout_mult(), tag, start, r);
}

/* SIGUSR1 to the launcher while its workers do not catch it (no tdist
 * group made yet; here not a tdist program at all): they are left alone,
 * not killed, tdistrun says so, and the job ends as it would have. */
TEST(tdistrun_fr_sigusr1_leaves_workers_without_a_recorder_alone, 60)
{
    trun_set_dir_env();
    const char *argv[] = {TDISTRUN, "--nproc-per-node", "2", "/bin/sh", "-c",
                          "echo $$ > $T_DIR/pid.$RANK; " TRUN_SH_AWAIT("go"), NULL};
    run_t r;
    usr1_then_go(argv, "frusr1none", 0, 300 /* tdistrun passes it on (or not) */, &r);
    ASSERT_EXIT(r, 0);
    ASSERT_CONTAINS(r.err, "tdistrun: got SIGUSR1; passed it to 0 workers");
    ASSERT_CONTAINS(r.err, "tdistrun: left 2 workers alone: they have no SIGUSR1 handler yet");
    ASSERT_CONTAINS(r.err, "tdistrun: all 2 workers exited with status 0");
    run_free(&r);
}

/* A job stuck before its first group: rank 0 is in tdist_init's
 * rendezvous, rank 1 has not called it yet (a shell waiting for a file
 * before it starts the worker). SIGUSR1 to the launcher reaches neither
 * (no recorder yet); the launcher reads the rendezvous from the store and
 * says which of them waits for the others and which has not registered.
 * With TDIST_LOG=info rank 0 logs, after a second, on whom it waits. Then
 * rank 1 starts and the job ends normally. */
TEST(tdistrun_fr_sigusr1_says_who_has_not_reached_the_rendezvous, 60)
{
    trun_set_dir_env();
    char timeout[32];
    snprintf(timeout, sizeof timeout, "%d", (int)(20000 * tdist_test_timeout_mult()));
    setenv("T_WORKER", TEST_WORKER, 1);
    setenv("T_TIMEOUT", timeout, 1);
    setenv("TDIST_LOG", "info", 1);
    const char *argv[] = {TDISTRUN, "--nproc-per-node", "2", "/bin/sh", "-c",
                          "echo $$ > $T_DIR/pid.$RANK; "
                          "if [ $RANK = 1 ]; then " TRUN_SH_AWAIT("go") " fi; "
                          "exec $T_WORKER hang 9 0 $T_TIMEOUT",
                          NULL};
    run_t r;
    /* 500 ms: rank 0 registers (a store round trip or two); 1500 ms:
     * tdistrun reads the store (at most 2 s, it takes ms), and rank 0 has
     * waited over a second (its first progress line) */
    usr1_then_go(argv, "frusr1rdzv", 500, 1500, &r);
    ASSERT_EXIT(r, 0);
    ASSERT_CONTAINS(r.err, "tdistrun: left 2 workers alone: they have no SIGUSR1 handler yet");
    ASSERT_CONTAINS(r.err, "tdistrun: rendezvous of attempt 0: 1 of 2 ranks registered\n");
    ASSERT_CONTAINS(r.err, "tdistrun:   registered, waiting in tdist_init for the others: rank 0 "
                           "(pid ");
    ASSERT_CONTAINS(r.err, "tdistrun:   not registered: rank 1 (pid ");
    ASSERT_CONTAINS(r.err, "rendezvous (rank 0 of 2): 1 of 2 ranks registered after 1 s; waiting "
                           "for rank 1\n");
    ASSERT_CONTAINS(r.err, "tdistrun: all 2 workers exited with status 0");
    run_free(&r);
    unsetenv("T_WORKER");
    unsetenv("T_TIMEOUT");
    unsetenv("TDIST_LOG");
}

/* Rank 2 stays in its own code; ranks 0 and 1 time out in all_reduce seq
 * 6: the report blames rank 2, not rank 0 which failed first. */
TEST(tdistrun_fr_report_names_the_rank_everyone_waited_for, 60)
{
    const char *logs = tmp_path("logs");
    char timeout[32];
    snprintf(timeout, sizeof timeout, "%d", (int)(1000 * tdist_test_timeout_mult()));
    const char *argv[] = {TDISTRUN, "--nproc-per-node", "3", "--grace-period", "1", "--log-dir",
                          logs, TEST_WORKER, "hang", "2", "60", timeout, NULL};
    run_t r;
    run(argv, 50, "frreport", &r);
    ASSERT_EXIT(r, 3);
    ASSERT_CONTAINS(r.err, "tdistrun: flight recorder (tdist-fr):\n");
    ASSERT_CONTAINS(r.err, "first divergence: rank 2 is missing from all_reduce(f32, 2, sum) seq 6 "
                           "of group world; ranks 0, 1 waited");
    char want[700];
    snprintf(want, sizeof want, "tdistrun: flight records of every rank: %s/attempt_0/fr", logs);
    ASSERT_CONTAINS(r.err, want);
    run_free(&r);
}

/* SIGUSR1 to the launcher: every worker writes a JSON dump (reason
 * SIGUSR1) and goes on. Then a plain SIGTERM to rank 2's worker (asleep
 * in its own code; TDIST_FR_DIR set by tdistrun): its recorder dumps
 * again (reason SIGTERM) and the worker still dies of SIGTERM, which
 * tdistrun reports as such, and ranks 0 and 1, stopped by tdistrun
 * (SIGTERM, SIGKILL only after 20 s), leave dumps too and die of the
 * SIGTERM. */
TEST(tdistrun_fr_sigusr1_dumps_every_worker, 60)
{
    const char *logs = tmp_path("logs");
    char dir[700], timeout[32];
    snprintf(dir, sizeof dir, "%s/attempt_0/fr", logs);
    snprintf(timeout, sizeof timeout, "%d", (int)(60000 * tdist_test_timeout_mult()));
    const char *argv[] = {TDISTRUN, "--nproc-per-node", "3", "--grace-period", "20", "--log-dir",
                          logs, TEST_WORKER, "hang", "2", "60", timeout, NULL};
    double start = tdist_test_now_ms();
    pid_t pid = spawn(argv, "frusr1");
    wait_fr_files(dir, "ring", 3);
    usleep(300 * 1000); /* the rings exist: the groups are made */
    ASSERT_EQ(kill(pid, SIGUSR1), 0);
    wait_fr_files(dir, "json", 3);
    char p[760];
    snprintf(p, sizeof p, "%s/tdist-fr.r2.world.json", dir);
    char *j = slurp(p);
    ASSERT_CONTAINS(j, "\"reason\":\"SIGUSR1\"");
    const char *at = strstr(j, "\"pid\":");
    ASSERT_TRUE(at != NULL);
    pid_t rank2 = (pid_t)atoi(at + 6);
    ASSERT_TRUE(rank2 > 1);
    free(j);
    for (int r = 0; r < 2; r++) { /* the dumps ranks 0 and 1 leave when stopped */
        snprintf(p, sizeof p, "%s/tdist-fr.r%d.world.json", dir, r);
        ASSERT_EQ(unlink(p), 0);
    }
    ASSERT_EQ(kill(rank2, SIGTERM), 0);
    run_t r;
    wait_for(pid, 50000 * tdist_test_timeout_mult(), "frusr1", start, &r);
    ASSERT_EXIT(r, 128 + SIGTERM);
    ASSERT_CONTAINS(r.err, "tdistrun: got SIGUSR1; passed it to 3 workers");
    char want[120];
    snprintf(want, sizeof want, "rank 2 (local rank 2, pid %d) failed first: it was killed by "
             "signal %d (SIGTERM)", (int)rank2, SIGTERM);
    ASSERT_CONTAINS(r.err, want);
    ASSERT_CONTAINS(r.err, "rank 2 is missing from all_reduce(f32, 2, sum) seq 6");
    /* ranks 0 and 1 dumped on tdistrun's SIGTERM and died of it: no SIGKILL */
    ASSERT_TRUE(strstr(r.err, "still running after the grace period") == NULL);
    snprintf(p, sizeof p, "%s/tdist-fr.r2.world.json", dir);
    j = slurp(p);
    ASSERT_CONTAINS(j, "\"reason\":\"SIGTERM\"");
    free(j);
    wait_fr_files(dir, "json", 2);
    run_free(&r);
}
