/*
 * tools/tdistrun/flight.c — the launcher's side of the flight recorder
 * (docs/debugging.md):
 *  - every worker gets TDIST_FR_DIR (unless the user set it): under
 *    --log-dir, DIR/attempt_<A>/fr; else ${TMPDIR:-/tmp}/tdistrun-fr.<pid>.<A>,
 *    removed again when the set succeeds;
 *  - SIGUSR1 to the launcher is passed to every worker that catches it
 *    (supervise.c, tdr_fr_signal_workers): each dumps its rings as JSON
 *    there and goes on; a worker that does not catch it yet (no group
 *    made, or not a tdist program) is left alone instead of killed;
 *  - when a set failed, the report runs tdist-fr on that directory and
 *    prints its first divergence: which rank the others were waiting for.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <dirent.h>

#include "tdistrun.h"

#define FR_TOOL_MS 10000   /* the analyzer's time limit */
#define FR_REPORT_LINES 30 /* lines of its output in the report */

static char fr_dir[PATH_MAX];
static bool fr_set_by_us;   /* we named it (the workers get TDIST_FR_DIR) */
static bool fr_temporary;   /* and it is not under --log-dir: removed on success */

const char *tdr_fr_worker_dir(void) { return fr_set_by_us ? fr_dir : NULL; }

/* Whether process pid catches signal sig (its SigCgt mask in
 * /proc/<pid>/status); false when it cannot be read (gone). */
static bool catches(pid_t pid, int sig)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "re");
    if (!f) return false;
    bool yes = false;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "SigCgt:", 7) != 0) continue;
        unsigned long long mask = strtoull(line + 7, NULL, 16);
        yes = sig >= 1 && sig <= 64 && ((mask >> (sig - 1)) & 1u);
        break;
    }
    fclose(f);
    return yes;
}

/* The process group of process pid (-1: gone), from /proc/<pid>/stat
 * (the fifth field; the command name in parentheses may hold spaces). */
static pid_t group_of(pid_t pid)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return -1;
    buf[n] = '\0';
    const char *p = strrchr(buf, ')');
    int ppid = 0, pgrp = 0;
    char state = 0;
    if (!p || sscanf(p + 1, " %c %d %d", &state, &ppid, &pgrp) != 3) return -1;
    return (pid_t)pgrp;
}

int tdr_fr_signal_workers(const tdr_worker_t *ws, int n, int *left, bool *alone)
{
    bool *got = calloc((size_t)(n > 0 ? n : 1), sizeof *got);
    DIR *d = opendir("/proc");
    int reached = 0, running = 0;
    if (got && d) {
        struct dirent *e;
        /* bounded: a /proc of more processes than this is not walked further */
        for (int k = 0; k < (1 << 22) && (e = readdir(d)) != NULL; k++) {
            char *end;
            long v = strtol(e->d_name, &end, 10);
            if (*end != '\0' || v <= 0) continue;
            pid_t pid = (pid_t)v, g = group_of(pid);
            for (int i = 0; g > 0 && i < n; i++) {
                if (!ws[i].running || ws[i].pid != g) continue;
                if (catches(pid, SIGUSR1) && kill(pid, SIGUSR1) == 0) got[i] = true;
                break;
            }
        }
    }
    if (d) closedir(d);
    for (int i = 0; i < n; i++) {
        if (alone) alone[i] = false;
        if (!ws[i].running) continue;
        running++;
        if (got && got[i])
            reached++;
        else if (alone)
            alone[i] = true;
    }
    free(got);
    *left = running - reached;
    return reached;
}

const char *tdr_fr_dir(void) { return fr_dir[0] ? fr_dir : NULL; }

void tdr_fr_prepare(const tdr_launch_t *l)
{
    const char *user = getenv("TDIST_FR_DIR");
    fr_set_by_us = fr_temporary = false;
    fr_dir[0] = '\0';
    if (user && user[0]) {
        snprintf(fr_dir, sizeof fr_dir, "%s", user);
        return;
    }
    const char *tmp = getenv("TMPDIR");
    if (l->opts->log_dir)
        snprintf(fr_dir, sizeof fr_dir, "%s/attempt_%d/fr", l->opts->log_dir, l->attempt);
    else
        snprintf(fr_dir, sizeof fr_dir, "%s/tdistrun-fr.%d.%d", tmp && tmp[0] ? tmp : "/tmp",
                 (int)getpid(), l->attempt);
    if (mkdir(fr_dir, 0700) != 0 && errno != EEXIST) {
        tdr_eprintf("tdistrun: cannot create %s for the flight recorder: %s\n", fr_dir,
                    strerror(errno));
        fr_dir[0] = '\0';
        return;
    }
    fr_set_by_us = true;
    fr_temporary = !l->opts->log_dir;
}

