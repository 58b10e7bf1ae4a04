/* tests/join/test_join_oracle.c — DDP under Join against PyTorch's own
 * results (PyTorch 1.13.1, gloo, CPU), whose values are embedded below as
 * float32 bit patterns copied from /work/shared/oracle/pytorch_ddp_join.json
 * (the file is not read at test time).
 *
 * S1: 2 ranks, Linear(1,1) w=0.5 b=-0.25, rank r has 5+r inputs x=k+1,
 *     loss = output sum, SGD lr 0.01, default Join: BIT FOR BIT, every
 *     step's averaged gradients and parameters and the final parameters.
 * S3: 3 ranks with 4, 2 and 7 batches of 5, MLP Linear(4,8)-ReLU-Linear(8,3),
 *     cross-entropy mean, SGD lr 0.1 momentum 0.9: to 1e-6 relative (per
 *     tensor, relative to its largest element).
 * The model and the optimizer are written here exactly as PyTorch computes
 * them (the SGD update is one fused multiply-add, p = fma(-lr, buf, p)). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "harness.h"
#include "tdist/join.h"

/* S1, from pytorch_ddp_join.json scenarios.S1.steps["1"] (rank 0's five steps are the
 * first five of these): {weight, bias} per step */
static const uint32_t s1_grads[12] = {
    0x3f800000, 0x3f800000,
    0x40000000, 0x3f800000,
    0x40400000, 0x3f800000,
    0x40800000, 0x3f800000,
    0x40a00000, 0x3f800000,
    0x40400000, 0x3f000000,
};

static const uint32_t s1_params_after[12] = {
    0x3efae148, 0xbe851eb8,
    0x3ef0a3d7, 0xbe8a3d70,
    0x3ee147ae, 0xbe8f5c28,
    0x3ecccccd, 0xbe947ae0,
    0x3eb33333, 0xbe999998,
    0x3ea3d70a, 0xbe9c28f4,
};

static const uint32_t s1_final[2] = {
    0x3ea3d70a, 0xbe9c28f4,
};

/* S3, from pytorch_ddp_join.json scenarios.S3: fc1.weight[8x4], fc1.bias[8],
 * fc2.weight[3x8], fc2.bias[3] concatenated (67 floats) */
static const uint32_t s3_init[67] = {
    0x00000000, 0x3c673605, 0xbce4e5ad, 0x3d28cdc1, 0x3d868d05, 0xbd5ed4bf,
    0x3d2c19b5, 0xbcebd9b4, 0x3dcae05b, 0xbdc4e4eb, 0x3dbaf8a0, 0xbdad4e52,
    0x3dab58da, 0xbdb97663, 0x3dc3dda4, 0xbdca5950, 0x3cdded10, 0xbd257e6b,
    0x3d58b657, 0xbd83cbef, 0xbd2f6235, 0x3cf2c8ff, 0xbc81f196, 0x3ae805ce,
    0xbdbbb420, 0x3dae43da, 0xbd9d56ac, 0x3d894350, 0xbdc3541b, 0x3dca0fb3,
    0xbdccbff7, 0x3dcb571f, 0x3c23d70a, 0x3ca3d70a, 0x3cf5c28f, 0x3d23d70a,
    0x3d4ccccd, 0x3d75c28f, 0x3d8f5c29, 0x3da3d70a, 0x3dac5550, 0xbd9afe3f,
    0x3d868d05, 0xbd5ed4bf, 0x3d2c19b5, 0xbcebd9b4, 0x3c758f0f, 0xba680822,
    0x3dca9ede, 0xbdcccc49, 0x3dcae05b, 0xbdc4e4eb, 0x3dbaf8a0, 0xbdad4e52,
    0x3d9c2c06, 0xbd87e987, 0x3d852dd0, 0xbd99cd5c, 0x3dab58da, 0xbdb97663,
    0x3dc3dda4, 0xbdca5950, 0x3dccc82e, 0xbdcb1dc6, 0x3ca3d70a, 0x3d23d70a,
    0x3d75c28f,
};

