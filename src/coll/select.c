/*
 * coll/select.c — the one selection of a route and an algorithm for every
 * collective, and the dispatch that runs it (tdist__coll_run).
 *
 * Route (the first exchange, which carries pg/'s check of rule 2):
 *   hierarchical    a group over several hosts with pg/'s local and cross
 *                   subgroups: all_reduce (and its coalesced form) and
 *                   broadcast of hier_min bytes or more
 *   shm line        every rank on one host: every collective starts with
 *                   the line exchange (shm_line.c)
 *   fused           TCP: a one-shot collective (oneshot.c: all_reduce, reduce,
 *                   broadcast, all_gather, gather, scatter, all_to_all,
 *                   reduce_scatter) staging up to fused_max(size) bytes a
 *                   rank (the rooted ones: fused_rooted_max(size), except
 *                   along the tree) sends its data with the fingerprint: to
 *                   every peer, or from TDIST_CHECK_TREE_MIN ranks (8)
 *                   along a tree (flat up to TDIST_CHECK_TREE_RADIX
 *                   ranks, k-nomial above), up to rank 0 and down
 *                   (fused_tree.c; pg's check before the native
 *                   algorithms then goes the same way, and all_reduce
 *                   takes it up to TDIST__COLL_TREE_REDUCE_MAX, reduced
 *                   on the way up)
 *   monitored       TCP: monitored_barrier's collection at rank 0
 *   native          pg's fingerprint exchange (along the tree, as the
 *                   fused route's, in a group of TDIST_CHECK_TREE_MIN ranks),
 *                   then the algorithm
 * Algorithm (size >= 2):
 *   all_reduce      shm: one-shot in the line (up to the blob), one-shot
 *                   through the staging slots (up to 2 KiB, or 8 KiB with
 *                   more ranks than CPUs; not PREMUL_SUM), else staged —
 *                   unless TDIST_ALGO_ALLREDUCE forces one;
 *                   point-to-point: direct up to 256 B, recursive doubling
 *                   below 256 KiB (or count < size), ring above
 *   broadcast       shm: one-shot (in the root's line, or its slot up to
 *                   TDIST_SHM_ONESHOT_MAX) or staged; point-to-
 *                   point: binomial tree, pipelined chain from 1 MiB when
 *                   size > 2
 *   reduce          shm: one-shot as all_reduce (the root reduces), else
 *                   staged; point-to-point: binomial tree, ring
 *                   reduce-scatter + gather from 512 KiB (count >= size,
 *                   more than 2 ranks)
 *   all_gather, gather, scatter, all_to_all, reduce_scatter
 *                   shm: one-shot when what a rank stages fits in the
 *                   line or (up to TDIST_SHM_ONESHOT_MAX) in its slot;
 *                   else reduce_scatter staged (shm_coll.c), the others
 *                   their one algorithm
 *   reduce_scatter  point-to-point: direct up to TDIST__COLL_RS_DIRECT_RANKS
 *                   ranks, ring above
 *   barrier         shm: the line alone; point-to-point: pg's fingerprint
 *                   exchange alone when it runs (along the tree: a
 *                   gather-release barrier), else dissemination
 *   all_reduce_wire (f32 over a 16-bit wire) its one algorithm, which
 *                   takes the shm staged path, or the 16-bit all_reduce
 *                   chosen by its size, or a backend's all_reduce slot
 *                   (all_reduce_wire.c)
 *   others          their one algorithm (all_gatherv: direct up to 32 KiB
 *                   in all, ring above, in all_gatherv.c)
 * Every input of the choice is something every rank agrees on (the
 * fingerprint's fields, the group), so every rank takes the same route.
 */
#include <stdlib.h>
#include <string.h>

#include "coll/coll_internal.h"

/* The shm line carries a 64-bit fingerprint hash; a tiny payload fills
 * the rest of the blob. */
#define SHM_TINY_MAX (TDIST__SHMC_BLOB_MAX - sizeof(uint64_t))

/* Above that and up to this size an all_reduce goes in one shot through
 * the staging slots: one wait instead of the staged protocol's three, each
 * rank reducing everything. That pays most when ranks share CPUs (every
 * wait a yield); with a CPU each, the staged protocol's split of the work
 * wins sooner. Measured on 2 vCPUs (docs/pg.md). */
#ifndef TDIST_SHM_SMALL_MAX
#define TDIST_SHM_SMALL_MAX (2u * 1024u)
#endif
#ifndef TDIST_SHM_SMALL_MAX_OVERSUB
#define TDIST_SHM_SMALL_MAX_OVERSUB (8u * 1024u)
#endif

/* The other one-shot collectives (broadcast, all_gather, gather, scatter,
 * all_to_all, reduce_scatter) go through the slot up to this many bytes
 * staged by a rank (at most the slot): one wait and two copies beat the
 * staged protocol's per-chunk waits and the point-to-point messages. */
#ifndef TDIST_SHM_ONESHOT_MAX
#define TDIST_SHM_ONESHOT_MAX (256u * 1024u)
#endif
/* ... but gather, all_gather and all_to_all, whose every reader copies
 * most of the slots after the one wait, only up to this when every rank
 * has a CPU: past it the point-to-point messages, which overlap the
 * copies, won on 2 ranks of the 2-vCPU VM (32 KiB staged: all_gather
 * 1.6x, gather 1.1x; docs/pg.md). Oversubscribed, the one wait still
 * wins up to the slot. */
