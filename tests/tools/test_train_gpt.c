/* tests/tools/test_train_gpt.c — the README's main job, end to end and
 * short: examples/train_gpt under tdistrun on the text of Debian's
 * `fortunes` package (scripts/test.sh installs it; scripts/fortunes_corpus.sh
 * joins it into the test's tmpdir), with a small model and few iterations.
 *   - 2 ranks, uneven shards, rounds under Join: the validation loss falls
 *     and every rank ends with identical parameters; --checkpoint-
 *     activations ends with bitwise the same parameters, --offload within
 *     rounding of them (same loss to 2 decimals);
 *   - exact resume on 1 rank: a run stopped after iteration 6 and resumed
 *     from its checkpoint prints the same losses and ends with the same
 *     parameter hash as an uninterrupted run;
 *   - resume on 2 ranks stopped where rank 0 has already joined: rank 1
 *     writes the checkpoint, and the resumed run ends at the same
 *     validation loss;
 *   - --hook bf16, powersgd:2 and int8 learn and keep the replicas identical;
 *   - --zero ends with bitwise the parameters of the default run, and a
 *     --zero run stopped where rank 0 has joined and resumed ends with them
 *     too; --local-sgd K and --diloco H (f32 and int8) learn, send fewer
 *     bytes than DDP and end with identical replicas;
 *   - bad or conflicting options are refused. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proc.h"

#define TDISTRUN TDIST_BIN_DIR "/tools/tdistrun/tdistrun"
#define GPT TDIST_BIN_DIR "/examples/train_gpt"

static char *corpus(void)
{
    static char path[512];
    if (path[0]) return path;
    char *out = tmp_path("fortunes.txt");
    char cmd[800];
    snprintf(cmd, sizeof cmd, "bash '%s/scripts/fortunes_corpus.sh' '%s'", TDIST_SOURCE_DIR, out);
    if (system(cmd) != 0)
        FAIL("scripts/fortunes_corpus.sh failed: install Debian's fortunes (scripts/test.sh does)");
    snprintf(path, sizeof path, "%s", out);
    return path;
}

/* The value after `key` in the final line of rank 0. */
static double final_value(const char *out, const char *key)
{
    const char *fin = strstr(out, "[rank 0] final val_loss=");
    if (!fin) FAIL("no final line in:\n%s", out);
    const char *k = strstr(fin, key);
    if (!k) FAIL("no %s in the final line:\n%s", key, fin);
    return atof(k + strlen(key));
}

static void hash_of(const char *out, char hash[17])
{
    const char *fin = strstr(out, "[rank 0] final val_loss=");
    const char *h = fin ? strstr(fin, "params_hash=") : NULL;
    if (!h) FAIL("no params_hash in:\n%s", out);
    memcpy(hash, h + strlen("params_hash="), 16);
    hash[16] = '\0';
}

/* Fails unless runs a and b end with the same parameter hash. */
static void same_hash(const run_t *a, const run_t *b, const char *what)
{
    char ha[17], hb[17];
    hash_of(a->out, ha);
    hash_of(b->out, hb);
    if (strcmp(ha, hb) != 0) FAIL("%s: final parameters differ: %s vs %s", what, hb, ha);
}

#define SMALL "--layers", "1", "--embd", "32", "--heads", "2", "--seq", "32", "--batch", "4"

static void run_gpt(const char *nproc, const char *extra1, const char *extra2, const char *extra3,
                    const char *tag, run_t *r)
{
    const char *argv[] = {TDISTRUN, "--nproc-per-node", nproc, GPT, corpus(), SMALL,
                          "--steps", "24", "--round", "8", "--log-every", "1", "--sample", "40",
                          extra1, extra2, extra3, NULL};
    run(argv, 100, tag, r);
    if (!r->exited || r->code != 0) FAIL("%s: exit %d\n%s\n%s", tag, r->code, r->out, r->err);
}

