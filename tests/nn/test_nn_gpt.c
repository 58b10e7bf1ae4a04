/* tests/nn/test_nn_gpt.c — the transformer kernels and the GPT: every
 * backward against central finite differences; the grad-ready order;
 * activation checkpointing (bitwise the gradients of keeping everything)
 * and bf16 offload (within its stated tolerance); gradient clipping and the
 * learning-rate schedule. */
#include "nn_check.h"

/* A kernel under test: forward(ctx) writes `out` (nout floats) from the
 * inputs; its backward, run once by the caller with dout = w, left the
 * analytic gradient of L = sum(w * out) of input k in grads[k]. */
typedef struct kcheck {
    void (*forward)(void *ctx);
    void *ctx;
    const float *out;
    size_t nout;
    const float *w;
    size_t ninputs;
    float *x[6];
    const float *grads[6];
    size_t n[6];
    const char *names[6];
} kcheck_t;

static double k_loss(const kcheck_t *k)
{
    k->forward(k->ctx);
    double l = 0.0;
    for (size_t i = 0; i < k->nout; i++) l += (double)k->w[i] * (double)k->out[i];
    return l;
}

/* Every element of every input (at most max_per each), eps 1e-2. */
static void k_check(const kcheck_t *k, size_t max_per)
{
    const double eps = 1e-2;
    double norm = 0.0;
    for (size_t in = 0; in < k->ninputs; in++) {
        size_t step = k->n[in] > max_per ? (k->n[in] + max_per - 1) / max_per : 1;
        for (size_t i = 0; i < k->n[in]; i += step) {
            float keep = k->x[in][i];
            k->x[in][i] = keep + (float)eps;
            double lp = k_loss(k);
            k->x[in][i] = keep - (float)eps;
            double lm = k_loss(k);
            k->x[in][i] = keep;
            t_close(k->names[in], i, k->grads[in][i], (lp - lm) / (2 * eps), 1e-2, 2e-3);
            norm += fabs(k->grads[in][i]);
        }
    }
    ASSERT_TRUE(norm > 1e-3); /* an all-zero gradient would pass trivially */
}


static float *zeros(size_t n)
{
    float *x = calloc(n, sizeof *x);
    ASSERT_TRUE(x != NULL);
    return x;
}

/* ------------------------------------------------------------ LayerNorm */

typedef struct ln_ctx {
    float *out, *mean, *rstd, *x, *w, *b;
    size_t N, C;
} ln_ctx_t;

static void ln_fwd(void *c)
{
    ln_ctx_t *k = c;
    nn_layernorm_forward(k->out, k->mean, k->rstd, k->x, k->w, k->b, k->N, k->C);
}

TEST(nn_layernorm_grad, 30)
{
    size_t N = 6, C = 7;
    ln_ctx_t c = {zeros(N * C), zeros(N), zeros(N), t_rand_input(N * C, 1, -2, 2), t_rand_input(C, 2, 0.5f, 1.5f),
                  t_rand_input(C, 3, -0.5f, 0.5f), N, C};
    float *w = t_rand_input(N * C, 4, -1, 1), *dx = zeros(N * C), *dw = zeros(C), *db = zeros(C);
    ln_fwd(&c);
    nn_layernorm_backward(dx, dw, db, w, c.x, c.w, c.mean, c.rstd, N, C);
    /* the normalised rows have mean 0 and variance 1 (before w and b) */
    for (size_t n = 0; n < N; n++) {
        double m = 0;
        for (size_t i = 0; i < C; i++) m += (c.x[n * C + i] - c.mean[n]) * c.rstd[n];
        ASSERT_TRUE(fabs(m) < 1e-5);
    }
    kcheck_t k = {ln_fwd, &c, c.out, N * C, w, 3, {c.x, c.w, c.b}, {dx, dw, db}, {N * C, C, C},
                  {"dx", "dw", "db"}};
    k_check(&k, 1000);
    free(c.out), free(c.mean), free(c.rstd), free(c.x), free(c.w), free(c.b);
    free(w), free(dx), free(dw), free(db);
}

/* --------------------------------------------------------------- matmul */

typedef struct mm_ctx {
    float *out, *x, *w, *b;
    size_t N, C, OC;
} mm_ctx_t;

static void mm_fwd(void *c)
{
    mm_ctx_t *k = c;
    nn_matmul_forward(k->out, k->x, k->w, k->b, k->N, k->C, k->OC);
}

