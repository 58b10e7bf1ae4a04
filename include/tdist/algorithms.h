/*
 * tdist/algorithms.h — what a training job does on top of DDP to spend
 * less time and fewer bytes on communication: communication hooks
 * (compression of the gradient buckets) and collectives with compressed
 * wire formats. Built on the public APIs of pg, ddp and optim only
 * (src/algorithms/), never on their internals. See docs/algorithms.md.
 *
 * A hook is registered with tdist_ddp_register_comm_hook(ddp, state, fn)
 * (tdist/ddp.h), or with the hook's own register function (which checks
 * the state first): the state is the caller's, created and destroyed with
 * the functions below, serves one reducer, and must outlive the reducer's
 * last backward_end. Every hook of this layer checks, on its first bucket,
 * that every rank of the group runs the same hook with the same options
 * (one small all_gather); ranks that differ fail together, naming both.
 * Threads: a hook's state is used by one training thread (the reducer's);
 * not thread-safe.
 */
#ifndef TDIST_ALGORITHMS_H
#define TDIST_ALGORITHMS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tdist/core.h"
#include "tdist/ddp.h"
#include "tdist/join.h"
#include "tdist/optim.h"
#include "tdist/pg.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------- 16-bit compression */
/* (src/algorithms/compress.c)
 *
 * PyTorch's fp16_compress_hook, bf16_compress_hook, fp16_compress_wrapper
 * and bf16_compress_wrapper (torch.distributed.algorithms.ddp_comm_hooks)
 * for the DDP reducer: each bucket crosses the network as 16-bit values,
 * half the bytes of f32.
 *
 *  - The compression hook (tdist_compress_hook_create): every rank casts
 *    its bucket to the wire format and divides by bucket->divisor (the
 *    world size, or what Join says), the 16-bit values are all_reduced
 *    (SUM, asynchronously, on bucket->pg), and a continuation casts the
 *    sum back into the bucket. Rounding exactly as PyTorch 1.13:
 *        f16:  h = f16( fl( float(f16(g)) / W ) )
 *        bf16: h = bf16( fl( float(bf16(g)) / W ) )
 *    (cast first, then a true f32 division of the 16-bit value, rounded
 *    to nearest even again; g of an f64 bucket is rounded to f32 first,
 *    as PyTorch's cast does). Each addition of the sum is
 *    16bit(float(a) + float(b)); decompression is exact. A NaN gradient
 *    goes on the wire as PyTorch's division leaves it: f16 0x7E00 with
 *    the gradient's sign, bf16 0x7FC0. With 2 ranks the result equals
 *    PyTorch's bit for bit (tests/algorithms, against PyTorch's own
 *    recording); with more, the sum's association is tdist's, not Gloo's
 *    ring's. bf16 works on every backend and transport (PyTorch 1.13's
 *    Gloo refuses a bf16 all_reduce).
 *  - The wrapper (tdist_compress_wrapper_create): the same casts around
 *    any other hook. The inner hook is called with a bucket whose buffer
 *    and dtype are the 16-bit copy (everything else as the reducer's
 *    bucket) and does its own averaging; when its work and every
 *    continuation it chains have completed, the 16-bit result is cast
 *    back into the reducer's bucket. The cast is PyTorch's Tensor.to():
 *    round to nearest even; a NaN keeps its sign as f16 (0x7E00 plus the
 *    top payload bits) and becomes 0xFFFF as bf16 from an f32 bucket
 *    (PyTorch's vectorised cast), 0x7FC0 from an f64 one.
 *
 * Correct by construction. The first time a state reduces a bucket, every
 * rank's hook kind and options (wire format; the inner hook's name for a
 * wrapper) are compared across bucket->pg with one small blocking
 * all_gather. Ranks that differ fail on every rank with
 * TDIST_ERR_MISMATCH and a message naming both ("comm hook mismatch:
 * rank 0 runs fp16_compress_hook, rank 1 runs bf16_compress_hook ...")
 * before any gradient is sent; a rank running a hook that is not from
 * this layer makes that all_gather fail on every rank with a collective
 * mismatch naming both collectives. Bad options fail at create, before
 * any communication.
 *
 * DDP and Join. The hooks work with every reducer option (no_sync,
 * find_unused_parameters, gradient_as_bucket_view, f32 and f64 buckets)
 * and under Join: a joined rank's reducer runs the hook on zeros, with
 * Join's divisor, exactly as an active rank does.
 *
 * Cost: a 16-bit staging copy of each bucket (2 bytes per element, kept
 * by the state and reused every iteration), one cast pass each way.
 */

/* A compression hook or wrapper: the state tdist_compress_hook runs on. */
typedef struct tdist_compress tdist_compress_t;

/* Options. Fill with tdist_compress_opts_init(); NULL means defaults. */
typedef struct tdist_compress_opts {
    /* The wire format: TDIST_F16 (default: fp16_compress_hook /
     * fp16_compress_wrapper) or TDIST_BF16 (bf16_compress_hook /
     * bf16_compress_wrapper). Anything else fails at create. */
    tdist_dtype_t wire;
    /* Optional, for tests and debugging (e.g. counting values that
     * overflow f16): called on the training thread with each bucket's
     * 16-bit values, count = bucket->count: once when they are cast (before
     * the all_reduce, or the inner hook, starts; reduced = false) and once
     * when the reduction has completed (before the cast back; reduced =
     * true). bucket is the reducer's bucket. Must not keep the pointers,
     * write the values or issue collectives. NULL: none. */
    void (*observe)(void *arg, const tdist_ddp_bucket_t *bucket, const uint16_t *wire,
                    bool reduced);
    void *observe_arg;
} tdist_compress_opts_t;

/* Fill *opts with the defaults (wire TDIST_F16, no observer). NULL does
 * nothing. Thread-safe. */
TDIST_API void tdist_compress_opts_init(tdist_compress_opts_t *opts);

/* Create the state of a compression hook (fp16_compress_hook, or
 * bf16_compress_hook with opts->wire = TDIST_BF16). Does not communicate.
 * TDIST_ERR_INVALID_ARG for a NULL out or a wire format other than f16 /
 * bf16; TDIST_ERR_NO_MEMORY. The caller owns *out (tdist_compress_destroy)
 * and registers it with tdist_compress_register(). Thread-safe. */
TDIST_API tdist_status_t tdist_compress_hook_create(const tdist_compress_opts_t *opts,
                                                    tdist_compress_t **out);

/* Create the state of a wrapper around inner (fp16_compress_wrapper /
 * bf16_compress_wrapper): inner(inner_state, bucket16, result) is called
 * with the 16-bit bucket, and its continuations with inner_state and that
 * bucket. inner_state is borrowed (it must outlive the state's use).
 * inner_name names the inner hook to the other ranks (they must all wrap
 * the same one) and in messages; it is copied. It may be NULL only for
 * tdist's own hooks (tdist_ddp_allreduce_hook, tdist_compress_hook), which
 * are named for you. Does not communicate. TDIST_ERR_INVALID_ARG for a
 * NULL out or inner, a bad wire format, or a NULL inner_name for another
 * hook; TDIST_ERR_NO_MEMORY. The caller owns *out. Thread-safe. */
TDIST_API tdist_status_t tdist_compress_wrapper_create(tdist_ddp_comm_hook_fn inner,
                                                       void *inner_state, const char *inner_name,
                                                       const tdist_compress_opts_t *opts,
                                                       tdist_compress_t **out);

/* Free the state and its staging buffers. Call it after the reducer's
 * last backward_end (or after tdist_ddp_destroy). NULL does nothing. */
TDIST_API void tdist_compress_destroy(tdist_compress_t *c);

/* Register c as ddp's comm hook: tdist_ddp_register_comm_hook_flags(ddp,
 * c, tdist_compress_hook, TDIST_DDP_HOOK_GRADS), after checking that
 * neither is NULL: the hook casts each gradient where it lives into its
 * 16-bit staging and the result back, so the reducer copies no gradient
 * into the bucket and none back (registered with the plain
 * tdist_ddp_register_comm_hook, the hook works on the bucket, with those
 * copies; the results are the same bits). The rules of
 * tdist_ddp_register_comm_hook apply (once, before the first
 * forward_begin). Does not communicate. c is borrowed: it must outlive
 * the reducer's last backward_end. Training thread. */
TDIST_API tdist_status_t tdist_compress_register(tdist_ddp_t *ddp, tdist_compress_t *c);

/* The comm hook itself (a tdist_ddp_comm_hook_fn; state is a
 * tdist_compress_t). Called by the reducer on its training thread; it
 * blocks only on a state's first call (the agreement above), otherwise it
 * casts the bucket, posts the all_reduce (or calls the inner hook) and
 * returns. Errors name the rank, group, iteration and bucket:
 * TDIST_ERR_INVALID_ARG for a NULL state, bucket or result, a bucket
 * whose dtype is not floating point or whose divisor is < 1 (before any
 * communication); TDIST_ERR_MISMATCH when the ranks' hooks differ; the
 * inner hook's or the all_reduce's error. Not thread-safe for one state. */
TDIST_API tdist_status_t tdist_compress_hook(void *state, const tdist_ddp_bucket_t *bucket,
                                             tdist_ddp_hook_result_t *result);


