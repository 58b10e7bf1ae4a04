/*
 * algorithms/zero_state.c — ZeRO's optimizer state beyond the step: the
 * consolidation on one rank (PyTorch's consolidate_state_dict) and the
 * sharded checkpoint that loads at another world size.
 *
 * Shard blob, version 1 (host byte order, no alignment needed):
 *     0   8  magic "TDZERO1\0"
 *     8   4  u32 version (1)
 *     12  4  u32 optimizer kind (tdist_optim_kind_t)
 *     16  4  u32 state arrays per element
 *     20  4  u32 world size of the writer
 *     24  4  u32 rank of the writer
 *     28  4  u32 reserved (0)
 *     32  8  u64 parameters n
 *     40  8  u64 pieces m
 *     48  8  f64 learning rate
 *     56  8  u64 elements of the model
 *     64     n x (u64 element count, u64 name hash)
 *            m x (u64 parameter, u64 first element, u64 elements, u64 step count)
 *            per piece, per state array: its elements as f32
 *     end-8  u64 FNV-1a of everything before
 * A piece is a range of one parameter, so a reader at any world size and
 * partition finds the elements it owns wherever the writer kept them.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "algorithms/zero.h"

#define SHARD_MAGIC "TDZERO1"
#define SHARD_VERSION 1u
#define HDR 64u

/* ------------------------------------------------------- consolidation */

/* Element offset of each parameter in creation order. */
static size_t param_offset(const tdist_zero_t *z, size_t j)
{
    size_t at = 0;
    for (size_t i = 0; i < j; i++) at += z->params[i].count;
    return at;
}

static tdist_status_t alloc_full(tdist_zero_t *z)
{
    for (int s = 0; s < z->nstate; s++)
        if (!z->full[s] && !(z->full[s] = calloc(z->total + 1, sizeof(float))))
            return TDIST_ERR_NO_MEMORY;
    if (!z->full_steps && !(z->full_steps = calloc(z->n, sizeof *z->full_steps)))
        return TDIST_ERR_NO_MEMORY;
    return TDIST_OK;
}

/* The consolidation gathers, on `to`, every rank's pieces: first their
 * number and elements (all_gather), then the descriptors (param, offset,
 * count, steps) padded to the most pieces, then per state array the
 * pieces' elements packed and padded to the most elements. Pieces held by
 * several ranks (the first iteration of the overlap hook) are equal. */
typedef struct gather_plan {
    int64_t *sizes;  /* [size][2]: pieces, elements */
    size_t max_pieces, max_elems;
    int64_t *desc;   /* [size][max_pieces][4] on `to` */
    float *mine;     /* max_elems */
    float *all;      /* [size][max_elems] on `to` */
} gather_plan_t;

static tdist_status_t plan_gather(tdist_zero_t *z, const tdist__zero_shard_t *sh, int to,
                                  gather_plan_t *g)
{
    int64_t me[2] = {(int64_t)sh->n, 0};
    for (size_t k = 0; k < sh->n; k++) me[1] += (int64_t)sh->pieces[k].count;
    g->sizes = calloc(2 * (size_t)z->size, sizeof *g->sizes);
    if (!g->sizes) return TDIST_ERR_NO_MEMORY;
    TDIST_CHECK(tdist_all_gather(z->pg, me, g->sizes, 2, TDIST_I64, NULL, NULL));
    for (int r = 0; r < z->size; r++) {
        if ((size_t)g->sizes[2 * r] > g->max_pieces) g->max_pieces = (size_t)g->sizes[2 * r];
        if ((size_t)g->sizes[2 * r + 1] > g->max_elems) g->max_elems = (size_t)g->sizes[2 * r + 1];
    }
    size_t w = (size_t)z->size, dp = 4 * g->max_pieces;
    int64_t *d = calloc(dp + 1, sizeof *d);
    g->mine = calloc(g->max_elems + 1, sizeof *g->mine);
    if (z->rank == to) {
        g->desc = calloc(w * dp + 1, sizeof *g->desc);
        g->all = calloc(w * g->max_elems + 1, sizeof *g->all);
    }
    if (!d || !g->mine || (z->rank == to && (!g->desc || !g->all))) {
        free(d);
        return TDIST_ERR_NO_MEMORY;
    }
    for (size_t k = 0; k < sh->n; k++) {
        uint64_t steps = 0;
        tdist_optim_step_count(sh->opt, k, &steps);
        d[4 * k] = (int64_t)sh->pieces[k].param;
        d[4 * k + 1] = (int64_t)sh->pieces[k].offset;
        d[4 * k + 2] = (int64_t)sh->pieces[k].count;
        d[4 * k + 3] = (int64_t)steps;
    }
    tdist_status_t st = dp ? tdist_gather(z->pg, d, g->desc, dp, TDIST_I64, to, NULL, NULL) : TDIST_OK;
    free(d);
    return st;
}

