/*
 * backend/backend.c — which backend a new world group runs on.
 *
 * The backend table (tdist__backend_t) lives in pg/internal.h: a group
 * whose pg->backend is NULL is native (coll/ over transport/), any other
 * group hands its set-up, collectives and send/recv to the table. This
 * file is always built; the MPI backend itself (backend/mpi/) only when
 * CMake found MPI (TDIST_WITH_MPI, docs/mpi.md).
 */
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "pg/internal.h"

#ifdef TDIST_HAVE_MPI
#include "backend/mpi/mpi_backend.h"
#endif

tdist_status_t tdist__backend_for_world(tdist_world_t *world, const tdist_pg_opts_t *opts,
                                        const tdist__backend_t **out)
{
    (void)world;
    *out = NULL;
    const char *name = opts && opts->backend ? opts->backend : NULL;
    const char *from = "opts.backend";
    if (!name) {
        name = getenv("TDIST_BACKEND");
        from = "TDIST_BACKEND";
    }
    if (!name || !*name || strcasecmp(name, "native") == 0 || strcasecmp(name, "auto") == 0)
        return TDIST_OK;
    if (strcasecmp(name, "mpi") == 0) {
#ifdef TDIST_HAVE_MPI
        *out = &tdist__backend_mpi;
        return TDIST_OK;
#else
        return tdist__error(TDIST_ERR_NOT_SUPPORTED,
                            "tdist_pg_create_world: %s=\"mpi\", but this tdist was built without "
                            "MPI (configure with an MPI installed, e.g. Debian's libopenmpi-dev, "
                            "and TDIST_WITH_MPI=AUTO or ON)",
                            from);
#endif
    }
    return tdist__error(TDIST_ERR_INVALID_ARG,
                        "tdist_pg_create_world: unknown backend %s=\"%.100s\" (\"native\" or "
                        "\"mpi\")",
                        from, name);
}