/* params after each of the 7 steps (steps 0..6; the same on every rank that took it) */
static const uint32_t s3_params_after[469] = {
    0xb6cd1c3f, 0x3c675124, 0xbce4f3b5, 0x3d28d4dd, 0x3d868f3e, 0xbd5ed98a,
    0x3d2c1ec1, 0xbcebe41a, 0x3dcadf2a, 0xbdc4e390, 0x3dbaf723, 0xbdad4cba,
    0x3dab58fe, 0xbdb976ac, 0x3dc3de10, 0xbdca59de, 0x3cddf0b8, 0xbd257fff,
    0x3d58b7a4, 0xbd83cc6e, 0xbd2f661c, 0x3cf2d064, 0xbc81f86d, 0x3ae86832,
    0xbdbbb12d, 0x3dae40fb, 0xbd9d53ef, 0x3d8940c4, 0xbdc357fe, 0x3dca1389,
    0xbdccc3ac, 0x3dcb5aa0, 0x3c240817, 0x3ca3d578, 0x3cf5ad25, 0x3d23ed07,
    0x3d4cabfa, 0x3d75ed91, 0x3d8f41ff, 0x3da3f557, 0x3dac589c, 0xbd9af95a,
    0x3d86941c, 0xbd5ec022, 0x3d2c36a2, 0xbceb8da5, 0x3c7648e0, 0xba5ac472,
    0x3dcaa771, 0xbdccde71, 0x3dcabc7d, 0xbdc508b6, 0x3dbae6b1, 0xbdad455b,
    0x3d9c4bbb, 0xbd87c263, 0x3d8521f2, 0xbd99c019, 0x3dab75a0, 0xbdb95ce6,
    0x3dc3e11d, 0xbdca754b, 0x3dcc913f, 0xbdcb5f71, 0x3ca89c99, 0x3d23e84b,
    0x3d734e87, 0xb7102c6a, 0x3c675d71, 0xbce4faaf, 0x3d28d8b2, 0x3d868eac,
    0xbd5ed8cc, 0x3d2c1e6c, 0xbcebe445, 0x3dcae193, 0xbdc4e5d2, 0x3dbaf932,
    0xbdad4e8b, 0x3dab54c2, 0xbdb9728b, 0x3dc3da20, 0xbdca5633, 0x3cde087c,
    0xbd258bc3, 0x3d58c30e, 0xbd83d1d9, 0xbd2f7537, 0x3cf2ee92, 0xbc8215f7,
    0x3aea2d2f, 0xbdbba82c, 0x3dae37ef, 0xbd9d4b07, 0x3d89382e, 0xbdc36243,
    0x3dca1de6, 0xbdcccdeb, 0x3dcb648d, 0x3c2463bb, 0x3ca3d288, 0x3cf58515,
    0x3d241613, 0x3d4c6eae, 0x3d763df1, 0x3d8f112e, 0x3da42dfb, 0x3dac670e,
    0xbd9b02d7, 0x3d867cfa, 0xbd5ee20e, 0x3d2c482b, 0xbceadca3, 0x3c789ee5,
    0xba2eae8b, 0x3dcaa714, 0xbdccdb1f, 0x3dcac202, 0xbdc50378, 0x3dbae963,
    0xbdad4624, 0x3d9c4853, 0xbd87c631, 0x3d8513dc, 0xbd99b9ee, 0x3dab873c,
    0xbdb9512e, 0x3dc3d5a6, 0xbdcaa0c2, 0x3dcc49e6, 0xbdcbb3cf, 0x3cb18621,
    0x3d240836, 0x3d6eb9da, 0xb710b4f9, 0x3c675ecb, 0xbce4fbf4, 0x3d28d99d,
    0x3d868dd9, 0xbd5ed74d, 0x3d2c1d1c, 0xbcebe20f, 0x3dcae333, 0xbdc4e772,
    0x3dbafaca, 0xbdad5013, 0x3dab5251, 0xbdb97006, 0x3dc3d794, 0xbdca53ac,
    0x3cde1523, 0xbd259266, 0x3d58c9df, 0xbd83d547, 0xbd2f7ce2, 0x3cf2fed2,
    0xbc8226cf, 0x3aeb3ec3, 0xbdbba3b5, 0x3dae332c, 0xbd9d4611, 0x3d89331d,
    0xbdc36730, 0x3dca2330, 0xbdccd376, 0x3dcb6a3d, 0x3c269a68, 0x3ca2e925,
    0x3cf63653, 0x3d23d9ae, 0x3d4c8c17, 0x3d763f91, 0x3d8f0158, 0x3da44da5,
    0x3dac67d5, 0xbd9b1866, 0x3d86571a, 0xbd5f371b, 0x3d2c01b3, 0xbceb360d,
    0x3c783ff3, 0xba34b4ac, 0x3dcabc78, 0xbdcca659, 0x3dcb1355, 0xbdc49ab0,
    0x3dbb63d2, 0xbdacbbc4, 0x3d9ce2f9, 0xbd871548, 0x3d84fdb1, 0xbd99d925,
    0x3dab5bc9, 0xbdb98f6f, 0x3dc37e73, 0xbdcb14c8, 0x3dcbbb1e, 0xbdcc58ab,
    0x3caa3d9a, 0x3d366362, 0x3d6002f3, 0xb732a5c6, 0x3c6766ef, 0xbce4ffc5,
    0x3d28db5b, 0x3d868e39, 0xbd5ed805, 0x3d2c1dc8, 0xbcebe348, 0x3dcae37a,
    0xbdc4e7b7, 0x3dbafb0a, 0xbdad504e, 0x3dab5152, 0xbdb96f10, 0x3dc3d6ad,
    0xbdca52d8, 0x3cde1b9c, 0xbd259583, 0x3d58cccd, 0xbd83d69f, 0xbd2f816c,
    0x3cf30789, 0xbc822efd, 0x3aebb66b, 0xbdbba0de, 0x3dae3070, 0xbd9d437e,
    0x3d8930c0, 0xbdc36a8e, 0x3dca266b, 0xbdccd67e, 0x3dcb6d02, 0x3c28d2dd,
    0x3ca2895a, 0x3cf5d3f5, 0x3d2466ea, 0x3d4ba1f6, 0x3d77811d, 0x3d8e39c2,
    0x3da53b80, 0x3dac7f72, 0xbd9af3cd, 0x3d868c69, 0xbd5ea275, 0x3d2cca80,
    0xbce9313b, 0x3c7d1f8a, 0xb9b5bf62, 0x3dcac66a, 0xbdcc96d8, 0x3dcb292b,
    0xbdc47b82, 0x3dbb8e4d, 0xbdac844f, 0x3d9d265a, 0xbd86c7c7, 0x3d84dc22,
    0xbd9a0d3f, 0x3dab10a4, 0xbdb9f8f0, 0x3dc2ef91, 0xbdcbcd71, 0x3dcadbca,
    0xbdcd59d6, 0x3ccb2ba1, 0x3d3d6d89, 0x3d4881ca, 0xb750939a, 0x3c67705a,
    0xbce5055b, 0x3d28de87, 0x3d868ebf, 0xbd5ed971, 0x3d2c1f8c, 0xbcebe76f,
    0x3dcae357, 0xbdc4e772, 0x3dbafaa4, 0xbdad4fc9, 0x3dab5101, 0xbdb96ed1,
    0x3dc3d681, 0xbdca52c0, 0x3cde1e67, 0xbd2596e0, 0x3d58ce1a, 0xbd83d73a,
    0xbd2f83a3, 0x3cf30c2f, 0xbc8233c3, 0x3aec034c, 0xbdbb9f61, 0x3dae2ed9,
    0xbd9d41d5, 0x3d892f0e, 0xbdc36c5f, 0x3dca2869, 0xbdccd89e, 0x3dcb6f3a,
    0x3c2aa9fa, 0x3ca1c785, 0x3cf66329, 0x3d2435fb, 0x3d4bb62d, 0x3d77848c,
    0x3d8e2977, 0x3da55726, 0x3dac7c4b, 0xbd9afcdb, 0x3d867e06, 0xbd5ec736,
    0x3d2ca42f, 0xbce9868b, 0x3c7c7876, 0xb9cfa635, 0x3dcadd31, 0xbdcc75be,
    0x3dcb579f, 0xbdc43988, 0x3dbbe89d, 0xbdac0cd8, 0x3d9db77e, 0xbd861f04,
    0x3d84c882, 0xbd9a254b, 0x3daaf094, 0xbdba288a, 0x3dc2a86a, 0xbdcc2f94,
    0x3dca5f89, 0xbdcde8b2, 0x3cc59098, 0x3d4c986b, 0x3d3c246d, 0xb76a6211,
    0x3c67777f, 0xbce50934, 0x3d28e08d, 0x3d868ed1, 0xbd5ed98b, 0x3d2c1f9b,
    0xbcebe776, 0x3dcae3fa, 0xbdc4e836, 0x3dbafb84, 0xbdad50c1, 0x3dab4f9f,
    0xbdb96d34, 0x3dc3d4b1, 0xbdca50c7, 0x3cde2694, 0xbd259b9e, 0x3d58d368,
    0xbd83da1b, 0xbd2f8910, 0x3cf318ba, 0xbc8241bf, 0x3aecf5a6, 0xbdbb9c16,
    0x3dae2b0d, 0xbd9d3d9c, 0x3d892a7e, 0xbdc37034, 0x3dca2cd3, 0xbdccdd86,
    0x3dcb7487, 0x3c2e423a, 0x3ca0aa1d, 0x3cf6d1aa, 0x3d2459d7, 0x3d4b3d82,
    0x3d785b79, 0x3d8d9aed, 0x3da61368, 0x3dac89f7, 0xbd9af33b, 0x3d8688b2,
    0xbd5ea093, 0x3d2ceebc, 0xbce89aec, 0x3c7ef2c8, 0xb967866e, 0x3dcafa68,
    0xbdcc3d2d, 0x3dcbacf5, 0xbdc3c73c, 0x3dbc76a1, 0xbdab6060, 0x3d9e7e65,
    0xbd8538b3, 0x3d849d9f, 0xbd9a677c, 0x3daa9092, 0xbdbaae27, 0x3dc1f51f,
    0xbdcd16f4, 0x3dc94958, 0xbdcf2ae6, 0x3cd3f2e7, 0x3d62e79f, 0x3d1ea412,
    0xb760d113, 0x3c67752d, 0xbce5081a, 0x3d28e00a, 0x3d868eb4, 0xbd5ed955,
    0x3d2c1f6a, 0xbcebe720, 0x3dcae3f3, 0xbdc4e82e, 0x3dbafb7c, 0xbdad50b8,
    0x3dab4fd6, 0xbdb96d6c, 0x3dc3d4e8, 0xbdca50fd, 0x3cde255c, 0xbd259b05,
    0x3d58d2d5, 0xbd83d9d6, 0xbd2f87e8, 0x3cf3166b, 0xbc823f7d, 0x3aecd302,
    0xbdbb9c9e, 0x3dae2b91, 0xbd9d3e19, 0x3d892af2, 0xbdc36f51, 0x3dca2bf1,
    0xbdccdca9, 0x3dcb73b4, 0x3c2fa59b, 0x3ca09371, 0x3cf641ea, 0x3d24ea51,
    0x3d4a5c85, 0x3d797e16, 0x3d8ce73f, 0x3da6e1de, 0x3dac9f12, 0xbd9ac989,
    0x3d86c91a, 0xbd5df759, 0x3d2dbe6b, 0xbce6abfe, 0x3c81af09, 0x38bff39e,
    0x3dcafaa2, 0xbdcc38af, 0x3dcbb2c0, 0xbdc3bfa3, 0x3dbc7f3c, 0xbdab5867,
    0x3d9e8873, 0xbd852f97, 0x3d84884a, 0xbd9a95ac, 0x3daa4a5f, 0xbdbb0a5d,
    0x3dc184ac, 0xbdcd9aa8, 0x3dc8b1e1, 0xbdcfd7c2, 0x3cf42696, 0x3d641479,
    0x3d0d5d62,
};

