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

typedef struct tdist__coll_ctx {
    tdist__tp_t *tp;     /* mesh over the group's ranks */
    int rank, size;      /* this rank and the group size */
    int64_t deadline_ms; /* absolute (tdist__now_ms clock); INT64_MAX: none */
} tdist__coll_ctx_t;

/* Algorithms the selector may pick. When the caller passes TDIST__AR_AUTO,
 * TDIST_ALGO_ALLREDUCE ("ring", "rd", "direct", "auto"; for tests) may
 * force one; any other value is TDIST_ERR_INVALID_ARG. Thresholds: coll.c. */
typedef enum tdist__ar_algo {
    TDIST__AR_AUTO = 0,
    TDIST__AR_RING,   /* reduce-scatter + all-gather: bandwidth */
    TDIST__AR_RD,     /* recursive doubling (non-powers of two folded): latency */
    TDIST__AR_DIRECT  /* everyone exchanges everything: tiny messages, small worlds */
} tdist__ar_algo_t;

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

#endif /* TDIST_COLL_H */
