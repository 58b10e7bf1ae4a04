/*
 * store/hash_store.c — the in-process store for threads of one process.
 *
 * The key table (store/keytab.h) guarded by one mutex. Every change that can make a key
 * appear or change (set, add, compare_set, append, multi_set) broadcasts one
 * condition variable; get, wait and multi_get sleep on it until their keys
 * exist or their deadline passes. The condition variable uses
 * CLOCK_MONOTONIC, so a jump of the wall clock never shortens or stretches
 * a deadline.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "store/internal.h"
#include "store/keytab.h"

typedef struct entry {
    tdist__keynode_t node; /* first: the key table's link; node.key is key below */
    unsigned char *val;    /* malloc'd, at least 1 byte */
    size_t vlen;
    char key[]; /* NUL-terminated */
} entry_t;

typedef struct hash_store {
    tdist_store_t base;
    pthread_mutex_t mu;
    pthread_cond_t cv; /* broadcast whenever a key is set or changed */
    tdist__keytab_t keys;
} hash_store_t;

static const tdist_store_ops_t hash_ops;

/* ------------------------------------------------------------ the map */

static entry_t *find(hash_store_t *hs, const char *key)
{
    return (entry_t *)tdist__keytab_find(&hs->keys, key, strlen(key));
}

/* A new entry for key holding val (ownership of val moves to the entry). */
static entry_t *new_entry(const char *key, unsigned char *val, size_t vlen)
{
    size_t klen = strlen(key);
    entry_t *e = malloc(sizeof *e + klen + 1);
    if (!e) return NULL;
    memcpy(e->key, key, klen + 1);
    e->node.key = e->key;
    e->node.klen = klen;
    e->val = val;
    e->vlen = vlen;
    return e;
}

static void free_entry(tdist__keynode_t *n)
{
    entry_t *e = (entry_t *)n;
    free(e->val);
    free(e);
}

/* Insert e, or if its key exists, move e's value into the existing entry and
 * free e. Never fails. Caller holds mu. */
static void install(hash_store_t *hs, entry_t *e)
{
    entry_t *old = (entry_t *)tdist__keytab_find(&hs->keys, e->key, e->node.klen);
    if (old) {
        free(old->val);
        old->val = e->val;
        old->vlen = e->vlen;
        free(e);
        return;
    }
    tdist__keytab_add(&hs->keys, &e->node);
}

/* Set key to a copy of value. Caller holds mu. */
static tdist_status_t put_locked(hash_store_t *hs, const char *key, const void *value, size_t len)
{
    unsigned char *v = tdist__store_dup(value, len);
    entry_t *e = v ? new_entry(key, v, len) : NULL;
    if (!e) {
        free(v);
        return tdist__error(TDIST_ERR_NO_MEMORY,
                            "hash store: out of memory setting key \"%.200s\" (%zu bytes)", key,
                            len);
    }
    install(hs, e);
    return TDIST_OK;
}

/* ------------------------------------------------------------ waiting */

/* Absolute CLOCK_MONOTONIC time timeout_ms from now. */
static struct timespec deadline_ts(int64_t timeout_ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    int64_t sec = timeout_ms / 1000;
    long nsec = (long)(timeout_ms % 1000) * 1000000L;
    if (sec > INT32_MAX) sec = INT32_MAX; /* a deadline decades away */
    ts.tv_sec += (time_t)sec;
    ts.tv_nsec += nsec;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    return ts;
}

static bool ts_passed(const struct timespec *deadline)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return now.tv_sec > deadline->tv_sec ||
           (now.tv_sec == deadline->tv_sec && now.tv_nsec >= deadline->tv_nsec);
}

/* Index of the first of keys that is missing, or n if all exist. */
static size_t first_missing(hash_store_t *hs, const char *const *keys, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!find(hs, keys[i])) return i;
    return n;
}

/* Wait (holding mu, released while asleep) until all keys exist or
 * timeout_ms (< 0: forever) passes. what names the operation in the error. */
