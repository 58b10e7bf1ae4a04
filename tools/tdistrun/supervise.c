/* tools/tdistrun/supervise.c — starting, watching and stopping one worker set.
 *
 * Each worker is forked into a process group of its own (pgid = its pid),
 * so a signal sent by the stop sequence reaches everything the worker
 * started too, and a Ctrl-C on the terminal reaches only the launcher,
 * which forwards it once. Each worker asks the kernel for SIGKILL when the
 * launcher dies (PR_SET_PDEATHSIG) and checks getppid() right after, to
 * close the race with a launcher that died before the prctl.
 *
 * The launcher is single-threaded apart from the store server's thread:
 * one poll() loop watches the workers' pipes and a self-pipe written by
 * the signal handlers (SIGCHLD, SIGINT, SIGTERM, SIGHUP).
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/internal.h"
#include "tdistrun.h"

extern char **environ;

/* Time the launcher keeps reading pipes after every worker has been reaped
 * (their leftover process groups are killed first). */
#define DRAIN_MS 1000

/* How often a launcher of a multi-node job looks at the store for news of
 * the other nodes. */
#define COORD_POLL_MS 250

/* ---------------------------------------------------------------- signals */

static int sig_pipe[2] = {-1, -1};
static volatile sig_atomic_t stop_sig;

static const int forwarded[] = {SIGINT, SIGTERM, SIGHUP};

static void on_signal(int sig)
{
    int saved = errno;
    if (sig != SIGCHLD && stop_sig == 0) stop_sig = sig;
    unsigned char b = (unsigned char)sig;
    ssize_t r = write(sig_pipe[1], &b, 1); /* full pipe: a wake-up is pending anyway */
    (void)r;
    errno = saved;
}

int tdr_signals_install(void)
{
    if (pipe2(sig_pipe, O_CLOEXEC | O_NONBLOCK) != 0) return -1;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    for (size_t i = 0; i < TDIST_ARRAY_SIZE(forwarded); i++)
        if (sigaction(forwarded[i], &sa, NULL) != 0) return -1;
    sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
    if (sigaction(SIGCHLD, &sa, NULL) != 0) return -1;
    signal(SIGPIPE, SIG_IGN);
    return 0;
}

int tdr_stop_signal(void) { return (int)stop_sig; }

const char *tdr_signal_name(int sig, char *buf, size_t n)
{
    static const struct {
        int sig;
        const char *name;
    } names[] = {
        {SIGHUP, "SIGHUP"},   {SIGINT, "SIGINT"},     {SIGQUIT, "SIGQUIT"}, {SIGILL, "SIGILL"},
        {SIGTRAP, "SIGTRAP"}, {SIGABRT, "SIGABRT"},   {SIGBUS, "SIGBUS"},   {SIGFPE, "SIGFPE"},
        {SIGKILL, "SIGKILL"}, {SIGUSR1, "SIGUSR1"},   {SIGSEGV, "SIGSEGV"}, {SIGUSR2, "SIGUSR2"},
        {SIGPIPE, "SIGPIPE"}, {SIGALRM, "SIGALRM"},   {SIGTERM, "SIGTERM"}, {SIGCHLD, "SIGCHLD"},
        {SIGCONT, "SIGCONT"}, {SIGSTOP, "SIGSTOP"},   {SIGTSTP, "SIGTSTP"}, {SIGTTIN, "SIGTTIN"},
        {SIGTTOU, "SIGTTOU"}, {SIGURG, "SIGURG"},     {SIGXCPU, "SIGXCPU"}, {SIGXFSZ, "SIGXFSZ"},
        {SIGVTALRM, "SIGVTALRM"}, {SIGPROF, "SIGPROF"}, {SIGWINCH, "SIGWINCH"}, {SIGIO, "SIGIO"},
        {SIGPWR, "SIGPWR"},   {SIGSYS, "SIGSYS"},
    };
    for (size_t i = 0; i < TDIST_ARRAY_SIZE(names); i++)
        if (names[i].sig == sig) return names[i].name;
    snprintf(buf, n, "signal %d", sig);
    return buf;
}

const char *tdr_describe(bool exited, int code, int sig, char *buf, size_t n)
{
    char nb[32];
    if (exited)
        snprintf(buf, n, "exited with status %d", code);
    else
        snprintf(buf, n, "was killed by signal %d (%s)", sig, tdr_signal_name(sig, nb, sizeof nb));
    return buf;
}

