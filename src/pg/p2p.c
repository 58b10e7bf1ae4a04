/*
 * pg/p2p.c — send / recv on the group's second mesh.
 *
 * Point-to-point operations do not take a group sequence number and do not
 * go through the collective engine: a blocked recv must not hold back the
 * collectives, nor a later isend (two ranks that both irecv then isend
 * must not deadlock). Each one is handed to the group's p2p thread
 * (started on the first send/recv), which posts it on the p2p mesh at once
 * — a 24-byte header {magic, per-pair sequence, dtype, count} then the
 * payload — so operations to one peer go out, and are matched, in issue
 * order. The thread drives the mesh (tdist__tp_progress in 1 ms slices,
 * so newly submitted operations are posted within about a millisecond)
 * and checks every header against the matching recv: a disagreement
 * (dtype, count, sequence) is TDIST_ERR_MISMATCH, sticky for the group's
 * p2p path (the byte streams can no longer be trusted).
 *
 * On another backend the same thread posts each operation through the
 * backend's p2p_post (the same header, then the payload), polls it with
 * p2p_test and pauses with p2p_idle between polls (backend/backend.h);
 * ordering, sequences, header checks, deadlines and failures stay here.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pg/internal.h"

#define P2P_MAGIC 0x74647032u /* "tdp2" */

typedef struct p2p_hdr {
    uint32_t magic;
    int32_t dtype;
    uint64_t seq;
    uint64_t count;
} p2p_hdr_t;

_Static_assert(sizeof(p2p_hdr_t) == 24, "p2p header is 24 bytes");

static char *op_prefix(tdist_pg_t *pg, const struct tdist_work *w)
{
    char d[200];
    tdist__work_describe(w, d, sizeof d);
    return tdist__asprintf("rank %d group %s p2p #%llu %s", pg->rank, pg->name,
                           (unsigned long long)w->seq, d);
}

/* Mark w as finished with st / cause (under pg->mu); delivered later. */
static void mark(tdist_pg_t *pg, struct tdist_work *w, tdist_status_t st, const char *cause)
{
    w->p2p_status = st;
    if (st != TDIST_OK) {
        char *p = op_prefix(pg, w);
        w->p2p_msg = tdist__asprintf("%s: %s", p ? p : "p2p", cause);
        free(p);
    }
}

/* Make the p2p path fail (sticky) with st / msg (under pg->mu). */
static void p2p_fail(tdist_pg_t *pg, tdist_status_t st, const char *msg)
{
    if (pg->p2p.err == TDIST_OK) {
        pg->p2p.err = st;
        pg->p2p.errmsg = tdist__strdup(msg);
        tdist__tp_abort(pg->p2p_tp);
    }
}

static void deliver(tdist_pg_t *pg, struct tdist_work *done)
{
    while (done) {
        struct tdist_work *w = done;
        done = w->next;
        w->next = NULL;
        tdist__pg_fr_end(pg, w, (tdist_status_t)w->p2p_status);
        char *m = w->p2p_msg;
        w->p2p_msg = NULL;
        tdist__work_finish(w, (tdist_status_t)w->p2p_status, m);
        free(m);
    }
}

static tdist_status_t post_native(tdist_pg_t *pg, struct tdist_work *w, size_t bytes)
{
    tdist_status_t st;
    if (w->op == TDIST__OP_SEND) {
        st = tdist__tp_post_send(pg->p2p_tp, &w->hreq, w->root, w->hdr, sizeof w->hdr);
        if (st == TDIST_OK)
            st = tdist__tp_post_send(pg->p2p_tp, &w->preq, w->root, w->sendbuf, bytes);
    } else {
        st = tdist__tp_post_recv(pg->p2p_tp, &w->hreq, w->root, w->hdr, sizeof w->hdr);
        if (st == TDIST_OK) st = tdist__tp_post_recv(pg->p2p_tp, &w->preq, w->root, w->recvbuf, bytes);
    }
    return st;
}