/* ------------------------------------------------ int8 quantised all_reduce */
/* (src/algorithms/int8.c)
 *
 * A comm hook that reduces each f32 (or f64) DDP bucket as int8 codes with
 * one f32 scale per block of values: about a quarter of the bytes of an
 * f32 all_reduce. Like a reduce-scatter followed by an all_gather, on a
 * group of W ranks (bucket->pg):
 *
 *  1. The bucket's n elements are cut into W shards, one per rank, in rank
 *     order (the first n % W shards have one element more; with n < W some
 *     are empty), and each shard into blocks of opts.block_size values (the
 *     last one shorter). Each rank quantises its own gradient x (f64 rounded
 *     to f32 first; plus its input residual with error feedback) block by
 *     block: scale s = max|x| / 127 over the block's finite values (a block
 *     of zeros has s = 0), code q = round(x / s), rounded half away from
 *     zero, clamped to [-127, 127]. It sends rank p the codes and scales of
 *     shard p (one asynchronous all_to_all of bytes).
 *  2. In a continuation, rank p dequantises every rank's shard p (q * s in
 *     f32), sums them in f32 in rank order 0, 1, ..., W-1, divides the sum
 *     by bucket->divisor (a true f32 division: the quantised values are
 *     the undivided gradients, so the averaging is the plain all_reduce's,
 *     sum / divisor) (plus its sum residual with sum error feedback),
 *     quantises the average the same way, and all_gathers it
 *     (asynchronously).
 *  3. In a second continuation every rank dequantises the gathered shards
 *     into the bucket. The gathered bytes are the same on every rank and
 *     so is the arithmetic: the result is bit-identical on every rank.
 *
 * Accuracy: per element, |result - exact average| <= (sum over ranks of
 * their block scale s_r / 2) / divisor + s_f / 2 (s_f: the scale of the
 * element's block of the average), up to f32 rounding of the sum (a few
 * ulps of the values summed). Error feedback (opts) carries the
 * quantisation error into the next iteration instead of losing it.
 *
 * Not finite values: code -128 marks a NaN or +-inf input value (it does
 * not enter its block's scale); it dequantises to NaN, so the element is
 * NaN in the result on every rank (an infinity is not kept as one; a sum
 * that overflows f32 becomes NaN too). The other elements of the block are
 * unaffected. A non-finite value carries no residual.
 *
 * Bytes: every rank sends each of the W-1 others one message of
 * 4 * ceil(L / block) + L bytes (L = ceil(n / W), rounded up to a
 * multiple of 4) in each collective: 2 * (W-1) * that per bucket, against
 * 2 * (W-1) / W * 4 * n for a ring all_reduce of the f32 bucket; the ratio
 * is about 1/4 + 1/block (0.254 with the default block of 256).
 * tdist_int8_get_stats counts both.
 *
 * Correct by construction: the block size and the error-feedback options
 * are agreed across the group on the state's first bucket (one small
 * blocking all_gather, tdist_compress_hook's agreement); ranks that differ
 * fail on every rank with TDIST_ERR_MISMATCH naming both ("comm hook
 * mismatch: rank 0 runs int8_allreduce(block 256), rank 1 runs
 * int8_allreduce(block 128) ...") before any gradient is sent.
 *
 * DDP and Join: works with no_sync, find_unused_parameters,
 * gradient_as_bucket_view, f32 and f64 buckets, and under Join (a joined
 * rank's reducer runs the hook on zeros with Join's divisor; with error
 * feedback its residuals evolve as an active rank's with zero gradients,
 * i.e. its pending residual is still delivered).
 *
 * Cost per bucket: staging of about 4 + 2 x (1 + 4 / block) bytes per
 * element, plus 5 / W (kept by the state and reused); with error feedback
 * 4 bytes per parameter element for each residual kept.
 */

/* The int8 hook's state. */
typedef struct tdist_int8 tdist_int8_t;

#define TDIST_INT8_DEFAULT_BLOCK 256
#define TDIST_INT8_MAX_BLOCK (1 << 24)

/* Options. Fill with tdist_int8_opts_init(); NULL means defaults. */
typedef struct tdist_int8_opts {
    /* Values per scale, 1 .. TDIST_INT8_MAX_BLOCK (default 256). Smaller
     * blocks follow the gradient's magnitudes more closely and cost 4
     * bytes of scale per block; 0 fails at create. */
    size_t block_size;
    /* Error feedback of the input: this rank's quantisation error of its
     * gradient (input + residual - what was sent) is kept per parameter
     * element and added to that element's gradient in the next
     * synchronised iteration. Kept by parameter index, so it follows a
     * parameter when the reducer rebuilds its buckets. Default false. */
    bool error_feedback;
    /* Error feedback of the average: the owner of a shard keeps the
     * quantisation error of the averaged values it sends and adds it to
     * the next iteration's average of those elements. When a bucket
     * rebuild moves an element to another owner, its residual is dropped
     * (once). Default false. */
    bool sum_error_feedback;
} tdist_int8_opts_t;

/* Counters of one state since create (this rank's view). */
typedef struct tdist_int8_stats {
    uint64_t buckets;        /* bucket reductions completed */
    uint64_t elements;       /* elements reduced, summed over buckets */
    uint64_t bytes_sent;     /* bytes this rank sent: 2 * (W-1) * message bytes per bucket */
    uint64_t f32_ring_bytes; /* what a ring all_reduce of the same f32 buckets sends per rank:
                              * 2 * (W-1) * 4 * n / W per bucket (rounded down) */
    uint64_t nonfinite_in;   /* non-finite values this rank quantised from its input */
    uint64_t nonfinite_out;  /* non-finite averages in the shards this rank owned */
} tdist_int8_stats_t;

/* Fill *opts with the defaults (block 256, no error feedback). NULL does
 * nothing. Thread-safe. */
TDIST_API void tdist_int8_opts_init(tdist_int8_opts_t *opts);

/* Create the state of an int8 quantised all_reduce hook. Does not
 * communicate. TDIST_ERR_INVALID_ARG for a NULL out or a block size of 0
 * or above TDIST_INT8_MAX_BLOCK; TDIST_ERR_NO_MEMORY. The caller owns *out
 * (tdist_int8_destroy) and registers it with tdist_int8_register().
 * Thread-safe. */
TDIST_API tdist_status_t tdist_int8_hook_create(const tdist_int8_opts_t *opts,
                                                tdist_int8_t **out);

/* Free the state, its staging and its residuals. Call it after the
 * reducer's last backward_end (or after tdist_ddp_destroy). NULL does
 * nothing. */
TDIST_API void tdist_int8_destroy(tdist_int8_t *st);

/* Register st as ddp's comm hook: tdist_ddp_register_comm_hook(ddp, st,
 * tdist_int8_hook), after checking that neither is NULL. Once, before the
 * first forward_begin. Does not communicate. st is borrowed: it must
 * outlive the reducer's last backward_end. Training thread. */
TDIST_API tdist_status_t tdist_int8_register(tdist_ddp_t *ddp, tdist_int8_t *st);

/* Copy st's counters into *out. Never blocks; not thread-safe against the
 * hook (call it on the training thread, between iterations). */
TDIST_API tdist_status_t tdist_int8_get_stats(const tdist_int8_t *st, tdist_int8_stats_t *out);

/* The comm hook itself (a tdist_ddp_comm_hook_fn; state is a
 * tdist_int8_t). Called by the reducer on its training thread; it blocks
 * only on a state's first call (the agreement), otherwise it quantises the
 * bucket, posts the all_to_all and returns; its continuations (inside
 * backward_end) post the all_gather and write the result. bucket->buffer
 * is read during the call and written by the last continuation. Errors
 * name the rank, group, iteration and bucket: TDIST_ERR_INVALID_ARG for a
 * NULL state, bucket or result, a bucket dtype other than f32/f64, a
 * divisor < 1, parameters outside the bucket (before any communication);
 * TDIST_ERR_NO_MEMORY (before any communication); TDIST_ERR_MISMATCH when
 * the ranks' options differ; the collectives' errors. Not thread-safe for
 * one state. */
TDIST_API tdist_status_t tdist_int8_hook(void *state, const tdist_ddp_bucket_t *bucket,
                                         tdist_ddp_hook_result_t *result);

/* The quantisation alone, as the hook does it: n values of src in blocks
 * of block (the last one shorter) into codes[n] and
 * scales[ceil(n / block)]; and back, dst[i] = codes[i] * scale of its
 * block (code -128: NaN). TDIST_ERR_INVALID_ARG for block 0 or a NULL
 * buffer with n > 0. The caller owns every buffer; they must not overlap.
 * Pure: never blocks, thread-safe. */
TDIST_API tdist_status_t tdist_int8_quantize(int8_t *codes, float *scales, const float *src,
                                             size_t n, size_t block);
TDIST_API tdist_status_t tdist_int8_dequantize(float *dst, const int8_t *codes,
                                               const float *scales, size_t n, size_t block);

