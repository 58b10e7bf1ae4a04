/*
 * tdist/init.h — joining a job: init methods and rendezvous.
 *
 * A process calls tdist_init() once with an init URL:
 *
 *   env://                              MASTER_ADDR, MASTER_PORT, RANK,
 *                                       WORLD_SIZE (LOCAL_RANK,
 *                                       LOCAL_WORLD_SIZE optional), or a
 *                                       Slurm job step's variables (below)
 *   tcp://HOST:PORT?rank=R&world_size=N rank 0 hosts the store on HOST:PORT
 *   file:///path/to/file?rank=R&world_size=N
 *                                       a file every rank can reach
 *   mpi://                              a world from mpirun (docs/mpi.md)
 *
 * env:// under Slurm: when RANK and WORLD_SIZE are both unset and
 * SLURM_PROCID is set (a task started by srun), the rank is SLURM_PROCID,
 * the world size SLURM_NTASKS, the local checks SLURM_LOCALID and this
 * node's entry (SLURM_NODEID) of SLURM_STEP_TASKS_PER_NODE /
 * SLURM_TASKS_PER_NODE (else SLURM_NTASKS_PER_NODE), and the store is on
 * the first host of SLURM_STEP_NODELIST / SLURM_JOB_NODELIST (Slurm's
 * compressed syntax: node[01-04,07],gpu3 -> node01) at port
 * 10000 + SLURM_JOB_ID % 50000. MASTER_ADDR, MASTER_PORT, LOCAL_RANK and
 * LOCAL_WORLD_SIZE, when set, win. With neither the torchrun nor the
 * Slurm variables, tdist_init fails with a message naming the launchers
 * to start the program with (tdistrun, srun, mpirun). See docs/init.md.
 *
 * Rank and world size may also come from the options (they win over the
 * URL and the environment). For env:// and tcp://, rank 0 starts the TCP
 * store server on MASTER_ADDR:MASTER_PORT (bound to that address only)
 * unless the launcher already runs one (tdistrun sets
 * TDIST_LAUNCHER_STORE=1). Every rank then registers in the store and
 * waits for all others until the rendezvous deadline.
 *
 * Errors every present rank reports at the deadline name the missing
 * ranks ("rendezvous timed out after 30000 ms: 3 of 4 ranks arrived;
 * missing ranks: 2"). A rank number claimed twice (TDIST_ERR_DUPLICATE)
 * and a world-size disagreement (TDIST_ERR_MISMATCH) fail both sides, and
 * every other waiting rank fails at once with the same status and message
 * (not at the deadline). A malformed URL, or a missing or malformed
 * variable, is TDIST_ERR_INVALID_ARG naming it.
 *
 * Other environment variables read by tdist_init:
 *   TDIST_LAUNCHER_STORE=1   the store already runs at MASTER_ADDR:PORT /
 *                            HOST:PORT (tdistrun, the test harness); rank 0
 *                            is only a client
 *   TDIST_STORE_LISTEN_FD=N  rank 0 hosts the store on this inherited,
 *                            already-listening socket (see opts.listen_fd)
 *   TDIST_RESTART_COUNT=G    restart generation (tdistrun sets it; default
 *                            0). Every key of the job lives under
 *                            "tdist/g<G>/" in the store (rendezvous keys
 *                            under "tdist/g<G>/rdzv/", tdist_world_store
 *                            under "tdist/g<G>/user/"), so a restarted
 *                            worker set never sees a previous attempt's keys
 *   TDIST_HOSTNAME           host name used to group local ranks (default
 *                            gethostname()); tests use it to simulate hosts.
 *                            Ranks in different network namespaces are on
 *                            different hosts whatever their names
 *   TDIST_SOCKET_IFNAME      read when a process group spans hosts: the
 *                            network interface its TCP transport uses
 *                            (NCCL_SOCKET_IFNAME syntax; default: the
 *                            interface that reaches the store). See
 *                            docs/multihost.md
 *   TDIST_TIMEOUT_MS, TDIST_JOB_SECRET    defaults of the options below
 *   (TDIST_STORE_TOKEN: the older name of TDIST_JOB_SECRET)
 *   TDIST_LINE_BUFFERED=1    read once when the library is loaded, not
 *                            by tdist_init: stdout is made line-buffered
 *                            before main (tdistrun sets it in its workers;
 *                            docs/getting-started.md#output)
 * LOCAL_RANK / LOCAL_WORLD_SIZE (under Slurm, their Slurm counterparts),
 * when set, must agree with the local rank and size the rendezvous derives
 * from host names (TDIST_ERR_MISMATCH).
 *
 * file:// keeps its keys in the file. When every rank has left (the last
 * tdist_world_destroy), the last one removes the rendezvous keys; the keys
 * written through tdist_world_store stay, and so does the file (the caller
 * removes it). A job that died without leaving keeps its rendezvous keys:
 * use a fresh file or a new TDIST_RESTART_COUNT.
 */
