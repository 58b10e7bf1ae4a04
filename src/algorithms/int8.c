/*
 * algorithms/int8.c — the int8 quantised all_reduce comm hook: each DDP
 * bucket crosses the network as int8 codes with one f32 scale per block,
 * about a quarter of the bytes of an f32 all_reduce. See
 * tdist/algorithms.h for what it computes; docs/algorithms.md for why.
 *
 * One bucket, on a group of W ranks (this rank R):
 *
 *   hook          x = f32(bucket) (+ this rank's input residual); shard p of
 *                 x quantised into message p of `send`; all_to_all(send ->
 *                 recv) posted; returns (work, reduce_shard)
 *   reduce_shard  the input residual committed; message r of `recv` is
 *                 rank r's quantised shard R: dequantised and summed in
 *                 rank order, divided by the divisor (+ the sum residual),
 *                 quantised into `mine`; all_gather(mine -> send) posted;
 *                 returns (work, finish)
 *   finish        message r of `send` is shard r of the result, the same
 *                 bytes on every rank: dequantised into the bucket
 *
 * The shards and blocks follow the flat bucket layout (bucket->offsets),
 * the same on every rank whether the hook reads the bucket or, registered
 * with TDIST_DDP_HOOK_GRADS (tdist_int8_register), the gradients where
 * they live: a shard, and a block, may span a parameter boundary, and the
 * bits are those of the bucket path. On the gradients an f32 bucket
 * without the input residual is quantised a chunk (whole blocks, in L1)
 * at a time, read from the gradients directly or gathered when the chunk
 * spans parameters, and the result is dequantised straight into them: no
 * copy of the bucket either way.
 *
 * A message is [scales: f32 x blocks][codes: int8 x shard length][zero
 * padding]: every message has the size of the longest shard's, rounded up
 * to 4 bytes, so both collectives have equal splits (shards differ by at
 * most one element). Code -128 marks a value that is not finite; codes of
 * finite values are in [-127, 127].
 *
 * State: one slot per bucket index (staging buffers, grown and reused; a
 * slot is used from the hook call to the bucket's last continuation, all
 * inside one iteration), and the error-feedback residuals keyed by
 * parameter index (so they follow a parameter when the reducer rebuilds
 * its buckets). Everything is allocated in the hook, before anything is
 * sent; the continuations do not allocate.
 */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "algorithms/internal.h"

#define WHO "tdist_int8_hook"
#define NONFINITE_CODE (-128)
#define SUM_CHUNK 4096 /* elements of the shard's sum handled at a time (L1) */

/* Where a bucket's elements go on a group. */
typedef struct layout {
    int size, rank;
    size_t n, block;
    size_t max_len;   /* the longest shard: ceil(n / size) */
    size_t codes_at;  /* byte offset of the codes in a message */
    size_t msg;       /* bytes of one message */
} layout_t;

typedef struct slot {
    unsigned char *send; /* size * msg: the all_to_all's input, then the all_gather's output */
    unsigned char *recv; /* size * msg: the all_to_all's output */
    unsigned char *mine; /* msg: this rank's reduced shard, quantised */
    float *x;            /* n: the input (+ residual), then its new residual */
    float *acc;          /* max_len: this rank's shard of the sum */
    float *tmp;          /* a chunk of the gradients gathered (the hook on them) */
    size_t cap_send, cap_recv, cap_mine, cap_x, cap_acc, cap_tmp;
    layout_t lay;
} slot_t;

/* The residuals of one parameter (count elements each; NULL until used). */
typedef struct resid {
    float *in;  /* this rank's input quantisation error */
    float *sum; /* the quantisation error of the averaged elements this rank owns */
    size_t count;
} resid_t;

struct tdist_int8 {
    size_t block;
    bool ef_in, ef_sum;
    char desc[TDIST__AGREE_DESC]; /* "int8_allreduce(block 256, ef in+sum)" */
    uint64_t config;
    tdist__agree_t agree;
    slot_t *slots;
    size_t nslots;
    resid_t *res;
    size_t nres;
    tdist_int8_stats_t stats;
};

