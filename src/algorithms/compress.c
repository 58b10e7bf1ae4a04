/*
 * algorithms/compress.c — 16-bit compression of DDP buckets: the
 * compression hook (PyTorch's fp16_compress_hook / bf16_compress_hook) and
 * the wrapper around another hook (fp16_compress_wrapper /
 * bf16_compress_wrapper). See tdist/algorithms.h for what they compute.
 *
 * One state serves one reducer. It keeps, per bucket index, a slot: the
 * 16-bit staging buffer (grown, never shrunk, reused every iteration), and
 * for the wrapper the 16-bit bucket the inner hook sees and the inner
 * continuation still to run. A slot is in use from the hook call until the
 * bucket's last continuation; the reducer runs every continuation of an
 * iteration inside backward_end, before the next iteration calls the hook
 * again, so a slot is never shared by two iterations. The slot array only
 * grows on a bucket-0 call (the first of an iteration), never while an
 * inner hook may hold a pointer to a slot's bucket.
 *
 * The wrapper's chain: hook -> inner hook (work W1, continuation T1) ->
 * the reducer waits W1 and calls wrapper_then -> T1(inner state, 16-bit
 * bucket) -> (W2, T2) handed to the reducer as (W2, wrapper_then) ... and
 * when the inner chain is exhausted, the cast back.
 *
 * An f32 bucket of the compression hook takes one all_reduce over the
 * 16-bit wire (tdist_all_reduce_wire), which casts, divides and casts the
 * gradients while it stages them and casts the sum back while it copies
 * it out: the hook itself makes no pass over the bucket. Other dtypes and
 * the wrapper cast into the slot's staging buffer and back.
 *
 * The casts, PyTorch 1.13's bit for bit (tests/algorithms/test_compress.c
 * checks them against PyTorch's recording):
 *   hook:    h = wire( fl( float(wire(fl(g))) / W ) ); the division's
 *            result goes through c10's scalar conversion, so a NaN comes
 *            out as f16 sign|0x7E00 or bf16 0x7FC0 whatever its payload;
 *   wrapper: h = wire(fl(g)) as Tensor.to() does it: f16 by the F16C
 *            instruction (tdist's converter gives the same bits, NaN
 *            payload included); bf16 from f32 by ATen's vectorised
 *            conversion, whose NaN is 0xFFFF; from f64 by the scalar one
 *            (0x7FC0);
 *   back:    float(h), exact.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "algorithms/internal.h"
#include "core/kernels.h"

#define WHO "tdist_compress_hook"
#define CHUNK 4096 /* elements converted per pass (on the stack as f32 unless f32) */

typedef struct slot {
    uint16_t *wire;              /* cap 16-bit values */
    size_t cap;
    tdist_ddp_bucket_t b16;      /* wrapper: the bucket the inner hook sees */
    tdist_ddp_then_fn inner_then; /* wrapper: the inner continuation to run next */
} slot_t;

struct tdist_compress {
    tdist_dtype_t wire;
    tdist_ddp_comm_hook_fn inner; /* NULL: the compression hook */
    void *inner_state;
    char *inner_name;
    char desc[TDIST__AGREE_DESC]; /* "fp16_compress_hook", "bf16_compress_wrapper(x)" */
    uint64_t config;              /* hash of wire, kind and inner name */
    void (*observe)(void *arg, const tdist_ddp_bucket_t *bucket, const uint16_t *wire,
                    bool reduced);
    void *observe_arg;
    tdist__agree_t agree;
    slot_t *slots;
    size_t nslots;
};

void tdist_compress_opts_init(tdist_compress_opts_t *opts)
{
    if (!opts) return;
    memset(opts, 0, sizeof *opts);
    opts->wire = TDIST_F16;
}

/* --------------------------------------------------------------- casts */

static void to_wire(uint16_t *dst, const float *src, size_t n, tdist_dtype_t wire)
{
    if (wire == TDIST_F16)
        tdist_f32_to_f16_n(dst, src, n);
    else
        tdist_f32_to_bf16_n(dst, src, n);
}

static void from_wire(float *dst, const uint16_t *src, size_t n, tdist_dtype_t wire)
{
    if (wire == TDIST_F16)
        tdist_f16_to_f32_n(dst, src, n);
    else
        tdist_bf16_to_f32_n(dst, src, n);
}

