/* tests/core/test_error.c — status names, thread-local last error, logging switch. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "core/internal.h"
#include "harness.h"

TEST(core_status_str_names_every_code, 10)
{
    ASSERT_EQ(TDIST_OK, 0);
    for (int st = TDIST_ERR_JOINED; st <= TDIST_INPROGRESS; st++) {
        const char *s = tdist_status_str((tdist_status_t)st);
        ASSERT_TRUE(strncmp(s, "TDIST_", 6) == 0);
        ASSERT_TRUE(strcmp(s, "TDIST_UNKNOWN_STATUS") != 0);
        if (st < 0) ASSERT_TRUE(strstr(s, "TDIST_ERR_") == s);
    }
    ASSERT_STREQ(tdist_status_str((tdist_status_t)-999), "TDIST_UNKNOWN_STATUS");
    ASSERT_STREQ(tdist_version(), TDIST_VERSION_STRING);
}

static void *other_thread(void *arg)
{
    (void)arg;
    /* a fresh thread starts with no error and its own buffer */
    if (tdist_last_error()[0] != '\0') return (void *)1;
    tdist__error(TDIST_ERR_TIMEOUT, "thread error %d", 7);
    return NULL;
}

TEST(core_last_error_is_thread_local, 10)
{
    tdist_clear_error();
    ASSERT_STATUS(tdist__error(TDIST_ERR_INVALID_ARG, "main %s", "error"), TDIST_ERR_INVALID_ARG);
    pthread_t t;
    void *ret = (void *)2;
    ASSERT_EQ(pthread_create(&t, NULL, other_thread, NULL), 0);
    ASSERT_EQ(pthread_join(t, &ret), 0);
    ASSERT_TRUE(ret == NULL);
    ASSERT_STREQ(tdist_last_error(), "main error");
    ASSERT_STATUS(tdist__error_context(TDIST_ERR_INVALID_ARG, "rank %d", 3), TDIST_ERR_INVALID_ARG);
    ASSERT_STREQ(tdist_last_error(), "rank 3: main error");
    ASSERT_STATUS(tdist__error_errno(EADDRINUSE, "bind 127.0.0.1:%d", 5), TDIST_ERR_ADDR_IN_USE);
    ASSERT_CONTAINS(tdist_last_error(), "bind 127.0.0.1:5: ");
    ASSERT_STATUS(tdist__error_errno(ECONNREFUSED, "x"), TDIST_ERR_CONNECTION);
    tdist_clear_error();
    ASSERT_STREQ(tdist_last_error(), "");
}

/* Logging is silent by default and prints only at or above its level. */
TEST(core_logging_silent_by_default, 10)
{
    int fds[2];
    ASSERT_EQ(pipe(fds), 0);
    int saved = dup(STDERR_FILENO);
    ASSERT_TRUE(saved >= 0);
    ASSERT_TRUE(dup2(fds[1], STDERR_FILENO) >= 0);
    unsetenv("TDIST_LOG");
    ASSERT_EQ(tdist_log_level(), TDIST_LOG_OFF);
    tdist__error(TDIST_ERR_INTERNAL, "not printed");
    TDIST_LOGE("not printed either");
    tdist_log_set_level(TDIST_LOG_WARN);
    TDIST_LOGI("info is below warn");
    TDIST_LOGW("warning %d", 42);
    tdist_log_set_level(TDIST_LOG_OFF);
    fflush(stderr);
    dup2(saved, STDERR_FILENO);
    close(fds[1]);
    char buf[4096] = {0};
    ssize_t n = read(fds[0], buf, sizeof buf - 1);
    close(fds[0]);
    ASSERT_TRUE(n > 0);
    ASSERT_CONTAINS(buf, "WARN");
    ASSERT_CONTAINS(buf, "warning 42");
    ASSERT_TRUE(strstr(buf, "not printed") == NULL);
    ASSERT_TRUE(strstr(buf, "below warn") == NULL);
}

TEST(core_env_int_parsing, 10)
{
    int64_t v = -1;
    setenv("TDIST_TEST_X", "123", 1);
    ASSERT_OK(tdist__env_int("TDIST_TEST_X", 0, 1000, &v));
    ASSERT_EQ(v, 123);
    setenv("TDIST_TEST_X", "12a", 1);
    ASSERT_STATUS(tdist__env_int("TDIST_TEST_X", 0, 1000, &v), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "TDIST_TEST_X=\"12a\"");
    setenv("TDIST_TEST_X", "5000", 1);
    ASSERT_STATUS(tdist__env_int("TDIST_TEST_X", 0, 1000, &v), TDIST_ERR_INVALID_ARG);
    unsetenv("TDIST_TEST_X");
    ASSERT_STATUS(tdist__env_int("TDIST_TEST_X", 0, 1000, &v), TDIST_ERR_NOT_SUPPORTED);
    ASSERT_EQ(v, 123);
    setenv("TDIST_TIMEOUT_MS", "2500", 1);
    ASSERT_EQ(tdist__default_timeout_ms(7), 2500);
    setenv("TDIST_TIMEOUT_MS", "-3", 1);
    ASSERT_EQ(tdist__default_timeout_ms(7), 7);
}
