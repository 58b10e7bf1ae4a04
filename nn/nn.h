/*
 * nn/nn.h — a small neural-network module over flat f32 buffers, in the
 * llm.c style: hand-written forward and backward passes, every parameter a
 * named flat buffer. It lives beside libtdist (it does not need it) and
 * drives the DDP tests, the examples and the benchmarks.
 *
 * A model is a sequential container (nn_seq_t) built layer by layer from a
 * per-sample input shape (C, H, W); each layer infers its input shape from
 * the layer before, as in PyTorch's nn.Sequential:
 *
 *     nn_seq_t *m = nn_seq_create(1, 8, 8, 42);     // 1x8x8 images, seed 42
 *     nn_conv2d(m, 16, 3, 1, 1);                     // -> 16x8x8
 *     nn_batchnorm2d(m);
 *     nn_relu(m);
 *     nn_maxpool2d(m, 2, 2);                         // -> 16x4x4
 *     nn_flatten(m);                                 // -> 1x1x256
 *     nn_linear(m, 10);                              // -> 1x1x10
 *
 *     float *logits = nn_forward(m, x, batch);       // x: batch x 64 floats
 *     float loss;
 *     nn_cross_entropy(logits, labels, batch, 10, &loss, dlogits);
 *     nn_zero_grad(m);
 *     nn_backward(m, dlogits);                       // grads accumulate
 *
 * Layout: activations are row-major, sample after sample; images are NCHW.
 *
 * Parameters and buffers. nn_params() lists every parameter in a fixed order
 * (layer by layer, weight before bias), named as PyTorch names the entries
 * of an nn.Sequential's state_dict ("0.weight", "0.bias", "1.weight", ...).
 * nn_buffers() lists the non-trained state (BatchNorm's running_mean and
 * running_var). All parameter values live in one allocation, all gradients in
 * another, all buffers in a third (nn_flat_params() etc.).
 *
 * Gradients ACCUMULATE: nn_backward adds into param->grad, as PyTorch does;
 * nn_zero_grad() clears them. Layers always write a gradient through the
 * param's current `grad` pointer, so a caller may re-point `grad` of any
 * entry returned by nn_params() (DDP's gradient_as_bucket_view keeps
 * gradients inside its bucket buffers); the new memory must hold `count`
 * floats and stay valid while the model is used.
 *
 * The grad-ready hook. nn_backward runs the layers in reverse order. For a
 * layer with parameters it first computes their gradients, then calls
 * on_grad_ready(ctx, i) for each parameter i of that layer, highest index
 * first, and only then computes the gradient for the layer's input and goes
 * on to the earlier layers. Over one backward every parameter is therefore
 * reported exactly once, in exactly the reverse of nn_params() order, each
 * report comes after that parameter's gradient is final for this backward
 * (nn_backward never touches it again, so it may be reduced in place at
 * once), and before any earlier layer's backward runs. DDP connects this to
 * tdist_ddp_grad_ready.
 *
 * Errors. Functions returning int give 0 on success and -1 on failure;
 * functions returning a pointer give NULL on failure. nn_last_error() then
 * says what failed. Out-parameters are written only on success.
 *
 * Threads. A model is not thread-safe: one thread at a time. Different
 * models are independent. The last-error message is thread-local. Matrix
 * products go through OpenBLAS (cblas_sgemm), whose own thread pool may run
 * them on several cores (nn_set_num_threads).
 */
#ifndef TDIST_NN_H
#define TDIST_NN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One trained tensor: values and gradient, `count` floats each. `name` and
 * `data` are owned by the model; `grad` starts pointing into the model's own
 * gradient memory and may be re-pointed by the caller (see above). */
typedef struct nn_param {
    const char *name;
    float *data;
    float *grad;
    size_t count;
} nn_param_t;

/* Non-trained state (BatchNorm running statistics), owned by the model. */
typedef struct nn_buffer {
    const char *name;
    float *data;
    size_t count;
} nn_buffer_t;

/* Called by nn_backward as each parameter's gradient becomes final. */
typedef void (*nn_grad_ready_fn)(void *ctx, size_t param_index);

typedef struct nn_seq nn_seq_t;

/* ------------------------------------------------------------------------ */
/* Building a model                                                         */
/* ------------------------------------------------------------------------ */

