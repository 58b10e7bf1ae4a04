/*
 * coll/coll.h — the native backend's collective algorithms (internal).
 *
 * Each algorithm runs one collective to completion on the calling thread
 * (pg/'s progress engine) over a transport mesh whose ranks are the
 * group's ranks. It blocks with the context's deadline on every wait and
 * returns the transport's error (naming the peer) or TDIST_ERR_TIMEOUT
 * naming the peers still owed bytes. A timeout with requests still posted
 * aborts the transport before returning (the byte streams' positions are
 * lost, so the mesh is unusable: later calls fail with TDIST_ERR_ABORTED).
 * Scratch memory is malloc'ed per call and freed on every path. Arguments are checked by pg/ before
 * dispatch: algorithms may assume valid dtypes/ops, non-NULL buffers where
 * count > 0, root in range, and that every rank called the same collective
 * with the same shape (pg/ exchanges fingerprints first).
 *
 * Results are bit-identical on every rank (each element is reduced in one
 * order that every rank shares, or reduced once and copied).
 * In-place: sendbuf == recvbuf is allowed wherever both exist.
 *
 * One file per algorithm (STYLE.md): all_reduce_ring.c,
 * all_reduce_rd.c, broadcast_tree.c, ..., the shared-memory line
 * (shm_line.c), the fused small all_reduce (fused.c) and the
 * monitored barrier (monitored_barrier.c); select.c holds the one
 * selection function and the dispatch (tdist__coll_run), coll.c the
 * helpers the algorithms share.
 */
#ifndef TDIST_COLL_H
#define TDIST_COLL_H

#include <stddef.h>
#include <stdint.h>

#include "core/internal.h"
#include "transport/transport.h"

typedef struct tdist__shmc tdist__shmc_t;

/* A scratch buffer kept between collectives (by pg/, one per group): the
 * large temporary of an algorithm is taken from it instead of malloc, so
 * a big collective does not map, fault in and unmap tens of MiB of fresh
 * pages on every call. Grows to the largest need; freed with the group. */
typedef struct tdist__coll_scratch {
    void *p;
    size_t len;
} tdist__coll_scratch_t;

/* Free a scratch's memory (pg/ at group destroy). */
void tdist__coll_scratch_release(tdist__coll_scratch_t *s);

/* Algorithms the all_reduce selector may pick. When the caller passes
 * TDIST__AR_AUTO, the context's ar_forced decides, and when that is AUTO
 * too, the size (thresholds: coll.c). */
typedef enum tdist__ar_algo {
    TDIST__AR_AUTO = 0,
    TDIST__AR_RING,   /* reduce-scatter + all-gather: bandwidth */
    TDIST__AR_RD,     /* recursive doubling (non-powers of two folded): latency */
    TDIST__AR_DIRECT  /* everyone exchanges everything: tiny messages, small worlds */
} tdist__ar_algo_t;

/* The all_reduce algorithm TDIST_ALGO_ALLREDUCE forces ("ring", "rd",
 * "direct"; "auto" or unset: TDIST__AR_AUTO). Read once, when a group is
 * created; any other value is TDIST_ERR_INVALID_ARG naming it.
 * Thread-safe. */
tdist_status_t tdist__coll_forced_ar_algo(tdist__ar_algo_t *out);

typedef enum tdist__op {
    TDIST__OP_NONE = 0,
    TDIST__OP_BROADCAST,
    TDIST__OP_ALL_REDUCE,
    TDIST__OP_REDUCE,
    TDIST__OP_ALL_GATHER,
    TDIST__OP_ALL_GATHERV,
    TDIST__OP_GATHER,
    TDIST__OP_SCATTER,
    TDIST__OP_REDUCE_SCATTER,
    TDIST__OP_ALL_TO_ALL,
    TDIST__OP_ALL_TO_ALLV,
    TDIST__OP_BARRIER,
    TDIST__OP_MONITORED_BARRIER,
    TDIST__OP_ALL_REDUCE_COALESCED,
    TDIST__OP_BROADCAST_COALESCED,
    TDIST__OP_SEND,
    TDIST__OP_RECV,
    TDIST__OP_ALL_REDUCE_WIRE, /* f32 in and out, a 16-bit wire (all_reduce_wire.c) */
    TDIST__OP_COUNT
} tdist__op_t;

