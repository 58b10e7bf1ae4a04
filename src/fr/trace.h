/*
 * fr/trace.h — flight records as a Chrome trace (JSON; opens in Perfetto
 * or chrome://tracing). One writer for both users: the library's own
 * timeline (TDIST_TRACE, fr/timeline.c) and tdist-fr --trace. It uses only
 * the C library and format.h, so tdist-fr compiles trace.c in without
 * linking the library.
 *
 * Per group (the process is the world rank, "rank N"):
 *  - thread tid "group G": each collective as a span ("ph":"X") from its
 *    start to its end (its arguments: the call, seq, state, route,
 *    algorithm, when it was queued, and the peer a wait of it was on), and
 *    the marked events as instants (DDP's buckets, Join, the program's);
 *  - thread tid + 1 "group G p2p": sends and receives as spans;
 *  - thread tid + 2 "group G marks": spans made from the events — DDP's
 *    "backward" (from the iteration's first ready gradient, event
 *    backward_begin, to its last bucket_ready) holding one "compute bucket
 *    N" span per bucket (from the previous bucket ready to this one), and a
 *    span X for every pair of the program's marks X_begin ... X_end.
 * ts is in microseconds from the writer's origin (CLOCK_REALTIME ns).
 */
#ifndef TDIST_FR_TRACE_H
#define TDIST_FR_TRACE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "fr/format.h"

typedef struct tdist__fr_trace {
    FILE *f;
    bool first;        /* no event written yet */
    int64_t origin_ns; /* ts 0, CLOCK_REALTIME ns */
} tdist__fr_trace_t;

/* "all_reduce(f32, 2, sum)", "barrier", "event bucket_ready(3)": e as
 * messages and the trace name it. */
void tdist__fr_describe(const tdist__fr_entry_t *e, char *buf, size_t n);

/* Start a trace on f (owned by the caller until tdist__fr_trace_end). */
void tdist__fr_trace_begin(tdist__fr_trace_t *t, FILE *f, int64_t origin_ns);

/* Group h's entries e[0, n), oldest first, their times CLOCK_MONOTONIC ns
 * of h's process; now_mono: when they were read (where a span still
 * running ends). Threads tid, tid + 1 and tid + 2 of the rank's process. */
void tdist__fr_trace_group(tdist__fr_trace_t *t, const tdist__fr_header_t *h,
                           const tdist__fr_entry_t *e, size_t n, uint64_t now_mono, int tid);

/* Close the JSON and f; 0, or -1 when a write failed. */
int tdist__fr_trace_end(tdist__fr_trace_t *t);

#endif /* TDIST_FR_TRACE_H */
