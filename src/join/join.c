/*
 * join/join.c — the generic Join: begin, the per-iteration notification
 * (one all_gather of an int64 word per rank), the joined rank's shadow loop
 * and the post hooks (end).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "tdist/join.h"

#define JOIN_ACTIVE 1ULL
#define JOIN_FLAG_MASK ((1ULL << 62) - 1)

struct tdist_join {
    tdist_joinable_t *j;
    size_t n;
    tdist_join_opts_t opts;
    tdist_pg_t *pg; /* the first joinable's group */
    int rank, size;
    int64_t *words;        /* size: the gathered notification */
    tdist_join_state_t st; /* what the last notification found */
    int last_joiner;       /* highest rank active in the last iteration with any */
    tdist_status_t failed; /* sticky early termination (or notification error) */
    char fail_msg[512];
};

void tdist_join_opts_init(tdist_join_opts_t *opts)
{
    if (!opts) return;
    memset(opts, 0, sizeof *opts);
    opts->enable = true;
    opts->throw_on_early_termination = false;
    opts->divide_by_initial_world_size = true;
}

static void trivial_state(const tdist_join_t *jn, tdist_join_state_t *s)
{
    memset(s, 0, sizeof *s);
    s->world_size = jn->size;
    s->active = jn->size;
    s->lowest_active = 0;
    s->divisor = jn->size;
    s->last_joiner = jn->size - 1;
}

tdist_status_t tdist_join_begin(const tdist_joinable_t *joinables, size_t n,
                                const tdist_join_opts_t *opts, tdist_join_t **out)
{
    if (!out) return tdist__error(TDIST_ERR_INVALID_ARG, "tdist_join_begin: out is NULL");
    if (!joinables || n == 0)
        return tdist__error(TDIST_ERR_INVALID_ARG,
                            "tdist_join_begin: %s (a Join needs at least one joinable)",
                            !joinables ? "joinables is NULL" : "n is 0");
    int size = -1;
    for (size_t i = 0; i < n; i++) {
        if (!joinables[i].pg)
            return tdist__error(TDIST_ERR_INVALID_ARG,
                                "tdist_join_begin: joinable %zu has no group", i);
        int s = tdist_pg_size(joinables[i].pg);
        if (size < 0) size = s;
        if (s != size || s < 1)
            return tdist__error(
                TDIST_ERR_INVALID_ARG,
                "tdist_join_begin: joinable %zu's group '%s' has %d ranks, joinable "
                "0's group '%s' has %d: every joinable must span the same ranks",
                i, tdist_pg_name(joinables[i].pg), s, tdist_pg_name(joinables[0].pg), size);
    }
    tdist_join_t *jn = calloc(1, sizeof *jn);
    if (!jn) return tdist__error(TDIST_ERR_NO_MEMORY, "tdist_join_begin: out of memory");
    jn->j = malloc(n * sizeof *jn->j);
    jn->words = calloc((size_t)size, sizeof *jn->words);
    if (!jn->j || !jn->words) {
        free(jn->j);
        free(jn->words);
        free(jn);
        return tdist__error(TDIST_ERR_NO_MEMORY, "tdist_join_begin: out of memory");
    }
    memcpy(jn->j, joinables, n * sizeof *jn->j);
    jn->n = n;
    if (opts)
        jn->opts = *opts;
    else
        tdist_join_opts_init(&jn->opts);
    jn->pg = joinables[0].pg;
    jn->rank = tdist_pg_rank(jn->pg);
    jn->size = size;
    jn->last_joiner = size - 1;
    trivial_state(jn, &jn->st);
    if (jn->opts.enable)
        for (size_t i = 0; i < n; i++)
            if (jn->j[i].attach) jn->j[i].attach(jn->j[i].ctx, jn);
    *out = jn;
    return TDIST_OK;
}

/* Write "1, 3 and 4" (the ranks whose word lacks the active bit). */
static void list_joined(const tdist_join_t *jn, char *buf, size_t cap)
{
    size_t len = 0;
    int listed = 0;
    buf[0] = 0;
    for (int r = 0; r < jn->size; r++) {
        if (jn->words[r] & (int64_t)JOIN_ACTIVE) continue;
        if (listed == 16) {
            snprintf(buf + len, cap - len, ", ...");
            return;
        }
        int k = snprintf(buf + len, cap - len, "%s%d", listed ? ", " : "", r);
        if (k < 0 || (size_t)k >= cap - len) return;
        len += (size_t)k;
        listed++;
    }
}

