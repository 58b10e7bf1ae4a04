/* tests/pg/test_pg_fr.c — rule 5 on real processes: the flight recorder
 * and tdist-fr explain a hang. Three ranks run five all_reduces, then rank
 * 2 goes wrong before the sixth collective: it skips it (and issues the
 * next one, a barrier), issues a different one (another count), stops
 * (SIGSTOP), is killed (SIGKILL), or deadlocks in its own code. For each:
 * every rank that failed dumped its ring as JSON, rank 2's ring is read
 * whatever became of it, and tdist-fr names rank 2 and seq 6 and exits 1.
 * Rank 0 runs the analyzer while rank 2 is still as the scenario left it,
 * then ends it. While rank 2 deadlocks, every rank answers SIGUSR1 with a
 * live dump, from which alone tdist-fr names rank 2 as the peer the other
 * two are waiting on. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"
#include "proc.h"
#include "tdist/pg.h"

#define FR_TOOL TDIST_BIN_DIR "/tools/tdist-fr/tdist-fr"

typedef enum fr_case { FR_SKIP, FR_DIFFERENT, FR_STOP, FR_KILL, FR_DEADLOCK } fr_case_t;

typedef struct fr_arg {
    fr_case_t c;
    char dir[512];
    volatile int pid1, pid2; /* ranks 1 and 2's pids (shared mapping) */
} fr_arg_t;

static bool exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* Wait (bounded) until dir holds rank r's dump of the world group. */
static void wait_dump(const char *dir, int r)
{
    char p[700];
    snprintf(p, sizeof p, "%s/tdist-fr.r%d.world.json", dir, r);
    double t0 = tdist_test_now_ms();
    while (!exists(p) && tdist_test_now_ms() - t0 < 10000 * tdist_test_timeout_mult())
        usleep(20 * 1000);
    if (!exists(p)) FAIL("no dump %s", p);
}

/* Rank 2 goes wrong where the others issue their sixth collective. */
static void rank2_goes_wrong(fr_arg_t *a, tdist_pg_t *pg, float *x)
{
    switch (a->c) {
    case FR_SKIP:
        (void)tdist_barrier(pg, NULL, NULL);
        break;
    case FR_DIFFERENT:
        (void)tdist_all_reduce(pg, x, x, 3, TDIST_F32, TDIST_SUM, NULL, NULL);
        break;
    case FR_STOP:
        raise(SIGSTOP);
        break;
    case FR_KILL:
        raise(SIGKILL);
        break;
    case FR_DEADLOCK: /* stuck in its own code, between collectives */
        for (int i = 0; i < 6000; i++) usleep(10 * 1000);
        break;
    }
}

/* Copy dir's JSON dump of world rank r into dir/live. */
static void copy_dump(const char *dir, int r)
{
    char from[700], to[720];
    snprintf(from, sizeof from, "%s/tdist-fr.r%d.world.json", dir, r);
    snprintf(to, sizeof to, "%s/live/tdist-fr.r%d.world.json", dir, r);
    char *j = slurp(from);
    FILE *f = fopen(to, "w");
    ASSERT_TRUE(j && f);
    fputs(j, f);
    fclose(f);
    free(j);
}

/* Rank 0, while ranks 0 and 1 wait in seq 6 and rank 2 sits in its own
 * code: live dumps of every rank (SIGUSR1 to ranks 1 and 2,
 * tdist_flight_dump here), copied alone into dir/live, where tdist-fr
 * names rank 2 as missing, running, and as the rank both waits are on.
 * Dumped again until the waits have noted their peer (they do when they
 * stop spinning), for a bounded time. */
