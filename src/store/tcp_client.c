/*
 * store/tcp_client.c — the TCP store client: tdist_store_tcp_connect() and
 * the store ops table over one TCP connection (wire format in wire.h).
 *
 * - Calls on one client are serialised by a mutex; a call waits for the
 *   mutex only until its own deadline.
 * - Every call has a deadline: the store's timeout for ordinary calls;
 *   get / wait / multi_get send their timeout to the server, which answers
 *   "timed out" at that deadline, and the client itself waits at most
 *   timeout + GRACE_MS.
 * - Broken connections: after any transport or protocol failure (send or
 *   recv error, reply missing at the deadline, malformed reply) the socket
 *   is closed and the call fails with an error naming host:port. The next
 *   call reconnects lazily, with one attempt: once a client has been
 *   connected, a refused connection means the store is lost (its host
 *   died), and waiting for it would only delay the failure. Only the
 *   first connect retries refused connections (the server may not be up
 *   yet). A failed call is never retried automatically, so a
 *   non-idempotent op (add, append) is never applied twice behind the
 *   caller's back.
 * - Authentication: HELLO carries a fresh client nonce; a server with a
 *   secret answers with its own nonce, the client proves the secret with
 *   an HMAC over both (AUTH) and checks the server's proof in return, so
 *   neither side talks to a process without the secret.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "store/internal.h"
#include "core/net.h"
#include "store/wire.h"
#include "core/auth.h"

#define GRACE_MS 1000          /* extra client wait beyond a blocking call's timeout */
#define KEEP_BUFFER (1u << 20) /* free request/reply buffers larger than this after a call */

typedef struct tcp_store {
    tdist_store_t base;
    char *host;
    uint16_t port;
    char addr[320]; /* "host:port" */
    char *token;    /* the job's secret; NULL: none */
    int64_t connect_timeout_ms;
    pthread_mutex_t mu;
    /* guarded by mu */
    int fd;            /* -1: not connected */
    bool was_connected; /* a connection has once been established */
    tdist__wbuf_t req; /* request being sent */
    uint8_t *rbuf;     /* reply body */
    size_t rcap;
} tcp_store_t;


/* "tcp store host:port: op("key")" for messages; key may be NULL. */
static const char *describe(const tcp_store_t *s, const char *op, const char *key, char *buf,
                            size_t n)
{
    if (key)
        snprintf(buf, n, "tcp store %s: %s(\"%.100s%s\")", s->addr, op, key,
                 strlen(key) > 100 ? "..." : "");
    else
        snprintf(buf, n, "tcp store %s: %s", s->addr, op);
    return buf;
}

/* Close the connection (the next call reconnects). */
static void disconnect(tcp_store_t *s)
{
    if (s->fd >= 0) close(s->fd);
    s->fd = -1;
}

/* Absolute deadline for a call of the store's timeout (+ extra ms), within
 * the calling thread's bound (tdist_store_bound_thread). */
static int64_t call_deadline(const tcp_store_t *s, int64_t timeout_ms, int64_t extra_ms)
{
    (void)s;
    int64_t bound = tdist__store_thread_bound();
    if (timeout_ms < 0 || timeout_ms > INT64_MAX / 4) return bound;
    /* exact: a blocking call hands what is left of it to the server */
    return TDIST_MIN(tdist__deadline_exact_ms(timeout_ms + extra_ms), bound);
}

/* Lock the client until deadline. */
static tdist_status_t lock(tcp_store_t *s, int64_t deadline, const char *what)
{
    if (deadline == INT64_MAX) {
        pthread_mutex_lock(&s->mu);
        return TDIST_OK;
    }
    /* pthread_mutex_timedlock takes CLOCK_REALTIME: convert the
     * (monotonic) deadline to a wall-clock time. (pthread_mutex_clocklock
     * would avoid this, but sanitizers do not intercept it.) */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    int64_t left = tdist__ms_left(deadline);
    int64_t ns = (int64_t)ts.tv_nsec + (left % 1000) * 1000000;
    ts.tv_sec += (time_t)(left / 1000 + ns / 1000000000);
    ts.tv_nsec = (long)(ns % 1000000000);
    int rc = pthread_mutex_timedlock(&s->mu, &ts);
    if (rc == 0) return TDIST_OK;
    if (rc == ETIMEDOUT)
        return tdist__error(TDIST_ERR_TIMEOUT,
                            "%s: timed out waiting for another thread's call on this client", what);
    return tdist__error_errno(rc, "%s: locking the client", what);
}

