/* tools/tdistrun/mpi.c — --backend mpi.
 *
 * This node's workers are MPI processes, so mpirun starts them (its ranks,
 * its signals, its exit status); tdistrun execs
 *
 *   mpirun -np N [flags] <tdistrun> --mpi-worker <output options> -- program args
 *
 * and every rank mpirun starts is a small tdistrun wrapper that reads its
 * rank from the variables MPI launchers set (OMPI_COMM_WORLD_RANK, PMIX_RANK,
 * PMI_RANK, SLURM_PROCID), runs the program as a one-worker set (same
 * environment, plus TDIST_LINE_BUFFERED=1) and forwards its output as the
 * launcher does: "[rank R]" prefixes, --timestamps, --local-ranks-filter,
 * --log-dir, --tee. The wrapper forwards the signals it gets to the program
 * and ends the way the program ended (its exit status, or the same signal),
 * so mpirun sees what it would have seen without it.
 *
 * TDIST_MPIRUN names another launcher (e.g. MPICH's mpiexec, which takes
 * -np and passes the environment); then only -np N is added.
 */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "core/internal.h"
#include "tdistrun.h"

/* The wrapper's options, as tdistrun's own (nproc/filter/output ones). */
static int wrapper_args(const tdr_opts_t *o, char **av, int k, char *np, char *grace)
{
    av[k++] = TDR_MPI_WORKER_ARG;
    av[k++] = "--nproc-per-node";
    av[k++] = np;
    av[k++] = "--grace-period";
    av[k++] = grace;
    if (!o->prefix) av[k++] = "--no-prefix";
    if (o->timestamps) av[k++] = "--timestamps";
    if (o->quiet) av[k++] = "--quiet";
    if (o->log_dir) {
        av[k++] = "--log-dir";
        av[k++] = (char *)o->log_dir;
    }
    if (o->tee_dir) {
        av[k++] = "--tee";
        av[k++] = (char *)o->tee_dir;
    }
    if (o->ranks_filter) {
        av[k++] = "--local-ranks-filter";
        av[k++] = (char *)o->ranks_filter;
    }
    av[k++] = "--";
    return k;
}

int tdr_exec_mpirun(const tdr_opts_t *o, const char *prog)
{
    const char *launcher = getenv("TDIST_MPIRUN");
    bool ompi = !launcher || !*launcher;
    char *mpirun = tdr_resolve_program(ompi ? "mpirun" : launcher);
    if (!mpirun) return TDR_EXIT_NOT_FOUND;
    char self[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    int nargs = 0;
    for (char **a = o->prog_argv; *a; a++) nargs++;
    char **av = calloc((size_t)nargs + 40, sizeof *av);
    if (!av || len <= 0) {
        tdr_eprintf("tdistrun: cannot build the mpirun command: %s\n",
                    av ? "/proc/self/exe is unreadable" : "out of memory");
        free(av);
        free(mpirun);
        return TDR_EXIT_SETUP;
    }
    self[len] = '\0';
    char np[16], grace[32];
    snprintf(np, sizeof np, "%d", o->nproc_per_node);
    snprintf(grace, sizeof grace, "%.3f", (double)o->grace_ms / 1000.0);
    int k = 0;
    av[k++] = mpirun;
    av[k++] = "-np";
    av[k++] = np;
    if (ompi) {
        int cpus = tdr_usable_cpus();
        if (o->nproc_per_node > cpus) av[k++] = "--oversubscribe";
        av[k++] = "--bind-to";
        av[k++] = !o->bind_core ? "none" : o->nproc_per_node > cpus ? "core:overload-allowed"
                                                                    : "core";
        if (geteuid() == 0) av[k++] = "--allow-run-as-root";
        av[k++] = "-x";
        av[k++] = "TDIST_BACKEND";
    }
    av[k++] = self;
    k = wrapper_args(o, av, k, np, grace);
    av[k++] = (char *)prog;
    for (int i = 1; i < nargs; i++) av[k++] = o->prog_argv[i];
    av[k] = NULL;
    setenv("TDIST_BACKEND", "mpi", 1);
    if (!o->quiet) {
        char *cmd = tdr_command_text(av[0], av);
        tdr_eprintf("tdistrun: backend mpi: starting %d worker%s with %s\n", o->nproc_per_node,
                    o->nproc_per_node == 1 ? "" : "s", cmd ? cmd : mpirun);
        free(cmd);
    }
    tdr_sinks_finish();
    execv(mpirun, av);
    fprintf(stderr, "tdistrun: cannot run %s: %s\n", mpirun, strerror(errno));
    free(av);
    free(mpirun);
    return TDR_EXIT_NOT_FOUND;
}

/* The first of names that is set to a whole number >= 0; -1 if none. */
static int env_rank(const char *const *names, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const char *v = getenv(names[i]);
        int64_t r;
        if (v && tdist__parse_int(v, 0, INT32_MAX, &r) == 0) return (int)r;
    }
    return -1;
}

/* End the way the program did: its status, or the same signal (without a
 * second core dump). */
static int end_like(const tdr_set_result_t *res)
{
    if (res->outcome == TDR_SET_ERROR) return TDR_EXIT_SETUP;
    if (res->w0_exited) return res->w0_code;
    int sig = res->w0_signal;
    if (sig <= 0) return res->stop_signal ? 128 + res->stop_signal : TDR_EXIT_SETUP;
    struct rlimit none = {0, 0};
    setrlimit(RLIMIT_CORE, &none);
    signal(sig, SIG_DFL);
    sigset_t one;
    sigemptyset(&one);
    sigaddset(&one, sig);
    sigprocmask(SIG_UNBLOCK, &one, NULL);
    raise(sig);
    return 128 + sig;
}

int tdr_mpi_worker_main(int argc, char **argv)
{
    static const char *const rank_vars[] = {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK",
                                            "SLURM_PROCID"};
    static const char *const local_vars[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID",
                                             "SLURM_LOCALID"};
    tdr_opts_t o;
    int rc = tdr_parse_args(argc, argv, &o, stderr);
    if (rc == 1) return 0;
    if (rc != 0) return rc;
    o.mpi = false;
    int rank = env_rank(rank_vars, TDIST_ARRAY_SIZE(rank_vars));
    if (rank < 0) {
        fprintf(stderr, "tdistrun " TDR_MPI_WORKER_ARG ": none of OMPI_COMM_WORLD_RANK, "
                        "PMIX_RANK, PMI_RANK, SLURM_PROCID is set: this mode is for the ranks "
                        "mpirun starts under tdistrun --backend mpi\n");
        return TDR_EXIT_SETUP;
    }
    int local = env_rank(local_vars, TDIST_ARRAY_SIZE(local_vars));
    if (local < 0) local = rank % o.nproc_per_node;
    tdr_sinks_init(o.timestamps);
    char *prog = tdr_resolve_program(o.prog_argv[0]);
    if (!prog) {
        tdr_sinks_finish();
        return TDR_EXIT_NOT_FOUND;
    }
    tdr_guard_start();
    tdr_set_result_t res = {.outcome = TDR_SET_ERROR};
    if (tdr_signals_install() != 0) {
        tdr_eprintf("tdistrun: cannot install signal handlers: %s\n", strerror(errno));
    } else {
        tdr_launch_t l = {.opts = &o, .prog_path = prog, .nworkers = 1, .rank_base = rank,
                          .local_rank_base = local, .plain_env = true};
        tdr_run_set(&l, true, &res);
    }
    free(prog);
    tdr_guard_stop();
    tdr_sinks_finish();
    return end_like(&res);
}