void tdist_int8_opts_init(tdist_int8_opts_t *opts)
{
    if (!opts) return;
    memset(opts, 0, sizeof *opts);
    opts->block_size = TDIST_INT8_DEFAULT_BLOCK;
}

/* ---------------------------------------------------------- quantisation */

static size_t nblocks(size_t len, size_t block) { return len / block + (len % block != 0); }

static float value_of(int8_t q, float s) { return q == NONFINITE_CODE ? NAN : (float)q * s; }

/* Quantise n values of src in blocks: codes, and the scales as bytes
 * (unaligned). resid (NULL, or src itself): src - dequantised, 0 where src
 * is not finite. Returns how many values were not finite. The rules (the
 * scale, rounding half away from zero, -128 for a value that is not
 * finite) are written out in hook_kernels.c. */
static size_t quantise(int8_t *codes, unsigned char *scales, const float *src, float *resid,
                       size_t n, size_t block)
{
    return tdist__int8_quantise(codes, scales, src, resid, n, block);
}

/* dst[i] = dequantised value i (add: dst[i] += it), n values in blocks. */
static void dequantise(float *dst, const int8_t *codes, const unsigned char *scales, size_t n,
                       size_t block, bool add)
{
    tdist__int8_dequantise(dst, codes, scales, n, block, add);
}

tdist_status_t tdist_int8_quantize(int8_t *codes, float *scales, const float *src, size_t n,
                                   size_t block)
{
    if (block == 0)
        return tdist__error(TDIST_ERR_INVALID_ARG, "tdist_int8_quantize: block is 0");
    if (n > 0 && (!codes || !scales || !src))
        return tdist__error(TDIST_ERR_INVALID_ARG, "tdist_int8_quantize: a buffer is NULL with n = %zu", n);
    quantise(codes, (unsigned char *)scales, src, NULL, n, block);
    return TDIST_OK;
}

tdist_status_t tdist_int8_dequantize(float *dst, const int8_t *codes, const float *scales,
                                     size_t n, size_t block)
{
    if (block == 0)
        return tdist__error(TDIST_ERR_INVALID_ARG, "tdist_int8_dequantize: block is 0");
    if (n > 0 && (!codes || !scales || !dst))
        return tdist__error(TDIST_ERR_INVALID_ARG, "tdist_int8_dequantize: a buffer is NULL with n = %zu", n);
    dequantise(dst, codes, (const unsigned char *)scales, n, block, false);
    return TDIST_OK;
}

/* ------------------------------------------------------------ the layout */

/* Shard r of the bucket: [*off, *off + *len); the first n % size shards
 * have one element more. */
static void shard_of(const layout_t *l, int r, size_t *off, size_t *len)
{
    size_t base = l->n / (size_t)l->size, rem = l->n % (size_t)l->size, ur = (size_t)r;
    *off = ur * base + TDIST_MIN(ur, rem);
    *len = base + (ur < rem);
}

static tdist_status_t layout_of(const tdist_int8_t *st, const tdist_ddp_bucket_t *b, layout_t *l)
{
    l->size = tdist_pg_size(b->pg);
    l->rank = tdist_pg_rank(b->pg);
    l->n = b->count;
    l->block = st->block;
    l->max_len = l->n / (size_t)l->size + (l->n % (size_t)l->size != 0);
    size_t nb = nblocks(l->max_len, l->block);
    l->codes_at = nb * sizeof(float);
    size_t bytes = l->codes_at + l->max_len;
    l->msg = bytes + (4 - bytes % 4) % 4;
    if (nb > SIZE_MAX / 8 || l->msg > SIZE_MAX / (size_t)l->size)
        return tdist__hook_error(b, TDIST_ERR_INVALID_ARG, WHO,
                                 "%zu elements on %d ranks overflow size_t", l->n, l->size);
    return TDIST_OK;
}

/* --------------------------------------------------------------- state */

