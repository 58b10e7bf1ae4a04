/*
 * nn/model.c — the sequential container: building, parameter and buffer
 * memory, initialisation, forward and backward in layer order, the
 * grad-ready hook, modes, errors.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "internal.h"

static _Thread_local char nn_err[512];

int nn__fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(nn_err, sizeof nn_err, fmt, ap);
    va_end(ap);
    return -1;
}

const char *nn_last_error(void) { return nn_err; }

void nn_set_num_threads(int n)
{
    if (n >= 1) openblas_set_num_threads(n);
}

static const char *kind_name(layer_kind_t k)
{
    switch (k) {
    case NN_LINEAR: return "linear";
    case NN_CONV2D: return "conv2d";
    case NN_BATCHNORM2D: return "batchnorm2d";
    case NN_RELU: return "relu";
    case NN_MAXPOOL2D: return "maxpool2d";
    case NN_FLATTEN: return "flatten";
    case NN_EMBEDDING: return "embedding";
    case NN_DROPOUT: return "dropout";
    }
    return "invalid";
}

/* ------------------------------------------------------------- building */

nn_seq_t *nn_seq_create(size_t c, size_t h, size_t w, uint64_t seed)
{
    if (c == 0 || h == 0 || w == 0 || c > (1u << 24) || h > (1u << 24) || w > (1u << 24) ||
        c * h * w > (1u << 30)) {
        nn__fail("nn_seq_create: bad input shape (%zu, %zu, %zu): each must be in 1..2^24, "
                 "at most 2^30 floats per sample", c, h, w);
        return NULL;
    }
    nn_seq_t *m = calloc(1, sizeof *m);
    if (!m) {
        nn__fail("nn_seq_create: out of memory");
        return NULL;
    }
    m->in_c = m->cur_c = c;
    m->in_h = m->cur_h = h;
    m->in_w = m->cur_w = w;
    m->seed = seed;
    m->training = true;
    return m;
}

void nn_seq_destroy(nn_seq_t *m)
{
    if (!m) return;
    for (size_t i = 0; i < m->nlayers; i++) nn__layer_free(&m->layers[i]);
    for (size_t i = 0; i < m->nparams; i++) free((char *)m->params[i].name);
    for (size_t i = 0; i < m->nbufs; i++) free((char *)m->bufs[i].name);
    free(m->layers);
    free(m->params);
    free(m->bufs);
    free(m->param_mem);
    free(m->grad_mem);
    free(m->buf_mem);
    free(m);
}

static char *entry_name(size_t layer, const char *what)
{
    char tmp[64];
    snprintf(tmp, sizeof tmp, "%zu.%s", layer, what);
    return strdup(tmp);
}

/* Append a parameter (count floats) of the layer being added. */
static int add_param(nn_seq_t *m, size_t layer, const char *what, size_t count)
{
    if (m->nparams == m->params_cap) {
        size_t cap = m->params_cap ? 2 * m->params_cap : 8;
        nn_param_t *p = realloc(m->params, cap * sizeof *p);
        if (!p) return nn__fail("nn: out of memory adding parameter %zu.%s", layer, what);
        m->params = p;
        m->params_cap = cap;
    }
    char *name = entry_name(layer, what);
    if (!name) return nn__fail("nn: out of memory adding parameter %zu.%s", layer, what);
    m->params[m->nparams++] = (nn_param_t){.name = name, .count = count};
    return 0;
}

static int add_buffer(nn_seq_t *m, size_t layer, const char *what, size_t count)
{
    if (m->nbufs == m->bufs_cap) {
        size_t cap = m->bufs_cap ? 2 * m->bufs_cap : 8;
        nn_buffer_t *b = realloc(m->bufs, cap * sizeof *b);
        if (!b) return nn__fail("nn: out of memory adding buffer %zu.%s", layer, what);
        m->bufs = b;
        m->bufs_cap = cap;
    }
    char *name = entry_name(layer, what);
    if (!name) return nn__fail("nn: out of memory adding buffer %zu.%s", layer, what);
    m->bufs[m->nbufs++] = (nn_buffer_t){.name = name, .count = count};
    return 0;
}

/* Start a new layer of `kind` reading the current shape; NULL (error set)
 * when the model is already built or out of memory. */
