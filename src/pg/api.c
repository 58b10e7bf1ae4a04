/*
 * pg/api.c — the public collective entry points.
 *
 * Each checks its arguments on the caller's thread (TDIST_ERR_INVALID_ARG
 * naming the call, before anything is sent and without creating a work),
 * copies what the engine needs later (count arrays, coalesced buffer
 * lists), and submits the work to the group's engine (engine.c) or, for
 * send/recv, to the p2p path (p2p.c).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pg/internal.h"

#define ARG_ERR(fn, pg, ...) arg_err((fn), (pg), __VA_ARGS__)

static tdist_status_t arg_err(const char *fn, const tdist_pg_t *pg, const char *fmt, ...)
    TDIST_PRINTF(3, 4);

#include <stdarg.h>

static tdist_status_t arg_err(const char *fn, const tdist_pg_t *pg, const char *fmt, ...)
{
    char m[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    if (pg)
        return tdist__error(TDIST_ERR_INVALID_ARG, "%s: rank %d group %s: %s", fn, pg->rank,
                            pg->name, m);
    return tdist__error(TDIST_ERR_INVALID_ARG, "%s: %s", fn, m);
}

static tdist_status_t chk_common(const char *fn, const tdist_pg_t *pg, const tdist_coll_opts_t *o)
{
    if (!pg) return arg_err(fn, NULL, "pg is NULL");
    if (o && !isfinite(o->premul_factor))
        return arg_err(fn, pg, "opts.premul_factor is not finite");
    return TDIST_OK;
}

static tdist_status_t chk_dtype(const char *fn, const tdist_pg_t *pg, tdist_dtype_t dt)
{
    if ((int)dt < 0 || dt >= TDIST_DTYPE_COUNT)
        return arg_err(fn, pg, "invalid dtype %d", (int)dt);
    return TDIST_OK;
}

/* count * mult elements of dt must fit in size_t bytes. */
static tdist_status_t chk_size(const char *fn, const tdist_pg_t *pg, size_t count, size_t mult,
                               tdist_dtype_t dt, const char *what)
{
    size_t es = tdist_dtype_size(dt), bytes;
    /* count * mult * es overflows: the same test as count > SIZE_MAX /
     * mult / es, without two divisions on every collective's path */
    if (mult && (__builtin_mul_overflow(count, mult, &bytes) ||
                 __builtin_mul_overflow(bytes, es, &bytes)))
        return arg_err(fn, pg, "%s: %zu x %zu elements of %s overflow size_t", what, count, mult,
                       tdist_dtype_name(dt));
    return TDIST_OK;
}

static tdist_status_t chk_redop(const char *fn, const tdist_pg_t *pg, tdist_redop_t op,
                                tdist_dtype_t dt)
{
    if ((int)op < 0 || op >= TDIST_REDOP_COUNT) return arg_err(fn, pg, "invalid reduce op %d", (int)op);
    if (op == TDIST_PREMUL_SUM && !tdist_dtype_is_float(dt))
        return arg_err(fn, pg, "premul_sum needs a floating dtype, not %s", tdist_dtype_name(dt));
    tdist_status_t st = tdist_redop_check(op, dt);
    if (st != TDIST_OK) {
        char cause[300];
        snprintf(cause, sizeof cause, "%s", tdist_last_error());
        return arg_err(fn, pg, "%s", cause);
    }
    return TDIST_OK;
}

static tdist_status_t chk_root(const char *fn, const tdist_pg_t *pg, int root)
{
    if (root < 0 || root >= pg->size)
        return arg_err(fn, pg, "root %d is out of range [0, %d)", root, pg->size);
    return TDIST_OK;
}

static tdist_status_t chk_buf(const char *fn, const tdist_pg_t *pg, const void *p, size_t count,
                              const char *name)
{
    if (!p && count > 0) return arg_err(fn, pg, "%s is NULL with %zu elements", name, count);
    return TDIST_OK;
}

/* Whether a reduction's arguments are surely valid, in a few tests
 * (anything else goes through the checks above, which name what is
 * wrong): a group, no options or finite ones, a float dtype with an
 * arithmetic op (no bitwise one), buffers, a count whose bytes fit. */
static inline bool plain_reduce_args(const tdist_pg_t *pg, const tdist_coll_opts_t *o,
                                     const void *sendbuf, const void *recvbuf, size_t count,
                                     tdist_dtype_t dt, tdist_redop_t op)
{
    return pg && (!o || isfinite(o->premul_factor)) && sendbuf && recvbuf &&
           count <= SIZE_MAX / 16 && (dt == TDIST_F32 || dt == TDIST_F64) &&
           (unsigned)op < TDIST_REDOP_COUNT && op != TDIST_BAND && op != TDIST_BOR &&
           op != TDIST_BXOR;
}