/* ---------------------------------------------------------------- workers */

typedef struct worker {
    pid_t pid;               /* also its process group id; 0 if never started */
    int local_rank, rank;
    bool running;
    bool exited;             /* how it ended (valid once !running and pid != 0) */
    int code, sig;
    tdr_stream_t out, err;
    int tee_out, tee_err;
} worker_t;

/* The variables the launcher sets; any inherited value of these is dropped. */
static const char *const managed_vars[] = {
    "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
    "GROUP_RANK", "NODE_RANK", "GROUP_WORLD_SIZE", "TDIST_RESTART_COUNT", "TDIST_MAX_RESTARTS",
    "TDIST_LAUNCHER_STORE", "TDIST_STORE_LISTEN_FD",
};

static bool is_managed(const char *entry)
{
    for (size_t i = 0; i < TDIST_ARRAY_SIZE(managed_vars); i++) {
        size_t n = strlen(managed_vars[i]);
        if (strncmp(entry, managed_vars[i], n) == 0 && entry[n] == '=') return true;
    }
    return false;
}

/* A NULL-terminated environment for worker w: the launcher's own, minus
 * the managed variables, plus their values for w. Every string and the
 * array are malloc'd (free_env). NULL when out of memory. */
static char **make_env(const tdr_launch_t *l, const worker_t *w)
{
    const tdr_opts_t *o = l->opts;
    size_t n_env = 0;
    while (environ && environ[n_env]) n_env++;
    size_t cap = n_env + TDIST_ARRAY_SIZE(managed_vars) + 1;
    char **env = calloc(cap, sizeof *env);
    if (!env) return NULL;
    size_t k = 0;
    bool ok = true;
    for (size_t i = 0; i < n_env && ok; i++) {
        if (is_managed(environ[i])) continue;
        ok = (env[k++] = tdist__strdup(environ[i])) != NULL;
    }
    int world = o->nnodes * o->nproc_per_node;
#define ADD(...) \
    do { \
        if (ok) ok = (env[k++] = tdist__asprintf(__VA_ARGS__)) != NULL; \
    } while (0)
    ADD("MASTER_ADDR=%s", l->master_addr);
    ADD("MASTER_PORT=%d", l->master_port);
    ADD("RANK=%d", w->rank);
    ADD("WORLD_SIZE=%d", world);
    ADD("LOCAL_RANK=%d", w->local_rank);
    ADD("LOCAL_WORLD_SIZE=%d", o->nproc_per_node);
    ADD("GROUP_RANK=%d", o->node_rank);
    ADD("NODE_RANK=%d", o->node_rank);
    ADD("GROUP_WORLD_SIZE=%d", o->nnodes);
    ADD("TDIST_RESTART_COUNT=%d", l->attempt);
    ADD("TDIST_MAX_RESTARTS=%d", o->max_restarts);
    if (l->launcher_store) ADD("TDIST_LAUNCHER_STORE=%d", 1);
#undef ADD
    if (!ok) {
        for (size_t i = 0; i < k; i++) free(env[i]);
        free(env);
        return NULL;
    }
    return env;
}

static void free_env(char **env)
{
    if (!env) return;
    for (size_t i = 0; env[i]; i++) free(env[i]);
    free(env);
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
    for (size_t i = 0; i < TDIST_ARRAY_SIZE(forwarded); i++) sigaction(forwarded[i], &dfl, NULL);
    sigaction(SIGCHLD, &dfl, NULL);
    sigaction(SIGPIPE, &dfl, NULL);
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

static int open_tee(const tdr_launch_t *l, int rank, const char *which)
{
    char *path = tdist__asprintf("%s/attempt_%d/rank_%d.%s", l->opts->tee_dir, l->attempt, rank,
                                 which);
    if (!path) return -1;
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) fprintf(stderr, "tdistrun: cannot open %s: %s\n", path, strerror(errno));
    free(path);
    return fd;
}

static int make_tee_dirs(const tdr_launch_t *l)
{
    if (mkdir(l->opts->tee_dir, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "tdistrun: cannot create %s: %s\n", l->opts->tee_dir, strerror(errno));
        return -1;
    }
    char *dir = tdist__asprintf("%s/attempt_%d", l->opts->tee_dir, l->attempt);
    if (!dir) return -1;
    int rc = 0;
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "tdistrun: cannot create %s: %s\n", dir, strerror(errno));
        rc = -1;
    }
    free(dir);
    return rc;
}

