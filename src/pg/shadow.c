/*
 * pg/shadow.c — rule 4 of docs/design.md: joined ranks shadow.
 *
 * join/ tells the group its role in a Join (tdist__pg_join_set) after every
 * notification:
 *  - PRE (in a Join, before this rank's first notification): any
 *    collective but the notification is refused — a rank that has already
 *    run out of inputs could not know it exists.
 *  - ACTIVE (this rank iterates): calls that a joined rank cannot answer —
 *    a root or a point-to-point peer that has joined, the v-forms whose
 *    counts it cannot know, monitored_barrier — are refused on the calling
 *    rank before anything is sent (TDIST_ERR_JOINED). Everything else
 *    runs as usual; AVG divides by the Join's divisor.
 *  - SHADOW (this rank has joined; it is in tdist_join_end): before each
 *    collective of its own (the next notification, its joinables' main
 *    hooks), the engine looks at what the leader — the lowest active rank —
 *    announces next: the fingerprint in its shared-memory line, or the
 *    first message it sends on TCP. While that is not the collective this
 *    rank planned, it takes part in the announced one with the reduction's
 *    identity (zeros for SUM/AVG/PREMUL_SUM/BOR/BXOR, one for PROD, the
 *    type's maximum for MIN and minimum for MAX, all ones for BAND; zeros
 *    for its all_gather / all_to_all slots; a barrier just includes it) and
 *    drops the result. The active ranks never wait for a missing peer.
 *
 * Every rank derives the same roles from the same notification, so every
 * rank agrees on which calls are refused. A notification is marked in its
 * fingerprint and never shadowed: a collective that meets a notification
 * is reported as a mismatch on every rank.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pg/internal.h"

void tdist__pg_join_set(tdist_pg_t *pg, int mode, const uint8_t *joined, int leader,
                        int divisor, uint64_t iteration)
{
    pthread_mutex_lock(&pg->mu);
    pg->join.mode = mode;
    tdist__pg_gate_slow(pg, mode != TDIST__JOIN_NONE); /* submit checks rule 4 under mu */
    pg->join.out = joined;
    pg->join.leader = leader;
    pg->join.divisor = divisor;
    pg->join.iter = iteration;
    pthread_mutex_unlock(&pg->mu);
}

int tdist__pg_join_mode(tdist_pg_t *pg)
{
    pthread_mutex_lock(&pg->mu);
    int m = pg->join.mode;
    pthread_mutex_unlock(&pg->mu);
    return m;
}

tdist_status_t tdist__pg_join_gather(tdist_pg_t *pg, const int64_t *word, int64_t *words)
{
    static const char *fn = "tdist_join notification";
    if (!pg || !word || !words)
        return tdist__error(TDIST_ERR_INVALID_ARG, "%s: NULL argument", fn);
    struct tdist_work *w = tdist__work_new(TDIST__OP_ALL_GATHER, NULL);
    if (!w) return tdist__error(TDIST_ERR_NO_MEMORY, "%s: out of memory", fn);
    w->sendbuf = word;
    w->recvbuf = words;
    w->count = 1;
    w->dtype = TDIST_I64;
    w->fp_flags = TDIST__FP_JOIN_NOTIFY;
    w->recvcounts = malloc((size_t)pg->size * sizeof *w->recvcounts);
    if (!w->recvcounts) {
        atomic_store(&w->refs, 1);
        tdist__work_release(w);
        return tdist__error(TDIST_ERR_NO_MEMORY, "%s: out of memory", fn);
    }
    for (int r = 0; r < pg->size; r++) w->recvcounts[r] = 1;
    return tdist__pg_submit(pg, w, NULL);
}

static tdist_status_t refuse(const tdist_pg_t *pg, const struct tdist_work *w, const char *why)
{
    char d[200];
    tdist__work_describe(w, d, sizeof d);
    return tdist__error(TDIST_ERR_JOINED,
                        "rank %d group %s %s (not issued; next seq %llu), Join iteration %llu: "
                        "%s",
                        pg->rank, pg->name, d, (unsigned long long)(tdist__pg_last_seq(pg) + 1),
                        (unsigned long long)pg->join.iter, why);
}

