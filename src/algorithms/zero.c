/*
 * algorithms/zero.c — ZeRO stage 1 (tdist_zero_* in tdist/algorithms.h):
 * the cross-rank check at create, the partition, the shard's optimizer,
 * the step and the synchronisation of the parameters, and the joinable.
 * The layout every partition is described with is in algorithms/zero.h.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "algorithms/zero.h"

#define ZERO_MAGIC 0x314f52455a647444ULL /* "DtdZERO1" */

void tdist_zero_opts_init(tdist_zero_opts_t *opts)
{
    if (!opts) return;
    memset(opts, 0, sizeof *opts);
    opts->kind = TDIST_OPTIM_SGD;
    tdist_optim_sgd_opts_init(&opts->sgd);
    tdist_optim_adam_opts_init(&opts->adam);
    opts->partition = TDIST_ZERO_BY_PARAMS;
    opts->sync = TDIST_ZERO_SYNC_AUTO;
    opts->parameters_as_bucket_view = false;
    opts->overlap_part_bytes = 1u << 20;
}

tdist_status_t tdist__zero_error(const tdist_zero_t *z, tdist_status_t st, const char *who,
                                 const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (!z || !z->pg) return tdist__error(st, "%s: %s", who, msg);
    return tdist__error(st, "%s: rank %d group %s: %s", who, z->rank, tdist_pg_name(z->pg), msg);
}

float *tdist__zero_piece_state(tdist_optim_t *opt, size_t k, int s)
{
    float *p = NULL;
    if (tdist_optim_state_ptr(opt, k, s, &p) != TDIST_OK) return NULL;
    return p;
}

/* ------------------------------------------------------------ agreement */

static uint64_t hash_f64(uint64_t h, double v) { return tdist__fnv1a(h, &v, sizeof v); }

/* Everything in the options that must be equal on every rank. */
static uint64_t opts_hash(const tdist_zero_opts_t *o)
{
    uint64_t h = TDIST__FNV_INIT;
    int64_t ints[5] = {o->kind, o->partition, o->sync, o->parameters_as_bucket_view,
                       (int64_t)o->overlap_part_bytes};
    h = tdist__fnv1a(h, ints, sizeof ints);
    if (o->kind == TDIST_OPTIM_SGD) {
        const tdist_optim_sgd_opts_t *s = &o->sgd;
        double d[4] = {s->lr, s->momentum, s->dampening, s->weight_decay};
        for (int i = 0; i < 4; i++) h = hash_f64(h, d[i]);
        int64_t b[2] = {s->nesterov, s->maximize};
        h = tdist__fnv1a(h, b, sizeof b);
    } else {
        const tdist_optim_adam_opts_t *a = &o->adam;
        double d[5] = {a->lr, a->beta1, a->beta2, a->eps, a->weight_decay};
        for (int i = 0; i < 5; i++) h = hash_f64(h, d[i]);
        int64_t b[2] = {a->amsgrad, a->maximize};
        h = tdist__fnv1a(h, b, sizeof b);
    }
    return h;
}

enum { R_MAGIC, R_KIND, R_OPTS, R_N, R_COUNTS, R_NAMES, R_WORDS };

static void fill_record(const tdist_zero_t *z, int64_t *rec)
{
    uint64_t hc = TDIST__FNV_INIT, hn = TDIST__FNV_INIT;
    for (size_t j = 0; j < z->n; j++) {
        uint64_t c = z->params[j].count;
        hc = tdist__fnv1a(hc, &c, sizeof c);
        hn = tdist__fnv1a(hn, &z->name_hash[j], sizeof z->name_hash[j]);
    }
    rec[R_MAGIC] = (int64_t)ZERO_MAGIC;
    rec[R_KIND] = z->opts.kind;
    rec[R_OPTS] = (int64_t)opts_hash(&z->opts);
    rec[R_N] = (int64_t)z->n;
    rec[R_COUNTS] = (int64_t)hc;
    rec[R_NAMES] = (int64_t)hn;
}

/* The ranks agree on n but not on the parameters: a second all_gather of
 * every (count, name hash) names the first parameter that differs. */