/* A new empty sequential model whose samples have shape (c, h, w) — use
 * (1, 1, n) for a vector of n features. `seed` fixes the initial parameter
 * values (PyTorch's default schemes: Kaiming-uniform weights and uniform
 * biases for Linear and Conv2d, N(0,1) for Embedding, 1 and 0 for BatchNorm)
 * and the Dropout masks, so every process that builds the same model with
 * the same seed holds the same values. Starts in training mode.
 * The caller owns the model: nn_seq_destroy. NULL on bad shape or no memory. */
nn_seq_t *nn_seq_create(size_t c, size_t h, size_t w, uint64_t seed);

/* Free the model and everything it owns. NULL does nothing. Memory the caller
 * pointed grads at is not freed. */
void nn_seq_destroy(nn_seq_t *m);

/* Append a layer. Each returns 0, or -1 if the arguments do not fit the
 * current shape, memory runs out, or the model is already in use (layers can
 * only be added before the first nn_params / nn_buffers / nn_forward /
 * nn_flat_* call, which allocate and initialise the parameters).
 *
 * nn_linear: y = x W^T + b over the LAST dimension (as PyTorch): shape
 *   (c, h, in) -> (c, h, out); W is out x in, b is out.
 * nn_conv2d: 2-D convolution, square kernel k, with stride and zero padding;
 *   (c, h, w) -> (out_channels, (h + 2p - k)/s + 1, (w + 2p - k)/s + 1);
 *   W is out_channels x c x k x k, b is out_channels. im2col + GEMM.
 * nn_batchnorm2d: per-channel normalisation, eps 1e-5, momentum 0.1. In
 *   training mode it uses the batch's statistics and updates running_mean
 *   and running_var (unbiased variance), as PyTorch; in eval mode it uses the
 *   running statistics. Parameters weight (1s) and bias (0s); buffers
 *   running_mean (0s) and running_var (1s). Needs batch*h*w >= 2 in training.
 * nn_relu: max(0, x).
 * nn_maxpool2d: max over k x k windows with the given stride, no padding;
 *   ties go to the first element in the window.
 * nn_flatten: (c, h, w) -> (1, 1, c*h*w); the values do not move.
 * nn_embedding: looks up rows of a num x dim table. Its input holds indices
 *   stored as floats (exact integers in [0, num)); shape (c, h, w) ->
 *   (1, c*h*w, dim). No gradient flows to the indices (their input gradient
 *   is zero). An index out of range fails nn_forward.
 * nn_dropout: in training mode zeroes each element with probability p and
 *   scales the rest by 1/(1-p); a new mask at every training-mode forward,
 *   from a generator seeded by the model seed and the layer's index (two
 *   models built with the same seed draw the same masks, forward after
 *   forward); identity in eval mode. 0 <= p < 1. */
int nn_linear(nn_seq_t *m, size_t out_features);
int nn_conv2d(nn_seq_t *m, size_t out_channels, size_t k, size_t stride, size_t padding);
int nn_batchnorm2d(nn_seq_t *m);
int nn_relu(nn_seq_t *m);
int nn_maxpool2d(nn_seq_t *m, size_t k, size_t stride);
int nn_flatten(nn_seq_t *m);
int nn_embedding(nn_seq_t *m, size_t num, size_t dim);
int nn_dropout(nn_seq_t *m, float p);

/* ------------------------------------------------------------------------ */
/* Parameters, buffers, modes                                               */
/* ------------------------------------------------------------------------ */

/* The model's parameters in their fixed order; *n gets how many. The array
 * belongs to the model and stays at the same address until destroy; callers
 * may change the `grad` pointers in it (nothing else). NULL on failure
 * (no memory, NULL arguments). */
nn_param_t *nn_params(nn_seq_t *m, size_t *n);

/* The model's buffers (may be none: *n = 0, non-NULL result). Same rules. */
nn_buffer_t *nn_buffers(nn_seq_t *m, size_t *n);

/* All parameter values / the model's own gradient memory / all buffer values,
 * each one flat allocation in nn_params (nn_buffers) order; *count gets the
 * number of floats. The gradient memory is what grads point at unless the
 * caller re-pointed them. NULL on failure. */
float *nn_flat_params(nn_seq_t *m, size_t *count);
float *nn_flat_grads(nn_seq_t *m, size_t *count);
float *nn_flat_buffers(nn_seq_t *m, size_t *count);

