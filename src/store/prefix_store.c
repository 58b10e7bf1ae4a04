/*
 * store/prefix_store.c — a view of another store in which every key k is
 * stored as "<prefix>/<k>".
 *
 * Each operation builds the prefixed keys and calls the base store's table
 * directly (the base's own argument checks already passed in store.c for
 * the unprefixed keys; the only new failure is a prefixed key that grows
 * past TDIST_STORE_MAX_KEY). The base is borrowed, never destroyed here.
 * Errors from the base get "prefix store "<prefix>": " in front.
 */
#include <stdlib.h>
#include <string.h>

#include "store/internal.h"

typedef struct prefix_store {
    tdist_store_t base;
    tdist_store_t *inner; /* borrowed */
    char *prefix;         /* owned */
    size_t plen;
} prefix_store_t;

static tdist_status_t with_context(prefix_store_t *ps, tdist_status_t st)
{
    if (st == TDIST_OK) return st;
    return tdist__error_context(st, "prefix store \"%.200s\"", ps->prefix);
}

/* malloc "<prefix>/<key>"; INVALID_ARG if it exceeds TDIST_STORE_MAX_KEY. */
static tdist_status_t make_key(prefix_store_t *ps, const char *key, char **out)
{
    size_t klen = strlen(key);
    size_t full = ps->plen + 1 + klen;
    if (full > TDIST_STORE_MAX_KEY)
        return tdist__error(TDIST_ERR_INVALID_ARG,
                            "prefix store \"%.200s\": key \"%.200s\" becomes %zu bytes with the "
                            "prefix, more than %u",
                            ps->prefix, key, full, TDIST_STORE_MAX_KEY);
    char *k = malloc(full + 1);
    if (!k)
        return tdist__error(TDIST_ERR_NO_MEMORY, "prefix store: out of memory for key \"%.200s\"",
                            key);
    memcpy(k, ps->prefix, ps->plen);
    k[ps->plen] = '/';
    memcpy(k + ps->plen + 1, key, klen + 1);
    *out = k;
    return TDIST_OK;
}

static void free_keys(char **keys, size_t n)
{
    if (!keys) return;
    for (size_t i = 0; i < n; i++) free(keys[i]);
    free(keys);
}

/* An array of n prefixed keys (free with free_keys(.., n)). */
static tdist_status_t make_keys(prefix_store_t *ps, const char *const *keys, size_t n, char ***out)
{
    char **k = calloc(n, sizeof *k);
    if (!k) return tdist__error(TDIST_ERR_NO_MEMORY, "prefix store: out of memory for %zu keys", n);
    for (size_t i = 0; i < n; i++) {
        tdist_status_t st = make_key(ps, keys[i], &k[i]);
        if (st != TDIST_OK) {
            free_keys(k, n);
            return st;
        }
    }
    *out = k;
    return TDIST_OK;
}

static void prefix_destroy(tdist_store_t *s)
{
    prefix_store_t *ps = (prefix_store_t *)s;
    free(ps->prefix);
    free(ps);
}

static tdist_status_t prefix_set(tdist_store_t *s, const char *key, const void *value, size_t len)
{
    prefix_store_t *ps = (prefix_store_t *)s;
    char *k = NULL;
    TDIST_CHECK(make_key(ps, key, &k));
    tdist_status_t st = ps->inner->ops->set(ps->inner, k, value, len);
    free(k);
    return with_context(ps, st);
}

static tdist_status_t prefix_get(tdist_store_t *s, const char *key, int64_t timeout_ms,
                                 void **value, size_t *len)
{
    prefix_store_t *ps = (prefix_store_t *)s;
    char *k = NULL;
    TDIST_CHECK(make_key(ps, key, &k));
    tdist_status_t st = ps->inner->ops->get(ps->inner, k, timeout_ms, value, len);
    free(k);
    return with_context(ps, st);
}

static tdist_status_t prefix_add(tdist_store_t *s, const char *key, int64_t delta, int64_t *result)
{
    prefix_store_t *ps = (prefix_store_t *)s;
    char *k = NULL;
    TDIST_CHECK(make_key(ps, key, &k));
    tdist_status_t st = ps->inner->ops->add(ps->inner, k, delta, result);
    free(k);
    return with_context(ps, st);
}

static tdist_status_t prefix_compare_set(tdist_store_t *s, const char *key, const void *expected,
                                         size_t expected_len, const void *desired,
                                         size_t desired_len, void **current, size_t *current_len)
{
    prefix_store_t *ps = (prefix_store_t *)s;
    char *k = NULL;
    TDIST_CHECK(make_key(ps, key, &k));
    tdist_status_t st = ps->inner->ops->compare_set(ps->inner, k, expected, expected_len, desired,
                                                    desired_len, current, current_len);
    free(k);
    return with_context(ps, st);
}

static tdist_status_t prefix_wait(tdist_store_t *s, const char *const *keys, size_t n,
                                  int64_t timeout_ms)
{
    prefix_store_t *ps = (prefix_store_t *)s;
    char **k;
    TDIST_CHECK(make_keys(ps, keys, n, &k));
    tdist_status_t st = ps->inner->ops->wait(ps->inner, (const char *const *)k, n, timeout_ms);
    free_keys(k, n);
    return with_context(ps, st);
}