static tdist_status_t name_first_param(tdist_zero_t *z, int other)
{
    static const char who[] = "tdist_zero_create";
    size_t w = 2 * z->n;
    int64_t *mine = malloc(w * sizeof *mine);
    int64_t *all = malloc(w * (size_t)z->size * sizeof *all);
    if (!mine || !all) {
        free(mine);
        free(all);
        return tdist__zero_error(z, TDIST_ERR_NO_MEMORY, who, "out of memory");
    }
    for (size_t j = 0; j < z->n; j++) {
        mine[2 * j] = (int64_t)z->params[j].count;
        mine[2 * j + 1] = (int64_t)z->name_hash[j];
    }
    tdist_status_t st = tdist_all_gather(z->pg, mine, all, w, TDIST_I64, NULL, NULL);
    if (st == TDIST_OK) {
        const int64_t *a = all, *b = all + (size_t)other * w;
        size_t j = 0;
        while (j < z->n && a[2 * j] == b[2 * j] && a[2 * j + 1] == b[2 * j + 1]) j++;
        if (j == z->n)
            st = tdist__zero_error(z, TDIST_ERR_MISMATCH, who,
                                   "parameter mismatch across ranks (rank 0 and rank %d)", other);
        else if (a[2 * j] != b[2 * j])
            st = tdist__zero_error(z, TDIST_ERR_MISMATCH, who,
                                   "parameter shape mismatch: parameter %zu (%s here): %" PRId64
                                   " elements on rank 0, %" PRId64 " on rank %d",
                                   j, z->names[j], a[2 * j], b[2 * j], other);
        else
            st = tdist__zero_error(z, TDIST_ERR_MISMATCH, who,
                                   "parameter name mismatch: parameter %zu (%s here) has another "
                                   "name on rank %d than on rank 0",
                                   j, z->names[j], other);
    }
    free(mine);
    free(all);
    return st;
}

static tdist_status_t agree(tdist_zero_t *z)
{
    static const char who[] = "tdist_zero_create";
    int64_t rec[R_WORDS];
    int64_t *all = calloc((size_t)z->size * R_WORDS, sizeof *all);
    if (!all) return tdist__zero_error(z, TDIST_ERR_NO_MEMORY, who, "out of memory");
    fill_record(z, rec);
    tdist_status_t st = tdist_all_gather(z->pg, rec, all, R_WORDS, TDIST_I64, NULL, NULL);
    if (st != TDIST_OK) {
        free(all);
        return tdist__error_context(st, "%s: rank %d group %s: the agreement of the ZeRO "
                                    "configuration failed", who, z->rank, tdist_pg_name(z->pg));
    }
    int other = -1;
    for (int r = 1; r < z->size && other < 0; r++)
        if (memcmp(all, all + (size_t)r * R_WORDS, sizeof rec) != 0) other = r;
    const int64_t *a = all, *b = all + (size_t)(other < 0 ? 0 : other) * R_WORDS;
    if (other < 0) {
        st = TDIST_OK;
    } else if (a[R_MAGIC] != b[R_MAGIC]) {
        st = tdist__zero_error(z, TDIST_ERR_MISMATCH, who,
                               "rank %d did not run tdist_zero_create (another collective "
                               "of the same shape)", a[R_MAGIC] != (int64_t)ZERO_MAGIC ? 0 : other);
    } else if (a[R_KIND] != b[R_KIND]) {
        st = tdist__zero_error(z, TDIST_ERR_MISMATCH, who,
                               "optimizer kind mismatch: rank 0 uses %s, rank %d uses %s",
                               tdist_optim_kind_name((tdist_optim_kind_t)a[R_KIND]), other,
                               tdist_optim_kind_name((tdist_optim_kind_t)b[R_KIND]));
    } else if (a[R_N] != b[R_N]) {
        st = tdist__zero_error(z, TDIST_ERR_MISMATCH, who,
                               "parameter count mismatch: rank 0 has %" PRId64
                               " parameters, rank %d has %" PRId64,
                               a[R_N], other, b[R_N]);
    } else if (a[R_COUNTS] != b[R_COUNTS] || a[R_NAMES] != b[R_NAMES]) {
        st = name_first_param(z, other);
    } else {
        st = tdist__zero_error(z, TDIST_ERR_MISMATCH, who,
                               "option mismatch: rank 0 and rank %d pass different options "
                               "(hyperparameters, partition, sync, parameters_as_bucket_view or "
                               "overlap_part_bytes)",
                               other);
    }
    free(all);
    return st;
}

