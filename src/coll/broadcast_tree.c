/*
 * coll/broadcast_tree.c — binomial-tree broadcast: ceil(log2(size))
 * rounds; relative rank v (to the root) receives from v - 2^k, where 2^k
 * is v's lowest set bit, then sends to v + 2^j for every 2^j below it.
 */
#include "coll/coll_internal.h"

tdist_status_t tdist__coll_broadcast_tree(const tdist__coll_ctx_t *c, void *buf, size_t bytes,
                                          int root)
{
    int n = c->size, v = (c->rank - root + n) % n;
    int mask = 1;
    while (mask < n) {
        if (v & mask) {
            TDIST_CHECK(tdist__coll_recv(c, (v - mask + root) % n, buf, bytes));
            break;
        }
        mask <<= 1;
    }
    for (mask >>= 1; mask > 0; mask >>= 1)
        if (v + mask < n) TDIST_CHECK(tdist__coll_send(c, (v + mask + root) % n, buf, bytes));
    return TDIST_OK;
}
