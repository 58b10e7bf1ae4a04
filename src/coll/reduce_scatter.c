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
 */
#include <stdlib.h>

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
