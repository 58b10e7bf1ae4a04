/*
 * coll/fused_tree.c — pg/'s check (and a small one-shot collective's
 * data) in log2(size) rounds of recursive doubling, for a point-to-point
 * group of tree_min ranks or more (select.c), instead of one message to
 * every peer: 3 messages a rank at 8 ranks, not 7.
 *
 * Each rank speaks for a block of ranks [lo, hi), at first itself. A
 * message carries the block's verdict — the fingerprint of rank lo, and
 * the first rank of the block whose fingerprint differs from it with that
 * fingerprint (-1: none) — followed by the block's staged data in rank
 * order (its length in the header). Two neighbouring blocks merge into
 * one: the lower's verdict, else, when the upper's first fingerprint
 * differs from the lower's, the upper's first rank, else the upper's own
 * difference. Equality is transitive, so the merged verdict of [0, size)
 * names rank 0's fingerprint and the first rank that differs from it,
 * exactly what the exchange with every peer finds (pg/'s compare words
 * it: the same message on every rank, the same collective). After
 * log2(size) rounds every rank holds every rank's data; the one-shot
 * finish reduces it in rank order, as the exchange with every peer does:
 * the same bits on every rank.
 *
 * A size that is not a power of two folds first: the odd ranks below
 * 2 x (size - p2) hand their block to the even rank below, which speaks
 * for both and hands the result back at the end.
 *
 * A rank whose fingerprint differs may stage other data or none: every
 * message says how much data follows, and a receiver reads it (into its
 * place while the merged verdict has no difference and the length is the
 * expected one, else into a scratch it ignores), so every rank finishes
 * the rounds with the byte streams in step and every rank learns of the
 * mismatch in the same collective. Every wait is bounded by the
 * collective's deadline; a peer that dies fails its partners, whose
 * failure closes their meshes (pg/'s cascade) and fails theirs in turn.
 */
#include <string.h>

#include "coll/coll_internal.h"

#define TREE_MAGIC 0x74724b31u /* "trK1" */

typedef struct tree_hdr {
    uint32_t magic;
    int32_t lo, hi;    /* the block of ranks [lo, hi) the sender speaks for */
    int32_t diff;      /* the block's first rank whose fingerprint differs from lo's; -1 */
    uint64_t data_len; /* bytes of staged data following, in rank order */
    uint8_t ref[TDIST__COLL_FP_MAX]; /* rank lo's fingerprint */
    uint8_t dfp[TDIST__COLL_FP_MAX]; /* rank diff's */
} tree_hdr_t;

/* One exchange's state. */
typedef struct tree {
    const tdist__coll_ctx_t *c;
    const tdist__coll_check_t *chk;
    const tdist__coll_args_t *a; /* NULL: the check alone */
    tree_hdr_t acc;              /* this rank's block */
    uint8_t *data;               /* every rank's staged data, in rank order */
    size_t max_data;             /* the most a block may carry */
} tree_t;

/* Where rank r's staged data starts (the ranks' lengths as this rank's
 * arguments give them). */
static size_t data_off(const tree_t *t, int r)
{
    if (!t->a) return 0;
    size_t off = 0;
    for (int q = 0; q < r; q++) off += tdist__oneshot_len(t->a, t->c->size, q);
    return off;
}

/* The ranks of the fold: p2 = the largest power of two <= size, e = size -
 * p2; virtual rank v (0..p2) speaks for ranks [vlo(v), vhi(v)). */
static int vlo(int e, int v) { return v < e ? 2 * v : v + e; }
static int vhi(int e, int v) { return v < e ? 2 * v + 2 : v + e + 1; }

static tdist_status_t malformed(int from, const tree_hdr_t *in, int lo, int hi)
{
    return tdist__error(TDIST_ERR_MISMATCH,
                        "collective mismatch: rank %d sent a malformed check message (magic "
                        "%08x, ranks %d..%d where %d..%d were expected; is it running another "
                        "protocol?)",
                        from, (unsigned)in->magic, (int)in->lo, (int)in->hi - 1, lo, hi - 1);
}

/* Merge the block in (neighbouring acc, or covering it) into acc. */
static void merge(tree_t *t, const tree_hdr_t *in)
{
    size_t len = t->chk->len;
    if (in->lo <= t->acc.lo && in->hi >= t->acc.hi) { /* the whole result */
        t->acc = *in;
        return;
    }
    tree_hdr_t out = in->lo < t->acc.lo ? *in : t->acc;
    const tree_hdr_t *up = in->lo < t->acc.lo ? &t->acc : in;
    if (out.diff < 0 && memcmp(out.ref, up->ref, len) != 0) {
        out.diff = up->lo;
        memcpy(out.dfp, up->ref, len);
    } else if (out.diff < 0 && up->diff >= 0) {
        out.diff = up->diff;
        memcpy(out.dfp, up->dfp, len);
    }
    out.hi = up->hi;
    t->acc = out;
}

/* Read n bytes from `from` and drop them (a block whose data this rank
 * does not use). */
static tdist_status_t drain(const tree_t *t, int from, size_t n)
{
    const tdist__coll_ctx_t *c = t->c;
    size_t room = c->g->fused_cap;
    for (size_t done = 0; done < n;) {
        size_t k = TDIST_MIN(room, n - done);
        TDIST_CHECK(tdist__coll_recv(c, from, c->g->fused_out, k));
        done += k;
    }
    return TDIST_OK;
}

