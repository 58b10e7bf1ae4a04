/* tests/algorithms/test_compress.c — the 16-bit compression hooks and
 * wrappers (tdist/algorithms.h) against PyTorch and against a reference.
 *
 * 1. PyTorch itself: fp16_compress_hook under DDP, 2 ranks x 5 steps,
 *    SGD momentum, from PyTorch 1.13's recording (oracle_h1.h, generated
 *    by gen_oracle_h1.py from H1_w2.json). tdist is fed the recorded local
 *    gradients and every stage is checked BIT FOR BIT: the bucket order,
 *    the compressed wire values, the reduced wire values, the decompressed
 *    gradients, and the parameters after an SGD step written as PyTorch
 *    computes it (buf = fl(fl(buf * 0.9f) + g), p = fmaf(-lr, buf, p)),
 *    and after tdist's own SGD (tdist/optim.h), which rounds the same way.
 * 2. The reference (compress_ref.h) on the synthetic model, 2 ranks (one
 *    order of summation: bit for bit), f16 and bf16, hook and wrapper
 *    around tdist_ddp_allreduce_hook, shared memory and TCP, several
 *    buckets of f32 and f64; 3 and 4 ranks to the bound of the sum's
 *    rounding (tdist's association is not Gloo's ring's).
 * 3. Special values: NaN (signs, payloads), infinities, overflow to inf,
 *    subnormals, ties, on the wire bit for bit.
 * 4. A wrapper around a custom hook with a chain of continuations.
 * 5. Bad options and bad calls fail before any communication. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compress_ref.h"
#include "harness.h"
#include "oracle_h1.h"
#include "tdist/algorithms.h"
#include "tdist/optim.h"

/* ================================================= 1. against PyTorch */

/* What the observer saw in one step (one bucket). */
typedef struct h1_rec {
    int calls[2];                 /* [reduced] */
    size_t order[H1_NPARAMS];     /* the bucket's parameters */
    uint16_t wire[2][H1_N];       /* [reduced] */
} h1_rec_t;

static void h1_observe(void *arg, const tdist_ddp_bucket_t *b, const uint16_t *wire, bool reduced)
{
    h1_rec_t *r = arg;
    ASSERT_EQ(b->count, H1_N);
    ASSERT_EQ(b->num_params, H1_NPARAMS);
    for (size_t j = 0; j < H1_NPARAMS; j++) r->order[j] = b->param_indices[j];
    memcpy(r->wire[reduced], wire, sizeof r->wire[reduced]);
    r->calls[reduced]++;
}

/* Offset of parameter p in a bucket whose parameters come in order ord. */
static size_t offset_in(const size_t *ord, size_t p)
{
    size_t off = 0;
    for (size_t j = 0; ord[j] != p; j++) off += h1_counts[ord[j]];
    return off;
}

static size_t param_offset(size_t p)
{
    size_t off = 0;
    for (size_t j = 0; j < p; j++) off += h1_counts[j];
    return off;
}

/* tdist's wire values against PyTorch's, parameter by parameter (the
 * orders of step 0 differ, see h1_check_order). */
static void h1_check_wire(const char *what, int k, const size_t *ord, const uint16_t *got,
                          const uint16_t *want)
{
    size_t pt_ord[H1_NPARAMS];
    for (size_t j = 0; j < H1_NPARAMS; j++) pt_ord[j] = (size_t)h1_order[k][j];
    for (size_t p = 0; p < H1_NPARAMS; p++) {
        size_t a = offset_in(ord, p), b = offset_in(pt_ord, p);
        for (size_t i = 0; i < h1_counts[p]; i++)
            if (got[a + i] != want[b + i])
                FAIL("step %d %s of '%s'[%zu]: tdist 0x%04x, PyTorch 0x%04x", k, what, h1_names[p],
                     i, got[a + i], want[b + i]);
    }
}

/* R0.4: PyTorch's bucket holds model.parameters() order in step 0 and the
 * reversed (rebuilt) order from step 1. tdist lays buckets out in reverse
 * order from the start, so its step 0 already has the rebuilt order, and
 * the rebuild (rank 0's arrival order: the same) changes nothing. The
 * elementwise hook does not care: the wire values are compared per
 * parameter. */
static void h1_check_order(int k, const size_t *ord)
{
    for (size_t j = 0; j < H1_NPARAMS; j++) {
        size_t want = k == 0 ? H1_NPARAMS - 1 - j : (size_t)h1_order[k][j];
        if (ord[j] != want)
            FAIL("step %d: bucket position %zu holds parameter %zu, expected %zu", k, j, ord[j], want);
    }
}

/* tdist's SGD against PyTorch's parameters: bit for bit. */
static void h1_check_optim(int k, const float *p)
{
    for (size_t i = 0; i < H1_N; i++)
        if (bits32(p[i]) != h1_params_after[k][i])
            FAIL("step %d: tdist_optim SGD param %zu = 0x%08x, PyTorch 0x%08x", k, i, bits32(p[i]),
                 h1_params_after[k][i]);
}