static void live_check(fr_arg_t *a)
{
    char live[600];
    snprintf(live, sizeof live, "%s/live", a->dir);
    ASSERT_TRUE(mkdir(live, 0700) == 0 || errno == EEXIST);
    const char *argv[] = {FR_TOOL, live, NULL};
    ASSERT_TRUE(a->pid1 > 0 && a->pid2 > 0);
    double t0 = tdist_test_now_ms();
    for (int round = 0;; round++) {
        ASSERT_OK(tdist_flight_dump("live check", NULL));
        ASSERT_EQ(kill(a->pid1, SIGUSR1), 0);
        ASSERT_EQ(kill(a->pid2, SIGUSR1), 0);
        wait_dump(a->dir, 1);
        wait_dump(a->dir, 2);
        usleep(50 * 1000); /* the signalled ranks' dump threads */
        for (int r = 0; r < 3; r++) copy_dump(a->dir, r);
        run_t r;
        run(argv, 30, "tdist-fr live", &r);
        bool named = strstr(r.out, "rank 0: in it (still waiting") &&
                     strstr(r.out, "rank 1: in it (still waiting") &&
                     strstr(r.out, "; waiting on rank 2)\n  rank 1") &&
                     strstr(r.out, "; waiting on rank 2)\n  rank 2");
        if (named || tdist_test_now_ms() - t0 > 10000 * tdist_test_timeout_mult()) {
            printf("live dumps, round %d:\n%s", round, r.out);
            ASSERT_TRUE(r.exited && r.code == 1);
            ASSERT_CONTAINS(r.out, "first divergence: rank 2 is missing from all_reduce(f32, 2, "
                                   "sum) seq 6 of group world; ranks 0, 1 waited");
            ASSERT_CONTAINS(r.out, "pid");
            ASSERT_CONTAINS(r.out, "running)");
            ASSERT_TRUE(named);
            run_free(&r);
            return;
        }
        run_free(&r);
        usleep(100 * 1000);
    }
}

/* tdist-fr's options on the killed-rank records: --json says the same as
 * the text (rank 2 missing from seq 6, ranks 0 and 1 in it), --ranks
 * keeps only the listed ranks' summary lines, and --group of a group the
 * records do not hold finds nothing (exit 0). */
static void analyze_options(const fr_arg_t *a)
{
    const char *json[] = {FR_TOOL, "--json", a->dir, NULL};
    run_t r;
    run(json, 30, "tdist-fr --json", &r);
    printf("%s", r.out);
    ASSERT_TRUE(r.exited && r.code == 1);
    ASSERT_TRUE(strncmp(r.out, "{\"problems\":[", 13) == 0);
    ASSERT_CONTAINS(r.out, "{\"kind\":\"missing\",\"group\":\"world\"");
    ASSERT_CONTAINS(r.out, "\"seq\":6,\"missing_ranks\":[2],\"entries\":[");
    ASSERT_CONTAINS(r.out, "\"call\":\"all_reduce(f32, 2, sum)\"");
    ASSERT_CONTAINS(r.out, "{\"world_rank\":2,\"group\":\"world\",\"rank\":2,\"size\":3,");
    ASSERT_CONTAINS(r.out, "\"process\":\"gone\"");
    run_free(&r);

    const char *only2[] = {FR_TOOL, "--ranks", "2", a->dir, NULL};
    run(only2, 30, "tdist-fr --ranks 2", &r);
    ASSERT_TRUE(r.exited && r.code == 1);
    ASSERT_CONTAINS(r.out, "  rank 2 group world (rank 2 of 3, pid ");
    ASSERT_TRUE(strstr(r.out, "  rank 0 group world (") == NULL);
    ASSERT_TRUE(strstr(r.out, "  rank 1 group world (") == NULL);
    run_free(&r);

    const char *other[] = {FR_TOOL, "--group", "no-such-group", a->dir, NULL};
    run(other, 30, "tdist-fr --group", &r);
    ASSERT_TRUE(r.exited && r.code == 0);
    ASSERT_TRUE(strstr(r.out, "first divergence") == NULL);
    run_free(&r);
}

/* Rank 0: the analyzer on the directory, while rank 2 is as the scenario
 * left it. */