static bool is_nan16(uint16_t h, tdist_dtype_t wire)
{
    return wire == TDIST_F16 ? (h & 0x7fffu) > 0x7c00u : (h & 0x7fffu) > 0x7f80u;
}

/* Elements [i, i + n) of a bucket buffer of dtype dt as f32: a pointer
 * into buf for f32, else converted into tmp (f64 rounded once). */
static const float *as_f32(const void *buf, tdist_dtype_t dt, size_t i, size_t n, float *tmp)
{
    switch (dt) {
    case TDIST_F32: return (const float *)buf + i;
    case TDIST_F64:
        for (size_t k = 0; k < n; k++) tmp[k] = (float)((const double *)buf)[i + k];
        return tmp;
    case TDIST_F16: tdist_f16_to_f32_n(tmp, (const uint16_t *)buf + i, n); return tmp;
    default: tdist_bf16_to_f32_n(tmp, (const uint16_t *)buf + i, n); return tmp;
    }
}

/* count values of dtype dt at buf cast to the wire format into wire:
 * with the division by the divisor (the hook) or without (the wrapper). */
static void compress_run(const tdist_compress_t *c, uint16_t *wire, const void *buf,
                         tdist_dtype_t dt, size_t count, float dv)
{
    float tmp[CHUNK];
    const tdist_dtype_t wt = c->wire;
    for (size_t i = 0; i < count; i += CHUNK) {
        size_t n = TDIST_MIN((size_t)CHUNK, count - i);
        uint16_t *h = wire + i;
        const float *g = as_f32(buf, dt, i, n, tmp);
        if (!c->inner) {
            tdist__wire16_pack(h, g, n, dv, wt); /* one fused pass */
            continue;
        }
        to_wire(h, g, n, wt);
        /* Tensor.to(bfloat16): 0xFFFF from f32 (vectorised), 0x7FC0 otherwise */
        if (wt == TDIST_BF16)
            for (size_t k = 0; k < n; k++)
                if (is_nan16(h[k], wt)) h[k] = dt == TDIST_F32 ? 0xffffu : 0x7fc0u;
    }
}

/* The bucket cast into wire (the hook: divided by dv): from the flat
 * buffer, or (a hook on the gradients) from each gradient straight into
 * its place in wire. */
static void compress(const tdist_compress_t *c, uint16_t *wire, const tdist_ddp_bucket_t *b,
                     float dv)
{
    if (!b->grads) {
        compress_run(c, wire, b->buffer, b->dtype, b->count, dv);
        return;
    }
    for (size_t k = 0; k < b->num_params; k++)
        compress_run(c, wire + b->offsets[k], b->grads[k], b->dtype, b->counts[k], dv);
}

/* count 16-bit results cast back into buf of dtype dt (exact for f32 and
 * f64). */
static void decompress_run(const tdist_compress_t *c, const uint16_t *wire, void *buf,
                           tdist_dtype_t dt, size_t count)
{
    if (dt == TDIST_F32) {
        from_wire(buf, wire, count, c->wire);
        return;
    }
    if (dt == c->wire) {
        memcpy(buf, wire, count * sizeof *wire);
        return;
    }
    float tmp[CHUNK];
    for (size_t i = 0; i < count; i += CHUNK) {
        size_t n = TDIST_MIN((size_t)CHUNK, count - i);
        from_wire(tmp, wire + i, n, c->wire);
        if (dt == TDIST_F64)
            for (size_t k = 0; k < n; k++) ((double *)buf)[i + k] = (double)tmp[k];
        else
            to_wire((uint16_t *)buf + i, tmp, n, dt);
    }
}

/* The result cast back into the flat buffer, or into each gradient. */
static void decompress(const tdist_compress_t *c, const uint16_t *wire, const tdist_ddp_bucket_t *b)
{
    if (!b->grads) {
        decompress_run(c, wire, b->buffer, b->dtype, b->count);
        return;
    }
    for (size_t k = 0; k < b->num_params; k++)
        decompress_run(c, wire + b->offsets[k], b->grads[k], b->dtype, b->counts[k]);
}

/* ----------------------------------------------------------- the state */

static const char *wire_prefix(tdist_dtype_t wire) { return wire == TDIST_F16 ? "fp16" : "bf16"; }

