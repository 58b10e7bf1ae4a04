/*
 * ddp/reducer.c — one training iteration: forward_begin, grad_ready (copy
 * into the bucket, launch complete buckets in index order), backward_end
 * (unused parameters, the used-set agreement, waiting, continuations,
 * write-back, the one-time rebuild), and the shadow iteration Join replays
 * on a rank without input.
 *
 * Everything here runs on the training thread. The only state touched by
 * another thread is ddp_bucket_t.done_ns, written (atomically) by the
 * default hook's completion callback on the group's engine thread (with
 * overlap ON; OFF and INLINE reduce on the training thread itself).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ddp/internal.h"

static double ms_between(uint64_t a, uint64_t b) { return b > a ? (double)(b - a) / 1e6 : 0.0; }

/* Keep the first error of the iteration (status and message). */
static void record_err(tdist_ddp_t *d, tdist_status_t st)
{
    if (st == TDIST_OK || d->iter_err != TDIST_OK) return;
    d->iter_err = st;
    snprintf(d->iter_msg, sizeof d->iter_msg, "%s", tdist_last_error());
}

static void on_bucket_done(tdist_status_t st, void *user_data)
{
    ddp_bucket_t *b = user_data;
    atomic_store(&b->done_ns, tdist__now_ns());
    if (st == TDIST_OK) (void)tdist_pg_mark(b->desc.pg, "bucket_reduced", b->desc.index);
}

tdist_status_t tdist_ddp_allreduce_hook(void *state, const tdist_ddp_bucket_t *bucket,
                                        tdist_ddp_hook_result_t *result)
{
    (void)state;
    if (!bucket || !result || bucket->divisor <= 0)
        return tdist__error(TDIST_ERR_INVALID_ARG, "tdist_ddp_allreduce_hook: %s",
                            !bucket ? "bucket is NULL" : !result ? "result is NULL" : "divisor <= 0");
    tdist_coll_opts_t co;
    tdist_coll_opts_init(&co);
    co.premul_factor = 1.0 / (double)bucket->divisor;
    if (bucket->grads)
        return tdist_all_reduce_coalesced(bucket->pg, bucket->grads, bucket->counts,
                                          bucket->num_params, bucket->dtype, TDIST_PREMUL_SUM,
                                          &co, &result->work);
    return tdist_all_reduce(bucket->pg, bucket->buffer, bucket->buffer, bucket->count,
                            bucket->dtype, TDIST_PREMUL_SUM, &co, &result->work);
}

/* The default hook: one PREMUL_SUM all_reduce by 1/divisor of bucket b
 * over the storage at base. On the direct path in place over the caller's
 * gradients, one coalesced call (no bucket copies; a shadow iteration
 * issues the same call over zeros). Asynchronous, its completion time
 * taken on the engine thread; with overlap OFF or INLINE (launched from
 * backward_end, or from the grad_ready completing the bucket; never in a
 * shadow iteration), blocking on this thread, which then runs it itself
 * (the group is idle: earlier buckets were reduced the same way). */
static tdist_status_t default_reduce(tdist_ddp_t *d, ddp_bucket_t *b, unsigned char *base,
                                     bool shadow)
{
    bool sync = d->sched != TDIST_DDP_OVERLAP_ON && !shadow;
    tdist_coll_opts_t co;
    tdist_coll_opts_init(&co);
    co.premul_factor = 1.0 / (double)d->divisor;
    if (!sync) {
        co.on_complete = on_bucket_done;
        co.user_data = b;
    }
    tdist_work_t **work = sync ? NULL : &b->res.work;
    tdist_status_t st;
    if (tdist__ddp_direct(d)) {
        size_t es = tdist_dtype_size(b->dtype);
        for (size_t k = 0; k < b->nparams; k++) {
            d->direct_bufs[k] = shadow ? (void *)(base + b->arena_off + b->offsets[k] * es)
                                       : d->params[b->params[k]].grad;
            d->direct_counts[k] = b->counts[k];
        }
        st = tdist_all_reduce_coalesced(d->pg, d->direct_bufs, d->direct_counts, b->nparams,
                                        b->dtype, TDIST_PREMUL_SUM, &co, work);
    } else {
        void *buf = base + b->arena_off;
        st = tdist_all_reduce(d->pg, buf, buf, b->count, b->dtype, TDIST_PREMUL_SUM, &co, work);
    }
    if (sync && st == TDIST_OK) on_bucket_done(st, b);
    return st;
}