/* Fork and exec worker w. Returns 0, or -1 after printing why. */
static int start_worker(const tdr_launch_t *l, worker_t *w)
{
    const tdr_opts_t *o = l->opts;
    int out[2] = {-1, -1}, err[2] = {-1, -1};
    char **env = NULL;
    if (o->tee_dir) {
        w->tee_out = open_tee(l, w->rank, "stdout");
        w->tee_err = open_tee(l, w->rank, "stderr");
        if (w->tee_out < 0 || w->tee_err < 0) return -1;
    }
    if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) {
        fprintf(stderr, "tdistrun: pipe for rank %d: %s\n", w->rank, strerror(errno));
        goto fail;
    }
    env = make_env(l, w);
    if (!env) {
        fprintf(stderr, "tdistrun: out of memory building rank %d's environment\n", w->rank);
        goto fail;
    }
    if (tdr_stream_init(&w->out, out[0], STDOUT_FILENO, w->tee_out, w->rank, o->prefix, false) != 0 ||
        tdr_stream_init(&w->err, err[0], STDERR_FILENO, w->tee_err, w->rank, o->prefix, true) != 0) {
        fprintf(stderr, "tdistrun: out of memory for rank %d's output buffers\n", w->rank);
        w->out.fd = w->err.fd = -1; /* the pipes are closed below */
        goto fail;
    }

    sigset_t all, old;
    sigfillset(&all);
    sigprocmask(SIG_BLOCK, &all, &old);
    int cpu = -1;
    if (o->bind_core) {
        cpu_set_t allowed;
        if (sched_getaffinity(0, sizeof allowed, &allowed) == 0 && CPU_COUNT(&allowed) > 0) {
            int want = w->local_rank % CPU_COUNT(&allowed);
            for (int c = 0; c < CPU_SETSIZE && cpu < 0; c++)
                if (CPU_ISSET(c, &allowed) && want-- == 0) cpu = c;
        }
    }
    pid_t launcher = getpid();
    pid_t pid = fork();
    if (pid == 0) exec_worker(l, launcher, &old, out[1], err[1], env, cpu);
    int fork_errno = errno;
    sigprocmask(SIG_SETMASK, &old, NULL);
    if (pid < 0) {
        fprintf(stderr, "tdistrun: fork for rank %d: %s\n", w->rank, strerror(fork_errno));
        w->out.fd = w->err.fd = -1;
        goto fail;
    }
    setpgid(pid, pid); /* also done by the child; whichever runs first wins */
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

/* Send sig to every running worker's process group. Returns how many. */
static int signal_running(worker_t *ws, int n, int sig)
{
    int count = 0;
    for (int i = 0; i < n; i++) {
        if (!ws[i].running) continue;
        if (kill(-ws[i].pid, sig) != 0) kill(ws[i].pid, sig);
        count++;
    }
    return count;
}

/* ----------------------------------------------------------------- the set */

typedef struct set_state {
    const tdr_launch_t *l;
    worker_t *ws;
    int n;
    int running;
    int first_failed;        /* index into ws, -1 if none */
    bool stopping;
    int64_t kill_at;         /* INT64_MAX: no SIGKILL scheduled */
    bool killed;
} set_state_t;

static void begin_stop(set_state_t *st, int sig)
{
    if (st->stopping) return;
    st->stopping = true;
    signal_running(st->ws, st->n, sig);
    st->kill_at = tdist__now_ms() + st->l->opts->grace_ms;
}

static void reap(set_state_t *st, tdr_set_result_t *res)
{
    const tdr_opts_t *o = st->l->opts;
    for (int guard = 0; guard < st->n + 16; guard++) {
        int status;
        pid_t pid;
        TDIST_SYSCALL(pid, waitpid(-1, &status, WNOHANG));
        if (pid <= 0) return;
        worker_t *w = NULL;
        for (int i = 0; i < st->n; i++)
            if (st->ws[i].running && st->ws[i].pid == pid) w = &st->ws[i];
        if (!w) continue;
        w->running = false;
        st->running--;
        w->exited = WIFEXITED(status);
        w->code = w->exited ? WEXITSTATUS(status) : 0;
        w->sig = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
        bool ok = w->exited && w->code == 0;
        if (ok || st->stopping || st->first_failed >= 0) continue;
        /* The first failure: stop the others. */
        st->first_failed = (int)(w - st->ws);
        res->outcome = TDR_SET_FAILED;
        res->first_rank = w->rank;
        res->first_local_rank = w->local_rank;
        res->first_pid = w->pid;
        res->first_exited = w->exited;
        res->first_code = w->code;
        res->first_signal = w->sig;
        char desc[96];
        tdr_describe(w->exited, w->code, w->sig, desc, sizeof desc);
        if (st->l->coord) {
            char what[160];
            snprintf(what, sizeof what, "rank %d %s", w->rank, desc);
            tdr_coord_report_failure(st->l->coord, st->l->attempt, what);
        }
        if (st->running > 0)
            fprintf(stderr,
                    "tdistrun: rank %d %s; stopping the other %d worker%s (SIGTERM, SIGKILL "
                    "after %.1f s)\n",
                    w->rank, desc, st->running, st->running == 1 ? "" : "s",
                    (double)o->grace_ms / 1000.0);
        begin_stop(st, SIGTERM);
    }
}

