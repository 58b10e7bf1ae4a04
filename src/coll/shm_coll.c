/*
 * coll/shm_coll.c — collectives through shared memory, for groups whose
 * ranks all share one host (see coll.h, "shared-memory collectives").
 *
 * Every rank owns a collective area at the end of its shm transport
 * segment. Only the owner writes it; every peer maps it and reads it:
 *
 *   0      four progress counters, one cache line each:
 *          in  = chunks whose input this rank has staged,
 *          red = chunks whose slice this rank has reduced,
 *          out = chunks this rank has copied out (its slot may be reused),
 *          ack = exchanges this rank has compared and finished reading
 *   256    LINES (64) exchange lines of 512 bytes, used in turn by
 *          exchange: a sequence number and this rank's ack, a blob that
 *          starts in the same cache line (a hash of the fingerprint, and a
 *          tiny collective's data) and an aux part read only when needed
 *          (the whole fingerprint, for the mismatch message)
 *   36864  SLOTS (4) staging slots of CHUNK bytes (used in turn by chunk;
 *          a one-shot collective (oneshot.c) uses the slot of its
 *          exchange's sequence number, or, staging up to 4 KiB a rank,
 *          one of LINES 4 KiB sub-slots carved from the first slot)
 *
 * Every counter and line sequence only grows (no resets, no shared
 * atomics: each is written by its owner alone). All ranks run the same
 * collectives in the same order (rule 1, checked by the line exchange), so
 * they agree on the global chunk index g, which picks the slot (g % SLOTS).
 *
 * all_reduce of chunk g, on rank me (slices of a chunk: one per rank,
 * cache-line aligned):
 *   stage   wait every out >= g-(SLOTS-1) (slot g % SLOTS is free: chunk
 *           g-SLOTS copied out everywhere); copy the other ranks' slices
 *           of my input into my slot (my own slice stays in my input;
 *           PREMUL_SUM stages and scales all of it); in = g+1
 *   reduce  wait every in >= g+1; my slice = op over ranks' slices in rank
 *           order, written into my slot (AVG divides); red = g+1
 *   next    stage chunk g+1 while the others still reduce chunk g
 *   copy    copy out chunk g-1, one chunk behind: wait every red >= g;
 *           copy every rank's reduced slice into the output; out = g
 *           (chunk g's copy follows chunk g+1's reduce; the last chunk's
 *           ends the call)
 * Each element is reduced once, by one rank, in one order: every rank gets
 * the same bits. With converters (tdist__shmc_all_reduce_conv: the
 * all_reduce over a 16-bit wire) a rank stages every slice, its own too,
 * through load(), reduces from the slots alone, and copies out through
 * store(). Copying out one chunk behind means a rank rarely waits
 * for a peer's reduce (it finished a whole step ago), and four slots let
 * it stage chunk g+1 while a slower peer still copies chunk g-2 out, and
 * the next call's first chunk while the peers copy out this call's last:
 * the ranks' small differences in pace no longer turn every chunk into a
 * barrier (2 bound ranks, 4 MiB: 437 -> 395 us; docs/pg.md).
 *
 * Far CPUs: from 1 MiB on, an all_reduce or broadcast first times a few
 * back-to-back line exchanges (the probe). When a cache line takes long
 * to cross between the ranks' CPUs, a rank writes what the peers will
 * read (the slices it stages, its reduced slice; a broadcast root's
 * chunks) with streaming stores: to memory,
 * past its own cache, so a reader fetches them from memory instead of
 * pulling dirty lines out of a far cache one at a time. See pick_stream.
 *
 * A small collective (up to CHUNK bytes staged by a rank; oneshot.c)
 * can instead go in one shot: each rank copies its whole input into the
 * slot of its next exchange (sequence % SLOTS), once every peer has
 * copied out every staged chunk (out >= chunks), publishes the exchange,
 * and after it reads every rank's slot itself (an all_reduce reduces them
 * in rank order: the same bits everywhere, and the same as the staged
 * protocol's). One wait instead of three; each rank reduces all of it.
 * A line or slot is written again only once every peer's ack shows it
 * has compared and read the exchange that used it last (see "checking"
 * below): in a run of symmetric exchanges the acks ride in the lines
 * every rank reads anyway, so that costs nothing; a rooted one-shot
 * collective's sender (shm_line.c) runs up to LINES - 1 exchanges ahead
 * of its slowest reader. The next staged collective starts with an
 * exchange too, which every rank posts after finishing the last one.
 */
#include <math.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll/coll_internal.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#define CTL_BYTES 256
#define LINE_BYTES 512
#define QUICK_ROUNDS 64 /* gather's own poll of the lines, in pause rounds */
#define LINES 64 /* exchange lines, used in turn: how far a rooted collective's sender runs ahead */
#define STAGE_OFF ((CTL_BYTES + LINES * LINE_BYTES + 4095) / 4096 * 4096) /* page-aligned slots */
#ifndef TDIST_SHMC_CHUNK
#define TDIST_SHMC_CHUNK (256u * 1024u)
#endif
#define CHUNK TDIST_SHMC_CHUNK /* bytes of one staging slot */
#define PROBE_MIN (1u << 20)  /* bytes: a staged all_reduce this big probes */
#define PROBE_ROUNDS 5        /* line exchanges of a probe (the first is not timed) */
#define PROBE_POLLS 1024      /* pause rounds a probe exchange polls before it waits */
#ifndef TDIST_SHMC_FAR_NS
#define TDIST_SHMC_FAR_NS 150 /* an exchange slower than this: a far pair of CPUs */
#endif
#ifndef TDIST_SHMC_FAR_LINE_NS
#define TDIST_SHMC_FAR_LINE_NS 80 /* reading a cache line another CPU wrote slower than this: far */
#endif
#define PLACE_EVERY 1024 /* exchanges between two timings of that read (tdist__shmc_prepare_next) */
#define ROOTED_AHEAD 2    /* exchanges: which own line a rooted one fetches (tdist__shmc_prepare_rooted) */
#define TIMED_BYTES (16u * 1024u) /* of a staged slice, read timed (ranks sharing CPUs) */
#ifndef TDIST_SHMC_FAR_NS_PER_KIB
#define TDIST_SHMC_FAR_NS_PER_KIB 40 /* touching dirty lines staged on another CPU slower than this: far */
#endif
#ifndef TDIST_SHMC_SLOTS
#define TDIST_SHMC_SLOTS 4
#endif
#define SLOTS TDIST_SHMC_SLOTS /* staging slots; the one-behind copy-out needs 3 */
_Static_assert(SLOTS >= 3, "a rank stages chunk g+1 before it copies out chunk g-1");

typedef struct ctl {
    _Alignas(64) atomic_uint_least64_t in;
    _Alignas(64) atomic_uint_least64_t red;
    _Alignas(64) atomic_uint_least64_t out;
    _Alignas(64) atomic_uint_least64_t ack; /* exchanges checked and done with (see "ack") */
} ctl_t;

typedef struct line {
    _Alignas(64) atomic_uint_least64_t seq;
    uint16_t len, aux_len;
    /* seq - the owner's ack when it posted this line (below LINES: a rank
     * posts N only once its own ack has reached N - LINES); a difference,
     * so that the header stays 16 bytes and the blob's first 48 share the
     * sequence's cache line */
    atomic_uint_least32_t ack_behind;
    uint8_t blob[TDIST__SHMC_BLOB_MAX]; /* starts in the sequence's cache line */
    uint8_t aux[TDIST__SHMC_AUX_MAX];   /* read only when needed */
    uint8_t pad[LINE_BYTES - 16 - TDIST__SHMC_BLOB_MAX - TDIST__SHMC_AUX_MAX];
} line_t;
_Static_assert(TDIST__SHMC_BLOB_MAX <= UINT16_MAX && TDIST__SHMC_AUX_MAX <= UINT16_MAX,
               "a line's lengths fit its 16-bit fields");

_Static_assert(sizeof(ctl_t) <= CTL_BYTES, "ctl");
_Static_assert(sizeof(line_t) == LINE_BYTES, "line");
_Static_assert(TDIST__SHMC_BLOB_MAX + TDIST__SHMC_AUX_MAX <= LINE_BYTES - 24, "blob");
_Static_assert(CTL_BYTES + LINES * LINE_BYTES <= STAGE_OFF && STAGE_OFF % 4096 == 0, "layout");
_Static_assert((LINES & (LINES - 1)) == 0 && LINES >= SLOTS, "lines outlast slots");

typedef enum { STREAM_AUTO, STREAM_ON, STREAM_OFF } stream_mode_t;

