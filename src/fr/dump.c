/*
 * fr/dump.c — a recorder's ring as JSON: one file per group per process,
 * "<dir>/tdist-fr.r<world rank>.<uid>.json", the oldest entry first.
 *
 * Written from the ring in the mapping while the group may go on
 * recording: an entry rewritten during the copy is skipped (its id no
 * longer matches), so a dump is a consistent set of entries, not
 * necessarily the very last ones. The file appears whole (written to a
 * temporary name, then renamed).
 *
 * {"version":1,"reason":"...","group":"world","uid":"world","rank":0,
 *  "size":2,"world_rank":0,"pid":123,"host":"h","backend":"native",
 *  "transport":"shm","mono0_ns":..,"real0_ns":..,"dump_mono_ns":..,
 *  "entries":[{"id":0,"kind":"coll","seq":1,"op":"all_reduce",
 *     "dtype":"f32","count":2,"root":-1,"redop":"sum","splits_hash":0,
 *     "route":"shm_line","algo":"shm_tiny","state":"completed",
 *     "status":0,"t_ns":{"queued":..,"started":..,"completed":..}}, ...]}
 * ("peer": the rank a wait was on, while it waited: only then.)
 */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fr/internal.h"

static const char *const kind_names[] = {"?", "coll", "send", "recv", "event"};
static const char *const transport_names[] = {"shm", "tcp", "backend"};

static void dump_entry(FILE *f, const tdist__fr_entry_t *e, bool first)
{
    uint32_t state = e->state;
    fprintf(f, "%s\n  {\"id\":%llu,\"kind\":\"%s\",\"seq\":%llu", first ? "" : ",",
            (unsigned long long)e->id, TDIST__FR_NAME(kind_names, (int)e->kind),
            (unsigned long long)e->seq);
    if (e->kind == TDIST__FR_EVENT) {
        char what[sizeof e->what + 1];
        memcpy(what, e->what, sizeof e->what);
        what[sizeof e->what] = '\0';
        for (char *p = what; *p; p++)
            if (*p == '"' || *p == '\\' || (unsigned char)*p < 0x20) *p = '_';
        fprintf(f, ",\"what\":\"%s\",\"arg\":%llu", what, (unsigned long long)e->count);
    } else {
        fprintf(f, ",\"op\":\"%s\",\"dtype\":\"%s\",\"count\":%llu,\"root\":%d,\"redop\":\"%s\","
                   "\"splits_hash\":%llu,\"route\":\"%s\",\"algo\":\"%s\"",
                TDIST__FR_NAME(tdist__fr_op_names, e->op),
                e->dtype < 0 ? "none" : TDIST__FR_NAME(tdist__fr_dtype_names, e->dtype),
                (unsigned long long)e->count, e->root,
                e->redop < 0 ? "none" : TDIST__FR_NAME(tdist__fr_redop_names, e->redop),
                (unsigned long long)e->splits_hash,
                e->route == 255 ? "none" : TDIST__FR_NAME(tdist__fr_route_names, e->route),
                e->route == 255 ? "none" : TDIST__FR_NAME(tdist__fr_algo_names, e->algo));
        if (e->flags & TDIST__FR_ENDED_IN_SPIN) fputs(",\"ended_in_spin\":true", f);
        if (tdist__fr_waited(e))
            fprintf(f, ",\"wait_peer\":%d,\"wait_ns\":%llu", e->wait.peer,
                    (unsigned long long)e->wait.t_ns);
    }
    fprintf(f, ",\"state\":\"%s\",\"status\":%d,\"t_ns\":{",
            TDIST__FR_NAME(tdist__fr_state_names, (int)state), e->status);
    bool any = false;
    for (uint32_t s = TDIST__FR_QUEUED; s <= TDIST__FR_FAILED; s++) {
        if (!e->t_ns[s]) continue;
        fprintf(f, "%s\"%s\":%llu", any ? "," : "", tdist__fr_state_names[s],
                (unsigned long long)e->t_ns[s]);
        any = true;
    }
    fputs("}}", f);
}

