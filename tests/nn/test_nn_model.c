/* tests/nn/test_nn_model.c — the model around the layers: parameter order and
 * names, deterministic init, the grad-ready hook, gradient accumulation,
 * re-pointed gradients, BatchNorm's running statistics, Dropout, modes,
 * errors, and a small MLP that learns. */
#include "nn_check.h"

/* conv - bn - relu - maxpool - flatten - linear - relu - linear: 8 params */
static nn_seq_t *small_cnn(uint64_t seed)
{
    nn_seq_t *m = nn_seq_create(2, 4, 4, seed);
    ASSERT_TRUE(m != NULL);
    ASSERT_EQ(nn_conv2d(m, 3, 3, 1, 1), 0);
    ASSERT_EQ(nn_batchnorm2d(m), 0);
    ASSERT_EQ(nn_relu(m), 0);
    ASSERT_EQ(nn_maxpool2d(m, 2, 2), 0);
    ASSERT_EQ(nn_flatten(m), 0);
    ASSERT_EQ(nn_linear(m, 5), 0);
    ASSERT_EQ(nn_relu(m), 0);
    ASSERT_EQ(nn_linear(m, 3), 0);
    return m;
}

TEST(nn_params_order_and_names, 10)
{
    nn_seq_t *m = small_cnn(1);
    ASSERT_EQ(nn_num_layers(m), 8);
    ASSERT_STREQ(nn_layer_kind(m, 0), "conv2d");
    ASSERT_STREQ(nn_layer_kind(m, 1), "batchnorm2d");
    ASSERT_STREQ(nn_layer_kind(m, 3), "maxpool2d");
    ASSERT_STREQ(nn_layer_kind(m, 7), "linear");
    ASSERT_STREQ(nn_layer_kind(m, 8), "invalid");
    size_t n = 0;
    nn_param_t *p = nn_params(m, &n);
    ASSERT_EQ(n, 8);
    const char *names[] = {"0.weight", "0.bias", "1.weight", "1.bias",
                           "5.weight", "5.bias", "7.weight", "7.bias"};
    size_t counts[] = {3 * 2 * 9, 3, 3, 3, 5 * 12, 5, 3 * 5, 3};
    size_t total = 0;
    float *flat = nn_flat_params(m, &total), *gflat = nn_flat_grads(m, &total);
    size_t off = 0;
    for (size_t i = 0; i < n; i++) {
        ASSERT_STREQ(p[i].name, names[i]);
        ASSERT_EQ(p[i].count, counts[i]);
        ASSERT_TRUE(p[i].data == flat + off); /* one flat allocation, in order */
        ASSERT_TRUE(p[i].grad == gflat + off);
        off += counts[i];
    }
    ASSERT_EQ(total, off);
    size_t nb = 0;
    nn_buffer_t *b = nn_buffers(m, &nb);
    ASSERT_EQ(nb, 2);
    ASSERT_STREQ(b[0].name, "1.running_mean");
    ASSERT_STREQ(b[1].name, "1.running_var");
    ASSERT_EQ(b[0].count, 3);
    for (int c = 0; c < 3; c++) {
        ASSERT_TRUE(b[0].data[c] == 0.0f);
        ASSERT_TRUE(b[1].data[c] == 1.0f);
        ASSERT_TRUE(p[2].data[c] == 1.0f); /* bn weight */
        ASSERT_TRUE(p[3].data[c] == 0.0f); /* bn bias */
    }
    ASSERT_EQ(nn_params(m, &n), p); /* same array every time */
    /* a model without buffers gives an empty, non-NULL list */
    nn_seq_t *l = nn_seq_create(1, 1, 2, 1);
    ASSERT_EQ(nn_linear(l, 2), 0);
    ASSERT_TRUE(nn_buffers(l, &nb) != NULL);
    ASSERT_EQ(nb, 0);
    nn_seq_destroy(l);
    nn_seq_destroy(m);
}

