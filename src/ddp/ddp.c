/*
 * ddp/ddp.c — creating and destroying a reducer: argument checks, the
 * cross-rank check of shapes and options, the broadcast of parameters and
 * buffers from rank 0, and the small accessors (options, stats, layout,
 * the Join knobs).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#endif
#include <inttypes.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ddp/internal.h"

#define MiB ((size_t)1 << 20)

void tdist_ddp_opts_init(tdist_ddp_opts_t *opts)
{
    if (!opts) return;
    memset(opts, 0, sizeof *opts);
    opts->bucket_cap_bytes = 25 * MiB;
    opts->first_bucket_bytes = 1 * MiB;
    opts->sync_at_create = true;
    opts->broadcast_buffers = true;
    opts->find_unused_parameters = false;
    opts->gradient_as_bucket_view = false;
    opts->static_graph = false;
    opts->overlap = TDIST_DDP_OVERLAP_ON;
}

/* Whether the engine thread of this rank has a CPU to run on beside the
 * training thread: at least two of the CPUs the calling thread may run
 * on, per rank that shares them (every rank of the host, LOCAL_WORLD_SIZE,
 * when the set is the whole host: unbound ranks; this rank alone when it
 * was bound to part of it). */
static bool spare_cpu(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) != 0) return true;
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    int64_t cpus = CPU_COUNT(&set), sharing = 1;
    if (online > 0 && cpus >= online &&
        tdist__env_int("LOCAL_WORLD_SIZE", 1, INT32_MAX, &sharing) != TDIST_OK) {
        tdist_clear_error(); /* unset or malformed: init reports that, not the reducer */
        sharing = 1;
    }
    return cpus >= 2 * sharing;
}

