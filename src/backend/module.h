/*
 * backend/module.h — backends built as loadable modules (docs/mpi.md).
 *
 * libtdist.so and libtdist.a need nothing beyond libc, libm and pthreads.
 * A backend that needs a third-party library (MPI) is a separate shared
 * object, libtdist_<name>.so, installed in <libdir>/tdist/ and loaded with
 * dlopen the first time a program asks for that backend. The module is
 * linked against its third-party library only, never against libtdist: it
 * reaches the library's functions through the host table below, which the
 * loader hands it. That works the same whether the program linked
 * libtdist.so or libtdist.a (the table points into whichever copy of the
 * library the program runs), and there is only ever one copy of the
 * library's state (the thread-local error, the log level).
 *
 * The module is built from the same tree as the library and shares its
 * internal structs (struct tdist_pg, struct tdist_work): the table carries
 * their sizes and the version, and a module built from another tree is
 * refused.
 *
 * Where the loader looks for libtdist_mpi.so, first hit wins:
 *   1. TDIST_MPI_MODULE (a path), if set — and then only there;
 *   2. tdist/ beside the file that holds the library's code (libtdist.so's
 *      directory; for a program linked with libtdist.a, the program's);
 *   3. ../<libdir>/tdist/ from that directory (an installed static program
 *      in <prefix>/bin);
 *   4. the install prefix's <libdir>/tdist/ given at configure time;
 *   5. the build tree's tdist/, only when the code runs from that tree.
 */
#ifndef TDIST_BACKEND_MODULE_H
#define TDIST_BACKEND_MODULE_H

#include <stddef.h>
#include <stdint.h>

#include "core/internal.h"
#include "core/net.h"
#include "init/internal.h"
#include "backend/backend.h"
#include "tdist/init.h"

/* The library's functions a module may call. Each member has the name of
 * the function it points to; the module's sources use the plain names
 * (backend/mpi/host.h maps them). Grow it at the end only. */
typedef struct tdist__host {
    size_t host_size; /* sizeof(tdist__host_t) */
    size_t ctx_size;  /* sizeof(tdist__coll_ctx_t) */
    size_t args_size; /* sizeof(tdist__coll_args_t) */
    size_t p2p_size;  /* sizeof(tdist__be_p2p_t) */
    const char *version;

    /* core */
    tdist_status_t (*tdist__error)(tdist_status_t st, const char *fmt, ...);
    tdist_status_t (*tdist__error_errno)(int err, const char *fmt, ...);
    tdist_status_t (*tdist__error_context)(tdist_status_t st, const char *fmt, ...);
    void (*tdist__log)(tdist_log_level_t level, const char *file, int line, const char *fmt, ...);
    char *(*tdist__asprintf)(const char *fmt, ...);
    char *(*tdist__strdup)(const char *s);
    int64_t (*tdist__now_ms)(void);
    int64_t (*tdist__deadline_ms)(int64_t timeout_ms);
    int64_t (*tdist__default_timeout_ms)(int64_t fallback_ms);
    void (*tdist__sleep_ms)(int ms);
    tdist_status_t (*tdist__env_int)(const char *name, int64_t lo, int64_t hi, int64_t *out);
    const char *(*tdist_last_error)(void);
    void (*tdist_clear_error)(void);
    tdist_log_level_t (*tdist_log_level)(void);
    const char *(*tdist_dtype_name)(tdist_dtype_t dt);
    size_t (*tdist_dtype_size)(tdist_dtype_t dt);
    const char *(*tdist_redop_name)(tdist_redop_t op);
    tdist_status_t (*tdist_reduce)(void *dst, const void *a, const void *b, size_t count,
                                   tdist_dtype_t dt, tdist_redop_t op);
    tdist_status_t (*tdist_scale)(void *buf, size_t count, tdist_dtype_t dt, double factor);
    tdist_status_t (*tdist_divide)(void *buf, size_t count, tdist_dtype_t dt, int64_t divisor);

    /* init */
    tdist_status_t (*tdist_init)(const char *url, const tdist_init_opts_t *opts,
                                 tdist_world_t **out);
    void (*tdist_init_opts_init)(tdist_init_opts_t *opts);
    int (*tdist_world_rank)(const tdist_world_t *w);
    int (*tdist_world_size)(const tdist_world_t *w);
    tdist_store_t *(*tdist_world_store)(tdist_world_t *w);
    tdist_status_t (*tdist__iface_select)(const char *master_host, int master_port, char *addr,
                                          size_t addr_n, char *ifname, size_t ifname_n,
                                          const char **how);

    /* coll: names, the monitored barrier's verdict */
    const char *(*tdist__op_name)(tdist__op_t op);
    void (*tdist__coll_mb_verdict)(const tdist__coll_ctx_t *c, const tdist__coll_check_t *chk,
                                   tdist_status_t st, const bool *present, tdist__mb_reply_t *rep);

    /* core: sockets (core/net.h) */
    bool (*tdist__net_parse_ip)(const char *s, size_t len, uint16_t port,
                                struct sockaddr_storage *ss, socklen_t *sl);
    int (*tdist__net_listen_fd)(struct sockaddr_storage *ss, socklen_t sl, int backlog,
                                unsigned flags, const char **failed);
    uint16_t (*tdist__net_sockaddr_port)(const struct sockaddr_storage *ss);
} tdist__host_t;

/* What the MPI module gives the library. */
typedef struct tdist__mpi_module {
    const tdist__backend_t *backend;
    /* tdist_init for a world started by an MPI launcher (init/mpi_world.h) */
    tdist_status_t (*world_init)(const char *url, const tdist_init_opts_t *opts,
                                 tdist_world_t **out);
    /* tdist_world_destroy of an MPI world, before it is freed */
    void (*world_leave)(tdist_world_t *w);
} tdist__mpi_module_t;

/* The module's one exported symbol: check host (its sizes and version
 * against the module's own), keep it, and set *out. On a mismatch returns
 * non-zero with a reason in err. */
typedef int (*tdist__mpi_module_entry_t)(const tdist__host_t *host,
                                         const tdist__mpi_module_t **out, char *err,
                                         size_t err_n);
#define TDIST__MPI_MODULE_ENTRY "tdist_mpi_module_entry"
#define TDIST__MPI_MODULE_FILE "libtdist_mpi.so"

/* The MPI module, loaded on the first call (later calls return the same
 * result: a module that failed to load is not tried again). On failure
 * TDIST_ERR_NOT_SUPPORTED with a message that starts with who and says
 * where the loader looked and what to install. Thread-safe; blocks while
 * the first call loads the module. */
tdist_status_t tdist__mpi_module(const char *who, const tdist__mpi_module_t **out);

/* The MPI module if an earlier call loaded it, else NULL (never loads).
 * Thread-safe. */
const tdist__mpi_module_t *tdist__mpi_module_loaded(void);

#endif /* TDIST_BACKEND_MODULE_H */
