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
#include "init/internal.h" /* tdist__world_note_failure */
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
    w->fr_id = UINT64_MAX;
    w->premul = opts ? opts->premul_factor : 1.0;
    w->timeout_ms = opts ? opts->timeout_ms : -1;
    w->on_complete = opts ? opts->on_complete : NULL;
    w->user_data = opts ? opts->user_data : NULL;
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
    /* A collective: the fields work_init does not set, one by one (a
     * memset of the part, or a compound literal of the arguments,
     * compiles to a rep stos: tens of cycles on the latency path of a
     * small all_reduce); the p2p part stays unset, but for p2p_msg. */
    w->msg = NULL;
    w->next = NULL;
    w->seq = 0;
    w->sendbuf = NULL;
    w->recvbuf = NULL;
    w->count = 0;
    w->dtype = TDIST_F32;
    w->redop = TDIST_SUM;
    w->sendcounts = w->recvcounts = NULL;
    w->bufs = NULL;
    w->counts = NULL;
    w->nbufs = 0;
    w->avg_div = 0;
    w->nranks = 0;
    w->fr_t0 = 0;
    w->fr_deferred = w->fr_picked = false;
    w->deadline_ms = 0;
    w->inline_run = false;
    w->in_join = false;
    w->fp_flags = 0;
    w->fp_override = NULL;
    w->p2p_msg = NULL;
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

void tdist__work_shift_seq(struct tdist_work *w, uint64_t by)
{
    if (w->inline_run) { /* the caller's thread runs it: no other reader (and a stack work has no mu) */
        w->seq += by;
        return;
    }
    pthread_mutex_lock(&w->mu);
    w->seq += by;
    pthread_mutex_unlock(&w->mu);
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
        if (st == TDIST_INPROGRESS) { /* still running: its seq may move (Join shadowing) */
            char d[200];
            tdist__work_describe(w, d, sizeof d);
            unsigned long long seq = (unsigned long long)w->seq;
            pthread_mutex_unlock(&w->mu);
            return tdist__error(TDIST_ERR_TIMEOUT,
                                "tdist_work_wait: %s seq %llu did not complete within %lld ms "
                                "(it goes on)", d, seq, (long long)timeout_ms);
        }
        pthread_mutex_unlock(&w->mu);
    }
    if (st != TDIST_OK) return tdist__error((tdist_status_t)st, "%s", w->msg ? w->msg : "");
    return TDIST_OK;
}

void tdist_work_free(tdist_work_t *w) { tdist__work_release(w); }

tdist_status_t tdist__work_hand_over(struct tdist_work *w, tdist_work_t **work)
{
    if (work) {
        *work = w;
        return TDIST_OK;
    }
    tdist_status_t st = tdist_work_wait(w, -1);
    tdist__work_release(w);
    return st;
}

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

