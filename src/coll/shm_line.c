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
 * A blocking rooted one-shot collective (broadcast, scatter, reduce,
 * gather) is not a barrier: its senders leave after posting, its
 * receivers wait for the lines they read, and the lines nobody waited
 * for are compared later (tdist__oneshot_role, shm_coll.c "checking").
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

/* The hashes of exchange seq's blobs differ: every rank's whole
 * fingerprint (aux parts) into theirs, and pg words the mismatch (of an
 * earlier collective when seq is not this one's). */
static tdist_status_t mismatch(const tdist__coll_ctx_t *c, const tdist__coll_check_t *chk,
                               uint64_t seq)
{
    for (int r = 0; r < c->size; r++) {
        size_t al = 0;
        const uint8_t *aux = tdist__shmc_aux_of(c, r, seq, &al);
        uint8_t *dst = chk->theirs + (size_t)r * chk->len;
        memset(dst, 0, chk->len);
        if (aux) memcpy(dst, aux, TDIST_MIN(al, chk->len));
    }
    if (seq == tdist__shmc_now(c))
        TDIST_CHECK(chk->compare(chk->arg));
    else
        TDIST_CHECK(chk->compare_earlier(chk->arg));
    /* equal fingerprints, different hashes: cannot happen */
    return tdist__error(TDIST_ERR_INTERNAL, "fingerprint hashes differ, fingerprints do not");
}

/* A status of the line's own: a difference found in an earlier exchange's
 * lines is worded as pg's mismatch. */
static tdist_status_t line_status(const tdist__coll_ctx_t *c, const tdist__coll_check_t *chk,
                                  tdist_status_t st)
{
    if (st != TDIST_ERR_MISMATCH || !chk || !tdist__shmc_bad(c)) return st;
    return mismatch(c, chk, tdist__shmc_bad(c));
}

/* Whether every rank waits for every line of a (no rooted sender leaves
 * early): the same answer on every rank. */
static bool every_waits(const tdist__coll_args_t *a)
{
    return a->op == TDIST__OP_ALL_REDUCE || a->op == TDIST__OP_ALL_GATHER ||
           a->op == TDIST__OP_ALL_TO_ALL || a->op == TDIST__OP_REDUCE_SCATTER;
}

/* Write this rank's line: hash, fingerprint, and a one-shot collective's
 * data, in the blob or staged in the slot of this exchange. */
static tdist_status_t post_line(const tdist__coll_ctx_t *c, const tdist__coll_args_t *a,
                                const tdist__coll_check_t *chk, tdist__coll_algo_t algo)
{
    const size_t hs = sizeof(uint64_t);
    size_t len = hs;
    uint8_t *aux = NULL, *blob = NULL;
    TDIST_CHECK(line_status(c, chk, tdist__shmc_begin(c, &blob, &aux)));
    uint64_t h = chk && chk->on ? chk->hash : 0;
    size_t fl = chk ? chk->len : 0;
    if (fl) memcpy(aux, chk->common, fl);
    memcpy(blob, &h, hs);
    if (algo == TDIST__ALGO_SHM_IN_LINE || algo == TDIST__ALGO_SHM_ONE_SHOT) {
        size_t bytes = 0;
        const void *in = tdist__oneshot_input(c, a, &bytes);
        uint8_t *to = blob + hs;
        if (algo == TDIST__ALGO_SHM_ONE_SHOT)
            TDIST_CHECK(line_status(
                c, chk, tdist__shmc_stage_slot(c, tdist__oneshot_bytes(a, c->size), every_waits(a),
                                              &to)));
        if (in) {
            memcpy(to, in, bytes);
            TDIST_CHECK(tdist__oneshot_scale(a, to, bytes));
            if (algo == TDIST__ALGO_SHM_IN_LINE) len += bytes;
        }
    }
    tdist__shmc_post(c, len, fl);
    return TDIST_OK;
}

/* A one-shot collective's result from the staged data of the ranks that
 * have it (b[r], NULL for a rank whose line was not waited for). */
