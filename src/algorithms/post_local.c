/*
 * algorithms/post_local.c — PyTorch's post_localSGD_hook: global
 * averaging for the first start_localSGD_iter iterations, then averaging
 * inside a subgroup (or none). See tdist/algorithms.h.
 *
 * The counter is PyTorch's PostLocalSGDState.iter (maybe_increase_iter):
 * it is read by every bucket and increased by the last bucket of an
 * iteration, only while it is below start_localSGD_iter, so every bucket
 * of one iteration takes the same branch and the counter stops at
 * start_localSGD_iter.
 *
 * The subgroup is checked against the reducer's group on the first call,
 * where the group is first known: every subgroup member must be a member
 * of bucket->pg, and this process must be the subgroup's own rank. A rank
 * whose subgroup fails the check still takes part in the agreement, with
 * a configuration that says so: every rank then fails together (the
 * others with the mismatch naming it), instead of the others waiting in
 * the agreement's all_gather for a rank that left.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "algorithms/internal.h"

#define WHO "tdist_post_local_hook"

struct tdist_post_local {
    tdist_pg_t *subgroup;
    int64_t start;
    bool gradient_allreduce;
    int64_t iter;            /* PyTorch's state.iter */
    tdist__agree_t agree;
    char bad[256];           /* why the subgroup does not fit bucket->pg ("" if it does) */
};

void tdist_post_local_opts_init(tdist_post_local_opts_t *opts)
{
    if (!opts) return;
    memset(opts, 0, sizeof *opts);
    opts->start_localSGD_iter = 1;
    opts->post_local_gradient_allreduce = true;
}

tdist_status_t tdist_post_local_create(const tdist_post_local_opts_t *opts, tdist_post_local_t **out)
{
    const char *fn = "tdist_post_local_create";
    if (!opts || !out)
        return tdist__error(TDIST_ERR_INVALID_ARG, "%s: %s is NULL", fn, !opts ? "opts" : "out");
    if (opts->start_localSGD_iter < 1)
        return tdist__error(TDIST_ERR_INVALID_ARG,
                            "%s: opts.start_localSGD_iter is %" PRId64 "; it must be >= 1 (the "
                            "iterations of global averaging before the switch)",
                            fn, opts->start_localSGD_iter);
    if (opts->post_local_gradient_allreduce && !opts->subgroup)
        return tdist__error(TDIST_ERR_INVALID_ARG,
                            "%s: opts.subgroup is NULL: this rank is in no subgroup to average in "
                            "after iteration %" PRId64 " (tdist_pg_split gives NULL to a rank "
                            "outside every group; set post_local_gradient_allreduce false for "
                            "no averaging)",
                            fn, opts->start_localSGD_iter);
    if (opts->subgroup && tdist_pg_rank(opts->subgroup) < 0)
        return tdist__error(TDIST_ERR_INVALID_ARG, "%s: this rank is not in opts.subgroup '%s'",
                            fn, tdist_pg_name(opts->subgroup));
    tdist_post_local_t *s = calloc(1, sizeof *s);
    if (!s) return tdist__error(TDIST_ERR_NO_MEMORY, "%s: out of memory", fn);
    s->subgroup = opts->post_local_gradient_allreduce ? opts->subgroup : NULL;
    s->start = opts->start_localSGD_iter;
    s->gradient_allreduce = opts->post_local_gradient_allreduce;
    *out = s;
    return TDIST_OK;
}

void tdist_post_local_destroy(tdist_post_local_t *s) { free(s); }

tdist_status_t tdist_post_local_register(tdist_ddp_t *ddp, tdist_post_local_t *s)
{
    if (!ddp || !s)
        return tdist__error(TDIST_ERR_INVALID_ARG, "tdist_post_local_register: %s is NULL",
                            !ddp ? "ddp" : "the post-local-SGD state");
    return tdist_ddp_register_comm_hook(ddp, s, tdist_post_local_hook);
}