struct tdist__shmc {
    tdist__tp_t *tp;
    int rank, size;
    stream_mode_t stream_mode; /* TDIST_SHM_STREAM */
    bool stream; /* the last probe found the CPUs far apart (never set when ranks share CPUs) */
    bool oversub; /* more ranks than CPUs (the transport's verdict, fixed once connected) */
    bool spun;    /* the last gather's wait ended in its poll (tdist__shmc_spun) */
    bool prefetchw; /* the CPU fetches lines for writing (tdist__shmc_prepare_next) */
    /* where the next peer's CPU is, from a timed read of a cache line it
     * has just written (tdist__shmc_prepare_next): -1 not known, 0 near,
     * 1 far; a change needs two timings in a row that agree */
    int8_t place, place_seen;
    uint32_t place_n; /* exchanges since the last timing */
    uint8_t **area;     /* size entries: every rank's area, mapped here */
    uint64_t line_seq;  /* exchanges done */
    uint64_t verified;  /* every peer's lines up to this one compared with this rank's */
    uint64_t ack_min;   /* no peer's ack is below this (from the lines read last) */
    uint64_t ack_pub;   /* the ack last stored in this rank's control area */
    uint64_t bad;       /* the exchange whose lines differ (0: none found) */
    /* per whole slot: the last exchanges that staged in it whole, and in a
     * sub-slot carved from it (one-shot collectives; they overlap) */
    uint64_t whole_at[SLOTS], sub_at[SLOTS];
    uint64_t sub_last[LINES]; /* per sub-slot: the last exchange that staged in it */
    uint64_t chunks;    /* staged chunks done (global chunk index) */
    uint8_t *scratch;   /* CHUNK bytes: PREMUL_SUM accumulator (ranks >= 2) */
};

size_t tdist__shmc_area_bytes(void) { return STAGE_OFF + SLOTS * (size_t)CHUNK; }

static inline ctl_t *ctl_of(const tdist__shmc_t *s, int r) { return (ctl_t *)(void *)s->area[r]; }

static inline line_t *line_of(const tdist__shmc_t *s, int r, uint64_t seq)
{
    return (line_t *)(void *)(s->area[r] + CTL_BYTES + (size_t)(seq & (LINES - 1)) * LINE_BYTES);
}

static inline uint8_t *slot_of(const tdist__shmc_t *s, int r, uint64_t g)
{
    return s->area[r] + STAGE_OFF + (size_t)(g % SLOTS) * CHUNK;
}

static tdist_status_t stream_mode(int rank, stream_mode_t *out)
{
    const char *e = getenv("TDIST_SHM_STREAM");
    *out = STREAM_AUTO;
    if (!e || !*e || strcmp(e, "auto") == 0) return TDIST_OK;
    if (strcmp(e, "on") == 0)
        *out = STREAM_ON;
    else if (strcmp(e, "off") == 0)
        *out = STREAM_OFF;
    else
        return tdist__error(TDIST_ERR_INVALID_ARG, "rank %d: TDIST_SHM_STREAM=\"%s\": expected "
                            "auto, on or off", rank, e);
    return TDIST_OK;
}

tdist_status_t tdist__shmc_create(tdist__tp_t *tp, int rank, int size, tdist__shmc_t **out)
{
    stream_mode_t mode;
    TDIST_CHECK(stream_mode(rank, &mode));
    tdist__shmc_t *s = calloc(1, sizeof *s);
    uint8_t **area = calloc((size_t)(unsigned)size, sizeof *area);
    uint8_t *scratch = size > 2 ? malloc(CHUNK) : NULL;
    if (!s || !area || (size > 2 && !scratch)) {
        free(s);
        free(area);
        free(scratch);
        return tdist__error(TDIST_ERR_NO_MEMORY, "rank %d: shared-memory collectives: out of "
                            "memory", rank);
    }
    for (int r = 0; r < size; r++) {
        size_t bytes = 0;
        area[r] = tdist__tp_shm_area(tp, r, &bytes);
        if (!area[r] || bytes < tdist__shmc_area_bytes()) {
            free(s);
            free(area);
            free(scratch);
            return tdist__error(TDIST_ERR_INTERNAL, "rank %d: shared-memory collectives: rank "
                                "%d's collective area is missing or too small (%zu bytes)",
                                rank, r, bytes);
        }
    }
    s->tp = tp;
    s->rank = rank;
    s->size = size;
    s->stream_mode = mode;
    s->oversub = tdist__tp_oversubscribed(tp);
    s->prefetchw = tdist__cpu_has_prefetchw();
    s->place = s->place_seen = -1;
    s->area = area;
    s->scratch = scratch;
    /* Counters start where this rank's own area says (zero when new). */
    for (uint64_t i = 0; i < LINES; i++) {
        uint64_t l = atomic_load(&line_of(s, rank, i)->seq);
        if (l > s->line_seq) s->line_seq = l;
    }
    s->verified = s->ack_min = s->line_seq;
    s->ack_pub = atomic_load(&ctl_of(s, rank)->ack);
    s->chunks = atomic_load(&ctl_of(s, rank)->out);
    *out = s;
    return TDIST_OK;
}

void tdist__shmc_destroy(tdist__shmc_t *s)
{
    if (!s) return;
    free(s->area);
    free(s->scratch);
    free(s);
}

/* ------------------------------------------------------------- waiting */

typedef enum { W_IN, W_RED, W_OUT, W_LINE, W_ACK } what_t;

typedef struct waitfor {
    const tdist__shmc_t *s;
    what_t what;
    uint64_t v;
    int only; /* >= 0: wait for this rank alone */
} waitfor_t;

/* ------------------------------------------------------------ checking
 *
 * A line that carries pg/'s check (aux_len > 0) starts its blob with the
 * hash of the fingerprint; a probe's lines carry none. A symmetric
 * exchange compares every rank's hash right after its wait (shm_line.c).
 * A rooted one-shot collective's sender posts its line and leaves, and
 * its receivers wait for the root's line alone: the lines they did not
 * wait for are compared later, in order (verify_upto), by every rank.
 *
 * A rank's ack is the last exchange whose lines it has all compared and
 * whose data it has finished reading. A rank writes its line N (and slot
 * N % SLOTS) only when every peer's ack is at least N - LINES and its own
 * comparisons have reached N - LINES: so no line is overwritten before
 * every rank has compared it, and a sender runs at most LINES - 1
 * exchanges ahead of the slowest reader. A rank publishes its ack in each
 * line it posts (read with the line, free in a symmetric exchange) and,
 * while it waits to write, in its control area. */

static inline uint64_t hash_of(const line_t *l)
{
    uint64_t h;
    memcpy(&h, l->blob, sizeof h);
    return h;
}

/* The last exchange every peer has posted, counting from verified on
 * (never past this rank's own last). */
static uint64_t all_posted(const tdist__shmc_t *s)
{
    uint64_t k = s->verified;
    for (; k < s->line_seq; k++)
        for (int r = 0; r < s->size; r++)
            if (r != s->rank &&
                atomic_load_explicit(&line_of(s, r, k + 1)->seq, memory_order_acquire) < k + 1)
                return k;
    return k;
}

/* Compare the lines of exchanges verified+1 .. upto (every rank has
 * posted them) with this rank's; false at the first that differs
 * (s->bad = that exchange). */
static bool verify_upto(tdist__shmc_t *s, uint64_t upto)
{
    for (uint64_t k = s->verified + 1; k <= upto; k++) {
        const line_t *mine = line_of(s, s->rank, k);
        if (mine->aux_len) {
            uint64_t h = hash_of(mine);
            for (int r = 0; r < s->size; r++) {
                const line_t *l = line_of(s, r, k);
                if (r != s->rank && l->aux_len && hash_of(l) != h) {
                    s->bad = k;
                    return false;
                }
            }
        }
        s->verified = k;
    }
    return true;
}

/* Rank r's ack, as far as this rank can see it: the larger of the one it
 * published while waiting (its control area) and the one in its latest
 * line this rank can find (it posts one in every collective; a line
 * whose slot holds a later exchange is only more recent). */
static uint64_t ack_of(const tdist__shmc_t *s, int r, uint64_t want)
{
    uint64_t a = atomic_load_explicit(&ctl_of(s, r)->ack, memory_order_acquire);
    if (a >= want) return a;
    /* the line r posts after the exchange wanted carries its ack then */
    const line_t *l = line_of(s, r, want + 1);
    uint64_t seq = atomic_load_explicit(&l->seq, memory_order_acquire);
    if (seq >= want + 1) {
        uint64_t behind = atomic_load_explicit(&l->ack_behind, memory_order_relaxed);
        /* the difference belongs to seq only if r has not posted the
         * slot's next line since (that line would carry its own) */
        atomic_thread_fence(memory_order_acquire);
        if (atomic_load_explicit(&l->seq, memory_order_relaxed) == seq && behind <= seq &&
            seq - behind > a)
            a = seq - behind;
    }
    return a;
}

