/*
 * tools/tdist-fr/report.c — what the analysis found, for people (first
 * the first divergence, then each other group's problem, then a summary
 * per rank) and for machines (--json).
 */
#include <stdlib.h>
#include <string.h>

#include "frtool.h"

static const char *const proc_names[] = {
    "on another host", "running", "stopped (SIGSTOP or a debugger)",
    "gone (killed, or exited without destroying its groups)", "exited cleanly"};
static const char *const proc_short[] = {"unknown", "running", "stopped", "gone", "exited"};

/* "; waiting on rank N" when a wait of e noted its peer (a pending
 * entry), "; it waited on rank N" (an ended one), else "". */
static const char *wait_note(const tdist__fr_entry_t *e, char *buf, size_t n)
{
    buf[0] = '\0';
    if (tdist__fr_waited(e))
        snprintf(buf, n, "; %s on rank %d",
                 e->state == TDIST__FR_STARTED ? "waiting" : "it waited", e->wait.peer);
    return buf;
}

/* How long e has been (or was) in its current wait, in seconds. */
static double waited_s(const rec_t *r, const tdist__fr_entry_t *e)
{
    uint64_t t0 = e->t_ns[TDIST__FR_STARTED] ? e->t_ns[TDIST__FR_STARTED] : e->t_ns[TDIST__FR_QUEUED];
    uint64_t t1 = e->t_ns[TDIST__FR_FAILED] ? e->t_ns[TDIST__FR_FAILED]
                : e->t_ns[TDIST__FR_COMPLETED] ? e->t_ns[TDIST__FR_COMPLETED] : r->now_mono;
    return t1 > t0 ? (double)(t1 - t0) / 1e9 : 0.0;
}

static void rank_list(const prob_t *p, bool with, char *buf, size_t n)
{
    size_t k = 0;
    buf[0] = '\0';
    for (int r = 0; r < p->g->size && k + 12 < n; r++)
        if ((p->at[r] != NULL) == with) k += (size_t)snprintf(buf + k, n - k, "%s%d", k ? ", " : "", r);
}

static const char *state_word(const tdist__fr_entry_t *e)
{
    return e->state == TDIST__FR_FAILED ? "failed" : e->state == TDIST__FR_COMPLETED ? "completed"
         : e->state == TDIST__FR_STARTED ? "still waiting" : "queued";
}

/* What rank r of g was doing instead: its last completed and pending
 * collectives, its last event, its process. */
static void doing_instead(FILE *f, const grp_t *g, int r, const prob_t *p)
{
    const rec_t *rec = g->rank[r];
    if (!rec) {
        fprintf(f, "  rank %d: no record (it never created the group here, or its files are "
                   "missing)\n", r);
        return;
    }
    char d[160];
    fprintf(f, "  rank %d (world rank %d, pid %d, %s): ", r, rec->hdr.world_rank, rec->hdr.pid,
            proc_names[rec->proc]);
    const tdist__fr_entry_t *lc = frt_last_coll(rec, true), *last = frt_last_coll(rec, false);
    if (lc) {
        tdist__fr_describe(lc, d, sizeof d);
        double ago = (double)(p->t_real - frt_real_ns(rec, lc->t_ns[TDIST__FR_COMPLETED])) / 1e9;
        if (ago < 0) ago = 0; /* clocks of different hosts */
        fprintf(f, "last completed %s seq %llu (%.3f s before the others started seq %llu)", d,
                (unsigned long long)lc->seq, ago, (unsigned long long)p->seq);
    } else {
        fprintf(f, "completed no collective");
    }
    if (last && last != lc && last->state != TDIST__FR_COMPLETED) {
        tdist__fr_describe(last, d, sizeof d);
        fprintf(f, "; then %s seq %llu (%s)", d, (unsigned long long)last->seq, state_word(last));
    } else {
        fprintf(f, "; nothing pending in this group");
    }
    for (size_t i = rec->n; i-- > 0;)
        if (rec->e[i].kind == TDIST__FR_EVENT) {
            tdist__fr_describe(&rec->e[i], d, sizeof d);
            fprintf(f, "; last event %s", d);
            break;
        }
    fputs(rec->proc == PROC_RUNNING || rec->proc == PROC_STOPPED
              ? " — outside the library (user code, or another group)\n" : "\n", f);
}

static const char *mismatch_field(const tdist__fr_entry_t *a, const tdist__fr_entry_t *b)
{
    return a->op != b->op ? "op" : a->dtype != b->dtype ? "dtype" : a->count != b->count ? "count"
         : a->root != b->root ? "root" : a->redop != b->redop ? "reduce op" : "split sizes";
}

