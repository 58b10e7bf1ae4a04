/*
 * algorithms/diloco.c — DiLoCo: H inner steps of any optimizer without
 * communication, then an outer step on the averaged pseudo-gradient. See
 * tdist/algorithms.h.
 *
 * The synchronised parameters and the pseudo-gradient are two flat f32
 * copies of the parameters (buffer i at off[i]). The outer optimizer is a
 * tdist/optim.h SGD over the synchronised copy whose gradient is the
 * averaged pseudo-gradient, so the outer update is optim's own.
 *
 * The pseudo-gradient is averaged by one of this layer's comm hooks run
 * on a one-bucket view of it (not through DDP): tdist_allreduce_div_hook
 * for f32 (fl(d / W), then a SUM all_reduce: the averagers' arithmetic),
 * tdist_compress_hook for f16 / bf16, tdist_int8_hook for int8 blocks. The
 * hook's work and continuations are driven here, to the end, before the
 * outer step. The view's parameters are DiLoCo's buffers, so the int8
 * hook's error feedback is kept per buffer.
 *
 * Join: the notification is made at each synchronisation. A joined rank's
 * main hook runs the same synchronisation with its own pseudo-gradient
 * (its progress since the last synchronisation, then zeros), and the post
 * hook runs one last synchronisation when any rank has unsynchronised
 * inner steps (agreed with one MAX all_reduce).
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "algorithms/diloco_internal.h"

#define WHO "tdist_diloco_sync"

void tdist_diloco_opts_init(tdist_diloco_opts_t *opts)
{
    if (!opts) return;
    memset(opts, 0, sizeof *opts);
    opts->inner_steps = 500;
    opts->outer_lr = 0.7;
    opts->outer_momentum = 0.9;
    opts->outer_nesterov = true;
    opts->wire = TDIST_F32;
    opts->int8_block = TDIST_INT8_DEFAULT_BLOCK;
    tdist_optim_adamw_opts_init(&opts->inner_adamw);
}

static tdist_status_t check_opts(const tdist_diloco_opts_t *o, const char *fn)
{
    if (o->inner_steps < 1)
        return tdist__error(TDIST_ERR_INVALID_ARG, "%s: opts.inner_steps is %" PRId64 "; it must be "
                            ">= 1", fn, o->inner_steps);
    if (!(o->outer_lr > 0) || !isfinite(o->outer_lr))
        return tdist__error(TDIST_ERR_INVALID_ARG, "%s: opts.outer_lr is %g; it must be finite and "
                            "> 0", fn, o->outer_lr);
    if (!(o->outer_momentum >= 0 && o->outer_momentum < 1))
        return tdist__error(TDIST_ERR_INVALID_ARG, "%s: opts.outer_momentum is %g; it must be in "
                            "[0, 1)", fn, o->outer_momentum);
    if (o->outer_nesterov && o->outer_momentum == 0)
        return tdist__error(TDIST_ERR_INVALID_ARG, "%s: opts.outer_nesterov needs "
                            "opts.outer_momentum > 0", fn);
    if (o->wire != TDIST_F32 && o->wire != TDIST_BF16 && o->wire != TDIST_F16 && o->wire != TDIST_I8)
        return tdist__error(TDIST_ERR_INVALID_ARG, "%s: opts.wire is %s; it must be f32, bf16, f16 "
                            "or i8", fn, tdist_dtype_name(o->wire));
    if (o->wire == TDIST_I8 && (o->int8_block < 1 || o->int8_block > TDIST_INT8_MAX_BLOCK))
        return tdist__error(TDIST_ERR_INVALID_ARG, "%s: opts.int8_block is %zu; it must be 1 .. %d",
                            fn, o->int8_block, TDIST_INT8_MAX_BLOCK);
    return TDIST_OK;
}

/* The buffers, the flat copies and the one-bucket view. */
static tdist_status_t layout(tdist_diloco_t *d, const tdist_optim_param_t *params, const char *fn)
{
    size_t n = d->n;
    d->params = calloc(n ? n : 1, sizeof *d->params);
    d->off = calloc(n ? n : 1, sizeof *d->off);
    d->idx = calloc(n ? n : 1, sizeof *d->idx);
    d->counts = calloc(n ? n : 1, sizeof *d->counts);
    if (!d->params || !d->off || !d->idx || !d->counts)
        return tdist__error(TDIST_ERR_NO_MEMORY, "%s: out of memory", fn);
    for (size_t i = 0; i < n; i++) {
        if (params[i].count > 0 && !params[i].param)
            return tdist__error(TDIST_ERR_INVALID_ARG, "%s: buffer %zu (%s) has no param", fn, i,
                                params[i].name ? params[i].name : "unnamed");
        d->params[i] = params[i];
        d->params[i].name = NULL;
        d->off[i] = d->total;
        d->idx[i] = i;
        d->counts[i] = params[i].count;
        d->total += params[i].count;
    }
    size_t bytes = (d->total ? d->total : 1) * sizeof(float);
    d->synced = malloc(bytes);
    d->delta = calloc(1, bytes);
    if (!d->synced || !d->delta) return tdist__error(TDIST_ERR_NO_MEMORY, "%s: out of memory", fn);
    for (size_t i = 0; i < n; i++)
        if (d->counts[i]) memcpy(d->synced + d->off[i], params[i].param, d->counts[i] * sizeof(float));
    return TDIST_OK;
}

