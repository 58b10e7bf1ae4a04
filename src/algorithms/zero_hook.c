/*
 * algorithms/zero_hook.c — ZeRO overlapped with DDP's backward
 * (tdist_zero_register_overlap in tdist/algorithms.h).
 *
 * Here a rank's shard is its slice of every bucket: bucket b of c elements
 * is cut into W slices of S = ceil(c / W) (the last ones shorter or empty);
 * rank r owns slice r. Per bucket, in the hook and its continuations:
 *   1. the bucket is copied into a padded buffer of W * S elements and
 *      reduce-scattered (PREMUL_SUM by 1 / divisor: DDP's own rounding,
 *      fl(g * fl(1 / W)) summed), so this rank receives its slice's
 *      averaged gradients;
 *   2. continuation: the shard optimizer steps this bucket's pieces (one
 *      optimizer buffer per intersection of the slice with a parameter),
 *      reading the gradients in the received slice; the updated slice of
 *      the parameters is packed and all-gathered into the padded buffer;
 *   3. continuation: every parameter of the bucket is copied out of it.
 * Bucket 0's parameters are updated while later buckets are still on the
 * wire. Bytes per rank: a reduce_scatter and an all_gather of the bucket,
 * (W - 1) / W each — the same as one ring all_reduce, and half of
 * all_reduce + broadcast.
 *
 * The first synchronised iteration (DDP rebuilds its buckets after it, so
 * the slices are not final yet) averages with DDP's own all_reduce and
 * steps every parameter with a temporary optimizer over the whole model,
 * identically on every rank; at the next iteration's first bucket the
 * slices are built from the final bucket layout, the shard optimizer is
 * created and the state of its elements is copied from the temporary one,
 * which is freed.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "algorithms/zero.h"

typedef struct obucket {
    size_t count, slice;      /* elements; S = ceil(count / W) */
    size_t lo, hi;            /* this rank's slice [lo, hi) of the bucket */
    size_t nparams;
    size_t *params;           /* parameter indices in bucket order */
    size_t *offsets;          /* their element offsets in the bucket */
    size_t piece0, npieces;   /* this bucket's buffers in the shard optimizer */
    float *pad;               /* W * S */
    float *shard;             /* S: the averaged gradients of the slice */
    float *send;              /* S: the updated parameters of the slice */
    tdist_work_t *rs;         /* this iteration's reduce_scatter (the reducer's) */
    tdist_work_t *ag;         /* an all_gather posted ahead of the reducer */
} obucket_t;

struct tdist__zero_overlap {
    tdist_zero_t *z;
    tdist_ddp_t *ddp;
    tdist__agree_t agree;
    int phase;                /* 0: first synchronised iteration; 1: it ended; 2: sharded */
    tdist_optim_t *full;      /* phase 0: over every parameter */
    tdist_optim_t *opt;       /* phase 2: over the pieces of every bucket's slice */
    tdist__zero_piece_t *pieces;
    size_t npieces;
    tdist__zero_piece_t *whole; /* phase 0 and 1: every parameter, for the state calls */
    obucket_t *b;
    size_t nb;
};

static const char who[] = "tdist_zero_overlap_hook";

void tdist__zero_overlap_free(tdist__zero_overlap_t *o)
{
    if (!o) return;
    tdist_optim_destroy(o->full);
    tdist_optim_destroy(o->opt);
    for (size_t i = 0; o->b && i < o->nb; i++) {
        tdist_work_free(o->b[i].ag);
        free(o->b[i].params);
        free(o->b[i].offsets);
        free(o->b[i].pad);
        free(o->b[i].shard);
        free(o->b[i].send);
    }
    free(o->b);
    free(o->pieces);
    free(o->whole);
    free(o);
}

static tdist_status_t create_opt(const tdist_zero_t *z, const tdist_optim_param_t *p, size_t n,
                                 tdist_optim_t **out)
{
    if (z->opts.kind == TDIST_OPTIM_SGD) return tdist_optim_create_sgd(p, n, &z->opts.sgd, out);
    if (z->opts.kind == TDIST_OPTIM_ADAM) return tdist_optim_create_adam(p, n, &z->opts.adam, out);
    return tdist_optim_create_adamw(p, n, &z->opts.adam, out);
}

