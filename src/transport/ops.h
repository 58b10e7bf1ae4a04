/*
 * transport/ops.h — internal to src/transport/: what the kinds (tcp.c,
 * shm.c) share and the per-kind function table behind the tdist__tp_*
 * functions of transport.h.
 *
 * transport.c holds everything that is the same for every kind: the
 * shared part of a transport (struct tdist__tp below, which every kind's
 * struct starts with), posting requests onto per-peer queues, the sticky
 * failure, waiting for requests with a deadline, the blocking
 * send/recv/sendrecv, and the messages that name peers. A kind supplies
 * only what differs — opening its end, connecting the mesh, moving bytes
 * (progress), waking a blocked thread, and closing — through the table
 * below, which transport.c reaches by the transport's kind.
 */
#ifndef TDIST_TRANSPORT_OPS_H
#define TDIST_TRANSPORT_OPS_H

#include <poll.h>
#include <stdatomic.h>

#include "transport/transport.h"

#define TDIST__TP_LABEL_LEN 64    /* "[<45 chars>]:65535" fits, and "pid 4194304" */
#define TDIST__TP_PROBLEM_LEN 160
#define TDIST__TP_ERRMSG_LEN 1024

/* What every kind keeps per peer. */
typedef struct tdist__tp_chan {
    tdist__tp_req_t *sq_head, *sq_tail; /* sends, in post order */
    tdist__tp_req_t *rq_head, *rq_tail; /* receives, in post order */
    bool up;                            /* set-up with this peer is done */
    char label[TDIST__TP_LABEL_LEN];    /* how messages name it: its address (TCP), "pid N" (shm) */
    char problem[TDIST__TP_PROBLEM_LEN]; /* set-up: why it is not up yet */
} tdist__tp_chan_t;

/* The part of a transport every kind shares; each kind's struct starts
 * with it, so a tdist__tp_t * is also a pointer to the kind's struct. */
struct tdist__tp {
    tdist__tp_kind_t kind; /* picks the table */
    int rank, size;
    uint64_t tag;
    bool connected;        /* connect succeeded */
    atomic_bool aborted;   /* tdist__tp_abort was called (any thread) */
    tdist_status_t err;    /* sticky: TDIST_OK until the first failure */
    tdist__tp_chan_t *chan; /* size entries; chan[rank] unused */
    struct pollfd *pfd;    /* size + 1 entries, for the kind's polls */
    int *pfd_peer;         /* which peer each pfd entry is (-1: none) */
    char addr[96];         /* this rank's address, tdist__tp_address */
    char errmsg[TDIST__TP_ERRMSG_LEN];
    /* tdist__tp_on_wait's hook (NULL: none), called by the slow path only */
    void (*on_wait)(void *arg, int peer);
    void *on_wait_arg;
};

/* A wait on tp stops spinning: tell the hook the peer it waits on (a
 * channel's pending receive first, else a send; peer >= 0 given: that
 * one). Slow path only; cheap when no hook is set. */
void tdist__tp_waiting_on(tdist__tp_t *tp, int peer);

/* A kind's functions. Each is called by transport.c only, with a non-NULL
 * tp of that kind. */
typedef struct tdist__tp_ops {
    /* tdist__tp_listen's contract; kind is the table's own. */
    tdist_status_t (*listen)(tdist__tp_kind_t kind, int rank, int size,
                             const tdist__tp_opts_t *opts, tdist__tp_t **out);
    /* tdist__tp_connect's contract. */
    tdist_status_t (*connect)(tdist__tp_t *tp, const char *const *addrs, int64_t deadline_ms);
    /* tdist__tp_progress's, on a transport transport.c found connected,
     * not failed and not aborted. */
    tdist_status_t (*progress)(tdist__tp_t *tp, int timeout_ms);
    /* Wake a thread blocked in connect or progress: tp->aborted is set.
     * Any thread, also a signal handler: async-signal-safe calls only. */
    void (*wake)(tdist__tp_t *tp);
    /* tdist__tp_destroy's contract. */
    void (*destroy)(tdist__tp_t *tp);
} tdist__tp_ops_t;