/* Release buffers that grew large for one call. */
static void unlock(tcp_store_t *s)
{
    if (s->req.cap > KEEP_BUFFER) tdist__wbuf_free(&s->req);
    if (s->rcap > KEEP_BUFFER) {
        free(s->rbuf);
        s->rbuf = NULL;
        s->rcap = 0;
    }
    pthread_mutex_unlock(&s->mu);
}

/* Map a non-OK reply status to a tdist status, with the server's text. */
static tdist_status_t remote_error(const tdist__wire_reply_t *rep, const char *what)
{
    tdist_status_t st;
    switch (rep->status) {
    case TDIST_WIRE_ETIMEOUT: st = TDIST_ERR_TIMEOUT; break;
    case TDIST_WIRE_EINVALID:
    case TDIST_WIRE_ETOOLARGE: st = TDIST_ERR_INVALID_ARG; break;
    case TDIST_WIRE_EAUTH: st = TDIST_ERR_AUTH; break;
    case TDIST_WIRE_EVERSION: st = TDIST_ERR_MISMATCH; break;
    default: st = TDIST_ERR_REMOTE; break;
    }
    return tdist__error(st, "%s: %.*s", what, (int)TDIST_MIN(rep->message.len, 1024u),
                        (const char *)rep->message.ptr);
}

/* Read one reply to op before deadline into *rep (views into s->rbuf).
 * A transport or protocol failure disconnects and returns an error; a
 * non-OK status is returned as TDIST_OK with rep->status set. */
static tdist_status_t read_reply(tcp_store_t *s, uint8_t op, int64_t deadline, const char *what,
                                 tdist__wire_reply_t *rep)
{
    uint8_t hb[TDIST_WIRE_HEADER_SIZE];
    tdist_status_t st = tdist__net_recv_all(s->fd, hb, sizeof hb, deadline, what);
    if (st != TDIST_OK) goto fail;
    tdist__wire_header_t h;
    const char *why = "bad header";
    if (tdist__wire_header_decode(hb, sizeof hb, TDIST_WIRE_MAX_FRAME, true, &h, &why) != 1 ||
        h.op != op) {
        st = tdist__error(TDIST_ERR_REMOTE, "%s: malformed reply from the server (%s)", what,
                          h.op != op ? "wrong op" : why);
        goto fail;
    }
    if (h.body_len > s->rcap) {
        uint8_t *p = realloc(s->rbuf, h.body_len);
        if (!p) {
            st = tdist__error(TDIST_ERR_NO_MEMORY, "%s: no memory for a reply of %u bytes", what,
                              h.body_len);
            goto fail;
        }
        s->rbuf = p;
        s->rcap = h.body_len;
    }
    st = tdist__net_recv_all(s->fd, s->rbuf, h.body_len, deadline, what);
    if (st != TDIST_OK) goto fail;
    tdist__wire_limits_t lim = tdist__wire_default_limits();
    int rc = tdist__wire_reply_decode(op, h.status, s->rbuf, h.body_len, &lim, rep, &why);
    if (rc == -2) {
        st = tdist__error(TDIST_ERR_NO_MEMORY, "%s: no memory to decode a reply", what);
        goto fail;
    }
    if (rc != 0) {
        st = tdist__error(TDIST_ERR_REMOTE, "%s: malformed reply from the server (%s)", what, why);
        goto fail;
    }
    return TDIST_OK;
fail:
    disconnect(s);
    return st;
}

