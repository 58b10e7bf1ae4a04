/* tests/tools/test_tdistrun_helpers.c — helpers of the launcher's tests
 * (see test_tdistrun_helpers.h); no tests of its own. */
#include "test_tdistrun_helpers.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

int trun_count_of(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = strstr(hay, needle); p; p = strstr(p + 1, needle)) n++;
    return n;
}

void trun_read_pids(int n, pid_t *pids) { trun_read_pid_files("pid", n, pids); }

void trun_read_pid_files(const char *stem, int n, pid_t *pids)
{
    for (int r = 0; r < n; r++) {
        char name[64];
        snprintf(name, sizeof name, "%s.%d", stem, r);
        char *s = slurp(tmp_path(name));
        pids[r] = (pid_t)atoi(s);
        free(s);
        ASSERT_TRUE(pids[r] > 1);
    }
}

void trun_wait_files(const char *stem, int n, double timeout_ms)
{
    double end = tdist_test_now_ms() + timeout_ms;
    for (;;) {
        int have = 0;
        for (int r = 0; r < n; r++) {
            char name[64];
            snprintf(name, sizeof name, "%s.%d", stem, r);
            FILE *f = fopen(tmp_path(name), "r");
            if (f) {
                int c = fgetc(f); /* written, not just created */
                fclose(f);
                if (c != EOF) have++;
            }
        }
        if (have == n) return;
        if (tdist_test_now_ms() > end) FAIL("only %d of %d workers wrote %s.<rank>", have, n, stem);
        usleep(10000);
    }
}

bool trun_pid_gone(pid_t pid)
{
    if (kill(pid, 0) != 0 && errno == ESRCH) return true;
    char path[64], buf[256];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return true;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *close_paren = strrchr(buf, ')');
    return close_paren && close_paren[1] == ' ' && close_paren[2] == 'Z';
}

void trun_assert_all_gone(const pid_t *pids, int n, double timeout_ms)
{
    double end = tdist_test_now_ms() + timeout_ms;
    for (;;) {
        for (int k = 0; k < 1000 && waitpid(-1, NULL, WNOHANG) > 0; k++) {
        }
        int alive = -1;
        for (int r = 0; r < n && alive < 0; r++)
            if (!trun_pid_gone(pids[r])) alive = r;
        if (alive < 0) return;
        if (tdist_test_now_ms() > end)
            FAIL("process %d of %d (pid %d) still alive %.0f ms later", alive, n,
                 (int)pids[alive], timeout_ms);
        usleep(10000);
    }
}

void trun_set_dir_env(void) { setenv("T_DIR", tdist_test_tmpdir(), 1); }

void trun_touch(const char *name)
{
    FILE *f = fopen(tmp_path(name), "w");
    if (!f) FAIL("cannot create %s", tmp_path(name));
    fclose(f);
}
