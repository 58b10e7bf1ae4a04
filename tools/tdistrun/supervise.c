/* tools/tdistrun/supervise.c — watching and stopping one worker set.
 *
 * The launcher is single-threaded apart from the store server's thread:
 * one poll() loop watches the workers' pipes, the launcher's own stdout and
 * stderr when output waits for them (sink.c: never a blocking write), and a
 * self-pipe written by the signal handlers (SIGCHLD, SIGINT, SIGTERM,
 * SIGHUP). Nothing in the loop blocks, so a failure or a signal is acted on
 * at once whatever the readers of the launcher's output do.
 *
 * Which failure was first. When a worker dies, others often fail because
 * of it a moment later (they see its sockets close and exit 1), and several
 * dead workers may be reaped in one go, in the order they were started
 * rather than the order they died. Two things put them back in order:
 *   - the order of deaths: SIGCHLD is a standard signal, so while one is
 *     pending the next ones merge into it, and the pending one carries the
 *     pid of the child that died first (si_pid). The handler passes that
 *     pid down the self-pipe, and every death gets a sequence number: pids
 *     seen in SIGCHLD first, in that order, then the others as reaped;
 *   - a window: after the first failure is reaped, the launcher waits up to
 *     FIRST_FAILURE_WINDOW_MS for other failures before it stops the set
 *     (reaping, not signalling, so each death in the window is the
 *     worker's own). A worker killed by a signal (SIGKILL, SIGSEGV, ...) is
 *     then preferred over any that merely exited non-zero: a kernel can
 *     make a dead worker's sockets and pipes read as closed before the
 *     worker is reapable, so the exits it caused may be reaped first, while
 *     the reverse (an exit that makes another worker die of a signal) is
 *     rare: a worker that notices a peer's death reports it and exits. A
 *     signal death needs no window: the set is stopped at once.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/internal.h"
#include "tdistrun.h"

/* Time the launcher keeps reading pipes after every worker has been reaped
 * (their leftover process groups are killed first). */
#define DRAIN_MS 1000

/* How often a launcher of a multi-node job looks at the store for news of
 * the other nodes. */
#define COORD_POLL_MS 250

/* How long the launcher collects failures after the first one it reaped
 * exited non-zero, before choosing the first and stopping the others. */
#define FIRST_FAILURE_WINDOW_MS 200

/* ---------------------------------------------------------------- signals */

/* What a handler writes to the self-pipe (8 bytes: written whole). */
typedef struct sig_rec {
    int32_t sig;
    int32_t pid; /* SIGCHLD: the child whose death raised it */
} sig_rec_t;

static int sig_pipe[2] = {-1, -1};
static volatile sig_atomic_t stop_sig;

static const int forwarded[] = {SIGINT, SIGTERM, SIGHUP};

static void on_signal(int sig, siginfo_t *si, void *ctx)
{
    (void)ctx;
    int saved = errno;
    if (sig != SIGCHLD && sig != SIGUSR1 && stop_sig == 0) stop_sig = sig;
    sig_rec_t r = {.sig = sig, .pid = sig == SIGCHLD && si ? (int32_t)si->si_pid : 0};
    ssize_t w = write(sig_pipe[1], &r, sizeof r); /* full pipe: a wake-up is pending anyway */
    (void)w;
    errno = saved;
}

int tdr_signals_install(void)
{
    if (pipe2(sig_pipe, O_CLOEXEC | O_NONBLOCK) != 0) return -1;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART | SA_SIGINFO;
    for (size_t i = 0; i < TDIST_ARRAY_SIZE(forwarded); i++)
        if (sigaction(forwarded[i], &sa, NULL) != 0) return -1;
    if (sigaction(SIGUSR1, &sa, NULL) != 0) return -1; /* passed on: a flight-recorder dump */
    sa.sa_flags = SA_RESTART | SA_SIGINFO | SA_NOCLDSTOP;
    if (sigaction(SIGCHLD, &sa, NULL) != 0) return -1;
    signal(SIGPIPE, SIG_IGN);
    return 0;
}

