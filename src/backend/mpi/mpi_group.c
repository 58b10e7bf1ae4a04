/*
 * backend/mpi/mpi_group.c — the MPI backend's groups and send / recv
 * (docs/mpi.md; state and threads: mpi_internal.h).
 *
 * World group: duplicates of MPI_COMM_WORLD; tdist's world rank r must be
 * MPI_COMM_WORLD rank r (true for worlds made by mpi://, checked).
 * Subgroups (tdist_pg_new_group, tdist_pg_split): pg/ decides the members
 * and checks them as for a native group (the store list check, the split's
 * all_gather), then only the members call MPI_Comm_create_group on the
 * parent's mgmt communicator with the members in subgroup order.
 *
 * Send / recv: pg's p2p thread hands each over (backend/backend.h); the
 * backend posts pg's 24-byte header (tag 1, through a copy it owns, so a
 * header receive left pending never writes into pg's memory) and the
 * payload (tag 2) on the p2p communicator and polls them; pg checks the
 * header, the deadline and the order.
 */
#include <limits.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend/mpi/mpi_internal.h"
#include "tdist/init.h"
#include "backend/mpi/host.h" /* last: calls into the library go through its table */

#define TAG_HDR 1
#define TAG_PAYLOAD 2

/* ---------------------------------------------------------- shared helpers */

int64_t tdist__mpi_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

tdist_status_t tdist__mpi_error(int rc, tdist_status_t st, const char *what)
{
    char s[MPI_MAX_ERROR_STRING];
    int len = 0, cls = 0;
    if (MPI_Error_string(rc, s, &len) != MPI_SUCCESS) snprintf(s, sizeof s, "MPI error %d", rc);
    MPI_Error_class(rc, &cls);
    return tdist__error(st, "%s failed: %s (MPI error class %d)", what, s, cls);
}

/* Whether the wait's pause still spins (tdist__mpi_backoff). */
static bool spinning(const tdist__mpib_t *b, int64_t waited_us)
{
    return !b->oversub && waited_us < 10000;
}

void tdist__mpi_backoff(const tdist__mpib_t *b, int64_t waited_us)
{
    /* spin as MPI_Wait does while the node has a CPU per rank; the first
     * 10 ms cover a 64 MiB all_reduce's steps on shared memory */
    if (spinning(b, waited_us)) return;
    if (waited_us < 200000) {
        sched_yield();
        return;
    }
    struct timespec ts = {0, waited_us < 2000000 ? 100000 : 1000000};
    nanosleep(&ts, NULL);
}

/* Note the peer of the first request still pending (peer[i]: request i's)
 * when it is not the one noted last. */
static void note_first_pending(tdist__mpib_t *b, const MPI_Request *r, const int *peer, int n,
                               int *noted)
{
    for (int i = 0; i < n; i++) {
        if (r[i] == MPI_REQUEST_NULL) continue;
        if (peer[i] != *noted) {
            *noted = peer[i];
            b->on_wait(b->on_wait_arg, peer[i]);
        }
        return;
    }
}

/* The timeout of a wait that knows its peers: it names the first still
 * pending (the receives come first: a rank whose message never came). */
static tdist_status_t timeout_on(const MPI_Request *r, const int *peer, int n,
                                 int64_t timeout_ms, const char *what)
{
    int i = 0;
    while (i < n - 1 && r[i] == MPI_REQUEST_NULL) i++;
    return tdist__error(TDIST_ERR_TIMEOUT,
                        "%s did not complete within %lld ms: waiting on rank %d (it did not "
                        "call it, or is stuck or dead; MPI cannot cancel it, so the group is "
                        "failed)",
                        what, (long long)timeout_ms, peer[i]);
}

