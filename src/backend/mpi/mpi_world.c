/*
 * backend/mpi/mpi_world.c — worlds launched by mpirun, the MPI side (part
 * of the MPI module; init/mpi_world.c decides when and hands over).
 *
 * The world keeps every part of tdist that needs a store working (the
 * native backend's set-up, DDP, Join, the failure keys): rank 0 opens a
 * listening TCP socket on port 0 — 127.0.0.1 when MPI says every rank
 * shares its node (MPI_Comm_split_type SHARED), else the address the
 * interface policy of init/iface.c picks (TDIST_SOCKET_IFNAME, else the
 * first interface that is up) — and broadcasts "host port" with MPI_Bcast
 * on a duplicate of MPI_COMM_WORLD. Every rank then runs tdist_init on
 * tcp://host:port?rank=R&world_size=N, rank 0 hosting the store on that
 * socket (opts.listen_fd). A launcher's world size (OMPI_COMM_WORLD_SIZE,
 * PMI_SIZE) above 1 with MPI_COMM_WORLD of 1 rank is refused: another MPI's
 * launcher made every rank a singleton.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <mpi.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include "backend/mpi/mpi_internal.h"
#include "backend/mpi/host.h" /* last: calls into the library go through its table */

/* The world size the launcher announced (Open MPI's mpirun, MPICH's Hydra),
 * -1 when none did; *var: the variable's name. */
static long launcher_size(const char **var)
{
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (!v || !*v) continue;
        char *end = NULL;
        long n = strtol(v, &end, 10);
        if (*end != '\0' || n < 1) continue;
        *var = vars[i];
        return n;
    }
    return -1;
}

#define MAX_WORLDS 64

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static tdist_world_t *worlds[MAX_WORLDS]; /* live MPI worlds */
static int n_worlds;
static bool we_initialized; /* tdist called MPI_Init_thread */

static tdist_status_t mpi_fail(int rc, const char *what)
{
    char s[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, s, &len) != MPI_SUCCESS) snprintf(s, sizeof s, "error %d", rc);
    return tdist__error(TDIST_ERR_SYSTEM, "tdist_init(mpi://): %s failed: %s", what, s);
}

static const char *level_name(int l)
{
    switch (l) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE: return "MPI_THREAD_MULTIPLE";
    default: return "an unknown level";
    }
}

/* MPI up with MPI_THREAD_MULTIPLE (tdist's engine thread, the caller's
 * inline path and the p2p thread all call MPI). Under mu. */
static tdist_status_t ensure_mpi(void)
{
    int inited = 0, finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized)
        return tdist__error(TDIST_ERR_NOT_SUPPORTED,
                            "tdist_init(mpi://): MPI was already finalized in this process (it "
                            "cannot be initialised twice; keep one MPI world for the whole run)");
    MPI_Initialized(&inited);
    int provided = MPI_THREAD_SINGLE;
    if (!inited) {
        int rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided);
        if (rc != MPI_SUCCESS) return mpi_fail(rc, "MPI_Init_thread(MPI_THREAD_MULTIPLE)");
        we_initialized = true;
    } else {
        MPI_Query_thread(&provided);
    }
    if (provided < MPI_THREAD_MULTIPLE)
        return tdist__error(TDIST_ERR_NOT_SUPPORTED,
                            "tdist_init(mpi://): MPI provides only %s; tdist needs "
                            "MPI_THREAD_MULTIPLE (its engine and p2p threads call MPI)%s",
                            level_name(provided),
                            inited ? " — call MPI_Init_thread(..., MPI_THREAD_MULTIPLE, ...) "
                                     "yourself, or let tdist_init initialise MPI"
                                   : " — use an MPI library built with thread support");
    return TDIST_OK;
}

