/*
 * transport/tcp.c — the TCP transport: a full mesh of nonblocking sockets,
 * one per pair of ranks, driven by poll() (see transport.h and
 * docs/transport.md). What every kind shares (queues, waiting, failure)
 * is transport.c's; this file sets the mesh up and moves bytes.
 *
 * Set-up: rank i connects to every rank j < i and accepts from every
 * j > i, so each pair gets exactly one connection. Three 96-byte frames
 * (header | nonce | mac) prove that both ends know the job's secret
 * (TDIST_JOB_SECRET; without one the key is empty and anyone can):
 *   dialler  -> HELLO  its header and a fresh nonce
 *   acceptor -> ACK    its header, a fresh nonce, HMAC(secret, "ack" | HELLO | ACK)
 *   dialler  -> PROOF  HMAC(secret, "proof" | HELLO | ACK)
 * The dialler checks the ACK's mac before its channel is up, the acceptor
 * the PROOF before its own is: a process without the secret can neither
 * join a mesh nor pose as a rank's listener, and the secret never crosses
 * the wire. Several connections may claim a rank while unproven; the
 * first to prove it wins. Refused connections are retried every RETRY_MS
 * until the deadline.
 *
 * Data: per peer, one FIFO of sends and one of receives. No framing on
 * the wire: a receive takes exactly its len bytes from the stream, and
 * bytes for which no receive is posted stay in the kernel (no read-ahead,
 * so the kernel's socket buffers are the only buffering and a sender
 * simply stalls until the receiver posts).
 */
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <unistd.h>

#include "core/auth.h"
#include "core/net.h"
#include "transport/ops.h"

#define HS_HDR 32     /* header: magic, version, type, tag, size, from, to */
#define HS_SIGNED 64  /* header and nonce: what the macs cover */
#define HS_LEN 96     /* header | nonce (32) | mac (32) */
#define HS_MAGIC 0x70746474u /* "tdtp" little-endian */
#define HS_VERSION 2
#define HS_HELLO 1
#define HS_ACK 2
#define HS_PROOF 3
#define RETRY_MS 50
#define MAX_INCOMING 64 /* connections accepted but not yet through the handshake */
#define ADDR_LEN TDIST__TP_LABEL_LEN /* "[<45 chars>]:65535" fits */
/* progress retries the sockets this long, yielding, before poll() */
#define SPIN_NS 1000000
#ifndef TDIST_TCP_RX_CAP
#define TDIST_TCP_RX_CAP (64u * 1024u) /* bytes a channel reads ahead of its receives */
#endif
#define RX_CAP TDIST_TCP_RX_CAP
#define RX_SMALL (16u * 1024u) /* a receive with less than this left reads ahead */
#ifndef TDIST_TCP_TX_SLICE
#define TDIST_TCP_TX_SLICE (256u * 1024u) /* bytes of a send one send() takes (drive) */
#endif
#define TX_SLICE TDIST_TCP_TX_SLICE

/* One peer's connection (its queues and label are in the shared part). */
typedef struct conn {
    int fd;           /* -1 until the handshake passed */
    bool peer_closed; /* EOF/reset seen while no receive was posted */
    /* bytes read ahead of the posted receives (drive), RX_CAP of room,
     * allocated at the first small receive: [rx_off, rx_len) are the
     * stream's next bytes */
    uint8_t *rx;
    size_t rx_off, rx_len;
} conn_t;

typedef struct tcp_tp {
    struct tdist__tp b; /* first: the shared part (ops.h) */
    int listen_fd;      /* closed once the mesh is up */
    int wake_fd;        /* eventfd written by tdist__tp_abort */
    conn_t *conn;       /* size entries; conn[rank] unused */
    char *secret;       /* the job's secret ("" when none); the handshake's key */
    uint64_t accepted;  /* connections accepted during set-up */
} tcp_tp_t;

#define TCP(t) ((tcp_tp_t *)(void *)(t))

/* ------------------------------------------------------------- helpers */

static void put_u16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static void put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get_u32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
    return v;
}

static uint64_t get_u64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* Handshake frame, 32 bytes little-endian: magic u32, version u16, type
 * u16, tag u64, size u32, from u32, to u32, reserved u32 (0). */
static void hs_encode(uint8_t *f, uint16_t type, uint64_t tag, int size, int from, int to)
{
    memset(f, 0, HS_LEN);
    if (type != HS_PROOF) tdist__random_bytes(f + HS_HDR, HS_SIGNED - HS_HDR);
    put_u32(f, HS_MAGIC);
    put_u16(f + 4, HS_VERSION);
    put_u16(f + 6, type);
    put_u64(f + 8, tag);
    put_u32(f + 16, (uint32_t)size);
    put_u32(f + 20, (uint32_t)from);
    put_u32(f + 24, (uint32_t)to);
}

/* Check a received frame's fixed fields; writes why not into why.
 * On success writes the sender's rank into *from. */
