/*
 * algorithms/internal.h — what the files of src/algorithms/ share: the
 * cross-rank agreement every comm hook of this layer runs on its first
 * bucket (agree.c), and the error prefix of hook messages.
 *
 * Why an agreement: DDP calls each rank's own hook, and nothing stops two
 * ranks from registering different hooks (or the same hook with another
 * configuration). If their collectives happen to match in shape, the
 * reduction silently averages unlike things (f16 values with bf16 values,
 * a compressed gradient with an uncompressed one). So the first time a
 * hook state reduces a bucket, every rank contributes one record —
 * (kind, configuration hash, a readable description) — to a small blocking
 * all_gather on the bucket's group, and every rank compares all records
 * with rank 0's. Every rank sees the same records, so every rank reaches
 * the same verdict: either all go on, or all fail with the same message
 * naming both configurations, before any gradient data is sent (the
 * group stays usable). A rank whose hook is not from this layer issues
 * its own first collective instead of the all_gather; the group's
 * fingerprint check then fails that collective on every rank, and the
 * hook adds to its message that this was the hook agreement.
 *
 * The verdict is sticky in the agreement object: later calls return it
 * without communicating. The layer's hooks run on the reducer's training
 * thread, so nothing here is thread-safe.
 */
#ifndef TDIST_ALGORITHMS_INTERNAL_H
#define TDIST_ALGORITHMS_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "core/internal.h"
#include "tdist/algorithms.h"
#include "tdist/ddp.h"
#include "tdist/pg.h"

/* Longest description a record carries (bytes, NUL included); longer ones
 * are cut in messages but still compared in full through the hash. */
#define TDIST__AGREE_DESC 72

/* One hook state's agreement. Zero-initialise it (calloc) before use. */
typedef struct tdist__agree {
    int done;                /* 0: not yet; 1: agreed; -1: failed (err, msg) */
    tdist_status_t err;
    char msg[1024];
    tdist_pg_t *pg;          /* the group it was agreed on */
} tdist__agree_t;

/* Agree this hook's kind and configuration across bucket->pg on its first
 * call; later calls return the first call's outcome without
 * communicating. who: the hook function's name, for messages
 * ("tdist_compress_hook"). kind: the hook family ("compress", "powersgd"):
 * what a rank runs. desc: the configuration, readable
 * ("fp16_compress_hook", "bf16_compress_wrapper(my_hook)"). config: a hash
 * of everything in the configuration that must be equal on every rank
 * (tdist__fnv1a over the options). Ranks agree when kind and config are
 * equal on all of them.
 * Errors: TDIST_ERR_MISMATCH on every rank, with the same text after
 * "comm hook mismatch:"; the all_gather's own error (a fingerprint
 * mismatch when some rank runs another collective first) with context;
 * TDIST_ERR_INVALID_ARG when the state is used on a second group. Blocks
 * on the first call only. */
tdist_status_t tdist__agree(tdist__agree_t *a, const tdist_ddp_bucket_t *bucket, const char *who,
                            const char *kind, const char *desc, uint64_t config);

/* The same agreement outside DDP (model averagers, DiLoCo): on pg, on the
 * first call; `where` prefixes messages after who ("rank 0 group world
 * step 3"), noun names what is agreed in them ("model averager": "model
 * averager mismatch: rank 0 runs ..., rank 1 runs ..."). Later calls
 * return the first outcome without communicating. Blocks on the first
 * call only. */
tdist_status_t tdist__agree_pg(tdist__agree_t *a, tdist_pg_t *pg, const char *who,
                               const char *where, const char *noun, const char *kind,
                               const char *desc, uint64_t config);

/* Set an error "who: rank R group G iteration K bucket B: <fmt>" (the
 * rank and group from bucket->pg; bucket may be NULL: "who: <fmt>") and
 * return st. */
tdist_status_t tdist__hook_error(const tdist_ddp_bucket_t *bucket, tdist_status_t st,
                                 const char *who, const char *fmt, ...) TDIST_PRINTF(4, 5);

/* PyTorch's _allreduce_fut: divide bucket->buffer in place by divisor (a
 * true division, fl(g / divisor)), then post a SUM all_reduce of it on pg
 * into result->work. Errors name who, the rank, group and bucket. Used by
 * tdist_allreduce_div_hook (hook_optim.c) and the post-local-SGD hook
 * (post_local.c); the caller has checked the bucket. */