static tdist_status_t no_mem(const char *fn) { return tdist__error(TDIST_ERR_NO_MEMORY, "%s: out of memory", fn); }

/* w over (sendbuf, recvbuf, count, dtype), or NULL if w is. */
static struct tdist_work *fill_work(struct tdist_work *w, const void *sendbuf, void *recvbuf,
                                    size_t count, tdist_dtype_t dtype)
{
    if (!w) return NULL;
    w->sendbuf = sendbuf;
    w->recvbuf = recvbuf;
    w->count = count;
    w->dtype = dtype;
    return w;
}

/* A new work for op over (sendbuf, recvbuf, count, dtype); NULL when out
 * of memory. */
static struct tdist_work *new_work(tdist__op_t op, const tdist_coll_opts_t *opts,
                                   const void *sendbuf, void *recvbuf, size_t count,
                                   tdist_dtype_t dtype)
{
    return fill_work(tdist__work_new(op, opts), sendbuf, recvbuf, count, dtype);
}

/* The same on the caller's stack (sw) for a blocking call without a
 * callback (tdist__work_on_stack), for ops whose work owns no arrays. */
static struct tdist_work *stack_work(struct tdist_work *sw, tdist__op_t op,
                                     const tdist_coll_opts_t *opts, tdist_work_t **work,
                                     const void *sendbuf, void *recvbuf, size_t count,
                                     tdist_dtype_t dtype)
{
    return fill_work(tdist__work_on_stack(sw, op, opts, work), sendbuf, recvbuf, count, dtype);
}

/* Copy a size-entry count vector, checking it; *total = its sum. */
static tdist_status_t copy_counts(const char *fn, const tdist_pg_t *pg, const size_t *c,
                                  const char *name, tdist_dtype_t dt, size_t **out, size_t *total)
{
    if (!c) return arg_err(fn, pg, "%s is NULL", name);
    size_t t = 0, es = tdist_dtype_size(dt);
    for (int r = 0; r < pg->size; r++) {
        if (c[r] > SIZE_MAX / es || t > SIZE_MAX / es - c[r])
            return arg_err(fn, pg, "%s: the total overflows size_t bytes at entry %d", name, r);
        t += c[r];
    }
    size_t *copy = malloc((size_t)pg->size * sizeof *copy);
    if (!copy) return no_mem(fn);
    memcpy(copy, c, (size_t)pg->size * sizeof *copy);
    *out = copy;
    *total = t;
    return TDIST_OK;
}

static tdist_status_t reject(struct tdist_work *w, tdist_status_t st)
{
    atomic_store(&w->refs, 1);
    tdist__work_release(w);
    return st;
}

static size_t *fill_counts(size_t n, size_t v)
{
    size_t *c = malloc((n ? n : 1) * sizeof *c);
    if (c)
        for (size_t i = 0; i < n; i++) c[i] = v;
    return c;
}

/* ------------------------------------------------------------- collectives */

tdist_status_t tdist_broadcast(tdist_pg_t *pg, void *buf, size_t count, tdist_dtype_t dtype,
                               int root, const tdist_coll_opts_t *opts, tdist_work_t **work)
{
    static const char *fn = "tdist_broadcast";
    TDIST_CHECK(chk_common(fn, pg, opts));
    TDIST_CHECK(chk_dtype(fn, pg, dtype));
    TDIST_CHECK(chk_root(fn, pg, root));
    TDIST_CHECK(chk_size(fn, pg, count, 1, dtype, "buf"));
    TDIST_CHECK(chk_buf(fn, pg, buf, count, "buf"));
    struct tdist_work sw, *w = tdist__work_on_stack(&sw, TDIST__OP_BROADCAST, opts, work);
    if (!w) return no_mem(fn);
    w->recvbuf = buf;
    w->sendbuf = buf;
    w->count = count;
    w->dtype = dtype;
    w->root = root;
    return tdist__pg_submit(pg, w, work);
}

