/*
 * coll/all_gatherv.c — all-gather with uneven counts.
 *  - direct (total <= TDIST__COLL_AG_DIRECT_MAX bytes): every receive and
 *    every send posted at once, one round;
 *  - ring: size - 1 steps; in step s rank r forwards block (r - s) to
 *    r + 1 and receives block (r - s - 1) from r - 1 straight into place.
 */
#include <stdlib.h>

#include "coll/coll_internal.h"

tdist_status_t tdist__coll_all_gatherv_ring_inplace(const tdist__coll_ctx_t *c, void *buf,
                                                    const size_t *counts, const size_t *displs,
                                                    size_t esize)
{
    int n = c->size, r = c->rank;
    uint8_t *b = buf;
    int to = (r + 1) % n, from = (r - 1 + n) % n;
    for (int s = 0; s < n - 1; s++) {
        int sb = ((r - s) % n + n) % n, rb = ((r - s - 1) % n + n) % n;
        TDIST_CHECK(tdist__coll_sendrecv(c, to, b + displs[sb] * esize, counts[sb] * esize, from,
                                         b + displs[rb] * esize, counts[rb] * esize));
    }
    return TDIST_OK;
}

static tdist_status_t all_gatherv_direct(const tdist__coll_ctx_t *c, void *buf,
                                         const size_t *counts, const size_t *displs, size_t esize)
{
    int n = c->size, r = c->rank;
    uint8_t *b = buf;
    tdist__tp_req_t *reqs = NULL, **rp;
    size_t nreq = 0;
    TDIST_CHECK(tdist__coll_alloc(c, 2 * (size_t)n * (sizeof *reqs + sizeof *rp), "all_gatherv",
                                  (void **)&reqs));
    rp = (tdist__tp_req_t **)(reqs + 2 * n);
    tdist_status_t st = TDIST_OK;
    for (int k = 1; k < n; k++) {
        int from = (r - k + n) % n;
        st = tdist__tp_post_recv(c->tp, &reqs[nreq], from, b + displs[from] * esize,
                                 counts[from] * esize);
        if (st != TDIST_OK) goto fail;
        rp[nreq] = &reqs[nreq];
        nreq++;
    }
    for (int k = 1; k < n; k++) {
        st = tdist__tp_post_send(c->tp, &reqs[nreq], (r + k) % n, b + displs[r] * esize,
                                 counts[r] * esize);
        if (st != TDIST_OK) goto fail;
        rp[nreq] = &reqs[nreq];
        nreq++;
    }
    st = tdist__coll_wait(c, rp, nreq);
    goto out;
fail:
    tdist__coll_abandon(c, rp, nreq);
out:
    free(reqs);
    return st;
}

tdist_status_t tdist__coll_all_gatherv(const tdist__coll_ctx_t *c, const void *sendbuf,
                                       void *recvbuf, const size_t *recvcounts,
                                       tdist_dtype_t dtype)
{
    int n = c->size, r = c->rank;
    size_t es = tdist_dtype_size(dtype);
    size_t *displs = NULL;
    TDIST_CHECK(tdist__coll_alloc(c, (size_t)n * sizeof *displs, "all_gatherv", (void **)&displs));
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        displs[i] = total;
        total += recvcounts[i];
    }
    tdist_status_t st = TDIST_OK;
    if (recvcounts[r])
        tdist__coll_copy((uint8_t *)recvbuf + displs[r] * es, sendbuf, recvcounts[r] * es);
    if (n > 1 && total > 0) {
        if (total * es <= TDIST__COLL_AG_DIRECT_MAX)
            st = all_gatherv_direct(c, recvbuf, recvcounts, displs, es);
        else
            st = tdist__coll_all_gatherv_ring_inplace(c, recvbuf, recvcounts, displs, es);
    }
    free(displs);
    return st;
}
