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
 * Threads: tdist__fr_begin and tdist__fr_event claim an entry with one
 * atomic increment (any thread); an entry is then written only by the
 * thread that runs its operation. Open / close / dump take the registry's lock;
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
    tdist__fr_slot_t *ring;    /* 2 x hdr->capacity entries after it (format.h) */
    uint32_t cap;
    size_t map_len;
    char *path;
    bool unlink_at_close;      /* the file is in the per-process directory */
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

/* Entry ids: a collective's is its sequence number with this bit set;
 * p2p operations' and events' are the counter's values. */
#define TDIST__FR_COLL_ID ((uint64_t)1 << 63)

/* The slot of entry id. */
static inline tdist__fr_slot_t *tdist__fr_slot_of(tdist__fr_t *fr, uint64_t id)
{
    uint64_t mask = fr->cap - 1; /* cap: a power of two */
    return (id & TDIST__FR_COLL_ID) ? &fr->ring[id & mask] : &fr->ring[fr->cap + (id & mask)];
}

/* Record entry id in slot e, queued at t_queued (the recorder's clock), in
 * state QUEUED, or STARTED at that time (a call run at once on its
 * caller's thread, whose clock was read when it was made). */
static inline void tdist__fr_fill(tdist__fr_slot_t *e, uint64_t id, uint32_t kind, int op,
                                  uint64_t seq, uint64_t count, int dtype, int root, int redop,
                                  uint64_t splits_hash, uint32_t state, uint64_t t_queued)
{
    /* a reader that sees state EMPTY skips the entry while it is rewritten */
    atomic_store_explicit((_Atomic uint8_t *)&e->state, TDIST__FR_EMPTY, memory_order_relaxed);
    atomic_signal_fence(memory_order_release);
    e->kind = (uint8_t)kind;
    e->route = 255;
    e->algo = 0;
    e->flags = 0;
    e->op = (uint8_t)op;
    e->dtype = (int8_t)dtype;
    e->redop = (int8_t)redop;
    e->root = root;
    e->peer = -1;
    e->id = (uint32_t)id;
    e->status = 0;
    e->seq = seq;
    e->count = count;
    e->t_queued = t_queued;
    e->splits_hash = splits_hash;
    e->dt_started = 0.0f;
    atomic_store_explicit((_Atomic uint8_t *)&e->state, (uint8_t)state, memory_order_release);
}

/* A collective of the group, sequence number seq (unique in the group),
 * queued: its entry id, or UINT64_MAX when fr is NULL. Called by the
 * thread that gave out seq; no shared counter. */
static inline uint64_t tdist__fr_begin_coll(tdist__fr_t *fr, int op, uint64_t seq,
                                            uint64_t count, int dtype, int root, int redop)
{
    if (!fr) return UINT64_MAX;
    uint64_t id = seq | TDIST__FR_COLL_ID;
    tdist__fr_fill(tdist__fr_slot_of(fr, id), id, TDIST__FR_COLL, op, seq, count, dtype, root,
                   redop, 0, TDIST__FR_QUEUED, tdist__fr_now());
    return id;
}

/* A p2p operation (kind TDIST__FR_SEND / _RECV) queued: its entry id (one
 * atomic increment of the counter; any thread), or UINT64_MAX when fr is
 * NULL. */
static inline uint64_t tdist__fr_begin(tdist__fr_t *fr, uint32_t kind, int op, uint64_t seq,
                                       uint64_t count, int dtype, int root, int redop)
{
    if (!fr) return UINT64_MAX;
    uint64_t id = atomic_fetch_add_explicit((_Atomic uint64_t *)&fr->hdr->next, 1,
                                            memory_order_relaxed) & ~TDIST__FR_COLL_ID;
    tdist__fr_fill(tdist__fr_slot_of(fr, id), id, kind, op, seq, count, dtype, root, redop, 0,
                   TDIST__FR_QUEUED, tdist__fr_now());
    return id;
}

static inline tdist__fr_slot_t *tdist__fr_at(tdist__fr_t *fr, uint64_t id)
{
    if (!fr || id == UINT64_MAX) return NULL;
    tdist__fr_slot_t *e = tdist__fr_slot_of(fr, id);
    return e->id == (uint32_t)id ? e : NULL; /* overwritten by a later entry: nothing to do */
}

