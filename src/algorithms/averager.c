/*
 * algorithms/averager.c — PyTorch's model averagers (PeriodicModelAverager,
 * HierarchicalModelAverager), its average_parameters, and the
 * post-local-SGD optimizer (PostLocalSGDOptimizer). See tdist/algorithms.h.
 *
 * Averaging is PyTorch 1.13's utils.average_parameters: the parameters
 * with a gradient are concatenated into one flat f32 buffer, divided by
 * the group's size (a true division), summed with one all_reduce, and
 * copied back; the averager keeps the flat buffer between calls.
 *
 * The schedules are PyTorch's: periodic averages at step >= warmup with
 * (step - warmup) % period == 0; hierarchical, at step >= warmup, takes
 * the level with the largest period dividing the step (no warm-up
 * offset). The counter goes up on every call.
 *
 * The configuration (kind, warm-up, periods and group sizes, the element
 * count) is agreed across the group on the first call, so two ranks with
 * different schedules fail together instead of waiting for each other's
 * all_reduce until the deadline.
 *
 * The optimizer's state is averaged (an option of the post-local-SGD
 * optimizer) as one flat vector: copied out of the optimizer
 * (tdist_optim_copy_state_out), averaged, copied back in.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "algorithms/internal.h"

struct tdist_averager {
    tdist_pg_t *pg;
    bool hier;
    int64_t period, warmup, step;
    size_t nlev;
    tdist_averager_level_t *lev;
    tdist_pg_t **groups;     /* per level: pg itself, or a subgroup owned here */
    float *flat;             /* the concatenation, kept between calls */
    size_t cap;
    tdist__agree_t agree;
};

/* ------------------------------------------------------- average_parameters */

tdist_status_t tdist__average_flat(tdist_pg_t *pg, float *flat, size_t count, const char *who)
{
    int size = tdist_pg_size(pg);
    if (size <= 1 || count == 0) return TDIST_OK;
    TDIST_CHECK(tdist_divide(flat, count, TDIST_F32, size));
    tdist_status_t st = tdist_all_reduce(pg, flat, flat, count, TDIST_F32, TDIST_SUM, NULL, NULL);
    if (st != TDIST_OK)
        return tdist__error_context(st, "%s: rank %d group %s: all_reduce (sum) of %zu x f32", who,
                                    tdist_pg_rank(pg), tdist_pg_name(pg), count);
    return TDIST_OK;
}

static bool averaged(const tdist_optim_param_t *p) { return p->grad && p->count > 0; }

/* Elements averaged (buffers with a gradient); checks the buffers. */
static tdist_status_t count_params(const tdist_optim_param_t *params, size_t n, const char *who,
                                   size_t *total)
{
    if (!params && n > 0) return tdist__error(TDIST_ERR_INVALID_ARG, "%s: params is NULL", who);
    size_t t = 0;
    for (size_t i = 0; i < n; i++) {
        if (!averaged(&params[i])) continue;
        if (!params[i].param)
            return tdist__error(TDIST_ERR_INVALID_ARG, "%s: buffer %zu (%s) has a gradient but no "
                                "param", who, i, params[i].name ? params[i].name : "unnamed");
        t += params[i].count;
    }
    *total = t;
    return TDIST_OK;
}

/* cat(params with a gradient) -> flat, average over pg, copy back. */
static tdist_status_t average_via(tdist_pg_t *pg, const tdist_optim_param_t *params, size_t n,
                                  float *flat, size_t total, const char *who)
{
    size_t off = 0;
    for (size_t i = 0; i < n; i++) {
        if (!averaged(&params[i])) continue;
        memcpy(flat + off, params[i].param, params[i].count * sizeof(float));
        off += params[i].count;
    }
    TDIST_CHECK(tdist__average_flat(pg, flat, total, who));
    off = 0;
    for (size_t i = 0; i < n; i++) {
        if (!averaged(&params[i])) continue;
        memcpy(params[i].param, flat + off, params[i].count * sizeof(float));
        off += params[i].count;
    }
    return TDIST_OK;
}