tdist_status_t tdist__pg_join_check(tdist_pg_t *pg, struct tdist_work *w)
{
    bool notify = (w->fp_flags & TDIST__FP_JOIN_NOTIFY) != 0;
    bool p2p = w->op == TDIST__OP_SEND || w->op == TDIST__OP_RECV;
    char why[300];
    switch (pg->join.mode) {
    case TDIST__JOIN_PRE:
        if (notify || p2p) return TDIST_OK;
        return refuse(pg, w,
                      "issued inside a Join before this rank's first notification "
                      "(tdist_ddp_forward_begin or tdist_join_notify): a rank that has run "
                      "out of inputs could not take part in it; issue it after the "
                      "notification");
    case TDIST__JOIN_SHADOW:
        /* on TCP the announcement is the fingerprint message: none
         * without fingerprints (TDIST_CHECK_FINGERPRINT=0), no shadowing;
         * other backends (MPI) exchange fingerprints all-to-all: a joined
         * rank cannot look first, so only the joinables' hooks shadow */
        if (!p2p && !pg->backend && (pg->shm || pg->check_fp))
            w->shadow_leader = pg->join.leader;
        return TDIST_OK;
    case TDIST__JOIN_ACTIVE:
        break;
    default:
        return TDIST_OK;
    }
    const uint8_t *out = pg->join.out;
    bool any = false;
    for (int r = 0; out && r < pg->size && !any; r++) any = out[r] != 0;
    if (!any || notify) return TDIST_OK;
    if (p2p) {
        if (!out[w->root]) return TDIST_OK;
        snprintf(why, sizeof why,
                 "peer rank %d has run out of inputs (joined): point-to-point with a joined "
                 "rank cannot be shadowed",
                 w->root);
        return refuse(pg, w, why);
    }
    if (tdist__op_has_root(w->op) && out[w->root]) {
        snprintf(why, sizeof why,
                 "root rank %d has run out of inputs (joined): a %s rooted at a joined rank "
                 "cannot be shadowed; root it at an active rank (the lowest is %d)",
                 w->root, tdist__op_name(w->op), pg->join.leader);
        return refuse(pg, w, why);
    }
    if (w->op == TDIST__OP_ALL_GATHERV || w->op == TDIST__OP_ALL_TO_ALLV ||
        w->op == TDIST__OP_MONITORED_BARRIER) {
        snprintf(why, sizeof why,
                 "ranks have run out of inputs (joined) and a joined rank cannot take part "
                 "in %s (%s); use %s",
                 tdist__op_name(w->op),
                 w->op == TDIST__OP_MONITORED_BARRIER ? "only rank 0 hears the others"
                                                      : "it cannot know the per-rank counts",
                 w->op == TDIST__OP_ALL_GATHERV   ? "all_gather with padded equal counts"
                 : w->op == TDIST__OP_ALL_TO_ALLV ? "all_to_all with padded equal counts"
                                                  : "barrier");
        return refuse(pg, w, why);
    }
    if (w->redop == TDIST_AVG) w->avg_div = pg->join.divisor;
    return TDIST_OK;
}

/* ------------------------------------------------------------ the joined side */

/* The leader's next fingerprint: from its shared-memory line (not
 * consumed), or its first TCP message (consumed: the exchange that
 * follows skips it). */
