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

#endif /* TDIST_FR_INTERNAL_H */