static void dump_header(FILE *f, const tdist__fr_header_t *h, const char *reason)
{
    fprintf(f, "{\"version\":%u,\"reason\":\"", TDIST__FR_JSON_VERSION);
    for (const char *p = reason; *p; p++) {
        if (*p == '"' || *p == '\\') fputc('\\', f);
        fputc((unsigned char)*p < 0x20 ? ' ' : *p, f);
    }
    /* group names and uids are the program's strings: escaped the same way */
    char group[sizeof h->group * 2], uid[sizeof h->uid];
    size_t j = 0;
    for (size_t i = 0; i < sizeof h->group && h->group[i] && j + 2 < sizeof group; i++) {
        if (h->group[i] == '"' || h->group[i] == '\\') group[j++] = '\\';
        group[j++] = (unsigned char)h->group[i] < 0x20 ? ' ' : h->group[i];
    }
    group[j] = '\0';
    tdist__fr_file_safe(h->uid, uid, sizeof uid);
    fprintf(f, "\",\"group\":\"%s\",\"uid\":\"%s\",\"rank\":%d,\"size\":%d,\"world_rank\":%d,"
               "\"pid\":%d,\"host\":\"%.63s\",\"backend\":\"%.15s\",\"transport\":\"%s\","
               "\"capacity\":%u,\"mono0_ns\":%llu,\"real0_ns\":%llu,\"dump_mono_ns\":%llu,"
               "\"entries\":[",
            group, uid, h->rank, h->size, h->world_rank, h->pid, h->host, h->backend,
            TDIST__FR_NAME(transport_names, h->transport), h->capacity,
            (unsigned long long)h->mono0_ns, (unsigned long long)h->real0_ns,
            (unsigned long long)tdist__now_ns());
}

size_t tdist__fr_snapshot(tdist__fr_t *fr, tdist__fr_entry_t *out)
{
    const tdist__fr_header_t *h = fr->hdr;
    uint64_t tsc_now = tdist__fr_rdtsc(), mono_now = tdist__now_ns();
    size_t n = tdist__fr_collect(h, fr->ring, out);
    for (size_t i = 0; i < n; i++) {
        tdist__fr_entry_t *c = &out[i];
        for (uint32_t s = TDIST__FR_QUEUED; s <= TDIST__FR_FAILED; s++)
            c->t_ns[s] = tdist__fr_to_ns(h, c->t_ns[s], tsc_now, mono_now);
        if (tdist__fr_waited(c) && c->wait.t_ns)
            c->wait.t_ns = tdist__fr_to_ns(h, c->wait.t_ns, tsc_now, mono_now);
    }
    return n;
}

static tdist_status_t dump_one(tdist__fr_t *fr, const char *reason)
{
    tdist__fr_header_t *h = fr->hdr;
    char uid[128];
    tdist__fr_file_safe(h->uid, uid, sizeof uid);
    const char *dir = tdist__fr_dir();
    char path[700], tmp[720];
    snprintf(path, sizeof path, "%s/tdist-fr.r%d.%s.json", dir, h->world_rank, uid);
    snprintf(tmp, sizeof tmp, "%s.tmp%d", path, (int)getpid());
    FILE *f = fopen(tmp, "we");
    if (!f) return tdist__error_errno(errno, "flight recorder: cannot write %s", tmp);
    tdist__fr_entry_t *es = malloc(2 * (size_t)fr->cap * sizeof *es);
    if (!es) {
        fclose(f);
        unlink(tmp);
        return tdist__error(TDIST_ERR_NO_MEMORY, "flight recorder: out of memory for %s", path);
    }
    dump_header(f, h, reason);
    size_t n = tdist__fr_snapshot(fr, es);
    for (size_t i = 0; i < n; i++) dump_entry(f, &es[i], i == 0);
    free(es);
    fputs("\n]}\n", f);
    bool bad = ferror(f) != 0;
    if (fclose(f) != 0 || bad || rename(tmp, path) != 0) {
        int err = errno;
        unlink(tmp);
        return tdist__error_errno(err ? err : EIO, "flight recorder: cannot write %s", path);
    }
    return TDIST_OK;
}

static atomic_bool dumped_failure;
static atomic_int dumps_busy; /* threads inside tdist__fr_dump_all */

static int dump_all(const char *reason, bool force)
{
    /* a failure dumps only where the user (or tdistrun) asked: a program
     * that handles its failures itself leaves no files behind */
    if (!force && (!tdist__fr_dir_named() || atomic_exchange(&dumped_failure, true))) return 0;
    int n = 0;
    tdist_status_t st = TDIST_OK;
    pthread_mutex_lock(&tdist__fr_lock);
    for (tdist__fr_t *fr = tdist__fr_open_list; fr; fr = fr->next) {
        tdist_status_t s = dump_one(fr, reason ? reason : "");
        if (s == TDIST_OK)
            n++;
        else if (st == TDIST_OK)
            st = s;
    }
    pthread_mutex_unlock(&tdist__fr_lock);
    (void)tdist__fr_timeline_write(); /* TDIST_TRACE: a timeline at every dump */
    return st == TDIST_OK ? n : -1;
}

int tdist__fr_dump_all(const char *reason, bool force)
{
    /* counted from before the claim on dumped_failure: a thread that
     * finds the claim taken can wait for the dump behind it */
    atomic_fetch_add(&dumps_busy, 1);
    int n = dump_all(reason, force);
    atomic_fetch_sub(&dumps_busy, 1);
    return n;
}

bool tdist__fr_dump_settle(int ms)
{
    for (int i = 0; i < ms && atomic_load(&dumps_busy) > 0; i++) tdist__sleep_ms(1);
    return atomic_load(&dumps_busy) == 0;
}