/* Publish this rank's ack (verified) in its control area, for a rank
 * waiting to write while this one waits too (the caller is between
 * exchanges: every exchange it posted is finished with). Each line it
 * posts carries it as well, and a post stores it here too once it has
 * moved ACK_EVERY past the last stored (a rank waiting to write reads
 * this one, and the line of its own last exchange). */
#define ACK_EVERY 16
_Static_assert(ACK_EVERY < LINES / 2, "a reader's ack lags far less than a sender may run");

static void publish_ack(tdist__shmc_t *s)
{
    if (s->ack_pub == s->verified) return;
    s->ack_pub = s->verified;
    atomic_store_explicit(&ctl_of(s, s->rank)->ack, s->verified, memory_order_release);
}

/* Whether every peer's ack and this rank's comparisons have reached
 * exchange `target`, as far as this rank knows (and nothing differed). */
static inline bool may_write_known(const tdist__shmc_t *s, uint64_t target)
{
    return s->ack_min >= target && s->verified >= target && !s->bad;
}

/* Compare what every peer has posted, publish this rank's ack, refresh
 * the peers' lowest: whether exchange n may be written now (or a
 * difference was found: s->bad). Between a collective's exchanges only. */
static bool may_write(tdist__shmc_t *s, uint64_t target)
{
    uint64_t lo = UINT64_MAX;
    for (int r = 0; r < s->size; r++) {
        if (r == s->rank) continue;
        uint64_t a = ack_of(s, r, target);
        if (a < lo) lo = a;
    }
    s->ack_min = lo;
    /* Every peer's ack at lo means every line up to lo equals the lines
     * of whoever compared them: nothing left to compare there (and when a
     * rank found a difference it acknowledges nothing past it). */
    if (lo > s->verified && lo <= s->line_seq && !s->bad) s->verified = lo;
    if (!verify_upto(s, all_posted(s))) return true;
    publish_ack(s);
    return may_write_known(s, target);
}

/* While this rank waits for a line: compare what the peers have posted
 * of the exchanges before this one and publish the ack, as a rank waiting
 * to write (may_write) may need it. Whether a difference was found. */
static bool advance(tdist__shmc_t *s)
{
    uint64_t upto = all_posted(s);
    if (s->bad || !verify_upto(s, TDIST_MIN(upto, s->line_seq - 1))) return true;
    publish_ack(s);
    return false;
}

static uint64_t read_counter(const tdist__shmc_t *s, int r, what_t what, uint64_t v)
{
    switch (what) {
    case W_IN: return atomic_load_explicit(&ctl_of(s, r)->in, memory_order_acquire);
    case W_RED: return atomic_load_explicit(&ctl_of(s, r)->red, memory_order_acquire);
    case W_OUT: return atomic_load_explicit(&ctl_of(s, r)->out, memory_order_acquire);
    case W_ACK: return ack_of(s, r, v);
    case W_LINE:
    default: return atomic_load_explicit(&line_of(s, r, v)->seq, memory_order_acquire);
    }
}

static bool reached(void *arg)
{
    const waitfor_t *w = arg;
    const tdist__shmc_t *s = w->s;
    /* this rank's own state, which only its thread touches */
    if (w->what == W_ACK) return may_write((tdist__shmc_t *)(uintptr_t)s, w->v);
    if (w->what == W_LINE && (s->verified + 1 < s->line_seq || s->ack_pub != s->verified) &&
        advance((tdist__shmc_t *)(uintptr_t)s))
        return true; /* a difference: the caller reports it */
    if (w->only >= 0) return read_counter(s, w->only, w->what, w->v) >= w->v;
    for (int r = 0; r < s->size; r++) {
        if (r == s->rank) continue;
        if (read_counter(s, r, w->what, w->v) < w->v) return false;
    }
    return true;
}

/* Whether the wait still needs rank r to move (a rank that has reached
 * the target may leave). */
static bool needs_rank(void *arg, int r)
{
    const waitfor_t *w = arg;
    if (w->only >= 0 && r != w->only) return false;
    return read_counter(w->s, r, w->what, w->v) < w->v;
}

static const char *what_name(what_t w)
{
    switch (w) {
    case W_IN: return "staging chunk";
    case W_RED: return "reducing chunk";
    case W_OUT: return "copying out chunk";
    case W_ACK: return "comparing and reading exchange";
    case W_LINE:
    default: return "exchange";
    }
}

static tdist_status_t wait_for(const tdist__coll_ctx_t *c, what_t what, uint64_t v, int only)
{
    const tdist__shmc_t *s = c->shm;
    waitfor_t w = {s, what, v, only};
    tdist__coll_started(c); /* a wait before the post (a full line or slot) */
    /* every rank posts its exchange line first thing in a collective */
    unsigned flags = (c->spin ? TDIST__WAIT_SPIN : 0u) |
                     (what == W_LINE ? TDIST__WAIT_SELF_MADE : 0u) |
                     (c->lazy_deadline ? TDIST__WAIT_TIMEOUT : 0u);
    tdist_status_t st = tdist__tp_wait_until(s->tp, reached, needs_rank, &w, c->deadline_ms, flags);
    if (st != TDIST_ERR_TIMEOUT) return st;
    char list[256] = "";
    size_t used = 0;
    int missing = 0;
    tdist__tp_set_owed_peer(-1);
    for (int r = 0; r < s->size && used < sizeof list; r++) {
        if (r == s->rank || (only >= 0 && r != only)) continue;
        if (read_counter(s, r, what, v) >= v) continue;
        if (missing == 0) tdist__tp_set_owed_peer(r);
        used += (size_t)snprintf(list + used, sizeof list - used, "%speer rank %d",
                                 missing++ ? ", " : "", r);
    }
    return tdist__error(TDIST_ERR_TIMEOUT, "rank %d: shared-memory collective timed out waiting "
                        "for %s (%s %llu)", s->rank, list, what_name(what), (unsigned long long)v);
}

static void publish(const tdist__coll_ctx_t *c, atomic_uint_least64_t *ctr, uint64_t v)
{
    atomic_store_explicit(ctr, v, memory_order_release);
    tdist__tp_notify(c->shm->tp);
}

/* ------------------------------------------------------------ exchange */

/* Line n may be written once the peers' acks and this rank's comparisons
 * allow it (see "checking"); waits otherwise. TDIST_ERR_MISMATCH when a
 * comparison found lines that differ (tdist__shmc_bad names them). */
static tdist_status_t reserve(const tdist__coll_ctx_t *c, uint64_t target)
{
    tdist__shmc_t *s = c->shm;
    if (!s->bad && !may_write(s, target)) TDIST_CHECK(wait_for(c, W_ACK, target, -1));
    if (s->bad)
        return tdist__error(TDIST_ERR_MISMATCH, "rank %d: the lines of shared-memory exchange "
                            "%llu differ", s->rank, (unsigned long long)s->bad);
    return TDIST_OK;
}

tdist_status_t tdist__shmc_begin(const tdist__coll_ctx_t *c, uint8_t **blob, uint8_t **aux)
{
    tdist__shmc_t *s = c->shm;
    uint64_t n = s->line_seq + 1;
    uint64_t target = n > LINES ? n - LINES : 0;
    if (__builtin_expect(!may_write_known(s, target), 0)) TDIST_CHECK(reserve(c, target));
    line_t *mine = line_of(s, s->rank, n);
    if (aux) *aux = mine->aux;
    *blob = mine->blob;
    return TDIST_OK;
}

void tdist__shmc_post(const tdist__coll_ctx_t *c, size_t len, size_t aux_len)
{
    tdist__shmc_t *s = c->shm;
    uint64_t seq = ++s->line_seq;
    line_t *mine = line_of(s, s->rank, seq);
    mine->len = (uint16_t)TDIST_MIN(len, (size_t)TDIST__SHMC_BLOB_MAX);
    mine->aux_len = (uint16_t)TDIST_MIN(aux_len, (size_t)TDIST__SHMC_AUX_MAX);
    atomic_store_explicit(&mine->ack_behind, (uint32_t)(seq - s->verified), memory_order_relaxed);
    if (s->verified >= s->ack_pub + ACK_EVERY) publish_ack(s);
    publish(c, &mine->seq, seq);
    tdist__coll_started(c);
}

tdist_status_t tdist__shmc_publish(const tdist__coll_ctx_t *c, const void *blob, size_t len,
                                   const void *aux, size_t aux_len)
{
    if (len > TDIST__SHMC_BLOB_MAX) len = TDIST__SHMC_BLOB_MAX;
    if (aux_len > TDIST__SHMC_AUX_MAX) aux_len = TDIST__SHMC_AUX_MAX;
    uint8_t *aux_to = NULL, *blob_to = NULL;
    TDIST_CHECK(tdist__shmc_begin(c, &blob_to, &aux_to));
    if (len) memcpy(blob_to, blob, len);
    if (aux_len) memcpy(aux_to, aux, aux_len);
    tdist__shmc_post(c, len, aux_len);
    return TDIST_OK;
}

