/*
 * tdist/core.h — status codes, error messages, logging, dtypes, reduction
 * kernels and half-precision conversion.
 *
 * Conventions that hold for every tdist header:
 *  - every call that can fail returns tdist_status_t; TDIST_OK is 0, errors
 *    are negative. On failure tdist_last_error() says what failed and why.
 *  - out-parameters are written only on success.
 *  - the library never frees what the caller allocated, never exits, aborts
 *    or prints unless logging was switched on (TDIST_LOG).
 */
#ifndef TDIST_CORE_H
#define TDIST_CORE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(TDIST_BUILDING_LIBRARY)
#define TDIST_API __attribute__((visibility("default")))
#else
#define TDIST_API
#endif

#define TDIST_VERSION_MAJOR 0
#define TDIST_VERSION_MINOR 1
#define TDIST_VERSION_PATCH 0
#define TDIST_VERSION_STRING "0.1.0"

/* The library's version as "MAJOR.MINOR.PATCH". Static string; thread-safe. */
TDIST_API const char *tdist_version(void);

/* ------------------------------------------------------------------------ */
/* Status codes                                                             */
/* ------------------------------------------------------------------------ */

typedef enum tdist_status {
    TDIST_OK = 0,
    TDIST_INPROGRESS = 1,           /* asynchronous work not finished yet */
    TDIST_ERR_INVALID_ARG = -1,     /* a bad argument; nothing was done */
    TDIST_ERR_NO_MEMORY = -2,
    TDIST_ERR_SYSTEM = -3,          /* a system call failed; message has errno text */
    TDIST_ERR_TIMEOUT = -4,         /* a deadline passed */
    TDIST_ERR_REMOTE = -5,          /* a peer or server reported an error */
    TDIST_ERR_MISMATCH = -6,        /* ranks disagree (collective fingerprint, world size, shapes) */
    TDIST_ERR_ABORTED = -7,         /* the object was aborted */
    TDIST_ERR_NOT_SUPPORTED = -8,   /* valid request this build or backend cannot do */
    TDIST_ERR_BACKEND = -9,         /* the backend library (e.g. MPI) failed */
    TDIST_ERR_INTERNAL = -10,       /* a bug in tdist */
    TDIST_ERR_CONNECTION = -11,     /* a peer or server is unreachable or closed the connection */
    TDIST_ERR_AUTH = -12,           /* refused: wrong or missing shared secret */
    TDIST_ERR_ADDR_IN_USE = -13,    /* the address to listen on is taken */
    TDIST_ERR_DUPLICATE = -14,      /* two processes claim one rank */
    TDIST_ERR_EARLY_TERMINATION = -15, /* a rank ran out of inputs (Join) */
    TDIST_ERR_JOINED = -16          /* needs a rank that has joined (Join); nothing was done */
} tdist_status_t;

/* Name of a status code ("TDIST_ERR_TIMEOUT"); "TDIST_UNKNOWN_STATUS" for
 * anything else. Static string; thread-safe; never fails. */
TDIST_API const char *tdist_status_str(tdist_status_t st);

/* The message of the last error set on the calling thread ("" if none).
 * The string is owned by tdist and valid until the next tdist call on this
 * thread. Thread-local: each thread sees only its own errors. */
TDIST_API const char *tdist_last_error(void);

/* Forget the calling thread's last error. Thread-local; never fails. */
TDIST_API void tdist_clear_error(void);

/* ------------------------------------------------------------------------ */
/* Logging                                                                  */
/* ------------------------------------------------------------------------ */

typedef enum tdist_log_level {
    TDIST_LOG_OFF = 0,
    TDIST_LOG_ERROR = 1,
    TDIST_LOG_WARN = 2,
    TDIST_LOG_INFO = 3,
    TDIST_LOG_DEBUG = 4,
    TDIST_LOG_TRACE = 5 /* debug, and one line per collective, send and recv as it ends */
} tdist_log_level_t;

/* The current log level. On first use it is read from the environment
 * variable TDIST_LOG (error|warn|info|debug|trace; anything else or unset: off).
 * Thread-safe. Logging writes whole lines to stderr and nothing else. */
TDIST_API tdist_log_level_t tdist_log_level(void);

/* Override the log level for this process (wins over TDIST_LOG).
 * Thread-safe (atomic). */
TDIST_API void tdist_log_set_level(tdist_log_level_t level);

/* ------------------------------------------------------------------------ */
/* Data types                                                               */
/* ------------------------------------------------------------------------ */

typedef enum tdist_dtype {
    TDIST_F32 = 0,
    TDIST_F64 = 1,
    TDIST_F16 = 2,   /* IEEE 754 binary16, stored as uint16_t */
    TDIST_BF16 = 3,  /* bfloat16, stored as uint16_t */
    TDIST_I8 = 4,
    TDIST_U8 = 5,
    TDIST_I32 = 6,
    TDIST_I64 = 7,
    TDIST_DTYPE_COUNT = 8
} tdist_dtype_t;

