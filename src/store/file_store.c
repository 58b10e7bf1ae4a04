/*
 * store/file_store.c — a store kept in one file, safe across processes
 * (the store behind file:// init), in the manner of torch's FileStore.
 *
 * The file is an append-only log:
 *
 *   file    := "TDISTFS1" record*
 *   record  := magic u32 ("TDR1") | type u8 | 3 zero bytes | key_len u32 |
 *              value_len u32 | key | value | end u32 ("TEND")
 *
 * (integers little-endian). type is SET, APPEND or DELETE (a tombstone).
 * Each process keeps the map as of the end of the last complete record it
 * has read (`offset`) in an in-process hash store (`view`). Every operation
 * takes flock() on the file — LOCK_SH to read, LOCK_EX to change — reads
 * the records appended since `offset` into the view, and (to change) appends
 * its own records with one write() and reads them back the same way. So
 * read-modify-write operations (add, compare_set, append) are atomic across
 * every process using the file.
 *
 * A record that is cut short or damaged (a writer died mid-write) ends the
 * log for readers: it is ignored, never a crash, and the next writer,
 * holding LOCK_EX, truncates it away before appending.
 *
 * Threads of one process share one descriptor, and flock() locks belong to
 * the descriptor's open file description, so a process mutex serialises
 * this process's threads first. After fork() the child reopens the file on
 * first use, so parent and child lock against each other.
 *
 * Blocking calls (get, wait, multi_get) poll: refresh, look, sleep 1 ms,
 * doubling up to 16 ms, until the deadline.
 */
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "store/internal.h"

#define FILE_HEADER "TDISTFS1"
#define FILE_HEADER_LEN 8u
#define REC_MAGIC 0x31524454u /* "TDR1" little-endian */
#define REC_END 0x444e4554u   /* "TEND" little-endian */
#define REC_HEAD 16u
#define REC_TAIL 4u
#define POLL_MIN_MS 1
#define POLL_MAX_MS 16

enum { REC_SET = 1, REC_APPEND = 2, REC_DELETE = 3 };

typedef struct file_store {
    tdist_store_t base;
    pthread_mutex_t mu; /* serialises this process's threads; held around flock */
    char *path;
    int fd;
    pid_t pid;           /* the process that opened fd */
    uint64_t offset;     /* end of the last complete record applied to view */
    uint64_t tail;       /* bytes after offset that are not a complete record */
    tdist_store_t *view; /* hash store: the map as of offset */
} file_store_t;

/* ------------------------------------------------------------ encoding */

static void put_u32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
    p[2] = (unsigned char)(v >> 16);
    p[3] = (unsigned char)(v >> 24);
}

static uint32_t get_u32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static size_t rec_size(size_t klen, size_t vlen) { return REC_HEAD + klen + vlen + REC_TAIL; }

/* Encode one record at p; returns the bytes written (rec_size). */
static size_t encode(unsigned char *p, int type, const char *key, const void *value, size_t vlen)
{
    size_t klen = strlen(key);
    put_u32(p, REC_MAGIC);
    p[4] = (unsigned char)type;
    p[5] = p[6] = p[7] = 0;
    put_u32(p + 8, (uint32_t)klen);
    put_u32(p + 12, (uint32_t)vlen);
    memcpy(p + REC_HEAD, key, klen);
    if (vlen) memcpy(p + REC_HEAD + klen, value, vlen);
    put_u32(p + REC_HEAD + klen + vlen, REC_END);
    return rec_size(klen, vlen);
}

/* ------------------------------------------------------------ file access */

static tdist_status_t lock_file(file_store_t *fs, int op)
{
    int rc;
    TDIST_SYSCALL(rc, flock(fs->fd, op));
    if (rc != 0) return tdist__error_errno(errno, "file store %s: flock", fs->path);
    return TDIST_OK;
}

static void unlock_file(file_store_t *fs)
{
    int rc;
    TDIST_SYSCALL(rc, flock(fs->fd, LOCK_UN));
    (void)rc;
}

