/* tests/core/test_dtype.c — the dtype table, reduce-op names and the op/dtype check. */
#include <stdio.h>

#include "harness.h"

TEST(core_dtype_table, 10)
{
    static const struct {
        tdist_dtype_t dt;
        const char *name;
        size_t size;
        int is_float;
    } want[] = {
        {TDIST_F32, "f32", 4, 1}, {TDIST_F64, "f64", 8, 1}, {TDIST_F16, "f16", 2, 1},
        {TDIST_BF16, "bf16", 2, 1}, {TDIST_I8, "i8", 1, 0},  {TDIST_U8, "u8", 1, 0},
        {TDIST_I32, "i32", 4, 0}, {TDIST_I64, "i64", 8, 0},
    };
    ASSERT_EQ(sizeof want / sizeof want[0], TDIST_DTYPE_COUNT);
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        ASSERT_STREQ(tdist_dtype_name(want[i].dt), want[i].name);
        ASSERT_EQ(tdist_dtype_size(want[i].dt), want[i].size);
        ASSERT_EQ(tdist_dtype_is_float(want[i].dt), want[i].is_float);
    }
    ASSERT_EQ(tdist_dtype_size(TDIST_F32), sizeof(float));
    ASSERT_EQ(tdist_dtype_size(TDIST_F64), sizeof(double));
    ASSERT_EQ(tdist_dtype_size(TDIST_I64), sizeof(int64_t));
    /* invalid values: size 0, "invalid", not float — never a crash */
    int bad[] = {-1, TDIST_DTYPE_COUNT, 100, -2147483647 - 1};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ASSERT_EQ(tdist_dtype_size((tdist_dtype_t)bad[i]), 0);
        ASSERT_STREQ(tdist_dtype_name((tdist_dtype_t)bad[i]), "invalid");
        ASSERT_EQ(tdist_dtype_is_float((tdist_dtype_t)bad[i]), 0);
    }
}

TEST(core_redop_names, 10)
{
    const char *names[] = {"sum", "prod", "min", "max", "avg", "band", "bor", "bxor", "premul_sum"};
    ASSERT_EQ(sizeof names / sizeof names[0], TDIST_REDOP_COUNT);
    for (int op = 0; op < TDIST_REDOP_COUNT; op++) ASSERT_STREQ(tdist_redop_name((tdist_redop_t)op), names[op]);
    ASSERT_STREQ(tdist_redop_name((tdist_redop_t)-1), "invalid");
    ASSERT_STREQ(tdist_redop_name(TDIST_REDOP_COUNT), "invalid");
}

TEST(core_redop_check_matrix, 10)
{
    for (int op = 0; op < TDIST_REDOP_COUNT; op++) {
        for (int dt = 0; dt < TDIST_DTYPE_COUNT; dt++) {
            int bitwise = op == TDIST_BAND || op == TDIST_BOR || op == TDIST_BXOR;
            tdist_clear_error();
            tdist_status_t st = tdist_redop_check((tdist_redop_t)op, (tdist_dtype_t)dt);
            if (bitwise && tdist_dtype_is_float((tdist_dtype_t)dt)) {
                ASSERT_STATUS(st, TDIST_ERR_INVALID_ARG);
                char want[128];
                snprintf(want, sizeof want, "reduce op %s is defined for integer dtypes only, got %s",
                         tdist_redop_name((tdist_redop_t)op), tdist_dtype_name((tdist_dtype_t)dt));
                ASSERT_STREQ(tdist_last_error(), want);
            } else {
                ASSERT_OK(st);
            }
        }
    }
    ASSERT_STATUS(tdist_redop_check((tdist_redop_t)42, TDIST_F32), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "invalid reduce op 42");
    ASSERT_STATUS(tdist_redop_check((tdist_redop_t)-1, TDIST_F32), TDIST_ERR_INVALID_ARG);
    ASSERT_STATUS(tdist_redop_check(TDIST_SUM, (tdist_dtype_t)8), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "invalid dtype 8");
    ASSERT_STATUS(tdist_redop_check(TDIST_SUM, (tdist_dtype_t)-3), TDIST_ERR_INVALID_ARG);
}
