/* tools/tdistrun/args.c — the command line of tdistrun. */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <sched.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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
        "GROUP_RANK, NODE_RANK, TDIST_RESTART_COUNT, TDIST_LAUNCHER_STORE,\n"
        "TDIST_LINE_BUFFERED), host the job's TCP store on the master node, forward\n"
        "output and signals, and stop every worker when one fails.\n"
        "\n"
        "options (each also accepted as --option=value, and with '_' for '-'):\n"
        "  --nproc-per-node N|auto  workers on this node (required, 1..4096); auto:\n"
        "                        one per CPU this launcher may run on\n"
        "  --standalone          one node, the store on 127.0.0.1 at a free port (the\n"
        "                        default, made explicit; no --nnodes > 1 or address)\n"
        "  --nnodes M            nodes in the job (default 1)\n"
        "  --node-rank K         this node's rank, 0..M-1 (default 0); node 0 hosts the store\n"
        "  --master-addr A       address of node 0; the store binds to it (default 127.0.0.1)\n"
        "  --master-port P       store port on node 0 (default 0: a free port, single node\n"
        "                        only; required when --nnodes > 1)\n"
        "  --rdzv-endpoint H:P   the same as --master-addr H --master-port P; an IPv6\n"
        "                        address in brackets: [::1]:29500\n"
        "  --max-restarts K      restart the whole worker set up to K times after a\n"
        "                        failure (default 0)\n"
        "  --grace-period S      seconds between the stop signal and SIGKILL when\n"
        "                        stopping workers (default 5; decimals allowed)\n"
        "  --no-prefix           do not prefix output lines with \"[rank R] \"\n"
        "  --timestamps          start every output line with the time it was read\n"
        "  --local-ranks-filter L  show only these local ranks' output on the console\n"
        "                        (L: comma-separated, e.g. 0,2); all are still logged\n"
        "  --log-dir DIR         also write each worker's stdout and stderr, line by\n"
        "                        line, to DIR/attempt_<A>/rank_<R>.log\n"
        "  --tee DIR             also write each worker's raw stdout/stderr to\n"
        "                        DIR/attempt_<A>/rank_<R>.stdout and .stderr\n"
        "  --bind-to core|none   core: pin local worker i to the i-th CPU this launcher\n"
        "                        may run on (modulo their number; a warning when there\n"
        "                        are more workers than CPUs); none (default): leave\n"
        "                        placement to the kernel\n"
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
    OPT_ENDPOINT,
    OPT_STANDALONE,
    OPT_MAX_RESTARTS,
    OPT_GRACE,
    OPT_NO_PREFIX,
    OPT_TIMESTAMPS,
    OPT_FILTER,
    OPT_LOG_DIR,
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
    {"rdzv-endpoint", required_argument, NULL, OPT_ENDPOINT},
    {"rdzv_endpoint", required_argument, NULL, OPT_ENDPOINT},
    {"standalone", no_argument, NULL, OPT_STANDALONE},
    {"max-restarts", required_argument, NULL, OPT_MAX_RESTARTS},
    {"max_restarts", required_argument, NULL, OPT_MAX_RESTARTS},
    {"grace-period", required_argument, NULL, OPT_GRACE},
    {"grace_period", required_argument, NULL, OPT_GRACE},
    {"no-prefix", no_argument, NULL, OPT_NO_PREFIX},
    {"no_prefix", no_argument, NULL, OPT_NO_PREFIX},
    {"timestamps", no_argument, NULL, OPT_TIMESTAMPS},
    {"local-ranks-filter", required_argument, NULL, OPT_FILTER},
    {"local_ranks_filter", required_argument, NULL, OPT_FILTER},
    {"log-dir", required_argument, NULL, OPT_LOG_DIR},
    {"log_dir", required_argument, NULL, OPT_LOG_DIR},
    {"tee", required_argument, NULL, OPT_TEE},
    {"bind-to", required_argument, NULL, OPT_BIND},
    {"bind_to", required_argument, NULL, OPT_BIND},
    {"backend", required_argument, NULL, OPT_BACKEND},
    {"quiet", no_argument, NULL, 'q'},
    {"help", no_argument, NULL, 'h'},
    {"version", no_argument, NULL, OPT_VERSION},
    {NULL, 0, NULL, 0},
};

/* Which options the command line named (for the checks between them). */
typedef struct given {
    bool node_rank, backend, master_addr, master_port, endpoint;
} given_t;

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

int tdr_usable_cpus(void)
{
    cpu_set_t allowed;
    if (sched_getaffinity(0, sizeof allowed, &allowed) == 0 && CPU_COUNT(&allowed) > 0)
        return CPU_COUNT(&allowed);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)TDIST_MIN(n, (long)TDR_MAX_PROCS) : 1;
}

