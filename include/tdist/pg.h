/*
 * tdist/pg.h — process groups and collectives.
 *
 * A process group is an ordered set of ranks with its own channels and its
 * own progress engine. The world group comes from a tdist_world_t (init.h);
 * subgroups from tdist_pg_new_group() and tdist_pg_split().
 *
 * The rules every collective keeps (docs/design.md):
 *  1. One order. A group runs its collectives one at a time, in the order
 *     they were issued, on its engine thread; each carries the group's
 *     sequence number (1, 2, 3, ...).
 *  2. Always checked. Before data moves, every rank's fingerprint of the
 *     call (group, sequence, op, dtype, count, root, reduce op, split
 *     sizes) is compared; a mismatch fails that collective on every rank
 *     with TDIST_ERR_MISMATCH and a message naming both calls and ranks,
 *     the same text after "collective mismatch:" on every rank, e.g.
 *     "rank 1 group world seq 7 all_reduce(f32, 1024, sum): collective
 *     mismatch: rank 0 all_reduce(f32, 1024, sum) vs rank 1
 *     broadcast(f32, 1024, root 0)". See docs/pg.md.
 *  3. Bounded. Every wait has a deadline: the call's timeout, else the
 *     group's (default 10 minutes; TDIST_TIMEOUT_MS overrides). A peer that
 *     dies fails the pending and next collectives of every other rank with
 *     an error naming the dead rank.
 *
 * Failure is sticky: after a collective fails, every later call on the
 * group fails with the same status; destroy the group.
 *
 * Buffers are (pointer, count, dtype); the caller owns them and keeps them
 * untouched until the collective has completed (blocking call returned, or
 * its work finished). sendbuf == recvbuf means in place.
 *
 * Blocking or not: every collective takes `tdist_work_t **work`. NULL
 * blocks until the collective completes. Otherwise the call returns at once
 * with *work set; the caller waits or tests it and must tdist_work_free()
 * it. Argument errors are reported by the call itself, before anything is
 * sent, and then no work is created.
 *
 * Threads: the calls on one group must come from one thread at a time, or
 * be serialised by the caller (their issue order is the group's order).
 * Work handles may be waited on from any thread. tdist_pg_abort() may be
 * called from any thread.
 */
#ifndef TDIST_PG_H
#define TDIST_PG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tdist/core.h"
#include "tdist/init.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TDIST_PG_DEFAULT_TIMEOUT_MS 600000 /* 10 minutes */

typedef struct tdist_pg tdist_pg_t;
typedef struct tdist_work tdist_work_t;

