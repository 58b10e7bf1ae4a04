/*
 * nn/gpt.c — a GPT-2 shaped model over the kernels of transformer.c, in the
 * llm.c manner: one allocation for the parameters, one for their
 * gradients, fixed activation memory sized at create, a forward and a
 * backward that call the kernels block by block.
 *
 * A block's activations live in an "area" laid out by area_layout(). In
 * NN_ACT_KEEP mode every block has its own area. In NN_ACT_RECOMPUTE and
 * NN_ACT_OFFLOAD_BF16 there is one shared area: the forward of every
 * block runs in it; recompute runs the block's forward again before its
 * backward (the block's input, the residual stream, is always kept), and
 * offload packs the area into the block's bf16 slot of a pool after the
 * forward and unpacks it before the backward.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define PER_LAYER 12 /* parameters per block */

enum { P_LN1W, P_LN1B, P_QKVW, P_QKVB, P_APW, P_APB, P_LN2W, P_LN2B, P_FCW, P_FCB, P_FPW, P_FPB };

/* Offsets (in floats) of one block's activations for N = B*T rows. */
typedef struct area {
    size_t ln1, m1, r1, qkv, atty, att, res2, ln2, m2, r2, fch, fchg, total;
} area_t;

struct nn_gpt {
    nn_gpt_config_t cfg;
    size_t max_batch;
    nn_act_mode_t mode;
    nn_param_t *params;
    size_t nparams;
    float *pmem, *gmem;
    size_t pfloats;
    char *names;
    nn_grad_ready_fn hook;
    void *hook_ctx;

    /* activations, sized for max_batch x max_seq */
    size_t area_floats;   /* one block's area at full size */
    float *areas;         /* n_layer areas (KEEP) or one */
    uint16_t *pool;       /* OFFLOAD: n_layer bf16 areas */
    float *encoded;       /* N x C */
    float *resid;         /* n_layer x N x C: each block's output */
    float *lnf, *lnf_m, *lnf_r;
    float *logits;        /* N x V */
    float *dres, *dln, *dqkv, *datty, *dfch, *dfchg, *scratch; /* backward */
    int *tokens;
    size_t act_bytes;

    size_t B, T;          /* last forward */
    bool have_targets;
};

static area_t area_layout(const nn_gpt_config_t *c, size_t B, size_t T)
{
    size_t N = B * T, C = c->n_embd;
    area_t a;
    size_t o = 0;
    a.ln1 = o; o += N * C;
    a.m1 = o; o += N;
    a.r1 = o; o += N;
    a.qkv = o; o += 3 * N * C;
    a.atty = o; o += N * C;
    a.att = o; o += B * c->n_head * T * T;
    a.res2 = o; o += N * C;
    a.ln2 = o; o += N * C;
    a.m2 = o; o += N;
    a.r2 = o; o += N;
    a.fch = o; o += 4 * N * C;
    a.fchg = o; o += 4 * N * C;
    a.total = o;
    return a;
}

/* Floats of everything but the block areas, for N rows. */
static size_t fixed_floats(const nn_gpt_config_t *c, size_t B, size_t T)
{
    size_t N = B * T, C = c->n_embd;
    return N * C                     /* encoded */
           + c->n_layer * N * C      /* resid */
           + N * C + 2 * N           /* ln_f */
           + N * c->vocab            /* logits */
           + N * C * (1 + 1 + 3 + 1 + 4 + 4) + T * T; /* backward buffers */
}

static float normal(uint64_t *s)
{
    float u1 = 1.0f - nn__rand_f32(s), u2 = nn__rand_f32(s);
    return sqrtf(-2.0f * logf(u1)) * cosf(6.28318530717958647692f * u2);
}