static tdist_status_t peek_leader(tdist_pg_t *pg, int leader, int64_t deadline_ms,
                                  tdist__fp_t *fp)
{
    if (!pg->tp) return tdist__error(TDIST_ERR_CONNECTION, "the group's mesh is closed");
    memset(fp, 0, sizeof *fp);
    if (pg->shm) {
        tdist__coll_ctx_t c;
        tdist__pg_coll_ctx(pg, false, pg->timeout_ms, deadline_ms, &c);
        const uint8_t *aux = NULL;
        size_t al = 0;
        TDIST_CHECK(tdist__shmc_await_next(&c, leader, &aux, &al));
        memcpy(fp, aux, TDIST_MIN(al, sizeof *fp));
        return TDIST_OK;
    }
    if (pg->chk.have == leader) {
        *fp = pg->chk.theirs[leader];
        return TDIST_OK;
    }
    tdist__tp_req_t r;
    tdist__tp_req_t *rp = &r;
    TDIST_CHECK(tdist__tp_post_recv(pg->tp, &r, leader, &pg->chk.theirs[leader], sizeof *fp));
    TDIST_CHECK(tdist__tp_wait(pg->tp, &rp, 1, deadline_ms));
    pg->chk.have = leader;
    *fp = pg->chk.theirs[leader];
    return TDIST_OK;
}

/* Whether this rank (joined) can take part in the announced collective. */
static bool shadowable(const tdist_pg_t *pg, const tdist__fp_t *in, uint64_t seq)
{
    if (in->magic != TDIST__FP_MAGIC || in->uid_hash != pg->uid_hash || in->seq != seq ||
        (in->flags & TDIST__FP_JOIN_NOTIFY))
        return false;
    if (in->dtype >= (int32_t)TDIST_DTYPE_COUNT || in->redop >= (int32_t)TDIST_REDOP_COUNT ||
        in->root >= pg->size)
        return false;
    switch ((tdist__op_t)in->op) {
    case TDIST__OP_ALL_REDUCE:
    case TDIST__OP_REDUCE_SCATTER:
        return in->dtype >= 0 && in->redop >= 0;
    case TDIST__OP_ALL_GATHER:
    case TDIST__OP_ALL_TO_ALL:
        return in->dtype >= 0;
    case TDIST__OP_BARRIER:
        return true;
    case TDIST__OP_BROADCAST:
    case TDIST__OP_SCATTER:
    case TDIST__OP_GATHER:
        return in->dtype >= 0 && in->root >= 0 && in->root != pg->rank;
    case TDIST__OP_REDUCE:
        return in->dtype >= 0 && in->redop >= 0 && in->root >= 0 && in->root != pg->rank;
    default:
        return false; /* coalesced and v-forms: the counts are not announced */
    }
}