#ifndef TDIST_SHM_ONESHOT_SPREAD_MAX
#define TDIST_SHM_ONESHOT_SPREAD_MAX (16u * 1024u)
#endif

/* Over point-to-point transports, one-shot collectives staging up to
 * fused_max(group size) bytes a rank send them with the fingerprint, one message to
 * every peer: at most FUSED_MAX, and at most FUSED_FANOUT bytes sent by a
 * rank in all (payload x (size - 1)), so a large group does not trade a
 * few round trips for a flood. */
#define FUSED_MAX 16384
#define FUSED_FANOUT 65536

static size_t fused_max(int size)
{
    size_t f = size > 1 ? FUSED_FANOUT / (size_t)(size - 1) : FUSED_MAX;
    return f < FUSED_MAX ? f : FUSED_MAX;
}

/* Rooted collectives (broadcast, scatter, reduce, gather) move their data
 * one way, from the senders to the ranks that read it, and a blocking
 * call's senders do not wait (fused.c): they go fused further, up to
 * ROOTED_MAX staged by a rank and ROOTED_FANOUT sent by the root in all. */
#define ROOTED_MAX 65536
#define ROOTED_FANOUT 262144

static size_t fused_rooted_max(int size)
{
    size_t f = size > 1 ? ROOTED_FANOUT / (size_t)(size - 1) : ROOTED_MAX;
    return f < ROOTED_MAX ? f : ROOTED_MAX;
}

static bool rooted_op(tdist__op_t op)
{
    return op == TDIST__OP_BROADCAST || op == TDIST__OP_SCATTER || op == TDIST__OP_REDUCE ||
           op == TDIST__OP_GATHER;
}

/* ---------------------------------------------------------- op names */

static const char *const op_names[TDIST__OP_COUNT] = {
    [TDIST__OP_NONE] = "none",
    [TDIST__OP_BROADCAST] = "broadcast",
    [TDIST__OP_ALL_REDUCE] = "all_reduce",
    [TDIST__OP_REDUCE] = "reduce",
    [TDIST__OP_ALL_GATHER] = "all_gather",
    [TDIST__OP_ALL_GATHERV] = "all_gatherv",
    [TDIST__OP_GATHER] = "gather",
    [TDIST__OP_SCATTER] = "scatter",
    [TDIST__OP_REDUCE_SCATTER] = "reduce_scatter",
    [TDIST__OP_ALL_TO_ALL] = "all_to_all",
    [TDIST__OP_ALL_TO_ALLV] = "all_to_allv",
    [TDIST__OP_BARRIER] = "barrier",
    [TDIST__OP_MONITORED_BARRIER] = "monitored_barrier",
    [TDIST__OP_ALL_REDUCE_COALESCED] = "all_reduce_coalesced",
    [TDIST__OP_BROADCAST_COALESCED] = "broadcast_coalesced",
    [TDIST__OP_SEND] = "send",
    [TDIST__OP_RECV] = "recv",
    [TDIST__OP_ALL_REDUCE_WIRE] = "all_reduce_wire",
};

const char *tdist__op_name(tdist__op_t op)
{
    return (op > TDIST__OP_NONE && op < TDIST__OP_COUNT) ? op_names[op] : "unknown-op";
}

/* ------------------------------------------------------- group state */

tdist_status_t tdist__coll_forced_ar_algo(tdist__ar_algo_t *out)
{
    const char *e = getenv("TDIST_ALGO_ALLREDUCE");
    *out = TDIST__AR_AUTO;
    if (!e || !*e || strcmp(e, "auto") == 0) return TDIST_OK;
    if (strcmp(e, "ring") == 0)
        *out = TDIST__AR_RING;
    else if (strcmp(e, "rd") == 0)
        *out = TDIST__AR_RD;
    else if (strcmp(e, "direct") == 0)
        *out = TDIST__AR_DIRECT;
    else
        return tdist__error(TDIST_ERR_INVALID_ARG,
                            "TDIST_ALGO_ALLREDUCE=\"%s\": expected ring, rd, direct or auto", e);
    return TDIST_OK;
}

/* From this many ranks on, a point-to-point group's first exchange (pg's
 * check, the fused collectives) runs along a tree (fused_tree.c):
 * 2 (n - 1) messages instead of n (n - 1).
 * Below it one message to every peer is as cheap, needs one step, and
 * lets a blocking rooted collective's senders leave without waiting (on
 * 4 ranks sharing 2 CPUs the tree measured 2-3x slower for an 8-byte
 * broadcast or gather, faster only for all_reduce and barrier).
 * TDIST_CHECK_TREE_MIN overrides it (0: never). */
#define TREE_MIN 8
/* The tree's fan-out: up to this many ranks it is rank 0 and the others
 * (two steps deep, rank 0 receiving and sending size - 1 messages), above
 * it a k-nomial tree of this radix. Ranks sharing CPUs wait less on a
 * shallow tree than on a binomial one (docs/design.md, "the check along a
 * tree"). TDIST_CHECK_TREE_RADIX overrides it (at least 2). */