static int add_params(nn_gpt_t *g, uint64_t seed)
{
    const nn_gpt_config_t *c = &g->cfg;
    size_t C = c->n_embd, L = c->n_layer;
    g->nparams = 2 + PER_LAYER * L + 2;
    g->params = calloc(g->nparams, sizeof *g->params);
    g->names = calloc(g->nparams, 40);
    if (!g->params || !g->names) return nn__fail("nn_gpt_create: out of memory");
    static const char *const blk[PER_LAYER] = {
        "ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
        "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias",
        "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias"};
    const size_t blk_count[PER_LAYER] = {C, C, 3 * C * C, 3 * C, C * C, C, C, C,
                                         4 * C * C, 4 * C, 4 * C * C, C};
    size_t total = 0;
    for (size_t i = 0; i < g->nparams; i++) {
        char *name = g->names + 40 * i;
        size_t count;
        if (i == 0) snprintf(name, 40, "wte"), count = c->vocab * C;
        else if (i == 1) snprintf(name, 40, "wpe"), count = c->max_seq * C;
        else if (i >= 2 + PER_LAYER * L)
            snprintf(name, 40, "ln_f.%s", i == 2 + PER_LAYER * L ? "weight" : "bias"), count = C;
        else {
            size_t l = (i - 2) / PER_LAYER, k = (i - 2) % PER_LAYER;
            snprintf(name, 40, "h.%zu.%s", l, blk[k]);
            count = blk_count[k];
        }
        g->params[i] = (nn_param_t){.name = name, .count = count};
        total += count;
    }
    g->pfloats = total;
    g->pmem = calloc(total, sizeof(float));
    g->gmem = calloc(total, sizeof(float));
    if (!g->pmem || !g->gmem) return nn__fail("nn_gpt_create: out of memory for %zu parameters", total);
    uint64_t s = seed;
    float proj_std = 0.02f / sqrtf(2.0f * (float)L);
    for (size_t i = 0, off = 0; i < g->nparams; i++) {
        nn_param_t *p = &g->params[i];
        p->data = g->pmem + off;
        p->grad = g->gmem + off;
        off += p->count;
        size_t k = i >= 2 && i < 2 + PER_LAYER * L ? (i - 2) % PER_LAYER : 99;
        bool ln_w = k == P_LN1W || k == P_LN2W || i == 2 + PER_LAYER * L;
        bool matrix = i < 2 || k == P_QKVW || k == P_APW || k == P_FCW || k == P_FPW;
        float std = k == P_APW || k == P_FPW ? proj_std : 0.02f;
        for (size_t j = 0; j < p->count; j++)
            p->data[j] = ln_w ? 1.0f : matrix ? std * normal(&s) : 0.0f;
    }
    return 0;
}

static float *take(float **cursor, size_t n)
{
    float *p = *cursor;
    *cursor += n;
    return p;
}

static int alloc_acts(nn_gpt_t *g)
{
    const nn_gpt_config_t *c = &g->cfg;
    size_t B = g->max_batch, T = c->max_seq, N = B * T, C = c->n_embd, L = c->n_layer;
    g->area_floats = area_layout(c, B, T).total;
    size_t nareas = g->mode == NN_ACT_KEEP ? L : 1;
    size_t fixed = fixed_floats(c, B, T);
    g->areas = calloc(nareas * g->area_floats + fixed, sizeof(float));
    g->tokens = calloc(N, sizeof *g->tokens);
    if (g->mode == NN_ACT_OFFLOAD_BF16) g->pool = calloc(L * g->area_floats, sizeof *g->pool);
    if (!g->areas || !g->tokens || (g->mode == NN_ACT_OFFLOAD_BF16 && !g->pool))
        return nn__fail("nn_gpt_create: out of memory for activations (%zu x %zu tokens)", B, T);
    float *cur = g->areas + nareas * g->area_floats;
    g->encoded = take(&cur, N * C);
    g->resid = take(&cur, L * N * C);
    g->lnf = take(&cur, N * C);
    g->lnf_m = take(&cur, N);
    g->lnf_r = take(&cur, N);
    g->logits = take(&cur, N * c->vocab);
    g->dres = take(&cur, N * C);
    g->dln = take(&cur, N * C);
    g->dqkv = take(&cur, 3 * N * C);
    g->datty = take(&cur, N * C);
    g->dfch = take(&cur, 4 * N * C);
    g->dfchg = take(&cur, 4 * N * C);
    g->scratch = take(&cur, T * T);
    g->act_bytes = (nareas * g->area_floats + fixed) * sizeof(float) + N * sizeof(int) +
                   (g->pool ? L * g->area_floats * sizeof *g->pool : 0);
    return 0;
}