static bool hs_check(const tdist__tp_t *tp, const uint8_t *f, uint16_t type, int *from,
                     char *why, size_t n)
{
    uint32_t magic = get_u32(f);
    uint32_t ver_type = get_u32(f + 4);
    uint64_t tag = get_u64(f + 8);
    uint32_t size = get_u32(f + 16), fr = get_u32(f + 20), to = get_u32(f + 24);
    if (magic != HS_MAGIC) {
        snprintf(why, n, "not a tdist transport handshake (magic 0x%08x)", magic);
        return false;
    }
    if ((ver_type & 0xffff) != HS_VERSION || (ver_type >> 16) != type) {
        snprintf(why, n, "handshake version %u type %u, expected version %u type %u",
                 ver_type & 0xffff, ver_type >> 16, HS_VERSION, type);
        return false;
    }
    if (tag != tp->tag) {
        snprintf(why, n, "tag 0x%016llx, expected 0x%016llx (another job, group or generation)",
                 (unsigned long long)tag, (unsigned long long)tp->tag);
        return false;
    }
    if (size != (uint32_t)tp->size) {
        snprintf(why, n, "group size %u, expected %d", size, tp->size);
        return false;
    }
    if (to != (uint32_t)tp->rank || fr >= (uint32_t)tp->size) {
        snprintf(why, n, "from rank %u to rank %u, but this is rank %d of %d", fr, to, tp->rank,
                 tp->size);
        return false;
    }
    *from = (int)fr;
    return true;
}

/* The mac of an ACK (ack) or a PROOF (!ack): HMAC-SHA256(secret, label |
 * HELLO's header and nonce | ACK's header and nonce). */
static void hs_mac(const tcp_tp_t *t, bool ack, const uint8_t *hello, const uint8_t *ackf,
                   uint8_t out[TDIST_SHA256_LEN])
{
    const char *label = ack ? "tdist transport ack" : "tdist transport proof";
    const void *parts[3] = {label, hello, ackf};
    size_t lens[3] = {strlen(label) + 1, HS_SIGNED, HS_SIGNED};
    tdist__hmac_sha256(t->secret, strlen(t->secret), parts, lens, 3, out);
}

static void close_fd(int *fd)
{
    if (*fd >= 0) close(*fd);
    *fd = -1;
}

/* ------------------------------------------------------------- listen */

/* Whether ss is a loopback address (127.0.0.0/8, ::1, ::ffff:127.x). */
static bool is_loopback(const struct sockaddr_storage *ss)
{
    if (ss->ss_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)ss)->sin_addr.s_addr) >> 24) == 127;
    const struct in6_addr *a = &((const struct sockaddr_in6 *)ss)->sin6_addr;
    if (IN6_IS_ADDR_LOOPBACK(a)) return true;
    return IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127;
}

/* Open the listening socket on ss and the abort eventfd. */
static tdist_status_t open_listener(tcp_tp_t *t, struct sockaddr_storage *ss, socklen_t sl)
{
    int rank = t->b.rank;
    char where[ADDR_LEN], who[48];
    tdist__net_sockaddr_str(ss, where, sizeof where);
    const char *failed = "";
    t->listen_fd = tdist__net_listen_fd(ss, sl, 128, 0, &failed);
    if (t->listen_fd < 0) {
        int e = errno;
        snprintf(who, sizeof who, "rank %d: transport ", rank);
        return tdist__net_listen_error(e, failed, who, where);
    }
    tdist__net_sockaddr_str(ss, t->b.addr, sizeof t->b.addr);
    t->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (t->wake_fd < 0) return tdist__error_errno(errno, "rank %d: transport eventfd", rank);
    TDIST_LOGD("rank %d: transport listening on %s", rank, t->b.addr);
    return TDIST_OK;
}

tdist_status_t tdist__tcp_listen(tdist__tp_kind_t kind, int rank, int size,
                                 const tdist__tp_opts_t *opts, tdist__tp_t **out)
{
    static const char fn[] = "tdist__tp_listen";
    TDIST_ARG_CHECK(out != NULL, fn);
    TDIST_ARG_CHECK(opts != NULL && opts->bind_addr != NULL, fn);
    if (size < 1 || size > 65536 || rank < 0 || rank >= size)
        return tdist__error(TDIST_ERR_INVALID_ARG, "%s: rank %d of size %d is out of range", fn,
                            rank, size);
    struct sockaddr_storage ss;
    socklen_t sl;
    if (!tdist__net_parse_ip(opts->bind_addr, strlen(opts->bind_addr), 0, &ss, &sl))
        return tdist__error(TDIST_ERR_INVALID_ARG,
                            "%s: rank %d: bind address \"%.80s\" is not a numeric IPv4 or IPv6 "
                            "address",
                            fn, rank, opts->bind_addr);

    tcp_tp_t *t = calloc(1, sizeof *t);
    if (!t)
        return tdist__error(TDIST_ERR_NO_MEMORY, "%s: rank %d: out of memory for %d channels", fn,
                            rank, size);
    t->listen_fd = t->wake_fd = -1;
    const char *secret = tdist__env_job_secret();
    t->secret = tdist__strdup(secret ? secret : "");
    tdist_status_t st = t->secret ? tdist__tp_base_init(&t->b, kind, rank, size, opts->tag)
                                  : tdist__error(TDIST_ERR_NO_MEMORY, "%s: out of memory", fn);
    if (st == TDIST_OK && !(t->conn = calloc((size_t)size, sizeof *t->conn)))
        st = tdist__error(TDIST_ERR_NO_MEMORY, "%s: rank %d: out of memory for %d channels", fn,
                          rank, size);
    if (st == TDIST_OK) {
        for (int p = 0; p < size; p++) t->conn[p].fd = -1;
        st = open_listener(t, &ss, sl);
    }
    if (st == TDIST_OK && !*t->secret && !is_loopback(&ss))
        TDIST_LOGW("rank %d: transport listens on %s without the job's secret: any process that "
                   "can reach it can try to join the mesh; set the same TDIST_JOB_SECRET for "
                   "every rank", rank, t->b.addr);
    if (st != TDIST_OK) {
        tdist__tcp_destroy(&t->b);
        return st;
    }
    *out = &t->b;
    return TDIST_OK;
}

