/*
 * tests/mpi/mpi_prog.c — the program tests/mpi/test_mpi.c runs under
 * `mpirun -np N` (one scenario per run, named by argv[1]). Every rank joins
 * with tdist_init("mpi://") and checks results it computes itself; any
 * failure prints "[mpi rank R] file:line: message" and exits 1 (mpirun
 * then ends the job with a non-zero status). Rank 0 prints "MPI_PROG OK
 * <scenario>" at the end.
 *
 *   matrix     every collective x dtype x reduce op x counts against
 *              locally computed results (tests/harness/gen.h)
 *   sub        new_group / split / nested split, p2p in a subgroup
 *   mismatch   fingerprint mismatches: the MPI group's message equals a
 *              native group's (same world, same calls)
 *   timeout    a collective rank 1 never issues fails on rank 0 within
 *              timeout + 1 s with TDIST_ERR_TIMEOUT naming the op
 *   frhang     flight recorder: rank 2 stays in its own code (3 s) and never
 *              issues seq 6; ranks 0 and 1 time out (1 s) and dump
 *   frskip     flight recorder: rank 2 issues a barrier as seq 6 where ranks
 *              0 and 1 issue an all_reduce (mismatch: every rank dumps)
 *   frdiff     ... an all_reduce of 3 floats, not 2 (mismatch: every rank dumps)
 *   frstop     ... stops itself (SIGSTOP); ranks 0 and 1 time out (1 s) and
 *              dump; rank 0 runs tdist-fr while rank 2 is stopped, then
 *              sends it SIGCONT
 *   frkill     ... SIGKILLs itself once ranks 0 and 1 have issued seq 6;
 *              mpirun then kills them (every rank's ring stays in the dir)
 *   frkillrec  the same under mpirun --enable-recovery: ranks 0 and 1 time
 *              out (1 s), dump, and leave without MPI_Finalize
 *   frdeadlock ... waits in its own code; rank 0 sends SIGUSR1 to mpirun,
 *              runs tdist-fr on the three live dumps, then lets rank 2 go on:
 *              its late seq 6 completes on every rank
 *   monitored  monitored_barrier names the rank that did not arrive
 *   p2p        send / recv ring, async, and a header mismatch
 *   ddp        DDP over the MPI group equals DDP over a native group
 *   ddpjoin    the same under a Join with uneven inputs (rank r: 5 + r steps)
 *   ddpbf16    DDP with the bf16 compression hook over the MPI group equals
 *              the same over a native group (2 ranks: bit for bit)
 *   envinit    env:// + TDIST_BACKEND=mpi makes an MPI world and MPI group
 *              (rank / size to check: OMPI_COMM_WORLD_*, else Hydra's PMI_*)
 *   zero       ZeRO (Adam) over the MPI group, with the overlap hook (several
 *              buckets) and without it (FLAT partition), equals the same over
 *              a native group
 *   death      rank 1 SIGKILLs itself during an all_reduce loop; the others
 *              print what they saw (docs/mpi.md)
 *   tune       Open MPI's coll_libnbc_iallreduce_algorithm, which the backend
 *              sets to "ring" around its large MPI_Iallreduce posts, reads
 *              the same before and after tdist's all_reduces (0, or what
 *              OMPI_MCA_coll_libnbc_iallreduce_algorithm says); results right
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <mpi.h>

#include "gen.h"
#include "harness.h"
#include "tdist/algorithms.h"
#include "tdist/ddp.h"
#include "tdist/join.h"
#include "tdist/tdist.h"

int tdist_test_rank = -1;

_Noreturn void tdist_test_fail(const char *file, int line, const char *fmt, ...)
{
    char m[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    fprintf(stderr, "[mpi rank %d] %s:%d: %s\n", tdist_test_rank, file, line, m);
    fflush(stderr);
    _exit(1);
}

double tdist_test_timeout_mult(void) { return 1.0; }

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static int R, N;

static tdist_pg_t *make_pg(tdist_world_t *w, const char *backend, int64_t timeout_ms)
{
    tdist_pg_opts_t o;
    tdist_pg_opts_init(&o);
    o.backend = backend;
    o.name = "world";
    o.timeout_ms = timeout_ms;
    tdist_pg_t *pg = NULL;
    ASSERT_OK(tdist_pg_create_world(w, &o, &pg));
    ASSERT_EQ(tdist_pg_rank(pg), R);
    ASSERT_EQ(tdist_pg_size(pg), N);
    return pg;
}

static void expect_eq(const void *got, const void *want, size_t count, tdist_dtype_t dt,
                      const char *what, tdist_redop_t op)
{
    size_t es = tdist_dtype_size(dt);
    if (count == 0 || memcmp(got, want, count * es) == 0) return;
    for (size_t i = 0; i < count; i++)
        if (memcmp((const uint8_t *)got + i * es, (const uint8_t *)want + i * es, es) != 0)
        {
            uint64_t g = 0, x = 0;
            memcpy(&g, (const uint8_t *)got + i * es, es);
            memcpy(&x, (const uint8_t *)want + i * es, es);
            FAIL("%s size %d %s %s count %zu: element %zu differs (got bits %llx, want %llx)",
                 what, N, tdist_dtype_name(dt), tdist_redop_name(op), count, i,
                 (unsigned long long)g, (unsigned long long)x);
        }
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    ASSERT_TRUE(p != NULL);
    memset(p, 0xA5, n ? n : 1);
    return p;
}

#define PREMUL 0.5

/* ------------------------------------------------------------- matrix */

static void reductions(tdist_pg_t *pg, tdist_dtype_t dt, tdist_redop_t op, size_t count,
                       uint64_t seed)
{
    size_t es = tdist_dtype_size(dt), bytes = count * es;
    tdist_coll_opts_t co;
    tdist_coll_opts_init(&co);
    co.premul_factor = PREMUL;
    uint8_t *want = xmalloc(bytes), *mine = xmalloc(bytes), *out = xmalloc(bytes);
    tgen_reference(want, count, dt, op, N, seed, PREMUL);
    tgen_fill(mine, count, dt, op, R, seed);
    /* all_reduce, out of place then in place */
    ASSERT_OK(tdist_all_reduce(pg, mine, out, count, dt, op, &co, NULL));
    expect_eq(out, want, count, dt, "all_reduce", op);
    uint8_t *chk = xmalloc(bytes);
    tgen_fill(chk, count, dt, op, R, seed);
    ASSERT_MEMEQ(mine, chk, bytes); /* sendbuf untouched */
    memcpy(out, mine, bytes);
    ASSERT_OK(tdist_all_reduce(pg, out, out, count, dt, op, &co, NULL));
    expect_eq(out, want, count, dt, "all_reduce in place", op);
    /* reduce to a rotating root */
    int root = (int)(seed % (uint64_t)N);
    memset(out, 0xA5, bytes ? bytes : 1);
    ASSERT_OK(tdist_reduce_to(pg, mine, R == root ? out : NULL, count, dt, op, root, &co, NULL));
    if (R == root) expect_eq(out, want, count, dt, "reduce", op);
    memcpy(out, mine, bytes);
    ASSERT_OK(tdist_reduce_to(pg, out, out, count, dt, op, root, &co, NULL));
    if (R == root) expect_eq(out, want, count, dt, "reduce in place", op);
    /* all_reduce_coalesced: two buffers (count and count / 2 + 1) */
    {
        size_t c2 = count / 2 + 1;
        uint8_t *a = xmalloc(bytes), *b = xmalloc(c2 * es), *wb = xmalloc(c2 * es);
        memcpy(a, mine, bytes);
        tgen_fill(b, c2, dt, op, R, seed + 7);
        tgen_reference(wb, c2, dt, op, N, seed + 7, PREMUL);
        void *bufs[2] = {a, b};
        size_t counts[2] = {count, c2};
        ASSERT_OK(tdist_all_reduce_coalesced(pg, bufs, counts, 2, dt, op, &co, NULL));
        expect_eq(a, want, count, dt, "all_reduce_coalesced[0]", op);
        expect_eq(b, wb, c2, dt, "all_reduce_coalesced[1]", op);
        free(a);
        free(b);
        free(wb);
    }
    /* reduce_scatter: input N * count */
    {
        size_t tot = bytes * (size_t)N;
        uint8_t *aw = xmalloc(bytes ? bytes : 1), *am = xmalloc(tot), *o = xmalloc(tot);
        tgen_reference_part(aw, (size_t)R * count, count, dt, op, N, seed + 1, PREMUL); /* block R */
        tgen_fill(am, count * (size_t)N, dt, op, R, seed + 1);
        ASSERT_OK(tdist_reduce_scatter(pg, am, o, count, dt, op, &co, NULL));
        expect_eq(o, aw, count, dt, "reduce_scatter", op);
        memcpy(o, am, tot);
        ASSERT_OK(tdist_reduce_scatter(pg, o, o, count, dt, op, &co, NULL));
        expect_eq(o, aw, count, dt, "reduce_scatter in place", op);
        free(aw);
        free(am);
        free(o);
    }
    free(want);
    free(mine);
    free(out);
    free(chk);
}

