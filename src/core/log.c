/* core/log.c — logging, off unless TDIST_LOG (or tdist_log_set_level) says so. */
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "core/internal.h"

#define LEVEL_UNREAD (-1)
_Static_assert(LEVEL_UNREAD < TDIST_LOG_OFF, "tdist__log_on reads a negative level as unread");

_Atomic int tdist__log_level_v = LEVEL_UNREAD;
#define log_level tdist__log_level_v

static int level_from_env(void)
{
    const char *v = getenv("TDIST_LOG");
    if (!v) return TDIST_LOG_OFF;
    if (!strcasecmp(v, "error")) return TDIST_LOG_ERROR;
    if (!strcasecmp(v, "warn") || !strcasecmp(v, "warning")) return TDIST_LOG_WARN;
    if (!strcasecmp(v, "info")) return TDIST_LOG_INFO;
    if (!strcasecmp(v, "debug")) return TDIST_LOG_DEBUG;
    if (!strcasecmp(v, "trace")) return TDIST_LOG_TRACE;
    return TDIST_LOG_OFF;
}

tdist_log_level_t tdist_log_level(void)
{
    int lvl = atomic_load_explicit(&log_level, memory_order_relaxed);
    if (lvl == LEVEL_UNREAD) {
        int expected = LEVEL_UNREAD;
        lvl = level_from_env();
        if (!atomic_compare_exchange_strong(&log_level, &expected, lvl)) lvl = expected;
    }
    return (tdist_log_level_t)lvl;
}

void tdist_log_set_level(tdist_log_level_t level)
{
    if ((int)level < TDIST_LOG_OFF) level = TDIST_LOG_OFF;
    if (level > TDIST_LOG_TRACE) level = TDIST_LOG_TRACE;
    atomic_store(&log_level, (int)level);
}

void tdist__log(tdist_log_level_t level, const char *file, int line, const char *fmt, ...)
{
    static const char *names[] = {"off", "ERROR", "WARN", "INFO", "DEBUG", "TRACE"};
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);

    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    localtime_r(&ts.tv_sec, &tm);
    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;
    const char *rank = getenv("RANK");

    /* One write per line so lines from several threads or ranks do not mix. */
    char out[2400];
    int n = snprintf(out, sizeof out, "[tdist %02d:%02d:%02d.%06ld %s pid %d%s%s %s:%d] %s\n",
                     tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000,
                     names[level], (int)getpid(), rank ? " rank " : "", rank ? rank : "",
                     base, line, msg);
    if (n < 0) return;
    if ((size_t)n >= sizeof out) {
        n = (int)sizeof out - 1;
        out[n - 1] = '\n';
    }
    ssize_t w;
    TDIST_SYSCALL(w, write(STDERR_FILENO, out, (size_t)n));
    (void)w;
}
