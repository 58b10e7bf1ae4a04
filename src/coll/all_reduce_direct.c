/*
 * coll/all_reduce_direct.c — direct all_reduce for tiny messages: one
 * round in which every rank sends its input to every other rank (every
 * receive posted first, then every send), then each rank reduces all
 * inputs in rank order 0, 1, ..., size - 1, so every rank computes the
 * same expression and the results are bit-identical.
 * Traffic (size - 1) * bytes each way per rank: for small messages only.
 */
#include <stdlib.h>
#include <string.h>

#include "coll/coll_internal.h"

tdist_status_t tdist__coll_all_reduce_direct(const tdist__coll_ctx_t *c, const void *sendbuf,
                                             void *recvbuf, size_t count, tdist_dtype_t dtype,
                                             tdist_redop_t op, double premul)
{
    int n = c->size, r = c->rank;
    size_t bytes = tdist__coll_bytes(count, dtype);
    if (bytes == 0) return TDIST_OK;
    uint8_t *all = NULL;
    tdist__tp_req_t *reqs = NULL, **rp = NULL;
    size_t nreq = 0;
    tdist_status_t st = tdist__coll_alloc(c, bytes * (size_t)n, "all_reduce direct", (void **)&all);
    if (st != TDIST_OK) return st;
    st = tdist__coll_alloc(c, 2 * (size_t)n * (sizeof *reqs + sizeof *rp), "all_reduce direct",
                           (void **)&reqs);
    if (st != TDIST_OK) goto out;
    rp = (tdist__tp_req_t **)(reqs + 2 * n);
    uint8_t *mine = all + (size_t)r * bytes;
    memcpy(mine, sendbuf, bytes);
    if (op == TDIST_PREMUL_SUM && (st = tdist_scale(mine, count, dtype, premul)) != TDIST_OK)
        goto out;
    for (int k = 1; k < n; k++) {
        int from = (r - k + n) % n;
        st = tdist__tp_post_recv(c->tp, &reqs[nreq], from, all + (size_t)from * bytes, bytes);
        if (st != TDIST_OK) goto fail;
        rp[nreq] = &reqs[nreq];
        nreq++;
    }
    for (int k = 1; k < n; k++) {
        st = tdist__tp_post_send(c->tp, &reqs[nreq], (r + k) % n, mine, bytes);
        if (st != TDIST_OK) goto fail;
        rp[nreq] = &reqs[nreq];
        nreq++;
    }
    st = tdist__coll_wait(c, rp, nreq);
    if (st != TDIST_OK) goto out;
    /* reduce in rank order into rank 0's slot, then copy out */
    for (int k = 1; k < n && st == TDIST_OK; k++)
        st = tdist_reduce(all, all, all + (size_t)k * bytes, count, dtype, op);
    if (st == TDIST_OK) st = tdist__coll_finish(c, all, count, dtype, op);
    if (st == TDIST_OK) memcpy(recvbuf, all, bytes);
    goto out;
fail:
    tdist__coll_abandon(c, rp, nreq);
out:
    free(reqs);
    free(all);
    return st;
}
