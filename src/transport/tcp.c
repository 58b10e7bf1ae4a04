/*
 * transport/tcp.c — the TCP transport: a full mesh of nonblocking sockets,
 * one per pair of ranks, driven by poll() (see transport.h and
 * docs/transport.md).
 *
 * Set-up: rank i connects to every rank j < i and accepts from every
 * j > i, so each pair gets exactly one connection. The connecting side
 * sends a 32-byte HELLO frame, the accepting side checks it and answers
 * with an ACK frame, which the connecting side checks in turn. Refused
 * connections are retried every RETRY_MS until the deadline.
 *
 * Data: per peer, one FIFO of sends and one of receives. No framing on
 * the wire: a receive takes exactly its len bytes from the stream, and
 * bytes for which no receive is posted stay in the kernel (no read-ahead,
 * so the kernel's socket buffers are the only buffering and a sender
 * simply stalls until the receiver posts).
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "transport/ops.h"

#define HS_LEN 32
#define HS_MAGIC 0x70746474u /* "tdtp" little-endian */
#define HS_VERSION 1
#define HS_HELLO 1
#define HS_ACK 2
#define RETRY_MS 50
#define MAX_INCOMING 64 /* connections accepted but not yet through the handshake */
#define ADDR_LEN 64     /* "[<45 chars>]:65535" fits */
#define PROBLEM_LEN 160
#define ERRMSG_LEN 1024
/* progress retries the sockets this long, yielding, before poll() */
#define SPIN_NS 1000000

/* One channel: the connection to one peer and its two request queues. */
typedef struct channel {
    int fd;                          /* -1 until the handshake passed */
    char addr[ADDR_LEN];             /* the peer's published address */
    tdist__tp_req_t *sq_head, *sq_tail; /* sends, in post order */
    tdist__tp_req_t *rq_head, *rq_tail; /* receives, in post order */
    bool peer_closed;                /* EOF/reset seen while no receive was posted */
    bool claimed;                    /* set-up: a valid HELLO arrived, ACK on its way */
    char problem[PROBLEM_LEN];       /* set-up: why it is not up yet */
} channel_t;

struct tdist__tp {
    tdist__tp_kind_t kind;
    int rank, size;
    uint64_t tag;
    int listen_fd; /* closed once the mesh is up */
    int wake_fd;   /* eventfd written by tdist__tp_abort */
    char addr[ADDR_LEN];
    channel_t *ch;       /* size entries; ch[rank] unused */
    struct pollfd *pfd;  /* size + 1 entries, rebuilt by every poll */
    int *pfd_peer;       /* which peer each pfd entry is (-1: wake_fd) */
    bool connected;
    atomic_bool aborted;
    tdist_status_t err;  /* sticky: TDIST_OK until the first failure */
    char errmsg[ERRMSG_LEN];
};

/* ------------------------------------------------------------- helpers */

/* Format a socket address as "ip:port" / "[ip6]:port". */
static void sockaddr_str(const struct sockaddr_storage *ss, char *buf, size_t n)
{
    char ip[INET6_ADDRSTRLEN] = "?";
    unsigned port = 0;
    if (ss->ss_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)ss;
        inet_ntop(AF_INET6, &a->sin6_addr, ip, sizeof ip);
        port = ntohs(a->sin6_port);
        snprintf(buf, n, "[%s]:%u", ip, port);
    } else {
        const struct sockaddr_in *a = (const struct sockaddr_in *)ss;
        inet_ntop(AF_INET, &a->sin_addr, ip, sizeof ip);
        port = ntohs(a->sin_port);
        snprintf(buf, n, "%s:%u", ip, port);
    }
}

/* Parse a numeric IPv4 or IPv6 literal (brackets allowed around IPv6)
 * with the given port into ss. Returns false if s is not one. */
static bool parse_ip(const char *s, size_t len, uint16_t port, struct sockaddr_storage *ss,
                     socklen_t *sl)
{
    char ip[INET6_ADDRSTRLEN + 2];
    if (len >= 2 && s[0] == '[' && s[len - 1] == ']') {
        s++;
        len -= 2;
    }
    if (len == 0 || len >= sizeof ip) return false;
    memcpy(ip, s, len);
    ip[len] = '\0';
    memset(ss, 0, sizeof *ss);
    struct sockaddr_in *a4 = (struct sockaddr_in *)ss;
    struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)ss;
    if (inet_pton(AF_INET, ip, &a4->sin_addr) == 1) {
        a4->sin_family = AF_INET;
        a4->sin_port = htons(port);
        *sl = sizeof *a4;
        return true;
    }
    if (inet_pton(AF_INET6, ip, &a6->sin6_addr) == 1) {
        a6->sin6_family = AF_INET6;
        a6->sin6_port = htons(port);
        *sl = sizeof *a6;
        return true;
    }
    return false;
}

/* Parse "ip:port" or "[ip6]:port" (numeric, port 1..65535). */
static bool parse_addr(const char *s, struct sockaddr_storage *ss, socklen_t *sl)
{
    const char *colon = strrchr(s, ':');
    if (!colon || colon == s) return false;
    if (strchr(s, ':') != colon && !(s[0] == '[' && colon[-1] == ']')) return false;
    int64_t port;
    if (tdist__parse_int(colon + 1, 1, 65535, &port) != 0) return false;
    return parse_ip(s, (size_t)(colon - s), (uint16_t)port, ss, sl);
}

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

