/*
 * algorithms/hook_optim.c — PyTorch's allreduce_hook (a true division
 * before the sum) and hook-then-optimizer (_hook_then_optimizer): a comm
 * hook whose bucket, once reduced, is handed straight to the optimizer.
 * See tdist/algorithms.h for what they compute.
 *
 * The chain, per bucket, as the compression wrapper's (compress.c):
 * hook -> inner hook (work W1, continuation T1) -> the reducer waits W1
 * and calls chain_then -> T1(inner state, bucket) -> (W2, T2) handed to
 * the reducer as (W2, chain_then) ... and when the inner chain is
 * exhausted, the step. The inner hook sees the reducer's own bucket, so
 * the reduced gradients are read where the reducer will copy them from.
 *
 * The per-bucket slot only remembers the inner continuation still to run.
 * A slot is in use from the hook call to the bucket's last continuation;
 * the reducer runs every continuation of an iteration inside backward_end,
 * before the next iteration calls the hook again. The slot array grows on
 * bucket-0 calls only (the first of an iteration).
 *
 * Why the step is bit for bit the plain one: tdist_optim_step is
 * tdist_optim_step_range over every buffer, element-wise, and the values
 * it reads here (the bucket) are the values the reducer writes back to
 * the gradients afterwards.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "algorithms/internal.h"
#include "tdist/optim.h"

#define WHO "tdist_hook_optim"
#define WHO_DIV "tdist_allreduce_div_hook"

struct tdist_hook_optim {
    tdist_optim_t *opt;
    size_t nbuf;                 /* the optimizer's buffers */
    tdist_ddp_t *ddp;            /* bound by tdist_hook_optim_register */
    tdist_ddp_comm_hook_fn inner;
    void *inner_state;
    char *inner_name;
    char desc[TDIST__AGREE_DESC]; /* "hook_then_optimizer(allreduce_hook, sgd)" */
    uint64_t config;
    tdist__agree_t agree;
    tdist_ddp_then_fn *pending;  /* per bucket: the inner continuation to run next */
    size_t npending;
};

/* ------------------------------------------------- the dividing all_reduce */

tdist_status_t tdist_allreduce_div_hook(void *state, const tdist_ddp_bucket_t *bucket,
                                        tdist_ddp_hook_result_t *result)
{
    (void)state;
    if (!bucket || !result)
        return tdist__hook_error(NULL, TDIST_ERR_INVALID_ARG, WHO_DIV, "%s is NULL",
                                 !bucket ? "bucket" : "result");
    if (!bucket->pg)
        return tdist__hook_error(NULL, TDIST_ERR_INVALID_ARG, WHO_DIV, "bucket->pg is NULL");
    if (!tdist_dtype_is_float(bucket->dtype))
        return tdist__hook_error(bucket, TDIST_ERR_INVALID_ARG, WHO_DIV,
                                 "the bucket's dtype is %s; averaging takes floating buckets",
                                 tdist_dtype_name(bucket->dtype));
    if (bucket->divisor < 1)
        return tdist__hook_error(bucket, TDIST_ERR_INVALID_ARG, WHO_DIV, "bucket divisor %lld < 1",
                                 (long long)bucket->divisor);
    if (bucket->count > 0 && !bucket->buffer)
        return tdist__hook_error(bucket, TDIST_ERR_INVALID_ARG, WHO_DIV, "bucket buffer is NULL");
    return tdist__divide_all_reduce(bucket, bucket->pg, bucket->divisor, WHO_DIV, result);
}

