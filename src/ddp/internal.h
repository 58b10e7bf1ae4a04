/*
 * ddp/internal.h — the reducer's state, shared by the files of src/ddp/,
 * and the entry points the Join layer (src/join/) builds on.
 *
 * Files: ddp.c (create/destroy, cross-rank shape check, broadcasts,
 * options, stats), reducer.c (the iteration: grad_ready, bucket launch,
 * backward_end, unused-parameter agreement, rebuild, shadow iteration),
 * bucket.c (bucket assignment and the flat bucket storage).
 *
 * Per-iteration collectives a synchronised iteration issues on the group,
 * in this order (a joined rank replays exactly these, see
 * tdist__ddp_shadow_iteration):
 *   forward_begin:  [broadcast_buffers]  one broadcast_coalesced per dtype
 *                   of the buffers, from buffer_root
 *   grad_ready / backward_end: one comm-hook call per bucket, index order
 *   backward_end:   [find_unused, unless static and agreed] all_reduce MAX
 *                   of a u8 "used" bitmap of n parameters
 *                   [first synchronised iteration] broadcast of the i32
 *                   arrival order (n) from rebuild_root
 */
#ifndef TDIST_DDP_INTERNAL_H
#define TDIST_DDP_INTERNAL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/internal.h"
#include "tdist/ddp.h"

typedef struct ddp_param {
    void *data;
    void *grad;       /* the caller's pointer */
    size_t count;
    size_t bytes;
    tdist_dtype_t dtype;
    char *name;
    size_t bucket;    /* index of its bucket */
    size_t offset;    /* element offset inside the bucket */
} ddp_param_t;

typedef struct ddp_buffer {
    void *data;
    size_t count;
    tdist_dtype_t dtype;
    char *name;
} ddp_buffer_t;

typedef struct ddp_bucket {
    tdist_dtype_t dtype;
    size_t count;           /* elements */
    size_t bytes;
    size_t arena_off;       /* byte offset in the arena */
    size_t nparams;
    size_t *params;         /* indices, bucket order */
    size_t *offsets;        /* element offsets */
    size_t *counts;
    void **grads;           /* nparams: where each gradient is reduced (hook with grads) */
    size_t pending;         /* gradients not ready yet this iteration */
    bool launched;
    tdist_ddp_hook_result_t res;
    tdist_ddp_bucket_t desc;
    uint64_t ready_ns;      /* pending reached 0 */
    uint64_t launch_ns;
    _Atomic uint64_t done_ns; /* set by the default hook's on_complete */
} ddp_bucket_t;

/* Called at forward_begin before any collective (Join's notification). */
typedef tdist_status_t (*tdist__ddp_forward_hook_fn)(void *arg, tdist_ddp_t *ddp);

struct tdist_ddp {
    tdist_pg_t *pg;
    int rank, size;
    tdist_ddp_opts_t opts;

    size_t np;
    ddp_param_t *params;
    size_t nbuf;
    ddp_buffer_t *buffers;

    size_t nb;
    ddp_bucket_t *buckets;
    unsigned char *arena;   /* every bucket, contiguous */
    size_t arena_bytes;
    unsigned char *shadow_arena; /* zeros for shadow iterations (lazy) */

    tdist_ddp_comm_hook_fn hook; /* NULL: the default (timed) hook */
    void *hook_state;
    unsigned hook_flags;         /* TDIST_DDP_HOOK_* */
    /* where the default hook's reductions run: opts.overlap, AUTO resolved
     * at create. OFF and INLINE reduce blocking on the training thread,
     * OFF in backward_end, INLINE in the grad_ready completing the bucket */
    tdist_ddp_overlap_t sched;
    /* launch scratch of the direct path: np gradient pointers and counts */
    void **direct_bufs;
    size_t *direct_counts;

    /* iteration state */
    uint64_t iteration;     /* current / last begun iteration, 1-based */
    bool started;           /* any forward_begin happened */
    bool in_iter;           /* forward_begin done, backward_end not yet */
    bool want_no_sync;
    bool iter_no_sync;      /* latched at forward_begin */
    uint8_t *ready;         /* n: grad_ready this iteration */
    uint8_t *used_since_sync; /* n: grad_ready since the last synced iteration */
    uint8_t *used_map;      /* n: agreed used bitmap (all_reduce buffer) */
    size_t nready;
    int32_t *order;         /* n: arrival order this iteration */
    size_t norder;
    size_t next_bucket;
    tdist_status_t iter_err; /* first error of the iteration (or shadow iteration) */
    char iter_msg[768];      /* ... and its message */
    uint64_t t_fwd_ns, t_last_ready_ns, t_first_launch_ns;
    uint64_t copy_ns;       /* this iteration's gradient copies into buckets and back */

