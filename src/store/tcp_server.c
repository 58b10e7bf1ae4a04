/*
 * store/tcp_server.c — the TCP store server: one epoll event loop on a
 * thread of its own.
 *
 * Design
 *  - Every socket is nonblocking; every connection has an input buffer
 *    (bytes read, not yet parsed) and an output buffer (replies not yet
 *    sent). The loop never blocks on a client: a client that does not read
 *    its replies only grows its own output buffer, and once more than
 *    OUT_CAP bytes are still unsent when a new reply is due, it is dropped.
 *  - Frames are decoded by wire.c. Any malformed frame closes that
 *    connection only (no reply); the rest of the server goes on.
 *  - Keys live in the key table the hash store uses too (store/keytab.h).
 *    An entry may exist without a value while connections wait for it.
 *  - get / wait / multi_get that cannot be answered at once park the
 *    connection: the request body is copied, the connection is linked into
 *    the waiter list of the first missing key and, with a finite timeout,
 *    into a min-heap of deadlines. set / add / append / compare_set /
 *    multi_set wake the waiters of the keys they write; each woken
 *    connection re-checks its keys and either answers or waits on the next
 *    missing one. epoll_wait's timeout is the earliest deadline; expired
 *    waiters get a "timed out" reply.
 *  - While a connection waits it parses no further frames (the client
 *    sends one request at a time); bytes it still sends are buffered up to
 *    one frame cap, then it is dropped.
 *  - Connections are never freed inside an event handler: a dropped
 *    connection is closed at once, unlinked from every list and freed at
 *    the end of the loop iteration, so pointers in the epoll event batch
 *    stay valid.
 *  - destroy() sets a flag, wakes the loop through an eventfd and joins
 *    the thread, then frees everything.
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <fcntl.h>
#include <unistd.h>

#include "store/internal.h"
#include "store/keytab.h"
#include "core/net.h"
#include "store/wire.h"
#include "core/auth.h"

#define OUT_CAP (4u << 20)       /* unsent reply bytes before a new reply drops the client */
#define READ_CHUNK (64u << 10)   /* input buffer growth step */
#define SHRINK_ABOVE (1u << 20)  /* free idle buffers larger than this */
#define MAX_EVENTS 256
#define ACCEPT_BATCH 128
#define ACCEPT_PAUSE_MS 100      /* after EMFILE and the like */
#define PRE_HELLO_MAX 128u       /* body cap of a frame before a client is authenticated */

typedef struct entry entry_t;
typedef struct conn conn_t;

/* One key of the table. present: it has a value (else it exists only
 * because connections wait for it). */
struct entry {
    tdist__keynode_t node; /* first: the key table's link; node.key is key below */
    uint8_t *val;  /* vlen bytes (malloc'd, at least 1 byte) when present */
    uint32_t vlen;
    bool present;
    conn_t *waiters; /* connections parked on this key */
    char key[];      /* the key's bytes, NUL-terminated for convenience */
};

/* One client connection. */
struct conn {
    tdist_store_server_t *srv;
    int fd;
    char peer[64];
    conn_t *prev, *next; /* every live connection */
    /* input: bytes [in_off, in_len) of in are unparsed */
    uint8_t *in;
    size_t in_len, in_cap;
    /* output: bytes [out_off, out.len) of out are unsent */
    tdist__wbuf_t out;
    size_t out_off;
    bool want_out;      /* EPOLLOUT registered */
    bool hello_done;    /* authenticated: serves requests */
    bool auth_wait;     /* HELLO answered with a challenge; AUTH expected next */
    uint8_t snonce[TDIST_NONCE_LEN];         /* the challenge sent */
    uint8_t cnonce[TDIST_WIRE_MAX_NONCE];    /* the client's nonce */
    uint32_t cnonce_len;
    conn_t *uprev, *unext; /* unauthenticated connections, oldest first */
    int64_t hello_deadline; /* drop the connection if no HELLO by then */
    bool close_after_flush;
    bool dead;
    bool on_ready;
    conn_t *ready_next; /* ready list: parse buffered input again */
    conn_t *dead_next;  /* dead list: free at the end of the iteration */
    /* the parked request (pending) */
    bool pending;
    uint8_t *pend_body;
    tdist__wire_request_t pend_req;
    uint32_t pend_next;    /* index of the key waited on */
    int64_t pend_deadline; /* INT64_MAX: none */
    int64_t pend_timeout_ms;
    size_t heap_idx;       /* SIZE_MAX: not in the heap */
    entry_t *wait_entry;
    conn_t *wprev, *wnext;
};

struct tdist_store_server {
    char addr[320];
    uint16_t port;
    int listen_fd, epfd, evfd;
    pthread_t thread;
    atomic_int num_clients;
    atomic_bool stop;
    char *secret; /* NULL: no proof required */
    int max_clients;        /* authenticated */
    int max_unauth;
    uint64_t max_bytes, max_keys; /* caps on what the table holds */
    uint64_t nbytes;        /* bytes of keys and values present */
    conn_t *unauth, *unauth_tail; /* connections not yet authenticated, oldest first */
    tdist__wire_limits_t lim;
    tdist__keytab_t keys;
    int64_t npresent; /* keys with a value */
    /* connections */
    conn_t *conns;
    conn_t *ready, *ready_tail;
    conn_t *dead;
    conn_t **heap;
    size_t heap_len, heap_cap;
    int64_t accept_resume_ms; /* INT64_MAX: accepting normally */
    int hello_timeout_ms;
    int pre_hello;             /* live connections that have not said HELLO */
    int64_t next_hello_sweep;  /* when to look for HELLO deadlines next */
};

/* Distinct addresses tag the listening socket and the eventfd in epoll. */
static char listen_tag, wake_tag;

/* ------------------------------------------------------------------ table */

/* The entry for key, or NULL. */
static entry_t *table_find(tdist_store_server_t *srv, const uint8_t *key, uint32_t klen)
{
    return (entry_t *)tdist__keytab_find(&srv->keys, key, klen);
}

/* The entry for key, created (without a value) if missing. NULL on OOM. */
static entry_t *table_get_or_create(tdist_store_server_t *srv, const uint8_t *key, uint32_t klen)
{
    entry_t *e = table_find(srv, key, klen);
    if (e) return e;
    e = calloc(1, sizeof *e + (size_t)klen + 1);
    if (!e) return NULL;
    memcpy(e->key, key, klen);
    e->key[klen] = '\0';
    e->node.key = e->key;
    e->node.klen = klen;
    tdist__keytab_add(&srv->keys, &e->node);
    return e;
}

static void free_entry(tdist__keynode_t *n)
{
    entry_t *e = (entry_t *)n;
    free(e->val);
    free(e);
}

/* Free e if it has neither a value nor waiters. */
static void table_maybe_remove(tdist_store_server_t *srv, entry_t *e)
{
    if (e->present || e->waiters) return;
    tdist__keytab_remove(&srv->keys, &e->node);
    free_entry(&e->node);
}

