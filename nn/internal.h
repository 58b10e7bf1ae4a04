/*
 * nn/internal.h — what the nn sources share: the layer record, the model record,
 * the error setter and the random generator. Not installed, not public.
 */
#ifndef TDIST_NN_INTERNAL_H
#define TDIST_NN_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "nn.h"

typedef enum layer_kind {
    NN_LINEAR,
    NN_CONV2D,
    NN_BATCHNORM2D,
    NN_RELU,
    NN_MAXPOOL2D,
    NN_FLATTEN,
    NN_EMBEDDING,
    NN_DROPOUT,
} layer_kind_t;

typedef struct nn_layer {
    layer_kind_t kind;
    size_t ic, ih, iw;    /* per-sample input shape */
    size_t oc, oh, ow;    /* per-sample output shape */
    size_t k, stride, pad; /* conv2d, maxpool2d */
    size_t num, dim;      /* embedding */
    float p;              /* dropout */
    size_t param0, nparams; /* this layer's entries in the model's params */
    size_t buf0, nbufs;   /* ... and buffers */
    uint64_t rng;         /* dropout's generator state */
    bool fwd_training;    /* the mode the last forward ran in */

    /* per-batch memory, sized for the model's batch capacity */
    float *out;           /* batch x out_size */
    float *din;           /* batch x in_size: d loss / d input */
    float *col;           /* conv2d: batch x (ic k k) x (oh ow) im2col columns */
    float *dcol;          /* conv2d: one sample's column gradient */
    float *xhat;          /* batchnorm: normalised input, batch x size */
    float *mask;          /* dropout: 0 or 1/(1-p), batch x size */
    uint32_t *argmax;     /* maxpool: input offset of each output's maximum */
    /* per-channel scratch: batchnorm mean, invstd, sum dy, sum dy*xhat */
    float *mean, *invstd, *sdy, *sdyx;
} nn_layer_t;

struct nn_seq {
    size_t in_c, in_h, in_w;   /* model input shape */
    size_t cur_c, cur_h, cur_w; /* output shape of the last layer added */
    uint64_t seed;

    nn_layer_t *layers;
    size_t nlayers, layers_cap;

    nn_param_t *params;
    size_t nparams, params_cap;
    nn_buffer_t *bufs;
    size_t nbufs, bufs_cap;

    bool built;                /* parameters allocated; no more layers */
    float *param_mem, *grad_mem, *buf_mem;
    size_t param_floats, buf_floats;

    bool training;
    bool want_input_grad;
    nn_grad_ready_fn hook;
    void *hook_ctx;

    size_t batch_cap;          /* per-batch memory is sized for this */
    size_t batch;              /* batch of the last forward (0: none) */
    const float *input;        /* input of the last forward */
    bool input_grad_valid;
};

/* Set the calling thread's error message; returns -1. */
int nn__fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* splitmix64: the generator for initial values and dropout masks. */
static inline uint64_t nn__rand_u64(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [0, 1) with 24 random bits (exact in f32). */
static inline float nn__rand_f32(uint64_t *state)
{
    return (float)(nn__rand_u64(state) >> 40) * (1.0f / 16777216.0f);
}

static inline size_t nn__in_size(const nn_layer_t *l) { return l->ic * l->ih * l->iw; }
static inline size_t nn__out_size(const nn_layer_t *l) { return l->oc * l->oh * l->ow; }

/* layers.c: allocate per-batch memory of one layer for `batch` samples
 * (0 on success, -1 no memory), and free it. */
int nn__layer_alloc(nn_layer_t *l, size_t batch);
void nn__layer_free(nn_layer_t *l);

/* layers.c: forward of one layer; `in` is batch x in_size. -1 (error set)
 * only for bad input values (embedding indices). */
int nn__layer_forward(nn_layer_t *l, nn_param_t *p, nn_buffer_t *b, const float *in,
                      size_t batch, bool training);

/* layers.c: backward in two halves. First the parameter gradients (added
 * into p[i].grad), then, once the caller reported them ready, the input
 * gradient into l->din. */
void nn__layer_backward_params(nn_layer_t *l, nn_param_t *p, const float *in, const float *dout,
                               size_t batch);
void nn__layer_backward_input(nn_layer_t *l, nn_param_t *p, const float *in, const float *dout,
                              size_t batch);

#endif /* TDIST_NN_INTERNAL_H */
