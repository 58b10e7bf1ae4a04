/*
 * tests/store/test_store_ops.c — every store operation against every store
 * type: hash, file, prefix (over a hash store) and TCP (a server on
 * 127.0.0.1 port 0 in this process, one client).
 *
 * Each check_* function below runs one group of operations on one store;
 * the TEST lines at the end run each group once per store type, so every
 * (group, store type) pair is its own ctest case:
 *   store_ops_<group>_<hash|file|prefix|tcp>.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

/* ------------------------------------------------------------ fixtures */

typedef struct fx {
    const char *kind;          /* "hash", "file", "prefix", "tcp" */
    tdist_store_t *s;          /* the store under test */
    tdist_store_t *base;       /* prefix: its base store */
    tdist_store_server_t *srv; /* tcp: the server */
} fx_t;

static void fx_open(fx_t *f, const char *kind)
{
    memset(f, 0, sizeof *f);
    f->kind = kind;
    tdist_store_opts_t o;
    tdist_store_opts_init(&o);
    o.timeout_ms = (int64_t)(20000 * tdist_test_timeout_mult());
    if (strcmp(kind, "hash") == 0) {
        ASSERT_OK(tdist_store_hash_create(&o, &f->s));
    } else if (strcmp(kind, "file") == 0) {
        char path[512];
        snprintf(path, sizeof path, "%s/ops.store", tdist_test_tmpdir());
        ASSERT_OK(tdist_store_file_create(path, &o, &f->s));
    } else if (strcmp(kind, "prefix") == 0) {
        ASSERT_OK(tdist_store_hash_create(&o, &f->base));
        ASSERT_OK(tdist_store_prefix_create("pfx", f->base, NULL, &f->s));
        ASSERT_EQ(tdist_store_timeout(f->s), o.timeout_ms); /* inherited from base */
    } else if (strcmp(kind, "tcp") == 0) {
        ASSERT_OK(tdist_store_server_create("127.0.0.1", 0, NULL, &f->srv));
        ASSERT_TRUE(tdist_store_server_port(f->srv) != 0);
        o.connect_timeout_ms = o.timeout_ms;
        ASSERT_OK(tdist_store_tcp_connect("127.0.0.1", tdist_store_server_port(f->srv), &o, &f->s));
    } else {
        FAIL("unknown store kind %s", kind);
    }
}

/* Another handle on the same data: a second client (tcp), a second open of
 * the file (file), or the store itself (hash, prefix: threads share it). */
static tdist_store_t *fx_second_handle(fx_t *f)
{
    tdist_store_opts_t o;
    tdist_store_opts_init(&o);
    o.timeout_ms = tdist_store_timeout(f->s);
    tdist_store_t *s2 = NULL;
    if (strcmp(f->kind, "tcp") == 0) {
        o.connect_timeout_ms = o.timeout_ms;
        ASSERT_OK(tdist_store_tcp_connect("127.0.0.1", tdist_store_server_port(f->srv), &o, &s2));
    } else if (strcmp(f->kind, "file") == 0) {
        char path[512];
        snprintf(path, sizeof path, "%s/ops.store", tdist_test_tmpdir());
        ASSERT_OK(tdist_store_file_create(path, &o, &s2));
    } else {
        s2 = f->s;
    }
    return s2;
}

static void fx_close(fx_t *f)
{
    tdist_store_destroy(f->s);
    tdist_store_destroy(f->base);
    tdist_store_server_destroy(f->srv);
    memset(f, 0, sizeof *f);
}

/* A value of n bytes cycling through every byte value (NULs included). */
static unsigned char *pattern(size_t n, unsigned seed)
{
    unsigned char *p = malloc(n ? n : 1);
    ASSERT_TRUE(p != NULL);
    for (size_t i = 0; i < n; i++) p[i] = (unsigned char)((i * 31u + seed) & 0xffu);
    return p;
}

/* get key and compare with want (len bytes). */
static void expect_value(tdist_store_t *s, const char *key, const void *want, size_t len)
{
    void *v = NULL;
    size_t n = 12345;
    ASSERT_OK(tdist_store_get(s, key, &v, &n));
    ASSERT_TRUE(v != NULL); /* never NULL on success, even when empty */
    ASSERT_EQ(n, len);
    if (len) ASSERT_MEMEQ(v, want, len);
    free(v);
}

static void expect_str(tdist_store_t *s, const char *key, const char *want)
{
    expect_value(s, key, want, strlen(want));
}

static bool exists(tdist_store_t *s, const char *key)
{
    bool all = false;
    ASSERT_OK(tdist_store_check(s, &key, 1, &all));
    return all;
}

/* ------------------------------------------------------------ set / get */

