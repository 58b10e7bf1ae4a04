/*
 * transport/transport.h — point-to-point byte channels between the ranks of
 * one group (internal to tdist; used by coll/ and pg/).
 *
 * A transport joins `size` ranks in a full mesh of ordered, reliable byte
 * channels. It never talks to the store (docs/design.md: transport talks
 * to core only): set-up is two-phase, and the caller (pg/) exchanges the
 * addresses.
 *
 *     tdist__tp_t *tp;
 *     tdist__tp_listen(TDIST__TP_TCP, rank, size, &opts, &tp);
 *     publish tdist__tp_address(tp); gather every rank's address;
 *     tdist__tp_connect(tp, addrs, deadline_ms);
 *     ... post / progress / wait ...
 *     tdist__tp_destroy(tp);
 *
 * Ordering: between one pair of ranks, bytes arrive in the order they were
 * posted for sending; receives posted for one peer are filled in post
 * order from that peer's byte stream. There are no tags: the layer above
 * keeps both sides in one order (rule 1), and checks fingerprints (rule 2).
 * Bytes that arrive with no receive posted stay in the kernel (no
 * read-ahead): the sender stalls until the receiver posts, so the caller
 * must not make a send wait on a receive the peer only posts later.
 *
 * Failures are sticky: once a channel fails (peer closed, reset, protocol
 * violation) or the transport is aborted, every pending and later request
 * fails, with a message naming this rank, the peer rank and its address
 * ("rank 1: peer rank 3 (127.0.0.1:40111) closed the connection ...").
 * The first failure wins. A peer that closes a channel while nothing is
 * posted to or from it is noted, not an error (it may have finished and
 * left): the error comes when a request needs that peer.
 * See docs/transport.md for the handshake, ordering and failure model.
 *
 * Threads: one thread drives a transport (posts, progress, wait);
 * tdist__tp_abort may be called from any thread.
 */
#ifndef TDIST_TRANSPORT_H
#define TDIST_TRANSPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/internal.h"

typedef enum tdist__tp_kind {
    TDIST__TP_TCP = 0, /* sockets: between hosts, or forced with TDIST_TRANSPORT=tcp */
    TDIST__TP_SHM = 1, /* shared memory: ranks on one host (transport/shm.c) */
} tdist__tp_kind_t;

typedef struct tdist__tp tdist__tp_t;

typedef struct tdist__tp_opts {
    /* TCP: address to listen on and to publish ("127.0.0.1", "10.0.0.2",
     * "::1"). Required; the port is always picked by the kernel. */
    const char *bind_addr;
    /* A tag both sides check in the connection handshake (e.g. a hash of
     * the job, group and generation), so a stray or stale connection is
     * refused rather than spliced into the mesh. */
    uint64_t tag;
    /* SHM: bytes of each directed ring (sender -> receiver), rounded up to
     * a power of two >= 4096, at most 1 GiB; 0 means the default, 1 MiB.
     * TCP ignores it. SHM ignores bind_addr (may be NULL). */
    size_t shm_ring_bytes;
    /* SHM: bytes of a collective area at the end of this rank's segment,
     * which every peer maps (tdist__tp_shm_area); rounded up to 4096;
     * 0: none. Every rank of the mesh must pass the same value (checked
     * at connect). coll/ lays it out; TCP ignores it. */
    size_t shm_coll_bytes;
} tdist__tp_opts_t;

/* A send or a receive, owned by the caller, who keeps it (and its buffer)
 * alive until it is done or the transport is destroyed. Fields are the
 * transport's; read them only through the functions below. A request may
 * be reused once it is done; never post one that is still pending. */
typedef struct tdist__tp_req {
    struct tdist__tp_req *next; /* queue of its peer and direction */
    uint8_t *buf;
    size_t len, done;
    int peer;
    bool is_send;
    bool finished;
    tdist_status_t status;
} tdist__tp_req_t;

/* Open this rank's end. TCP: listen on opts->bind_addr (a numeric IPv4 or
 * IPv6 literal; brackets allowed), port 0. SHM: create this rank's inbound
 * segment (/dev/shm/tdist-<pid>-<random>, unlinked by connect once every
 * peer mapped it, or by a failed connect or destroy); address "shm:/<name>:<pid>". Does not block. On success the
 * caller owns *out (tdist__tp_destroy); on failure *out is untouched.
 * Errors: TDIST_ERR_INVALID_ARG (bad rank/size/address),
 * TDIST_ERR_NOT_SUPPORTED (kind), TDIST_ERR_SYSTEM. Thread-safe (each call
 * makes its own transport). */
