/* tests/tools/test_train_digits.c — the README's main job, end to end:
 * examples/train_digits under tdistrun on 2 and 4 ranks (default backend:
 * shared memory), on the digits data set of Debian's python3-sklearn
 * (scripts/test.sh installs it; unpacked here into the test's tmpdir).
 * The shards are uneven and every epoch is a Join. It must reach a test
 * accuracy of 0.95 and end with identical parameters on every rank. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proc.h"

#define TDISTRUN TDIST_BIN_DIR "/tools/tdistrun/tdistrun"
#define DIGITS TDIST_BIN_DIR "/examples/train_digits"
#define DIGITS_GZ "/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz"

TEST(tdistrun_train_digits_demo_2_and_4_ranks, 120)
{
    FILE *f = fopen(DIGITS_GZ, "r");
    if (!f) FAIL("%s is missing: install python3-sklearn (scripts/test.sh does)", DIGITS_GZ);
    fclose(f);
    char *csv = tmp_path("digits.csv");
    char cmd[600];
    snprintf(cmd, sizeof cmd, "gzip -dc '%s' > '%s'", DIGITS_GZ, csv);
    ASSERT_EQ(system(cmd), 0);
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
