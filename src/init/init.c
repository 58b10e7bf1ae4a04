/*
 * init/init.c — tdist_init(): parse the init URL and the environment,
 * decide who hosts the store, open the store, run the rendezvous
 * (rendezvous.c) and hand back the world.
 *
 * Store layout: every key of one restart generation (TDIST_RESTART_COUNT,
 * default 0) lives under "tdist/g<gen>/": the rendezvous keys under
 * "tdist/g<gen>/rdzv/", the world's store (tdist_world_store) under
 * "tdist/g<gen>/user/". A restarted worker set therefore never sees the
 * keys of a previous attempt, even on the launcher's long-lived store.
 *
 * Where env:// finds the job (read_env_url): the torchrun variables
 * (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; tdistrun sets them). When
 * RANK and WORLD_SIZE are both unset and SLURM_PROCID is set, the process
 * is a task of a Slurm job step (srun): rank, world size and the local
 * checks come from SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID and the
 * tasks-per-node list, and the store is on the first host of the step's
 * node list at port 10000 + SLURM_JOB_ID % 50000, unless MASTER_ADDR /
 * MASTER_PORT say otherwise. With neither, the error says which launcher
 * to use.
 *
 * TDIST_LINE_BUFFERED=1 makes stdout line-buffered when the library is
 * loaded (line_buffer_stdout below).
 */
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "init/internal.h"
#include "init/mpi_world.h"

#define MAX_WORLD_SIZE (1 << 20)
#define MAX_URL 4096
#define HOST_MAX 256
/* env:// under Slurm without MASTER_PORT: the store's port is
 * SLURM_PORT_BASE + SLURM_JOB_ID % SLURM_PORT_SPAN (10000..59999). */
#define SLURM_PORT_BASE 10000
#define SLURM_PORT_SPAN 50000
/* Before the program's own constructors (priorities up to 100 belong to the
 * C implementation), so their output is line-buffered too. */
#define LINE_BUFFER_CTOR_PRIORITY 101

typedef enum url_kind { URL_ENV, URL_TCP, URL_FILE } url_kind_t;

/* Everything tdist_init needs, from the URL, the environment and opts. */
typedef struct init_cfg {
    url_kind_t kind;
    const char *url;        /* as given (for messages) */
    char host[HOST_MAX];    /* store host (tcp://, env:// MASTER_ADDR) */
    int port;               /* store port; -1 unset */
    char *path;             /* file:// path (owned) */
    int64_t rank;           /* -1 unset */
    int64_t world_size;     /* -1 unset */
    int64_t local_rank;     /* LOCAL_RANK (or SLURM_LOCALID) or -1 */
    int64_t local_size;     /* LOCAL_WORLD_SIZE (or Slurm's tasks on this node) or -1 */
    char local_rank_src[64]; /* where local_rank came from, for messages */
    char local_size_src[64]; /* where local_size came from, for messages */
    bool slurm;             /* env:// found a Slurm job step (SLURM_PROCID) */
    int64_t generation;     /* TDIST_RESTART_COUNT */
    bool launcher_store;    /* TDIST_LAUNCHER_STORE=1 */
    int env_listen_fd;      /* TDIST_STORE_LISTEN_FD or -1 */
    char self_host[HOST_MAX]; /* this process's host name */
} init_cfg_t;

struct tdist_world {
    int rank;
    int world_size;
    int local_rank;
    int local_size;
    int64_t timeout_ms;
    bool is_file;
    tdist_store_server_t *server; /* rank 0 when it hosts the store */
    tdist_store_t *base;          /* TCP client or file store */
    tdist_store_t *rdzv_view;     /* "tdist/g<gen>/rdzv" over base */
    tdist_store_t *user;          /* "tdist/g<gen>/user" over base */
    tdist__rdzv_t rdzv;
    char host[HOST_MAX];
    /* the store's address (env:// MASTER_ADDR, tcp:// HOST; "" for
     * file://): multi-host groups bind to the interface that reaches it */
    char master[HOST_MAX];
    int master_port;
    pthread_mutex_t bind_mu;                 /* guards the two below */
    bool bind_known;
    char bind_addr[TDIST__IFADDR_MAX];       /* tdist__world_bind_addr */
    atomic_int world_groups;                 /* tdist__world_next_group */
    atomic_int failures;                     /* tdist__world_note_failure */
};

/* Inode of this process's network namespace (0 if /proc is not there).
 * Part of the host identity: two network namespaces of one machine are
 * two hosts (see init/internal.h). */
static uint64_t netns_inode(void)
{
    struct stat sb;
    if (stat("/proc/self/ns/net", &sb) != 0) return 0;
    return (uint64_t)sb.st_ino;
}

void tdist_init_opts_init(tdist_init_opts_t *opts)
{
    if (!opts) return;
    memset(opts, 0, sizeof *opts);
    opts->rank = -1;
    opts->world_size = -1;
    opts->timeout_ms = tdist__default_timeout_ms(TDIST_INIT_DEFAULT_TIMEOUT_MS);
    opts->token = NULL;
    opts->listen_fd = -1;
}

/* ------------------------------------------------------------ URL parsing */

static tdist_status_t bad_url(const char *url, const char *why)
{
    return tdist__error(TDIST_ERR_INVALID_ARG, "tdist_init: malformed init URL \"%.1000s\": %s", url,
                        why);
}

