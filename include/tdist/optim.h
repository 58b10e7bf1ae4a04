/*
 * tdist/optim.h — optimizers over flat f32 buffers: SGD (momentum,
 * dampening, Nesterov, weight decay), Adam and AdamW (with AMSGrad).
 *
 * The update rules are PyTorch's torch.optim.SGD / Adam / AdamW, element
 * for element, in the same f32 operation order and with a fused
 * multiply-add wherever PyTorch 1.13's CPU kernels fuse (docs/optim.md,
 * "Exact arithmetic"), so a C training loop reproduces a PyTorch one bit
 * for bit (tests/optim compares bits with torch).
 *
 * An optimizer is created over a list of buffers, each a triple
 * (float *param, const float *grad, size_t count) — typically one per model
 * parameter. The caller owns the parameter and gradient memory; the
 * optimizer only remembers the pointers, reads the gradients and updates
 * the parameters in place. It allocates and owns its state (momentum
 * buffers; Adam's exp_avg, exp_avg_sq, max_exp_avg_sq) and a step count per
 * buffer, exactly like PyTorch's per-parameter optimizer state.
 *
 * Gradients are read-only here: zeroing them is the training loop's (or
 * DDP's) job, not the optimizer's.
 *
 * Threads: an optimizer is not thread-safe. Calls on one optimizer must not
 * overlap, with one exception: tdist_optim_step_range() on *different*
 * buffer indices may run concurrently (each touches only its own buffer's
 * state), provided nothing else (set_lr, load, ...) runs at the same time.
 * Different optimizers are independent. No call blocks or does I/O.
 *
 * State can be saved to a byte blob and loaded into an optimizer of the
 * same kind over buffers of the same sizes (checkpoint and resume); see
 * tdist_optim_save().
 */
#ifndef TDIST_OPTIM_H
#define TDIST_OPTIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tdist/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tdist_optim tdist_optim_t;

/* Which update rule an optimizer runs. */
typedef enum tdist_optim_kind {
    TDIST_OPTIM_SGD = 1,
    TDIST_OPTIM_ADAM = 2,   /* weight decay is L2: wd * param added to the gradient */
    TDIST_OPTIM_ADAMW = 3   /* decoupled weight decay: param *= 1 - lr * wd first */
} tdist_optim_kind_t;

/* One buffer the optimizer updates. */
typedef struct tdist_optim_param {
    float *param;        /* count values, updated in place by every step;
                            must not overlap grad or another buffer's param */
    const float *grad;   /* count values, read by every step; may be re-pointed
                            later with tdist_optim_set_grad() */
    size_t count;        /* elements; 0 is allowed (the buffer is never touched) */
    const char *name;    /* optional, for error messages ("fc1.weight");
                            copied at create. NULL: "buffer <index>" */
} tdist_optim_param_t;

/* SGD options; fill with tdist_optim_sgd_opts_init(). PyTorch's
 * torch.optim.SGD:
 *     g = grad (negated if maximize) + weight_decay * param
 *     if momentum != 0:
 *         buf = g                                   on a buffer's first step
 *         buf = momentum * buf + (1 - dampening) * g  afterwards
 *         g = nesterov ? g + momentum * buf : buf
 *     param -= lr * g                                                       */
typedef struct tdist_optim_sgd_opts {
    double lr;            /* learning rate, >= 0. Default 1e-3 */
    double momentum;      /* >= 0. Default 0 (no momentum buffers are kept) */
    double dampening;     /* Default 0 */
    double weight_decay;  /* L2 penalty, >= 0. Default 0 */
    bool nesterov;        /* needs momentum > 0 and dampening == 0. Default false */
    bool maximize;        /* ascend instead of descend. Default false */
} tdist_optim_sgd_opts_t;

/* Adam / AdamW options; fill with tdist_optim_adam_opts_init() or
 * tdist_optim_adamw_opts_init() (they differ only in weight_decay).
 * PyTorch's torch.optim.Adam / AdamW, with t the buffer's step count:
 *     g = grad (negated if maximize)
 *     Adam:  g += weight_decay * param
 *     AdamW: param *= 1 - lr * weight_decay
 *     m = beta1 * m + (1 - beta1) * g
 *     v = beta2 * v + (1 - beta2) * g * g
 *     amsgrad: vmax = max(vmax, v), and vmax replaces v below
 *     denom = sqrt(v) / sqrt(1 - beta2^t) + eps
 *     param -= lr / (1 - beta1^t) * m / denom                               */
typedef struct tdist_optim_adam_opts {
    double lr;            /* learning rate, >= 0. Default 1e-3 */
    double beta1;         /* in [0, 1). Default 0.9 */
    double beta2;         /* in [0, 1). Default 0.999 */
    double eps;           /* >= 0. Default 1e-8 */
    double weight_decay;  /* >= 0. Default 0 (Adam), 1e-2 (AdamW) */
    bool amsgrad;         /* keep max_exp_avg_sq. Default false */
    bool maximize;        /* ascend instead of descend. Default false */
} tdist_optim_adam_opts_t;

