/*
 * coll/fused.c — a small collective over point-to-point transports in one
 * exchange: each rank sends every peer its fingerprint followed by the
 * data it contributes (oneshot.c: an all_reduce's premul-scaled input, a
 * broadcast root's buffer, an all_gather's block, a whole all_to_all
 * send buffer, ...); receives every peer's fingerprint, has pg compare
 * them (a mismatch is reported before any data is read, the same on
 * every rank), then receives the peers' data and takes what it needs
 * (reductions in rank order: bit-identical everywhere). Chosen only from
 * fingerprint fields (op, dtype, count, root), so ranks with equal
 * fingerprints agree on it, and on every rank's data length.
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

tdist_status_t tdist__coll_fused(const tdist__coll_ctx_t *c, const tdist__coll_args_t *a,
                                 const tdist__coll_check_t *chk)
{
    tdist__coll_group_t *g = c->g;
    size_t bytes = 0, fps = chk->len, k = 0;
    uint8_t *mine = g->fused_out + fps;
    const void *in = tdist__oneshot_input(c, a, &bytes);
    memcpy(g->fused_out, chk->common, fps);
    if (in) memcpy(mine, in, bytes);
    TDIST_CHECK(tdist__oneshot_scale(a, mine, bytes));
    TDIST_CHECK(exchange(c, g->fused_out, fps + bytes, chk->theirs, fps, fps, chk->have));
    TDIST_CHECK(chk->compare(chk->arg));
    for (int p = 0; p < c->size; p++) {
        uint8_t *at = g->fused_in + (size_t)p * g->fused_max;
        size_t len = p == c->rank ? 0 : tdist__oneshot_len(a, c->size, p);
        g->blobs[p] = p == c->rank ? mine : at;
        if (len == 0) continue;
        TDIST_CHECK(tdist__tp_post_recv(c->tp, &g->reqs[k], p, at, len));
        g->reqp[k] = &g->reqs[k];
        k++;
    }
    TDIST_CHECK(tdist__tp_wait(c->tp, g->reqp, k, c->deadline_ms));
    return tdist__oneshot_finish(c, a, g->blobs);
}
