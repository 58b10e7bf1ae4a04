/*
 * pg/group.c — creating and destroying process groups.
 *
 * A group has a uid ("world", or "<parent uid>.<n>" with n the parent's
 * creation counter — the same on every rank because creation is
 * collective; split groups add ".<color>"), and two TCP meshes over its
 * ranks: one for collectives (driven by the engine thread) and one for
 * send/recv (driven by the p2p thread), so point-to-point bytes never
 * interleave with collective bytes.
 *
 * Set-up through the world's store (keys under the world store's view):
 *   pg/<uid>/addr/<rank>   collective mesh address of each group rank
 *   pg/<uid>/p2p/<rank>    p2p mesh address
 *   pg/<uid>/list/<prank>  new_group: the member list each member was given
 *   pg/<uid>/failure       the group's first failure (engine.c)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "init/internal.h" /* tdist__world_bind_addr (pick_bind) */
#include "pg/internal.h"
#include "tdist/init.h"
#include "tdist/store.h"

/* A new group's deadlines. */
typedef struct limits {
    int64_t timeout_ms;     /* each collective's, by default */
    int64_t setup_ms;       /* the set-up's, as a timeout (what subgroups inherit) */
    int64_t setup_deadline; /* the set-up's, tdist__now_ms clock */
} limits_t;

/* The limits of a group created now: timeout the collectives' default;
 * opts (may be NULL) and, without them, inherited (a parent's set-up
 * timeout; 0: none, the world's) give the set-up's. fn names the call. A
 * malformed TDIST_SETUP_TIMEOUT_MS fails every creation (as a malformed
 * TDIST_TIMEOUT_MS fails tdist_init): a deadline other than the one asked
 * for is worse than an error. */
static tdist_status_t make_limits(const tdist_pg_opts_t *opts, int64_t timeout,
                                  int64_t inherited, const char *fn, limits_t *out)
{
    int64_t setup = 0, env = 0;
    if (tdist__env_int("TDIST_SETUP_TIMEOUT_MS", 1, INT64_MAX / 2, &env) == TDIST_ERR_INVALID_ARG)
        return tdist__error_context(TDIST_ERR_INVALID_ARG, "%s", fn);
    if (opts) {
        if (opts->setup_timeout_ms < 0)
            return tdist__error(TDIST_ERR_INVALID_ARG,
                                "%s: opts.setup_timeout_ms must be >= 0 (got %lld)", fn,
                                (long long)opts->setup_timeout_ms);
        setup = opts->setup_timeout_ms;
    } else {
        setup = inherited > 0 ? inherited : env;
    }
    out->timeout_ms = timeout;
    out->setup_ms = setup > 0 ? setup : timeout;
    out->setup_deadline = tdist__deadline_ms(out->setup_ms);
    return TDIST_OK;
}

/* TDIST_SETUP_TIMEOUT_MS, else 0 (the group's timeout). A malformed value
 * is ignored here and refused by group creation (make_limits). */
static int64_t env_setup_timeout(void)
{
    const char *e = getenv("TDIST_SETUP_TIMEOUT_MS");
    int64_t v = 0;
    if (!e || tdist__parse_int(e, 1, INT64_MAX / 2, &v) != 0) v = 0;
    return v;
}

void tdist_pg_opts_init(tdist_pg_opts_t *opts)
{
    if (!opts) return;
    memset(opts, 0, sizeof *opts);
    opts->timeout_ms = tdist__default_timeout_ms(TDIST_PG_DEFAULT_TIMEOUT_MS);
    opts->setup_timeout_ms = env_setup_timeout();
}

void tdist_coll_opts_init(tdist_coll_opts_t *opts)
{
    if (!opts) return;
    memset(opts, 0, sizeof *opts);
    opts->timeout_ms = -1;
    opts->premul_factor = 1.0;
}

int tdist_pg_rank(const tdist_pg_t *pg) { return pg ? pg->rank : -1; }
int tdist_pg_size(const tdist_pg_t *pg) { return pg ? pg->size : -1; }
const char *tdist_pg_name(const tdist_pg_t *pg) { return pg ? pg->name : NULL; }

int tdist_pg_world_rank(const tdist_pg_t *pg, int r)
{
    if (!pg || r < 0 || r >= pg->size) return -1;
    return pg->wranks[r];
}

bool tdist_pg_shared_memory(const tdist_pg_t *pg) { return pg && !pg->backend && pg->shm; }

tdist_status_t tdist_pg_error(const tdist_pg_t *pg, char *buf, size_t n)
{
    if (!pg) return tdist__error(TDIST_ERR_INVALID_ARG, "tdist_pg_error: pg is NULL");
    tdist_pg_t *g = (tdist_pg_t *)pg;
    pthread_mutex_lock(&g->mu);
    tdist_status_t st = g->err;
    const char *m = g->errmsg;
    if (st == TDIST_OK && g->p2p.err != TDIST_OK) {
        st = g->p2p.err;
        m = g->p2p.errmsg;
    }
    if (st == TDIST_OK && atomic_load(&g->aborted)) {
        st = TDIST_ERR_ABORTED;
        m = "the group was aborted";
    }
    if (buf && n) snprintf(buf, n, "%s", st == TDIST_OK || !m ? "" : m);
    pthread_mutex_unlock(&g->mu);
    return st;
}

