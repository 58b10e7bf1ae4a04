/* tests/algorithms/test_powersgd_fused.c — PowerSGD's fused passes on
 * matrices large enough for the large-product kernels (the input and P,
 * and the output and its error, are then formed a block of rows at a
 * time: several blocks, a short last one, rows longer than a block), 2
 * real ranks, rank 2, error feedback on, 6 steps (4 compressed). Each
 * compressed step is checked from what the observer shows, against
 * plain scalar arithmetic written here:
 *  - P = M Q, with M = the gradient fed + the previous step's error
 *    (the error really was fed back) and Q the Q used;
 *  - the output = P Q^T from the orthogonalised P and the reduced Q;
 *  - the error = M - output, for the compressed matrices and the
 *    uncompressed bias alike;
 * each element bit for bit (every element is a fmaf chain from 0 over k
 * in increasing order). And a second reducer without an observer (the
 * error then goes straight to the parameters' arrays, no bucket-wide
 * copy) must give the same gradients bit for bit at every step. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "tdist/algorithms.h"

/* w1 takes several blocks of rows and a last one shorter than the 16 rows
 * the vector kernels take at once; w3's rows are longer than a block */
#define FP_NP 4
#define FP_N (100 * 1000 + 64 + 40 * 64 + 8 * 5000)
#define FP_R 2
static const size_t fp_count[FP_NP] = {100 * 1000, 64, 40 * 64, 8 * 5000};
static const size_t fp_rows[FP_NP] = {100, 0, 40, 8};
static const char *const fp_name[FP_NP] = {"w1", "b1", "w2", "w3"};

typedef struct fmodel {
    float p[FP_N], g[FP_N];
    tdist_ddp_param_t params[FP_NP];
} fmodel_t;

/* What the observer saw in the current step (one bucket holds it all). */
typedef struct seen {
    float p_local[FP_N], p_ortho[FP_N], q_used[FP_N], q_red[FP_N], out[FP_N], err[FP_N];
    size_t offsets[FP_NP], params[FP_NP], np;
    int stages;
} seen_t;

static uint32_t fbits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static void fp_observe(void *arg, const tdist_ddp_bucket_t *b, tdist_powersgd_stage_t st,
                       const float *data, size_t n)
{
    seen_t *s = arg;
    float *dst = st == TDIST_POWERSGD_P_LOCAL    ? s->p_local
                 : st == TDIST_POWERSGD_P_ORTHO  ? s->p_ortho
                 : st == TDIST_POWERSGD_Q_USED   ? s->q_used
                 : st == TDIST_POWERSGD_Q_REDUCED ? s->q_red
                 : st == TDIST_POWERSGD_OUTPUT   ? s->out
                 : st == TDIST_POWERSGD_ERROR    ? s->err
                                                 : NULL;
    if (!dst) return;
    ASSERT_TRUE(n <= FP_N);
    memcpy(dst, data, n * sizeof *data);
    s->stages++;
    s->np = b->num_params;
    for (size_t j = 0; j < b->num_params && j < FP_NP; j++) {
        s->offsets[j] = b->offsets[j];
        s->params[j] = b->param_indices[j];
    }
}

static float fp_grad(int rank, int k, size_t i)
{
    return (float)(0.02 * sin(0.013 * (double)i * (k + 2) + 0.9 * rank) +
                   0.01 * cos(0.41 * (double)i - 1.7 * k));
}

static tdist_ddp_t *fp_ddp(tdist_pg_t *pg, fmodel_t *m, seen_t *seen, tdist_powersgd_t **s)
{
    memset(m, 0, sizeof *m);
    for (size_t j = 0, off = 0; j < FP_NP; off += fp_count[j], j++)
        m->params[j] = (tdist_ddp_param_t){m->p + off, m->g + off, fp_count[j], TDIST_F32, fp_name[j]};
    tdist_ddp_t *ddp;
    ASSERT_OK(tdist_ddp_create(pg, m->params, FP_NP, NULL, 0, NULL, &ddp));
    tdist_powersgd_opts_t o;
    tdist_powersgd_opts_init(&o);
    o.matrix_approximation_rank = FP_R;
    o.start_powerSGD_iter = 2;
    o.random_seed = 11;
    o.param_rows = fp_rows;
    o.num_params = FP_NP;
    o.observe = seen ? fp_observe : NULL;
    o.observe_arg = seen;
    ASSERT_OK(tdist_powersgd_create(&o, s));
    ASSERT_OK(tdist_powersgd_register(ddp, *s));
    return ddp;
}

