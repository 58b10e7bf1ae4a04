/* tests/mpi/test_mpi.c — the MPI backend (label "mpi"): each test runs one
 * scenario of tests/mpi/mpi_prog.c under
 *
 *   timeout -k 5 T mpirun -np N --oversubscribe --bind-to none
 *           --mca btl self,vader tdist_mpi_prog SCENARIO
 *
 * (T below the test's own deadline, so a hang fails this test, with
 * mpirun's output, and mpirun still gets to kill its ranks), with
 * OMPI_ALLOW_RUN_AS_ROOT=1 and, in sanitizer builds, detect_leaks=0 added
 * to ASAN_OPTIONS for the MPI processes only: Open MPI leaves memory
 * behind at MPI_Finalize that LeakSanitizer would report. The ranks get
 * the test's directory as TMPDIR (Open MPI's session directory stays in
 * /tmp), so the flight-recorder rings of ranks that die with their groups
 * open go with the test's directory, not into /tmp. A test skips
 * (SKIP: ctest lists it as skipped) when mpirun or the program (a build
 * without MPI) is missing. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "tdist/pg.h"

#define PROG TDIST_BIN_DIR "/tests/mpi/tdist_mpi_prog"

static bool can_run(const char *test)
{
    if (system("command -v mpirun >/dev/null 2>&1") != 0) {
        SKIP("mpirun is not installed (Debian: openmpi-bin); the MPI backend is not tested");
    }
    if (access(PROG, X_OK) != 0) {
        SKIP("%s was not built (tdist configured without MPI: TDIST_WITH_MPI=OFF or "
             "no libopenmpi-dev)", PROG);
    }
    return true;
}

typedef struct run {
    int code;     /* exit status of mpirun (124: timeout killed it), -1 odd end */
    double ms;
    char *out;    /* stdout + stderr of mpirun and its ranks (malloc'd) */
} run_t;

/* The whole of file path (malloc'd; "(no output)" when it cannot be read). */
/* "ASAN_OPTIONS='<ours>:detect_leaks=0'" for a child command line: MPI's
 * own allocations would fail LeakSanitizer at exit. */
static const char *asan_env(char *buf, size_t n)
{
    const char *asan = getenv("ASAN_OPTIONS");
    snprintf(buf, n, "ASAN_OPTIONS='%s%sdetect_leaks=0'", asan ? asan : "",
             asan && *asan ? ":" : "");
    return buf;
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        char *none = strdup("(no output)");
        ASSERT_TRUE(none != NULL);
        return none;
    }
    size_t cap = 1 << 16, len = 0, k;
    char *out = malloc(cap + 1);
    ASSERT_TRUE(out != NULL);
    while ((k = fread(out + len, 1, cap - len, f)) > 0) {
        len += k;
        if (len == cap) {
            cap *= 2;
            out = realloc(out, cap + 1);
            ASSERT_TRUE(out != NULL);
        }
    }
    out[len] = '\0';
    fclose(f);
    return out;
}

/* Run `mpirun -np np tdist_mpi_prog scenario` bounded by limit_s. */
static run_t mpi_run(int np, const char *scenario, int limit_s, const char *env)
{
    run_t r = {-1, 0, NULL};
    char outp[512], cmd[4096];
    snprintf(outp, sizeof outp, "%s/mpirun_%s_%d.txt", tdist_test_tmpdir(), scenario, np);
    char asan[1024];
    snprintf(cmd, sizeof cmd,
             "env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
             "OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_rmaps_base_oversubscribe=1 "
             "TMPDIR='%s' OMPI_MCA_orte_tmpdir_base=/tmp "
             "%s %s "
             "timeout -k 5 %d mpirun -np %d --oversubscribe --bind-to none --mca btl self,vader "
             "-x ASAN_OPTIONS -x UBSAN_OPTIONS -x TDIST_BACKEND -x TDIST_TIMEOUT_MS -x TMPDIR "
             "%s %s > '%s' 2>&1",
             tdist_test_tmpdir(), asan_env(asan, sizeof asan), env ? env : "", limit_s, np, PROG,
             scenario, outp);
    double t0 = tdist_test_now_ms();
    int st = system(cmd);
    r.ms = tdist_test_now_ms() - t0;
    if (st != -1 && WIFEXITED(st)) r.code = WEXITSTATUS(st);
    r.out = slurp(outp);
    printf("---- mpirun -np %d %s: exit %d after %.0f ms ----\n%s---- end ----\n", np, scenario,
           r.code, r.ms, r.out);
    fflush(stdout);
    return r;
}

