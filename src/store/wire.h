/*
 * store/wire.h — the TCP store's wire protocol: frame encoding and decoding
 * as pure functions over byte buffers (no sockets, no globals), so that the
 * server, the client and the fuzzer share one parser.
 *
 * Every frame is an 8-byte header followed by a body:
 *
 *     u32 body_len | u8 op | u8 status | u16 reserved (0)
 *
 * All integers are big-endian (network order). body_len is at most the
 * frame cap (TDIST_WIRE_MAX_FRAME, or less on a server with smaller caps).
 * Requests carry status 0; a reply carries the request's op and a status
 * (tdist__wire_status_t). Body fields are built from:
 *
 *     u8, u32, i64 (two's complement)
 *     bytes = u32 len | len bytes
 *     key   = bytes with 1 <= len <= max_key and no NUL byte
 *
 * Requests (client -> server) and their OK replies:
 *
 *     HELLO     u32 magic 'TDKV' | u32 version | bytes nonce  -> (empty) or u8 1 | bytes nonce
 *     SET       key | bytes value                             -> (empty)
 *     GET       i64 timeout_ms | key                          -> bytes value
 *     ADD       key | i64 delta                               -> i64 new value
 *     CAS       key | bytes expected | bytes desired          -> bytes current
 *     WAIT      i64 timeout_ms | u32 n | n x key              -> (empty)
 *     CHECK     u32 n | n x key                               -> u8 all_exist
 *     DELETE    key                                           -> u8 deleted
 *     NUM_KEYS  (empty)                                       -> i64 count
 *     APPEND    key | bytes value                             -> (empty)
 *     MULTI_GET i64 timeout_ms | u32 n | n x key              -> u32 n | n x bytes
 *     MULTI_SET u32 n | n x (key | bytes value)               -> (empty)
 *     AUTH      bytes proof                                   -> bytes proof
 *
 * A reply with a non-zero status has body "bytes message" (UTF-8 text).
 * timeout_ms < 0 means "no deadline". The first frame on a connection must
 * be HELLO (the client's nonce); the server checks the version. A server
 * without a secret answers with an empty body and serves at once. A server
 * with one answers "u8 1 | its own nonce", and the next frame must be
 * AUTH: the client's proof HMAC-SHA256(secret, "tdist store client" |
 * server nonce | client nonce); the server checks it and answers with its
 * own proof HMAC-SHA256(secret, "tdist store server" | client nonce |
 * server nonce), which the client checks. The secret never crosses the
 * wire; see tdist__wire_proof.
 * Anything malformed (bad header, unknown op, truncated or trailing body,
 * caps exceeded) makes the server close that connection without a reply.
 */
#ifndef TDIST_STORE_WIRE_H
#define TDIST_STORE_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tdist/store.h"

#define TDIST_WIRE_VERSION 2u
#define TDIST_WIRE_MAGIC 0x54444B56u /* "TDKV" */
#define TDIST_WIRE_HEADER_SIZE 8u
/* Largest body any frame may have: room for compare_set's two full-size
 * values plus keys and field headers. */
#define TDIST_WIRE_MAX_FRAME (2u * TDIST_STORE_MAX_VALUE + (1u << 20))
#define TDIST_WIRE_MAX_TOKEN 1024u /* longest secret */
#define TDIST_WIRE_MAX_NONCE 64u
#define TDIST_WIRE_PROOF_LEN 32u

typedef enum tdist__wire_op {
    TDIST_WIRE_HELLO = 1,
    TDIST_WIRE_SET = 2,
    TDIST_WIRE_GET = 3,
    TDIST_WIRE_ADD = 4,
    TDIST_WIRE_CAS = 5,
    TDIST_WIRE_WAIT = 6,
    TDIST_WIRE_CHECK = 7,
    TDIST_WIRE_DELETE = 8,
    TDIST_WIRE_NUM_KEYS = 9,
    TDIST_WIRE_APPEND = 10,
    TDIST_WIRE_MULTI_GET = 11,
    TDIST_WIRE_MULTI_SET = 12,
    TDIST_WIRE_AUTH = 13,
    TDIST_WIRE_OP_MAX = 13
} tdist__wire_op_t;