const uint8_t *tdist__shmc_peek(const tdist__coll_ctx_t *c, int r, size_t *len)
{
    tdist__shmc_t *s = c->shm;
    line_t *l = line_of(s, r, s->line_seq);
    if (atomic_load_explicit(&l->seq, memory_order_acquire) != s->line_seq) return NULL;
    if (len) *len = l->len <= TDIST__SHMC_BLOB_MAX ? l->len : TDIST__SHMC_BLOB_MAX;
    return l->blob;
}

const uint8_t *tdist__shmc_aux_of(const tdist__coll_ctx_t *c, int r, uint64_t seq, size_t *len)
{
    tdist__shmc_t *s = c->shm;
    line_t *l = line_of(s, r, seq);
    if (atomic_load_explicit(&l->seq, memory_order_acquire) != seq) return NULL;
    if (len) *len = l->aux_len <= TDIST__SHMC_AUX_MAX ? l->aux_len : TDIST__SHMC_AUX_MAX;
    return l->aux;
}

const uint8_t *tdist__shmc_peek_aux(const tdist__coll_ctx_t *c, int r, size_t *len)
{
    return tdist__shmc_aux_of(c, r, c->shm->line_seq, len);
}

uint64_t tdist__shmc_now(const tdist__coll_ctx_t *c) { return c->shm->line_seq; }
uint64_t tdist__shmc_bad(const tdist__coll_ctx_t *c) { return c->shm->bad; }

tdist_status_t tdist__shmc_await_next(const tdist__coll_ctx_t *c, int r, const uint8_t **aux,
                                      size_t *aux_len)
{
    tdist__shmc_t *s = c->shm;
    uint64_t next = s->line_seq + 1;
    TDIST_CHECK(wait_for(c, W_LINE, next, r));
    line_t *l = line_of(s, r, next);
    if (atomic_load_explicit(&l->seq, memory_order_acquire) != next)
        return tdist__error(TDIST_ERR_INTERNAL, "rank %d: shm exchange %llu: rank %d is "
                            "already past it", s->rank, (unsigned long long)next, r);
    *aux = l->aux;
    *aux_len = l->aux_len <= TDIST__SHMC_AUX_MAX ? l->aux_len : TDIST__SHMC_AUX_MAX;
    return TDIST_OK;
}

tdist_status_t tdist__shmc_exchange(const tdist__coll_ctx_t *c, const void *blob, size_t len,
                                    const void *aux, size_t aux_len, const uint8_t **blobs,
                                    size_t *lens)
{
    if (len > TDIST__SHMC_BLOB_MAX || aux_len > TDIST__SHMC_AUX_MAX)
        return tdist__error(TDIST_ERR_INTERNAL, "shm exchange: blob of %zu / aux of %zu bytes",
                            len, aux_len);
    TDIST_CHECK(tdist__shmc_publish(c, blob, len, aux, aux_len));
    return tdist__shmc_gather(c, blobs, lens);
}

/* Whether every peer has posted exchange seq, looking from rank *from on
 * (advanced past the ranks that have, so a poll loop reads each line
 * until it shows seq, then never again). */
static bool lines_posted(const tdist__shmc_t *s, uint64_t seq, int *from)
{
    while (*from < s->size &&
           (*from == s->rank ||
            atomic_load_explicit(&line_of(s, *from, seq)->seq, memory_order_acquire) >= seq))
        (*from)++;
    return *from == s->size;
}

/* Wait until every peer has posted exchange seq: first by polling the
 * lines for up to polls pause rounds (no callback, no clock), then through
 * the general wait. *polled (if not NULL): whether the poll was enough. */
static tdist_status_t await_lines(const tdist__coll_ctx_t *c, uint64_t seq, int polls,
                                  bool *polled)
{
    const tdist__shmc_t *s = c->shm;
    int q = 0;
    for (int i = 0; i < polls && !lines_posted(s, seq, &q); i++) tdist__cpu_relax();
    bool done = polls > 0 && q == s->size;
    if (polled) *polled = done;
    return done ? TDIST_OK : wait_for(c, W_LINE, seq, -1);
}

/* The earlier exchanges' lines not compared yet (a rooted collective's),
 * as far as the peers have posted them: TDIST_ERR_MISMATCH when two
 * differ. Before a wait for this exchange's lines, and after it fails (a
 * peer that found the difference first fails its group and leaves). */
static tdist_status_t check_earlier_slow(tdist__shmc_t *s, tdist_status_t st)
{
    uint64_t upto = all_posted(s);
    if (s->bad || !verify_upto(s, TDIST_MIN(upto, s->line_seq - 1)))
        return tdist__error(TDIST_ERR_MISMATCH, "rank %d: the lines of shared-memory "
                            "exchange %llu differ", s->rank, (unsigned long long)s->bad);
    return st;
}

/* Inline: a collective every rank waited for (an all_reduce) has nothing
 * earlier to compare, and pays one test. */
static inline tdist_status_t check_earlier(tdist__shmc_t *s, tdist_status_t st)
{
    if (__builtin_expect(s->verified + 1 < s->line_seq || s->bad, 0))
        return check_earlier_slow(s, st);
    return st;
}

tdist_status_t tdist__shmc_gather(const tdist__coll_ctx_t *c, const uint8_t **blobs, size_t *lens)
{
    tdist__shmc_t *s = c->shm;
    uint64_t seq = s->line_seq, lo = UINT64_MAX;
    TDIST_CHECK(check_earlier(s, TDIST_OK));
    /* Peers of a blocking exchange usually arrive within a few hundred ns:
     * poll their lines here first, without the general wait's callback
     * and clock (~10 ns a call off an 8-byte all_reduce), unless ranks
     * share CPUs (the one awaited may need this one). */
    bool quick = c->spin && !s->oversub;
    TDIST_CHECK(check_earlier(s, await_lines(c, seq, quick ? QUICK_ROUNDS : 0, &s->spun)));
    for (int r = 0; r < s->size; r++) {
        const line_t *l = line_of(s, r, seq);
        if (atomic_load_explicit(&l->seq, memory_order_acquire) != seq)
            return tdist__error(TDIST_ERR_INTERNAL, "rank %d: shm exchange %llu: rank %d is "
                                "already past it", s->rank, (unsigned long long)seq, r);
        blobs[r] = l->blob;
        if (lens) lens[r] = l->len <= TDIST__SHMC_BLOB_MAX ? l->len : TDIST__SHMC_BLOB_MAX;
        /* (the line stays seq's until this rank's ack passes it) */
        uint64_t a = seq - atomic_load_explicit(&l->ack_behind, memory_order_relaxed);
        if (r != s->rank && a < lo) lo = a;
    }
    if (lo != UINT64_MAX && lo > s->ack_min) s->ack_min = lo;
    /* the exchanges before this one are compared (the check after the
     * wait: every peer has posted them); this one's hashes by the caller
     * (the group fails if they differ) */
    s->verified = seq;
    return TDIST_OK;
}

bool tdist__shmc_spun(const tdist__coll_ctx_t *c) { return c->shm->spun; }

/* Time a read of a cache line the next peer wrote in the exchange just
 * gathered and nobody has read: its fingerprint (aux part). A far CPU
 * takes several times as long as a near one (about 150 against 30 ns on
 * the test VM); the clock's own cost is measured alongside and taken
 * off. Updates s->place when two timings in a row agree. */
static void time_place(tdist__shmc_t *s)
{
    const line_t *l = line_of(s, (s->rank + 1) % s->size, s->line_seq);
    if (!l->aux_len) return; /* nothing the peer wrote that is still unread */
    uint64_t t0 = tdist__now_ns();
    uint8_t v = *(const volatile uint8_t *)&l->aux[TDIST__SHMC_AUX_MAX - 1];
    uint64_t t1 = tdist__now_ns();
    uint64_t t2 = tdist__now_ns();
    (void)v;
    int64_t d = (int64_t)(t1 - t0) - (int64_t)(t2 - t1);
    int8_t seen = d > TDIST_SHMC_FAR_LINE_NS ? 1 : 0;
    if (seen == s->place_seen) s->place = seen;
    s->place_seen = seen;
}

static inline void prefetch_for_write(const tdist__shmc_t *s, const char *p)
{
#if defined(__x86_64__) && defined(__GNUC__)
    if (s->prefetchw) {
        __asm__ volatile("prefetchw %0" : : "m"(*p));
        return;
    }
#endif
    (void)s;
    __builtin_prefetch(p, 1, 3);
}

/* The line a rank posts next was last read by its peers: its stores would
 * wait for their copies to be invalidated, on the next call's path.
 * Fetched for writing now, that happens while this rank returns — but
 * only where it measured faster: with the peers' CPUs near, the next
 * line's first two cache lines when this exchange's blob fitted them (a
 * loss, a norm; a training loop repeats its shapes); with them far,
 * nothing (the peers seem to pull the lines back before they are
 * written); not known yet, the first two when the blob fitted the first
 * cache line. docs/pg.md gives the figures. */
