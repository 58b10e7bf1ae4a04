/* tests/coll/test_coll.c — the collective algorithms of coll/ on real
 * processes over the TCP mesh (and, in the __shm twins, over shared memory,
 * where all_reduce auto, reduce and broadcast use the shared-memory
 * collectives of shm_coll.c): every function x dtype x valid reduce op x
 * counts {0, 1, 7, 1000, 65537} at world sizes 1..8, each forced
 * all_reduce algorithm, in place / out of place / unaligned buffers,
 * bit-identical results on every rank for inexact floats, a 32 MiB
 * all_reduce, and a peer killed during an all_reduce.
 *
 * Every rank generates every rank's input from a seeded formula, so each
 * rank computes the reference locally (reductions through tdist_reduce in
 * rank order; inputs are small integers so float sums and products are
 * exact in any order). */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "coll/coll.h"
#include "coll/coll_internal.h"
#include "gen.h"
#include "mesh.h"
#include "tbuf.h"

#define TAG 0x636f6c6c74657374ull

/* A test mesh and the collective context over it. */
typedef struct coll_rank {
    tp_rank_t m;
    tdist__coll_ctx_t ctx;
    tdist__coll_scratch_t scratch;
} coll_rank_t;

/* Wait until every rank in [0, upto) has set "<name>/<rank>". */
static void store_barrier(coll_rank_t *t, const char *name, int upto) { mesh_barrier(&t->m, name, upto); }

/* Join, connect a mesh (TCP unless TDIST_TRANSPORT=shm: ctest runs every
 * coll test on both) and set up the context. */
static void mesh_up(coll_rank_t *t, int rank, int n)
{
    memset(t, 0, sizeof *t);
    const char *tr = getenv("TDIST_TRANSPORT");
    tdist__tp_kind_t kind = tr && strcmp(tr, "shm") == 0 ? TDIST__TP_SHM : TDIST__TP_TCP;
    mesh_open(&t->m, kind, rank, n, "127.0.0.1", TAG);
    tp_connect(&t->m);
    t->ctx.tp = t->m.tp;
    t->ctx.rank = rank;
    t->ctx.size = n;
    t->ctx.deadline_ms = deadline_in(60000);
    /* From 4 ranks on, a scratch kept between calls, as a group's: the
     * algorithms' large temporaries are not mapped and faulted in again
     * on every call. Fewer ranks keep the allocation per call that a
     * context without one (a 16-bit wire's inner all_reduce) takes. */
    if (n >= 4) t->ctx.scratch = &t->scratch;
    /* On shared memory the context gets the shared-memory collectives:
     * all_reduce auto, reduce and broadcast then run through them. */
    if (kind == TDIST__TP_SHM && n > 1) ASSERT_OK(tdist__shmc_create(t->m.tp, rank, n, &t->ctx.shm));
}

static void mesh_close(coll_rank_t *t)
{
    tdist__shmc_destroy(t->ctx.shm);
    t->ctx.shm = NULL;
    tdist__coll_scratch_release(&t->scratch);
    tp_close(&t->m);
}

#define PREMUL 0.5

static void expect_eq(const void *got, const void *want, size_t count, tdist_dtype_t dt,
                      const char *what, int n, tdist_redop_t op, size_t mode)
{
    size_t es = tdist_dtype_size(dt);
    if (count == 0 || memcmp(got, want, count * es) == 0) return;
    for (size_t i = 0; i < count; i++)
        if (memcmp((const uint8_t *)got + i * es, (const uint8_t *)want + i * es, es) != 0)
            FAIL("%s size %d %s %s count %zu mode %zu: element %zu differs", what, n,
                 tdist_dtype_name(dt), tdist_redop_name(op), count, mode, i);
}


/* A buffer of `bytes` with an offset: mode 2 is unaligned by one byte. */
typedef struct mbuf {
    uint8_t *base, *p;
} mbuf_t;

static mbuf_t mb_alloc(size_t bytes, size_t mode)
{
    mbuf_t m;
    m.base = tbuf_alloc(bytes + 16);
    ASSERT_TRUE(m.base != NULL);
    memset(m.base, 0xA5, bytes + 16);
    m.p = m.base + (mode == 2 ? 1 : 0);
    return m;
}

/* --------------------------------------------------------- the matrix */

static const size_t counts_all[] = {0, 1, 7, 1000, 65537};

/* all_reduce (auto + ring + rd + direct), reduce, reduce_scatter for one
 * dtype/op/count. mode: 0 out of place, 1 in place, 2 unaligned. */
