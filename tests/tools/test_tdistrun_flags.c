/* tests/tools/test_tdistrun_flags.c — the launcher's torchrun-style flags:
 * --nproc-per-node auto, --standalone, --rdzv-endpoint, --log-dir,
 * --local-ranks-filter, --timestamps, the --bind-to core warning,
 * --backend mpi's rank prefixes (through a stand-in for mpirun) and the
 * start line. Every flag with a bad value must exit 2 naming the flag. */
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test_tdistrun_helpers.h"

/* argv must exit 2 with the usage and a message containing needle. */
static void expect_usage(const char *const argv[], const char *tag, const char *needle)
{
    run_t r;
    run(argv, 10, tag, &r);
    if (!r.exited || r.code != 2 || !strstr(r.err, needle) ||
        !strstr(r.err, "usage: tdistrun --nproc-per-node N"))
        FAIL("%s: expected exit 2 and \"%s\", got %s %d:\n%s", tag, needle,
             r.exited ? "exit" : "signal", r.exited ? r.code : r.sig, r.err);
    run_free(&r);
}

static int usable_cpus(void)
{
    cpu_set_t allowed;
    ASSERT_EQ(sched_getaffinity(0, sizeof allowed, &allowed), 0);
    return CPU_COUNT(&allowed);
}

TEST(tdistrun_nproc_per_node_auto, 30)
{
    int cpus = usable_cpus();
    const char *argv[] = {TDISTRUN, "--nproc-per-node", "auto", "/bin/sh", "-c",
                          "echo \"n=$LOCAL_WORLD_SIZE\"", NULL};
    run_t r;
    run(argv, 20, "auto", &r);
    ASSERT_EXIT(r, 0);
    char want[64];
    snprintf(want, sizeof want, "[rank 0] n=%d\n", cpus);
    ASSERT_CONTAINS(r.out, want);
    ASSERT_EQ(trun_count_of(r.out, "[rank "), cpus);
    run_free(&r);
    const char *bad[] = {TDISTRUN, "--nproc-per-node", "automatic", "/bin/true", NULL};
    expect_usage(bad, "auto-bad", "--nproc-per-node: \"automatic\" is neither auto nor a whole "
                                  "number");
}

TEST(tdistrun_standalone, 30)
{
    const char *argv[] = {TDISTRUN, "--standalone", "--nnodes", "1", "--nproc-per-node", "2",
                          "/bin/sh", "-c", "echo \"at $MASTER_ADDR:$MASTER_PORT\"", NULL};
    run_t r;
    run(argv, 20, "standalone", &r);
    ASSERT_EXIT(r, 0);
    const char *p = strstr(r.out, "[rank 1] at 127.0.0.1:");
    ASSERT_TRUE(p != NULL);
    int port = atoi(p + strlen("[rank 1] at 127.0.0.1:"));
    ASSERT_TRUE(port > 0 && port < 65536);
    ASSERT_CONTAINS(r.err, "store hosted here on 127.0.0.1:");
    run_free(&r);
    const char *two[] = {TDISTRUN, "--standalone", "--nnodes", "2", "--node-rank", "0",
                         "--master-port", "29500", "--nproc-per-node", "1", "/bin/true", NULL};
    expect_usage(two, "standalone-2", "--standalone runs one node");
    const char *addr[] = {TDISTRUN, "--standalone", "--master-addr", "10.0.0.1",
                          "--nproc-per-node", "1", "/bin/true", NULL};
    expect_usage(addr, "standalone-addr", "it takes no --nnodes > 1, --node-rank, --master-addr");
}

static bool ipv6_loopback_works(void)
{
    int fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return false;
    struct sockaddr_in6 a;
    memset(&a, 0, sizeof a);
    a.sin6_family = AF_INET6;
    a.sin6_addr = in6addr_loopback;
    bool ok = bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
    close(fd);
    return ok;
}