/* ------------------------------------------------------------ connect */

enum { PH_CONNECTING, PH_SEND, PH_RECV, PH_PROOF };

/* A connection going through set-up. Outgoing ones (to peers below this
 * rank) live in out[peer]; accepted ones in in[] until their HELLO names
 * the peer. */
typedef struct pending {
    int fd;
    int peer;       /* outgoing: the peer; incoming: -1 until the HELLO passed */
    int phase;
    size_t out_done, in_done;
    int64_t retry_at; /* outgoing with fd < 0: when to try again */
    uint64_t accepted; /* incoming: order of acceptance (oldest first) */
    uint8_t outf[HS_LEN], inf[HS_LEN];
    uint8_t want[TDIST_SHA256_LEN]; /* incoming: the PROOF's mac it must send */
    char from[ADDR_LEN]; /* incoming: the remote socket address */
} pending_t;

/* Set-up's state: every connection under way, and the poll set over them. */
typedef struct setup {
    pending_t *out;     /* nout entries: out[r] dials rank r */
    pending_t *in;      /* MAX_INCOMING accepted connections */
    struct pollfd *pfd; /* 2 + nout + MAX_INCOMING entries */
    pending_t **pfd_p;  /* the connection of each pfd entry (NULL: wake_fd, listen_fd) */
    int nout;           /* this rank's number: it dials ranks 0..rank-1 */
    int missing;        /* peers not up yet */
    int64_t start;
} setup_t;

/* Channel to peer is up on fd. */
static void chan_up(tcp_tp_t *t, int peer, int fd)
{
    t->conn[peer].fd = fd;
    t->b.chan[peer].up = true;
}

/* An outgoing attempt failed: close it and try again after RETRY_MS. */
static void out_retry(pending_t *p, int64_t now)
{
    close_fd(&p->fd);
    p->retry_at = now + RETRY_MS;
}

/* Start a nonblocking connect to the peer of p. */
static void out_start(tcp_tp_t *t, pending_t *p, int64_t now)
{
    struct sockaddr_storage ss;
    socklen_t sl;
    /* checked by tdist__tcp_connect */
    tdist__net_parse_ip_port(t->b.chan[p->peer].label, &ss, &sl);
    bool pending = false;
    const char *failed = "";
    p->fd = tdist__net_connect_start((struct sockaddr *)&ss, sl, &pending, &failed);
    if (p->fd < 0) {
        tdist__tp_set_problem(&t->b, p->peer, "%s: %s", failed, strerror(errno));
        out_retry(p, now);
        return;
    }
    hs_encode(p->outf, HS_HELLO, t->b.tag, t->b.size, t->b.rank, p->peer);
    p->out_done = p->in_done = 0;
    p->phase = pending ? PH_CONNECTING : PH_SEND;
}

/* Advance the dialling side's handshake: send the HELLO, then read the
 * ACK. Returns 1 once the whole ACK is here, 0 to wait for the socket, -1
 * when the attempt failed (retried later). */
static int out_exchange(tcp_tp_t *t, pending_t *p, int64_t now)
{
    while (p->phase == PH_SEND) {
        ssize_t n = send(p->fd, p->outf + p->out_done, HS_LEN - p->out_done,
                         MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
        if (n < 0) {
            tdist__tp_set_problem(&t->b, p->peer, "sending the handshake: %s", strerror(errno));
            out_retry(p, now);
            return -1;
        }
        p->out_done += (size_t)n;
        if (p->out_done == HS_LEN) p->phase = PH_RECV;
    }
    while (p->in_done < HS_LEN) {
        ssize_t n = recv(p->fd, p->inf + p->in_done, HS_LEN - p->in_done, MSG_DONTWAIT);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            tdist__tp_set_problem(&t->b, p->peer, "connected, but no handshake reply yet (has "
                                  "it called connect?)");
            return 0;
        }
        if (n <= 0) {
            tdist__tp_set_problem(&t->b, p->peer, "it closed the connection during the "
                                  "handshake (%s; tag, size or rank mismatch, or a stale "
                                  "address?)",
                                  n == 0 ? "EOF" : strerror(errno));
            out_retry(p, now);
            return -1;
        }
        p->in_done += (size_t)n;
    }
    return 1;
}