/* Launch bucket bi over the storage at base (the arena, or zeros for a
 * shadow iteration). */
static tdist_status_t launch(tdist_ddp_t *d, size_t bi, unsigned char *base, bool shadow)
{
    ddp_bucket_t *b = &d->buckets[bi];
    tdist_ddp_bucket_t *desc = &b->desc;
    desc->index = bi;
    desc->num_buckets = d->nb;
    desc->is_last = bi + 1 == d->nb;
    desc->buffer = base + b->arena_off;
    desc->count = b->count;
    desc->dtype = b->dtype;
    desc->num_params = b->nparams;
    desc->param_indices = b->params;
    desc->offsets = b->offsets;
    desc->counts = b->counts;
    desc->iteration = d->iteration;
    desc->divisor = d->divisor;
    desc->pg = d->pg;
    desc->grads = NULL;
    if (d->hook && (d->hook_flags & TDIST_DDP_HOOK_GRADS)) {
        size_t es = tdist_dtype_size(b->dtype);
        for (size_t k = 0; k < b->nparams; k++)
            b->grads[k] = shadow ? (void *)(base + b->arena_off + b->offsets[k] * es)
                                 : tdist__ddp_reduce_loc(d, b->params[k]);
        desc->grads = b->grads;
    }
    memset(&b->res, 0, sizeof b->res);
    atomic_store(&b->done_ns, 0);
    b->launched = true;
    b->launch_ns = tdist__now_ns();
    if (!d->t_first_launch_ns) d->t_first_launch_ns = b->launch_ns;
    (void)tdist_pg_mark(d->pg, shadow ? "bucket_shadow" : "bucket_launched", bi);

    tdist_status_t st = d->hook ? d->hook(d->hook_state, desc, &b->res)
                                : default_reduce(d, b, base, shadow);
    if (st != TDIST_OK) {
        if (b->res.work) tdist_work_free(b->res.work);
        memset(&b->res, 0, sizeof b->res);
        return tdist__error_context(st, "tdist_ddp_%s: rank %d group %s iteration %" PRIu64
                                        ": comm hook of bucket %zu (%zu parameters, %zu x %s)",
                                    shadow ? "shadow_iteration" : "grad_ready", d->rank,
                                    tdist_pg_name(d->pg), d->iteration, bi, b->nparams, b->count,
                                    tdist_dtype_name(b->dtype));
    }
    if (!shadow) {
        d->stats.buckets_reduced++;
        d->stats.bytes_reduced += b->bytes;
    }
    return TDIST_OK;
}

/* Launch every complete bucket from next_bucket on, in index order.
 * Returns the first launch error (also recorded for backward_end). */
static tdist_status_t launch_ready(tdist_ddp_t *d)
{
    tdist_status_t first = TDIST_OK;
    while (d->next_bucket < d->nb && d->buckets[d->next_bucket].pending == 0) {
        tdist_status_t st = launch(d, d->next_bucket, d->arena, false);
        d->next_bucket++;
        if (st != TDIST_OK) {
            record_err(d, st);
            if (first == TDIST_OK) first = st;
        }
    }
    return first;
}

/* Wait for bucket b's work and run its continuations; frees the works.
 * Keeps going after an error so that no work is left behind. */
static tdist_status_t finish_bucket(tdist_ddp_t *d, ddp_bucket_t *b, const char *op)
{
    tdist_status_t ret = TDIST_OK;
    for (int guard = 0; b->res.work || b->res.then; guard++) {
        if (b->res.work) {
            tdist_status_t st = tdist_work_wait(b->res.work, -1);
            tdist_work_free(b->res.work);
            b->res.work = NULL;
            if (st != TDIST_OK) {
                ret = tdist__error_context(st, "tdist_ddp_%s: rank %d group %s iteration %" PRIu64
                                               ": reduction of bucket %zu",
                                           op, d->rank, tdist_pg_name(d->pg), d->iteration,
                                           b->desc.index);
                b->res.then = NULL;
                break;
            }
        }
        if (b->res.then) {
            tdist_ddp_then_fn fn = b->res.then;
            tdist_ddp_hook_result_t next = {0};
            b->res.then = NULL;
            tdist_status_t st = fn(d->hook_state, &b->desc, &next);
            if (st != TDIST_OK) {
                ret = tdist__error_context(st, "tdist_ddp_%s: rank %d group %s iteration %" PRIu64
                                               ": continuation of bucket %zu",
                                           op, d->rank, tdist_pg_name(d->pg), d->iteration,
                                           b->desc.index);
                if (next.work) {
                    (void)tdist_work_wait(next.work, -1);
                    tdist_work_free(next.work);
                }
                break;
            }
            b->res = next;
        }
    }
    b->launched = false;
    /* a hook's reduction ends here (the default one's in on_bucket_done) */
    if (ret == TDIST_OK && d->hook) (void)tdist_pg_mark(d->pg, "bucket_reduced", b->desc.index);
    return ret;
}