void tdist__shmc_prepare_next(const tdist__coll_ctx_t *c)
{
    tdist__shmc_t *s = c->shm;
    if (__builtin_expect(++s->place_n >= PLACE_EVERY, 0)) {
        s->place_n = 0;
        if (s->size > 1 && !s->oversub) time_place(s);
    }
    size_t len = line_of(s, s->rank, s->line_seq)->len, head = offsetof(line_t, blob);
    if (s->place > 0 || len > (s->place == 0 ? 128 : 64) - head) return;
    const char *l = (const char *)line_of(s, s->rank, s->line_seq + 1);
    prefetch_for_write(s, l);
    prefetch_for_write(s, l + 64);
}

/* In a run of rooted collectives the peers read this rank's lines late:
 * a reader its sender's line when it gets to that exchange, a sender its
 * readers' lines when it compares them (see "checking"). So the line this
 * rank posts a few exchanges from now is usually still in a peer's
 * cache, and that post's first store would wait for the peer's copy to
 * be invalidated: with the CPUs far apart, a cache-line round trip on
 * every call, which was most of a rooted 8-byte collective's time. Fetched
 * for writing now, that happens between the calls. Two exchanges ahead,
 * not the next one (a reader may be about to poll it) nor farther (both
 * measured slower, far); the sequence's cache line only, after a blob
 * that fitted it: fetching a longer blob's lines too was slower at
 * 64 B and mixed at 256 B. docs/pg.md has the figures. */
void tdist__shmc_prepare_rooted(const tdist__coll_ctx_t *c)
{
    const tdist__shmc_t *s = c->shm;
    if (offsetof(line_t, blob) + line_of(s, s->rank, s->line_seq)->len > 64) return;
    prefetch_for_write(s, (const char *)line_of(s, s->rank, s->line_seq + ROOTED_AHEAD));
}

tdist_status_t tdist__shmc_gather_one(const tdist__coll_ctx_t *c, int r, const uint8_t **blob)
{
    tdist__shmc_t *s = c->shm;
    const atomic_uint_least64_t *seq = &line_of(s, r, s->line_seq)->seq;
    int polls = c->spin && !s->oversub ? QUICK_ROUNDS : 0; /* as tdist__shmc_gather */
    for (int i = 0; i < polls && atomic_load_explicit(seq, memory_order_acquire) < s->line_seq; i++)
        tdist__cpu_relax();
    if (atomic_load_explicit(seq, memory_order_acquire) < s->line_seq) {
        /* before waiting: did a rank already find an earlier difference? */
        TDIST_CHECK(check_earlier(s, TDIST_OK));
        TDIST_CHECK(check_earlier(s, wait_for(c, W_LINE, s->line_seq, r)));
    }
    *blob = tdist__shmc_peek(c, r, NULL);
    if (!*blob)
        return tdist__error(TDIST_ERR_INTERNAL, "rank %d: shm exchange %llu: rank %d is "
                            "already past it", s->rank, (unsigned long long)s->line_seq, r);
    /* Two ranks: the caller's comparison of r's hash is this exchange's
     * whole comparison (the group fails if it differs) */
    if (s->size == 2 && r != s->rank && s->verified + 1 == s->line_seq) s->verified = s->line_seq;
    return TDIST_OK;
}

/* ---------------------------------------------------- staged reduction */

/* Rank q's slice [*lo, *hi) of a chunk of e elements (64-byte aligned). */
static void slice_of(size_t e, int n, int q, size_t es, size_t *lo, size_t *hi)
{
    size_t align = es >= 64 ? 1 : 64 / es;
    size_t per = (e + (size_t)n - 1) / (size_t)n;
    per = (per + align - 1) / align * align;
    size_t l = per * (size_t)q;
    *lo = l < e ? l : e;
    *hi = l + per < e ? l + per : e;
}

/* ------------------------------------------------- streaming the staging */

/* Copy n bytes into a staging slot with streaming (non-temporal) stores
 * when the CPU has them and dst is 16-byte aligned (every slice is): the
 * data goes to memory instead of staying dirty in this CPU's cache, where
 * a reader on a far CPU would have to pull it line by line. The caller
 * fences (stream_fence) before it publishes. */
static void stream_copy(void *dst, const void *src, size_t n)
{
#if defined(__SSE2__)
    uint8_t *d = dst;
    const uint8_t *x = src;
    if ((uintptr_t)d % 16 == 0) {
        size_t i = 0;
        for (; i + 64 <= n; i += 64) {
            __m128i a0 = _mm_loadu_si128((const __m128i *)(const void *)(x + i));
            __m128i a1 = _mm_loadu_si128((const __m128i *)(const void *)(x + i + 16));
            __m128i a2 = _mm_loadu_si128((const __m128i *)(const void *)(x + i + 32));
            __m128i a3 = _mm_loadu_si128((const __m128i *)(const void *)(x + i + 48));
            _mm_stream_si128((__m128i *)(void *)(d + i), a0);
            _mm_stream_si128((__m128i *)(void *)(d + i + 16), a1);
            _mm_stream_si128((__m128i *)(void *)(d + i + 32), a2);
            _mm_stream_si128((__m128i *)(void *)(d + i + 48), a3);
        }
        if (i < n) memcpy(d + i, x + i, n - i);
        return;
    }
#endif
    memcpy(dst, src, n);
}

/* Streaming stores are weakly ordered: without this fence a peer could
 * see the counter before the data. */
static void stream_fence(void)
{
#if defined(__SSE2__)
    _mm_sfence();
#endif
}

/* Time PROBE_ROUNDS line exchanges back to back. Ranks leave one
 * exchange a little apart, so a single exchange may look faster than a
 * round trip: *ns = the mean of the timed ones (after the first, which
 * absorbs the ranks' different arrival times) without the slowest (an
 * interrupt), or 0 when one needed more than a short poll (a peer was
 * descheduled: no figure). Every rank of the group calls it at the same
 * point (it takes line exchanges), so the caller's condition must be one
 * all ranks share. */
static tdist_status_t probe(const tdist__coll_ctx_t *c, uint64_t *ns)
{
    tdist__shmc_t *s = c->shm;
    uint64_t t = tdist__now_ns(), sum = 0, worst = 0;
    bool timed = true;
    for (int i = 0; i < PROBE_ROUNDS; i++) {
        uint8_t *blob = NULL;
        TDIST_CHECK(tdist__shmc_begin(c, &blob, NULL));
        tdist__shmc_post(c, 0, 0);
        bool polled = false; /* if not, no figure this time: the rest just exchange */
        TDIST_CHECK(await_lines(c, s->line_seq, timed ? PROBE_POLLS : 0, &polled));
        timed = timed && polled;
        uint64_t now = tdist__now_ns(), d = now - t;
        t = now;
        if (i == 0) continue;
        sum += d;
        if (d > worst) worst = d;
    }
    *ns = timed ? (sum - worst) / (PROBE_ROUNDS - 2) : 0;
    return TDIST_OK;
}

/* Whether this rank writes its staged and reduced slices with streaming
 * stores (TDIST_SHM_STREAM: auto, on, off). They pay when the ranks'
 * CPUs are far apart, and cost 10-30% when they are near, where a reader
 * gets the lines from a shared cache. On the 2-vCPU test VM the
 * hypervisor flips between a near placement (probe ~75 ns, 8-byte
 * all_reduce floor ~80 ns) and a far one (probe ~220 ns, floor ~430 ns);
 * far, 2 ranks took 4 MiB in 2.1-2.3 ms without streaming and 1.06-1.10
 * ms with it, 64 MiB 33-34 ms and 20-21 ms; near, the probe costs
 * nothing measurable (docs/pg.md).
 * Each rank decides for its own stores alone, so ranks need not agree;
 * only whether to probe must be the same everywhere (the size, and the
 * group's oversubscription, which every rank computes alike; not the
 * environment). A call below 1 MiB keeps the last verdict.
 * With ranks sharing CPUs the probe would time context switches: there
 * is no verdict here (auto says no), the all_reduce measures in its first
 * chunk instead (time_reads) and streams only the staged slices whose
 * reader runs on another CPU (a reduced slice is read by every rank, some
 * on this CPU), and a broadcast streams only when on. */
static tdist_status_t pick_stream(const tdist__coll_ctx_t *c, size_t bytes, bool *stream)
{
    tdist__shmc_t *s = c->shm;
    if (bytes >= PROBE_MIN && !s->oversub) {
        uint64_t ns = 0;
        TDIST_CHECK(probe(c, &ns));
        if (ns) s->stream = ns > TDIST_SHMC_FAR_NS;
    }
    *stream = s->stream_mode == STREAM_ON || (s->stream_mode == STREAM_AUTO && s->stream);
    return TDIST_OK;
}

