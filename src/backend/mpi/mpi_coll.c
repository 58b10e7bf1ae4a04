/*
 * backend/mpi/mpi_coll.c — the MPI backend's collectives (docs/mpi.md).
 *
 * One slot per collective (backend/backend.h): pg has checked the
 * fingerprints (rule 2) before, through this table's own all_to_all and
 * all_gather slots, so the mismatch message is the native one, word for
 * word. Each collective maps to MPI's non-blocking one, polled until done,
 * the deadline or an abort (rule 3, mpi_internal.h).
 *
 * dtypes: f32 f64 i8 u8 i32 i64 are MPI's own; f16 and bf16 move as
 * MPI_UINT16_T. f16, bf16, i8 and u8 reduce with user-defined MPI_Ops that
 * call tdist's kernel (f16/bf16: f32 arithmetic rounded once per step, as
 * the native backend; i8/u8: wrapping, where Open MPI 4.1's AVX kernels
 * saturate 8-bit sums); the others with MPI's predefined ops.
 * AVG reduces as SUM and divides afterwards (tdist_divide: the same
 * rounding as native), PREMUL_SUM scales a copy of the input first
 * (tdist_scale), then sums. Coalesced forms post one MPI call per buffer.
 * Counts above INT_MAX: broadcast / all_reduce / reduce go in chunks, the
 * other collectives are TDIST_ERR_NOT_SUPPORTED.
 */
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/mpi/mpi_internal.h"
#include "backend/mpi/host.h" /* last: calls into the library go through its table */

#define MB_TAG 77 /* monitored_barrier's messages on the coll communicator */
#define PG_TAG 78 /* pg's own exchanges' messages (fingerprints) on it */
#define CHUNK ((size_t)1 << 30)
#define MAXREQ 16

/* ------------------------------------------------------------ types, ops */

MPI_Datatype tdist__mpi_dtype(tdist_dtype_t d)
{
    switch (d) {
    case TDIST_F32: return MPI_FLOAT;
    case TDIST_F64: return MPI_DOUBLE;
    case TDIST_I8: return MPI_INT8_T;
    case TDIST_U8: return MPI_UINT8_T;
    case TDIST_I32: return MPI_INT32_T;
    case TDIST_I64: return MPI_INT64_T;
    default: return MPI_UINT16_T; /* f16, bf16: 2-byte payloads */
    }
}

/* User ops that run tdist's own kernel (inout = in op inout): f16 and bf16
 * (MPI has no such types) and i8 / u8 (Open MPI 4.1's op/avx component
 * saturates 8-bit MPI_SUM, where tdist, C and MPI's standard wrap). */
#define KOP(name, dt, op)                                                                    \
    static void name(void *in, void *inout, int *len, MPI_Datatype *t)                       \
    {                                                                                        \
        (void)t;                                                                             \
        tdist_reduce(inout, in, inout, (size_t)*len, dt, op);                                \
    }
