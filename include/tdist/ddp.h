/*
 * tdist/ddp.h — the DDP gradient reducer (DistributedDataParallel for C).
 *
 * A reducer keeps the replicas of one model identical on every rank of a
 * process group. The model is described by its parameters (data pointer,
 * gradient pointer, count, dtype, name) and its buffers (e.g. BatchNorm
 * running statistics). The training loop, on every rank:
 *
 *     tdist_ddp_forward_begin(ddp);          // buffer broadcast (option)
 *     ... forward ...
 *     ... backward: as each parameter's gradient becomes final:
 *         tdist_ddp_grad_ready(ddp, i);      // may launch a bucket's all_reduce
 *     tdist_ddp_backward_end(ddp);           // waits, writes averaged grads back
 *     ... optimizer step on every rank ...
 *
 * Gradients are grouped into buckets in reverse parameter order (the order
 * backward usually produces them), at most opts.bucket_cap_bytes each
 * (the first one opts.first_bucket_bytes). The moment the last gradient of
 * a bucket is ready, its reduction is launched asynchronously, so
 * communication overlaps the rest of backward. Buckets are launched in
 * index order on every rank: a bucket ready before an earlier one waits for
 * it. After the first synchronised iteration, the buckets are rebuilt once
 * in the order the gradients actually arrived on rank 0.
 *
 * Averaging: by default each bucket is all_reduced as a PREMUL_SUM with
 * factor 1 / world size (every rank's gradient divided, then summed — the
 * same rounding PyTorch's default hook has). A comm hook can replace it.
 *
 * Threads: one training thread calls the loop functions (forward_begin,
 * grad_ready, backward_end, set_no_sync, get_stats, grad_ptr) of one
 * reducer; they are not thread-safe against each other. The reducer issues
 * collectives on its group from that thread, so no other thread may issue
 * collectives on the same group during an iteration. Completion callbacks of
 * the default hook run on the group's engine thread and only record a
 * timestamp (atomic). Comm hooks and their continuations are called on the
 * training thread.
 *
 * Errors name the rank, the group, the operation and the iteration, e.g.
 * "tdist_ddp_backward_end: rank 1 group world iteration 3: 2 parameters
 * never became ready (no tdist_ddp_grad_ready call): 'fc2.bias' (index 3),
 * 'emb' (index 4); ...". The library never prints or exits.
 */
#ifndef TDIST_DDP_H
#define TDIST_DDP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tdist/core.h"
#include "tdist/join.h"
#include "tdist/pg.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tdist_ddp tdist_ddp_t;

/* One parameter of the model. data and grad hold count elements of dtype
 * (f32 or f64; other dtypes are rejected at create). The caller owns both
 * and keeps them valid for the life of the reducer. name is copied (NULL:
 * "param<i>"). */
typedef struct tdist_ddp_param {
    void *data;
    void *grad;
    size_t count;
    tdist_dtype_t dtype;
    const char *name;
} tdist_ddp_param_t;

/* One buffer of the model (not trained; kept identical by broadcast from
 * rank 0): any dtype. Caller owns data; name is copied. */
typedef struct tdist_ddp_buffer {
    void *data;
    size_t count;
    tdist_dtype_t dtype;
    const char *name;
} tdist_ddp_buffer_t;

/* Where and when the default hook's bucket reductions run
 * (tdist_ddp_opts_t.overlap). Every choice issues the same collectives
 * in the same order, so the averaged gradients are the same bits. */
