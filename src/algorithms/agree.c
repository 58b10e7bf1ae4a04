/*
 * algorithms/agree.c — the cross-rank agreement of a comm hook's kind and
 * configuration (see algorithms/internal.h for why), and the hooks' error
 * prefix.
 *
 * The record each rank contributes is 12 int64 words: a magic word (which
 * also tells a record from the zeros a joined rank's slot would hold, or
 * from another program's all_gather of the same shape), the hash of the
 * kind, the configuration hash and a 72-byte description for messages.
 */
#include <assert.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "algorithms/internal.h"

#define AGREE_MAGIC 0x3145455247416474ULL /* "tdAGREE1", format 1 */

typedef struct record {
    uint64_t magic;
    uint64_t kind;
    uint64_t config;
    char desc[TDIST__AGREE_DESC];
} record_t;

#define RECORD_WORDS (sizeof(record_t) / sizeof(int64_t))
static_assert(sizeof(record_t) % sizeof(int64_t) == 0, "record is whole int64 words");

tdist_status_t tdist__hook_error(const tdist_ddp_bucket_t *bucket, tdist_status_t st,
                                 const char *who, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (!bucket) return tdist__error(st, "%s: %s", who, msg);
    return tdist__error(st, "%s: rank %d group %s iteration %" PRIu64 " bucket %zu: %s", who,
                        tdist_pg_rank(bucket->pg), bucket->pg ? tdist_pg_name(bucket->pg) : "(none)",
                        bucket->iteration, bucket->index, msg);
}

/* What rank r's record says it runs, for messages. */
static const char *describe(const record_t *r)
{
    if (r->magic != AGREE_MAGIC)
        return "no comm hook of tdist's algorithms layer (its slot of the agreement is empty or "
               "foreign: another hook, or a rank that does not run the hook)";
    return r->desc;
}

static bool same(const record_t *a, const record_t *b)
{
    return a->magic == AGREE_MAGIC && b->magic == AGREE_MAGIC && a->kind == b->kind &&
           a->config == b->config;
}

/* Compare every record with rank 0's; on a difference, the message (the
 * same on every rank after "comm hook mismatch:") goes to msg. A foreign
 * record on rank 0 makes every other rank differ from it. */
static bool compare(const record_t *all, int size, const char *noun, char *msg, size_t cap)
{
    int first = -1;
    char list[160] = "";
    size_t len = 0, listed = 0;
    for (int r = 1; r < size; r++) {
        if (same(&all[r], &all[0])) continue;
        if (first < 0) first = r;
        if (listed < 16 && len < sizeof list) {
            int k = snprintf(list + len, sizeof list - len, "%s%d", listed ? ", " : "", r);
            if (k > 0) len += (size_t)k;
        }
        listed++;
    }
    if (first < 0) return true; /* with size > 1, a foreign rank 0 differs from rank 1 */
    const record_t *a = &all[0], *b = &all[first];
    int k = snprintf(msg, cap, "%s mismatch: rank 0 runs %s, rank %d runs %s", noun, describe(a),
                     first, describe(b));
    if (k > 0 && (size_t)k < cap && a->magic == AGREE_MAGIC && b->magic == AGREE_MAGIC &&
        strcmp(a->desc, b->desc) == 0)
        k += snprintf(msg + k, cap - (size_t)k,
                      " (the same description, but different options: configuration hash "
                      "%016" PRIx64 " vs %016" PRIx64 ")",
                      a->config, b->config);
    if (k > 0 && (size_t)k < cap)
        snprintf(msg + k, cap - (size_t)k,
                 " (ranks differing from rank 0: %s%s); every rank must %s the same %s with the "
                 "same options",
                 list, listed <= 16 ? "" : ", ...",
                 strcmp(noun, "comm hook") == 0 ? "register" : "run", noun);
    return false;
}

/* Keep the outcome: later calls return it without communicating. */
static tdist_status_t settle(tdist__agree_t *a, tdist_status_t st)
{
    a->done = st == TDIST_OK ? 1 : -1;
    a->err = st;
    snprintf(a->msg, sizeof a->msg, "%s", st == TDIST_OK ? "" : tdist_last_error());
    return st;
}

/* The agreement itself, on pg; `where` ("rank R group G iteration K
 * bucket B") prefixes every message after who; `what` says, for a failed
 * all_gather, where it was issued and what else a rank may have issued. */