static void check_set_get(const char *kind)
{
    fx_t f;
    fx_open(&f, kind);
    tdist_store_t *s = f.s;

    ASSERT_OK(tdist_store_set(s, "a", "hello", 5));
    expect_str(s, "a", "hello");

    /* overwrite, longer then shorter */
    ASSERT_OK(tdist_store_set(s, "a", "world!!", 7));
    expect_str(s, "a", "world!!");
    ASSERT_OK(tdist_store_set(s, "a", "x", 1));
    expect_str(s, "a", "x");

    /* empty values, with and without a pointer */
    ASSERT_OK(tdist_store_set(s, "empty", NULL, 0));
    expect_value(s, "empty", "", 0);
    ASSERT_OK(tdist_store_set(s, "empty2", "ignored", 0));
    expect_value(s, "empty2", "", 0);
    ASSERT_TRUE(exists(s, "empty"));

    /* binary with NUL bytes */
    unsigned char *bin = pattern(256, 0);
    ASSERT_EQ(bin[0], 0);
    ASSERT_OK(tdist_store_set(s, "bin", bin, 256));
    expect_value(s, "bin", bin, 256);
    free(bin);

    /* ~1 MiB */
    size_t big_n = (1u << 20) + 17;
    unsigned char *big = pattern(big_n, 7);
    ASSERT_OK(tdist_store_set(s, "big", big, big_n));
    expect_value(s, "big", big, big_n);
    big[big_n / 2] ^= 0xff;
    ASSERT_OK(tdist_store_set(s, "big", big, big_n));
    expect_value(s, "big", big, big_n);
    free(big);

    /* a key of the longest allowed length (not for prefix: see bad_args) */
    if (strcmp(kind, "prefix") != 0) {
        char *key = malloc(TDIST_STORE_MAX_KEY + 1);
        ASSERT_TRUE(key != NULL);
        memset(key, 'k', TDIST_STORE_MAX_KEY);
        key[TDIST_STORE_MAX_KEY] = '\0';
        ASSERT_OK(tdist_store_set(s, key, "long", 4));
        expect_str(s, key, "long");
        free(key);
    }

    /* keys with odd bytes */
    ASSERT_OK(tdist_store_set(s, "with space/and/slash:=\t", "ok", 2));
    expect_str(s, "with space/and/slash:=\t", "ok");

    /* check */
    const char *both[] = {"a", "bin"};
    const char *one_missing[] = {"a", "nope"};
    bool all = false;
    ASSERT_OK(tdist_store_check(s, both, 2, &all));
    ASSERT_TRUE(all);
    ASSERT_OK(tdist_store_check(s, one_missing, 2, &all));
    ASSERT_FALSE(all);
    fx_close(&f);
}

/* ------------------------------------------------------------ add */

static void check_add(const char *kind)
{
    fx_t f;
    fx_open(&f, kind);
    tdist_store_t *s = f.s;
    int64_t r = 0;

    ASSERT_OK(tdist_store_add(s, "c", 5, &r)); /* missing key counts as 0 */
    ASSERT_EQ(r, 5);
    ASSERT_OK(tdist_store_add(s, "c", -7, &r));
    ASSERT_EQ(r, -2);
    ASSERT_OK(tdist_store_add(s, "c", 0, &r));
    ASSERT_EQ(r, -2);
    ASSERT_OK(tdist_store_add(s, "c", 3, NULL));
    expect_str(s, "c", "1"); /* kept as decimal text */
    ASSERT_OK(tdist_store_add(s, "c", -1000000000000LL, &r));
    ASSERT_EQ(r, -999999999999LL);
    expect_str(s, "c", "-999999999999");

    /* a counter set as text works with add */
    ASSERT_OK(tdist_store_set(s, "t", "41", 2));
    ASSERT_OK(tdist_store_add(s, "t", 1, &r));
    ASSERT_EQ(r, 42);

    /* non-numeric values */
    ASSERT_OK(tdist_store_set(s, "txt", "abc", 3));
    r = 77;
    ASSERT_STATUS(tdist_store_add(s, "txt", 1, &r), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "txt");
    ASSERT_EQ(r, 77); /* untouched on failure */
    expect_str(s, "txt", "abc");
    ASSERT_OK(tdist_store_set(s, "e", NULL, 0));
    ASSERT_STATUS(tdist_store_add(s, "e", 1, &r), TDIST_ERR_INVALID_ARG);
    ASSERT_OK(tdist_store_set(s, "bin", "1\0002", 3));
    ASSERT_STATUS(tdist_store_add(s, "bin", 1, &r), TDIST_ERR_INVALID_ARG);
    /* the store still works after the errors */
    ASSERT_OK(tdist_store_add(s, "c", 1, &r));
    ASSERT_EQ(r, -999999999998LL);

    /* the int64 range */
    ASSERT_OK(tdist_store_add(s, "big", INT64_MAX, &r));
    ASSERT_EQ(r, INT64_MAX);
    ASSERT_OK(tdist_store_add(s, "small", INT64_MIN, &r));
    ASSERT_TRUE(r == INT64_MIN);
    fx_close(&f);
}

/* ------------------------------------------------------------ compare_set */

static void expect_cas(tdist_store_t *s, const char *key, const char *expected, const char *desired,
                       const char *want_current)
{
    void *cur = NULL;
    size_t n = 999;
    ASSERT_OK(tdist_store_compare_set(s, key, expected, strlen(expected), desired, strlen(desired),
                                      &cur, &n));
    ASSERT_TRUE(cur != NULL);
    ASSERT_EQ(n, strlen(want_current));
    ASSERT_MEMEQ(cur, want_current, n);
    free(cur);
}

