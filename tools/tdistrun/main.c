/* tools/tdistrun/main.c — tdistrun: start a job's workers on this node.
 *
 * The master node's launcher (node rank 0) hosts the job's TCP store on
 * --master-addr:--master-port for the whole run, restarts included; every
 * worker gets TDIST_LAUNCHER_STORE=1 so that init/ connects to it instead
 * of starting its own. With --nnodes > 1 the launchers of all nodes agree
 * on failures, restarts and success through that store (coord.c).
 * See docs/tdistrun.md.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/auth.h"
#include "core/internal.h"
#include "tdist/store.h"
#include "tdistrun.h"

/* How long the master node's launcher keeps the store up after the job
 * succeeded, while other nodes' launchers and workers are still connected. */
#define MULTINODE_LINGER_MS 30000

static bool is_executable_file(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode) && access(path, X_OK) == 0;
}

char *tdr_resolve_program(const char *prog)
{
    if (strchr(prog, '/')) {
        if (is_executable_file(prog)) return tdist__strdup(prog);
        tdr_eprintf("tdistrun: %s: %s\n", prog,
                    access(prog, F_OK) == 0 ? "not an executable file" : strerror(errno));
        return NULL;
    }
    const char *path = getenv("PATH");
    if (!path || !*path) path = "/usr/local/bin:/usr/bin:/bin";
    const char *p = path;
    for (int guard = 0; guard < 4096; guard++) {
        const char *colon = strchr(p, ':');
        size_t len = colon ? (size_t)(colon - p) : strlen(p);
        char *cand = len ? tdist__asprintf("%.*s/%s", (int)len, p, prog)
                         : tdist__asprintf("./%s", prog);
        if (!cand) break;
        if (is_executable_file(cand)) return cand;
        free(cand);
        if (!colon) break;
        p = colon + 1;
    }
    tdr_eprintf("tdistrun: %s: command not found in PATH\n", prog);
    return NULL;
}

static int failure_exit_code(const tdr_set_result_t *r)
{
    if (r->first_exited) return r->first_code ? r->first_code : 1;
    return 128 + r->first_signal;
}

/* Multi-node master: keep the store up while other nodes' workers still
 * use it (bounded), so they can finish cleanly. */
static void linger_for_other_nodes(tdist_store_server_t *srv, bool quiet)
{
    int64_t until = tdist__now_ms() + MULTINODE_LINGER_MS;
    bool said = false;
    while (tdist_store_server_num_clients(srv) > 0 && tdist__now_ms() < until &&
           !tdr_stop_signal()) {
        if (!said && !quiet) {
            tdr_eprintf("tdistrun: waiting up to %d s for workers of other nodes to leave "
                        "the store\n", MULTINODE_LINGER_MS / 1000);
            said = true;
        }
        tdr_sinks_flush();
        tdist__sleep_ms(50);
    }
}

/* A listening socket handed to the launcher by whoever started it (a test,
 * a service manager): TDIST_STORE_LISTEN_FD=<fd>. -1 when unset. Node 0
 * then serves the store on that socket instead of binding a port itself,
 * so a multi-node job can use a port the kernel picked without a race. */
static int inherited_listen_fd(void)
{
    const char *v = getenv("TDIST_STORE_LISTEN_FD");
    if (!v || !*v) return -1;
    char *end = NULL;
    long fd = strtol(v, &end, 10);
    if (*end != '\0' || fd < 0 || fd > 1 << 20) return -1;
    return (int)fd;
}

/* Node 0: start the store (or adopt the inherited socket). Returns 0 with
 * *srv and *port set, or TDR_EXIT_SETUP after printing why. */
static int start_store(const tdr_opts_t *o, tdist_store_server_t **srv, int *port)
{
    uint16_t want = (uint16_t)(o->master_port < 0 ? 0 : o->master_port);
    int listen_fd = inherited_listen_fd();
    tdist_status_t st = listen_fd >= 0 ? tdist_store_server_adopt(listen_fd, NULL, srv)
                                       : tdist_store_server_create(o->master_addr, want, NULL, srv);
    if (st == TDIST_OK && listen_fd >= 0 && o->master_port > 0 &&
        tdist_store_server_port(*srv) != o->master_port) {
        tdr_eprintf("tdistrun: TDIST_STORE_LISTEN_FD=%d listens on port %u, not on --master-port "
                    "%d\n", listen_fd, (unsigned)tdist_store_server_port(*srv), o->master_port);
        tdist_store_server_destroy(*srv);
        *srv = NULL;
        return TDR_EXIT_SETUP;
    }
    if (st != TDIST_OK) {
        bool v6 = strchr(o->master_addr, ':') != NULL;
        tdr_eprintf("tdistrun: cannot start the store on %s%s%s:%u: %s (%s)\n", v6 ? "[" : "",
                    o->master_addr, v6 ? "]" : "", (unsigned)want, tdist_last_error(),
                    tdist_status_str(st));
        return TDR_EXIT_SETUP;
    }
    *port = tdist_store_server_port(*srv);
    return 0;
}