static void h1_step(int rank, int k, tdist_ddp_t *ddp, float *g, h1_rec_t *rec)
{
    memset(rec, 0, sizeof *rec);
    ASSERT_OK(tdist_ddp_forward_begin(ddp));
    for (size_t i = 0; i < H1_N; i++) g[i] = f32_of(h1_local_grads[rank][k][i]);
    for (size_t p = H1_NPARAMS; p-- > 0;) ASSERT_OK(tdist_ddp_grad_ready(ddp, p)); /* autograd's order */
    ASSERT_OK(tdist_ddp_backward_end(ddp));
    ASSERT_EQ(rec->calls[0], 1);
    ASSERT_EQ(rec->calls[1], 1);
    h1_check_order(k, rec->order);
    h1_check_wire("compressed (all_reduce input)", k, rec->order, rec->wire[0], h1_wire_in[rank][k]);
    h1_check_wire("reduced (all_reduce output)", k, rec->order, rec->wire[1], h1_wire_out[k]);
    for (size_t i = 0; i < H1_N; i++)
        if (bits32(g[i]) != h1_grads[k][i])
            FAIL("step %d gradient %zu: tdist 0x%08x, PyTorch 0x%08x", k, i, bits32(g[i]),
                 h1_grads[k][i]);
}

static void h1_body(int rank, int n, void *arg)
{
    (void)arg;
    ASSERT_EQ(n, H1_RANKS);
    static float p[H1_N], g[H1_N], ref_p[H1_N], ref_buf[H1_N];
    static h1_rec_t rec;
    for (size_t i = 0; i < H1_N; i++) p[i] = ref_p[i] = f32_of(h1_init[i]);
    tdist_world_t *w;
    tdist_pg_t *pg;
    open_pg(&w, &pg);
    tdist_ddp_param_t params[H1_NPARAMS];
    tdist_optim_param_t op[H1_NPARAMS];
    for (size_t j = 0; j < H1_NPARAMS; j++) {
        size_t off = param_offset(j);
        params[j] = (tdist_ddp_param_t){p + off, g + off, h1_counts[j], TDIST_F32, h1_names[j]};
        op[j] = (tdist_optim_param_t){p + off, g + off, h1_counts[j], h1_names[j]};
    }
    tdist_ddp_t *ddp;
    ASSERT_OK(tdist_ddp_create(pg, params, H1_NPARAMS, NULL, 0, NULL, &ddp));
    tdist_compress_opts_t co;
    tdist_compress_opts_init(&co);
    co.observe = h1_observe;
    co.observe_arg = &rec;
    tdist_compress_t *hook;
    ASSERT_OK(tdist_compress_hook_create(&co, &hook));
    ASSERT_OK(tdist_compress_register(ddp, hook));
    tdist_optim_sgd_opts_t so;
    tdist_optim_sgd_opts_init(&so);
    so.lr = 0.1;
    so.momentum = 0.9;
    tdist_optim_t *opt;
    ASSERT_OK(tdist_optim_create_sgd(op, H1_NPARAMS, &so, &opt));
    for (int k = 0; k < H1_STEPS; k++) {
        h1_step(rank, k, ddp, g, &rec);
        /* SGD as PyTorch computes it (R0.3): bit for bit */
        for (size_t i = 0; i < H1_N; i++) {
            ref_buf[i] = k == 0 ? g[i] : ref_buf[i] * H1_MOMENTUM + g[i];
            ref_p[i] = fmaf(-H1_LR, ref_buf[i], ref_p[i]);
            if (bits32(ref_p[i]) != h1_params_after[k][i])
                FAIL("step %d param %zu: SGD on tdist's gradients 0x%08x, PyTorch 0x%08x", k, i,
                     bits32(ref_p[i]), h1_params_after[k][i]);
        }
        ASSERT_OK(tdist_optim_step(opt));
        h1_check_optim(k, p);
    }
    tdist_optim_destroy(opt);
    tdist_ddp_destroy(ddp);
    tdist_compress_destroy(hook);
    tdist_pg_destroy(pg);
    tdist_world_destroy(w);
}

TEST(compress_fp16_hook_pytorch_h1_bitwise, 60)
{
    tdist_test_run_ranks(H1_RANKS, h1_body, NULL);
}

/* ================================================ 2. against the reference */

typedef struct scen {
    int n;
    tdist_dtype_t wire;
    bool wrapper;         /* wrapper around tdist_ddp_allreduce_hook */
    const char *transport;
    int steps;
} scen_t;

/* What the observer saw per bucket: the compressed values must equal the
 * reference's at once (checked in the callback). */
typedef struct obs {
    const scen_t *sc;
    int rank, step;
    int calls[2];
} obs_t;

/* The expected wire value of element i of parameter p on rank r. */
static uint16_t wire_in(const scen_t *sc, int r, int k, int p, size_t i, int64_t divisor)
{
    float g = (float)sm_local(r, k, 1, p, i);
    return sc->wrapper ? ref_cast16(g, sm_dtype[p] == TDIST_F32, sc->wire)
                       : ref_hook16(g, divisor, sc->wire);
}

static void obs_fn(void *arg, const tdist_ddp_bucket_t *b, const uint16_t *wire, bool reduced)
{
    obs_t *o = arg;
    o->calls[reduced]++;
    if (reduced) return;
    for (size_t j = 0; j < b->num_params; j++) {
        int p = (int)b->param_indices[j];
        for (size_t i = 0; i < b->counts[j]; i++) {
            uint16_t want = wire_in(o->sc, o->rank, o->step, p, i, b->divisor);
            uint16_t got = wire[b->offsets[j] + i];
            if (got != want)
                FAIL("step %d '%s'[%zu] on the wire: 0x%04x, expected 0x%04x (g = %.9g)", o->step,
                     sm_name[p], i, got, want, sm_local(o->rank, o->step, 1, p, i));
        }
    }
}

/* The expected reduced value: the ranks' contributions summed in rank
 * order (the wrapper's inner all_reduce scales each by 1/n first). */
static uint16_t expected16(const scen_t *sc, int k, int p, size_t i)
{
    uint16_t acc = 0;
    for (int r = 0; r < sc->n; r++) {
        uint16_t h = wire_in(sc, r, k, p, i, sc->n);
        if (sc->wrapper) h = to16(from16(h, sc->wire) * (float)(1.0 / sc->n), sc->wire);
        acc = r == 0 ? h : ref_add16(acc, h, sc->wire);
    }
    return acc;
}