/* Options of a group. Fill with tdist_pg_opts_init(). */
typedef struct tdist_pg_opts {
    /* Default deadline of each collective in ms. Default
     * TDIST_PG_DEFAULT_TIMEOUT_MS, or TDIST_TIMEOUT_MS from the environment. */
    int64_t timeout_ms;
    /* Name used in messages ("world", "tp0", ...). NULL: "world" for the
     * world group, "<parent>.<n>" for subgroups. Copied. */
    const char *name;
    /* Transport: "shm" (shared memory; every rank on one host), "tcp", or
     * "auto"/NULL: TDIST_TRANSPORT from the environment, else shared
     * memory when every rank of the world is on this host and TCP
     * otherwise. "shm" across hosts is TDIST_ERR_NOT_SUPPORTED; any other
     * name INVALID_ARG. A subgroup keeps its parent's transport unless its
     * opts name one. */
    const char *transport;
    /* Address this rank's channels listen on (and tell the other ranks).
     * NULL: 127.0.0.1 when every rank of the world is on this host; when
     * the world spans hosts, the address of the interface
     * TDIST_SOCKET_IFNAME names, else of the one that routes to the store
     * (MASTER_ADDR, the tcp:// host; for file:// the first interface that
     * is up), chosen once per world (docs/multihost.md). No interface
     * matching TDIST_SOCKET_IFNAME, or no route to the store, fails the
     * creation with an error that names it.
     * Subgroups created with NULL opts inherit the parent's timeout and
     * bind address. Copied. */
    const char *bind_addr;
    /* Backend of a world group: "native" (tdist's own collectives over
     * shared memory / TCP) or "mpi" (MPI's collectives on a communicator;
     * the world must come from mpirun, see docs/mpi.md). NULL (default):
     * TDIST_BACKEND from the environment, else "native". An unknown name is
     * TDIST_ERR_INVALID_ARG; "mpi" in a build without MPI is
     * TDIST_ERR_NOT_SUPPORTED. Subgroups always keep their parent's
     * backend (ignored there). Copied. */
    const char *backend;
    /* Deadline in ms of the group's set-up: everything its creation waits
     * for (the other ranks' addresses through the store, every store call
     * of the set-up, the connections and their handshakes, a multi-host
     * group's per-host subgroups), counted from the call; a creation not
     * done by then fails with TDIST_ERR_TIMEOUT naming the ranks missing.
     * Apart from timeout_ms so that a short collective deadline does not
     * fail the set-up over a slow link (tens of round trips). > 0: this;
     * 0: the same as timeout_ms. tdist_pg_opts_init sets it from
     * TDIST_SETUP_TIMEOUT_MS, else 0. Subgroups created with NULL opts
     * inherit the parent's (as a timeout, counted from their own creation);
     * with NULL opts a world group takes TDIST_SETUP_TIMEOUT_MS, else its
     * timeout_ms. < 0 is TDIST_ERR_INVALID_ARG. */
    int64_t setup_timeout_ms;
} tdist_pg_opts_t;

/* Fill *opts with defaults. Thread-safe. */
TDIST_API void tdist_pg_opts_init(tdist_pg_opts_t *opts);

/* Per-call options. Fill with tdist_coll_opts_init(); NULL means defaults. */
typedef struct tdist_coll_opts {
    /* Deadline of this collective in ms; < 0: the group's. */
    int64_t timeout_ms;
    /* PREMUL_SUM: every rank's input is multiplied by this factor before
     * the sum. Floating dtypes only. Default 1.0. */
    double premul_factor;
    /* Called once on the engine thread when the collective completes
     * (successfully or not) with its status and user_data; never called
     * if the call itself fails. Must not block or issue collectives on
     * the same group. */
    void (*on_complete)(tdist_status_t status, void *user_data);
    void *user_data;
} tdist_coll_opts_t;

/* Fill *opts with defaults. Thread-safe. */
TDIST_API void tdist_coll_opts_init(tdist_coll_opts_t *opts);

/* ------------------------------------------------------------- groups */

/* Create the world group over every rank of world: collective (every rank
 * calls it), blocks until every rank's channels are connected or the
 * set-up deadline (opts.setup_timeout_ms) passes (naming the ranks that
 * did not connect). Borrows world
 * (its store): world must outlive the group. opts may be NULL.
 * The caller owns *out (tdist_pg_destroy). */
TDIST_API tdist_status_t tdist_pg_create_world(tdist_world_t *world, const tdist_pg_opts_t *opts,
                                               tdist_pg_t **out);

/* Create a subgroup of parent with the n parent ranks in ranks[] (in that
 * order: ranks[i] becomes subgroup rank i). Collective over parent: every
 * parent rank calls it with the same list, in the same order relative to
 * its other group creations; it runs as a collective of parent. Ranks not
 * in the list get *out = NULL and TDIST_OK. Blocks. */
TDIST_API tdist_status_t tdist_pg_new_group(tdist_pg_t *parent, const int *ranks, int n,
                                            const tdist_pg_opts_t *opts, tdist_pg_t **out);

/* MPI_Comm_split: every parent rank calls it; ranks with the same color
 * form a group, ordered by (key, parent rank). color < 0: this rank joins
 * no group (*out = NULL, TDIST_OK). Collective over parent; blocks. */