#define TREE_RADIX 8

/* An integer from the environment variable name in [lo, hi], else def. */
static tdist_status_t env_int(const char *name, int def, long lo, long hi, const char *what,
                              int *out)
{
    const char *e = getenv(name);
    *out = def;
    if (!e || !*e) return TDIST_OK;
    char *end = NULL;
    long v = strtol(e, &end, 10);
    if (*end || v < lo || v > hi)
        return tdist__error(TDIST_ERR_INVALID_ARG, "%s=\"%s\": expected %s", name, e, what);
    *out = (int)v;
    return TDIST_OK;
}

tdist_status_t tdist__coll_group_init(tdist__coll_group_t *g, int size)
{
    memset(g, 0, sizeof *g);
    TDIST_CHECK(tdist__coll_forced_ar_algo(&g->ar_algo));
    int tmin;
    TDIST_CHECK(env_int("TDIST_CHECK_TREE_MIN", TREE_MIN, 0, 1L << 30,
                        "a group size (0: never)", &tmin));
    TDIST_CHECK(env_int("TDIST_CHECK_TREE_RADIX", TREE_RADIX, 2, 1L << 30,
                        "a tree's fan-out, at least 2", &g->tree_radix));
    g->tree = tmin > 0 && size >= tmin;
    size_t n = (size_t)(unsigned)size;
    g->fused_max = fused_max(size);
    g->fused_rooted_max = fused_rooted_max(size);
    g->fused_cap = TDIST_MAX(g->fused_max, g->fused_rooted_max);
    g->fused_out = malloc(g->fused_cap + TDIST__COLL_FP_MAX);
    g->fused_in = malloc(n * g->fused_cap);
    g->reqs = calloc(2 * n, sizeof *g->reqs);
    g->reqp = calloc(2 * n, sizeof *g->reqp);
    g->blobs = calloc(n, sizeof *g->blobs);
    g->ack_owed = calloc(n, sizeof *g->ack_owed);
    g->ack_head = calloc(n, sizeof *g->ack_head);
    g->ack_fp = malloc(n * TDIST__ACK_MAX * TDIST__COLL_FP_MAX);
    g->ack_in = malloc(TDIST__ACK_MAX * TDIST__COLL_FP_MAX);
    if (!g->fused_out || !g->fused_in || !g->reqs || !g->reqp || !g->blobs ||
        !g->ack_owed || !g->ack_head || !g->ack_fp || !g->ack_in) {
        tdist__coll_group_free(g);
        return tdist__error(TDIST_ERR_NO_MEMORY, "collective state for %d ranks: out of memory",
                            size);
    }
    return TDIST_OK;
}

void tdist__coll_group_free(tdist__coll_group_t *g)
{
    tdist__coll_scratch_release(&g->scratch);
    free(g->fused_out);
    free(g->fused_in);
    free(g->reqs);
    free(g->reqp);
    free((void *)g->blobs);
    free(g->ack_owed);
    free(g->ack_head);
    free(g->ack_fp);
    free(g->ack_in);
    g->ack_owed = g->ack_head = NULL;
    g->ack_fp = g->ack_in = NULL;
    g->fused_out = g->fused_in = NULL;
    g->reqs = NULL;
    g->reqp = NULL;
    g->blobs = NULL;
}

/* ---------------------------------------------------------- selection */

static size_t args_bytes(const tdist__coll_args_t *a)
{
    size_t es = tdist__dtype_size(a->dtype);
    if (a->op == TDIST__OP_ALL_REDUCE_COALESCED) {
        size_t tot = 0;
        for (size_t i = 0; i < a->nbufs; i++) tot += a->counts[i];
        return tot * es;
    }
    return a->count * es;
}

static bool hier_eligible(const tdist__coll_ctx_t *c, const tdist__coll_args_t *a)
{
    if (!c->g || !c->g->hier_run || c->g->hier_min == 0) return false;
    switch (a->op) {
    case TDIST__OP_ALL_REDUCE:
    case TDIST__OP_BROADCAST:
    case TDIST__OP_ALL_REDUCE_COALESCED:
        return args_bytes(a) >= c->g->hier_min;
    default:
        return false;
    }
}

static bool ar_forced(const tdist__coll_ctx_t *c) { return c->ar_forced != TDIST__AR_AUTO; }

static tdist__coll_algo_t ar_p2p(const tdist__coll_ctx_t *c, size_t count, size_t bytes)
{
    switch (c->ar_forced) {
    case TDIST__AR_RING: return TDIST__ALGO_AR_RING;
    case TDIST__AR_RD: return TDIST__ALGO_AR_RD;
    case TDIST__AR_DIRECT: return TDIST__ALGO_AR_DIRECT;
    case TDIST__AR_AUTO:
    default: break;
    }
    if (bytes <= TDIST__COLL_AR_DIRECT_MAX) return TDIST__ALGO_AR_DIRECT;
    if (bytes < TDIST__COLL_AR_RD_MAX || count < (size_t)c->size) return TDIST__ALGO_AR_RD;
    return TDIST__ALGO_AR_RING;
}

/* A one-shot collective (oneshot.c) whose staged data fits: in the
 * line's blob, else, up to its limit, in the exchange's slot; else
 * TDIST__ALGO_OP (its own algorithm). */