/* The largest fingerprint pg/ hands coll/ (it rides in a line's aux part). */
#define TDIST__COLL_FP_MAX 96
/* How many acknowledgements a TCP rooted collective's sender may owe a
 * peer before it reads half of them (fused.c). */
#define TDIST__ACK_MAX 32

/* "all_reduce", "send", ...; "unknown-op" outside the enum. Thread-safe. */
const char *tdist__op_name(tdist__op_t op);

/* One collective's arguments, as pg/ hands them to coll/ (its work's
 * fields; what an op does not use is zero / NULL / -1). */
typedef struct tdist__coll_args {
    tdist__op_t op;
    const void *sendbuf;
    void *recvbuf;
    size_t count;
    tdist_dtype_t dtype;
    tdist_redop_t redop;
    double premul;
    int root;
    const size_t *sendcounts, *recvcounts; /* size entries (v forms) */
    void *const *bufs;                     /* coalesced forms */
    const size_t *counts;
    size_t nbufs;
    int avg_div;       /* AVG divides by this (0: the group size; a Join's active ranks) */
} tdist__coll_args_t;

/* pg/'s check of rule 2 as an algorithm sees it: an opaque fingerprint of
 * len bytes (its common part, the same in every copy a rank sends).
 * Algorithms that carry the check in their first exchange (the shm line,
 * the fused all_reduce, the monitored barrier) send `common` (the line:
 * `hash` in the blob every rank reads, `common` in the aux part), receive
 * every peer's into theirs (size x len bytes; slot `have` may already
 * hold one) and leave the wording of a difference to compare(). Every
 * other algorithm runs exchange() (pg's own exchange and comparison)
 * first. on == false (TDIST_CHECK_FINGERPRINT=0): nothing is compared. */
typedef struct tdist__coll_check {
    bool on;
    size_t len;
    const void *common;
    uint64_t hash;
    uint8_t *theirs;
    int have;                               /* -1: none */
    tdist_status_t (*exchange)(void *arg, int64_t deadline_ms); /* send, receive, compare */
    tdist_status_t (*compare)(void *arg);   /* theirs filled: OK or the mismatch */
    /* theirs filled for every rank, this one's included, with the
     * fingerprints of an exchange that may be an earlier collective's (a
     * rooted collective's sender compares later): the mismatch, naming it */
    tdist_status_t (*compare_earlier)(void *arg);
    void *arg;
} tdist__coll_check_t;

/* A selection and what it was made from (select.c's cache). */
typedef struct tdist__coll_last_plan {
    bool valid, chk_on, tree_on;
    int op, dtype, redop, ar_forced;
    size_t count;
    const void *shm, *slots;
    int route, algo;
} tdist__coll_last_plan_t;

/* coll/'s state of one group, kept between collectives (pg/ embeds it in
 * the group; tdist__coll_group_init / _free). Used by one collective at a
 * time (pg/ serialises them). */
typedef struct tdist__coll_group {
    tdist__coll_scratch_t scratch; /* algorithms' large temporaries */
    tdist__ar_algo_t ar_algo;      /* TDIST_ALGO_ALLREDUCE, read at creation: when it
                                      names an algorithm, all_reduce leaves the shm
                                      paths for the point-to-point ones */
    /* fused all_reduce: fingerprint + payload, fused_max bytes per rank
     * (broadcast, scatter, reduce, gather: fused_rooted_max); fused_in
     * holds fused_cap bytes per rank */
    size_t fused_max, fused_rooted_max, fused_cap;
    uint8_t *fused_out, *fused_in;
    /* point-to-point groups of TDIST_CHECK_TREE_MIN ranks or more: the
     * check and the fused collectives along a tree of tree_radix
     * (TDIST_CHECK_TREE_RADIX) children a level (fused_tree.c) */
    bool tree;
    int tree_radix;
    const uint8_t **blobs;         /* shm line: size entries */
    /* TCP, rooted one-shot collectives (fused.c): the acknowledgements (a
     * peer's fingerprint) still to read from each peer, and this rank's
     * fingerprint each is compared with (per peer, a ring of
     * TDIST__ACK_MAX) */
    uint32_t *ack_owed, *ack_head; /* size entries */
    uint32_t ack_total;
    uint8_t *ack_fp;               /* size x TDIST__ACK_MAX x TDIST__COLL_FP_MAX */
    uint8_t *ack_in;               /* TDIST__ACK_MAX x TDIST__COLL_FP_MAX */
    tdist__tp_req_t *reqs;         /* 2 x size: the fused and monitored exchanges */
    tdist__tp_req_t **reqp;
    /* hierarchical route (a group over several hosts): pg/ runs it on its
     * subgroups; coll/ only chooses it (hier_min: bytes from which
     * all_reduce / broadcast go hierarchical; 0: no hierarchy) */
    size_t hier_min;
    tdist_status_t (*hier_run)(void *arg, const tdist__coll_args_t *a, int64_t deadline_ms);
    void *hier_arg;
    /* the last selection and what it was made from (select.c): a call of
     * the same shape (a training loop's) skips the selection */
    tdist__coll_last_plan_t last;
} tdist__coll_group_t;

