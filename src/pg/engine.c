/*
 * pg/engine.c — the ordered per-group progress engine and work handles.
 *
 * The caller's thread checks arguments (api.c), gives the work the next
 * sequence number and appends it to the group's FIFO. The engine thread
 * pops works one at a time, in order: deadline = start + (call timeout or
 * group timeout); fingerprint exchange (check.c); the coll/ algorithm;
 * then status, on_complete and a wake-up of the waiters.
 *
 * A failure is sticky: the engine posts its cause to the world store
 * ("pg/<uid>/failure", compare_set: first wins), builds its message with
 * the group's first failure (so every rank names the rank that actually
 * died, not the neighbour whose connection closed in the cascade), then
 * destroys the collective mesh so peers blocked on this rank fail fast,
 * and aborts the p2p mesh. Every later work fails with the sticky error.
 *
 * Works are refcounted: one reference for the caller (until
 * tdist_work_free, or the blocking call returns), one for the engine
 * (until it has finished the work).
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "coll/coll.h"
#include "pg/internal.h"
#include "tdist/store.h"

/* ------------------------------------------------------------ work handles */

/* One released work per thread is kept for the next call (a blocking
 * collective allocates and frees one work per call otherwise); the key's
 * destructor frees it when the thread ends. */
static pthread_key_t spare_key;
static pthread_once_t spare_once = PTHREAD_ONCE_INIT;
static bool spare_ok;

static void work_destroy(struct tdist_work *w)
{
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    free(w);
}

static void spare_free(void *p) { work_destroy(p); }
static void spare_init(void) { spare_ok = pthread_key_create(&spare_key, spare_free) == 0; }

static struct tdist_work *work_alloc(void)
{
    pthread_once(&spare_once, spare_init);
    if (spare_ok) {
        struct tdist_work *w = pthread_getspecific(spare_key);
        if (w) {
            pthread_setspecific(spare_key, NULL);
            memset(&w->refs, 0, sizeof *w - offsetof(struct tdist_work, refs));
            return w;
        }
    }
    struct tdist_work *w = calloc(1, sizeof *w);
    if (!w) return NULL;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    if (pthread_mutex_init(&w->mu, NULL) != 0) {
        pthread_condattr_destroy(&ca);
        free(w);
        return NULL;
    }
    if (pthread_cond_init(&w->cv, &ca) != 0) {
        pthread_condattr_destroy(&ca);
        pthread_mutex_destroy(&w->mu);
        free(w);
        return NULL;
    }
    pthread_condattr_destroy(&ca);
    return w;
}

static void work_init(struct tdist_work *w, tdist__op_t op, const tdist_coll_opts_t *opts)
{
    atomic_init(&w->refs, 2);
    atomic_init(&w->status, TDIST_INPROGRESS);
    w->op = op;
    w->root = -1;
    w->shadow_leader = -1;
    w->premul = 1.0;
    w->timeout_ms = -1;
    if (opts) {
        w->timeout_ms = opts->timeout_ms;
        w->premul = opts->premul_factor;
        w->on_complete = opts->on_complete;
        w->user_data = opts->user_data;
    }
}

struct tdist_work *tdist__work_new(tdist__op_t op, const tdist_coll_opts_t *opts)
{
    struct tdist_work *w = work_alloc();
    if (w) work_init(w, op, opts);
    return w;
}

struct tdist_work *tdist__work_on_stack(struct tdist_work *w, tdist__op_t op,
                                        const tdist_coll_opts_t *opts, tdist_work_t **work)
{
    if (work || (opts && opts->on_complete)) return tdist__work_new(op, opts);
    memset(&w->refs, 0, sizeof *w - offsetof(struct tdist_work, refs));
    work_init(w, op, opts);
    w->on_stack = true;
    return w;
}

/* What a work owns (copies of the caller's arrays, messages). */
static void work_free_owned(struct tdist_work *w)
{
    if (!w->msg && !w->sendcounts && !w->recvcounts && !w->bufs && !w->counts && !w->p2p_msg)
        return;
    free(w->msg);
    free(w->sendcounts);
    free(w->recvcounts);
    free(w->bufs);
    free(w->counts);
    free(w->p2p_msg);
}

void tdist__work_release(struct tdist_work *w)
{
    if (!w) return;
    if (atomic_fetch_sub(&w->refs, 1) != 1) return;
    work_free_owned(w);
    if (w->on_stack) return; /* the caller's storage */
    pthread_once(&spare_once, spare_init);
    if (spare_ok && !pthread_getspecific(spare_key) && pthread_setspecific(spare_key, w) == 0)
        return;
    work_destroy(w);
}

void tdist__work_finish(struct tdist_work *w, tdist_status_t st, const char *msg)
{
    if (st != TDIST_OK) w->msg = tdist__strdup(msg ? msg : "");
    if (w->on_complete) w->on_complete(st, w->user_data);
    if (w->inline_run) { /* the caller itself ran it: nobody waits on cv */
        atomic_store(&w->status, (int)st);
        tdist__work_release(w);
        return;
    }
    pthread_mutex_lock(&w->mu);
    atomic_store(&w->status, (int)st);
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    tdist__work_release(w);
}

tdist_status_t tdist_work_status(const tdist_work_t *w)
{
    if (!w) return tdist__error(TDIST_ERR_INVALID_ARG, "tdist_work_status: w is NULL");
    return (tdist_status_t)atomic_load(&((tdist_work_t *)w)->status);
}

const char *tdist_work_error(const tdist_work_t *w)
{
    if (!w) return "";
    int st = atomic_load(&((tdist_work_t *)w)->status);
    if (st == TDIST_INPROGRESS || st == TDIST_OK || !w->msg) return "";
    return w->msg;
}

