/*
 * pg/waits.c — on a timeout, who waits on whom.
 *
 * A rank whose collective times out knows only the peer it was waiting on,
 * and that peer may itself be waiting on another: in a ring all_reduce
 * with one rank stopped, its neighbour's neighbour often times out first
 * (each rank counts its deadline from its own call), and a report naming
 * the neighbour blames the wrong rank. So before a timeout is made the
 * group's failure (and before this rank closes its mesh, which would turn
 * the others' timeouts into "connection closed"), the rank records in the
 * store whom it waited on (pg/<uid>/waits/<rank>) and follows the others'
 * records from that peer on, for a short grace, to the first rank that
 * reports no wait of its own: the one stuck (stopped, deadlocked in its
 * own code, or issuing something else). A cycle is named as one.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pg/internal.h"
#include "tdist/store.h"

#define WAITS_GRACE_MS 400 /* how long the records of the others are awaited */
#define WAITS_POLL_MS 20
#define WAITS_MAX 32       /* ranks named in one chain */

/* Rank r's record: the rank it waited on, or -1 if it has none (yet). */
static int read_wait(tdist_pg_t *pg, int r)
{
    char key[300];
    snprintf(key, sizeof key, "pg/%s/waits/%d", pg->uid, r);
    const char *k = key;
    bool have = false;
    if (tdist_store_check(pg->store, &k, 1, &have) != TDIST_OK || !have) return -1;
    void *v = NULL;
    size_t len = 0;
    int peer = -1;
    if (tdist_store_get(pg->store, key, &v, &len) == TDIST_OK && len > 0 && len < 16) {
        char buf[16];
        memcpy(buf, v, len);
        buf[len] = '\0';
        peer = atoi(buf);
    }
    free(v);
    return peer >= 0 && peer < pg->size ? peer : -1;
}

/* Follow the records from path[1] on until the grace ends; the number of
 * ranks in path, *cycle whether the last one closes a cycle. */
static int follow(tdist_pg_t *pg, int *path, int n, int64_t until, bool *cycle)
{
    *cycle = false;
    while (n < WAITS_MAX) {
        int next = read_wait(pg, path[n - 1]);
        for (int i = 0; i < 1000 && next < 0 && tdist__now_ms() < until; i++) {
            tdist__sleep_ms(WAITS_POLL_MS);
            next = read_wait(pg, path[n - 1]);
        }
        if (next < 0) return n;
        for (int i = 0; i < n; i++)
            if (path[i] == next) {
                path[n++] = next;
                *cycle = true;
                return n;
            }
        path[n++] = next;
    }
    return n;
}

char *tdist__pg_wait_chain(tdist_pg_t *pg, int peer)
{
    if (!pg->store || pg->size < 3 || peer < 0 || peer >= pg->size || peer == pg->rank)
        return NULL;
    int64_t until = tdist__now_ms() + WAITS_GRACE_MS;
    tdist_store_bound_thread(WAITS_GRACE_MS); /* a stopped store host: the grace at most */
    char key[300], val[16];
    snprintf(key, sizeof key, "pg/%s/waits/%d", pg->uid, pg->rank);
    snprintf(val, sizeof val, "%d", peer);
    tdist_status_t st = tdist_store_set(pg->store, key, val, strlen(val));
    if (st != TDIST_OK) {
        tdist_store_bound_thread(-1);
        tdist_clear_error();
        pg->chk.store_silent = st == TDIST_ERR_TIMEOUT || st == TDIST_ERR_CONNECTION;
        return NULL;
    }
    int path[WAITS_MAX] = {pg->rank, peer};
    bool cycle = false;
    int n = follow(pg, path, 2, until, &cycle);
    tdist_store_bound_thread(-1);
    tdist_clear_error();
    if (n <= 2 && !cycle) return NULL; /* the peer reported nothing: the cause names it already */
    char chain[400] = "";
    size_t used = 0;
    for (int i = 0; i < n && used < sizeof chain; i++)
        used += (size_t)snprintf(chain + used, sizeof chain - used, "%srank %d", i ? " -> " : "",
                                 path[i]);
    if (cycle)
        return tdist__asprintf("; who waits on whom: %s, a cycle", chain);
    return tdist__asprintf("; who waits on whom: %s, and peer rank %d reported no wait of its "
                           "own: it is the one stuck",
                           chain, path[n - 1]);
}
