/* tools/tdistrun/coord.c — launchers of several nodes agreeing through the
 * job's store (only with --nnodes > 1).
 *
 * Every launcher, node 0's included, keeps a TCP client to node 0's store.
 * Keys (outside init/'s "tdist/g<gen>/" space):
 *
 *   tdistrun/a<A>/failed  the first failure of attempt A, set once
 *                         (compare_set on a missing key); its value says
 *                         which node and rank and how
 *   tdistrun/a<A>/done    counter: nodes whose workers of attempt A all
 *                         exited 0
 *   tdistrun/abort        a launcher was stopped by a signal: no restarts
 *
 * A launcher polls these while its workers run. Another node's failure
 * stops this node's workers too, and then every launcher restarts (or gives
 * up) together, so all nodes always run the same attempt. A node whose
 * workers succeeded waits until every node is done (or a failure shows up,
 * which restarts it as well).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "tdist/store.h"
#include "tdistrun.h"

#define COORD_OP_TIMEOUT_MS 30000  /* each store call */
#define CONNECT_SLICE_MS 1000      /* connect retries in slices to notice signals */

struct tdr_coord {
    tdist_store_t *store;
    char addr[256];
    int port;
    int node_rank;
    int nnodes;
};

int tdr_coord_create(const char *addr, int port, int node_rank, int nnodes, tdr_coord_t **out)
{
    tdr_coord_t *c = calloc(1, sizeof *c);
    if (!c) return -1;
    snprintf(c->addr, sizeof c->addr, "%s", addr);
    c->port = port;
    c->node_rank = node_rank;
    c->nnodes = nnodes;
    /* Node 0's store may not be up yet: retry in short slices, so that a
     * signal to the launcher is noticed, up to the default timeout. */
    int64_t until = tdist__now_ms() + tdist__default_timeout_ms(TDIST_STORE_DEFAULT_TIMEOUT_MS);
    tdist_status_t st = TDIST_ERR_TIMEOUT;
    for (int guard = 0; guard < 1000000; guard++) {
        tdist_store_opts_t so;
        tdist_store_opts_init(&so);
        so.timeout_ms = COORD_OP_TIMEOUT_MS;
        so.connect_timeout_ms = CONNECT_SLICE_MS;
        st = tdist_store_tcp_connect(addr, (uint16_t)port, &so, &c->store);
        if (st == TDIST_OK || tdr_stop_signal() || tdist__now_ms() >= until) break;
        if (st != TDIST_ERR_TIMEOUT && st != TDIST_ERR_CONNECTION) break;
    }
    if (st != TDIST_OK) {
        if (!tdr_stop_signal())
            tdr_eprintf("tdistrun: cannot reach the job's store at %s:%d: %s\n", addr, port,
                        tdist_last_error());
        free(c);
        return -1;
    }
    *out = c;
    return 0;
}

void tdr_coord_destroy(tdr_coord_t *c)
{
    if (!c) return;
    tdist_store_destroy(c->store);
    free(c);
}

static void key_of(char *buf, size_t n, int attempt, const char *what)
{
    snprintf(buf, n, "tdistrun/a%d/%s", attempt, what);
}

void tdr_coord_report_failure(tdr_coord_t *c, int attempt, const char *what)
{
    char key[64];
    key_of(key, sizeof key, attempt, "failed");
    char *msg = tdist__asprintf("node %d: %s", c->node_rank, what);
    if (!msg) return;
    tdist_status_t st = tdist_store_compare_set(c->store, key, NULL, 0, msg, strlen(msg), NULL, NULL);
    if (st != TDIST_OK)
        tdr_eprintf("tdistrun: cannot tell the other nodes (store %s:%d): %s\n", c->addr,
                    c->port, tdist_last_error());
    free(msg);
}

void tdr_coord_abort(tdr_coord_t *c, const char *why)
{
    char *msg = tdist__asprintf("node %d: %s", c->node_rank, why);
    if (!msg) return;
    tdist_store_compare_set(c->store, "tdistrun/abort", NULL, 0, msg, strlen(msg), NULL, NULL);
    free(msg);
}

/* 1 and *value (malloc'd) if key exists, 0 if not, -1 on a store error. */
static int get_if_set(tdr_coord_t *c, const char *key, char **value)
{
    bool exists = false;
    const char *keys[] = {key};
    if (tdist_store_check(c->store, keys, 1, &exists) != TDIST_OK) return -1;
    if (!exists) return 0;
    void *v = NULL;
    size_t len = 0;
    if (tdist_store_get(c->store, key, &v, &len) != TDIST_OK) return -1;
    char *s = malloc(len + 1);
    if (!s) {
        free(v);
        return -1;
    }
    memcpy(s, v, len);
    s[len] = '\0';
    free(v);
    *value = s;
    return 1;
}

tdr_coord_event_t tdr_coord_poll(tdr_coord_t *c, int attempt, char *msg, size_t n)
{
    char key[64];
    char *v = NULL;
    int r = get_if_set(c, "tdistrun/abort", &v);
    if (r == 1) {
        snprintf(msg, n, "%s", v);
        free(v);
        return TDR_COORD_ABORT;
    }
    if (r == 0) {
        key_of(key, sizeof key, attempt, "failed");
        r = get_if_set(c, key, &v);
        if (r == 1) {
            snprintf(msg, n, "%s", v);
            free(v);
            return TDR_COORD_FAILED;
        }
    }
    if (r < 0) {
        snprintf(msg, n, "lost the job's store at %s:%d: %s", c->addr, c->port, tdist_last_error());
        return TDR_COORD_LOST;
    }
    return TDR_COORD_NONE;
}

tdr_coord_event_t tdr_coord_finish(tdr_coord_t *c, int attempt, char *msg, size_t n)
{
    char key[64];
    key_of(key, sizeof key, attempt, "done");
    int64_t done = 0;
    if (tdist_store_add(c->store, key, 1, &done) != TDIST_OK) {
        snprintf(msg, n, "lost the job's store at %s:%d: %s", c->addr, c->port, tdist_last_error());
        return TDR_COORD_LOST;
    }
    bool said = false;
    int64_t until = tdist__now_ms() + tdist__default_timeout_ms(TDIST_STORE_DEFAULT_TIMEOUT_MS);
    for (;;) {
        if (done >= c->nnodes) return TDR_COORD_NONE;
        if (tdist__now_ms() >= until) {
            snprintf(msg, n, "only %lld of %d nodes finished attempt %d within %lld ms",
                     (long long)done, c->nnodes, attempt,
                     (long long)tdist__default_timeout_ms(TDIST_STORE_DEFAULT_TIMEOUT_MS));
            return TDR_COORD_LOST;
        }
        if (tdr_stop_signal()) return TDR_COORD_SIGNAL;
        tdr_coord_event_t ev = tdr_coord_poll(c, attempt, msg, n);
        if (ev != TDR_COORD_NONE) return ev;
        if (!said) {
            tdr_eprintf("tdistrun: this node is done; waiting for the other nodes\n");
            said = true;
        }
        tdr_sinks_flush();
        tdist__sleep_ms(100);
        if (tdist_store_add(c->store, key, 0, &done) != TDIST_OK) {
            snprintf(msg, n, "lost the job's store at %s:%d: %s", c->addr, c->port,
                     tdist_last_error());
            return TDR_COORD_LOST;
        }
    }
}
