/*
 * tools/tdist-fr/main.c — tdist-fr DIR: explain a hang or a failure from
 * the flight records in DIR (the rings every rank keeps there, and the
 * JSON dumps). See docs/debugging.md.
 *
 * Exit status: 0 no problem found, 1 a problem found, 2 usage or I/O.
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "frtool.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: tdist-fr [--json] [--group NAME] [--ranks R,R,...] [--trace FILE] DIR\n"
               "  reads every rank's flight record in DIR (rings and JSON dumps), matches\n"
               "  collectives across ranks by (group, seq) and prints the first divergence:\n"
               "  who never reached the collective the others wait in, or who issued\n"
               "  another one; then a summary per rank.\n"
               "  --json         the same for machines\n"
               "  --group NAME   only this group (name or uid)\n"
               "  --ranks LIST   only these world ranks in the per-rank summary\n"
               "  --trace FILE   also write every record as a Chrome trace (Perfetto)\n"
               "exit status: 0 nothing wrong found, 1 a problem found, 2 usage or I/O error\n");
}

/* "0,2,5" -> show[w] for w < n; false on a bad list. */
static bool parse_ranks(const char *s, bool *show, int n)
{
    while (*s) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 0) return false;
        if (v < n) show[v] = true;
        s = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') return false;
    }
    return true;
}

int main(int argc, char **argv)
{
    bool json = false;
    const char *group = NULL, *ranks = NULL, *dir = NULL, *trace = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0) {
            json = true;
        } else if (strcmp(argv[i], "--group") == 0 && i + 1 < argc) {
            group = argv[++i];
        } else if (strcmp(argv[i], "--trace") == 0 && i + 1 < argc) {
            trace = argv[++i];
        } else if (strcmp(argv[i], "--ranks") == 0 && i + 1 < argc) {
            ranks = argv[++i];
        } else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            usage(stdout);
            return 0;
        } else if (argv[i][0] == '-' || dir) {
            usage(stderr);
            return 2;
        } else {
            dir = argv[i];
        }
    }
    if (!dir) {
        usage(stderr);
        return 2;
    }
    model_t m;
    if (frt_load_dir(dir, &m) != 0) {
        fprintf(stderr, "tdist-fr: cannot read %s\n", dir);
        return 2;
    }
    if (m.nrecs == 0) {
        fprintf(stderr, "tdist-fr: no flight records (tdist-fr.*.ring / .json) in %s\n", dir);
        frt_free(&m);
        return 2;
    }
    int nw = 0;
    for (size_t i = 0; i < m.nrecs; i++)
        if (m.recs[i].hdr.world_rank + 1 > nw) nw = m.recs[i].hdr.world_rank + 1;
    bool *show = NULL;
    if (ranks) {
        show = calloc((size_t)nw + 1, sizeof *show);
        if (!show || !parse_ranks(ranks, show, nw)) {
            fprintf(stderr, "tdist-fr: bad --ranks list '%s'\n", ranks);
            free(show);
            frt_free(&m);
            return 2;
        }
    }
    if (trace && frt_write_trace(trace, &m) != 0) {
        fprintf(stderr, "tdist-fr: cannot write %s\n", trace);
        free(show);
        frt_free(&m);
        return 2;
    }
    prob_t *p = NULL;
    size_t np = frt_analyze(&m, group, &p);
    if (json)
        frt_print_json(stdout, &m, p, np, show);
    else
        frt_print_text(stdout, &m, p, np, show);
    for (size_t i = 0; i < np; i++) free(p[i].at);
    free(p);
    free(show);
    frt_free(&m);
    return np ? 1 : 0;
}
