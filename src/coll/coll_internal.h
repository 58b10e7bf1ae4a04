/*
 * coll/coll_internal.h — helpers shared by the algorithm files of coll/
 * and the algorithm entry points the selector in coll.c dispatches to.
 * Internal to coll/: nothing outside src/coll includes it.
 *
 * Every helper blocks at most until ctx->deadline_ms. A wait that ends with
 * requests still posted (timeout) aborts the transport before returning, so
 * no request (they live on the algorithms' stacks and heaps) stays linked
 * into the transport after the algorithm returns: a collective that timed
 * out leaves the byte streams at unknown positions, the group is unusable.
 */
#ifndef TDIST_COLL_INTERNAL_H
#define TDIST_COLL_INTERNAL_H

#include "coll/coll.h"

/* Bytes of count elements of dtype. */
static inline size_t tdist__coll_bytes(size_t count, tdist_dtype_t dtype)
{
    return count * tdist__dtype_size(dtype);
}

/* malloc(bytes) (at least 1 byte) or TDIST_ERR_NO_MEMORY naming what and
 * the rank. The caller frees *out. */
tdist_status_t tdist__coll_alloc(const tdist__coll_ctx_t *c, size_t bytes, const char *what,
                                 void **out);

/* The algorithm's one large temporary: from c->scratch when there is one
 * (grown as needed, kept for later calls), else malloc'ed. At most one at
 * a time per collective; give it back with tdist__coll_scratch_done. */
tdist_status_t tdist__coll_scratch_get(const tdist__coll_ctx_t *c, size_t bytes, const char *what,
                                       void **out);
void tdist__coll_scratch_done(const tdist__coll_ctx_t *c, void *p);

/* memmove unless dst == src or bytes == 0. */
void tdist__coll_copy(void *dst, const void *src, size_t bytes);

/* Wait for n posted requests until the deadline. On failure every request
 * is finished (unlinked) before returning: a timeout aborts the transport
 * (the timeout message is kept, naming the peers still owed bytes). */
tdist_status_t tdist__coll_wait(const tdist__coll_ctx_t *c, tdist__tp_req_t *const *reqs,
                                size_t n);

/* Unlink every request of reqs that is still posted (by aborting the
 * transport), keeping this thread's last error. For error paths, before
 * the requests' memory is freed or goes out of scope. */
void tdist__coll_abandon(const tdist__coll_ctx_t *c, tdist__tp_req_t *const *reqs, size_t n);

/* Post a receive of rlen bytes from `from` and a send of slen bytes to
 * `to` (either side skipped when its peer is < 0), then wait for both. */
tdist_status_t tdist__coll_sendrecv(const tdist__coll_ctx_t *c, int to, const void *sbuf,
                                    size_t slen, int from, void *rbuf, size_t rlen);
tdist_status_t tdist__coll_send(const tdist__coll_ctx_t *c, int to, const void *buf, size_t len);
tdist_status_t tdist__coll_recv(const tdist__coll_ctx_t *c, int from, void *buf, size_t len);

/* This rank's input as an algorithm that reads it in place sees it:
 * *src = sendbuf itself, except for PREMUL_SUM, whose input is first
 * scaled into buf (count elements; *src = buf). */
tdist_status_t tdist__coll_input(void *buf, const void *sendbuf, size_t count,
                                 tdist_dtype_t dtype, tdist_redop_t op, double premul,
                                 const void **src);

/* Copy sendbuf into buf (unless the same) and, for PREMUL_SUM, scale buf. */
tdist_status_t tdist__coll_load(void *buf, const void *sendbuf, size_t count, tdist_dtype_t dtype,
                                tdist_redop_t op, double premul);

/* The finishing step of a reduction: AVG divides by the group size
 * (truncating for integers); every other op does nothing. */
tdist_status_t tdist__coll_finish(const tdist__coll_ctx_t *c, void *buf, size_t count,
                                  tdist_dtype_t dtype, tdist_redop_t op);

/* Split count elements into size blocks as even as possible (the first
 * count % size blocks get one more); counts/displs have size entries. */
void tdist__coll_split(size_t count, int size, size_t *counts, size_t *displs);

/* ------------------------------------------------ per-op dispatch */

/* select.c: run the algorithm the plan names for a (after the route's
 * first exchange). */
tdist_status_t tdist__coll_run_algo(const tdist__coll_ctx_t *c, const tdist__coll_args_t *a,
                                    const tdist__coll_check_t *chk, tdist__coll_algo_t algo);

/* The routes that carry pg's check in their first exchange (coll.h:
 * tdist__coll_check_t): shm_line.c, fused.c,
 * monitored_barrier.c. */
tdist_status_t tdist__coll_shm_line(const tdist__coll_ctx_t *c, const tdist__coll_args_t *a,
                                    const tdist__coll_check_t *chk, tdist__coll_algo_t algo);
tdist_status_t tdist__coll_fused(const tdist__coll_ctx_t *c,
                                            const tdist__coll_args_t *a,
                                            const tdist__coll_check_t *chk);
tdist_status_t tdist__coll_monitored_barrier(const tdist__coll_ctx_t *c,
                                             const tdist__coll_check_t *chk);
/* An all_reduce of more than fused_max bytes and up to this many goes
 * along the tree too, in a group that runs the check there: each step
 * carries a block's partial reduction (reduced once, up to rank 0, and
 * handed down), 2 (size - 1) messages with the check, instead of the
 * check's and then recursive doubling's log2(size) full vectors a rank. */
#define TDIST__COLL_TREE_REDUCE_MAX (64u * 1024u)

