/*
 * coll/fused_tree.c — pg/'s check (and a small one-shot collective's
 * data) along a tree, for a point-to-point group of tree_min ranks or
 * more (select.c), instead of one message to every peer: up the tree to
 * rank 0, then back down, 2 (size - 1) messages in all (14 at 8 ranks,
 * not 56). The tree is k-nomial of the group's radix (tree_radix, 8):
 * flat (rank 0 and the others) up to k ranks, 2 ceil(log_k size) steps
 * deep above.
 *
 * Rank r's subtree is a block of ranks [r, r + k^j) (rank 0's: all). A message carries its block's verdict — the fingerprint of the
 * block's first rank, and the first rank of the block whose fingerprint
 * differs from it with that fingerprint (-1: none) — followed by data
 * whose length it gives. Going up, the data is the block's staged data in
 * rank order, and a parent merges each child's block (the next one above
 * its own, in rank order) into its own: its verdict, else, when the child's first
 * fingerprint differs from it, the child's first rank, else the child's
 * own difference. Equality is transitive, so rank 0 ends with rank 0's
 * fingerprint and the first rank that differs from it, exactly what the
 * exchange with every peer finds; going down, every rank gets that
 * verdict (pg/'s compare words it: the same message on every rank, in
 * the same collective) and the data: every rank's, or, for all_reduce
 * and reduce, the result rank 0 reduced from them in rank order (the
 * order of the exchange with every peer: the same bits). An all_reduce
 * above fused_max (up to TDIST__COLL_TREE_REDUCE_MAX) carries a block's
 * partial reduction instead: a parent reduces its own, then each child's
 * in turn, so the order is the tree's, fixed, and computed once.
 *
 * A rank whose fingerprint differs may stage other data or none: every
 * message says how much data follows, and a receiver reads it (into its
 * place while the merged verdict has no difference and the length is the
 * expected one, else into a scratch it ignores), so the byte streams
 * stay in step until every rank has the verdict, and every rank learns
 * of the mismatch in the same collective. Every wait is bounded by the
 * collective's deadline; a peer that dies fails its tree neighbours,
 * whose failure closes their meshes (pg/'s cascade) and fails theirs.
 */
#include <string.h>

#include "coll/coll_internal.h"

#define TREE_MAGIC 0x74724b31u /* "trK1" */
/* Data up to this many bytes rides inside the header: one send and one
 * receive a message instead of two. */
#define TREE_INLINE 64

typedef struct tree_hdr {
    uint32_t magic;
    int32_t lo, hi;    /* the block of ranks [lo, hi) the sender speaks for */
    int32_t diff;      /* the block's first rank whose fingerprint differs from lo's; -1 */
    uint64_t data_len; /* bytes of data following (inside, in inl, up to TREE_INLINE) */
    uint8_t ref[TDIST__COLL_FP_MAX]; /* rank lo's fingerprint */
    uint8_t dfp[TDIST__COLL_FP_MAX]; /* rank diff's */
    uint8_t inl[TREE_INLINE];        /* the data when it fits (an 8-byte all_reduce's) */
} tree_hdr_t;

/* One exchange's state. */
typedef struct tree {
    const tdist__coll_ctx_t *c;
    const tdist__coll_check_t *chk;
    const tdist__coll_args_t *a; /* NULL: the check alone */
    tree_hdr_t acc;              /* this rank's block */
    uint8_t *data;               /* every rank's staged data, in rank order */
    size_t max_data;             /* the most a block may carry */
    uint8_t *res;                /* all_reduce, reduce: the result handed down */
    size_t res_len;
    /* a larger all_reduce: a block carries its ranks' reduction (res), a
     * child's received into tmp and reduced into res, lower ranks first */
    bool partial;
    uint8_t *tmp;
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

/* The data that travels with the block [lo, hi) (*len bytes): its ranks'
 * staged data, or the whole group's result handed down. */
static uint8_t *payload(const tree_t *t, int lo, int hi, size_t *len)
{
    if (t->res && ((lo == 0 && hi == t->c->size) || t->partial)) {
        *len = t->res_len;
        return lo == 0 || lo == t->c->rank ? t->res : t->tmp;
    }
    size_t at = data_off(t, lo);
    *len = data_off(t, hi) - at;
    return t->data + at;
}

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
    size_t n = 0, mine_len;
    const uint8_t *mine = payload(t, out.lo, out.hi, &mine_len);
    out.data_len = out.diff < 0 ? mine_len : 0;
    bool inl = out.data_len <= TREE_INLINE;
    if (inl && out.data_len) memcpy(out.inl, mine, out.data_len);
    tdist_status_t st = TDIST_OK;
    if (to >= 0) st = tdist__tp_post_send(c->tp, &r[n++], to, &out, sizeof out);
    if (st == TDIST_OK && to >= 0 && !inl)
        st = tdist__tp_post_send(c->tp, &r[n++], to, mine, out.data_len);
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
    size_t want;
    uint8_t *at = payload(t, lo, hi, &want);
    if (t->acc.diff >= 0) want = 0;
    bool keep = in.data_len && in.data_len == want;
    n--; /* the header is in */
    if (in.data_len <= TREE_INLINE) {
        if (keep) memcpy(at, in.inl, want);
        st = tdist__coll_wait(c, rp, n);
    } else {
        if (keep) st = tdist__tp_post_recv(c->tp, &r[2], from, at, want);
        if (st == TDIST_OK && keep) rp[n++] = &r[2];
        if (st == TDIST_OK) st = tdist__coll_wait(c, rp, n);
        else tdist__coll_abandon(c, rp, n);
        if (st == TDIST_OK && in.data_len && !keep) st = drain(t, from, (size_t)in.data_len);
    }
    /* a child's partial reduction: after this rank's own (lower ranks) */
    if (st == TDIST_OK && keep && at == t->tmp)
        tdist__reduce_unchecked(t->res, t->res, t->tmp, t->a->count, t->a->dtype, t->a->redop);
    return st;
}