TEST(nn_matmul_grad, 30)
{
    size_t N = 5, C = 6, OC = 4;
    mm_ctx_t c = {zeros(N * OC), t_rand_input(N * C, 1, -1, 1), t_rand_input(OC * C, 2, -1, 1), t_rand_input(OC, 3, -1, 1),
                  N, C, OC};
    float *w = t_rand_input(N * OC, 4, -1, 1), *dx = zeros(N * C), *dw = zeros(OC * C), *db = zeros(OC);
    mm_fwd(&c);
    /* out[1][2] = x[1] . W[2] + b[2] */
    double want = c.b[2];
    for (size_t i = 0; i < C; i++) want += (double)c.x[C + i] * c.w[2 * C + i];
    ASSERT_TRUE(fabs(c.out[OC + 2] - want) < 1e-5);
    nn_matmul_backward(dx, dw, db, w, c.x, c.w, N, C, OC);
    kcheck_t k = {mm_fwd, &c, c.out, N * OC, w, 3, {c.x, c.w, c.b}, {dx, dw, db},
                  {N * C, OC * C, OC}, {"dx", "dW", "dbias"}};
    k_check(&k, 1000);
    free(c.out), free(c.x), free(c.w), free(c.b), free(w), free(dx), free(dw), free(db);
}

/* ------------------------------------------------------------ attention */

typedef struct att_ctx {
    float *out, *att, *qkv;
    size_t B, T, C, NH;
} att_ctx_t;

static void att_fwd(void *c)
{
    att_ctx_t *k = c;
    nn_attention_forward(k->out, k->att, k->qkv, k->B, k->T, k->C, k->NH);
}

TEST(nn_attention_grad, 30)
{
    size_t B = 2, T = 5, C = 8, NH = 2;
    att_ctx_t c = {zeros(B * T * C), zeros(B * NH * T * T), t_rand_input(B * T * 3 * C, 1, -1.5f, 1.5f), B,
                   T, C, NH};
    float *w = t_rand_input(B * T * C, 2, -1, 1), *dqkv = zeros(B * T * 3 * C), *scratch = zeros(T * T);
    att_fwd(&c);
    /* causal: each row sums to 1 over j <= i and is 0 after; position 0 sees only itself */
    for (size_t r = 0; r < B * NH * T; r++) {
        size_t i = r % T;
        double s = 0;
        for (size_t j = 0; j < T; j++) {
            if (j > i) ASSERT_TRUE(c.att[r * T + j] == 0.0f);
            s += c.att[r * T + j];
        }
        ASSERT_TRUE(fabs(s - 1.0) < 1e-5);
    }
    ASSERT_TRUE(fabs(c.out[0] - c.qkv[2 * C]) < 1e-6); /* out[0,0] = v[0,0] */
    nn_attention_backward(dqkv, scratch, w, c.qkv, c.att, B, T, C, NH);
    kcheck_t k = {att_fwd, &c, c.out, B * T * C, w, 1, {c.qkv}, {dqkv}, {B * T * 3 * C}, {"dqkv"}};
    k_check(&k, 1000);
    free(c.out), free(c.att), free(c.qkv), free(w), free(dqkv), free(scratch);
}

/* ------------------------------------------- GELU, residual, encoder */

typedef struct ew_ctx {
    float *out, *a, *b, *wte, *wpe;
    int *tok;
    size_t n, B, T, C;
    int kind; /* 0 gelu, 1 residual, 2 encoder */
} ew_ctx_t;

static void ew_fwd(void *c)
{
    ew_ctx_t *k = c;
    if (k->kind == 0) nn_gelu_forward(k->out, k->a, k->n);
    if (k->kind == 1) nn_residual_forward(k->out, k->a, k->b, k->n);
    if (k->kind == 2) nn_encoder_forward(k->out, k->tok, k->wte, k->wpe, k->B, k->T, k->C);
}

