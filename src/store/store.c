/* store/store.c — the public store API: argument checks, then dispatch. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "store/internal.h"

void tdist_store_opts_init(tdist_store_opts_t *opts)
{
    if (!opts) return;
    memset(opts, 0, sizeof *opts);
    opts->timeout_ms = tdist__default_timeout_ms(TDIST_STORE_DEFAULT_TIMEOUT_MS);
    opts->token = NULL;
    opts->connect_timeout_ms = -1;
}

/* A positive integer from the environment, else dflt. */
static uint64_t env_u64(const char *name, uint64_t dflt)
{
    const char *v = getenv(name);
    if (!v || !*v) return dflt;
    char *end = NULL;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (errno || *end || x == 0 || *v == '-') {
        TDIST_LOGW("%s=\"%s\" is not a positive integer; using %llu", name, v,
                   (unsigned long long)dflt);
        return dflt;
    }
    return x;
}

void tdist_store_server_opts_init(tdist_store_server_opts_t *opts)
{
    if (!opts) return;
    memset(opts, 0, sizeof *opts);
    opts->token = NULL;
    opts->max_clients = 4096;
    opts->max_key = TDIST_STORE_MAX_KEY;
    opts->max_value = TDIST_STORE_MAX_VALUE;
    opts->backlog = 1024;
    opts->hello_timeout_ms = 30000;
    opts->max_unauthenticated = 256;
    opts->max_total_bytes = env_u64("TDIST_STORE_MAX_BYTES", 1ull << 30);
    opts->max_total_keys = env_u64("TDIST_STORE_MAX_NUM_KEYS", 1ull << 20);
}

void tdist__store_base_init(tdist_store_t *s, const tdist_store_ops_t *ops,
                            const tdist_store_opts_t *opts)
{
    s->ops = ops;
    int64_t t = opts ? opts->timeout_ms : tdist__default_timeout_ms(TDIST_STORE_DEFAULT_TIMEOUT_MS);
    atomic_store(&s->timeout_ms, t);
}

int tdist__store_parse_counter(const void *value, size_t len, int64_t *out)
{
    char buf[32];
    if (len == 0 || len >= sizeof buf) return -1;
    if (memchr(value, '\0', len)) return -1; /* "1\0junk" is not a number */
    memcpy(buf, value, len);
    buf[len] = '\0';
    return tdist__parse_int(buf, INT64_MIN, INT64_MAX, out);
}

void *tdist__store_dup(const void *value, size_t len)
{
    void *p = malloc(len ? len : 1);
    if (p && len) memcpy(p, value, len);
    return p;
}

/* ------------------------------------------------------------- checks */

static tdist_status_t check_store(const tdist_store_t *s, const char *fn)
{
    if (!s) return tdist__error(TDIST_ERR_INVALID_ARG, "%s: store is NULL", fn);
    return TDIST_OK;
}

static tdist_status_t check_key(const char *key, const char *fn)
{
    if (!key) return tdist__error(TDIST_ERR_INVALID_ARG, "%s: key is NULL", fn);
    size_t n = strnlen(key, TDIST_STORE_MAX_KEY + 1);
    if (n == 0) return tdist__error(TDIST_ERR_INVALID_ARG, "%s: key is empty", fn);
    if (n > TDIST_STORE_MAX_KEY)
        return tdist__error(TDIST_ERR_INVALID_ARG, "%s: key longer than %u bytes", fn,
                            TDIST_STORE_MAX_KEY);
    return TDIST_OK;
}

static tdist_status_t check_value(const void *value, size_t len, const char *fn)
{
    if (len > 0 && !value)
        return tdist__error(TDIST_ERR_INVALID_ARG, "%s: value is NULL but length is %zu", fn, len);
    if (len > TDIST_STORE_MAX_VALUE)
        return tdist__error(TDIST_ERR_INVALID_ARG, "%s: value of %zu bytes exceeds the cap of %u",
                            fn, len, TDIST_STORE_MAX_VALUE);
    return TDIST_OK;
}