TDIST_API tdist_status_t tdist_pg_split(tdist_pg_t *parent, int color, int key,
                                        const tdist_pg_opts_t *opts, tdist_pg_t **out);

/* This rank's rank in the group, the group's size, its name. Thread-safe;
 * -1 / -1 / NULL for a NULL group. */
TDIST_API int tdist_pg_rank(const tdist_pg_t *pg);
TDIST_API int tdist_pg_size(const tdist_pg_t *pg);
TDIST_API const char *tdist_pg_name(const tdist_pg_t *pg);

/* The rank in the world group of group rank r; -1 if out of range. */
TDIST_API int tdist_pg_world_rank(const tdist_pg_t *pg, int r);

/* Whether the group's collectives run through shared memory on this host
 * (every rank of the group here, the native backend): then moving data is
 * CPU work of the ranks themselves, which nothing overlaps without a spare
 * CPU (DDP's overlap auto asks). false for TCP, a group over several
 * hosts, another backend, or NULL. Thread-safe; never blocks. */
TDIST_API bool tdist_pg_shared_memory(const tdist_pg_t *pg);

/* Abort the group: every pending and future call on it fails at once with
 * TDIST_ERR_ABORTED; blocked waits return. Any thread; never blocks;
 * idempotent. The group must still be destroyed. */
TDIST_API tdist_status_t tdist_pg_abort(tdist_pg_t *pg);

/* The group's sticky error (TDIST_OK if none), and its message copied into
 * buf (may be NULL) of n bytes: the collective error, else the p2p
 * error, else TDIST_ERR_ABORTED after tdist_pg_abort. Thread-safe. */
TDIST_API tdist_status_t tdist_pg_error(const tdist_pg_t *pg, char *buf, size_t n);

/* Stop the engine, close the channels and free the group. Pending works
 * fail with TDIST_ERR_ABORTED; work handles stay valid until freed.
 * Blocks until the engine thread has exited. NULL does nothing. */
TDIST_API void tdist_pg_destroy(tdist_pg_t *pg);

/* ---------------------------------------------------------- work handles */

/* TDIST_INPROGRESS while running, then TDIST_OK or the error the
 * collective failed with. Never blocks; thread-safe. */
TDIST_API tdist_status_t tdist_work_status(const tdist_work_t *w);

/* Wait until the work completes or timeout_ms passes (< 0: no limit
 * beyond the collective's own deadline). Returns the work's status, or
 * TDIST_ERR_TIMEOUT if timeout_ms passed first (the work goes on). On an
 * error tdist_last_error() holds the work's message. Any thread. */
TDIST_API tdist_status_t tdist_work_wait(tdist_work_t *w, int64_t timeout_ms);

/* The work's error message ("" while running or on success). Owned by w. */
TDIST_API const char *tdist_work_error(const tdist_work_t *w);

/* Release the handle. Always required, also after an error; allowed before
 * the work completes (the collective still runs, its buffers must stay
 * valid until it does). NULL does nothing. */
TDIST_API void tdist_work_free(tdist_work_t *w);

/* ------------------------------------------------------------ collectives */

TDIST_API tdist_status_t tdist_broadcast(tdist_pg_t *pg, void *buf, size_t count,
                                         tdist_dtype_t dtype, int root,
                                         const tdist_coll_opts_t *opts, tdist_work_t **work);

TDIST_API tdist_status_t tdist_all_reduce(tdist_pg_t *pg, const void *sendbuf, void *recvbuf,
                                          size_t count, tdist_dtype_t dtype, tdist_redop_t op,
                                          const tdist_coll_opts_t *opts, tdist_work_t **work);

/* Reduce to root (the collective MPI_Reduce; named tdist_reduce_to because
 * tdist_reduce is core.h's local kernel). recvbuf is written on root only
 * (may be NULL elsewhere). */
