/*
 * tools/tdist-fr/trace.c — every record in the directory as one Chrome
 * trace, through the library's writer (src/fr/trace.c, compiled in): one
 * process per world rank, three threads per group (fr/trace.h). Times are
 * microseconds from the earliest record, on the wall clock each record
 * carries, so ranks line up.
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

int frt_write_trace(const char *path, const model_t *m)
{
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    tdist__fr_trace_t t;
    tdist__fr_trace_begin(&t, f, origin_of(m));
    for (size_t i = 0; i < m->nrecs; i++) {
        const rec_t *r = &m->recs[i];
        int gi = 0;
        for (size_t g = 0; g < m->ngrps; g++)
            if (strcmp(m->grps[g].uid, r->hdr.uid) == 0) gi = (int)g;
        tdist__fr_trace_group(&t, &r->hdr, r->e, r->n, r->now_mono, 3 * gi);
    }
    return tdist__fr_trace_end(&t);
}