/* Rank 0: a listening socket on host (a numeric address), port 0. */
static tdist_status_t listen_on(const char *host, int *fd_out, int *port_out)
{
    struct sockaddr_storage ss;
    socklen_t len;
    if (!tdist__net_parse_ip(host, strlen(host), 0, &ss, &len))
        return tdist__error(TDIST_ERR_INVALID_ARG, "tdist_init(mpi://): \"%s\" is not a numeric "
                                                   "address", host);
    const char *failed = "";
    int fd = tdist__net_listen_fd(&ss, len, 1024, TDIST__NET_REUSEADDR, &failed);
    if (fd < 0 && strcmp(failed, "socket") == 0)
        return tdist__error_errno(errno, "tdist_init(mpi://): socket");
    if (fd < 0)
        return tdist__error_errno(errno, "tdist_init(mpi://): rank 0 cannot listen on %s port 0 "
                                         "for the store", host);
    *fd_out = fd;
    *port_out = tdist__net_sockaddr_port(&ss);
    return TDIST_OK;
}

typedef struct where {
    int32_t status; /* rank 0's status: the others fail with it */
    int32_t port;
    char host[120];
    char msg[376];
} where_t;

/* Another MPI's launcher (Open MPI's mpirun starting an MPICH build, or
 * MPICH's mpiexec an Open MPI one): MPI_Init makes every process a
 * singleton, N separate jobs of 1 rank. size: MPI_COMM_WORLD's size; the
 * error names the launcher's variable and the MPI tdist is linked with. */
static tdist_status_t refuse_foreign_launcher(int size)
{
    const char *lvar = NULL;
    long lsize = launcher_size(&lvar);
    if (size != 1 || lsize <= 1) return TDIST_OK;
    char ver[MPI_MAX_LIBRARY_VERSION_STRING] = "";
    int vlen = 0;
    MPI_Get_library_version(ver, &vlen);
    ver[strcspn(ver, ",\n")] = '\0'; /* "Open MPI v4.1.4", "MPICH Version:\t4.0.2" */
    for (char *p = ver; *p; p++)
        if (*p == '\t') *p = ' ';
    return tdist__error(TDIST_ERR_MISMATCH,
                        "tdist_init(mpi://): %s=%ld, but MPI_COMM_WORLD has 1 rank: another "
                        "MPI's launcher started this job, not the one of the MPI tdist is "
                        "linked with (%.120s); start it with that MPI's mpiexec (tdistrun: "
                        "set TDIST_MPIRUN)",
                        lvar, lsize, ver);
}

/* Rank 0 opens the store's listening socket (*fd) and every rank receives
 * its address, or rank 0's failure, in *wh (MPI_Bcast on c). Returns the
 * broadcast's MPI code. */