TEST(nn_init_deterministic, 10)
{
    nn_seq_t *a = small_cnn(42), *b = small_cnn(42), *c = small_cnn(43);
    size_t na, nb, nc;
    float *pa = nn_flat_params(a, &na), *pb = nn_flat_params(b, &nb), *pc = nn_flat_params(c, &nc);
    ASSERT_EQ(na, nb);
    ASSERT_MEMEQ(pa, pb, na * sizeof(float));
    ASSERT_FALSE(memcmp(pa, pc, na * sizeof(float)) == 0);
    /* PyTorch's defaults: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weight and bias */
    size_t n;
    nn_param_t *p = nn_params(a, &n);
    size_t fan_in[] = {18, 18, 0, 0, 12, 12, 5, 5};
    for (size_t i = 0; i < n; i++) {
        if (!fan_in[i]) continue;
        float bound = 1.0f / sqrtf((float)fan_in[i]), mx = 0.0f;
        for (size_t j = 0; j < p[i].count; j++) {
            ASSERT_TRUE(fabsf(p[i].data[j]) <= bound);
            mx = fmaxf(mx, fabsf(p[i].data[j]));
        }
        ASSERT_TRUE(mx > 0.4f * bound); /* not all tiny */
    }
    /* Embedding: N(0, 1) */
    nn_seq_t *e = nn_seq_create(1, 1, 1, 3);
    ASSERT_EQ(nn_embedding(e, 100, 50), 0);
    nn_param_t *pe = nn_params(e, &n);
    double s = 0, ss = 0;
    for (size_t j = 0; j < 5000; j++) {
        s += pe[0].data[j];
        ss += (double)pe[0].data[j] * pe[0].data[j];
    }
    ASSERT_TRUE(fabs(s / 5000) < 0.1 && fabs(ss / 5000 - 1.0) < 0.1);
    nn_seq_destroy(e);
    nn_seq_destroy(a);
    nn_seq_destroy(b);
    nn_seq_destroy(c);
}

/* ---------------------------------------------------------- the hook */

typedef struct hook_log {
    nn_seq_t *m;
    size_t calls;
    size_t order[32];
    float *snap; /* each parameter's gradient as it was when reported */
    size_t untouched_violations;
} hook_log_t;

static void record(void *ctx, size_t i)
{
    hook_log_t *h = ctx;
    size_t n;
    nn_param_t *p = nn_params(h->m, &n);
    ASSERT_TRUE(i < n);
    ASSERT_TRUE(h->calls < 32);
    h->order[h->calls++] = i;
    size_t off = 0;
    for (size_t k = 0; k < i; k++) off += p[k].count;
    memcpy(h->snap + off, p[i].grad, p[i].count * sizeof(float));
    /* Eagerness: no parameter of an earlier layer has a gradient yet. The
     * parameters before i that belong to i's own layer are weights whose
     * bias (i) was reported first; index parity tells them apart here
     * (every layer of the test model has weight + bias). */
    size_t first_of_layer = i & ~(size_t)1;
    for (size_t k = 0; k < first_of_layer; k++)
        for (size_t j = 0; j < p[k].count; j++)
            if (p[k].grad[j] != 0.0f) h->untouched_violations++;
}

TEST(nn_grad_ready_hook_order, 20)
{
    nn_seq_t *m = small_cnn(5);
    size_t n, total;
    nn_param_t *p = nn_params(m, &n);
    nn_flat_params(m, &total);
    hook_log_t h = {.m = m, .snap = calloc(total, sizeof(float))};
    ASSERT_TRUE(h.snap != NULL);
    nn_set_grad_ready_hook(m, record, &h);

    size_t batch = 4;
    float x[4 * 32], dy[4 * 3];
    uint64_t s = 1;
    t_fill(x, sizeof x / sizeof x[0], &s, -1, 1);
    t_fill(dy, sizeof dy / sizeof dy[0], &s, -1, 1);
    for (int iter = 0; iter < 2; iter++) {
        h.calls = 0;
        nn_zero_grad(m);
        ASSERT_TRUE(nn_forward(m, x, batch) != NULL);
        ASSERT_EQ(nn_backward(m, dy), 0);
        /* every parameter once, in exactly the reverse of nn_params order */
        ASSERT_EQ(h.calls, n);
        for (size_t k = 0; k < n; k++) ASSERT_EQ(h.order[k], n - 1 - k);
        /* the reported gradient was the final one */
        ASSERT_MEMEQ(h.snap, nn_flat_grads(m, &total), total * sizeof(float));
        ASSERT_EQ(h.untouched_violations, 0);
        for (size_t k = 0; k < n; k++) {
            double norm = 0;
            for (size_t j = 0; j < p[k].count; j++) norm += fabsf(p[k].grad[j]);
            ASSERT_TRUE(norm > 0); /* and not trivially zero */
        }
    }
    /* removing the hook: no more calls */
    nn_set_grad_ready_hook(m, NULL, NULL);
    h.calls = 0;
    ASSERT_EQ(nn_backward(m, dy), 0);
    ASSERT_EQ(h.calls, 0);
    free(h.snap);
    nn_seq_destroy(m);
}

