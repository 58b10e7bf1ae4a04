/* tests/algorithms/test_quant_coll.c — quantised wire collectives
 * (tdist_quant_all_gather / tdist_quant_all_to_all) against PyTorch
 * 1.13's auto_quantize (oracle_h7.h, from oracle2/H7.json): the wire
 * values and the f32 outputs bit for bit on 3 real ranks, over shared
 * memory and TCP, blocking and asynchronous (several outstanding works,
 * completing in order, decoded before they report completion); argument
 * errors (nothing sent, no work, recvbuf untouched); count 0; 1- and
 * 2-rank groups; a wire-format mismatch between ranks; and the bytes on
 * the wire, counted on a private loopback interface: half those of the
 * f32 collectives. */
#include <errno.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "harness.h"
#include "loopback.h"
#include "oracle_h7.h"
#include "tdist/algorithms.h"
#include "tdist/pg.h"

#define NAG (H7_WORLD * H7_NX) /* elements of an all_gather output */
#define A2A_COUNT (H7_NY / H7_WORLD) /* elements to and from each rank */

static const tdist_dtype_t wires[2] = {TDIST_F16, TDIST_BF16};

static uint32_t fbits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float bitsf(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static void load(float *dst, const uint32_t *src, size_t n)
{
    for (size_t i = 0; i < n; i++) dst[i] = bitsf(src[i]);
}

static void expect_bits(const float *got, const uint32_t *want, size_t n, const char *what)
{
    for (size_t i = 0; i < n; i++)
        if (fbits(got[i]) != want[i])
            FAIL("%s: element %zu is 0x%08x, PyTorch gives 0x%08x", what, i, fbits(got[i]),
                 want[i]);
}

/* PyTorch's outputs for rank r */
static const uint32_t *ag_want(tdist_dtype_t wire, int r)
{
    return wire == TDIST_F16 ? h7_ag_out_f16[r] : h7_ag_out_bf16[r];
}
static const uint32_t *a2a_want(tdist_dtype_t wire, int r)
{
    return wire == TDIST_F16 ? h7_a2a_out_f16[r] : h7_a2a_out_bf16[r];
}

/* PyTorch's decoded element i of X[src] / Y[src]: block src of any
 * rank's all_gather output; Y[src] repeats X[src]'s first rows. */
static uint32_t deq_x(tdist_dtype_t wire, int src, int i)
{
    return ag_want(wire, 0)[src * H7_NX + i];
}
static uint32_t deq_y(tdist_dtype_t wire, int src, int i) { return deq_x(wire, src, i % H7_NX); }

static void open_world(tdist_world_t **w, tdist_pg_t **pg, const char *transport)
{
    ASSERT_OK(tdist_init("env://", NULL, w));
    tdist_pg_opts_t o;
    tdist_pg_opts_init(&o);
    o.timeout_ms = (int64_t)(20000 * tdist_test_timeout_mult());
    o.transport = transport;
    ASSERT_OK(tdist_pg_create_world(*w, &o, pg));
}

/* ------------------------------------------------------ the conversions */

/* c10's fp16_ieee_from_fp32_value after torch.clamp(x, -65504, 65504):
 * PyTorch's own float-arithmetic formulation, as a second opinion on the
 * library's integer one. */
static uint16_t c10_fp16_wire(uint32_t w)
{
    float f = bitsf(w);
    if (f > 65504.0f) f = 65504.0f;
    if (f < -65504.0f) f = -65504.0f;
    w = fbits(f);
    float base = (__builtin_fabsf(f) * 0x1.0p+112f) * 0x1.0p-110f;
    uint32_t shl1_w = w + w, sign = w & 0x80000000u, bias = shl1_w & 0xff000000u;
    if (bias < 0x71000000u) bias = 0x71000000u;
    base = bitsf((bias >> 1) + 0x07800000u) + base;
    uint32_t bits = fbits(base);
    uint32_t nonsign = ((bits >> 13) & 0x7c00u) + (bits & 0x0fffu);
    return (uint16_t)((sign >> 16) | (shl1_w > 0xff000000u ? 0x7e00u : nonsign));
}

TEST(quant_encode_decode_match_pytorch, 60)
{
    uint16_t h[H7_WORLD * H7_NY];
    float f[H7_WORLD * H7_NY], x[H7_NY];
    for (int r = 0; r < H7_WORLD; r++) {
        /* the wire values PyTorch recorded, and their decoding */
        load(x, h7_x[r], H7_NX);
        ASSERT_OK(tdist_quant_encode(h, x, H7_NX, TDIST_F16));
        ASSERT_MEMEQ(h, h7_ag_wire_in_f16[r], H7_NX * sizeof h[0]);
        ASSERT_OK(tdist_quant_encode(h, x, H7_NX, TDIST_BF16));
        ASSERT_MEMEQ(h, h7_ag_wire_in_bf16[r], H7_NX * sizeof h[0]);
        load(x, h7_y[r], H7_NY);
        ASSERT_OK(tdist_quant_encode(h, x, H7_NY, TDIST_F16));
        ASSERT_MEMEQ(h, h7_a2a_wire_in_f16[r], H7_NY * sizeof h[0]);
        ASSERT_OK(tdist_quant_encode(h, x, H7_NY, TDIST_BF16));
        ASSERT_MEMEQ(h, h7_a2a_wire_in_bf16[r], H7_NY * sizeof h[0]);
        ASSERT_OK(tdist_quant_decode(f, h7_ag_wire_out_f16[r], NAG, TDIST_F16));
        expect_bits(f, h7_ag_out_f16[r], NAG, "decode f16 (all_gather)");
        ASSERT_OK(tdist_quant_decode(f, h7_ag_wire_out_bf16[r], NAG, TDIST_BF16));
        expect_bits(f, h7_ag_out_bf16[r], NAG, "decode bf16 (all_gather)");
        ASSERT_OK(tdist_quant_decode(f, h7_a2a_wire_out_f16[r], H7_NY, TDIST_F16));
        expect_bits(f, h7_a2a_out_f16[r], H7_NY, "decode f16 (all_to_all)");
        ASSERT_OK(tdist_quant_decode(f, h7_a2a_wire_out_bf16[r], H7_NY, TDIST_BF16));
        expect_bits(f, h7_a2a_out_bf16[r], H7_NY, "decode bf16 (all_to_all)");
        /* the mapping the subgroup test builds its expectations with */
        for (int q = 0; q < H7_WORLD; q++)
            for (int i = 0; i < A2A_COUNT; i++) {
                int at = q * A2A_COUNT + i, from = r * A2A_COUNT + i;
                ASSERT_EQ(h7_a2a_out_f16[r][at], deq_y(TDIST_F16, q, from));
                ASSERT_EQ(h7_a2a_out_bf16[r][at], deq_y(TDIST_BF16, q, from));
            }
    }
    /* f16 against c10's formulation: every 4099th bit pattern, every 13th
     * of [0x33000000, 0x38900000) (from below the f16 subnormals to past
     * the first normal; 13 is odd, so every rounding remainder occurs),
     * and all of [0x477f0000, 0x47810000) (the clamp); both signs */
    enum { B = 4096 };
    static float src[B];
    static uint16_t dst[B];
    uint64_t ranges[3][3] = {{0, 1ull << 32, 4099}, {0x33000000u, 0x38900000u, 13},
                             {0x477f0000u, 0x47810000u, 1}};
    for (int k = 0; k < 3; k++) {
        for (uint64_t u = ranges[k][0]; u < ranges[k][1];) {
            int n = 0;
            for (; n < B && u < ranges[k][1]; n++, u += ranges[k][2])
                src[n] = bitsf((uint32_t)u ^ (n & 1 ? 0x80000000u : 0u));
            ASSERT_OK(tdist_quant_encode(dst, src, (size_t)n, TDIST_F16));
            for (int i = 0; i < n; i++)
                if (dst[i] != c10_fp16_wire(fbits(src[i])))
                    FAIL("f16 wire of 0x%08x: 0x%04x, c10 gives 0x%04x", fbits(src[i]), dst[i],
                         c10_fp16_wire(fbits(src[i])));
        }
    }
    /* bf16: PyTorch's unsigned arithmetic, NaNs included */
    const uint32_t in[] = {0x3f808000u, 0xbf808000u, 0x3f818000u, 0x7f7fffffu, 0x7f800001u,
                           0x7fc00000u, 0x7fff8000u, 0xffffffffu, 0xff800001u, 0x00000000u};
    const uint16_t want[] = {0x3f81, 0xbf81, 0x3f82, 0x7f80, 0x7f80,
                             0x7fc0, 0x8000, 0x0000, 0xff80, 0x0000};
    for (size_t i = 0; i < sizeof in / sizeof in[0]; i++) src[i] = bitsf(in[i]);
    ASSERT_OK(tdist_quant_encode(dst, src, sizeof in / sizeof in[0], TDIST_BF16));
    ASSERT_MEMEQ(dst, want, sizeof want);
    const uint16_t snan = 0x7f81; /* bf16 decoding keeps a signalling NaN as it is */
    ASSERT_OK(tdist_quant_decode(f, &snan, 1, TDIST_BF16));
    ASSERT_EQ(fbits(f[0]), 0x7f810000u);
    /* arguments */
    ASSERT_STATUS(tdist_quant_encode(dst, src, 1, TDIST_F32), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(),
                    "tdist_quant_encode: wire format must be f16 or bf16, not f32");
    ASSERT_STATUS(tdist_quant_decode(f, dst, 1, (tdist_dtype_t)77), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "not invalid (77)");
    ASSERT_STATUS(tdist_quant_encode(NULL, src, 1, TDIST_F16), TDIST_ERR_INVALID_ARG);
    ASSERT_STATUS(tdist_quant_decode(f, NULL, 1, TDIST_BF16), TDIST_ERR_INVALID_ARG);
    ASSERT_OK(tdist_quant_encode(NULL, NULL, 0, TDIST_F16));
    ASSERT_OK(tdist_quant_decode(NULL, NULL, 0, TDIST_BF16));
}

/* --------------------------------------------- 3 ranks against PyTorch */

static void h7_blocking(tdist_pg_t *pg, int r)
{
    float x[H7_NX], y[H7_NY], out[NAG];
    load(x, h7_x[r], H7_NX);
    load(y, h7_y[r], H7_NY);
    for (int k = 0; k < 2; k++) {
        tdist_dtype_t wire = wires[k];
        memset(out, 0, sizeof out);
        ASSERT_OK(tdist_quant_all_gather(pg, x, out, H7_NX, TDIST_F32, wire, NULL, NULL));
        expect_bits(out, ag_want(wire, r), NAG, "blocking all_gather");
        ASSERT_OK(tdist_quant_all_to_all(pg, y, out, A2A_COUNT, TDIST_F32, wire, NULL, NULL));
        expect_bits(out, a2a_want(wire, r), H7_NY, "blocking all_to_all");
        float inplace[H7_NY];
        memcpy(inplace, y, sizeof y);
        ASSERT_OK(tdist_quant_all_to_all(pg, inplace, inplace, A2A_COUNT, TDIST_F32, wire, NULL,
                                         NULL));
        expect_bits(inplace, a2a_want(wire, r), H7_NY, "in-place all_to_all");
        expect_bits(x, h7_x[r], H7_NX, "sendbuf after the call");
    }
}

/* Eight outstanding works; the caller's on_complete records the order it
 * ran in and whether recvbuf was already decoded then. */
enum { NQ = 8 };
typedef struct q_slot {
    _Atomic int *next;
    int *order;
    int idx;
    const float *out;
    const uint32_t *want;
    _Atomic int calls;
    _Atomic int status;
    _Atomic int decoded;
} q_slot_t;

static void q_done(tdist_status_t st, void *arg)
{
    q_slot_t *s = arg;
    s->order[atomic_fetch_add(s->next, 1)] = s->idx;
    atomic_store(&s->status, (int)st);
    atomic_store(&s->decoded, fbits(s->out[0]) == s->want[0] && fbits(s->out[5]) == s->want[5]);
    atomic_fetch_add(&s->calls, 1);
}

static void h7_async(tdist_pg_t *pg, int r)
{
    static float x[NQ][H7_NX], y[NQ][H7_NY], out[NQ][NAG];
    static q_slot_t slot[NQ];
    static int order[NQ];
    _Atomic int next = 0;
    tdist_work_t *w[NQ];
    for (int i = 0; i < NQ; i++) {
        tdist_dtype_t wire = wires[i % 2];
        bool gather = (i / 2) % 2 == 0;
        slot[i] = (q_slot_t){.next = &next, .order = order, .idx = i, .out = out[i],
                             .want = gather ? ag_want(wire, r) : a2a_want(wire, r)};
        tdist_coll_opts_t o;
        tdist_coll_opts_init(&o);
        o.on_complete = q_done;
        o.user_data = &slot[i];
        load(x[i], h7_x[r], H7_NX);
        load(y[i], h7_y[r], H7_NY);
        if (gather)
            ASSERT_OK(tdist_quant_all_gather(pg, x[i], out[i], H7_NX, TDIST_F32, wire, &o, &w[i]));
        else if (i < 4)
            ASSERT_OK(tdist_quant_all_to_all(pg, y[i], out[i], A2A_COUNT, TDIST_F32, wire, &o,
                                             &w[i]));
        else { /* in place */
            memcpy(out[i], y[i], sizeof y[i]);
            ASSERT_OK(tdist_quant_all_to_all(pg, out[i], out[i], A2A_COUNT, TDIST_F32, wire, &o,
                                             &w[i]));
        }
        /* the input was encoded by the call: the caller may reuse it at once */
        memset(x[i], 0xff, sizeof x[i]);
        memset(y[i], 0xff, sizeof y[i]);
    }
    /* test one, then wait for the rest from the last to the first */
    while (tdist_work_status(w[0]) == TDIST_INPROGRESS) usleep(200);
    ASSERT_OK(tdist_work_status(w[0]));
    for (int i = NQ - 1; i >= 0; i--) ASSERT_OK(tdist_work_wait(w[i], -1));
    for (int i = 0; i < NQ; i++) {
        ASSERT_EQ(order[i], i); /* completed in issue order */
        ASSERT_EQ(atomic_load(&slot[i].calls), 1);
        ASSERT_EQ(atomic_load(&slot[i].status), TDIST_OK);
        ASSERT_TRUE(atomic_load(&slot[i].decoded)); /* decoded before on_complete */
        expect_bits(out[i], slot[i].want, (i / 2) % 2 == 0 ? NAG : H7_NY, "async output");
        tdist_work_free(w[i]);
    }
    /* an async work, then a blocking call: the blocking call returns after
     * the earlier work has completed and been decoded */
    tdist_work_t *first;
    load(x[0], h7_x[r], H7_NX);
    ASSERT_OK(tdist_quant_all_gather(pg, x[0], out[0], H7_NX, TDIST_F32, TDIST_BF16, NULL, &first));
    ASSERT_OK(tdist_quant_all_gather(pg, x[0], out[1], H7_NX, TDIST_F32, TDIST_F16, NULL, NULL));
    ASSERT_EQ(tdist_work_status(first), TDIST_OK);
    expect_bits(out[0], ag_want(TDIST_BF16, r), NAG, "async before blocking");
    expect_bits(out[1], ag_want(TDIST_F16, r), NAG, "blocking after async");
    tdist_work_free(first);
}

static void h7_body(int rank, int n, void *arg)
{
    ASSERT_EQ(n, H7_WORLD);
    tdist_world_t *w;
    tdist_pg_t *pg;
    open_world(&w, &pg, arg);
    h7_blocking(pg, rank);
    h7_async(pg, rank);
    ASSERT_OK(tdist_barrier(pg, NULL, NULL));
    tdist_pg_destroy(pg);
    tdist_world_destroy(w);
}

TEST(quant_h7_3_ranks_shm, 60) { tdist_test_run_ranks(H7_WORLD, h7_body, "shm"); }
TEST(quant_h7_3_ranks_tcp, 60) { tdist_test_run_ranks(H7_WORLD, h7_body, "tcp"); }

/* ------------------------------------------------------------ arguments */

typedef tdist_status_t (*quant_fn)(tdist_pg_t *, const void *, void *, size_t, tdist_dtype_t,
                                   tdist_dtype_t, const tdist_coll_opts_t *, tdist_work_t **);

static void expect_arg_err(tdist_status_t st, const char *fn, const char *what)
{
    ASSERT_EQ(st, TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), fn);
    ASSERT_CONTAINS(tdist_last_error(), what);
}