/* Send the frame in b (freed) and read its reply to op. A non-OK reply
 * becomes an error (and a closed connection). Caller holds the lock. */
static tdist_status_t handshake_step(tcp_store_t *s, tdist__wbuf_t *b, uint8_t op,
                                     int64_t deadline, const char *what, tdist__wire_reply_t *rep)
{
    tdist_status_t st = b->oom ? tdist__error(TDIST_ERR_NO_MEMORY, "%s: out of memory", what)
                               : tdist__net_send_all(s->fd, b->data, b->len, deadline, what);
    tdist__wbuf_free(b);
    if (st != TDIST_OK) {
        disconnect(s);
        return st;
    }
    st = read_reply(s, op, deadline, what, rep);
    if (st == TDIST_ERR_CONNECTION)
        return tdist__error(st, "%s (during the handshake: the server may have too many clients, "
                                "or is not a tdist store)", tdist_last_error());
    if (st != TDIST_OK) return st;
    if (rep->status != TDIST_WIRE_OK) {
        st = remote_error(rep, what);
        tdist__wire_reply_free(rep);
        disconnect(s);
    }
    return st;
}

/* The secret's half of the handshake: prove it over the server's nonce sn
 * and our cn, and check the server's proof. Caller holds the lock. */
static tdist_status_t prove_secret(tcp_store_t *s, const tdist__wire_bytes_t *sn,
                                   const tdist__wire_bytes_t *cn, int64_t deadline,
                                   const char *what)
{
    uint8_t proof[TDIST_WIRE_PROOF_LEN], want[TDIST_WIRE_PROOF_LEN];
    tdist__wire_proof(s->token, false, sn, cn, proof);
    tdist__wire_proof(s->token, true, cn, sn, want);
    tdist__wbuf_t b = {0};
    size_t off = tdist__wbuf_begin_frame(&b, TDIST_WIRE_AUTH, 0);
    tdist__wbuf_put_bytes(&b, proof, sizeof proof);
    tdist__wbuf_end_frame(&b, off);
    tdist__wire_reply_t rep;
    TDIST_CHECK(handshake_step(s, &b, TDIST_WIRE_AUTH, deadline, what, &rep));
    bool ok = rep.value.len == sizeof want && tdist__const_time_eq(rep.value.ptr, want, sizeof want);
    tdist__wire_reply_free(&rep);
    if (ok) return TDIST_OK;
    disconnect(s);
    return tdist__error(TDIST_ERR_AUTH, "%s: the server's proof of the job's secret is wrong (it "
                                        "is not this job's store)", what);
}

/* Connect and say HELLO (and prove the secret if the server asks),
 * retrying refused connections until retry_deadline; nothing runs past
 * deadline. Caller holds the lock. */