static tdist_status_t check_keys(const char *const *keys, size_t n, const char *fn)
{
    if (!keys) return tdist__error(TDIST_ERR_INVALID_ARG, "%s: keys is NULL", fn);
    if (n == 0 || n > TDIST_STORE_MAX_KEYS)
        return tdist__error(TDIST_ERR_INVALID_ARG, "%s: number of keys %zu not in [1, %u]", fn, n,
                            TDIST_STORE_MAX_KEYS);
    for (size_t i = 0; i < n; i++) TDIST_CHECK(check_key(keys[i], fn));
    return TDIST_OK;
}

static int64_t resolve_timeout(const tdist_store_t *s, int64_t timeout_ms)
{
    return timeout_ms < 0 ? atomic_load(&s->timeout_ms) : timeout_ms;
}

/* ------------------------------------------------------------- dispatch */

void tdist_store_destroy(tdist_store_t *s)
{
    if (s) s->ops->destroy(s);
}

int64_t tdist_store_timeout(const tdist_store_t *s)
{
    return s ? atomic_load(&((tdist_store_t *)s)->timeout_ms) : -1;
}

tdist_status_t tdist_store_set_timeout(tdist_store_t *s, int64_t timeout_ms)
{
    TDIST_CHECK(check_store(s, "tdist_store_set_timeout"));
    atomic_store(&s->timeout_ms, timeout_ms);
    return TDIST_OK;
}

/* This thread's bound on every store call (absolute, tdist__now_ms clock;
 * INT64_MAX: none). */
static _Thread_local int64_t thread_bound = INT64_MAX;

void tdist_store_bound_thread(int64_t timeout_ms)
{
    thread_bound = timeout_ms < 0 ? INT64_MAX : tdist__deadline_ms(timeout_ms);
}

int64_t tdist__store_thread_bound(void) { return thread_bound; }

tdist_status_t tdist_store_set(tdist_store_t *s, const char *key, const void *value, size_t len)
{
    static const char fn[] = "tdist_store_set";
    TDIST_CHECK(check_store(s, fn));
    TDIST_CHECK(check_key(key, fn));
    TDIST_CHECK(check_value(value, len, fn));
    return s->ops->set(s, key, value, len);
}

tdist_status_t tdist_store_get(tdist_store_t *s, const char *key, void **value, size_t *len)
{
    static const char fn[] = "tdist_store_get";
    TDIST_CHECK(check_store(s, fn));
    TDIST_CHECK(check_key(key, fn));
    if (!value || !len)
        return tdist__error(TDIST_ERR_INVALID_ARG, "%s: value and len must not be NULL", fn);
    return s->ops->get(s, key, resolve_timeout(s, -1), value, len);
}

tdist_status_t tdist_store_add(tdist_store_t *s, const char *key, int64_t delta, int64_t *result)
{
    static const char fn[] = "tdist_store_add";
    TDIST_CHECK(check_store(s, fn));
    TDIST_CHECK(check_key(key, fn));
    int64_t r;
    TDIST_CHECK(s->ops->add(s, key, delta, &r));
    if (result) *result = r;
    return TDIST_OK;
}

tdist_status_t tdist_store_compare_set(tdist_store_t *s, const char *key, const void *expected,
                                       size_t expected_len, const void *desired, size_t desired_len,
                                       void **current, size_t *current_len)
{
    static const char fn[] = "tdist_store_compare_set";
    TDIST_CHECK(check_store(s, fn));
    TDIST_CHECK(check_key(key, fn));
    TDIST_CHECK(check_value(expected, expected_len, fn));
    TDIST_CHECK(check_value(desired, desired_len, fn));
    if ((current == NULL) != (current_len == NULL))
        return tdist__error(TDIST_ERR_INVALID_ARG,
                            "%s: current and current_len must both be NULL or both be set", fn);
    void *cur = NULL;
    size_t cur_len = 0;
    TDIST_CHECK(s->ops->compare_set(s, key, expected, expected_len, desired, desired_len, &cur,
                                    &cur_len));
    if (current) {
        *current = cur;
        *current_len = cur_len;
    } else {
        free(cur);
    }
    return TDIST_OK;
}

