/* tests/pg/test_pg_reduce_paths.c — all_reduce, reduce and broadcast
 * through the public API at the counts where the paths change: on shared
 * memory the tiny path (data inside the fingerprint line, up to
 * TDIST__SHMC_BLOB_MAX - the 8-byte fingerprint hash = 392 bytes) against the
 * one-shot small path just above it, the small path's limits (2 KiB with a
 * CPU per rank, as at 2 ranks here; 8 KiB when ranks share CPUs, as at 3
 * and 5 ranks on 2 CPUs) against the staged path, and the staging chunk
 * boundary (256 KiB); sizes alternate between the paths, so a small
 * all_reduce follows staged ones (the slots are reused); on
 * TCP (the __tcp twins) the fused small all_reduce (16 KiB at 2, 3 and 5
 * ranks: TDIST__FUSED_MAX, and 64 KiB / (ranks - 1) after) against the
 * algorithms. Every dtype x valid reduce op, in place and out of place,
 * world sizes 2, 3 and 5, against a reference each rank computes from
 * every rank's seeded input (tests/harness/gen.h: small integers, exact in
 * any summation order). Then the same for the other one-shot collectives
 * (below). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "gen.h"
#include "harness.h"
#include "tdist/pg.h"

#define PREMUL 0.5

static void expect_eq(const void *got, const void *want, size_t count, tdist_dtype_t dt,
                      const char *what, tdist_redop_t op, int inplace)
{
    size_t es = tdist_dtype_size(dt);
    if (memcmp(got, want, count * es) == 0) return;
    for (size_t i = 0; i < count; i++)
        if (memcmp((const uint8_t *)got + i * es, (const uint8_t *)want + i * es, es) != 0)
            FAIL("%s %s %s count %zu%s: element %zu differs", what, tdist_dtype_name(dt),
                 tdist_redop_name(op), count, inplace ? " in place" : "", i);
}

/* Element counts for a dtype of es bytes: around the tiny line (392 B),
 * the fused TCP path (16 KiB), the small path's limits (2 and 8 KiB) and
 * the staging chunk (256 KiB). */
static size_t counts_for(size_t es, size_t *out)
{
    size_t n = 0;
    out[n++] = 1;
    out[n++] = 3;
    out[n++] = 392 / es;
    out[n++] = 392 / es + 1;
    out[n++] = 1024 / es + 1;
    out[n++] = (16u << 10) / es;
    out[n++] = (16u << 10) / es + 1;
    out[n++] = (2u << 10) / es;
    out[n++] = (8u << 10) / es + 1; /* staged, then the next one small again */
    out[n++] = (2u << 10) / es + 1;
    out[n++] = (8u << 10) / es;
    out[n++] = (256u << 10) / es + 5;
    return n;
}

/* The world and its group, with a 30 s timeout (scaled for sanitizers). */
static void open_world(tdist_world_t **w, tdist_pg_t **pg)
{
    ASSERT_OK(tdist_init("env://", NULL, w));
    tdist_pg_opts_t o;
    tdist_pg_opts_init(&o);
    o.timeout_ms = (int64_t)(30000 * tdist_test_timeout_mult());
    ASSERT_OK(tdist_pg_create_world(*w, &o, pg));
}

