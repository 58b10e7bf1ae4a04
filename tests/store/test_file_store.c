/*
 * tests/store/test_file_store.c — the file store across processes: atomic
 * adds from many processes, a store opened before fork(), blocking get
 * across processes, persistence and tombstones, torn records at the end of
 * the log, and files that are not stores.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/internal.h"
#include "harness.h"

static void store_path(char *buf, size_t n, const char *name)
{
    snprintf(buf, n, "%s/%s", tdist_test_tmpdir(), name);
}

static tdist_store_t *open_store(const char *path)
{
    tdist_store_opts_t o;
    tdist_store_opts_init(&o);
    o.timeout_ms = (int64_t)(20000 * tdist_test_timeout_mult());
    tdist_store_t *s = NULL;
    ASSERT_OK(tdist_store_file_create(path, &o, &s));
    return s;
}

static void expect_str(tdist_store_t *s, const char *key, const char *want)
{
    void *v = NULL;
    size_t n = 0;
    ASSERT_OK(tdist_store_get(s, key, &v, &n));
    ASSERT_EQ(n, strlen(want));
    ASSERT_MEMEQ(v, want, n);
    free(v);
}

static int64_t file_size(const char *path)
{
    struct stat sb;
    ASSERT_EQ(stat(path, &sb), 0);
    return (int64_t)sb.st_size;
}

static void append_bytes(const char *path, const void *p, size_t n)
{
    int fd = open(path, O_WRONLY | O_APPEND);
    ASSERT_TRUE(fd >= 0);
    ASSERT_EQ(write(fd, p, n), (ssize_t)n);
    close(fd);
}

/* Fail naming every rank that did not exit 0 (their own messages are above). */
static void expect_all_ok(const tdist_rank_result_t *res, int n, int failed)
{
    char msg[1024] = "", buf[128];
    size_t used = 0;
    for (int i = 0; i < n; i++)
        if (!(res[i].exited && res[i].code == 0) && used < sizeof msg)
            used += (size_t)snprintf(msg + used, sizeof msg - used, " rank %d %s;", i,
                                     tdist_test_describe(&res[i], buf, sizeof buf));
    if (failed || msg[0]) FAIL("%d rank(s) failed:%s", failed, msg);
}

/* ------------------------------------------------------------ many processes */

#define PROCS 8
#define ADDS 200

static void adder_rank(int rank, int world, void *arg)
{
    tdist_store_t *s = open_store(arg);
    /* start together, so that the adds really contend */
    int64_t prev = 0, r = 0;
    ASSERT_OK(tdist_store_add(s, "ready", 1, NULL));
    double t0 = tdist_test_now_ms();
    while (r < world) {
        ASSERT_OK(tdist_store_add(s, "ready", 0, &r));
        if (tdist_test_now_ms() - t0 > 20000 * tdist_test_timeout_mult())
            FAIL("start barrier timed out");
    }
    for (int i = 0; i < ADDS; i++) {
        ASSERT_OK(tdist_store_add(s, "ctr", 1, &r));
        ASSERT_TRUE(r > prev); /* other processes only ever add */
        prev = r;
    }
    /* each rank records its last result; the one that saw PROCS*ADDS exists */
    char key[32], val[32];
    snprintf(key, sizeof key, "last%d", rank);
    snprintf(val, sizeof val, "%lld", (long long)r);
    ASSERT_OK(tdist_store_set(s, key, val, strlen(val)));
    tdist_store_destroy(s);
}

