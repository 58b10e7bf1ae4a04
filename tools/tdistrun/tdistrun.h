/*
 * tools/tdistrun/tdistrun.h — the pieces of the tdistrun launcher and how
 * they fit together:
 *
 *   args.c       command line -> tdr_opts_t, usage text
 *   output.c     worker stdout/stderr pipes -> "[rank R] line" on the
 *                launcher's stdout/stderr, optional tee files, the last
 *                lines of each worker's stderr
 *   supervise.c  one worker set: fork/exec every worker with its
 *                environment, one poll() loop over pipes and signals,
 *                the stop sequence (signal, grace period, SIGKILL)
 *   coord.c      --nnodes > 1: launchers of all nodes agreeing on
 *                failures, restarts and success through the store
 *   main.c       the store, the restart loop, the exit code
 *
 * Everything here is private to the tool (prefix tdr_).
 */
#ifndef TDISTRUN_H
#define TDISTRUN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#define TDR_MAX_PROCS 4096          /* --nproc-per-node and --nnodes upper bound */
#define TDR_MAX_WORLD 65536         /* nnodes x nproc-per-node upper bound */
#define TDR_TAIL_LINES 20           /* stderr lines kept per worker */
#define TDR_TAIL_LINE_MAX 512       /* bytes kept of each of those lines */
#define TDR_LINE_MAX 8192           /* a longer line is forwarded in pieces */

/* Exit codes of the launcher itself (see docs/tdistrun.md). A worker
 * failure makes the launcher exit with that worker's code (or 128+signal). */
#define TDR_EXIT_SETUP 1            /* the launcher could not start (store, fork, ...) */
#define TDR_EXIT_USAGE 2            /* bad command line */
#define TDR_EXIT_NOT_FOUND 127      /* the program was not found / not executable */

/* ------------------------------------------------------------------ args */

typedef struct tdr_opts {
    int nproc_per_node;      /* required, >= 1 */
    int nnodes;              /* default 1 */
    int node_rank;           /* default 0 */
    const char *master_addr; /* default "127.0.0.1" */
    int master_port;         /* -1: not given (port 0 = pick a free one on the master) */
    int max_restarts;        /* default 0 */
    int64_t grace_ms;        /* --grace-period, default 5000 */
    bool prefix;             /* "[rank R] " prefixes, default on */
    bool bind_core;          /* --bind-to core: worker i runs on allowed CPU i mod n */
    const char *tee_dir;     /* --tee DIR: also write raw per-rank logs there; NULL: off */
    bool quiet;              /* --quiet: no launcher status lines except errors */
    bool mpi;                /* --backend mpi (or TDIST_BACKEND=mpi): exec mpirun */
    char **prog_argv;        /* program and its arguments (NULL-terminated, borrowed) */
} tdr_opts_t;

/* Parse argv into *o. Returns 0 to run, 1 when --help/--version printed
 * (exit 0), TDR_EXIT_USAGE after printing an error and the usage to err. */
int tdr_parse_args(int argc, char **argv, tdr_opts_t *o, FILE *err);

/* Print the usage text to f. */
void tdr_usage(FILE *f);

/* ---------------------------------------------------------------- output */

/* One worker stream (its stdout or its stderr) as seen by the launcher. */
typedef struct tdr_stream {
    int fd;                  /* read end of the pipe; -1 once closed */
    int out_fd;              /* where lines go: STDOUT_FILENO or STDERR_FILENO */
    int tee_fd;              /* raw copy, or -1 */
    int rank;                /* global rank, for the prefix */
    bool prefix;
    bool keep_tail;          /* remember the last TDR_TAIL_LINES lines */
    char *line;              /* partial line being assembled (prefix mode), TDR_LINE_MAX */
    size_t line_len;
    char *obuf;              /* "[rank R] " + line + "\n" staging buffer */
    char *tail;              /* TDR_TAIL_LINES x TDR_TAIL_LINE_MAX ring */
    size_t tail_cur;         /* bytes of the tail line being assembled */
    int tail_next;           /* ring slot the current line goes to */
    int tail_count;          /* complete lines in the ring */
    bool tail_partial;       /* the current tail line has bytes */
} tdr_stream_t;

/* Set up a stream reading fd. Returns 0, or -1 when out of memory. */
int tdr_stream_init(tdr_stream_t *s, int fd, int out_fd, int tee_fd, int rank, bool prefix,
                    bool keep_tail);

/* Read what is available from s->fd and forward it. Returns 1 while the
 * stream is open, 0 at end of file (the stream is then flushed and its fd
 * closed). Never blocks when poll() said the fd is readable. */
int tdr_stream_pump(tdr_stream_t *s);

/* Flush a partial line and close the fd (if still open). Idempotent. */
void tdr_stream_close(tdr_stream_t *s);

/* Print the remembered stderr lines to f, each as "    | line". Returns the
 * number of lines printed. */
int tdr_stream_print_tail(const tdr_stream_t *s, FILE *f);

/* Free the buffers (after tdr_stream_close). */
void tdr_stream_fini(tdr_stream_t *s);

/* write() all of buf to fd, retrying on EINTR and short writes. */
void tdr_write_all(int fd, const void *buf, size_t len);

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

/* ------------------------------------------------------------- supervise */

/* Launcher-wide signal handling: SIGINT, SIGTERM, SIGHUP are caught and
 * forwarded to workers; SIGCHLD wakes the loop; SIGPIPE is ignored.
 * Returns 0, or -1 with errno set. */
int tdr_signals_install(void);

/* The signal that asked the launcher to stop (0 if none so far). */
int tdr_stop_signal(void);

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
    tdr_coord_event_t remote_event; /* TDR_SET_REMOTE: FAILED, ABORT or LOST */
    char remote_msg[512];
} tdr_set_result_t;

/* What every worker of a set shares. */
typedef struct tdr_launch {
    const tdr_opts_t *opts;
    const char *prog_path;   /* resolved executable path */
    const char *master_addr;
    int master_port;         /* the real port (never 0) */
    bool launcher_store;     /* set TDIST_LAUNCHER_STORE=1 */
    int attempt;             /* TDIST_RESTART_COUNT */
    tdr_coord_t *coord;      /* --nnodes > 1: the other launchers; else NULL */
} tdr_launch_t;

/* Start nproc_per_node workers, forward their output, and supervise them
 * until every one has ended. Stops the set (signal, grace period, SIGKILL)
 * when a worker fails or the launcher is asked to stop. When the set
 * failed, prints the report (first failed rank, its status, its last
 * stderr lines) to stderr. Blocks until the set is over. */
void tdr_run_set(const tdr_launch_t *l, tdr_set_result_t *res);

/* "SIGTERM" for SIGTERM, "signal 42" for an unnamed one (static or buf). */
const char *tdr_signal_name(int sig, char *buf, size_t n);

/* "exited with status 3" / "was killed by signal 9 (SIGKILL)" into buf. */
const char *tdr_describe(bool exited, int code, int sig, char *buf, size_t n);

#endif /* TDISTRUN_H */