static void paths_body(int rank, int n, void *arg)
{
    (void)arg;
    tdist_world_t *w;
    tdist_pg_t *pg;
    open_world(&w, &pg);
    tdist_coll_opts_t co;
    tdist_coll_opts_init(&co);
    co.premul_factor = PREMUL;
    uint64_t seed = 11;
    for (int dt = 0; dt < TDIST_DTYPE_COUNT; dt++) {
        size_t es = tdist_dtype_size((tdist_dtype_t)dt), counts[14];
        size_t nc = counts_for(es, counts);
        for (size_t ci = 0; ci < nc; ci++) {
            size_t count = counts[ci], bytes = count * es;
            uint8_t *want = malloc(bytes), *in = malloc(bytes), *out = malloc(bytes);
            ASSERT_TRUE(want && in && out);
            for (int op = 0; op < TDIST_REDOP_COUNT; op++) {
                tdist_redop_t ro = (tdist_redop_t)op;
                if (!tgen_op_valid(ro, (tdist_dtype_t)dt)) continue;
                /* the largest count: the common ops only (runtime) */
                if (ci + 1 == nc && ro != TDIST_SUM && ro != TDIST_AVG && ro != TDIST_PREMUL_SUM &&
                    ro != TDIST_MAX)
                    continue;
                tgen_reference(want, count, (tdist_dtype_t)dt, ro, n, seed, PREMUL);
                tgen_fill(in, count, (tdist_dtype_t)dt, ro, rank, seed);
                ASSERT_OK(tdist_all_reduce(pg, in, out, count, (tdist_dtype_t)dt, ro, &co, NULL));
                expect_eq(out, want, count, (tdist_dtype_t)dt, "all_reduce", ro, 0);
                ASSERT_OK(tdist_all_reduce(pg, in, in, count, (tdist_dtype_t)dt, ro, &co, NULL));
                expect_eq(in, want, count, (tdist_dtype_t)dt, "all_reduce", ro, 1);
                /* rooted reduce to the last rank */
                tgen_fill(in, count, (tdist_dtype_t)dt, ro, rank, seed);
                memset(out, 0x5a, bytes);
                ASSERT_OK(tdist_reduce_to(pg, in, out, count, (tdist_dtype_t)dt, ro, n - 1, &co,
                                          NULL));
                if (rank == n - 1) expect_eq(out, want, count, (tdist_dtype_t)dt, "reduce", ro, 0);
                seed++;
            }
            /* broadcast from rank 1: every rank gets rank 1's input */
            tgen_fill(want, count, (tdist_dtype_t)dt, TDIST_SUM, 1, seed);
            if (rank == 1) memcpy(out, want, bytes);
            else memset(out, 0x33, bytes);
            ASSERT_OK(tdist_broadcast(pg, out, count, (tdist_dtype_t)dt, 1, NULL, NULL));
            expect_eq(out, want, count, (tdist_dtype_t)dt, "broadcast", TDIST_SUM, 1);
            free(want);
            free(in);
            free(out);
        }
    }
    tdist_pg_destroy(pg);
    tdist_world_destroy(w);
}

TEST(pg_reduce_paths_2_ranks, 90) { tdist_test_run_ranks(2, paths_body, NULL); }
TEST(pg_reduce_paths_3_ranks, 90) { tdist_test_run_ranks(3, paths_body, NULL); }
TEST(pg_reduce_paths_5_ranks, 120) { tdist_test_run_ranks(5, paths_body, NULL); }

/* The blocking tiny all_reduce on shared memory runs without a work and
 * reuses its last fingerprint's hash while the shape (count, dtype, op)
 * stays; a call with a work (or a callback) runs the general path, which
 * hashes the whole fingerprint. Here every call has one rank on each
 * path, through a sequence of shapes that returns to earlier ones: the
 * two hashes must agree (or every call fails with a mismatch) and the
 * results must be right. Then, with the cache warm for f32 x 2 SUM, one
 * rank changes only the reduce op: that must still be a mismatch. */
typedef struct tiny_shape {
    tdist_dtype_t dt;
    tdist_redop_t op;
    size_t count;
} tiny_shape_t;