static void reset_iteration(tdist_ddp_t *d)
{
    memset(d->ready, 0, d->np ? d->np : 1);
    d->nready = 0;
    d->norder = 0;
    d->next_bucket = 0;
    d->iter_err = TDIST_OK;
    d->iter_msg[0] = 0;
    for (size_t b = 0; b < d->nb; b++) {
        d->buckets[b].pending = d->buckets[b].nparams;
        d->buckets[b].launched = false;
    }
    d->t_first_launch_ns = 0;
    d->copy_ns = 0;
}

tdist_status_t tdist_ddp_forward_begin(tdist_ddp_t *ddp)
{
    const char *op = "forward_begin";
    if (!ddp) return tdist__ddp_error(NULL, TDIST_ERR_INVALID_ARG, op, "ddp is NULL");
    if (ddp->in_iter && ddp->nready > 0)
        return tdist__ddp_error(ddp, TDIST_ERR_INVALID_ARG, op,
                                "backward of this iteration has begun (%zu of %zu gradients "
                                "ready) but tdist_ddp_backward_end was not called",
                                ddp->nready, ddp->np);
    if (!ddp->in_iter) ddp->iteration++;
    ddp->started = true;
    ddp->in_iter = false;
    /* Join's notification: before this iteration's first collective */
    if (ddp->fwd_hook) TDIST_CHECK(ddp->fwd_hook(ddp->fwd_hook_arg, ddp));
    if (ddp->opts.broadcast_buffers && ddp->nbuf > 0)
        TDIST_CHECK(tdist__ddp_sync_buffers(ddp, ddp->buffer_root, op));
    reset_iteration(ddp);
    ddp->iter_no_sync = ddp->want_no_sync;
    ddp->in_iter = true;
    ddp->t_fwd_ns = ddp->t_last_ready_ns = tdist__now_ns();
    return TDIST_OK;
}

tdist_status_t tdist_ddp_grad_ready(tdist_ddp_t *ddp, size_t index)
{
    const char *op = "grad_ready";
    if (!ddp) return tdist__ddp_error(NULL, TDIST_ERR_INVALID_ARG, op, "ddp is NULL");
    if (!ddp->in_iter)
        return tdist__ddp_error(ddp, TDIST_ERR_INVALID_ARG, op,
                                "parameter %zu: no iteration in progress (call "
                                "tdist_ddp_forward_begin first)",
                                index);
    if (index >= ddp->np)
        return tdist__ddp_error(ddp, TDIST_ERR_INVALID_ARG, op,
                                "parameter index %zu out of range (the model has %zu parameters)",
                                index, ddp->np);
    ddp_param_t *p = &ddp->params[index];
    if (ddp->ready[index])
        return tdist__ddp_error(ddp, TDIST_ERR_INVALID_ARG, op,
                                "parameter %zu '%s' was marked ready twice in this iteration",
                                index, p->name);
    ddp->ready[index] = 1;
    ddp->used_since_sync[index] = 1;
    ddp->nready++;
    ddp->order[ddp->norder++] = (int32_t)index;
    ddp->t_last_ready_ns = tdist__now_ns();
    if (ddp->iter_no_sync) return TDIST_OK;
    /* the flight recorder's backward span starts at the first gradient */
    if (ddp->nready == 1) (void)tdist_pg_mark(ddp->pg, "backward_begin", ddp->iteration);
    if (tdist__ddp_copies(ddp)) {
        memcpy(tdist__ddp_slot(ddp, index), p->grad, p->bytes);
        ddp->copy_ns += tdist__now_ns() - ddp->t_last_ready_ns;
    }
    ddp_bucket_t *b = &ddp->buckets[p->bucket];
    if (--b->pending == 0) {
        b->ready_ns = tdist__now_ns();
        (void)tdist_pg_mark(ddp->pg, "bucket_ready", p->bucket); /* flight recorder */
        if (!ddp->hook && ddp->sched == TDIST_DDP_OVERLAP_OFF) return TDIST_OK; /* in backward_end */
        /* inline: the small first bucket, which starts communication early
         * for an engine thread with a CPU of its own, goes with the next
         * one (one meeting of the ranks fewer, nothing to overlap) */
        if (!ddp->hook && ddp->sched == TDIST_DDP_OVERLAP_INLINE && p->bucket == 0 && ddp->nb > 1)
            return TDIST_OK;
        return launch_ready(ddp);
    }
    return TDIST_OK;
}