/* The call most ranks issued as p's seq. */
static const tdist__fr_entry_t *majority(const prob_t *p)
{
    const tdist__fr_entry_t *best = NULL;
    int best_n = 0;
    for (int r = 0; r < p->g->size; r++) {
        if (!p->at[r]) continue;
        int n = 0;
        for (int q = 0; q < p->g->size; q++)
            if (p->at[q] && !frt_differ(p->at[r], p->at[q])) n++;
        if (n > best_n) {
            best_n = n;
            best = p->at[r];
        }
    }
    return best;
}

static void print_problem(FILE *f, const prob_t *p)
{
    const grp_t *g = p->g;
    char with[256], without[256], d[160];
    rank_list(p, true, with, sizeof with);
    rank_list(p, false, without, sizeof without);
    const tdist__fr_entry_t *ref = majority(p);
    double wait = 0;
    for (int r = 0; r < g->size; r++)
        if (p->at[r]) {
            double w = waited_s(g->rank[r], p->at[r]);
            if (w > wait) wait = w;
        }
    tdist__fr_describe(ref, d, sizeof d);
    if (p->kind == PROB_MISSING) {
        fprintf(f, "rank%s %s %s missing from %s seq %llu of group %s; rank%s %s waited %.3f s "
                   "(%s)\n", strchr(without, ',') ? "s" : "", without,
                strchr(without, ',') ? "are" : "is", d, (unsigned long long)p->seq, g->name,
                strchr(with, ',') ? "s" : "", with, wait, state_word(ref));
    } else if (p->kind == PROB_MISMATCH) {
        fprintf(f, "ranks issued different collectives as seq %llu of group %s:\n",
                (unsigned long long)p->seq, g->name);
        for (int r = 0; r < g->size; r++) {
            if (!p->at[r]) continue;
            tdist__fr_describe(p->at[r], d, sizeof d);
            bool odd = frt_differ(ref, p->at[r]);
            fprintf(f, "  rank %d: %s%s%s\n", r, d, odd ? "  <- differs in " : "",
                    odd ? mismatch_field(ref, p->at[r]) : "");
        }
    } else {
        int nd = 0;
        for (int r = 0; r < g->size; r++) nd += p->at[r]->state != TDIST__FR_COMPLETED;
        fprintf(f, "every rank issued %s seq %llu of group %s; %d of %d did not complete it "
                   "(longest wait %.3f s)\n", d, (unsigned long long)p->seq, g->name, nd, g->size,
                wait);
    }
    fprintf(f, "what each rank was doing:\n");
    for (int r = 0; r < g->size; r++) {
        if (p->at[r] && p->kind != PROB_MISSING) {
            const rec_t *rec = g->rank[r];
            tdist__fr_describe(p->at[r], d, sizeof d);
            char wn[64];
            fprintf(f, "  rank %d (pid %d, %s): %s seq %llu %s after %.3f s%s\n", r, rec->hdr.pid,
                    proc_short[rec->proc], d, (unsigned long long)p->seq, state_word(p->at[r]),
                    waited_s(rec, p->at[r]), wait_note(p->at[r], wn, sizeof wn));
        } else if (!p->at[r]) {
            doing_instead(f, g, r, p);
        } else {
            const tdist__fr_entry_t *e = p->at[r];
            char wn[64];
            fprintf(f, "  rank %d: in it (%s, %.3f s; route %s, algorithm %s%s)\n", r,
                    state_word(e), waited_s(g->rank[r], e),
                    e->route == 255 ? "not chosen" : TDIST__FR_NAME(tdist__fr_route_names, e->route),
                    e->route == 255 ? "-" : TDIST__FR_NAME(tdist__fr_algo_names, e->algo),
                    wait_note(e, wn, sizeof wn));
        }
    }
}

/* One line per rank and group: its process, its last completed and its
 * pending collectives. */
