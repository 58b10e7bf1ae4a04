/*
 * init/internal.h — the rendezvous protocol shared by init.c (URL parsing,
 * environment, who hosts the store) and rendezvous.c (registration, the
 * wait for every rank, leaving).
 *
 * Every key below lives in the store view given to the rendezvous, which
 * init.c makes as prefix "tdist/g<restart generation>/rdzv" over the job's
 * base store (the user's view of the world is "tdist/g<gen>/user"):
 *
 *   rank/<r>      "<world_size> <pid> <nonce> <host>" of the process that
 *                 owns rank r (compare_set: the first claim wins)
 *   world_size    "<world_size> <rank> <pid> <host>" of the first rank to
 *                 register (compare_set); every later rank must agree
 *   joined        "<r>," appended by every rank that registered cleanly
 *   arrived       counter; the rendezvous is complete at world_size
 *   dup/<r>       the losing claim of rank r ("<ws> <pid> <nonce> <host>")
 *   abort         "<status> <message>": the first failure; every waiting
 *                 rank fails with it at once (compare_set: first wins)
 *   left          counter of ranks that have left (tdist_world_destroy, or
 *                 a failed rendezvous after registering)
 */
#ifndef TDIST_INIT_INTERNAL_H
#define TDIST_INIT_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "core/internal.h"
#include "tdist/init.h"

/* Poll interval of every rendezvous wait (ms). */
#define TDIST__RDZV_POLL_MS 10
/* How long rank 0, when it hosts the store, waits for the others to see a
 * failed rendezvous before it stops the server (ms, capped by the timeout). */
#define TDIST__RDZV_FAIL_LINGER_MS 3000

typedef struct tdist__rdzv {
    /* inputs (borrowed) */
    tdist_store_t *store;   /* the generation's rendezvous view */
    int rank;
    int world_size;
    const char *host;       /* this process's host name */
    int64_t timeout_ms;     /* for messages */
    /* outputs of tdist__rdzv_join */
    bool registered;        /* appended to "joined": must record leaving */
    int local_rank;
    int local_size;
} tdist__rdzv_t;

/* Register r->rank in r->store and wait until every rank has registered,
 * an abort is posted, or deadline_ms (absolute tdist__now_ms()) passes.
 * Polls every TDIST__RDZV_POLL_MS. On success fills local_rank/local_size
 * from the host names of all ranks. Errors: TDIST_ERR_DUPLICATE,
 * TDIST_ERR_MISMATCH, TDIST_ERR_TIMEOUT (the message lists the missing
 * ranks), or the store's error. Sets r->registered either way. */
tdist_status_t tdist__rdzv_join(tdist__rdzv_t *r, int64_t deadline_ms);

/* Record that this rank left (if it registered). If wait_for > 0, then
 * wait (polling, at most bound_ms) until "left" reaches wait_for — rank 0
 * does this before stopping the store server it hosts. If cleanup and this
 * rank is the last of world_size to leave, delete the rendezvous keys.
 * Never fails (errors are logged); keeps the caller's last error. */
void tdist__rdzv_leave(tdist__rdzv_t *r, int64_t wait_for, int64_t bound_ms, bool cleanup);

/* Number of ranks that registered cleanly (entries of "joined"); 0 on
 * error. Used by rank 0 to know how many to wait for after a failure. */
int64_t tdist__rdzv_num_joined(tdist__rdzv_t *r);

#endif /* TDIST_INIT_INTERNAL_H */