/* Fill *opts with PyTorch's defaults. NULL does nothing. Thread-safe. */
TDIST_API void tdist_optim_sgd_opts_init(tdist_optim_sgd_opts_t *opts);
/* Adam defaults: lr 1e-3, betas 0.9/0.999, eps 1e-8, weight_decay 0. */
TDIST_API void tdist_optim_adam_opts_init(tdist_optim_adam_opts_t *opts);
/* AdamW defaults: as Adam but weight_decay 1e-2. */
TDIST_API void tdist_optim_adamw_opts_init(tdist_optim_adam_opts_t *opts);

/* Create an SGD optimizer over params[0..n). opts NULL means defaults.
 * n may be 0 (an optimizer with nothing to do). Every buffer with count > 0
 * needs non-NULL param and grad. The params array is copied (the caller may
 * free it); the memory it points to stays the caller's and must outlive the
 * optimizer (or be re-pointed). Momentum buffers are allocated here (none
 * when momentum is 0). On success *out is set; free with
 * tdist_optim_destroy(). TDIST_ERR_INVALID_ARG (message names the option or
 * buffer) for: NULL out, NULL params with n > 0, a NULL pointer in a
 * buffer, lr < 0, momentum < 0, weight_decay < 0, NaN or infinite values,
 * nesterov without momentum or with dampening. TDIST_ERR_NO_MEMORY if the
 * state cannot be allocated. Never blocks; thread-safe. */
TDIST_API tdist_status_t tdist_optim_create_sgd(const tdist_optim_param_t *params, size_t n,
                                                const tdist_optim_sgd_opts_t *opts,
                                                tdist_optim_t **out);

/* Create an Adam optimizer (L2 weight decay). As tdist_optim_create_sgd;
 * opts NULL means tdist_optim_adam_opts_init() defaults. Invalid: lr < 0,
 * eps < 0, weight_decay < 0, a beta outside [0, 1), NaN or infinite
 * values. State: exp_avg and exp_avg_sq (and max_exp_avg_sq with amsgrad),
 * zero-initialised, one of each per buffer. */
TDIST_API tdist_status_t tdist_optim_create_adam(const tdist_optim_param_t *params, size_t n,
                                                 const tdist_optim_adam_opts_t *opts,
                                                 tdist_optim_t **out);

/* Create an AdamW optimizer (decoupled weight decay). As
 * tdist_optim_create_adam; opts NULL means tdist_optim_adamw_opts_init()
 * defaults (weight_decay 1e-2). */
TDIST_API tdist_status_t tdist_optim_create_adamw(const tdist_optim_param_t *params, size_t n,
                                                  const tdist_optim_adam_opts_t *opts,
                                                  tdist_optim_t **out);

/* Free the optimizer and its state (never the caller's buffers).
 * NULL does nothing. */
TDIST_API void tdist_optim_destroy(tdist_optim_t *opt);

/* One optimization step over every buffer: each buffer's step count goes up
 * by one and its parameters are updated from its gradients. Equivalent to
 * tdist_optim_step_range(opt, i, 0, count_i) for every i. Never blocks.
 * Not thread-safe (see the header comment). */
TDIST_API tdist_status_t tdist_optim_step(tdist_optim_t *opt);

/* Step one buffer, or a part of one: buffer index's step count goes up by
 * one, and elements [offset, offset + count) of its parameters and state
 * are updated; the rest of the buffer is left alone.
 *   - fused optimizer-in-backward hooks step each buffer as soon as its
 *     gradient is reduced: tdist_optim_step_range(opt, i, 0, count_i);
 *   - ZeRO-style sharding steps only the slice a rank owns.
 * Call it once per buffer per iteration: two calls on disjoint slices of
 * one buffer in the same iteration would advance its step count twice
 * (Adam's bias correction and SGD's first-step momentum depend on it).
 * (An optimizer created over just the shard, param + offset, is the
 * alternative that also saves state memory.) TDIST_ERR_INVALID_ARG for an
 * index >= the number of buffers or a range beyond the buffer. Calls on
 * different indices may run concurrently on different threads. */
TDIST_API tdist_status_t tdist_optim_step_range(tdist_optim_t *opt, size_t index, size_t offset,
                                                size_t count);

/* Re-point buffer index's gradient (DDP's gradient_as_bucket_view moves
 * gradients into bucket memory) or parameter. The new memory must hold the
 * buffer's count values; the caller owns it. NULL is TDIST_ERR_INVALID_ARG
 * unless the buffer's count is 0. Not thread-safe. */
TDIST_API tdist_status_t tdist_optim_set_grad(tdist_optim_t *opt, size_t index, const float *grad);
TDIST_API tdist_status_t tdist_optim_set_param(tdist_optim_t *opt, size_t index, float *param);

/* The learning rate used by the next step; schedulers change it between
 * steps. set_lr: lr must be finite and >= 0. get_lr writes *lr. */
TDIST_API tdist_status_t tdist_optim_set_lr(tdist_optim_t *opt, double lr);
TDIST_API tdist_status_t tdist_optim_get_lr(const tdist_optim_t *opt, double *lr);