static const uint32_t s3_final[67] = {
    0xb760d113, 0x3c67752d, 0xbce5081a, 0x3d28e00a, 0x3d868eb4, 0xbd5ed955,
    0x3d2c1f6a, 0xbcebe720, 0x3dcae3f3, 0xbdc4e82e, 0x3dbafb7c, 0xbdad50b8,
    0x3dab4fd6, 0xbdb96d6c, 0x3dc3d4e8, 0xbdca50fd, 0x3cde255c, 0xbd259b05,
    0x3d58d2d5, 0xbd83d9d6, 0xbd2f87e8, 0x3cf3166b, 0xbc823f7d, 0x3aecd302,
    0xbdbb9c9e, 0x3dae2b91, 0xbd9d3e19, 0x3d892af2, 0xbdc36f51, 0x3dca2bf1,
    0xbdccdca9, 0x3dcb73b4, 0x3c2fa59b, 0x3ca09371, 0x3cf641ea, 0x3d24ea51,
    0x3d4a5c85, 0x3d797e16, 0x3d8ce73f, 0x3da6e1de, 0x3dac9f12, 0xbd9ac989,
    0x3d86c91a, 0xbd5df759, 0x3d2dbe6b, 0xbce6abfe, 0x3c81af09, 0x38bff39e,
    0x3dcafaa2, 0xbdcc38af, 0x3dcbb2c0, 0xbdc3bfa3, 0x3dbc7f3c, 0xbdab5867,
    0x3d9e8873, 0xbd852f97, 0x3d84884a, 0xbd9a95ac, 0x3daa4a5f, 0xbdbb0a5d,
    0x3dc184ac, 0xbdcd9aa8, 0x3dc8b1e1, 0xbdcfd7c2, 0x3cf42696, 0x3d641479,
    0x3d0d5d62,
};