/* ------------------------------------------------------------ partition */

/* PyTorch's rule: by element count, largest first, stable; each to the
 * least-loaded rank, ties to the lowest. */
static tdist_status_t partition_by_params(tdist_zero_t *z)
{
    size_t *sorted = z->order; /* reused below as the grouped order */
    size_t *tmp = malloc(z->n * sizeof *tmp);
    if (!tmp) return TDIST_ERR_NO_MEMORY;
    for (size_t j = 0; j < z->n; j++) tmp[j] = j;
    for (size_t i = 1; i < z->n; i++) { /* insertion sort: stable */
        size_t v = tmp[i], k = i;
        while (k > 0 && z->params[tmp[k - 1]].count < z->params[v].count) {
            tmp[k] = tmp[k - 1];
            k--;
        }
        tmp[k] = v;
    }
    memset(z->rank_elems, 0, (size_t)z->size * sizeof *z->rank_elems);
    for (size_t i = 0; i < z->n; i++) {
        size_t j = tmp[i];
        int best = 0;
        for (int r = 1; r < z->size; r++)
            if (z->rank_elems[r] < z->rank_elems[best]) best = r;
        z->owner[j] = best;
        z->rank_elems[best] += z->params[j].count;
    }
    size_t at = 0;
    z->block = 0;
    for (int r = 0; r < z->size; r++) {
        z->rank_start[r] = at;
        size_t off = 0;
        for (size_t i = 0; i < z->n; i++)
            if (z->owner[tmp[i]] == r) {
                sorted[at++] = tmp[i];
                z->pos[tmp[i]] = off; /* block-relative for now */
                off += z->params[tmp[i]].count;
            }
        if (z->rank_elems[r] > z->block) z->block = z->rank_elems[r];
    }
    z->rank_start[z->size] = at;
    for (size_t j = 0; j < z->n; j++) z->pos[j] += (size_t)z->owner[j] * z->block;
    free(tmp);
    return TDIST_OK;
}

static void partition_flat(tdist_zero_t *z)
{
    size_t w = (size_t)z->size;
    z->block = (z->total + w - 1) / w;
    size_t at = 0;
    for (size_t j = 0; j < z->n; j++) {
        z->pos[j] = at;
        z->owner[j] = z->block ? (int)(at / z->block) : 0;
        at += z->params[j].count;
    }
    for (size_t r = 0; r < w; r++) {
        size_t lo = r * z->block, hi = lo + z->block;
        if (lo > z->total) lo = z->total;
        if (hi > z->total) hi = z->total;
        z->rank_elems[r] = hi - lo;
    }
    /* order/rank_start: the parameters touching each rank's range */
    size_t k = 0;
    for (size_t r = 0; r < w; r++) {
        z->rank_start[r] = k;
        for (size_t j = 0; j < z->n && k < z->n * w; j++) {
            size_t a = z->pos[j], b = a + z->params[j].count;
            if (b > r * z->block && a < (r + 1) * z->block && b > a) z->order[k++] = j;
        }
    }
    z->rank_start[w] = k;
}

/* This rank's pieces: its block intersected with every parameter, in the
 * rank's order (partition order for BY_PARAMS, creation order for FLAT). */
static tdist_status_t build_pieces(tdist_zero_t *z)
{
    size_t lo = (size_t)z->rank * z->block, hi = lo + z->block;
    size_t a0 = z->rank_start[z->rank], a1 = z->rank_start[z->rank + 1];
    z->mine = calloc(a1 - a0 + 1, sizeof *z->mine);
    if (!z->mine) return TDIST_ERR_NO_MEMORY;
    for (size_t k = a0; k < a1; k++) {
        size_t j = z->order[k], a = z->pos[j], b = a + z->params[j].count;
        size_t s = a > lo ? a : lo, e = b < hi ? b : hi;
        if (e <= s) continue;
        z->mine[z->nmine++] = (tdist__zero_piece_t){j, s - a, e - s};
    }
    return TDIST_OK;
}

