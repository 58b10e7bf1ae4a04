/* tools/tdistrun/args.c — the command line of tdistrun. */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "tdist/core.h"
#include "tdistrun.h"

void tdr_usage(FILE *f)
{
    fputs(
        "usage: tdistrun --nproc-per-node N [options] [--] program [args...]\n"
        "\n"
        "Start N copies of program on this node with the env:// variables set\n"
        "(MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,\n"
        "GROUP_RANK, NODE_RANK, TDIST_RESTART_COUNT, TDIST_LAUNCHER_STORE), host the\n"
        "job's TCP store on the master node, forward output and signals, and stop\n"
        "every worker when one fails.\n"
        "\n"
        "options (each also accepted as --option=value):\n"
        "  --nproc-per-node N    workers on this node (required, 1..4096)\n"
        "  --nnodes M            nodes in the job (default 1)\n"
        "  --node-rank K         this node's rank, 0..M-1 (default 0); node 0 hosts the store\n"
        "  --master-addr A       address of node 0; the store binds to it (default 127.0.0.1)\n"
        "  --master-port P       store port on node 0 (default 0: a free port, single node\n"
        "                        only; required when --nnodes > 1)\n"
        "  --max-restarts K      restart the whole worker set up to K times after a\n"
        "                        failure (default 0)\n"
        "  --grace-period S      seconds between the stop signal and SIGKILL when\n"
        "                        stopping workers (default 5; decimals allowed)\n"
        "  --no-prefix           do not prefix output lines with \"[rank R] \"\n"
        "  --bind-to core|none   core: pin local worker i to the i-th CPU this launcher\n"
        "                        may run on (modulo their number); none (default):\n"
        "                        leave placement to the kernel\n"
        "  --tee DIR             also write each worker's raw stdout/stderr to\n"
        "                        DIR/attempt_<A>/rank_<R>.stdout and .stderr\n"
        "  --backend native|mpi  mpi: run the workers under mpirun -np N (one node)\n"
        "                        with TDIST_BACKEND=mpi, so their groups use MPI\n"
        "                        (default: TDIST_BACKEND, else native; docs/mpi.md)\n"
        "  -q, --quiet           print only errors and the failure report\n"
        "  -h, --help            print this help and exit 0\n"
        "  --version             print the version and exit 0\n"
        "\n"
        "exit status: 0 when every worker exited 0; the first failed worker's exit\n"
        "status, or 128+N if it was killed by signal N; 128+N when tdistrun itself\n"
        "got signal N (SIGINT, SIGTERM, SIGHUP); 1 if tdistrun could not start (or,\n"
        "with --nnodes > 1, stopped because of another node); 2 for a bad command\n"
        "line; 127 if program was not found. See docs/tdistrun.md.\n",
        f);
}

enum {
    OPT_NPROC = 1000,
    OPT_NNODES,
    OPT_NODE_RANK,
    OPT_MASTER_ADDR,
    OPT_MASTER_PORT,
    OPT_MAX_RESTARTS,
    OPT_GRACE,
    OPT_NO_PREFIX,
    OPT_TEE,
    OPT_BIND,
    OPT_BACKEND,
    OPT_VERSION
};

static const struct option long_opts[] = {
    {"nproc-per-node", required_argument, NULL, OPT_NPROC},
    {"nproc_per_node", required_argument, NULL, OPT_NPROC},
    {"nnodes", required_argument, NULL, OPT_NNODES},
    {"node-rank", required_argument, NULL, OPT_NODE_RANK},
    {"node_rank", required_argument, NULL, OPT_NODE_RANK},
    {"master-addr", required_argument, NULL, OPT_MASTER_ADDR},
    {"master_addr", required_argument, NULL, OPT_MASTER_ADDR},
    {"master-port", required_argument, NULL, OPT_MASTER_PORT},
    {"master_port", required_argument, NULL, OPT_MASTER_PORT},
    {"max-restarts", required_argument, NULL, OPT_MAX_RESTARTS},
    {"max_restarts", required_argument, NULL, OPT_MAX_RESTARTS},
    {"grace-period", required_argument, NULL, OPT_GRACE},
    {"no-prefix", no_argument, NULL, OPT_NO_PREFIX},
    {"tee", required_argument, NULL, OPT_TEE},
    {"bind-to", required_argument, NULL, OPT_BIND},
    {"backend", required_argument, NULL, OPT_BACKEND},
    {"quiet", no_argument, NULL, 'q'},
    {"help", no_argument, NULL, 'h'},
    {"version", no_argument, NULL, OPT_VERSION},
    {NULL, 0, NULL, 0},
};

static int usage_error(FILE *err, const char *fmt, ...) TDIST_PRINTF(2, 3);

/* Print "tdistrun: <message>", a blank line and the usage; return 2. */
static int usage_error(FILE *err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("tdistrun: ", err);
    vfprintf(err, fmt, ap);
    va_end(ap);
    fputs("\n\n", err);
    tdr_usage(err);
    return TDR_EXIT_USAGE;
}

static int parse_int_opt(FILE *err, const char *name, const char *val, int64_t lo, int64_t hi,
                         int *out)
{
    int64_t v;
    if (tdist__parse_int(val, lo, hi, &v) != 0) {
        return usage_error(err, "%s: \"%s\" is not a whole number in [%lld, %lld]", name, val,
                           (long long)lo, (long long)hi);
    }
    *out = (int)v;
    return 0;
}

