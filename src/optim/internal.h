/*
 * optim/internal.h — the optimizer object shared by the files of optim/:
 * optim.c (create, destroy, step dispatch, accessors), kernels.c (the f32
 * update loops) and state.c (save / load).
 */
#ifndef TDIST_OPTIM_INTERNAL_H
#define TDIST_OPTIM_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "tdist/optim.h"

/* Most state arrays per element: Adam with amsgrad keeps exp_avg,
 * exp_avg_sq and max_exp_avg_sq. */
#define TDIST_OPTIM_MAX_STATE 3

/* One registered buffer. */
typedef struct tdist__optim_buf {
    float *param;
    const float *grad;
    size_t count;
    char *name;                              /* owned copy, or NULL */
    uint64_t steps;                          /* steps this buffer has taken */
    float *state[TDIST_OPTIM_MAX_STATE];     /* views into opt->state_mem */
} tdist__optim_buf_t;

struct tdist_optim {
    tdist_optim_kind_t kind;
    double lr;                               /* current learning rate */
    tdist_optim_sgd_opts_t sgd;              /* kind == SGD */
    tdist_optim_adam_opts_t adam;            /* kind == ADAM / ADAMW */
    int nstate;                              /* state arrays per element (0..3) */
    size_t nbuf;
    tdist__optim_buf_t *bufs;
    float *state_mem;                        /* one block holding every state array */
};

/* "buffer 3 (fc1.weight)" or "buffer 3" into out. Returns out. */
const char *tdist__optim_buf_label(const tdist_optim_t *opt, size_t index, char *out, size_t size);

/* The update loops. Each updates n elements starting at the given
 * pointers (already offset into the buffer). step is the buffer's step
 * count after incrementing (1 on its first step). lr is the current
 * learning rate. p, g and the state arrays must not overlap. */
void tdist__optim_sgd_update(const tdist_optim_sgd_opts_t *o, double lr, uint64_t step,
                             float *p, const float *g, float *momentum_buf, size_t n);
void tdist__optim_adam_update(const tdist_optim_adam_opts_t *o, int decoupled, double lr,
                              uint64_t step, float *p, const float *g, float *exp_avg,
                              float *exp_avg_sq, float *max_exp_avg_sq, size_t n);

/* Tests: run the loops compiled for AVX2 + FMA (on != 0, when the CPU has
 * them) or the plain ones; returns 1 when the FMA loops are now used. */
int tdist__optim_use_fma(int on);

#endif /* TDIST_OPTIM_INTERNAL_H */