tdist_status_t tdist_average_parameters(tdist_pg_t *pg, const tdist_optim_param_t *params, size_t n)
{
    const char *who = "tdist_average_parameters";
    if (!pg) return tdist__error(TDIST_ERR_INVALID_ARG, "%s: pg is NULL", who);
    size_t total;
    TDIST_CHECK(count_params(params, n, who, &total));
    float *flat = malloc((total ? total : 1) * sizeof(float));
    if (!flat) return tdist__error(TDIST_ERR_NO_MEMORY, "%s: out of memory", who);
    tdist_status_t st = average_via(pg, params, n, flat, total, who);
    free(flat);
    return st;
}

/* ------------------------------------------------------------ the averagers */

void tdist_averager_opts_init(tdist_averager_opts_t *opts)
{
    if (!opts) return;
    memset(opts, 0, sizeof *opts);
}

static tdist_status_t check_common(tdist_pg_t *pg, const tdist_averager_opts_t *o,
                                   tdist_averager_t **out, const char *fn)
{
    if (!pg || !o || !out)
        return tdist__error(TDIST_ERR_INVALID_ARG, "%s: %s is NULL", fn,
                            !pg ? "pg" : !o ? "opts" : "out");
    if (o->warmup_steps < 0)
        return tdist__error(TDIST_ERR_INVALID_ARG, "%s: opts.warmup_steps is %" PRId64 "; it must "
                            "be >= 0", fn, o->warmup_steps);
    return TDIST_OK;
}

tdist_status_t tdist_periodic_averager_create(tdist_pg_t *pg, const tdist_averager_opts_t *opts,
                                              tdist_averager_t **out)
{
    const char *fn = "tdist_periodic_averager_create";
    TDIST_CHECK(check_common(pg, opts, out, fn));
    if (opts->period < 1)
        return tdist__error(TDIST_ERR_INVALID_ARG, "%s: opts.period is %" PRId64 "; it must be >= 1 "
                            "(the steps per averaging)", fn, opts->period);
    if (opts->levels || opts->num_levels)
        return tdist__error(TDIST_ERR_INVALID_ARG, "%s: opts.levels is for "
                            "tdist_hierarchical_averager_create", fn);
    tdist_averager_t *a = calloc(1, sizeof *a);
    if (!a) return tdist__error(TDIST_ERR_NO_MEMORY, "%s: out of memory", fn);
    a->pg = pg;
    a->period = opts->period;
    a->warmup = opts->warmup_steps;
    *out = a;
    return TDIST_OK;
}

static tdist_status_t check_levels(const tdist_pg_t *pg, const tdist_averager_opts_t *o,
                                   const char *fn)
{
    if (o->period != 0)
        return tdist__error(TDIST_ERR_INVALID_ARG, "%s: opts.period is for "
                            "tdist_periodic_averager_create; give opts.levels", fn);
    if (!o->levels || o->num_levels == 0)
        return tdist__error(TDIST_ERR_INVALID_ARG, "%s: opts.levels is empty (give at least one "
                            "level: the last one averages the whole group)", fn);
    int size = tdist_pg_size(pg);
    for (size_t i = 0; i < o->num_levels; i++) {
        const tdist_averager_level_t *l = &o->levels[i];
        if (l->period < 1 || (i > 0 && l->period <= o->levels[i - 1].period))
            return tdist__error(TDIST_ERR_INVALID_ARG, "%s: opts.levels[%zu].period is %" PRId64
                                "; periods must be >= 1 and strictly increasing", fn, i, l->period);
        if (l->group_size < 1 || size % l->group_size != 0)
            return tdist__error(TDIST_ERR_INVALID_ARG, "%s: opts.levels[%zu].group_size is %d; it "
                                "must divide the size of group '%s' (%d)", fn, i, l->group_size,
                                tdist_pg_name(pg), size);
    }
    if (o->levels[o->num_levels - 1].group_size != size)
        return tdist__error(TDIST_ERR_INVALID_ARG, "%s: the last level's group_size is %d; it must "
                            "be the size of group '%s' (%d)", fn,
                            o->levels[o->num_levels - 1].group_size, tdist_pg_name(pg), size);
    return TDIST_OK;
}

