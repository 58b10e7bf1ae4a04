/*
 * algorithms/powersgd.c — PowerSGD comm hooks: PyTorch 1.13's
 * powerSGD_hook and batched_powerSGD_hook for the DDP reducer. What they
 * compute is in tdist/algorithms.h and docs/algorithms.md; the arithmetic
 * kernels (products, Gram-Schmidt, the generator) are in
 * powersgd_kernels.c.
 *
 * What the state keeps:
 *   - per parameter (pstore_t, indexed like tdist_ddp_create's array): the
 *     error buffer and the warm-start Q. Keyed by parameter, not by bucket,
 *     so both survive the reducer's bucket rebuild;
 *   - per bucket index (slot_t): the plan of the bucket (which parameters
 *     are compressed, where their P and Q slices lie), derived from the
 *     bucket's layout and re-derived when the layout changes, and the
 *     buffers of one reduction: [uncompressed values | P], Q, the copy of
 *     the input for the error. The batched hook also keeps its square
 *     matrix, its Q and the error of the padding here (per bucket, as
 *     PyTorch does: they are dropped when the bucket's size changes).
 *
 * One bucket's chain (unbatched):
 *   hook:     error feedback; gather the uncompressed values; Q (drawn or
 *             kept, orthogonalised); P = M Q; post the SUM all_reduce of
 *             [uncompressed | P]                       -> work, after_p
 *   after_p:  uncompressed / divisor into the bucket; orthogonalise P;
 *             Q = M^T P; post the SUM all_reduce of Q  -> work, after_q
 *   after_q:  Q / divisor (kept as next warm start); bucket = P Q^T;
 *             error = input - output.
 * The hook is registered on the gradients (TDIST_DDP_HOOK_GRADS): the
 * fused unbatched passes (error feedback, every tensor on the large
 * products, no observer) read and write each gradient where it lives;
 * every other path gathers the gradients into the bucket buffer first and
 * scatters the result back at the end of its chain, as the reducer's own
 * copies would.
 * Pipelining: the reducer calls the hook of each bucket as soon as it is
 * ready (during backward) and runs the continuations in backward_end, in
 * bucket order. So the P all_reduces of every bucket are in flight while
 * bucket 0's continuations run, and bucket b's Q all_reduce queues behind
 * them on the group: no bucket waits for another's round trip. Serial
 * mode (opts.serial) runs the whole chain inside the hook instead.
 *
 * Iterations: the iteration count (PyTorch's state.iter) grows when the
 * last bucket of an iteration is hooked; the phase (plain averaging or
 * compression) is decided from the count before that.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "algorithms/internal.h"

#define WHO "tdist_powersgd_hook"
#define BLOCK_FLOATS 32768 /* values of a tensor formed or decompressed at a time (in cache) */

typedef struct pstore {
    float *err; /* count floats when has_err */
    size_t count;
    bool has_err;
    float *q; /* qlen floats (m x r') when has_q */
    size_t qlen;
    bool has_q;
} pstore_t;

typedef struct tens {  /* one compressed parameter of a bucket */
    size_t param, off; /* index, element offset in the bucket */
    size_t n, m, r;    /* n x m matrix, rank r' */
    size_t poff, qoff; /* its P slice (in pu, after the uncompressed values) and Q slice */
} tens_t;

typedef struct slot {
    /* the layout the plan was made for */
    uint64_t layout;
    bool planned;
    size_t count, nparams;
    size_t *lay_idx, *lay_cnt; /* the layout's parameters (kept for save) */
    /* unbatched plan */
    tens_t *t;
    size_t nt;
    size_t *uoff, *ucnt, nu, ulen; /* uncompressed pieces of the bucket */
    size_t plen, qlen;
    /* buffers */
    float *pu, *q, *cp, *tmp;
    /* batched */
    size_t side, r;
    float *mat, *bq, *pad_err;
    bool has_bq, has_pad_err;
    /* this call (the hook on the gradients): direct, the fused passes read
     * and write the gradients where they live; else they were gathered
     * into the bucket buffer and are scattered back at the end */
    bool direct;
} slot_t;

struct tdist_powersgd {
    tdist_powersgd_opts_t o; /* param_rows points to rows below */
    size_t *rows;
    char desc[TDIST__AGREE_DESC];
    uint64_t config;
    tdist__agree_t agree;
    int64_t iter;
    int64_t cur; /* the iteration of the bucket being hooked */
    pstore_t *ps;
    size_t nps;
    slot_t *slots;
    size_t nslots;
};

void tdist_powersgd_opts_init(tdist_powersgd_opts_t *opts)
{
    if (!opts) return;
    memset(opts, 0, sizeof *opts);
    opts->matrix_approximation_rank = 1;
    opts->start_powerSGD_iter = 1000;
    opts->min_compression_rate = 2.0;
    opts->use_error_feedback = true;
    opts->warm_start = true;
    opts->error_feedback_uncompressed = true;
}

/* ------------------------------------------------------------ the state */

static tdist_status_t check_opts(const tdist_powersgd_opts_t *o)
{
    const char *fn = "tdist_powersgd_create";
    if (o->matrix_approximation_rank < 1)
        return tdist__error(TDIST_ERR_INVALID_ARG,
                            "%s: opts.matrix_approximation_rank is %d; it must be >= 1", fn,
                            o->matrix_approximation_rank);
    if (o->start_powerSGD_iter <= 1)
        return tdist__error(TDIST_ERR_INVALID_ARG,
                            "%s: opts.start_powerSGD_iter is %lld; it must be > 1 (the first "
                            "iterations average exactly while the reducer settles its buckets)",
                            fn, (long long)o->start_powerSGD_iter);
    if (!isfinite(o->min_compression_rate) || o->min_compression_rate < 0)
        return tdist__error(TDIST_ERR_INVALID_ARG,
                            "%s: opts.min_compression_rate is %g; it must be finite and >= 0", fn,
                            o->min_compression_rate);
    if (!isfinite(o->orthogonalization_epsilon) || o->orthogonalization_epsilon < 0)
        return tdist__error(TDIST_ERR_INVALID_ARG,
                            "%s: opts.orthogonalization_epsilon is %g; it must be finite and >= 0",
                            fn, (double)o->orthogonalization_epsilon);
    if (!o->batched && (!o->param_rows || o->num_params == 0))
        return tdist__error(TDIST_ERR_INVALID_ARG,
                            "%s: opts.param_rows is %s: the unbatched hook needs shape[0] of "
                            "every parameter (0 for a 1-D one)",
                            fn, o->param_rows ? "empty (num_params 0)" : "NULL");
    if (o->num_initial_q > 0 && !o->initial_q)
        return tdist__error(TDIST_ERR_INVALID_ARG,
                            "%s: opts.num_initial_q is %zu but opts.initial_q is NULL", fn,
                            o->num_initial_q);
    return TDIST_OK;
}

/* The agreed identity: every option that changes results or the order of
 * collectives. */