/* State array s of every rank's pieces into z->full[s] on `to`. */
static tdist_status_t gather_slot(tdist_zero_t *z, const tdist__zero_shard_t *sh, int s, int to,
                                  gather_plan_t *g)
{
    size_t at = 0;
    for (size_t k = 0; k < sh->n; k++) {
        memcpy(g->mine + at, tdist__zero_piece_state(sh->opt, k, s),
               sh->pieces[k].count * sizeof(float));
        at += sh->pieces[k].count;
    }
    if (g->max_elems == 0) return TDIST_OK;
    TDIST_CHECK(tdist_gather(z->pg, g->mine, g->all, g->max_elems, TDIST_F32, to, NULL, NULL));
    if (z->rank != to) return TDIST_OK;
    for (int r = 0; r < z->size; r++) {
        const int64_t *d = g->desc + (size_t)r * 4 * g->max_pieces;
        const float *src = g->all + (size_t)r * g->max_elems;
        for (int64_t k = 0; k < g->sizes[2 * r]; k++) {
            size_t j = (size_t)d[4 * k], off = (size_t)d[4 * k + 1], c = (size_t)d[4 * k + 2];
            memcpy(z->full[s] + param_offset(z, j) + off, src, c * sizeof(float));
            src += c;
            if (s == 0 || z->nstate == 0) z->full_steps[j] = (uint64_t)d[4 * k + 3];
        }
    }
    return TDIST_OK;
}

static void steps_only(tdist_zero_t *z, const gather_plan_t *g, int to)
{
    if (z->rank != to) return;
    for (int r = 0; r < z->size; r++) {
        const int64_t *d = g->desc + (size_t)r * 4 * g->max_pieces;
        for (int64_t k = 0; k < g->sizes[2 * r]; k++) z->full_steps[d[4 * k]] = (uint64_t)d[4 * k + 3];
    }
}

tdist_status_t tdist_zero_consolidate_state_dict(tdist_zero_t *z, int to)
{
    static const char who[] = "tdist_zero_consolidate_state_dict";
    TDIST_ARG_CHECK(z != NULL, who);
    if (to < 0 || to >= z->size)
        return tdist__zero_error(z, TDIST_ERR_INVALID_ARG, who, "rank %d is not in the group of %d",
                                 to, z->size);
    z->consolidated = false;
    tdist__zero_shard_t sh;
    tdist__zero_shard(z, &sh);
    gather_plan_t g;
    memset(&g, 0, sizeof g);
    tdist_status_t st = z->rank == to ? alloc_full(z) : TDIST_OK;
    if (st == TDIST_OK) st = plan_gather(z, &sh, to, &g);
    for (int s = 0; s < z->nstate && st == TDIST_OK; s++) st = gather_slot(z, &sh, s, to, &g);
    if (st == TDIST_OK && z->nstate == 0) steps_only(z, &g, to);
    free(g.sizes);
    free(g.desc);
    free(g.mine);
    free(g.all);
    if (st == TDIST_ERR_NO_MEMORY) return tdist__zero_error(z, st, who, "out of memory");
    if (st != TDIST_OK)
        return tdist__error_context(st, "%s: rank %d group %s: gathering the state on rank %d",
                                    who, z->rank, tdist_pg_name(z->pg), to);
    z->consolidated = z->rank == to;
    return TDIST_OK;
}

