/* tools/tdistrun/worker.c — starting one worker: its environment, its
 * pipes and log files, fork and exec.
 *
 * Each worker is forked into a process group of its own (pgid = its pid),
 * so a signal sent by the stop sequence reaches everything the worker
 * started too, and a Ctrl-C on the terminal reaches only the launcher,
 * which forwards it once. Each worker asks the kernel for SIGKILL when the
 * launcher dies (PR_SET_PDEATHSIG) and checks getppid() right after, to
 * close the race with a launcher that died before the prctl; the guard
 * (guard.c) learns the group and kills what the worker started as well.
 */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/internal.h"
#include "tdistrun.h"

extern char **environ;

/* The variables the launcher sets; any inherited value of these is dropped. */
static const char *const managed_vars[] = {
    "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
    "GROUP_RANK", "NODE_RANK", "GROUP_WORLD_SIZE", "TDIST_RESTART_COUNT", "TDIST_MAX_RESTARTS",
    "TDIST_LAUNCHER_STORE", "TDIST_STORE_LISTEN_FD",
};

/* Set in every worker unless the user set it (to anything): libtdist then
 * makes stdout line-buffered when it is loaded, so a worker that crashes
 * does not take its last lines with it. */
#define LINE_BUFFERED_VAR "TDIST_LINE_BUFFERED"

static bool has_name(const char *entry, const char *name)
{
    size_t n = strlen(name);
    return strncmp(entry, name, n) == 0 && entry[n] == '=';
}

static bool is_managed(const char *entry)
{
    for (size_t i = 0; i < TDIST_ARRAY_SIZE(managed_vars); i++)
        if (has_name(entry, managed_vars[i])) return true;
    return false;
}

static void free_env(char **env)
{
    if (!env) return;
    for (size_t i = 0; env[i]; i++) free(env[i]);
    free(env);
}

/* A NULL-terminated environment for worker w: the launcher's own, minus
 * the managed variables, plus their values for w (with plain_env: the
 * launcher's own as is), plus TDIST_LINE_BUFFERED=1 unless set. Every
 * string and the array are malloc'd (free_env). NULL when out of memory. */
static char **make_env(const tdr_launch_t *l, const tdr_worker_t *w)
{
    const tdr_opts_t *o = l->opts;
    size_t n_env = 0;
    bool line_buffered_set = false;
    for (; environ && environ[n_env]; n_env++)
        if (has_name(environ[n_env], LINE_BUFFERED_VAR)) line_buffered_set = true;
    size_t cap = n_env + TDIST_ARRAY_SIZE(managed_vars) + 3;
    char **env = calloc(cap, sizeof *env);
    if (!env) return NULL;
    size_t k = 0;
    bool ok = true;
    for (size_t i = 0; i < n_env && ok; i++) {
        if (!l->plain_env && is_managed(environ[i])) continue;
        ok = (env[k++] = tdist__strdup(environ[i])) != NULL;
    }
#define ADD(...) \
    do { \
        if (ok) ok = (env[k++] = tdist__asprintf(__VA_ARGS__)) != NULL; \
    } while (0)
    if (!line_buffered_set) ADD("%s=1", LINE_BUFFERED_VAR);
    if (!l->plain_env) {
        ADD("MASTER_ADDR=%s", l->master_addr);
        ADD("MASTER_PORT=%d", l->master_port);
        ADD("RANK=%d", w->rank);
        ADD("WORLD_SIZE=%d", o->nnodes * o->nproc_per_node);
        ADD("LOCAL_RANK=%d", w->local_rank);
        ADD("LOCAL_WORLD_SIZE=%d", o->nproc_per_node);
        ADD("GROUP_RANK=%d", o->node_rank);
        ADD("NODE_RANK=%d", o->node_rank);
        ADD("GROUP_WORLD_SIZE=%d", o->nnodes);
        ADD("TDIST_RESTART_COUNT=%d", l->attempt);
        ADD("TDIST_MAX_RESTARTS=%d", o->max_restarts);
        if (l->launcher_store) ADD("TDIST_LAUNCHER_STORE=%d", 1);
        if (tdr_fr_worker_dir()) ADD("TDIST_FR_DIR=%s", tdr_fr_worker_dir());
    }
#undef ADD
    if (!ok) {
        free_env(env);
        return NULL;
    }
    return env;
}