tdist_status_t tdist_post_local_iter(const tdist_post_local_t *s, int64_t *iter)
{
    if (!s || !iter)
        return tdist__error(TDIST_ERR_INVALID_ARG, "tdist_post_local_iter: %s is NULL",
                            !s ? "the state" : "iter");
    *iter = s->iter;
    return TDIST_OK;
}

/* Whether world rank w is a member of pg. */
static bool has_world_rank(const tdist_pg_t *pg, int w)
{
    for (int r = 0; r < tdist_pg_size(pg); r++)
        if (tdist_pg_world_rank(pg, r) == w) return true;
    return false;
}

/* Check the subgroup against the reducer's group pg; a misfit goes to s->bad. */
static void check_subgroup(tdist_post_local_t *s, const tdist_pg_t *pg)
{
    const tdist_pg_t *sub = s->subgroup;
    if (!sub) return;
    int me = tdist_pg_world_rank(pg, tdist_pg_rank(pg));
    if (tdist_pg_world_rank(sub, tdist_pg_rank(sub)) != me) {
        snprintf(s->bad, sizeof s->bad, "subgroup '%s' belongs to another process (its rank %d "
                 "is world rank %d, this is world rank %d)", tdist_pg_name(sub), tdist_pg_rank(sub),
                 tdist_pg_world_rank(sub, tdist_pg_rank(sub)), me);
        return;
    }
    for (int r = 0; r < tdist_pg_size(sub); r++) {
        int w = tdist_pg_world_rank(sub, r);
        if (!has_world_rank(pg, w)) {
            snprintf(s->bad, sizeof s->bad, "subgroup '%s' rank %d (world rank %d) is not in the "
                     "reducer's group '%s'", tdist_pg_name(sub), r, w, tdist_pg_name(pg));
            return;
        }
    }
}

/* The first call's agreement: start, the subgroup switch and whether the
 * subgroup fits (the subgroups themselves differ from rank to rank). */
static tdist_status_t agree(tdist_post_local_t *s, const tdist_ddp_bucket_t *b)
{
    if (s->agree.done == 0) check_subgroup(s, b->pg);
    uint8_t flags = (uint8_t)((s->gradient_allreduce ? 1 : 0) | (s->bad[0] ? 2 : 0));
    uint64_t c = tdist__fnv1a(TDIST__FNV_INIT, &s->start, sizeof s->start);
    c = tdist__fnv1a(c, &flags, sizeof flags);
    char desc[TDIST__AGREE_DESC];
    if (s->bad[0])
        snprintf(desc, sizeof desc, "post_localSGD_hook with a subgroup outside the group");
    else
        snprintf(desc, sizeof desc, "post_localSGD_hook(start_localSGD_iter %" PRId64 "%s)",
                 s->start, s->gradient_allreduce ? "" : ", no post-local allreduce");
    TDIST_CHECK(tdist__agree(&s->agree, b, WHO, "post_local", desc, c));
    if (s->bad[0]) return tdist__hook_error(b, TDIST_ERR_INVALID_ARG, WHO, "%s", s->bad);
    return TDIST_OK;
}

static tdist_status_t check_call(const tdist_post_local_t *s, const tdist_ddp_bucket_t *b,
                                 const tdist_ddp_hook_result_t *result)
{
    return tdist__hook_check(s, b, result, WHO, "tdist_post_local_create", NULL, NULL,
                             TDIST__HOOK_FLOAT, "averaging takes floating buckets");
}

tdist_status_t tdist_post_local_hook(void *state, const tdist_ddp_bucket_t *bucket,
                                     tdist_ddp_hook_result_t *result)
{
    tdist_post_local_t *s = state;
    TDIST_CHECK(check_call(s, bucket, result));
    TDIST_CHECK(agree(s, bucket));
    if (s->iter < s->start) {
        if (bucket->is_last) s->iter++;
        return tdist__divide_all_reduce(bucket, bucket->pg, bucket->divisor, WHO, result);
    }
    if (!s->gradient_allreduce) return TDIST_OK; /* each rank keeps its own gradient */
    return tdist__divide_all_reduce(bucket, s->subgroup, tdist_pg_size(s->subgroup), WHO, result);
}