/* A state with the options checked; out: the caller's out (checked). */
static tdist_status_t create(const tdist_compress_opts_t *opts, const char *fn,
                             tdist_compress_t **out, tdist_compress_t *const *user_out)
{
    tdist_compress_opts_t o;
    tdist_compress_opts_init(&o);
    if (opts) o = *opts;
    if (!user_out) return tdist__error(TDIST_ERR_INVALID_ARG, "%s: out is NULL", fn);
    if (o.wire != TDIST_F16 && o.wire != TDIST_BF16)
        return tdist__error(TDIST_ERR_INVALID_ARG,
                            "%s: opts.wire is %s; the wire format must be f16 or bf16", fn,
                            tdist_dtype_name(o.wire));
    tdist_compress_t *c = calloc(1, sizeof *c);
    if (!c) return tdist__error(TDIST_ERR_NO_MEMORY, "%s: out of memory", fn);
    c->wire = o.wire;
    c->observe = o.observe;
    c->observe_arg = o.observe_arg;
    *out = c;
    return TDIST_OK;
}

/* What every rank must agree on: the kind (hook or wrapper), the wire
 * format and the inner hook's name. */
static void set_identity(tdist_compress_t *c)
{
    uint8_t kind = c->inner ? 2 : 1;
    uint32_t wire = (uint32_t)c->wire;
    uint64_t h = tdist__fnv1a(TDIST__FNV_INIT, &kind, sizeof kind);
    h = tdist__fnv1a(h, &wire, sizeof wire);
    if (c->inner_name) h = tdist__fnv1a(h, c->inner_name, strlen(c->inner_name) + 1);
    c->config = h;
    if (c->inner)
        snprintf(c->desc, sizeof c->desc, "%s_compress_wrapper(%s)", wire_prefix(c->wire),
                 c->inner_name);
    else
        snprintf(c->desc, sizeof c->desc, "%s_compress_hook", wire_prefix(c->wire));
}

tdist_status_t tdist_compress_hook_create(const tdist_compress_opts_t *opts, tdist_compress_t **out)
{
    tdist_compress_t *c = NULL;
    TDIST_CHECK(create(opts, "tdist_compress_hook_create", &c, out));
    set_identity(c);
    *out = c;
    return TDIST_OK;
}

/* The inner hook's name: the caller's, or tdist's own hooks' names. */
static tdist_status_t inner_name_of(tdist_ddp_comm_hook_fn inner, void *inner_state,
                                    const char *name, const char *fn, char *buf, size_t cap)
{
    if (name) {
        snprintf(buf, cap, "%s", name);
    } else if (inner == tdist_ddp_allreduce_hook) {
        snprintf(buf, cap, "tdist_ddp_allreduce_hook");
    } else if (inner == tdist_compress_hook) {
        if (!inner_state)
            return tdist__error(TDIST_ERR_INVALID_ARG,
                                "%s: inner is tdist_compress_hook but inner_state is NULL", fn);
        snprintf(buf, cap, "%s", ((const tdist_compress_t *)inner_state)->desc);
    } else {
        return tdist__error(TDIST_ERR_INVALID_ARG,
                            "%s: inner_name is NULL: name the inner hook (the ranks compare it "
                            "to be sure they all wrap the same hook)",
                            fn);
    }
    return TDIST_OK;
}

tdist_status_t tdist_compress_wrapper_create(tdist_ddp_comm_hook_fn inner, void *inner_state,
                                             const char *inner_name,
                                             const tdist_compress_opts_t *opts,
                                             tdist_compress_t **out)
{
    const char *fn = "tdist_compress_wrapper_create";
    if (!inner) return tdist__error(TDIST_ERR_INVALID_ARG, "%s: inner is NULL", fn);
    char name[TDIST__AGREE_DESC];
    TDIST_CHECK(inner_name_of(inner, inner_state, inner_name, fn, name, sizeof name));
    if (inner_name && inner_name[0] == '\0')
        return tdist__error(TDIST_ERR_INVALID_ARG, "%s: inner_name is empty", fn);
    tdist_compress_t *c = NULL;
    TDIST_CHECK(create(opts, fn, &c, out));
    c->inner = inner;
    c->inner_state = inner_state;
    c->inner_name = tdist__strdup(inner_name ? inner_name : name);
    if (!c->inner_name) {
        free(c);
        return tdist__error(TDIST_ERR_NO_MEMORY, "%s: out of memory", fn);
    }
    set_identity(c);
    *out = c;
    return TDIST_OK;
}

