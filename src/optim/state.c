/*
 * optim/state.c — saving an optimizer's state to a byte blob and loading it
 * back (checkpoints).
 *
 * Blob layout, version 1, host byte order, no padding, no alignment needed:
 *
 *   offset  size  field
 *        0     8  magic "TDOPTIM\0"
 *        8     4  u32 version (TDIST_OPTIM_STATE_VERSION)
 *       12     4  u32 byte-order mark 0x01020304
 *       16     4  u32 kind (1 sgd, 2 adam, 3 adamw)
 *       20     4  u32 state arrays per element (sgd: 0 or 1; adam: 2 or 3)
 *       24     8  u64 number of buffers N
 *       32    56  f64 lr, momentum, dampening, weight_decay, beta1, beta2, eps
 *                 (the ones that do not apply to the kind are 0)
 *       88     4  u32 flags: 1 nesterov, 2 amsgrad, 4 maximize
 *       92     4  u32 reserved, 0
 *       96  16*N  per buffer: u64 element count, u64 step count
 *            ...  per buffer, per state array (momentum_buffer; or exp_avg,
 *                 exp_avg_sq[, max_exp_avg_sq]): count f32 values
 *    end-8     8  u64 checksum (FNV-1a style, 64-bit words) of everything before
 */
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "optim/internal.h"

static const char MAGIC[8] = {'T', 'D', 'O', 'P', 'T', 'I', 'M', '\0'};
#define BYTE_ORDER_MARK 0x01020304u
#define HEADER_SIZE 96u
#define PER_BUF_SIZE 16u
#define CHECKSUM_SIZE 8u

#define FLAG_NESTEROV 1u
#define FLAG_AMSGRAD 2u
#define FLAG_MAXIMIZE 4u

/* --------------------------------------------------------------- helpers */

static void put_u32(unsigned char *p, uint32_t v) { memcpy(p, &v, 4); }
static void put_u64(unsigned char *p, uint64_t v) { memcpy(p, &v, 8); }
static void put_f64(unsigned char *p, double v) { memcpy(p, &v, 8); }
static uint32_t get_u32(const unsigned char *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}
static uint64_t get_u64(const unsigned char *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}
static double get_f64(const unsigned char *p)
{
    double v;
    memcpy(&v, p, 8);
    return v;
}

/* FNV-1a over 64-bit words (then the tail bytes): cheap, and any changed
 * byte changes the result. */
static uint64_t checksum(const unsigned char *p, size_t n)
{
    const uint64_t prime = 1099511628211ull;
    uint64_t h = 14695981039346656037ull;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        h = (h ^ w) * prime;
        h ^= h >> 29;
    }
    for (; i < n; i++) h = (h ^ p[i]) * prime;
    h ^= (uint64_t)n;
    return h * prime;
}

/* Bytes of a blob for nbuf buffers of the given counts and nstate arrays;
 * 0 on overflow. counts is read through get_count(ctx, i). */
static size_t blob_size(size_t nbuf, int nstate, uint64_t (*get_count)(const void *, size_t),
                        const void *ctx)
{
    if (nbuf > (SIZE_MAX - HEADER_SIZE - CHECKSUM_SIZE) / PER_BUF_SIZE) return 0;
    size_t size = HEADER_SIZE + PER_BUF_SIZE * nbuf + CHECKSUM_SIZE;
    for (size_t i = 0; i < nbuf; i++) {
        uint64_t c = get_count(ctx, i);
        if (c > (SIZE_MAX - size) / sizeof(float) / (size_t)(nstate ? nstate : 1)) return 0;
        size += (size_t)c * sizeof(float) * (size_t)nstate;
    }
    return size;
}

static uint64_t count_from_opt(const void *ctx, size_t i)
{
    return ((const tdist_optim_t *)ctx)->bufs[i].count;
}

static uint64_t count_from_blob(const void *ctx, size_t i)
{
    return get_u64((const unsigned char *)ctx + HEADER_SIZE + PER_BUF_SIZE * i);
}

/* What an nstate means, for messages. */
static const char *layout_name(tdist_optim_kind_t kind, uint32_t nstate)
{
    if (kind == TDIST_OPTIM_SGD) return nstate == 0 ? "no momentum buffer" : "a momentum buffer";
    return nstate == 3 ? "amsgrad state" : "no amsgrad state";
}

/* ------------------------------------------------------- the flat vector */

static size_t state_count(const tdist_optim_t *opt)
{
    size_t n = 0;
    for (size_t i = 0; i < opt->nbuf; i++) n += opt->bufs[i].count * (size_t)opt->nstate;
    return n;
}

tdist_status_t tdist_optim_state_count(const tdist_optim_t *opt, size_t *count)
{
    TDIST_ARG_CHECK(opt != NULL, "tdist_optim_state_count");
    TDIST_ARG_CHECK(count != NULL, "tdist_optim_state_count");
    *count = state_count(opt);
    return TDIST_OK;
}

