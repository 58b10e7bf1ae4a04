/*
 * fr/internal.h — what fr.c and dump.c share: the registry of open
 * recorders (under tdist__fr_lock) and file names.
 */
#ifndef TDIST_FR_INTERNAL_H
#define TDIST_FR_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>

#include "fr/fr.h"

extern pthread_mutex_t tdist__fr_lock;
extern tdist__fr_t *tdist__fr_open_list;

/* in, with anything but [A-Za-z0-9._~-] made '_', into out[n]. */
void tdist__fr_file_safe(const char *in, char *out, size_t n);

/* Whether TDIST_FR_DIR named the directory (else it is this process's). */
bool tdist__fr_dir_named(void);

/* Copy fr's entries (oldest first, those rewritten meanwhile left out)
 * into out (2 x fr->cap entries: both rings), their times made CLOCK_MONOTONIC ns; the
 * number copied. Any thread; the ring may be recording. */
size_t tdist__fr_snapshot(tdist__fr_t *fr, tdist__fr_entry_t *out);

/* TDIST_TRACE (timeline.c): a recorder opened; one closes (before it is
 * unmapped; last: no other is open); write the process's trace file now
 * (0, or -1: logged at debug level). Each does nothing without
 * TDIST_TRACE. Not under tdist__fr_lock. */
void tdist__fr_timeline_opened(tdist__fr_t *fr);
void tdist__fr_timeline_closing(tdist__fr_t *fr, bool last);
int tdist__fr_timeline_write(void);

#endif /* TDIST_FR_INTERNAL_H */