static void close_fd(int *fd)
{
    if (*fd >= 0) close(*fd);
    *fd = -1;
}

/* Return the transport's sticky error, setting it as this thread's last
 * error. */
static tdist_status_t sticky(const tdist__tp_t *tp)
{
    return tdist__error(tp->err, "%s", tp->errmsg);
}

static void finish(tdist__tp_req_t *req, tdist_status_t st) { tdist__tp_req_finish(req, st); }

/* Fail the transport with st and a message (first failure wins): every
 * pending request finishes with st. Returns the sticky status. */
static tdist_status_t fail(tdist__tp_t *tp, tdist_status_t st, const char *fmt, ...)
    TDIST_PRINTF(3, 4);
static tdist_status_t fail(tdist__tp_t *tp, tdist_status_t st, const char *fmt, ...)
{
    if (tp->err == TDIST_OK) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(tp->errmsg, sizeof tp->errmsg, fmt, ap);
        va_end(ap);
        tp->err = st;
        TDIST_LOGW("%s", tp->errmsg);
        for (int p = 0; p < tp->size; p++) {
            channel_t *c = &tp->ch[p];
            for (tdist__tp_req_t *r = c->sq_head, *nx; r; r = nx) {
                nx = r->next;
                finish(r, st);
            }
            for (tdist__tp_req_t *r = c->rq_head, *nx; r; r = nx) {
                nx = r->next;
                finish(r, st);
            }
            c->sq_head = c->sq_tail = c->rq_head = c->rq_tail = NULL;
        }
    }
    return sticky(tp);
}

static tdist_status_t fail_aborted(tdist__tp_t *tp)
{
    return fail(tp, TDIST_ERR_ABORTED, "rank %d: transport aborted", tp->rank);
}

/* ------------------------------------------------------------- listen */

tdist_status_t tdist__tcp_listen(tdist__tp_kind_t kind, int rank, int size,
                                const tdist__tp_opts_t *opts, tdist__tp_t **out)
{
    static const char fn[] = "tdist__tp_listen";
    TDIST_ARG_CHECK(out != NULL, fn);
    TDIST_ARG_CHECK(opts != NULL && opts->bind_addr != NULL, fn);
    if (kind != TDIST__TP_TCP)
        return tdist__error(TDIST_ERR_NOT_SUPPORTED, "%s: transport kind %d is not supported", fn,
                            (int)kind);
    if (size < 1 || size > 65536 || rank < 0 || rank >= size)
        return tdist__error(TDIST_ERR_INVALID_ARG, "%s: rank %d of size %d is out of range", fn,
                            rank, size);
    struct sockaddr_storage ss;
    socklen_t sl;
    if (!parse_ip(opts->bind_addr, strlen(opts->bind_addr), 0, &ss, &sl))
        return tdist__error(TDIST_ERR_INVALID_ARG,
                            "%s: rank %d: bind address \"%.80s\" is not a numeric IPv4 or IPv6 "
                            "address",
                            fn, rank, opts->bind_addr);

    tdist__tp_t *tp = calloc(1, sizeof *tp);
    channel_t *ch = calloc((size_t)size, sizeof *ch);
    struct pollfd *pfd = calloc((size_t)size + 1, sizeof *pfd);
    int *pfd_peer = calloc((size_t)size + 1, sizeof *pfd_peer);
    if (!tp || !ch || !pfd || !pfd_peer) {
        free(tp);
        free(ch);
        free(pfd);
        free(pfd_peer);
        return tdist__error(TDIST_ERR_NO_MEMORY, "%s: rank %d: out of memory for %d channels", fn,
                            rank, size);
    }
    tp->kind = kind;
    tp->rank = rank;
    tp->size = size;
    tp->tag = opts->tag;
    tp->ch = ch;
    tp->pfd = pfd;
    tp->pfd_peer = pfd_peer;
    tp->wake_fd = -1;
    atomic_init(&tp->aborted, false);
    for (int p = 0; p < size; p++) ch[p].fd = -1;

    char where[ADDR_LEN];
    sockaddr_str(&ss, where, sizeof where);
    tdist_status_t st;
    tp->listen_fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (tp->listen_fd < 0) {
        st = tdist__error_errno(errno, "rank %d: transport listen on %s: socket", rank, where);
        goto fail;
    }
    int one = 1;
    if (ss.ss_family == AF_INET6)
        setsockopt(tp->listen_fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
    if (bind(tp->listen_fd, (struct sockaddr *)&ss, sl) != 0) {
        st = tdist__error_errno(errno, "rank %d: transport cannot bind %s", rank, where);
        goto fail;
    }
    if (listen(tp->listen_fd, 128) != 0) {
        st = tdist__error_errno(errno, "rank %d: transport listen on %s", rank, where);
        goto fail;
    }
    sl = sizeof ss;
    if (getsockname(tp->listen_fd, (struct sockaddr *)&ss, &sl) != 0) {
        st = tdist__error_errno(errno, "rank %d: transport getsockname for %s", rank, where);
        goto fail;
    }
    sockaddr_str(&ss, tp->addr, sizeof tp->addr);
    tp->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (tp->wake_fd < 0) {
        st = tdist__error_errno(errno, "rank %d: transport eventfd", rank);
        goto fail;
    }
    TDIST_LOGD("rank %d: transport listening on %s", rank, tp->addr);
    *out = tp;
    return TDIST_OK;
fail:
    tdist__tcp_destroy(tp);
    return st;
}

const char *tdist__tcp_address(const tdist__tp_t *tp) { return tp ? tp->addr : NULL; }

/* ------------------------------------------------------------ connect */

enum { PH_CONNECTING, PH_SEND, PH_RECV };

/* A connection going through set-up. Outgoing ones (to peers below this
 * rank) live in out[peer]; accepted ones in in[] until their HELLO names
 * the peer. */
typedef struct pending {
    int fd;
    int peer;       /* outgoing: the peer; incoming: -1 until the HELLO passed */
    int phase;
    size_t out_done, in_done;
    int64_t retry_at; /* outgoing with fd < 0: when to try again */
    uint8_t outf[HS_LEN], inf[HS_LEN];
    char from[ADDR_LEN]; /* incoming: the remote socket address */
} pending_t;

static void set_problem(channel_t *c, const char *fmt, ...) TDIST_PRINTF(2, 3);
static void set_problem(channel_t *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->problem, sizeof c->problem, fmt, ap);
    va_end(ap);
}

