/*
 * fr/format.h — the flight recorder's file: what a recorder writes into
 * its mapping and what tdist-fr reads back, live, stopped or dead.
 *
 * One file per group per process: a header, then two rings of fixed-size
 * entries (capacity each): the group's collectives, at slot seq %
 * capacity (the group's sequence number places them: no shared counter
 * on a collective's path), then point-to-point operations and marked
 * events, at slot id % capacity of a counter (next). The writer only ever stores into the mapping (no system call
 * on the collective's path); the kernel keeps the pages when the process
 * dies, so a reader sees every entry stored before the death. An entry's
 * state is stored last (release), so a reader that sees a state sees the
 * fields written before it.
 *
 * The layout is host-endian with fixed-width fields; version changes when
 * it does.
 */
#ifndef TDIST_FR_FORMAT_H
#define TDIST_FR_FORMAT_H

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define TDIST__FR_MAGIC "TDISTFR"
#define TDIST__FR_VERSION 4u      /* of the ring file */
#define TDIST__FR_JSON_VERSION 1u /* of the JSON dumps (fr/dump.c) */

/* What an entry records. */
enum {
    TDIST__FR_COLL = 1,   /* a collective (group sequence number) */
    TDIST__FR_SEND = 2,   /* point-to-point (per-pair sequence number) */
    TDIST__FR_RECV = 3,
    TDIST__FR_EVENT = 4,  /* a marked event: DDP buckets, Join, the program's own */
};

/* An entry's flags: the collective's only wait ended while it spun, a
 * fraction of a microsecond after it started; its end is recorded as its
 * start (no clock read on the fast path). Written by coll/ (chosen[2]). */
#define TDIST__FR_ENDED_IN_SPIN 1u

/* An entry's state (and the slot of its timestamp in t_ns). */
enum {
    TDIST__FR_EMPTY = 0,
    TDIST__FR_QUEUED = 1,
    TDIST__FR_STARTED = 2,
    TDIST__FR_COMPLETED = 3,
    TDIST__FR_FAILED = 4,
};

/* An entry as the ring stores it: one cache line, so a call writes one
 * line of the ring (a bigger entry, or a ring bigger than about a quarter
 * of a CPU's L2, showed as tens of ns on an 8-byte all_reduce). */
typedef struct tdist__fr_slot {
    uint8_t state;        /* TDIST__FR_*; stored last (atomic release) */
    uint8_t kind;         /* TDIST__FR_COLL ... */
    uint8_t route;        /* coll/'s route (route_name), 255: not chosen yet */
    uint8_t algo;         /* coll/'s algorithm (algo_name) */
    uint8_t flags;        /* TDIST__FR_ENDED_IN_SPIN */
    uint8_t op;           /* the op's number (names in op_name below) */
    int8_t dtype;         /* tdist_dtype_t, -1: none */
    int8_t redop;         /* tdist_redop_t, -1: none */
    int32_t root;         /* root, or the peer of send / recv; -1: none */
    int32_t peer;         /* the peer a wait of this entry was last on (noted when the
                             wait stopped spinning); -1: none */
    uint32_t id;          /* low 32 bits of the entry's id: the group's sequence number
                             (collectives) or the counter's value (p2p, events) */
    union {
        int32_t status;   /* tdist_status_t when failed */
        float dt_wait;    /* before that, with peer >= 0: when the wait on peer stopped
                             spinning, after t_queued in the header's clock */
    };
    uint64_t seq;         /* group seq (coll), per-pair seq (p2p), event argument a */
    uint64_t count;       /* elements (total for v / coalesced forms); events: argument b */
    uint64_t t_queued;    /* when queued, in the header's clock */
    union {
        struct {
            uint64_t splits_hash; /* hash of the split sizes / counts (0: none) */
            /* when started / ended, after t_queued in the header's clock
             * (a float keeps 24 bits: exact to a tick up to 2^24 ticks,
             * then to 6e-8 of the span); meaningful once state says so */
            float dt_started, dt_ended;
        };
        char what[16];    /* events: what happened ("bucket_ready", ...), not terminated
                             when 16 long */
    };
} tdist__fr_slot_t;

_Static_assert(sizeof(tdist__fr_slot_t) == 64, "a ring entry is one cache line");

/* An entry as readers use it (dumps, tdist-fr): a slot decoded
 * (tdist__fr_decode), with one time per state. */
