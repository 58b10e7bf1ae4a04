/* tests/tools/test_tdistrun.c — the launcher, run as a real program.
 *
 * Each test starts the built tdistrun (fork + exec) with its stdout and
 * stderr sent to files in the test's temporary directory, waits for it with
 * a bounded loop, then checks its exit status and output. Workers are
 * mostly /bin/sh one-liners; they write their pid ($$, kept by `exec`) to
 * files so the test can check that none survives. More in
 * test_tdistrun_failures.c (first failure, orphans, stalled readers, lost
 * output) and test_tdistrun_flags.c (the torchrun-style flags); shared
 * helpers in test_tdistrun_helpers.c.
 */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test_tdistrun_helpers.h"

/* ------------------------------------------------------------------ tests */

TEST(tdistrun_env_and_rank_prefixes, 30)
{
    const char *argv[] = {TDISTRUN, "--nproc-per-node", "4", "--grace-period=1", "/bin/sh", "-c",
                          "echo \"env $RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $GROUP_RANK "
                          "$NODE_RANK $TDIST_RESTART_COUNT $TDIST_LAUNCHER_STORE $MASTER_ADDR "
                          "port=$MASTER_PORT\"; echo \"to stderr $RANK\" >&2",
                          NULL};
    run_t r;
    run(argv, 20, "env", &r);
    ASSERT_EXIT(r, 0);
    int port = -1;
    for (int k = 0; k < 4; k++) {
        char want[128];
        snprintf(want, sizeof want, "[rank %d] env %d 4 %d 4 0 0 0 1 127.0.0.1 port=", k, k, k);
        const char *p = strstr(r.out, want);
        if (!p) FAIL("no line \"%s...\" in stdout:\n%s", want, r.out);
        int this_port = atoi(p + strlen(want));
        ASSERT_TRUE(this_port > 0 && this_port < 65536);
        if (port < 0) port = this_port;
        ASSERT_EQ(this_port, port); /* one store for all ranks */
        snprintf(want, sizeof want, "[rank %d] to stderr %d\n", k, k);
        ASSERT_CONTAINS(r.err, want);
    }
    ASSERT_EQ(trun_count_of(r.out, "[rank "), 4); /* stdout lines stay on stdout */
    ASSERT_EQ(trun_count_of(r.err, "] to stderr "), 4);
    ASSERT_TRUE(strstr(r.out, "to stderr") == NULL);
    run_free(&r);
}

TEST(tdistrun_partial_long_lines_no_prefix_and_tee, 30)
{
    /* A 20000-byte line is forwarded in pieces, a last line without a
     * newline is flushed at EOF, and every byte arrives. */
    const char *argv[] = {TDISTRUN, "--nproc-per-node=2", "--grace-period", "0.5", "/bin/sh", "-c",
                          "head -c 20000 /dev/zero | tr '\\0' x; echo; printf 'no newline %s' $RANK",
                          NULL};
    run_t r;
    run(argv, 20, "long", &r);
    ASSERT_EXIT(r, 0);
    ASSERT_EQ(trun_count_of(r.out, "x"), 40000);
    ASSERT_CONTAINS(r.out, "[rank 0] no newline 0\n");
    ASSERT_CONTAINS(r.out, "[rank 1] no newline 1\n");
    ASSERT_CONTAINS(r.out, "[rank 1] xxxxxxxx");
    /* no line longer than the prefix + 8192 bytes */
    size_t longest = 0, cur = 0;
    for (const char *p = r.out; *p; p++) {
        cur = *p == '\n' ? 0 : cur + 1;
        if (cur > longest) longest = cur;
    }
    ASSERT_LE(longest, 8192 + 16);
    ASSERT_GE(longest, 8192);
    run_free(&r);

    char tee[512];
    snprintf(tee, sizeof tee, "%s/tee", tdist_test_tmpdir());
    const char *argv2[] = {TDISTRUN, "--nproc-per-node", "2", "--no-prefix", "--tee", tee,
                           "/bin/sh", "-c", "echo plain $RANK; echo errline $RANK >&2", NULL};
    run(argv2, 20, "noprefix", &r);
    ASSERT_EXIT(r, 0);
    ASSERT_CONTAINS(r.out, "plain 0\n");
    ASSERT_CONTAINS(r.out, "plain 1\n");
    ASSERT_TRUE(strstr(r.out, "[rank") == NULL);
    ASSERT_CONTAINS(r.err, "errline 1\n");
    ASSERT_TRUE(strstr(r.err, "[rank") == NULL);
    run_free(&r);
    char *s = slurp(tmp_path("tee/attempt_0/rank_1.stdout"));
    ASSERT_STREQ(s, "plain 1\n");
    free(s);
    s = slurp(tmp_path("tee/attempt_0/rank_0.stderr"));
    ASSERT_STREQ(s, "errline 0\n");
    free(s);
}