static void run_reductions(coll_rank_t *t, tdist_dtype_t dt, tdist_redop_t op, size_t count,
                           uint64_t seed, size_t mode, bool all_algos)
{
    const tdist__coll_ctx_t *c = &t->ctx;
    int n = t->m.n, r = t->m.rank;
    size_t es = tdist_dtype_size(dt), bytes = count * es;
    uint8_t *want = tbuf_alloc(bytes ? bytes : 1), *mine = tbuf_alloc(bytes ? bytes : 1);
    ASSERT_TRUE(want && mine);
    tgen_reference(want, count, dt, op, n, seed, PREMUL);
    tgen_fill(mine, count, dt, op, r, seed);

    /* all_reduce */
    static const tdist__ar_algo_t algos[] = {TDIST__AR_AUTO, TDIST__AR_RING, TDIST__AR_RD,
                                             TDIST__AR_DIRECT};
    for (size_t a = 0; a < (all_algos ? 4u : 1u); a++) {
        mbuf_t s = mb_alloc(bytes, mode), d = mb_alloc(bytes, mode);
        memcpy(s.p, mine, bytes);
        void *out = mode == 1 ? s.p : d.p;
        ASSERT_OK(tdist__coll_all_reduce(c, s.p, out, count, dt, op, PREMUL, algos[a]));
        expect_eq(out, want, count, dt, algos[a] == TDIST__AR_AUTO ? "all_reduce auto"
                                       : algos[a] == TDIST__AR_RING ? "all_reduce ring"
                                       : algos[a] == TDIST__AR_RD ? "all_reduce rd"
                                                                   : "all_reduce direct",
                  n, op, mode);
        if (mode != 1) ASSERT_MEMEQ(s.p, mine, bytes); /* sendbuf untouched */
        tbuf_free(s.base);
        tbuf_free(d.base);
    }

    /* reduce to a rotating root */
    {
        int root = (int)(seed % (uint64_t)n);
        mbuf_t s = mb_alloc(bytes, mode), d = mb_alloc(bytes, mode);
        memcpy(s.p, mine, bytes);
        void *out = mode == 1 ? s.p : d.p;
        ASSERT_OK(tdist__coll_reduce(c, s.p, r == root ? out : NULL, count, dt, op, PREMUL, root));
        if (r == root) expect_eq(out, want, count, dt, "reduce", n, op, mode);
        else ASSERT_MEMEQ(s.p, mine, bytes);
        tbuf_free(s.base);
        tbuf_free(d.base);
    }

    /* reduce_scatter: recvcount = count, input size * count */
    {
        size_t tot = bytes * (size_t)n;
        /* this rank's block of the reduction only: the others' are theirs */
        uint8_t *rwant = tbuf_alloc(bytes ? bytes : 1), *allmine = tbuf_alloc(tot ? tot : 1);
        ASSERT_TRUE(rwant && allmine);
        tgen_reference_part(rwant, (size_t)r * count, count, dt, op, n, seed + 1, PREMUL);
        tgen_fill(allmine, count * (size_t)n, dt, op, r, seed + 1);
        mbuf_t s = mb_alloc(tot, mode), d = mb_alloc(bytes, mode);
        memcpy(s.p, allmine, tot);
        void *out = mode == 1 ? s.p : d.p;
        ASSERT_OK(tdist__coll_reduce_scatter(c, s.p, out, count, dt, op, PREMUL));
        expect_eq(out, rwant, count, dt, "reduce_scatter", n, op, mode);
        if (mode != 1) ASSERT_MEMEQ(s.p, allmine, tot);
        /* the selection's reduce_scatter (without a group's line: staged
         * on shared memory, direct over TCP), out of place, unaligned, and
         * in place both as this rank's own block and over the input's
         * start (up to 5 ranks: 8 on 2 CPUs take too long) */
        for (int v = 0; n > 1 && n <= 5 && v < (mode == 1 ? 2 : 1); v++) {
            memcpy(s.p, allmine, tot);
            memset(d.p, 0x5a, bytes);
            void *o = mode != 1 ? d.p : v == 0 ? s.p + (size_t)r * bytes : s.p;
            tdist__coll_args_t a = {.op = TDIST__OP_REDUCE_SCATTER, .sendbuf = s.p, .recvbuf = o,
                                    .count = count, .dtype = dt, .redop = op, .premul = PREMUL,
                                    .root = -1};
            ASSERT_OK(tdist__coll_run(c, &a, NULL));
            expect_eq(o, rwant, count, dt,
                      v ? "reduce_scatter selected over the input" : "reduce_scatter selected", n, op,
                      mode);
            if (mode != 1) ASSERT_MEMEQ(s.p, allmine, tot);
        }
        tbuf_free(s.base);
        tbuf_free(d.base);
        tbuf_free(rwant);
        tbuf_free(allmine);
    }
    tbuf_free(want);
    tbuf_free(mine);
}