tdist_status_t tdist_store_wait(tdist_store_t *s, const char *const *keys, size_t n,
                                int64_t timeout_ms)
{
    static const char fn[] = "tdist_store_wait";
    TDIST_CHECK(check_store(s, fn));
    TDIST_CHECK(check_keys(keys, n, fn));
    return s->ops->wait(s, keys, n, resolve_timeout(s, timeout_ms));
}

tdist_status_t tdist_store_check(tdist_store_t *s, const char *const *keys, size_t n,
                                 bool *all_exist)
{
    static const char fn[] = "tdist_store_check";
    TDIST_CHECK(check_store(s, fn));
    TDIST_CHECK(check_keys(keys, n, fn));
    if (!all_exist) return tdist__error(TDIST_ERR_INVALID_ARG, "%s: all_exist is NULL", fn);
    return s->ops->check(s, keys, n, all_exist);
}

tdist_status_t tdist_store_delete_key(tdist_store_t *s, const char *key, bool *deleted)
{
    static const char fn[] = "tdist_store_delete_key";
    TDIST_CHECK(check_store(s, fn));
    TDIST_CHECK(check_key(key, fn));
    bool d = false;
    TDIST_CHECK(s->ops->delete_key(s, key, &d));
    if (deleted) *deleted = d;
    return TDIST_OK;
}

tdist_status_t tdist_store_num_keys(tdist_store_t *s, int64_t *count)
{
    static const char fn[] = "tdist_store_num_keys";
    TDIST_CHECK(check_store(s, fn));
    if (!count) return tdist__error(TDIST_ERR_INVALID_ARG, "%s: count is NULL", fn);
    return s->ops->num_keys(s, count);
}

tdist_status_t tdist_store_append(tdist_store_t *s, const char *key, const void *value, size_t len)
{
    static const char fn[] = "tdist_store_append";
    TDIST_CHECK(check_store(s, fn));
    TDIST_CHECK(check_key(key, fn));
    TDIST_CHECK(check_value(value, len, fn));
    return s->ops->append(s, key, value, len);
}

tdist_status_t tdist_store_multi_get(tdist_store_t *s, const char *const *keys, size_t n,
                                     void **values, size_t *lens)
{
    static const char fn[] = "tdist_store_multi_get";
    TDIST_CHECK(check_store(s, fn));
    TDIST_CHECK(check_keys(keys, n, fn));
    if (!values || !lens)
        return tdist__error(TDIST_ERR_INVALID_ARG, "%s: values and lens must not be NULL", fn);
    return s->ops->multi_get(s, keys, n, resolve_timeout(s, -1), values, lens);
}

tdist_status_t tdist_store_multi_set(tdist_store_t *s, const char *const *keys,
                                     const void *const *values, const size_t *lens, size_t n)
{
    static const char fn[] = "tdist_store_multi_set";
    TDIST_CHECK(check_store(s, fn));
    TDIST_CHECK(check_keys(keys, n, fn));
    if (!values || !lens)
        return tdist__error(TDIST_ERR_INVALID_ARG, "%s: values and lens must not be NULL", fn);
    for (size_t i = 0; i < n; i++) TDIST_CHECK(check_value(values[i], lens[i], fn));
    return s->ops->multi_set(s, keys, values, lens, n);
}

void tdist__store_warn_no_secret(const char *who, const char *addr)
{
    const char *a = addr[0] == '[' ? addr + 1 : addr;
    if (strncmp(a, "127.", 4) == 0 || strncmp(a, "::1]", 4) == 0 ||
        strncmp(a, "localhost:", 10) == 0 || strncmp(a, "::ffff:127.", 11) == 0)
        return;
    TDIST_LOGW("%s %s runs without the job's secret: any process that can reach it can read "
               "and write the job's keys; set the same TDIST_JOB_SECRET for every process of "
               "the job (tdistrun makes one for single-node jobs)", who, addr);
}
