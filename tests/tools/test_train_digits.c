/* tests/tools/test_train_digits.c — the digits example, end to end:
 * examples/train_digits under tdistrun on 2 and 4 ranks (default backend:
 * shared memory), on the digits data set of Debian's python3-sklearn
 * (scripts/test.sh installs it; unpacked here into the test's tmpdir).
 * The shards are uneven and every epoch is a Join. It must reach a test
 * accuracy of 0.95 and end with identical parameters on every rank; with
 * --hook (fp16, PowerSGD, int8) it must name the hook and end with
 * identical parameters, and a bad --hook must exit 2; so must post-local
 * SGD (--local-sgd K) and DiLoCo (--diloco H), which also print their
 * bytes per iteration, and a bad period exits 2. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proc.h"

#define TDISTRUN TDIST_BIN_DIR "/tools/tdistrun/tdistrun"
#define DIGITS TDIST_BIN_DIR "/examples/train_digits"
#define DIGITS_GZ "/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz"

/* The data set, unpacked into the test's tmpdir (a path of its own: run()
 * takes tmp_path's rotating buffers too). */
static char *digits_csv(void)
{
    static char path[512];
    FILE *f = fopen(DIGITS_GZ, "r");
    if (!f) FAIL("%s is missing: install python3-sklearn (scripts/test.sh does)", DIGITS_GZ);
    fclose(f);
    char *csv = tmp_path("digits.csv");
    char cmd[600];
    snprintf(cmd, sizeof cmd, "gzip -dc '%s' > '%s'", DIGITS_GZ, csv);
    ASSERT_EQ(system(cmd), 0);
    snprintf(path, sizeof path, "%s", csv);
    return path;
}

TEST(tdistrun_train_digits_demo_2_and_4_ranks, 120)
{
    char *csv = digits_csv();
    static const char *const nprocs[] = {"2", "4"};
    for (int i = 0; i < 2; i++) {
        const char *argv[] = {TDISTRUN, "--nproc-per-node", nprocs[i], DIGITS, csv, "15", NULL};
        char tag[32];
        snprintf(tag, sizeof tag, "digits%s", nprocs[i]);
        run_t r;
        run(argv, 100, tag, &r);
        if (!r.exited || r.code != 0) FAIL("train_digits on %s ranks: exit %d\n%s\n%s", nprocs[i], r.code, r.out, r.err);
        const char *fin = strstr(r.out, "[rank 0] final test_accuracy=");
        if (!fin) FAIL("no final line in:\n%s", r.out);
        double acc = atof(fin + strlen("[rank 0] final test_accuracy="));
        if (acc < 0.95) FAIL("test accuracy %.2f < 0.95 on %s ranks:\n%s", acc, nprocs[i], r.out);
        ASSERT_CONTAINS(fin, "params_identical=yes\n");
        ASSERT_CONTAINS(r.out, "[rank 0] epoch 15/15 ");
        run_free(&r);
    }
}

/* 2 ranks, 3 epochs: PowerSGD averages plainly for two epochs' iterations
 * and compresses in the third. */