static nn_layer_t *begin_layer(nn_seq_t *m, layer_kind_t kind, const char *fn)
{
    if (!m) {
        nn__fail("%s: model is NULL", fn);
        return NULL;
    }
    if (m->built) {
        nn__fail("%s: cannot add layer %zu: the model is already in use (layers must be added "
                 "before the first nn_params/nn_buffers/nn_forward/nn_flat_* call)", fn, m->nlayers);
        return NULL;
    }
    if (m->nlayers == m->layers_cap) {
        size_t cap = m->layers_cap ? 2 * m->layers_cap : 8;
        nn_layer_t *l = realloc(m->layers, cap * sizeof *l);
        if (!l) {
            nn__fail("%s: out of memory", fn);
            return NULL;
        }
        m->layers = l;
        m->layers_cap = cap;
    }
    nn_layer_t *l = &m->layers[m->nlayers];
    memset(l, 0, sizeof *l);
    l->kind = kind;
    l->ic = m->cur_c;
    l->ih = m->cur_h;
    l->iw = m->cur_w;
    l->param0 = m->nparams;
    l->buf0 = m->nbufs;
    return l;
}

/* Finish the layer begun by begin_layer: add its parameters and buffers
 * (names and counts), make its output shape current. On failure the layer
 * and any entries it added are dropped. */
static int end_layer(nn_seq_t *m, nn_layer_t *l, const char *const *pnames, const size_t *pcounts,
                     size_t np, const char *const *bnames, const size_t *bcounts, size_t nb)
{
    size_t idx = m->nlayers;
    for (size_t i = 0; i < np; i++)
        if (add_param(m, idx, pnames[i], pcounts[i]) != 0) goto fail;
    for (size_t i = 0; i < nb; i++)
        if (add_buffer(m, idx, bnames[i], bcounts[i]) != 0) goto fail;
    l->nparams = np;
    l->nbufs = nb;
    /* Dropout's stream: its own, from the seed and the layer's index. */
    l->rng = m->seed ^ (0xd1b54a32d192ed03ull * (uint64_t)(idx + 1));
    m->cur_c = l->oc;
    m->cur_h = l->oh;
    m->cur_w = l->ow;
    m->nlayers++;
    return 0;
fail:
    while (m->nparams > l->param0) free((char *)m->params[--m->nparams].name);
    while (m->nbufs > l->buf0) free((char *)m->bufs[--m->nbufs].name);
    return -1;
}

int nn_linear(nn_seq_t *m, size_t out_features)
{
    nn_layer_t *l = begin_layer(m, NN_LINEAR, "nn_linear");
    if (!l) return -1;
    if (out_features == 0 || out_features > (1u << 24))
        return nn__fail("nn_linear: layer %zu: out_features %zu must be in 1..2^24", m->nlayers,
                        out_features);
    if (l->ic * l->ih * out_features > (1u << 30))
        return nn__fail("nn_linear: layer %zu: output of %zu x %zu x %zu floats is too large",
                        m->nlayers, l->ic, l->ih, out_features);
    l->oc = l->ic;
    l->oh = l->ih;
    l->ow = out_features;
    static const char *const names[] = {"weight", "bias"};
    size_t counts[] = {out_features * l->iw, out_features};
    return end_layer(m, l, names, counts, 2, NULL, NULL, 0);
}

int nn_conv2d(nn_seq_t *m, size_t out_channels, size_t k, size_t stride, size_t padding)
{
    nn_layer_t *l = begin_layer(m, NN_CONV2D, "nn_conv2d");
    if (!l) return -1;
    if (out_channels == 0 || out_channels > (1u << 20) || k == 0 || stride == 0 || k > 1024 ||
        stride > 1024 || padding > 1024)
        return nn__fail("nn_conv2d: layer %zu: bad out_channels %zu, k %zu, stride %zu or "
                        "padding %zu (need out_channels >= 1, k >= 1, stride >= 1)",
                        m->nlayers, out_channels, k, stride, padding);
    if (l->ih + 2 * padding < k || l->iw + 2 * padding < k)
        return nn__fail("nn_conv2d: layer %zu: kernel %zu does not fit the %zu x %zu input with "
                        "padding %zu", m->nlayers, k, l->ih, l->iw, padding);
    l->k = k;
    l->stride = stride;
    l->pad = padding;
    l->oc = out_channels;
    l->oh = (l->ih + 2 * padding - k) / stride + 1;
    l->ow = (l->iw + 2 * padding - k) / stride + 1;
    if (l->oc * l->oh * l->ow > (1u << 30) || l->ic * k * k * l->oh * l->ow > (1u << 30))
        return nn__fail("nn_conv2d: layer %zu: output or im2col buffer too large", m->nlayers);
    static const char *const names[] = {"weight", "bias"};
    size_t counts[] = {out_channels * l->ic * k * k, out_channels};
    return end_layer(m, l, names, counts, 2, NULL, NULL, 0);
}

