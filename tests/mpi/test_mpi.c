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
 * behind at MPI_Finalize that LeakSanitizer would report. A test skips
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
             "%s %s "
             "timeout -k 5 %d mpirun -np %d --oversubscribe --bind-to none --mca btl self,vader "
             "-x ASAN_OPTIONS -x UBSAN_OPTIONS -x TDIST_BACKEND -x TDIST_TIMEOUT_MS "
             "%s %s > '%s' 2>&1",
             asan_env(asan, sizeof asan), env ? env : "", limit_s, np, PROG, scenario, outp);
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
/* The flight recorder on the MPI backend: rank 2 never issues the sixth
 * all_reduce; ranks 0 and 1 time out and dump; tdist-fr names rank 2 and
 * seq 6 from the dumps and rank 2's ring. */
TEST(mpi_fr_names_the_missing_rank, 60)
{
    if (!can_run("mpi_fr_names_the_missing_rank")) return;
    char dir[600], env[700];
    snprintf(dir, sizeof dir, "%s/fr", tdist_test_tmpdir());
    snprintf(env, sizeof env, "TDIST_FR_DIR='%s'", dir);
    run_t r = mpi_run(3, "frhang", (int)(45 * tdist_test_timeout_mult()), env);
    if (r.code != 0 || !strstr(r.out, "MPI_PROG OK frhang")) FAIL("mpirun frhang: exit %d", r.code);
    free(r.out);
    for (int k = 0; k < 2; k++) {
        char p[700];
        snprintf(p, sizeof p, "%s/tdist-fr.r%d.world.json", dir, k);
        if (access(p, R_OK) != 0) FAIL("rank %d wrote no dump %s", k, p);
    }
    char cmd[1400], outp[700];
    snprintf(outp, sizeof outp, "%s/fr.txt", tdist_test_tmpdir());
    snprintf(cmd, sizeof cmd, "'%s/tools/tdist-fr/tdist-fr' '%s' > '%s' 2>&1", TDIST_BIN_DIR, dir,
             outp);
    int st = system(cmd);
    char *out = slurp(outp);
    printf("%s", out);
    ASSERT_TRUE(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 1);
    ASSERT_CONTAINS(out, "first divergence: rank 2 is missing from all_reduce(f32, 2, sum) seq 6 "
                         "of group world; ranks 0, 1 waited");
    ASSERT_CONTAINS(out, "route backend, algorithm slot");
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