tdist_status_t tdist_all_reduce(tdist_pg_t *pg, const void *sendbuf, void *recvbuf, size_t count,
                                tdist_dtype_t dtype, tdist_redop_t op,
                                const tdist_coll_opts_t *opts, tdist_work_t **work)
{
    static const char *fn = "tdist_all_reduce";
    if (__builtin_expect(!plain_reduce_args(pg, opts, sendbuf, recvbuf, count, dtype, op), 0)) {
        TDIST_CHECK(chk_common(fn, pg, opts));
        TDIST_CHECK(chk_dtype(fn, pg, dtype));
        TDIST_CHECK(chk_redop(fn, pg, op, dtype));
        TDIST_CHECK(chk_size(fn, pg, count, 1, dtype, "buffers"));
        TDIST_CHECK(chk_buf(fn, pg, sendbuf, count, "sendbuf"));
        TDIST_CHECK(chk_buf(fn, pg, recvbuf, count, "recvbuf"));
    }
    struct tdist_work sw, *w = tdist__work_on_stack(&sw, TDIST__OP_ALL_REDUCE, opts, work);
    if (!w) return no_mem(fn);
    w->sendbuf = sendbuf;
    w->recvbuf = recvbuf;
    w->count = count;
    w->dtype = dtype;
    w->redop = op;
    return tdist__pg_submit(pg, w, work);
}

tdist_status_t tdist_reduce_to(tdist_pg_t *pg, const void *sendbuf, void *recvbuf, size_t count,
                            tdist_dtype_t dtype, tdist_redop_t op, int root,
                            const tdist_coll_opts_t *opts, tdist_work_t **work)
{
    static const char *fn = "tdist_reduce_to";
    TDIST_CHECK(chk_common(fn, pg, opts));
    TDIST_CHECK(chk_dtype(fn, pg, dtype));
    TDIST_CHECK(chk_redop(fn, pg, op, dtype));
    TDIST_CHECK(chk_root(fn, pg, root));
    TDIST_CHECK(chk_size(fn, pg, count, 1, dtype, "buffers"));
    TDIST_CHECK(chk_buf(fn, pg, sendbuf, count, "sendbuf"));
    if (pg->rank == root) TDIST_CHECK(chk_buf(fn, pg, recvbuf, count, "recvbuf (on the root)"));
    struct tdist_work sw,
        *w = stack_work(&sw, TDIST__OP_REDUCE, opts, work, sendbuf, recvbuf, count, dtype);
    if (!w) return no_mem(fn);
    w->redop = op;
    w->root = root;
    return tdist__pg_submit(pg, w, work);
}

tdist_status_t tdist_all_gather(tdist_pg_t *pg, const void *sendbuf, void *recvbuf, size_t count,
                                tdist_dtype_t dtype, const tdist_coll_opts_t *opts,
                                tdist_work_t **work)
{
    static const char *fn = "tdist_all_gather";
    TDIST_CHECK(chk_common(fn, pg, opts));
    TDIST_CHECK(chk_dtype(fn, pg, dtype));
    TDIST_CHECK(chk_size(fn, pg, count, (size_t)pg->size, dtype, "recvbuf"));
    TDIST_CHECK(chk_buf(fn, pg, sendbuf, count, "sendbuf"));
    TDIST_CHECK(chk_buf(fn, pg, recvbuf, count, "recvbuf"));
    /* coll/ makes the count vector itself when it needs one; a backend's
     * slot gets it here */
    if (!pg->backend) {
        struct tdist_work sw, *sk = stack_work(&sw, TDIST__OP_ALL_GATHER, opts, work, sendbuf,
                                               recvbuf, count, dtype);
        return sk ? tdist__pg_submit(pg, sk, work) : no_mem(fn);
    }
    struct tdist_work *w = new_work(TDIST__OP_ALL_GATHER, opts, sendbuf, recvbuf, count, dtype);
    if (!w) return no_mem(fn);
    w->recvcounts = fill_counts((size_t)pg->size, count);
    if (!w->recvcounts) return reject(w, no_mem(fn));
    return tdist__pg_submit(pg, w, work);
}


tdist_status_t tdist_all_gatherv(tdist_pg_t *pg, const void *sendbuf, void *recvbuf,
                                 const size_t *recvcounts, tdist_dtype_t dtype,
                                 const tdist_coll_opts_t *opts, tdist_work_t **work)
{
    static const char *fn = "tdist_all_gatherv";
    TDIST_CHECK(chk_common(fn, pg, opts));
    TDIST_CHECK(chk_dtype(fn, pg, dtype));
    struct tdist_work *w = tdist__work_new(TDIST__OP_ALL_GATHERV, opts);
    if (!w) return no_mem(fn);
    size_t total = 0;
    tdist_status_t st = copy_counts(fn, pg, recvcounts, "recvcounts", dtype, &w->recvcounts, &total);
    if (st != TDIST_OK) return reject(w, st);
    if ((st = chk_buf(fn, pg, sendbuf, w->recvcounts[pg->rank], "sendbuf")) != TDIST_OK ||
        (st = chk_buf(fn, pg, recvbuf, total, "recvbuf")) != TDIST_OK)
        return reject(w, st);
    w->sendbuf = sendbuf;
    w->recvbuf = recvbuf;
    w->count = total;
    w->dtype = dtype;
    return tdist__pg_submit(pg, w, work);
}