/* Facts about an optimizer: its kind, its number of buffers, and the step
 * count of buffer index (how many steps it has taken; 0 after create). */
TDIST_API tdist_status_t tdist_optim_kind(const tdist_optim_t *opt, tdist_optim_kind_t *kind);
TDIST_API tdist_status_t tdist_optim_num_buffers(const tdist_optim_t *opt, size_t *n);
TDIST_API tdist_status_t tdist_optim_step_count(const tdist_optim_t *opt, size_t index,
                                                uint64_t *steps);

/* Set buffer index's step count (restoring a state assembled elsewhere,
 * e.g. ZeRO re-sharding a checkpoint). Not thread-safe. */
TDIST_API tdist_status_t tdist_optim_set_step_count(tdist_optim_t *opt, size_t index,
                                                    uint64_t steps);

/* Direct access to the state: *nstate = state arrays per element (0 for
 * SGD without momentum, 1 SGD momentum_buffer, 2 Adam exp_avg and
 * exp_avg_sq, 3 with amsgrad's max_exp_avg_sq, in that order); *ptr =
 * buffer index's array `slot` (count floats, owned by the optimizer, valid
 * until it is destroyed; reading or writing it between steps is allowed).
 * TDIST_ERR_INVALID_ARG for an index or slot out of range. Not
 * thread-safe. */
TDIST_API tdist_status_t tdist_optim_num_state(const tdist_optim_t *opt, int *nstate);
TDIST_API tdist_status_t tdist_optim_state_ptr(tdist_optim_t *opt, size_t index, int slot,
                                               float **ptr);

/* The whole state as one flat f32 vector, for code that treats it as a
 * unit (averaging it over ranks, say) without knowing the blob layout:
 * buffer after buffer in creation order, each buffer's state arrays in
 * slot order (as tdist_optim_state_ptr numbers them), count values each.
 *   state_count: *count = the vector's length (the sum over buffers of
 *     count x nstate; 0 for SGD without momentum).
 *   copy_state_out: writes the vector into dst (count values, the
 *     caller's memory).
 *   copy_state_in: replaces the state with src (count values, read only,
 *     not kept); step counts and hyperparameters stay as they are.
 * count must be the state_count's (TDIST_ERR_INVALID_ARG otherwise, and
 * nothing is copied). Never block; not thread-safe (calls on one
 * optimizer must not overlap). */
TDIST_API tdist_status_t tdist_optim_state_count(const tdist_optim_t *opt, size_t *count);
TDIST_API tdist_status_t tdist_optim_copy_state_out(const tdist_optim_t *opt, float *dst,
                                                    size_t count);
TDIST_API tdist_status_t tdist_optim_copy_state_in(tdist_optim_t *opt, const float *src,
                                                   size_t count);

/* Name of a kind: "sgd", "adam", "adamw"; "invalid" otherwise. */
TDIST_API const char *tdist_optim_kind_name(tdist_optim_kind_t kind);

/* ------------------------------------------------------------------------ */
/* Saving and loading state (checkpoints)                                   */
/* ------------------------------------------------------------------------ */

/* Version of the state blob layout written by tdist_optim_save(). */
#define TDIST_OPTIM_STATE_VERSION 1

/* Bytes tdist_optim_save() needs for this optimizer's state: a header
 * (magic "TDOPTIM", version, byte order, kind, state layout, number of
 * buffers, hyperparameters), then each buffer's element count and step
 * count, then the state arrays, then a checksum. Written to *size. */
TDIST_API tdist_status_t tdist_optim_state_size(const tdist_optim_t *opt, size_t *size);

/* Write the state blob into buf (size bytes, at least
 * tdist_optim_state_size()); buf needs no alignment and is the caller's.
 * The blob holds state, step counts and hyperparameters, not the
 * parameters themselves (save those with the model). Host byte order.
 * TDIST_ERR_INVALID_ARG if size is too small (nothing written). */
TDIST_API tdist_status_t tdist_optim_save(const tdist_optim_t *opt, void *buf, size_t size);

/* Load a blob written by tdist_optim_save() into opt. The blob must come
 * from an optimizer of the same kind over the same number of buffers with
 * the same counts and the same state layout (SGD with and without
 * momentum differ; Adam with and without amsgrad differ); anything else is
 * TDIST_ERR_MISMATCH with a message naming the difference ("blob is for
 * adam, this optimizer is sgd", "buffer 2 (fc1.bias): 10 elements in the
 * blob, 12 here"). A blob that is truncated, not a tdist optimizer blob,
 * of another version or byte order, or whose checksum fails is
 * TDIST_ERR_INVALID_ARG. On any error opt is left unchanged. On success
 * the state, the step counts and the learning rate (which schedulers
 * change) come from the blob; the other hyperparameters stay those opt was
 * created with (so a resumed run may change, say, weight decay). */
TDIST_API tdist_status_t tdist_optim_load(tdist_optim_t *opt, const void *buf, size_t size);

#ifdef __cplusplus
}
#endif
#endif /* TDIST_OPTIM_H */