typedef enum tdist_ddp_overlap {
    /* Launched asynchronously when the bucket is complete; the group's
     * engine thread reduces it while backward goes on. Best when the
     * engine thread has a CPU of its own. */
    TDIST_DDP_OVERLAP_ON = 0,
    /* No overlap: backward_end reduces the buckets one after another on
     * the training thread (grad_ready launches nothing). */
    TDIST_DDP_OVERLAP_OFF = 1,
    /* Each bucket reduced on the training thread, blocking, in the
     * grad_ready that completes it (then every later complete bucket, in
     * index order; bucket 0, small so that communication starts early on
     * a spare CPU, waits for bucket 1): while its gradients are still in
     * cache, with no engine thread and no thread hand-off. For ranks without a spare
     * CPU (one CPU per rank): there the engine thread could only take
     * turns with backward, and every wait of a reduction on a peer would
     * last until both ranks' engine threads happen to run at once. Each
     * bucket is a meeting point of the ranks: a rank descheduled by other
     * work makes the others wait at the next one. */
    TDIST_DDP_OVERLAP_INLINE = 2,
    /* INLINE when the group's collectives run through shared
     * memory (tdist_pg_shared_memory: moving the data is this rank's CPU
     * work) and this rank has no spare CPU; ON otherwise (over TCP the
     * wire runs beside backward). Decided at create (tdist_ddp_get_stats
     * says which). No spare CPU: the training thread may run on a single
     * CPU, or on fewer than two CPUs per rank of the host when it may run
     * on every CPU of the host (unbound ranks share them all; ranks of the
     * host: LOCAL_WORLD_SIZE, which launchers set, 1 when unset). */
    TDIST_DDP_OVERLAP_AUTO = 3,
} tdist_ddp_overlap_t;

/* Options. Fill with tdist_ddp_opts_init(); NULL options mean defaults.
 * Every rank must pass the same options (checked at create), except
 * overlap. */
typedef struct tdist_ddp_opts {
    /* Largest bucket in bytes (a single parameter larger than this gets a
     * bucket of its own). Default 25 MiB. Must be > 0. */
    size_t bucket_cap_bytes;
    /* Cap of bucket 0 (the last parameters, whose gradients come first):
     * small, so communication starts early. Default 1 MiB. Must be > 0. */
    size_t first_bucket_bytes;
    /* At create, broadcast every parameter's data and every buffer from
     * rank 0 (broadcast_coalesced), so all replicas start equal.
     * Default true. */
    bool sync_at_create;
    /* At each tdist_ddp_forward_begin, broadcast the buffers from rank 0.
     * Default true. */
    bool broadcast_buffers;
    /* A parameter with no tdist_ddp_grad_ready in a synchronised iteration
     * (nor in the no_sync iterations before it) counts as a zero gradient.
     * The used set is agreed across ranks with one small all_reduce per
     * iteration, so a parameter used on any rank gets the correct average
     * (the other ranks contribute zeros). A parameter unused on every rank
     * keeps its gradient untouched (like PyTorch). Default false: then a
     * missing grad_ready is an error at backward_end naming the
     * parameters. */
    bool find_unused_parameters;
    /* The gradients live inside the bucket buffers: no copy in grad_ready,
     * none in backward_end. The model must write its gradients to
     * tdist_ddp_grad_ptr(ddp, i) instead of its own grad pointers (their
     * contents are copied in at create). Default false. */
    bool gradient_as_bucket_view;
    /* The set of used parameters is the same in every iteration: with
     * find_unused_parameters, it is agreed once (first synchronised
     * iteration) and not again; a later iteration that uses a different
     * set is an error. Default false. */
    bool static_graph;
    /* Where the default hook's reductions run (above). Default
     * TDIST_DDP_OVERLAP_ON (INLINE and AUTO measured no faster on
     * 2 ranks with one CPU each, and INLINE makes grad_ready block). A comm hook's collectives are always
     * launched as buckets complete. Only this option may differ between
     * ranks (the same collectives are issued either way). */
    tdist_ddp_overlap_t overlap;
} tdist_ddp_opts_t;

/* Fill *opts with the defaults above. Thread-safe. */
TDIST_API void tdist_ddp_opts_init(tdist_ddp_opts_t *opts);

/* Create a reducer over pg for n parameters and m buffers (buffers may be
 * NULL when m == 0). Collective over pg: every rank calls it with the same
 * shapes and options, and it blocks until:
 *   1. every rank's counts, dtypes and name hashes of every parameter and
 *      buffer, and options, are compared (all_gather): a difference is
 *      TDIST_ERR_MISMATCH on every rank, naming the first parameter (or
 *      buffer, or option) that differs and the ranks that differ from
 *      rank 0;
 *   2. with opts.sync_at_create, parameters and buffers are broadcast from
 *      rank 0.
 * params and buffers arrays are copied; the memory they point to is
 * borrowed (the caller keeps it valid until tdist_ddp_destroy). pg is
 * borrowed: destroy the reducer before the group. The caller owns *out.
 * Not thread-safe with other calls on pg. */
