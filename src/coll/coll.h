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
 * all_reduce_rd.c, broadcast_tree.c, ...; coll.c holds the selection
 * by size and world size.
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

typedef struct tdist__coll_ctx {
    tdist__tp_t *tp;     /* mesh over the group's ranks */
    tdist__shmc_t *shm;  /* shared-memory collectives (shm_coll.c), or NULL */
    bool spin;           /* shm waits may spin: the caller's thread runs it (inline) */
    tdist__coll_scratch_t *scratch; /* kept between calls, or NULL (malloc each time) */
    int rank, size;      /* this rank and the group size */
    int64_t deadline_ms; /* absolute (tdist__now_ms clock); INT64_MAX: none */
    /* deadline_ms is a timeout instead (ms, < 0: none), counted from when a
     * shm wait stops spinning: for a collective that is a single wait, so
     * that peers already there cost no clock read (the tiny all_reduce) */
    bool lazy_deadline;
    tdist__ar_algo_t ar_forced; /* the group's TDIST_ALGO_ALLREDUCE (AUTO: none) */
} tdist__coll_ctx_t;


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
 *    of every collective, so it is also the check of rule 2 and a barrier;
 *  - all_reduce / reduce: chunks of the input staged in a 2-slot area,
 *    each rank reducing its slice of every chunk in rank order (results
 *    bit-identical on every rank), peers copying the reduced slices out;
 *  - broadcast: the root stages chunks, the others copy them out.
 * Waits go through tdist__tp_wait_until (spin, yield, futex; liveness). */

#define TDIST__SHMC_BLOB_MAX 400 /* the part every reader reads */
#define TDIST__SHMC_AUX_MAX 96   /* a part read only when needed */

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
 * gives this rank's blob (TDIST__SHMC_BLOB_MAX bytes) and *aux
 * (TDIST__SHMC_AUX_MAX bytes) of its next exchange, to fill; then
 * tdist__shmc_post publishes len and aux_len bytes of them, and
 * tdist__shmc_gather waits as tdist__shmc_exchange does. */
uint8_t *tdist__shmc_begin(const tdist__coll_ctx_t *c, uint8_t **aux);
void tdist__shmc_post(const tdist__coll_ctx_t *c, size_t len, size_t aux_len);
tdist_status_t tdist__shmc_gather(const tdist__coll_ctx_t *c, const uint8_t **blobs, size_t *lens);

/* The two halves of an exchange, for a protocol in which only some ranks
 * read: publish this rank's blob for the next exchange (no wait), and
 * read rank r's blob of the current exchange if it has published it
 * (NULL otherwise). */
void tdist__shmc_publish(const tdist__coll_ctx_t *c, const void *blob, size_t len,
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

/* One-shot small all_reduce (shm_coll.c): before the exchange that
 * carries its fingerprint, tdist__shmc_stage_small copies this rank's
 * input (bytes <= tdist__shmc_small_max()) into its slot for that
 * exchange (waiting, bounded by c->deadline_ms, until every peer is done
 * with the slots); after the exchange, tdist__shmc_reduce_small writes
 * op over every rank's input, in rank order, into dst (AVG sums; the
 * caller divides). Not for PREMUL_SUM. */
size_t tdist__shmc_small_max(void);
tdist_status_t tdist__shmc_stage_small(const tdist__coll_ctx_t *c, const void *src, size_t bytes);
void tdist__shmc_reduce_small(const tdist__coll_ctx_t *c, void *dst, size_t count,
                              tdist_dtype_t dtype, tdist_redop_t op);

/* all_reduce (root < 0) or reduce to root through the staging area. */
tdist_status_t tdist__shmc_all_reduce(const tdist__coll_ctx_t *c, const void *sendbuf,
                                      void *recvbuf, size_t count, tdist_dtype_t dtype,
                                      tdist_redop_t op, double premul, int root);

/* broadcast of root's buf through the staging area. */
tdist_status_t tdist__shmc_broadcast(const tdist__coll_ctx_t *c, void *buf, size_t count,
                                     tdist_dtype_t dtype, int root);

#endif /* TDIST_COLL_H */
