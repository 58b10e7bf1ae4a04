/*
 * tests/optim/test_optim_state.c — saving and loading optimizer state:
 * a checkpoint taken after 3 steps and loaded into a fresh optimizer, then
 * 2 more steps, equals 5 steps straight, bit for bit; blobs of another
 * kind, layout or size, and truncated or corrupted blobs fail clearly and
 * leave the optimizer unchanged.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "harness.h"

#define NB 3
static const size_t counts[NB] = {5, 64, 33};
static const char *const names[NB] = {"embed", "fc1.weight", "fc1.bias"};

typedef struct model {
    float p[NB][64];
    float g[NB][64];
} model_t;

static void model_init(model_t *m)
{
    memset(m, 0, sizeof *m);
    for (size_t b = 0; b < NB; b++)
        for (size_t i = 0; i < counts[b]; i++)
            m->p[b][i] = (float)(0.5 + 0.01 * (double)i - 0.3 * (double)b);
}

static void model_grads(model_t *m, int t)
{
    for (size_t b = 0; b < NB; b++)
        for (size_t i = 0; i < counts[b]; i++)
            m->g[b][i] = (float)(sin(0.37 * (double)i + 1.1 * t + (double)b) * (1.0 + 0.2 * t));
}

static void params_of(model_t *m, tdist_optim_param_t *params)
{
    for (size_t b = 0; b < NB; b++)
        params[b] = (tdist_optim_param_t){m->p[b], m->g[b], counts[b], names[b]};
}

/* The optimizers under test: one config per state layout. */
enum { CFG_SGD, CFG_SGD_MOMENTUM, CFG_ADAM, CFG_ADAM_AMSGRAD, CFG_ADAMW, NCFG };
static const char *const cfg_names[NCFG] = {"sgd", "sgd+nesterov", "adam", "adam+amsgrad",
                                            "adamw+amsgrad"};

static tdist_optim_t *create_cfg(int cfg, model_t *m)
{
    tdist_optim_param_t params[NB];
    params_of(m, params);
    tdist_optim_t *opt = NULL;
    if (cfg == CFG_SGD || cfg == CFG_SGD_MOMENTUM) {
        tdist_optim_sgd_opts_t o;
        tdist_optim_sgd_opts_init(&o);
        o.lr = 0.1;
        o.weight_decay = 0.01;
        if (cfg == CFG_SGD_MOMENTUM) {
            o.momentum = 0.9;
            o.nesterov = true;
        }
        ASSERT_OK(tdist_optim_create_sgd(params, NB, &o, &opt));
    } else {
        tdist_optim_adam_opts_t o;
        tdist_optim_adam_opts_init(&o);
        o.lr = 0.01;
        o.weight_decay = 0.05;
        o.amsgrad = cfg != CFG_ADAM;
        if (cfg == CFG_ADAMW)
            ASSERT_OK(tdist_optim_create_adamw(params, NB, &o, &opt));
        else
            ASSERT_OK(tdist_optim_create_adam(params, NB, &o, &opt));
    }
    return opt;
}

static void step(tdist_optim_t *opt, model_t *m, int t)
{
    if (t == 2) ASSERT_OK(tdist_optim_set_lr(opt, 0.02)); /* a scheduler's change */
    model_grads(m, t);
    ASSERT_OK(tdist_optim_step(opt));
}

static void *save_blob(const tdist_optim_t *opt, size_t *size)
{
    ASSERT_OK(tdist_optim_state_size(opt, size));
    void *blob = malloc(*size);
    ASSERT_TRUE(blob != NULL);
    ASSERT_OK(tdist_optim_save(opt, blob, *size));
    return blob;
}