/* ------------------------------------------------- accumulation, views */

static float *copy_grads(nn_seq_t *m, size_t *count)
{
    float *g = nn_flat_grads(m, count);
    float *c = malloc(*count * sizeof *c);
    ASSERT_TRUE(c != NULL);
    memcpy(c, g, *count * sizeof *c);
    return c;
}

TEST(nn_grad_accumulates, 20)
{
    nn_seq_t *m = small_cnn(6);
    size_t batch = 3, total;
    float xa[3 * 32], xb[3 * 32], dy[3 * 3];
    uint64_t s = 2;
    t_fill(xa, 96, &s, -1, 1);
    t_fill(xb, 96, &s, -1, 1);
    t_fill(dy, 9, &s, -1, 1);
    /* batchnorm in eval mode so the two batches' forwards do not depend on
     * each other through running statistics (they do not anyway in training
     * mode, but this keeps the reference simple) */
    nn_zero_grad(m);
    ASSERT_TRUE(nn_forward(m, xa, batch) != NULL);
    ASSERT_EQ(nn_backward(m, dy), 0);
    float *ga = copy_grads(m, &total);
    nn_zero_grad(m);
    ASSERT_TRUE(nn_forward(m, xb, batch) != NULL);
    ASSERT_EQ(nn_backward(m, dy), 0);
    float *gb = copy_grads(m, &total);
    double norm = 0;
    for (size_t i = 0; i < total; i++) norm += fabsf(ga[i]) + fabsf(gb[i]);
    ASSERT_TRUE(norm > 1e-3);

    /* two micro-batches without zeroing in between: the sum */
    nn_zero_grad(m);
    ASSERT_TRUE(nn_forward(m, xa, batch) != NULL);
    ASSERT_EQ(nn_backward(m, dy), 0);
    ASSERT_TRUE(nn_forward(m, xb, batch) != NULL);
    ASSERT_EQ(nn_backward(m, dy), 0);
    float *g = nn_flat_grads(m, &total);
    for (size_t i = 0; i < total; i++)
        t_close("accumulated", i, g[i], (double)ga[i] + gb[i], 1e-5, 1e-6);
    /* the same backward twice: double */
    nn_zero_grad(m);
    ASSERT_TRUE(nn_forward(m, xa, batch) != NULL);
    ASSERT_EQ(nn_backward(m, dy), 0);
    ASSERT_EQ(nn_backward(m, dy), 0);
    for (size_t i = 0; i < total; i++) t_close("doubled", i, g[i], 2.0 * ga[i], 1e-5, 1e-6);
    nn_zero_grad(m);
    for (size_t i = 0; i < total; i++) ASSERT_TRUE(g[i] == 0.0f);
    free(ga);
    free(gb);
    nn_seq_destroy(m);
}

typedef struct {
    nn_seq_t *m;
    float *ext;
    size_t total;
    size_t calls;
} view_check_t;

/* When reported, the gradient must already be in the re-pointed memory. */
static void check_in_view(void *ctx, size_t i)
{
    view_check_t *v = ctx;
    size_t n;
    nn_param_t *p = nn_params(v->m, &n);
    ASSERT_TRUE(p[i].grad >= v->ext && p[i].grad + p[i].count <= v->ext + v->total);
    double norm = 0;
    for (size_t j = 0; j < p[i].count; j++) norm += fabsf(p[i].grad[j]);
    ASSERT_TRUE(norm > 0);
    v->calls++;
}