tdist_status_t tdist_zero_consolidated_state(const tdist_zero_t *z, size_t index, int slot,
                                             const float **data, uint64_t *steps)
{
    static const char who[] = "tdist_zero_consolidated_state";
    TDIST_ARG_CHECK(z != NULL, who);
    if (!z->consolidated)
        return tdist__zero_error(z, TDIST_ERR_INVALID_ARG, who,
                                 "no consolidated state on this rank: call "
                                 "tdist_zero_consolidate_state_dict(z, %d) on every rank first",
                                 z->rank);
    if (index >= z->n || slot < 0 || slot >= (z->nstate ? z->nstate : 1))
        return tdist__zero_error(z, TDIST_ERR_INVALID_ARG, who,
                                 "parameter %zu / state slot %d out of range (%zu parameters, "
                                 "%d state arrays)", index, slot, z->n, z->nstate);
    if (data) *data = z->nstate ? z->full[slot] + param_offset(z, index) : NULL;
    if (steps) *steps = z->full_steps[index];
    return TDIST_OK;
}

/* -------------------------------------------------------------- shards */

static void put(uint8_t **at, const void *v, size_t n)
{
    memcpy(*at, v, n);
    *at += n;
}

static void put_u64(uint8_t **at, uint64_t v) { put(at, &v, 8); }
static void put_u32(uint8_t **at, uint32_t v) { put(at, &v, 4); }

static uint64_t get_u64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static uint32_t get_u32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static size_t shard_bytes(const tdist_zero_t *z)
{
    tdist__zero_shard_t sh;
    tdist__zero_shard(z, &sh);
    size_t e = 0;
    for (size_t k = 0; k < sh.n; k++) e += sh.pieces[k].count;
    return HDR + 16 * z->n + 32 * sh.n + e * (size_t)z->nstate * 4 + 8;
}

tdist_status_t tdist_zero_shard_size(const tdist_zero_t *z, size_t *size)
{
    TDIST_ARG_CHECK(z != NULL && size != NULL, "tdist_zero_shard_size");
    *size = shard_bytes(z);
    return TDIST_OK;
}

tdist_status_t tdist_zero_save_shard(const tdist_zero_t *z, void *buf, size_t size)
{
    static const char who[] = "tdist_zero_save_shard";
    TDIST_ARG_CHECK(z != NULL && buf != NULL, who);
    size_t need = shard_bytes(z);
    if (size < need)
        return tdist__zero_error(z, TDIST_ERR_INVALID_ARG, who,
                                 "buffer of %zu bytes is too small (the shard needs %zu)", size, need);
    tdist__zero_shard_t sh;
    tdist__zero_shard(z, &sh);
    uint8_t *at = buf;
    char magic[8] = SHARD_MAGIC;
    double lr = 0;
    tdist_optim_get_lr(sh.opt, &lr);
    put(&at, magic, 8);
    put_u32(&at, SHARD_VERSION);
    put_u32(&at, (uint32_t)z->opts.kind);
    put_u32(&at, (uint32_t)z->nstate);
    put_u32(&at, (uint32_t)z->size);
    put_u32(&at, (uint32_t)z->rank);
    put_u32(&at, 0);
    put_u64(&at, z->n);
    put_u64(&at, sh.n);
    put(&at, &lr, 8);
    put_u64(&at, z->total);
    for (size_t j = 0; j < z->n; j++) {
        put_u64(&at, z->params[j].count);
        put_u64(&at, z->name_hash[j]);
    }
    for (size_t k = 0; k < sh.n; k++) {
        uint64_t steps = 0;
        tdist_optim_step_count(sh.opt, k, &steps);
        put_u64(&at, sh.pieces[k].param);
        put_u64(&at, sh.pieces[k].offset);
        put_u64(&at, sh.pieces[k].count);
        put_u64(&at, steps);
    }
    for (size_t k = 0; k < sh.n; k++)
        for (int s = 0; s < z->nstate; s++)
            put(&at, tdist__zero_piece_state(sh.opt, k, s), sh.pieces[k].count * 4);
    put_u64(&at, tdist__fnv1a(TDIST__FNV_INIT, buf, (size_t)(at - (uint8_t *)buf)));
    return TDIST_OK;
}