char *tdist__pg_fail(tdist_pg_t *pg, tdist_status_t st, const char *prefix, const char *where,
                     const char *cause, int64_t deadline_ms)
{
    char *root = NULL;
    if (st != TDIST_ERR_MISMATCH && pg->store && pg->size > 1 && !pg->chk.store_silent) {
        /* First failure of the group wins; everyone reads the winner. A
         * stopped or unreachable store host must not hold the failure up:
         * the failure path ends 0.8 s past the collective's deadline at
         * the latest (the wait chain's grace included), and once the store
         * has not answered the wait chain it is not asked again. */
        char key[300];
        snprintf(key, sizeof key, "pg/%s/failure", pg->uid);
        char *mine = tdist__asprintf("rank %d (world rank %d) %s: %s", pg->rank,
                                     pg->wranks[pg->rank], where, cause);
        void *cur = NULL;
        size_t cur_len = 0;
        int64_t now = tdist__now_ms();
        tdist_store_bound_thread(TDIST_MAX(deadline_ms + 800, now + 50) - now);
        tdist_status_t cst = mine ? tdist_store_compare_set(pg->store, key, NULL, 0, mine,
                                                            strlen(mine), &cur, &cur_len)
                                  : TDIST_ERR_NO_MEMORY;
        tdist_store_bound_thread(-1);
        if (cst == TDIST_OK && cur) {
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
    tdist__world_note_failure(pg->world);
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
static inline tdist_status_t run_work_status(tdist_pg_t *pg, struct tdist_work *w, char **msg);

/* ------------------------------------------------------------------ gate
 *
 * pg->gate orders the group's works without the lock on the latency
 * path. Its bits (pg/internal.h): RUN while a work runs (the engine's, or
 * one on its caller's thread), QUEUED while the queue holds works (set by
 * the submit that queues, cleared by the engine when it takes the last;
 * both under mu), SLOW while every submit must look at the group under
 * mu (a Join is active), and above them the last sequence number. A
 * submit takes its sequence number and its place in one atomic update,
 * so numbers follow the order works run in:
 *  - fast path (a blocking call without a callback): one compare-and-swap
 *    from a gate with none of the three bits takes the next number and
 *    RUN; the call runs on the caller's thread and clears RUN;
 *  - locked path (anything else, and the fast path's fallback): under mu,
 *    the next number and QUEUED (the work goes to the queue), or RUN when
 *    the group is idle and the call may run inline.
 * The engine sets RUN (under mu) only when no one holds it. Whoever
 * clears RUN while QUEUED is set wakes the engine (under mu, so the wake
 * cannot fall between the engine's check and its wait). */

#define GATE_SEQ1 ((uint64_t)1 << TDIST__GATE_SEQ_SHIFT)

void tdist__pg_gate_slow(tdist_pg_t *pg, bool on)
{
    if (!on && pg->stop) return; /* stopping keeps SLOW: the engine must be woken */
    if (on)
        atomic_fetch_or(&pg->gate, TDIST__GATE_SLOW);
    else
        atomic_fetch_and(&pg->gate, ~(uint64_t)TDIST__GATE_SLOW);
}

/* Fast path: w's seq and RUN, if the group is idle (false if not). */
static inline bool gate_enter_idle(tdist_pg_t *pg, struct tdist_work *w)
{
    uint64_t g = atomic_load_explicit(&pg->gate, memory_order_relaxed);
    const uint64_t busy = TDIST__GATE_RUN | TDIST__GATE_QUEUED | TDIST__GATE_SLOW;
    if ((g & busy) || !atomic_compare_exchange_strong_explicit(&pg->gate, &g,
                                                               g + GATE_SEQ1 + TDIST__GATE_RUN,
                                                               memory_order_acquire,
                                                               memory_order_relaxed))
        return false;
    w->seq = (g >> TDIST__GATE_SEQ_SHIFT) + 1;
    return true;
}

/* Locked path (mu held): w's seq, and RUN when it may run now (*run_now:
 * may_run and the group idle), else QUEUED when it is to be queued
 * (queue). false, having taken nothing, when w lives on the caller's
 * stack and the group is busy: it must move to the heap first. */
static bool gate_take_locked(tdist_pg_t *pg, struct tdist_work *w, bool may_run, bool queue,
                             bool *run_now)
{
    uint64_t g = atomic_load_explicit(&pg->gate, memory_order_relaxed), n;
    do {
        *run_now = may_run && !(g & (TDIST__GATE_RUN | TDIST__GATE_QUEUED));
        if (!*run_now && queue && w->on_stack) return false;
        n = g + GATE_SEQ1;
        if (*run_now)
            n |= TDIST__GATE_RUN;
        else if (queue)
            n |= TDIST__GATE_QUEUED;
    } while (!atomic_compare_exchange_weak_explicit(&pg->gate, &g, n, memory_order_acq_rel,
                                                    memory_order_relaxed));
    w->seq = (g >> TDIST__GATE_SEQ_SHIFT) + 1;
    return true;
}

/* A work run on the caller's thread is over: the engine may go on. */
static void end_inline(tdist_pg_t *pg)
{
    uint64_t g = atomic_fetch_and_explicit(&pg->gate, ~(uint64_t)TDIST__GATE_RUN,
                                           memory_order_release);
    /* Only the engine waits on cv, and only for queued work (or the stop,
     * which sets SLOW): waking it after every inline call would cost a
     * context switch. */
    if (!(g & (TDIST__GATE_QUEUED | TDIST__GATE_SLOW))) return;
    pthread_mutex_lock(&pg->mu);
    if (pg->head || pg->stop) pthread_cond_broadcast(&pg->cv);
    pthread_mutex_unlock(&pg->mu);
}

/* A copy of stack work w on the heap (w's arrays move to it), or NULL. */
static struct tdist_work *to_heap(struct tdist_work *w)
{
    struct tdist_work *h = work_alloc();
    if (!h) return NULL;
    /* the collective part (a stack work leaves the p2p part unset; h's is zero) */
    memcpy(&h->refs, &w->refs, offsetof(struct tdist_work, hdr) - offsetof(struct tdist_work, refs));
    h->on_stack = false;
    return h;
}

/* w, which holds RUN and its seq, runs on the caller's thread; the call's
 * status. */
static tdist_status_t run_inline(tdist_pg_t *pg, struct tdist_work *w)
{
    w->inline_run = true;
    tdist_status_t st = TDIST_OK;
    char *msg = NULL;
    if (w->on_stack) /* nobody else sees it: no finish, no wake-up */
        st = run_work_status(pg, w, &msg);
    else
        run_work(pg, w);
    end_inline(pg);
    if (w->on_stack) {
        if (__builtin_expect(st != TDIST_OK, 0)) {
            tdist__error(st, "%s", msg ? msg : "out of memory");
            free(msg);
        }
        work_free_owned(w); /* a stack work: its storage is the caller's */
        return st;
    }
    st = tdist_work_wait(w, -1);
    tdist__work_release(w);
    return st;
}

tdist_status_t tdist__pg_submit(tdist_pg_t *pg, struct tdist_work *w, tdist_work_t **work)
{
    w->nranks = pg->size;
    /* A blocking call without a callback on an idle group runs at once on
     * the caller's thread: same order (nothing is queued or running), no
     * lock and no thread hand-off on the latency path. */
    if (w->on_stack && gate_enter_idle(pg, w)) {
        tdist__pg_fr_defer(pg, w);
        return run_inline(pg, w);
    }
    pthread_mutex_lock(&pg->mu);
    tdist_status_t st;
    char *why;
    bool run_now;
    for (;;) {
        if (pg->join.mode != TDIST__JOIN_NONE) {
            w->in_join = true;
            tdist_status_t jst = tdist__pg_join_check(pg, w);
            if (jst != TDIST_OK) {
                pthread_mutex_unlock(&pg->mu);
                atomic_store(&w->refs, 1);
                tdist__work_release(w);
                return jst;
            }
        }
        st = TDIST_OK;
        why = NULL;
        if (atomic_load(&pg->aborted)) {
            st = TDIST_ERR_ABORTED;
        } else if (pg->err != TDIST_OK) {
            st = pg->err;
            why = tdist__strdup(pg->errmsg);
        }
        bool may_run = st == TDIST_OK && !work && !w->on_complete;
        if (gate_take_locked(pg, w, may_run, st == TDIST_OK, &run_now)) break;
        /* it will wait in the queue, past this call's frame on other
         * threads' stacks: move it to the heap, and look again */
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
    tdist__pg_fr_queue(pg, w, TDIST__FR_COLL);
    if (st == TDIST_OK && !run_now) {
        if (pg->tail)
            pg->tail->next = w;
        else
            pg->head = w;
        pg->tail = w;
        pthread_cond_broadcast(&pg->cv);
    }
    pthread_mutex_unlock(&pg->mu);
    if (run_now) return run_inline(pg, w);
    if (st != TDIST_OK) {
        tdist__pg_fr_end(pg, w, st);
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
    return tdist__work_hand_over(w, work);
}

/* --------------------------------------------------------------- running */

void tdist__pg_coll_ctx(tdist_pg_t *pg, bool spin, int64_t timeout_ms, int64_t deadline_ms,
                        tdist__coll_ctx_t *c)
{
    *c = (tdist__coll_ctx_t){.tp = pg->tp, .shm = pg->shm, .spin = spin,
                             .scratch = &pg->coll.scratch, .rank = pg->rank, .size = pg->size,
                             .deadline_ms = deadline_ms, .timeout_ms = timeout_ms,
                             .ar_forced = pg->coll.ar_algo, .g = &pg->coll,
                             .aborted = &pg->aborted};
    if (pg->backend) {
        c->slots = pg->backend->coll;
        c->be = pg->be;
        c->be_name = pg->backend->name;
    }
}

/* What pg's check callbacks need (check.c does the work). */
typedef struct check_arg {
    tdist_pg_t *pg;
    struct tdist_work *w;
} check_arg_t;

static tdist_status_t check_exchange(void *arg, int64_t deadline_ms)
{
    check_arg_t *x = arg;
    return tdist__fp_exchange(x->pg, x->w, deadline_ms);
}

static tdist_status_t check_compare(void *arg)
{
    check_arg_t *x = arg;
    tdist__fp_fill(x->pg, x->w);
    return tdist__fp_compare(x->pg);
}

static tdist_status_t check_compare_earlier(void *arg)
{
    check_arg_t *x = arg;
    return tdist__fp_compare_earlier(x->pg, x->w);
}

/* coll/'s started callback: a deferred recorder entry is written now. */
static void fr_started(void *arg)
{
    check_arg_t *x = arg;
    tdist__pg_fr_started(x->pg, x->w, &x->pg->chk.common);
}

/* The common part of w's fingerprint into pg->chk.common; its hash (0
 * when the check is off). A plain call of the last one's shape (a training
 * loop's loss, a norm) reuses that shape's hash: only seq's term changes. */
static uint64_t fp_prepare(tdist_pg_t *pg, const struct tdist_work *w)
{
    tdist__fp_t *fp = &pg->chk.common;
    bool plain = !w->fp_override && (w->op == TDIST__OP_ALL_REDUCE || w->op == TDIST__OP_BROADCAST ||
                                     w->op == TDIST__OP_REDUCE || w->op == TDIST__OP_BARRIER);
    tdist__fp_shape_t *l = &pg->chk.last;
    if (plain && l->valid && l->op == w->op && l->count == w->count && l->dtype == w->dtype &&
        l->redop == w->redop && l->root == w->root && l->flags == w->fp_flags) {
        fp->seq = w->seq;
        return pg->chk.h0 + w->seq * TDIST__FP_SEQ_MULT;
    }
    tdist__fp_common(w, pg->uid_hash, fp);
    l->valid = false;
    if (!pg->check_fp) return 0;
    if (!plain) return tdist__fp_hash(fp);
    fp->seq = 0;
    pg->chk.h0 = tdist__fp_hash(fp);
    fp->seq = w->seq;
    l->valid = true;
    l->op = w->op;
    l->count = w->count;
    l->dtype = w->dtype;
    l->redop = w->redop;
    l->root = w->root;
    l->flags = w->fp_flags;
    return pg->chk.h0 + w->seq * TDIST__FP_SEQ_MULT;
}

tdist_status_t tdist__pg_run_body(tdist_pg_t *pg, struct tdist_work *w, int64_t timeout_ms,
                                  int64_t deadline_ms)
{
    if (!pg->backend && !pg->tp)
        return tdist__error(TDIST_ERR_CONNECTION, "the group's mesh is closed");
    if (pg->backend && (w->fp_override || w->shadow_leader >= 0))
        return tdist__error(TDIST_ERR_NOT_SUPPORTED, "Join's shadow collectives are not "
                            "supported on the %s backend", pg->backend->name);
    /* The group's part of the context and the check, made once and set
     * here for this call in place: one work runs at a time (the gate's
     * RUN), and coll/ only reads them. */
    if (!pg->run0.ok) {
        tdist__pg_coll_ctx(pg, false, 0, 0, &pg->run0.ctx);
        pg->run0.chk = (tdist__coll_check_t){.on = pg->check_fp, .len = sizeof pg->chk.common,
                                             .common = &pg->chk.common,
                                             .theirs = (uint8_t *)pg->chk.theirs,
                                             .exchange = check_exchange,
                                             .compare = check_compare};
        pg->run0.ok = true;
    }
    tdist__coll_ctx_t *c = &pg->run0.ctx;
    c->tp = pg->tp;
    c->spin = w->inline_run;
    c->timeout_ms = timeout_ms;
    c->deadline_ms = deadline_ms == TDIST__DEADLINE_LAZY ? timeout_ms : deadline_ms;
    c->lazy_deadline = deadline_ms == TDIST__DEADLINE_LAZY;
    c->chosen = NULL;
    c->started = NULL;
    check_arg_t x = {pg, w};
    tdist__coll_check_t *chk = &pg->run0.chk;
    chk->hash = fp_prepare(pg, w);
    chk->have = pg->chk.have;
    /* rooted collectives leave fingerprints unread for later: not inside a
     * Join, whose joined ranks read the stream */
    chk->compare_earlier = w->in_join ? NULL : check_compare_earlier;
    chk->arg = &x;
    tdist__pg_fr_start(pg, w, &pg->chk.common, c, fr_started, &x);
    return tdist__coll_run(c, &w->args, chk);
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
    /* the failure path ends 0.8 s past the call's deadline at the latest */
    int64_t deadline = w->deadline_ms > 0 ? w->deadline_ms : tdist__now_ms();
    /* a timeout: the peer waited on may be waiting on another (waits.c) */
    int waited_on = st == TDIST_ERR_TIMEOUT ? tdist__tp_owed_peer() : -1;
    tdist__tp_set_owed_peer(-1);
    char *chain = waited_on >= 0 && cause ? tdist__pg_wait_chain(pg, waited_on) : NULL;
    if (chain) {
        char *full = tdist__asprintf("%s%s", cause, chain);
        if (full) {
            free(cause);
            cause = full;
        }
        free(chain);
    }
    char where[300], d[200];
    tdist__work_describe(w, d, sizeof d);
    snprintf(where, sizeof where, "group %s seq %llu %s", pg->name, (unsigned long long)w->seq, d);
    *msg = tdist__pg_fail(pg, st, prefix, where, cause ? cause : "unknown cause", deadline);
    TDIST_LOGD("%s", *msg ? *msg : prefix);
    if (!*msg) *msg = tdist__strdup(prefix);
    free(cause);
    return st;
}

/* w cannot run: its group was aborted or has failed (st); *msg says so. */
static tdist_status_t run_refused(tdist_pg_t *pg, struct tdist_work *w, tdist_status_t st,
                                  char **msg)
{
    char prefix[400], *sticky = NULL;
    if (st != TDIST_ERR_ABORTED) st = tdist__pg_sticky(pg, &sticky);
    tdist__pg_fr_settle(pg, w);
    tdist__pg_fr_end(pg, w, st);
    work_prefix(pg, w, prefix, sizeof prefix);
    if (st == TDIST_ERR_ABORTED)
        *msg = tdist__asprintf("%s: the group was aborted", prefix);
    else
        *msg = tdist__asprintf("%s: the group failed earlier: %s", prefix, sticky);
    free(sticky);
    return st;
}

/* Run w; its status, and on failure *msg (malloc'd, caller frees; NULL
 * when out of memory) says why. */
static inline __attribute__((always_inline)) tdist_status_t
run_work_status(tdist_pg_t *pg, struct tdist_work *w, char **msg)
{
    *msg = NULL;
    if (__builtin_expect(atomic_load(&pg->aborted), 0))
        return run_refused(pg, w, TDIST_ERR_ABORTED, msg);
    if (__builtin_expect(atomic_load(&pg->failed), 0) && tdist__pg_sticky(pg, NULL) != TDIST_OK)
        return run_refused(pg, w, TDIST_ERR_INTERNAL, msg);
    int64_t timeout = w->timeout_ms >= 0 ? w->timeout_ms : pg->timeout_ms;
    /* the deadline's clock read is left to coll/ (rule 3 all the same):
     * a tiny collective that finds its peers there never needs it */
    int64_t deadline = TDIST__DEADLINE_LAZY;
    w->deadline_ms = 0;
    tdist_clear_error();
    tdist_status_t st = TDIST_OK;
    /* shadow collectives run on a joined rank took sequence numbers */
    if (__builtin_expect(pg->join.seq_shift != 0, 0)) tdist__work_shift_seq(w, pg->join.seq_shift);
    if (__builtin_expect(w->shadow_leader >= 0, 0)) {
        deadline = tdist__deadline_ms(timeout);
        w->deadline_ms = deadline;
        st = tdist__pg_shadow_until(pg, w, deadline);
    }
    if (st == TDIST_OK) st = tdist__pg_run_body(pg, w, timeout, deadline);
    tdist__pg_fr_settle(pg, w); /* a body that failed before it started */
    pg->chk.have = -1;
    tdist__pg_fr_end(pg, w, st);
    if (__builtin_expect(st == TDIST_OK, 1)) return TDIST_OK;
    st = work_failed(pg, w, st, msg);
    (void)tdist__fr_dump_all(*msg ? *msg : "a collective failed", false);
    return st;
}

static void run_work(tdist_pg_t *pg, struct tdist_work *w)
{
    char *msg = NULL;
    tdist_status_t st = run_work_status(pg, w, &msg);
    tdist__work_finish(w, st, msg);
    free(msg);
}

/* The engine's next work (mu held), with RUN taken; NULL when stopped and
 * drained. Waits while the queue is empty or a caller runs one inline. */
static struct tdist_work *engine_next(tdist_pg_t *pg)
{
    for (;;) {
        uint64_t g = atomic_load_explicit(&pg->gate, memory_order_relaxed);
        if (!(g & TDIST__GATE_RUN)) {
            if (pg->head) {
                if (!atomic_compare_exchange_weak_explicit(&pg->gate, &g, g | TDIST__GATE_RUN,
                                                           memory_order_acquire,
                                                           memory_order_relaxed))
                    continue;
                struct tdist_work *w = pg->head;
                pg->head = w->next;
                w->next = NULL;
                if (!pg->head) {
                    pg->tail = NULL;
                    atomic_fetch_and(&pg->gate, ~(uint64_t)TDIST__GATE_QUEUED);
                }
                return w;
            }
            if (pg->stop) return NULL;
        }
        pthread_cond_wait(&pg->cv, &pg->mu);
    }
}

static void *engine_main(void *arg)
{
    tdist_pg_t *pg = arg;
    pthread_mutex_lock(&pg->mu);
    struct tdist_work *w;
    while ((w = engine_next(pg))) {
        pthread_mutex_unlock(&pg->mu);
        run_work(pg, w);
        pthread_mutex_lock(&pg->mu);
        atomic_fetch_and_explicit(&pg->gate, ~(uint64_t)TDIST__GATE_RUN, memory_order_release);
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
    tdist__pg_gate_slow(pg, true); /* a call still running inline wakes the engine at its end */
    pthread_cond_broadcast(&pg->cv);
    pthread_mutex_unlock(&pg->mu);
    pthread_join(pg->engine, NULL);
    pg->engine_started = false;
}
