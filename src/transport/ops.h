/*
 * transport/ops.h — internal to src/transport/: the per-kind function
 * table behind the tdist__tp_* functions of transport.h (transport.c
 * dispatches; tcp.c and shm.c implement). Every implementation's struct
 * starts with its tdist__tp_kind_t, which is how transport.c finds the
 * table of a tdist__tp_t. Each function has the contract of the
 * tdist__tp_* function of the same name in transport.h, and copes with a
 * NULL tp the same way.
 */
#ifndef TDIST_TRANSPORT_OPS_H
#define TDIST_TRANSPORT_OPS_H

#include "transport/transport.h"

typedef struct tdist__tp_ops {
    tdist_status_t (*listen)(tdist__tp_kind_t kind, int rank, int size,
                             const tdist__tp_opts_t *opts, tdist__tp_t **out);
    const char *(*address)(const tdist__tp_t *tp);
    tdist_status_t (*connect)(tdist__tp_t *tp, const char *const *addrs, int64_t deadline_ms);
    tdist_status_t (*post_send)(tdist__tp_t *tp, tdist__tp_req_t *req, int peer, const void *buf,
                                size_t len);
    tdist_status_t (*post_recv)(tdist__tp_t *tp, tdist__tp_req_t *req, int peer, void *buf,
                                size_t len);
    tdist_status_t (*progress)(tdist__tp_t *tp, int timeout_ms);
    tdist_status_t (*wait)(tdist__tp_t *tp, tdist__tp_req_t *const *reqs, size_t n,
                           int64_t deadline_ms);
    tdist_status_t (*send)(tdist__tp_t *tp, int peer, const void *buf, size_t len,
                           int64_t deadline_ms);
    tdist_status_t (*recv)(tdist__tp_t *tp, int peer, void *buf, size_t len, int64_t deadline_ms);
    tdist_status_t (*sendrecv)(tdist__tp_t *tp, int to, const void *sbuf, size_t slen, int from,
                               void *rbuf, size_t rlen, int64_t deadline_ms);
    void (*abort)(tdist__tp_t *tp);
    void (*destroy)(tdist__tp_t *tp);
} tdist__tp_ops_t;

#define TDIST__TP_DECLARE_OPS(pfx)                                                               \
    tdist_status_t tdist__##pfx##_listen(tdist__tp_kind_t kind, int rank, int size,              \
                                         const tdist__tp_opts_t *opts, tdist__tp_t **out);       \
    const char *tdist__##pfx##_address(const tdist__tp_t *tp);                                   \
    tdist_status_t tdist__##pfx##_connect(tdist__tp_t *tp, const char *const *addrs,             \
                                          int64_t deadline_ms);                                  \
    tdist_status_t tdist__##pfx##_post_send(tdist__tp_t *tp, tdist__tp_req_t *req, int peer,     \
                                            const void *buf, size_t len);                        \
    tdist_status_t tdist__##pfx##_post_recv(tdist__tp_t *tp, tdist__tp_req_t *req, int peer,     \
                                            void *buf, size_t len);                              \
    tdist_status_t tdist__##pfx##_progress(tdist__tp_t *tp, int timeout_ms);                     \
    tdist_status_t tdist__##pfx##_wait(tdist__tp_t *tp, tdist__tp_req_t *const *reqs, size_t n,  \
                                       int64_t deadline_ms);                                     \
    tdist_status_t tdist__##pfx##_send(tdist__tp_t *tp, int peer, const void *buf, size_t len,   \
                                       int64_t deadline_ms);                                     \
    tdist_status_t tdist__##pfx##_recv(tdist__tp_t *tp, int peer, void *buf, size_t len,         \
                                       int64_t deadline_ms);                                     \
    tdist_status_t tdist__##pfx##_sendrecv(tdist__tp_t *tp, int to, const void *sbuf,            \
                                           size_t slen, int from, void *rbuf, size_t rlen,       \
                                           int64_t deadline_ms);                                 \
    void tdist__##pfx##_abort(tdist__tp_t *tp);                                                  \
    void tdist__##pfx##_destroy(tdist__tp_t *tp)

TDIST__TP_DECLARE_OPS(tcp);
TDIST__TP_DECLARE_OPS(shm);

/* Request bookkeeping every kind shares (transport.c). */

/* Finish req with st and unlink it from its queue. */
void tdist__tp_req_finish(tdist__tp_req_t *req, tdist_status_t st);

/* The argument checks of post_send / post_recv (fn names the call).
 * has_req: the request pointer is not NULL (passed as a flag: the request
 * is not initialised yet, and the compiler must not think it is read). */
tdist_status_t tdist__tp_check_post(int rank, int size, bool has_req, int peer, const void *buf,
                                    size_t len, const char *fn);

/* Fill req for a new post and, unless it is empty (finished at once),
 * append it to the queue (*head, *tail) of its peer and direction. */
void tdist__tp_req_enqueue(tdist__tp_req_t *req, int peer, void *buf, size_t len, bool is_send,
                           tdist__tp_req_t **head, tdist__tp_req_t **tail);

/* Shared-memory only (transport.h, "Shared-memory collectives"). */
void *tdist__shm_area(tdist__tp_t *tp, int r, size_t *bytes);
tdist_status_t tdist__shm_wait_until(tdist__tp_t *tp, bool (*cond)(void *arg),
                                     bool (*needs)(void *arg, int peer), void *arg,
                                     int64_t deadline_ms, unsigned flags);
void tdist__shm_notify(tdist__tp_t *tp);
bool tdist__shm_oversubscribed(tdist__tp_t *tp);
int tdist__shm_cpu_of(tdist__tp_t *tp, int r);

#endif /* TDIST_TRANSPORT_OPS_H */
