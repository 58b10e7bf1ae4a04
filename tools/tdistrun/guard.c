/* tools/tdistrun/guard.c — nothing outlives the launcher.
 *
 * PR_SET_PDEATHSIG takes a worker down with the launcher, but not what the
 * worker started (a shell's background job, a data loader): those would be
 * re-parented to init and keep running after a `kill -9` of the launcher.
 * So the launcher forks a guard first thing: a small process in a process
 * group of its own (a signal to the launcher's group does not reach it),
 * with every inherited descriptor closed but the read end of a pipe whose
 * write end only the launcher holds (close-on-exec: no worker inherits it).
 *
 * The launcher sends each worker's process group through the pipe when it
 * starts the worker, and "forget" once the set is over and the group has
 * been killed. When the pipe reaches end of file, the launcher is gone
 * (exited, or killed by anything): the guard SIGKILLs every group it still
 * knows and exits. No root needed: they are the same user's processes.
 *
 * A process that leaves its worker's group (setsid, setpgid) escapes this;
 * that takes a cgroup, which needs privileges the launcher does not ask for.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/internal.h"
#include "tdistrun.h"

#define GUARD_REAP_MS 1000 /* how long the launcher waits for the guard to exit */

typedef struct guard_msg {
    int32_t op; /* 1: watch, 0: forget */
    int32_t pgid;
} guard_msg_t;

static int guard_fd = -1;  /* write end, in the launcher */
static pid_t guard_pid;

/* Close every descriptor but keep (moved to 3 first); 0, 1, 2 -> /dev/null. */
static void close_all_but(int keep)
{
    if (keep != 3) {
        dup2(keep, 3);
        close(keep);
    }
    int devnull = open("/dev/null", O_RDWR);
    for (int fd = 0; fd < 3 && devnull >= 0; fd++)
        if (devnull != fd) dup2(devnull, fd);
    if (devnull > 3) close(devnull);
    if (syscall(SYS_close_range, 4u, ~0u, 0u) != 0)
        for (int fd = 4; fd < 65536; fd++) close(fd);
}

/* The guard itself: collect groups until end of file, then kill them. */
static _Noreturn void guard_main(int rfd)
{
    setpgid(0, 0);
    prctl(PR_SET_NAME, "tdistrun-guard");
    signal(SIGINT, SIG_IGN);  /* only end of file ends the guard */
    signal(SIGTERM, SIG_IGN);
    signal(SIGHUP, SIG_IGN);
    signal(SIGCHLD, SIG_DFL);
    close_all_but(rfd);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);

    size_t n = 0, cap = 64;
    pid_t *groups = malloc(cap * sizeof *groups);
    for (;;) {
        guard_msg_t m;
        ssize_t r;
        TDIST_SYSCALL(r, read(3, &m, sizeof m));
        if (r != (ssize_t)sizeof m) break; /* end of file: the launcher is gone */
        if (m.op == 1 && groups) {
            if (n == cap) {
                pid_t *more = realloc(groups, 2 * cap * sizeof *groups);
                if (!more) continue;
                groups = more;
                cap *= 2;
            }
            groups[n++] = m.pgid;
        } else {
            for (size_t i = 0; i < n; i++)
                if (groups[i] == m.pgid) groups[i] = groups[--n];
        }
    }
    for (size_t i = 0; i < n; i++) kill(-groups[i], SIGKILL);
    _exit(0); /* no atexit handlers or leak checks of the launcher's copy */
}

int tdr_guard_start(void)
{
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) {
        tdr_eprintf("tdistrun: warning: no guard process (pipe: %s): what workers start may "
                    "outlive a killed launcher\n", strerror(errno));
        return -1;
    }
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        close(p[1]);
        guard_main(p[0]);
    }
    close(p[0]);
    if (pid < 0) {
        tdr_eprintf("tdistrun: warning: no guard process (fork: %s): what workers start may "
                    "outlive a killed launcher\n", strerror(errno));
        close(p[1]);
        return -1;
    }
    setpgid(pid, pid); /* also done by the guard; whichever runs first wins */
    /* A guard that stopped reading must not stall the launcher: a full pipe
     * drops the message (8 bytes: written whole or not at all). */
    fcntl(p[1], F_SETFL, fcntl(p[1], F_GETFL) | O_NONBLOCK);
    guard_fd = p[1];
    guard_pid = pid;
    return 0;
}

static void send_msg(int op, pid_t pgid)
{
    if (guard_fd < 0) return;
    guard_msg_t m = {.op = op, .pgid = (int32_t)pgid};
    ssize_t w;
    TDIST_SYSCALL(w, write(guard_fd, &m, sizeof m)); /* 8 bytes: atomic */
    (void)w;
}

void tdr_guard_watch(pid_t pgid) { send_msg(1, pgid); }

void tdr_guard_forget(pid_t pgid) { send_msg(0, pgid); }

pid_t tdr_guard_pid(void) { return guard_pid; }

void tdr_guard_lost(void)
{
    if (guard_fd >= 0) close(guard_fd);
    guard_fd = -1;
    guard_pid = 0;
    tdr_eprintf("tdistrun: warning: the guard process died: what workers start may outlive a "
                "killed launcher\n");
}

void tdr_guard_stop(void)
{
    if (guard_fd >= 0) close(guard_fd);
    guard_fd = -1;
    if (guard_pid <= 0) return;
    int64_t until = tdist__now_ms() + GUARD_REAP_MS;
    for (int guard = 0; guard < 10000; guard++) {
        pid_t r = waitpid(guard_pid, NULL, WNOHANG);
        if (r == guard_pid || (r < 0 && errno == ECHILD) || tdist__now_ms() >= until) break;
        tdist__sleep_ms(1);
    }
    guard_pid = 0;
}
