/*
 * transport/transport.c — the tdist__tp_* functions of transport.h, and
 * everything in them that is the same for every kind (ops.h): posting
 * requests onto per-peer queues, the sticky failure and the messages that
 * name peers, waiting with a deadline, the blocking send/recv/sendrecv.
 * What differs (set-up, moving bytes, waking, closing) is the kind's:
 * tcp.c or shm.c, reached through the table of the transport's kind.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "transport/ops.h"

#define OPS(pfx)                                                                                 \
    {                                                                                            \
        .listen = tdist__##pfx##_listen, .connect = tdist__##pfx##_connect,                      \
        .progress = tdist__##pfx##_progress, .wake = tdist__##pfx##_wake,                        \
        .destroy = tdist__##pfx##_destroy,                                                       \
    }

static const tdist__tp_ops_t ops_by_kind[] = {
    [TDIST__TP_TCP] = OPS(tcp),
    [TDIST__TP_SHM] = OPS(shm),
};
#define NKINDS ((int)(sizeof ops_by_kind / sizeof ops_by_kind[0]))

/* The table of tp's kind; tp is not NULL. */
static const tdist__tp_ops_t *ops(const tdist__tp_t *tp) { return &ops_by_kind[tp->kind]; }

/* ------------------------------------------------------ the shared part */

tdist_status_t tdist__tp_base_init(tdist__tp_t *tp, tdist__tp_kind_t kind, int rank, int size,
                                   uint64_t tag)
{
    tp->kind = kind;
    tp->rank = rank;
    tp->size = size;
    tp->tag = tag;
    atomic_init(&tp->aborted, false);
    tp->chan = calloc((size_t)size, sizeof *tp->chan);
    tp->pfd = calloc((size_t)size + 1, sizeof *tp->pfd);
    tp->pfd_peer = calloc((size_t)size + 1, sizeof *tp->pfd_peer);
    if (!tp->chan || !tp->pfd || !tp->pfd_peer) {
        tdist__tp_base_fini(tp);
        return tdist__error(TDIST_ERR_NO_MEMORY,
                            "tdist__tp_listen: rank %d: out of memory for %d peers", rank, size);
    }
    return TDIST_OK;
}

void tdist__tp_base_fini(tdist__tp_t *tp)
{
    free(tp->chan);
    free(tp->pfd);
    free(tp->pfd_peer);
    tp->chan = NULL;
    tp->pfd = NULL;
    tp->pfd_peer = NULL;
}

tdist_status_t tdist__tp_sticky(const tdist__tp_t *tp)
{
    return tdist__error(tp->err, "%s", tp->errmsg);
}

tdist_status_t tdist__tp_fail(tdist__tp_t *tp, tdist_status_t st, const char *fmt, ...)
{
    if (tp->err == TDIST_OK) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(tp->errmsg, sizeof tp->errmsg, fmt, ap);
        va_end(ap);
        tp->err = st;
        TDIST_LOGW("%s", tp->errmsg);
        for (int p = 0; p < tp->size; p++) {
            tdist__tp_chan_t *c = &tp->chan[p];
            for (tdist__tp_req_t *r = c->sq_head, *nx; r; r = nx) {
                nx = r->next;
                tdist__tp_req_finish(r, st);
            }
            for (tdist__tp_req_t *r = c->rq_head, *nx; r; r = nx) {
                nx = r->next;
                tdist__tp_req_finish(r, st);
            }
            c->sq_head = c->sq_tail = c->rq_head = c->rq_tail = NULL;
        }
    }
    return tdist__tp_sticky(tp);
}

tdist_status_t tdist__tp_fail_aborted(tdist__tp_t *tp)
{
    return tdist__tp_fail(tp, TDIST_ERR_ABORTED, "rank %d: transport aborted", tp->rank);
}

tdist_status_t tdist__tp_fail_peer(tdist__tp_t *tp, tdist_status_t st, int peer,
                                   const tdist__tp_req_t *req, const char *how)
{
    char what[96] = "";
    if (req)
        snprintf(what, sizeof what, " (%s %zu bytes, %zu done)",
                 req->is_send ? "sending" : "receiving", req->len, req->done);
    return tdist__tp_fail(tp, st, "rank %d: peer rank %d (%s)%s%s", tp->rank, peer,
                          tp->chan[peer].label, how, what);
}

void tdist__tp_set_problem(tdist__tp_t *tp, int peer, const char *fmt, ...)
{
    tdist__tp_chan_t *c = &tp->chan[peer];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->problem, sizeof c->problem, fmt, ap);
    va_end(ap);
}