TEST(nn_grad_repointed, 20)
{
    nn_seq_t *a = small_cnn(7), *b = small_cnn(7);
    size_t n, total;
    nn_param_t *pb = nn_params(b, &n);
    nn_flat_params(b, &total);
    /* b's gradients live in an outside buffer, parameters in REVERSE order
     * (as DDP buckets lay them out), with guard values around it. */
    float *ext = malloc((total + 2) * sizeof *ext);
    ASSERT_TRUE(ext != NULL);
    ext[0] = ext[total + 1] = 12345.0f;
    size_t off = 1;
    for (size_t i = n; i-- > 0;) {
        pb[i].grad = ext + off;
        off += pb[i].count;
    }
    view_check_t v = {.m = b, .ext = ext + 1, .total = total};
    nn_set_grad_ready_hook(b, check_in_view, &v);
    nn_zero_grad(b); /* zeroes the views, not the model's own memory */
    float x[2 * 32], dy[2 * 3];
    uint64_t s = 3;
    t_fill(x, 64, &s, -1, 1);
    t_fill(dy, 6, &s, -1, 1);
    for (int iter = 0; iter < 2; iter++) { /* accumulate twice */
        ASSERT_TRUE(nn_forward(a, x, 2) != NULL);
        ASSERT_EQ(nn_backward(a, dy), 0);
        ASSERT_TRUE(nn_forward(b, x, 2) != NULL);
        ASSERT_EQ(nn_backward(b, dy), 0);
    }
    ASSERT_EQ(v.calls, 2 * n);
    size_t ta;
    nn_param_t *pa = nn_params(a, &ta);
    for (size_t i = 0; i < n; i++) ASSERT_MEMEQ(pa[i].grad, pb[i].grad, pa[i].count * sizeof(float));
    float *own = nn_flat_grads(b, &total);
    for (size_t i = 0; i < total; i++) ASSERT_TRUE(own[i] == 0.0f);
    ASSERT_TRUE(ext[0] == 12345.0f && ext[total + 1] == 12345.0f);
    /* a NULL grad pointer is an error, not a crash */
    float *keep = pb[3].grad;
    pb[3].grad = NULL;
    ASSERT_EQ(nn_backward(b, dy), -1);
    ASSERT_CONTAINS(nn_last_error(), "1.bias");
    pb[3].grad = keep;
    free(ext);
    nn_seq_destroy(a);
    nn_seq_destroy(b);
}

/* ---------------------------------------------------------- batchnorm */

TEST(nn_batchnorm_running_stats, 10)
{
    /* 2 channels of 2x1, batch 3: 6 values per channel. */
    nn_seq_t *m = nn_seq_create(2, 2, 1, 1);
    ASSERT_EQ(nn_batchnorm2d(m), 0);
    size_t nb;
    nn_buffer_t *b = nn_buffers(m, &nb);
    float x1[12], x2[12];
    uint64_t s = 4;
    t_fill(x1, 12, &s, -2, 3);
    t_fill(x2, 12, &s, 0, 5);
    double rm[2] = {0, 0}, rv[2] = {1, 1};
    const float *xs[2] = {x1, x2};
    for (int step = 0; step < 2; step++) {
        float *y = nn_forward(m, xs[step], 3);
        ASSERT_TRUE(y != NULL);
        for (int c = 0; c < 2; c++) {
            double v[6], mean = 0, ss = 0;
            for (int n = 0; n < 3; n++)
                for (int i = 0; i < 2; i++) v[n * 2 + i] = xs[step][n * 4 + c * 2 + i];
            for (int i = 0; i < 6; i++) mean += v[i] / 6;
            for (int i = 0; i < 6; i++) ss += (v[i] - mean) * (v[i] - mean);
            rm[c] = 0.9 * rm[c] + 0.1 * mean;
            rv[c] = 0.9 * rv[c] + 0.1 * ss / 5; /* unbiased */
            if (fabs(b[0].data[c] - rm[c]) > 1e-5 || fabs(b[1].data[c] - rv[c]) > 1e-5)
                FAIL("step %d channel %d: running (%g, %g), want (%g, %g)", step, c,
                     b[0].data[c], b[1].data[c], rm[c], rv[c]);
            /* training output: batch statistics, biased variance */
            for (int n = 0; n < 3; n++)
                for (int i = 0; i < 2; i++) {
                    double want = (v[n * 2 + i] - mean) / sqrt(ss / 6 + 1e-5);
                    ASSERT_TRUE(fabs(y[n * 4 + c * 2 + i] - want) < 1e-4);
                }
        }
    }
    /* eval: running statistics, buffers unchanged */
    nn_set_training(m, false);
    float *y = nn_forward(m, x1, 3);
    ASSERT_TRUE(y != NULL);
    for (int c = 0; c < 2; c++) {
        ASSERT_TRUE(fabs(b[0].data[c] - rm[c]) < 1e-5);
        for (int n = 0; n < 3; n++)
            for (int i = 0; i < 2; i++) {
                double want = (x1[n * 4 + c * 2 + i] - rm[c]) / sqrt(rv[c] + 1e-5);
                ASSERT_TRUE(fabs(y[n * 4 + c * 2 + i] - want) < 1e-4);
            }
    }
    /* training with one value per channel cannot normalise */
    nn_set_training(m, true);
    nn_seq_t *one = nn_seq_create(1, 1, 1, 1);
    ASSERT_EQ(nn_batchnorm2d(one), 0);
    float v1 = 1.0f;
    ASSERT_TRUE(nn_forward(one, &v1, 1) == NULL);
    ASSERT_CONTAINS(nn_last_error(), "batchnorm2d");
    nn_set_training(one, false);
    ASSERT_TRUE(nn_forward(one, &v1, 1) != NULL);
    nn_seq_destroy(one);
    nn_seq_destroy(m);
}