tdist_status_t tdist_pg_abort(tdist_pg_t *pg)
{
    if (!pg) return tdist__error(TDIST_ERR_INVALID_ARG, "tdist_pg_abort: pg is NULL");
    tdist__pg_hier_abort(pg);
    pthread_mutex_lock(&pg->mu);
    atomic_store(&pg->aborted, true);
    if (pg->tp) tdist__tp_abort(pg->tp);
    if (pg->p2p_tp) tdist__tp_abort(pg->p2p_tp);
    pthread_cond_broadcast(&pg->cv);
    pthread_cond_broadcast(&pg->p2p.cv);
    pthread_mutex_unlock(&pg->mu);
    return TDIST_OK;
}

static void pg_free(tdist_pg_t *pg)
{
    if (!pg) return;
    if (pg->backend) {
        if (pg->backend->holds_memory(pg->be)) { /* pending requests may write these */
            pg->chk.mine = NULL;
            pg->chk.theirs = NULL;
        }
        pg->backend->destroy(pg->be);
    }
    tdist__pg_hier_free(pg);
    tdist__shmc_destroy(pg->shm);
    tdist__coll_group_free(&pg->coll);
    tdist__tp_destroy(pg->tp);
    tdist__tp_destroy(pg->p2p_tp);
    tdist__fr_close(pg->fr);
    pthread_mutex_destroy(&pg->mu);
    pthread_cond_destroy(&pg->cv);
    pthread_cond_destroy(&pg->p2p.cv);
    free(pg->wranks);
    free(pg->name);
    free(pg->uid);
    free(pg->bind_addr);
    free(pg->errmsg);
    free(pg->p2p.errmsg);
    free(pg->chk.mine);
    free(pg->chk.theirs);
    free(pg->chk.reqs);
    free(pg->chk.reqp);
    free(pg->p2p.send_seq);
    free(pg->p2p.recv_seq);
    free(pg);
}

void tdist_pg_destroy(tdist_pg_t *pg)
{
    if (!pg) return;
    tdist_pg_abort(pg);
    tdist__pg_stop_engine(pg);
    tdist__p2p_stop(pg);
    pg_free(pg);
}

/* ----------------------------------------------------------------- set-up */

static uint64_t make_tag(const char *uid, const char *what)
{
    const char *g = getenv("TDIST_RESTART_COUNT");
    uint64_t h = tdist__fnv1a(TDIST__FNV_INIT, uid, strlen(uid));
    h = tdist__fnv1a(h, "/", 1);
    if (g) h = tdist__fnv1a(h, g, strlen(g));
    h = tdist__fnv1a(h, "/", 1);
    return tdist__fnv1a(h, what, strlen(what));
}

/* The transport for a group of world: opts->transport, else TDIST_TRANSPORT,
 * else shared memory when every rank of the world is on this host and TCP
 * otherwise. "shm" across hosts is TDIST_ERR_NOT_SUPPORTED. */
static tdist_status_t pick_transport(tdist_world_t *world, const char *t, const char *fn,
                                     tdist__tp_kind_t *kind)
{
    bool one_host = tdist_world_local_size(world) == tdist_world_size(world);
    if (!t) t = getenv("TDIST_TRANSPORT");
    if (!t || !*t || strcmp(t, "auto") == 0) {
        *kind = one_host ? TDIST__TP_SHM : TDIST__TP_TCP;
        return TDIST_OK;
    }
    if (strcmp(t, "tcp") == 0) {
        *kind = TDIST__TP_TCP;
        return TDIST_OK;
    }
    if (strcmp(t, "shm") == 0) {
        if (!one_host)
            return tdist__error(TDIST_ERR_NOT_SUPPORTED,
                                "%s: transport \"shm\" needs every rank on one host; this world "
                                "spans hosts (use \"tcp\" or \"auto\")",
                                fn);
        *kind = TDIST__TP_SHM;
        return TDIST_OK;
    }
    return tdist__error(TDIST_ERR_INVALID_ARG,
                        "%s: unknown transport \"%s\" (TDIST_TRANSPORT or opts.transport: "
                        "\"auto\", \"shm\" or \"tcp\")",
                        fn, t);
}

/* Wait for n keys with a deadline; on timeout name the group ranks whose
 * key is missing. */