static tdist_status_t make_optim(tdist_zero_t *z)
{
    tdist_optim_param_t *p = calloc(z->nmine + 1, sizeof *p);
    if (!p) return TDIST_ERR_NO_MEMORY;
    for (size_t k = 0; k < z->nmine; k++) {
        const tdist__zero_piece_t *q = &z->mine[k];
        const tdist_optim_param_t *u = &z->params[q->param];
        p[k] = (tdist_optim_param_t){u->param + q->offset, u->grad + q->offset, q->count,
                                     z->names[q->param]};
    }
    tdist_status_t st;
    if (z->opts.kind == TDIST_OPTIM_SGD)
        st = tdist_optim_create_sgd(p, z->nmine, &z->opts.sgd, &z->opt);
    else if (z->opts.kind == TDIST_OPTIM_ADAM)
        st = tdist_optim_create_adam(p, z->nmine, &z->opts.adam, &z->opt);
    else
        st = tdist_optim_create_adamw(p, z->nmine, &z->opts.adam, &z->opt);
    free(p);
    if (st == TDIST_OK) st = tdist_optim_num_state(z->opt, &z->nstate);
    return st;
}

/* ---------------------------------------------------------------- create */

static tdist_status_t check_args(tdist_pg_t *pg, const tdist_optim_param_t *params, size_t n,
                                 const tdist_zero_opts_t *o, tdist_zero_t **out)
{
    static const char who[] = "tdist_zero_create";
    if (!pg || !params || !out || n == 0)
        return tdist__error(TDIST_ERR_INVALID_ARG, "%s: %s", who,
                            !pg ? "pg is NULL" : !params ? "params is NULL"
                            : !out ? "out is NULL" : "n is 0 (no parameters)");
    for (size_t j = 0; j < n; j++)
        if (params[j].count > 0 && (!params[j].param || !params[j].grad))
            return tdist__error(TDIST_ERR_INVALID_ARG, "%s: parameter %zu (%s): %s pointer is NULL",
                                who, j, params[j].name ? params[j].name : "unnamed",
                                !params[j].param ? "param" : "grad");
    if (o->kind != TDIST_OPTIM_SGD && o->kind != TDIST_OPTIM_ADAM && o->kind != TDIST_OPTIM_ADAMW)
        return tdist__error(TDIST_ERR_INVALID_ARG, "%s: unknown optimizer kind %d", who, (int)o->kind);
    if (o->partition != TDIST_ZERO_BY_PARAMS && o->partition != TDIST_ZERO_FLAT)
        return tdist__error(TDIST_ERR_INVALID_ARG, "%s: unknown partition %d", who, (int)o->partition);
    if (o->sync < TDIST_ZERO_SYNC_AUTO || o->sync > TDIST_ZERO_SYNC_ALL_GATHER ||
        (o->partition == TDIST_ZERO_FLAT && o->sync == TDIST_ZERO_SYNC_BROADCAST))
        return tdist__error(TDIST_ERR_INVALID_ARG,
                            "%s: sync %d is not valid with partition %s (FLAT synchronises by "
                            "all_gather)", who, (int)o->sync,
                            o->partition == TDIST_ZERO_FLAT ? "FLAT" : "BY_PARAMS");
    return TDIST_OK;
}

static tdist_status_t alloc_arrays(tdist_zero_t *z, const tdist_optim_param_t *params)
{
    size_t n = z->n, w = (size_t)z->size;
    z->params = calloc(n, sizeof *z->params);
    z->names = calloc(n, sizeof *z->names);
    z->name_hash = calloc(n, sizeof *z->name_hash);
    z->pos = calloc(n, sizeof *z->pos);
    z->owner = calloc(n, sizeof *z->owner);
    z->order = calloc(n * w, sizeof *z->order);
    z->rank_start = calloc(w + 1, sizeof *z->rank_start);
    z->rank_elems = calloc(w, sizeof *z->rank_elems);
    if (!z->params || !z->names || !z->name_hash || !z->pos || !z->owner || !z->order ||
        !z->rank_start || !z->rank_elems)
        return TDIST_ERR_NO_MEMORY;
    for (size_t j = 0; j < n; j++) {
        z->params[j] = params[j];
        char def[32];
        snprintf(def, sizeof def, "param%zu", j);
        const char *nm = params[j].name ? params[j].name : def;
        z->names[j] = strdup(nm);
        if (!z->names[j]) return TDIST_ERR_NO_MEMORY;
        z->params[j].name = z->names[j];
        z->name_hash[j] = tdist__fnv1a(TDIST__FNV_INIT, nm, strlen(nm));
        z->total += params[j].count;
    }
    return TDIST_OK;
}