/* --------------------------------------------------------------- PowerSGD */
/* (src/algorithms/powersgd.c, powersgd_kernels.c)
 *
 * PyTorch 1.13's powerSGD_hook and batched_powerSGD_hook (Vogels et al.,
 * "PowerSGD: practical low-rank gradient compression") for the DDP
 * reducer. Until start_powerSGD_iter iterations have run, each bucket is
 * averaged exactly (fl(g / divisor), then a SUM all_reduce). From then on,
 * each gradient matrix M (n x m: a parameter viewed as rows x count/rows)
 * is sent as two thin factors: P = M Q (n x r) is summed and
 * orthogonalised, Q = M^T P (m x r) is summed and divided by the divisor,
 * and the bucket receives P Q^T. With error feedback, what the
 * approximation lost is added to the next iteration's gradient; with warm
 * start, Q is kept from one iteration to the next. The batched hook treats
 * the whole bucket as one square matrix (zero-padded). Only f32 buckets.
 *
 * Differences from PyTorch (docs/algorithms.md, "PowerSGD", says more):
 *  - tdist does not know tensor shapes: opts.param_rows gives shape[0] of
 *    each parameter (0: 1-D, never compressed);
 *  - the random initial Q comes from a documented counter-based generator
 *    seeded by random_seed (the same on every rank), or from
 *    opts.initial_q (tests against PyTorch feed its recorded values);
 *  - error buffers and warm-start Q are kept per parameter, so they
 *    survive the reducer's bucket rebuild;
 *  - the state saves and loads (tdist_powersgd_save / _load);
 *  - the uncompressed tensors of a bucket and its P travel in one
 *    all_reduce; the reductions of consecutive buckets are pipelined;
 *  - for rank > 2 tdist orthogonalises by Gram-Schmidt as for rank <= 2
 *    (PyTorch calls LAPACK's QR: the same column space).
 * PyTorch's quirk is kept by default: the error buffer covers the
 * uncompressed tensors too (opts.error_feedback_uncompressed).
 *
 * Every rank's options are agreed on the first bucket (tdist's hook
 * agreement: one small all_gather); ranks that differ fail together with
 * TDIST_ERR_MISMATCH naming both. Bad options fail at create, before any
 * communication. Under Join a joined rank runs the hook on zeros and its
 * state evolves as an active rank's does. */

/* The PowerSGD state tdist_powersgd_hook runs on. */
typedef struct tdist_powersgd tdist_powersgd_t;

/* Where an observer is called (opts.observe); data holds count floats. */
typedef enum tdist_powersgd_stage {
    TDIST_POWERSGD_P_LOCAL,   /* [uncompressed values | P], before the sum */
    TDIST_POWERSGD_P_REDUCED, /* the same after the SUM (not divided) */
    TDIST_POWERSGD_P_ORTHO,   /* P after orthogonalisation */
    TDIST_POWERSGD_Q_USED,    /* Q as used for P = M Q (orthogonalised) */
    TDIST_POWERSGD_Q_LOCAL,   /* Q = M^T P, before the sum */
    TDIST_POWERSGD_Q_REDUCED, /* Q after the SUM and the division */
    TDIST_POWERSGD_OUTPUT,    /* the bucket after decompression */
    TDIST_POWERSGD_ERROR      /* the new error buffer (bucket order; batched: padded) */
} tdist_powersgd_stage_t;

/* Options. Fill with tdist_powersgd_opts_init(); every rank must pass the
 * same ones. Arrays are copied at create. */
typedef struct tdist_powersgd_opts {
    int matrix_approximation_rank;   /* r >= 1; default 1 */
    int64_t start_powerSGD_iter;     /* > 1; default 1000 */
    /* A matrix is compressed iff (n + m) * r' * rate < n * m, with
     * r' = min(n, m, r); >= 0 and finite. Default 2. */
    double min_compression_rate;
    bool use_error_feedback;         /* default true */
    bool warm_start;                 /* default true */
    float orthogonalization_epsilon; /* >= 0; default 0 */
    uint64_t random_seed;            /* default 0 */
    /* PyTorch's bmm batching of equal shapes: accepted and agreed, same
     * results either way. Default false. */
    bool batch_tensors_with_same_shape;
    /* batched_powerSGD_hook: each bucket is one square matrix. Default
     * false. */
    bool batched;
    /* shape[0] of parameter i (the index of tdist_ddp_create's array) for
     * i < num_params; 0 (or i >= num_params) means 1-D, never compressed.
     * Required unless batched (NULL: create fails). rows must divide the
     * parameter's count (checked by the hook). */
    const size_t *param_rows;
    size_t num_params;
    /* PyTorch's quirk (default true): the error buffer also holds
     * g + e - average for the uncompressed tensors. false: their error is
     * 0. */
    bool error_feedback_uncompressed;
    /* Injected initial Q (tests): initial_q[i], if i < num_initial_q and
     * not NULL, holds m x r' floats (row-major) used instead of the
     * generator each time Q of parameter i (batched: of bucket i, side x
     * r') is randomised; it is orthogonalised as a drawn Q is. Borrowed
     * (the sizes are known only at the first bucket): the arrays must
     * stay valid for the state's life. Default NULL: the generator. */
    const float *const *initial_q;
    size_t num_initial_q;
    /* Beyond PyTorch (default false: PyTorch 1.13's behaviour). A matrix
     * that is 0 on every rank (a parameter no rank used in the first
     * compressed step, under find_unused_parameters) makes P 0, which
     * Gram-Schmidt turns into 0 / 0 (NaN) with epsilon 0, and warm start
     * then keeps a Q of NaN or of 0: that tensor's gradient is NaN or 0
     * for good. true: a column of P or Q that is 0 stays 0 (no
     * division), and a kept Q with a column that is 0 or not finite is
     * drawn afresh, as a first Q is, so the tensor recovers once it is
     * used again. The same decision on every rank (Q is reduced); other
     * tensors' bits do not change. Agreed. */
    bool repair_zero;
    /* Serial mode (for measurements): the hook waits for each all_reduce
     * before returning, so no two buckets' reductions overlap. Agreed.
     * Default false (pipelined). */
    bool serial;
    /* Optional observer, training thread, must not keep the pointers or
     * issue collectives. NULL: none. */
    void (*observe)(void *arg, const tdist_ddp_bucket_t *bucket, tdist_powersgd_stage_t stage,
                    const float *data, size_t count);
    void *observe_arg;
} tdist_powersgd_opts_t;

/* Fill *opts with the defaults above (PyTorch's). NULL does nothing.
 * Thread-safe. */
TDIST_API void tdist_powersgd_opts_init(tdist_powersgd_opts_t *opts);

/* Create a state. Does not communicate. TDIST_ERR_INVALID_ARG (naming the
 * option) for a NULL out, rank < 1, start_powerSGD_iter <= 1, a negative
 * or non-finite rate or epsilon, or no param_rows for the unbatched hook;
 * TDIST_ERR_NO_MEMORY. The caller owns *out (tdist_powersgd_destroy).
 * Thread-safe. */
TDIST_API tdist_status_t tdist_powersgd_create(const tdist_powersgd_opts_t *opts,
                                               tdist_powersgd_t **out);

/* Free the state and its buffers. Call it after the reducer's last
 * backward_end (or after tdist_ddp_destroy). NULL does nothing. */
TDIST_API void tdist_powersgd_destroy(tdist_powersgd_t *s);

/* tdist_ddp_register_comm_hook(ddp, s, tdist_powersgd_hook) after checking
 * both are not NULL. s is borrowed: it must outlive the reducer's last
 * backward_end. Does not communicate. Training thread. */
TDIST_API tdist_status_t tdist_powersgd_register(tdist_ddp_t *ddp, tdist_powersgd_t *s);

/* The comm hook (state: a tdist_powersgd_t). Training thread; blocks on
 * its first call (the agreement) and in serial mode, otherwise it posts
 * the all_reduce of P (or of the bucket) and returns; the continuations
 * post Q's and decompress. Errors name rank, group, iteration, bucket:
 * TDIST_ERR_INVALID_ARG for a NULL argument, a non-f32 bucket, a divisor
 * < 1, param_rows not dividing a count; TDIST_ERR_MISMATCH when the
 * ranks' options differ; the all_reduce's error. Not thread-safe. */
TDIST_API tdist_status_t tdist_powersgd_hook(void *state, const tdist_ddp_bucket_t *bucket,
                                             tdist_ddp_hook_result_t *result);

/* The hook's iteration count (PyTorch's state.iter): iterations whose
 * last bucket was hooked. 0 for NULL. Does not block; training thread. */
TDIST_API int64_t tdist_powersgd_iteration(const tdist_powersgd_t *s);

/* Checkpointing: the iteration count, every
 * parameter's error buffer and warm-start Q, the batched hook's per-bucket
 * Q and padding error, and the bucket layout they were last used with.
 * state_size: the bytes save needs now. save writes them to buf (cap
 * bytes; TDIST_ERR_INVALID_ARG if too small) and *written (may be NULL).
 * load restores a saved state into s, whose options must equal the
 * saver's (TDIST_ERR_MISMATCH otherwise; a damaged or truncated buffer is
 * TDIST_ERR_INVALID_ARG and leaves s unchanged). Call between iterations
 * (never while a bucket's continuations are pending). Local: no
 * communication, every rank saves and loads its own. Not thread-safe for
 * one state; the caller owns buf. */
TDIST_API size_t tdist_powersgd_state_size(const tdist_powersgd_t *s);
TDIST_API tdist_status_t tdist_powersgd_save(const tdist_powersgd_t *s, void *buf, size_t cap,
                                             size_t *written);
TDIST_API tdist_status_t tdist_powersgd_load(tdist_powersgd_t *s, const void *buf, size_t len);