static tdist_status_t wait_keys(tdist_pg_t *pg, char **keys, int n, int64_t deadline_ms,
                                const char *what)
{
    int64_t left = deadline_ms == INT64_MAX ? -1 : deadline_ms - tdist__now_ms();
    if (left == 0) left = 1;
    if (left < -1) left = 1;
    tdist_status_t st = tdist_store_wait(pg->store, (const char *const *)keys, (size_t)n, left);
    if (st == TDIST_OK) return TDIST_OK;
    if (st != TDIST_ERR_TIMEOUT)
        return tdist__error_context(st, "group %s: waiting for the %s of every rank", pg->name, what);
    char list[400] = "", why[600];
    snprintf(why, sizeof why, "%s", tdist_last_error());
    int missing = 0;
    for (int r = 0; r < n; r++) {
        bool ok = false;
        const char *k = keys[r];
        if (tdist_store_check(pg->store, &k, 1, &ok) != TDIST_OK)
            return tdist__error(TDIST_ERR_TIMEOUT,
                                "group %s: rank %d: set-up timed out after %lld ms (the set-up "
                                "deadline): no answer from the store waiting for the %s of every "
                                "rank: %s",
                                pg->name, pg->rank, (long long)pg->setup_timeout_ms, what, why);
        if (ok) continue;
        size_t l = strlen(list);
        if (l < sizeof list - 16) snprintf(list + l, sizeof list - l, "%s%d", missing ? ", " : "", r);
        missing++;
    }
    return tdist__error(TDIST_ERR_TIMEOUT,
                        "group %s: rank %d: set-up timed out after %lld ms (the set-up "
                        "deadline): no %s from group rank%s %s (did they create the group?)",
                        pg->name, pg->rank, (long long)pg->setup_timeout_ms, what,
                        missing == 1 ? "" : "s", list);
}

static tdist_status_t exchange_and_connect(tdist_pg_t *pg, tdist__tp_t *tp, const char *kind,
                                           int64_t deadline_ms)
{
    int n = pg->size;
    char **keys = calloc((size_t)n, sizeof *keys);
    void **vals = calloc((size_t)n, sizeof *vals);
    size_t *lens = calloc((size_t)n, sizeof *lens);
    char **addrs = calloc((size_t)n, sizeof *addrs);
    tdist_status_t st = TDIST_OK;
    if (!keys || !vals || !lens || !addrs) {
        st = tdist__error(TDIST_ERR_NO_MEMORY, "group %s: out of memory", pg->name);
        goto out;
    }
    for (int r = 0; r < n; r++) {
        keys[r] = tdist__asprintf("pg/%s/%s/%d", pg->uid, kind, r);
        if (!keys[r]) {
            st = tdist__error(TDIST_ERR_NO_MEMORY, "group %s: out of memory", pg->name);
            goto out;
        }
    }
    const char *me = tdist__tp_address(tp);
    TDIST_CHECK_GOTO(tdist_store_set(pg->store, keys[pg->rank], me, strlen(me)), st, out);
    TDIST_CHECK_GOTO(wait_keys(pg, keys, n, deadline_ms, "transport address"), st, out);
    TDIST_CHECK_GOTO(tdist_store_multi_get(pg->store, (const char *const *)keys, (size_t)n, vals,
                                           lens),
                     st, out);
    for (int r = 0; r < n; r++) {
        addrs[r] = malloc(lens[r] + 1);
        if (!addrs[r]) {
            st = tdist__error(TDIST_ERR_NO_MEMORY, "group %s: out of memory", pg->name);
            goto out;
        }
        memcpy(addrs[r], vals[r], lens[r]);
        addrs[r][lens[r]] = '\0';
    }
    st = tdist__tp_connect(tp, (const char *const *)addrs, deadline_ms);
    if (st != TDIST_OK)
        tdist__error_context(st, "group %s (%s mesh)", pg->name,
                             strcmp(kind, "p2p") == 0 ? "p2p" : "collective");
out:
    for (int r = 0; r < n; r++) {
        if (keys) free(keys[r]);
        if (vals) free(vals[r]);
        if (addrs) free(addrs[r]);
    }
    free(keys);
    free(vals);
    free(lens);
    free(addrs);
    return st;
}

/* A new group's part every backend shares: the struct, its locks, names,
 * fingerprint scratch, p2p sequences and coll/'s state (TDIST_ALGO_ALLREDUCE
 * and TDIST_CHECK_FINGERPRINT are read here, once). wranks is taken over. */