static void movement(tdist_pg_t *pg, tdist_dtype_t dt, size_t count, uint64_t seed)
{
    size_t es = tdist_dtype_size(dt), bytes = count * es, nb = bytes * (size_t)N;
    int root = (int)((seed / 3) % (uint64_t)N);
    uint8_t *want = xmalloc(nb), *buf = xmalloc(nb), *out = xmalloc(nb);
    /* broadcast */
    tgen_fill(want, count, dt, TDIST_SUM, root, seed);
    if (R == root) memcpy(buf, want, bytes);
    ASSERT_OK(tdist_broadcast(pg, buf, count, dt, root, NULL, NULL));
    expect_eq(buf, want, count, dt, "broadcast", TDIST_SUM);
    /* all_gather out of place, in place */
    for (int p = 0; p < N; p++) tgen_fill(want + (size_t)p * bytes, count, dt, TDIST_SUM, p, seed + 2);
    tgen_fill(buf, count, dt, TDIST_SUM, R, seed + 2);
    ASSERT_OK(tdist_all_gather(pg, buf, out, count, dt, NULL, NULL));
    expect_eq(out, want, count * (size_t)N, dt, "all_gather", TDIST_SUM);
    memset(out, 0xA5, nb ? nb : 1);
    tgen_fill(out + (size_t)R * bytes, count, dt, TDIST_SUM, R, seed + 2);
    ASSERT_OK(tdist_all_gather(pg, out + (size_t)R * bytes, out, count, dt, NULL, NULL));
    expect_eq(out, want, count * (size_t)N, dt, "all_gather in place", TDIST_SUM);
    /* gather, scatter */
    memset(out, 0xA5, nb ? nb : 1);
    ASSERT_OK(tdist_gather(pg, buf, R == root ? out : NULL, count, dt, root, NULL, NULL));
    if (R == root) expect_eq(out, want, count * (size_t)N, dt, "gather", TDIST_SUM);
    memset(out, 0xA5, nb ? nb : 1);
    ASSERT_OK(tdist_scatter(pg, R == root ? want : NULL, out, count, dt, root, NULL, NULL));
    expect_eq(out, want + (size_t)R * bytes, count, dt, "scatter", TDIST_SUM);
    /* all_to_all: block to p from r is tgen_fill(rank = r * 64 + p) */
    for (int p = 0; p < N; p++) {
        tgen_fill(buf + (size_t)p * bytes, count, dt, TDIST_SUM, R * 64 + p, seed + 4);
        tgen_fill(want + (size_t)p * bytes, count, dt, TDIST_SUM, p * 64 + R, seed + 4);
    }
    ASSERT_OK(tdist_all_to_all(pg, buf, out, count, dt, NULL, NULL));
    expect_eq(out, want, count * (size_t)N, dt, "all_to_all", TDIST_SUM);
    ASSERT_OK(tdist_all_to_all(pg, buf, buf, count, dt, NULL, NULL));
    expect_eq(buf, want, count * (size_t)N, dt, "all_to_all in place", TDIST_SUM);
    free(want);
    free(buf);
    free(out);
    /* uneven: all_gatherv and all_to_allv with counts (count + r + p) % 5 */
    size_t cnt[64], sc[64], rc[64], off[65];
    off[0] = 0;
    for (int p = 0; p < N; p++) {
        cnt[p] = count + (size_t)p;
        off[p + 1] = off[p] + cnt[p];
    }
    uint8_t *gw = xmalloc(off[N] * es), *go = xmalloc(off[N] * es), *gs = xmalloc(cnt[R] * es);
    for (int p = 0; p < N; p++) tgen_fill(gw + off[p] * es, cnt[p], dt, TDIST_SUM, p, seed + 5);
    tgen_fill(gs, cnt[R], dt, TDIST_SUM, R, seed + 5);
    ASSERT_OK(tdist_all_gatherv(pg, gs, go, cnt, dt, NULL, NULL));
    expect_eq(go, gw, off[N], dt, "all_gatherv", TDIST_SUM);
    free(gw);
    free(go);
    free(gs);
    size_t st = 0, rt = 0;
    for (int p = 0; p < N; p++) {
        sc[p] = (count + (size_t)R + (size_t)p) % 5 + count;
        rc[p] = (count + (size_t)p + (size_t)R) % 5 + count;
        st += sc[p];
        rt += rc[p];
    }
    uint8_t *as = xmalloc(st * es), *ar = xmalloc(rt * es), *aw = xmalloc(rt * es);
    size_t so = 0, ro = 0;
    for (int p = 0; p < N; p++) {
        tgen_fill(as + so * es, sc[p], dt, TDIST_SUM, R * 64 + p, seed + 6);
        tgen_fill(aw + ro * es, rc[p], dt, TDIST_SUM, p * 64 + R, seed + 6);
        so += sc[p];
        ro += rc[p];
    }
    ASSERT_OK(tdist_all_to_allv(pg, as, sc, ar, rc, dt, NULL, NULL));
    expect_eq(ar, aw, rt, dt, "all_to_allv", TDIST_SUM);
    free(as);
    free(ar);
    free(aw);
    /* broadcast_coalesced */
    {
        size_t c2 = count + 3;
        uint8_t *a = xmalloc(bytes), *b = xmalloc(c2 * es), *wa = xmalloc(bytes), *wb = xmalloc(c2 * es);
        tgen_fill(wa, count, dt, TDIST_SUM, root, seed + 8);
        tgen_fill(wb, c2, dt, TDIST_SUM, root, seed + 9);
        if (R == root) {
            memcpy(a, wa, bytes);
            memcpy(b, wb, c2 * es);
        }
        void *bufs[2] = {a, b};
        size_t counts[2] = {count, c2};
        ASSERT_OK(tdist_broadcast_coalesced(pg, bufs, counts, 2, dt, root, NULL, NULL));
        expect_eq(a, wa, count, dt, "broadcast_coalesced[0]", TDIST_SUM);
        expect_eq(b, wb, c2, dt, "broadcast_coalesced[1]", TDIST_SUM);
        free(a);
        free(b);
        free(wa);
        free(wb);
    }
    ASSERT_OK(tdist_barrier(pg, NULL, NULL));
}

static void async_many(tdist_pg_t *pg)
{
    enum { K = 20, C = 333 };
    static int32_t in[K][C], out[K][C];
    tdist_work_t *w[K];
    for (int k = 0; k < K; k++) {
        for (int i = 0; i < C; i++) in[k][i] = R * 1000 + k * 7 + i;
        ASSERT_OK(tdist_all_reduce(pg, in[k], out[k], C, TDIST_I32, TDIST_SUM, NULL, &w[k]));
    }
    for (int k = 0; k < K; k++) {
        ASSERT_OK(tdist_work_wait(w[k], 60000));
        tdist_work_free(w[k]);
        for (int i = 0; i < C; i++) {
            int32_t s = 0;
            for (int r = 0; r < N; r++) s += r * 1000 + k * 7 + i;
            ASSERT_EQ(out[k][i], s);
        }
    }
}