tdist_status_t tdist_gather(tdist_pg_t *pg, const void *sendbuf, void *recvbuf, size_t count,
                            tdist_dtype_t dtype, int root, const tdist_coll_opts_t *opts,
                            tdist_work_t **work)
{
    static const char *fn = "tdist_gather";
    TDIST_CHECK(chk_common(fn, pg, opts));
    TDIST_CHECK(chk_dtype(fn, pg, dtype));
    TDIST_CHECK(chk_root(fn, pg, root));
    TDIST_CHECK(chk_size(fn, pg, count, (size_t)pg->size, dtype, "recvbuf"));
    TDIST_CHECK(chk_buf(fn, pg, sendbuf, count, "sendbuf"));
    if (pg->rank == root) TDIST_CHECK(chk_buf(fn, pg, recvbuf, count, "recvbuf (on the root)"));
    struct tdist_work sw,
        *w = stack_work(&sw, TDIST__OP_GATHER, opts, work, sendbuf, recvbuf, count, dtype);
    if (!w) return no_mem(fn);
    w->root = root;
    return tdist__pg_submit(pg, w, work);
}

tdist_status_t tdist_scatter(tdist_pg_t *pg, const void *sendbuf, void *recvbuf, size_t count,
                             tdist_dtype_t dtype, int root, const tdist_coll_opts_t *opts,
                             tdist_work_t **work)
{
    static const char *fn = "tdist_scatter";
    TDIST_CHECK(chk_common(fn, pg, opts));
    TDIST_CHECK(chk_dtype(fn, pg, dtype));
    TDIST_CHECK(chk_root(fn, pg, root));
    TDIST_CHECK(chk_size(fn, pg, count, (size_t)pg->size, dtype, "sendbuf"));
    if (pg->rank == root) TDIST_CHECK(chk_buf(fn, pg, sendbuf, count, "sendbuf (on the root)"));
    TDIST_CHECK(chk_buf(fn, pg, recvbuf, count, "recvbuf"));
    struct tdist_work sw,
        *w = stack_work(&sw, TDIST__OP_SCATTER, opts, work, sendbuf, recvbuf, count, dtype);
    if (!w) return no_mem(fn);
    w->root = root;
    return tdist__pg_submit(pg, w, work);
}

tdist_status_t tdist_reduce_scatter(tdist_pg_t *pg, const void *sendbuf, void *recvbuf,
                                    size_t recvcount, tdist_dtype_t dtype, tdist_redop_t op,
                                    const tdist_coll_opts_t *opts, tdist_work_t **work)
{
    static const char *fn = "tdist_reduce_scatter";
    TDIST_CHECK(chk_common(fn, pg, opts));
    TDIST_CHECK(chk_dtype(fn, pg, dtype));
    TDIST_CHECK(chk_redop(fn, pg, op, dtype));
    TDIST_CHECK(chk_size(fn, pg, recvcount, (size_t)pg->size, dtype, "sendbuf"));
    TDIST_CHECK(chk_buf(fn, pg, sendbuf, recvcount, "sendbuf"));
    TDIST_CHECK(chk_buf(fn, pg, recvbuf, recvcount, "recvbuf"));
    struct tdist_work sw,
        *w = stack_work(&sw, TDIST__OP_REDUCE_SCATTER, opts, work, sendbuf, recvbuf, recvcount, dtype);
    if (!w) return no_mem(fn);
    w->redop = op;
    return tdist__pg_submit(pg, w, work);
}

tdist_status_t tdist_all_to_all(tdist_pg_t *pg, const void *sendbuf, void *recvbuf, size_t count,
                                tdist_dtype_t dtype, const tdist_coll_opts_t *opts,
                                tdist_work_t **work)
{
    static const char *fn = "tdist_all_to_all";
    TDIST_CHECK(chk_common(fn, pg, opts));
    TDIST_CHECK(chk_dtype(fn, pg, dtype));
    TDIST_CHECK(chk_size(fn, pg, count, (size_t)pg->size, dtype, "buffers"));
    TDIST_CHECK(chk_buf(fn, pg, sendbuf, count, "sendbuf"));
    TDIST_CHECK(chk_buf(fn, pg, recvbuf, count, "recvbuf"));
    if (!pg->backend) { /* as all_gather */
        struct tdist_work sw, *sk = stack_work(&sw, TDIST__OP_ALL_TO_ALL, opts, work, sendbuf,
                                               recvbuf, count, dtype);
        return sk ? tdist__pg_submit(pg, sk, work) : no_mem(fn);
    }
    struct tdist_work *w = new_work(TDIST__OP_ALL_TO_ALL, opts, sendbuf, recvbuf, count, dtype);
    if (!w) return no_mem(fn);
    w->sendcounts = fill_counts((size_t)pg->size, count);
    w->recvcounts = fill_counts((size_t)pg->size, count);
    if (!w->sendcounts || !w->recvcounts) return reject(w, no_mem(fn));
    return tdist__pg_submit(pg, w, work);
}

