/*
 * tools/tdistrun/tdistrun.h — the pieces of the tdistrun launcher and how
 * they fit together:
 *
 *   args.c       command line -> tdr_opts_t, usage text
 *   sink.c       the launcher's own stdout and stderr: bounded queues
 *                written without ever blocking the launcher
 *   output.c     worker stdout/stderr pipes -> "[rank R] line" into those
 *                queues, --log-dir and --tee files, the last lines of
 *                each worker's stderr
 *   worker.c     one worker: its environment, fork/exec, its log files
 *   supervise.c  one worker set: one poll() loop over pipes and signals,
 *                which failure was first, the stop sequence (signal,
 *                grace period, SIGKILL)
 *   guard.c      a small process that kills the workers' process groups
 *                when the launcher dies without cleaning up (kill -9)
 *   coord.c      --nnodes > 1: launchers of all nodes agreeing on
 *                failures, restarts and success through the store
 *   flight.c     the flight recorder: the workers' TDIST_FR_DIR, SIGUSR1
 *                passed to the workers that catch it, tdist-fr in reports
 *   rdzv.c       SIGUSR1 with workers left alone: who has registered in
 *                the rendezvous, from the store
 *   mpi.c        --backend mpi: exec mpirun, each rank wrapped by
 *                `tdistrun --mpi-worker` for prefixes and logs
 *   main.c       the store, the restart loop, the exit code
 *
 * Everything here is private to the tool (prefix tdr_).
 */
#ifndef TDISTRUN_H
#define TDISTRUN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <poll.h>
#include <stdio.h>
#include <sys/types.h>

#include "core/internal.h"

#define TDR_MAX_PROCS 4096          /* --nproc-per-node and --nnodes upper bound */
#define TDR_MAX_WORLD 65536         /* nnodes x nproc-per-node upper bound */
#define TDR_TAIL_LINES 20           /* stderr lines kept per worker */
#define TDR_TAIL_LINE_MAX 512       /* bytes kept of each of those lines */
#define TDR_LINE_MAX 8192           /* a longer line is forwarded in pieces */
#define TDR_HOST_MAX 256            /* --rdzv-endpoint host part */

/* Exit codes of the launcher itself (see docs/tdistrun.md). A worker
 * failure makes the launcher exit with that worker's code (or 128+signal). */
#define TDR_EXIT_SETUP 1            /* the launcher could not start (store, fork, ...) */
#define TDR_EXIT_USAGE 2            /* bad command line */
#define TDR_EXIT_NOT_FOUND 127      /* the program was not found / not executable */

/* The hidden first argument that makes tdistrun the per-rank wrapper
 * mpirun starts under --backend mpi (mpi.c). */
#define TDR_MPI_WORKER_ARG "--mpi-worker"

/* ------------------------------------------------------------------ args */

typedef struct tdr_opts {
    int nproc_per_node;      /* required, >= 1 ("auto": usable CPUs) */
    int nnodes;              /* default 1 */
    int node_rank;           /* default 0 */
    const char *master_addr; /* default "127.0.0.1" */
    int master_port;         /* -1: not given (port 0 = pick a free one on the master) */
    int max_restarts;        /* default 0 */
    int64_t grace_ms;        /* --grace-period, default 5000 */
    bool prefix;             /* "[rank R] " prefixes, default on */
    bool timestamps;         /* --timestamps: a time before every line */
    bool bind_core;          /* --bind-to core: worker i runs on allowed CPU i mod n */
    const char *tee_dir;     /* --tee DIR: also write raw per-rank logs there; NULL: off */
    const char *log_dir;     /* --log-dir DIR: one stdout+stderr log per rank; NULL: off */
    const char *ranks_filter;/* --local-ranks-filter as given; NULL: every rank shown */
    uint64_t shown[TDR_MAX_PROCS / 64]; /* bit i: local rank i's output reaches the console */
    bool quiet;              /* --quiet: no launcher status lines except errors */
    bool mpi;                /* --backend mpi (or TDIST_BACKEND=mpi): exec mpirun */
    bool standalone;         /* --standalone (the single-node default, made explicit) */
    char endpoint_host[TDR_HOST_MAX]; /* --rdzv-endpoint's host, brackets removed */
    char **prog_argv;        /* program and its arguments (NULL-terminated, borrowed) */
} tdr_opts_t;

/* Parse argv into *o. Returns 0 to run, 1 when --help/--version printed
 * (exit 0), TDR_EXIT_USAGE after printing an error and the usage to err. */
int tdr_parse_args(int argc, char **argv, tdr_opts_t *o, FILE *err);

/* Print the usage text to f. */
void tdr_usage(FILE *f);

