/*
 * pg/check.c — collective fingerprints (rule 2 of docs/design.md).
 *
 * Before every collective each rank sends a fixed-size fingerprint to every
 * peer and receives every peer's (all posted at once, one wait with the
 * collective's deadline). Every rank then holds every rank's common part
 * and compares each against rank 0's: the first rank that differs is named,
 * so every rank reports the same message. all_to_allv adds a second small
 * round: each rank checks the pairs it is part of ("I send you s / I
 * expect r from you") and all ranks exchange their first disagreement, so
 * the lowest disagreeing pair is reported everywhere.
 *
 * A TCP group of TDIST_CHECK_TREE_MIN ranks or more sends the common part
 * along a binomial tree instead (coll/fused_tree.c, chosen in
 * coll/select.c): it fills theirs with rank 0's fingerprint and the first
 * that differs, and compare_theirs words the same message from them.
 * The exchange here stays for backends, inside a Join (a joined rank
 * reads the leader's first message) and for all_to_allv's pairwise
 * splits.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pg/internal.h"

static uint64_t hash_counts(const size_t *c, size_t n)
{
    uint64_t h = TDIST__FNV_INIT;
    for (size_t i = 0; i < n; i++) {
        uint64_t v = c[i];
        h = tdist__fnv1a(h, &v, sizeof v);
    }
    return h;
}

void tdist__fp_common(const struct tdist_work *w, uint64_t uid_hash, tdist__fp_t *fp)
{
    if (w->fp_override) { /* a shadow collective says exactly what it answers */
        *fp = *w->fp_override;
        fp->send_to_you = fp->recv_from_you = 0;
        return;
    }
    tdist__fp_init(fp, w->op, uid_hash, w->seq, w->dtype, w->root, w->redop, w->count,
                   w->fp_flags);
    switch (w->op) {
    case TDIST__OP_ALL_GATHERV: {
        uint64_t total = 0;
        for (int r = 0; r < w->nranks; r++) total += w->recvcounts[r];
        fp->count = total;
        fp->vec_hash = hash_counts(w->recvcounts, (size_t)w->nranks);
        break;
    }
    case TDIST__OP_ALL_REDUCE_COALESCED:
    case TDIST__OP_BROADCAST_COALESCED: {
        uint64_t total = 0;
        for (size_t i = 0; i < w->nbufs; i++) total += w->counts[i];
        fp->count = total;
        fp->vec_hash = hash_counts(w->counts, w->nbufs);
        fp->aux = w->nbufs;
        break;
    }
    case TDIST__OP_ALL_TO_ALLV:
    case TDIST__OP_BARRIER:
    case TDIST__OP_MONITORED_BARRIER:
        fp->count = 0;
        break;
    default:
        fp->count = w->count;
        break;
    }
}

void tdist__fp_fill(tdist_pg_t *pg, const struct tdist_work *w)
{
    tdist__fp_common(w, pg->uid_hash, &pg->chk.mine[0]);
    for (int p = 0; p < pg->size; p++) {
        if (p) pg->chk.mine[p] = pg->chk.mine[0];
        if (w->op == TDIST__OP_ALL_TO_ALLV) {
            pg->chk.mine[p].send_to_you = w->sendcounts[p];
            pg->chk.mine[p].recv_from_you = w->recvcounts[p];
        }
    }
}

bool tdist__fp_common_equal(const tdist__fp_t *a, const tdist__fp_t *b)
{
    return a->magic == b->magic && a->op == b->op && a->uid_hash == b->uid_hash &&
           a->seq == b->seq && a->count == b->count && a->vec_hash == b->vec_hash &&
           a->aux == b->aux && a->dtype == b->dtype && a->root == b->root &&
           a->redop == b->redop && a->flags == b->flags;
}