TDIST_API tdist_status_t tdist_reduce_to(tdist_pg_t *pg, const void *sendbuf, void *recvbuf,
                                         size_t count, tdist_dtype_t dtype, tdist_redop_t op,
                                         int root, const tdist_coll_opts_t *opts,
                                         tdist_work_t **work);

/* recvbuf: size * count elements, rank r's at offset r * count. */
TDIST_API tdist_status_t tdist_all_gather(tdist_pg_t *pg, const void *sendbuf, void *recvbuf,
                                          size_t count, tdist_dtype_t dtype,
                                          const tdist_coll_opts_t *opts, tdist_work_t **work);

/* Uneven: rank r contributes recvcounts[r] elements (sendbuf), stored
 * packed in rank order in recvbuf. recvcounts has size entries, the same
 * on every rank. */
TDIST_API tdist_status_t tdist_all_gatherv(tdist_pg_t *pg, const void *sendbuf, void *recvbuf,
                                           const size_t *recvcounts, tdist_dtype_t dtype,
                                           const tdist_coll_opts_t *opts, tdist_work_t **work);

/* recvbuf (root only): size * count elements in rank order. */
TDIST_API tdist_status_t tdist_gather(tdist_pg_t *pg, const void *sendbuf, void *recvbuf,
                                      size_t count, tdist_dtype_t dtype, int root,
                                      const tdist_coll_opts_t *opts, tdist_work_t **work);

/* sendbuf (root only): size * count elements; rank r receives block r. */
TDIST_API tdist_status_t tdist_scatter(tdist_pg_t *pg, const void *sendbuf, void *recvbuf,
                                       size_t count, tdist_dtype_t dtype, int root,
                                       const tdist_coll_opts_t *opts, tdist_work_t **work);

/* sendbuf: size * recvcount elements; rank r's recvbuf = op of block r. */
TDIST_API tdist_status_t tdist_reduce_scatter(tdist_pg_t *pg, const void *sendbuf, void *recvbuf,
                                              size_t recvcount, tdist_dtype_t dtype,
                                              tdist_redop_t op, const tdist_coll_opts_t *opts,
                                              tdist_work_t **work);

/* Equal splits: count elements to and from every rank. */
TDIST_API tdist_status_t tdist_all_to_all(tdist_pg_t *pg, const void *sendbuf, void *recvbuf,
                                          size_t count, tdist_dtype_t dtype,
                                          const tdist_coll_opts_t *opts, tdist_work_t **work);

/* Uneven splits, packed: sendcounts[p] elements go to rank p,
 * recvcounts[p] come from rank p. What p sends to r must equal what r
 * expects from p (checked: a disagreement is TDIST_ERR_MISMATCH). */
TDIST_API tdist_status_t tdist_all_to_allv(tdist_pg_t *pg, const void *sendbuf,
                                           const size_t *sendcounts, void *recvbuf,
                                           const size_t *recvcounts, tdist_dtype_t dtype,
                                           const tdist_coll_opts_t *opts, tdist_work_t **work);

TDIST_API tdist_status_t tdist_barrier(tdist_pg_t *pg, const tdist_coll_opts_t *opts,
                                       tdist_work_t **work);

/* A barrier that, when its timeout passes, fails with TDIST_ERR_TIMEOUT
 * and a message naming every rank that did not arrive ("monitored_barrier:
 * ranks 2, 5 did not arrive within 3000 ms"). Blocking only. */
TDIST_API tdist_status_t tdist_monitored_barrier(tdist_pg_t *pg, const tdist_coll_opts_t *opts);

/* Coalesced: n buffers (in place), one op, one collective. */
TDIST_API tdist_status_t tdist_all_reduce_coalesced(tdist_pg_t *pg, void *const *bufs,
                                                    const size_t *counts, size_t n,
                                                    tdist_dtype_t dtype, tdist_redop_t op,
                                                    const tdist_coll_opts_t *opts,
                                                    tdist_work_t **work);
