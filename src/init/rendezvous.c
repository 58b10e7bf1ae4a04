/*
 * init/rendezvous.c — every rank registers in the store and waits for the
 * others, with a deadline; the protocol and its keys are described in
 * init/internal.h.
 *
 * Failures are posted to the "abort" key so that every waiting rank fails
 * at once with the same status and message (a duplicate rank or a world
 * size disagreement stops the whole world quickly, not at the deadline;
 * the first rank whose deadline passes posts the missing-rank list for
 * all). Every wait polls the store every TDIST__RDZV_POLL_MS and ends at
 * its deadline.
 */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "init/internal.h"

#define CLAIM_MAX 512   /* longest claim value we accept ("ws pid nonce host") */
#define MSG_MAX 1800    /* keep messages inside the 2 KiB last-error buffer */

/* One process's claim of a rank, parsed from "rank/<r>" or "dup/<r>". */
typedef struct claim {
    int world_size;
    long pid;
    char nonce[40];
    uint64_t netns;
    char host[CLAIM_MAX];
} claim_t;

static tdist_status_t ctx(const tdist__rdzv_t *r, tdist_status_t st)
{
    if (st == TDIST_OK) return st;
    return tdist__error_context(st, "rendezvous (rank %d of %d)", r->rank, r->world_size);
}

/* Copy a store value into a NUL-terminated buffer; -1 if too long. */
static int value_str(const void *v, size_t len, char *buf, size_t cap)
{
    if (len >= cap) return -1;
    memcpy(buf, v, len);
    buf[len] = '\0';
    return 0;
}

/* "<ws> <pid> <nonce> <netns> <host...>" -> claim. 0 on success. */
static int parse_claim(const void *v, size_t len, claim_t *c)
{
    char buf[CLAIM_MAX];
    if (value_str(v, len, buf, sizeof buf) != 0) return -1;
    int off = 0;
    if (sscanf(buf, "%d %ld %39s %" SCNx64 " %n", &c->world_size, &c->pid, c->nonce, &c->netns,
               &off) != 4 ||
        off <= 0)
        return -1;
    snprintf(c->host, sizeof c->host, "%s", buf + off);
    return 0;
}

/* A nonce unique to this process and call: two processes with the same
 * pid on different hosts (or one process registering twice) differ. */
static void make_nonce(char *buf, size_t n)
{
    static _Atomic uint64_t seq;
    uint64_t s = atomic_fetch_add(&seq, 1);
    snprintf(buf, n, "%" PRIx64 ".%" PRIx64, tdist__now_ns(), s);
}

/* Post st/msg as the world's abort reason unless one is posted already.
 * Errors are only logged: the caller is failing anyway. */
static void post_abort(tdist__rdzv_t *r, tdist_status_t st, const char *msg)
{
    char *val = tdist__asprintf("%d %s", (int)st, msg);
    if (!val) return;
    tdist_status_t pst =
        tdist_store_compare_set(r->store, "abort", NULL, 0, val, strlen(val), NULL, NULL);
    if (pst != TDIST_OK)
        TDIST_LOGW("rendezvous rank %d: could not post abort: %s", r->rank, tdist_last_error());
    free(val);
}

/* The abort is posted: fail with its status and message. If another
 * process claimed this rank (dup/<rank> exists), name both claims. */
static tdist_status_t fail_from_abort(tdist__rdzv_t *r, const char *mine)
{
    char key[64];
    snprintf(key, sizeof key, "dup/%d", r->rank);
    const char *keys[1] = {key};
    bool have_dup = false;
    if (tdist_store_check(r->store, keys, 1, &have_dup) == TDIST_OK && have_dup) {
        void *v = NULL;
        size_t len = 0;
        claim_t me, other;
        if (tdist_store_get(r->store, key, &v, &len) == TDIST_OK && parse_claim(v, len, &other) == 0 &&
            parse_claim(mine, strlen(mine), &me) == 0) {
            free(v);
            return tdist__error(TDIST_ERR_DUPLICATE,
                                "rendezvous: rank %d is claimed by two processes: pid %ld on host "
                                "\"%.200s\" and pid %ld on host \"%.200s\" (each process must have "
                                "its own RANK; a restarted job needs a new TDIST_RESTART_COUNT)",
                                r->rank, me.pid, me.host, other.pid, other.host);
        }
        free(v);
    }
    void *v = NULL;
    size_t len = 0;
    tdist_status_t st = tdist_store_get(r->store, "abort", &v, &len);
    if (st != TDIST_OK) return ctx(r, st);
    char buf[MSG_MAX + 32];
    int code = 0, off = 0;
    if (value_str(v, len, buf, sizeof buf) != 0 || sscanf(buf, "%d %n", &code, &off) != 1 || off <= 0 ||
        code >= 0) {
        free(v);
        return tdist__error(TDIST_ERR_REMOTE,
                            "rendezvous (rank %d of %d): another rank aborted the rendezvous "
                            "(unreadable reason)",
                            r->rank, r->world_size);
    }
    free(v);
    return tdist__error((tdist_status_t)code, "rendezvous (rank %d of %d) aborted: %s", r->rank,
                        r->world_size, buf + off);
}

