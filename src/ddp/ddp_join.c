/*
 * ddp/ddp_join.c — the DDP reducer as a joinable (tdist_ddp_joinable in
 * tdist/ddp.h), on the generic Join of tdist/join.h: forward_begin notifies; a joined rank replays the
 * active ranks' iteration on zero gradients; the last joiner's model is
 * broadcast at the end.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "ddp/internal.h"
#include "tdist/join.h"

#define DDP_JOIN_NO_SYNC 1ULL /* notify flag: the active ranks' iteration is no_sync */

/* Point the per-iteration knobs at what this iteration's notification found. */
static void apply_state(tdist_ddp_t *ddp, const tdist_join_state_t *st)
{
    tdist__ddp_set_divisor(ddp, st->divisor);
    int root = st->lowest_active >= 0 ? st->lowest_active : 0;
    tdist__ddp_set_roots(ddp, root, root);
}

static tdist_status_t ddp_forward_hook(void *arg, tdist_ddp_t *ddp)
{
    tdist_join_t *join = arg;
    tdist_join_state_t st;
    uint64_t flags = tdist__ddp_sync_enabled(ddp) ? 0 : DDP_JOIN_NO_SYNC;
    TDIST_CHECK(tdist_join_notify(join, ddp, flags, &st));
    apply_state(ddp, &st);
    return TDIST_OK;
}

static void ddp_attach(void *ctx, tdist_join_t *join)
{
    tdist_ddp_t *ddp = ctx;
    if (join) {
        tdist__ddp_set_forward_hook(ddp, ddp_forward_hook, join);
    } else {
        tdist__ddp_set_forward_hook(ddp, NULL, NULL);
        tdist__ddp_set_divisor(ddp, ddp->size);
        tdist__ddp_set_roots(ddp, 0, 0);
    }
}

static tdist_status_t ddp_main_hook(void *ctx, const tdist_join_state_t *st)
{
    tdist_ddp_t *ddp = ctx;
    apply_state(ddp, st);
    if (st->flags & DDP_JOIN_NO_SYNC) {
        /* a no_sync iteration communicates only in forward_begin */
        ddp->iteration++;
        if (ddp->opts.broadcast_buffers && ddp->nbuf > 0)
            return tdist__ddp_sync_buffers(ddp, ddp->buffer_root, "shadow_iteration");
        return TDIST_OK;
    }
    return tdist__ddp_shadow_iteration(ddp);
}

static tdist_status_t ddp_post_hook(void *ctx, bool is_last_joiner, const tdist_join_state_t *st)
{
    (void)is_last_joiner;
    tdist_ddp_t *ddp = ctx;
    return tdist__ddp_sync_module(ddp, st->last_joiner, "join_sync_final_model");
}

tdist_status_t tdist_ddp_joinable(tdist_ddp_t *ddp, tdist_joinable_t *out)
{
    if (!ddp || !out)
        return tdist__error(TDIST_ERR_INVALID_ARG, "tdist_ddp_joinable: %s is NULL",
                            !ddp ? "ddp" : "out");
    memset(out, 0, sizeof *out);
    out->ctx = ddp;
    out->pg = ddp->pg;
    out->attach = ddp_attach;
    out->main_hook = ddp_main_hook;
    out->post_hook = ddp_post_hook;
    return TDIST_OK;
}