TEST(optim_state_roundtrip_equals_straight_run, 20)
{
    for (int cfg = 0; cfg < NCFG; cfg++) {
        /* 5 steps straight */
        model_t a;
        model_init(&a);
        tdist_optim_t *oa = create_cfg(cfg, &a);
        for (int t = 1; t <= 5; t++) step(oa, &a, t);

        /* 3 steps, checkpoint (parameters + optimizer blob), drop everything */
        model_t b;
        model_init(&b);
        tdist_optim_t *ob = create_cfg(cfg, &b);
        for (int t = 1; t <= 3; t++) step(ob, &b, t);
        size_t size = 0;
        void *blob = save_blob(ob, &size);
        float saved_params[NB][64];
        memcpy(saved_params, b.p, sizeof saved_params);
        tdist_optim_destroy(ob);

        /* resume in a fresh model and optimizer created with the initial lr */
        model_t c;
        model_init(&c);
        memcpy(c.p, saved_params, sizeof saved_params);
        tdist_optim_t *oc = create_cfg(cfg, &c);
        ASSERT_OK(tdist_optim_load(oc, blob, size));
        double lr = 0;
        ASSERT_OK(tdist_optim_get_lr(oc, &lr));
        ASSERT_TRUE(lr == 0.02);
        for (size_t i = 0; i < NB; i++) {
            uint64_t steps = 0;
            ASSERT_OK(tdist_optim_step_count(oc, i, &steps));
            ASSERT_EQ(steps, 3);
        }
        for (int t = 4; t <= 5; t++) step(oc, &c, t);

        for (size_t i = 0; i < NB; i++)
            if (memcmp(a.p[i], c.p[i], counts[i] * sizeof(float)) != 0)
                FAIL("%s: buffer %zu differs after save/load (first value %.9g vs %.9g)",
                     cfg_names[cfg], i, (double)a.p[i][0], (double)c.p[i][0]);
        /* and the states agree too: saving both gives the same blob */
        size_t sa = 0, sc = 0;
        void *ba = save_blob(oa, &sa);
        void *bc = save_blob(oc, &sc);
        ASSERT_EQ(sa, sc);
        ASSERT_MEMEQ(ba, bc, sa);
        free(ba);
        free(bc);
        free(blob);
        tdist_optim_destroy(oa);
        tdist_optim_destroy(oc);
    }
}

/* Without the state (a fresh optimizer, no load) the result does differ:
 * the round trip above is not passing vacuously. */
TEST(optim_state_matters, 20)
{
    for (int cfg = 0; cfg < NCFG; cfg++) {
        if (cfg == CFG_SGD) continue; /* plain SGD has no state */
        model_t a, c;
        model_init(&a);
        tdist_optim_t *oa = create_cfg(cfg, &a);
        for (int t = 1; t <= 5; t++) step(oa, &a, t);
        model_init(&c);
        tdist_optim_t *oc = create_cfg(cfg, &c);
        for (int t = 1; t <= 3; t++) step(oc, &c, t);
        tdist_optim_destroy(oc);
        oc = create_cfg(cfg, &c); /* state lost */
        for (int t = 4; t <= 5; t++) step(oc, &c, t);
        ASSERT_TRUE(memcmp(a.p[1], c.p[1], counts[1] * sizeof(float)) != 0);
        tdist_optim_destroy(oa);
        tdist_optim_destroy(oc);
    }
}

TEST(optim_state_size_and_layout, 10)
{
    size_t elems = counts[0] + counts[1] + counts[2];
    const size_t per_state[NCFG] = {0, 1, 2, 3, 3};
    for (int cfg = 0; cfg < NCFG; cfg++) {
        model_t m;
        model_init(&m);
        tdist_optim_t *opt = create_cfg(cfg, &m);
        size_t size = 0;
        ASSERT_OK(tdist_optim_state_size(opt, &size));
        /* 96-byte header, 16 bytes per buffer, the state, an 8-byte checksum */
        ASSERT_EQ(size, 96 + 16 * NB + per_state[cfg] * elems * sizeof(float) + 8);
        unsigned char *blob = save_blob(opt, &size);
        ASSERT_MEMEQ(blob, "TDOPTIM", 8);
        uint32_t version, kind;
        memcpy(&version, blob + 8, 4);
        memcpy(&kind, blob + 16, 4);
        ASSERT_EQ(version, TDIST_OPTIM_STATE_VERSION);
        tdist_optim_kind_t k;
        ASSERT_OK(tdist_optim_kind(opt, &k));
        ASSERT_EQ(kind, k);
        /* a buffer too small is refused and nothing is written */
        unsigned char *small = malloc(size);
        ASSERT_TRUE(small != NULL);
        memset(small, 0xAB, size);
        ASSERT_STATUS(tdist_optim_save(opt, small, size - 1), TDIST_ERR_INVALID_ARG);
        ASSERT_CONTAINS(tdist_last_error(), "too small");
        for (size_t i = 0; i < size; i++) ASSERT_EQ(small[i], 0xAB);
        /* a larger buffer is fine (the blob is still size bytes) */
        ASSERT_OK(tdist_optim_save(opt, small, size));
        ASSERT_MEMEQ(small, blob, size);
        free(small);
        free(blob);
        tdist_optim_destroy(opt);
    }
}

