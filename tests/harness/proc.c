/* tests/harness/proc.c — run a program from a test and capture its output (see proc.h). */
#include "proc.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) FAIL("cannot open %s: %s", path, strerror(errno));
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    if (!buf) FAIL("out of memory");
    for (;;) {
        if (len + 4096 + 1 > cap) {
            cap *= 2;
            buf = realloc(buf, cap);
            if (!buf) FAIL("out of memory");
        }
        size_t n = fread(buf + len, 1, 4096, f);
        len += n;
        if (n == 0) break;
    }
    buf[len] = '\0';
    fclose(f);
    return buf;
}

long find_line(const char *text, long from, const char *a, const char *b)
{
    for (const char *p = text + from; (p = strstr(p, a)) != NULL; p++) {
        const char *ls = p, *le = strchr(p, '\n');
        while (ls > text && ls[-1] != '\n') ls--;
        if (!le) le = p + strlen(p);
        const char *q = strstr(ls, b);
        if (q && q < le) return (long)(ls - text);
    }
    return -1;
}

char *tmp_path(const char *name)
{
    static char paths[16][512];
    static int next;
    char *p = paths[next++ % 16];
    snprintf(p, 512, "%s/%s", tdist_test_tmpdir(), name);
    return p;
}

/* Start argv with stdout/stderr going to <tag>.out / <tag>.err. */
pid_t spawn(const char *const argv[], const char *tag)
{
    char out[512], err[512];
    snprintf(out, sizeof out, "%s/%s.out", tdist_test_tmpdir(), tag);
    snprintf(err, sizeof err, "%s/%s.err", tdist_test_tmpdir(), tag);
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) FAIL("fork: %s", strerror(errno));
    if (pid == 0) {
        int fo = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        int fe = open(err, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fo < 0 || fe < 0) _exit(120);
        dup2(fo, STDOUT_FILENO);
        dup2(fe, STDERR_FILENO);
        close(fo);
        close(fe);
        execv(argv[0], (char *const *)argv);
        _exit(121);
    }
    return pid;
}

/* Wait for pid at most timeout_ms; on timeout kill it (SIGKILL) and fail. */
void wait_for(pid_t pid, double timeout_ms, const char *tag, double start, run_t *r)
{
    int status = 0;
    double end = start + timeout_ms;
    for (;;) {
        pid_t w = waitpid(pid, &status, WNOHANG);
        if (w == pid) break;
        if (w < 0 && errno != EINTR) FAIL("waitpid: %s", strerror(errno));
        if (tdist_test_now_ms() > end) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            FAIL("%s: still running after %.0f ms", tag, timeout_ms);
        }
        usleep(2000);
    }
    r->ms = tdist_test_now_ms() - start;
    r->exited = WIFEXITED(status);
    r->code = r->exited ? WEXITSTATUS(status) : -1;
    r->sig = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    if (r->exited && r->code == 121) FAIL("%s: could not execute the program", tag);
    char path[512];
    snprintf(path, sizeof path, "%s/%s.out", tdist_test_tmpdir(), tag);
    r->out = slurp(path);
    snprintf(path, sizeof path, "%s/%s.err", tdist_test_tmpdir(), tag);
    r->err = slurp(path);
}

void run(const char *const argv[], double timeout_s, const char *tag, run_t *r)
{
    double start = tdist_test_now_ms();
    pid_t pid = spawn(argv, tag);
    wait_for(pid, timeout_s * 1000.0 * tdist_test_timeout_mult(), tag, start, r);
}

void run_free(run_t *r)
{
    free(r->out);
    free(r->err);
    r->out = r->err = NULL;
}
