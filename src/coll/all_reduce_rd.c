/*
 * coll/all_reduce_rd.c — recursive doubling all_reduce (latency-bound
 * messages): log2(p) rounds of exchanging the whole vector with the
 * partner rank ^ 2^k, p the largest power of two <= size.
 *
 * Non-powers of two are folded: of the first 2 * (size - p) ranks, each
 * even rank hands its vector to the odd rank above it and waits; after the
 * doubling rounds the odd rank sends the result back.
 *
 * Bit-identical results: every combine is reduce(lower ranks' partial,
 * higher ranks' partial), so both partners of a round compute the same
 * expression with the same operand order, and all ranks end equal.
 */
#include <stdlib.h>

#include "coll/coll_internal.h"

tdist_status_t tdist__coll_all_reduce_rd(const tdist__coll_ctx_t *c, const void *sendbuf,
                                         void *recvbuf, size_t count, tdist_dtype_t dtype,
                                         tdist_redop_t op, double premul)
{
    int n = c->size, r = c->rank;
    size_t bytes = tdist__coll_bytes(count, dtype);
    if (bytes == 0) return TDIST_OK;
    /* cur: this rank's partial so far, read where it is: the input until
     * the first combine writes recvbuf */
    const void *cur = NULL;
    TDIST_CHECK(tdist__coll_input(recvbuf, sendbuf, count, dtype, op, premul, &cur));
    void *tmp = NULL;
    TDIST_CHECK(tdist__coll_scratch_get(c, bytes, "all_reduce recursive doubling", &tmp));
    tdist_status_t st = TDIST_OK;
    int p = 1;
    while (p * 2 <= n) p *= 2;
    int rem = n - p, vr;
    if (r < 2 * rem) {
        if (r % 2 == 0) {
            st = tdist__coll_send(c, r + 1, cur, bytes);
            vr = -1;
        } else {
            st = tdist__coll_recv(c, r - 1, tmp, bytes);
            if (st == TDIST_OK) st = tdist_reduce(recvbuf, tmp, cur, count, dtype, op);
            cur = recvbuf;
            vr = r / 2;
        }
    } else {
        vr = r - rem;
    }
    if (st != TDIST_OK) goto out;
    if (vr >= 0) {
        for (int mask = 1; mask < p; mask <<= 1) {
            int vp = vr ^ mask;
            int partner = vp < rem ? vp * 2 + 1 : vp + rem;
            st = tdist__coll_sendrecv(c, partner, cur, bytes, partner, tmp, bytes);
            if (st != TDIST_OK) goto out;
            if (partner < r)
                st = tdist_reduce(recvbuf, tmp, cur, count, dtype, op);
            else
                st = tdist_reduce(recvbuf, cur, tmp, count, dtype, op);
            if (st != TDIST_OK) goto out;
            cur = recvbuf;
        }
        st = tdist__coll_finish(c, recvbuf, count, dtype, op);
        if (st != TDIST_OK) goto out;
    }
    if (r < 2 * rem) {
        if (r % 2 == 1)
            st = tdist__coll_send(c, r - 1, recvbuf, bytes);
        else
            st = tdist__coll_recv(c, r + 1, recvbuf, bytes);
    }
out:
    tdist__coll_scratch_done(c, tmp);
    return st;
}
