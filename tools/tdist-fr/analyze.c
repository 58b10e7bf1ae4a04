/*
 * tools/tdist-fr/analyze.c — match every group's collectives across its
 * ranks by sequence number and find, per group, the first one where the
 * ranks part ways:
 *  - MISMATCH: two ranks issued different calls under the same sequence
 *    number (op, dtype, count, root, reduce op or split sizes);
 *  - MISSING: some ranks issued it, others never got that far;
 *  - STUCK: every rank issued it, not every rank finished it.
 * The problems are then ordered by when their first rank started them:
 * the first is the first divergence of the job.
 */
#include <stdlib.h>
#include <string.h>

#include "frtool.h"

const tdist__fr_entry_t *frt_find_seq(const rec_t *r, uint64_t seq)
{
    if (!r) return NULL;
    for (size_t i = r->n; i-- > 0;)
        if (r->e[i].kind == TDIST__FR_COLL && r->e[i].seq == seq) return &r->e[i];
    return NULL;
}

const tdist__fr_entry_t *frt_last_coll(const rec_t *r, bool completed)
{
    if (!r) return NULL;
    for (size_t i = r->n; i-- > 0;)
        if (r->e[i].kind == TDIST__FR_COLL && (!completed || r->e[i].state == TDIST__FR_COMPLETED))
            return &r->e[i];
    return NULL;
}

/* The oldest and newest collective sequence numbers r holds. */
static void seq_range(const rec_t *r, uint64_t *lo, uint64_t *hi)
{
    *lo = UINT64_MAX;
    *hi = 0;
    for (size_t i = 0; r && i < r->n; i++) {
        if (r->e[i].kind != TDIST__FR_COLL) continue;
        if (r->e[i].seq < *lo) *lo = r->e[i].seq;
        if (r->e[i].seq > *hi) *hi = r->e[i].seq;
    }
}

/* Whether a and b are different calls. Entries that never started hold
 * the caller's raw arguments, not the checked fingerprint: only the op is
 * compared then. */
bool frt_differ(const tdist__fr_entry_t *a, const tdist__fr_entry_t *b)
{
    if (a->op != b->op) return true;
    if (!a->t_ns[TDIST__FR_STARTED] || !b->t_ns[TDIST__FR_STARTED]) return false;
    return a->dtype != b->dtype || a->count != b->count || a->root != b->root ||
           a->redop != b->redop || a->splits_hash != b->splits_hash;
}

static int64_t started_real(const rec_t *r, const tdist__fr_entry_t *e)
{
    uint64_t t = e->t_ns[TDIST__FR_STARTED] ? e->t_ns[TDIST__FR_STARTED] : e->t_ns[TDIST__FR_QUEUED];
    return frt_real_ns(r, t);
}

/* The group's first problem at or after seq lo; kind 0 when none. */
static int classify(const grp_t *g, uint64_t s, const uint64_t *hi, const tdist__fr_entry_t **at)
{
    int present = 0, done = 0, missing = 0;
    const tdist__fr_entry_t *first = NULL;
    bool mismatch = false;
    for (int r = 0; r < g->size; r++) {
        at[r] = frt_find_seq(g->rank[r], s);
        if (!at[r]) {
            if (!g->rank[r] || hi[r] < s) missing++;
            continue;
        }
        present++;
        if (at[r]->state == TDIST__FR_COMPLETED) done++;
        if (first && frt_differ(first, at[r])) mismatch = true;
        if (!first) first = at[r];
    }
    if (mismatch) return PROB_MISMATCH;
    if (present && missing) return PROB_MISSING;
    if (present == g->size && done < present) return PROB_STUCK;
    return 0;
}

static bool group_problem(const grp_t *g, prob_t *p)
{
    uint64_t lo = 0, s_hi = 0;
    uint64_t *hi = calloc((size_t)g->size, sizeof *hi);
    const tdist__fr_entry_t **at = calloc((size_t)g->size, sizeof *at);
    if (!hi || !at) {
        free(hi);
        free(at);
        return false;
    }
    for (int r = 0; r < g->size; r++) {
        uint64_t l, h;
        seq_range(g->rank[r], &l, &h);
        hi[r] = h;
        if (l != UINT64_MAX && l > lo) lo = l; /* older than that: some ring has wrapped */
        if (h > s_hi) s_hi = h;
    }
    for (uint64_t s = lo ? lo : 1; s <= s_hi; s++) {
        int kind = classify(g, s, hi, at);
        if (!kind) continue;
        p->kind = kind;
        p->g = g;
        p->seq = s;
        p->at = at;
        p->t_real = INT64_MAX;
        for (int r = 0; r < g->size; r++)
            if (at[r] && started_real(g->rank[r], at[r]) < p->t_real)
                p->t_real = started_real(g->rank[r], at[r]);
        free(hi);
        return true;
    }
    free(hi);
    free(at);
    return false;
}

static int by_time(const void *a, const void *b)
{
    const prob_t *x = a, *y = b;
    return x->t_real < y->t_real ? -1 : x->t_real > y->t_real;
}

size_t frt_analyze(const model_t *m, const char *only_group, prob_t **out)
{
    prob_t *ps = calloc(m->ngrps + 1, sizeof *ps);
    size_t n = 0;
    for (size_t i = 0; ps && i < m->ngrps; i++) {
        const grp_t *g = &m->grps[i];
        if (only_group && strcmp(only_group, g->name) != 0 && strcmp(only_group, g->uid) != 0)
            continue;
        if (group_problem(g, &ps[n])) n++;
    }
    if (ps) qsort(ps, n, sizeof *ps, by_time);
    *out = ps;
    return n;
}