tdist_status_t tdist_work_wait(tdist_work_t *w, int64_t timeout_ms)
{
    if (!w) return tdist__error(TDIST_ERR_INVALID_ARG, "tdist_work_wait: w is NULL");
    int st = atomic_load(&w->status);
    if (st == TDIST_INPROGRESS) {
        int64_t deadline = tdist__deadline_ms(timeout_ms);
        pthread_mutex_lock(&w->mu);
        while ((st = atomic_load(&w->status)) == TDIST_INPROGRESS) {
            if (deadline == INT64_MAX) {
                pthread_cond_wait(&w->cv, &w->mu);
                continue;
            }
            int64_t now = tdist__now_ms();
            if (now >= deadline) break;
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            int64_t left = deadline - now;
            ts.tv_sec += left / 1000;
            ts.tv_nsec += (left % 1000) * 1000000;
            if (ts.tv_nsec >= 1000000000) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000;
            }
            pthread_cond_timedwait(&w->cv, &w->mu, &ts);
        }
        pthread_mutex_unlock(&w->mu);
    }
    if (st == TDIST_INPROGRESS) {
        char d[200];
        tdist__work_describe(w, d, sizeof d);
        return tdist__error(TDIST_ERR_TIMEOUT,
                            "tdist_work_wait: %s seq %llu did not complete within %lld ms (it goes on)",
                            d, (unsigned long long)w->seq, (long long)timeout_ms);
    }
    if (st != TDIST_OK) return tdist__error((tdist_status_t)st, "%s", w->msg ? w->msg : "");
    return TDIST_OK;
}

void tdist_work_free(tdist_work_t *w) { tdist__work_release(w); }

/* ------------------------------------------------------------ sticky error */

tdist_status_t tdist__pg_sticky(tdist_pg_t *pg, char **msg)
{
    pthread_mutex_lock(&pg->mu);
    tdist_status_t st = pg->err;
    if (st != TDIST_OK && msg) *msg = tdist__strdup(pg->errmsg);
    pthread_mutex_unlock(&pg->mu);
    return st;
}

static void set_sticky(tdist_pg_t *pg, tdist_status_t st, const char *msg)
{
    pthread_mutex_lock(&pg->mu);
    if (pg->err == TDIST_OK) {
        pg->err = st;
        pg->errmsg = tdist__strdup(msg);
        atomic_store(&pg->failed, true);
    }
    pthread_mutex_unlock(&pg->mu);
}

char *tdist__pg_fail(tdist_pg_t *pg, tdist_status_t st, const char *prefix, const char *cause)
{
    char *root = NULL;
    if (st != TDIST_ERR_MISMATCH && pg->store && pg->size > 1) {
        /* First failure of the group wins; everyone reads the winner. */
        char key[300];
        snprintf(key, sizeof key, "pg/%s/failure", pg->uid);
        char *mine = tdist__asprintf("rank %d (world rank %d): %s", pg->rank,
                                     pg->wranks[pg->rank], cause);
        void *cur = NULL;
        size_t cur_len = 0;
        if (mine && tdist_store_compare_set(pg->store, key, NULL, 0, mine, strlen(mine), &cur,
                                            &cur_len) == TDIST_OK &&
            cur) {
            if (cur_len != strlen(mine) || memcmp(cur, mine, cur_len) != 0) {
                root = malloc(cur_len + 1);
                if (root) {
                    memcpy(root, cur, cur_len);
                    root[cur_len] = '\0';
                }
            }
        }
        free(cur);
        free(mine);
    }
    char *msg;
    if (root)
        msg = tdist__asprintf("%s: %s (first failure in the group: %s)", prefix, cause, root);
    else
        msg = tdist__asprintf("%s: %s", prefix, cause);
    free(root);
    set_sticky(pg, st, msg ? msg : cause);
    /* Cascade: close the collective mesh so peers blocked on us fail now. */
    pthread_mutex_lock(&pg->mu);
    tdist__tp_t *tp = pg->tp;
    pg->tp = NULL;
    if (pg->p2p_tp) tdist__tp_abort(pg->p2p_tp);
    pthread_mutex_unlock(&pg->mu);
    tdist__tp_destroy(tp);
    return msg;
}

/* ------------------------------------------------------------- submission */

static void run_work(tdist_pg_t *pg, struct tdist_work *w);
static tdist_status_t run_work_status(tdist_pg_t *pg, struct tdist_work *w, char **msg);
static tdist_status_t work_failed(tdist_pg_t *pg, const struct tdist_work *w, tdist_status_t st,
                                  char **msg);

/* A work run on the caller's thread is over: the engine may go on. */
static void end_inline(tdist_pg_t *pg)
{
    pthread_mutex_lock(&pg->mu);
    pg->busy = false;
    /* Only the engine waits on cv, and only for queued work (or the
     * stop): waking it after every inline call costs a context switch. */
    if (pg->head || pg->stop) pthread_cond_broadcast(&pg->cv);
    pthread_mutex_unlock(&pg->mu);
}

/* A copy of stack work w on the heap (w's arrays move to it), or NULL. */
static struct tdist_work *to_heap(struct tdist_work *w)
{
    struct tdist_work *h = work_alloc();
    if (!h) return NULL;
    memcpy(&h->refs, &w->refs, sizeof *w - offsetof(struct tdist_work, refs));
    h->on_stack = false;
    return h;
}