static tdist_status_t post_backend(tdist_pg_t *pg, struct tdist_work *w)
{
    bool send = w->op == TDIST__OP_SEND;
    w->be_op = (tdist__be_p2p_t){.send = send, .peer = w->root, .hdr = w->hdr,
                                 .hdr_len = sizeof w->hdr,
                                 .buf = send ? (void *)w->sendbuf : w->recvbuf,
                                 .count = w->count, .dtype = w->dtype};
    tdist_status_t st = pg->backend->p2p_post(pg->be, &w->be_op);
    w->be_posted = st == TDIST_OK;
    return st;
}

static void post(tdist_pg_t *pg, struct tdist_work *w)
{
    tdist__fr_state(pg->fr, w->fr_id, TDIST__FR_STARTED, 0);
    p2p_hdr_t *h = (p2p_hdr_t *)(void *)w->hdr;
    if (w->op == TDIST__OP_SEND) {
        h->magic = P2P_MAGIC;
        h->dtype = (int32_t)w->dtype;
        h->seq = w->seq;
        h->count = w->count;
    }
    tdist_status_t st = pg->backend ? post_backend(pg, w)
                                    : post_native(pg, w, w->count * tdist_dtype_size(w->dtype));
    if (st != TDIST_OK) {
        const char *cause = tdist_last_error();
        p2p_fail(pg, st, cause);
        mark(pg, w, st, cause);
    } else {
        w->p2p_status = TDIST_INPROGRESS;
    }
}

/* Check a received header against the recv (under pg->mu). */
static bool check_hdr(tdist_pg_t *pg, struct tdist_work *w)
{
    const p2p_hdr_t *h = (const p2p_hdr_t *)(const void *)w->hdr;
    w->hdr_checked = true;
    if (h->magic == P2P_MAGIC && h->dtype == (int32_t)w->dtype && h->seq == w->seq &&
        h->count == w->count)
        return true;
    char cause[300];
    if (h->magic != P2P_MAGIC)
        snprintf(cause, sizeof cause,
                 "p2p mismatch: rank %d sent bytes that are not a send header (earlier send/recv "
                 "sizes disagree?)",
                 w->root);
    else
        snprintf(cause, sizeof cause, "p2p mismatch: rank %d sent #%llu send(%s, %llu) for this recv",
                 w->root, (unsigned long long)h->seq,
                 tdist_dtype_name((tdist_dtype_t)h->dtype), (unsigned long long)h->count);
    char *full = NULL;
    {
        char *p = op_prefix(pg, w);
        full = tdist__asprintf("%s: %s", p ? p : "p2p", cause);
        free(p);
    }
    p2p_fail(pg, TDIST_ERR_MISMATCH, full ? full : cause);
    mark(pg, w, TDIST_ERR_MISMATCH, cause);
    free(full);
    return false;
}

/* Where w stands: *hd / *pd whether its header / payload are done, and the
 * first failure of either (TDIST_OK while none). */
static tdist_status_t poll_work(tdist_pg_t *pg, struct tdist_work *w, bool *hd, bool *pd)
{
    if (pg->backend) {
        bool hdr_in = false;
        tdist_status_t st = w->be_posted ? pg->backend->p2p_test(pg->be, &w->be_op, &hdr_in)
                                         : TDIST_INPROGRESS;
        *hd = hdr_in || st == TDIST_OK;
        *pd = st == TDIST_OK;
        return st == TDIST_INPROGRESS ? TDIST_OK : st;
    }
    *hd = tdist__tp_req_done(&w->hreq);
    *pd = tdist__tp_req_done(&w->preq);
    tdist_status_t hs = *hd ? tdist__tp_req_status(&w->hreq) : TDIST_OK;
    tdist_status_t ps = *pd ? tdist__tp_req_status(&w->preq) : TDIST_OK;
    return hs != TDIST_OK ? hs : ps;
}