/* Parse "rank=R&world_size=N" (either, both, or empty). */
static tdist_status_t parse_query(const char *q, init_cfg_t *c)
{
    char buf[MAX_URL + 1];
    snprintf(buf, sizeof buf, "%s", q);
    if (buf[0] == '\0') return TDIST_OK;
    char *save = NULL;
    for (char *tok = strtok_r(buf, "&", &save); tok; tok = strtok_r(NULL, "&", &save)) {
        char *eq = strchr(tok, '=');
        if (!eq)
            return tdist__error(TDIST_ERR_INVALID_ARG,
                                "tdist_init: malformed init URL \"%.1000s\": parameter \"%.200s\" "
                                "has no value (expected name=value)",
                                c->url, tok);
        *eq = '\0';
        const char *name = tok, *val = eq + 1;
        int64_t *dst;
        int64_t lo, hi;
        if (strcmp(name, "rank") == 0) {
            dst = &c->rank;
            lo = 0;
            hi = MAX_WORLD_SIZE - 1;
        } else if (strcmp(name, "world_size") == 0) {
            dst = &c->world_size;
            lo = 1;
            hi = MAX_WORLD_SIZE;
        } else {
            return tdist__error(TDIST_ERR_INVALID_ARG,
                                "tdist_init: malformed init URL \"%.1000s\": unknown parameter "
                                "\"%.200s\" (known: rank, world_size)",
                                c->url, name);
        }
        if (*dst != -1)
            return tdist__error(TDIST_ERR_INVALID_ARG,
                                "tdist_init: malformed init URL \"%.1000s\": parameter %s given twice",
                                c->url, name);
        if (tdist__parse_int(val, lo, hi, dst) != 0)
            return tdist__error(TDIST_ERR_INVALID_ARG,
                                "tdist_init: malformed init URL \"%.1000s\": %s=\"%.200s\" is not a "
                                "whole number in [%" PRId64 ", %" PRId64 "]",
                                c->url, name, val, lo, hi);
    }
    return TDIST_OK;
}

/* "HOST:PORT" or "[V6]:PORT" (len bytes at a) -> c->host, c->port. */
static tdist_status_t parse_authority(const char *a, size_t len, init_cfg_t *c)
{
    char buf[MAX_URL + 1];
    if (len > 0 && a[len - 1] == '/') len--; /* tolerate "tcp://h:p/" */
    memcpy(buf, a, len);
    buf[len] = '\0';
    const char *host, *port;
    if (buf[0] == '[') {
        char *close = strchr(buf, ']');
        if (!close) return bad_url(c->url, "IPv6 address without closing ']'");
        *close = '\0';
        host = buf + 1;
        if (close[1] != ':') return bad_url(c->url, "missing \":PORT\" after the host");
        port = close + 2;
    } else {
        char *colon = strchr(buf, ':');
        if (!colon) return bad_url(c->url, "missing \":PORT\" after the host");
        if (strchr(colon + 1, ':'))
            return bad_url(c->url, "an IPv6 address must be written in brackets, as [::1]:PORT");
        *colon = '\0';
        host = buf;
        port = colon + 1;
    }
    if (host[0] == '\0') return bad_url(c->url, "empty host");
    if (strlen(host) >= HOST_MAX) return bad_url(c->url, "host name longer than 255 bytes");
    if (strchr(host, '/') || strchr(host, '[') || strchr(host, ']'))
        return bad_url(c->url, "invalid character in host");
    int64_t p;
    if (tdist__parse_int(port, 1, 65535, &p) != 0) {
        char why[320];
        snprintf(why, sizeof why, "port \"%.200s\" is not a number in [1, 65535]", port);
        return bad_url(c->url, why);
    }
    memcpy(c->host, host, strlen(host) + 1); /* < HOST_MAX: checked above */
    c->port = (int)p;
    return TDIST_OK;
}

static tdist_status_t parse_url(const char *url, init_cfg_t *c)
{
    c->url = url;
    if (strnlen(url, MAX_URL + 1) > MAX_URL) return bad_url(url, "longer than 4096 bytes");
    const char *q = strchr(url, '?');
    const char *query = q ? q + 1 : "";
    size_t body_end = q ? (size_t)(q - url) : strlen(url);
    if (strncasecmp(url, "env://", 6) == 0) {
        c->kind = URL_ENV;
        if (body_end != 6)
            return bad_url(url, "env:// takes no host or path (set MASTER_ADDR and MASTER_PORT)");
    } else if (strncasecmp(url, "tcp://", 6) == 0) {
        c->kind = URL_TCP;
        TDIST_CHECK(parse_authority(url + 6, body_end - 6, c));
    } else if (strncasecmp(url, "file://", 7) == 0) {
        c->kind = URL_FILE;
        size_t plen = body_end - 7;
        if (plen == 0 || url[7] != '/')
            return bad_url(url, "file:// needs an absolute path, as file:///path/to/file");
        if (plen == 1) return bad_url(url, "file:// path is only \"/\"");
        c->path = malloc(plen + 1);
        if (!c->path) return tdist__error(TDIST_ERR_NO_MEMORY, "tdist_init: out of memory");
        memcpy(c->path, url + 7, plen);
        c->path[plen] = '\0';
    } else {
        return bad_url(url, "unsupported scheme (expected env://, tcp://HOST:PORT or file:///path)");
    }
    return parse_query(query, c);
}

/* ------------------------------------------------------------ stdout */

/* Under a launcher stdout is a pipe, which the C library fills in blocks of
 * 4 KiB: a worker's lines would reach the launcher late, a block at a time,
 * and be lost when the worker dies. tdistrun sets TDIST_LINE_BUFFERED=1 in
 * its workers; then stdout is line-buffered from before main (and before
 * the program's own constructors). Every program that calls tdist_init
 * links this file, from libtdist.so or libtdist.a. Any other value, or
 * none, leaves stdout as the C library set it up. */
__attribute__((constructor(LINE_BUFFER_CTOR_PRIORITY))) static void line_buffer_stdout(void)
{
    const char *v = getenv("TDIST_LINE_BUFFERED");
    if (v && strcmp(v, "1") == 0) setvbuf(stdout, NULL, _IOLBF, 0);
}

/* ------------------------------------------------------------ Slurm */

static bool is_digit(char ch) { return ch >= '0' && ch <= '9'; }

static tdist_status_t bad_host_list(const char *var, const char *list, size_t at, const char *why)
{
    return tdist__error(TDIST_ERR_INVALID_ARG,
                        "tdist_init(env://): %s=\"%.300s\" is not a Slurm host list (such as "
                        "node[01-04,07],gpu3): %s at byte %zu; set MASTER_ADDR to name the "
                        "store's host yourself",
                        var, list, why, at);
}

