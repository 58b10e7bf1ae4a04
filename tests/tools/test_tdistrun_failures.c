/* tests/tools/test_tdistrun_failures.c — the launcher when things go wrong:
 * which failure it names first, what survives a killed launcher, a reader
 * that stops reading the launcher's output, the last output of a worker
 * that crashes. Each test starts the built tdistrun as a real program
 * (test_tdistrun_helpers.h); the workers are /bin/sh one-liners or
 * tdistrun_test_worker (tools/tdistrun/test_worker.c). */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test_tdistrun_helpers.h"

/* -------------------------------------------------------- first failure */

/* Rank 3 SIGKILLs itself; ranks 0..2 notice at once (its FIFO's writer is
 * gone) and _exit(1). However the deaths are reaped, every run must name
 * rank 3 and exit 128 + SIGKILL. */
TEST(tdistrun_first_failure_sweep_names_the_killed_rank, 120)
{
    const int runs = 25;
    for (int i = 0; i < runs; i++) {
        char dir[512], fifo[600], tag[32];
        snprintf(dir, sizeof dir, "%s/race%d", tdist_test_tmpdir(), i);
        snprintf(fifo, sizeof fifo, "%s/race.fifo", dir);
        snprintf(tag, sizeof tag, "race%d", i);
        ASSERT_EQ(mkdir(dir, 0755), 0);
        ASSERT_EQ(mkfifo(fifo, 0644), 0);
        const char *argv[] = {TDISTRUN,    "--nproc-per-node", "4",   "--grace-period", "1",
                              TEST_WORKER, "kill-race",        dir,   NULL};
        run_t r;
        run(argv, 30, tag, &r);
        if (!r.exited || r.code != 128 + SIGKILL ||
            !strstr(r.err, "FAILED: rank 3 (local rank 3, pid "))
            FAIL("run %d of %d: expected rank 3 killed by SIGKILL named first and exit 137, got "
                 "%s %d:\n%s", i + 1, runs, r.exited ? "exit" : "signal",
                 r.exited ? r.code : r.sig, r.err);
        ASSERT_CONTAINS(r.err, "failed first: it was killed by signal 9 (SIGKILL)");
        run_free(&r);
    }
}

/* Rank a's action, then rank b's, while the launcher is stopped
 * (SIGSTOP): both are dead before it can reap either, so it reaps them in
 * one go when it continues. T_RANK0 / T_RANK3 say what ranks 0 and 3 do. */
static void deaths_while_stopped(int a, int b, run_t *r)
{
    trun_set_dir_env();
    const char *argv[] = {TDISTRUN, "--nproc-per-node", "4", "--grace-period", "1", "/bin/sh",
                          "-c",
                          "echo $$ > $T_DIR/pid.$RANK; " TRUN_SH_AWAIT("go.$RANK")
                          "[ $RANK = 0 ] && eval \"$T_RANK0\"; [ $RANK = 3 ] && eval \"$T_RANK3\";"
                          "exec sleep 120",
                          NULL};
    double start = tdist_test_now_ms();
    pid_t pid = spawn(argv, "stopped");
    trun_wait_files("pid", 4, 10000 * tdist_test_timeout_mult());
    pid_t pids[4];
    trun_read_pids(4, pids);
    ASSERT_EQ(kill(pid, SIGSTOP), 0);
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, WUNTRACED), pid);
    ASSERT_TRUE(WIFSTOPPED(status));
    const int order[2] = {a, b};
    for (int k = 0; k < 2; k++) {
        char go[32];
        snprintf(go, sizeof go, "go.%d", order[k]);
        trun_touch(go);
        double end = tdist_test_now_ms() + 10000 * tdist_test_timeout_mult();
        while (!trun_pid_gone(pids[order[k]])) { /* a zombie until the launcher reaps it */
            if (tdist_test_now_ms() > end) FAIL("rank %d did not end", order[k]);
            usleep(2000);
        }
    }
    ASSERT_EQ(kill(pid, SIGCONT), 0);
    wait_for(pid, 20000 * tdist_test_timeout_mult(), "stopped", start, r);
    unsetenv("T_RANK0");
    unsetenv("T_RANK3");
}

/* Rank 3 exits 5, then rank 0 exits 7, reaped together when the launcher
 * continues: both failures are reported, one as the first and the other as
 * "also failed", and the launcher exits with the first one's status. Which
 * of two plain exits comes first is the launcher's best guess (the SIGCHLD
 * it was sent first usually names rank 3, but not always: seen once in a
 * fresh-machine run), so the order is not asserted. */