int tdr_stop_signal(void) { return (int)stop_sig; }

int tdr_signal_fd(void) { return sig_pipe[0]; }

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

/* ----------------------------------------------------------------- the set */

typedef struct set_state {
    const tdr_launch_t *l;
    tdr_worker_t *ws;
    int n;
    int running;
    int first_failed;        /* index into ws, -1 if none (yet) */
    int64_t settle_at;       /* choose the first failure then; INT64_MAX: none pending */
    uint64_t deaths;         /* death sequence numbers handed out */
    bool stopping;
    int64_t kill_at;         /* INT64_MAX: no SIGKILL scheduled */
    bool killed;
} set_state_t;

/* Send sig to every running worker's process group. Returns how many. */
static int signal_running(tdr_worker_t *ws, int n, int sig)
{
    int count = 0;
    for (int i = 0; i < n; i++) {
        if (!ws[i].running) continue;
        if (kill(-ws[i].pid, sig) != 0) kill(ws[i].pid, sig);
        count++;
    }
    return count;
}

static tdr_worker_t *find_running(set_state_t *st, pid_t pid)
{
    for (int i = 0; i < st->n; i++)
        if (st->ws[i].running && st->ws[i].pid == pid) return &st->ws[i];
    return NULL;
}

/* The failure that came first among the candidates: a signal death before
 * any exit, then the earliest death. -1 if there is none. */
static int pick_first_failure(const set_state_t *st)
{
    int best = -1;
    for (int i = 0; i < st->n; i++) {
        const tdr_worker_t *w = &st->ws[i];
        if (!w->candidate) continue;
        if (best < 0) {
            best = i;
            continue;
        }
        const tdr_worker_t *b = &st->ws[best];
        if (w->exited != b->exited) {
            if (!w->exited) best = i;
        } else if (w->death_seq < b->death_seq) {
            best = i;
        }
    }
    return best;
}

/* Choose the first failure among those collected, record it in res, tell
 * the user and the other nodes. */
static void settle_first_failure(set_state_t *st, tdr_set_result_t *res)
{
    st->settle_at = INT64_MAX;
    int i = pick_first_failure(st);
    if (i < 0 || st->first_failed >= 0) return;
    const tdr_worker_t *w = &st->ws[i];
    st->first_failed = i;
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
        tdr_eprintf("tdistrun: rank %d %s; stopping the other %d worker%s (SIGTERM, SIGKILL "
                    "after %.1f s)\n",
                    w->rank, desc, st->running, st->running == 1 ? "" : "s",
                    (double)st->l->opts->grace_ms / 1000.0);
}

static void begin_stop(set_state_t *st, tdr_set_result_t *res, int sig)
{
    if (st->settle_at != INT64_MAX) settle_first_failure(st, res);
    if (st->stopping) return;
    st->stopping = true;
    signal_running(st->ws, st->n, sig);
    st->kill_at = tdist__now_ms() + st->l->opts->grace_ms;
}

/* A SIGCHLD named pid: if it is a worker, its death comes next in order. */
static void note_death(set_state_t *st, pid_t pid)
{
    tdr_worker_t *w = pid > 0 ? find_running(st, pid) : NULL;
    if (w && w->death_seq == 0) w->death_seq = ++st->deaths;
}

static void reap(set_state_t *st)
{
    for (int guard = 0; guard < st->n + 16; guard++) {
        int status;
        pid_t pid;
        TDIST_SYSCALL(pid, waitpid(-1, &status, WNOHANG));
        if (pid <= 0) return;
        if (pid == tdr_guard_pid()) tdr_guard_lost();
        tdr_worker_t *w = find_running(st, pid);
        if (!w) continue;
        w->running = false;
        st->running--;
        if (w->death_seq == 0) w->death_seq = ++st->deaths;
        w->exited = WIFEXITED(status);
        w->code = w->exited ? WEXITSTATUS(status) : 0;
        w->sig = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
        tdr_stream_drain(&w->out); /* what it wrote before dying, now */
        tdr_stream_drain(&w->err);
        bool ok = w->exited && w->code == 0;
        if (ok || st->stopping || st->first_failed >= 0) continue;
        w->candidate = true;
        int64_t at = tdist__now_ms() + (w->exited ? FIRST_FAILURE_WINDOW_MS : 0);
        if (at < st->settle_at) st->settle_at = at;
    }
}