TEST(tdistrun_rdzv_endpoint, 30)
{
    const char *argv[] = {TDISTRUN, "--rdzv-endpoint", "127.0.0.1:0", "--nproc-per-node", "2",
                          HELLO, NULL};
    run_t r;
    run(argv, 30, "endpoint", &r);
    ASSERT_EXIT(r, 0);
    ASSERT_CONTAINS(r.err, "store hosted here on 127.0.0.1:");
    ASSERT_CONTAINS(r.out, "[rank 0] all 2 ranks checked in\n");
    run_free(&r);
    if (ipv6_loopback_works()) { /* the loopback only, on a port the kernel picks */
        const char *v6[] = {TDISTRUN, "--rdzv_endpoint=[::1]:0", "--nproc-per-node", "2",
                            "/bin/sh", "-c", "echo \"addr=$MASTER_ADDR\"; exec " HELLO, NULL};
        run(v6, 30, "endpoint6", &r);
        ASSERT_EXIT(r, 0);
        ASSERT_CONTAINS(r.out, "[rank 1] addr=::1\n");
        ASSERT_CONTAINS(r.out, "[rank 0] all 2 ranks checked in\n");
        ASSERT_CONTAINS(r.err, "store hosted here on [::1]:");
        run_free(&r);
    } else {
        printf("note: no IPv6 loopback here; [::1] parsing is checked through errors only\n");
    }
    static const char *const bad[][2] = {
        {"::1:5", "write an IPv6 address in brackets"},
        {"[::1", "needs a closing bracket"},
        {"[::1]5", "expected :PORT after ]"},
        {"127.0.0.1:70000", "--rdzv-endpoint port: \"70000\" is not a whole number"},
        {":5", "names no host"},
        {"[]:5", "needs a closing bracket"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *argv_bad[] = {TDISTRUN, "--rdzv-endpoint", bad[i][0], "--nproc-per-node",
                                  "1", "/bin/true", NULL};
        char tag[32];
        snprintf(tag, sizeof tag, "endpoint-bad%zu", i);
        expect_usage(argv_bad, tag, bad[i][1]);
    }
    const char *both[] = {TDISTRUN, "--rdzv-endpoint", "127.0.0.1:0", "--master-port", "0",
                          "--nproc-per-node", "1", "/bin/true", NULL};
    expect_usage(both, "endpoint-both", "do not also give --master-addr or --master-port");
    /* the endpoint's port is --master-port's: several nodes need a real one */
    const char *nodes[] = {TDISTRUN, "--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint",
                           "127.0.0.1:0", "--nproc-per-node", "1", "/bin/true", NULL};
    expect_usage(nodes, "endpoint-nodes", "--master-port 0 cannot be used with --nnodes > 1");
}

/* --log-dir: one file per rank and attempt with its stdout and stderr
 * lines; the console still shows them. */
TEST(tdistrun_log_dir, 30)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s/logs/run", tdist_test_tmpdir()); /* created with its parent */
    trun_set_dir_env();
    /* Rank 1 fails attempt 0 once rank 0 has printed (else rank 0 could be
     * stopped before it did). */
    const char *argv[] = {TDISTRUN, "--nproc-per-node", "2", "--max-restarts", "1", "--log-dir",
                          dir, "/bin/sh", "-c",
                          "echo \"out $RANK a$TDIST_RESTART_COUNT\"; echo \"err $RANK\" >&2;"
                          "echo > $T_DIR/said.$TDIST_RESTART_COUNT.$RANK;"
                          "[ $TDIST_RESTART_COUNT = 0 ] && [ $RANK = 1 ] || exit 0; i=0;"
                          "while [ ! -e $T_DIR/said.0.0 ] && [ $i -lt 3000 ]; do sleep 0.01; "
                          "i=$((i+1)); done; exit 3",
                          NULL};
    run_t r;
    run(argv, 20, "logdir", &r);
    ASSERT_EXIT(r, 0);
    ASSERT_CONTAINS(r.out, "[rank 0] out 0 a0\n");
    ASSERT_CONTAINS(r.err, "[rank 1] err 1\n");
    run_free(&r);
    for (int a = 0; a < 2; a++)
        for (int k = 0; k < 2; k++) {
            char name[96], want[64];
            snprintf(name, sizeof name, "logs/run/attempt_%d/rank_%d.log", a, k);
            char *s = slurp(tmp_path(name));
            snprintf(want, sizeof want, "out %d a%d\n", k, a);
            ASSERT_CONTAINS(s, want);
            snprintf(want, sizeof want, "err %d\n", k);
            ASSERT_CONTAINS(s, want);
            ASSERT_TRUE(strstr(s, "[rank") == NULL);
            free(s);
        }
    const char *empty[] = {TDISTRUN, "--log-dir", "", "--nproc-per-node", "1", "/bin/true", NULL};
    expect_usage(empty, "logdir-empty", "--log-dir: empty directory name");
    char file[512], under[600];
    snprintf(file, sizeof file, "%s/plain-file", tdist_test_tmpdir());
    FILE *f = fopen(file, "w");
    ASSERT_TRUE(f != NULL);
    fclose(f);
    snprintf(under, sizeof under, "%s/sub", file);
    const char *bad[] = {TDISTRUN, "--log-dir", under, "--nproc-per-node", "1", "/bin/true", NULL};
    run(bad, 10, "logdir-bad", &r);
    ASSERT_EXIT(r, 2);
    ASSERT_CONTAINS(r.err, "cannot create ");
    ASSERT_CONTAINS(r.err, "--log-dir ");
    run_free(&r);
}

