/*
 * coll/reduce_scatter.c — ring reduce-scatter: size - 1 steps; in step s
 * rank r sends its partial of block (r - s - 1) to r + 1 and receives the
 * partial of block (r - s - 2) from r - 1, which it combines with its own
 * (reduce(received, mine): the chain order). Block k starts on rank k + 1
 * and ends, fully reduced, on rank k. Each rank sends and receives
 * (size - 1)/size of the data: a true reduce-scatter, never an all_reduce.
 *
 * Each step is cut into segments (TDIST__COLL_RS_SEG): every segment's
 * receive and send is posted at once, and a segment is reduced as soon as
 * it has arrived, while the following ones are still on the wire.
 *
 * Direct (tdist__coll_reduce_scatter_direct): every rank sends block q of
 * its input to rank q and receives its own block from every peer, all
 * posted at once (one round instead of size - 1), into the group's kept
 * scratch; it reduces them in rank order (the one-shot's and the shared-
 * memory path's order) as they arrive, straight into its output. The same
 * bytes on the wire as the ring, no buffer of the whole input per call.
 */
#include <stdlib.h>
#include <string.h>

#include "coll/coll_internal.h"

#define TDIST__COLL_RS_SEG (128u * 1024u)

tdist_status_t tdist__coll_reduce_scatter_ring(const tdist__coll_ctx_t *c, const void *src,
                                               void *buf, const size_t *counts,
                                               const size_t *displs, tdist_dtype_t dtype,
                                               tdist_redop_t op)
{
    int n = c->size, r = c->rank;
    if (n == 1) return TDIST_OK;
    size_t es = tdist_dtype_size(dtype), maxc = 0;
    for (int i = 0; i < n; i++) maxc = counts[i] > maxc ? counts[i] : maxc;
    if (maxc == 0) return TDIST_OK;
    size_t segc = TDIST__COLL_RS_SEG / es; /* elements per segment */
    size_t maxseg = (maxc + segc - 1) / segc;
    const uint8_t *own = src; /* this rank's contributions, read once each */
    uint8_t *b = buf, *tmp = NULL;
    tdist__tp_req_t *reqs = NULL, **rp = NULL;
    size_t nreq = 0;
    tdist_status_t st = tdist__coll_scratch_get(c, maxc * es, "reduce_scatter ring", (void **)&tmp);
    if (st != TDIST_OK) return st;
    st = tdist__coll_alloc(c, 2 * maxseg * (sizeof *reqs + sizeof *rp), "reduce_scatter ring",
                           (void **)&reqs);
    if (st != TDIST_OK) goto out;
    rp = (tdist__tp_req_t **)(reqs + 2 * maxseg);
    int to = (r + 1) % n, from = (r - 1 + n) % n;
    for (int s = 0; s < n - 1; s++) {
        int sb = ((r - s - 1) % n + n) % n, rb = ((r - s - 2) % n + n) % n;
        size_t rsegs = (counts[rb] + segc - 1) / segc, ssegs = (counts[sb] + segc - 1) / segc;
        nreq = 0;
        for (size_t i = 0; i < rsegs; i++) {
            size_t off = i * segc, len = counts[rb] - off < segc ? counts[rb] - off : segc;
            st = tdist__tp_post_recv(c->tp, &reqs[nreq], from, tmp + off * es, len * es);
            if (st != TDIST_OK) goto fail;
            rp[nreq] = &reqs[nreq];
            nreq++;
        }
        for (size_t i = 0; i < ssegs; i++) {
            size_t off = i * segc, len = counts[sb] - off < segc ? counts[sb] - off : segc;
            /* step 0 sends an own block; later ones, the block reduced
             * in the step before */
            const uint8_t *from_buf = s == 0 ? own : b;
            st = tdist__tp_post_send(c->tp, &reqs[nreq], to, from_buf + (displs[sb] + off) * es,
                                     len * es);
            if (st != TDIST_OK) goto fail;
            rp[nreq] = &reqs[nreq];
            nreq++;
        }
        for (size_t i = 0; i < rsegs; i++) {
            size_t off = i * segc, len = counts[rb] - off < segc ? counts[rb] - off : segc;
            st = tdist__coll_wait(c, &rp[i], 1);
            if (st != TDIST_OK) goto fail;
            size_t at = (displs[rb] + off) * es;
            st = tdist_reduce(b + at, tmp + off * es, own + at, len, dtype, op);
            if (st != TDIST_OK) goto fail;
        }
        st = tdist__coll_wait(c, rp, nreq);
        if (st != TDIST_OK) goto fail;
    }
    goto out;
fail:
    tdist__coll_abandon(c, rp, nreq);
out:
    free(reqs);
    tdist__coll_scratch_done(c, tmp);
    return st;
}

tdist_status_t tdist__coll_reduce_scatter(const tdist__coll_ctx_t *c, const void *sendbuf,
                                          void *recvbuf, size_t recvcount, tdist_dtype_t dtype,
                                          tdist_redop_t op, double premul)
{
    int n = c->size, r = c->rank;
    if (recvcount == 0) return TDIST_OK;
    size_t es = tdist_dtype_size(dtype), total = recvcount * (size_t)n;
    if (n == 1) {
        TDIST_CHECK(tdist__coll_load(recvbuf, sendbuf, recvcount, dtype, op, premul));
        return tdist__coll_finish(c, recvbuf, recvcount, dtype, op);
    }
    uint8_t *work = NULL;
    size_t *counts = NULL;
    TDIST_CHECK(tdist__coll_alloc(c, total * es, "reduce_scatter", (void **)&work));
    tdist_status_t st = tdist__coll_alloc(c, 2 * (size_t)n * sizeof *counts, "reduce_scatter",
                                          (void **)&counts);
    if (st != TDIST_OK) {
        free(work);
        return st;
    }
    size_t *displs = counts + n;
    for (int i = 0; i < n; i++) {
        counts[i] = recvcount;
        displs[i] = (size_t)i * recvcount;
    }
    const void *src = NULL; /* the ring reads the input where it is */
    st = tdist__coll_input(work, sendbuf, total, dtype, op, premul, &src);
    if (st == TDIST_OK)
        st = tdist__coll_reduce_scatter_ring(c, src, work, counts, displs, dtype, op);
    uint8_t *mine = work + displs[r] * es;
    if (st == TDIST_OK) st = tdist__coll_finish(c, mine, recvcount, dtype, op);
    if (st == TDIST_OK) tdist__coll_copy(recvbuf, mine, recvcount * es);
    free(counts);
    free(work);
    return st;
}