static void tiny_paths_body(int rank, int n, void *arg)
{
    (void)arg;
    static const tiny_shape_t shapes[] = {
        {TDIST_F32, TDIST_SUM, 2}, {TDIST_F32, TDIST_SUM, 2}, {TDIST_F32, TDIST_SUM, 3},
        {TDIST_F64, TDIST_MAX, 2}, {TDIST_F32, TDIST_SUM, 2}, {TDIST_I32, TDIST_BXOR, 2},
        {TDIST_F32, TDIST_AVG, 2}, {TDIST_BF16, TDIST_SUM, 7}, {TDIST_F32, TDIST_SUM, 2},
        {TDIST_F32, TDIST_MIN, 2}, {TDIST_I64, TDIST_SUM, 49}, {TDIST_F32, TDIST_SUM, 2},
    };
    tdist_world_t *w;
    tdist_pg_t *pg;
    open_world(&w, &pg);
    uint8_t want[512], in[512], out[512];
    uint64_t seed = 101;
    const size_t ns = sizeof shapes / sizeof shapes[0];
    for (size_t i = 0; i < 3 * ns; i++, seed++) {
        const tiny_shape_t *s = &shapes[i % ns];
        tgen_reference(want, s->count, s->dt, s->op, n, seed, 1.0);
        tgen_fill(in, s->count, s->dt, s->op, rank, seed);
        memset(out, 0x5a, sizeof out);
        if ((i + (size_t)rank) % 2 == 0) { /* blocking, no work: the fast path */
            ASSERT_OK(tdist_all_reduce(pg, in, out, s->count, s->dt, s->op, NULL, NULL));
        } else { /* with a work: the general path */
            tdist_work_t *wk = NULL;
            ASSERT_OK(tdist_all_reduce(pg, in, out, s->count, s->dt, s->op, NULL, &wk));
            ASSERT_OK(tdist_work_wait(wk, -1));
            tdist_work_free(wk);
        }
        expect_eq(out, want, s->count, s->dt, "all_reduce (fast and general path)", s->op, 0);
    }
    /* warm: f32 x 2 SUM on the fast path everywhere, then rank 0 says MAX */
    for (int i = 0; i < 3; i++)
        ASSERT_OK(tdist_all_reduce(pg, in, out, 2, TDIST_F32, TDIST_SUM, NULL, NULL));
    tdist_redop_t op = rank == 0 ? TDIST_MAX : TDIST_SUM;
    ASSERT_STATUS(tdist_all_reduce(pg, in, out, 2, TDIST_F32, op, NULL, NULL), TDIST_ERR_MISMATCH);
    ASSERT_CONTAINS(tdist_last_error(), "max");
    tdist_pg_destroy(pg);
    tdist_world_destroy(w);
}

TEST(pg_tiny_fast_and_general_paths_agree_2_ranks, 60) { tdist_test_run_ranks(2, tiny_paths_body, NULL); }
TEST(pg_tiny_fast_and_general_paths_agree_3_ranks, 60) { tdist_test_run_ranks(3, tiny_paths_body, NULL); }

/* Broadcast, all_gather, gather,
 * scatter, all_to_all and reduce_scatter through the public API at the
 * sizes where their paths change: on shared memory the data riding in the
 * line (up to 392 bytes staged by a rank: the blob after the 8-byte
 * fingerprint hash), the one-shot through the staging slot just above it
 * (up to 256 KiB staged by a rank; all_to_all, scatter and
 * reduce_scatter stage a whole buffer of size blocks), and each op's own
 * algorithm above that; a staged all_reduce between the calls reuses the
 * slots. On TCP (the __tcp twins) the same calls check the fused exchange
 * (data behind the fingerprint, up to 16 KiB a rank) and the
 * point-to-point algorithms above it. In place and out of place, several dtypes and reduce ops,
 * against a reference each rank computes from every rank's seeded input
 * (tests/harness/gen.h). */
/* Block sizes (elements per rank) for n ranks and elements of es bytes:
 * around the line (392 B staged), TCP's fused exchange (16 KiB) and the
 * slot (256 KiB staged), for the ops that stage one block and for those
 * that stage n. */
static size_t blocks_for(size_t es, int n, size_t *out)
{
    size_t k = 0, line = 392 / es, slot = (256u << 10) / es, fused = (16u << 10) / es;
    size_t nn = (size_t)n;
    out[k++] = 1;
    out[k++] = line / nn;
    out[k++] = line / nn + 1;
    out[k++] = line;
    out[k++] = line + 1;
    out[k++] = fused / nn; /* TCP: data behind the fingerprint up to 16 KiB a rank */
    out[k++] = fused / nn + 1;
    out[k++] = slot / nn;
    out[k++] = slot / nn + 1;
    out[k++] = slot;
    out[k++] = slot + 3;
    return k;
}