/* An outgoing attempt failed: close it and try again after RETRY_MS. */
static void out_retry(pending_t *p, int64_t now)
{
    close_fd(&p->fd);
    p->retry_at = now + RETRY_MS;
}

/* Start a nonblocking connect to peer. */
static void out_start(tdist__tp_t *tp, pending_t *p, int64_t now)
{
    channel_t *c = &tp->ch[p->peer];
    struct sockaddr_storage ss;
    socklen_t sl;
    parse_addr(c->addr, &ss, &sl); /* checked by tdist__tp_connect */
    p->fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (p->fd < 0) {
        set_problem(c, "socket: %s", strerror(errno));
        out_retry(p, now);
        return;
    }
    int one = 1;
    setsockopt(p->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    hs_encode(p->outf, HS_HELLO, tp->tag, tp->size, tp->rank, p->peer);
    p->out_done = p->in_done = 0;
    int rc;
    TDIST_SYSCALL(rc, connect(p->fd, (struct sockaddr *)&ss, sl));
    if (rc == 0) {
        p->phase = PH_SEND;
    } else if (errno == EINPROGRESS) {
        p->phase = PH_CONNECTING;
    } else {
        set_problem(c, "connect: %s", strerror(errno));
        out_retry(p, now);
    }
}

/* Advance an outgoing set-up. Returns true when the channel is up. */
static bool out_step(tdist__tp_t *tp, pending_t *p, int64_t now)
{
    channel_t *c = &tp->ch[p->peer];
    if (p->phase == PH_CONNECTING) {
        int err = 0;
        socklen_t sl = sizeof err;
        if (getsockopt(p->fd, SOL_SOCKET, SO_ERROR, &err, &sl) != 0) err = errno;
        if (err == EINPROGRESS || err == EALREADY) return false;
        if (err != 0) {
            set_problem(c, "connect: %s", strerror(err));
            out_retry(p, now);
            return false;
        }
        p->phase = PH_SEND;
    }
    while (p->phase == PH_SEND) {
        ssize_t n = send(p->fd, p->outf + p->out_done, HS_LEN - p->out_done,
                         MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return false;
        if (n < 0) {
            set_problem(c, "sending the handshake: %s", strerror(errno));
            out_retry(p, now);
            return false;
        }
        p->out_done += (size_t)n;
        if (p->out_done == HS_LEN) p->phase = PH_RECV;
    }
    while (p->in_done < HS_LEN) {
        ssize_t n = recv(p->fd, p->inf + p->in_done, HS_LEN - p->in_done, MSG_DONTWAIT);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            set_problem(c, "connected, but no handshake reply yet (has it called connect?)");
            return false;
        }
        if (n <= 0) {
            set_problem(c, "it closed the connection during the handshake (%s; tag, size or "
                           "rank mismatch, or a stale address?)",
                        n == 0 ? "EOF" : strerror(errno));
            out_retry(p, now);
            return false;
        }
        p->in_done += (size_t)n;
    }
    char why[200];
    int from = -1;
    if (!hs_check(tp, p->inf, HS_ACK, &from, why, sizeof why) || from != p->peer) {
        if (from != p->peer && from >= 0)
            snprintf(why, sizeof why, "the listener answered as rank %d", from);
        TDIST_LOGW("rank %d: transport set-up: bad handshake reply from peer rank %d (%s): %s",
                   tp->rank, p->peer, c->addr, why);
        set_problem(c, "bad handshake reply: %s", why);
        out_retry(p, now);
        return false;
    }
    c->fd = p->fd;
    p->fd = -1;
    TDIST_LOGD("rank %d: transport channel to peer rank %d (%s) is up", tp->rank, p->peer,
               c->addr);
    return true;
}

/* Reject an incoming connection during set-up (logged, closed). */
static void in_reject(tdist__tp_t *tp, pending_t *p, const char *why)
{
    TDIST_LOGW("rank %d: transport set-up: rejected a connection from %s: %s", tp->rank, p->from,
               why);
    if (p->peer >= 0) tp->ch[p->peer].claimed = false;
    close_fd(&p->fd);
}

/* Advance an accepted connection. Returns the peer rank whose channel is
 * now up, or -1. */
static int in_step(tdist__tp_t *tp, pending_t *p)
{
    if (p->phase == PH_RECV) {
        while (p->in_done < HS_LEN) {
            ssize_t n = recv(p->fd, p->inf + p->in_done, HS_LEN - p->in_done, MSG_DONTWAIT);
            if (n < 0 && errno == EINTR) continue;
            if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return -1;
            if (n <= 0) {
                in_reject(tp, p, n == 0 ? "closed before its handshake was complete"
                                        : strerror(errno));
                return -1;
            }
            p->in_done += (size_t)n;
        }
        char why[200];
        int from = -1;
        if (!hs_check(tp, p->inf, HS_HELLO, &from, why, sizeof why)) {
            in_reject(tp, p, why);
            return -1;
        }
        if (from <= tp->rank) {
            snprintf(why, sizeof why, "rank %d must accept rank %d's connection, not the reverse",
                     from, tp->rank);
            in_reject(tp, p, why);
            return -1;
        }
        if (tp->ch[from].fd >= 0 || tp->ch[from].claimed) {
            snprintf(why, sizeof why, "a second connection claiming rank %d", from);
            in_reject(tp, p, why);
            return -1;
        }
        p->peer = from;
        tp->ch[from].claimed = true;
        hs_encode(p->outf, HS_ACK, tp->tag, tp->size, tp->rank, from);
        p->phase = PH_SEND;
    }
    while (p->out_done < HS_LEN) {
        ssize_t n = send(p->fd, p->outf + p->out_done, HS_LEN - p->out_done,
                         MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return -1;
        if (n < 0) {
            in_reject(tp, p, strerror(errno));
            return -1;
        }
        p->out_done += (size_t)n;
    }
    int peer = p->peer;
    channel_t *c = &tp->ch[peer];
    c->fd = p->fd;
    c->claimed = false;
    p->fd = -1;
    int one = 1;
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    TDIST_LOGD("rank %d: transport channel from peer rank %d (%s, socket %s) is up", tp->rank,
               peer, c->addr, p->from);
    return peer;
}

/* Accept every waiting connection into a free in[] slot. */
static void accept_all(tdist__tp_t *tp, pending_t *in)
{
    for (int guard = 0; guard < 1024; guard++) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        int fd = accept4(tp->listen_fd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                TDIST_LOGW("rank %d: transport set-up: accept on %s: %s", tp->rank, tp->addr,
                           strerror(errno));
            return;
        }
        int slot = -1;
        for (int i = 0; i < MAX_INCOMING && slot < 0; i++)
            if (in[i].fd < 0) slot = i;
        char from[ADDR_LEN];
        sockaddr_str(&ss, from, sizeof from);
        if (slot < 0) {
            TDIST_LOGW("rank %d: transport set-up: rejected a connection from %s: %d "
                       "handshakes already pending",
                       tp->rank, from, MAX_INCOMING);
            close(fd);
            continue;
        }
        pending_t *p = &in[slot];
        memset(p, 0, sizeof *p);
        p->fd = fd;
        p->peer = -1;
        p->phase = PH_RECV;
        memcpy(p->from, from, sizeof from);
    }
}

/* The deadline passed: one message naming every missing peer. */
static tdist_status_t connect_timeout(tdist__tp_t *tp, int64_t start)
{
    char msg[ERRMSG_LEN];
    size_t used = 0;
    int missing = 0;
    used += (size_t)snprintf(msg, sizeof msg,
                             "rank %d: transport set-up timed out after %lld ms; missing peer "
                             "ranks:",
                             tp->rank, (long long)(tdist__now_ms() - start));
    for (int r = 0; r < tp->size && used < sizeof msg; r++) {
        channel_t *c = &tp->ch[r];
        if (r == tp->rank || c->fd >= 0) continue;
        const char *problem = c->problem[0] ? c->problem
                              : r < tp->rank ? "no connection to it yet"
                                             : "it has not connected to this rank";
        used += (size_t)snprintf(msg + used, sizeof msg - used, "%s peer rank %d (%s): %s",
                                 missing ? ";" : "", r, c->addr, problem);
        missing++;
    }
    return fail(tp, TDIST_ERR_TIMEOUT, "%s", msg);
}

tdist_status_t tdist__tcp_connect(tdist__tp_t *tp, const char *const *addrs, int64_t deadline_ms)
{
    static const char fn[] = "tdist__tp_connect";
    TDIST_ARG_CHECK(tp != NULL, fn);
    TDIST_ARG_CHECK(addrs != NULL, fn);
    if (tp->err != TDIST_OK) return sticky(tp);
    if (tp->connected || tp->listen_fd < 0)
        return tdist__error(TDIST_ERR_INVALID_ARG, "%s: rank %d: already connected", fn, tp->rank);
    for (int r = 0; r < tp->size; r++) {
        if (r == tp->rank) {
            snprintf(tp->ch[r].addr, ADDR_LEN, "%s", tp->addr);
            continue;
        }
        struct sockaddr_storage ss;
        socklen_t sl;
        if (!addrs[r] || strlen(addrs[r]) >= ADDR_LEN || !parse_addr(addrs[r], &ss, &sl))
            return tdist__error(TDIST_ERR_INVALID_ARG,
                                "%s: rank %d: address of peer rank %d \"%.80s\" is not "
                                "\"ip:port\" or \"[ip6]:port\"",
                                fn, tp->rank, r, addrs[r] ? addrs[r] : "(null)");
        snprintf(tp->ch[r].addr, ADDR_LEN, "%s", addrs[r]);
    }

    int nout = tp->rank; /* outgoing to ranks 0..rank-1 */
    int nfds = 2 + nout + MAX_INCOMING;
    pending_t *out = calloc((size_t)TDIST_MAX(nout, 1), sizeof *out);
    pending_t *in = calloc(MAX_INCOMING, sizeof *in);
    struct pollfd *pfd = calloc((size_t)nfds, sizeof *pfd);
    pending_t **pfd_p = calloc((size_t)nfds, sizeof *pfd_p);
    if (!out || !in || !pfd || !pfd_p) {
        free(out);
        free(in);
        free(pfd);
        free(pfd_p);
        return tdist__error(TDIST_ERR_NO_MEMORY, "%s: rank %d: out of memory", fn, tp->rank);
    }
    int64_t start = tdist__now_ms();
    for (int r = 0; r < nout; r++) {
        out[r].fd = -1;
        out[r].peer = r;
        out[r].retry_at = start;
    }
    for (int i = 0; i < MAX_INCOMING; i++) in[i].fd = -1;

    tdist_status_t st = TDIST_OK;
    int missing = tp->size - 1;
    for (;;) {
        if (atomic_load(&tp->aborted)) {
            st = fail_aborted(tp);
            break;
        }
        int64_t now = tdist__now_ms();
        int64_t wake_at = deadline_ms;
        for (int r = 0; r < nout; r++) {
            pending_t *p = &out[r];
            if (tp->ch[r].fd >= 0 || p->fd >= 0) continue;
            if (now >= p->retry_at) out_start(tp, p, now);
            if (p->fd >= 0 && p->phase == PH_SEND && out_step(tp, p, now)) missing--;
            if (p->fd < 0 && tp->ch[r].fd < 0) wake_at = TDIST_MIN(wake_at, p->retry_at);
        }
        if (missing == 0) break;
        if (now >= deadline_ms) {
            st = connect_timeout(tp, start);
            break;
        }
        int n = 0;
        pfd[n] = (struct pollfd){.fd = tp->wake_fd, .events = POLLIN};
        pfd_p[n++] = NULL;
        pfd[n] = (struct pollfd){.fd = tp->listen_fd, .events = POLLIN};
        pfd_p[n++] = NULL;
        for (int r = 0; r < nout; r++) {
            if (out[r].fd < 0) continue;
            pfd[n] = (struct pollfd){.fd = out[r].fd,
                                     .events = out[r].phase == PH_RECV ? POLLIN : POLLOUT};
            pfd_p[n++] = &out[r];
        }
        for (int i = 0; i < MAX_INCOMING; i++) {
            if (in[i].fd < 0) continue;
            pfd[n] = (struct pollfd){.fd = in[i].fd,
                                     .events = in[i].phase == PH_RECV ? POLLIN : POLLOUT};
            pfd_p[n++] = &in[i];
        }
        int rc = poll(pfd, (nfds_t)n, tdist__ms_left(wake_at));
        if (rc < 0 && errno != EINTR) {
            st = fail(tp, TDIST_ERR_SYSTEM, "rank %d: transport set-up: poll: %s", tp->rank,
                      strerror(errno));
            break;
        }
        if (rc <= 0) continue;
        now = tdist__now_ms();
        if (pfd[1].revents) accept_all(tp, in);
        for (int i = 2; i < n; i++) {
            pending_t *p = pfd_p[i];
            if (!pfd[i].revents || p->fd < 0) continue;
            if (p >= out && p < out + nout) {
                if (out_step(tp, p, now)) missing--;
            } else if (in_step(tp, p) >= 0) {
                missing--;
            }
        }
    }
    for (int r = 0; r < nout; r++) close_fd(&out[r].fd);
    for (int i = 0; i < MAX_INCOMING; i++) {
        if (in[i].fd >= 0 && st == TDIST_OK)
            TDIST_LOGW("rank %d: transport set-up: closing a connection from %s that never "
                       "completed its handshake",
                       tp->rank, in[i].from);
        close_fd(&in[i].fd);
    }
    free(out);
    free(in);
    free(pfd);
    free(pfd_p);
    if (st != TDIST_OK) return st;
    close_fd(&tp->listen_fd); /* every peer is here; nobody else may join */
    tp->connected = true;
    TDIST_LOGD("rank %d: transport mesh of %d ranks up in %lld ms", tp->rank, tp->size,
               (long long)(tdist__now_ms() - start));
    return TDIST_OK;
}

/* --------------------------------------------------------------- data */

static tdist_status_t post(tdist__tp_t *tp, tdist__tp_req_t *req, int peer, void *buf,
                           size_t len, bool is_send, const char *fn)
{
    TDIST_ARG_CHECK(tp != NULL, fn);
    TDIST_CHECK(tdist__tp_check_post(tp->rank, tp->size, req != NULL, peer, buf, len, fn));
    if (tp->err != TDIST_OK) return sticky(tp);
    if (atomic_load(&tp->aborted)) return fail_aborted(tp);
    if (!tp->connected)
        return tdist__error(TDIST_ERR_INVALID_ARG, "%s: rank %d: transport is not connected", fn,
                            tp->rank);
    channel_t *c = &tp->ch[peer];
    if (is_send)
        tdist__tp_req_enqueue(req, peer, buf, len, true, &c->sq_head, &c->sq_tail);
    else
        tdist__tp_req_enqueue(req, peer, buf, len, false, &c->rq_head, &c->rq_tail);
    return TDIST_OK;
}

tdist_status_t tdist__tcp_post_send(tdist__tp_t *tp, tdist__tp_req_t *req, int peer,
                                   const void *buf, size_t len)
{
    return post(tp, req, peer, (void *)buf, len, true, "tdist__tp_post_send");
}

tdist_status_t tdist__tcp_post_recv(tdist__tp_t *tp, tdist__tp_req_t *req, int peer, void *buf,
                                   size_t len)
{
    return post(tp, req, peer, buf, len, false, "tdist__tp_post_recv");
}

/* The peer is gone (err 0: EOF): fail the transport naming it. */
static tdist_status_t peer_lost(tdist__tp_t *tp, int peer, const tdist__tp_req_t *req, int err)
{
    channel_t *c = &tp->ch[peer];
    char what[96] = "";
    if (req)
        snprintf(what, sizeof what, " (%s %zu bytes, %zu done)",
                 req->is_send ? "sending" : "receiving", req->len, req->done);
    if (err == 0)
        return fail(tp, TDIST_ERR_CONNECTION, "rank %d: peer rank %d (%s) closed the connection%s",
                    tp->rank, peer, c->addr, what);
    if (err == ECONNRESET || err == EPIPE)
        return fail(tp, TDIST_ERR_CONNECTION,
                    "rank %d: peer rank %d (%s) closed the connection: %s%s", tp->rank, peer,
                    c->addr, strerror(err), what);
    tdist_status_t st = err == ENOMEM || err == ENOBUFS ? TDIST_ERR_NO_MEMORY : TDIST_ERR_CONNECTION;
    return fail(tp, st, "rank %d: peer rank %d (%s): socket error: %s%s", tp->rank, peer, c->addr,
                strerror(err), what);
}

/* Push queued sends to peer until the socket is full. Returns whether a
 * byte moved; on a failure the transport is failed (tp->err). */
static bool drive_send(tdist__tp_t *tp, int peer)
{
    channel_t *c = &tp->ch[peer];
    bool moved = false;
    while (c->sq_head && tp->err == TDIST_OK) {
        tdist__tp_req_t *req = c->sq_head;
        if (c->peer_closed) {
            peer_lost(tp, peer, req, 0);
            break;
        }
        ssize_t n = send(c->fd, req->buf + req->done, req->len - req->done,
                         MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) break;
            peer_lost(tp, peer, req, errno);
            break;
        }
        moved = true;
        req->done += (size_t)n;
        if (req->done == req->len) {
            c->sq_head = req->next;
            if (!c->sq_head) c->sq_tail = NULL;
            finish(req, TDIST_OK);
        }
    }
    return moved;
}

