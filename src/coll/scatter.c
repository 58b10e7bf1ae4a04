/*
 * coll/scatter.c — direct scatter: the root posts one send per rank from
 * its block of sendbuf and copies its own block; every other rank
 * receives once. One round.
 */
#include <stdlib.h>

#include "coll/coll_internal.h"

tdist_status_t tdist__coll_scatter(const tdist__coll_ctx_t *c, const void *sendbuf,
                                   void *recvbuf, size_t count, tdist_dtype_t dtype, int root)
{
    int n = c->size, r = c->rank;
    size_t bytes = tdist__coll_bytes(count, dtype);
    if (bytes == 0) return TDIST_OK;
    if (r != root) return tdist__coll_recv(c, root, recvbuf, bytes);
    const uint8_t *in = sendbuf;
    tdist__coll_copy(recvbuf, in + (size_t)r * bytes, bytes);
    if (n == 1) return TDIST_OK;
    tdist__tp_req_t *reqs = NULL, **rp;
    size_t nreq = 0;
    TDIST_CHECK(tdist__coll_alloc(c, (size_t)n * (sizeof *reqs + sizeof *rp), "scatter",
                                  (void **)&reqs));
    rp = (tdist__tp_req_t **)(reqs + n);
    tdist_status_t st = TDIST_OK;
    for (int k = 1; k < n; k++) {
        int p = (r + k) % n;
        st = tdist__tp_post_send(c->tp, &reqs[nreq], p, in + (size_t)p * bytes, bytes);
        if (st != TDIST_OK) break;
        rp[nreq] = &reqs[nreq];
        nreq++;
    }
    if (st == TDIST_OK)
        st = tdist__coll_wait(c, rp, nreq);
    else
        tdist__coll_abandon(c, rp, nreq);
    free(reqs);
    return st;
}