nn_gpt_t *nn_gpt_create(const nn_gpt_config_t *cfg, size_t max_batch, nn_act_mode_t mode,
                        uint64_t seed)
{
    if (!cfg || max_batch == 0 || cfg->vocab == 0 || cfg->max_seq == 0 || cfg->n_layer == 0 ||
        cfg->n_head == 0 || cfg->n_embd == 0 || cfg->n_embd % cfg->n_head != 0 ||
        cfg->vocab > (1u << 24) || cfg->n_embd > (1u << 16) || cfg->max_seq > (1u << 16) ||
        max_batch > (1u << 16) || (unsigned)mode > NN_ACT_OFFLOAD_BF16) {
        nn__fail("nn_gpt_create: bad config (every size >= 1, n_head divides n_embd, mode 0..2)");
        return NULL;
    }
    nn_gpt_t *g = calloc(1, sizeof *g);
    if (!g) {
        nn__fail("nn_gpt_create: out of memory");
        return NULL;
    }
    g->cfg = *cfg;
    g->max_batch = max_batch;
    g->mode = mode;
    if (add_params(g, seed) != 0 || alloc_acts(g) != 0) {
        nn_gpt_destroy(g);
        return NULL;
    }
    return g;
}

void nn_gpt_destroy(nn_gpt_t *g)
{
    if (!g) return;
    free(g->params);
    free(g->names);
    free(g->pmem);
    free(g->gmem);
    free(g->areas);
    free(g->pool);
    free(g->tokens);
    free(g);
}

nn_param_t *nn_gpt_params(nn_gpt_t *g, size_t *n)
{
    if (!g || !n) return NULL;
    *n = g->nparams;
    return g->params;
}

float *nn_gpt_flat_params(nn_gpt_t *g, size_t *count)
{
    if (!g || !count) return NULL;
    *count = g->pfloats;
    return g->pmem;
}

float *nn_gpt_flat_grads(nn_gpt_t *g, size_t *count)
{
    if (!g || !count) return NULL;
    *count = g->pfloats;
    return g->gmem;
}

void nn_gpt_zero_grad(nn_gpt_t *g)
{
    for (size_t i = 0; g && i < g->nparams; i++)
        memset(g->params[i].grad, 0, g->params[i].count * sizeof(float));
}

void nn_gpt_set_grad_ready_hook(nn_gpt_t *g, nn_grad_ready_fn fn, void *ctx)
{
    if (!g) return;
    g->hook = fn;
    g->hook_ctx = ctx;
}

size_t nn_gpt_activation_bytes(const nn_gpt_t *g) { return g ? g->act_bytes : 0; }

size_t nn_gpt_activation_bytes_keep(const nn_gpt_t *g)
{
    if (!g) return 0;
    size_t B = g->max_batch, T = g->cfg.max_seq;
    return (g->cfg.n_layer * g->area_floats + fixed_floats(&g->cfg, B, T)) * sizeof(float) +
           B * T * sizeof(int);
}

/* ------------------------------------------------------------ the blocks */

static float *P(nn_gpt_t *g, size_t l, int k) { return g->params[2 + PER_LAYER * l + (size_t)k].data; }
static float *G(nn_gpt_t *g, size_t l, int k) { return g->params[2 + PER_LAYER * l + (size_t)k].grad; }

static void ready(nn_gpt_t *g, size_t index)
{
    if (g->hook) g->hook(g->hook_ctx, index);
}

static float *block_area(nn_gpt_t *g, size_t l)
{
    return g->areas + (g->mode == NN_ACT_KEEP ? l * g->area_floats : 0);
}

static const float *block_input(const nn_gpt_t *g, size_t l)
{
    size_t NC = g->B * g->T * g->cfg.n_embd;
    return l == 0 ? g->encoded : g->resid + (l - 1) * NC;
}