static tdist_status_t agree_on(tdist__agree_t *a, tdist_pg_t *pg, const char *who, const char *where,
                               const char *noun, const char *what, const char *kind,
                               const char *desc, uint64_t config)
{
    int size = tdist_pg_size(pg);
    if (size < 1) return tdist__error(TDIST_ERR_INVALID_ARG, "%s: %s: no group", who, where);
    record_t mine;
    memset(&mine, 0, sizeof mine);
    mine.magic = AGREE_MAGIC;
    mine.kind = tdist__fnv1a(TDIST__FNV_INIT, kind, strlen(kind));
    mine.config = config;
    snprintf(mine.desc, sizeof mine.desc, "%s", desc);
    record_t *all = calloc((size_t)size, sizeof *all);
    if (!all) return tdist__error(TDIST_ERR_NO_MEMORY, "%s: %s: out of memory", who, where);
    a->pg = pg;
    tdist_status_t st = tdist_all_gather(pg, &mine, all, RECORD_WORDS, TDIST_I64, NULL, NULL);
    if (st != TDIST_OK) {
        free(all);
        tdist__error_context(st, "%s: %s: the %s agreement (one all_gather of i64 x %zu%s) failed; "
                                 "%s",
                             who, where, noun, RECORD_WORDS,
                             strcmp(noun, "comm hook") == 0 ? " on the hook's first bucket" : "",
                             what);
        return settle(a, st);
    }
    char msg[480];
    bool ok = compare(all, size, noun, msg, sizeof msg);
    free(all);
    if (ok) return settle(a, TDIST_OK);
    return settle(a, tdist__error(TDIST_ERR_MISMATCH, "%s: %s: %s", who, where, msg));
}

tdist_status_t tdist__agree(tdist__agree_t *a, const tdist_ddp_bucket_t *bucket, const char *who,
                            const char *kind, const char *desc, uint64_t config)
{
    if (a->done < 0) return tdist__error(a->err, "%s", a->msg);
    if (a->done > 0) {
        if (bucket->pg == a->pg) return TDIST_OK;
        return tdist__hook_error(bucket, TDIST_ERR_INVALID_ARG, who,
                                 "this hook state was agreed on group '%s' and is now used on "
                                 "group '%s': use one state per reducer",
                                 tdist_pg_name(a->pg), tdist_pg_name(bucket->pg));
    }
    if (tdist_pg_size(bucket->pg) < 1)
        return tdist__hook_error(bucket, TDIST_ERR_INVALID_ARG, who, "bucket->pg is NULL");
    char where[200];
    snprintf(where, sizeof where, "rank %d group %s iteration %" PRIu64 " bucket %zu",
             tdist_pg_rank(bucket->pg), tdist_pg_name(bucket->pg), bucket->iteration,
             bucket->index);
    return agree_on(a, bucket->pg, who, where, "comm hook",
                    "a rank whose comm hook is not from tdist's algorithms layer issues another "
                    "collective here",
                    kind, desc, config);
}

tdist_status_t tdist__agree_pg(tdist__agree_t *a, tdist_pg_t *pg, const char *who,
                               const char *where, const char *noun, const char *kind,
                               const char *desc, uint64_t config)
{
    if (a->done < 0) return tdist__error(a->err, "%s", a->msg);
    if (a->done > 0) return TDIST_OK;
    char what[160];
    snprintf(what, sizeof what, "a rank that does not run the same %s issues another collective "
             "here", noun);
    return agree_on(a, pg, who, where, noun, what, kind, desc, config);
}

static bool dtype_taken(tdist_dtype_t dt, tdist__hook_dtypes_t dtypes)
{
    switch (dtypes) {
    case TDIST__HOOK_F32: return dt == TDIST_F32;
    case TDIST__HOOK_F32_F64: return dt == TDIST_F32 || dt == TDIST_F64;
    default: return tdist_dtype_is_float(dt) != 0;
    }
}

tdist_status_t tdist__hook_check(const void *state, const tdist_ddp_bucket_t *b,
                                 const tdist_ddp_hook_result_t *result, const char *who,
                                 const char *create, const char *reg, const char *desc,
                                 tdist__hook_dtypes_t dtypes, const char *takes)
{
    if (!b || !result)
        return tdist__hook_error(NULL, TDIST_ERR_INVALID_ARG, who, "%s is NULL",
                                 !b ? "bucket" : "result");
    if (!b->pg) return tdist__hook_error(NULL, TDIST_ERR_INVALID_ARG, who, "bucket->pg is NULL");
    if (!state)
        return tdist__hook_error(b, TDIST_ERR_INVALID_ARG, who,
                                 "the hook state is NULL (create it with %s%s%s)", create,
                                 reg ? " and register it with " : "", reg ? reg : "");
    if (!dtype_taken(b->dtype, dtypes))
        return tdist__hook_error(b, TDIST_ERR_INVALID_ARG, who, "%s%sthe bucket's dtype is %s; %s",
                                 desc ? desc : "", desc ? ": " : "", tdist_dtype_name(b->dtype),
                                 takes);
    if (b->divisor < 1)
        return tdist__hook_error(b, TDIST_ERR_INVALID_ARG, who, "bucket divisor %lld < 1",
                                 (long long)b->divisor);
    if (b->count > 0 && !b->buffer)
        return tdist__hook_error(b, TDIST_ERR_INVALID_ARG, who, "bucket buffer is NULL");
    return TDIST_OK;
}