tdist_status_t tdist__divide_all_reduce(const tdist_ddp_bucket_t *bucket, tdist_pg_t *pg,
                                        int64_t divisor, const char *who,
                                        tdist_ddp_hook_result_t *result)
{
    tdist_status_t st = tdist_divide(bucket->buffer, bucket->count, bucket->dtype, divisor);
    if (st != TDIST_OK)
        return tdist__hook_error(bucket, st, who, "dividing the bucket by %lld: %s",
                                 (long long)divisor, tdist_last_error());
    st = tdist_all_reduce(pg, bucket->buffer, bucket->buffer, bucket->count, bucket->dtype,
                          TDIST_SUM, NULL, &result->work);
    if (st != TDIST_OK)
        return tdist__error_context(st, "%s: rank %d group %s iteration %" PRIu64 " bucket %zu: "
                                        "all_reduce (sum) of %zu x %s",
                                    who, tdist_pg_rank(pg), tdist_pg_name(pg), bucket->iteration,
                                    bucket->index, bucket->count, tdist_dtype_name(bucket->dtype));
    return TDIST_OK;
}

/* -------------------------------------------------------------- the state */

void tdist_hook_optim_opts_init(tdist_hook_optim_opts_t *opts)
{
    if (!opts) return;
    memset(opts, 0, sizeof *opts);
}

/* The inner hook's name: the caller's, or tdist's own hooks' names. */
static tdist_status_t inner_name_of(tdist_ddp_comm_hook_fn inner, const char *name, const char *fn,
                                    char *buf, size_t cap)
{
    if (name) {
        if (name[0] == '\0')
            return tdist__error(TDIST_ERR_INVALID_ARG, "%s: opts.hook_name is empty", fn);
        snprintf(buf, cap, "%s", name);
    } else if (inner == tdist_allreduce_div_hook) {
        snprintf(buf, cap, "allreduce_hook");
    } else if (inner == tdist_ddp_allreduce_hook) {
        snprintf(buf, cap, "tdist_ddp_allreduce_hook");
    } else if (inner == tdist_compress_hook) {
        snprintf(buf, cap, "tdist_compress_hook");
    } else if (inner == tdist_post_local_hook) {
        snprintf(buf, cap, "post_localSGD_hook");
    } else {
        return tdist__error(TDIST_ERR_INVALID_ARG,
                            "%s: opts.hook_name is NULL: name the inner hook (the ranks compare "
                            "it to be sure they all run the same hook)",
                            fn);
    }
    return TDIST_OK;
}

/* What every rank must agree on: the inner hook's name, the optimizer's
 * kind, learning rate and buffer count. */
static void set_identity(tdist_hook_optim_t *h, tdist_optim_kind_t kind, double lr)
{
    uint32_t k = (uint32_t)kind;
    uint64_t nb = h->nbuf;
    uint64_t c = tdist__fnv1a(TDIST__FNV_INIT, h->inner_name, strlen(h->inner_name) + 1);
    c = tdist__fnv1a(c, &k, sizeof k);
    c = tdist__fnv1a(c, &lr, sizeof lr);
    h->config = tdist__fnv1a(c, &nb, sizeof nb);
    snprintf(h->desc, sizeof h->desc, "hook_then_optimizer(%s, %s lr %g)", h->inner_name,
             tdist_optim_kind_name(kind), lr);
}

tdist_status_t tdist_hook_optim_create(tdist_optim_t *optim, const tdist_hook_optim_opts_t *opts,
                                       tdist_hook_optim_t **out)
{
    const char *fn = "tdist_hook_optim_create";
    tdist_hook_optim_opts_t o;
    tdist_hook_optim_opts_init(&o);
    if (opts) o = *opts;
    if (!out) return tdist__error(TDIST_ERR_INVALID_ARG, "%s: out is NULL", fn);
    if (!optim)
        return tdist__error(TDIST_ERR_INVALID_ARG,
                            "%s: optim is NULL (the optimizer that steps each reduced bucket)", fn);
    if (!o.hook) o.hook = tdist_allreduce_div_hook;
    if (o.hook == tdist_hook_optim)
        return tdist__error(TDIST_ERR_INVALID_ARG, "%s: the inner hook is tdist_hook_optim itself", fn);
    char name[TDIST__AGREE_DESC];
    TDIST_CHECK(inner_name_of(o.hook, o.hook_name, fn, name, sizeof name));
    tdist_optim_kind_t kind;
    double lr;
    size_t nbuf;
    TDIST_CHECK(tdist_optim_kind(optim, &kind));
    TDIST_CHECK(tdist_optim_get_lr(optim, &lr));
    TDIST_CHECK(tdist_optim_num_buffers(optim, &nbuf));
    tdist_hook_optim_t *h = calloc(1, sizeof *h);
    char *nm = tdist__strdup(o.hook_name ? o.hook_name : name);
    if (!h || !nm) {
        free(h);
        free(nm);
        return tdist__error(TDIST_ERR_NO_MEMORY, "%s: out of memory", fn);
    }
    h->opt = optim;
    h->nbuf = nbuf;
    h->inner = o.hook;
    h->inner_state = o.hook_state;
    h->inner_name = nm;
    set_identity(h, kind, lr);
    *out = h;
    return TDIST_OK;
}