static void on_stop_signal(set_state_t *st, tdr_set_result_t *res, int sig)
{
    char nb[32];
    const char *name = tdr_signal_name(sig, nb, sizeof nb);
    if (res->outcome == TDR_SET_INTERRUPTED) {
        if (st->killed) return;
        tdr_eprintf("tdistrun: got %s again; sending SIGKILL to %d worker%s\n", name, st->running,
                    st->running == 1 ? "" : "s");
        signal_running(st->ws, st->n, SIGKILL);
        st->killed = true;
        return;
    }
    if (st->settle_at != INT64_MAX) settle_first_failure(st, res);
    res->outcome = TDR_SET_INTERRUPTED;
    res->stop_signal = tdr_stop_signal() ? tdr_stop_signal() : sig;
    tdr_eprintf("tdistrun: got %s; forwarding it to %d worker%s (SIGKILL after %.1f s)\n", name,
                st->running, st->running == 1 ? "" : "s",
                (double)st->l->opts->grace_ms / 1000.0);
    if (st->l->coord) {
        char why[64];
        snprintf(why, sizeof why, "its launcher got %s", name);
        tdr_coord_abort(st->l->coord, why);
    }
    if (st->stopping) /* already stopping after a failure: pass it on */
        signal_running(st->ws, st->n, sig);
    else
        begin_stop(st, res, sig);
}

static void handle_signals(set_state_t *st, tdr_set_result_t *res)
{
    sig_rec_t recs[64];
    for (int guard = 0; guard < 64; guard++) {
        ssize_t r = read(sig_pipe[0], recs, sizeof recs);
        if (r <= 0) break;
        for (size_t i = 0; i < (size_t)r / sizeof recs[0]; i++) {
            if (recs[i].sig == SIGCHLD) {
                note_death(st, recs[i].pid); /* reaped below */
            } else if (recs[i].sig == SIGUSR1) {
                bool *alone = calloc((size_t)st->n, sizeof *alone);
                int left = 0, k = tdr_fr_signal_workers(st->ws, st->n, &left, alone);
                tdr_eprintf("tdistrun: got SIGUSR1; passed it to %d worker%s (flight-recorder "
                            "dumps in %s)\n", k, k == 1 ? "" : "s",
                            tdr_fr_dir() ? tdr_fr_dir() : "their TDIST_FR_DIR");
                if (left > 0)
                    tdr_eprintf("tdistrun: left %d worker%s alone: %s no SIGUSR1 handler yet "
                                "(no tdist group made yet, or not a tdist program), and the "
                                "signal would kill %s\n", left, left == 1 ? "" : "s",
                                left == 1 ? "it has" : "they have", left == 1 ? "it" : "them");
                if (left > 0 && alone) tdr_rdzv_report(st->l, st->ws, st->n, alone);
                free(alone);
            } else
                on_stop_signal(st, res, recs[i].sig);
        }
    }
    reap(st);
}