/* Parse "joined" ("3,0,1,") into present[]; returns the number of distinct ranks. */
static int parse_joined(const char *s, bool *present, int ws)
{
    int count = 0;
    const char *p = s;
    while (*p) {
        char *end = NULL;
        long v = strtol(p, &end, 10);
        if (end == p) break;
        if (v >= 0 && v < ws && !present[v]) {
            present[v] = true;
            count++;
        }
        p = end;
        while (*p == ',') p++;
    }
    return count;
}

/* The ranks listed in "joined" of the rendezvous view store: present[r]
 * (ws entries, the caller's; cleared first) and *count of them ("joined"
 * missing: none). */
static tdist_status_t read_joined(tdist_store_t *store, int ws, bool *present, int *count)
{
    const char *keys[1] = {"joined"};
    bool exists = false;
    TDIST_CHECK(tdist_store_check(store, keys, 1, &exists));
    void *v = NULL;
    size_t len = 0;
    if (exists) TDIST_CHECK(tdist_store_get(store, "joined", &v, &len));
    char *s = malloc(len + 1);
    if (!s) {
        free(v);
        return tdist__error(TDIST_ERR_NO_MEMORY, "rendezvous: out of memory");
    }
    if (len) memcpy(s, v, len);
    s[len] = '\0';
    free(v);
    memset(present, 0, (size_t)ws * sizeof *present);
    *count = parse_joined(s, present, ws);
    free(s);
    return TDIST_OK;
}

int64_t tdist__rdzv_num_joined(tdist__rdzv_t *r)
{
    bool *present = calloc((size_t)r->world_size, sizeof *present);
    int n = 0;
    if (!present || read_joined(r->store, r->world_size, present, &n) != TDIST_OK) n = 0;
    free(present);
    return n;
}

/* The ranks that have not registered yet ("3, 5 ... and 12 more") into
 * list (cap bytes); *arrived = how many have. */
static tdist_status_t missing_ranks(tdist__rdzv_t *r, char *list, size_t cap, int *arrived)
{
    bool *present = calloc((size_t)r->world_size, sizeof *present);
    if (!present) return tdist__error(TDIST_ERR_NO_MEMORY, "rendezvous: out of memory");
    tdist_status_t st = read_joined(r->store, r->world_size, present, arrived);
    if (st != TDIST_OK) {
        free(present);
        return st;
    }
    size_t used = 0;
    int listed = 0, missing = r->world_size - *arrived;
    list[0] = '\0';
    for (int i = 0; i < r->world_size && used + 48 < cap; i++) {
        if (present[i]) continue;
        int w = snprintf(list + used, cap - used, "%s%d", listed ? ", " : "", i);
        if (w < 0) break;
        used += (size_t)w;
        listed++;
    }
    if (listed < missing) snprintf(list + used, cap - used, " ... and %d more", missing - listed);
    free(present);
    return TDIST_OK;
}

/* The deadline passed: post (or adopt) the timeout naming missing ranks. */
static tdist_status_t fail_timeout(tdist__rdzv_t *r, const char *mine)
{
    char list[1024];
    int arrived = 0;
    tdist_status_t st = missing_ranks(r, list, sizeof list, &arrived);
    if (st != TDIST_OK) return ctx(r, st);
    char msg[MSG_MAX];
    snprintf(msg, sizeof msg,
             "rendezvous timed out after %" PRId64 " ms: %d of %d ranks arrived; missing ranks: %s",
             r->timeout_ms, arrived, r->world_size, list);
    post_abort(r, TDIST_ERR_TIMEOUT, msg);
    /* If another failure was posted first, every rank reports that one. */
    void *v = NULL;
    size_t len = 0;
    char want[32];
    snprintf(want, sizeof want, "%d ", (int)TDIST_ERR_TIMEOUT);
    if (tdist_store_get(r->store, "abort", &v, &len) == TDIST_OK) {
        bool same = len >= strlen(want) && memcmp(v, want, strlen(want)) == 0;
        free(v);
        if (!same) return fail_from_abort(r, mine);
    }
    return tdist__error(TDIST_ERR_TIMEOUT, "%s", msg);
}