/* ------------------------------------------------------------ dropout */

TEST(nn_dropout_masks, 20)
{
    const size_t n = 4000;
    const float p = 0.3f;
    nn_seq_t *a = nn_seq_create(1, 1, n, 9), *b = nn_seq_create(1, 1, n, 9);
    ASSERT_EQ(nn_dropout(a, p), 0);
    ASSERT_EQ(nn_dropout(b, p), 0);
    float *x = malloc(n * sizeof *x), *ya = malloc(n * sizeof *ya), *dy = malloc(n * sizeof *dy);
    uint64_t s = 5;
    t_fill(x, n, &s, 0.5f, 1.5f); /* no zeros: a zero output means dropped */
    t_fill(dy, n, &s, -1, 1);
    nn_set_input_grad(a, true);
    float *prev = malloc(n * sizeof *prev);
    for (int step = 0; step < 3; step++) {
        float *y = nn_forward(a, x, 1);
        ASSERT_TRUE(y != NULL);
        memcpy(ya, y, n * sizeof *ya);
        size_t dropped = 0;
        for (size_t i = 0; i < n; i++) {
            if (ya[i] == 0.0f) {
                dropped++;
            } else if (fabsf(ya[i] - x[i] / (1.0f - p)) > 1e-6f) {
                FAIL("kept value %zu: %g, want %g", i, ya[i], x[i] / (1.0f - p));
            }
        }
        /* 1200 expected, sd ~29: within 5 sd */
        ASSERT_TRUE(dropped > 1050 && dropped < 1350);
        /* backward uses the same mask */
        ASSERT_EQ(nn_backward(a, dy), 0);
        const float *dx = nn_input_grad(a);
        for (size_t i = 0; i < n; i++) {
            float want = ya[i] == 0.0f ? 0.0f : dy[i] / (1.0f - p);
            ASSERT_TRUE(fabsf(dx[i] - want) < 1e-6f);
        }
        /* the same seed gives the same masks, forward after forward */
        float *yb = nn_forward(b, x, 1);
        ASSERT_MEMEQ(ya, yb, n * sizeof *ya);
        /* and a new mask each forward */
        if (step > 0) ASSERT_FALSE(memcmp(prev, ya, n * sizeof *ya) == 0);
        memcpy(prev, ya, n * sizeof *ya);
    }
    /* eval: identity */
    nn_set_training(a, false);
    float *y = nn_forward(a, x, 1);
    ASSERT_MEMEQ(y, x, n * sizeof *x);
    ASSERT_EQ(nn_backward(a, dy), 0);
    ASSERT_MEMEQ(nn_input_grad(a), dy, n * sizeof *dy);
    free(prev);
    free(x);
    free(ya);
    free(dy);
    nn_seq_destroy(a);
    nn_seq_destroy(b);
}

/* --------------------------------------------------------------- errors */

