/*
 * algorithms/quant_coll.c — all_gather and all_to_all of f32 over a
 * 16-bit wire: PyTorch's auto_quantize, bit for bit, blocking or not.
 *
 * A call checks its arguments, allocates one job (its completion context
 * followed by the send and receive staging), encodes sendbuf into the send
 * staging on the caller's thread, and submits the group's all_gather /
 * all_to_all of the wire dtype as an asynchronous work whose on_complete
 * is job_done. pg calls job_done exactly once for a work it accepted, on
 * the engine thread, when the collective completes; on success it decodes
 * the receive staging into the caller's recvbuf, then frees the job and
 * calls the caller's own on_complete. pg stores a work's status only after
 * on_complete has returned, so whoever waits or tests sees TDIST_OK only
 * once recvbuf is decoded. A blocking call is the same route plus a wait:
 * one route, whichever way the caller asks.
 *
 * The wire values are PyTorch's, which core's conversions alone are not:
 *  - f16: PyTorch clamps to +-65504 before the cast (core's
 *    tdist_f32_to_f16 overflows to inf) and gives every NaN the one quiet
 *    NaN (core keeps the top payload bits). So each block is clamped and
 *    its NaNs made canonical first, then converted by core's bulk
 *    tdist_f32_to_f16_n, whose rounding (nearest even, subnormals exact)
 *    is PyTorch's. Decoding is core's tdist_f16_to_f32_n (exact).
 *  - bf16: PyTorch adds 0x8000 to the f32 bits and keeps the top half
 *    (ties away from zero; core's tdist_f32_to_bf16 rounds ties to even),
 *    and decodes with bits << 16 (core would set a NaN's quiet bit). Both
 *    are done here.
 * None of it depends on MXCSR (FTZ/DAZ, rounding mode): integer
 * arithmetic, and core's conversions, which ignore it.
 */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "tdist/algorithms.h"

/* ------------------------------------------------------------ conversions */

static inline uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* The f32 (as bits) whose round-to-nearest-even f16 is PyTorch's FP16 wire
 * value of x, clamp(x, -65504, 65504).half(): beyond +-65504 (inf
 * included) clamped, any NaN made the quiet NaN with x's sign (c10's
 * fp16_ieee_from_fp32_value gives every NaN 0x7E00 | sign). */
static inline uint32_t f16_prep(uint32_t x)
{
    uint32_t sign = x & 0x80000000u, ax = x & 0x7fffffffu;
    return ax > 0x7f800000u ? sign | 0x7fc00000u : ax > 0x477fe000u ? sign | 0x477fe000u : x;
}

/* PyTorch's BFP16 wire value (_FloatToBfloat16Quantized): unsigned 32-bit
 * arithmetic, wrapping as it does for the NaNs just below 2^32. */
static inline uint16_t bf16_wire(uint32_t x) { return (uint16_t)((x + 0x8000u) >> 16); }

/* f16: prepare a block, then core's bulk conversion (round to nearest
 * even, subnormals exact, the same bits on every instruction set; F16C
 * where the CPU has it). */
static void encode(uint16_t *dst, const float *src, size_t n, tdist_dtype_t wire)
{
    if (wire == TDIST_BF16) {
        for (size_t i = 0; i < n; i++) dst[i] = bf16_wire(f32_bits(src[i]));
        return;
    }
    enum { BLOCK = 512 };
    float tmp[BLOCK];
    for (size_t at = 0; at < n; at += BLOCK) {
        size_t k = TDIST_MIN(n - at, (size_t)BLOCK);
        for (size_t i = 0; i < k; i++) {
            uint32_t u = f16_prep(f32_bits(src[at + i]));
            memcpy(tmp + i, &u, sizeof u);
        }
        tdist_f32_to_f16_n(dst + at, tmp, k);
    }
}