tdist_status_t tdist__tp_setup_timeout(tdist__tp_t *tp, const char *what, int64_t start_ms)
{
    char msg[TDIST__TP_ERRMSG_LEN];
    size_t used = (size_t)snprintf(msg, sizeof msg,
                                   "rank %d: %s set-up timed out after %lld ms; missing peer "
                                   "ranks:",
                                   tp->rank, what, (long long)(tdist__now_ms() - start_ms));
    int listed = 0;
    for (int p = 0; p < tp->size && used < sizeof msg; p++) {
        const tdist__tp_chan_t *c = &tp->chan[p];
        if (p == tp->rank || c->up) continue;
        used += (size_t)snprintf(msg + used, sizeof msg - used, "%s peer rank %d (%s): %s",
                                 listed++ ? ";" : "", p, c->label, c->problem);
    }
    return tdist__tp_fail(tp, TDIST_ERR_TIMEOUT, "%s", msg);
}

/* ------------------------------------------------------------- set-up */

tdist_status_t tdist__tp_listen(tdist__tp_kind_t kind, int rank, int size,
                                const tdist__tp_opts_t *opts, tdist__tp_t **out)
{
    if ((int)kind < 0 || (int)kind >= NKINDS)
        return tdist__error(TDIST_ERR_NOT_SUPPORTED,
                            "tdist__tp_listen: transport kind %d is not supported", (int)kind);
    return ops_by_kind[kind].listen(kind, rank, size, opts, out);
}

const char *tdist__tp_address(const tdist__tp_t *tp) { return tp ? tp->addr : NULL; }

tdist_status_t tdist__tp_connect(tdist__tp_t *tp, const char *const *addrs, int64_t deadline_ms)
{
    static const char fn[] = "tdist__tp_connect";
    TDIST_ARG_CHECK(tp != NULL, fn);
    TDIST_ARG_CHECK(addrs != NULL, fn);
    if (tp->err != TDIST_OK) return tdist__tp_sticky(tp);
    if (tp->connected)
        return tdist__error(TDIST_ERR_INVALID_ARG, "%s: rank %d: already connected", fn, tp->rank);
    return ops(tp)->connect(tp, addrs, deadline_ms);
}

/* --------------------------------------------------------------- data */

/* The argument checks of post_send / post_recv (fn names the call).
 * has_req: the request pointer is not NULL (passed as a flag: the request
 * is not initialised yet, and the compiler must not think it is read). */
static tdist_status_t check_post(int rank, int size, bool has_req, int peer, const void *buf,
                                 size_t len, const char *fn)
{
    if (!has_req)
        return tdist__error(TDIST_ERR_INVALID_ARG, "%s: invalid argument: req != NULL", fn);
    TDIST_ARG_CHECK(buf != NULL || len == 0, fn);
    if (peer < 0 || peer >= size || peer == rank)
        return tdist__error(TDIST_ERR_INVALID_ARG,
                            "%s: rank %d: peer %d is not another rank of the %d", fn, rank, peer,
                            size);
    return TDIST_OK;
}

/* Fill req for a new post and, unless it is empty (finished at once),
 * append it to the queue (*head, *tail) of its peer and direction. */
static void enqueue(tdist__tp_req_t *req, int peer, void *buf, size_t len, bool is_send,
                    tdist__tp_req_t **head, tdist__tp_req_t **tail)
{
    req->next = NULL;
    req->buf = buf;
    req->len = len;
    req->done = 0;
    req->peer = peer;
    req->is_send = is_send;
    req->finished = false;
    req->status = TDIST_INPROGRESS;
    if (len == 0) {
        tdist__tp_req_finish(req, TDIST_OK);
        return;
    }
    if (*tail)
        (*tail)->next = req;
    else
        *head = req;
    *tail = req;
}

static tdist_status_t post(tdist__tp_t *tp, tdist__tp_req_t *req, int peer, void *buf, size_t len,
                           bool is_send, const char *fn)
{
    TDIST_ARG_CHECK(tp != NULL, fn);
    TDIST_CHECK(check_post(tp->rank, tp->size, req != NULL, peer, buf, len, fn));
    if (tp->err != TDIST_OK) return tdist__tp_sticky(tp);
    if (atomic_load(&tp->aborted)) return tdist__tp_fail_aborted(tp);
    if (!tp->connected)
        return tdist__error(TDIST_ERR_INVALID_ARG, "%s: rank %d: transport is not connected", fn,
                            tp->rank);
    tdist__tp_chan_t *c = &tp->chan[peer];
    if (is_send)
        enqueue(req, peer, buf, len, true, &c->sq_head, &c->sq_tail);
    else
        enqueue(req, peer, buf, len, false, &c->rq_head, &c->rq_tail);
    return TDIST_OK;
}

tdist_status_t tdist__tp_post_send(tdist__tp_t *tp, tdist__tp_req_t *req, int peer,
                                   const void *buf, size_t len)
{
    return post(tp, req, peer, (void *)buf, len, true, "tdist__tp_post_send");
}

