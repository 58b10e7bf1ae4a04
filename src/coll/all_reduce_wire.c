/*
 * coll/all_reduce_wire.c — the all_reduce over a 16-bit wire: f32 values
 * in and out, f16 or bf16 on the wire (coll.h,
 * tdist__coll_all_reduce_wire). What a 16-bit compression hook needs
 * without its own passes over the gradients: the values are packed
 * (cast, divided, cast: core's tdist__wire16_pack) as they are staged and
 * unpacked as they are copied out.
 *
 * The input is a list of f32 buffers (the gradients where they live),
 * reduced as one flat vector; a cursor over the buffers maps a flat
 * element range onto the pieces of the buffers it covers. Routes:
 *   shared memory   the staged all_reduce with converters
 *                   (tdist__shmc_all_reduce_conv): every rank packs every
 *                   slice of its input straight into its staging slot, the
 *                   slices are summed in the wire dtype in rank order, and
 *                   the reduced 16-bit slices are unpacked into the
 *                   buffers — the gradients are read once and written once,
 *                   and half the bytes cross between the ranks;
 *   point-to-point  packed into the group's scratch, the 16-bit all_reduce
 *   or a backend    (the algorithm chosen by its size; a backend's
 *                   all_reduce slot), unpacked;
 *   one rank        each value becomes float(packed value).
 * The sum is the 16-bit all_reduce's: each addition rounded to the wire
 * (f32 arithmetic, rounded once), in the algorithm's order; every rank
 * gets the same bits.
 */
#include "coll/coll_internal.h"
#include "core/kernels.h"

#define PIECE 4096 /* values packed on the stack at a time (one rank) */

/* The flat vector over its buffers, and a cursor: buffer k starts at
 * element start. Moves either way (staging runs ahead of copying out). */
typedef struct segs {
    void *const *bufs;
    const size_t *counts;
    size_t n, k, start;
} segs_t;

static void seek(segs_t *s, size_t at)
{
    while (s->k > 0 && at < s->start) s->start -= s->counts[--s->k];
    while (s->k + 1 < s->n && at >= s->start + s->counts[s->k]) s->start += s->counts[s->k++];
}

/* The piece of [at, at + n) in the cursor's buffer: its f32 values and
 * how many (at least 1: at is inside the vector). */
static float *piece(segs_t *s, size_t at, size_t n, size_t *m)
{
    seek(s, at);
    size_t o = at - s->start;
    *m = TDIST_MIN(n, s->counts[s->k] - o);
    return (float *)s->bufs[s->k] + o;
}

typedef struct wire_job {
    segs_t in, out; /* two cursors over the same buffers */
    tdist_dtype_t wire;
    float divisor;
} wire_job_t;

static void load(void *arg, void *dst, size_t at, size_t n)
{
    wire_job_t *j = arg;
    uint16_t *d = dst;
    while (n) {
        size_t m;
        const float *x = piece(&j->in, at, n, &m);
        tdist__wire16_pack(d, x, m, j->divisor, j->wire);
        d += m;
        at += m;
        n -= m;
    }
}

static void store(void *arg, const void *src, size_t at, size_t n)
{
    wire_job_t *j = arg;
    const uint16_t *h = src;
    while (n) {
        size_t m;
        float *x = piece(&j->out, at, n, &m);
        tdist__wire16_unpack(x, h, m, j->wire);
        h += m;
        at += m;
        n -= m;
    }
}

/* Point-to-point or a backend: pack into scratch, the 16-bit all_reduce,
 * unpack. */
static tdist_status_t via_scratch(const tdist__coll_ctx_t *c, const tdist__coll_args_t *a,
                                  const tdist__coll_check_t *chk, wire_job_t *j)
{
    uint16_t *h = NULL;
    TDIST_CHECK(tdist__coll_scratch_get(c, a->count * sizeof *h, "all_reduce over a 16-bit wire",
                                        (void **)&h));
    load(j, h, 0, a->count);
    tdist__coll_args_t h16 = {.op = TDIST__OP_ALL_REDUCE, .sendbuf = h, .recvbuf = h,
                              .count = a->count, .dtype = a->dtype, .redop = TDIST_SUM,
                              .premul = 1.0, .root = -1};
    tdist__coll_ctx_t c2 = *c;
    c2.scratch = NULL; /* h holds it: the 16-bit algorithm allocates its own */
    tdist_status_t st;
    if (!c->tp && c->slots && c->slots->slot[TDIST__OP_ALL_REDUCE])
        st = c->slots->slot[TDIST__OP_ALL_REDUCE](c->be, &c2, &h16, chk);
    else
        st = tdist__coll_run_algo(&c2, &h16, chk, TDIST__ALGO_OP);
    if (st == TDIST_OK) store(j, h, 0, a->count);
    tdist__coll_scratch_done(c, h);
    return st;
}

tdist_status_t tdist__coll_all_reduce_wire(const tdist__coll_ctx_t *c, const tdist__coll_args_t *a,
                                           const tdist__coll_check_t *chk)
{
    if (a->count == 0) return TDIST_OK;
    wire_job_t j = {.in = {.bufs = a->bufs, .counts = a->counts, .n = a->nbufs},
                    .wire = a->dtype, .divisor = (float)a->premul};
    j.out = j.in;
    if (c->size == 1) {
        uint16_t h[PIECE];
        for (size_t at = 0; at < a->count; at += PIECE) {
            size_t n = TDIST_MIN((size_t)PIECE, a->count - at);
            load(&j, h, at, n);
            store(&j, h, at, n);
        }
        return TDIST_OK;
    }
    if (c->shm && c->ar_forced == TDIST__AR_AUTO) {
        tdist__shmc_conv_t conv = {load, store, &j};
        return tdist__shmc_all_reduce_conv(c, a->count, a->dtype, TDIST_SUM, &conv);
    }
    return via_scratch(c, a, chk, &j);
}
