/*
 * nn/transformer.c — the kernels of a GPT over flat f32 buffers, forward
 * and backward written by hand in the llm.c manner: encoder, LayerNorm,
 * matmul (Linear), causal multi-head attention, GELU, residual. Every
 * backward adds into its outputs. Matrix products (the Linear layers and
 * the attention's per-head q k^T and att v) are cblas_sgemm calls.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <cblas.h>

#include "internal.h"

void nn_encoder_forward(float *out, const int *tokens, const float *wte, const float *wpe,
                        size_t B, size_t T, size_t C)
{
    for (size_t b = 0; b < B; b++)
        for (size_t t = 0; t < T; t++) {
            float *o = out + (b * T + t) * C;
            const float *we = wte + (size_t)tokens[b * T + t] * C, *pe = wpe + t * C;
            for (size_t i = 0; i < C; i++) o[i] = we[i] + pe[i];
        }
}

void nn_encoder_backward(float *dwte, float *dwpe, const float *dout, const int *tokens,
                         size_t B, size_t T, size_t C)
{
    for (size_t b = 0; b < B; b++)
        for (size_t t = 0; t < T; t++) {
            const float *d = dout + (b * T + t) * C;
            float *dwe = dwte + (size_t)tokens[b * T + t] * C, *dpe = dwpe + t * C;
            for (size_t i = 0; i < C; i++) {
                dwe[i] += d[i];
                dpe[i] += d[i];
            }
        }
}

void nn_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                          const float *w, const float *b, size_t N, size_t C)
{
    const float eps = 1e-5f;
    for (size_t n = 0; n < N; n++) {
        const float *x = inp + n * C;
        float m = 0.0f;
        for (size_t i = 0; i < C; i++) m += x[i];
        m /= (float)C;
        float v = 0.0f;
        for (size_t i = 0; i < C; i++) v += (x[i] - m) * (x[i] - m);
        v /= (float)C;
        float s = 1.0f / sqrtf(v + eps);
        float *o = out + n * C;
        for (size_t i = 0; i < C; i++) o[i] = (x[i] - m) * s * w[i] + b[i];
        mean[n] = m;
        rstd[n] = s;
    }
}

void nn_layernorm_backward(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                           const float *w, const float *mean, const float *rstd, size_t N,
                           size_t C)
{
    for (size_t n = 0; n < N; n++) {
        const float *x = inp + n * C, *d = dout + n * C;
        float m = mean[n], s = rstd[n];
        /* the two means the input gradient needs: of dnorm and of dnorm * norm */
        float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
        for (size_t i = 0; i < C; i++) {
            float norm = (x[i] - m) * s, dnorm = w[i] * d[i];
            dnorm_mean += dnorm;
            dnorm_norm_mean += dnorm * norm;
        }
        dnorm_mean /= (float)C;
        dnorm_norm_mean /= (float)C;
        float *di = dinp + n * C;
        for (size_t i = 0; i < C; i++) {
            float norm = (x[i] - m) * s, dnorm = w[i] * d[i];
            db[i] += d[i];
            dw[i] += norm * d[i];
            di[i] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
        }
    }
}

void nn_matmul_forward(float *out, const float *inp, const float *w, const float *bias, size_t N,
                       size_t C, size_t OC)
{
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)N, (int)OC, (int)C, 1.0f, inp,
                (int)C, w, (int)C, 0.0f, out, (int)OC);
    if (!bias) return;
    for (size_t n = 0; n < N; n++)
        for (size_t o = 0; o < OC; o++) out[n * OC + o] += bias[o];
}

void nn_matmul_backward(float *dinp, float *dw, float *dbias, const float *dout, const float *inp,
                        const float *w, size_t N, size_t C, size_t OC)
{
    /* dinp += dout W; dW += dout^T inp; dbias += column sums of dout */
    if (dinp)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)N, (int)C, (int)OC, 1.0f,
                    dout, (int)OC, w, (int)C, 1.0f, dinp, (int)C);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)OC, (int)C, (int)N, 1.0f, dout,
                (int)OC, inp, (int)C, 1.0f, dw, (int)C);
    if (!dbias) return;
    for (size_t n = 0; n < N; n++)
        for (size_t o = 0; o < OC; o++) dbias[o] += dout[n * OC + o];
}

/* Row i of a T x T score matrix: softmax over columns 0..i, zeros after. */
static void causal_softmax_row(float *row, size_t i, size_t T)
{
    float mx = row[0];
    for (size_t j = 1; j <= i; j++)
        if (row[j] > mx) mx = row[j];
    float sum = 0.0f;
    for (size_t j = 0; j <= i; j++) {
        row[j] = expf(row[j] - mx);
        sum += row[j];
    }
    float inv = 1.0f / sum;
    for (size_t j = 0; j <= i; j++) row[j] *= inv;
    for (size_t j = i + 1; j < T; j++) row[j] = 0.0f;
}

void nn_attention_forward(float *out, float *att, const float *qkv, size_t B, size_t T, size_t C,
                          size_t NH)
{
    size_t hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    for (size_t b = 0; b < B; b++)
        for (size_t h = 0; h < NH; h++) {
            const float *q = qkv + b * T * 3 * C + h * hs, *k = q + C, *v = q + 2 * C;
            float *a = att + (b * NH + h) * T * T;
            /* scores = scale q k^T (the upper triangle is computed, then masked) */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)T, (int)T, (int)hs, scale,
                        q, (int)(3 * C), k, (int)(3 * C), 0.0f, a, (int)T);
            for (size_t i = 0; i < T; i++) causal_softmax_row(a + i * T, i, T);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)T, (int)hs, (int)T, 1.0f,
                        a, (int)T, v, (int)(3 * C), 0.0f, out + b * T * C + h * hs, (int)C);
        }
}