static void run_matrix(tdist_world_t *w)
{
    tdist_pg_t *pg = make_pg(w, "mpi", 60000);
    static const size_t counts[] = {0, 1, 7, 1000, 40000};
    uint64_t seed = 1;
    for (size_t ci = 0; ci < sizeof counts / sizeof counts[0]; ci++)
        for (int dt = 0; dt < TDIST_DTYPE_COUNT; dt++) {
            for (int op = 0; op < TDIST_REDOP_COUNT; op++) {
                if (!tgen_op_valid((tdist_redop_t)op, (tdist_dtype_t)dt)) continue;
                reductions(pg, (tdist_dtype_t)dt, (tdist_redop_t)op, counts[ci], seed++);
            }
            movement(pg, (tdist_dtype_t)dt, counts[ci], seed++);
        }
    async_many(pg);
    /* every rank got through the same number of collectives */
    ASSERT_OK(tdist_pg_error(pg, NULL, 0));
    tdist_pg_destroy(pg);
}

/* -------------------------------------------------------------- groups */

static void run_sub(tdist_world_t *w)
{
    ASSERT_TRUE(N == 4);
    tdist_pg_t *pg = make_pg(w, "mpi", 30000);
    /* new_group [3, 1] */
    int ranks[2] = {3, 1};
    tdist_pg_t *g = NULL;
    ASSERT_OK(tdist_pg_new_group(pg, ranks, 2, NULL, &g));
    if (R == 3 || R == 1) {
        ASSERT_TRUE(g != NULL);
        ASSERT_EQ(tdist_pg_rank(g), R == 3 ? 0 : 1);
        ASSERT_EQ(tdist_pg_size(g), 2);
        ASSERT_EQ(tdist_pg_world_rank(g, 0), 3);
        ASSERT_STREQ(tdist_pg_name(g), "world.0");
        int32_t v = R, s = 0;
        ASSERT_OK(tdist_all_reduce(g, &v, &s, 1, TDIST_I32, TDIST_SUM, NULL, NULL));
        ASSERT_EQ(s, 4);
        int32_t b = R == 3 ? 42 : 0;
        ASSERT_OK(tdist_broadcast(g, &b, 1, TDIST_I32, 0, NULL, NULL)); /* root: world rank 3 */
        ASSERT_EQ(b, 42);
        /* p2p inside the subgroup */
        int32_t x = R * 10, y = -1;
        if (tdist_pg_rank(g) == 0) {
            ASSERT_OK(tdist_send(g, &x, 1, TDIST_I32, 1, NULL, NULL));
            ASSERT_OK(tdist_recv(g, &y, 1, TDIST_I32, 1, NULL, NULL));
            ASSERT_EQ(y, 10);
        } else {
            ASSERT_OK(tdist_recv(g, &y, 1, TDIST_I32, 0, NULL, NULL));
            ASSERT_OK(tdist_send(g, &x, 1, TDIST_I32, 0, NULL, NULL));
            ASSERT_EQ(y, 30);
        }
    } else {
        ASSERT_TRUE(g == NULL);
    }
    /* split: color = rank % 2, key = -rank (reversed order) */
    tdist_pg_t *s = NULL;
    ASSERT_OK(tdist_pg_split(pg, R % 2, -R, NULL, &s));
    ASSERT_TRUE(s != NULL);
    ASSERT_EQ(tdist_pg_size(s), 2);
    int want_rank = R >= 2 ? 0 : 1; /* larger rank first */
    ASSERT_EQ(tdist_pg_rank(s), want_rank);
    int32_t v = R + 1, out[2] = {0, 0};
    ASSERT_OK(tdist_all_gather(s, &v, out, 1, TDIST_I32, NULL, NULL));
    ASSERT_EQ(out[0], (R % 2) + 2 + 1);
    ASSERT_EQ(out[1], (R % 2) + 1);
    /* a split where rank 0 opts out, then a nested split */
    tdist_pg_t *s2 = NULL;
    ASSERT_OK(tdist_pg_split(pg, R == 0 ? -1 : 7, R, NULL, &s2));
    if (R == 0) {
        ASSERT_TRUE(s2 == NULL);
    } else {
        ASSERT_EQ(tdist_pg_size(s2), 3);
        ASSERT_EQ(tdist_pg_rank(s2), R - 1);
        tdist_pg_t *s3 = NULL;
        ASSERT_OK(tdist_pg_split(s2, tdist_pg_rank(s2) == 0 ? 0 : 1, 0, NULL, &s3));
        int64_t x = R, sum = 0;
        ASSERT_OK(tdist_all_reduce(s3, &x, &sum, 1, TDIST_I64, TDIST_SUM, NULL, NULL));
        ASSERT_EQ(sum, R == 1 ? 1 : 5);
        tdist_pg_destroy(s3);
    }
    /* the world group still works after all this, concurrently with a subgroup */
    tdist_work_t *wk = NULL;
    int32_t a = 1, as = 0;
    ASSERT_OK(tdist_all_reduce(pg, &a, &as, 1, TDIST_I32, TDIST_SUM, NULL, &wk));
    int32_t b2 = 1, bs = 0;
    ASSERT_OK(tdist_all_reduce(s, &b2, &bs, 1, TDIST_I32, TDIST_SUM, NULL, NULL));
    ASSERT_OK(tdist_work_wait(wk, 30000));
    tdist_work_free(wk);
    ASSERT_EQ(as, 4);
    ASSERT_EQ(bs, 2);
    tdist_pg_destroy(s2);
    tdist_pg_destroy(s);
    tdist_pg_destroy(g);
    tdist_pg_destroy(pg);
}

/* ------------------------------------------------------------ mismatch */

/* Run case k on a fresh group of backend be; return the status and copy
 * the message. */
static tdist_status_t mismatch_case(tdist_world_t *w, const char *be, int k, char *msg, size_t n)
{
    tdist_pg_t *pg = make_pg(w, be, 20000);
    float buf[64] = {0}, out[64];
    tdist_status_t st = TDIST_OK;
    switch (k) {
    case 0: /* all_reduce vs broadcast */
        st = R == 0 ? tdist_all_reduce(pg, buf, out, 8, TDIST_F32, TDIST_SUM, NULL, NULL)
                    : tdist_broadcast(pg, buf, 8, TDIST_F32, 0, NULL, NULL);
        break;
    case 1: /* count differs on the last rank */
        st = tdist_all_reduce(pg, buf, out, R == N - 1 ? 9 : 8, TDIST_F32, TDIST_SUM, NULL, NULL);
        break;
    case 2: /* dtype */
        st = tdist_all_reduce(pg, buf, out, 4, R == 1 ? TDIST_I32 : TDIST_F32, TDIST_SUM, NULL, NULL);
        break;
    case 3: /* redop */
        st = tdist_all_reduce(pg, buf, out, 4, TDIST_F32, R == 1 ? TDIST_MAX : TDIST_SUM, NULL, NULL);
        break;
    case 4: { /* all_to_allv pairwise: rank 1 expects one more from rank 0 */
        size_t sc[64], rc[64];
        for (int p = 0; p < N; p++) sc[p] = rc[p] = 1;
        if (R == 1) rc[0] = 2;
        st = tdist_all_to_allv(pg, buf, sc, out, rc, TDIST_F32, NULL, NULL);
        break;
    }
    default: /* barrier vs all_reduce of one element */
        st = R == 0 ? tdist_barrier(pg, NULL, NULL)
                    : tdist_all_reduce(pg, buf, out, 1, TDIST_F32, TDIST_SUM, NULL, NULL);
        break;
    }
    snprintf(msg, n, "%s", tdist_last_error());
    /* sticky: the next call fails too */
    ASSERT_STATUS(tdist_barrier(pg, NULL, NULL), st);
    tdist_pg_destroy(pg);
    return st;
}

static void run_mismatch(tdist_world_t *w)
{
    for (int k = 0; k < 6; k++) {
        char nat[2048], mpi[2048];
        tdist_status_t sn = mismatch_case(w, "native", k, nat, sizeof nat);
        tdist_status_t sm = mismatch_case(w, "mpi", k, mpi, sizeof mpi);
        if (sn != TDIST_ERR_MISMATCH || sm != TDIST_ERR_MISMATCH)
            FAIL("case %d: native %s (%s), mpi %s (%s)", k, tdist_status_str(sn), nat,
                 tdist_status_str(sm), mpi);
        if (strcmp(nat, mpi) != 0) FAIL("case %d: messages differ:\n native: %s\n mpi:    %s", k, nat, mpi);
        ASSERT_CONTAINS(mpi, "collective mismatch: ");
        if (R == 0) printf("mismatch case %d: %s\n", k, mpi);
    }
}