/* Send the dialler's PROOF over the HELLO in p->outf and the ACK in
 * p->inf. 96 bytes on a socket that has sent only 96: they fit at once.
 * false (problem noted) if the socket takes them not. */
static bool send_proof(tcp_tp_t *t, pending_t *p)
{
    uint8_t f[HS_LEN];
    hs_encode(f, HS_PROOF, t->b.tag, t->b.size, t->b.rank, p->peer);
    hs_mac(t, false, p->outf, p->inf, f + HS_SIGNED);
    size_t done = 0;
    for (int guard = 0; done < HS_LEN && guard < 1000; guard++) {
        ssize_t n = send(p->fd, f + done, HS_LEN - done, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            tdist__tp_set_problem(&t->b, p->peer, "sending the handshake's proof: %s",
                                  n < 0 ? strerror(errno) : "nothing sent");
            return false;
        }
        done += (size_t)n;
    }
    return done == HS_LEN;
}

/* Advance an outgoing set-up. Returns true when the channel is up. */
static bool out_step(tcp_tp_t *t, pending_t *p, int64_t now)
{
    const char *addr = t->b.chan[p->peer].label;
    if (p->phase == PH_CONNECTING) {
        int err = tdist__net_connect_result(p->fd);
        if (err == EINPROGRESS || err == EALREADY) return false;
        if (err != 0) {
            tdist__tp_set_problem(&t->b, p->peer, "connect: %s", strerror(err));
            out_retry(p, now);
            return false;
        }
        p->phase = PH_SEND;
    }
    if (out_exchange(t, p, now) <= 0) return false;
    char why[200];
    int from = -1;
    uint8_t mac[TDIST_SHA256_LEN];
    bool ok = hs_check(&t->b, p->inf, HS_ACK, &from, why, sizeof why) && from == p->peer;
    if (ok) {
        hs_mac(t, true, p->outf, p->inf, mac);
        ok = tdist__const_time_eq(mac, p->inf + HS_SIGNED, sizeof mac);
        if (!ok)
            snprintf(why, sizeof why, "its proof of the job's secret is wrong (not a rank of this "
                                      "job, or another TDIST_JOB_SECRET)");
    } else if (from != p->peer && from >= 0) {
        snprintf(why, sizeof why, "the listener answered as rank %d", from);
    }
    if (ok && !send_proof(t, p)) {
        out_retry(p, now);
        return false;
    }
    if (!ok) {
        TDIST_LOGW("rank %d: transport set-up: bad handshake reply from peer rank %d (%s): %s",
                   t->b.rank, p->peer, addr, why);
        tdist__tp_set_problem(&t->b, p->peer, "bad handshake reply: %s", why);
        out_retry(p, now);
        return false;
    }
    chan_up(t, p->peer, p->fd);
    p->fd = -1;
    TDIST_LOGD("rank %d: transport channel to peer rank %d (%s) is up", t->b.rank, p->peer, addr);
    return true;
}

/* Reject an incoming connection during set-up (logged, closed). */
static void in_reject(tcp_tp_t *t, pending_t *p, const char *why)
{
    TDIST_LOGW("rank %d: transport set-up: rejected a connection from %s: %s", t->b.rank, p->from,
               why);
    close_fd(&p->fd);
}

/* Read the rest of an accepted connection's current frame into p->inf.
 * true once it is whole; false to wait for the socket, or when the
 * connection closed or failed (rejected, on_eof or the error logged). */
static bool in_read(tcp_tp_t *t, pending_t *p, const char *on_eof)
{
    while (p->in_done < HS_LEN) {
        ssize_t n = recv(p->fd, p->inf + p->in_done, HS_LEN - p->in_done, MSG_DONTWAIT);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return false;
        if (n <= 0) {
            in_reject(t, p, n == 0 ? on_eof : strerror(errno));
            return false;
        }
        p->in_done += (size_t)n;
    }
    return true;
}

/* Read and check an accepted connection's HELLO and claim its rank.
 * Returns true once the ACK is ready to go; false to wait for the socket
 * or when the connection was rejected (then p->fd < 0). */
static bool in_hello(tcp_tp_t *t, pending_t *p)
{
    if (!in_read(t, p, "closed before its handshake was complete")) return false;
    char why[200];
    int from = -1;
    if (!hs_check(&t->b, p->inf, HS_HELLO, &from, why, sizeof why)) {
        in_reject(t, p, why);
        return false;
    }
    if (from <= t->b.rank) {
        snprintf(why, sizeof why, "rank %d must accept rank %d's connection, not the reverse", from,
                 t->b.rank);
        in_reject(t, p, why);
        return false;
    }
    if (t->conn[from].fd >= 0) {
        snprintf(why, sizeof why, "a second connection claiming rank %d", from);
        in_reject(t, p, why);
        return false;
    }
    p->peer = from;
    hs_encode(p->outf, HS_ACK, t->b.tag, t->b.size, t->b.rank, from);
    hs_mac(t, true, p->inf, p->outf, p->outf + HS_SIGNED);
    hs_mac(t, false, p->inf, p->outf, p->want);
    p->phase = PH_SEND;
    return true;
}

