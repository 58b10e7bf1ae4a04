/* tests/nn/test_nn_grad.c — every layer's backward (input gradient and each
 * parameter gradient) against central finite differences. */
#include "nn_check.h"

/* Make every parameter non-trivial (BatchNorm starts at 1 and 0). */
static void randomize_params(nn_seq_t *m, uint64_t seed, float lo, float hi)
{
    size_t n = 0;
    float *p = nn_flat_params(m, &n);
    ASSERT_TRUE(p != NULL);
    uint64_t s = seed;
    t_fill(p, n, &s, lo, hi);
}

TEST(nn_linear_grad, 30)
{
    /* (c, h, w) = (2, 3, 5): Linear acts on the last dimension, 6 rows per sample. */
    nn_seq_t *m = nn_seq_create(2, 3, 5, 11);
    ASSERT_TRUE(m != NULL);
    ASSERT_EQ(nn_linear(m, 4), 0);
    size_t c, h, w;
    nn_output_shape(m, &c, &h, &w);
    ASSERT_EQ(c, 2);
    ASSERT_EQ(h, 3);
    ASSERT_EQ(w, 4);
    size_t batch = 3;
    float *x = t_rand_input(batch * nn_input_size(m), 1, -1.0f, 1.0f);
    size_t checked = t_check_grads(m, x, batch, 1, 100, 1000, 1e-2);
    ASSERT_EQ(checked, 4 * 5 + 4 + batch * 30);
    free(x);
    nn_seq_destroy(m);
}

TEST(nn_linear_forward_values, 10)
{
    /* y = x W^T + b by hand for a 2 -> 3 layer. */
    nn_seq_t *m = nn_seq_create(1, 1, 2, 5);
    ASSERT_EQ(nn_linear(m, 3), 0);
    size_t n = 0;
    nn_param_t *p = nn_params(m, &n);
    ASSERT_EQ(n, 2);
    ASSERT_STREQ(p[0].name, "0.weight");
    ASSERT_STREQ(p[1].name, "0.bias");
    ASSERT_EQ(p[0].count, 6);
    ASSERT_EQ(p[1].count, 3);
    const float W[6] = {1, 2, 3, 4, 5, 6}, b[3] = {0.5f, -1, 2};
    memcpy(p[0].data, W, sizeof W);
    memcpy(p[1].data, b, sizeof b);
    const float x[4] = {1, -1, 2, 0.5f};
    float *y = nn_forward(m, x, 2);
    ASSERT_TRUE(y != NULL);
    const float want[6] = {1 - 2 + 0.5f, 3 - 4 - 1, 5 - 6 + 2, 2 + 1 + 0.5f, 6 + 2 - 1, 10 + 3 + 2};
    for (int i = 0; i < 6; i++)
        if (fabsf(y[i] - want[i]) > 1e-6f) FAIL("y[%d] = %g, want %g", i, y[i], want[i]);
    nn_seq_destroy(m);
}

TEST(nn_conv2d_grad, 60)
{
    /* stride 2 with padding 1 on a non-square input, and stride 1 without padding */
    struct {
        size_t c, h, w, oc, k, s, p, oh, ow;
    } cases[] = {{2, 5, 6, 3, 3, 2, 1, 3, 3}, {3, 4, 4, 2, 2, 1, 0, 3, 3}, {1, 3, 3, 2, 1, 1, 1, 5, 5}};
    for (size_t t = 0; t < sizeof cases / sizeof cases[0]; t++) {
        nn_seq_t *m = nn_seq_create(cases[t].c, cases[t].h, cases[t].w, 7 + t);
        ASSERT_TRUE(m != NULL);
        ASSERT_EQ(nn_conv2d(m, cases[t].oc, cases[t].k, cases[t].s, cases[t].p), 0);
        size_t c, h, w;
        nn_output_shape(m, &c, &h, &w);
        ASSERT_EQ(c, cases[t].oc);
        ASSERT_EQ(h, cases[t].oh);
        ASSERT_EQ(w, cases[t].ow);
        size_t batch = 2;
        float *x = t_rand_input(batch * nn_input_size(m), 20 + t, -1.0f, 1.0f);
        ASSERT_GE(t_check_grads(m, x, batch, 1, 200 + t, 1000, 1e-2), 20);
        free(x);
        nn_seq_destroy(m);
    }
}

