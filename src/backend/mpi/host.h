/*
 * backend/mpi/host.h — inside the MPI module, every call into the library
 * goes through the host table the loader handed over (backend/module.h):
 * each name below becomes the table's member of that name. Include it
 * last in a module source, after every header that declares those
 * functions (a declaration after it would be rewritten too).
 */
#ifndef TDIST_BACKEND_MPI_HOST_H
#define TDIST_BACKEND_MPI_HOST_H

#include "backend/module.h"

/* The table given to the module's entry (backend/mpi/mpi_module.c). */
extern const tdist__host_t *tdist__host;

#define tdist__error (tdist__host->tdist__error)
#define tdist__error_errno (tdist__host->tdist__error_errno)
#define tdist__error_context (tdist__host->tdist__error_context)
#define tdist__log (tdist__host->tdist__log)
#define tdist__asprintf (tdist__host->tdist__asprintf)
#define tdist__strdup (tdist__host->tdist__strdup)
#define tdist__now_ms (tdist__host->tdist__now_ms)
#define tdist__deadline_ms (tdist__host->tdist__deadline_ms)
#define tdist__default_timeout_ms (tdist__host->tdist__default_timeout_ms)
#define tdist__sleep_ms (tdist__host->tdist__sleep_ms)
#define tdist__env_int (tdist__host->tdist__env_int)
#define tdist_last_error (tdist__host->tdist_last_error)
#define tdist_clear_error (tdist__host->tdist_clear_error)
#define tdist_log_level (tdist__host->tdist_log_level)
#define tdist_dtype_name (tdist__host->tdist_dtype_name)
#define tdist_dtype_size (tdist__host->tdist_dtype_size)
#define tdist_redop_name (tdist__host->tdist_redop_name)
#define tdist_reduce (tdist__host->tdist_reduce)
#define tdist_scale (tdist__host->tdist_scale)
#define tdist_divide (tdist__host->tdist_divide)
#define tdist_init (tdist__host->tdist_init)
#define tdist_init_opts_init (tdist__host->tdist_init_opts_init)
#define tdist_world_rank (tdist__host->tdist_world_rank)
#define tdist_world_size (tdist__host->tdist_world_size)
#define tdist_world_store (tdist__host->tdist_world_store)
#define tdist__iface_select (tdist__host->tdist__iface_select)
#define tdist__op_name (tdist__host->tdist__op_name)
#define tdist__coll_mb_verdict (tdist__host->tdist__coll_mb_verdict)
#define tdist__net_parse_ip (tdist__host->tdist__net_parse_ip)
#define tdist__net_listen_fd (tdist__host->tdist__net_listen_fd)
#define tdist__net_sockaddr_port (tdist__host->tdist__net_sockaddr_port)

#endif /* TDIST_BACKEND_MPI_HOST_H */
