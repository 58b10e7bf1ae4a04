/*
 * fr/trace.c — the Chrome trace writer of fr/trace.h, shared by the
 * library (TDIST_TRACE) and tdist-fr --trace. C library only.
 */
#include <string.h>

#include "fr/trace.h"

void tdist__fr_describe(const tdist__fr_entry_t *e, char *buf, size_t n)
{
    const char *op = TDIST__FR_NAME(tdist__fr_op_names, e->op);
    if (e->kind == TDIST__FR_EVENT) {
        char w[sizeof e->what + 1];
        memcpy(w, e->what, sizeof e->what);
        w[sizeof e->what] = '\0';
        snprintf(buf, n, "event %s(%llu)", w, (unsigned long long)e->count);
    } else if (e->op == 11 || e->op == 12) { /* barriers */
        snprintf(buf, n, "%s", op);
    } else {
        int k = snprintf(buf, n, "%s(%s, %llu", op,
                         e->dtype < 0 ? "-" : TDIST__FR_NAME(tdist__fr_dtype_names, e->dtype),
                         (unsigned long long)e->count);
        if (e->redop >= 0 && k > 0 && (size_t)k < n)
            k += snprintf(buf + k, n - (size_t)k, ", %s", TDIST__FR_NAME(tdist__fr_redop_names, e->redop));
        if (e->root >= 0 && k > 0 && (size_t)k < n)
            k += snprintf(buf + k, n - (size_t)k, ", %s %d",
                          e->kind == TDIST__FR_COLL ? "root" : "peer", e->root);
        if (k > 0 && (size_t)k < n) snprintf(buf + k, n - (size_t)k, ")");
    }
}

void tdist__fr_trace_begin(tdist__fr_trace_t *t, FILE *f, int64_t origin_ns)
{
    t->f = f;
    t->first = true;
    t->origin_ns = origin_ns;
    fprintf(f, "{\"displayTimeUnit\":\"ns\",\"otherData\":{\"origin_unix_ns\":\"%lld\"},"
               "\"traceEvents\":[", (long long)origin_ns);
}

/* Microseconds from the origin of h's CLOCK_MONOTONIC time mono. */
static double us(const tdist__fr_trace_t *t, const tdist__fr_header_t *h, uint64_t mono)
{
    int64_t real = (int64_t)h->real0_ns + ((int64_t)mono - (int64_t)h->mono0_ns);
    return (double)(real - t->origin_ns) / 1000.0;
}

static const char *sep(tdist__fr_trace_t *t)
{
    const char *s = t->first ? "\n" : ",\n";
    t->first = false;
    return s;
}

/* An event's name, made safe for a JSON string. */
static void what_of(const tdist__fr_entry_t *e, char *out)
{
    memcpy(out, e->what, sizeof e->what);
    out[sizeof e->what] = '\0';
    for (char *p = out; *p; p++)
        if (*p == '"' || *p == '\\' || (unsigned char)*p < 0x20) *p = '_';
}

static void meta(tdist__fr_trace_t *t, int pid, int tid, const char *what, const char *name)
{
    fprintf(t->f, "%s{\"ph\":\"M\",\"name\":\"%s\",\"pid\":%d,\"tid\":%d,\"args\":{\"name\":\"%s\"}}",
            sep(t), what, pid, tid, name);
}

static void span(tdist__fr_trace_t *t, const tdist__fr_header_t *h, const tdist__fr_entry_t *e,
                 uint64_t now_mono, int tid)
{
    uint64_t t0 = e->t_ns[TDIST__FR_STARTED] ? e->t_ns[TDIST__FR_STARTED] : e->t_ns[TDIST__FR_QUEUED];
    uint64_t t1 = e->t_ns[TDIST__FR_COMPLETED] ? e->t_ns[TDIST__FR_COMPLETED]
                : e->t_ns[TDIST__FR_FAILED] ? e->t_ns[TDIST__FR_FAILED] : now_mono;
    if (t1 < t0) t1 = t0;
    char d[160], wait[32] = "";
    tdist__fr_describe(e, d, sizeof d);
    if (tdist__fr_waited(e)) snprintf(wait, sizeof wait, ",\"waiting_on\":%d", e->wait.peer);
    fprintf(t->f, "%s{\"ph\":\"X\",\"name\":\"%s\",\"cat\":\"%s\",\"pid\":%d,\"tid\":%d,"
                  "\"ts\":%.3f,\"dur\":%.3f,\"args\":{\"call\":\"%s\",\"seq\":%llu,\"state\":\"%s\","
                  "\"route\":\"%s\",\"algorithm\":\"%s\",\"queued_us\":%.3f%s}}",
            sep(t), TDIST__FR_NAME(tdist__fr_op_names, e->op),
            e->kind == TDIST__FR_COLL ? "collective" : "p2p", h->world_rank, tid, us(t, h, t0),
            (double)(t1 - t0) / 1000.0, d, (unsigned long long)e->seq,
            TDIST__FR_NAME(tdist__fr_state_names, (int)e->state),
            e->route == 255 ? "none" : TDIST__FR_NAME(tdist__fr_route_names, e->route),
            e->route == 255 ? "none" : TDIST__FR_NAME(tdist__fr_algo_names, e->algo),
            us(t, h, e->t_ns[TDIST__FR_QUEUED]), wait);
}