void nn_attention_backward(float *dqkv, float *scratch, const float *dout, const float *qkv,
                           const float *att, size_t B, size_t T, size_t C, size_t NH)
{
    size_t hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    int ld3 = (int)(3 * C);
    for (size_t b = 0; b < B; b++)
        for (size_t h = 0; h < NH; h++) {
            size_t off = b * T * 3 * C + h * hs;
            const float *q = qkv + off, *k = q + C, *v = q + 2 * C;
            float *dq = dqkv + off, *dk = dq + C, *dv = dq + 2 * C;
            const float *a = att + (b * NH + h) * T * T, *dO = dout + b * T * C + h * hs;
            float *d = scratch; /* datt, then dscores in place */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)T, (int)T, (int)hs, 1.0f,
                        dO, (int)C, v, ld3, 0.0f, d, (int)T);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)T, (int)hs, (int)T, 1.0f, a,
                        (int)T, dO, (int)C, 1.0f, dv, ld3);
            for (size_t i = 0; i < T; i++) {
                const float *ar = a + i * T;
                float *dr = d + i * T, dot = 0.0f;
                for (size_t j = 0; j <= i; j++) dot += ar[j] * dr[j];
                for (size_t j = 0; j <= i; j++) dr[j] = ar[j] * (dr[j] - dot);
                for (size_t j = i + 1; j < T; j++) dr[j] = 0.0f;
            }
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)T, (int)hs, (int)T, scale,
                        d, (int)T, k, ld3, 1.0f, dq, ld3);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)T, (int)hs, (int)T, scale, d,
                        (int)T, q, ld3, 1.0f, dk, ld3);
        }
}

#define GELU_K 0.7978845608028654f /* sqrt(2 / pi) */

/* e^x for the GELU, in arithmetic the compiler vectorises (no libm call):
 * x = n ln2 + r with |r| <= ln2/2 (Cody-Waite, two-part ln2), e^r by its
 * Taylor polynomial to r^6 (relative error below 2e-7), times 2^n built in
 * the exponent bits. x is clamped to [-87, 88], where 2^n stays normal. */
static inline float exp_vec(float x)
{
    x = x < -87.0f ? -87.0f : x > 88.0f ? 88.0f : x;
    const float shifter = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
    float n = (x * 1.44269504088896341f + shifter) - shifter;
    float r = x - n * 0.693145751953125f - n * 1.428606765330187e-6f;
    float p = 1.0f + r * (1.0f + r * (0.5f + r * (1.0f / 6 + r * (1.0f / 24 + r * (1.0f / 120 +
                                                                   r * (1.0f / 720))))));
    int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

/* 0.5 (1 + tanh(u)) is the logistic function of 2u: no tanh needed, and no
 * cancellation where tanh(u) is near -1. */
static inline float gelu_sigmoid(float x)
{
    float u = GELU_K * (x + 0.044715f * x * x * x);
    return 1.0f / (1.0f + exp_vec(-2.0f * u));
}

void nn_gelu_forward(float *out, const float *inp, size_t n)
{
    for (size_t i = 0; i < n; i++) out[i] = inp[i] * gelu_sigmoid(inp[i]);
}

void nn_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n)
{
    /* d/dx [x s(2u)] = s + x s (1 - s) 2 du/dx, du/dx = K (1 + 3 * 0.044715 x^2) */
    for (size_t i = 0; i < n; i++) {
        float x = inp[i], s = gelu_sigmoid(x);
        float du = GELU_K * (1.0f + 3.0f * 0.044715f * x * x);
        dinp[i] += (s + 2.0f * x * s * (1.0f - s) * du) * dout[i];
    }
}

void nn_residual_forward(float *out, const float *a, const float *b, size_t n)
{
    for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

void nn_residual_backward(float *da, float *db, const float *dout, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        da[i] += dout[i];
        db[i] += dout[i];
    }
}

double nn_clip_grad_norm(nn_param_t *params, size_t n, double max_norm)
{
    double sq = 0.0;
    for (size_t p = 0; p < n; p++)
        for (size_t i = 0; i < params[p].count; i++)
            sq += (double)params[p].grad[i] * (double)params[p].grad[i];
    double norm = sqrt(sq);
    if (max_norm > 0 && norm > max_norm) {
        float f = (float)(max_norm / (norm + 1e-6));
        for (size_t p = 0; p < n; p++)
            for (size_t i = 0; i < params[p].count; i++) params[p].grad[i] *= f;
    }
    return norm;
}

double nn_lr_warmup_cosine(size_t step, size_t warmup, size_t total, double lr_max, double lr_min)
{
    if (step < warmup) return lr_max * (double)(step + 1) / (double)warmup;
    if (step >= total || total <= warmup) return lr_min;
    double r = (double)(step - warmup) / (double)(total - warmup);
    return lr_min + 0.5 * (1.0 + cos(3.14159265358979323846 * r)) * (lr_max - lr_min);
}