tdist_status_t tdist__pg_submit(tdist_pg_t *pg, struct tdist_work *w, tdist_work_t **work)
{
    w->nranks = pg->size;
    pthread_mutex_lock(&pg->mu);
    if (w->on_stack && (pg->head || pg->busy)) {
        /* it will wait in the queue, past this call's frame on other
         * threads' stacks: move it to the heap */
        pthread_mutex_unlock(&pg->mu);
        struct tdist_work *h = to_heap(w);
        if (!h) {
            atomic_store(&w->refs, 1);
            tdist__work_release(w);
            return tdist__error(TDIST_ERR_NO_MEMORY, "rank %d group %s: out of memory",
                                pg->rank, pg->name);
        }
        w = h;
        pthread_mutex_lock(&pg->mu);
    }
    if (pg->join_mode != TDIST__JOIN_NONE) {
        tdist_status_t jst = tdist__pg_join_check(pg, w);
        if (jst != TDIST_OK) {
            pthread_mutex_unlock(&pg->mu);
            atomic_store(&w->refs, 1);
            tdist__work_release(w);
            return jst;
        }
    }
    w->seq = ++pg->next_seq;
    tdist_status_t st = TDIST_OK;
    char *why = NULL;
    if (atomic_load(&pg->aborted)) {
        st = TDIST_ERR_ABORTED;
    } else if (pg->err != TDIST_OK) {
        st = pg->err;
        why = tdist__strdup(pg->errmsg);
    }
    /* A blocking call without a callback, on an idle engine, runs inline
     * on the caller's thread: same order (nothing is queued or running),
     * and no thread hand-off on the latency path. */
    bool inline_run = false;
    if (st == TDIST_OK && !work && !w->on_complete && !pg->head && !pg->busy) {
        pg->busy = true;
        inline_run = true;
    } else if (st == TDIST_OK) {
        if (pg->tail)
            pg->tail->next = w;
        else
            pg->head = w;
        pg->tail = w;
        pthread_cond_broadcast(&pg->cv);
    }
    pthread_mutex_unlock(&pg->mu);
    if (inline_run) {
        w->inline_run = true;
        char *msg = NULL;
        if (w->on_stack) /* nobody else sees it: no finish, no wake-up */
            st = run_work_status(pg, w, &msg);
        else
            run_work(pg, w);
        end_inline(pg);
        if (w->on_stack) {
            if (st != TDIST_OK) tdist__error(st, "%s", msg ? msg : "out of memory");
            free(msg);
            work_free_owned(w); /* a stack work: its storage is the caller's */
            return st;
        }
        st = tdist_work_wait(w, -1);
        tdist__work_release(w);
        return st;
    }
    if (st != TDIST_OK) {
        char d[200];
        tdist__work_describe(w, d, sizeof d);
        if (st == TDIST_ERR_ABORTED)
            tdist__error(st, "rank %d group %s seq %llu %s: the group was aborted", pg->rank,
                         pg->name, (unsigned long long)w->seq, d);
        else
            tdist__error(st, "rank %d group %s seq %llu %s: the group failed earlier: %s",
                         pg->rank, pg->name, (unsigned long long)w->seq, d, why ? why : "");
        free(why);
        atomic_store(&w->refs, 1);
        tdist__work_release(w);
        return st;
    }
    if (work) {
        *work = w;
        return TDIST_OK;
    }
    st = tdist_work_wait(w, -1);
    tdist__work_release(w);
    return st;
}

/* --------------------------------------------------------------- running */

static tdist_status_t run_monitored_barrier(tdist_pg_t *pg, struct tdist_work *w,
                                            int64_t timeout_ms, int64_t deadline_ms);

static tdist_status_t run_coll(tdist_pg_t *pg, struct tdist_work *w, int64_t deadline_ms)
{
    tdist__coll_ctx_t c = {.tp = pg->tp, .shm = pg->shm, .spin = w->inline_run,
                           .scratch = &pg->scratch,
                           .rank = pg->rank, .size = pg->size, .ar_forced = pg->ar_algo,
                           .deadline_ms = deadline_ms};
    if (pg->ar_forced && (w->op == TDIST__OP_ALL_REDUCE || w->op == TDIST__OP_ALL_REDUCE_COALESCED))
        c.shm = NULL;
    size_t es = tdist_dtype_size(w->dtype);
    /* Under a Join without divide_by_initial_world_size, AVG divides by the
     * ranks still active: reduce as SUM, divide here. */
    if (w->redop == TDIST_AVG && w->avg_div > 0 && w->avg_div != pg->size) {
        struct tdist_work sum = *w;
        sum.redop = TDIST_SUM;
        sum.avg_div = 0;
        TDIST_CHECK(run_coll(pg, &sum, deadline_ms));
        switch (w->op) {
        case TDIST__OP_ALL_REDUCE:
        case TDIST__OP_REDUCE_SCATTER:
            return tdist_divide(w->recvbuf, w->count, w->dtype, w->avg_div);
        case TDIST__OP_REDUCE:
            if (pg->rank != w->root) return TDIST_OK;
            return tdist_divide(w->recvbuf, w->count, w->dtype, w->avg_div);
        case TDIST__OP_ALL_REDUCE_COALESCED:
            for (size_t i = 0; i < w->nbufs; i++)
                TDIST_CHECK(tdist_divide(w->bufs[i], w->counts[i], w->dtype, w->avg_div));
            return TDIST_OK;
        default:
            return TDIST_OK;
        }
    }
    switch (w->op) {
    case TDIST__OP_BROADCAST:
        return tdist__coll_broadcast(&c, w->recvbuf, w->count, w->dtype, w->root);
    case TDIST__OP_ALL_REDUCE:
        return tdist__coll_all_reduce(&c, w->sendbuf, w->recvbuf, w->count, w->dtype, w->redop,
                                      w->premul, TDIST__AR_AUTO);
    case TDIST__OP_REDUCE:
        return tdist__coll_reduce(&c, w->sendbuf, w->recvbuf, w->count, w->dtype, w->redop,
                                  w->premul, w->root);
    case TDIST__OP_ALL_GATHER:
    case TDIST__OP_ALL_GATHERV:
        return tdist__coll_all_gatherv(&c, w->sendbuf, w->recvbuf, w->recvcounts, w->dtype);
    case TDIST__OP_GATHER:
        return tdist__coll_gather(&c, w->sendbuf, w->recvbuf, w->count, w->dtype, w->root);
    case TDIST__OP_SCATTER:
        return tdist__coll_scatter(&c, w->sendbuf, w->recvbuf, w->count, w->dtype, w->root);
    case TDIST__OP_REDUCE_SCATTER:
        return tdist__coll_reduce_scatter(&c, w->sendbuf, w->recvbuf, w->count, w->dtype,
                                          w->redop, w->premul);
    case TDIST__OP_ALL_TO_ALL:
    case TDIST__OP_ALL_TO_ALLV: {
        const void *sb = w->sendbuf;
        void *tmp = NULL;
        if (sb && sb == w->recvbuf) { /* in place: coll needs disjoint buffers */
            size_t tot = 0;
            for (int p = 0; p < pg->size; p++) tot += w->sendcounts[p];
            tmp = malloc(tot * es + 1);
            if (!tmp) return tdist__error(TDIST_ERR_NO_MEMORY, "out of memory (in-place copy)");
            memcpy(tmp, sb, tot * es);
            sb = tmp;
        }
        tdist_status_t st =
            tdist__coll_all_to_allv(&c, sb, w->sendcounts, w->recvbuf, w->recvcounts, w->dtype);
        free(tmp);
        return st;
    }
    case TDIST__OP_BARRIER:
        return tdist__coll_barrier(&c);
    case TDIST__OP_ALL_REDUCE_COALESCED:
        for (size_t i = 0; i < w->nbufs; i++)
            TDIST_CHECK(tdist__coll_all_reduce(&c, w->bufs[i], w->bufs[i], w->counts[i], w->dtype,
                                               w->redop, w->premul, TDIST__AR_AUTO));
        return TDIST_OK;
    case TDIST__OP_BROADCAST_COALESCED:
        for (size_t i = 0; i < w->nbufs; i++)
            TDIST_CHECK(tdist__coll_broadcast(&c, w->bufs[i], w->counts[i], w->dtype, w->root));
        return TDIST_OK;
    default:
        return tdist__error(TDIST_ERR_INTERNAL, "unknown collective %d", (int)w->op);
    }
}

