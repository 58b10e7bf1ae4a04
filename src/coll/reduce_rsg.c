/*
 * coll/reduce_rsg.c — reduce for large messages: a ring reduce-scatter
 * (reduce_scatter.c) over size nearly equal blocks of the input, into
 * scratch (the root: its recvbuf), leaves block r reduced on rank r; each
 * rank finishes its block (AVG) and sends it straight into place in the
 * root's recvbuf (the root posts every receive at once). Every rank sends
 * ~2 (size-1)/size of the data instead of the tree's log2(size) full
 * vectors through the root, and the reduction work is spread over all
 * ranks.
 */
#include <stdlib.h>

#include "coll/coll_internal.h"

tdist_status_t tdist__coll_reduce_rsg(const tdist__coll_ctx_t *c, const void *sendbuf,
                                      void *recvbuf, size_t count, tdist_dtype_t dtype,
                                      tdist_redop_t op, double premul, int root)
{
    int n = c->size, r = c->rank;
    size_t es = tdist_dtype_size(dtype), bytes = count * es;
    if (bytes == 0) return TDIST_OK;
    uint8_t *work = NULL;
    size_t *counts = NULL;
    tdist__tp_req_t *reqs = NULL, **rp = NULL;
    size_t nreq = 0;
    /* the root works in recvbuf itself; the others in scratch */
    tdist_status_t st = TDIST_OK;
    if (r == root) {
        work = recvbuf;
    } else {
        st = tdist__coll_alloc(c, bytes, "reduce (reduce-scatter + gather)", (void **)&work);
        if (st != TDIST_OK) return st;
    }
    size_t meta = 2 * (size_t)n * sizeof *counts + (size_t)n * (sizeof *reqs + sizeof *rp);
    st = tdist__coll_alloc(c, meta, "reduce (reduce-scatter + gather)", (void **)&counts);
    if (st != TDIST_OK) goto out;
    size_t *displs = counts + n;
    reqs = (tdist__tp_req_t *)(displs + n);
    rp = (tdist__tp_req_t **)(reqs + n);
    tdist__coll_split(count, n, counts, displs);
    const void *src = NULL; /* the ring reads the input where it is */
    st = tdist__coll_input(work, sendbuf, count, dtype, op, premul, &src);
    if (st == TDIST_OK)
        st = tdist__coll_reduce_scatter_ring(c, src, work, counts, displs, dtype, op);
    if (st == TDIST_OK) st = tdist__coll_finish(c, work + displs[r] * es, counts[r], dtype, op);
    if (st != TDIST_OK) goto out;
    if (r != root) {
        st = tdist__coll_send(c, root, work + displs[r] * es, counts[r] * es);
        goto out;
    }
    for (int p = 0; p < n; p++) {
        if (p == r) continue;
        st = tdist__tp_post_recv(c->tp, &reqs[nreq], p, work + displs[p] * es, counts[p] * es);
        if (st != TDIST_OK) {
            tdist__coll_abandon(c, rp, nreq);
            goto out;
        }
        rp[nreq] = &reqs[nreq];
        nreq++;
    }
    st = tdist__coll_wait(c, rp, nreq);
out:
    free(counts);
    if (work != recvbuf) free(work);
    return st;
}