static void decode(float *dst, const uint16_t *src, size_t n, tdist_dtype_t wire)
{
    if (wire == TDIST_F16) {
        tdist_f16_to_f32_n(dst, src, n);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)src[i] << 16;
        memcpy(dst + i, &u, sizeof u);
    }
}

static tdist_status_t check_wire(const char *fn, const tdist_pg_t *pg, tdist_dtype_t wire);

tdist_status_t tdist_quant_encode(uint16_t *dst, const float *src, size_t n, tdist_dtype_t wire)
{
    static const char *fn = "tdist_quant_encode";
    TDIST_CHECK(check_wire(fn, NULL, wire));
    if (n > 0 && (!dst || !src))
        return tdist__error(TDIST_ERR_INVALID_ARG, "%s: %s is NULL with %zu elements", fn,
                            dst ? "src" : "dst", n);
    encode(dst, src, n, wire);
    return TDIST_OK;
}

tdist_status_t tdist_quant_decode(float *dst, const uint16_t *src, size_t n, tdist_dtype_t wire)
{
    static const char *fn = "tdist_quant_decode";
    TDIST_CHECK(check_wire(fn, NULL, wire));
    if (n > 0 && (!dst || !src))
        return tdist__error(TDIST_ERR_INVALID_ARG, "%s: %s is NULL with %zu elements", fn,
                            dst ? "src" : "dst", n);
    decode(dst, src, n, wire);
    return TDIST_OK;
}

/* -------------------------------------------------------------- arguments */

static tdist_status_t arg_err(const char *fn, const tdist_pg_t *pg, const char *fmt, ...)
    TDIST_PRINTF(3, 4);