/* ------------------------------------------------------------ phase 0 */

/* The bucket is averaged (DDP's all_reduce): step each of its parameters
 * with the whole-model optimizer, reading the averages in the bucket. */
static tdist_status_t full_then(void *state, const tdist_ddp_bucket_t *bk, tdist_ddp_hook_result_t *next)
{
    (void)next;
    tdist__zero_overlap_t *o = state;
    const float *buf = bk->buffer;
    for (size_t i = 0; i < bk->num_params; i++) {
        size_t j = bk->param_indices[i];
        TDIST_CHECK(tdist_optim_set_grad(o->full, j, buf + bk->offsets[i]));
        TDIST_CHECK(tdist_optim_step_range(o->full, j, 0, bk->counts[i]));
        TDIST_CHECK(tdist_optim_set_grad(o->full, j, o->z->params[j].grad));
    }
    if (bk->is_last) o->phase = 1;
    return TDIST_OK;
}

/* ------------------------------------------------------------ slices */

/* Bucket b's slice of this rank and its pieces (appended to o->pieces). */
static tdist_status_t build_bucket(tdist__zero_overlap_t *o, size_t bi, size_t *cap)
{
    tdist_zero_t *z = o->z;
    obucket_t *b = &o->b[bi];
    size_t np = tdist_ddp_bucket_params(o->ddp, bi, NULL, 0);
    b->params = calloc(np + 1, sizeof *b->params);
    b->offsets = calloc(np + 1, sizeof *b->offsets);
    if (!b->params || !b->offsets) return TDIST_ERR_NO_MEMORY;
    b->nparams = tdist_ddp_bucket_params(o->ddp, bi, b->params, np);
    for (size_t i = 0; i < b->nparams; i++) {
        b->offsets[i] = b->count;
        b->count += z->params[b->params[i]].count;
    }
    size_t w = (size_t)z->size;
    b->slice = (b->count + w - 1) / w;
    b->lo = (size_t)z->rank * b->slice;
    b->hi = b->lo + b->slice;
    if (b->lo > b->count) b->lo = b->count;
    if (b->hi > b->count) b->hi = b->count;
    b->pad = calloc(w * b->slice + 1, sizeof(float));
    b->shard = calloc(b->slice + 1, sizeof(float));
    b->send = calloc(b->slice + 1, sizeof(float));
    if (!b->pad || !b->shard || !b->send) return TDIST_ERR_NO_MEMORY;
    b->piece0 = o->npieces;
    for (size_t i = 0; i < b->nparams; i++) {
        size_t a = b->offsets[i], e = a + z->params[b->params[i]].count;
        size_t s = a > b->lo ? a : b->lo, t = e < b->hi ? e : b->hi;
        if (t <= s) continue;
        if (o->npieces == *cap) {
            size_t nc = *cap ? 2 * *cap : 16;
            tdist__zero_piece_t *q = realloc(o->pieces, nc * sizeof *q);
            if (!q) return TDIST_ERR_NO_MEMORY;
            o->pieces = q;
            *cap = nc;
        }
        o->pieces[o->npieces++] = (tdist__zero_piece_t){b->params[i], s - a, t - s};
    }
    b->npieces = o->npieces - b->piece0;
    return TDIST_OK;
}

/* The shard optimizer over every slice's pieces, its state copied from the
 * whole-model optimizer of the first iteration. */
