/* tests/tools/test_tdist_bench.c — the collective benchmark, run as a real
 * program under the built launcher with 2 ranks.
 *
 * Each run goes to files in the test's temporary directory (fork + exec,
 * bounded wait), then the rows rank 0 printed are parsed: one per size,
 * the expected sizes in order, 0 wrong elements, a positive time, and the
 * RESULT lines. Bad flags must exit 2; a corrupted element must be caught.
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "proc.h"

#define BENCH_RUN TDIST_BIN_DIR "/tools/tdistrun/tdistrun"
#define BENCH_BIN TDIST_BIN_DIR "/tools/tdist-bench/tdist-bench"

#define BENCH_FAIL(r, ...)                                                     \
    do {                                                                       \
        char msg_[512];                                                        \
        snprintf(msg_, sizeof msg_, __VA_ARGS__);                              \
        FAIL("%s (exit %d)\n--- stdout:\n%s\n--- stderr:\n%s", msg_, (r).code, (r).out, (r).err); \
    } while (0)

/* Parse the rows of rank 0 ("[rank 0]  bytes count type redop time algbw
 * busbw wrong") and check them against the expected sizes. */
static void check_rows(const run_t *r, const char *op, const char *redop,
                       double bus_factor, const size_t *sizes, int nsizes)
{
    int row = 0;
    const char *line = r->out;
    for (int guard = 0; line && *line && guard < 10000; guard++) {
        const char *eol = strchr(line, '\n');
        static const char prefix[] = "[rank 0] ";
        if (strncmp(line, prefix, sizeof prefix - 1) == 0) {
            const char *p = line + sizeof prefix - 1;
            size_t bytes, count;
            char type[16], rop[32];
            double t, algbw, busbw;
            long wrong;
            if (sscanf(p, " %zu %zu %15s %31s %lf %lf %lf %ld", &bytes, &count, type, rop, &t,
                       &algbw, &busbw, &wrong) == 8) {
                if (row >= nsizes) BENCH_FAIL(*r, "%s: more than %d rows", op, nsizes);
                if (bytes != sizes[row])
                    BENCH_FAIL(*r, "%s: row %d has %zu bytes, want %zu", op, row, bytes,
                               sizes[row]);
                if (count != bytes / 4) BENCH_FAIL(*r, "%s: row %d count %zu", op, row, count);
                if (strcmp(type, "f32") != 0 || strcmp(rop, redop) != 0)
                    BENCH_FAIL(*r, "%s: row %d type %s redop %s", op, row, type, rop);
                /* algbw = bytes / time, busbw = algbw x the nccl-tests
                 * factor (2 ranks: 1 or 1/2). Both are printed with 3
                 * decimals and the time with 3, so the tolerance is the
                 * printing's: half a unit of the bandwidth's last digit
                 * plus what rounding the time by 0.0005 us can move. */
                double want_alg = (double)bytes / (t * 1e3);
                double want_bus = want_alg * bus_factor;
                double tol_alg = 0.0006 + want_alg * (0.00051 / t);
                double tol_bus = 0.0006 + want_bus * (0.00051 / t);
                if (!(t > 0.0) || fabs(algbw - want_alg) > tol_alg ||
                    fabs(busbw - want_bus) > tol_bus)
                    BENCH_FAIL(*r, "%s: row %d time %f algbw %f (want %f) busbw %f (want %f)", op,
                               row, t, algbw, want_alg, busbw, want_bus);
                if (wrong != 0) BENCH_FAIL(*r, "%s: row %d has %ld wrong elements", op, row, wrong);
                row++;
            }
        }
        line = eol ? eol + 1 : NULL;
    }
    if (row != nsizes) BENCH_FAIL(*r, "%s: %d rows, want %d", op, row, nsizes);
}

TEST(tdistrun_bench_collectives_2_ranks, 240)
{
    static const char *const ops[] = {"all_reduce", "broadcast", "all_gather", "reduce_scatter",
                                      "all_to_all"};
    static const size_t sizes[] = {8, 64, 512, 4096, 32768, 65536}; /* MAX ends */
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
        const char *argv[] = {BENCH_RUN, "--nproc-per-node", "2", "--grace-period", "1",
                              BENCH_BIN, "-o", ops[i], "-b", "8", "-e", "64K", "-f", "8",
                              "-n", "3", "-w", "1", "-d", "f32", "-r", "sum", NULL};
        run_t r;
        run(argv, 60, ops[i], &r);
        if (r.code != 0) BENCH_FAIL(r, "%s: expected exit 0", ops[i]);
        bool red = strcmp(ops[i], "all_reduce") == 0 || strcmp(ops[i], "reduce_scatter") == 0;
        bool half = strcmp(ops[i], "all_reduce") != 0 && strcmp(ops[i], "broadcast") != 0;
        check_rows(&r, ops[i], red ? "sum" : "-", half ? 0.5 : 1.0, sizes, 6);
        char want[128];
        snprintf(want, sizeof want, "[rank 0] RESULT %s_f32%s_time_8B ", ops[i],
                 red ? "_sum" : "");
        if (!strstr(r.out, want)) BENCH_FAIL(r, "no \"%s\"", want);
        snprintf(want, sizeof want, "[rank 0] RESULT %s_f32%s_busbw_64KiB ", ops[i],
                 red ? "_sum" : "");
        if (!strstr(r.out, want)) BENCH_FAIL(r, "no \"%s\"", want);
        snprintf(want, sizeof want, "[rank 0] RESULT %s_f32%s_wrong_elements 0 elements", ops[i],
                 red ? "_sum" : "");
        if (!strstr(r.out, want)) BENCH_FAIL(r, "no \"%s\"", want);
        if (strstr(r.out, "[rank 1]")) BENCH_FAIL(r, "rank 1 printed to stdout");
        run_free(&r);
    }
}