TEST(store_file_multiprocess_add, 60)
{
    char path[512];
    store_path(path, sizeof path, "procs.store");
    tdist_ranks_opts_t o;
    tdist_ranks_opts_init(&o, PROCS);
    o.with_store = false;
    tdist_rank_result_t res[PROCS];
    int failed = tdist_test_spawn_ranks(&o, adder_rank, path, res);
    expect_all_ok(res, PROCS, failed);

    tdist_store_t *s = open_store(path);
    int64_t r = -1;
    ASSERT_OK(tdist_store_add(s, "ctr", 0, &r));
    ASSERT_EQ(r, PROCS * ADDS);
    int64_t n = 0;
    ASSERT_OK(tdist_store_num_keys(s, &n));
    ASSERT_EQ(n, PROCS + 2);
    int max_seen = 0;
    for (int i = 0; i < PROCS; i++) {
        char key[32];
        snprintf(key, sizeof key, "last%d", i);
        void *v = NULL;
        size_t len = 0;
        ASSERT_OK(tdist_store_get(s, key, &v, &len));
        char tmp[32] = {0};
        ASSERT_TRUE(len < sizeof tmp);
        memcpy(tmp, v, len);
        free(v);
        int x = atoi(tmp);
        ASSERT_TRUE(x >= ADDS && x <= PROCS * ADDS);
        if (x > max_seen) max_seen = x;
    }
    ASSERT_EQ(max_seen, PROCS * ADDS);
    tdist_store_destroy(s);
}

/* A store opened before fork(): each child must get its own lock. */
typedef struct fork_arg {
    tdist_store_t *s;
} fork_arg_t;

static void forked_rank(int rank, int world, void *arg)
{
    fork_arg_t *fa = arg;
    for (int i = 0; i < 100; i++) ASSERT_OK(tdist_store_add(fa->s, "fctr", 1, NULL));
    ASSERT_OK(tdist_store_append(fa->s, "log", "x", 1));
    tdist_store_destroy(fa->s);
}

TEST(store_file_shared_across_fork, 60)
{
    char path[512];
    store_path(path, sizeof path, "fork.store");
    fork_arg_t fa = {open_store(path)};
    ASSERT_OK(tdist_store_add(fa.s, "fctr", 1000, NULL));
    tdist_ranks_opts_t o;
    tdist_ranks_opts_init(&o, 4);
    o.with_store = false;
    ASSERT_EQ(tdist_test_spawn_ranks(&o, forked_rank, &fa, NULL), 0);
    int64_t r = 0;
    ASSERT_OK(tdist_store_add(fa.s, "fctr", 0, &r)); /* the parent sees the children's writes */
    ASSERT_EQ(r, 1000 + 4 * 100);
    expect_str(fa.s, "log", "xxxx");
    tdist_store_destroy(fa.s);
}

/* ------------------------------------------------------------ blocking across processes */

static void get_rank(int rank, int world, void *arg)
{
    tdist_store_t *s = open_store(arg);
    if (rank == 0) {
        double t0 = tdist_test_now_ms();
        const char *keys[] = {"from1", "also1"};
        ASSERT_OK(tdist_store_wait(s, keys, 2, -1));
        expect_str(s, "from1", "hello from rank 1");
        ASSERT_GE(tdist_test_now_ms() - t0, 200); /* rank 1 sets them after 300 ms */
        ASSERT_OK(tdist_store_set(s, "ack", "ok", 2));
    } else {
        tdist__sleep_ms(300);
        ASSERT_OK(tdist_store_set(s, "from1", "hello from rank 1", 17));
        ASSERT_OK(tdist_store_set(s, "also1", "", 0));
        expect_str(s, "ack", "ok"); /* blocks until rank 0 answers */
    }
    tdist_store_destroy(s);
}

TEST(store_file_get_blocks_across_processes, 60)
{
    char path[512];
    store_path(path, sizeof path, "block.store");
    tdist_ranks_opts_t o;
    tdist_ranks_opts_init(&o, 2);
    o.with_store = false;
    tdist_rank_result_t res[2];
    int failed = tdist_test_spawn_ranks(&o, get_rank, path, res);
    expect_all_ok(res, 2, failed);
}

/* ------------------------------------------------------------ persistence */