/* ------------------------------- hook-then-optimizer, post-local-SGD hook */
/* (src/algorithms/hook_optim.c, src/algorithms/post_local.c)
 *
 * Three comm hooks of PyTorch's torch.distributed.algorithms.ddp_comm_hooks:
 *
 *  - tdist_allreduce_div_hook: PyTorch's allreduce_hook. Every rank
 *    divides its bucket by bucket->divisor, a true division fl(g / W),
 *    then the bucket is all_reduced (SUM, asynchronously, on bucket->pg).
 *    tdist_ddp_allreduce_hook (and DDP's built-in averaging) multiplies by
 *    fl(1 / W) instead: a different rounding in about a third of the
 *    elements when W is not a power of two.
 *  - hook-then-optimizer (PyTorch's _hook_then_optimizer): any comm hook
 *    (default tdist_allreduce_div_hook) followed, in the bucket's last
 *    continuation, by the optimizer's step over that bucket's parameters
 *    (tdist_optim_step_range), reading the reduced gradients in the bucket.
 *    Bucket 0's parameters are updated while later buckets are still on
 *    the wire; the training loop does not call tdist_optim_step. The
 *    result is bit for bit the inner hook followed by a full
 *    tdist_optim_step of the same optimizer.
 *  - post-local SGD (PyTorch's post_localSGD_hook): global averaging (as
 *    tdist_allreduce_div_hook) during the first start_localSGD_iter
 *    iterations, then averaging inside a subgroup only (each rank divides
 *    by the subgroup's size, SUM all_reduce on the subgroup). The model
 *    averaging that usually goes with it is not part of the hook.
 *
 * Agreement, errors and threads as for every hook of this layer (top of
 * this file): bad options fail at create; the hook's configuration is
 * agreed on bucket->pg on the first bucket; errors name the hook, rank,
 * group, iteration and bucket. DDP options, Join: see each hook below and
 * docs/algorithms.md.
 */

/* tdist/optim.h's optimizer (the same typedef, repeated here). */
typedef struct tdist_optim tdist_optim_t;

/* PyTorch's allreduce_hook (a tdist_ddp_comm_hook_fn; state is unused and
 * may be NULL): divides bucket->buffer in place by bucket->divisor (f32
 * and f64: correctly rounded; f16 and bf16: in f32, rounded once), then
 * posts a SUM all_reduce of it on bucket->pg and returns (result->work;
 * no continuation). Does not block. TDIST_ERR_INVALID_ARG for a NULL
 * bucket or result, a bucket without a group, a non-floating dtype or a
 * divisor < 1 (before any communication); the all_reduce's error. Training
 * thread (the reducer's). */
TDIST_API tdist_status_t tdist_allreduce_div_hook(void *state, const tdist_ddp_bucket_t *bucket,
                                                  tdist_ddp_hook_result_t *result);

/* ..................................................... hook-then-optimizer
 *
 * The optimizer's buffer i is the reducer's parameter i: same index, same
 * count, its param pointer the parameter's data (one f32 buffer per
 * parameter, in tdist_ddp_create's order; checked: as many buffers as
 * parameters, f32 buckets). For each parameter of a reduced bucket the
 * hook points the optimizer's grad at the reduced values in the bucket,
 * calls tdist_optim_step_range(opt, i, 0, count), and points the grad back
 * at tdist_ddp_grad_ptr(ddp, i) (where the reducer then writes the same
 * averaged values; with gradient_as_bucket_view re-read it after the first
 * backward_end, as always).
 *
 *  - no_sync: the hook is not called, nothing steps; the next synchronised
 *    iteration reduces the accumulated gradients and steps once.
 *  - find_unused_parameters: a parameter no rank used is in its bucket as
 *    zeros and is stepped with a zero gradient, as PyTorch's hook does
 *    (a plain tdist_optim_step would read its untouched grad buffer: the
 *    same when the training loop zeroes its gradients each iteration).
 *  - Join: a joined rank runs the hook on zeros; the reduction gives it the
 *    same averaged gradients as every active rank, and its optimizer steps
 *    with them, so its parameters and optimizer state stay equal to the
 *    others' throughout (Join's final broadcast from the last joiner then
 *    changes nothing). PyTorch's joined ranks do the same.
 *  - After an error in some bucket, earlier buckets' parameters have been
 *    stepped and later ones not; the iteration's error says which bucket.
 */
typedef struct tdist_hook_optim tdist_hook_optim_t;

/* Options. Fill with tdist_hook_optim_opts_init(); NULL means defaults. */
typedef struct tdist_hook_optim_opts {
    /* The hook that reduces each bucket (its continuations are run before
     * the step). NULL (default): tdist_allreduce_div_hook, PyTorch's
     * allreduce_hook. It must reduce the bucket in place, in f32. */
    tdist_ddp_comm_hook_fn hook;
    /* Its state, borrowed (must outlive the hook-then-optimizer state's
     * use). Default NULL. */
    void *hook_state;
    /* Its name, compared across ranks and used in messages; copied. May be
     * NULL only for tdist's own hooks (tdist_allreduce_div_hook,
     * tdist_ddp_allreduce_hook, tdist_compress_hook, tdist_post_local_hook),
     * which are named for you. */
    const char *hook_name;
} tdist_hook_optim_opts_t;

/* Fill *opts with the defaults above. NULL does nothing. Thread-safe. */
TDIST_API void tdist_hook_optim_opts_init(tdist_hook_optim_opts_t *opts);

/* Create a hook-then-optimizer state over optim (borrowed: it must outlive
 * the state; the state steps it, nothing else may use it during
 * backward_end). Does not communicate. TDIST_ERR_INVALID_ARG for a NULL
 * optim or out, a NULL or empty hook_name for a hook that is not
 * tdist's; TDIST_ERR_NO_MEMORY. The caller owns *out
 * (tdist_hook_optim_destroy) and registers it with
 * tdist_hook_optim_register(). Thread-safe. */
TDIST_API tdist_status_t tdist_hook_optim_create(tdist_optim_t *optim,
                                                 const tdist_hook_optim_opts_t *opts,
                                                 tdist_hook_optim_t **out);

/* Free the state (not the optimizer, not the inner hook's state). Call it
 * after the reducer's last backward_end. NULL does nothing. */
TDIST_API void tdist_hook_optim_destroy(tdist_hook_optim_t *h);

/* Register h as ddp's comm hook, binding h to ddp (one reducer per
 * state). Checks that the optimizer has one buffer per parameter of ddp.
 * The rules of tdist_ddp_register_comm_hook apply (once, before the first
 * forward_begin). Does not communicate. TDIST_ERR_INVALID_ARG for NULL
 * arguments, a state already registered, or a buffer count that is not
 * ddp's parameter count. Training thread. */
TDIST_API tdist_status_t tdist_hook_optim_register(tdist_ddp_t *ddp, tdist_hook_optim_t *h);

/* The comm hook itself (state: a registered tdist_hook_optim_t). Calls the
 * inner hook and returns; the step runs in the bucket's last continuation,
 * inside backward_end, on the training thread. Blocks only on the state's
 * first call (the agreement). Errors: TDIST_ERR_INVALID_ARG for NULL
 * arguments, a state not registered with tdist_hook_optim_register, a
 * bucket that is not f32 or whose parameter index has no optimizer buffer
 * (before any communication); TDIST_ERR_MISMATCH when the ranks' hooks
 * differ; the inner hook's, its continuations' or the optimizer's error
 * (naming the parameter). */
TDIST_API tdist_status_t tdist_hook_optim(void *state, const tdist_ddp_bucket_t *bucket,
                                          tdist_ddp_hook_result_t *result);

/* ............................................................ post-local SGD
 *
 * The iteration counter is PyTorch's PostLocalSGDState.iter: it starts at
 * 0 and goes up by one on each call with the bucket that is launched last
 * (bucket->is_last) while it is below start_localSGD_iter; iterations in
 * which it is below start_localSGD_iter average globally (bucket->pg,
 * divided by bucket->divisor), later ones inside the subgroup (divided by
 * the subgroup's size), or not at all with post_local_gradient_allreduce
 * false. no_sync iterations do not call the hook and do not count. Under
 * Join a joined rank runs the hook on zeros (its shadow iteration counts,
 * so every rank switches in the same iteration); in the subgroup phase
 * the divisor stays the subgroup's size.
 */
typedef struct tdist_post_local tdist_post_local_t;

/* Options. Fill with tdist_post_local_opts_init(). */
typedef struct tdist_post_local_opts {
    /* The group this rank averages in after the switch, a subgroup of the
     * reducer's group that contains this rank (tdist_pg_split,
     * tdist_pg_new_group). Borrowed: it must outlive the state. Required
     * (default NULL) unless post_local_gradient_allreduce is false. */
    tdist_pg_t *subgroup;
    /* Iterations of global averaging before the switch. Must be >= 1.
     * Default 1. */
    int64_t start_localSGD_iter;
    /* After the switch, average inside the subgroup (default true); false:
     * no gradient communication at all (each rank keeps its own). */
    bool post_local_gradient_allreduce;
} tdist_post_local_opts_t;

/* Fill *opts with the defaults above. NULL does nothing. Thread-safe. */
TDIST_API void tdist_post_local_opts_init(tdist_post_local_opts_t *opts);

/* Create a post-local-SGD state. Does not communicate.
 * TDIST_ERR_INVALID_ARG for NULL opts or out, start_localSGD_iter < 1, a
 * NULL subgroup (with post_local_gradient_allreduce), a subgroup this
 * rank is not in; TDIST_ERR_NO_MEMORY. The caller owns *out. Thread-safe. */
TDIST_API tdist_status_t tdist_post_local_create(const tdist_post_local_opts_t *opts,
                                                 tdist_post_local_t **out);