/* Set up g for a group of size ranks (TDIST_ALGO_ALLREDUCE read here).
 * TDIST_OK or TDIST_ERR_NO_MEMORY / TDIST_ERR_INVALID_ARG. Not
 * thread-safe. */
tdist_status_t tdist__coll_group_init(tdist__coll_group_t *g, int size);
/* Free what g holds (idempotent). */
void tdist__coll_group_free(tdist__coll_group_t *g);

struct tdist__coll_ctx;

/* Another backend's collective (backend/backend.h): runs a to completion
 * over the backend's group state be, blocking until c->deadline_ms at most
 * and giving up when *c->aborted turns true; c->rank / c->size are the
 * group's. pg's check has run before (through the backend's ALL_TO_ALL and
 * ALL_GATHER slots), except for MONITORED_BARRIER, which carries it (chk). */
typedef tdist_status_t (*tdist__coll_slot_t)(void *be, const struct tdist__coll_ctx *c,
                                             const tdist__coll_args_t *a,
                                             const tdist__coll_check_t *chk);

/* One optional slot per collective (indexed by tdist__op_t); NULL: the
 * native algorithm. */
typedef struct tdist__coll_slots {
    tdist__coll_slot_t slot[TDIST__OP_COUNT];
} tdist__coll_slots_t;

typedef struct tdist__coll_ctx {
    tdist__tp_t *tp;     /* mesh over the group's ranks (NULL: a backend group) */
    tdist__shmc_t *shm;  /* shared-memory collectives (shm_coll.c), or NULL */
    bool spin;           /* shm waits may spin: the caller's thread runs it (inline) */
    tdist__coll_scratch_t *scratch; /* kept between calls, or NULL (malloc each time) */
    int rank, size;      /* this rank and the group size */
    int64_t deadline_ms; /* absolute (tdist__now_ms clock); INT64_MAX: none */
    /* deadline_ms is a timeout instead (ms, < 0: none), counted from when a
     * shm wait stops spinning: tdist__coll_run keeps it so for a route that
     * is a single wait (peers already there cost no clock read) and makes
     * it absolute for any other */
    bool lazy_deadline;
    int64_t timeout_ms;  /* what deadline_ms was made from (for messages) */
    tdist__ar_algo_t ar_forced; /* the group's TDIST_ALGO_ALLREDUCE (AUTO: none) */
    tdist__coll_group_t *g;     /* the group's state (tdist__coll_run), or NULL */
    /* another backend: its slots, its group state and its name */
    const tdist__coll_slots_t *slots;
    void *be;
    const char *be_name;
    const _Atomic bool *aborted; /* the group's abort flag (backends poll it) */
    uint8_t *chosen; /* where tdist__coll_run writes its route and algorithm (2 bytes)
                        and, in a third, TDIST__COLL_CHOSEN_SPUN, for the flight
                        recorder; NULL: nowhere */
    /* Called, with started_arg, once this rank has posted its part of the
     * collective and before anything waits (may be called again later:
     * the callee must be idempotent); NULL: nothing. pg records the call
     * as started here, so that the recorder's stores overlap the wait for
     * the peers instead of delaying the post they wait for. */
    void (*started)(void *arg);
    void *started_arg;
} tdist__coll_ctx_t;

/* c's started callback, if any. */
static inline void tdist__coll_started(const tdist__coll_ctx_t *c)
{
    if (c->started) c->started(c->started_arg);
}

/* chosen[2]: the collective's only wait ended while it spun (its peers
 * were there: it took a fraction of a microsecond). */