/* Give e a copy of len bytes as its value. -1 on OOM (e unchanged). */
static int entry_set(tdist_store_server_t *srv, entry_t *e, const uint8_t *val, uint32_t len)
{
    uint8_t *v = malloc(len ? len : 1);
    if (!v) return -1;
    if (len) memcpy(v, val, len);
    free(e->val);
    srv->nbytes += (uint64_t)len - (e->present ? e->vlen : 0) + (e->present ? 0 : e->node.klen);
    e->val = v;
    e->vlen = len;
    if (!e->present) srv->npresent++;
    e->present = true;
    return 0;
}

/* Whether key has a value. */
static bool key_present(tdist_store_server_t *srv, const tdist__wire_bytes_t *k)
{
    entry_t *e = table_find(srv, k->ptr, k->len);
    return e && e->present;
}

/* ------------------------------------------------------------ deadline heap */

/* Heap order: earlier deadline first. */
static bool heap_less(conn_t *a, conn_t *b) { return a->pend_deadline < b->pend_deadline; }

/* Swap heap slots i and j, keeping heap_idx in step. */
static void heap_swap(tdist_store_server_t *srv, size_t i, size_t j)
{
    conn_t *t = srv->heap[i];
    srv->heap[i] = srv->heap[j];
    srv->heap[j] = t;
    srv->heap[i]->heap_idx = i;
    srv->heap[j]->heap_idx = j;
}

/* Move slot i up until its parent is not later. */
static void heap_up(tdist_store_server_t *srv, size_t i)
{
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!heap_less(srv->heap[i], srv->heap[p])) break;
        heap_swap(srv, i, p);
        i = p;
    }
}

/* Move slot i down until no child is earlier. */
static void heap_down(tdist_store_server_t *srv, size_t i)
{
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < srv->heap_len && heap_less(srv->heap[l], srv->heap[m])) m = l;
        if (r < srv->heap_len && heap_less(srv->heap[r], srv->heap[m])) m = r;
        if (m == i) break;
        heap_swap(srv, i, m);
        i = m;
    }
}

/* Add c (with a finite pend_deadline) to the heap. -1 on OOM. */
static int heap_push(tdist_store_server_t *srv, conn_t *c)
{
    if (srv->heap_len == srv->heap_cap) {
        size_t cap = srv->heap_cap ? srv->heap_cap * 2 : 64;
        conn_t **h = realloc(srv->heap, cap * sizeof *h);
        if (!h) return -1;
        srv->heap = h;
        srv->heap_cap = cap;
    }
    c->heap_idx = srv->heap_len;
    srv->heap[srv->heap_len++] = c;
    heap_up(srv, c->heap_idx);
    return 0;
}

/* Remove c from the heap if it is in it. */
static void heap_remove(tdist_store_server_t *srv, conn_t *c)
{
    size_t i = c->heap_idx;
    if (i == SIZE_MAX) return;
    c->heap_idx = SIZE_MAX;
    srv->heap_len--;
    if (i == srv->heap_len) return;
    srv->heap[i] = srv->heap[srv->heap_len];
    srv->heap[i]->heap_idx = i;
    heap_up(srv, i);
    heap_down(srv, srv->heap[i]->heap_idx);
}

/* ------------------------------------------------------------ connections */

/* Unlink c from the waiter list of the key it waits on, if any. */
static void unwait(conn_t *c)
{
    entry_t *e = c->wait_entry;
    if (!e) return;
    if (c->wprev)
        c->wprev->wnext = c->wnext;
    else
        e->waiters = c->wnext;
    if (c->wnext) c->wnext->wprev = c->wprev;
    c->wprev = c->wnext = NULL;
    c->wait_entry = NULL;
    table_maybe_remove(c->srv, e);
}

/* Forget c's parked request (waiter list, heap, copied body). */
static void clear_pending(conn_t *c)
{
    if (!c->pending) return;
    unwait(c);
    heap_remove(c->srv, c);
    tdist__wire_request_free(&c->pend_req);
    free(c->pend_body);
    c->pend_body = NULL;
    c->pending = false;
}

/* Take c (not yet authenticated) off the unauthenticated list. */
static void unauth_unlink(conn_t *c)
{
    tdist_store_server_t *srv = c->srv;
    srv->pre_hello--;
    if (c->uprev)
        c->uprev->unext = c->unext;
    else
        srv->unauth = c->unext;
    if (c->unext)
        c->unext->uprev = c->uprev;
    else
        srv->unauth_tail = c->uprev;
    c->uprev = c->unext = NULL;
}

/* Close c now and free it at the end of the loop iteration. why is logged. */
static void drop(conn_t *c, const char *why)
{
    if (c->dead) return;
    tdist_store_server_t *srv = c->srv;
    TDIST_LOGD("store server %s: closing connection from %s: %s", srv->addr, c->peer, why);
    c->dead = true;
    clear_pending(c);
    /* Remove it from epoll explicitly: close() alone does not when another
     * process shares the socket (a child between fork and exec), and epoll
     * would then report events for a connection that has been freed. */
    epoll_ctl(srv->epfd, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    c->fd = -1;
    if (c->prev)
        c->prev->next = c->next;
    else
        srv->conns = c->next;
    if (c->next) c->next->prev = c->prev;
    atomic_fetch_sub(&srv->num_clients, 1);
    if (!c->hello_done) unauth_unlink(c);
    c->dead_next = srv->dead;
    srv->dead = c;
}

/* Free c's memory (after drop, or at destroy). */
static void conn_free(conn_t *c)
{
    free(c->in);
    tdist__wbuf_free(&c->out);
    free(c);
}

/* Queue c to parse its buffered input again in this loop iteration. */
static void mark_ready(conn_t *c)
{
    if (c->on_ready || c->dead) return;
    c->on_ready = true;
    c->ready_next = NULL;
    if (c->srv->ready_tail)
        c->srv->ready_tail->ready_next = c;
    else
        c->srv->ready = c;
    c->srv->ready_tail = c;
}

/* Register or unregister interest in EPOLLOUT. */
static void set_want_out(conn_t *c, bool on)
{
    if (c->want_out == on) return;
    struct epoll_event ev = {.events = EPOLLIN | (on ? EPOLLOUT : 0), .data.ptr = c};
    if (epoll_ctl(c->srv->epfd, EPOLL_CTL_MOD, c->fd, &ev) != 0) {
        drop(c, "epoll_ctl failed");
        return;
    }
    c->want_out = on;
}

/* Send as much of c's output as the socket takes now. May drop c. */
static void flush(conn_t *c)
{
    while (!c->dead && c->out_off < c->out.len) {
        ssize_t n = send(c->fd, c->out.data + c->out_off, c->out.len - c->out_off, MSG_NOSIGNAL);
        if (n > 0) {
            c->out_off += (size_t)n;
        } else if (n < 0 && errno == EINTR) {
            continue;
        } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            if (c->close_after_flush) {
                drop(c, "refused (reply not taken at once)");
                return;
            }
            set_want_out(c, true);
            return;
        } else {
            drop(c, "send failed (client gone)");
            return;
        }
    }
    if (c->dead) return;
    /* everything sent */
    if (c->out.cap > SHRINK_ABOVE)
        tdist__wbuf_free(&c->out);
    else
        tdist__wbuf_clear(&c->out);
    c->out_off = 0;
    if (c->close_after_flush) {
        drop(c, "refused");
        return;
    }
    set_want_out(c, false);
}