/* The scenario must pass: mpirun exits 0 and rank 0 reports OK. */
static void expect_ok(const char *test, int np, const char *scenario, int limit_s, const char *env)
{
    if (!can_run(test)) return;
    int lim = (int)(limit_s * tdist_test_timeout_mult());
    run_t r = mpi_run(np, scenario, lim, env);
    char want[200];
    snprintf(want, sizeof want, "MPI_PROG OK %s", scenario);
    if (r.code != 0 || !strstr(r.out, want))
        FAIL("mpirun -np %d %s: exit %d (124: timed out after %d s), %s", np, scenario, r.code, lim,
             strstr(r.out, want) ? "OK printed" : "no OK line");
    free(r.out);
}

TEST(mpi_collectives_2_ranks, 100) { expect_ok("mpi_collectives_2_ranks", 2, "matrix", 80, NULL); }
TEST(mpi_collectives_3_ranks, 110) { expect_ok("mpi_collectives_3_ranks", 3, "matrix", 90, NULL); }
TEST(mpi_collectives_4_ranks, 120) { expect_ok("mpi_collectives_4_ranks", 4, "matrix", 100, NULL); }
TEST(mpi_subgroups_and_split, 60) { expect_ok("mpi_subgroups_and_split", 4, "sub", 45, NULL); }
TEST(mpi_mismatch_same_text_as_native_2, 60)
{
    expect_ok("mpi_mismatch_same_text_as_native_2", 2, "mismatch", 45, NULL);
}
TEST(mpi_mismatch_same_text_as_native_3, 60)
{
    expect_ok("mpi_mismatch_same_text_as_native_3", 3, "mismatch", 45, NULL);
}
TEST(mpi_timeout_names_the_op, 40) { expect_ok("mpi_timeout_names_the_op", 2, "timeout", 30, NULL); }
/* tdist-fr on dir: its exit status (-1: it did not exit), *out its output
 * (malloc'd, printed for the test log). */
static int fr_tool(const char *dir, char **out)
{
    char cmd[1400], outp[700];
    snprintf(outp, sizeof outp, "%s/fr.txt", tdist_test_tmpdir());
    snprintf(cmd, sizeof cmd, "'%s/tools/tdist-fr/tdist-fr' '%s' > '%s' 2>&1", TDIST_BIN_DIR, dir,
             outp);
    int st = system(cmd);
    *out = slurp(outp);
    printf("---- tdist-fr %s: ----\n%s", dir, *out);
    return st != -1 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* dir holds rank r's file of the world group ("json": its dump, "ring":
 * its ring). */
static void expect_fr_file(const char *dir, int r, const char *kind)
{
    char p[700];
    snprintf(p, sizeof p, "%s/tdist-fr.r%d.world.%s", dir, r, kind);
    if (access(p, R_OK) != 0) FAIL("rank %d left no %s file %s", r, kind, p);
}

/* Run an fr* scenario of mpi_prog.c on 3 ranks with TDIST_FR_DIR=<tmp>/fr
 * (dir gets it), the analyzer's path, and <tmp>/fr_live.txt (live gets
 * it) for the output of the analysis rank 0 runs itself; more_env: more
 * VAR=value words for the command line, or NULL. */
static run_t fr_run(const char *scenario, char dir[600], char live[600], const char *more_env)
{
    snprintf(dir, 600, "%s/fr", tdist_test_tmpdir());
    snprintf(live, 600, "%s/fr_live.txt", tdist_test_tmpdir());
    char env[2000];
    snprintf(env, sizeof env,
             "TDIST_FR_DIR='%s' MPI_PROG_FR_TOOL='%s/tools/tdist-fr/tdist-fr' MPI_PROG_FR_OUT='%s' %s",
             dir, TDIST_BIN_DIR, live, more_env ? more_env : "");
    return mpi_run(3, scenario, (int)(45 * tdist_test_timeout_mult()), env);
}