/* Everyone arrived: local rank and size from the host names and network
 * namespaces of all ranks. */
static tdist_status_t compute_local(tdist__rdzv_t *r)
{
    size_t n = (size_t)r->world_size;
    char **keys = calloc(n, sizeof *keys);
    void **vals = calloc(n, sizeof *vals);
    size_t *lens = calloc(n, sizeof *lens);
    claim_t *c = malloc(sizeof *c);
    tdist_status_t st = TDIST_OK;
    if (!keys || !vals || !lens || !c) {
        st = tdist__error(TDIST_ERR_NO_MEMORY, "rendezvous: out of memory for %zu ranks", n);
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        keys[i] = tdist__asprintf("rank/%zu", i);
        if (!keys[i]) {
            st = tdist__error(TDIST_ERR_NO_MEMORY, "rendezvous: out of memory");
            goto out;
        }
    }
    TDIST_CHECK_GOTO(tdist_store_multi_get(r->store, (const char *const *)keys, n, vals, lens), st, out);
    int local_rank = 0, local_size = 0;
    for (size_t i = 0; i < n; i++) {
        if (parse_claim(vals[i], lens[i], c) != 0) {
            st = tdist__error(TDIST_ERR_INTERNAL, "rendezvous: unreadable registration of rank %zu", i);
            goto out;
        }
        if (strcmp(c->host, r->host) != 0 || c->netns != r->netns) continue;
        if ((int)i < r->rank) local_rank++;
        local_size++;
    }
    r->local_rank = local_rank;
    r->local_size = local_size;
out:
    if (keys)
        for (size_t i = 0; i < n; i++) free(keys[i]);
    if (vals)
        for (size_t i = 0; i < n; i++) free(vals[i]);
    free(keys);
    free(vals);
    free(lens);
    free(c);
    return st;
}

/* Step 1 of the join: claim the rank; the first claim wins. A second
 * claimant records itself in dup/<rank> and posts the abort naming both. */
static tdist_status_t claim_rank(tdist__rdzv_t *r, const char *mine)
{
    void *cur = NULL;
    size_t cur_len = 0, mine_len = strlen(mine);
    char key[64];
    snprintf(key, sizeof key, "rank/%d", r->rank);
    tdist_status_t st = ctx(r, tdist_store_compare_set(r->store, key, NULL, 0, mine, mine_len, &cur,
                                                       &cur_len));
    if (st != TDIST_OK || (cur_len == mine_len && memcmp(cur, mine, mine_len) == 0)) {
        free(cur);
        return st;
    }
    claim_t first;
    int bad = parse_claim(cur, cur_len, &first);
    free(cur);
    if (bad != 0)
        return tdist__error(TDIST_ERR_DUPLICATE,
                            "rendezvous: rank %d is already claimed by another process (unreadable "
                            "registration)",
                            r->rank);
    snprintf(key, sizeof key, "dup/%d", r->rank);
    tdist_status_t dst = tdist_store_set(r->store, key, mine, mine_len);
    if (dst != TDIST_OK) TDIST_LOGW("rendezvous: could not record duplicate: %s", tdist_last_error());
    char msg[MSG_MAX];
    snprintf(msg, sizeof msg,
             "rank %d is claimed by two processes: pid %ld on host \"%.200s\" and pid %ld on host "
             "\"%.200s\" (each process must have its own RANK; a restarted job needs a "
             "new TDIST_RESTART_COUNT)",
             r->rank, first.pid, first.host, (long)getpid(), r->host);
    post_abort(r, TDIST_ERR_DUPLICATE, msg);
    return tdist__error(TDIST_ERR_DUPLICATE, "rendezvous: %s", msg);
}

/* Step 2: agree on the world size; the first registration sets it, a
 * different one posts the abort naming both ranks. */