static tdist_status_t open_connection(tcp_store_t *s, int64_t retry_deadline, int64_t deadline)
{
    char what[512];
    describe(s, "connect", NULL, what, sizeof what);
    int fd = -1;
    TDIST_CHECK(tdist__net_connect(s->host, s->port, retry_deadline, deadline, &fd));
    s->fd = fd;
    uint8_t cnonce[TDIST_NONCE_LEN];
    if (tdist__random_bytes(cnonce, sizeof cnonce) != 0) {
        disconnect(s);
        return tdist__error_errno(errno, "%s: no random bytes for a nonce", what);
    }
    tdist__wbuf_t b = {0};
    size_t off = tdist__wbuf_begin_frame(&b, TDIST_WIRE_HELLO, 0);
    tdist__wbuf_put_u32(&b, TDIST_WIRE_MAGIC);
    tdist__wbuf_put_u32(&b, TDIST_WIRE_VERSION);
    tdist__wbuf_put_bytes(&b, cnonce, sizeof cnonce);
    tdist__wbuf_end_frame(&b, off);
    tdist__wire_reply_t rep;
    TDIST_CHECK(handshake_step(s, &b, TDIST_WIRE_HELLO, deadline, what, &rep));
    bool asks = rep.num == 1;
    uint8_t sn[TDIST_WIRE_MAX_NONCE];
    tdist__wire_bytes_t snonce = {sn, rep.value.len}, cn = {cnonce, sizeof cnonce};
    if (asks) memcpy(sn, rep.value.ptr, rep.value.len);
    tdist__wire_reply_free(&rep);
    tdist_status_t st = TDIST_OK;
    if (asks && !s->token)
        st = tdist__error(TDIST_ERR_AUTH, "%s: the store requires the job's secret and this "
                                          "process has none (set TDIST_JOB_SECRET as the "
                                          "job's launcher did; tdistrun sets it for its workers)",
                          what);
    else if (!asks && s->token)
        st = tdist__error(TDIST_ERR_AUTH, "%s: the server does not ask for the job's secret, which "
                                          "this process has: it is not this job's store (start "
                                          "the store with the same TDIST_JOB_SECRET)", what);
    else if (asks)
        st = prove_secret(s, &snonce, &cn, deadline, what);
    if (st != TDIST_OK) {
        disconnect(s);
        return st;
    }
    s->was_connected = true;
    return TDIST_OK;
}

/* Send the request in s->req (an op frame) and read its reply, before
 * deadline. Connects first if needed. Caller holds the lock. On
 * TDIST_OK, rep holds an OK reply (release with tdist__wire_reply_free);
 * a non-OK reply becomes an error naming what. */
static tdist_status_t roundtrip(tcp_store_t *s, uint8_t op, int64_t deadline, const char *what,
                                tdist__wire_reply_t *rep)
{
    if (s->req.oom) return tdist__error(TDIST_ERR_NO_MEMORY, "%s: out of memory for the request", what);
    size_t body = s->req.len - TDIST_WIRE_HEADER_SIZE;
    if (body > TDIST_WIRE_MAX_FRAME)
        return tdist__error(TDIST_ERR_INVALID_ARG,
                            "%s: request of %zu bytes exceeds the frame cap of %u bytes", what, body,
                            TDIST_WIRE_MAX_FRAME);
    if (s->fd < 0) {
        /* connected before: one attempt, a refusal means the store is lost */
        tdist_status_t st = open_connection(s, tdist__now_ms(), deadline);
        if (st == TDIST_ERR_CONNECTION)
            return tdist__error(st, "%s: lost the store %s: %s", what, s->addr, tdist_last_error());
        if (st != TDIST_OK) return tdist__error_context(st, "%s", what);
    }
    if ((op == TDIST_WIRE_GET || op == TDIST_WIRE_WAIT || op == TDIST_WIRE_MULTI_GET) &&
        deadline != INT64_MAX) {
        /* the server gets what is left of the timeout after waiting for
         * the lock and (re)connecting: the first body field */
        int64_t left = TDIST_MAX(deadline - GRACE_MS - tdist__now_ms(), (int64_t)0);
        uint8_t *p = s->req.data + TDIST_WIRE_HEADER_SIZE;
        tdist__wire_set_u32(p, (uint32_t)((uint64_t)left >> 32));
        tdist__wire_set_u32(p + 4, (uint32_t)left);
    }
    tdist_status_t st = tdist__net_send_all(s->fd, s->req.data, s->req.len, deadline, what);
    if (st != TDIST_OK) {
        disconnect(s);
        if (st == TDIST_ERR_CONNECTION)
            return tdist__error(st, "%s (lost the store %s)", tdist_last_error(), s->addr);
        return st;
    }
    st = read_reply(s, op, deadline, what, rep);
    if (st == TDIST_ERR_CONNECTION)
        return tdist__error(st, "%s (lost the store %s: the server is gone, or it closed the "
                                "connection because the request broke its caps)",
                            tdist_last_error(), s->addr);
    if (st != TDIST_OK) return st;
    if (rep->status != TDIST_WIRE_OK) {
        st = remote_error(rep, what);
        tdist__wire_reply_free(rep);
        return st;
    }
    return TDIST_OK;
}