/* What every rank must agree on: the block size and the error feedback. */
static void set_identity(tdist_int8_t *st)
{
    uint64_t block = st->block;
    uint8_t ef = (uint8_t)((st->ef_in ? 1 : 0) | (st->ef_sum ? 2 : 0));
    uint64_t h = tdist__fnv1a(TDIST__FNV_INIT, "int8", 4);
    h = tdist__fnv1a(h, &block, sizeof block);
    st->config = tdist__fnv1a(h, &ef, sizeof ef);
    const char *ef_name[4] = {"", ", error feedback in", ", error feedback sum",
                              ", error feedback in+sum"};
    snprintf(st->desc, sizeof st->desc, "int8_allreduce(block %zu%s)", st->block, ef_name[ef]);
}

tdist_status_t tdist_int8_hook_create(const tdist_int8_opts_t *opts, tdist_int8_t **out)
{
    const char *fn = "tdist_int8_hook_create";
    tdist_int8_opts_t o;
    tdist_int8_opts_init(&o);
    if (opts) o = *opts;
    if (!out) return tdist__error(TDIST_ERR_INVALID_ARG, "%s: out is NULL", fn);
    if (o.block_size == 0)
        return tdist__error(TDIST_ERR_INVALID_ARG,
                            "%s: opts.block_size is 0; a block needs at least one value (default %d)",
                            fn, TDIST_INT8_DEFAULT_BLOCK);
    if (o.block_size > TDIST_INT8_MAX_BLOCK)
        return tdist__error(TDIST_ERR_INVALID_ARG, "%s: opts.block_size %zu is above %d", fn,
                            o.block_size, TDIST_INT8_MAX_BLOCK);
    tdist_int8_t *st = calloc(1, sizeof *st);
    if (!st) return tdist__error(TDIST_ERR_NO_MEMORY, "%s: out of memory", fn);
    st->block = o.block_size;
    st->ef_in = o.error_feedback;
    st->ef_sum = o.sum_error_feedback;
    set_identity(st);
    *out = st;
    return TDIST_OK;
}

void tdist_int8_destroy(tdist_int8_t *st)
{
    if (!st) return;
    for (size_t i = 0; i < st->nslots; i++) {
        slot_t *s = &st->slots[i];
        free(s->send);
        free(s->recv);
        free(s->mine);
        free(s->x);
        free(s->acc);
        free(s->tmp);
    }
    for (size_t i = 0; i < st->nres; i++) {
        free(st->res[i].in);
        free(st->res[i].sum);
    }
    free(st->slots);
    free(st->res);
    free(st);
}

tdist_status_t tdist_int8_register(tdist_ddp_t *ddp, tdist_int8_t *st)
{
    if (!ddp || !st)
        return tdist__error(TDIST_ERR_INVALID_ARG, "tdist_int8_register: %s is NULL",
                            !ddp ? "ddp" : "the int8 hook state");
    /* the hook reads the gradients where they are and leaves the result
     * there: the reducer's copies into the bucket and back are not needed */
    return tdist_ddp_register_comm_hook_flags(ddp, st, tdist_int8_hook, TDIST_DDP_HOOK_GRADS);
}

tdist_status_t tdist_int8_get_stats(const tdist_int8_t *st, tdist_int8_stats_t *out)
{
    if (!st || !out)
        return tdist__error(TDIST_ERR_INVALID_ARG, "tdist_int8_get_stats: %s is NULL",
                            !st ? "the int8 hook state" : "out");
    *out = st->stats;
    return TDIST_OK;
}

/* ------------------------------------------------------- buffers, residuals */

/* *p with room for need elements of esize bytes (contents not kept). */
static int grow(void **p, size_t *cap, size_t need, size_t esize)
{
    if (*cap >= need && *p) return 0;
    void *q = malloc(TDIST_MAX(need, (size_t)1) * esize);
    if (!q) return -1;
    free(*p);
    *p = q;
    *cap = need;
    return 0;
}