#define TDIST__COLL_CHOSEN_SPUN 1u

/* The route a collective takes: the first exchange that carries pg/'s
 * check, then the algorithm. */
typedef enum tdist__coll_route {
    TDIST__ROUTE_NATIVE = 0,   /* pg's fingerprint exchange, then a native algorithm */
    TDIST__ROUTE_BACKEND,      /* pg's fingerprint exchange, then the backend's slot */
    TDIST__ROUTE_HIER,         /* hierarchical (pg/'s subgroups), checked there */
    TDIST__ROUTE_FUSED,        /* TCP: fingerprint and data in one message (fused.c) */
    TDIST__ROUTE_MONITORED,    /* TCP: rank 0 collects, names who is missing */
    TDIST__ROUTE_SHM_LINE,     /* shm: the line exchange (check and barrier), then algo */
} tdist__coll_route_t;

/* Every algorithm selection can name. */
typedef enum tdist__coll_algo {
    TDIST__ALGO_NONE = 0,      /* nothing after the first exchange (barrier) */
    TDIST__ALGO_SLOT,          /* the backend's slot for the op */
    TDIST__ALGO_AR_RING, TDIST__ALGO_AR_RD, TDIST__ALGO_AR_DIRECT, TDIST__ALGO_AR_SHM,
    TDIST__ALGO_SHM_IN_LINE,   /* shm: the data rides in the line (oneshot.c) */
    TDIST__ALGO_SHM_ONE_SHOT,  /* shm: the data staged in the line's slot (oneshot.c) */
    TDIST__ALGO_BCAST_TREE, TDIST__ALGO_BCAST_CHAIN, TDIST__ALGO_BCAST_SHM,
    TDIST__ALGO_REDUCE_TREE, TDIST__ALGO_REDUCE_RSG, TDIST__ALGO_REDUCE_SHM,
    TDIST__ALGO_OP,            /* the op's one algorithm (gather, scatter, ...) */
    TDIST__ALGO_MONITORED,     /* the monitored barrier's collection at rank 0 */
    TDIST__ALGO_RS_SHM,        /* shm: reduce_scatter through the staging slots */
    TDIST__ALGO_RS_DIRECT,     /* reduce_scatter: every block straight to its rank */
    TDIST__ALGO_COUNT          /* (the flight recorder names each: fr/format.h) */
} tdist__coll_algo_t;

typedef struct tdist__coll_plan {
    tdist__coll_route_t route;
    tdist__coll_algo_t algo;
} tdist__coll_plan_t;

/* The one selection: from the op, its bytes, the group size, the
 * backend's slots, the transport (c->shm), the hierarchy and the forced
 * algorithm (c->g) to a route and an algorithm. Depends only on what every rank of the group
 * agrees on (the fingerprint's fields and the group), so every rank
 * chooses the same. Thresholds: select.c. */
tdist__coll_plan_t tdist__coll_select(const tdist__coll_ctx_t *c, const tdist__coll_args_t *a,
                                      const tdist__coll_check_t *chk);

/* Run one collective to completion on the calling thread: select, carry
 * the check, run the algorithm, finish (AVG's division by a Join's active
 * ranks included). Blocks until c->deadline_ms at most. */
tdist_status_t tdist__coll_run(const tdist__coll_ctx_t *c, const tdist__coll_args_t *a,
                               const tdist__coll_check_t *chk);


/* A monitored barrier's answer from rank 0 to the others (the native
 * algorithm and a backend's send the same). */
typedef struct tdist__mb_reply {
    int32_t status;
    char msg[508];
} tdist__mb_reply_t;

/* Rank 0's verdict of a monitored barrier into *rep: st is the
 * collection's status; present[p] whether rank p arrived (present[0]
 * true). The ranks missing when st is not OK (named by number, "did not
 * arrive within <c->timeout_ms> ms" for a timeout), else the first
 * fingerprint that differs (chk->compare; theirs[p] filled for every p).
 * Thread-safe. */
void tdist__coll_mb_verdict(const tdist__coll_ctx_t *c, const tdist__coll_check_t *chk,
                            tdist_status_t st, const bool *present, tdist__mb_reply_t *rep);

/* ------------------------------------------------- one collective each
 *
 * Each op's entry without pg/'s check (coll/'s own tests and callers):
 * all_reduce, broadcast and reduce go through tdist__coll_run's selection
 * (algo, when not AUTO, forces the all_reduce algorithm); the others are
 * the op's one algorithm. */