/* One step: send this rank's block to `to` (< 0: none) and receive the
 * block [lo, hi) from `from` (< 0: none) and merge it. */
static tdist_status_t step(tree_t *t, int to, int from, int lo, int hi)
{
    const tdist__coll_ctx_t *c = t->c;
    tdist__tp_req_t r[3];
    tdist__tp_req_t *rp[3] = {&r[0], &r[1], &r[2]};
    tree_hdr_t out = t->acc, in;
    size_t n = 0, my_off = data_off(t, out.lo);
    out.data_len = out.diff < 0 ? data_off(t, out.hi) - my_off : 0;
    tdist_status_t st = TDIST_OK;
    if (to >= 0) st = tdist__tp_post_send(c->tp, &r[n++], to, &out, sizeof out);
    if (st == TDIST_OK && to >= 0 && out.data_len)
        st = tdist__tp_post_send(c->tp, &r[n++], to, t->data + my_off, out.data_len);
    if (st == TDIST_OK && from >= 0) st = tdist__tp_post_recv(c->tp, &r[n++], from, &in, sizeof in);
    /* the header first: how much data follows is in it */
    if (st == TDIST_OK && from >= 0) st = tdist__coll_wait(c, rp + n - 1, 1);
    if (st == TDIST_OK && from >= 0 &&
        (in.magic != TREE_MAGIC || in.lo != lo || in.hi != hi || in.diff >= hi ||
         (in.diff >= 0 && in.diff <= lo) || in.data_len > t->max_data))
        st = malformed(from, &in, lo, hi);
    if (st != TDIST_OK || from < 0) {
        if (st == TDIST_OK) return tdist__coll_wait(c, rp, n);
        tdist__coll_abandon(c, rp, n);
        return st;
    }
    merge(t, &in);
    size_t at = data_off(t, lo), want = t->acc.diff < 0 ? data_off(t, hi) - at : 0;
    bool keep = in.data_len && in.data_len == want;
    n--; /* the header is in */
    if (keep) st = tdist__tp_post_recv(c->tp, &r[2], from, t->data + at, want);
    if (st == TDIST_OK && keep) rp[n++] = &r[2];
    if (st == TDIST_OK) st = tdist__coll_wait(c, rp, n);
    else tdist__coll_abandon(c, rp, n);
    if (st == TDIST_OK && in.data_len && !keep) st = drain(t, from, (size_t)in.data_len);
    return st;
}

/* The recursive doubling itself; on return t->acc speaks for every rank. */
static tdist_status_t rounds(tree_t *t)
{
    int n = t->c->size, me = t->c->rank, p2 = 1;
    while (p2 <= n / 2) p2 *= 2;
    int e = n - p2;
    if (me < 2 * e && me % 2) { /* folded: hand over, get the result back */
        TDIST_CHECK(step(t, me - 1, -1, 0, 0));
        return step(t, -1, me - 1, 0, n);
    }
    if (me < 2 * e) TDIST_CHECK(step(t, -1, me + 1, me + 1, me + 2));
    int v = me < 2 * e ? me / 2 : me - e;
    for (int mask = 1; mask < p2; mask <<= 1) {
        int pv = v ^ mask, plo = pv & ~(mask - 1);
        TDIST_CHECK(step(t, vlo(e, pv), vlo(e, pv), vlo(e, plo), vhi(e, plo + mask - 1)));
    }
    if (me < 2 * e) TDIST_CHECK(step(t, me + 1, -1, 0, 0));
    return TDIST_OK;
}

tdist_status_t tdist__coll_tree_exchange(const tdist__coll_ctx_t *c, const tdist__coll_check_t *chk,
                                         const tdist__coll_args_t *a)
{
    tdist__coll_group_t *g = c->g;
    size_t len = chk->len;
    if (len > TDIST__COLL_FP_MAX)
        return tdist__error(TDIST_ERR_INTERNAL, "rank %d: a %zu-byte fingerprint", c->rank, len);
    tree_t t = {.c = c, .chk = chk, .a = a, .data = g->fused_in,
                .max_data = (size_t)c->size * g->fused_cap};
    memset(&t.acc, 0, sizeof t.acc);
    t.acc.magic = TREE_MAGIC;
    t.acc.lo = c->rank;
    t.acc.hi = c->rank + 1;
    t.acc.diff = -1;
    memcpy(t.acc.ref, chk->common, len);
    size_t bytes = 0;
    const void *in = a ? tdist__oneshot_input(c, a, &bytes) : NULL;
    if (in) {
        uint8_t *mine = t.data + data_off(&t, c->rank);
        memcpy(mine, in, bytes);
        TDIST_CHECK(tdist__oneshot_scale(a, mine, bytes));
    }
    TDIST_CHECK(rounds(&t));
    for (int r = 0; r < c->size; r++)
        memcpy(chk->theirs + (size_t)r * len, r == t.acc.diff ? t.acc.dfp : t.acc.ref, len);
    TDIST_CHECK(chk->compare(chk->arg));
    if (t.acc.diff >= 0)
        return tdist__error(TDIST_ERR_INTERNAL, "rank %d: rank %d's fingerprint differs from "
                            "rank 0's, yet they compare equal", c->rank, (int)t.acc.diff);
    for (int r = 0; r < c->size; r++) g->blobs[r] = g->fused_in + data_off(&t, r);
    return TDIST_OK;
}