static void handle_signals(set_state_t *st, tdr_set_result_t *res)
{
    unsigned char buf[64];
    for (int guard = 0; guard < 64; guard++) {
        ssize_t r = read(sig_pipe[0], buf, sizeof buf);
        if (r <= 0) break;
        for (ssize_t i = 0; i < r; i++) {
            int sig = buf[i];
            if (sig == SIGCHLD) continue; /* reaped below */
            char nb[32];
            const char *name = tdr_signal_name(sig, nb, sizeof nb);
            if (res->outcome != TDR_SET_INTERRUPTED) {
                res->outcome = TDR_SET_INTERRUPTED;
                res->stop_signal = tdr_stop_signal() ? tdr_stop_signal() : sig;
                fprintf(stderr, "tdistrun: got %s; forwarding it to %d worker%s (SIGKILL after %.1f s)\n",
                        name, st->running, st->running == 1 ? "" : "s",
                        (double)st->l->opts->grace_ms / 1000.0);
                if (st->l->coord) {
                    char why[64];
                    snprintf(why, sizeof why, "its launcher got %s", name);
                    tdr_coord_abort(st->l->coord, why);
                }
                if (st->stopping) { /* already stopping after a failure: pass it on */
                    signal_running(st->ws, st->n, sig);
                } else {
                    begin_stop(st, sig);
                }
            } else if (!st->killed) {
                fprintf(stderr, "tdistrun: got %s again; sending SIGKILL to %d worker%s\n", name,
                        st->running, st->running == 1 ? "" : "s");
                signal_running(st->ws, st->n, SIGKILL);
                st->killed = true;
            }
        }
    }
    reap(st, res);
}

static void print_report(const set_state_t *st, const tdr_set_result_t *res)
{
    const worker_t *w = &st->ws[st->first_failed];
    char desc[96];
    tdr_describe(w->exited, w->code, w->sig, desc, sizeof desc);
    fprintf(stderr, "tdistrun: FAILED: rank %d (local rank %d, pid %d) failed first: it %s\n",
            w->rank, w->local_rank, (int)w->pid, desc);
    if (st->l->attempt > 0) fprintf(stderr, "tdistrun: (restart attempt %d)\n", st->l->attempt);
    if (w->err.tail_count > 0) {
        fprintf(stderr, "tdistrun: last %d line%s of rank %d's stderr:\n", w->err.tail_count,
                w->err.tail_count == 1 ? "" : "s", w->rank);
        tdr_stream_print_tail(&w->err, stderr);
    } else {
        fprintf(stderr, "tdistrun: rank %d wrote nothing to stderr\n", w->rank);
    }
    (void)res;
}