/* recvbuf = op over ranks of sendbuf (AVG: sum then divide by size;
 * PREMUL_SUM: each input scaled by premul first). */
tdist_status_t tdist__coll_all_reduce(const tdist__coll_ctx_t *c, const void *sendbuf,
                                      void *recvbuf, size_t count, tdist_dtype_t dtype,
                                      tdist_redop_t op, double premul, tdist__ar_algo_t algo);

/* buf of root is copied into buf of every rank (binomial tree; pipelined
 * chain for large messages). */
tdist_status_t tdist__coll_broadcast(const tdist__coll_ctx_t *c, void *buf, size_t count,
                                     tdist_dtype_t dtype, int root);

/* recvbuf (root only) = op over ranks of sendbuf. recvbuf is ignored on
 * other ranks (may be NULL). Binomial tree; reduce-scatter + gather to
 * the root for large messages. */
tdist_status_t tdist__coll_reduce(const tdist__coll_ctx_t *c, const void *sendbuf, void *recvbuf,
                                  size_t count, tdist_dtype_t dtype, tdist_redop_t op,
                                  double premul, int root);

/* recvbuf holds rank r's recvcounts[r] elements at offset sum(recvcounts[<r]);
 * sendbuf has recvcounts[rank] elements (sendbuf may point into recvbuf at
 * this rank's own offset: in-place). Equal counts are the same call with
 * every recvcounts[r] equal. */
tdist_status_t tdist__coll_all_gatherv(const tdist__coll_ctx_t *c, const void *sendbuf,
                                       void *recvbuf, const size_t *recvcounts,
                                       tdist_dtype_t dtype);

/* Root's recvbuf receives every rank's count elements in rank order. */
tdist_status_t tdist__coll_gather(const tdist__coll_ctx_t *c, const void *sendbuf, void *recvbuf,
                                  size_t count, tdist_dtype_t dtype, int root);

/* Rank r's recvbuf receives elements [r*count, (r+1)*count) of root's
 * sendbuf. */
tdist_status_t tdist__coll_scatter(const tdist__coll_ctx_t *c, const void *sendbuf,
                                   void *recvbuf, size_t count, tdist_dtype_t dtype, int root);

/* A true reduce-scatter: sendbuf has size*recvcount elements; rank r's
 * recvbuf = op over ranks of block r. Each rank receives and reduces only
 * what it needs (ring or pairwise), never a full all_reduce. */
tdist_status_t tdist__coll_reduce_scatter(const tdist__coll_ctx_t *c, const void *sendbuf,
                                          void *recvbuf, size_t recvcount, tdist_dtype_t dtype,
                                          tdist_redop_t op, double premul);

/* Rank r sends sendcounts[p] elements (at offset sum(sendcounts[<p])) to
 * rank p, and receives recvcounts[p] elements from rank p into recvbuf at
 * offset sum(recvcounts[<p]). sendbuf and recvbuf must not overlap. */
tdist_status_t tdist__coll_all_to_allv(const tdist__coll_ctx_t *c, const void *sendbuf,
                                       const size_t *sendcounts, void *recvbuf,
                                       const size_t *recvcounts, tdist_dtype_t dtype);

/* Returns once every rank has entered (dissemination barrier). */
tdist_status_t tdist__coll_barrier(const tdist__coll_ctx_t *c);

/* ------------------------------------------ shared-memory collectives
 *
 * When every rank of a group shares one host (shm transport), the group's
 * collectives run through a collective area in each rank's segment
 * (shm_coll.c has the layout and the protocol):
 *  - a line exchange: each rank publishes a blob of up to
 *    TDIST__SHMC_BLOB_MAX bytes (pg/: a hash of the fingerprint, plus a
 *    tiny all_reduce's data) and an aux part (the whole fingerprint, read
 *    only to word a mismatch) and reads every rank's blob — the first step
 *    of every collective, so it is also the check of rule 2 and a barrier
 *    (but for a blocking rooted one-shot collective, whose senders do not
 *    wait: its lines are compared later, before they are overwritten);
 *  - all_reduce / reduce: chunks of the input staged in a 2-slot area,
 *    each rank reducing its slice of every chunk in rank order (results
 *    bit-identical on every rank), peers copying the reduced slices out;
 *  - broadcast: the root stages chunks, the others copy them out.
 * Waits go through tdist__tp_wait_until (spin, yield, futex; liveness). */