int tdr_parse_args(int argc, char **argv, tdr_opts_t *o, FILE *err)
{
    memset(o, 0, sizeof *o);
    o->nproc_per_node = 0;
    o->nnodes = 1;
    o->node_rank = 0;
    o->master_addr = "127.0.0.1";
    o->master_port = -1;
    o->max_restarts = 0;
    o->grace_ms = 5000;
    o->prefix = true;
    o->tee_dir = NULL;
    o->quiet = false;

    bool node_rank_given = false, backend_given = false;
    optind = 1;
    opterr = 0;
    int rc;
    for (;;) {
        int prev = optind;
        /* '+': stop at the first non-option (the program); ':': report a
         * missing argument as ':'. */
        int c = getopt_long(argc, argv, "+:hq", long_opts, NULL);
        if (c == -1) break;
        const char *opt_text = argv[prev < argc ? prev : argc - 1];
        switch (c) {
        case OPT_NPROC:
            if ((rc = parse_int_opt(err, "--nproc-per-node", optarg, 1, TDR_MAX_PROCS,
                                    &o->nproc_per_node)))
                return rc;
            break;
        case OPT_NNODES:
            if ((rc = parse_int_opt(err, "--nnodes", optarg, 1, TDR_MAX_PROCS, &o->nnodes)))
                return rc;
            break;
        case OPT_NODE_RANK:
            if ((rc = parse_int_opt(err, "--node-rank", optarg, 0, TDR_MAX_PROCS - 1,
                                    &o->node_rank)))
                return rc;
            node_rank_given = true;
            break;
        case OPT_MASTER_ADDR:
            if (!optarg[0]) return usage_error(err, "--master-addr: empty address");
            o->master_addr = optarg;
            break;
        case OPT_MASTER_PORT:
            if ((rc = parse_int_opt(err, "--master-port", optarg, 0, 65535, &o->master_port)))
                return rc;
            break;
        case OPT_MAX_RESTARTS:
            if ((rc = parse_int_opt(err, "--max-restarts", optarg, 0, 1000000, &o->max_restarts)))
                return rc;
            break;
        case OPT_GRACE: {
            char *end = NULL;
            errno = 0;
            double s = strtod(optarg, &end);
            if (errno || end == optarg || *end || !isfinite(s) || s < 0 || s > 86400)
                return usage_error(err, "--grace-period: \"%s\" is not a number of seconds "
                                        "in [0, 86400]", optarg);
            o->grace_ms = (int64_t)(s * 1000.0 + 0.5);
            break;
        }
        case OPT_NO_PREFIX:
            o->prefix = false;
            break;
        case OPT_TEE:
            if (!optarg[0]) return usage_error(err, "--tee: empty directory name");
            o->tee_dir = optarg;
            break;
        case OPT_BIND:
            if (strcmp(optarg, "core") == 0)
                o->bind_core = true;
            else if (strcmp(optarg, "none") == 0)
                o->bind_core = false;
            else
                return usage_error(err, "--bind-to: \"%s\" is not core or none", optarg);
            break;
        case OPT_BACKEND:
            if (strcmp(optarg, "native") == 0)
                o->mpi = false;
            else if (strcmp(optarg, "mpi") == 0)
                o->mpi = true;
            else
                return usage_error(err, "--backend: \"%s\" is not native or mpi", optarg);
            backend_given = true;
            break;
        case 'q':
            o->quiet = true;
            break;
        case 'h':
            tdr_usage(stdout);
            return 1;
        case OPT_VERSION:
            printf("tdistrun (tdist) %s\n", tdist_version());
            return 1;
        case ':':
            return usage_error(err, "option %s needs a value", opt_text);
        default:
            return usage_error(err, "unknown option %s", opt_text);
        }
    }

    if (o->nproc_per_node == 0)
        return usage_error(err, "--nproc-per-node is required");
    if (o->node_rank >= o->nnodes)
        return usage_error(err, "--node-rank %d must be less than --nnodes %d", o->node_rank,
                           o->nnodes);
    if (o->nnodes > 1 && o->master_port < 0)
        return usage_error(err,
                           "--nnodes > 1 needs --master-port: the other nodes must know the "
                           "store's port");
    if (o->nnodes > 1 && o->master_port == 0)
        return usage_error(err, "--master-port 0 cannot be used with --nnodes > 1");
    if (o->nnodes > 1 && !node_rank_given)
        return usage_error(err, "--nnodes > 1 needs --node-rank");
    if ((int64_t)o->nnodes * o->nproc_per_node > TDR_MAX_WORLD)
        return usage_error(err, "--nnodes x --nproc-per-node exceeds %d workers", TDR_MAX_WORLD);
    if (!backend_given) {
        const char *b = getenv("TDIST_BACKEND");
        o->mpi = b && strcmp(b, "mpi") == 0;
    }
    if (o->mpi && (o->nnodes > 1 || o->max_restarts > 0 || o->tee_dir))
        return usage_error(err, "--backend mpi starts the job with mpirun on this node: it "
                                "takes no --nnodes, --max-restarts or --tee (use mpirun's own "
                                "host list for several nodes)");
    if (optind >= argc) return usage_error(err, "no program given");
    o->prog_argv = &argv[optind];
    return 0;
}