/* One call in progress: what it is (for messages), its deadline and the
 * offset of its frame in s->req. */
typedef struct call {
    tcp_store_t *s;
    uint8_t op;
    int64_t deadline;
    size_t off;
    char what[512];
} call_t;

/* Start a call: describe it, fix its deadline, take the client's lock and
 * begin op's frame in s->req (the caller appends the body). A blocking
 * call (get, wait, multi_get) passes its own timeout and the client waits
 * GRACE_MS beyond it; every other call has the store's timeout. On
 * TDIST_OK the caller holds the lock and ends with call_finish() or
 * call_send() + unlock(). */
static tdist_status_t call_begin(tcp_store_t *s, uint8_t op, const char *name, const char *key,
                                 bool blocking, int64_t timeout_ms, call_t *c)
{
    c->s = s;
    c->op = op;
    describe(s, name, key, c->what, sizeof c->what);
    c->deadline = blocking ? call_deadline(s, timeout_ms, GRACE_MS)
                           : call_deadline(s, atomic_load(&s->base.timeout_ms), 0);
    TDIST_CHECK(lock(s, c->deadline, c->what));
    tdist__wbuf_clear(&s->req);
    c->off = tdist__wbuf_begin_frame(&s->req, op, 0);
    return TDIST_OK;
}

/* Close the frame, send it and read the reply (see roundtrip). The lock
 * stays held. */
static tdist_status_t call_send(call_t *c, tdist__wire_reply_t *rep)
{
    tdist__wbuf_end_frame(&c->s->req, c->off);
    return roundtrip(c->s, c->op, c->deadline, c->what, rep);
}

/* For ops whose OK reply carries nothing: send, then release the lock. */
static tdist_status_t call_finish(call_t *c)
{
    tdist__wire_reply_t rep;
    tdist_status_t st = call_send(c, &rep);
    if (st == TDIST_OK) tdist__wire_reply_free(&rep);
    unlock(c->s);
    return st;
}

/* Append "u32 n | n x key" to the request. */
static void put_keys(tcp_store_t *s, const char *const *keys, size_t n)
{
    tdist__wbuf_put_u32(&s->req, (uint32_t)n);
    for (size_t i = 0; i < n; i++) tdist__wbuf_put_bytes(&s->req, keys[i], strlen(keys[i]));
}

/* -------------------------------------------------------------- ops */

/* SET: one round trip with the store's deadline. */
static tdist_status_t tcp_set(tdist_store_t *base, const char *key, const void *value, size_t len)
{
    tcp_store_t *s = (tcp_store_t *)base;
    call_t c;
    TDIST_CHECK(call_begin(s, TDIST_WIRE_SET, "set", key, false, 0, &c));
    tdist__wbuf_put_bytes(&s->req, key, strlen(key));
    tdist__wbuf_put_bytes(&s->req, value, len);
    return call_finish(&c);
}

/* GET: the server waits up to timeout_ms for the key; the client up to
 * timeout_ms + GRACE_MS. *value is malloc'd for the caller. */
static tdist_status_t tcp_get(tdist_store_t *base, const char *key, int64_t timeout_ms,
                              void **value, size_t *len)
{
    tcp_store_t *s = (tcp_store_t *)base;
    call_t c;
    TDIST_CHECK(call_begin(s, TDIST_WIRE_GET, "get", key, true, timeout_ms, &c));
    tdist__wbuf_put_i64(&s->req, timeout_ms);
    tdist__wbuf_put_bytes(&s->req, key, strlen(key));
    tdist__wire_reply_t rep;
    tdist_status_t st = call_send(&c, &rep);
    if (st == TDIST_OK) {
        void *v = tdist__store_dup(rep.value.ptr, rep.value.len);
        if (!v) {
            st = tdist__error(TDIST_ERR_NO_MEMORY, "%s: out of memory for a %u-byte value", c.what,
                              rep.value.len);
        } else {
            *value = v;
            *len = rep.value.len;
        }
        tdist__wire_reply_free(&rep);
    }
    unlock(s);
    return st;
}