/* Check that c may get another reply: a client with more than OUT_CAP
 * unsent bytes does not read its replies and is dropped. true if ok. */
static bool reply_room(conn_t *c)
{
    if (c->dead) return false;
    if (c->out.len - c->out_off > OUT_CAP) {
        drop(c, "client does not read its replies (output buffer over the cap)");
        return false;
    }
    return true;
}

/* After writing a reply: drop c if the buffer ran out of memory. */
static void reply_done(conn_t *c)
{
    if (c->out.oom) drop(c, "out of memory for a reply");
}

/* Reply with status != OK and a printf-style message. */
static void reply_error(conn_t *c, uint8_t op, uint8_t status, const char *fmt, ...)
    TDIST_PRINTF(4, 5);
static void reply_error(conn_t *c, uint8_t op, uint8_t status, const char *fmt, ...)
{
    if (!reply_room(c)) return;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    tdist__wire_put_error(&c->out, op, status, msg);
    reply_done(c);
}

/* OK reply with an empty body. */
static void reply_empty(conn_t *c, uint8_t op)
{
    if (!reply_room(c)) return;
    size_t off = tdist__wbuf_begin_frame(&c->out, op, TDIST_WIRE_OK);
    tdist__wbuf_end_frame(&c->out, off);
    reply_done(c);
}

/* OK reply carrying one byte string. */
static void reply_bytes(conn_t *c, uint8_t op, const void *p, uint32_t len)
{
    if (!reply_room(c)) return;
    size_t off = tdist__wbuf_begin_frame(&c->out, op, TDIST_WIRE_OK);
    tdist__wbuf_put_bytes(&c->out, p, len);
    tdist__wbuf_end_frame(&c->out, off);
    reply_done(c);
}

/* OK reply carrying one i64. */
static void reply_i64(conn_t *c, uint8_t op, int64_t v)
{
    if (!reply_room(c)) return;
    size_t off = tdist__wbuf_begin_frame(&c->out, op, TDIST_WIRE_OK);
    tdist__wbuf_put_i64(&c->out, v);
    tdist__wbuf_end_frame(&c->out, off);
    reply_done(c);
}

/* OK reply carrying one u8 flag. */
static void reply_flag(conn_t *c, uint8_t op, bool v)
{
    if (!reply_room(c)) return;
    size_t off = tdist__wbuf_begin_frame(&c->out, op, TDIST_WIRE_OK);
    tdist__wbuf_put_u8(&c->out, v ? 1 : 0);
    tdist__wbuf_end_frame(&c->out, off);
    reply_done(c);
}

/* Print at most 200 bytes of a key in messages. */
#define KEYFMT "\"%.*s%s\""
#define KEYARG(k) (int)TDIST_MIN((k).len, 200u), (const char *)(k).ptr, ((k).len > 200u ? "..." : "")

/* ----------------------------------------------------------- waiting */

static void try_complete(conn_t *c);

/* Wake every connection parked on e (which just got a value). */
static void wake(tdist_store_server_t *srv, entry_t *e)
{
    conn_t *list = e->waiters;
    e->waiters = NULL;
    while (list) {
        conn_t *c = list;
        list = c->wnext;
        c->wprev = c->wnext = NULL;
        c->wait_entry = NULL;
        try_complete(c);
    }
    table_maybe_remove(srv, e);
}

/* Wake the waiters of key k, if it has any. */
static void wake_key(tdist_store_server_t *srv, const tdist__wire_bytes_t *k)
{
    entry_t *e = table_find(srv, k->ptr, k->len);
    if (e && e->waiters) wake(srv, e);
}

/* Index of the first key in [from, n) without a value; n if none. */
static uint32_t first_missing(tdist_store_server_t *srv, const tdist__wire_request_t *r,
                              uint32_t from)
{
    for (uint32_t i = from; i < r->n; i++)
        if (!key_present(srv, &r->keys[i])) return i;
    return r->n;
}

/* Answer a get / wait / multi_get whose keys all have values. */
static void answer_blocking(conn_t *c, const tdist__wire_request_t *r)
{
    tdist_store_server_t *srv = c->srv;
    if (r->op == TDIST_WIRE_GET) {
        entry_t *e = table_find(srv, r->keys[0].ptr, r->keys[0].len);
        reply_bytes(c, r->op, e->val, e->vlen);
    } else if (r->op == TDIST_WIRE_WAIT) {
        reply_empty(c, r->op);
    } else {
        uint64_t total = 4;
        for (uint32_t i = 0; i < r->n; i++)
            total += 4u + table_find(srv, r->keys[i].ptr, r->keys[i].len)->vlen;
        if (total > TDIST_WIRE_MAX_FRAME) {
            reply_error(c, r->op, TDIST_WIRE_ETOOLARGE,
                        "multi_get: the %u values total %llu bytes, over the frame cap of %u",
                        r->n, (unsigned long long)total, TDIST_WIRE_MAX_FRAME);
            return;
        }
        if (!reply_room(c)) return;
        size_t off = tdist__wbuf_begin_frame(&c->out, r->op, TDIST_WIRE_OK);
        tdist__wbuf_put_u32(&c->out, r->n);
        for (uint32_t i = 0; i < r->n; i++) {
            entry_t *e = table_find(srv, r->keys[i].ptr, r->keys[i].len);
            tdist__wbuf_put_bytes(&c->out, e->val, e->vlen);
        }
        tdist__wbuf_end_frame(&c->out, off);
        reply_done(c);
    }
}

/* Park c on key index i of its pending request. false on OOM (then c got
 * an error reply and is no longer pending). */
static bool park_on(conn_t *c, uint32_t i)
{
    tdist__wire_bytes_t *k = &c->pend_req.keys[i];
    entry_t *e = table_get_or_create(c->srv, k->ptr, k->len);
    if (!e) {
        uint8_t op = c->pend_req.op;
        clear_pending(c);
        reply_error(c, op, TDIST_WIRE_ENOMEM, "%s: server out of memory", tdist__wire_op_name(op));
        return false;
    }
    c->pend_next = i;
    c->wait_entry = e;
    c->wprev = NULL;
    c->wnext = e->waiters;
    if (e->waiters) e->waiters->wprev = c;
    e->waiters = c;
    return true;
}

/* Re-check c's pending request after a key it waited on got a value:
 * answer it, or park it on the next missing key. */
static void try_complete(conn_t *c)
{
    if (c->dead || !c->pending) return;
    tdist__wire_request_t *r = &c->pend_req;
    uint32_t i = first_missing(c->srv, r, c->pend_next);
    /* multi_get needs every value at once: re-check the earlier keys */
    if (i == r->n && r->op == TDIST_WIRE_MULTI_GET) i = first_missing(c->srv, r, 0);
    if (i < r->n) {
        park_on(c, i);
        flush(c);
        return;
    }
    answer_blocking(c, r);
    clear_pending(c);
    flush(c);
    mark_ready(c); /* it may have sent more frames meanwhile */
}

