/*
 * coll/barrier.c — dissemination barrier: in round k (k = 1, 2, 4, ...)
 * rank r sends one byte to r + k and receives one from r - k (mod size).
 * ceil(log2(size)) rounds; after them every rank has heard, directly or
 * transitively, from every other.
 */
#include "coll/coll_internal.h"

tdist_status_t tdist__coll_barrier(const tdist__coll_ctx_t *c)
{
    int n = c->size, r = c->rank;
    for (int k = 1; k < n; k <<= 1) {
        uint8_t out = (uint8_t)k, in = 0;
        int to = (r + k) % n, from = (r - k + n) % n;
        TDIST_CHECK(tdist__coll_sendrecv(c, to, &out, 1, from, &in, 1));
        if (in != (uint8_t)k)
            return tdist__error(TDIST_ERR_INTERNAL, "rank %d: barrier round %d: rank %d sent "
                                "byte %u, expected %u (streams out of step)", r, k, from, in,
                                (unsigned)(uint8_t)k);
    }
    return TDIST_OK;
}
