/*
 * core/internal.h — what every layer of the library uses from core and that
 * is not public: setting errors, logging, status-check macros, clocks,
 * environment parsing, small I/O helpers.
 *
 * Internal symbols shared across files are prefixed tdist__.
 */
#ifndef TDIST_CORE_INTERNAL_H
#define TDIST_CORE_INTERNAL_H

#include <errno.h>
#include <stdbool.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "tdist/core.h"

#define TDIST_PRINTF(a, b) __attribute__((format(printf, a, b)))
#define TDIST_UNUSED(x) ((void)(x))
#define TDIST_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define TDIST_MIN(a, b) ((a) < (b) ? (a) : (b))
#define TDIST_MAX(a, b) ((a) > (b) ? (a) : (b))

/* ---------------------------------------------------------------- errors */

/* Record msg as the calling thread's last error and return st, so that
 * `return tdist__error(TDIST_ERR_TIMEOUT, "...", ...);` reads naturally.
 * Also logs the message at debug level. Thread-safe (thread-local). */
tdist_status_t tdist__error(tdist_status_t st, const char *fmt, ...) TDIST_PRINTF(2, 3);

/* Like tdist__error but appends ": <strerror(err)>" and maps errno to a
 * status: ENOMEM -> NO_MEMORY, ETIMEDOUT -> TIMEOUT, EADDRINUSE ->
 * ADDR_IN_USE, ECONNREFUSED/ECONNRESET/EPIPE/ENOTCONN/EHOSTUNREACH/
 * ENETUNREACH -> CONNECTION, anything else -> SYSTEM. */
tdist_status_t tdist__error_errno(int err, const char *fmt, ...) TDIST_PRINTF(2, 3);

/* Prepend "prefix: " to the calling thread's last error, keeping st.
 * Used to add context (rank, group, op) as an error travels up. */
tdist_status_t tdist__error_context(tdist_status_t st, const char *fmt, ...) TDIST_PRINTF(2, 3);

/* Return from the calling function if expr is not TDIST_OK. */
#define TDIST_CHECK(expr)                                                      \
    do {                                                                       \
        tdist_status_t tdist__st_ = (expr);                                    \
        if (tdist__st_ != TDIST_OK) return tdist__st_;                         \
    } while (0)

/* Jump to label with st set if expr is not TDIST_OK. */
#define TDIST_CHECK_GOTO(expr, st, label)                                      \
    do {                                                                       \
        (st) = (expr);                                                         \
        if ((st) != TDIST_OK) goto label;                                      \
    } while (0)