/* Fill queued receives from peer with what the socket holds, never
 * reading past the posted receives. Same conventions as drive_send. */
static bool drive_recv(tdist__tp_t *tp, int peer)
{
    channel_t *c = &tp->ch[peer];
    bool moved = false;
    while (c->rq_head && tp->err == TDIST_OK) {
        tdist__tp_req_t *req = c->rq_head;
        ssize_t n = recv(c->fd, req->buf + req->done, req->len - req->done, MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) break;
            peer_lost(tp, peer, req, errno);
            break;
        }
        if (n == 0) {
            peer_lost(tp, peer, req, 0);
            break;
        }
        moved = true;
        req->done += (size_t)n;
        if (req->done == req->len) {
            c->rq_head = req->next;
            if (!c->rq_head) c->rq_tail = NULL;
            finish(req, TDIST_OK);
        }
    }
    return moved;
}

/* The poll set, in tp->pfd: the abort eventfd first, then every channel
 * with work (sends want POLLOUT, receives POLLIN); an idle channel is
 * watched for the peer closing it (POLLRDHUP), which is noted and becomes
 * an error only when a request needs that peer. Returns its size. */
static int fill_pfd(tdist__tp_t *tp)
{
    int n = 0;
    tp->pfd[n] = (struct pollfd){.fd = tp->wake_fd, .events = POLLIN};
    tp->pfd_peer[n++] = -1;
    for (int p = 0; p < tp->size; p++) {
        channel_t *c = &tp->ch[p];
        if (p == tp->rank || c->fd < 0) continue;
        short ev = (short)((c->sq_head ? POLLOUT : 0) | (c->rq_head ? POLLIN : 0));
        if (!c->rq_head && !c->peer_closed) ev |= POLLRDHUP;
        if (!ev) continue;
        tp->pfd[n] = (struct pollfd){.fd = c->fd, .events = ev};
        tp->pfd_peer[n++] = p;
    }
    return n;
}