/* Free the state (not the subgroup). After the reducer's last
 * backward_end. NULL does nothing. */
TDIST_API void tdist_post_local_destroy(tdist_post_local_t *s);

/* Register s as ddp's comm hook (tdist_ddp_register_comm_hook after
 * checking for NULL; its rules apply). Does not communicate. Training
 * thread. */
TDIST_API tdist_status_t tdist_post_local_register(tdist_ddp_t *ddp, tdist_post_local_t *s);

/* The counter above (PyTorch's state.iter) into *iter. Not thread-safe
 * against the hook. TDIST_ERR_INVALID_ARG for NULL arguments. */
TDIST_API tdist_status_t tdist_post_local_iter(const tdist_post_local_t *s, int64_t *iter);

/* The comm hook itself (state: a tdist_post_local_t). Divides the bucket
 * and posts the all_reduce (global or subgroup), or does nothing, and
 * returns. Blocks only on the state's first call (the agreement, which
 * also checks that every subgroup member is in bucket->pg). Errors:
 * TDIST_ERR_INVALID_ARG for NULL arguments, a non-floating bucket or a
 * divisor < 1, a subgroup that is not part of bucket->pg; TDIST_ERR_MISMATCH
 * when the ranks' options differ; the all_reduce's error. */
TDIST_API tdist_status_t tdist_post_local_hook(void *state, const tdist_ddp_bucket_t *bucket,
                                               tdist_ddp_hook_result_t *result);


/* ---------------------------------------- quantised wire collectives */
/* (src/algorithms/quant_coll.c)
 *
 * all_gather and all_to_all of f32 buffers that move 16-bit values:
 * every rank encodes its f32 input into the wire format on the calling
 * thread, the group's collective moves the 16-bit values (half the bytes
 * of an f32 collective), and the received values are decoded into the
 * caller's f32 recvbuf when the collective completes. What PyTorch's
 * auto_quantize does for Gloo, with the same bits (wire values and
 * outputs equal PyTorch 1.13's bit for bit), and also asynchronous.
 *
 * Wire formats (the `wire` argument):
 *  - TDIST_F16 (PyTorch's DQuantType.FP16): clamp to [-65504, 65504],
 *    then round to nearest, ties to even: values beyond the range and
 *    +-inf become +-65504 (never inf); f16 subnormals are kept, below
 *    2^-25 is a signed zero; a NaN becomes 0x7E00 with the input's sign.
 *    Decoding is exact.
 *  - TDIST_BF16 (DQuantType.BFP16): the top half of (f32 bits + 0x8000),
 *    i.e. round to nearest, ties away from zero (1 + 2^-8 -> 1.0078125,
 *    where tdist_f32_to_bf16 gives 1.0); values that round past the
 *    largest bf16 become +-inf; decoding is bits << 16. PyTorch's integer
 *    rule is kept for NaN too: NaNs 0x7f800001..0x7f807fff become inf
 *    (0xff80.. -inf), 0x7fff8000..0x7fffffff become -0 and
 *    0xffff8000..0xffffffff +0; every other NaN stays NaN.
 *
 * A different wire format on two ranks is a fingerprint mismatch
 * (TDIST_ERR_MISMATCH, as for any collective whose dtypes differ).
 *
 * Blocking or not: as for every collective in tdist/pg.h. work NULL
 * blocks until recvbuf holds the decoded output. Otherwise the call
 * returns at once with *work set to an ordinary tdist_work_t: wait on it,
 * test it (tdist_work_status) and tdist_work_free() it with the pg.h
 * functions. The work completes only after recvbuf has been decoded, so
 * once tdist_work_wait or tdist_work_status says TDIST_OK, recvbuf is
 * ready. Works on one group complete in issue order.
 *
 * Where the decoding runs: on the group's engine thread, inside the
 * collective's completion, before the work is marked complete and before
 * opts->on_complete (which is still called once, with the collective's
 * status, on that thread). The engine starts the group's next collective
 * after it; decoding costs about one pass over recvbuf.
 *
 * Ownership: sendbuf is read during the call only (encoded into a staging
 * buffer before the call returns), so the caller may reuse it at once;
 * sendbuf may overlap recvbuf. recvbuf is the caller's and must stay
 * valid until the work completes; it is written only on success (after a
 * failure it holds what it held before). The staging buffers (2 bytes per
 * element sent and received) belong to the library and are freed when
 * the collective completes, successful or not.
 *
 * Errors, before anything is sent and without creating a work
 * (TDIST_ERR_INVALID_ARG, the message naming the function, rank, group
 * and what is wrong): pg NULL; dtype other than TDIST_F32; wire other
 * than TDIST_F16 or TDIST_BF16; count x group size x 4 bytes overflowing
 * size_t; a NULL buffer with count > 0. Out of memory for the staging is
 * TDIST_ERR_NO_MEMORY. Everything else (a failed or aborted group,
 * deadlines, mismatches, Join) is reported as by the group's
 * all_gather / all_to_all of the wire dtype, with that collective's
 * message (prefixed with this function's name when the call itself
 * returns it; tdist_work_error gives it unprefixed).
 *
 * Threads: as for pg.h collectives: calls on one group from one thread at
 * a time; works may be waited on from any thread.
 */

/* all_gather of f32 over a 16-bit wire: rank r's count elements of
 * sendbuf, encoded and decoded, land at recvbuf + r * count (size * count
 * elements). dtype must be TDIST_F32; wire TDIST_F16 or TDIST_BF16.
 * count 0 is a valid (empty) collective. opts (timeout, on_complete) as
 * for tdist_all_gather; may be NULL. */
TDIST_API tdist_status_t tdist_quant_all_gather(tdist_pg_t *pg, const void *sendbuf,
                                                void *recvbuf, size_t count,
                                                tdist_dtype_t dtype, tdist_dtype_t wire,
                                                const tdist_coll_opts_t *opts,
                                                tdist_work_t **work);

/* all_to_all (equal splits) of f32 over a 16-bit wire: block p of sendbuf
 * (count elements at sendbuf + p * count) goes to rank p; block q of
 * recvbuf comes from rank q. sendbuf and recvbuf hold size * count
 * elements each; they may be the same buffer. Otherwise as
 * tdist_quant_all_gather. */
TDIST_API tdist_status_t tdist_quant_all_to_all(tdist_pg_t *pg, const void *sendbuf,
                                                void *recvbuf, size_t count,
                                                tdist_dtype_t dtype, tdist_dtype_t wire,
                                                const tdist_coll_opts_t *opts,
                                                tdist_work_t **work);

/* The wire conversions alone: dst[i] = the wire value of src[i] (encode)
 * or the f32 value of wire value src[i] (decode), i < n, with the rules
 * above. TDIST_ERR_INVALID_ARG for a wire other than TDIST_F16 /
 * TDIST_BF16, or a NULL buffer with n > 0. dst and src must not overlap;
 * the caller owns both. Pure: never blocks, thread-safe. */
TDIST_API tdist_status_t tdist_quant_encode(uint16_t *dst, const float *src, size_t n,
                                            tdist_dtype_t wire);
TDIST_API tdist_status_t tdist_quant_decode(float *dst, const uint16_t *src, size_t n,
                                            tdist_dtype_t wire);

/* ---------------------- model averaging, post-local-SGD optimizer, DiLoCo */
/* (src/algorithms/averager.c, src/algorithms/diloco.c)
 *
 * Training that communicates parameters instead of gradients, every few
 * steps instead of every step.
 *
 *  - Model averagers (PyTorch's PeriodicModelAverager and
 *    HierarchicalModelAverager): every call is one step; on the steps the
 *    schedule says, each rank's parameters are replaced by the average of
 *    its group's (or subgroup's). How, exactly as PyTorch 1.13's
 *    average_parameters: only buffers with a gradient (grad != NULL: the
 *    others are PyTorch's params whose grad is None) are averaged; they
 *    are concatenated in the given order into one flat f32 buffer,
 *    divided by the group's size (a true division, fl(x / size)), summed
 *    with one all_reduce (SUM) on the group, and copied back.
 *  - The post-local-SGD optimizer (PyTorch's PostLocalSGDOptimizer): any
 *    optimizer of tdist/optim.h, followed by an averager. As in PyTorch
 *    the optimizer's state (SGD's momentum buffers, Adam's moments) is not
 *    averaged, so ranks keep their own; opts.average_optimizer_state
 *    averages it too, over the same group, on the same steps.
 *  - DiLoCo (Douillard et al., "DiLoCo: distributed low-communication
 *    training of language models"; PyTorch has none): H inner steps of any
 *    optimizer (AdamW by default) without communication, then one outer
 *    step: the pseudo-gradient (the parameters at the last synchronisation
 *    minus the current ones) is averaged over the group, optionally
 *    compressed, an outer optimizer (SGD with Nesterov momentum, lr 0.7,
 *    momentum 0.9) steps the synchronised parameters with it, and every
 *    rank adopts them. A Joinable: it runs under tdist/join.h's Join with
 *    uneven inputs.
 *
 * Parameters are given as tdist_optim_param_t (tdist/optim.h): param,
 * grad, count, name; f32. The arrays are copied at create; the memory they
 * point to stays the caller's and must outlive the object.
 *
 * Agreement: the first time an averager (or a DiLoCo state) communicates,
 * every rank's configuration (kind, periods, warm-up, element count;
 * DiLoCo's H, outer options and wire format) is compared across the group
 * with one small all_gather; ranks that differ fail together with
 * TDIST_ERR_MISMATCH naming both, before any parameter is sent.
 *
 * Threads: every object here is used by one training thread; not
 * thread-safe. Calls that communicate block until their collectives
 * complete (within the group's deadline). Nothing prints or exits.
 */