typedef struct red_job {
    bool stream;  /* stage with streaming stores */
    bool oversub; /* ranks share CPUs: stream only slices read on another CPU */
    bool measure; /* oversub, auto: chunk 0 is staged plainly and its reads timed */
    const uint8_t *sb;
    uint8_t *rb; /* NULL: no output on this rank */
    size_t count, cap, es;
    tdist_dtype_t dtype;
    tdist_redop_t op;
    double premul;
    uint64_t g0;
    const tdist__shmc_conv_t *conv; /* converted input and output, or NULL */
} red_job_t;

/* PREMUL_SUM on f32/f64 scales while it sums: x * f is computed exactly as
 * tdist_scale does ((float)((double)x * f) for f32), then added in rank
 * order as tdist_reduce's SUM does, so the bits equal scale-then-sum
 * without a staging copy of the own slice or a separate scaling pass. */
static bool premul_fused(const red_job_t *j)
{
    return j->op == TDIST_PREMUL_SUM && (j->dtype == TDIST_F32 || j->dtype == TDIST_F64) &&
           (uintptr_t)j->sb % j->es == 0; /* the own slice is read in place */
}

static void premul_add(void *dst, const void *a, const void *b, size_t n, tdist_dtype_t dt,
                       double f, bool first)
{
    int ex;
    if (dt == TDIST_F32 && frexp(f, &ex) == 0.5 && ex > -100 && ex < 100) {
        /* a power of two (1/world size for 2, 4, 8 ranks): x * f is exact
         * before the one rounding either way, so float arithmetic gives
         * the same bits and vectorises without conversions */
        float *restrict d = dst;
        const float *x = a, *y = b;
        float ff = (float)f;
        if (first)
            for (size_t i = 0; i < n; i++) d[i] = x[i] * ff + y[i] * ff;
        else
            for (size_t i = 0; i < n; i++) d[i] = d[i] + y[i] * ff;
    } else if (dt == TDIST_F32) {
        float *restrict d = dst;
        const float *x = a, *y = b;
        if (first)
            for (size_t i = 0; i < n; i++) d[i] = (float)((double)x[i] * f) + (float)((double)y[i] * f);
        else
            for (size_t i = 0; i < n; i++) d[i] = d[i] + (float)((double)y[i] * f);
    } else {
        double *restrict d = dst;
        const double *x = a, *y = b;
        if (first)
            for (size_t i = 0; i < n; i++) d[i] = x[i] * f + y[i] * f;
        else
            for (size_t i = 0; i < n; i++) d[i] = d[i] + y[i] * f;
    }
}

static tdist_status_t stage_chunk(const tdist__coll_ctx_t *c, const red_job_t *j, size_t k)
{
    tdist__shmc_t *s = c->shm;
    uint64_t g = j->g0 + k;
    if (g >= SLOTS - 1) TDIST_CHECK(wait_for(c, W_OUT, g - (SLOTS - 1), -1));
    size_t off = k * j->cap, e = TDIST_MIN(j->cap, j->count - off);
    uint8_t *slot = slot_of(s, s->rank, g);
    const uint8_t *src = j->sb ? j->sb + off * j->es : NULL; /* NULL: converted */
    bool pm = j->op == TDIST_PREMUL_SUM && !premul_fused(j), fence = false;
    int here = j->stream && j->oversub ? tdist__tp_cpu_of(s->tp, s->rank) : -1;
    for (int q = 0; q < s->size; q++) {
        if (q == s->rank && !pm && !j->conv) continue;
        size_t lo, hi;
        slice_of(e, s->size, q, j->es, &lo, &hi);
        if (hi <= lo) continue;
        if (j->conv) { /* converted: every slice, this rank's too */
            j->conv->load(j->conv->arg, slot + lo * j->es, off + lo, hi - lo);
            continue;
        }
        /* slice q has one reader, rank q: when it shares this CPU, the
         * slice is best left in the cache */
        bool st = j->stream && !pm &&
                  (!j->oversub || here < 0 || tdist__tp_cpu_of(s->tp, q) != here);
        if (st)
            stream_copy(slot + lo * j->es, src + lo * j->es, (hi - lo) * j->es);
        else
            memcpy(slot + lo * j->es, src + lo * j->es, (hi - lo) * j->es);
        fence = fence || st;
    }
    if (fence) stream_fence();
    if (pm && e) TDIST_CHECK(tdist_scale(slot, e, j->dtype, j->premul));
    publish(c, &ctl_of(s, s->rank)->in, g + 1);
    return TDIST_OK;
}

/* Ranks sharing CPUs (the exchange probe would time context switches):
 * time the first TIMED_BYTES of what each rank on another CPU staged for
 * this rank in the call's first chunk (staged plainly: the lines are
 * dirty in the writer's cache) with one load per cache line, the lines
 * the reduce reads next anyway. The fastest read decides (an interrupted
 * one only looks slower); the verdict picks streaming for this rank's own
 * stores from the next chunk on (the CPU pair costs the same both ways). */
static void time_reads(const tdist__coll_ctx_t *c, red_job_t *j, uint64_t g, size_t b, size_t n)
{
    const tdist__shmc_t *s = c->shm;
    int here = tdist__tp_cpu_of(s->tp, s->rank);
    uint64_t best = UINT64_MAX;
    size_t len = TIMED_BYTES;
    if (here < 0 || n < len) return;
    for (int q = 0; q < s->size; q++) {
        int there = q == s->rank ? -1 : tdist__tp_cpu_of(s->tp, q);
        if (there < 0 || there == here) continue;
        const volatile uint64_t *p = (const volatile uint64_t *)(const void *)(slot_of(s, q, g) + b);
        uint64_t t0 = tdist__now_ns(), sum = 0;
        for (size_t i = 0; i < len / 8; i += 8) sum += p[i];
        uint64_t dt = tdist__now_ns() - t0;
        (void)sum;
        if (dt < best) best = dt;
    }
    if (best != UINT64_MAX) j->stream = best * 1024 > TDIST_SHMC_FAR_NS_PER_KIB * len;
}

static tdist_status_t reduce_chunk(const tdist__coll_ctx_t *c, red_job_t *j, size_t k)
{
    tdist__shmc_t *s = c->shm;
    uint64_t g = j->g0 + k;
    size_t off = k * j->cap, e = TDIST_MIN(j->cap, j->count - off);
    size_t lo, hi;
    slice_of(e, s->size, s->rank, j->es, &lo, &hi);
    TDIST_CHECK(wait_for(c, W_IN, g + 1, -1));
    if (k == 0 && j->measure && hi > lo) time_reads(c, j, g, lo * j->es, (hi - lo) * j->es);
    if (hi > lo && premul_fused(j)) {
        size_t b = lo * j->es, m = hi - lo;
        uint8_t *dst = slot_of(s, s->rank, g) + b;
        const uint8_t *own = j->sb + off * j->es + b;
        const uint8_t *a = s->rank == 0 ? own : slot_of(s, 0, g) + b;
        const uint8_t *bb = s->rank == 1 ? own : slot_of(s, 1, g) + b;
        premul_add(dst, a, bb, m, j->dtype, j->premul, true);
        for (int q = 2; q < s->size; q++)
            premul_add(dst, NULL, q == s->rank ? own : slot_of(s, q, g) + b, m, j->dtype,
                       j->premul, false);
    } else if (hi > lo) {
        bool pm = j->op == TDIST_PREMUL_SUM || j->conv; /* own slice staged in the slot */
        size_t b = lo * j->es, m = hi - lo;
        uint8_t *dst = slot_of(s, s->rank, g) + b;
        /* PREMUL_SUM staged (and scaled) this rank's slice in dst itself:
         * ranks >= 2 would overwrite it before adding it, so they sum into
         * scratch and copy. */
        const uint8_t *own = pm ? dst : j->sb + off * j->es + b;
        uint8_t *acc = pm && s->rank >= 2 ? s->scratch : dst;
        /* streaming: reduce a block at a time in a buffer that stays in
         * L1, then stream it into the slot */
        _Alignas(64) uint8_t blk[4096];
        bool st = j->stream && !pm && !j->oversub; /* read by every rank: not when they share CPUs */
        size_t step = st ? sizeof blk / j->es : m;
        for (size_t i = 0; i < m; i += step) {
            size_t n = TDIST_MIN(step, m - i), at = i * j->es;
            uint8_t *to = st ? blk : acc + at;
            const uint8_t *a = (s->rank == 0 ? own : slot_of(s, 0, g) + b) + at;
            const uint8_t *bb = (s->rank == 1 ? own : slot_of(s, 1, g) + b) + at;
            TDIST_CHECK(tdist_reduce(to, a, bb, n, j->dtype, j->op));
            for (int q = 2; q < s->size; q++) {
                const uint8_t *x = (q == s->rank ? own : slot_of(s, q, g) + b) + at;
                TDIST_CHECK(tdist_reduce(to, to, x, n, j->dtype, j->op));
            }
            if (st && j->op == TDIST_AVG) TDIST_CHECK(tdist_divide(blk, n, j->dtype, s->size));
            if (st) stream_copy(dst + at, blk, n * j->es);
        }
        if (st) {
            stream_fence();
        } else {
            if (acc != dst) memcpy(dst, acc, m * j->es);
            if (j->op == TDIST_AVG) TDIST_CHECK(tdist_divide(dst, m, j->dtype, s->size));
        }
    }
    publish(c, &ctl_of(s, s->rank)->red, g + 1);
    return TDIST_OK;
}