static void print_summary(FILE *f, const model_t *m, const bool *show_rank)
{
    fprintf(f, "\nper rank:\n");
    int maxw = -1;
    for (size_t i = 0; i < m->nrecs; i++)
        if (m->recs[i].hdr.world_rank > maxw) maxw = m->recs[i].hdr.world_rank;
    for (int w = 0; w <= maxw; w++) {
        if (show_rank && !show_rank[w]) continue;
        for (size_t i = 0; i < m->nrecs; i++) {
            const rec_t *r = &m->recs[i];
            if (r->hdr.world_rank != w) continue;
            char d[160];
            fprintf(f, "  rank %d group %s (rank %d of %d, pid %d, %s%s): %zu entries", w,
                    r->hdr.group, r->hdr.rank, r->hdr.size, r->hdr.pid, proc_short[r->proc],
                    r->from_dump ? ", from its dump" : "", r->n);
            const tdist__fr_entry_t *lc = frt_last_coll(r, true), *last = frt_last_coll(r, false);
            if (lc) {
                tdist__fr_describe(lc, d, sizeof d);
                fprintf(f, "; last completed %s seq %llu", d, (unsigned long long)lc->seq);
            }
            if (last && last != lc && last->state != TDIST__FR_COMPLETED) {
                tdist__fr_describe(last, d, sizeof d);
                char wn[64];
                fprintf(f, "; last %s seq %llu %s after %.3f s%s", d, (unsigned long long)last->seq,
                        state_word(last), waited_s(r, last), wait_note(last, wn, sizeof wn));
            }
            if (r->reason[0]) fprintf(f, "; dumped: %.120s", r->reason);
            fputc('\n', f);
        }
    }
}

void frt_print_text(FILE *f, const model_t *m, const prob_t *p, size_t np, const bool *show_rank)
{
    if (np == 0) {
        fprintf(f, "no divergence: every rank of every group issued and completed the same "
                   "collectives (%zu records in %zu groups)\n", m->nrecs, m->ngrps);
    } else {
        fprintf(f, "first divergence: ");
        print_problem(f, &p[0]);
        for (size_t i = 1; i < np; i++) {
            fprintf(f, "\nalso: ");
            print_problem(f, &p[i]);
        }
    }
    print_summary(f, m, show_rank);
}

static void json_entry(FILE *f, const rec_t *r, const tdist__fr_entry_t *e)
{
    char d[160];
    tdist__fr_describe(e, d, sizeof d);
    fprintf(f, "{\"rank\":%d,\"world_rank\":%d,\"pid\":%d,\"process\":\"%s\",\"call\":\"%s\","
               "\"state\":\"%s\",\"waited_s\":%.6f,\"waiting_on\":%d}", r->hdr.rank,
            r->hdr.world_rank, r->hdr.pid, proc_short[r->proc], d,
            TDIST__FR_NAME(tdist__fr_state_names, (int)e->state), waited_s(r, e),
            tdist__fr_waited(e) ? e->wait.peer : -1);
}

void frt_print_json(FILE *f, const model_t *m, const prob_t *p, size_t np, const bool *show_rank)
{
    static const char *const kinds[] = {"", "missing", "mismatch", "stuck"};
    fprintf(f, "{\"problems\":[");
    for (size_t i = 0; i < np; i++) {
        const grp_t *g = p[i].g;
        fprintf(f, "%s\n {\"kind\":\"%s\",\"group\":\"%s\",\"uid\":\"%s\",\"seq\":%llu,"
                   "\"missing_ranks\":[", i ? "," : "", kinds[p[i].kind], g->name, g->uid,
                (unsigned long long)p[i].seq);
        bool first = true;
        for (int r = 0; r < g->size; r++)
            if (!p[i].at[r]) {
                fprintf(f, "%s%d", first ? "" : ",", r);
                first = false;
            }
        fprintf(f, "],\"entries\":[");
        first = true;
        for (int r = 0; r < g->size; r++)
            if (p[i].at[r]) {
                if (!first) fputc(',', f);
                json_entry(f, g->rank[r], p[i].at[r]);
                first = false;
            }
        fprintf(f, "]}");
    }
    fprintf(f, "],\n\"ranks\":[");
    bool first = true;
    for (size_t i = 0; i < m->nrecs; i++) {
        const rec_t *r = &m->recs[i];
        if (show_rank && !show_rank[r->hdr.world_rank]) continue;
        const tdist__fr_entry_t *lc = frt_last_coll(r, true);
        fprintf(f, "%s\n {\"world_rank\":%d,\"group\":\"%s\",\"rank\":%d,\"size\":%d,\"pid\":%d,"
                   "\"process\":\"%s\",\"entries\":%zu,\"last_completed_seq\":%llu}",
                first ? "" : ",", r->hdr.world_rank, r->hdr.uid, r->hdr.rank, r->hdr.size,
                r->hdr.pid, proc_short[r->proc], r->n, lc ? (unsigned long long)lc->seq : 0ull);
        first = false;
    }
    fprintf(f, "]}\n");
}