TEST(store_file_persists_with_tombstones, 30)
{
    char path[512];
    store_path(path, sizeof path, "persist.store");
    tdist_store_t *a = open_store(path);
    tdist_store_t *b = open_store(path); /* a second handle in the same process */
    ASSERT_OK(tdist_store_set(a, "k1", "v1", 2));
    ASSERT_OK(tdist_store_set(a, "k2", "v2", 2));
    ASSERT_OK(tdist_store_append(b, "k2", "+", 1));
    expect_str(a, "k2", "v2+");
    int64_t before = file_size(path);
    bool deleted = false;
    ASSERT_OK(tdist_store_delete_key(b, "k1", &deleted));
    ASSERT_TRUE(deleted);
    ASSERT_TRUE(file_size(path) > before); /* the delete is a record too */
    int64_t n = 0;
    ASSERT_OK(tdist_store_num_keys(a, &n));
    ASSERT_EQ(n, 1);
    before = file_size(path);
    ASSERT_OK(tdist_store_delete_key(a, "k1", &deleted));
    ASSERT_FALSE(deleted);
    ASSERT_EQ(file_size(path), before); /* deleting a missing key writes nothing */
    tdist_store_destroy(a);
    tdist_store_destroy(b);

    /* the file outlives the handles, and reopening replays the log */
    tdist_store_t *c = open_store(path);
    bool all = true;
    const char *k1 = "k1";
    ASSERT_OK(tdist_store_check(c, &k1, 1, &all));
    ASSERT_FALSE(all);
    expect_str(c, "k2", "v2+");
    ASSERT_OK(tdist_store_num_keys(c, &n));
    ASSERT_EQ(n, 1);
    tdist_store_destroy(c);
    ASSERT_EQ(access(path, F_OK), 0);
}

/* ------------------------------------------------------------ damaged logs */

TEST(store_file_torn_tail_is_ignored, 30)
{
    char path[512];
    store_path(path, sizeof path, "torn.store");
    tdist_store_t *s = open_store(path);
    ASSERT_OK(tdist_store_set(s, "a", "1", 1));
    ASSERT_OK(tdist_store_set(s, "b", "2", 1));
    tdist_store_destroy(s);
    int64_t good = file_size(path);

    /* 1: a header cut short */
    append_bytes(path, "TDR1\001\0", 6);
    s = open_store(path);
    expect_str(s, "a", "1");
    int64_t n = 0;
    ASSERT_OK(tdist_store_num_keys(s, &n));
    ASSERT_EQ(n, 2);
    tdist_store_destroy(s);

    /* 2: a header promising 100 value bytes, with 10 present */
    ASSERT_EQ(truncate(path, good), 0);
    const unsigned char head[16] = {'T', 'D', 'R', '1', 1, 0, 0, 0, 1, 0, 0, 0, 100, 0, 0, 0};
    append_bytes(path, head, sizeof head);
    append_bytes(path, "c0123456789", 11);
    s = open_store(path);
    bool all = true;
    const char *c = "c";
    ASSERT_OK(tdist_store_check(s, &c, 1, &all));
    ASSERT_FALSE(all);
    expect_str(s, "b", "2");

    /* a second handle opened now also ignores it; the next write replaces
     * the torn bytes, and both handles see the new key */
    tdist_store_t *s2 = open_store(path);
    ASSERT_OK(tdist_store_set(s, "c", "3", 1));
    ASSERT_EQ(file_size(path), good + 16 + 1 + 1 + 4);
    expect_str(s2, "c", "3");
    ASSERT_OK(tdist_store_num_keys(s2, &n));
    ASSERT_EQ(n, 3);
    tdist_store_destroy(s2);
    tdist_store_destroy(s);

    /* 3: a whole record whose end marker is wrong (zeros written by a crash) */
    good = file_size(path);
    const unsigned char rec[] = {'T', 'D', 'R', '1', 1, 0,   0,   0, 1, 0, 0,
                                 0,   1,   0,   0,   0, 'd', '4', 0, 0, 0, 0};
    append_bytes(path, rec, sizeof rec);
    s = open_store(path);
    const char *d = "d";
    ASSERT_OK(tdist_store_check(s, &d, 1, &all));
    ASSERT_FALSE(all);
    int64_t r = 0;
    ASSERT_OK(tdist_store_add(s, "a", 10, &r));
    ASSERT_EQ(r, 11);
    tdist_store_destroy(s);
    s = open_store(path);
    expect_str(s, "a", "11");
    expect_str(s, "c", "3");
    ASSERT_OK(tdist_store_check(s, &d, 1, &all));
    ASSERT_FALSE(all);
    tdist_store_destroy(s);
}