static tdist_status_t pg_alloc(tdist_world_t *world, tdist_store_t *store, int rank, int size,
                               int *wranks, const char *uid, const char *name,
                               const limits_t *lim, tdist_pg_t **out)
{
    tdist_pg_t *pg = calloc(1, sizeof *pg);
    if (!pg) {
        free(wranks);
        return tdist__error(TDIST_ERR_NO_MEMORY, "group %s: out of memory", name);
    }
    pg->chk.have = -1;
    pthread_mutex_init(&pg->mu, NULL);
    pthread_cond_init(&pg->cv, NULL);
    pthread_cond_init(&pg->p2p.cv, NULL);
    pg->world = world;
    pg->store = store;
    pg->rank = rank;
    pg->size = size;
    pg->wranks = wranks;
    pg->uid = tdist__strdup(uid);
    pg->name = tdist__strdup(name);
    pg->timeout_ms = lim->timeout_ms;
    pg->setup_timeout_ms = lim->setup_ms;
    pg->uid_hash = tdist__fnv1a(TDIST__FNV_INIT, uid, strlen(uid));
    int64_t chk = 1;
    if (tdist__env_int("TDIST_CHECK_FINGERPRINT", 0, 1, &chk) == TDIST_ERR_INVALID_ARG) chk = 1;
    tdist_clear_error();
    pg->check_fp = chk != 0;
    pg->chk.mine = calloc((size_t)size, sizeof *pg->chk.mine);
    pg->chk.theirs = calloc((size_t)size, sizeof *pg->chk.theirs);
    pg->chk.reqs = calloc((size_t)(2 * size), sizeof *pg->chk.reqs);
    pg->chk.reqp = calloc((size_t)(2 * size), sizeof *pg->chk.reqp);
    pg->p2p.send_seq = calloc((size_t)size, sizeof(uint64_t));
    pg->p2p.recv_seq = calloc((size_t)size, sizeof(uint64_t));
    tdist_status_t st = TDIST_OK;
    if (!pg->uid || !pg->name || !pg->chk.mine || !pg->chk.theirs || !pg->chk.reqs ||
        !pg->chk.reqp || !pg->p2p.send_seq || !pg->p2p.recv_seq) {
        st = tdist__error(TDIST_ERR_NO_MEMORY, "group %s: out of memory", name);
    } else if ((st = tdist__coll_group_init(&pg->coll, size)) != TDIST_OK) {
        tdist__error_context(st, "rank %d group %s", rank, name);
    }
    if (st != TDIST_OK) {
        pg_free(pg);
        return st;
    }
    *out = pg;
    return TDIST_OK;
}

/* A group on another backend over its state be (taken over). */
static tdist_status_t pg_build_backend(const tdist__backend_t *b, void *be, tdist_world_t *world,
                                       int rank, int size, int *wranks, const char *uid,
                                       const char *name, const limits_t *lim, tdist_pg_t **out)
{
    tdist_pg_t *pg = NULL;
    tdist_status_t st = pg_alloc(world, tdist_world_store(world), rank, size, wranks, uid, name,
                                 lim, &pg);
    if (st != TDIST_OK) {
        b->destroy(be);
        return st;
    }
    pg->backend = b;
    pg->be = be;
    tdist__pg_fr_open(pg);
    st = tdist__pg_start_engine(pg);
    if (st != TDIST_OK) {
        pg_free(pg);
        return st;
    }
    TDIST_LOGD("group %s: rank %d of %d on the %s backend", name, rank, size, b->name);
    *out = pg;
    return TDIST_OK;
}

/* Bound this thread's store calls by the set-up's deadline: a store host
 * that stopped answering, or a link to it that drops everything, must not
 * hold the set-up past it. The bound is SETUP_STORE_GRACE_MS later: a
 * bounded store call keeps 1 s of its bound for the reply, so a store wait
 * still gets all but 0.1 s of the deadline at the server, and a call that
 * gets no answer ends 0.9 s past the deadline at the latest. */
#define SETUP_STORE_GRACE_MS 900
static void bound_store_calls(int64_t deadline_ms)
{
    tdist_store_bound_thread(TDIST_MAX(deadline_ms + SETUP_STORE_GRACE_MS - tdist__now_ms(), 1));
}

/* The set-up's last step: one byte to and from every peer over the
 * collective mesh, once this rank's whole set-up (its subgroups included)
 * is done. Ranks finish connecting at different times (a host's leader
 * also sets up the subgroup across hosts; over a slow link that is seconds
 * later), and a rank that left early would count its first collective's
 * deadline from then: after this exchange every rank leaves within a round
 * trip of the others. Before the engine starts, so nothing else is on the
 * mesh. */
static tdist_status_t ready_exchange(tdist_pg_t *pg, int64_t deadline_ms)
{
    if (pg->size < 2) return TDIST_OK;
    uint8_t out = 1, *in = calloc((size_t)pg->size, 1);
    if (!in) return tdist__error(TDIST_ERR_NO_MEMORY, "group %s: out of memory", pg->name);
    size_t k = 0;
    tdist_status_t st = TDIST_OK;
    for (int p = 0; p < pg->size && st == TDIST_OK; p++) {
        if (p == pg->rank) continue;
        st = tdist__tp_post_send(pg->tp, &pg->chk.reqs[k], p, &out, 1);
        if (st == TDIST_OK) st = tdist__tp_post_recv(pg->tp, &pg->chk.reqs[k + 1], p, &in[p], 1);
        pg->chk.reqp[k] = &pg->chk.reqs[k];
        pg->chk.reqp[k + 1] = &pg->chk.reqs[k + 1];
        k += 2;
    }
    if (st == TDIST_OK) st = tdist__tp_wait(pg->tp, pg->chk.reqp, k, deadline_ms);
    free(in);
    if (st == TDIST_ERR_TIMEOUT)
        return tdist__error(st, "group %s: rank %d: set-up timed out after %lld ms (the set-up "
                            "deadline) waiting for the other ranks to finish theirs: %s",
                            pg->name, pg->rank, (long long)pg->setup_timeout_ms,
                            tdist_last_error());
    if (st != TDIST_OK) tdist__error_context(st, "group %s: rank %d: set-up", pg->name, pg->rank);
    return st;
}

