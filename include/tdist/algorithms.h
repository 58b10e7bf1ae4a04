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

/* Register c as ddp's comm hook: tdist_ddp_register_comm_hook(ddp, c,
 * tdist_compress_hook), after checking that neither is NULL. The rules of
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

#ifdef __cplusplus
}
#endif
#endif /* TDIST_ALGORITHMS_H */