/* Copy the state to (out) or from the flat vector v of count values. */
static tdist_status_t copy_state(const char *fn, tdist_optim_t *opt, float *v, size_t count,
                                 int out)
{
    TDIST_ARG_CHECK(opt != NULL, fn);
    size_t want = state_count(opt);
    if (count != want)
        return tdist__error(TDIST_ERR_INVALID_ARG, "%s: count %zu, the %s state holds %zu values "
                            "(tdist_optim_state_count)", fn, count,
                            tdist_optim_kind_name(opt->kind), want);
    TDIST_ARG_CHECK(v != NULL || count == 0, fn);
    size_t at = 0;
    for (size_t i = 0; i < opt->nbuf; i++) {
        tdist__optim_buf_t *b = &opt->bufs[i];
        for (int s = 0; s < opt->nstate && b->count; s++, at += b->count) {
            if (out) memcpy(v + at, b->state[s], b->count * sizeof(float));
            else memcpy(b->state[s], v + at, b->count * sizeof(float));
        }
    }
    return TDIST_OK;
}

tdist_status_t tdist_optim_copy_state_out(const tdist_optim_t *opt, float *dst, size_t count)
{
    /* only read: the cast lets one loop serve both directions */
    return copy_state("tdist_optim_copy_state_out", (tdist_optim_t *)opt, dst, count, 1);
}

tdist_status_t tdist_optim_copy_state_in(tdist_optim_t *opt, const float *src, size_t count)
{
    return copy_state("tdist_optim_copy_state_in", opt, (float *)src, count, 0);
}

/* ------------------------------------------------------------------ save */

tdist_status_t tdist_optim_state_size(const tdist_optim_t *opt, size_t *size)
{
    static const char fn[] = "tdist_optim_state_size";
    TDIST_ARG_CHECK(opt != NULL, fn);
    TDIST_ARG_CHECK(size != NULL, fn);
    size_t s = blob_size(opt->nbuf, opt->nstate, count_from_opt, opt);
    if (s == 0) return tdist__error(TDIST_ERR_INVALID_ARG, "%s: state size overflows size_t", fn);
    *size = s;
    return TDIST_OK;
}

tdist_status_t tdist_optim_save(const tdist_optim_t *opt, void *buf, size_t size)
{
    static const char fn[] = "tdist_optim_save";
    TDIST_ARG_CHECK(opt != NULL, fn);
    TDIST_ARG_CHECK(buf != NULL, fn);
    size_t need = 0;
    TDIST_CHECK(tdist_optim_state_size(opt, &need));
    if (size < need)
        return tdist__error(TDIST_ERR_INVALID_ARG,
                            "%s: buffer of %zu bytes is too small, the %s state needs %zu "
                            "(tdist_optim_state_size)",
                            fn, size, tdist_optim_kind_name(opt->kind), need);

    unsigned char *out = buf;
    memset(out, 0, HEADER_SIZE);
    memcpy(out, MAGIC, 8);
    put_u32(out + 8, TDIST_OPTIM_STATE_VERSION);
    put_u32(out + 12, BYTE_ORDER_MARK);
    put_u32(out + 16, (uint32_t)opt->kind);
    put_u32(out + 20, (uint32_t)opt->nstate);
    put_u64(out + 24, (uint64_t)opt->nbuf);
    uint32_t flags = 0;
    put_f64(out + 32, opt->lr);
    if (opt->kind == TDIST_OPTIM_SGD) {
        put_f64(out + 40, opt->sgd.momentum);
        put_f64(out + 48, opt->sgd.dampening);
        put_f64(out + 56, opt->sgd.weight_decay);
        if (opt->sgd.nesterov) flags |= FLAG_NESTEROV;
        if (opt->sgd.maximize) flags |= FLAG_MAXIMIZE;
    } else {
        put_f64(out + 56, opt->adam.weight_decay);
        put_f64(out + 64, opt->adam.beta1);
        put_f64(out + 72, opt->adam.beta2);
        put_f64(out + 80, opt->adam.eps);
        if (opt->adam.amsgrad) flags |= FLAG_AMSGRAD;
        if (opt->adam.maximize) flags |= FLAG_MAXIMIZE;
    }
    put_u32(out + 88, flags);
    put_u32(out + 92, 0);

    size_t off = HEADER_SIZE;
    for (size_t i = 0; i < opt->nbuf; i++, off += PER_BUF_SIZE) {
        put_u64(out + off, (uint64_t)opt->bufs[i].count);
        put_u64(out + off + 8, opt->bufs[i].steps);
    }
    for (size_t i = 0; i < opt->nbuf; i++) {
        const tdist__optim_buf_t *b = &opt->bufs[i];
        for (int s = 0; s < opt->nstate; s++) {
            size_t bytes = b->count * sizeof(float);
            if (bytes) memcpy(out + off, b->state[s], bytes);
            off += bytes;
        }
    }
    put_u64(out + off, checksum(out, off));
    return TDIST_OK;
}

/* ------------------------------------------------------------------ load */