/* averaged gradients of step 0 */
static const uint32_t s3_grads0[67] = {
    0x388031a7, 0xb8879ba0, 0x388c4ec4, 0xb88e32ff, 0xb831afdc, 0x383fb018,
    0xb849da24, 0x384ff9f2, 0x37bedc09, 0xb7d8a599, 0x37ee1919, 0xb7fec89f,
    0xb6343248, 0x36b65330, 0xb70773a4, 0x37310780, 0xb79242be, 0x377ccad0,
    0xb75000c4, 0x371f0d08, 0x381c0f3a, 0xb813ec09, 0x3808d2e4, 0xb7f5f964,
    0xb86bdd7a, 0x3865af75, 0xb85ae88d, 0x384bc002, 0x389b7990, 0xb8996cf6,
    0x38944e3e, 0xb88c379f, 0xb8f53e90, 0x36fb3180, 0x38d628a0, 0xb95bdde0,
    0x39a42050, 0xb9d708b0, 0x3a02d1ac, 0xba1780b4, 0xb883cea0, 0xb8c3ca08,
    0xb90dd398, 0xb94e23b0, 0xb9909eb8, 0xb9be2518, 0xb9e844b0, 0xba04a4e0,
    0xb92b73c8, 0x39b593ea, 0x3a33548e, 0x3a32f824, 0x39b357a8, 0xb9334bf0,
    0xba1e87e8, 0xba43b224, 0x396d5afe, 0xb984a172, 0xba0fdfb0, 0xb9fede90,
    0xb88ae440, 0x3a0be56c, 0x3a895512, 0x3aa42b6e, 0xbbbede68, 0xb92c8a00,
    0x3bc4425c,
};