tdist_status_t tdist__tp_listen(tdist__tp_kind_t kind, int rank, int size,
                                const tdist__tp_opts_t *opts, tdist__tp_t **out);

/* The address peers connect to ("127.0.0.1:40215", "[::1]:40215"); owned
 * by tp, valid until tdist__tp_destroy. NULL if tp is NULL. */
const char *tdist__tp_address(const tdist__tp_t *tp);

/* Connect the mesh: addrs[r] is rank r's tdist__tp_address (addrs[rank]
 * is ignored). Every rank of the group calls it; it blocks until a
 * channel to every peer is up and has passed the handshake (rank numbers,
 * size and tag agree), or until deadline_ms (tdist__now_ms() clock), when
 * it fails naming the peers still missing. Copes with peers that start
 * late (connection refused is retried), EINTR and simultaneous set-up.
 * Pairing: rank i dials every rank j < i and accepts from every j > i, so
 * each pair gets exactly one connection. A connection whose handshake is
 * wrong (magic, version, tag, size, ranks) or that claims a rank already
 * connected is closed and logged; set-up goes on. On success the listening
 * socket is closed. Any failure (timeout, abort) is sticky: destroy tp.
 * Called once per transport, by its driving thread. */
tdist_status_t tdist__tp_connect(tdist__tp_t *tp, const char *const *addrs, int64_t deadline_ms);

/* Queue a send of len bytes of buf to peer, or a receive of exactly len
 * bytes from peer into buf. len may be 0 (done at once). Does not block;
 * makes no progress by itself. Fails at once (req untouched) on a bad
 * argument (peer must be another rank: no self channel), before
 * tdist__tp_connect succeeded, or if the transport has failed (the sticky
 * error). A send is done once its bytes are handed to the kernel, not
 * when the peer has read them. */
tdist_status_t tdist__tp_post_send(tdist__tp_t *tp, tdist__tp_req_t *req, int peer,
                                   const void *buf, size_t len);
tdist_status_t tdist__tp_post_recv(tdist__tp_t *tp, tdist__tp_req_t *req, int peer, void *buf,
                                   size_t len);

/* Move bytes for every posted request; wait up to timeout_ms (0: do not
 * wait; < 0: no limit) for at least one to advance, an idle channel to
 * close, or an abort. Returns TDIST_OK (also on EINTR), or the transport's
 * sticky error. */
tdist_status_t tdist__tp_progress(tdist__tp_t *tp, int timeout_ms);

/* Whether req has finished, and how (TDIST_OK or the error it failed
 * with; TDIST_INPROGRESS while pending). Cheap; no progress. */
bool tdist__tp_req_done(const tdist__tp_req_t *req);
tdist_status_t tdist__tp_req_status(const tdist__tp_req_t *req);

/* Progress until every one of the n requests has finished, the transport
 * fails, or deadline_ms passes (TDIST_ERR_TIMEOUT naming the peers still
 * owed bytes; the requests stay posted). */
tdist_status_t tdist__tp_wait(tdist__tp_t *tp, tdist__tp_req_t *const *reqs, size_t n,
                              int64_t deadline_ms);

/* Blocking conveniences over post + wait. Their requests live on the
 * stack, so they cannot stay posted: a timeout here fails the transport
 * (TDIST_ERR_TIMEOUT, sticky), since the streams' positions are lost. */
tdist_status_t tdist__tp_send(tdist__tp_t *tp, int peer, const void *buf, size_t len,
                              int64_t deadline_ms);
tdist_status_t tdist__tp_recv(tdist__tp_t *tp, int peer, void *buf, size_t len,
                              int64_t deadline_ms);
/* Send to one peer while receiving from another (a ring step), without
 * deadlock however large the buffers. */
tdist_status_t tdist__tp_sendrecv(tdist__tp_t *tp, int to, const void *sbuf, size_t slen,
                                  int from, void *rbuf, size_t rlen, int64_t deadline_ms);

/* ---- Shared-memory collectives (SHM only; coll/shm*.c) ----
 *
 * Each rank's segment may end in a collective area that only its owner
 * writes and every peer reads (mapped by connect). The layout is coll/'s;
 * the transport only maps it, wakes sleepers and watches liveness. */

/* Rank r's collective area as mapped in this process (r == own rank: this
 * rank's), or NULL for TCP, before connect, or without an area. *bytes
 * (may be NULL) gets its size. Cheap; no locking. */
void *tdist__tp_shm_area(tdist__tp_t *tp, int r, size_t *bytes);

/* The peer the calling thread's last wait that timed out was waiting on (a
 * receive's peer first, else a send's; shared-memory collectives set it
 * too), -1 when none since tdist__tp_set_owed_peer(-1). pg's failure path
 * reads it to follow who waits on whom. Per thread; never blocks. */