static void set_identity(tdist_powersgd_t *s)
{
    const tdist_powersgd_opts_t *o = &s->o;
    uint64_t f[10] = {(uint64_t)o->matrix_approximation_rank,
                      (uint64_t)o->start_powerSGD_iter,
                      0,
                      o->use_error_feedback,
                      o->warm_start,
                      0,
                      o->random_seed,
                      o->batch_tensors_with_same_shape | (uint64_t)o->batched << 1 |
                          (uint64_t)o->error_feedback_uncompressed << 2 | (uint64_t)o->serial << 3 |
                          (uint64_t)o->repair_zero << 4,
                      o->num_params,
                      o->num_initial_q};
    memcpy(&f[2], &o->min_compression_rate, sizeof(double));
    memcpy(&f[5], &o->orthogonalization_epsilon, sizeof(float));
    uint64_t h = tdist__fnv1a(TDIST__FNV_INIT, f, sizeof f);
    if (s->rows) h = tdist__fnv1a(h, s->rows, o->num_params * sizeof *s->rows);
    for (size_t i = 0; i < o->num_initial_q; i++) {
        uint8_t given = o->initial_q[i] != NULL;
        h = tdist__fnv1a(h, &given, 1);
    }
    s->config = h;
    /* written whole, then cut to the agreement's length (an extreme
     * option can make it longer; the hash above is what is compared) */
    char desc[160];
    snprintf(desc, sizeof desc, "%spowerSGD_hook(rank %d, start %lld, rate %g%s%s%s)",
             o->batched ? "batched_" : "", o->matrix_approximation_rank,
             (long long)o->start_powerSGD_iter, o->min_compression_rate,
             o->use_error_feedback ? ", ef" : "", o->warm_start ? ", warm" : "",
             o->repair_zero ? ", repair" : "");
    size_t n = strlen(desc);
    if (n >= sizeof s->desc) n = sizeof s->desc - 1;
    memcpy(s->desc, desc, n);
    s->desc[n] = '\0';
}

tdist_status_t tdist_powersgd_create(const tdist_powersgd_opts_t *opts, tdist_powersgd_t **out)
{
    tdist_powersgd_opts_t o;
    tdist_powersgd_opts_init(&o);
    if (opts) o = *opts;
    if (!out) return tdist__error(TDIST_ERR_INVALID_ARG, "tdist_powersgd_create: out is NULL");
    TDIST_CHECK(check_opts(&o));
    tdist_powersgd_t *s = calloc(1, sizeof *s);
    if (!s) return tdist__error(TDIST_ERR_NO_MEMORY, "tdist_powersgd_create: out of memory");
    s->o = o;
    if (o.param_rows && o.num_params) {
        s->rows = malloc(o.num_params * sizeof *s->rows);
        if (!s->rows) {
            free(s);
            return tdist__error(TDIST_ERR_NO_MEMORY, "tdist_powersgd_create: out of memory");
        }
        memcpy(s->rows, o.param_rows, o.num_params * sizeof *s->rows);
    } else {
        s->o.num_params = 0;
    }
    s->o.param_rows = s->rows;
    set_identity(s);
    *out = s;
    return TDIST_OK;
}

static void slot_free_plan(slot_t *sl)
{
    free(sl->t);
    free(sl->uoff);
    free(sl->ucnt);
    free(sl->pu);
    free(sl->q);
    free(sl->cp);
    free(sl->tmp);
    free(sl->mat);
    sl->t = NULL;
    sl->uoff = sl->ucnt = NULL;
    sl->pu = sl->q = sl->cp = sl->tmp = sl->mat = NULL;
    sl->nt = sl->nu = sl->ulen = sl->plen = sl->qlen = 0;
    sl->planned = false;
}

static void slot_free(slot_t *sl)
{
    slot_free_plan(sl);
    free(sl->lay_idx);
    free(sl->lay_cnt);
    free(sl->bq);
    free(sl->pad_err);
    memset(sl, 0, sizeof *sl);
}

static void stores_free(pstore_t *ps, size_t n, slot_t *slots, size_t nslots)
{
    for (size_t i = 0; i < n; i++) {
        free(ps[i].err);
        free(ps[i].q);
    }
    free(ps);
    for (size_t i = 0; i < nslots; i++) slot_free(&slots[i]);
    free(slots);
}

void tdist_powersgd_destroy(tdist_powersgd_t *s)
{
    if (!s) return;
    stores_free(s->ps, s->nps, s->slots, s->nslots);
    free(s->rows);
    free(s);
}

tdist_status_t tdist_powersgd_register(tdist_ddp_t *ddp, tdist_powersgd_t *s)
{
    if (!ddp || !s)
        return tdist__error(TDIST_ERR_INVALID_ARG, "tdist_powersgd_register: %s is NULL",
                            !ddp ? "ddp" : "the PowerSGD state");
    /* on the gradients where they live (the fused unbatched passes read
     * and write them in place; the other paths gather them into the
     * bucket buffer and scatter the result back) */
    return tdist_ddp_register_comm_hook_flags(ddp, s, tdist_powersgd_hook, TDIST_DDP_HOOK_GRADS);
}

int64_t tdist_powersgd_iteration(const tdist_powersgd_t *s)
{
    return s ? s->iter : 0;
}

/* ------------------------------------------------------------- planning */

static void *alloc_floats(size_t n)
{
    return malloc((n ? n : 1) * sizeof(float));
}

static uint64_t layout_hash(const tdist_ddp_bucket_t *b)
{
    uint64_t h = tdist__fnv1a(TDIST__FNV_INIT, &b->count, sizeof b->count);
    h = tdist__fnv1a(h, &b->num_params, sizeof b->num_params);
    h = tdist__fnv1a(h, b->param_indices, b->num_params * sizeof *b->param_indices);
    return tdist__fnv1a(h, b->counts, b->num_params * sizeof *b->counts);
}

static tdist_status_t grow_stores(tdist_powersgd_t *s, const tdist_ddp_bucket_t *b)
{
    size_t need = TDIST_MAX(b->num_buckets, b->index + 1);
    if (need > s->nslots) {
        slot_t *n = realloc(s->slots, need * sizeof *n);
        if (!n) return tdist__hook_error(b, TDIST_ERR_NO_MEMORY, WHO, "out of memory");
        memset(n + s->nslots, 0, (need - s->nslots) * sizeof *n);
        s->slots = n;
        s->nslots = need;
    }
    size_t np = 0;
    for (size_t j = 0; j < b->num_params; j++) np = TDIST_MAX(np, b->param_indices[j] + 1);
    if (np > s->nps) {
        pstore_t *n = realloc(s->ps, np * sizeof *n);
        if (!n) return tdist__hook_error(b, TDIST_ERR_NO_MEMORY, WHO, "out of memory");
        memset(n + s->nps, 0, (np - s->nps) * sizeof *n);
        s->ps = n;
        s->nps = np;
    }
    return TDIST_OK;
}

/* Whether parameter j of the bucket is compressed; fills t's shape. */
static tdist_status_t classify(const tdist_powersgd_t *s, const tdist_ddp_bucket_t *b, size_t j,
                               tens_t *t, bool *compress)
{
    size_t p = b->param_indices[j], cnt = b->counts[j];
    size_t rows = p < s->o.num_params ? s->rows[p] : 0;
    *compress = false;
    if (rows == 0 || cnt == 0) return TDIST_OK; /* 1-D: never */
    if (cnt % rows != 0)
        return tdist__hook_error(b, TDIST_ERR_INVALID_ARG, WHO,
                                 "opts.param_rows[%zu] = %zu does not divide the parameter's "
                                 "%zu elements",
                                 p, rows, cnt);
    size_t n = rows, m = cnt / rows, r = (size_t)s->o.matrix_approximation_rank;
    r = TDIST_MIN(r, TDIST_MIN(n, m));
    *t = (tens_t){.param = p, .off = b->offsets[j], .n = n, .m = m, .r = r};
    /* PyTorch's _should_compress, in double as Python computes it */
    *compress = (double)(n + m) * (double)r * s->o.min_compression_rate < (double)n * (double)m;
    return TDIST_OK;
}