static tdist_status_t make_shard_opt(tdist__zero_overlap_t *o)
{
    tdist_zero_t *z = o->z;
    tdist_optim_param_t *p = calloc(o->npieces + 1, sizeof *p);
    if (!p) return TDIST_ERR_NO_MEMORY;
    for (size_t bi = 0; bi < o->nb; bi++) {
        obucket_t *b = &o->b[bi];
        for (size_t k = b->piece0; k < b->piece0 + b->npieces; k++) {
            const tdist__zero_piece_t *q = &o->pieces[k];
            size_t at = 0; /* the piece's start in the bucket */
            for (size_t i = 0; i < b->nparams; i++)
                if (b->params[i] == q->param) at = b->offsets[i] + q->offset;
            p[k] = (tdist_optim_param_t){z->params[q->param].param + q->offset,
                                         b->shard + (at - b->lo), q->count, z->names[q->param]};
        }
    }
    tdist_status_t st = create_opt(z, p, o->npieces, &o->opt);
    free(p);
    if (st != TDIST_OK) return st;
    double lr = 0;
    tdist_optim_get_lr(o->full, &lr);
    tdist_optim_set_lr(o->opt, lr);
    for (size_t k = 0; k < o->npieces; k++) {
        const tdist__zero_piece_t *q = &o->pieces[k];
        uint64_t steps = 0;
        tdist_optim_step_count(o->full, q->param, &steps);
        tdist_optim_set_step_count(o->opt, k, steps);
        for (int s = 0; s < z->nstate; s++) {
            float *from = NULL, *to = NULL;
            TDIST_CHECK(tdist_optim_state_ptr(o->full, q->param, s, &from));
            TDIST_CHECK(tdist_optim_state_ptr(o->opt, k, s, &to));
            memcpy(to, from + q->offset, q->count * sizeof *to);
        }
    }
    tdist_optim_destroy(o->full);
    o->full = NULL;
    return TDIST_OK;
}

static tdist_status_t build_slices(tdist__zero_overlap_t *o, const tdist_ddp_bucket_t *bk)
{
    o->nb = tdist_ddp_num_buckets(o->ddp);
    o->b = calloc(o->nb + 1, sizeof *o->b);
    if (!o->b) return TDIST_ERR_NO_MEMORY;
    size_t cap = 0;
    for (size_t bi = 0; bi < o->nb; bi++) TDIST_CHECK(build_bucket(o, bi, &cap));
    if (bk->num_buckets != o->nb)
        return tdist__hook_error(bk, TDIST_ERR_INTERNAL, who, "the reducer has %zu buckets, the "
                                 "hook sees %zu", o->nb, bk->num_buckets);
    TDIST_CHECK(make_shard_opt(o));
    o->phase = 2;
    return TDIST_OK;
}

/* ------------------------------------------------------------ phase 2 */

static tdist_status_t gathered(void *state, const tdist_ddp_bucket_t *bk, tdist_ddp_hook_result_t *next)
{
    (void)next;
    tdist__zero_overlap_t *o = state;
    obucket_t *b = &o->b[bk->index];
    for (size_t i = 0; i < b->nparams; i++) { /* this rank's slice is already in place */
        const tdist_optim_param_t *p = &o->z->params[b->params[i]];
        size_t a = b->offsets[i], e = a + p->count;
        size_t s = a > b->lo ? a : b->lo, t = e < b->hi ? e : b->hi;
        if (t <= s) {
            memcpy(p->param, b->pad + a, p->count * sizeof(float));
            continue;
        }
        memcpy(p->param, b->pad + a, (s - a) * sizeof(float));
        memcpy(p->param + (t - a), b->pad + t, (e - t) * sizeof(float));
    }
    /* this rank's slice of the bucket: the averaged gradients */
    memcpy((float *)bk->buffer + b->lo, b->shard, (b->hi - b->lo) * sizeof(float));
    return TDIST_OK;
}

