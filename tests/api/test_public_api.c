/*
 * tests/api/test_public_api.c — every public function (core.h, store.h,
 * init.h) against bad arguments.
 *
 * The project's rule: "Every public function checks its arguments and returns
 * TDIST_ERR_INVALID_ARG with a message, never crashes. Nothing in the
 * library exits, aborts or prints on its own." For each call below we check
 *   - the status (TDIST_ERR_INVALID_ARG, or the documented one),
 *   - tdist_last_error() is non-empty and names the function or argument,
 *   - out-parameters still hold the sentinel they were given,
 *   - nothing was written to stdout or stderr (both are redirected to a
 *     file around every call; logging is off).
 * Functions documented as "NULL does nothing" and void functions given
 * NULL buffers must simply return.
 *
 * Debugging: TDIST_API_NO_CAPTURE=1 leaves stdout/stderr alone. A
 * sanitizer report raised while they are captured is copied back to the
 * real stderr before the process dies.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "harness.h"

#define NELEM(a) (sizeof(a) / sizeof((a)[0]))

/* ------------------------------------------------------------ capture */

static int cap_fd = -1;      /* file that receives fd 1 and 2 while capturing */
static int saved_out = -1;   /* the real stdout / stderr while capturing */
static int saved_err = -1;

/* Sanitizers call this after printing their report (weak: absent when
 * the build has no sanitizer). */
void __sanitizer_set_death_callback(void (*cb)(void)) __attribute__((weak));

static void capture_restore(void)
{
    if (saved_out < 0) return;
    fflush(stdout);
    fflush(stderr);
    dup2(saved_out, STDOUT_FILENO);
    dup2(saved_err, STDERR_FILENO);
    close(saved_out);
    close(saved_err);
    saved_out = saved_err = -1;
}

/* Sanitizer death: put its report where the runner can see it. */
static void capture_on_death(void)
{
    if (saved_out < 0) return;
    capture_restore();
    char buf[4096];
    ssize_t n;
    if (lseek(cap_fd, 0, SEEK_SET) != 0) return;
    while ((n = read(cap_fd, buf, sizeof buf)) > 0)
        if (write(STDERR_FILENO, buf, (size_t)n) != n) break;
}

static bool capture_enabled(void)
{
    const char *v = getenv("TDIST_API_NO_CAPTURE");
    return !(v && *v && strcmp(v, "0") != 0);
}

static void capture_begin(void)
{
    if (!capture_enabled()) return;
    if (cap_fd < 0) {
        char path[512];
        snprintf(path, sizeof path, "%s/captured-output", tdist_test_tmpdir());
        cap_fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        if (cap_fd < 0) FAIL("open %s: %s", path, strerror(errno));
        if (__sanitizer_set_death_callback) __sanitizer_set_death_callback(capture_on_death);
    }
    if (ftruncate(cap_fd, 0) != 0 || lseek(cap_fd, 0, SEEK_SET) != 0)
        FAIL("truncate capture file: %s", strerror(errno));
    fflush(stdout);
    fflush(stderr);
    saved_out = dup(STDOUT_FILENO);
    saved_err = dup(STDERR_FILENO);
    if (saved_out < 0 || saved_err < 0) FAIL("dup: %s", strerror(errno));
    if (dup2(cap_fd, STDOUT_FILENO) < 0 || dup2(cap_fd, STDERR_FILENO) < 0)
        FAIL("dup2: %s", strerror(errno));
}

/* Stop capturing; copy what was written (NUL-terminated) into buf and
 * return its length. */
static size_t capture_end(char *buf, size_t cap)
{
    buf[0] = '\0';
    if (saved_out < 0) return 0;
    capture_restore();
    struct stat sb;
    if (fstat(cap_fd, &sb) != 0) FAIL("fstat: %s", strerror(errno));
    if (sb.st_size == 0) return 0;
    if (lseek(cap_fd, 0, SEEK_SET) != 0) FAIL("lseek: %s", strerror(errno));
    ssize_t n = read(cap_fd, buf, cap - 1);
    buf[n > 0 ? n : 0] = '\0';
    return (size_t)sb.st_size;
}

static void capture_expect_silent(const char *what, const char *file, int line)
{
    char out[1024];
    size_t n = capture_end(out, sizeof out);
    if (n > 0) tdist_test_fail(file, line, "%s printed %zu bytes: \"%s\"", what, n, out);
}

