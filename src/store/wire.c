/*
 * store/wire.c — encoding and decoding of the TCP store's frames (format in
 * wire.h). Pure functions over byte buffers: no sockets, no global state,
 * no dependency on the rest of the library, so the fuzzer links this file
 * alone.
 */
#include <stdlib.h>
#include <string.h>

#include "store/wire.h"
#include "core/auth.h"

/* ------------------------------------------------------------- helpers */

uint32_t tdist__wire_get_u32(const uint8_t *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}

void tdist__wire_set_u32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

tdist__wire_limits_t tdist__wire_default_limits(void)
{
    tdist__wire_limits_t l = {.max_key = TDIST_STORE_MAX_KEY,
                              .max_value = TDIST_STORE_MAX_VALUE,
                              .max_keys = TDIST_STORE_MAX_KEYS,
                              .max_frame = TDIST_WIRE_MAX_FRAME};
    return l;
}

const char *tdist__wire_op_name(uint8_t op)
{
    switch (op) {
    case TDIST_WIRE_HELLO: return "hello";
    case TDIST_WIRE_SET: return "set";
    case TDIST_WIRE_GET: return "get";
    case TDIST_WIRE_ADD: return "add";
    case TDIST_WIRE_CAS: return "compare_set";
    case TDIST_WIRE_WAIT: return "wait";
    case TDIST_WIRE_CHECK: return "check";
    case TDIST_WIRE_DELETE: return "delete_key";
    case TDIST_WIRE_NUM_KEYS: return "num_keys";
    case TDIST_WIRE_APPEND: return "append";
    case TDIST_WIRE_MULTI_GET: return "multi_get";
    case TDIST_WIRE_MULTI_SET: return "multi_set";
    case TDIST_WIRE_AUTH: return "auth";
    default: return "unknown";
    }
}

int tdist__wire_header_decode(const uint8_t *buf, size_t len, uint32_t max_frame, bool is_reply,
                              tdist__wire_header_t *h, const char **why)
{
    if (len < TDIST_WIRE_HEADER_SIZE) return 0;
    uint32_t body_len = tdist__wire_get_u32(buf);
    uint8_t op = buf[4], status = buf[5];
    if (buf[6] != 0 || buf[7] != 0) {
        *why = "reserved header bytes are not zero";
        return -1;
    }
    if (op < 1 || op > TDIST_WIRE_OP_MAX) {
        *why = "unknown op";
        return -1;
    }
    if (status != 0 && (!is_reply || status > TDIST_WIRE_STATUS_MAX)) {
        *why = "bad status byte";
        return -1;
    }
    if (body_len > max_frame) {
        *why = "frame longer than the cap";
        return -1;
    }
    h->body_len = body_len;
    h->op = op;
    h->status = status;
    return 1;
}

/* A cursor over a body being decoded. Every read checks the bounds. */
typedef struct cursor {
    const uint8_t *p;
    size_t left;
    const char *why;
} cursor_t;

/* Read a u32; 0 on success, -1 (why set) if truncated. */
static int rd_u32(cursor_t *c, uint32_t *v)
{
    if (c->left < 4) {
        c->why = "truncated body";
        return -1;
    }
    *v = tdist__wire_get_u32(c->p);
    c->p += 4;
    c->left -= 4;
    return 0;
}

/* Read an i64; 0 on success, -1 if truncated. */
static int rd_i64(cursor_t *c, int64_t *v)
{
    uint32_t hi, lo;
    if (rd_u32(c, &hi) || rd_u32(c, &lo)) return -1;
    *v = (int64_t)(((uint64_t)hi << 32) | lo);
    return 0;
}

/* Read a u8; 0 on success, -1 if truncated. */
static int rd_u8(cursor_t *c, uint8_t *v)
{
    if (c->left < 1) {
        c->why = "truncated body";
        return -1;
    }
    *v = c->p[0];
    c->p++;
    c->left--;
    return 0;
}

/* Read "u32 len | bytes" with len <= cap; 0 on success, -1 otherwise. */
static int rd_bytes(cursor_t *c, uint32_t cap, tdist__wire_bytes_t *b)
{
    uint32_t n;
    if (rd_u32(c, &n)) return -1;
    if (n > cap) {
        c->why = "value longer than the cap";
        return -1;
    }
    if (n > c->left) {
        c->why = "truncated body";
        return -1;
    }
    b->ptr = c->p;
    b->len = n;
    c->p += n;
    c->left -= n;
    return 0;
}