static tdist__coll_algo_t shm_oneshot(const tdist__coll_ctx_t *c, const tdist__coll_args_t *a,
                                      size_t slot_max)
{
    size_t staged = tdist__oneshot_bytes(a, c->size);
    if (a->count == 0) return TDIST__ALGO_OP;
    if (staged <= SHM_TINY_MAX) return TDIST__ALGO_SHM_IN_LINE;
    if (staged <= TDIST_MIN(slot_max, tdist__shmc_small_max())) return TDIST__ALGO_SHM_ONE_SHOT;
    return TDIST__ALGO_OP;
}

/* The one-shot limit of a reduction every reading rank reduces all of. */
static size_t small_max(const tdist__coll_ctx_t *c)
{
    return tdist__tp_oversubscribed(c->tp) ? TDIST_SHM_SMALL_MAX_OVERSUB : TDIST_SHM_SMALL_MAX;
}

static tdist__coll_algo_t select_shm(const tdist__coll_ctx_t *c, const tdist__coll_args_t *a)
{
    tdist__coll_algo_t one;
    switch (a->op) {
    case TDIST__OP_ALL_REDUCE: {
        if (ar_forced(c)) return ar_p2p(c, a->count, args_bytes(a));
        one = shm_oneshot(c, a, a->redop == TDIST_PREMUL_SUM ? 0 : small_max(c));
        return one == TDIST__ALGO_OP ? TDIST__ALGO_AR_SHM : one;
    }
    case TDIST__OP_ALL_REDUCE_COALESCED:
        return ar_forced(c) ? TDIST__ALGO_OP : TDIST__ALGO_AR_SHM;
    case TDIST__OP_BROADCAST:
        one = shm_oneshot(c, a, TDIST_SHM_ONESHOT_MAX);
        return one == TDIST__ALGO_OP ? TDIST__ALGO_BCAST_SHM : one;
    case TDIST__OP_REDUCE: /* the root reduces everything, as an all_reduce's ranks do */
        one = shm_oneshot(c, a, a->redop == TDIST_PREMUL_SUM ? 0 : small_max(c));
        return one == TDIST__ALGO_OP ? TDIST__ALGO_REDUCE_SHM : one;
    case TDIST__OP_REDUCE_SCATTER:
        one = shm_oneshot(c, a, TDIST_SHM_ONESHOT_MAX);
        return one == TDIST__ALGO_OP && tdist__shmc_reduce_scatter_fits(c->size)
                   ? TDIST__ALGO_RS_SHM : one;
    case TDIST__OP_BARRIER:
        return TDIST__ALGO_NONE;
    case TDIST__OP_MONITORED_BARRIER:
        return TDIST__ALGO_MONITORED;
    case TDIST__OP_GATHER:
    case TDIST__OP_ALL_GATHER:
    case TDIST__OP_ALL_TO_ALL:
        return shm_oneshot(c, a, tdist__tp_oversubscribed(c->tp) ? TDIST_SHM_ONESHOT_MAX
                                                                 : TDIST_SHM_ONESHOT_SPREAD_MAX);
    default:
        return tdist__oneshot_op(a->op) ? shm_oneshot(c, a, TDIST_SHM_ONESHOT_MAX)
                                            : TDIST__ALGO_OP;
    }
}

static tdist__coll_algo_t select_p2p(const tdist__coll_ctx_t *c, const tdist__coll_args_t *a)
{
    size_t bytes = args_bytes(a);
    switch (a->op) {
    case TDIST__OP_ALL_REDUCE:
        return ar_p2p(c, a->count, bytes);
    case TDIST__OP_BROADCAST:
        return bytes >= TDIST__COLL_BCAST_CHAIN_MIN && c->size > 2 ? TDIST__ALGO_BCAST_CHAIN
                                                                   : TDIST__ALGO_BCAST_TREE;
    case TDIST__OP_REDUCE: /* 2 ranks: the tree moves the data once, in one round */
        return bytes >= TDIST__COLL_REDUCE_RSG_MIN && a->count >= (size_t)c->size && c->size > 2
                   ? TDIST__ALGO_REDUCE_RSG
                   : TDIST__ALGO_REDUCE_TREE;
    case TDIST__OP_REDUCE_SCATTER:
        /* two ranks move the same bytes either way; from a few MiB the
         * ring's pipelined chunks beat one message each way */
        if (c->size == 2 && 2 * bytes >= TDIST__COLL_RS_RING_2R_MIN) return TDIST__ALGO_OP;
        return c->size <= TDIST__COLL_RS_DIRECT_RANKS ? TDIST__ALGO_RS_DIRECT : TDIST__ALGO_OP;
    case TDIST__OP_MONITORED_BARRIER:
        return TDIST__ALGO_MONITORED;
    default:
        return TDIST__ALGO_OP;
    }
}

bool tdist__coll_tree_on(const tdist__coll_ctx_t *c, const tdist__coll_check_t *chk)
{
    /* compare_earlier is NULL and have set only inside a Join */
    return c->g && c->g->tree && !c->shm && !c->slots && c->size > 1 && chk && chk->on &&
           chk->compare_earlier && chk->have < 0;
}

