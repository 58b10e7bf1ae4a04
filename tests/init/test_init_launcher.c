/* tests/init/test_init_launcher.c — env:// under the launchers a worker
 * meets. Slurm's srun: the host-list and tasks-per-node parsers, the port
 * formula, which variable wins, and real worlds whose processes have only
 * SLURM_* variables (Slurm is not installed here: the tests set what srun
 * would). No launcher at all: the error says which one to use.
 * TDIST_LINE_BUFFERED: stdout line-buffered from before main. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "init_env.h"

#include "init/internal.h" /* the Slurm parsers */

/* ------------------------------------------------------------ parsers */

TEST(init_slurm_host_list, 30)
{
    static const struct {
        const char *list, *first;
    } good[] = {
        {"node[01-04,07],gpu3", "node01"},
        {"nodeA,nodeB", "nodeA"},
        {"gpu3", "gpu3"},
        {"gpu3,node[01-04]", "gpu3"},
        {"n[007-010]", "n007"},
        {"n[7,3-4]", "n7"},
        {"node[1-2]-ib,x", "node1-ib"},
        {"rack[2-3]-n[05,06]", "rack2-n05"},
        {"127.0.0.[1-4],nodeB", "127.0.0.1"},
        {"localhost", "localhost"},
        {"a.example.org,b.example.org", "a.example.org"},
        {"n[9-10]", "n9"},
        {"n[0009-10]", "n0009"},
    };
    char host[256];
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        tdist_status_t st = tdist__slurm_first_host("SLURM_JOB_NODELIST", good[i].list, host,
                                                    sizeof host);
        if (st != TDIST_OK) FAIL("\"%s\": %s", good[i].list, tdist_last_error());
        if (strcmp(host, good[i].first) != 0)
            FAIL("\"%s\": first host \"%s\", expected \"%s\"", good[i].list, host, good[i].first);
    }

    static const struct {
        const char *list, *needle;
    } bad[] = {
        {"", "the list is empty"},
        {",a", "empty host name at byte 0"},
        {"a,,b", "empty host name at byte 2"},
        {"a,", "empty host name at byte 2"},
        {"node[01-04", "'[' without a closing ']' at byte 4"},
        {"node[1-", "'[' without a closing ']'"},
        {"node01-04]", "']' without '['"},
        {"node[]", "NUMBER or NUMBER-NUMBER"},
        {"node[a-b]", "NUMBER or NUMBER-NUMBER"},
        {"node[-1]", "NUMBER or NUMBER-NUMBER"},
        {"node[1,]", "NUMBER or NUMBER-NUMBER"},
        {"node[[1]]", "NUMBER or NUMBER-NUMBER"},
        {"node[04-01]", "a range runs backwards"},
        {"node[1-2x]", "unexpected character in brackets"},
        {"no de", "blank or control character at byte 2"},
        {"a,b[2-1]", "a range runs backwards"}, /* the whole list is checked */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        tdist_status_t st = tdist__slurm_first_host("SLURM_JOB_NODELIST", bad[i].list, host,
                                                    sizeof host);
        if (st != TDIST_ERR_INVALID_ARG)
            FAIL("\"%s\": got %s, expected TDIST_ERR_INVALID_ARG", bad[i].list,
                 tdist_status_str(st));
        char quoted[128];
        snprintf(quoted, sizeof quoted, "SLURM_JOB_NODELIST=\"%s\" is not a Slurm host list",
                 bad[i].list);
        ASSERT_CONTAINS(tdist_last_error(), quoted);
        ASSERT_CONTAINS(tdist_last_error(), bad[i].needle);
        ASSERT_CONTAINS(tdist_last_error(), "set MASTER_ADDR");
    }

    /* the first host must fit: 255 bytes do, 256 do not */
    char list[300];
    memset(list, 'h', 255);
    snprintf(list + 255, sizeof list - 255, "[1-2],b");
    ASSERT_STATUS(tdist__slurm_first_host("SLURM_JOB_NODELIST", list, host, sizeof host),
                  TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "longer than 255 bytes");
    list[254] = '\0';
    ASSERT_OK(tdist__slurm_first_host("SLURM_JOB_NODELIST", list, host, sizeof host));
    ASSERT_EQ(strlen(host), (size_t)254);
}