/* Whether local rank lr's output is shown on the console. */
static inline bool tdr_shown(const tdr_opts_t *o, int lr)
{
    return (o->shown[lr / 64] >> (lr % 64)) & 1;
}

/* Usable CPUs: the affinity mask's count (at least 1). */
int tdr_usable_cpus(void);

/* ------------------------------------------------------------------ sink */

/* The launcher's stdout or stderr as a bounded queue (sink.c). Data is
 * written without blocking; what does not fit is dropped (whole records)
 * and a note saying how much was dropped follows once there is room. */
typedef struct tdr_sink tdr_sink_t;

extern tdr_sink_t *const tdr_out;   /* fd 1 */
extern tdr_sink_t *const tdr_err;   /* fd 2 */

/* Set both sinks up (call once, before any output through them). */
void tdr_sinks_init(bool timestamps);

/* Queue one record (a line, or a raw chunk with --no-prefix). Returns
 * false if it was dropped for lack of room. Tries to write at once. */
bool tdr_sink_put(tdr_sink_t *s, const void *p, size_t n);

/* Write what can be written now, without blocking. */
void tdr_sinks_flush(void);

/* Add a POLLOUT entry for each sink with data waiting; returns how many
 * entries were added (at most 2). */
int tdr_sinks_pollfds(struct pollfd *p);

/* Before exit: write what is left, waiting for slow readers, until done,
 * the reader is gone, or a stop signal arrives (then the rest is dropped). */
void tdr_sinks_finish(void);

/* A launcher message to stderr through the sink, with the timestamp when
 * --timestamps is on. */
void tdr_eprintf(const char *fmt, ...) TDIST_PRINTF(1, 2);

/* "YYYY-MM-DD HH:MM:SS.mmm " (local time) into buf (>= 32 bytes); returns
 * its length. */
size_t tdr_timestamp(char *buf, size_t n);

/* ---------------------------------------------------------------- output */

/* One worker stream (its stdout or its stderr) as seen by the launcher. */
typedef struct tdr_stream {
    int fd;                  /* read end of the pipe; -1 once closed */
    tdr_sink_t *console;     /* where lines go (tdr_out / tdr_err); NULL: not shown */
    int log_fd;              /* --log-dir file (shared by both streams) or -1 */
    int tee_fd;              /* raw copy (--tee), or -1 */
    int rank;                /* global rank, for the prefix */
    bool prefix;
    bool timestamps;
    bool keep_tail;          /* remember the last TDR_TAIL_LINES lines */
    char *line;              /* partial line being assembled, TDR_LINE_MAX */
    size_t line_len;
    char *obuf;              /* timestamp + "[rank R] " + line + "\n" staging buffer */
    char *tail;              /* TDR_TAIL_LINES x TDR_TAIL_LINE_MAX ring */
    size_t tail_cur;         /* bytes of the tail line being assembled */
    int tail_next;           /* ring slot the current line goes to */
    int tail_count;          /* complete lines in the ring */
    bool tail_partial;       /* the current tail line has bytes */
} tdr_stream_t;

/* Where a stream's bytes go. */
typedef struct tdr_stream_dest {
    tdr_sink_t *console;     /* NULL: not shown on the console */
    int log_fd, tee_fd;      /* -1: none */
    int rank;
    bool prefix, timestamps, keep_tail;
} tdr_stream_dest_t;

/* Set up a stream reading fd. Returns 0, or -1 when out of memory. */
int tdr_stream_init(tdr_stream_t *s, int fd, const tdr_stream_dest_t *d);

/* Read what is available from s->fd (one read) and forward it. Returns 1
 * while the stream is open, 0 at end of file (the stream is then flushed
 * and its fd closed). Never blocks: the fd is non-blocking. */
int tdr_stream_pump(tdr_stream_t *s);

/* Read everything the pipe holds now (bounded), e.g. after the worker
 * died, so that nothing it wrote is left behind. */
void tdr_stream_drain(tdr_stream_t *s);

/* Flush a partial line and close the fd (if still open). Idempotent. */
void tdr_stream_close(tdr_stream_t *s);

/* Print the remembered stderr lines through tdr_eprintf, each as
 * "    | line". Returns the number of lines printed. */
int tdr_stream_print_tail(const tdr_stream_t *s);

/* Free the buffers (after tdr_stream_close). */
void tdr_stream_fini(tdr_stream_t *s);

/* ----------------------------------------------------------------- coord */

/* Launchers of several nodes agreeing through the store (coord.c). */
typedef struct tdr_coord tdr_coord_t;

typedef enum tdr_coord_event {
    TDR_COORD_NONE = 0,      /* nothing new (finish: every node is done) */
    TDR_COORD_FAILED = 1,    /* a node reported a failure of this attempt */
    TDR_COORD_ABORT = 2,     /* a node's launcher was stopped by a signal */
    TDR_COORD_LOST = 3,      /* the store is unreachable, or nodes never finished */
    TDR_COORD_SIGNAL = 4     /* this launcher got a stop signal while waiting */
} tdr_coord_event_t;