/* Start a get / wait / multi_get: answer now, time out at once
 * (timeout 0), or park. body/len is the frame body (copied if parked). */
static void start_blocking(conn_t *c, tdist__wire_request_t *r, const uint8_t *body, size_t len)
{
    tdist_store_server_t *srv = c->srv;
    uint32_t i = first_missing(srv, r, 0);
    if (i == r->n) {
        answer_blocking(c, r);
        return;
    }
    if (r->timeout_ms == 0) {
        reply_error(c, r->op, TDIST_WIRE_ETIMEOUT, "key " KEYFMT " not set (timeout 0 ms)",
                    KEYARG(r->keys[i]));
        return;
    }
    /* copy the body and decode it again so the views point into the copy */
    uint8_t *copy = malloc(len ? len : 1);
    const char *why = NULL;
    if (!copy) goto oom;
    memcpy(copy, body, len);
    if (tdist__wire_request_decode(r->op, copy, len, &srv->lim, &c->pend_req, &why) != 0) {
        free(copy);
        goto oom;
    }
    c->pend_body = copy;
    c->pending = true;
    c->pend_timeout_ms = r->timeout_ms;
    c->pend_deadline = INT64_MAX;
    if (r->timeout_ms > 0) {
        int64_t now = tdist__now_ms();
        /* +1: the deadline never fires before timeout_ms has fully passed */
        c->pend_deadline = r->timeout_ms > INT64_MAX - now - 1 ? INT64_MAX : now + r->timeout_ms + 1;
        if (c->pend_deadline != INT64_MAX && heap_push(srv, c) != 0) {
            clear_pending(c);
            goto oom;
        }
    }
    park_on(c, i);
    return;
oom:
    reply_error(c, r->op, TDIST_WIRE_ENOMEM, "%s: server out of memory", tdist__wire_op_name(r->op));
}

/* Answer every parked request whose deadline has passed. */
static void expire(tdist_store_server_t *srv)
{
    int64_t now = tdist__now_ms();
    while (srv->heap_len > 0 && srv->heap[0]->pend_deadline <= now) {
        conn_t *c = srv->heap[0];
        tdist__wire_request_t *r = &c->pend_req;
        uint8_t op = r->op;
        char key[256];
        tdist__wire_bytes_t k = r->keys[c->pend_next];
        snprintf(key, sizeof key, KEYFMT, KEYARG(k));
        long long t = (long long)c->pend_timeout_ms;
        uint32_t n = r->n;
        clear_pending(c); /* also removes it from the heap */
        if (n == 1)
            reply_error(c, op, TDIST_WIRE_ETIMEOUT, "key %s not set after %lld ms", key, t);
        else
            reply_error(c, op, TDIST_WIRE_ETIMEOUT, "key %s (one of %u keys) not set after %lld ms",
                        key, n, t);
        flush(c);
        mark_ready(c);
    }
}

/* ---------------------------------------------------------- operations */

/* Whether the table may grow by add_keys keys and add_bytes bytes (what a
 * write would change; negative when it shrinks). If not, replies
 * ETOOLARGE to op on c and returns false. */
static bool fits(conn_t *c, uint8_t op, int64_t add_keys, int64_t add_bytes)
{
    tdist_store_server_t *srv = c->srv;
    uint64_t keys = (uint64_t)((int64_t)srv->npresent + add_keys);
    uint64_t bytes = (uint64_t)((int64_t)srv->nbytes + add_bytes);
    if ((add_keys <= 0 || keys <= srv->max_keys) && (add_bytes <= 0 || bytes <= srv->max_bytes))
        return true;
    reply_error(c, op, TDIST_WIRE_ETOOLARGE,
                "%s: the store is full: it would hold %llu keys and %llu bytes, over its cap of "
                "%llu keys or %llu bytes (max_total_keys, max_total_bytes: TDIST_STORE_MAX_NUM_KEYS, "
                "TDIST_STORE_MAX_BYTES)",
                tdist__wire_op_name(op), (unsigned long long)keys, (unsigned long long)bytes,
                (unsigned long long)srv->max_keys, (unsigned long long)srv->max_bytes);
    return false;
}

/* What setting key k to a value of vlen bytes adds: *keys and *bytes. */
static void set_growth(tdist_store_server_t *srv, const tdist__wire_bytes_t *k, uint32_t vlen,
                       int64_t *keys, int64_t *bytes)
{
    entry_t *e = table_find(srv, k->ptr, k->len);
    bool present = e && e->present;
    *keys += present ? 0 : 1;
    *bytes += (int64_t)vlen - (present ? (int64_t)e->vlen : -(int64_t)k->len);
}

/* c has authenticated: it leaves the unauthenticated list and is served. */
static void authenticated(conn_t *c)
{
    c->hello_done = true;
    c->auth_wait = false;
    unauth_unlink(c);
}

/* HELLO: check the protocol version; without a secret the client is
 * served at once, with one it gets a fresh challenge and must answer it
 * with AUTH. */
static void op_hello(conn_t *c, const tdist__wire_request_t *r)
{
    tdist_store_server_t *srv = c->srv;
    if (r->version != TDIST_WIRE_VERSION) {
        reply_error(c, r->op, TDIST_WIRE_EVERSION,
                    "store server %s speaks protocol version %u, client sent version %u",
                    srv->addr, TDIST_WIRE_VERSION, r->version);
        c->close_after_flush = true;
        return;
    }
    if (!srv->secret) {
        authenticated(c);
        reply_empty(c, r->op);
        return;
    }
    if (tdist__random_bytes(c->snonce, sizeof c->snonce) != 0) {
        reply_error(c, r->op, TDIST_WIRE_ENOMEM, "store server %s: no random bytes for a challenge",
                    srv->addr);
        c->close_after_flush = true;
        return;
    }
    memcpy(c->cnonce, r->nonce.ptr, r->nonce.len);
    c->cnonce_len = r->nonce.len;
    c->auth_wait = true;
    if (!reply_room(c)) return;
    size_t off = tdist__wbuf_begin_frame(&c->out, r->op, TDIST_WIRE_OK);
    tdist__wbuf_put_u8(&c->out, 1);
    tdist__wbuf_put_bytes(&c->out, c->snonce, sizeof c->snonce);
    tdist__wbuf_end_frame(&c->out, off);
    reply_done(c);
}

/* AUTH: check the client's proof of the secret over our challenge; answer
 * with our own proof, or refuse and close. */
static void op_auth(conn_t *c, const tdist__wire_request_t *r)
{
    tdist_store_server_t *srv = c->srv;
    tdist__wire_bytes_t sn = {c->snonce, sizeof c->snonce}, cn = {c->cnonce, c->cnonce_len};
    uint8_t want[TDIST_WIRE_PROOF_LEN];
    tdist__wire_proof(srv->secret, false, &sn, &cn, want);
    if (r->proof.len != sizeof want || !tdist__const_time_eq(want, r->proof.ptr, sizeof want)) {
        TDIST_LOGW("store server %s: %s failed to prove the job's secret; closing", srv->addr,
                   c->peer);
        reply_error(c, r->op, TDIST_WIRE_EAUTH,
                    "store server %s refused the connection: wrong secret (the server requires "
                    "the job's secret, TDIST_JOB_SECRET)", srv->addr);
        c->close_after_flush = true;
        return;
    }
    uint8_t mine[TDIST_WIRE_PROOF_LEN];
    tdist__wire_proof(srv->secret, true, &cn, &sn, mine);
    authenticated(c);
    reply_bytes(c, r->op, mine, sizeof mine);
}