typedef struct bufs {
    uint8_t *in, *out, *want, *tmp;
} bufs_t;

/* all_gather and gather (root n - 1): block r = rank r's input. */
static void check_gathers(tdist_pg_t *pg, int rank, int n, tdist_dtype_t dt, size_t blk,
                          uint64_t seed, bufs_t *b)
{
    size_t bb = blk * tdist_dtype_size(dt), nn = (size_t)n;
    for (int r = 0; r < n; r++) tgen_fill(b->want + (size_t)r * bb, blk, dt, TDIST_SUM, r, seed);
    memcpy(b->in, b->want + (size_t)rank * bb, bb);
    memset(b->out, 0x5a, nn * bb);
    ASSERT_OK(tdist_all_gather(pg, b->in, b->out, blk, dt, NULL, NULL));
    expect_eq(b->out, b->want, nn * blk, dt, "all_gather", TDIST_SUM, 0);
    memset(b->out, 0x5a, nn * bb);
    memcpy(b->out, b->in, bb);
    ASSERT_OK(tdist_all_gather(pg, b->out, b->out, blk, dt, NULL, NULL));
    expect_eq(b->out, b->want, nn * blk, dt, "all_gather", TDIST_SUM, 1);
    memset(b->out, 0x5a, nn * bb);
    ASSERT_OK(tdist_gather(pg, b->in, b->out, blk, dt, n - 1, NULL, NULL));
    if (rank == n - 1) expect_eq(b->out, b->want, nn * blk, dt, "gather", TDIST_SUM, 0);
}

/* scatter (root 1 % n) and all_to_all: rank r's send buffer is r's input
 * of n blocks; block p goes to rank p. */
static void check_scatters(tdist_pg_t *pg, int rank, int n, tdist_dtype_t dt, size_t blk,
                           uint64_t seed, bufs_t *b)
{
    size_t bb = blk * tdist_dtype_size(dt), nn = (size_t)n;
    int root = 1 % n;
    tgen_fill(b->in, nn * blk, dt, TDIST_SUM, rank, seed);
    tgen_fill(b->tmp, nn * blk, dt, TDIST_SUM, root, seed);
    memset(b->out, 0x5a, bb);
    ASSERT_OK(tdist_scatter(pg, b->in, b->out, blk, dt, root, NULL, NULL));
    expect_eq(b->out, b->tmp + (size_t)rank * bb, blk, dt, "scatter", TDIST_SUM, 0);
    for (int r = 0; r < n; r++) {
        tgen_fill(b->tmp, nn * blk, dt, TDIST_SUM, r, seed);
        memcpy(b->want + (size_t)r * bb, b->tmp + (size_t)rank * bb, bb);
    }
    memset(b->out, 0x5a, nn * bb);
    ASSERT_OK(tdist_all_to_all(pg, b->in, b->out, blk, dt, NULL, NULL));
    expect_eq(b->out, b->want, nn * blk, dt, "all_to_all", TDIST_SUM, 0);
    ASSERT_OK(tdist_all_to_all(pg, b->in, b->in, blk, dt, NULL, NULL));
    expect_eq(b->in, b->want, nn * blk, dt, "all_to_all", TDIST_SUM, 1);
}

/* reduce_scatter: block `rank` of the op over every rank's input. */
static void check_reduce_scatter(tdist_pg_t *pg, int rank, int n, tdist_dtype_t dt,
                                 tdist_redop_t op, size_t blk, uint64_t seed, bufs_t *b)
{
    size_t bb = blk * tdist_dtype_size(dt), nn = (size_t)n;
    tdist_coll_opts_t co;
    tdist_coll_opts_init(&co);
    co.premul_factor = PREMUL;
    tgen_reference_part(b->want, (size_t)rank * blk, blk, dt, op, n, seed, PREMUL); /* block rank */
    tgen_fill(b->in, nn * blk, dt, op, rank, seed);
    memset(b->out, 0x5a, bb);
    ASSERT_OK(tdist_reduce_scatter(pg, b->in, b->out, blk, dt, op, &co, NULL));
    expect_eq(b->out, b->want, blk, dt, "reduce_scatter", op, 0);
}