/* The bytes a rank may stage for a's fused route: along the tree rank 0
 * receives every rank's data, so rooted ones get no more room, and an
 * all_reduce reduces on the way up (fused_tree.c), so it gets more. */
static size_t fused_limit(const tdist__coll_ctx_t *c, const tdist__coll_check_t *chk,
                          tdist__op_t op)
{
    const tdist__coll_group_t *g = c->g;
    if (op == TDIST__OP_ALL_REDUCE && c->ar_forced == TDIST__AR_AUTO && tdist__coll_tree_on(c, chk))
        return TDIST_MAX(g->fused_max, TDIST__COLL_TREE_REDUCE_MAX);
    return rooted_op(op) && !g->tree ? g->fused_rooted_max : g->fused_max;
}

/* The selection itself (static: tdist__coll_run inlines it). */
static inline tdist__coll_plan_t plan(const tdist__coll_ctx_t *c, const tdist__coll_args_t *a,
                                      const tdist__coll_check_t *chk)
{
    tdist__coll_plan_t p = {TDIST__ROUTE_NATIVE, TDIST__ALGO_OP};
    if (c->slots && c->slots->slot[a->op]) {
        p.route = TDIST__ROUTE_BACKEND;
        p.algo = TDIST__ALGO_SLOT;
        return p;
    }
    if (c->slots && a->op == TDIST__OP_ALL_REDUCE_WIRE) {
        p.route = TDIST__ROUTE_BACKEND; /* over the backend's 16-bit all_reduce */
        return p;
    }
    if (hier_eligible(c, a)) {
        p.route = TDIST__ROUTE_HIER;
        return p;
    }
    if (c->shm) {
        /* without the group's state (coll/'s own entries) there is no line */
        p.route = c->g ? TDIST__ROUTE_SHM_LINE : TDIST__ROUTE_NATIVE;
        p.algo = select_shm(c, a);
        if (!c->g && (p.algo == TDIST__ALGO_SHM_IN_LINE || p.algo == TDIST__ALGO_SHM_ONE_SHOT))
            p.algo = a->op == TDIST__OP_ALL_REDUCE ? TDIST__ALGO_AR_SHM
                     : a->op == TDIST__OP_REDUCE    ? TDIST__ALGO_REDUCE_SHM
                     : a->op == TDIST__OP_BROADCAST ? TDIST__ALGO_BCAST_SHM
                     : a->op == TDIST__OP_REDUCE_SCATTER && tdist__shmc_reduce_scatter_fits(c->size)
                         ? TDIST__ALGO_RS_SHM
                         : TDIST__ALGO_OP;
        if (!c->g && (p.algo == TDIST__ALGO_NONE || p.algo == TDIST__ALGO_MONITORED))
            p.algo = TDIST__ALGO_OP;
        return p;
    }
    p.algo = select_p2p(c, a);
    if (a->op == TDIST__OP_MONITORED_BARRIER) {
        p.route = TDIST__ROUTE_MONITORED;
    } else if (tdist__oneshot_op(a->op) && chk && chk->on && c->size > 1 && a->count > 0 &&
               c->g &&
               tdist__oneshot_bytes(a, c->size) <= fused_limit(c, chk, a->op)) {
        p.route = TDIST__ROUTE_FUSED;
    } else if (a->op == TDIST__OP_BARRIER && chk && chk->on && c->size > 1) {
        p.algo = TDIST__ALGO_NONE; /* pg's fingerprint exchange is a barrier itself */
    }
    return p;
}

tdist__coll_plan_t tdist__coll_select(const tdist__coll_ctx_t *c, const tdist__coll_args_t *a,
                                      const tdist__coll_check_t *chk)
{
    return plan(c, a, chk);
}

/* plan(), or the group's last plan when this call has its shape (every
 * input of plan() but the group's constants). */
static inline tdist__coll_plan_t plan_cached(const tdist__coll_ctx_t *c,
                                             const tdist__coll_args_t *a,
                                             const tdist__coll_check_t *chk)
{
    /* v and coalesced forms: their bytes are not count's */
    if (!c->g || a->sendcounts || a->recvcounts || a->bufs) return plan(c, a, chk);
    tdist__coll_last_plan_t *l = &c->g->last;
    bool on = chk && chk->on, tree = c->g->tree && tdist__coll_tree_on(c, chk);
    if (l->valid && l->op == (int)a->op && l->count == a->count && l->dtype == (int)a->dtype &&
        l->redop == (int)a->redop && l->ar_forced == (int)c->ar_forced && l->chk_on == on &&
        l->tree_on == tree &&
        l->shm == (const void *)c->shm && l->slots == (const void *)c->slots)
        return (tdist__coll_plan_t){(tdist__coll_route_t)l->route, (tdist__coll_algo_t)l->algo};
    tdist__coll_plan_t p = plan(c, a, chk);
    *l = (tdist__coll_last_plan_t){.valid = true, .chk_on = on, .tree_on = tree,
                                   .op = (int)a->op, .dtype = (int)a->dtype,
                                   .redop = (int)a->redop, .ar_forced = (int)c->ar_forced,
                                   .count = a->count, .shm = c->shm, .slots = c->slots,
                                   .route = (int)p.route, .algo = (int)p.algo};
    return p;
}

/* ----------------------------------------------------------- dispatch */