typedef enum tdist__wire_status {
    TDIST_WIRE_OK = 0,
    TDIST_WIRE_ETIMEOUT = 1,   /* a get/wait/multi_get deadline passed */
    TDIST_WIRE_EINVALID = 2,   /* e.g. add on a non-numeric value */
    TDIST_WIRE_EAUTH = 3,      /* wrong or missing proof of the secret */
    TDIST_WIRE_EVERSION = 4,   /* unsupported protocol version */
    TDIST_WIRE_ETOOLARGE = 5,  /* the reply or result would exceed a cap */
    TDIST_WIRE_ENOMEM = 6,     /* the server ran out of memory */
    TDIST_WIRE_STATUS_MAX = 6
} tdist__wire_status_t;

/* Caps a decoder enforces. */
typedef struct tdist__wire_limits {
    uint32_t max_key;
    uint32_t max_value;
    uint32_t max_keys;  /* keys per request */
    uint32_t max_frame; /* body bytes */
} tdist__wire_limits_t;

/* The protocol's own limits (what a client accepts from a server). */
tdist__wire_limits_t tdist__wire_default_limits(void);

typedef struct tdist__wire_header {
    uint32_t body_len;
    uint8_t op;
    uint8_t status;
} tdist__wire_header_t;

/* A view of len bytes inside a decoded buffer (not NUL-terminated). */
typedef struct tdist__wire_bytes {
    const uint8_t *ptr;
    uint32_t len;
} tdist__wire_bytes_t;

/* A decoded request. Byte views point into the decoded body, which must
 * outlive the request. keys/values are arrays of n entries: for single-key
 * ops they point to inline storage, for multi ops they are malloc'd
 * (release with tdist__wire_request_free). */
typedef struct tdist__wire_request {
    uint8_t op;
    uint32_t version;               /* HELLO */
    tdist__wire_bytes_t nonce;      /* HELLO: the client's nonce */
    tdist__wire_bytes_t proof;      /* AUTH */
    int64_t timeout_ms;             /* GET, WAIT, MULTI_GET */
    int64_t delta;                  /* ADD */
    tdist__wire_bytes_t expected;   /* CAS */
    tdist__wire_bytes_t desired;    /* CAS */
    uint32_t n;                     /* number of keys (0 for HELLO, NUM_KEYS) */
    tdist__wire_bytes_t *keys;      /* n keys */
    tdist__wire_bytes_t *values;    /* SET, APPEND: 1 value; MULTI_SET: n values; else NULL */
    tdist__wire_bytes_t inline_key, inline_value;
    bool owns_arrays;
} tdist__wire_request_t;

/* A decoded reply; views point into the decoded body. values is malloc'd
 * for MULTI_GET (release with tdist__wire_reply_free). */
typedef struct tdist__wire_reply {
    uint8_t op;
    uint8_t status;
    tdist__wire_bytes_t message;    /* status != OK */
    tdist__wire_bytes_t value;      /* GET, CAS; HELLO: server nonce; AUTH: server proof */
    int64_t num;                    /* ADD result, NUM_KEYS count, CHECK/DELETE flag,
                                       HELLO: 1 if the server wants proof */
    uint32_t n;                     /* MULTI_GET */
    tdist__wire_bytes_t *values;    /* MULTI_GET */
} tdist__wire_reply_t;

/* Name of an op ("get", "multi_set", ...); "unknown" otherwise. */
const char *tdist__wire_op_name(uint8_t op);

/* Decode a frame header from the first len bytes of buf.
 * Returns 1 and fills *h when the header is complete and valid, 0 when
 * fewer than TDIST_WIRE_HEADER_SIZE bytes are available, and -1 when the
 * header is invalid (unknown op or status, reserved bits set, body longer
 * than max_frame); *why then names the problem (static string).
 * is_reply: whether a non-zero status is allowed. Pure; thread-safe. */