static void analyze(fr_arg_t *a)
{
    wait_dump(a->dir, 0);
    wait_dump(a->dir, 1);
    if (a->c == FR_SKIP || a->c == FR_DIFFERENT) wait_dump(a->dir, 2);
    char ring2[700];
    snprintf(ring2, sizeof ring2, "%s/tdist-fr.r2.world.ring", a->dir);
    ASSERT_TRUE(exists(ring2));
    const char *argv[] = {FR_TOOL, a->dir, NULL};
    run_t r;
    run(argv, 30, "tdist-fr", &r);
    printf("%s", r.out);
    ASSERT_TRUE(r.exited && r.code == 1);
    switch (a->c) {
    case FR_SKIP:
        ASSERT_CONTAINS(r.out, "first divergence: ranks issued different collectives as seq 6 "
                               "of group world");
        ASSERT_CONTAINS(r.out, "rank 2: barrier  <- differs in op");
        break;
    case FR_DIFFERENT:
        ASSERT_CONTAINS(r.out, "seq 6 of group world");
        ASSERT_CONTAINS(r.out, "rank 2: all_reduce(f32, 3, sum)  <- differs in count");
        break;
    default:
        ASSERT_CONTAINS(r.out, "first divergence: rank 2 is missing from all_reduce(f32, 2, "
                               "sum) seq 6 of group world; ranks 0, 1 waited");
        ASSERT_CONTAINS(r.out, "last completed all_reduce(f32, 2, sum) seq 5");
        ASSERT_CONTAINS(r.out, a->c == FR_STOP ? "stopped (SIGSTOP" : "gone (killed");
        /* 3 s waits: they stopped spinning and noted their peer */
        if (a->c == FR_STOP) ASSERT_CONTAINS(r.out, "; it waited on rank 2)\n  rank 1");
        break;
    }
    run_free(&r);
    if (a->c == FR_KILL) analyze_options(a);
    if (a->c == FR_STOP) kill(a->pid2, SIGKILL);
}

/* Ranks 0 and 1 while rank 2 deadlocks in its own code: they wait in
 * seq 6 (rank 0 on its engine thread, rank 1 on its own) with a timeout
 * far off; rank 0 checks the live dumps, then kills rank 2, which fails
 * both waits at once (a lost peer); then the analysis of a killed rank. */
static void others_while_deadlocked(fr_arg_t *a, int rank, tdist_pg_t *pg, float *x)
{
    tdist_coll_opts_t o;
    tdist_coll_opts_init(&o);
    o.timeout_ms = (int64_t)(60000 * tdist_test_timeout_mult());
    if (rank == 1) {
        ASSERT_TRUE(tdist_all_reduce(pg, x, x, 2, TDIST_F32, TDIST_SUM, &o, NULL) != TDIST_OK);
        return;
    }
    tdist_work_t *w = NULL;
    ASSERT_OK(tdist_all_reduce(pg, x, x, 2, TDIST_F32, TDIST_SUM, &o, &w));
    live_check(a);
    ASSERT_EQ(kill(a->pid2, SIGKILL), 0);
    ASSERT_TRUE(tdist_work_wait(w, -1) != TDIST_OK);
    tdist_work_free(w);
    analyze(a);
}

static void fr_body(int rank, int n, void *arg)
{
    (void)n;
    fr_arg_t *a = arg;
    if (rank == 1) a->pid1 = (int)getpid(); /* before any collective: rank 0 signals them */
    if (rank == 2) a->pid2 = (int)getpid();
    tdist_world_t *w;
    tdist_pg_t *pg;
    tdist_test_open_world(&w, &pg, (int64_t)(1000 * tdist_test_timeout_mult()));
    float x[3] = {1, 2, 3};
    for (int i = 0; i < 5; i++) ASSERT_OK(tdist_all_reduce(pg, x, x, 2, TDIST_F32, TDIST_SUM, NULL, NULL));
    if (rank == 2) {
        rank2_goes_wrong(a, pg, x);
    } else if (a->c == FR_DEADLOCK) {
        others_while_deadlocked(a, rank, pg, x);
    } else {
        tdist_status_t st = a->c == FR_SKIP ? tdist_all_reduce(pg, x, x, 2, TDIST_F32, TDIST_SUM, NULL, NULL)
                                            : tdist_all_reduce(pg, x, x, 2, TDIST_F32, TDIST_SUM, NULL, NULL);
        ASSERT_TRUE(st != TDIST_OK);
        if (rank == 0) analyze(a);
    }
    tdist_pg_destroy(pg);
    tdist_world_destroy(w);
}

