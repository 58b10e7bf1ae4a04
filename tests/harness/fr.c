/* tests/harness/fr.c — see fr.h. */
#include "fr.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "proc.h"
#include "tdist/pg.h"

const char *fr_dir(void)
{
    static char dir[600];
    snprintf(dir, sizeof dir, "%s/fr", tdist_test_tmpdir());
    return dir;
}

void fr_run_ranks(int n, tdist_rank_fn body)
{
    char env[700], trace[700];
    snprintf(env, sizeof env, "TDIST_FR_DIR=%s", fr_dir());
    snprintf(trace, sizeof trace, "TDIST_TRACE=%s/trace.json", tdist_test_tmpdir());
    const char *envs[] = {env, trace, NULL};
    tdist_test_run_ranks_env(n, body, NULL, envs);
}

char *fr_dump_world(int rank)
{
    int files = 0;
    ASSERT_OK(tdist_flight_dump("test", &files));
    ASSERT_GE(files, 1);
    char path[700];
    snprintf(path, sizeof path, "%s/tdist-fr.r%d.world.json", fr_dir(), rank);
    return slurp(path);
}

char *fr_trace_kinds(const char *a, const char *b)
{
    if (access("/usr/bin/python3", X_OK) != 0) {
        printf("no /usr/bin/python3: the timelines are written, not parsed\n");
        return NULL;
    }
    const char *argv[] = {"/usr/bin/python3", TDIST_SOURCE_DIR "/tools/trace_kinds.py", a, b,
                          NULL};
    run_t r;
    run(argv, 60, "trace_kinds", &r);
    printf("trace_kinds %s%s:\n%s%s", a, b ? " and the other rank's" : "", r.out, r.err);
    ASSERT_TRUE(r.exited && r.code == 0);
    char *out = strdup(r.out);
    run_free(&r);
    return out;
}