/* Set every parameter's gradient (wherever its grad points now) to zero. */
void nn_zero_grad(nn_seq_t *m);

/* Training mode (true, the default) or eval mode (false): BatchNorm and
 * Dropout behave differently, see above. */
void nn_set_training(nn_seq_t *m, bool training);

/* Install the grad-ready hook (NULL fn removes it). See the contract above.
 * The hook must not call back into this model. */
void nn_set_grad_ready_hook(nn_seq_t *m, nn_grad_ready_fn fn, void *ctx);

/* Ask nn_backward to also compute the gradient of the loss with respect to
 * the model's input (off by default: it costs one more product in the first
 * layer). Read it with nn_input_grad. */
void nn_set_input_grad(nn_seq_t *m, bool enable);

/* Floats per sample at the model's input / output, and the output shape. */
size_t nn_input_size(const nn_seq_t *m);
size_t nn_output_size(const nn_seq_t *m);
void nn_output_shape(const nn_seq_t *m, size_t *c, size_t *h, size_t *w);

/* Number of layers, and a layer's kind ("linear", "conv2d", ...). */
size_t nn_num_layers(const nn_seq_t *m);
const char *nn_layer_kind(const nn_seq_t *m, size_t i);

/* ------------------------------------------------------------------------ */
/* Forward, backward, loss                                                  */
/* ------------------------------------------------------------------------ */

/* Run the model on `batch` samples (batch x nn_input_size floats). Returns
 * the output (batch x nn_output_size floats), owned by the model and valid
 * until the next nn_forward or destroy. `input` must stay unchanged until the
 * matching nn_backward. In training mode BatchNorm updates its running
 * statistics and Dropout draws a new mask. NULL on failure (batch 0, an
 * embedding index out of range, no memory). */
float *nn_forward(nn_seq_t *m, const float *input, size_t batch);

/* Back-propagate `dout` (d loss / d output of the last nn_forward, batch x
 * nn_output_size floats) through the model, ADDING each parameter's gradient
 * into its grad and calling the grad-ready hook as described above. May be
 * called again for the same forward (it then adds the same gradients again).
 * -1 if there was no forward. */
int nn_backward(nn_seq_t *m, const float *dout);

/* After nn_backward with nn_set_input_grad(m, true): d loss / d input of the
 * last forward (batch x nn_input_size floats), owned by the model. NULL when
 * input gradients are off or no backward ran yet. */
const float *nn_input_grad(const nn_seq_t *m);

/* Softmax cross-entropy averaged over the batch. logits: batch x classes;
 * labels: batch class indices in [0, classes). Writes the mean loss to *loss
 * (may be NULL) and, if dlogits is non-NULL, d loss / d logits
 * ((softmax - onehot) / batch) into it (batch x classes floats; may alias
 * logits). -1 on a label out of range or bad sizes. Thread-safe. */
int nn_cross_entropy(const float *logits, const int *labels, size_t batch, size_t classes,
                     float *loss, float *dlogits);

/* How many rows of logits have their largest value at the label (first
 * maximum on ties). Thread-safe. */
size_t nn_count_correct(const float *logits, const int *labels, size_t batch, size_t classes);

/* ------------------------------------------------------------------------ */
/* Transformer kernels (llm.c style)                                        */
/* ------------------------------------------------------------------------ */

/* The pieces of a GPT, as plain functions over flat row-major f32 buffers;
 * nn_gpt_t below strings them together. N rows of C channels; B sequences
 * of T positions (N = B*T). Every forward WRITES its outputs; every
 * backward ADDS into its gradient outputs (d-inputs and d-parameters), so
 * the caller zeroes them first. None allocates, fails or keeps state; all
 * are thread-safe on distinct buffers. Products go through cblas_sgemm.
 *
 * encoder: out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:] (tokens in [0, V),
 *   the caller checks). Backward adds dout into the rows of dwte and dwpe.
 * layernorm: out = (x - mean) * rstd * w + b over the C channels of each
 *   row, eps 1e-5 (PyTorch's LayerNorm); mean and rstd (N each) are saved
 *   for the backward.
 * matmul: out = inp W^T + bias, inp N x C, W OC x C (PyTorch's Linear
 *   layout), bias OC or NULL.
 * attention: causal multi-head self-attention of qkv (B x T x 3C: q, k, v
 *   side by side, head h at channels h*C/NH ..), out B x T x C; att
 *   (B x NH x T x T) keeps the softmax weights for the backward (zero
 *   above the diagonal). Scale 1/sqrt(C/NH). The backward needs a scratch
 *   of T*T floats.
 * gelu: GPT-2's tanh approximation, 0.5 x (1 + tanh(sqrt(2/pi)(x + 0.044715 x^3))).
 * residual: out = a + b.
 * The loss over the vocabulary is nn_cross_entropy (rows = N, classes = V). */