TEST(tdistrun_train_gpt_2_ranks, 150)
{
    run_t r, rc, ro;
    run_gpt("2", NULL, NULL, NULL, "gpt2", &r);
    ASSERT_CONTAINS(r.out, "[rank 0] train_gpt: rank 0 of 2: shard of ");
    ASSERT_CONTAINS(r.out, "[rank 1] it 24/24 loss ");
    ASSERT_CONTAINS(r.out, "[rank 0] sample (40 bytes");
    const char *v0 = strstr(r.out, "[rank 0] val_loss at iteration 0: ");
    if (!v0) FAIL("no initial validation loss:\n%s", r.out);
    double first = atof(v0 + strlen("[rank 0] val_loss at iteration 0: "));
    double last = final_value(r.out, "final val_loss=");
    if (!(last < first - 0.5)) FAIL("validation loss %.4f -> %.4f: not learning\n%s", first, last, r.out);
    ASSERT_TRUE(final_value(r.out, "unigram=") > 2.0);
    ASSERT_CONTAINS(strstr(r.out, "final val_loss="), "params_identical=yes\n");

    char h[17], hc[17];
    hash_of(r.out, h);
    run_gpt("2", "--checkpoint-activations", NULL, NULL, "gpt2_ckact", &rc);
    hash_of(rc.out, hc);
    if (strcmp(h, hc) != 0) FAIL("--checkpoint-activations changed the parameters: %s vs %s", h, hc);
    ASSERT_CONTAINS(rc.out, "(--checkpoint-activations; keeping all in f32: ");

    run_gpt("2", "--offload", NULL, NULL, "gpt2_offload", &ro);
    ASSERT_CONTAINS(strstr(ro.out, "final val_loss="), "params_identical=yes\n");
    double lo = final_value(ro.out, "final val_loss=");
    if (!(lo < last + 0.05 && lo > last - 0.05)) FAIL("--offload: val_loss %.4f vs %.4f", lo, last);
    run_free(&r);
    run_free(&rc);
    run_free(&ro);
}

/* DDP's comm hooks on the GPT under Join: each names itself, learns and
 * ends with identical parameters (PowerSGD compresses from the second
 * round on). */
TEST(tdistrun_train_gpt_hooks, 150)
{
    static const char *const hooks[] = {"bf16", "powersgd:2", "int8"};
    for (int i = 0; i < 3; i++) {
        run_t r;
        char tag[32];
        snprintf(tag, sizeof tag, "gpt_hook%d", i);
        run_gpt("2", "--hook", hooks[i], NULL, tag, &r);
        char want[96];
        snprintf(want, sizeof want, "iterations in rounds of 8 (one Join each); hook %s\n", hooks[i]);
        ASSERT_CONTAINS(r.out, want);
        const char *v0 = strstr(r.out, "[rank 0] val_loss at iteration 0: ");
        if (!v0) FAIL("no initial validation loss:\n%s", r.out);
        double first = atof(v0 + strlen("[rank 0] val_loss at iteration 0: "));
        double last = final_value(r.out, "final val_loss=");
        if (!(last < first - 0.5)) FAIL("--hook %s: validation loss %.4f -> %.4f", hooks[i], first, last);
        ASSERT_CONTAINS(strstr(r.out, "final val_loss="), "params_identical=yes\n");
        run_free(&r);
    }
}

/* The lines "it N/24 loss X ..." for N > from, up to the " lr". */
static void loss_lines(const char *out, int from, char *buf, size_t cap)
{
    buf[0] = '\0';
    for (const char *p = strstr(out, "] it "); p; p = strstr(p + 1, "] it ")) {
        int n = atoi(p + 5);
        const char *e = strstr(p, " lr ");
        if (n <= from || !e) continue;
        size_t len = strlen(buf);
        snprintf(buf + len, cap - len, "%.*s\n", (int)(e - p), p);
    }
}

/* On nproc ranks, with option `mode` (may be NULL): an uninterrupted run
 * (*full), a run stopped after iteration `stop` with its checkpoint
 * (*part), and a run resumed from it (*rest), all of run_gpt's size. */
static void stop_and_resume_mode(const char *nproc, const char *stop, const char *mode,
                                 run_t *full, run_t *part, run_t *rest)
{
    char ckpt[512], tag[32];
    snprintf(ckpt, sizeof ckpt, "%s", tmp_path("gpt.ckpt"));
    snprintf(tag, sizeof tag, "uninterrupted%s", nproc);
    run_gpt(nproc, mode, NULL, NULL, tag, full);
    const char *argv[] = {TDISTRUN, "--nproc-per-node", nproc, GPT, corpus(), SMALL,
                          "--steps", "24", "--round", "8", "--log-every", "1", "--ckpt", ckpt,
                          "--stop-after", stop, mode, NULL};
    run(argv, 100, "stopped", part);
    if (!part->exited || part->code != 0) FAIL("stopped run: exit %d\n%s", part->code, part->err);
    char want[600];
    snprintf(want, sizeof want, "stopped after iteration %s", stop);
    ASSERT_CONTAINS(part->out, want);
    /* written to FILE.tmp, then renamed: the file is there, the .tmp not */
    snprintf(want, sizeof want, "%s.tmp", ckpt);
    FILE *f = fopen(ckpt, "rb"), *t = fopen(want, "rb");
    ASSERT_TRUE(f != NULL);
    ASSERT_TRUE(t == NULL);
    fclose(f);
    if (mode) {
        const char *again[] = {TDISTRUN, "--nproc-per-node", nproc, GPT, corpus(), SMALL,
                               "--steps", "24", "--round", "8", "--log-every", "1", "--resume",
                               "--ckpt", ckpt, mode, NULL};
        run(again, 100, "resumed", rest);
        if (!rest->exited || rest->code != 0) FAIL("resumed run: exit %d\n%s", rest->code, rest->err);
    } else {
        run_gpt(nproc, "--resume", "--ckpt", ckpt, "resumed", rest);
    }
    ASSERT_CONTAINS(rest->out, "resumed from ");
}