/* inputs[0][0] (rank 0, batch 0, 5x4) and targets[2][6], to check the formulas */
static const uint32_t s3_x00[20] = {
    0x3cdd4ece, 0xbd05ddc0, 0x3d1a6631, 0xbd2bd783, 0xbbee6323, 0x396808b6,
    0x3be007bf, 0xbc6169ef, 0xbd1b9587, 0x3d073b9d, 0xbce05993, 0x3cadbe65,
    0xbd4ccabf, 0x3d4aff93, 0xbd452445, 0x3d3b56d8, 0xbd1933c2, 0x3d2ad954,
    0xbd39137f, 0x3d43995d,
};

static const int s3_y26[5] = {2, 0, 1, 2, 0};

static float f32_of(uint32_t h)
{
    float f;
    memcpy(&f, &h, sizeof f);
    return f;
}

static uint32_t bits_of(float f)
{
    uint32_t h;
    memcpy(&h, &f, sizeof h);
    return h;
}

/* Join the job and create the world group (timeout 20 s, scaled). */
static void open_pg(tdist_world_t **w, tdist_pg_t **pg)
{
    tdist_test_open_world(w, pg, (int64_t)(20000 * tdist_test_timeout_mult()));
}

/* ------------------------------------------------------------------ S1 */

static void expect_bits(const char *what, int step, float got, uint32_t want)
{
    if (bits_of(got) != want)
        FAIL("S1 step %d %s: got %.9g (0x%08x), PyTorch %.9g (0x%08x)", step, what, (double)got,
             bits_of(got), (double)f32_of(want), want);
}