/* PyTorch's average_parameters: the buffers of params[0..n) that have a
 * gradient (grad != NULL and count > 0) are replaced, in place, by their
 * average over pg (fl(x / size) per element, then one SUM all_reduce of
 * the concatenation). Collective on pg, blocking. Allocates a flat copy
 * for the call. TDIST_ERR_INVALID_ARG for a NULL pg, NULL params with
 * n > 0, a buffer with a gradient but no param; the all_reduce's error
 * (the parameters are then unchanged). */
TDIST_API tdist_status_t tdist_average_parameters(tdist_pg_t *pg, const tdist_optim_param_t *params,
                                                  size_t n);

/* A model averager (periodic or hierarchical). */
typedef struct tdist_averager tdist_averager_t;

/* One level of a hierarchical averager: every `period` steps, average in
 * subgroups of `group_size` consecutive ranks of the group. */
typedef struct tdist_averager_level {
    int64_t period;
    int group_size;
} tdist_averager_level_t;

/* Options. Fill with tdist_averager_opts_init(). */
typedef struct tdist_averager_opts {
    /* Periodic: average when step >= warmup_steps and
     * (step - warmup_steps) % period == 0. Must be >= 1; the default 0
     * fails at create (PyTorch has no default either). */
    int64_t period;
    /* Steps (calls) at the start without any averaging. >= 0, default 0. */
    int64_t warmup_steps;
    /* Hierarchical (PyTorch's period_group_size_dict, in its order):
     * num_levels >= 1 levels with strictly increasing periods >= 1, group
     * sizes >= 1 that divide the group's size, the last one the group's
     * size. At a step >= warmup_steps the level with the largest period
     * dividing the step averages (no warm-up offset, as PyTorch); none
     * divides: no averaging. The array is copied at create. */
    const tdist_averager_level_t *levels;
    size_t num_levels;
} tdist_averager_opts_t;

/* Fill *opts with the defaults (period 0: must be set; warmup 0; no
 * levels). NULL does nothing. Thread-safe. */
TDIST_API void tdist_averager_opts_init(tdist_averager_opts_t *opts);

/* A PeriodicModelAverager over pg (borrowed: it must outlive the
 * averager). Uses opts->period and opts->warmup_steps (levels must be
 * NULL). Does not communicate. TDIST_ERR_INVALID_ARG, naming the option,
 * for NULL pg, opts or out, period < 1, warmup_steps < 0, levels given.
 * The caller owns *out (tdist_averager_destroy). */
TDIST_API tdist_status_t tdist_periodic_averager_create(tdist_pg_t *pg,
                                                        const tdist_averager_opts_t *opts,
                                                        tdist_averager_t **out);

/* A HierarchicalModelAverager over pg (borrowed). Uses opts->levels and
 * opts->warmup_steps (period must be 0). Collective on pg when some level
 * is smaller than pg: the subgroups of consecutive ranks are made with
 * tdist_pg_split (one per such level, in level order), owned by the
 * averager. The options are checked before any communication
 * (TDIST_ERR_INVALID_ARG naming the level): every rank must pass the same
 * ones. PyTorch 1.13 cannot build this averager without CUDA; tdist can,
 * on every backend. */
TDIST_API tdist_status_t tdist_hierarchical_averager_create(tdist_pg_t *pg,
                                                            const tdist_averager_opts_t *opts,
                                                            tdist_averager_t **out);

/* Free the averager and the subgroups it made. NULL does nothing. Not
 * collective (tdist_pg_destroy of a subgroup is local). */
TDIST_API void tdist_averager_destroy(tdist_averager_t *a);

/* average_parameters: one step. If the schedule says so for the current
 * step, the buffers of params[0..n) with a gradient are averaged in place
 * over the step's group (tdist_average_parameters); then the step counter
 * goes up by one (also on steps without averaging, and during warm-up).
 * Collective (blocking) on the steps that average, local otherwise; every
 * rank calls it once per step with the same buffer counts. On an error
 * the step counter does not move and the parameters are unchanged.
 * *group_size (may be NULL) receives the size of the group averaged over,
 * 0 when none. */
TDIST_API tdist_status_t tdist_averager_average(tdist_averager_t *a, const tdist_optim_param_t *params,
                                                size_t n, int *group_size);

/* The step counter (0-based: calls so far), and setting it (resuming from
 * a checkpoint: PyTorch's averager.step). set_step: step >= 0. */
TDIST_API int64_t tdist_averager_step(const tdist_averager_t *a);
TDIST_API tdist_status_t tdist_averager_set_step(tdist_averager_t *a, int64_t step);

/* The size of the group the averager would average over at `step` (0:
 * none): the schedule alone. Pure; thread-safe. */
TDIST_API int tdist_averager_group_size_at(const tdist_averager_t *a, int64_t step);

/* ............................................. post-local-SGD optimizer */

typedef struct tdist_post_local_optim tdist_post_local_optim_t;

/* Options. Fill with tdist_post_local_optim_opts_init(). */
typedef struct tdist_post_local_optim_opts {
    /* Also average the optimizer's state (momentum buffers; Adam's
     * moments) over the averager's group on the steps it averages (a true
     * division then a SUM all_reduce, as for the parameters). Default
     * false: PyTorch's behaviour, each rank keeps its own. */
    bool average_optimizer_state;
} tdist_post_local_optim_opts_t;

/* Fill *opts with the defaults above. NULL does nothing. Thread-safe. */
TDIST_API void tdist_post_local_optim_opts_init(tdist_post_local_optim_opts_t *opts);

/* PostLocalSGDOptimizer(optim, averager): optim (any tdist/optim.h
 * optimizer, borrowed) was created over params[0..n) (the same array:
 * checked by the count), averager is borrowed. Does not communicate.
 * TDIST_ERR_INVALID_ARG for NULL arguments or a buffer count that is not
 * optim's. The caller owns *out. */
TDIST_API tdist_status_t tdist_post_local_optim_create(tdist_optim_t *optim,
                                                       const tdist_optim_param_t *params, size_t n,
                                                       tdist_averager_t *averager,
                                                       const tdist_post_local_optim_opts_t *opts,
                                                       tdist_post_local_optim_t **out);

/* Free the wrapper (not the optimizer, not the averager). NULL: nothing. */
TDIST_API void tdist_post_local_optim_destroy(tdist_post_local_optim_t *p);

/* step(): tdist_optim_step(optim), then tdist_averager_average over the
 * buffers (and the optimizer's state with the option). Collective on the
 * steps that average. The optimizer's or the averager's error; after an
 * averaging error the local step has been taken. */
TDIST_API tdist_status_t tdist_post_local_optim_step(tdist_post_local_optim_t *p);

/* p as a participant of a Join (tdist/join.h), after the reducer's own
 * joinable: {tdist_ddp_joinable(ddp), this}, in that order, on the same
 * group. Every iteration the active ranks still perform, a joined rank
 * takes the averager's step with them (the counter advances alike on every
 * rank), contributing its own parameters to the averages and adopting
 * them; it takes no optimizer step (it has no data). So every average is
 * over every replica, and the group's collectives match. */
TDIST_API tdist_status_t tdist_post_local_optim_joinable(tdist_post_local_optim_t *p,
                                                         tdist_joinable_t *out);

/* ................................................................ DiLoCo */

typedef struct tdist_diloco tdist_diloco_t;

/* Options. Fill with tdist_diloco_opts_init(). */
typedef struct tdist_diloco_opts {
    /* H: inner steps per outer step, >= 1. Default 500 (the paper's). */
    int64_t inner_steps;
    /* The outer optimizer: SGD with lr > 0, momentum in [0, 1), Nesterov
     * (needs momentum > 0). Defaults 0.7, 0.9, true (the paper's). */
    double outer_lr;
    double outer_momentum;
    bool outer_nesterov;
    /* How the pseudo-gradient crosses the network: TDIST_F32 (default:
     * each rank divides by the group size, fl(d / W), then a SUM
     * all_reduce), TDIST_BF16 or TDIST_F16 (the 16-bit compression hook's
     * arithmetic, tdist_compress_hook: half the bytes), TDIST_I8 (the int8
     * hook's blocks, tdist_int8_hook: about a quarter). */
    tdist_dtype_t wire;
    /* TDIST_I8 only: values per scale (default 256) and the int8 hook's
     * two error feedbacks (default false), which carry each round's
     * quantisation error into the next. */
    size_t int8_block;
    bool int8_error_feedback;
    /* The inner optimizer DiLoCo creates when create's `inner` is NULL:
     * AdamW with these options (default tdist_optim_adamw_opts_init). */
    tdist_optim_adam_opts_t inner_adamw;
} tdist_diloco_opts_t;

/* Counters since create (this rank). */
typedef struct tdist_diloco_stats {
    uint64_t inner_steps;    /* inner optimizer steps taken */
    uint64_t outer_steps;    /* synchronisations (outer steps) */
    uint64_t elements;       /* elements of the pseudo-gradient per outer step */
    uint64_t wire_bytes;     /* bytes of pseudo-gradient this rank put into the collectives:
                              * 4 (f32) or 2 (16-bit) per element per outer step; int8: what
                              * the int8 hook sent (tdist_int8_stats.bytes_sent) scaled to the
                              * same measure, W / (2 (W - 1)) of the bytes sent */
} tdist_diloco_stats_t;