static void run_case(fr_case_t c)
{
    fr_arg_t *a = mmap(NULL, sizeof *a, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    ASSERT_TRUE(a != MAP_FAILED);
    memset(a, 0, sizeof *a);
    a->c = c;
    snprintf(a->dir, sizeof a->dir, "%s/fr", tdist_test_tmpdir());
    char env[600];
    snprintf(env, sizeof env, "TDIST_FR_DIR=%s", a->dir);
    const char *envs[] = {env, NULL};
    tdist_ranks_opts_t o;
    tdist_ranks_opts_init(&o, 3);
    o.env = envs;
    o.kill_others_after_ms = -1;
    tdist_rank_result_t res[3];
    tdist_test_spawn_ranks(&o, fr_body, a, res);
    char d[128];
    for (int r = 0; r < 2; r++)
        if (!res[r].exited || res[r].code != 0)
            FAIL("rank %d %s", r, tdist_test_describe(&res[r], d, sizeof d));
    bool killed = c == FR_STOP || c == FR_KILL || c == FR_DEADLOCK;
    if (killed ? !(res[2].signaled && res[2].sig == SIGKILL) : !(res[2].exited && res[2].code == 0))
        FAIL("rank 2 %s", tdist_test_describe(&res[2], d, sizeof d));
    munmap(a, sizeof *a);
}

TEST(pg_fr_rank_skips_a_collective, 60) { run_case(FR_SKIP); }
TEST(pg_fr_rank_issues_another_collective, 60) { run_case(FR_DIFFERENT); }
TEST(pg_fr_rank_stopped, 60) { run_case(FR_STOP); }
TEST(pg_fr_rank_killed, 60) { run_case(FR_KILL); }
TEST(pg_fr_rank_deadlocked_in_user_code, 60) { run_case(FR_DEADLOCK); }

/* TDIST_LOG=trace (here tdist_log_set_level): one line per collective as
 * it ends, with its group, seq, call, route and status. */
static void trace_body(int rank, int n, void *arg)
{
    (void)n;
    (void)arg;
    char path[600];
    snprintf(path, sizeof path, "%s/trace.%d", tdist_test_tmpdir(), rank);
    FILE *f = fopen(path, "w");
    ASSERT_TRUE(f != NULL);
    int saved = dup(2);
    ASSERT_TRUE(saved >= 0 && dup2(fileno(f), 2) == 2);
    tdist_log_set_level(TDIST_LOG_TRACE);
    tdist_world_t *w;
    tdist_pg_t *pg;
    tdist_test_open_world(&w, &pg, (int64_t)(20000 * tdist_test_timeout_mult()));
    float x[2] = {1, 2};
    for (int i = 0; i < 3; i++)
        ASSERT_OK(tdist_all_reduce(pg, x, x, 2, TDIST_F32, TDIST_SUM, NULL, NULL));
    tdist_log_set_level(TDIST_LOG_OFF);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    fclose(f);
    char *log = slurp(path);
    for (int s = 1; s <= 3; s++) {
        char want[160];
        snprintf(want, sizeof want, "rank %d group world seq %d all_reduce(f32, 2, sum) ", rank, s);
        const char *at = strstr(log, want);
        if (!at) FAIL("no trace line '%s' in:\n%s", want, log);
        const char *eol = strchr(at, '\n');
        ASSERT_TRUE(eol && eol - at > 4 && memcmp(eol - 3, " ok", 3) == 0);
        /* the route and algorithm coll/ chose reached the entry (a call
         * run on its caller's thread writes it only once it posted) */
        const char *tp = getenv("TDIST_TRANSPORT");
        const char *route = tp && strcmp(tp, "tcp") == 0 ? " fused/direct " : " shm_line/shm_tiny ";
        const char *r = strstr(at, route);
        if (!r || r > eol) FAIL("no route '%s' in trace line '%.*s'", route, (int)(eol - at), at);
    }
    free(log);
    tdist_pg_destroy(pg);
    tdist_world_destroy(w);
}

TEST(pg_fr_log_trace_one_line_per_collective, 60) { tdist_test_run_ranks(2, trace_body, NULL); }