/* parameters_as_bucket_view: move the parameters into the layout. */
static tdist_status_t make_view(tdist_zero_t *z)
{
    z->flat = calloc((size_t)z->size * z->block + 1, sizeof *z->flat);
    if (!z->flat) return TDIST_ERR_NO_MEMORY;
    for (size_t j = 0; j < z->n; j++) {
        if (z->params[j].count)
            memcpy(z->flat + z->pos[j], z->params[j].param, z->params[j].count * sizeof(float));
        z->params[j].param = z->flat + z->pos[j];
    }
    return TDIST_OK;
}

tdist_status_t tdist_zero_create(tdist_pg_t *pg, const tdist_optim_param_t *params, size_t n,
                                 const tdist_zero_opts_t *opts, tdist_zero_t **out)
{
    static const char who[] = "tdist_zero_create";
    tdist_zero_opts_t o;
    if (opts) o = *opts;
    else tdist_zero_opts_init(&o);
    TDIST_CHECK(check_args(pg, params, n, &o, out));
    tdist_zero_t *z = calloc(1, sizeof *z);
    if (!z) return tdist__error(TDIST_ERR_NO_MEMORY, "%s: out of memory", who);
    z->pg = pg;
    z->rank = tdist_pg_rank(pg);
    z->size = tdist_pg_size(pg);
    z->opts = o;
    z->n = n;
    z->use_all_gather = o.partition == TDIST_ZERO_FLAT || o.sync == TDIST_ZERO_SYNC_ALL_GATHER;
    tdist_status_t st = alloc_arrays(z, params);
    if (st != TDIST_OK) goto nomem;
    TDIST_CHECK_GOTO(agree(z), st, fail);
    if (o.partition == TDIST_ZERO_BY_PARAMS) {
        if ((st = partition_by_params(z)) != TDIST_OK) goto nomem;
    } else {
        partition_flat(z);
    }
    if (o.parameters_as_bucket_view && (st = make_view(z)) != TDIST_OK) goto nomem;
    if ((st = build_pieces(z)) != TDIST_OK) goto nomem;
    if ((st = make_optim(z)) != TDIST_OK) goto fail;
    *out = z;
    return TDIST_OK;
nomem:
    st = tdist__zero_error(z, TDIST_ERR_NO_MEMORY, who, "out of memory");
fail:
    tdist_zero_destroy(z);
    return st;
}

void tdist_zero_destroy(tdist_zero_t *z)
{
    if (!z) return;
    tdist__zero_overlap_free(z->overlap);
    tdist_optim_destroy(z->opt);
    for (size_t j = 0; z->names && j < z->n; j++) free(z->names[j]);
    free(z->names);
    free(z->name_hash);
    free(z->params);
    free(z->pos);
    free(z->owner);
    free(z->order);
    free(z->rank_start);
    free(z->rank_elems);
    free(z->mine);
    free(z->flat);
    free(z->scratch);
    free(z->gscratch);
    for (int s = 0; s < 3; s++) free(z->full[s]);
    free(z->full_steps);
    free(z);
}

/* ------------------------------------------------------------------ sync */

/* One broadcast per parameter from its owner (per rank block with the
 * view), all posted, then waited for. */
static tdist_status_t sync_broadcast(tdist_zero_t *z)
{
    size_t nw = z->flat ? (size_t)z->size : z->n;
    tdist_work_t **w = calloc(nw, sizeof *w);
    if (!w) return TDIST_ERR_NO_MEMORY;
    tdist_status_t st = TDIST_OK;
    size_t posted = 0;
    for (int r = 0; r < z->size && st == TDIST_OK; r++) {
        if (z->flat) {
            if (z->rank_elems[r] == 0) continue;
            st = tdist_broadcast(z->pg, z->flat + (size_t)r * z->block, z->rank_elems[r],
                                 TDIST_F32, r, NULL, &w[posted++]);
            continue;
        }
        for (size_t k = z->rank_start[r]; k < z->rank_start[r + 1] && st == TDIST_OK; k++) {
            const tdist_optim_param_t *p = &z->params[z->order[k]];
            if (p->count == 0) continue;
            st = tdist_broadcast(z->pg, p->param, p->count, TDIST_F32, r, NULL, &w[posted++]);
        }
    }
    for (size_t i = 0; i < posted; i++) {
        if (!w[i]) continue;
        tdist_status_t s2 = tdist_work_wait(w[i], -1);
        if (st == TDIST_OK) st = s2;
        tdist_work_free(w[i]);
    }
    free(w);
    return st;
}