/* The compressed tensors grouped by shape (groups in order of first
 * appearance, bucket order inside a group: PyTorch's P/Q memory layout)
 * and the uncompressed pieces in bucket order. */
static tdist_status_t plan_tensors(tdist_powersgd_t *s, slot_t *sl, const tdist_ddp_bucket_t *b)
{
    size_t np = b->num_params;
    tens_t *all = calloc(np ? np : 1, sizeof *all);
    bool *comp = calloc(np ? np : 1, sizeof *comp);
    sl->t = calloc(np ? np : 1, sizeof *sl->t);
    sl->uoff = calloc(np ? np : 1, sizeof *sl->uoff);
    sl->ucnt = calloc(np ? np : 1, sizeof *sl->ucnt);
    tdist_status_t st = TDIST_OK;
    if (!all || !comp || !sl->t || !sl->uoff || !sl->ucnt) {
        st = tdist__hook_error(b, TDIST_ERR_NO_MEMORY, WHO, "out of memory");
        goto out;
    }
    for (size_t j = 0; j < np && st == TDIST_OK; j++) {
        st = classify(s, b, j, &all[j], &comp[j]);
        if (st == TDIST_OK && !comp[j] && b->counts[j] > 0) {
            sl->uoff[sl->nu] = b->offsets[j];
            sl->ucnt[sl->nu++] = b->counts[j];
            sl->ulen += b->counts[j];
        }
    }
    for (size_t j = 0; j < np && st == TDIST_OK; j++) {
        if (!comp[j]) continue;
        for (size_t k = j; k < np; k++) { /* j opens a group: every later one of its shape */
            if (!comp[k] || all[k].n != all[j].n || all[k].m != all[j].m) continue;
            tens_t t = all[k];
            t.poff = sl->plen;
            t.qoff = sl->qlen;
            sl->plen += t.n * t.r;
            sl->qlen += t.m * t.r;
            sl->t[sl->nt++] = t;
            if (k != j) comp[k] = false;
        }
        comp[j] = false;
    }
out:
    free(all);
    free(comp);
    return st;
}

/* (Re)make the slot's plan and buffers for this bucket's layout. */
static tdist_status_t plan(tdist_powersgd_t *s, slot_t *sl, const tdist_ddp_bucket_t *b)
{
    uint64_t lay = layout_hash(b);
    if (sl->planned && sl->layout == lay) return TDIST_OK;
    size_t old_side = sl->side, old_count = sl->count, old_r = sl->r;
    slot_free_plan(sl);
    free(sl->lay_idx);
    free(sl->lay_cnt);
    sl->lay_idx = malloc((b->num_params ? b->num_params : 1) * sizeof(size_t));
    sl->lay_cnt = malloc((b->num_params ? b->num_params : 1) * sizeof(size_t));
    if (!sl->lay_idx || !sl->lay_cnt)
        return tdist__hook_error(b, TDIST_ERR_NO_MEMORY, WHO, "out of memory");
    memcpy(sl->lay_idx, b->param_indices, b->num_params * sizeof(size_t));
    memcpy(sl->lay_cnt, b->counts, b->num_params * sizeof(size_t));
    sl->count = b->count;
    sl->nparams = b->num_params;
    size_t rows_max = 1, cp_len = b->count;
    if (s->o.batched) {
        size_t side = (size_t)ceil(sqrt((double)b->count));
        while (side * side < b->count) side++;
        while (side > 0 && (side - 1) * (side - 1) >= b->count) side--;
        sl->side = side;
        sl->r = TDIST_MIN((size_t)s->o.matrix_approximation_rank, side);
        if (side != old_side || sl->r != old_r) sl->has_bq = false;
        if (side != old_side || b->count != old_count) sl->has_pad_err = false;
        if (!sl->has_bq) {
            free(sl->bq);
            sl->bq = alloc_floats(side * sl->r);
        }
        if (!sl->has_pad_err) {
            free(sl->pad_err);
            sl->pad_err = alloc_floats(side * side - b->count);
        }
        if (!sl->bq || !sl->pad_err)
            return tdist__hook_error(b, TDIST_ERR_NO_MEMORY, WHO, "out of memory");
        cp_len = side * side;
        rows_max = side;
        sl->plen = side * sl->r;
        sl->qlen = side * sl->r;
        sl->mat = alloc_floats(cp_len);
    } else {
        TDIST_CHECK(plan_tensors(s, sl, b));
        for (size_t i = 0; i < sl->nt; i++)
            rows_max = TDIST_MAX(rows_max, TDIST_MAX(sl->t[i].n, sl->t[i].m));
    }
    sl->pu = alloc_floats(sl->ulen + sl->plen);
    sl->q = alloc_floats(sl->qlen);
    sl->cp = alloc_floats(cp_len);
    sl->tmp = alloc_floats(rows_max);
    if (!sl->pu || !sl->q || !sl->cp || !sl->tmp || (s->o.batched && !sl->mat))
        return tdist__hook_error(b, TDIST_ERR_NO_MEMORY, WHO, "out of memory for %zu floats",
                                 sl->ulen + sl->plen + sl->qlen + 3 * cp_len);
    sl->layout = lay;
    sl->planned = true;
    return TDIST_OK;
}

/* ------------------------------------------------------------ the hook */

static void observe(const tdist_powersgd_t *s, const tdist_ddp_bucket_t *b,
                    tdist_powersgd_stage_t stage, const float *data, size_t n)
{
    if (s->o.observe) s->o.observe(s->o.observe_arg, b, stage, data, n);
}

static slot_t *slot_of(tdist_powersgd_t *s, const tdist_ddp_bucket_t *b)
{
    return &s->slots[b->index];
}

/* The bucket's parameters lie in increasing, disjoint ranges (the
 * reducer's layout): the fused error-feedback passes walk them in order. */
static bool params_in_order(const tdist_ddp_bucket_t *b)
{
    size_t done = 0;
    for (size_t j = 0; j < b->num_params; j++) {
        if (b->offsets[j] < done || b->counts[j] > b->count - b->offsets[j]) return false;
        done = b->offsets[j] + b->counts[j];
    }
    return true;
}

/* The unbatched hook with error feedback runs its passes fused (the
 * input formed with P = M Q, the output with the error) when the
 * parameters are in order and every compressed tensor takes the
 * large-product kernel (PyTorch's bmm rounds the small ones differently;
 * row blocks of a product must take the kernel the whole takes). */
static bool fused_plan(const tdist_powersgd_t *s, const slot_t *sl, const tdist_ddp_bucket_t *b)
{
    if (s->o.batched || !s->o.use_error_feedback || !params_in_order(b)) return false;
    for (size_t i = 0; i < sl->nt; i++)
        if ((double)sl->t[i].n * (double)sl->t[i].r * (double)sl->t[i].m < 400.0) return false;
    return true;
}

