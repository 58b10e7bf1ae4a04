/*
 * coll/all_reduce_fused.c — a small all_reduce over point-to-point
 * transports in one exchange: each rank sends every peer its fingerprint
 * followed by its (premul-scaled) input; receives every peer's
 * fingerprint, has pg compare them (a mismatch is reported before any
 * payload is read, the same on every rank), then receives the payloads
 * and reduces them in rank order (bit-identical everywhere). Chosen only
 * from fingerprint fields (op, dtype, count), so ranks with equal
 * fingerprints agree on it.
 */
#include <string.h>

#include "coll/coll_internal.h"

/* Post a send to every peer and a receive from every peer of len bytes
 * (recv_at(p): where peer p's goes; a peer whose fingerprint is already
 * in hand (chk->have) is not received from when skip_have), then wait. */
static tdist_status_t exchange(const tdist__coll_ctx_t *c, const void *out, size_t out_len,
                               uint8_t *in, size_t in_stride, size_t in_len, int skip)
{
    tdist__coll_group_t *g = c->g;
    size_t k = 0;
    for (int p = 0; p < c->size; p++) {
        if (p == c->rank) continue;
        if (out) {
            TDIST_CHECK(tdist__tp_post_send(c->tp, &g->reqs[k], p, out, out_len));
            g->reqp[k] = &g->reqs[k];
            k++;
        }
        if (p == skip) continue;
        TDIST_CHECK(tdist__tp_post_recv(c->tp, &g->reqs[k], p, in + (size_t)p * in_stride, in_len));
        g->reqp[k] = &g->reqs[k];
        k++;
    }
    return tdist__tp_wait(c->tp, g->reqp, k, c->deadline_ms);
}

tdist_status_t tdist__coll_all_reduce_fused(const tdist__coll_ctx_t *c,
                                            const tdist__coll_args_t *a,
                                            const tdist__coll_check_t *chk)
{
    tdist__coll_group_t *g = c->g;
    int n = c->size, me = c->rank;
    size_t bytes = tdist__coll_bytes(a->count, a->dtype), fps = chk->len;
    uint8_t *mine = g->fused_out + fps;
    memcpy(g->fused_out, chk->common, fps);
    memcpy(mine, a->sendbuf, bytes);
    if (a->redop == TDIST_PREMUL_SUM) TDIST_CHECK(tdist_scale(mine, a->count, a->dtype, a->premul));
    TDIST_CHECK(exchange(c, g->fused_out, fps + bytes, chk->theirs, fps, fps, chk->have));
    TDIST_CHECK(chk->compare(chk->arg));
    TDIST_CHECK(exchange(c, NULL, 0, g->fused_in, g->fused_max, bytes, -1));
    uint8_t *acc = g->fused_acc;
    memcpy(acc, me == 0 ? mine : g->fused_in, bytes);
    for (int r = 1; r < n; r++) {
        const uint8_t *x = r == me ? mine : g->fused_in + (size_t)r * g->fused_max;
        TDIST_CHECK(tdist_reduce(acc, acc, x, a->count, a->dtype, a->redop));
    }
    if (a->redop == TDIST_AVG) TDIST_CHECK(tdist_divide(acc, a->count, a->dtype, n));
    memcpy(a->recvbuf, acc, bytes);
    return TDIST_OK;
}