TEST(nn_gelu_residual_encoder_grad, 30)
{
    size_t n = 40;
    ew_ctx_t c = {.out = zeros(n), .a = t_rand_input(n, 1, -3, 3), .b = t_rand_input(n, 2, -1, 1), .n = n};
    float *w = t_rand_input(n, 3, -1, 1), *da = zeros(n), *db = zeros(n);
    ew_fwd(&c);
    ASSERT_TRUE(fabs(c.out[0] - 0.5 * c.a[0] * (1 + erf(c.a[0] / sqrt(2.0)))) < 2e-3);
    nn_gelu_backward(da, c.a, w, n);
    kcheck_t k = {ew_fwd, &c, c.out, n, w, 1, {c.a}, {da}, {n}, {"gelu dx"}};
    k_check(&k, 1000);

    c.kind = 1;
    memset(da, 0, n * sizeof *da);
    nn_residual_backward(da, db, w, n);
    kcheck_t r = {ew_fwd, &c, c.out, n, w, 2, {c.a, c.b}, {da, db}, {n, n}, {"da", "db"}};
    k_check(&r, 1000);

    /* encoder: B=2, T=3, C=4 over a vocabulary of 5; token 1 appears twice */
    int tok[6] = {1, 4, 0, 1, 2, 3};
    ew_ctx_t e = {.out = zeros(24), .wte = t_rand_input(20, 4, -1, 1), .wpe = t_rand_input(12, 5, -1, 1), .tok = tok,
                  .B = 2, .T = 3, .C = 4, .kind = 2};
    float *we = t_rand_input(24, 6, -1, 1), *dwte = zeros(20), *dwpe = zeros(12);
    ew_fwd(&e);
    nn_encoder_backward(dwte, dwpe, we, tok, 2, 3, 4);
    kcheck_t en = {ew_fwd, &e, e.out, 24, we, 2, {e.wte, e.wpe}, {dwte, dwpe}, {20, 12},
                   {"dwte", "dwpe"}};
    k_check(&en, 1000);
    free(c.out), free(c.a), free(c.b), free(w), free(da), free(db);
    free(e.out), free(e.wte), free(e.wpe), free(we), free(dwte), free(dwpe);
}

/* ------------------------------------------------------------------ GPT */

static const nn_gpt_config_t small = {.vocab = 11, .max_seq = 6, .n_layer = 2, .n_head = 2,
                                      .n_embd = 8};
enum { SB = 2, ST = 5 };

static void seq(int *tok, int *tgt, uint64_t seed)
{
    uint64_t s = seed;
    for (int i = 0; i < SB * ST; i++) {
        tok[i] = (int)(t_rand_u64(&s) % small.vocab);
        tgt[i] = (int)(t_rand_u64(&s) % small.vocab);
    }
}

/* Larger, varied parameters than GPT-2's N(0, 0.02), so every path carries
 * a gradient the finite differences can see. */
static nn_gpt_t *gpt(nn_act_mode_t mode)
{
    nn_gpt_t *g = nn_gpt_create(&small, SB, mode, 5);
    if (!g) FAIL("nn_gpt_create: %s", nn_last_error());
    size_t n = 0;
    float *p = nn_gpt_flat_params(g, &n);
    uint64_t s = 99;
    t_fill(p, n, &s, -0.4f, 0.4f);
    size_t np = 0;
    nn_param_t *ps = nn_gpt_params(g, &np);
    for (size_t i = 0; i < np; i++)
        if (strstr(ps[i].name, "ln_") && strstr(ps[i].name, ".weight"))
            for (size_t j = 0; j < ps[i].count; j++) ps[i].data[j] += 1.0f;
    return g;
}

TEST(nn_gpt_grad, 60)
{
    nn_gpt_t *g = gpt(NN_ACT_KEEP);
    int tok[SB * ST], tgt[SB * ST];
    seq(tok, tgt, 7);
    size_t np = 0, nf = 0;
    nn_param_t *p = nn_gpt_params(g, &np);
    ASSERT_EQ(np, 2 + 12 * small.n_layer + 2);
    ASSERT_STREQ(p[4].name, "h.0.attn.c_attn.weight");
    ASSERT_STREQ(p[np - 1].name, "ln_f.bias");
    float loss;
    nn_gpt_zero_grad(g);
    ASSERT_TRUE(nn_gpt_forward(g, tok, tgt, SB, ST, &loss) != NULL);
    ASSERT_TRUE(loss > 1.0f && loss < 6.0f);
    ASSERT_EQ(nn_gpt_backward(g), 0);
    float *gr = nn_gpt_flat_grads(g, &nf), *copy = malloc(nf * sizeof *copy);
    ASSERT_TRUE(copy != NULL);
    memcpy(copy, gr, nf * sizeof *copy);
    const double eps = 1e-2;
    size_t off = 0, checked = 0;
    double norm = 0;
    for (size_t k = 0; k < np; k++) {
        size_t step = p[k].count > 24 ? p[k].count / 24 : 1;
        for (size_t i = 0; i < p[k].count; i += step) {
            float keep = p[k].data[i], lp, lm;
            p[k].data[i] = keep + (float)eps;
            ASSERT_TRUE(nn_gpt_forward(g, tok, tgt, SB, ST, &lp) != NULL);
            p[k].data[i] = keep - (float)eps;
            ASSERT_TRUE(nn_gpt_forward(g, tok, tgt, SB, ST, &lm) != NULL);
            p[k].data[i] = keep;
            t_close(p[k].name, i, copy[off + i], ((double)lp - lm) / (2 * eps), 2e-2, 1e-3);
            norm += fabs(copy[off + i]);
            checked++;
        }
        off += p[k].count;
    }
    ASSERT_TRUE(checked > 300);
    ASSERT_TRUE(norm > 1e-2);
    /* wpe rows past T get no gradient */
    for (size_t i = ST * small.n_embd; i < p[1].count; i++) ASSERT_TRUE(p[1].grad[i] == 0.0f);
    free(copy);
    nn_gpt_destroy(g);
}