/* Drive the channels a poll over fill_pfd's n entries found ready.
 * Returns whether a byte moved. */
static bool serve_ready(tdist__tp_t *tp, int n)
{
    bool moved = false;
    for (int i = 1; i < n && tp->err == TDIST_OK; i++) {
        short re = tp->pfd[i].revents;
        if (!re) continue;
        int p = tp->pfd_peer[i];
        channel_t *c = &tp->ch[p];
        if (!c->rq_head && (re & (POLLRDHUP | POLLHUP | POLLERR))) {
            /* Closed or reset while we expect nothing from it: not an
             * error yet (it may have finished and left); a send to it or
             * a receive it cannot satisfy will fail. */
            c->peer_closed = true;
            TDIST_LOGD("rank %d: peer rank %d (%s) closed its channel", tp->rank, p, c->addr);
        }
        if (c->sq_head) moved |= drive_send(tp, p);
        if (c->rq_head) moved |= drive_recv(tp, p);
    }
    return moved;
}

tdist_status_t tdist__tcp_progress(tdist__tp_t *tp, int timeout_ms)
{
    TDIST_ARG_CHECK(tp != NULL, "tdist__tp_progress");
    if (tp->err != TDIST_OK) return sticky(tp);
    if (atomic_load(&tp->aborted)) return fail_aborted(tp);
    if (!tp->connected)
        return tdist__error(TDIST_ERR_INVALID_ARG, "tdist__tp_progress: rank %d: transport is not "
                            "connected", tp->rank);
    /* First try every channel with work without waiting: a send usually
     * goes straight into the socket. */
    bool moved = false;
    uint64_t spin_until = 0;
    for (int round = 0;; round++) {
        if (round == 0) {
            for (int p = 0; p < tp->size && tp->err == TDIST_OK; p++) {
                if (tp->ch[p].sq_head) moved |= drive_send(tp, p);
                if (tp->ch[p].rq_head) moved |= drive_recv(tp, p);
            }
        } else {
            /* one poll() tells which channels can move, instead of a
             * send or receive per channel that mostly finds EAGAIN */
            int n = fill_pfd(tp);
            int rc = poll(tp->pfd, (nfds_t)n, 0);
            if (rc < 0 && errno != EINTR)
                return fail(tp, TDIST_ERR_SYSTEM, "rank %d: transport poll: %s", tp->rank,
                            strerror(errno));
            if (rc > 0) moved |= serve_ready(tp, n);
        }
        if (tp->err != TDIST_OK) return sticky(tp);
        if (moved || timeout_ms == 0) return TDIST_OK;
        /* Retry, yielding, for up to SPIN_NS before sleeping in poll(): a
         * reply that is microseconds away costs less than a sleep and a
         * wake-up, and a rank that shares its core with the peer it waits
         * for hands it the CPU at once (as the shm transport's waits do).
         * A spin of 20 us that then stopped spinning for the next 64
         * sleeps made most waits of 4 ranks on 2 cores a wake-up
         * (docs/transport.md has the figures). */
        uint64_t now = tdist__now_ns();
        if (round == 0) spin_until = now + SPIN_NS;
        if (now >= spin_until || atomic_load(&tp->aborted)) break;
        if (round >= 4) sched_yield(); /* let a peer sharing this core run */
    }

    /* Then sleep in one poll (fill_pfd says what it watches). */
    int n = fill_pfd(tp);
    int rc = poll(tp->pfd, (nfds_t)n, timeout_ms < 0 ? -1 : timeout_ms);
    if (rc < 0) {
        if (errno == EINTR) return TDIST_OK;
        return fail(tp, TDIST_ERR_SYSTEM, "rank %d: transport poll: %s", tp->rank,
                    strerror(errno));
    }
    if (atomic_load(&tp->aborted)) return fail_aborted(tp);
    serve_ready(tp, n);
    return tp->err != TDIST_OK ? sticky(tp) : TDIST_OK;
}