static tdist_status_t finish_oneshot(const tdist__coll_ctx_t *c, const tdist__coll_args_t *a,
                                     const uint8_t **b, tdist__coll_algo_t algo)
{
    const size_t hs = sizeof(uint64_t);
    if (algo == TDIST__ALGO_SHM_IN_LINE) {
        for (int r = 0; r < c->size; r++)
            if (b[r]) b[r] += hs;
    } else {
        size_t staged = tdist__oneshot_bytes(a, c->size);
        for (int r = 0; r < c->size; r++)
            if (b[r]) b[r] = tdist__shmc_slot(c, r, staged, every_waits(a));
    }
    return tdist__oneshot_finish(c, a, b);
}

/* A rooted one-shot collective's sender or receiver (tdist__oneshot_role). */
static tdist_status_t rooted(const tdist__coll_ctx_t *c, const tdist__coll_args_t *a,
                             const tdist__coll_check_t *chk, tdist__coll_algo_t algo,
                             tdist__oneshot_role_t role)
{
    const uint8_t **b = c->g->blobs;
    for (int r = 0; r < c->size; r++) b[r] = NULL;
    int from = role == TDIST__ROLE_SEND ? c->rank : a->root;
    TDIST_CHECK(tdist__shmc_gather_one(c, from, &b[from]));
    if (role == TDIST__ROLE_FROM_ROOT && line_hash(b[from]) != chk->hash) {
        /* word it as every rank does: with every rank's fingerprint */
        TDIST_CHECK(line_status(c, chk, tdist__shmc_gather(c, c->g->blobs, NULL)));
        return mismatch(c, chk, tdist__shmc_now(c));
    }
    tdist__shmc_prepare_rooted(c);
    return finish_oneshot(c, a, b, algo);
}

/* n bytes from src to dst: up to 16 in two overlapping moves (a loss, a
 * norm: a call to memcpy costs more than the copy). */
static inline void copy_input(uint8_t *dst, const void *src, size_t n)
{
    const uint8_t *p = src;
    if (n >= 8 && n <= 16) {
        uint64_t x, y;
        memcpy(&x, p, 8);
        memcpy(&y, p + n - 8, 8);
        memcpy(dst, &x, 8);
        memcpy(dst + n - 8, &y, 8);
    } else if (n >= 4 && n < 8) {
        uint32_t x, y;
        memcpy(&x, p, 4);
        memcpy(&y, p + n - 4, 4);
        memcpy(dst, &x, 4);
        memcpy(dst + n - 4, &y, 4);
    } else {
        memcpy(dst, p, n);
    }
}

/* The in-line all_reduce (a loss, a norm: the commonest collective of a
 * training loop), which is every step below with what does not apply to
 * it left out: post the hash, fingerprint and input; wait for every
 * line; compare the hashes; reduce from the lines in rank order. */