/* The outer SGD over the synchronised copy, the inner optimizer, the hook. */
static tdist_status_t optimizers(tdist_diloco_t *d, const tdist_optim_param_t *params,
                                 tdist_optim_t *inner, const char *fn)
{
    tdist_optim_param_t *op = calloc(d->n ? d->n : 1, sizeof *op);
    if (!op) return tdist__error(TDIST_ERR_NO_MEMORY, "%s: out of memory", fn);
    for (size_t i = 0; i < d->n; i++)
        op[i] = (tdist_optim_param_t){d->synced + d->off[i], d->delta + d->off[i], d->counts[i],
                                      params[i].name};
    tdist_optim_sgd_opts_t so;
    tdist_optim_sgd_opts_init(&so);
    so.lr = d->o.outer_lr;
    so.momentum = d->o.outer_momentum;
    so.nesterov = d->o.outer_nesterov;
    tdist_status_t st = tdist_optim_create_sgd(op, d->n, &so, &d->outer);
    free(op);
    if (st != TDIST_OK) return tdist__error_context(st, "%s: the outer optimizer", fn);
    if (inner) {
        size_t nb = 0;
        TDIST_CHECK(tdist_optim_num_buffers(inner, &nb));
        if (nb != d->n)
            return tdist__error(TDIST_ERR_INVALID_ARG, "%s: the inner optimizer has %zu buffers, "
                                "params %zu: pass the array it was created with", fn, nb, d->n);
        d->inner = inner;
    } else {
        st = tdist_optim_create_adamw(params, d->n, &d->o.inner_adamw, &d->inner);
        if (st != TDIST_OK) return tdist__error_context(st, "%s: the inner AdamW (opts.inner_adamw)", fn);
        d->own_inner = true;
    }
    if (d->o.wire == TDIST_BF16 || d->o.wire == TDIST_F16) {
        tdist_compress_opts_t co;
        tdist_compress_opts_init(&co);
        co.wire = d->o.wire;
        return tdist_compress_hook_create(&co, &d->c16);
    }
    if (d->o.wire == TDIST_I8) {
        tdist_int8_opts_t qo;
        tdist_int8_opts_init(&qo);
        qo.block_size = d->o.int8_block;
        qo.error_feedback = qo.sum_error_feedback = d->o.int8_error_feedback;
        return tdist_int8_hook_create(&qo, &d->q8);
    }
    return TDIST_OK;
}

tdist_status_t tdist_diloco_create(tdist_pg_t *pg, const tdist_optim_param_t *params, size_t n,
                                   tdist_optim_t *inner, const tdist_diloco_opts_t *opts,
                                   tdist_diloco_t **out)
{
    const char *fn = "tdist_diloco_create";
    if (!pg || !out || (!params && n > 0))
        return tdist__error(TDIST_ERR_INVALID_ARG, "%s: %s is NULL", fn,
                            !pg ? "pg" : !out ? "out" : "params");
    tdist_diloco_opts_t o;
    if (opts) o = *opts;
    else tdist_diloco_opts_init(&o);
    TDIST_CHECK(check_opts(&o, fn));
    tdist_diloco_t *d = calloc(1, sizeof *d);
    if (!d) return tdist__error(TDIST_ERR_NO_MEMORY, "%s: out of memory", fn);
    d->pg = pg;
    d->n = n;
    d->o = o;
    tdist_status_t st = layout(d, params, fn);
    if (st == TDIST_OK) st = optimizers(d, params, inner, fn);
    if (st != TDIST_OK) {
        tdist_diloco_destroy(d);
        return st;
    }
    d->stats.elements = d->total;
    *out = d;
    return TDIST_OK;
}