/* ------------------------------------------------------------- timeout */

static void run_timeout(tdist_world_t *w)
{
    tdist_pg_t *pg = make_pg(w, "mpi", 60000);
    /* one good collective first: the group is up on every rank */
    int32_t one = 1, n = 0;
    ASSERT_OK(tdist_all_reduce(pg, &one, &n, 1, TDIST_I32, TDIST_SUM, NULL, NULL));
    ASSERT_EQ(n, N);
    if (R == 0) {
        tdist_coll_opts_t co;
        tdist_coll_opts_init(&co);
        co.timeout_ms = 1000;
        float x[16] = {0};
        double t0 = now_ms();
        tdist_status_t st = tdist_all_reduce(pg, x, x, 16, TDIST_F32, TDIST_SUM, &co, NULL);
        double el = now_ms() - t0;
        const char *m = tdist_last_error();
        printf("timeout: rank 0 all_reduce returned %s after %.0f ms: %s\n", tdist_status_str(st),
               el, m);
        ASSERT_STATUS(st, TDIST_ERR_TIMEOUT);
        ASSERT_TRUE(el >= 990 && el <= 2000);
        ASSERT_CONTAINS(m, "rank 0 group world seq 2 all_reduce(f32, 16, sum)");
        ASSERT_CONTAINS(m, "did not complete within 1000 ms");
        char buf[1024];
        ASSERT_STATUS(tdist_pg_error(pg, buf, sizeof buf), TDIST_ERR_TIMEOUT);
        /* sticky: an async call after it fails at once */
        ASSERT_STATUS(tdist_barrier(pg, NULL, NULL), TDIST_ERR_TIMEOUT);
    }
    /* the other ranks never issue it; destroy returns (nothing is pending there) */
    tdist_pg_destroy(pg);
}

static void run_monitored(tdist_world_t *w)
{
    ASSERT_TRUE(N == 3);
    tdist_pg_t *pg = make_pg(w, "mpi", 60000);
    tdist_coll_opts_t co;
    tdist_coll_opts_init(&co);
    co.timeout_ms = 1000;
    ASSERT_OK(tdist_monitored_barrier(pg, &co)); /* everyone: fine */
    if (R != 2) {
        tdist_status_t st = tdist_monitored_barrier(pg, &co);
        printf("monitored: rank %d: %s: %s\n", R, tdist_status_str(st), tdist_last_error());
        ASSERT_STATUS(st, TDIST_ERR_TIMEOUT);
        ASSERT_CONTAINS(tdist_last_error(), "monitored_barrier: rank 2 did not arrive within 1000 ms");
    }
    tdist_pg_destroy(pg);
}

/* -------------------------------------------------------- flight recorder */

/* Three ranks run five all_reduces; rank 2 then stays in its own code for
 * 3 s and leaves without the sixth, where ranks 0 and 1 time out (1 s).
 * test_mpi.c reads the records (TDIST_FR_DIR) with tdist-fr. */
static void run_frhang(tdist_world_t *w)
{
    ASSERT_TRUE(N == 3);
    tdist_pg_t *pg = make_pg(w, "mpi", 1000);
    float x[2] = {1, 2};
    for (int i = 0; i < 5; i++) ASSERT_OK(tdist_all_reduce(pg, x, x, 2, TDIST_F32, TDIST_SUM, NULL, NULL));
    if (R == 2) {
        usleep(3000 * 1000);
    } else {
        tdist_status_t st = tdist_all_reduce(pg, x, x, 2, TDIST_F32, TDIST_SUM, NULL, NULL);
        printf("frhang: rank %d: %s: %s\n", R, tdist_status_str(st), tdist_last_error());
        ASSERT_STATUS(st, TDIST_ERR_TIMEOUT);
    }
    tdist_pg_destroy(pg);
}

/* The other four hang scenarios of tests/pg/test_pg_fr.c (the killed rank
 * with and without mpirun --enable-recovery), on three ranks
 * of an MPI group after five all_reduces, with TDIST_FR_DIR set (see the
 * list at the top of this file). MPI_COMM_WORLD carries the test's own
 * messages (pids, "I issued seq 6", "go on"), outside tdist's group.
 * tdist-fr is MPI_PROG_FR_TOOL; rank 0 writes its output to
 * MPI_PROG_FR_OUT and prints "fr: tdist-fr DIR exited N". */
typedef enum fr_case { FR_SKIP, FR_DIFFERENT, FR_STOP, FR_KILL, FR_KILL_RECOVERY, FR_DEADLOCK } fr_case_t;

static const char *fr_dir(void)
{
    const char *d = getenv("TDIST_FR_DIR");
    ASSERT_TRUE(d && *d);
    return d;
}

/* Wait (bounded: 20 s) until dir holds rank r's dump of the world group. */
static void fr_wait_dump(const char *dir, int r)
{
    char p[700];
    snprintf(p, sizeof p, "%s/tdist-fr.r%d.world.json", dir, r);
    double t0 = now_ms();
    while (access(p, R_OK) != 0) {
        if (now_ms() - t0 > 20000) FAIL("no dump %s after 20 s", p);
        usleep(20 * 1000);
    }
}

/* Wait (bounded: 20 s) until process pid is stopped. */
static void fr_wait_stopped(int pid)
{
    char p[64], st[512];
    snprintf(p, sizeof p, "/proc/%d/stat", pid);
    for (double t0 = now_ms();; usleep(20 * 1000)) {
        FILE *f = fopen(p, "r");
        ASSERT_TRUE(f != NULL);
        size_t k = fread(st, 1, sizeof st - 1, f);
        fclose(f);
        st[k] = '\0';
        const char *e = strrchr(st, ')'); /* "pid (comm) S ..." */
        if (e && (e[2] == 'T' || e[2] == 't')) return;
        if (now_ms() - t0 > 20000) FAIL("rank 2 (pid %d) did not stop: %s", pid, st);
    }
}

/* Rank 0: tdist-fr on dir while the ranks are as the scenario left them. */
static void fr_analyze(const char *dir)
{
    const char *tool = getenv("MPI_PROG_FR_TOOL"), *out = getenv("MPI_PROG_FR_OUT");
    ASSERT_TRUE(tool && out);
    char cmd[3000];
    snprintf(cmd, sizeof cmd, "'%s' '%s' > '%s' 2>&1", tool, dir, out);
    int st = system(cmd);
    ASSERT_TRUE(st != -1 && WIFEXITED(st));
    printf("fr: tdist-fr %s exited %d\n", dir, WEXITSTATUS(st));
}

/* Copy dir's dump of world rank r into dir/live. */
static void fr_copy_dump(const char *dir, int r)
{
    char from[700], to[720], buf[1 << 14];
    snprintf(from, sizeof from, "%s/tdist-fr.r%d.world.json", dir, r);
    snprintf(to, sizeof to, "%s/live/tdist-fr.r%d.world.json", dir, r);
    FILE *in = fopen(from, "r"), *out = fopen(to, "w");
    ASSERT_TRUE(in && out);
    size_t k;
    while ((k = fread(buf, 1, sizeof buf, in)) > 0) ASSERT_EQ(fwrite(buf, 1, k, out), k);
    fclose(in);
    ASSERT_EQ(fclose(out), 0);
}

/* How often file path holds text (read up to 64 KiB). */
static int file_count(const char *path, const char *text)
{
    static char buf[1 << 16];
    FILE *f = fopen(path, "r");
    ASSERT_TRUE(f != NULL);
    size_t k = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[k] = '\0';
    int n = 0;
    for (const char *at = buf; (at = strstr(at, text)) != NULL; at++) n++;
    return n;
}

