/*
 * fr/wait.c — which peer a collective waits on, while it waits.
 *
 * The transport knows the peer, and only once a wait stops spinning is
 * there time to say so: it then calls tdist__fr_note_wait (through pg),
 * which finds the group's running collective in the ring and writes the
 * peer and the time into that entry's wait fields (format.h). Nothing is
 * written on a collective's fast path, so a call whose peers are already
 * there costs the recorder nothing more.
 *
 * Finding the running entry: a group runs its collectives one at a time
 * in issue order, so every collective entry older than the running one
 * has ended and every newer one is queued. The search starts where the
 * last one found the running entry and stops at the first started
 * collective; it never reads an entry newer than that one, which the
 * thread issuing the next collectives may be writing.
 */
#include <stdatomic.h>

#include "fr/fr.h"

void tdist__fr_note_wait(tdist__fr_t *fr, int peer)
{
    if (!fr) return;
    uint64_t next = atomic_load_explicit((_Atomic uint64_t *)&fr->hdr->next, memory_order_acquire);
    uint64_t id = fr->wait_from;
    if (next > fr->cap && id < next - fr->cap) id = next - fr->cap;
    for (; id < next; id++) {
        tdist__fr_entry_t *e = &fr->ring[id & (fr->cap - 1)];
        uint32_t st = atomic_load_explicit((_Atomic uint32_t *)&e->state, memory_order_acquire);
        if (st == TDIST__FR_EMPTY || e->id != id || e->kind != TDIST__FR_COLL) continue;
        if (st == TDIST__FR_QUEUED) return; /* nothing runs: a wait outside a collective */
        if (st != TDIST__FR_STARTED) continue;
        fr->wait_from = id;
        e->wait.peer = peer;
        e->wait.t_ns = tdist__fr_now();
        atomic_store_explicit((_Atomic uint64_t *)&e->wait.tag, id + 1, memory_order_release);
        return;
    }
}