/* A native group: allocate it and connect its meshes by lim's set-up
 * deadline. wranks is taken over. */
static tdist_status_t pg_build(tdist_world_t *world, tdist_store_t *store, int rank, int size,
                               int *wranks, const char *uid, const char *name,
                               const limits_t *lim, tdist__tp_kind_t kind, const char *bind_addr,
                               tdist_pg_t **out)
{
    tdist_pg_t *pg = NULL;
    TDIST_CHECK(pg_alloc(world, store, rank, size, wranks, uid, name, lim, &pg));
    pg->kind = kind;
    pg->bind_addr = tdist__strdup(bind_addr);
    tdist_status_t st = TDIST_OK;
    if (bind_addr && !pg->bind_addr) {
        st = tdist__error(TDIST_ERR_NO_MEMORY, "group %s: out of memory", name);
        goto fail;
    }
    bool shmc = kind == TDIST__TP_SHM && size > 1;
    int64_t deadline = lim->setup_deadline;
    bound_store_calls(deadline);
    tdist__tp_opts_t o = {.bind_addr = bind_addr, .tag = make_tag(uid, "coll"),
                          .shm_coll_bytes = shmc ? tdist__shmc_area_bytes() : 0};
    TDIST_CHECK_GOTO(tdist__tp_listen(kind, rank, size, &o, &pg->tp), st, fail);
    o.tag = make_tag(uid, "p2p");
    o.shm_coll_bytes = 0;
    TDIST_CHECK_GOTO(tdist__tp_listen(kind, rank, size, &o, &pg->p2p_tp), st, fail);
    TDIST_CHECK_GOTO(exchange_and_connect(pg, pg->tp, "addr", deadline), st, fail);
    TDIST_CHECK_GOTO(exchange_and_connect(pg, pg->p2p_tp, "p2p", deadline), st, fail);
    if (shmc) TDIST_CHECK_GOTO(tdist__shmc_create(pg->tp, rank, size, &pg->shm), st, fail);
    TDIST_CHECK_GOTO(tdist__pg_hier_setup(pg, deadline), st, fail);
    tdist_store_bound_thread(-1); /* a subgroup's set-up (hier) lifted it too */
    TDIST_CHECK_GOTO(ready_exchange(pg, deadline), st, fail);
    tdist__pg_fr_open(pg);
    TDIST_CHECK_GOTO(tdist__pg_start_engine(pg), st, fail);
    *out = pg;
    return TDIST_OK;
fail:
    tdist_store_bound_thread(-1);
    pg_free(pg);
    return st;
}

static tdist_status_t pick_bind(tdist_world_t *world, const tdist_pg_opts_t *opts,
                                const char *inherited, const char **bind)
{
    if (opts && opts->bind_addr) {
        *bind = opts->bind_addr;
        return TDIST_OK;
    }
    if (inherited) {
        *bind = inherited;
        return TDIST_OK;
    }
    if (tdist_world_local_size(world) == tdist_world_size(world)) {
        *bind = "127.0.0.1";
        return TDIST_OK;
    }
    /* several hosts: TDIST_SOCKET_IFNAME, else the interface that reaches
     * the store (init/iface.c, docs/multihost.md) */
    return tdist__world_bind_addr(world, bind);
}