tdist_status_t tdist__mpi_wait_peers(const _Atomic bool *aborted, tdist__mpib_t *b, MPI_Request *r,
                                     const int *peer, int n, int64_t deadline_ms,
                                     int64_t timeout_ms, const char *what, int *noted)
{
    int64_t t0 = tdist__mpi_now_us();
    if (noted) *noted = -1;
    for (;;) {
        bool all = true;
        for (int i = 0; i < n; i++) {
            if (r[i] == MPI_REQUEST_NULL) continue;
            int flag = 0;
            MPI_Status s;
            int rc = MPI_Test(&r[i], &flag, &s);
            if (rc != MPI_SUCCESS) {
                b->leaked = true;
                return tdist__mpi_error(rc, TDIST_ERR_CONNECTION, what);
            }
            if (!flag) all = false;
        }
        if (all) return TDIST_OK;
        if (aborted && atomic_load(aborted)) {
            b->leaked = true;
            return tdist__error(TDIST_ERR_ABORTED, "the group was aborted while %s was pending",
                                what);
        }
        if (tdist__now_ms() >= deadline_ms) {
            b->leaked = true;
            if (peer) return timeout_on(r, peer, n, timeout_ms, what);
            return tdist__error(TDIST_ERR_TIMEOUT,
                                "%s did not complete within %lld ms (timeout: a rank did not "
                                "call it, or is stuck or dead; MPI cannot cancel it, so the "
                                "group is failed)",
                                what, (long long)timeout_ms);
        }
        int64_t waited = tdist__mpi_now_us() - t0;
        if (peer && noted && b->on_wait && !spinning(b, waited))
            note_first_pending(b, r, peer, n, noted);
        tdist__mpi_backoff(b, waited);
    }
}

tdist_status_t tdist__mpi_wait(const _Atomic bool *aborted, tdist__mpib_t *b, MPI_Request *r,
                               int n, int64_t deadline_ms, int64_t timeout_ms, const char *what)
{
    return tdist__mpi_wait_peers(aborted, b, r, NULL, n, deadline_ms, timeout_ms, what, NULL);
}

/* ------------------------------------------------------------------ groups */

static void mpi_destroy(void *be)
{
    tdist__mpib_t *b = be;
    if (!b) return;
    if (b->coll != MPI_COMM_NULL) MPI_Comm_free(&b->coll);
    if (b->p2p != MPI_COMM_NULL) MPI_Comm_free(&b->p2p);
    if (b->mgmt != MPI_COMM_NULL) MPI_Comm_free(&b->mgmt);
    if (!b->leaked) free(b->tmp); /* else MPI may still write into it */
    free(b->ic);
    free(b->id);
    free(b->ic2);
    free(b->id2);
    free(b->xr);
    free(b->xpeer);
    free(b);
}

static bool mpi_holds_memory(void *be) { return be && ((tdist__mpib_t *)be)->leaked; }

static void mpi_on_wait(void *be, void (*fn)(void *arg, int peer), void *arg)
{
    tdist__mpib_t *b = be;
    b->on_wait = fn;
    b->on_wait_arg = arg;
}

/* Ranks of this node in comm (MPI_Comm_split_type SHARED). */
static int node_size(MPI_Comm comm)
{
    MPI_Comm node;
    int n = 1, rank = 0;
    MPI_Comm_rank(comm, &rank);
    if (MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node) != MPI_SUCCESS)
        return 1;
    MPI_Comm_size(node, &n);
    MPI_Comm_free(&node);
    return n;
}