/* With 3+ ranks the sum's association is tdist's: within the rounding of
 * n - 1 additions of the exact sum of the contributions. */
static void expect_close(int k, int p, size_t i, double got, const scen_t *sc)
{
    double exact = 0, mag = 0;
    for (int r = 0; r < sc->n; r++) {
        double h = (double)from16(wire_in(sc, r, k, p, i, sc->n), sc->wire);
        exact += h;
        mag += fabs(h);
    }
    double u = sc->wire == TDIST_F16 ? ldexp(1, -11) : ldexp(1, -8);
    double tiny = sc->wire == TDIST_F16 ? ldexp(1, -24) : 0;
    if (fabs(got - exact) > (double)(sc->n - 1) * (u * mag + tiny))
        FAIL("step %d '%s'[%zu]: %.9g, exact sum of the wire values %.9g", k, sm_name[p], i, got,
             exact);
}

static void ref_step(const scen_t *sc, int rank, int k, tdist_ddp_t *ddp, sm_model_t *md, obs_t *o)
{
    o->step = k;
    o->calls[0] = o->calls[1] = 0;
    ASSERT_OK(tdist_ddp_forward_begin(ddp));
    for (int p = 0; p < SM_NP; p++)
        for (size_t i = 0; i < sm_count[p]; i++) sm_set(md->grad[p], sm_dtype[p], i, sm_local(rank, k, 1, p, i));
    for (int p = SM_NP; p-- > 0;) ASSERT_OK(tdist_ddp_grad_ready(ddp, (size_t)p));
    ASSERT_OK(tdist_ddp_backward_end(ddp));
    ASSERT_EQ(o->calls[0], tdist_ddp_num_buckets(ddp));
    ASSERT_EQ(o->calls[1], tdist_ddp_num_buckets(ddp));
    for (int p = 0; p < SM_NP; p++)
        for (size_t i = 0; i < sm_count[p]; i++) {
            double got = sm_get(md->grad[p], sm_dtype[p], i);
            if (sc->n == 2)
                expect_value("reduced", k, p, i, got, expected16(sc, k, p, i), sc->wire);
            else
                expect_close(k, p, i, got, sc);
        }
}

static void ref_body(int rank, int n, void *arg)
{
    const scen_t *sc = arg;
    ASSERT_EQ(n, sc->n);
    static sm_model_t md;
    sm_init(&md, rank);
    tdist_world_t *w;
    tdist_pg_t *pg;
    open_pg(&w, &pg);
    tdist_ddp_opts_t o;
    tdist_ddp_opts_init(&o);
    o.bucket_cap_bytes = o.first_bucket_bytes = 512; /* several buckets */
    tdist_ddp_t *ddp;
    ASSERT_OK(tdist_ddp_create(pg, md.params, SM_NP, NULL, 0, &o, &ddp));
    ASSERT_TRUE(tdist_ddp_num_buckets(ddp) >= 4);
    obs_t ob = {sc, rank, 0, {0, 0}};
    tdist_compress_opts_t co;
    tdist_compress_opts_init(&co);
    co.wire = sc->wire;
    co.observe = obs_fn;
    co.observe_arg = &ob;
    tdist_compress_t *c;
    if (sc->wrapper)
        ASSERT_OK(tdist_compress_wrapper_create(tdist_ddp_allreduce_hook, NULL, NULL, &co, &c));
    else
        ASSERT_OK(tdist_compress_hook_create(&co, &c));
    ASSERT_OK(tdist_compress_register(ddp, c));
    for (int k = 0; k < sc->steps; k++) ref_step(sc, rank, k, ddp, &md, &ob);
    tdist_ddp_destroy(ddp);
    tdist_compress_destroy(c);
    tdist_pg_destroy(pg);
    tdist_world_destroy(w);
}

static void run_scen(const scen_t *sc)
{
    ASSERT_TRUE(!sc->wrapper || sc->n == 2); /* 1/n is a true division for n = 2 only */
    tdist_ranks_opts_t o;
    tdist_ranks_opts_init(&o, sc->n);
    char env[64];
    const char *envs[2] = {NULL, NULL};
    if (sc->transport) {
        snprintf(env, sizeof env, "TDIST_TRANSPORT=%s", sc->transport);
        envs[0] = env;
        o.env = envs;
    }
    tdist_rank_result_t res[8];
    int failed = tdist_test_spawn_ranks(&o, ref_body, (void *)sc, res);
    for (int r = 0; r < sc->n; r++) {
        char why[128];
        if (!res[r].exited || res[r].code != 0)
            FAIL("rank %d %s", r, tdist_test_describe(&res[r], why, sizeof why));
    }
    ASSERT_EQ(failed, 0);
}

TEST(compress_fp16_hook_2_ranks_shm, 60) { run_scen(&(scen_t){2, TDIST_F16, false, "shm", 3}); }
TEST(compress_fp16_hook_2_ranks_tcp, 60) { run_scen(&(scen_t){2, TDIST_F16, false, "tcp", 3}); }
TEST(compress_bf16_hook_2_ranks_shm, 60) { run_scen(&(scen_t){2, TDIST_BF16, false, "shm", 3}); }
TEST(compress_bf16_hook_2_ranks_tcp, 60) { run_scen(&(scen_t){2, TDIST_BF16, false, "tcp", 3}); }
TEST(compress_fp16_wrapper_allreduce_2_ranks, 60) { run_scen(&(scen_t){2, TDIST_F16, true, NULL, 3}); }
TEST(compress_bf16_wrapper_allreduce_2_ranks_tcp, 60) { run_scen(&(scen_t){2, TDIST_BF16, true, "tcp", 3}); }
TEST(compress_fp16_hook_3_ranks, 60) { run_scen(&(scen_t){3, TDIST_F16, false, NULL, 2}); }
TEST(compress_bf16_hook_4_ranks_tcp, 90) { run_scen(&(scen_t){4, TDIST_BF16, false, "tcp", 2}); }