/* The run ended well: exit 0 and rank 0's OK line. */
static void expect_fr_ok(const run_t *r, const char *scenario)
{
    char want[100];
    snprintf(want, sizeof want, "MPI_PROG OK %s", scenario);
    if (r->code != 0 || !strstr(r->out, want)) FAIL("mpirun %s: exit %d", scenario, r->code);
}

#define FR_MISSING                                                                                 \
    "first divergence: rank 2 is missing from all_reduce(f32, 2, sum) seq 6 of group world; "      \
    "ranks 0, 1 waited"

/* tdist-fr's per-rank summary line of rank r of the world group, into
 * line[n]. */
static void summary_line(const char *out, int r, char *line, size_t n)
{
    char head[80];
    snprintf(head, sizeof head, "  rank %d group world (rank %d of 3, pid ", r, r);
    const char *at = strstr(out, head);
    if (!at) FAIL("tdist-fr has no summary line of rank %d's record", r);
    size_t len = strcspn(at, "\n");
    snprintf(line, n, "%.*s", (int)(len < n - 1 ? len : n - 1), at);
}

/* tdist-fr's summary line of rank 2 comes from rank 2's own ring or dump
 * (the others' records do not give it): its process in the state proc
 * ("stopped", "gone", "running, from its dump", ...), five entries, the
 * last of them seq 5. */
static void expect_rank2_read(const char *out, const char *proc)
{
    char line[1024], want[200];
    summary_line(out, 2, line, sizeof line);
    snprintf(want, sizeof want, ", %s): 5 entries; last completed all_reduce(f32, 2, sum) seq 5",
             proc);
    if (!strstr(line, want)) FAIL("rank 2's line '%s' lacks '%s'", line, want);
}

/* Ranks 0 and 1's lines under "what each rank was doing" name rank 2 as
 * the peer their wait of seq 6 is on (how: "waiting" while it runs, "it
 * waited" once it ended): the backend's per-peer fingerprint exchange
 * noted it. */
static void expect_waited_on_rank2(const char *out, const char *how)
{
    for (int r = 0; r < 2; r++) {
        char head[64], want[64], line[1024];
        snprintf(head, sizeof head, "\n  rank %d: in it (", r);
        const char *at = strstr(out, head);
        if (!at) FAIL("tdist-fr has no line of rank %d in seq 6", r);
        at++;
        size_t len = strcspn(at, "\n");
        snprintf(line, sizeof line, "%.*s", (int)(len < 1023 ? len : 1023), at);
        snprintf(want, sizeof want, "; %s on rank 2)", how);
        if (!strstr(line, want)) FAIL("rank %d's line '%s' lacks '%s'", r, line, want);
    }
}

/* The flight recorder on the MPI backend: rank 2 never issues the sixth
 * all_reduce; ranks 0 and 1 time out and dump; tdist-fr names rank 2 and
 * seq 6 from the dumps and rank 2's ring. */
TEST(mpi_fr_names_the_missing_rank, 60)
{
    if (!can_run("mpi_fr_names_the_missing_rank")) return;
    char dir[600], live[600], *out;
    run_t r = fr_run("frhang", dir, live, NULL);
    expect_fr_ok(&r, "frhang");
    free(r.out);
    for (int k = 0; k < 2; k++) expect_fr_file(dir, k, "json");
    expect_fr_file(dir, 2, "ring");
    ASSERT_EQ(fr_tool(dir, &out), 1);
    ASSERT_CONTAINS(out, FR_MISSING);
    ASSERT_CONTAINS(out, "route backend, algorithm slot");
    expect_waited_on_rank2(out, "it waited");
    expect_rank2_read(out, "exited");
    free(out);
}

/* The other four scenarios of tests/pg/test_pg_fr.c on the MPI backend
 * (three ranks, five all_reduces, then rank 2 goes wrong before seq 6).
 * A skipped or different collective: the fingerprint exchange fails seq 6
 * on every rank, every rank dumps, and tdist-fr names rank 2's call and
 * the field that differs. */