#define TDIST__SHMC_BLOB_MAX 400 /* the part every reader reads */
#define TDIST__SHMC_AUX_MAX 88   /* a part read only when needed (a fingerprint: 80) */
#define TDIST__COLL_FP_BYTES 80  /* pg/'s fingerprint (chk->len): copied as a constant size */

/* Bytes of collective area the shm transport must reserve per rank. */
size_t tdist__shmc_area_bytes(void);

/* After tdist__tp_connect of an shm mesh made with shm_coll_bytes =
 * tdist__shmc_area_bytes(): the group's shared-memory collective state.
 * The caller owns *out (tdist__shmc_destroy, before destroying tp). */
tdist_status_t tdist__shmc_create(tdist__tp_t *tp, int rank, int size, tdist__shmc_t **out);
void tdist__shmc_destroy(tdist__shmc_t *s);

/* Publish blob (len <= TDIST__SHMC_BLOB_MAX) and aux (aux_len <=
 * TDIST__SHMC_AUX_MAX) and wait until every rank has published its part of
 * this exchange; blobs[r] (size entries) then points at rank r's blob
 * (blobs[rank] at this rank's copy), lens[r] its length (lens may be NULL);
 * tdist__shmc_peek_aux gives a rank's aux. The pointers stay valid until
 * this rank's next exchange. On timeout: TDIST_ERR_TIMEOUT naming the
 * ranks missing. */
tdist_status_t tdist__shmc_exchange(const tdist__coll_ctx_t *c, const void *blob, size_t len,
                                    const void *aux, size_t aux_len, const uint8_t **blobs,
                                    size_t *lens);

/* An exchange written in place, without staging copies: tdist__shmc_begin
 * gives this rank's blob (*blob, TDIST__SHMC_BLOB_MAX bytes) and *aux
 * (TDIST__SHMC_AUX_MAX bytes) of its next exchange, to fill, once the
 * peers are done with the line it overwrites (a rooted collective's
 * sender may have run ahead: it waits, bounded by c->deadline_ms);
 * TDIST_ERR_MISMATCH when a comparison of earlier exchanges' lines found
 * a difference (tdist__shmc_bad). Then tdist__shmc_post publishes len and
 * aux_len bytes of them (a line that carries pg/'s check: the hash first
 * in the blob, the fingerprint in aux), and tdist__shmc_gather waits for
 * every rank's line as tdist__shmc_exchange does (and compares the lines
 * of earlier exchanges not yet compared: TDIST_ERR_MISMATCH as above;
 * this exchange's hashes are the caller's to compare), or
 * tdist__shmc_gather_one for rank r's alone (*blob: its blob). */
tdist_status_t tdist__shmc_begin(const tdist__coll_ctx_t *c, uint8_t **blob, uint8_t **aux);
void tdist__shmc_post(const tdist__coll_ctx_t *c, size_t len, size_t aux_len);
tdist_status_t tdist__shmc_gather(const tdist__coll_ctx_t *c, const uint8_t **blobs, size_t *lens);
/* Whether the last tdist__shmc_gather's wait ended in its first poll. */
bool tdist__shmc_spun(const tdist__coll_ctx_t *c);
/* After a tdist__shmc_gather: fetch, for writing, the line this rank
 * posts next (off the next call's path) where that pays for the peers'
 * placement, which it times every 1024 calls. The group's thread only;
 * never blocks. */
void tdist__shmc_prepare_next(const tdist__coll_ctx_t *c);
tdist_status_t tdist__shmc_gather_one(const tdist__coll_ctx_t *c, int r, const uint8_t **blob);
/* After a rooted one-shot exchange, in any role (its sender, a reader,
 * reduce's and gather's root): fetch, for writing, the line this rank
 * posts a few exchanges from now, which a peer's late read of this
 * rank's lines has most likely left in that peer's cache. The group's
 * thread only; never blocks. */
void tdist__shmc_prepare_rooted(const tdist__coll_ctx_t *c);

/* The exchange whose lines were found to differ (0: none), this rank's
 * last exchange, and rank r's aux part of exchange seq while it is still
 * there (NULL otherwise; a line is kept until every rank has compared it). */