/* A small all_reduce in one exchange: each rank sends every peer its
 * fingerprint followed by its (premul-scaled) input; receives every
 * peer's fingerprint, compares them all (a mismatch is reported before
 * any payload is read, the same on every rank), then receives the
 * payloads and reduces them in rank order (bit-identical everywhere).
 * Whether this path is taken depends only on fingerprint fields (op,
 * dtype, count), so ranks with equal fingerprints agree on it. */
static bool fused_eligible(const tdist_pg_t *pg, const struct tdist_work *w)
{
    return pg->check_fp && w->op == TDIST__OP_ALL_REDUCE && pg->size > 1 && w->count > 0 &&
           w->count * tdist_dtype_size(w->dtype) <= pg->fused_max;
}

static tdist_status_t run_fused_all_reduce(tdist_pg_t *pg, struct tdist_work *w,
                                           int64_t deadline_ms)
{
    int n = pg->size, me = pg->rank;
    size_t bytes = w->count * tdist_dtype_size(w->dtype), fps = sizeof(tdist__fp_t);
    tdist__fp_fill(pg, w);
    uint8_t *mine = pg->fused_out + fps;
    memcpy(pg->fused_out, &pg->fp_mine[0], fps);
    memcpy(mine, w->sendbuf, bytes);
    if (w->redop == TDIST_PREMUL_SUM) TDIST_CHECK(tdist_scale(mine, w->count, w->dtype, w->premul));
    int k = 0;
    for (int p = 0; p < n; p++) {
        if (p == me) continue;
        TDIST_CHECK(tdist__tp_post_send(pg->tp, &pg->fp_reqs[k], p, pg->fused_out, fps + bytes));
        pg->fp_reqp[k] = &pg->fp_reqs[k];
        k++;
        if (pg->fp_have == p) continue; /* already received (Join's shadowing) */
        TDIST_CHECK(tdist__tp_post_recv(pg->tp, &pg->fp_reqs[k], p, &pg->fp_theirs[p], fps));
        pg->fp_reqp[k] = &pg->fp_reqs[k];
        k++;
    }
    TDIST_CHECK(tdist__tp_wait(pg->tp, pg->fp_reqp, (size_t)k, deadline_ms));
    TDIST_CHECK(tdist__fp_compare(pg));
    k = 0;
    for (int p = 0; p < n; p++) {
        if (p == me) continue;
        TDIST_CHECK(tdist__tp_post_recv(pg->tp, &pg->fp_reqs[k], p,
                                        pg->fused_in + (size_t)p * pg->fused_max, bytes));
        pg->fp_reqp[k] = &pg->fp_reqs[k];
        k++;
    }
    TDIST_CHECK(tdist__tp_wait(pg->tp, pg->fp_reqp, (size_t)k, deadline_ms));
    uint8_t *acc = pg->fused_acc;
    memcpy(acc, me == 0 ? mine : pg->fused_in, bytes);
    for (int r = 1; r < n; r++) {
        const uint8_t *x = r == me ? mine : pg->fused_in + (size_t)r * pg->fused_max;
        TDIST_CHECK(tdist_reduce(acc, acc, x, w->count, w->dtype, w->redop));
    }
    if (w->redop == TDIST_AVG)
        TDIST_CHECK(tdist_divide(acc, w->count, w->dtype, w->avg_div > 0 ? w->avg_div : n));
    memcpy(w->recvbuf, acc, bytes);
    return TDIST_OK;
}

/* Shared-memory groups: every collective starts with a line exchange
 * (shm_coll.c) carrying the fingerprint — the check of rule 2 and a
 * barrier in one — and a tiny all_reduce's data with it, reduced in rank
 * order from the lines. all_to_allv's per-pair counts still go through
 * the transport's exchange. */
/* The line carries a 64-bit hash of the fingerprint's common part, so a
 * tiny all_reduce's data shares its first cache line; the whole
 * fingerprint rides in the line's aux part, read only to word a mismatch
 * (two different fingerprints with one hash: about 2^-64). */
#define SHM_TINY_MAX (TDIST__SHMC_BLOB_MAX - sizeof(uint64_t))

static bool shm_tiny(const tdist_pg_t *pg, const struct tdist_work *w)
{
    return w->op == TDIST__OP_ALL_REDUCE && !pg->ar_forced && w->count > 0 &&
           w->count * tdist_dtype_size(w->dtype) <= SHM_TINY_MAX;
}

/* Above that and up to this size an all_reduce goes in one shot through
 * the staging slots (coll.h): one wait instead of the staged protocol's
 * three, each rank reducing everything. That pays most when ranks share
 * CPUs (every wait a yield); with a CPU each, the staged protocol's split
 * of the work wins sooner. Measured on 2 vCPUs (docs/pg.md). Both
 * depend only on what every rank agrees on (the fingerprint, the
 * group). */
#ifndef TDIST_SHM_SMALL_MAX
#define TDIST_SHM_SMALL_MAX (2u * 1024u)
#endif
#ifndef TDIST_SHM_SMALL_MAX_OVERSUB
#define TDIST_SHM_SMALL_MAX_OVERSUB (8u * 1024u)
#endif

static bool shm_small(const tdist_pg_t *pg, const struct tdist_work *w)
{
    size_t bytes = w->count * tdist_dtype_size(w->dtype);
    size_t max = tdist__tp_oversubscribed(pg->tp) ? TDIST_SHM_SMALL_MAX_OVERSUB
                                                  : TDIST_SHM_SMALL_MAX;
    return w->op == TDIST__OP_ALL_REDUCE && !pg->ar_forced && w->redop != TDIST_PREMUL_SUM &&
           bytes > SHM_TINY_MAX && bytes <= TDIST_MIN(max, tdist__shmc_small_max());
}