/* The deadline passed: name every peer still owed bytes by reqs. */
static tdist_status_t wait_timeout(tdist__tp_t *tp, tdist__tp_req_t *const *reqs, size_t n,
                                   int64_t start)
{
    char msg[ERRMSG_LEN];
    size_t used = (size_t)snprintf(msg, sizeof msg,
                                   "rank %d: transport wait timed out after %lld ms; still owed:",
                                   tp->rank, (long long)(tdist__now_ms() - start));
    size_t listed = 0, open = 0;
    for (size_t i = 0; i < n; i++) {
        const tdist__tp_req_t *r = reqs[i];
        if (r->finished) continue;
        open++;
        if (listed == 8 || used >= sizeof msg) continue;
        used += (size_t)snprintf(msg + used, sizeof msg - used, "%s %s peer rank %d (%s) %zu/%zu bytes",
                                 listed ? ";" : "", r->is_send ? "send to" : "receive from",
                                 r->peer, tp->ch[r->peer].addr, r->done, r->len);
        listed++;
    }
    if (open > listed && used < sizeof msg)
        snprintf(msg + used, sizeof msg - used, "; and %zu more", open - listed);
    return tdist__error(TDIST_ERR_TIMEOUT, "%s", msg);
}

tdist_status_t tdist__tcp_wait(tdist__tp_t *tp, tdist__tp_req_t *const *reqs, size_t n,
                              int64_t deadline_ms)
{
    static const char fn[] = "tdist__tp_wait";
    TDIST_ARG_CHECK(tp != NULL, fn);
    TDIST_ARG_CHECK(reqs != NULL || n == 0, fn);
    for (size_t i = 0; i < n; i++)
        if (!reqs[i])
            return tdist__error(TDIST_ERR_INVALID_ARG, "%s: rank %d: request %zu is NULL", fn,
                                tp->rank, i);
    int64_t start = tdist__now_ms();
    for (;;) {
        size_t open = 0;
        tdist_status_t worst = TDIST_OK;
        for (size_t i = 0; i < n; i++) {
            if (!reqs[i]->finished)
                open++;
            else if (reqs[i]->status != TDIST_OK)
                worst = reqs[i]->status;
        }
        if (worst != TDIST_OK)
            return tp->err != TDIST_OK ? sticky(tp)
                                       : tdist__error(worst, "rank %d: a request failed", tp->rank);
        if (open == 0) return TDIST_OK;
        if (tp->err != TDIST_OK) return sticky(tp);
        int64_t now = tdist__now_ms();
        bool late = now >= deadline_ms;
        TDIST_CHECK(tdist__tcp_progress(tp, late ? 0 : tdist__ms_left(deadline_ms)));
        if (late) {
            bool all = true;
            for (size_t i = 0; i < n; i++) all = all && reqs[i]->finished;
            if (!all) return wait_timeout(tp, reqs, n, start);
        }
    }
}

