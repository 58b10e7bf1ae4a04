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
#include "pg/join_iface.h"
#include "tdist/join.h"

#define JOIN_ACTIVE 1ULL
#define JOIN_FLAG_MASK ((1ULL << 58) - 1) /* joinable flags: word bits 1..58 */
/* word bits 60 and 61: this rank's options, so every rank checks that all
 * passed the same */
#define JOIN_OPT_SHIFT 60
#define JOIN_OPT_MASK (3ULL << JOIN_OPT_SHIFT)

static uint64_t opt_bits(const tdist_join_opts_t *o)
{
    return ((o->throw_on_early_termination ? 1ULL : 0) | (o->divide_by_initial_world_size ? 2ULL : 0))
           << JOIN_OPT_SHIFT;
}

struct tdist_join {
    tdist_joinable_t *j;
    size_t n;
    tdist_join_opts_t opts;
    tdist_pg_t *pg; /* the first joinable's group */
    int rank, size;
    int64_t *words;        /* size: the gathered notification */
    uint8_t *joined;       /* size: 1 = that rank has joined (lent to the group) */
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
    jn->joined = calloc((size_t)size, 1);
    if (!jn->j || !jn->words || !jn->joined) {
        free(jn->j);
        free(jn->words);
        free(jn->joined);
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
    if (jn->opts.enable && tdist__pg_join_mode(jn->pg) != TDIST__JOIN_NONE) {
        free(jn->j);
        free(jn->words);
        free(jn->joined);
        free(jn);
        return tdist__error(TDIST_ERR_INVALID_ARG,
                            "tdist_join_begin: group %s is already in a Join (one Join per "
                            "group at a time)",
                            tdist_pg_name(joinables[0].pg));
    }
    jn->rank = tdist_pg_rank(jn->pg);
    jn->size = size;
    jn->last_joiner = size - 1;
    trivial_state(jn, &jn->st);
    /* until this rank's first notification, collectives on the group are
     * refused (rule 4) */
    if (jn->opts.enable) tdist__pg_join_set(jn->pg, TDIST__JOIN_PRE, NULL, 0, size, 0);
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
    int64_t word = (int64_t)(((flags & JOIN_FLAG_MASK) << 1) | (active ? JOIN_ACTIVE : 0) |
                             opt_bits(&jn->opts));
    uint64_t it = jn->st.iteration + 1;
    tdist_status_t st = tdist__pg_join_gather(jn->pg, &word, jn->words);
    if (st != TDIST_OK) {
        tdist__pg_join_set(jn->pg, TDIST__JOIN_NONE, NULL, 0, jn->size, it);
        st = tdist__error_context(st,
                                  "tdist_join_%s: rank %d group %s iteration %" PRIu64
                                  ": join notification (all_gather)",
                                  op, jn->rank, tdist_pg_name(jn->pg), it);
        jn->failed = st;
        snprintf(jn->fail_msg, sizeof jn->fail_msg, "%s", tdist_last_error());
        return st;
    }
    for (int r = 1; r < jn->size; r++) {
        uint64_t o0 = (uint64_t)jn->words[0] & JOIN_OPT_MASK, o = (uint64_t)jn->words[r] & JOIN_OPT_MASK;
        if (o == o0) continue;
        tdist__pg_join_set(jn->pg, TDIST__JOIN_NONE, NULL, 0, jn->size, it);
        st = tdist__error(TDIST_ERR_MISMATCH,
                          "tdist_join_%s: rank %d group %s iteration %" PRIu64
                          ": the ranks passed different Join options: rank 0 "
                          "throw_on_early_termination=%d divide_by_initial_world_size=%d, rank %d "
                          "throw_on_early_termination=%d divide_by_initial_world_size=%d",
                          op, jn->rank, tdist_pg_name(jn->pg), it,
                          (int)((o0 >> JOIN_OPT_SHIFT) & 1), (int)((o0 >> JOIN_OPT_SHIFT) >> 1), r,
                          (int)((o >> JOIN_OPT_SHIFT) & 1), (int)((o >> JOIN_OPT_SHIFT) >> 1));
        jn->failed = st;
        snprintf(jn->fail_msg, sizeof jn->fail_msg, "%s", tdist_last_error());
        return st;
    }
    tdist_join_state_t *s = &jn->st;
    (void)tdist_pg_mark(jn->pg, active ? "join_notify" : "joined_notify", it);
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
        s->flags |= (w >> 1) & JOIN_FLAG_MASK;
    }
    if (highest >= 0) jn->last_joiner = highest;
    s->last_joiner = jn->last_joiner;
    s->divisor = jn->opts.divide_by_initial_world_size || s->active == 0 ? jn->size : s->active;
    for (int r = 0; r < jn->size; r++) jn->joined[r] = !((uint64_t)jn->words[r] & JOIN_ACTIVE);
    bool early = jn->opts.throw_on_early_termination && s->active > 0 && s->active < jn->size;
    /* the group's role until the next notification (rule 4) */
    if (early || s->active == 0)
        tdist__pg_join_set(jn->pg, TDIST__JOIN_NONE, NULL, 0, jn->size, it);
    else
        tdist__pg_join_set(jn->pg, active ? TDIST__JOIN_ACTIVE : TDIST__JOIN_SHADOW, jn->joined,
                           s->lowest_active, s->divisor, it);
    if (early) {
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

/* The args of the joinable whose ctx this is (NULL if none). */
static const void *own_args(const tdist_join_t *jn, const void *ctx)
{
    for (size_t i = 0; i < jn->n; i++)
        if (jn->j[i].ctx == ctx) return jn->j[i].args;
    return NULL;
}

tdist_status_t tdist_join_notify(tdist_join_t *join, const void *ctx, uint64_t flags,
                                 tdist_join_state_t *state)
{
    if (!join) return tdist__error(TDIST_ERR_INVALID_ARG, "tdist_join_notify: join is NULL");
    if (!join->opts.enable) {
        if (state) {
            trivial_state(join, state);
            state->args = own_args(join, ctx);
        }
        return TDIST_OK;
    }
    if (join->failed != TDIST_OK) return tdist__error(join->failed, "%s", join->fail_msg);
    if (ctx == join->j[0].ctx) TDIST_CHECK(do_notify(join, true, flags, "notify"));
    if (state) {
        *state = join->st;
        state->args = own_args(join, ctx);
    }
    return TDIST_OK;
}

tdist_status_t tdist_join_get_state(const tdist_join_t *join, tdist_join_state_t *state)
{
    if (!join || !state)
        return tdist__error(TDIST_ERR_INVALID_ARG, "tdist_join_get_state: %s is NULL",
                            !join ? "join" : "state");
    *state = join->st;
    return TDIST_OK;
}

static void free_join(tdist_join_t *jn)
{
    if (jn->opts.enable) {
        for (size_t i = 0; i < jn->n; i++)
            if (jn->j[i].attach) jn->j[i].attach(jn->j[i].ctx, NULL);
        tdist__pg_join_set(jn->pg, TDIST__JOIN_NONE, NULL, 0, jn->size, jn->st.iteration);
    }
    free(jn->j);
    free(jn->words);
    free(jn->joined);
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
            tdist_join_state_t st = jn->st;
            st.args = jn->j[i].args;
            ret = jn->j[i].main_hook(jn->j[i].ctx, &st);
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
            tdist_join_state_t st = jn->st;
            st.args = jn->j[i].args;
            ret = jn->j[i].post_hook(jn->j[i].ctx, is_last, &st);
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