/* Rows of an n x m tensor handled at a time by the fused passes: about
 * BLOCK_FLOATS values (cache-sized), a multiple of 16 (the products'
 * vector kernels take 16 rows at once). */
static size_t block_rows(size_t m) { return 16 * TDIST_MAX((size_t)1, BLOCK_FLOATS / (16 * m)); }

/* The compressed tensor of the bucket at offset off, or NULL. */
static const tens_t *tensor_at(const slot_t *sl, size_t off)
{
    for (size_t i = 0; i < sl->nt; i++)
        if (sl->t[i].off == off) return &sl->t[i];
    return NULL;
}

/* Where the fused passes find bucket parameter j's values: its gradient
 * (direct), else its place in the bucket buffer. */
static float *grad_j(const slot_t *sl, const tdist_ddp_bucket_t *b, size_t j)
{
    return sl->direct ? (float *)b->grads[j] : (float *)b->buffer + b->offsets[j];
}

/* The same for the parameter at bucket offset off. */
static float *grad_at(const slot_t *sl, const tdist_ddp_bucket_t *b, size_t off)
{
    if (!sl->direct) return (float *)b->buffer + off;
    for (size_t j = 0; j < b->num_params; j++)
        if (b->offsets[j] == off && b->counts[j] > 0) return b->grads[j];
    return (float *)b->buffer + off; /* not reached: off is a parameter's */
}

/* Between the gradients and the bucket buffer (a hook on the gradients
 * on a path that works on the buffer): in (gradients -> buffer) or out.
 * Nothing where they are the same memory (gradient_as_bucket_view). */
static void move_grads(const tdist_ddp_bucket_t *b, bool in)
{
    if (!b->grads) return;
    for (size_t j = 0; j < b->num_params; j++) {
        float *f = (float *)b->buffer + b->offsets[j], *g = b->grads[j];
        if (f == g || b->counts[j] == 0) continue;
        if (in)
            memcpy(f, g, b->counts[j] * sizeof *f);
        else
            memcpy(g, f, b->counts[j] * sizeof *f);
    }
}

/* The uncompressed values between the bucket (each parameter's place,
 * grad_j) and their packed copy u: into u (pack) or back from it divided
 * by dv. */
static void uncompressed(const slot_t *sl, const tdist_ddp_bucket_t *b, float *u, bool pack,
                         float dv)
{
    for (size_t j = 0, k = 0; j < b->num_params && k < sl->nu; j++) {
        if (b->counts[j] == 0 || sl->uoff[k] != b->offsets[j]) continue;
        float *g = grad_j(sl, b, j);
        if (pack)
            memcpy(u, g, sl->ucnt[k] * sizeof *u);
        else
            for (size_t i = 0; i < sl->ucnt[k]; i++) g[i] = u[i] / dv;
        u += sl->ucnt[k++];
    }
}

/* x[0..c) = x + e (e NULL: no error yet, x stays), also into copy (NULL:
 * not). */
static void add_error(float *x, const float *e, size_t c, float *copy)
{
    if (!e) {
        if (copy) memcpy(copy, x, c * sizeof *x);
        return;
    }
    if (copy) {
        for (size_t i = 0; i < c; i++) x[i] = copy[i] = x[i] + e[i];
    } else {
        for (size_t i = 0; i < c; i++) x[i] = x[i] + e[i];
    }
}

/* feedback_in of the unbatched hook in one pass with P = M Q: each
 * parameter's input (gradient + error) into the bucket, a block of rows
 * at a time, and a compressed tensor's P rows from the block while it is
 * in cache. The copy of the input is kept for the uncompressed values
 * (their error needs it: the bucket gets their average first), and for
 * everything when an observer wants the bucket-wide error. Q is ready. */
static void feedback_in_fused(tdist_powersgd_t *s, slot_t *sl, const tdist_ddp_bucket_t *b)
{
    float *g = b->buffer, *cp = sl->cp, *pp = sl->pu + sl->ulen;
    const bool keep = s->o.observe != NULL; /* never direct */
    size_t done = 0;
    for (size_t j = 0; j < b->num_params; j++) {
        const pstore_t *p = &s->ps[b->param_indices[j]];
        size_t o = b->offsets[j], c = b->counts[j];
        float *gj = grad_j(sl, b, j);
        if (keep) memcpy(cp + done, g + done, (o - done) * sizeof *cp);
        done = o + c;
        const float *e = p->has_err && p->count == c ? p->err : NULL; /* PyTorch: once one exists */
        const tens_t *t = c > 0 ? tensor_at(sl, o) : NULL;
        if (!t) {
            add_error(gj, e, c, cp + o);
            continue;
        }
        const size_t rb = block_rows(t->m);
        for (size_t i0 = 0; i0 < t->n; i0 += rb) {
            size_t rows = TDIST_MIN(rb, t->n - i0), at = i0 * t->m;
            add_error(gj + at, e ? e + at : NULL, rows * t->m, keep ? cp + o + at : NULL);
            tdist__psgd_gemm(pp + t->poff + i0 * t->r, gj + at, sl->q + t->qoff, rows, t->m,
                             t->r, 0, 0, true);
        }
    }
    if (keep) memcpy(cp + done, g + done, (b->count - done) * sizeof *cp);
}

/* Error feedback on the way in: add each parameter's error to its
 * gradient (PyTorch: only once an error exists), then keep a copy of the
 * input for the new error. Batched: into the padded square matrix. */
static void feedback_in(tdist_powersgd_t *s, slot_t *sl, const tdist_ddp_bucket_t *b, float *x)
{
    const float *g = b->buffer;
    if (x != g) {
        memcpy(x, g, b->count * sizeof *x);
        size_t len = sl->side * sl->side;
        for (size_t i = b->count; i < len; i++) x[i] = 0.0f;
    }
    if (!s->o.use_error_feedback) return;
    for (size_t j = 0; j < b->num_params; j++) {
        const pstore_t *p = &s->ps[b->param_indices[j]];
        if (!p->has_err || p->count != b->counts[j]) continue;
        float *v = x + b->offsets[j];
        for (size_t i = 0; i < p->count; i++) v[i] = v[i] + p->err[i];
    }
    if (s->o.batched && sl->has_pad_err)
        for (size_t i = b->count; i < sl->side * sl->side; i++)
            x[i] = x[i] + sl->pad_err[i - b->count];
    memcpy(sl->cp, x, (s->o.batched ? sl->side * sl->side : b->count) * sizeof *x);
}

/* Parameter p's error array, with room for count values. */
static tdist_status_t err_array(pstore_t *p, size_t count, const tdist_ddp_bucket_t *b)
{
    if (p->count == count && p->err) return TDIST_OK;
    free(p->err);
    p->err = alloc_floats(count);
    p->count = count;
    p->has_err = false;
    if (!p->err) return tdist__hook_error(b, TDIST_ERR_NO_MEMORY, WHO, "out of memory");
    return TDIST_OK;
}

/* feedback_out of the unbatched hook in one pass: each parameter's error
 * (input - output, 0 for an uncompressed one without
 * error_feedback_uncompressed) straight into its error array; the
 * bucket-wide copy only when an observer wants to see it. out: the flat
 * output, or NULL for each parameter's place (grad_j). */