void tdist__fp_describe(const tdist__fp_t *fp, bool with_seq, char *buf, size_t n)
{
    tdist__op_t op = (fp->op < TDIST__OP_COUNT) ? (tdist__op_t)fp->op : TDIST__OP_NONE;
    const char *dt = tdist_dtype_name((tdist_dtype_t)fp->dtype);
    const char *ro = tdist_redop_name((tdist_redop_t)fp->redop);
    char seq[40] = "";
    if (with_seq) snprintf(seq, sizeof seq, " seq %" PRIu64, fp->seq);
    const char *name = (fp->flags & TDIST__FP_JOIN_NOTIFY) ? "join_notification"
                                                          : tdist__op_name(op);
    unsigned long long cnt = (unsigned long long)fp->count;
    switch (op) {
    case TDIST__OP_BROADCAST:
    case TDIST__OP_GATHER:
    case TDIST__OP_SCATTER:
        snprintf(buf, n, "%s(%s, %llu, root %d)%s", name, dt, cnt, fp->root, seq);
        break;
    case TDIST__OP_ALL_REDUCE:
    case TDIST__OP_REDUCE_SCATTER:
    case TDIST__OP_ALL_REDUCE_WIRE: /* dtype: the wire */
        snprintf(buf, n, "%s(%s, %llu, %s)%s", name, dt, cnt, ro, seq);
        break;
    case TDIST__OP_REDUCE:
        snprintf(buf, n, "%s(%s, %llu, %s, root %d)%s", name, dt, cnt, ro, fp->root, seq);
        break;
    case TDIST__OP_ALL_GATHER:
    case TDIST__OP_ALL_TO_ALL:
        snprintf(buf, n, "%s(%s, %llu)%s", name, dt, cnt, seq);
        break;
    case TDIST__OP_ALL_GATHERV:
        snprintf(buf, n, "%s(%s, %llu in total, counts hash %08llx)%s", name, dt, cnt,
                 (unsigned long long)(fp->vec_hash & 0xffffffffu), seq);
        break;
    case TDIST__OP_ALL_TO_ALLV:
        snprintf(buf, n, "%s(%s)%s", name, dt, seq);
        break;
    case TDIST__OP_ALL_REDUCE_COALESCED:
        snprintf(buf, n, "%s(%s, %llu buffers, %llu in total, counts hash %08llx, %s)%s", name,
                 dt, (unsigned long long)fp->aux, cnt,
                 (unsigned long long)(fp->vec_hash & 0xffffffffu), ro, seq);
        break;
    case TDIST__OP_BROADCAST_COALESCED:
        snprintf(buf, n, "%s(%s, %llu buffers, %llu in total, counts hash %08llx, root %d)%s",
                 name, dt, (unsigned long long)fp->aux, cnt,
                 (unsigned long long)(fp->vec_hash & 0xffffffffu), fp->root, seq);
        break;
    default:
        snprintf(buf, n, "%s()%s", name, seq);
        break;
    }
}

void tdist__work_describe(const struct tdist_work *w, char *buf, size_t n)
{
    if (w->op == TDIST__OP_SEND || w->op == TDIST__OP_RECV) {
        snprintf(buf, n, "%s(%s, %zu, %s rank %d)", tdist__op_name(w->op),
                 tdist_dtype_name(w->dtype), w->count, w->op == TDIST__OP_SEND ? "to" : "from",
                 w->root);
        return;
    }
    tdist__fp_t fp;
    tdist__fp_common(w, 0, &fp);
    tdist__fp_describe(&fp, false, buf, n);
}

/* The line's 64-bit stand-in for a fingerprint: sum of its words, each
 * times its own odd constant. A difference in any one word always changes
 * it (an odd multiplier is invertible mod 2^64); differences in several
 * cancel with probability about 2^-64. The multiplies are independent, so
 * it costs a few cycles of latency, not a chain of ten. */
static const uint64_t fp_mult[] = {
    0x3cc04026ff2218f3ull, 0xb1545fbc0781bf83ull, TDIST__FP_SEQ_MULT,
    0x0ace59957aa4a9a1ull, 0x9ef717a4709e7127ull, 0x5acaf58aab68ce59ull,
    0xb48043a646d31849ull, 0x1e926c902f1af58bull, 0x524cff5480dd4c83ull,
    0x8f872a6532f12893ull,
};

uint64_t tdist__fp_hash(const tdist__fp_t *fp)
{
    _Static_assert(sizeof(tdist__fp_t) == sizeof fp_mult, "one constant per fingerprint word");
    _Static_assert(sizeof(tdist__fp_t) <= TDIST__SHMC_AUX_MAX, "a fingerprint fits a line's aux");
    /* from the fields, not the bytes: a word load spanning two 4-byte
     * stores just made would stall on store forwarding */
    const uint64_t w[] = {
        fp->magic | (uint64_t)fp->op << 32,
        fp->uid_hash,
        fp->seq,
        fp->count,
        fp->vec_hash,
        fp->aux,
        (uint32_t)fp->dtype | (uint64_t)(uint32_t)fp->root << 32,
        (uint32_t)fp->redop | (uint64_t)fp->flags << 32,
        fp->send_to_you,
        fp->recv_from_you,
    };
    _Static_assert(sizeof w == sizeof fp_mult, "every field");
    uint64_t h = 0;
    for (size_t i = 0; i < sizeof w / sizeof w[0]; i++) h += w[i] * fp_mult[i];
    return h;
}

