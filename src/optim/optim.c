/*
 * optim/optim.c — creating and destroying optimizers, stepping them,
 * re-pointing buffers, the learning rate and other accessors.
 *
 * All state arrays live in one zeroed, 64-byte-aligned block carved into
 * per-buffer views (each view starts on a 64-byte boundary so the update
 * loops see aligned data).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "optim/internal.h"

#define ALIGN_FLOATS 16 /* 64 bytes */

void tdist_optim_sgd_opts_init(tdist_optim_sgd_opts_t *opts)
{
    if (!opts) return;
    memset(opts, 0, sizeof *opts);
    opts->lr = 1e-3;
    opts->momentum = 0.0;
    opts->dampening = 0.0;
    opts->weight_decay = 0.0;
    opts->nesterov = false;
    opts->maximize = false;
}

void tdist_optim_adam_opts_init(tdist_optim_adam_opts_t *opts)
{
    if (!opts) return;
    memset(opts, 0, sizeof *opts);
    opts->lr = 1e-3;
    opts->beta1 = 0.9;
    opts->beta2 = 0.999;
    opts->eps = 1e-8;
    opts->weight_decay = 0.0;
    opts->amsgrad = false;
    opts->maximize = false;
}

void tdist_optim_adamw_opts_init(tdist_optim_adam_opts_t *opts)
{
    if (!opts) return;
    tdist_optim_adam_opts_init(opts);
    opts->weight_decay = 1e-2;
}

const char *tdist_optim_kind_name(tdist_optim_kind_t kind)
{
    switch (kind) {
    case TDIST_OPTIM_SGD: return "sgd";
    case TDIST_OPTIM_ADAM: return "adam";
    case TDIST_OPTIM_ADAMW: return "adamw";
    }
    return "invalid";
}

const char *tdist__optim_buf_label(const tdist_optim_t *opt, size_t index, char *out, size_t size)
{
    const char *name = (opt && index < opt->nbuf) ? opt->bufs[index].name : NULL;
    if (name)
        snprintf(out, size, "buffer %zu (%s)", index, name);
    else
        snprintf(out, size, "buffer %zu", index);
    return out;
}

/* ------------------------------------------------------------ validation */

/* A hyperparameter that must be finite and >= 0. */
static tdist_status_t check_nonneg(const char *fn, const char *what, double v)
{
    if (!isfinite(v) || v < 0.0)
        return tdist__error(TDIST_ERR_INVALID_ARG, "%s: %s must be finite and >= 0, got %g", fn,
                            what, v);
    return TDIST_OK;
}

static tdist_status_t check_sgd_opts(const char *fn, const tdist_optim_sgd_opts_t *o)
{
    TDIST_CHECK(check_nonneg(fn, "lr", o->lr));
    TDIST_CHECK(check_nonneg(fn, "momentum", o->momentum));
    TDIST_CHECK(check_nonneg(fn, "weight_decay", o->weight_decay));
    if (!isfinite(o->dampening))
        return tdist__error(TDIST_ERR_INVALID_ARG, "%s: dampening must be finite, got %g", fn,
                            o->dampening);
    if (o->nesterov && (o->momentum <= 0.0 || o->dampening != 0.0))
        return tdist__error(TDIST_ERR_INVALID_ARG,
                            "%s: nesterov momentum requires a momentum > 0 and zero dampening "
                            "(momentum %g, dampening %g)",
                            fn, o->momentum, o->dampening);
    return TDIST_OK;
}

static tdist_status_t check_adam_opts(const char *fn, const tdist_optim_adam_opts_t *o)
{
    TDIST_CHECK(check_nonneg(fn, "lr", o->lr));
    TDIST_CHECK(check_nonneg(fn, "eps", o->eps));
    TDIST_CHECK(check_nonneg(fn, "weight_decay", o->weight_decay));
    if (!(o->beta1 >= 0.0 && o->beta1 < 1.0))
        return tdist__error(TDIST_ERR_INVALID_ARG, "%s: beta1 must be in [0, 1), got %g", fn,
                            o->beta1);
    if (!(o->beta2 >= 0.0 && o->beta2 < 1.0))
        return tdist__error(TDIST_ERR_INVALID_ARG, "%s: beta2 must be in [0, 1), got %g", fn,
                            o->beta2);
    return TDIST_OK;
}