/* Every rank's staged data (blobs[r]), for the one-shot finish. */
static const uint8_t *const *blobs(const tree_t *t)
{
    for (int r = 0; r < t->c->size; r++) t->c->g->blobs[r] = t->data + data_off(t, r);
    return t->c->g->blobs;
}

/* Rank 0's result of a reduction, once every rank's block is merged. */
static tdist_status_t reduce_at_root(tree_t *t)
{
    if (!t->res || t->acc.diff >= 0) return TDIST_OK;
    if (t->partial) return tdist__coll_finish(t->c, t->res, t->a->count, t->a->dtype, t->a->redop);
    return tdist__oneshot_reduce(t->c, t->a, blobs(t), 0, t->res);
}

/* Up a k-nomial tree to rank 0 (each child's block merged into this
 * rank's, in rank order), rank 0's result, then back down. Rank r's
 * children at level span (a power of k below r's lowest nonzero base-k
 * digit) are r + i span, i = 1 .. k - 1; its parent is r with that digit
 * cleared. k = 2: binomial; k >= size: rank 0 and every other rank. */
static tdist_status_t knomial(tree_t *t, int k)
{
    long n = t->c->size, me = t->c->rank, span = 1;
    for (; span < n && (me / span) % k == 0; span *= k)
        for (long i = 1, child = me + span; i < k && child < n; i++, child += span)
            TDIST_CHECK(step(t, -1, (int)child, (int)child, (int)TDIST_MIN(child + span, n)));
    long parent = me - ((me / span) % k) * span;
    if (me) {
        TDIST_CHECK(step(t, (int)parent, -1, 0, 0));
        TDIST_CHECK(step(t, -1, (int)parent, 0, (int)n));
    } else {
        TDIST_CHECK(reduce_at_root(t));
    }
    for (span /= k; span >= 1; span /= k)
        for (long i = 1, child = me + span; i < k && child < n; i++, child += span)
            TDIST_CHECK(step(t, (int)child, -1, 0, 0));
    return TDIST_OK;
}

/* Stage this rank's part of a: its data in rank order, or (partial) its
 * own reduction's start in a scratch of two vectors. */
static tdist_status_t stage(tree_t *t)
{
    const tdist__coll_ctx_t *c = t->c;
    const tdist__coll_args_t *a = t->a;
    if (a->op == TDIST__OP_ALL_REDUCE || a->op == TDIST__OP_REDUCE) {
        t->res = c->g->fused_out;
        t->res_len = tdist__coll_bytes(a->count, a->dtype);
    }
    if (a->op == TDIST__OP_ALL_REDUCE && t->res_len > c->g->fused_max) {
        void *s = NULL;
        TDIST_CHECK(tdist__coll_scratch_get(c, 2 * t->res_len, "all_reduce along a tree", &s));
        t->partial = true;
        t->res = s;
        t->tmp = t->res + t->res_len;
        return tdist__coll_load(t->res, a->sendbuf, a->count, a->dtype, a->redop, a->premul);
    }
    size_t bytes = 0;
    const void *in = tdist__oneshot_input(c, a, &bytes);
    if (!in) return TDIST_OK;
    uint8_t *mine = t->data + data_off(t, c->rank);
    memcpy(mine, in, bytes);
    return tdist__oneshot_scale(a, mine, bytes);
}

/* The verdict into chk->theirs, pg's compare; then a's result. */
static tdist_status_t finish(tree_t *t)
{
    const tdist__coll_ctx_t *c = t->c;
    const tdist__coll_args_t *a = t->a;
    size_t len = t->chk->len;
    for (int r = 0; r < c->size; r++)
        memcpy(t->chk->theirs + (size_t)r * len, r == t->acc.diff ? t->acc.dfp : t->acc.ref, len);
    TDIST_CHECK(t->chk->compare(t->chk->arg));
    if (t->acc.diff >= 0)
        return tdist__error(TDIST_ERR_INTERNAL, "rank %d: rank %d's fingerprint differs from "
                            "rank 0's, yet they compare equal", c->rank, (int)t->acc.diff);
    if (!a) return TDIST_OK;
    if (!t->res) return tdist__oneshot_finish(c, a, blobs(t));
    if (a->op == TDIST__OP_ALL_REDUCE || c->rank == a->root) memcpy(a->recvbuf, t->res, t->res_len);
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
                .max_data = TDIST_MAX((size_t)c->size * g->fused_cap, TDIST__COLL_TREE_REDUCE_MAX)};
    memset(&t.acc, 0, sizeof t.acc);
    t.acc.magic = TREE_MAGIC;
    t.acc.lo = c->rank;
    t.acc.hi = c->rank + 1;
    t.acc.diff = -1;
    memcpy(t.acc.ref, chk->common, len);
    tdist_status_t st = a ? stage(&t) : TDIST_OK;
    if (st == TDIST_OK) st = knomial(&t, g->tree_radix);
    if (st == TDIST_OK) st = finish(&t);
    if (t.partial) tdist__coll_scratch_done(c, t.res);
    return st;
}