static void args_body(int rank, int n, void *arg)
{
    (void)arg;
    tdist_world_t *wd;
    tdist_pg_t *pg;
    open_world(&wd, &pg, NULL);
    quant_fn fns[2] = {tdist_quant_all_gather, tdist_quant_all_to_all};
    const char *names[2] = {"tdist_quant_all_gather", "tdist_quant_all_to_all"};
    float x[8] = {1, 2, 3, 4, 5, 6, 7, 8}, out[24], keep[24];
    for (int i = 0; i < 24; i++) out[i] = keep[i] = -7.0f;
    char where[80];
    snprintf(where, sizeof where, ": rank %d group world: ", rank);
    for (int k = 0; k < 2; k++) {
        quant_fn f = fns[k];
        tdist_work_t *sentinel = (tdist_work_t *)(void *)&keep, *w = sentinel;
        expect_arg_err(f(pg, x, out, 2, TDIST_F64, TDIST_F16, NULL, &w), names[k], where);
        ASSERT_CONTAINS(tdist_last_error(), "dtype must be f32, not f64");
        expect_arg_err(f(pg, x, out, 2, TDIST_F16, TDIST_F16, NULL, NULL), names[k], "not f16");
        expect_arg_err(f(pg, x, out, 2, TDIST_F32, TDIST_F32, NULL, &w), names[k],
                       "wire format must be f16 or bf16, not f32");
        expect_arg_err(f(pg, x, out, 2, TDIST_F32, TDIST_I8, NULL, &w), names[k], "not i8");
        expect_arg_err(f(pg, x, out, 2, TDIST_F32, (tdist_dtype_t)-3, NULL, &w), names[k],
                       "not invalid (-3)");
        expect_arg_err(f(pg, x, out, SIZE_MAX / 8, TDIST_F32, TDIST_BF16, NULL, &w), names[k],
                       "group size 3 x 4 bytes overflows size_t");
        expect_arg_err(f(pg, x, out, SIZE_MAX / 2, TDIST_F32, TDIST_BF16, NULL, NULL), names[k],
                       "overflows size_t");
        expect_arg_err(f(pg, NULL, out, 2, TDIST_F32, TDIST_F16, NULL, &w), names[k],
                       "sendbuf is NULL with count 2");
        expect_arg_err(f(pg, x, NULL, 2, TDIST_F32, TDIST_F16, NULL, &w), names[k],
                       "recvbuf is NULL with count 2");
        expect_arg_err(f(NULL, x, out, 2, TDIST_F32, TDIST_F16, NULL, &w), names[k], "pg is NULL");
        ASSERT_TRUE(w == sentinel); /* out-parameter untouched */
        ASSERT_MEMEQ(out, keep, sizeof out);
        /* count 0: an empty collective, blocking and async, NULL buffers allowed */
        ASSERT_OK(f(pg, NULL, NULL, 0, TDIST_F32, TDIST_F16, NULL, NULL));
        ASSERT_OK(f(pg, NULL, NULL, 0, TDIST_F32, TDIST_BF16, NULL, &w));
        ASSERT_TRUE(w != sentinel);
        ASSERT_OK(tdist_work_wait(w, -1));
        tdist_work_free(w);
    }
    /* nothing was sent by the failed calls: the next collectives pair up */
    ASSERT_OK(tdist_quant_all_gather(pg, x, out, 8, TDIST_F32, TDIST_F16, NULL, NULL));
    for (int r = 0; r < n; r++)
        for (int i = 0; i < 8; i++) ASSERT_TRUE(out[r * 8 + i] == (float)(i + 1));
    ASSERT_OK(tdist_quant_all_to_all(pg, x, out, 2, TDIST_F32, TDIST_BF16, NULL, NULL));
    for (int r = 0; r < n; r++)
        for (int i = 0; i < 2; i++) ASSERT_TRUE(out[r * 2 + i] == (float)(rank * 2 + i + 1));
    tdist_pg_destroy(pg);
    tdist_world_destroy(wd);
}