/* A group's state over comm (taken over: freed on failure). */
static tdist_status_t be_make(MPI_Comm comm, void **out)
{
    tdist__mpib_t *b = calloc(1, sizeof *b);
    if (!b) {
        MPI_Comm_free(&comm);
        return tdist__error(TDIST_ERR_NO_MEMORY, "MPI backend: out of memory");
    }
    b->coll = comm;
    b->p2p = MPI_COMM_NULL;
    b->mgmt = MPI_COMM_NULL;
    MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
    int size = 1;
    MPI_Comm_size(comm, &size);
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    b->oversub = ncpu > 0 && node_size(comm) > ncpu;
    size_t n = (size_t)size;
    b->ic = calloc(n, sizeof(int));
    b->id = calloc(n, sizeof(int));
    b->ic2 = calloc(n, sizeof(int));
    b->id2 = calloc(n, sizeof(int));
    b->xr = calloc(2 * n, sizeof(MPI_Request));
    b->xpeer = calloc(2 * n, sizeof(int));
    tdist_status_t st = TDIST_OK;
    int rc = MPI_SUCCESS;
    if (!b->ic || !b->id || !b->ic2 || !b->id2 || !b->xr || !b->xpeer) {
        st = tdist__error(TDIST_ERR_NO_MEMORY, "MPI backend: out of memory");
    } else {
        rc = MPI_Comm_dup(comm, &b->p2p);
        if (rc == MPI_SUCCESS) rc = MPI_Comm_dup(comm, &b->mgmt);
        if (rc != MPI_SUCCESS) st = tdist__mpi_error(rc, TDIST_ERR_SYSTEM, "MPI_Comm_dup");
    }
    if (st != TDIST_OK) {
        mpi_destroy(b);
        return st;
    }
    MPI_Comm_set_errhandler(b->p2p, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(b->mgmt, MPI_ERRORS_RETURN);
    *out = b;
    return TDIST_OK;
}

static tdist_status_t mpi_create_world(tdist_world_t *world, void **be, int *rank, int *size)
{
    int inited = 0, finalized = 0, level = MPI_THREAD_SINGLE;
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    if (!inited || finalized)
        return tdist__error(TDIST_ERR_NOT_SUPPORTED,
                            "the MPI backend needs MPI: launch with mpirun and join with "
                            "tdist_init(\"mpi://\") (or env:// with TDIST_BACKEND=mpi under mpirun)%s",
                            finalized ? "; MPI is already finalized" : "");
    MPI_Query_thread(&level);
    if (level < MPI_THREAD_MULTIPLE)
        return tdist__error(TDIST_ERR_NOT_SUPPORTED,
                            "MPI was initialised without MPI_THREAD_MULTIPLE (level %d); the "
                            "MPI backend's engine and p2p threads call MPI",
                            level);
    int wsize = tdist_world_size(world), wrank = tdist_world_rank(world);
    int msize = 0, mrank = -1;
    MPI_Comm_size(MPI_COMM_WORLD, &msize);
    MPI_Comm_rank(MPI_COMM_WORLD, &mrank);
    if (msize != wsize || mrank != wrank)
        return tdist__error(TDIST_ERR_NOT_SUPPORTED,
                            "the MPI backend needs the world to be MPI_COMM_WORLD, but this "
                            "world has rank %d of %d and MPI_COMM_WORLD rank %d of %d (launch "
                            "with mpirun and tdist_init(\"mpi://\"))",
                            wrank, wsize, mrank, msize);
    MPI_Comm comm;
    int rc = MPI_Comm_dup(MPI_COMM_WORLD, &comm);
    if (rc != MPI_SUCCESS) return tdist__mpi_error(rc, TDIST_ERR_SYSTEM, "MPI_Comm_dup");
    *rank = mrank;
    *size = msize;
    return be_make(comm, be);
}

static tdist_status_t mpi_create_sub(void *parent, const int *members, int n, int tag, void **be)
{
    tdist__mpib_t *pb = parent;
    MPI_Group pgrp, sgrp;
    MPI_Comm_group(pb->mgmt, &pgrp);
    int rc = MPI_Group_incl(pgrp, n, members, &sgrp);
    MPI_Group_free(&pgrp);
    if (rc != MPI_SUCCESS) return tdist__mpi_error(rc, TDIST_ERR_SYSTEM, "MPI_Group_incl");
    MPI_Comm comm = MPI_COMM_NULL;
    rc = MPI_Comm_create_group(pb->mgmt, sgrp, tag, &comm);
    MPI_Group_free(&sgrp);
    if (rc != MPI_SUCCESS || comm == MPI_COMM_NULL)
        return tdist__mpi_error(rc, TDIST_ERR_SYSTEM, "MPI_Comm_create_group");
    return be_make(comm, be);
}

/* --------------------------------------------------------------------- p2p */

/* One send / recv's MPI state: its requests and its own copy of pg's
 * header (a receive left pending writes here, never into pg's memory). */
typedef struct p2p_state {
    MPI_Request hreq, preq;
    uint8_t hdr[64];
} p2p_state_t;

static tdist_status_t mpi_p2p_post(void *be, tdist__be_p2p_t *op)
{
    tdist__mpib_t *b = be;
    if (op->count > INT_MAX)
        return tdist__error(TDIST_ERR_NOT_SUPPORTED, "more than INT_MAX elements in one MPI "
                            "send/recv");
    p2p_state_t *s = calloc(1, sizeof *s);
    if (!s || op->hdr_len > sizeof s->hdr) {
        free(s);
        return tdist__error(TDIST_ERR_NO_MEMORY, "MPI backend p2p: out of memory");
    }
    s->hreq = s->preq = MPI_REQUEST_NULL;
    int hl = (int)op->hdr_len, rc;
    if (op->send) {
        memcpy(s->hdr, op->hdr, op->hdr_len);
        rc = MPI_Isend(s->hdr, hl, MPI_BYTE, op->peer, TAG_HDR, b->p2p, &s->hreq);
        if (rc == MPI_SUCCESS)
            rc = MPI_Isend(op->buf, (int)op->count, tdist__mpi_dtype(op->dtype), op->peer, TAG_PAYLOAD,
                           b->p2p, &s->preq);
    } else {
        rc = MPI_Irecv(s->hdr, hl, MPI_BYTE, op->peer, TAG_HDR, b->p2p, &s->hreq);
        if (rc == MPI_SUCCESS)
            rc = MPI_Irecv(op->buf, (int)op->count, tdist__mpi_dtype(op->dtype), op->peer, TAG_PAYLOAD,
                           b->p2p, &s->preq);
    }
    if (rc != MPI_SUCCESS) {
        b->leaked = true; /* whatever was posted stays with MPI, s with it */
        return tdist__mpi_error(rc, TDIST_ERR_CONNECTION, op->send ? "MPI_Isend" : "MPI_Irecv");
    }
    op->state = s;
    return TDIST_OK;
}

static tdist_status_t mpi_p2p_test(void *be, tdist__be_p2p_t *op, bool *hdr_in)
{
    tdist__mpib_t *b = be;
    p2p_state_t *s = op->state;
    int hf = 0, pf = 0;
    bool had_hdr = s->hreq == MPI_REQUEST_NULL;
    int rc = MPI_Test(&s->hreq, &hf, MPI_STATUS_IGNORE);
    if (rc == MPI_SUCCESS) rc = MPI_Test(&s->preq, &pf, MPI_STATUS_IGNORE);
    if (s->hreq == MPI_REQUEST_NULL && !had_hdr && !op->send) memcpy(op->hdr, s->hdr, op->hdr_len);
    *hdr_in = s->hreq == MPI_REQUEST_NULL;
    if (rc != MPI_SUCCESS) {
        b->leaked = true;
        return tdist__mpi_error(rc, TDIST_ERR_CONNECTION, op->send ? "MPI_Isend" : "MPI_Irecv");
    }
    return s->hreq == MPI_REQUEST_NULL && s->preq == MPI_REQUEST_NULL ? TDIST_OK
                                                                      : TDIST_INPROGRESS;
}

/* A recv that failed while its payload receive is still posted must not
 * return while MPI may still write into the caller's buffer: cancel the
 * receive and wait (bounded) until MPI lets go of it — at once when it was
 * not matched, when the data is in when it was. Only a payload still on
 * its way from a peer that never delivers it outlives the bound (then the
 * buffer stays MPI's, as after a timeout; docs/mpi.md). */
#define SETTLE_MS 2000
static void settle_recv(p2p_state_t *s)
{
    if (s->preq == MPI_REQUEST_NULL) return;
    MPI_Cancel(&s->preq);
    int64_t until = tdist__now_ms() + SETTLE_MS;
    for (int i = 0; i < 1000000 && s->preq != MPI_REQUEST_NULL; i++) {
        int flag = 0;
        if (MPI_Test(&s->preq, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS) break;
        if (flag || tdist__now_ms() >= until) break;
        if (i > 100) tdist__sleep_ms(1);
    }
}

static void mpi_p2p_release(void *be, tdist__be_p2p_t *op, bool failed)
{
    tdist__mpib_t *b = be;
    p2p_state_t *s = op->state;
    op->state = NULL;
    if (!s) return;
    if (failed && !op->send) settle_recv(s);
    if (s->hreq == MPI_REQUEST_NULL && s->preq == MPI_REQUEST_NULL) {
        free(s);
        return;
    }
    b->leaked = true; /* a pending request keeps pointing into s: leave it to MPI */
}

/* A background thread: yield for 1 ms, then sleep 50 us (1 ms after 200 ms). */
static void mpi_p2p_idle(void *be, int64_t idle_us)
{
    (void)be;
    if (idle_us < 1000) {
        sched_yield();
        return;
    }
    struct timespec ts = {0, idle_us < 200000 ? 50000 : 1000000};
    nanosleep(&ts, NULL);
}

const tdist__backend_t tdist__backend_mpi = {
    .name = "mpi",
    .create_world = mpi_create_world,
    .create_sub = mpi_create_sub,
    .coll = &tdist__mpi_slots,
    .p2p_post = mpi_p2p_post,
    .p2p_test = mpi_p2p_test,
    .p2p_release = mpi_p2p_release,
    .p2p_idle = mpi_p2p_idle,
    .holds_memory = mpi_holds_memory,
    .on_wait = mpi_on_wait,
    .destroy = mpi_destroy,
};