static tdist_status_t in_line_all_reduce(const tdist__coll_ctx_t *c, const tdist__coll_args_t *a,
                                         const tdist__coll_check_t *chk)
{
    const size_t hs = sizeof(uint64_t);
    uint8_t *aux = NULL, *blob = NULL;
    TDIST_CHECK(line_status(c, chk, tdist__shmc_begin(c, &blob, &aux)));
    uint64_t h = chk && chk->on ? chk->hash : 0;
    size_t fl = chk ? chk->len : 0, bytes = tdist__coll_bytes(a->count, a->dtype);
    if (fl == TDIST__COLL_FP_BYTES) /* pg/'s: a few moves, not a call */
        memcpy(aux, chk->common, TDIST__COLL_FP_BYTES);
    else if (fl)
        memcpy(aux, chk->common, fl);
    memcpy(blob, &h, hs);
    copy_input(blob + hs, a->sendbuf, bytes);
    if (a->redop == TDIST_PREMUL_SUM) TDIST_CHECK(tdist__oneshot_scale(a, blob + hs, bytes));
    tdist__shmc_post(c, hs + bytes, fl);
    const uint8_t **b = c->g->blobs;
    TDIST_CHECK(line_status(c, chk, tdist__shmc_gather(c, b, NULL)));
    if (chk && chk->on)
        for (int r = 0; r < c->size; r++)
            if (line_hash(b[r]) != h) return mismatch(c, chk, tdist__shmc_now(c));
    if (c->chosen && tdist__shmc_spun(c)) c->chosen[2] |= TDIST__COLL_CHOSEN_SPUN;
    tdist__shmc_prepare_next(c);
    /* Two ranks: a loss, a norm summed in place, without the calls; more
     * f32 values by the sum kernel, without the reduction's dispatch (the
     * blobs are 8-byte aligned, and the output is the caller's; a
     * premul_sum's inputs were scaled when posted). */
    if (c->size == 2) {
        bool sum = a->redop == TDIST_SUM || a->redop == TDIST_AVG || a->redop == TDIST_PREMUL_SUM;
        if (sum && a->dtype == TDIST_F32 && a->count > 16 && ((uintptr_t)a->recvbuf & 3) == 0)
            tdist__sum_f32(a->recvbuf, (const float *)(const void *)(b[0] + hs),
                           (const float *)(const void *)(b[1] + hs), a->count);
        else if (!tdist__sum_few(a->recvbuf, b[0] + hs, b[1] + hs, a->count, a->dtype, a->redop))
            return tdist__oneshot_reduce(c, a, b, hs, a->recvbuf);
        return a->redop == TDIST_AVG ? tdist__coll_finish(c, a->recvbuf, a->count, a->dtype,
                                                          a->redop)
                                     : TDIST_OK;
    }
    return tdist__oneshot_reduce(c, a, b, hs, a->recvbuf);
}

tdist_status_t tdist__coll_shm_line(const tdist__coll_ctx_t *c, const tdist__coll_args_t *a,
                                    const tdist__coll_check_t *chk, tdist__coll_algo_t algo)
{
    if (algo == TDIST__ALGO_SHM_IN_LINE && a->op == TDIST__OP_ALL_REDUCE)
        return in_line_all_reduce(c, a, chk);
    TDIST_CHECK(post_line(c, a, chk, algo));
    /* Only rank 0 collects a monitored barrier (over the transport, to
     * name who is missing); the line just keeps every rank's exchange
     * count and shows this call to a rank that issued something else. */
    if (algo == TDIST__ALGO_MONITORED) return tdist__coll_monitored_barrier(c, chk);
    tdist__oneshot_role_t role = TDIST__ROLE_ALL;
    if ((algo == TDIST__ALGO_SHM_IN_LINE ||
         (algo == TDIST__ALGO_SHM_ONE_SHOT &&
          tdist__oneshot_bytes(a, c->size) <= tdist__shmc_rooted_max())) &&
        a->op != TDIST__OP_ALL_REDUCE)
        role = tdist__oneshot_role(c, a, chk);
    if (role == TDIST__ROLE_SEND || role == TDIST__ROLE_FROM_ROOT)
        return rooted(c, a, chk, algo, role);
    const uint8_t **b = c->g->blobs;
    TDIST_CHECK(line_status(c, chk, tdist__shmc_gather(c, b, NULL)));
    if (chk && chk->on) {
        for (int r = 0; r < c->size; r++)
            if (line_hash(b[r]) != chk->hash) return mismatch(c, chk, tdist__shmc_now(c));
        if (a->op == TDIST__OP_ALL_TO_ALLV) TDIST_CHECK(chk->exchange(chk->arg, c->deadline_ms));
    }
    /* the line was the only wait: the recorder need not read the clock
     * again when that wait ended in its poll */
    if (c->chosen && (algo == TDIST__ALGO_NONE || algo == TDIST__ALGO_SHM_IN_LINE) &&
        tdist__shmc_spun(c))
        c->chosen[2] |= TDIST__COLL_CHOSEN_SPUN;
    tdist__shmc_prepare_next(c);
    if (role == TDIST__ROLE_FROM_ALL) tdist__shmc_prepare_rooted(c);
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