void nn_encoder_forward(float *out, const int *tokens, const float *wte, const float *wpe,
                        size_t B, size_t T, size_t C);
void nn_encoder_backward(float *dwte, float *dwpe, const float *dout, const int *tokens,
                         size_t B, size_t T, size_t C);
void nn_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                          const float *w, const float *b, size_t N, size_t C);
void nn_layernorm_backward(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                           const float *w, const float *mean, const float *rstd, size_t N,
                           size_t C);
void nn_matmul_forward(float *out, const float *inp, const float *w, const float *bias, size_t N,
                       size_t C, size_t OC);
void nn_matmul_backward(float *dinp, float *dw, float *dbias, const float *dout, const float *inp,
                        const float *w, size_t N, size_t C, size_t OC);
void nn_attention_forward(float *out, float *att, const float *qkv, size_t B, size_t T, size_t C,
                          size_t NH);
void nn_attention_backward(float *dqkv, float *scratch, const float *dout, const float *qkv,
                           const float *att, size_t B, size_t T, size_t C, size_t NH);
void nn_gelu_forward(float *out, const float *inp, size_t n);
void nn_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n);
void nn_residual_forward(float *out, const float *a, const float *b, size_t n);
void nn_residual_backward(float *da, float *db, const float *dout, size_t n);

/* ------------------------------------------------------------------------ */
/* GPT                                                                      */
/* ------------------------------------------------------------------------ */

/* A GPT-2 shaped language model: token and position embeddings, n_layer
 * pre-LayerNorm blocks (x + attn(ln_1(x)), then x + mlp(ln_2(x)) with a
 * 4*n_embd GELU MLP), a final LayerNorm and an LM head tied to the token
 * embedding (logits = ln_f(x) wte^T). Parameters are named as nanoGPT's
 * state_dict ("wte", "wpe", "h.0.ln_1.weight", "h.0.ln_1.bias",
 * "h.0.attn.c_attn.weight", "h.0.attn.c_attn.bias", "h.0.attn.c_proj.weight",
 * "h.0.attn.c_proj.bias", "h.0.ln_2.weight", "h.0.ln_2.bias",
 * "h.0.mlp.c_fc.weight", "h.0.mlp.c_fc.bias", "h.0.mlp.c_proj.weight",
 * "h.0.mlp.c_proj.bias", ..., "ln_f.weight", "ln_f.bias") and listed in that
 * order; a weight is out x in as in PyTorch's Linear. GPT-2's initial
 * values: weights and embeddings N(0, 0.02), the c_proj weights
 * N(0, 0.02/sqrt(2 n_layer)), biases 0, LayerNorm weights 1.
 *
 * The grad-ready hook and gradient accumulation follow the contract of
 * nn_seq_t (above): nn_gpt_backward reports every parameter once, in
 * exactly the reverse of the list order, as soon as its gradient is final
 * (wte, shared by the head and the embedding, comes last), and ADDS into
 * the grads, which a caller may re-point. Not thread-safe; one model per
 * thread. */
typedef struct nn_gpt nn_gpt_t;

typedef struct nn_gpt_config {
    size_t vocab;    /* V: token ids are in [0, V) */
    size_t max_seq;  /* positions of wpe: T <= max_seq */
    size_t n_layer;
    size_t n_head;   /* must divide n_embd */
    size_t n_embd;   /* C */
} nn_gpt_config_t;

/* What a block keeps between forward and backward:
 * NN_ACT_KEEP: every activation in f32 (fastest, most memory);
 * NN_ACT_RECOMPUTE: activation checkpointing: only the block's input (the
 *   residual stream) stays; the backward runs the block's forward again
 *   into one shared scratch first. Gradients are bitwise those of KEEP;
 * NN_ACT_OFFLOAD_BF16: the block's activations go to a host pool in bf16
 *   (round to nearest even) after its forward and come back to f32 for its
 *   backward; the residual stream stays f32. Gradients differ from KEEP by
 *   bf16 rounding of the saved values (see docs/nn.md). */