/* ADD: the server adds atomically and returns the new value. */
static tdist_status_t tcp_add(tdist_store_t *base, const char *key, int64_t delta, int64_t *result)
{
    tcp_store_t *s = (tcp_store_t *)base;
    call_t c;
    TDIST_CHECK(call_begin(s, TDIST_WIRE_ADD, "add", key, false, 0, &c));
    tdist__wbuf_put_bytes(&s->req, key, strlen(key));
    tdist__wbuf_put_i64(&s->req, delta);
    tdist__wire_reply_t rep;
    tdist_status_t st = call_send(&c, &rep);
    if (st == TDIST_OK) {
        *result = rep.num;
        tdist__wire_reply_free(&rep);
    }
    unlock(s);
    return st;
}

/* CAS: torch.distributed's compare_set; *current is malloc'd. */
static tdist_status_t tcp_compare_set(tdist_store_t *base, const char *key, const void *expected,
                                      size_t expected_len, const void *desired, size_t desired_len,
                                      void **current, size_t *current_len)
{
    tcp_store_t *s = (tcp_store_t *)base;
    call_t c;
    TDIST_CHECK(call_begin(s, TDIST_WIRE_CAS, "compare_set", key, false, 0, &c));
    tdist__wbuf_put_bytes(&s->req, key, strlen(key));
    tdist__wbuf_put_bytes(&s->req, expected, expected_len);
    tdist__wbuf_put_bytes(&s->req, desired, desired_len);
    tdist__wire_reply_t rep;
    tdist_status_t st = call_send(&c, &rep);
    if (st == TDIST_OK) {
        void *v = tdist__store_dup(rep.value.ptr, rep.value.len);
        if (!v) {
            st = tdist__error(TDIST_ERR_NO_MEMORY, "%s: out of memory", c.what);
        } else {
            *current = v;
            *current_len = rep.value.len;
        }
        tdist__wire_reply_free(&rep);
    }
    unlock(s);
    return st;
}

/* WAIT: like GET for n keys, without values. */
static tdist_status_t tcp_wait(tdist_store_t *base, const char *const *keys, size_t n,
                               int64_t timeout_ms)
{
    tcp_store_t *s = (tcp_store_t *)base;
    call_t c;
    TDIST_CHECK(call_begin(s, TDIST_WIRE_WAIT, "wait", keys[0], true, timeout_ms, &c));
    tdist__wbuf_put_i64(&s->req, timeout_ms);
    put_keys(s, keys, n);
    return call_finish(&c);
}

/* CHECK (all n keys exist) and DELETE (the key existed): a flag reply. */
static tdist_status_t flag_call(tcp_store_t *s, uint8_t op, const char *name,
                                const char *const *keys, size_t n, bool *flag)
{
    call_t c;
    TDIST_CHECK(call_begin(s, op, name, keys[0], false, 0, &c));
    if (op == TDIST_WIRE_CHECK)
        put_keys(s, keys, n);
    else
        tdist__wbuf_put_bytes(&s->req, keys[0], strlen(keys[0]));
    tdist__wire_reply_t rep;
    tdist_status_t st = call_send(&c, &rep);
    if (st == TDIST_OK) {
        *flag = rep.num != 0;
        tdist__wire_reply_free(&rep);
    }
    unlock(s);
    return st;
}

/* CHECK: whether all n keys exist (never waits on the server). */
static tdist_status_t tcp_check(tdist_store_t *base, const char *const *keys, size_t n,
                                bool *all_exist)
{
    return flag_call((tcp_store_t *)base, TDIST_WIRE_CHECK, "check", keys, n, all_exist);
}