/* A tiny broadcast rides in the root's line the same way. */
static bool shm_tiny_bcast(const struct tdist_work *w)
{
    return w->op == TDIST__OP_BROADCAST && w->count > 0 &&
           w->count * tdist_dtype_size(w->dtype) <= SHM_TINY_MAX;
}

/* The line's 64-bit stand-in for a fingerprint: sum of its words, each
 * times its own odd constant. A difference in any one word always changes
 * it (an odd multiplier is invertible mod 2^64); differences in several
 * cancel with probability about 2^-64. The multiplies are independent, so
 * it costs a few cycles of latency, not a chain of ten. */
static const uint64_t fp_mult[] = {
    0x3cc04026ff2218f3ull, 0xb1545fbc0781bf83ull, 0x21414522c6e07da7ull,
    0x0ace59957aa4a9a1ull, 0x9ef717a4709e7127ull, 0x5acaf58aab68ce59ull,
    0xb48043a646d31849ull, 0x1e926c902f1af58bull, 0x524cff5480dd4c83ull,
    0x8f872a6532f12893ull,
};
#define FP_SEQ_WORD 2 /* w[] below: seq's word, so hash(seq) = hash(0) + seq * fp_mult[2] */

static uint64_t fp_hash(const tdist__fp_t *fp)
{
    _Static_assert(sizeof(tdist__fp_t) == sizeof fp_mult, "one constant per fingerprint word");
    /* from the fields, not the bytes: a word load spanning two 4-byte
     * stores just made would stall on store forwarding */
    const uint64_t w[] = {
        fp->magic | (uint64_t)fp->op << 32,
        fp->uid_hash,
        fp->seq, /* w[FP_SEQ_WORD]: the tiny fast path adds its term alone */
        fp->count,
        fp->vec_hash,
        fp->aux,
        (uint32_t)fp->dtype | (uint64_t)(uint32_t)fp->root << 32,
        (uint32_t)fp->redop | (uint64_t)fp->flags << 32,
        fp->send_to_you,
        fp->recv_from_you,
    };
    _Static_assert(sizeof w == sizeof fp_mult, "every field");
    uint64_t h = 0;
    for (size_t i = 0; i < sizeof w / sizeof w[0]; i++) h += w[i] * fp_mult[i];
    return h;
}

/* The hash at the head of a rank's blob (one load, not a memcmp call). */
static inline uint64_t line_hash(const uint8_t *blob)
{
    uint64_t v;
    memcpy(&v, blob, sizeof v);
    return v;
}

/* out = op over every rank's tiny payload (after the blob's hash), in
 * rank order, as every rank does: the same bits everywhere. */
static void reduce_lines(const uint8_t *const *b, int size, void *out, size_t count,
                         tdist_dtype_t dtype, tdist_redop_t op)
{
    const size_t hs = sizeof(uint64_t);
    tdist__reduce_unchecked(out, b[0] + hs, b[1] + hs, count, dtype, op);
    for (int r = 2; r < size; r++) tdist__reduce_unchecked(out, out, b[r] + hs, count, dtype, op);
}

/* The fingerprint hashes in this exchange's blobs differ: word the
 * mismatch from every rank's whole fingerprint (aux parts). */
static tdist_status_t shm_mismatch(tdist_pg_t *pg, const tdist__coll_ctx_t *c,
                                   const struct tdist_work *w)
{
    size_t fps = sizeof(tdist__fp_t);
    tdist__fp_fill(pg, w);
    for (int r = 0; r < pg->size; r++) {
        size_t al = 0;
        const uint8_t *aux = tdist__shmc_peek_aux(c, r, &al);
        memset(&pg->fp_theirs[r], 0, fps);
        if (aux) memcpy(&pg->fp_theirs[r], aux, TDIST_MIN(al, fps));
    }
    TDIST_CHECK(tdist__fp_compare(pg));
    /* equal fingerprints, different hashes: cannot happen */
    return tdist__error(TDIST_ERR_INTERNAL, "fingerprint hashes differ, fingerprints do not");
}

static tdist_status_t run_shm(tdist_pg_t *pg, struct tdist_work *w, int64_t deadline_ms)
{
    tdist__coll_ctx_t c = {.tp = pg->tp, .shm = pg->shm, .spin = w->inline_run,
                           .scratch = &pg->scratch,
                           .rank = pg->rank, .size = pg->size, .ar_forced = pg->ar_algo,
                           .deadline_ms = deadline_ms};
    const size_t hs = sizeof(uint64_t), fps = sizeof(tdist__fp_t);
    size_t es = tdist_dtype_size(w->dtype), bytes = w->count * es, len = hs;
    /* the exchange line is written in place: the fingerprint into its aux
     * part, its hash and a tiny payload into the blob every rank reads */
    uint8_t *aux = NULL, *blob = tdist__shmc_begin(&c, &aux);
    tdist__fp_t fp;
    tdist__fp_common(w, pg->uid_hash, &fp);
    uint64_t h = pg->check_fp ? fp_hash(&fp) : 0;
    memcpy(aux, &fp, fps);
    memcpy(blob, &h, hs);
    bool tiny = shm_tiny(pg, w);
    if (tiny) {
        memcpy(blob + hs, w->sendbuf, bytes);
        if (w->redop == TDIST_PREMUL_SUM)
            TDIST_CHECK(tdist_scale(blob + hs, w->count, w->dtype, w->premul));
        len += bytes;
    }
    bool tiny_bcast = shm_tiny_bcast(w);
    if (tiny_bcast && pg->rank == w->root) {
        memcpy(blob + hs, w->recvbuf, bytes);
        len += bytes;
    }
    bool small = shm_small(pg, w);
    if (small) TDIST_CHECK(tdist__shmc_stage_small(&c, w->sendbuf, bytes));
    tdist__shmc_post(&c, len, fps);
    /* Only rank 0 collects a monitored barrier (over the transport, to
     * name who is missing); the line just keeps every rank's exchange
     * count and shows this call to a rank that issued something else. */
    if (w->op == TDIST__OP_MONITORED_BARRIER) return TDIST_OK;
    const uint8_t **b = pg->shm_blobs;
    TDIST_CHECK(tdist__shmc_gather(&c, b, NULL));
    if (pg->check_fp) {
        for (int r = 0; r < pg->size; r++)
            if (line_hash(b[r]) != h) return shm_mismatch(pg, &c, w);
        if (w->op == TDIST__OP_ALL_TO_ALLV) TDIST_CHECK(tdist__fp_exchange(pg, w, deadline_ms));
    }
    if (w->op == TDIST__OP_BARRIER) return TDIST_OK;
    if (tiny_bcast) {
        if (pg->rank != w->root) memcpy(w->recvbuf, b[w->root] + hs, bytes);
        return TDIST_OK;
    }
    if (!tiny && !small) return run_coll(pg, w, deadline_ms);
    /* in rank order, as every rank does: the same bits everywhere */
    void *out = w->recvbuf;
    if (small) {
        tdist__shmc_reduce_small(&c, out, w->count, w->dtype, w->redop);
    } else {
        reduce_lines(b, pg->size, out, w->count, w->dtype, w->redop);
    }
    if (w->redop == TDIST_AVG)
        TDIST_CHECK(tdist_divide(out, w->count, w->dtype, w->avg_div > 0 ? w->avg_div : pg->size));
    return TDIST_OK;
}