static tdist_status_t prefix_check(tdist_store_t *s, const char *const *keys, size_t n,
                                   bool *all_exist)
{
    prefix_store_t *ps = (prefix_store_t *)s;
    char **k;
    TDIST_CHECK(make_keys(ps, keys, n, &k));
    tdist_status_t st = ps->inner->ops->check(ps->inner, (const char *const *)k, n, all_exist);
    free_keys(k, n);
    return with_context(ps, st);
}

static tdist_status_t prefix_delete_key(tdist_store_t *s, const char *key, bool *deleted)
{
    prefix_store_t *ps = (prefix_store_t *)s;
    char *k = NULL;
    TDIST_CHECK(make_key(ps, key, &k));
    tdist_status_t st = ps->inner->ops->delete_key(ps->inner, k, deleted);
    free(k);
    return with_context(ps, st);
}

/* Counts every key of the base, as store.h documents (and as
 * torch.distributed's PrefixStore does). */
static tdist_status_t prefix_num_keys(tdist_store_t *s, int64_t *count)
{
    prefix_store_t *ps = (prefix_store_t *)s;
    return with_context(ps, ps->inner->ops->num_keys(ps->inner, count));
}

static tdist_status_t prefix_append(tdist_store_t *s, const char *key, const void *value,
                                    size_t len)
{
    prefix_store_t *ps = (prefix_store_t *)s;
    char *k = NULL;
    TDIST_CHECK(make_key(ps, key, &k));
    tdist_status_t st = ps->inner->ops->append(ps->inner, k, value, len);
    free(k);
    return with_context(ps, st);
}

static tdist_status_t prefix_multi_get(tdist_store_t *s, const char *const *keys, size_t n,
                                       int64_t timeout_ms, void **values, size_t *lens)
{
    prefix_store_t *ps = (prefix_store_t *)s;
    char **k;
    TDIST_CHECK(make_keys(ps, keys, n, &k));
    tdist_status_t st =
        ps->inner->ops->multi_get(ps->inner, (const char *const *)k, n, timeout_ms, values, lens);
    free_keys(k, n);
    return with_context(ps, st);
}

static tdist_status_t prefix_multi_set(tdist_store_t *s, const char *const *keys,
                                       const void *const *values, const size_t *lens, size_t n)
{
    prefix_store_t *ps = (prefix_store_t *)s;
    char **k;
    TDIST_CHECK(make_keys(ps, keys, n, &k));
    tdist_status_t st =
        ps->inner->ops->multi_set(ps->inner, (const char *const *)k, values, lens, n);
    free_keys(k, n);
    return with_context(ps, st);
}

static const tdist_store_ops_t prefix_ops = {
    .kind = "prefix",
    .destroy = prefix_destroy,
    .set = prefix_set,
    .get = prefix_get,
    .add = prefix_add,
    .compare_set = prefix_compare_set,
    .wait = prefix_wait,
    .check = prefix_check,
    .delete_key = prefix_delete_key,
    .num_keys = prefix_num_keys,
    .append = prefix_append,
    .multi_get = prefix_multi_get,
    .multi_set = prefix_multi_set,
};

tdist_status_t tdist_store_prefix_create(const char *prefix, tdist_store_t *base,
                                         const tdist_store_opts_t *opts, tdist_store_t **out)
{
    static const char fn[] = "tdist_store_prefix_create";
    if (!prefix) return tdist__error(TDIST_ERR_INVALID_ARG, "%s: prefix is NULL", fn);
    if (!base) return tdist__error(TDIST_ERR_INVALID_ARG, "%s: base store is NULL", fn);
    if (!out) return tdist__error(TDIST_ERR_INVALID_ARG, "%s: out is NULL", fn);
    size_t plen = strnlen(prefix, TDIST_STORE_MAX_KEY);
    if (plen == 0) return tdist__error(TDIST_ERR_INVALID_ARG, "%s: prefix is empty", fn);
    /* "<prefix>/" plus at least one byte of key must fit. */
    if (plen + 2 > TDIST_STORE_MAX_KEY)
        return tdist__error(TDIST_ERR_INVALID_ARG,
                            "%s: prefix \"%.200s...\" is too long: \"<prefix>/<key>\" must fit "
                            "in %u bytes",
                            fn, prefix, TDIST_STORE_MAX_KEY);
    prefix_store_t *ps = calloc(1, sizeof *ps);
    char *p = tdist__strdup(prefix);
    if (!ps || !p) {
        free(ps);
        free(p);
        return tdist__error(TDIST_ERR_NO_MEMORY, "%s: out of memory", fn);
    }
    tdist_store_opts_t o;
    if (opts) {
        o = *opts;
    } else {
        tdist_store_opts_init(&o);
        o.timeout_ms = tdist_store_timeout(base);
    }
    tdist__store_base_init(&ps->base, &prefix_ops, &o);
    ps->inner = base;
    ps->prefix = p;
    ps->plen = plen;
    *out = &ps->base;
    return TDIST_OK;
}