/* DELETE: *deleted says whether the key existed. */
static tdist_status_t tcp_delete_key(tdist_store_t *base, const char *key, bool *deleted)
{
    return flag_call((tcp_store_t *)base, TDIST_WIRE_DELETE, "delete_key", &key, 1, deleted);
}

/* NUM_KEYS: keys with a value on the server. */
static tdist_status_t tcp_num_keys(tdist_store_t *base, int64_t *count)
{
    tcp_store_t *s = (tcp_store_t *)base;
    call_t c;
    TDIST_CHECK(call_begin(s, TDIST_WIRE_NUM_KEYS, "num_keys", NULL, false, 0, &c));
    tdist__wire_reply_t rep;
    tdist_status_t st = call_send(&c, &rep);
    if (st == TDIST_OK) {
        *count = rep.num;
        tdist__wire_reply_free(&rep);
    }
    unlock(s);
    return st;
}

/* APPEND: atomic append on the server. */
static tdist_status_t tcp_append(tdist_store_t *base, const char *key, const void *value, size_t len)
{
    tcp_store_t *s = (tcp_store_t *)base;
    call_t c;
    TDIST_CHECK(call_begin(s, TDIST_WIRE_APPEND, "append", key, false, 0, &c));
    tdist__wbuf_put_bytes(&s->req, key, strlen(key));
    tdist__wbuf_put_bytes(&s->req, value, len);
    return call_finish(&c);
}

/* MULTI_GET: blocks like GET until every key exists; on success each
 * values[i] is malloc'd for the caller, on failure nothing is written. */
static tdist_status_t tcp_multi_get(tdist_store_t *base, const char *const *keys, size_t n,
                                    int64_t timeout_ms, void **values, size_t *lens)
{
    tcp_store_t *s = (tcp_store_t *)base;
    call_t c;
    TDIST_CHECK(call_begin(s, TDIST_WIRE_MULTI_GET, "multi_get", keys[0], true, timeout_ms, &c));
    tdist__wbuf_put_i64(&s->req, timeout_ms);
    put_keys(s, keys, n);
    tdist__wire_reply_t rep;
    tdist_status_t st = call_send(&c, &rep);
    if (st == TDIST_OK) {
        if (rep.n != n) {
            st = tdist__error(TDIST_ERR_REMOTE, "%s: the server returned %u values for %zu keys",
                              c.what, rep.n, n);
            disconnect(s);
        } else {
            /* copies first, so that a failure writes nothing to values */
            void **copies = calloc(n, sizeof *copies);
            size_t i = 0;
            for (; copies && i < n; i++) {
                copies[i] = tdist__store_dup(rep.values[i].ptr, rep.values[i].len);
                if (!copies[i]) break;
            }
            if (!copies || i < n) {
                for (size_t j = 0; copies && j < i; j++) free(copies[j]);
                st = tdist__error(TDIST_ERR_NO_MEMORY, "%s: out of memory for %zu values", c.what, n);
            } else {
                for (i = 0; i < n; i++) {
                    values[i] = copies[i];
                    lens[i] = rep.values[i].len;
                }
            }
            free(copies);
        }
        tdist__wire_reply_free(&rep);
    }
    unlock(s);
    return st;
}

/* MULTI_SET: all pairs in one frame, applied atomically by the server. */
static tdist_status_t tcp_multi_set(tdist_store_t *base, const char *const *keys,
                                    const void *const *values, const size_t *lens, size_t n)
{
    tcp_store_t *s = (tcp_store_t *)base;
    call_t c;
    TDIST_CHECK(call_begin(s, TDIST_WIRE_MULTI_SET, "multi_set", keys[0], false, 0, &c));
    tdist__wbuf_put_u32(&s->req, (uint32_t)n);
    uint64_t total = 0;
    for (size_t i = 0; i < n && total <= TDIST_WIRE_MAX_FRAME; i++) {
        tdist__wbuf_put_bytes(&s->req, keys[i], strlen(keys[i]));
        tdist__wbuf_put_bytes(&s->req, values[i], lens[i]);
        total += 8u + strlen(keys[i]) + lens[i];
    }
    if (total > TDIST_WIRE_MAX_FRAME) {
        unlock(s);
        return tdist__error(TDIST_ERR_INVALID_ARG,
                            "%s: %zu keys and values exceed the frame cap of %u bytes", c.what, n,
                            TDIST_WIRE_MAX_FRAME);
    }
    return call_finish(&c);
}