/* broadcast, all_gatherv, gather, scatter, all_to_allv for one dtype/count. */
static void run_data_movement(coll_rank_t *t, tdist_dtype_t dt, size_t count, uint64_t seed,
                              size_t mode)
{
    const tdist__coll_ctx_t *c = &t->ctx;
    int n = t->m.n, r = t->m.rank, root = (int)(seed % (uint64_t)n);
    size_t es = tdist_dtype_size(dt), bytes = count * es;

    /* broadcast */
    {
        mbuf_t b = mb_alloc(bytes, mode);
        uint8_t *want = tbuf_alloc(bytes ? bytes : 1);
        tgen_fill(want, count, dt, TDIST_SUM, root, seed);
        if (r == root) memcpy(b.p, want, bytes);
        ASSERT_OK(tdist__coll_broadcast(c, b.p, count, dt, root));
        expect_eq(b.p, want, count, dt, "broadcast", n, TDIST_SUM, mode);
        tbuf_free(b.base);
        tbuf_free(want);
    }

    /* all_gatherv with uneven counts (some zero) */
    {
        size_t cnt[MAXR], off[MAXR], tot = 0;
        for (int p = 0; p < n; p++) {
            cnt[p] = p % 3 == 1 ? count / 2 : count + (size_t)(p % 2);
            off[p] = tot;
            tot += cnt[p];
        }
        uint8_t *want = tbuf_alloc(tot * es + 1);
        for (int p = 0; p < n; p++) tgen_fill(want + off[p] * es, cnt[p], dt, TDIST_SUM, p, seed + 2);
        mbuf_t d = mb_alloc(tot * es, mode), s = mb_alloc(cnt[r] * es, mode);
        void *src;
        if (mode == 1) {
            src = d.p + off[r] * es;
            memcpy(src, want + off[r] * es, cnt[r] * es);
        } else {
            src = s.p;
            memcpy(s.p, want + off[r] * es, cnt[r] * es);
        }
        ASSERT_OK(tdist__coll_all_gatherv(c, src, d.p, cnt, dt));
        expect_eq(d.p, want, tot, dt, "all_gatherv", n, TDIST_SUM, mode);
        tbuf_free(want);
        tbuf_free(d.base);
        tbuf_free(s.base);
    }

    /* gather + scatter (equal counts) */
    {
        size_t tot = bytes * (size_t)n;
        uint8_t *want = tbuf_alloc(tot ? tot : 1);
        for (int p = 0; p < n; p++) tgen_fill(want + (size_t)p * bytes, count, dt, TDIST_SUM, p, seed + 3);
        mbuf_t s = mb_alloc(bytes, mode), d = mb_alloc(tot, mode);
        void *src = s.p;
        if (mode == 1 && r == root) src = d.p + (size_t)r * bytes;
        memcpy(src, want + (size_t)r * bytes, bytes);
        ASSERT_OK(tdist__coll_gather(c, src, r == root ? d.p : NULL, count, dt, root));
        if (r == root) expect_eq(d.p, want, count * (size_t)n, dt, "gather", n, TDIST_SUM, mode);
        tbuf_free(s.base);
        tbuf_free(d.base);

        mbuf_t ss = mb_alloc(tot, mode), dd = mb_alloc(bytes, mode);
        if (r == root) memcpy(ss.p, want, tot);
        void *dst = (mode == 1 && r == root) ? ss.p + (size_t)r * bytes : dd.p;
        ASSERT_OK(tdist__coll_scatter(c, r == root ? ss.p : NULL, dst, count, dt, root));
        expect_eq(dst, want + (size_t)r * bytes, count, dt, "scatter", n, TDIST_SUM, mode);
        if (r == root && mode != 1) ASSERT_MEMEQ(ss.p, want, tot);
        tbuf_free(ss.base);
        tbuf_free(dd.base);
        tbuf_free(want);
    }

    /* all_to_allv: rank a sends f(a, b) elements to rank b */
#define A2A(a, b) (count == 0 ? (size_t)0 : (((a) + 2 * (b)) % 3 == 0 ? (size_t)0 : count / (size_t)n + (size_t)(((a) + (b)) % 2)))
    {
        size_t sc[MAXR], rc[MAXR], so = 0, ro = 0;
        for (int p = 0; p < n; p++) {
            sc[p] = A2A(r, p);
            rc[p] = A2A(p, r);
            so += sc[p];
            ro += rc[p];
        }
        mbuf_t s = mb_alloc(so * es, mode), d = mb_alloc(ro * es, mode);
        uint8_t *want = tbuf_alloc(ro * es + 1);
        /* block to rank p is tgen_fill(rank = r * MAXR + p) */
        size_t o = 0;
        for (int p = 0; p < n; p++) {
            tgen_fill(s.p + o * es, sc[p], dt, TDIST_SUM, r * MAXR + p, seed + 4);
            o += sc[p];
        }
        o = 0;
        for (int p = 0; p < n; p++) {
            tgen_fill(want + o * es, rc[p], dt, TDIST_SUM, p * MAXR + r, seed + 4);
            o += rc[p];
        }
        ASSERT_OK(tdist__coll_all_to_allv(c, s.p, sc, d.p, rc, dt));
        expect_eq(d.p, want, ro, dt, "all_to_allv", n, TDIST_SUM, mode);
        tbuf_free(s.base);
        tbuf_free(d.base);
        tbuf_free(want);
    }
#undef A2A
}