/* ==================================================== 3. special values */

/* Inputs (f32 bits) and PyTorch's wire values: the hook (division by 2)
 * f16 and bf16, the wrappers' cast f16 and bf16 (from f32). */
typedef struct special {
    uint32_t in;
    uint16_t hook_f16, hook_bf16, cast_f16, cast_bf16;
} special_t;

static const special_t specials[] = {
    {0x7fc00000, 0x7e00, 0x7fc0, 0x7e00, 0xffff}, /* NaN */
    {0xffc00000, 0xfe00, 0x7fc0, 0xfe00, 0xffff}, /* -NaN (x86's default NaN) */
    {0x7f800001, 0x7e00, 0x7fc0, 0x7e00, 0xffff}, /* signalling NaN */
    {0xffffffff, 0xfe00, 0x7fc0, 0xffff, 0xffff}, /* -NaN, full payload */
    {0x7f800000, 0x7c00, 0x7f80, 0x7c00, 0x7f80}, /* inf */
    {0xff800000, 0xfc00, 0xff80, 0xfc00, 0xff80}, /* -inf */
    {0x477fe000, 0x77ff, 0x4700, 0x7bff, 0x4780}, /* 65504, f16's largest */
    {0x477ff000, 0x7c00, 0x4700, 0x7c00, 0x4780}, /* 65520: f16 overflows */
    {0x47c35000, 0x7c00, 0x4743, 0x7c00, 0x47c3}, /* 1e5 */
    {0x3f801000, 0x3800, 0x3f00, 0x3c00, 0x3f80}, /* 1 + 2^-11: f16 tie, to even (down) */
    {0x3f803000, 0x3802, 0x3f00, 0x3c02, 0x3f80}, /* 1 + 3 * 2^-11: f16 tie, to even (up) */
    {0x3f808000, 0x3804, 0x3f00, 0x3c04, 0x3f80}, /* 1 + 2^-8: bf16 tie, to even */
    {0x33800000, 0x0000, 0x3300, 0x0001, 0x3380}, /* 2^-24: f16's smallest subnormal */
    {0x34400000, 0x0002, 0x33c0, 0x0003, 0x3440}, /* 3 * 2^-24 */
    {0x387fc000, 0x0200, 0x3800, 0x03ff, 0x3880}, /* f16's largest subnormal */
    {0x80000000, 0x8000, 0x8000, 0x8000, 0x8000}, /* -0 */
    {0x3089705f, 0x0000, 0x3009, 0x0000, 0x3089}, /* 1e-9 */
};
#define NSPEC (sizeof specials / sizeof specials[0])
#define SPEC_N 64 /* the specials, then ordinary values */

typedef struct spec_mode {
    tdist_dtype_t wire;
    bool wrapper;
} spec_mode_t;

static uint16_t spec_want(const spec_mode_t *m, const special_t *s)
{
    if (m->wrapper) return m->wire == TDIST_F16 ? s->cast_f16 : s->cast_bf16;
    return m->wire == TDIST_F16 ? s->hook_f16 : s->hook_bf16;
}

typedef struct spec_obs {
    const spec_mode_t *m;
    int seen;
} spec_obs_t;

/* f32 bucket: the table bit for bit (and the ordinary values as the
 * reference); f64 bucket: NaN and 1.0 (bf16 NaN from f64 is 0x7FC0). */
static void spec_observe(void *arg, const tdist_ddp_bucket_t *b, const uint16_t *wire, bool reduced)
{
    spec_obs_t *o = arg;
    if (reduced) return;
    o->seen++;
    if (b->dtype == TDIST_F64) {
        uint16_t nan = o->m->wire == TDIST_F16 ? 0x7e00 : 0x7fc0;
        uint16_t one = o->m->wire == TDIST_F16 ? (o->m->wrapper ? 0x3c00 : 0x3800)
                                               : (o->m->wrapper ? 0x3f80 : 0x3f00);
        ASSERT_EQ(wire[0], nan);
        ASSERT_EQ(wire[1], one);
        return;
    }
    for (size_t i = 0; i < SPEC_N; i++) {
        float g = f32_of(i < NSPEC ? specials[i].in : bits32((float)(0.25 * (double)i - 3.3)));
        uint16_t want = i < NSPEC ? spec_want(o->m, &specials[i])
                        : o->m->wrapper ? ref_cast16(g, true, o->m->wire)
                                        : ref_hook16(g, 2, o->m->wire);
        if (wire[i] != want)
            FAIL("%s %s: input 0x%08x on the wire as 0x%04x, expected 0x%04x",
                 tdist_dtype_name(o->m->wire), o->m->wrapper ? "wrapper" : "hook", bits32(g),
                 wire[i], want);
    }
}