tdist_status_t tdist_all_to_allv(tdist_pg_t *pg, const void *sendbuf, const size_t *sendcounts,
                                 void *recvbuf, const size_t *recvcounts, tdist_dtype_t dtype,
                                 const tdist_coll_opts_t *opts, tdist_work_t **work)
{
    static const char *fn = "tdist_all_to_allv";
    TDIST_CHECK(chk_common(fn, pg, opts));
    TDIST_CHECK(chk_dtype(fn, pg, dtype));
    struct tdist_work *w = tdist__work_new(TDIST__OP_ALL_TO_ALLV, opts);
    if (!w) return no_mem(fn);
    size_t stot = 0, rtot = 0;
    tdist_status_t st;
    if ((st = copy_counts(fn, pg, sendcounts, "sendcounts", dtype, &w->sendcounts, &stot)) != TDIST_OK ||
        (st = copy_counts(fn, pg, recvcounts, "recvcounts", dtype, &w->recvcounts, &rtot)) != TDIST_OK ||
        (st = chk_buf(fn, pg, sendbuf, stot, "sendbuf")) != TDIST_OK ||
        (st = chk_buf(fn, pg, recvbuf, rtot, "recvbuf")) != TDIST_OK)
        return reject(w, st);
    if (sendbuf && sendbuf == recvbuf && stot != rtot)
        return reject(w, arg_err(fn, pg,
                                 "in place (sendbuf == recvbuf) needs equal totals, got %zu sent "
                                 "and %zu received",
                                 stot, rtot));
    w->sendbuf = sendbuf;
    w->recvbuf = recvbuf;
    w->dtype = dtype;
    return tdist__pg_submit(pg, w, work);
}

tdist_status_t tdist_barrier(tdist_pg_t *pg, const tdist_coll_opts_t *opts, tdist_work_t **work)
{
    static const char *fn = "tdist_barrier";
    TDIST_CHECK(chk_common(fn, pg, opts));
    struct tdist_work sw, *w = tdist__work_on_stack(&sw, TDIST__OP_BARRIER, opts, work);
    if (!w) return no_mem(fn);
    return tdist__pg_submit(pg, w, work);
}

tdist_status_t tdist_monitored_barrier(tdist_pg_t *pg, const tdist_coll_opts_t *opts)
{
    static const char *fn = "tdist_monitored_barrier";
    TDIST_CHECK(chk_common(fn, pg, opts));
    struct tdist_work *w = tdist__work_new(TDIST__OP_MONITORED_BARRIER, opts);
    if (!w) return no_mem(fn);
    return tdist__pg_submit(pg, w, NULL);
}

/* A list of n buffers (counts[i] elements of dtype each) checked; *total:
 * their elements in all. */
static tdist_status_t chk_list(const char *fn, const tdist_pg_t *pg, void *const *bufs,
                               const size_t *counts, size_t n, tdist_dtype_t dtype, size_t *total)
{
    if (n > 0 && (!bufs || !counts))
        return arg_err(fn, pg, "%s is NULL with n = %zu", !bufs ? "bufs" : "counts", n);
    if (n > (size_t)1 << 24) return arg_err(fn, pg, "n = %zu buffers is too many", n);
    *total = 0;
    for (size_t i = 0; i < n; i++) {
        char name[40];
        snprintf(name, sizeof name, "bufs[%zu]", i);
        TDIST_CHECK(chk_size(fn, pg, counts[i], 1, dtype, name));
        TDIST_CHECK(chk_buf(fn, pg, bufs[i], counts[i], name));
        if (__builtin_add_overflow(*total, counts[i], total))
            return arg_err(fn, pg, "the counts overflow size_t");
    }
    return TDIST_OK;
}