/* Step bucket b's slice, pack it and post its all_gather into *ag. */
static tdist_status_t step_and_gather(tdist__zero_overlap_t *o, obucket_t *b,
                                      const tdist_ddp_bucket_t *bk, tdist_work_t **ag)
{
    for (size_t k = b->piece0; k < b->piece0 + b->npieces; k++)
        TDIST_CHECK(tdist_optim_step_range(o->opt, k, 0, o->pieces[k].count));
    /* a full slice inside one parameter is sent from the parameter itself
     * (nothing writes it before the all_gather completes) */
    const float *send = b->send;
    if (b->npieces == 1 && o->pieces[b->piece0].count == b->slice) {
        const tdist__zero_piece_t *q = &o->pieces[b->piece0];
        send = o->z->params[q->param].param + q->offset;
    } else {
        memset(b->send + (b->hi - b->lo), 0, (b->slice - (b->hi - b->lo)) * sizeof(float));
        for (size_t i = 0; i < b->nparams; i++) {
            const tdist_optim_param_t *p = &o->z->params[b->params[i]];
            size_t a = b->offsets[i], e = a + p->count;
            size_t s = a > b->lo ? a : b->lo, t = e < b->hi ? e : b->hi;
            if (t > s) memcpy(b->send + (s - b->lo), p->param + (s - a), (t - s) * sizeof(float));
        }
    }
    tdist_status_t st = tdist_all_gather(bk->pg, send, b->pad, b->slice, TDIST_F32, NULL, ag);
    if (st != TDIST_OK)
        return tdist__hook_error(bk, st, who, "all_gather of the updated parameters: %s",
                                 tdist_last_error());
    return TDIST_OK;
}

/* Bucket b is reduced: step its slice and all-gather it (unless that was
 * done ahead), then do the same for the following buckets whose
 * reduce_scatter has already completed, so that their step and packing
 * run while this all_gather is on the wire. The all_gathers are posted in
 * bucket order on every rank, whatever the timing. */
static tdist_status_t reduced(void *state, const tdist_ddp_bucket_t *bk, tdist_ddp_hook_result_t *next)
{
    tdist__zero_overlap_t *o = state;
    obucket_t *b = &o->b[bk->index];
    b->rs = NULL; /* the reducer frees it after this chain */
    if (b->ag) {
        next->work = b->ag;
        b->ag = NULL;
    } else {
        TDIST_CHECK(step_and_gather(o, b, bk, &next->work));
    }
    next->then = gathered;
    for (size_t i = bk->index + 1; i < o->nb; i++) {
        obucket_t *c = &o->b[i];
        if (c->ag) continue;
        if (!c->rs || tdist_work_status(c->rs) != TDIST_OK) break;
        TDIST_CHECK(step_and_gather(o, c, bk, &c->ag));
    }
    return TDIST_OK;
}

static tdist_status_t check_bucket(tdist__zero_overlap_t *o, const tdist_ddp_bucket_t *bk)
{
    if (bk->dtype != TDIST_F32)
        return tdist__hook_error(bk, TDIST_ERR_INVALID_ARG, who, "the bucket is not f32");
    for (size_t i = 0; i < bk->num_params; i++) {
        size_t j = bk->param_indices[i];
        if (j >= o->z->n || bk->counts[i] != o->z->params[j].count)
            return tdist__hook_error(bk, TDIST_ERR_INVALID_ARG, who,
                                     "the reducer's parameter %zu (%zu elements) is not the ZeRO "
                                     "object's (it has %zu parameters): create both over the same "
                                     "parameters", j, bk->counts[i],
                                     o->z->n);
    }
    if (o->phase == 2) {
        const obucket_t *b = bk->index < o->nb ? &o->b[bk->index] : NULL;
        bool same = b && b->count == bk->count && b->nparams == bk->num_params;
        for (size_t i = 0; same && i < b->nparams; i++)
            same = b->params[i] == bk->param_indices[i] && b->offsets[i] == bk->offsets[i];
        if (!same)
            return tdist__hook_error(bk, TDIST_ERR_INTERNAL, who,
                                     "the bucket layout changed after the first iteration");
    }
    return TDIST_OK;
}