/* Argument check at the top of a public function. */
#define TDIST_ARG_CHECK(cond, fn)                                              \
    do {                                                                       \
        if (!(cond))                                                           \
            return tdist__error(TDIST_ERR_INVALID_ARG, "%s: invalid argument: %s", \
                                (fn), #cond);                                  \
    } while (0)

/* Evaluate a system call expression, retrying while it fails with EINTR.
 * Yields the call's result; errno is preserved for the caller. */
#define TDIST_SYSCALL(res, expr)                                               \
    do {                                                                       \
        (res) = (expr);                                                        \
    } while ((res) == -1 && errno == EINTR)

/* Whether the CPU has PREFETCHW (fetch a line for writing). Thread-safe. */
bool tdist__cpu_has_prefetchw(void);

/* --------------------------------------------------------------- logging */

void tdist__log(tdist_log_level_t level, const char *file, int line, const char *fmt, ...)
    TDIST_PRINTF(4, 5);

/* The level (log.c), negative until TDIST_LOG has been read. */
extern _Atomic int tdist__log_level_v;

/* Whether messages of lvl are logged: one load once the level is known. */
static inline bool tdist__log_on(tdist_log_level_t lvl)
{
    int v = atomic_load_explicit(&tdist__log_level_v, memory_order_relaxed);
    if (__builtin_expect(v < 0, 0)) v = (int)tdist_log_level();
    return v >= (int)lvl;
}

#define TDIST_LOG_AT(lvl, ...)                                                 \
    do {                                                                       \
        if (tdist__log_on(lvl)) tdist__log((lvl), __FILE__, __LINE__, __VA_ARGS__); \
    } while (0)
#define TDIST_LOGE(...) TDIST_LOG_AT(TDIST_LOG_ERROR, __VA_ARGS__)
#define TDIST_LOGW(...) TDIST_LOG_AT(TDIST_LOG_WARN, __VA_ARGS__)
#define TDIST_LOGI(...) TDIST_LOG_AT(TDIST_LOG_INFO, __VA_ARGS__)
#define TDIST_LOGD(...) TDIST_LOG_AT(TDIST_LOG_DEBUG, __VA_ARGS__)

/* ---------------------------------------------------------------- clocks */

/* Monotonic clock in nanoseconds / milliseconds. */
uint64_t tdist__now_ns(void);
int64_t tdist__now_ms(void);

/* Deadline helpers. A timeout_ms < 0 means "no deadline" (INT64_MAX).
 * tdist__deadline_ms may read the coarse clock (timeouts of a second or
 * more: see util.c); tdist__deadline_exact_ms always reads the fine one
 * and is never early, for a caller that turns the deadline back into a
 * timeout someone else measures (the store's get and wait). */
int64_t tdist__deadline_ms(int64_t timeout_ms);
int64_t tdist__deadline_exact_ms(int64_t timeout_ms);
/* Milliseconds left until deadline, clamped to [0, INT32_MAX]: ready to pass
 * to poll()/epoll_wait(). */
int tdist__ms_left(int64_t deadline_ms);

/* Sleep for ms milliseconds (restarts on EINTR). */
void tdist__sleep_ms(int ms);

/* ------------------------------------------------------------------- env */

/* Read an integer from environment variable name. Returns TDIST_OK and
 * writes *out when the variable is set and is a whole number in [lo, hi];
 * TDIST_ERR_INVALID_ARG (message names the variable and value) when set but
 * malformed; TDIST_ERR_NOT_SUPPORTED when unset (out untouched). */
tdist_status_t tdist__env_int(const char *name, int64_t lo, int64_t hi, int64_t *out);

/* Parse a whole number in [lo, hi] from s (entire string). 0 on success. */
int tdist__parse_int(const char *s, int64_t lo, int64_t hi, int64_t *out);

/* The default timeout in ms for blocking operations: TDIST_TIMEOUT_MS if set
 * and valid, else fallback_ms. */
int64_t tdist__default_timeout_ms(int64_t fallback_ms);

/* ----------------------------------------------------------------- misc */

/* strdup that returns NULL on NULL. */
char *tdist__strdup(const char *s);

/* Format into a malloc'd string. NULL on allocation failure. */
char *tdist__asprintf(const char *fmt, ...) TDIST_PRINTF(1, 2);

/* 64-bit FNV-1a over len bytes at data, continuing from h: start with
 * TDIST__FNV_INIT, feed more bytes by passing the result back. Not
 * cryptographic: for hash tables and for tags and fingerprints that every
 * rank computes alike. Pure; thread-safe; never blocks. */
uint64_t tdist__fnv1a(uint64_t h, const void *data, size_t len);
/* The offset basis every tdist hash starts from. (Not the published FNV
 * basis 14695981039346656037: tdist's tags and fingerprints were made with
 * this one, and ranks compare them.) */
#define TDIST__FNV_INIT 1469598103934665603ull

/* tdist_reduce without its argument checks, for callers that made them
 * already (a valid dtype/op pair, dst == a, dst == b or no overlap):
 * dst = a op b over count elements. For a few elements it saves more
 * than the reduction costs. Thread-safe; never blocks. */
void tdist__reduce_unchecked(void *dst, const void *a, const void *b, size_t count,
                             tdist_dtype_t dtype, tdist_redop_t op);
/* dst = a + b over count f32 values, dst overlapping neither input, every
 * pointer 4-byte aligned: the CPU's best kernel without tdist_reduce's
 * dispatch (which costs as much as the sum of a few hundred bytes, on the
 * small all_reduce's latency path). The same bits as tdist_reduce's SUM.
 * Thread-safe; never blocks. */
void tdist__sum_f32(float *dst, const float *a, const float *b, size_t count);

/* dst = a + b for a few floats (a loss, a norm, a count: at most 16 f32 or
 * f64, SUM, AVG or PREMUL_SUM's add), inline where the kernel dispatch
 * would cost more than the adds; false, having done nothing, otherwise.
 * Element by element, as the kernels add: the same bits. */
static inline bool tdist__sum_few(void *dst, const void *a, const void *b, size_t count,
                                  tdist_dtype_t dtype, tdist_redop_t op)
{
    if (count > 16 || (op != TDIST_SUM && op != TDIST_AVG && op != TDIST_PREMUL_SUM))
        return false;
    const unsigned char *pa = a, *pb = b;
    unsigned char *pd = dst;
#define TDIST__SUM_FEW(T)                                                      \
    for (size_t i = 0; i < count; i++) {                                       \
        T x, y;                                                                \
        memcpy(&x, pa + sizeof x * i, sizeof x);                               \
        memcpy(&y, pb + sizeof y * i, sizeof y);                               \
        x += y;                                                                \
        memcpy(pd + sizeof x * i, &x, sizeof x);                               \
    }                                                                          \
    return true
    if (dtype == TDIST_F32) { TDIST__SUM_FEW(float); }
    if (dtype == TDIST_F64) { TDIST__SUM_FEW(double); }
#undef TDIST__SUM_FEW
    return false;
}

/* One round of a spin-wait: tells the CPU (and a hypervisor) that this
 * thread only polls. */
static inline void tdist__cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* tdist_dtype_size, inline for the collectives' hot paths: the size of
 * one element (0 for an invalid dtype). */
static inline size_t tdist__dtype_size(tdist_dtype_t dt)
{
    static const unsigned char size[TDIST_DTYPE_COUNT] = {
        [TDIST_F32] = 4, [TDIST_F64] = 8, [TDIST_F16] = 2, [TDIST_BF16] = 2,
        [TDIST_I8] = 1,  [TDIST_U8] = 1,  [TDIST_I32] = 4, [TDIST_I64] = 8,
    };
    return (unsigned)dt < TDIST_DTYPE_COUNT ? size[dt] : 0;
}

#endif /* TDIST_CORE_INTERNAL_H */