/* Compare two runs of decimal digits as numbers (any length). */
static int digits_cmp(const char *a, size_t alen, const char *b, size_t blen)
{
    while (alen > 1 && *a == '0') a++, alen--;
    while (blen > 1 && *b == '0') b++, blen--;
    if (alen != blen) return alen < blen ? -1 : 1;
    return memcmp(a, b, alen);
}

/* The "[...]" of a host list that starts at list[i] == '[': ranges "A" or
 * "A-B" (decimal, A <= B) separated by ','. Returns the index just past
 * ']' and sets *first / *first_len to the first range's A as written (its
 * zero padding is the host name's); -1 after setting the error. */
static long host_list_brackets(const char *var, const char *list, size_t i, const char **first,
                               size_t *first_len)
{
    size_t j = i + 1;
    *first = NULL;
    for (;;) {
        size_t a = j;
        while (is_digit(list[j])) j++;
        size_t alen = j - a, b = j, blen = 0;
        if (list[j] == '-') {
            b = ++j;
            while (is_digit(list[j])) j++;
            blen = j - b;
        }
        if (alen == 0 || (b > a + alen && blen == 0)) {
            if (list[j] == '\0') break;
            bad_host_list(var, list, a, "a range in brackets must be NUMBER or NUMBER-NUMBER");
            return -1;
        }
        if (blen > 0 && digits_cmp(list + a, alen, list + b, blen) > 0) {
            bad_host_list(var, list, a, "a range runs backwards");
            return -1;
        }
        if (!*first) {
            *first = list + a;
            *first_len = alen;
        }
        if (list[j] == ',') {
            j++;
            continue;
        }
        if (list[j] == ']') return (long)(j + 1);
        if (list[j] == '\0') break;
        bad_host_list(var, list, j, "unexpected character in brackets");
        return -1;
    }
    bad_host_list(var, list, i, "'[' without a closing ']'");
    return -1;
}

/* The first host of a Slurm host list (SLURM_JOB_NODELIST): entries
 * separated by ',', each a name in which "[...]" stands for a list of
 * numbers and ranges, as node[01-04,07],gpu3 (first host node01) or
 * rack[1-2]-n[5,9] (rack1-n5). The whole list is checked; malformed lists
 * and a first host of n bytes or more are INVALID_ARG naming var. */
tdist_status_t tdist__slurm_first_host(const char *var, const char *list, char *host, size_t n)
{
    if (list[0] == '\0') return bad_host_list(var, list, 0, "the list is empty");
    size_t len = 0, entry = 0;
    bool empty = true; /* the current entry has no character yet */
    for (size_t i = 0;;) {
        char ch = list[i];
        if (ch == '\0' || ch == ',') {
            if (empty) return bad_host_list(var, list, i, "empty host name");
            if (ch == '\0') break;
            entry++;
            empty = true;
            i++;
            continue;
        }
        const char *piece = list + i;
        size_t plen = 1;
        if (ch == '[') {
            long end = host_list_brackets(var, list, i, &piece, &plen);
            if (end < 0) return TDIST_ERR_INVALID_ARG;
            i = (size_t)end;
        } else if (ch == ']') {
            return bad_host_list(var, list, i, "']' without '['");
        } else if ((unsigned char)ch <= ' ' || ch == 0x7f) {
            return bad_host_list(var, list, i, "blank or control character");
        } else {
            i++;
        }
        empty = false;
        if (entry > 0) continue;
        if (len + plen >= n)
            return tdist__error(TDIST_ERR_INVALID_ARG,
                                "tdist_init(env://): the first host of %s=\"%.300s\" is longer "
                                "than %zu bytes",
                                var, list, n - 1);
        memcpy(host + len, piece, plen);
        len += plen;
    }
    host[len] = '\0';
    return TDIST_OK;
}

static tdist_status_t bad_tasks_list(const char *var, const char *list, const char *why)
{
    return tdist__error(TDIST_ERR_INVALID_ARG,
                        "tdist_init(env://): %s=\"%.300s\" is not a Slurm tasks-per-node list "
                        "(such as 2(x3),1: 2 tasks on each of three nodes, then 1): %s",
                        var, list, why);
}

/* One count of a tasks-per-node list at *p (whole number in [1, max]),
 * advancing *p; -1 if there is none. */
static int64_t tasks_number(const char **p, int64_t max)
{
    int64_t v = 0;
    const char *s = *p;
    if (!is_digit(*s)) return -1;
    for (; is_digit(*s); s++) {
        v = v * 10 + (*s - '0');
        if (v > max) return -1;
    }
    *p = s;
    return v < 1 ? -1 : v;
}

/* Slurm's tasks-per-node list (SLURM_TASKS_PER_NODE: "2(x3),1" is 2 tasks
 * on each of nodes 0-2, 1 on node 3) -> *out, the count of node `node`
 * (SLURM_NODEID, 0-based). node < 0 (unknown): the count if every node
 * has the same, else -1. The whole list is checked; malformed, or too
 * short for node: INVALID_ARG naming var. */
tdist_status_t tdist__slurm_tasks_on_node(const char *var, const char *list, int64_t node,
                                          int64_t *out)
{
    const char *p = list;
    int64_t nodes = 0, found = -1, same = 0;
    bool uniform = true;
    for (;;) {
        int64_t count = tasks_number(&p, MAX_WORLD_SIZE), reps = 1;
        if (count < 0) return bad_tasks_list(var, list, "a count must be a whole number >= 1");
        if (p[0] == '(') {
            if (p[1] != 'x') return bad_tasks_list(var, list, "a repeat must be written (xN)");
            p += 2;
            reps = tasks_number(&p, MAX_WORLD_SIZE);
            if (reps < 0 || *p != ')')
                return bad_tasks_list(var, list, "a repeat must be written (xN), N >= 1");
            p++;
        }
        if (node >= nodes && node < nodes + reps) found = count;
        if (nodes > 0 && count != same) uniform = false;
        same = count;
        nodes += reps;
        if (*p == '\0') break;
        if (*p != ',') return bad_tasks_list(var, list, "entries must be separated by ','");
        if (nodes > MAX_WORLD_SIZE) return bad_tasks_list(var, list, "more than 2^20 nodes");
        p++;
    }
    if (node >= 0 && found < 0)
        return tdist__error(TDIST_ERR_INVALID_ARG,
                            "tdist_init(env://): SLURM_NODEID=%" PRId64 " but %s=\"%.300s\" "
                            "covers nodes 0..%" PRId64 " only",
                            node, var, list, nodes - 1);
    *out = node >= 0 ? found : uniform ? same : -1;
    return TDIST_OK;
}