tdist_status_t tdist_optim_load(tdist_optim_t *opt, const void *buf, size_t size)
{
    static const char fn[] = "tdist_optim_load";
    TDIST_ARG_CHECK(opt != NULL, fn);
    TDIST_ARG_CHECK(buf != NULL, fn);
    const unsigned char *in = buf;

    /* 1. Is this a blob we can read at all? */
    if (size < HEADER_SIZE + CHECKSUM_SIZE)
        return tdist__error(TDIST_ERR_INVALID_ARG,
                            "%s: blob of %zu bytes is too short for an optimizer state "
                            "(the smallest blob, with no buffers, is %u bytes)",
                            fn, size, HEADER_SIZE + CHECKSUM_SIZE);
    if (memcmp(in, MAGIC, 8) != 0)
        return tdist__error(TDIST_ERR_INVALID_ARG,
                            "%s: not a tdist optimizer state blob (bad magic)", fn);
    uint32_t bom = get_u32(in + 12);
    if (bom != BYTE_ORDER_MARK)
        return tdist__error(TDIST_ERR_INVALID_ARG,
                            "%s: blob was written with another byte order (mark 0x%08x)", fn, bom);
    uint32_t version = get_u32(in + 8);
    if (version != TDIST_OPTIM_STATE_VERSION)
        return tdist__error(TDIST_ERR_INVALID_ARG,
                            "%s: blob has state version %u, this library reads version %u", fn,
                            version, (unsigned)TDIST_OPTIM_STATE_VERSION);
    uint32_t kind = get_u32(in + 16);
    uint32_t nstate = get_u32(in + 20);
    uint64_t nbuf64 = get_u64(in + 24);
    if (nstate > TDIST_OPTIM_MAX_STATE ||
        nbuf64 > (size - HEADER_SIZE - CHECKSUM_SIZE) / PER_BUF_SIZE)
        return tdist__error(TDIST_ERR_INVALID_ARG,
                            "%s: blob header is corrupted or truncated (%" PRIu64
                            " buffers, %u state arrays, %zu bytes)",
                            fn, nbuf64, nstate, size);
    size_t nbuf = (size_t)nbuf64;
    size_t want = blob_size(nbuf, (int)nstate, count_from_blob, in);
    if (want != size)
        return tdist__error(TDIST_ERR_INVALID_ARG,
                            "%s: blob is %zu bytes but its header describes %zu "
                            "(truncated or corrupted)",
                            fn, size, want);
    uint64_t sum = get_u64(in + size - CHECKSUM_SIZE);
    if (sum != checksum(in, size - CHECKSUM_SIZE))
        return tdist__error(TDIST_ERR_INVALID_ARG, "%s: blob checksum mismatch: the blob is corrupted",
                            fn);

    /* 2. Does it fit this optimizer? */
    if (kind != (uint32_t)opt->kind)
        return tdist__error(TDIST_ERR_MISMATCH, "%s: blob is for %s, this optimizer is %s", fn,
                            tdist_optim_kind_name((tdist_optim_kind_t)kind),
                            tdist_optim_kind_name(opt->kind));
    if (nstate != (uint32_t)opt->nstate)
        return tdist__error(TDIST_ERR_MISMATCH,
                            "%s: blob holds %s (%u state arrays per element), this %s optimizer "
                            "has %s (%d)",
                            fn, layout_name(opt->kind, nstate), nstate,
                            tdist_optim_kind_name(opt->kind),
                            layout_name(opt->kind, (uint32_t)opt->nstate), opt->nstate);
    if (nbuf != opt->nbuf)
        return tdist__error(TDIST_ERR_MISMATCH,
                            "%s: blob has %zu buffers, this optimizer has %zu", fn, nbuf,
                            opt->nbuf);
    for (size_t i = 0; i < nbuf; i++) {
        uint64_t c = count_from_blob(in, i);
        if (c != (uint64_t)opt->bufs[i].count) {
            char label[160];
            return tdist__error(TDIST_ERR_MISMATCH,
                                "%s: %s: %" PRIu64 " elements in the blob, %zu here", fn,
                                tdist__optim_buf_label(opt, i, label, sizeof label), c,
                                opt->bufs[i].count);
        }
    }
    double lr = get_f64(in + 32);
    if (!isfinite(lr) || lr < 0.0)
        return tdist__error(TDIST_ERR_INVALID_ARG, "%s: blob holds an invalid lr %g", fn, lr);

    /* 3. Everything checked: apply. */
    opt->lr = lr;
    size_t off = HEADER_SIZE;
    for (size_t i = 0; i < nbuf; i++, off += PER_BUF_SIZE) opt->bufs[i].steps = get_u64(in + off + 8);
    for (size_t i = 0; i < nbuf; i++) {
        tdist__optim_buf_t *b = &opt->bufs[i];
        for (uint32_t s = 0; s < nstate; s++) {
            size_t bytes = b->count * sizeof(float);
            if (bytes) memcpy(b->state[s], in + off, bytes);
            off += bytes;
        }
    }
    return TDIST_OK;
}