typedef enum nn_act_mode {
    NN_ACT_KEEP = 0,
    NN_ACT_RECOMPUTE = 1,
    NN_ACT_OFFLOAD_BF16 = 2
} nn_act_mode_t;

/* A new model with activation memory for up to max_batch sequences of
 * max_seq tokens, in mode `mode`, initialised from `seed` (every process
 * with the same seed holds the same values). The caller owns it:
 * nn_gpt_destroy. NULL (nn_last_error) on a bad config or no memory. */
nn_gpt_t *nn_gpt_create(const nn_gpt_config_t *cfg, size_t max_batch, nn_act_mode_t mode,
                        uint64_t seed);
/* Free the model and everything it owns (not memory the caller pointed
 * grads at). NULL does nothing. */
void nn_gpt_destroy(nn_gpt_t *g);

/* Parameters (fixed order, see above) and flat memory, owned by the model,
 * as nn_params / nn_flat_params / nn_flat_grads; zero_grad and the hook as
 * nn_zero_grad / nn_set_grad_ready_hook. NULL for a NULL argument. */
nn_param_t *nn_gpt_params(nn_gpt_t *g, size_t *n);
float *nn_gpt_flat_params(nn_gpt_t *g, size_t *count);
float *nn_gpt_flat_grads(nn_gpt_t *g, size_t *count);
void nn_gpt_zero_grad(nn_gpt_t *g);
void nn_gpt_set_grad_ready_hook(nn_gpt_t *g, nn_grad_ready_fn fn, void *ctx);

/* Forward B x T tokens (B <= max_batch, T <= max_seq). With targets
 * (B x T ids, the next tokens) it writes the mean cross-entropy to *loss
 * and keeps d loss / d logits for nn_gpt_backward; returns the logits
 * memory, which then holds those gradients. Without targets it returns
 * the logits (B x T x V), valid until the next forward. The memory is the
 * model's. NULL on bad sizes or a token or target out of range. */
float *nn_gpt_forward(nn_gpt_t *g, const int *tokens, const int *targets, size_t B, size_t T,
                      float *loss);

/* Back-propagate the loss of the last forward with targets, ADDING into
 * the parameters' grads and calling the grad-ready hook. -1 if the last
 * forward had no targets. `tokens` must be unchanged since the forward. */
int nn_gpt_backward(nn_gpt_t *g);

/* Bytes of activation memory the model holds (all its buffers for
 * activations and their gradients, sized for max_batch x max_seq), and
 * what NN_ACT_KEEP would hold for the same sizes. */
size_t nn_gpt_activation_bytes(const nn_gpt_t *g);
size_t nn_gpt_activation_bytes_keep(const nn_gpt_t *g);

/* ------------------------------------------------------------------------ */
/* Training helpers                                                         */
/* ------------------------------------------------------------------------ */

/* PyTorch's clip_grad_norm_ over the grads of params[0..n): the global L2
 * norm (accumulated in double) is returned; if it exceeds max_norm every
 * gradient is multiplied by max_norm / (norm + 1e-6). max_norm <= 0: only
 * the norm. The caller owns the params; thread-safe on distinct grads. */
double nn_clip_grad_norm(nn_param_t *params, size_t n, double max_norm);

/* Learning rate at `step` (0-based): linear warm-up from lr_max/warmup to
 * lr_max over the first `warmup` steps, then a cosine from lr_max down to
 * lr_min at step total (lr_min after it). Pure; thread-safe. */
double nn_lr_warmup_cosine(size_t step, size_t warmup, size_t total, double lr_max,
                           double lr_min);

/* ------------------------------------------------------------------------ */
/* Misc                                                                     */
/* ------------------------------------------------------------------------ */

/* The message of the calling thread's last nn error ("" if none). */
const char *nn_last_error(void);

/* Threads OpenBLAS may use for one product (process-wide; OpenBLAS's default
 * follows OPENBLAS_NUM_THREADS, else the number of cores). With several
 * ranks on one machine, 1 is usually right. */
void nn_set_num_threads(int n);

#ifdef __cplusplus
}
#endif

#endif /* TDIST_NN_H */
