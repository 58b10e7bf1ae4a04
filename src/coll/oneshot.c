/*
 * coll/oneshot.c — one-shot collectives: every rank that contributes data
 * hands all of it to every rank in the exchange that carries pg/'s check,
 * and every rank then takes what it needs from the ranks' data directly.
 * Two routes carry it (chosen in select.c):
 *  - the shared-memory line (shm_line.c): a rank stages its data in its
 *    line's blob after the hash when it fits (TDIST__ALGO_SHM_IN_LINE),
 *    else in its staging slot of that exchange (TDIST__ALGO_SHM_ONE_SHOT,
 *    up to tdist__shmc_small_max() bytes);
 *  - the fused exchange over point-to-point transports (fused.c): the
 *    data follows the fingerprint in the one message to every peer.
 * One wait, two copies, no further round trip. What each op stages, and
 * reads after:
 *
 *   all_reduce       its input; op over every rank's input in rank order
 *   reduce           its input; the root as all_reduce, the others nothing
 *   broadcast        the root its buffer; the others copy it
 *   all_gather       its input; every rank's block into place
 *   gather           its input; the root copies every rank's block
 *   scatter          the root its whole send buffer; each its block
 *   all_to_all       its whole send buffer; block `rank` of every rank's
 *   reduce_scatter   its whole input; op over block `rank` of every
 *                    rank's, in rank order
 *
 * Reductions run in rank order on every rank: the bits of an element are
 * the same wherever it is reduced, and the same as the staged
 * protocol's. PREMUL_SUM scales the staged copy; AVG sums, then divides.
 * On shared memory the staged data must stay readable until every peer
 * has read it: a peer reads it before it posts its next line, and this
 * rank writes the same blob or slot again only after it has seen the
 * peers' later lines (shm_coll.c).
 */
#include <string.h>

#include "coll/coll_internal.h"

bool tdist__oneshot_op(tdist__op_t op)
{
    switch (op) {
    case TDIST__OP_ALL_REDUCE:
    case TDIST__OP_REDUCE:
    case TDIST__OP_BROADCAST:
    case TDIST__OP_ALL_GATHER:
    case TDIST__OP_GATHER:
    case TDIST__OP_SCATTER:
    case TDIST__OP_ALL_TO_ALL:
    case TDIST__OP_REDUCE_SCATTER:
        return true;
    default:
        return false;
    }
}

/* Whether op stages a whole buffer of size blocks (not one block). */
static bool stages_blocks(tdist__op_t op)
{
    return op == TDIST__OP_SCATTER || op == TDIST__OP_ALL_TO_ALL ||
           op == TDIST__OP_REDUCE_SCATTER;
}

size_t tdist__oneshot_bytes(const tdist__coll_args_t *a, int size)
{
    size_t b = tdist__coll_bytes(a->count, a->dtype);
    return stages_blocks(a->op) ? b * (size_t)size : b;
}

size_t tdist__oneshot_len(const tdist__coll_args_t *a, int size, int rank)
{
    bool root_only = a->op == TDIST__OP_BROADCAST || a->op == TDIST__OP_SCATTER;
    return root_only && rank != a->root ? 0 : tdist__oneshot_bytes(a, size);
}

const void *tdist__oneshot_input(const tdist__coll_ctx_t *c, const tdist__coll_args_t *a,
                                 size_t *bytes)
{
    *bytes = tdist__oneshot_len(a, c->size, c->rank);
    if (*bytes == 0) return NULL;
    switch (a->op) {
    case TDIST__OP_BROADCAST:
        return a->recvbuf;
    default:
        return a->sendbuf;
    }
}

tdist_status_t tdist__oneshot_scale(const tdist__coll_args_t *a, void *staged, size_t bytes)
{
    if (a->redop != TDIST_PREMUL_SUM || bytes == 0) return TDIST_OK;
    if (a->op != TDIST__OP_ALL_REDUCE && a->op != TDIST__OP_REDUCE &&
        a->op != TDIST__OP_REDUCE_SCATTER)
        return TDIST_OK;
    return tdist_scale(staged, bytes / tdist_dtype_size(a->dtype), a->dtype, a->premul);
}

tdist_status_t tdist__oneshot_reduce(const tdist__coll_ctx_t *c, const tdist__coll_args_t *a,
                                    const uint8_t *const *from, size_t off, void *out)
{
    if (c->size == 1) {
        memcpy(out, from[0] + off, tdist__coll_bytes(a->count, a->dtype));
    } else {
        tdist__reduce_unchecked(out, from[0] + off, from[1] + off, a->count, a->dtype, a->redop);
        for (int r = 2; r < c->size; r++)
            tdist__reduce_unchecked(out, out, from[r] + off, a->count, a->dtype, a->redop);
    }
    return tdist__coll_finish(c, out, a->count, a->dtype, a->redop);
}

tdist_status_t tdist__oneshot_finish(const tdist__coll_ctx_t *c, const tdist__coll_args_t *a,
                                         const uint8_t *const *from)
{
    size_t b = tdist__coll_bytes(a->count, a->dtype), mine = (size_t)c->rank * b;
    uint8_t *out = a->recvbuf;
    switch (a->op) {
    case TDIST__OP_ALL_REDUCE:
        return tdist__oneshot_reduce(c, a, from, 0, out);
    case TDIST__OP_REDUCE:
        return c->rank == a->root ? tdist__oneshot_reduce(c, a, from, 0, out) : TDIST_OK;
    case TDIST__OP_REDUCE_SCATTER:
        return tdist__oneshot_reduce(c, a, from, mine, out);
    case TDIST__OP_BROADCAST:
        if (c->rank != a->root) memcpy(out, from[a->root], b);
        return TDIST_OK;
    case TDIST__OP_SCATTER:
        memcpy(out, from[a->root] + mine, b);
        return TDIST_OK;
    case TDIST__OP_GATHER:
    case TDIST__OP_ALL_GATHER:
        /* a gather's root gathers as every rank of an all_gather does */
        if (a->op == TDIST__OP_GATHER && c->rank != a->root) return TDIST_OK;
        for (int r = 0; r < c->size; r++) memcpy(out + (size_t)r * b, from[r], b);
        return TDIST_OK;
    case TDIST__OP_ALL_TO_ALL:
        for (int r = 0; r < c->size; r++) memcpy(out + (size_t)r * b, from[r] + mine, b);
        return TDIST_OK;
    default:
        return tdist__error(TDIST_ERR_INTERNAL, "rank %d: no one-shot %s", c->rank,
                            tdist__op_name(a->op));
    }
}

tdist__oneshot_role_t tdist__oneshot_role(const tdist__coll_ctx_t *c,
                                          const tdist__coll_args_t *a,
                                          const tdist__coll_check_t *chk)
{
    if (!c->spin || !chk || !chk->on || !chk->compare_earlier || chk->have >= 0)
        return TDIST__ROLE_ALL;
    bool root = c->rank == a->root;
    switch (a->op) {
    case TDIST__OP_BROADCAST:
    case TDIST__OP_SCATTER:
        return root ? TDIST__ROLE_SEND : TDIST__ROLE_FROM_ROOT;
    case TDIST__OP_REDUCE:
    case TDIST__OP_GATHER:
        return root ? TDIST__ROLE_FROM_ALL : TDIST__ROLE_SEND;
    default:
        return TDIST__ROLE_ALL;
    }
}
