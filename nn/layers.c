/*
 * nn/layers.c — forward and backward of each layer over flat NCHW buffers.
 * Every matrix product is a cblas_sgemm call (OpenBLAS).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "internal.h"

#define BN_EPS 1e-5f
#define BN_MOMENTUM 0.1f

/* ----------------------------------------------------------------- memory */

static void *alloc_floats(size_t n) { return calloc(n ? n : 1, sizeof(float)); }

void nn__layer_free(nn_layer_t *l)
{
    free(l->out);
    free(l->din);
    free(l->col);
    free(l->dcol);
    free(l->xhat);
    free(l->mask);
    free(l->argmax);
    free(l->mean);
    l->out = l->din = l->col = l->dcol = l->xhat = l->mask = NULL;
    l->argmax = NULL;
    l->mean = l->invstd = l->sdy = l->sdyx = NULL;
}

int nn__layer_alloc(nn_layer_t *l, size_t batch)
{
    size_t in = nn__in_size(l), out = nn__out_size(l);
    l->out = alloc_floats(batch * out);
    l->din = alloc_floats(batch * in);
    if (!l->out || !l->din) return -1;
    switch (l->kind) {
    case NN_CONV2D: {
        size_t rows = l->ic * l->k * l->k, cols = l->oh * l->ow;
        l->col = alloc_floats(batch * rows * cols);
        l->dcol = alloc_floats(rows * cols);
        if (!l->col || !l->dcol) return -1;
        break;
    }
    case NN_BATCHNORM2D:
        l->xhat = alloc_floats(batch * in);
        l->mean = alloc_floats(4 * l->ic); /* mean, invstd, sdy, sdyx */
        if (!l->xhat || !l->mean) return -1;
        l->invstd = l->mean + l->ic;
        l->sdy = l->mean + 2 * l->ic;
        l->sdyx = l->mean + 3 * l->ic;
        break;
    case NN_MAXPOOL2D:
        l->argmax = calloc(batch * out, sizeof *l->argmax);
        if (!l->argmax) return -1;
        break;
    case NN_DROPOUT:
        l->mask = alloc_floats(batch * in);
        if (!l->mask) return -1;
        break;
    default:
        break;
    }
    return 0;
}

/* ----------------------------------------------------------------- linear */

/* y = x W^T + b over rows of iw features: x is (rows x in), W (out x in). */
static void linear_forward(nn_layer_t *l, nn_param_t *p, const float *x, size_t batch)
{
    size_t rows = batch * l->ic * l->ih, in = l->iw, out = l->ow;
    const float *b = p[1].data;
    for (size_t r = 0; r < rows; r++) memcpy(l->out + r * out, b, out * sizeof(float));
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)rows, (int)out, (int)in, 1.0f, x,
                (int)in, p[0].data, (int)in, 1.0f, l->out, (int)out);
}

static void linear_backward_params(nn_layer_t *l, nn_param_t *p, const float *x, const float *dy,
                                   size_t batch)
{
    size_t rows = batch * l->ic * l->ih, in = l->iw, out = l->ow;
    /* dW (out x in) += dy^T (out x rows) x (rows x in) */
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)out, (int)in, (int)rows, 1.0f, dy,
                (int)out, x, (int)in, 1.0f, p[0].grad, (int)in);
    float *db = p[1].grad;
    for (size_t r = 0; r < rows; r++)
        for (size_t o = 0; o < out; o++) db[o] += dy[r * out + o];
}

static void linear_backward_input(nn_layer_t *l, nn_param_t *p, const float *dy, size_t batch)
{
    size_t rows = batch * l->ic * l->ih, in = l->iw, out = l->ow;
    /* dx (rows x in) = dy (rows x out) x W (out x in) */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)rows, (int)in, (int)out, 1.0f, dy,
                (int)out, p[0].data, (int)in, 0.0f, l->din, (int)in);
}

/* ----------------------------------------------------------------- conv2d */

/* One sample's (C,H,W) image into columns: row (c, ki, kj), column (oy, ox). */
static void im2col(const nn_layer_t *l, const float *x, float *col)
{
    size_t k = l->k, s = l->stride, oh = l->oh, ow = l->ow;
    long pad = (long)l->pad, H = (long)l->ih, W = (long)l->iw;
    for (size_t c = 0; c < l->ic; c++)
        for (size_t ki = 0; ki < k; ki++)
            for (size_t kj = 0; kj < k; kj++) {
                float *row = col + ((c * k + ki) * k + kj) * oh * ow;
                const float *img = x + c * (size_t)(H * W);
                for (size_t oy = 0; oy < oh; oy++) {
                    long iy = (long)(oy * s + ki) - pad;
                    for (size_t ox = 0; ox < ow; ox++) {
                        long ix = (long)(ox * s + kj) - pad;
                        row[oy * ow + ox] =
                            (iy >= 0 && iy < H && ix >= 0 && ix < W) ? img[iy * W + ix] : 0.0f;
                    }
                }
            }
}