bool tdist__pg_tiny_all_reduce(tdist_pg_t *pg, const void *sendbuf, void *recvbuf, size_t count,
                               tdist_dtype_t dtype, tdist_redop_t op, int64_t timeout_ms,
                               tdist_status_t *out)
{
    const size_t hs = sizeof(uint64_t), fps = sizeof(tdist__fp_t);
    size_t bytes = count * tdist_dtype_size(dtype);
    /* what run_shm's tiny branch does, minus the work (shm groups have 2
     * ranks or more); anything else (a scale factor, a Join's divisor and
     * shadowing, a forced algorithm) takes the general path */
    if (!pg->shm || !pg->tp || pg->backend || pg->hier || pg->ar_forced || count == 0 ||
        bytes > SHM_TINY_MAX || op == TDIST_PREMUL_SUM)
        return false;
    pthread_mutex_lock(&pg->mu);
    if (pg->join_mode != TDIST__JOIN_NONE || pg->head || pg->busy || pg->err != TDIST_OK ||
        atomic_load(&pg->aborted) || atomic_load(&pg->failed)) {
        pthread_mutex_unlock(&pg->mu);
        return false;
    }
    uint64_t seq = ++pg->next_seq;
    pg->busy = true;
    pthread_mutex_unlock(&pg->mu);
    seq += pg->seq_shift; /* as run_work does */
    /* (no tdist_clear_error: every failure below sets its own message) */

    tdist__coll_ctx_t c = {.tp = pg->tp, .shm = pg->shm, .spin = true, .scratch = &pg->scratch,
                           .rank = pg->rank, .size = pg->size, .ar_forced = pg->ar_algo};
    uint8_t *aux = NULL, *blob = tdist__shmc_begin(&c, &aux);
    /* A call of the last one's shape (a training loop's loss, a norm)
     * reuses its fingerprint and hash: only seq's term changes, as the
     * hash is a sum of one term per word. */
    tdist__fp_t *fp = &pg->tiny_fp;
    if (fp->magic != TDIST__FP_MAGIC || fp->count != count || fp->dtype != (int32_t)dtype ||
        fp->redop != (int32_t)op) {
        tdist__fp_init(fp, TDIST__OP_ALL_REDUCE, pg->uid_hash, 0, dtype, -1, op, count, 0);
        pg->tiny_h0 = fp_hash(fp);
    }
    fp->seq = seq;
    /* TDIST_CHECK_FINGERPRINT=0 (a measurement switch): no hash, no
     * comparison; the fingerprint itself stays in aux, as Join reads it */
    uint64_t h = pg->check_fp ? pg->tiny_h0 + seq * fp_mult[FP_SEQ_WORD] : 0;
    memcpy(aux, fp, fps);
    memcpy(blob, &h, hs);
    memcpy(blob + hs, sendbuf, bytes);
    tdist__shmc_post(&c, hs + bytes, fps);
    /* one wait: its timeout starts when it stops spinning, so peers that
     * are already there cost no clock read */
    int64_t tmo = timeout_ms >= 0 ? timeout_ms : pg->timeout_ms;
    c.deadline_ms = tmo;
    c.lazy_deadline = true;
    const uint8_t **b = pg->shm_blobs;
    tdist_status_t st = tdist__shmc_gather(&c, b, NULL);
    bool same = true;
    for (int r = 0; st == TDIST_OK && pg->check_fp && r < pg->size && same; r++)
        same = line_hash(b[r]) == h;
    if (st == TDIST_OK && same) {
        reduce_lines(b, pg->size, recvbuf, count, dtype, op);
        if (op == TDIST_AVG) st = tdist_divide(recvbuf, count, dtype, pg->size);
    }
    char *msg = NULL;
    if (st != TDIST_OK || !same) { /* the work only words the failure */
        struct tdist_work sw, *w = tdist__work_on_stack(&sw, TDIST__OP_ALL_REDUCE, NULL, NULL);
        w->sendbuf = sendbuf;
        w->recvbuf = recvbuf;
        w->count = count;
        w->dtype = dtype;
        w->redop = op;
        w->nranks = pg->size;
        w->seq = seq;
        w->timeout_ms = timeout_ms;
        c.deadline_ms = tdist__deadline_ms(tmo); /* shm_mismatch may wait again */
        c.lazy_deadline = false;
        if (st == TDIST_OK) st = shm_mismatch(pg, &c, w);
        pg->fp_have = -1;
        st = work_failed(pg, w, st, &msg);
        work_free_owned(w);
    }
    end_inline(pg);
    if (st != TDIST_OK) {
        tdist__error(st, "%s", msg ? msg : "out of memory");
        free(msg);
    }
    *out = st;
    return true;
}