#define TDIST__TP_DECLARE_OPS(pfx)                                                               \
    tdist_status_t tdist__##pfx##_listen(tdist__tp_kind_t kind, int rank, int size,              \
                                         const tdist__tp_opts_t *opts, tdist__tp_t **out);       \
    tdist_status_t tdist__##pfx##_connect(tdist__tp_t *tp, const char *const *addrs,             \
                                          int64_t deadline_ms);                                  \
    tdist_status_t tdist__##pfx##_progress(tdist__tp_t *tp, int timeout_ms);                     \
    void tdist__##pfx##_wake(tdist__tp_t *tp);                                                   \
    void tdist__##pfx##_destroy(tdist__tp_t *tp)

TDIST__TP_DECLARE_OPS(tcp);
TDIST__TP_DECLARE_OPS(shm);

/* ---- the shared part (transport.c) ----
 *
 * Called by the kinds on their own transport, from its driving thread
 * (set-up, progress, destroy), never concurrently on one tp. None blocks.
 * Only tdist__tp_base_init allocates (the per-peer arrays, which
 * tdist__tp_base_fini frees); messages are copied into tp or the thread's
 * last error. */

/* Fill the shared part of a newly zeroed transport and allocate its
 * per-peer arrays. On failure (TDIST_ERR_NO_MEMORY, message set) nothing
 * is left allocated. */
tdist_status_t tdist__tp_base_init(tdist__tp_t *tp, tdist__tp_kind_t kind, int rank, int size,
                                   uint64_t tag);

/* Free what tdist__tp_base_init allocated (tp itself is the kind's). */
void tdist__tp_base_fini(tdist__tp_t *tp);

/* The transport's sticky error, set again as this thread's last error. */
tdist_status_t tdist__tp_sticky(const tdist__tp_t *tp);

/* Fail the transport with st and a message (the first failure wins, and
 * is logged): every pending request finishes with it. Returns the sticky
 * status. */
tdist_status_t tdist__tp_fail(tdist__tp_t *tp, tdist_status_t st, const char *fmt, ...)
    TDIST_PRINTF(3, 4);

/* tdist__tp_fail with TDIST_ERR_ABORTED: "rank R: transport aborted". */
tdist_status_t tdist__tp_fail_aborted(tdist__tp_t *tp);

/* Fail the transport (TDIST_ERR_CONNECTION unless st says otherwise)
 * because peer is lost: "rank R: peer rank P (<label>)<how>", followed by
 * what req (may be NULL) was doing ("(sending N bytes, D done)"). how
 * starts with its own separator (" exited", ": socket error: ..."). */
tdist_status_t tdist__tp_fail_peer(tdist__tp_t *tp, tdist_status_t st, int peer,
                                   const tdist__tp_req_t *req, const char *how);

/* Note why set-up with peer is not done yet (named at the deadline). */
void tdist__tp_set_problem(tdist__tp_t *tp, int peer, const char *fmt, ...) TDIST_PRINTF(3, 4);

/* Set-up's deadline passed: fail the transport with TDIST_ERR_TIMEOUT
 * naming every peer not up yet and its problem: "rank R: <what> set-up
 * timed out after N ms; missing peer ranks: peer rank P (<label>): ...". */
tdist_status_t tdist__tp_setup_timeout(tdist__tp_t *tp, const char *what, int64_t start_ms);

/* Finish req with st and unlink it from its queue. */
static inline void tdist__tp_req_finish(tdist__tp_req_t *req, tdist_status_t st)
{
    req->finished = true;
    req->status = st;
    req->next = NULL;
}

/* n more bytes of req, the head of the queue (*head, *tail), have moved;
 * once all have, take it off the queue and finish it. The kinds' data
 * paths call it for every copy or send: inline. */
static inline void tdist__tp_req_moved(tdist__tp_req_t *req, size_t n, tdist__tp_req_t **head,
                                       tdist__tp_req_t **tail)
{
    req->done += n;
    if (req->done == req->len) {
        *head = req->next;
        if (!*head) *tail = NULL;
        tdist__tp_req_finish(req, TDIST_OK);
    }
}

/* Shared-memory only (transport.h, "Shared-memory collectives"). */
void *tdist__shm_area(tdist__tp_t *tp, int r, size_t *bytes);
tdist_status_t tdist__shm_wait_until(tdist__tp_t *tp, bool (*cond)(void *arg),
                                     bool (*needs)(void *arg, int peer), void *arg,
                                     int64_t deadline_ms, unsigned flags);
void tdist__shm_notify(tdist__tp_t *tp);
bool tdist__shm_oversubscribed(tdist__tp_t *tp);
int tdist__shm_cpu_of(tdist__tp_t *tp, int r);

#endif /* TDIST_TRANSPORT_OPS_H */