TEST(tdistrun_failures_reaped_together_are_both_reported, 60)
{
    setenv("T_RANK3", "exit 5", 1);
    setenv("T_RANK0", "exit 7", 1);
    run_t r;
    deaths_while_stopped(3, 0, &r);
    bool three_first = strstr(r.err, "FAILED: rank 3 (local rank 3, pid ") != NULL;
    bool zero_first = strstr(r.err, "FAILED: rank 0 (local rank 0, pid ") != NULL;
    ASSERT_TRUE(three_first != zero_first);
    if (three_first) {
        ASSERT_EXIT(r, 5);
        ASSERT_CONTAINS(r.err, "also failed before the others were stopped: rank 0 exited with "
                               "status 7");
    } else {
        ASSERT_EXIT(r, 7);
        ASSERT_CONTAINS(r.err, "also failed before the others were stopped: rank 3 exited with "
                               "status 5");
    }
    run_free(&r);
}

/* Rank 0 exits 1 first, then rank 3 is killed by a signal: a death often
 * makes others exit (and the kernel may let those be reaped first), the
 * reverse is rare, so the signal death is named. */
TEST(tdistrun_signal_death_wins_over_exits_reaped_with_it, 60)
{
    setenv("T_RANK0", "exit 1", 1);
    setenv("T_RANK3", "kill -KILL $$", 1);
    run_t r;
    deaths_while_stopped(0, 3, &r);
    ASSERT_EXIT(r, 128 + SIGKILL);
    ASSERT_CONTAINS(r.err, "FAILED: rank 3 (local rank 3, pid ");
    ASSERT_CONTAINS(r.err, "failed first: it was killed by signal 9 (SIGKILL)");
    run_free(&r);
}

/* ------------------------------------------------------------- orphans */

/* kill -9 of the launcher: the workers and what they started in the
 * background go too, without root, and the guard does not linger. */
