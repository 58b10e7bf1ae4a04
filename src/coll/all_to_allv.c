/*
 * coll/all_to_allv.c — pairwise all-to-all with uneven splits: rank r
 * posts its receive from every rank r - k and its send to every rank r + k
 * (k = 1 .. size - 1, that staggered order so no rank is everyone's first
 * target), copies its own block, and waits for all of them together; the
 * transport moves every pair at once.
 */
#include <stdlib.h>

#include "coll/coll_internal.h"

tdist_status_t tdist__coll_all_to_allv(const tdist__coll_ctx_t *c, const void *sendbuf,
                                       const size_t *sendcounts, void *recvbuf,
                                       const size_t *recvcounts, tdist_dtype_t dtype)
{
    int n = c->size, r = c->rank;
    size_t es = tdist_dtype_size(dtype);
    size_t *sd = NULL;
    TDIST_CHECK(tdist__coll_alloc(c, 2 * (size_t)n * sizeof *sd, "all_to_allv", (void **)&sd));
    size_t *rd = sd + n, so = 0, ro = 0;
    for (int p = 0; p < n; p++) {
        sd[p] = so;
        rd[p] = ro;
        so += sendcounts[p];
        ro += recvcounts[p];
    }
    const uint8_t *in = sendbuf;
    uint8_t *out = recvbuf;
    tdist__coll_copy(out + rd[r] * es, in + sd[r] * es, recvcounts[r] * es);
    tdist__tp_req_t *reqs = NULL, **rp = NULL;
    size_t nreq = 0;
    tdist_status_t st = TDIST_OK;
    if (n > 1) {
        st = tdist__coll_alloc(c, 2 * (size_t)n * (sizeof *reqs + sizeof *rp), "all_to_allv",
                               (void **)&reqs);
        if (st != TDIST_OK) goto out;
        rp = (tdist__tp_req_t **)(reqs + 2 * n);
        for (int k = 1; k < n && st == TDIST_OK; k++) {
            int from = (r - k + n) % n, to = (r + k) % n;
            st = tdist__tp_post_recv(c->tp, &reqs[nreq], from, out + rd[from] * es,
                                     recvcounts[from] * es);
            if (st != TDIST_OK) break;
            rp[nreq] = &reqs[nreq];
            nreq++;
            st = tdist__tp_post_send(c->tp, &reqs[nreq], to, in + sd[to] * es, sendcounts[to] * es);
            if (st != TDIST_OK) break;
            rp[nreq] = &reqs[nreq];
            nreq++;
        }
        if (st == TDIST_OK)
            st = tdist__coll_wait(c, rp, nreq);
        else
            tdist__coll_abandon(c, rp, nreq);
    }
out:
    free(reqs);
    free(sd);
    return st;
}