tdist_status_t tdist_pg_create_world(tdist_world_t *world, const tdist_pg_opts_t *opts,
                                     tdist_pg_t **out)
{
    static const char *fn = "tdist_pg_create_world";
    TDIST_ARG_CHECK(world != NULL, fn);
    TDIST_ARG_CHECK(out != NULL, fn);
    if (opts && opts->timeout_ms <= 0)
        return tdist__error(TDIST_ERR_INVALID_ARG, "%s: opts.timeout_ms must be > 0 (got %lld)",
                            fn, (long long)opts->timeout_ms);
    limits_t lim;
    TDIST_CHECK(make_limits(opts, opts ? opts->timeout_ms
                                       : tdist__default_timeout_ms(TDIST_PG_DEFAULT_TIMEOUT_MS),
                            0, fn, &lim));
    const tdist__backend_t *backend = NULL;
    TDIST_CHECK(tdist__backend_for_world(world, opts, &backend));
    tdist__tp_kind_t kind = TDIST__TP_SHM;
    if (!backend) TDIST_CHECK(pick_transport(world, opts ? opts->transport : NULL, fn, &kind));
    const char *bind = NULL;
    if (!backend && kind == TDIST__TP_TCP) TDIST_CHECK(pick_bind(world, opts, NULL, &bind));
    int size = tdist_world_size(world), rank = tdist_world_rank(world);
    tdist_store_t *store = tdist_world_store(world);
    if (size < 1 || rank < 0 || !store)
        return tdist__error(TDIST_ERR_INVALID_ARG, "%s: world has no rank/size/store", fn);
    int *wranks = malloc((size_t)size * sizeof *wranks);
    if (!wranks) return tdist__error(TDIST_ERR_NO_MEMORY, "%s: out of memory", fn);
    for (int r = 0; r < size; r++) wranks[r] = r;
    const char *name = opts && opts->name ? opts->name : "world";
    /* Every rank creates its world groups in the same order (collective),
     * so the n-th creation on this world gets the same uid everywhere; a
     * second world group never reads the first one's keys. */
    int k = tdist__world_next_group(world);
    char uid[32];
    if (k == 0)
        snprintf(uid, sizeof uid, "world");
    else
        snprintf(uid, sizeof uid, "world~%d", k);
    tdist_status_t st;
    if (backend) {
        void *be = NULL;
        int brank = rank, bsize = size;
        st = backend->create_world(world, &be, &brank, &bsize);
        if (st == TDIST_OK)
            st = pg_build_backend(backend, be, world, brank, bsize, wranks, uid, name, &lim, out);
        else
            free(wranks);
    } else {
        st = pg_build(world, store, rank, size, wranks, uid, name, &lim, kind, bind, out);
    }
    if (st != TDIST_OK) tdist__error_context(st, "%s: rank %d", fn, rank);
    return st;
}

/* Members of a subgroup (parent ranks, in subgroup order) -> group, set
 * up by lim's deadline. */
static tdist_status_t make_sub(tdist_pg_t *parent, const int *ranks, int n, int me,
                               const char *uid, const char *defname, const tdist_pg_opts_t *opts,
                               const limits_t *lim, tdist__tp_kind_t kind, const char *bind,
                               tdist_pg_t **out)
{
    int *wranks = malloc((size_t)n * sizeof *wranks);
    if (!wranks) return tdist__error(TDIST_ERR_NO_MEMORY, "group %s: out of memory", defname);
    for (int i = 0; i < n; i++) wranks[i] = parent->wranks[ranks[i]];
    const char *name = opts && opts->name ? opts->name : defname;
    if (parent->backend) { /* the subgroup keeps its parent's backend */
        void *be = NULL;
        /* the tag tells apart creations on the same parent (same count on every rank) */
        tdist_status_t st = parent->backend->create_sub(parent->be, ranks, n,
                                                        (parent->n_children - 1) & 0x7fff, &be);
        if (st != TDIST_OK) {
            free(wranks);
            return st;
        }
        return pg_build_backend(parent->backend, be, parent->world, me, n, wranks, uid, name,
                                lim, out);
    }
    return pg_build(parent->world, parent->store, me, n, wranks, uid, name, lim, kind, bind, out);
}

/* A subgroup's limits: opts' (NULL: the parent's), its set-up counted
 * from now. */
static tdist_status_t sub_limits(const tdist_pg_t *parent, const tdist_pg_opts_t *opts,
                                 const char *fn, limits_t *lim)
{
    return make_limits(opts, opts ? opts->timeout_ms : parent->timeout_ms,
                       parent->setup_timeout_ms, fn, lim);
}

tdist_status_t tdist__pg_build_sub(tdist_pg_t *parent, const int *members, int n, int me,
                                   const char *uid, const char *name, tdist__tp_kind_t kind,
                                   int64_t deadline_ms, tdist_pg_t **out)
{
    const char *bind = kind == TDIST__TP_TCP ? parent->bind_addr : NULL;
    limits_t lim = {.timeout_ms = parent->timeout_ms, .setup_ms = parent->setup_timeout_ms,
                    .setup_deadline = deadline_ms};
    tdist_status_t st = make_sub(parent, members, n, me, uid, name, NULL, &lim, kind, bind, out);
    if (st != TDIST_OK)
        tdist__error_context(st, "group %s: rank %d: internal subgroup %s", parent->name,
                             parent->rank, name);
    return st;
}

static tdist_status_t sub_common_checks(tdist_pg_t *parent, const tdist_pg_opts_t *opts,
                                        const char *fn, tdist__tp_kind_t *kind, const char **bind)
{
    if (opts && opts->timeout_ms <= 0)
        return tdist__error(TDIST_ERR_INVALID_ARG, "%s: opts.timeout_ms must be > 0 (got %lld)",
                            fn, (long long)opts->timeout_ms);
    /* a subgroup keeps its parent's transport unless opts name one */
    *kind = parent->kind;
    if (opts && opts->transport)
        TDIST_CHECK(pick_transport(parent->world, opts->transport, fn, kind));
    *bind = NULL;
    if (*kind == TDIST__TP_TCP && !parent->backend)
        TDIST_CHECK(pick_bind(parent->world, opts, parent->bind_addr, bind));
    char *why = NULL;
    tdist_status_t st = tdist__pg_sticky(parent, &why);
    if (st != TDIST_OK) {
        tdist__error(st, "%s: parent group %s failed earlier: %s", fn, parent->name,
                     why ? why : "");
        free(why);
        return st;
    }
    if (atomic_load(&parent->aborted))
        return tdist__error(TDIST_ERR_ABORTED, "%s: parent group %s was aborted", fn, parent->name);
    return TDIST_OK;
}