tdist_status_t tdist__tp_post_recv(tdist__tp_t *tp, tdist__tp_req_t *req, int peer, void *buf,
                                   size_t len)
{
    return post(tp, req, peer, buf, len, false, "tdist__tp_post_recv");
}

tdist_status_t tdist__tp_progress(tdist__tp_t *tp, int timeout_ms)
{
    TDIST_ARG_CHECK(tp != NULL, "tdist__tp_progress");
    if (tp->err != TDIST_OK) return tdist__tp_sticky(tp);
    if (atomic_load(&tp->aborted)) return tdist__tp_fail_aborted(tp);
    if (!tp->connected)
        return tdist__error(TDIST_ERR_INVALID_ARG, "tdist__tp_progress: rank %d: transport is not "
                            "connected", tp->rank);
    return ops(tp)->progress(tp, timeout_ms);
}

bool tdist__tp_req_done(const tdist__tp_req_t *req) { return req && req->finished; }

tdist_status_t tdist__tp_req_status(const tdist__tp_req_t *req)
{
    if (!req)
        return tdist__error(TDIST_ERR_INVALID_ARG,
                            "tdist__tp_req_status: invalid argument: req is NULL");
    return req->finished ? req->status : TDIST_INPROGRESS;
}

/* The peer this thread's last timed-out wait was on (tdist__tp_owed_peer). */
static _Thread_local int owed_peer = -1;

int tdist__tp_owed_peer(void) { return owed_peer; }
void tdist__tp_set_owed_peer(int peer) { owed_peer = peer; }

void tdist__tp_on_wait(tdist__tp_t *tp, void (*fn)(void *arg, int peer), void *arg)
{
    if (!tp) return;
    tp->on_wait = fn;
    tp->on_wait_arg = arg;
}

void tdist__tp_waiting_on(tdist__tp_t *tp, int peer)
{
    if (!tp->on_wait) return;
    for (int p = 0; p < tp->size && peer < 0; p++)
        if (p != tp->rank && tp->chan[p].rq_head) peer = p;
    for (int p = 0; p < tp->size && peer < 0; p++)
        if (p != tp->rank && tp->chan[p].sq_head) peer = p;
    if (peer >= 0) tp->on_wait(tp->on_wait_arg, peer);
}

/* The deadline passed: name every peer still owed bytes by reqs. */
static tdist_status_t wait_timeout(const tdist__tp_t *tp, tdist__tp_req_t *const *reqs, size_t n,
                                   int64_t start)
{
    /* the peer waited on: the first one a receive still waits for, else
     * the first one a send still waits on */
    int recv_peer = -1, send_peer = -1;
    for (size_t i = 0; i < n; i++) {
        const tdist__tp_req_t *r = reqs[i];
        if (r->finished) continue;
        if (!r->is_send && recv_peer < 0) recv_peer = r->peer;
        if (r->is_send && send_peer < 0) send_peer = r->peer;
    }
    owed_peer = recv_peer >= 0 ? recv_peer : send_peer;
    char msg[TDIST__TP_ERRMSG_LEN];
    size_t used = (size_t)snprintf(msg, sizeof msg,
                                   "rank %d: transport wait timed out after %lld ms; still owed:",
                                   tp->rank, (long long)(tdist__now_ms() - start));
    size_t listed = 0, open = 0;
    for (size_t i = 0; i < n; i++) {
        const tdist__tp_req_t *r = reqs[i];
        if (r->finished) continue;
        open++;
        if (listed == 8 || used >= sizeof msg) continue;
        used += (size_t)snprintf(msg + used, sizeof msg - used,
                                 "%s %s peer rank %d (%s) %zu/%zu bytes", listed ? ";" : "",
                                 r->is_send ? "send to" : "receive from", r->peer,
                                 tp->chan[r->peer].label, r->done, r->len);
        listed++;
    }
    if (open > listed && used < sizeof msg)
        snprintf(msg + used, sizeof msg - used, "; and %zu more", open - listed);
    return tdist__error(TDIST_ERR_TIMEOUT, "%s", msg);
}