static void fr_mismatch(const char *scenario, const char *rank2_line)
{
    char dir[600], live[600], *out;
    run_t r = fr_run(scenario, dir, live, NULL);
    expect_fr_ok(&r, scenario);
    free(r.out);
    for (int k = 0; k < 3; k++) expect_fr_file(dir, k, "json");
    ASSERT_EQ(fr_tool(dir, &out), 1);
    ASSERT_CONTAINS(out, "first divergence: ranks issued different collectives as seq 6 of group "
                         "world");
    ASSERT_CONTAINS(out, rank2_line);
    free(out);
}

TEST(mpi_fr_rank_skips_a_collective, 60)
{
    if (!can_run("mpi_fr_rank_skips_a_collective")) return;
    fr_mismatch("frskip", "rank 2: barrier  <- differs in op");
}

TEST(mpi_fr_rank_issues_another_collective, 60)
{
    if (!can_run("mpi_fr_rank_issues_another_collective")) return;
    fr_mismatch("frdiff", "rank 2: all_reduce(f32, 3, sum)  <- differs in count");
}

/* Run scenario (which ends well), where rank 0 ran tdist-fr itself on dir
 * + sub while rank 2 was as the scenario left it; returns that analysis
 * (malloc'd), which found a problem (exit 1). */
static char *fr_in_job(const char *scenario, char dir[600], const char *sub)
{
    char live[600], want[800];
    run_t r = fr_run(scenario, dir, live, NULL);
    expect_fr_ok(&r, scenario);
    snprintf(want, sizeof want, "fr: tdist-fr %s%s exited 1", dir, sub);
    ASSERT_CONTAINS(r.out, want);
    free(r.out);
    char *out = slurp(live);
    printf("---- rank 0's tdist-fr %s%s: ----\n%s", dir, sub, out);
    return out;
}

/* Rank 2 stopped (SIGSTOP): ranks 0 and 1 time out (1 s) and dump; rank 0
 * runs tdist-fr while rank 2 is still stopped (then resumes it), which
 * reads rank 2's ring and names it, stopped, as missing from seq 6. */
TEST(mpi_fr_rank_stopped, 60)
{
    if (!can_run("mpi_fr_rank_stopped")) return;
    char dir[600];
    char *out = fr_in_job("frstop", dir, "");
    for (int k = 0; k < 2; k++) expect_fr_file(dir, k, "json");
    expect_fr_file(dir, 2, "ring");
    ASSERT_CONTAINS(out, FR_MISSING);
    ASSERT_CONTAINS(out, "(failed)");
    ASSERT_CONTAINS(out, "stopped (SIGSTOP");
    expect_waited_on_rank2(out, "it waited");
    expect_rank2_read(out, "stopped");
    free(out);
}

/* Rank 2 SIGKILLed once ranks 0 and 1 wait in seq 6. By default mpirun
 * kills them too (SIGTERM, then SIGKILL after odls_base_sigkill_timeout;
 * group timeout 60 s): they dump on the SIGTERM (reason "SIGTERM") and
 * die of it. The timeout is 2 s here: with the default 1 s, mpirun's
 * sleep before the SIGKILL ends (rounded down to 0 s) when the first of
 * them exits, and the other may be SIGKILLed before its dump is
 * written (docs/debugging.md).
 * tdist-fr reads those dumps with the three rings the job left in
 * TDIST_FR_DIR, ranks 0 and 1 in seq 6 (still waiting, or still queued
 * if their engine threads had not yet started it). Under mpirun
 * --enable-recovery (OMPI_MCA_orte_enable_recovery=1) the job outlives
 * rank 2: MPI never fails the survivors' seq 6, tdist's deadline (1 s)
 * does, so ranks 0 and 1 dump (then leave without MPI_Finalize, which
 * would wait for the dead rank), their wait noted on rank 2. Either way
 * tdist-fr names rank 2, gone, as missing from seq 6. */
