/*
 * algorithms/diloco_internal.h — the DiLoCo state, shared by diloco.c
 * (the algorithm and its Join participation) and diloco_state.c (saving
 * and loading it).
 */
#ifndef TDIST_ALGORITHMS_DILOCO_INTERNAL_H
#define TDIST_ALGORITHMS_DILOCO_INTERNAL_H

#include "algorithms/internal.h"

struct tdist_diloco {
    tdist_pg_t *pg;
    tdist_optim_param_t *params;
    size_t n, total;
    size_t *off, *idx, *counts;   /* the one-bucket view: offsets, indices, counts */
    float *synced, *delta;
    tdist_optim_t *inner, *outer;
    bool own_inner;
    tdist_diloco_opts_t o;
    tdist_compress_t *c16;
    tdist_int8_t *q8;
    tdist_join_t *join;           /* the Join it is attached to, or NULL */
    int64_t since;                /* inner steps since the last synchronisation */
    tdist_diloco_stats_t stats;
    tdist__agree_t agree;
};

#endif /* TDIST_ALGORITHMS_DILOCO_INTERNAL_H */