static tdist_status_t read_at(file_store_t *fs, void *buf, size_t len, uint64_t off)
{
    unsigned char *p = buf;
    size_t done = 0;
    while (done < len) {
        ssize_t n;
        TDIST_SYSCALL(n, pread(fs->fd, p + done, len - done, (off_t)(off + done)));
        if (n < 0)
            return tdist__error_errno(errno, "file store %s: read at offset %" PRIu64, fs->path,
                                      off + done);
        if (n == 0)
            return tdist__error(TDIST_ERR_SYSTEM,
                                "file store %s: file shrank while locked (offset %" PRIu64 ")",
                                fs->path, off + done);
        done += (size_t)n;
    }
    return TDIST_OK;
}

/* After fork() the child shares the parent's open file description, and
 * with it the flock; give the child its own. Caller holds mu. */
static tdist_status_t ensure_own_fd(file_store_t *fs)
{
    pid_t me = getpid();
    if (me == fs->pid) return TDIST_OK;
    int fd;
    TDIST_SYSCALL(fd, open(fs->path, O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0600));
    if (fd < 0) return tdist__error_errno(errno, "file store %s: reopen after fork", fs->path);
    close(fs->fd);
    fs->fd = fd;
    fs->pid = me;
    return TDIST_OK;
}

/* Apply one decoded record to the view. */
static tdist_status_t apply(file_store_t *fs, int type, const char *key, const void *value,
                            size_t vlen)
{
    tdist_store_t *v = fs->view;
    bool deleted;
    switch (type) {
    case REC_SET: return v->ops->set(v, key, value, vlen);
    case REC_APPEND: return v->ops->append(v, key, value, vlen);
    default: return v->ops->delete_key(v, key, &deleted);
    }
}

/* Forget the view and read the log from the start (the file was truncated
 * or replaced under us). */
static tdist_status_t reset_view(file_store_t *fs)
{
    tdist_store_t *fresh;
    TDIST_CHECK(tdist_store_hash_create(NULL, &fresh));
    tdist_store_destroy(fs->view);
    fs->view = fresh;
    fs->offset = FILE_HEADER_LEN;
    fs->tail = 0;
    return TDIST_OK;
}

/* Read every complete record after offset into the view. Caller holds mu
 * and a lock on the file. */
static tdist_status_t refresh(file_store_t *fs)
{
    struct stat sb;
    if (fstat(fs->fd, &sb) != 0) return tdist__error_errno(errno, "file store %s: fstat", fs->path);
    uint64_t size = (uint64_t)sb.st_size;
    if (size < fs->offset) {
        TDIST_LOGW("file store %s: file shrank from %" PRIu64 " to %" PRIu64
                   " bytes; re-reading it",
                   fs->path, fs->offset, size);
        TDIST_CHECK(reset_view(fs));
        if (size < FILE_HEADER_LEN)
            return tdist__error(TDIST_ERR_SYSTEM,
                                "file store %s: the file was truncated to %" PRIu64
                                " bytes by someone else; its keys are gone",
                                fs->path, size);
    }
    if (size == fs->offset) {
        fs->tail = 0;
        return TDIST_OK;
    }
    size_t len = (size_t)(size - fs->offset);
    unsigned char *buf = malloc(len);
    if (!buf)
        return tdist__error(TDIST_ERR_NO_MEMORY,
                            "file store %s: out of memory reading %zu bytes of log", fs->path, len);
    tdist_status_t st = read_at(fs, buf, len, fs->offset);
    size_t pos = 0;
    while (st == TDIST_OK && len - pos >= REC_HEAD) {
        const unsigned char *r = buf + pos;
        uint32_t klen = get_u32(r + 8), vlen = get_u32(r + 12);
        int type = r[4];
        if (get_u32(r) != REC_MAGIC || type < REC_SET || type > REC_DELETE || klen == 0 ||
            klen > TDIST_STORE_MAX_KEY || vlen > TDIST_STORE_MAX_VALUE)
            break; /* damaged: the log ends here */
        size_t rs = rec_size(klen, vlen);
        if (len - pos < rs) break; /* cut short */
        if (get_u32(r + REC_HEAD + klen + vlen) != REC_END) break;
        char *key = malloc((size_t)klen + 1);
        if (!key) {
            st = tdist__error(TDIST_ERR_NO_MEMORY, "file store %s: out of memory", fs->path);
            break;
        }
        memcpy(key, r + REC_HEAD, klen);
        key[klen] = '\0';
        if (strlen(key) != klen) { /* a NUL inside the key: damaged */
            free(key);
            break;
        }
        st = apply(fs, type, key, r + REC_HEAD + klen, vlen);
        free(key);
        if (st != TDIST_OK) break;
        pos += rs;
    }
    free(buf);
    fs->offset += pos;
    fs->tail = len - pos;
    if (st == TDIST_OK && fs->tail)
        TDIST_LOGD("file store %s: ignoring %" PRIu64
                   " bytes of incomplete record at offset %" PRIu64,
                   fs->path, fs->tail, fs->offset);
    return st;
}