/* A work of op over copies of the list's arrays. */
static tdist_status_t list_work(const char *fn, tdist__op_t op, const tdist_coll_opts_t *opts,
                                void *const *bufs, const size_t *counts, size_t n,
                                struct tdist_work **out)
{
    struct tdist_work *w = tdist__work_new(op, opts);
    if (!w) return no_mem(fn);
    w->bufs = malloc((n ? n : 1) * sizeof *w->bufs);
    w->counts = malloc((n ? n : 1) * sizeof *w->counts);
    if (!w->bufs || !w->counts) return reject(w, no_mem(fn));
    for (size_t i = 0; i < n; i++) {
        w->bufs[i] = bufs[i];
        w->counts[i] = counts[i];
    }
    w->nbufs = n;
    *out = w;
    return TDIST_OK;
}

static tdist_status_t coalesced(const char *fn, tdist_pg_t *pg, tdist__op_t op, void *const *bufs,
                                const size_t *counts, size_t n, tdist_dtype_t dtype,
                                tdist_redop_t redop, int root, const tdist_coll_opts_t *opts,
                                tdist_work_t **work)
{
    TDIST_CHECK(chk_common(fn, pg, opts));
    TDIST_CHECK(chk_dtype(fn, pg, dtype));
    if (op == TDIST__OP_ALL_REDUCE_COALESCED) TDIST_CHECK(chk_redop(fn, pg, redop, dtype));
    if (op == TDIST__OP_BROADCAST_COALESCED) TDIST_CHECK(chk_root(fn, pg, root));
    size_t total;
    TDIST_CHECK(chk_list(fn, pg, bufs, counts, n, dtype, &total));
    struct tdist_work *w;
    TDIST_CHECK(list_work(fn, op, opts, bufs, counts, n, &w));
    w->dtype = dtype;
    w->redop = redop;
    w->root = root;
    return tdist__pg_submit(pg, w, work);
}

tdist_status_t tdist_all_reduce_coalesced(tdist_pg_t *pg, void *const *bufs, const size_t *counts,
                                          size_t n, tdist_dtype_t dtype, tdist_redop_t op,
                                          const tdist_coll_opts_t *opts, tdist_work_t **work)
{
    return coalesced("tdist_all_reduce_coalesced", pg, TDIST__OP_ALL_REDUCE_COALESCED, bufs,
                     counts, n, dtype, op, -1, opts, work);
}

tdist_status_t tdist_broadcast_coalesced(tdist_pg_t *pg, void *const *bufs, const size_t *counts,
                                         size_t n, tdist_dtype_t dtype, int root,
                                         const tdist_coll_opts_t *opts, tdist_work_t **work)
{
    return coalesced("tdist_broadcast_coalesced", pg, TDIST__OP_BROADCAST_COALESCED, bufs, counts,
                     n, dtype, TDIST_SUM, root, opts, work);
}

/* The all_reduce over a 16-bit wire (coll/all_reduce_wire.c): its work
 * carries the wire as its dtype, the flat vector's length as its count
 * (what the fingerprint compares) and the divisor as premul. */
tdist_status_t tdist_all_reduce_wire(tdist_pg_t *pg, void *const *bufs, const size_t *counts,
                                     size_t n, tdist_dtype_t wire, double divisor,
                                     const tdist_coll_opts_t *opts, tdist_work_t **work)
{
    static const char *fn = "tdist_all_reduce_wire";
    TDIST_CHECK(chk_common(fn, pg, opts));
    if (wire != TDIST_F16 && wire != TDIST_BF16)
        return arg_err(fn, pg, "the wire is %s; it must be f16 or bf16",
                       (int)wire >= 0 && wire < TDIST_DTYPE_COUNT ? tdist_dtype_name(wire) : "invalid");
    if (!(divisor > 0) || !isfinite(divisor) || !isfinite((float)divisor))
        return arg_err(fn, pg, "divisor %g: it must be finite and above 0", divisor);
    size_t total;
    TDIST_CHECK(chk_list(fn, pg, bufs, counts, n, TDIST_F32, &total));
    struct tdist_work *w;
    TDIST_CHECK(list_work(fn, TDIST__OP_ALL_REDUCE_WIRE, opts, bufs, counts, n, &w));
    w->count = total;
    w->dtype = wire;
    w->redop = TDIST_SUM;
    w->premul = divisor;
    return tdist__pg_submit(pg, w, work);
}

/* ------------------------------------------------------------------- p2p */