static tdist_status_t zero_hook(void *state, const tdist_ddp_bucket_t *bk, tdist_ddp_hook_result_t *result)
{
    tdist__zero_overlap_t *o = state;
    TDIST_CHECK(tdist__hook_check(o, bk, result, who, "tdist_zero_create",
                                  "tdist_zero_register_overlap", NULL, TDIST__HOOK_F32, "f32 only"));
    tdist_zero_t *z = o->z;
    char desc[64];
    snprintf(desc, sizeof desc, "zero_overlap(%s)", tdist_optim_kind_name(z->opts.kind));
    TDIST_CHECK(tdist__agree(&o->agree, bk, who, "zero_overlap", desc, (uint64_t)z->opts.kind));
    if (o->phase == 1) {
        tdist_status_t st = build_slices(o, bk);
        if (st == TDIST_ERR_NO_MEMORY) return tdist__hook_error(bk, st, who, "out of memory");
        TDIST_CHECK(st);
    }
    TDIST_CHECK(check_bucket(o, bk));
    if (o->phase == 0) {
        TDIST_CHECK(tdist_ddp_allreduce_hook(NULL, bk, result));
        result->then = full_then;
        return TDIST_OK;
    }
    obucket_t *b = &o->b[bk->index];
    const float *send = bk->buffer; /* a bucket that divides evenly needs no copy */
    if ((size_t)z->size * b->slice != b->count) {
        memcpy(b->pad, bk->buffer, b->count * sizeof(float));
        memset(b->pad + b->count, 0, ((size_t)z->size * b->slice - b->count) * sizeof(float));
        send = b->pad;
    }
    tdist_coll_opts_t co;
    tdist_coll_opts_init(&co);
    co.premul_factor = 1.0 / (double)bk->divisor;
    tdist_status_t st = tdist_reduce_scatter(bk->pg, send, b->shard, b->slice, TDIST_F32,
                                             TDIST_PREMUL_SUM, &co, &result->work);
    if (st != TDIST_OK)
        return tdist__hook_error(bk, st, who, "reduce_scatter: %s", tdist_last_error());
    b->rs = result->work;
    result->then = reduced;
    return TDIST_OK;
}

void tdist__zero_shard(const tdist_zero_t *z, tdist__zero_shard_t *out)
{
    const tdist__zero_overlap_t *o = z->overlap;
    if (!o) *out = (tdist__zero_shard_t){z->mine, z->nmine, z->opt};
    else if (o->phase == 2) *out = (tdist__zero_shard_t){o->pieces, o->npieces, o->opt};
    else *out = (tdist__zero_shard_t){o->whole, z->n, o->full};
}

/* The partition's shard optimizer is not used with the overlap: an empty
 * one replaces it (no state memory). */
static tdist_status_t drop_partition_shard(tdist_zero_t *z)
{
    tdist_optim_t *empty = NULL;
    TDIST_CHECK(create_opt(z, NULL, 0, &empty));
    tdist_optim_destroy(z->opt);
    z->opt = empty;
    z->nmine = 0;
    return TDIST_OK;
}

tdist_status_t tdist_zero_register_overlap(tdist_zero_t *z, tdist_ddp_t *ddp)
{
    static const char fn[] = "tdist_zero_register_overlap";
    if (!z || !ddp)
        return tdist__error(TDIST_ERR_INVALID_ARG, "%s: %s is NULL", fn, !z ? "z" : "ddp");
    if (z->overlap)
        return tdist__zero_error(z, TDIST_ERR_INVALID_ARG, fn, "the overlap hook is already registered");
    tdist__zero_overlap_t *o = calloc(1, sizeof *o);
    if (!o) return tdist__zero_error(z, TDIST_ERR_NO_MEMORY, fn, "out of memory");
    o->z = z;
    o->ddp = ddp;
    o->whole = calloc(z->n, sizeof *o->whole);
    if (!o->whole) {
        tdist__zero_overlap_free(o);
        return tdist__zero_error(z, TDIST_ERR_NO_MEMORY, fn, "out of memory");
    }
    for (size_t j = 0; j < z->n; j++) o->whole[j] = (tdist__zero_piece_t){j, 0, z->params[j].count};
    double lr = 0;
    tdist_status_t st = create_opt(z, z->params, z->n, &o->full);
    if (st == TDIST_OK) st = tdist_optim_get_lr(z->opt, &lr);
    if (st == TDIST_OK) st = tdist_optim_set_lr(o->full, lr);
    if (st == TDIST_OK) st = tdist_ddp_register_comm_hook(ddp, o, zero_hook);
    if (st == TDIST_OK) st = drop_partition_shard(z);
    if (st != TDIST_OK) {
        tdist__zero_overlap_free(o);
        return st;
    }
    z->overlap = o;
    return TDIST_OK;
}