static tdist_status_t feedback_out_fused(tdist_powersgd_t *s, slot_t *sl,
                                         const tdist_ddp_bucket_t *b, const float *out,
                                         bool compressed_done)
{
    const bool keep = s->o.observe != NULL;
    float *cp = sl->cp;
    size_t done = 0, u = 0;
    for (size_t j = 0; j < b->num_params; j++) {
        pstore_t *p = &s->ps[b->param_indices[j]];
        size_t o = b->offsets[j], c = b->counts[j];
        if (keep)
            for (size_t i = done; i < o; i++) cp[i] = cp[i] - out[i];
        bool unc = c > 0 && u < sl->nu && sl->uoff[u] == o;
        u += unc;
        done = o + c;
        if (compressed_done && !unc && c > 0) continue; /* decompress_with_error did it */
        TDIST_CHECK(err_array(p, c, b));
        float *e = p->err;
        if (unc && !s->o.error_feedback_uncompressed) {
            memset(e, 0, c * sizeof *e);
            if (keep) memset(cp + o, 0, c * sizeof *cp);
        } else if (keep) {
            for (size_t i = 0; i < c; i++) e[i] = cp[o + i] = cp[o + i] - out[o + i];
        } else {
            const float *oj = out ? out + o : grad_j(sl, b, j);
            for (size_t i = 0; i < c; i++) e[i] = cp[o + i] - oj[i];
        }
        p->has_err = true;
    }
    if (keep)
        for (size_t i = done; i < b->count; i++) cp[i] = cp[i] - out[i];
    observe(s, b, TDIST_POWERSGD_ERROR, cp, b->count);
    return TDIST_OK;
}

/* Error feedback on the way out: err = input - output (in cp), kept per
 * parameter (and per bucket for the batched padding). */
static tdist_status_t feedback_out(tdist_powersgd_t *s, slot_t *sl, const tdist_ddp_bucket_t *b,
                                   const float *outv)
{
    if (!s->o.use_error_feedback) return TDIST_OK;
    if (!s->o.batched && params_in_order(b)) return feedback_out_fused(s, sl, b, outv, false);
    size_t len = s->o.batched ? sl->side * sl->side : b->count;
    for (size_t i = 0; i < len; i++) sl->cp[i] = sl->cp[i] - outv[i];
    if (!s->o.batched && !s->o.error_feedback_uncompressed)
        for (size_t u = 0; u < sl->nu; u++)
            memset(sl->cp + sl->uoff[u], 0, sl->ucnt[u] * sizeof(float));
    observe(s, b, TDIST_POWERSGD_ERROR, sl->cp, len);
    for (size_t j = 0; j < b->num_params; j++) {
        pstore_t *p = &s->ps[b->param_indices[j]];
        TDIST_CHECK(err_array(p, b->counts[j], b));
        memcpy(p->err, sl->cp + b->offsets[j], p->count * sizeof(float));
        p->has_err = true;
    }
    if (s->o.batched) {
        memcpy(sl->pad_err, sl->cp + b->count, (len - b->count) * sizeof(float));
        sl->has_pad_err = true;
    }
    return TDIST_OK;
}

/* Whether a kept Q (m x r) can be used again: every column finite and
 * not all 0 (repair_zero; Q is reduced, so every rank decides alike). */
static bool q_usable(const float *q, size_t m, size_t r)
{
    for (size_t c = 0; c < r; c++) {
        bool nonzero = false;
        for (size_t i = 0; i < m; i++) {
            float v = q[i * r + c];
            if (!isfinite(v)) return false;
            nonzero = nonzero || v != 0.0f;
        }
        if (!nonzero) return false;
    }
    return true;
}

/* A fresh Q of key `key` (m x r): injected or drawn. */
static void draw_q(const tdist_powersgd_t *s, float *q, size_t len, uint64_t draw, size_t key)
{
    if (key < s->o.num_initial_q && s->o.initial_q[key])
        memcpy(q, s->o.initial_q[key], len * sizeof *q);
    else
        tdist__psgd_randn(q, len, s->o.random_seed, draw, key);
}

/* The Q each compressed tensor of the bucket multiplies: kept from the
 * last iteration (warm start), or drawn for the whole bucket (PyTorch
 * draws for a bucket when one of its Qs is missing); orthogonalised. */
static void prepare_q(tdist_powersgd_t *s, slot_t *sl, const tdist_ddp_bucket_t *b)
{
    bool fresh = !s->o.warm_start;
    for (size_t i = 0; i < sl->nt && !fresh; i++) {
        const pstore_t *p = &s->ps[sl->t[i].param];
        fresh = !p->has_q || p->qlen != sl->t[i].m * sl->t[i].r;
    }
    uint64_t draw = (uint64_t)s->cur;
    for (size_t i = 0; i < sl->nt; i++) {
        const tens_t *t = &sl->t[i];
        float *q = sl->q + t->qoff;
        if (fresh) {
            draw_q(s, q, t->m * t->r, draw, t->param);
        } else {
            memcpy(q, s->ps[t->param].q, t->m * t->r * sizeof *q);
            if (s->o.repair_zero && !q_usable(q, t->m, t->r))
                draw_q(s, q, t->m * t->r, draw, t->param);
        }
        tdist__psgd_orthogonalize(q, t->m, t->r, s->o.orthogonalization_epsilon,
                                  s->o.repair_zero, sl->tmp);
    }
    observe(s, b, TDIST_POWERSGD_Q_USED, sl->q, sl->qlen);
}

static tdist_status_t post(const tdist_ddp_bucket_t *b, float *buf, size_t n, const char *what,
                           tdist_work_t **work)
{
    tdist_status_t st = tdist_all_reduce(b->pg, buf, buf, n, TDIST_F32, TDIST_SUM, NULL, work);
    if (st != TDIST_OK)
        return tdist__error_context(st,
                                    "%s: rank %d group %s iteration %llu bucket %zu: all_reduce "
                                    "of %s (f32 x %zu)",
                                    WHO, tdist_pg_rank(b->pg), tdist_pg_name(b->pg),
                                    (unsigned long long)b->iteration, b->index, what, n);
    return TDIST_OK;
}

static tdist_status_t after_q(void *state, const tdist_ddp_bucket_t *b,
                              tdist_ddp_hook_result_t *next);

/* P is summed: average the uncompressed values into the bucket,
 * orthogonalise P, compute and post Q = M^T P. */
static tdist_status_t after_p(void *state, const tdist_ddp_bucket_t *b,
                              tdist_ddp_hook_result_t *next)
{
    tdist_powersgd_t *s = state;
    slot_t *sl = slot_of(s, b);
    const float dv = (float)b->divisor;
    observe(s, b, TDIST_POWERSGD_P_REDUCED, sl->pu, sl->ulen + sl->plen);
    if (params_in_order(b)) {
        uncompressed(sl, b, sl->pu, false, dv);
    } else {
        const float *u = sl->pu;
        float *g = b->buffer;
        for (size_t k = 0; k < sl->nu; u += sl->ucnt[k], k++)
            for (size_t i = 0; i < sl->ucnt[k]; i++) g[sl->uoff[k] + i] = u[i] / dv;
    }
    float *p = sl->pu + sl->ulen;
    for (size_t i = 0; i < sl->nt; i++) {
        const tens_t *t = &sl->t[i];
        tdist__psgd_orthogonalize(p + t->poff, t->n, t->r, s->o.orthogonalization_epsilon,
                                  s->o.repair_zero, sl->tmp);
    }
    observe(s, b, TDIST_POWERSGD_P_ORTHO, p, sl->plen);
    for (size_t i = 0; i < sl->nt; i++) {
        const tens_t *t = &sl->t[i];
        tdist__psgd_gemm(sl->q + t->qoff, grad_at(sl, b, t->off), p + t->poff, t->m, t->n, t->r, 1,
                         0, false);
    }
    observe(s, b, TDIST_POWERSGD_Q_LOCAL, sl->q, sl->qlen);
    TDIST_CHECK(post(b, sl->q, sl->qlen, "Q", &next->work));
    next->then = after_q;
    return TDIST_OK;
}