void tdist_hook_optim_destroy(tdist_hook_optim_t *h)
{
    if (!h) return;
    free(h->pending);
    free(h->inner_name);
    free(h);
}

tdist_status_t tdist_hook_optim_register(tdist_ddp_t *ddp, tdist_hook_optim_t *h)
{
    const char *fn = "tdist_hook_optim_register";
    if (!ddp || !h)
        return tdist__error(TDIST_ERR_INVALID_ARG, "%s: %s is NULL", fn,
                            !ddp ? "ddp" : "the hook-then-optimizer state");
    if (h->ddp)
        return tdist__error(TDIST_ERR_INVALID_ARG,
                            "%s: this state is registered with a reducer already: use one state "
                            "per reducer", fn);
    /* every parameter has a grad pointer, so grad_ptr is NULL exactly past the last */
    size_t np = 0;
    while (tdist_ddp_grad_ptr(ddp, np)) np++;
    if (np != h->nbuf)
        return tdist__error(TDIST_ERR_INVALID_ARG,
                            "%s: the optimizer has %zu buffers but the reducer has %zu parameters: "
                            "buffer i must be parameter i", fn, h->nbuf, np);
    TDIST_CHECK(tdist_ddp_register_comm_hook(ddp, h, tdist_hook_optim));
    h->ddp = ddp;
    return TDIST_OK;
}

/* --------------------------------------------------------------- the hook */

/* The optimizer's step over bucket b's parameters, from the reduced
 * gradients in b's buffer; each grad pointer is set back to where the
 * reducer keeps the parameter's gradient. */
static tdist_status_t step_bucket(tdist_hook_optim_t *h, const tdist_ddp_bucket_t *b)
{
    const float *buf = b->buffer;
    for (size_t k = 0; k < b->num_params; k++) {
        size_t i = b->param_indices[k];
        tdist_status_t st = tdist_optim_set_grad(h->opt, i, buf + b->offsets[k]);
        if (st == TDIST_OK) st = tdist_optim_step_range(h->opt, i, 0, b->counts[k]);
        tdist_status_t rst = tdist_optim_set_grad(h->opt, i, tdist_ddp_grad_ptr(h->ddp, i));
        if (st == TDIST_OK) st = rst;
        if (st != TDIST_OK)
            return tdist__hook_error(b, st, WHO, "%s: optimizer step of parameter %zu (%zu "
                                     "elements): %s", h->desc, i, b->counts[k], tdist_last_error());
    }
    return TDIST_OK;
}

/* The continuation: run the inner chain's next continuation and hand its
 * work back to the reducer with this function as the next step; when the
 * inner chain is done, step. */