typedef struct tdist__fr_entry {
    uint32_t state;       /* TDIST__FR_* */
    uint32_t kind;        /* TDIST__FR_COLL ... */
    uint64_t id;          /* index of the entry since the ring began (0, 1, ...) */
    uint64_t seq;         /* group seq (coll), per-pair seq (p2p), event argument */
    uint64_t count;       /* elements (total for v / coalesced forms) */
    uint64_t splits_hash; /* hash of the split sizes / counts (0: none) */
    int32_t op;           /* the op's number (names in op_name below) */
    int32_t dtype;        /* tdist_dtype_t, -1: none */
    int32_t root;         /* root, or the peer of send / recv; -1: none */
    int32_t redop;        /* tdist_redop_t, -1: none */
    uint8_t route;        /* coll/'s route (route_name), 255: not chosen yet */
    uint8_t algo;         /* coll/'s algorithm (algo_name) */
    uint8_t flags;        /* TDIST__FR_ENDED_IN_SPIN */
    uint8_t pad;
    int32_t status;       /* tdist_status_t when failed */
    uint64_t t_ns[5];     /* time of each state (index: state), 0: not reached; in the
                             header's clock (tdist__fr_to_ns makes it CLOCK_MONOTONIC ns) */
    union {
        char what[24];    /* events: what happened ("bucket_ready", ...) */
        /* collectives: the peer a wait of this entry was last on, noted
         * when the wait stopped spinning (tdist__fr_note_wait) */
        struct {
            uint64_t tag;     /* id + 1 when peer and t_ns are this entry's; anything
                                 else (0, an older entry's, an event's text): no wait */
            int32_t peer;     /* group rank */
            uint32_t pad;
            uint64_t t_ns;    /* when, in the header's clock like t_ns above */
        } wait;
    };
} tdist__fr_entry_t;

/* Entry id's slot s (a copy), decoded into *e. */
static inline void tdist__fr_decode(const tdist__fr_slot_t *s, uint64_t id, tdist__fr_entry_t *e)
{
    *e = (tdist__fr_entry_t){.state = s->state, .kind = s->kind, .id = id, .seq = s->seq,
                             .count = s->count, .op = s->op, .dtype = s->dtype,
                             .root = s->root, .redop = s->redop, .route = s->route,
                             .algo = s->algo, .flags = s->flags,
                             .status = s->state == TDIST__FR_FAILED ? s->status : 0};
    e->t_ns[TDIST__FR_QUEUED] = s->t_queued;
    if (s->kind == TDIST__FR_EVENT) { /* recorded as completed when queued */
        for (int i = 0; i < 16 && s->what[i]; i++) e->what[i] = s->what[i];
        e->t_ns[TDIST__FR_COMPLETED] = s->t_queued;
        return;
    }
    e->splits_hash = s->splits_hash;
    if (s->peer >= 0) { /* a failed entry keeps the peer, not the time */
        e->wait.tag = id + 1;
        e->wait.peer = s->peer;
        e->wait.t_ns = s->state == TDIST__FR_FAILED ? 0 : s->t_queued + (uint64_t)s->dt_wait;
    }
    if (s->state >= TDIST__FR_STARTED)
        e->t_ns[TDIST__FR_STARTED] = s->t_queued + (uint64_t)s->dt_started;
    if (s->state >= TDIST__FR_COMPLETED && s->state <= TDIST__FR_FAILED)
        e->t_ns[s->state] = s->t_queued + (uint64_t)s->dt_ended;
}

typedef struct tdist__fr_header {
    char magic[8];        /* TDIST__FR_MAGIC */
    uint32_t version;
    uint32_t entry_size;  /* sizeof(tdist__fr_slot_t) */
    uint32_t capacity;    /* entries in each of the two rings (a power of two) */
    int32_t rank;         /* rank in the group */
    int32_t size;         /* group size */
    int32_t world_rank;
    int32_t pid;
    int32_t transport;    /* 0 shm, 1 tcp, 2 another backend */
    int32_t closed;       /* 1: the group was destroyed (the process did not die in it) */
    uint64_t mono0_ns;    /* CLOCK_MONOTONIC when the recorder opened */
    uint64_t real0_ns;    /* CLOCK_REALTIME at the same moment */
    uint64_t next;        /* p2p and events started so far (atomic): slot capacity + id % capacity */
    uint32_t clock;       /* entries' times: 0 CLOCK_MONOTONIC ns; 1 TSC ticks */
    uint32_t pad;
    uint64_t tsc0;        /* TSC ticks at mono0_ns (clock 1) */
    char group[64];       /* the group's name */
    char uid[64];         /* the group's uid (same on every rank) */
    char host[64];
    char backend[16];     /* "native" or the backend's name */
    char pad_to_line[24]; /* the ring after it starts on a cache line */
} tdist__fr_header_t;

/* The entries follow the header: each one cache line, not two halves
 * (a ring larger than the L1 cache would miss twice a call, and the
 * next entry's prefetch would fetch the wrong line). */
_Static_assert(sizeof(tdist__fr_header_t) % 64 == 0, "the ring starts on a cache line");

/* Whether e's wait fields are its own (a wait of it noted its peer). */
static inline bool tdist__fr_waited(const tdist__fr_entry_t *e)
{
    return e->kind != TDIST__FR_EVENT && e->wait.tag == e->id + 1;
}

/* The time-stamp counter (clock 1): invariant and shared by every CPU
 * where the recorder uses it (x86-64 with constant_tsc and nonstop_tsc).
 * One read costs a fraction of a clock_gettime. */