    bool rebuilt;           /* rebuild step done (whether or not it changed) */
    bool static_agreed;     /* static_graph: used set agreed */
    uint8_t *static_local;  /* static_graph: the local used set agreed on */

    /* knobs for Join */
    int64_t divisor;
    int buffer_root;
    int rebuild_root;
    tdist__ddp_forward_hook_fn fwd_hook;
    void *fwd_hook_arg;

    tdist_ddp_stats_t stats;
};

/* The direct path: the default hook, gradients not in bucket views and no
 * unused-parameter agreement. Buckets are then all-reduced in place over
 * the caller's gradient buffers (one coalesced all_reduce per bucket):
 * no copy into the bucket in grad_ready, none back in backward_end. */
static inline bool tdist__ddp_direct(const struct tdist_ddp *d)
{
    return !d->hook && !d->opts.gradient_as_bucket_view && !d->opts.find_unused_parameters;
}

/* Whether each gradient is copied into its bucket in grad_ready and back
 * in backward_end: not on the direct path, not with bucket views (the
 * gradients are the bucket), not for a hook that works on the gradients
 * where they are (TDIST_DDP_HOOK_GRADS). */
static inline bool tdist__ddp_copies(const struct tdist_ddp *d)
{
    return !d->opts.gradient_as_bucket_view && !tdist__ddp_direct(d) &&
           !(d->hook && (d->hook_flags & TDIST_DDP_HOOK_GRADS));
}

/* Where parameter i's gradient is reduced: its slot in the arena when the
 * reducer copies (or with bucket views), else the caller's grad buffer. */
void *tdist__ddp_reduce_loc(const tdist_ddp_t *ddp, size_t i);

/* Set a ddp error: "tdist_ddp_<op>: rank R group G iteration K: msg". */
tdist_status_t tdist__ddp_error(const tdist_ddp_t *ddp, tdist_status_t st, const char *op,
                                const char *fmt, ...) TDIST_PRINTF(4, 5);

/* bucket.c: (re)build the buckets for the parameter order `order` (n
 * indices; the first gets bucket 0). Allocates a new arena; with
 * gradient_as_bucket_view copies each parameter's old slot (or, if there
 * was no arena yet, its caller grad) into the new one. Sets *changed when
 * the layout differs from the old one (always on first build). */
tdist_status_t tdist__ddp_build_buckets(tdist_ddp_t *ddp, const int32_t *order, bool *changed);
void tdist__ddp_free_buckets(ddp_bucket_t *b, size_t nb);
/* Pointer to parameter i's slot in the arena. */
void *tdist__ddp_slot(const tdist_ddp_t *ddp, size_t i);

/* ddp.c: broadcast every parameter's data and every buffer from root
 * (one broadcast_coalesced per dtype; blocking). Join's post hook uses
 * it to make every rank end with the last joiner's model. */
tdist_status_t tdist__ddp_sync_module(tdist_ddp_t *ddp, int root, const char *op);
/* Broadcast the buffers from root (blocking). */
tdist_status_t tdist__ddp_sync_buffers(tdist_ddp_t *ddp, int root, const char *op);

/* -------------------------------------------------------------- for Join */

/* The hook forward_begin calls first (NULL to remove). */
void tdist__ddp_set_forward_hook(tdist_ddp_t *ddp, tdist__ddp_forward_hook_fn fn, void *arg);
/* What bucket sums are divided by (default: the group size). > 0. */
void tdist__ddp_set_divisor(tdist_ddp_t *ddp, int64_t divisor);
/* Roots of the per-iteration buffer broadcast and of the rebuild-order
 * broadcast (default 0 each): Join points them at an active rank. */
void tdist__ddp_set_roots(tdist_ddp_t *ddp, int buffer_root, int rebuild_root);
/* Whether the next iteration would be synchronised (no_sync off). */
bool tdist__ddp_sync_enabled(const tdist_ddp_t *ddp);
/* On a rank that has no input: issue exactly the collectives a
 * synchronised iteration of the active ranks issues (buffer broadcast,
 * every bucket through the comm hook on zeros, the used-bitmap agreement
 * with nothing used, the one-time rebuild broadcast), wait for them, and
 * leave gradients and parameters untouched. Blocks. */
tdist_status_t tdist__ddp_shadow_iteration(tdist_ddp_t *ddp);

#endif /* TDIST_DDP_INTERNAL_H */