/* Compressed tensor t's P Q^T into the bucket, a block of rows at a time,
 * each followed by its error (input - output) into the parameter's error
 * array while the block is in cache (and into the bucket-wide copy when an
 * observer wants it). The blocks take the product's large-product kernel,
 * the one the whole tensor takes (the caller checks it is not the naive
 * one), so every element is the same chain. */
static tdist_status_t decompress_with_error(tdist_powersgd_t *s, slot_t *sl,
                                            const tdist_ddp_bucket_t *b, const tens_t *t,
                                            const float *p, const float *q)
{
    pstore_t *ps = &s->ps[t->param];
    TDIST_CHECK(err_array(ps, t->n * t->m, b));
    float *g = grad_at(sl, b, t->off), *cp = sl->cp + t->off, *e = ps->err;
    const bool keep = s->o.observe != NULL;
    const size_t rb = block_rows(t->m);
    for (size_t i0 = 0; i0 < t->n; i0 += rb) {
        size_t rows = TDIST_MIN(rb, t->n - i0), at = i0 * t->m, len = rows * t->m;
        /* the output lands in the error array first; g still holds the
         * input M: then error = M - output and the output into g */
        tdist__psgd_gemm(e + at, p + i0 * t->r, q, rows, t->r, t->m, 0, 1, true);
        for (size_t i = at; i < at + len; i++) {
            float out = e[i];
            e[i] = g[i] - out;
            g[i] = out;
        }
        if (keep) memcpy(cp + at, e + at, len * sizeof *e);
    }
    ps->has_err = true;
    return TDIST_OK;
}

/* Q is summed: divide, keep it, decompress P Q^T into the bucket, and
 * the new error. */
static tdist_status_t after_q(void *state, const tdist_ddp_bucket_t *b,
                              tdist_ddp_hook_result_t *next)
{
    (void)next;
    tdist_powersgd_t *s = state;
    slot_t *sl = slot_of(s, b);
    float *g = b->buffer;
    const float dv = (float)b->divisor;
    for (size_t i = 0; i < sl->qlen; i++) sl->q[i] = sl->q[i] / dv;
    observe(s, b, TDIST_POWERSGD_Q_REDUCED, sl->q, sl->qlen);
    const float *p = sl->pu + sl->ulen;
    /* the error with each tensor's decompression, in the same pass, when
     * every tensor takes the large-product kernel (PyTorch's bmm rounds
     * the small ones differently) */
    const bool fuse = fused_plan(s, sl, b);
    for (size_t i = 0; i < sl->nt; i++) {
        const tens_t *t = &sl->t[i];
        pstore_t *ps = &s->ps[t->param];
        size_t len = t->m * t->r;
        if (ps->qlen != len || !ps->q) {
            free(ps->q);
            ps->q = alloc_floats(len);
            ps->qlen = len;
            ps->has_q = false;
            if (!ps->q) return tdist__hook_error(b, TDIST_ERR_NO_MEMORY, WHO, "out of memory");
        }
        memcpy(ps->q, sl->q + t->qoff, len * sizeof(float));
        ps->has_q = true;
        if (fuse)
            TDIST_CHECK(decompress_with_error(s, sl, b, t, p + t->poff, sl->q + t->qoff));
        else
            tdist__psgd_gemm(g + t->off, p + t->poff, sl->q + t->qoff, t->n, t->r, t->m, 0, 1, false);
    }
    observe(s, b, TDIST_POWERSGD_OUTPUT, g, b->count);
    tdist_status_t st = fuse ? feedback_out_fused(s, sl, b, sl->direct ? NULL : g, true)
                             : feedback_out(s, sl, b, g);
    if (!sl->direct) move_grads(b, false);
    return st;
}

/* The unbatched hook from error feedback to the post of [U | P]. */
static tdist_status_t begin(tdist_powersgd_t *s, slot_t *sl, const tdist_ddp_bucket_t *b,
                            tdist_ddp_hook_result_t *res)
{
    float *g = b->buffer;
    const bool fuse = fused_plan(s, sl, b);
    if (fuse) {
        prepare_q(s, sl, b); /* Q does not depend on the input */
        feedback_in_fused(s, sl, b);
    } else {
        feedback_in(s, sl, b, g);
    }
    if (fuse) {
        uncompressed(sl, b, sl->pu, true, 1.0f);
    } else {
        float *u = sl->pu;
        for (size_t k = 0; k < sl->nu; u += sl->ucnt[k], k++)
            memcpy(u, g + sl->uoff[k], sl->ucnt[k] * sizeof *u);
    }
    if (!fuse) {
        prepare_q(s, sl, b);
        float *p = sl->pu + sl->ulen;
        for (size_t i = 0; i < sl->nt; i++) {
            const tens_t *t = &sl->t[i];
            tdist__psgd_gemm(p + t->poff, g + t->off, sl->q + t->qoff, t->n, t->m, t->r, 0, 0,
                             false);
        }
    }
    observe(s, b, TDIST_POWERSGD_P_LOCAL, sl->pu, sl->ulen + sl->plen);
    TDIST_CHECK(post(b, sl->pu, sl->ulen + sl->plen, "the uncompressed values and P", &res->work));
    res->then = after_p;
    return TDIST_OK;
}

/* ---------------------------------------------------- the batched hook */

static tdist_status_t batched_after_q(void *state, const tdist_ddp_bucket_t *b,
                                      tdist_ddp_hook_result_t *next)
{
    (void)next;
    tdist_powersgd_t *s = state;
    slot_t *sl = slot_of(s, b);
    const float dv = (float)b->divisor;
    for (size_t i = 0; i < sl->qlen; i++) sl->bq[i] = sl->bq[i] / dv;
    sl->has_bq = true;
    observe(s, b, TDIST_POWERSGD_Q_REDUCED, sl->bq, sl->qlen);
    tdist__psgd_gemm(sl->mat, sl->pu, sl->bq, sl->side, sl->r, sl->side, 0, 1, true);
    memcpy(b->buffer, sl->mat, b->count * sizeof(float));
    observe(s, b, TDIST_POWERSGD_OUTPUT, b->buffer, b->count);
    tdist_status_t st = feedback_out(s, sl, b, sl->mat);
    move_grads(b, false);
    return st;
}