/* After the first synchronised iteration: every rank takes rebuild_root's
 * arrival order (one broadcast) and rebuilds the buckets in it. shadow: this
 * rank has no order of its own; it offers the current bucket order. */
static tdist_status_t rebuild(tdist_ddp_t *d, bool shadow)
{
    d->rebuilt = true;
    size_t n = d->np;
    if (n == 0) return TDIST_OK;
    int32_t *ord = malloc(n * sizeof *ord);
    uint8_t *seen = calloc(n, 1);
    if (!ord || !seen) {
        free(ord);
        free(seen);
        return tdist__ddp_error(d, TDIST_ERR_NO_MEMORY, "backward_end", "out of memory");
    }
    size_t k = 0;
    if (shadow) {
        for (size_t b = 0; b < d->nb; b++)
            for (size_t j = 0; j < d->buckets[b].nparams; j++)
                ord[k++] = (int32_t)d->buckets[b].params[j];
    } else {
        for (size_t j = 0; j < d->norder; j++) {
            ord[k++] = d->order[j];
            seen[d->order[j]] = 1;
        }
        for (size_t i = n; i-- > 0;)
            if (!seen[i]) ord[k++] = (int32_t)i;
    }
    tdist_status_t st = tdist_broadcast(d->pg, ord, n, TDIST_I32, d->rebuild_root, NULL, NULL);
    if (st != TDIST_OK) {
        free(ord);
        free(seen);
        return tdist__error_context(st, "tdist_ddp_backward_end: rank %d group %s iteration %" PRIu64
                                        ": broadcast of the gradient order for the bucket rebuild",
                                    d->rank, tdist_pg_name(d->pg), d->iteration);
    }
    memset(seen, 0, n);
    for (size_t j = 0; j < n; j++) {
        if (ord[j] < 0 || (size_t)ord[j] >= n || seen[ord[j]]) {
            free(ord);
            free(seen);
            return tdist__ddp_error(d, TDIST_ERR_INTERNAL, "backward_end",
                                    "the rebuild order from rank %d is not a permutation",
                                    d->rebuild_root);
        }
        seen[ord[j]] = 1;
    }
    bool changed = false;
    st = tdist__ddp_build_buckets(d, ord, &changed);
    free(ord);
    free(seen);
    if (st == TDIST_OK && changed) d->stats.bucket_rebuilds++;
    d->stats.num_buckets = d->nb;
    return st;
}

/* ---------------------------------------------------------------------
 * backward_end, phase by phase:
 *
 *   mark_unready   parameters without grad_ready: zero contributions, the
 *                  missing ones named; launch the buckets that completes
 *   agree_begin    [find_unused] start the all_reduce MAX of the used set
 *   wait_buckets   every launched bucket, continuations in bucket order
 *   agree_end      wait for the used-set agreement
 *   check_static   [static_graph] fix the used set, or check it is the same
 *   write_back     the averaged gradients to the caller's grad buffers
 *   rebuild_once   the first synchronised iteration's bucket rebuild
 *   record_stats
 *
 * The shadow iteration of a joined rank launches every bucket on zeros,
 * then shares agree_begin, wait_buckets, agree_end and the rebuild.
 */

/* What mark_unready found: the parameters without grad_ready. */
typedef struct unready {
    size_t nunused;       /* find_unused: zero contributions */
    size_t nmissing;      /* no find_unused: an error naming them */
    size_t listed;        /* of those, named in missing */
    char missing[600];
    unsigned char *stash; /* find_unused + bucket views: unused slots' contents */
} unready_t;