static tdist_status_t check_params(const char *fn, const tdist_optim_param_t *params, size_t n)
{
    if (n > 0 && !params)
        return tdist__error(TDIST_ERR_INVALID_ARG, "%s: params is NULL but n is %zu", fn, n);
    for (size_t i = 0; i < n; i++) {
        const tdist_optim_param_t *p = &params[i];
        if (p->count == 0) continue;
        if (!p->param || !p->grad)
            return tdist__error(TDIST_ERR_INVALID_ARG, "%s: buffer %zu%s%s%s: %s pointer is NULL",
                                fn, i, p->name ? " (" : "", p->name ? p->name : "",
                                p->name ? ")" : "", !p->param ? "param" : "grad");
        if (p->count > SIZE_MAX / sizeof(float) / TDIST_OPTIM_MAX_STATE)
            return tdist__error(TDIST_ERR_INVALID_ARG, "%s: buffer %zu: count %zu is too large",
                                fn, i, p->count);
    }
    return TDIST_OK;
}

/* --------------------------------------------------------------- create */

static size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

static tdist_status_t create_common(const char *fn, tdist_optim_kind_t kind, int nstate,
                                    const tdist_optim_param_t *params, size_t n,
                                    tdist_optim_t **out)
{
    tdist_optim_t *opt = calloc(1, sizeof *opt);
    if (!opt) return tdist__error(TDIST_ERR_NO_MEMORY, "%s: out of memory", fn);
    opt->kind = kind;
    opt->nstate = nstate;
    opt->nbuf = n;
    if (n > 0) {
        opt->bufs = calloc(n, sizeof *opt->bufs);
        if (!opt->bufs) goto oom;
    }

    /* One block for all state: each view rounded up to 64 bytes. */
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        size_t per = round_up(params[i].count, ALIGN_FLOATS);
        if (per > (SIZE_MAX / sizeof(float) - total) / (size_t)(nstate ? nstate : 1)) {
            tdist_optim_destroy(opt);
            return tdist__error(TDIST_ERR_INVALID_ARG, "%s: total state size overflows", fn);
        }
        total += per * (size_t)nstate;
    }
    if (total > 0) {
        void *mem = NULL;
        if (posix_memalign(&mem, ALIGN_FLOATS * sizeof(float), total * sizeof(float)) != 0)
            goto oom;
        memset(mem, 0, total * sizeof(float));
        opt->state_mem = mem;
    }

    size_t off = 0;
    for (size_t i = 0; i < n; i++) {
        tdist__optim_buf_t *b = &opt->bufs[i];
        b->param = params[i].param;
        b->grad = params[i].grad;
        b->count = params[i].count;
        if (params[i].name) {
            b->name = tdist__strdup(params[i].name);
            if (!b->name) goto oom;
        }
        for (int s = 0; s < nstate; s++) {
            b->state[s] = opt->state_mem + off;
            off += round_up(b->count, ALIGN_FLOATS);
        }
    }
    *out = opt;
    return TDIST_OK;

oom:
    tdist_optim_destroy(opt);
    return tdist__error(TDIST_ERR_NO_MEMORY, "%s: out of memory allocating state for %zu buffers",
                        fn, n);
}

tdist_status_t tdist_optim_create_sgd(const tdist_optim_param_t *params, size_t n,
                                      const tdist_optim_sgd_opts_t *opts, tdist_optim_t **out)
{
    static const char fn[] = "tdist_optim_create_sgd";
    TDIST_ARG_CHECK(out != NULL, fn);
    tdist_optim_sgd_opts_t o;
    if (opts)
        o = *opts;
    else
        tdist_optim_sgd_opts_init(&o);
    TDIST_CHECK(check_sgd_opts(fn, &o));
    TDIST_CHECK(check_params(fn, params, n));
    tdist_optim_t *opt = NULL;
    TDIST_CHECK(create_common(fn, TDIST_OPTIM_SGD, o.momentum != 0.0 ? 1 : 0, params, n, &opt));
    opt->sgd = o;
    opt->lr = o.lr;
    *out = opt;
    return TDIST_OK;
}