static void print_start(const tdr_opts_t *o, bool hosted, int port, const char *prog)
{
    if (o->quiet) return;
    int world = o->nnodes * o->nproc_per_node;
    char *cmd = tdr_command_text(prog, o->prog_argv);
    bool v6 = strchr(o->master_addr, ':') != NULL;
    tdr_eprintf("tdistrun: store %s %s%s%s:%d; starting %d worker%s (ranks %d..%d of %d): %s\n",
                hosted ? "hosted here on" : "of node 0 at", v6 ? "[" : "", o->master_addr,
                v6 ? "]" : "", port, o->nproc_per_node, o->nproc_per_node == 1 ? "" : "s",
                o->node_rank * o->nproc_per_node, (o->node_rank + 1) * o->nproc_per_node - 1,
                world, cmd ? cmd : prog);
    free(cmd);
}

static void give_up_message(const tdr_opts_t *o)
{
    if (o->max_restarts > 0)
        tdr_eprintf("tdistrun: giving up after %d restart%s\n", o->max_restarts,
                    o->max_restarts == 1 ? "" : "s");
}

/* A set succeeded here: with several nodes, done only when every node is
 * (another node's failure restarts this one too). Returns -1 to go on with
 * res as updated, or the exit code. */
static int after_success(tdr_launch_t *l, tdr_set_result_t *res)
{
    const tdr_opts_t *o = l->opts;
    if (!o->quiet)
        tdr_eprintf("tdistrun: all %d worker%s exited with status 0\n", o->nproc_per_node,
                    o->nproc_per_node == 1 ? "" : "s");
    if (!l->coord) return 0;
    tdr_coord_event_t ev = tdr_coord_finish(l->coord, l->attempt, res->remote_msg,
                                            sizeof res->remote_msg);
    if (ev == TDR_COORD_SIGNAL) {
        char nb[32], why[64];
        const char *name = tdr_signal_name(tdr_stop_signal(), nb, sizeof nb);
        snprintf(why, sizeof why, "its launcher got %s", name);
        tdr_coord_abort(l->coord, why);
        tdr_eprintf("tdistrun: stopped by %s\n", name);
        return 128 + tdr_stop_signal();
    }
    if (ev == TDR_COORD_NONE) {
        if (!o->quiet) tdr_eprintf("tdistrun: all %d nodes finished\n", o->nnodes);
        return 0;
    }
    res->outcome = TDR_SET_REMOTE;
    res->remote_event = ev;
    tdr_eprintf("tdistrun: %s%s\n", ev == TDR_COORD_LOST ? "" : "another node failed: ",
                res->remote_msg);
    return -1;
}

/* Run sets until one succeeds, restarts run out, or a signal: the exit code. */
static int run_attempts(tdr_launch_t *l)
{
    const tdr_opts_t *o = l->opts;
    for (;;) {
        tdr_set_result_t res;
        tdr_run_set(l, false, &res);
        if (res.outcome == TDR_SET_SUCCEEDED) {
            int code = after_success(l, &res);
            if (code >= 0) return code;
        }
        if (res.outcome == TDR_SET_INTERRUPTED) {
            char nb[32];
            tdr_eprintf("tdistrun: stopped by %s\n",
                        tdr_signal_name(res.stop_signal, nb, sizeof nb));
            if (l->coord) tdr_coord_abort(l->coord, "its launcher was stopped by a signal");
            return 128 + res.stop_signal;
        }
        if (res.outcome == TDR_SET_ERROR) {
            tdr_eprintf("tdistrun: could not start the worker set\n");
            return TDR_EXIT_SETUP;
        }
        bool remote = res.outcome == TDR_SET_REMOTE;
        if (remote && res.remote_event != TDR_COORD_FAILED) return TDR_EXIT_SETUP;
        int code = remote ? TDR_EXIT_SETUP : failure_exit_code(&res);
        if (l->attempt >= o->max_restarts) {
            give_up_message(o);
            return code;
        }
        l->attempt++;
        char desc[96];
        if (remote)
            tdr_eprintf("tdistrun: restarting the worker set (restart %d of %d) after a failure "
                        "on another node\n", l->attempt, o->max_restarts);
        else
            tdr_eprintf("tdistrun: restarting the worker set (restart %d of %d) after rank %d "
                        "%s\n", l->attempt, o->max_restarts, res.first_rank,
                        tdr_describe(res.first_exited, res.first_code, res.first_signal, desc,
                                     sizeof desc));
    }
}