/* The server ran out of memory while serving op. */
static void reply_oom(conn_t *c, uint8_t op)
{
    reply_error(c, op, TDIST_WIRE_ENOMEM, "%s: store server out of memory", tdist__wire_op_name(op));
}

/* SET: store the value, reply, wake waiters. */
static void op_set(conn_t *c, const tdist__wire_request_t *r)
{
    int64_t keys = 0, bytes = 0;
    set_growth(c->srv, &r->keys[0], r->values[0].len, &keys, &bytes);
    if (!fits(c, r->op, keys, bytes)) return;
    entry_t *e = table_get_or_create(c->srv, r->keys[0].ptr, r->keys[0].len);
    if (!e || entry_set(c->srv, e, r->values[0].ptr, r->values[0].len) != 0) {
        if (e) table_maybe_remove(c->srv, e);
        reply_oom(c, r->op);
        return;
    }
    reply_empty(c, r->op);
    if (e->waiters) wake(c->srv, e);
}

/* ADD: add delta to the decimal counter (missing = 0), reply the new value,
 * wake waiters. Non-numeric values and overflow are EINVALID. */
static void op_add(conn_t *c, const tdist__wire_request_t *r)
{
    tdist_store_server_t *srv = c->srv;
    entry_t *e = table_find(srv, r->keys[0].ptr, r->keys[0].len);
    int64_t cur = 0, next;
    if (e && e->present && tdist__store_parse_counter(e->val, e->vlen, &cur) != 0) {
        reply_error(c, r->op, TDIST_WIRE_EINVALID, "add: the value of key " KEYFMT
                    " is not an integer", KEYARG(r->keys[0]));
        return;
    }
    if (__builtin_add_overflow(cur, r->delta, &next)) {
        reply_error(c, r->op, TDIST_WIRE_EINVALID, "add: %lld + %lld overflows for key " KEYFMT,
                    (long long)cur, (long long)r->delta, KEYARG(r->keys[0]));
        return;
    }
    char text[32];
    int len = snprintf(text, sizeof text, "%lld", (long long)next);
    int64_t keys = 0, bytes = 0;
    set_growth(srv, &r->keys[0], (uint32_t)len, &keys, &bytes);
    if (!fits(c, r->op, keys, bytes)) return;
    if (!e) e = table_get_or_create(srv, r->keys[0].ptr, r->keys[0].len);
    if (!e || entry_set(srv, e, (const uint8_t *)text, (uint32_t)len) != 0) {
        if (e) table_maybe_remove(srv, e);
        reply_oom(c, r->op);
        return;
    }
    reply_i64(c, r->op, next);
    if (e->waiters) wake(srv, e);
}

/* compare_set with torch.distributed's rule (see store.h). */
static void op_cas(conn_t *c, const tdist__wire_request_t *r)
{
    tdist_store_server_t *srv = c->srv;
    entry_t *e = table_find(srv, r->keys[0].ptr, r->keys[0].len);
    bool present = e && e->present;
    if (!present && r->expected.len != 0) {
        reply_bytes(c, r->op, r->expected.ptr, r->expected.len);
        return;
    }
    if (present && (e->vlen != r->expected.len ||
                    (e->vlen && memcmp(e->val, r->expected.ptr, e->vlen) != 0))) {
        reply_bytes(c, r->op, e->val, e->vlen);
        return;
    }
    int64_t keys = 0, bytes = 0;
    set_growth(srv, &r->keys[0], r->desired.len, &keys, &bytes);
    if (!fits(c, r->op, keys, bytes)) return;
    if (!e) e = table_get_or_create(srv, r->keys[0].ptr, r->keys[0].len);
    if (!e || entry_set(srv, e, r->desired.ptr, r->desired.len) != 0) {
        if (e) table_maybe_remove(srv, e);
        reply_oom(c, r->op);
        return;
    }
    reply_bytes(c, r->op, e->val, e->vlen);
    if (e->waiters) wake(srv, e);
}

/* CHECK: whether every key has a value. */
static void op_check(conn_t *c, const tdist__wire_request_t *r)
{
    reply_flag(c, r->op, first_missing(c->srv, r, 0) == r->n);
}

/* DELETE: drop the value (the entry stays while someone waits on it). */
static void op_delete(conn_t *c, const tdist__wire_request_t *r)
{
    tdist_store_server_t *srv = c->srv;
    entry_t *e = table_find(srv, r->keys[0].ptr, r->keys[0].len);
    bool was = e && e->present;
    if (was) {
        srv->nbytes -= e->vlen;
        free(e->val);
        e->val = NULL;
        e->vlen = 0;
        e->present = false;
        srv->npresent--;
        srv->nbytes -= e->node.klen;
        table_maybe_remove(srv, e);
    }
    reply_flag(c, r->op, was);
}

/* APPEND: extend the value (creating it), within max_value; wake waiters. */
static void op_append(conn_t *c, const tdist__wire_request_t *r)
{
    tdist_store_server_t *srv = c->srv;
    const tdist__wire_bytes_t *v = &r->values[0];
    entry_t *old = table_find(srv, r->keys[0].ptr, r->keys[0].len);
    bool had = old && old->present;
    if (!fits(c, r->op, had ? 0 : 1, (int64_t)v->len + (had ? 0 : (int64_t)r->keys[0].len))) return;
    entry_t *e = table_get_or_create(srv, r->keys[0].ptr, r->keys[0].len);
    if (!e) {
        reply_oom(c, r->op);
        return;
    }
    if (!e->present) {
        if (entry_set(srv, e, v->ptr, v->len) != 0) {
            table_maybe_remove(srv, e);
            reply_oom(c, r->op);
            return;
        }
    } else {
        uint64_t total = (uint64_t)e->vlen + v->len;
        if (total > srv->lim.max_value) {
            reply_error(c, r->op, TDIST_WIRE_ETOOLARGE,
                        "append: key " KEYFMT " would hold %llu bytes, over the cap of %u",
                        KEYARG(r->keys[0]), (unsigned long long)total, srv->lim.max_value);
            return;
        }
        uint8_t *nv = realloc(e->val, total ? total : 1);
        if (!nv) {
            reply_oom(c, r->op);
            return;
        }
        if (v->len) memcpy(nv + e->vlen, v->ptr, v->len);
        srv->nbytes += v->len;
        e->val = nv;
        e->vlen = (uint32_t)total;
    }
    reply_empty(c, r->op);
    if (e->waiters) wake(srv, e);
}

