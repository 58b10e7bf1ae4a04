/*
 * tdist/join.h — training with uneven inputs: PyTorch's Join for C.
 *
 * When ranks have different numbers of inputs, a rank that runs out
 * leaves the loop while the others still issue the iteration's
 * collectives: without help they would wait for it forever. Under a Join,
 * a rank that has run out ("joined") keeps taking part in every iteration
 * the others still perform, through the join hooks of its joinables (for
 * DDP: the bucket all_reduces on zero gradients, the used-parameter
 * agreement, the buffer broadcast), until every rank has joined. Then every
 * rank takes the model of the last rank to join.
 *
 *     tdist_joinable_t j;
 *     tdist_ddp_joinable(ddp, &j);                  // tdist/ddp.h
 *     tdist_join_t *join;
 *     tdist_join_begin(&j, 1, NULL, &join);         // not collective
 *     for (int k = 0; k < my_batches; k++) {        // differs per rank
 *         tdist_ddp_forward_begin(ddp);             // notifies the Join
 *         ... forward, backward with grad_ready, backward_end, step ...
 *     }
 *     st = tdist_join_end(join);                    // shadows, then syncs; frees join
 *
 * Protocol. Every iteration, the first joinable's notification (called by
 * the joinable before its per-iteration collectives; for DDP in
 * tdist_ddp_forward_begin) performs ONE all_gather of one int64 per rank on
 * the first joinable's group: bit 0 is 1 on a rank still in its loop (0 on
 * a joined rank, which notifies from tdist_join_end), bits 1..58 carry the
 * joinable's flags. From it every rank knows, identically: how many ranks
 * are active, which (the lowest active rank is the root of broadcasts the
 * joinables issue), and who ran out. On a joined rank, tdist_join_end loops:
 * notify; if no rank is active, stop; else run every joinable's main_hook
 * once (which must issue exactly the collectives the active ranks issue in
 * that iteration). Then it runs every post_hook with is_last_joiner (the
 * last rank(s) to join; ties: the highest of them is the root).
 *
 * Any collective (rule 4). Once a notification has shown that ranks have
 * joined, every collective the active ranks issue on the first joinable's
 * group — a barrier, a loss all_reduce, a SyncBatchNorm all_gather — is
 * taken part in by the joined ranks with the reduction's identity (zeros in
 * their all_gather / all_to_all / gather slots); AVG divides by the
 * state's divisor. What cannot be shadowed fails on the calling ranks
 * before anything is sent, with TDIST_ERR_JOINED: a broadcast, scatter,
 * reduce or gather rooted at a joined rank, send/recv with one,
 * all_gatherv, all_to_allv, monitored_barrier; and, inside a Join, any
 * collective on the group before this rank's first notification. See
 * docs/join.md.
 *
 * Every rank must pass the same joinables (same groups, same order) and
 * the same options. Threads: a Join and its joinables are used by one
 * training thread; not thread-safe.
 */
#ifndef TDIST_JOIN_H
#define TDIST_JOIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tdist/core.h"
#include "tdist/pg.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tdist_join tdist_join_t;

/* What one notification found (identical on every rank). */
typedef struct tdist_join_state {
    uint64_t iteration;  /* notifications performed in this Join, 1-based */
    int world_size;      /* the group size at begin ("initial world size") */
    int active;          /* ranks still in their loop this iteration */
    int lowest_active;   /* lowest active rank; -1 when none */
    int divisor;         /* world_size, or active with divide_by_initial_world_size false */
    uint64_t flags;      /* OR of the active ranks' notify flags (bits 0..57) */
    int last_joiner;     /* the root of the final sync: highest rank among those
                            active in the last iteration anyone was active (the
                            highest rank when there was none); valid in post hooks */
    const void *args;    /* the joinable's own `args` (in its hooks and its
                            tdist_join_notify); NULL otherwise */
} tdist_join_state_t;

/* A participant of a Join: a struct of callbacks over an object (ctx).
 * Callbacks are called on the training thread. */