/* Close the connection and free the client. */
static void tcp_destroy(tdist_store_t *base)
{
    tcp_store_t *s = (tcp_store_t *)base;
    disconnect(s);
    pthread_mutex_destroy(&s->mu);
    tdist__wbuf_free(&s->req);
    free(s->rbuf);
    free(s->host);
    if (s->token) memset(s->token, 0, strlen(s->token));
    free(s->token);
    free(s);
}

static const tdist_store_ops_t tcp_ops = {
    .kind = "tcp",
    .destroy = tcp_destroy,
    .set = tcp_set,
    .get = tcp_get,
    .add = tcp_add,
    .compare_set = tcp_compare_set,
    .wait = tcp_wait,
    .check = tcp_check,
    .delete_key = tcp_delete_key,
    .num_keys = tcp_num_keys,
    .append = tcp_append,
    .multi_get = tcp_multi_get,
    .multi_set = tcp_multi_set,
};

tdist_status_t tdist_store_tcp_connect(const char *host, uint16_t port,
                                       const tdist_store_opts_t *opts, tdist_store_t **out)
{
    static const char fn[] = "tdist_store_tcp_connect";
    if (!out) return tdist__error(TDIST_ERR_INVALID_ARG, "%s: out is NULL", fn);
    if (!host || !*host) return tdist__error(TDIST_ERR_INVALID_ARG, "%s: host is NULL or empty", fn);
    if (port == 0) return tdist__error(TDIST_ERR_INVALID_ARG, "%s: port is 0", fn);
    tdist_store_opts_t o;
    tdist_store_opts_init(&o);
    if (opts) o = *opts;
    const char *token = o.token ? o.token : tdist__env_job_secret();
    if (token && strlen(token) > TDIST_WIRE_MAX_TOKEN)
        return tdist__error(TDIST_ERR_INVALID_ARG, "%s: token longer than %u bytes", fn,
                            TDIST_WIRE_MAX_TOKEN);

    tcp_store_t *s = calloc(1, sizeof *s);
    if (!s) return tdist__error(TDIST_ERR_NO_MEMORY, "%s: out of memory", fn);
    tdist__store_base_init(&s->base, &tcp_ops, &o);
    s->fd = -1;
    s->port = port;
    s->host = tdist__strdup(host);
    s->token = token && *token ? tdist__strdup(token) : NULL;
    s->connect_timeout_ms = o.connect_timeout_ms < 0 ? o.timeout_ms : o.connect_timeout_ms;
    tdist__net_addr_str(host, port, s->addr, sizeof s->addr);
    if (!s->host || (token && *token && !s->token) || pthread_mutex_init(&s->mu, NULL) != 0) {
        free(s->host);
        free(s->token);
        free(s);
        return tdist__error(TDIST_ERR_NO_MEMORY, "%s: out of memory", fn);
    }
    /* refused connections are retried until the connect timeout; the
     * handshake then has the store's timeout */
    int64_t retry = tdist__deadline_ms(s->connect_timeout_ms);
    int64_t deadline = call_deadline(s, o.timeout_ms, 0);
    if (deadline < retry) deadline = retry;
    if (!s->token) tdist__store_warn_no_secret("store client of", s->addr);
    pthread_mutex_lock(&s->mu);
    tdist_status_t st = open_connection(s, retry, deadline);
    pthread_mutex_unlock(&s->mu);
    if (st != TDIST_OK) {
        tcp_destroy(&s->base);
        return st;
    }
    *out = &s->base;
    return TDIST_OK;
}