/* Decide w if it can be (under pg->mu): done, failed, aborted, timed out. */
static void decide(tdist_pg_t *pg, struct tdist_work *w, int64_t now)
{
    bool hd = false, pd = false;
    tdist_status_t st = poll_work(pg, w, &hd, &pd);
    /* a recv's header first: a disagreement is worded from it (a longer
     * payload than the recv expects fails the transfer too) */
    if (w->op == TDIST__OP_RECV && !w->hdr_checked && hd && (st == TDIST_OK || pg->backend) &&
        !check_hdr(pg, w))
        return;
    char *cause = NULL;
    if (st != TDIST_OK && st != TDIST_INPROGRESS) {
        if (pg->backend) cause = tdist__strdup(tdist_last_error());
        mark(pg, w, st, cause ? cause : pg->p2p.errmsg ? pg->p2p.errmsg : "transport failed");
        if (pg->backend) p2p_fail(pg, st, w->p2p_msg ? w->p2p_msg : "p2p failed");
        free(cause);
    } else if (hd && pd && (w->op == TDIST__OP_SEND || w->hdr_checked)) {
        mark(pg, w, TDIST_OK, NULL);
    } else if (pg->p2p.err != TDIST_OK) {
        mark(pg, w, pg->p2p.err, pg->p2p.errmsg);
    } else if (atomic_load(&pg->aborted) || pg->stop) {
        mark(pg, w, TDIST_ERR_ABORTED, "the group was aborted");
    } else if (now >= w->deadline_ms) {
        char why[200];
        snprintf(why, sizeof why, "timed out after %lld ms (rank %d did not %s)",
                 (long long)w->timeout_ms, w->root,
                 w->op == TDIST__OP_SEND ? "receive it" : "send");
        mark(pg, w, TDIST_ERR_TIMEOUT, why);
        p2p_fail(pg, TDIST_ERR_TIMEOUT, w->p2p_msg ? w->p2p_msg : why);
    }
}

/* Move the decided works of the active list to *dtail (under pg->mu);
 * another backend lets go of them. */
static void sweep(tdist_pg_t *pg, struct tdist_work ***dtail)
{
    int64_t now = tdist__now_ms();
    for (struct tdist_work **pp = &pg->p2p.active; *pp;) {
        struct tdist_work *w = *pp;
        if (w->p2p_status == TDIST_INPROGRESS) decide(pg, w, now);
        if (w->p2p_status == TDIST_INPROGRESS) {
            pp = &w->next;
            continue;
        }
        if (w->be_posted) {
            pg->backend->p2p_release(pg->be, &w->be_op, w->p2p_status != TDIST_OK);
            w->be_posted = false;
        }
        *pp = w->next;
        w->next = NULL;
        **dtail = w;
        *dtail = &w->next;
    }
}

/* Drive the operations in flight for a while (pg->mu not held): the
 * native mesh for 1 ms, or another backend's pause. */
static void drive(tdist_pg_t *pg, int64_t idle_us)
{
    if (pg->backend) {
        pg->backend->p2p_idle(pg->be, idle_us);
        pthread_mutex_lock(&pg->mu);
        return;
    }
    tdist_status_t st = tdist__tp_progress(pg->p2p_tp, 1);
    if (st != TDIST_OK) {
        char *cause = tdist__strdup(tdist_last_error());
        pthread_mutex_lock(&pg->mu);
        p2p_fail(pg, st, cause ? cause : "p2p transport failed");
        free(cause);
    } else {
        pthread_mutex_lock(&pg->mu);
    }
}

static void *p2p_main(void *arg)
{
    tdist_pg_t *pg = arg;
    int64_t idle_since = (int64_t)(tdist__now_ns() / 1000u);
    pthread_mutex_lock(&pg->mu);
    for (;;) {
        struct tdist_work *done = NULL, **dtail = &done;
        bool posted = pg->p2p.head != NULL;
        /* Post what was submitted, in order. */
        while (pg->p2p.head) {
            struct tdist_work *w = pg->p2p.head;
            pg->p2p.head = w->next;
            if (!pg->p2p.head) pg->p2p.tail = NULL;
            w->next = pg->p2p.active;
            pg->p2p.active = w;
            w->p2p_status = TDIST_INPROGRESS;
            if (pg->p2p.err == TDIST_OK && !atomic_load(&pg->aborted)) post(pg, w);
        }
        bool stopping = pg->stop || atomic_load(&pg->aborted) || pg->p2p.err != TDIST_OK;
        sweep(pg, &dtail);
        if (done || posted) idle_since = (int64_t)(tdist__now_ns() / 1000u);
        if (done) {
            pthread_mutex_unlock(&pg->mu);
            deliver(pg, done);
            pthread_mutex_lock(&pg->mu);
            continue;
        }
        if (pg->stop && !pg->p2p.active && !pg->p2p.head) break;
        if (!pg->p2p.active) {
            if (!pg->p2p.head) pthread_cond_wait(&pg->p2p.cv, &pg->mu);
            idle_since = (int64_t)(tdist__now_ns() / 1000u);
            continue;
        }
        if (stopping || pg->p2p.head) continue; /* everything active gets marked above */
        pthread_mutex_unlock(&pg->mu);
        drive(pg, (int64_t)(tdist__now_ns() / 1000u) - idle_since);
    }
    pthread_mutex_unlock(&pg->mu);
    return NULL;
}

