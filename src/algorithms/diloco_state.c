/*
 * algorithms/diloco_state.c — saving and loading a DiLoCo state
 * (checkpoints). See tdist/algorithms.h.
 *
 * Layout, host byte order, no padding:
 *
 *   magic "TDDILOC1" (8), u32 byte-order mark 0x01020304, u32 reserved,
 *   the options record (H, outer lr, momentum, flags, wire, int8 block),
 *   u64 buffers, u64 elements, u64 inner steps since the last
 *   synchronisation, u64 inner steps, u64 outer steps, u64 wire bytes,
 *   the synchronised parameters (elements x f32),
 *   u64 length + the outer SGD's saved state (tdist_optim_save),
 *   u64 length + the inner optimizer's, when DiLoCo owns it (else 0),
 *   u64 FNV-1a of everything before.
 *
 * A load is checked in full (magic, byte order, options, sizes, checksum)
 * before anything changes; the optimizers' states are loaded with their
 * previous states saved aside, and put back if a later part fails.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "algorithms/diloco_internal.h"

static const char MAGIC[8] = {'T', 'D', 'D', 'I', 'L', 'O', 'C', '1'};
#define BOM 0x01020304u

/* The options as saved (and compared at load). */
typedef struct opts_rec {
    int64_t inner_steps;
    double outer_lr, outer_momentum;
    uint32_t flags; /* 1 nesterov, 2 int8 error feedback */
    int32_t wire;
    uint64_t int8_block;
} opts_rec_t;

static opts_rec_t rec_of(const tdist_diloco_opts_t *o)
{
    opts_rec_t r;
    memset(&r, 0, sizeof r);
    r.inner_steps = o->inner_steps;
    r.outer_lr = o->outer_lr;
    r.outer_momentum = o->outer_momentum;
    r.flags = (o->outer_nesterov ? 1u : 0u) | (o->int8_error_feedback ? 2u : 0u);
    r.wire = (int32_t)o->wire;
    r.int8_block = o->wire == TDIST_I8 ? o->int8_block : 0;
    return r;
}

#define HEAD (8 + 4 + 4 + sizeof(opts_rec_t) + 6 * 8)

static size_t optim_bytes(tdist_optim_t *o)
{
    size_t n = 0;
    if (o && tdist_optim_state_size(o, &n) != TDIST_OK) return 0;
    return n;
}

size_t tdist_diloco_state_size(const tdist_diloco_t *d)
{
    if (!d) return 0;
    return HEAD + d->total * sizeof(float) + 8 + optim_bytes(d->outer) + 8 +
           (d->own_inner ? optim_bytes(d->inner) : 0) + 8;
}

static unsigned char *put(unsigned char *p, const void *v, size_t n)
{
    if (n) memcpy(p, v, n);
    return p + n;
}

/* u64 length, then the optimizer's saved state (none: length 0). */
static tdist_status_t put_optim(unsigned char **p, tdist_optim_t *o)
{
    uint64_t len = optim_bytes(o);
    *p = put(*p, &len, 8);
    if (len) TDIST_CHECK(tdist_optim_save(o, *p, (size_t)len));
    *p += len;
    return TDIST_OK;
}

tdist_status_t tdist_diloco_save(const tdist_diloco_t *d, void *buf, size_t cap, size_t *written)
{
    const char *fn = "tdist_diloco_save";
    if (!d || !buf) return tdist__error(TDIST_ERR_INVALID_ARG, "%s: %s is NULL", fn, !d ? "d" : "buf");
    size_t need = tdist_diloco_state_size(d);
    if (cap < need)
        return tdist__error(TDIST_ERR_INVALID_ARG, "%s: %zu bytes is too small, the state needs %zu "
                            "(tdist_diloco_state_size)", fn, cap, need);
    unsigned char *p = buf;
    uint32_t bom = BOM, zero = 0;
    opts_rec_t r = rec_of(&d->o);
    uint64_t words[6] = {d->n, d->total, (uint64_t)d->since, d->stats.inner_steps,
                         d->stats.outer_steps, d->stats.wire_bytes};
    p = put(p, MAGIC, 8);
    p = put(p, &bom, 4);
    p = put(p, &zero, 4);
    p = put(p, &r, sizeof r);
    p = put(p, words, sizeof words);
    p = put(p, d->synced, d->total * sizeof(float));
    TDIST_CHECK(put_optim(&p, d->outer));
    TDIST_CHECK(put_optim(&p, d->own_inner ? d->inner : NULL));
    uint64_t sum = tdist__fnv1a(TDIST__FNV_INIT, buf, (size_t)(p - (unsigned char *)buf));
    p = put(p, &sum, 8);
    if (written) *written = (size_t)(p - (unsigned char *)buf);
    return TDIST_OK;
}

/* Where the parts of a saved state are, after the checks. */
typedef struct parts {
    uint64_t words[6];
    const unsigned char *synced, *outer, *inner;
    uint64_t outer_len, inner_len;
} parts_t;

