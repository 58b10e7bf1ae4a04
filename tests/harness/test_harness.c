/* tests/harness/test_harness.c — the harness checks itself: a hung test is
 * killed at its deadline with its whole process group, a failed rank is
 * named with how it ended, a leak fails the test wherever it is (the test's
 * own process, a rank, an exit other than the harness's), and tbuf's
 * blocks report overruns and uses after free. The hidden tests are run
 * through the runner binary (/proc/self/exe) as a user would run them. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "tbuf.h"

/* Hangs (bounded: 120 s) after starting a child that also hangs. */
TEST_HIDDEN(selftest_hang, 1)
{
    char path[512];
    snprintf(path, sizeof path, "%s/hang.pid", getenv("TDIST_SELFTEST_DIR"));
    pid_t child = fork();
    if (child == 0) {
        for (int i = 0; i < 120; i++) sleep(1);
        _exit(0);
    }
    FILE *f = fopen(path, "w");
    ASSERT_TRUE(f != NULL);
    fprintf(f, "%d\n", (int)child);
    fclose(f);
    for (int i = 0; i < 120; i++) sleep(1);
}

static void rank1_exits_7(int rank, int n, void *arg)
{
    (void)n;
    (void)arg;
    if (rank == 1) exit(7);
    for (int i = 0; i < 600; i++) usleep(100 * 1000); /* killed by the harness */
}

TEST_HIDDEN(selftest_rank_fails, 30) { tdist_test_run_ranks(3, rank1_exits_7, NULL); }

static void rank2_asserts(int rank, int n, void *arg)
{
    (void)n;
    (void)arg;
    ASSERT_EQ(rank == 2 ? 41 : 42, 42);
}

TEST_HIDDEN(selftest_rank_asserts, 30) { tdist_test_run_ranks(4, rank2_asserts, NULL); }

/* Run "tdist_tests name [name2]" with the given multiplier; capture its output. */
static int run_runner_two(const char *name, const char *name2, const char *mult, char *out,
                          size_t outn, double *took_ms)
{
    char path[512];
    snprintf(path, sizeof path, "%s/runner.out", tdist_test_tmpdir());
    double start = tdist_test_now_ms();
    pid_t pid = fork();
    ASSERT_TRUE(pid >= 0);
    if (pid == 0) {
        if (!freopen(path, "w", stdout) || dup2(STDOUT_FILENO, STDERR_FILENO) < 0) _exit(90);
        setenv("TDIST_TEST_TIMEOUT_MULT", mult, 1);
        setenv("TDIST_SELFTEST_DIR", tdist_test_tmpdir(), 1);
        execl("/proc/self/exe", "tdist_tests", name, name2, (char *)NULL);
        _exit(91);
    }
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    *took_ms = tdist_test_now_ms() - start;
    FILE *f = fopen(path, "r");
    ASSERT_TRUE(f != NULL);
    size_t n = fread(out, 1, outn - 1, f);
    out[n] = '\0';
    fclose(f);
    ASSERT_TRUE(WIFEXITED(status));
    return WEXITSTATUS(status);
}

static int run_runner(const char *name, const char *mult, char *out, size_t outn, double *took_ms)
{
    return run_runner_two(name, NULL, mult, out, outn, took_ms);
}

TEST(harness_kills_hung_test_at_deadline, 30)
{
    char out[8192];
    double took;
    int rc = run_runner("selftest_hang", "1", out, sizeof out, &took);
    ASSERT_EQ(rc, 1);
    ASSERT_CONTAINS(out, "FAIL selftest_hang: deadline of 1 s passed");
    ASSERT_CONTAINS(out, "0 passed, 1 failed");
    ASSERT_GE(took, 1000);
    ASSERT_LE(took, 10000);
    /* The hung test's own child went with its process group. */
    char path[512];
    snprintf(path, sizeof path, "%s/hang.pid", tdist_test_tmpdir());
    FILE *f = fopen(path, "r");
    ASSERT_TRUE(f != NULL);
    int child = 0;
    ASSERT_EQ(fscanf(f, "%d", &child), 1);
    fclose(f);
    ASSERT_TRUE(child > 1);
    bool gone = false;
    for (int i = 0; i < 500 && !gone; i++) { /* up to 5 s */
        gone = kill(child, 0) != 0;
        if (!gone) usleep(10 * 1000);
    }
    ASSERT_TRUE(gone);
}

TEST(harness_names_the_rank_that_failed, 60)
{
    char out[8192];
    double took;
    int rc = run_runner("selftest_rank_fails", "1", out, sizeof out, &took);
    ASSERT_EQ(rc, 1);
    ASSERT_CONTAINS(out, "1 of 3 ranks failed; first: rank 1 exited with status 7");
    ASSERT_LE(took, 20000 * tdist_test_timeout_mult()); /* the others were killed, not waited for */

    rc = run_runner("selftest_rank_asserts", "1", out, sizeof out, &took);
    ASSERT_EQ(rc, 1);
    ASSERT_CONTAINS(out, "[rank 2] ");
    ASSERT_CONTAINS(out, "ASSERT_EQ(rank == 2 ? 41 : 42, 42) failed: 41 != 42");
    ASSERT_CONTAINS(out, "first: rank 2 exited with status 1");
}