tdist_status_t tdist__pg_run_body(tdist_pg_t *pg, struct tdist_work *w, int64_t timeout_ms,
                                  int64_t deadline_ms)
{
    tdist_status_t st;
    if (pg->backend) return pg->backend->run(pg, w, timeout_ms, deadline_ms); /* backend/ */
    if (pg->hier && pg->tp && tdist__pg_hier_eligible(pg, w)) {
        st = tdist__pg_hier_run(pg, w, deadline_ms);
    } else if (pg->shm && pg->tp) {
        st = run_shm(pg, w, deadline_ms);
        if (st == TDIST_OK && w->op == TDIST__OP_MONITORED_BARRIER)
            st = run_monitored_barrier(pg, w, timeout_ms, deadline_ms);
    } else if (!pg->tp) {
        st = tdist__error(TDIST_ERR_CONNECTION, "the group's mesh is closed");
    } else if (w->op == TDIST__OP_MONITORED_BARRIER) {
        st = run_monitored_barrier(pg, w, timeout_ms, deadline_ms);
    } else if (fused_eligible(pg, w)) {
        st = run_fused_all_reduce(pg, w, deadline_ms);
    } else {
        st = pg->check_fp ? tdist__fp_exchange(pg, w, deadline_ms) : TDIST_OK;
        if (st == TDIST_OK) st = run_coll(pg, w, deadline_ms);
    }
    return st;
}

/* "rank 0 group world seq 7 all_reduce(f32, 2, sum)": the head of every
 * message about w. Built only when there is something to report (it
 * costs more than a tiny collective). */
static void work_prefix(const tdist_pg_t *pg, const struct tdist_work *w, char *buf, size_t n)
{
    char d[200];
    tdist__work_describe(w, d, sizeof d);
    snprintf(buf, n, "rank %d group %s seq %llu %s", pg->rank, pg->name,
             (unsigned long long)w->seq, d);
}

/* Run w; its status, and on failure *msg (malloc'd, caller frees; NULL
 * when out of memory) says why. */
static tdist_status_t run_work_status(tdist_pg_t *pg, struct tdist_work *w, char **msg)
{
    char prefix[400];
    *msg = NULL;
    if (atomic_load(&pg->aborted)) {
        work_prefix(pg, w, prefix, sizeof prefix);
        *msg = tdist__asprintf("%s: the group was aborted", prefix);
        return TDIST_ERR_ABORTED;
    }
    char *sticky = NULL;
    tdist_status_t st = atomic_load(&pg->failed) ? tdist__pg_sticky(pg, &sticky) : TDIST_OK;
    if (st != TDIST_OK) {
        work_prefix(pg, w, prefix, sizeof prefix);
        *msg = tdist__asprintf("%s: the group failed earlier: %s", prefix, sticky);
        free(sticky);
        return st;
    }
    int64_t timeout = w->timeout_ms >= 0 ? w->timeout_ms : pg->timeout_ms;
    int64_t deadline = tdist__deadline_ms(timeout);
    tdist_clear_error();
    /* shadow collectives run on a joined rank took sequence numbers */
    w->seq += pg->seq_shift;
    if (w->shadow_leader >= 0) st = tdist__pg_shadow_until(pg, w, deadline);
    if (st == TDIST_OK) st = tdist__pg_run_body(pg, w, timeout, deadline);
    pg->fp_have = -1;
    if (st == TDIST_OK) return TDIST_OK;
    return work_failed(pg, w, st, msg);
}

/* w (which has run) failed with st, tdist_last_error() saying why: record
 * the group's failure (tdist__pg_fail); *msg the whole message. */
static tdist_status_t work_failed(tdist_pg_t *pg, const struct tdist_work *w, tdist_status_t st,
                                  char **msg)
{
    char prefix[400];
    work_prefix(pg, w, prefix, sizeof prefix);
    if (atomic_load(&pg->aborted) && st != TDIST_ERR_MISMATCH) st = TDIST_ERR_ABORTED;
    char *cause = tdist__strdup(st == TDIST_ERR_ABORTED && !tdist_last_error()[0]
                                    ? "the group was aborted"
                                    : tdist_last_error());
    if (st == TDIST_ERR_ABORTED && atomic_load(&pg->aborted)) {
        free(cause);
        cause = tdist__asprintf("the group was aborted (tdist_pg_abort or destroy) on rank %d",
                                pg->rank);
    }
    *msg = tdist__pg_fail(pg, st, prefix, cause ? cause : "unknown cause");
    TDIST_LOGD("%s", *msg ? *msg : prefix);
    if (!*msg) *msg = tdist__strdup(prefix);
    free(cause);
    return st;
}

static void run_work(tdist_pg_t *pg, struct tdist_work *w)
{
    char *msg = NULL;
    tdist_status_t st = run_work_status(pg, w, &msg);
    tdist__work_finish(w, st, msg);
    free(msg);
}

static void *engine_main(void *arg)
{
    tdist_pg_t *pg = arg;
    pthread_mutex_lock(&pg->mu);
    for (;;) {
        while ((!pg->head || pg->busy) && !(pg->stop && !pg->busy))
            pthread_cond_wait(&pg->cv, &pg->mu);
        struct tdist_work *w = pg->head;
        if (!w) break; /* stop, queue drained */
        pg->head = w->next;
        if (!pg->head) pg->tail = NULL;
        w->next = NULL;
        pg->busy = true;
        pthread_mutex_unlock(&pg->mu);
        run_work(pg, w);
        pthread_mutex_lock(&pg->mu);
        pg->busy = false;
    }
    pthread_mutex_unlock(&pg->mu);
    return NULL;
}

tdist_status_t tdist__pg_start_engine(tdist_pg_t *pg)
{
    int rc = pthread_create(&pg->engine, NULL, engine_main, pg);
    if (rc != 0) return tdist__error_errno(rc, "group %s: cannot start the engine thread", pg->name);
    pg->engine_started = true;
    return TDIST_OK;
}

void tdist__pg_stop_engine(tdist_pg_t *pg)
{
    if (!pg->engine_started) return;
    pthread_mutex_lock(&pg->mu);
    pg->stop = true;
    pthread_cond_broadcast(&pg->cv);
    pthread_mutex_unlock(&pg->mu);
    pthread_join(pg->engine, NULL);
    pg->engine_started = false;
}

/* --------------------------------------------------------- monitored barrier */

typedef struct mb_reply {
    int32_t status;
    char msg[508];
} mb_reply_t;

