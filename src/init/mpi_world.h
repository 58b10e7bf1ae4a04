/*
 * init/mpi_world.h — worlds launched by mpirun (init/mpi_world.c,
 * docs/mpi.md).
 *
 * tdist_init() hands the call here when the URL is "mpi://", or when it is
 * env:// (or NULL) with TDIST_BACKEND=mpi and an MPI launcher's variables
 * (OMPI_COMM_WORLD_SIZE, PMI_SIZE, PMIX_RANK) set. Rank and world size come
 * from MPI_COMM_WORLD (MPI_Init_thread with MPI_THREAD_MULTIPLE if the
 * program has not initialised MPI itself); rank 0 hosts the job's TCP store
 * on 127.0.0.1 (every rank on this host) or on the address
 * TDIST_SOCKET_IFNAME / the first interface gives (several hosts), port 0,
 * and MPI_Bcast tells the others where; then the normal tcp:// rendezvous
 * runs. MPI_Finalize runs when the last such world is destroyed, only if
 * tdist called MPI_Init. TDIST_ERR_MISMATCH when the launcher announced
 * several ranks (OMPI_COMM_WORLD_SIZE, PMI_SIZE) but MPI_COMM_WORLD has 1:
 * another MPI's launcher (Open MPI's mpirun, MPICH's mpiexec) started it.
 */
#ifndef TDIST_INIT_MPI_WORLD_H
#define TDIST_INIT_MPI_WORLD_H

#include <stdbool.h>

#include "tdist/init.h"

/* Whether tdist_init(url) makes an MPI world. Thread-safe. */
bool tdist__mpi_world_wanted(const char *url);

/* tdist_init for an MPI world (see above). Blocks like tdist_init (the
 * MPI_Bcast of the store's address has no deadline: mpirun started every
 * rank). Builds without MPI: TDIST_ERR_NOT_SUPPORTED. */
tdist_status_t tdist__mpi_world_init(const char *url, const tdist_init_opts_t *opts,
                                     tdist_world_t **out);

/* tdist_world_destroy of w, before w is freed: forget w, and MPI_Finalize
 * after the last MPI world if tdist initialised MPI. */
void tdist__mpi_world_leave(tdist_world_t *w);

#endif /* TDIST_INIT_MPI_WORLD_H */