static tdist_status_t wait_locked(hash_store_t *hs, const char *const *keys, size_t n,
                                  int64_t timeout_ms, const char *what)
{
    size_t miss = first_missing(hs, keys, n);
    if (miss == n) return TDIST_OK;
    struct timespec deadline = deadline_ts(timeout_ms < 0 ? 0 : timeout_ms);
    for (;;) {
        if (timeout_ms < 0) {
            pthread_cond_wait(&hs->cv, &hs->mu);
        } else {
            if (ts_passed(&deadline)) break;
            pthread_cond_timedwait(&hs->cv, &hs->mu, &deadline);
        }
        miss = first_missing(hs, keys, n);
        if (miss == n) return TDIST_OK;
    }
    return tdist__error(TDIST_ERR_TIMEOUT,
                        "hash store: %s timed out after %" PRId64 " ms waiting for key \"%.200s\"",
                        what, timeout_ms, keys[miss]);
}

/* ------------------------------------------------------------ operations */

static void hash_destroy(tdist_store_t *s)
{
    hash_store_t *hs = (hash_store_t *)s;
    tdist__keytab_fini(&hs->keys, free_entry);
    pthread_cond_destroy(&hs->cv);
    pthread_mutex_destroy(&hs->mu);
    free(hs);
}

static tdist_status_t hash_set(tdist_store_t *s, const char *key, const void *value, size_t len)
{
    hash_store_t *hs = (hash_store_t *)s;
    pthread_mutex_lock(&hs->mu);
    tdist_status_t st = put_locked(hs, key, value, len);
    if (st == TDIST_OK) pthread_cond_broadcast(&hs->cv);
    pthread_mutex_unlock(&hs->mu);
    return st;
}

static tdist_status_t hash_get(tdist_store_t *s, const char *key, int64_t timeout_ms, void **value,
                               size_t *len)
{
    hash_store_t *hs = (hash_store_t *)s;
    pthread_mutex_lock(&hs->mu);
    tdist_status_t st = wait_locked(hs, &key, 1, timeout_ms, "get");
    if (st == TDIST_OK) {
        entry_t *e = find(hs, key);
        void *v = tdist__store_dup(e->val, e->vlen);
        if (!v) {
            st = tdist__error(TDIST_ERR_NO_MEMORY,
                              "hash store: out of memory copying key \"%.200s\" (%zu bytes)", key,
                              e->vlen);
        } else {
            *value = v;
            *len = e->vlen;
        }
    }
    pthread_mutex_unlock(&hs->mu);
    return st;
}

static tdist_status_t hash_add(tdist_store_t *s, const char *key, int64_t delta, int64_t *result)
{
    hash_store_t *hs = (hash_store_t *)s;
    tdist_status_t st = TDIST_OK;
    pthread_mutex_lock(&hs->mu);
    entry_t *e = find(hs, key);
    int64_t cur = 0, next;
    if (e && tdist__store_parse_counter(e->val, e->vlen, &cur) != 0) {
        st = tdist__error(
            TDIST_ERR_INVALID_ARG,
            "hash store: add to key \"%.200s\": its value (%zu bytes) is not a decimal integer",
            key, e->vlen);
    } else if (__builtin_add_overflow(cur, delta, &next)) {
        st = tdist__error(TDIST_ERR_INVALID_ARG,
                          "hash store: add %" PRId64 " to key \"%.200s\" holding %" PRId64
                          " overflows int64",
                          delta, key, cur);
    } else {
        char buf[32];
        int n = snprintf(buf, sizeof buf, "%" PRId64, next);
        st = put_locked(hs, key, buf, (size_t)n);
        if (st == TDIST_OK) {
            *result = next;
            pthread_cond_broadcast(&hs->cv);
        }
    }
    pthread_mutex_unlock(&hs->mu);
    return st;
}