/* A blob checked for framing and for this model and optimizer. */
typedef struct shard_view {
    const uint8_t *p;
    uint64_t npieces;
    const uint8_t *pieces; /* 32 bytes each */
    const uint8_t *data;
    double lr;
} shard_view_t;

static tdist_status_t check_model(const tdist_zero_t *z, const uint8_t *p, size_t b, const char *who)
{
    uint64_t n = get_u64(p + 32);
    if (get_u32(p + 12) != (uint32_t)z->opts.kind || get_u32(p + 16) != (uint32_t)z->nstate)
        return tdist__zero_error(z, TDIST_ERR_MISMATCH, who,
                                 "shard %zu is for %s with %" PRIu32 " state arrays, this ZeRO "
                                 "runs %s with %d",
                                 b, tdist_optim_kind_name((tdist_optim_kind_t)get_u32(p + 12)),
                                 get_u32(p + 16), tdist_optim_kind_name(z->opts.kind), z->nstate);
    for (size_t j = 0; j < z->n && j < n; j++) {
        uint64_t c = get_u64(p + HDR + 16 * j), h = get_u64(p + HDR + 16 * j + 8);
        if (c != z->params[j].count)
            return tdist__zero_error(z, TDIST_ERR_MISMATCH, who,
                                     "the checkpoint is of another model: parameter %zu (%s): "
                                     "%" PRIu64 " elements in the checkpoint, %zu here",
                                     j, z->names[j], c, z->params[j].count);
        if (h != z->name_hash[j])
            return tdist__zero_error(z, TDIST_ERR_MISMATCH, who,
                                     "the checkpoint is of another model: parameter %zu (%s) has "
                                     "another name in the checkpoint", j, z->names[j]);
    }
    if (n != z->n)
        return tdist__zero_error(z, TDIST_ERR_MISMATCH, who,
                                 "the checkpoint is of another model: %" PRIu64
                                 " parameters in the checkpoint, %zu here", n, z->n);
    return TDIST_OK;
}

static tdist_status_t view_shard(const tdist_zero_t *z, const void *blob, size_t size, size_t b,
                                 shard_view_t *v)
{
    static const char who[] = "tdist_zero_load_shards";
    const uint8_t *p = blob;
    if (!p || size < HDR + 8 || memcmp(p, SHARD_MAGIC, 8) != 0)
        return tdist__zero_error(z, TDIST_ERR_INVALID_ARG, who,
                                 "blob %zu (%zu bytes) is not a ZeRO shard", b, size);
    if (get_u32(p + 8) != SHARD_VERSION)
        return tdist__zero_error(z, TDIST_ERR_INVALID_ARG, who, "blob %zu has version %" PRIu32
                                 ", this library reads %u", b, get_u32(p + 8), SHARD_VERSION);
    uint64_t n = get_u64(p + 32), m = get_u64(p + 40), ns = get_u32(p + 16);
    if (n > size / 16 || m > size / 32 || ns > 3)
        return tdist__zero_error(z, TDIST_ERR_INVALID_ARG, who, "blob %zu is truncated", b);
    size_t at = HDR + 16 * n + 32 * m, e = 0;
    for (uint64_t k = 0; k < m; k++) {
        uint64_t c = get_u64(p + HDR + 16 * n + 32 * k + 16);
        if (c > size) return tdist__zero_error(z, TDIST_ERR_INVALID_ARG, who, "blob %zu is corrupt", b);
        e += c;
    }
    if (e > size || at + e * ns * 4 + 8 != size)
        return tdist__zero_error(z, TDIST_ERR_INVALID_ARG, who,
                                 "blob %zu is truncated or has trailing bytes", b);
    if (tdist__fnv1a(TDIST__FNV_INIT, p, size - 8) != get_u64(p + size - 8))
        return tdist__zero_error(z, TDIST_ERR_INVALID_ARG, who, "blob %zu fails its checksum", b);
    TDIST_CHECK(check_model(z, p, b, who));
    v->p = p;
    v->npieces = m;
    v->pieces = p + HDR + 16 * n;
    v->data = p + at;
    memcpy(&v->lr, p + 48, 8);
    return TDIST_OK;
}