/* Append len bytes of encoded records and read them back into the view.
 * Caller holds mu and LOCK_EX, and has refreshed. */
static tdist_status_t write_records(file_store_t *fs, const unsigned char *buf, size_t len)
{
    int rc;
    if (fs->tail) {
        TDIST_LOGW("file store %s: truncating %" PRIu64
                   " bytes of incomplete record at offset %" PRIu64,
                   fs->path, fs->tail, fs->offset);
        TDIST_SYSCALL(rc, ftruncate(fs->fd, (off_t)fs->offset));
        if (rc != 0)
            return tdist__error_errno(errno, "file store %s: truncate to %" PRIu64, fs->path,
                                      fs->offset);
        fs->tail = 0;
    }
    size_t done = 0;
    while (done < len) {
        ssize_t n;
        TDIST_SYSCALL(n, write(fs->fd, buf + done, len - done));
        if (n < 0) {
            int err = errno;
            /* leave no half record behind */
            TDIST_SYSCALL(rc, ftruncate(fs->fd, (off_t)fs->offset));
            return tdist__error_errno(err, "file store %s: write of %zu bytes", fs->path, len);
        }
        done += (size_t)n;
    }
    return refresh(fs);
}

/* Lock mu and the file (op: LOCK_SH or LOCK_EX) and refresh the view.
 * On success the caller must call end_op(). */
static tdist_status_t begin_op(file_store_t *fs, int op)
{
    pthread_mutex_lock(&fs->mu);
    tdist_status_t st = ensure_own_fd(fs);
    if (st == TDIST_OK) st = lock_file(fs, op);
    if (st != TDIST_OK) {
        pthread_mutex_unlock(&fs->mu);
        return st;
    }
    st = refresh(fs);
    if (st != TDIST_OK) {
        unlock_file(fs);
        pthread_mutex_unlock(&fs->mu);
    }
    return st;
}

static void end_op(file_store_t *fs)
{
    unlock_file(fs);
    pthread_mutex_unlock(&fs->mu);
}

/* Append one record (begin_op(LOCK_EX) held). */
static tdist_status_t write_one(file_store_t *fs, int type, const char *key, const void *value,
                                size_t vlen)
{
    size_t rs = rec_size(strlen(key), vlen);
    unsigned char *buf = malloc(rs);
    if (!buf)
        return tdist__error(TDIST_ERR_NO_MEMORY,
                            "file store %s: out of memory for a %zu-byte record", fs->path, rs);
    encode(buf, type, key, value, vlen);
    tdist_status_t st = write_records(fs, buf, rs);
    free(buf);
    return st;
}

static bool view_has(file_store_t *fs, const char *key)
{
    bool exists = false;
    fs->view->ops->check(fs->view, &key, 1, &exists);
    return exists;
}

/* Copy key's value out of the view (the key must exist). */
static tdist_status_t view_get(file_store_t *fs, const char *key, void **value, size_t *len)
{
    return fs->view->ops->get(fs->view, key, 0, value, len);
}

/* ------------------------------------------------------------ operations */

static void file_destroy(tdist_store_t *s)
{
    file_store_t *fs = (file_store_t *)s;
    if (fs->fd >= 0) close(fs->fd);
    tdist_store_destroy(fs->view);
    pthread_mutex_destroy(&fs->mu);
    free(fs->path);
    free(fs);
}

static tdist_status_t file_set(tdist_store_t *s, const char *key, const void *value, size_t len)
{
    file_store_t *fs = (file_store_t *)s;
    TDIST_CHECK(begin_op(fs, LOCK_EX));
    tdist_status_t st = write_one(fs, REC_SET, key, value, len);
    end_op(fs);
    return st;
}

/* Poll until all n keys are in the view or timeout_ms passes; then, with
 * the locks held (begin_op done), return TDIST_OK — the caller reads the
 * values and calls end_op(). what names the operation in the error. */