TEST(quant_args_and_count_0, 60) { tdist_test_run_ranks(3, args_body, NULL); }

/* ------------------------------------- ranks that disagree on the wire */

static void mismatch_body(int rank, int n, void *arg)
{
    (void)n, (void)arg;
    tdist_world_t *wd;
    tdist_pg_t *pg;
    open_world(&wd, &pg, NULL);
    float x[H7_NX], out[NAG], keep[NAG];
    load(x, h7_x[rank], H7_NX);
    for (int i = 0; i < NAG; i++) out[i] = keep[i] = 3.0f;
    static _Atomic int next;
    int order[1];
    q_slot_t s = {.next = &next, .order = order, .out = out, .want = h7_x[rank]};
    tdist_coll_opts_t o;
    tdist_coll_opts_init(&o);
    o.on_complete = q_done;
    o.user_data = &s;
    tdist_work_t *w;
    tdist_dtype_t wire = rank == 0 ? TDIST_F16 : TDIST_BF16;
    ASSERT_OK(tdist_quant_all_gather(pg, x, out, H7_NX, TDIST_F32, wire, &o, &w));
    ASSERT_STATUS(tdist_work_wait(w, -1), TDIST_ERR_MISMATCH);
    ASSERT_CONTAINS(tdist_work_error(w), "collective mismatch");
    ASSERT_CONTAINS(tdist_work_error(w), "all_gather(f16");
    ASSERT_CONTAINS(tdist_work_error(w), "all_gather(bf16");
    tdist_work_free(w);
    ASSERT_EQ(atomic_load(&s.calls), 1);
    ASSERT_EQ(atomic_load(&s.status), TDIST_ERR_MISMATCH);
    ASSERT_MEMEQ(out, keep, sizeof out); /* not written on failure */
    /* the group's error is sticky: the next call fails itself, naming the
     * function, and its on_complete never runs */
    ASSERT_STATUS(tdist_quant_all_to_all(pg, x, out, 1, TDIST_F32, TDIST_F16, &o, &w),
                  TDIST_ERR_MISMATCH);
    ASSERT_CONTAINS(tdist_last_error(), "tdist_quant_all_to_all: ");
    ASSERT_EQ(atomic_load(&s.calls), 1);
    ASSERT_MEMEQ(out, keep, sizeof out);
    tdist_pg_destroy(pg);
    tdist_world_destroy(wd);
}