static void spec_run(tdist_pg_t *pg, const spec_mode_t *m)
{
    float p[SPEC_N] = {0}, g[SPEC_N];
    double pd[2] = {0}, gd[2];
    tdist_ddp_param_t params[2] = {{p, g, SPEC_N, TDIST_F32, "w"}, {pd, gd, 2, TDIST_F64, "d"}};
    tdist_ddp_t *ddp;
    ASSERT_OK(tdist_ddp_create(pg, params, 2, NULL, 0, NULL, &ddp));
    spec_obs_t ob = {m, 0};
    tdist_compress_opts_t co;
    tdist_compress_opts_init(&co);
    co.wire = m->wire;
    co.observe = spec_observe;
    co.observe_arg = &ob;
    tdist_compress_t *c;
    if (m->wrapper)
        ASSERT_OK(tdist_compress_wrapper_create(tdist_ddp_allreduce_hook, NULL, NULL, &co, &c));
    else
        ASSERT_OK(tdist_compress_hook_create(&co, &c));
    ASSERT_OK(tdist_compress_register(ddp, c));
    ASSERT_OK(tdist_ddp_forward_begin(ddp));
    for (size_t i = 0; i < SPEC_N; i++)
        g[i] = f32_of(i < NSPEC ? specials[i].in : bits32((float)(0.25 * (double)i - 3.3)));
    gd[0] = NAN;
    gd[1] = 1.0;
    ASSERT_OK(tdist_ddp_grad_ready(ddp, 1));
    ASSERT_OK(tdist_ddp_grad_ready(ddp, 0));
    ASSERT_OK(tdist_ddp_backward_end(ddp));
    ASSERT_EQ(ob.seen, 2);
    /* both ranks sent the same values: the result is their 16-bit sum */
    for (size_t i = 0; i < SPEC_N; i++) {
        float in = f32_of(i < NSPEC ? specials[i].in : bits32((float)(0.25 * (double)i - 3.3)));
        uint16_t h = i < NSPEC ? spec_want(m, &specials[i])
                     : m->wrapper ? ref_cast16(in, true, m->wire) : ref_hook16(in, 2, m->wire);
        if (m->wrapper) h = to16(from16(h, m->wire) * 0.5f, m->wire); /* the inner 1/2 */
        uint16_t want = ref_add16(h, h, m->wire);
        if (nan16(want, m->wire) ? !isnan(g[i]) : g[i] != from16(want, m->wire))
            FAIL("input 0x%08x reduced to %.9g, expected %.9g", bits32(in), (double)g[i],
                 (double)from16(want, m->wire));
    }
    ASSERT_TRUE(isnan(gd[0]) && gd[1] == 1.0);
    tdist_ddp_destroy(ddp);
    tdist_compress_destroy(c);
}

static void spec_body(int rank, int n, void *arg)
{
    (void)rank;
    (void)arg;
    ASSERT_EQ(n, 2);
    tdist_world_t *w;
    tdist_pg_t *pg;
    open_pg(&w, &pg);
    static const spec_mode_t modes[4] = {
        {TDIST_F16, false}, {TDIST_BF16, false}, {TDIST_F16, true}, {TDIST_BF16, true}};
    for (int i = 0; i < 4; i++) spec_run(pg, &modes[i]);
    tdist_pg_destroy(pg);
    tdist_world_destroy(w);
}

TEST(compress_special_values_on_the_wire, 60)
{
    tdist_test_run_ranks(2, spec_body, NULL);
}

/* ======================================= 4. wrapper around a custom hook */

/* The inner hook: all_reduce SUM of the 16-bit bucket; continuation 1
 * divides by the divisor in place and broadcasts from rank 0; continuation
 * 2 only records. The order of events is recorded per iteration. */
typedef struct chain {
    tdist_dtype_t wire;
    int seq, hook_at, then1_at, then2_at, reduced_at;
    const void *b16; /* the 16-bit bucket the hook saw */
} chain_t;

static void chain_check(const chain_t *c, const tdist_ddp_bucket_t *b)
{
    ASSERT_EQ(b->dtype, c->wire);
    ASSERT_TRUE((const void *)b == c->b16);
    ASSERT_EQ(b->count, 100);
    ASSERT_EQ(b->divisor, 2);
}

static tdist_status_t chain_then2(void *state, const tdist_ddp_bucket_t *b, tdist_ddp_hook_result_t *next)
{
    (void)next;
    chain_t *c = state;
    chain_check(c, b);
    c->then2_at = ++c->seq;
    return TDIST_OK;
}

static tdist_status_t chain_then1(void *state, const tdist_ddp_bucket_t *b, tdist_ddp_hook_result_t *next)
{
    chain_t *c = state;
    chain_check(c, b);
    c->then1_at = ++c->seq;
    ASSERT_OK(tdist_divide(b->buffer, b->count, b->dtype, b->divisor));
    next->then = chain_then2;
    return tdist_broadcast(b->pg, b->buffer, b->count, b->dtype, 0, NULL, &next->work);
}

static tdist_status_t chain_hook(void *state, const tdist_ddp_bucket_t *b, tdist_ddp_hook_result_t *res)
{
    chain_t *c = state;
    c->b16 = b;
    chain_check(c, b);
    c->hook_at = ++c->seq;
    res->then = chain_then1;
    return tdist_all_reduce(b->pg, b->buffer, b->buffer, b->count, b->dtype, TDIST_SUM, NULL, &res->work);
}

static void chain_observe(void *arg, const tdist_ddp_bucket_t *b, const uint16_t *wire, bool reduced)
{
    (void)b;
    (void)wire;
    chain_t *c = arg;
    if (reduced) c->reduced_at = ++c->seq;
}

static float chain_grad(int r, int k, size_t i) { return (float)(0.3 * sin(0.9 * r + 1.7 * k + 0.21 * (double)i)); }