static tdist_status_t copy_chunk(const tdist__coll_ctx_t *c, const red_job_t *j, size_t k)
{
    tdist__shmc_t *s = c->shm;
    uint64_t g = j->g0 + k;
    size_t off = k * j->cap, e = TDIST_MIN(j->cap, j->count - off);
    TDIST_CHECK(wait_for(c, W_RED, g + 1, -1));
    for (int q = 0; j->conv && q < s->size; q++) {
        size_t lo, hi;
        slice_of(e, s->size, q, j->es, &lo, &hi);
        if (hi > lo) j->conv->store(j->conv->arg, slot_of(s, q, g) + lo * j->es, off + lo, hi - lo);
    }
    if (j->rb) {
        uint8_t *dst = j->rb + off * j->es;
        for (int q = 0; q < s->size; q++) {
            size_t lo, hi;
            slice_of(e, s->size, q, j->es, &lo, &hi);
            if (hi > lo)
                memcpy(dst + lo * j->es, slot_of(s, q, g) + lo * j->es, (hi - lo) * j->es);
        }
    }
    publish(c, &ctl_of(s, s->rank)->out, g + 1);
    return TDIST_OK;
}

static tdist_status_t run_job(const tdist__coll_ctx_t *c, red_job_t j)
{
    tdist__shmc_t *s = c->shm;
    size_t count = j.count;
    j.g0 = s->chunks;
    j.cap = CHUNK / j.es;
    size_t nk = (count + j.cap - 1) / j.cap;
    j.oversub = s->oversub;
    TDIST_CHECK(pick_stream(c, count * j.es, &j.stream));
    j.measure = j.oversub && s->stream_mode == STREAM_AUTO; /* pick_stream said no */
    tdist_status_t st = stage_chunk(c, &j, 0);
    for (size_t k = 0; k < nk && st == TDIST_OK; k++) {
        st = reduce_chunk(c, &j, k);
        if (st == TDIST_OK && k + 1 < nk) st = stage_chunk(c, &j, k + 1);
        if (st == TDIST_OK && k >= 1) st = copy_chunk(c, &j, k - 1);
    }
    if (st == TDIST_OK) st = copy_chunk(c, &j, nk - 1);
    s->chunks = j.g0 + nk;
    return st;
}

tdist_status_t tdist__shmc_all_reduce(const tdist__coll_ctx_t *c, const void *sendbuf,
                                      void *recvbuf, size_t count, tdist_dtype_t dtype,
                                      tdist_redop_t op, double premul, int root)
{
    if (count == 0) return TDIST_OK;
    int me = c->shm->rank;
    return run_job(c, (red_job_t){.sb = sendbuf, .rb = (root < 0 || root == me) ? recvbuf : NULL,
                                  .count = count, .es = tdist_dtype_size(dtype), .dtype = dtype,
                                  .op = op, .premul = premul});
}

tdist_status_t tdist__shmc_all_reduce_conv(const tdist__coll_ctx_t *c, size_t count,
                                           tdist_dtype_t dtype, tdist_redop_t op,
                                           const tdist__shmc_conv_t *conv)
{
    if (count == 0) return TDIST_OK;
    return run_job(c, (red_job_t){.count = count, .es = tdist_dtype_size(dtype), .dtype = dtype,
                                  .op = op, .premul = 1.0, .conv = conv});
}

/* ------------------------------------------------------ one-shot small */

size_t tdist__shmc_small_max(void) { return CHUNK; }

/* A one-shot collective staging up to SUB bytes a rank uses the
 * exchange's sub-slot (one of LINES, a page each, carved from the first
 * slot), so a rooted sender can run as far ahead as its lines allow; a
 * larger one uses the exchange's whole slot (one of SLOTS), which stays
 * warm: sub-slots for larger data would cycle through a MiB of pages,
 * faulting each in on first use and leaving readers cold caches. */
#define SUB ((size_t)4096)
#define AHEAD (128u * 1024u)
_Static_assert(SUB * LINES <= SLOTS * (size_t)CHUNK, "sub-slots within the slots");

size_t tdist__shmc_rooted_max(void) { return SUB; }

/* The sub-slot of exchange seq: its own, or, for a collective every rank
 * waits for every line of, one of the first two in turn (no sender runs
 * ahead there, and two pages stay warm where LINES of them would not:
 * a 512-byte all_reduce took 35 ns longer cycling through 64 pages). */
static size_t sub_index(uint64_t seq, bool every_waits)
{
    return (size_t)(seq & (every_waits ? 1 : LINES - 1));
}

static uint8_t *oneshot_slot(const tdist__shmc_t *s, int r, uint64_t seq, size_t bytes,
                             bool every_waits)
{
    if (bytes <= SUB) return s->area[r] + STAGE_OFF + sub_index(seq, every_waits) * SUB;
    return slot_of(s, r, seq);
}

tdist_status_t tdist__shmc_stage_slot(const tdist__coll_ctx_t *c, size_t bytes, bool every_waits,
                                      uint8_t **slot)
{
    tdist__shmc_t *s = c->shm;
    /* the peers may still copy out of this rank's slots after the last
     * staged collective: wait until they are done with every chunk */
    TDIST_CHECK(wait_for(c, W_OUT, s->chunks, -1));
    /* and with the exchange that used this slot last (a rooted
     * collective's sender may be ahead; see "checking") */
    uint64_t n = s->line_seq + 1, target;
    if (bytes <= SUB) {
        /* the sub-slot's last use, the whole slot's over it, and at most
         * AHEAD bytes staged ahead of the slowest reader (further, the
         * readers would find them gone from the caches) */
        uint64_t depth = TDIST_MAX((uint64_t)2, TDIST_MIN((uint64_t)LINES, AHEAD / bytes));
        size_t i = sub_index(n, every_waits), r = i * SUB / CHUNK;
        target = TDIST_MAX(n > depth ? n - depth : 0, s->whole_at[r]);
        target = TDIST_MAX(target, s->sub_last[i]);
        s->sub_at[r] = n;
        s->sub_last[i] = n;
    } else {
        size_t r = (size_t)(n % SLOTS);
        target = TDIST_MAX(n > SLOTS ? n - SLOTS : 0, s->sub_at[r]);
        s->whole_at[r] = n;
    }
    if (!may_write_known(s, target)) TDIST_CHECK(reserve(c, target));
    *slot = oneshot_slot(s, s->rank, n, bytes, every_waits);
    return TDIST_OK;
}

const uint8_t *tdist__shmc_slot(const tdist__coll_ctx_t *c, int r, size_t bytes,
                                bool every_waits)
{
    const tdist__shmc_t *s = c->shm;
    /* the exchange that published the slots */
    return oneshot_slot(s, r, s->line_seq, bytes, every_waits);
}

tdist_status_t tdist__shmc_broadcast(const tdist__coll_ctx_t *c, void *buf, size_t count,
                                     tdist_dtype_t dtype, int root)
{
    tdist__shmc_t *s = c->shm;
    size_t bytes = tdist__coll_bytes(count, dtype);
    if (bytes == 0) return TDIST_OK;
    size_t nk = (bytes + CHUNK - 1) / CHUNK;
    bool stream = false; /* the root's stores; every rank takes part in the probe */
    TDIST_CHECK(pick_stream(c, bytes, &stream)); /* sharing CPUs: only when on */
    uint64_t g0 = s->chunks;
    ctl_t *me = ctl_of(s, s->rank);
    uint8_t *b = buf;
    tdist_status_t st = TDIST_OK;
    for (size_t k = 0; k < nk && st == TDIST_OK; k++) {
        uint64_t g = g0 + k;
        size_t off = k * CHUNK, len = TDIST_MIN((size_t)CHUNK, bytes - off);
        if (s->rank == root) {
            if (g >= SLOTS - 1) st = wait_for(c, W_OUT, g - (SLOTS - 1), -1);
            if (st != TDIST_OK) break;
            if (stream) {
                stream_copy(slot_of(s, root, g), b + off, len);
                stream_fence();
            } else {
                memcpy(slot_of(s, root, g), b + off, len);
            }
            atomic_store_explicit(&me->red, g + 1, memory_order_relaxed);
            atomic_store_explicit(&me->out, g + 1, memory_order_relaxed);
            publish(c, &me->in, g + 1);
        } else {
            st = wait_for(c, W_IN, g + 1, root);
            if (st != TDIST_OK) break;
            memcpy(b + off, slot_of(s, root, g), len);
            atomic_store_explicit(&me->in, g + 1, memory_order_relaxed);
            atomic_store_explicit(&me->red, g + 1, memory_order_relaxed);
            publish(c, &me->out, g + 1);
        }
    }
    s->chunks = g0 + nk;
    return st;
}