static void fr_killed(bool recovery)
{
    char dir[600], live[600], *out;
    run_t r = fr_run(recovery ? "frkillrec" : "frkill", dir, live,
                     recovery ? "OMPI_MCA_orte_enable_recovery=1"
                              : "OMPI_MCA_odls_base_sigkill_timeout=2");
    ASSERT_TRUE(r.code != 124); /* not hung */
    ASSERT_CONTAINS(r.out, "frkill: rank 2 raises SIGKILL");
    ASSERT_TRUE(strstr(r.out, "MPI_PROG OK") == NULL);
    if (recovery) {
        ASSERT_CONTAINS(r.out, "fr: rank 0 dumped and leaves");
        ASSERT_CONTAINS(r.out, "fr: rank 1 dumped and leaves");
    } else {
        ASSERT_TRUE(r.code != 0); /* mpirun aborted the job */
    }
    free(r.out);
    for (int k = 0; k < 3; k++) expect_fr_file(dir, k, "ring");
    for (int k = 0; k < 2; k++) expect_fr_file(dir, k, "json");
    ASSERT_EQ(fr_tool(dir, &out), 1);
    ASSERT_CONTAINS(out, FR_MISSING);
    if (recovery) {
        ASSERT_CONTAINS(out, "(failed)");
        expect_waited_on_rank2(out, "it waited");
    } else {
        for (int k = 0; k < 2; k++) {
            char line[1024];
            summary_line(out, k, line, sizeof line);
            if (!strstr(line, "; dumped: SIGTERM"))
                FAIL("rank %d's line '%s' does not say it dumped on SIGTERM", k, line);
        }
    }
    ASSERT_CONTAINS(out, "gone (killed");
    expect_rank2_read(out, "gone");
    free(out);
}

TEST(mpi_fr_rank_killed, 60)
{
    if (!can_run("mpi_fr_rank_killed")) return;
    fr_killed(false);
}

TEST(mpi_fr_rank_killed_enable_recovery, 60)
{
    if (!can_run("mpi_fr_rank_killed_enable_recovery")) return;
    fr_killed(true);
}

/* Rank 2 deadlocked in its own code while ranks 0 and 1 wait in seq 6:
 * SIGUSR1 to mpirun reaches every rank, each writes a live dump, and from
 * those alone tdist-fr names rank 2 (running) as missing from seq 6. Rank
 * 2 then goes on, and seq 6 completes on every rank. */
TEST(mpi_fr_rank_deadlocked_in_user_code, 60)
{
    if (!can_run("mpi_fr_rank_deadlocked_in_user_code")) return;
    char dir[600];
    char *out = fr_in_job("frdeadlock", dir, "/live");
    ASSERT_CONTAINS(out, FR_MISSING);
    ASSERT_CONTAINS(out, "(still waiting)");
    ASSERT_CONTAINS(out, "running)");
    ASSERT_CONTAINS(out, "dumped: SIGUSR1");
    expect_waited_on_rank2(out, "waiting");
    expect_rank2_read(out, "running, from its dump");
    free(out);
}

TEST(mpi_monitored_barrier_names_missing, 40)
{
    expect_ok("mpi_monitored_barrier_names_missing", 3, "monitored", 30, NULL);
}
TEST(mpi_send_recv, 40) { expect_ok("mpi_send_recv", 3, "p2p", 30, NULL); }
TEST(mpi_ddp_matches_native_2, 60) { expect_ok("mpi_ddp_matches_native_2", 2, "ddp", 45, NULL); }
TEST(mpi_ddp_matches_native_3, 60) { expect_ok("mpi_ddp_matches_native_3", 3, "ddp", 45, NULL); }
TEST(mpi_zero_matches_native_2, 60) { expect_ok("mpi_zero_matches_native_2", 2, "zero", 45, NULL); }
TEST(mpi_zero_matches_native_3, 60) { expect_ok("mpi_zero_matches_native_3", 3, "zero", 45, NULL); }

TEST(mpi_ddp_bf16_hook_matches_native_2, 60)
{
    expect_ok("mpi_ddp_bf16_hook_matches_native_2", 2, "ddpbf16", 45, NULL);
}
TEST(mpi_ddp_bf16_hook_matches_native_3, 60)
{
    expect_ok("mpi_ddp_bf16_hook_matches_native_3", 3, "ddpbf16", 45, NULL);
}
TEST(mpi_ddp_join_matches_native_3, 60)
{
    expect_ok("mpi_ddp_join_matches_native_3", 3, "ddpjoin", 45, NULL);
}
TEST(mpi_env_init_with_tdist_backend, 40)
{
    expect_ok("mpi_env_init_with_tdist_backend", 2, "envinit", 30, "TDIST_BACKEND=mpi");
}

/* The backend sets Open MPI's libnbc iallreduce algorithm to "ring" only
 * around its own large posts: the application reads the variable unchanged,
 * and a value the user chose is never touched (docs/mpi.md). */