tdist_status_t tdist__ddp_error(const tdist_ddp_t *ddp, tdist_status_t st, const char *op,
                                const char *fmt, ...)
{
    char m[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    if (!ddp) return tdist__error(st, "tdist_ddp_%s: %s", op, m);
    return tdist__error(st, "tdist_ddp_%s: rank %d group %s iteration %" PRIu64 ": %s", op,
                        ddp->rank, tdist_pg_name(ddp->pg), ddp->iteration, m);
}

/* The published FNV-1a basis (what these hashes were made with; ranks
 * compare them), over core's FNV-1a. */
#define FNV0 14695981039346656037ULL

static uint64_t opts_hash(const tdist_ddp_opts_t *o)
{
    uint64_t v[7] = {o->bucket_cap_bytes, o->first_bucket_bytes, o->sync_at_create,
                     o->broadcast_buffers, o->find_unused_parameters,
                     o->gradient_as_bucket_view, o->static_graph};
    return tdist__fnv1a(FNV0, v, sizeof v);
}

static void free_ddp(tdist_ddp_t *d)
{
    if (!d) return;
    if (d->params)
        for (size_t i = 0; i < d->np; i++) free(d->params[i].name);
    if (d->buffers)
        for (size_t i = 0; i < d->nbuf; i++) free(d->buffers[i].name);
    free(d->params);
    free(d->buffers);
    tdist__ddp_free_buckets(d->buckets, d->nb);
    free(d->arena);
    free(d->shadow_arena);
    free(d->ready);
    free(d->used_since_sync);
    free(d->used_map);
    free(d->order);
    free(d->direct_bufs);
    free(d->direct_counts);
    free(d->static_local);
    free(d);
}

/* "rank 1, rank 3" of the ranks whose signature differs from rank 0's. */
static void list_ranks(char *buf, size_t n, const uint64_t *sig, int size, size_t stride,
                       size_t at, size_t width)
{
    size_t len = 0;
    buf[0] = 0;
    for (int r = 1; r < size; r++) {
        if (memcmp(sig + (size_t)r * stride + at, sig + at, width * sizeof(uint64_t)) == 0)
            continue;
        int k = snprintf(buf + len, n - len, "%s%d", len ? ", " : "", r);
        if (k < 0 || (size_t)k >= n - len) break;
        len += (size_t)k;
    }
}

static const char *dt_name(uint64_t d)
{
    return d < TDIST_DTYPE_COUNT ? tdist_dtype_name((tdist_dtype_t)d) : "invalid";
}

/* The first all_gather of check_shapes: the numbers of parameters and
 * buffers, and the options' hash. */
static tdist_status_t check_counts(tdist_ddp_t *d)
{
    const char *op = "create";
    int size = d->size;
    uint64_t hdr[3] = {d->np, d->nbuf, opts_hash(&d->opts)};
    uint64_t *all = malloc((size_t)size * sizeof hdr);
    if (!all) return tdist__ddp_error(d, TDIST_ERR_NO_MEMORY, op, "out of memory");
    tdist_status_t st = tdist_all_gather(d->pg, hdr, all, 3, TDIST_I64, NULL, NULL);
    if (st != TDIST_OK) {
        free(all);
        return tdist__error_context(st, "tdist_ddp_create: rank %d group %s: shape check",
                                    d->rank, tdist_pg_name(d->pg));
    }
    char ranks[256];
    for (size_t f = 0; f < 3; f++) {
        list_ranks(ranks, sizeof ranks, all, size, 3, f, 1);
        if (!ranks[0]) continue;
        int r1 = atoi(ranks);
        static const char *what[3] = {"parameters", "buffers", "options"};
        tdist_status_t e;
        if (f < 2)
            e = tdist__ddp_error(d, TDIST_ERR_MISMATCH, op,
                                 "the model differs across ranks: rank 0 has %" PRIu64
                                 " %s, rank %d has %" PRIu64 " (ranks differing from rank 0: %s)",
                                 all[f], what[f], r1, all[(size_t)r1 * 3 + f], ranks);
        else
            e = tdist__ddp_error(d, TDIST_ERR_MISMATCH, op,
                                 "the options (bucket caps, sync_at_create, broadcast_buffers, "
                                 "find_unused_parameters, gradient_as_bucket_view, static_graph) "
                                 "differ from rank 0's on ranks %s",
                                 ranks);
        free(all);
        return e;
    }
    free(all);
    return TDIST_OK;
}

/* The second all_gather of check_shapes: each parameter's and buffer's
 * (count, dtype, name hash); the counts agree already. */
static tdist_status_t check_tensors(tdist_ddp_t *d)
{
    const char *op = "create";
    int size = d->size;
    size_t k = d->np + d->nbuf;
    if (k == 0) return TDIST_OK;
    uint64_t *mine = malloc(k * 3 * sizeof(uint64_t));
    uint64_t *sig = malloc((size_t)size * k * 3 * sizeof(uint64_t));
    if (!mine || !sig) {
        free(mine);
        free(sig);
        return tdist__ddp_error(d, TDIST_ERR_NO_MEMORY, op, "out of memory");
    }
    for (size_t i = 0; i < k; i++) {
        const char *name;
        uint64_t cnt, dt;
        if (i < d->np) {
            name = d->params[i].name;
            cnt = d->params[i].count;
            dt = (uint64_t)d->params[i].dtype;
        } else {
            name = d->buffers[i - d->np].name;
            cnt = d->buffers[i - d->np].count;
            dt = (uint64_t)d->buffers[i - d->np].dtype;
        }
        mine[3 * i] = cnt;
        mine[3 * i + 1] = dt;
        mine[3 * i + 2] = tdist__fnv1a(FNV0, name, strlen(name));
    }
    tdist_status_t st = tdist_all_gather(d->pg, mine, sig, k * 3, TDIST_I64, NULL, NULL);
    free(mine);
    if (st != TDIST_OK) {
        free(sig);
        return tdist__error_context(st, "tdist_ddp_create: rank %d group %s: shape check",
                                    d->rank, tdist_pg_name(d->pg));
    }
    char ranks[256];
    for (size_t i = 0; i < k; i++) {
        list_ranks(ranks, sizeof ranks, sig, size, k * 3, 3 * i, 3);
        if (!ranks[0]) continue;
        int r1 = atoi(ranks);
        const uint64_t *a = sig + 3 * i, *b = sig + (size_t)r1 * k * 3 + 3 * i;
        bool isp = i < d->np;
        size_t idx = isp ? i : i - d->np;
        const char *name = isp ? d->params[idx].name : d->buffers[idx].name;
        char detail[200];
        if (a[0] != b[0] || a[1] != b[1])
            snprintf(detail, sizeof detail, "rank 0 has %s[%" PRIu64 "], rank %d has %s[%" PRIu64 "]",
                     dt_name(a[1]), a[0], r1, dt_name(b[1]), b[0]);
        else
            snprintf(detail, sizeof detail, "its name differs (rank 0 vs rank %d)", r1);
        tdist_status_t e = tdist__ddp_error(
            d, TDIST_ERR_MISMATCH, op,
            "%s %zu ('%s' on this rank) differs across ranks: %s (ranks differing from rank 0: %s)",
            isp ? "parameter" : "buffer", idx, name, detail, ranks);
        free(sig);
        return e;
    }
    free(sig);
    return TDIST_OK;
}

/* Compare every rank's shapes and options with rank 0's. Two all_gathers:
 * a header (counts, options), then, if the counts agree everywhere, one
 * (count, dtype, name hash) triple per parameter and buffer. Every rank
 * sees the same gathered data, so every rank fails alike. */
static tdist_status_t check_shapes(tdist_ddp_t *d)
{
    TDIST_CHECK(check_counts(d));
    return check_tensors(d);
}

static tdist_status_t bcast_group(tdist_ddp_t *d, int root, const char *op, bool params,
                                  bool buffers)
{
    size_t k = (params ? d->np : 0) + (buffers ? d->nbuf : 0);
    if (k == 0 || d->size == 1) return TDIST_OK;
    void **bufs = malloc(k * sizeof *bufs);
    size_t *counts = malloc(k * sizeof *counts);
    if (!bufs || !counts) {
        free(bufs);
        free(counts);
        return tdist__ddp_error(d, TDIST_ERR_NO_MEMORY, op, "out of memory");
    }
    tdist_status_t st = TDIST_OK;
    for (int dt = 0; dt < TDIST_DTYPE_COUNT && st == TDIST_OK; dt++) {
        size_t c = 0;
        if (params)
            for (size_t i = 0; i < d->np; i++)
                if ((int)d->params[i].dtype == dt) {
                    bufs[c] = d->params[i].data;
                    counts[c++] = d->params[i].count;
                }
        if (buffers)
            for (size_t i = 0; i < d->nbuf; i++)
                if ((int)d->buffers[i].dtype == dt) {
                    bufs[c] = d->buffers[i].data;
                    counts[c++] = d->buffers[i].count;
                }
        if (c == 0) continue;
        st = tdist_broadcast_coalesced(d->pg, bufs, counts, c, (tdist_dtype_t)dt, root, NULL, NULL);
        if (st != TDIST_OK)
            st = tdist__error_context(st, "tdist_ddp_%s: rank %d group %s iteration %" PRIu64
                                          ": broadcast of %s %s from rank %d",
                                      op, d->rank, tdist_pg_name(d->pg), d->iteration,
                                      tdist_dtype_name((tdist_dtype_t)dt),
                                      params && buffers ? "parameters and buffers" : "buffers", root);
    }
    free(bufs);
    free(counts);
    return st;
}

tdist_status_t tdist__ddp_sync_module(tdist_ddp_t *ddp, int root, const char *op)
{
    return bcast_group(ddp, root, op, true, true);
}

tdist_status_t tdist__ddp_sync_buffers(tdist_ddp_t *ddp, int root, const char *op)
{
    return bcast_group(ddp, root, op, false, true);
}

/* The parameters' arguments: f32 or f64, non-NULL data and grad, count > 0. */
static tdist_status_t check_params(const tdist_ddp_param_t *params, size_t n, const char *op)
{
    for (size_t i = 0; i < n; i++) {
        const tdist_ddp_param_t *p = &params[i];
        const char *nm = p->name ? p->name : "(unnamed)";
        if (!p->data || !p->grad)
            return tdist__ddp_error(NULL, TDIST_ERR_INVALID_ARG, op,
                                    "parameter %zu '%s': %s pointer is NULL", i, nm,
                                    p->data ? "grad" : "data");
        if (p->count == 0)
            return tdist__ddp_error(NULL, TDIST_ERR_INVALID_ARG, op,
                                    "parameter %zu '%s' has count 0", i, nm);
        if (p->dtype != TDIST_F32 && p->dtype != TDIST_F64)
            return tdist__ddp_error(NULL, TDIST_ERR_NOT_SUPPORTED, op,
                                    "parameter %zu '%s' has dtype %s: the reducer averages f32 and "
                                    "f64 gradients only",
                                    i, nm, tdist_dtype_name(p->dtype));
        if (p->count > SIZE_MAX / 8)
            return tdist__ddp_error(NULL, TDIST_ERR_INVALID_ARG, op,
                                    "parameter %zu '%s': count %zu overflows", i, nm, p->count);
    }
    return TDIST_OK;
}

/* The buffers' arguments: a valid dtype, non-NULL data, count > 0. */
static tdist_status_t check_buffers(const tdist_ddp_buffer_t *buffers, size_t m, const char *op)
{
    for (size_t i = 0; i < m; i++) {
        const tdist_ddp_buffer_t *b = &buffers[i];
        const char *nm = b->name ? b->name : "(unnamed)";
        if ((int)b->dtype < 0 || b->dtype >= TDIST_DTYPE_COUNT)
            return tdist__ddp_error(NULL, TDIST_ERR_INVALID_ARG, op,
                                    "buffer %zu '%s' has an invalid dtype %d", i, nm, (int)b->dtype);
        if (!b->data || b->count == 0)
            return tdist__ddp_error(NULL, TDIST_ERR_INVALID_ARG, op,
                                    "buffer %zu '%s': data is NULL or count is 0", i, nm);
    }
    return TDIST_OK;
}

/* A reducer for n parameters and m buffers with its per-parameter arrays,
 * the model not yet copied in. */
static tdist_status_t alloc_ddp(tdist_pg_t *pg, int rank, int size, const tdist_ddp_opts_t *o,
                                size_t n, size_t m, const char *op, tdist_ddp_t **out)
{
    tdist_ddp_t *d = calloc(1, sizeof *d);
    if (!d) return tdist__ddp_error(NULL, TDIST_ERR_NO_MEMORY, op, "out of memory");
    d->pg = pg;
    d->rank = rank;
    d->size = size;
    d->opts = *o;
    d->np = n;
    d->nbuf = m;
    d->divisor = size;
    size_t n1 = n ? n : 1;
    d->params = calloc(n1, sizeof *d->params);
    d->buffers = calloc(m ? m : 1, sizeof *d->buffers);
    d->ready = calloc(n1, 1);
    d->used_since_sync = calloc(n1, 1);
    d->used_map = calloc(n1, 1);
    d->static_local = calloc(n1, 1);
    d->order = calloc(n1, sizeof *d->order);
    d->direct_bufs = calloc(n1, sizeof *d->direct_bufs);
    d->direct_counts = calloc(n1, sizeof *d->direct_counts);
    if (!d->params || !d->buffers || !d->ready || !d->used_since_sync || !d->used_map ||
        !d->order || !d->static_local || !d->direct_bufs || !d->direct_counts) {
        free_ddp(d);
        return tdist__ddp_error(NULL, TDIST_ERR_NO_MEMORY, op, "out of memory");
    }
    *out = d;
    return TDIST_OK;
}

/* The reducer's own copy of the parameter and buffer descriptions (the
 * names duplicated; unnamed ones become "param<i>", "buffer<i>"). */
static tdist_status_t copy_model(tdist_ddp_t *d, const tdist_ddp_param_t *params,
                                 const tdist_ddp_buffer_t *buffers, const char *op)
{
    for (size_t i = 0; i < d->np; i++) {
        ddp_param_t *p = &d->params[i];
        p->data = params[i].data;
        p->grad = params[i].grad;
        p->count = params[i].count;
        p->dtype = params[i].dtype;
        p->bytes = p->count * tdist_dtype_size(p->dtype);
        p->name = params[i].name ? tdist__strdup(params[i].name) : tdist__asprintf("param%zu", i);
        if (!p->name) return tdist__ddp_error(NULL, TDIST_ERR_NO_MEMORY, op, "out of memory");
    }
    for (size_t i = 0; i < d->nbuf; i++) {
        ddp_buffer_t *b = &d->buffers[i];
        b->data = buffers[i].data;
        b->count = buffers[i].count;
        b->dtype = buffers[i].dtype;
        b->name = buffers[i].name ? tdist__strdup(buffers[i].name) : tdist__asprintf("buffer%zu", i);
        if (!b->name) return tdist__ddp_error(NULL, TDIST_ERR_NO_MEMORY, op, "out of memory");
    }
    return TDIST_OK;
}

tdist_status_t tdist_ddp_create(tdist_pg_t *pg, const tdist_ddp_param_t *params, size_t n,
                                const tdist_ddp_buffer_t *buffers, size_t m,
                                const tdist_ddp_opts_t *opts, tdist_ddp_t **out)
{
    const char *op = "create";
    if (!out) return tdist__ddp_error(NULL, TDIST_ERR_INVALID_ARG, op, "out is NULL");
    if (!pg) return tdist__ddp_error(NULL, TDIST_ERR_INVALID_ARG, op, "pg is NULL");
    if (n > 0 && !params) return tdist__ddp_error(NULL, TDIST_ERR_INVALID_ARG, op, "params is NULL with n = %zu", n);
    if (m > 0 && !buffers) return tdist__ddp_error(NULL, TDIST_ERR_INVALID_ARG, op, "buffers is NULL with m = %zu", m);
    if (n > INT32_MAX) return tdist__ddp_error(NULL, TDIST_ERR_INVALID_ARG, op, "too many parameters (%zu)", n);
    tdist_ddp_opts_t o;
    if (opts) o = *opts;
    else tdist_ddp_opts_init(&o);
    if ((int)o.overlap < (int)TDIST_DDP_OVERLAP_ON || (int)o.overlap > (int)TDIST_DDP_OVERLAP_AUTO)
        return tdist__ddp_error(NULL, TDIST_ERR_INVALID_ARG, op,
                                "opts.overlap is %d: expected TDIST_DDP_OVERLAP_ON, _OFF, _INLINE "
                                "or _AUTO",
                                (int)o.overlap);
    if (o.bucket_cap_bytes == 0 || o.first_bucket_bytes == 0)
        return tdist__ddp_error(NULL, TDIST_ERR_INVALID_ARG, op,
                                "bucket_cap_bytes and first_bucket_bytes must be > 0 (got %zu, %zu)",
                                o.bucket_cap_bytes, o.first_bucket_bytes);
    TDIST_CHECK(check_params(params, n, op));
    TDIST_CHECK(check_buffers(buffers, m, op));
    int rank = tdist_pg_rank(pg), size = tdist_pg_size(pg);
    if (rank < 0 || size < 1) return tdist__ddp_error(NULL, TDIST_ERR_INVALID_ARG, op, "invalid pg");

    tdist_ddp_t *d = NULL;
    TDIST_CHECK(alloc_ddp(pg, rank, size, &o, n, m, op, &d));
    d->sched = o.overlap;
    if (d->sched == TDIST_DDP_OVERLAP_AUTO)
        d->sched = tdist_pg_shared_memory(pg) && !spare_cpu() ? TDIST_DDP_OVERLAP_INLINE
                                                               : TDIST_DDP_OVERLAP_ON;
    tdist_status_t st = TDIST_OK;
    TDIST_CHECK_GOTO(copy_model(d, params, buffers, op), st, fail);
    TDIST_CHECK_GOTO(check_shapes(d), st, fail);
    if (o.sync_at_create) TDIST_CHECK_GOTO(tdist__ddp_sync_module(d, 0, op), st, fail);

    /* initial buckets: reverse parameter order */
    for (size_t k = 0; k < n; k++) d->order[k] = (int32_t)(n - 1 - k);
    bool changed;
    TDIST_CHECK_GOTO(tdist__ddp_build_buckets(d, d->order, &changed), st, fail);
    d->stats.num_buckets = d->nb;
    *out = d;
    return TDIST_OK;
fail:
    free_ddp(d);
    return st;
}

void tdist_ddp_destroy(tdist_ddp_t *ddp)
{
    if (!ddp) return;
    /* an abandoned iteration: its reductions still write the arena */
    for (size_t b = 0; b < ddp->nb; b++) {
        if (ddp->buckets[b].res.work) {
            (void)tdist_work_wait(ddp->buckets[b].res.work, -1);
            tdist_work_free(ddp->buckets[b].res.work);
            ddp->buckets[b].res.work = NULL;
        }
    }
    free_ddp(ddp);
}

void *tdist_ddp_grad_ptr(const tdist_ddp_t *ddp, size_t i)
{
    if (!ddp || i >= ddp->np) return NULL;
    if (ddp->opts.gradient_as_bucket_view) return tdist__ddp_slot(ddp, i);
    return ddp->params[i].grad;
}

tdist_status_t tdist_ddp_register_comm_hook(tdist_ddp_t *ddp, void *state, tdist_ddp_comm_hook_fn fn)
{
    return tdist_ddp_register_comm_hook_flags(ddp, state, fn, 0);
}

tdist_status_t tdist_ddp_register_comm_hook_flags(tdist_ddp_t *ddp, void *state,
                                                  tdist_ddp_comm_hook_fn fn, unsigned flags)
{
    const char *op = "register_comm_hook";
    if (!ddp) return tdist__ddp_error(NULL, TDIST_ERR_INVALID_ARG, op, "ddp is NULL");
    if (!fn) return tdist__ddp_error(ddp, TDIST_ERR_INVALID_ARG, op, "fn is NULL");
    if (flags & ~(unsigned)TDIST_DDP_HOOK_GRADS)
        return tdist__ddp_error(ddp, TDIST_ERR_INVALID_ARG, op,
                                "unknown flags 0x%x (known: TDIST_DDP_HOOK_GRADS)",
                                flags & ~(unsigned)TDIST_DDP_HOOK_GRADS);
    if (ddp->hook)
        return tdist__ddp_error(ddp, TDIST_ERR_INVALID_ARG, op,
                                "a comm hook is already registered (a hook is registered once)");
    if (ddp->started)
        return tdist__ddp_error(ddp, TDIST_ERR_INVALID_ARG, op,
                                "training has started (forward_begin was called): register the "
                                "comm hook before the first iteration");
    ddp->hook = fn;
    ddp->hook_state = state;
    ddp->hook_flags = flags;
    return TDIST_OK;
}

tdist_status_t tdist_ddp_set_no_sync(tdist_ddp_t *ddp, bool no_sync)
{
    if (!ddp) return tdist__ddp_error(NULL, TDIST_ERR_INVALID_ARG, "set_no_sync", "ddp is NULL");
    if (ddp->in_iter)
        return tdist__ddp_error(ddp, TDIST_ERR_INVALID_ARG, "set_no_sync",
                                "called inside an iteration (after forward_begin, before "
                                "backward_end): set it between iterations");
    ddp->want_no_sync = no_sync;
    return TDIST_OK;
}

tdist_status_t tdist_ddp_get_stats(const tdist_ddp_t *ddp, tdist_ddp_stats_t *stats)
{
    if (!ddp || !stats)
        return tdist__ddp_error(ddp, TDIST_ERR_INVALID_ARG, "get_stats", "%s is NULL",
                                ddp ? "stats" : "ddp");
    *stats = ddp->stats;
    stats->num_buckets = ddp->nb;
    stats->overlap = ddp->sched;
    stats->overlap_fraction = 0;
    if (stats->total_comm_ms > 0) {
        double f = 1.0 - stats->total_wait_ms / stats->total_comm_ms;
        stats->overlap_fraction = f < 0 ? 0 : f > 1 ? 1 : f;
    }
    return TDIST_OK;
}

size_t tdist_ddp_num_buckets(const tdist_ddp_t *ddp) { return ddp ? ddp->nb : 0; }

static double since_fwd_ms(const tdist_ddp_t *ddp, uint64_t t)
{
    return t > ddp->t_fwd_ns ? (double)(t - ddp->t_fwd_ns) / 1e6 : 0.0;
}

tdist_status_t tdist_ddp_bucket_timeline(const tdist_ddp_t *ddp, size_t b,
                                         tdist_ddp_bucket_timeline_t *out)
{
    const char *op = "bucket_timeline";
    if (!ddp || !out)
        return tdist__ddp_error(ddp, TDIST_ERR_INVALID_ARG, op, "%s is NULL", ddp ? "out" : "ddp");
    if (b >= ddp->nb)
        return tdist__ddp_error(ddp, TDIST_ERR_INVALID_ARG, op,
                                "bucket %zu out of range (%zu buckets)", b, ddp->nb);
    const ddp_bucket_t *bk = &ddp->buckets[b];
    out->ready_ms = since_fwd_ms(ddp, bk->ready_ns);
    out->launch_ms = since_fwd_ms(ddp, bk->launch_ns);
    out->done_ms = since_fwd_ms(ddp, atomic_load(&((ddp_bucket_t *)bk)->done_ns));
    return TDIST_OK;
}

size_t tdist_ddp_bucket_params(const tdist_ddp_t *ddp, size_t b, size_t *out, size_t cap)
{
    if (!ddp || b >= ddp->nb) return 0;
    const ddp_bucket_t *bk = &ddp->buckets[b];
    for (size_t j = 0; j < bk->nparams && j < cap && out; j++) out[j] = bk->params[j];
    return bk->nparams;
}

/* ------------------------------------------------------------ Join knobs */

void tdist__ddp_set_forward_hook(tdist_ddp_t *ddp, tdist__ddp_forward_hook_fn fn, void *arg)
{
    ddp->fwd_hook = fn;
    ddp->fwd_hook_arg = arg;
}

void tdist__ddp_set_divisor(tdist_ddp_t *ddp, int64_t divisor)
{
    if (divisor > 0) ddp->divisor = divisor;
}

void tdist__ddp_set_roots(tdist_ddp_t *ddp, int buffer_root, int rebuild_root)
{
    if (buffer_root >= 0 && buffer_root < ddp->size) ddp->buffer_root = buffer_root;
    if (rebuild_root >= 0 && rebuild_root < ddp->size) ddp->rebuild_root = rebuild_root;
}

bool tdist__ddp_sync_enabled(const tdist_ddp_t *ddp) { return !ddp->want_no_sync; }
