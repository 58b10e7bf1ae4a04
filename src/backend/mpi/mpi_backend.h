/*
 * backend/mpi/mpi_backend.h — the MPI backend's table (docs/mpi.md).
 * Built only when CMake found MPI (TDIST_HAVE_MPI).
 */
#ifndef TDIST_BACKEND_MPI_H
#define TDIST_BACKEND_MPI_H

#include "pg/internal.h"

extern const tdist__backend_t tdist__backend_mpi;

#endif /* TDIST_BACKEND_MPI_H */