TDIST_API tdist_status_t tdist_ddp_create(tdist_pg_t *pg, const tdist_ddp_param_t *params,
                                          size_t n, const tdist_ddp_buffer_t *buffers, size_t m,
                                          const tdist_ddp_opts_t *opts, tdist_ddp_t **out);

/* Free the reducer. Waits for bucket reductions still in flight (an
 * iteration abandoned after an error), bounded by the group's deadline.
 * Does not free the caller's memory. NULL does nothing. */
TDIST_API void tdist_ddp_destroy(tdist_ddp_t *ddp);

/* Begin an iteration: runs the Join notification hook (if a Join is
 * active), then, with opts.broadcast_buffers, broadcasts the buffers from
 * rank 0 (blocking, collective). Calling it again before any grad_ready
 * (e.g. an evaluation forward) starts the iteration afresh. Calling it
 * after grad_ready without backward_end is an error. Training thread. */
TDIST_API tdist_status_t tdist_ddp_forward_begin(tdist_ddp_t *ddp);

/* Parameter `index`'s gradient is final for this iteration. Copies it into
 * its bucket (unless gradient_as_bucket_view, or a hook registered with
 * TDIST_DDP_HOOK_GRADS) and, if that completes the bucket (and every
 * earlier bucket is launched), launches the bucket's reduction
 * asynchronously through the comm hook (the default hook with overlap
 * off: in backward_end instead). Does not wait for communication, except
 * with the default hook and overlap inline: then it reduces the bucket
 * itself and returns when it is averaged (blocks until every rank got
 * there).
 * Errors: no iteration begun, index out of range, the same parameter
 * twice in one iteration (named), or the hook/collective failing. In
 * no_sync mode it only records the call. Training thread. */
TDIST_API tdist_status_t tdist_ddp_grad_ready(tdist_ddp_t *ddp, size_t index);

/* End the iteration: handles parameters that never became ready (zeros
 * with find_unused_parameters, else an error naming them — the remaining
 * buckets are still reduced, with zeros, so no other rank hangs), launches
 * the remaining buckets, agrees the used set, waits for every bucket and
 * runs hook continuations in bucket order, then writes the averaged
 * gradients to the grad pointers (not with gradient_as_bucket_view). After
 * the first synchronised iteration it rebuilds the buckets once (one
 * broadcast from rank 0); with gradient_as_bucket_view this may move the
 * gradients: re-read tdist_ddp_grad_ptr() after backward_end.
 * In no_sync mode it only closes the iteration. Blocks. Training thread. */
TDIST_API tdist_status_t tdist_ddp_backward_end(tdist_ddp_t *ddp);

/* no_sync: while on, iterations do no communication; the model's
 * gradients accumulate locally (the model adds into its grad storage, the
 * reducer does not touch it), and the next synchronised iteration reduces
 * the accumulated sum. Set between iterations (after backward_end, before
 * forward_begin); inside an iteration it is an error. Every rank must use
 * the same sequence of modes. Training thread. */
TDIST_API tdist_status_t tdist_ddp_set_no_sync(tdist_ddp_t *ddp, bool no_sync);

/* Where parameter i's gradient must be written: inside the bucket buffer
 * with gradient_as_bucket_view (owned by the reducer; may move once, at the
 * rebuild after the first synchronised backward_end), else the caller's
 * grad pointer. NULL for a NULL reducer or an index out of range. */
TDIST_API void *tdist_ddp_grad_ptr(const tdist_ddp_t *ddp, size_t i);

/* ------------------------------------------------------------- comm hooks */

/* What a comm hook sees: one bucket, ready for reduction. Valid until the
 * bucket's continuations have run (inside backward_end). */