static void chain_body(int rank, int n, void *arg)
{
    const tdist_dtype_t wire = *(const tdist_dtype_t *)arg;
    ASSERT_EQ(n, 2);
    tdist_world_t *w;
    tdist_pg_t *pg;
    open_pg(&w, &pg);
    float p[100] = {0}, g[100];
    tdist_ddp_param_t param = {p, g, 100, TDIST_F32, "w"};
    tdist_ddp_t *ddp;
    ASSERT_OK(tdist_ddp_create(pg, &param, 1, NULL, 0, NULL, &ddp));
    chain_t ch = {.wire = wire};
    tdist_compress_opts_t co;
    tdist_compress_opts_init(&co);
    co.wire = wire;
    co.observe = chain_observe;
    co.observe_arg = &ch;
    tdist_compress_t *c;
    ASSERT_OK(tdist_compress_wrapper_create(chain_hook, &ch, "chain_hook", &co, &c));
    ASSERT_OK(tdist_compress_register(ddp, c));
    for (int k = 0; k < 3; k++) {
        ch.seq = ch.hook_at = ch.then1_at = ch.then2_at = ch.reduced_at = 0;
        ASSERT_OK(tdist_ddp_forward_begin(ddp));
        for (size_t i = 0; i < 100; i++) g[i] = chain_grad(rank, k, i);
        ASSERT_OK(tdist_ddp_grad_ready(ddp, 0));
        ASSERT_OK(tdist_ddp_backward_end(ddp));
        /* hook, continuation 1, continuation 2, then the cast back */
        ASSERT_EQ(ch.hook_at, 1);
        ASSERT_EQ(ch.then1_at, 2);
        ASSERT_EQ(ch.then2_at, 3);
        ASSERT_EQ(ch.reduced_at, 4);
        for (size_t i = 0; i < 100; i++) {
            uint16_t s = ref_add16(ref_cast16(chain_grad(0, k, i), true, wire),
                                   ref_cast16(chain_grad(1, k, i), true, wire), wire);
            float want = from16(to16(from16(s, wire) / 2.0f, wire), wire);
            if (g[i] != want) FAIL("step %d [%zu]: %.9g, expected %.9g", k, i, (double)g[i], (double)want);
        }
    }
    tdist_ddp_destroy(ddp);
    tdist_compress_destroy(c);
    tdist_pg_destroy(pg);
    tdist_world_destroy(w);
}

TEST(compress_fp16_wrapper_custom_hook_chain, 60)
{
    static const tdist_dtype_t wire = TDIST_F16;
    tdist_test_run_ranks(2, chain_body, (void *)&wire);
}

TEST(compress_bf16_wrapper_custom_hook_chain, 60)
{
    static const tdist_dtype_t wire = TDIST_BF16;
    tdist_test_run_ranks(2, chain_body, (void *)&wire);
}

/* ================================================ 5. bad options, bad calls */

TEST(compress_bad_options_fail_at_create, 10)
{
    tdist_compress_t *sentinel = (tdist_compress_t *)(uintptr_t)0x1234, *c = sentinel;
    tdist_compress_opts_t o;
    tdist_compress_opts_init(&o);
    ASSERT_EQ(o.wire, TDIST_F16);
    tdist_compress_opts_init(NULL);
    o.wire = TDIST_F32;
    ASSERT_STATUS(tdist_compress_hook_create(&o, &c), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "opts.wire is f32; the wire format must be f16 or bf16");
    o.wire = TDIST_I8;
    ASSERT_STATUS(tdist_compress_wrapper_create(tdist_ddp_allreduce_hook, NULL, NULL, &o, &c),
                  TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "tdist_compress_wrapper_create: opts.wire is i8");
    ASSERT_TRUE(c == sentinel); /* out untouched on failure */
    ASSERT_STATUS(tdist_compress_hook_create(NULL, NULL), TDIST_ERR_INVALID_ARG);
    ASSERT_STATUS(tdist_compress_wrapper_create(NULL, NULL, "x", NULL, &c), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "inner is NULL");
    ASSERT_STATUS(tdist_compress_wrapper_create(chain_hook, NULL, NULL, NULL, &c), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "inner_name is NULL");
    ASSERT_STATUS(tdist_compress_wrapper_create(chain_hook, NULL, "", NULL, &c), TDIST_ERR_INVALID_ARG);
    ASSERT_STATUS(tdist_compress_wrapper_create(tdist_compress_hook, NULL, NULL, NULL, &c),
                  TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "inner_state is NULL");
    ASSERT_TRUE(c == sentinel);
    ASSERT_STATUS(tdist_compress_register(NULL, NULL), TDIST_ERR_INVALID_ARG);
    tdist_ddp_hook_result_t res = {0};
    ASSERT_STATUS(tdist_compress_hook(NULL, NULL, &res), TDIST_ERR_INVALID_ARG);
    /* tdist's own hooks are named for the agreement */
    tdist_compress_t *inner, *outer;
    ASSERT_OK(tdist_compress_hook_create(NULL, &inner));
    ASSERT_OK(tdist_compress_wrapper_create(tdist_compress_hook, inner, NULL, NULL, &outer));
    tdist_compress_destroy(outer);
    tdist_compress_destroy(inner);
    tdist_compress_destroy(NULL);
}

/* A hand-made bucket over buf. */
static tdist_ddp_bucket_t hand_bucket(tdist_pg_t *pg, void *buf, size_t count, tdist_dtype_t dt,
                                      int64_t divisor)
{
    static const size_t zero = 0;
    static size_t cnt;
    cnt = count;
    return (tdist_ddp_bucket_t){.index = 0, .num_buckets = 1, .is_last = true, .buffer = buf,
                                .count = count, .dtype = dt, .num_params = 1, .param_indices = &zero,
                                .offsets = &zero, .counts = &cnt, .iteration = 1,
                                .divisor = divisor, .pg = pg};
}