/* Take part in the announced collective with the identity, drop the result. */
static tdist_status_t run_shadow(tdist_pg_t *pg, const struct tdist_work *planned,
                                 const tdist__fp_t *in, int64_t deadline_ms)
{
    struct tdist_work sw;
    memset(&sw, 0, sizeof sw);
    sw.shadow_leader = -1;
    sw.op = (tdist__op_t)in->op;
    sw.seq = in->seq;
    sw.count = in->count;
    sw.dtype = in->dtype >= 0 ? (tdist_dtype_t)in->dtype : TDIST_U8;
    sw.redop = in->redop >= 0 ? (tdist_redop_t)in->redop : TDIST_SUM;
    sw.root = in->root;
    sw.premul = 1.0;
    sw.nranks = pg->size;
    sw.inline_run = planned->inline_run;
    sw.fp_override = in;
    sw.timeout_ms = planned->timeout_ms;
    size_t n = (size_t)pg->size, es = tdist_dtype_size(sw.dtype), cnt = (size_t)in->count;
    size_t send_n = 0, recv_n = 0;
    switch (sw.op) {
    case TDIST__OP_ALL_REDUCE: send_n = recv_n = cnt; break;
    case TDIST__OP_REDUCE: send_n = cnt; break;
    case TDIST__OP_REDUCE_SCATTER: send_n = cnt * n; recv_n = cnt; break;
    case TDIST__OP_ALL_GATHER: send_n = cnt; recv_n = cnt * n; break;
    case TDIST__OP_GATHER: send_n = cnt; break;
    case TDIST__OP_SCATTER: recv_n = cnt; break;
    case TDIST__OP_ALL_TO_ALL: send_n = recv_n = cnt * n; break;
    case TDIST__OP_BROADCAST: recv_n = cnt; break;
    default: break;
    }
    if ((send_n && send_n > SIZE_MAX / es / n) || (recv_n && recv_n > SIZE_MAX / es / n))
        return tdist__error(TDIST_ERR_NO_MEMORY, "shadowing %llu elements: too large",
                            (unsigned long long)in->count);
    void *sb = send_n ? malloc(send_n * es) : NULL;
    void *rb = recv_n ? malloc(recv_n * es) : NULL;
    size_t *sc = NULL, *rc = NULL;
    if (sw.op == TDIST__OP_ALL_GATHER || sw.op == TDIST__OP_ALL_TO_ALL) {
        sc = malloc(n * sizeof *sc);
        rc = malloc(n * sizeof *rc);
    }
    tdist_status_t st = TDIST_OK;
    if ((send_n && !sb) || (recv_n && !rb) ||
        ((sw.op == TDIST__OP_ALL_GATHER || sw.op == TDIST__OP_ALL_TO_ALL) && (!sc || !rc))) {
        st = tdist__error(TDIST_ERR_NO_MEMORY, "shadowing %llu elements: out of memory",
                          (unsigned long long)in->count);
        goto out;
    }
    if (sc)
        for (size_t i = 0; i < n; i++) sc[i] = rc[i] = cnt;
    if (sb) {
        bool reduces = sw.op == TDIST__OP_ALL_REDUCE || sw.op == TDIST__OP_REDUCE ||
                       sw.op == TDIST__OP_REDUCE_SCATTER;
        if (reduces)
            st = tdist_fill_identity(sb, send_n, sw.dtype, sw.redop);
        else
            memset(sb, 0, send_n * es);
        if (st != TDIST_OK) goto out;
    }
    sw.sendbuf = sw.op == TDIST__OP_BROADCAST ? rb : sb;
    sw.recvbuf = rb;
    sw.sendcounts = sc;
    sw.recvcounts = rc;
    int64_t timeout = planned->timeout_ms >= 0 ? planned->timeout_ms : pg->timeout_ms;
    st = tdist__pg_run_body(pg, &sw, timeout, deadline_ms);
    pg->chk.have = -1;
out:
    free(sb);
    free(rb);
    free(sc);
    free(rc);
    return st;
}

/* A collective of the active ranks: the leader's announcement or one of
 * this rank's planned works can go round this many times per planned work
 * at most before the planned work's deadline ends it anyway; the count
 * bounds the loop even without a deadline. */
#define SHADOW_MAX_PER_WORK 1000000

tdist_status_t tdist__pg_shadow_until(tdist_pg_t *pg, struct tdist_work *w, int64_t deadline_ms)
{
    int leader = w->shadow_leader;
    if (leader < 0 || leader >= pg->size || leader == pg->rank) return TDIST_OK;
    tdist__fp_t mine;
    for (long k = 0; k < SHADOW_MAX_PER_WORK; k++) {
        tdist__fp_t in;
        TDIST_CHECK(peek_leader(pg, leader, deadline_ms, &in));
        tdist__fp_common(w, pg->uid_hash, &mine);
        /* this rank's own collective: run it. Something that cannot be
         * shadowed: run it too, and its exchange reports the mismatch on
         * every rank. */
        if (tdist__fp_common_equal(&in, &mine) || !shadowable(pg, &in, w->seq)) return TDIST_OK;
        tdist_status_t st = run_shadow(pg, w, &in, deadline_ms);
        if (st != TDIST_OK) {
            char d[200];
            tdist__fp_describe(&in, true, d, sizeof d);
            return tdist__error_context(st, "rank %d (joined) shadowing rank %d's %s", pg->rank,
                                        leader, d);
        }
        pg->join.seq_shift++;
        tdist__work_shift_seq(w, 1);
    }
    return tdist__error(TDIST_ERR_INTERNAL, "rank %d (joined): shadowed %d collectives before "
                        "its own next one", pg->rank, SHADOW_MAX_PER_WORK);
}
