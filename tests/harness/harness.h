/*
 * tests/harness/harness.h — the test registry, assertions and the multi-rank
 * runner every tdist test uses.
 *
 * A test file declares tests with
 *
 *     TEST(store_tcp_set_get, 30) { ... }
 *
 * (name unique across the suite, deadline in seconds). CMake reads these
 * lines and registers one ctest case per test; the runner executes each in a
 * forked child in its own process group and kills the whole group when the
 * deadline (times TDIST_TEST_TIMEOUT_MULT, 3 under sanitizers) passes.
 *
 * Multi-rank tests call tdist_test_run_ranks(n, body, arg): n real
 * processes, with a TCP store server on 127.0.0.1 port 0 run by a helper
 * process and the env:// variables set (MASTER_ADDR, MASTER_PORT, RANK,
 * WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, TDIST_LAUNCHER_STORE=1).
 */
#ifndef TDIST_TEST_HARNESS_H
#define TDIST_TEST_HARNESS_H

#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "tdist/tdist.h"

/* Which sanitizer this build has: TDIST_TEST_ASAN (AddressSanitizer, with
 * its leak checker) or TDIST_TEST_TSAN (ThreadSanitizer). gcc says
 * __SANITIZE_ADDRESS__ / __SANITIZE_THREAD__; clang says __has_feature. */
#if defined(__SANITIZE_ADDRESS__)
#define TDIST_TEST_ASAN 1
#elif defined(__SANITIZE_THREAD__)
#define TDIST_TEST_TSAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TDIST_TEST_ASAN 1
#elif __has_feature(thread_sanitizer)
#define TDIST_TEST_TSAN 1
#endif
#endif

typedef void (*tdist_test_fn)(void);

typedef struct tdist_test_entry {
    const char *name;
    const char *file;
    int timeout_s;
    tdist_test_fn fn;
} tdist_test_entry_t;

void tdist_test_register(const tdist_test_entry_t *e);