/* all_to_allv's pairwise verdict: the lowest (from, to) pair this rank
 * saw disagree; from = -1 when none. */
typedef struct verdict {
    int32_t from, to;
    uint64_t sends, expects;
} verdict_t;

static bool verdict_less(const verdict_t *a, const verdict_t *b)
{
    if (a->from < 0) return false;
    if (b->from < 0) return true;
    return a->from < b->from || (a->from == b->from && a->to < b->to);
}

/* Another backend's group: every rank's len-byte block(s) to every rank
 * through the backend's own slot (op ALL_TO_ALL: block p of send goes to
 * rank p; ALL_GATHER: send goes to everyone); recv gets size blocks. */
static tdist_status_t be_exchange(tdist_pg_t *pg, const struct tdist_work *w, tdist__op_t op,
                                  const void *send, void *recv, size_t len, int64_t deadline_ms)
{
    tdist__coll_slot_t slot = pg->backend->coll->slot[op];
    if (!slot)
        return tdist__error(TDIST_ERR_NOT_SUPPORTED, "the %s backend has no %s for the "
                            "fingerprint check", pg->backend->name, tdist__op_name(op));
    size_t *counts = malloc((size_t)pg->size * sizeof *counts);
    if (!counts) return tdist__error(TDIST_ERR_NO_MEMORY, "fingerprint check: out of memory");
    for (int p = 0; p < pg->size; p++) counts[p] = len;
    tdist__coll_ctx_t c;
    tdist__pg_coll_ctx(pg, false, w->timeout_ms >= 0 ? w->timeout_ms : pg->timeout_ms,
                       deadline_ms, &c);
    tdist__coll_args_t a = {.op = op, .sendbuf = send, .recvbuf = recv, .count = len,
                            .dtype = TDIST_U8, .root = -1, .sendcounts = counts,
                            .recvcounts = counts};
    tdist_status_t st = slot(pg->be, &c, &a, NULL);
    free(counts);
    if (st != TDIST_OK)
        tdist__error_context(st, op == TDIST__OP_ALL_TO_ALL ? "the fingerprint exchange"
                                                            : "the all_to_allv check");
    return st;
}

/* Natively: send mine[p] (len bytes) to every peer p and receive every
 * peer's into theirs[p]; skip: a peer whose block is already in (-1:
 * none). */
static tdist_status_t tp_exchange(tdist_pg_t *pg, const uint8_t *mine, size_t mine_stride,
                                  uint8_t *theirs, size_t len, int skip, int64_t deadline_ms)
{
    int k = 0;
    for (int p = 0; p < pg->size; p++) {
        if (p == pg->rank) continue;
        TDIST_CHECK(tdist__tp_post_send(pg->tp, &pg->chk.reqs[k], p, mine + (size_t)p * mine_stride,
                                        len));
        pg->chk.reqp[k] = &pg->chk.reqs[k];
        k++;
        if (p == skip) continue;
        TDIST_CHECK(tdist__tp_post_recv(pg->tp, &pg->chk.reqs[k], p, theirs + (size_t)p * len, len));
        pg->chk.reqp[k] = &pg->chk.reqs[k];
        k++;
    }
    return tdist__tp_wait(pg->tp, pg->chk.reqp, (size_t)k, deadline_ms);
}

static tdist_status_t a2av_round(tdist_pg_t *pg, const struct tdist_work *w, int64_t deadline_ms)
{
    int n = pg->size, me = pg->rank;
    verdict_t mine = {.from = -1, .to = -1};
    for (int p = 0; p < n; p++) {
        /* me -> p: I send sendcounts[p]; p expects theirs[p].recv_from_you */
        uint64_t s = w->sendcounts[p];
        uint64_t r = (p == me) ? w->recvcounts[me] : pg->chk.theirs[p].recv_from_you;
        verdict_t v = {me, p, s, r};
        if (s != r && verdict_less(&v, &mine)) mine = v;
        /* p -> me */
        s = (p == me) ? w->sendcounts[me] : pg->chk.theirs[p].send_to_you;
        r = w->recvcounts[p];
        verdict_t v2 = {p, me, s, r};
        if (s != r && verdict_less(&v2, &mine)) mine = v2;
    }
    verdict_t *all = calloc((size_t)(unsigned)n, sizeof *all);
    if (!all) return tdist__error(TDIST_ERR_NO_MEMORY, "all_to_allv check: out of memory");
    tdist_status_t st;
    if (pg->backend)
        st = be_exchange(pg, w, TDIST__OP_ALL_GATHER, &mine, all, sizeof mine, deadline_ms);
    else
        st = tp_exchange(pg, (const uint8_t *)&mine, 0, (uint8_t *)all, sizeof mine, -1,
                         deadline_ms);
    if (st != TDIST_OK) {
        if (!pg->backend || !pg->backend->holds_memory(pg->be)) free(all); /* else the backend's */
        return st;
    }
    all[me] = mine;
    verdict_t best = {.from = -1, .to = -1};
    for (int p = 0; p < n; p++)
        if (verdict_less(&all[p], &best)) best = all[p];
    free(all);
    if (best.from < 0) return TDIST_OK;
    return tdist__error(TDIST_ERR_MISMATCH,
                        "collective mismatch: all_to_allv splits disagree: rank %d sends %llu "
                        "elements to rank %d, which expects %llu from rank %d",
                        best.from, (unsigned long long)best.sends, best.to,
                        (unsigned long long)best.expects, best.from);
}