/* MULTI_SET: store every pair, reply, then wake waiters of every key. */
static void op_multi_set(conn_t *c, const tdist__wire_request_t *r)
{
    tdist_store_server_t *srv = c->srv;
    int64_t keys = 0, bytes = 0; /* a key given twice counts twice: an upper bound */
    for (uint32_t i = 0; i < r->n; i++) set_growth(srv, &r->keys[i], r->values[i].len, &keys, &bytes);
    if (!fits(c, r->op, keys, bytes)) return;
    for (uint32_t i = 0; i < r->n; i++) {
        entry_t *e = table_get_or_create(srv, r->keys[i].ptr, r->keys[i].len);
        if (!e || entry_set(srv, e, r->values[i].ptr, r->values[i].len) != 0) {
            if (e) table_maybe_remove(srv, e);
            reply_oom(c, r->op);
            return;
        }
    }
    reply_empty(c, r->op);
    /* wake only after every key is set, so waiters see the whole batch */
    for (uint32_t i = 0; i < r->n; i++) wake_key(srv, &r->keys[i]);
}

/* Handle one complete frame. May park or drop c. */
static void handle_frame(conn_t *c, uint8_t op, const uint8_t *body, size_t len)
{
    tdist__wire_request_t r;
    const char *why = "malformed frame";
    int rc = tdist__wire_request_decode(op, body, len, &c->srv->lim, &r, &why);
    if (rc == -2) {
        drop(c, "out of memory decoding a frame");
        return;
    }
    if (rc != 0) {
        drop(c, why);
        return;
    }
    if (!c->hello_done && !c->auth_wait && op != TDIST_WIRE_HELLO) {
        drop(c, "first frame is not hello");
    } else if (c->auth_wait && op != TDIST_WIRE_AUTH) {
        drop(c, "frame after the challenge is not auth");
    } else if (c->hello_done && (op == TDIST_WIRE_HELLO || op == TDIST_WIRE_AUTH)) {
        drop(c, "second hello or auth");
    } else {
        switch (op) {
        case TDIST_WIRE_HELLO: op_hello(c, &r); break;
        case TDIST_WIRE_AUTH: op_auth(c, &r); break;
        case TDIST_WIRE_SET: op_set(c, &r); break;
        case TDIST_WIRE_GET:
        case TDIST_WIRE_WAIT:
        case TDIST_WIRE_MULTI_GET: start_blocking(c, &r, body, len); break;
        case TDIST_WIRE_ADD: op_add(c, &r); break;
        case TDIST_WIRE_CAS: op_cas(c, &r); break;
        case TDIST_WIRE_CHECK: op_check(c, &r); break;
        case TDIST_WIRE_DELETE: op_delete(c, &r); break;
        case TDIST_WIRE_NUM_KEYS: reply_i64(c, op, c->srv->npresent); break;
        case TDIST_WIRE_APPEND: op_append(c, &r); break;
        case TDIST_WIRE_MULTI_SET: op_multi_set(c, &r); break;
        default: drop(c, "unknown op"); break;
        }
    }
    tdist__wire_request_free(&r);
}

/* Parse and handle every complete frame in c's input, unless c is parked. */
static void process_input(conn_t *c)
{
    size_t off = 0;
    while (!c->dead && !c->pending && !c->close_after_flush) {
        tdist__wire_header_t h;
        const char *why = "bad header";
        int rc = tdist__wire_header_decode(c->in + off, c->in_len - off, c->srv->lim.max_frame,
                                           false, &h, &why);
        if (rc < 0) {
            drop(c, why);
            return;
        }
        if (rc > 0 && !c->hello_done && h.body_len > PRE_HELLO_MAX) {
            drop(c, "first frame too long for a hello");
            return;
        }
        if (rc == 0 || c->in_len - off < TDIST_WIRE_HEADER_SIZE + (size_t)h.body_len) break;
        handle_frame(c, h.op, c->in + off + TDIST_WIRE_HEADER_SIZE, h.body_len);
        off += TDIST_WIRE_HEADER_SIZE + (size_t)h.body_len;
    }
    if (c->dead) return;
    if (off > 0) {
        memmove(c->in, c->in + off, c->in_len - off);
        c->in_len -= off;
    }
    if (c->in_len == 0 && c->in_cap > SHRINK_ABOVE) {
        free(c->in);
        c->in = NULL;
        c->in_cap = 0;
    }
    flush(c);
}

/* The input buffer capacity c needs now: room for one more read chunk,
 * or, inside a large frame, room to double what has arrived (capped by
 * the frame's end). A frame's declared length is never reserved before its
 * bytes arrive, so a client cannot make the server reserve memory it does
 * not send. */
static size_t input_want(conn_t *c)
{
    size_t want = c->in_len + TDIST_MAX((size_t)READ_CHUNK, c->in_len);
    tdist__wire_header_t h;
    const char *why;
    if (!c->pending &&
        tdist__wire_header_decode(c->in, c->in_len, c->srv->lim.max_frame, false, &h, &why) == 1) {
        size_t frame = TDIST_WIRE_HEADER_SIZE + (size_t)h.body_len;
        if (frame > c->in_len) want = TDIST_MIN(want, frame);
    }
    return TDIST_MAX(want, c->in_len + 1);
}

/* Read what the socket has for c, then parse. May drop c. */
static void on_readable(conn_t *c)
{
    size_t limit = TDIST_WIRE_HEADER_SIZE + (size_t)c->srv->lim.max_frame + READ_CHUNK;
    if (c->in_len >= limit) {
        drop(c, "client sent too much data while waiting for a reply");
        return;
    }
    size_t want = TDIST_MIN(input_want(c), limit);
    if (want > c->in_cap) {
        uint8_t *p = realloc(c->in, want);
        if (!p) {
            drop(c, "out of memory for input");
            return;
        }
        c->in = p;
        c->in_cap = want;
    }
    ssize_t n;
    TDIST_SYSCALL(n, recv(c->fd, c->in + c->in_len, c->in_cap - c->in_len, 0));
    if (n == 0) {
        drop(c, c->in_len ? "client closed mid-frame" : "client closed the connection");
        return;
    }
    if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) return;
        drop(c, "recv failed");
        return;
    }
    c->in_len += (size_t)n;
    process_input(c);
}