static void print_report(const set_state_t *st)
{
    const tdr_worker_t *w = &st->ws[st->first_failed];
    char desc[96];
    tdr_describe(w->exited, w->code, w->sig, desc, sizeof desc);
    tdr_eprintf("tdistrun: FAILED: rank %d (local rank %d, pid %d) failed first: it %s\n",
                w->rank, w->local_rank, (int)w->pid, desc);
    for (int i = 0; i < st->n; i++) {
        const tdr_worker_t *o = &st->ws[i];
        if (o->candidate && i != st->first_failed)
            tdr_eprintf("tdistrun: also failed before the others were stopped: rank %d %s\n",
                        o->rank, tdr_describe(o->exited, o->code, o->sig, desc, sizeof desc));
    }
    if (st->l->attempt > 0) tdr_eprintf("tdistrun: (restart attempt %d)\n", st->l->attempt);
    if (!st->l->plain_env) tdr_fr_report();
    if (w->err.tail_count > 0) {
        tdr_eprintf("tdistrun: last %d line%s of rank %d's stderr:\n", w->err.tail_count,
                    w->err.tail_count == 1 ? "" : "s", w->rank);
        tdr_stream_print_tail(&w->err);
    } else {
        tdr_eprintf("tdistrun: rank %d wrote nothing to stderr\n", w->rank);
    }
}

/* Timers: the failure window, SIGKILL after the grace period, the other
 * nodes' news, the end of the set. Returns when the loop should wake up
 * next (ms from now, at most 1000), or -1 when the set is over. */
static int check_timers(set_state_t *st, tdr_set_result_t *res, int64_t *drain_until,
                        int64_t *next_coord_poll)
{
    const tdr_launch_t *l = st->l;
    int64_t now = tdist__now_ms();
    if (st->settle_at != INT64_MAX && (now >= st->settle_at || st->running == 0))
        begin_stop(st, res, SIGTERM);
    if (l->coord && !st->stopping && now >= *next_coord_poll) {
        tdr_coord_event_t ev = tdr_coord_poll(l->coord, l->attempt, res->remote_msg,
                                              sizeof res->remote_msg);
        if (ev != TDR_COORD_NONE) {
            res->outcome = TDR_SET_REMOTE;
            res->remote_event = ev;
            tdr_eprintf("tdistrun: stopping this node's %d worker%s: %s%s\n", st->running,
                        st->running == 1 ? "" : "s",
                        ev == TDR_COORD_LOST ? "" : "another node failed: ", res->remote_msg);
            begin_stop(st, res, SIGTERM);
        }
        now = tdist__now_ms();
        *next_coord_poll = now + COORD_POLL_MS;
    }
    if (st->stopping && !st->killed && now >= st->kill_at && st->running > 0) {
        tdr_eprintf("tdistrun: %d worker%s still running after the grace period; sending "
                    "SIGKILL\n", st->running, st->running == 1 ? "" : "s");
        signal_running(st->ws, st->n, SIGKILL);
        st->killed = true;
    }
    if (st->running == 0 && *drain_until == INT64_MAX) {
        /* Whatever the workers left behind in their groups goes too. */
        for (int i = 0; i < st->n; i++) {
            if (st->ws[i].pid <= 0) continue;
            kill(-st->ws[i].pid, SIGKILL);
            tdr_guard_forget(st->ws[i].pid);
        }
        *drain_until = now + DRAIN_MS;
    }
    int64_t wake = *drain_until;
    if (st->settle_at < wake) wake = st->settle_at;
    if (st->stopping && !st->killed && st->kill_at < wake) wake = st->kill_at;
    if (l->coord && !st->stopping && *next_coord_poll < wake) wake = *next_coord_poll;
    return wake == INT64_MAX ? 1000 : (int)TDIST_MIN((int64_t)1000, TDIST_MAX(wake - now, 0));
}

/* Poll entries: the self-pipe, every open worker stream, the sinks. */
static int build_pollfds(set_state_t *st, struct pollfd *pfds, tdr_stream_t **pstreams,
                         int *nstreams)
{
    int np = 0;
    pfds[np] = (struct pollfd){.fd = sig_pipe[0], .events = POLLIN};
    pstreams[np++] = NULL;
    for (int i = 0; i < st->n; i++) {
        tdr_stream_t *ss[2] = {&st->ws[i].out, &st->ws[i].err};
        for (int k = 0; k < 2; k++) {
            if (ss[k]->fd < 0) continue;
            pfds[np] = (struct pollfd){.fd = ss[k]->fd, .events = POLLIN};
            pstreams[np++] = ss[k];
        }
    }
    *nstreams = np - 1;
    int ns = tdr_sinks_pollfds(&pfds[np]);
    for (int k = 0; k < ns; k++) pstreams[np + k] = NULL;
    return np + ns;
}