tdist_status_t tdist__p2p_submit(tdist_pg_t *pg, struct tdist_work *w, tdist_work_t **work)
{
    w->nranks = pg->size;
    pthread_mutex_lock(&pg->mu);
    tdist_status_t jst =
        pg->join.mode != TDIST__JOIN_NONE ? tdist__pg_join_check(pg, w) : TDIST_OK;
    pthread_mutex_unlock(&pg->mu);
    if (jst != TDIST_OK) {
        atomic_store(&w->refs, 1);
        tdist__work_release(w);
        return jst;
    }
    int64_t timeout = w->timeout_ms >= 0 ? w->timeout_ms : pg->timeout_ms;
    w->timeout_ms = timeout;
    w->deadline_ms = tdist__deadline_ms(timeout);
    pthread_mutex_lock(&pg->mu);
    tdist_status_t st = TDIST_OK;
    const char *why = NULL;
    if (atomic_load(&pg->aborted)) {
        st = TDIST_ERR_ABORTED;
        why = "the group was aborted";
    } else if (pg->err != TDIST_OK) {
        st = pg->err;
        why = pg->errmsg;
    } else if (pg->p2p.err != TDIST_OK) {
        st = pg->p2p.err;
        why = pg->p2p.errmsg;
    } else if (!pg->p2p.started) {
        int rc = pthread_create(&pg->p2p.thread, NULL, p2p_main, pg);
        if (rc != 0) {
            st = tdist__error_errno(rc, "group %s: cannot start the p2p thread", pg->name);
            why = tdist_last_error();
        } else {
            pg->p2p.started = true;
        }
    }
    if (st == TDIST_OK) {
        if (w->op == TDIST__OP_SEND)
            w->seq = ++pg->p2p.send_seq[w->root];
        else
            w->seq = ++pg->p2p.recv_seq[w->root];
        tdist__pg_fr_queue(pg, w, w->op == TDIST__OP_SEND ? TDIST__FR_SEND : TDIST__FR_RECV);
        if (pg->p2p.tail)
            pg->p2p.tail->next = w;
        else
            pg->p2p.head = w;
        pg->p2p.tail = w;
        pthread_cond_signal(&pg->p2p.cv);
        pthread_mutex_unlock(&pg->mu);
    } else {
        char *p = op_prefix(pg, w);
        tdist__error(st, "%s: %s%s", p ? p : "p2p",
                     st == TDIST_ERR_ABORTED ? "" : "the group failed earlier: ", why ? why : "");
        free(p);
        pthread_mutex_unlock(&pg->mu);
        atomic_store(&w->refs, 1);
        tdist__work_release(w);
        return st;
    }
    return tdist__work_hand_over(w, work);
}

void tdist__p2p_stop(tdist_pg_t *pg)
{
    pthread_mutex_lock(&pg->mu);
    bool started = pg->p2p.started;
    pg->stop = true;
    if (pg->p2p_tp) tdist__tp_abort(pg->p2p_tp);
    pthread_cond_broadcast(&pg->p2p.cv);
    pthread_mutex_unlock(&pg->mu);
    if (started) pthread_join(pg->p2p.thread, NULL);
    pg->p2p.started = false;
}