static int parse_nproc(FILE *err, const char *val, int *out)
{
    if (strcmp(val, "auto") == 0) {
        *out = TDIST_MIN(tdr_usable_cpus(), TDR_MAX_PROCS);
        return 0;
    }
    int64_t v;
    if (tdist__parse_int(val, 1, TDR_MAX_PROCS, &v) != 0)
        return usage_error(err, "--nproc-per-node: \"%s\" is neither auto nor a whole number in "
                                "[1, %d]", val, TDR_MAX_PROCS);
    *out = (int)v;
    return 0;
}

/* HOST:PORT, [IPV6]:PORT, HOST or [IPV6] into o->endpoint_host and
 * o->master_port (left as is when no port is given). */
static int parse_endpoint(FILE *err, const char *val, tdr_opts_t *o)
{
    const char *host = val, *port = NULL;
    size_t host_len;
    if (val[0] == '[') {
        const char *close = strchr(val, ']');
        if (!close || close == val + 1)
            return usage_error(err, "--rdzv-endpoint: \"%s\": an IPv6 address needs a closing "
                                    "bracket, as in [::1]:29500", val);
        host = val + 1;
        host_len = (size_t)(close - host);
        if (close[1] == ':') port = close + 2;
        else if (close[1] != '\0')
            return usage_error(err, "--rdzv-endpoint: \"%s\": expected :PORT after ]", val);
    } else {
        const char *colon = strchr(val, ':');
        if (colon && strchr(colon + 1, ':'))
            return usage_error(err, "--rdzv-endpoint: \"%s\": write an IPv6 address in brackets, "
                                    "as in [::1]:29500", val);
        host_len = colon ? (size_t)(colon - val) : strlen(val);
        if (colon) port = colon + 1;
    }
    if (host_len == 0)
        return usage_error(err, "--rdzv-endpoint: \"%s\" names no host (HOST:PORT)", val);
    if (host_len >= sizeof o->endpoint_host)
        return usage_error(err, "--rdzv-endpoint: the host name is longer than %zu bytes",
                           sizeof o->endpoint_host - 1);
    memcpy(o->endpoint_host, host, host_len);
    o->endpoint_host[host_len] = '\0';
    o->master_addr = o->endpoint_host;
    if (port) return parse_int_opt(err, "--rdzv-endpoint port", port, 0, 65535, &o->master_port);
    return 0;
}

/* "0,2,5" into o->shown; every rank must be below nproc_per_node. */
static int parse_ranks_filter(FILE *err, tdr_opts_t *o)
{
    const char *s = o->ranks_filter;
    memset(o->shown, 0, sizeof o->shown);
    if (!*s) return usage_error(err, "--local-ranks-filter: empty list (e.g. 0,2)");
    for (int guard = 0; guard <= TDR_MAX_PROCS; guard++) {
        const char *comma = strchr(s, ',');
        size_t len = comma ? (size_t)(comma - s) : strlen(s);
        char item[16];
        int64_t v;
        if (len == 0 || len >= sizeof item)
            return usage_error(err, "--local-ranks-filter: \"%s\" is not a comma-separated "
                                    "list of local ranks", o->ranks_filter);
        memcpy(item, s, len);
        item[len] = '\0';
        if (tdist__parse_int(item, 0, o->nproc_per_node - 1, &v) != 0)
            return usage_error(err, "--local-ranks-filter: \"%s\" is not a local rank: they "
                                    "are 0..%d with --nproc-per-node %d", item,
                               o->nproc_per_node - 1, o->nproc_per_node);
        o->shown[v / 64] |= UINT64_C(1) << (v % 64);
        if (!comma) return 0;
        s = comma + 1;
    }
    return usage_error(err, "--local-ranks-filter: too many entries");
}

static int parse_grace(FILE *err, const char *val, tdr_opts_t *o)
{
    char *end = NULL;
    errno = 0;
    double s = strtod(val, &end);
    if (errno || end == val || *end || !isfinite(s) || s < 0 || s > 86400)
        return usage_error(err, "--grace-period: \"%s\" is not a number of seconds in [0, 86400]",
                           val);
    o->grace_ms = (int64_t)(s * 1000.0 + 0.5);
    return 0;
}

static int parse_choice(FILE *err, const char *name, const char *val, const char *yes,
                        const char *no, bool *out)
{
    if (strcmp(val, yes) == 0) *out = true;
    else if (strcmp(val, no) == 0) *out = false;
    else return usage_error(err, "%s: \"%s\" is not %s or %s", name, val, yes, no);
    return 0;
}