/* In the child, between fork and exec: only async-signal-safe calls. */
static _Noreturn void exec_worker(const tdr_launch_t *l, pid_t launcher, const sigset_t *mask,
                                  int out_w, int err_w, char **env, int cpu)
{
    if (cpu >= 0) { /* --bind-to core; a failure leaves placement to the kernel */
        cpu_set_t one;
        CPU_ZERO(&one);
        CPU_SET(cpu, &one);
        (void)sched_setaffinity(0, sizeof one, &one);
    }
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    static const int reset[] = {SIGINT, SIGTERM, SIGHUP, SIGCHLD, SIGPIPE};
    for (size_t i = 0; i < TDIST_ARRAY_SIZE(reset); i++) sigaction(reset[i], &dfl, NULL);
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != launcher) _exit(TDR_EXIT_SETUP); /* the launcher is already gone */
    sigprocmask(SIG_SETMASK, mask, NULL);

    int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0 && devnull != STDIN_FILENO) {
        dup2(devnull, STDIN_FILENO);
        close(devnull);
    }
    dup2(out_w, STDOUT_FILENO);
    dup2(err_w, STDERR_FILENO);
    if (out_w > STDERR_FILENO) close(out_w);
    if (err_w > STDERR_FILENO) close(err_w);

    execve(l->prog_path, l->opts->prog_argv, env);
    int e = errno;
    const char *parts[] = {"tdistrun: cannot execute ", l->prog_path, ": ", strerror(e), "\n"};
    for (size_t i = 0; i < TDIST_ARRAY_SIZE(parts); i++) {
        ssize_t r = write(STDERR_FILENO, parts[i], strlen(parts[i]));
        (void)r;
    }
    _exit(TDR_EXIT_NOT_FOUND);
}

/* mkdir -p path (mode 0755). Returns 0, or -1 with errno set. */
static int make_dirs(const char *path)
{
    char *p = tdist__strdup(path);
    if (!p) return -1;
    int rc = 0;
    for (char *s = p + 1; rc == 0; s++) {
        bool end = *s == '\0';
        if (*s != '/' && !end) continue;
        *s = '\0';
        struct stat sb;
        if (mkdir(p, 0755) != 0 && !(errno == EEXIST && stat(p, &sb) == 0 && S_ISDIR(sb.st_mode))) {
            if (errno == EEXIST) errno = ENOTDIR;
            rc = -1;
        }
        if (end) break;
        *s = '/';
    }
    free(p);
    return rc;
}

int tdr_make_attempt_dir(const char *dir, int attempt)
{
    char *sub = tdist__asprintf("%s/attempt_%d", dir, attempt);
    if (!sub) return -1;
    int rc = make_dirs(sub);
    if (rc != 0) tdr_eprintf("tdistrun: cannot create %s: %s\n", sub, strerror(errno));
    free(sub);
    return rc;
}

/* DIR/attempt_<A>/rank_<R>.<suffix>, truncated. -1 after printing why. */
static int open_log(const char *dir, int attempt, int rank, const char *suffix)
{
    char *path = tdist__asprintf("%s/attempt_%d/rank_%d.%s", dir, attempt, rank, suffix);
    if (!path) return -1;
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) tdr_eprintf("tdistrun: cannot open %s: %s\n", path, strerror(errno));
    free(path);
    return fd;
}

static int open_files(const tdr_launch_t *l, tdr_worker_t *w)
{
    const tdr_opts_t *o = l->opts;
    if (o->tee_dir) {
        w->tee_out = open_log(o->tee_dir, l->attempt, w->rank, "stdout");
        w->tee_err = open_log(o->tee_dir, l->attempt, w->rank, "stderr");
        if (w->tee_out < 0 || w->tee_err < 0) return -1;
    }
    if (o->log_dir) {
        w->log_fd = open_log(o->log_dir, l->attempt, w->rank, "log");
        if (w->log_fd < 0) return -1;
    }
    return 0;
}

static int init_streams(const tdr_launch_t *l, tdr_worker_t *w, int out_r, int err_r)
{
    const tdr_opts_t *o = l->opts;
    bool shown = w->local_rank < 0 || w->local_rank >= TDR_MAX_PROCS || tdr_shown(o, w->local_rank);
    tdr_stream_dest_t d = {.console = shown ? tdr_out : NULL, .log_fd = w->log_fd,
                           .tee_fd = w->tee_out, .rank = w->rank, .prefix = o->prefix,
                           .timestamps = o->timestamps, .keep_tail = false};
    if (tdr_stream_init(&w->out, out_r, &d) != 0) return -1;
    d.console = shown ? tdr_err : NULL;
    d.tee_fd = w->tee_err;
    d.keep_tail = true;
    return tdr_stream_init(&w->err, err_r, &d);
}

