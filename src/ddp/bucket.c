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

void *tdist__ddp_reduce_loc(const tdist_ddp_t *ddp, size_t i)
{
    if (ddp->opts.gradient_as_bucket_view || tdist__ddp_copies(ddp)) return tdist__ddp_slot(ddp, i);
    return ddp->params[i].grad;
}

void tdist__ddp_free_buckets(ddp_bucket_t *b, size_t nb)
{
    if (!b) return;
    for (size_t i = 0; i < nb; i++) {
        free(b[i].params);
        free(b[i].offsets);
        free(b[i].counts);
        free(b[i].grads);
    }
    free(b);
}

/* Pass 1: the assignment. pb[i], poff[i]: parameter i's bucket and element
 * offset in it; each bucket's dtype, count, bytes and nparams. Buckets are
 * opened in the order of the parameters; several dtypes may be open at
 * once. Returns the number of buckets. */
static size_t assign(const tdist_ddp_t *ddp, const int32_t *order, ddp_bucket_t *nbk, size_t *pb,
                     size_t *poff)
{
    size_t nb = 0;
    long open[TDIST_DTYPE_COUNT];
    for (int d = 0; d < TDIST_DTYPE_COUNT; d++) open[d] = -1;
    for (size_t k = 0; k < ddp->np; k++) {
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
    return nb;
}

/* Pass 2: per-bucket parameter lists (bucket order = arrival order) and
 * arena offsets (aligned to 64 bytes); *arena_bytes: the arena's size. */
static tdist_status_t lay_out(tdist_ddp_t *ddp, const int32_t *order, ddp_bucket_t *nbk,
                              size_t nb, const size_t *pb, const size_t *poff,
                              size_t *arena_bytes)
{
    size_t arena = 0;
    for (size_t b = 0; b < nb; b++) {
        ddp_bucket_t *bk = &nbk[b];
        bk->params = malloc(bk->nparams * sizeof(size_t));
        bk->offsets = malloc(bk->nparams * sizeof(size_t));
        bk->counts = malloc(bk->nparams * sizeof(size_t));
        bk->grads = malloc(bk->nparams * sizeof(void *));
        if (!bk->params || !bk->offsets || !bk->counts || !bk->grads)
            return tdist__ddp_error(ddp, TDIST_ERR_NO_MEMORY, "create", "out of memory for buckets");
        bk->arena_off = arena;
        arena += (bk->bytes + 63) & ~(size_t)63;
        bk->nparams = 0; /* refilled below */
    }
    for (size_t k = 0; k < ddp->np; k++) {
        size_t i = (size_t)order[k];
        ddp_bucket_t *bk = &nbk[pb[i]];
        bk->params[bk->nparams] = i;
        bk->offsets[bk->nparams] = poff[i];
        bk->counts[bk->nparams] = ddp->params[i].count;
        bk->nparams++;
    }
    *arena_bytes = arena;
    return TDIST_OK;
}

/* Whether the new buckets hold the same parameters in the same order as
 * the current ones. */
static bool same_layout(const tdist_ddp_t *ddp, const ddp_bucket_t *nbk, size_t nb)
{
    if (!ddp->buckets || nb != ddp->nb) return false;
    for (size_t b = 0; b < nb; b++) {
        const ddp_bucket_t *o = &ddp->buckets[b], *q = &nbk[b];
        if (o->nparams != q->nparams || o->dtype != q->dtype) return false;
        for (size_t j = 0; j < q->nparams; j++)
            if (o->params[j] != q->params[j]) return false;
    }
    return true;
}

/* Make the new layout the reducer's: a zeroed arena (with bucket views,
 * every gradient carried over into it), the parameters' new places, the
 * old buckets and arenas freed. Takes nbk on success only. */
static tdist_status_t install(tdist_ddp_t *ddp, ddp_bucket_t *nbk, size_t nb, const size_t *pb,
                              const size_t *poff, size_t arena)
{
    unsigned char *na = aligned_alloc(64, arena ? arena : 64);
    if (!na)
        return tdist__ddp_error(ddp, TDIST_ERR_NO_MEMORY, "create",
                                "out of memory for %zu bytes of bucket storage", arena);
    memset(na, 0, arena ? arena : 64);
    for (size_t i = 0; i < ddp->np; i++) {
        ddp_param_t *p = &ddp->params[i];
        unsigned char *dst = na + nbk[pb[i]].arena_off + poff[i] * tdist_dtype_size(p->dtype);
        if (ddp->opts.gradient_as_bucket_view)
            memcpy(dst, ddp->arena ? tdist__ddp_slot(ddp, i) : p->grad, p->bytes);
    }
    for (size_t i = 0; i < ddp->np; i++) {
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
    return TDIST_OK;
}

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
    size_t nb = assign(ddp, order, nbk, pb, poff), arena = 0;
    tdist_status_t st = lay_out(ddp, order, nbk, nb, pb, poff, &arena);
    bool same = st == TDIST_OK && same_layout(ddp, nbk, nb);
    if (st == TDIST_OK && !same) st = install(ddp, nbk, nb, pb, poff, arena);
    if (st != TDIST_OK || same) tdist__ddp_free_buckets(nbk, nb);
    if (st == TDIST_OK) *changed = !same;
    free(pb);
    free(poff);
    return st;
}
