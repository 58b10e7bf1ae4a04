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

/* Find prog the way execvp would (a name with a '/' is used as is).
 * Returns a malloc'd path, or NULL after printing why. */
static char *resolve_program(const char *prog)
{
    if (strchr(prog, '/')) {
        if (is_executable_file(prog)) return tdist__strdup(prog);
        fprintf(stderr, "tdistrun: %s: %s\n", prog,
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
    fprintf(stderr, "tdistrun: %s: command not found in PATH\n", prog);
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
            fprintf(stderr, "tdistrun: waiting up to %d s for workers of other nodes to leave "
                            "the store\n", MULTINODE_LINGER_MS / 1000);
            said = true;
        }
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

/* --backend mpi: this node's workers are MPI processes, so mpirun starts
 * them (its ranks, its signals, its output); tdistrun only builds the
 * command. TDIST_MPIRUN names another launcher (e.g. MPICH's mpiexec, which
 * takes -np and passes the environment). Returns only on failure. */
static int exec_mpirun(const tdr_opts_t *o, const char *prog)
{
    const char *launcher = getenv("TDIST_MPIRUN");
    bool ompi = !launcher || !*launcher;
    char *mpirun = resolve_program(ompi ? "mpirun" : launcher);
    if (!mpirun) return TDR_EXIT_NOT_FOUND;
    int nargs = 0;
    for (char **a = o->prog_argv; *a; a++) nargs++;
    char **av = calloc((size_t)nargs + 16, sizeof *av);
    char np[16];
    snprintf(np, sizeof np, "%d", o->nproc_per_node);
    if (!av) {
        free(mpirun);
        return TDR_EXIT_SETUP;
    }
    int k = 0;
    av[k++] = mpirun;
    av[k++] = "-np";
    av[k++] = np;
    if (ompi) {
        long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
        if (ncpu > 0 && o->nproc_per_node > ncpu) av[k++] = "--oversubscribe";
        av[k++] = "--bind-to";
        av[k++] = o->bind_core ? "core" : "none";
        if (geteuid() == 0) av[k++] = "--allow-run-as-root";
        av[k++] = "-x";
        av[k++] = "TDIST_BACKEND";
    }
    av[k++] = (char *)prog;
    for (int i = 1; i < nargs; i++) av[k++] = o->prog_argv[i];
    av[k] = NULL;
    setenv("TDIST_BACKEND", "mpi", 1);
    if (!o->quiet) {
        fprintf(stderr, "tdistrun: backend mpi: starting %d worker%s with", o->nproc_per_node,
                o->nproc_per_node == 1 ? "" : "s");
        for (int i = 0; i < k; i++) fprintf(stderr, " %s", av[i]);
        fprintf(stderr, "\n");
    }
    execv(mpirun, av);
    fprintf(stderr, "tdistrun: cannot run %s: %s\n", mpirun, strerror(errno));
    free(av);
    free(mpirun);
    return TDR_EXIT_NOT_FOUND;
}

int main(int argc, char **argv)
{
    tdr_opts_t o;
    int rc = tdr_parse_args(argc, argv, &o, stderr);
    if (rc == 1) return 0;
    if (rc != 0) return rc;

    char *prog = resolve_program(o.prog_argv[0]);
    if (!prog) return TDR_EXIT_NOT_FOUND;
    if (o.mpi) {
        int code = exec_mpirun(&o, prog);
        free(prog);
        return code;
    }
    if (tdr_signals_install() != 0) {
        fprintf(stderr, "tdistrun: cannot install signal handlers: %s\n", strerror(errno));
        free(prog);
        return TDR_EXIT_SETUP;
    }

    tdist_store_server_t *srv = NULL;
    int port = o.master_port;
    if (o.node_rank == 0) {
        uint16_t want = (uint16_t)(o.master_port < 0 ? 0 : o.master_port);
        int listen_fd = inherited_listen_fd();
        tdist_status_t st = listen_fd >= 0 ? tdist_store_server_adopt(listen_fd, NULL, &srv)
                                           : tdist_store_server_create(o.master_addr, want, NULL, &srv);
        if (st == TDIST_OK && listen_fd >= 0 && o.master_port > 0 &&
            tdist_store_server_port(srv) != o.master_port) {
            fprintf(stderr, "tdistrun: TDIST_STORE_LISTEN_FD=%d listens on port %u, not on --master-port %d\n",
                    listen_fd, (unsigned)tdist_store_server_port(srv), o.master_port);
            tdist_store_server_destroy(srv);
            free(prog);
            return TDR_EXIT_SETUP;
        }
        if (st != TDIST_OK) {
            fprintf(stderr, "tdistrun: cannot start the store on %s:%u: %s (%s)\n",
                    o.master_addr, (unsigned)want, tdist_last_error(), tdist_status_str(st));
            free(prog);
            return TDR_EXIT_SETUP;
        }
        port = tdist_store_server_port(srv);
    }

    int world = o.nnodes * o.nproc_per_node;
    if (!o.quiet) {
        fprintf(stderr, "tdistrun: store %s %s:%d; starting %d worker%s (ranks %d..%d of %d): %s\n",
                srv ? "hosted here on" : "of node 0 at", o.master_addr, port, o.nproc_per_node,
                o.nproc_per_node == 1 ? "" : "s", o.node_rank * o.nproc_per_node,
                (o.node_rank + 1) * o.nproc_per_node - 1, world, prog);
    }

    tdr_coord_t *coord = NULL;
    if (o.nnodes > 1 && tdr_coord_create(o.master_addr, port, o.node_rank, o.nnodes, &coord) != 0) {
        int sig = tdr_stop_signal();
        tdist_store_server_destroy(srv);
        free(prog);
        return sig ? 128 + sig : TDR_EXIT_SETUP;
    }

    tdr_launch_t l = {
        .opts = &o,
        .prog_path = prog,
        .master_addr = o.master_addr,
        .master_port = port,
        .launcher_store = true,
        .attempt = 0,
        .coord = coord,
    };
    int exit_code = TDR_EXIT_SETUP;
    for (;;) {
        tdr_set_result_t res;
        tdr_run_set(&l, &res);
        if (res.outcome == TDR_SET_SUCCEEDED) {
            if (!o.quiet)
                fprintf(stderr, "tdistrun: all %d worker%s exited with status 0\n",
                        o.nproc_per_node, o.nproc_per_node == 1 ? "" : "s");
            if (coord) {
                /* Done only when every node is: another node's failure
                 * restarts this one too. */
                tdr_coord_event_t ev =
                    tdr_coord_finish(coord, l.attempt, res.remote_msg, sizeof res.remote_msg);
                if (ev == TDR_COORD_SIGNAL) {
                    char nb[32], why[64];
                    const char *name = tdr_signal_name(tdr_stop_signal(), nb, sizeof nb);
                    snprintf(why, sizeof why, "its launcher got %s", name);
                    tdr_coord_abort(coord, why);
                    fprintf(stderr, "tdistrun: stopped by %s\n", name);
                    exit_code = 128 + tdr_stop_signal();
                    break;
                }
                if (ev != TDR_COORD_NONE) {
                    res.outcome = TDR_SET_REMOTE;
                    res.remote_event = ev;
                    fprintf(stderr, "tdistrun: %s%s\n",
                            ev == TDR_COORD_LOST ? "" : "another node failed: ", res.remote_msg);
                }
            }
            if (res.outcome == TDR_SET_SUCCEEDED) {
                if (!o.quiet && coord)
                    fprintf(stderr, "tdistrun: all %d nodes finished\n", o.nnodes);
                exit_code = 0;
                break;
            }
        }
        if (res.outcome == TDR_SET_REMOTE) {
            exit_code = TDR_EXIT_SETUP;
            if (res.remote_event != TDR_COORD_FAILED) break; /* abort, or the store is gone */
            if (l.attempt >= o.max_restarts) {
                if (o.max_restarts > 0)
                    fprintf(stderr, "tdistrun: giving up after %d restart%s\n", o.max_restarts,
                            o.max_restarts == 1 ? "" : "s");
                break;
            }
            l.attempt++;
            fprintf(stderr, "tdistrun: restarting the worker set (restart %d of %d) after a "
                            "failure on another node\n", l.attempt, o.max_restarts);
            continue;
        }
        if (res.outcome == TDR_SET_INTERRUPTED) {
            char nb[32];
            fprintf(stderr, "tdistrun: stopped by %s\n",
                    tdr_signal_name(res.stop_signal, nb, sizeof nb));
            if (coord) tdr_coord_abort(coord, "its launcher was stopped by a signal");
            exit_code = 128 + res.stop_signal;
            break;
        }
        if (res.outcome == TDR_SET_ERROR) {
            fprintf(stderr, "tdistrun: could not start the worker set\n");
            exit_code = TDR_EXIT_SETUP;
            break;
        }
        /* TDR_SET_FAILED */
        exit_code = failure_exit_code(&res);
        if (l.attempt >= o.max_restarts) {
            if (o.max_restarts > 0)
                fprintf(stderr, "tdistrun: giving up after %d restart%s\n", o.max_restarts,
                        o.max_restarts == 1 ? "" : "s");
            break;
        }
        l.attempt++;
        char desc[96];
        fprintf(stderr, "tdistrun: restarting the worker set (restart %d of %d) after rank %d %s\n",
                l.attempt, o.max_restarts, res.first_rank,
                tdr_describe(res.first_exited, res.first_code, res.first_signal, desc, sizeof desc));
    }

    tdr_coord_destroy(coord);
    if (srv && o.nnodes > 1 && exit_code == 0) linger_for_other_nodes(srv, o.quiet);
    tdist_store_server_destroy(srv);
    free(prog);
    fflush(stdout);
    return exit_code;
}