/* Load err into opt; expect status and message; opt must be unchanged:
 * its blob after the failed load is the blob before. */
static void expect_load_fails(tdist_optim_t *opt, const void *blob, size_t size,
                              tdist_status_t want, const char *msg)
{
    size_t before_size = 0, after_size = 0;
    void *before = save_blob(opt, &before_size);
    tdist_clear_error();
    ASSERT_STATUS(tdist_optim_load(opt, blob, size), want);
    ASSERT_CONTAINS(tdist_last_error(), "tdist_optim_load");
    ASSERT_CONTAINS(tdist_last_error(), msg);
    void *after = save_blob(opt, &after_size);
    ASSERT_EQ(before_size, after_size);
    ASSERT_MEMEQ(before, after, before_size);
    free(before);
    free(after);
}

TEST(optim_state_load_mismatch, 20)
{
    model_t m;
    model_init(&m);
    void *blobs[NCFG];
    size_t sizes[NCFG];
    tdist_optim_t *opts[NCFG];
    for (int cfg = 0; cfg < NCFG; cfg++) {
        opts[cfg] = create_cfg(cfg, &m);
        step(opts[cfg], &m, 1);
        blobs[cfg] = save_blob(opts[cfg], &sizes[cfg]);
    }
    model_t fresh;
    model_init(&fresh);

    /* kind */
    tdist_optim_t *adam = create_cfg(CFG_ADAM, &fresh);
    expect_load_fails(adam, blobs[CFG_SGD_MOMENTUM], sizes[CFG_SGD_MOMENTUM], TDIST_ERR_MISMATCH,
                      "blob is for sgd, this optimizer is adam");
    tdist_optim_t *adamw = create_cfg(CFG_ADAMW, &fresh);
    expect_load_fails(adamw, blobs[CFG_ADAM_AMSGRAD], sizes[CFG_ADAM_AMSGRAD], TDIST_ERR_MISMATCH,
                      "blob is for adam, this optimizer is adamw");
    /* layout: amsgrad vs not, momentum vs not */
    expect_load_fails(adam, blobs[CFG_ADAM_AMSGRAD], sizes[CFG_ADAM_AMSGRAD], TDIST_ERR_MISMATCH,
                      "blob holds amsgrad state (3 state arrays per element), this adam "
                      "optimizer has no amsgrad state (2)");
    tdist_optim_t *sgd = create_cfg(CFG_SGD, &fresh);
    expect_load_fails(sgd, blobs[CFG_SGD_MOMENTUM], sizes[CFG_SGD_MOMENTUM], TDIST_ERR_MISMATCH,
                      "blob holds a momentum buffer (1 state arrays per element), this sgd "
                      "optimizer has no momentum buffer (0)");

    /* number of buffers and their sizes */
    tdist_optim_param_t params[NB];
    params_of(&fresh, params);
    tdist_optim_adam_opts_t ao;
    tdist_optim_adam_opts_init(&ao);
    tdist_optim_t *two = NULL;
    ASSERT_OK(tdist_optim_create_adam(params, 2, &ao, &two));
    expect_load_fails(two, blobs[CFG_ADAM], sizes[CFG_ADAM], TDIST_ERR_MISMATCH,
                      "blob has 3 buffers, this optimizer has 2");
    params[2].count = 32;
    tdist_optim_t *shorter = NULL;
    ASSERT_OK(tdist_optim_create_adam(params, NB, &ao, &shorter));
    expect_load_fails(shorter, blobs[CFG_ADAM], sizes[CFG_ADAM], TDIST_ERR_MISMATCH,
                      "buffer 2 (fc1.bias): 33 elements in the blob, 32 here");

    /* truncated, extended, corrupted, foreign, other version / byte order */
    size_t n = sizes[CFG_ADAM];
    unsigned char *bad = malloc(n + 8);
    ASSERT_TRUE(bad != NULL);
    memcpy(bad, blobs[CFG_ADAM], n);
    expect_load_fails(adam, bad, n - 1, TDIST_ERR_INVALID_ARG, "truncated or corrupted");
    expect_load_fails(adam, bad, n + 8, TDIST_ERR_INVALID_ARG, "truncated or corrupted");
    expect_load_fails(adam, bad, 50, TDIST_ERR_INVALID_ARG, "too short");
    expect_load_fails(adam, bad, 0, TDIST_ERR_INVALID_ARG, "too short");
    bad[n / 2] ^= 0x10; /* one bit of the state */
    expect_load_fails(adam, bad, n, TDIST_ERR_INVALID_ARG, "checksum mismatch");
    bad[n / 2] ^= 0x10;
    bad[104] ^= 0x01; /* buffer 0's step count */
    expect_load_fails(adam, bad, n, TDIST_ERR_INVALID_ARG, "checksum mismatch");
    bad[104] ^= 0x01;
    bad[0] = 'X';
    expect_load_fails(adam, bad, n, TDIST_ERR_INVALID_ARG, "not a tdist optimizer state blob");
    bad[0] = 'T';
    uint32_t v = 7;
    memcpy(bad + 8, &v, 4);
    expect_load_fails(adam, bad, n, TDIST_ERR_INVALID_ARG,
                      "blob has state version 7, this library reads version 1");
    v = TDIST_OPTIM_STATE_VERSION;
    memcpy(bad + 8, &v, 4);
    v = 0x04030201;
    memcpy(bad + 12, &v, 4);
    expect_load_fails(adam, bad, n, TDIST_ERR_INVALID_ARG, "another byte order");
    v = 0x01020304;
    memcpy(bad + 12, &v, 4);
    uint64_t huge = UINT64_MAX / 2;
    memcpy(bad + 24, &huge, 8); /* absurd buffer count */
    expect_load_fails(adam, bad, n, TDIST_ERR_INVALID_ARG, "corrupted or truncated");
    memcpy(bad, blobs[CFG_ADAM], n);
    ASSERT_OK(tdist_optim_load(adam, bad, n)); /* restored bytes load fine */

    free(bad);
    tdist_optim_destroy(adam);
    tdist_optim_destroy(adamw);
    tdist_optim_destroy(sgd);
    tdist_optim_destroy(two);
    tdist_optim_destroy(shorter);
    for (int cfg = 0; cfg < NCFG; cfg++) {
        free(blobs[cfg]);
        tdist_optim_destroy(opts[cfg]);
    }
}