/* For my piece k: copy (when apply) the elements the blob's pieces hold,
 * or mark them in covered[0..count) (several shards may hold the same
 * elements: the whole-model state of the overlap hook's first iteration). */
static void cover_piece(const tdist_zero_t *z, const tdist__zero_shard_t *sh, size_t k,
                        const shard_view_t *v, uint8_t *covered)
{
    const tdist__zero_piece_t *q = &sh->pieces[k];
    size_t data_at = 0;
    for (uint64_t i = 0; i < v->npieces; i++) {
        const uint8_t *e = v->pieces + 32 * i;
        uint64_t j = get_u64(e), off = get_u64(e + 8), c = get_u64(e + 16);
        size_t here = data_at;
        data_at += c * (size_t)z->nstate * 4;
        if (j != q->param) continue;
        uint64_t s = off > q->offset ? off : q->offset;
        uint64_t t = off + c < q->offset + q->count ? off + c : q->offset + q->count;
        if (t <= s) continue;
        if (covered) {
            memset(covered + (s - q->offset), 1, t - s);
            continue;
        }
        for (int sl = 0; sl < z->nstate; sl++)
            memcpy(tdist__zero_piece_state(sh->opt, k, sl) + (s - q->offset),
                   v->data + here + ((size_t)sl * c + (s - off)) * 4, (t - s) * 4);
        tdist_optim_set_step_count(sh->opt, k, get_u64(e + 24));
    }
}

/* The elements of piece k the blobs hold (each counted once). */
static size_t count_covered(const tdist_zero_t *z, const tdist__zero_shard_t *sh, size_t k,
                            const shard_view_t *v, size_t nblobs, uint8_t *covered)
{
    size_t n = sh->pieces[k].count, found = 0;
    memset(covered, 0, n);
    for (size_t b = 0; b < nblobs; b++) cover_piece(z, sh, k, &v[b], covered);
    for (size_t i = 0; i < n; i++) found += covered[i];
    return found;
}

tdist_status_t tdist_zero_load_shards(tdist_zero_t *z, const void *const *blobs,
                                      const size_t *sizes, size_t nblobs)
{
    static const char who[] = "tdist_zero_load_shards";
    TDIST_ARG_CHECK(z != NULL && blobs != NULL && sizes != NULL && nblobs > 0, who);
    shard_view_t *v = calloc(nblobs, sizeof *v);
    if (!v) return tdist__zero_error(z, TDIST_ERR_NO_MEMORY, who, "out of memory");
    tdist_status_t st = TDIST_OK;
    for (size_t b = 0; b < nblobs && st == TDIST_OK; b++) st = view_shard(z, blobs[b], sizes[b], b, &v[b]);
    tdist__zero_shard_t sh;
    tdist__zero_shard(z, &sh);
    size_t most = 1;
    for (size_t k = 0; k < sh.n; k++) most = sh.pieces[k].count > most ? sh.pieces[k].count : most;
    uint8_t *covered = st == TDIST_OK ? malloc(most) : NULL;
    if (st == TDIST_OK && !covered) st = tdist__zero_error(z, TDIST_ERR_NO_MEMORY, who, "out of memory");
    for (size_t k = 0; k < sh.n && st == TDIST_OK; k++) {
        const tdist__zero_piece_t *q = &sh.pieces[k];
        size_t found = count_covered(z, &sh, k, v, nblobs, covered);
        if (found != q->count)
            st = tdist__zero_error(z, TDIST_ERR_MISMATCH, who,
                                   "the %zu shards hold %zu of the %zu elements [%zu, %zu) of "
                                   "parameter %zu (%s) this rank owns: pass every shard of the "
                                   "checkpoint", nblobs, found, q->count, q->offset,
                                   q->offset + q->count, q->param, z->names[q->param]);
    }
    if (st == TDIST_OK) {
        for (size_t k = 0; k < sh.n; k++)
            for (size_t b = 0; b < nblobs; b++) cover_piece(z, &sh, k, &v[b], NULL);
        tdist_zero_set_lr(z, v[0].lr);
    }
    free(covered);
    free(v);
    return st;
}