static void supervise(set_state_t *st, tdr_set_result_t *res, struct pollfd *pfds,
                      tdr_stream_t **pstreams)
{
    int64_t drain_until = INT64_MAX, next_coord_poll = 0;
    for (;;) {
        handle_signals(st, res);
        int timeout = check_timers(st, res, &drain_until, &next_coord_poll);
        int nstreams = 0;
        int np = build_pollfds(st, pfds, pstreams, &nstreams);
        if (st->running == 0 && (nstreams == 0 || tdist__now_ms() >= drain_until)) break;
        int r = poll(pfds, (nfds_t)np, timeout);
        if (r < 0 && errno != EINTR) {
            tdr_eprintf("tdistrun: poll: %s\n", strerror(errno));
            tdist__sleep_ms(10);
            continue;
        }
        for (int i = 1; r > 0 && i < np; i++)
            if (pfds[i].revents && pstreams[i]) tdr_stream_pump(pstreams[i]);
        tdr_sinks_flush();
    }
}

static void init_workers(set_state_t *st)
{
    const tdr_launch_t *l = st->l;
    for (int i = 0; i < st->n; i++) {
        tdr_worker_t *w = &st->ws[i];
        w->local_rank = l->local_rank_base + i;
        w->rank = l->rank_base + i;
        w->tee_out = w->tee_err = w->log_fd = -1;
        w->out.fd = w->err.fd = -1;
    }
}

void tdr_run_set(const tdr_launch_t *l, bool quiet_report, tdr_set_result_t *res)
{
    const tdr_opts_t *o = l->opts;
    int n = l->nworkers;
    memset(res, 0, sizeof *res);
    res->outcome = TDR_SET_SUCCEEDED;
    res->first_rank = -1;
    if (tdr_stop_signal()) {
        res->outcome = TDR_SET_INTERRUPTED;
        res->stop_signal = tdr_stop_signal();
        return;
    }
    if ((o->tee_dir && tdr_make_attempt_dir(o->tee_dir, l->attempt) != 0) ||
        (o->log_dir && tdr_make_attempt_dir(o->log_dir, l->attempt) != 0)) {
        res->outcome = TDR_SET_ERROR;
        return;
    }
    if (!l->plain_env) tdr_fr_prepare(l);
    set_state_t st = {.l = l, .n = n, .first_failed = -1, .settle_at = INT64_MAX,
                      .kill_at = INT64_MAX};
    st.ws = calloc((size_t)n, sizeof *st.ws);
    struct pollfd *pfds = calloc((size_t)(2 * n + 3), sizeof *pfds);
    tdr_stream_t **pstreams = calloc((size_t)(2 * n + 3), sizeof *pstreams);
    if (!st.ws || !pfds || !pstreams) {
        tdr_eprintf("tdistrun: out of memory for %d workers\n", n);
        res->outcome = TDR_SET_ERROR;
        goto out;
    }
    init_workers(&st);
    for (int i = 0; i < n; i++) {
        if (tdr_worker_start(l, &st.ws[i]) != 0) {
            res->outcome = TDR_SET_ERROR;
            begin_stop(&st, res, SIGTERM);
            break;
        }
        st.running++;
    }
    supervise(&st, res, pfds, pstreams);
    for (int i = 0; i < n; i++) tdr_worker_close(&st.ws[i]);
    if (st.first_failed >= 0 && !quiet_report) print_report(&st);
    for (int i = 0; i < n; i++) tdr_worker_fini(&st.ws[i]);
    if (!l->plain_env) tdr_fr_cleanup(res->outcome == TDR_SET_SUCCEEDED);
    res->w0_exited = st.ws[0].exited;
    res->w0_code = st.ws[0].code;
    res->w0_signal = st.ws[0].sig;
out:
    free(st.ws);
    free(pfds);
    free(pstreams);
}
