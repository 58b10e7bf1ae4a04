/*
 * backend/backend.h — the table another backend fills to run a group's
 * communication (internal). The MPI backend (src/backend/mpi/, a loadable
 * module) is one; a future NCCL or UCC backend is one more table.
 *
 * pg/ keeps everything a group is, for every backend: the group struct,
 * order and sequence numbers, fingerprints (rule 2: checked through the
 * backend's own all_to_all and all_gather slots), deadlines, work objects,
 * the engine and p2p threads, failures. A backend sees only its own state
 * (`be`) and what each call hands it: the group's rank and size in a
 * coll/ context, a collective's arguments, a send or recv. It never sees
 * struct tdist_pg.
 *
 * Collective slots (coll/coll.h, tdist__coll_slots_t): one optional
 * function per collective; an empty slot means the native algorithm,
 * which needs the group's native mesh (a backend group has none, so there
 * an empty slot is TDIST_ERR_NOT_SUPPORTED naming the backend and the op).
 *
 * pg's own exchanges (the fingerprint check and all_to_allv's pairwise
 * round, pg/check.c) call the all_to_all and all_gather slots with chk
 * NULL; a program's collectives always come with pg's check. A backend
 * may run the former as messages per peer, so that its waits can say
 * whom they wait on (on_wait below).
 *
 * Point-to-point: pg's p2p thread posts each send or recv (pg's 24-byte
 * header, then the payload) with p2p_post, polls it with p2p_test, pauses
 * with p2p_idle between polls, and ends it with p2p_release.
 */
#ifndef TDIST_BACKEND_H
#define TDIST_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "coll/coll.h"
#include "core/internal.h"
#include "tdist/init.h"
#include "tdist/pg.h"

/* One send or recv as pg hands it to a backend. */
typedef struct tdist__be_p2p {
    bool send;
    int peer;           /* group rank */
    void *hdr;          /* pg's header: sent first / received into */
    size_t hdr_len;
    void *buf;          /* payload: sendbuf or recvbuf */
    size_t count;
    tdist_dtype_t dtype;
    void *state;        /* the backend's (its requests), set by p2p_post */
} tdist__be_p2p_t;

typedef struct tdist__backend {
    const char *name;
    /* The backend's state of this process's world group: *rank and *size
     * in it (the world's). Blocks until the backend is up. */
    tdist_status_t (*create_world)(tdist_world_t *world, void **be, int *rank, int *size);
    /* A subgroup of parent (members: parent ranks in subgroup order; only
     * members call it; tag: the same on every member for this creation,
     * different for the parent's next). */
    tdist_status_t (*create_sub)(void *parent, const int *members, int n, int tag, void **be);
    const tdist__coll_slots_t *coll; /* its collective slots */
    /* Post op (the header, then the payload); TDIST_OK or an error (the
     * op is then over: no release). */
    tdist_status_t (*p2p_post)(void *be, tdist__be_p2p_t *op);
    /* Poll op once: TDIST_INPROGRESS, TDIST_OK (all of it done) or an
     * error (tdist's last error says why); *hdr_in: the header is in (a
     * recv's, to check before the payload is trusted). */
    tdist_status_t (*p2p_test)(void *be, tdist__be_p2p_t *op, bool *hdr_in);
    /* op is over (failed: not by completion): let go of it — a recv still
     * posted is cancelled, bounded — and free its state unless the
     * backend's library may still write into it. */
    void (*p2p_release)(void *be, tdist__be_p2p_t *op, bool failed);
    /* Pause between polls (the p2p thread has had nothing for idle_us). */
    void (*p2p_idle)(void *be, int64_t idle_us);
    /* Buffers pg handed to the backend may still be written by requests
     * the backend had to leave pending (after a timeout or abort): pg must
     * not free them. */
    bool (*holds_memory)(void *be);
    /* Optional: the flight recorder's hook, set once when the group opens
     * its recorder. The backend calls fn(arg, peer) on the thread running
     * a collective slot, once a wait of it stops spinning, with the group
     * rank it waits on (-1: no longer on anyone); never on a wait's fast
     * path. NULL: the backend cannot tell. */
    void (*on_wait)(void *be, void (*fn)(void *arg, int peer), void *arg);
    void (*destroy)(void *be); /* engine and p2p thread stopped */
} tdist__backend_t;

/* backend/backend.c: the backend of a new world group: opts->backend, else
 * TDIST_BACKEND, else native (*out = NULL). */
tdist_status_t tdist__backend_for_world(tdist_world_t *world, const tdist_pg_opts_t *opts,
                                        const tdist__backend_t **out);

#endif /* TDIST_BACKEND_H */