/* Size in bytes of one element; 0 for an invalid dtype. Thread-safe. */
TDIST_API size_t tdist_dtype_size(tdist_dtype_t dtype);

/* Short name ("f32", "bf16", ...); "invalid" for an invalid dtype. */
TDIST_API const char *tdist_dtype_name(tdist_dtype_t dtype);

/* 1 for f32, f64, f16, bf16; 0 for integer types and invalid values. */
TDIST_API int tdist_dtype_is_float(tdist_dtype_t dtype);

/* Half-precision conversions. f32 -> f16/bf16 rounds to nearest, ties to
 * even; NaN stays NaN (quiet), infinities and signed zeros are kept, values
 * beyond the range become infinity, subnormals are handled exactly.
 * f16/bf16 -> f32 is exact. Pure functions; thread-safe. */
TDIST_API uint16_t tdist_f32_to_f16(float f);
TDIST_API float tdist_f16_to_f32(uint16_t h);
TDIST_API uint16_t tdist_f32_to_bf16(float f);
TDIST_API float tdist_bf16_to_f32(uint16_t h);

/* Bulk conversions of n elements; src and dst must not overlap.
 * Caller owns both buffers. Thread-safe; never blocks. */
TDIST_API void tdist_f32_to_f16_n(uint16_t *dst, const float *src, size_t n);
TDIST_API void tdist_f16_to_f32_n(float *dst, const uint16_t *src, size_t n);
TDIST_API void tdist_f32_to_bf16_n(uint16_t *dst, const float *src, size_t n);
TDIST_API void tdist_bf16_to_f32_n(float *dst, const uint16_t *src, size_t n);

/* ------------------------------------------------------------------------ */
/* Reduction ops and local reduction kernels                                */
/* ------------------------------------------------------------------------ */

typedef enum tdist_redop {
    TDIST_SUM = 0,
    TDIST_PROD = 1,
    TDIST_MIN = 2,
    TDIST_MAX = 3,
    TDIST_AVG = 4,      /* reduced as SUM, then divided by the contributor count */
    TDIST_BAND = 5,     /* integer dtypes only */
    TDIST_BOR = 6,      /* integer dtypes only */
    TDIST_BXOR = 7,     /* integer dtypes only */
    TDIST_PREMUL_SUM = 8, /* each input scaled by a factor, then summed (collectives) */
    TDIST_REDOP_COUNT = 9
} tdist_redop_t;

/* Short name ("sum", "band", ...); "invalid" for an invalid op. */
TDIST_API const char *tdist_redop_name(tdist_redop_t op);

/* Whether op can reduce dtype: TDIST_OK, or TDIST_ERR_INVALID_ARG with a
 * message such as "reduce op band is defined for integer dtypes only, got f32".
 * Thread-safe. */
TDIST_API tdist_status_t tdist_redop_check(tdist_redop_t op, tdist_dtype_t dtype);

/* dst[i] = a[i] op b[i] for i < count. dst may be the same pointer as a or
 * b (in place); otherwise the three must not overlap. AVG and PREMUL_SUM
 * reduce as SUM here (see tdist_scale for the division/scaling).
 * f16/bf16 are computed in f32 and rounded once per element.
 * Buffers need no alignment. Caller owns all buffers. Never blocks;
 * thread-safe. Returns TDIST_ERR_INVALID_ARG for a bad dtype/op pair. */
TDIST_API tdist_status_t tdist_reduce(void *dst, const void *a, const void *b,
                                      size_t count, tdist_dtype_t dtype, tdist_redop_t op);

/* buf[i] = buf[i] * factor, for floating dtypes only (f16/bf16 computed in
 * f32, rounded once); an integer dtype is TDIST_ERR_INVALID_ARG — use
 * tdist_divide. The finishing step of PREMUL_SUM and float AVG.
 * Caller owns buf. Thread-safe; never blocks. */
TDIST_API tdist_status_t tdist_scale(void *buf, size_t count, tdist_dtype_t dtype, double factor);

/* buf[i] = buf[i] / divisor (integer division truncating toward zero for
 * integer dtypes). The finishing step of AVG. divisor must be > 0. */
TDIST_API tdist_status_t tdist_divide(void *buf, size_t count, tdist_dtype_t dtype, int64_t divisor);

/* Fill buf with the identity element of op for dtype (0 for SUM/AVG/BOR/
 * BXOR/PREMUL_SUM, 1 for PROD, the largest value (+inf for floats) for MIN,
 * the smallest (-inf) for MAX, all bits set for BAND). */
TDIST_API tdist_status_t tdist_fill_identity(void *buf, size_t count, tdist_dtype_t dtype, tdist_redop_t op);

#ifdef __cplusplus
}
#endif
#endif /* TDIST_CORE_H */