static void oneshot_body(int rank, int n, void *arg)
{
    (void)arg;
    static const tdist_dtype_t dts[] = {TDIST_F32, TDIST_I8, TDIST_BF16, TDIST_F64};
    static const tdist_redop_t ops[] = {TDIST_SUM, TDIST_AVG, TDIST_PREMUL_SUM, TDIST_MAX};
    tdist_world_t *w;
    tdist_pg_t *pg;
    open_world(&w, &pg);
    size_t big = (size_t)n * ((256u << 10) + 64) + 64;
    bufs_t b = {malloc(big), malloc(big), malloc(big), malloc(big)};
    float *stage = malloc((300u << 10) * sizeof(float));
    ASSERT_TRUE(b.in && b.out && b.want && b.tmp && stage);
    memset(stage, 0, (300u << 10) * sizeof(float));
    uint64_t seed = 7;
    for (size_t d = 0; d < sizeof dts / sizeof dts[0]; d++) {
        tdist_dtype_t dt = dts[d];
        size_t blks[16], nb = blocks_for(tdist_dtype_size(dt), n, blks);
        for (size_t i = 0; i < nb; i++, seed++) {
            /* a broadcast of the same bytes from rank n - 1 */
            size_t bytes = blks[i] * tdist_dtype_size(dt);
            tgen_fill(b.want, blks[i], dt, TDIST_SUM, n - 1, seed);
            if (rank == n - 1) memcpy(b.out, b.want, bytes);
            else memset(b.out, 0x33, bytes);
            ASSERT_OK(tdist_broadcast(pg, b.out, blks[i], dt, n - 1, NULL, NULL));
            expect_eq(b.out, b.want, blks[i], dt, "broadcast", TDIST_SUM, 1);
            check_gathers(pg, rank, n, dt, blks[i], seed, &b);
            check_scatters(pg, rank, n, dt, blks[i], seed, &b);
            for (size_t o = 0; o < sizeof ops / sizeof ops[0]; o++)
                if (tgen_op_valid(ops[o], dt))
                    check_reduce_scatter(pg, rank, n, dt, ops[o], blks[i], seed, &b);
            if (i % 3 == 2) /* a staged all_reduce between them: the slots are reused */
                ASSERT_OK(tdist_all_reduce(pg, stage, stage, 300u << 10, TDIST_F32, TDIST_MAX,
                                           NULL, NULL));
        }
    }
    free(b.in);
    free(b.out);
    free(b.want);
    free(b.tmp);
    free(stage);
    tdist_pg_destroy(pg);
    tdist_world_destroy(w);
}

TEST(pg_oneshot_paths_2_ranks, 90) { tdist_test_run_ranks(2, oneshot_body, NULL); }
TEST(pg_oneshot_paths_3_ranks, 120) { tdist_test_run_ranks(3, oneshot_body, NULL); }
TEST(pg_oneshot_paths_4_ranks, 120) { tdist_test_run_ranks(4, oneshot_body, NULL); }

/* Eight ranks (on TCP: pg's check and the fused collectives along a
 * tree to rank 0 and back): an all_reduce of floats whose sum depends on the order
 * they are added in gives, on every rank, the bits of the sum in rank
 * order (the one-shot order: ((x0 + x1) + x2) + ...), each rank computing
 * that reference itself; a 64 KiB all_reduce (on TCP reduced on the way
 * up the tree) gives the same bits on every rank; a rooted broadcast and
 * an all_gather through the same tree deliver every rank's bytes. */
static float *g_big; /* every rank's 64 KiB result (shared between the ranks' processes) */

static float order_val(int r, int i) { return (0.1f + 0.37f * (float)r) * (1.0f + 1e-3f * (float)i); }

