/*
 * coll/shm_line.c — the shared-memory route: every collective of a group
 * whose ranks share one host starts with the line exchange (shm_coll.c),
 * which carries pg/'s check (a hash of the fingerprint in the blob every
 * rank reads, the whole fingerprint in the aux part, read only to word a
 * mismatch) and is a barrier too. Small collectives finish in it:
 *  - one-shot (oneshot.c: all_reduce, reduce, broadcast, all_gather, gather,
 *    scatter, all_to_all, reduce_scatter): each rank's data rides in its
 *    blob after the hash, or is staged in its slot of this exchange
 *    before it, and every rank takes what it needs after it;
 *  - barrier: nothing more.
 * Anything else goes on to its algorithm. all_to_allv's per-pair counts
 * still go through pg's exchange; the monitored barrier goes on over the
 * transport to name who is missing.
 */
#include <string.h>

#include "coll/coll_internal.h"

/* The hash at the head of a rank's blob (one load, not a memcmp call). */
static inline uint64_t line_hash(const uint8_t *blob)
{
    uint64_t v;
    memcpy(&v, blob, sizeof v);
    return v;
}

/* The hashes in this exchange's blobs differ: every rank's whole
 * fingerprint (aux parts) into theirs, and pg words the mismatch. */
static tdist_status_t mismatch(const tdist__coll_ctx_t *c, const tdist__coll_check_t *chk)
{
    for (int r = 0; r < c->size; r++) {
        size_t al = 0;
        const uint8_t *aux = tdist__shmc_peek_aux(c, r, &al);
        uint8_t *dst = chk->theirs + (size_t)r * chk->len;
        memset(dst, 0, chk->len);
        if (aux) memcpy(dst, aux, TDIST_MIN(al, chk->len));
    }
    TDIST_CHECK(chk->compare(chk->arg));
    /* equal fingerprints, different hashes: cannot happen */
    return tdist__error(TDIST_ERR_INTERNAL, "fingerprint hashes differ, fingerprints do not");
}

/* Write this rank's line: hash, fingerprint, and a one-shot collective's
 * data, in the blob or staged in the slot of this exchange. */
static tdist_status_t post_line(const tdist__coll_ctx_t *c, const tdist__coll_args_t *a,
                                const tdist__coll_check_t *chk, tdist__coll_algo_t algo)
{
    const size_t hs = sizeof(uint64_t);
    size_t len = hs;
    uint8_t *aux = NULL, *blob = tdist__shmc_begin(c, &aux);
    uint64_t h = chk && chk->on ? chk->hash : 0;
    size_t fl = chk ? chk->len : 0;
    if (fl) memcpy(aux, chk->common, fl);
    memcpy(blob, &h, hs);
    if (algo == TDIST__ALGO_SHM_IN_LINE || algo == TDIST__ALGO_SHM_ONE_SHOT) {
        size_t bytes = 0;
        const void *in = tdist__oneshot_input(c, a, &bytes);
        uint8_t *to = blob + hs;
        if (algo == TDIST__ALGO_SHM_ONE_SHOT) TDIST_CHECK(tdist__shmc_stage_slot(c, &to));
        if (in) {
            memcpy(to, in, bytes);
            TDIST_CHECK(tdist__oneshot_scale(a, to, bytes));
            if (algo == TDIST__ALGO_SHM_IN_LINE) len += bytes;
        }
    }
    tdist__shmc_post(c, len, fl);
    return TDIST_OK;
}

/* A one-shot collective's result from every rank's staged data. */
static tdist_status_t finish_oneshot(const tdist__coll_ctx_t *c, const tdist__coll_args_t *a,
                                     const uint8_t **b, tdist__coll_algo_t algo)
{
    const size_t hs = sizeof(uint64_t);
    /* the commonest (a loss, a norm): every rank's input after its hash */
    if (algo == TDIST__ALGO_SHM_IN_LINE && a->op == TDIST__OP_ALL_REDUCE)
        return tdist__oneshot_reduce(c, a, b, hs, a->recvbuf);
    for (int r = 0; r < c->size; r++)
        b[r] = algo == TDIST__ALGO_SHM_IN_LINE ? b[r] + hs : tdist__shmc_slot(c, r);
    return tdist__oneshot_finish(c, a, b);
}

tdist_status_t tdist__coll_shm_line(const tdist__coll_ctx_t *c, const tdist__coll_args_t *a,
                                    const tdist__coll_check_t *chk, tdist__coll_algo_t algo)
{
    TDIST_CHECK(post_line(c, a, chk, algo));
    /* Only rank 0 collects a monitored barrier (over the transport, to
     * name who is missing); the line just keeps every rank's exchange
     * count and shows this call to a rank that issued something else. */
    if (algo == TDIST__ALGO_MONITORED) return tdist__coll_monitored_barrier(c, chk);
    const uint8_t **b = c->g->blobs;
    TDIST_CHECK(tdist__shmc_gather(c, b, NULL));
    if (chk && chk->on) {
        for (int r = 0; r < c->size; r++)
            if (line_hash(b[r]) != chk->hash) return mismatch(c, chk);
        if (a->op == TDIST__OP_ALL_TO_ALLV) TDIST_CHECK(chk->exchange(chk->arg, c->deadline_ms));
    }
    switch (algo) {
    case TDIST__ALGO_NONE:
        return TDIST_OK;
    case TDIST__ALGO_SHM_IN_LINE:
    case TDIST__ALGO_SHM_ONE_SHOT:
        return finish_oneshot(c, a, b, algo);
    default:
        return tdist__coll_run_algo(c, a, chk, algo);
    }
}
