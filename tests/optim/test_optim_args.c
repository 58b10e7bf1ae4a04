/*
 * tests/optim/test_optim_args.c — defaults, and every optim function
 * against bad arguments: TDIST_ERR_INVALID_ARG with a message naming the
 * function and the argument, out-parameters untouched, never a crash.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>

#include "harness.h"

#define SENTINEL ((tdist_optim_t *)(uintptr_t)0x5a5a)

static float P[8], G[8];

static void expect_invalid(tdist_status_t st, const char *fn, const char *what)
{
    if (st != TDIST_ERR_INVALID_ARG)
        FAIL("expected TDIST_ERR_INVALID_ARG for %s, got %s", what, tdist_status_str(st));
    ASSERT_CONTAINS(tdist_last_error(), fn);
    ASSERT_CONTAINS(tdist_last_error(), what);
}

static void sgd_bad(const tdist_optim_sgd_opts_t *o, const char *what)
{
    tdist_optim_param_t prm = {P, G, 8, NULL};
    tdist_optim_t *opt = SENTINEL;
    tdist_clear_error();
    expect_invalid(tdist_optim_create_sgd(&prm, 1, o, &opt), "tdist_optim_create_sgd", what);
    ASSERT_TRUE(opt == SENTINEL);
}

static void adam_bad(const tdist_optim_adam_opts_t *o, const char *what)
{
    tdist_optim_param_t prm = {P, G, 8, NULL};
    tdist_optim_t *opt = SENTINEL;
    tdist_clear_error();
    expect_invalid(tdist_optim_create_adam(&prm, 1, o, &opt), "tdist_optim_create_adam", what);
    ASSERT_TRUE(opt == SENTINEL);
    tdist_clear_error();
    expect_invalid(tdist_optim_create_adamw(&prm, 1, o, &opt), "tdist_optim_create_adamw", what);
    ASSERT_TRUE(opt == SENTINEL);
}

TEST(optim_defaults_are_torch_defaults, 10)
{
    tdist_optim_sgd_opts_t s;
    memset(&s, 0x7f, sizeof s);
    tdist_optim_sgd_opts_init(&s);
    ASSERT_TRUE(s.lr == 1e-3 && s.momentum == 0.0 && s.dampening == 0.0 && s.weight_decay == 0.0);
    ASSERT_FALSE(s.nesterov);
    ASSERT_FALSE(s.maximize);

    tdist_optim_adam_opts_t a;
    memset(&a, 0x7f, sizeof a);
    tdist_optim_adam_opts_init(&a);
    ASSERT_TRUE(a.lr == 1e-3 && a.beta1 == 0.9 && a.beta2 == 0.999 && a.eps == 1e-8);
    ASSERT_TRUE(a.weight_decay == 0.0);
    ASSERT_FALSE(a.amsgrad);
    ASSERT_FALSE(a.maximize);
    tdist_optim_adamw_opts_init(&a);
    ASSERT_TRUE(a.lr == 1e-3 && a.beta1 == 0.9 && a.beta2 == 0.999 && a.eps == 1e-8);
    ASSERT_TRUE(a.weight_decay == 1e-2);

    /* NULL options mean these defaults */
    tdist_optim_param_t prm = {P, G, 8, "w"};
    tdist_optim_t *opt = NULL;
    double lr = 0;
    tdist_optim_kind_t kind;
    size_t n = 0;
    ASSERT_OK(tdist_optim_create_adamw(&prm, 1, NULL, &opt));
    ASSERT_OK(tdist_optim_get_lr(opt, &lr));
    ASSERT_TRUE(lr == 1e-3);
    ASSERT_OK(tdist_optim_kind(opt, &kind));
    ASSERT_EQ(kind, TDIST_OPTIM_ADAMW);
    ASSERT_OK(tdist_optim_num_buffers(opt, &n));
    ASSERT_EQ(n, 1);
    tdist_optim_destroy(opt);

    /* AdamW's default decay really is applied: zero gradient, param shrinks
     * by lr * wd = 1e-5 relative */
    for (int i = 0; i < 8; i++) {
        P[i] = 1.0f;
        G[i] = 0.0f;
    }
    ASSERT_OK(tdist_optim_create_adamw(&prm, 1, NULL, &opt));
    ASSERT_OK(tdist_optim_step(opt));
    ASSERT_TRUE(P[3] == (float)(1.0 - 1e-5));
    tdist_optim_destroy(opt);

    ASSERT_STREQ(tdist_optim_kind_name(TDIST_OPTIM_SGD), "sgd");
    ASSERT_STREQ(tdist_optim_kind_name(TDIST_OPTIM_ADAM), "adam");
    ASSERT_STREQ(tdist_optim_kind_name(TDIST_OPTIM_ADAMW), "adamw");
    ASSERT_STREQ(tdist_optim_kind_name((tdist_optim_kind_t)0), "invalid");
    ASSERT_STREQ(tdist_optim_kind_name((tdist_optim_kind_t)99), "invalid");

    /* NULL does nothing */
    tdist_optim_sgd_opts_init(NULL);
    tdist_optim_adam_opts_init(NULL);
    tdist_optim_adamw_opts_init(NULL);
    tdist_optim_destroy(NULL);
}