/* ------------------------------------------------ staged reduce_scatter */

/* reduce_scatter through the staging slots. Chunk k of the call holds
 * piece k of every block q of the rank's input (pcap elements each,
 * 64-byte aligned, block q's piece at q * pcap in the slot, where rank q
 * reads it): every rank stages piece k of
 * every block but its own (read in place), and rank q then reduces piece
 * k of block q over the ranks' slots in rank order, straight into its
 * output — no copy-out step, no buffer of the whole input: each rank
 * moves (size - 1)/size of its input once and reads its own block's
 * pieces from every peer once. Each element is reduced by one rank in
 * rank order, as the one-shot reduce_scatter and the staged all_reduce
 * do (the same bits). The counters follow the all_reduce's: in = staged,
 * red = out = this rank has read every peer's slot of the chunk. */
typedef struct rs_job {
    red_job_t r;     /* sb, es, dtype, op, premul, g0, stream, oversub */
    uint8_t *out;    /* this rank's block of the result */
    size_t rcount;   /* elements of a block */
    size_t pcap;     /* elements of a block's piece in one chunk */
    bool stage_own;  /* own piece staged too (PREMUL_SUM scaled there, or out aliases it) */
} rs_job_t;

/* PREMUL_SUM on f32/f64 scales while it sums (premul_add): every rank
 * stages its pieces unscaled. Other dtypes stage scaled copies. Every rank
 * must decide alike (its pieces are read by the others). */
static bool rs_fused(const rs_job_t *j)
{
    return j->r.op == TDIST_PREMUL_SUM && (j->r.dtype == TDIST_F32 || j->r.dtype == TDIST_F64);
}

static const uint8_t *rs_piece(const tdist__coll_ctx_t *c, const rs_job_t *j, int q, size_t k)
{
    const tdist__shmc_t *s = c->shm;
    if (q == s->rank && !j->stage_own)
        return j->r.sb + ((size_t)q * j->rcount + k * j->pcap) * j->r.es;
    return slot_of(s, q, j->r.g0 + k) + (size_t)s->rank * j->pcap * j->r.es;
}

static tdist_status_t rs_stage(const tdist__coll_ctx_t *c, const rs_job_t *j, size_t k)
{
    tdist__shmc_t *s = c->shm;
    uint64_t g = j->r.g0 + k;
    if (g >= SLOTS - 1) TDIST_CHECK(wait_for(c, W_OUT, g - (SLOTS - 1), -1));
    size_t es = j->r.es, off = k * j->pcap, e = TDIST_MIN(j->pcap, j->rcount - off);
    bool pm = j->r.op == TDIST_PREMUL_SUM && !rs_fused(j), fence = false;
    uint8_t *slot = slot_of(s, s->rank, g);
    int here = j->r.stream && j->r.oversub ? tdist__tp_cpu_of(s->tp, s->rank) : -1;
    for (int q = 0; q < s->size; q++) {
        if (q == s->rank && !j->stage_own) continue;
        uint8_t *dst = slot + (size_t)q * j->pcap * es;
        const uint8_t *src = j->r.sb + ((size_t)q * j->rcount + off) * es;
        /* piece q has one reader, rank q (see stage_chunk) */
        bool st = j->r.stream && !pm && q != s->rank &&
                  (!j->r.oversub || here < 0 || tdist__tp_cpu_of(s->tp, q) != here);
        if (st)
            stream_copy(dst, src, e * es);
        else
            memcpy(dst, src, e * es);
        fence = fence || st;
        if (pm) TDIST_CHECK(tdist_scale(dst, e, j->r.dtype, j->r.premul));
    }
    if (fence) stream_fence();
    publish(c, &ctl_of(s, s->rank)->in, g + 1);
    return TDIST_OK;
}

static tdist_status_t rs_reduce(const tdist__coll_ctx_t *c, const rs_job_t *j, size_t k)
{
    tdist__shmc_t *s = c->shm;
    uint64_t g = j->r.g0 + k;
    size_t off = k * j->pcap, e = TDIST_MIN(j->pcap, j->rcount - off);
    uint8_t *dst = j->out + off * j->r.es;
    TDIST_CHECK(wait_for(c, W_IN, g + 1, -1));
    if (rs_fused(j)) {
        /* premul_add stores whole elements: an unaligned output gets them
         * through a block that stays in L1 */
        _Alignas(64) uint8_t blk[4096];
        size_t es = j->r.es, step = (uintptr_t)dst % es == 0 ? e : sizeof blk / es;
        for (size_t i = 0; i < e; i += step) {
            size_t m = TDIST_MIN(step, e - i), at = i * es;
            uint8_t *to = step == e ? dst : blk;
            premul_add(to, rs_piece(c, j, 0, k) + at, rs_piece(c, j, 1, k) + at, m, j->r.dtype,
                       j->r.premul, true);
            for (int q = 2; q < s->size; q++)
                premul_add(to, NULL, rs_piece(c, j, q, k) + at, m, j->r.dtype, j->r.premul, false);
            if (to != dst) memcpy(dst + at, blk, m * es);
        }
    } else {
        TDIST_CHECK(tdist_reduce(dst, rs_piece(c, j, 0, k), rs_piece(c, j, 1, k), e, j->r.dtype,
                                 j->r.op));
        for (int q = 2; q < s->size; q++)
            TDIST_CHECK(tdist_reduce(dst, dst, rs_piece(c, j, q, k), e, j->r.dtype, j->r.op));
        if (j->r.op == TDIST_AVG) TDIST_CHECK(tdist_divide(dst, e, j->r.dtype, s->size));
    }
    atomic_store_explicit(&ctl_of(s, s->rank)->red, g + 1, memory_order_relaxed);
    publish(c, &ctl_of(s, s->rank)->out, g + 1);
    return TDIST_OK;
}

bool tdist__shmc_reduce_scatter_fits(int size) { return (size_t)size * 64u <= CHUNK; }

tdist_status_t tdist__shmc_reduce_scatter(const tdist__coll_ctx_t *c, const void *sendbuf,
                                          void *recvbuf, size_t recvcount, tdist_dtype_t dtype,
                                          tdist_redop_t op, double premul)
{
    tdist__shmc_t *s = c->shm;
    if (recvcount == 0) return TDIST_OK;
    size_t es = tdist_dtype_size(dtype), n = (size_t)s->size, total = n * recvcount * es;
    rs_job_t j = {.r = {.sb = sendbuf, .es = es, .dtype = dtype, .op = op, .premul = premul,
                        .g0 = s->chunks, .oversub = s->oversub},
                  .out = recvbuf, .rcount = recvcount};
    size_t align = es >= 64 ? 1 : 64 / es;
    j.pcap = TDIST_MAX(CHUNK / n / es / align * align, (size_t)1);
    size_t nk = (recvcount + j.pcap - 1) / j.pcap;
    /* the output may be this rank's own block of the input (in place):
     * its pieces are then staged before they are overwritten. Any other
     * overlap reads a private copy of the input (this rank's choice
     * alone: the protocol is the same). */
    const uint8_t *in = sendbuf, *o = recvbuf;
    void *copy = NULL;
    if (o == in + (size_t)s->rank * recvcount * es) {
        j.stage_own = true;
    } else if (o < in + total && in < o + recvcount * es) {
        TDIST_CHECK(tdist__coll_alloc(c, total, "reduce_scatter's input", &copy));
        memcpy(copy, sendbuf, total);
        j.r.sb = copy;
    }
    /* PREMUL_SUM reads its own piece scaled like the others' (staged),
     * or, scaling while it sums, aligned (staged when it is not) */
    if (op == TDIST_PREMUL_SUM && (!rs_fused(&j) || (uintptr_t)j.r.sb % es != 0))
        j.stage_own = true;
    tdist_status_t st = pick_stream(c, total, &j.r.stream);
    if (st == TDIST_OK) st = rs_stage(c, &j, 0);
    for (size_t k = 0; k < nk && st == TDIST_OK; k++) {
        if (k + 1 < nk) st = rs_stage(c, &j, k + 1);
        if (st == TDIST_OK) st = rs_reduce(c, &j, k);
    }
    s->chunks = j.r.g0 + nk;
    free(copy);
    return st;
}
