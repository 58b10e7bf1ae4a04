/*
 * coll/reduce_tree.c — binomial-tree reduce to a root: in round k
 * (2^k = mask) relative rank v with bit k set sends its partial to
 * v - mask and is done; the others receive from v + mask (if it exists)
 * and combine reduce(own partial, received): lower relative ranks first.
 * ceil(log2(size)) rounds; the root finishes (AVG) and copies out.
 */
#include <stdlib.h>

#include "coll/coll_internal.h"

tdist_status_t tdist__coll_reduce_tree(const tdist__coll_ctx_t *c, const void *sendbuf,
                                       void *recvbuf, size_t count, tdist_dtype_t dtype,
                                       tdist_redop_t op, double premul, int root)
{
    int n = c->size, v = (c->rank - root + n) % n;
    size_t bytes = tdist__coll_bytes(count, dtype);
    if (bytes == 0) return TDIST_OK;
    /* the root accumulates in recvbuf, the others in scratch */
    uint8_t *acc = NULL, *tmp = NULL, *scratch = NULL;
    tdist_status_t st = tdist__coll_alloc(c, (v == 0 ? 1 : 2) * bytes, "reduce", (void **)&scratch);
    if (st != TDIST_OK) return st;
    tmp = scratch;
    acc = v == 0 ? recvbuf : scratch + bytes;
    st = tdist__coll_load(acc, sendbuf, count, dtype, op, premul);
    for (int mask = 1; mask < n && st == TDIST_OK; mask <<= 1) {
        if (v & mask) {
            st = tdist__coll_send(c, (v - mask + root) % n, acc, bytes);
            break;
        }
        if (v + mask < n) {
            st = tdist__coll_recv(c, (v + mask + root) % n, tmp, bytes);
            if (st == TDIST_OK) st = tdist_reduce(acc, acc, tmp, count, dtype, op);
        }
    }
    if (st == TDIST_OK && v == 0) st = tdist__coll_finish(c, acc, count, dtype, op);
    free(scratch);
    return st;
}