tdist_status_t tdist__tp_wait(tdist__tp_t *tp, tdist__tp_req_t *const *reqs, size_t n,
                              int64_t deadline_ms)
{
    static const char fn[] = "tdist__tp_wait";
    TDIST_ARG_CHECK(tp != NULL, fn);
    TDIST_ARG_CHECK(reqs != NULL || n == 0, fn);
    for (size_t i = 0; i < n; i++)
        if (!reqs[i])
            return tdist__error(TDIST_ERR_INVALID_ARG, "%s: rank %d: request %zu is NULL", fn,
                                tp->rank, i);
    int64_t start = tdist__now_ms();
    for (;;) {
        size_t open = 0;
        tdist_status_t worst = TDIST_OK;
        for (size_t i = 0; i < n; i++) {
            if (!reqs[i]->finished)
                open++;
            else if (reqs[i]->status != TDIST_OK)
                worst = reqs[i]->status;
        }
        if (worst != TDIST_OK)
            return tp->err != TDIST_OK ? tdist__tp_sticky(tp)
                                       : tdist__error(worst, "rank %d: a request failed", tp->rank);
        if (open == 0) return TDIST_OK;
        if (tp->err != TDIST_OK) return tdist__tp_sticky(tp);
        int64_t now = tdist__now_ms();
        bool late = now >= deadline_ms;
        TDIST_CHECK(tdist__tp_progress(tp, late ? 0 : tdist__ms_left(deadline_ms)));
        if (late) {
            bool all = true;
            for (size_t i = 0; i < n; i++) all = all && reqs[i]->finished;
            if (!all) return wait_timeout(tp, reqs, n, start);
        }
    }
}

/* Wait for reqs posted by a blocking convenience. Their memory is on the
 * caller's stack, so they cannot stay posted after a timeout: a timeout
 * fails the transport (the byte streams' positions are lost). */
static tdist_status_t wait_blocking(tdist__tp_t *tp, tdist__tp_req_t *const *reqs, size_t n,
                                    int64_t deadline_ms)
{
    tdist_status_t st = tdist__tp_wait(tp, reqs, n, deadline_ms);
    if (st == TDIST_ERR_TIMEOUT)
        return tdist__tp_fail(tp, TDIST_ERR_TIMEOUT,
                              "%s (a blocking call timed out: the transport is failed)",
                              tdist_last_error());
    return st;
}

tdist_status_t tdist__tp_send(tdist__tp_t *tp, int peer, const void *buf, size_t len,
                              int64_t deadline_ms)
{
    tdist__tp_req_t req, *r = &req;
    TDIST_CHECK(tdist__tp_post_send(tp, &req, peer, buf, len));
    return wait_blocking(tp, &r, 1, deadline_ms);
}

tdist_status_t tdist__tp_recv(tdist__tp_t *tp, int peer, void *buf, size_t len,
                              int64_t deadline_ms)
{
    tdist__tp_req_t req, *r = &req;
    TDIST_CHECK(tdist__tp_post_recv(tp, &req, peer, buf, len));
    return wait_blocking(tp, &r, 1, deadline_ms);
}

tdist_status_t tdist__tp_sendrecv(tdist__tp_t *tp, int to, const void *sbuf, size_t slen,
                                  int from, void *rbuf, size_t rlen, int64_t deadline_ms)
{
    tdist__tp_req_t sreq, rreq, *rs[2] = {&sreq, &rreq};
    TDIST_CHECK(tdist__tp_post_send(tp, &sreq, to, sbuf, slen));
    tdist_status_t st = tdist__tp_post_recv(tp, &rreq, from, rbuf, rlen);
    if (st != TDIST_OK) {
        if (!sreq.finished)
            return tdist__tp_fail(tp, st, "%s (the send half was posted: the transport is failed)",
                                  tdist_last_error());
        return st;
    }
    return wait_blocking(tp, rs, 2, deadline_ms);
}

/* ------------------------------------------------------ abort, destroy */

void tdist__tp_abort(tdist__tp_t *tp)
{
    if (!tp) return;
    atomic_store(&tp->aborted, true);
    ops(tp)->wake(tp);
}

void tdist__tp_destroy(tdist__tp_t *tp)
{
    if (tp) ops(tp)->destroy(tp);
}

/* ------------------------------------------ shared-memory collectives */

/* Only the shm kind has them. */
static bool is_shm(const tdist__tp_t *tp) { return tp && tp->kind == TDIST__TP_SHM; }

void *tdist__tp_shm_area(tdist__tp_t *tp, int r, size_t *bytes)
{
    return is_shm(tp) ? tdist__shm_area(tp, r, bytes) : NULL;
}

tdist_status_t tdist__tp_wait_until(tdist__tp_t *tp, bool (*cond)(void *arg),
                                    bool (*needs)(void *arg, int peer), void *arg,
                                    int64_t deadline_ms, unsigned flags)
{
    if (!is_shm(tp) || !cond)
        return tdist__error(TDIST_ERR_NOT_SUPPORTED, "tdist__tp_wait_until: needs a shared-memory "
                            "transport and a condition");
    return tdist__shm_wait_until(tp, cond, needs, arg, deadline_ms, flags);
}

bool tdist__tp_oversubscribed(tdist__tp_t *tp) { return is_shm(tp) && tdist__shm_oversubscribed(tp); }

int tdist__tp_cpu_of(tdist__tp_t *tp, int r) { return is_shm(tp) ? tdist__shm_cpu_of(tp, r) : -1; }

void tdist__tp_notify(tdist__tp_t *tp)
{
    if (is_shm(tp)) tdist__shm_notify(tp);
}