/* An optimizer over no buffers still saves and loads (a rank with nothing
 * to optimise under ZeRO). */
TEST(optim_state_empty_optimizer, 10)
{
    tdist_optim_t *opt = NULL;
    ASSERT_OK(tdist_optim_create_sgd(NULL, 0, NULL, &opt));
    ASSERT_OK(tdist_optim_step(opt));
    size_t size = 0;
    void *blob = save_blob(opt, &size);
    ASSERT_EQ(size, 96 + 8);
    ASSERT_OK(tdist_optim_set_lr(opt, 0.5));
    ASSERT_OK(tdist_optim_load(opt, blob, size));
    double lr = 0;
    ASSERT_OK(tdist_optim_get_lr(opt, &lr));
    ASSERT_TRUE(lr == 1e-3);
    free(blob);
    tdist_optim_destroy(opt);
}

/* Direct state access (what ZeRO's consolidation and re-sharding use):
 * the momentum buffer after a first step is the gradient; a step count
 * set by hand is what the next step continues from. */
TEST(optim_state_ptr_and_step_count, 10)
{
    float p[3] = {1.0f, 2.0f, 3.0f}, g[3] = {0.5f, -0.25f, 0.125f};
    tdist_optim_param_t prm = {.param = p, .grad = g, .count = 3, .name = "w"};
    tdist_optim_sgd_opts_t o;
    tdist_optim_sgd_opts_init(&o);
    o.momentum = 0.9;
    tdist_optim_t *opt = NULL;
    ASSERT_OK(tdist_optim_create_sgd(&prm, 1, &o, &opt));
    int ns = -1;
    ASSERT_OK(tdist_optim_num_state(opt, &ns));
    ASSERT_EQ(ns, 1);
    ASSERT_OK(tdist_optim_step(opt));
    float *buf = NULL;
    ASSERT_OK(tdist_optim_state_ptr(opt, 0, 0, &buf));
    ASSERT_TRUE(memcmp(buf, g, sizeof g) == 0);
    ASSERT_STATUS(tdist_optim_state_ptr(opt, 0, 1, &buf), TDIST_ERR_INVALID_ARG);
    ASSERT_STATUS(tdist_optim_state_ptr(opt, 1, 0, &buf), TDIST_ERR_INVALID_ARG);
    ASSERT_OK(tdist_optim_set_step_count(opt, 0, 41));
    ASSERT_OK(tdist_optim_step(opt));
    uint64_t steps = 0;
    ASSERT_OK(tdist_optim_step_count(opt, 0, &steps));
    ASSERT_EQ(steps, 42);
    ASSERT_STATUS(tdist_optim_set_step_count(opt, 3, 1), TDIST_ERR_INVALID_ARG);
    tdist_optim_destroy(opt);
    tdist_optim_sgd_opts_init(&o); /* no momentum: no state arrays */
    ASSERT_OK(tdist_optim_create_sgd(&prm, 1, &o, &opt));
    ASSERT_OK(tdist_optim_num_state(opt, &ns));
    ASSERT_EQ(ns, 0);
    ASSERT_STATUS(tdist_optim_state_ptr(opt, 0, 0, &buf), TDIST_ERR_INVALID_ARG);
    tdist_optim_destroy(opt);
}