static tdist_status_t run_all_reduce(const tdist__coll_ctx_t *c, tdist__coll_algo_t algo,
                                     const void *sendbuf, void *recvbuf, size_t count,
                                     tdist_dtype_t dtype, tdist_redop_t op, double premul)
{
    if (count == 0) return TDIST_OK;
    if (c->size == 1) {
        TDIST_CHECK(tdist__coll_load(recvbuf, sendbuf, count, dtype, op, premul));
        return tdist__coll_finish(c, recvbuf, count, dtype, op);
    }
    switch (algo) {
    case TDIST__ALGO_AR_SHM:
        return tdist__shmc_all_reduce(c, sendbuf, recvbuf, count, dtype, op, premul, -1);
    case TDIST__ALGO_AR_RING:
        return tdist__coll_all_reduce_ring(c, sendbuf, recvbuf, count, dtype, op, premul);
    case TDIST__ALGO_AR_DIRECT:
        return tdist__coll_all_reduce_direct(c, sendbuf, recvbuf, count, dtype, op, premul);
    case TDIST__ALGO_AR_RD:
        return tdist__coll_all_reduce_rd(c, sendbuf, recvbuf, count, dtype, op, premul);
    default: { /* a coalesced buffer: chosen by its own size */
        tdist__coll_algo_t own = c->shm && !ar_forced(c)
                                     ? TDIST__ALGO_AR_SHM
                                     : ar_p2p(c, count, tdist__coll_bytes(count, dtype));
        return run_all_reduce(c, own, sendbuf, recvbuf, count, dtype, op, premul);
    }
    }
}

static tdist_status_t run_broadcast(const tdist__coll_ctx_t *c, tdist__coll_algo_t algo, void *buf,
                                    size_t count, tdist_dtype_t dtype, int root)
{
    size_t bytes = tdist__coll_bytes(count, dtype);
    if (bytes == 0 || c->size == 1) return TDIST_OK;
    switch (algo) {
    case TDIST__ALGO_BCAST_SHM:
        return tdist__shmc_broadcast(c, buf, count, dtype, root);
    case TDIST__ALGO_BCAST_CHAIN:
        return tdist__coll_broadcast_chain(c, buf, bytes, root);
    case TDIST__ALGO_BCAST_TREE:
        return tdist__coll_broadcast_tree(c, buf, bytes, root);
    default: /* a coalesced buffer: chosen by its own size */
        if (c->shm) return tdist__shmc_broadcast(c, buf, count, dtype, root);
        return run_broadcast(c, bytes >= TDIST__COLL_BCAST_CHAIN_MIN && c->size > 2
                                    ? TDIST__ALGO_BCAST_CHAIN : TDIST__ALGO_BCAST_TREE,
                             buf, count, dtype, root);
    }
}

static tdist_status_t run_reduce(const tdist__coll_ctx_t *c, tdist__coll_algo_t algo,
                                 const tdist__coll_args_t *a)
{
    if (a->count == 0) return TDIST_OK;
    if (c->size == 1) {
        TDIST_CHECK(tdist__coll_load(a->recvbuf, a->sendbuf, a->count, a->dtype, a->redop,
                                     a->premul));
        return tdist__coll_finish(c, a->recvbuf, a->count, a->dtype, a->redop);
    }
    switch (algo) {
    case TDIST__ALGO_REDUCE_SHM:
        return tdist__shmc_all_reduce(c, a->sendbuf, a->recvbuf, a->count, a->dtype, a->redop,
                                      a->premul, a->root);
    case TDIST__ALGO_REDUCE_RSG:
        return tdist__coll_reduce_rsg(c, a->sendbuf, a->recvbuf, a->count, a->dtype, a->redop,
                                      a->premul, a->root);
    default:
        return tdist__coll_reduce_tree(c, a->sendbuf, a->recvbuf, a->count, a->dtype, a->redop,
                                       a->premul, a->root);
    }
}

/* all_to_allv: coll needs disjoint buffers, so in place goes through a copy. */
static tdist_status_t run_all_to_allv(const tdist__coll_ctx_t *c, const tdist__coll_args_t *a)
{
    const void *sb = a->sendbuf;
    void *tmp = NULL;
    if (sb && sb == a->recvbuf) {
        size_t tot = 0;
        for (int p = 0; p < c->size; p++) tot += a->sendcounts[p];
        TDIST_CHECK(tdist__coll_alloc(c, tot * tdist_dtype_size(a->dtype), "in-place all_to_allv",
                                      &tmp));
        memcpy(tmp, sb, tot * tdist_dtype_size(a->dtype));
        sb = tmp;
    }
    tdist_status_t st =
        tdist__coll_all_to_allv(c, sb, a->sendcounts, a->recvbuf, a->recvcounts, a->dtype);
    free(tmp);
    return st;
}

/* all_gather and all_to_all come without count vectors (pg/ fills them
 * only for a backend): their v forms run with every entry a->count. */