/* Wait for reqs posted by a blocking convenience. Their memory is on the
 * caller's stack, so they cannot stay posted after a timeout: a timeout
 * fails the transport (the byte streams' positions are lost). */
static tdist_status_t wait_blocking(tdist__tp_t *tp, tdist__tp_req_t *const *reqs, size_t n,
                                    int64_t deadline_ms)
{
    tdist_status_t st = tdist__tcp_wait(tp, reqs, n, deadline_ms);
    if (st == TDIST_ERR_TIMEOUT)
        return fail(tp, TDIST_ERR_TIMEOUT, "%s (a blocking call timed out: the transport is failed)",
                    tdist_last_error());
    return st;
}

tdist_status_t tdist__tcp_send(tdist__tp_t *tp, int peer, const void *buf, size_t len,
                              int64_t deadline_ms)
{
    tdist__tp_req_t req, *r = &req;
    TDIST_CHECK(tdist__tcp_post_send(tp, &req, peer, buf, len));
    return wait_blocking(tp, &r, 1, deadline_ms);
}

tdist_status_t tdist__tcp_recv(tdist__tp_t *tp, int peer, void *buf, size_t len,
                              int64_t deadline_ms)
{
    tdist__tp_req_t req, *r = &req;
    TDIST_CHECK(tdist__tcp_post_recv(tp, &req, peer, buf, len));
    return wait_blocking(tp, &r, 1, deadline_ms);
}