/* Read and check an accepted connection's PROOF (after its ACK went out).
 * Returns true once it proved the secret; false to wait for the socket or
 * when the connection was rejected (then p->fd < 0). */
static bool in_proof(tcp_tp_t *t, pending_t *p)
{
    if (!in_read(t, p, "closed before proving the job's secret")) return false;
    char why[200];
    int from = -1;
    if (!hs_check(&t->b, p->inf, HS_PROOF, &from, why, sizeof why) || from != p->peer) {
        in_reject(t, p, from != p->peer && from >= 0 ? "a proof from another rank" : why);
        return false;
    }
    if (!tdist__const_time_eq(p->want, p->inf + HS_SIGNED, sizeof p->want)) {
        in_reject(t, p, "wrong proof of the job's secret (not a rank of this job, or another "
                        "TDIST_JOB_SECRET)");
        return false;
    }
    if (t->conn[p->peer].fd >= 0) {
        in_reject(t, p, "its rank is already connected");
        return false;
    }
    return true;
}

/* Advance an accepted connection. Returns the peer rank whose channel is
 * now up, or -1. */
static int in_step(tcp_tp_t *t, pending_t *p)
{
    if (p->phase == PH_RECV && !in_hello(t, p)) return -1;
    while (p->phase == PH_SEND && p->out_done < HS_LEN) {
        ssize_t n = send(p->fd, p->outf + p->out_done, HS_LEN - p->out_done,
                         MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return -1;
        if (n < 0) {
            in_reject(t, p, strerror(errno));
            return -1;
        }
        p->out_done += (size_t)n;
    }
    if (p->phase == PH_SEND) {
        p->phase = PH_PROOF;
        p->in_done = 0;
    }
    if (!in_proof(t, p)) return -1;
    int peer = p->peer;
    chan_up(t, peer, p->fd);
    p->fd = -1;
    tdist__net_nodelay(t->conn[peer].fd);
    TDIST_LOGD("rank %d: transport channel from peer rank %d (%s, socket %s) is up", t->b.rank,
               peer, t->b.chan[peer].label, p->from);
    return peer;
}

/* Accept every waiting connection into a free in[] slot. */
static void accept_all(tcp_tp_t *t, pending_t *in)
{
    for (int guard = 0; guard < 1024; guard++) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        int fd = accept4(t->listen_fd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                TDIST_LOGW("rank %d: transport set-up: accept on %s: %s", t->b.rank, t->b.addr,
                           strerror(errno));
            return;
        }
        /* a free slot, else the oldest handshake still pending makes room:
         * connections that never prove anything cannot keep peers out */
        int slot = -1, oldest = 0;
        for (int i = 0; i < MAX_INCOMING && slot < 0; i++) {
            if (in[i].fd < 0) slot = i;
            else if (in[i].accepted < in[oldest].accepted) oldest = i;
        }
        if (slot < 0) {
            in_reject(t, &in[oldest], "the oldest of the pending handshakes, closed to make "
                                      "room for a new connection");
            slot = oldest;
        }
        char from[ADDR_LEN];
        tdist__net_sockaddr_str(&ss, from, sizeof from);
        pending_t *p = &in[slot];
        memset(p, 0, sizeof *p);
        p->accepted = ++t->accepted;
        p->fd = fd;
        p->peer = -1;
        p->phase = PH_RECV;
        memcpy(p->from, from, sizeof from);
    }
}

/* Check every peer's address and keep it as the peer's label; note what
 * set-up waits for from each peer until it says more. */
static tdist_status_t take_addrs(tcp_tp_t *t, const char *const *addrs)
{
    tdist__tp_t *tp = &t->b;
    for (int r = 0; r < tp->size; r++) {
        tdist__tp_chan_t *c = &tp->chan[r];
        if (r == tp->rank) continue;
        struct sockaddr_storage ss;
        socklen_t sl;
        if (!addrs[r] || strlen(addrs[r]) >= ADDR_LEN ||
            !tdist__net_parse_ip_port(addrs[r], &ss, &sl))
            return tdist__error(TDIST_ERR_INVALID_ARG,
                                "tdist__tp_connect: rank %d: address of peer rank %d \"%.80s\" is "
                                "not \"ip:port\" or \"[ip6]:port\"",
                                tp->rank, r, addrs[r] ? addrs[r] : "(null)");
        snprintf(c->label, sizeof c->label, "%s", addrs[r]);
        snprintf(c->problem, sizeof c->problem, "%s",
                 r < tp->rank ? "no connection to it yet" : "it has not connected to this rank");
    }
    return TDIST_OK;
}