/* The adjoint of im2col: add columns back into a (zeroed) image. */
static void col2im(const nn_layer_t *l, const float *col, float *x)
{
    size_t k = l->k, s = l->stride, oh = l->oh, ow = l->ow;
    long pad = (long)l->pad, H = (long)l->ih, W = (long)l->iw;
    for (size_t c = 0; c < l->ic; c++)
        for (size_t ki = 0; ki < k; ki++)
            for (size_t kj = 0; kj < k; kj++) {
                const float *row = col + ((c * k + ki) * k + kj) * oh * ow;
                float *img = x + c * (size_t)(H * W);
                for (size_t oy = 0; oy < oh; oy++) {
                    long iy = (long)(oy * s + ki) - pad;
                    if (iy < 0 || iy >= H) continue;
                    for (size_t ox = 0; ox < ow; ox++) {
                        long ix = (long)(ox * s + kj) - pad;
                        if (ix >= 0 && ix < W) img[iy * W + ix] += row[oy * ow + ox];
                    }
                }
            }
}

static void conv_forward(nn_layer_t *l, nn_param_t *p, const float *x, size_t batch)
{
    size_t rows = l->ic * l->k * l->k, cols = l->oh * l->ow, oc = l->oc;
    size_t in = nn__in_size(l), out = nn__out_size(l);
    const float *b = p[1].data;
    for (size_t n = 0; n < batch; n++) {
        float *col = l->col + n * rows * cols, *y = l->out + n * out;
        im2col(l, x + n * in, col);
        for (size_t o = 0; o < oc; o++)
            for (size_t j = 0; j < cols; j++) y[o * cols + j] = b[o];
        /* y (oc x cols) += W (oc x rows) x col (rows x cols) */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)oc, (int)cols, (int)rows, 1.0f,
                    p[0].data, (int)rows, col, (int)cols, 1.0f, y, (int)cols);
    }
}

static void conv_backward_params(nn_layer_t *l, nn_param_t *p, const float *dy, size_t batch)
{
    size_t rows = l->ic * l->k * l->k, cols = l->oh * l->ow, oc = l->oc, out = nn__out_size(l);
    float *db = p[1].grad;
    for (size_t n = 0; n < batch; n++) {
        const float *col = l->col + n * rows * cols, *g = dy + n * out;
        /* dW (oc x rows) += dy (oc x cols) x col^T (cols x rows) */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)oc, (int)rows, (int)cols, 1.0f, g,
                    (int)cols, col, (int)cols, 1.0f, p[0].grad, (int)rows);
        for (size_t o = 0; o < oc; o++) {
            float s = 0.0f;
            for (size_t j = 0; j < cols; j++) s += g[o * cols + j];
            db[o] += s;
        }
    }
}

static void conv_backward_input(nn_layer_t *l, nn_param_t *p, const float *dy, size_t batch)
{
    size_t rows = l->ic * l->k * l->k, cols = l->oh * l->ow, oc = l->oc;
    size_t in = nn__in_size(l), out = nn__out_size(l);
    memset(l->din, 0, batch * in * sizeof(float));
    for (size_t n = 0; n < batch; n++) {
        /* dcol (rows x cols) = W^T (rows x oc) x dy (oc x cols) */
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)rows, (int)cols, (int)oc, 1.0f,
                    p[0].data, (int)rows, dy + n * out, (int)cols, 0.0f, l->dcol, (int)cols);
        col2im(l, l->dcol, l->din + n * in);
    }
}

/* ------------------------------------------------------------ batchnorm2d */