TEST(nn_conv2d_forward_values, 10)
{
    /* 1 channel 3x3 input, 2x2 kernel of ones, bias 1, padding 0: window sums + 1. */
    nn_seq_t *m = nn_seq_create(1, 3, 3, 1);
    ASSERT_EQ(nn_conv2d(m, 1, 2, 1, 0), 0);
    size_t n;
    nn_param_t *p = nn_params(m, &n);
    ASSERT_EQ(p[0].count, 4);
    for (int i = 0; i < 4; i++) p[0].data[i] = 1.0f;
    p[1].data[0] = 1.0f;
    const float x[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    float *y = nn_forward(m, x, 1);
    ASSERT_TRUE(y != NULL);
    const float want[4] = {13, 17, 25, 29};
    for (int i = 0; i < 4; i++) ASSERT_EQ((int)y[i], (int)want[i]);
    nn_seq_destroy(m);
}

TEST(nn_batchnorm2d_grad, 60)
{
    /* Training mode (batch statistics), weight and bias random so the
     * gradient through the normalisation is non-trivial. */
    nn_seq_t *m = nn_seq_create(3, 3, 2, 3);
    ASSERT_EQ(nn_batchnorm2d(m), 0);
    randomize_params(m, 9, 0.5f, 1.5f);
    size_t batch = 3;
    float *x = t_rand_input(batch * nn_input_size(m), 30, -2.0f, 2.0f);
    ASSERT_GE(t_check_grads(m, x, batch, 1, 300, 1000, 1e-2), 6 + 54);

    /* Eval mode: running statistics, set to arbitrary values. */
    size_t nb = 0;
    nn_buffer_t *b = nn_buffers(m, &nb);
    ASSERT_EQ(nb, 2);
    uint64_t s = 31;
    t_fill(b[0].data, 3, &s, -0.5f, 0.5f);
    t_fill(b[1].data, 3, &s, 0.5f, 2.0f);
    nn_set_training(m, false);
    ASSERT_GE(t_check_grads(m, x, batch, 1, 301, 1000, 1e-2), 6 + 54);
    free(x);
    nn_seq_destroy(m);
}

TEST(nn_relu_grad, 30)
{
    nn_seq_t *m = nn_seq_create(2, 3, 3, 1);
    ASSERT_EQ(nn_relu(m), 0);
    size_t batch = 2, n = batch * nn_input_size(m);
    float *x = t_rand_input(n, 40, 0.1f, 1.0f);
    /* random signs, every |x| >= 0.1 so the finite difference never crosses 0 */
    uint64_t s = 41;
    size_t neg = 0;
    for (size_t i = 0; i < n; i++)
        if (t_rand_u64(&s) & 1) {
            x[i] = -x[i];
            neg++;
        }
    ASSERT_TRUE(neg > 0 && neg < n);
    ASSERT_EQ(t_check_grads(m, x, batch, 1, 400, 1000, 1e-2), n);
    const float *y = nn_forward(m, x, batch);
    for (size_t i = 0; i < n; i++) ASSERT_TRUE(y[i] == (x[i] > 0 ? x[i] : 0.0f));
    free(x);
    nn_seq_destroy(m);
}

/* Distinct values 0.1 apart in random order: no ties, and a 0.01 step never
 * changes which element is the maximum. */
static float *distinct_input(size_t n, uint64_t seed)
{
    float *x = malloc(n * sizeof *x);
    ASSERT_TRUE(x != NULL);
    for (size_t i = 0; i < n; i++) x[i] = 0.1f * (float)i - 0.05f * (float)n;
    uint64_t s = seed;
    for (size_t i = n; i-- > 1;) {
        size_t j = (size_t)(t_rand_u64(&s) % (i + 1));
        float t = x[i];
        x[i] = x[j];
        x[j] = t;
    }
    return x;
}

TEST(nn_maxpool2d_grad, 30)
{
    struct {
        size_t c, h, w, k, s, oh, ow;
    } cases[] = {{2, 4, 6, 2, 2, 2, 3}, {1, 5, 5, 3, 1, 3, 3}, {2, 5, 4, 2, 3, 2, 1}};
    for (size_t t = 0; t < sizeof cases / sizeof cases[0]; t++) {
        nn_seq_t *m = nn_seq_create(cases[t].c, cases[t].h, cases[t].w, 1);
        ASSERT_EQ(nn_maxpool2d(m, cases[t].k, cases[t].s), 0);
        size_t c, h, w;
        nn_output_shape(m, &c, &h, &w);
        ASSERT_EQ(c, cases[t].c);
        ASSERT_EQ(h, cases[t].oh);
        ASSERT_EQ(w, cases[t].ow);
        size_t batch = 2;
        float *x = distinct_input(batch * nn_input_size(m), 50 + t);
        ASSERT_EQ(t_check_grads(m, x, batch, 1, 500 + t, 1000, 1e-2), batch * nn_input_size(m));
        free(x);
        nn_seq_destroy(m);
    }
}

TEST(nn_flatten_grad, 10)
{
    nn_seq_t *m = nn_seq_create(2, 3, 4, 1);
    ASSERT_EQ(nn_flatten(m), 0);
    ASSERT_EQ(nn_linear(m, 3), 0); /* acts on all 24 features */
    size_t c, h, w;
    nn_output_shape(m, &c, &h, &w);
    ASSERT_EQ(c * h, 1);
    ASSERT_EQ(w, 3);
    size_t n;
    nn_param_t *p = nn_params(m, &n);
    ASSERT_EQ(p[0].count, 3 * 24);
    float *x = t_rand_input(2 * 24, 60, -1.0f, 1.0f);
    ASSERT_GE(t_check_grads(m, x, 2, 1, 600, 1000, 1e-2), 72 + 3 + 48);
    free(x);
    nn_seq_destroy(m);
}

TEST(nn_embedding_grad, 30)
{
    /* 2 samples of 5 token indices into a 7 x 3 table, then a Linear. */
    nn_seq_t *m = nn_seq_create(1, 1, 5, 4);
    ASSERT_EQ(nn_embedding(m, 7, 3), 0);
    ASSERT_EQ(nn_linear(m, 2), 0);
    size_t c, h, w;
    nn_output_shape(m, &c, &h, &w);
    ASSERT_EQ(h, 5);
    ASSERT_EQ(w, 2);
    float x[10] = {0, 3, 3, 6, 1, 2, 3, 0, 5, 5}; /* repeats: gradients add up */
    ASSERT_GE(t_check_grads(m, x, 2, 0, 700, 1000, 1e-2), 21 + 6 + 2);

    /* The looked-up rows are the table's rows. */
    size_t n;
    nn_param_t *p = nn_params(m, &n);
    ASSERT_STREQ(p[0].name, "0.weight");
    nn_seq_t *e = nn_seq_create(1, 1, 5, 4);
    ASSERT_EQ(nn_embedding(e, 7, 3), 0);
    nn_param_t *pe = nn_params(e, &n);
    ASSERT_MEMEQ(pe[0].data, p[0].data, 21 * sizeof(float)); /* same seed, same table */
    float *y = nn_forward(e, x, 2);
    ASSERT_TRUE(y != NULL);
    for (size_t t = 0; t < 10; t++) ASSERT_MEMEQ(y + 3 * t, pe[0].data + 3 * (size_t)x[t], 3 * sizeof(float));
    /* No gradient flows to the indices. */
    nn_set_input_grad(e, true);
    float dy[30];
    for (int i = 0; i < 30; i++) dy[i] = 1.0f;
    ASSERT_EQ(nn_backward(e, dy), 0);
    const float *dx = nn_input_grad(e);
    ASSERT_TRUE(dx != NULL);
    for (int i = 0; i < 10; i++) ASSERT_TRUE(dx[i] == 0.0f);
    /* row 3 appears three times, row 4 never */
    for (int d = 0; d < 3; d++) {
        ASSERT_TRUE(pe[0].grad[3 * 3 + d] == 3.0f);
        ASSERT_TRUE(pe[0].grad[4 * 3 + d] == 0.0f);
    }
    /* Indices out of range or not integers fail the forward. */
    float bad[5] = {0, 1, 7, 2, 3};
    ASSERT_TRUE(nn_forward(e, bad, 1) == NULL);
    ASSERT_CONTAINS(nn_last_error(), "position 2 holds 7");
    bad[2] = 1.5f;
    ASSERT_TRUE(nn_forward(e, bad, 1) == NULL);
    bad[2] = -1.0f;
    ASSERT_TRUE(nn_forward(e, bad, 1) == NULL);
    /* ... and a failed forward leaves nothing to go back through */
    ASSERT_EQ(nn_backward(e, dy), -1);
    nn_seq_destroy(e);
    nn_seq_destroy(m);
}

TEST(nn_cnn_grad, 60)
{
    /* The layers together, as the digits demo uses them. */
    nn_seq_t *m = nn_seq_create(1, 6, 6, 8);
    ASSERT_EQ(nn_conv2d(m, 3, 3, 1, 1), 0);
    ASSERT_EQ(nn_batchnorm2d(m), 0);
    ASSERT_EQ(nn_relu(m), 0);
    ASSERT_EQ(nn_maxpool2d(m, 2, 2), 0);
    ASSERT_EQ(nn_flatten(m), 0);
    ASSERT_EQ(nn_linear(m, 4), 0);
    ASSERT_EQ(nn_output_size(m), 4);
    size_t batch = 3;
    float *x = t_rand_input(batch * 36, 80, -1.0f, 1.0f);
    ASSERT_GE(t_check_grads(m, x, batch, 1, 800, 40, 1e-3), 100);
    free(x);
    nn_seq_destroy(m);
}

TEST(nn_cross_entropy_grad, 10)
{
    size_t batch = 4, classes = 5;
    float *z = t_rand_input(batch * classes, 90, -3.0f, 3.0f);
    int labels[4] = {0, 4, 2, 2};
    float loss, d[20];
    ASSERT_EQ(nn_cross_entropy(z, labels, batch, classes, &loss, d), 0);
    /* by hand, in double */
    double want = 0.0;
    for (size_t n = 0; n < batch; n++) {
        double s = 0.0;
        for (size_t j = 0; j < classes; j++) s += exp(z[n * classes + j]);
        want += log(s) - z[n * classes + labels[n]];
    }
    want /= (double)batch;
    if (fabs(loss - want) > 1e-5 * fabs(want)) FAIL("loss %g, want %g", loss, want);
    /* finite differences of the loss */
    for (size_t i = 0; i < batch * classes; i++) {
        float keep = z[i], lp, lm;
        z[i] = keep + 1e-2f;
        ASSERT_EQ(nn_cross_entropy(z, labels, batch, classes, &lp, NULL), 0);
        z[i] = keep - 1e-2f;
        ASSERT_EQ(nn_cross_entropy(z, labels, batch, classes, &lm, NULL), 0);
        z[i] = keep;
        t_close("dlogits", i, d[i], ((double)lp - (double)lm) / 2e-2, 1e-2, 1e-3);
    }
    /* each row of the gradient sums to 0 */
    for (size_t n = 0; n < batch; n++) {
        double s = 0.0;
        for (size_t j = 0; j < classes; j++) s += d[n * classes + j];
        ASSERT_TRUE(fabs(s) < 1e-6);
    }
    /* uniform logits: loss log(classes); large logits do not overflow */
    float u[10] = {0, 0, 0, 0, 0, 1000, 999, 0, 0, 0};
    ASSERT_EQ(nn_cross_entropy(u, labels, 1, 5, &loss, NULL), 0);
    ASSERT_TRUE(fabsf(loss - logf(5.0f)) < 1e-6f);
    int l1 = 1;
    ASSERT_EQ(nn_cross_entropy(u + 5, &l1, 1, 5, &loss, d), 0);
    ASSERT_TRUE(isfinite(loss) && fabsf(loss - 1.3132617f) < 1e-4f); /* log(1 + e) */
    /* in place (dlogits aliases logits) gives the same gradient */
    float z2[20], d2[20];
    memcpy(z2, z, sizeof z2);
    ASSERT_EQ(nn_cross_entropy(z, labels, batch, classes, NULL, d2), 0);
    ASSERT_EQ(nn_cross_entropy(z2, labels, batch, classes, NULL, z2), 0);
    ASSERT_MEMEQ(z2, d2, sizeof d2);
    /* accuracy */
    int lab2[4] = {0, 0, 0, 0};
    size_t correct = nn_count_correct(z, lab2, batch, classes);
    size_t want_c = 0;
    for (size_t n = 0; n < batch; n++) {
        size_t best = 0;
        for (size_t j = 1; j < classes; j++)
            if (z[n * classes + j] > z[n * classes + best]) best = j;
        want_c += best == 0;
    }
    ASSERT_EQ(correct, want_c);
    /* bad labels */
    int badl[4] = {0, 5, 0, 0};
    ASSERT_EQ(nn_cross_entropy(z, badl, batch, classes, &loss, d), -1);
    ASSERT_CONTAINS(nn_last_error(), "label 5 of sample 1");
    badl[1] = -1;
    ASSERT_EQ(nn_cross_entropy(z, badl, batch, classes, &loss, d), -1);
    free(z);
}