TEST(mpi_libnbc_ring_invisible_to_the_application, 60)
{
    expect_ok("mpi_libnbc_ring_invisible_to_the_application", 2, "tune", 45, NULL);
}
TEST(mpi_libnbc_user_choice_is_kept, 60)
{
    expect_ok("mpi_libnbc_user_choice_is_kept", 3, "tune", 45,
              "OMPI_MCA_coll_libnbc_iallreduce_algorithm=2");
}

/* A rank SIGKILLed mid-collective: nothing hangs. Open MPI's runtime
 * (mpirun) notices the death and kills the other ranks; the job ends
 * non-zero well before the group timeout (5 s) would matter. What was
 * seen is recorded in docs/mpi.md. */
TEST(mpi_rank_death_ends_the_job, 60)
{
    if (!can_run("mpi_rank_death_ends_the_job")) return;
    run_t r = mpi_run(3, "death", (int)(45 * tdist_test_timeout_mult()), NULL);
    ASSERT_TRUE(r.code != 0 && r.code != 124); /* failed, not hung */
    ASSERT_CONTAINS(r.out, "rank 1 raises SIGKILL");
    ASSERT_TRUE(strstr(r.out, "MPI_PROG OK") == NULL);
    free(r.out);
}

/* Without mpirun the MPI backend refuses clearly (no MPI world). */
static void no_mpi_body(int rank, int n, void *arg)
{
    (void)rank;
    (void)n;
    (void)arg;
    tdist_world_t *w = NULL;
    ASSERT_OK(tdist_init("env://", NULL, &w));
    tdist_pg_opts_t o;
    tdist_pg_opts_init(&o);
    o.backend = "mpi";
    tdist_pg_t *pg = NULL;
    tdist_status_t st = tdist_pg_create_world(w, &o, &pg);
    ASSERT_STATUS(st, TDIST_ERR_NOT_SUPPORTED);
    ASSERT_TRUE(pg == NULL);
    ASSERT_TRUE(strstr(tdist_last_error(), "mpirun") != NULL ||
                strstr(tdist_last_error(), "without MPI") != NULL);
    o.backend = "bogus";
    ASSERT_STATUS(tdist_pg_create_world(w, &o, &pg), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "unknown backend");
    /* the native default still works */
    o.backend = NULL;
    ASSERT_OK(tdist_pg_create_world(w, &o, &pg));
    ASSERT_OK(tdist_barrier(pg, NULL, NULL));
    tdist_pg_destroy(pg);
    tdist_world_destroy(w);
}

TEST(mpi_backend_needs_an_mpi_world, 30) { tdist_test_run_ranks(2, no_mpi_body, NULL); }

/* Run cmd (which writes its output to outp) with system(); *out gets that
 * output (malloc'd), printed for the test log. Returns system()'s status. */
static int shell_capture(const char *cmd, const char *outp, char **out)
{
    int st = system(cmd);
    *out = slurp(outp);
    printf("%s", *out);
    return st;
}

/* tdistrun --backend mpi starts the workers through mpirun with
 * TDIST_BACKEND=mpi: env:// init gives an MPI world and an MPI group. */
TEST(mpi_tdistrun_backend_mpi, 60)
{
    if (!can_run("mpi_tdistrun_backend_mpi")) return;
    char outp[512], cmd[4096];
    snprintf(outp, sizeof outp, "%s/tdistrun_mpi.txt", tdist_test_tmpdir());
    char asan[1024];
    int lim = (int)(45 * tdist_test_timeout_mult());
    snprintf(cmd, sizeof cmd,
             "env -u TDIST_BACKEND OMPI_MCA_btl_vader_single_copy_mechanism=none "
             "OMPI_MCA_btl=self,vader %s "
             "timeout -k 5 %d %s/tools/tdistrun/tdistrun --backend mpi --nproc-per-node 3 "
             "%s envinit > '%s' 2>&1",
             asan_env(asan, sizeof asan), lim, TDIST_BIN_DIR, PROG, outp);
    char *buf;
    int st = shell_capture(cmd, outp, &buf);
    if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) != 0 || !strstr(buf, "MPI_PROG OK envinit"))
        FAIL("tdistrun --backend mpi: exit %d, %s", WIFEXITED(st) ? WEXITSTATUS(st) : -1,
             strstr(buf, "MPI_PROG OK") ? "OK printed" : "no OK line");
    ASSERT_CONTAINS(buf, "tdistrun: backend mpi: starting 3 workers with");
    free(buf);
}