TEST(optim_bad_hyperparameters, 10)
{
    tdist_optim_sgd_opts_t s;
    tdist_optim_sgd_opts_init(&s);
    s.lr = -0.1;
    sgd_bad(&s, "lr must be finite and >= 0, got -0.1");
    s.lr = NAN;
    sgd_bad(&s, "lr must be finite and >= 0");
    s.lr = INFINITY;
    sgd_bad(&s, "lr must be finite and >= 0");
    tdist_optim_sgd_opts_init(&s);
    s.momentum = -0.5;
    sgd_bad(&s, "momentum must be finite and >= 0");
    tdist_optim_sgd_opts_init(&s);
    s.weight_decay = -1;
    sgd_bad(&s, "weight_decay must be finite and >= 0");
    tdist_optim_sgd_opts_init(&s);
    s.dampening = NAN;
    sgd_bad(&s, "dampening must be finite");
    /* torch's rule: nesterov needs momentum and zero dampening */
    tdist_optim_sgd_opts_init(&s);
    s.nesterov = true;
    sgd_bad(&s, "nesterov momentum requires a momentum > 0 and zero dampening (momentum 0, "
                "dampening 0)");
    s.momentum = 0.9;
    s.dampening = 0.1;
    sgd_bad(&s, "nesterov momentum requires a momentum > 0 and zero dampening (momentum 0.9, "
                "dampening 0.1)");

    tdist_optim_adam_opts_t a;
    const double bad_betas[] = {1.0, -0.1, 1.5, NAN};
    for (size_t i = 0; i < sizeof bad_betas / sizeof bad_betas[0]; i++) {
        tdist_optim_adam_opts_init(&a);
        a.beta1 = bad_betas[i];
        adam_bad(&a, "beta1 must be in [0, 1)");
        tdist_optim_adam_opts_init(&a);
        a.beta2 = bad_betas[i];
        adam_bad(&a, "beta2 must be in [0, 1)");
    }
    tdist_optim_adam_opts_init(&a);
    a.lr = -1e-3;
    adam_bad(&a, "lr must be finite and >= 0");
    tdist_optim_adam_opts_init(&a);
    a.eps = -1e-8;
    adam_bad(&a, "eps must be finite and >= 0");
    tdist_optim_adam_opts_init(&a);
    a.weight_decay = -0.01;
    adam_bad(&a, "weight_decay must be finite and >= 0");

    /* the edges that are allowed: lr 0, beta 0, eps 0, nesterov with
     * momentum and zero dampening */
    tdist_optim_param_t prm = {P, G, 8, NULL};
    tdist_optim_t *opt = NULL;
    tdist_optim_adam_opts_init(&a);
    a.lr = 0.0;
    a.beta1 = 0.0;
    a.eps = 0.0;
    ASSERT_OK(tdist_optim_create_adam(&prm, 1, &a, &opt));
    tdist_optim_destroy(opt);
    tdist_optim_sgd_opts_init(&s);
    s.momentum = 0.9;
    s.nesterov = true;
    ASSERT_OK(tdist_optim_create_sgd(&prm, 1, &s, &opt));
    tdist_optim_destroy(opt);
}

