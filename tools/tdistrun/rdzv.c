/*
 * tools/tdistrun/rdzv.c — a job stuck before its first group: SIGUSR1 to
 * the launcher leaves alone the workers that cannot take it yet
 * (flight.c), and this file says what the job's store knows about them:
 * which ranks of this attempt's rendezvous have registered. A worker left
 * alone that has registered waits in tdist_init for the others; one that
 * has not has not called tdist_init yet (loading its data, say), or cannot
 * reach the store; the ranks of other nodes that have not registered are
 * listed too. Read through an ordinary store client (the workers' secret
 * is in the launcher's environment), with short timeouts: a launcher
 * must stay responsive.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "init/internal.h" /* tdist__rdzv_peek */
#include "tdist/store.h"
#include "tdistrun.h"

#define RDZV_STORE_MS 2000 /* the whole read: connect and every store call */
#define RDZV_LIST_MAX 16   /* ranks named per list; the rest counted */

/* A list of at most RDZV_LIST_MAX items ("3 (pid 812), 5 (pid 813)"),
 * every item counted. */
typedef struct list {
    char buf[512];
    size_t used;
    int count;
} list_t;

static void list_add(list_t *ls, const char *item)
{
    if (ls->count < RDZV_LIST_MAX && ls->used < sizeof ls->buf) {
        int w = snprintf(ls->buf + ls->used, sizeof ls->buf - ls->used, "%s%s",
                         ls->count ? ", " : "", item);
        if (w > 0) ls->used += (size_t)w;
    }
    ls->count++;
}

/* "tdistrun:   WHAT: rank 3 (pid 812)" or "ranks 3, 5, ..." and after. */
static void list_print(const list_t *ls, const char *what, const char *after)
{
    if (!ls->count) return;
    tdr_eprintf("tdistrun:   %s: rank%s %s%s%s\n", what, ls->count == 1 ? "" : "s", ls->buf,
                ls->count > RDZV_LIST_MAX ? ", ..." : "", after);
}

/* The global rank's worker in this set, or -1. */
static int local_index(const tdr_launch_t *l, int rank)
{
    int i = rank - l->rank_base;
    return i >= 0 && i < l->nworkers ? i : -1;
}

void tdr_rdzv_report(const tdr_launch_t *l, const tdr_worker_t *ws, int n, const bool *alone)
{
    const tdr_opts_t *o = l->opts;
    /* --backend mpi: the rendezvous is mpirun's, not the store's */
    if (l->plain_env || o->mpi) return;
    int world = o->nnodes * o->nproc_per_node;
    bool *joined = calloc((size_t)world, sizeof *joined);
    if (!joined) return;
    tdist_store_opts_t so;
    tdist_store_opts_init(&so);
    so.timeout_ms = RDZV_STORE_MS;
    so.connect_timeout_ms = RDZV_STORE_MS;
    tdist_store_t *store = NULL;
    int nj = 0;
    bool aborted = false;
    tdist_store_bound_thread(RDZV_STORE_MS); /* the launcher's loop waits meanwhile */
    tdist_status_t st = tdist_store_tcp_connect(l->master_addr, (uint16_t)l->master_port, &so,
                                                &store);
    if (st == TDIST_OK) st = tdist__rdzv_peek(store, l->attempt, world, joined, &nj, &aborted);
    tdist_store_bound_thread(-1);
    tdist_store_destroy(store);
    if (st != TDIST_OK) {
        tdr_eprintf("tdistrun: cannot read the rendezvous from the job's store at %s:%d: %s\n",
                    l->master_addr, l->master_port, tdist_last_error());
        free(joined);
        return;
    }
    tdr_eprintf("tdistrun: rendezvous of attempt %d: %d of %d ranks registered%s\n", l->attempt,
                nj, world, aborted ? "; it was aborted (the workers' errors say why)" : "");
    list_t waiting = {0}, absent = {0}, remote = {0};
    for (int i = 0; i < n; i++) {
        if (!alone[i]) continue;
        char item[64];
        snprintf(item, sizeof item, "%d (pid %d)", ws[i].rank, (int)ws[i].pid);
        bool in = ws[i].rank >= 0 && ws[i].rank < world && joined[ws[i].rank];
        list_add(in ? &waiting : &absent, item);
    }
    for (int r = 0; r < world; r++) {
        if (joined[r] || local_index(l, r) >= 0) continue;
        char item[16];
        snprintf(item, sizeof item, "%d", r);
        list_add(&remote, item);
    }
    list_print(&waiting, "registered, waiting in tdist_init for the others", "");
    list_print(&absent, "not registered",
               " (not in tdist_init yet, or it cannot reach the store)");
    list_print(&remote, "not registered, on other nodes", "");
    if (nj == world && !waiting.count && !absent.count)
        tdr_eprintf("tdistrun:   every rank has registered: the workers left alone are past the "
                    "rendezvous (making their first group) or not tdist programs\n");
    free(joined);
}