/* Fill *opts with the defaults above. NULL does nothing. Thread-safe. */
TDIST_API void tdist_diloco_opts_init(tdist_diloco_opts_t *opts);

/* Create DiLoCo over pg (borrowed) and params[0..n) (every buffer with a
 * gradient; f32; the same on every rank). inner: the inner optimizer,
 * borrowed, created by the caller over the same params array (checked by
 * the count), any kind; NULL: DiLoCo creates (and owns) an AdamW with
 * opts->inner_adamw. The current parameters become the synchronised ones
 * (every rank must start from the same parameters, e.g. broadcast
 * them first). Allocates two copies of the parameters (the synchronised
 * ones and the pseudo-gradient) and the outer momentum. Does not
 * communicate. TDIST_ERR_INVALID_ARG, naming the option, for NULL
 * arguments, a buffer without param or grad, H < 1, outer lr <= 0 or not
 * finite, momentum outside [0, 1), Nesterov without momentum, a wire
 * format other than f32/bf16/f16/i8, an int8 block of 0 or above
 * TDIST_INT8_MAX_BLOCK, inner options AdamW refuses, an inner optimizer
 * with another buffer count; TDIST_ERR_NO_MEMORY. */
TDIST_API tdist_status_t tdist_diloco_create(tdist_pg_t *pg, const tdist_optim_param_t *params,
                                             size_t n, tdist_optim_t *inner,
                                             const tdist_diloco_opts_t *opts,
                                             tdist_diloco_t **out);

/* Free the state (and the inner optimizer it created). NULL does nothing. */
TDIST_API void tdist_diloco_destroy(tdist_diloco_t *d);

/* One inner step (tdist_optim_step of the inner optimizer, reading the
 * gradients); every H-th call then synchronises (tdist_diloco_sync).
 * Local except on those steps, where it is collective and blocks. Under a
 * Join (tdist_diloco_joinable), the synchronisation first notifies it. */
TDIST_API tdist_status_t tdist_diloco_step(tdist_diloco_t *d);

/* The outer step now, whatever the inner step count (e.g. at the end of
 * training): every rank's pseudo-gradient d = synced - params is averaged
 * over the group (opts.wire), the outer optimizer steps the synchronised
 * parameters with it, and they are copied into every rank's parameters.
 * Collective, blocking; every rank must call it. On an error the
 * parameters and the synchronised copy are unchanged unless the outer
 * step had begun (the message says). */
TDIST_API tdist_status_t tdist_diloco_sync(tdist_diloco_t *d);

/* d as a participant of a Join (tdist/join.h). Its notification is made
 * at each synchronisation (not at every inner step: inner steps do not
 * communicate). A rank that has run out of inputs takes part in every
 * synchronisation the others still make, with its own pseudo-gradient:
 * what it trained since the last synchronisation the first time, zeros
 * after (it holds the synchronised parameters); the average divides by
 * the group's size in every case (a rank without inputs contributes no
 * progress). Its outer optimizer steps too, so every rank keeps the same
 * synchronised parameters and outer momentum. When every rank has
 * joined, one last synchronisation runs if any rank has inner steps since
 * the last one, so every rank ends with the same parameters. If DiLoCo is
 * not the first joinable, the first one's notification is used. */
TDIST_API tdist_status_t tdist_diloco_joinable(tdist_diloco_t *d, tdist_joinable_t *out);

/* Counters. Never blocks. */
TDIST_API tdist_status_t tdist_diloco_get_stats(const tdist_diloco_t *d, tdist_diloco_stats_t *out);

/* The inner optimizer (DiLoCo's own when create's inner was NULL): e.g. to
 * change its learning rate. Borrowed from d. */
TDIST_API tdist_optim_t *tdist_diloco_inner(tdist_diloco_t *d);

/* The synchronised parameters of buffer i (count floats), read-only,
 * owned by d; NULL for a bad index. */
TDIST_API const float *tdist_diloco_synced(const tdist_diloco_t *d, size_t i);

/* Checkpointing: the options, the synchronised parameters, the outer
 * optimizer's state (momentum), the inner steps since the last outer step
 * and the counters, and the inner optimizer's state when DiLoCo created it
 * (a caller's inner optimizer is saved by the caller, tdist_optim_save;
 * so are the parameters). The int8 hook's error-feedback residuals are not
 * saved: they restart at zero. state_size: the bytes save needs. save
 * writes them to buf (cap bytes; TDIST_ERR_INVALID_ARG if too small) and
 * *written (may be NULL). load restores them into d, which must have been
 * created with the same options, buffer count and element count
 * (TDIST_ERR_MISMATCH otherwise), and with inner NULL exactly when the
 * saver's was; a damaged, truncated or foreign buffer is
 * TDIST_ERR_INVALID_ARG. On any error d is unchanged. Local: no
 * communication, every rank saves and loads its own (the synchronised
 * parameters are the same on every rank). Call between steps. Host byte
 * order; the caller owns buf. */
TDIST_API size_t tdist_diloco_state_size(const tdist_diloco_t *d);
TDIST_API tdist_status_t tdist_diloco_save(const tdist_diloco_t *d, void *buf, size_t cap,
                                           size_t *written);
TDIST_API tdist_status_t tdist_diloco_load(tdist_diloco_t *d, const void *buf, size_t len);

/* ------------------------------------------------------------------ ZeRO */
/* (src/algorithms/zero.c, zero_state.c, zero_hook.c)
 *
 * PyTorch's ZeroRedundancyOptimizer (ZeRO stage 1): the optimizer state is
 * sharded over the group. Every rank keeps the full parameters and (after
 * DDP) the full averaged gradients, but steps and keeps state only for
 * the part it owns; after the step the owners' parameters are copied to
 * every rank. Adam's state per rank is about 1/W of DDP + Adam's.
 *
 *  - Partition TDIST_ZERO_BY_PARAMS (default, PyTorch's): whole
 *    parameters, sorted by element count, largest first (stable: ties keep
 *    the creation order), each given to the rank with the fewest elements
 *    so far (ties: the lowest rank). Results then equal PyTorch's.
 *    TDIST_ZERO_FLAT (llm.c's ZeRO-1): the parameters, concatenated in
 *    creation order, are one flat range of N elements; rank r owns
 *    [r * S, (r + 1) * S), S = ceil(N / W), cutting parameters where the
 *    ranges end: balanced to one element even when one parameter is most
 *    of the model.
 *  - Synchronisation after the step: TDIST_ZERO_SYNC_BROADCAST (default
 *    for BY_PARAMS, PyTorch's _sync_params): one broadcast per parameter
 *    from its owner (per rank with parameters_as_bucket_view);
 *    TDIST_ZERO_SYNC_ALL_GATHER (default for FLAT, the only one it takes):
 *    every rank's shard, padded to the largest, in one all_gather.
 *  - parameters_as_bucket_view: the parameters move into one buffer owned
 *    by the ZeRO object, each rank's shard contiguous (the values are
 *    copied in at create); the model must use tdist_zero_param_ptr(z, i)
 *    from then on. The synchronisation then needs no copies. The numbers
 *    are the same either way.
 *  - The optimizer is SGD, Adam or AdamW of tdist/optim.h, with its
 *    options and exact arithmetic; the shard's optimizer reads the
 *    gradients from each parameter's grad pointer (DDP's averaged ones).
 *  - Join: tdist_zero_joinable. Pass it after the DDP reducer's joinable
 *    ({ddp, zero}); a joined rank then steps its shard with the averaged
 *    gradients DDP's shadow iteration gave it, and takes part in the
 *    synchronisation. While some rank has joined the synchronisation is
 *    the all_gather (a broadcast rooted at a joined rank cannot be
 *    shadowed).
 *  - Overlap with DDP (tdist_zero_register_overlap): a comm hook that
 *    reduces each rank's slice of each bucket to it (PREMUL_SUM by
 *    1 / divisor, DDP's own rounding), steps the slice as soon as it is
 *    reduced, and sends the updated slices to every rank: half the bytes
 *    of all_reduce + broadcast, on every backend and transport. See
 *    tdist_zero_register_overlap.
 *  - Checkpoints: tdist_zero_consolidate_state_dict gathers the whole
 *    state on one rank (PyTorch's consolidate_state_dict(to)); the
 *    sharded save writes each rank's shard, and the sharded load takes
 *    the shards of a run at any world size and partition (re-sharding).
 *
 * Threads: a ZeRO object is used by one training thread; not
 * thread-safe. Errors name the rank, the group and the function.
 */

typedef struct tdist_zero tdist_zero_t;

typedef enum tdist_zero_partition {
    TDIST_ZERO_BY_PARAMS = 0, /* whole parameters, PyTorch's greedy rule (default) */
    TDIST_ZERO_FLAT = 1       /* equal element ranges of the flat model (llm.c) */
} tdist_zero_partition_t;

typedef enum tdist_zero_sync {
    TDIST_ZERO_SYNC_AUTO = 0,      /* BY_PARAMS: broadcast; FLAT: all_gather (default) */
    TDIST_ZERO_SYNC_BROADCAST = 1, /* BY_PARAMS only */
    TDIST_ZERO_SYNC_ALL_GATHER = 2
} tdist_zero_sync_t;