TDIST_API tdist_status_t tdist_broadcast_coalesced(tdist_pg_t *pg, void *const *bufs,
                                                   const size_t *counts, size_t n,
                                                   tdist_dtype_t dtype, int root,
                                                   const tdist_coll_opts_t *opts,
                                                   tdist_work_t **work);

/* All_reduce (SUM) of f32 values over a 16-bit wire: n buffers of
 * counts[i] f32 values each, in place, reduced as one flat vector of
 * sum(counts) elements; between the ranks (on the wire, in shared memory)
 * they travel as `wire` values (TDIST_F16 or TDIST_BF16), half the bytes
 * of f32. Rank r's value x goes on the wire as
 *     h_r = wire(fl(float(wire(x)) / divisor))
 * (round to nearest even; a NaN becomes the wire's quiet NaN: f16
 * sign|0x7E00, bf16 0x7FC0); the h_r are summed as a 16-bit all_reduce
 * sums them (each addition computed in f32 and rounded to the wire; with
 * 2 ranks one addition, with more in the algorithm's order: rank order on
 * shared memory), and every buffer of every rank receives float(sum) — the
 * same bits on every rank. divisor 1 is a plain cast; the world size gives
 * the average as PyTorch's fp16/bf16 compression hooks compute it. On
 * shared memory the values are packed while they are staged and unpacked
 * while the result is copied out: no pass of the caller's and no copy of
 * the whole vector; over TCP and other backends they are packed into the
 * group's scratch, reduced by the 16-bit all_reduce, unpacked.
 * The fingerprint compares the wire, the total count and the op, not how
 * a rank splits the vector into buffers. Blocking (work NULL) or
 * asynchronous; the buffers are borrowed until the work completes, the
 * bufs and counts arrays are copied. Errors: TDIST_ERR_INVALID_ARG (the
 * wire, a divisor not finite or not above 0, a NULL array or buffer),
 * before anything is sent; then as tdist_all_reduce. Thread-safe as the
 * other collectives. Example (a contiguous buffer of n f32 values,
 * averaged over 2 ranks with an f16 wire):
 *     void *b[1] = {grad}; size_t c[1] = {n};
 *     tdist_all_reduce_wire(pg, b, c, 1, TDIST_F16, 2.0, NULL, NULL); */
TDIST_API tdist_status_t tdist_all_reduce_wire(tdist_pg_t *pg, void *const *bufs,
                                               const size_t *counts, size_t n, tdist_dtype_t wire,
                                               double divisor, const tdist_coll_opts_t *opts,
                                               tdist_work_t **work);

/* Multi-buffer collectives (PyTorch's *_multigpu semantics), for a
 * process that drives k buffers of count elements each (worker threads',
 * devices'): the k buffers are reduced (or packed) locally first, in list
 * order, then ONE group collective runs, then the result is copied into
 * every buffer. Every rank passes the same k (not checked across ranks
 * for all_reduce, reduce and broadcast; all_gather's fingerprint carries
 * k x count). The caller owns every buffer; the buffers of a list must
 * not overlap one another. Blocking only (the call returns when this
 * rank's buffers hold the result); thread-safe as the collectives they
 * run (calls on one group run in issue order). A temporary of count
 * elements (all_gather: k x count) is allocated when k > 1.
 *
 * all_reduce_multi: every buffer of every rank ends with op over all
 * k x size buffers (local reduction in list order, then the group's
 * all_reduce: the same bits in every buffer of every rank). AVG divides
 * by k x size; PREMUL_SUM scales each rank's local sum by
 * opts->premul_factor. */
TDIST_API tdist_status_t tdist_all_reduce_multi(tdist_pg_t *pg, void *const *bufs, size_t k,
                                                size_t count, tdist_dtype_t dtype,
                                                tdist_redop_t op, const tdist_coll_opts_t *opts);