static tdist_status_t poll_keys(file_store_t *fs, const char *const *keys, size_t n,
                                int64_t timeout_ms, const char *what)
{
    uint64_t start = tdist__now_ns();
    /* a timeout beyond the ns clock's range (about 584 years) is forever */
    uint64_t deadline = timeout_ms < 0 || (uint64_t)timeout_ms > (UINT64_MAX - start) / 1000000ull
                            ? UINT64_MAX
                            : start + (uint64_t)timeout_ms * 1000000ull;
    int sleep_ms = POLL_MIN_MS;
    for (;;) {
        TDIST_CHECK(begin_op(fs, LOCK_SH));
        bool all = false;
        fs->view->ops->check(fs->view, keys, n, &all);
        if (all) return TDIST_OK;
        uint64_t now = tdist__now_ns();
        if (now >= deadline) {
            size_t miss = 0;
            while (miss < n && view_has(fs, keys[miss])) miss++;
            end_op(fs);
            return tdist__error(TDIST_ERR_TIMEOUT,
                                "file store %s: %s timed out after %" PRId64
                                " ms waiting for key \"%.200s\"",
                                fs->path, what, timeout_ms, keys[miss < n ? miss : 0]);
        }
        end_op(fs);
        uint64_t left_ms = (deadline - now + 999999ull) / 1000000ull;
        tdist__sleep_ms(left_ms < (uint64_t)sleep_ms ? (int)left_ms : sleep_ms);
        sleep_ms = TDIST_MIN(sleep_ms * 2, POLL_MAX_MS);
    }
}

static tdist_status_t file_get(tdist_store_t *s, const char *key, int64_t timeout_ms, void **value,
                               size_t *len)
{
    file_store_t *fs = (file_store_t *)s;
    TDIST_CHECK(poll_keys(fs, &key, 1, timeout_ms, "get"));
    tdist_status_t st = view_get(fs, key, value, len);
    end_op(fs);
    return st;
}

static tdist_status_t file_add(tdist_store_t *s, const char *key, int64_t delta, int64_t *result)
{
    file_store_t *fs = (file_store_t *)s;
    TDIST_CHECK(begin_op(fs, LOCK_EX));
    tdist_status_t st = TDIST_OK;
    int64_t cur = 0, next = 0;
    if (view_has(fs, key)) {
        void *v;
        size_t vlen;
        st = view_get(fs, key, &v, &vlen);
        if (st == TDIST_OK) {
            if (tdist__store_parse_counter(v, vlen, &cur) != 0)
                st = tdist__error(TDIST_ERR_INVALID_ARG,
                                  "file store %s: add to key \"%.200s\": its value (%zu bytes) is "
                                  "not a decimal integer",
                                  fs->path, key, vlen);
            free(v);
        }
    }
    if (st == TDIST_OK && __builtin_add_overflow(cur, delta, &next))
        st = tdist__error(TDIST_ERR_INVALID_ARG,
                          "file store %s: add %" PRId64 " to key \"%.200s\" holding %" PRId64
                          " overflows int64",
                          fs->path, delta, key, cur);
    if (st == TDIST_OK && delta == 0 && view_has(fs, key)) {
        *result = next; /* a read (rendezvous polls this way): nothing to log */
    } else if (st == TDIST_OK) {
        char buf[32];
        int n = snprintf(buf, sizeof buf, "%" PRId64, next);
        st = write_one(fs, REC_SET, key, buf, (size_t)n);
        if (st == TDIST_OK) *result = next;
    }
    end_op(fs);
    return st;
}

static tdist_status_t file_compare_set(tdist_store_t *s, const char *key, const void *expected,
                                       size_t expected_len, const void *desired, size_t desired_len,
                                       void **current, size_t *current_len)
{
    file_store_t *fs = (file_store_t *)s;
    TDIST_CHECK(begin_op(fs, LOCK_EX));
    tdist_status_t st = TDIST_OK;
    void *old = NULL;
    size_t old_len = 0;
    bool exists = view_has(fs, key);
    if (exists) st = view_get(fs, key, &old, &old_len);
    void *out = NULL;
    size_t out_len = 0;
    if (st == TDIST_OK) {
        bool swap = exists ? old_len == expected_len &&
                                 (expected_len == 0 || memcmp(old, expected, expected_len) == 0)
                           : expected_len == 0;
        /* the result first, so that running out of memory changes nothing */
        if (swap) {
            out = tdist__store_dup(desired, desired_len);
            out_len = desired_len;
        } else if (exists) {
            out = old;
            out_len = old_len;
            old = NULL;
        } else {
            out = tdist__store_dup(expected, expected_len);
            out_len = expected_len;
        }
        if (!out)
            st = tdist__error(TDIST_ERR_NO_MEMORY,
                              "file store %s: out of memory in compare_set of key \"%.200s\"",
                              fs->path, key);
        else if (swap)
            st = write_one(fs, REC_SET, key, desired, desired_len);
    }
    end_op(fs);
    free(old);
    if (st != TDIST_OK) {
        free(out);
        return st;
    }
    *current = out;
    *current_len = out_len;
    return TDIST_OK;
}