TEST(quant_wire_mismatch_fails_every_rank, 60) { tdist_test_run_ranks(3, mismatch_body, NULL); }

/* --------------------------------------------------- 1- and 2-rank groups */

static void subgroup_check(tdist_pg_t *g, const int *members, int world_rank)
{
    int n = tdist_pg_size(g), me = tdist_pg_rank(g);
    ASSERT_EQ(members[me], world_rank);
    float x[H7_NX], y[H7_NY], out[NAG];
    uint32_t want[NAG];
    load(x, h7_x[world_rank], H7_NX);
    for (int k = 0; k < 2; k++) {
        tdist_dtype_t wire = wires[k];
        ASSERT_OK(tdist_quant_all_gather(g, x, out, H7_NX, TDIST_F32, wire, NULL, NULL));
        for (int q = 0; q < n; q++)
            for (int i = 0; i < H7_NX; i++) want[q * H7_NX + i] = deq_x(wire, members[q], i);
        expect_bits(out, want, (size_t)n * H7_NX, "subgroup all_gather");
        /* all_to_all of Y (48 elements) in n blocks */
        int c = H7_NY / n;
        load(y, h7_y[world_rank], H7_NY);
        tdist_work_t *w;
        ASSERT_OK(tdist_quant_all_to_all(g, y, out, (size_t)c, TDIST_F32, wire, NULL, &w));
        ASSERT_OK(tdist_work_wait(w, -1));
        tdist_work_free(w);
        for (int q = 0; q < n; q++)
            for (int i = 0; i < c; i++) want[q * c + i] = deq_y(wire, members[q], me * c + i);
        expect_bits(out, want, H7_NY, "subgroup all_to_all");
    }
}

