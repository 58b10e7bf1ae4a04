/*
 * store/internal.h — the table every store implementation fills. (The TCP
 * wire format and its limits are in store/wire.h.)
 *
 * store.c checks every argument once, then calls the implementation
 * through this table; implementations may assume: s non-NULL, keys valid
 * (non-empty, <= TDIST_STORE_MAX_KEY, NUL-terminated), lengths within
 * TDIST_STORE_MAX_VALUE, n within [1, TDIST_STORE_MAX_KEYS] for the multi
 * calls, out-pointers non-NULL where the public API requires them.
 */
#ifndef TDIST_STORE_INTERNAL_H
#define TDIST_STORE_INTERNAL_H

#include <stdatomic.h>

#include "core/internal.h"
#include "tdist/store.h"

typedef struct tdist_store_ops {
    const char *kind; /* "tcp", "file", "hash", "prefix" */
    void (*destroy)(tdist_store_t *s);
    tdist_status_t (*set)(tdist_store_t *s, const char *key, const void *value, size_t len);
    /* timeout_ms: already resolved (store's default applied); < 0 = forever */
    tdist_status_t (*get)(tdist_store_t *s, const char *key, int64_t timeout_ms, void **value,
                          size_t *len);
    tdist_status_t (*add)(tdist_store_t *s, const char *key, int64_t delta, int64_t *result);
    tdist_status_t (*compare_set)(tdist_store_t *s, const char *key, const void *expected,
                                  size_t expected_len, const void *desired, size_t desired_len,
                                  void **current, size_t *current_len);
    tdist_status_t (*wait)(tdist_store_t *s, const char *const *keys, size_t n,
                           int64_t timeout_ms);
    tdist_status_t (*check)(tdist_store_t *s, const char *const *keys, size_t n, bool *all_exist);
    tdist_status_t (*delete_key)(tdist_store_t *s, const char *key, bool *deleted);
    tdist_status_t (*num_keys)(tdist_store_t *s, int64_t *count);
    tdist_status_t (*append)(tdist_store_t *s, const char *key, const void *value, size_t len);
    tdist_status_t (*multi_get)(tdist_store_t *s, const char *const *keys, size_t n,
                                int64_t timeout_ms, void **values, size_t *lens);
    tdist_status_t (*multi_set)(tdist_store_t *s, const char *const *keys,
                                const void *const *values, const size_t *lens, size_t n);
} tdist_store_ops_t;

/* Every implementation's struct starts with this. */
struct tdist_store {
    const tdist_store_ops_t *ops;
    _Atomic int64_t timeout_ms;
};

/* Initialise the common part: ops and the timeout from opts (or defaults). */
void tdist__store_base_init(tdist_store_t *s, const tdist_store_ops_t *ops,
                            const tdist_store_opts_t *opts);

/* Parse the decimal integer held by a value (add's counters). 0 on success. */
int tdist__store_parse_counter(const void *value, size_t len, int64_t *out);

/* malloc a copy of len bytes (at least 1 byte, so an empty value is not NULL). */
void *tdist__store_dup(const void *value, size_t len);

/* store.c: the calling thread's bound on store calls (absolute,
 * tdist__now_ms clock; INT64_MAX: none), set by tdist_store_bound_thread. */
int64_t tdist__store_thread_bound(void);

/* Log a warning when a TCP store on addr ("host:port", "[v6]:port") runs
 * without the job's secret and addr is not a loopback address, so other
 * hosts can reach it. who: "store server", "store client". */
void tdist__store_warn_no_secret(const char *who, const char *addr);

#endif /* TDIST_STORE_INTERNAL_H */