static void instant(tdist__fr_trace_t *t, const tdist__fr_header_t *h, const tdist__fr_entry_t *e,
                    int tid)
{
    char what[sizeof e->what + 1];
    what_of(e, what);
    fprintf(t->f, "%s{\"ph\":\"i\",\"s\":\"t\",\"name\":\"%s\",\"cat\":\"event\",\"pid\":%d,"
                  "\"tid\":%d,\"ts\":%.3f,\"args\":{\"arg\":%llu,\"after_seq\":%llu}}",
            sep(t), what, h->world_rank, tid, us(t, h, e->t_ns[TDIST__FR_QUEUED]),
            (unsigned long long)e->count, (unsigned long long)e->seq);
}

/* A span made from two events' times. */
static void mark_span(tdist__fr_trace_t *t, const tdist__fr_header_t *h, const char *name,
                      uint64_t t0, uint64_t t1, uint64_t arg, int tid)
{
    if (t1 < t0) t1 = t0;
    fprintf(t->f, "%s{\"ph\":\"X\",\"name\":\"%s\",\"cat\":\"marks\",\"pid\":%d,\"tid\":%d,"
                  "\"ts\":%.3f,\"dur\":%.3f,\"args\":{\"arg\":%llu}}",
            sep(t), name, h->world_rank, tid, us(t, h, t0), (double)(t1 - t0) / 1000.0,
            (unsigned long long)arg);
}

static bool is_event(const tdist__fr_entry_t *e, const char *what)
{
    return e->kind == TDIST__FR_EVENT && strncmp(e->what, what, sizeof e->what) == 0;
}

/* DDP's backward from e[i] (backward_begin): one span over the
 * iteration's bucket_ready events up to the next backward_begin, and a
 * "compute bucket N" span before each of them. */
static void backward(tdist__fr_trace_t *t, const tdist__fr_header_t *h,
                     const tdist__fr_entry_t *e, size_t n, size_t i, int tid)
{
    uint64_t begin = e[i].t_ns[TDIST__FR_QUEUED], prev = begin;
    for (size_t j = i + 1; j < n && !is_event(&e[j], "backward_begin"); j++) {
        if (!is_event(&e[j], "bucket_ready")) continue;
        char name[48];
        snprintf(name, sizeof name, "compute bucket %llu", (unsigned long long)e[j].count);
        mark_span(t, h, name, prev, e[j].t_ns[TDIST__FR_QUEUED], e[j].count, tid);
        prev = e[j].t_ns[TDIST__FR_QUEUED];
    }
    if (prev != begin) mark_span(t, h, "backward", begin, prev, e[i].count, tid);
}

/* The program's X_begin at e[i]: a span X to the next X_end. */
static void user_span(tdist__fr_trace_t *t, const tdist__fr_header_t *h,
                      const tdist__fr_entry_t *e, size_t n, size_t i, int tid)
{
    char name[sizeof e->what + 1], end[sizeof e->what + 8];
    what_of(&e[i], name);
    name[strlen(name) - strlen("_begin")] = '\0';
    snprintf(end, sizeof end, "%s_end", name);
    for (size_t j = i + 1; j < n; j++)
        if (is_event(&e[j], end)) {
            mark_span(t, h, name, e[i].t_ns[TDIST__FR_QUEUED], e[j].t_ns[TDIST__FR_QUEUED],
                      e[i].count, tid);
            return;
        }
}

static bool ends_with_begin(const tdist__fr_entry_t *e)
{
    size_t l = strnlen(e->what, sizeof e->what), b = strlen("_begin");
    return l > b && memcmp(e->what + l - b, "_begin", b) == 0;
}

void tdist__fr_trace_group(tdist__fr_trace_t *t, const tdist__fr_header_t *h,
                           const tdist__fr_entry_t *e, size_t n, uint64_t now_mono, int tid)
{
    char name[96], group[64];
    memcpy(group, h->group, sizeof group - 1);
    group[sizeof group - 1] = '\0';
    for (char *p = group; *p; p++)
        if (*p == '"' || *p == '\\' || (unsigned char)*p < 0x20) *p = '_';
    snprintf(name, sizeof name, "rank %d", h->world_rank);
    meta(t, h->world_rank, tid, "process_name", name);
    snprintf(name, sizeof name, "group %s", group);
    meta(t, h->world_rank, tid, "thread_name", name);
    snprintf(name, sizeof name, "group %s p2p", group);
    meta(t, h->world_rank, tid + 1, "thread_name", name);
    snprintf(name, sizeof name, "group %s marks", group);
    meta(t, h->world_rank, tid + 2, "thread_name", name);
    for (size_t k = 0; k < n; k++) {
        if (e[k].kind != TDIST__FR_EVENT) {
            span(t, h, &e[k], now_mono, tid + (e[k].kind != TDIST__FR_COLL));
            continue;
        }
        instant(t, h, &e[k], tid);
        if (is_event(&e[k], "backward_begin"))
            backward(t, h, e, n, k, tid + 2);
        else if (ends_with_begin(&e[k]))
            user_span(t, h, e, n, k, tid + 2);
    }
}

int tdist__fr_trace_end(tdist__fr_trace_t *t)
{
    fputs("\n]}\n", t->f);
    bool bad = ferror(t->f) != 0;
    return fclose(t->f) != 0 || bad ? -1 : 0;
}