static void eight_body(int rank, int n, void *arg)
{
    (void)arg;
    enum { CNT = 1000 }; /* 4000 bytes: fused at 8 ranks (64 KiB / 7 bytes a rank) */
    tdist_world_t *w;
    tdist_pg_t *pg;
    open_world(&w, &pg);
    static float x[CNT], y[CNT], want[CNT], all[8 * 3];
    for (int i = 0; i < CNT; i++) {
        x[i] = order_val(rank, i);
        want[i] = order_val(0, i);
        for (int r = 1; r < n; r++) want[i] += order_val(r, i);
    }
    /* the sum really depends on the order: backwards differs somewhere */
    bool order_matters = false;
    for (int i = 0; i < CNT && !order_matters; i++) {
        float back = order_val(n - 1, i);
        for (int r = n - 2; r >= 0; r--) back += order_val(r, i);
        order_matters = back != want[i];
    }
    ASSERT_TRUE(order_matters);
    const size_t counts[] = {2, CNT};
    for (int k = 0; k < 2; k++) {
        memset(y, 0x5a, sizeof y);
        ASSERT_OK(tdist_all_reduce(pg, x, y, counts[k], TDIST_F32, TDIST_SUM, NULL, NULL));
        expect_eq(y, want, counts[k], TDIST_F32, "8-rank all_reduce", TDIST_SUM, 0);
    }
    /* 64 KiB (on TCP reduced on the way up the tree, in its order): the
     * same bits on every rank, and the sum within rounding */
    enum { BIG = 16384 };
    float *bx = malloc(BIG * sizeof *bx), *by = malloc(BIG * sizeof *by);
    ASSERT_TRUE(bx && by);
    for (int i = 0; i < BIG; i++) bx[i] = order_val(rank, i % 977);
    ASSERT_OK(tdist_all_reduce(pg, bx, by, BIG, TDIST_F32, TDIST_SUM, NULL, NULL));
    memcpy(g_big + (size_t)rank * BIG, by, BIG * sizeof *by);
    ASSERT_OK(tdist_barrier(pg, NULL, NULL));
    for (int i = 0; i < BIG; i++) {
        double exact = 0;
        for (int r = 0; r < n; r++) exact += (double)order_val(r, i % 977);
        if (fabs((double)by[i] - exact) > 1e-5 * exact) FAIL("element %d: %g, not %g", i, by[i], exact);
    }
    ASSERT_TRUE(memcmp(by, g_big, BIG * sizeof *by) == 0); /* rank 0's bits */
    free(bx);
    free(by);
    memcpy(y, rank == 5 ? x : want, sizeof y);
    ASSERT_OK(tdist_broadcast(pg, y, CNT, TDIST_F32, 5, NULL, NULL));
    for (int i = 0; i < CNT; i++) ASSERT_TRUE(y[i] == order_val(5, i));
    ASSERT_OK(tdist_all_gather(pg, x, all, 3, TDIST_F32, NULL, NULL));
    for (int r = 0; r < n; r++)
        for (int i = 0; i < 3; i++) ASSERT_TRUE(all[r * 3 + i] == order_val(r, i));
    ASSERT_OK(tdist_barrier(pg, NULL, NULL));
    tdist_pg_destroy(pg);
    tdist_world_destroy(w);
}

static void run_eight(const char *radix)
{
    if (radix) setenv("TDIST_CHECK_TREE_RADIX", radix, 1); /* the ranks inherit it */
    g_big = mmap(NULL, 8 * 16384 * sizeof(float), PROT_READ | PROT_WRITE,
                 MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    ASSERT_TRUE(g_big != MAP_FAILED);
    tdist_test_run_ranks(8, eight_body, NULL);
    munmap(g_big, 8 * 16384 * sizeof(float));
    if (radix) unsetenv("TDIST_CHECK_TREE_RADIX");
}

TEST(pg_fused_8_ranks_rank_order_bits, 60) { run_eight(NULL); }
/* the same along a binomial tree (three steps up, three down) */
TEST(pg_fused_8_ranks_binomial_tree_bits, 60) { run_eight("2"); }