void tdr_run_set(const tdr_launch_t *l, tdr_set_result_t *res)
{
    const tdr_opts_t *o = l->opts;
    int n = o->nproc_per_node;
    memset(res, 0, sizeof *res);
    res->outcome = TDR_SET_SUCCEEDED;
    res->first_rank = -1;

    if (tdr_stop_signal()) {
        res->outcome = TDR_SET_INTERRUPTED;
        res->stop_signal = tdr_stop_signal();
        return;
    }
    if (o->tee_dir && make_tee_dirs(l) != 0) {
        res->outcome = TDR_SET_ERROR;
        return;
    }

    set_state_t st = {.l = l, .n = n, .first_failed = -1, .kill_at = INT64_MAX};
    st.ws = calloc((size_t)n, sizeof *st.ws);
    struct pollfd *pfds = calloc((size_t)(2 * n + 1), sizeof *pfds);
    tdr_stream_t **pstreams = calloc((size_t)(2 * n + 1), sizeof *pstreams);
    if (!st.ws || !pfds || !pstreams) {
        fprintf(stderr, "tdistrun: out of memory for %d workers\n", n);
        free(st.ws);
        free(pfds);
        free(pstreams);
        res->outcome = TDR_SET_ERROR;
        return;
    }
    for (int i = 0; i < n; i++) {
        worker_t *w = &st.ws[i];
        w->local_rank = i;
        w->rank = o->node_rank * n + i;
        w->tee_out = w->tee_err = -1;
        w->out.fd = w->err.fd = -1;
    }

    fflush(stdout);
    fflush(stderr);
    for (int i = 0; i < n; i++) {
        if (start_worker(l, &st.ws[i]) != 0) {
            res->outcome = TDR_SET_ERROR;
            begin_stop(&st, SIGTERM);
            break;
        }
        st.running++;
    }

    int64_t drain_until = INT64_MAX;
    int64_t next_coord_poll = 0;
    for (;;) {
        handle_signals(&st, res);
        int64_t now = tdist__now_ms();
        if (l->coord && !st.stopping && now >= next_coord_poll) {
            tdr_coord_event_t ev = tdr_coord_poll(l->coord, l->attempt, res->remote_msg,
                                                  sizeof res->remote_msg);
            if (ev != TDR_COORD_NONE) {
                res->outcome = TDR_SET_REMOTE;
                res->remote_event = ev;
                fprintf(stderr, "tdistrun: stopping this node's %d worker%s: %s%s\n", st.running,
                        st.running == 1 ? "" : "s", ev == TDR_COORD_LOST ? "" : "another node failed: ",
                        res->remote_msg);
                begin_stop(&st, SIGTERM);
            }
            now = tdist__now_ms();
            next_coord_poll = now + COORD_POLL_MS;
        }
        if (st.stopping && !st.killed && now >= st.kill_at && st.running > 0) {
            fprintf(stderr, "tdistrun: %d worker%s still running after the grace period; "
                                "sending SIGKILL\n",
                        st.running, st.running == 1 ? "" : "s");
            signal_running(st.ws, n, SIGKILL);
            st.killed = true;
        }
        if (st.running == 0 && drain_until == INT64_MAX) {
            /* Whatever the workers left behind in their groups goes too. */
            for (int i = 0; i < n; i++)
                if (st.ws[i].pid > 0) kill(-st.ws[i].pid, SIGKILL);
            drain_until = now + DRAIN_MS;
        }

        int np = 0;
        pfds[np].fd = sig_pipe[0];
        pfds[np].events = POLLIN;
        pstreams[np++] = NULL;
        for (int i = 0; i < n; i++) {
            tdr_stream_t *ss[2] = {&st.ws[i].out, &st.ws[i].err};
            for (int k = 0; k < 2; k++) {
                if (ss[k]->fd < 0) continue;
                pfds[np].fd = ss[k]->fd;
                pfds[np].events = POLLIN;
                pstreams[np++] = ss[k];
            }
        }
        if (st.running == 0 && (np == 1 || now >= drain_until)) break;

        int64_t wake = drain_until;
        if (st.stopping && !st.killed && st.kill_at < wake) wake = st.kill_at;
        int timeout = 1000;
        if (l->coord && !st.stopping && next_coord_poll < wake) wake = next_coord_poll;
        if (wake != INT64_MAX) timeout = (int)TDIST_MIN((int64_t)1000, TDIST_MAX(wake - now, 0));
        int r = poll(pfds, (nfds_t)np, timeout);
        if (r < 0 && errno != EINTR) {
            fprintf(stderr, "tdistrun: poll: %s\n", strerror(errno));
            tdist__sleep_ms(10);
            continue;
        }
        for (int i = 1; r > 0 && i < np; i++)
            if (pfds[i].revents) tdr_stream_pump(pstreams[i]);
    }

    if (st.first_failed >= 0) print_report(&st, res);
    for (int i = 0; i < n; i++) {
        worker_t *w = &st.ws[i];
        tdr_stream_close(&w->out);
        tdr_stream_close(&w->err);
        tdr_stream_fini(&w->out);
        tdr_stream_fini(&w->err);
        if (w->tee_out >= 0) close(w->tee_out);
        if (w->tee_err >= 0) close(w->tee_err);
    }
    free(st.ws);
    free(pfds);
    free(pstreams);
}