/* Options; fill with tdist_zero_opts_init(). Every rank must pass the same
 * (checked at create). */
typedef struct tdist_zero_opts {
    tdist_optim_kind_t kind;      /* default TDIST_OPTIM_SGD */
    tdist_optim_sgd_opts_t sgd;   /* kind SGD; default tdist_optim_sgd_opts_init */
    tdist_optim_adam_opts_t adam; /* kind ADAM / ADAMW; default tdist_optim_adam_opts_init
                                     (set weight_decay yourself for AdamW) */
    tdist_zero_partition_t partition; /* default TDIST_ZERO_BY_PARAMS */
    tdist_zero_sync_t sync;           /* default TDIST_ZERO_SYNC_AUTO */
    bool parameters_as_bucket_view;   /* default false */
    /* With the overlap hook: a rank's slice of the last bucket (reduced
     * after backward) is reduced and stepped in parts of this many bytes,
     * so that the step of one part runs while the next is on the wire.
     * Default 1 MiB; 0: the whole slice at once. */
    size_t overlap_part_bytes;
} tdist_zero_opts_t;

/* Fill *opts with the defaults above. NULL does nothing. Thread-safe. */
TDIST_API void tdist_zero_opts_init(tdist_zero_opts_t *opts);

/* Create a sharded optimizer over params[0..n) (f32, the model's
 * parameters in a fixed order, with their gradient pointers) on pg.
 * Collective over pg, blocking: every rank's optimizer kind, options,
 * parameter count and each parameter's element count and name are
 * compared (one all_gather, a second one naming the first differing
 * parameter when they differ); any difference is TDIST_ERR_MISMATCH on
 * every rank ("rank 0 uses adam, rank 1 uses sgd", "parameter 3
 * (fc2.bias): 16 elements on rank 0, 17 on rank 1"). Then the partition
 * is computed (the same on every rank, no communication) and this rank's
 * optimizer is created over its shard. The params array is copied; the
 * memory stays the caller's (with parameters_as_bucket_view the values are
 * copied into the object's buffer). pg is borrowed. TDIST_ERR_INVALID_ARG
 * for bad arguments or options (a NULL pointer, n == 0, FLAT with
 * SYNC_BROADCAST), TDIST_ERR_NO_MEMORY. The caller owns *out. */
TDIST_API tdist_status_t tdist_zero_create(tdist_pg_t *pg, const tdist_optim_param_t *params,
                                           size_t n, const tdist_zero_opts_t *opts,
                                           tdist_zero_t **out);

/* Free the object, its optimizer and buffers (with
 * parameters_as_bucket_view the parameters' memory: copy them out first).
 * NULL does nothing. */
TDIST_API void tdist_zero_destroy(tdist_zero_t *z);

/* One step: this rank's optimizer steps its shard from the gradients,
 * then the parameters are synchronised from their owners. Collective,
 * blocking. With the overlap hook registered the step has already run
 * inside tdist_ddp_backward_end: this returns TDIST_OK at once. Errors:
 * the collective's (the group's error message, with context). */
TDIST_API tdist_status_t tdist_zero_step(tdist_zero_t *z);

/* Where parameter i lives: the object's buffer with
 * parameters_as_bucket_view, else the caller's pointer. NULL for a bad
 * index. */
TDIST_API float *tdist_zero_param_ptr(const tdist_zero_t *z, size_t i);

/* The partition: the number of parameters rank r owns (BY_PARAMS), and up
 * to cap of their indices in the order its optimizer holds them (sorted
 * as the partition rule visits them). FLAT: the parameters with at least
 * one element in r's range, in creation order. 0 for a bad rank. */
TDIST_API size_t tdist_zero_rank_params(const tdist_zero_t *z, int r, size_t *out, size_t cap);

/* Elements of rank r's shard, and bytes of optimizer state on this rank
 * (the shard's state arrays). */
TDIST_API size_t tdist_zero_rank_elems(const tdist_zero_t *z, int r);
TDIST_API size_t tdist_zero_state_bytes(const tdist_zero_t *z);

/* This rank's optimizer (owned by z; one buffer per piece of the shard),
 * for inspection (step counts, state). With the overlap hook it is the
 * whole-model optimizer of the first synchronised iteration, then the
 * shard's: re-read it. NULL for a NULL z. */
TDIST_API tdist_optim_t *tdist_zero_optim(tdist_zero_t *z);

/* The learning rate of the next steps (schedulers), on every optimizer z
 * uses. lr finite and >= 0, else TDIST_ERR_INVALID_ARG. Training thread. */
TDIST_API tdist_status_t tdist_zero_set_lr(tdist_zero_t *z, double lr);

/* ZeRO as a joinable (ctx = z, pg = its group): the main hook performs a
 * step (with the gradients the joined rank holds, DDP's shadow averages
 * when DDP's joinable comes first), the synchronisation by all_gather
 * while some rank has joined. No post hook. z must outlive the Join. */
TDIST_API tdist_status_t tdist_zero_joinable(tdist_zero_t *z, tdist_joinable_t *out);

/* Gather the whole optimizer state on rank `to` (PyTorch's
 * consolidate_state_dict(to)). Collective, blocking (one gather per state
 * array and one of the step counts). Afterwards, on rank `to` only,
 * tdist_zero_consolidated_state reads it. */
TDIST_API tdist_status_t tdist_zero_consolidate_state_dict(tdist_zero_t *z, int to);

/* On the consolidating rank: parameter index's state array `slot` (SGD: 0
 * momentum_buffer; Adam: 0 exp_avg, 1 exp_avg_sq, 2 max_exp_avg_sq) into
 * *data (count elements, owned by z, valid until the next consolidate or
 * destroy) and its step count into *steps (either may be NULL).
 * TDIST_ERR_INVALID_ARG without a consolidated state here, or for an index
 * or slot out of range. */
TDIST_API tdist_status_t tdist_zero_consolidated_state(const tdist_zero_t *z, size_t index,
                                                       int slot, const float **data,
                                                       uint64_t *steps);

/* Sharded checkpoint. tdist_zero_shard_size gives the bytes of this rank's
 * blob; tdist_zero_save_shard writes it (this rank's pieces of the flat
 * model, their step counts and state, the optimizer kind, the learning
 * rate, every parameter's element count and name hash; a checksum). Not
 * collective. */
TDIST_API tdist_status_t tdist_zero_shard_size(const tdist_zero_t *z, size_t *size);
TDIST_API tdist_status_t tdist_zero_save_shard(const tdist_zero_t *z, void *buf, size_t size);

/* Load this rank's shard from the nblobs shard blobs of a checkpoint
 * written at any world size with any partition (all of them, or at least
 * those covering this rank's shard): re-sharding. Not collective. Checks
 * every blob first; on any error z is unchanged: TDIST_ERR_INVALID_ARG for
 * a blob that is not a ZeRO shard, truncated or corrupt; TDIST_ERR_MISMATCH
 * for another optimizer kind or state layout, or another model, naming the
 * first parameter that differs ("parameter 2 (fc2.weight): 512 elements in
 * the checkpoint, 544 here"), or when the blobs do not cover this rank's
 * shard (naming the parameter and range). The learning rate comes from the
 * checkpoint. */
TDIST_API tdist_status_t tdist_zero_load_shards(tdist_zero_t *z, const void *const *blobs,
                                                const size_t *sizes, size_t nblobs);

/* Overlap with DDP: register z's hook as ddp's comm hook (once, before the
 * first forward_begin; the reducer's parameters must be z's, f32, in the
 * same order and with the same pointers, or tdist_zero_param_ptr's with
 * parameters_as_bucket_view). Every bucket is then averaged slice by
 * slice: up to 4 ranks, each rank's 1/W slice is reduced to it straight
 * from the bucket (the last bucket's in parts of opts.overlap_part_bytes,
 * each part stepped as soon as it arrives), and every owner broadcasts its
 * updated slice in place into the parameters; with more ranks, or while
 * some rank has joined, one reduce_scatter and one all_gather per bucket.
 * The parameters of a bucket travel while later buckets are reduced and
 * stepped; backward_end returns when all have arrived. No tdist_zero_step
 * is needed (it does nothing). Here the shard of a rank is
 * its slice of every bucket (the partition option is not used). The first
 * synchronised iteration (DDP rebuilds its buckets after it) all_reduces
 * and steps every parameter on every rank with a temporary full optimizer,
 * whose state is then cut down to the shard: no step is lost (PyTorch
 * skips the first two). The gradients are not overwritten with their
 * averages (each rank's averaged slices stay in the hook's own buffers,
 * which saves a copy of 1/W of the model per step). Joined ranks run the hook on zeros, like DDP;
 * under Join pass z's joinable too (tdist_zero_joinable), which tells the
 * hook that a rank has joined (without it, the owners' reduces and
 * broadcasts rooted at a joined rank fail with TDIST_ERR_JOINED).
 * Create the reducer with gradient_as_bucket_view: with a comm hook it
 * otherwise copies every gradient into its bucket and back. Errors:
 * TDIST_ERR_INVALID_ARG for NULL arguments or a second registration (and,
 * from the hook, for a reducer whose parameters are not z's: their counts
 * are checked on every bucket). Does not communicate; training thread. */
TDIST_API tdist_status_t tdist_zero_register_overlap(tdist_zero_t *z, tdist_ddp_t *ddp);

#ifdef __cplusplus
}
#endif
#endif /* TDIST_ALGORITHMS_H */