static void check_compare_set(const char *kind)
{
    fx_t f;
    fx_open(&f, kind);
    tdist_store_t *s = f.s;

    /* missing key, expected non-empty: nothing set, current = expected */
    expect_cas(s, "k", "old", "new", "old");
    ASSERT_FALSE(exists(s, "k"));
    /* missing key, expected empty: set, current = desired */
    expect_cas(s, "k", "", "v1", "v1");
    expect_str(s, "k", "v1");
    /* existing key equal to expected: swapped */
    expect_cas(s, "k", "v1", "v2", "v2");
    expect_str(s, "k", "v2");
    /* existing key different from expected: unchanged, current = existing */
    expect_cas(s, "k", "v1", "v3", "v2");
    expect_str(s, "k", "v2");
    /* empty expected against an existing non-empty value: no swap */
    expect_cas(s, "k", "", "v4", "v2");
    expect_str(s, "k", "v2");
    /* swap to an empty value, then an empty value matches empty expected */
    expect_cas(s, "k", "v2", "", "");
    expect_value(s, "k", "", 0);
    expect_cas(s, "k", "", "v5", "v5");
    /* a prefix of the value is not equal */
    expect_cas(s, "k", "v", "zz", "v5");

    /* binary values, and current may be NULL */
    const unsigned char a[] = {0, 1, 0, 2}, b[] = {0, 0, 0};
    ASSERT_OK(tdist_store_set(s, "bin", a, sizeof a));
    ASSERT_OK(tdist_store_compare_set(s, "bin", a, sizeof a, b, sizeof b, NULL, NULL));
    expect_value(s, "bin", b, sizeof b);
    ASSERT_OK(tdist_store_compare_set(s, "bin", a, sizeof a, a, sizeof a, NULL, NULL));
    expect_value(s, "bin", b, sizeof b);

    /* one of current/current_len NULL is an argument error */
    void *cur = NULL;
    ASSERT_STATUS(tdist_store_compare_set(s, "bin", b, sizeof b, a, sizeof a, &cur, NULL),
                  TDIST_ERR_INVALID_ARG);
    expect_value(s, "bin", b, sizeof b);
    fx_close(&f);
}

/* ------------------------------------------------------------ delete / num_keys */

static void check_delete_num_keys(const char *kind)
{
    fx_t f;
    fx_open(&f, kind);
    tdist_store_t *s = f.s;
    int64_t n = -1;
    bool deleted = true;

    ASSERT_OK(tdist_store_num_keys(s, &n));
    int64_t n0 = n; /* a TCP server may keep keys of its own */
    ASSERT_TRUE(n0 >= 0);

    ASSERT_OK(tdist_store_delete_key(s, "never", &deleted));
    ASSERT_FALSE(deleted);
    ASSERT_OK(tdist_store_delete_key(s, "never", NULL));

    ASSERT_OK(tdist_store_set(s, "k1", "1", 1));
    ASSERT_OK(tdist_store_set(s, "k2", "2", 1));
    ASSERT_OK(tdist_store_add(s, "k3", 3, NULL));
    ASSERT_OK(tdist_store_set(s, "k1", "1b", 2)); /* overwrite: no new key */
    ASSERT_OK(tdist_store_num_keys(s, &n));
    ASSERT_EQ(n, n0 + 3);

    ASSERT_OK(tdist_store_delete_key(s, "k2", &deleted));
    ASSERT_TRUE(deleted);
    ASSERT_FALSE(exists(s, "k2"));
    ASSERT_OK(tdist_store_num_keys(s, &n));
    ASSERT_EQ(n, n0 + 2);
    ASSERT_OK(tdist_store_delete_key(s, "k2", &deleted));
    ASSERT_FALSE(deleted);
    ASSERT_OK(tdist_store_num_keys(s, &n));
    ASSERT_EQ(n, n0 + 2);

    /* a deleted key is gone for get too */
    ASSERT_OK(tdist_store_set_timeout(s, 50));
    void *v = NULL;
    size_t len = 0;
    ASSERT_STATUS(tdist_store_get(s, "k2", &v, &len), TDIST_ERR_TIMEOUT);
    ASSERT_OK(tdist_store_set_timeout(s, (int64_t)(20000 * tdist_test_timeout_mult())));

    /* a deleted counter starts again from 0 */
    ASSERT_OK(tdist_store_delete_key(s, "k3", &deleted));
    ASSERT_TRUE(deleted);
    int64_t r = 0;
    ASSERT_OK(tdist_store_add(s, "k3", 1, &r));
    ASSERT_EQ(r, 1);

    /* set again after delete */
    ASSERT_OK(tdist_store_set(s, "k2", "again", 5));
    expect_str(s, "k2", "again");
    ASSERT_OK(tdist_store_num_keys(s, &n));
    ASSERT_EQ(n, n0 + 3);

    ASSERT_OK(tdist_store_delete_key(s, "k1", NULL));
    ASSERT_OK(tdist_store_delete_key(s, "k2", NULL));
    ASSERT_OK(tdist_store_delete_key(s, "k3", NULL));
    ASSERT_OK(tdist_store_num_keys(s, &n));
    ASSERT_EQ(n, n0);
    fx_close(&f);
}

/* ------------------------------------------------------------ append */

static void check_append(const char *kind)
{
    fx_t f;
    fx_open(&f, kind);
    tdist_store_t *s = f.s;

    ASSERT_OK(tdist_store_append(s, "ap", "ab", 2)); /* creates the key */
    expect_str(s, "ap", "ab");
    ASSERT_OK(tdist_store_append(s, "ap", "cd", 2));
    expect_str(s, "ap", "abcd");
    ASSERT_OK(tdist_store_append(s, "ap", NULL, 0));
    expect_str(s, "ap", "abcd");
    ASSERT_OK(tdist_store_append(s, "ap", "\0\1", 2));
    expect_value(s, "ap", "abcd\0\1", 6);

    /* empty append to a missing key creates an empty value */
    ASSERT_OK(tdist_store_append(s, "ap_empty", NULL, 0));
    ASSERT_TRUE(exists(s, "ap_empty"));
    expect_value(s, "ap_empty", "", 0);

    /* append to a counter, then the text is no longer a number */
    ASSERT_OK(tdist_store_add(s, "cnt", 12, NULL));
    ASSERT_OK(tdist_store_append(s, "cnt", "3", 1));
    int64_t r = 0;
    ASSERT_OK(tdist_store_add(s, "cnt", 1, &r));
    ASSERT_EQ(r, 124);
    ASSERT_OK(tdist_store_append(s, "cnt", "x", 1));
    ASSERT_STATUS(tdist_store_add(s, "cnt", 1, &r), TDIST_ERR_INVALID_ARG);

    /* many appends build the concatenation in order */
    char want[200];
    size_t wn = 0;
    for (int i = 0; i < 50; i++) {
        char piece[8];
        int pn = snprintf(piece, sizeof piece, "%d,", i);
        ASSERT_OK(tdist_store_append(s, "seq", piece, (size_t)pn));
        memcpy(want + wn, piece, (size_t)pn);
        wn += (size_t)pn;
    }
    expect_value(s, "seq", want, wn);
    fx_close(&f);
}