typedef struct tdist_joinable {
    void *ctx;            /* borrowed; passed to every callback */
    tdist_pg_t *pg;       /* the group its collectives use (borrowed) */
    /* Optional. Called by tdist_join_begin with the join (when enabled), and
     * by tdist_join_end with NULL: the joinable installs / removes whatever
     * makes it call tdist_join_notify. */
    void (*attach)(void *ctx, tdist_join_t *join);
    /* On a joined rank, once per iteration the active ranks still perform:
     * issue the same collectives they issue (shadowing). May be NULL. */
    tdist_status_t (*main_hook)(void *ctx, const tdist_join_state_t *st);
    /* Once every rank has joined. May be NULL. */
    tdist_status_t (*post_hook)(void *ctx, bool is_last_joiner, const tdist_join_state_t *st);
    /* Per-joinable arguments for its hooks (PyTorch's Join(**kwargs)):
     * borrowed until tdist_join_end, handed over as st->args. May be NULL. */
    const void *args;
} tdist_joinable_t;

/* Options. Fill with tdist_join_opts_init(); NULL means defaults. */
typedef struct tdist_join_opts {
    /* false: the Join does nothing at all (no hooks installed, no
     * notification, tdist_join_end only frees). Default true. */
    bool enable;
    /* As soon as one rank runs out of inputs while others still have
     * some, every rank fails that same iteration with
     * TDIST_ERR_EARLY_TERMINATION (the active ranks in their notification,
     * e.g. tdist_ddp_forward_begin; the joined ranks in tdist_join_end),
     * naming the ranks that ran out. No shadowing, no final sync.
     * Default false. */
    bool throw_on_early_termination;
    /* Gradients are averaged over the initial world size (true, default,
     * like PyTorch) or over the ranks still active in each iteration. */
    bool divide_by_initial_world_size;
} tdist_join_opts_t;

/* Fill *opts with the defaults. Thread-safe. */
TDIST_API void tdist_join_opts_init(tdist_join_opts_t *opts);

/* Begin a Join over n >= 1 joinables (the array is copied; ctx and pg are
 * borrowed until tdist_join_end). Every joinable's group must have the same
 * size; the first joinable's group carries the notifications. Does not
 * communicate. With opts->enable, calls every attach(ctx, join). The caller
 * owns *out and must pass it to tdist_join_end. */
TDIST_API tdist_status_t tdist_join_begin(const tdist_joinable_t *joinables, size_t n,
                                          const tdist_join_opts_t *opts, tdist_join_t **out);

/* Called by a joinable (identified by its ctx) at the start of each
 * iteration, before its collectives. Only the first joinable's call
 * performs the notification (one all_gather on its group, blocking);
 * the others get the state the last notification found. flags (bits
 * 0..57) are ORed across active ranks into state->flags. Fills *state
 * (may be NULL). With enable false: no communication; *state says every
 * rank is active. Returns TDIST_ERR_EARLY_TERMINATION (throw option) when
 * some rank has run out, or the collective's error. */
TDIST_API tdist_status_t tdist_join_notify(tdist_join_t *join, const void *ctx, uint64_t flags,
                                           tdist_join_state_t *state);

/* What the last notification found (before the first one: every rank
 * active, iteration 0). No communication; for user code inside the loop,
 * e.g. to root a broadcast at state->lowest_active. Not thread-safe (the
 * training thread's). */
TDIST_API tdist_status_t tdist_join_get_state(const tdist_join_t *join, tdist_join_state_t *state);

/* End the Join on this rank (it has run out of inputs): notify "joined"
 * and run the main hooks once per iteration the active ranks still
 * perform, until every rank has joined; then the post hooks; then detach
 * the joinables and FREE join (in every case, also on error). Blocks,
 * collective. Returns the first error (TDIST_ERR_EARLY_TERMINATION if the
 * Join failed that way, here or earlier in a notification). */
TDIST_API tdist_status_t tdist_join_end(tdist_join_t *join);

#ifdef __cplusplus
}
#endif
#endif /* TDIST_JOIN_H */