/* --local-ranks-filter 0,2: only those ranks on the console, every rank
 * in the logs, and a filtered rank's failure still reported in full. */
TEST(tdistrun_local_ranks_filter, 30)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s/flogs", tdist_test_tmpdir());
    trun_set_dir_env();
    /* Rank 1 fails once every rank has printed. */
    const char *argv[] = {TDISTRUN, "--nproc-per-node", "4", "--local-ranks-filter", "0,2",
                          "--log-dir", dir, "--grace-period", "1", "/bin/sh", "-c",
                          "echo \"hello $RANK\"; echo \"note $RANK\" >&2; echo > $T_DIR/said.$RANK;"
                          "if [ $RANK = 1 ]; then i=0;"
                          "  while [ $(ls $T_DIR | grep -c said) -lt 4 ] && [ $i -lt 3000 ]; do "
                          "sleep 0.01; i=$((i+1)); done;"
                          "  echo boom >&2; exit 4; fi;"
                          "exec sleep 60",
                          NULL};
    run_t r;
    run(argv, 20, "filter", &r);
    ASSERT_EXIT(r, 4);
    ASSERT_CONTAINS(r.out, "[rank 0] hello 0\n");
    ASSERT_CONTAINS(r.out, "[rank 2] hello 2\n");
    ASSERT_CONTAINS(r.err, "[rank 2] note 2\n");
    ASSERT_TRUE(strstr(r.out, "[rank 1]") == NULL && strstr(r.out, "[rank 3]") == NULL);
    ASSERT_TRUE(strstr(r.err, "[rank 1]") == NULL && strstr(r.err, "[rank 3]") == NULL);
    ASSERT_CONTAINS(r.err, "FAILED: rank 1 (local rank 1");
    ASSERT_CONTAINS(r.err, "    | note 1\n    | boom\n");
    run_free(&r);
    char *s = slurp(tmp_path("flogs/attempt_0/rank_3.log"));
    ASSERT_CONTAINS(s, "hello 3\n");
    free(s);
    static const char *const bad[][2] = {
        {"0,4", "--local-ranks-filter: \"4\" is not a local rank: they are 0..3"},
        {"x", "\"x\" is not a local rank"},
        {"", "--local-ranks-filter: empty list"},
        {"0,,1", "is not a comma-separated list of local ranks"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *argv_bad[] = {TDISTRUN, "--nproc-per-node", "4", "--local-ranks-filter",
                                  bad[i][0], "/bin/true", NULL};
        char tag[32];
        snprintf(tag, sizeof tag, "filter-bad%zu", i);
        expect_usage(argv_bad, tag, bad[i][1]);
    }
}

/* Whether line (up to its newline) starts with "YYYY-MM-DD HH:MM:SS.mmm "
 * followed by rest. */
static bool stamped(const char *line, const char *rest)
{
    int y, mo, d, h, mi, s, ms, n = 0;
    if (sscanf(line, "%4d-%2d-%2d %2d:%2d:%2d.%3d %n", &y, &mo, &d, &h, &mi, &s, &ms, &n) != 7)
        return false;
    return n == 24 && y >= 2000 && mo >= 1 && mo <= 12 && strncmp(line + n, rest, strlen(rest)) == 0;
}