/* One option (getopt's code c). Returns 0, 1 (help/version printed) or 2. */
static int apply_option(FILE *err, int c, const char *opt_text, tdr_opts_t *o, given_t *g)
{
    switch (c) {
    case OPT_NPROC: return parse_nproc(err, optarg, &o->nproc_per_node);
    case OPT_NNODES:
        return parse_int_opt(err, "--nnodes", optarg, 1, TDR_MAX_PROCS, &o->nnodes);
    case OPT_NODE_RANK:
        g->node_rank = true;
        return parse_int_opt(err, "--node-rank", optarg, 0, TDR_MAX_PROCS - 1, &o->node_rank);
    case OPT_MASTER_ADDR:
        if (!optarg[0]) return usage_error(err, "--master-addr: empty address");
        g->master_addr = true;
        o->master_addr = optarg;
        return 0;
    case OPT_MASTER_PORT:
        g->master_port = true;
        return parse_int_opt(err, "--master-port", optarg, 0, 65535, &o->master_port);
    case OPT_ENDPOINT: g->endpoint = true; return parse_endpoint(err, optarg, o);
    case OPT_STANDALONE: o->standalone = true; return 0;
    case OPT_MAX_RESTARTS:
        return parse_int_opt(err, "--max-restarts", optarg, 0, 1000000, &o->max_restarts);
    case OPT_GRACE: return parse_grace(err, optarg, o);
    case OPT_NO_PREFIX: o->prefix = false; return 0;
    case OPT_TIMESTAMPS: o->timestamps = true; return 0;
    case OPT_FILTER: o->ranks_filter = optarg; return 0;
    case OPT_LOG_DIR:
        if (!optarg[0]) return usage_error(err, "--log-dir: empty directory name");
        o->log_dir = optarg;
        return 0;
    case OPT_TEE:
        if (!optarg[0]) return usage_error(err, "--tee: empty directory name");
        o->tee_dir = optarg;
        return 0;
    case OPT_BIND: return parse_choice(err, "--bind-to", optarg, "core", "none", &o->bind_core);
    case OPT_BACKEND:
        g->backend = true;
        return parse_choice(err, "--backend", optarg, "mpi", "native", &o->mpi);
    case 'q': o->quiet = true; return 0;
    case 'h': tdr_usage(stdout); return 1;
    case OPT_VERSION: printf("tdistrun (tdist) %s\n", tdist_version()); return 1;
    case ':': return usage_error(err, "option %s needs a value", opt_text);
    default: return usage_error(err, "unknown option %s", opt_text);
    }
}

/* The checks between options, once all are read. */
static int check_options(FILE *err, tdr_opts_t *o, const given_t *g)
{
    if (o->nproc_per_node == 0) return usage_error(err, "--nproc-per-node is required");
    if (g->endpoint && (g->master_addr || g->master_port))
        return usage_error(err, "--rdzv-endpoint gives the store's address and port: do not "
                                "also give --master-addr or --master-port");
    if (o->standalone && (o->nnodes > 1 || o->node_rank > 0 || g->master_addr ||
                          g->master_port || g->endpoint))
        return usage_error(err, "--standalone runs one node with its store on 127.0.0.1 at a "
                                "free port: it takes no --nnodes > 1, --node-rank, "
                                "--master-addr, --master-port or --rdzv-endpoint");
    if (o->node_rank >= o->nnodes)
        return usage_error(err, "--node-rank %d must be less than --nnodes %d", o->node_rank,
                           o->nnodes);
    if (o->nnodes > 1 && o->master_port < 0)
        return usage_error(err,
                           "--nnodes > 1 needs --master-port: the other nodes must know the "
                           "store's port");
    if (o->nnodes > 1 && o->master_port == 0)
        return usage_error(err, "--master-port 0 cannot be used with --nnodes > 1");
    if (o->nnodes > 1 && !g->node_rank)
        return usage_error(err, "--nnodes > 1 needs --node-rank");
    if ((int64_t)o->nnodes * o->nproc_per_node > TDR_MAX_WORLD)
        return usage_error(err, "--nnodes x --nproc-per-node exceeds %d workers", TDR_MAX_WORLD);
    if (o->ranks_filter) {
        int rc = parse_ranks_filter(err, o);
        if (rc) return rc;
    }
    if (!g->backend) {
        const char *b = getenv("TDIST_BACKEND");
        o->mpi = b && strcmp(b, "mpi") == 0;
    }
    if (o->mpi && (o->nnodes > 1 || o->max_restarts > 0))
        return usage_error(err, "--backend mpi starts the job with mpirun on this node: it "
                                "takes no --nnodes or --max-restarts (use mpirun's own host "
                                "list for several nodes)");
    return 0;
}

int tdr_parse_args(int argc, char **argv, tdr_opts_t *o, FILE *err)
{
    memset(o, 0, sizeof *o);
    o->nnodes = 1;
    o->master_addr = "127.0.0.1";
    o->master_port = -1;
    o->grace_ms = 5000;
    o->prefix = true;
    memset(o->shown, 0xff, sizeof o->shown);

    given_t g = {0};
    optind = 1;
    opterr = 0;
    for (;;) {
        int prev = optind;
        /* '+': stop at the first non-option (the program); ':': report a
         * missing argument as ':'. */
        int c = getopt_long(argc, argv, "+:hq", long_opts, NULL);
        if (c == -1) break;
        int rc = apply_option(err, c, argv[prev < argc ? prev : argc - 1], o, &g);
        if (rc) return rc;
    }
    int rc = check_options(err, o, &g);
    if (rc) return rc;
    if (optind >= argc) return usage_error(err, "no program given");
    o->prog_argv = &argv[optind];
    return 0;
}