/* Copy between the parameters and a layout-shaped buffer: rank r's block
 * (r >= 0) or every block (r < 0). to_layout: params -> buf. */
static void copy_layout(tdist_zero_t *z, float *buf, int r, bool to_layout)
{
    size_t lo = r < 0 ? 0 : (size_t)r * z->block;
    size_t hi = r < 0 ? (size_t)z->size * z->block : lo + z->block;
    for (size_t j = 0; j < z->n; j++) {
        size_t a = z->pos[j], b = a + z->params[j].count;
        size_t s = a > lo ? a : lo, e = b < hi ? b : hi;
        if (e <= s) continue;
        float *p = z->params[j].param + (s - a);
        if (to_layout) memcpy(buf + s, p, (e - s) * sizeof *p);
        else memcpy(p, buf + s, (e - s) * sizeof *p);
    }
}

/* Every rank's block, padded to the largest, in one all_gather. */
static tdist_status_t sync_all_gather(tdist_zero_t *z)
{
    size_t len = (size_t)z->size * z->block;
    if (len == 0) return TDIST_OK;
    float *recv = z->flat;
    if (!recv) {
        if (!z->scratch && !(z->scratch = calloc(len, sizeof *z->scratch))) return TDIST_ERR_NO_MEMORY;
        recv = z->scratch;
        copy_layout(z, recv, z->rank, true);
    }
    float *mine = malloc(z->block * sizeof *mine);
    if (!mine) return TDIST_ERR_NO_MEMORY;
    memcpy(mine, recv + (size_t)z->rank * z->block, z->block * sizeof *mine);
    tdist_status_t st = tdist_all_gather(z->pg, mine, recv, z->block, TDIST_F32, NULL, NULL);
    free(mine);
    if (st == TDIST_OK && !z->flat) copy_layout(z, recv, -1, false);
    return st;
}

/* While some rank has joined: a joined rank has no averaged gradients (DDP's
 * shadow iteration reduces zeros in its own buffers), so the lowest active
 * rank broadcasts the whole averaged gradient and every rank steps its
 * shard from that copy (on the active ranks it equals their own). */
static tdist_status_t step_from_root(tdist_zero_t *z, int root)
{
    if (!z->gscratch && !(z->gscratch = calloc(z->total + 1, sizeof *z->gscratch)))
        return TDIST_ERR_NO_MEMORY;
    if (z->rank == root)
        for (size_t j = 0, at = 0; j < z->n; at += z->params[j].count, j++)
            memcpy(z->gscratch + at, z->params[j].grad, z->params[j].count * sizeof(float));
    TDIST_CHECK(tdist_broadcast(z->pg, z->gscratch, z->total, TDIST_F32, root, NULL, NULL));
    size_t *goff = calloc(z->n + 1, sizeof *goff);
    if (!goff) return TDIST_ERR_NO_MEMORY;
    for (size_t j = 1; j < z->n; j++) goff[j] = goff[j - 1] + z->params[j - 1].count;
    tdist_status_t st = TDIST_OK;
    for (size_t k = 0; k < z->nmine && st == TDIST_OK; k++) {
        const tdist__zero_piece_t *q = &z->mine[k];
        st = tdist_optim_set_grad(z->opt, k, z->gscratch + goff[q->param] + q->offset);
    }
    if (st == TDIST_OK) st = tdist_optim_step(z->opt);
    for (size_t k = 0; k < z->nmine; k++) {
        const tdist__zero_piece_t *q = &z->mine[k];
        tdist_optim_set_grad(z->opt, k, z->params[q->param].grad + q->offset);
    }
    free(goff);
    return st;
}