/* The entry reached state (STARTED, COMPLETED, FAILED): its time (now;
 * or, with same_as_queued, the queued one: a call run at once on the
 * caller's thread saves a clock read), then the state (release). */
static inline void tdist__fr_state_at(tdist__fr_t *fr, uint64_t id, uint32_t state, int status,
                                      bool same_as_queued)
{
    tdist__fr_slot_t *e = tdist__fr_at(fr, id);
    if (!e) return;
    float dt = same_as_queued ? 0.0f : (float)(int64_t)(tdist__fr_now() - e->t_queued);
    if (state == TDIST__FR_STARTED)
        e->dt_started = dt;
    else
        e->dt_ended = dt;
    if (state == TDIST__FR_FAILED) e->status = status;
    atomic_store_explicit((_Atomic uint8_t *)&e->state, (uint8_t)state, memory_order_release);
}

static inline void tdist__fr_state(tdist__fr_t *fr, uint64_t id, uint32_t state, int status)
{
    tdist__fr_state_at(fr, id, state, status, false);
}

/* The entry completed (status OK) or failed: like tdist__fr_state, but a
 * collective that completed in its wait's spin (TDIST__FR_ENDED_IN_SPIN)
 * ends at its start, without a clock read. */
static inline void tdist__fr_end(tdist__fr_t *fr, uint64_t id, int status)
{
    tdist__fr_slot_t *e = tdist__fr_at(fr, id);
    if (!e) return;
    /* The next entry's line, fetched now, off the next call's path: a
     * ring of thousands of entries outgrows the L1 cache, and a store
     * that misses it holds up the next locked instruction. */
    __builtin_prefetch(tdist__fr_slot_of(fr, id + 1), 1, 3);
    if (status == 0 && (e->flags & TDIST__FR_ENDED_IN_SPIN)) {
        e->dt_ended = e->dt_started;
        atomic_store_explicit((_Atomic uint8_t *)&e->state, TDIST__FR_COMPLETED,
                              memory_order_release);
        return;
    }
    tdist__fr_state_at(fr, id, status == 0 ? TDIST__FR_COMPLETED : TDIST__FR_FAILED, status,
                       false);
}

/* The route and algorithm coll/ chose for the entry. */
static inline void tdist__fr_route(tdist__fr_t *fr, uint64_t id, int route, int algo)
{
    tdist__fr_slot_t *e = tdist__fr_at(fr, id);
    if (!e) return;
    e->route = (uint8_t)route;
    e->algo = (uint8_t)algo;
}

/* A one-off event (DDP bucket ready / launched / reduced, a Join
 * notification, the program's own marks): recorded as completed. */
void tdist__fr_event(tdist__fr_t *fr, const char *what, uint64_t a, uint64_t b);

/* A wait of the group's running collective (entry id) stopped spinning:
 * note the peer (group rank) it waits on in that entry, with the time.
 * Slow path only (the transport calls it, through pg, before it yields or
 * sleeps), on the thread that runs the collective; a dump or tdist-fr
 * then says "waiting on rank N". fr NULL, or id no longer started:
 * nothing. */
void tdist__fr_note_wait(tdist__fr_t *fr, uint64_t id, int peer);

/* Write one JSON file per open recorder into the dump directory
 * (TDIST_FR_DIR, else the per-process one): "<dir>/tdist-fr.r<world
 * rank>.<uid>.json", written to a temporary name and renamed. reason goes
 * into each file. Without force (a failure), only when TDIST_FR_DIR names
 * the directory, and only the process's first failure dumps. Returns the number written, -1 on an
 * error (tdist_last_error says which). Takes the registry's lock; does not
 * block on anything else. */
int tdist__fr_dump_all(const char *reason, bool force);

/* Wait, up to ms, until no thread is inside tdist__fr_dump_all: a SIGTERM
 * that finds a failure's dump under way (which its own dump does not
 * repeat) lets it finish before the process dies. true when none is. */
bool tdist__fr_dump_settle(int ms);

/* Whether recorders opened from now on record (true unless TDIST_FR_SIZE
 * is 0). For measuring the recorder's cost against none in one process
 * (bench/fr_cost.c); thread-safe. */
void tdist__fr_enable(bool on);

/* The directory dumps and rings go to (for messages). */
const char *tdist__fr_dir(void);

#endif /* TDIST_FR_FR_H */