static tdist_status_t run_even(const tdist__coll_ctx_t *c, const tdist__coll_args_t *a)
{
    size_t *counts = NULL;
    TDIST_CHECK(tdist__coll_alloc(c, (size_t)c->size * sizeof *counts, tdist__op_name(a->op),
                                  (void **)&counts));
    for (int p = 0; p < c->size; p++) counts[p] = a->count;
    tdist__coll_args_t v = *a;
    v.sendcounts = v.recvcounts = counts;
    tdist_status_t st = a->op == TDIST__OP_ALL_GATHER
                            ? tdist__coll_all_gatherv(c, a->sendbuf, a->recvbuf, counts, a->dtype)
                            : run_all_to_allv(c, &v);
    free(counts);
    return st;
}

tdist_status_t tdist__coll_run_algo(const tdist__coll_ctx_t *c, const tdist__coll_args_t *a,
                                    const tdist__coll_check_t *chk, tdist__coll_algo_t algo)
{
    switch (a->op) {
    case TDIST__OP_BROADCAST:
        return run_broadcast(c, algo, a->recvbuf, a->count, a->dtype, a->root);
    case TDIST__OP_ALL_REDUCE:
        return run_all_reduce(c, algo, a->sendbuf, a->recvbuf, a->count, a->dtype, a->redop,
                              a->premul);
    case TDIST__OP_REDUCE:
        return run_reduce(c, algo, a);
    case TDIST__OP_ALL_GATHER:
    case TDIST__OP_ALL_GATHERV:
        if (!a->recvcounts) return run_even(c, a);
        return tdist__coll_all_gatherv(c, a->sendbuf, a->recvbuf, a->recvcounts, a->dtype);
    case TDIST__OP_GATHER:
        return tdist__coll_gather(c, a->sendbuf, a->recvbuf, a->count, a->dtype, a->root);
    case TDIST__OP_SCATTER:
        return tdist__coll_scatter(c, a->sendbuf, a->recvbuf, a->count, a->dtype, a->root);
    case TDIST__OP_REDUCE_SCATTER:
        if (algo == TDIST__ALGO_RS_SHM && c->size > 1)
            return tdist__shmc_reduce_scatter(c, a->sendbuf, a->recvbuf, a->count, a->dtype,
                                              a->redop, a->premul);
        if (algo == TDIST__ALGO_RS_DIRECT)
            return tdist__coll_reduce_scatter_direct(c, a->sendbuf, a->recvbuf, a->count,
                                                     a->dtype, a->redop, a->premul);
        return tdist__coll_reduce_scatter(c, a->sendbuf, a->recvbuf, a->count, a->dtype,
                                          a->redop, a->premul);
    case TDIST__OP_ALL_TO_ALL:
    case TDIST__OP_ALL_TO_ALLV:
        return a->recvcounts ? run_all_to_allv(c, a) : run_even(c, a);
    case TDIST__OP_BARRIER:
        return algo == TDIST__ALGO_NONE ? TDIST_OK : tdist__coll_barrier(c);
    case TDIST__OP_MONITORED_BARRIER:
        return tdist__coll_monitored_barrier(c, chk);
    case TDIST__OP_ALL_REDUCE_COALESCED:
        for (size_t i = 0; i < a->nbufs; i++)
            TDIST_CHECK(run_all_reduce(c, TDIST__ALGO_OP, a->bufs[i], a->bufs[i], a->counts[i],
                                       a->dtype, a->redop, a->premul));
        return TDIST_OK;
    case TDIST__OP_BROADCAST_COALESCED:
        for (size_t i = 0; i < a->nbufs; i++)
            TDIST_CHECK(run_broadcast(c, TDIST__ALGO_OP, a->bufs[i], a->counts[i], a->dtype,
                                      a->root));
        return TDIST_OK;
    case TDIST__OP_ALL_REDUCE_WIRE:
        return tdist__coll_all_reduce_wire(c, a, chk);
    default:
        return tdist__error(TDIST_ERR_INTERNAL, "unknown collective %d", (int)a->op);
    }
}

/* Under a Join without divide_by_initial_world_size, AVG divides by the
 * ranks still active: reduce as SUM, then divide here. */
static tdist_status_t divide_active(const tdist__coll_ctx_t *c, const tdist__coll_args_t *a)
{
    switch (a->op) {
    case TDIST__OP_ALL_REDUCE:
    case TDIST__OP_REDUCE_SCATTER:
        return tdist_divide(a->recvbuf, a->count, a->dtype, a->avg_div);
    case TDIST__OP_REDUCE:
        if (c->rank != a->root) return TDIST_OK;
        return tdist_divide(a->recvbuf, a->count, a->dtype, a->avg_div);
    case TDIST__OP_ALL_REDUCE_COALESCED:
        for (size_t i = 0; i < a->nbufs; i++)
            TDIST_CHECK(tdist_divide(a->bufs[i], a->counts[i], a->dtype, a->avg_div));
        return TDIST_OK;
    default:
        return TDIST_OK;
    }
}

/* pg's check before an algorithm: along the tree (all_to_allv's pairwise
 * splits then with every peer, as its data goes), or pg's own exchange. */
static tdist_status_t check_first(const tdist__coll_ctx_t *c, const tdist__coll_args_t *a,
                                  const tdist__coll_check_t *chk)
{
    if (!chk || !chk->on) return TDIST_OK;
    if (tdist__coll_tree_on(c, chk)) {
        TDIST_CHECK(tdist__coll_tree_exchange(c, chk, NULL));
        if (a->op != TDIST__OP_ALL_TO_ALLV) return TDIST_OK;
    }
    return chk->exchange(chk->arg, c->deadline_ms);
}