static tdist_status_t batched_after_p(void *state, const tdist_ddp_bucket_t *b,
                                      tdist_ddp_hook_result_t *next)
{
    tdist_powersgd_t *s = state;
    slot_t *sl = slot_of(s, b);
    observe(s, b, TDIST_POWERSGD_P_REDUCED, sl->pu, sl->plen);
    tdist__psgd_orthogonalize(sl->pu, sl->side, sl->r, s->o.orthogonalization_epsilon,
                              s->o.repair_zero, sl->tmp);
    observe(s, b, TDIST_POWERSGD_P_ORTHO, sl->pu, sl->plen);
    tdist__psgd_gemm(sl->bq, sl->mat, sl->pu, sl->side, sl->side, sl->r, 1, 0, true);
    observe(s, b, TDIST_POWERSGD_Q_LOCAL, sl->bq, sl->qlen);
    TDIST_CHECK(post(b, sl->bq, sl->qlen, "Q", &next->work));
    next->then = batched_after_q;
    return TDIST_OK;
}

/* batched_powerSGD_hook: the bucket as one zero-padded side x side
 * matrix; its Q is orthogonalised at every iteration. */
static tdist_status_t batched_begin(tdist_powersgd_t *s, slot_t *sl, const tdist_ddp_bucket_t *b,
                                    tdist_ddp_hook_result_t *res)
{
    feedback_in(s, sl, b, sl->mat);
    if (!s->o.warm_start || !sl->has_bq ||
        (s->o.repair_zero && !q_usable(sl->bq, sl->side, sl->r)))
        draw_q(s, sl->bq, sl->qlen, (uint64_t)s->cur, b->index);
    sl->has_bq = false; /* until this iteration's Q is reduced */
    tdist__psgd_orthogonalize(sl->bq, sl->side, sl->r, s->o.orthogonalization_epsilon,
                              s->o.repair_zero, sl->tmp);
    observe(s, b, TDIST_POWERSGD_Q_USED, sl->bq, sl->qlen);
    tdist__psgd_gemm(sl->pu, sl->mat, sl->bq, sl->side, sl->side, sl->r, 0, 0, true);
    observe(s, b, TDIST_POWERSGD_P_LOCAL, sl->pu, sl->plen);
    TDIST_CHECK(post(b, sl->pu, sl->plen, "P", &res->work));
    res->then = batched_after_p;
    return TDIST_OK;
}

/* ------------------------------------------------------ hook entry */

static tdist_status_t check_call(const tdist_powersgd_t *s, const tdist_ddp_bucket_t *b,
                                 const tdist_ddp_hook_result_t *result)
{
    return tdist__hook_check(s, b, result, WHO, "tdist_powersgd_create", "tdist_powersgd_register",
                             s ? s->desc : NULL, TDIST__HOOK_F32, "PowerSGD takes f32 buckets");
}

/* Serial mode: run the chain to its end before returning. */
static tdist_status_t run_serial(tdist_powersgd_t *s, const tdist_ddp_bucket_t *b,
                                 tdist_ddp_hook_result_t *res)
{
    while (res->work || res->then) {
        if (res->work) {
            tdist_status_t st = tdist_work_wait(res->work, -1);
            tdist_work_free(res->work);
            res->work = NULL;
            if (st != TDIST_OK) {
                res->then = NULL;
                return tdist__error_context(st, "%s: bucket %zu (serial mode)", WHO, b->index);
            }
        }
        if (res->then) {
            tdist_ddp_then_fn fn = res->then;
            tdist_ddp_hook_result_t next = {0};
            tdist_status_t st = fn(s, b, &next);
            *res = next;
            if (st != TDIST_OK) return st; /* the reducer waits for and frees res->work */
        }
    }
    return TDIST_OK;
}

/* The plain phase on the gradients: the averaged bucket back into them. */
static tdist_status_t plain_done(void *state, const tdist_ddp_bucket_t *b,
                                 tdist_ddp_hook_result_t *next)
{
    (void)state;
    (void)next;
    move_grads(b, false);
    return TDIST_OK;
}

/* Before start_powerSGD_iter: fl(g / divisor), then a SUM all_reduce. */
static tdist_status_t plain_average(const tdist_ddp_bucket_t *b, tdist_ddp_hook_result_t *res)
{
    float *g = b->buffer;
    const float dv = (float)b->divisor;
    for (size_t i = 0; i < b->count; i++) g[i] = g[i] / dv;
    return post(b, g, b->count, "the bucket (plain averaging)", &res->work);
}

tdist_status_t tdist_powersgd_hook(void *state, const tdist_ddp_bucket_t *bucket,
                                   tdist_ddp_hook_result_t *result)
{
    tdist_powersgd_t *s = state;
    TDIST_CHECK(check_call(s, bucket, result));
    TDIST_CHECK(tdist__agree(&s->agree, bucket, WHO, "powersgd", s->desc, s->config));
    s->cur = s->iter;
    bool plain = s->iter < s->o.start_powerSGD_iter;
    if (bucket->is_last) s->iter++;
    if (plain) {
        move_grads(bucket, true);
        TDIST_CHECK(plain_average(bucket, result));
        if (bucket->grads) result->then = plain_done;
        return TDIST_OK;
    }
    TDIST_CHECK(grow_stores(s, bucket));
    slot_t *sl = slot_of(s, bucket);
    TDIST_CHECK(plan(s, sl, bucket));
    /* the fused unbatched passes work on the gradients in place; every
     * other path on the bucket buffer, the gradients gathered into it */
    sl->direct = bucket->grads && !s->o.observe && fused_plan(s, sl, bucket);
    if (!sl->direct) move_grads(bucket, true);
    if (s->o.batched)
        TDIST_CHECK(batched_begin(s, sl, bucket, result));
    else
        TDIST_CHECK(begin(s, sl, bucket, result));
    return s->o.serial ? run_serial(s, bucket, result) : TDIST_OK;
}

/* ------------------------------------------------------- save and load */
/* The format (host byte order; a checkpoint moves with its machine):
 *   u64 magic, u64 config hash, i64 iteration,
 *   u64 number of parameter records, u64 number of bucket records;
 *   per parameter: u64 count, u64 qlen, u64 flags (1 error, 2 Q),
 *     then count floats of error and qlen floats of Q when flagged;
 *   per bucket: u64 count, u64 nparams, u64 side, u64 r, u64 flags
 *     (1 Q, 2 padding error, 4 layout known), nparams x (u64 index, u64
 *     count), side x r floats of Q, side^2 - count floats of padding
 *     error when flagged. */

#define SAVE_MAGIC 0x31444753505464ULL /* "dTPSGD1" */

typedef struct cursor {
    unsigned char *w; /* NULL: only count */
    const unsigned char *r;
    size_t pos, len;
    bool bad;
} cursor_t;

static void put(cursor_t *c, const void *src, size_t n)
{
    if (c->w && n) memcpy(c->w + c->pos, src, n);
    c->pos += n;
}

static void put64(cursor_t *c, uint64_t v)
{
    put(c, &v, sizeof v);
}

static void get(cursor_t *c, void *dst, size_t n)
{
    if (c->bad || n > c->len - c->pos) {
        c->bad = true;
        if (dst && n) memset(dst, 0, n);
        return;
    }
    if (dst && n) memcpy(dst, c->r + c->pos, n);
    c->pos += n;
}

static uint64_t get64(cursor_t *c)
{
    uint64_t v = 0;
    get(c, &v, sizeof v);
    return v;
}

