/*
 * pg/hier.c — hierarchical collectives for a group that spans hosts.
 *
 * A TCP group whose ranks sit on several hosts, some with more than one
 * rank, gets two internal subgroups at creation:
 *   local  the group's ranks on this host, over shared memory (uid
 *          "<uid>/hl<h>", h = the host's index), when there are two or more;
 *   cross  the first rank of every host ("leaders"), over TCP ("<uid>/hx"),
 *          on leaders only.
 * Hosts are told apart by a host key — the host name (TDIST_HOSTNAME
 * overrides it, as for the world's co-location rule) and the network
 * namespace. Every rank publishes its
 * key under pg/<uid>/host/<rank>; every rank derives the same host indices
 * (in order of first appearance) and the same leaders.
 *
 * all_reduce (and each buffer of all_reduce_coalesced) from
 * TDIST_HIER_MIN_BYTES (default 32 KiB) up: reduce to the leader over
 * shared memory, all_reduce among leaders over TCP, broadcast from the
 * leader over shared memory. Broadcast: over shared memory to the root
 * host's leader, among leaders, then to every host's ranks. Only one copy
 * of the data crosses the network per host instead of one per rank, and
 * every rank ends with the same bits. The fingerprint exchange (rule 2)
 * still runs over the whole group's mesh first. TDIST_HIERARCHICAL=0 turns
 * it off.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "pg/internal.h"
#include "tdist/store.h"

#define HIER_KEY_MAX 300

static void host_key(char *buf, size_t n)
{
    char host[256] = "";
    const char *over = getenv("TDIST_HOSTNAME"); /* as init's co-location rule */
    if (over && *over)
        snprintf(host, sizeof host, "%s", over);
    else if (gethostname(host, sizeof host - 1) != 0)
        snprintf(host, sizeof host, "?");
    struct stat st;
    unsigned long long ns = stat("/proc/self/ns/net", &st) == 0 ? (unsigned long long)st.st_ino : 0;
    snprintf(buf, n, "host:%s/netns:%llu", host, ns);
}

static size_t min_bytes(void)
{
    int64_t v = 32 * 1024;
    if (tdist__env_int("TDIST_HIER_MIN_BYTES", 0, INT64_MAX / 2, &v) != TDIST_OK) v = 32 * 1024;
    tdist_clear_error();
    return (size_t)v;
}

/* Host index of every group rank from the published keys. */
static tdist_status_t host_indices(tdist_pg_t *pg, int64_t deadline_ms, int *host, int *nhosts)
{
    int n = pg->size;
    char mine[HIER_KEY_MAX];
    host_key(mine, sizeof mine);
    char **keys = calloc((size_t)n, sizeof *keys);
    void **vals = calloc((size_t)n, sizeof *vals);
    size_t *lens = calloc((size_t)n, sizeof *lens);
    tdist_status_t st = TDIST_OK;
    if (!keys || !vals || !lens) {
        st = tdist__error(TDIST_ERR_NO_MEMORY, "group %s: out of memory", pg->name);
        goto out;
    }
    for (int r = 0; r < n; r++) {
        keys[r] = tdist__asprintf("pg/%s/host/%d", pg->uid, r);
        if (!keys[r]) {
            st = tdist__error(TDIST_ERR_NO_MEMORY, "group %s: out of memory", pg->name);
            goto out;
        }
    }
    TDIST_CHECK_GOTO(tdist_store_set(pg->store, keys[pg->rank], mine, strlen(mine)), st, out);
    int64_t left = deadline_ms == INT64_MAX ? -1 : deadline_ms - tdist__now_ms();
    if (left != -1 && left < 1) left = 1;
    st = tdist_store_wait(pg->store, (const char *const *)keys, (size_t)n, left);
    if (st != TDIST_OK) {
        tdist__error_context(st, "group %s: rank %d: waiting for every rank's host key",
                             pg->name, pg->rank);
        goto out;
    }
    TDIST_CHECK_GOTO(tdist_store_multi_get(pg->store, (const char *const *)keys, (size_t)n, vals,
                                           lens),
                     st, out);
    int h = 0;
    for (int r = 0; r < n; r++) {
        host[r] = -1;
        for (int q = 0; q < r && host[r] < 0; q++)
            if (lens[q] == lens[r] && memcmp(vals[q], vals[r], lens[r]) == 0) host[r] = host[q];
        if (host[r] < 0) host[r] = h++;
    }
    *nhosts = h;
out:
    for (int r = 0; keys && r < n; r++) free(keys[r]);
    for (int r = 0; vals && r < n; r++) free(vals[r]);
    free(keys);
    free(vals);
    free(lens);
    return st;
}

static tdist_status_t hier_run(void *arg, const tdist__coll_args_t *a, int64_t deadline_ms);