static int share_store_address(MPI_Comm c, int rank, int size, where_t *wh, int *fd)
{
    int local = 1;
    MPI_Comm node;
    int rc = MPI_Comm_split_type(c, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
    if (rc == MPI_SUCCESS) {
        MPI_Comm_size(node, &local);
        MPI_Comm_free(&node);
    }
    int one_node = local == size, all_one = 0;
    /* the store's host must be reachable by every rank: 127.0.0.1 only if
     * every rank said it shares rank 0's node */
    MPI_Allreduce(&one_node, &all_one, 1, MPI_INT, MPI_MIN, c);

    memset(wh, 0, sizeof *wh);
    if (rank == 0) {
        const char *host = "127.0.0.1";
        char addr[TDIST__IFADDR_MAX], ifname[TDIST__IFNAME_MAX];
        const char *how = "";
        tdist_status_t st = TDIST_OK;
        if (!all_one) {
            st = tdist__iface_select(NULL, 0, addr, sizeof addr, ifname, sizeof ifname, &how);
            host = addr;
        }
        int port = 0;
        if (st == TDIST_OK) st = listen_on(host, fd, &port);
        wh->status = st;
        wh->port = port;
        snprintf(wh->host, sizeof wh->host, "%s", host);
        if (st != TDIST_OK) snprintf(wh->msg, sizeof wh->msg, "%s", tdist_last_error());
    }
    return MPI_Bcast(wh, (int)sizeof *wh, MPI_BYTE, 0, c);
}

/* tcp://host:port?rank=R&world_size=N of the store in wh (an IPv6 host
 * in brackets). */
static void store_url(char *tcp, size_t cap, where_t *wh, int rank, int size)
{
    wh->host[sizeof wh->host - 1] = '\0';
    if (strchr(wh->host, ':'))
        snprintf(tcp, cap, "tcp://[%s]:%d?rank=%d&world_size=%d", wh->host, (int)wh->port, rank,
                 size);
    else
        snprintf(tcp, cap, "tcp://%s:%d?rank=%d&world_size=%d", wh->host, (int)wh->port, rank,
                 size);
}

tdist_status_t tdist__mpim_world_init(const char *url, const tdist_init_opts_t *opts,
                                     tdist_world_t **out)
{
    tdist_init_opts_t o;
    if (opts)
        o = *opts;
    else
        tdist_init_opts_init(&o);
    if (url && strncasecmp(url, "mpi://", 6) == 0 && url[6] != '\0')
        return tdist__error(TDIST_ERR_INVALID_ARG,
                            "tdist_init: malformed init URL \"%.200s\": mpi:// takes nothing after "
                            "it (rank and world size come from MPI)",
                            url);
    pthread_mutex_lock(&mu);
    tdist_status_t st = ensure_mpi();
    pthread_mutex_unlock(&mu);
    if (st != TDIST_OK) return st;

    MPI_Comm c;
    int rc = MPI_Comm_dup(MPI_COMM_WORLD, &c);
    if (rc != MPI_SUCCESS) return mpi_fail(rc, "MPI_Comm_dup(MPI_COMM_WORLD)");
    MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN);
    int rank = 0, size = 1;
    MPI_Comm_rank(c, &rank);
    MPI_Comm_size(c, &size);
    st = refuse_foreign_launcher(size); /* on every rank alike */
    if (st != TDIST_OK) {
        MPI_Comm_free(&c);
        return st;
    }
    where_t wh;
    int fd = -1;
    rc = share_store_address(c, rank, size, &wh, &fd);
    MPI_Comm_free(&c);
    if (rc != MPI_SUCCESS) {
        if (fd >= 0) close(fd);
        return mpi_fail(rc, "MPI_Bcast of the store's address");
    }
    if (wh.status != TDIST_OK) {
        wh.msg[sizeof wh.msg - 1] = '\0';
        return tdist__error((tdist_status_t)wh.status, "tdist_init(mpi://): rank 0: %s", wh.msg);
    }
    if ((o.rank >= 0 && o.rank != rank) || (o.world_size >= 0 && o.world_size != size)) {
        if (fd >= 0) close(fd);
        return tdist__error(TDIST_ERR_MISMATCH,
                            "tdist_init(mpi://): opts.rank %d / opts.world_size %d disagree with "
                            "MPI_COMM_WORLD (rank %d of %d)",
                            o.rank, o.world_size, rank, size);
    }
    char tcp[256];
    store_url(tcp, sizeof tcp, &wh, rank, size);
    o.rank = -1;
    o.world_size = -1;
    o.listen_fd = rank == 0 ? fd : -1;
    tdist_world_t *w = NULL;
    st = tdist_init(tcp, &o, &w); /* closes fd on success */
    if (st != TDIST_OK) {
        if (fd >= 0) close(fd);
        return tdist__error_context(st, "tdist_init(mpi://, MPI rank %d of %d)", rank, size);
    }
    pthread_mutex_lock(&mu);
    if (n_worlds < MAX_WORLDS) worlds[n_worlds++] = w;
    pthread_mutex_unlock(&mu);
    *out = w;
    return TDIST_OK;
}

void tdist__mpim_world_leave(tdist_world_t *w)
{
    pthread_mutex_lock(&mu);
    bool found = false;
    for (int i = 0; i < n_worlds; i++) {
        if (worlds[i] != w) continue;
        worlds[i] = worlds[--n_worlds];
        found = true;
        break;
    }
    if (found && n_worlds == 0 && we_initialized) {
        int fin = 0;
        MPI_Finalized(&fin);
        if (!fin) MPI_Finalize();
        we_initialized = false;
    }
    pthread_mutex_unlock(&mu);
}