/* Run stmt with stdout/stderr captured; fail if it printed anything. */
#define QUIET(stmt)                                                            \
    do {                                                                       \
        capture_begin();                                                       \
        stmt;                                                                  \
        capture_expect_silent(#stmt, __FILE__, __LINE__);                      \
    } while (0)

/* Call expr quietly; it must return one of want1/want2 and, when that is an
 * error, leave a message that contains needle. */
#define EXPECT_ST2(expr, want1, want2, needle)                                 \
    do {                                                                       \
        tdist_clear_error();                                                   \
        capture_begin();                                                       \
        tdist_status_t st_ = (expr);                                           \
        capture_expect_silent(#expr, __FILE__, __LINE__);                      \
        if (st_ != (want1) && st_ != (want2))                                  \
            FAIL("%s returned %s, expected %s (last error: \"%s\")", #expr,    \
                 tdist_status_str(st_), tdist_status_str(want1), tdist_last_error()); \
        if (st_ != TDIST_OK) {                                                 \
            if (tdist_last_error()[0] == '\0')                                 \
                FAIL("%s returned %s with an empty tdist_last_error()", #expr, \
                     tdist_status_str(st_));                                   \
            if (!strstr(tdist_last_error(), (needle)))                         \
                FAIL("%s: message \"%s\" does not mention \"%s\"", #expr,      \
                     tdist_last_error(), (needle));                            \
        }                                                                      \
    } while (0)

#define EXPECT_ST(expr, want, needle) EXPECT_ST2(expr, want, want, needle)
#define EXPECT_INVALID(expr, needle) EXPECT_ST(expr, TDIST_ERR_INVALID_ARG, needle)
#define EXPECT_OK(expr) EXPECT_ST(expr, TDIST_OK, "")

/* Out-pointer sentinels: a failing call must leave them as they were. */
static char sentinel_obj;
#define SENTINEL ((void *)&sentinel_obj)
#define SENTINEL_LEN ((size_t)0x5e5e5e5e)
#define SENTINEL_I64 ((int64_t)0x5e5e5e5e5e5e5e5eLL)

/* Quiet, deterministic start: logging off, no tdist variables inherited. */
static void api_setup(void)
{
    static const char *const vars[] = {
        "TDIST_LOG",        "TDIST_TIMEOUT_MS",   "TDIST_STORE_TOKEN", "TDIST_LAUNCHER_STORE",
        "TDIST_STORE_LISTEN_FD", "TDIST_RESTART_COUNT", "TDIST_HOSTNAME", "MASTER_ADDR",
        "MASTER_PORT",      "RANK",               "WORLD_SIZE",        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE", "TDIST_JOB_SECRET",
    };
    for (size_t i = 0; i < NELEM(vars); i++) unsetenv(vars[i]);
    if (tdist_log_level() != TDIST_LOG_OFF) tdist_log_set_level(TDIST_LOG_OFF);
    ASSERT_EQ(tdist_log_level(), TDIST_LOG_OFF);
}

/* A malloc'd string of n copies of c. */
static char *repeat(char c, size_t n)
{
    char *s = malloc(n + 1);
    ASSERT_TRUE(s != NULL);
    memset(s, c, n);
    s[n] = '\0';
    return s;
}

/* A TCP socket bound to 127.0.0.1:0 and not listening: connecting to its
 * port is refused, and nobody else can take the port while it is open. */
static int closed_port_socket(uint16_t *port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ASSERT_TRUE(fd >= 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    socklen_t sl = sizeof a;
    ASSERT_EQ(getsockname(fd, (struct sockaddr *)&a, &sl), 0);
    *port = ntohs(a.sin_port);
    ASSERT_NE(*port, 0);
    return fd;
}

static int listening_socket(uint16_t *port)
{
    int fd = closed_port_socket(port);
    ASSERT_EQ(listen(fd, 16), 0);
    return fd;
}

static bool fd_is_open(int fd) { return fcntl(fd, F_GETFD) != -1; }

/* A descriptor number that is closed and stays closed (a just-closed
 * number would be reused by the capture's dup()). */
static int never_open_fd(void)
{
    int fd = 1 << 30;
    ASSERT_FALSE(fd_is_open(fd));
    return fd;
}

/* ================================================================= core */

TEST(api_core_names_and_levels, 10)
{
    api_setup();
    const char *s = NULL;
    QUIET(s = tdist_version());
    ASSERT_STREQ(s, TDIST_VERSION_STRING);

    int bad_status[] = {-17, -999, 2, 1000, INT_MIN, INT_MAX};
    for (size_t i = 0; i < NELEM(bad_status); i++) {
        QUIET(s = tdist_status_str((tdist_status_t)bad_status[i]));
        ASSERT_STREQ(s, "TDIST_UNKNOWN_STATUS");
    }
    QUIET(tdist_clear_error());
    QUIET(s = tdist_last_error());
    ASSERT_STREQ(s, "");

    int bad_enum[] = {-1, TDIST_DTYPE_COUNT, 99, INT_MIN, INT_MAX};
    for (size_t i = 0; i < NELEM(bad_enum); i++) {
        tdist_dtype_t dt = (tdist_dtype_t)bad_enum[i];
        size_t sz = 1;
        int fl = 1;
        QUIET(sz = tdist_dtype_size(dt));
        ASSERT_EQ(sz, 0);
        QUIET(s = tdist_dtype_name(dt));
        ASSERT_STREQ(s, "invalid");
        QUIET(fl = tdist_dtype_is_float(dt));
        ASSERT_EQ(fl, 0);
    }
    int bad_op[] = {-1, TDIST_REDOP_COUNT, 99, INT_MIN, INT_MAX};
    for (size_t i = 0; i < NELEM(bad_op); i++) {
        QUIET(s = tdist_redop_name((tdist_redop_t)bad_op[i]));
        ASSERT_STREQ(s, "invalid");
    }

    /* out-of-range log levels are clamped, never stored as garbage */
    QUIET(tdist_log_set_level((tdist_log_level_t)-5));
    ASSERT_EQ(tdist_log_level(), TDIST_LOG_OFF);
    QUIET(tdist_log_set_level((tdist_log_level_t)99));
    ASSERT_EQ(tdist_log_level(), TDIST_LOG_TRACE); /* the highest level */
    tdist_log_set_level(TDIST_LOG_OFF);
    ASSERT_EQ(tdist_log_level(), TDIST_LOG_OFF);

    /* the scalar conversions are total: every input has an answer */
    uint16_t h = 0;
    float f = 0;
    QUIET(h = tdist_f32_to_f16(NAN));
    ASSERT_TRUE((h & 0x7c00u) == 0x7c00u && (h & 0x03ffu) != 0);
    QUIET(h = tdist_f32_to_bf16(-INFINITY));
    ASSERT_EQ(h, 0xff80u);
    QUIET(f = tdist_f16_to_f32(0xffffu));
    ASSERT_TRUE(isnan(f));
    QUIET(f = tdist_bf16_to_f32(0x7fc1u));
    ASSERT_TRUE(isnan(f));
}

TEST(api_core_bulk_conversions_null, 10)
{
    api_setup();
    float f[4] = {1, 2, 3, 4};
    uint16_t h[4] = {0x1111, 0x2222, 0x3333, 0x4444};
    const float f_orig[4] = {1, 2, 3, 4};
    const uint16_t h_orig[4] = {0x1111, 0x2222, 0x3333, 0x4444};
    size_t counts[] = {1, 4, 1000, SIZE_MAX / 4, SIZE_MAX};
    for (size_t i = 0; i < NELEM(counts); i++) {
        size_t n = counts[i];
        /* NULL dst, NULL src, both NULL: nothing happens, nothing printed */
        QUIET(tdist_f32_to_f16_n(NULL, f, n));
        QUIET(tdist_f32_to_f16_n(h, NULL, n));
        QUIET(tdist_f32_to_f16_n(NULL, NULL, n));
        QUIET(tdist_f16_to_f32_n(NULL, h, n));
        QUIET(tdist_f16_to_f32_n(f, NULL, n));
        QUIET(tdist_f16_to_f32_n(NULL, NULL, n));
        QUIET(tdist_f32_to_bf16_n(NULL, f, n));
        QUIET(tdist_f32_to_bf16_n(h, NULL, n));
        QUIET(tdist_f32_to_bf16_n(NULL, NULL, n));
        QUIET(tdist_bf16_to_f32_n(NULL, h, n));
        QUIET(tdist_bf16_to_f32_n(f, NULL, n));
        QUIET(tdist_bf16_to_f32_n(NULL, NULL, n));
        ASSERT_MEMEQ(f, f_orig, sizeof f);
        ASSERT_MEMEQ(h, h_orig, sizeof h);
    }
    /* n == 0 touches nothing, even with NULL buffers */
    QUIET(tdist_f32_to_f16_n(NULL, NULL, 0));
    QUIET(tdist_f16_to_f32_n(f, h, 0));
    QUIET(tdist_f32_to_bf16_n(h, f, 0));
    QUIET(tdist_bf16_to_f32_n(NULL, NULL, 0));
    ASSERT_MEMEQ(f, f_orig, sizeof f);
    ASSERT_MEMEQ(h, h_orig, sizeof h);

    /* With logging switched on, the ignored NULL is reported through the
     * log (the only channel the library may write to). */
    tdist_log_set_level(TDIST_LOG_WARN);
    char out[1024];
    capture_begin();
    tdist_f32_to_f16_n(NULL, f, 4);
    size_t n = capture_end(out, sizeof out);
    tdist_log_set_level(TDIST_LOG_OFF);
    if (capture_enabled()) {
        ASSERT_TRUE(n > 0);
        ASSERT_CONTAINS(out, "tdist_f32_to_f16_n");
        ASSERT_CONTAINS(out, "[tdist ");
    }
}

TEST(api_core_reduce_bad_args, 10)
{
    api_setup();
    float d[8], a[8], b[8], orig[8];
    for (int i = 0; i < 8; i++) {
        a[i] = (float)i;
        b[i] = (float)(10 * i);
        orig[i] = -7.5f - (float)i;
    }
#define RESET_D() memcpy(d, orig, sizeof d)
#define D_UNCHANGED() ASSERT_MEMEQ(d, orig, sizeof d)

    /* tdist_redop_check */
    int bad_op[] = {-1, TDIST_REDOP_COUNT, 99, INT_MIN};
    int bad_dt[] = {-1, TDIST_DTYPE_COUNT, 99, INT_MAX};
    for (size_t i = 0; i < NELEM(bad_op); i++)
        EXPECT_INVALID(tdist_redop_check((tdist_redop_t)bad_op[i], TDIST_F32), "reduce op");
    for (size_t i = 0; i < NELEM(bad_dt); i++)
        EXPECT_INVALID(tdist_redop_check(TDIST_SUM, (tdist_dtype_t)bad_dt[i]), "invalid dtype");
    EXPECT_INVALID(tdist_redop_check(TDIST_BXOR, TDIST_BF16), "integer dtypes only");

    /* tdist_reduce */
    for (size_t i = 0; i < NELEM(bad_op); i++) {
        RESET_D();
        EXPECT_INVALID(tdist_reduce(d, a, b, 8, TDIST_F32, (tdist_redop_t)bad_op[i]),
                       "invalid reduce op");
        D_UNCHANGED();
    }
    for (size_t i = 0; i < NELEM(bad_dt); i++) {
        RESET_D();
        EXPECT_INVALID(tdist_reduce(d, a, b, 8, (tdist_dtype_t)bad_dt[i], TDIST_SUM), "invalid dtype");
        D_UNCHANGED();
    }
    RESET_D();
    EXPECT_INVALID(tdist_reduce(d, a, b, 8, TDIST_F32, TDIST_BAND), "integer dtypes only");
    D_UNCHANGED();
    EXPECT_INVALID(tdist_reduce(NULL, a, b, 8, TDIST_F32, TDIST_SUM), "tdist_reduce");
    EXPECT_INVALID(tdist_reduce(d, NULL, b, 8, TDIST_F32, TDIST_SUM), "NULL buffer");
    EXPECT_INVALID(tdist_reduce(d, a, NULL, 8, TDIST_F32, TDIST_SUM), "NULL buffer");
    EXPECT_INVALID(tdist_reduce(NULL, NULL, NULL, 1, TDIST_I8, TDIST_MAX), "NULL buffer");
    D_UNCHANGED();
    /* counts whose byte size overflows size_t (checked before any access) */
    EXPECT_INVALID(tdist_reduce(d, a, b, SIZE_MAX, TDIST_F32, TDIST_SUM), "overflows");
    EXPECT_INVALID(tdist_reduce(d, a, b, SIZE_MAX / 4 + 1, TDIST_F32, TDIST_SUM), "overflows");
    EXPECT_INVALID(tdist_reduce(d, a, b, SIZE_MAX / 8 + 1, TDIST_F64, TDIST_MIN), "overflows");
    EXPECT_INVALID(tdist_reduce(NULL, NULL, NULL, SIZE_MAX, TDIST_I64, TDIST_SUM), "overflows");
    D_UNCHANGED();
    /* dst partially overlapping an input */
    RESET_D();
    EXPECT_INVALID(tdist_reduce(d + 1, d, b, 4, TDIST_F32, TDIST_SUM), "overlaps");
    D_UNCHANGED();
    /* count 0 with NULL buffers is a valid no-op */
    EXPECT_OK(tdist_reduce(NULL, NULL, NULL, 0, TDIST_F32, TDIST_SUM));

    /* tdist_scale */
    for (size_t i = 0; i < NELEM(bad_dt); i++)
        EXPECT_INVALID(tdist_scale(d, 8, (tdist_dtype_t)bad_dt[i], 2.0), "tdist_scale");
    int int_dt[] = {TDIST_I8, TDIST_U8, TDIST_I32, TDIST_I64};
    for (size_t i = 0; i < NELEM(int_dt); i++)
        EXPECT_INVALID(tdist_scale(d, 2, (tdist_dtype_t)int_dt[i], 2.0), "floating dtypes only");
    EXPECT_INVALID(tdist_scale(NULL, 8, TDIST_F32, 2.0), "tdist_scale: NULL buffer");
    EXPECT_INVALID(tdist_scale(d, SIZE_MAX, TDIST_F32, 2.0), "overflows");
    EXPECT_INVALID(tdist_scale(NULL, SIZE_MAX / 2 + 1, TDIST_BF16, 2.0), "overflows");
    D_UNCHANGED();
    EXPECT_OK(tdist_scale(NULL, 0, TDIST_F32, 2.0));

    /* tdist_divide */
    int64_t bad_div[] = {0, -1, INT64_MIN};
    for (size_t i = 0; i < NELEM(bad_div); i++)
        EXPECT_INVALID(tdist_divide(d, 8, TDIST_F32, bad_div[i]), "divisor must be > 0");
    for (size_t i = 0; i < NELEM(bad_dt); i++)
        EXPECT_INVALID(tdist_divide(d, 8, (tdist_dtype_t)bad_dt[i], 2), "tdist_divide");
    EXPECT_INVALID(tdist_divide(NULL, 8, TDIST_I32, 2), "tdist_divide: NULL buffer");
    EXPECT_INVALID(tdist_divide(d, SIZE_MAX, TDIST_I32, 2), "overflows");
    EXPECT_INVALID(tdist_divide(NULL, 1, TDIST_F32, 0), "tdist_divide");
    D_UNCHANGED();
    EXPECT_OK(tdist_divide(NULL, 0, TDIST_I64, 3));

    /* tdist_fill_identity */
    for (size_t i = 0; i < NELEM(bad_op); i++)
        EXPECT_INVALID(tdist_fill_identity(d, 8, TDIST_F32, (tdist_redop_t)bad_op[i]), "reduce op");
    for (size_t i = 0; i < NELEM(bad_dt); i++)
        EXPECT_INVALID(tdist_fill_identity(d, 8, (tdist_dtype_t)bad_dt[i], TDIST_SUM), "invalid dtype");
    EXPECT_INVALID(tdist_fill_identity(d, 8, TDIST_F64, TDIST_BOR), "integer dtypes only");
    EXPECT_INVALID(tdist_fill_identity(NULL, 8, TDIST_F32, TDIST_MAX), "tdist_fill_identity: NULL buffer");
    EXPECT_INVALID(tdist_fill_identity(d, SIZE_MAX, TDIST_F32, TDIST_MIN), "overflows");
    D_UNCHANGED();
    EXPECT_OK(tdist_fill_identity(NULL, 0, TDIST_U8, TDIST_BAND));
#undef RESET_D
#undef D_UNCHANGED
}

/* ================================================================ store */

TEST(api_store_create_bad_args, 20)
{
    api_setup();
    char path[512];
    tdist_store_t *out = SENTINEL;
    tdist_store_t *hs = NULL;

    QUIET(tdist_store_opts_init(NULL));
    QUIET(tdist_store_server_opts_init(NULL));
    QUIET(tdist_store_destroy(NULL));
    QUIET(tdist_store_server_destroy(NULL));
    int64_t t = 0;
    QUIET(t = tdist_store_timeout(NULL));
    ASSERT_EQ(t, -1);
    EXPECT_INVALID(tdist_store_set_timeout(NULL, 10), "tdist_store_set_timeout: store is NULL");

    /* hash */
    EXPECT_INVALID(tdist_store_hash_create(NULL, NULL), "tdist_store_hash_create: out is NULL");

    /* file */
    snprintf(path, sizeof path, "%s/store", tdist_test_tmpdir());
    EXPECT_INVALID(tdist_store_file_create(NULL, NULL, &out), "tdist_store_file_create: path is NULL");
    EXPECT_INVALID(tdist_store_file_create("", NULL, &out), "tdist_store_file_create: path is empty");
    EXPECT_INVALID(tdist_store_file_create(path, NULL, NULL), "tdist_store_file_create: out is NULL");
    ASSERT_TRUE(out == SENTINEL);
    ASSERT_TRUE(access(path, F_OK) != 0); /* a rejected call created nothing */
    /* paths that cannot be a store: the system's error, naming the path */
    EXPECT_ST(tdist_store_file_create(tdist_test_tmpdir(), NULL, &out), TDIST_ERR_SYSTEM,
              tdist_test_tmpdir());
    snprintf(path, sizeof path, "%s/no/such/dir/store", tdist_test_tmpdir());
    EXPECT_ST(tdist_store_file_create(path, NULL, &out), TDIST_ERR_SYSTEM, "no/such/dir");
    char *longpath = repeat('p', 5000);
    longpath[0] = '/';
    EXPECT_ST(tdist_store_file_create(longpath, NULL, &out), TDIST_ERR_SYSTEM, "file store");
    free(longpath);
    snprintf(path, sizeof path, "%s/not-a-store", tdist_test_tmpdir());
    FILE *fp = fopen(path, "w");
    ASSERT_TRUE(fp != NULL);
    fputs("hello, I am someone else's file\n", fp);
    fclose(fp);
    EXPECT_INVALID(tdist_store_file_create(path, NULL, &out), "not a tdist file store");
    ASSERT_TRUE(out == SENTINEL);

    /* prefix */
    ASSERT_OK(tdist_store_hash_create(NULL, &hs));
    EXPECT_INVALID(tdist_store_prefix_create(NULL, hs, NULL, &out), "prefix is NULL");
    EXPECT_INVALID(tdist_store_prefix_create("", hs, NULL, &out), "prefix is empty");
    EXPECT_INVALID(tdist_store_prefix_create("p", NULL, NULL, &out), "base store is NULL");
    EXPECT_INVALID(tdist_store_prefix_create("p", hs, NULL, NULL), "out is NULL");
    char *longp = repeat('p', TDIST_STORE_MAX_KEY - 1);
    EXPECT_INVALID(tdist_store_prefix_create(longp, hs, NULL, &out), "too long");
    free(longp);
    longp = repeat('p', 3 * TDIST_STORE_MAX_KEY);
    EXPECT_INVALID(tdist_store_prefix_create(longp, hs, NULL, &out), "tdist_store_prefix_create");
    free(longp);
    ASSERT_TRUE(out == SENTINEL);
    tdist_store_destroy(hs);

    /* server */
    tdist_store_server_t *srv = SENTINEL;
    const char *fn = "tdist_store_server_create";
    EXPECT_INVALID(tdist_store_server_create("127.0.0.1", 0, NULL, NULL), fn);
    EXPECT_INVALID(tdist_store_server_create(NULL, 0, NULL, &srv), "host is NULL or empty");
    EXPECT_INVALID(tdist_store_server_create("", 0, NULL, &srv), "host is NULL or empty");
    tdist_store_server_opts_t so;
    struct {
        const char *what;
        int max_clients, backlog, hello;
        uint32_t max_key;
    } bad_so[] = {
        {"max_clients 0", 0, 16, 1000, 64},  {"max_clients -1", -1, 16, 1000, 64},
        {"backlog 0", 8, 0, 1000, 64},       {"backlog -3", 8, -3, 1000, 64},
        {"hello 0", 8, 16, 0, 64},           {"hello -1", 8, 16, -1, 64},
        {"max_key 0", 8, 16, 1000, 0},
    };
    for (size_t i = 0; i < NELEM(bad_so); i++) {
        tdist_store_server_opts_init(&so);
        so.max_clients = bad_so[i].max_clients;
        so.backlog = bad_so[i].backlog;
        so.hello_timeout_ms = bad_so[i].hello;
        so.max_key = bad_so[i].max_key;
        EXPECT_INVALID(tdist_store_server_create("127.0.0.1", 0, &so, &srv), fn);
    }
    char *longtok = repeat('t', 5000);
    tdist_store_server_opts_init(&so);
    so.token = longtok;
    EXPECT_INVALID(tdist_store_server_create("127.0.0.1", 0, &so, &srv), "token longer than");
    setenv("TDIST_STORE_TOKEN", longtok, 1);
    EXPECT_INVALID(tdist_store_server_create("127.0.0.1", 0, NULL, &srv), "token longer than");
    unsetenv("TDIST_STORE_TOKEN");
    /* host names glibc rejects without asking DNS (too long / bad characters) */
    char *longhost = repeat('h', 5000);
    EXPECT_INVALID(tdist_store_server_create(longhost, 0, NULL, &srv), "longer than 255 bytes");
    EXPECT_ST2(tdist_store_server_create("bad host!", 0, NULL, &srv), TDIST_ERR_INVALID_ARG,
               TDIST_ERR_CONNECTION, "bad host!");
    ASSERT_TRUE(srv == SENTINEL);
    /* port in use: ADDR_IN_USE naming host:port */
    uint16_t busy_port = 0;
    int busy = listening_socket(&busy_port);
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%u", (unsigned)busy_port);
    EXPECT_ST(tdist_store_server_create("127.0.0.1", busy_port, NULL, &srv), TDIST_ERR_ADDR_IN_USE,
              addr);
    ASSERT_TRUE(srv == SENTINEL);
    uint16_t p16 = 1;
    int nc = 1;
    QUIET(p16 = tdist_store_server_port(NULL));
    ASSERT_EQ(p16, 0);
    QUIET(nc = tdist_store_server_num_clients(NULL));
    ASSERT_EQ(nc, 0);

    /* adopt */
    fn = "tdist_store_server_adopt";
    EXPECT_INVALID(tdist_store_server_adopt(busy, NULL, NULL), "out is NULL");
    EXPECT_INVALID(tdist_store_server_adopt(-1, NULL, &srv), "listen_fd -1");
    EXPECT_INVALID(tdist_store_server_adopt(INT_MIN, NULL, &srv), fn);
    /* Descriptors that are not listening TCP sockets; the caller keeps
     * the fd. */
    int pfd[2];
    ASSERT_EQ(pipe(pfd), 0);
    EXPECT_INVALID(tdist_store_server_adopt(pfd[0], NULL, &srv), "not a socket");
    ASSERT_TRUE(fd_is_open(pfd[0]));
    int closed_fd = never_open_fd();
    EXPECT_INVALID(tdist_store_server_adopt(closed_fd, NULL, &srv), "not open");
    close(pfd[0]);
    close(pfd[1]);
    uint16_t cport = 0;
    int unlistened = closed_port_socket(&cport);
    EXPECT_INVALID(tdist_store_server_adopt(unlistened, NULL, &srv), "not a listening stream socket");
    ASSERT_TRUE(fd_is_open(unlistened));
    int udp = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    ASSERT_TRUE(udp >= 0);
    EXPECT_INVALID(tdist_store_server_adopt(udp, NULL, &srv), fn);
    ASSERT_TRUE(fd_is_open(udp));
    close(udp);
    int ux = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ASSERT_TRUE(ux >= 0);
    struct sockaddr_un ux_addr;
    memset(&ux_addr, 0, sizeof ux_addr);
    ux_addr.sun_family = AF_UNIX;
    snprintf(ux_addr.sun_path, sizeof ux_addr.sun_path, "%s/ux", tdist_test_tmpdir());
    ASSERT_EQ(bind(ux, (struct sockaddr *)&ux_addr, sizeof ux_addr), 0);
    ASSERT_EQ(listen(ux, 4), 0);
    EXPECT_INVALID(tdist_store_server_adopt(ux, NULL, &srv), "not a TCP socket");
    ASSERT_TRUE(fd_is_open(ux));
    close(ux);
    /* a good socket with bad options: refused, the caller keeps the fd */
    tdist_store_server_opts_init(&so);
    so.max_clients = 0;
    EXPECT_INVALID(tdist_store_server_adopt(busy, &so, &srv), fn);
    tdist_store_server_opts_init(&so);
    so.token = longtok;
    EXPECT_INVALID(tdist_store_server_adopt(busy, &so, &srv), "token longer than");
    ASSERT_TRUE(fd_is_open(busy));
    int acc = 0;
    socklen_t sl = sizeof acc;
    ASSERT_EQ(getsockopt(busy, SOL_SOCKET, SO_ACCEPTCONN, &acc, &sl), 0);
    ASSERT_EQ(acc, 1);
    ASSERT_TRUE(srv == SENTINEL);
    close(busy);

    /* client */
    fn = "tdist_store_tcp_connect";
    tdist_store_opts_t o;
    tdist_store_opts_init(&o);
    o.timeout_ms = 500;
    o.connect_timeout_ms = 0;
    EXPECT_INVALID(tdist_store_tcp_connect("127.0.0.1", cport, &o, NULL), "tdist_store_tcp_connect: out is NULL");
    EXPECT_INVALID(tdist_store_tcp_connect(NULL, cport, &o, &out), "host is NULL or empty");
    EXPECT_INVALID(tdist_store_tcp_connect("", cport, &o, &out), "host is NULL or empty");
    EXPECT_INVALID(tdist_store_tcp_connect("127.0.0.1", 0, &o, &out), "port is 0");
    o.token = longtok;
    EXPECT_INVALID(tdist_store_tcp_connect("127.0.0.1", cport, &o, &out), "token longer than");
    o.token = NULL;
    setenv("TDIST_STORE_TOKEN", longtok, 1);
    EXPECT_INVALID(tdist_store_tcp_connect("127.0.0.1", cport, &o, &out), "token longer than");
    unsetenv("TDIST_STORE_TOKEN");
    EXPECT_INVALID(tdist_store_tcp_connect(longhost, cport, &o, &out), "longer than 255 bytes");
    EXPECT_ST2(tdist_store_tcp_connect("bad host!", cport, &o, &out), TDIST_ERR_INVALID_ARG,
               TDIST_ERR_CONNECTION, "bad host!");
    /* nobody listens: a bounded failure naming host:port */
    snprintf(addr, sizeof addr, "127.0.0.1:%u", (unsigned)cport);
    double t0 = tdist_test_now_ms();
    EXPECT_ST2(tdist_store_tcp_connect("127.0.0.1", cport, &o, &out), TDIST_ERR_CONNECTION,
               TDIST_ERR_TIMEOUT, addr);
    o.connect_timeout_ms = 200;
    EXPECT_ST2(tdist_store_tcp_connect("127.0.0.1", cport, &o, &out), TDIST_ERR_CONNECTION,
               TDIST_ERR_TIMEOUT, addr);
    ASSERT_LE(tdist_test_now_ms() - t0, 2000 * tdist_test_timeout_mult());
    ASSERT_TRUE(out == SENTINEL);
    close(unlistened);
    free(longhost);
    free(longtok);
}

/* Every store operation with bad arguments, on one store. Nothing may
 * change: the store holds exactly the keys "num" (= "5") and "text". */
static void store_ops_bad_args(tdist_store_t *s, const char *kind)
{
    int64_t nkeys0 = -1;
    ASSERT_OK(tdist_store_num_keys(s, &nkeys0));
    char *longkey = repeat('k', TDIST_STORE_MAX_KEY + 1);
    char *hugekey = repeat('k', 3 * TDIST_STORE_MAX_KEY);
    const char *bad_keys[] = {NULL, "", longkey, hugekey};
    const char *bad_key_msg[] = {"key is NULL", "key is empty", "key longer than", "key longer than"};
    const char v[] = "value";
    size_t bad_len[] = {(size_t)TDIST_STORE_MAX_VALUE + 1, SIZE_MAX / 2, SIZE_MAX};
    void *val = SENTINEL;
    size_t len = SENTINEL_LEN;
    int64_t res = SENTINEL_I64;
    bool flag = true;
    void *vals[2] = {SENTINEL, SENTINEL};
    size_t lens[2] = {SENTINEL_LEN, SENTINEL_LEN};
    const void *setvals[2] = {v, v};
    size_t setlens[2] = {1, 1};
    const char *good2[2] = {"num", "text"};
    const char *nullkeys[2] = {"num", NULL};
#define OUTS_UNCHANGED()                                                       \
    do {                                                                       \
        ASSERT_TRUE(val == SENTINEL);                                          \
        ASSERT_EQ(len, SENTINEL_LEN);                                          \
        ASSERT_EQ(res, SENTINEL_I64);                                          \
        ASSERT_TRUE(vals[0] == SENTINEL && vals[1] == SENTINEL);               \
        ASSERT_EQ(lens[0], SENTINEL_LEN);                                      \
        ASSERT_EQ(lens[1], SENTINEL_LEN);                                      \
    } while (0)

    /* a NULL store, for every operation */
    EXPECT_INVALID(tdist_store_set(NULL, "k", v, 1), "tdist_store_set: store is NULL");
    EXPECT_INVALID(tdist_store_get(NULL, "num", &val, &len), "tdist_store_get: store is NULL");
    EXPECT_INVALID(tdist_store_add(NULL, "num", 1, &res), "tdist_store_add: store is NULL");
    EXPECT_INVALID(tdist_store_compare_set(NULL, "num", NULL, 0, v, 1, &val, &len),
                   "tdist_store_compare_set: store is NULL");
    EXPECT_INVALID(tdist_store_wait(NULL, good2, 2, 10), "tdist_store_wait: store is NULL");
    EXPECT_INVALID(tdist_store_check(NULL, good2, 2, &flag), "tdist_store_check: store is NULL");
    EXPECT_INVALID(tdist_store_delete_key(NULL, "num", &flag), "tdist_store_delete_key: store is NULL");
    EXPECT_INVALID(tdist_store_num_keys(NULL, &res), "tdist_store_num_keys: store is NULL");
    EXPECT_INVALID(tdist_store_append(NULL, "text", v, 1), "tdist_store_append: store is NULL");
    EXPECT_INVALID(tdist_store_multi_get(NULL, good2, 2, vals, lens), "tdist_store_multi_get: store is NULL");
    EXPECT_INVALID(tdist_store_multi_set(NULL, good2, setvals, setlens, 2),
                   "tdist_store_multi_set: store is NULL");
    ASSERT_TRUE(flag);
    OUTS_UNCHANGED();

    /* bad keys, for every operation that takes one */
    for (size_t i = 0; i < NELEM(bad_keys); i++) {
        const char *k = bad_keys[i], *m = bad_key_msg[i];
        const char *ks[2] = {"num", k};
        EXPECT_INVALID(tdist_store_set(s, k, v, 1), m);
        EXPECT_INVALID(tdist_store_get(s, k, &val, &len), m);
        EXPECT_INVALID(tdist_store_add(s, k, 1, &res), m);
        EXPECT_INVALID(tdist_store_compare_set(s, k, NULL, 0, v, 1, &val, &len), m);
        EXPECT_INVALID(tdist_store_wait(s, ks, 2, 10), m);
        EXPECT_INVALID(tdist_store_check(s, ks, 2, &flag), m);
        EXPECT_INVALID(tdist_store_delete_key(s, k, &flag), m);
        EXPECT_INVALID(tdist_store_append(s, k, v, 1), m);
        EXPECT_INVALID(tdist_store_multi_get(s, ks, 2, vals, lens), m);
        EXPECT_INVALID(tdist_store_multi_set(s, ks, setvals, setlens, 2), m);
    }
    ASSERT_TRUE(flag);
    OUTS_UNCHANGED();

    /* bad values: NULL with a length, lengths over the cap (never read) */
    EXPECT_INVALID(tdist_store_set(s, "k", NULL, 1), "tdist_store_set: value is NULL but length is 1");
    EXPECT_INVALID(tdist_store_append(s, "text", NULL, 3), "tdist_store_append: value is NULL");
    EXPECT_INVALID(tdist_store_compare_set(s, "num", NULL, 2, v, 1, &val, &len), "value is NULL");
    EXPECT_INVALID(tdist_store_compare_set(s, "num", v, 1, NULL, 9, &val, &len), "value is NULL");
    for (size_t i = 0; i < NELEM(bad_len); i++) {
        EXPECT_INVALID(tdist_store_set(s, "k", v, bad_len[i]), "exceeds the cap");
        EXPECT_INVALID(tdist_store_append(s, "text", v, bad_len[i]), "exceeds the cap");
        EXPECT_INVALID(tdist_store_compare_set(s, "num", v, bad_len[i], v, 1, &val, &len), "exceeds the cap");
        EXPECT_INVALID(tdist_store_compare_set(s, "num", v, 1, v, bad_len[i], &val, &len), "exceeds the cap");
        size_t bl[2] = {1, bad_len[i]};
        EXPECT_INVALID(tdist_store_multi_set(s, good2, setvals, bl, 2), "exceeds the cap");
    }
    const void *nullvals[2] = {v, NULL};
    EXPECT_INVALID(tdist_store_multi_set(s, good2, nullvals, setlens, 2), "value is NULL");

    /* NULL or half-NULL out-pointers */
    EXPECT_INVALID(tdist_store_get(s, "num", NULL, &len), "tdist_store_get: value and len");
    EXPECT_INVALID(tdist_store_get(s, "num", &val, NULL), "tdist_store_get: value and len");
    EXPECT_INVALID(tdist_store_compare_set(s, "num", NULL, 0, v, 1, &val, NULL), "current_len");
    EXPECT_INVALID(tdist_store_compare_set(s, "num", NULL, 0, v, 1, NULL, &len), "current_len");
    EXPECT_INVALID(tdist_store_check(s, good2, 2, NULL), "tdist_store_check: all_exist is NULL");
    EXPECT_INVALID(tdist_store_num_keys(s, NULL), "tdist_store_num_keys: count is NULL");
    EXPECT_INVALID(tdist_store_multi_get(s, good2, 2, NULL, lens), "values and lens");
    EXPECT_INVALID(tdist_store_multi_get(s, good2, 2, vals, NULL), "values and lens");
    EXPECT_INVALID(tdist_store_multi_set(s, good2, NULL, setlens, 2), "values and lens");
    EXPECT_INVALID(tdist_store_multi_set(s, good2, setvals, NULL, 2), "values and lens");
    OUTS_UNCHANGED();

    /* key arrays: NULL, n == 0, n over the cap (never read), a NULL entry */
    size_t bad_n[] = {0, (size_t)TDIST_STORE_MAX_KEYS + 1, SIZE_MAX};
    EXPECT_INVALID(tdist_store_wait(s, NULL, 1, 10), "tdist_store_wait: keys is NULL");
    EXPECT_INVALID(tdist_store_check(s, NULL, 1, &flag), "tdist_store_check: keys is NULL");
    EXPECT_INVALID(tdist_store_multi_get(s, NULL, 1, vals, lens), "keys is NULL");
    EXPECT_INVALID(tdist_store_multi_set(s, NULL, setvals, setlens, 1), "keys is NULL");
    for (size_t i = 0; i < NELEM(bad_n); i++) {
        EXPECT_INVALID(tdist_store_wait(s, good2, bad_n[i], 10), "number of keys");
        EXPECT_INVALID(tdist_store_check(s, good2, bad_n[i], &flag), "number of keys");
        EXPECT_INVALID(tdist_store_multi_get(s, good2, bad_n[i], vals, lens), "number of keys");
        EXPECT_INVALID(tdist_store_multi_set(s, good2, setvals, setlens, bad_n[i]), "number of keys");
    }
    EXPECT_INVALID(tdist_store_multi_get(s, nullkeys, 2, vals, lens), "key is NULL");
    ASSERT_TRUE(flag);
    OUTS_UNCHANGED();

    /* add: a non-numeric value and int64 overflow are INVALID_ARG */
    EXPECT_INVALID(tdist_store_add(s, "text", 1, &res), "text");
    ASSERT_OK(tdist_store_set(s, "big", "9223372036854775807", 19));
    EXPECT_INVALID(tdist_store_add(s, "big", 1, &res), "overflow");
    EXPECT_INVALID(tdist_store_add(s, "big", INT64_MAX, NULL), "overflow");
    ASSERT_OK(tdist_store_set(s, "small", "-9223372036854775808", 20));
    EXPECT_INVALID(tdist_store_add(s, "small", -1, &res), "overflow");
    OUTS_UNCHANGED();
    ASSERT_OK(tdist_store_get(s, "big", &val, &len));
    ASSERT_EQ(len, 19);
    ASSERT_MEMEQ(val, "9223372036854775807", 19);
    free(val);
    val = SENTINEL;
    len = SENTINEL_LEN;
    bool del = false;
    ASSERT_OK(tdist_store_delete_key(s, "big", &del));
    ASSERT_TRUE(del);
    ASSERT_OK(tdist_store_delete_key(s, "small", &del));
    ASSERT_TRUE(del);

    /* documented failures of well-formed calls: missing keys time out
     * (naming the key) and write nothing */
    ASSERT_OK(tdist_store_set_timeout(s, 30));
    EXPECT_ST(tdist_store_get(s, "missing-1", &val, &len), TDIST_ERR_TIMEOUT, "missing-1");
    const char *mk[2] = {"num", "missing-2"};
    EXPECT_ST(tdist_store_multi_get(s, mk, 2, vals, lens), TDIST_ERR_TIMEOUT, "missing-2");
    EXPECT_ST(tdist_store_wait(s, mk, 2, 20), TDIST_ERR_TIMEOUT, "missing-2");
    flag = true;
    EXPECT_OK(tdist_store_check(s, mk, 2, &flag));
    ASSERT_FALSE(flag);
    OUTS_UNCHANGED();

    /* nothing above changed the store */
    int64_t nkeys1 = -1;
    ASSERT_OK(tdist_store_num_keys(s, &nkeys1));
    ASSERT_EQ(nkeys1, nkeys0);
    ASSERT_OK(tdist_store_get(s, "num", &val, &len));
    ASSERT_EQ(len, 1);
    ASSERT_MEMEQ(val, "5", 1);
    free(val);

    /* boundary: a key of exactly TDIST_STORE_MAX_KEY bytes is valid (but
     * too long once a prefix store adds its prefix); an empty value may be
     * NULL */
    longkey[TDIST_STORE_MAX_KEY] = '\0';
    if (strcmp(kind, "prefix") == 0) {
        EXPECT_INVALID(tdist_store_set(s, longkey, v, 1), "with the prefix");
    } else {
        EXPECT_OK(tdist_store_set(s, longkey, v, 1));
        EXPECT_OK(tdist_store_delete_key(s, longkey, NULL));
    }
    EXPECT_OK(tdist_store_set(s, "empty", NULL, 0));
    val = NULL;
    len = SENTINEL_LEN;
    EXPECT_OK(tdist_store_get(s, "empty", &val, &len));
    ASSERT_TRUE(val != NULL);
    ASSERT_EQ(len, 0);
    free(val);
    EXPECT_OK(tdist_store_delete_key(s, "empty", NULL));
    EXPECT_OK(tdist_store_set_timeout(s, 10000));
    free(longkey);
    free(hugekey);
#undef OUTS_UNCHANGED
}

static void seed(tdist_store_t *s)
{
    ASSERT_OK(tdist_store_set(s, "num", "5", 1));
    ASSERT_OK(tdist_store_set(s, "text", "abc", 3));
}

TEST(api_store_ops_bad_args, 30)
{
    api_setup();
    tdist_store_opts_t o;
    tdist_store_opts_init(&o);
    o.timeout_ms = 10000;

    tdist_store_t *hs = NULL, *fs = NULL, *ps = NULL, *ts = NULL;
    ASSERT_OK(tdist_store_hash_create(&o, &hs));
    seed(hs);
    store_ops_bad_args(hs, "hash");

    char path[512];
    snprintf(path, sizeof path, "%s/store", tdist_test_tmpdir());
    ASSERT_OK(tdist_store_file_create(path, &o, &fs));
    seed(fs);
    store_ops_bad_args(fs, "file");

    ASSERT_OK(tdist_store_prefix_create("pre", fs, NULL, &ps));
    seed(ps);
    store_ops_bad_args(ps, "prefix");

    tdist_store_server_t *srv = NULL;
    ASSERT_OK(tdist_store_server_create("127.0.0.1", 0, NULL, &srv));
    ASSERT_OK(tdist_store_tcp_connect("127.0.0.1", tdist_store_server_port(srv), &o, &ts));
    seed(ts);
    store_ops_bad_args(ts, "tcp");

    QUIET(tdist_store_destroy(ts));
    QUIET(tdist_store_server_destroy(srv));
    QUIET(tdist_store_destroy(ps));
    QUIET(tdist_store_destroy(fs));
    QUIET(tdist_store_destroy(hs));
}

/* Huge timeouts mean "a very long time", never "already expired". */
typedef struct late_set {
    tdist_store_t *s;
    const char *key;
} late_set_t;

static void *late_set_main(void *arg)
{
    late_set_t *ls = arg;
    usleep(100 * 1000);
    tdist_store_set(ls->s, ls->key, "x", 1);
    return NULL;
}

static void huge_timeouts(tdist_store_t *waiter, tdist_store_t *setter, const char *kind)
{
    static const int64_t timeouts[] = {INT64_MAX, INT64_MAX / 2, (int64_t)1 << 53};
    for (size_t i = 0; i < NELEM(timeouts); i++) {
        char key[64];
        snprintf(key, sizeof key, "late-%s-%zu", kind, i);
        /* the store's timeout, through get */
        ASSERT_OK(tdist_store_set_timeout(waiter, timeouts[i]));
        late_set_t ls = {setter, key};
        pthread_t th;
        ASSERT_EQ(pthread_create(&th, NULL, late_set_main, &ls), 0);
        void *val = NULL;
        size_t len = 0;
        double t0 = tdist_test_now_ms();
        tdist_status_t st = tdist_store_get(waiter, key, &val, &len);
        double dt = tdist_test_now_ms() - t0;
        pthread_join(th, NULL);
        if (st != TDIST_OK)
            FAIL("%s store: get with timeout %" PRId64 " ms failed after %.0f ms: %s: %s", kind,
                 timeouts[i], dt, tdist_status_str(st), tdist_last_error());
        free(val);
        /* an explicit timeout, through wait */
        ASSERT_OK(tdist_store_set_timeout(waiter, 10000));
        snprintf(key, sizeof key, "late-wait-%s-%zu", kind, i);
        ASSERT_EQ(pthread_create(&th, NULL, late_set_main, &ls), 0);
        const char *keys[1] = {key};
        t0 = tdist_test_now_ms();
        st = tdist_store_wait(waiter, keys, 1, timeouts[i]);
        dt = tdist_test_now_ms() - t0;
        pthread_join(th, NULL);
        if (st != TDIST_OK)
            FAIL("%s store: wait with timeout %" PRId64 " ms failed after %.0f ms: %s: %s", kind,
                 timeouts[i], dt, tdist_status_str(st), tdist_last_error());
    }
}

TEST(api_store_huge_timeouts, 30)
{
    api_setup();
    tdist_store_t *hs = NULL, *fs1 = NULL, *fs2 = NULL, *ps = NULL, *tc1 = NULL, *tc2 = NULL;
    ASSERT_OK(tdist_store_hash_create(NULL, &hs));
    huge_timeouts(hs, hs, "hash");
    ASSERT_OK(tdist_store_prefix_create("pre", hs, NULL, &ps));
    huge_timeouts(ps, ps, "prefix");

    char path[512];
    snprintf(path, sizeof path, "%s/store", tdist_test_tmpdir());
    ASSERT_OK(tdist_store_file_create(path, NULL, &fs1));
    ASSERT_OK(tdist_store_file_create(path, NULL, &fs2));
    huge_timeouts(fs1, fs2, "file");

    tdist_store_server_t *srv = NULL;
    ASSERT_OK(tdist_store_server_create("127.0.0.1", 0, NULL, &srv));
    uint16_t port = tdist_store_server_port(srv);
    ASSERT_OK(tdist_store_tcp_connect("127.0.0.1", port, NULL, &tc1));
    ASSERT_OK(tdist_store_tcp_connect("127.0.0.1", port, NULL, &tc2));
    huge_timeouts(tc1, tc2, "tcp");

    tdist_store_destroy(tc2);
    tdist_store_destroy(tc1);
    tdist_store_server_destroy(srv);
    tdist_store_destroy(fs2);
    tdist_store_destroy(fs1);
    tdist_store_destroy(ps);
    tdist_store_destroy(hs);
}

/* ================================================================= init */

TEST(api_init_bad_args, 20)
{
    api_setup();
    tdist_world_t *w = SENTINEL;
    tdist_init_opts_t o;
    QUIET(tdist_init_opts_init(NULL));
    QUIET(tdist_world_destroy(NULL));
    int r = 0;
    QUIET(r = tdist_world_rank(NULL));
    ASSERT_EQ(r, -1);
    QUIET(r = tdist_world_size(NULL));
    ASSERT_EQ(r, -1);
    QUIET(r = tdist_world_local_rank(NULL));
    ASSERT_EQ(r, -1);
    QUIET(r = tdist_world_local_size(NULL));
    ASSERT_EQ(r, -1);
    tdist_store_t *ws = SENTINEL;
    QUIET(ws = tdist_world_store(NULL));
    ASSERT_TRUE(ws == NULL);

    const char *url = "tcp://127.0.0.1:29500?rank=0&world_size=1";
    EXPECT_INVALID(tdist_init(url, NULL, NULL), "tdist_init: out is NULL");

    /* options out of range */
    struct {
        int rank, world_size, listen_fd;
        int64_t timeout_ms;
        const char *needle;
    } bad_opts[] = {
        {-2, -1, -1, 1000, "opts.rank"},           {INT_MIN, -1, -1, 1000, "opts.rank"},
        {INT_MAX, -1, -1, 1000, "opts.rank"},      {(1 << 20), -1, -1, 1000, "opts.rank"},
        {-1, 0, -1, 1000, "opts.world_size"},      {-1, -2, -1, 1000, "opts.world_size"},
        {-1, INT_MIN, -1, 1000, "opts.world_size"}, {-1, INT_MAX, -1, 1000, "opts.world_size"},
        {-1, (1 << 20) + 1, -1, 1000, "opts.world_size"},
        {-1, -1, -1, 0, "opts.timeout_ms"},        {-1, -1, -1, -1, "opts.timeout_ms"},
        {-1, -1, -1, INT64_MIN, "opts.timeout_ms"}, {-1, -1, -2, 1000, "opts.listen_fd"},
        {-1, -1, INT_MIN, 1000, "opts.listen_fd"},
        {3, 2, -1, 1000, "rank 3 is not below the world size 2"},
        {1, 1, -1, 1000, "rank 1 is not below the world size 1"},
    };
    for (size_t i = 0; i < NELEM(bad_opts); i++) {
        tdist_init_opts_init(&o);
        o.rank = bad_opts[i].rank;
        o.world_size = bad_opts[i].world_size;
        o.listen_fd = bad_opts[i].listen_fd;
        o.timeout_ms = bad_opts[i].timeout_ms;
        EXPECT_INVALID(tdist_init(url, &o, &w), bad_opts[i].needle);
    }

    /* malformed URLs */
    char *longurl = malloc(6000);
    ASSERT_TRUE(longurl != NULL);
    snprintf(longurl, 6000, "tcp://127.0.0.1:1?rank=0&world_size=1&");
    memset(longurl + strlen(longurl), 'x', 5000);
    longurl[5900] = '\0';
    char *longhost = malloc(1000);
    ASSERT_TRUE(longhost != NULL);
    memcpy(longhost, "tcp://", 6);
    memset(longhost + 6, 'h', 300);
    snprintf(longhost + 306, 1000 - 306, ":1?rank=0&world_size=1");
    const char *bad_urls[] = {
        "",
        "bogus://x",
        "tcp:/127.0.0.1:1",
        "env",
        "tcp://",
        "tcp://127.0.0.1",
        "tcp://127.0.0.1:",
        "tcp://127.0.0.1:0?rank=0&world_size=1",
        "tcp://127.0.0.1:65536?rank=0&world_size=1",
        "tcp://127.0.0.1:-1?rank=0&world_size=1",
        "tcp://127.0.0.1:1x?rank=0&world_size=1",
        "tcp://:1?rank=0&world_size=1",
        "tcp://[::1?rank=0&world_size=1",
        "tcp://[::1]?rank=0&world_size=1",
        "tcp://::1:1?rank=0&world_size=1",
        "tcp://a/b:1?rank=0&world_size=1",
        "tcp://127.0.0.1:1?rank=-1&world_size=1",
        "tcp://127.0.0.1:1?rank=0&world_size=0",
        "tcp://127.0.0.1:1?rank=0&world_size=-4",
        "tcp://127.0.0.1:1?rank=0&world_size=99999999999999999999",
        "tcp://127.0.0.1:1?rank=x&world_size=1",
        "tcp://127.0.0.1:1?rank=&world_size=1",
        "tcp://127.0.0.1:1?rank=0&rank=0&world_size=1",
        "tcp://127.0.0.1:1?rank=0&world_size=1&color=red",
        "tcp://127.0.0.1:1?rank",
        "tcp://127.0.0.1:1?rank=2&world_size=2",
        "tcp://127.0.0.1:1?world_size=2",
        "tcp://127.0.0.1:1?rank=0",
        "tcp://127.0.0.1:1",
        "file://",
        "file://relative/path?rank=0&world_size=1",
        "file:///?rank=0&world_size=1",
        "file:///tmp/x",
        "env://host:1",
        "env:///path",
        longurl,
        longhost,
    };
    for (size_t i = 0; i < NELEM(bad_urls); i++) EXPECT_INVALID(tdist_init(bad_urls[i], NULL, &w), "tdist_init");
    free(longurl);
    free(longhost);

    /* env:// with the environment missing or malformed */
    EXPECT_INVALID(tdist_init(NULL, NULL, &w), "MASTER_ADDR");
    EXPECT_INVALID(tdist_init("env://", NULL, &w), "MASTER_ADDR");
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    EXPECT_INVALID(tdist_init("env://", NULL, &w), "MASTER_PORT");
    const char *bad_ports[] = {"", "0", "65536", "-1", "http", "1 2"};
    for (size_t i = 0; i < NELEM(bad_ports); i++) {
        setenv("MASTER_PORT", bad_ports[i], 1);
        EXPECT_INVALID(tdist_init("env://", NULL, &w), "MASTER_PORT");
    }
    setenv("MASTER_PORT", "1", 1);
    EXPECT_INVALID(tdist_init("env://", NULL, &w), "RANK");
    setenv("RANK", "-1", 1);
    EXPECT_INVALID(tdist_init("env://", NULL, &w), "RANK");
    setenv("RANK", "0", 1);
    EXPECT_INVALID(tdist_init("env://", NULL, &w), "WORLD_SIZE");
    const char *bad_ws[] = {"0", "-1", "abc", "2000000000"};
    for (size_t i = 0; i < NELEM(bad_ws); i++) {
        setenv("WORLD_SIZE", bad_ws[i], 1);
        EXPECT_INVALID(tdist_init("env://", NULL, &w), "WORLD_SIZE");
    }
    setenv("WORLD_SIZE", "2", 1);
    setenv("RANK", "2", 1);
    EXPECT_INVALID(tdist_init("env://", NULL, &w), "rank 2 is not below the world size 2");
    setenv("RANK", "0", 1);
    struct {
        const char *var, *value, *needle;
    } bad_env[] = {
        {"LOCAL_RANK", "-1", "LOCAL_RANK"},
        {"LOCAL_RANK", "x", "LOCAL_RANK"},
        {"LOCAL_WORLD_SIZE", "0", "LOCAL_WORLD_SIZE"},
        {"TDIST_LAUNCHER_STORE", "yes", "TDIST_LAUNCHER_STORE"},
        {"TDIST_RESTART_COUNT", "-1", "TDIST_RESTART_COUNT"},
        {"TDIST_STORE_LISTEN_FD", "-3", "TDIST_STORE_LISTEN_FD"},
        {"TDIST_HOSTNAME", "", "TDIST_HOSTNAME"},
    };
    for (size_t i = 0; i < NELEM(bad_env); i++) {
        setenv(bad_env[i].var, bad_env[i].value, 1);
        EXPECT_INVALID(tdist_init("env://", NULL, &w), bad_env[i].needle);
        unsetenv(bad_env[i].var);
    }
    char *longhn = repeat('h', 300);
    setenv("TDIST_HOSTNAME", longhn, 1);
    EXPECT_INVALID(tdist_init("env://", NULL, &w), "TDIST_HOSTNAME");
    unsetenv("TDIST_HOSTNAME");
    setenv("MASTER_ADDR", longhn, 1);
    EXPECT_INVALID(tdist_init("env://", NULL, &w), "MASTER_ADDR");
    free(longhn);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("LOCAL_RANK", "3", 1);
    setenv("LOCAL_WORLD_SIZE", "2", 1);
    EXPECT_INVALID(tdist_init("env://", NULL, &w), "LOCAL_RANK=3 is not below LOCAL_WORLD_SIZE=2");
    api_setup();
    ASSERT_TRUE(w == SENTINEL);
}

/* Failures that reach the store: bounded, documented statuses, nothing written. */
TEST(api_init_bounded_failures, 20)
{
    api_setup();
    tdist_world_t *w = SENTINEL;
    tdist_init_opts_t o;
    char url[1024], addr[64];
    uint16_t cport = 0;
    int unlistened = closed_port_socket(&cport);
    snprintf(addr, sizeof addr, "127.0.0.1:%u", (unsigned)cport);

    /* a store nobody serves: rank 1 gives up at its deadline, naming it */
    tdist_init_opts_init(&o);
    o.timeout_ms = 300;
    snprintf(url, sizeof url, "tcp://127.0.0.1:%u?rank=1&world_size=2", (unsigned)cport);
    double t0 = tdist_test_now_ms();
    EXPECT_ST2(tdist_init(url, &o, &w), TDIST_ERR_TIMEOUT, TDIST_ERR_CONNECTION, addr);
    double dt = tdist_test_now_ms() - t0;
    ASSERT_LE(dt, 300 + 1000 * tdist_test_timeout_mult());

    /* rank 0 asked to host the store on a taken port */
    uint16_t busy_port = 0;
    int busy = listening_socket(&busy_port);
    snprintf(url, sizeof url, "tcp://127.0.0.1:%u?rank=0&world_size=2", (unsigned)busy_port);
    snprintf(addr, sizeof addr, "127.0.0.1:%u", (unsigned)busy_port);
    EXPECT_ST(tdist_init(url, &o, &w), TDIST_ERR_ADDR_IN_USE, addr);

    /* rank 0 with a token the server cannot take */
    char *longtok = repeat('t', 5000);
    snprintf(url, sizeof url, "tcp://127.0.0.1:%u?rank=0&world_size=2", (unsigned)cport);
    o.token = longtok;
    EXPECT_INVALID(tdist_init(url, &o, &w), "token longer than");
    o.token = NULL;
    free(longtok);

    /* opts.listen_fd that is not an open listening socket; the caller
     * keeps its descriptor */
    int pfd[2];
    ASSERT_EQ(pipe(pfd), 0);
    o.listen_fd = never_open_fd();
    EXPECT_INVALID(tdist_init(url, &o, &w), "opts.listen_fd");
    o.listen_fd = pfd[0];
    EXPECT_INVALID(tdist_init(url, &o, &w), "not a socket");
    ASSERT_TRUE(fd_is_open(pfd[0]));
    o.listen_fd = unlistened;
    EXPECT_INVALID(tdist_init(url, &o, &w), "not a listening stream socket");
    ASSERT_TRUE(fd_is_open(unlistened));
    o.listen_fd = -1;
    setenv("TDIST_STORE_LISTEN_FD", "1000000", 1);
    EXPECT_INVALID(tdist_init(url, &o, &w), "TDIST_STORE_LISTEN_FD");
    unsetenv("TDIST_STORE_LISTEN_FD");
    close(pfd[0]);
    close(pfd[1]);

    /* file:// in a directory that does not exist */
    snprintf(url, sizeof url, "file://%s/no/such/dir/f?rank=0&world_size=1", tdist_test_tmpdir());
    EXPECT_ST(tdist_init(url, &o, &w), TDIST_ERR_SYSTEM, "no/such/dir");
    ASSERT_TRUE(w == SENTINEL);

    /* the largest world, nobody else there: times out listing the missing */
    snprintf(url, sizeof url, "file://%s/big?rank=5&world_size=%d", tdist_test_tmpdir(), 1 << 20);
    o.timeout_ms = 200;
    t0 = tdist_test_now_ms();
    EXPECT_ST(tdist_init(url, &o, &w), TDIST_ERR_TIMEOUT, "missing ranks: 0, 1, 2, 3, 4, 6, 7");
    ASSERT_LE(tdist_test_now_ms() - t0, 200 + 2000 * tdist_test_timeout_mult());
    ASSERT_TRUE(w == SENTINEL);

    /* and a good single-rank world, to show the calls above were refused
     * for their arguments and not because init cannot work here */
    snprintf(url, sizeof url, "file://%s/world?rank=0&world_size=1", tdist_test_tmpdir());
    tdist_world_t *good = NULL;
    o.timeout_ms = 10000;
    EXPECT_OK(tdist_init(url, &o, &good));
    ASSERT_EQ(tdist_world_rank(good), 0);
    ASSERT_EQ(tdist_world_size(good), 1);
    ASSERT_EQ(tdist_world_local_rank(good), 0);
    ASSERT_EQ(tdist_world_local_size(good), 1);
    tdist_store_t *s = tdist_world_store(good);
    ASSERT_TRUE(s != NULL);
    EXPECT_INVALID(tdist_store_set(s, "", "x", 1), "key is empty");
    QUIET(tdist_world_destroy(good));
    /* a huge deadline is a long one, not an expired one */
    snprintf(url, sizeof url, "file://%s/world2?rank=0&world_size=1", tdist_test_tmpdir());
    o.timeout_ms = INT64_MAX;
    good = NULL;
    EXPECT_OK(tdist_init(url, &o, &good));
    ASSERT_EQ(tdist_world_size(good), 1);
    QUIET(tdist_world_destroy(good));
    close(busy);
    close(unlistened);
}

/* A server that went away: every client call fails quietly with an error
 * naming host:port — no SIGPIPE, no output, out-parameters untouched. */
TEST(api_store_dead_server_quiet, 20)
{
    api_setup();
    tdist_store_server_t *srv = NULL;
    ASSERT_OK(tdist_store_server_create("127.0.0.1", 0, NULL, &srv));
    uint16_t port = tdist_store_server_port(srv);
    tdist_store_opts_t o;
    tdist_store_opts_init(&o);
    o.timeout_ms = 500;
    o.connect_timeout_ms = 0;
    tdist_store_t *s = NULL;
    ASSERT_OK(tdist_store_tcp_connect("127.0.0.1", port, &o, &s));
    ASSERT_OK(tdist_store_set(s, "k", "v", 1));
    QUIET(tdist_store_server_destroy(srv));
    /* hold the port so the client's reconnect is refused, not answered */
    int hold = -1;
    {
        hold = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        ASSERT_TRUE(hold >= 0);
        struct sockaddr_in a;
        memset(&a, 0, sizeof a);
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        a.sin_port = htons(port);
        if (bind(hold, (struct sockaddr *)&a, sizeof a) != 0) {
            close(hold); /* taken by someone else meanwhile: still a refused or foreign port */
            hold = -1;
        }
    }
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%u", (unsigned)port);
    void *val = SENTINEL;
    size_t len = SENTINEL_LEN;
    int64_t n = SENTINEL_I64;
    double t0 = tdist_test_now_ms();
    for (int i = 0; i < 3; i++) {
        EXPECT_ST2(tdist_store_set(s, "k", "v", 1), TDIST_ERR_CONNECTION, TDIST_ERR_TIMEOUT, addr);
        EXPECT_ST2(tdist_store_get(s, "k", &val, &len), TDIST_ERR_CONNECTION, TDIST_ERR_TIMEOUT, addr);
        EXPECT_ST2(tdist_store_num_keys(s, &n), TDIST_ERR_CONNECTION, TDIST_ERR_TIMEOUT, addr);
    }
    ASSERT_LE(tdist_test_now_ms() - t0, 9 * (500 + 1000) * tdist_test_timeout_mult());
    ASSERT_TRUE(val == SENTINEL);
    ASSERT_EQ(len, SENTINEL_LEN);
    ASSERT_EQ(n, SENTINEL_I64);
    QUIET(tdist_store_destroy(s));
    if (hold >= 0) close(hold);
}
