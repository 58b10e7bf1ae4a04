/*
 * fr/format.h — the flight recorder's file: what a recorder writes into
 * its mapping and what tdist-fr reads back, live, stopped or dead.
 *
 * One file per group per process: a header, then a ring of fixed-size
 * entries. The writer only ever stores into the mapping (no system call
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

#define TDIST__FR_MAGIC "TDISTFR"
#define TDIST__FR_VERSION 1u

/* What an entry records. */
enum {
    TDIST__FR_COLL = 1,   /* a collective (group sequence number) */
    TDIST__FR_SEND = 2,   /* point-to-point (per-pair sequence number) */
    TDIST__FR_RECV = 3,
    TDIST__FR_EVENT = 4,  /* a marked event: DDP buckets, Join, the program's own */
};

/* An entry's state (and the slot of its timestamp in t_ns). */
enum {
    TDIST__FR_EMPTY = 0,
    TDIST__FR_QUEUED = 1,
    TDIST__FR_STARTED = 2,
    TDIST__FR_COMPLETED = 3,
    TDIST__FR_FAILED = 4,
};

typedef struct tdist__fr_entry {
    uint32_t state;       /* TDIST__FR_*; stored last (atomic release) */
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
    uint8_t pad[2];
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

_Static_assert(sizeof(tdist__fr_entry_t) == 128, "an entry is two cache lines");

typedef struct tdist__fr_header {
    char magic[8];        /* TDIST__FR_MAGIC */
    uint32_t version;
    uint32_t entry_size;  /* sizeof(tdist__fr_entry_t) */
    uint32_t capacity;    /* entries in the ring */
    int32_t rank;         /* rank in the group */
    int32_t size;         /* group size */
    int32_t world_rank;
    int32_t pid;
    int32_t transport;    /* 0 shm, 1 tcp, 2 another backend */
    int32_t closed;       /* 1: the group was destroyed (the process did not die in it) */
    uint64_t mono0_ns;    /* CLOCK_MONOTONIC when the recorder opened */
    uint64_t real0_ns;    /* CLOCK_REALTIME at the same moment */
    uint64_t next;        /* entries started so far (atomic): ring slot = id % capacity */
    uint32_t clock;       /* entries' times: 0 CLOCK_MONOTONIC ns; 1 TSC ticks */
    uint32_t pad;
    uint64_t tsc0;        /* TSC ticks at mono0_ns (clock 1) */
    char group[64];       /* the group's name */
    char uid[64];         /* the group's uid (same on every rank) */
    char host[64];
    char backend[16];     /* "native" or the backend's name */
} tdist__fr_header_t;

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

/* Names (the recorder's numbers are coll/'s enums, kept in step here). */
static const char *const tdist__fr_op_names[] = {
    "none", "broadcast", "all_reduce", "reduce", "all_gather", "all_gatherv", "gather",
    "scatter", "reduce_scatter", "all_to_all", "all_to_allv", "barrier", "monitored_barrier",
    "all_reduce_coalesced", "broadcast_coalesced", "send", "recv"};
static const char *const tdist__fr_route_names[] = {"native", "backend", "hierarchical",
                                                    "fused", "monitored", "shm_line"};
static const char *const tdist__fr_algo_names[] = {
    "none", "slot", "ring", "rd", "direct", "shm", "shm_tiny", "shm_small", "bcast_tree",
    "bcast_chain", "bcast_shm", "bcast_shm_tiny", "reduce_tree", "reduce_rsg", "reduce_shm",
    "op", "monitored"};
static const char *const tdist__fr_state_names[] = {"empty", "queued", "started", "completed",
                                                    "failed"};
static const char *const tdist__fr_dtype_names[] = {"f32", "f64", "f16", "bf16",
                                                    "i8", "u8", "i32", "i64"};
static const char *const tdist__fr_redop_names[] = {"sum", "prod", "min", "max", "avg",
                                                    "band", "bor", "bxor", "premul_sum"};

#define TDIST__FR_NAME(tab, i) \
    ((i) >= 0 && (size_t)(i) < sizeof(tab) / sizeof(tab[0]) ? (tab)[i] : "?")

#endif /* TDIST_FR_FORMAT_H */