/* -k: samples of several calls. A fixed batch is named in the header; auto
 * prints each size's batch and the same rows as without batches, and an
 * 8-byte call that takes well under the ~100 us a sample aims at must have
 * been batched (the batch comes from the median of 20 warm-up calls; the
 * row's time from the timed ones: a loaded machine may make both slow). */
TEST(tdistrun_bench_batched_samples, 120)
{
    static const size_t sizes[] = {8, 512, 32768};
    const char *fixed[] = {BENCH_RUN, "--nproc-per-node", "2", "--grace-period", "1", BENCH_BIN,
                           "-o", "all_reduce", "-b", "8", "-e", "32K", "-f", "64", "-n", "3",
                           "-w", "1", "-k", "4", NULL};
    run_t r;
    run(fixed, 60, "batch4", &r);
    if (r.code != 0) BENCH_FAIL(r, "-k 4: expected exit 0");
    check_rows(&r, "all_reduce", "sum", 1.0, sizes, 3);
    ASSERT_CONTAINS(r.out, "median sample of 4 calls");
    run_free(&r);

    const char *autob[] = {BENCH_RUN, "--nproc-per-node", "2", "--grace-period", "1", BENCH_BIN,
                           "-o", "all_reduce", "-b", "8", "-e", "32K", "-f", "64", "-n", "3",
                           "-w", "20", "-k", "auto", NULL};
    run(autob, 60, "batch_auto", &r);
    if (r.code != 0) BENCH_FAIL(r, "-k auto: expected exit 0");
    check_rows(&r, "all_reduce", "sum", 1.0, sizes, 3);
    for (size_t i = 0; i < 3; i++) {
        char want[64];
        snprintf(want, sizeof want, "[rank 0] # %zu bytes: ", sizes[i]);
        const char *at = strstr(r.out, want);
        int calls = 0;
        if (!at || sscanf(at + strlen(want), "%d calls per sample", &calls) != 1 || calls < 1 ||
            calls > 1000)
            BENCH_FAIL(r, "no \"%s<1..1000> calls per sample\" line", want);
        double t = 0;
        const char *row = strchr(at, '\n');
        if (!row || sscanf(row + 1, "[rank 0] %*u %*u %*s %*s %lf", &t) != 1)
            BENCH_FAIL(r, "no row after \"%s\"", want);
        if (sizes[i] == 8 && t < 20.0 && calls < 2)
            BENCH_FAIL(r, "8 bytes in %.2f us, yet %d call per sample", t, calls);
    }
    run_free(&r);
}

TEST(tdistrun_bench_detects_wrong_elements, 60)
{
    /* Rank 1 corrupts the last element of its output after each size. */
    setenv("TDIST_BENCH_INJECT_ERROR", "1", 1);
    const char *argv[] = {BENCH_RUN, "--nproc-per-node", "2", "--grace-period", "1", BENCH_BIN,
                          "-o", "all_reduce", "-b", "64", "-e", "512", "-f", "8",
                          "-n", "2", "-w", "0", NULL};
    run_t r;
    run(argv, 60, "inject", &r);
    unsetenv("TDIST_BENCH_INJECT_ERROR");
    if (r.code == 0) BENCH_FAIL(r, "a corrupted element went unnoticed");
    /* The row still prints, with the worst rank's count: 1 wrong element. */
    if (!strstr(r.out, " 1\n")) BENCH_FAIL(r, "no row with 1 wrong element");
    ASSERT_CONTAINS(r.out, "RESULT all_reduce_f32_sum_wrong_elements 2 elements");
    run_free(&r);
}

TEST(tdistrun_bench_bad_flags_exit_2, 30)
{
    static const char *const bad[][5] = {
        {"-x", NULL},
        {"-o", "all_reduce_nope", NULL},
        {"-e", "2G", NULL},                 /* above the 1 GiB buffer limit */
        {"-b", "1M", "-e", "1K", NULL},     /* min > max */
        {"-f", "1", NULL},                  /* would never grow */
        {"-d", "f32", "-r", "band", NULL},  /* band needs an integer dtype */
        {"-n", "0", NULL},
        {"-c", "2", NULL},
        {"-b", "12Q", NULL},
        {"-w", NULL},
        {"-k", "0", NULL},
        {"-k", "1001", NULL},
        {"-k", "autox", NULL},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *argv[8] = {BENCH_BIN};
        int k = 1;
        for (int j = 0; j < 5 && bad[i][j]; j++) argv[k++] = bad[i][j];
        argv[k] = NULL;
        char tag[32];
        snprintf(tag, sizeof tag, "bad%zu", i);
        run_t r;
        run(argv, 20, tag, &r);
        if (r.code != 2) BENCH_FAIL(r, "bad flags #%zu (%s): expected exit 2", i, bad[i][0]);
        ASSERT_CONTAINS(r.err, "usage: ");
        run_free(&r);
    }
    /* -h: usage on stdout, exit 0; and through the launcher a bad flag
     * still fails the job. */
    const char *help[] = {BENCH_BIN, "-h", NULL};
    run_t r;
    run(help, 20, "help", &r);
    if (r.code != 0) BENCH_FAIL(r, "-h: expected exit 0");
    ASSERT_CONTAINS(r.out, "usage: ");
    run_free(&r);
    const char *launched[] = {BENCH_RUN, "--nproc-per-node", "2", BENCH_BIN, "-o", "nope", NULL};
    run(launched, 30, "launched_bad", &r);
    if (r.code == 0) BENCH_FAIL(r, "bad flag under tdistrun: expected a failure");
    ASSERT_CONTAINS(r.err, "unknown op 'nope'");
    run_free(&r);
}