void tdist_diloco_destroy(tdist_diloco_t *d)
{
    if (!d) return;
    if (d->own_inner) tdist_optim_destroy(d->inner);
    tdist_optim_destroy(d->outer);
    tdist_compress_destroy(d->c16);
    tdist_int8_destroy(d->q8);
    free(d->params);
    free(d->off);
    free(d->idx);
    free(d->counts);
    free(d->synced);
    free(d->delta);
    free(d);
}

/* ---------------------------------------------------- the synchronisation */

static tdist_status_t agree(tdist_diloco_t *d)
{
    const tdist_diloco_opts_t *o = &d->o;
    uint64_t t = d->total, blk = o->wire == TDIST_I8 ? o->int8_block : 0;
    uint8_t flags = (uint8_t)((o->outer_nesterov ? 1 : 0) | (o->int8_error_feedback ? 2 : 0));
    int32_t wire = (int32_t)o->wire;
    uint64_t c = tdist__fnv1a(TDIST__FNV_INIT, &o->inner_steps, sizeof o->inner_steps);
    c = tdist__fnv1a(c, &o->outer_lr, sizeof o->outer_lr);
    c = tdist__fnv1a(c, &o->outer_momentum, sizeof o->outer_momentum);
    c = tdist__fnv1a(c, &flags, sizeof flags);
    c = tdist__fnv1a(c, &wire, sizeof wire);
    c = tdist__fnv1a(c, &blk, sizeof blk);
    c = tdist__fnv1a(c, &t, sizeof t);
    char desc[200], where[160];
    snprintf(desc, sizeof desc, "DiLoCo(H %" PRId64 ", outer lr %g m %g%s, %s, %zu elem)",
             o->inner_steps, o->outer_lr, o->outer_momentum, o->outer_nesterov ? " nesterov" : "",
             tdist_dtype_name(o->wire), d->total);
    snprintf(where, sizeof where, "rank %d group %s outer step %" PRIu64, tdist_pg_rank(d->pg),
             tdist_pg_name(d->pg), d->stats.outer_steps + 1);
    return tdist__agree_pg(&d->agree, d->pg, WHO, where, "DiLoCo", "diloco", desc, c);
}

/* Average delta over the group with the wire format's hook, driving its
 * work and continuations to the end. */
static tdist_status_t reduce_delta(tdist_diloco_t *d)
{
    tdist_ddp_bucket_t b;
    memset(&b, 0, sizeof b);
    b.num_buckets = 1;
    b.is_last = true;
    b.buffer = d->delta;
    b.count = d->total;
    b.dtype = TDIST_F32;
    b.num_params = d->n;
    b.param_indices = d->idx;
    b.offsets = d->off;
    b.counts = d->counts;
    b.iteration = d->stats.outer_steps + 1;
    b.divisor = tdist_pg_size(d->pg);
    b.pg = d->pg;
    tdist_ddp_comm_hook_fn hook = d->c16 ? tdist_compress_hook
                                : d->q8  ? tdist_int8_hook
                                         : tdist_allreduce_div_hook;
    void *state = d->c16 ? (void *)d->c16 : (void *)d->q8;
    tdist_ddp_hook_result_t r = {0};
    tdist_status_t st = hook(state, &b, &r);
    while (st == TDIST_OK && (r.work || r.then)) {
        if (r.work) {
            st = tdist_work_wait(r.work, -1);
            tdist_work_free(r.work);
            r.work = NULL;
            if (st != TDIST_OK) break;
        }
        tdist_ddp_then_fn then = r.then;
        memset(&r, 0, sizeof r);
        if (then) st = then(state, &b, &r);
    }
    if (r.work) tdist_work_free(r.work);
    return st;
}

/* Bytes of pseudo-gradient this rank put into the collectives, as
 * documented in tdist_diloco_stats_t. */
static void count_bytes(tdist_diloco_t *d)
{
    if (d->q8) {
        tdist_int8_stats_t s;
        int w = tdist_pg_size(d->pg);
        if (tdist_int8_get_stats(d->q8, &s) == TDIST_OK && w > 1)
            d->stats.wire_bytes = s.bytes_sent * (uint64_t)w / (2 * (uint64_t)(w - 1));
        return;
    }
    d->stats.wire_bytes += (uint64_t)d->total * (d->c16 ? 2 : 4);
}

