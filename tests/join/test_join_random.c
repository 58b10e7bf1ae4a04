/* tests/join/test_join_random.c — seeded random input counts per rank, 200
 * runs, no hang, at world sizes 2, 3, 4 and 8.
 *
 * One world per world size (one TEST each), and inside it RUNS (200)
 * consecutive Join sessions on the same model, each one run:
 *
 *   - per-rank input counts drawn from a seed every rank shares: 0..6
 *     steps (zero allowed; sometimes all equal, sometimes all zero);
 *   - divide_by_initial_world_size drawn per session;
 *   - 1 or 2 micro-batches per step (all but the last under no_sync);
 *   - one of three reducers over the same model memory: default options
 *     (one bucket), find_unused_parameters with one bucket per parameter,
 *     or a comm hook wrapping the default all_reduce whose continuation
 *     doubles (one bucket per parameter); now and then the chosen reducer
 *     is destroyed and created again (so its buckets are rebuilt in the
 *     next session, possibly on ranks that never iterate in it);
 *   - now and then one plain DDP iteration (no Join) before the session;
 *   - per rank, a random order of the grad_ready calls.
 *
 * The model is join_model.h's: out = W x + b (+ `extra` on rank 0's samples
 * only), f64, SGD by the test; the f64 buffer `cnt` gets rank + 1 added
 * after every forward_begin. Checks:
 *   - on every active rank after every step: the parameters against the
 *     serial reference of this session (same averaging rule as join_model.h's
 *     ref_run: each active rank's accumulated gradient premultiplied by
 *     1 / divisor, summed; doubled with the hook), started from the model
 *     the ranks agreed on at the start of the session;
 *   - the buffer after each forward_begin (the broadcast root's value: the
 *     test models every rank's buffer through every broadcast);
 *   - after tdist_join_end: an all_gather of every rank's parameters and
 *     buffer: all bit-identical, equal to the reference after the last step
 *     and to the last joiner's buffer;
 *   - with the hook: called exactly steps x buckets times per session on
 *     every rank (joined ranks included), continuation as often.
 *
 * Seed: fixed per world size (reproducible), or TDIST_JOIN_RANDOM_SEED;
 * TDIST_JOIN_RANDOM_RUNS changes the number of sessions (stress). Every
 * failure message starts with the seed and the session index; the seed is
 * also printed before the ranks start. Bounded: RUNS sessions, each
 * collective by the group timeout, the whole loop by a time budget. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "tdist/join.h"

#include "join_model.h"

#define RUNS 200
#define MAX_STEPS 6 /* counts are 0..MAX_STEPS */
#define NVARIANTS 3 /* reducer variants */
#define NVALS (NO * NI + NO + NO + 1) /* W, b, extra, cnt */

enum { V_PLAIN, V_UNUSED, V_HOOK };
static const char *const VARIANT_NAME[NVARIANTS] = {"default", "find_unused", "comm_hook"};

typedef struct rcfg {
    int n;
    uint64_t seed;
    int runs;
    double budget_ms; /* the whole loop */
} rcfg_t;

/* Per rank process: what a failure message starts with. */
static char g_ctx[512];

#define RFAIL(...)                                                                             \
    do {                                                                                       \
        char m_[1536];                                                                         \
        snprintf(m_, sizeof m_, __VA_ARGS__);                                                  \
        FAIL("%s: %s", g_ctx, m_);                                                             \
    } while (0)