/* Parameter p's residual arrays, zero-filled when first used. */
static int resid_arrays(tdist_int8_t *st, size_t p, size_t count)
{
    if (p >= st->nres) {
        size_t n = TDIST_MAX(p + 1, 2 * st->nres);
        resid_t *r = realloc(st->res, n * sizeof *r);
        if (!r) return -1;
        memset(r + st->nres, 0, (n - st->nres) * sizeof *r);
        st->res = r;
        st->nres = n;
    }
    resid_t *r = &st->res[p];
    if (r->count != count) {
        free(r->in);
        free(r->sum);
        r->in = r->sum = NULL;
        r->count = count;
    }
    if (st->ef_in && !r->in && !(r->in = calloc(TDIST_MAX(count, (size_t)1), sizeof(float))))
        return -1;
    if (st->ef_sum && !r->sum && !(r->sum = calloc(TDIST_MAX(count, (size_t)1), sizeof(float))))
        return -1;
    return 0;
}

/* Elements quantised or summed at a time: whole blocks, about L1's worth. */
static size_t chunk_of(const layout_t *l) { return l->block * TDIST_MAX((size_t)1, SUM_CHUNK / l->block); }

/* Bucket b's slot with its layout and buffers, and the residual arrays of
 * its parameters. */
static tdist_status_t slot_for(tdist_int8_t *st, const tdist_ddp_bucket_t *b, slot_t **out)
{
    size_t need = TDIST_MAX(b->num_buckets, b->index + 1);
    if (need > st->nslots) {
        slot_t *s = realloc(st->slots, need * sizeof *s);
        if (!s) return tdist__hook_error(b, TDIST_ERR_NO_MEMORY, WHO, "out of memory");
        memset(s + st->nslots, 0, (need - st->nslots) * sizeof *s);
        st->slots = s;
        st->nslots = need;
    }
    slot_t *s = &st->slots[b->index];
    TDIST_CHECK(layout_of(st, b, &s->lay));
    const layout_t *l = &s->lay;
    size_t msgs = l->msg * (size_t)l->size;
    if (grow((void **)&s->send, &s->cap_send, msgs, 1) ||
        grow((void **)&s->recv, &s->cap_recv, msgs, 1) ||
        grow((void **)&s->mine, &s->cap_mine, l->msg, 1) ||
        grow((void **)&s->x, &s->cap_x, l->n, sizeof(float)) ||
        grow((void **)&s->acc, &s->cap_acc, l->max_len, sizeof(float)) ||
        grow((void **)&s->tmp, &s->cap_tmp, chunk_of(l), sizeof(float)))
        goto oom;
    if (st->ef_in || st->ef_sum)
        for (size_t j = 0; j < b->num_params; j++)
            if (resid_arrays(st, b->param_indices[j], b->counts[j])) goto oom;
    *out = s;
    return TDIST_OK;
oom:
    return tdist__hook_error(b, TDIST_ERR_NO_MEMORY, WHO,
                             "out of memory for the staging of %zu elements (%zu-byte messages)",
                             l->n, l->msg);
}

enum { RESID_IN, RESID_SUM };

/* Between the residuals of bucket elements [lo, hi) and buf[0 .. hi - lo):
 * add them into buf (store false), or store buf into them (store true).
 * Storing the sum residuals zeroes those outside [lo, hi) too: they
 * belong to elements another rank owns now. Elements outside every
 * parameter have no residual. */
static void move_resid(tdist_int8_t *st, const tdist_ddp_bucket_t *b, int which, bool store,
                       float *buf, size_t lo, size_t hi)
{
    for (size_t j = 0; j < b->num_params; j++) {
        const resid_t *r = &st->res[b->param_indices[j]];
        float *arr = which == RESID_IN ? r->in : r->sum;
        size_t o = b->offsets[j], c = b->counts[j];
        if (store && which == RESID_SUM) memset(arr, 0, c * sizeof *arr);
        size_t a = TDIST_MAX(o, lo), e = TDIST_MIN(o + c, hi);
        for (size_t k = a; k < e; k++) {
            if (store)
                arr[k - o] = buf[k - lo];
            else
                buf[k - lo] = buf[k - lo] + arr[k - o];
        }
    }
}

/* -------------------------------------------------------------- the hook */

/* The part of bucket elements [lo, hi) that parameter j holds: [*a, *e)
 * (empty when *a >= *e). */
static void part_of(const tdist_ddp_bucket_t *b, size_t j, size_t lo, size_t hi, size_t *a,
                    size_t *e)
{
    *a = TDIST_MAX(b->offsets[j], lo);
    *e = TDIST_MIN(b->offsets[j] + b->counts[j], hi);
}

