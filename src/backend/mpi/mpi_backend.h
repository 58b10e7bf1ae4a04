/*
 * backend/mpi/mpi_backend.h — the MPI backend's table (docs/mpi.md).
 * Part of the MPI module (backend/module.h), built only when CMake found
 * MPI.
 */
#ifndef TDIST_BACKEND_MPI_H
#define TDIST_BACKEND_MPI_H

#include "backend/backend.h"

extern const tdist__backend_t tdist__backend_mpi;

#endif /* TDIST_BACKEND_MPI_H */