TEST(harness_unknown_test_fails, 10)
{
    char out[4096];
    double took;
    ASSERT_EQ(run_runner("no_such_test_name", "1", out, sizeof out, &took), 1);
    ASSERT_CONTAINS(out, "no test named no_such_test_name");
}

TEST_HIDDEN(selftest_skips, 10) { SKIP("this machine has no %s", "frobnicator"); }

static void rank1_skips(int rank, int n, void *arg)
{
    (void)n;
    (void)arg;
    if (rank == 1) SKIP("rank %d has no frobnicator", rank);
    for (int i = 0; i < 600; i++) usleep(100 * 1000); /* killed by the harness */
}

TEST_HIDDEN(selftest_rank_skips, 30) { tdist_test_run_ranks(3, rank1_skips, NULL); }

/* A test that cannot run here ends with the skip code ctest knows
 * (SKIP_RETURN_CODE), never as a pass; a rank that skips skips the test. */
TEST(harness_skip_is_not_a_pass, 60)
{
    char out[8192];
    double took;
    ASSERT_EQ(run_runner("selftest_skips", "1", out, sizeof out, &took), TDIST_TEST_SKIP_CODE);
    ASSERT_CONTAINS(out, "SKIP selftest_skips: this machine has no frobnicator");
    ASSERT_CONTAINS(out, "0 passed, 0 failed, 1 skipped");

    ASSERT_EQ(run_runner("selftest_rank_skips", "1", out, sizeof out, &took), TDIST_TEST_SKIP_CODE);
    ASSERT_CONTAINS(out, "SKIP selftest_rank_skips: rank 1 has no frobnicator");
    ASSERT_CONTAINS(out, "0 passed, 0 failed, 1 skipped");

    /* A skip beside a failure is a failure. */
    ASSERT_EQ(run_runner_two("selftest_skips", "selftest_rank_fails", "1", out, sizeof out, &took), 1);
    ASSERT_CONTAINS(out, "0 passed, 1 failed, 1 skipped");
}

/* ------------------------------------------------ leaks and tbuf (ASan) */

/* Blocks nothing points to once the pointer is dropped: leaks. Sixteen,
 * each through the same slot: the checker scans conservatively, and a
 * stale copy of the last pointer (a register, a dead stack slot) may keep
 * that one reachable, never the fifteen before it. */
static void *volatile leak_keep;

static void leak_one(void)
{
    for (int i = 0; i < 16; i++) {
        leak_keep = malloc(48);
        ASSERT_TRUE(leak_keep != NULL);
    }
    leak_keep = NULL;
}

TEST_HIDDEN(selftest_leaks, 10) { leak_one(); }

static void rank1_leaks(int rank, int n, void *arg)
{
    (void)n;
    (void)arg;
    if (rank == 1) leak_one();
}

TEST_HIDDEN(selftest_rank_leaks, 30) { tdist_test_run_ranks(3, rank1_leaks, NULL); }

static void rank2_leaks_and_exits(int rank, int n, void *arg)
{
    (void)n;
    (void)arg;
    if (rank == 2) {
        leak_one();
        exit(0); /* its own exit, not the harness's: the check at exit */
    }
}

TEST_HIDDEN(selftest_rank_leaks_own_exit, 30) { tdist_test_run_ranks(3, rank2_leaks_and_exits, NULL); }

/* One byte past what tbuf_alloc gave; a read after tbuf_free. */
TEST_HIDDEN(selftest_tbuf_overrun, 10)
{
    volatile char *p = tbuf_alloc(100000);
    ASSERT_TRUE(p != NULL);
    p[100000] = 1;
    tbuf_free((void *)p);
}

TEST_HIDDEN(selftest_tbuf_use_after_free, 10)
{
    volatile char *p = tbuf_alloc(100000);
    ASSERT_TRUE(p != NULL);
    tbuf_free((void *)p);
    ASSERT_EQ(p[5], 0);
}

/* Under AddressSanitizer every process of a test ends through the leak
 * checker, however it ends, and the pool's poisoning reports. */
TEST(harness_leaks_and_overruns_fail_the_test, 60)
{
#ifndef TDIST_TEST_ASAN
    SKIP("no AddressSanitizer in this build");
#else
    static const struct {
        const char *test, *report, *then;
    } cases[] = {
        {"selftest_leaks", "LeakSanitizer: detected memory leaks", "0 passed, 1 failed"},
        {"selftest_rank_leaks", "LeakSanitizer: detected memory leaks",
         "1 of 3 ranks failed; first: rank 1 exited with status "},
        {"selftest_rank_leaks_own_exit", "LeakSanitizer: detected memory leaks",
         "first: rank 2 exited with status "},
        {"selftest_tbuf_overrun", "AddressSanitizer: use-after-poison", "WRITE of size 1"},
        {"selftest_tbuf_use_after_free", "AddressSanitizer: use-after-poison", "READ of size 1"},
    };
    char out[16384];
    double took;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ASSERT_EQ(run_runner(cases[i].test, "1", out, sizeof out, &took), 1);
        ASSERT_CONTAINS(out, cases[i].report);
        ASSERT_CONTAINS(out, cases[i].then);
    }
#endif
}
