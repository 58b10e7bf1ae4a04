/*
 * algorithms/zero_hook.c — ZeRO overlapped with DDP's backward
 * (tdist_zero_register_overlap in tdist/algorithms.h).
 *
 * Here a rank's shard is its slice of every bucket: bucket b of c elements
 * is cut into W slices of S = ceil(c / W) (the last ones shorter or empty);
 * rank r owns slice r. The slices of the last bucket (reduced after
 * backward, when nothing else hides its step) are cut into parts of
 * overlap_part_bytes; the shard optimizer has one buffer per intersection
 * of a part (a whole slice elsewhere) with a parameter. Per bucket, two ways, chosen alike on every rank:
 *
 * Rooted (up to ROOTED_MAX_RANKS ranks, while no rank has joined):
 *   1. hook: part j of every rank's slice is reduced to its owner straight
 *      from the bucket (PREMUL_SUM by 1 / divisor: DDP's own rounding,
 *      fl(g * fl(1 / W)) summed), part 0 of every slice, then part 1, ...;
 *      this rank's parts land in its shard buffer;
 *   2. continuations, one per part of this rank's slice: the part is
 *      stepped while the later parts are still being reduced;
 *   3. after the last part: one broadcast per owner of its updated slice,
 *      coalesced over the pieces of the parameters it covers, in place (no
 *      packing, no padding, no copy out); it is not waited for here.
 * Ring (more ranks, or some rank has joined: a collective rooted at a
 * joined rank cannot be shadowed):
 *   1. hook: the bucket (copied into a padded buffer of W * S elements when
 *      it does not divide) is reduce-scattered into the shard buffer;
 *   2. continuation: the slice is stepped, packed (unless it lies in one
 *      parameter) and all-gathered into the padded buffer.
 * Either way a continuation that has posted its bucket's parameters also
 * steps and sends the following buckets whose reductions have completed,
 * and the last bucket's continuation waits for everything still on the
 * wire (and unpacks the ring's buffers): the training thread never waits
 * for a bucket's parameters while later buckets can be reduced and
 * stepped. Bytes on the network per bucket: (W - 1) x c for the
 * reductions and as much for the parameters, as one ring all_reduce
 * (half of all_reduce + broadcast); rooted, the owners spread them over
 * their collectives.
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
    float *shard;             /* S: the averaged gradients of the slice */
    /* ring: reduce_scatter + all_gather (allocated at first use) */
    float *pad;               /* W * S */
    float *send;              /* S: the updated parameters of the slice */
    tdist_work_t *ag;         /* an all_gather posted ahead of the reducer */
    /* rooted: reduces to and a broadcast from each slice's owner */
    size_t part;              /* elements of a part of a slice (the last may be shorter) */
    size_t maxparts;          /* parts of a full slice: ceil(S / part) */
    size_t nparts;            /* parts of this rank's slice */
    size_t *pfirst;           /* [nparts + 1]: part j's pieces are [pfirst[j], pfirst[j + 1]) */
    size_t next_part;         /* the part whose reduce this rank waits for next */
    void **rbufs;             /* every rank's slice as pieces of the parameters */
    size_t *rcounts;
    size_t *rfirst;           /* [W + 1]: rank r's pieces are [rfirst[r], rfirst[r + 1]) */
    tdist_work_t **mine;      /* [maxparts] the reduces of this rank's parts */
    tdist_work_t **red;       /* [W x maxparts] the reduces of the other ranks' parts */
    tdist_work_t **bc;        /* [W] the broadcasts from every owner */
    bool rooted;              /* this iteration's way */
    bool posted;              /* stepped and sent (perhaps ahead) */
    tdist_work_t *rs;         /* the first reduction of this rank's slice (the reducer's) */
} obucket_t;

/* Up to this many ranks the slices travel rooted: per bucket and owner
 * reduces (one per part of its slice) and one broadcast, straight between
 * the bucket and the parameters (no packing, no padding). Over shared
 * memory that is several times faster than the ring at 2 and 4 ranks;
 * over TCP about as fast at 2 ranks and 1.1-1.5 x slower at 4 (the ring
 * spreads the bytes evenly over the links, the owners' collectives do
 * not), and the group does not say which transport it runs on, so the
 * ring takes over above 4 ranks (docs/algorithms.md). */