static tdist_status_t hash_compare_set(tdist_store_t *s, const char *key, const void *expected,
                                       size_t expected_len, const void *desired, size_t desired_len,
                                       void **current, size_t *current_len)
{
    hash_store_t *hs = (hash_store_t *)s;
    tdist_status_t st = TDIST_OK;
    const void *out;
    size_t out_len;
    bool swap;
    pthread_mutex_lock(&hs->mu);
    entry_t *e = find(hs, key);
    if (!e) {
        swap = expected_len == 0;
    } else {
        swap = e->vlen == expected_len &&
               (expected_len == 0 || memcmp(e->val, expected, expected_len) == 0);
    }
    if (swap) {
        out = desired;
        out_len = desired_len;
    } else if (e) {
        out = e->val;
        out_len = e->vlen;
    } else {
        out = expected;
        out_len = expected_len;
    }
    void *copy = tdist__store_dup(out, out_len);
    if (!copy) {
        st = tdist__error(TDIST_ERR_NO_MEMORY,
                          "hash store: out of memory in compare_set of key \"%.200s\"", key);
    } else if (swap) {
        st = put_locked(hs, key, desired, desired_len);
        if (st == TDIST_OK) pthread_cond_broadcast(&hs->cv);
    }
    pthread_mutex_unlock(&hs->mu);
    if (st != TDIST_OK) {
        free(copy);
        return st;
    }
    *current = copy;
    *current_len = out_len;
    return TDIST_OK;
}

static tdist_status_t hash_wait(tdist_store_t *s, const char *const *keys, size_t n,
                                int64_t timeout_ms)
{
    hash_store_t *hs = (hash_store_t *)s;
    pthread_mutex_lock(&hs->mu);
    tdist_status_t st = wait_locked(hs, keys, n, timeout_ms, "wait");
    pthread_mutex_unlock(&hs->mu);
    return st;
}

static tdist_status_t hash_check(tdist_store_t *s, const char *const *keys, size_t n,
                                 bool *all_exist)
{
    hash_store_t *hs = (hash_store_t *)s;
    pthread_mutex_lock(&hs->mu);
    *all_exist = first_missing(hs, keys, n) == n;
    pthread_mutex_unlock(&hs->mu);
    return TDIST_OK;
}

static tdist_status_t hash_delete_key(tdist_store_t *s, const char *key, bool *deleted)
{
    hash_store_t *hs = (hash_store_t *)s;
    pthread_mutex_lock(&hs->mu);
    entry_t *e = find(hs, key);
    if (e) {
        tdist__keytab_remove(&hs->keys, &e->node);
        free_entry(&e->node);
    }
    pthread_mutex_unlock(&hs->mu);
    *deleted = e != NULL;
    return TDIST_OK;
}

static tdist_status_t hash_num_keys(tdist_store_t *s, int64_t *count)
{
    hash_store_t *hs = (hash_store_t *)s;
    pthread_mutex_lock(&hs->mu);
    *count = (int64_t)hs->keys.count;
    pthread_mutex_unlock(&hs->mu);
    return TDIST_OK;
}

static tdist_status_t hash_append(tdist_store_t *s, const char *key, const void *value, size_t len)
{
    hash_store_t *hs = (hash_store_t *)s;
    tdist_status_t st = TDIST_OK;
    pthread_mutex_lock(&hs->mu);
    entry_t *e = find(hs, key);
    if (!e) {
        st = put_locked(hs, key, value, len);
    } else if (e->vlen + len > TDIST_STORE_MAX_VALUE) {
        st = tdist__error(
            TDIST_ERR_INVALID_ARG,
            "hash store: append of %zu bytes to key \"%.200s\" (%zu bytes) exceeds the cap of %u",
            len, key, e->vlen, TDIST_STORE_MAX_VALUE);
    } else if (len > 0) {
        unsigned char *v = realloc(e->val, e->vlen + len);
        if (!v) {
            st = tdist__error(TDIST_ERR_NO_MEMORY,
                              "hash store: out of memory appending to key \"%.200s\"", key);
        } else {
            memcpy(v + e->vlen, value, len);
            e->val = v;
            e->vlen += len;
        }
    }
    if (st == TDIST_OK) pthread_cond_broadcast(&hs->cv);
    pthread_mutex_unlock(&hs->mu);
    return st;
}

