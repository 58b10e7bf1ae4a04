/*
 * fr/wait.c — which peer a collective waits on, while it waits.
 *
 * The transport knows the peer (on the MPI backend, its per-peer
 * fingerprint exchange: backend/mpi/mpi_coll.c), and only once a wait
 * stops spinning is there time to say so: it then calls
 * tdist__fr_note_wait (through pg),
 * which finds the group's running collective in the ring and writes the
 * peer and the time into that entry's wait fields (format.h). Nothing is
 * written on a collective's fast path, so a call whose peers are already
 * there costs the recorder nothing more.
 *
 * A peer of -1 takes a note back (the MPI backend, once its exchange is
 * over and MPI's own collective, which cannot name a peer, runs).
 *
 * The running collective's entry is the one pg last started on this
 * group (pg keeps its id, written on the thread that runs collectives and
 * read here on the same thread).
 */
#include <stdatomic.h>

#include "fr/fr.h"

void tdist__fr_note_wait(tdist__fr_t *fr, uint64_t id, int peer)
{
    tdist__fr_slot_t *e = tdist__fr_at(fr, id);
    if (!e || e->kind != TDIST__FR_COLL ||
        atomic_load_explicit((_Atomic uint8_t *)&e->state, memory_order_acquire) !=
            TDIST__FR_STARTED)
        return;
    e->dt_wait = (float)(int64_t)(tdist__fr_now() - e->t_queued);
    /* after the time: a reader that sees the peer sees its time */
    atomic_store_explicit((_Atomic int32_t *)&e->peer, peer, memory_order_release);
}