/* --bind-to core: the (local rank mod count)-th CPU we may run on; -1: none. */
static int pick_cpu(const tdr_opts_t *o, int local_rank)
{
    cpu_set_t allowed;
    if (!o->bind_core || sched_getaffinity(0, sizeof allowed, &allowed) != 0 ||
        CPU_COUNT(&allowed) == 0)
        return -1;
    int want = local_rank % CPU_COUNT(&allowed);
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &allowed) && want-- == 0) return c;
    return -1;
}

int tdr_worker_start(const tdr_launch_t *l, tdr_worker_t *w)
{
    int out[2] = {-1, -1}, err[2] = {-1, -1};
    char **env = NULL;
    if (open_files(l, w) != 0) return -1;
    if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) {
        tdr_eprintf("tdistrun: pipe for rank %d: %s\n", w->rank, strerror(errno));
        goto fail;
    }
    env = make_env(l, w);
    if (!env || init_streams(l, w, out[0], err[0]) != 0) {
        tdr_eprintf("tdistrun: out of memory setting up rank %d\n", w->rank);
        w->out.fd = w->err.fd = -1; /* the pipes are closed below */
        goto fail;
    }
    sigset_t all, old;
    sigfillset(&all);
    sigprocmask(SIG_BLOCK, &all, &old);
    int cpu = pick_cpu(l->opts, w->local_rank);
    pid_t launcher = getpid();
    pid_t pid = fork();
    if (pid == 0) exec_worker(l, launcher, &old, out[1], err[1], env, cpu);
    int fork_errno = errno;
    sigprocmask(SIG_SETMASK, &old, NULL);
    if (pid < 0) {
        tdr_eprintf("tdistrun: fork for rank %d: %s\n", w->rank, strerror(fork_errno));
        w->out.fd = w->err.fd = -1;
        goto fail;
    }
    setpgid(pid, pid); /* also done by the child; whichever runs first wins */
    tdr_guard_watch(pid);
    w->pid = pid;
    w->running = true;
    close(out[1]);
    close(err[1]);
    fcntl(out[0], F_SETFL, fcntl(out[0], F_GETFL) | O_NONBLOCK);
    fcntl(err[0], F_SETFL, fcntl(err[0], F_GETFL) | O_NONBLOCK);
    free_env(env);
    return 0;

fail:
    for (int i = 0; i < 2; i++) {
        if (out[i] >= 0) close(out[i]);
        if (err[i] >= 0) close(err[i]);
    }
    free_env(env);
    return -1;
}

void tdr_worker_close(tdr_worker_t *w)
{
    tdr_stream_drain(&w->out);
    tdr_stream_drain(&w->err);
    tdr_stream_close(&w->out);
    tdr_stream_close(&w->err);
    int *fds[] = {&w->tee_out, &w->tee_err, &w->log_fd};
    for (size_t i = 0; i < TDIST_ARRAY_SIZE(fds); i++) {
        if (*fds[i] >= 0) close(*fds[i]);
        *fds[i] = -1;
    }
}

/* Characters a shell reads back as themselves. */
static bool plain_word(const char *s)
{
    if (!*s) return false;
    for (; *s; s++)
        if (!strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_@%+=:,./-", *s))
            return false;
    return true;
}

char *tdr_command_text(const char *prog, char *const *argv)
{
    size_t cap = 1;
    for (size_t i = 0; argv[i]; i++) cap += 4 * strlen(i ? argv[i] : prog) + 3;
    char *out = malloc(cap), *p = out;
    if (!out) return NULL;
    for (size_t i = 0; argv[i]; i++) {
        const char *a = i ? argv[i] : prog;
        if (i) *p++ = ' ';
        if (plain_word(a)) {
            p = stpcpy(p, a);
            continue;
        }
        *p++ = '\'';
        for (; *a; a++) p = *a == '\'' ? stpcpy(p, "'\\''") : (*p = *a, p + 1);
        *p++ = '\'';
    }
    *p = '\0';
    return out;
}

void tdr_worker_fini(tdr_worker_t *w)
{
    tdr_stream_fini(&w->out);
    tdr_stream_fini(&w->err);
}