typedef struct tdist_ddp_bucket {
    size_t index;            /* 0 .. num_buckets-1, launched in this order */
    size_t num_buckets;
    bool is_last;            /* index == num_buckets - 1 */
    void *buffer;            /* flat: count elements of dtype; reduce in place */
    size_t count;
    tdist_dtype_t dtype;
    size_t num_params;       /* parameters in this bucket */
    const size_t *param_indices; /* their indices in the create() array */
    const size_t *offsets;   /* element offset of each in buffer */
    const size_t *counts;    /* element count of each */
    uint64_t iteration;      /* the reducer's iteration number (1, 2, ...) */
    int64_t divisor;         /* divide the sum by this to average (world size) */
    tdist_pg_t *pg;          /* the reducer's group */
    /* NULL unless the hook was registered with TDIST_DDP_HOOK_GRADS. Then
     * grads[k] is where parameter param_indices[k]'s gradient lives
     * (counts[k] elements of dtype: the caller's grad buffer, or its slot
     * in buffer with gradient_as_bucket_view; zeros of the reducer's own on
     * a rank that shadows under Join): the hook's input, and where its
     * result must be left. buffer is then not filled, and may be the same
     * memory as the gradients: read and write through grads only. */
    void *const *grads;
} tdist_ddp_bucket_t;

typedef struct tdist_ddp_hook_result tdist_ddp_hook_result_t;

/* A continuation: called on the training thread inside backward_end, in
 * bucket order, after the previous work completed successfully. It may
 * post-process bucket->buffer and may chain: fill *next (zeroed on entry)
 * with another work and/or continuation. */
typedef tdist_status_t (*tdist_ddp_then_fn)(void *state, const tdist_ddp_bucket_t *bucket,
                                            tdist_ddp_hook_result_t *next);

/* What a hook returns: asynchronous work whose completion (followed by its
 * continuation, if any) means bucket->buffer holds the reduced result.
 * work may be NULL (nothing to wait for); the reducer frees it. */
struct tdist_ddp_hook_result {
    tdist_work_t *work;
    tdist_ddp_then_fn then;
};

/* A comm hook: called on the training thread when bucket is launched (in
 * bucket index order, the same on every rank). It issues its collectives
 * asynchronously on bucket->pg and fills *result (zeroed on entry). On
 * failure it returns the error (a work it still set is freed). It must
 * issue the same collectives on every rank. */
typedef tdist_status_t (*tdist_ddp_comm_hook_fn)(void *state, const tdist_ddp_bucket_t *bucket,
                                                 tdist_ddp_hook_result_t *result);

/* Replace the default hook. Once per reducer, before the first
 * forward_begin (later, or twice: TDIST_ERR_INVALID_ARG). state is
 * borrowed and passed to fn and continuations. Training thread. */
TDIST_API tdist_status_t tdist_ddp_register_comm_hook(tdist_ddp_t *ddp, void *state,
                                                      tdist_ddp_comm_hook_fn fn);

/* Flags of tdist_ddp_register_comm_hook_flags. */
enum {
    /* The hook reads each gradient from bucket->grads[k] and leaves its
     * result there: the reducer then copies no gradient into the bucket in
     * grad_ready and none back in backward_end (without the flag, and
     * without gradient_as_bucket_view, it copies both ways, because the
     * hook works on the flat bucket->buffer). */
    TDIST_DDP_HOOK_GRADS = 1u << 0,
};

/* tdist_ddp_register_comm_hook with flags (TDIST_DDP_HOOK_*; 0: the same
 * as tdist_ddp_register_comm_hook). Unknown flags: TDIST_ERR_INVALID_ARG.
 * Same rules: once per reducer, before the first forward_begin; state is
 * borrowed. Training thread. */
TDIST_API tdist_status_t tdist_ddp_register_comm_hook_flags(tdist_ddp_t *ddp, void *state,
                                                            tdist_ddp_comm_hook_fn fn,
                                                            unsigned flags);

/* The default hook, for hooks that wrap it: an asynchronous PREMUL_SUM
 * all_reduce of the bucket in place with factor 1 / bucket->divisor (with
 * bucket->grads set, one all_reduce_coalesced of the gradients in place,
 * the same bits). state is unused. */
TDIST_API tdist_status_t tdist_ddp_allreduce_hook(void *state, const tdist_ddp_bucket_t *bucket,
                                                  tdist_ddp_hook_result_t *result);

/* ------------------------------------------------------------- statistics */

/* Counters since create; "last_" fields describe the last synchronised
 * iteration. Times in milliseconds. */