/* ------------------------------------------------------------ multi_get / multi_set */

static void check_multi(const char *kind)
{
    fx_t f;
    fx_open(&f, kind);
    tdist_store_t *s = f.s;

    unsigned char *bin = pattern(1000, 3);
    const char *keys[] = {"m0", "m1", "m2", "m3"};
    const void *vals[] = {"zero", NULL, bin, "three"};
    const size_t lens[] = {4, 0, 1000, 5};
    ASSERT_OK(tdist_store_multi_set(s, keys, vals, lens, 4));
    expect_str(s, "m0", "zero");
    expect_value(s, "m1", "", 0);
    expect_value(s, "m2", bin, 1000);

    void *out[4] = {0};
    size_t out_lens[4] = {9, 9, 9, 9};
    ASSERT_OK(tdist_store_multi_get(s, keys, 4, out, out_lens));
    for (int i = 0; i < 4; i++) {
        ASSERT_TRUE(out[i] != NULL);
        ASSERT_EQ(out_lens[i], lens[i]);
        if (lens[i]) ASSERT_MEMEQ(out[i], vals[i], lens[i]);
        free(out[i]);
    }

    /* the same key twice, in any order */
    const char *rev[] = {"m3", "m0", "m3"};
    void *out3[3] = {0};
    size_t lens3[3];
    ASSERT_OK(tdist_store_multi_get(s, rev, 3, out3, lens3));
    ASSERT_EQ(lens3[0], 5);
    ASSERT_MEMEQ(out3[0], "three", 5);
    ASSERT_EQ(lens3[1], 4);
    ASSERT_MEMEQ(out3[1], "zero", 4);
    ASSERT_EQ(lens3[2], 5);
    for (int i = 0; i < 3; i++) free(out3[i]);

    /* multi_set overwrites and adds */
    const char *keys2[] = {"m0", "m4"};
    const void *vals2[] = {"ZERO!", "four"};
    const size_t lens2[] = {5, 4};
    ASSERT_OK(tdist_store_multi_set(s, keys2, vals2, lens2, 2));
    expect_str(s, "m0", "ZERO!");
    expect_str(s, "m4", "four");
    bool all = false;
    const char *five[] = {"m0", "m1", "m2", "m3", "m4"};
    ASSERT_OK(tdist_store_check(s, five, 5, &all));
    ASSERT_TRUE(all);

    /* a missing key: timeout, and nothing written */
    ASSERT_OK(tdist_store_set_timeout(s, 100));
    const char *miss[] = {"m0", "missing_m"};
    void *sentinel = (void *)&f;
    void *out2[2] = {sentinel, sentinel};
    size_t out2_lens[2] = {4242, 4242};
    ASSERT_STATUS(tdist_store_multi_get(s, miss, 2, out2, out2_lens), TDIST_ERR_TIMEOUT);
    ASSERT_CONTAINS(tdist_last_error(), "missing_m");
    ASSERT_TRUE(out2[0] == sentinel && out2[1] == sentinel);
    ASSERT_EQ(out2_lens[0], 4242);
    ASSERT_EQ(out2_lens[1], 4242);
    free(bin);
    fx_close(&f);
}

/* ------------------------------------------------------------ blocking */

typedef struct setter {
    tdist_store_t *s;
    int delay_ms;
    const char *keys[3];
    int nkeys;
} setter_t;

