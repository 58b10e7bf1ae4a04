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
    if (pg->p2p_err == TDIST_OK) {
        pg->p2p_err = st;
        pg->p2p_errmsg = tdist__strdup(msg);
        tdist__tp_abort(pg->p2p_tp);
    }
}

static void deliver(struct tdist_work *done)
{
    while (done) {
        struct tdist_work *w = done;
        done = w->next;
        w->next = NULL;
        char *m = w->p2p_msg;
        w->p2p_msg = NULL;
        tdist__work_finish(w, (tdist_status_t)w->p2p_status, m);
        free(m);
    }
}

static void post(tdist_pg_t *pg, struct tdist_work *w)
{
    p2p_hdr_t *h = (p2p_hdr_t *)(void *)w->hdr;
    size_t bytes = w->count * tdist_dtype_size(w->dtype);
    tdist_status_t st;
    if (w->op == TDIST__OP_SEND) {
        h->magic = P2P_MAGIC;
        h->dtype = (int32_t)w->dtype;
        h->seq = w->seq;
        h->count = w->count;
        st = tdist__tp_post_send(pg->p2p_tp, &w->hreq, w->root, w->hdr, sizeof w->hdr);
        if (st == TDIST_OK)
            st = tdist__tp_post_send(pg->p2p_tp, &w->preq, w->root, w->sendbuf, bytes);
    } else {
        st = tdist__tp_post_recv(pg->p2p_tp, &w->hreq, w->root, w->hdr, sizeof w->hdr);
        if (st == TDIST_OK) st = tdist__tp_post_recv(pg->p2p_tp, &w->preq, w->root, w->recvbuf, bytes);
    }
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

static void *p2p_main(void *arg)
{
    tdist_pg_t *pg = arg;
    pthread_mutex_lock(&pg->mu);
    for (;;) {
        struct tdist_work *done = NULL, **dtail = &done;
        /* Post what was submitted, in order. */
        while (pg->p2p_head) {
            struct tdist_work *w = pg->p2p_head;
            pg->p2p_head = w->next;
            if (!pg->p2p_head) pg->p2p_tail = NULL;
            w->next = pg->p2p_active;
            pg->p2p_active = w;
            w->p2p_status = TDIST_INPROGRESS;
            if (pg->p2p_err == TDIST_OK && !atomic_load(&pg->aborted)) post(pg, w);
        }
        bool stopping = pg->stop || atomic_load(&pg->aborted) || pg->p2p_err != TDIST_OK;
        /* Sweep: finished, failed, timed out. */
        int64_t now = tdist__now_ms();
        for (struct tdist_work **pp = &pg->p2p_active; *pp;) {
            struct tdist_work *w = *pp;
            if (w->p2p_status == TDIST_INPROGRESS) {
                if (w->op == TDIST__OP_RECV && !w->hdr_checked && tdist__tp_req_done(&w->hreq) &&
                    tdist__tp_req_status(&w->hreq) == TDIST_OK)
                    check_hdr(pg, w);
            }
            if (w->p2p_status == TDIST_INPROGRESS) {
                bool hd = tdist__tp_req_done(&w->hreq), pd = tdist__tp_req_done(&w->preq);
                tdist_status_t hs = hd ? tdist__tp_req_status(&w->hreq) : TDIST_OK;
                tdist_status_t ps = pd ? tdist__tp_req_status(&w->preq) : TDIST_OK;
                if (hd && pd && hs == TDIST_OK && ps == TDIST_OK &&
                    (w->op == TDIST__OP_SEND || w->hdr_checked)) {
                    mark(pg, w, TDIST_OK, NULL);
                } else if (hs != TDIST_OK && hs != TDIST_INPROGRESS) {
                    mark(pg, w, hs, pg->p2p_errmsg ? pg->p2p_errmsg : "transport failed");
                } else if (ps != TDIST_OK && ps != TDIST_INPROGRESS) {
                    mark(pg, w, ps, pg->p2p_errmsg ? pg->p2p_errmsg : "transport failed");
                } else if (pg->p2p_err != TDIST_OK) {
                    mark(pg, w, pg->p2p_err, pg->p2p_errmsg);
                } else if (atomic_load(&pg->aborted) || pg->stop) {
                    mark(pg, w, TDIST_ERR_ABORTED, "the group was aborted");
                } else if (now >= w->deadline_ms) {
                    char cause[200];
                    snprintf(cause, sizeof cause, "timed out after %lld ms (rank %d did not %s)",
                             (long long)w->timeout_ms, w->root,
                             w->op == TDIST__OP_SEND ? "receive it" : "send");
                    mark(pg, w, TDIST_ERR_TIMEOUT, cause);
                    char *p = op_prefix(pg, w);
                    char *full = tdist__asprintf("%s: %s", p ? p : "p2p", cause);
                    p2p_fail(pg, TDIST_ERR_TIMEOUT, full ? full : cause);
                    free(p);
                    free(full);
                }
            }
            if (w->p2p_status != TDIST_INPROGRESS) {
                *pp = w->next;
                w->next = NULL;
                *dtail = w;
                dtail = &w->next;
            } else {
                pp = &w->next;
            }
        }
        if (done) {
            pthread_mutex_unlock(&pg->mu);
            deliver(done);
            pthread_mutex_lock(&pg->mu);
            continue;
        }
        if (pg->stop && !pg->p2p_active && !pg->p2p_head) break;
        if (!pg->p2p_active) {
            if (!pg->p2p_head) pthread_cond_wait(&pg->p2p_cv, &pg->mu);
            continue;
        }
        if (stopping) continue; /* everything active gets marked above */
        pthread_mutex_unlock(&pg->mu);
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
    pthread_mutex_unlock(&pg->mu);
    return NULL;
}

tdist_status_t tdist__p2p_submit(tdist_pg_t *pg, struct tdist_work *w, tdist_work_t **work)
{
    w->nranks = pg->size;
    pthread_mutex_lock(&pg->mu);
    tdist_status_t jst =
        pg->join_mode != TDIST__JOIN_NONE ? tdist__pg_join_check(pg, w) : TDIST_OK;
    pthread_mutex_unlock(&pg->mu);
    if (jst != TDIST_OK) {
        atomic_store(&w->refs, 1);
        tdist__work_release(w);
        return jst;
    }
    if (pg->backend) return pg->backend->p2p_submit(pg, w, work); /* backend/ */
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
    } else if (pg->p2p_err != TDIST_OK) {
        st = pg->p2p_err;
        why = pg->p2p_errmsg;
    } else if (!pg->p2p_started) {
        int rc = pthread_create(&pg->p2p_thread, NULL, p2p_main, pg);
        if (rc != 0) {
            st = tdist__error_errno(rc, "group %s: cannot start the p2p thread", pg->name);
            why = tdist_last_error();
        } else {
            pg->p2p_started = true;
        }
    }
    if (st == TDIST_OK) {
        if (w->op == TDIST__OP_SEND)
            w->seq = ++pg->p2p_send_seq[w->root];
        else
            w->seq = ++pg->p2p_recv_seq[w->root];
        if (pg->p2p_tail)
            pg->p2p_tail->next = w;
        else
            pg->p2p_head = w;
        pg->p2p_tail = w;
        pthread_cond_signal(&pg->p2p_cv);
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
    if (work) {
        *work = w;
        return TDIST_OK;
    }
    st = tdist_work_wait(w, -1);
    tdist__work_release(w);
    return st;
}

void tdist__p2p_stop(tdist_pg_t *pg)
{
    pthread_mutex_lock(&pg->mu);
    bool started = pg->p2p_started;
    pg->stop = true;
    if (pg->p2p_tp) tdist__tp_abort(pg->p2p_tp);
    pthread_cond_broadcast(&pg->p2p_cv);
    pthread_mutex_unlock(&pg->mu);
    if (started) pthread_join(pg->p2p_thread, NULL);
    pg->p2p_started = false;
}