typedef struct matrix_arg {
    bool big; /* include count 65537 */
} matrix_arg_t;

static void matrix_body(int rank, int n, void *arg)
{
    const matrix_arg_t *m = arg;
    coll_rank_t t;
    mesh_up(&t, rank, n);
    uint64_t seed = 1;
    size_t ncounts = m->big ? 5 : 4;
    for (size_t ci = 0; ci < ncounts; ci++) {
        size_t count = counts_all[ci];
        for (int dt = 0; dt < TDIST_DTYPE_COUNT; dt++) {
            for (int op = 0; op < TDIST_REDOP_COUNT; op++) {
                if (!tgen_op_valid((tdist_redop_t)op, (tdist_dtype_t)dt)) continue;
                /* the largest count: every algorithm for the ops that
                 * matter most, auto for the rest (runtime) */
                bool all_algos = count < 65537 || op == TDIST_SUM || op == TDIST_AVG;
                run_reductions(&t, (tdist_dtype_t)dt, (tdist_redop_t)op, count, seed,
                               seed % 3, all_algos);
                seed++;
            }
            for (size_t mode = 0; mode < 3; mode++)
                run_data_movement(&t, (tdist_dtype_t)dt, count, seed++, mode);
            ASSERT_OK(tdist__coll_barrier(&t.ctx));
        }
    }
    mesh_close(&t);
}

static void run_matrix(int n)
{
    matrix_arg_t a = {.big = true};
    tdist_test_run_ranks(n, matrix_body, &a);
}

TEST(coll_matrix_1, 30) { run_matrix(1); }
TEST(coll_matrix_2, 40) { run_matrix(2); }
TEST(coll_matrix_3, 40) { run_matrix(3); }
TEST(coll_matrix_4, 50) { run_matrix(4); }
TEST(coll_matrix_5, 60) { run_matrix(5); }
TEST(coll_matrix_8, 90) { run_matrix(8); }

/* Sizes 6 and 7: the same matrix without the largest count. */
static void run_small_matrix(int n)
{
    matrix_arg_t a = {.big = false};
    tdist_test_run_ranks(n, matrix_body, &a);
}
TEST(coll_matrix_6_7_small, 90)
{
    run_small_matrix(6);
    run_small_matrix(7);
}

/* ------------------------------------------------ bit-identical results */

/* Inexact floats (random mantissas, mixed magnitudes, signed zeros): every
 * algorithm must give every rank the same bits. Ranks publish a hash of
 * their result through the store and compare. */