int nn_batchnorm2d(nn_seq_t *m)
{
    nn_layer_t *l = begin_layer(m, NN_BATCHNORM2D, "nn_batchnorm2d");
    if (!l) return -1;
    l->oc = l->ic;
    l->oh = l->ih;
    l->ow = l->iw;
    static const char *const pn[] = {"weight", "bias"};
    static const char *const bn[] = {"running_mean", "running_var"};
    size_t counts[] = {l->ic, l->ic};
    return end_layer(m, l, pn, counts, 2, bn, counts, 2);
}

static int shape_keeping(nn_seq_t *m, layer_kind_t kind, const char *fn)
{
    nn_layer_t *l = begin_layer(m, kind, fn);
    if (!l) return -1;
    l->oc = l->ic;
    l->oh = l->ih;
    l->ow = l->iw;
    return end_layer(m, l, NULL, NULL, 0, NULL, NULL, 0);
}

int nn_relu(nn_seq_t *m) { return shape_keeping(m, NN_RELU, "nn_relu"); }

int nn_maxpool2d(nn_seq_t *m, size_t k, size_t stride)
{
    nn_layer_t *l = begin_layer(m, NN_MAXPOOL2D, "nn_maxpool2d");
    if (!l) return -1;
    if (k == 0 || stride == 0 || k > l->ih || k > l->iw)
        return nn__fail("nn_maxpool2d: layer %zu: bad k %zu or stride %zu for a %zu x %zu input",
                        m->nlayers, k, stride, l->ih, l->iw);
    l->k = k;
    l->stride = stride;
    l->oc = l->ic;
    l->oh = (l->ih - k) / stride + 1;
    l->ow = (l->iw - k) / stride + 1;
    return end_layer(m, l, NULL, NULL, 0, NULL, NULL, 0);
}

int nn_flatten(nn_seq_t *m)
{
    nn_layer_t *l = begin_layer(m, NN_FLATTEN, "nn_flatten");
    if (!l) return -1;
    l->oc = 1;
    l->oh = 1;
    l->ow = l->ic * l->ih * l->iw;
    return end_layer(m, l, NULL, NULL, 0, NULL, NULL, 0);
}

int nn_embedding(nn_seq_t *m, size_t num, size_t dim)
{
    nn_layer_t *l = begin_layer(m, NN_EMBEDDING, "nn_embedding");
    if (!l) return -1;
    if (num == 0 || dim == 0 || num > (1u << 24) || dim > (1u << 20) ||
        nn__in_size(l) * dim > (1u << 30))
        return nn__fail("nn_embedding: layer %zu: bad num %zu or dim %zu (num in 1..2^24, "
                        "dim in 1..2^20)", m->nlayers, num, dim);
    l->num = num;
    l->dim = dim;
    l->oc = 1;
    l->oh = nn__in_size(l);
    l->ow = dim;
    static const char *const names[] = {"weight"};
    size_t counts[] = {num * dim};
    return end_layer(m, l, names, counts, 1, NULL, NULL, 0);
}

int nn_dropout(nn_seq_t *m, float p)
{
    nn_layer_t *l = begin_layer(m, NN_DROPOUT, "nn_dropout");
    if (!l) return -1;
    if (!(p >= 0.0f && p < 1.0f))
        return nn__fail("nn_dropout: layer %zu: p %g must be in [0, 1)", m->nlayers, (double)p);
    l->p = p;
    l->oc = l->ic;
    l->oh = l->ih;
    l->ow = l->iw;
    return end_layer(m, l, NULL, NULL, 0, NULL, NULL, 0);
}

/* ------------------------------------------ parameters: memory and init */

static float rand_uniform(uint64_t *st, float bound)
{
    return (2.0f * nn__rand_f32(st) - 1.0f) * bound;
}