/* A route whose only wait is the shm line's gather. */
static bool single_wait(tdist__coll_plan_t p)
{
    return p.route == TDIST__ROUTE_SHM_LINE &&
           (p.algo == TDIST__ALGO_SHM_IN_LINE || p.algo == TDIST__ALGO_NONE);
}

tdist_status_t tdist__coll_run(const tdist__coll_ctx_t *c, const tdist__coll_args_t *a,
                               const tdist__coll_check_t *chk)
{
    if (a->redop == TDIST_AVG && a->avg_div > 0 && a->avg_div != c->size) {
        tdist__coll_args_t sum = *a;
        sum.redop = TDIST_SUM;
        sum.avg_div = 0;
        TDIST_CHECK(tdist__coll_run(c, &sum, chk));
        return divide_active(c, a);
    }
    tdist__coll_plan_t p = plan_cached(c, a, chk);
    if (c->chosen) {
        c->chosen[0] = (uint8_t)p.route;
        c->chosen[1] = (uint8_t)p.algo;
    }
    tdist__coll_ctx_t abs;
    if (c->lazy_deadline && !single_wait(p)) {
        abs = *c;
        abs.deadline_ms = tdist__deadline_ms(c->deadline_ms);
        abs.lazy_deadline = false;
        c = &abs;
    }
    /* the shm line tells pg once its post is out (shm_coll.c); any other
     * route before its first wait */
    if (p.route != TDIST__ROUTE_SHM_LINE) tdist__coll_started(c);
    if (p.route != TDIST__ROUTE_BACKEND && !c->tp)
        return tdist__error(TDIST_ERR_NOT_SUPPORTED, "the %s backend has no %s, and the group has "
                            "no native mesh to run it on", c->be_name ? c->be_name : "group's",
                            tdist__op_name(a->op));
    /* a TCP rooted collective's sender left acknowledgements unread: read
     * them before anything else is received (a rooted one reads what it needs) */
    if (c->g && c->g->ack_total && p.route != TDIST__ROUTE_BACKEND &&
        !(p.route == TDIST__ROUTE_FUSED && tdist__oneshot_role(c, a, chk) != TDIST__ROLE_ALL))
        TDIST_CHECK(tdist__coll_fused_drain(c, chk, -1));
    switch (p.route) {
    case TDIST__ROUTE_BACKEND:
        if (a->op != TDIST__OP_MONITORED_BARRIER && chk && chk->on && c->size > 1)
            TDIST_CHECK(chk->exchange(chk->arg, c->deadline_ms));
        if (p.algo != TDIST__ALGO_SLOT) return tdist__coll_run_algo(c, a, chk, p.algo);
        return c->slots->slot[a->op](c->be, c, a, chk);
    case TDIST__ROUTE_HIER:
        TDIST_CHECK(check_first(c, a, chk));
        return c->g->hier_run(c->g->hier_arg, a, c->deadline_ms);
    case TDIST__ROUTE_SHM_LINE:
        return tdist__coll_shm_line(c, a, chk, p.algo);
    case TDIST__ROUTE_FUSED:
        return tdist__coll_fused(c, a, chk);
    case TDIST__ROUTE_MONITORED:
        return tdist__coll_monitored_barrier(c, chk);
    case TDIST__ROUTE_NATIVE:
    default:
        TDIST_CHECK(check_first(c, a, chk));
        return tdist__coll_run_algo(c, a, chk, p.algo);
    }
}

/* ------------------------------------------------ one collective each */

tdist_status_t tdist__coll_all_reduce(const tdist__coll_ctx_t *c, const void *sendbuf,
                                      void *recvbuf, size_t count, tdist_dtype_t dtype,
                                      tdist_redop_t op, double premul, tdist__ar_algo_t algo)
{
    tdist__coll_ctx_t c2 = *c;
    if (algo != TDIST__AR_AUTO) c2.ar_forced = algo;
    tdist__coll_args_t a = {.op = TDIST__OP_ALL_REDUCE, .sendbuf = sendbuf, .recvbuf = recvbuf,
                            .count = count, .dtype = dtype, .redop = op, .premul = premul,
                            .root = -1};
    return tdist__coll_run(&c2, &a, NULL);
}

tdist_status_t tdist__coll_broadcast(const tdist__coll_ctx_t *c, void *buf, size_t count,
                                     tdist_dtype_t dtype, int root)
{
    tdist__coll_args_t a = {.op = TDIST__OP_BROADCAST, .sendbuf = buf, .recvbuf = buf,
                            .count = count, .dtype = dtype, .root = root};
    return tdist__coll_run(c, &a, NULL);
}

tdist_status_t tdist__coll_reduce(const tdist__coll_ctx_t *c, const void *sendbuf, void *recvbuf,
                                  size_t count, tdist_dtype_t dtype, tdist_redop_t op,
                                  double premul, int root)
{
    tdist__coll_args_t a = {.op = TDIST__OP_REDUCE, .sendbuf = sendbuf, .recvbuf = recvbuf,
                            .count = count, .dtype = dtype, .redop = op, .premul = premul,
                            .root = root};
    return tdist__coll_run(c, &a, NULL);
}