/* backward_end's timestamps and the communication busy time (ns). */
typedef struct end_times {
    uint64_t start, wait_begin, wait_end, busy;
} end_times_t;

/* Names of the parameters that were never ready, for the error message. */
static void append_name(char *buf, size_t cap, size_t *len, size_t *listed, size_t idx,
                        const char *name)
{
    if (*listed >= 8) return;
    int k = snprintf(buf + *len, cap - *len, "%s'%s' (index %zu)", *listed ? ", " : "", name, idx);
    if (k > 0 && (size_t)k < cap - *len) {
        *len += (size_t)k;
        (*listed)++;
    }
}

/* Every parameter without grad_ready in this iteration. One accumulated
 * during no_sync iterations is final as it stands; any other contributes
 * zeros: unused with find_unused (when it is reduced where it lives, with
 * bucket views or a hook on the gradients, its contents are stashed, to be
 * restored if no rank used it), missing without. Then the buckets this
 * completes are launched. */
static void mark_unready(tdist_ddp_t *d, unready_t *u, const char *op)
{
    bool copies = tdist__ddp_copies(d);
    bool find_unused = d->opts.find_unused_parameters;
    size_t n = d->np, mlen = 0, stash_bytes = 0, so = 0;
    memset(u, 0, sizeof *u);
    for (size_t i = 0; i < n; i++)
        if (!d->ready[i] && !d->used_since_sync[i] && find_unused && !copies)
            stash_bytes += d->params[i].bytes;
    if (stash_bytes && !(u->stash = malloc(stash_bytes)))
        record_err(d, tdist__ddp_error(d, TDIST_ERR_NO_MEMORY, op, "out of memory"));
    for (size_t i = 0; i < n; i++) {
        if (d->ready[i]) continue;
        ddp_param_t *p = &d->params[i];
        void *loc = tdist__ddp_reduce_loc(d, i);
        if (d->used_since_sync[i]) {
            /* accumulated during no_sync iterations: final as it stands */
            if (copies) memcpy(loc, p->grad, p->bytes);
        } else {
            if (find_unused) {
                u->nunused++;
                if (u->stash) {
                    memcpy(u->stash + so, loc, p->bytes);
                    so += p->bytes;
                }
            } else {
                u->nmissing++;
                append_name(u->missing, sizeof u->missing, &mlen, &u->listed, i, p->name);
            }
            /* a zero contribution (direct: in the caller's gradient, which
             * this rank reports as an error anyway) */
            memset(loc, 0, p->bytes);
        }
        if (--d->buckets[p->bucket].pending == 0) d->buckets[p->bucket].ready_ns = tdist__now_ns();
    }
    launch_ready(d);
}

/* Whether this iteration agrees on the used set: find_unused, unless
 * static_graph has agreed already. */
static bool agree_needed(const tdist_ddp_t *d)
{
    return d->opts.find_unused_parameters && !(d->opts.static_graph && d->static_agreed);
}

/* Start the agreement on the used set: an all_reduce MAX of one byte per
 * parameter, from local (NULL: nothing used). *uw: its work, NULL when
 * there are no parameters. */
static tdist_status_t agree_begin(tdist_ddp_t *d, const uint8_t *local, tdist_work_t **uw)
{
    *uw = NULL;
    if (d->np == 0) return TDIST_OK;
    if (local)
        memcpy(d->used_map, local, d->np);
    else
        memset(d->used_map, 0, d->np);
    return tdist_all_reduce(d->pg, d->used_map, d->used_map, d->np, TDIST_U8, TDIST_MAX, NULL, uw);
}

/* Wait for the agreement agree_begin started (uw NULL: none) and free it. */
static tdist_status_t agree_end(tdist_ddp_t *d, tdist_work_t *uw, const char *op)
{
    if (!uw) return TDIST_OK;
    tdist_status_t st = tdist_work_wait(uw, -1);
    tdist_work_free(uw);
    if (st == TDIST_OK) return TDIST_OK;
    return tdist__error_context(st, "tdist_ddp_%s: rank %d group %s iteration %" PRIu64
                                    ": used-parameter agreement",
                                op, d->rank, tdist_pg_name(d->pg), d->iteration);
}

/* Wait for every launched bucket and run its continuations, in bucket
 * order; errors are recorded. Returns the communication busy time: the
 * union of the buckets' [launch, done] intervals (buckets are launched and
 * reduced in index order). */