static void groups_body(int rank, int n, void *arg)
{
    (void)n, (void)arg;
    tdist_world_t *wd;
    tdist_pg_t *pg, *two = NULL, *one = NULL;
    open_world(&wd, &pg, NULL);
    const int pair[2] = {2, 0}, single[1] = {1};
    ASSERT_OK(tdist_pg_new_group(pg, pair, 2, NULL, &two));
    ASSERT_OK(tdist_pg_new_group(pg, single, 1, NULL, &one));
    ASSERT_TRUE((two != NULL) == (rank != 1));
    ASSERT_TRUE((one != NULL) == (rank == 1));
    if (two) subgroup_check(two, pair, rank);
    if (one) subgroup_check(one, single, rank);
    ASSERT_OK(tdist_barrier(pg, NULL, NULL));
    tdist_pg_destroy(one);
    tdist_pg_destroy(two);
    tdist_pg_destroy(pg);
    tdist_world_destroy(wd);
}

TEST(quant_1_and_2_rank_groups, 60) { tdist_test_run_ranks(3, groups_body, NULL); }

/* ------------------------------------------------------ bytes on the wire */


enum { WIRE_N = 1 << 18 };

/* Bytes that one collective (plus a barrier) put on lo, measured by rank 0. */
static uint64_t measure(tdist_pg_t *pg, int rank, int which, float *src, float *dst)
{
    ASSERT_OK(tdist_barrier(pg, NULL, NULL));
    uint64_t before = rank == 0 ? tdist_test_lo_tx_bytes() : 0;
    const size_t a2a = WIRE_N / 3;
    tdist_dtype_t wire = which % 3 == 1 ? TDIST_F16 : TDIST_BF16;
    if (which == 0)
        ASSERT_OK(tdist_all_gather(pg, src, dst, WIRE_N, TDIST_F32, NULL, NULL));
    else if (which < 3)
        ASSERT_OK(tdist_quant_all_gather(pg, src, dst, WIRE_N, TDIST_F32, wire, NULL, NULL));
    else if (which == 3)
        ASSERT_OK(tdist_all_to_all(pg, src, dst, a2a, TDIST_F32, NULL, NULL));
    else
        ASSERT_OK(tdist_quant_all_to_all(pg, src, dst, a2a, TDIST_F32, wire, NULL, NULL));
    ASSERT_OK(tdist_barrier(pg, NULL, NULL));
    return rank == 0 ? tdist_test_lo_tx_bytes() - before : 0;
}

