/*
 * ddp/bucket.c — assigning parameters to buckets and laying the buckets out
 * in one flat arena.
 *
 * Parameters are taken in the given order (reverse parameter order at
 * create; rank 0's arrival order at the rebuild). Each dtype has one open
 * bucket; a parameter goes into the open bucket of its dtype unless that
 * would take the bucket past its cap (first_bucket_bytes for bucket 0,
 * bucket_cap_bytes for the others), in which case the open bucket is closed
 * and a new one opened. A parameter larger than the cap gets a bucket of
 * its own. Buckets are numbered in the order they were opened, so bucket 0
 * holds the first parameters of the order. The assignment depends only on
 * the order, the shapes and the options: every rank computes the same.
 */
#include <stdlib.h>
#include <string.h>

#include "ddp/internal.h"

void *tdist__ddp_slot(const tdist_ddp_t *ddp, size_t i)
{
    const ddp_param_t *p = &ddp->params[i];
    const ddp_bucket_t *b = &ddp->buckets[p->bucket];
    return ddp->arena + b->arena_off + p->offset * tdist_dtype_size(p->dtype);
}

void tdist__ddp_free_buckets(ddp_bucket_t *b, size_t nb)
{
    if (!b) return;
    for (size_t i = 0; i < nb; i++) {
        free(b[i].params);
        free(b[i].offsets);
        free(b[i].counts);
    }
    free(b);
}

/* Buckets are opened in the order of the parameters; several dtypes may
 * be open at once. */
tdist_status_t tdist__ddp_build_buckets(tdist_ddp_t *ddp, const int32_t *order, bool *changed)
{
    size_t n = ddp->np;
    size_t *pb = malloc((n ? n : 1) * sizeof *pb);      /* param -> new bucket */
    size_t *poff = malloc((n ? n : 1) * sizeof *poff);  /* param -> element offset */
    ddp_bucket_t *nbk = calloc(n ? n : 1, sizeof *nbk); /* at most n buckets */
    if (!pb || !poff || !nbk) {
        free(pb);
        free(poff);
        free(nbk);
        return tdist__ddp_error(ddp, TDIST_ERR_NO_MEMORY, "create", "out of memory for %zu buckets", n);
    }
    size_t nb = 0;
    long open[TDIST_DTYPE_COUNT];
    for (int d = 0; d < TDIST_DTYPE_COUNT; d++) open[d] = -1;

    /* pass 1: assignment and element counts */
    for (size_t k = 0; k < n; k++) {
        size_t i = (size_t)order[k];
        const ddp_param_t *p = &ddp->params[i];
        long ob = open[p->dtype];
        if (ob >= 0) {
            size_t cap = ob == 0 ? ddp->opts.first_bucket_bytes : ddp->opts.bucket_cap_bytes;
            if (nbk[ob].bytes + p->bytes > cap) ob = -1;
        }
        if (ob < 0) {
            ob = (long)nb++;
            nbk[ob].dtype = p->dtype;
            open[p->dtype] = ob;
        }
        ddp_bucket_t *b = &nbk[ob];
        pb[i] = (size_t)ob;
        poff[i] = b->count;
        b->count += p->count;
        b->bytes += p->bytes;
        b->nparams++;
    }

    /* pass 2: per-bucket parameter lists (bucket order = arrival order),
     * arena offsets (aligned to 64 bytes) */
    size_t arena = 0;
    for (size_t b = 0; b < nb; b++) {
        ddp_bucket_t *bk = &nbk[b];
        bk->params = malloc(bk->nparams * sizeof(size_t));
        bk->offsets = malloc(bk->nparams * sizeof(size_t));
        bk->counts = malloc(bk->nparams * sizeof(size_t));
        if (!bk->params || !bk->offsets || !bk->counts) {
            tdist__ddp_free_buckets(nbk, nb);
            free(pb);
            free(poff);
            return tdist__ddp_error(ddp, TDIST_ERR_NO_MEMORY, "create", "out of memory for buckets");
        }
        bk->arena_off = arena;
        arena += (bk->bytes + 63) & ~(size_t)63;
        bk->nparams = 0; /* refilled below */
    }
    for (size_t k = 0; k < n; k++) {
        size_t i = (size_t)order[k];
        ddp_bucket_t *bk = &nbk[pb[i]];
        bk->params[bk->nparams] = i;
        bk->offsets[bk->nparams] = poff[i];
        bk->counts[bk->nparams] = ddp->params[i].count;
        bk->nparams++;
    }

    /* same layout as before? */
    bool same = ddp->buckets && nb == ddp->nb;
    for (size_t b = 0; same && b < nb; b++) {
        const ddp_bucket_t *o = &ddp->buckets[b], *q = &nbk[b];
        if (o->nparams != q->nparams || o->dtype != q->dtype) same = false;
        for (size_t j = 0; same && j < q->nparams; j++)
            if (o->params[j] != q->params[j]) same = false;
    }
    if (same) {
        tdist__ddp_free_buckets(nbk, nb);
        free(pb);
        free(poff);
        *changed = false;
        return TDIST_OK;
    }

    unsigned char *na = aligned_alloc(64, arena ? arena : 64);
    if (!na) {
        tdist__ddp_free_buckets(nbk, nb);
        free(pb);
        free(poff);
        return tdist__ddp_error(ddp, TDIST_ERR_NO_MEMORY, "create",
                                "out of memory for %zu bytes of bucket storage", arena);
    }
    memset(na, 0, arena ? arena : 64);
    for (size_t i = 0; i < n; i++) {
        ddp_param_t *p = &ddp->params[i];
        unsigned char *dst = na + nbk[pb[i]].arena_off + poff[i] * tdist_dtype_size(p->dtype);
        if (ddp->opts.gradient_as_bucket_view)
            memcpy(dst, ddp->arena ? tdist__ddp_slot(ddp, i) : p->grad, p->bytes);
    }
    for (size_t i = 0; i < n; i++) {
        ddp->params[i].bucket = pb[i];
        ddp->params[i].offset = poff[i];
    }
    tdist__ddp_free_buckets(ddp->buckets, ddp->nb);
    free(ddp->arena);
    free(ddp->shadow_arena);
    ddp->shadow_arena = NULL;
    ddp->buckets = nbk;
    ddp->nb = nb;
    ddp->arena = na;
    ddp->arena_bytes = arena;
    free(pb);
    free(poff);
    *changed = true;
    return TDIST_OK;
}
