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

/* Set an error "who: rank R group G iteration K bucket B: <fmt>" (the
 * rank and group from bucket->pg; bucket may be NULL: "who: <fmt>") and
 * return st. */
tdist_status_t tdist__hook_error(const tdist_ddp_bucket_t *bucket, tdist_status_t st,
                                 const char *who, const char *fmt, ...) TDIST_PRINTF(4, 5);

#endif /* TDIST_ALGORITHMS_INTERNAL_H */