static tdist_status_t agree_world_size(tdist__rdzv_t *r)
{
    void *cur = NULL;
    size_t cur_len = 0;
    char rec[CLAIM_MAX + 64], buf[CLAIM_MAX + 64];
    snprintf(rec, sizeof rec, "%d %d %ld %s", r->world_size, r->rank, (long)getpid(), r->host);
    tdist_status_t st = ctx(r, tdist_store_compare_set(r->store, "world_size", NULL, 0, rec,
                                                       strlen(rec), &cur, &cur_len));
    if (st != TDIST_OK) {
        free(cur);
        return st;
    }
    int ows = 0, orank = 0, off = 0;
    long opid = 0;
    int bad = value_str(cur, cur_len, buf, sizeof buf) != 0 ||
              sscanf(buf, "%d %d %ld %n", &ows, &orank, &opid, &off) != 3 || off <= 0;
    free(cur);
    if (bad) return tdist__error(TDIST_ERR_INTERNAL, "rendezvous: unreadable world_size record");
    if (ows == r->world_size) return TDIST_OK;
    char msg[MSG_MAX];
    snprintf(msg, sizeof msg,
             "world size mismatch: rank %d (pid %ld on host \"%.200s\") has world_size %d "
             "but rank %d (pid %ld on host \"%.200s\") has world_size %d",
             r->rank, (long)getpid(), r->host, r->world_size, orank, opid, buf + off, ows);
    post_abort(r, TDIST_ERR_MISMATCH, msg);
    return tdist__error(TDIST_ERR_MISMATCH, "rendezvous: %s", msg);
}

/* With TDIST_LOG=info: who is still missing, logged after 1, 2, 4, ... s
 * of waiting (at most a minute apart), so that a start that hangs says on
 * whom before the deadline. Errors only skip the line. */
static void log_progress(tdist__rdzv_t *r, int64_t waited_ms)
{
    char list[512];
    int arrived = 0;
    if (missing_ranks(r, list, sizeof list, &arrived) != TDIST_OK) return;
    TDIST_LOGI("rendezvous (rank %d of %d): %d of %d ranks registered after %" PRId64
               " s; waiting for rank%s %s", r->rank, r->world_size, arrived, r->world_size,
               waited_ms / 1000, r->world_size - arrived == 1 ? "" : "s", list);
}

/* Step 4: wait until every rank has arrived (arrived: the count when this
 * rank counted in), an abort is posted, or the deadline passes. */
static tdist_status_t wait_all(tdist__rdzv_t *r, const char *mine, int64_t arrived,
                               int64_t deadline_ms)
{
    const char *abort_key[1] = {"abort"};
    int64_t start = tdist__now_ms(), report_after = 1000;
    while (arrived < r->world_size) {
        bool aborted = false;
        TDIST_CHECK(ctx(r, tdist_store_check(r->store, abort_key, 1, &aborted)));
        if (aborted) return fail_from_abort(r, mine);
        int left = tdist__ms_left(deadline_ms);
        if (left <= 0) return fail_timeout(r, mine);
        int64_t waited = tdist__now_ms() - start;
        if (waited >= report_after) {
            if (tdist__log_on(TDIST_LOG_INFO)) log_progress(r, waited);
            report_after = TDIST_MIN(2 * report_after, report_after + 60000);
        }
        tdist__sleep_ms(TDIST_MIN(left, TDIST__RDZV_POLL_MS));
        TDIST_CHECK(ctx(r, tdist_store_add(r->store, "arrived", 0, &arrived)));
    }
    return TDIST_OK;
}

tdist_status_t tdist__rdzv_join(tdist__rdzv_t *r, int64_t deadline_ms)
{
    char nonce[40], mine[CLAIM_MAX + 64], joined[32];
    r->registered = false;
    make_nonce(nonce, sizeof nonce);
    snprintf(mine, sizeof mine, "%d %ld %s %" PRIx64 " %s", r->world_size, (long)getpid(), nonce,
             r->netns, r->host);
    TDIST_CHECK(claim_rank(r, mine));
    TDIST_CHECK(agree_world_size(r));

    /* 3. Count in. */
    snprintf(joined, sizeof joined, "%d,", r->rank);
    TDIST_CHECK(ctx(r, tdist_store_append(r->store, "joined", joined, strlen(joined))));
    r->registered = true;
    int64_t arrived = 0;
    TDIST_CHECK(ctx(r, tdist_store_add(r->store, "arrived", 1, &arrived)));

    TDIST_CHECK(wait_all(r, mine, arrived, deadline_ms));
    return ctx(r, compute_local(r));
}