static inline uint64_t tdist__fr_rdtsc(void)
{
#if defined(__x86_64__)
    uint32_t lo, hi;
    __asm__ __volatile__("rdtsc" : "=a"(lo), "=d"(hi));
    return ((uint64_t)hi << 32) | lo;
#else
    return 0;
#endif
}

/* Entry time t of a ring with header h as CLOCK_MONOTONIC ns, given a
 * later pair (tsc_now, mono_now) read on the same host: the counter's
 * rate is taken over the ring's whole life. */
static inline uint64_t tdist__fr_to_ns(const tdist__fr_header_t *h, uint64_t t, uint64_t tsc_now,
                                       uint64_t mono_now)
{
    if (h->clock == 0 || t == 0) return t;
    if (tsc_now <= h->tsc0 || mono_now <= h->mono0_ns) return h->mono0_ns;
    double ns_per_tick = (double)(mono_now - h->mono0_ns) / (double)(tsc_now - h->tsc0);
    double d = (double)(int64_t)(t - h->tsc0) * ns_per_tick;
    return (uint64_t)((double)h->mono0_ns + d);
}

/* Slot e of a ring that may be written meanwhile (a live process),
 * decoded into *out: copied word by word and kept only if its id did not
 * change during the copy (a field written during it is either value,
 * each a whole word); false if empty or torn. That race is the design,
 * so this function alone is not instrumented for ThreadSanitizer (and
 * copies through volatile words, not memcpy, which it would intercept). */
#if defined(__GNUC__)
__attribute__((no_sanitize("thread")))
#endif
static inline bool tdist__fr_read_slot(const tdist__fr_slot_t *e, tdist__fr_entry_t *out)
{
    _Static_assert(sizeof *e % sizeof(uint64_t) == 0, "an entry is whole words");
    const volatile tdist__fr_slot_t *v = e;
    const volatile uint64_t *src = (const volatile uint64_t *)(const volatile void *)e;
    uint64_t words[sizeof *e / sizeof(uint64_t)];
    uint32_t id = v->id;
    for (size_t i = 0; i < sizeof words / sizeof words[0]; i++) words[i] = src[i];
    tdist__fr_slot_t copy;
    memcpy(&copy, words, sizeof copy);
    if (copy.state == TDIST__FR_EMPTY || copy.id != id || v->id != id) return false;
    tdist__fr_decode(&copy, id, out);
    return true;
}

static inline int tdist__fr_by_time(const void *x, const void *y)
{
    const tdist__fr_entry_t *a = x, *b = y;
    uint64_t ta = a->t_ns[TDIST__FR_QUEUED], tb = b->t_ns[TDIST__FR_QUEUED];
    if (ta != tb) return ta < tb ? -1 : 1;
    return a->kind != b->kind ? (a->kind < b->kind ? -1 : 1) : (a->id > b->id) - (a->id < b->id);
}

/* Every entry of the two rings after header h (ring: 2 x h->capacity
 * slots) into out (room for as many), oldest first; how many. */
static inline size_t tdist__fr_collect(const tdist__fr_header_t *h, const tdist__fr_slot_t *ring,
                                       tdist__fr_entry_t *out)
{
    size_t n = 0;
    for (size_t i = 0; i < 2 * (size_t)h->capacity; i++)
        if (tdist__fr_read_slot(&ring[i], &out[n])) n++;
    qsort(out, n, sizeof *out, tdist__fr_by_time);
    return n;
}

/* Names (the recorder's numbers are coll/'s enums, kept in step here). */
static const char *const tdist__fr_op_names[] = {
    "none", "broadcast", "all_reduce", "reduce", "all_gather", "all_gatherv", "gather",
    "scatter", "reduce_scatter", "all_to_all", "all_to_allv", "barrier", "monitored_barrier",
    "all_reduce_coalesced", "broadcast_coalesced", "send", "recv", "all_reduce_wire"};
static const char *const tdist__fr_route_names[] = {"native", "backend", "hierarchical",
                                                    "fused", "monitored", "shm_line"};
static const char *const tdist__fr_algo_names[] = {
    "none", "slot", "ring", "rd", "direct", "shm", "shm_tiny", "shm_small", "bcast_tree",
    "bcast_chain", "bcast_shm", "reduce_tree", "reduce_rsg", "reduce_shm", "op", "monitored",
    "rs_shm", "rs_direct"};
static const char *const tdist__fr_state_names[] = {"empty", "queued", "started", "completed",
                                                    "failed"};
static const char *const tdist__fr_dtype_names[] = {"f32", "f64", "f16", "bf16",
                                                    "i8", "u8", "i32", "i64"};
static const char *const tdist__fr_redop_names[] = {"sum", "prod", "min", "max", "avg",
                                                    "band", "bor", "bxor", "premul_sum"};

#define TDIST__FR_NAME(tab, i) \
    ((i) >= 0 && (size_t)(i) < sizeof(tab) / sizeof(tab[0]) ? (tab)[i] : "?")

#endif /* TDIST_FR_FORMAT_H */