TEST(optim_bad_buffers_and_handles, 10)
{
    tdist_optim_t *opt = SENTINEL;
    tdist_optim_param_t prm[3] = {{P, G, 8, "a"}, {P, NULL, 4, "fc2.bias"}, {NULL, NULL, 0, NULL}};

    tdist_clear_error();
    expect_invalid(tdist_optim_create_sgd(prm, 1, NULL, NULL), "tdist_optim_create_sgd", "out");
    expect_invalid(tdist_optim_create_sgd(NULL, 2, NULL, &opt), "tdist_optim_create_sgd",
                   "params is NULL but n is 2");
    expect_invalid(tdist_optim_create_sgd(prm, 2, NULL, &opt), "tdist_optim_create_sgd",
                   "buffer 1 (fc2.bias): grad pointer is NULL");
    prm[1].grad = G;
    prm[1].param = NULL;
    prm[1].name = NULL;
    expect_invalid(tdist_optim_create_adam(prm, 2, NULL, &opt), "tdist_optim_create_adam",
                   "buffer 1: param pointer is NULL");
    expect_invalid(tdist_optim_create_adamw(NULL, 1, NULL, &opt), "tdist_optim_create_adamw",
                   "params is NULL");
    ASSERT_TRUE(opt == SENTINEL);

    /* an empty buffer may have NULL pointers */
    prm[1].param = P;
    opt = NULL;
    ASSERT_OK(tdist_optim_create_adam(prm, 3, NULL, &opt));

    /* handles and indices */
    expect_invalid(tdist_optim_step(NULL), "tdist_optim_step", "opt");
    expect_invalid(tdist_optim_step_range(NULL, 0, 0, 1), "tdist_optim_step_range", "opt");
    expect_invalid(tdist_optim_step_range(opt, 3, 0, 1), "tdist_optim_step_range",
                   "buffer index 3 out of range (the optimizer has 3 buffers)");
    expect_invalid(tdist_optim_step_range(opt, 0, 4, 5), "tdist_optim_step_range",
                   "range offset 4 count 5 is beyond buffer 0 (a) of 8 elements");
    expect_invalid(tdist_optim_step_range(opt, 0, 9, 0), "tdist_optim_step_range",
                   "range offset 9 count 0 is beyond");
    expect_invalid(tdist_optim_step_range(opt, 0, SIZE_MAX, 2), "tdist_optim_step_range",
                   "is beyond buffer 0");
    expect_invalid(tdist_optim_step_range(opt, 0, 2, SIZE_MAX), "tdist_optim_step_range",
                   "is beyond buffer 0");
    uint64_t steps = 42;
    ASSERT_OK(tdist_optim_step_count(opt, 0, &steps));
    ASSERT_EQ(steps, 0); /* the failed calls did not step */
    ASSERT_OK(tdist_optim_step_range(opt, 0, 8, 0)); /* empty range at the end is fine */
    ASSERT_OK(tdist_optim_step_count(opt, 0, &steps));
    ASSERT_EQ(steps, 1);

    expect_invalid(tdist_optim_set_grad(NULL, 0, G), "tdist_optim_set_grad", "opt is NULL");
    expect_invalid(tdist_optim_set_grad(opt, 5, G), "tdist_optim_set_grad", "buffer index 5");
    expect_invalid(tdist_optim_set_grad(opt, 0, NULL), "tdist_optim_set_grad",
                   "grad is NULL for buffer 0 (a)");
    ASSERT_OK(tdist_optim_set_grad(opt, 2, NULL)); /* empty buffer */
    expect_invalid(tdist_optim_set_param(opt, 1, NULL), "tdist_optim_set_param",
                   "param is NULL for buffer 1");
    expect_invalid(tdist_optim_set_param(opt, 3, P), "tdist_optim_set_param", "buffer index 3");

    expect_invalid(tdist_optim_set_lr(NULL, 0.1), "tdist_optim_set_lr", "opt");
    expect_invalid(tdist_optim_set_lr(opt, -0.1), "tdist_optim_set_lr", "lr must be finite");
    expect_invalid(tdist_optim_set_lr(opt, NAN), "tdist_optim_set_lr", "lr must be finite");
    double lr = 7;
    ASSERT_OK(tdist_optim_get_lr(opt, &lr));
    ASSERT_TRUE(lr == 1e-3); /* unchanged by the failed sets */
    lr = 7;
    expect_invalid(tdist_optim_get_lr(NULL, &lr), "tdist_optim_get_lr", "opt");
    expect_invalid(tdist_optim_get_lr(opt, NULL), "tdist_optim_get_lr", "lr");
    ASSERT_TRUE(lr == 7);

    tdist_optim_kind_t kind = (tdist_optim_kind_t)77;
    size_t n = 77;
    expect_invalid(tdist_optim_kind(NULL, &kind), "tdist_optim_kind", "opt");
    expect_invalid(tdist_optim_kind(opt, NULL), "tdist_optim_kind", "kind");
    expect_invalid(tdist_optim_num_buffers(NULL, &n), "tdist_optim_num_buffers", "opt");
    expect_invalid(tdist_optim_num_buffers(opt, NULL), "tdist_optim_num_buffers", "n");
    expect_invalid(tdist_optim_step_count(opt, 3, &steps), "tdist_optim_step_count",
                   "buffer index 3");
    expect_invalid(tdist_optim_step_count(opt, 0, NULL), "tdist_optim_step_count", "steps");
    ASSERT_EQ(kind, 77);
    ASSERT_EQ(n, 77);

    size_t size = 77;
    char blob[256];
    expect_invalid(tdist_optim_state_size(NULL, &size), "tdist_optim_state_size", "opt");
    expect_invalid(tdist_optim_state_size(opt, NULL), "tdist_optim_state_size", "size");
    ASSERT_EQ(size, 77);
    expect_invalid(tdist_optim_save(NULL, blob, sizeof blob), "tdist_optim_save", "opt");
    expect_invalid(tdist_optim_save(opt, NULL, sizeof blob), "tdist_optim_save", "buf");
    expect_invalid(tdist_optim_load(NULL, blob, sizeof blob), "tdist_optim_load", "opt");
    expect_invalid(tdist_optim_load(opt, NULL, sizeof blob), "tdist_optim_load", "buf");
    tdist_optim_destroy(opt);
}