/* The store's port of a Slurm job without MASTER_PORT (job_id >= 0). One
 * job's steps share it: a second srun of the same job at the same time
 * needs MASTER_PORT. */
int tdist__slurm_port(int64_t job_id)
{
    return SLURM_PORT_BASE + (int)(job_id % SLURM_PORT_SPAN);
}

/* ------------------------------------------------------------ environment */

/* Optional integer variable: -1 if unset; INVALID_ARG naming it if bad. */
static tdist_status_t env_opt(const char *name, int64_t lo, int64_t hi, int64_t *out)
{
    *out = -1;
    tdist_status_t st = tdist__env_int(name, lo, hi, out);
    if (st == TDIST_ERR_NOT_SUPPORTED) {
        *out = -1;
        return TDIST_OK;
    }
    if (st != TDIST_OK) return tdist__error_context(st, "tdist_init");
    return TDIST_OK;
}

static tdist_status_t env_required_missing(const char *name, const char *why)
{
    return tdist__error(TDIST_ERR_INVALID_ARG,
                        "tdist_init(env://): environment variable %s is not set (%s)", name, why);
}

static const char *env_nonempty(const char *name)
{
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

/* Restart generation, launcher store, listen fd, local rank checks, host
 * name: every URL kind. */
static tdist_status_t read_env_common(init_cfg_t *c)
{
    int64_t v;
    TDIST_CHECK(env_opt("TDIST_RESTART_COUNT", 0, INT32_MAX, &v));
    c->generation = v < 0 ? 0 : v;
    const char *ls = getenv("TDIST_LAUNCHER_STORE");
    if (ls && *ls) {
        if (strcmp(ls, "1") == 0)
            c->launcher_store = true;
        else if (strcmp(ls, "0") == 0)
            c->launcher_store = false;
        else
            return tdist__error(TDIST_ERR_INVALID_ARG,
                                "tdist_init: environment variable TDIST_LAUNCHER_STORE=\"%.200s\" "
                                "must be 0 or 1",
                                ls);
    }
    c->env_listen_fd = -1;
    if (c->kind != URL_FILE) {
        TDIST_CHECK(env_opt("TDIST_STORE_LISTEN_FD", 0, INT32_MAX, &v));
        c->env_listen_fd = (int)v;
    }
    TDIST_CHECK(env_opt("LOCAL_RANK", 0, MAX_WORLD_SIZE - 1, &c->local_rank));
    TDIST_CHECK(env_opt("LOCAL_WORLD_SIZE", 1, MAX_WORLD_SIZE, &c->local_size));
    if (c->local_rank >= 0) snprintf(c->local_rank_src, sizeof c->local_rank_src, "LOCAL_RANK");
    if (c->local_size >= 0) snprintf(c->local_size_src, sizeof c->local_size_src, "LOCAL_WORLD_SIZE");
    const char *hn = getenv("TDIST_HOSTNAME");
    if (hn) {
        if (hn[0] == '\0' || strlen(hn) >= HOST_MAX)
            return tdist__error(TDIST_ERR_INVALID_ARG,
                                "tdist_init: environment variable TDIST_HOSTNAME must be 1 to 255 "
                                "bytes");
        snprintf(c->self_host, sizeof c->self_host, "%s", hn);
    } else {
        if (gethostname(c->self_host, sizeof c->self_host) != 0)
            return tdist__error_errno(errno, "tdist_init: gethostname");
        c->self_host[sizeof c->self_host - 1] = '\0';
        if (c->self_host[0] == '\0') snprintf(c->self_host, sizeof c->self_host, "localhost");
    }
    return TDIST_OK;
}

/* env:// in a process no launcher started: say which one to use. */
static tdist_status_t no_launcher(void)
{
    static const char *const mpi_vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"};
    char hint[320] = "";
    for (size_t i = 0; i < sizeof mpi_vars / sizeof mpi_vars[0]; i++) {
        if (!getenv(mpi_vars[i])) continue;
        snprintf(hint, sizeof hint,
                 ". An MPI launcher started this process (%s is set) but TDIST_BACKEND is not "
                 "mpi: set TDIST_BACKEND=mpi and pass it on (mpirun -x TDIST_BACKEND), or call "
                 "tdist_init(\"mpi://\")",
                 mpi_vars[i]);
        break;
    }
    return tdist__error(TDIST_ERR_INVALID_ARG,
                        "tdist_init(env://): no launcher environment (RANK, WORLD_SIZE, "
                        "MASTER_ADDR and MASTER_PORT are unset and no Slurm job step: "
                        "SLURM_PROCID is unset): start this program with `tdistrun "
                        "--nproc-per-node N PROGRAM`, with `srun PROGRAM` in a Slurm allocation "
                        "or, for the MPI backend, with `TDIST_BACKEND=mpi mpirun -np N -x "
                        "TDIST_BACKEND PROGRAM`; to start the processes yourself, set those four "
                        "variables in each (docs/init.md)%s",
                        hint);
}

/* env:// store address: MASTER_ADDR and MASTER_PORT; under Slurm, for
 * either that is unset, the first host of the step's node list and
 * 10000 + SLURM_JOB_ID % 50000. */
static tdist_status_t env_master(init_cfg_t *c)
{
    const char *addr = env_nonempty("MASTER_ADDR");
    if (addr) {
        size_t alen = strlen(addr);
        if (addr[0] == '[' && alen > 2 && addr[alen - 1] == ']') { /* "[::1]" */
            addr++;
            alen -= 2;
        }
        if (alen >= HOST_MAX)
            return tdist__error(TDIST_ERR_INVALID_ARG,
                                "tdist_init(env://): MASTER_ADDR is longer than 255 bytes");
        memcpy(c->host, addr, alen);
        c->host[alen] = '\0';
    } else if (c->slurm) {
        /* rank 0 runs on the step's first node; a step may use fewer nodes than the job */
        const char *var = env_nonempty("SLURM_STEP_NODELIST") ? "SLURM_STEP_NODELIST"
                                                               : "SLURM_JOB_NODELIST";
        const char *list = getenv(var);
        if (!list)
            return env_required_missing("MASTER_ADDR", "the store's host; under Slurm, "
                                                       "SLURM_PROCID being set, it is the first "
                                                       "host of SLURM_JOB_NODELIST, which is not "
                                                       "set either");
        TDIST_CHECK(tdist__slurm_first_host(var, list, c->host, sizeof c->host));
    } else {
        return env_required_missing("MASTER_ADDR", "the store's host");
    }
    int64_t v;
    if (getenv("MASTER_PORT")) {
        TDIST_CHECK(env_opt("MASTER_PORT", 1, 65535, &v));
    } else if (c->slurm) {
        if (!getenv("SLURM_JOB_ID"))
            return env_required_missing("MASTER_PORT", "the store's port; under Slurm, "
                                                       "SLURM_PROCID being set, it is 10000 + "
                                                       "SLURM_JOB_ID % 50000, and SLURM_JOB_ID "
                                                       "is not set either");
        TDIST_CHECK(env_opt("SLURM_JOB_ID", 0, INT64_MAX, &v));
        v = tdist__slurm_port(v);
    } else {
        return env_required_missing("MASTER_PORT", "the store's port");
    }
    c->port = (int)v;
    return TDIST_OK;
}

/* Local ranks on this node of a Slurm job step (a check, as
 * LOCAL_WORLD_SIZE): the step's tasks-per-node list at SLURM_NODEID, else
 * the job's, else SLURM_NTASKS_PER_NODE. */
static tdist_status_t slurm_local_size(init_cfg_t *c)
{
    static const char *const lists[] = {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"};
    int64_t node;
    TDIST_CHECK(env_opt("SLURM_NODEID", 0, MAX_WORLD_SIZE - 1, &node));
    for (size_t i = 0; i < sizeof lists / sizeof lists[0]; i++) {
        const char *v = env_nonempty(lists[i]);
        if (!v) continue;
        TDIST_CHECK(tdist__slurm_tasks_on_node(lists[i], v, node, &c->local_size));
        if (node >= 0)
            snprintf(c->local_size_src, sizeof c->local_size_src, "%s[node %" PRId64 "]", lists[i],
                     node);
        else if (c->local_size >= 0)
            snprintf(c->local_size_src, sizeof c->local_size_src, "%s[every node]", lists[i]);
        return TDIST_OK;
    }
    TDIST_CHECK(env_opt("SLURM_NTASKS_PER_NODE", 1, MAX_WORLD_SIZE, &c->local_size));
    if (c->local_size >= 0)
        snprintf(c->local_size_src, sizeof c->local_size_src, "SLURM_NTASKS_PER_NODE");
    return TDIST_OK;
}

/* Rank, world size and local checks of a Slurm job step; opts, the URL,
 * LOCAL_RANK and LOCAL_WORLD_SIZE still win. */
static tdist_status_t env_slurm_ranks(init_cfg_t *c)
{
    bool rank_env = c->rank < 0, size_env = c->world_size < 0;
    if (rank_env) TDIST_CHECK(env_opt("SLURM_PROCID", 0, MAX_WORLD_SIZE - 1, &c->rank));
    if (size_env) {
        if (!getenv("SLURM_NTASKS"))
            return env_required_missing("SLURM_NTASKS", "the number of tasks of the Slurm job "
                                                        "step, SLURM_PROCID being set; or set "
                                                        "WORLD_SIZE");
        TDIST_CHECK(env_opt("SLURM_NTASKS", 1, MAX_WORLD_SIZE, &c->world_size));
    }
    if (c->rank >= c->world_size)
        return tdist__error(TDIST_ERR_INVALID_ARG,
                            "tdist_init: rank %" PRId64 "%s is not below the world size %" PRId64
                            "%s",
                            c->rank, rank_env ? " (SLURM_PROCID)" : "", c->world_size,
                            size_env ? " (SLURM_NTASKS)" : "");
    if (!c->local_rank_src[0]) {
        TDIST_CHECK(env_opt("SLURM_LOCALID", 0, MAX_WORLD_SIZE - 1, &c->local_rank));
        if (c->local_rank >= 0)
            snprintf(c->local_rank_src, sizeof c->local_rank_src, "SLURM_LOCALID");
    }
    if (!c->local_size_src[0]) TDIST_CHECK(slurm_local_size(c));
    return TDIST_OK;
}

/* env://: the torchrun variables, else a Slurm job step (see the top). */
static tdist_status_t read_env_url(init_cfg_t *c)
{
    bool torchrun = getenv("RANK") || getenv("WORLD_SIZE");
    c->slurm = !torchrun && getenv("SLURM_PROCID");
    if (!torchrun && !c->slurm && !getenv("MASTER_ADDR") && !getenv("MASTER_PORT"))
        return no_launcher();
    TDIST_CHECK(env_master(c));
    if (c->slurm) return env_slurm_ranks(c);
    if (c->rank < 0) {
        if (!getenv("RANK")) return env_required_missing("RANK", "this process's rank");
        TDIST_CHECK(env_opt("RANK", 0, MAX_WORLD_SIZE - 1, &c->rank));
    }
    if (c->world_size < 0) {
        if (!getenv("WORLD_SIZE")) return env_required_missing("WORLD_SIZE", "the number of ranks");
        TDIST_CHECK(env_opt("WORLD_SIZE", 1, MAX_WORLD_SIZE, &c->world_size));
    }
    return TDIST_OK;
}

static tdist_status_t read_env(const tdist_init_opts_t *o, init_cfg_t *c)
{
    TDIST_CHECK(read_env_common(c));
    /* Rank and world size: opts win, then the URL query, then (env://) the environment. */
    if (o->rank >= 0) c->rank = o->rank;
    if (o->world_size >= 0) c->world_size = o->world_size;
    if (c->kind == URL_ENV) {
        TDIST_CHECK(read_env_url(c));
    } else {
        const char *scheme = c->kind == URL_TCP ? "tcp" : "file";
        if (c->rank < 0)
            return tdist__error(TDIST_ERR_INVALID_ARG,
                                "tdist_init: init URL \"%.1000s\" has no rank (add ?rank=R&world_size=N "
                                "to the %s:// URL, or set opts.rank)",
                                c->url, scheme);
        if (c->world_size < 0)
            return tdist__error(TDIST_ERR_INVALID_ARG,
                                "tdist_init: init URL \"%.1000s\" has no world_size (add "
                                "&world_size=N to the %s:// URL, or set opts.world_size)",
                                c->url, scheme);
    }
    if (c->rank >= c->world_size)
        return tdist__error(TDIST_ERR_INVALID_ARG,
                            "tdist_init: rank %" PRId64 " is not below the world size %" PRId64,
                            c->rank, c->world_size);
    if (c->local_size >= 0 && c->local_rank >= c->local_size && c->local_rank >= 0)
        return tdist__error(TDIST_ERR_INVALID_ARG,
                            "tdist_init: %s=%" PRId64 " is not below %s=%" PRId64, c->local_rank_src,
                            c->local_rank, c->local_size_src, c->local_size);
    if (c->slurm)
        TDIST_LOGI("tdist_init(env://): Slurm job step: rank %" PRId64 " of %" PRId64
                   ", store at %s:%d (%s, %s)",
                   c->rank, c->world_size, c->host, c->port,
                   env_nonempty("MASTER_ADDR") ? "MASTER_ADDR" : "first host of the node list",
                   getenv("MASTER_PORT") ? "MASTER_PORT" : "10000 + SLURM_JOB_ID % 50000");
    return TDIST_OK;
}

/* ------------------------------------------------------------ the store */

static const char *addr_str(const char *host, int port, char *buf, size_t n)
{
    if (strchr(host, ':'))
        snprintf(buf, n, "[%s]:%d", host, port);
    else
        snprintf(buf, n, "%s:%d", host, port);
    return buf;
}

/* Rank 0 of env:// / tcp://: host the store server, unless the launcher
 * runs it. *adopted_fd is the caller's fd that the server now serves (to
 * be closed once tdist_init succeeds), or -1. */
static tdist_status_t host_store(const tdist_init_opts_t *o, const init_cfg_t *c, tdist_world_t *w,
                                 uint16_t *port, int *adopted_fd)
{
    *adopted_fd = -1;
    int fd = -1;
    if (o->listen_fd >= 0)
        fd = o->listen_fd;
    else if (c->launcher_store)
        return TDIST_OK;
    else if (c->env_listen_fd >= 0)
        fd = c->env_listen_fd;

    tdist_store_server_opts_t so;
    tdist_store_server_opts_init(&so);
    so.token = o->token;
    char addr[HOST_MAX + 16];
    addr_str(c->host, c->port, addr, sizeof addr);
    if (fd >= 0) {
        /* Serve a duplicate: the caller's fd stays valid until we succeed. */
        int dfd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
        if (dfd < 0 && errno == EBADF)
            return tdist__error(TDIST_ERR_INVALID_ARG,
                                "tdist_init: rank 0 cannot use listen fd %d (%s) for the store: "
                                "it is not an open descriptor",
                                fd, o->listen_fd >= 0 ? "opts.listen_fd" : "TDIST_STORE_LISTEN_FD");
        if (dfd < 0)
            return tdist__error_errno(errno, "tdist_init: rank 0 cannot use listen fd %d (%s) for "
                                      "the store", fd, o->listen_fd >= 0 ? "opts.listen_fd"
                                                                          : "TDIST_STORE_LISTEN_FD");
        tdist_status_t st = tdist_store_server_adopt(dfd, &so, &w->server);
        if (st != TDIST_OK) {
            close(dfd);
            return tdist__error_context(st, "tdist_init: rank 0 cannot host the store on listen fd %d",
                                        fd);
        }
        *port = tdist_store_server_port(w->server);
        if (*port != c->port)
            TDIST_LOGW("tdist_init: the adopted listen fd %d serves port %u, but the other ranks "
                       "will look for the store at %s",
                       fd, (unsigned)*port, addr);
        *adopted_fd = fd;
        return TDIST_OK;
    }
    tdist_status_t st = tdist_store_server_create(c->host, (uint16_t)c->port, &so, &w->server);
    if (st == TDIST_ERR_ADDR_IN_USE) {
        return tdist__error(TDIST_ERR_ADDR_IN_USE,
                            "tdist_init: rank 0 cannot host the store on %s: the address is already "
                            "in use (%s). Another process holds that port: choose a free port (%s), "
                            "stop the process that holds it, or, if a launcher already runs the "
                            "store there, set TDIST_LAUNCHER_STORE=1",
                            addr, tdist_last_error(),
                            c->kind == URL_ENV ? "MASTER_PORT" : "in the tcp:// URL");
    }
    if (st != TDIST_OK)
        return tdist__error_context(st, "tdist_init: rank 0 cannot host the store on %s", addr);
    *port = tdist_store_server_port(w->server);
    return TDIST_OK;
}

static tdist_status_t open_store(const tdist_init_opts_t *o, const init_cfg_t *c, tdist_world_t *w,
                                 int64_t deadline, int *adopted_fd)
{
    tdist_store_opts_t so;
    tdist_store_opts_init(&so);
    so.timeout_ms = o->timeout_ms;
    so.token = o->token;
    if (c->kind == URL_FILE) {
        tdist_status_t st = tdist_store_file_create(c->path, &so, &w->base);
        if (st != TDIST_OK)
            return tdist__error_context(st, "tdist_init: cannot open the file store \"%.1000s\"",
                                        c->path);
        return TDIST_OK;
    }
    uint16_t port = (uint16_t)c->port;
    if (c->rank == 0) TDIST_CHECK(host_store(o, c, w, &port, adopted_fd));
    so.connect_timeout_ms = TDIST_MAX(tdist__ms_left(deadline), 1);
    tdist_status_t st = tdist_store_tcp_connect(c->host, port, &so, &w->base);
    if (st != TDIST_OK) {
        char addr[HOST_MAX + 16];
        return tdist__error_context(st, "tdist_init (rank %" PRId64 " of %" PRId64
                                        "): cannot reach the store at %s",
                                    c->rank, c->world_size, addr_str(c->host, port, addr, sizeof addr));
    }
    return TDIST_OK;
}

/* Close every store of a world that failed to form and free it. */
static void world_free(tdist_world_t *w)
{
    tdist_store_destroy(w->user);
    tdist_store_destroy(w->rdzv_view);
    tdist_store_destroy(w->base);
    tdist_store_server_destroy(w->server);
    pthread_mutex_destroy(&w->bind_mu);
    free(w);
}

/* ------------------------------------------------------------ tdist_init */

static tdist_status_t check_opts(const tdist_init_opts_t *o)
{
    if (o->rank < -1)
        return tdist__error(TDIST_ERR_INVALID_ARG, "tdist_init: opts.rank %d is negative (use -1 for "
                                                   "\"from the URL or environment\")", o->rank);
    if (o->world_size < -1 || o->world_size == 0 || o->world_size > MAX_WORLD_SIZE)
        return tdist__error(TDIST_ERR_INVALID_ARG,
                            "tdist_init: opts.world_size %d is not in [1, %d] (use -1 for \"from the "
                            "URL or environment\")",
                            o->world_size, MAX_WORLD_SIZE);
    if (o->rank >= MAX_WORLD_SIZE)
        return tdist__error(TDIST_ERR_INVALID_ARG, "tdist_init: opts.rank %d is too large", o->rank);
    if (o->timeout_ms <= 0)
        return tdist__error(TDIST_ERR_INVALID_ARG,
                            "tdist_init: opts.timeout_ms %" PRId64 " must be > 0", o->timeout_ms);
    if (o->listen_fd < -1)
        return tdist__error(TDIST_ERR_INVALID_ARG,
                            "tdist_init: opts.listen_fd %d is negative (use -1 for none)", o->listen_fd);
    /* The defaults ignore a malformed TDIST_TIMEOUT_MS ("10s"); joining a
     * job with a deadline other than the one asked for is worse than
     * failing, so init says so. */
    int64_t t;
    if (tdist__env_int("TDIST_TIMEOUT_MS", 1, INT64_MAX / 2, &t) == TDIST_ERR_INVALID_ARG)
        return tdist__error_context(TDIST_ERR_INVALID_ARG, "tdist_init");
    return TDIST_OK;
}

/* A world for the configuration c, its stores not yet open; NULL when out
 * of memory. */
static tdist_world_t *world_new(const init_cfg_t *c, const tdist_init_opts_t *o)
{
    tdist_world_t *w = calloc(1, sizeof *w);
    if (!w) return NULL;
    w->rank = (int)c->rank;
    w->world_size = (int)c->world_size;
    w->timeout_ms = o->timeout_ms;
    w->is_file = c->kind == URL_FILE;
    snprintf(w->host, sizeof w->host, "%s", c->self_host);
    pthread_mutex_init(&w->bind_mu, NULL);
    if (c->kind != URL_FILE) {
        snprintf(w->master, sizeof w->master, "%s", c->host);
        w->master_port = c->port;
    }
    return w;
}

/* The generation's rendezvous and user views over the base store. */
static tdist_status_t open_views(tdist_world_t *w, int64_t generation)
{
    char prefix[64];
    tdist__rdzv_prefix(generation, prefix, sizeof prefix);
    TDIST_CHECK(tdist_store_prefix_create(prefix, w->base, NULL, &w->rdzv_view));
    snprintf(prefix, sizeof prefix, "tdist/g%" PRId64 "/user", generation);
    return tdist_store_prefix_create(prefix, w->base, NULL, &w->user);
}

/* The environment's local rank and size (LOCAL_RANK / LOCAL_WORLD_SIZE or
 * Slurm's), when given, must be what the rendezvous found. */
static tdist_status_t check_local(const init_cfg_t *c, const tdist_world_t *w)
{
    if ((c->local_rank < 0 || c->local_rank == w->local_rank) &&
        (c->local_size < 0 || c->local_size == w->local_size))
        return TDIST_OK;
    char lr[24] = "unset", ls[24] = "unset";
    if (c->local_rank >= 0) snprintf(lr, sizeof lr, "%" PRId64, c->local_rank);
    if (c->local_size >= 0) snprintf(ls, sizeof ls, "%" PRId64, c->local_size);
    return tdist__error(TDIST_ERR_MISMATCH,
                        "tdist_init: rank %d on host \"%.200s\": %s=%s %s=%s from the environment "
                        "disagree with the rendezvous, which found local rank %d of %d ranks on "
                        "this host (host names come from gethostname or TDIST_HOSTNAME; ranks in "
                        "another network namespace are on another host)",
                        w->rank, w->host, c->local_rank_src[0] ? c->local_rank_src : "LOCAL_RANK",
                        lr, c->local_size_src[0] ? c->local_size_src : "LOCAL_WORLD_SIZE", ls,
                        w->local_rank, w->local_size);
}

/* Leave a rendezvous that failed with st and free w; rank 0 keeps its
 * server up until the others have seen the failure. Returns st with the
 * message it had. */
static tdist_status_t world_fail(tdist_world_t *w, tdist_status_t st, bool joined)
{
    char saved[2048];
    snprintf(saved, sizeof saved, "%s", tdist_last_error());
    int64_t wait_for = 0, bound = w->timeout_ms;
    if (w->server) {
        /* The others may have joined and be running: linger briefly, not
         * for the whole timeout. */
        wait_for = joined ? w->world_size : tdist__rdzv_num_joined(&w->rdzv);
        bound = TDIST_MIN(bound, TDIST__RDZV_FAIL_LINGER_MS);
    }
    tdist__rdzv_leave(&w->rdzv, wait_for, bound, false);
    world_free(w);
    return tdist__error(st, "%s", saved);
}

tdist_status_t tdist_init(const char *url, const tdist_init_opts_t *opts, tdist_world_t **out)
{
    if (!out) return tdist__error(TDIST_ERR_INVALID_ARG, "tdist_init: out is NULL");
    if (tdist__mpi_world_wanted(url)) return tdist__mpi_world_init(url, opts, out); /* mpirun */
    tdist_init_opts_t defaults;
    if (!opts) {
        tdist_init_opts_init(&defaults);
        opts = &defaults;
    }
    TDIST_CHECK(check_opts(opts));
    int64_t deadline = tdist__deadline_ms(opts->timeout_ms);

    init_cfg_t c;
    memset(&c, 0, sizeof c);
    c.port = -1;
    c.rank = -1;
    c.world_size = -1;
    tdist_status_t st = parse_url(url ? url : "env://", &c);
    if (st == TDIST_OK) st = read_env(opts, &c);
    tdist_world_t *w = NULL;
    if (st == TDIST_OK && !(w = world_new(&c, opts)))
        st = tdist__error(TDIST_ERR_NO_MEMORY, "tdist_init: out of memory");
    int adopted_fd = -1;
    if (st == TDIST_OK) st = open_store(opts, &c, w, deadline, &adopted_fd);
    free(c.path);
    if (st == TDIST_OK) st = open_views(w, c.generation);
    if (st != TDIST_OK) {
        if (w) world_free(w);
        return st;
    }

    w->rdzv.store = w->rdzv_view;
    w->rdzv.rank = w->rank;
    w->rdzv.world_size = w->world_size;
    w->rdzv.host = w->host;
    w->rdzv.netns = netns_inode();
    w->rdzv.timeout_ms = opts->timeout_ms;
    st = tdist__rdzv_join(&w->rdzv, deadline);
    bool joined = st == TDIST_OK;
    if (joined) {
        w->local_rank = w->rdzv.local_rank;
        w->local_size = w->rdzv.local_size;
        st = check_local(&c, w);
    }
    if (st != TDIST_OK) return world_fail(w, st, joined);
    if (adopted_fd >= 0) close(adopted_fd); /* the server serves its own duplicate */
    TDIST_LOGI("tdist_init: rank %d of %d (local %d of %d) on host %s joined%s", w->rank,
               w->world_size, w->local_rank, w->local_size, w->host,
               w->server ? "; hosting the store" : "");
    *out = w;
    return TDIST_OK;
}

/* ------------------------------------------------------------ the world */

int tdist_world_rank(const tdist_world_t *w) { return w ? w->rank : -1; }
int tdist_world_size(const tdist_world_t *w) { return w ? w->world_size : -1; }
int tdist_world_local_rank(const tdist_world_t *w) { return w ? w->local_rank : -1; }
int tdist_world_local_size(const tdist_world_t *w) { return w ? w->local_size : -1; }
tdist_store_t *tdist_world_store(tdist_world_t *w) { return w ? w->user : NULL; }

void tdist_world_destroy(tdist_world_t *w)
{
    if (!w) return;
    /* Rank 0 hosting the store waits for every rank to leave before it
     * stops the server (not for a rank on this host whose process is gone;
     * and once a group of this world has failed, 1 s at most: the others
     * are failing too, and a dead rank elsewhere never leaves); the last
     * rank to leave a file store removes the rendezvous keys. */
    int64_t bound = w->timeout_ms;
    bool failed = atomic_load(&w->failures) > 0;
    if (failed) {
        /* nor does it wait on a store host that died or stopped with it */
        bound = TDIST_MIN(bound, (int64_t)1000);
        tdist_store_bound_thread(bound);
    }
    tdist__rdzv_leave(&w->rdzv, w->server ? w->world_size : 0, bound, w->is_file);
    if (failed) tdist_store_bound_thread(-1);
    tdist__mpi_world_leave(w); /* MPI_Finalize after the last mpi:// world */
    world_free(w);
}

tdist_status_t tdist__world_bind_addr(tdist_world_t *w, const char **addr)
{
    if (!w || !addr)
        return tdist__error(TDIST_ERR_INVALID_ARG, "tdist__world_bind_addr: world or addr is NULL");
    pthread_mutex_lock(&w->bind_mu);
    tdist_status_t st = TDIST_OK;
    if (!w->bind_known) {
        char ifname[TDIST__IFNAME_MAX] = "";
        const char *how = "";
        st = tdist__iface_select(w->master, w->master_port, w->bind_addr, sizeof w->bind_addr,
                                 ifname, sizeof ifname, &how);
        if (st == TDIST_OK) {
            w->bind_known = true;
            TDIST_LOGI("rank %d: process groups that span hosts listen on %s (interface %s, "
                       "chosen by %s)",
                       w->rank, w->bind_addr, ifname[0] ? ifname : "?", how);
            if (strncmp(w->bind_addr, "127.", 4) == 0 || strcmp(w->bind_addr, "::1") == 0)
                TDIST_LOGW("rank %d: this world spans hosts but its process groups listen on "
                           "the loopback address %s (chosen by %s): ranks on other machines "
                           "cannot reach it. Set TDIST_SOCKET_IFNAME, or use the store's "
                           "routable address as MASTER_ADDR",
                           w->rank, w->bind_addr, how);
        } else {
            tdist__error_context(st, "rank %d: choosing the network interface for process groups "
                                     "that span hosts", w->rank);
        }
    }
    if (st == TDIST_OK) *addr = w->bind_addr;
    pthread_mutex_unlock(&w->bind_mu);
    return st;
}

int tdist__world_next_group(tdist_world_t *w) { return atomic_fetch_add(&w->world_groups, 1); }

void tdist__world_note_failure(tdist_world_t *w)
{
    if (w) atomic_fetch_add(&w->failures, 1);
}
