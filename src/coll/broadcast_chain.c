/*
 * coll/broadcast_chain.c — pipelined chain broadcast for large messages:
 * relative rank v receives segment i from v - 1 and forwards it to v + 1
 * as soon as it has arrived, while later segments are still arriving.
 * Every receive is posted up front (they fill in order), so the link into
 * a rank and the link out of it run at once; bandwidth ~ one link, latency
 * ~ (size - 1) segments.
 */
#include <stdlib.h>

#include "coll/coll_internal.h"

tdist_status_t tdist__coll_broadcast_chain(const tdist__coll_ctx_t *c, void *buf, size_t bytes,
                                           int root)
{
    int n = c->size, v = (c->rank - root + n) % n;
    int prev = v > 0 ? (c->rank - 1 + n) % n : -1;
    int next = v < n - 1 ? (c->rank + 1) % n : -1;
    size_t seg = TDIST__COLL_CHAIN_SEG, nseg = (bytes + seg - 1) / seg;
    uint8_t *p = buf;
    tdist__tp_req_t *rq = NULL, *sq = NULL, **all = NULL;
    tdist_status_t st;
    st = tdist__coll_alloc(c, 2 * nseg * sizeof *rq, "broadcast chain requests", (void **)&rq);
    if (st != TDIST_OK) return st;
    sq = rq + nseg;
    st = tdist__coll_alloc(c, 2 * nseg * sizeof *all, "broadcast chain requests", (void **)&all);
    if (st != TDIST_OK) goto out;
    size_t nall = 0;
    if (prev >= 0)
        for (size_t i = 0; i < nseg; i++) {
            size_t off = i * seg, len = bytes - off < seg ? bytes - off : seg;
            st = tdist__tp_post_recv(c->tp, &rq[i], prev, p + off, len);
            if (st != TDIST_OK) goto fail;
            all[nall++] = &rq[i];
        }
    for (size_t i = 0; i < nseg; i++) {
        size_t off = i * seg, len = bytes - off < seg ? bytes - off : seg;
        if (prev >= 0) {
            tdist__tp_req_t *one = &rq[i];
            st = tdist__coll_wait(c, &one, 1);
            if (st != TDIST_OK) goto fail;
        }
        if (next >= 0) {
            st = tdist__tp_post_send(c->tp, &sq[i], next, p + off, len);
            if (st != TDIST_OK) goto fail;
            all[nall++] = &sq[i];
        }
    }
    st = tdist__coll_wait(c, all, nall);
    goto out;
fail:
    tdist__coll_abandon(c, all, nall); /* before the requests are freed */
out:
    free(all);
    free(rq);
    return st;
}
