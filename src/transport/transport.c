/*
 * transport/transport.c — the tdist__tp_* functions of transport.h:
 * dispatch to the implementation of the transport's kind (tcp.c, shm.c)
 * through a table of functions, plus the two request accessors, which are
 * the same for every kind.
 */
#include "transport/ops.h"

#define OPS(pfx)                                                                                 \
    {                                                                                            \
        .listen = tdist__##pfx##_listen, .address = tdist__##pfx##_address,                      \
        .connect = tdist__##pfx##_connect, .post_send = tdist__##pfx##_post_send,                \
        .post_recv = tdist__##pfx##_post_recv, .progress = tdist__##pfx##_progress,              \
        .wait = tdist__##pfx##_wait, .send = tdist__##pfx##_send, .recv = tdist__##pfx##_recv,   \
        .sendrecv = tdist__##pfx##_sendrecv, .abort = tdist__##pfx##_abort,                      \
        .destroy = tdist__##pfx##_destroy,                                                       \
    }

static const tdist__tp_ops_t ops_by_kind[] = {
    [TDIST__TP_TCP] = OPS(tcp),
    [TDIST__TP_SHM] = OPS(shm),
};
#define NKINDS ((int)(sizeof ops_by_kind / sizeof ops_by_kind[0]))

/* The table of tp's kind (every implementation's struct starts with its
 * kind). A NULL tp goes to TCP's, which reports it like every kind. */
static const tdist__tp_ops_t *ops(const tdist__tp_t *tp)
{
    if (!tp) return &ops_by_kind[TDIST__TP_TCP];
    return &ops_by_kind[*(const tdist__tp_kind_t *)(const void *)tp];
}

tdist_status_t tdist__tp_listen(tdist__tp_kind_t kind, int rank, int size,
                                const tdist__tp_opts_t *opts, tdist__tp_t **out)
{
    if ((int)kind < 0 || (int)kind >= NKINDS)
        return tdist__error(TDIST_ERR_NOT_SUPPORTED,
                            "tdist__tp_listen: transport kind %d is not supported", (int)kind);
    return ops_by_kind[kind].listen(kind, rank, size, opts, out);
}

const char *tdist__tp_address(const tdist__tp_t *tp) { return ops(tp)->address(tp); }

tdist_status_t tdist__tp_connect(tdist__tp_t *tp, const char *const *addrs, int64_t deadline_ms)
{
    return ops(tp)->connect(tp, addrs, deadline_ms);
}

tdist_status_t tdist__tp_post_send(tdist__tp_t *tp, tdist__tp_req_t *req, int peer,
                                   const void *buf, size_t len)
{
    return ops(tp)->post_send(tp, req, peer, buf, len);
}

tdist_status_t tdist__tp_post_recv(tdist__tp_t *tp, tdist__tp_req_t *req, int peer, void *buf,
                                   size_t len)
{
    return ops(tp)->post_recv(tp, req, peer, buf, len);
}

tdist_status_t tdist__tp_progress(tdist__tp_t *tp, int timeout_ms)
{
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

tdist_status_t tdist__tp_wait(tdist__tp_t *tp, tdist__tp_req_t *const *reqs, size_t n,
                              int64_t deadline_ms)
{
    return ops(tp)->wait(tp, reqs, n, deadline_ms);
}

tdist_status_t tdist__tp_send(tdist__tp_t *tp, int peer, const void *buf, size_t len,
                              int64_t deadline_ms)
{
    return ops(tp)->send(tp, peer, buf, len, deadline_ms);
}

tdist_status_t tdist__tp_recv(tdist__tp_t *tp, int peer, void *buf, size_t len,
                              int64_t deadline_ms)
{
    return ops(tp)->recv(tp, peer, buf, len, deadline_ms);
}

tdist_status_t tdist__tp_sendrecv(tdist__tp_t *tp, int to, const void *sbuf, size_t slen,
                                  int from, void *rbuf, size_t rlen, int64_t deadline_ms)
{
    return ops(tp)->sendrecv(tp, to, sbuf, slen, from, rbuf, rlen, deadline_ms);
}

void tdist__tp_abort(tdist__tp_t *tp)
{
    if (tp) ops(tp)->abort(tp);
}

void tdist__tp_destroy(tdist__tp_t *tp)
{
    if (tp) ops(tp)->destroy(tp);
}

/* Shared-memory collectives: only the shm kind has them. */
static bool is_shm(const tdist__tp_t *tp)
{
    return tp && *(const tdist__tp_kind_t *)(const void *)tp == TDIST__TP_SHM;
}

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

/* ------------------------------------------------ request bookkeeping */

void tdist__tp_req_finish(tdist__tp_req_t *req, tdist_status_t st)
{
    req->finished = true;
    req->status = st;
    req->next = NULL;
}

tdist_status_t tdist__tp_check_post(int rank, int size, bool has_req, int peer, const void *buf,
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

void tdist__tp_req_enqueue(tdist__tp_req_t *req, int peer, void *buf, size_t len, bool is_send,
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