static tdist_status_t p2p(const char *fn, tdist_pg_t *pg, tdist__op_t op, const void *sbuf,
                          void *rbuf, size_t count, tdist_dtype_t dtype, int peer,
                          const tdist_coll_opts_t *opts, tdist_work_t **work)
{
    TDIST_CHECK(chk_common(fn, pg, opts));
    TDIST_CHECK(chk_dtype(fn, pg, dtype));
    if (peer < 0 || peer >= pg->size)
        return arg_err(fn, pg, "peer rank %d is out of range [0, %d)", peer, pg->size);
    if (peer == pg->rank) return arg_err(fn, pg, "peer rank %d is this rank", peer);
    TDIST_CHECK(chk_size(fn, pg, count, 1, dtype, "buf"));
    TDIST_CHECK(chk_buf(fn, pg, op == TDIST__OP_SEND ? sbuf : rbuf, count, "buf"));
    struct tdist_work *w = new_work(op, opts, sbuf, rbuf, count, dtype);
    if (!w) return no_mem(fn);
    w->root = peer;
    return tdist__p2p_submit(pg, w, work);
}

tdist_status_t tdist_send(tdist_pg_t *pg, const void *buf, size_t count, tdist_dtype_t dtype,
                          int dst, const tdist_coll_opts_t *opts, tdist_work_t **work)
{
    return p2p("tdist_send", pg, TDIST__OP_SEND, buf, NULL, count, dtype, dst, opts, work);
}

tdist_status_t tdist_recv(tdist_pg_t *pg, void *buf, size_t count, tdist_dtype_t dtype, int src,
                          const tdist_coll_opts_t *opts, tdist_work_t **work)
{
    return p2p("tdist_recv", pg, TDIST__OP_RECV, NULL, buf, count, dtype, src, opts, work);
}

/* ------------------------------------------------- multi-buffer forms */

/* The k buffers' common checks: a list of k >= 1 non-NULL buffers. */
static tdist_status_t chk_multi(const char *fn, const tdist_pg_t *pg, const void *const *bufs,
                                size_t k, size_t count, const char *name)
{
    if (!bufs || k == 0) return arg_err(fn, pg, "%s: an empty list (%zu buffers)", name, k);
    for (size_t i = 0; i < k; i++)
        if (!bufs[i] && count > 0)
            return arg_err(fn, pg, "%s[%zu] is NULL with %zu elements", name, i, count);
    return TDIST_OK;
}

/* The reduce op of the local pass and of the group collective: AVG and
 * PREMUL_SUM sum locally; AVG sums across the group too and divides by
 * size x k after. */
static tdist_redop_t local_op(tdist_redop_t op)
{
    return op == TDIST_AVG || op == TDIST_PREMUL_SUM ? TDIST_SUM : op;
}

/* *acc = op over bufs[0..k) in list order: bufs[0] itself when k == 1,
 * else a new buffer the caller frees (*owned). */
static tdist_status_t reduce_local(const char *fn, void *const *bufs, size_t k, size_t count,
                                   tdist_dtype_t dt, tdist_redop_t op, void **acc, void **owned)
{
    *owned = NULL;
    *acc = bufs[0];
    if (k == 1 || count == 0) return TDIST_OK;
    void *t = malloc(count * tdist_dtype_size(dt));
    if (!t) return no_mem(fn);
    tdist_status_t st = tdist_reduce(t, bufs[0], bufs[1], count, dt, local_op(op));
    for (size_t i = 2; i < k && st == TDIST_OK; i++)
        st = tdist_reduce(t, t, bufs[i], count, dt, local_op(op));
    if (st != TDIST_OK) {
        free(t);
        return st;
    }
    *acc = *owned = t;
    return TDIST_OK;
}

/* Copy src into every buffer of the list but src itself. */
static void copy_out(void *const *bufs, size_t k, const void *src, size_t bytes)
{
    for (size_t i = 0; i < k; i++)
        if (bufs[i] != src) memcpy(bufs[i], src, bytes);
}

tdist_status_t tdist_all_reduce_multi(tdist_pg_t *pg, void *const *bufs, size_t k, size_t count,
                                      tdist_dtype_t dtype, tdist_redop_t op,
                                      const tdist_coll_opts_t *opts)
{
    static const char *fn = "tdist_all_reduce_multi";
    TDIST_CHECK(chk_common(fn, pg, opts));
    TDIST_CHECK(chk_dtype(fn, pg, dtype));
    TDIST_CHECK(chk_redop(fn, pg, op, dtype));
    TDIST_CHECK(chk_size(fn, pg, count, 1, dtype, "buffers"));
    TDIST_CHECK(chk_multi(fn, pg, (const void *const *)bufs, k, count, "bufs"));
    void *acc, *owned;
    TDIST_CHECK(reduce_local(fn, bufs, k, count, dtype, op, &acc, &owned));
    tdist_redop_t gop = op == TDIST_AVG ? TDIST_SUM : op;
    tdist_status_t st = tdist_all_reduce(pg, acc, acc, count, dtype, gop, opts, NULL);
    if (st == TDIST_OK && op == TDIST_AVG && count > 0)
        st = tdist_divide(acc, count, dtype, (int)((size_t)pg->size * k));
    if (st == TDIST_OK) copy_out(bufs, k, acc, count * tdist_dtype_size(dtype));
    free(owned);
    return st;
}