/* Accept pending connections (up to a batch). */
static void on_accept(tdist_store_server_t *srv)
{
    for (int i = 0; i < ACCEPT_BATCH; i++) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        int fd = accept4(srv->listen_fd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) return;
            TDIST_LOGW("store server %s: accept: %s; pausing accepts for %d ms", srv->addr,
                       strerror(errno), ACCEPT_PAUSE_MS);
            struct epoll_event ev = {.events = 0, .data.ptr = &listen_tag};
            epoll_ctl(srv->epfd, EPOLL_CTL_MOD, srv->listen_fd, &ev);
            srv->accept_resume_ms = tdist__now_ms() + ACCEPT_PAUSE_MS;
            return;
        }
        if (atomic_load(&srv->num_clients) - srv->pre_hello >= srv->max_clients) {
            TDIST_LOGW("store server %s: %d clients connected (the maximum); refusing one",
                       srv->addr, srv->max_clients);
            close(fd);
            continue;
        }
        if (srv->pre_hello >= srv->max_unauth && srv->unauth)
            drop(srv->unauth, "too many connections that have not authenticated: closing the "
                              "oldest");
        conn_t *c = calloc(1, sizeof *c);
        if (!c) {
            close(fd);
            continue;
        }
        c->srv = srv;
        c->fd = fd;
        c->heap_idx = SIZE_MAX;
        c->hello_deadline = tdist__now_ms() + srv->hello_timeout_ms;
        tdist__net_sockaddr_str(&ss, c->peer, sizeof c->peer);
        tdist__net_nodelay(fd);
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
        if (epoll_ctl(srv->epfd, EPOLL_CTL_ADD, fd, &ev) != 0) {
            close(fd);
            free(c);
            continue;
        }
        c->next = srv->conns;
        if (srv->conns) srv->conns->prev = c;
        srv->conns = c;
        atomic_fetch_add(&srv->num_clients, 1);
        srv->pre_hello++;
        c->uprev = srv->unauth_tail;
        if (srv->unauth_tail)
            srv->unauth_tail->unext = c;
        else
            srv->unauth = c;
        srv->unauth_tail = c;
    }
}

/* How often the loop looks for connections past their HELLO deadline. */
#define HELLO_SWEEP_MS 100

/* Close every connection whose HELLO deadline has passed: the oldest of
 * the unauthenticated list first. At most every HELLO_SWEEP_MS and only
 * while such connections exist. */
static void expire_hellos(tdist_store_server_t *srv)
{
    if (srv->pre_hello <= 0) return;
    int64_t now = tdist__now_ms();
    if (now < srv->next_hello_sweep) return;
    srv->next_hello_sweep = now + HELLO_SWEEP_MS;
    while (srv->unauth && srv->unauth->hello_deadline <= now)
        drop(srv->unauth, "not authenticated before the hello deadline");
}

/* epoll_wait's timeout: until the earliest waiter deadline or accept
 * resumption or HELLO sweep; -1 when there is none. */
static int loop_timeout(tdist_store_server_t *srv)
{
    int64_t next = srv->accept_resume_ms;
    if (srv->heap_len > 0 && srv->heap[0]->pend_deadline < next) next = srv->heap[0]->pend_deadline;
    if (srv->pre_hello > 0) {
        int64_t sweep = TDIST_MAX(srv->next_hello_sweep, tdist__now_ms() + HELLO_SWEEP_MS);
        if (sweep < next) next = sweep;
    }
    if (next == INT64_MAX) return -1;
    return tdist__ms_left(next);
}

/* The event loop thread. */
static void *loop_main(void *arg)
{
    tdist_store_server_t *srv = arg;
    struct epoll_event evs[MAX_EVENTS];
    while (!atomic_load(&srv->stop)) {
        int n = epoll_wait(srv->epfd, evs, MAX_EVENTS, loop_timeout(srv));
        if (n < 0) {
            if (errno == EINTR) continue;
            TDIST_LOGE("store server %s: epoll_wait: %s; stopping", srv->addr, strerror(errno));
            break;
        }
        for (int i = 0; i < n; i++) {
            void *tag = evs[i].data.ptr;
            if (tag == &wake_tag) {
                uint64_t v;
                ssize_t r = read(srv->evfd, &v, sizeof v);
                TDIST_UNUSED(r);
            } else if (tag == &listen_tag) {
                on_accept(srv);
            } else {
                conn_t *c = tag;
                if (c->dead) continue;
                if (evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) on_readable(c);
                if (!c->dead && (evs[i].events & EPOLLOUT)) flush(c);
            }
        }
        expire(srv);
        expire_hellos(srv);
        while (srv->ready) {
            conn_t *c = srv->ready;
            srv->ready = c->ready_next;
            if (!srv->ready) srv->ready_tail = NULL;
            c->on_ready = false;
            if (!c->dead) process_input(c);
        }
        if (srv->accept_resume_ms != INT64_MAX && tdist__now_ms() >= srv->accept_resume_ms) {
            struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &listen_tag};
            epoll_ctl(srv->epfd, EPOLL_CTL_MOD, srv->listen_fd, &ev);
            srv->accept_resume_ms = INT64_MAX;
        }
        while (srv->dead) {
            conn_t *c = srv->dead;
            srv->dead = c->dead_next;
            conn_free(c);
        }
    }
    return NULL;
}

/* ------------------------------------------------------------- public */

/* Free everything srv owns (the loop thread must not be running). */
static void server_free(tdist_store_server_t *srv)
{
    while (srv->conns) drop(srv->conns, "server shutting down");
    while (srv->dead) {
        conn_t *c = srv->dead;
        srv->dead = c->dead_next;
        conn_free(c);
    }
tdist__keytab_fini(&srv->keys, free_entry);
    free(srv->heap);
    if (srv->listen_fd >= 0) close(srv->listen_fd);
    if (srv->epfd >= 0) close(srv->epfd);
    if (srv->evfd >= 0) close(srv->evfd);
    if (srv->secret) memset(srv->secret, 0, strlen(srv->secret));
    free(srv->secret);
    free(srv);
}

/* Allocate a server with options o (defaults when NULL), checking them.
 * fn names the public function for messages. */
static tdist_status_t server_new(const tdist_store_server_opts_t *opts, const char *fn,
                                 tdist_store_server_t **out)
{
    tdist_store_server_opts_t o;
    tdist_store_server_opts_init(&o);
    if (opts) o = *opts;
    if (o.max_clients <= 0 || o.backlog <= 0 || o.max_key == 0 || o.hello_timeout_ms <= 0 ||
        o.max_unauthenticated <= 0 || o.max_total_bytes == 0 || o.max_total_keys == 0)
        return tdist__error(TDIST_ERR_INVALID_ARG,
                            "%s: max_clients (%d), backlog (%d), max_key (%u), "
                            "hello_timeout_ms (%d), max_unauthenticated (%d), max_total_bytes "
                            "(%llu) and max_total_keys (%llu) must be positive",
                            fn, o.max_clients, o.backlog, o.max_key, o.hello_timeout_ms,
                            o.max_unauthenticated, (unsigned long long)o.max_total_bytes,
                            (unsigned long long)o.max_total_keys);
    const char *token = o.token ? o.token : tdist__env_job_secret();
    if (token && strlen(token) > TDIST_WIRE_MAX_TOKEN)
        return tdist__error(TDIST_ERR_INVALID_ARG, "%s: token longer than %u bytes", fn,
                            TDIST_WIRE_MAX_TOKEN);
    tdist_store_server_t *srv = calloc(1, sizeof *srv);
    if (!srv || tdist__keytab_init(&srv->keys) != 0) {
        free(srv);
        return tdist__error(TDIST_ERR_NO_MEMORY, "%s: out of memory", fn);
    }
    srv->listen_fd = srv->epfd = srv->evfd = -1;
    srv->accept_resume_ms = INT64_MAX;
    srv->max_clients = o.max_clients;
    srv->hello_timeout_ms = o.hello_timeout_ms;
    srv->max_unauth = o.max_unauthenticated;
    srv->max_bytes = o.max_total_bytes;
    srv->max_keys = o.max_total_keys;
    srv->lim.max_key = TDIST_MIN(o.max_key, TDIST_STORE_MAX_KEY);
    srv->lim.max_value = TDIST_MIN(o.max_value, TDIST_STORE_MAX_VALUE);
    srv->lim.max_keys = TDIST_STORE_MAX_KEYS;
    uint64_t frame = 2ull * srv->lim.max_value + (1u << 20);
    srv->lim.max_frame = (uint32_t)TDIST_MIN(frame, (uint64_t)TDIST_WIRE_MAX_FRAME);
    if (token && *token) {
        srv->secret = tdist__strdup(token);
        if (!srv->secret) {
            server_free(srv);
            return tdist__error(TDIST_ERR_NO_MEMORY, "%s: out of memory", fn);
        }
    }
    *out = srv;
    return TDIST_OK;
}