static void s1_body(int rank, int n, void *arg)
{
    (void)arg;
    ASSERT_EQ(n, 2);
    tdist_world_t *w;
    tdist_pg_t *pg;
    open_pg(&w, &pg);
    float p[2] = {0.5f, -0.25f}, g[2] = {0, 0};
    tdist_ddp_param_t params[2] = {{&p[0], &g[0], 1, TDIST_F32, "weight"},
                                   {&p[1], &g[1], 1, TDIST_F32, "bias"}};
    tdist_ddp_t *ddp;
    ASSERT_OK(tdist_ddp_create(pg, params, 2, NULL, 0, NULL, &ddp));
    tdist_joinable_t j;
    ASSERT_OK(tdist_ddp_joinable(ddp, &j));
    tdist_join_t *join;
    ASSERT_OK(tdist_join_begin(&j, 1, NULL, &join));
    const float lr = 0.01f;
    for (int k = 0; k < 5 + rank; k++) {
        g[0] = g[1] = 0; /* zero_grad */
        ASSERT_OK(tdist_ddp_forward_begin(ddp));
        float x = (float)(k + 1);
        /* out = w x + b; loss = out: d/dw = x, d/db = 1 (bias first, as autograd) */
        g[1] += 1.0f;
        ASSERT_OK(tdist_ddp_grad_ready(ddp, 1));
        g[0] += x;
        ASSERT_OK(tdist_ddp_grad_ready(ddp, 0));
        ASSERT_OK(tdist_ddp_backward_end(ddp));
        expect_bits("grad weight", k, g[0], s1_grads[2 * k]);
        expect_bits("grad bias", k, g[1], s1_grads[2 * k + 1]);
        for (int i = 0; i < 2; i++) p[i] = fmaf(-lr, g[i], p[i]);
        expect_bits("weight", k, p[0], s1_params_after[2 * k]);
        expect_bits("bias", k, p[1], s1_params_after[2 * k + 1]);
    }
    ASSERT_OK(tdist_join_end(join));
    expect_bits("final weight", -1, p[0], s1_final[0]);
    expect_bits("final bias", -1, p[1], s1_final[1]);
    tdist_ddp_destroy(ddp);
    tdist_pg_destroy(pg);
    tdist_world_destroy(w);
}

TEST(join_oracle_s1_bitwise, 60)
{
    tdist_test_run_ranks(2, s1_body, NULL);
}

/* ------------------------------------------------------------------ S3 */