typedef struct order {
    size_t seen[64], n;
} order_t;

static void record(void *ctx, size_t i)
{
    order_t *o = ctx;
    if (o->n < 64) o->seen[o->n] = i;
    o->n++;
}

/* Gradients (and the loss, and the order of grad-ready reports) of one
 * forward/backward in `mode`, into out (nf floats). */
static float run_mode(nn_act_mode_t mode, float *out, size_t nf, order_t *ord)
{
    nn_gpt_t *g = gpt(mode);
    int tok[SB * ST], tgt[SB * ST];
    seq(tok, tgt, 8);
    nn_gpt_set_grad_ready_hook(g, record, ord);
    float loss;
    nn_gpt_zero_grad(g);
    ASSERT_TRUE(nn_gpt_forward(g, tok, tgt, SB, ST, &loss) != NULL);
    ASSERT_EQ(nn_gpt_backward(g), 0);
    size_t n = 0;
    float *gr = nn_gpt_flat_grads(g, &n);
    ASSERT_EQ(n, nf);
    memcpy(out, gr, nf * sizeof *out);
    nn_gpt_destroy(g);
    return loss;
}

TEST(nn_gpt_checkpointing_and_offload, 30)
{
    nn_gpt_t *g = gpt(NN_ACT_KEEP);
    size_t nf = 0, np = 0;
    nn_gpt_flat_params(g, &nf);
    nn_param_t *p = nn_gpt_params(g, &np);
    size_t *counts = malloc(np * sizeof *counts);
    ASSERT_TRUE(counts != NULL);
    for (size_t i = 0; i < np; i++) counts[i] = p[i].count;
    size_t keep_bytes = nn_gpt_activation_bytes(g);
    ASSERT_EQ(keep_bytes, nn_gpt_activation_bytes_keep(g));
    nn_gpt_destroy(g);

    float *k = malloc(nf * sizeof *k), *r = malloc(nf * sizeof *r), *o = malloc(nf * sizeof *o);
    ASSERT_TRUE(k && r && o);
    order_t ok = {{0}, 0}, orc = {{0}, 0}, oo = {{0}, 0};
    float lk = run_mode(NN_ACT_KEEP, k, nf, &ok);
    float lr = run_mode(NN_ACT_RECOMPUTE, r, nf, &orc);
    float lo = run_mode(NN_ACT_OFFLOAD_BF16, o, nf, &oo);
    /* every parameter reported once, in exactly the reverse order */
    ASSERT_EQ(ok.n, np);
    for (size_t i = 0; i < np; i++) ASSERT_EQ(ok.seen[i], np - 1 - i);
    ASSERT_MEMEQ(orc.seen, ok.seen, np * sizeof ok.seen[0]);
    ASSERT_MEMEQ(oo.seen, ok.seen, np * sizeof ok.seen[0]);
    /* recompute: the same loss and bitwise the same gradients */
    ASSERT_TRUE(lr == lk);
    ASSERT_MEMEQ(r, k, nf * sizeof *k);
    /* offload: the forward is the same (the pool is only read back in the
     * backward); each parameter's gradient within 2% (relative L2) */
    ASSERT_TRUE(lo == lk);
    bool differs = false;
    for (size_t i = 0, off = 0; i < np; off += counts[i], i++) {
        double d = 0, n = 0;
        for (size_t j = off; j < off + counts[i]; j++) {
            d += ((double)o[j] - k[j]) * ((double)o[j] - k[j]);
            n += (double)k[j] * k[j];
            differs = differs || o[j] != k[j];
        }
        if (sqrt(d) > 0.02 * sqrt(n) + 1e-7)
            FAIL("offload: %s differs by %.3g relative", p[i].name, sqrt(d / (n + 1e-30)));
    }
    ASSERT_TRUE(differs); /* bf16 did round something */
    /* memory, 4 blocks: recompute keeps one block's f32 area, offload one
     * f32 area and every block's in bf16 (less than keeping all in f32
     * from 3 blocks on) */
    nn_gpt_config_t four = small;
    four.n_layer = 4;
    nn_gpt_t *gk = nn_gpt_create(&four, SB, NN_ACT_KEEP, 5);
    nn_gpt_t *gr = nn_gpt_create(&four, SB, NN_ACT_RECOMPUTE, 5);
    nn_gpt_t *go = nn_gpt_create(&four, SB, NN_ACT_OFFLOAD_BF16, 5);
    ASSERT_TRUE(gk && gr && go);
    size_t kb = nn_gpt_activation_bytes(gk);
    ASSERT_TRUE(kb > keep_bytes);
    ASSERT_TRUE(nn_gpt_activation_bytes(gr) < nn_gpt_activation_bytes(go));
    ASSERT_TRUE(nn_gpt_activation_bytes(go) < kb);
    ASSERT_EQ(nn_gpt_activation_bytes_keep(gr), kb);
    ASSERT_EQ(nn_gpt_activation_bytes_keep(go), kb);
    nn_gpt_destroy(gk);
    nn_gpt_destroy(gr);
    nn_gpt_destroy(go);
    free(k), free(r), free(o), free(counts);
}