static tdist_status_t hash_multi_get(tdist_store_t *s, const char *const *keys, size_t n,
                                     int64_t timeout_ms, void **values, size_t *lens)
{
    hash_store_t *hs = (hash_store_t *)s;
    /* Collect into our own arrays: on failure the caller's are untouched. */
    void **tmp = calloc(n, sizeof *tmp);
    size_t *tmp_lens = calloc(n, sizeof *tmp_lens);
    if (!tmp || !tmp_lens) {
        free(tmp);
        free(tmp_lens);
        return tdist__error(TDIST_ERR_NO_MEMORY,
                            "hash store: out of memory in multi_get of %zu keys", n);
    }
    pthread_mutex_lock(&hs->mu);
    tdist_status_t st = wait_locked(hs, keys, n, timeout_ms, "multi_get");
    for (size_t i = 0; st == TDIST_OK && i < n; i++) {
        entry_t *e = find(hs, keys[i]);
        tmp[i] = tdist__store_dup(e->val, e->vlen);
        tmp_lens[i] = e->vlen;
        if (!tmp[i])
            st = tdist__error(TDIST_ERR_NO_MEMORY,
                              "hash store: out of memory copying key \"%.200s\" (%zu bytes)",
                              keys[i], e->vlen);
    }
    pthread_mutex_unlock(&hs->mu);
    if (st == TDIST_OK) {
        memcpy(values, tmp, n * sizeof *tmp);
        memcpy(lens, tmp_lens, n * sizeof *tmp_lens);
    } else {
        for (size_t i = 0; i < n; i++) free(tmp[i]);
    }
    free(tmp);
    free(tmp_lens);
    return st;
}

static tdist_status_t hash_multi_set(tdist_store_t *s, const char *const *keys,
                                     const void *const *values, const size_t *lens, size_t n)
{
    hash_store_t *hs = (hash_store_t *)s;
    /* Copy everything first so the update is all-or-nothing. */
    entry_t **es = calloc(n, sizeof *es);
    if (!es)
        return tdist__error(TDIST_ERR_NO_MEMORY,
                            "hash store: out of memory in multi_set of %zu keys", n);
    for (size_t i = 0; i < n; i++) {
        unsigned char *v = tdist__store_dup(values[i], lens[i]);
        es[i] = v ? new_entry(keys[i], v, lens[i]) : NULL;
        if (!es[i]) {
            free(v);
            for (size_t j = 0; j < i; j++) {
                free(es[j]->val);
                free(es[j]);
            }
            free(es);
            return tdist__error(TDIST_ERR_NO_MEMORY,
                                "hash store: out of memory in multi_set at key \"%.200s\"",
                                keys[i]);
        }
    }
    pthread_mutex_lock(&hs->mu);
    for (size_t i = 0; i < n; i++) install(hs, es[i]);
    pthread_cond_broadcast(&hs->cv);
    pthread_mutex_unlock(&hs->mu);
    free(es);
    return TDIST_OK;
}

static const tdist_store_ops_t hash_ops = {
    .kind = "hash",
    .destroy = hash_destroy,
    .set = hash_set,
    .get = hash_get,
    .add = hash_add,
    .compare_set = hash_compare_set,
    .wait = hash_wait,
    .check = hash_check,
    .delete_key = hash_delete_key,
    .num_keys = hash_num_keys,
    .append = hash_append,
    .multi_get = hash_multi_get,
    .multi_set = hash_multi_set,
};

tdist_status_t tdist_store_hash_create(const tdist_store_opts_t *opts, tdist_store_t **out)
{
    if (!out) return tdist__error(TDIST_ERR_INVALID_ARG, "tdist_store_hash_create: out is NULL");
    hash_store_t *hs = calloc(1, sizeof *hs);
    if (!hs || tdist__keytab_init(&hs->keys) != 0) {
        free(hs);
        return tdist__error(TDIST_ERR_NO_MEMORY, "tdist_store_hash_create: out of memory");
    }
    pthread_condattr_t ca;
    int rc = pthread_condattr_init(&ca);
    if (rc == 0) {
        rc = pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        if (rc == 0) rc = pthread_cond_init(&hs->cv, &ca);
        pthread_condattr_destroy(&ca);
    }
    if (rc != 0) {
        tdist__keytab_fini(&hs->keys, NULL);
        free(hs);
        return tdist__error_errno(rc, "tdist_store_hash_create: pthread_cond_init");
    }
    rc = pthread_mutex_init(&hs->mu, NULL);
    if (rc != 0) {
        pthread_cond_destroy(&hs->cv);
        tdist__keytab_fini(&hs->keys, NULL);
        free(hs);
        return tdist__error_errno(rc, "tdist_store_hash_create: pthread_mutex_init");
    }
    tdist__store_base_init(&hs->base, &hash_ops, opts);
    *out = &hs->base;
    return TDIST_OK;
}