/* Ranks other than 0: arrive at rank 0 (the fingerprint), then wait for
 * its verdict (a little longer than the deadline, so rank 0's report of
 * the missing ranks arrives). */
static tdist_status_t mb_arrive(tdist_pg_t *pg, int64_t timeout_ms, int64_t deadline_ms)
{
    mb_reply_t rep;
    memset(&rep, 0, sizeof rep);
    tdist__tp_req_t s, r;
    tdist__tp_req_t *rs[2] = {&s, &r};
    TDIST_CHECK(tdist__tp_post_send(pg->tp, &s, 0, &pg->fp_mine[0], sizeof(tdist__fp_t)));
    TDIST_CHECK(tdist__tp_post_recv(pg->tp, &r, 0, &rep, sizeof rep));
    int64_t dl = deadline_ms == INT64_MAX ? INT64_MAX : deadline_ms + 2000;
    tdist_status_t st = tdist__tp_wait(pg->tp, rs, 2, dl);
    if (st == TDIST_ERR_TIMEOUT)
        return tdist__error(TDIST_ERR_TIMEOUT,
                            "monitored_barrier: rank 0 (the monitor) did not answer within "
                            "%lld ms",
                            (long long)timeout_ms);
    TDIST_CHECK(st);
    rep.msg[sizeof rep.msg - 1] = '\0';
    if (rep.status != TDIST_OK) return tdist__error((tdist_status_t)rep.status, "%s", rep.msg);
    return TDIST_OK;
}

/* Rank 0's verdict into *rep: the ranks that did not arrive (st, the
 * collection's status, not OK), else the first fingerprint that differs
 * from rank 0's. */
static void mb_verdict(tdist_pg_t *pg, tdist_status_t st, const bool *present, int64_t timeout_ms,
                       mb_reply_t *rep)
{
    int n = pg->size;
    if (st != TDIST_OK) {
        char list[200] = "";
        int missing = 0;
        for (int p = 1; p < n; p++) {
            if (present[p]) continue;
            size_t l = strlen(list);
            snprintf(list + l, sizeof list - l, "%s%d", missing ? ", " : "", p);
            missing++;
        }
        char cause[400];
        snprintf(cause, sizeof cause, "%.300s", tdist_last_error());
        if (st == TDIST_ERR_TIMEOUT)
            snprintf(rep->msg, sizeof rep->msg,
                     "monitored_barrier: rank%s %s did not arrive within %lld ms",
                     missing == 1 ? "" : "s", list, (long long)timeout_ms);
        else
            snprintf(rep->msg, sizeof rep->msg, "monitored_barrier: rank%s %s did not arrive (%.150s)",
                     missing == 1 ? "" : "s", list, cause);
        rep->status = st;
        return;
    }
    for (int p = 1; p < n && rep->status == TDIST_OK; p++) {
        if (tdist__fp_common_equal(&pg->fp_mine[0], &pg->fp_theirs[p])) continue;
        char a[160], b[160];
        tdist__fp_describe(&pg->fp_mine[0], false, a, sizeof a);
        tdist__fp_describe(&pg->fp_theirs[p], false, b, sizeof b);
        snprintf(rep->msg, sizeof rep->msg, "collective mismatch: rank 0 %s vs rank %d %s", a, p, b);
        rep->status = TDIST_ERR_MISMATCH;
    }
}

/* Rank 0 sends its verdict to every present rank (bounded by 1 s): the
 * send's status. */
static tdist_status_t mb_tell(tdist_pg_t *pg, const bool *present, const mb_reply_t *rep)
{
    size_t nn = (size_t)(unsigned)pg->size;
    tdist__tp_req_t *sreqs = calloc(nn, sizeof *sreqs);
    tdist__tp_req_t **sp = calloc(nn, sizeof *sp);
    tdist_status_t st = TDIST_OK;
    if (sreqs && sp) {
        size_t k = 0;
        for (int p = 1; p < pg->size; p++) {
            if (!present[p]) continue;
            if (tdist__tp_post_send(pg->tp, &sreqs[k], p, rep, sizeof *rep) != TDIST_OK) break;
            sp[k] = &sreqs[k];
            k++;
        }
        st = tdist__tp_wait(pg->tp, sp, k, tdist__deadline_ms(1000));
    }
    free(sreqs);
    free(sp);
    return st;
}

static tdist_status_t run_monitored_barrier(tdist_pg_t *pg, struct tdist_work *w,
                                            int64_t timeout_ms, int64_t deadline_ms)
{
    int n = pg->size;
    if (n == 1) return TDIST_OK;
    tdist__fp_fill(pg, w);
    if (pg->rank != 0) return mb_arrive(pg, timeout_ms, deadline_ms);
    int k = 0;
    for (int p = 1; p < n; p++) {
        TDIST_CHECK(tdist__tp_post_recv(pg->tp, &pg->fp_reqs[k], p, &pg->fp_theirs[p],
                                        sizeof(tdist__fp_t)));
        pg->fp_reqp[k] = &pg->fp_reqs[k];
        k++;
    }
    tdist_status_t st = tdist__tp_wait(pg->tp, pg->fp_reqp, (size_t)k, deadline_ms);
    bool *present = calloc((size_t)(unsigned)n, sizeof *present);
    if (!present) return tdist__error(TDIST_ERR_NO_MEMORY, "monitored_barrier: out of memory");
    present[0] = true;
    for (int p = 1; p < n; p++) present[p] = tdist__tp_req_done(&pg->fp_reqs[p - 1]) &&
                                             tdist__tp_req_status(&pg->fp_reqs[p - 1]) == TDIST_OK;
    mb_reply_t rep;
    memset(&rep, 0, sizeof rep);
    mb_verdict(pg, st, present, timeout_ms, &rep);
    /* tell every present rank (if the mesh still works) */
    if (st == TDIST_OK || st == TDIST_ERR_TIMEOUT) {
        tdist_status_t st2 = mb_tell(pg, present, &rep);
        if (st == TDIST_OK && st2 != TDIST_OK) st = st2;
        if (st != TDIST_OK && rep.status == TDIST_OK) {
            free(present);
            return st;
        }
    }
    free(present);
    if (rep.status != TDIST_OK) return tdist__error((tdist_status_t)rep.status, "%s", rep.msg);
    return TDIST_OK;
}