#ifndef TDIST_INIT_H
#define TDIST_INIT_H

#include <stdint.h>

#include "tdist/core.h"
#include "tdist/store.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TDIST_INIT_DEFAULT_TIMEOUT_MS 300000 /* 5 minutes */

typedef struct tdist_world tdist_world_t;

/* Options for tdist_init(). Fill with tdist_init_opts_init(). */
typedef struct tdist_init_opts {
    int rank;            /* -1: from the URL, else (env:// only) RANK or SLURM_PROCID */
    int world_size;      /* -1: from the URL, else (env:// only) WORLD_SIZE or SLURM_NTASKS */
    /* Rendezvous deadline in ms (> 0), counted from the call: connecting
     * to the store and waiting for every rank. Default
     * TDIST_INIT_DEFAULT_TIMEOUT_MS or TDIST_TIMEOUT_MS from the
     * environment. Also the store's timeout, and the longest rank 0 waits
     * in tdist_world_destroy for the others to leave. */
    int64_t timeout_ms;
    /* The job's secret the store requires (proved by challenge-response,
     * never sent); NULL: TDIST_JOB_SECRET, else TDIST_STORE_TOKEN, from
     * the environment. */
    const char *token;
    /* tcp:// and env:// rank 0 only: >= 0 means host the store on this
     * already-listening socket (tdist_store_server_adopt) instead of
     * binding HOST:PORT (it wins over TDIST_LAUNCHER_STORE and
     * TDIST_STORE_LISTEN_FD, which does the same from the environment).
     * The other ranks connect to HOST:PORT, so the socket must listen
     * there. If tdist_init succeeds it owns the socket: it closes this
     * descriptor before returning (the server serves a duplicate until
     * tdist_world_destroy). If tdist_init fails, the caller still owns it.
     * Ignored (left open) on other ranks and for file://.
     * Default -1. */
    int listen_fd;
} tdist_init_opts_t;

/* Fill *opts with defaults. Reads TDIST_TIMEOUT_MS. Thread-safe. */
TDIST_API void tdist_init_opts_init(tdist_init_opts_t *opts);

/* Join the job described by url (NULL means "env://"), wait until every
 * rank has arrived, and return this process's view of the world.
 * Blocks up to the rendezvous deadline (opts->timeout_ms); when rank 0
 * hosts the store and the rendezvous fails, it keeps the server up a
 * little longer (at most 3 s) so the others can read the failure.
 * opts may be NULL. env:// and tcp:// URLs may carry ?rank=R&world_size=N
 * (no other parameters); IPv6 hosts are written in brackets
 * (tcp://[::1]:29500). On success the caller owns *out
 * (tdist_world_destroy); on failure *out is untouched. Thread-safe (each
 * call makes its own world). */
TDIST_API tdist_status_t tdist_init(const char *url, const tdist_init_opts_t *opts,
                                    tdist_world_t **out);

/* This process's rank, the world size, its rank among the ranks on the
 * same host (hosts are told apart by host name, or TDIST_HOSTNAME if set,
 * and by network namespace; LOCAL_RANK / LOCAL_WORLD_SIZE or their
 * Slurm counterparts, if set, must agree) and the number of ranks on that
 * host; -1 if w is NULL. Thread-safe; never block. */
TDIST_API int tdist_world_rank(const tdist_world_t *w);
TDIST_API int tdist_world_size(const tdist_world_t *w);
TDIST_API int tdist_world_local_rank(const tdist_world_t *w);
TDIST_API int tdist_world_local_size(const tdist_world_t *w);

/* The job's store (keys are private to this job and restart generation).
 * Borrowed: valid until tdist_world_destroy; NULL if w is NULL.
 * Thread-safe (see store.h). */
TDIST_API tdist_store_t *tdist_world_store(tdist_world_t *w);

/* Leave the job: record that this rank left, close the store (rank 0
 * stops the server it hosts, after every rank has left or the timeout
 * passed; the last rank to leave a file:// store removes the rendezvous
 * keys) and free w. Every rank must call it. Blocks at most the world's
 * timeout. Not to be called while another thread uses the world's store.
 * NULL does nothing. */
TDIST_API void tdist_world_destroy(tdist_world_t *w);

#ifdef __cplusplus
}
#endif
#endif /* TDIST_INIT_H */
