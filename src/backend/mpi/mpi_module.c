/*
 * backend/mpi/mpi_module.c — the MPI module's entry: the one symbol the
 * loader (backend/module.c) looks up in libtdist_mpi.so. It checks that
 * the library loading it was built from the same tree (the structs the
 * backend table passes must have the same layout), keeps the host
 * table, and hands back the backend table and the mpirun world hooks.
 */
#include <stdio.h>
#include <string.h>

#include "backend/mpi/mpi_internal.h"
#include "backend/mpi/host.h"

const tdist__host_t *tdist__host;

static const tdist__mpi_module_t module = {
    .backend = &tdist__backend_mpi,
    .world_init = tdist__mpim_world_init,
    .world_leave = tdist__mpim_world_leave,
};

__attribute__((visibility("default"))) int tdist_mpi_module_entry(const tdist__host_t *host,
                                                                  const tdist__mpi_module_t **out,
                                                                  char *err, size_t err_n);

int tdist_mpi_module_entry(const tdist__host_t *host, const tdist__mpi_module_t **out, char *err,
                           size_t err_n)
{
    if (!host || host->host_size != sizeof(tdist__host_t) ||
        host->ctx_size != sizeof(tdist__coll_ctx_t) ||
        host->args_size != sizeof(tdist__coll_args_t) ||
        host->p2p_size != sizeof(tdist__be_p2p_t) || !host->version ||
        strcmp(host->version, TDIST_VERSION_STRING) != 0) {
        snprintf(err, err_n,
                 "built for tdist %s with another layout (table %zu, context %zu, arguments %zu, "
                 "p2p %zu bytes) than the library loading it (%s: %zu, %zu, %zu, %zu): install "
                 "the module built with this library",
                 TDIST_VERSION_STRING, sizeof(tdist__host_t), sizeof(tdist__coll_ctx_t),
                 sizeof(tdist__coll_args_t), sizeof(tdist__be_p2p_t),
                 host && host->version ? host->version : "?", host ? host->host_size : 0,
                 host ? host->ctx_size : 0, host ? host->args_size : 0, host ? host->p2p_size : 0);
        return -1;
    }
    tdist__host = host;
    *out = &module;
    return 0;
}
