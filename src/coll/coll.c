/*
 * coll/coll.c — shared helpers of the collective algorithms and the
 * selection of an algorithm by message size and world size.
 *
 * all_reduce (size >= 2; the algo argument forces one; when it is AUTO,
 * the group's TDIST_ALGO_ALLREDUCE=ring|rd|direct|auto, read when the
 * group was created, does):
 *   bytes <= 256                  direct (one round, every rank reduces all
 *                                 inputs in rank order)
 *   bytes < 256 KiB or count < size  recursive doubling (non-powers of two
 *                                 folded into the next lower power of two)
 *   otherwise                     ring: reduce-scatter + all-gather
 * reduce: binomial tree; from 512 KiB (and count >= size) ring
 *   reduce-scatter + gather of the blocks to the root.
 * broadcast: binomial tree; pipelined chain (256 KiB segments) from 1 MiB
 *   when size > 2.
 * all_gatherv: direct (everything posted at once) up to 32 KiB in total,
 *   ring above.
 * With shared-memory collectives (c->shm, every rank on one host):
 *   all_reduce (unless TDIST_ALGO_ALLREDUCE forces an algorithm), reduce
 *   and broadcast go through the staging area (shm_coll.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll/coll_internal.h"

/* ------------------------------------------------------------ helpers */

tdist_status_t tdist__coll_alloc(const tdist__coll_ctx_t *c, size_t bytes, const char *what,
                                 void **out)
{
    void *p = malloc(bytes ? bytes : 1);
    if (!p)
        return tdist__error(TDIST_ERR_NO_MEMORY, "rank %d: collective scratch for %s: cannot "
                            "allocate %zu bytes", c->rank, what, bytes);
    *out = p;
    return TDIST_OK;
}

tdist_status_t tdist__coll_scratch_get(const tdist__coll_ctx_t *c, size_t bytes, const char *what,
                                       void **out)
{
    tdist__coll_scratch_t *s = c->scratch;
    if (!s) return tdist__coll_alloc(c, bytes, what, out);
    if (s->len < bytes) {
        void *p = malloc(bytes);
        if (!p)
            return tdist__error(TDIST_ERR_NO_MEMORY, "rank %d: collective scratch for %s: cannot "
                                "allocate %zu bytes", c->rank, what, bytes);
        free(s->p);
        s->p = p;
        s->len = bytes;
    }
    *out = s->p;
    return TDIST_OK;
}

void tdist__coll_scratch_done(const tdist__coll_ctx_t *c, void *p)
{
    if (!c->scratch || p != c->scratch->p) free(p);
}

void tdist__coll_scratch_release(tdist__coll_scratch_t *s)
{
    if (!s) return;
    free(s->p);
    s->p = NULL;
    s->len = 0;
}

void tdist__coll_copy(void *dst, const void *src, size_t bytes)
{
    if (bytes && dst != src) memmove(dst, src, bytes);
}

/* Unlink every request that is still posted by aborting the transport
 * (its pending requests all finish). */
void tdist__coll_abandon(const tdist__coll_ctx_t *c, tdist__tp_req_t *const *reqs, size_t n)
{
    bool pending = false;
    for (size_t i = 0; i < n; i++) pending = pending || !tdist__tp_req_done(reqs[i]);
    if (!pending) return;
    char msg[512];
    snprintf(msg, sizeof msg, "%s", tdist_last_error());
    tdist__tp_abort(c->tp);
    (void)tdist__tp_progress(c->tp, 0); /* finishes every request with ABORTED */
    (void)tdist__error(TDIST_ERR_ABORTED, "%s", msg); /* restore the message */
}

tdist_status_t tdist__coll_wait(const tdist__coll_ctx_t *c, tdist__tp_req_t *const *reqs,
                                size_t n)
{
    tdist_status_t st = tdist__tp_wait(c->tp, reqs, n, c->deadline_ms);
    if (st == TDIST_OK) return st;
    bool pending = false;
    for (size_t i = 0; i < n; i++) pending = pending || !tdist__tp_req_done(reqs[i]);
    if (!pending) return st;
    char msg[512];
    snprintf(msg, sizeof msg, "%s", tdist_last_error());
    tdist__coll_abandon(c, reqs, n);
    return tdist__error(st, "%s (collective abandoned: transport aborted)", msg);
}

tdist_status_t tdist__coll_sendrecv(const tdist__coll_ctx_t *c, int to, const void *sbuf,
                                    size_t slen, int from, void *rbuf, size_t rlen)
{
    tdist__tp_req_t rq, sq;
    tdist__tp_req_t *reqs[2];
    size_t n = 0;
    if (from >= 0) {
        TDIST_CHECK(tdist__tp_post_recv(c->tp, &rq, from, rbuf, rlen));
        reqs[n++] = &rq;
    }
    if (to >= 0) {
        tdist_status_t st = tdist__tp_post_send(c->tp, &sq, to, sbuf, slen);
        if (st != TDIST_OK) {
            tdist__coll_abandon(c, reqs, n);
            return st;
        }
        reqs[n++] = &sq;
    }
    return tdist__coll_wait(c, reqs, n);
}

tdist_status_t tdist__coll_send(const tdist__coll_ctx_t *c, int to, const void *buf, size_t len)
{
    return tdist__coll_sendrecv(c, to, buf, len, -1, NULL, 0);
}

tdist_status_t tdist__coll_recv(const tdist__coll_ctx_t *c, int from, void *buf, size_t len)
{
    return tdist__coll_sendrecv(c, -1, NULL, 0, from, buf, len);
}