/* The subgroups: consecutive ranks, one split per level smaller than pg
 * (the same on every rank, so the splits match). */
static tdist_status_t make_groups(tdist_averager_t *a, const char *fn)
{
    int size = tdist_pg_size(a->pg), rank = tdist_pg_rank(a->pg);
    for (size_t i = 0; i < a->nlev; i++) {
        int gs = a->lev[i].group_size;
        if (gs == size) {
            a->groups[i] = a->pg;
            continue;
        }
        tdist_status_t st = tdist_pg_split(a->pg, rank / gs, rank, NULL, &a->groups[i]);
        if (st != TDIST_OK)
            return tdist__error_context(st, "%s: rank %d group %s: making the subgroups of %d "
                                        "ranks (level %zu)", fn, rank, tdist_pg_name(a->pg), gs, i);
    }
    return TDIST_OK;
}

tdist_status_t tdist_hierarchical_averager_create(tdist_pg_t *pg, const tdist_averager_opts_t *opts,
                                                  tdist_averager_t **out)
{
    const char *fn = "tdist_hierarchical_averager_create";
    TDIST_CHECK(check_common(pg, opts, out, fn));
    TDIST_CHECK(check_levels(pg, opts, fn));
    tdist_averager_t *a = calloc(1, sizeof *a);
    if (!a) return tdist__error(TDIST_ERR_NO_MEMORY, "%s: out of memory", fn);
    a->pg = pg;
    a->hier = true;
    a->warmup = opts->warmup_steps;
    a->nlev = opts->num_levels;
    a->lev = malloc(a->nlev * sizeof *a->lev);
    a->groups = calloc(a->nlev, sizeof *a->groups);
    if (!a->lev || !a->groups) {
        tdist_averager_destroy(a);
        return tdist__error(TDIST_ERR_NO_MEMORY, "%s: out of memory", fn);
    }
    memcpy(a->lev, opts->levels, a->nlev * sizeof *a->lev);
    tdist_status_t st = make_groups(a, fn);
    if (st != TDIST_OK) {
        tdist_averager_destroy(a);
        return st;
    }
    *out = a;
    return TDIST_OK;
}

void tdist_averager_destroy(tdist_averager_t *a)
{
    if (!a) return;
    for (size_t i = 0; a->groups && i < a->nlev; i++)
        if (a->groups[i] != a->pg) tdist_pg_destroy(a->groups[i]);
    free(a->groups);
    free(a->lev);
    free(a->flat);
    free(a);
}

/* The level averaging at step (-1: none). */
static int level_at(const tdist_averager_t *a, int64_t step)
{
    if (step < a->warmup) return -1;
    if (!a->hier) return (step - a->warmup) % a->period == 0 ? 0 : -1;
    for (size_t i = a->nlev; i-- > 0;)
        if (step % a->lev[i].period == 0) return (int)i;
    return -1;
}

int tdist_averager_group_size_at(const tdist_averager_t *a, int64_t step)
{
    if (!a) return 0;
    int l = level_at(a, step);
    if (l < 0) return 0;
    return a->hier ? a->lev[l].group_size : tdist_pg_size(a->pg);
}

int64_t tdist_averager_step(const tdist_averager_t *a) { return a ? a->step : 0; }

tdist_status_t tdist_averager_set_step(tdist_averager_t *a, int64_t step)
{
    if (!a || step < 0)
        return tdist__error(TDIST_ERR_INVALID_ARG, "tdist_averager_set_step: %s",
                            !a ? "the averager is NULL" : "step must be >= 0");
    a->step = step;
    return TDIST_OK;
}