/* Rank 0 while ranks 0 and 1 wait in seq 6 and rank 2 sits in its own
 * code: SIGUSR1 to mpirun (this process's parent), which passes it to
 * every rank; each writes a live dump; the three, copied alone into
 * DIR/live, go to tdist-fr. Dumped again (the old dumps removed first)
 * while an engine thread has not yet started its seq 6 ("queued") or its
 * wait has not yet noted rank 2 (it notes once it stops spinning), for a
 * bounded time. Then rank 2 is told to go on. */
static void fr_live_check(void)
{
    const char *dir = fr_dir();
    char live[600], p[700];
    snprintf(live, sizeof live, "%s/live", dir);
    ASSERT_TRUE(mkdir(live, 0700) == 0);
    for (double t0 = now_ms();;) {
        for (int r = 0; r < 3; r++) {
            snprintf(p, sizeof p, "%s/tdist-fr.r%d.world.json", dir, r);
            ASSERT_TRUE(unlink(p) == 0 || errno == ENOENT);
        }
        ASSERT_EQ(kill(getppid(), SIGUSR1), 0);
        for (int r = 0; r < 3; r++) fr_wait_dump(dir, r);
        for (int r = 0; r < 3; r++) fr_copy_dump(dir, r);
        fr_analyze(live);
        /* again while a wait of seq 6 has not yet noted rank 2 */
        const char *out = getenv("MPI_PROG_FR_OUT");
        if ((file_count(out, "(queued") == 0 &&
             file_count(out, "algorithm slot; waiting on rank 2)") == 2) ||
            now_ms() - t0 > 10000)
            break;
        usleep(50 * 1000);
    }
    int go = 1;
    ASSERT_TRUE(MPI_Send(&go, 1, MPI_INT, 2, 78, MPI_COMM_WORLD) == MPI_SUCCESS);
}

/* seq 6 completed on every rank: x was {243, 486} (five sums of 3 ranks). */
static void fr_check_seq6(const float *x)
{
    if (x[0] != 729.0f || x[1] != 1458.0f) FAIL("seq 6 gave {%g, %g}, want {729, 1458}", x[0], x[1]);
}