/* ------------------------------------------------------------ direct */

/* Wait for request i of rp's first n (the others stay posted). */
static tdist_status_t wait_one(const tdist__coll_ctx_t *c, tdist__tp_req_t **rp, size_t i)
{
    return tdist__coll_wait(c, &rp[i], 1);
}

/* Post block `to` of the input to every peer and a receive of block
 * `rank` from every peer into slot p of the scratch s (rp: 2 (size - 1)). */
static tdist_status_t rs_direct_post(const tdist__coll_ctx_t *c, const uint8_t *in, uint8_t *s,
                                     size_t bb, tdist__tp_req_t *reqs, tdist__tp_req_t **rp,
                                     size_t *nreq)
{
    int n = c->size, r = c->rank;
    /* staggered (rank r first sends to r + 1) so no rank is everyone's first target */
    for (int k = 1; k < n; k++) {
        int from = (r - k + n) % n, to = (r + k) % n;
        TDIST_CHECK(tdist__tp_post_recv(c->tp, &reqs[*nreq], from, s + (size_t)from * bb, bb));
        rp[*nreq] = &reqs[*nreq];
        (*nreq)++;
        TDIST_CHECK(tdist__tp_post_send(c->tp, &reqs[*nreq], to, in + (size_t)to * bb, bb));
        rp[*nreq] = &reqs[*nreq];
        (*nreq)++;
    }
    return TDIST_OK;
}

tdist_status_t tdist__coll_reduce_scatter_direct(const tdist__coll_ctx_t *c, const void *sendbuf,
                                                 void *recvbuf, size_t recvcount,
                                                 tdist_dtype_t dtype, tdist_redop_t op,
                                                 double premul)
{
    int n = c->size, r = c->rank;
    if (recvcount == 0) return TDIST_OK;
    size_t es = tdist_dtype_size(dtype), bb = recvcount * es, total = bb * (size_t)n;
    if (n == 1) {
        TDIST_CHECK(tdist__coll_load(recvbuf, sendbuf, recvcount, dtype, op, premul));
        return tdist__coll_finish(c, recvbuf, recvcount, dtype, op);
    }
    const uint8_t *in = sendbuf, *own = in + (size_t)r * bb;
    uint8_t *out = recvbuf, *s = NULL;
    /* an output over the input: the own block is copied first and nothing
     * is written before every send has left */
    bool overlap = out < in + total && in < out + bb;
    bool copy_own = overlap || op == TDIST_PREMUL_SUM;
    tdist__tp_req_t *reqs = NULL, **rp = NULL;
    size_t nreq = 0;
    tdist_status_t st = tdist__coll_scratch_get(c, total, "reduce_scatter direct", (void **)&s);
    if (st != TDIST_OK) return st;
    st = tdist__coll_alloc(c, 2 * (size_t)n * (sizeof *reqs + sizeof *rp), "reduce_scatter direct",
                           (void **)&reqs);
    if (st != TDIST_OK) goto out;
    rp = (tdist__tp_req_t **)(reqs + 2 * n);
    if (copy_own) { /* PREMUL_SUM: every block scaled before the sum, as the others do */
        memcpy(s + (size_t)r * bb, own, bb);
        own = s + (size_t)r * bb;
        if (op == TDIST_PREMUL_SUM) st = tdist_scale(s + (size_t)r * bb, recvcount, dtype, premul);
    }
    if (st == TDIST_OK) st = rs_direct_post(c, in, s, bb, reqs, rp, &nreq);
    if (st == TDIST_OK && overlap) st = tdist__coll_wait(c, rp, nreq);
    if (st != TDIST_OK) goto fail;
    /* rank order; block p's receive is request 2 ((r - p) mod n) - 2 */
    for (int p = 0; p < n && st == TDIST_OK; p++) {
        const uint8_t *b = own;
        if (p != r) {
            size_t i = 2 * (size_t)(((r - p) % n + n) % n) - 2;
            if (!overlap) st = wait_one(c, rp, i);
            if (st == TDIST_OK && op == TDIST_PREMUL_SUM)
                st = tdist_scale(s + (size_t)p * bb, recvcount, dtype, premul);
            b = s + (size_t)p * bb;
        }
        if (st != TDIST_OK) break;
        if (p == 0) continue;
        st = tdist_reduce(out, p == 1 ? (r == 0 ? own : s) : out, b, recvcount, dtype, op);
    }
    if (st == TDIST_OK) st = tdist__coll_wait(c, rp, nreq);
    if (st == TDIST_OK) st = tdist__coll_finish(c, out, recvcount, dtype, op);
    if (st == TDIST_OK) goto out;
fail:
    tdist__coll_abandon(c, rp, nreq);
out:
    free(reqs);
    tdist__coll_scratch_done(c, s);
    return st;
}
