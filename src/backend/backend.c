/*
 * backend/backend.c — which backend a new world group runs on.
 *
 * The backend table (tdist__backend_t) lives in pg/internal.h: a group
 * whose pg->backend is NULL is native (coll/ over transport/), any other
 * group hands its set-up, collectives and send/recv to the table. The MPI
 * backend's table comes from its module (backend/module.h), loaded the
 * first time a group asks for it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "backend/module.h"

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
        const tdist__mpi_module_t *m;
        char who[64];
        snprintf(who, sizeof who, "tdist_pg_create_world(%s=\"mpi\")", from);
        TDIST_CHECK(tdist__mpi_module(who, &m));
        *out = m->backend;
        return TDIST_OK;
    }
    return tdist__error(TDIST_ERR_INVALID_ARG,
                        "tdist_pg_create_world: unknown backend %s=\"%.100s\" (\"native\" or "
                        "\"mpi\")",
                        from, name);
}