/* A launcher of another MPI (here faked: PMI_SIZE=2, as MPICH's Hydra sets,
 * on a process Open MPI starts as a singleton) makes MPI_COMM_WORLD 1 rank;
 * tdist_init("mpi://") refuses instead of running N separate 1-rank jobs. */
TEST(mpi_other_mpis_launcher_is_refused, 30)
{
    if (!can_run("mpi_other_mpis_launcher_is_refused")) return;
    char outp[512], cmd[4096];
    snprintf(outp, sizeof outp, "%s/other_launcher.txt", tdist_test_tmpdir());
    char asan[1024];
    int lim = (int)(20 * tdist_test_timeout_mult());
    snprintf(cmd, sizeof cmd,
             "env -u OMPI_COMM_WORLD_SIZE -u TDIST_BACKEND PMI_SIZE=2 PMI_RANK=0 "
             "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
             "%s timeout -k 5 %d %s matrix > '%s' 2>&1",
             asan_env(asan, sizeof asan), lim, PROG, outp);
    char *buf;
    int st = shell_capture(cmd, outp, &buf);
    ASSERT_TRUE(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 1);
    ASSERT_CONTAINS(buf, "TDIST_ERR_MISMATCH");
    ASSERT_CONTAINS(buf, "PMI_SIZE=2, but MPI_COMM_WORLD has 1 rank: another MPI's launcher");
    ASSERT_TRUE(strstr(buf, "MPI_PROG OK") == NULL);
    free(buf);
}

/* The MPI backend is a module loaded on demand: when it cannot be found,
 * asking for it fails with a message that says where the loader looked and
 * what to install, and the native backend keeps working. Needs no MPI. */
static void missing_module_body(int rank, int n, void *arg)
{
    (void)n;
    (void)arg;
    setenv("TDIST_MPI_MODULE", "/nonexistent/tdist/libtdist_mpi.so", 1);
    tdist_world_t *w = NULL;
    ASSERT_OK(tdist_init("env://", NULL, &w));
    tdist_pg_opts_t o;
    tdist_pg_opts_init(&o);
    o.backend = "mpi";
    tdist_pg_t *pg = NULL;
    ASSERT_STATUS(tdist_pg_create_world(w, &o, &pg), TDIST_ERR_NOT_SUPPORTED);
    ASSERT_TRUE(pg == NULL);
    if (rank == 0) printf("%s\n", tdist_last_error());
    ASSERT_CONTAINS(tdist_last_error(), "tdist_pg_create_world(opts.backend=\"mpi\")");
    ASSERT_CONTAINS(tdist_last_error(), "libtdist_mpi.so could not be loaded");
    ASSERT_CONTAINS(tdist_last_error(), "/nonexistent/tdist/libtdist_mpi.so");
    ASSERT_CONTAINS(tdist_last_error(), "libopenmpi");
    /* the same answer the second time, without a new search */
    ASSERT_STATUS(tdist_pg_create_world(w, &o, &pg), TDIST_ERR_NOT_SUPPORTED);
    ASSERT_CONTAINS(tdist_last_error(), "could not be loaded");
    /* an mpi:// world needs the module too */
    tdist_world_t *w2 = NULL;
    ASSERT_STATUS(tdist_init("mpi://", NULL, &w2), TDIST_ERR_NOT_SUPPORTED);
    ASSERT_CONTAINS(tdist_last_error(), "tdist_init(\"mpi://\")");
    ASSERT_CONTAINS(tdist_last_error(), "libtdist_mpi.so");
    o.backend = NULL;
    ASSERT_OK(tdist_pg_create_world(w, &o, &pg));
    ASSERT_OK(tdist_barrier(pg, NULL, NULL));
    tdist_pg_destroy(pg);
    tdist_world_destroy(w);
}

TEST(mpi_module_missing_is_a_clear_error, 30) { tdist_test_run_ranks(2, missing_module_body, NULL); }