tdist_status_t tdist_reduce_multi(tdist_pg_t *pg, void *const *bufs, size_t k, size_t count,
                                  tdist_dtype_t dtype, tdist_redop_t op, int root,
                                  size_t root_buf, const tdist_coll_opts_t *opts)
{
    static const char *fn = "tdist_reduce_multi";
    TDIST_CHECK(chk_common(fn, pg, opts));
    TDIST_CHECK(chk_dtype(fn, pg, dtype));
    TDIST_CHECK(chk_redop(fn, pg, op, dtype));
    TDIST_CHECK(chk_root(fn, pg, root));
    TDIST_CHECK(chk_size(fn, pg, count, 1, dtype, "buffers"));
    TDIST_CHECK(chk_multi(fn, pg, (const void *const *)bufs, k, count, "bufs"));
    if (root_buf >= k) return arg_err(fn, pg, "root_buf %zu of %zu buffers", root_buf, k);
    void *acc, *owned;
    TDIST_CHECK(reduce_local(fn, bufs, k, count, dtype, op, &acc, &owned));
    tdist_redop_t gop = op == TDIST_AVG ? TDIST_SUM : op;
    void *out = pg->rank == root ? bufs[root_buf] : NULL;
    tdist_status_t st = tdist_reduce_to(pg, acc, out, count, dtype, gop, root, opts, NULL);
    if (st == TDIST_OK && out && op == TDIST_AVG && count > 0)
        st = tdist_divide(out, count, dtype, (int)((size_t)pg->size * k));
    free(owned);
    return st;
}

tdist_status_t tdist_broadcast_multi(tdist_pg_t *pg, void *const *bufs, size_t k, size_t count,
                                     tdist_dtype_t dtype, int root, size_t root_buf,
                                     const tdist_coll_opts_t *opts)
{
    static const char *fn = "tdist_broadcast_multi";
    TDIST_CHECK(chk_common(fn, pg, opts));
    TDIST_CHECK(chk_dtype(fn, pg, dtype));
    TDIST_CHECK(chk_root(fn, pg, root));
    TDIST_CHECK(chk_size(fn, pg, count, 1, dtype, "buffers"));
    TDIST_CHECK(chk_multi(fn, pg, (const void *const *)bufs, k, count, "bufs"));
    if (root_buf >= k) return arg_err(fn, pg, "root_buf %zu of %zu buffers", root_buf, k);
    void *src = bufs[pg->rank == root ? root_buf : 0];
    TDIST_CHECK(tdist_broadcast(pg, src, count, dtype, root, opts, NULL));
    copy_out(bufs, k, src, count * tdist_dtype_size(dtype));
    return TDIST_OK;
}

tdist_status_t tdist_all_gather_multi(tdist_pg_t *pg, const void *const *sendbufs,
                                      void *const *recvbufs, size_t k, size_t count,
                                      tdist_dtype_t dtype, const tdist_coll_opts_t *opts)
{
    static const char *fn = "tdist_all_gather_multi";
    TDIST_CHECK(chk_common(fn, pg, opts));
    TDIST_CHECK(chk_dtype(fn, pg, dtype));
    TDIST_CHECK(chk_size(fn, pg, count, (size_t)pg->size * k, dtype, "recvbufs"));
    TDIST_CHECK(chk_multi(fn, pg, sendbufs, k, count, "sendbufs"));
    TDIST_CHECK(chk_multi(fn, pg, (const void *const *)recvbufs, k, count, "recvbufs"));
    size_t bytes = count * tdist_dtype_size(dtype);
    uint8_t *packed = malloc(k * bytes > 0 ? k * bytes : 1);
    if (!packed) return no_mem(fn);
    for (size_t i = 0; i < k; i++) memcpy(packed + i * bytes, sendbufs[i], bytes);
    tdist_status_t st = tdist_all_gather(pg, packed, recvbufs[0], k * count, dtype, opts, NULL);
    if (st == TDIST_OK) copy_out(recvbufs, k, recvbufs[0], (size_t)pg->size * k * bytes);
    free(packed);
    return st;
}
