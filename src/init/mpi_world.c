/*
 * init/mpi_world.c — worlds launched by mpirun (see init/mpi_world.h and
 * docs/mpi.md): whether tdist_init makes one, and the hand-off to the MPI
 * module (backend/module.h), which holds everything that calls MPI.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "init/mpi_world.h"
#include "backend/module.h"

static const char *launcher_var(void)
{
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        if (getenv(vars[i])) return vars[i];
    return NULL;
}

bool tdist__mpi_world_wanted(const char *url)
{
    if (url && strncasecmp(url, "mpi://", 6) == 0) return true;
    if (url && strcasecmp(url, "env://") != 0) return false;
    const char *be = getenv("TDIST_BACKEND");
    return be && strcasecmp(be, "mpi") == 0 && launcher_var() != NULL;
}

tdist_status_t tdist__mpi_world_init(const char *url, const tdist_init_opts_t *opts,
                                     tdist_world_t **out)
{
    const tdist__mpi_module_t *m;
    char who[256];
    snprintf(who, sizeof who, "tdist_init(\"%.200s\")", url ? url : "env://");
    TDIST_CHECK(tdist__mpi_module(who, &m));
    return m->world_init(url, opts, out);
}

void tdist__mpi_world_leave(tdist_world_t *w)
{
    const tdist__mpi_module_t *m = tdist__mpi_module_loaded();
    if (m) m->world_leave(w);
}