tdist_status_t tdist__pg_hier_setup(tdist_pg_t *pg, int64_t deadline_ms)
{
    if (pg->kind != TDIST__TP_TCP || pg->size < 3) return TDIST_OK;
    const char *off = getenv("TDIST_HIERARCHICAL");
    if (off && strcmp(off, "0") == 0) return TDIST_OK;
    int n = pg->size;
    int *host = calloc((size_t)n, sizeof *host);
    int *members = calloc((size_t)n, sizeof *members);
    tdist_status_t st = TDIST_OK;
    if (!host || !members) {
        st = tdist__error(TDIST_ERR_NO_MEMORY, "group %s: out of memory", pg->name);
        goto out;
    }
    int nhosts = 0;
    TDIST_CHECK_GOTO(host_indices(pg, deadline_ms, host, &nhosts), st, out);
    if (nhosts < 2 || nhosts == n) goto out; /* one host, or one rank per host: flat */
    int me = pg->rank, h = host[me];
    /* local: this host's ranks, in group order; its rank 0 is the leader */
    int m = 0, my_local = -1;
    for (int r = 0; r < n; r++)
        if (host[r] == h) {
            if (r == me) my_local = m;
            members[m++] = r;
        }
    pg->hier.leader = members[0];
    char uid[256], name[256];
    if (m > 1) {
        snprintf(uid, sizeof uid, "%s/hl%d", pg->uid, h);
        snprintf(name, sizeof name, "%s.local%d", pg->name, h);
        TDIST_CHECK_GOTO(tdist__pg_build_sub(pg, members, m, my_local, uid, name, TDIST__TP_SHM,
                                             deadline_ms, &pg->hier.local),
                         st, out);
    }
    /* cross: the leaders, by host index */
    int nl = 0, my_cross = -1;
    for (int r = 0; r < n; r++) {
        bool leader = true;
        for (int q = 0; q < r && leader; q++) leader = host[q] != host[r];
        if (!leader) continue;
        if (r == me) my_cross = nl;
        members[nl++] = r;
    }
    if (my_cross >= 0) {
        snprintf(uid, sizeof uid, "%s/hx", pg->uid);
        snprintf(name, sizeof name, "%s.cross", pg->name);
        TDIST_CHECK_GOTO(tdist__pg_build_sub(pg, members, nl, my_cross, uid, name, TDIST__TP_TCP,
                                             deadline_ms, &pg->hier.cross),
                         st, out);
    }
    pg->hier.host = malloc((size_t)n * sizeof *pg->hier.host);
    if (!pg->hier.host) {
        st = tdist__error(TDIST_ERR_NO_MEMORY, "group %s: out of memory", pg->name);
        goto out;
    }
    memcpy(pg->hier.host, host, (size_t)n * sizeof *host);
    pg->hier.nhosts = nhosts;
    pg->coll.hier_min = min_bytes();
    pg->coll.hier_run = hier_run;
    pg->coll.hier_arg = pg;
out:
    free(host);
    free(members);
    return st;
}

void tdist__pg_hier_abort(tdist_pg_t *pg)
{
    if (pg->hier.local) tdist_pg_abort(pg->hier.local);
    if (pg->hier.cross) tdist_pg_abort(pg->hier.cross);
}

void tdist__pg_hier_free(tdist_pg_t *pg)
{
    tdist_pg_destroy(pg->hier.local);
    tdist_pg_destroy(pg->hier.cross);
    pg->hier.local = pg->hier.cross = NULL;
    free(pg->hier.host);
    pg->hier.host = NULL;
    pg->coll.hier_min = 0;
    pg->coll.hier_run = NULL;
}

/* A sub-collective's failure: fail the subgroup (so its members blocked on
 * this rank fail now) and pass the error up. */
static tdist_status_t sub_failed(tdist_pg_t *sub, tdist_status_t st, const char *step)
{
    char cause[600];
    snprintf(cause, sizeof cause, "%s", tdist_last_error());
    if (sub) {
        char *m = tdist__pg_fail(sub, st, step, step, cause, tdist__now_ms());
        free(m);
    }
    return tdist__error(st, "hierarchical %s: %s", step, cause);
}

