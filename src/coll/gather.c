/*
 * coll/gather.c — direct gather: the root posts one receive per rank
 * straight into place and copies its own block; every other rank sends
 * once. One round; the root's link carries (size - 1) blocks.
 */
#include <stdlib.h>

#include "coll/coll_internal.h"

tdist_status_t tdist__coll_gather(const tdist__coll_ctx_t *c, const void *sendbuf, void *recvbuf,
                                  size_t count, tdist_dtype_t dtype, int root)
{
    int n = c->size, r = c->rank;
    size_t bytes = tdist__coll_bytes(count, dtype);
    if (bytes == 0) return TDIST_OK;
    if (r != root) return tdist__coll_send(c, root, sendbuf, bytes);
    uint8_t *out = recvbuf;
    tdist__coll_copy(out + (size_t)r * bytes, sendbuf, bytes);
    if (n == 1) return TDIST_OK;
    tdist__tp_req_t *reqs = NULL, **rp;
    size_t nreq = 0;
    TDIST_CHECK(tdist__coll_alloc(c, (size_t)n * (sizeof *reqs + sizeof *rp), "gather",
                                  (void **)&reqs));
    rp = (tdist__tp_req_t **)(reqs + n);
    tdist_status_t st = TDIST_OK;
    for (int p = 0; p < n; p++) {
        if (p == r) continue;
        st = tdist__tp_post_recv(c->tp, &reqs[nreq], p, out + (size_t)p * bytes, bytes);
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