void tdist_compress_destroy(tdist_compress_t *c)
{
    if (!c) return;
    for (size_t i = 0; i < c->nslots; i++) free(c->slots[i].wire);
    free(c->slots);
    free(c->inner_name);
    free(c);
}

tdist_status_t tdist_compress_register(tdist_ddp_t *ddp, tdist_compress_t *c)
{
    if (!ddp || !c)
        return tdist__error(TDIST_ERR_INVALID_ARG, "tdist_compress_register: %s is NULL",
                            !ddp ? "ddp" : "the compression state");
    /* the casts read the gradients where they are and write them back:
     * the reducer's copies into the bucket and back are not needed */
    return tdist_ddp_register_comm_hook_flags(ddp, c, tdist_compress_hook, TDIST_DDP_HOOK_GRADS);
}

/* ------------------------------------------------------------ the hook */

/* Bucket b's slot, with room for b->count values. */
static tdist_status_t slot_for(tdist_compress_t *c, const tdist_ddp_bucket_t *b, slot_t **out)
{
    size_t need = TDIST_MAX(b->num_buckets, b->index + 1);
    if (need > c->nslots) {
        slot_t *s = realloc(c->slots, need * sizeof *s);
        if (!s) return tdist__hook_error(b, TDIST_ERR_NO_MEMORY, WHO, "out of memory");
        memset(s + c->nslots, 0, (need - c->nslots) * sizeof *s);
        c->slots = s;
        c->nslots = need;
    }
    slot_t *s = &c->slots[b->index];
    if (s->cap < b->count) {
        uint16_t *w = malloc(b->count * sizeof *w);
        if (!w)
            return tdist__hook_error(b, TDIST_ERR_NO_MEMORY, WHO,
                                     "out of memory for %zu bytes of 16-bit staging",
                                     b->count * sizeof *w);
        free(s->wire);
        s->wire = w;
        s->cap = b->count;
    }
    *out = s;
    return TDIST_OK;
}

/* The last step of both chains: observe the reduced values, cast back. */
static tdist_status_t finish(void *state, const tdist_ddp_bucket_t *bucket,
                             tdist_ddp_hook_result_t *next)
{
    (void)next;
    tdist_compress_t *c = state;
    const slot_t *s = &c->slots[bucket->index];
    if (c->observe) c->observe(c->observe_arg, bucket, s->wire, true);
    decompress(c, s->wire, bucket);
    return TDIST_OK;
}

/* The wrapper's continuation: run the inner chain's next continuation,
 * hand its work back to the reducer with this function as the next step,
 * and cast back when the inner chain is done. */
static tdist_status_t wrapper_then(void *state, const tdist_ddp_bucket_t *bucket,
                                   tdist_ddp_hook_result_t *next)
{
    tdist_compress_t *c = state;
    slot_t *s = &c->slots[bucket->index];
    if (!s->inner_then) return finish(state, bucket, next);
    tdist_ddp_then_fn fn = s->inner_then;
    s->inner_then = NULL;
    tdist_ddp_hook_result_t in = {0};
    tdist_status_t st = fn(c->inner_state, &s->b16, &in);
    if (st != TDIST_OK) {
        next->work = in.work; /* the reducer waits for it and frees it */
        return tdist__error_context(st, "%s: %s bucket %zu: continuation of the inner hook '%s'",
                                    WHO, c->desc, bucket->index, c->inner_name);
    }
    if (!in.work && !in.then) return finish(state, bucket, next);
    s->inner_then = in.then;
    next->work = in.work;
    next->then = wrapper_then;
    return TDIST_OK;
}