static void block_forward(nn_gpt_t *g, size_t l)
{
    size_t B = g->B, T = g->T, N = B * T, C = g->cfg.n_embd, NH = g->cfg.n_head;
    area_t o = area_layout(&g->cfg, B, T);
    float *a = block_area(g, l), *out = g->resid + l * N * C;
    const float *x = block_input(g, l);
    nn_layernorm_forward(a + o.ln1, a + o.m1, a + o.r1, x, P(g, l, P_LN1W), P(g, l, P_LN1B), N, C);
    nn_matmul_forward(a + o.qkv, a + o.ln1, P(g, l, P_QKVW), P(g, l, P_QKVB), N, C, 3 * C);
    nn_attention_forward(a + o.atty, a + o.att, a + o.qkv, B, T, C, NH);
    nn_matmul_forward(a + o.res2, a + o.atty, P(g, l, P_APW), P(g, l, P_APB), N, C, C);
    for (size_t i = 0; i < N * C; i++) a[o.res2 + i] += x[i];
    nn_layernorm_forward(a + o.ln2, a + o.m2, a + o.r2, a + o.res2, P(g, l, P_LN2W),
                         P(g, l, P_LN2B), N, C);
    nn_matmul_forward(a + o.fch, a + o.ln2, P(g, l, P_FCW), P(g, l, P_FCB), N, C, 4 * C);
    nn_gelu_forward(a + o.fchg, a + o.fch, 4 * N * C);
    nn_matmul_forward(out, a + o.fchg, P(g, l, P_FPW), P(g, l, P_FPB), N, 4 * C, C);
    for (size_t i = 0; i < N * C; i++) out[i] += a[o.res2 + i];
}

/* f32 -> bf16, round to nearest even (values here are finite). */
static uint16_t to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static float from_bf16(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static void offload(nn_gpt_t *g, size_t l, bool pack)
{
    size_t n = area_layout(&g->cfg, g->B, g->T).total;
    uint16_t *slot = g->pool + l * g->area_floats;
    if (pack)
        for (size_t i = 0; i < n; i++) slot[i] = to_bf16(g->areas[i]);
    else
        for (size_t i = 0; i < n; i++) g->areas[i] = from_bf16(slot[i]);
}

/* Block l's backward: g->dres holds d(block output) on entry, d(block
 * input) on return. The parameters are reported as they become final. */
static void block_backward(nn_gpt_t *g, size_t l)
{
    size_t B = g->B, T = g->T, N = B * T, C = g->cfg.n_embd, NH = g->cfg.n_head;
    size_t base = 2 + PER_LAYER * l;
    area_t o = area_layout(&g->cfg, B, T);
    const float *a = block_area(g, l), *x = block_input(g, l);
    memset(g->dfchg, 0, 4 * N * C * sizeof(float));
    nn_matmul_backward(g->dfchg, G(g, l, P_FPW), G(g, l, P_FPB), g->dres, a + o.fchg,
                       P(g, l, P_FPW), N, 4 * C, C);
    ready(g, base + P_FPB);
    ready(g, base + P_FPW);
    memset(g->dfch, 0, 4 * N * C * sizeof(float));
    nn_gelu_backward(g->dfch, a + o.fch, g->dfchg, 4 * N * C);
    memset(g->dln, 0, N * C * sizeof(float));
    nn_matmul_backward(g->dln, G(g, l, P_FCW), G(g, l, P_FCB), g->dfch, a + o.ln2, P(g, l, P_FCW),
                       N, C, 4 * C);
    ready(g, base + P_FCB);
    ready(g, base + P_FCW);
    nn_layernorm_backward(g->dres, G(g, l, P_LN2W), G(g, l, P_LN2B), g->dln, a + o.res2,
                          P(g, l, P_LN2W), a + o.m2, a + o.r2, N, C);
    ready(g, base + P_LN2B);
    ready(g, base + P_LN2W);
    memset(g->datty, 0, N * C * sizeof(float));
    nn_matmul_backward(g->datty, G(g, l, P_APW), G(g, l, P_APB), g->dres, a + o.atty,
                       P(g, l, P_APW), N, C, C);
    ready(g, base + P_APB);
    ready(g, base + P_APW);
    memset(g->dqkv, 0, 3 * N * C * sizeof(float));
    nn_attention_backward(g->dqkv, g->scratch, g->datty, a + o.qkv, a + o.att, B, T, C, NH);
    memset(g->dln, 0, N * C * sizeof(float));
    nn_matmul_backward(g->dln, G(g, l, P_QKVW), G(g, l, P_QKVB), g->dqkv, a + o.ln1,
                       P(g, l, P_QKVW), N, C, 3 * C);
    ready(g, base + P_QKVB);
    ready(g, base + P_QKVW);
    nn_layernorm_backward(g->dres, G(g, l, P_LN1W), G(g, l, P_LN1B), g->dln, x, P(g, l, P_LN1W),
                          a + o.m1, a + o.r1, N, C);
    ready(g, base + P_LN1B);
    ready(g, base + P_LN1W);
}

/* ------------------------------------------------------ forward, backward */

static int check_ids(const int *ids, size_t n, size_t V, const char *what)
{
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || (size_t)ids[i] >= V)
            return nn__fail("nn_gpt_forward: %s %d at %zu is not in [0, %zu)", what, ids[i], i, V);
    return 0;
}