static tdist_status_t arg_err(const char *fn, const tdist_pg_t *pg, const char *fmt, ...)
{
    char m[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    if (!pg) return tdist__error(TDIST_ERR_INVALID_ARG, "%s: %s", fn, m);
    return tdist__error(TDIST_ERR_INVALID_ARG, "%s: rank %d group %s: %s", fn, tdist_pg_rank(pg),
                        tdist_pg_name(pg), m);
}

static tdist_status_t check_wire(const char *fn, const tdist_pg_t *pg, tdist_dtype_t wire)
{
    if (wire != TDIST_F16 && wire != TDIST_BF16)
        return arg_err(fn, pg, "wire format must be f16 or bf16, not %s (%d)",
                       tdist_dtype_name(wire), (int)wire);
    return TDIST_OK;
}

typedef enum qc_op { QC_ALL_GATHER, QC_ALL_TO_ALL } qc_op_t;

/* The job: completion context, then the staging (send, then receive). */
typedef struct qc_job {
    tdist_dtype_t wire;
    float *out;      /* the caller's recvbuf: nout elements */
    size_t nout;
    void (*user_cb)(tdist_status_t status, void *user_data);
    void *user_data;
    uint16_t *send16; /* nsend wire values */
    uint16_t *recv16; /* nout wire values */
} qc_job_t;

/* Check a call's arguments; *nsend / *nout: elements of sendbuf / recvbuf. */
static tdist_status_t check_args(const char *fn, const tdist_pg_t *pg, const void *sendbuf,
                                 const void *recvbuf, size_t count, tdist_dtype_t dtype,
                                 tdist_dtype_t wire, qc_op_t op, size_t *nsend, size_t *nout)
{
    if (!pg) return arg_err(fn, NULL, "pg is NULL");
    if (dtype != TDIST_F32)
        return arg_err(fn, pg, "dtype must be f32, not %s (%d)", tdist_dtype_name(dtype),
                       (int)dtype);
    TDIST_CHECK(check_wire(fn, pg, wire));
    int size = tdist_pg_size(pg);
    size_t total, bytes;
    if (__builtin_mul_overflow(count, (size_t)size, &total) ||
        __builtin_mul_overflow(total, sizeof(float), &bytes) || bytes > SIZE_MAX - sizeof(qc_job_t))
        return arg_err(fn, pg, "count %zu x group size %d x 4 bytes overflows size_t", count, size);
    if (count > 0 && !sendbuf) return arg_err(fn, pg, "sendbuf is NULL with count %zu", count);
    if (count > 0 && !recvbuf) return arg_err(fn, pg, "recvbuf is NULL with count %zu", count);
    *nsend = op == QC_ALL_GATHER ? count : total;
    *nout = total;
    return TDIST_OK;
}

/* ------------------------------------------------------------- the route */

/* on_complete of the wire collective: engine thread, exactly once. */
static void job_done(tdist_status_t st, void *arg)
{
    qc_job_t *j = arg;
    void (*cb)(tdist_status_t, void *) = j->user_cb;
    void *user_data = j->user_data;
    if (st == TDIST_OK) decode(j->out, j->recv16, j->nout, j->wire);
    free(j);
    if (cb) cb(st, user_data);
}

static tdist_status_t quant_coll(const char *fn, qc_op_t op, tdist_pg_t *pg, const void *sendbuf,
                                 void *recvbuf, size_t count, tdist_dtype_t dtype,
                                 tdist_dtype_t wire, const tdist_coll_opts_t *opts,
                                 tdist_work_t **work)
{
    size_t nsend = 0, nout = 0;
    TDIST_CHECK(check_args(fn, pg, sendbuf, recvbuf, count, dtype, wire, op, &nsend, &nout));
    size_t staging = (nsend + nout) * sizeof(uint16_t);
    qc_job_t *j = malloc(sizeof *j + staging);
    if (!j)
        return tdist__error(TDIST_ERR_NO_MEMORY, "%s: rank %d group %s: out of memory (%zu bytes "
                            "of staging)", fn, tdist_pg_rank(pg), tdist_pg_name(pg), staging);
    tdist_coll_opts_t o;
    if (opts)
        o = *opts;
    else
        tdist_coll_opts_init(&o);
    *j = (qc_job_t){.wire = wire, .out = recvbuf, .nout = nout, .user_cb = o.on_complete,
                    .user_data = o.user_data};
    j->send16 = (uint16_t *)(void *)(j + 1);
    j->recv16 = j->send16 + nsend;
    encode(j->send16, sendbuf, nsend, wire);
    o.on_complete = job_done;
    o.user_data = j;
    tdist_work_t *w = NULL;
    tdist_status_t st = op == QC_ALL_GATHER
                            ? tdist_all_gather(pg, j->send16, j->recv16, count, wire, &o, &w)
                            : tdist_all_to_all(pg, j->send16, j->recv16, count, wire, &o, &w);
    if (st != TDIST_OK) { /* no work: job_done will not run */
        free(j);
        return tdist__error_context(st, "%s", fn);
    }
    if (work) {
        *work = w;
        return TDIST_OK;
    }
    st = tdist_work_wait(w, -1);
    if (st != TDIST_OK) tdist__error_context(st, "%s", fn);
    tdist_work_free(w);
    return st;
}

tdist_status_t tdist_quant_all_gather(tdist_pg_t *pg, const void *sendbuf, void *recvbuf,
                                      size_t count, tdist_dtype_t dtype, tdist_dtype_t wire,
                                      const tdist_coll_opts_t *opts, tdist_work_t **work)
{
    return quant_coll("tdist_quant_all_gather", QC_ALL_GATHER, pg, sendbuf, recvbuf, count, dtype,
                      wire, opts, work);
}

tdist_status_t tdist_quant_all_to_all(tdist_pg_t *pg, const void *sendbuf, void *recvbuf,
                                      size_t count, tdist_dtype_t dtype, tdist_dtype_t wire,
                                      const tdist_coll_opts_t *opts, tdist_work_t **work)
{
    return quant_coll("tdist_quant_all_to_all", QC_ALL_TO_ALL, pg, sendbuf, recvbuf, count, dtype,
                      wire, opts, work);
}