/* Set up epoll and the eventfd around srv->listen_fd and start the loop
 * thread. On failure srv is freed (including listen_fd unless
 * keep_listen_fd). */
static tdist_status_t server_start(tdist_store_server_t *srv, bool keep_listen_fd)
{
    tdist_status_t st;
    srv->epfd = epoll_create1(EPOLL_CLOEXEC);
    srv->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (srv->epfd < 0 || srv->evfd < 0) {
        st = tdist__error_errno(errno, "store server %s: epoll/eventfd", srv->addr);
        goto fail;
    }
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &listen_tag};
    struct epoll_event wev = {.events = EPOLLIN, .data.ptr = &wake_tag};
    if (epoll_ctl(srv->epfd, EPOLL_CTL_ADD, srv->listen_fd, &ev) != 0 ||
        epoll_ctl(srv->epfd, EPOLL_CTL_ADD, srv->evfd, &wev) != 0) {
        st = tdist__error_errno(errno, "store server %s: epoll_ctl", srv->addr);
        goto fail;
    }
    int rc = pthread_create(&srv->thread, NULL, loop_main, srv);
    if (rc != 0) {
        st = tdist__error_errno(rc, "store server %s: cannot start its thread", srv->addr);
        goto fail;
    }
    pthread_setname_np(srv->thread, "tdist-store");
    if (!srv->secret) tdist__store_warn_no_secret("store server", srv->addr);
    TDIST_LOGI("store server listening on %s%s", srv->addr, srv->secret ? " (the job's secret required)" : "");
    return TDIST_OK;
fail:
    if (keep_listen_fd) srv->listen_fd = -1;
    server_free(srv);
    return st;
}

tdist_status_t tdist_store_server_create(const char *host, uint16_t port,
                                         const tdist_store_server_opts_t *opts,
                                         tdist_store_server_t **out)
{
    static const char fn[] = "tdist_store_server_create";
    if (!out) return tdist__error(TDIST_ERR_INVALID_ARG, "%s: out is NULL", fn);
    if (!host || !*host) return tdist__error(TDIST_ERR_INVALID_ARG, "%s: host is NULL or empty", fn);
    tdist_store_server_t *srv = NULL;
    TDIST_CHECK(server_new(opts, fn, &srv));
    int backlog = opts ? opts->backlog : 1024;
    tdist_status_t st = tdist__net_listen(host, port, backlog, &srv->listen_fd, &srv->port);
    if (st != TDIST_OK) {
        server_free(srv);
        return st;
    }
    tdist__net_addr_str(host, srv->port, srv->addr, sizeof srv->addr);
    TDIST_CHECK(server_start(srv, false));
    *out = srv;
    return TDIST_OK;
}

tdist_status_t tdist_store_server_adopt(int listen_fd, const tdist_store_server_opts_t *opts,
                                        tdist_store_server_t **out)
{
    static const char fn[] = "tdist_store_server_adopt";
    if (!out) return tdist__error(TDIST_ERR_INVALID_ARG, "%s: out is NULL", fn);
    if (listen_fd < 0) return tdist__error(TDIST_ERR_INVALID_ARG, "%s: listen_fd %d", fn, listen_fd);
    int acc = 0, type = 0;
    socklen_t sl = sizeof acc;
    if (getsockopt(listen_fd, SOL_SOCKET, SO_ACCEPTCONN, &acc, &sl) != 0) {
        if (errno == ENOTSOCK || errno == EBADF)
            return tdist__error(TDIST_ERR_INVALID_ARG, "%s: fd %d is %s", fn, listen_fd,
                                errno == EBADF ? "not open" : "not a socket");
        return tdist__error_errno(errno, "%s: getsockopt on fd %d", fn, listen_fd);
    }
    sl = sizeof type;
    if (!acc || getsockopt(listen_fd, SOL_SOCKET, SO_TYPE, &type, &sl) != 0 || type != SOCK_STREAM)
        return tdist__error(TDIST_ERR_INVALID_ARG, "%s: fd %d is not a listening stream socket", fn,
                            listen_fd);
    struct sockaddr_storage ss;
    sl = sizeof ss;
    if (getsockname(listen_fd, (struct sockaddr *)&ss, &sl) != 0)
        return tdist__error_errno(errno, "%s: getsockname on fd %d", fn, listen_fd);
    if (ss.ss_family != AF_INET6 && ss.ss_family != AF_INET)
        return tdist__error(TDIST_ERR_INVALID_ARG, "%s: fd %d is not a TCP socket", fn, listen_fd);
    /* Options first: a call that fails leaves the caller's fd as it was. */
    tdist_store_server_t *srv = NULL;
    TDIST_CHECK(server_new(opts, fn, &srv));
    int fl = fcntl(listen_fd, F_GETFL);
    int fdfl = fcntl(listen_fd, F_GETFD);
    if (fl < 0 || fdfl < 0 || fcntl(listen_fd, F_SETFL, fl | O_NONBLOCK) != 0 ||
        fcntl(listen_fd, F_SETFD, fdfl | FD_CLOEXEC) != 0) {
        int e = errno;
        server_free(srv);
        return tdist__error_errno(e, "%s: fcntl on fd %d", fn, listen_fd);
    }
    srv->listen_fd = listen_fd;
    srv->port = tdist__net_sockaddr_port(&ss);
    tdist__net_sockaddr_str(&ss, srv->addr, sizeof srv->addr);
    TDIST_CHECK(server_start(srv, true));
    *out = srv;
    return TDIST_OK;
}

uint16_t tdist_store_server_port(const tdist_store_server_t *srv) { return srv ? srv->port : 0; }

int tdist_store_server_num_clients(const tdist_store_server_t *srv)
{
    return srv ? atomic_load(&((tdist_store_server_t *)srv)->num_clients) : 0;
}

void tdist_store_server_destroy(tdist_store_server_t *srv)
{
    if (!srv) return;
    atomic_store(&srv->stop, true);
    uint64_t one = 1;
    ssize_t r;
    TDIST_SYSCALL(r, write(srv->evfd, &one, sizeof one));
    TDIST_UNUSED(r);
    pthread_join(srv->thread, NULL);
    server_free(srv);
}