tdist_status_t tdist__fp_exchange(tdist_pg_t *pg, const struct tdist_work *w, int64_t deadline_ms)
{
    tdist__fp_fill(pg, w);
    if (pg->size > 1) {
        size_t fs = sizeof(tdist__fp_t);
        if (pg->backend)
            TDIST_CHECK(be_exchange(pg, w, TDIST__OP_ALL_TO_ALL, pg->chk.mine, pg->chk.theirs, fs,
                                    deadline_ms));
        else
            TDIST_CHECK(tp_exchange(pg, (const uint8_t *)pg->chk.mine, fs,
                                    (uint8_t *)pg->chk.theirs, fs, pg->chk.have, deadline_ms));
    }
    TDIST_CHECK(tdist__fp_compare(pg));
    if (w->op == TDIST__OP_ALL_TO_ALLV) return a2av_round(pg, w, deadline_ms);
    return TDIST_OK;
}

static tdist_status_t compare_theirs(tdist_pg_t *pg);

tdist_status_t tdist__fp_compare(tdist_pg_t *pg)
{
    pg->chk.theirs[pg->rank] = pg->chk.mine[pg->rank];
    return compare_theirs(pg);
}

tdist_status_t tdist__fp_compare_earlier(tdist_pg_t *pg, const struct tdist_work *w)
{
    const tdist__fp_t *own = &pg->chk.theirs[pg->rank];
    tdist_status_t st = compare_theirs(pg);
    if (st != TDIST_ERR_MISMATCH || own->seq == w->seq) return st;
    char d[160];
    tdist__fp_describe(own, false, d, sizeof d);
    return tdist__error_context(st, "this rank's earlier %s seq %llu (a rooted collective this "
                                "rank sent or received without waiting for every rank)", d,
                                (unsigned long long)own->seq);
}

static tdist_status_t compare_theirs(tdist_pg_t *pg)
{
    int n = pg->size;
    for (int p = 0; p < n; p++)
        if (pg->chk.theirs[p].magic != TDIST__FP_MAGIC)
            return tdist__error(TDIST_ERR_MISMATCH,
                                "collective mismatch: rank %d sent a malformed fingerprint "
                                "(magic %08x; is it running another protocol?)",
                                p, (unsigned)pg->chk.theirs[p].magic);
    for (int p = 1; p < n; p++) {
        if (tdist__fp_common_equal(&pg->chk.theirs[0], &pg->chk.theirs[p])) continue;
        bool seq = pg->chk.theirs[0].seq != pg->chk.theirs[p].seq;
        char a[160], b[160];
        tdist__fp_describe(&pg->chk.theirs[0], seq, a, sizeof a);
        tdist__fp_describe(&pg->chk.theirs[p], seq, b, sizeof b);
        if (strcmp(a, b) == 0) {
            /* differs only in what describe does not show */
            snprintf(b + strlen(b), sizeof b - strlen(b), " of another group (hash %016llx)",
                     (unsigned long long)pg->chk.theirs[p].uid_hash);
        }
        uint32_t fl = pg->chk.theirs[0].flags ^ pg->chk.theirs[p].flags;
        const char *hint = (fl & TDIST__FP_JOIN_NOTIFY)
                               ? " (inside a Join, a rank that has run out of inputs can only "
                                 "take part in collectives issued after the iteration's "
                                 "notification, tdist_ddp_forward_begin or tdist_join_notify; "
                                 "issue this one after it)"
                               : "";
        return tdist__error(TDIST_ERR_MISMATCH, "collective mismatch: rank 0 %s vs rank %d %s%s",
                            a, p, b, hint);
    }
    return TDIST_OK;
}
