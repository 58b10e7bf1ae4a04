/*
 * backend/mpi/mpi_internal.h — the MPI backend's group state, shared by
 * mpi_group.c (create world / subgroup, abort, destroy, send / recv) and
 * mpi_coll.c (fingerprints and collectives).
 *
 * A group owns three duplicates of its communicator, all with
 * MPI_ERRORS_RETURN:
 *   coll  the collective slots': pg's fingerprint exchange, collectives,
 *         monitored_barrier (one at a time: pg serialises a group's
 *         collectives);
 *   p2p   pg's p2p thread's send / recv (pg's header, then the payload);
 *   mgmt  the caller's thread: MPI_Comm_create_group of subgroups, so
 *         group creation never races with the engine's collectives.
 *
 * Every wait polls MPI_Test until done, the work's deadline, or an abort:
 * it spins for 10 ms (not when the node has more ranks than CPUs), then
 * sched_yield()s between polls, then after 200 ms sleeps 100 us .. 1 ms,
 * so 8 ranks on 2 cores make progress instead of spinning each other out.
 * MPI cannot cancel a pending collective: after a timeout or an abort its
 * requests and the buffers they use are left to MPI (the group is failed
 * for good, the memory is never freed: "leaked").
 */
#ifndef TDIST_BACKEND_MPI_INTERNAL_H
#define TDIST_BACKEND_MPI_INTERNAL_H

#include <mpi.h>

#include "backend/mpi/mpi_backend.h"

typedef struct tdist__mpib {
    MPI_Comm coll, p2p, mgmt;
    bool oversub;        /* more ranks on this node than CPUs */
    bool leaked;         /* requests left pending: keep the memory they may write */
    /* engine-side scratch (grows; NULL until needed) */
    void *tmp;
    size_t tmp_len;
    int *ic, *id, *ic2, *id2; /* size entries: counts / displacements */
    MPI_Request *xr;          /* 2 x size entries: pg's exchanges' requests ... */
    int *xpeer;               /* ... and the rank each is with */
    /* pg's flight-recorder hook (backend.h on_wait): the peer a wait of
     * the running collective is on; NULL: none */
    void (*on_wait)(void *arg, int peer);
    void *on_wait_arg;
} tdist__mpib_t;

/* "MPI_Xxx failed: <MPI's error string>" with status st. */
tdist_status_t tdist__mpi_error(int rc, tdist_status_t st, const char *what);

/* Wait for n requests (entries may be MPI_REQUEST_NULL) until done, the
 * deadline (TDIST_ERR_TIMEOUT naming what and timeout_ms), *aborted
 * (TDIST_ERR_ABORTED) or an MPI error. On timeout / abort the pending
 * requests stay with MPI and b->leaked is set. */
tdist_status_t tdist__mpi_wait(const _Atomic bool *aborted, tdist__mpib_t *b, MPI_Request *r,
                               int n, int64_t deadline_ms, int64_t timeout_ms, const char *what);

/* tdist__mpi_wait that says whom it waits on: peer[i] is the group rank
 * request i involves (receives first, then sends, each in rank order).
 * Once the wait stops spinning (the pause below no longer spins), it
 * notes through b->on_wait the peer of the first request still pending,
 * again whenever that changes; *noted: the last peer noted (-1: none). */
tdist_status_t tdist__mpi_wait_peers(const _Atomic bool *aborted, tdist__mpib_t *b, MPI_Request *r,
                                     const int *peer, int n, int64_t deadline_ms,
                                     int64_t timeout_ms, const char *what, int *noted);

/* One poll's pause (see above): waited_us since the wait began. */
void tdist__mpi_backoff(const tdist__mpib_t *b, int64_t waited_us);

/* The MPI datatype that carries dtype (f16 and bf16: MPI_UINT16_T). */
MPI_Datatype tdist__mpi_dtype(tdist_dtype_t dtype);

/* Microseconds, monotonic. */
int64_t tdist__mpi_now_us(void);

/* mpi_world.c: tdist_init for a world mpirun started, and its leaving
 * (init/mpi_world.h says what they do). */
tdist_status_t tdist__mpim_world_init(const char *url, const tdist_init_opts_t *opts,
                                      tdist_world_t **out);
void tdist__mpim_world_leave(tdist_world_t *w);

/* mpi_coll.c: the table's collective slots. */
extern const tdist__coll_slots_t tdist__mpi_slots;

#endif /* TDIST_BACKEND_MPI_INTERNAL_H */
