/*
 * tools/tdist-fr/trace.c — the records as a Chrome trace (JSON; opens in
 * Perfetto or chrome://tracing): one process per world rank, one thread
 * per group for its collectives (spans from start to end, arguments
 * included), one per group for its sends and receives, and marked events
 * (DDP buckets, Join, the program's own) as instants on the group's
 * thread. Times are microseconds from the earliest record, on the wall
 * clock each record carries, so ranks line up.
 */
#include <stdlib.h>
#include <string.h>

#include "frtool.h"

static int64_t origin_of(const model_t *m)
{
    int64_t o = INT64_MAX;
    for (size_t i = 0; i < m->nrecs; i++)
        for (size_t k = 0; k < m->recs[i].n; k++) {
            int64_t t = frt_real_ns(&m->recs[i], m->recs[i].e[k].t_ns[TDIST__FR_QUEUED]);
            if (t < o) o = t;
        }
    return o == INT64_MAX ? 0 : o;
}

static double us(const rec_t *r, uint64_t mono, int64_t origin)
{
    return (double)(frt_real_ns(r, mono) - origin) / 1000.0;
}

static void meta(FILE *f, bool *first, int pid, int tid, const char *what, const char *name)
{
    fprintf(f, "%s\n{\"ph\":\"M\",\"name\":\"%s\",\"pid\":%d,\"tid\":%d,\"args\":{\"name\":\"%s\"}}",
            *first ? "" : ",", what, pid, tid, name);
    *first = false;
}

static void span(FILE *f, bool *first, const rec_t *r, const tdist__fr_entry_t *e, int tid,
                 int64_t origin)
{
    uint64_t t0 = e->t_ns[TDIST__FR_STARTED] ? e->t_ns[TDIST__FR_STARTED] : e->t_ns[TDIST__FR_QUEUED];
    uint64_t t1 = e->t_ns[TDIST__FR_COMPLETED] ? e->t_ns[TDIST__FR_COMPLETED]
                : e->t_ns[TDIST__FR_FAILED] ? e->t_ns[TDIST__FR_FAILED] : r->now_mono;
    if (t1 < t0) t1 = t0;
    char d[160];
    frt_describe(e, d, sizeof d);
    fprintf(f, "%s\n{\"ph\":\"X\",\"name\":\"%s\",\"cat\":\"%s\",\"pid\":%d,\"tid\":%d,"
               "\"ts\":%.3f,\"dur\":%.3f,\"args\":{\"call\":\"%s\",\"seq\":%llu,\"state\":\"%s\","
               "\"route\":\"%s\",\"algorithm\":\"%s\",\"queued_us\":%.3f}}",
            *first ? "" : ",", TDIST__FR_NAME(tdist__fr_op_names, e->op),
            e->kind == TDIST__FR_COLL ? "collective" : "p2p", r->hdr.world_rank, tid,
            us(r, t0, origin), (double)(t1 - t0) / 1000.0, d, (unsigned long long)e->seq,
            TDIST__FR_NAME(tdist__fr_state_names, (int)e->state),
            e->route == 255 ? "none" : TDIST__FR_NAME(tdist__fr_route_names, e->route),
            e->route == 255 ? "none" : TDIST__FR_NAME(tdist__fr_algo_names, e->algo),
            us(r, e->t_ns[TDIST__FR_QUEUED], origin));
    *first = false;
}

static void instant(FILE *f, bool *first, const rec_t *r, const tdist__fr_entry_t *e, int tid,
                    int64_t origin)
{
    char what[sizeof e->what + 1];
    memcpy(what, e->what, sizeof e->what);
    what[sizeof e->what] = '\0';
    for (char *p = what; *p; p++)
        if (*p == '"' || *p == '\\' || (unsigned char)*p < 0x20) *p = '_';
    fprintf(f, "%s\n{\"ph\":\"i\",\"s\":\"t\",\"name\":\"%s\",\"cat\":\"event\",\"pid\":%d,"
               "\"tid\":%d,\"ts\":%.3f,\"args\":{\"arg\":%llu,\"after_seq\":%llu}}",
            *first ? "" : ",", what, r->hdr.world_rank, tid,
            us(r, e->t_ns[TDIST__FR_QUEUED], origin), (unsigned long long)e->count,
            (unsigned long long)e->seq);
    *first = false;
}

int frt_write_trace(const char *path, const model_t *m)
{
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    int64_t origin = origin_of(m);
    bool first = true;
    fputs("{\"displayTimeUnit\":\"ns\",\"traceEvents\":[", f);
    for (size_t i = 0; i < m->nrecs; i++) {
        const rec_t *r = &m->recs[i];
        int gi = 0;
        for (size_t g = 0; g < m->ngrps; g++)
            if (strcmp(m->grps[g].uid, r->hdr.uid) == 0) gi = (int)g;
        char name[96], pname[32];
        snprintf(pname, sizeof pname, "rank %d", r->hdr.world_rank);
        meta(f, &first, r->hdr.world_rank, 2 * gi, "process_name", pname);
        snprintf(name, sizeof name, "group %.60s", r->hdr.group);
        meta(f, &first, r->hdr.world_rank, 2 * gi, "thread_name", name);
        snprintf(name, sizeof name, "group %.60s p2p", r->hdr.group);
        meta(f, &first, r->hdr.world_rank, 2 * gi + 1, "thread_name", name);
        for (size_t k = 0; k < r->n; k++) {
            const tdist__fr_entry_t *e = &r->e[k];
            if (e->kind == TDIST__FR_EVENT)
                instant(f, &first, r, e, 2 * gi, origin);
            else
                span(f, &first, r, e, 2 * gi + (e->kind != TDIST__FR_COLL), origin);
        }
    }
    fputs("\n]}\n", f);
    bool bad = ferror(f) != 0;
    return fclose(f) != 0 || bad ? -1 : 0;
}