TEST(init_slurm_tasks_per_node, 30)
{
    static const struct {
        const char *list;
        int64_t node, want;
    } good[] = {
        {"4", 0, 4},          {"2(x3),1", 0, 2},  {"2(x3),1", 2, 2},   {"2(x3),1", 3, 1},
        {"1,3(x2)", 2, 3},    {"4(x2)", -1, 4},   {"2(x3),1", -1, -1}, {"16", -1, 16},
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        int64_t got = -7;
        tdist_status_t st = tdist__slurm_tasks_on_node("SLURM_TASKS_PER_NODE", good[i].list,
                                                       good[i].node, &got);
        if (st != TDIST_OK) FAIL("\"%s\": %s", good[i].list, tdist_last_error());
        if (got != good[i].want)
            FAIL("\"%s\" node %" PRId64 ": %" PRId64 ", expected %" PRId64, good[i].list,
                 good[i].node, got, good[i].want);
    }
    static const struct {
        const char *list, *needle;
    } bad[] = {
        {"", "a count must be"},    {"x", "a count must be"},       {"0", "a count must be"},
        {"2(x", "(xN)"},            {"2(3)", "(xN)"},               {"2(x0)", "(xN)"},
        {"2,,1", "a count must be"}, {"2;1", "separated by ','"},    {"2(x3)1", "separated by ','"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int64_t got = -7;
        tdist_status_t st = tdist__slurm_tasks_on_node("SLURM_TASKS_PER_NODE", bad[i].list, 0, &got);
        if (st != TDIST_ERR_INVALID_ARG)
            FAIL("\"%s\": got %s, expected TDIST_ERR_INVALID_ARG", bad[i].list,
                 tdist_status_str(st));
        char quoted[96];
        snprintf(quoted, sizeof quoted, "SLURM_TASKS_PER_NODE=\"%s\"", bad[i].list);
        ASSERT_CONTAINS(tdist_last_error(), quoted);
        ASSERT_CONTAINS(tdist_last_error(), bad[i].needle);
        ASSERT_EQ(got, -7);
    }
    int64_t got = 0;
    ASSERT_STATUS(tdist__slurm_tasks_on_node("SLURM_TASKS_PER_NODE", "2(x2)", 2, &got),
                  TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "SLURM_NODEID=2 but SLURM_TASKS_PER_NODE=\"2(x2)\" covers "
                                        "nodes 0..1 only");
}

/* The port documented in docs/init.md: 10000 + SLURM_JOB_ID % 50000. */
TEST(init_slurm_port_formula, 10)
{
    ASSERT_EQ(tdist__slurm_port(0), 10000);
    ASSERT_EQ(tdist__slurm_port(1), 10001);
    ASSERT_EQ(tdist__slurm_port(12345), 22345);
    ASSERT_EQ(tdist__slurm_port(49999), 59999);
    ASSERT_EQ(tdist__slurm_port(50000), 10000);
    ASSERT_EQ(tdist__slurm_port(1234567), 44567);
    ASSERT_EQ(tdist__slurm_port(INT64_MAX), 10000 + (int)(INT64_MAX % 50000));
}

/* ------------------------------------------------------------ env:// errors */

/* A well-formed step of 2 tasks on one node, as srun sets it, this task
 * being rank 0. */
static void set_slurm_env(void)
{
    clear_init_env();
    setenv("SLURM_PROCID", "0", 1);
    setenv("SLURM_NTASKS", "2", 1);
    setenv("SLURM_LOCALID", "0", 1);
    setenv("SLURM_NODEID", "0", 1);
    setenv("SLURM_TASKS_PER_NODE", "2", 1);
    setenv("SLURM_JOB_NODELIST", "127.0.0.1", 1);
    setenv("SLURM_JOB_ID", "1", 1);
}

typedef struct env_case {
    const char *name;  /* variable to change */
    const char *value; /* NULL: unset it */
    const char *needle;
} env_case_t;

static void expect_invalid(const env_case_t *cases, size_t n, const tdist_init_opts_t *o)
{
    for (size_t i = 0; i < n; i++) {
        set_slurm_env();
        if (cases[i].value)
            setenv(cases[i].name, cases[i].value, 1);
        else
            unsetenv(cases[i].name);
        tdist_world_t *w = NULL;
        tdist_status_t st = tdist_init("env://", o, &w);
        if (st != TDIST_ERR_INVALID_ARG)
            FAIL("%s=%s: got %s (%s), expected TDIST_ERR_INVALID_ARG", cases[i].name,
                 cases[i].value ? cases[i].value : "(unset)", tdist_status_str(st),
                 tdist_last_error());
        if (!strstr(tdist_last_error(), cases[i].needle))
            FAIL("%s=%s: message \"%s\" lacks \"%s\"", cases[i].name,
                 cases[i].value ? cases[i].value : "(unset)", tdist_last_error(), cases[i].needle);
        ASSERT_TRUE(w == NULL);
    }
}

/* Every Slurm variable that is missing or malformed is named. */
TEST(init_slurm_bad_env_values, 30)
{
    static const env_case_t cases[] = {
        {"SLURM_PROCID", "x", "SLURM_PROCID=\"x\""},
        {"SLURM_PROCID", "-1", "SLURM_PROCID=\"-1\""},
        {"SLURM_PROCID", "2", "rank 2 (SLURM_PROCID) is not below the world size 2 (SLURM_NTASKS)"},
        {"SLURM_NTASKS", NULL, "SLURM_NTASKS is not set"},
        {"SLURM_NTASKS", "0", "SLURM_NTASKS=\"0\""},
        {"SLURM_LOCALID", "x", "SLURM_LOCALID=\"x\""},
        {"SLURM_LOCALID", "2", "SLURM_LOCALID=2 is not below SLURM_TASKS_PER_NODE[node 0]=2"},
        {"SLURM_NODEID", "x", "SLURM_NODEID=\"x\""},
        {"SLURM_NODEID", "1", "SLURM_NODEID=1 but SLURM_TASKS_PER_NODE=\"2\" covers nodes 0..0"},
        {"SLURM_TASKS_PER_NODE", "2(x", "SLURM_TASKS_PER_NODE=\"2(x\""},
        {"SLURM_JOB_NODELIST", NULL, "MASTER_ADDR is not set"},
        {"SLURM_JOB_NODELIST", NULL, "SLURM_JOB_NODELIST, which is not set either"},
        {"SLURM_JOB_NODELIST", "node[1-", "SLURM_JOB_NODELIST=\"node[1-\" is not a Slurm host list"},
        {"SLURM_STEP_NODELIST", "a,,b", "SLURM_STEP_NODELIST=\"a,,b\" is not a Slurm host list"},
        {"SLURM_JOB_ID", NULL, "MASTER_PORT is not set"},
        {"SLURM_JOB_ID", NULL, "10000 + SLURM_JOB_ID % 50000, and SLURM_JOB_ID is not set"},
        {"SLURM_JOB_ID", "abc", "SLURM_JOB_ID=\"abc\""},
        {"SLURM_JOB_ID", "-5", "SLURM_JOB_ID=\"-5\""},
    };
    tdist_init_opts_t o;
    tdist_init_opts_init(&o);
    o.timeout_ms = 2000;
    expect_invalid(cases, sizeof cases / sizeof cases[0], &o);

    /* the step's tasks-per-node list wins over the job's; SLURM_NTASKS_PER_NODE
     * is the last resort */
    set_slurm_env();
    setenv("SLURM_LOCALID", "1", 1);
    setenv("SLURM_STEP_TASKS_PER_NODE", "1(x2)", 1);
    setenv("SLURM_TASKS_PER_NODE", "not read", 1);
    tdist_world_t *w = NULL;
    ASSERT_STATUS(tdist_init("env://", &o, &w), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "SLURM_LOCALID=1 is not below "
                                        "SLURM_STEP_TASKS_PER_NODE[node 0]=1");
    set_slurm_env();
    unsetenv("SLURM_TASKS_PER_NODE");
    setenv("SLURM_NTASKS_PER_NODE", "2", 1);
    setenv("SLURM_LOCALID", "2", 1);
    ASSERT_STATUS(tdist_init("env://", &o, &w), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "SLURM_LOCALID=2 is not below SLURM_NTASKS_PER_NODE=2");
    /* without SLURM_NODEID a list with one count for every node still serves */
    set_slurm_env();
    unsetenv("SLURM_NODEID");
    setenv("SLURM_TASKS_PER_NODE", "2(x4)", 1);
    setenv("SLURM_LOCALID", "3", 1);
    ASSERT_STATUS(tdist_init("env://", &o, &w), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "SLURM_LOCALID=3 is not below SLURM_TASKS_PER_NODE[every "
                                        "node]=2");
    ASSERT_TRUE(w == NULL);
}

/* What wins over what, seen through the last check read_env makes (the
 * rank against the world size): a value that was not read cannot fail. */
TEST(init_slurm_precedence, 30)
{
    tdist_init_opts_t o;
    tdist_init_opts_init(&o);
    o.timeout_ms = 2000;
    tdist_world_t *w = NULL;
    /* MASTER_ADDR and MASTER_PORT win over the node list and the job id */
    set_slurm_env();
    setenv("SLURM_PROCID", "2", 1);
    setenv("SLURM_JOB_NODELIST", "node[", 1);
    setenv("SLURM_JOB_ID", "abc", 1);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", "29500", 1);
    ASSERT_STATUS(tdist_init("env://", &o, &w), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "rank 2 (SLURM_PROCID) is not below the world size 2");
    /* LOCAL_RANK and LOCAL_WORLD_SIZE win over SLURM_LOCALID and the lists */
    set_slurm_env();
    setenv("SLURM_LOCALID", "x", 1);
    setenv("SLURM_TASKS_PER_NODE", "x", 1);
    setenv("LOCAL_RANK", "3", 1);
    setenv("LOCAL_WORLD_SIZE", "2", 1);
    ASSERT_STATUS(tdist_init("env://", &o, &w), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "LOCAL_RANK=3 is not below LOCAL_WORLD_SIZE=2");
    /* opts win over SLURM_PROCID and SLURM_NTASKS */
    set_slurm_env();
    setenv("SLURM_PROCID", "x", 1);
    setenv("SLURM_NTASKS", "y", 1);
    tdist_init_opts_t o2 = o;
    o2.rank = 5;
    o2.world_size = 3;
    ASSERT_STATUS(tdist_init("env://", &o2, &w), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "rank 5 is not below the world size 3");
    /* RANK or WORLD_SIZE set: the torchrun variables, and only they, count
     * (a partial set names what is missing; Slurm's are not read) */
    set_slurm_env();
    setenv("RANK", "1", 1);
    ASSERT_STATUS(tdist_init("env://", &o, &w), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "MASTER_ADDR is not set (the store's host)");
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", "29500", 1);
    ASSERT_STATUS(tdist_init("env://", &o, &w), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "WORLD_SIZE is not set");
    setenv("WORLD_SIZE", "1", 1);
    ASSERT_STATUS(tdist_init("env://", &o, &w), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "rank 1 is not below the world size 1");
    ASSERT_TRUE(w == NULL);
}

/* ------------------------------------------------------------ real worlds */

/* One Slurm job step on this host, as srun would set it up. */
typedef struct slurm_job {
    int fd;                 /* listening socket; rank 0 hosts the store on it */
    uint16_t port;          /* its port */
    const char *nodelist;   /* SLURM_JOB_NODELIST */
    char job_id[32];        /* SLURM_JOB_ID */
    bool master_port;       /* set MASTER_PORT to port (else the port comes from the job id) */
    const char *step_tasks; /* SLURM_STEP_TASKS_PER_NODE, or NULL */
    const char *job_tasks;  /* SLURM_TASKS_PER_NODE, or NULL */
} slurm_job_t;

static void slurm_body(int rank, int n, void *arg)
{
    const slurm_job_t *j = arg;
    char buf[32];
    clear_init_env(); /* only SLURM_* (and MASTER_PORT if asked) from here */
    snprintf(buf, sizeof buf, "%d", rank);
    setenv("SLURM_PROCID", buf, 1);
    setenv("SLURM_LOCALID", buf, 1);
    snprintf(buf, sizeof buf, "%d", n);
    setenv("SLURM_NTASKS", buf, 1);
    setenv("SLURM_NODEID", "0", 1);
    setenv("SLURM_JOB_NODELIST", j->nodelist, 1);
    setenv("SLURM_JOB_ID", j->job_id, 1);
    if (j->step_tasks) setenv("SLURM_STEP_TASKS_PER_NODE", j->step_tasks, 1);
    if (j->job_tasks) setenv("SLURM_TASKS_PER_NODE", j->job_tasks, 1);
    snprintf(buf, sizeof buf, "%u", (unsigned)j->port);
    if (j->master_port) setenv("MASTER_PORT", buf, 1);
    if (rank == 0) {
        snprintf(buf, sizeof buf, "%d", j->fd);
        setenv("TDIST_STORE_LISTEN_FD", buf, 1);
    } else {
        close(j->fd);
    }
    tdist_init_opts_t o;
    tdist_init_opts_init(&o);
    o.timeout_ms = 30000;
    tdist_world_t *w = NULL;
    ASSERT_OK(tdist_init(rank % 2 ? NULL : "env://", &o, &w));
    ASSERT_EQ(tdist_world_rank(w), rank);
    ASSERT_EQ(tdist_world_size(w), n);
    ASSERT_EQ(tdist_world_local_rank(w), rank);
    ASSERT_EQ(tdist_world_local_size(w), n);
    /* every rank reads every rank's key through the store rank 0 hosts */
    tdist_store_t *s = tdist_world_store(w);
    char key[32], val[32];
    snprintf(key, sizeof key, "slurm/%d", rank);
    snprintf(val, sizeof val, "task %d", rank);
    ASSERT_OK(tdist_store_set(s, key, val, strlen(val)));
    for (int r = 0; r < n; r++) {
        snprintf(key, sizeof key, "slurm/%d", r);
        snprintf(val, sizeof val, "task %d", r);
        void *v = NULL;
        size_t len = 0;
        ASSERT_OK(tdist_store_get(s, key, &v, &len));
        ASSERT_EQ(len, strlen(val));
        ASSERT_MEMEQ(v, val, len);
        free(v);
    }
    tdist_world_destroy(w);
}

static void run_slurm_job(slurm_job_t *j, int n)
{
    tdist_ranks_opts_t ro;
    tdist_ranks_opts_init(&ro, n);
    ro.with_store = false;
    tdist_rank_result_t res[8];
    int failed = tdist_test_spawn_ranks(&ro, slurm_body, j, res);
    close(j->fd);
    char buf[128];
    for (int r = 0; r < n; r++)
        if (!(res[r].exited && res[r].code == 0))
            FAIL("rank %d %s", r, tdist_test_describe(&res[r], buf, sizeof buf));
    ASSERT_EQ(failed, 0);
}

/* Four tasks with nothing but srun's variables: the store on the first
 * host of a compressed node list, at the port derived from the job id (the
 * test picks the job id that maps to a port the kernel gave it). */
TEST(init_slurm_env_4_ranks, 60)
{
    slurm_job_t j = {.fd = -1, .nodelist = "127.0.0.[1-4],nodeB", .job_tasks = "4"};
    for (int tries = 0; tries < 200 && j.fd < 0; tries++) {
        j.fd = listen_local(AF_INET, &j.port);
        ASSERT_TRUE(j.fd >= 0);
        if (j.port < 10000 || j.port >= 60000) { /* outside what the formula yields */
            close(j.fd);
            j.fd = -1;
        }
    }
    if (j.fd < 0) {
        SKIP("the kernel gave no port in 10000..59999");
    }
    int64_t job_id = (int64_t)(j.port - 10000) + 3 * 50000; /* the modulo matters */
    ASSERT_EQ(tdist__slurm_port(job_id), (int)j.port);
    snprintf(j.job_id, sizeof j.job_id, "%" PRId64, job_id);
    run_slurm_job(&j, 4);
}

/* Two tasks, MASTER_PORT given (it wins over the job id's port), the node
 * list a plain address (not "localhost": a minimal system may have no
 * /etc/hosts to resolve it), the step's tasks-per-node list winning over
 * the job's (which would say 3 tasks on this node). */
TEST(init_slurm_env_2_ranks_master_port, 60)
{
    slurm_job_t j = {.nodelist = "127.0.0.1", .job_id = "7", .master_port = true,
                     .step_tasks = "2", .job_tasks = "3,1"};
    j.fd = listen_local(AF_INET, &j.port);
    ASSERT_TRUE(j.fd >= 0);
    run_slurm_job(&j, 2);
}

/* Under tdistrun inside a Slurm allocation both sets are there: the
 * torchrun variables win, and Slurm's, even malformed, are not read. */
static void torchrun_wins_body(int rank, int n, void *arg)
{
    (void)arg;
    setenv("SLURM_PROCID", rank ? "0" : "1", 1);
    setenv("SLURM_NTASKS", "7", 1);
    setenv("SLURM_LOCALID", "x", 1);
    setenv("SLURM_NODEID", "x", 1);
    setenv("SLURM_TASKS_PER_NODE", "bad", 1);
    setenv("SLURM_JOB_NODELIST", "node[", 1);
    setenv("SLURM_JOB_ID", "abc", 1);
    tdist_init_opts_t o;
    tdist_init_opts_init(&o);
    o.timeout_ms = 30000;
    tdist_world_t *w = NULL;
    ASSERT_OK(tdist_init("env://", &o, &w));
    ASSERT_EQ(tdist_world_rank(w), rank);
    ASSERT_EQ(tdist_world_size(w), n);
    ASSERT_EQ(tdist_world_local_rank(w), rank);
    tdist_world_destroy(w);
}

TEST(init_slurm_torchrun_variables_win, 30) { tdist_test_run_ranks(2, torchrun_wins_body, NULL); }

/* ------------------------------------------------------------ no launcher */

TEST(init_env_without_launcher, 30)
{
    tdist_init_opts_t o;
    tdist_init_opts_init(&o);
    o.timeout_ms = 2000;
    clear_init_env();
    const char *urls[] = {"env://", NULL};
    for (size_t i = 0; i < 2; i++) {
        tdist_world_t *w = (tdist_world_t *)&o; /* must stay untouched */
        ASSERT_STATUS(tdist_init(urls[i], &o, &w), TDIST_ERR_INVALID_ARG);
        ASSERT_TRUE(w == (tdist_world_t *)&o);
        const char *m = tdist_last_error();
        ASSERT_CONTAINS(m, "tdist_init(env://): no launcher environment (RANK, WORLD_SIZE, "
                           "MASTER_ADDR and MASTER_PORT are unset and no Slurm job step");
        ASSERT_CONTAINS(m, "`tdistrun --nproc-per-node N PROGRAM`");
        ASSERT_CONTAINS(m, "`srun PROGRAM`");
        ASSERT_CONTAINS(m, "mpirun -np N");
        ASSERT_FALSE(strstr(m, "OMPI_COMM_WORLD_SIZE") != NULL);
    }
    /* started by mpirun without TDIST_BACKEND=mpi: the message says so */
    setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
    tdist_world_t *w = NULL;
    ASSERT_STATUS(tdist_init(NULL, &o, &w), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "no launcher environment");
    ASSERT_CONTAINS(tdist_last_error(), "OMPI_COMM_WORLD_SIZE is set");
    ASSERT_CONTAINS(tdist_last_error(), "set TDIST_BACKEND=mpi");
    unsetenv("OMPI_COMM_WORLD_SIZE");

    /* some variables set: the message names the first one missing */
    static const struct {
        const char *set[2];
        const char *needle;
    } partial[] = {
        {{"MASTER_ADDR", NULL}, "MASTER_PORT is not set"},
        {{"MASTER_PORT", NULL}, "MASTER_ADDR is not set"},
        {{"RANK", NULL}, "MASTER_ADDR is not set"},
        {{"WORLD_SIZE", NULL}, "MASTER_ADDR is not set"},
        {{"MASTER_ADDR", "MASTER_PORT"}, "RANK is not set"},
        {{"SLURM_PROCID", NULL}, "SLURM_JOB_NODELIST, which is not set either"},
    };
    for (size_t i = 0; i < sizeof partial / sizeof partial[0]; i++) {
        clear_init_env();
        for (int k = 0; k < 2 && partial[i].set[k]; k++) setenv(partial[i].set[k], "1", 1);
        ASSERT_STATUS(tdist_init("env://", &o, &w), TDIST_ERR_INVALID_ARG);
        ASSERT_CONTAINS(tdist_last_error(), partial[i].needle);
        if (strstr(tdist_last_error(), "no launcher"))
            FAIL("%s set: \"%s\" should name the missing variable", partial[i].set[0],
                 tdist_last_error());
    }
    ASSERT_TRUE(w == NULL);
}

/* ------------------------------------------------------------ stdout */

/* Re-executed with TDIST_TEST_LINEBUF_PROBE=1, this binary writes a line
 * to stdout (a pipe: fully buffered unless something changed it) and ends
 * with _exit, which flushes nothing, before main. The line reaches the
 * pipe only if stdout was line-buffered by then: by libtdist's
 * constructor, which has a priority and so runs before this one. */
__attribute__((constructor)) static void linebuf_probe(void)
{
    if (!getenv("TDIST_TEST_LINEBUF_PROBE")) return;
    fputs("probe line\n", stdout);
    _exit(0);
}

/* What the probe child wrote with TDIST_LINE_BUFFERED=value (NULL: unset). */
static void run_probe(const char *value, char *out, size_t n)
{
    int p[2];
    ASSERT_EQ(pipe(p), 0);
    pid_t pid = fork();
    ASSERT_TRUE(pid >= 0);
    if (pid == 0) {
        dup2(p[1], STDOUT_FILENO);
        close(p[0]);
        close(p[1]);
        if (value)
            setenv("TDIST_LINE_BUFFERED", value, 1);
        else
            unsetenv("TDIST_LINE_BUFFERED");
        setenv("TDIST_TEST_LINEBUF_PROBE", "1", 1);
        execl("/proc/self/exe", "tdist_tests", "--list", (char *)NULL);
        _exit(127);
    }
    close(p[1]);
    size_t len = 0;
    for (;;) {
        ssize_t r = read(p[0], out + len, n - 1 - len);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        len += (size_t)r;
    }
    out[len] = '\0';
    close(p[0]);
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

TEST(init_line_buffered_stdout, 30)
{
    char out[256];
    run_probe("1", out, sizeof out);
    ASSERT_STREQ(out, "probe line\n");
    /* without it the line is lost: the probe can tell the two apart */
    run_probe(NULL, out, sizeof out);
    ASSERT_STREQ(out, "");
    run_probe("0", out, sizeof out);
    ASSERT_STREQ(out, "");
    run_probe("yes", out, sizeof out);
    ASSERT_STREQ(out, "");
}