static void bad_call_body(int rank, int n, void *arg)
{
    (void)arg;
    ASSERT_EQ(n, 2);
    tdist_world_t *w;
    tdist_pg_t *pg;
    open_pg(&w, &pg);
    tdist_compress_t *c;
    ASSERT_OK(tdist_compress_hook_create(NULL, &c));
    int32_t ibuf[10] = {0};
    float fbuf[10];
    tdist_ddp_hook_result_t res = {0};
    if (rank == 0) {
        /* refused on this rank alone, before any communication: the
         * barrier below would otherwise meet the hook's agreement */
        tdist_ddp_bucket_t b = hand_bucket(pg, ibuf, 10, TDIST_I32, 2);
        ASSERT_STATUS(tdist_compress_hook(c, &b, &res), TDIST_ERR_INVALID_ARG);
        ASSERT_CONTAINS(tdist_last_error(), "tdist_compress_hook: rank 0 group world iteration 1 "
                                            "bucket 0: fp16_compress_hook: the bucket's dtype is i32");
        b = hand_bucket(pg, fbuf, 10, TDIST_F32, 0);
        ASSERT_STATUS(tdist_compress_hook(c, &b, &res), TDIST_ERR_INVALID_ARG);
        ASSERT_CONTAINS(tdist_last_error(), "divisor 0 < 1");
        b = hand_bucket(pg, fbuf, 10, TDIST_F32, 2);
        ASSERT_STATUS(tdist_compress_hook(NULL, &b, &res), TDIST_ERR_INVALID_ARG);
        ASSERT_CONTAINS(tdist_last_error(), "tdist_compress_register");
        ASSERT_TRUE(res.work == NULL && res.then == NULL);
    }
    ASSERT_OK(tdist_barrier(pg, NULL, NULL));
    /* the hook by hand, outside DDP: agreement, then an f32 bucket's one
     * all_reduce over the 16-bit wire, which leaves the result in place
     * (no continuation) */
    for (int i = 0; i < 10; i++) fbuf[i] = (float)(rank + 1) * (float)(i + 1);
    tdist_ddp_bucket_t b = hand_bucket(pg, fbuf, 10, TDIST_F32, 2);
    ASSERT_OK(tdist_compress_hook(c, &b, &res));
    ASSERT_TRUE(res.work != NULL && res.then == NULL);
    ASSERT_OK(tdist_work_wait(res.work, -1));
    tdist_work_free(res.work);
    for (int i = 0; i < 10; i++) ASSERT_TRUE(fbuf[i] == 1.5f * (float)(i + 1));
    /* an f64 bucket: cast into the staging buffer, 16-bit all_reduce,
     * continuation casting back */
    double dbuf[10];
    for (int i = 0; i < 10; i++) dbuf[i] = (double)(rank + 1) * (double)(i + 1);
    b = hand_bucket(pg, dbuf, 10, TDIST_F64, 2);
    ASSERT_OK(tdist_compress_hook(c, &b, &res));
    ASSERT_TRUE(res.work != NULL && res.then != NULL);
    ASSERT_OK(tdist_work_wait(res.work, -1));
    tdist_work_free(res.work);
    tdist_ddp_hook_result_t next = {0};
    ASSERT_OK(res.then(c, &b, &next));
    ASSERT_TRUE(next.work == NULL && next.then == NULL);
    for (int i = 0; i < 10; i++) ASSERT_TRUE(dbuf[i] == 1.5 * (double)(i + 1));
    /* one state, one group */
    tdist_pg_t *sub;
    const int both[2] = {1, 0};
    ASSERT_OK(tdist_pg_new_group(pg, both, 2, NULL, &sub));
    b = hand_bucket(sub, fbuf, 10, TDIST_F32, 2);
    ASSERT_STATUS(tdist_compress_hook(c, &b, &res), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "use one state per reducer");
    /* registration */
    float p[4] = {0}, g[4] = {0};
    tdist_ddp_param_t param = {p, g, 4, TDIST_F32, "w"};
    tdist_ddp_t *ddp;
    ASSERT_OK(tdist_ddp_create(pg, &param, 1, NULL, 0, NULL, &ddp));
    ASSERT_STATUS(tdist_compress_register(ddp, NULL), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "the compression state is NULL");
    tdist_compress_t *c2;
    ASSERT_OK(tdist_compress_hook_create(NULL, &c2));
    ASSERT_OK(tdist_compress_register(ddp, c2));
    ASSERT_STATUS(tdist_compress_register(ddp, c2), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "already registered");
    tdist_ddp_destroy(ddp);
    tdist_compress_destroy(c2);
    tdist_compress_destroy(c);
    tdist_pg_destroy(sub);
    tdist_pg_destroy(pg);
    tdist_world_destroy(w);
}

TEST(compress_bad_calls_fail_before_communication, 60)
{
    tdist_test_run_ranks(2, bad_call_body, NULL);
}

/* ====================== 6. the all_reduce over a 16-bit wire (tdist/pg.h)
 *
 * What the hook runs on f32 buckets, called directly: each rank splits
 * the same flat vector into buffers its own way (empty ones included,
 * several staging chunks in all); the result must be, bit for bit, the
 * 16-bit all_reduce of the reference's packed values (the same sum on
 * every route), and with 2 ranks the reference's rank-order sum itself. */

#define WIRE_N 300000
#define WIRE_SPLITS 8

/* Element i of rank r: magnitudes 1e-7 .. 6e4 of both signs, an infinity
 * now and then, values whose f16 sum overflows. */