/* Bucket elements [lo, hi) as f32 into dst: from the gradients (zeros
 * between parameters, as the bucket holds) or the bucket; f64 rounded
 * once. */
static void gather(const tdist_ddp_bucket_t *b, float *dst, size_t lo, size_t hi)
{
    if (!b->grads) {
        if (b->dtype == TDIST_F32)
            memcpy(dst, (const float *)b->buffer + lo, (hi - lo) * sizeof *dst);
        else
            for (size_t i = lo; i < hi; i++) dst[i - lo] = (float)((const double *)b->buffer)[i];
        return;
    }
    memset(dst, 0, (hi - lo) * sizeof *dst);
    for (size_t j = 0; j < b->num_params; j++) {
        size_t a, e;
        part_of(b, j, lo, hi, &a, &e);
        size_t o = b->offsets[j];
        if (a >= e) continue;
        if (b->dtype == TDIST_F32)
            memcpy(dst + (a - lo), (const float *)b->grads[j] + (a - o), (e - a) * sizeof *dst);
        else
            for (size_t i = a; i < e; i++) dst[i - lo] = (float)((const double *)b->grads[j])[i - o];
    }
}

/* The f32 input to quantise: the bucket itself when it is f32 and there
 * is no input residual to add (no copy); NULL for the same on the
 * gradients (quantised chunk by chunk from them: quantise_shards); else x
 * = the input as f32 (f64 rounded once), plus the input residual. */
static const float *load_input(tdist_int8_t *st, slot_t *s, const tdist_ddp_bucket_t *b)
{
    if (b->dtype == TDIST_F32 && !st->ef_in) return b->grads ? NULL : b->buffer;
    gather(b, s->x, 0, b->count);
    if (st->ef_in) move_resid(st, b, RESID_IN, false, s->x, 0, b->count);
    return s->x;
}

/* Bucket elements [lo, hi) of an f32 bucket on its gradients: a pointer
 * into one gradient when they lie in it, else gathered into tmp. */
static const float *grads_chunk(const tdist_ddp_bucket_t *b, float *tmp, size_t lo, size_t hi)
{
    for (size_t j = 0; j < b->num_params; j++) {
        size_t o = b->offsets[j];
        if (lo >= o && hi <= o + b->counts[j]) return (const float *)b->grads[j] + (lo - o);
    }
    gather(b, tmp, lo, hi);
    return tmp;
}

/* Zero what a message of a shard of len elements does not fill: the
 * scales of blocks it lacks and the codes past len (the padding goes on
 * the wire too). */
static void zero_unused(const layout_t *l, unsigned char *m, size_t len)
{
    size_t used = nblocks(len, l->block) * sizeof(float);
    memset(m + used, 0, l->codes_at - used);
    memset(m + l->codes_at + len, 0, l->msg - l->codes_at - len);
}

/* Shard p of x into message p of send; with the input residual, x (then
 * this slot's own copy) becomes the input's residual. x NULL: the bucket's
 * gradients, a chunk at a time. */
static void quantise_shards(tdist_int8_t *st, slot_t *s, const tdist_ddp_bucket_t *b,
                            const float *x)
{
    const layout_t *l = &s->lay;
    const size_t chunk = chunk_of(l);
    for (int p = 0; p < l->size; p++) {
        size_t off, len;
        shard_of(l, p, &off, &len);
        unsigned char *m = s->send + (size_t)p * l->msg;
        int8_t *codes = (int8_t *)(m + l->codes_at);
        zero_unused(l, m, len);
        if (x) {
            st->stats.nonfinite_in += quantise(codes, m, x + off, st->ef_in ? s->x + off : NULL,
                                               len, l->block);
            continue;
        }
        for (size_t c0 = 0; c0 < len; c0 += chunk) {
            size_t cn = TDIST_MIN(chunk, len - c0);
            const float *g = grads_chunk(b, s->tmp, off + c0, off + c0 + cn);
            st->stats.nonfinite_in += quantise(codes + c0, m + c0 / l->block * sizeof(float), g,
                                               NULL, cn, l->block);
        }
    }
}

