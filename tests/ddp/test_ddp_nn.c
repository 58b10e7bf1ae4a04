/* tests/ddp/test_ddp_nn.c — DDP over the nn module's models equals one
 * process, with tdist's optimizers.
 *
 * Models: a CNN with BatchNorm (Conv 1->4 3x3 pad 1, ReLU, BN, MaxPool 2,
 * Flatten, Linear 64->5 on 8x8 inputs; BN after the ReLU, because a conv
 * bias right before BN has a gradient that is exactly zero in exact
 * arithmetic, i.e. rounding noise no tolerance can compare) and an MLP (Linear 12->16, ReLU,
 * Linear 16->5); softmax cross-entropy. N ranks (1..4) each take shard r
 * of a global batch of 24. BatchNorm normalises with the statistics of the
 * batch it sees, so the single-process reference runs each shard through
 * its own copy of the model's forward and backward, accumulates the
 * per-shard gradients and divides by N (what DDP's averaging computes);
 * its running statistics follow shard 0's forward (DDP broadcasts rank
 * 0's buffers at every forward_begin). Every rank computes the reference
 * itself — scaling each shard's gradient by 1/N with tdist_scale and
 * summing in rank order, the arithmetic of DDP's default hook on shared
 * memory — and, after every step of SGD (momentum) or Adam through
 * tdist_optim, compares every gradient and parameter:
 * |ddp - ref| <= 1e-6 * max(|ref|) per tensor (TCP's algorithms may sum
 * in another order, so bit equality is not required). Variants: gradient_as_bucket_view (nn
 * writes straight into DDP's buckets), one bucket per parameter. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include <tdist/nn.h>
#include "tdist/ddp.h"
#include "tdist/optim.h"

#define GBATCH 24
#define CLASSES 5
#define STEPS 4
#define TOL 1e-6

typedef struct variant {
    bool cnn;
    bool adam;
    bool view;
    bool one_bucket_per_param;
} variant_t;

static nn_seq_t *build(bool cnn)
{
    nn_seq_t *m;
    if (cnn) {
        m = nn_seq_create(1, 8, 8, 5);
        ASSERT_TRUE(m != NULL);
        ASSERT_EQ(nn_conv2d(m, 4, 3, 1, 1), 0);
        ASSERT_EQ(nn_relu(m), 0);
        ASSERT_EQ(nn_batchnorm2d(m), 0);
        ASSERT_EQ(nn_maxpool2d(m, 2, 2), 0);
        ASSERT_EQ(nn_flatten(m), 0);
        ASSERT_EQ(nn_linear(m, CLASSES), 0);
    } else {
        m = nn_seq_create(1, 1, 12, 5);
        ASSERT_TRUE(m != NULL);
        ASSERT_EQ(nn_linear(m, 16), 0);
        ASSERT_EQ(nn_relu(m), 0);
        ASSERT_EQ(nn_linear(m, CLASSES), 0);
    }
    return m;
}

static uint64_t rng;
static float frand(void)
{
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng >> 40) & 0xffffff) / 16777216.0f * 2.0f - 1.0f;
}

typedef struct hook {
    tdist_ddp_t *ddp;
    tdist_status_t st;
} hook_t;

static void grad_ready(void *arg, size_t i)
{
    hook_t *h = arg;
    tdist_status_t st = tdist_ddp_grad_ready(h->ddp, i);
    if (st != TDIST_OK && h->st == TDIST_OK) h->st = st;
}

static tdist_optim_t *make_opt(nn_seq_t *m, bool adam, float *const *grads)
{
    size_t np;
    nn_param_t *p = nn_params(m, &np);
    tdist_optim_param_t op[16];
    ASSERT_TRUE(np <= 16);
    for (size_t i = 0; i < np; i++)
        op[i] = (tdist_optim_param_t){.param = p[i].data, .grad = grads ? grads[i] : p[i].grad,
                                      .count = p[i].count, .name = p[i].name};
    tdist_optim_t *o;
    if (adam) {
        tdist_optim_adam_opts_t ao;
        tdist_optim_adam_opts_init(&ao);
        ao.lr = 1e-2;
        ASSERT_OK(tdist_optim_create_adam(op, np, &ao, &o));
    } else {
        tdist_optim_sgd_opts_t so;
        tdist_optim_sgd_opts_init(&so);
        so.lr = 0.05;
        so.momentum = 0.9;
        ASSERT_OK(tdist_optim_create_sgd(op, np, &so, &o));
    }
    return o;
}

static void expect_close(const float *got, const float *want, size_t n, const char *what,
                         const char *name, int step, int rank)
{
    float mx = 0;
    for (size_t i = 0; i < n; i++) mx = fmaxf(mx, fabsf(want[i]));
    for (size_t i = 0; i < n; i++)
        if (fabsf(got[i] - want[i]) > TOL * fmaxf(mx, 1e-30f) + 1e-12f)
            FAIL("rank %d step %d: %s of %s [%zu]: ddp %.9g vs reference %.9g (max |ref| %.3g)",
                 rank, step, what, name, i, got[i], want[i], mx);
}

static void body(int rank, int n, void *arg)
{
    const variant_t *v = arg;
    tdist_world_t *w;
    tdist_pg_t *pg;
    /* The reference sums the shards' gradients in rank order. TCP's ring
     * and recursive doubling sum in other orders: equally right, but
     * over three steps (momentum, Adam's division by a near-zero second
     * moment) the last-bit differences grow past 1e-6 on some CPUs (AMD
     * EPYC's OpenBLAS kernels: 1.08e-6 on 0.bias). Make every transport
     * sum in rank order (direct), as shared memory does, so the
     * comparison measures DDP and not the summation order; the other
     * algorithms' results are checked by the coll/ and pg/ tests. */
    setenv("TDIST_ALGO_ALLREDUCE", "direct", 1);
    ASSERT_OK(tdist_init("env://", NULL, &w));
    ASSERT_OK(tdist_pg_create_world(w, NULL, &pg));
    nn_set_num_threads(1);

    nn_seq_t *m = build(v->cnn), *ref = build(v->cnn);
    size_t in = nn_input_size(m), np, nb, rnp, rnb;
    nn_param_t *p = nn_params(m, &np);
    nn_buffer_t *b = nn_buffers(m, &nb);
    nn_param_t *rp = nn_params(ref, &rnp);
    nn_buffer_t *rb = nn_buffers(ref, &rnb);
    ASSERT_TRUE(p && b && rp && rb && np == rnp && nb == rnb);

    /* data: the whole batch, the same on every rank */
    rng = 99;
    float *x = malloc(GBATCH * in * sizeof *x), *dl = malloc(GBATCH * CLASSES * sizeof *dl);
    int y[GBATCH];
    ASSERT_TRUE(x && dl);
    for (size_t i = 0; i < GBATCH * in; i++) x[i] = frand();
    for (int i = 0; i < GBATCH; i++) y[i] = (int)((unsigned)(frand() * 1000 + 1000) % CLASSES);
    size_t shard = GBATCH / (size_t)n;

    tdist_ddp_param_t dp[16];
    tdist_ddp_buffer_t db[16];
    for (size_t i = 0; i < np; i++)
        dp[i] = (tdist_ddp_param_t){p[i].data, p[i].grad, p[i].count, TDIST_F32, p[i].name};
    for (size_t i = 0; i < nb; i++) db[i] = (tdist_ddp_buffer_t){b[i].data, b[i].count, TDIST_F32, b[i].name};
    tdist_ddp_opts_t o;
    tdist_ddp_opts_init(&o);
    o.gradient_as_bucket_view = v->view;
    if (v->one_bucket_per_param) o.bucket_cap_bytes = o.first_bucket_bytes = 4;
    tdist_ddp_t *ddp;
    ASSERT_OK(tdist_ddp_create(pg, dp, np, nb ? db : NULL, nb, &o, &ddp));
    hook_t h = {ddp, TDIST_OK};
    nn_set_grad_ready_hook(m, grad_ready, &h);

    float *views[16] = {0};
    if (v->view)
        for (size_t i = 0; i < np; i++) views[i] = p[i].grad = tdist_ddp_grad_ptr(ddp, i);
    tdist_optim_t *opt = make_opt(m, v->adam, v->view ? views : NULL);
    tdist_optim_t *ropt = make_opt(ref, v->adam, NULL);

    for (int step = 1; step <= STEPS; step++) {
        /* DDP: this rank's shard */
        ASSERT_OK(tdist_ddp_forward_begin(ddp));
        nn_zero_grad(m);
        const float *xs = x + (size_t)rank * shard * in;
        float *lg = nn_forward(m, xs, shard);
        ASSERT_TRUE(lg != NULL);
        ASSERT_EQ(nn_cross_entropy(lg, y + (size_t)rank * shard, shard, CLASSES, NULL, dl), 0);
        ASSERT_EQ(nn_backward(m, dl), 0);
        ASSERT_OK(h.st);
        ASSERT_OK(tdist_ddp_backward_end(ddp));
        if (v->view) /* a rebuild may move the views */
            for (size_t i = 0; i < np; i++)
                if (views[i] != tdist_ddp_grad_ptr(ddp, i)) {
                    views[i] = p[i].grad = tdist_ddp_grad_ptr(ddp, i);
                    ASSERT_OK(tdist_optim_set_grad(opt, i, views[i]));
                }

        /* reference: every shard through the reference model, its
         * gradient scaled by 1/N (tdist_scale, as DDP's default hook
         * does) and summed in rank order; shard 0's running statistics
         * are the ones kept */
        float *keep[16], *after0[16], *sum[16];
        for (size_t i = 0; i < nb; i++) {
            keep[i] = malloc(rb[i].count * sizeof(float));
            ASSERT_TRUE(keep[i] != NULL);
            memcpy(keep[i], rb[i].data, rb[i].count * sizeof(float)); /* before any shard */
        }
        for (size_t i = 0; i < np; i++) {
            sum[i] = calloc(rp[i].count, sizeof(float));
            ASSERT_TRUE(sum[i] != NULL);
        }
        for (int s = 0; s < n; s++) {
            for (size_t i = 0; i < nb; i++) memcpy(rb[i].data, keep[i], rb[i].count * sizeof(float));
            nn_zero_grad(ref);
            float *rl = nn_forward(ref, x + (size_t)s * shard * in, shard);
            ASSERT_TRUE(rl != NULL);
            ASSERT_EQ(nn_cross_entropy(rl, y + (size_t)s * shard, shard, CLASSES, NULL, dl), 0);
            ASSERT_EQ(nn_backward(ref, dl), 0);
            for (size_t i = 0; i < np; i++) {
                if (n > 1) ASSERT_OK(tdist_scale(rp[i].grad, rp[i].count, TDIST_F32, 1.0 / n));
                if (s == 0) memcpy(sum[i], rp[i].grad, rp[i].count * sizeof(float));
                else
                    for (size_t k = 0; k < rp[i].count; k++) sum[i][k] += rp[i].grad[k];
            }
            if (s == 0)
                for (size_t i = 0; i < nb; i++) {
                    after0[i] = malloc(rb[i].count * sizeof(float));
                    ASSERT_TRUE(after0[i] != NULL);
                    memcpy(after0[i], rb[i].data, rb[i].count * sizeof(float));
                }
        }
        for (size_t i = 0; i < nb; i++) {
            memcpy(rb[i].data, after0[i], rb[i].count * sizeof(float));
            free(after0[i]);
            free(keep[i]);
        }
        for (size_t i = 0; i < np; i++) {
            memcpy(rp[i].grad, sum[i], rp[i].count * sizeof(float));
            free(sum[i]);
        }

        for (size_t i = 0; i < np; i++)
            expect_close(p[i].grad, rp[i].grad, p[i].count, "gradient", p[i].name, step, rank);
        ASSERT_OK(tdist_optim_step(opt));
        ASSERT_OK(tdist_optim_step(ropt));
        for (size_t i = 0; i < np; i++)
            expect_close(p[i].data, rp[i].data, p[i].count, "parameter", p[i].name, step, rank);
    }
    /* buffers: rank 0's, on every rank, after the next forward_begin */
    ASSERT_OK(tdist_ddp_forward_begin(ddp));
    {
        /* the reference's running stats followed shard 0 through the steps */
        for (size_t i = 0; i < nb; i++)
            expect_close(b[i].data, rb[i].data, b[i].count, "buffer", b[i].name, STEPS, rank);
    }
    tdist_optim_destroy(opt);
    tdist_optim_destroy(ropt);
    tdist_ddp_destroy(ddp);
    nn_seq_destroy(m);
    nn_seq_destroy(ref);
    free(x);
    free(dl);
    tdist_pg_destroy(pg);
    tdist_world_destroy(w);
}

static void run_all(variant_t v)
{
    for (int n = 1; n <= 4; n++) tdist_test_run_ranks(n, body, &v);
}

TEST(ddp_nn_cnn_batchnorm_sgd, 90) { run_all((variant_t){.cnn = true}); }
TEST(ddp_nn_cnn_batchnorm_adam, 90) { run_all((variant_t){.cnn = true, .adam = true}); }
TEST(ddp_nn_mlp_adam_bucket_view, 90) { run_all((variant_t){.adam = true, .view = true}); }
TEST(ddp_nn_cnn_sgd_bucket_per_param_view, 90)
{
    run_all((variant_t){.cnn = true, .view = true, .one_bucket_per_param = true});
}