/* Every line of text that contains needle is stamped and followed by it. */
static void assert_all_stamped(const char *text, const char *needle, int want_lines)
{
    int lines = 0;
    for (const char *p = strstr(text, needle); p; p = strstr(p + 1, needle)) {
        const char *line = p;
        while (line > text && line[-1] != '\n') line--;
        if (!stamped(line, needle)) FAIL("not stamped: \"%.80s\"", line);
        lines++;
    }
    ASSERT_EQ(lines, want_lines);
}

TEST(tdistrun_timestamps, 30)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s/tlogs", tdist_test_tmpdir());
    const char *argv[] = {TDISTRUN, "--nproc-per-node", "2", "--timestamps", "--log-dir", dir,
                          "/bin/sh", "-c", "echo \"hi $RANK\"; echo \"err $RANK\" >&2", NULL};
    run_t r;
    run(argv, 20, "stamps", &r);
    ASSERT_EXIT(r, 0);
    assert_all_stamped(r.out, "[rank 0] hi 0", 1);
    assert_all_stamped(r.out, "[rank 1] hi 1", 1);
    assert_all_stamped(r.err, "[rank 1] err 1", 1);
    assert_all_stamped(r.err, "tdistrun: all 2 workers exited", 1);
    run_free(&r);
    char *s = slurp(tmp_path("tlogs/attempt_0/rank_1.log"));
    assert_all_stamped(s, "hi 1", 1);
    free(s);
    const char *raw[] = {TDISTRUN, "--nproc-per-node", "1", "--timestamps", "--no-prefix",
                         "/bin/sh", "-c", "echo plain", NULL};
    run(raw, 20, "stamps-raw", &r);
    ASSERT_EXIT(r, 0);
    assert_all_stamped(r.out, "plain\n", 1);
    run_free(&r);
}

TEST(tdistrun_bind_to_core_warns_when_oversubscribed, 30)
{
    int cpus = usable_cpus();
    char n[16];
    snprintf(n, sizeof n, "%d", cpus + 1);
    const char *argv[] = {TDISTRUN, "--nproc-per-node", n, "--bind-to", "core", "/bin/true",
                          NULL};
    run_t r;
    run(argv, 20, "bindwarn", &r);
    ASSERT_EXIT(r, 0);
    char want[128];
    snprintf(want, sizeof want, "warning: --bind-to core with %d workers but %d usable CPU",
             cpus + 1, cpus);
    ASSERT_CONTAINS(r.err, want);
    run_free(&r);
    const char *fits[] = {TDISTRUN, "--nproc-per-node", "1", "--bind-to", "core", "/bin/true",
                          NULL};
    run(fits, 20, "bindfits", &r);
    ASSERT_EXIT(r, 0);
    ASSERT_TRUE(strstr(r.err, "warning") == NULL);
    run_free(&r);
}

TEST(tdistrun_start_line_shows_the_command, 30)
{
    const char *argv[] = {TDISTRUN, "--nproc-per-node", "2", "/bin/sh", "-c",
                          "echo \"it's $RANK\"", "arg0", NULL};
    run_t r;
    run(argv, 20, "startline", &r);
    ASSERT_EXIT(r, 0);
    ASSERT_CONTAINS(r.err, "starting 2 workers (ranks 0..1 of 2): /bin/sh -c 'echo \"it'\\''s "
                           "$RANK\"' arg0\n");
    run_free(&r);
}

TEST(tdistrun_help_lists_every_flag, 10)
{
    const char *help[] = {TDISTRUN, "--help", NULL};
    run_t r;
    run(help, 10, "help", &r);
    ASSERT_EXIT(r, 0);
    static const char *const flags[] = {
        "--nproc-per-node N|auto", "--standalone", "--rdzv-endpoint H:P", "--log-dir DIR",
        "--local-ranks-filter L", "--timestamps", "--bind-to core|none", "--backend native|mpi",
        "--max-restarts K", "--tee DIR", "--grace-period S", "--no-prefix"};
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++) ASSERT_CONTAINS(r.out, flags[i]);
    run_free(&r);
}

/* A stand-in for mpirun (TDIST_MPIRUN): "-np N cmd..." starts N copies of
 * cmd with OMPI_COMM_WORLD_RANK / OMPI_COMM_WORLD_LOCAL_RANK set, waits for
 * all and exits with the last non-zero status (128+N for a signal). */