tdist_status_t tdist__coll_load(void *buf, const void *sendbuf, size_t count, tdist_dtype_t dtype,
                                tdist_redop_t op, double premul)
{
    if (count == 0) return TDIST_OK;
    tdist__coll_copy(buf, sendbuf, tdist__coll_bytes(count, dtype));
    if (op == TDIST_PREMUL_SUM) return tdist_scale(buf, count, dtype, premul);
    return TDIST_OK;
}

tdist_status_t tdist__coll_input(void *buf, const void *sendbuf, size_t count,
                                 tdist_dtype_t dtype, tdist_redop_t op, double premul,
                                 const void **src)
{
    *src = sendbuf;
    if (op != TDIST_PREMUL_SUM) return TDIST_OK;
    *src = buf;
    return tdist__coll_load(buf, sendbuf, count, dtype, op, premul);
}

tdist_status_t tdist__coll_finish(const tdist__coll_ctx_t *c, void *buf, size_t count,
                                  tdist_dtype_t dtype, tdist_redop_t op)
{
    if (op != TDIST_AVG || count == 0) return TDIST_OK;
    return tdist_divide(buf, count, dtype, c->size);
}

void tdist__coll_split(size_t count, int size, size_t *counts, size_t *displs)
{
    size_t base = count / (size_t)size, extra = count % (size_t)size, off = 0;
    for (int r = 0; r < size; r++) {
        counts[r] = base + ((size_t)r < extra ? 1 : 0);
        displs[r] = off;
        off += counts[r];
    }
}

/* ---------------------------------------------------------- selection */

tdist_status_t tdist__coll_forced_ar_algo(tdist__ar_algo_t *out)
{
    const char *e = getenv("TDIST_ALGO_ALLREDUCE");
    *out = TDIST__AR_AUTO;
    if (!e || !*e || strcmp(e, "auto") == 0) return TDIST_OK;
    if (strcmp(e, "ring") == 0)
        *out = TDIST__AR_RING;
    else if (strcmp(e, "rd") == 0)
        *out = TDIST__AR_RD;
    else if (strcmp(e, "direct") == 0)
        *out = TDIST__AR_DIRECT;
    else
        return tdist__error(TDIST_ERR_INVALID_ARG, "TDIST_ALGO_ALLREDUCE=\"%s\": expected ring, rd, "
                            "direct or auto", e);
    return TDIST_OK;
}

tdist_status_t tdist__coll_all_reduce(const tdist__coll_ctx_t *c, const void *sendbuf,
                                      void *recvbuf, size_t count, tdist_dtype_t dtype,
                                      tdist_redop_t op, double premul, tdist__ar_algo_t algo)
{
    if (count == 0) return TDIST_OK;
    if (c->size == 1) {
        TDIST_CHECK(tdist__coll_load(recvbuf, sendbuf, count, dtype, op, premul));
        return tdist__coll_finish(c, recvbuf, count, dtype, op);
    }
    if (algo == TDIST__AR_AUTO) algo = c->ar_forced;
    if (c->shm && algo == TDIST__AR_AUTO)
        return tdist__shmc_all_reduce(c, sendbuf, recvbuf, count, dtype, op, premul, -1);
    if (algo == TDIST__AR_AUTO) {
        size_t bytes = tdist__coll_bytes(count, dtype);
        if (bytes <= TDIST__COLL_AR_DIRECT_MAX)
            algo = TDIST__AR_DIRECT;
        else if (bytes < TDIST__COLL_AR_RD_MAX || count < (size_t)c->size)
            algo = TDIST__AR_RD;
        else
            algo = TDIST__AR_RING;
    }
    switch (algo) {
    case TDIST__AR_RING:
        return tdist__coll_all_reduce_ring(c, sendbuf, recvbuf, count, dtype, op, premul);
    case TDIST__AR_DIRECT:
        return tdist__coll_all_reduce_direct(c, sendbuf, recvbuf, count, dtype, op, premul);
    case TDIST__AR_RD:
    default:
        return tdist__coll_all_reduce_rd(c, sendbuf, recvbuf, count, dtype, op, premul);
    }
}

tdist_status_t tdist__coll_broadcast(const tdist__coll_ctx_t *c, void *buf, size_t count,
                                     tdist_dtype_t dtype, int root)
{
    size_t bytes = tdist__coll_bytes(count, dtype);
    if (bytes == 0 || c->size == 1) return TDIST_OK;
    if (c->shm) return tdist__shmc_broadcast(c, buf, count, dtype, root);
    if (bytes >= TDIST__COLL_BCAST_CHAIN_MIN && c->size > 2)
        return tdist__coll_broadcast_chain(c, buf, bytes, root);
    return tdist__coll_broadcast_tree(c, buf, bytes, root);
}

tdist_status_t tdist__coll_reduce(const tdist__coll_ctx_t *c, const void *sendbuf, void *recvbuf,
                                  size_t count, tdist_dtype_t dtype, tdist_redop_t op,
                                  double premul, int root)
{
    if (count == 0) return TDIST_OK;
    if (c->size == 1) {
        TDIST_CHECK(tdist__coll_load(recvbuf, sendbuf, count, dtype, op, premul));
        return tdist__coll_finish(c, recvbuf, count, dtype, op);
    }
    if (c->shm) return tdist__shmc_all_reduce(c, sendbuf, recvbuf, count, dtype, op, premul, root);
    size_t bytes = tdist__coll_bytes(count, dtype);
    if (bytes >= TDIST__COLL_REDUCE_RSG_MIN && count >= (size_t)c->size)
        return tdist__coll_reduce_rsg(c, sendbuf, recvbuf, count, dtype, op, premul, root);
    return tdist__coll_reduce_tree(c, sendbuf, recvbuf, count, dtype, op, premul, root);
}
