/*
 * tests/harness/fr.h — what the flight-recorder tests of several layers
 * share: ranks run with the recorder's directory and a timeline set, a
 * rank's dump of its world group read back, and tools/trace_kinds.py over
 * timelines.
 */
#ifndef TDIST_TEST_FR_H
#define TDIST_TEST_FR_H

#include "harness.h"

#define FR_TOOL TDIST_BIN_DIR "/tools/tdist-fr/tdist-fr"

/* tdist_test_run_ranks with TDIST_FR_DIR=<tmpdir>/fr and
 * TDIST_TRACE=<tmpdir>/trace.json (each rank's timeline trace.r<R>.json). */
void fr_run_ranks(int n, tdist_rank_fn body);

/* <tmpdir>/fr: the directory fr_run_ranks gives the ranks (static). */
const char *fr_dir(void);

/* In a rank of fr_run_ranks: dump every ring (tdist_flight_dump) and read
 * back this world rank's dump of group world (malloc'd). Fails the test
 * if nothing was written. */
char *fr_dump_world(int rank);

/* tools/trace_kinds.py over trace files a and b (b may be NULL): it checks
 * them (JSON, spans nest, collectives in order, compute spans inside
 * backward) and counts their kinds. The counts (malloc'd), or NULL when
 * /usr/bin/python3 is missing (the traces are then not parsed). Fails the
 * test when a check fails. */
char *fr_trace_kinds(const char *a, const char *b);

#endif /* TDIST_TEST_FR_H */