/* Check one compressed step: m_in is M (gradient + previous error). */
static void check_step(const seen_t *s, const float *m_in, int k)
{
    size_t poff = 0, qoff = 0, nu = 0;
    for (size_t j = 0; j < s->np; j++) /* the uncompressed values come first in p_local */
        if (fp_rows[s->params[j]] == 0) nu += fp_count[s->params[j]];
    for (size_t j = 0; j < s->np; j++) { /* distinct shapes: plan order = bucket order */
        size_t pi = s->params[j], o = s->offsets[j];
        if (fp_rows[pi] == 0) continue;
        size_t n = fp_rows[pi], mm = fp_count[pi] / n;
        const float *mat = m_in + o, *q = s->q_used + qoff, *p = s->p_ortho + poff;
        const float *qr = s->q_red + qoff;
        for (size_t i = 0; i < n; i++)
            for (size_t c = 0; c < FP_R; c++) {
                float acc = 0.0f;
                for (size_t kk = 0; kk < mm; kk++) acc = fmaf(mat[i * mm + kk], q[kk * FP_R + c], acc);
                if (fbits(acc) != fbits(s->p_local[nu + poff + i * FP_R + c]))
                    FAIL("step %d '%s' P[%zu][%zu]: %.9g, M Q gives %.9g", k, fp_name[pi], i, c,
                         (double)s->p_local[nu + poff + i * FP_R + c], (double)acc);
            }
        for (size_t i = 0; i < n; i++)
            for (size_t c = 0; c < mm; c++) {
                float acc = 0.0f;
                for (size_t kk = 0; kk < FP_R; kk++) acc = fmaf(p[i * FP_R + kk], qr[c * FP_R + kk], acc);
                if (fbits(acc) != fbits(s->out[o + i * mm + c]))
                    FAIL("step %d '%s' output[%zu][%zu]: %.9g, P Q^T gives %.9g", k, fp_name[pi],
                         i, c, (double)s->out[o + i * mm + c], (double)acc);
            }
        poff += n * FP_R;
        qoff += mm * FP_R;
    }
    for (size_t i = 0; i < FP_N; i++) {
        float e = m_in[i] - s->out[i];
        if (fbits(e) != fbits(s->err[i]))
            FAIL("step %d error[%zu]: %.9g, M - output gives %.9g", k, i, (double)s->err[i], (double)e);
    }
}

static void fused_body(int rank, int n, void *arg)
{
    (void)arg;
    ASSERT_EQ(n, 2);
    tdist_world_t *w;
    tdist_pg_t *pg;
    tdist_test_open_world(&w, &pg, (int64_t)(20000 * tdist_test_timeout_mult()));
    /* on the heap, zeroed: megabytes of statics would be read by every
     * process's leak check */
    fmodel_t *a = calloc(1, sizeof *a), *b = calloc(1, sizeof *b);
    seen_t *seen = calloc(1, sizeof *seen);
    float *m_in = calloc(FP_N, sizeof *m_in), *prev_err = calloc(FP_N, sizeof *prev_err);
    ASSERT_TRUE(a && b && seen && m_in && prev_err);
    tdist_powersgd_t *sa, *sb;
    tdist_ddp_t *da = fp_ddp(pg, a, seen, &sa), *db = fp_ddp(pg, b, NULL, &sb);
    for (int k = 0; k < 6; k++) {
        memset(&seen->stages, 0, sizeof seen->stages);
        for (int v = 0; v < 2; v++) {
            fmodel_t *m = v ? b : a;
            tdist_ddp_t *d = v ? db : da;
            ASSERT_OK(tdist_ddp_forward_begin(d));
            for (size_t i = 0; i < FP_N; i++) m->g[i] = fp_grad(rank, k, i);
            for (size_t j = 0; j < FP_NP; j++) ASSERT_OK(tdist_ddp_grad_ready(d, FP_NP - 1 - j));
            ASSERT_OK(tdist_ddp_backward_end(d));
        }
        for (size_t i = 0; i < FP_N; i++)
            if (fbits(a->g[i]) != fbits(b->g[i]))
                FAIL("step %d element %zu: %.9g with an observer, %.9g without", k, i,
                     (double)a->g[i], (double)b->g[i]);
        if (k < 2) continue; /* plain averaging */
        ASSERT_EQ(seen->stages, 6);
        /* the gradients fed, in bucket order, + the previous error */
        for (size_t j = 0; j < seen->np; j++) {
            size_t pi = seen->params[j], src = 0;
            for (size_t t = 0; t < pi; t++) src += fp_count[t];
            for (size_t i = 0; i < fp_count[pi]; i++) {
                float g = fp_grad(rank, k, src + i);
                m_in[seen->offsets[j] + i] = k > 2 ? g + prev_err[seen->offsets[j] + i] : g;
            }
        }
        check_step(seen, m_in, k);
        memcpy(prev_err, seen->err, FP_N * sizeof *prev_err);
    }
    tdist_ddp_destroy(da);
    tdist_ddp_destroy(db);
    tdist_powersgd_destroy(sa);
    tdist_powersgd_destroy(sb);
    tdist_pg_destroy(pg);
    tdist_world_destroy(w);
    free(a);
    free(b);
    free(seen);
    free(m_in);
    free(prev_err);
}

TEST(powersgd_fused_passes_exact_on_large_matrices, 60) { tdist_test_run_ranks(2, fused_body, NULL); }