int tdist__wire_header_decode(const uint8_t *buf, size_t len, uint32_t max_frame, bool is_reply,
                              tdist__wire_header_t *h, const char **why);

/* Decode the body of a request with op, checking every cap in *lim.
 * Returns 0 and fills *req (views into body), or -1 with *why set (body
 * malformed, truncated, trailing bytes, cap exceeded) or -2 when out of
 * memory. On failure nothing needs freeing. Pure; thread-safe. */
int tdist__wire_request_decode(uint8_t op, const uint8_t *body, size_t len,
                               const tdist__wire_limits_t *lim, tdist__wire_request_t *req,
                               const char **why);

/* Free the arrays a decoded request owns (not the body). NULL-safe. */
void tdist__wire_request_free(tdist__wire_request_t *req);

/* Decode the body of a reply to op with status. Same return values as
 * tdist__wire_request_decode. */
int tdist__wire_reply_decode(uint8_t op, uint8_t status, const uint8_t *body, size_t len,
                             const tdist__wire_limits_t *lim, tdist__wire_reply_t *rep,
                             const char **why);

/* Free the arrays a decoded reply owns. NULL-safe. */
void tdist__wire_reply_free(tdist__wire_reply_t *rep);

/* ------------------------------------------------------------ encoding */

/* A growable byte buffer for building frames. Zero-initialise it. Any
 * allocation failure sets oom and turns later writes into no-ops, so a
 * caller checks once at the end. */
typedef struct tdist__wbuf {
    uint8_t *data;
    size_t len;
    size_t cap;
    bool oom;
} tdist__wbuf_t;

/* Make room for extra more bytes. 0 on success, -1 (and oom) on failure. */
int tdist__wbuf_reserve(tdist__wbuf_t *b, size_t extra);
void tdist__wbuf_put_u8(tdist__wbuf_t *b, uint8_t v);
void tdist__wbuf_put_u32(tdist__wbuf_t *b, uint32_t v);
void tdist__wbuf_put_i64(tdist__wbuf_t *b, int64_t v);
void tdist__wbuf_put_raw(tdist__wbuf_t *b, const void *p, size_t len);
/* u32 length then the bytes; len must fit in u32 (caller checks caps). */
void tdist__wbuf_put_bytes(tdist__wbuf_t *b, const void *p, size_t len);
/* Start a frame: writes a header with body_len 0; returns its offset. */
size_t tdist__wbuf_begin_frame(tdist__wbuf_t *b, uint8_t op, uint8_t status);
/* Finish the frame begun at off: patch body_len. Returns the body length
 * (SIZE_MAX if oom). */
size_t tdist__wbuf_end_frame(tdist__wbuf_t *b, size_t off);
/* Forget the contents (keeps the allocation). */
void tdist__wbuf_clear(tdist__wbuf_t *b);
/* Free the allocation and zero the buffer. */
void tdist__wbuf_free(tdist__wbuf_t *b);

/* Append a complete error reply (op, status, message) to b. */
void tdist__wire_put_error(tdist__wbuf_t *b, uint8_t op, uint8_t status, const char *msg);

/* The proof of the secret one side of a store connection gives:
 * HMAC-SHA256(secret, label | first | second) into out (32 bytes). The
 * client's label is "tdist store client" over (server nonce, client
 * nonce); the server's "tdist store server" over (client nonce, server
 * nonce). Pure. */
void tdist__wire_proof(const char *secret, bool server, const tdist__wire_bytes_t *first,
                       const tdist__wire_bytes_t *second, uint8_t out[TDIST_WIRE_PROOF_LEN]);

/* Big-endian helpers. */
uint32_t tdist__wire_get_u32(const uint8_t *p);
void tdist__wire_set_u32(uint8_t *p, uint32_t v);

#endif /* TDIST_STORE_WIRE_H */
