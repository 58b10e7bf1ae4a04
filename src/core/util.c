/* core/util.c — clocks, deadlines, environment parsing, small string helpers,
 * the one hash function (FNV-1a). */
#include <limits.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/internal.h"

uint64_t tdist__now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int64_t tdist__now_ms(void) { return (int64_t)(tdist__now_ns() / 1000000ull); }

/* The coarse clock's tick in ns (0: no coarse clock), read once. */
static uint64_t coarse_tick_ns(void)
{
    static _Atomic int64_t tick = -1;
    int64_t t = atomic_load_explicit(&tick, memory_order_relaxed);
    if (t < 0) {
        struct timespec r;
        t = clock_getres(CLOCK_MONOTONIC_COARSE, &r) == 0 && r.tv_sec == 0 ? r.tv_nsec : 0;
        atomic_store_explicit(&tick, t, memory_order_relaxed);
    }
    return (uint64_t)t;
}

int64_t tdist__deadline_exact_ms(int64_t timeout_ms)
{
    if (timeout_ms < 0) return INT64_MAX;
    /* rounded up: a deadline is reached when tdist__now_ms, which rounds
     * down, gets to it; a wait(0) still means "now" */
    int64_t now = timeout_ms > 0 ? (int64_t)((tdist__now_ns() + 999999ull) / 1000000ull)
                                 : tdist__now_ms();
    return timeout_ms > INT64_MAX - now ? INT64_MAX : now + timeout_ms;
}

/* Every blocking collective computes a deadline, most never need it: the
 * coarse clock costs a third of CLOCK_MONOTONIC (7 vs 23 ns on the test
 * VM). It lags CLOCK_MONOTONIC by less than one tick while ticks come on
 * time, so adding a tick makes the deadline at most one tick (1-4 ms)
 * late and, unless a tick itself came late (a virtual CPU the host did
 * not run), never early; only for timeouts of a second or more, where
 * that is noise. Shorter ones are exact (tdist__deadline_exact_ms). */
int64_t tdist__deadline_ms(int64_t timeout_ms)
{
    if (timeout_ms < 0) return INT64_MAX;
    uint64_t tick = coarse_tick_ns();
    struct timespec ts;
    int64_t now;
    if (timeout_ms < 1000 || tick == 0 || clock_gettime(CLOCK_MONOTONIC_COARSE, &ts) != 0)
        return tdist__deadline_exact_ms(timeout_ms);
    now = (int64_t)(((uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec + tick +
                     999999ull) / 1000000ull);
    if (timeout_ms > INT64_MAX - now) return INT64_MAX;
    return now + timeout_ms;
}

int tdist__ms_left(int64_t deadline_ms)
{
    if (deadline_ms == INT64_MAX) return INT32_MAX;
    int64_t left = deadline_ms - tdist__now_ms();
    if (left < 0) return 0;
    if (left > INT32_MAX) return INT32_MAX;
    return (int)left;
}

void tdist__sleep_ms(int ms)
{
    if (ms <= 0) return;
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {
    }
}

int tdist__parse_int(const char *s, int64_t lo, int64_t hi, int64_t *out)
{
    if (!s || !*s) return -1;
    char *end = NULL;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0') return -1;
    if (v < lo || v > hi) return -1;
    *out = (int64_t)v;
    return 0;
}

tdist_status_t tdist__env_int(const char *name, int64_t lo, int64_t hi, int64_t *out)
{
    const char *v = getenv(name);
    if (!v) return TDIST_ERR_NOT_SUPPORTED;
    int64_t x;
    if (tdist__parse_int(v, lo, hi, &x) != 0)
        return tdist__error(TDIST_ERR_INVALID_ARG,
                            "environment variable %s=\"%s\" is not a whole number in [%lld, %lld]",
                            name, v, (long long)lo, (long long)hi);
    *out = x;
    return TDIST_OK;
}

int64_t tdist__default_timeout_ms(int64_t fallback_ms)
{
    int64_t v;
    const char *s = getenv("TDIST_TIMEOUT_MS");
    if (s && tdist__parse_int(s, 1, INT64_MAX / 2, &v) == 0) return v;
    return fallback_ms;
}

char *tdist__strdup(const char *s)
{
    if (!s) return NULL;
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

char *tdist__asprintf(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0) return NULL;
    char *s = malloc((size_t)n + 1);
    if (!s) return NULL;
    va_start(ap, fmt);
    vsnprintf(s, (size_t)n + 1, fmt, ap);
    va_end(ap);
    return s;
}

uint64_t tdist__fnv1a(uint64_t h, const void *data, size_t len)
{
    const uint8_t *b = data;
    for (size_t i = 0; i < len; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}