#define KOPS(pfx, dt)                                                                        \
    KOP(pfx##_sum, dt, TDIST_SUM)                                                            \
    KOP(pfx##_prod, dt, TDIST_PROD)                                                          \
    KOP(pfx##_min, dt, TDIST_MIN)                                                            \
    KOP(pfx##_max, dt, TDIST_MAX)                                                            \
    KOP(pfx##_band, dt, TDIST_BAND)                                                          \
    KOP(pfx##_bor, dt, TDIST_BOR)                                                            \
    KOP(pfx##_bxor, dt, TDIST_BXOR)
KOPS(k_f16, TDIST_F16)
KOPS(k_bf16, TDIST_BF16)
KOPS(k_i8, TDIST_I8)
KOPS(k_u8, TDIST_U8)
#define KROW(pfx) {pfx##_sum, pfx##_prod, pfx##_min, pfx##_max, pfx##_band, pfx##_bor, pfx##_bxor}

enum { NKD = 4, NKO = 7 }; /* kernel dtypes: f16 bf16 i8 u8; ops SUM..MAX, BAND..BXOR */
static MPI_Op kops[NKD][NKO];
static pthread_once_t kops_once = PTHREAD_ONCE_INIT;
static bool kops_ok;

static void kops_init(void)
{
    MPI_User_function *fns[NKD][NKO] = {KROW(k_f16), KROW(k_bf16), KROW(k_i8), KROW(k_u8)};
    kops_ok = true;
    for (int i = 0; i < NKD; i++)
        for (int j = 0; j < NKO; j++)
            if (MPI_Op_create(fns[i][j], 1, &kops[i][j]) != MPI_SUCCESS) kops_ok = false;
}

static int kdt(tdist_dtype_t dt)
{
    switch (dt) {
    case TDIST_F16: return 0;
    case TDIST_BF16: return 1;
    case TDIST_I8: return 2;
    case TDIST_U8: return 3;
    default: return -1;
    }
}

static int kop(tdist_redop_t op)
{
    switch (op) {
    case TDIST_SUM: return 0;
    case TDIST_PROD: return 1;
    case TDIST_MIN: return 2;
    case TDIST_MAX: return 3;
    case TDIST_BAND: return 4;
    case TDIST_BOR: return 5;
    case TDIST_BXOR: return 6;
    default: return -1;
    }
}

/* The MPI op that does redop's reduction part (AVG, PREMUL_SUM: SUM). */
static tdist_status_t mop(tdist_dtype_t dt, tdist_redop_t op, MPI_Op *out)
{
    tdist_redop_t base = (op == TDIST_AVG || op == TDIST_PREMUL_SUM) ? TDIST_SUM : op;
    if (kdt(dt) >= 0) {
        pthread_once(&kops_once, kops_init);
        if (!kops_ok) return tdist__error(TDIST_ERR_SYSTEM, "MPI_Op_create failed");
        if (kop(base) < 0)
            return tdist__error(TDIST_ERR_INVALID_ARG, "reduce op %s on %s", tdist_redop_name(op),
                                tdist_dtype_name(dt));
        *out = kops[kdt(dt)][kop(base)];
        return TDIST_OK;
    }
    switch (base) {
    case TDIST_SUM: *out = MPI_SUM; break;
    case TDIST_PROD: *out = MPI_PROD; break;
    case TDIST_MIN: *out = MPI_MIN; break;
    case TDIST_MAX: *out = MPI_MAX; break;
    case TDIST_BAND: *out = MPI_BAND; break;
    case TDIST_BOR: *out = MPI_BOR; break;
    case TDIST_BXOR: *out = MPI_BXOR; break;
    default:
        return tdist__error(TDIST_ERR_INVALID_ARG, "reduce op %d has no MPI mapping", (int)op);
    }
    return TDIST_OK;
}

/* ------------------------------------------------------------------ helpers */

static void *scratch(tdist__mpib_t *b, size_t bytes)
{
    if (b->leaked) return NULL; /* MPI may still write the old one */
    if (bytes <= b->tmp_len && b->tmp) return b->tmp;
    void *p = realloc(b->tmp, bytes ? bytes : 1);
    if (!p) return NULL;
    b->tmp = p;
    b->tmp_len = bytes;
    return p;
}

static tdist_status_t no_mem(void) { return tdist__error(TDIST_ERR_NO_MEMORY, "out of memory (MPI backend scratch)"); }

static bool overlap(const void *a, size_t an, const void *c, size_t cn)
{
    if (!a || !c || !an || !cn) return false;
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)c;
    return x < y + cn && y < x + an;
}

static tdist_status_t too_big(const char *what, size_t n)
{
    return tdist__error(TDIST_ERR_NOT_SUPPORTED,
                        "%s: %zu elements is more than MPI's int counts hold on the MPI backend",
                        what, n);
}

/* Counts and displacements as int (elements). */
static tdist_status_t int_counts(const size_t *c, int n, int *ic, int *id, const char *what)
{
    size_t off = 0;
    for (int r = 0; r < n; r++) {
        if (c[r] > INT_MAX || off > INT_MAX) return too_big(what, c[r] > INT_MAX ? c[r] : off);
        ic[r] = (int)c[r];
        id[r] = (int)off;
        off += c[r];
    }
    return TDIST_OK;
}

#define MPICALL(call, name)                                                                  \
    do {                                                                                     \
        int rc_ = (call);                                                                    \
        if (rc_ != MPI_SUCCESS) return tdist__mpi_error(rc_, TDIST_ERR_CONNECTION, name);     \
    } while (0)

/* ------------------------------------------------------ pg's own exchanges */

/* pg's fingerprint exchange and all_to_allv's pairwise round (backend.h:
 * the all_to_all / all_gather slots with chk NULL): block p of sendbuf
 * (all_gather: sendbuf itself) to rank p, rank p's block into block p of
 * recvbuf, as one message per peer rather than one MPI_Ialltoall, so that
 * the wait knows whose block is still missing: a rank late to the
 * collective is the one the others wait on, and the wait notes it in the
 * flight recorder (the first rank whose block has not come, else the
 * first that has not taken ours). The exchange done, the note is taken
 * back: the MPI collective that follows cannot say whom it waits on. One
 * exchange at a time per group and one message per peer each, so MPI's
 * in-order matching pairs them. */
static tdist_status_t pg_exchange(tdist__mpib_t *b, const tdist__coll_ctx_t *c,
                                  const tdist__coll_args_t *a)
{
    int n = c->size, me = c->rank, k = 0;
    size_t len = a->count;
    bool a2a = a->op == TDIST__OP_ALL_TO_ALL;
    const char *what = a2a ? "MPI_Irecv of every rank's fingerprint" : "MPI_Irecv of every rank's "
                                                                       "all_to_allv verdict";
    if (b->leaked)
        return tdist__error(TDIST_ERR_ABORTED, "an earlier MPI request of the group is still "
                                               "pending (the group failed)");
    if (len > INT_MAX) return too_big(what, len);
    const char *send = a->sendbuf;
    char *recv = a->recvbuf;
    memmove(recv + (size_t)me * len, a2a ? send + (size_t)me * len : send, len);
    for (int pass = 0; pass < 2; pass++)
        for (int p = 0; p < n; p++) {
            if (p == me) continue;
            int rc = pass == 0 ? MPI_Irecv(recv + (size_t)p * len, (int)len, MPI_BYTE, p, PG_TAG,
                                           b->coll, &b->xr[k])
                               : MPI_Isend(a2a ? send + (size_t)p * len : send, (int)len,
                                           MPI_BYTE, p, PG_TAG, b->coll, &b->xr[k]);
            if (rc != MPI_SUCCESS) {
                b->leaked = k > 0; /* those posted stay with MPI */
                return tdist__mpi_error(rc, TDIST_ERR_CONNECTION, pass ? "MPI_Isend" : "MPI_Irecv");
            }
            b->xpeer[k++] = p;
        }
    int noted = -1;
    tdist_status_t st = tdist__mpi_wait_peers(c->aborted, b, b->xr, b->xpeer, k, c->deadline_ms,
                                              c->timeout_ms, what, &noted);
    if (st == TDIST_OK && noted >= 0) b->on_wait(b->on_wait_arg, -1);
    return st;
}

/* ------------------------------------------------------- monitored barrier */

/* Ranks other than 0: send rank 0 the fingerprint, wait for its verdict
 * (2 s past the deadline, so rank 0's report of the missing arrives). */
static tdist_status_t mb_arrive(tdist__mpib_t *b, const tdist__coll_ctx_t *c,
                                const tdist__coll_check_t *chk)
{
    tdist__mb_reply_t *rep = calloc(1, sizeof *rep);
    if (!rep) return no_mem();
    MPI_Request r[2];
    MPICALL(MPI_Isend(chk->common, (int)chk->len, MPI_BYTE, 0, MB_TAG, b->coll, &r[0]), "MPI_Isend");
    MPICALL(MPI_Irecv(rep, (int)sizeof *rep, MPI_BYTE, 0, MB_TAG, b->coll, &r[1]), "MPI_Irecv");
    int64_t dl = c->deadline_ms == INT64_MAX ? INT64_MAX : c->deadline_ms + 2000;
    const int peer[2] = {0, 0}; /* the wait is on rank 0 */
    int noted;
    tdist_status_t st = tdist__mpi_wait_peers(c->aborted, b, r, peer, 2, dl, c->timeout_ms,
                                              "monitored_barrier", &noted);
    if (st == TDIST_ERR_TIMEOUT)
        return tdist__error(TDIST_ERR_TIMEOUT,
                            "monitored_barrier: rank 0 (the monitor) did not answer within "
                            "%lld ms",
                            (long long)c->timeout_ms); /* rep stays with MPI */
    if (st != TDIST_OK) return st;
    rep->msg[sizeof rep->msg - 1] = '\0';
    st = (tdist_status_t)rep->status;
    if (st != TDIST_OK) st = tdist__error(st, "%s", rep->msg);
    free(rep);
    return st;
}

/* Rank 0 tells every rank that arrived (the others time out). */
static tdist_status_t mb_tell(tdist__mpib_t *b, const tdist__coll_ctx_t *c, const bool *present,
                              tdist__mb_reply_t *rep)
{
    int n = c->size;
    MPI_Request *s = malloc((size_t)n * sizeof *s);
    if (!s) return no_mem();
    s[0] = MPI_REQUEST_NULL;
    for (int p = 1; p < n; p++) {
        s[p] = MPI_REQUEST_NULL;
        if (present[p]) MPI_Isend(rep, (int)sizeof *rep, MPI_BYTE, p, MB_TAG, b->coll, &s[p]);
    }
    tdist_status_t st = tdist__mpi_wait(c->aborted, b, s, n, tdist__deadline_ms(1000), 1000,
                                        "monitored_barrier's answer");
    free(s);
    return st;
}

static tdist_status_t slot_monitored_barrier(void *be, const tdist__coll_ctx_t *c,
                                             const tdist__coll_args_t *a,
                                             const tdist__coll_check_t *chk)
{
    (void)a;
    tdist__mpib_t *b = be;
    int n = c->size;
    if (n == 1) return TDIST_OK;
    if (c->rank != 0) return mb_arrive(b, c, chk);
    MPI_Request *r = malloc((size_t)n * sizeof *r);
    bool *present = calloc((size_t)n, sizeof *present);
    if (!r || !present) {
        free(r);
        free(present);
        return no_mem();
    }
    r[0] = MPI_REQUEST_NULL;
    present[0] = true;
    for (int p = 0; p < n; p++) b->xpeer[p] = p;
    for (int p = 1; p < n; p++) {
        int rc = MPI_Irecv(chk->theirs + (size_t)p * chk->len, (int)chk->len, MPI_BYTE, p, MB_TAG,
                           b->coll, &r[p]);
        if (rc != MPI_SUCCESS) {
            b->leaked = true;
            free(r);
            free(present);
            return tdist__mpi_error(rc, TDIST_ERR_CONNECTION, "MPI_Irecv");
        }
    }
    int noted; /* the wait is on the first rank still missing */
    tdist_status_t st = tdist__mpi_wait_peers(c->aborted, b, r, b->xpeer, n, c->deadline_ms,
                                              c->timeout_ms, "monitored_barrier", &noted);
    for (int p = 1; p < n; p++) present[p] = r[p] == MPI_REQUEST_NULL;
    tdist__mb_reply_t rep;
    memset(&rep, 0, sizeof rep);
    tdist__coll_mb_verdict(c, chk, st, present, &rep);
    if (st == TDIST_OK || st == TDIST_ERR_TIMEOUT) {
        tdist_status_t st2 = mb_tell(b, c, present, &rep);
        if (st == TDIST_OK && st2 != TDIST_OK) st = st2;
    }
    free(r);
    free(present);
    if (rep.status != TDIST_OK) return tdist__error((tdist_status_t)rep.status, "%s", rep.msg);
    return st;
}

/* ------------------------------------------------- Open MPI's iallreduce */

/* Open MPI's libnbc (4.x) runs every MPI_Iallreduce on fewer than 4 ranks,
 * and every in-place one, as a binomial tree: reduce to one rank, then
 * broadcast from it, so each byte crosses twice and one rank does all the
 * arithmetic. Its ring (reduce-scatter + all-gather) moves each byte once
 * per step and shares the arithmetic; on this machine, f32 SUM on 2 ranks,
 * the ring took 0.42 ms at 4 MiB against the tree's 1.02 ms (docs/mpi.md).
 * libnbc reads its choice from the MCA variable
 * coll_libnbc_iallreduce_algorithm at every call, and MPI_T may write it
 * while MPI runs (scope "all": every process must hold the same value).
 * So, unless the user chose an algorithm (OMPI_MCA_..., mpirun --mca, or
 * the variable already non-zero) or set TDIST_MPI_TUNE=0, the backend posts
 * every MPI_Iallreduce of ring_min(ranks) bytes or more with the variable at
 * "ring" and sets it back to "ignore" (libnbc's own choice) right after,
 * under one process-wide mutex that every MPI_Iallreduce of the backend
 * takes: both ranks of any call see the same value, since the choice
 * depends only on the size and the communicator, which the fingerprints
 * have checked. The ring's 2(n-1) steps cost latency, so the switch-over
 * grows with the ranks (measured, ompi-i with and without the ring, same
 * session: 2 ranks ring faster from 4 KiB, 3 ranks from 1 MiB (equal at
 * 256 KiB), 4 ranks from 4 MiB (12 % slower at 1 MiB)). What the
 * mutex cannot cover: a thread of the application posting its own
 * MPI_Iallreduce in that same instant (docs/mpi.md). */
#define NBC_VAR "coll_libnbc_iallreduce_algorithm"
#define NBC_RING 1

/* Smallest MPI_Iallreduce (bytes) run as libnbc's ring on n ranks. */
static size_t ring_min(int n)
{
    if (n <= 2) return (size_t)4 << 10;
    if (n == 3) return (size_t)512 << 10;
    return (size_t)2 << 20;
}

static struct {
    pthread_mutex_t mu;
    bool on;
    MPI_T_cvar_handle h;
} nbc = {.mu = PTHREAD_MUTEX_INITIALIZER};
static pthread_once_t nbc_once = PTHREAD_ONCE_INIT;

static void nbc_init(void)
{
    const char *e = getenv("TDIST_MPI_TUNE");
    if ((e && strcmp(e, "0") == 0) || getenv("OMPI_MCA_" NBC_VAR)) return;
    char ver[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0, prov = 0, idx = -1, n = 0, verb, bind, scope, cur = -1;
    if (MPI_Get_library_version(ver, &len) != MPI_SUCCESS || !strstr(ver, "Open MPI")) return;
    if (MPI_T_init_thread(MPI_THREAD_MULTIPLE, &prov) != MPI_SUCCESS) return;
    char name[128], desc[16];
    int nl = sizeof name, dl = sizeof desc;
    MPI_Datatype dt;
    MPI_T_enum en;
    if (MPI_T_cvar_get_index(NBC_VAR, &idx) != MPI_SUCCESS ||
        MPI_T_cvar_get_info(idx, name, &nl, &verb, &dt, &en, desc, &dl, &bind, &scope) !=
            MPI_SUCCESS ||
        dt != MPI_INT || bind != MPI_T_BIND_NO_OBJECT || scope == MPI_T_SCOPE_CONSTANT ||
        scope == MPI_T_SCOPE_READONLY)
        goto out;
    if (MPI_T_cvar_handle_alloc(idx, NULL, &nbc.h, &n) != MPI_SUCCESS) goto out;
    if (n != 1 || MPI_T_cvar_read(nbc.h, &cur) != MPI_SUCCESS || cur != 0) {
        MPI_T_cvar_handle_free(&nbc.h);
        goto out;
    }
    nbc.on = true;
    return;
out:
    MPI_T_finalize();
}

/* MPI_Iallreduce, with the algorithm chosen as above (bytes: this call's). */
static int iallreduce(const void *s, void *d, int k, MPI_Datatype t, MPI_Op op, MPI_Comm c,
                      MPI_Request *r, size_t bytes)
{
    pthread_once(&nbc_once, nbc_init);
    if (!nbc.on) return MPI_Iallreduce(s, d, k, t, op, c, r);
    int ring = NBC_RING, dflt = 0;
    int n = 0;
    MPI_Comm_size(c, &n);
    bool tune = bytes >= ring_min(n);
    pthread_mutex_lock(&nbc.mu);
    if (tune) MPI_T_cvar_write(nbc.h, &ring);
    int rc = MPI_Iallreduce(s, d, k, t, op, c, r);
    if (tune) MPI_T_cvar_write(nbc.h, &dflt);
    pthread_mutex_unlock(&nbc.mu);
    return rc;
}

/* ------------------------------------------------------------- collectives */

typedef struct reqs {
    MPI_Request r[MAXREQ];
    MPI_Request *p;
    int n, cap;
} reqs_t;

static MPI_Request *req_next(reqs_t *q)
{
    if (q->n == q->cap) {
        int cap = q->cap * 2;
        MPI_Request *p = malloc((size_t)cap * sizeof *p);
        if (!p) return NULL;
        memcpy(p, q->p, (size_t)q->n * sizeof *p);
        if (q->p != q->r) free(q->p);
        q->p = p;
        q->cap = cap;
    }
    q->p[q->n] = MPI_REQUEST_NULL;
    return &q->p[q->n++];
}

#define POST(q, call, name)                                                                  \
    do {                                                                                     \
        MPI_Request *rq_ = req_next(q);                                                      \
        if (!rq_) return no_mem();                                                           \
        int rc_ = (call);                                                                    \
        if (rc_ != MPI_SUCCESS) return tdist__mpi_error(rc_, TDIST_ERR_CONNECTION, name);     \
    } while (0)
#define RQ (&q->p[q->n - 1])
#define RQ_LAST(q) (&(q)->p[(q)->n - 1])

/* One collective's MPI call(s), posted into q: what every post_* below
 * reads. */
typedef struct call {
    const tdist__coll_ctx_t *cx;
    tdist__mpib_t *b;
    const tdist__coll_args_t *w;
    reqs_t *q;
    MPI_Comm c;
    MPI_Datatype t;
    size_t es, cnt, bytes;
    MPI_Op op;   /* reductions */
    bool premul; /* PREMUL_SUM: the input is scaled into scratch first */
} call_t;

/* broadcast and broadcast_coalesced: MPI_Ibcast per CHUNK of each buffer. */
static tdist_status_t post_bcast(const call_t *k, void *const *bufs, const size_t *counts,
                                 size_t nbufs)
{
    reqs_t *q = k->q;
    const char *name = nbufs > 1 || k->w->op == TDIST__OP_BROADCAST_COALESCED
                           ? "MPI_Ibcast (coalesced)" : "MPI_Ibcast";
    for (size_t i = 0; i < nbufs; i++)
        for (size_t off = 0; off < counts[i] || off == 0; off += CHUNK) {
            size_t n = TDIST_MIN(CHUNK, counts[i] - off);
            POST(q, MPI_Ibcast((char *)bufs[i] + off * k->es, (int)n, k->t, k->w->root, k->c, RQ),
                 name);
            if (counts[i] == 0) break;
        }
    return TDIST_OK;
}

/* all_reduce and reduce: per CHUNK, in place where the API allows. */
static tdist_status_t post_reduce(const call_t *k)
{
    const tdist__coll_args_t *w = k->w;
    reqs_t *q = k->q;
    size_t es = k->es;
    bool all = w->op == TDIST__OP_ALL_REDUCE;
    const char *name = all ? "MPI_Iallreduce" : "MPI_Ireduce";
    const char *src = w->sendbuf;
    char *dst = w->recvbuf;
    bool root = all || k->cx->rank == w->root;
    bool inplace = root && src == dst;
    if (k->premul) {
        char *tmp = scratch(k->b, k->bytes);
        if (!tmp) return no_mem();
        memcpy(tmp, src, k->bytes);
        TDIST_CHECK(tdist_scale(tmp, k->cnt, w->dtype, w->premul));
        src = tmp;
        inplace = false;
    }
    for (size_t off = 0; off < k->cnt || off == 0; off += CHUNK) {
        size_t n = TDIST_MIN(CHUNK, k->cnt - off);
        const void *s = inplace ? MPI_IN_PLACE : (const void *)(src + off * es);
        void *d = root ? dst + off * es : NULL;
        if (all)
            POST(q, iallreduce(s, d, (int)n, k->t, k->op, k->c, RQ, n * es), name);
        else
            POST(q, MPI_Ireduce(s, d, (int)n, k->t, k->op, w->root, k->c, RQ), name);
        if (k->cnt == 0) break;
    }
    return TDIST_OK;
}

/* all_reduce_coalesced: each buffer scaled (PREMUL_SUM) and reduced in
 * place, per CHUNK. */
static tdist_status_t post_reduce_coalesced(const call_t *k)
{
    const tdist__coll_args_t *w = k->w;
    reqs_t *q = k->q;
    const char *name = "MPI_Iallreduce (coalesced)";
    for (size_t i = 0; i < w->nbufs; i++) {
        if (k->premul) TDIST_CHECK(tdist_scale(w->bufs[i], w->counts[i], w->dtype, w->premul));
        for (size_t off = 0; off < w->counts[i] || off == 0; off += CHUNK) {
            size_t n = TDIST_MIN(CHUNK, w->counts[i] - off);
            POST(q,
                 iallreduce(MPI_IN_PLACE, (char *)w->bufs[i] + off * k->es, (int)n, k->t, k->op,
                            k->c, RQ, n * k->es),
                 name);
            if (w->counts[i] == 0) break;
        }
    }
    return TDIST_OK;
}

static tdist_status_t post_all_gather(const call_t *k)
{
    const tdist__coll_args_t *w = k->w;
    tdist__mpib_t *b = k->b;
    reqs_t *q = k->q;
    int n = k->cx->size, me = k->cx->rank;
    const char *name = w->op == TDIST__OP_ALL_GATHER ? "MPI_Iallgather" : "MPI_Iallgatherv";
    TDIST_CHECK(int_counts(w->recvcounts, n, b->ic, b->id, name));
    size_t total = 0, mine = w->recvcounts[me] * k->es, at = (size_t)b->id[me] * k->es;
    for (int r = 0; r < n; r++) total += w->recvcounts[r];
    if (total > INT_MAX) return too_big(name, total);
    const void *s = w->sendbuf;
    if (s == (const char *)w->recvbuf + at) {
        s = MPI_IN_PLACE;
    } else if (overlap(s, mine, w->recvbuf, total * k->es)) {
        void *tmp = scratch(b, mine);
        if (!tmp) return no_mem();
        memcpy(tmp, s, mine);
        s = tmp;
    }
    if (w->op == TDIST__OP_ALL_GATHER)
        POST(q, MPI_Iallgather(s, (int)k->cnt, k->t, w->recvbuf, (int)k->cnt, k->t, k->c, RQ), name);
    else
        POST(q, MPI_Iallgatherv(s, b->ic[me], k->t, w->recvbuf, b->ic, b->id, k->t, k->c, RQ),
             name);
    return TDIST_OK;
}

/* gather and scatter: the root's side in place when it is, a copy when the
 * buffers overlap otherwise. */
static tdist_status_t post_gather_scatter(const call_t *k)
{
    const tdist__coll_args_t *w = k->w;
    reqs_t *q = k->q;
    int n = k->cx->size, me = k->cx->rank;
    bool gather = w->op == TDIST__OP_GATHER;
    const char *name = gather ? "MPI_Igather" : "MPI_Iscatter";
    size_t bytes = k->bytes, all = bytes * (size_t)n;
    if (k->cnt > INT_MAX || k->cnt * (size_t)n > INT_MAX) return too_big(name, k->cnt * (size_t)n);
    bool root = me == w->root;
    const void *s = gather || root ? w->sendbuf : NULL;
    void *d = !gather || root ? w->recvbuf : NULL;
    if (root && (gather ? d : s)) {
        /* the root's whole buffer and its own block in it */
        const char *whole = gather ? (const char *)d : (const char *)s;
        const void *block = gather ? s : d;
        if (block == whole + (size_t)me * bytes) {
            if (gather)
                s = MPI_IN_PLACE;
            else
                d = MPI_IN_PLACE;
        } else if (gather ? overlap(s, bytes, d, all) : overlap(s, all, d, bytes)) {
            size_t len = gather ? bytes : all;
            void *tmp = scratch(k->b, len);
            if (!tmp) return no_mem();
            memcpy(tmp, s, len);
            s = tmp;
        }
    }
    if (gather)
        POST(q, MPI_Igather(s, (int)k->cnt, k->t, d, (int)k->cnt, k->t, w->root, k->c, RQ), name);
    else
        POST(q, MPI_Iscatter(s, (int)k->cnt, k->t, d, (int)k->cnt, k->t, w->root, k->c, RQ), name);
    return TDIST_OK;
}

static tdist_status_t post_reduce_scatter(const call_t *k)
{
    const tdist__coll_args_t *w = k->w;
    reqs_t *q = k->q;
    int n = k->cx->size;
    const char *name = "MPI_Ireduce_scatter_block";
    if (k->cnt > INT_MAX || k->cnt * (size_t)n > INT_MAX) return too_big(name, k->cnt * (size_t)n);
    size_t tot = k->bytes * (size_t)n;
    const void *s = w->sendbuf;
    if (k->premul) {
        void *tmp = scratch(k->b, tot);
        if (!tmp) return no_mem();
        memcpy(tmp, s, tot);
        TDIST_CHECK(tdist_scale(tmp, k->cnt * (size_t)n, w->dtype, w->premul));
        s = tmp;
    } else if (s == w->recvbuf) {
        s = MPI_IN_PLACE; /* the input is in recvbuf, the result lands in block 0 */
    } else if (overlap(s, tot, w->recvbuf, k->bytes)) {
        void *tmp = scratch(k->b, tot);
        if (!tmp) return no_mem();
        memcpy(tmp, s, tot);
        s = tmp;
    }
    POST(q, MPI_Ireduce_scatter_block(s, w->recvbuf, (int)k->cnt, k->t, k->op, k->c, RQ), name);
    return TDIST_OK;
}

static tdist_status_t post_all_to_all(const call_t *k)
{
    const tdist__coll_args_t *w = k->w;
    tdist__mpib_t *b = k->b;
    reqs_t *q = k->q;
    int n = k->cx->size;
    size_t es = k->es;
    const char *name = w->op == TDIST__OP_ALL_TO_ALL ? "MPI_Ialltoall" : "MPI_Ialltoallv";
    TDIST_CHECK(int_counts(w->sendcounts, n, b->ic, b->id, name));
    TDIST_CHECK(int_counts(w->recvcounts, n, b->ic2, b->id2, name));
    size_t stot = 0, rtot = 0;
    for (int r = 0; r < n; r++) {
        stot += w->sendcounts[r];
        rtot += w->recvcounts[r];
    }
    if (stot > INT_MAX || rtot > INT_MAX) return too_big(name, TDIST_MAX(stot, rtot));
    const void *s = w->sendbuf;
    if (overlap(s, stot * es, w->recvbuf, rtot * es)) {
        void *tmp = scratch(b, stot * es);
        if (!tmp) return no_mem();
        memcpy(tmp, s, stot * es);
        s = tmp;
    }
    if (w->op == TDIST__OP_ALL_TO_ALL)
        POST(q, MPI_Ialltoall(s, (int)k->cnt, k->t, w->recvbuf, (int)k->cnt, k->t, k->c, RQ), name);
    else
        POST(q, MPI_Ialltoallv(s, b->ic, b->id, k->t, w->recvbuf, b->ic2, b->id2, k->t, k->c, RQ),
             name);
    return TDIST_OK;
}

#undef RQ

typedef tdist_status_t (*post_fn)(const call_t *k);

/* Run one collective: post its MPI call(s) with post, wait for them
 * (name: the MPI call, for messages), then AVG's division where the
 * result is (by the group size: coll/ has turned a Join's AVG into a SUM
 * and divides it itself). */
static tdist_status_t run(void *be, const tdist__coll_ctx_t *c, const tdist__coll_args_t *a,
                          post_fn post, const char *name)
{
    tdist__mpib_t *b = be;
    if (b->leaked)
        return tdist__error(TDIST_ERR_ABORTED, "an earlier MPI request of the group is still "
                                               "pending (the group failed)");
    reqs_t q;
    q.p = q.r;
    q.n = 0;
    q.cap = MAXREQ;
    call_t k = {.cx = c, .b = b, .w = a, .q = &q, .c = b->coll, .t = tdist__mpi_dtype(a->dtype),
                .es = tdist_dtype_size(a->dtype), .cnt = a->count, .op = MPI_OP_NULL};
    k.bytes = k.cnt * k.es;
    bool reduces = a->op == TDIST__OP_ALL_REDUCE || a->op == TDIST__OP_REDUCE ||
                   a->op == TDIST__OP_REDUCE_SCATTER || a->op == TDIST__OP_ALL_REDUCE_COALESCED;
    tdist_status_t st = reduces ? mop(a->dtype, a->redop, &k.op) : TDIST_OK;
    k.premul = reduces && a->redop == TDIST_PREMUL_SUM;
    if (st == TDIST_OK) st = post(&k);
    if (st == TDIST_OK)
        st = tdist__mpi_wait(c->aborted, b, q.p, q.n, c->deadline_ms, c->timeout_ms, name);
    else if (q.n > 0)
        b->leaked = true; /* the calls already posted stay with MPI */
    if (q.p != q.r && !b->leaked) free(q.p);
    if (st != TDIST_OK || a->redop != TDIST_AVG || !reduces) return st;
    if (a->op == TDIST__OP_REDUCE && c->rank != a->root) return TDIST_OK;
    if (a->op != TDIST__OP_ALL_REDUCE_COALESCED)
        return tdist_divide(a->recvbuf, a->count, a->dtype, c->size);
    for (size_t i = 0; i < a->nbufs; i++)
        TDIST_CHECK(tdist_divide(a->bufs[i], a->counts[i], a->dtype, c->size));
    return TDIST_OK;
}

static tdist_status_t post_bcast_one(const call_t *k)
{
    return post_bcast(k, &k->w->recvbuf, &k->w->count, 1);
}
static tdist_status_t post_bcast_coalesced(const call_t *k)
{
    return post_bcast(k, k->w->bufs, k->w->counts, k->w->nbufs);
}
static tdist_status_t post_barrier(const call_t *k)
{
    reqs_t *q = k->q;
    POST(q, MPI_Ibarrier(k->c, RQ_LAST(q)), "MPI_Ibarrier");
    return TDIST_OK;
}

/* One slot per collective: the MPI call(s) it posts and their name. */
#define SLOT(fn, post, name)                                                                 \
    static tdist_status_t fn(void *be, const tdist__coll_ctx_t *c, const tdist__coll_args_t *a,\
                             const tdist__coll_check_t *chk)                                  \
    {                                                                                        \
        (void)chk;                                                                           \
        return run(be, c, a, post, name);                                                    \
    }
SLOT(slot_broadcast, post_bcast_one, "MPI_Ibcast")
SLOT(slot_broadcast_coalesced, post_bcast_coalesced, "MPI_Ibcast (coalesced)")
SLOT(slot_all_reduce, post_reduce, "MPI_Iallreduce")
SLOT(slot_reduce, post_reduce, "MPI_Ireduce")
SLOT(slot_all_reduce_coalesced, post_reduce_coalesced, "MPI_Iallreduce (coalesced)")
SLOT(slot_all_gatherv, post_all_gather, "MPI_Iallgatherv")
SLOT(slot_gather, post_gather_scatter, "MPI_Igather")
SLOT(slot_scatter, post_gather_scatter, "MPI_Iscatter")
SLOT(slot_reduce_scatter, post_reduce_scatter, "MPI_Ireduce_scatter_block")
SLOT(slot_all_to_allv, post_all_to_all, "MPI_Ialltoallv")
SLOT(slot_barrier, post_barrier, "MPI_Ibarrier")
#undef SLOT

/* all_to_all and all_gather: pg's own exchanges come without chk. */
static tdist_status_t slot_all_to_all(void *be, const tdist__coll_ctx_t *c,
                                      const tdist__coll_args_t *a, const tdist__coll_check_t *chk)
{
    if (!chk) return pg_exchange(be, c, a);
    return run(be, c, a, post_all_to_all, "MPI_Ialltoall");
}

static tdist_status_t slot_all_gather(void *be, const tdist__coll_ctx_t *c,
                                      const tdist__coll_args_t *a, const tdist__coll_check_t *chk)
{
    if (!chk) return pg_exchange(be, c, a);
    return run(be, c, a, post_all_gather, "MPI_Iallgather");
}

const tdist__coll_slots_t tdist__mpi_slots = {.slot = {
    [TDIST__OP_BROADCAST] = slot_broadcast,
    [TDIST__OP_BROADCAST_COALESCED] = slot_broadcast_coalesced,
    [TDIST__OP_ALL_REDUCE] = slot_all_reduce,
    [TDIST__OP_REDUCE] = slot_reduce,
    [TDIST__OP_ALL_REDUCE_COALESCED] = slot_all_reduce_coalesced,
    [TDIST__OP_ALL_GATHER] = slot_all_gather,
    [TDIST__OP_ALL_GATHERV] = slot_all_gatherv,
    [TDIST__OP_GATHER] = slot_gather,
    [TDIST__OP_SCATTER] = slot_scatter,
    [TDIST__OP_REDUCE_SCATTER] = slot_reduce_scatter,
    [TDIST__OP_ALL_TO_ALL] = slot_all_to_all,
    [TDIST__OP_ALL_TO_ALLV] = slot_all_to_allv,
    [TDIST__OP_BARRIER] = slot_barrier,
    [TDIST__OP_MONITORED_BARRIER] = slot_monitored_barrier,
}};
