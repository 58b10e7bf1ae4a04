/*
 * coll/shm_line.c — the shared-memory route: every collective of a group
 * whose ranks share one host starts with the line exchange (shm_coll.c),
 * which carries pg/'s check (a hash of the fingerprint in the blob every
 * rank reads, the whole fingerprint in the aux part, read only to word a
 * mismatch) and is a barrier too. Small collectives finish in it:
 *  - tiny all_reduce: every rank's payload rides in its blob after the
 *    hash, reduced in rank order by every rank (the same bits everywhere);
 *  - tiny broadcast: the root's payload rides in its blob;
 *  - small all_reduce: the input is staged in the slot of this exchange
 *    before it, and reduced in rank order after it;
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

/* out = op over every rank's tiny payload (after the blob's hash), in rank
 * order, as every rank does: the same bits everywhere. */
static void reduce_lines(const uint8_t *const *b, int size, void *out, size_t count,
                         tdist_dtype_t dtype, tdist_redop_t op)
{
    const size_t hs = sizeof(uint64_t);
    tdist__reduce_unchecked(out, b[0] + hs, b[1] + hs, count, dtype, op);
    for (int r = 2; r < size; r++) tdist__reduce_unchecked(out, out, b[r] + hs, count, dtype, op);
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

/* Write this rank's line: hash, fingerprint, and a payload that rides in
 * it; stage a small all_reduce's input. */
static tdist_status_t post_line(const tdist__coll_ctx_t *c, const tdist__coll_args_t *a,
                                const tdist__coll_check_t *chk, tdist__coll_algo_t algo)
{
    const size_t hs = sizeof(uint64_t);
    size_t bytes = tdist__coll_bytes(a->count, a->dtype), len = hs;
    uint8_t *aux = NULL, *blob = tdist__shmc_begin(c, &aux);
    uint64_t h = chk && chk->on ? chk->hash : 0;
    size_t fl = chk ? chk->len : 0;
    if (fl) memcpy(aux, chk->common, fl);
    memcpy(blob, &h, hs);
    if (algo == TDIST__ALGO_AR_SHM_TINY) {
        memcpy(blob + hs, a->sendbuf, bytes);
        if (a->redop == TDIST_PREMUL_SUM)
            TDIST_CHECK(tdist_scale(blob + hs, a->count, a->dtype, a->premul));
        len += bytes;
    } else if (algo == TDIST__ALGO_BCAST_SHM_TINY && c->rank == a->root) {
        memcpy(blob + hs, a->recvbuf, bytes);
        len += bytes;
    } else if (algo == TDIST__ALGO_AR_SHM_SMALL) {
        TDIST_CHECK(tdist__shmc_stage_small(c, a->sendbuf, bytes));
    }
    tdist__shmc_post(c, len, fl);
    return TDIST_OK;
}

tdist_status_t tdist__coll_shm_line(const tdist__coll_ctx_t *c, const tdist__coll_args_t *a,
                                    const tdist__coll_check_t *chk, tdist__coll_algo_t algo)
{
    const size_t hs = sizeof(uint64_t);
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
    size_t bytes = tdist__coll_bytes(a->count, a->dtype);
    switch (algo) {
    case TDIST__ALGO_NONE:
        return TDIST_OK;
    case TDIST__ALGO_BCAST_SHM_TINY:
        if (c->rank != a->root) memcpy(a->recvbuf, b[a->root] + hs, bytes);
        return TDIST_OK;
    case TDIST__ALGO_AR_SHM_TINY:
        reduce_lines(b, c->size, a->recvbuf, a->count, a->dtype, a->redop);
        break;
    case TDIST__ALGO_AR_SHM_SMALL:
        tdist__shmc_reduce_small(c, a->recvbuf, a->count, a->dtype, a->redop);
        break;
    default:
        return tdist__coll_run_algo(c, a, chk, algo);
    }
    if (a->redop == TDIST_AVG)
        TDIST_CHECK(tdist_divide(a->recvbuf, a->count, a->dtype, c->size));
    return TDIST_OK;
}