/* reduce_multi: only bufs[root_buf] on rank root receives the reduction
 * over all k x size buffers; every other buffer keeps its input. */
TDIST_API tdist_status_t tdist_reduce_multi(tdist_pg_t *pg, void *const *bufs, size_t k,
                                            size_t count, tdist_dtype_t dtype, tdist_redop_t op,
                                            int root, size_t root_buf,
                                            const tdist_coll_opts_t *opts);
/* broadcast_multi: every buffer of every rank ends with bufs[root_buf] of
 * rank root. */
TDIST_API tdist_status_t tdist_broadcast_multi(tdist_pg_t *pg, void *const *bufs, size_t k,
                                               size_t count, tdist_dtype_t dtype, int root,
                                               size_t root_buf, const tdist_coll_opts_t *opts);
/* all_gather_multi: sendbufs[i] holds count elements; every one of the k
 * recvbufs (size x k x count elements each) ends with every rank's every
 * input, rank-major: rank r's sendbufs[i] at (r x k + i) x count. */
TDIST_API tdist_status_t tdist_all_gather_multi(tdist_pg_t *pg, const void *const *sendbufs,
                                                void *const *recvbufs, size_t k, size_t count,
                                                tdist_dtype_t dtype,
                                                const tdist_coll_opts_t *opts);

/* Point to point. Ordered per pair of ranks and direction, outside the
 * group's collective order (they do not take a group sequence number; a
 * per-pair sequence and the fingerprint (dtype, count) are checked against
 * the matching recv: TDIST_ERR_MISMATCH, sticky for the group's p2p path).
 * They run on a second mesh and thread, so a pending recv never holds
 * back collectives or a later send; dst/src must be another rank. */
TDIST_API tdist_status_t tdist_send(tdist_pg_t *pg, const void *buf, size_t count,
                                    tdist_dtype_t dtype, int dst, const tdist_coll_opts_t *opts,
                                    tdist_work_t **work);
TDIST_API tdist_status_t tdist_recv(tdist_pg_t *pg, void *buf, size_t count, tdist_dtype_t dtype,
                                    int src, const tdist_coll_opts_t *opts, tdist_work_t **work);

/* ------------------------------------------------------- flight recorder
 *
 * Every group records its last TDIST_FR_SIZE (default 2048; 0: off)
 * collectives, sends, receives and marked events in a ring kept in a file
 * under TDIST_FR_DIR (default ${TMPDIR:-/tmp}/tdist-fr.<pid>, removed at
 * a clean exit), so even a killed process's last entries can be read.
 * The first failed collective of a process, SIGUSR1 and
 * tdist_flight_dump write them as JSON next to the rings; `tdist-fr DIR`
 * explains a hang from them (docs/debugging.md). */

/* Dump every group's ring of this process as JSON into the recorder's
 * directory, one file per group ("tdist-fr.r<world rank>.<group uid>.json",
 * replacing an earlier dump). reason (may be NULL) is copied into each
 * file; *n_files (may be NULL) gets the number written. Blocks for the
 * file writes only (never on other ranks); thread-safe. */
TDIST_API tdist_status_t tdist_flight_dump(const char *reason, int *n_files);

/* Record an event in pg's ring: what (the caller keeps it; its first 16
 * characters are kept, so give distinct names within them) and arg. DDP
 * records its buckets ("bucket_ready", "bucket_launched", "bucket_reduced"),
 * Join its notifications ("join_notify", "joined_notify"); a program may
 * mark its own ("optim_step_begin" and "optim_step_end": a name ending in
 * _begin or _end opens or closes a span in the timeline). Does not block;
 * thread-safe. The event also carries the group's last issued sequence
 * number. */
TDIST_API tdist_status_t tdist_pg_mark(tdist_pg_t *pg, const char *what, uint64_t arg);

#ifdef __cplusplus
}
#endif
#endif /* TDIST_PG_H */