static tdist_status_t chain_then(void *state, const tdist_ddp_bucket_t *bucket,
                                 tdist_ddp_hook_result_t *next)
{
    tdist_hook_optim_t *h = state;
    tdist_ddp_then_fn fn = h->pending[bucket->index];
    if (!fn) return step_bucket(h, bucket);
    h->pending[bucket->index] = NULL;
    tdist_ddp_hook_result_t in = {0};
    tdist_status_t st = fn(h->inner_state, bucket, &in);
    if (st != TDIST_OK) {
        next->work = in.work; /* the reducer waits for it and frees it */
        return tdist__error_context(st, "%s: %s bucket %zu: continuation of the inner hook '%s'",
                                    WHO, h->desc, bucket->index, h->inner_name);
    }
    if (!in.work && !in.then) return step_bucket(h, bucket);
    h->pending[bucket->index] = in.then;
    next->work = in.work;
    next->then = chain_then;
    return TDIST_OK;
}

static tdist_status_t check_call(const tdist_hook_optim_t *h, const tdist_ddp_bucket_t *b,
                                 const tdist_ddp_hook_result_t *result)
{
    if (!b || !result)
        return tdist__hook_error(NULL, TDIST_ERR_INVALID_ARG, WHO, "%s is NULL",
                                 !b ? "bucket" : "result");
    if (!b->pg) return tdist__hook_error(NULL, TDIST_ERR_INVALID_ARG, WHO, "bucket->pg is NULL");
    if (!h)
        return tdist__hook_error(b, TDIST_ERR_INVALID_ARG, WHO,
                                 "the hook state is NULL (create it with tdist_hook_optim_create "
                                 "and register it with tdist_hook_optim_register)");
    if (!h->ddp)
        return tdist__hook_error(b, TDIST_ERR_INVALID_ARG, WHO,
                                 "%s: the state was not registered with tdist_hook_optim_register "
                                 "(which binds it to its reducer)", h->desc);
    if (b->dtype != TDIST_F32)
        return tdist__hook_error(b, TDIST_ERR_INVALID_ARG, WHO,
                                 "%s: the bucket's dtype is %s; the optimizer steps f32 parameters "
                                 "only", h->desc, tdist_dtype_name(b->dtype));
    for (size_t k = 0; k < b->num_params; k++)
        if (b->param_indices[k] >= h->nbuf)
            return tdist__hook_error(b, TDIST_ERR_INVALID_ARG, WHO,
                                     "%s: parameter %zu has no optimizer buffer (%zu buffers)",
                                     h->desc, b->param_indices[k], h->nbuf);
    return TDIST_OK;
}

/* Room for bucket b's pending continuation. */
static tdist_status_t slot_for(tdist_hook_optim_t *h, const tdist_ddp_bucket_t *b)
{
    size_t need = TDIST_MAX(b->num_buckets, b->index + 1);
    if (need <= h->npending) return TDIST_OK;
    tdist_ddp_then_fn *p = realloc(h->pending, need * sizeof *p);
    if (!p) return tdist__hook_error(b, TDIST_ERR_NO_MEMORY, WHO, "out of memory");
    memset(p + h->npending, 0, (need - h->npending) * sizeof *p);
    h->pending = p;
    h->npending = need;
    return TDIST_OK;
}

tdist_status_t tdist_hook_optim(void *state, const tdist_ddp_bucket_t *bucket,
                                tdist_ddp_hook_result_t *result)
{
    tdist_hook_optim_t *h = state;
    TDIST_CHECK(check_call(h, bucket, result));
    TDIST_CHECK(tdist__agree(&h->agree, bucket, WHO, "hook_optim", h->desc, h->config));
    TDIST_CHECK(slot_for(h, bucket));
    h->pending[bucket->index] = NULL;
    tdist_ddp_hook_result_t in = {0};
    tdist_status_t st = h->inner(h->inner_state, bucket, &in);
    if (st != TDIST_OK) {
        if (in.work) tdist_work_free(in.work);
        return tdist__error_context(st, "%s: %s bucket %zu: the inner hook '%s'", WHO, h->desc,
                                    bucket->index, h->inner_name);
    }
    h->pending[bucket->index] = in.then;
    result->work = in.work;
    result->then = chain_then;
    return TDIST_OK;
}
