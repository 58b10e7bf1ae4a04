/* core/dtype.c — the dtype table and reduce-op names (the sizes are
 * tdist__dtype_size's, in core/internal.h, inline for the hot paths). */
#include "core/internal.h"

static const struct {
    const char *name;
    int is_float;
} dtypes[TDIST_DTYPE_COUNT] = {
    [TDIST_F32] = {"f32", 1},  [TDIST_F64] = {"f64", 1}, [TDIST_F16] = {"f16", 1},
    [TDIST_BF16] = {"bf16", 1}, [TDIST_I8] = {"i8", 0},  [TDIST_U8] = {"u8", 0},
    [TDIST_I32] = {"i32", 0},  [TDIST_I64] = {"i64", 0},
};

static const char *const redops[TDIST_REDOP_COUNT] = {
    [TDIST_SUM] = "sum",   [TDIST_PROD] = "prod", [TDIST_MIN] = "min",
    [TDIST_MAX] = "max",   [TDIST_AVG] = "avg",   [TDIST_BAND] = "band",
    [TDIST_BOR] = "bor",   [TDIST_BXOR] = "bxor", [TDIST_PREMUL_SUM] = "premul_sum",
};

static int dtype_valid(tdist_dtype_t dtype) { return (unsigned)dtype < TDIST_DTYPE_COUNT; }

size_t tdist_dtype_size(tdist_dtype_t dtype) { return tdist__dtype_size(dtype); }

const char *tdist_dtype_name(tdist_dtype_t dtype)
{
    return dtype_valid(dtype) ? dtypes[dtype].name : "invalid";
}

int tdist_dtype_is_float(tdist_dtype_t dtype) { return dtype_valid(dtype) ? dtypes[dtype].is_float : 0; }

const char *tdist_redop_name(tdist_redop_t op)
{
    return (unsigned)op < TDIST_REDOP_COUNT ? redops[op] : "invalid";
}

tdist_status_t tdist_redop_check(tdist_redop_t op, tdist_dtype_t dtype)
{
    if ((unsigned)op >= TDIST_REDOP_COUNT)
        return tdist__error(TDIST_ERR_INVALID_ARG, "invalid reduce op %d (valid: 0..%d)", (int)op,
                            TDIST_REDOP_COUNT - 1);
    if (!dtype_valid(dtype))
        return tdist__error(TDIST_ERR_INVALID_ARG, "reduce op %s: invalid dtype %d (valid: 0..%d)",
                            redops[op], (int)dtype, TDIST_DTYPE_COUNT - 1);
    if ((op == TDIST_BAND || op == TDIST_BOR || op == TDIST_BXOR) && dtypes[dtype].is_float)
        return tdist__error(TDIST_ERR_INVALID_ARG,
                            "reduce op %s is defined for integer dtypes only, got %s", redops[op],
                            dtypes[dtype].name);
    return TDIST_OK;
}