TEST(store_file_refuses_foreign_files, 30)
{
    char path[512];
    store_path(path, sizeof path, "notes.txt");
    const char text[] = "my precious notes\n";
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ASSERT_TRUE(fd >= 0);
    ASSERT_EQ(write(fd, text, sizeof text - 1), (ssize_t)(sizeof text - 1));
    close(fd);
    tdist_store_t *s = (tdist_store_t *)&fd;
    ASSERT_STATUS(tdist_store_file_create(path, NULL, &s), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), path);
    ASSERT_TRUE(s == (tdist_store_t *)&fd);
    ASSERT_EQ(file_size(path), (int64_t)(sizeof text - 1)); /* left alone */

    /* a path that cannot be opened: the error names it */
    char bad[600];
    snprintf(bad, sizeof bad, "%s/no/such/dir/x.store", tdist_test_tmpdir());
    ASSERT_STATUS(tdist_store_file_create(bad, NULL, &s), TDIST_ERR_SYSTEM);
    ASSERT_CONTAINS(tdist_last_error(), bad);
    ASSERT_CONTAINS(tdist_last_error(), "No such file");

    /* arguments */
    ASSERT_STATUS(tdist_store_file_create(NULL, NULL, &s), TDIST_ERR_INVALID_ARG);
    ASSERT_STATUS(tdist_store_file_create("", NULL, &s), TDIST_ERR_INVALID_ARG);
    ASSERT_STATUS(tdist_store_file_create(bad, NULL, NULL), TDIST_ERR_INVALID_ARG);

    /* an empty existing file becomes a store */
    char empty[512];
    store_path(empty, sizeof empty, "empty.store");
    fd = open(empty, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ASSERT_TRUE(fd >= 0);
    close(fd);
    s = open_store(empty);
    ASSERT_OK(tdist_store_set(s, "k", "v", 1));
    tdist_store_destroy(s);
    ASSERT_TRUE(file_size(empty) > 8);
}

/* The timeout error names the path, the key and the store kind. */
TEST(store_file_timeout_names_path, 30)
{
    char path[512];
    store_path(path, sizeof path, "tmo.store");
    tdist_store_t *s = open_store(path);
    ASSERT_OK(tdist_store_set_timeout(s, 200));
    void *v;
    size_t n;
    double t0 = tdist_test_now_ms();
    ASSERT_STATUS(tdist_store_get(s, "nobody/sets/this", &v, &n), TDIST_ERR_TIMEOUT);
    double el = tdist_test_now_ms() - t0;
    ASSERT_GE(el, 199);
    ASSERT_LE(el, 1200);
    ASSERT_CONTAINS(tdist_last_error(), path);
    ASSERT_CONTAINS(tdist_last_error(), "nobody/sets/this");
    ASSERT_CONTAINS(tdist_last_error(), "file store");
    tdist_store_destroy(s);
}

/* add(key, 0) on an existing key is a read: the log does not grow (the
 * rendezvous polls counters this way); on a missing key it creates "0". */
TEST(store_file_add_zero_is_a_read, 30)
{
    char path[512];
    store_path(path, sizeof path, "addzero");
    tdist_store_t *s = open_store(path);
    int64_t v = -1;
    ASSERT_OK(tdist_store_add(s, "fresh", 0, &v));
    ASSERT_EQ(v, 0);
    expect_str(s, "fresh", "0");
    ASSERT_OK(tdist_store_add(s, "ctr", 5, &v));
    int64_t before = file_size(path);
    for (int i = 0; i < 100; i++) {
        ASSERT_OK(tdist_store_add(s, "ctr", 0, &v));
        ASSERT_EQ(v, 5);
    }
    ASSERT_EQ(file_size(path), before);
    ASSERT_OK(tdist_store_add(s, "ctr", 1, &v));
    ASSERT_EQ(v, 6);
    ASSERT_GE(file_size(path), before + 1);
    tdist_store_destroy(s);
}