static void write_state(const tdist_powersgd_t *s, cursor_t *c)
{
    put64(c, SAVE_MAGIC);
    put64(c, s->config);
    put64(c, (uint64_t)s->iter);
    put64(c, s->nps);
    put64(c, s->nslots);
    for (size_t i = 0; i < s->nps; i++) {
        const pstore_t *p = &s->ps[i];
        put64(c, p->count);
        put64(c, p->qlen);
        put64(c, (uint64_t)p->has_err | (uint64_t)p->has_q << 1);
        if (p->has_err) put(c, p->err, p->count * sizeof(float));
        if (p->has_q) put(c, p->q, p->qlen * sizeof(float));
    }
    for (size_t b = 0; b < s->nslots; b++) {
        const slot_t *sl = &s->slots[b];
        bool lay = sl->lay_idx != NULL;
        put64(c, sl->count);
        put64(c, lay ? sl->nparams : 0);
        put64(c, sl->side);
        put64(c, sl->r);
        put64(c, (uint64_t)sl->has_bq | (uint64_t)sl->has_pad_err << 1 | (uint64_t)lay << 2);
        for (size_t j = 0; lay && j < sl->nparams; j++) {
            put64(c, sl->lay_idx[j]);
            put64(c, sl->lay_cnt[j]);
        }
        if (sl->has_bq) put(c, sl->bq, sl->side * sl->r * sizeof(float));
        if (sl->has_pad_err) put(c, sl->pad_err, (sl->side * sl->side - sl->count) * sizeof(float));
    }
}

size_t tdist_powersgd_state_size(const tdist_powersgd_t *s)
{
    if (!s) return 0;
    cursor_t c = {0};
    write_state(s, &c);
    return c.pos;
}

tdist_status_t tdist_powersgd_save(const tdist_powersgd_t *s, void *buf, size_t cap,
                                   size_t *written)
{
    if (!s || !buf)
        return tdist__error(TDIST_ERR_INVALID_ARG, "tdist_powersgd_save: %s is NULL",
                            !s ? "the state" : "buf");
    size_t need = tdist_powersgd_state_size(s);
    if (cap < need)
        return tdist__error(TDIST_ERR_INVALID_ARG,
                            "tdist_powersgd_save: buf holds %zu bytes, the state needs %zu "
                            "(tdist_powersgd_state_size)",
                            cap, need);
    cursor_t c = {.w = buf};
    write_state(s, &c);
    if (written) *written = c.pos;
    return TDIST_OK;
}

/* n floats from the cursor into a new array (NULL when n is 0 or bad). */
static float *get_floats(cursor_t *c, size_t n, bool *oom)
{
    if (n > (c->len - c->pos) / sizeof(float)) {
        c->bad = true;
        return NULL;
    }
    float *v = alloc_floats(n);
    if (!v) {
        *oom = true;
        return NULL;
    }
    get(c, v, n * sizeof(float));
    return v;
}

static void read_param(cursor_t *c, pstore_t *p, bool *oom)
{
    p->count = (size_t)get64(c);
    p->qlen = (size_t)get64(c);
    uint64_t fl = get64(c);
    p->has_err = fl & 1;
    p->has_q = (fl >> 1) & 1;
    if (p->has_err) p->err = get_floats(c, p->count, oom);
    if (p->has_q) p->q = get_floats(c, p->qlen, oom);
    if (fl > 3 || (p->has_err && !p->err) || (p->has_q && !p->q)) c->bad = true;
}

static void read_slot(cursor_t *c, slot_t *sl, bool *oom)
{
    sl->count = (size_t)get64(c);
    sl->nparams = (size_t)get64(c);
    sl->side = (size_t)get64(c);
    sl->r = (size_t)get64(c);
    uint64_t fl = get64(c);
    if (c->bad || fl > 7 || sl->nparams > (c->len - c->pos) / 16 ||
        (fl & 3 &&
         (sl->side > (1u << 30) || sl->r > sl->side || sl->side * sl->side < sl->count))) {
        c->bad = true;
        return;
    }
    sl->has_bq = fl & 1;
    sl->has_pad_err = (fl >> 1) & 1;
    if (fl & 4) {
        sl->lay_idx = malloc((sl->nparams ? sl->nparams : 1) * sizeof(size_t));
        sl->lay_cnt = malloc((sl->nparams ? sl->nparams : 1) * sizeof(size_t));
        if (!sl->lay_idx || !sl->lay_cnt) {
            *oom = true;
            return;
        }
        for (size_t j = 0; j < sl->nparams; j++) {
            sl->lay_idx[j] = (size_t)get64(c);
            sl->lay_cnt[j] = (size_t)get64(c);
        }
    }
    if (sl->has_bq) sl->bq = get_floats(c, sl->side * sl->r, oom);
    if (sl->has_pad_err) sl->pad_err = get_floats(c, sl->side * sl->side - sl->count, oom);
    if ((sl->has_bq && !sl->bq) || (sl->has_pad_err && !sl->pad_err)) c->bad = true;
}

tdist_status_t tdist_powersgd_load(tdist_powersgd_t *s, const void *buf, size_t len)
{
    const char *fn = "tdist_powersgd_load";
    if (!s || !buf)
        return tdist__error(TDIST_ERR_INVALID_ARG, "%s: %s is NULL", fn, !s ? "the state" : "buf");
    cursor_t c = {.r = buf, .len = len};
    uint64_t magic = get64(&c), config = get64(&c);
    int64_t iter = (int64_t)get64(&c);
    uint64_t nps = get64(&c), nslots = get64(&c);
    if (c.bad || magic != SAVE_MAGIC || nps > len / 24 || nslots > len / 40)
        return tdist__error(TDIST_ERR_INVALID_ARG,
                            "%s: the %zu bytes are not a saved PowerSGD state (bad header)", fn,
                            len);
    if (config != s->config)
        return tdist__error(TDIST_ERR_MISMATCH,
                            "%s: the state was saved with other options (configuration hash "
                            "%016llx, this state: %s, %016llx)",
                            fn, (unsigned long long)config, s->desc, (unsigned long long)s->config);
    pstore_t *ps = calloc(nps ? nps : 1, sizeof *ps);
    slot_t *slots = calloc(nslots ? nslots : 1, sizeof *slots);
    bool oom = !ps || !slots;
    for (size_t i = 0; !oom && !c.bad && i < nps; i++) read_param(&c, &ps[i], &oom);
    for (size_t i = 0; !oom && !c.bad && i < nslots; i++) read_slot(&c, &slots[i], &oom);
    if (oom || c.bad || c.pos != len) {
        if (ps && slots)
            stores_free(ps, nps, slots, nslots);
        else {
            free(ps);
            free(slots);
        }
        if (oom) return tdist__error(TDIST_ERR_NO_MEMORY, "%s: out of memory", fn);
        return tdist__error(TDIST_ERR_INVALID_ARG,
                            "%s: the %zu bytes are a damaged or truncated PowerSGD state (at byte "
                            "%zu); the state is unchanged",
                            fn, len, c.pos);
    }
    stores_free(s->ps, s->nps, s->slots, s->nslots);
    s->ps = ps;
    s->nps = nps;
    s->slots = slots;
    s->nslots = nslots;
    s->iter = iter;
    return TDIST_OK;
}