static void bytes_body(int rank, int n, void *arg)
{
    (void)n, (void)arg;
    tdist_world_t *wd;
    tdist_pg_t *pg;
    open_world(&wd, &pg, "tcp");
    float *src = malloc(WIRE_N * sizeof *src), *dst = malloc(3 * WIRE_N * sizeof *dst);
    ASSERT_TRUE(src && dst);
    for (int i = 0; i < WIRE_N; i++) src[i] = (float)(i % 1000) * 0.25f;
    uint64_t b[6];
    for (int k = 0; k < 6; k++) b[k] = measure(pg, rank, k, src, dst);
    if (rank == 0) {
        /* payload: each rank sends its WIRE_N elements to 2 ranks (all_gather)
         * or WIRE_N / 3 to each of 2 ranks (all_to_all); on top of it lo
         * carries TCP/IP headers, acks, the fingerprints and two barriers */
        const double f32_payload[2] = {3.0 * 2 * WIRE_N * 4, 3.0 * 2 * (WIRE_N / 3) * 4};
        for (int k = 0; k < 6; k++) {
            double payload = f32_payload[k / 3] * (k % 3 == 0 ? 1.0 : 0.5);
            double ratio = (double)b[k] / (double)b[k / 3 * 3];
            static const char *what[6] = {"all_gather f32", "all_gather f16", "all_gather bf16",
                                          "all_to_all f32", "all_to_all f16", "all_to_all bf16"};
            printf("%s: %llu bytes on lo (payload %.0f), %.4f of f32's\n", what[k],
                   (unsigned long long)b[k], payload, ratio);
            if ((double)b[k] < payload || (double)b[k] > payload * 1.03 + 65536)
                FAIL("%s: %llu bytes on lo for a payload of %.0f", what[k],
                     (unsigned long long)b[k], payload);
            if (k % 3 != 0 && (ratio < 0.49 || ratio > 0.51))
                FAIL("%s moved %.4f of the f32 collective's bytes", what[k], ratio);
        }
    }
    free(src);
    free(dst);
    tdist_pg_destroy(pg);
    tdist_world_destroy(wd);
}


TEST(quant_wire_bytes_half_of_f32, 90)
{
    if (!tdist_test_private_loopback("quant_wire_bytes_half_of_f32")) return;
    tdist_test_run_ranks(3, bytes_body, NULL);
}