/* Checks and warnings that need the system, not just the command line. */
static int check_environment(const tdr_opts_t *o)
{
    if (o->log_dir && tdr_make_attempt_dir(o->log_dir, 0) != 0) {
        tdr_eprintf("tdistrun: --log-dir %s: not a directory this launcher can write to\n",
                    o->log_dir);
        return TDR_EXIT_USAGE;
    }
    int cpus = tdr_usable_cpus();
    if (o->bind_core && o->nproc_per_node > cpus)
        tdr_eprintf("tdistrun: warning: --bind-to core with %d workers but %d usable CPU%s: "
                    "workers will share CPUs (local rank i runs on CPU i mod %d)\n",
                    o->nproc_per_node, cpus, cpus == 1 ? "" : "s", cpus);
    return 0;
}

/* The job's secret: kept from the environment (TDIST_JOB_SECRET, or the
 * older TDIST_STORE_TOKEN) when set; else, on a single-node job, 32 random
 * bytes in hex, put into this process's environment so the store hosted
 * here and every worker (which inherits it, never on a command line) share
 * it. A multi-node job cannot make one (the other nodes would not know
 * it): it runs without one, with a warning. 0, or TDR_EXIT_SETUP. */
static int ensure_secret(const tdr_opts_t *o)
{
    if (tdist__env_job_secret()) return 0;
    if (o->nnodes > 1) {
        if (!o->quiet)
            tdr_eprintf("tdistrun: warning: no TDIST_JOB_SECRET for a %d-node job: any process "
                        "that can reach the store or a rank can join or read the job; set the "
                        "same TDIST_JOB_SECRET in every node's environment (docs/tdistrun.md)\n",
                        o->nnodes);
        return 0;
    }
    uint8_t raw[32];
    char hex[2 * sizeof raw + 1];
    if (tdist__random_bytes(raw, sizeof raw) != 0) {
        tdr_eprintf("tdistrun: cannot make the job's secret: getrandom: %s\n", strerror(errno));
        return TDR_EXIT_SETUP;
    }
    for (size_t i = 0; i < sizeof raw; i++) snprintf(hex + 2 * i, 3, "%02x", raw[i]);
    memset(raw, 0, sizeof raw);
    int rc = setenv("TDIST_JOB_SECRET", hex, 1);
    memset(hex, 0, sizeof hex);
    if (rc != 0) {
        tdr_eprintf("tdistrun: cannot set TDIST_JOB_SECRET: %s\n", strerror(errno));
        return TDR_EXIT_SETUP;
    }
    return 0;
}

/* Everything after the command line: returns the exit code. */
static int launch(tdr_opts_t *o)
{
    char *prog = tdr_resolve_program(o->prog_argv[0]);
    if (!prog) return TDR_EXIT_NOT_FOUND;
    if (o->mpi) {
        int code = tdr_exec_mpirun(o, prog);
        free(prog);
        return code;
    }
    tdr_guard_start();
    if (tdr_signals_install() != 0) {
        tdr_eprintf("tdistrun: cannot install signal handlers: %s\n", strerror(errno));
        free(prog);
        return TDR_EXIT_SETUP;
    }
    tdist_store_server_t *srv = NULL;
    int port = o->master_port;
    int rc = ensure_secret(o);
    if (rc == 0 && o->node_rank == 0) rc = start_store(o, &srv, &port);
    tdr_coord_t *coord = NULL;
    if (rc == 0) {
        print_start(o, srv != NULL, port, prog);
        if (o->nnodes > 1 && tdr_coord_create(o->master_addr, port, o->node_rank, o->nnodes,
                                              &coord) != 0)
            rc = tdr_stop_signal() ? 128 + tdr_stop_signal() : TDR_EXIT_SETUP;
    }
    if (rc == 0) {
        tdr_launch_t l = {
            .opts = o,
            .prog_path = prog,
            .nworkers = o->nproc_per_node,
            .rank_base = o->node_rank * o->nproc_per_node,
            .local_rank_base = 0,
            .master_addr = o->master_addr,
            .master_port = port,
            .launcher_store = true,
            .coord = coord,
        };
        rc = run_attempts(&l);
    }
    tdr_coord_destroy(coord);
    if (srv && o->nnodes > 1 && rc == 0) linger_for_other_nodes(srv, o->quiet);
    tdist_store_server_destroy(srv);
    free(prog);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc >= 2 && strcmp(argv[1], TDR_MPI_WORKER_ARG) == 0)
        return tdr_mpi_worker_main(argc - 1, argv + 1);
    tdr_opts_t o;
    int rc = tdr_parse_args(argc, argv, &o, stderr);
    if (rc == 1) return 0;
    if (rc != 0) return rc;
    fflush(stdout);
    tdr_sinks_init(o.timestamps);
    rc = check_environment(&o);
    if (rc == 0) rc = launch(&o);
    tdr_guard_stop();
    tdr_sinks_finish();
    return rc;
}