TEST(tdistrun_launcher_hello_2_and_4_ranks, 90)
{
    static const char *const nprocs[] = {"2", "4"};
    for (int i = 0; i < 2; i++) {
        const char *argv[] = {TDISTRUN, "--nproc-per-node", nprocs[i], "--grace-period", "1",
                              HELLO, NULL};
        char tag[32];
        snprintf(tag, sizeof tag, "hello%s", nprocs[i]);
        run_t r;
        run(argv, 60, tag, &r);
        ASSERT_EXIT(r, 0);
        int n = atoi(nprocs[i]);
        for (int k = 0; k < n; k++) {
            char want[96];
            snprintf(want, sizeof want, "[rank %d] rank %d/%d local %d/%d on host ", k, k, n, k, n);
            if (!strstr(r.out, want)) FAIL("no \"%s\" in:\n%s\n%s", want, r.out, r.err);
        }
        char want[64];
        snprintf(want, sizeof want, "[rank 0] all %d ranks checked in\n", n);
        ASSERT_CONTAINS(r.out, want);
        run_free(&r);
    }
}

TEST(tdistrun_failure_stops_the_others, 30)
{
    trun_set_dir_env();
    /* Rank 2 waits until everyone has written its pid, writes two stderr
     * lines and exits 3. Rank 1 ignores SIGTERM, so only the SIGKILL after
     * the 1 s grace period stops it; the others die of SIGTERM. */
    const char *argv[] = {
        TDISTRUN, "--nproc-per-node", "4", "--grace-period", "1", "/bin/sh", "-c",
        "echo $$ > $T_DIR/pid.$RANK;"
        "if [ $RANK = 2 ]; then"
        "  i=0; while [ $(ls $T_DIR | grep -c pid) -lt 4 ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done;"
        "  echo 'first stderr line' >&2; echo 'rank two says goodbye' >&2; exit 3;"
        "fi;"
        "if [ $RANK = 1 ]; then trap '' TERM; fi;"
        "exec sleep 120",
        NULL};
    run_t r;
    run(argv, 20, "fail", &r);
    ASSERT_EXIT(r, 3);
    ASSERT_CONTAINS(r.err, "rank 2 (local rank 2, pid ");
    ASSERT_CONTAINS(r.err, "failed first: it exited with status 3");
    ASSERT_CONTAINS(r.err, "    | first stderr line\n    | rank two says goodbye\n");
    ASSERT_CONTAINS(r.err, "sending SIGKILL");
    /* SIGKILL came after the grace period, not before, and not much later */
    ASSERT_GE(r.ms, 900);
    ASSERT_LE(r.ms, 15000 * tdist_test_timeout_mult());
    pid_t pids[4];
    trun_read_pids(4, pids);
    trun_assert_all_gone(pids, 4, 100); /* the launcher reaped them all before exiting */
    run_free(&r);
}

TEST(tdistrun_signal_death_reported_by_name, 30)
{
    const char *argv[] = {TDISTRUN, "--nproc-per-node", "3", "--grace-period", "1", "/bin/sh",
                          "-c",
                          "if [ $RANK = 1 ]; then echo dying >&2; kill -USR1 $$; fi; exec sleep 120",
                          NULL};
    run_t r;
    run(argv, 20, "sig", &r);
    ASSERT_EXIT(r, 128 + SIGUSR1);
    ASSERT_CONTAINS(r.err, "rank 1 (local rank 1");
    char want[64];
    snprintf(want, sizeof want, "was killed by signal %d (SIGUSR1)", SIGUSR1);
    ASSERT_CONTAINS(r.err, want);
    ASSERT_CONTAINS(r.err, "    | dying\n");
    ASSERT_LE(r.ms, 10000 * tdist_test_timeout_mult());
    run_free(&r);
}

