/*
 * pg/join_iface.h — the narrow interface pg gives the Join layer (join/):
 * the group's role in a Join, set by join/ after every notification, and
 * the notification's all_gather. join/ sees nothing else of pg's
 * internals; pg/shadow.c implements it (docs/join.md).
 */
#ifndef TDIST_PG_JOIN_IFACE_H
#define TDIST_PG_JOIN_IFACE_H

#include <stdint.h>

#include "tdist/pg.h"

/* The group's role in a Join (rule 4 of docs/design.md). */
enum {
    TDIST__JOIN_NONE = 0, /* not in a Join (or Join disabled) */
    TDIST__JOIN_PRE,      /* in a Join, before this rank's first notification:
                             any other collective is an error */
    TDIST__JOIN_ACTIVE,   /* this rank iterates; join_out says who has joined */
    TDIST__JOIN_SHADOW    /* this rank has joined: its engine takes part, with
                             the identity, in whatever the active ranks issue */
};

/* Set the group's Join state (join/ calls it on the training thread).
 * joined (size entries, borrowed until the next call) may be NULL for
 * NONE/PRE. Thread-safe (takes pg->mu). */
void tdist__pg_join_set(tdist_pg_t *pg, int mode, const uint8_t *joined, int leader,
                        int divisor, uint64_t iteration);
int tdist__pg_join_mode(tdist_pg_t *pg);
/* The Join notification: a blocking all_gather of one int64 per rank,
 * marked as such in its fingerprint (allowed in PRE mode, never shadowed). */
tdist_status_t tdist__pg_join_gather(tdist_pg_t *pg, const int64_t *word, int64_t *words);

#endif /* TDIST_PG_JOIN_IFACE_H */