/* Allocate set-up's state: nothing is connecting yet. */
static tdist_status_t setup_begin(tcp_tp_t *t, setup_t *s)
{
    s->nout = t->b.rank;
    s->missing = t->b.size - 1;
    int nfds = 2 + s->nout + MAX_INCOMING;
    s->out = calloc((size_t)TDIST_MAX(s->nout, 1), sizeof *s->out);
    s->in = calloc(MAX_INCOMING, sizeof *s->in);
    s->pfd = calloc((size_t)nfds, sizeof *s->pfd);
    s->pfd_p = calloc((size_t)nfds, sizeof *s->pfd_p);
    if (!s->out || !s->in || !s->pfd || !s->pfd_p) {
        free(s->out);
        free(s->in);
        free(s->pfd);
        free(s->pfd_p);
        return tdist__error(TDIST_ERR_NO_MEMORY, "tdist__tp_connect: rank %d: out of memory",
                            t->b.rank);
    }
    s->start = tdist__now_ms();
    for (int r = 0; r < s->nout; r++) {
        s->out[r].fd = -1;
        s->out[r].peer = r;
        s->out[r].retry_at = s->start;
    }
    for (int i = 0; i < MAX_INCOMING; i++) s->in[i].fd = -1;
    return TDIST_OK;
}

/* Close every connection set-up still holds (an accepted one that never
 * finished its handshake is logged when set-up succeeded) and free. */
static void setup_end(tcp_tp_t *t, setup_t *s, tdist_status_t st)
{
    for (int r = 0; r < s->nout; r++) close_fd(&s->out[r].fd);
    for (int i = 0; i < MAX_INCOMING; i++) {
        if (s->in[i].fd >= 0 && st == TDIST_OK)
            TDIST_LOGW("rank %d: transport set-up: closing a connection from %s that never "
                       "completed its handshake",
                       t->b.rank, s->in[i].from);
        close_fd(&s->in[i].fd);
    }
    free(s->out);
    free(s->in);
    free(s->pfd);
    free(s->pfd_p);
}

/* Dial the peers whose retry is due. Returns when set-up must look again
 * at the latest: the next retry, or deadline_ms. */
static int64_t dial_due(tcp_tp_t *t, setup_t *s, int64_t now, int64_t deadline_ms)
{
    int64_t wake_at = deadline_ms;
    for (int r = 0; r < s->nout; r++) {
        pending_t *p = &s->out[r];
        if (t->conn[r].fd >= 0 || p->fd >= 0) continue;
        if (now >= p->retry_at) out_start(t, p, now);
        if (p->fd >= 0 && p->phase == PH_SEND && out_step(t, p, now)) s->missing--;
        if (p->fd < 0 && t->conn[r].fd < 0) wake_at = TDIST_MIN(wake_at, p->retry_at);
    }
    return wake_at;
}

/* What a connection in set-up waits for. */
static short poll_events(const pending_t *p)
{
    return p->phase == PH_RECV || p->phase == PH_PROOF ? POLLIN : POLLOUT;
}

/* Set-up's poll set: the abort eventfd, the listening socket, then every
 * connection under way. Returns its size. */
static int setup_pfd(tcp_tp_t *t, setup_t *s)
{
    int n = 0;
    s->pfd[n] = (struct pollfd){.fd = t->wake_fd, .events = POLLIN};
    s->pfd_p[n++] = NULL;
    s->pfd[n] = (struct pollfd){.fd = t->listen_fd, .events = POLLIN};
    s->pfd_p[n++] = NULL;
    for (int r = 0; r < s->nout; r++) {
        pending_t *p = &s->out[r];
        if (p->fd < 0) continue;
        s->pfd[n] = (struct pollfd){.fd = p->fd, .events = poll_events(p)};
        s->pfd_p[n++] = p;
    }
    for (int i = 0; i < MAX_INCOMING; i++) {
        pending_t *p = &s->in[i];
        if (p->fd < 0) continue;
        s->pfd[n] = (struct pollfd){.fd = p->fd, .events = poll_events(p)};
        s->pfd_p[n++] = p;
    }
    return n;
}

/* Serve what a poll over setup_pfd's n entries found ready. */
static void setup_serve(tcp_tp_t *t, setup_t *s, int n)
{
    int64_t now = tdist__now_ms();
    if (s->pfd[1].revents) accept_all(t, s->in);
    for (int i = 2; i < n; i++) {
        pending_t *p = s->pfd_p[i];
        if (!s->pfd[i].revents || p->fd < 0) continue;
        if (p >= s->out && p < s->out + s->nout) {
            if (out_step(t, p, now)) s->missing--;
        } else if (in_step(t, p) >= 0) {
            s->missing--;
        }
    }
}

tdist_status_t tdist__tcp_connect(tdist__tp_t *tp, const char *const *addrs, int64_t deadline_ms)
{
    tcp_tp_t *t = TCP(tp);
    TDIST_CHECK(take_addrs(t, addrs));
    setup_t s = {.out = NULL};
    TDIST_CHECK(setup_begin(t, &s));
    tdist_status_t st = TDIST_OK;
    for (;;) {
        if (atomic_load(&tp->aborted)) {
            st = tdist__tp_fail_aborted(tp);
            break;
        }
        int64_t now = tdist__now_ms();
        int64_t wake_at = dial_due(t, &s, now, deadline_ms);
        if (s.missing == 0) break;
        if (now >= deadline_ms) {
            st = tdist__tp_setup_timeout(tp, "transport", s.start);
            break;
        }
        int n = setup_pfd(t, &s);
        int rc = poll(s.pfd, (nfds_t)n, tdist__ms_left(wake_at));
        if (rc < 0 && errno != EINTR) {
            st = tdist__tp_fail(tp, TDIST_ERR_SYSTEM, "rank %d: transport set-up: poll: %s",
                                tp->rank, strerror(errno));
            break;
        }
        if (rc > 0) setup_serve(t, &s, n);
    }
    setup_end(t, &s, st);
    if (st != TDIST_OK) return st;
    close_fd(&t->listen_fd); /* every peer is here; nobody else may join */
    tp->connected = true;
    TDIST_LOGD("rank %d: transport mesh of %d ranks up in %lld ms", tp->rank, tp->size,
               (long long)(tdist__now_ms() - s.start));
    return TDIST_OK;
}