/* Connect to node 0's store at addr:port (retrying while it starts, up to
 * the default store timeout; gives up early on a stop signal). Returns 0,
 * or -1 after printing why. */
int tdr_coord_create(const char *addr, int port, int node_rank, int nnodes, tdr_coord_t **out);
void tdr_coord_destroy(tdr_coord_t *c);

/* Tell the other nodes that attempt failed here (what: "rank R exited with
 * status S"). The first report of an attempt wins. */
void tdr_coord_report_failure(tdr_coord_t *c, int attempt, const char *what);

/* Tell the other nodes to stop without restarting. */
void tdr_coord_abort(tdr_coord_t *c, const char *why);

/* One look at the keys (one or two store round trips): NONE, FAILED or
 * ABORT with the reporter's message in msg, or LOST. */
tdr_coord_event_t tdr_coord_poll(tdr_coord_t *c, int attempt, char *msg, size_t n);

/* This node's workers of attempt all succeeded: count it, then wait until
 * every node has (NONE), or a failure/abort shows up, or the store is lost,
 * or a stop signal arrives. Bounded by the default store timeout. */
tdr_coord_event_t tdr_coord_finish(tdr_coord_t *c, int attempt, char *msg, size_t n);

/* ----------------------------------------------------------------- guard */

/* Fork the guard: a process outside the launcher's process group that
 * learns every worker's process group through a pipe and SIGKILLs those
 * groups when the pipe reaches end of file, i.e. when the launcher is gone
 * however it died. Call before any thread or worker exists. Returns 0, or
 * -1 after printing why (the launcher then runs without it). */
int tdr_guard_start(void);

/* Tell the guard about a worker's process group / that it is gone. */
void tdr_guard_watch(pid_t pgid);
void tdr_guard_forget(pid_t pgid);

/* The guard's pid (0 if none): the launcher reaps it like a worker. */
pid_t tdr_guard_pid(void);

/* The guard died (reaped by the launcher): stop writing to it. */
void tdr_guard_lost(void);

/* Close the pipe (the guard exits) and reap the guard, bounded. */
void tdr_guard_stop(void);

/* ------------------------------------------------------------- supervise */

/* Launcher-wide signal handling: SIGINT, SIGTERM, SIGHUP are caught and
 * forwarded to workers; SIGCHLD wakes the loop and says which child died
 * first; SIGPIPE is ignored. Returns 0, or -1 with errno set. */
int tdr_signals_install(void);

/* The signal that asked the launcher to stop (0 if none so far). */
int tdr_stop_signal(void);

/* The read end of the self-pipe the handlers write to (for poll). */
int tdr_signal_fd(void);

/* How a worker set ended. */
typedef enum tdr_set_outcome {
    TDR_SET_SUCCEEDED = 0,   /* every worker exited 0 */
    TDR_SET_FAILED = 1,      /* a worker failed: see first_* */
    TDR_SET_INTERRUPTED = 2, /* the launcher got a signal: see stop_signal */
    TDR_SET_ERROR = 3,       /* the launcher could not start the set */
    TDR_SET_REMOTE = 4       /* stopped for another node (see remote_*) */
} tdr_set_outcome_t;

typedef struct tdr_set_result {
    tdr_set_outcome_t outcome;
    int first_rank;          /* global rank of the first worker that failed */
    int first_local_rank;
    pid_t first_pid;
    bool first_exited;       /* exited (first_code) or killed (first_signal) */
    int first_code;
    int first_signal;
    int stop_signal;         /* TDR_SET_INTERRUPTED: the signal received */
    bool w0_exited;          /* how the set's first worker ended (the */
    int w0_code, w0_signal;  /* --mpi-worker wrapper has only that one) */
    tdr_coord_event_t remote_event; /* TDR_SET_REMOTE: FAILED, ABORT or LOST */
    char remote_msg[512];
} tdr_set_result_t;

/* What every worker of a set shares. */
typedef struct tdr_launch {
    const tdr_opts_t *opts;
    const char *prog_path;   /* resolved executable path */
    int nworkers;            /* workers in this set */
    int rank_base;           /* global rank of the first one */
    int local_rank_base;     /* local rank of the first one */
    bool plain_env;          /* --mpi-worker: do not set the env:// variables */
    const char *master_addr;
    int master_port;         /* the real port (never 0) */
    bool launcher_store;     /* set TDIST_LAUNCHER_STORE=1 */
    int attempt;             /* TDIST_RESTART_COUNT */
    tdr_coord_t *coord;      /* --nnodes > 1: the other launchers; else NULL */
} tdr_launch_t;

