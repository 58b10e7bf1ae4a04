/* tests/ddp/test_ddp_fr.c — DDP's buckets in the flight recorder: one
 * iteration over four single-parameter buckets leaves, in the group's
 * ring, each bucket's ready, launched and reduced events in that order
 * around its all_reduce; tdist_flight_dump writes them as JSON. Each rank
 * writes its own Chrome trace (TDIST_TRACE), and tdist-fr --trace turns
 * the rings into one: a JSON parser (/usr/bin/python3's, in
 * tools/trace_kinds.py) reads both, with spans that nest and are ordered
 * per thread, the backward span with a compute span per bucket, every
 * bucket's three events on both ranks, and the optimizer step the test
 * marks as a span. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fr.h"
#include "harness.h"
#include "proc.h"
#include "tdist/ddp.h"
#include "tdist/pg.h"

#define NP 4
#define COUNT 64

/* After both ranks destroyed their groups: the timeline each wrote
 * (TDIST_TRACE) and tdist-fr --trace over their rings hold the same
 * spans and events, among them the iteration's backward with one compute
 * span and the three events per bucket, and each bucket's reduction. */
static void check_traces(void)
{
    const char *trace = tmp_path("tool_trace.json");
    const char *argv[] = {FR_TOOL, "--trace", trace, fr_dir(), NULL};
    run_t r;
    run(argv, 30, "trace", &r);
    ASSERT_TRUE(r.exited && r.code == 0); /* both ranks completed the same collectives */
    run_free(&r);
    char *tool = fr_trace_kinds(trace, NULL);
    if (!tool) return;
    char *own = fr_trace_kinds(tmp_path("trace.r0.json"), tmp_path("trace.r1.json"));
    ASSERT_CONTAINS(own, "event bucket_ready 8\n"); /* 4 buckets x 2 ranks */
    ASSERT_CONTAINS(own, "event bucket_launched 8\n");
    ASSERT_CONTAINS(own, "event bucket_reduced 8\n");
    ASSERT_CONTAINS(own, "event backward_begin 2\n");
    ASSERT_CONTAINS(own, "span backward 2\n");
    ASSERT_CONTAINS(own, "span compute bucket 8\n");
    ASSERT_CONTAINS(own, "span all_reduce_coalesced 8\n");
    ASSERT_CONTAINS(own, "span optim_step 2\n");
    ASSERT_TRUE(strcmp(tool, own) == 0);
    free(tool);
    free(own);
}

static void ddp_fr_body(int rank, int n, void *arg)
{
    (void)n;
    (void)arg;
    tdist_world_t *w;
    tdist_pg_t *pg;
    tdist_test_open_world(&w, &pg, (int64_t)(20000 * tdist_test_timeout_mult()));
    static float data[NP][COUNT], grad[NP][COUNT];
    tdist_ddp_param_t ps[NP];
    for (int i = 0; i < NP; i++) {
        for (int k = 0; k < COUNT; k++) grad[i][k] = (float)(rank + i);
        ps[i] = (tdist_ddp_param_t){data[i], grad[i], COUNT, TDIST_F32, NULL};
    }
    tdist_ddp_opts_t o;
    tdist_ddp_opts_init(&o);
    o.bucket_cap_bytes = o.first_bucket_bytes = COUNT * sizeof(float);
    tdist_ddp_t *d;
    ASSERT_OK(tdist_ddp_create(pg, ps, NP, NULL, 0, &o, &d));
    ASSERT_OK(tdist_ddp_forward_begin(d));
    for (int i = NP - 1; i >= 0; i--) ASSERT_OK(tdist_ddp_grad_ready(d, (size_t)i));
    ASSERT_OK(tdist_ddp_backward_end(d));
    ASSERT_TRUE(grad[0][0] == 0.5f); /* (0 + 1) / 2: the reduction happened */
    /* the program's own span: the optimizer's step, marked */
    ASSERT_OK(tdist_pg_mark(pg, "optim_step_begin", 1));
    for (int i = 0; i < NP; i++)
        for (int k = 0; k < COUNT; k++) data[i][k] -= 0.1f * grad[i][k];
    ASSERT_OK(tdist_pg_mark(pg, "optim_step_end", 1));
    char *j = fr_dump_world(rank);
    for (int b = 0; b < NP; b++) {
        char want[32];
        snprintf(want, sizeof want, "\"arg\":%d,", b);
        long ready = find_line(j, 0, "\"what\":\"bucket_ready\"", want);
        long launched = find_line(j, 0, "\"what\":\"bucket_launched\"", want);
        long reduced = find_line(j, 0, "\"what\":\"bucket_reduced\"", want);
        if (ready < 0 || launched < 0 || reduced < 0)
            FAIL("bucket %d: events ready %ld launched %ld reduced %ld in %s", b, ready, launched,
                 reduced, j);
        ASSERT_TRUE(ready < launched);
        ASSERT_TRUE(launched < reduced);
        /* its all_reduce was recorded between launch and the reduced event */
        long coll = find_line(j, launched, "\"op\":\"all_reduce", "\"count\":64,");
        if (!(coll > launched)) FAIL("bucket %d: no all_reduce after launch (%ld vs %ld) in %s", b, coll, launched, j);
    }
    free(j);
    tdist_ddp_destroy(d);
    tdist_pg_destroy(pg);
    tdist_world_destroy(w);
}

TEST(ddp_fr_bucket_events_recorded, 60)
{
    fr_run_ranks(2, ddp_fr_body);
    check_traces();
}
