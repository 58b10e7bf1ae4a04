/* core/error.c — status names and the thread-local last-error message. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/internal.h"

#define ERRBUF_SIZE 2048

static _Thread_local char last_error[ERRBUF_SIZE];

const char *tdist_version(void) { return TDIST_VERSION_STRING; }

const char *tdist_status_str(tdist_status_t st)
{
    switch (st) {
    case TDIST_OK: return "TDIST_OK";
    case TDIST_INPROGRESS: return "TDIST_INPROGRESS";
    case TDIST_ERR_INVALID_ARG: return "TDIST_ERR_INVALID_ARG";
    case TDIST_ERR_NO_MEMORY: return "TDIST_ERR_NO_MEMORY";
    case TDIST_ERR_SYSTEM: return "TDIST_ERR_SYSTEM";
    case TDIST_ERR_TIMEOUT: return "TDIST_ERR_TIMEOUT";
    case TDIST_ERR_REMOTE: return "TDIST_ERR_REMOTE";
    case TDIST_ERR_MISMATCH: return "TDIST_ERR_MISMATCH";
    case TDIST_ERR_ABORTED: return "TDIST_ERR_ABORTED";
    case TDIST_ERR_NOT_SUPPORTED: return "TDIST_ERR_NOT_SUPPORTED";
    case TDIST_ERR_BACKEND: return "TDIST_ERR_BACKEND";
    case TDIST_ERR_INTERNAL: return "TDIST_ERR_INTERNAL";
    case TDIST_ERR_CONNECTION: return "TDIST_ERR_CONNECTION";
    case TDIST_ERR_AUTH: return "TDIST_ERR_AUTH";
    case TDIST_ERR_ADDR_IN_USE: return "TDIST_ERR_ADDR_IN_USE";
    case TDIST_ERR_DUPLICATE: return "TDIST_ERR_DUPLICATE";
    case TDIST_ERR_EARLY_TERMINATION: return "TDIST_ERR_EARLY_TERMINATION";
    case TDIST_ERR_JOINED: return "TDIST_ERR_JOINED";
    }
    return "TDIST_UNKNOWN_STATUS";
}

const char *tdist_last_error(void) { return last_error; }

void tdist_clear_error(void) { last_error[0] = '\0'; }

static void set_message(const char *fmt, va_list ap)
{
    char tmp[ERRBUF_SIZE];
    vsnprintf(tmp, sizeof tmp, fmt, ap); /* tmp: fmt args may point into last_error */
    memcpy(last_error, tmp, sizeof tmp);
}

tdist_status_t tdist__error(tdist_status_t st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    set_message(fmt, ap);
    va_end(ap);
    TDIST_LOGD("error %s: %s", tdist_status_str(st), last_error);
    return st;
}

static tdist_status_t status_of_errno(int err)
{
    switch (err) {
    case ENOMEM: return TDIST_ERR_NO_MEMORY;
    case ETIMEDOUT: return TDIST_ERR_TIMEOUT;
    case EADDRINUSE: return TDIST_ERR_ADDR_IN_USE;
    case ECONNREFUSED:
    case ECONNRESET:
    case ECONNABORTED:
    case EPIPE:
    case ENOTCONN:
    case EHOSTUNREACH:
    case ENETUNREACH: return TDIST_ERR_CONNECTION;
    default: return TDIST_ERR_SYSTEM;
    }
}

tdist_status_t tdist__error_errno(int err, const char *fmt, ...)
{
    char head[ERRBUF_SIZE];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(head, sizeof head, fmt, ap);
    va_end(ap);
    char ebuf[256];
    const char *etxt = strerror_r(err, ebuf, sizeof ebuf); /* GNU variant */
    tdist_status_t st = status_of_errno(err);
    return tdist__error(st, "%.1800s: %s", head, etxt);
}

tdist_status_t tdist__error_context(tdist_status_t st, const char *fmt, ...)
{
    char head[ERRBUF_SIZE];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(head, sizeof head, fmt, ap);
    va_end(ap);
    char tmp[ERRBUF_SIZE];
    if (snprintf(tmp, sizeof tmp, "%s: %s", head, last_error) < 0) return st; /* truncation is fine */
    memcpy(last_error, tmp, sizeof tmp);
    return st;
}
