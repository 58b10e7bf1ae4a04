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
 *
 * A blocking rooted collective (tdist__oneshot_role) waits only for what
 * it reads: every rank still sends every peer its fingerprint (a sender
 * -- broadcast's and scatter's root, reduce's and gather's other ranks --
 * followed by its data where that peer reads it), but receives only the
 * fingerprints and data of the ranks it reads (the root; reduce's and
 * gather's root: every rank) and compares those; a sender receives
 * nothing and leaves. The fingerprints not received are owed and read
 * later, in order (the acknowledgements): before this rank next receives
 * from that peer, before any other collective, or when a peer owes
 * TDIST__ACK_MAX (then half of them), so a sender runs at most that far
 * ahead. A difference fails that later call, naming the collective.
 * Equality is transitive: every reader agreeing with the root (or the
 * root with every sender) means every rank called the same; and a rank
 * that called something else still gets every fingerprint, so it fails
 * at once, as in the exchange with everyone.
 *
 * A group of the tree size or more (select.c, tdist__coll_tree_on) runs
 * all of it along a tree to rank 0 and back instead (fused_tree.c): 2 (size - 1)
 * messages in all, not size (size - 1), and every rank waits for the
 * verdict, rooted collectives too (no acknowledgements).
 */
#include <string.h>

#include "coll/coll_internal.h"

/* Post a send of out to every peer (its first fp_len bytes only, the
 * fingerprint, to all but data_to when data_to >= 0) and a receive of
 * in_len bytes from every peer into in (stride in_stride; not from skip,
 * whose fingerprint is already in hand: chk->have), then wait. */
static tdist_status_t exchange(const tdist__coll_ctx_t *c, const void *out, size_t out_len,
                               size_t fp_len, int data_to, uint8_t *in, size_t in_stride,
                               size_t in_len, int skip)
{
    tdist__coll_group_t *g = c->g;
    size_t k = 0;
    for (int p = 0; p < c->size; p++) {
        if (p == c->rank) continue;
        if (out) {
            size_t len = data_to < 0 || p == data_to ? out_len : fp_len;
            TDIST_CHECK(tdist__tp_post_send(c->tp, &g->reqs[k], p, out, len));
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

/* ------------------------------------------------- acknowledgements */

static uint8_t *ack_slot(const tdist__coll_group_t *g, int p, uint32_t i)
{
    return g->ack_fp + ((size_t)p * TDIST__ACK_MAX + i % TDIST__ACK_MAX) * TDIST__COLL_FP_MAX;
}

/* Peer p owes an acknowledgement of this rank's fingerprint fp. */
static void owe(tdist__coll_group_t *g, int p, const void *fp, size_t len)
{
    memcpy(ack_slot(g, p, g->ack_head[p] + g->ack_owed[p]), fp, len);
    g->ack_owed[p]++;
    g->ack_total++;
}

/* An acknowledgement from p differs from this rank's fingerprint mine:
 * word it with the two (the ranks this rank did not hear from as itself). */
static tdist_status_t ack_mismatch(const tdist__coll_ctx_t *c, const tdist__coll_check_t *chk,
                                   int p, const uint8_t *mine, const uint8_t *theirs)
{
    for (int r = 0; r < c->size; r++)
        memcpy(chk->theirs + (size_t)r * chk->len, r == p ? theirs : mine, chk->len);
    TDIST_CHECK(chk->compare_earlier(chk->arg));
    return tdist__error(TDIST_ERR_INTERNAL, "rank %d: an acknowledgement from rank %d differs, "
                        "its fingerprint does not", c->rank, p);
}

/* Read the oldest n acknowledgements p owes and compare them. */
static tdist_status_t read_acks(const tdist__coll_ctx_t *c, const tdist__coll_check_t *chk, int p,
                                uint32_t n)
{
    tdist__coll_group_t *g = c->g;
    size_t len = chk ? chk->len : 0;
    if (n == 0 || len == 0) return TDIST_OK;
    tdist__tp_req_t req;
    tdist__tp_req_t *rp = &req;
    TDIST_CHECK(tdist__tp_post_recv(c->tp, &req, p, g->ack_in, (size_t)n * len));
    TDIST_CHECK(tdist__tp_wait(c->tp, &rp, 1, c->deadline_ms));
    for (uint32_t i = 0; i < n; i++) {
        const uint8_t *mine = ack_slot(g, p, g->ack_head[p]);
        const uint8_t *theirs = g->ack_in + (size_t)i * len;
        g->ack_head[p]++;
        g->ack_owed[p]--;
        g->ack_total--;
        if (chk->on && memcmp(mine, theirs, len) != 0)
            return ack_mismatch(c, chk, p, mine, theirs);
    }
    return TDIST_OK;
}

tdist_status_t tdist__coll_fused_drain(const tdist__coll_ctx_t *c, const tdist__coll_check_t *chk,
                                       int p)
{
    for (int q = 0; q < c->size; q++)
        if ((p < 0 || q == p) && q != c->rank)
            TDIST_CHECK(read_acks(c, chk, q, c->g->ack_owed[q]));
    return TDIST_OK;
}

/* ------------------------------------------------------------ rooted */

/* Whether this rank reads peer p's fingerprint (and data) in the call. */
static bool reads_from(const tdist__coll_args_t *a, tdist__oneshot_role_t role, int p)
{
    return role == TDIST__ROLE_FROM_ALL || (role == TDIST__ROLE_FROM_ROOT && p == a->root);
}

/* Post this rank's fingerprint to every peer, followed by its data where
 * that peer reads it, and a receive of the fingerprint of every peer it
 * reads; wait. The fingerprints it does not read now are owed. */
static tdist_status_t rooted_fps(const tdist__coll_ctx_t *c, const tdist__coll_args_t *a,
                                 const tdist__coll_check_t *chk, tdist__oneshot_role_t role,
                                 size_t bytes)
{
    tdist__coll_group_t *g = c->g;
    size_t fps = chk->len, k = 0;
    bool to_all = a->op == TDIST__OP_BROADCAST || a->op == TDIST__OP_SCATTER;
    for (int p = 0; p < c->size; p++) {
        if (p == c->rank) continue;
        bool mine = role == TDIST__ROLE_SEND && (to_all || p == a->root);
        bool in = reads_from(a, role, p);
        if (in)
            TDIST_CHECK(tdist__coll_fused_drain(c, chk, p));
        else if (g->ack_owed[p] >= TDIST__ACK_MAX)
            TDIST_CHECK(read_acks(c, chk, p, TDIST__ACK_MAX / 2));
        size_t len = mine ? fps + bytes : fps;
        TDIST_CHECK(tdist__tp_post_send(c->tp, &g->reqs[k], p, g->fused_out, len));
        g->reqp[k] = &g->reqs[k];
        k++;
        if (!in) continue;
        TDIST_CHECK(tdist__tp_post_recv(c->tp, &g->reqs[k], p, chk->theirs + (size_t)p * fps, fps));
        g->reqp[k] = &g->reqs[k];
        k++;
    }
    TDIST_CHECK(tdist__tp_wait(c->tp, g->reqp, k, c->deadline_ms));
    for (int p = 0; p < c->size; p++)
        if (p != c->rank && !reads_from(a, role, p)) owe(g, p, chk->common, fps);
    return TDIST_OK;
}

/* A reader found a difference: receive every other peer's fingerprint
 * of this collective too (every rank sends every peer one), so the
 * message names what every rank reports, and no peer is left sending to
 * a rank that has already failed. */
static tdist_status_t mismatch_all(const tdist__coll_ctx_t *c, const tdist__coll_args_t *a,
                                   const tdist__coll_check_t *chk, tdist__oneshot_role_t role)
{
    tdist__coll_group_t *g = c->g;
    size_t fps = chk->len, k = 0;
    for (int p = 0; p < c->size; p++) {
        if (p == c->rank || reads_from(a, role, p)) continue;
        /* the earlier collectives' first; this one's (owed last, by
         * rooted_fps) is received here */
        TDIST_CHECK(read_acks(c, chk, p, g->ack_owed[p] - 1));
        g->ack_head[p]++;
        g->ack_owed[p]--;
        g->ack_total--;
        TDIST_CHECK(tdist__tp_post_recv(c->tp, &g->reqs[k], p, chk->theirs + (size_t)p * fps, fps));
        g->reqp[k] = &g->reqs[k];
        k++;
    }
    TDIST_CHECK(tdist__tp_wait(c->tp, g->reqp, k, c->deadline_ms));
    return chk->compare(chk->arg);
}

/* A reader, the fingerprints in: compare (those not read stand for
 * themselves: each reader compares with the root, or the root with
 * every rank), then receive the data of the ranks it reads. */
static tdist_status_t rooted_data(const tdist__coll_ctx_t *c, const tdist__coll_args_t *a,
                                  const tdist__coll_check_t *chk, tdist__oneshot_role_t role)
{
    tdist__coll_group_t *g = c->g;
    size_t fps = chk->len, k = 0;
    for (int p = 0; p < c->size; p++)
        if (p == c->rank || !reads_from(a, role, p))
            memcpy(chk->theirs + (size_t)p * fps, chk->common, fps);
    tdist_status_t st = chk->compare(chk->arg);
    if (st == TDIST_ERR_MISMATCH && role == TDIST__ROLE_FROM_ROOT)
        return mismatch_all(c, a, chk, role);
    TDIST_CHECK(st);
    for (int p = 0; p < c->size; p++) {
        size_t len = tdist__oneshot_len(a, c->size, p);
        if (p == c->rank || !reads_from(a, role, p) || len == 0) continue;
        g->blobs[p] = g->fused_in + (size_t)p * g->fused_cap;
        TDIST_CHECK(tdist__tp_post_recv(c->tp, &g->reqs[k], p, (void *)g->blobs[p], len));
        g->reqp[k] = &g->reqs[k];
        k++;
    }
    return tdist__tp_wait(c->tp, g->reqp, k, c->deadline_ms);
}

/* A blocking rooted collective (see the top of the file). */
static tdist_status_t rooted(const tdist__coll_ctx_t *c, const tdist__coll_args_t *a,
                             const tdist__coll_check_t *chk, tdist__oneshot_role_t role,
                             size_t bytes)
{
    tdist__coll_group_t *g = c->g;
    TDIST_CHECK(rooted_fps(c, a, chk, role, bytes));
    for (int p = 0; p < c->size; p++)
        g->blobs[p] = p == c->rank ? g->fused_out + chk->len : NULL;
    if (role != TDIST__ROLE_SEND) TDIST_CHECK(rooted_data(c, a, chk, role));
    return tdist__oneshot_finish(c, a, g->blobs);
}

tdist_status_t tdist__coll_fused(const tdist__coll_ctx_t *c, const tdist__coll_args_t *a,
                                 const tdist__coll_check_t *chk)
{
    tdist__coll_group_t *g = c->g;
    if (tdist__coll_tree_on(c, chk)) /* a large group: along a tree (fused_tree.c) */
        return tdist__coll_tree_exchange(c, chk, a);
    size_t bytes = 0, fps = chk->len, k = 0;
    uint8_t *mine = g->fused_out + fps;
    const void *in = tdist__oneshot_input(c, a, &bytes);
    memcpy(g->fused_out, chk->common, fps);
    if (in) memcpy(mine, in, bytes);
    TDIST_CHECK(tdist__oneshot_scale(a, mine, bytes));
    tdist__oneshot_role_t role = tdist__oneshot_role(c, a, chk);
    if (role != TDIST__ROLE_ALL) return rooted(c, a, chk, role, bytes);
    /* reduce's and gather's data goes to the root alone (as in the rooted
     * form, which a rank calling asynchronously must interleave with) */
    int data_to = a->op == TDIST__OP_REDUCE || a->op == TDIST__OP_GATHER ? a->root : -1;
    TDIST_CHECK(exchange(c, g->fused_out, fps + bytes, fps, data_to, chk->theirs, fps, fps,
                         chk->have));
    TDIST_CHECK(chk->compare(chk->arg));
    for (int p = 0; p < c->size; p++) {
        uint8_t *at = g->fused_in + (size_t)p * g->fused_cap;
        bool reads = p != c->rank && (data_to < 0 || c->rank == data_to);
        size_t len = reads ? tdist__oneshot_len(a, c->size, p) : 0;
        g->blobs[p] = p == c->rank ? mine : at;
        if (len == 0) continue;
        TDIST_CHECK(tdist__tp_post_recv(c->tp, &g->reqs[k], p, at, len));
        g->reqp[k] = &g->reqs[k];
        k++;
    }
    TDIST_CHECK(tdist__tp_wait(c->tp, g->reqp, k, c->deadline_ms));
    return tdist__oneshot_finish(c, a, g->blobs);
}