static void stop_and_resume(const char *nproc, const char *stop, run_t *full, run_t *part,
                            run_t *rest)
{
    stop_and_resume_mode(nproc, stop, NULL, full, part, rest);
}

TEST(tdistrun_train_gpt_exact_resume_1_rank, 150)
{
    run_t full, part, rest;
    stop_and_resume("1", "6", &full, &part, &rest);
    ASSERT_CONTAINS(part.out, "checkpoint: iteration 6 written to ");
    ASSERT_TRUE(strstr(part.out, "it 7/24") == NULL);
    ASSERT_TRUE(strstr(rest.out, "it 6/24") == NULL);
    static char a[8192], b[8192];
    loss_lines(full.out, 6, a, sizeof a);
    loss_lines(rest.out, 6, b, sizeof b);
    if (strlen(a) < 100) FAIL("too few loss lines:\n%s", full.out);
    if (strcmp(a, b) != 0) FAIL("losses differ after resume:\n%s\nvs\n%s", a, b);
    same_hash(&full, &rest, "after resume");
    run_free(&full);
    run_free(&part);
    run_free(&rest);
}

/* 2 ranks, stopped after iteration 7: rank 0 takes 6 of every 8 batches,
 * so it has joined and rank 1, still active, must write the checkpoint.
 * The resumed run ends where the uninterrupted one does (the same
 * validation loss to 4 decimals, identical replicas). */
TEST(tdistrun_train_gpt_resume_2_ranks_under_join, 150)
{
    run_t full, part, rest;
    stop_and_resume("2", "7", &full, &part, &rest);
    ASSERT_CONTAINS(part.out, "[rank 1] checkpoint: iteration 7 written to ");
    ASSERT_CONTAINS(part.out, " by rank 1 (1 ranks active)");
    double a = final_value(full.out, "final val_loss="), b = final_value(rest.out, "final val_loss=");
    if (!(a - b < 5e-5 && b - a < 5e-5))
        FAIL("resumed under Join ends at val_loss %.4f, uninterrupted %.4f", b, a);
    ASSERT_CONTAINS(strstr(rest.out, "final val_loss="), "params_identical=yes\n");
    run_free(&full);
    run_free(&part);
    run_free(&rest);
}

/* The first and the final validation loss of a run; it must learn and end
 * with identical replicas. Returns the ratio of its bytes per iteration to
 * DDP's f32 gradients. */
static double check_learns(const run_t *r, const char *what)
{
    const char *v0 = strstr(r->out, "[rank 0] val_loss at iteration 0: ");
    if (!v0) FAIL("%s: no initial validation loss:\n%s", what, r->out);
    double first = atof(v0 + strlen("[rank 0] val_loss at iteration 0: "));
    double last = final_value(r->out, "final val_loss=");
    if (!(last < first - 0.5)) FAIL("%s: validation loss %.4f -> %.4f", what, first, last);
    ASSERT_CONTAINS(strstr(r->out, "final val_loss="), "params_identical=yes\n");
    const char *c = strstr(r->out, "[rank 0] comm (rank 0): ");
    const char *o = c ? strstr(c, " per iteration (") : NULL;
    if (!o) FAIL("%s: no comm line:\n%s", what, r->out);
    return atof(o + strlen(" per iteration ("));
}

/* ZeRO shards AdamW's state, and the arithmetic is the same: the replicas
 * end bitwise where the default run's do (under Join a joined rank steps
 * its shard from the active ranks' clipped gradients at the iteration's
 * learning rate), with twice DDP's bytes (the parameters come back from
 * their owners after every step); also when checkpoints split the rounds'
 * Joins. */