TEST(tdistrun_sigterm_to_launcher_stops_everything, 30)
{
    trun_set_dir_env();
    const char *argv[] = {TDISTRUN, "--nproc-per-node", "3", "--grace-period", "10", "/bin/sh",
                          "-c", "echo $$ > $T_DIR/pid.$RANK; exec sleep 120", NULL};
    double start = tdist_test_now_ms();
    pid_t pid = spawn(argv, "term");
    trun_wait_files("pid", 3, 10000 * tdist_test_timeout_mult());
    pid_t pids[3];
    trun_read_pids(3, pids);
    ASSERT_EQ(kill(pid, SIGTERM), 0);
    double sent = tdist_test_now_ms();
    run_t r;
    wait_for(pid, 10000 * tdist_test_timeout_mult(), "term", start, &r);
    ASSERT_EXIT(r, 128 + SIGTERM);
    ASSERT_CONTAINS(r.err, "got SIGTERM; forwarding it to 3 workers");
    /* sleep dies of SIGTERM at once: no waiting for the 10 s grace period */
    ASSERT_LE(tdist_test_now_ms() - sent, 5000);
    trun_assert_all_gone(pids, 3, 100);
    run_free(&r);
}

TEST(tdistrun_second_sigint_kills_at_once, 30)
{
    trun_set_dir_env();
    /* Workers ignore SIGINT and SIGTERM: the forwarded SIGINT does nothing,
     * and a second SIGINT must SIGKILL them without waiting for the 60 s
     * grace period. */
    const char *argv[] = {TDISTRUN, "--nproc-per-node", "2", "--grace-period", "60", "/bin/sh",
                          "-c", "trap '' INT TERM; echo $$ > $T_DIR/pid.$RANK; exec sleep 120",
                          NULL};
    double start = tdist_test_now_ms();
    pid_t pid = spawn(argv, "int2");
    trun_wait_files("pid", 2, 10000 * tdist_test_timeout_mult());
    pid_t pids[2];
    trun_read_pids(2, pids);
    ASSERT_EQ(kill(pid, SIGINT), 0);
    usleep(300 * 1000);
    for (int k = 0; k < 2; k++) ASSERT_FALSE(trun_pid_gone(pids[k])); /* they ignored it */
    ASSERT_EQ(kill(pid, SIGINT), 0);
    run_t r;
    wait_for(pid, 20000 * tdist_test_timeout_mult(), "int2", start, &r);
    ASSERT_EXIT(r, 128 + SIGINT);
    ASSERT_CONTAINS(r.err, "got SIGINT; forwarding it to 2 workers");
    ASSERT_CONTAINS(r.err, "got SIGINT again; sending SIGKILL");
    ASSERT_LE(r.ms, 30000); /* well before the 60 s grace period */
    trun_assert_all_gone(pids, 2, 100);
    run_free(&r);
}