#define TEST(name, timeout_s)                                                  \
    static void test_##name(void);                                             \
    __attribute__((constructor)) static void register_##name(void)             \
    {                                                                          \
        static const tdist_test_entry_t e = {#name, __FILE__, (timeout_s), test_##name}; \
        tdist_test_register(&e);                                               \
    }                                                                          \
    static void test_##name(void)

/* A test the runner knows but ctest does not run on its own: the harness's
 * self-tests run these through the runner and check how they end. */
#define TEST_HIDDEN(name, timeout_s) TEST(name, timeout_s)

/* ------------------------------------------------------------ assertions */

/* Print "[rank R] file:line: message" to stderr and end this process with
 * status 1. Never returns. */
_Noreturn void tdist_test_fail(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define FAIL(...) tdist_test_fail(__FILE__, __LINE__, __VA_ARGS__)

/* The exit status of a test that cannot run here; ctest's SKIP_RETURN_CODE
 * (tests/CMakeLists.txt), so the summary lists it as skipped, not passed. */
#define TDIST_TEST_SKIP_CODE 77

/* Print "SKIP <test>: message" and end this process with
 * TDIST_TEST_SKIP_CODE. Never returns. Call it from the test's own process
 * or from a rank of tdist_test_run_ranks (the whole test then skips), after
 * undoing whatever the test set up outside the process. */
_Noreturn void tdist_test_skip(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#define SKIP(...) tdist_test_skip(__VA_ARGS__)

#define ASSERT_TRUE(c)                                                         \
    do {                                                                       \
        if (!(c)) FAIL("ASSERT_TRUE(%s) failed", #c);                          \
    } while (0)

#define ASSERT_FALSE(c)                                                        \
    do {                                                                       \
        if (c) FAIL("ASSERT_FALSE(%s) failed", #c);                            \
    } while (0)

#define ASSERT_OK(expr)                                                        \
    do {                                                                       \
        tdist_status_t st_ = (expr);                                           \
        if (st_ != TDIST_OK)                                                   \
            FAIL("%s returned %s: %s", #expr, tdist_status_str(st_), tdist_last_error()); \
    } while (0)

#define ASSERT_STATUS(expr, want)                                              \
    do {                                                                       \
        tdist_status_t st_ = (expr);                                           \
        if (st_ != (want))                                                     \
            FAIL("%s returned %s, expected %s (last error: %s)", #expr,        \
                 tdist_status_str(st_), tdist_status_str(want), tdist_last_error()); \
    } while (0)

#define ASSERT_EQ(a, b)                                                        \
    do {                                                                       \
        int64_t a_ = (int64_t)(a), b_ = (int64_t)(b);                          \
        if (a_ != b_) FAIL("ASSERT_EQ(%s, %s) failed: %" PRId64 " != %" PRId64, #a, #b, a_, b_); \
    } while (0)

#define ASSERT_NE(a, b)                                                        \
    do {                                                                       \
        int64_t a_ = (int64_t)(a), b_ = (int64_t)(b);                          \
        if (a_ == b_) FAIL("ASSERT_NE(%s, %s) failed: both %" PRId64, #a, #b, a_); \
    } while (0)

#define ASSERT_LE(a, b)                                                        \
    do {                                                                       \
        int64_t a_ = (int64_t)(a), b_ = (int64_t)(b);                          \
        if (!(a_ <= b_)) FAIL("ASSERT_LE(%s, %s) failed: %" PRId64 " > %" PRId64, #a, #b, a_, b_); \
    } while (0)

#define ASSERT_GE(a, b)                                                        \
    do {                                                                       \
        int64_t a_ = (int64_t)(a), b_ = (int64_t)(b);                          \
        if (!(a_ >= b_)) FAIL("ASSERT_GE(%s, %s) failed: %" PRId64 " < %" PRId64, #a, #b, a_, b_); \
    } while (0)

#define ASSERT_STREQ(a, b)                                                     \
    do {                                                                       \
        const char *a_ = (a), *b_ = (b);                                       \
        if (!a_ || !b_ || strcmp(a_, b_) != 0)                                 \
            FAIL("ASSERT_STREQ(%s, %s) failed: \"%s\" != \"%s\"", #a, #b,      \
                 a_ ? a_ : "(null)", b_ ? b_ : "(null)");                      \
    } while (0)

/* haystack contains needle */
#define ASSERT_CONTAINS(haystack, needle)                                      \
    do {                                                                       \
        const char *h_ = (haystack), *n_ = (needle);                           \
        if (!h_ || !strstr(h_, n_))                                            \
            FAIL("ASSERT_CONTAINS(%s, \"%s\") failed: \"%s\"", #haystack, n_, h_ ? h_ : "(null)"); \
    } while (0)

#define ASSERT_MEMEQ(a, b, n)                                                  \
    do {                                                                       \
        if (memcmp((a), (b), (n)) != 0) FAIL("ASSERT_MEMEQ(%s, %s, %s) failed", #a, #b, #n); \
    } while (0)

/* ---------------------------------------------------------------- timing */

/* Deadline multiplier: TDIST_TEST_TIMEOUT_MULT, else 3 in sanitizer builds,
 * else 1. Use it to scale waits in tests, never to loosen a correctness
 * check. */
double tdist_test_timeout_mult(void);

/* Latency-bound multiplier: TDIST_TEST_LATENCY_MULT, else 4 under
 * ThreadSanitizer, else 1. A bound on how fast the library reacts (a
 * mismatch reported within 200 ms, a failed group's next call within
 * 10 ms) is the product's figure in every other build, AddressSanitizer's
 * included; ThreadSanitizer runs the same code 5-15x slower, and with
 * several ranks sharing two CPUs a reaction that goes through other ranks'
 * processes pays their slowdown too, which tdist_test_cpu_wait_ms cannot
 * take off. Never for a correctness check. */
double tdist_test_latency_mult(void);

/* Monotonic milliseconds (double, for measuring). */
double tdist_test_now_ms(void);

/* Run the leak checker now, where the build has one (AddressSanitizer),
 * instead of at exit: a process whose exit others time (a victim of a
 * failure test) calls it before it takes the time, so the interval holds
 * the library's reaction, not the checker's scan. A leak fails the process
 * here as it would at exit. No-op in other builds. */
void tdist_test_leak_check_now(void);

/* Milliseconds the calling thread has waited for a CPU since it started:
 * its run-queue delay (/proc/thread-self/schedstat); 0 where the kernel
 * does not report it. Subtracted from an interval the thread measured, it
 * leaves the time the code ran or waited by itself, however loaded the
 * machine is: what a bound on the code's own latency can check. */
double tdist_test_cpu_wait_ms(void);

/* --------------------------------------------------------------- ranks */

/* Which rank this process is in a multi-rank test (-1 in the test's main
 * process). Used in failure messages. */
extern int tdist_test_rank;

typedef void (*tdist_rank_fn)(int rank, int world_size, void *arg);

/* How one rank process ended. */
typedef struct tdist_rank_result {
    int pid;
    bool exited;     /* exited normally; code holds its status */
    int code;
    bool signaled;   /* killed by a signal; sig holds it */
    int sig;
    double end_ms;   /* tdist_test_now_ms() when the harness reaped it */
    bool killed_by_harness; /* SIGKILLed by the harness (timeout or another rank failed) */
} tdist_rank_result_t;

typedef struct tdist_ranks_opts {
    int world_size;
    bool with_store;   /* start a TCP store on 127.0.0.1:0 and set env:// vars (default true) */
    int timeout_ms;    /* kill all ranks after this long (default: 60000 * mult) */
    /* When one rank fails (non-zero exit or signal), kill the others after
     * this many ms (default 0: at once). -1: let them run to the end. */
    int kill_others_after_ms;
    /* Extra "NAME=VALUE" environment entries for every rank; NULL-terminated. */
    const char *const *env;
} tdist_ranks_opts_t;

void tdist_ranks_opts_init(tdist_ranks_opts_t *o, int world_size);

/* Run body(rank, world_size, arg) in world_size forked processes; each
 * exits 0 when body returns. Fills results[0..world_size-1] (may be NULL)
 * and returns the number of ranks that did not exit with status 0.
 * A rank that outlives the timeout is killed (SIGKILL) and counted. */
int tdist_test_spawn_ranks(const tdist_ranks_opts_t *o, tdist_rank_fn body, void *arg,
                           tdist_rank_result_t *results);

/* Run body on n ranks with a store and default options; fail the test,
 * naming the first rank that failed and how, unless every rank exits 0.
 * When the first rank to end otherwise skipped (SKIP), the test skips. */
void tdist_test_run_ranks(int n, tdist_rank_fn body, void *arg);

/* tdist_test_run_ranks with extra "NAME=VALUE" entries (NULL-terminated,
 * may be NULL) in every rank's environment. */
void tdist_test_run_ranks_env(int n, tdist_rank_fn body, void *arg, const char *const *env);

/* In a rank body: join the job (env://) and create the world group with
 * a group timeout of timeout_ms (used as given: scale it with
 * tdist_test_timeout_mult() where a slow sanitizer build should wait
 * longer). Fails the test on error. */
void tdist_test_open_world(tdist_world_t **w, tdist_pg_t **pg, int64_t timeout_ms);

/* Describe a result ("exited with status 1", "killed by signal 9 (Killed)"). */
const char *tdist_test_describe(const tdist_rank_result_t *r, char *buf, size_t n);

/* Open file descriptors of this process (/proc/self/fd, without the one
 * that reading it holds), and its threads (/proc/self/task) now. */
int tdist_test_count_fds(void);
int tdist_test_count_threads(void);

/* How many threads this process has (/proc/self/task), once at most
 * want: a thread that pthread_join has returned for can stay listed
 * there a moment longer, until the kernel has reaped it, so the count
 * is read again for up to two seconds (bounded) while it is above want.
 * A thread really left running keeps the count above want. */
int tdist_test_threads_settled(int want);

/* A fresh temporary directory for this test (removed by the runner after
 * the test ends). Path valid for the life of the process. */
const char *tdist_test_tmpdir(void);

#endif /* TDIST_TEST_HARNESS_H */