/* Rank 2 goes wrong where the others issue their sixth collective. */
static void fr_rank2(fr_case_t c, tdist_pg_t *pg, float *x)
{
    tdist_status_t st = TDIST_OK;
    int got = 0;
    MPI_Request rq;
    switch (c) {
    case FR_SKIP:
        st = tdist_barrier(pg, NULL, NULL);
        break;
    case FR_DIFFERENT:
        st = tdist_all_reduce(pg, x, x, 3, TDIST_F32, TDIST_SUM, NULL, NULL);
        break;
    case FR_STOP:
        raise(SIGSTOP); /* rank 0 sends SIGCONT after its analysis */
        return;
    case FR_KILL: /* once ranks 0 and 1 have issued seq 6 */
    case FR_KILL_RECOVERY:
        for (int r = 0; r < 2; r++)
            ASSERT_TRUE(MPI_Recv(&got, 1, MPI_INT, r, 77, MPI_COMM_WORLD, MPI_STATUS_IGNORE) ==
                        MPI_SUCCESS);
        fprintf(stderr, "frkill: rank 2 raises SIGKILL\n");
        fflush(stderr);
        raise(SIGKILL);
        return;
    case FR_DEADLOCK: /* stuck in its own code until rank 0 says go (bounded) */
        ASSERT_TRUE(MPI_Irecv(&got, 1, MPI_INT, 0, 78, MPI_COMM_WORLD, &rq) == MPI_SUCCESS);
        for (double t0 = now_ms();;) {
            int done = 0;
            ASSERT_TRUE(MPI_Test(&rq, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS);
            if (done) break;
            if (now_ms() - t0 > 30000) FAIL("rank 0 never released rank 2");
            usleep(10 * 1000);
        }
        ASSERT_OK(tdist_all_reduce(pg, x, x, 2, TDIST_F32, TDIST_SUM, NULL, NULL));
        fr_check_seq6(x);
        return;
    }
    printf("fr: rank 2: %s: %s\n", tdist_status_str(st), tdist_last_error());
    ASSERT_TRUE(st != TDIST_OK);
}

/* A survivor of rank 2's death under mpirun --enable-recovery: MPI never
 * fails seq 6, tdist's deadline (1 s) does, and the rank dumps. It then
 * leaves without tdist_world_destroy or MPI_Finalize, which would wait for
 * the dead rank (docs/mpi.md). */
static _Noreturn void fr_survive(tdist_pg_t *pg, tdist_work_t *wk)
{
    tdist_status_t st = tdist_work_wait(wk, -1);
    printf("fr: rank %d: %s: %s\n", R, tdist_status_str(st), tdist_last_error());
    ASSERT_STATUS(st, TDIST_ERR_TIMEOUT);
    tdist_work_free(wk);
    fr_wait_dump(fr_dir(), R);
    tdist_pg_destroy(pg);
    printf("fr: rank %d dumped and leaves\n", R);
    fflush(stdout);
    _exit(0);
}

/* Ranks 0 and 1 while rank 2 is killed or deadlocked: seq 6 issued (a
 * work), then rank 2 is told so (kill: it dies once both have), or rank 0
 * waits for rank 1's word and takes the live dumps (deadlock). Killed:
 * mpirun ends this rank long before its timeout. */
static void fr_others_wait(fr_case_t c, tdist_pg_t *pg, float *x)
{
    tdist_work_t *wk = NULL;
    ASSERT_OK(tdist_all_reduce(pg, x, x, 2, TDIST_F32, TDIST_SUM, NULL, &wk));
    int one = 1;
    bool kill2 = c == FR_KILL || c == FR_KILL_RECOVERY;
    if (kill2 || R == 1)
        ASSERT_TRUE(MPI_Send(&one, 1, MPI_INT, kill2 ? 2 : 0, 77, MPI_COMM_WORLD) ==
                    MPI_SUCCESS);
    if (c == FR_KILL) {
        tdist_status_t st = tdist_work_wait(wk, -1);
        FAIL("seq 6 ended (%s: %s) before mpirun killed this rank", tdist_status_str(st),
             tdist_last_error());
    }
    if (c == FR_KILL_RECOVERY) fr_survive(pg, wk);
    if (R == 0) {
        ASSERT_TRUE(MPI_Recv(&one, 1, MPI_INT, 1, 77, MPI_COMM_WORLD, MPI_STATUS_IGNORE) ==
                    MPI_SUCCESS);
        fr_live_check();
    }
    ASSERT_OK(tdist_work_wait(wk, -1));
    tdist_work_free(wk);
    fr_check_seq6(x);
}

static void run_frcase(tdist_world_t *w, fr_case_t c)
{
    ASSERT_TRUE(N == 3);
    int pid = (int)getpid(), pids[3];
    ASSERT_TRUE(MPI_Allgather(&pid, 1, MPI_INT, pids, 1, MPI_INT, MPI_COMM_WORLD) == MPI_SUCCESS);
    /* stopped, or killed with recovery: ranks 0 and 1 time out; otherwise
     * the timeout never fires */
    tdist_pg_t *pg = make_pg(w, "mpi", c == FR_STOP || c == FR_KILL_RECOVERY ? 1000 : 60000);
    float x[3] = {1, 2, 3};
    for (int i = 0; i < 5; i++) ASSERT_OK(tdist_all_reduce(pg, x, x, 2, TDIST_F32, TDIST_SUM, NULL, NULL));
    if (R == 2) {
        fr_rank2(c, pg, x);
    } else if (c == FR_KILL || c == FR_KILL_RECOVERY || c == FR_DEADLOCK) {
        fr_others_wait(c, pg, x);
    } else {
        tdist_status_t st = tdist_all_reduce(pg, x, x, 2, TDIST_F32, TDIST_SUM, NULL, NULL);
        printf("fr: rank %d: %s: %s\n", R, tdist_status_str(st), tdist_last_error());
        ASSERT_TRUE(st != TDIST_OK);
        if (R == 0 && c == FR_STOP) {
            fr_wait_dump(fr_dir(), 0);
            fr_wait_dump(fr_dir(), 1);
            fr_wait_stopped(pids[2]);
            fr_analyze(fr_dir());
            ASSERT_EQ(kill(pids[2], SIGCONT), 0);
        }
    }
    tdist_pg_destroy(pg);
}

/* ----------------------------------------------------------------- p2p */

static void run_p2p(tdist_world_t *w)
{
    tdist_pg_t *pg = make_pg(w, "mpi", 30000);
    enum { K = 10, C = 1000 };
    static double sbuf[K][C], rbuf[K][C];
    tdist_work_t *rw[K], *sw[K];
    int to = (R + 1) % N, from = (R + N - 1) % N;
    for (int k = 0; k < K; k++) ASSERT_OK(tdist_recv(pg, rbuf[k], C, TDIST_F64, from, NULL, &rw[k]));
    for (int k = 0; k < K; k++) {
        for (int i = 0; i < C; i++) sbuf[k][i] = R * 1e6 + k * 1e3 + i;
        ASSERT_OK(tdist_send(pg, sbuf[k], C, TDIST_F64, to, NULL, &sw[k]));
    }
    /* a collective runs while p2p is pending */
    ASSERT_OK(tdist_barrier(pg, NULL, NULL));
    for (int k = 0; k < K; k++) {
        ASSERT_OK(tdist_work_wait(rw[k], 30000));
        ASSERT_OK(tdist_work_wait(sw[k], 30000));
        tdist_work_free(rw[k]);
        tdist_work_free(sw[k]);
        for (int i = 0; i < C; i++) ASSERT_TRUE(rbuf[k][i] == from * 1e6 + k * 1e3 + i);
    }
    /* header mismatch: rank 1 sends 3 elements, rank 0 expects 4 */
    if (R == 0) {
        int32_t r[4];
        tdist_status_t st = tdist_recv(pg, r, 4, TDIST_I32, 1, NULL, NULL);
        printf("p2p mismatch: %s: %s\n", tdist_status_str(st), tdist_last_error());
        ASSERT_STATUS(st, TDIST_ERR_MISMATCH);
        ASSERT_CONTAINS(tdist_last_error(), "p2p mismatch: rank 1 sent #1 send(i32, 3) for this recv");
    } else if (R == 1) {
        int32_t s[3] = {1, 2, 3};
        ASSERT_OK(tdist_send(pg, s, 3, TDIST_I32, 0, NULL, NULL));
    }
    /* collectives still work (p2p errors are sticky for p2p only) */
    ASSERT_OK(tdist_barrier(pg, NULL, NULL));
    tdist_pg_destroy(pg);
}

/* ----------------------------------------------------------------- ddp */

#define DIN 8
#define HID 16
#define DOUT 4
#define BATCH 24

typedef struct model {
    float w1[HID * DIN], b1[HID], w2[DOUT * HID], b2[DOUT];
    float g[4][HID * DIN];
} model_t;

static uint64_t rs;
static float frand(void)
{
    rs = rs * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((double)(rs >> 40) / (double)(1ULL << 24)) * 2.0f - 1.0f;
}

/* forward + backward over rows [r0, r1), loss = mean over the batch of
 * |y - t|^2 / 2; grad_ready for b2, w2, b1, w1 (reverse order) */
static void fwd_bwd(model_t *m, const float *x, const float *t, int r0, int r1, tdist_ddp_t *ddp)
{
    float *gw1 = m->g[0], *gb1 = m->g[1], *gw2 = m->g[2], *gb2 = m->g[3];
    memset(m->g, 0, sizeof m->g);
    float h[BATCH][HID], d[BATCH][DOUT];
    for (int s = r0; s < r1; s++) {
        for (int j = 0; j < HID; j++) {
            float a = m->b1[j];
            for (int k = 0; k < DIN; k++) a += m->w1[j * DIN + k] * x[s * DIN + k];
            h[s][j] = a > 0 ? a : 0;
        }
        for (int o = 0; o < DOUT; o++) {
            float a = m->b2[o];
            for (int j = 0; j < HID; j++) a += m->w2[o * HID + j] * h[s][j];
            d[s][o] = (a - t[s * DOUT + o]) / (float)(r1 - r0);
        }
    }
    for (int s = r0; s < r1; s++)
        for (int o = 0; o < DOUT; o++) {
            gb2[o] += d[s][o];
            for (int j = 0; j < HID; j++) gw2[o * HID + j] += d[s][o] * h[s][j];
        }
    ASSERT_OK(tdist_ddp_grad_ready(ddp, 3));
    ASSERT_OK(tdist_ddp_grad_ready(ddp, 2));
    for (int s = r0; s < r1; s++)
        for (int j = 0; j < HID; j++) {
            if (h[s][j] <= 0) continue;
            float dh = 0;
            for (int o = 0; o < DOUT; o++) dh += d[s][o] * m->w2[o * HID + j];
            gb1[j] += dh;
            for (int k = 0; k < DIN; k++) gw1[j * DIN + k] += dh * x[s * DIN + k];
        }
    ASSERT_OK(tdist_ddp_grad_ready(ddp, 1));
    ASSERT_OK(tdist_ddp_grad_ready(ddp, 0));
}

/* join: under a Join, rank r has steps + r steps (uneven inputs); bf16:
 * with the bf16 compression hook (tdist_compress_hook, wire bf16) */
static void train(tdist_pg_t *pg, model_t *m, int steps, bool join, bool bf16)
{
    rs = 1000 + (uint64_t)R; /* different on every rank: create syncs from rank 0 */
    memset(m, 0, sizeof *m);
    for (int i = 0; i < HID * DIN; i++) m->w1[i] = 0.5f * frand();
    for (int i = 0; i < HID; i++) m->b1[i] = 0.1f * frand();
    for (int i = 0; i < DOUT * HID; i++) m->w2[i] = 0.5f * frand();
    for (int i = 0; i < DOUT; i++) m->b2[i] = 0.1f * frand();
    tdist_ddp_param_t p[4] = {
        {m->w1, m->g[0], HID * DIN, TDIST_F32, "fc1.weight"},
        {m->b1, m->g[1], HID, TDIST_F32, "fc1.bias"},
        {m->w2, m->g[2], DOUT * HID, TDIST_F32, "fc2.weight"},
        {m->b2, m->g[3], DOUT, TDIST_F32, "fc2.bias"},
    };
    tdist_ddp_opts_t o;
    tdist_ddp_opts_init(&o);
    o.first_bucket_bytes = 64; /* several buckets */
    o.bucket_cap_bytes = 256;
    tdist_ddp_t *ddp = NULL;
    ASSERT_OK(tdist_ddp_create(pg, p, 4, NULL, 0, &o, &ddp));
    tdist_compress_t *hook = NULL;
    if (bf16) {
        tdist_compress_opts_t co;
        tdist_compress_opts_init(&co);
        co.wire = TDIST_BF16;
        ASSERT_OK(tdist_compress_hook_create(&co, &hook));
        ASSERT_OK(tdist_compress_register(ddp, hook));
    }
    int r0 = R * BATCH / N, r1 = (R + 1) * BATCH / N;
    tdist_joinable_t j;
    tdist_join_t *jn = NULL;
    if (join) {
        ASSERT_OK(tdist_ddp_joinable(ddp, &j));
        ASSERT_OK(tdist_join_begin(&j, 1, NULL, &jn));
        steps += R;
    }
    for (int step = 0; step < steps; step++) {
        float x[BATCH * DIN], t[BATCH * DOUT];
        rs = (uint64_t)step * 104729 + 17;
        for (int i = 0; i < BATCH * DIN; i++) x[i] = frand();
        for (int i = 0; i < BATCH * DOUT; i++) t[i] = frand();
        ASSERT_OK(tdist_ddp_forward_begin(ddp));
        fwd_bwd(m, x, t, r0, r1, ddp);
        ASSERT_OK(tdist_ddp_backward_end(ddp));
        float *ps[4] = {m->w1, m->b1, m->w2, m->b2};
        for (int i = 0; i < 4; i++)
            for (size_t k = 0; k < p[i].count; k++) ps[i][k] -= 0.1f * m->g[i][k];
    }
    if (jn) ASSERT_OK(tdist_join_end(jn)); /* shadow, then the last joiner's model */
    tdist_ddp_destroy(ddp);
    tdist_compress_destroy(hook);
}

static const size_t model_count[4] = {HID * DIN, HID, DOUT * HID, DOUT};

/* The model's four parameter arrays, in create() order. */
static void model_params(const model_t *m, const float *p[4])
{
    p[0] = m->w1;
    p[1] = m->b1;
    p[2] = m->w2;
    p[3] = m->b2;
}

static void run_ddp(tdist_world_t *w, bool join)
{
    static model_t a, b;
    tdist_pg_t *nat = make_pg(w, "native", 60000);
    train(nat, &a, 5, join, false);
    tdist_pg_destroy(nat);
    tdist_pg_t *mpi = make_pg(w, "mpi", 60000);
    train(mpi, &b, 5, join, false);
    tdist_pg_destroy(mpi);
    const float *pa[4], *pb[4];
    model_params(&a, pa);
    model_params(&b, pb);
    const size_t *cnt = model_count;
    double worst = 0;
    size_t differ = 0;
    for (int i = 0; i < 4; i++) {
        double mx = 0;
        for (size_t j = 0; j < cnt[i]; j++) mx = fmax(mx, fabs(pa[i][j]));
        for (size_t j = 0; j < cnt[i]; j++) {
            double d = fabs((double)pa[i][j] - (double)pb[i][j]);
            if (pa[i][j] != pb[i][j]) differ++;
            worst = fmax(worst, d / (mx > 0 ? mx : 1));
            if (d > 1e-6 * mx) FAIL("param %d[%zu]: native %.9g, mpi %.9g", i, j, (double)pa[i][j], (double)pb[i][j]);
        }
    }
    /* and every rank holds the same parameters */
    float mine = b.w1[5], all[64];
    tdist_pg_t *pg = make_pg(w, "mpi", 60000);
    ASSERT_OK(tdist_all_gather(pg, &mine, all, 1, TDIST_F32, NULL, NULL));
    for (int r = 0; r < N; r++) ASSERT_TRUE(all[r] == mine);
    tdist_pg_destroy(pg);
    if (R == 0)
        printf("ddp%s: %d ranks, 5 steps: %zu of %zu parameters differ in bits, worst relative "
               "difference %.3g\n",
               join ? " under Join (rank r has 5 + r steps)" : "", N, differ, (size_t)(HID * DIN + HID + DOUT * HID + DOUT), worst);
}

/* ----------------------------------------------------------------- zero */

#define ZP 3
static const size_t zero_counts[ZP] = {333, 1000, 7};

/* 4 steps of DDP + ZeRO(Adam) on pg: overlapped (several buckets) or not
 * (FLAT). p: the parameters, concatenated. */
static void zero_train(tdist_pg_t *pg, float *p, bool overlap)
{
    static float g[1340];
    tdist_optim_param_t op[ZP];
    tdist_ddp_param_t dp[ZP];
    size_t off = 0;
    for (int j = 0; j < ZP; j++) {
        for (size_t e = 0; e < zero_counts[j]; e++) p[off + e] = (float)(0.1 * cos((double)(off + e)));
        op[j] = (tdist_optim_param_t){p + off, g + off, zero_counts[j], NULL};
        dp[j] = (tdist_ddp_param_t){p + off, g + off, zero_counts[j], TDIST_F32, NULL};
        off += zero_counts[j];
    }
    tdist_zero_opts_t zo;
    tdist_zero_opts_init(&zo);
    zo.kind = TDIST_OPTIM_ADAM;
    zo.adam.lr = 0.01;
    if (!overlap) zo.partition = TDIST_ZERO_FLAT;
    tdist_zero_t *z = NULL;
    ASSERT_OK(tdist_zero_create(pg, op, ZP, &zo, &z));
    tdist_ddp_opts_t o;
    tdist_ddp_opts_init(&o);
    o.bucket_cap_bytes = o.first_bucket_bytes = 1024;
    tdist_ddp_t *ddp = NULL;
    ASSERT_OK(tdist_ddp_create(pg, dp, ZP, NULL, 0, &o, &ddp));
    if (overlap) ASSERT_OK(tdist_zero_register_overlap(z, ddp));
    for (int k = 0; k < 4; k++) {
        ASSERT_OK(tdist_ddp_forward_begin(ddp));
        for (size_t i = 0; i < off; i++) g[i] = (float)(0.02 * sin(0.37 * (double)i + 1.3 * R + 0.7 * k));
        for (int j = ZP; j-- > 0;) ASSERT_OK(tdist_ddp_grad_ready(ddp, (size_t)j));
        ASSERT_OK(tdist_ddp_backward_end(ddp));
        ASSERT_OK(tdist_zero_step(z));
    }
    tdist_ddp_destroy(ddp);
    tdist_zero_destroy(z);
}

static void run_zero(tdist_world_t *w)
{
    static float a[1340], b[1340];
    for (int ov = 0; ov < 2; ov++) {
        tdist_pg_t *nat = make_pg(w, "native", 60000);
        zero_train(nat, a, ov == 1);
        tdist_pg_destroy(nat);
        tdist_pg_t *mpi = make_pg(w, "mpi", 60000);
        zero_train(mpi, b, ov == 1);
        tdist_pg_destroy(mpi);
        size_t differ = 0;
        for (size_t i = 0; i < 1340; i++) {
            if (a[i] != b[i]) differ++;
            if (fabs((double)a[i] - (double)b[i]) > 1e-5 * (fabs((double)a[i]) + 0.01))
                FAIL("zero%s: element %zu: native %.9g, mpi %.9g", ov ? " overlap" : "", i,
                     (double)a[i], (double)b[i]);
        }
        if (N == 2 && differ) FAIL("zero%s: 2 ranks, %zu elements differ in bits", ov ? " overlap" : "", differ);
        if (R == 0) printf("zero%s: %d ranks, 4 steps: %zu of 1340 parameters differ in bits\n",
                           ov ? " with the overlap hook" : " (FLAT)", N, differ);
    }
}

/* The bf16 compression hook on the MPI backend against the native one
 * (bf16 all_reduce of the 16-bit buckets): with 2 ranks a sum has one
 * order, so the parameters must be equal bit for bit; with more, the
 * backends may add in different orders (each addition rounds to bf16), so
 * within 2^-7 of the largest parameter. The hook must have acted: the
 * parameters differ from plain f32 DDP's. */
static void run_ddp_bf16(tdist_world_t *w)
{
    static model_t a, b, f32;
    tdist_pg_t *nat = make_pg(w, "native", 60000);
    train(nat, &a, 5, false, true);
    train(nat, &f32, 5, false, false);
    tdist_pg_destroy(nat);
    tdist_pg_t *mpi = make_pg(w, "mpi", 60000);
    train(mpi, &b, 5, false, true);
    tdist_pg_destroy(mpi);
    const float *pa[4], *pb[4], *pf[4];
    model_params(&a, pa);
    model_params(&b, pb);
    model_params(&f32, pf);
    const size_t *cnt = model_count;
    size_t differ = 0, from_f32 = 0;
    for (int i = 0; i < 4; i++) {
        double mx = 0;
        for (size_t j = 0; j < cnt[i]; j++) mx = fmax(mx, fabs(pa[i][j]));
        for (size_t j = 0; j < cnt[i]; j++) {
            double d = fabs((double)pa[i][j] - (double)pb[i][j]);
            differ += pa[i][j] != pb[i][j];
            from_f32 += pa[i][j] != pf[i][j];
            if (N == 2 ? pa[i][j] != pb[i][j] : d > 0x1p-7 * mx)
                FAIL("bf16 hook, param %d[%zu]: native %.9g, mpi %.9g", i, j, (double)pa[i][j],
                     (double)pb[i][j]);
        }
    }
    if (from_f32 == 0) FAIL("the bf16 hook changed no parameter against f32 DDP: did it run?");
    if (R == 0)
        printf("ddp bf16 hook: %d ranks, 5 steps: %zu parameters differ between the backends, "
               "%zu from f32 DDP\n",
               N, differ, from_f32);
}

/* -------------------------------------------------------------- envinit */

static void run_envinit(void)
{
    /* tdist_init(NULL) = env:// with TDIST_BACKEND=mpi under mpirun */
    tdist_world_t *w = NULL;
    ASSERT_OK(tdist_init(NULL, NULL, &w));
    ASSERT_EQ(tdist_world_size(w), N);
    ASSERT_EQ(tdist_world_rank(w), R);
    tdist_pg_t *pg = NULL;
    ASSERT_OK(tdist_pg_create_world(w, NULL, &pg)); /* backend from TDIST_BACKEND */
    int64_t v = R + 1, s = 0;
    ASSERT_OK(tdist_all_reduce(pg, &v, &s, 1, TDIST_I64, TDIST_SUM, NULL, NULL));
    ASSERT_EQ(s, (int64_t)N * (N + 1) / 2);
    /* a bad backend name is refused */
    tdist_pg_opts_t o;
    tdist_pg_opts_init(&o);
    o.backend = "nccl";
    tdist_pg_t *bad = NULL;
    ASSERT_STATUS(tdist_pg_create_world(w, &o, &bad), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "unknown backend opts.backend=\"nccl\"");
    tdist_pg_destroy(pg);
    tdist_world_destroy(w);
}

/* ---------------------------------------------------------------- tune */

/* The MCA variable as the application sees it through MPI_T (-1: not an
 * Open MPI with libnbc). */
static int nbc_alg(void)
{
    int prov = 0, idx = -1, n = 0, v = -1;
    ASSERT_EQ(MPI_T_init_thread(MPI_THREAD_MULTIPLE, &prov), MPI_SUCCESS);
    MPI_T_cvar_handle h;
    if (MPI_T_cvar_get_index("coll_libnbc_iallreduce_algorithm", &idx) == MPI_SUCCESS &&
        MPI_T_cvar_handle_alloc(idx, NULL, &h, &n) == MPI_SUCCESS) {
        ASSERT_EQ(MPI_T_cvar_read(h, &v), MPI_SUCCESS);
        MPI_T_cvar_handle_free(&h);
    }
    MPI_T_finalize();
    return v;
}

static void run_tune(tdist_world_t *w)
{
    const char *e = getenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm");
    int want = e ? atoi(e) : 0;
    char ver[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(ver, &len);
    if (!strstr(ver, "Open MPI")) {
        if (R == 0) printf("tune: not Open MPI, nothing to check\n");
        return;
    }
    ASSERT_EQ(nbc_alg(), want);
    tdist_pg_t *pg = make_pg(w, "mpi", 30000);
    /* sizes on both sides of the switch-over (4 KiB on 2 ranks, 512 KiB on
     * 3), in place and not, coalesced */
    static const size_t counts[] = {1000, 16384, 1 << 18};
    for (size_t ci = 0; ci < 3; ci++) {
        size_t c = counts[ci];
        float *a = xmalloc(c * sizeof(float)), *b = xmalloc(c * sizeof(float));
        for (size_t i = 0; i < c; i++) a[i] = (float)((R + 1) * (int)(i % 97));
        ASSERT_OK(tdist_all_reduce(pg, a, b, c, TDIST_F32, TDIST_SUM, NULL, NULL));
        ASSERT_OK(tdist_all_reduce(pg, a, a, c, TDIST_F32, TDIST_SUM, NULL, NULL));
        float *bufs[1] = {a};
        ASSERT_OK(tdist_all_reduce_coalesced(pg, (void **)bufs, &c, 1, TDIST_F32, TDIST_SUM, NULL,
                                             NULL));
        float k = (float)(N * (N + 1) / 2);
        for (size_t i = 0; i < c; i++) {
            float want1 = k * (float)(i % 97);
            if (b[i] != want1 || a[i] != want1 * (float)N)
                FAIL("tune: count %zu element %zu: %g / %g, want %g / %g", c, i, b[i], a[i], want1,
                     want1 * (float)N);
        }
        ASSERT_EQ(nbc_alg(), want); /* the application sees what it had */
        free(a);
        free(b);
    }
    tdist_pg_destroy(pg);
    if (R == 0) printf("tune: coll_libnbc_iallreduce_algorithm stayed %d\n", want);
}

/* --------------------------------------------------------------- death */

static void run_death(tdist_world_t *w)
{
    tdist_pg_t *pg = make_pg(w, "mpi", 5000);
    size_t C = 1 << 20;
    float *buf = xmalloc(C * sizeof(float));
    for (size_t i = 0; i < C; i++) buf[i] = 1.0f;
    double t0 = now_ms();
    for (int it = 0; it < 100000; it++) {
        if (R == 1 && it == 20) {
            fprintf(stderr, "death: rank 1 raises SIGKILL at iteration %d (%.0f ms)\n", it,
                    now_ms() - t0);
            fflush(stderr);
            raise(SIGKILL);
        }
        double t1 = now_ms();
        tdist_status_t st = tdist_all_reduce(pg, buf, buf, C, TDIST_F32, TDIST_MAX, NULL, NULL);
        if (st != TDIST_OK) {
            fprintf(stderr, "death: rank %d: all_reduce %d returned %s after %.0f ms: %s\n", R, it,
                    tdist_status_str(st), now_ms() - t1, tdist_last_error());
            fflush(stderr);
            break;
        }
    }
    tdist_pg_destroy(pg);
    fprintf(stderr, "death: rank %d: pg destroyed\n", R);
    fflush(stderr);
    free(buf);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: mpirun -np N %s matrix|sub|mismatch|timeout|frhang|frskip|frdiff|frstop|frkill|frkillrec|frdeadlock|monitored|p2p|ddp|ddpjoin|ddpbf16|zero|envinit|death|tune\n", argv[0]);
        return 2;
    }
    const char *what = argv[1];
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (strcmp(what, "envinit") == 0) {
        /* the launcher's own idea of rank and size: Open MPI's mpirun, else
         * MPICH's Hydra (mpiexec.mpich) */
        const char *s = getenv("OMPI_COMM_WORLD_SIZE"), *r = getenv("OMPI_COMM_WORLD_RANK");
        if (!s || !r) {
            s = getenv("PMI_SIZE");
            r = getenv("PMI_RANK");
        }
        ASSERT_TRUE(s && r);
        N = atoi(s);
        R = atoi(r);
        tdist_test_rank = R;
        run_envinit();
        if (R == 0) printf("MPI_PROG OK %s\n", what);
        return 0;
    }
    tdist_world_t *w = NULL;
    ASSERT_OK(tdist_init("mpi://", NULL, &w));
    R = tdist_world_rank(w);
    N = tdist_world_size(w);
    tdist_test_rank = R;
    if (strcmp(what, "matrix") == 0) run_matrix(w);
    else if (strcmp(what, "sub") == 0) run_sub(w);
    else if (strcmp(what, "mismatch") == 0) run_mismatch(w);
    else if (strcmp(what, "timeout") == 0) run_timeout(w);
    else if (strcmp(what, "frhang") == 0) run_frhang(w);
    else if (strcmp(what, "frskip") == 0) run_frcase(w, FR_SKIP);
    else if (strcmp(what, "frdiff") == 0) run_frcase(w, FR_DIFFERENT);
    else if (strcmp(what, "frstop") == 0) run_frcase(w, FR_STOP);
    else if (strcmp(what, "frkill") == 0) run_frcase(w, FR_KILL);
    else if (strcmp(what, "frkillrec") == 0) run_frcase(w, FR_KILL_RECOVERY);
    else if (strcmp(what, "frdeadlock") == 0) run_frcase(w, FR_DEADLOCK);
    else if (strcmp(what, "monitored") == 0) run_monitored(w);
    else if (strcmp(what, "p2p") == 0) run_p2p(w);
    else if (strcmp(what, "ddp") == 0) run_ddp(w, false);
    else if (strcmp(what, "ddpjoin") == 0) run_ddp(w, true);
    else if (strcmp(what, "zero") == 0) run_zero(w);
    else if (strcmp(what, "ddpbf16") == 0) run_ddp_bf16(w);
    else if (strcmp(what, "death") == 0) run_death(w);
    else if (strcmp(what, "tune") == 0) run_tune(w);
    else FAIL("unknown scenario %s", what);
    tdist_world_destroy(w);
    if (R == 0) printf("MPI_PROG OK %s\n", what);
    return 0;
}