/* new_group's list: every rank in [0, parent size), none twice; *me =
 * this rank's index in it, -1 if it is not a member. */
static tdist_status_t check_member_list(const tdist_pg_t *parent, const int *ranks, int n,
                                        const char *fn, int *me)
{
    if (n < 1 || n > parent->size)
        return tdist__error(TDIST_ERR_INVALID_ARG, "%s: n = %d, must be in [1, %d] (group %s)", fn,
                            n, parent->size, parent->name);
    *me = -1;
    for (int i = 0; i < n; i++) {
        if (ranks[i] < 0 || ranks[i] >= parent->size)
            return tdist__error(TDIST_ERR_INVALID_ARG,
                                "%s: ranks[%d] = %d is not a rank of group %s (size %d)", fn, i,
                                ranks[i], parent->name, parent->size);
        for (int j = 0; j < i; j++)
            if (ranks[j] == ranks[i])
                return tdist__error(TDIST_ERR_INVALID_ARG, "%s: rank %d listed twice (ranks[%d], ranks[%d])",
                                    fn, ranks[i], j, i);
        if (ranks[i] == parent->rank) *me = i;
    }
    return TDIST_OK;
}

/* The members the store did not hear from ("1, 3"), after a timeout. */
static void missing_members(tdist_store_t *store, char *const *keys, const int *ranks, int n,
                            char *miss, size_t cap, int *count)
{
    miss[0] = '\0';
    *count = 0;
    for (int i = 0; i < n; i++) {
        bool ok = false;
        const char *k = keys[i];
        if (tdist_store_check(store, &k, 1, &ok) == TDIST_OK && ok) continue;
        size_t l = strlen(miss);
        if (l < cap - 16) snprintf(miss + l, cap - l, "%s%d", *count ? ", " : "", ranks[i]);
        (*count)++;
    }
}

/* Every member publishes the list it was given (list, len bytes) under
 * keys[me], waits for every member's, and checks they are all the same:
 * TIMEOUT naming the members that did not come, MISMATCH naming two that
 * were given different lists. vals/lens: n entries of scratch (filled). */
static tdist_status_t agree_member_list(tdist_pg_t *parent, char *const *keys, const int *ranks,
                                        int n, int me, const char *list, size_t len,
                                        const limits_t *lim, const char *fn, const char *name,
                                        void **vals, size_t *lens)
{
    tdist_status_t st = tdist_store_set(parent->store, keys[me], list, len);
    if (st != TDIST_OK) return tdist__error_context(st, "%s: group %s", fn, name);
    st = tdist_store_wait(parent->store, (const char *const *)keys, (size_t)n,
                          TDIST_MAX(lim->setup_deadline - tdist__now_ms(), 1));
    if (st == TDIST_ERR_TIMEOUT) {
        char miss[300];
        int m = 0;
        missing_members(parent->store, keys, ranks, n, miss, sizeof miss, &m);
        return tdist__error(TDIST_ERR_TIMEOUT,
                            "%s: group %s: rank %d of %s: parent rank%s %s did not call "
                            "tdist_pg_new_group within %lld ms (the set-up deadline)",
                            fn, name, parent->rank, parent->name, m == 1 ? "" : "s", miss,
                            (long long)lim->setup_ms);
    }
    if (st != TDIST_OK) return tdist__error_context(st, "%s: group %s", fn, name);
    st = tdist_store_multi_get(parent->store, (const char *const *)keys, (size_t)n, vals, lens);
    if (st != TDIST_OK) return tdist__error_context(st, "%s: group %s", fn, name);
    for (int i = 0; i < n; i++) {
        if (lens[i] == len && memcmp(vals[i], list, len) == 0) continue;
        return tdist__error(TDIST_ERR_MISMATCH,
                            "%s: group %s: parent rank %d was given ranks [%.*s] but parent "
                            "rank %d was given [%s]",
                            fn, name, ranks[i], (int)TDIST_MIN(lens[i], 200),
                            (const char *)vals[i], parent->rank, list);
    }
    return TDIST_OK;
}