static uint64_t wait_buckets(tdist_ddp_t *d, const char *op)
{
    uint64_t busy = 0, cur_lo = 0, cur_hi = 0;
    for (size_t b = 0; b < d->nb; b++) {
        ddp_bucket_t *bk = &d->buckets[b];
        if (!bk->launched) continue;
        uint64_t lo = bk->launch_ns;
        record_err(d, finish_bucket(d, bk, op));
        uint64_t done = atomic_load(&bk->done_ns);
        if (!done) {
            done = tdist__now_ns();
            atomic_store(&bk->done_ns, done); /* a hook's: when seen done here */
        }
        if (done < lo) done = lo;
        if (cur_hi == 0 || lo > cur_hi) {
            busy += cur_hi - cur_lo;
            cur_lo = lo;
            cur_hi = done;
        } else if (done > cur_hi) {
            cur_hi = done;
        }
    }
    return busy + (cur_hi - cur_lo);
}

/* static_graph with find_unused, after an iteration without error: the
 * first agreement (agreed) fixes this rank's used set; every later
 * iteration must use the same parameters. */
static void check_static(tdist_ddp_t *d, bool agreed, const char *op)
{
    if (d->iter_err != TDIST_OK || !d->opts.find_unused_parameters || !d->opts.static_graph)
        return;
    if (agreed) {
        memcpy(d->static_local, d->used_since_sync, d->np);
        d->static_agreed = true;
        return;
    }
    for (size_t i = 0; i < d->np; i++)
        if (!d->static_local[i] != !d->used_since_sync[i]) {
            record_err(d, tdist__ddp_error(d, TDIST_ERR_INVALID_ARG, op,
                                           "static_graph: parameter %zu '%s' was %s in the first "
                                           "iteration but is %s now",
                                           i, d->params[i].name,
                                           d->static_local[i] ? "used" : "unused",
                                           d->static_local[i] ? "unused" : "used"));
            return;
        }
}

static tdist_status_t missing_error(const tdist_ddp_t *d, const unready_t *u, const char *op)
{
    return tdist__ddp_error(
        d, TDIST_ERR_INVALID_ARG, op,
        "%zu parameter%s never became ready (no tdist_ddp_grad_ready call): %s%s. Call "
        "grad_ready for every parameter in each iteration, or set "
        "find_unused_parameters if some are not used in the forward pass",
        u->nmissing, u->nmissing == 1 ? "" : "s", u->missing, u->nmissing > u->listed ? ", ..." : "");
}

/* The averaged gradients to the caller's grad buffers. Reduced where
 * they live (the direct path, bucket views, a hook on the gradients), they
 * stay there, except that a gradient no rank used gets its stashed
 * contents back; else they are copied from the arena. */
static void write_back(tdist_ddp_t *d, const unsigned char *stash)
{
    if (tdist__ddp_direct(d)) return;
    bool copies = tdist__ddp_copies(d);
    uint64_t t0 = copies ? tdist__now_ns() : 0;
    bool find_unused = d->opts.find_unused_parameters;
    size_t so = 0;
    for (size_t i = 0; i < d->np; i++) {
        ddp_param_t *p = &d->params[i];
        bool local_unused = !d->ready[i] && !d->used_since_sync[i];
        bool global_used = !find_unused || d->used_map[i];
        if (copies) {
            if (global_used) memcpy(p->grad, tdist__ddp_slot(d, i), p->bytes);
        } else if (local_unused && find_unused) {
            if (!global_used && stash) memcpy(tdist__ddp_reduce_loc(d, i), stash + so, p->bytes);
            so += p->bytes;
        }
    }
    if (copies) d->copy_ns += tdist__now_ns() - t0;
}

/* The one-time rebuild takes part in the iteration's collectives even
 * after a local error (a missing grad_ready on this rank only), so that
 * every rank issues the same sequence. ret: the iteration's status, which
 * (with its message) stays the call's result when it is an error. */
static tdist_status_t rebuild_once(tdist_ddp_t *d, tdist_status_t ret)
{
    char keep[sizeof d->iter_msg];
    snprintf(keep, sizeof keep, "%s", ret != TDIST_OK ? tdist_last_error() : "");
    tdist_status_t rst = rebuild(d, false);
    if (ret == TDIST_OK) return rst;
    tdist__error(ret, "%s", keep); /* the iteration's error, not the rebuild's */
    return ret;
}

