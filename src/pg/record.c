/*
 * pg/record.c — rule 5: every collective and point-to-point operation of
 * a group leaves an entry in the group's flight recorder (fr/fr.h).
 *
 * Queued when the work gets its sequence number (tdist__pg_submit, the
 * p2p submit); started, with the fingerprint's fields and coll/'s route
 * and algorithm, when it runs (tdist__pg_run_body); completed or failed
 * when it ends. The first failure of the process dumps every ring as JSON
 * (fr/dump.c): every rank that fails dumps, and by rule 3 every rank
 * still in the library fails within its deadline once one has.
 */
#include <stdio.h>

#include "pg/internal.h"

/* The recorder stores coll/'s numbers and names them itself (fr/format.h,
 * which its readers share without coll/): the tables must keep in step. */
_Static_assert(sizeof tdist__fr_algo_names / sizeof tdist__fr_algo_names[0] == TDIST__ALGO_COUNT,
               "fr/format.h names every coll/ algorithm, in coll/'s order");
_Static_assert(sizeof tdist__fr_route_names / sizeof tdist__fr_route_names[0] ==
                   TDIST__ROUTE_SHM_LINE + 1,
               "fr/format.h names every coll/ route, in coll/'s order");

/* The transport's (tdist__tp_on_wait) or another backend's (backend.h
 * on_wait) hook: the running collective's entry names the peer its wait
 * is on (slow path only; fr/wait.c). */
static void note_wait(void *arg, int peer)
{
    tdist_pg_t *pg = arg;
    tdist__fr_note_wait(pg->fr, pg->fr_running, peer);
}

void tdist__pg_fr_open(tdist_pg_t *pg)
{
    tdist__fr_ident_t id = {.group = pg->name, .uid = pg->uid, .rank = pg->rank,
                            .size = pg->size, .world_rank = pg->wranks[pg->rank],
                            .backend = pg->backend ? pg->backend->name : "native",
                            .transport = pg->backend ? 2 : pg->kind == TDIST__TP_SHM ? 0 : 1};
    pg->fr = tdist__fr_open(&id);
    if (pg->fr && pg->tp) tdist__tp_on_wait(pg->tp, note_wait, pg);
    if (pg->fr && pg->backend && pg->backend->on_wait)
        pg->backend->on_wait(pg->be, note_wait, pg);
}

/* TDIST_LOG=trace: one line for w, which ended with st. */
void tdist__pg_fr_trace_line(tdist_pg_t *pg, const struct tdist_work *w, tdist_status_t st)
{
    char d[200], took[64] = "";
    tdist__work_describe(w, d, sizeof d);
    const tdist__fr_slot_t *slot = tdist__fr_at(pg->fr, w->fr_id);
    const char *route = "-", *algo = "-";
    if (slot) {
        tdist__fr_entry_t e;
        tdist__fr_decode(slot, w->fr_id, &e);
        uint64_t tsc = tdist__fr_rdtsc(), now = tdist__now_ns();
        uint64_t t0 = tdist__fr_to_ns(pg->fr->hdr, e.t_ns[TDIST__FR_QUEUED], tsc, now);
        uint64_t t1 = tdist__fr_to_ns(pg->fr->hdr, e.t_ns[e.state], tsc, now);
        snprintf(took, sizeof took, " %.1f us", t1 > t0 ? (double)(t1 - t0) / 1e3 : 0.0);
        if (e.route != 255) {
            route = TDIST__FR_NAME(tdist__fr_route_names, e.route);
            algo = TDIST__FR_NAME(tdist__fr_algo_names, e.algo);
        }
    }
    tdist__log(TDIST_LOG_TRACE, __FILE__, __LINE__, "rank %d group %s seq %llu %s %s/%s%s %s",
               pg->rank, pg->name, (unsigned long long)w->seq, d, route, algo, took,
               st == TDIST_OK ? "ok" : tdist_status_str(st));
}

tdist_status_t tdist_pg_mark(tdist_pg_t *pg, const char *what, uint64_t arg)
{
    if (!pg || !what) return tdist__error(TDIST_ERR_INVALID_ARG, "tdist_pg_mark: %s is NULL",
                                          pg ? "what" : "pg");
    tdist__fr_event(pg->fr, what, tdist__pg_last_seq(pg), arg);
    return TDIST_OK;
}

tdist_status_t tdist_flight_dump(const char *reason, int *n_files)
{
    int n = tdist__fr_dump_all(reason ? reason : "tdist_flight_dump", true);
    if (n < 0) return TDIST_ERR_SYSTEM; /* the message names the file */
    if (n_files) *n_files = n;
    return TDIST_OK;
}