static const char fake_mpirun[] =
    "#!/bin/sh\n"
    "[ \"$1\" = -np ] || { echo \"fake mpirun: $*\" >&2; exit 90; }\n"
    "n=$2; shift 2; i=0; pids=\n"
    "while [ $i -lt $n ]; do\n"
    "  OMPI_COMM_WORLD_RANK=$i OMPI_COMM_WORLD_LOCAL_RANK=$i \"$@\" & pids=\"$pids $!\"\n"
    "  i=$((i+1))\n"
    "done\n"
    "rc=0; for p in $pids; do wait $p; s=$?; [ $s != 0 ] && rc=$s; done\n"
    "exit $rc\n";

static void write_fake_mpirun(char *path, size_t n)
{
    snprintf(path, n, "%s/fake-mpirun", tdist_test_tmpdir());
    FILE *f = fopen(path, "w");
    ASSERT_TRUE(f != NULL);
    fputs(fake_mpirun, f);
    fclose(f);
    ASSERT_EQ(chmod(path, 0755), 0);
}

/* --backend mpi: every rank mpirun starts is wrapped, so its output keeps
 * the "[rank R] " prefix (R from OMPI_COMM_WORLD_RANK); the filter and the
 * exit status (a signal included) pass through the wrapper. */
TEST(tdistrun_backend_mpi_keeps_rank_prefixes, 30)
{
    char mpirun[512];
    write_fake_mpirun(mpirun, sizeof mpirun);
    setenv("TDIST_MPIRUN", mpirun, 1);
    const char *argv[] = {TDISTRUN, "--backend", "mpi", "--nproc-per-node", "3", "/bin/sh", "-c",
                          "echo \"hello $OMPI_COMM_WORLD_RANK $TDIST_BACKEND lb=$TDIST_LINE_BUFFERED\";"
                          "echo \"err $OMPI_COMM_WORLD_RANK\" >&2; [ $OMPI_COMM_WORLD_RANK = 2 ] && exit 4; exit 0",
                          NULL};
    run_t r;
    run(argv, 20, "mpi", &r);
    ASSERT_EXIT(r, 4);
    for (int k = 0; k < 3; k++) {
        char want[64];
        snprintf(want, sizeof want, "[rank %d] hello %d mpi lb=1\n", k, k);
        ASSERT_CONTAINS(r.out, want);
        snprintf(want, sizeof want, "[rank %d] err %d\n", k, k);
        ASSERT_CONTAINS(r.err, want);
    }
    char want[700];
    snprintf(want, sizeof want, "tdistrun: backend mpi: starting 3 workers with %s -np 3 ", mpirun);
    ASSERT_CONTAINS(r.err, want);
    ASSERT_CONTAINS(r.err, " --mpi-worker --nproc-per-node 3 ");
    ASSERT_CONTAINS(r.err, " -- /bin/sh -c 'echo \"hello ");
    run_free(&r);

    const char *filt[] = {TDISTRUN, "--backend", "mpi", "--nproc-per-node", "3",
                          "--local-ranks-filter", "1", "/bin/sh", "-c",
                          "echo \"hi $OMPI_COMM_WORLD_RANK\"; [ $OMPI_COMM_WORLD_RANK = 0 ] && "
                          "kill -USR1 $$; exit 0",
                          NULL};
    run(filt, 20, "mpi-filter", &r);
    unsetenv("TDIST_MPIRUN");
    ASSERT_EXIT(r, 128 + SIGUSR1); /* rank 0's wrapper died of the same signal */
    ASSERT_CONTAINS(r.out, "[rank 1] hi 1\n");
    ASSERT_TRUE(strstr(r.out, "[rank 0]") == NULL && strstr(r.out, "[rank 2]") == NULL);
    run_free(&r);

    const char *alone[] = {TDISTRUN, "--mpi-worker", "--nproc-per-node", "1", "/bin/true", NULL};
    unsetenv("OMPI_COMM_WORLD_RANK");
    unsetenv("PMIX_RANK");
    unsetenv("PMI_RANK");
    unsetenv("SLURM_PROCID");
    run(alone, 10, "mpi-alone", &r);
    ASSERT_EXIT(r, 1);
    ASSERT_CONTAINS(r.err, "none of OMPI_COMM_WORLD_RANK, PMIX_RANK, PMI_RANK, SLURM_PROCID");
    run_free(&r);
}