int tdist__tp_owed_peer(void);
void tdist__tp_set_owed_peer(int peer);

/* Who is waited on, while the wait lasts (the flight recorder): once a
 * wait on tp stops spinning and is about to yield or sleep, the waiting
 * thread calls fn(arg, peer) with the peer it waits on (a receive's peer
 * first, else a send's; for tdist__tp_wait_until the first rank needs()
 * names), never on a wait that its spin satisfied. fn must not block.
 * Set once, before the mesh is used; NULL fn: none. Not thread-safe. */
void tdist__tp_on_wait(tdist__tp_t *tp, void (*fn)(void *arg, int peer), void *arg);

/* tdist__tp_wait_until's flags. */
#define TDIST__WAIT_SPIN 1u /* the caller's own thread waits on a blocking call */
/* Every rank the condition waits for makes its move on its own, needing no
 * other rank's progress first (an exchange whose lines every rank posts
 * before it waits). */
#define TDIST__WAIT_SELF_MADE 2u
/* deadline_ms is a timeout (ms; < 0: none), counted from when the wait
 * stops spinning. */
#define TDIST__WAIT_TIMEOUT 4u

/* Wait until cond(arg) is true: with TDIST__WAIT_SPIN (and a CPU per
 * rank), spin up to ~20 us — the caller's own thread, waiting on a
 * blocking call; without it (a background thread, whose CPU the caller's
 * computation needs) go straight on — then sched_yield for up to ~1 ms.
 * When ranks share CPUs (tdist__tp_oversubscribed) and the wait is
 * TDIST__WAIT_SPIN | TDIST__WAIT_SELF_MADE, a rank whose awaited ranks
 * (needs) all last ran on other CPUs spins up to ~3 us instead of
 * yielding: they do not need its CPU. Then sleep on this rank's doorbell a few ms at a time (a
 * tdist__tp_notify from any peer wakes it), checking peers' liveness every
 * ~2 ms and the abort flag always. A peer that exited or closed its
 * transport fails the wait only if needs(arg, peer) says the condition
 * still waits for it (needs NULL: any lost peer fails it) — a peer may
 * finish its part of a collective and leave while others still wait for
 * slower ranks. Returns TDIST_OK once cond holds;
 * TDIST_ERR_TIMEOUT at deadline_ms (no message: the caller knows what it
 * waited for; the transport stays usable); a peer that exited or closed
 * its transport fails the transport (sticky TDIST_ERR_CONNECTION naming
 * it); abort gives TDIST_ERR_ABORTED. TDIST_ERR_NOT_SUPPORTED for TCP. */
tdist_status_t tdist__tp_wait_until(tdist__tp_t *tp, bool (*cond)(void *arg),
                                    bool (*needs)(void *arg, int peer), void *arg,
                                    int64_t deadline_ms, unsigned flags);

/* Shared memory, after connect: whether the mesh's ranks are more than the
 * CPUs they may run on together (the union of every rank's affinity), so
 * tdist__tp_wait_until yields at once instead of spinning. Ranks bound one
 * per CPU are not oversubscribed. The same on every rank of the mesh
 * (collectives may choose a protocol by it). false for TCP. Cheap; no
 * locking. */
bool tdist__tp_oversubscribed(tdist__tp_t *tp);

/* Shared memory, oversubscribed meshes: the CPU rank r last ran on, as r
 * recorded it when it last waited or notified (r == this rank: the CPU it
 * runs on now), or -1 when unknown (not recorded yet, not oversubscribed,
 * TCP). The answer may be stale by the time it is used: a hint, never a
 * guarantee. Cheap; no locking; any thread. */
int tdist__tp_cpu_of(tdist__tp_t *tp, int r);

/* After writing to this rank's collective area: wake every peer that
 * sleeps in tdist__tp_wait_until (no syscall when none sleeps). */
void tdist__tp_notify(tdist__tp_t *tp);

/* Make every pending and later call fail with TDIST_ERR_ABORTED (unless
 * the transport already failed otherwise) and wake a thread blocked in
 * connect/progress/wait (an eventfd in every poll). Any thread, also a
 * signal handler (it only sets a flag and writes the eventfd); idempotent.
 * NULL does nothing. */
void tdist__tp_abort(tdist__tp_t *tp);

/* Close every channel and free tp. Pending requests are abandoned (their
 * buffers are not touched again). Every fd the transport opened is closed.
 * NULL does nothing. Not concurrently with any other call on tp. */
void tdist__tp_destroy(tdist__tp_t *tp);

#endif /* TDIST_TRANSPORT_H */