/* Shard elements [a, e) (message m, codes and scales of the shard) into
 * dst[0 .. e - a) as f32: a partial first block, then whole blocks and the
 * tail. */
static void dequantise_f32(float *dst, const layout_t *l, const unsigned char *m, size_t a,
                           size_t e)
{
    const int8_t *codes = (const int8_t *)(m + l->codes_at);
    size_t head = TDIST_MIN(e, (a / l->block + 1) * l->block);
    if (a % l->block) {
        dequantise(dst, codes + a, m + a / l->block * sizeof(float), head - a, l->block, false);
        dst += head - a;
        a = head;
    }
    if (a < e) dequantise(dst, codes + a, m + a / l->block * sizeof(float), e - a, l->block, false);
}

/* The same into f64 values. */
static void dequantise_f64(double *dst, const layout_t *l, const unsigned char *m, size_t a,
                           size_t e)
{
    const int8_t *codes = (const int8_t *)(m + l->codes_at);
    for (size_t i = a; i < e; i++) {
        float sc;
        memcpy(&sc, m + i / l->block * sizeof sc, sizeof sc);
        dst[i - a] = value_of(codes[i], sc);
    }
}

/* Shard r (bucket elements [off, off + len), message m) of the result into
 * the bucket, or into the parts of the gradients it covers. */
static void result_shard(const tdist_ddp_bucket_t *b, const layout_t *l, const unsigned char *m,
                         size_t off, size_t len)
{
    bool f32 = b->dtype == TDIST_F32;
    if (!b->grads) {
        if (f32)
            dequantise_f32((float *)b->buffer + off, l, m, 0, len);
        else
            dequantise_f64((double *)b->buffer + off, l, m, 0, len);
        return;
    }
    for (size_t j = 0; j < b->num_params; j++) {
        size_t a, e, o = b->offsets[j];
        part_of(b, j, off, off + len, &a, &e);
        if (a >= e) continue;
        if (f32)
            dequantise_f32((float *)b->grads[j] + (a - o), l, m, a - off, e - off);
        else
            dequantise_f64((double *)b->grads[j] + (a - o), l, m, a - off, e - off);
    }
}

/* The last step: every shard of the result into the bucket. */
static tdist_status_t finish(void *state, const tdist_ddp_bucket_t *b, tdist_ddp_hook_result_t *next)
{
    (void)next;
    tdist_int8_t *st = state;
    const slot_t *s = &st->slots[b->index];
    const layout_t *l = &s->lay;
    for (int r = 0; r < l->size; r++) {
        size_t off, len;
        shard_of(l, r, &off, &len);
        result_shard(b, l, s->send + (size_t)r * l->msg, off, len);
    }
    size_t w = (size_t)l->size;
    st->stats.buckets++;
    st->stats.elements += l->n;
    st->stats.bytes_sent += 2 * (w - 1) * l->msg;
    st->stats.f32_ring_bytes += 2 * (w - 1) * 4 * l->n / w;
    return TDIST_OK;
}

/* Elements [c0, c0 + cn) of this rank's shard of the sum, into acc: the
 * ranks' dequantised values added in rank order from 0, then divided by
 * the divisor. c0 is a multiple of the block size. */
static void sum_chunk(const layout_t *l, const unsigned char *recv, float *acc, size_t c0,
                      size_t cn, float divisor)
{
    for (size_t i = 0; i < cn; i++) acc[i] = 0.0f;
    for (int r = 0; r < l->size; r++) {
        const unsigned char *m = recv + (size_t)r * l->msg;
        dequantise(acc, (const int8_t *)(m + l->codes_at) + c0,
                   m + c0 / l->block * sizeof(float), cn, l->block, true);
    }
    for (size_t i = 0; i < cn; i++) acc[i] = acc[i] / divisor;
}

/* This rank's shard: the ranks' contributions dequantised and summed in
 * rank order, divided by the divisor, (+ the sum residual), quantised into
 * mine; the all_gather of every rank's shard posted. */