typedef struct tdist_ddp_stats {
    uint64_t iterations;          /* backward_end calls that completed */
    uint64_t sync_iterations;     /* of those, synchronised (not no_sync) */
    uint64_t num_buckets;         /* buckets now */
    uint64_t buckets_reduced;     /* bucket reductions launched, total */
    uint64_t bytes_reduced;       /* bytes of gradient reduced, total */
    uint64_t bucket_rebuilds;     /* 0 or 1 (bucket order changed) */
    uint64_t unused_parameters;   /* last iteration: parameters this rank did not use */
    double last_compute_ms;       /* forward_begin -> last grad_ready */
    double last_comm_ms;          /* time some bucket was being reduced (union of launch->done) */
    double last_wait_ms;          /* blocked in backward_end waiting for communication */
    double last_backward_end_ms;  /* the whole backward_end call */
    double total_compute_ms;
    double total_comm_ms;
    double total_wait_ms;
    /* 1 - wait / comm over all synchronised iterations (0 when nothing was
     * reduced): the share of communication hidden behind backward. */
    double overlap_fraction;
    /* Copying gradients into the buckets (grad_ready) and back
     * (backward_end): 0 when they are reduced where they live (the default
     * hook without find_unused_parameters, gradient_as_bucket_view, a hook
     * registered with TDIST_DDP_HOOK_GRADS). */
    double last_copy_ms;
    double total_copy_ms;
    /* Where the default hook's reductions run: opts.overlap, with
     * TDIST_DDP_OVERLAP_AUTO resolved at create (ON or INLINE). */
    tdist_ddp_overlap_t overlap;
} tdist_ddp_stats_t;

/* Copy the statistics into *stats. Training thread. */
TDIST_API tdist_status_t tdist_ddp_get_stats(const tdist_ddp_t *ddp, tdist_ddp_stats_t *stats);

/* Where the time of one bucket went in the last synchronised iteration,
 * in ms since that iteration's forward_begin. */
typedef struct tdist_ddp_bucket_timeline {
    double ready_ms;  /* its last gradient became ready (grad_ready, or backward_end
                       * for parameters that never did) */
    double launch_ms; /* handed to the comm hook: later than ready_ms when an
                       * earlier bucket was still waiting for a gradient, or
                       * with overlap off (in backward_end) */
    double done_ms;   /* reduced: the default hook's collective completed (on the
                       * group's engine thread); a custom hook's work and
                       * continuations were seen done in backward_end */
} tdist_ddp_bucket_timeline_t;

/* Fill *out with bucket b's timeline. Valid between backward_end and the
 * next forward_begin (a rebuild after the first synchronised iteration
 * starts the buckets afresh: all zeros until the next one).
 * TDIST_ERR_INVALID_ARG for a NULL argument or b out of range. Training
 * thread. */
TDIST_API tdist_status_t tdist_ddp_bucket_timeline(const tdist_ddp_t *ddp, size_t b,
                                                   tdist_ddp_bucket_timeline_t *out);

/* Bucket layout, for inspection and tests: the number of buckets, and the
 * parameter indices of bucket b in bucket order (up to cap written to
 * out; returns the bucket's parameter count, or 0 if b is out of range). */
TDIST_API size_t tdist_ddp_num_buckets(const tdist_ddp_t *ddp);
TDIST_API size_t tdist_ddp_bucket_params(const tdist_ddp_t *ddp, size_t b, size_t *out,
                                         size_t cap);

/* DDP as a joinable: fills *out (ctx = ddp, pg = its group). Under a Join,
 * tdist_ddp_forward_begin notifies (notify flag 1 = this iteration is
 * no_sync), the divisor follows divide_by_initial_world_size, the buffer
 * and rebuild broadcasts are rooted at the lowest active rank; on a joined
 * rank the main hook replays a synchronised iteration on zero gradients
 * (only the buffer broadcast for a no_sync one); the post hook broadcasts
 * parameters and buffers from the last joiner. The reducer must outlive the
 * Join. */
TDIST_API tdist_status_t tdist_ddp_joinable(tdist_ddp_t *ddp, tdist_joinable_t *out);

#ifdef __cplusplus
}
#endif
#endif /* TDIST_DDP_H */