TEST(nn_gpt_bad_input, 10)
{
    nn_gpt_config_t bad = small;
    bad.n_head = 3; /* does not divide 8 */
    ASSERT_TRUE(nn_gpt_create(&bad, 1, NN_ACT_KEEP, 1) == NULL);
    ASSERT_CONTAINS(nn_last_error(), "n_head divides n_embd");
    nn_gpt_t *g = nn_gpt_create(&small, 1, NN_ACT_KEEP, 1);
    ASSERT_TRUE(g != NULL);
    int tok[6] = {0, 1, 2, 11, 0, 0}, tgt[6] = {0};
    ASSERT_TRUE(nn_gpt_forward(g, tok, tgt, 1, 6, NULL) == NULL);
    ASSERT_CONTAINS(nn_last_error(), "token 11 at 3");
    ASSERT_TRUE(nn_gpt_forward(g, tok, tgt, 2, 3, NULL) == NULL); /* B > max_batch */
    tok[3] = 1;
    ASSERT_TRUE(nn_gpt_forward(g, tok, NULL, 1, 6, NULL) != NULL);
    ASSERT_EQ(nn_gpt_backward(g), -1); /* no targets */
    nn_gpt_destroy(g);
}

TEST(nn_clip_and_lr_schedule, 10)
{
    float d[4] = {0}, gr[4] = {3, 0, 0, 4};
    nn_param_t p = {.name = "x", .data = d, .grad = gr, .count = 4};
    ASSERT_TRUE(fabs(nn_clip_grad_norm(&p, 1, 10.0) - 5.0) < 1e-9);
    ASSERT_TRUE(gr[3] == 4.0f); /* under the limit: untouched */
    ASSERT_TRUE(fabs(nn_clip_grad_norm(&p, 1, 1.0) - 5.0) < 1e-9);
    ASSERT_TRUE(fabs(gr[0] - 0.6f) < 1e-6 && fabs(gr[3] - 0.8f) < 1e-6);
    ASSERT_TRUE(fabs(nn_lr_warmup_cosine(0, 10, 110, 1.0, 0.1) - 0.1) < 1e-12);
    ASSERT_TRUE(fabs(nn_lr_warmup_cosine(9, 10, 110, 1.0, 0.1) - 1.0) < 1e-12);
    ASSERT_TRUE(fabs(nn_lr_warmup_cosine(60, 10, 110, 1.0, 0.1) - 0.55) < 1e-12);
    ASSERT_TRUE(fabs(nn_lr_warmup_cosine(110, 10, 110, 1.0, 0.1) - 0.1) < 1e-12);
    ASSERT_TRUE(nn_lr_warmup_cosine(30, 10, 110, 1.0, 0.1) > nn_lr_warmup_cosine(31, 10, 110, 1.0, 0.1));
}