static int bn_forward(nn_layer_t *l, nn_param_t *p, nn_buffer_t *b, const float *x, size_t batch,
                      bool training)
{
    size_t C = l->ic, hw = l->ih * l->iw, in = nn__in_size(l);
    size_t cnt = batch * hw;
    if (training && cnt < 2)
        return nn__fail("nn_forward: batchnorm2d needs more than one value per channel in "
                        "training mode (batch %zu x %zu x %zu)", batch, l->ih, l->iw);
    const float *gamma = p[0].data, *beta = p[1].data;
    float *rmean = b[0].data, *rvar = b[1].data;
    for (size_t c = 0; c < C; c++) {
        float mean, invstd;
        if (training) {
            double s = 0.0, ss = 0.0;
            for (size_t n = 0; n < batch; n++) {
                const float *v = x + n * in + c * hw;
                for (size_t i = 0; i < hw; i++) s += v[i];
            }
            double mu = s / (double)cnt;
            for (size_t n = 0; n < batch; n++) {
                const float *v = x + n * in + c * hw;
                for (size_t i = 0; i < hw; i++) ss += (v[i] - mu) * (v[i] - mu);
            }
            double var = ss / (double)cnt; /* biased: used to normalise */
            mean = (float)mu;
            invstd = (float)(1.0 / sqrt(var + (double)BN_EPS));
            double unbiased = ss / (double)(cnt - 1);
            rmean[c] = (1.0f - BN_MOMENTUM) * rmean[c] + BN_MOMENTUM * (float)mu;
            rvar[c] = (1.0f - BN_MOMENTUM) * rvar[c] + BN_MOMENTUM * (float)unbiased;
        } else {
            mean = rmean[c];
            invstd = 1.0f / sqrtf(rvar[c] + BN_EPS);
        }
        l->mean[c] = mean;
        l->invstd[c] = invstd;
        for (size_t n = 0; n < batch; n++) {
            const float *v = x + n * in + c * hw;
            float *xh = l->xhat + n * in + c * hw, *y = l->out + n * in + c * hw;
            for (size_t i = 0; i < hw; i++) {
                xh[i] = (v[i] - mean) * invstd;
                y[i] = gamma[c] * xh[i] + beta[c];
            }
        }
    }
    return 0;
}

static void bn_backward_params(nn_layer_t *l, nn_param_t *p, const float *dy, size_t batch)
{
    size_t C = l->ic, hw = l->ih * l->iw, in = nn__in_size(l);
    for (size_t c = 0; c < C; c++) {
        float sdy = 0.0f, sdyx = 0.0f;
        for (size_t n = 0; n < batch; n++) {
            const float *g = dy + n * in + c * hw, *xh = l->xhat + n * in + c * hw;
            for (size_t i = 0; i < hw; i++) {
                sdy += g[i];
                sdyx += g[i] * xh[i];
            }
        }
        l->sdy[c] = sdy;
        l->sdyx[c] = sdyx;
        p[0].grad[c] += sdyx;
        p[1].grad[c] += sdy;
    }
}

static void bn_backward_input(nn_layer_t *l, nn_param_t *p, const float *dy, size_t batch)
{
    size_t C = l->ic, hw = l->ih * l->iw, in = nn__in_size(l);
    float cnt = (float)(batch * hw);
    /* The sums were computed by bn_backward_params for this same dy. */
    for (size_t c = 0; c < C; c++) {
        float g = p[0].data[c], is = l->invstd[c];
        for (size_t n = 0; n < batch; n++) {
            const float *d = dy + n * in + c * hw, *xh = l->xhat + n * in + c * hw;
            float *dx = l->din + n * in + c * hw;
            if (l->fwd_training) {
                /* dx = g*invstd/M * (M*dy - sum(dy) - xhat*sum(dy*xhat)) */
                float k = g * is / cnt;
                for (size_t i = 0; i < hw; i++)
                    dx[i] = k * (cnt * d[i] - l->sdy[c] - xh[i] * l->sdyx[c]);
            } else {
                for (size_t i = 0; i < hw; i++) dx[i] = d[i] * g * is;
            }
        }
    }
}

/* ------------------------------------------------------------- maxpool2d */

static void maxpool_forward(nn_layer_t *l, const float *x, size_t batch)
{
    size_t H = l->ih, W = l->iw, oh = l->oh, ow = l->ow, k = l->k, s = l->stride;
    for (size_t n = 0; n < batch; n++)
        for (size_t c = 0; c < l->ic; c++) {
            size_t plane = (n * l->ic + c) * H * W;
            size_t oplane = (n * l->ic + c) * oh * ow;
            for (size_t oy = 0; oy < oh; oy++)
                for (size_t ox = 0; ox < ow; ox++) {
                    size_t best = plane + (oy * s) * W + ox * s;
                    for (size_t ki = 0; ki < k; ki++)
                        for (size_t kj = 0; kj < k; kj++) {
                            size_t at = plane + (oy * s + ki) * W + ox * s + kj;
                            if (x[at] > x[best]) best = at;
                        }
                    l->out[oplane + oy * ow + ox] = x[best];
                    l->argmax[oplane + oy * ow + ox] = (uint32_t)(best - n * nn__in_size(l));
                }
        }
}