/* Start the set's workers, forward their output, and supervise them until
 * every one has ended. Stops the set (signal, grace period, SIGKILL) when a
 * worker fails or the launcher is asked to stop. When the set failed,
 * prints the report (first failed rank, its status, its last stderr lines)
 * unless quiet_report. Blocks until the set is over. */
void tdr_run_set(const tdr_launch_t *l, bool quiet_report, tdr_set_result_t *res);

/* "SIGTERM" for SIGTERM, "signal 42" for an unnamed one (static or buf). */
const char *tdr_signal_name(int sig, char *buf, size_t n);

/* "exited with status 3" / "was killed by signal 9 (SIGKILL)" into buf. */
const char *tdr_describe(bool exited, int code, int sig, char *buf, size_t n);

/* ---------------------------------------------------------------- worker */

/* One worker of a set, as the launcher sees it (worker.c). */
typedef struct tdr_worker {
    pid_t pid;               /* also its process group id; 0 if never started */
    int local_rank, rank;
    bool running;
    bool exited;             /* how it ended (valid once !running and pid != 0) */
    int code, sig;
    uint64_t death_seq;      /* order in which its death was seen; 0: not yet */
    bool candidate;          /* failed before the stop began: may be the first failure */
    tdr_stream_t out, err;
    int tee_out, tee_err, log_fd;
} tdr_worker_t;

/* Create DIR and DIR/attempt_<a> (either may exist). Returns 0, or -1
 * after printing why. */
int tdr_make_attempt_dir(const char *dir, int attempt);

/* Fork and exec worker w (its pipes, files and environment). Returns 0, or
 * -1 after printing why. */
int tdr_worker_start(const tdr_launch_t *l, tdr_worker_t *w);

/* Read what w's pipes still hold, then close its streams and files. */
void tdr_worker_close(tdr_worker_t *w);

/* Free w's stream buffers (after tdr_worker_close and the report). */
void tdr_worker_fini(tdr_worker_t *w);

/* The command line as a shell would read it back ("prog 'a b' c"), for
 * messages (malloc'd; NULL when out of memory). */
char *tdr_command_text(const char *prog, char *const *argv);

/* ------------------------------------------------------------------- mpi */

/* --backend mpi: exec mpirun with each rank wrapped. Returns only on
 * failure, with the exit code. */
int tdr_exec_mpirun(const tdr_opts_t *o, const char *prog);

/* Be the wrapper of one MPI rank (argv after TDR_MPI_WORKER_ARG): start
 * the program, forward its output with the rank prefix, end the way it
 * ended. Returns the exit code (or does not return: re-raises the
 * program's signal). */
int tdr_mpi_worker_main(int argc, char **argv);

/* Find prog the way execvp would (a name with a '/' is used as is).
 * Returns a malloc'd path, or NULL after printing why. */
char *tdr_resolve_program(const char *prog);

/* ---------------------------------------------------------------- flight */

/* The flight recorder's directory for the set about to start (flight.c):
 * the user's TDIST_FR_DIR, else one under --log-dir or in TMPDIR. */
void tdr_fr_prepare(const tdr_launch_t *l);
/* The directory to set as the workers' TDIST_FR_DIR (NULL: theirs stands). */
const char *tdr_fr_worker_dir(void);
/* The directory the workers record into (NULL: none). */
const char *tdr_fr_dir(void);
/* SIGUSR1 to the launcher: pass it to every process of the running
 * workers' process groups that catches it (a worker's flight recorder,
 * once it has a group, or the program's own handler), and to no other: a
 * process that does not catch SIGUSR1 would die of it. Returns how many
 * workers got it; *left: running workers none of whose processes catches
 * it yet (left alone), and alone[i] (n entries, the caller's; may be
 * NULL) whether ws[i] is one of them. */
int tdr_fr_signal_workers(const tdr_worker_t *ws, int n, int *left, bool *alone);

/* ----------------------------------------------------------------- rdzv */

/* After SIGUSR1 left workers alone (alone[i], n entries): say from the
 * job's store which ranks of this attempt's rendezvous have registered,
 * and so which of those workers wait in tdist_init for others and which
 * have not reached it (rdzv.c). Prints to the launcher's stderr; blocks
 * for at most 2 s (an unreachable store is said so). */
void tdr_rdzv_report(const tdr_launch_t *l, const tdr_worker_t *ws, int n, const bool *alone);
/* After a failed set: tdist-fr's first divergence and the directory. */
void tdr_fr_report(void);
/* After a set: remove a temporary directory, with the records in it
 * (records_too: the set succeeded) or only when it is empty. */
void tdr_fr_cleanup(bool records_too);

#endif /* TDISTRUN_H */