/* lr 0 leaves parameters alone (but still advances the step count and
 * the moments); gradients are never written. */
TEST(optim_lr_zero_and_const_grads, 10)
{
    float p[8], g[8], g_copy[8];
    for (int i = 0; i < 8; i++) {
        p[i] = (float)i - 3.5f;
        g[i] = 0.25f * (float)(i + 1);
    }
    memcpy(g_copy, g, sizeof g);
    tdist_optim_param_t prm = {p, g, 8, NULL};
    tdist_optim_adam_opts_t a;
    tdist_optim_adam_opts_init(&a);
    a.lr = 0.0;
    tdist_optim_t *opt = NULL;
    ASSERT_OK(tdist_optim_create_adam(&prm, 1, &a, &opt));
    ASSERT_OK(tdist_optim_step(opt));
    ASSERT_OK(tdist_optim_step(opt));
    for (int i = 0; i < 8; i++) ASSERT_TRUE(p[i] == (float)i - 3.5f);
    ASSERT_MEMEQ(g, g_copy, sizeof g);
    /* with lr set, the third step moves every parameter against its gradient */
    ASSERT_OK(tdist_optim_set_lr(opt, 0.1));
    ASSERT_OK(tdist_optim_step(opt));
    for (int i = 0; i < 8; i++) ASSERT_TRUE(p[i] < (float)i - 3.5f);
    ASSERT_MEMEQ(g, g_copy, sizeof g);
    tdist_optim_destroy(opt);
}