TEST(tdistrun_sigkill_to_launcher_kills_what_workers_started, 30)
{
    trun_set_dir_env();
    /* Orphans would be re-parented to us: reap them to tell dead from alive. */
    ASSERT_EQ(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
    const char *argv[] = {TDISTRUN, "--nproc-per-node", "2", "/bin/sh", "-c",
                          "sleep 97 & echo $! > $T_DIR/bg.$RANK; sleep 98 & echo $! > "
                          "$T_DIR/fg.$RANK; echo $$ > $T_DIR/pid.$RANK; wait",
                          NULL};
    double start = tdist_test_now_ms();
    pid_t pid = spawn(argv, "orphans");
    trun_wait_files("pid", 2, 10000 * tdist_test_timeout_mult());
    pid_t pids[6];
    trun_read_pid_files("pid", 2, pids);
    trun_read_pid_files("bg", 2, pids + 2);
    trun_read_pid_files("fg", 2, pids + 4);
    for (int k = 0; k < 6; k++) ASSERT_FALSE(trun_pid_gone(pids[k]));
    ASSERT_EQ(kill(pid, SIGKILL), 0);
    run_t r;
    wait_for(pid, 5000, "orphans", start, &r);
    ASSERT_EQ(r.sig, SIGKILL);
    trun_assert_all_gone(pids, 6, 3000 * tdist_test_timeout_mult());
    /* the guard exits too, and, orphaned, is reaped by us: no child left */
    double end = tdist_test_now_ms() + 3000 * tdist_test_timeout_mult();
    for (;;) {
        pid_t w = waitpid(-1, NULL, WNOHANG);
        if (w < 0 && errno == ECHILD) break;
        if (tdist_test_now_ms() > end) FAIL("a child of the launcher is still running");
        if (w == 0) usleep(10000);
    }
    run_free(&r);
}

/* ------------------------------------------------- a reader that stalls */

/* Start argv with stdout to a pipe the test never reads (returned in
 * *rd) and stderr to <tag>.err; <tag>.out stays empty (for wait_for). */
static pid_t spawn_stalled(const char *const argv[], const char *tag, int *rd)
{
    int p[2];
    ASSERT_EQ(pipe2(p, O_CLOEXEC), 0);
    char err[512], out[512];
    snprintf(err, sizeof err, "%s/%s.err", tdist_test_tmpdir(), tag);
    snprintf(out, sizeof out, "%s/%s.out", tdist_test_tmpdir(), tag);
    FILE *f = fopen(out, "w");
    ASSERT_TRUE(f != NULL);
    fclose(f);
    pid_t pid = fork();
    ASSERT_TRUE(pid >= 0);
    if (pid == 0) {
        int fe = open(err, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fe < 0 || dup2(p[1], STDOUT_FILENO) < 0 || dup2(fe, STDERR_FILENO) < 0) _exit(120);
        execv(argv[0], (char *const *)argv);
        _exit(121);
    }
    close(p[1]);
    *rd = p[0];
    return pid;
}

/* Wait (bounded) until the unread pipe holds at least 60000 bytes: the
 * launcher's stdout is then full and stays full. */
static void wait_pipe_full(int rd)
{
    double end = tdist_test_now_ms() + 10000 * tdist_test_timeout_mult();
    for (;;) {
        int n = 0;
        ASSERT_EQ(ioctl(rd, FIONREAD, &n), 0);
        if (n >= 60000) return;
        if (tdist_test_now_ms() > end) FAIL("the launcher's stdout holds only %d bytes", n);
        usleep(10000);
    }
}

/* Wait (bounded) until <tag>.err contains needle; returns the ms waited. */
static double wait_err_text(const char *tag, const char *needle, double timeout_ms)
{
    char name[64];
    snprintf(name, sizeof name, "%s.err", tag);
    double start = tdist_test_now_ms();
    for (;;) {
        char *s = slurp(tmp_path(name));
        bool found = strstr(s, needle) != NULL;
        if (found || tdist_test_now_ms() - start > timeout_ms) {
            if (!found) FAIL("no \"%s\" in the launcher's stderr after %.0f ms:\n%s", needle,
                             timeout_ms, s);
            free(s);
            return tdist_test_now_ms() - start;
        }
        free(s);
        usleep(5000);
    }
}

/* Wait (bounded) until every pid is gone or a zombie, without reaping
 * anything: the launcher itself must stay ours to wait for. */
static void wait_gone(const pid_t *pids, int n, double timeout_ms)
{
    double end = tdist_test_now_ms() + timeout_ms;
    for (int r = 0; r < n; r++)
        while (!trun_pid_gone(pids[r])) {
            if (tdist_test_now_ms() > end)
                FAIL("rank %d (pid %d) still running after %.0f ms", r, (int)pids[r], timeout_ms);
            usleep(2000);
        }
}

/* Workers flood the launcher's stdout, which nobody reads. A worker
 * failure is still acted on within a second, and so is a SIGTERM. */
TEST(tdistrun_stalled_stdout_still_handles_a_failure, 30)
{
    trun_set_dir_env();
    const char *argv[] = {TDISTRUN, "--nproc-per-node", "2", "--grace-period", "5", "/bin/sh",
                          "-c",
                          "echo $$ > $T_DIR/pid.$RANK;"
                          "if [ $RANK = 1 ]; then trap 'exit 3' USR1; sleep 120 & wait; exit 0; fi;"
                          "exec yes flooding-the-launcher",
                          NULL};
    double start = tdist_test_now_ms();
    int rd;
    pid_t pid = spawn_stalled(argv, "stallfail", &rd);
    trun_wait_files("pid", 2, 10000 * tdist_test_timeout_mult());
    pid_t pids[2];
    trun_read_pids(2, pids);
    wait_pipe_full(rd);
    /* and the launcher's own queue fills up behind it (however slow the
     * launcher runs: a sanitizer, a loaded machine) */
    wait_err_text("stallfail", "stdout is not being read fast enough",
                  10000 * tdist_test_timeout_mult());
    ASSERT_EQ(kill(pids[1], SIGUSR1), 0); /* the failure: rank 1 exits 3 */
    double t0 = tdist_test_now_ms();
    wait_gone(pids, 1, 1000); /* rank 0 stopped within a second */
    printf("rank 0 stopped %.0f ms after rank 1 failed\n", tdist_test_now_ms() - t0);
    wait_err_text("stallfail", "FAILED: rank 1 (local rank 1", 1000);
    /* Only stdout is left to write, and nobody reads it: a SIGTERM ends
     * the wait, and the job's status stays the failure's. */
    ASSERT_EQ(kill(pid, SIGTERM), 0);
    run_t r;
    wait_for(pid, 1000 + (tdist_test_now_ms() - start), "stallfail", start, &r);
    close(rd);
    ASSERT_EXIT(r, 3);
    ASSERT_CONTAINS(r.err, "stdout is not being read fast enough: dropping output");
    ASSERT_CONTAINS(r.err, "bytes of output to stdout were dropped");
    run_free(&r);
}

TEST(tdistrun_stalled_stdout_still_handles_sigterm, 30)
{
    trun_set_dir_env();
    const char *argv[] = {TDISTRUN, "--nproc-per-node", "2", "--grace-period", "5", "/bin/sh",
                          "-c", "echo $$ > $T_DIR/pid.$RANK; exec yes flooding-the-launcher",
                          NULL};
    double start = tdist_test_now_ms();
    int rd;
    pid_t pid = spawn_stalled(argv, "stallterm", &rd);
    trun_wait_files("pid", 2, 10000 * tdist_test_timeout_mult());
    pid_t pids[2];
    trun_read_pids(2, pids);
    wait_pipe_full(rd);
    usleep(300 * 1000);
    ASSERT_EQ(kill(pid, SIGTERM), 0);
    double t0 = tdist_test_now_ms();
    wait_gone(pids, 2, 1000);
    printf("workers stopped %.0f ms after the SIGTERM\n", tdist_test_now_ms() - t0);
    run_t r;
    wait_for(pid, 1000 + (t0 - start), "stallterm", start, &r);
    printf("the launcher exited %.0f ms after the SIGTERM\n", r.ms - (t0 - start));
    close(rd);
    ASSERT_EXIT(r, 128 + SIGTERM);
    ASSERT_CONTAINS(r.err, "got SIGTERM; forwarding it to 2 workers");
    run_free(&r);
}

/* ------------------------------------------------------ output not lost */

/* Every worker gets TDIST_LINE_BUFFERED=1, unless the user set it. */
TEST(tdistrun_sets_tdist_line_buffered, 30)
{
    const char *argv[] = {TDISTRUN, "--nproc-per-node", "2", "/bin/sh", "-c",
                          "echo \"lb=$TDIST_LINE_BUFFERED\"", NULL};
    run_t r;
    unsetenv("TDIST_LINE_BUFFERED");
    run(argv, 20, "lb", &r);
    ASSERT_EXIT(r, 0);
    ASSERT_CONTAINS(r.out, "[rank 0] lb=1\n");
    ASSERT_CONTAINS(r.out, "[rank 1] lb=1\n");
    run_free(&r);
    setenv("TDIST_LINE_BUFFERED", "0", 1);
    run(argv, 20, "lb0", &r);
    unsetenv("TDIST_LINE_BUFFERED");
    ASSERT_EXIT(r, 0);
    ASSERT_CONTAINS(r.out, "[rank 1] lb=0\n");
    run_free(&r);
}

/* A program linked with libtdist that never calls tdist_init prints three
 * lines into its stdout pipe and aborts: the library made stdout
 * line-buffered when it was loaded (TDIST_LINE_BUFFERED=1, set by the
 * launcher), so the lines were written before the crash. */
TEST(tdistrun_crashing_worker_keeps_its_last_lines, 30)
{
    /* one worker: a second one could be stopped before it printed */
    const char *argv[] = {TDISTRUN,    "--nproc-per-node", "1",     "--grace-period", "1",
                          TEST_WORKER, "lines-then-crash", "abort", NULL};
    run_t r;
    unsetenv("TDIST_LINE_BUFFERED");
    run(argv, 20, "crash", &r);
    ASSERT_EXIT(r, 128 + SIGABRT);
    for (int k = 1; k <= 3; k++) {
        char want[96];
        snprintf(want, sizeof want, "[rank 0] line %d of 3 before the crash\n", k);
        if (!strstr(r.out, want)) FAIL("no \"%s\" in stdout:\n%s\n%s", want, r.out, r.err);
    }
    run_free(&r);
}

/* Bytes of c in the lines of text that start with prefix. */
static size_t count_in_lines(const char *text, const char *prefix, char c)
{
    size_t n = 0, plen = strlen(prefix);
    for (const char *line = text; line && *line;) {
        const char *end = strchr(line, '\n');
        size_t len = end ? (size_t)(end - line) : strlen(line);
        if (len >= plen && memcmp(line, prefix, plen) == 0)
            for (size_t i = plen; i < len; i++) n += line[i] == c;
        line = end ? end + 1 : NULL;
    }
    return n;
}

/* A worker's last output is read as soon as it has died, though a
 * background child keeps the pipe open: its lines come before the
 * launcher's message about its death, and its partial last line is
 * printed too. */
TEST(tdistrun_dead_workers_pipe_is_drained_first, 30)
{
    const char *argv[] = {TDISTRUN, "--nproc-per-node", "2", "--grace-period", "1", "/bin/sh",
                          "-c",
                          "if [ $RANK = 1 ]; then head -c 100000 /dev/zero | tr '\\0' y >&2;"
                          " echo >&2; echo 'last full line' >&2; printf 'partial' >&2;"
                          " sleep 60 & kill -USR2 $$; fi;"
                          "exec sleep 120",
                          NULL};
    run_t r;
    run(argv, 20, "drain", &r);
    ASSERT_EXIT(r, 128 + SIGUSR2);
    ASSERT_EQ(count_in_lines(r.err, "[rank 1] ", 'y'), 100000);
    const char *last = strstr(r.err, "[rank 1] last full line\n");
    const char *death = strstr(r.err, "tdistrun: rank 1 was killed by signal");
    if (!last || !death || last > death)
        FAIL("rank 1's last line is missing or after the launcher's message:\n%s", r.err);
    ASSERT_CONTAINS(r.err, "[rank 1] partial\n");
    run_free(&r);
}
