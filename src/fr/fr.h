/*
 * fr/fr.h — the flight recorder (internal): per group, a ring of the last
 * collectives, point-to-point operations and marked events, in a
 * file-backed mapping that outlives the process (format.h), and the JSON
 * dumps of every open recorder.
 *
 * Knows nothing of pg: its callers hand it plain numbers. Always on;
 * TDIST_FR_SIZE=0 turns it off (then tdist__fr_open returns NULL and
 * every call below takes NULL and does nothing). Configuration
 * (TDIST_FR_SIZE, TDIST_FR_DIR) is read once per process.
 *
 * Threads: the caller serialises tdist__fr_begin and tdist__fr_event on
 * one ring (pg calls them under the group's lock), so claiming an entry
 * needs no locked instruction; an entry is then written only by the thread
 * that runs its operation. Open / close / dump take the registry's lock;
 * a dump reads entries being written and skips those it catches midway.
 */
#ifndef TDIST_FR_FR_H
#define TDIST_FR_FR_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "core/internal.h"
#include "fr/format.h"

typedef struct tdist__fr tdist__fr_t;

/* The recorder's clock (format.h: the header's clock field). */
extern bool tdist__fr_use_tsc;

static inline uint64_t tdist__fr_now(void)
{
    return tdist__fr_use_tsc ? tdist__fr_rdtsc() : tdist__now_ns();
}

struct tdist__fr {
    tdist__fr_header_t *hdr;   /* the mapping */
    tdist__fr_entry_t *ring;   /* hdr->capacity entries after it */
    uint32_t cap;
    size_t map_len;
    char *path;
    bool unlink_at_close;      /* the file is in the per-process directory */
    uint64_t wait_from;        /* tdist__fr_note_wait: where its search starts (the
                                  last entry it found; only its caller touches it) */
    struct tdist__fr *next;    /* the registry of open recorders */
};

/* What a recorder is for. */
typedef struct tdist__fr_ident {
    const char *group, *uid, *backend;
    int rank, size, world_rank;
    int transport; /* 0 shm, 1 tcp, 2 another backend */
} tdist__fr_ident_t;

/* A recorder for one group; NULL when the recorder is off or its file
 * cannot be made (a recorder never fails a group; the reason is logged at
 * debug level). */
tdist__fr_t *tdist__fr_open(const tdist__fr_ident_t *id);

/* Unmap; the file stays when TDIST_FR_DIR named the directory, else it is
 * removed (a clean exit leaves nothing behind). NULL does nothing. */
void tdist__fr_close(tdist__fr_t *fr);

/* Claim the next entry (serialised by the caller) and record it as queued; its index (for the calls
 * below), or UINT64_MAX when fr is NULL. */
uint64_t tdist__fr_begin(tdist__fr_t *fr, uint32_t kind, int op, uint64_t seq, uint64_t count,
                         int dtype, int root, int redop, uint64_t splits_hash);

static inline tdist__fr_entry_t *tdist__fr_at(tdist__fr_t *fr, uint64_t id)
{
    if (!fr || id == UINT64_MAX) return NULL;
    tdist__fr_entry_t *e = &fr->ring[id & (fr->cap - 1)]; /* cap: a power of two */
    return e->id == id ? e : NULL; /* overwritten by a later entry: nothing to do */
}

/* The entry reached state (STARTED, COMPLETED, FAILED): its timestamp
 * (now; or, with same_as_queued, the queued one: a call run at once on
 * the caller's thread saves a clock read), then the state (release). */
static inline void tdist__fr_state_at(tdist__fr_t *fr, uint64_t id, uint32_t state, int status,
                                      bool same_as_queued)
{
    tdist__fr_entry_t *e = tdist__fr_at(fr, id);
    if (!e) return;
    e->t_ns[state] = same_as_queued ? e->t_ns[TDIST__FR_QUEUED] : tdist__fr_now();
    if (state == TDIST__FR_FAILED) e->status = status;
    atomic_store_explicit((_Atomic uint32_t *)&e->state, state, memory_order_release);
}

static inline void tdist__fr_state(tdist__fr_t *fr, uint64_t id, uint32_t state, int status)
{
    tdist__fr_state_at(fr, id, state, status, false);
}

/* The route and algorithm coll/ chose for the entry. */
static inline void tdist__fr_route(tdist__fr_t *fr, uint64_t id, int route, int algo)
{
    tdist__fr_entry_t *e = tdist__fr_at(fr, id);
    if (!e) return;
    e->route = (uint8_t)route;
    e->algo = (uint8_t)algo;
}

/* A one-off event (DDP bucket ready / launched / reduced, a Join
 * notification, the program's own marks): recorded as completed. */
void tdist__fr_event(tdist__fr_t *fr, const char *what, uint64_t a, uint64_t b);

/* A wait of the group's running collective stopped spinning: note the
 * peer (group rank) it waits on in that collective's entry (the oldest
 * started, not ended one), with the time. Slow path only (the transport
 * calls it, through pg, before it yields or sleeps), on the thread that
 * runs the collective; a dump or tdist-fr then says "waiting on rank N".
 * fr NULL, or no such entry: nothing. */
void tdist__fr_note_wait(tdist__fr_t *fr, int peer);

/* Write one JSON file per open recorder into the dump directory
 * (TDIST_FR_DIR, else the per-process one): "<dir>/tdist-fr.r<world
 * rank>.<uid>.json", written to a temporary name and renamed. reason goes
 * into each file. Without force (a failure), only when TDIST_FR_DIR names
 * the directory, and only the process's first failure dumps. Returns the number written, -1 on an
 * error (tdist_last_error says which). Takes the registry's lock; does not
 * block on anything else. */
int tdist__fr_dump_all(const char *reason, bool force);

/* Whether recorders opened from now on record (true unless TDIST_FR_SIZE
 * is 0). For measuring the recorder's cost against none in one process
 * (bench/fr_cost.c); thread-safe. */
void tdist__fr_enable(bool on);

/* The directory dumps and rings go to (for messages). */
const char *tdist__fr_dir(void);

#endif /* TDIST_FR_FR_H */