TEST(tdistrun_train_digits_hooks, 30)
{
    char *csv = digits_csv();
    static const char *const hooks[] = {"fp16", "powersgd:2", "int8"};
    for (int i = 0; i < 3; i++) {
        const char *argv[] = {TDISTRUN, "--nproc-per-node", "2", DIGITS, csv, "3", "--hook",
                              hooks[i], NULL};
        char tag[16];
        snprintf(tag, sizeof tag, "hook%d", i);
        run_t r;
        run(argv, 20, tag, &r);
        if (!r.exited || r.code != 0)
            FAIL("--hook %s: exit %d\n%s\n%s", hooks[i], r.code, r.out, r.err);
        char want[96];
        for (int rank = 0; rank < 2; rank++) {
            snprintf(want, sizeof want, "[rank %d] train_digits: rank %d of 2: hook %s, ", rank,
                     rank, hooks[i]);
            ASSERT_CONTAINS(r.out, want);
        }
        snprintf(want, sizeof want, "[rank 0] hook %s: ", hooks[i]);
        const char *line = strstr(r.out, want);
        if (!line) FAIL("no '%s' line in:\n%s", want, r.out);
        if (i == 1 && !strstr(line, "per iteration once compressing"))
            FAIL("PowerSGD never compressed:\n%s", r.out);
        const char *fin = strstr(r.out, "[rank 0] final test_accuracy=");
        if (!fin) FAIL("no final line in:\n%s", r.out);
        ASSERT_CONTAINS(fin, "params_identical=yes\n");
        run_free(&r);
    }
    /* a bad --hook: the usage and exit 2, alone and under the launcher */
    static const char *const bad[] = {"fp32", "powersgd", "powersgd:0", "powersgd:2x", ""};
    for (int i = 0; i < 5; i++) {
        const char *argv[] = {DIGITS, csv, "3", "--hook", bad[i], NULL};
        run_t r;
        run(argv, 10, "bad_hook", &r);
        if (!r.exited || r.code != 2)
            FAIL("--hook '%s': exit %d, want 2\n%s", bad[i], r.code, r.err);
        ASSERT_CONTAINS(r.err, "usage: ");
        run_free(&r);
    }
    const char *argv[] = {TDISTRUN, "--nproc-per-node", "2", DIGITS, csv, "--hook", NULL};
    run_t r;
    run(argv, 20, "bad_hook_tdistrun", &r);
    if (!r.exited || r.code != 2)
        FAIL("--hook without a value under tdistrun: exit %d, want 2\n%s", r.code, r.err);
    ASSERT_CONTAINS(r.err, "--hook needs a value");
    run_free(&r);
}

TEST(tdistrun_train_digits_local_sgd_and_diloco, 50)
{
    char *csv = digits_csv();
    static const char *const opt[] = {"--local-sgd", "--diloco", "--diloco"};
    static const char *const val[] = {"4", "4", "4:int8"};
    static const char *const mode[] = {"local-sgd:4", "diloco:4", "diloco:4:int8"};
    for (int i = 0; i < 3; i++) {
        /* 3 epochs: local SGD averages gradients for two, then parameters */
        const char *argv[] = {TDISTRUN, "--nproc-per-node", "2", DIGITS, csv, "3", opt[i], val[i],
                              NULL};
        run_t r;
        run(argv, 25, mode[i], &r);
        if (!r.exited || r.code != 0)
            FAIL("%s %s: exit %d\n%s\n%s", opt[i], val[i], r.code, r.out, r.err);
        char want[96];
        snprintf(want, sizeof want, "[rank 1] train_digits: rank 1 of 2: mode %s, ", mode[i]);
        ASSERT_CONTAINS(r.out, want);
        snprintf(want, sizeof want, "[rank 0] mode %s: ", mode[i]);
        const char *line = strstr(r.out, want);
        if (!line) FAIL("no '%s' line in:\n%s", want, r.out);
        /* fewer bytes than f32 gradients every step */
        double per = atof(line + strlen(want)), of = 0;
        const char *f = strstr(line, "of f32's ");
        if (f) of = atof(f + 9);
        if (!(per > 0 && of > 0 && per < of)) FAIL("bytes per iteration %g of %g:\n%s", per, of, line);
        const char *fin = strstr(r.out, "[rank 0] final test_accuracy=");
        if (!fin) FAIL("no final line in:\n%s", r.out);
        ASSERT_CONTAINS(fin, "params_identical=yes\n");
        run_free(&r);
    }
    static const char *const bad[][2] = {{"--local-sgd", "0"}, {"--diloco", "x"},
                                         {"--diloco", "10001"}, {"--hook", "fp16"},
                                         {"--diloco", "4:fp8"}, {"--local-sgd", "4:bf16"}};
    for (int i = 0; i < 6; i++) {
        const char *argv[] = {DIGITS, csv, "3", bad[i][0], bad[i][1], "--diloco", "4", NULL};
        run_t r;
        run(argv, 10, "bad_period", &r);
        if (!r.exited || r.code != 2)
            FAIL("%s %s: exit %d, want 2\n%s", bad[i][0], bad[i][1], r.code, r.err);
        ASSERT_CONTAINS(r.err, "usage: ");
        run_free(&r);
    }
}
