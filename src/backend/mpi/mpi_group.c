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
 * Send / recv: each is handed to the group's p2p thread, which posts a
 * 24-byte header {magic, per-pair sequence, dtype, count} (tag 1) and the
 * payload (tag 2) on the p2p communicator and polls them; a receiver
 * checks the header as the native p2p path does (TDIST_ERR_MISMATCH,
 * sticky for the group's p2p path).
 */
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend/mpi/mpi_internal.h"
#include "tdist/init.h"
#include "backend/mpi/host.h" /* last: calls into the library go through its table */

#define P2P_MAGIC 0x74646d32u /* "tdm2" */
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

void tdist__mpi_backoff(const tdist__mpib_t *b, int64_t waited_us)
{
    /* spin as MPI_Wait does while the node has a CPU per rank; the first
     * 10 ms cover a 64 MiB all_reduce's steps on shared memory */
    if (!b->oversub && waited_us < 10000) return;
    if (waited_us < 200000) {
        sched_yield();
        return;
    }
    struct timespec ts = {0, waited_us < 2000000 ? 100000 : 1000000};
    nanosleep(&ts, NULL);
}

tdist_status_t tdist__mpi_wait(tdist_pg_t *pg, tdist__mpib_t *b, MPI_Request *r, int n,
                               int64_t deadline_ms, int64_t timeout_ms, const char *what)
{
    int64_t t0 = tdist__mpi_now_us();
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
        if (atomic_load(&pg->aborted)) {
            b->leaked = true;
            return tdist__error(TDIST_ERR_ABORTED, "the group was aborted while %s was pending",
                                what);
        }
        if (tdist__now_ms() >= deadline_ms) {
            b->leaked = true;
            return tdist__error(TDIST_ERR_TIMEOUT,
                                "%s did not complete within %lld ms (timeout: a rank did not "
                                "call it, or is stuck or dead; MPI cannot cancel it, so the "
                                "group is failed)",
                                what, (long long)timeout_ms);
        }
        tdist__mpi_backoff(b, tdist__mpi_now_us() - t0);
    }
}

/* ------------------------------------------------------------------ groups */

static void be_free(tdist__mpib_t *b)
{
    if (!b) return;
    if (b->coll != MPI_COMM_NULL) MPI_Comm_free(&b->coll);
    if (b->p2p != MPI_COMM_NULL) MPI_Comm_free(&b->p2p);
    if (b->mgmt != MPI_COMM_NULL) MPI_Comm_free(&b->mgmt);
    if (!b->leaked) free(b->tmp); /* else MPI may still write into it */
    free(b->ic);
    free(b->id);
    free(b->ic2);
    free(b->id2);
    free(b);
}

static void mpi_destroy(tdist_pg_t *pg)
{
    tdist__mpib_t *b = pg->be;
    if (!b) return;
    if (b->leaked) { /* pending requests may still write these: leave them to MPI */
        pg->fp_mine = NULL;
        pg->fp_theirs = NULL;
    }
    be_free(b);
    pg->be = NULL;
}

static void mpi_abort(tdist_pg_t *pg)
{
    (void)pg; /* the waits poll pg->aborted; pg's abort wakes the p2p thread */
}