#define ROOTED_MAX_RANKS 4

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

/* Wait for and free every work of bucket b this file still holds (after
 * an error some may be left); the first error. */
static tdist_status_t drain(tdist__zero_overlap_t *o, obucket_t *b)
{
    tdist_status_t st = TDIST_OK;
    size_t w = (size_t)o->z->size;
    tdist_work_t **lists[3] = {b->mine, b->red, b->bc};
    size_t lens[3] = {b->maxparts, w * b->maxparts, w};
    for (int k = 0; k < 3; k++)
        for (size_t i = 0; lists[k] && i < lens[k]; i++) {
            if (!lists[k][i]) continue;
            tdist_status_t s2 = tdist_work_wait(lists[k][i], -1);
            if (st == TDIST_OK && s2 != TDIST_OK) st = s2;
            tdist_work_free(lists[k][i]);
            lists[k][i] = NULL;
        }
    if (b->ag) {
        tdist_status_t s2 = tdist_work_wait(b->ag, -1);
        if (st == TDIST_OK && s2 != TDIST_OK) st = s2;
        tdist_work_free(b->ag);
        b->ag = NULL;
    }
    return st;
}

void tdist__zero_overlap_free(tdist__zero_overlap_t *o)
{
    if (!o) return;
    tdist_optim_destroy(o->full);
    tdist_optim_destroy(o->opt);
    for (size_t i = 0; o->b && i < o->nb; i++) {
        obucket_t *b = &o->b[i];
        (void)drain(o, b);
        free(b->params);
        free(b->offsets);
        free(b->pad);
        free(b->shard);
        free(b->send);
        free(b->rbufs);
        free(b->rcounts);
        free(b->rfirst);
        free(b->pfirst);
        free(b->mine);
        free(b->red);
        free(b->bc);
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

/* Every rank's slice of bucket b as pieces of the parameters, for the
 * broadcasts from the owners (at most one piece per parameter and rank). */
static tdist_status_t build_rooted(tdist__zero_overlap_t *o, obucket_t *b)
{
    tdist_zero_t *z = o->z;
    size_t w = (size_t)z->size, cap = b->nparams + w;
    b->rbufs = calloc(cap, sizeof *b->rbufs);
    b->rcounts = calloc(cap, sizeof *b->rcounts);
    b->rfirst = calloc(w + 1, sizeof *b->rfirst);
    if (!b->rbufs || !b->rcounts || !b->rfirst) return TDIST_ERR_NO_MEMORY;
    size_t k = 0;
    for (size_t r = 0; r < w; r++) {
        size_t lo = r * b->slice, hi = lo + b->slice;
        b->rfirst[r] = k;
        for (size_t i = 0; i < b->nparams && k < cap; i++) {
            const tdist_optim_param_t *p = &z->params[b->params[i]];
            size_t a = b->offsets[i], e = a + p->count;
            size_t s = a > lo ? a : lo, t = e < hi ? e : hi;
            if (t <= s) continue;
            b->rbufs[k] = p->param + (s - a);
            b->rcounts[k++] = t - s;
        }
    }
    b->rfirst[w] = k;
    return TDIST_OK;
}

static tdist_status_t add_piece(tdist__zero_overlap_t *o, size_t *cap, tdist__zero_piece_t q)
{
    if (o->npieces == *cap) {
        size_t nc = *cap ? 2 * *cap : 16;
        tdist__zero_piece_t *p = realloc(o->pieces, nc * sizeof *p);
        if (!p) return TDIST_ERR_NO_MEMORY;
        o->pieces = p;
        *cap = nc;
    }
    o->pieces[o->npieces++] = q;
    return TDIST_OK;
}

/* Bucket b's slice of this rank, its parts and their pieces (appended to
 * o->pieces: one optimizer buffer per intersection of a part with a
 * parameter, so that each part steps whole buffers). */
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
    /* parts for the last bucket only: the others are reduced during
     * backward, so their steps wait for nothing; parts would only add
     * collectives */
    bool parts = bi + 1 == o->nb && z->opts.overlap_part_bytes > 0;
    size_t part = parts ? z->opts.overlap_part_bytes / sizeof(float) : b->slice;
    b->part = part ? part : 1;
    b->maxparts = (b->slice + b->part - 1) / b->part;
    b->nparts = (b->hi - b->lo + b->part - 1) / b->part;
    b->shard = calloc(b->slice + 1, sizeof(float));
    b->pfirst = calloc(b->nparts + 1, sizeof *b->pfirst);
    b->mine = calloc(b->maxparts + 1, sizeof *b->mine);
    b->red = calloc(w * b->maxparts + 1, sizeof *b->red);
    b->bc = calloc(w, sizeof *b->bc);
    if (!b->shard || !b->pfirst || !b->mine || !b->red || !b->bc) return TDIST_ERR_NO_MEMORY;
    TDIST_CHECK(build_rooted(o, b));
    b->piece0 = o->npieces;
    for (size_t j = 0; j < b->nparts; j++) { /* the parameters cut at every part's end */
        size_t lo = b->lo + j * b->part, hi = lo + b->part < b->hi ? lo + b->part : b->hi;
        b->pfirst[j] = o->npieces;
        for (size_t i = 0; i < b->nparams; i++) {
            size_t a = b->offsets[i], e = a + z->params[b->params[i]].count;
            size_t s = a > lo ? a : lo, t = e < hi ? e : hi;
            if (t <= s) continue;
            TDIST_CHECK(add_piece(o, cap, (tdist__zero_piece_t){b->params[i], s - a, t - s}));
        }
    }
    b->pfirst[b->nparts] = o->npieces;
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

/* Ring: the padded buffers, allocated at the first use. */
static tdist_status_t ring_buffers(const tdist__zero_overlap_t *o, obucket_t *b)
{
    if (b->pad) return TDIST_OK;
    b->pad = calloc((size_t)o->z->size * b->slice + 1, sizeof(float));
    b->send = calloc(b->slice + 1, sizeof(float));
    return b->pad && b->send ? TDIST_OK : TDIST_ERR_NO_MEMORY;
}

/* Ring: every other rank's slice out of the padded buffer. */
static void unpack_ring(const tdist__zero_overlap_t *o, const obucket_t *b)
{
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
}

/* After the last bucket: wait for what every bucket still has on the wire
 * (the other owners' reduces and the broadcasts, or the all_gather, which
 * is then unpacked). Until here the training thread never waits for a
 * bucket's parameters, so the later buckets' reductions and steps go on
 * while the earlier ones' parameters travel. */
static tdist_status_t finish(void *state, const tdist_ddp_bucket_t *bk, tdist_ddp_hook_result_t *next)
{
    (void)next;
    tdist__zero_overlap_t *o = state;
    tdist_status_t st = TDIST_OK;
    for (size_t i = 0; i < o->nb; i++) {
        obucket_t *b = &o->b[i];
        tdist_status_t s2 = drain(o, b);
        if (s2 == TDIST_OK && b->posted && !b->rooted) unpack_ring(o, b);
        if (st == TDIST_OK) st = s2;
    }
    if (st == TDIST_OK) (void)tdist_pg_mark(bk->pg, "zero_synced", bk->iteration);
    return st;
}

/* Ring: pack this rank's updated slice and post its all_gather into *ag. */
static tdist_status_t post_all_gather(tdist__zero_overlap_t *o, obucket_t *b,
                                      const tdist_ddp_bucket_t *bk, tdist_work_t **ag)
{
    if (ring_buffers(o, b) != TDIST_OK)
        return tdist__hook_error(bk, TDIST_ERR_NO_MEMORY, who, "out of memory");
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

/* Rooted: every owner broadcasts its updated slice, in place over the
 * parameters (rank order, the same on every rank). */
static tdist_status_t post_broadcasts(tdist__zero_overlap_t *o, obucket_t *b,
                                      const tdist_ddp_bucket_t *bk)
{
    for (int r = 0; r < o->z->size; r++) {
        size_t f = b->rfirst[r], n = b->rfirst[r + 1] - f;
        if (n == 0) continue;
        tdist_status_t st = tdist_broadcast_coalesced(bk->pg, b->rbufs + f, b->rcounts + f, n,
                                                      TDIST_F32, r, NULL, &b->bc[r]);
        if (st != TDIST_OK)
            return tdist__hook_error(bk, st, who, "broadcast of rank %d's updated parameters: %s",
                                     r, tdist_last_error());
    }
    return TDIST_OK;
}

/* Step the pieces [k0, k1) of the shard optimizer. */
static tdist_status_t step_pieces(tdist__zero_overlap_t *o, size_t k0, size_t k1)
{
    for (size_t k = k0; k < k1; k++)
        TDIST_CHECK(tdist_optim_step_range(o->opt, k, 0, o->pieces[k].count));
    return TDIST_OK;
}

/* Step the rest of bucket b's slice (the parts from next_part on) and post
 * what carries the slice to every rank. */
static tdist_status_t step_and_send(tdist__zero_overlap_t *o, obucket_t *b,
                                    const tdist_ddp_bucket_t *bk, tdist_work_t **ag)
{
    size_t k0 = b->rooted ? b->pfirst[b->next_part] : b->piece0;
    TDIST_CHECK(step_pieces(o, k0, b->piece0 + b->npieces));
    b->next_part = b->nparts;
    b->posted = true;
    (void)tdist_pg_mark(bk->pg, "zero_stepped", (uint64_t)(b - o->b));
    return b->rooted ? post_broadcasts(o, b, bk) : post_all_gather(o, b, bk, ag);
}

/* Is every reduction of this rank's slice of c done (c not yet stepped)? */
static bool slice_ready(const obucket_t *c)
{
    if (!c->rs) return c->rooted && c->nparts == 0;
    if (tdist_work_status(c->rs) != TDIST_OK) return false;
    for (size_t j = 1; c->rooted && j < c->nparts; j++)
        if (c->mine[j] && tdist_work_status(c->mine[j]) != TDIST_OK) return false;
    return true;
}

/* Rooted: part next_part of bucket b's slice is reduced. Step it; while
 * parts remain, chain to the next part's reduce (the step overlaps the
 * reduces still on the wire). *done: every part but the last is stepped. */
static tdist_status_t rooted_part(tdist__zero_overlap_t *o, obucket_t *b, tdist_ddp_hook_result_t *next,
                                  bool *done)
{
    *done = b->posted || b->next_part + 1 >= b->nparts;
    if (*done) return TDIST_OK;
    size_t j = b->next_part++;
    TDIST_CHECK(step_pieces(o, b->pfirst[j], b->pfirst[j + 1]));
    next->work = b->mine[b->next_part];
    b->mine[b->next_part] = NULL; /* the reducer frees it */
    return TDIST_OK;
}

/* Bucket b's slice (or its next part) is reduced: step it and send it
 * (unless that was done ahead); once sent, do the same for the following
 * buckets whose reductions of this rank's slice have all completed, so
 * that their step runs while this bucket's parameters are on the wire.
 * The all_gathers (broadcasts) are posted in bucket order on every rank,
 * whatever the timing; they are waited for after the last bucket. */
static tdist_status_t reduced(void *state, const tdist_ddp_bucket_t *bk, tdist_ddp_hook_result_t *next)
{
    tdist__zero_overlap_t *o = state;
    obucket_t *b = &o->b[bk->index];
    b->rs = NULL; /* the reducer frees it after this chain */
    if (b->rooted) {
        bool done = false;
        TDIST_CHECK(rooted_part(o, b, next, &done));
        if (!done) {
            next->then = reduced;
            return TDIST_OK;
        }
    }
    if (!b->posted) TDIST_CHECK(step_and_send(o, b, bk, &b->ag));
    for (size_t i = bk->index + 1; i < o->nb; i++) {
        obucket_t *c = &o->b[i];
        if (c->posted) continue;
        if (!slice_ready(c)) break;
        TDIST_CHECK(step_and_send(o, c, bk, &c->ag));
    }
    if (bk->is_last) next->then = finish;
    return TDIST_OK;
}

/* Ring: the bucket (padded to W x S when it does not divide) is
 * reduce-scattered into this rank's slice. */
static tdist_status_t post_reduce_scatter(tdist__zero_overlap_t *o, obucket_t *b,
                                          const tdist_ddp_bucket_t *bk,
                                          const tdist_coll_opts_t *co, tdist_work_t **mine)
{
    size_t w = (size_t)o->z->size;
    const float *send = bk->buffer; /* a bucket that divides evenly needs no copy */
    if (w * b->slice != b->count) {
        if (ring_buffers(o, b) != TDIST_OK)
            return tdist__hook_error(bk, TDIST_ERR_NO_MEMORY, who, "out of memory");
        memcpy(b->pad, bk->buffer, b->count * sizeof(float));
        memset(b->pad + b->count, 0, (w * b->slice - b->count) * sizeof(float));
        send = b->pad;
    }
    tdist_status_t st = tdist_reduce_scatter(bk->pg, send, b->shard, b->slice, TDIST_F32,
                                             TDIST_PREMUL_SUM, co, mine);
    if (st != TDIST_OK)
        return tdist__hook_error(bk, st, who, "reduce_scatter: %s", tdist_last_error());
    return TDIST_OK;
}

/* Rooted: each rank's slice, straight from the bucket, is reduced to its
 * owner part by part (part j of every slice, then part j + 1; this rank's
 * into b->shard). *first gets this rank's first part's work. */
static tdist_status_t post_reduces(tdist__zero_overlap_t *o, obucket_t *b,
                                   const tdist_ddp_bucket_t *bk, const tdist_coll_opts_t *co,
                                   tdist_work_t **first)
{
    const float *buf = bk->buffer;
    size_t w = (size_t)o->z->size;
    for (size_t j = 0; j < b->maxparts; j++)
        for (size_t r = 0; r < w; r++) {
            size_t lo = r * b->slice, hi = lo + b->slice < b->count ? lo + b->slice : b->count;
            size_t s = lo + j * b->part, e = s + b->part < hi ? s + b->part : hi;
            if (e <= s) continue;
            bool me = (int)r == o->z->rank;
            tdist_work_t **wk = me ? (j == 0 ? first : &b->mine[j]) : &b->red[r * b->maxparts + j];
            tdist_status_t st = tdist_reduce_to(bk->pg, buf + s, me ? b->shard + (s - lo) : NULL,
                                                e - s, TDIST_F32, TDIST_PREMUL_SUM, (int)r, co, wk);
            if (st != TDIST_OK)
                return tdist__hook_error(bk, st, who, "reduce of part %zu of rank %zu's slice: %s",
                                         j, r, tdist_last_error());
        }
    return TDIST_OK;
}

/* Rooted unless the group is large, or some rank has joined (a collective
 * rooted at a joined rank cannot be shadowed). Every rank decides alike. */
static bool use_rooted(const tdist__zero_overlap_t *o)
{
    if (o->z->size > ROOTED_MAX_RANKS) return false;
    tdist_join_state_t js;
    if (o->z->join && tdist_join_get_state(o->z->join, &js) == TDIST_OK)
        return js.active >= js.world_size;
    return true;
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
    TDIST_CHECK(drain(o, b)); /* what an earlier error left */
    b->posted = false;
    b->next_part = 0;
    b->rooted = use_rooted(o);
    tdist_coll_opts_t co;
    tdist_coll_opts_init(&co);
    co.premul_factor = 1.0 / (double)bk->divisor;
    TDIST_CHECK(b->rooted ? post_reduces(o, b, bk, &co, &result->work)
                          : post_reduce_scatter(o, b, bk, &co, &result->work));
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