/* The state as one flat vector: buffer by buffer, slot by slot, the
 * arrays state_ptr points at; copying a changed vector back in changes
 * exactly those arrays and leaves the step counts alone. */
TEST(optim_state_flat_vector, 10)
{
    model_t m;
    model_init(&m);
    tdist_optim_param_t params[NB];
    params_of(&m, params);
    tdist_optim_t *opt = NULL;
    ASSERT_OK(tdist_optim_create_adam(params, NB, NULL, &opt));
    for (int t = 0; t < 2; t++) {
        model_grads(&m, t);
        ASSERT_OK(tdist_optim_step(opt));
    }
    size_t count = 0;
    ASSERT_OK(tdist_optim_state_count(opt, &count));
    ASSERT_EQ(count, 2 * (counts[0] + counts[1] + counts[2]));
    float *v = malloc(count * sizeof *v);
    ASSERT_TRUE(v != NULL);
    ASSERT_STATUS(tdist_optim_copy_state_out(opt, v, count - 1), TDIST_ERR_INVALID_ARG);
    ASSERT_OK(tdist_optim_copy_state_out(opt, v, count));
    size_t at = 0;
    for (size_t b = 0; b < NB; b++)
        for (int s = 0; s < 2; s++, at += counts[b]) {
            float *arr = NULL;
            ASSERT_OK(tdist_optim_state_ptr(opt, b, s, &arr));
            ASSERT_TRUE(memcmp(v + at, arr, counts[b] * sizeof(float)) == 0);
        }
    for (size_t i = 0; i < count; i++) v[i] = (float)i;
    ASSERT_STATUS(tdist_optim_copy_state_in(opt, v, count + 1), TDIST_ERR_INVALID_ARG);
    ASSERT_OK(tdist_optim_copy_state_in(opt, v, count));
    float *arr = NULL;
    ASSERT_OK(tdist_optim_state_ptr(opt, 1, 1, &arr)); /* fc1.weight's exp_avg_sq */
    ASSERT_EQ(arr[3], (float)(2 * counts[0] + counts[1] + 3));
    uint64_t steps = 0;
    ASSERT_OK(tdist_optim_step_count(opt, 2, &steps));
    ASSERT_EQ(steps, 2);
    free(v);
    tdist_optim_destroy(opt);
    tdist_optim_sgd_opts_t o; /* SGD without momentum: an empty vector */
    tdist_optim_sgd_opts_init(&o);
    ASSERT_OK(tdist_optim_create_sgd(params, NB, &o, &opt));
    ASSERT_OK(tdist_optim_state_count(opt, &count));
    ASSERT_EQ(count, 0);
    ASSERT_OK(tdist_optim_copy_state_out(opt, NULL, 0));
    tdist_optim_destroy(opt);
}