static tdist_status_t create_adam(const char *fn, tdist_optim_kind_t kind,
                                  const tdist_optim_param_t *params, size_t n,
                                  const tdist_optim_adam_opts_t *opts, tdist_optim_t **out)
{
    TDIST_ARG_CHECK(out != NULL, fn);
    tdist_optim_adam_opts_t o;
    if (opts)
        o = *opts;
    else if (kind == TDIST_OPTIM_ADAMW)
        tdist_optim_adamw_opts_init(&o);
    else
        tdist_optim_adam_opts_init(&o);
    TDIST_CHECK(check_adam_opts(fn, &o));
    TDIST_CHECK(check_params(fn, params, n));
    tdist_optim_t *opt = NULL;
    TDIST_CHECK(create_common(fn, kind, o.amsgrad ? 3 : 2, params, n, &opt));
    opt->adam = o;
    opt->lr = o.lr;
    *out = opt;
    return TDIST_OK;
}

tdist_status_t tdist_optim_create_adam(const tdist_optim_param_t *params, size_t n,
                                       const tdist_optim_adam_opts_t *opts, tdist_optim_t **out)
{
    return create_adam("tdist_optim_create_adam", TDIST_OPTIM_ADAM, params, n, opts, out);
}

tdist_status_t tdist_optim_create_adamw(const tdist_optim_param_t *params, size_t n,
                                        const tdist_optim_adam_opts_t *opts, tdist_optim_t **out)
{
    return create_adam("tdist_optim_create_adamw", TDIST_OPTIM_ADAMW, params, n, opts, out);
}

void tdist_optim_destroy(tdist_optim_t *opt)
{
    if (!opt) return;
    if (opt->bufs)
        for (size_t i = 0; i < opt->nbuf; i++) free(opt->bufs[i].name);
    free(opt->bufs);
    free(opt->state_mem);
    free(opt);
}

/* ----------------------------------------------------------------- step */

static void step_one(tdist_optim_t *opt, size_t index, size_t offset, size_t count)
{
    tdist__optim_buf_t *b = &opt->bufs[index];
    b->steps++;
    if (count == 0) return;
    float *p = b->param + offset;
    const float *g = b->grad + offset;
    float *st[TDIST_OPTIM_MAX_STATE] = {NULL, NULL, NULL};
    for (int s = 0; s < opt->nstate; s++) st[s] = b->state[s] + offset;
    if (opt->kind == TDIST_OPTIM_SGD)
        tdist__optim_sgd_update(&opt->sgd, opt->lr, b->steps, p, g, st[0], count);
    else
        tdist__optim_adam_update(&opt->adam, opt->kind == TDIST_OPTIM_ADAMW, opt->lr, b->steps, p,
                                 g, st[0], st[1], st[2], count);
}

tdist_status_t tdist_optim_step(tdist_optim_t *opt)
{
    TDIST_ARG_CHECK(opt != NULL, "tdist_optim_step");
    for (size_t i = 0; i < opt->nbuf; i++) step_one(opt, i, 0, opt->bufs[i].count);
    return TDIST_OK;
}

tdist_status_t tdist_optim_step_range(tdist_optim_t *opt, size_t index, size_t offset,
                                      size_t count)
{
    static const char fn[] = "tdist_optim_step_range";
    TDIST_ARG_CHECK(opt != NULL, fn);
    if (index >= opt->nbuf)
        return tdist__error(TDIST_ERR_INVALID_ARG,
                            "%s: buffer index %zu out of range (the optimizer has %zu buffers)", fn,
                            index, opt->nbuf);
    size_t have = opt->bufs[index].count;
    if (offset > have || count > have - offset) {
        char label[160];
        return tdist__error(TDIST_ERR_INVALID_ARG,
                            "%s: range offset %zu count %zu is beyond %s of %zu elements", fn,
                            offset, count, tdist__optim_buf_label(opt, index, label, sizeof label),
                            have);
    }
    step_one(opt, index, offset, count);
    return TDIST_OK;
}

/* ------------------------------------------------------------ accessors */

static tdist_status_t check_index(const char *fn, const tdist_optim_t *opt, size_t index)
{
    if (!opt) return tdist__error(TDIST_ERR_INVALID_ARG, "%s: opt is NULL", fn);
    if (index >= opt->nbuf)
        return tdist__error(TDIST_ERR_INVALID_ARG,
                            "%s: buffer index %zu out of range (the optimizer has %zu buffers)", fn,
                            index, opt->nbuf);
    return TDIST_OK;
}