static tdist_status_t file_wait(tdist_store_t *s, const char *const *keys, size_t n,
                                int64_t timeout_ms)
{
    file_store_t *fs = (file_store_t *)s;
    TDIST_CHECK(poll_keys(fs, keys, n, timeout_ms, "wait"));
    end_op(fs);
    return TDIST_OK;
}

static tdist_status_t file_check(tdist_store_t *s, const char *const *keys, size_t n,
                                 bool *all_exist)
{
    file_store_t *fs = (file_store_t *)s;
    TDIST_CHECK(begin_op(fs, LOCK_SH));
    tdist_status_t st = fs->view->ops->check(fs->view, keys, n, all_exist);
    end_op(fs);
    return st;
}

static tdist_status_t file_delete_key(tdist_store_t *s, const char *key, bool *deleted)
{
    file_store_t *fs = (file_store_t *)s;
    TDIST_CHECK(begin_op(fs, LOCK_EX));
    bool exists = view_has(fs, key);
    tdist_status_t st = exists ? write_one(fs, REC_DELETE, key, NULL, 0) : TDIST_OK;
    end_op(fs);
    if (st == TDIST_OK) *deleted = exists;
    return st;
}

static tdist_status_t file_num_keys(tdist_store_t *s, int64_t *count)
{
    file_store_t *fs = (file_store_t *)s;
    TDIST_CHECK(begin_op(fs, LOCK_SH));
    tdist_status_t st = fs->view->ops->num_keys(fs->view, count);
    end_op(fs);
    return st;
}

static tdist_status_t file_append(tdist_store_t *s, const char *key, const void *value, size_t len)
{
    file_store_t *fs = (file_store_t *)s;
    TDIST_CHECK(begin_op(fs, LOCK_EX));
    tdist_status_t st = TDIST_OK;
    if (view_has(fs, key)) {
        void *old;
        size_t old_len;
        st = view_get(fs, key, &old, &old_len);
        if (st == TDIST_OK) {
            free(old);
            if (old_len + len > TDIST_STORE_MAX_VALUE)
                st =
                    tdist__error(TDIST_ERR_INVALID_ARG,
                                 "file store %s: append of %zu bytes to key \"%.200s\" (%zu bytes) "
                                 "exceeds the cap of %u",
                                 fs->path, len, key, old_len, TDIST_STORE_MAX_VALUE);
        }
    }
    if (st == TDIST_OK) st = write_one(fs, REC_APPEND, key, value, len);
    end_op(fs);
    return st;
}

static tdist_status_t file_multi_get(tdist_store_t *s, const char *const *keys, size_t n,
                                     int64_t timeout_ms, void **values, size_t *lens)
{
    file_store_t *fs = (file_store_t *)s;
    TDIST_CHECK(poll_keys(fs, keys, n, timeout_ms, "multi_get"));
    tdist_status_t st = fs->view->ops->multi_get(fs->view, keys, n, 0, values, lens);
    end_op(fs);
    return st;
}

static tdist_status_t file_multi_set(tdist_store_t *s, const char *const *keys,
                                     const void *const *values, const size_t *lens, size_t n)
{
    file_store_t *fs = (file_store_t *)s;
    size_t total = 0;
    for (size_t i = 0; i < n; i++) total += rec_size(strlen(keys[i]), lens[i]);
    unsigned char *buf = malloc(total);
    if (!buf)
        return tdist__error(TDIST_ERR_NO_MEMORY,
                            "file store %s: out of memory for %zu bytes of records", fs->path,
                            total);
    size_t pos = 0;
    for (size_t i = 0; i < n; i++) pos += encode(buf + pos, REC_SET, keys[i], values[i], lens[i]);
    tdist_status_t st = begin_op(fs, LOCK_EX);
    if (st == TDIST_OK) {
        st = write_records(fs, buf, total);
        end_op(fs);
    }
    free(buf);
    return st;
}