/* The notification itself: all_gather of this rank's word. */
static tdist_status_t do_notify(tdist_join_t *jn, bool active, uint64_t flags, const char *op)
{
    int64_t word = (int64_t)(((flags & JOIN_FLAG_MASK) << 1) | (active ? JOIN_ACTIVE : 0));
    uint64_t it = jn->st.iteration + 1;
    tdist_status_t st = tdist_all_gather(jn->pg, &word, jn->words, 1, TDIST_I64, NULL, NULL);
    if (st != TDIST_OK) {
        st = tdist__error_context(st,
                                  "tdist_join_%s: rank %d group %s iteration %" PRIu64
                                  ": join notification (all_gather)",
                                  op, jn->rank, tdist_pg_name(jn->pg), it);
        jn->failed = st;
        snprintf(jn->fail_msg, sizeof jn->fail_msg, "%s", tdist_last_error());
        return st;
    }
    tdist_join_state_t *s = &jn->st;
    s->iteration = it;
    s->world_size = jn->size;
    s->active = 0;
    s->lowest_active = -1;
    s->flags = 0;
    int highest = -1;
    for (int r = 0; r < jn->size; r++) {
        uint64_t w = (uint64_t)jn->words[r];
        if (!(w & JOIN_ACTIVE)) continue;
        s->active++;
        if (s->lowest_active < 0) s->lowest_active = r;
        highest = r;
        s->flags |= w >> 1;
    }
    if (highest >= 0) jn->last_joiner = highest;
    s->last_joiner = jn->last_joiner;
    s->divisor = jn->opts.divide_by_initial_world_size || s->active == 0 ? jn->size : s->active;
    if (jn->opts.throw_on_early_termination && s->active > 0 && s->active < jn->size) {
        char who[200];
        list_joined(jn, who, sizeof who);
        int out_n = jn->size - s->active;
        st = tdist__error(TDIST_ERR_EARLY_TERMINATION,
                          "tdist_join_%s: rank %d group %s iteration %" PRIu64
                          ": rank%s %s ran out of inputs while %d rank%s still had some "
                          "(throw_on_early_termination)",
                          op, jn->rank, tdist_pg_name(jn->pg), it, out_n == 1 ? "" : "s", who,
                          s->active, s->active == 1 ? "" : "s");
        jn->failed = st;
        snprintf(jn->fail_msg, sizeof jn->fail_msg, "%s", tdist_last_error());
        return st;
    }
    return TDIST_OK;
}

tdist_status_t tdist_join_notify(tdist_join_t *join, const void *ctx, uint64_t flags,
                                 tdist_join_state_t *state)
{
    if (!join) return tdist__error(TDIST_ERR_INVALID_ARG, "tdist_join_notify: join is NULL");
    if (!join->opts.enable) {
        if (state) trivial_state(join, state);
        return TDIST_OK;
    }
    if (join->failed != TDIST_OK) return tdist__error(join->failed, "%s", join->fail_msg);
    if (ctx == join->j[0].ctx) TDIST_CHECK(do_notify(join, true, flags, "notify"));
    if (state) *state = join->st;
    return TDIST_OK;
}

static void free_join(tdist_join_t *jn)
{
    if (jn->opts.enable)
        for (size_t i = 0; i < jn->n; i++)
            if (jn->j[i].attach) jn->j[i].attach(jn->j[i].ctx, NULL);
    free(jn->j);
    free(jn->words);
    free(jn);
}

tdist_status_t tdist_join_end(tdist_join_t *join)
{
    if (!join) return tdist__error(TDIST_ERR_INVALID_ARG, "tdist_join_end: join is NULL");
    tdist_join_t *jn = join;
    if (!jn->opts.enable) {
        free_join(jn);
        return TDIST_OK;
    }
    tdist_status_t ret = TDIST_OK;
    if (jn->failed != TDIST_OK) {
        ret = tdist__error(jn->failed, "%s", jn->fail_msg);
        free_join(jn);
        return ret;
    }
    /* shadow the active ranks' iterations: each loop is one iteration of
     * theirs, bounded by their input counts and the group's deadline */
    uint64_t rounds = 0;
    for (;; rounds++) {
        ret = do_notify(jn, false, 0, "end");
        if (ret != TDIST_OK || jn->st.active == 0) break;
        for (size_t i = 0; i < jn->n && ret == TDIST_OK; i++) {
            if (!jn->j[i].main_hook) continue;
            ret = jn->j[i].main_hook(jn->j[i].ctx, &jn->st);
            if (ret != TDIST_OK)
                ret = tdist__error_context(ret,
                                           "tdist_join_end: rank %d group %s iteration %" PRIu64
                                           ": main hook of joinable %zu (shadowing the "
                                           "active ranks' collectives)",
                                           jn->rank, tdist_pg_name(jn->pg), jn->st.iteration, i);
        }
        if (ret != TDIST_OK) break;
    }
    if (ret == TDIST_OK) {
        jn->st.last_joiner = jn->last_joiner;
        /* like PyTorch: every rank that joined in the final round (no
         * iteration left to shadow) is a last joiner; the root of the
         * final sync is the highest of them */
        bool is_last = rounds == 0;
        for (size_t i = 0; i < jn->n && ret == TDIST_OK; i++) {
            if (!jn->j[i].post_hook) continue;
            ret = jn->j[i].post_hook(jn->j[i].ctx, is_last, &jn->st);
            if (ret != TDIST_OK)
                ret = tdist__error_context(ret,
                                           "tdist_join_end: rank %d group %s: post hook of "
                                           "joinable %zu (final sync from rank %d)",
                                           jn->rank, tdist_pg_name(jn->pg), i, jn->last_joiner);
        }
    }
    char keep[1024];
    if (ret != TDIST_OK) snprintf(keep, sizeof keep, "%s", tdist_last_error());
    free_join(jn);
    if (ret != TDIST_OK) tdist__error(ret, "%s", keep);
    return ret;
}