tdist_status_t tdist_optim_set_grad(tdist_optim_t *opt, size_t index, const float *grad)
{
    static const char fn[] = "tdist_optim_set_grad";
    TDIST_CHECK(check_index(fn, opt, index));
    if (!grad && opt->bufs[index].count > 0) {
        char label[160];
        return tdist__error(TDIST_ERR_INVALID_ARG, "%s: grad is NULL for %s", fn,
                            tdist__optim_buf_label(opt, index, label, sizeof label));
    }
    opt->bufs[index].grad = grad;
    return TDIST_OK;
}

tdist_status_t tdist_optim_set_param(tdist_optim_t *opt, size_t index, float *param)
{
    static const char fn[] = "tdist_optim_set_param";
    TDIST_CHECK(check_index(fn, opt, index));
    if (!param && opt->bufs[index].count > 0) {
        char label[160];
        return tdist__error(TDIST_ERR_INVALID_ARG, "%s: param is NULL for %s", fn,
                            tdist__optim_buf_label(opt, index, label, sizeof label));
    }
    opt->bufs[index].param = param;
    return TDIST_OK;
}

tdist_status_t tdist_optim_set_lr(tdist_optim_t *opt, double lr)
{
    static const char fn[] = "tdist_optim_set_lr";
    TDIST_ARG_CHECK(opt != NULL, fn);
    TDIST_CHECK(check_nonneg(fn, "lr", lr));
    opt->lr = lr;
    return TDIST_OK;
}

tdist_status_t tdist_optim_get_lr(const tdist_optim_t *opt, double *lr)
{
    TDIST_ARG_CHECK(opt != NULL, "tdist_optim_get_lr");
    TDIST_ARG_CHECK(lr != NULL, "tdist_optim_get_lr");
    *lr = opt->lr;
    return TDIST_OK;
}

tdist_status_t tdist_optim_kind(const tdist_optim_t *opt, tdist_optim_kind_t *kind)
{
    TDIST_ARG_CHECK(opt != NULL, "tdist_optim_kind");
    TDIST_ARG_CHECK(kind != NULL, "tdist_optim_kind");
    *kind = opt->kind;
    return TDIST_OK;
}

tdist_status_t tdist_optim_num_buffers(const tdist_optim_t *opt, size_t *n)
{
    TDIST_ARG_CHECK(opt != NULL, "tdist_optim_num_buffers");
    TDIST_ARG_CHECK(n != NULL, "tdist_optim_num_buffers");
    *n = opt->nbuf;
    return TDIST_OK;
}

tdist_status_t tdist_optim_step_count(const tdist_optim_t *opt, size_t index, uint64_t *steps)
{
    static const char fn[] = "tdist_optim_step_count";
    TDIST_CHECK(check_index(fn, opt, index));
    TDIST_ARG_CHECK(steps != NULL, fn);
    *steps = opt->bufs[index].steps;
    return TDIST_OK;
}

tdist_status_t tdist_optim_set_step_count(tdist_optim_t *opt, size_t index, uint64_t steps)
{
    TDIST_CHECK(check_index("tdist_optim_set_step_count", opt, index));
    opt->bufs[index].steps = steps;
    return TDIST_OK;
}

tdist_status_t tdist_optim_num_state(const tdist_optim_t *opt, int *nstate)
{
    TDIST_ARG_CHECK(opt != NULL, "tdist_optim_num_state");
    TDIST_ARG_CHECK(nstate != NULL, "tdist_optim_num_state");
    *nstate = opt->nstate;
    return TDIST_OK;
}

tdist_status_t tdist_optim_state_ptr(tdist_optim_t *opt, size_t index, int slot, float **ptr)
{
    static const char fn[] = "tdist_optim_state_ptr";
    TDIST_CHECK(check_index(fn, opt, index));
    TDIST_ARG_CHECK(ptr != NULL, fn);
    if (slot < 0 || slot >= opt->nstate)
        return tdist__error(TDIST_ERR_INVALID_ARG,
                            "%s: state slot %d out of range (this %s optimizer keeps %d state "
                            "arrays per element)",
                            fn, slot, tdist_optim_kind_name(opt->kind), opt->nstate);
    *ptr = opt->bufs[index].state[slot];
    return TDIST_OK;
}
