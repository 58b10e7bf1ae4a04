/*
 * tests/fuzz/fuzz_store_frame.c — libFuzzer target for the TCP store's frame
 * parser (src/store/wire.c).
 *
 * The input is treated as a byte stream arriving on a connection: frames
 * are cut from it the way the server does (header, then body), and each
 * body is decoded as a request and as a reply, under the protocol's limits
 * and under tiny ones. Checks beyond "no crash, no leak, no UB":
 *  - a decoded request re-encodes to exactly the bytes it came from;
 *  - every view the decoder returns lies inside the body.
 * Built with clang -fsanitize=fuzzer,address,undefined by
 * tests/fuzz/CMakeLists.txt; links wire.c alone.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "store/wire.h"

/* Stop the fuzzer with a crash report when cond is false. */
#define CHECK(cond)                                                            \
    do {                                                                       \
        if (!(cond)) __builtin_trap();                                         \
    } while (0)

/* v lies within [body, body + len). */
static void check_view(const tdist__wire_bytes_t *v, const uint8_t *body, size_t len)
{
    if (v->len == 0) return;
    CHECK(v->ptr >= body && v->ptr + v->len <= body + len);
}

/* Encode r again and compare with the body it was decoded from. */
static void reencode(const tdist__wire_request_t *r, const uint8_t *body, size_t len)
{
    tdist__wbuf_t b = {0};
    switch (r->op) {
    case TDIST_WIRE_HELLO:
        tdist__wbuf_put_u32(&b, TDIST_WIRE_MAGIC);
        tdist__wbuf_put_u32(&b, r->version);
        tdist__wbuf_put_bytes(&b, r->nonce.ptr, r->nonce.len);
        break;
    case TDIST_WIRE_AUTH:
        tdist__wbuf_put_bytes(&b, r->proof.ptr, r->proof.len);
        break;
    case TDIST_WIRE_SET:
    case TDIST_WIRE_APPEND:
        tdist__wbuf_put_bytes(&b, r->keys[0].ptr, r->keys[0].len);
        tdist__wbuf_put_bytes(&b, r->values[0].ptr, r->values[0].len);
        break;
    case TDIST_WIRE_GET:
        tdist__wbuf_put_i64(&b, r->timeout_ms);
        tdist__wbuf_put_bytes(&b, r->keys[0].ptr, r->keys[0].len);
        break;
    case TDIST_WIRE_ADD:
        tdist__wbuf_put_bytes(&b, r->keys[0].ptr, r->keys[0].len);
        tdist__wbuf_put_i64(&b, r->delta);
        break;
    case TDIST_WIRE_CAS:
        tdist__wbuf_put_bytes(&b, r->keys[0].ptr, r->keys[0].len);
        tdist__wbuf_put_bytes(&b, r->expected.ptr, r->expected.len);
        tdist__wbuf_put_bytes(&b, r->desired.ptr, r->desired.len);
        break;
    case TDIST_WIRE_DELETE:
        tdist__wbuf_put_bytes(&b, r->keys[0].ptr, r->keys[0].len);
        break;
    case TDIST_WIRE_NUM_KEYS:
        break;
    case TDIST_WIRE_WAIT:
    case TDIST_WIRE_MULTI_GET:
    case TDIST_WIRE_CHECK:
        if (r->op != TDIST_WIRE_CHECK) tdist__wbuf_put_i64(&b, r->timeout_ms);
        tdist__wbuf_put_u32(&b, r->n);
        for (uint32_t i = 0; i < r->n; i++) tdist__wbuf_put_bytes(&b, r->keys[i].ptr, r->keys[i].len);
        break;
    case TDIST_WIRE_MULTI_SET:
        tdist__wbuf_put_u32(&b, r->n);
        for (uint32_t i = 0; i < r->n; i++) {
            tdist__wbuf_put_bytes(&b, r->keys[i].ptr, r->keys[i].len);
            tdist__wbuf_put_bytes(&b, r->values[i].ptr, r->values[i].len);
        }
        break;
    default:
        CHECK(0);
    }
    CHECK(!b.oom);
    CHECK(b.len == len && (len == 0 || memcmp(b.data, body, len) == 0));
    tdist__wbuf_free(&b);
}

/* Decode one body as a request and as a reply under lim. */
static void decode_body(uint8_t op, uint8_t status, const uint8_t *body, size_t len,
                        const tdist__wire_limits_t *lim)
{
    const char *why = NULL;
    tdist__wire_request_t r;
    int rc = tdist__wire_request_decode(op, body, len, lim, &r, &why);
    if (rc == 0) {
        CHECK(r.n <= lim->max_keys);
        for (uint32_t i = 0; i < r.n; i++) {
            CHECK(r.keys[i].len >= 1 && r.keys[i].len <= lim->max_key);
            CHECK(memchr(r.keys[i].ptr, 0, r.keys[i].len) == NULL);
            check_view(&r.keys[i], body, len);
            if (r.values) {
                CHECK(r.values[i].len <= lim->max_value);
                check_view(&r.values[i], body, len);
            }
        }
        check_view(&r.nonce, body, len);
        check_view(&r.proof, body, len);
        check_view(&r.expected, body, len);
        check_view(&r.desired, body, len);
        reencode(&r, body, len);
        tdist__wire_request_free(&r);
    } else {
        CHECK(rc == -2 || why != NULL);
    }
    tdist__wire_reply_t rep;
    rc = tdist__wire_reply_decode(op, status, body, len, lim, &rep, &why);
    if (rc == 0) {
        check_view(&rep.message, body, len);
        check_view(&rep.value, body, len);
        for (uint32_t i = 0; i < rep.n; i++) check_view(&rep.values[i], body, len);
        tdist__wire_reply_free(&rep);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    tdist__wire_limits_t big = tdist__wire_default_limits();
    tdist__wire_limits_t tiny = {.max_key = 8, .max_value = 16, .max_keys = 4, .max_frame = 256};
    size_t off = 0;
    while (off < size) {
        tdist__wire_header_t h;
        const char *why = NULL;
        int rc = tdist__wire_header_decode(data + off, size - off, big.max_frame, true, &h, &why);
        if (rc <= 0) {
            CHECK(rc == 0 ? size - off < TDIST_WIRE_HEADER_SIZE : why != NULL);
            break; /* the server would wait for more, or close */
        }
        size_t avail = size - off - TDIST_WIRE_HEADER_SIZE;
        /* a truncated body: decode what there is (must not over-read) */
        size_t len = h.body_len <= avail ? h.body_len : avail;
        const uint8_t *body = data + off + TDIST_WIRE_HEADER_SIZE;
        /* copy to an exact-size buffer so ASan sees any over-read */
        uint8_t *copy = malloc(len ? len : 1);
        if (!copy) return 0;
        memcpy(copy, body, len);
        decode_body(h.op, h.status, copy, len, &big);
        decode_body(h.op, h.status, copy, len, &tiny);
        free(copy);
        if (h.body_len > avail) break;
        off += TDIST_WIRE_HEADER_SIZE + h.body_len;
    }
    return 0;
}