/* The wrapper: the inner hook on the 16-bit bucket. */
static tdist_status_t call_inner(tdist_compress_t *c, slot_t *s, const tdist_ddp_bucket_t *bucket,
                                 tdist_ddp_hook_result_t *result)
{
    s->b16 = *bucket;
    s->b16.buffer = s->wire;
    s->b16.dtype = c->wire;
    s->b16.grads = NULL; /* the inner hook works on the 16-bit bucket */
    s->inner_then = NULL;
    tdist_ddp_hook_result_t in = {0};
    tdist_status_t st = c->inner(c->inner_state, &s->b16, &in);
    if (st != TDIST_OK) {
        if (in.work) tdist_work_free(in.work);
        return tdist__error_context(st, "%s: %s bucket %zu: the inner hook '%s'", WHO, c->desc,
                                    bucket->index, c->inner_name);
    }
    s->inner_then = in.then;
    result->work = in.work;
    result->then = wrapper_then;
    return TDIST_OK;
}

/* The observer of an f32 bucket reduced over the 16-bit wire: the
 * reduced values packed again (float(h) packs back into h). */
static tdist_status_t observe_reduced(void *state, const tdist_ddp_bucket_t *bucket,
                                      tdist_ddp_hook_result_t *next)
{
    (void)next;
    tdist_compress_t *c = state;
    const slot_t *s = &c->slots[bucket->index];
    compress(c, s->wire, bucket, 1.0f);
    c->observe(c->observe_arg, bucket, s->wire, true);
    return TDIST_OK;
}

/* The hook on an f32 bucket: one all_reduce over the 16-bit wire packs
 * the gradients (cast, divide, cast) while it stages them, sums the
 * 16-bit values and unpacks the sum into them — no pass of its own over
 * the bucket. An observer gets the packed input computed once more, and
 * the reduced values packed again. */
static tdist_status_t hook_wire(tdist_compress_t *c, const tdist_ddp_bucket_t *b,
                                tdist_ddp_hook_result_t *result)
{
    void *flat[1] = {b->buffer};
    size_t flat_count[1] = {b->count};
    void *const *bufs = b->grads ? b->grads : flat;
    const size_t *counts = b->grads ? b->counts : flat_count;
    size_t n = b->grads ? b->num_params : 1;
    if (c->observe) {
        slot_t *s = NULL;
        TDIST_CHECK(slot_for(c, b, &s));
        compress(c, s->wire, b, (float)b->divisor);
        c->observe(c->observe_arg, b, s->wire, false);
        result->then = observe_reduced;
    }
    tdist_status_t st = tdist_all_reduce_wire(b->pg, bufs, counts, n, c->wire, (double)b->divisor,
                                              NULL, &result->work);
    if (st != TDIST_OK)
        return tdist__error_context(st, "%s: %s bucket %zu: all_reduce over the %s wire", WHO,
                                    c->desc, b->index, tdist_dtype_name(c->wire));
    return TDIST_OK;
}

static tdist_status_t check_call(const tdist_compress_t *c, const tdist_ddp_bucket_t *b,
                                 const tdist_ddp_hook_result_t *result)
{
    return tdist__hook_check(c, b, result, WHO, "tdist_compress_hook_create",
                             "tdist_compress_register", c ? c->desc : NULL, TDIST__HOOK_FLOAT,
                             "16-bit compression takes f32, f64, f16 or bf16 buckets");
}

tdist_status_t tdist_compress_hook(void *state, const tdist_ddp_bucket_t *bucket,
                                   tdist_ddp_hook_result_t *result)
{
    tdist_compress_t *c = state;
    TDIST_CHECK(check_call(c, bucket, result));
    TDIST_CHECK(tdist__agree(&c->agree, bucket, WHO, "compress", c->desc, c->config));
    if (!c->inner && bucket->dtype == TDIST_F32) return hook_wire(c, bucket, result);
    slot_t *s = NULL;
    TDIST_CHECK(slot_for(c, bucket, &s));
    compress(c, s->wire, bucket, (float)bucket->divisor);
    if (c->observe) c->observe(c->observe_arg, bucket, s->wire, false);
    if (c->inner) return call_inner(c, s, bucket, result);
    tdist_status_t st = tdist_all_reduce(bucket->pg, s->wire, s->wire, bucket->count, c->wire,
                                         TDIST_SUM, NULL, &result->work);
    if (st != TDIST_OK)
        return tdist__error_context(st, "%s: %s bucket %zu: all_reduce of the %s values", WHO,
                                    c->desc, bucket->index, tdist_dtype_name(c->wire));
    result->then = finish;
    return TDIST_OK;
}