/* Read a key: bytes with 1 <= len <= max_key and no NUL byte. */
static int rd_key(cursor_t *c, uint32_t max_key, tdist__wire_bytes_t *b)
{
    uint32_t n;
    if (c->left < 4) {
        c->why = "truncated body";
        return -1;
    }
    n = tdist__wire_get_u32(c->p);
    if (n == 0) {
        c->why = "empty key";
        return -1;
    }
    if (n > max_key) {
        c->why = "key longer than the cap";
        return -1;
    }
    if (rd_bytes(c, max_key, b)) return -1;
    if (memchr(b->ptr, 0, b->len)) {
        c->why = "key contains a NUL byte";
        return -1;
    }
    return 0;
}

/* Read a key count n in [1, max_keys] that the remaining body can hold
 * (each key takes at least 5 bytes). */
static int rd_count(cursor_t *c, uint32_t max_keys, uint32_t *n)
{
    if (rd_u32(c, n)) return -1;
    if (*n == 0) {
        c->why = "zero keys";
        return -1;
    }
    if (*n > max_keys) {
        c->why = "too many keys";
        return -1;
    }
    if ((uint64_t)*n * 5u > c->left) {
        c->why = "truncated body";
        return -1;
    }
    return 0;
}

/* The body must be used up exactly. */
static int rd_end(cursor_t *c)
{
    if (c->left != 0) {
        c->why = "trailing bytes after the body";
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------ requests */

/* Point req->keys (and values when with_values) at n-entry arrays:
 * inline storage for n == 1, malloc otherwise. 0, or -2 on OOM. */
static int alloc_arrays(tdist__wire_request_t *req, uint32_t n, bool with_values)
{
    req->n = n;
    if (n == 1) {
        req->keys = &req->inline_key;
        req->values = with_values ? &req->inline_value : NULL;
        return 0;
    }
    req->keys = calloc(n, sizeof *req->keys);
    req->values = with_values ? calloc(n, sizeof *req->values) : NULL;
    req->owns_arrays = true;
    if (!req->keys || (with_values && !req->values)) {
        tdist__wire_request_free(req);
        return -2;
    }
    return 0;
}

void tdist__wire_request_free(tdist__wire_request_t *req)
{
    if (!req) return;
    if (req->owns_arrays) {
        free(req->keys);
        free(req->values);
    }
    req->keys = NULL;
    req->values = NULL;
    req->owns_arrays = false;
}

int tdist__wire_request_decode(uint8_t op, const uint8_t *body, size_t len,
                               const tdist__wire_limits_t *lim, tdist__wire_request_t *req,
                               const char **why)
{
    cursor_t c = {.p = body, .left = len, .why = "malformed body"};
    memset(req, 0, sizeof *req);
    req->op = op;
    uint32_t n = 0, magic = 0;
    int rc;

    switch (op) {
    case TDIST_WIRE_HELLO:
        if (rd_u32(&c, &magic) || rd_u32(&c, &req->version) ||
            rd_bytes(&c, TDIST_WIRE_MAX_NONCE, &req->nonce))
            goto bad;
        if (magic != TDIST_WIRE_MAGIC) {
            c.why = "bad magic in hello";
            goto bad;
        }
        break;
    case TDIST_WIRE_AUTH:
        if (rd_bytes(&c, TDIST_WIRE_PROOF_LEN, &req->proof)) goto bad;
        break;
    case TDIST_WIRE_SET:
    case TDIST_WIRE_APPEND:
        alloc_arrays(req, 1, true);
        if (rd_key(&c, lim->max_key, &req->keys[0]) ||
            rd_bytes(&c, lim->max_value, &req->values[0]))
            goto bad;
        break;
    case TDIST_WIRE_GET:
        alloc_arrays(req, 1, false);
        if (rd_i64(&c, &req->timeout_ms) || rd_key(&c, lim->max_key, &req->keys[0])) goto bad;
        break;
    case TDIST_WIRE_ADD:
        alloc_arrays(req, 1, false);
        if (rd_key(&c, lim->max_key, &req->keys[0]) || rd_i64(&c, &req->delta)) goto bad;
        break;
    case TDIST_WIRE_CAS:
        alloc_arrays(req, 1, false);
        if (rd_key(&c, lim->max_key, &req->keys[0]) ||
            rd_bytes(&c, lim->max_value, &req->expected) ||
            rd_bytes(&c, lim->max_value, &req->desired))
            goto bad;
        break;
    case TDIST_WIRE_DELETE:
        alloc_arrays(req, 1, false);
        if (rd_key(&c, lim->max_key, &req->keys[0])) goto bad;
        break;
    case TDIST_WIRE_NUM_KEYS:
        break;
    case TDIST_WIRE_WAIT:
    case TDIST_WIRE_MULTI_GET:
    case TDIST_WIRE_CHECK:
        if (op != TDIST_WIRE_CHECK && rd_i64(&c, &req->timeout_ms)) goto bad;
        if (rd_count(&c, lim->max_keys, &n)) goto bad;
        if ((rc = alloc_arrays(req, n, false)) != 0) return rc;
        for (uint32_t i = 0; i < n; i++)
            if (rd_key(&c, lim->max_key, &req->keys[i])) goto bad;
        break;
    case TDIST_WIRE_MULTI_SET:
        if (rd_count(&c, lim->max_keys, &n)) goto bad;
        if ((uint64_t)n * 9u > c.left) {
            c.why = "truncated body";
            goto bad;
        }
        if ((rc = alloc_arrays(req, n, true)) != 0) return rc;
        for (uint32_t i = 0; i < n; i++)
            if (rd_key(&c, lim->max_key, &req->keys[i]) ||
                rd_bytes(&c, lim->max_value, &req->values[i]))
                goto bad;
        break;
    default:
        c.why = "unknown op";
        goto bad;
    }
    if (rd_end(&c)) goto bad;
    return 0;
bad:
    tdist__wire_request_free(req);
    *why = c.why;
    return -1;
}

/* ------------------------------------------------------------- replies */

void tdist__wire_reply_free(tdist__wire_reply_t *rep)
{
    if (!rep) return;
    free(rep->values);
    rep->values = NULL;
}

int tdist__wire_reply_decode(uint8_t op, uint8_t status, const uint8_t *body, size_t len,
                             const tdist__wire_limits_t *lim, tdist__wire_reply_t *rep,
                             const char **why)
{
    cursor_t c = {.p = body, .left = len, .why = "malformed body"};
    memset(rep, 0, sizeof *rep);
    rep->op = op;
    rep->status = status;
    uint8_t flag;
    uint32_t n;

    if (status != TDIST_WIRE_OK) {
        if (rd_bytes(&c, lim->max_frame, &rep->message)) goto bad;
    } else {
        switch (op) {
        case TDIST_WIRE_HELLO:
            if (c.left == 0) break; /* no proof wanted */
            if (rd_u8(&c, &flag) || rd_bytes(&c, TDIST_WIRE_MAX_NONCE, &rep->value)) goto bad;
            if (flag != 1) {
                c.why = "hello reply flag is not 1";
                goto bad;
            }
            rep->num = 1;
            break;
        case TDIST_WIRE_AUTH:
            if (rd_bytes(&c, TDIST_WIRE_PROOF_LEN, &rep->value)) goto bad;
            break;
        case TDIST_WIRE_SET:
        case TDIST_WIRE_WAIT:
        case TDIST_WIRE_APPEND:
        case TDIST_WIRE_MULTI_SET:
            break;
        case TDIST_WIRE_GET:
        case TDIST_WIRE_CAS:
            if (rd_bytes(&c, lim->max_value, &rep->value)) goto bad;
            break;
        case TDIST_WIRE_ADD:
        case TDIST_WIRE_NUM_KEYS:
            if (rd_i64(&c, &rep->num)) goto bad;
            break;
        case TDIST_WIRE_CHECK:
        case TDIST_WIRE_DELETE:
            if (rd_u8(&c, &flag)) goto bad;
            if (flag > 1) {
                c.why = "flag is neither 0 nor 1";
                goto bad;
            }
            rep->num = flag;
            break;
        case TDIST_WIRE_MULTI_GET:
            if (rd_u32(&c, &n)) goto bad;
            if (n == 0 || n > lim->max_keys || (uint64_t)n * 4u > c.left) {
                c.why = "bad value count";
                goto bad;
            }
            rep->values = calloc(n, sizeof *rep->values);
            if (!rep->values) return -2;
            rep->n = n;
            for (uint32_t i = 0; i < n; i++)
                if (rd_bytes(&c, lim->max_value, &rep->values[i])) goto bad;
            break;
        default:
            c.why = "unknown op";
            goto bad;
        }
    }
    if (rd_end(&c)) goto bad;
    return 0;
bad:
    tdist__wire_reply_free(rep);
    *why = c.why;
    return -1;
}

/* ------------------------------------------------------------ encoding */

int tdist__wbuf_reserve(tdist__wbuf_t *b, size_t extra)
{
    if (b->oom) return -1;
    if (extra > SIZE_MAX - b->len) {
        b->oom = true;
        return -1;
    }
    size_t need = b->len + extra;
    if (need <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < need) cap = cap > SIZE_MAX / 2 ? need : cap * 2;
    uint8_t *p = realloc(b->data, cap);
    if (!p) {
        b->oom = true;
        return -1;
    }
    b->data = p;
    b->cap = cap;
    return 0;
}

void tdist__wbuf_put_raw(tdist__wbuf_t *b, const void *p, size_t len)
{
    if (len == 0 || tdist__wbuf_reserve(b, len)) return;
    memcpy(b->data + b->len, p, len);
    b->len += len;
}

void tdist__wbuf_put_u8(tdist__wbuf_t *b, uint8_t v) { tdist__wbuf_put_raw(b, &v, 1); }

void tdist__wbuf_put_u32(tdist__wbuf_t *b, uint32_t v)
{
    uint8_t t[4];
    tdist__wire_set_u32(t, v);
    tdist__wbuf_put_raw(b, t, 4);
}

void tdist__wbuf_put_i64(tdist__wbuf_t *b, int64_t v)
{
    uint64_t u = (uint64_t)v;
    tdist__wbuf_put_u32(b, (uint32_t)(u >> 32));
    tdist__wbuf_put_u32(b, (uint32_t)u);
}

void tdist__wbuf_put_bytes(tdist__wbuf_t *b, const void *p, size_t len)
{
    tdist__wbuf_put_u32(b, (uint32_t)len);
    tdist__wbuf_put_raw(b, p, len);
}

size_t tdist__wbuf_begin_frame(tdist__wbuf_t *b, uint8_t op, uint8_t status)
{
    size_t off = b->len;
    uint8_t h[TDIST_WIRE_HEADER_SIZE] = {0, 0, 0, 0, op, status, 0, 0};
    tdist__wbuf_put_raw(b, h, sizeof h);
    return off;
}

size_t tdist__wbuf_end_frame(tdist__wbuf_t *b, size_t off)
{
    if (b->oom) return SIZE_MAX;
    size_t body = b->len - off - TDIST_WIRE_HEADER_SIZE;
    tdist__wire_set_u32(b->data + off, body > UINT32_MAX ? UINT32_MAX : (uint32_t)body);
    return body;
}

void tdist__wbuf_clear(tdist__wbuf_t *b)
{
    b->len = 0;
    b->oom = false;
}

void tdist__wbuf_free(tdist__wbuf_t *b)
{
    free(b->data);
    memset(b, 0, sizeof *b);
}

void tdist__wire_put_error(tdist__wbuf_t *b, uint8_t op, uint8_t status, const char *msg)
{
    size_t off = tdist__wbuf_begin_frame(b, op, status);
    tdist__wbuf_put_bytes(b, msg, strlen(msg));
    tdist__wbuf_end_frame(b, off);
}

void tdist__wire_proof(const char *secret, bool server, const tdist__wire_bytes_t *first,
                       const tdist__wire_bytes_t *second, uint8_t out[TDIST_WIRE_PROOF_LEN])
{
    const char *label = server ? "tdist store server" : "tdist store client";
    const void *parts[3] = {label, first->ptr, second->ptr};
    size_t lens[3] = {strlen(label) + 1, first->len, second->len};
    tdist__hmac_sha256(secret, strlen(secret), parts, lens, 3, out);
}