/* Whether rank q is gone without leaving: its claim is on this host (same
 * name and network namespace) and its process no longer exists. */
static bool gone_here(const tdist__rdzv_t *r, int q)
{
    char key[64];
    snprintf(key, sizeof key, "rank/%d", q);
    const char *k = key;
    bool have = false;
    if (tdist_store_check(r->store, &k, 1, &have) != TDIST_OK || !have) return false;
    void *v = NULL;
    size_t len = 0;
    claim_t c;
    bool gone = false;
    if (tdist_store_get(r->store, key, &v, &len) == TDIST_OK && parse_claim(v, len, &c) == 0 &&
        c.netns == r->netns && strcmp(c.host, r->host) == 0 && c.pid > 0)
        gone = kill((pid_t)c.pid, 0) != 0 && errno == ESRCH;
    free(v);
    return gone;
}

/* Ranks that have left (their "left/<r>" key) or are gone from this host. */
static int64_t count_gone(const tdist__rdzv_t *r)
{
    int64_t n = 0;
    for (int q = 0; q < r->world_size; q++) {
        char key[64];
        snprintf(key, sizeof key, "left/%d", q);
        const char *k = key;
        bool left = false;
        if (tdist_store_check(r->store, &k, 1, &left) != TDIST_OK) return -1;
        if (left || gone_here(r, q)) n++;
    }
    return n;
}

void tdist__rdzv_leave(tdist__rdzv_t *r, int64_t wait_for, int64_t bound_ms, bool cleanup)
{
    int64_t n = 0;
    if (r->registered) {
        char key[64];
        snprintf(key, sizeof key, "left/%d", r->rank);
        if (tdist_store_set(r->store, key, "", 0) != TDIST_OK ||
            tdist_store_add(r->store, "left", 1, &n) != TDIST_OK) {
            TDIST_LOGW("rank %d: could not record leaving the job: %s", r->rank, tdist_last_error());
            return;
        }
        r->registered = false;
        if (cleanup && n == r->world_size) {
            /* Last to leave: remove the rendezvous keys (not the user's). */
            static const char *const fixed[] = {"world_size", "joined", "arrived", "left"};
            for (size_t i = 0; i < TDIST_ARRAY_SIZE(fixed); i++)
                (void)tdist_store_delete_key(r->store, fixed[i], NULL);
            for (int i = 0; i < r->world_size; i++) {
                snprintf(key, sizeof key, "rank/%d", i);
                (void)tdist_store_delete_key(r->store, key, NULL);
                snprintf(key, sizeof key, "left/%d", i);
                (void)tdist_store_delete_key(r->store, key, NULL);
            }
        }
    }
    if (wait_for <= 0) return;
    int64_t deadline = tdist__deadline_ms(bound_ms);
    for (int polls = 0;; polls++) {
        if (tdist_store_add(r->store, "left", 0, &n) != TDIST_OK) {
            TDIST_LOGW("rank %d: could not read how many ranks left: %s", r->rank, tdist_last_error());
            return;
        }
        if (n >= wait_for) return;
        /* every 100 ms: a rank of this host that died never leaves */
        if (polls % 10 == 9 && count_gone(r) >= wait_for) return;
        int left = tdist__ms_left(deadline);
        if (left <= 0) {
            TDIST_LOGW("rank %d: stopping the store after %" PRId64 " ms although only %" PRId64
                       " of %" PRId64 " ranks have left",
                       r->rank, bound_ms, n, wait_for);
            return;
        }
        tdist__sleep_ms(TDIST_MIN(left, TDIST__RDZV_POLL_MS));
    }
}

void tdist__rdzv_prefix(int64_t generation, char *buf, size_t cap)
{
    snprintf(buf, cap, "tdist/g%" PRId64 "/rdzv", generation);
}

tdist_status_t tdist__rdzv_peek(tdist_store_t *base, int64_t generation, int world_size,
                                bool *joined, int *n_joined, bool *aborted)
{
    char prefix[64];
    tdist__rdzv_prefix(generation, prefix, sizeof prefix);
    tdist_store_t *view = NULL;
    TDIST_CHECK(tdist_store_prefix_create(prefix, base, NULL, &view));
    const char *abort_key[1] = {"abort"};
    tdist_status_t st = tdist_store_check(view, abort_key, 1, aborted);
    if (st == TDIST_OK) st = read_joined(view, world_size, joined, n_joined);
    tdist_store_destroy(view);
    return st;
}