static uint64_t fnv(const void *p, size_t n)
{
    const uint8_t *b = p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

static void identical_body(int rank, int n, void *arg)
{
    (void)arg;
    coll_rank_t t;
    mesh_up(&t, rank, n);
    tdist_store_t *s = tdist_world_store(t.m.w);
    static const tdist_dtype_t dts[] = {TDIST_F32, TDIST_F64, TDIST_F16, TDIST_BF16};
    static const tdist_redop_t ops[] = {TDIST_SUM, TDIST_AVG, TDIST_MIN, TDIST_MAX,
                                        TDIST_PREMUL_SUM, TDIST_PROD};
    static const tdist__ar_algo_t algos[] = {TDIST__AR_RING, TDIST__AR_RD, TDIST__AR_DIRECT,
                                             TDIST__AR_AUTO};
    static const size_t counts[] = {1, 37, 5003, 140001}; /* the last: several shm chunks */
    /* one input and one output per algorithm for every case (a fresh
     * mapping per call spent most of the test's time in page faults) */
    size_t cap = counts[3] * sizeof(double);
    uint8_t *in = tbuf_alloc(cap), *out[4];
    for (size_t a = 0; a < 4; a++) out[a] = tbuf_alloc(cap);
    int idx = 0;
    for (size_t di = 0; di < 4; di++)
        for (size_t oi = 0; oi < 6; oi++)
            for (size_t ci = 0; ci < 4; ci++) {
                size_t count = counts[ci], es = tdist_dtype_size(dts[di]);
                for (size_t i = 0; i < count; i++) {
                    uint64_t h = tgen_mix((uint64_t)rank * 1000003u + i * 31u + ci);
                    double v = (double)(h % 100000) / 977.0 * ((h >> 20) % 2 ? 1 : -1);
                    if (oi == 5) v = 1.0 + (double)(h % 1000) / 3001.0; /* PROD: near 1 */
                    if (h % 13 == 0) v = (h >> 30) % 2 ? 0.0 : -0.0;
                    tgen_put(in, i, dts[di], v);
                }
                char key[64], val[64];
                for (size_t a = 0; a < 4; a++) {
                    memset(out[a], 0x5a, count * es);
                    ASSERT_OK(tdist__coll_all_reduce(&t.ctx, in, out[a], count, dts[di], ops[oi],
                                                     0.37, algos[a]));
                    snprintf(key, sizeof key, "id/%d/%zu/%d", idx, a, rank);
                    snprintf(val, sizeof val, "%016" PRIx64, fnv(out[a], count * es));
                    ASSERT_OK(tdist_store_set(s, key, val, strlen(val)));
                }
                /* every rank's hash of every algorithm equals this rank's */
                for (size_t a = 0; a < 4; a++) {
                    char mine[64];
                    snprintf(mine, sizeof mine, "%016" PRIx64, fnv(out[a], count * es));
                    for (int p = 0; p < n; p++) {
                        snprintf(key, sizeof key, "id/%d/%zu/%d", idx, a, p);
                        void *v;
                        size_t len;
                        const char *keys[1] = {key};
                        ASSERT_OK(tdist_store_multi_get(s, keys, 1, &v, &len));
                        if (len != strlen(mine) || memcmp(v, mine, len) != 0)
                            FAIL("%s %s count %zu algo %zu: rank %d's result differs from rank %d's",
                                 tdist_dtype_name(dts[di]), tdist_redop_name(ops[oi]), count, a, p,
                                 rank);
                        free(v);
                    }
                }
                idx++;
            }
    for (size_t a = 0; a < 4; a++) tbuf_free(out[a]);
    tbuf_free(in);
    mesh_close(&t);
}

TEST(coll_all_reduce_bit_identical, 60)
{
    tdist_test_run_ranks(3, identical_body, NULL);
    tdist_test_run_ranks(5, identical_body, NULL);
}

/* --------------------------------------------------------- 32 MiB */

static void big_body(int rank, int n, void *arg)
{
    (void)arg;
    coll_rank_t t;
    mesh_up(&t, rank, n);
    size_t count = (32u << 20) / 4;
    float *b = malloc(count * 4);
    ASSERT_TRUE(b != NULL);
    for (size_t i = 0; i < count; i++) b[i] = (float)((i * 7 + (size_t)rank * 13) % 101);
    double t0 = tdist_test_now_ms();
    ASSERT_OK(tdist__coll_all_reduce(&t.ctx, b, b, count, TDIST_F32, TDIST_SUM, 1.0, TDIST__AR_AUTO));
    double ms = tdist_test_now_ms() - t0;
    for (size_t i = 0; i < count; i++) {
        float want = 0;
        for (int r = 0; r < n; r++) want += (float)((i * 7 + (size_t)r * 13) % 101);
        if (b[i] != want) FAIL("element %zu: %g != %g", i, (double)b[i], (double)want);
    }
    /* a large reduce takes reduce-scatter + gather (root 1, out of place) */
    float *in = malloc(count * 4);
    ASSERT_TRUE(in != NULL);
    for (size_t i = 0; i < count; i++) in[i] = (float)((i * 3 + (size_t)rank) % 50);
    ASSERT_OK(tdist__coll_reduce(&t.ctx, in, rank == 1 ? b : NULL, count, TDIST_F32, TDIST_MAX, 1.0, 1));
    if (rank == 1)
        for (size_t i = 0; i < count; i++) {
            float want = 0;
            for (int r = 0; r < n; r++) want = TDIST_MAX(want, (float)((i * 3 + (size_t)r) % 50));
            if (b[i] != want) FAIL("reduce element %zu: %g != %g", i, (double)b[i], (double)want);
        }
    /* the binomial tree past its window of posted segments (2 MiB), a
     * short last segment, root 2, in place at the root */
    size_t tc = (5u << 20) / 4 + 7;
    for (size_t i = 0; i < tc; i++) in[i] = (float)((i * 5 + (size_t)rank * 3) % 61);
    ASSERT_OK(tdist__coll_reduce_tree(&t.ctx, in, rank == 2 ? in : NULL, tc, TDIST_F32, TDIST_SUM,
                                      1.0, 2));
    if (rank == 2)
        for (size_t i = 0; i < tc; i++) {
            float want = 0;
            for (int r = 0; r < n; r++) want += (float)((i * 5 + (size_t)r * 3) % 61);
            if (in[i] != want) FAIL("tree reduce element %zu: %g != %g", i, (double)in[i], (double)want);
        }
    free(in);
    /* a large broadcast takes the pipelined chain */
    for (size_t i = 0; i < count; i++) b[i] = rank == 2 ? (float)(i % 977) : -1.0f;
    ASSERT_OK(tdist__coll_broadcast(&t.ctx, b, count, TDIST_F32, 2));
    for (size_t i = 0; i < count; i++)
        if (b[i] != (float)(i % 977)) FAIL("broadcast element %zu: %g", i, (double)b[i]);
    if (rank == 0) fprintf(stderr, "32 MiB f32 all_reduce on %d ranks: %.1f ms\n", n, ms);
    free(b);
    mesh_close(&t);
}

TEST(coll_all_reduce_32mib, 60) { tdist_test_run_ranks(4, big_body, NULL); }

/* ---------------------------------------------------- forced by env */

static void env_body(int rank, int n, void *arg)
{
    (void)arg;
    coll_rank_t t;
    mesh_up(&t, rank, n);
    static const char *names[] = {"ring", "rd", "direct", "auto"};
    int32_t v[3] = {rank + 1, rank * 2, -rank}, want[3] = {0, 0, 0};
    for (int r = 0; r < n; r++) {
        want[0] += r + 1;
        want[1] += r * 2;
        want[2] -= r;
    }
    static const tdist__ar_algo_t algos[] = {TDIST__AR_RING, TDIST__AR_RD, TDIST__AR_DIRECT,
                                             TDIST__AR_AUTO};
    for (int i = 0; i < 4; i++) {
        /* read once, as a group's creation does; the context carries it */
        setenv("TDIST_ALGO_ALLREDUCE", names[i], 1);
        ASSERT_OK(tdist__coll_forced_ar_algo(&t.ctx.ar_forced));
        ASSERT_EQ(t.ctx.ar_forced, algos[i]);
        unsetenv("TDIST_ALGO_ALLREDUCE");
        int32_t out[3];
        ASSERT_OK(tdist__coll_all_reduce(&t.ctx, v, out, 3, TDIST_I32, TDIST_SUM, 1.0, TDIST__AR_AUTO));
        ASSERT_MEMEQ(out, want, sizeof want);
    }
    t.ctx.ar_forced = TDIST__AR_AUTO;
    setenv("TDIST_ALGO_ALLREDUCE", "bogus", 1);
    tdist__ar_algo_t a = TDIST__AR_RING;
    ASSERT_STATUS(tdist__coll_forced_ar_algo(&a), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "bogus");
    unsetenv("TDIST_ALGO_ALLREDUCE");
    ASSERT_OK(tdist__coll_barrier(&t.ctx));
    mesh_close(&t);
}

TEST(coll_algo_env, 30) { tdist_test_run_ranks(3, env_body, NULL); }

/* ------------------------------------------- streaming staging stores */

/* TDIST_SHM_STREAM: each rank decides for its own staging stores alone,
 * so a group where one rank streams (on), one does not (off) and one
 * measures (auto) must give every rank the
 * exact result: all_reduce, reduce and reduce_scatter on several chunks,
 * a probed size, 2- to 8-byte elements, out of place, in place and
 * unaligned; broadcast from every root. Always on shared memory. A bad
 * value fails the collective state's creation, naming the variable. */
static void stream_body(int rank, int n, void *arg)
{
    (void)arg;
    static const char *const modes[] = {"on", "off", "auto"};
    static const tdist_dtype_t dts[] = {TDIST_F32, TDIST_F64, TDIST_BF16};
    static const tdist_redop_t ops[] = {TDIST_SUM, TDIST_AVG, TDIST_MAX};
    static const size_t counts[] = {70001, 300007}; /* 2+ chunks; >= 1 MiB in f32 */
    setenv("TDIST_TRANSPORT", "shm", 1);
    setenv("TDIST_SHM_STREAM", modes[(rank + n) % 3], 1);
    coll_rank_t t;
    mesh_up(&t, rank, n);
    ASSERT_TRUE(t.ctx.shm != NULL);
    uint64_t seed = 77;
    for (size_t ci = 0; ci < 2; ci++)
        for (size_t di = 0; di < 3; di++)
            for (size_t oi = 0; oi < 3; oi++)
                run_reductions(&t, dts[di], ops[oi], counts[ci], seed++, (ci + di + oi) % 3, false);
    /* broadcast: the root's stores stream; every root, 2+ chunks, probed,
     * the root's buffer unaligned */
    size_t bytes = (1u << 20) + 4099;
    uint8_t *bb = malloc(bytes + 1);
    ASSERT_TRUE(bb != NULL);
    for (int root = 0; root < n; root++) {
        uint8_t *p = bb + (root == 1 ? 1 : 0);
        for (size_t i = 0; i < bytes; i++)
            p[i] = rank == root ? (uint8_t)(tgen_mix(i + (uint64_t)root) & 0xff) : 0;
        ASSERT_OK(tdist__coll_broadcast(&t.ctx, p, bytes, TDIST_U8, root));
        for (size_t i = 0; i < bytes; i++)
            if (p[i] != (uint8_t)(tgen_mix(i + (uint64_t)root) & 0xff))
                FAIL("broadcast from %d: byte %zu differs", root, i);
    }
    free(bb);
    setenv("TDIST_SHM_STREAM", "sometimes", 1);
    tdist__shmc_t *bad = NULL;
    ASSERT_STATUS(tdist__shmc_create(t.m.tp, rank, n, &bad), TDIST_ERR_INVALID_ARG);
    ASSERT_TRUE(bad == NULL);
    ASSERT_TRUE(strstr(tdist_last_error(), "TDIST_SHM_STREAM") != NULL);
    unsetenv("TDIST_SHM_STREAM");
    ASSERT_OK(tdist__coll_barrier(&t.ctx));
    mesh_close(&t);
}

TEST(coll_shm_streaming_stores, 90)
{
    /* 2 ranks on a 2-CPU machine have a CPU each (the exchange probe, the
     * reduced slices streamed too); 3 share them (the first chunk's timed
     * reads, only slices read on another CPU streamed) */
    tdist_test_run_ranks(2, stream_body, NULL);
    tdist_test_run_ranks(3, stream_body, NULL);
}

/* ------------------------------------------------------- dead peer */

typedef struct kill_arg {
    tdist__ar_algo_t algo;
    size_t count;
} kill_arg_t;

static void *killer(void *arg)
{
    (void)arg;
    usleep(30 * 1000);
    raise(SIGKILL);
    return NULL;
}

/* Rank 3 of 4 dies (SIGKILL) inside an all_reduce. The ranks that receive
 * from it (every rank for direct; rank 0 in the ring) fail with
 * TDIST_ERR_CONNECTION naming rank 3; the rest fail with
 * TDIST_ERR_CONNECTION when a failed neighbour closes its mesh. Nobody
 * hangs: every survivor fails within a few seconds although the
 * collective's deadline is a minute away. */
static void kill_body(int rank, int n, void *arg)
{
    const kill_arg_t *k = arg;
    coll_rank_t t;
    mesh_up(&t, rank, n);
    float *b = calloc(k->count, 4);
    ASSERT_TRUE(b != NULL);
    ASSERT_OK(tdist__coll_all_reduce(&t.ctx, b, b, k->count, TDIST_F32, TDIST_SUM, 1.0, k->algo));
    if (rank == 3) {
        pthread_t th;
        ASSERT_TRUE(pthread_create(&th, NULL, killer, NULL) == 0);
        for (;;) /* until killed: keep the collective in flight */
            (void)tdist__coll_all_reduce(&t.ctx, b, b, k->count, TDIST_F32, TDIST_SUM, 1.0, k->algo);
    }
    double t0 = tdist_test_now_ms();
    tdist_status_t st = TDIST_OK;
    /* until rank 3's death shows (it dies 30 ms in): bounded in count and
     * time, since shared memory runs a small all_reduce in microseconds */
    for (int i = 0; i < 10000000 && st == TDIST_OK &&
                    tdist_test_now_ms() - t0 < 10000 * tdist_test_timeout_mult();
         i++)
        st = tdist__coll_all_reduce(&t.ctx, b, b, k->count, TDIST_F32, TDIST_SUM, 1.0, k->algo);
    double ms = tdist_test_now_ms() - t0;
    ASSERT_STATUS(st, TDIST_ERR_CONNECTION);
    /* ring: rank 0 receives from rank 3; rank 2's sends to it may all have
     * been taken by the kernel, so it may learn from rank 1 instead */
    bool neighbour = k->algo == TDIST__AR_DIRECT || rank == 0;
    if (neighbour) ASSERT_CONTAINS(tdist_last_error(), "rank 3");
    ASSERT_LE(ms, 5000 * tdist_test_timeout_mult());
    /* What pg/ does with a failed group: close it. Ranks that never talk
     * to rank 3 (ring: rank 1) learn of the failure from that close. The
     * pause lets every neighbour of rank 3 see rank 3's death first. */
    usleep(200 * 1000);
    tdist__shmc_destroy(t.ctx.shm);
    tdist__coll_scratch_release(&t.scratch);
    tdist__tp_destroy(t.m.tp);
    /* bounded: a survivor that failed an assertion must not leave the
     * others waiting here until the test's deadline */
    tdist_store_set_timeout(tdist_world_store(t.m.w), (int64_t)(10000 * tdist_test_timeout_mult()));
    store_barrier(&t, k->algo == TDIST__AR_DIRECT ? "kd" : "kr", 3); /* survivors */
    free(b);
    tdist_world_destroy(t.m.w);
}

static void run_kill(tdist__ar_algo_t algo, size_t count)
{
    kill_arg_t k = {algo, count};
    tdist_ranks_opts_t o;
    tdist_ranks_opts_init(&o, 4);
    o.kill_others_after_ms = -1;
    tdist_rank_result_t res[4];
    tdist_test_spawn_ranks(&o, kill_body, &k, res);
    char d[128];
    for (int r = 0; r < 3; r++)
        if (!res[r].exited || res[r].code != 0)
            FAIL("survivor rank %d %s", r, tdist_test_describe(&res[r], d, sizeof d));
    if (!res[3].signaled || res[3].sig != SIGKILL)
        FAIL("rank 3 %s, expected SIGKILL", tdist_test_describe(&res[3], d, sizeof d));
}

TEST(coll_dead_peer_ring, 40) { run_kill(TDIST__AR_RING, 1u << 20); }
TEST(coll_dead_peer_direct, 40) { run_kill(TDIST__AR_DIRECT, 16); }

/* ------------------------------------------------------- deadline */

/* Rank 2 of 3 never joins the collectives: the others fail with
 * TDIST_ERR_TIMEOUT at the context's deadline (not before, and within a
 * second after), naming the peer still owed bytes; requests that were
 * still posted are unlinked (ASan would see their freed memory touched
 * otherwise) and the transport is left aborted. */
static void late_body(int rank, int n, void *arg)
{
    (void)arg;
    coll_rank_t t;
    mesh_up(&t, rank, n);
    if (rank != 2) {
        static const tdist__ar_algo_t algos[] = {TDIST__AR_RING, TDIST__AR_DIRECT};
        for (int a = 0; a < 2; a++) {
            size_t count = a == 0 ? (1u << 20) : 4;
            float *b = calloc(count, 4);
            t.ctx.deadline_ms = tdist__now_ms() + 500;
            double t0 = tdist_test_now_ms();
            tdist_status_t st =
                tdist__coll_all_reduce(&t.ctx, b, b, count, TDIST_F32, TDIST_SUM, 1.0, algos[a]);
            double ms = tdist_test_now_ms() - t0;
            if (a == 0) {
                ASSERT_STATUS(st, TDIST_ERR_TIMEOUT);
                /* rank 0 receives from rank 2 in the ring; rank 1 waits on rank 0,
                 * or (shared memory: a ring smaller than the message) on its
                 * sends to rank 2 */
                const char *e = tdist_last_error();
                if (rank == 0)
                    ASSERT_CONTAINS(e, "peer rank 2");
                else if (!strstr(e, "peer rank 0") && !strstr(e, "peer rank 2"))
                    FAIL("rank 1's timeout names neither rank 0 nor rank 2: %s", e);
                ASSERT_GE(ms, 490);
                ASSERT_LE(ms, 1500 * tdist_test_timeout_mult());
            } else {
                ASSERT_STATUS(st, TDIST_ERR_ABORTED); /* the transport stays failed */
            }
            free(b);
        }
    }
    store_barrier(&t, "late", 3);
    mesh_close(&t);
}

TEST(coll_deadline, 30) { tdist_test_run_ranks(3, late_body, NULL); }