static tdist_status_t hier_all_reduce_buf(tdist_pg_t *pg, void *buf, size_t count,
                                          tdist_dtype_t dtype, tdist_redop_t op, double premul,
                                          int avg_div, int64_t deadline_ms)
{
    tdist_coll_opts_t o;
    tdist_coll_opts_init(&o);
    int64_t left = deadline_ms == INT64_MAX ? -1 : deadline_ms - tdist__now_ms();
    if (left != -1 && left < 1) left = 1;
    o.timeout_ms = left < 0 ? pg->timeout_ms : left;
    tdist_redop_t local_op = op, cross_op = op;
    if (op == TDIST_AVG) local_op = cross_op = TDIST_SUM;
    if (op == TDIST_PREMUL_SUM) {
        cross_op = TDIST_SUM;
        o.premul_factor = premul;
        if (!pg->hier.local) TDIST_CHECK(tdist_scale(buf, count, dtype, premul));
    }
    tdist_status_t st;
    if (pg->hier.local) {
        st = tdist_reduce_to(pg->hier.local, buf, buf, count, dtype, local_op, 0, &o, NULL);
        if (st != TDIST_OK) return sub_failed(pg->hier.local, st, "reduce on this host");
    }
    o.premul_factor = 1.0;
    if (pg->hier.cross) {
        st = tdist_all_reduce(pg->hier.cross, buf, buf, count, dtype, cross_op, &o, NULL);
        if (st != TDIST_OK) {
            if (pg->hier.local) sub_failed(pg->hier.local, st, "all_reduce across hosts");
            return sub_failed(pg->hier.cross, st, "all_reduce across hosts");
        }
    }
    if (pg->hier.local) {
        st = tdist_broadcast(pg->hier.local, buf, count, dtype, 0, &o, NULL);
        if (st != TDIST_OK) return sub_failed(pg->hier.local, st, "broadcast on this host");
    }
    if (op == TDIST_AVG) TDIST_CHECK(tdist_divide(buf, count, dtype, avg_div > 0 ? avg_div : pg->size));
    return TDIST_OK;
}

static tdist_status_t hier_broadcast(tdist_pg_t *pg, void *buf, size_t count, tdist_dtype_t dtype,
                                     int root, int64_t deadline_ms)
{
    tdist_coll_opts_t o;
    tdist_coll_opts_init(&o);
    int64_t left = deadline_ms == INT64_MAX ? -1 : deadline_ms - tdist__now_ms();
    if (left != -1 && left < 1) left = 1;
    o.timeout_ms = left < 0 ? pg->timeout_ms : left;
    int root_host = pg->hier.host[root], my_host = pg->hier.host[pg->rank];
    tdist_status_t st;
    /* 1. on the root's host: from the root to everyone there (its leader too) */
    if (my_host == root_host && pg->hier.local) {
        int lroot = 0;
        for (int r = 0; r < root; r++) lroot += pg->hier.host[r] == root_host;
        st = tdist_broadcast(pg->hier.local, buf, count, dtype, lroot, &o, NULL);
        if (st != TDIST_OK) return sub_failed(pg->hier.local, st, "broadcast on the root's host");
    }
    /* 2. among leaders, from the root host's leader (cross rank = host index) */
    if (pg->hier.cross) {
        st = tdist_broadcast(pg->hier.cross, buf, count, dtype, root_host, &o, NULL);
        if (st != TDIST_OK) {
            if (pg->hier.local && my_host != root_host)
                sub_failed(pg->hier.local, st, "broadcast across hosts");
            return sub_failed(pg->hier.cross, st, "broadcast across hosts");
        }
    }
    /* 3. on the other hosts: from the leader */
    if (my_host != root_host && pg->hier.local) {
        st = tdist_broadcast(pg->hier.local, buf, count, dtype, 0, &o, NULL);
        if (st != TDIST_OK) return sub_failed(pg->hier.local, st, "broadcast on this host");
    }
    return TDIST_OK;
}

/* coll/'s hierarchical route (tdist__coll_group_t.hier_run; pg's check
 * has run on the whole group first). */
static tdist_status_t hier_run(void *arg, const tdist__coll_args_t *a, int64_t deadline_ms)
{
    tdist_pg_t *pg = arg;
    size_t es = tdist_dtype_size(a->dtype);
    switch (a->op) {
    case TDIST__OP_ALL_REDUCE:
        if (a->sendbuf && a->sendbuf != a->recvbuf) memcpy(a->recvbuf, a->sendbuf, a->count * es);
        return hier_all_reduce_buf(pg, a->recvbuf, a->count, a->dtype, a->redop, a->premul,
                                   a->avg_div, deadline_ms);
    case TDIST__OP_ALL_REDUCE_COALESCED:
        for (size_t i = 0; i < a->nbufs; i++)
            TDIST_CHECK(hier_all_reduce_buf(pg, a->bufs[i], a->counts[i], a->dtype, a->redop,
                                            a->premul, a->avg_div, deadline_ms));
        return TDIST_OK;
    case TDIST__OP_BROADCAST:
        return hier_broadcast(pg, a->recvbuf, a->count, a->dtype, a->root, deadline_ms);
    default:
        return tdist__error(TDIST_ERR_INTERNAL, "hierarchical: op %d", (int)a->op);
    }
}