tdist_status_t tdist_pg_new_group(tdist_pg_t *parent, const int *ranks, int n,
                                  const tdist_pg_opts_t *opts, tdist_pg_t **out)
{
    static const char *fn = "tdist_pg_new_group";
    TDIST_ARG_CHECK(parent != NULL, fn);
    TDIST_ARG_CHECK(out != NULL, fn);
    TDIST_ARG_CHECK(ranks != NULL, fn);
    int me = -1;
    TDIST_CHECK(check_member_list(parent, ranks, n, fn, &me));
    const char *bind = NULL;
    tdist__tp_kind_t kind;
    TDIST_CHECK(sub_common_checks(parent, opts, fn, &kind, &bind));
    limits_t lim;
    TDIST_CHECK(sub_limits(parent, opts, fn, &lim));
    int idx = parent->n_children++;
    if (me < 0) {
        *out = NULL;
        return TDIST_OK;
    }
    char uid[256], defname[256];
    snprintf(uid, sizeof uid, "%s.%d", parent->uid, idx);
    snprintf(defname, sizeof defname, "%s.%d", parent->name, idx);
    /* Every member checks that every member was given the same list. */
    size_t cap = (size_t)n * 12 + 1, len = 0;
    char *list = malloc(cap);
    char **keys = calloc((size_t)n, sizeof *keys);
    void **vals = calloc((size_t)n, sizeof *vals);
    size_t *lens = calloc((size_t)n, sizeof *lens);
    tdist_status_t st = TDIST_OK;
    if (!list || !keys || !vals || !lens) {
        st = tdist__error(TDIST_ERR_NO_MEMORY, "%s: out of memory", fn);
        goto out;
    }
    list[0] = '\0';
    for (int i = 0; i < n; i++) len += (size_t)snprintf(list + len, cap - len, "%s%d", i ? "," : "", ranks[i]);
    for (int i = 0; i < n; i++) {
        keys[i] = tdist__asprintf("pg/%s/list/%d", uid, ranks[i]);
        if (!keys[i]) {
            st = tdist__error(TDIST_ERR_NO_MEMORY, "%s: out of memory", fn);
            goto out;
        }
    }
    bound_store_calls(lim.setup_deadline);
    st = agree_member_list(parent, keys, ranks, n, me, list, len, &lim, fn, defname, vals, lens);
    tdist_store_bound_thread(-1);
    if (st == TDIST_OK) {
        st = make_sub(parent, ranks, n, me, uid, defname, opts, &lim, kind, bind, out);
        if (st != TDIST_OK) tdist__error_context(st, "%s", fn);
    }
out:
    for (int i = 0; i < n; i++) {
        if (keys) free(keys[i]);
        if (vals) free(vals[i]);
    }
    free(keys);
    free(vals);
    free(lens);
    free(list);
    return st;
}

tdist_status_t tdist_pg_split(tdist_pg_t *parent, int color, int key, const tdist_pg_opts_t *opts,
                              tdist_pg_t **out)
{
    static const char *fn = "tdist_pg_split";
    TDIST_ARG_CHECK(parent != NULL, fn);
    TDIST_ARG_CHECK(out != NULL, fn);
    const char *bind = NULL;
    tdist__tp_kind_t kind;
    TDIST_CHECK(sub_common_checks(parent, opts, fn, &kind, &bind));
    limits_t lim;
    TDIST_CHECK(sub_limits(parent, opts, fn, &lim));
    int n = parent->size;
    int32_t mine[2] = {color, key};
    int32_t *all = malloc((size_t)n * sizeof mine);
    int *members = malloc((size_t)n * sizeof *members);
    if (!all || !members) {
        free(all);
        free(members);
        return tdist__error(TDIST_ERR_NO_MEMORY, "%s: out of memory", fn);
    }
    tdist_status_t st = tdist_all_gather(parent, mine, all, 2, TDIST_I32, NULL, NULL);
    int idx = parent->n_children++;
    if (st != TDIST_OK) {
        tdist__error_context(st, "%s: exchanging (color, key)", fn);
        goto out;
    }
    if (color < 0) {
        *out = NULL;
        goto out;
    }
    int m = 0;
    for (int r = 0; r < n; r++)
        if (all[2 * r] == color) members[m++] = r;
    /* order by (key, parent rank): insertion sort, stable */
    for (int i = 1; i < m; i++) {
        int v = members[i], j = i - 1;
        while (j >= 0 && all[2 * members[j] + 1] > all[2 * v + 1]) {
            members[j + 1] = members[j];
            j--;
        }
        members[j + 1] = v;
    }
    int me = -1;
    for (int i = 0; i < m; i++)
        if (members[i] == parent->rank) me = i;
    char uid[256], defname[256];
    snprintf(uid, sizeof uid, "%s.%d.%d", parent->uid, idx, color);
    snprintf(defname, sizeof defname, "%s.%d.%d", parent->name, idx, color);
    lim.setup_deadline = tdist__deadline_ms(lim.setup_ms); /* from the end of the all_gather */
    st = make_sub(parent, members, m, me, uid, defname, opts, &lim, kind, bind, out);
    if (st != TDIST_OK) tdist__error_context(st, "%s", fn);
out:
    free(all);
    free(members);
    return st;
}