/* --------------------------------------------------------------- data */

/* The peer is gone (err 0: EOF): fail the transport naming it. */
static void peer_lost(tcp_tp_t *t, int peer, const tdist__tp_req_t *req, int err)
{
    char how[160];
    tdist_status_t st = TDIST_ERR_CONNECTION;
    if (err == 0) {
        snprintf(how, sizeof how, " closed the connection");
    } else if (err == ECONNRESET || err == EPIPE) {
        snprintf(how, sizeof how, " closed the connection: %s", strerror(err));
    } else {
        snprintf(how, sizeof how, ": socket error: %s", strerror(err));
        if (err == ENOMEM || err == ENOBUFS) st = TDIST_ERR_NO_MEMORY;
    }
    tdist__tp_fail_peer(&t->b, st, peer, req, how);
}

/* Move bytes of peer's queued sends (is_send) into its socket until the
 * socket is full, or of its socket into the queued receives. A receive
 * with little left reads what the socket has, up to RX_CAP, and keeps
 * what is beyond it for the receives posted next (in order, as the
 * stream is): several small messages a peer sent ahead (a rooted
 * collective's senders, a fingerprint and its data) cost one system call,
 * not one each. A send goes into the socket TX_SLICE bytes a call, and
 * after each whole slice the peer's queued receives run first: two ranks
 * that exchange megabytes then copy in and out at once, not the whole
 * message out and then the whole message in (docs/transport.md has the
 * figures). Returns whether a byte moved; on a failure the transport is
 * failed (its err). */
static bool drive(tcp_tp_t *t, int peer, bool is_send)
{
    tdist__tp_chan_t *q = &t->b.chan[peer];
    conn_t *c = &t->conn[peer];
    tdist__tp_req_t **head = is_send ? &q->sq_head : &q->rq_head;
    tdist__tp_req_t **tail = is_send ? &q->sq_tail : &q->rq_tail;
    bool moved = false;
    while (*head && t->b.err == TDIST_OK) {
        tdist__tp_req_t *req = *head;
        if (is_send && c->peer_closed) {
            peer_lost(t, peer, req, 0);
            break;
        }
        uint8_t *at = req->buf + req->done;
        size_t left = req->len - req->done;
        if (!is_send && c->rx_off < c->rx_len) { /* read ahead before */
            size_t k = TDIST_MIN(left, c->rx_len - c->rx_off);
            memcpy(at, c->rx + c->rx_off, k);
            c->rx_off += k;
            if (c->rx_off == c->rx_len) c->rx_off = c->rx_len = 0;
            moved = true;
            tdist__tp_req_moved(req, k, head, tail);
            continue;
        }
        bool ahead = !is_send && left < RX_SMALL && (c->rx || (c->rx = malloc(RX_CAP)));
        bool sliced = is_send && left > TX_SLICE;
        if (sliced) left = TX_SLICE;
        ssize_t n = is_send ? send(c->fd, at, left, MSG_NOSIGNAL | MSG_DONTWAIT)
                    : ahead ? recv(c->fd, c->rx, RX_CAP, MSG_DONTWAIT)
                            : recv(c->fd, at, left, MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) break;
            peer_lost(t, peer, req, errno);
            break;
        }
        if (n == 0 && !is_send) { /* EOF */
            peer_lost(t, peer, req, 0);
            break;
        }
        if (ahead) { /* copied into the receive at the loop's top */
            c->rx_off = 0;
            c->rx_len = (size_t)n;
            continue;
        }
        moved = true;
        tdist__tp_req_moved(req, (size_t)n, head, tail);
        if (sliced && q->rq_head) break; /* the peer's receives, then the next slice */
    }
    return moved;
}

/* The poll set, in the shared pfd: the abort eventfd first, then every
 * channel with work (sends want POLLOUT, receives POLLIN); an idle channel
 * is watched for the peer closing it (POLLRDHUP), which is noted and
 * becomes an error only when a request needs that peer. Returns its size. */
static int fill_pfd(tcp_tp_t *t)
{
    tdist__tp_t *tp = &t->b;
    int n = 0;
    tp->pfd[n] = (struct pollfd){.fd = t->wake_fd, .events = POLLIN};
    tp->pfd_peer[n++] = -1;
    for (int p = 0; p < tp->size; p++) {
        const tdist__tp_chan_t *q = &tp->chan[p];
        const conn_t *c = &t->conn[p];
        if (p == tp->rank || c->fd < 0) continue;
        short ev = (short)((q->sq_head ? POLLOUT : 0) | (q->rq_head ? POLLIN : 0));
        if (!q->rq_head && !c->peer_closed) ev |= POLLRDHUP;
        if (!ev) continue;
        tp->pfd[n] = (struct pollfd){.fd = c->fd, .events = ev};
        tp->pfd_peer[n++] = p;
    }
    return n;
}