static void record_stats(tdist_ddp_t *d, size_t nunused, const end_times_t *tm)
{
    uint64_t t1 = tdist__now_ns();
    tdist_ddp_stats_t *s = &d->stats;
    s->iterations++;
    s->sync_iterations++;
    s->unused_parameters = nunused;
    s->last_compute_ms = ms_between(d->t_fwd_ns, d->t_last_ready_ns);
    s->last_comm_ms = (double)tm->busy / 1e6;
    s->last_wait_ms = ms_between(tm->wait_begin, tm->wait_end);
    s->last_backward_end_ms = ms_between(tm->start, t1);
    s->total_compute_ms += s->last_compute_ms;
    s->total_comm_ms += s->last_comm_ms;
    s->total_wait_ms += s->last_wait_ms;
    s->last_copy_ms = (double)d->copy_ns / 1e6;
    s->total_copy_ms += s->last_copy_ms;
}

tdist_status_t tdist_ddp_backward_end(tdist_ddp_t *ddp)
{
    const char *op = "backward_end";
    if (!ddp) return tdist__ddp_error(NULL, TDIST_ERR_INVALID_ARG, op, "ddp is NULL");
    tdist_ddp_t *d = ddp;
    if (!d->in_iter)
        return tdist__ddp_error(d, TDIST_ERR_INVALID_ARG, op,
                                "no iteration in progress: tdist_ddp_forward_begin was not called "
                                "since the last backward_end");
    end_times_t tm = {.start = tdist__now_ns()};
    if (d->iter_no_sync) {
        d->in_iter = false;
        d->stats.iterations++;
        return TDIST_OK;
    }
    unready_t u;
    mark_unready(d, &u, op);
    tdist_work_t *uw = NULL;
    bool agree = agree_needed(d);
    if (agree) record_err(d, agree_begin(d, d->used_since_sync, &uw));

    tm.wait_begin = tdist__now_ns();
    tm.busy = wait_buckets(d, op);
    record_err(d, agree_end(d, uw, op));
    tm.wait_end = tdist__now_ns();
    check_static(d, agree, op);

    tdist_status_t ret = TDIST_OK;
    if (d->iter_err != TDIST_OK)
        ret = tdist__error(d->iter_err, "%s", d->iter_msg);
    else if (u.nmissing)
        ret = missing_error(d, &u, op);
    else
        write_back(d, u.stash);
    free(u.stash);
    if (!d->rebuilt) ret = rebuild_once(d, ret);
    if (ret == TDIST_OK) record_stats(d, u.nunused, &tm);
    memset(d->used_since_sync, 0, d->np ? d->np : 1);
    d->in_iter = false;
    return ret;
}

tdist_status_t tdist__ddp_shadow_iteration(tdist_ddp_t *d)
{
    const char *op = "shadow_iteration";
    if (d->in_iter)
        return tdist__ddp_error(d, TDIST_ERR_INVALID_ARG, op, "an iteration is in progress");
    d->iteration++;
    if (d->opts.broadcast_buffers && d->nbuf > 0)
        TDIST_CHECK(tdist__ddp_sync_buffers(d, d->buffer_root, op));
    if (!d->shadow_arena) {
        d->shadow_arena = aligned_alloc(64, d->arena_bytes ? d->arena_bytes : 64);
        if (!d->shadow_arena) return tdist__ddp_error(d, TDIST_ERR_NO_MEMORY, op, "out of memory");
    }
    memset(d->shadow_arena, 0, d->arena_bytes);
    d->iter_err = TDIST_OK;
    d->t_first_launch_ns = 0;
    for (size_t b = 0; b < d->nb; b++) record_err(d, launch(d, b, d->shadow_arena, true));

    tdist_work_t *uw = NULL;
    if (agree_needed(d)) record_err(d, agree_begin(d, NULL, &uw));
    bool agreeing = uw != NULL;
    (void)wait_buckets(d, op);
    tdist_status_t st = agree_end(d, uw, op);
    record_err(d, st);
    if (agreeing && st == TDIST_OK && d->opts.static_graph) {
        /* the used set this rank agreed on is empty */
        memset(d->static_local, 0, d->np);
        d->static_agreed = true;
    }
    if (d->iter_err == TDIST_OK && !d->rebuilt) return rebuild(d, true);
    /* the first error's status (tdist_last_error() has the latest message) */
    return d->iter_err;
}