static tdist_status_t step_with(tdist_zero_t *z, bool some_joined, int root)
{
    static const char who[] = "tdist_zero_step";
    tdist_status_t st = some_joined ? step_from_root(z, root) : tdist_optim_step(z->opt);
    if (st == TDIST_ERR_NO_MEMORY) return tdist__zero_error(z, st, who, "out of memory");
    if (st != TDIST_OK)
        return tdist__error_context(st, "%s: rank %d group %s: the step", who, z->rank,
                                    tdist_pg_name(z->pg));
    bool gather = z->use_all_gather || some_joined;
    st = gather ? sync_all_gather(z) : sync_broadcast(z);
    if (st == TDIST_ERR_NO_MEMORY) return tdist__zero_error(z, st, who, "out of memory");
    if (st != TDIST_OK)
        return tdist__error_context(st, "%s: rank %d group %s: synchronising the parameters (%s)",
                                    who, z->rank, tdist_pg_name(z->pg),
                                    gather ? "all_gather" : "broadcast from owners");
    return TDIST_OK;
}

tdist_status_t tdist_zero_step(tdist_zero_t *z)
{
    TDIST_ARG_CHECK(z != NULL, "tdist_zero_step");
    if (z->overlap) return TDIST_OK; /* stepped inside backward_end */
    bool some_joined = false;
    int root = 0;
    if (z->join) {
        tdist_join_state_t js;
        TDIST_CHECK(tdist_join_get_state(z->join, &js));
        some_joined = js.active < js.world_size;
        root = js.lowest_active >= 0 ? js.lowest_active : 0;
    }
    return step_with(z, some_joined, root);
}

/* ------------------------------------------------------------- accessors */

float *tdist_zero_param_ptr(const tdist_zero_t *z, size_t i)
{
    if (!z || i >= z->n) return NULL;
    return z->params[i].param;
}

size_t tdist_zero_rank_params(const tdist_zero_t *z, int r, size_t *out, size_t cap)
{
    if (!z || r < 0 || r >= z->size) return 0;
    size_t a = z->rank_start[r], b = z->rank_start[r + 1];
    for (size_t k = a; k < b && k - a < cap; k++) out[k - a] = z->order[k];
    return b - a;
}

size_t tdist_zero_rank_elems(const tdist_zero_t *z, int r)
{
    if (!z || r < 0 || r >= z->size) return 0;
    return z->rank_elems[r];
}

size_t tdist_zero_state_bytes(const tdist_zero_t *z)
{
    if (!z) return 0;
    tdist__zero_shard_t sh;
    tdist__zero_shard(z, &sh);
    size_t e = 0;
    for (size_t k = 0; k < sh.n; k++) e += sh.pieces[k].count;
    return e * (size_t)z->nstate * sizeof(float);
}

tdist_optim_t *tdist_zero_optim(tdist_zero_t *z)
{
    if (!z) return NULL;
    tdist__zero_shard_t sh;
    tdist__zero_shard(z, &sh);
    return sh.opt;
}

tdist_status_t tdist_zero_set_lr(tdist_zero_t *z, double lr)
{
    TDIST_ARG_CHECK(z != NULL, "tdist_zero_set_lr");
    tdist__zero_shard_t sh;
    tdist__zero_shard(z, &sh);
    TDIST_CHECK(tdist_optim_set_lr(z->opt, lr));
    return sh.opt == z->opt ? TDIST_OK : tdist_optim_set_lr(sh.opt, lr);
}

/* ------------------------------------------------------------------ Join */

static void zero_attach(void *ctx, tdist_join_t *join)
{
    tdist_zero_t *z = ctx;
    z->join = join;
}

static tdist_status_t zero_main_hook(void *ctx, const tdist_join_state_t *st)
{
    tdist_zero_t *z = ctx;
    if (z->overlap) return TDIST_OK; /* the comm hook ran inside DDP's shadow iteration */
    return step_with(z, true, st->lowest_active >= 0 ? st->lowest_active : 0);
}

tdist_status_t tdist_zero_joinable(tdist_zero_t *z, tdist_joinable_t *out)
{
    if (!z || !out)
        return tdist__error(TDIST_ERR_INVALID_ARG, "tdist_zero_joinable: %s is NULL",
                            !z ? "z" : "out");
    memset(out, 0, sizeof *out);
    out->ctx = z;
    out->pg = z->pg;
    out->attach = zero_attach;
    out->main_hook = zero_main_hook;
    return TDIST_OK;
}
