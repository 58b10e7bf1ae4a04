/*
 * pg/internal.h — process groups: the group and work structs shared by
 * group.c (create / new_group / split / destroy / abort), engine.c (the
 * ordered progress engine and work handles), check.c (fingerprints),
 * p2p.c (send / recv on the group's second mesh) and api.c (the public
 * collective entry points and their argument checks).
 *
 * Threads of a group:
 *  - the caller's thread: argument checks, sequence numbers, queueing;
 *  - the engine thread: runs the queued collectives one at a time, in
 *    issue order, on the collective mesh (tp);
 *  - the p2p thread (started on the first send/recv): drives the p2p mesh.
 * pg->mu guards the queue, the sticky error, the abort/stop flags and the
 * mesh pointers (abort may run on any thread while the engine destroys a
 * failed mesh).
 */
#ifndef TDIST_PG_INTERNAL_H
#define TDIST_PG_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/internal.h"
#include "tdist/pg.h"
#include "backend/backend.h"
#include "coll/coll.h"
#include "fr/fr.h"
#include "pg/join_iface.h"
#include "transport/transport.h"


/* The fixed-size fingerprint every rank sends every peer before a
 * collective (host byte order). The common part is the same in every
 * copy a rank sends; send_to_you / recv_from_you are per peer
 * (all_to_allv: "I send you s elements / I expect r from you"). */
typedef struct tdist__fp {
    uint32_t magic;
    uint32_t op;
    uint64_t uid_hash;
    uint64_t seq;
    uint64_t count;    /* elements (total for v / coalesced forms) */
    uint64_t vec_hash; /* hash of recvcounts (all_gatherv) or counts (coalesced) */
    uint64_t aux;      /* number of buffers (coalesced) */
    int32_t dtype;     /* -1: none */
    int32_t root;      /* -1: none */
    int32_t redop;     /* -1: none */
    uint32_t flags;    /* TDIST__FP_* */
    uint64_t send_to_you;
    uint64_t recv_from_you;
} tdist__fp_t;

#define TDIST__FP_MAGIC 0x74647066u /* "tdpf" */
_Static_assert(sizeof(tdist__fp_t) == TDIST__COLL_FP_BYTES, "coll/ copies the fingerprint as this size");
/* flags: the all_gather is a Join's per-iteration notification */
#define TDIST__FP_JOIN_NOTIFY 1u
struct tdist_work {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* Everything from refs on is zeroed when a work is reused (engine.c
     * keeps one released work per thread, ready for the next call). */
    atomic_int refs;
    atomic_int status; /* TDIST_INPROGRESS until done */
    char *msg;         /* error message; written before status is published */
    struct tdist_work *next;

    uint64_t seq;      /* group sequence (collectives) or per-pair (p2p) */
    /* The call's arguments, which coll/ reads in place as `args` (the
     * same layout: nothing is copied on the way to an algorithm). */
    union {
        tdist__coll_args_t args;
        struct {
            tdist__op_t op;
            const void *sendbuf;
            void *recvbuf;
            size_t count;
            tdist_dtype_t dtype;
            tdist_redop_t redop;
            double premul;
            int root;                        /* root, or the peer of send/recv */
            size_t *sendcounts, *recvcounts; /* copies, size entries (v forms) */
            void **bufs;                     /* coalesced: copies of the arrays */
            size_t *counts;
            size_t nbufs;
            int avg_div;                     /* AVG divides by this (0: the group size) */
        };
    };
    int nranks;         /* group size (entries of the count arrays) */
    uint64_t fr_id;     /* this call's flight-recorder entry (UINT64_MAX: none) */
    uint64_t fr_t0;     /* a deferred entry's queued time (the recorder's clock) */
    bool fr_deferred;   /* its entry is written when it starts (record.c) */
    bool fr_picked;     /* ... and coll/ wrote its route into pg->fr_pick */
    int64_t timeout_ms; /* < 0: the group's */
    int64_t deadline_ms;
    void (*on_complete)(tdist_status_t status, void *user_data);
    void *user_data;
    bool inline_run;    /* run on the caller's thread: nobody waits on cv */
    bool on_stack;      /* the caller's storage (tdist__work_on_stack) */
    /* Join (rule 4), snapshot of the group's join state at submit */
    bool in_join;       /* issued inside a Join: exchanges with every rank (a
                           joined rank reads the leader's stream itself) */
    uint32_t fp_flags;  /* TDIST__FP_* of this call */
    int shadow_leader;  /* the leader (lowest active rank) when this rank has
                           joined: before w, take part in whatever the
                           leader issues; -1: no shadowing */
    const tdist__fp_t *fp_override; /* shadow works: the announced fingerprint */
    /* (a field added above must be set in tdist__work_on_stack too, which
     * sets them one by one; the assertion below the struct guards the end) */