TEST(tdistrun_train_gpt_zero, 150)
{
    run_t d, z;
    run_gpt("2", NULL, NULL, NULL, "gpt_ddp", &d);
    run_gpt("2", "--zero", NULL, NULL, "gpt_zero", &z);
    ASSERT_CONTAINS(z.out, "[rank 0] zero: AdamW state sharded over 2 ranks");
    double ratio = check_learns(&z, "--zero");
    if (!(ratio > 1.5)) FAIL("--zero: %.3f of DDP's bytes, want 2 (gradients + parameters)", ratio);
    same_hash(&d, &z, "--zero against DDP");
    /* checkpoints every 5 iterations end the rounds' Joins there: the
     * numbers stay the same */
    run_t c;
    char ckpt[512];
    snprintf(ckpt, sizeof ckpt, "%s", tmp_path("zero_every.ckpt"));
    const char *argv[] = {TDISTRUN, "--nproc-per-node", "2", GPT, corpus(), SMALL, "--steps", "24",
                          "--round", "8", "--sample", "40", "--zero", "--ckpt", ckpt,
                          "--ckpt-every", "5", NULL};
    run(argv, 100, "gpt_zero_ckpt", &c);
    if (!c.exited || c.code != 0) FAIL("--zero --ckpt-every 5: exit %d\n%s", c.code, c.err);
    ASSERT_CONTAINS(c.out, "[rank 0] checkpoint: iteration 15 written to ");
    same_hash(&d, &c, "--zero --ckpt-every 5 against DDP");
    run_free(&d);
    run_free(&z);
    run_free(&c);
}

/* --zero's checkpoint (every rank's shard, gathered) after iteration 7,
 * where rank 0 has joined: the resumed run ends with bitwise the
 * uninterrupted one's parameters. A --zero checkpoint is refused without
 * --zero. */
TEST(tdistrun_train_gpt_zero_resume_under_join, 150)
{
    run_t full, part, rest, bad;
    stop_and_resume_mode("2", "7", "--zero", &full, &part, &rest);
    ASSERT_CONTAINS(part.out, "[rank 0] checkpoint: iteration 7 written to ");
    ASSERT_CONTAINS(part.out, "(ZeRO: the 2 ranks' shards gathered)");
    same_hash(&full, &rest, "--zero, resumed");
    ASSERT_CONTAINS(strstr(rest.out, "final val_loss="), "params_identical=yes\n");
    const char *argv[] = {TDISTRUN, "--nproc-per-node", "2", GPT, corpus(), SMALL, "--steps", "24",
                          "--round", "8", "--resume", "--ckpt", tmp_path("gpt.ckpt"), NULL};
    run(argv, 100, "resumed_without_zero", &bad);
    if (!bad.exited || bad.code == 0) FAIL("resumed without --zero: exit %d, want a failure", bad.code);
    ASSERT_CONTAINS(bad.err, "was written with --zero");
    run_free(&full);
    run_free(&part);
    run_free(&rest);
    run_free(&bad);
}

/* Post-local SGD (gradients averaged in the first round, then parameters
 * every 4 steps) and DiLoCo (an outer step every 4 inner steps, f32 and
 * int8): each learns, sends fewer bytes than DDP, and the replicas are
 * identical after the last synchronisation. */
TEST(tdistrun_train_gpt_local_sgd_and_diloco, 150)
{
    static const char *const opt[] = {"--local-sgd", "--diloco", "--diloco"};
    static const char *const val[] = {"4", "4", "4:int8"};
    static const double most[] = {0.75, 0.5, 0.2};
    for (int i = 0; i < 3; i++) {
        run_t r;
        char tag[32];
        snprintf(tag, sizeof tag, "gpt_avg%d", i);
        run_gpt("2", opt[i], val[i], NULL, tag, &r);
        ASSERT_CONTAINS(r.out, i == 0 ? "[rank 0] local-sgd: gradients averaged for the first 8"
                                      : "[rank 0] diloco: 4 inner AdamW steps per outer");
        double ratio = check_learns(&r, opt[i]);
        if (!(ratio > 0 && ratio < most[i]))
            FAIL("%s %s: %.3f of DDP's bytes, want below %.2f", opt[i], val[i], ratio, most[i]);
        run_free(&r);
    }
}

TEST(train_gpt_refuses_bad_options, 20)
{
    static const char *const opts[][3] = {
        {"--zero", "--diloco", "4"},   {"--diloco", "0", NULL},
        {"--diloco", "4:fp8", NULL},   {"--local-sgd", "2", "--ckpt-every"},
        {"--local-sgd", "2", "--hook"}, {"--hook", "fp32", NULL}};
    static const char *const want[] = {"exclude each other", "needs a period",
                                       "needs a period", "not available with --local-sgd",
                                       "not with --local-sgd", "bad --hook"};
    for (int i = 0; i < 6; i++) {
        const char *tail = i == 3 ? "4" : i == 4 ? "bf16" : NULL;
        const char *argv[] = {GPT, corpus(), opts[i][0], opts[i][1], opts[i][2], tail, NULL};
        run_t r;
        run(argv, 10, "refused", &r);
        if (!r.exited || r.code != 2) FAIL("%s: exit %d, want 2\n%s", opts[i][0], r.code, r.err);
        ASSERT_CONTAINS(r.err, want[i]);
        run_free(&r);
    }
}
