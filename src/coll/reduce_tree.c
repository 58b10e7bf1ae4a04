/*
 * coll/reduce_tree.c — binomial-tree reduce to a root: in round k
 * (2^k = mask) relative rank v with bit k set sends its partial to
 * v - mask and is done; the others receive from v + mask (if it exists)
 * and combine reduce(own partial, received): lower relative ranks first.
 * ceil(log2(size)) rounds; the root finishes (AVG).
 *
 * A receive is cut into segments (SEG bytes, up to WINDOW of them posted
 * at once into the group's kept scratch), each reduced as soon as it has
 * arrived while the next ones are still on the wire. The first combine
 * reads this rank's input where it is (reduce(input, received) into the
 * root's output or an inner rank's partial): no copy of the input first,
 * and a rank that only sends sends its input itself (PREMUL_SUM still
 * scales a copy). The operands and their order, and so the bits, are
 * those of reduce(own partial, received).
 */
#include <stdlib.h>

#include "coll/coll_internal.h"

#define SEG (128u * 1024u)
#define WINDOW 16u

/* acc = src op (count elements from `from`), segment by segment; tmp
 * holds WINDOW segments. */
static tdist_status_t recv_reduce(const tdist__coll_ctx_t *c, int from, uint8_t *acc,
                                  const uint8_t *src, uint8_t *tmp, size_t count,
                                  tdist_dtype_t dtype, tdist_redop_t op)
{
    size_t es = tdist_dtype_size(dtype), segc = SEG / es, nseg = (count + segc - 1) / segc;
    tdist__tp_req_t reqs[WINDOW], *rp[WINDOW];
    size_t posted = 0;
    tdist_status_t st = TDIST_OK;
    for (size_t i = 0; i < nseg && st == TDIST_OK; i++) {
        for (; posted < nseg && posted < i + WINDOW && st == TDIST_OK; posted++) {
            size_t w = posted % WINDOW, off = posted * segc;
            size_t len = TDIST_MIN(segc, count - off) * es;
            st = tdist__tp_post_recv(c->tp, &reqs[w], from, tmp + w * segc * es, len);
            rp[w] = &reqs[w];
        }
        if (st != TDIST_OK) break;
        size_t w = i % WINDOW, off = i * segc, n = TDIST_MIN(segc, count - off);
        st = tdist__coll_wait(c, &rp[w], 1);
        if (st == TDIST_OK)
            st = tdist_reduce(acc + off * es, src + off * es, tmp + w * segc * es, n, dtype, op);
    }
    if (st != TDIST_OK) /* unlink what is still posted (the window's requests) */
        tdist__coll_abandon(c, rp, TDIST_MIN(posted, (size_t)WINDOW));
    return st;
}

tdist_status_t tdist__coll_reduce_tree(const tdist__coll_ctx_t *c, const void *sendbuf,
                                       void *recvbuf, size_t count, tdist_dtype_t dtype,
                                       tdist_redop_t op, double premul, int root)
{
    int n = c->size, v = (c->rank - root + n) % n;
    size_t bytes = tdist__coll_bytes(count, dtype);
    if (bytes == 0) return TDIST_OK;
    const uint8_t *in = sendbuf;
    uint8_t *part = NULL, *tmp = NULL; /* a copy of the input or an inner rank's partial */
    uint8_t *acc = v == 0 ? recvbuf : NULL;
    bool children = (v & 1) == 0 && v + 1 < n;
    tdist_status_t st = TDIST_OK;
    /* PREMUL_SUM's scaled input; the root's output over its input but not
     * exactly on it; an inner rank's partial */
    bool overlap = acc && acc != in && acc < in + bytes && in < acc + bytes;
    if (op == TDIST_PREMUL_SUM || overlap || (v != 0 && children)) {
        st = tdist__coll_alloc(c, bytes, "reduce", (void **)&part);
        if (st == TDIST_OK) st = tdist__coll_load(part, sendbuf, count, dtype, op, premul);
        if (st != TDIST_OK) goto out;
        in = part;
        if (!acc) acc = part;
    }
    if (children) {
        st = tdist__coll_scratch_get(c, TDIST_MIN(bytes, (size_t)WINDOW * SEG), "reduce",
                                     (void **)&tmp);
        if (st != TDIST_OK) goto out;
    }
    const uint8_t *mine = in; /* this rank's partial so far */
    for (int mask = 1; mask < n && st == TDIST_OK; mask <<= 1) {
        if (v & mask) {
            st = tdist__coll_send(c, (v - mask + root) % n, mine, bytes);
            break;
        }
        if (v + mask < n) {
            st = recv_reduce(c, (v + mask + root) % n, acc, mine, tmp, count, dtype, op);
            mine = acc;
        }
    }
    if (st == TDIST_OK && v == 0) {
        if (mine != acc) tdist__coll_copy(acc, mine, bytes); /* nothing received */
        st = tdist__coll_finish(c, acc, count, dtype, op);
    }
out:
    if (tmp) tdist__coll_scratch_done(c, tmp);
    free(part);
    return st;
}
