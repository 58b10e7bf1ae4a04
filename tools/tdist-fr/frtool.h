/*
 * tools/tdist-fr/frtool.h — the analyzer's model: every rank's record of
 * every group, read from the rings (fr/format.h) and the JSON dumps in a
 * directory, and what the analysis found.
 */
#ifndef TDIST_FRTOOL_H
#define TDIST_FRTOOL_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "fr/format.h"
#include "fr/trace.h"

/* What became of a rank's process. */
enum { PROC_UNKNOWN, PROC_RUNNING, PROC_STOPPED, PROC_GONE, PROC_CLOSED };

typedef struct rec {
    tdist__fr_header_t hdr;
    tdist__fr_entry_t *e; /* oldest first */
    size_t n;
    int proc;             /* PROC_* */
    bool from_dump;       /* a JSON dump (no ring for it) */
    char reason[256];     /* the dump's reason */
    uint64_t now_mono;    /* when it was read (or dumped), on its clock */
} rec_t;

typedef struct grp {
    char uid[64], name[64];
    int size;
    rec_t **rank;         /* size entries, NULL: no record of that rank */
} grp_t;

typedef struct model {
    rec_t *recs;
    size_t nrecs;
    grp_t *grps;
    size_t ngrps;
} model_t;

/* A problem in one group. */
enum { PROB_MISSING = 1, PROB_MISMATCH, PROB_STUCK };

typedef struct prob {
    int kind;
    const grp_t *g;
    uint64_t seq;
    int64_t t_real;       /* when the first rank started it (ns since the epoch) */
    const tdist__fr_entry_t **at; /* size entries: each rank's entry for seq, or NULL */
} prob_t;

/* load.c */
int frt_load_dir(const char *dir, model_t *m);
void frt_free(model_t *m);
int64_t frt_real_ns(const rec_t *r, uint64_t mono);

/* analyze.c */
size_t frt_analyze(const model_t *m, const char *only_group, prob_t **out);
const tdist__fr_entry_t *frt_find_seq(const rec_t *r, uint64_t seq);
/* Whether a and b are different calls (op, dtype, count, root, reduce op, splits). */
bool frt_differ(const tdist__fr_entry_t *a, const tdist__fr_entry_t *b);
const tdist__fr_entry_t *frt_last_coll(const rec_t *r, bool completed);

/* report.c */
void frt_print_text(FILE *f, const model_t *m, const prob_t *p, size_t np, const bool *show_rank);
void frt_print_json(FILE *f, const model_t *m, const prob_t *p, size_t np, const bool *show_rank);

/* trace.c: every record as a Chrome trace at path (fr/trace.h); 0 or -1. */
int frt_write_trace(const char *path, const model_t *m);

#endif /* TDIST_FRTOOL_H */
