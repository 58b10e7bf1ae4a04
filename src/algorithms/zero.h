/*
 * algorithms/zero.h — the ZeRO object shared by zero.c (create, partition,
 * step, synchronisation, Join), zero_state.c (consolidation, sharded
 * checkpoints) and zero_hook.c (the overlap with DDP).
 *
 * Layout. Every partition is described the same way: the model's
 * parameters are placed in a rank-major layout of W blocks of `block`
 * elements; rank r owns block r. Parameter j occupies [pos[j], pos[j] +
 * count_j). BY_PARAMS puts each parameter wholly in its owner's block (in
 * partition order, the block padded to the largest shard); FLAT puts them
 * in creation order with block = ceil(N / W), so they may straddle blocks.
 * A rank's pieces are the intersections of its block with the parameters;
 * its optimizer has one buffer per piece. With parameters_as_bucket_view
 * the layout is real memory (z->flat); otherwise the all_gather packs and
 * unpacks through a scratch buffer of the same shape.
 */
#ifndef TDIST_ALGORITHMS_ZERO_H
#define TDIST_ALGORITHMS_ZERO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "algorithms/internal.h"
#include "tdist/join.h"
#include "tdist/optim.h"

typedef struct tdist__zero_piece {
    size_t param;  /* parameter index */
    size_t offset; /* first element of the parameter in this piece */
    size_t count;
} tdist__zero_piece_t;

typedef struct tdist__zero_overlap tdist__zero_overlap_t;

struct tdist_zero {
    tdist_pg_t *pg;
    int rank, size;
    tdist_zero_opts_t opts;
    bool use_all_gather;      /* the sync chosen by the options */
    size_t n;
    tdist_optim_param_t *params; /* param pointers: the caller's, or into flat */
    char **names;
    uint64_t *name_hash;
    size_t total;             /* elements of the model */
    size_t block;             /* elements per rank block of the layout */
    size_t *pos;              /* [n] position of each parameter in the layout */
    int *owner;               /* [n] BY_PARAMS: owning rank; FLAT: rank of element 0 */
    size_t *order;            /* [n] BY_PARAMS: parameters grouped by rank, partition order */
    size_t *rank_start;       /* [size + 1] into order */
    size_t *rank_elems;       /* [size] elements each rank owns */
    tdist__zero_piece_t *mine;
    size_t nmine;
    tdist_optim_t *opt;       /* over mine (NULL when this rank owns nothing) */
    int nstate;
    float *flat;              /* size * block, with parameters_as_bucket_view */
    float *scratch;           /* size * block, all_gather without the view */
    float *gscratch;          /* total: the gradient broadcast while some rank has joined */
    tdist_join_t *join;
    float *full[3];           /* consolidated state (total elements each) */
    uint64_t *full_steps;     /* [n] */
    bool consolidated;
    tdist__zero_overlap_t *overlap;
};

/* What this rank holds state for right now: its pieces and the optimizer
 * over them (one buffer per piece, same order). Without the overlap hook,
 * z->mine and z->opt; with it, the hook's slices, or every parameter
 * during the first synchronised iteration (zero_hook.c). */
typedef struct tdist__zero_shard {
    const tdist__zero_piece_t *pieces;
    size_t n;
    tdist_optim_t *opt;
} tdist__zero_shard_t;

void tdist__zero_shard(const tdist_zero_t *z, tdist__zero_shard_t *out);

/* An error "who: rank R group G: <fmt>" returning st. */
tdist_status_t tdist__zero_error(const tdist_zero_t *z, tdist_status_t st, const char *who,
                                 const char *fmt, ...) TDIST_PRINTF(4, 5);

/* State array s of buffer k of opt (NULL when out of range). */
float *tdist__zero_piece_state(tdist_optim_t *opt, size_t k, int s);

/* Free the overlap hook's state (zero_hook.c). NULL does nothing. */
void tdist__zero_overlap_free(tdist__zero_overlap_t *o);

#endif /* TDIST_ALGORITHMS_ZERO_H */