tdist_status_t tdist__tcp_sendrecv(tdist__tp_t *tp, int to, const void *sbuf, size_t slen,
                                  int from, void *rbuf, size_t rlen, int64_t deadline_ms)
{
    tdist__tp_req_t sreq, rreq, *rs[2] = {&sreq, &rreq};
    TDIST_CHECK(tdist__tcp_post_send(tp, &sreq, to, sbuf, slen));
    tdist_status_t st = tdist__tcp_post_recv(tp, &rreq, from, rbuf, rlen);
    if (st != TDIST_OK) {
        if (!sreq.finished)
            return fail(tp, st, "%s (the send half was posted: the transport is failed)",
                        tdist_last_error());
        return st;
    }
    return wait_blocking(tp, rs, 2, deadline_ms);
}

void tdist__tcp_abort(tdist__tp_t *tp)
{
    if (!tp) return;
    atomic_store(&tp->aborted, true);
    uint64_t one = 1;
    ssize_t rc;
    TDIST_SYSCALL(rc, write(tp->wake_fd, &one, sizeof one));
    (void)rc; /* EAGAIN: the counter is already non-zero, a wake-up is pending */
}

void tdist__tcp_destroy(tdist__tp_t *tp)
{
    if (!tp) return;
    for (int p = 0; p < tp->size; p++) close_fd(&tp->ch[p].fd);
    close_fd(&tp->listen_fd);
    close_fd(&tp->wake_fd);
    free(tp->ch);
    free(tp->pfd);
    free(tp->pfd_peer);
    free(tp);
}