/* Drive the channels a poll over fill_pfd's n entries found ready.
 * Returns whether a byte moved. */
static bool serve_ready(tcp_tp_t *t, int n)
{
    tdist__tp_t *tp = &t->b;
    bool moved = false;
    for (int i = 1; i < n && tp->err == TDIST_OK; i++) {
        short re = tp->pfd[i].revents;
        if (!re) continue;
        int p = tp->pfd_peer[i];
        const tdist__tp_chan_t *q = &tp->chan[p];
        if (!q->rq_head && (re & (POLLRDHUP | POLLHUP | POLLERR))) {
            /* Closed or reset while we expect nothing from it: not an
             * error yet (it may have finished and left); a send to it or
             * a receive it cannot satisfy will fail. */
            t->conn[p].peer_closed = true;
            TDIST_LOGD("rank %d: peer rank %d (%s) closed its channel", tp->rank, p, q->label);
        }
        if (q->sq_head) moved |= drive(t, p, true);
        if (q->rq_head) moved |= drive(t, p, false);
    }
    return moved;
}

tdist_status_t tdist__tcp_progress(tdist__tp_t *tp, int timeout_ms)
{
    tcp_tp_t *t = TCP(tp);
    /* First try every channel with work without waiting: a send usually
     * goes straight into the socket. */
    bool moved = false;
    uint64_t spin_until = 0;
    bool noted = false; /* tdist__tp_waiting_on was told */
    for (int round = 0;; round++) {
        if (round == 0) {
            for (int p = 0; p < tp->size && tp->err == TDIST_OK; p++) {
                if (tp->chan[p].sq_head) moved |= drive(t, p, true);
                if (tp->chan[p].rq_head) moved |= drive(t, p, false);
            }
        } else {
            /* one poll() tells which channels can move, instead of a
             * send or receive per channel that mostly finds EAGAIN */
            int n = fill_pfd(t);
            int rc = poll(tp->pfd, (nfds_t)n, 0);
            if (rc < 0 && errno != EINTR)
                return tdist__tp_fail(tp, TDIST_ERR_SYSTEM, "rank %d: transport poll: %s",
                                      tp->rank, strerror(errno));
            if (rc > 0) moved |= serve_ready(t, n);
        }
        if (tp->err != TDIST_OK) return tdist__tp_sticky(tp);
        if (moved || timeout_ms == 0) return TDIST_OK;
        /* Retry, yielding, for up to SPIN_NS before sleeping in poll(): a
         * reply that is microseconds away costs less than a sleep and a
         * wake-up, and a rank that shares its core with the peer it waits
         * for hands it the CPU at once (as the shm transport's waits do).
         * docs/transport.md, "Progress model", says why this long. */
        uint64_t now = tdist__now_ns();
        if (round == 0) spin_until = now + SPIN_NS;
        if (now >= spin_until || atomic_load(&tp->aborted)) break;
        if (round >= 4) {
            if (!noted) tdist__tp_waiting_on(tp, -1); /* done spinning: say on whom */
            noted = true;
            sched_yield(); /* let a peer sharing this core run */
        }
    }

    /* Then sleep in one poll (fill_pfd says what it watches). */
    if (!noted) tdist__tp_waiting_on(tp, -1);
    int n = fill_pfd(t);
    int rc = poll(tp->pfd, (nfds_t)n, timeout_ms < 0 ? -1 : timeout_ms);
    if (rc < 0) {
        if (errno == EINTR) return TDIST_OK;
        return tdist__tp_fail(tp, TDIST_ERR_SYSTEM, "rank %d: transport poll: %s", tp->rank,
                              strerror(errno));
    }
    if (atomic_load(&tp->aborted)) return tdist__tp_fail_aborted(tp);
    serve_ready(t, n);
    return tp->err != TDIST_OK ? tdist__tp_sticky(tp) : TDIST_OK;
}

/* ------------------------------------------------------ abort, destroy */

void tdist__tcp_wake(tdist__tp_t *tp)
{
    uint64_t one = 1;
    ssize_t rc;
    TDIST_SYSCALL(rc, write(TCP(tp)->wake_fd, &one, sizeof one));
    (void)rc; /* EAGAIN: the counter is already non-zero, a wake-up is pending */
}

void tdist__tcp_destroy(tdist__tp_t *tp)
{
    tcp_tp_t *t = TCP(tp);
    for (int p = 0; t->conn && p < tp->size; p++) {
        close_fd(&t->conn[p].fd);
        free(t->conn[p].rx);
    }
    close_fd(&t->listen_fd);
    close_fd(&t->wake_fd);
    free(t->conn);
    if (t->secret) memset(t->secret, 0, strlen(t->secret));
    free(t->secret);
    tdist__tp_base_fini(tp);
    free(t);
}