tdist_status_t tdist__divide_all_reduce(const tdist_ddp_bucket_t *bucket, tdist_pg_t *pg,
                                        int64_t divisor, const char *who,
                                        tdist_ddp_hook_result_t *result);

/* The bucket dtypes a hook takes (tdist__hook_check). */
typedef enum tdist__hook_dtypes {
    TDIST__HOOK_F32,     /* f32 only */
    TDIST__HOOK_F32_F64, /* f32 or f64 */
    TDIST__HOOK_FLOAT    /* any floating dtype: f32, f64, f16, bf16 */
} tdist__hook_dtypes_t;

/* The checks every hook of the layer makes on a call before anything
 * else, each TDIST_ERR_INVALID_ARG naming what is wrong: bucket and result
 * given; the bucket's group; the state (NULL: "create it with <create>",
 * and "and register it with <reg>" when reg is not NULL); the bucket's
 * dtype among `dtypes` ("<desc>: the bucket's dtype is X; <takes>", no
 * "<desc>: " when desc is NULL); a divisor of 1 or more; a buffer when the
 * bucket is not empty. Never blocks. */
tdist_status_t tdist__hook_check(const void *state, const tdist_ddp_bucket_t *b,
                                 const tdist_ddp_hook_result_t *result, const char *who,
                                 const char *create, const char *reg, const char *desc,
                                 tdist__hook_dtypes_t dtypes, const char *takes);

/* ------------------------------------------- averaging (averager.c) */

/* flat[0..count) = its average over pg: fl(x / size), then a SUM
 * all_reduce (blocking). Nothing to do for a group of one. Errors name who,
 * the rank and the group. */
tdist_status_t tdist__average_flat(tdist_pg_t *pg, float *flat, size_t count, const char *who);

/* tdist_averager_average, telling which group averaged (*used; NULL when
 * the schedule skipped this step). */
tdist_status_t tdist__averager_run(tdist_averager_t *a, const tdist_optim_param_t *params, size_t n,
                                   tdist_pg_t **used);

/* ------------------------------------------- the hooks' element passes
 * (hook_kernels.c: one fused, vectorised pass each; the definitions are
 * written out there). Pure, thread-safe, no allocation. */

/* int8 quantisation of n f32 values in blocks of `block`: codes[i], and
 * one f32 scale per block stored as bytes at scales (unaligned). resid
 * (NULL, or src itself): src - dequantised, 0 where src is not finite.
 * Returns how many values were not finite (code -128). */
size_t tdist__int8_quantise(int8_t *codes, unsigned char *scales, const float *src, float *resid,
                            size_t n, size_t block);

/* dst[i] = code[i] * its block's scale (NaN for -128); add: dst[i] +=
 * that, one rounding. */
void tdist__int8_dequantise(float *dst, const int8_t *codes, const unsigned char *scales,
                            size_t n, size_t block, bool add);

/* ------------------------------------------- PowerSGD's kernels
 * (powersgd_kernels.c; the orders of operations are described there).
 * All pure, thread-safe, no allocation. */

/* c (n x m, row-major) = op(a) (n x k) times op(b) (k x m); ta: a is
 * stored k x n (use its transpose); tb: b is stored m x k. ATen's naive
 * kernel when n * k * m < 400 and !blas_only, else a fmaf chain over k. */
void tdist__psgd_gemm(float *c, const float *a, const float *b, size_t n, size_t k, size_t m,
                      int ta, int tb, bool blas_only);

/* ATen's cascade sum of x[0..n). */
float tdist__psgd_sum(const float *x, size_t n);

/* Gram-Schmidt on the r columns of a (rows x r, row-major), in place:
 * col /= (norm + eps), then the later columns lose their projection on it.
 * keep_zero: a column whose norm is 0 is left as it is (0, not 0 / 0 with
 * eps 0; the later columns' projection on it is 0 anyway). tmp: rows
 * floats of scratch. */
void tdist__psgd_orthogonalize(float *a, size_t rows, size_t r, float eps, bool keep_zero,
                               float *tmp);

/* n standard normal values of draw `draw`, tensor key `key`, from seed. */
void tdist__psgd_randn(float *out, size_t n, uint64_t seed, uint64_t draw, uint64_t key);

#endif /* TDIST_ALGORITHMS_INTERNAL_H */