/* A group over comm (taken over: freed on failure). */
static tdist_status_t pg_make(tdist_world_t *world, tdist_store_t *store, MPI_Comm comm,
                              int *wranks, const char *uid, const char *name, int64_t timeout_ms,
                              int n_local, tdist_pg_t **out)
{
    tdist_pg_t *pg = calloc(1, sizeof *pg);
    tdist__mpib_t *b = calloc(1, sizeof *b);
    if (!pg || !b) {
        free(pg);
        free(b);
        free(wranks);
        MPI_Comm_free(&comm);
        return tdist__error(TDIST_ERR_NO_MEMORY, "group %s: out of memory", name);
    }
    b->coll = comm;
    b->p2p = MPI_COMM_NULL;
    b->mgmt = MPI_COMM_NULL;
    pg->fp_have = -1;
    pthread_mutex_init(&pg->mu, NULL);
    pthread_cond_init(&pg->cv, NULL);
    pthread_cond_init(&pg->p2p_cv, NULL);
    pg->backend = &tdist__backend_mpi;
    pg->be = b;
    pg->kind = TDIST__TP_SHM; /* unused: no meshes */
    pg->world = world;
    pg->store = store;
    int rank = 0, size = 1;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    pg->rank = rank;
    pg->size = size;
    pg->wranks = wranks;
    pg->uid = tdist__strdup(uid);
    pg->name = tdist__strdup(name);
    pg->timeout_ms = timeout_ms;
    pg->uid_hash = tdist__fnv1a(TDIST__FNV_INIT, uid, strlen(uid));
    int64_t chk = 1;
    if (tdist__env_int("TDIST_CHECK_FINGERPRINT", 0, 1, &chk) == TDIST_ERR_INVALID_ARG) chk = 1;
    tdist_clear_error();
    pg->check_fp = chk != 0;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    b->oversub = ncpu > 0 && n_local > ncpu;
    size_t n = (size_t)size;
    pg->fp_mine = calloc(n, sizeof *pg->fp_mine);
    pg->fp_theirs = calloc(n, sizeof *pg->fp_theirs);
    pg->p2p_send_seq = calloc(n, sizeof(uint64_t));
    pg->p2p_recv_seq = calloc(n, sizeof(uint64_t));
    b->ic = calloc(n, sizeof(int));
    b->id = calloc(n, sizeof(int));
    b->ic2 = calloc(n, sizeof(int));
    b->id2 = calloc(n, sizeof(int));
    tdist_status_t st = TDIST_OK;
    if (!pg->uid || !pg->name || !pg->fp_mine || !pg->fp_theirs || !pg->p2p_send_seq ||
        !pg->p2p_recv_seq || !b->ic || !b->id || !b->ic2 || !b->id2) {
        st = tdist__error(TDIST_ERR_NO_MEMORY, "group %s: out of memory", name);
        goto fail;
    }
    MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
    int rc = MPI_Comm_dup(comm, &b->p2p);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_dup(comm, &b->mgmt);
    if (rc != MPI_SUCCESS) {
        st = tdist__mpi_error(rc, TDIST_ERR_SYSTEM, "MPI_Comm_dup");
        goto fail;
    }
    MPI_Comm_set_errhandler(b->p2p, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(b->mgmt, MPI_ERRORS_RETURN);
    TDIST_CHECK_GOTO(tdist__pg_start_engine(pg), st, fail);
    TDIST_LOGD("group %s: rank %d of %d on the MPI backend", pg->name, pg->rank, pg->size);
    *out = pg;
    return TDIST_OK;
fail:
    mpi_destroy(pg);
    pthread_mutex_destroy(&pg->mu);
    pthread_cond_destroy(&pg->cv);
    pthread_cond_destroy(&pg->p2p_cv);
    free(pg->wranks);
    free(pg->uid);
    free(pg->name);
    free(pg->fp_mine);
    free(pg->fp_theirs);
    free(pg->p2p_send_seq);
    free(pg->p2p_recv_seq);
    free(pg);
    return st;
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

static tdist_status_t mpi_create_world(tdist_world_t *world, const tdist_pg_opts_t *opts,
                                       tdist_pg_t **out)
{
    static const char *fn = "tdist_pg_create_world";
    int inited = 0, finalized = 0, level = MPI_THREAD_SINGLE;
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    if (!inited || finalized)
        return tdist__error(TDIST_ERR_NOT_SUPPORTED,
                            "%s: the MPI backend needs MPI: launch with mpirun and join with "
                            "tdist_init(\"mpi://\") (or env:// with TDIST_BACKEND=mpi under mpirun)%s",
                            fn, finalized ? "; MPI is already finalized" : "");
    MPI_Query_thread(&level);
    if (level < MPI_THREAD_MULTIPLE)
        return tdist__error(TDIST_ERR_NOT_SUPPORTED,
                            "%s: MPI was initialised without MPI_THREAD_MULTIPLE (level %d); the "
                            "MPI backend's engine and p2p threads call MPI",
                            fn, level);
    int size = tdist_world_size(world), rank = tdist_world_rank(world);
    int msize = 0, mrank = -1;
    MPI_Comm_size(MPI_COMM_WORLD, &msize);
    MPI_Comm_rank(MPI_COMM_WORLD, &mrank);
    if (msize != size || mrank != rank)
        return tdist__error(TDIST_ERR_NOT_SUPPORTED,
                            "%s: the MPI backend needs the world to be MPI_COMM_WORLD, but this "
                            "world has rank %d of %d and MPI_COMM_WORLD rank %d of %d (launch "
                            "with mpirun and tdist_init(\"mpi://\"))",
                            fn, rank, size, mrank, msize);
    tdist_store_t *store = tdist_world_store(world);
    int *wranks = malloc((size_t)size * sizeof *wranks);
    if (!wranks) return tdist__error(TDIST_ERR_NO_MEMORY, "%s: out of memory", fn);
    for (int r = 0; r < size; r++) wranks[r] = r;
    int64_t timeout = opts ? opts->timeout_ms : tdist__default_timeout_ms(TDIST_PG_DEFAULT_TIMEOUT_MS);
    const char *name = opts && opts->name ? opts->name : "world";
    int k = tdist__world_next_group(world); /* as the native world group's uid */
    char uid[40];
    if (k == 0)
        snprintf(uid, sizeof uid, "mpiworld");
    else
        snprintf(uid, sizeof uid, "mpiworld~%d", k);
    MPI_Comm comm;
    int rc = MPI_Comm_dup(MPI_COMM_WORLD, &comm);
    if (rc != MPI_SUCCESS) {
        free(wranks);
        return tdist__mpi_error(rc, TDIST_ERR_SYSTEM, "tdist_pg_create_world: MPI_Comm_dup");
    }
    MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
    int nl = node_size(comm);
    tdist_status_t st = pg_make(world, store, comm, wranks, uid, name, timeout, nl, out);
    if (st != TDIST_OK) tdist__error_context(st, "%s: rank %d", fn, rank);
    return st;
}

static tdist_status_t mpi_create_sub(tdist_pg_t *parent, const int *members, int n, int me,
                                     const char *uid, const char *name, int64_t timeout_ms,
                                     tdist_pg_t **out)
{
    tdist__mpib_t *pb = parent->be;
    (void)me;
    int *wranks = malloc((size_t)n * sizeof *wranks);
    if (!wranks) return tdist__error(TDIST_ERR_NO_MEMORY, "group %s: out of memory", name);
    for (int i = 0; i < n; i++) wranks[i] = parent->wranks[members[i]];
    MPI_Group pgrp, sgrp;
    MPI_Comm_group(pb->mgmt, &pgrp);
    int rc = MPI_Group_incl(pgrp, n, members, &sgrp);
    MPI_Group_free(&pgrp);
    if (rc != MPI_SUCCESS) {
        free(wranks);
        return tdist__mpi_error(rc, TDIST_ERR_SYSTEM, "MPI_Group_incl");
    }
    /* the tag tells apart creations on the same parent (same count on every rank) */
    int tag = (parent->n_children - 1) & 0x7fff;
    MPI_Comm comm = MPI_COMM_NULL;
    rc = MPI_Comm_create_group(pb->mgmt, sgrp, tag, &comm);
    MPI_Group_free(&sgrp);
    if (rc != MPI_SUCCESS || comm == MPI_COMM_NULL) {
        free(wranks);
        return tdist__mpi_error(rc, TDIST_ERR_SYSTEM, "MPI_Comm_create_group");
    }
    MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
    int nl = node_size(comm);
    return pg_make(parent->world, parent->store, comm, wranks, uid, name, timeout_ms, nl, out);
}

/* --------------------------------------------------------------------- p2p */

typedef struct p2p_hdr {
    uint32_t magic;
    int32_t dtype;
    uint64_t seq;
    uint64_t count;
} p2p_hdr_t;

_Static_assert(sizeof(p2p_hdr_t) == 24, "p2p header is 24 bytes");

typedef struct tdist__mpi_p2p {
    struct tdist__mpi_p2p *next;
    struct tdist_work *w;
    MPI_Request hreq, preq;
    p2p_hdr_t hdr;
    bool hdr_checked;
    tdist_status_t st; /* TDIST_INPROGRESS until decided */
    char *msg;
} p2p_op_t;

static char *op_prefix(tdist_pg_t *pg, const struct tdist_work *w)
{
    char d[200];
    tdist__work_describe(w, d, sizeof d);
    return tdist__asprintf("rank %d group %s p2p #%llu %s", pg->rank, pg->name,
                           (unsigned long long)w->seq, d);
}

/* A recv that fails while its payload receive is still posted must not
 * return while MPI may still write into the caller's buffer: cancel the
 * receive and wait (bounded) until MPI lets go of it — at once when it was
 * not matched, when the data is in when it was. Only a payload still on
 * its way from a peer that never delivers it outlives the bound (then the
 * buffer stays MPI's, as after a timeout; docs/mpi.md). */
#define SETTLE_MS 2000
static void settle_recv(p2p_op_t *op)
{
    if (op->w->op != TDIST__OP_RECV || op->preq == MPI_REQUEST_NULL) return;
    MPI_Cancel(&op->preq);
    int64_t until = tdist__now_ms() + SETTLE_MS;
    for (int i = 0; i < 1000000 && op->preq != MPI_REQUEST_NULL; i++) {
        int flag = 0;
        if (MPI_Test(&op->preq, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS) break;
        if (flag || tdist__now_ms() >= until) break;
        if (i > 100) tdist__sleep_ms(1);
    }
}

/* Decide op's outcome (p2p thread). */
static void mark(tdist_pg_t *pg, p2p_op_t *op, tdist_status_t st, const char *cause)
{
    if (op->st != TDIST_INPROGRESS) return;
    if (st != TDIST_OK) settle_recv(op);
    op->st = st;
    if (st != TDIST_OK) {
        char *p = op_prefix(pg, op->w);
        op->msg = tdist__asprintf("%s: %s", p ? p : "p2p", cause);
        free(p);
    }
}

/* The group's p2p path fails for good (takes pg->mu). */
static void p2p_fail(tdist_pg_t *pg, tdist_status_t st, const char *msg)
{
    pthread_mutex_lock(&pg->mu);
    if (pg->p2p_err == TDIST_OK) {
        pg->p2p_err = st;
        pg->p2p_errmsg = tdist__strdup(msg);
    }
    pthread_mutex_unlock(&pg->mu);
}

static MPI_Datatype p2p_dt(tdist_dtype_t d)
{
    switch (d) {
    case TDIST_F32: return MPI_FLOAT;
    case TDIST_F64: return MPI_DOUBLE;
    case TDIST_I8: return MPI_INT8_T;
    case TDIST_U8: return MPI_UINT8_T;
    case TDIST_I32: return MPI_INT32_T;
    case TDIST_I64: return MPI_INT64_T;
    default: return MPI_UINT16_T; /* f16, bf16 */
    }
}

static void post(tdist_pg_t *pg, tdist__mpib_t *b, p2p_op_t *op)
{
    struct tdist_work *w = op->w;
    op->hreq = op->preq = MPI_REQUEST_NULL;
    if (w->count > INT_MAX) {
        mark(pg, op, TDIST_ERR_NOT_SUPPORTED, "more than INT_MAX elements in one MPI send/recv");
        return;
    }
    int rc;
    if (w->op == TDIST__OP_SEND) {
        op->hdr.magic = P2P_MAGIC;
        op->hdr.dtype = (int32_t)w->dtype;
        op->hdr.seq = w->seq;
        op->hdr.count = w->count;
        rc = MPI_Isend(&op->hdr, (int)sizeof op->hdr, MPI_BYTE, w->root, TAG_HDR, b->p2p, &op->hreq);
        if (rc == MPI_SUCCESS)
            rc = MPI_Isend(w->sendbuf, (int)w->count, p2p_dt(w->dtype), w->root, TAG_PAYLOAD,
                           b->p2p, &op->preq);
    } else {
        rc = MPI_Irecv(&op->hdr, (int)sizeof op->hdr, MPI_BYTE, w->root, TAG_HDR, b->p2p, &op->hreq);
        if (rc == MPI_SUCCESS)
            rc = MPI_Irecv(w->recvbuf, (int)w->count, p2p_dt(w->dtype), w->root, TAG_PAYLOAD,
                           b->p2p, &op->preq);
    }
    if (rc != MPI_SUCCESS) {
        tdist__mpi_error(rc, TDIST_ERR_CONNECTION, w->op == TDIST__OP_SEND ? "MPI_Isend" : "MPI_Irecv");
        char *cause = tdist__strdup(tdist_last_error());
        mark(pg, op, TDIST_ERR_CONNECTION, cause ? cause : "MPI failed");
        if (op->msg) p2p_fail(pg, TDIST_ERR_CONNECTION, op->msg);
        free(cause);
        b->leaked = true;
    }
}

static void check_hdr(tdist_pg_t *pg, p2p_op_t *op)
{
    struct tdist_work *w = op->w;
    const p2p_hdr_t *h = &op->hdr;
    op->hdr_checked = true;
    if (h->magic == P2P_MAGIC && h->dtype == (int32_t)w->dtype && h->seq == w->seq &&
        h->count == w->count)
        return;
    char cause[300];
    if (h->magic != P2P_MAGIC)
        snprintf(cause, sizeof cause,
                 "p2p mismatch: rank %d sent bytes that are not a send header (earlier send/recv "
                 "sizes disagree?)",
                 w->root);
    else
        snprintf(cause, sizeof cause, "p2p mismatch: rank %d sent #%llu send(%s, %llu) for this recv",
                 w->root, (unsigned long long)h->seq, tdist_dtype_name((tdist_dtype_t)h->dtype),
                 (unsigned long long)h->count);
    mark(pg, op, TDIST_ERR_MISMATCH, cause);
    p2p_fail(pg, TDIST_ERR_MISMATCH, op->msg ? op->msg : cause);
}

/* Poll op once (p2p thread); true if decided. */
static bool poll_op(tdist_pg_t *pg, tdist__mpib_t *b, p2p_op_t *op, bool stopping, int64_t now)
{
    if (op->st != TDIST_INPROGRESS) return true;
    struct tdist_work *w = op->w;
    int hf = 0, pf = 0, rc;
    MPI_Status s;
    rc = MPI_Test(&op->hreq, &hf, &s);
    if (rc == MPI_SUCCESS) rc = MPI_Test(&op->preq, &pf, &s);
    if (rc != MPI_SUCCESS) {
        tdist__mpi_error(rc, TDIST_ERR_CONNECTION, w->op == TDIST__OP_SEND ? "MPI_Isend" : "MPI_Irecv");
        char *cause = tdist__strdup(tdist_last_error());
        /* a payload longer than the recv (MPI_ERR_TRUNCATE) is a mismatch
         * the header check words better */
        if (w->op == TDIST__OP_RECV && hf && !op->hdr_checked) check_hdr(pg, op);
        mark(pg, op, TDIST_ERR_CONNECTION, cause ? cause : "MPI failed");
        if (op->st == TDIST_ERR_CONNECTION) p2p_fail(pg, op->st, op->msg ? op->msg : "MPI failed");
        free(cause);
        b->leaked = true;
        return true;
    }
    if (w->op == TDIST__OP_RECV && op->hreq == MPI_REQUEST_NULL && !op->hdr_checked) check_hdr(pg, op);
    if (op->st != TDIST_INPROGRESS) return true;
    if (op->hreq == MPI_REQUEST_NULL && op->preq == MPI_REQUEST_NULL) {
        mark(pg, op, TDIST_OK, NULL);
        return true;
    }
    if (stopping) {
        pthread_mutex_lock(&pg->mu);
        tdist_status_t e = pg->p2p_err;
        char *why = e != TDIST_OK ? tdist__strdup(pg->p2p_errmsg) : NULL;
        pthread_mutex_unlock(&pg->mu);
        if (e != TDIST_OK)
            mark(pg, op, e, why ? why : "the group's p2p path failed");
        else
            mark(pg, op, TDIST_ERR_ABORTED, "the group was aborted");
        free(why);
        b->leaked = true;
        return true;
    }
    if (now >= w->deadline_ms) {
        char cause[200];
        snprintf(cause, sizeof cause, "timed out after %lld ms (rank %d did not %s)",
                 (long long)w->timeout_ms, w->root,
                 w->op == TDIST__OP_SEND ? "receive it" : "send");
        mark(pg, op, TDIST_ERR_TIMEOUT, cause);
        p2p_fail(pg, TDIST_ERR_TIMEOUT, op->msg ? op->msg : cause);
        b->leaked = true;
        return true;
    }
    return false;
}

static void *p2p_main(void *arg)
{
    tdist_pg_t *pg = arg;
    tdist__mpib_t *b = pg->be;
    int64_t idle_since = tdist__mpi_now_us();
    pthread_mutex_lock(&pg->mu);
    for (;;) {
        /* take what was submitted, in order */
        struct tdist_work *sub = pg->p2p_head;
        pg->p2p_head = pg->p2p_tail = NULL;
        bool stopping = pg->stop || atomic_load(&pg->aborted) || pg->p2p_err != TDIST_OK;
        pthread_mutex_unlock(&pg->mu);
        p2p_op_t **tail = &b->active;
        while (*tail) tail = &(*tail)->next;
        bool progressed = sub != NULL;
        while (sub) {
            struct tdist_work *w = sub;
            sub = w->next;
            w->next = NULL;
            p2p_op_t *op = calloc(1, sizeof *op);
            if (!op) {
                tdist__work_finish(w, TDIST_ERR_NO_MEMORY, "p2p: out of memory");
                continue;
            }
            op->w = w;
            op->st = TDIST_INPROGRESS;
            op->hreq = op->preq = MPI_REQUEST_NULL;
            if (!stopping) post(pg, b, op);
            *tail = op;
            tail = &op->next;
        }
        /* sweep */
        int64_t now = tdist__now_ms();
        for (p2p_op_t **pp = &b->active; *pp;) {
            p2p_op_t *op = *pp;
            if (!poll_op(pg, b, op, stopping, now)) {
                pp = &op->next;
                continue;
            }
            *pp = op->next;
            progressed = true;
            tdist__work_finish(op->w, op->st, op->msg);
            free(op->msg);
            /* a pending request keeps pointing at op->hdr: leave it to MPI */
            if (op->hreq == MPI_REQUEST_NULL && op->preq == MPI_REQUEST_NULL) free(op);
        }
        pthread_mutex_lock(&pg->mu);
        if (pg->stop && !b->active && !pg->p2p_head) break;
        if (!b->active) {
            if (!pg->p2p_head) pthread_cond_wait(&pg->p2p_cv, &pg->mu);
            idle_since = tdist__mpi_now_us();
            continue;
        }
        if (pg->p2p_head) continue;
        pthread_mutex_unlock(&pg->mu);
        if (progressed) idle_since = tdist__mpi_now_us();
        /* a background thread: yield for 1 ms, then sleep 50 us (1 ms after 200 ms) */
        int64_t idle = tdist__mpi_now_us() - idle_since;
        if (idle < 1000) {
            sched_yield();
        } else {
            struct timespec ts = {0, idle < 200000 ? 50000 : 1000000};
            nanosleep(&ts, NULL);
        }
        pthread_mutex_lock(&pg->mu);
    }
    pthread_mutex_unlock(&pg->mu);
    return NULL;
}

static tdist_status_t mpi_p2p_submit(tdist_pg_t *pg, struct tdist_work *w, tdist_work_t **work)
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
    if (st != TDIST_OK) {
        char *p = op_prefix(pg, w);
        tdist__error(st, "%s: %s%s", p ? p : "p2p",
                     st == TDIST_ERR_ABORTED ? "" : "the group failed earlier: ", why ? why : "");
        free(p);
        pthread_mutex_unlock(&pg->mu);
        atomic_store(&w->refs, 1);
        tdist__work_release(w);
        return st;
    }
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
    if (work) {
        *work = w;
        return TDIST_OK;
    }
    st = tdist_work_wait(w, -1);
    tdist__work_release(w);
    return st;
}

const tdist__backend_t tdist__backend_mpi = {
    .name = "mpi",
    .create_world = mpi_create_world,
    .create_sub = mpi_create_sub,
    .run = tdist__mpi_run,
    .p2p_submit = mpi_p2p_submit,
    .abort = mpi_abort,
    .destroy = mpi_destroy,
};