/* fused_tree.c: pg's check along a k-nomial tree (up to rank 0 and back
 * down; select.c: tdist__coll_tree_on), and with a (NULL: the check
 * alone) the one-shot collective a, its data riding with the check;
 * every rank learns the same verdict, worded by chk->compare. */
tdist_status_t tdist__coll_tree_exchange(const tdist__coll_ctx_t *c, const tdist__coll_check_t *chk,
                                         const tdist__coll_args_t *a);
/* select.c: whether this call's first exchange runs along a tree
 * (tdist__coll_tree_exchange) rather than with every peer: a point-to-point
 * group of TDIST_CHECK_TREE_MIN ranks or more, pg's check on, outside a
 * Join (whose joined ranks read the leader's own stream). */
bool tdist__coll_tree_on(const tdist__coll_ctx_t *c, const tdist__coll_check_t *chk);
/* fused.c: read every acknowledgement owed by peer p (-1: by every peer)
 * and compare each with this rank's fingerprint of that collective:
 * TDIST_ERR_MISMATCH naming it (chk->compare_earlier) when one differs. */
tdist_status_t tdist__coll_fused_drain(const tdist__coll_ctx_t *c, const tdist__coll_check_t *chk,
                                       int p);

/* -------------------------------------------------------- algorithms */

/* all_reduce_*.c: same contract as tdist__coll_all_reduce (size >= 2). */
tdist_status_t tdist__coll_all_reduce_ring(const tdist__coll_ctx_t *c, const void *sendbuf,
                                           void *recvbuf, size_t count, tdist_dtype_t dtype,
                                           tdist_redop_t op, double premul);
tdist_status_t tdist__coll_all_reduce_rd(const tdist__coll_ctx_t *c, const void *sendbuf,
                                         void *recvbuf, size_t count, tdist_dtype_t dtype,
                                         tdist_redop_t op, double premul);
tdist_status_t tdist__coll_all_reduce_direct(const tdist__coll_ctx_t *c, const void *sendbuf,
                                             void *recvbuf, size_t count, tdist_dtype_t dtype,
                                             tdist_redop_t op, double premul);

/* reduce_scatter.c: ring reduce-scatter over uneven blocks (counts/
 * displs, size entries) of this rank's input src into buf (src == buf:
 * in place; otherwise src is only read): on return block `rank` of buf
 * holds the reduction of every rank's block `rank` (not finished: AVG is
 * not divided); the blocks it received on the way hold partial sums, the
 * others are untouched. */
tdist_status_t tdist__coll_reduce_scatter_ring(const tdist__coll_ctx_t *c, const void *src,
                                               void *buf, const size_t *counts,
                                               const size_t *displs, tdist_dtype_t dtype,
                                               tdist_redop_t op);

/* reduce_scatter.c: direct reduce-scatter (every block straight to its
 * rank, reduced there in rank order); same contract as
 * tdist__coll_reduce_scatter. recvbuf may overlap sendbuf. */
tdist_status_t tdist__coll_reduce_scatter_direct(const tdist__coll_ctx_t *c, const void *sendbuf,
                                                 void *recvbuf, size_t recvcount,
                                                 tdist_dtype_t dtype, tdist_redop_t op,
                                                 double premul);

/* all_gatherv.c: ring all-gather in place: block r of buf (counts/displs)
 * is filled from rank r. */
tdist_status_t tdist__coll_all_gatherv_ring_inplace(const tdist__coll_ctx_t *c, void *buf,
                                                    const size_t *counts, const size_t *displs,
                                                    size_t esize);

/* reduce_tree.c / reduce_rsg.c: same contract as tdist__coll_reduce. */
tdist_status_t tdist__coll_reduce_tree(const tdist__coll_ctx_t *c, const void *sendbuf,
                                       void *recvbuf, size_t count, tdist_dtype_t dtype,
                                       tdist_redop_t op, double premul, int root);
tdist_status_t tdist__coll_reduce_rsg(const tdist__coll_ctx_t *c, const void *sendbuf,
                                      void *recvbuf, size_t count, tdist_dtype_t dtype,
                                      tdist_redop_t op, double premul, int root);

/* broadcast_tree.c / broadcast_chain.c */
tdist_status_t tdist__coll_broadcast_tree(const tdist__coll_ctx_t *c, void *buf, size_t bytes,
                                          int root);
tdist_status_t tdist__coll_broadcast_chain(const tdist__coll_ctx_t *c, void *buf, size_t bytes,
                                           int root);

/* Thresholds of the selector (coll.c), in bytes. */
#define TDIST__COLL_AR_DIRECT_MAX 256u          /* all_reduce direct up to this */
#define TDIST__COLL_AR_RD_MAX (256u * 1024u)    /* recursive doubling below this */
#define TDIST__COLL_BCAST_CHAIN_MIN (1u << 20)  /* pipelined chain from this (size > 2) */
#define TDIST__COLL_CHAIN_SEG (256u * 1024u)    /* chain segment */
#ifndef TDIST__COLL_REDUCE_RSG_MIN /* a build may move it to compare */
#define TDIST__COLL_REDUCE_RSG_MIN (512u * 1024u) /* reduce: rs + gather from this */
#endif
#define TDIST__COLL_AG_DIRECT_MAX (32u * 1024u) /* all_gatherv direct up to this total */
#ifndef TDIST__COLL_RS_DIRECT_RANKS
#define TDIST__COLL_RS_DIRECT_RANKS 8 /* reduce_scatter direct up to this many ranks */
#endif
#define TDIST__COLL_RS_RING_2R_MIN (2u * 1024u * 1024u) /* ... but a ring on 2 ranks from this input */

#endif /* TDIST_COLL_INTERNAL_H */