    /* p2p state (p2p thread only; a collective's work on the caller's
     * stack leaves it unset, but for p2p_msg) */
    _Alignas(8) uint8_t hdr[24];
    tdist__tp_req_t hreq, preq;
    bool hdr_checked;
    tdist__be_p2p_t be_op; /* another backend's view of this send / recv */
    bool be_posted;     /* be_op is with the backend (until p2p_release) */
    int p2p_status;     /* result being delivered (p2p thread) */
    char *p2p_msg;
};

_Static_assert(offsetof(struct tdist_work, hdr) ==
                   offsetof(struct tdist_work, fp_override) + sizeof(const tdist__fp_t *),
               "tdist__work_on_stack sets every field from refs to fp_override");

#define TDIST__WORK_ARG_AT(f) \
    _Static_assert(offsetof(struct tdist_work, f) - offsetof(struct tdist_work, args) == \
                       offsetof(tdist__coll_args_t, f), "work argument " #f)
TDIST__WORK_ARG_AT(op);
TDIST__WORK_ARG_AT(sendbuf);
TDIST__WORK_ARG_AT(recvbuf);
TDIST__WORK_ARG_AT(count);
TDIST__WORK_ARG_AT(dtype);
TDIST__WORK_ARG_AT(redop);
TDIST__WORK_ARG_AT(premul);
TDIST__WORK_ARG_AT(root);
TDIST__WORK_ARG_AT(sendcounts);
TDIST__WORK_ARG_AT(recvcounts);
TDIST__WORK_ARG_AT(bufs);
TDIST__WORK_ARG_AT(counts);
TDIST__WORK_ARG_AT(nbufs);
TDIST__WORK_ARG_AT(avg_div);
_Static_assert(sizeof(((struct tdist_work *)0)->args) == sizeof(tdist__coll_args_t), "work args");
#undef TDIST__WORK_ARG_AT

/* The shape of a plain collective call (engine.c's fingerprint cache). */
typedef struct tdist__fp_shape {
    bool valid;
    tdist__op_t op;
    tdist_dtype_t dtype;
    tdist_redop_t redop;
    int root;
    uint32_t flags;
    size_t count;
} tdist__fp_shape_t;

/* A process group, by concern. Who touches what:
 *  - identity: set at creation, read-only after;
 *  - engine: the ordered queue, the sticky error, the meshes (mu);
 *  - chk: the fingerprint check's scratch (engine side: whoever runs
 *    works, one at a time: the gate's RUN);
 *  - coll: coll/'s state and the shared-memory collectives (engine side);
 *  - join: rule 4's state (set by join/ under mu, read at submit; the
 *    shift is engine side);
 *  - hier: the subgroups of a group over several hosts (hier.c);
 *  - p2p: send / recv (under mu, driven by the p2p thread). */
struct tdist_pg {
    /* identity */
    const tdist__backend_t *backend; /* NULL: native; else backend/backend.h */
    void *be;                        /* the backend's state of this group */
    tdist__tp_kind_t kind; /* transport of both meshes */
    tdist_world_t *world; /* borrowed */
    tdist_store_t *store; /* borrowed: the world's */
    int rank, size;
    int *wranks;          /* world rank of each group rank */
    char *name;
    char *uid;
    uint64_t uid_hash;
    int64_t timeout_ms;
    int64_t setup_timeout_ms; /* the set-up deadline as a timeout (subgroups inherit it) */
    char *bind_addr;
    bool check_fp;        /* TDIST_CHECK_FINGERPRINT (measurement only) */
    int n_children;       /* creation counter for subgroup uids */
    tdist__fr_t *fr;      /* the flight recorder's ring (NULL: off) */
    uint64_t fr_running;  /* the entry of the collective running (engine side; record.c) */
    uint8_t fr_pick[3];   /* coll/'s route, algorithm and flags for a deferred entry */

    /* engine */
    pthread_mutex_t mu;
    pthread_cond_t cv;    /* engine: queue not empty / stop */
    tdist__tp_t *tp;      /* collective mesh; NULL once failed and destroyed */
    tdist__tp_t *p2p_tp;  /* point-to-point mesh */
    struct tdist_work *head, *tail;
    /* The gate (engine.c): the last sequence number given out (bits 3..)
     * and whether a work runs (engine or inline: TDIST__GATE_RUN), works
     * are queued (TDIST__GATE_QUEUED, set and cleared under mu) or every
     * submit must take the locked path (TDIST__GATE_SLOW: Join). A
     * blocking call on an idle group takes its seq and the right to run in
     * one compare-and-swap, without mu. */
    _Atomic uint64_t gate;
    atomic_bool aborted;
    bool stop;
    tdist_status_t err;   /* sticky */
    atomic_bool failed;   /* err != TDIST_OK (read without the lock) */
    char *errmsg;
    pthread_t engine;
    bool engine_started;

    struct {
        tdist__fp_t *mine, *theirs; /* size entries: sent to / received from each rank */
        tdist__tp_req_t *reqs;      /* 2 x size */
        tdist__tp_req_t **reqp;
        tdist__fp_t common;         /* this collective's common part */
        /* the last plain call's shape and the hash of its common part with
         * seq 0 (engine.c fp_prepare): a call of the same shape only adds
         * seq's term */
        tdist__fp_shape_t last;
        uint64_t h0;
        bool store_silent;          /* the store did not answer the wait chain (waits.c) */
        int have;                   /* TCP: the rank whose fingerprint for the next exchange
                                       is already in theirs (Join's shadowing; -1: none) */
    } chk;

    /* shared-memory collectives (every rank on this host, shm transport):
     * NULL otherwise. Valid while tp is. */
    tdist__shmc_t *shm;
    tdist__coll_group_t coll; /* coll/'s state: scratch, forced algorithm, hierarchy */
    struct {                  /* engine.c: coll/'s context and check, made at the group's
                                 first collective and set per call in place (by
                                 whoever holds the gate's RUN) */
        bool ok;
        tdist__coll_ctx_t ctx;
        tdist__coll_check_t chk;
    } run0;

    struct {
        int mode;            /* TDIST__JOIN_* */
        const uint8_t *out;  /* size entries: 1 = that rank has joined (borrowed) */
        int leader;          /* lowest active rank */
        int divisor;         /* AVG's divisor while ranks have joined */
        uint64_t iter;       /* the Join's iteration (for messages) */
        uint64_t seq_shift;  /* shadow collectives run so far: added to each work's seq */
    } join;

    struct {
        tdist_pg_t *local;   /* this host's ranks of the group (shm); NULL if alone */
        tdist_pg_t *cross;   /* the first rank of every host (tcp); NULL off leaders */
        int leader;          /* group rank of this host's first rank */
        int *host;           /* host index of every group rank */
        int nhosts;
    } hier;

    struct {
        pthread_t thread;
        bool started;
        pthread_cond_t cv;
        struct tdist_work *head, *tail; /* submitted, not yet posted */
        struct tdist_work *active;      /* posted, in progress */
        uint64_t *send_seq, *recv_seq;  /* per peer */
        tdist_status_t err;             /* sticky for the p2p path */
        char *errmsg;
    } p2p;
};

/* ------------------------------------------------------------- record.c */

/* The flight recorder's view of a group (rule 5): open its ring, record a
 * work as queued (after it got its sequence number), and its end. */
void tdist__pg_fr_open(tdist_pg_t *pg);
/* TDIST_LOG=trace: one line for w, which ended with st. */
void tdist__pg_fr_trace_line(tdist_pg_t *pg, const struct tdist_work *w, tdist_status_t st);

/* Inline: they are on every collective's path. */
static inline void tdist__pg_fr_queue(tdist_pg_t *pg, struct tdist_work *w, uint32_t kind)
{
    w->fr_id = kind == TDIST__FR_COLL
                   ? tdist__fr_begin_coll(pg->fr, (int)w->op, w->seq, w->count, (int)w->dtype,
                                          w->root, (int)w->redop)
                   : tdist__fr_begin(pg->fr, kind, (int)w->op, w->seq, w->count, (int)w->dtype,
                                     w->root, (int)w->redop);
}

_Static_assert(TDIST__FR_ENDED_IN_SPIN == TDIST__COLL_CHOSEN_SPUN, "coll/ writes the flag");

/* A blocking call about to run at once on its caller's thread: its entry
 * (by its seq) is written once, when it starts, as queued and started at
 * the same time. */
static inline void tdist__pg_fr_defer(tdist_pg_t *pg, struct tdist_work *w)
{
    w->fr_id = pg->fr ? w->seq | TDIST__FR_COLL_ID : UINT64_MAX;
    w->fr_deferred = pg->fr != NULL;
    /* read now, when the call is made: the clock read after the post
     * measured far dearer with the CPUs far apart */
    w->fr_t0 = pg->fr ? tdist__fr_now() : 0;
}

/* A deferred entry, written as queued (w ends before it starts). */
static inline void tdist__pg_fr_settle(tdist_pg_t *pg, struct tdist_work *w)
{
    if (!w->fr_deferred) return;
    w->fr_deferred = false;
    tdist__fr_fill(tdist__fr_slot_of(pg->fr, w->fr_id), w->fr_id, TDIST__FR_COLL, (int)w->op,
                   w->seq, w->count, (int)w->dtype, w->root, (int)w->redop, 0, TDIST__FR_QUEUED,
                   w->fr_t0);
}

/* w runs now: the fingerprint's fields (fp: a Join's shift moves seq, v
 * forms have totals and a split hash), and where coll/ writes its route
 * (c). A call run on its caller's thread (a deferred entry) is written
 * only when coll/ says it started (c->started, which calls
 * tdist__pg_fr_started with arg): after its post, so that the entry's
 * stores overlap the wait for the peers instead of delaying the post
 * they wait for; until then coll/ writes its route into pg->fr_pick. */
static inline void tdist__pg_fr_start(tdist_pg_t *pg, struct tdist_work *w, const tdist__fp_t *fp,
                                      tdist__coll_ctx_t *c, void (*started)(void *), void *arg)
{
    if (w->fr_deferred) {
        pg->fr_pick[0] = 255;
        pg->fr_pick[1] = 0;
        pg->fr_pick[2] = 0;
        c->chosen = pg->fr_pick;
        c->started = started;
        c->started_arg = arg;
        return;
    }
    tdist__fr_slot_t *e = tdist__fr_at(pg->fr, w->fr_id);
    if (!e) return;
    e->seq = fp->seq;
    e->count = fp->count;
    e->dtype = (int8_t)fp->dtype;
    e->root = fp->root;
    e->redop = (int8_t)fp->redop;
    e->splits_hash = fp->vec_hash;
    c->chosen = &e->route;
    pg->fr_running = w->fr_id;
    tdist__fr_state_at(pg->fr, w->fr_id, TDIST__FR_STARTED, 0, w->inline_run);
}

/* coll/ says w (a deferred entry) started: its entry, queued and started
 * now, with the fingerprint's fields (fp) and the route coll/ chose. Once
 * per call (later calls do nothing). */
static inline void tdist__pg_fr_started(tdist_pg_t *pg, struct tdist_work *w, const tdist__fp_t *fp)
{
    if (!w->fr_deferred) return;
    w->fr_deferred = false;
    w->fr_picked = true;
    tdist__fr_slot_t *e = tdist__fr_slot_of(pg->fr, w->fr_id);
    tdist__fr_fill(e, w->fr_id, TDIST__FR_COLL, (int)w->op, fp->seq, fp->count, fp->dtype,
                   fp->root, fp->redop, fp->vec_hash, TDIST__FR_STARTED, w->fr_t0);
    e->route = pg->fr_pick[0];
    e->algo = pg->fr_pick[1];
    pg->fr_running = w->fr_id;
}

static inline void tdist__pg_fr_end(tdist_pg_t *pg, const struct tdist_work *w,
                                    tdist_status_t st)
{
    if (w->fr_picked) { /* the flags coll/ wrote after the entry was */
        tdist__fr_slot_t *e = tdist__fr_slot_of(pg->fr, w->fr_id);
        e->flags |= pg->fr_pick[2];
    }
    tdist__fr_end(pg->fr, w->fr_id, (int)st);
    if (tdist__log_on(TDIST_LOG_TRACE)) tdist__pg_fr_trace_line(pg, w, st);
}

/* ---------------------------------------------------------------- check.c */

/* "all_reduce(f32, 1024, sum)" for a work / a fingerprint. */
void tdist__work_describe(const struct tdist_work *w, char *buf, size_t n);
void tdist__fp_describe(const tdist__fp_t *fp, bool with_seq, char *buf, size_t n);
/* Fill pg->chk.mine[p] for every peer p. */
void tdist__fp_fill(tdist_pg_t *pg, const struct tdist_work *w);
/* The common part of w's fingerprint (per-peer fields zero). */
void tdist__fp_common(const struct tdist_work *w, uint64_t uid_hash, tdist__fp_t *fp);
/* Whether op has a root rank (its fingerprint and a Join's shadow carry it). */
static inline bool tdist__op_has_root(tdist__op_t op)
{
    return op == TDIST__OP_BROADCAST || op == TDIST__OP_REDUCE || op == TDIST__OP_GATHER ||
           op == TDIST__OP_SCATTER || op == TDIST__OP_BROADCAST_COALESCED;
}

/* The common part of a fingerprint from its fields (fields the op does not
 * have become -1, as in tdist__fp_common; count as given). Inline: with a
 * constant op (the tiny all_reduce's fast path) it folds to a few stores. */
static inline void tdist__fp_init(tdist__fp_t *fp, tdist__op_t op, uint64_t uid_hash,
                                  uint64_t seq, tdist_dtype_t dtype, int root,
                                  tdist_redop_t redop, size_t count, uint32_t flags)
{
    bool has_root = tdist__op_has_root(op);
    bool has_redop = op == TDIST__OP_ALL_REDUCE || op == TDIST__OP_REDUCE ||
                     op == TDIST__OP_REDUCE_SCATTER || op == TDIST__OP_ALL_REDUCE_COALESCED ||
                     op == TDIST__OP_ALL_REDUCE_WIRE;
    bool has_dtype = op != TDIST__OP_BARRIER && op != TDIST__OP_MONITORED_BARRIER;
    *fp = (tdist__fp_t){.magic = TDIST__FP_MAGIC,
                        .op = (uint32_t)op,
                        .uid_hash = uid_hash,
                        .seq = seq,
                        .count = count,
                        .dtype = has_dtype ? (int32_t)dtype : -1,
                        .root = has_root ? root : -1,
                        .redop = has_redop ? (int32_t)redop : -1,
                        .flags = flags};
}
/* Exchange fingerprints with every peer and compare them; TDIST_OK or
 * TDIST_ERR_MISMATCH (message identical on every rank) or the
 * transport's error. */
tdist_status_t tdist__fp_exchange(tdist_pg_t *pg, const struct tdist_work *w,
                                  int64_t deadline_ms);
/* Compare every rank's common part (pg->chk.theirs, own copied in) with
 * rank 0's: TDIST_OK or TDIST_ERR_MISMATCH naming the first that differs. */
tdist_status_t tdist__fp_compare(tdist_pg_t *pg);
/* The same with pg->chk.theirs filled for every rank, this one's
 * included, with the fingerprints of an earlier collective than w (a
 * rooted collective's sender learns its verdict later): the mismatch
 * names that collective's seq. */
tdist_status_t tdist__fp_compare_earlier(tdist_pg_t *pg, const struct tdist_work *w);
/* The shm line's 64-bit stand-in for a fingerprint (common part): a sum
 * of one term per word, each word times its own odd constant; seq's is
 * TDIST__FP_SEQ_MULT, so hash(seq) = hash(seq 0) + seq * TDIST__FP_SEQ_MULT. */
uint64_t tdist__fp_hash(const tdist__fp_t *fp);
#define TDIST__FP_SEQ_MULT 0x21414522c6e07da7ull
/* Compare one received fingerprint's common part with the local one;
 * true if equal. */
bool tdist__fp_common_equal(const tdist__fp_t *a, const tdist__fp_t *b);

/* --------------------------------------------------------------- engine.c */

struct tdist_work *tdist__work_new(tdist__op_t op, const tdist_coll_opts_t *opts);
/* For a blocking call without a callback (work NULL, no on_complete): w
 * itself, initialised, living in the caller's frame; tdist__pg_submit runs
 * it on the caller's thread without a heap work, a finish or a wake-up,
 * and moves it to the heap if it has to queue. Otherwise a new heap work
 * (NULL when out of memory). */
struct tdist_work *tdist__work_on_stack(struct tdist_work *w, tdist__op_t op,
                                        const tdist_coll_opts_t *opts, tdist_work_t **work);
void tdist__work_release(struct tdist_work *w);
/* A submitted work: to the caller (async: *work = w), or waited for and
 * released (work NULL: blocking); the call's status. */
tdist_status_t tdist__work_hand_over(struct tdist_work *w, tdist_work_t **work);
/* Finish w with st (msg may be NULL on success): call on_complete, wake
 * waiters, drop the engine's reference. */
void tdist__work_finish(struct tdist_work *w, tdist_status_t st, const char *msg);
/* Add by to w's seq while it runs, under w->mu unless it runs inline: a
 * waiter's timeout message (tdist_work_wait) reads seq under w->mu. */
void tdist__work_shift_seq(struct tdist_work *w, uint64_t by);
/* Queue w (owned by the engine from now on) and return it to the caller
 * (async), or wait for it (work == NULL). Assigns the sequence number. */
tdist_status_t tdist__pg_submit(tdist_pg_t *pg, struct tdist_work *w, tdist_work_t **work);
#define TDIST__GATE_RUN 1u
#define TDIST__GATE_QUEUED 2u
#define TDIST__GATE_SLOW 4u
#define TDIST__GATE_SEQ_SHIFT 3
/* The last sequence number given out on pg (thread-safe). */
static inline uint64_t tdist__pg_last_seq(const tdist_pg_t *pg)
{
    return atomic_load_explicit(&pg->gate, memory_order_relaxed) >> TDIST__GATE_SEQ_SHIFT;
}
/* Every submit of pg takes the locked path (on) or may run at once on an
 * idle group (off); under pg->mu. */
void tdist__pg_gate_slow(tdist_pg_t *pg, bool on);
tdist_status_t tdist__pg_start_engine(tdist_pg_t *pg);
void tdist__pg_stop_engine(tdist_pg_t *pg);
/* The sticky error, copied (or TDIST_OK). Caller frees *msg. */
tdist_status_t tdist__pg_sticky(tdist_pg_t *pg, char **msg);
/* waits.c: on a timeout that waited on peer, record it in the store and
 * follow the others' records (0.4 s of grace at most) to the rank that
 * reports no wait of its own; "; who waits on whom: ..." naming it, or
 * NULL (nothing more to say than that peer). A store that does not answer
 * sets pg->chk.store_silent (the failure's own post is then skipped).
 * Engine side; blocks up to the grace. */
char *tdist__pg_wait_chain(tdist_pg_t *pg, int peer);
/* Record a failure: post the root cause ("rank R (world rank W) <where>:
 * <cause>") to the store, bounded to end 0.8 s past deadline_ms (absolute;
 * the failed call's) at the latest, make it sticky, destroy the collective mesh (peers
 * blocked on it fail fast) and abort the p2p mesh. Returns the full
 * message, "<prefix>: <cause>" with the group's first failure (malloc'd). */
char *tdist__pg_fail(tdist_pg_t *pg, tdist_status_t st, const char *prefix, const char *where,
                     const char *cause, int64_t deadline_ms);

/* ------------------------------------------------------------- join.c (pg) */

/* The Join interface (TDIST__JOIN_*, tdist__pg_join_set / _mode /
 * _gather) is in pg/join_iface.h, included above. */
/* Submit-time checks of rule 4 (pg->mu held): TDIST_OK, or
 * TDIST_ERR_JOINED with a message for a call that cannot be shadowed or
 * comes before the first notification. */
tdist_status_t tdist__pg_join_check(tdist_pg_t *pg, struct tdist_work *w);
/* On a joined rank, before w runs: take part in every collective the
 * leader announces until it announces w itself (or something that cannot
 * be shadowed, left for w's own check to report). Engine side. */
tdist_status_t tdist__pg_shadow_until(tdist_pg_t *pg, struct tdist_work *w, int64_t deadline_ms);
/* coll/'s context for one collective of pg (engine side). */
void tdist__pg_coll_ctx(tdist_pg_t *pg, bool spin, int64_t timeout_ms, int64_t deadline_ms,
                        tdist__coll_ctx_t *c);
/* A deadline not read yet: tdist__pg_run_body lets coll/ count timeout_ms
 * from the first wait that stops spinning. */
#define TDIST__DEADLINE_LAZY INT64_MIN
/* Run w's exchange and algorithm (no status, no finish): engine.c.
 * deadline_ms: absolute, or TDIST__DEADLINE_LAZY. */
tdist_status_t tdist__pg_run_body(tdist_pg_t *pg, struct tdist_work *w, int64_t timeout_ms,
                                  int64_t deadline_ms);

/* ---------------------------------------------------------------- hier.c */

/* After the meshes are up: find the hosts and build the local / cross
 * subgroups if the group spans hosts (collective over the group). */
tdist_status_t tdist__pg_hier_setup(tdist_pg_t *pg, int64_t deadline_ms);
void tdist__pg_hier_abort(tdist_pg_t *pg);
void tdist__pg_hier_free(tdist_pg_t *pg);

/* group.c: an internal subgroup of parent (members: parent ranks in
 * subgroup order; me: this rank's index there) over transport kind, set
 * up by deadline_ms (the parent's set-up deadline). */
tdist_status_t tdist__pg_build_sub(tdist_pg_t *parent, const int *members, int n, int me,
                                   const char *uid, const char *name, tdist__tp_kind_t kind,
                                   int64_t deadline_ms, tdist_pg_t **out);

/* ------------------------------------------------------------------ p2p.c */

tdist_status_t tdist__p2p_submit(tdist_pg_t *pg, struct tdist_work *w, tdist_work_t **work);
void tdist__p2p_stop(tdist_pg_t *pg);

#endif /* TDIST_PG_INTERNAL_H */