static float rand_normal(uint64_t *st)
{
    /* Box-Muller on two uniforms in (0, 1]. */
    double u1 = ((double)(nn__rand_u64(st) >> 11) + 1.0) * (1.0 / 9007199254740992.0);
    double u2 = (double)(nn__rand_u64(st) >> 11) * (1.0 / 9007199254740992.0);
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

static void init_params(nn_seq_t *m)
{
    uint64_t st = m->seed;
    for (size_t li = 0; li < m->nlayers; li++) {
        nn_layer_t *l = &m->layers[li];
        nn_param_t *p = &m->params[l->param0];
        switch (l->kind) {
        case NN_LINEAR:
        case NN_CONV2D: {
            /* PyTorch: kaiming_uniform_(a=sqrt(5)) gives bound 1/sqrt(fan_in);
             * the bias uses the same bound. */
            size_t fan_in = l->kind == NN_LINEAR ? l->iw : l->ic * l->k * l->k;
            float bound = 1.0f / sqrtf((float)fan_in);
            for (size_t i = 0; i < p[0].count; i++) p[0].data[i] = rand_uniform(&st, bound);
            for (size_t i = 0; i < p[1].count; i++) p[1].data[i] = rand_uniform(&st, bound);
            break;
        }
        case NN_BATCHNORM2D: {
            nn_buffer_t *b = &m->bufs[l->buf0];
            for (size_t i = 0; i < p[0].count; i++) p[0].data[i] = 1.0f;
            for (size_t i = 0; i < p[1].count; i++) p[1].data[i] = 0.0f;
            for (size_t i = 0; i < b[0].count; i++) b[0].data[i] = 0.0f;
            for (size_t i = 0; i < b[1].count; i++) b[1].data[i] = 1.0f;
            break;
        }
        case NN_EMBEDDING:
            for (size_t i = 0; i < p[0].count; i++) p[0].data[i] = rand_normal(&st);
            break;
        default:
            break;
        }
    }
}

/* Allocate and initialise parameters and buffers on first use. */
static int build(nn_seq_t *m, const char *fn)
{
    if (!m) return nn__fail("%s: model is NULL", fn);
    if (m->built) return 0;
    size_t np = 0, nb = 0;
    for (size_t i = 0; i < m->nparams; i++) np += m->params[i].count;
    for (size_t i = 0; i < m->nbufs; i++) nb += m->bufs[i].count;
    float *pm = calloc(np ? np : 1, sizeof(float));
    float *gm = calloc(np ? np : 1, sizeof(float));
    float *bm = calloc(nb ? nb : 1, sizeof(float));
    if (!pm || !gm || !bm) {
        free(pm);
        free(gm);
        free(bm);
        return nn__fail("%s: out of memory allocating %zu parameters and %zu buffer values", fn,
                        np, nb);
    }
    /* An empty model still gets a non-NULL (empty) parameter array. */
    if (!m->params) {
        m->params = calloc(1, sizeof *m->params);
        if (!m->params) {
            free(pm);
            free(gm);
            free(bm);
            return nn__fail("%s: out of memory", fn);
        }
    }
    if (!m->bufs) {
        m->bufs = calloc(1, sizeof *m->bufs);
        if (!m->bufs) {
            free(pm);
            free(gm);
            free(bm);
            return nn__fail("%s: out of memory", fn);
        }
    }
    size_t off = 0;
    for (size_t i = 0; i < m->nparams; i++) {
        m->params[i].data = pm + off;
        m->params[i].grad = gm + off;
        off += m->params[i].count;
    }
    off = 0;
    for (size_t i = 0; i < m->nbufs; i++) {
        m->bufs[i].data = bm + off;
        off += m->bufs[i].count;
    }
    m->param_mem = pm;
    m->grad_mem = gm;
    m->buf_mem = bm;
    m->param_floats = np;
    m->buf_floats = nb;
    m->built = true;
    init_params(m);
    return 0;
}

nn_param_t *nn_params(nn_seq_t *m, size_t *n)
{
    if (!n) {
        nn__fail("nn_params: n is NULL");
        return NULL;
    }
    if (build(m, "nn_params") != 0) return NULL;
    *n = m->nparams;
    return m->params;
}

nn_buffer_t *nn_buffers(nn_seq_t *m, size_t *n)
{
    if (!n) {
        nn__fail("nn_buffers: n is NULL");
        return NULL;
    }
    if (build(m, "nn_buffers") != 0) return NULL;
    *n = m->nbufs;
    return m->bufs;
}

static float *flat(nn_seq_t *m, size_t *count, int which, const char *fn)
{
    if (!count) {
        nn__fail("%s: count is NULL", fn);
        return NULL;
    }
    if (build(m, fn) != 0) return NULL;
    *count = which == 2 ? m->buf_floats : m->param_floats;
    return which == 0 ? m->param_mem : which == 1 ? m->grad_mem : m->buf_mem;
}

float *nn_flat_params(nn_seq_t *m, size_t *count) { return flat(m, count, 0, "nn_flat_params"); }
float *nn_flat_grads(nn_seq_t *m, size_t *count) { return flat(m, count, 1, "nn_flat_grads"); }
float *nn_flat_buffers(nn_seq_t *m, size_t *count) { return flat(m, count, 2, "nn_flat_buffers"); }

void nn_zero_grad(nn_seq_t *m)
{
    if (!m || !m->built) return; /* before build every gradient is zero anyway */
    for (size_t i = 0; i < m->nparams; i++)
        if (m->params[i].grad) memset(m->params[i].grad, 0, m->params[i].count * sizeof(float));
}

void nn_set_training(nn_seq_t *m, bool training)
{
    if (m) m->training = training;
}

void nn_set_grad_ready_hook(nn_seq_t *m, nn_grad_ready_fn fn, void *ctx)
{
    if (!m) return;
    m->hook = fn;
    m->hook_ctx = fn ? ctx : NULL;
}

void nn_set_input_grad(nn_seq_t *m, bool enable)
{
    if (m) m->want_input_grad = enable;
}

size_t nn_input_size(const nn_seq_t *m) { return m ? m->in_c * m->in_h * m->in_w : 0; }
size_t nn_output_size(const nn_seq_t *m) { return m ? m->cur_c * m->cur_h * m->cur_w : 0; }

void nn_output_shape(const nn_seq_t *m, size_t *c, size_t *h, size_t *w)
{
    if (!m) return;
    if (c) *c = m->cur_c;
    if (h) *h = m->cur_h;
    if (w) *w = m->cur_w;
}

size_t nn_num_layers(const nn_seq_t *m) { return m ? m->nlayers : 0; }

const char *nn_layer_kind(const nn_seq_t *m, size_t i)
{
    if (!m || i >= m->nlayers) return "invalid";
    return kind_name(m->layers[i].kind);
}

/* ----------------------------------------------------- forward, backward */

static int ensure_batch(nn_seq_t *m, size_t batch)
{
    if (batch <= m->batch_cap) return 0;
    for (size_t i = 0; i < m->nlayers; i++) {
        nn__layer_free(&m->layers[i]);
        if (nn__layer_alloc(&m->layers[i], batch) != 0) {
            for (size_t j = 0; j <= i; j++) nn__layer_free(&m->layers[j]);
            m->batch_cap = 0;
            return nn__fail("nn_forward: out of memory for a batch of %zu in layer %zu (%s)",
                            batch, i, kind_name(m->layers[i].kind));
        }
    }
    m->batch_cap = batch;
    return 0;
}

float *nn_forward(nn_seq_t *m, const float *input, size_t batch)
{
    if (build(m, "nn_forward") != 0) return NULL;
    if (!input || batch == 0 || batch > (1u << 24)) {
        nn__fail("nn_forward: %s", !input ? "input is NULL" : "batch must be in 1..2^24");
        return NULL;
    }
    if (m->nlayers == 0) {
        nn__fail("nn_forward: the model has no layers");
        return NULL;
    }
    m->batch = 0; /* no valid forward until this one completes */
    m->input_grad_valid = false;
    if (ensure_batch(m, batch) != 0) return NULL;
    const float *x = input;
    for (size_t i = 0; i < m->nlayers; i++) {
        nn_layer_t *l = &m->layers[i];
        if (nn__layer_forward(l, &m->params[l->param0], &m->bufs[l->buf0], x, batch,
                              m->training) != 0)
            return NULL;
        x = l->out;
    }
    m->batch = batch;
    m->input = input;
    return m->layers[m->nlayers - 1].out;
}

int nn_backward(nn_seq_t *m, const float *dout)
{
    if (!m) return nn__fail("nn_backward: model is NULL");
    if (!dout) return nn__fail("nn_backward: dout is NULL");
    if (m->batch == 0) return nn__fail("nn_backward: no successful nn_forward to go back through");
    for (size_t i = 0; i < m->nparams; i++)
        if (!m->params[i].grad)
            return nn__fail("nn_backward: parameter %zu (%s) has a NULL grad pointer", i,
                            m->params[i].name);
    size_t batch = m->batch;
    const float *d = dout;
    for (size_t i = m->nlayers; i-- > 0;) {
        nn_layer_t *l = &m->layers[i];
        nn_param_t *p = &m->params[l->param0];
        const float *in = i == 0 ? m->input : m->layers[i - 1].out;
        if (l->nparams) {
            nn__layer_backward_params(l, p, in, d, batch);
            if (m->hook)
                for (size_t j = l->nparams; j-- > 0;) m->hook(m->hook_ctx, l->param0 + j);
        }
        if (i > 0 || m->want_input_grad) nn__layer_backward_input(l, p, in, d, batch);
        d = l->din;
    }
    m->input_grad_valid = m->want_input_grad;
    return 0;
}

const float *nn_input_grad(const nn_seq_t *m)
{
    if (!m || !m->input_grad_valid || m->nlayers == 0) return NULL;
    return m->layers[0].din;
}