uint64_t tdist__shmc_bad(const tdist__coll_ctx_t *c);
uint64_t tdist__shmc_now(const tdist__coll_ctx_t *c);
const uint8_t *tdist__shmc_aux_of(const tdist__coll_ctx_t *c, int r, uint64_t seq, size_t *len);

/* The two halves of an exchange, for a protocol in which only some ranks
 * read: publish this rank's blob for the next exchange (no wait for the
 * peers' lines; errors as tdist__shmc_begin), and read rank r's blob of
 * the current exchange if it has published it (NULL otherwise). */
tdist_status_t tdist__shmc_publish(const tdist__coll_ctx_t *c, const void *blob, size_t len,
                                   const void *aux, size_t aux_len);
const uint8_t *tdist__shmc_peek(const tdist__coll_ctx_t *c, int r, size_t *len);
const uint8_t *tdist__shmc_peek_aux(const tdist__coll_ctx_t *c, int r, size_t *len);
/* Wait (bounded by c->deadline_ms, failing if r dies) until rank r has
 * published its part of this rank's NEXT exchange, without publishing
 * anything; then *aux points at r's aux of it (valid until this rank's
 * exchange after next). For a rank that must see what r announces before
 * it can say what it does itself (Join's shadowing). */
tdist_status_t tdist__shmc_await_next(const tdist__coll_ctx_t *c, int r, const uint8_t **aux,
                                      size_t *aux_len);

/* The staging slot of a one-shot collective (shm_coll.c): before the
 * exchange that carries its fingerprint, tdist__shmc_stage_slot waits
 * (bounded by c->deadline_ms) until every peer is done with this rank's
 * slots and gives this rank's slot for that exchange (*slot, room for
 * tdist__shmc_small_max() bytes); after the exchange, tdist__shmc_slot
 * gives rank r's slot of it (valid until this rank's next exchange). */
size_t tdist__shmc_small_max(void);
/* The most bytes a rank stages for a rooted one-shot collective to leave
 * its senders unwaited (tdist__oneshot_role); above it every rank waits
 * for every line. */
size_t tdist__shmc_rooted_max(void);
/* every_waits: every rank waits for every line of this collective (no
 * sender leaves early: all_reduce, all_gather, all_to_all,
 * reduce_scatter); small data then reuses two warm sub-slots. The same
 * on every rank, for stage_slot and slot alike. */
tdist_status_t tdist__shmc_stage_slot(const tdist__coll_ctx_t *c, size_t bytes, bool every_waits,
                                      uint8_t **slot);
const uint8_t *tdist__shmc_slot(const tdist__coll_ctx_t *c, int r, size_t bytes,
                                bool every_waits);

/* One-shot collectives on the shm line or the fused exchange (oneshot.c).
 * tdist__oneshot_op: whether op has one; _bytes: the most bytes any rank
 * stages (the choice of route, the same on every rank); _len: what rank
 * `rank` stages (0: nothing); _input: what this rank
 * stages (NULL: nothing) and *bytes of it; _scale: PREMUL_SUM's scaling
 * of the staged copy; _finish: after the exchange, the op's result from
 * every rank's staged data (from[r], size entries). */
bool tdist__oneshot_op(tdist__op_t op);
size_t tdist__oneshot_bytes(const tdist__coll_args_t *a, int size);
size_t tdist__oneshot_len(const tdist__coll_args_t *a, int size, int rank);
const void *tdist__oneshot_input(const tdist__coll_ctx_t *c, const tdist__coll_args_t *a,
                                     size_t *bytes);
tdist_status_t tdist__oneshot_scale(const tdist__coll_args_t *a, void *staged, size_t bytes);
/* out = a's reduce op over from[r] + off of every rank r, in rank order
 * (the same bits on every rank), then AVG's division. */
tdist_status_t tdist__oneshot_reduce(const tdist__coll_ctx_t *c, const tdist__coll_args_t *a,
                                    const uint8_t *const *from, size_t off, void *out);
tdist_status_t tdist__oneshot_finish(const tdist__coll_ctx_t *c, const tdist__coll_args_t *a,
                                         const uint8_t *const *from);

