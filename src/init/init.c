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
 */
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
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
    int64_t local_rank;     /* LOCAL_RANK or -1 */
    int64_t local_size;     /* LOCAL_WORLD_SIZE or -1 */
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

static tdist_status_t read_env(const tdist_init_opts_t *o, init_cfg_t *c)
{
    int64_t v;
    /* Restart generation, launcher store, listen fd, host name: all kinds. */
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

    /* Rank and world size: opts win, then the URL query, then (env://) the environment. */
    if (o->rank >= 0) c->rank = o->rank;
    if (o->world_size >= 0) c->world_size = o->world_size;
    if (c->kind == URL_ENV) {
        const char *addr = getenv("MASTER_ADDR");
        if (!addr || !*addr) return env_required_missing("MASTER_ADDR", "the store's host");
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
        if (!getenv("MASTER_PORT")) return env_required_missing("MASTER_PORT", "the store's port");
        TDIST_CHECK(env_opt("MASTER_PORT", 1, 65535, &v));
        c->port = (int)v;
        if (c->rank < 0) {
            if (!getenv("RANK")) return env_required_missing("RANK", "this process's rank");
            TDIST_CHECK(env_opt("RANK", 0, MAX_WORLD_SIZE - 1, &c->rank));
        }
        if (c->world_size < 0) {
            if (!getenv("WORLD_SIZE")) return env_required_missing("WORLD_SIZE", "the number of ranks");
            TDIST_CHECK(env_opt("WORLD_SIZE", 1, MAX_WORLD_SIZE, &c->world_size));
        }
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
                            "tdist_init: LOCAL_RANK=%" PRId64 " is not below LOCAL_WORLD_SIZE=%" PRId64,
                            c->local_rank, c->local_size);
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
    if (st != TDIST_OK) {
        free(c.path);
        return st;
    }

    tdist_world_t *w = calloc(1, sizeof *w);
    if (!w) {
        free(c.path);
        return tdist__error(TDIST_ERR_NO_MEMORY, "tdist_init: out of memory");
    }
    w->rank = (int)c.rank;
    w->world_size = (int)c.world_size;
    w->timeout_ms = opts->timeout_ms;
    w->is_file = c.kind == URL_FILE;
    snprintf(w->host, sizeof w->host, "%s", c.self_host);
    pthread_mutex_init(&w->bind_mu, NULL);
    if (c.kind != URL_FILE) {
        snprintf(w->master, sizeof w->master, "%s", c.host);
        w->master_port = c.port;
    }

    int adopted_fd = -1;
    st = open_store(opts, &c, w, deadline, &adopted_fd);
    free(c.path);
    c.path = NULL;
    if (st != TDIST_OK) {
        world_free(w);
        return st;
    }

    char prefix[64];
    snprintf(prefix, sizeof prefix, "tdist/g%" PRId64 "/rdzv", c.generation);
    st = tdist_store_prefix_create(prefix, w->base, NULL, &w->rdzv_view);
    if (st == TDIST_OK) {
        snprintf(prefix, sizeof prefix, "tdist/g%" PRId64 "/user", c.generation);
        st = tdist_store_prefix_create(prefix, w->base, NULL, &w->user);
    }
    if (st != TDIST_OK) {
        world_free(w);
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
        if ((c.local_rank >= 0 && c.local_rank != w->local_rank) ||
            (c.local_size >= 0 && c.local_size != w->local_size))
        {
            char lr[24] = "unset", ls[24] = "unset";
            if (c.local_rank >= 0) snprintf(lr, sizeof lr, "%" PRId64, c.local_rank);
            if (c.local_size >= 0) snprintf(ls, sizeof ls, "%" PRId64, c.local_size);
            st = tdist__error(TDIST_ERR_MISMATCH,
                              "tdist_init: rank %d on host \"%.200s\": LOCAL_RANK=%s "
                              "LOCAL_WORLD_SIZE=%s from the environment disagree with the "
                              "rendezvous, which found local rank %d of %d ranks on this host "
                              "(host names come from gethostname or TDIST_HOSTNAME; ranks in "
                              "another network namespace are on another host)",
                              w->rank, w->host, lr, ls, w->local_rank, w->local_size);
        }
    }
    if (st != TDIST_OK) {
        /* Leave; rank 0 keeps its server up until the others have seen the failure. */
        char saved[2048];
        snprintf(saved, sizeof saved, "%s", tdist_last_error());
        int64_t wait_for = 0, bound = opts->timeout_ms;
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
     * stops the server; the last rank to leave a file store removes the
     * rendezvous keys. */
    tdist__rdzv_leave(&w->rdzv, w->server ? w->world_size : 0, w->timeout_ms, w->is_file);
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