static void *setter_main(void *arg)
{
    setter_t *st = arg;
    struct timespec ts = {.tv_sec = st->delay_ms / 1000,
                          .tv_nsec = (st->delay_ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
    for (int i = 0; i < st->nkeys; i++)
        ASSERT_OK(tdist_store_set(st->s, st->keys[i], st->keys[i], strlen(st->keys[i])));
    return NULL;
}

static void start_setter(pthread_t *t, setter_t *st, tdist_store_t *s, int delay_ms, const char *k0,
                         const char *k1)
{
    memset(st, 0, sizeof *st);
    st->s = s;
    st->delay_ms = delay_ms;
    st->keys[st->nkeys++] = k0;
    if (k1) st->keys[st->nkeys++] = k1;
    ASSERT_EQ(pthread_create(t, NULL, setter_main, st), 0);
}

static void check_blocking(const char *kind)
{
    fx_t f;
    fx_open(&f, kind);
    tdist_store_t *s = f.s;
    pthread_t t;
    setter_t st;

    /* get blocks until another thread sets the key, then returns its value.
     * The setter uses a second handle where the store has one (a TCP
     * client serialises its calls, so a set on the client that is blocked
     * in get would wait behind it; see store.h). */
    tdist_store_t *other = fx_second_handle(&f);
    start_setter(&t, &st, other, 300, "late", NULL);
    double t0 = tdist_test_now_ms();
    expect_str(s, "late", "late");
    double waited = tdist_test_now_ms() - t0;
    ASSERT_EQ(pthread_join(t, NULL), 0);
    ASSERT_GE(waited, 200); /* it really waited */
    ASSERT_LE(waited, 300 + 5000 * tdist_test_timeout_mult());

    /* wait blocks until every key exists */
    start_setter(&t, &st, other, 300, "w1", "w2");
    const char *wk[] = {"late", "w1", "w2"};
    t0 = tdist_test_now_ms();
    ASSERT_OK(tdist_store_wait(s, wk, 3, -1));
    waited = tdist_test_now_ms() - t0;
    ASSERT_EQ(pthread_join(t, NULL), 0);
    ASSERT_GE(waited, 200);
    bool all = false;
    ASSERT_OK(tdist_store_check(s, wk, 3, &all));
    ASSERT_TRUE(all);

    /* multi_get blocks too */
    start_setter(&t, &st, other, 300, "mg2", NULL);
    const char *mk[] = {"w1", "mg2"};
    void *vals[2] = {0};
    size_t lens[2];
    t0 = tdist_test_now_ms();
    ASSERT_OK(tdist_store_multi_get(s, mk, 2, vals, lens));
    waited = tdist_test_now_ms() - t0;
    ASSERT_EQ(pthread_join(t, NULL), 0);
    ASSERT_GE(waited, 200);
    ASSERT_EQ(lens[0], 2);
    ASSERT_MEMEQ(vals[0], "w1", 2);
    ASSERT_EQ(lens[1], 3);
    ASSERT_MEMEQ(vals[1], "mg2", 3);
    free(vals[0]);
    free(vals[1]);

    /* keys already there: no wait at all */
    t0 = tdist_test_now_ms();
    ASSERT_OK(tdist_store_wait(s, wk, 3, 0));
    expect_str(s, "late", "late");
    ASSERT_LE(tdist_test_now_ms() - t0, 1000);
    /* the same handle blocked in get can be set by another thread
     * (every kind but a TCP client, which serialises its calls) */
    if (strcmp(kind, "tcp") != 0) {
        start_setter(&t, &st, s, 300, "same", NULL);
        t0 = tdist_test_now_ms();
        expect_str(s, "same", "same");
        ASSERT_GE(tdist_test_now_ms() - t0, 200);
        ASSERT_EQ(pthread_join(t, NULL), 0);
    }
    if (other != s) tdist_store_destroy(other);
    fx_close(&f);
}

/* ------------------------------------------------------------ timeouts */

#define TMO_MS 400

/* elapsed must be in [deadline, deadline + 1 s] */
static void expect_in_window(double elapsed, const char *what)
{
    if (elapsed < TMO_MS - 1 || elapsed > TMO_MS + 1000)
        FAIL("%s timed out after %.1f ms, expected within [%d, %d] ms", what, elapsed, TMO_MS,
             TMO_MS + 1000);
}

static void expect_names(const char *kind, const char *key)
{
    const char *msg = tdist_last_error();
    ASSERT_CONTAINS(msg, key);
    if (!strcasestr(msg, kind))
        FAIL("timeout message \"%s\" does not name the store kind %s", msg, kind);
}

static void check_timeouts(const char *kind)
{
    fx_t f;
    fx_open(&f, kind);
    tdist_store_t *s = f.s;
    ASSERT_OK(tdist_store_set(s, "present", "p", 1));

    /* get uses the store's timeout */
    ASSERT_OK(tdist_store_set_timeout(s, TMO_MS));
    ASSERT_EQ(tdist_store_timeout(s), TMO_MS);
    void *v = (void *)&f;
    size_t len = 777;
    double t0 = tdist_test_now_ms();
    ASSERT_STATUS(tdist_store_get(s, "absent_get", &v, &len), TDIST_ERR_TIMEOUT);
    expect_in_window(tdist_test_now_ms() - t0, "get");
    expect_names(kind, "absent_get");
    ASSERT_TRUE(v == (void *)&f); /* out-params untouched */
    ASSERT_EQ(len, 777);

    /* wait with an explicit timeout names the first missing key */
    ASSERT_OK(tdist_store_set_timeout(s, 60000));
    const char *keys[] = {"present", "absent_w1", "absent_w2"};
    t0 = tdist_test_now_ms();
    ASSERT_STATUS(tdist_store_wait(s, keys, 3, TMO_MS), TDIST_ERR_TIMEOUT);
    expect_in_window(tdist_test_now_ms() - t0, "wait");
    expect_names(kind, "absent_w1");

    /* wait with timeout < 0 uses the store's */
    ASSERT_OK(tdist_store_set_timeout(s, TMO_MS));
    t0 = tdist_test_now_ms();
    ASSERT_STATUS(tdist_store_wait(s, keys + 2, 1, -1), TDIST_ERR_TIMEOUT);
    expect_in_window(tdist_test_now_ms() - t0, "wait(-1)");
    expect_names(kind, "absent_w2");

    /* multi_get */
    t0 = tdist_test_now_ms();
    void *vals[2];
    size_t lens[2];
    const char *mk[] = {"present", "absent_mg"};
    ASSERT_STATUS(tdist_store_multi_get(s, mk, 2, vals, lens), TDIST_ERR_TIMEOUT);
    expect_in_window(tdist_test_now_ms() - t0, "multi_get");
    expect_names(kind, "absent_mg");

    /* a zero timeout fails at once when the key is missing */
    t0 = tdist_test_now_ms();
    ASSERT_STATUS(tdist_store_wait(s, keys + 1, 1, 0), TDIST_ERR_TIMEOUT);
    ASSERT_LE(tdist_test_now_ms() - t0, 1000);

    /* the store still works after timeouts */
    expect_str(s, "present", "p");
    fx_close(&f);
}

/* ------------------------------------------------------------ argument errors */

static void check_bad_args(const char *kind)
{
    fx_t f;
    fx_open(&f, kind);
    tdist_store_t *s = f.s;
    const tdist_status_t bad = TDIST_ERR_INVALID_ARG;
    void *v = NULL;
    size_t len = 0;
    int64_t n = 0;
    bool b = false;
    const char *key = "k";
    const char *keys[] = {"k"};
    const void *vals[] = {"v"};
    const size_t lens[] = {1};
    char *longkey = malloc(TDIST_STORE_MAX_KEY + 2);
    ASSERT_TRUE(longkey != NULL);
    memset(longkey, 'L', TDIST_STORE_MAX_KEY + 1);
    longkey[TDIST_STORE_MAX_KEY + 1] = '\0';

    /* NULL store */
    ASSERT_STATUS(tdist_store_set(NULL, key, "v", 1), bad);
    ASSERT_CONTAINS(tdist_last_error(), "tdist_store_set");
    ASSERT_STATUS(tdist_store_get(NULL, key, &v, &len), bad);
    ASSERT_STATUS(tdist_store_add(NULL, key, 1, &n), bad);
    ASSERT_STATUS(tdist_store_compare_set(NULL, key, "a", 1, "b", 1, NULL, NULL), bad);
    ASSERT_STATUS(tdist_store_wait(NULL, keys, 1, 10), bad);
    ASSERT_STATUS(tdist_store_check(NULL, keys, 1, &b), bad);
    ASSERT_STATUS(tdist_store_delete_key(NULL, key, &b), bad);
    ASSERT_STATUS(tdist_store_num_keys(NULL, &n), bad);
    ASSERT_STATUS(tdist_store_append(NULL, key, "v", 1), bad);
    ASSERT_STATUS(tdist_store_multi_get(NULL, keys, 1, &v, &len), bad);
    ASSERT_STATUS(tdist_store_multi_set(NULL, keys, vals, lens, 1), bad);
    ASSERT_STATUS(tdist_store_set_timeout(NULL, 5), bad);

    /* NULL, empty and too-long keys, on every keyed operation */
    const char *badkeys[] = {NULL, "", longkey};
    for (int i = 0; i < 3; i++) {
        const char *k = badkeys[i];
        const char *ks[] = {"ok", k};
        ASSERT_STATUS(tdist_store_set(s, k, "v", 1), bad);
        ASSERT_STATUS(tdist_store_get(s, k, &v, &len), bad);
        ASSERT_STATUS(tdist_store_add(s, k, 1, &n), bad);
        ASSERT_STATUS(tdist_store_compare_set(s, k, "", 0, "b", 1, NULL, NULL), bad);
        ASSERT_STATUS(tdist_store_wait(s, ks, 2, 10), bad);
        ASSERT_STATUS(tdist_store_check(s, ks, 2, &b), bad);
        ASSERT_STATUS(tdist_store_delete_key(s, k, &b), bad);
        ASSERT_STATUS(tdist_store_append(s, k, "v", 1), bad);
        ASSERT_STATUS(tdist_store_multi_get(s, ks, 2, &v, &len), bad);
        const void *vs[] = {"v", "w"};
        const size_t ls[] = {1, 1};
        ASSERT_STATUS(tdist_store_multi_set(s, ks, vs, ls, 2), bad);
    }
    ASSERT_STATUS(tdist_store_set(s, "", "v", 1), bad);
    ASSERT_CONTAINS(tdist_last_error(), "empty");

    /* a value pointer of NULL with a length */
    ASSERT_STATUS(tdist_store_set(s, key, NULL, 3), bad);
    ASSERT_STATUS(tdist_store_append(s, key, NULL, 3), bad);
    ASSERT_STATUS(tdist_store_compare_set(s, key, NULL, 2, "b", 1, NULL, NULL), bad);
    ASSERT_STATUS(tdist_store_compare_set(s, key, "", 0, NULL, 2, NULL, NULL), bad);
    const void *nullvals[] = {NULL};
    const size_t threelens[] = {3};
    ASSERT_STATUS(tdist_store_multi_set(s, keys, nullvals, threelens, 1), bad);
    /* a value above the cap (never read: the check comes first) */
    ASSERT_STATUS(tdist_store_set(s, key, "v", (size_t)TDIST_STORE_MAX_VALUE + 1), bad);

    /* NULL out-parameters and key arrays */
    ASSERT_STATUS(tdist_store_get(s, key, NULL, &len), bad);
    ASSERT_STATUS(tdist_store_get(s, key, &v, NULL), bad);
    ASSERT_STATUS(tdist_store_check(s, keys, 1, NULL), bad);
    ASSERT_STATUS(tdist_store_num_keys(s, NULL), bad);
    ASSERT_STATUS(tdist_store_wait(s, NULL, 1, 10), bad);
    ASSERT_STATUS(tdist_store_wait(s, keys, 0, 10), bad);
    ASSERT_STATUS(tdist_store_check(s, NULL, 1, &b), bad);
    ASSERT_STATUS(tdist_store_multi_get(s, keys, 1, NULL, &len), bad);
    ASSERT_STATUS(tdist_store_multi_get(s, keys, 0, &v, &len), bad);
    ASSERT_STATUS(tdist_store_multi_set(s, keys, NULL, lens, 1), bad);
    ASSERT_STATUS(tdist_store_multi_set(s, keys, vals, NULL, 1), bad);
    ASSERT_STATUS(tdist_store_multi_set(s, NULL, vals, lens, 1), bad);

    /* nothing was stored by any of the failed calls */
    ASSERT_FALSE(exists(s, key));
    ASSERT_OK(tdist_store_num_keys(s, &n));
    int64_t n0 = n;

    /* prefix: a key that fits alone but not with "<prefix>/" in front */
    if (strcmp(kind, "prefix") == 0) {
        longkey[TDIST_STORE_MAX_KEY] = '\0'; /* exactly the cap */
        ASSERT_STATUS(tdist_store_set(s, longkey, "v", 1), bad);
        ASSERT_CONTAINS(tdist_last_error(), "pfx");
        longkey[TDIST_STORE_MAX_KEY - 4] = '\0'; /* "pfx/" + key == cap */
        ASSERT_OK(tdist_store_set(s, longkey, "v", 1));
        expect_str(s, longkey, "v");
        ASSERT_OK(tdist_store_num_keys(s, &n));
        ASSERT_EQ(n, n0 + 1);
    }

    /* destroy(NULL) and friends do nothing */
    tdist_store_destroy(NULL);
    tdist_store_server_destroy(NULL);
    ASSERT_EQ(tdist_store_timeout(NULL), -1);
    /* the store still works */
    ASSERT_OK(tdist_store_set(s, key, "ok", 2));
    expect_str(s, key, "ok");
    free(longkey);
    fx_close(&f);
}

/* ------------------------------------------------------------ concurrent adds */

#define ADD_THREADS 8
#define ADDS_PER_THREAD 200

typedef struct adder {
    tdist_store_t *s;
    int64_t results[ADDS_PER_THREAD];
} adder_t;

static void *adder_main(void *arg)
{
    adder_t *a = arg;
    for (int i = 0; i < ADDS_PER_THREAD; i++)
        ASSERT_OK(tdist_store_add(a->s, "ctr", 1, &a->results[i]));
    return NULL;
}

static void check_concurrent_adds(const char *kind)
{
    fx_t f;
    fx_open(&f, kind);
    adder_t *ad = calloc(ADD_THREADS, sizeof *ad);
    ASSERT_TRUE(ad != NULL);
    pthread_t t[ADD_THREADS];
    for (int i = 0; i < ADD_THREADS; i++) {
        ad[i].s = f.s;
        ASSERT_EQ(pthread_create(&t[i], NULL, adder_main, &ad[i]), 0);
    }
    for (int i = 0; i < ADD_THREADS; i++) ASSERT_EQ(pthread_join(t[i], NULL), 0);

    const int total = ADD_THREADS * ADDS_PER_THREAD;
    int64_t r = 0;
    ASSERT_OK(tdist_store_add(f.s, "ctr", 0, &r));
    ASSERT_EQ(r, total);
    /* every add saw a distinct value: 1..total each exactly once, and each
     * thread's values increase */
    unsigned char *seen = calloc((size_t)total + 1, 1);
    ASSERT_TRUE(seen != NULL);
    for (int i = 0; i < ADD_THREADS; i++) {
        for (int j = 0; j < ADDS_PER_THREAD; j++) {
            int64_t x = ad[i].results[j];
            ASSERT_TRUE(x >= 1 && x <= total);
            ASSERT_EQ(seen[x], 0);
            seen[x] = 1;
            if (j) ASSERT_TRUE(x > ad[i].results[j - 1]);
        }
    }
    free(seen);
    free(ad);
    fx_close(&f);
}

/* ------------------------------------------------------------ the cases */

TEST(store_ops_set_get_hash, 30) { check_set_get("hash"); }
TEST(store_ops_set_get_file, 30) { check_set_get("file"); }
TEST(store_ops_set_get_prefix, 30) { check_set_get("prefix"); }
TEST(store_ops_set_get_tcp, 30) { check_set_get("tcp"); }

TEST(store_ops_add_hash, 30) { check_add("hash"); }
TEST(store_ops_add_file, 30) { check_add("file"); }
TEST(store_ops_add_prefix, 30) { check_add("prefix"); }
TEST(store_ops_add_tcp, 30) { check_add("tcp"); }

TEST(store_ops_compare_set_hash, 30) { check_compare_set("hash"); }
TEST(store_ops_compare_set_file, 30) { check_compare_set("file"); }
TEST(store_ops_compare_set_prefix, 30) { check_compare_set("prefix"); }
TEST(store_ops_compare_set_tcp, 30) { check_compare_set("tcp"); }

TEST(store_ops_delete_num_keys_hash, 30) { check_delete_num_keys("hash"); }
TEST(store_ops_delete_num_keys_file, 30) { check_delete_num_keys("file"); }
TEST(store_ops_delete_num_keys_prefix, 30) { check_delete_num_keys("prefix"); }
TEST(store_ops_delete_num_keys_tcp, 30) { check_delete_num_keys("tcp"); }

TEST(store_ops_append_hash, 30) { check_append("hash"); }
TEST(store_ops_append_file, 30) { check_append("file"); }
TEST(store_ops_append_prefix, 30) { check_append("prefix"); }
TEST(store_ops_append_tcp, 30) { check_append("tcp"); }

TEST(store_ops_multi_hash, 30) { check_multi("hash"); }
TEST(store_ops_multi_file, 30) { check_multi("file"); }
TEST(store_ops_multi_prefix, 30) { check_multi("prefix"); }
TEST(store_ops_multi_tcp, 30) { check_multi("tcp"); }

TEST(store_ops_blocking_hash, 30) { check_blocking("hash"); }
TEST(store_ops_blocking_file, 30) { check_blocking("file"); }
TEST(store_ops_blocking_prefix, 30) { check_blocking("prefix"); }
TEST(store_ops_blocking_tcp, 30) { check_blocking("tcp"); }

TEST(store_ops_timeouts_hash, 30) { check_timeouts("hash"); }
TEST(store_ops_timeouts_file, 30) { check_timeouts("file"); }
TEST(store_ops_timeouts_prefix, 30) { check_timeouts("prefix"); }
TEST(store_ops_timeouts_tcp, 30) { check_timeouts("tcp"); }

TEST(store_ops_bad_args_hash, 30) { check_bad_args("hash"); }
TEST(store_ops_bad_args_file, 30) { check_bad_args("file"); }
TEST(store_ops_bad_args_prefix, 30) { check_bad_args("prefix"); }
TEST(store_ops_bad_args_tcp, 30) { check_bad_args("tcp"); }

TEST(store_ops_concurrent_adds_hash, 60) { check_concurrent_adds("hash"); }
TEST(store_ops_concurrent_adds_file, 60) { check_concurrent_adds("file"); }
TEST(store_ops_concurrent_adds_prefix, 60) { check_concurrent_adds("prefix"); }
TEST(store_ops_concurrent_adds_tcp, 60) { check_concurrent_adds("tcp"); }

/* ------------------------------------------------------------ prefix specifics */

TEST(store_prefix_keys_live_in_base, 30)
{
    tdist_store_t *base = NULL, *p = NULL, *pp = NULL;
    ASSERT_OK(tdist_store_hash_create(NULL, &base));
    ASSERT_OK(tdist_store_set_timeout(base, 1234));
    ASSERT_OK(tdist_store_prefix_create("job7", base, NULL, &p));
    ASSERT_EQ(tdist_store_timeout(p), 1234);

    ASSERT_OK(tdist_store_set(p, "k", "v", 1));
    expect_str(base, "job7/k", "v");
    ASSERT_FALSE(exists(base, "k"));
    ASSERT_OK(tdist_store_set(base, "job7/direct", "d", 1));
    expect_str(p, "direct", "d");

    /* num_keys counts every key of the base (store.h) */
    ASSERT_OK(tdist_store_set(base, "unrelated", "u", 1));
    int64_t n = 0;
    ASSERT_OK(tdist_store_num_keys(p, &n));
    ASSERT_EQ(n, 3);

    /* nested prefixes */
    tdist_store_opts_t o;
    tdist_store_opts_init(&o);
    o.timeout_ms = 50;
    ASSERT_OK(tdist_store_prefix_create("inner", p, &o, &pp));
    ASSERT_EQ(tdist_store_timeout(pp), 50); /* opts win over the base's */
    ASSERT_OK(tdist_store_add(pp, "c", 2, NULL));
    expect_str(base, "job7/inner/c", "2");
    bool deleted = false;
    ASSERT_OK(tdist_store_delete_key(pp, "c", &deleted));
    ASSERT_TRUE(deleted);
    ASSERT_FALSE(exists(base, "job7/inner/c"));

    /* the error of a timeout names the prefixed key and the prefix */
    void *v;
    size_t len;
    ASSERT_STATUS(tdist_store_get(pp, "nokey", &v, &len), TDIST_ERR_TIMEOUT);
    ASSERT_CONTAINS(tdist_last_error(), "job7/inner/nokey");
    ASSERT_CONTAINS(tdist_last_error(), "prefix store \"inner\"");

    /* destroying the views leaves the base alive and intact */
    tdist_store_destroy(pp);
    tdist_store_destroy(p);
    expect_str(base, "job7/k", "v");
    tdist_store_destroy(base);
}

TEST(store_prefix_create_checks_args, 10)
{
    tdist_store_t *base = NULL, *p = (tdist_store_t *)&base;
    ASSERT_OK(tdist_store_hash_create(NULL, &base));
    ASSERT_STATUS(tdist_store_prefix_create(NULL, base, NULL, &p), TDIST_ERR_INVALID_ARG);
    ASSERT_STATUS(tdist_store_prefix_create("", base, NULL, &p), TDIST_ERR_INVALID_ARG);
    ASSERT_STATUS(tdist_store_prefix_create("x", NULL, NULL, &p), TDIST_ERR_INVALID_ARG);
    ASSERT_STATUS(tdist_store_prefix_create("x", base, NULL, NULL), TDIST_ERR_INVALID_ARG);
    ASSERT_TRUE(p == (tdist_store_t *)&base); /* untouched on failure */

    /* the longest prefix that still leaves room for a 1-byte key */
    char *prefix = malloc(TDIST_STORE_MAX_KEY + 1);
    ASSERT_TRUE(prefix != NULL);
    memset(prefix, 'p', TDIST_STORE_MAX_KEY);
    prefix[TDIST_STORE_MAX_KEY] = '\0';
    ASSERT_STATUS(tdist_store_prefix_create(prefix, base, NULL, &p), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "too long");
    prefix[TDIST_STORE_MAX_KEY - 1] = '\0';
    ASSERT_STATUS(tdist_store_prefix_create(prefix, base, NULL, &p), TDIST_ERR_INVALID_ARG);
    prefix[TDIST_STORE_MAX_KEY - 2] = '\0';
    ASSERT_OK(tdist_store_prefix_create(prefix, base, NULL, &p));
    ASSERT_OK(tdist_store_set(p, "k", "v", 1));
    ASSERT_STATUS(tdist_store_set(p, "kk", "v", 1), TDIST_ERR_INVALID_ARG);
    int64_t n = 0;
    ASSERT_OK(tdist_store_num_keys(base, &n));
    ASSERT_EQ(n, 1);
    tdist_store_destroy(p);
    free(prefix);
    tdist_store_destroy(base);

    ASSERT_STATUS(tdist_store_hash_create(NULL, NULL), TDIST_ERR_INVALID_ARG);
}