void tdr_fr_cleanup(bool records_too)
{
    if (!fr_temporary || !fr_dir[0]) return;
    DIR *d = records_too ? opendir(fr_dir) : NULL;
    if (d) {
        struct dirent *de;
        while ((de = readdir(d)))
            if (strncmp(de->d_name, "tdist-fr.", 9) == 0) {
                char p[PATH_MAX + 300];
                snprintf(p, sizeof p, "%s/%s", fr_dir, de->d_name);
                unlink(p);
            }
        closedir(d);
    }
    (void)rmdir(fr_dir);
}

/* The analyzer: next to this program (installed), in the build tree, or
 * on PATH. In the child: exec it, or exit 127. */
static _Noreturn void exec_tool(int out_fd)
{
    dup2(out_fd, 1);
    dup2(out_fd, 2);
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    char *const argv[] = {"tdist-fr", fr_dir, NULL};
    if (n > 0) {
        self[n] = '\0';
        char *slash = strrchr(self, '/');
        if (slash) {
            *slash = '\0';
            char p[PATH_MAX + 32];
            snprintf(p, sizeof p, "%s/tdist-fr", self);
            execv(p, argv);
            snprintf(p, sizeof p, "%s/../tdist-fr/tdist-fr", self);
            execv(p, argv);
        }
    }
    execvp("tdist-fr", argv);
    _exit(127);
}

/* Run the analyzer on the directory; its output (up to cap bytes) in buf.
 * Returns its exit status, -1 when it did not run or took too long. */
static int run_tool(char *buf, size_t cap)
{
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) return -1;
    pid_t pid = fork();
    if (pid == 0) exec_tool(p[1]);
    close(p[1]);
    if (pid < 0) {
        close(p[0]);
        return -1;
    }
    size_t n = 0;
    int64_t end = tdist__now_ms() + FR_TOOL_MS;
    for (int64_t now = tdist__now_ms(); now < end; now = tdist__now_ms()) {
        struct pollfd pf = {.fd = p[0], .events = POLLIN};
        if (poll(&pf, 1, (int)(end - now)) <= 0) continue;
        char tmp[4096];
        ssize_t r = read(p[0], tmp, sizeof tmp);
        if (r <= 0) break;
        size_t k = TDIST_MIN((size_t)r, cap - 1 - n);
        memcpy(buf + n, tmp, k);
        n += k;
    }
    buf[n] = '\0';
    close(p[0]);
    int status = 0;
    pid_t got = 0; /* its output ended; its exit follows */
    while ((got = waitpid(pid, &status, WNOHANG)) == 0 && tdist__now_ms() < end)
        tdist__sleep_ms(5);
    if (got != pid) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        return -1;
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

void tdr_fr_report(void)
{
    if (!fr_dir[0]) return;
    char *out = malloc(1 << 16);
    if (!out) return;
    int rc = run_tool(out, 1 << 16);
    if (rc == 1) { /* a problem found: its first part, up to the per-rank summary */
        tdr_eprintf("tdistrun: flight recorder (tdist-fr):\n");
        char *line = out;
        for (int i = 0; line && *line && i < FR_REPORT_LINES; i++) {
            char *nl = strchr(line, '\n');
            if (nl) *nl = '\0';
            if (!line[0]) break; /* the blank line before the summary */
            tdr_eprintf("tdistrun:   %s\n", line);
            line = nl ? nl + 1 : NULL;
        }
    } else if (rc == 0) {
        tdr_eprintf("tdistrun: flight recorder: every rank completed the same collectives\n");
    } else { /* no records (the workers made no group), or no analyzer */
        free(out);
        tdr_fr_cleanup(true);
        return;
    }
    tdr_eprintf("tdistrun: flight records of every rank: %s (tdist-fr %s)\n", fr_dir, fr_dir);
    free(out);
}