TEST(tdistrun_sigkill_to_launcher_leaves_no_orphans, 30)
{
    trun_set_dir_env();
    /* Orphans would be re-parented to us: reap them to tell dead from alive. */
    ASSERT_EQ(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
    const char *argv[] = {TDISTRUN, "--nproc-per-node", "4", "/bin/sh", "-c",
                          "echo $$ > $T_DIR/pid.$RANK; exec sleep 120", NULL};
    double start = tdist_test_now_ms();
    pid_t pid = spawn(argv, "kill9");
    trun_wait_files("pid", 4, 10000 * tdist_test_timeout_mult());
    pid_t pids[4];
    trun_read_pids(4, pids);
    for (int k = 0; k < 4; k++) ASSERT_FALSE(trun_pid_gone(pids[k]));
    ASSERT_EQ(kill(pid, SIGKILL), 0);
    run_t r;
    wait_for(pid, 5000, "kill9", start, &r);
    ASSERT_FALSE(r.exited);
    ASSERT_EQ(r.sig, SIGKILL);
    trun_assert_all_gone(pids, 4, 3000 * tdist_test_timeout_mult());
    run_free(&r);
}

TEST(tdistrun_max_restarts_recovers, 30)
{
    /* Rank 1 fails on attempts 0 and 1 and succeeds on attempt 2. */
    const char *argv[] = {TDISTRUN, "--nproc-per-node", "2", "--max-restarts", "2",
                          "--grace-period", "1", "/bin/sh", "-c",
                          "echo \"attempt $TDIST_RESTART_COUNT\";"
                          "if [ $RANK = 1 ] && [ $TDIST_RESTART_COUNT -lt 2 ]; then"
                          "  echo \"failing on attempt $TDIST_RESTART_COUNT\" >&2; exit 7; fi",
                          NULL};
    run_t r;
    run(argv, 20, "restart", &r);
    ASSERT_EXIT(r, 0);
    ASSERT_CONTAINS(r.out, "[rank 1] attempt 0\n");
    ASSERT_CONTAINS(r.out, "[rank 1] attempt 1\n");
    ASSERT_CONTAINS(r.out, "[rank 1] attempt 2\n");
    ASSERT_CONTAINS(r.out, "[rank 0] attempt 2\n");
    ASSERT_EQ(trun_count_of(r.out, "attempt 3"), 0);
    ASSERT_CONTAINS(r.err, "restarting the worker set (restart 1 of 2) after rank 1 exited with status 7");
    ASSERT_CONTAINS(r.err, "restarting the worker set (restart 2 of 2)");
    ASSERT_CONTAINS(r.err, "failing on attempt 1");
    run_free(&r);
}

TEST(tdistrun_max_restarts_exhausted, 30)
{
    const char *argv[] = {TDISTRUN, "--nproc-per-node", "2", "--max-restarts", "1",
                          "--grace-period", "1", "/bin/sh", "-c",
                          "echo \"attempt $TDIST_RESTART_COUNT\"; [ $RANK = 0 ] && exit 4; exec sleep 60",
                          NULL};
    run_t r;
    run(argv, 20, "exhausted", &r);
    ASSERT_EXIT(r, 4);
    ASSERT_EQ(trun_count_of(r.out, "[rank 0] attempt "), 2);
    ASSERT_CONTAINS(r.out, "[rank 0] attempt 1\n");
    ASSERT_EQ(trun_count_of(r.err, "restarting the worker set"), 1);
    ASSERT_CONTAINS(r.err, "giving up after 1 restart");
    ASSERT_CONTAINS(r.err, "rank 0 (local rank 0");
    run_free(&r);
}

TEST(tdistrun_bad_usage_exits_2, 30)
{
    static const char *const cases[][10] = {
        {TDISTRUN, NULL},                                            /* nothing */
        {TDISTRUN, "/bin/true", NULL},                               /* no --nproc-per-node */
        {TDISTRUN, "--nproc-per-node", "0", "/bin/true", NULL},      /* out of range */
        {TDISTRUN, "--nproc-per-node=x", "/bin/true", NULL},         /* not a number */
        {TDISTRUN, "--nproc-per-node", "2", NULL},                   /* no program */
        {TDISTRUN, "--bogus", "--nproc-per-node", "2", "/bin/true", NULL},
        {TDISTRUN, "--nproc-per-node", "2", "--grace-period", "-1", "/bin/true", NULL},
        {TDISTRUN, "--nproc-per-node", NULL},                        /* missing value */
        {TDISTRUN, "--nproc-per-node", "2", "--nnodes", "2", "--node-rank", "2", "/bin/true", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char tag[32];
        snprintf(tag, sizeof tag, "usage%zu", i);
        run_t r;
        run(cases[i], 10, tag, &r);
        if (!r.exited || r.code != 2) FAIL("case %zu: expected exit 2, got %d: %s", i, r.code, r.err);
        ASSERT_CONTAINS(r.err, "usage: tdistrun --nproc-per-node N");
        ASSERT_CONTAINS(r.err, "tdistrun: ");
        run_free(&r);
    }
    const char *help[] = {TDISTRUN, "--help", NULL};
    run_t r;
    run(help, 10, "help", &r);
    ASSERT_EXIT(r, 0);
    ASSERT_CONTAINS(r.out, "usage: tdistrun --nproc-per-node N");
    ASSERT_CONTAINS(r.out, "--max-restarts K");
    run_free(&r);
    /* a program that does not exist: 127, before any worker starts */
    const char *missing[] = {TDISTRUN, "--nproc-per-node", "2", "no-such-program-tdist", NULL};
    run(missing, 10, "missing", &r);
    ASSERT_EXIT(r, 127);
    ASSERT_CONTAINS(r.err, "no-such-program-tdist: command not found");
    run_free(&r);
}

TEST(tdistrun_multinode_needs_master_port, 10)
{
    const char *argv[] = {TDISTRUN, "--nnodes", "2", "--node-rank", "0", "--nproc-per-node", "1",
                          "/bin/true", NULL};
    run_t r;
    run(argv, 10, "nport", &r);
    ASSERT_EXIT(r, 2);
    ASSERT_CONTAINS(r.err, "--nnodes > 1 needs --master-port");
    run_free(&r);
}

/* A socket listening on 127.0.0.1, on a port the kernel picked, for node
 * 0's store in the two-launcher tests: its port goes to both launchers as
 * --master-port and the socket itself to node 0 (TDIST_STORE_LISTEN_FD), so
 * no port is ever guessed. Close-on-exec until handed over. */
static int kernel_listener(char *port, size_t n)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ASSERT_TRUE(fd >= 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    ASSERT_EQ(listen(fd, 128), 0);
    socklen_t alen = sizeof a;
    ASSERT_EQ(getsockname(fd, (struct sockaddr *)&a, &alen), 0);
    snprintf(port, n, "%u", (unsigned)ntohs(a.sin_port));
    return fd;
}

/* Start node 0's launcher with the listening socket handed over. */
static pid_t spawn_node0(const char *const argv[], int listen_fd, const char *tag)
{
    char fdtxt[16];
    snprintf(fdtxt, sizeof fdtxt, "%d", listen_fd);
    ASSERT_EQ(fcntl(listen_fd, F_SETFD, 0), 0);
    setenv("TDIST_STORE_LISTEN_FD", fdtxt, 1);
    pid_t p = spawn(argv, tag);
    unsetenv("TDIST_STORE_LISTEN_FD");
    close(listen_fd);
    return p;
}

/* Two launchers on this host play two nodes of 2 workers each. */
TEST(tdistrun_two_nodes_on_one_host, 90)
{
    char port[16];
    int lfd = kernel_listener(port, sizeof port);

    const char *node1[] = {TDISTRUN, "--nnodes", "2", "--node-rank", "1", "--nproc-per-node", "2",
                           "--master-port", port, "--grace-period", "1", HELLO, NULL};
    const char *node0[] = {TDISTRUN, "--nnodes=2", "--node-rank=0", "--nproc-per-node=2",
                           "--master-port", port, "--grace-period", "1", HELLO, NULL};
    double start = tdist_test_now_ms();
    /* init/ tells hosts apart by name: give each "node" its own. */
    setenv("TDIST_HOSTNAME", "fake-node1", 1);
    pid_t p1 = spawn(node1, "node1"); /* retries until node 0's store is up */
    setenv("TDIST_HOSTNAME", "fake-node0", 1);
    pid_t p0 = spawn_node0(node0, lfd, "node0");
    run_t r0, r1;
    wait_for(p0, 60000 * tdist_test_timeout_mult(), "node0", start, &r0);
    wait_for(p1, 60000 * tdist_test_timeout_mult(), "node1", start, &r1);
    ASSERT_EXIT(r0, 0);
    ASSERT_EXIT(r1, 0);
    ASSERT_CONTAINS(r0.out, "[rank 0] all 4 ranks checked in\n");
    ASSERT_CONTAINS(r0.out, "[rank 1] rank 1/4 local 1/2 on host ");
    ASSERT_CONTAINS(r1.out, "[rank 2] rank 2/4 local 0/2 on host ");
    ASSERT_CONTAINS(r1.out, "[rank 3] rank 3/4 local 1/2 on host ");
    run_free(&r0);
    run_free(&r1);
}

/* Rank 3 (node 1) fails on attempt 0: node 1 reports it through the store,
 * node 0 stops its workers too, and both launchers restart together. */
TEST(tdistrun_two_nodes_restart_together, 90)
{
    char port[16];
    int lfd = kernel_listener(port, sizeof port);
    const char *prog = "if [ $RANK = 3 ] && [ $TDIST_RESTART_COUNT = 0 ]; then "
                       "echo 'rank 3 gives up' >&2; exit 9; fi; exec " HELLO;
    const char *node1[] = {TDISTRUN, "--nnodes", "2", "--node-rank", "1", "--nproc-per-node", "2",
                           "--master-port", port, "--max-restarts", "1", "--grace-period", "1",
                           "/bin/sh", "-c", prog, NULL};
    const char *node0[] = {TDISTRUN, "--nnodes", "2", "--node-rank", "0", "--nproc-per-node", "2",
                           "--master-port", port, "--max-restarts", "1", "--grace-period", "1",
                           "/bin/sh", "-c", prog, NULL};
    double start = tdist_test_now_ms();
    setenv("TDIST_HOSTNAME", "fake-node0", 1);
    pid_t p0 = spawn_node0(node0, lfd, "rnode0");
    setenv("TDIST_HOSTNAME", "fake-node1", 1);
    pid_t p1 = spawn(node1, "rnode1");
    run_t r0, r1;
    wait_for(p0, 60000 * tdist_test_timeout_mult(), "rnode0", start, &r0);
    wait_for(p1, 60000 * tdist_test_timeout_mult(), "rnode1", start, &r1);
    if (!r0.exited || r0.code != 0 || !r1.exited || r1.code != 0)
        FAIL("node 0: %s %d\n--- node 0 stderr:\n%s\n--- node 1: %s %d\n--- node 1 stderr:\n%s",
             r0.exited ? "exit" : "signal", r0.exited ? r0.code : r0.sig, r0.err,
             r1.exited ? "exit" : "signal", r1.exited ? r1.code : r1.sig, r1.err);
    ASSERT_CONTAINS(r1.err, "rank 3 (local rank 1, pid ");
    ASSERT_CONTAINS(r1.err, "restarting the worker set (restart 1 of 1) after rank 3 exited with status 9");
    ASSERT_CONTAINS(r0.err, "another node failed: node 1: rank 3 exited with status 9");
    ASSERT_CONTAINS(r0.err, "restarting the worker set (restart 1 of 1) after a failure on another node");
    ASSERT_CONTAINS(r0.out, "[rank 0] all 4 ranks checked in\n");
    run_free(&r0);
    run_free(&r1);
}

/* Without restarts, a failure on node 1 stops node 0 quickly (not at a
 * rendezvous deadline): node 1 exits with the worker's status, node 0
 * with 1. */
TEST(tdistrun_two_nodes_failure_stops_both, 60)
{
    char port[16];
    int lfd = kernel_listener(port, sizeof port);
    const char *prog = "if [ $RANK = 2 ]; then sleep 0.5; exit 6; fi; exec sleep 120";
    const char *node1[] = {TDISTRUN, "--nnodes", "2", "--node-rank", "1", "--nproc-per-node", "2",
                           "--master-port", port, "--grace-period", "1", "/bin/sh", "-c", prog,
                           NULL};
    const char *node0[] = {TDISTRUN, "--nnodes", "2", "--node-rank", "0", "--nproc-per-node", "2",
                           "--master-port", port, "--grace-period", "1", "/bin/sh", "-c", prog,
                           NULL};
    double start = tdist_test_now_ms();
    pid_t p0 = spawn_node0(node0, lfd, "fnode0");
    pid_t p1 = spawn(node1, "fnode1");
    run_t r0, r1;
    wait_for(p1, 20000 * tdist_test_timeout_mult(), "fnode1", start, &r1);
    wait_for(p0, 20000 * tdist_test_timeout_mult(), "fnode0", start, &r0);
    ASSERT_EXIT(r1, 6);
    ASSERT_EXIT(r0, 1);
    ASSERT_CONTAINS(r0.err, "another node failed: node 1: rank 2 exited with status 6");
    ASSERT_LE(r0.ms, 10000 * tdist_test_timeout_mult());
    run_free(&r0);
    run_free(&r1);
}

/* --bind-to core pins local worker i to the i-th allowed CPU (modulo their
 * number); without it a worker keeps the launcher's whole set. */
TEST(tdistrun_bind_to_core, 30)
{
    cpu_set_t allowed;
    ASSERT_EQ(sched_getaffinity(0, sizeof allowed, &allowed), 0);
    int cpus[CPU_SETSIZE], n = 0;
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &allowed)) cpus[n++] = c;
    const char *argv[] = {TDISTRUN, "--nproc-per-node", "3", "--bind-to", "core", "/bin/sh", "-c",
                          "echo cpus $(grep Cpus_allowed_list /proc/self/status | cut -f2)", NULL};
    run_t r;
    run(argv, 20, "bind", &r);
    ASSERT_EXIT(r, 0);
    for (int k = 0; k < 3; k++) {
        char want[96];
        snprintf(want, sizeof want, "[rank %d] cpus %d\n", k, cpus[k % n]);
        if (!strstr(r.out, want)) FAIL("no line \"%s\" in stdout:\n%s", want, r.out);
    }
    run_free(&r);
    const char *bad[] = {TDISTRUN, "--nproc-per-node", "1", "--bind-to", "socket", "/bin/true",
                         NULL};
    run(bad, 20, "bind-bad", &r);
    ASSERT_EXIT(r, 2);
    ASSERT_CONTAINS(r.err, "--bind-to: \"socket\" is not core or none");
    run_free(&r);
}
