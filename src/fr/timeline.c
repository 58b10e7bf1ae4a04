/*
 * fr/timeline.c — TDIST_TRACE=path: the process writes its own Chrome
 * trace (fr/trace.h) of every group it had, from the recorder's rings.
 *
 * File: one per process, named after its world rank: "<path without a
 * trailing .json>.r<world rank>.json" (TDIST_TRACE=/tmp/t.json on rank 3:
 * /tmp/t.r3.json), written whole (a temporary name, then rename).
 *
 * When: as the last open group is destroyed, at every dump (a failure,
 * SIGUSR1, tdist_flight_dump: a live timeline of a running job), and at
 * exit while groups are still open. A group destroyed earlier leaves a
 * copy of its ring here, so the file holds every group of the process.
 *
 * Why from the rings and not streamed: the ring already holds every
 * field and time, so the trace costs the collectives nothing — not even
 * a branch — and the writing happens off their path. The price: a trace
 * holds each group's last TDIST_FR_SIZE entries (raise it for a longer
 * run).
 *
 * ts: microseconds from 00:00 UTC of the day the process opened its
 * first group (the same origin on every rank of a job started that day,
 * so the ranks' files merge by concatenating their traceEvents; the
 * origin is in otherData.origin_unix_ns).
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fr/internal.h"
#include "fr/trace.h"

#define DAY_NS (86400ull * 1000000000ull)
#define KEEP_MAX_ENTRIES (1u << 18) /* destroyed groups' entries kept, at most (32 MiB) */

typedef struct kept {
    tdist__fr_header_t hdr;
    tdist__fr_entry_t *e;
    size_t n;
    uint64_t now_mono;
    struct kept *next;
} kept_t;

static pthread_once_t once = PTHREAD_ONCE_INIT;
static char *cfg_path; /* NULL: TDIST_TRACE unset */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static kept_t *kept_head, **kept_tail = &kept_head; /* in the order destroyed */
static size_t kept_entries;
static int64_t origin_ns = -1;
static int world_rank = -1;

static void at_exit(void) { (void)tdist__fr_timeline_write(); }

static void read_config(void)
{
    const char *p = getenv("TDIST_TRACE");
    if (!p || !p[0]) return;
    size_t l = strlen(p);
    if (l > 5 && strcmp(p + l - 5, ".json") == 0) l -= 5;
    cfg_path = malloc(l + 1);
    if (!cfg_path) return;
    memcpy(cfg_path, p, l);
    cfg_path[l] = '\0';
    (void)atexit(at_exit);
}

void tdist__fr_timeline_opened(tdist__fr_t *fr)
{
    pthread_once(&once, read_config);
    if (!cfg_path) return;
    pthread_mutex_lock(&mu);
    if (origin_ns < 0) origin_ns = (int64_t)(fr->hdr->real0_ns / DAY_NS * DAY_NS);
    world_rank = fr->hdr->world_rank;
    pthread_mutex_unlock(&mu);
}

/* A copy of fr's ring; NULL when out of memory. */
static kept_t *copy_ring(tdist__fr_t *fr)
{
    kept_t *k = calloc(1, sizeof *k);
    tdist__fr_entry_t *e = malloc(2 * (size_t)fr->cap * sizeof *e);
    if (!k || !e) {
        free(k);
        free(e);
        return NULL;
    }
    k->hdr = *fr->hdr;
    k->n = tdist__fr_snapshot(fr, e);
    k->now_mono = tdist__now_ns();
    k->e = e;
    return k;
}

void tdist__fr_timeline_closing(tdist__fr_t *fr, bool last)
{
    if (!cfg_path) return;
    kept_t *k = copy_ring(fr);
    pthread_mutex_lock(&mu);
    if (k && kept_entries + k->n <= KEEP_MAX_ENTRIES) {
        kept_entries += k->n;
        *kept_tail = k;
        kept_tail = &k->next;
        k = NULL;
    }
    pthread_mutex_unlock(&mu);
    if (k) {
        TDIST_LOGD("TDIST_TRACE: group %s left out of the trace (over %u entries kept)",
                   fr->hdr->group, KEEP_MAX_ENTRIES);
        free(k->e);
        free(k);
    }
    if (last) (void)tdist__fr_timeline_write();
}

/* The trace into f (closed here): the destroyed groups, then the open
 * ones; 0, or -1 when a write failed. */
static int write_all(FILE *f)
{
    tdist__fr_trace_t t;
    tdist__fr_trace_begin(&t, f, origin_ns);
    int tid = 0;
    for (const kept_t *k = kept_head; k; k = k->next, tid += 3)
        tdist__fr_trace_group(&t, &k->hdr, k->e, k->n, k->now_mono, tid);
    pthread_mutex_lock(&tdist__fr_lock);
    for (tdist__fr_t *fr = tdist__fr_open_list; fr; fr = fr->next, tid += 3) {
        kept_t *k = copy_ring(fr);
        if (!k) continue;
        tdist__fr_trace_group(&t, &k->hdr, k->e, k->n, k->now_mono, tid);
        free(k->e);
        free(k);
    }
    pthread_mutex_unlock(&tdist__fr_lock);
    return tdist__fr_trace_end(&t);
}

int tdist__fr_timeline_write(void)
{
    if (!cfg_path) return 0;
    pthread_mutex_lock(&mu);
    if (world_rank < 0) { /* no group was ever opened */
        pthread_mutex_unlock(&mu);
        return 0;
    }
    char path[1100], tmp[1200];
    snprintf(path, sizeof path, "%s.r%d.json", cfg_path, world_rank);
    snprintf(tmp, sizeof tmp, "%s.tmp%d", path, (int)getpid());
    FILE *f = fopen(tmp, "we");
    int rc = f ? write_all(f) : -1;
    if (rc == 0 && rename(tmp, path) != 0) rc = -1;
    if (rc != 0) {
        TDIST_LOGD("TDIST_TRACE: cannot write %s: %s", path, strerror(errno));
        unlink(tmp);
    }
    pthread_mutex_unlock(&mu);
    return rc;
}