static void maxpool_backward_input(nn_layer_t *l, const float *dy, size_t batch)
{
    size_t in = nn__in_size(l), out = nn__out_size(l);
    memset(l->din, 0, batch * in * sizeof(float));
    for (size_t n = 0; n < batch; n++)
        for (size_t i = 0; i < out; i++) l->din[n * in + l->argmax[n * out + i]] += dy[n * out + i];
}

/* ------------------------------------------------------------- embedding */

static int embedding_forward(nn_layer_t *l, nn_param_t *p, const float *x, size_t batch)
{
    size_t T = nn__in_size(l), D = l->dim;
    for (size_t n = 0; n < batch; n++)
        for (size_t t = 0; t < T; t++) {
            float v = x[n * T + t];
            if (!(v >= 0.0f && v < (float)l->num) || v != floorf(v))
                return nn__fail("nn_forward: embedding: sample %zu position %zu holds %g, not an "
                                "index in [0, %zu)", n, t, (double)v, l->num);
            memcpy(l->out + (n * T + t) * D, p[0].data + (size_t)v * D, D * sizeof(float));
        }
    return 0;
}

static void embedding_backward_params(nn_layer_t *l, nn_param_t *p, const float *x,
                                      const float *dy, size_t batch)
{
    size_t T = nn__in_size(l), D = l->dim;
    for (size_t r = 0; r < batch * T; r++) {
        float *g = p[0].grad + (size_t)x[r] * D;
        for (size_t d = 0; d < D; d++) g[d] += dy[r * D + d];
    }
}

/* ---------------------------------------------------------------- dispatch */

int nn__layer_forward(nn_layer_t *l, nn_param_t *p, nn_buffer_t *b, const float *x, size_t batch,
                      bool training)
{
    size_t in = nn__in_size(l), total = batch * in;
    l->fwd_training = training;
    switch (l->kind) {
    case NN_LINEAR: linear_forward(l, p, x, batch); return 0;
    case NN_CONV2D: conv_forward(l, p, x, batch); return 0;
    case NN_BATCHNORM2D: return bn_forward(l, p, b, x, batch, training);
    case NN_RELU:
        for (size_t i = 0; i < total; i++) l->out[i] = x[i] > 0.0f ? x[i] : 0.0f;
        return 0;
    case NN_MAXPOOL2D: maxpool_forward(l, x, batch); return 0;
    case NN_FLATTEN: memcpy(l->out, x, total * sizeof(float)); return 0;
    case NN_EMBEDDING: return embedding_forward(l, p, x, batch);
    case NN_DROPOUT:
        if (!training || l->p == 0.0f) {
            for (size_t i = 0; i < total; i++) l->mask[i] = 1.0f;
        } else {
            float keep = 1.0f / (1.0f - l->p);
            for (size_t i = 0; i < total; i++)
                l->mask[i] = nn__rand_f32(&l->rng) < l->p ? 0.0f : keep;
        }
        for (size_t i = 0; i < total; i++) l->out[i] = x[i] * l->mask[i];
        return 0;
    }
    return nn__fail("nn_forward: invalid layer kind %d", (int)l->kind);
}

void nn__layer_backward_params(nn_layer_t *l, nn_param_t *p, const float *in, const float *dout,
                               size_t batch)
{
    switch (l->kind) {
    case NN_LINEAR: linear_backward_params(l, p, in, dout, batch); break;
    case NN_CONV2D: conv_backward_params(l, p, dout, batch); break;
    case NN_BATCHNORM2D: bn_backward_params(l, p, dout, batch); break;
    case NN_EMBEDDING: embedding_backward_params(l, p, in, dout, batch); break;
    default: break;
    }
}

void nn__layer_backward_input(nn_layer_t *l, nn_param_t *p, const float *in, const float *dout,
                              size_t batch)
{
    size_t total = batch * nn__in_size(l);
    switch (l->kind) {
    case NN_LINEAR: linear_backward_input(l, p, dout, batch); break;
    case NN_CONV2D: conv_backward_input(l, p, dout, batch); break;
    case NN_BATCHNORM2D: bn_backward_input(l, p, dout, batch); break;
    case NN_RELU:
        for (size_t i = 0; i < total; i++) l->din[i] = l->out[i] > 0.0f ? dout[i] : 0.0f;
        break;
    case NN_MAXPOOL2D: maxpool_backward_input(l, dout, batch); break;
    case NN_FLATTEN: memcpy(l->din, dout, total * sizeof(float)); break;
    case NN_EMBEDDING: memset(l->din, 0, total * sizeof(float)); break;
    case NN_DROPOUT:
        for (size_t i = 0; i < total; i++) l->din[i] = dout[i] * l->mask[i];
        break;
    }
}