static tdist_status_t reduce_shard(void *state, const tdist_ddp_bucket_t *b,
                                   tdist_ddp_hook_result_t *next)
{
    tdist_int8_t *st = state;
    slot_t *s = &st->slots[b->index];
    const layout_t *l = &s->lay;
    if (st->ef_in) move_resid(st, b, RESID_IN, true, s->x, 0, l->n);
    size_t off, len;
    shard_of(l, l->rank, &off, &len);
    float *acc = s->acc;
    int8_t *mine = (int8_t *)(s->mine + l->codes_at);
    zero_unused(l, s->mine, len);
    /* chunks of whole blocks, each summed, divided and (without the sum
     * residual) quantised while it is in cache */
    const size_t chunk = chunk_of(l);
    for (size_t c0 = 0; c0 < len; c0 += chunk) {
        size_t cn = TDIST_MIN(chunk, len - c0);
        sum_chunk(l, s->recv, acc + c0, c0, cn, (float)b->divisor);
        if (!st->ef_sum)
            st->stats.nonfinite_out += quantise(mine + c0, s->mine + c0 / l->block * sizeof(float),
                                                acc + c0, NULL, cn, l->block);
    }
    if (st->ef_sum) {
        move_resid(st, b, RESID_SUM, false, acc, off, off + len);
        st->stats.nonfinite_out += quantise(mine, s->mine, acc, acc, len, l->block);
        move_resid(st, b, RESID_SUM, true, acc, off, off + len);
    }
    tdist_status_t rc = tdist_all_gather(b->pg, s->mine, s->send, l->msg, TDIST_U8, NULL, &next->work);
    if (rc != TDIST_OK)
        return tdist__error_context(rc, "%s: %s bucket %zu: all_gather of the reduced shards "
                                        "(%zu bytes each)",
                                    WHO, st->desc, b->index, l->msg);
    next->then = finish;
    return TDIST_OK;
}

static tdist_status_t check_params(const tdist_ddp_bucket_t *b)
{
    if (b->num_params > 0 && (!b->param_indices || !b->offsets || !b->counts))
        return tdist__hook_error(b, TDIST_ERR_INVALID_ARG, WHO,
                                 "the bucket lists %zu parameters but no indices, offsets or counts",
                                 b->num_params);
    for (size_t j = 0; j < b->num_params; j++)
        if (b->offsets[j] > b->count || b->counts[j] > b->count - b->offsets[j])
            return tdist__hook_error(b, TDIST_ERR_INVALID_ARG, WHO,
                                     "parameter %zu (offset %zu, %zu elements) lies outside the "
                                     "bucket's %zu elements",
                                     b->param_indices[j], b->offsets[j], b->counts[j], b->count);
    return TDIST_OK;
}

static tdist_status_t check_call(const tdist_int8_t *st, const tdist_ddp_bucket_t *b,
                                 const tdist_ddp_hook_result_t *result)
{
    TDIST_CHECK(tdist__hook_check(st, b, result, WHO, "tdist_int8_hook_create",
                                  "tdist_int8_register", st ? st->desc : NULL, TDIST__HOOK_F32_F64,
                                  "int8 quantisation takes f32 or f64 buckets"));
    return check_params(b);
}

tdist_status_t tdist_int8_hook(void *state, const tdist_ddp_bucket_t *bucket,
                               tdist_ddp_hook_result_t *result)
{
    tdist_int8_t *st = state;
    TDIST_CHECK(check_call(st, bucket, result));
    TDIST_CHECK(tdist__agree(&st->agree, bucket, WHO, "int8", st->desc, st->config));
    slot_t *s = NULL;
    TDIST_CHECK(slot_for(st, bucket, &s));
    quantise_shards(st, s, bucket, load_input(st, s, bucket));
    const layout_t *l = &s->lay;
    tdist_status_t rc = tdist_all_to_all(bucket->pg, s->send, s->recv, l->msg, TDIST_U8, NULL,
                                         &result->work);
    if (rc != TDIST_OK)
        return tdist__error_context(rc, "%s: %s bucket %zu: all_to_all of the quantised shards "
                                        "(%zu bytes to each rank)",
                                    WHO, st->desc, bucket->index, l->msg);
    result->then = reduce_shard;
    return TDIST_OK;
}