#define R_OK(expr)                                                                             \
    do {                                                                                       \
        tdist_status_t st_ = (expr);                                                           \
        if (st_ != TDIST_OK)                                                                   \
            RFAIL("%s returned %s: %s", #expr, tdist_status_str(st_), tdist_last_error());     \
    } while (0)

static uint64_t rng_next(uint64_t *s)
{
    /* splitmix64 */
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static int rng_below(uint64_t *s, int k) { return (int)(rng_next(s) % (uint64_t)k); }

/* ------------------------------------------------------------- comm hook */

typedef struct hook_count {
    int calls, thens;
} hook_count_t;

static tdist_status_t hook_then_x2(void *state, const tdist_ddp_bucket_t *bucket,
                                   tdist_ddp_hook_result_t *next)
{
    (void)next;
    ((hook_count_t *)state)->thens++;
    double *d = bucket->buffer;
    for (size_t i = 0; i < bucket->count; i++)
        d[i] *= 2.0;
    return TDIST_OK;
}

static tdist_status_t hook_x2(void *state, const tdist_ddp_bucket_t *bucket,
                              tdist_ddp_hook_result_t *result)
{
    ((hook_count_t *)state)->calls++;
    tdist_status_t st = tdist_ddp_allreduce_hook(NULL, bucket, result);
    if (st != TDIST_OK) return st;
    result->then = hook_then_x2;
    return TDIST_OK;
}

/* ------------------------------------------------------------- the model */

typedef struct world {
    int rank, n;
    tdist_pg_t *pg;
    model_t md;
    tdist_ddp_t *ddp[NVARIANTS];
    size_t nb[NVARIANTS];
    hook_count_t hc;
    double cntv[MAXR]; /* every rank's buffer value, as the test models it */
} world_t;

static void create_reducer(world_t *W, int v)
{
    tdist_ddp_param_t params[3] = {{W->md.w, W->md.gw, NO * NI, TDIST_F64, "W"},
                                   {W->md.b, W->md.gb, NO, TDIST_F64, "b"},
                                   {W->md.ex, W->md.gex, NO, TDIST_F64, "extra"}};
    tdist_ddp_buffer_t bufs[1] = {{&W->md.cnt, 1, TDIST_F64, "cnt"}};
    tdist_ddp_opts_t o;
    tdist_ddp_opts_init(&o);
    if (v != V_PLAIN) o.bucket_cap_bytes = o.first_bucket_bytes = 8; /* a bucket per parameter */
    o.find_unused_parameters = v == V_UNUSED;
    R_OK(tdist_ddp_create(W->pg, params, 3, bufs, 1, &o, &W->ddp[v]));
    if (v == V_HOOK) R_OK(tdist_ddp_register_comm_hook(W->ddp[v], &W->hc, hook_x2));
    W->nb[v] = tdist_ddp_num_buckets(W->ddp[v]);
    if (W->nb[v] != (v == V_PLAIN ? 1u : 3u))
        RFAIL("reducer %s has %zu buckets", VARIANT_NAME[v], W->nb[v]);
    /* sync_at_create: parameters and the buffer from rank 0 */
    for (int r = 0; r < W->n; r++)
        W->cntv[r] = W->cntv[0];
    if (W->md.cnt != W->cntv[0])
        RFAIL("buffer %.17g after create, expected rank 0's %.17g", W->md.cnt, W->cntv[0]);
}

static void zero_grads(model_t *md)
{
    memset(md->gw, 0, sizeof md->gw);
    memset(md->gb, 0, sizeof md->gb);
    memset(md->gex, 0, sizeof md->gex);
}

static void sgd(model_t *md)
{
    for (int i = 0; i < NO * NI; i++)
        md->w[i] -= LR * md->gw[i];
    for (int o = 0; o < NO; o++) {
        md->b[o] -= LR * md->gb[o];
        md->ex[o] -= LR * md->gex[o];
    }
}

static void near(const char *what, int step, const double *a, const double *ref, int cnt)
{
    for (int i = 0; i < cnt; i++)
        if (!(fabs(a[i] - ref[i]) <= TOL * fmax(1.0, fabs(ref[i]))))
            RFAIL("step %d: %s[%d] = %.17g, reference %.17g", step, what, i, a[i], ref[i]);
}

static void expect_ref(int step, const model_t *a, const model_t *ref)
{
    near("W", step, a->w, ref->w, NO * NI);
    near("b", step, a->b, ref->b, NO);
    near("extra", step, a->ex, ref->ex, NO);
}

/* One reference step from *p: ranks with act[r] contribute their gradient
 * at data index kd over `micro` micro-batches, premultiplied by 1/div. */
static void ref_step(model_t *p, int n, const bool *act, int kd, int micro, int div, double hs)
{
    double s = 1.0 / (double)div;
    double gw[NO * NI] = {0}, gb[NO] = {0}, gex[NO] = {0};
    for (int r = 0; r < n; r++) {
        if (!act[r]) continue;
        double lw[NO * NI] = {0}, lb[NO] = {0}, lex[NO] = {0};
        for (int m = 0; m < micro; m++)
            grad(p, r, kd, m, 1.0, lw, lb, lex);
        for (int i = 0; i < NO * NI; i++)
            gw[i] += lw[i] * s;
        for (int o = 0; o < NO; o++) {
            gb[o] += lb[o] * s;
            gex[o] += lex[o] * s;
        }
    }
    for (int i = 0; i < NO * NI; i++)
        p->w[i] -= LR * (hs * gw[i]);
    for (int o = 0; o < NO; o++) {
        p->b[o] -= LR * (hs * gb[o]);
        p->ex[o] -= LR * (hs * gex[o]);
    }
}

/* This rank's part of one step at data index kd: `micro` forward/backward
 * passes (all but the last under no_sync), buffer checked against the
 * modelled broadcast from `root`, grad_ready in a random order. */
static void local_step(world_t *W, tdist_ddp_t *ddp, int v, int kd, int micro, int root,
                       const bool *act, uint64_t *rrng)
{
    model_t *md = &W->md;
    zero_grads(md);
    for (int m = 0; m < micro; m++) {
        R_OK(tdist_ddp_set_no_sync(ddp, m + 1 < micro));
        R_OK(tdist_ddp_forward_begin(ddp));
        /* broadcast from root to every rank (joined ones receive too), then
         * every active rank adds rank + 1 */
        double bval = W->cntv[root];
        if (md->cnt != bval)
            RFAIL("data step %d micro %d: buffer %.17g after forward_begin, expected %.17g (root "
                  "rank %d)",
                  kd, m, md->cnt, bval, root);
        for (int r = 0; r < W->n; r++)
            W->cntv[r] = bval + (act[r] ? r + 1 : 0);
        md->cnt += W->rank + 1;
        grad(md, W->rank, kd, m, 1.0, md->gw, md->gb, md->gex);
        size_t order[3] = {0, 1, 2};
        for (int i = 2; i > 0; i--) {
            int j = rng_below(rrng, i + 1);
            size_t t = order[i];
            order[i] = order[j];
            order[j] = t;
        }
        for (int i = 0; i < 3; i++) {
            /* find_unused: `extra` is used on rank 0 only */
            if (order[i] == 2 && v == V_UNUSED && W->rank != 0) continue;
            R_OK(tdist_ddp_grad_ready(ddp, order[i]));
        }
        R_OK(tdist_ddp_backward_end(ddp));
    }
    sgd(md);
}

static void pack(const model_t *md, double *out)
{
    memcpy(out, md->w, sizeof md->w);
    memcpy(out + NO * NI, md->b, sizeof md->b);
    memcpy(out + NO * NI + NO, md->ex, sizeof md->ex);
    out[NVALS - 1] = md->cnt;
}

/* Every rank's parameters and buffer: bit-identical; equal to *ref and to
 * the modelled buffer. */
static void check_agreed(world_t *W, const model_t *ref, const char *when)
{
    double mine[NVALS], all[MAXR * NVALS];
    pack(&W->md, mine);
    R_OK(tdist_all_gather(W->pg, mine, all, NVALS, TDIST_F64, NULL, NULL));
    for (int r = 1; r < W->n; r++)
        for (int i = 0; i < NVALS; i++)
            if (memcmp(&all[r * NVALS + i], &all[i], sizeof(double)) != 0)
                RFAIL("%s: rank %d's value %d is %.17g, rank 0's %.17g (value %d of %d: W, b, "
                      "extra, cnt)",
                      when, r, i, all[r * NVALS + i], all[i], i, NVALS);
    expect_ref(-1, &W->md, ref);
    for (int r = 0; r < W->n; r++)
        if (W->cntv[r] != W->md.cnt)
            RFAIL("%s: buffer %.17g, expected %.17g on rank %d", when, W->md.cnt, W->cntv[r], r);
}

static void random_body(int rank, int n, void *arg)
{
    const rcfg_t *cfg = arg;
    ASSERT_EQ(n, cfg->n);
    snprintf(g_ctx, sizeof g_ctx, "seed 0x%016" PRIx64 " (TDIST_JOIN_RANDOM_SEED), %d ranks, setup",
             cfg->seed, n);
    static world_t W;
    memset(&W, 0, sizeof W);
    W.rank = rank;
    W.n = n;
    tdist_world_t *w;
    tdist_test_open_world(&w, &W.pg, (int64_t)(10000 * tdist_test_timeout_mult()));
    init_model(&W.md, rank);
    /* every rank's buffer before the first create: its own init value */
    for (int r = 0; r < n; r++)
        W.cntv[r] = 1000.0 * r;
    for (int v = 0; v < NVARIANTS; v++)
        create_reducer(&W, v);
    model_t start;
    init_model(&start, 0); /* rank 0's parameters win at create */
    check_agreed(&W, &start, "after create");

    uint64_t rng = cfg->seed;                                 /* shared by every rank */
    uint64_t rrng = cfg->seed ^ (0x1234567ull * (uint64_t)(rank + 1)); /* this rank's */
    double t0 = tdist_test_now_ms();
    int hist_steps[MAX_STEPS + 1] = {0}, zero_rank_sessions = 0, plain_iters = 0, recreated = 0;
    int per_variant[NVARIANTS] = {0}, micro2 = 0, div_active = 0;
    for (int s = 0; s < cfg->runs; s++) {
        /* ---- this session's draw (identical on every rank) */
        int v = rng_below(&rng, NVARIANTS);
        bool recreate = rng_below(&rng, 16) == 0;
        bool plain = rng_below(&rng, 8) == 0;
        bool divide_initial = rng_below(&rng, 2) == 0;
        int micro = rng_below(&rng, 4) == 0 ? 2 : 1;
        int shape = rng_below(&rng, 10);
        int counts[MAXR];
        int even = rng_below(&rng, MAX_STEPS + 1);
        for (int r = 0; r < n; r++) {
            int c = rng_below(&rng, MAX_STEPS + 1);
            counts[r] = shape == 0 ? even : shape == 1 ? 0 : c; /* all equal / all zero / random */
        }
        int kbase = (s % 64) * (MAX_STEPS + 1); /* data index of this session's step 0 */
        char cs[64] = "";
        for (int r = 0; r < n; r++)
            snprintf(cs + strlen(cs), sizeof cs - strlen(cs), "%s%d", r ? "," : "", counts[r]);
        snprintf(g_ctx, sizeof g_ctx,
                 "seed 0x%016" PRIx64 " (TDIST_JOIN_RANDOM_SEED) session %d of %d, %d ranks, "
                 "counts {%s}, %s, divide by %s, %d micro-batch(es)%s%s",
                 cfg->seed, s, cfg->runs, n, cs, VARIANT_NAME[v],
                 divide_initial ? "initial world size" : "active ranks", micro,
                 recreate ? ", reducer re-created" : "", plain ? ", plain iteration first" : "");
        double hs = v == V_HOOK ? 2.0 : 1.0;
        bool all_act[MAXR];
        for (int r = 0; r < n; r++)
            all_act[r] = true;

        if (tdist_test_now_ms() - t0 > cfg->budget_ms)
            RFAIL("time budget of %.0f ms used up before this session", cfg->budget_ms);

        if (recreate) {
            tdist_ddp_destroy(W.ddp[v]);
            W.ddp[v] = NULL;
            create_reducer(&W, v);
            recreated++;
        }
        tdist_ddp_t *ddp = W.ddp[v];

        /* the reference starts from the model every rank agreed on */
        model_t ref = W.md;
        if (plain) {
            /* one ordinary DDP iteration outside any Join: divisor = world
             * size, buffer root = rank 0 */
            W.hc.calls = W.hc.thens = 0;
            local_step(&W, ddp, v, kbase + MAX_STEPS, 1, 0, all_act, &rrng);
            ref_step(&ref, n, all_act, kbase + MAX_STEPS, 1, n, hs);
            expect_ref(-2, &W.md, &ref);
            if (v == V_HOOK && (W.hc.calls != (int)W.nb[v] || W.hc.thens != (int)W.nb[v]))
                RFAIL("plain iteration: comm hook called %d times, continuation %d, buckets %zu",
                      W.hc.calls, W.hc.thens, W.nb[v]);
            plain_iters++;
        }

        /* ---- the Join session */
        tdist_joinable_t j;
        R_OK(tdist_ddp_joinable(ddp, &j));
        tdist_join_opts_t jo;
        tdist_join_opts_init(&jo);
        jo.divide_by_initial_world_size = divide_initial;
        tdist_join_t *join;
        R_OK(tdist_join_begin(&j, 1, &jo, &join));
        W.hc.calls = W.hc.thens = 0;
        int K = 0;
        for (int r = 0; r < n; r++)
            K = counts[r] > K ? counts[r] : K;
        int last = n - 1; /* the last joiner: highest rank active in the last step */
        for (int k = 0; k < K; k++) {
            bool act[MAXR];
            int lowest = -1, nact = 0;
            for (int r = 0; r < n; r++) {
                act[r] = counts[r] > k;
                if (act[r]) {
                    if (lowest < 0) lowest = r;
                    last = r;
                    nact++;
                }
            }
            /* the reference: every rank computes every step */
            ref_step(&ref, n, act, kbase + k, micro, divide_initial ? n : nact, hs);
            if (act[rank]) {
                local_step(&W, ddp, v, kbase + k, micro, lowest, act, &rrng);
                expect_ref(k, &W.md, &ref);
            } else {
                /* joined: receives the buffer broadcasts (one per micro-batch) */
                for (int m = 0; m < micro; m++) {
                    double bval = W.cntv[lowest];
                    for (int r = 0; r < n; r++)
                        W.cntv[r] = bval + (act[r] ? r + 1 : 0);
                }
            }
        }
        R_OK(tdist_join_end(join));
        /* the final sync: everyone gets the last joiner's parameters and buffer */
        double fin = W.cntv[last];
        for (int r = 0; r < n; r++)
            W.cntv[r] = fin;
        if (v == V_HOOK && (W.hc.calls != K * (int)W.nb[v] || W.hc.thens != K * (int)W.nb[v]))
            RFAIL("comm hook called %d times, continuation %d times; expected %d steps x %zu "
                  "buckets (joined ranks call it on zeros)",
                  W.hc.calls, W.hc.thens, K, W.nb[v]);
        check_agreed(&W, &ref, "after tdist_join_end");

        hist_steps[K]++;
        for (int r = 0; r < n; r++)
            if (counts[r] == 0 && K > 0) {
                zero_rank_sessions++;
                break;
            }
        per_variant[v]++;
        micro2 += micro == 2;
        div_active += !divide_initial;
    }
    double dt = tdist_test_now_ms() - t0;
    if (rank == 0)
        fprintf(stderr,
                "join_random: %d ranks, seed 0x%016" PRIx64 ": %d sessions in %.0f ms (%.1f ms "
                "each); longest 0..6: %d %d %d %d %d %d %d; with a rank without inputs %d; "
                "reducers %d/%d/%d; 2 micro-batches %d; divide by active %d; plain iterations "
                "%d; re-created %d\n",
                n, cfg->seed, cfg->runs, dt, dt / cfg->runs, hist_steps[0], hist_steps[1],
                hist_steps[2], hist_steps[3], hist_steps[4], hist_steps[5], hist_steps[6],
                zero_rank_sessions, per_variant[0], per_variant[1], per_variant[2], micro2,
                div_active, plain_iters, recreated);
    for (int v = 0; v < NVARIANTS; v++)
        tdist_ddp_destroy(W.ddp[v]);
    tdist_pg_destroy(W.pg);
    tdist_world_destroy(w);
}

static void run_random(int n, uint64_t default_seed, double budget_s)
{
    rcfg_t cfg = {.n = n, .seed = default_seed, .runs = RUNS,
                  .budget_ms = budget_s * 1000.0 * tdist_test_timeout_mult()};
    const char *e = getenv("TDIST_JOIN_RANDOM_SEED");
    if (e && *e) cfg.seed = strtoull(e, NULL, 0);
    e = getenv("TDIST_JOIN_RANDOM_RUNS");
    if (e && *e) {
        int r = atoi(e);
        if (r > 0 && r <= 100000) cfg.runs = r;
    }
    fprintf(stderr,
            "join_random: %d ranks, %d sessions, seed 0x%016" PRIx64
            " (reproduce with TDIST_JOIN_RANDOM_SEED=0x%016" PRIx64 ")\n",
            n, cfg.runs, cfg.seed, cfg.seed);
    tdist_ranks_opts_t o;
    tdist_ranks_opts_init(&o, n);
    o.timeout_ms = (int)(cfg.budget_ms + 10000 * tdist_test_timeout_mult());
    tdist_rank_result_t res[MAXR];
    int failed = tdist_test_spawn_ranks(&o, random_body, &cfg, res);
    if (failed) {
        char buf[128];
        int first = -1; /* the first rank that failed on its own */
        for (int r = 0; r < n; r++)
            if (!(res[r].exited && res[r].code == 0) && !res[r].killed_by_harness &&
                (first < 0 || res[r].end_ms < res[first].end_ms))
                first = r;
        if (first >= 0)
            FAIL("seed 0x%016" PRIx64 ": %d of %d ranks failed; first rank %d %s (its message "
                 "above)",
                 cfg.seed, failed, n, first, tdist_test_describe(&res[first], buf, sizeof buf));
        FAIL("seed 0x%016" PRIx64 ": %d of %d ranks failed (killed by the harness at the %d ms "
             "deadline)",
             cfg.seed, failed, n, o.timeout_ms);
    }
}

/* 200 Join sessions (runs) per world size, in one world each. */
TEST(join_random_200_runs_2_ranks, 30) { run_random(2, 0x5eed000000000002ull, 15); }
TEST(join_random_200_runs_3_ranks, 30) { run_random(3, 0x5eed000000000003ull, 15); }
TEST(join_random_200_runs_4_ranks, 30) { run_random(4, 0x5eed000000000004ull, 15); }
TEST(join_random_200_runs_8_ranks, 60) { run_random(8, 0x5eed000000000008ull, 30); }