/* Agree the schedule and the element count across the group (first call). */
static tdist_status_t agree(tdist_averager_t *a, size_t total, const char *who)
{
    uint64_t t = total;
    uint64_t c = tdist__fnv1a(TDIST__FNV_INIT, &a->warmup, sizeof a->warmup);
    c = tdist__fnv1a(c, &a->period, sizeof a->period);
    c = tdist__fnv1a(c, &t, sizeof t);
    char desc[200], levels[48] = "";
    for (size_t i = 0, len = 0; i < a->nlev; i++) {
        c = tdist__fnv1a(c, &a->lev[i], sizeof a->lev[i]);
        int k = snprintf(levels + len, sizeof levels - len, "%s%" PRId64 ":%d", i ? "," : "",
                         a->lev[i].period, a->lev[i].group_size);
        if (k > 0 && (size_t)k < sizeof levels - len) len += (size_t)k;
    }
    if (a->hier)
        snprintf(desc, sizeof desc, "HierarchicalModelAverager(%s, warmup %" PRId64 ", %zu elem)",
                 levels, a->warmup, total);
    else
        snprintf(desc, sizeof desc, "PeriodicModelAverager(period %" PRId64 ", warmup %" PRId64
                 ", %zu elements)", a->period, a->warmup, total);
    char where[160];
    snprintf(where, sizeof where, "rank %d group %s step %" PRId64, tdist_pg_rank(a->pg),
             tdist_pg_name(a->pg), a->step);
    return tdist__agree_pg(&a->agree, a->pg, who, where, "model averager",
                           a->hier ? "hierarchical_averager" : "periodic_averager", desc, c);
}

tdist_status_t tdist__averager_run(tdist_averager_t *a, const tdist_optim_param_t *params, size_t n,
                                   tdist_pg_t **used)
{
    const char *who = "tdist_averager_average";
    *used = NULL;
    if (!a) return tdist__error(TDIST_ERR_INVALID_ARG, "%s: the averager is NULL", who);
    size_t total;
    TDIST_CHECK(count_params(params, n, who, &total));
    TDIST_CHECK(agree(a, total, who));
    int l = level_at(a, a->step);
    if (l >= 0 && total > 0) {
        tdist_pg_t *g = a->hier ? a->groups[l] : a->pg;
        if (total > a->cap) {
            float *f = realloc(a->flat, total * sizeof(float));
            if (!f) return tdist__error(TDIST_ERR_NO_MEMORY, "%s: out of memory", who);
            a->flat = f;
            a->cap = total;
        }
        tdist_status_t st = average_via(g, params, n, a->flat, total, who);
        if (st != TDIST_OK)
            return tdist__error_context(st, "%s: rank %d group %s step %" PRId64, who,
                                        tdist_pg_rank(a->pg), tdist_pg_name(a->pg), a->step);
        *used = g;
    }
    a->step++;
    return TDIST_OK;
}

tdist_status_t tdist_averager_average(tdist_averager_t *a, const tdist_optim_param_t *params,
                                      size_t n, int *group_size)
{
    tdist_pg_t *used;
    TDIST_CHECK(tdist__averager_run(a, params, n, &used));
    if (group_size) *group_size = used ? tdist_pg_size(used) : 0;
    return TDIST_OK;
}

/* ------------------------------------------------ post-local-SGD optimizer */

struct tdist_post_local_optim {
    tdist_optim_t *optim;
    tdist_optim_param_t *params;
    size_t n;
    tdist_averager_t *averager;
    bool average_state;
    float *state;            /* the optimizer's state, flat (average_optimizer_state) */
    size_t state_cap;
};

void tdist_post_local_optim_opts_init(tdist_post_local_optim_opts_t *opts)
{
    if (opts) memset(opts, 0, sizeof *opts);
}