static const tdist_store_ops_t file_ops = {
    .kind = "file",
    .destroy = file_destroy,
    .set = file_set,
    .get = file_get,
    .add = file_add,
    .compare_set = file_compare_set,
    .wait = file_wait,
    .check = file_check,
    .delete_key = file_delete_key,
    .num_keys = file_num_keys,
    .append = file_append,
    .multi_get = file_multi_get,
    .multi_set = file_multi_set,
};

/* ------------------------------------------------------------ creation */

/* Write the file header into an empty file, or check an existing one.
 * Caller holds LOCK_EX. */
static tdist_status_t init_header(file_store_t *fs)
{
    struct stat sb;
    if (fstat(fs->fd, &sb) != 0) return tdist__error_errno(errno, "file store %s: fstat", fs->path);
    size_t have = (size_t)TDIST_MIN((uint64_t)sb.st_size, (uint64_t)FILE_HEADER_LEN);
    char head[FILE_HEADER_LEN];
    TDIST_CHECK(read_at(fs, head, have, 0));
    if (memcmp(head, FILE_HEADER, have) != 0)
        return tdist__error(TDIST_ERR_INVALID_ARG,
                            "file store %s: the file exists and is not a tdist file store "
                            "(it does not start with \"" FILE_HEADER "\")",
                            fs->path);
    if (have == FILE_HEADER_LEN) return TDIST_OK;
    /* empty, or a header cut short by a crash: (re)write it */
    int rc;
    TDIST_SYSCALL(rc, ftruncate(fs->fd, 0));
    if (rc != 0) return tdist__error_errno(errno, "file store %s: truncate", fs->path);
    ssize_t n;
    TDIST_SYSCALL(n, write(fs->fd, FILE_HEADER, FILE_HEADER_LEN));
    if (n != (ssize_t)FILE_HEADER_LEN)
        return tdist__error_errno(n < 0 ? errno : EIO, "file store %s: write header", fs->path);
    return TDIST_OK;
}

tdist_status_t tdist_store_file_create(const char *path, const tdist_store_opts_t *opts,
                                       tdist_store_t **out)
{
    static const char fn[] = "tdist_store_file_create";
    if (!path) return tdist__error(TDIST_ERR_INVALID_ARG, "%s: path is NULL", fn);
    if (!*path) return tdist__error(TDIST_ERR_INVALID_ARG, "%s: path is empty", fn);
    if (!out) return tdist__error(TDIST_ERR_INVALID_ARG, "%s: out is NULL", fn);
    file_store_t *fs = calloc(1, sizeof *fs);
    if (!fs) return tdist__error(TDIST_ERR_NO_MEMORY, "%s: out of memory", fn);
    fs->fd = -1;
    fs->path = tdist__strdup(path);
    int rc = pthread_mutex_init(&fs->mu, NULL);
    if (rc != 0) {
        free(fs->path);
        free(fs);
        return tdist__error_errno(rc, "%s: pthread_mutex_init", fn);
    }
    tdist_status_t st =
        fs->path ? TDIST_OK : tdist__error(TDIST_ERR_NO_MEMORY, "%s: out of memory", fn);
    if (st == TDIST_OK) st = tdist_store_hash_create(NULL, &fs->view);
    if (st == TDIST_OK) {
        TDIST_SYSCALL(fs->fd, open(path, O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0600));
        if (fs->fd < 0) st = tdist__error_errno(errno, "file store %s: open", path);
    }
    fs->pid = getpid();
    fs->offset = FILE_HEADER_LEN;
    if (st == TDIST_OK) {
        tdist__store_base_init(&fs->base, &file_ops, opts);
        st = lock_file(fs, LOCK_EX);
        if (st == TDIST_OK) {
            st = init_header(fs);
            if (st == TDIST_OK) st = refresh(fs);
            unlock_file(fs);
        }
    }
    if (st != TDIST_OK) {
        file_destroy(&fs->base);
        return st;
    }
    *out = &fs->base;
    return TDIST_OK;
}