#define NIN 4
#define NH 8
#define NOUT 3
#define BS 5
#define NPS3 4
static const size_t s3_count[NPS3] = {NH * NIN, NH, NOUT * NH, NOUT};
static const size_t s3_off[NPS3] = {0, NH * NIN, NH * NIN + NH, NH * NIN + NH + NOUT * NH};
#define S3_TOTAL (NH * NIN + NH + NOUT * NH + NOUT)
static const char *s3_names[NPS3] = {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"};
static const int s3_batches[3] = {4, 2, 7};

static void s3_input(int r, int b, float x[BS][NIN], int y[BS])
{
    for (int s = 0; s < BS; s++) {
        for (int f = 0; f < NIN; f++) x[s][f] = (float)(0.05 * cos((double)(97 * r + 31 * b + 7 * s + 3 * f + 1)));
        y[s] = (5 * b + s + r) % 3;
    }
}

static void s3_init_params(float *p)
{
    for (int i = 0; i < NH; i++)
        for (int j = 0; j < NIN; j++) p[s3_off[0] + i * NIN + j] = (float)(0.1 * sin((double)(7 * i + 3 * j + 0)));
    for (int i = 0; i < NH; i++) p[s3_off[1] + i] = (float)(0.01 * (i + 1) * 1);
    for (int i = 0; i < NOUT; i++)
        for (int j = 0; j < NH; j++) p[s3_off[2] + i * NH + j] = (float)(0.1 * sin((double)(7 * i + 3 * j + 1)));
    for (int i = 0; i < NOUT; i++) p[s3_off[3] + i] = (float)(0.01 * (i + 1) * 2);
}

/* forward + backward of the MLP with mean cross-entropy; adds into g
 * (zeroed by the caller) and calls grad_ready as autograd would finish
 * them: fc2.bias, fc2.weight, fc1.bias, fc1.weight */
static void s3_fwd_bwd(const float *p, float *g, float x[BS][NIN], const int y[BS], tdist_ddp_t *ddp)
{
    const float *w1 = p + s3_off[0], *b1 = p + s3_off[1], *w2 = p + s3_off[2], *b2 = p + s3_off[3];
    float *gw1 = g + s3_off[0], *gb1 = g + s3_off[1], *gw2 = g + s3_off[2], *gb2 = g + s3_off[3];
    float h[BS][NH], d[BS][NOUT];
    for (int s = 0; s < BS; s++) {
        for (int i = 0; i < NH; i++) {
            float a = 0;
            for (int j = 0; j < NIN; j++) a += x[s][j] * w1[i * NIN + j];
            a += b1[i];
            h[s][i] = a > 0 ? a : 0;
        }
        float o[NOUT], mx = -INFINITY;
        for (int k = 0; k < NOUT; k++) {
            float a = 0;
            for (int i = 0; i < NH; i++) a += h[s][i] * w2[k * NH + i];
            o[k] = a + b2[k];
            mx = fmaxf(mx, o[k]);
        }
        float se = 0;
        for (int k = 0; k < NOUT; k++) se += expf(o[k] - mx);
        for (int k = 0; k < NOUT; k++)
            d[s][k] = (expf(o[k] - mx) / se - (k == y[s] ? 1.0f : 0.0f)) / (float)BS;
    }
    for (int s = 0; s < BS; s++)
        for (int k = 0; k < NOUT; k++) gb2[k] += d[s][k];
    ASSERT_OK(tdist_ddp_grad_ready(ddp, 3));
    for (int s = 0; s < BS; s++)
        for (int k = 0; k < NOUT; k++)
            for (int i = 0; i < NH; i++) gw2[k * NH + i] += d[s][k] * h[s][i];
    ASSERT_OK(tdist_ddp_grad_ready(ddp, 2));
    float dh[BS][NH];
    for (int s = 0; s < BS; s++)
        for (int i = 0; i < NH; i++) {
            float a = 0;
            for (int k = 0; k < NOUT; k++) a += d[s][k] * w2[k * NH + i];
            dh[s][i] = h[s][i] > 0 ? a : 0;
            gb1[i] += dh[s][i];
        }
    ASSERT_OK(tdist_ddp_grad_ready(ddp, 1));
    for (int s = 0; s < BS; s++)
        for (int i = 0; i < NH; i++)
            for (int j = 0; j < NIN; j++) gw1[i * NIN + j] += dh[s][i] * x[s][j];
    ASSERT_OK(tdist_ddp_grad_ready(ddp, 0));
}

static void s3_expect(const char *what, int step, const float *got, const uint32_t *want, double tol)
{
    for (int t = 0; t < NPS3; t++) {
        double mx = 0, err = 0;
        size_t worst = 0;
        for (size_t i = 0; i < s3_count[t]; i++) mx = fmax(mx, fabs((double)f32_of(want[s3_off[t] + i])));
        for (size_t i = 0; i < s3_count[t]; i++) {
            double e = fabs((double)got[s3_off[t] + i] - (double)f32_of(want[s3_off[t] + i]));
            if (e > err) {
                err = e;
                worst = i;
            }
        }
        if (err > tol * fmax(mx, 1e-30))
            FAIL("S3 step %d %s of '%s'[%zu]: %.9g, PyTorch %.9g (relative error %.3g > %g)", step,
                 what, s3_names[t], worst, (double)got[s3_off[t] + worst],
                 (double)f32_of(want[s3_off[t] + worst]), err / fmax(mx, 1e-30), tol);
    }
}

static void s3_body(int rank, int n, void *arg)
{
    (void)arg;
    ASSERT_EQ(n, 3);
    /* the formulas reproduce the JSON's inputs and initial parameters */
    float x[BS][NIN];
    int y[BS];
    s3_input(0, 0, x, y);
    for (int i = 0; i < BS * NIN; i++) ASSERT_EQ(bits_of(x[i / NIN][i % NIN]), s3_x00[i]);
    s3_input(2, 6, x, y);
    for (int s = 0; s < BS; s++) ASSERT_EQ(y[s], s3_y26[s]);
    static float p[S3_TOTAL], g[S3_TOTAL], buf[S3_TOTAL];
    s3_init_params(p);
    for (int i = 0; i < S3_TOTAL; i++) ASSERT_EQ(bits_of(p[i]), s3_init[i]);

    tdist_world_t *w;
    tdist_pg_t *pg;
    open_pg(&w, &pg);
    tdist_ddp_param_t params[NPS3];
    for (int t = 0; t < NPS3; t++)
        params[t] = (tdist_ddp_param_t){p + s3_off[t], g + s3_off[t], s3_count[t], TDIST_F32, s3_names[t]};
    tdist_ddp_t *ddp;
    ASSERT_OK(tdist_ddp_create(pg, params, NPS3, NULL, 0, NULL, &ddp));
    tdist_joinable_t j;
    ASSERT_OK(tdist_ddp_joinable(ddp, &j));
    tdist_join_t *join;
    ASSERT_OK(tdist_join_begin(&j, 1, NULL, &join));
    const float lr = 0.1f, mom = 0.9f;
    for (int b = 0; b < s3_batches[rank]; b++) {
        memset(g, 0, sizeof g);
        ASSERT_OK(tdist_ddp_forward_begin(ddp));
        s3_input(rank, b, x, y);
        s3_fwd_bwd(p, g, x, y, ddp);
        ASSERT_OK(tdist_ddp_backward_end(ddp));
        if (b == 0) s3_expect("gradient", b, g, s3_grads0, 1e-5);
        for (int i = 0; i < S3_TOTAL; i++) {
            buf[i] = b == 0 ? g[i] : buf[i] * mom + g[i];
            p[i] = fmaf(-lr, buf[i], p[i]);
        }
        s3_expect("parameter", b, p, s3_params_after + (size_t)b * S3_TOTAL, 1e-6);
    }
    ASSERT_OK(tdist_join_end(join));
    s3_expect("final parameter", -1, p, s3_final, 1e-6);
    tdist_ddp_destroy(ddp);
    tdist_pg_destroy(pg);
    tdist_world_destroy(w);
}

TEST(join_oracle_s3_mlp, 60)
{
    tdist_test_run_ranks(3, s3_body, NULL);
}