/* The outer step: pseudo-gradient, average, outer SGD, adopt. */
static tdist_status_t outer_step(tdist_diloco_t *d)
{
    TDIST_CHECK(agree(d));
    for (size_t i = 0; i < d->n; i++) {
        const float *p = d->params[i].param;
        float *s = d->synced + d->off[i], *g = d->delta + d->off[i];
        for (size_t e = 0; e < d->counts[i]; e++) g[e] = s[e] - p[e];
    }
    tdist_status_t st = reduce_delta(d);
    if (st != TDIST_OK)
        return tdist__error_context(st, "%s: rank %d group %s outer step %" PRIu64 ": averaging the "
                                    "pseudo-gradient (%zu x %s); the parameters are unchanged", WHO,
                                    tdist_pg_rank(d->pg), tdist_pg_name(d->pg),
                                    d->stats.outer_steps + 1, d->total, tdist_dtype_name(d->o.wire));
    count_bytes(d);
    st = tdist_optim_step(d->outer);
    if (st != TDIST_OK)
        return tdist__error_context(st, "%s: rank %d outer step %" PRIu64 ": the outer optimizer; "
                                    "the synchronised copy may be partly updated", WHO,
                                    tdist_pg_rank(d->pg), d->stats.outer_steps + 1);
    for (size_t i = 0; i < d->n; i++)
        if (d->counts[i])
            memcpy(d->params[i].param, d->synced + d->off[i], d->counts[i] * sizeof(float));
    d->since = 0;
    d->stats.outer_steps++;
    return TDIST_OK;
}

tdist_status_t tdist_diloco_sync(tdist_diloco_t *d)
{
    if (!d) return tdist__error(TDIST_ERR_INVALID_ARG, "%s: the state is NULL", WHO);
    if (d->join) TDIST_CHECK(tdist_join_notify(d->join, d, 0, NULL));
    return outer_step(d);
}

tdist_status_t tdist_diloco_step(tdist_diloco_t *d)
{
    if (!d) return tdist__error(TDIST_ERR_INVALID_ARG, "tdist_diloco_step: the state is NULL");
    TDIST_CHECK(tdist_optim_step(d->inner));
    d->since++;
    d->stats.inner_steps++;
    if (d->since >= d->o.inner_steps) return tdist_diloco_sync(d);
    return TDIST_OK;
}

/* ------------------------------------------------------------------- Join */

static void diloco_attach(void *ctx, tdist_join_t *join) { ((tdist_diloco_t *)ctx)->join = join; }

/* A joined rank: the synchronisation the active ranks are making. */
static tdist_status_t diloco_main_hook(void *ctx, const tdist_join_state_t *st)
{
    (void)st;
    return outer_step(ctx);
}

/* Everyone has joined: one last synchronisation if any rank has inner
 * steps since the last one. */
static tdist_status_t diloco_post_hook(void *ctx, bool is_last_joiner, const tdist_join_state_t *st)
{
    (void)is_last_joiner;
    (void)st;
    tdist_diloco_t *d = ctx;
    int64_t pending = d->since;
    tdist_status_t s = tdist_all_reduce(d->pg, &pending, &pending, 1, TDIST_I64, TDIST_MAX, NULL, NULL);
    if (s != TDIST_OK)
        return tdist__error_context(s, "%s: rank %d group %s: the final synchronisation's check",
                                    WHO, tdist_pg_rank(d->pg), tdist_pg_name(d->pg));
    return pending > 0 ? outer_step(d) : TDIST_OK;
}

tdist_status_t tdist_diloco_joinable(tdist_diloco_t *d, tdist_joinable_t *out)
{
    if (!d || !out)
        return tdist__error(TDIST_ERR_INVALID_ARG, "tdist_diloco_joinable: %s is NULL",
                            !d ? "the state" : "out");
    memset(out, 0, sizeof *out);
    out->ctx = d;
    out->pg = d->pg;
    out->attach = diloco_attach;
    out->main_hook = diloco_main_hook;
    out->post_hook = diloco_post_hook;
    return TDIST_OK;
}

/* ------------------------------------------------------------ accessors */

tdist_status_t tdist_diloco_get_stats(const tdist_diloco_t *d, tdist_diloco_stats_t *out)
{
    if (!d || !out)
        return tdist__error(TDIST_ERR_INVALID_ARG, "tdist_diloco_get_stats: %s is NULL",
                            !d ? "the state" : "out");
    *out = d->stats;
    return TDIST_OK;
}

tdist_optim_t *tdist_diloco_inner(tdist_diloco_t *d) { return d ? d->inner : NULL; }

const float *tdist_diloco_synced(const tdist_diloco_t *d, size_t i)
{
    if (!d || i >= d->n) return NULL;
    return d->synced + d->off[i];
}