static float wire_val(int r, size_t i)
{
    if (i % 9973 == 17) return r == 1 ? INFINITY : 1.0f;
    if (i % 7919 == 5) return 60000.0f;
    double m = pow(10.0, (double)((i * 7 + (size_t)r * 3) % 12) - 7.0);
    return (float)(m * sin((double)i * 0.37 + (double)r * 1.3) * 6.0);
}

static void wire_check(int rank, int n, tdist_pg_t *pg, tdist_dtype_t wire, double divisor,
                       bool async)
{
    float *x = malloc(WIRE_N * sizeof *x);
    uint16_t *h = malloc(WIRE_N * sizeof *h);
    ASSERT_TRUE(x && h);
    for (size_t i = 0; i < WIRE_N; i++) {
        x[i] = wire_val(rank, i);
        h[i] = ref_hook16(x[i], (int64_t)divisor, wire);
    }
    /* rank-dependent buffers over x */
    size_t cuts[WIRE_SPLITS] = {0, 0, 1, 37, 1000 + (size_t)rank * 5000, 150000, 150000,
                                299995 - (size_t)rank};
    void *bufs[WIRE_SPLITS + 1];
    size_t counts[WIRE_SPLITS + 1];
    for (size_t k = 0; k <= WIRE_SPLITS; k++) {
        size_t lo = k ? cuts[k - 1] : 0, hi = k < WIRE_SPLITS ? cuts[k] : WIRE_N;
        bufs[k] = x + lo;
        counts[k] = hi - lo;
    }
    tdist_work_t *wk = NULL;
    ASSERT_OK(tdist_all_reduce_wire(pg, bufs, counts, WIRE_SPLITS + 1, wire, divisor, NULL,
                                    async ? &wk : NULL));
    if (async) {
        ASSERT_OK(tdist_work_wait(wk, -1));
        tdist_work_free(wk);
    }
    ASSERT_OK(tdist_all_reduce(pg, h, h, WIRE_N, wire, TDIST_SUM, NULL, NULL));
    for (size_t i = 0; i < WIRE_N; i++) {
        float want = from16(h[i], wire);
        if (bits32(x[i]) != bits32(want))
            FAIL("%d ranks %s / %g element %zu: 0x%08x, the 16-bit all_reduce gives 0x%08x", n,
                 tdist_dtype_name(wire), divisor, i, bits32(x[i]), bits32(want));
        if (n != 2) continue;
        uint16_t s = ref_add16(ref_hook16(wire_val(0, i), (int64_t)divisor, wire),
                               ref_hook16(wire_val(1, i), (int64_t)divisor, wire), wire);
        if (bits32(x[i]) != bits32(from16(s, wire)))
            FAIL("2 ranks %s element %zu: 0x%08x, the reference 0x%04x", tdist_dtype_name(wire), i,
                 bits32(x[i]), s);
    }
    free(x);
    free(h);
}

static void wire_body(int rank, int n, void *arg)
{
    (void)arg;
    tdist_world_t *w;
    tdist_pg_t *pg;
    open_pg(&w, &pg);
    wire_check(rank, n, pg, TDIST_F16, (double)n, false);
    wire_check(rank, n, pg, TDIST_BF16, n == 2 ? 2.0 : 3.0, true);
    wire_check(rank, n, pg, TDIST_F16, 1.0, true);
    /* refused before anything is sent */
    float v[4] = {1, 2, 3, 4};
    void *b[1] = {v};
    size_t c[1] = {4};
    ASSERT_STATUS(tdist_all_reduce_wire(pg, b, c, 1, TDIST_F32, 1.0, NULL, NULL),
                  TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "the wire is f32; it must be f16 or bf16");
    ASSERT_STATUS(tdist_all_reduce_wire(pg, b, c, 1, TDIST_F16, 0.0, NULL, NULL),
                  TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "divisor 0: it must be finite and above 0");
    b[0] = NULL;
    ASSERT_STATUS(tdist_all_reduce_wire(pg, b, c, 1, TDIST_F16, 1.0, NULL, NULL),
                  TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "bufs[0] is NULL with 4 elements");
    /* another wire on one rank: a mismatch on every rank, naming both */
    b[0] = v;
    if (n > 1) {
        tdist_dtype_t wt = rank == 1 ? TDIST_BF16 : TDIST_F16;
        ASSERT_STATUS(tdist_all_reduce_wire(pg, b, c, 1, wt, 1.0, NULL, NULL), TDIST_ERR_MISMATCH);
        ASSERT_CONTAINS(tdist_last_error(), "all_reduce_wire(f16, 4, sum)");
        ASSERT_CONTAINS(tdist_last_error(), "all_reduce_wire(bf16, 4, sum)");
    }
    tdist_pg_destroy(pg);
    tdist_world_destroy(w);
}

static void wire_run(int n, const char *transport)
{
    tdist_ranks_opts_t o;
    tdist_ranks_opts_init(&o, n);
    char env[64];
    const char *envs[2] = {env, NULL};
    snprintf(env, sizeof env, "TDIST_TRANSPORT=%s", transport);
    o.env = envs;
    tdist_rank_result_t res[4];
    int failed = tdist_test_spawn_ranks(&o, wire_body, NULL, res);
    for (int r = 0; r < n; r++) {
        char why[128];
        if (!res[r].exited || res[r].code != 0)
            FAIL("%d ranks %s: rank %d %s", n, transport, r,
                 tdist_test_describe(&res[r], why, sizeof why));
    }
    ASSERT_EQ(failed, 0);
}

TEST(compress_all_reduce_wire_1_2_3_ranks_shm_tcp, 90)
{
    wire_run(2, "shm");
    wire_run(2, "tcp");
    wire_run(3, "shm");
    wire_run(3, "tcp");
    wire_run(1, "shm");
}