TEST(nn_errors, 10)
{
    ASSERT_TRUE(nn_seq_create(0, 1, 1, 0) == NULL);
    ASSERT_CONTAINS(nn_last_error(), "bad input shape");
    nn_seq_destroy(NULL);
    ASSERT_EQ(nn_linear(NULL, 3), -1);
    ASSERT_CONTAINS(nn_last_error(), "model is NULL");

    nn_seq_t *m = nn_seq_create(1, 4, 4, 1);
    ASSERT_EQ(nn_linear(m, 0), -1);
    ASSERT_CONTAINS(nn_last_error(), "out_features 0");
    ASSERT_EQ(nn_conv2d(m, 2, 7, 1, 1), -1);
    ASSERT_CONTAINS(nn_last_error(), "does not fit");
    ASSERT_EQ(nn_conv2d(m, 2, 3, 0, 1), -1);
    ASSERT_EQ(nn_maxpool2d(m, 5, 1), -1);
    ASSERT_EQ(nn_dropout(m, 1.0f), -1);
    ASSERT_EQ(nn_dropout(m, -0.1f), -1);
    ASSERT_EQ(nn_embedding(m, 0, 3), -1);
    ASSERT_EQ(nn_num_layers(m), 0); /* failed adds leave nothing behind */
    size_t n = 99;
    ASSERT_TRUE(nn_params(m, NULL) == NULL);
    float x[16] = {0};
    ASSERT_TRUE(nn_forward(m, x, 1) == NULL);
    ASSERT_CONTAINS(nn_last_error(), "no layers");
    nn_seq_destroy(m);

    m = nn_seq_create(1, 4, 4, 1);
    ASSERT_EQ(nn_conv2d(m, 2, 3, 1, 1), 0);
    float dy[32] = {0};
    ASSERT_EQ(nn_backward(m, dy), -1);
    ASSERT_CONTAINS(nn_last_error(), "no successful nn_forward");
    ASSERT_TRUE(nn_input_grad(m) == NULL);
    ASSERT_TRUE(nn_forward(m, NULL, 1) == NULL);
    ASSERT_TRUE(nn_forward(m, x, 0) == NULL);
    ASSERT_TRUE(nn_params(m, &n) != NULL);
    ASSERT_EQ(n, 2);
    /* layers cannot be added once the model is in use */
    ASSERT_EQ(nn_relu(m), -1);
    ASSERT_CONTAINS(nn_last_error(), "already in use");
    ASSERT_TRUE(nn_forward(m, x, 1) != NULL);
    ASSERT_EQ(nn_backward(m, NULL), -1);
    ASSERT_EQ(nn_backward(m, dy), 0);
    ASSERT_TRUE(nn_input_grad(m) == NULL); /* off by default */
    /* a bigger batch later reallocates; the smaller again reuses */
    float xb[5 * 16] = {0};
    ASSERT_TRUE(nn_forward(m, xb, 5) != NULL);
    ASSERT_TRUE(nn_forward(m, x, 1) != NULL);
    ASSERT_EQ(nn_cross_entropy(NULL, NULL, 1, 1, NULL, NULL), -1);
    nn_seq_destroy(m);
}

/* ---------------------------------------------------------------- learns */

TEST(nn_mlp_learns_xor, 30)
{
    /* 64 noisy XOR points: label = (x0 > 0) != (x1 > 0). */
    enum { N = 64 };
    float x[N * 2];
    int y[N];
    uint64_t s = 6;
    for (int i = 0; i < N; i++) {
        float a = (i & 1) ? 1.0f : -1.0f, b = (i & 2) ? 1.0f : -1.0f;
        x[2 * i] = a + t_rand(&s, -0.3f, 0.3f);
        x[2 * i + 1] = b + t_rand(&s, -0.3f, 0.3f);
        y[i] = (a > 0) != (b > 0);
    }
    nn_seq_t *m = nn_seq_create(1, 1, 2, 1234);
    ASSERT_EQ(nn_linear(m, 16), 0);
    ASSERT_EQ(nn_relu(m), 0);
    ASSERT_EQ(nn_linear(m, 16), 0);
    ASSERT_EQ(nn_relu(m), 0);
    ASSERT_EQ(nn_linear(m, 2), 0);
    size_t np;
    nn_param_t *p = nn_params(m, &np);
    float d[N * 2], first = 0, loss = 0;
    int steps = 0;
    for (; steps < 1000; steps++) {
        float *logits = nn_forward(m, x, N);
        ASSERT_TRUE(logits != NULL);
        ASSERT_EQ(nn_cross_entropy(logits, y, N, 2, &loss, d), 0);
        if (steps == 0) first = loss;
        if (loss < first / 50) break;
        nn_zero_grad(m);
        ASSERT_EQ(nn_backward(m, d), 0);
        for (size_t k = 0; k < np; k++) /* plain SGD, lr 0.2 */
            for (size_t j = 0; j < p[k].count; j++) p[k].data[j] -= 0.2f * p[k].grad[j];
    }
    fprintf(stderr, "xor: loss %.4f -> %.4f in %d steps\n", first, loss, steps);
    ASSERT_TRUE(first > 0.5f);
    ASSERT_TRUE(loss < first / 50);
    float *logits = nn_forward(m, x, N);
    ASSERT_EQ(nn_count_correct(logits, y, N, 2), N);
    nn_seq_destroy(m);
}