static tdist_status_t bad(const char *what)
{
    return tdist__error(TDIST_ERR_INVALID_ARG, "tdist_diloco_load: %s; nothing was changed", what);
}

/* Check everything but the optimizers' own blobs (tdist_optim_load checks those). */
static tdist_status_t parse(const tdist_diloco_t *d, const unsigned char *b, size_t len, parts_t *pt)
{
    if (len < HEAD + 8 || memcmp(b, MAGIC, 8) != 0) return bad("not a saved DiLoCo state");
    uint32_t bom;
    memcpy(&bom, b + 8, 4);
    if (bom != BOM) return bad("saved with another byte order");
    uint64_t sum;
    memcpy(&sum, b + len - 8, 8);
    if (sum != tdist__fnv1a(TDIST__FNV_INIT, b, len - 8)) return bad("damaged or truncated (checksum)");
    opts_rec_t r, mine = rec_of(&d->o);
    memcpy(&r, b + 16, sizeof r);
    if (memcmp(&r, &mine, sizeof r) != 0)
        return tdist__error(TDIST_ERR_MISMATCH, "tdist_diloco_load: the state was saved with other "
                            "options (H %" PRId64 ", outer lr %g, momentum %g, wire %s) than these "
                            "(H %" PRId64 ", outer lr %g, momentum %g, wire %s); nothing was changed",
                            r.inner_steps, r.outer_lr, r.outer_momentum,
                            tdist_dtype_name((tdist_dtype_t)r.wire), mine.inner_steps, mine.outer_lr,
                            mine.outer_momentum, tdist_dtype_name(d->o.wire));
    memcpy(pt->words, b + 16 + sizeof r, sizeof pt->words);
    if (pt->words[0] != d->n || pt->words[1] != d->total)
        return tdist__error(TDIST_ERR_MISMATCH, "tdist_diloco_load: the state has %" PRIu64
                            " buffers of %" PRIu64 " elements, this one %zu of %zu; nothing was "
                            "changed", pt->words[0], pt->words[1], d->n, d->total);
    size_t off = HEAD;
    pt->synced = b + off;
    off += d->total * sizeof(float);
    for (int k = 0; k < 2; k++) {
        uint64_t l;
        if (off + 8 > len - 8) return bad("truncated");
        memcpy(&l, b + off, 8);
        off += 8;
        if (l > len - 8 - off) return bad("truncated");
        if (k == 0) pt->outer = b + off, pt->outer_len = l;
        else pt->inner = b + off, pt->inner_len = l;
        off += (size_t)l;
    }
    if (off != len - 8) return bad("trailing bytes");
    if ((pt->inner_len != 0) != d->own_inner)
        return tdist__error(TDIST_ERR_MISMATCH, "tdist_diloco_load: the state %s the inner "
                            "optimizer's, this DiLoCo %s its own; nothing was changed",
                            pt->inner_len ? "holds" : "does not hold", d->own_inner ? "has" : "has not");
    return TDIST_OK;
}

/* Load blob into o, keeping o's previous state in *old (for put_back). */
static tdist_status_t load_keep(tdist_optim_t *o, const unsigned char *blob, uint64_t len,
                                unsigned char **old, size_t *old_len)
{
    *old_len = optim_bytes(o);
    *old = malloc(*old_len ? *old_len : 1);
    if (!*old) return tdist__error(TDIST_ERR_NO_MEMORY, "tdist_diloco_load: out of memory");
    TDIST_CHECK(tdist_optim_save(o, *old, *old_len));
    return tdist_optim_load(o, blob, (size_t)len);
}

tdist_status_t tdist_diloco_load(tdist_diloco_t *d, const void *buf, size_t len)
{
    if (!d || !buf)
        return tdist__error(TDIST_ERR_INVALID_ARG, "tdist_diloco_load: %s is NULL", !d ? "d" : "buf");
    parts_t pt;
    TDIST_CHECK(parse(d, buf, len, &pt));
    unsigned char *old_outer = NULL, *old_inner = NULL;
    size_t lo = 0, li = 0;
    tdist_status_t st = load_keep(d->outer, pt.outer, pt.outer_len, &old_outer, &lo);
    if (st == TDIST_OK && d->own_inner) {
        st = load_keep(d->inner, pt.inner, pt.inner_len, &old_inner, &li);
        if (st != TDIST_OK) (void)tdist_optim_load(d->outer, old_outer, lo);
    }
    free(old_outer);
    free(old_inner);
    if (st != TDIST_OK) return tdist__error_context(st, "tdist_diloco_load: nothing was changed");
    memcpy(d->synced, pt.synced, d->total * sizeof(float));
    d->since = (int64_t)pt.words[2];
    d->stats.inner_steps = pt.words[3];
    d->stats.outer_steps = pt.words[4];
    d->stats.wire_bytes = pt.words[5];
    return TDIST_OK;
}