/* How a rank takes part in a rooted one-shot collective that a blocking
 * call runs (c->spin): a sender (broadcast's and scatter's root,
 * reduce's and gather's other ranks) hands its data on and leaves
 * without waiting for the peers' fingerprints; a broadcast's or
 * scatter's other ranks take the root's alone (FROM_ROOT); reduce's and
 * gather's root takes every rank's (FROM_ALL). What a rank did not wait
 * for is compared later (shm_coll.c "checking", fused.c): a difference
 * fails that rank's next collective, naming the one that differed. An
 * asynchronous call (its work carries the verdict), a call without
 * pg/'s check and every other collective exchange with every rank
 * (ALL). */
typedef enum tdist__oneshot_role {
    TDIST__ROLE_ALL = 0,
    TDIST__ROLE_SEND,
    TDIST__ROLE_FROM_ROOT,
    TDIST__ROLE_FROM_ALL,
} tdist__oneshot_role_t;
tdist__oneshot_role_t tdist__oneshot_role(const tdist__coll_ctx_t *c,
                                          const tdist__coll_args_t *a,
                                          const tdist__coll_check_t *chk);

/* all_reduce (root < 0) or reduce to root through the staging area. */
tdist_status_t tdist__shmc_all_reduce(const tdist__coll_ctx_t *c, const void *sendbuf,
                                      void *recvbuf, size_t count, tdist_dtype_t dtype,
                                      tdist_redop_t op, double premul, int root);

/* An all_reduce through the staging area whose input and output are
 * converted on the way (all_reduce_wire.c): every rank's whole input,
 * its own slice included, is staged by load(arg, dst, at, n), which
 * writes elements [at, at + n) of the flat input as dtype into dst; the
 * slices are reduced as tdist__shmc_all_reduce reduces them (op over the
 * ranks' staged slices in rank order: the same bits on every rank); and
 * store(arg, src, at, n) takes the reduced elements [at, at + n) from src.
 * count: the flat input's elements. op: SUM, MIN, MAX or PROD. */
typedef struct tdist__shmc_conv {
    void (*load)(void *arg, void *dst, size_t at, size_t n);
    void (*store)(void *arg, const void *src, size_t at, size_t n);
    void *arg;
} tdist__shmc_conv_t;
tdist_status_t tdist__shmc_all_reduce_conv(const tdist__coll_ctx_t *c, size_t count,
                                           tdist_dtype_t dtype, tdist_redop_t op,
                                           const tdist__shmc_conv_t *conv);

/* The all_reduce over a 16-bit wire (all_reduce_wire.c; a->op
 * TDIST__OP_ALL_REDUCE_WIRE): a->bufs[0..nbufs) hold a->counts[i] f32
 * values each, reduced in place as one flat vector of a->count elements;
 * a->dtype is the wire (TDIST_F16 or TDIST_BF16), a->premul the divisor.
 * Each rank packs h = wire(fl(float(wire(x)) / divisor)) (core's
 * tdist__wire16_pack), the ranks' h are summed in the wire dtype as a
 * 16-bit all_reduce sums them (each addition rounded to the wire), and
 * every rank gets float(sum), the same bits everywhere. Shared memory:
 * packed while staged and unpacked while copied out (no separate pass);
 * point-to-point and a backend's slot: packed into scratch, the 16-bit
 * all_reduce, unpacked. Runs after the route's first exchange. */
tdist_status_t tdist__coll_all_reduce_wire(const tdist__coll_ctx_t *c, const tdist__coll_args_t *a,
                                           const tdist__coll_check_t *chk);

/* broadcast of root's buf through the staging area. */
tdist_status_t tdist__shmc_broadcast(const tdist__coll_ctx_t *c, void *buf, size_t count,
                                     tdist_dtype_t dtype, int root);

/* reduce_scatter (recvcount elements a rank) through the staging area:
 * rank r's recvbuf gets block r of the op over every rank's sendbuf, in
 * rank order (AVG divided, PREMUL_SUM scaled). recvbuf may be sendbuf's
 * block r (in place) or overlap it otherwise (a private copy is read).
 * Only for groups where tdist__shmc_reduce_scatter_fits(size). Blocks
 * until done or the deadline. */
bool tdist__shmc_reduce_scatter_fits(int size);
tdist_status_t tdist__shmc_reduce_scatter(const tdist__coll_ctx_t *c, const void *sendbuf,
                                          void *recvbuf, size_t recvcount, tdist_dtype_t dtype,
                                          tdist_redop_t op, double premul);

#endif /* TDIST_COLL_H */