tdist_status_t tdist_post_local_optim_create(tdist_optim_t *optim, const tdist_optim_param_t *params,
                                             size_t n, tdist_averager_t *averager,
                                             const tdist_post_local_optim_opts_t *opts,
                                             tdist_post_local_optim_t **out)
{
    const char *fn = "tdist_post_local_optim_create";
    if (!optim || !averager || !out || (!params && n > 0))
        return tdist__error(TDIST_ERR_INVALID_ARG, "%s: %s is NULL", fn,
                            !optim ? "optim" : !averager ? "averager" : !out ? "out" : "params");
    size_t nb = 0;
    TDIST_CHECK(tdist_optim_num_buffers(optim, &nb));
    if (nb != n)
        return tdist__error(TDIST_ERR_INVALID_ARG, "%s: the optimizer has %zu buffers, params %zu: "
                            "pass the array the optimizer was created with", fn, nb, n);
    tdist_post_local_optim_t *p = calloc(1, sizeof *p);
    if (!p || (n && !(p->params = malloc(n * sizeof *p->params)))) {
        free(p);
        return tdist__error(TDIST_ERR_NO_MEMORY, "%s: out of memory", fn);
    }
    if (n) memcpy(p->params, params, n * sizeof *params);
    for (size_t i = 0; i < n; i++) p->params[i].name = NULL; /* not copied: not kept */
    p->optim = optim;
    p->n = n;
    p->averager = averager;
    p->average_state = opts && opts->average_optimizer_state;
    *out = p;
    return TDIST_OK;
}

void tdist_post_local_optim_destroy(tdist_post_local_optim_t *p)
{
    if (!p) return;
    free(p->params);
    free(p->state);
    free(p);
}

/* Average the optimizer's state arrays over g (one flat vector). */
static tdist_status_t average_state(tdist_post_local_optim_t *p, tdist_pg_t *g)
{
    const char *who = "tdist_post_local_optim_step";
    size_t count = 0;
    TDIST_CHECK(tdist_optim_state_count(p->optim, &count));
    if (count > p->state_cap) {
        float *v = realloc(p->state, count * sizeof *v);
        if (!v) return tdist__error(TDIST_ERR_NO_MEMORY, "%s: out of memory", who);
        p->state = v;
        p->state_cap = count;
    }
    if (count == 0) return TDIST_OK;
    TDIST_CHECK(tdist_optim_copy_state_out(p->optim, p->state, count));
    TDIST_CHECK(tdist__average_flat(g, p->state, count, who));
    return tdist_optim_copy_state_in(p->optim, p->state, count);
}

tdist_status_t tdist_post_local_optim_step(tdist_post_local_optim_t *p)
{
    if (!p)
        return tdist__error(TDIST_ERR_INVALID_ARG, "tdist_post_local_optim_step: the state is NULL");
    TDIST_CHECK(tdist_optim_step(p->optim));
    tdist_pg_t *used;
    TDIST_CHECK(tdist__averager_run(p->averager, p->params, p->n, &used));
    if (used && p->average_state) return average_state(p, used);
    return TDIST_OK;
}

/* A joined rank: the averaging step the active ranks take in this
 * iteration, with this rank's own parameters (no optimizer step). */
static tdist_status_t post_local_main_hook(void *ctx, const tdist_join_state_t *st)
{
    (void)st;
    tdist_post_local_optim_t *p = ctx;
    tdist_pg_t *used;
    TDIST_CHECK(tdist__averager_run(p->averager, p->params, p->n, &used));
    if (used && p->average_state) return average_state(p, used);
    return TDIST_OK;
}

tdist_status_t tdist_post_local_optim_joinable(tdist_post_local_optim_t *p, tdist_joinable_t *out)
{
    if (!p || !out)
        return tdist__error(TDIST_ERR_INVALID_ARG, "tdist_post_local_optim_joinable: %s is NULL",
                            !p ? "the state" : "out");
    memset(out, 0, sizeof *out);
    out->ctx = p;
    out->pg = p->averager->pg;
    out->main_hook = post_local_main_hook;
    return TDIST_OK;
}