float *nn_gpt_forward(nn_gpt_t *g, const int *tokens, const int *targets, size_t B, size_t T,
                      float *loss)
{
    if (!g || !tokens || B == 0 || T == 0 || B > g->max_batch || T > g->cfg.max_seq) {
        nn__fail("nn_gpt_forward: need a model, tokens and 1 <= B <= max_batch, 1 <= T <= max_seq");
        return NULL;
    }
    size_t N = B * T, C = g->cfg.n_embd, V = g->cfg.vocab, L = g->cfg.n_layer;
    if (check_ids(tokens, N, V, "token") != 0 || (targets && check_ids(targets, N, V, "target") != 0))
        return NULL;
    g->B = B;
    g->T = T;
    g->have_targets = false;
    memcpy(g->tokens, tokens, N * sizeof *tokens);
    nn_encoder_forward(g->encoded, tokens, g->params[0].data, g->params[1].data, B, T, C);
    for (size_t l = 0; l < L; l++) {
        block_forward(g, l);
        if (g->mode == NN_ACT_OFFLOAD_BF16) offload(g, l, true);
    }
    size_t lf = 2 + PER_LAYER * L;
    nn_layernorm_forward(g->lnf, g->lnf_m, g->lnf_r, g->resid + (L - 1) * N * C,
                         g->params[lf].data, g->params[lf + 1].data, N, C);
    nn_matmul_forward(g->logits, g->lnf, g->params[0].data, NULL, N, C, V);
    if (targets) {
        float l;
        if (nn_cross_entropy(g->logits, targets, N, V, &l, g->logits) != 0) return NULL;
        if (loss) *loss = l;
        g->have_targets = true;
    }
    return g->logits;
}

int nn_gpt_backward(nn_gpt_t *g)
{
    if (!g || !g->have_targets)
        return nn__fail("nn_gpt_backward: no forward with targets to back-propagate");
    size_t N = g->B * g->T, C = g->cfg.n_embd, V = g->cfg.vocab, L = g->cfg.n_layer;
    size_t lf = 2 + PER_LAYER * L;
    memset(g->dln, 0, N * C * sizeof(float));
    nn_matmul_backward(g->dln, g->params[0].grad, NULL, g->logits, g->lnf, g->params[0].data, N,
                       C, V);
    memset(g->dres, 0, N * C * sizeof(float));
    nn_layernorm_backward(g->dres, g->params[lf].grad, g->params[lf + 1].grad, g->dln,
                          g->resid + (L - 1) * N * C, g->params[lf].data, g->lnf_m, g->lnf_r, N,
                          C);
    ready(g, lf + 1);
    ready(g, lf);
    for (size_t l = L; l-- > 0;) {
        if (g->mode == NN_ACT_RECOMPUTE) block_forward(g, l);
        if (g->mode == NN_ACT_OFFLOAD_BF16) offload(g, l, false);
        block_backward(g, l);
    }
    nn_encoder_backward(g->params[0].grad, g->params[1].grad, g->dres, g->tokens, g->B, g->T, C);
    ready(g, 1);
    ready(g, 0);
    return 0;
}
