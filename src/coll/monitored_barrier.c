/*
 * coll/monitored_barrier.c — a barrier that says who is missing: every
 * rank but 0 sends rank 0 its fingerprint and waits for a verdict; rank 0
 * collects them until the deadline, then tells every rank that arrived
 * either the ranks that did not (by number) or the first fingerprint that
 * differs (worded by pg/), or success. The waits of ranks other than 0
 * last 2 s past the deadline, so rank 0's report reaches them.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll/coll_internal.h"

/* Ranks other than 0: arrive at rank 0 (the fingerprint), then wait for
 * its verdict (a little longer than the deadline, so rank 0's report of
 * the missing ranks arrives). */
static tdist_status_t mb_arrive(const tdist__coll_ctx_t *c, const tdist__coll_check_t *chk)
{
    tdist__mb_reply_t rep;
    memset(&rep, 0, sizeof rep);
    tdist__tp_req_t s, r;
    tdist__tp_req_t *rs[2] = {&s, &r};
    TDIST_CHECK(tdist__tp_post_send(c->tp, &s, 0, chk->common, chk->len));
    TDIST_CHECK(tdist__tp_post_recv(c->tp, &r, 0, &rep, sizeof rep));
    int64_t dl = c->deadline_ms == INT64_MAX ? INT64_MAX : c->deadline_ms + 2000;
    tdist_status_t st = tdist__tp_wait(c->tp, rs, 2, dl);
    if (st == TDIST_ERR_TIMEOUT)
        return tdist__error(TDIST_ERR_TIMEOUT,
                            "monitored_barrier: rank 0 (the monitor) did not answer within "
                            "%lld ms",
                            (long long)c->timeout_ms);
    TDIST_CHECK(st);
    rep.msg[sizeof rep.msg - 1] = '\0';
    if (rep.status != TDIST_OK) return tdist__error((tdist_status_t)rep.status, "%s", rep.msg);
    return TDIST_OK;
}

/* Rank 0's verdict into *rep: the ranks that did not arrive (st, the
 * collection's status, not OK), else the first fingerprint that differs
 * from rank 0's. */
void tdist__coll_mb_verdict(const tdist__coll_ctx_t *c, const tdist__coll_check_t *chk,
                            tdist_status_t st, const bool *present, tdist__mb_reply_t *rep)
{
    int n = c->size;
    int64_t timeout_ms = c->timeout_ms;
    if (st != TDIST_OK) {
        char list[200] = "";
        int missing = 0;
        for (int p = 1; p < n; p++) {
            if (present[p]) continue;
            size_t l = strlen(list);
            snprintf(list + l, sizeof list - l, "%s%d", missing ? ", " : "", p);
            missing++;
        }
        char cause[400];
        snprintf(cause, sizeof cause, "%.300s", tdist_last_error());
        if (st == TDIST_ERR_TIMEOUT)
            snprintf(rep->msg, sizeof rep->msg,
                     "monitored_barrier: rank%s %s did not arrive within %lld ms",
                     missing == 1 ? "" : "s", list, (long long)timeout_ms);
        else
            snprintf(rep->msg, sizeof rep->msg, "monitored_barrier: rank%s %s did not arrive (%.150s)",
                     missing == 1 ? "" : "s", list, cause);
        rep->status = st;
        return;
    }
    /* every rank arrived: pg words the first fingerprint that differs */
    tdist_status_t cst = chk->compare(chk->arg);
    if (cst != TDIST_OK) {
        snprintf(rep->msg, sizeof rep->msg, "%s", tdist_last_error());
        rep->status = cst;
    }
}

/* Rank 0 sends its verdict to every present rank (bounded by 1 s): the
 * send's status. */
static tdist_status_t mb_tell(const tdist__coll_ctx_t *c, const bool *present,
                              const tdist__mb_reply_t *rep)
{
    size_t nn = (size_t)(unsigned)c->size;
    tdist__tp_req_t *sreqs = calloc(nn, sizeof *sreqs);
    tdist__tp_req_t **sp = calloc(nn, sizeof *sp);
    tdist_status_t st = TDIST_OK;
    if (sreqs && sp) {
        size_t k = 0;
        for (int p = 1; p < c->size; p++) {
            if (!present[p]) continue;
            if (tdist__tp_post_send(c->tp, &sreqs[k], p, rep, sizeof *rep) != TDIST_OK) break;
            sp[k] = &sreqs[k];
            k++;
        }
        st = tdist__tp_wait(c->tp, sp, k, tdist__deadline_ms(1000));
    }
    free(sreqs);
    free(sp);
    return st;
}

tdist_status_t tdist__coll_monitored_barrier(const tdist__coll_ctx_t *c,
                                             const tdist__coll_check_t *chk)
{
    int n = c->size;
    if (n == 1) return TDIST_OK;
    if (c->rank != 0) return mb_arrive(c, chk);
    tdist__coll_group_t *g = c->g;
    for (int p = 1; p < n; p++) {
        TDIST_CHECK(tdist__tp_post_recv(c->tp, &g->reqs[p - 1], p, chk->theirs + (size_t)p * chk->len,
                                        chk->len));
        g->reqp[p - 1] = &g->reqs[p - 1];
    }
    tdist_status_t st = tdist__tp_wait(c->tp, g->reqp, (size_t)(n - 1), c->deadline_ms);
    bool *present = calloc((size_t)(unsigned)n, sizeof *present);
    if (!present) return tdist__error(TDIST_ERR_NO_MEMORY, "monitored_barrier: out of memory");
    present[0] = true;
    for (int p = 1; p < n; p++) present[p] = tdist__tp_req_done(&g->reqs[p - 1]) &&
                                             tdist__tp_req_status(&g->reqs[p - 1]) == TDIST_OK;
    tdist__mb_reply_t rep;
    memset(&rep, 0, sizeof rep);
    tdist__coll_mb_verdict(c, chk, st, present, &rep);
    /* tell every present rank (if the mesh still works) */
    if (st == TDIST_OK || st == TDIST_ERR_TIMEOUT) {
        tdist_status_t st2 = mb_tell(c, present, &rep);
        if (st == TDIST_OK && st2 != TDIST_OK) st = st2;
        if (st != TDIST_OK && rep.status == TDIST_OK) {
            free(present);
            return st;
        }
    }
    free(present);
    if (rep.status != TDIST_OK) return tdist__error((tdist_status_t)rep.status, "%s", rep.msg);
    return TDIST_OK;
}
