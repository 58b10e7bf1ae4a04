/*
 * tests/store/test_tcp_frames.c — the wire protocol: encode/decode round
 * trips and rejection of every truncation (pure functions), then a corpus
 * of bad frames sent to a live server over raw sockets: each closes only
 * its own connection, another client keeps working, and the server's
 * client count returns to its baseline.
 */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/internal.h"
#include "harness.h"
#include "store_clients.h"
#include "store/wire.h"

/* ------------------------------------------------------- pure functions */

/* Build a request frame with op into b via fill(b). Returns the body. */
typedef void (*fill_fn)(tdist__wbuf_t *b);

static void fill_set(tdist__wbuf_t *b)
{
    tdist__wbuf_put_bytes(b, "key", 3);
    tdist__wbuf_put_bytes(b, "value", 5);
}
static void fill_get(tdist__wbuf_t *b)
{
    tdist__wbuf_put_i64(b, -5);
    tdist__wbuf_put_bytes(b, "key", 3);
}
static void fill_add(tdist__wbuf_t *b)
{
    tdist__wbuf_put_bytes(b, "ctr", 3);
    tdist__wbuf_put_i64(b, INT64_MIN);
}
static void fill_cas(tdist__wbuf_t *b)
{
    tdist__wbuf_put_bytes(b, "k", 1);
    tdist__wbuf_put_bytes(b, "", 0);
    tdist__wbuf_put_bytes(b, "d", 1);
}
static void fill_wait(tdist__wbuf_t *b)
{
    tdist__wbuf_put_i64(b, 1234);
    tdist__wbuf_put_u32(b, 2);
    tdist__wbuf_put_bytes(b, "a", 1);
    tdist__wbuf_put_bytes(b, "bb", 2);
}
static void fill_check(tdist__wbuf_t *b)
{
    tdist__wbuf_put_u32(b, 1);
    tdist__wbuf_put_bytes(b, "a", 1);
}
static void fill_del(tdist__wbuf_t *b) { tdist__wbuf_put_bytes(b, "gone", 4); }
static void fill_none(tdist__wbuf_t *b) { (void)b; }
static void fill_mset(tdist__wbuf_t *b)
{
    tdist__wbuf_put_u32(b, 2);
    tdist__wbuf_put_bytes(b, "a", 1);
    tdist__wbuf_put_bytes(b, "1", 1);
    tdist__wbuf_put_bytes(b, "b", 1);
    tdist__wbuf_put_bytes(b, "", 0);
}
static void fill_hello(tdist__wbuf_t *b)
{
    tdist__wbuf_put_u32(b, TDIST_WIRE_MAGIC);
    tdist__wbuf_put_u32(b, TDIST_WIRE_VERSION);
    tdist__wbuf_put_bytes(b, "tok", 3);
}

TEST(store_tcp_frames_request_roundtrip_and_truncation, 30)
{
    struct {
        uint8_t op;
        fill_fn fill;
        uint32_t n;
    } cases[] = {
        {TDIST_WIRE_HELLO, fill_hello, 0},    {TDIST_WIRE_SET, fill_set, 1},
        {TDIST_WIRE_GET, fill_get, 1},        {TDIST_WIRE_ADD, fill_add, 1},
        {TDIST_WIRE_CAS, fill_cas, 1},        {TDIST_WIRE_WAIT, fill_wait, 2},
        {TDIST_WIRE_CHECK, fill_check, 1},    {TDIST_WIRE_DELETE, fill_del, 1},
        {TDIST_WIRE_NUM_KEYS, fill_none, 0},  {TDIST_WIRE_APPEND, fill_set, 1},
        {TDIST_WIRE_MULTI_GET, fill_wait, 2}, {TDIST_WIRE_MULTI_SET, fill_mset, 2},
    };
    tdist__wire_limits_t lim = tdist__wire_default_limits();
    for (size_t c = 0; c < TDIST_ARRAY_SIZE(cases); c++) {
        tdist__wbuf_t b = {0};
        size_t off = tdist__wbuf_begin_frame(&b, cases[c].op, 0);
        cases[c].fill(&b);
        size_t body = tdist__wbuf_end_frame(&b, off);
        ASSERT_FALSE(b.oom);
        tdist__wire_header_t h;
        const char *why = NULL;
        ASSERT_EQ(tdist__wire_header_decode(b.data, b.len, lim.max_frame, false, &h, &why), 1);
        ASSERT_EQ(h.op, cases[c].op);
        ASSERT_EQ(h.body_len, body);
        for (size_t k = 0; k < TDIST_WIRE_HEADER_SIZE; k++)
            ASSERT_EQ(tdist__wire_header_decode(b.data, k, lim.max_frame, false, &h, &why), 0);
        tdist__wire_request_t r;
        const uint8_t *bd = b.data + TDIST_WIRE_HEADER_SIZE;
        ASSERT_EQ(tdist__wire_request_decode(cases[c].op, bd, body, &lim, &r, &why), 0);
        ASSERT_EQ(r.n, cases[c].n);
        if (cases[c].op == TDIST_WIRE_GET) {
            ASSERT_EQ(r.timeout_ms, -5);
            ASSERT_EQ(r.keys[0].len, 3);
            ASSERT_MEMEQ(r.keys[0].ptr, "key", 3);
        }
        if (cases[c].op == TDIST_WIRE_ADD) ASSERT_TRUE(r.delta == INT64_MIN);
        if (cases[c].op == TDIST_WIRE_MULTI_SET) {
            ASSERT_EQ(r.values[0].len, 1);
            ASSERT_EQ(r.values[1].len, 0);
            ASSERT_MEMEQ(r.keys[1].ptr, "b", 1);
        }
        if (cases[c].op == TDIST_WIRE_HELLO) ASSERT_EQ(r.version, TDIST_WIRE_VERSION);
        tdist__wire_request_free(&r);
        /* every strict prefix of the body, and one trailing byte, is rejected */
        for (size_t k = 0; k < body; k++) {
            why = NULL;
            ASSERT_EQ(tdist__wire_request_decode(cases[c].op, bd, k, &lim, &r, &why), -1);
            ASSERT_TRUE(why != NULL);
        }
        tdist__wbuf_put_u8(&b, 0);
        ASSERT_EQ(tdist__wire_request_decode(cases[c].op, bd, body + 1, &lim, &r, &why), -1);
        ASSERT_CONTAINS(why, "trailing");
        tdist__wbuf_free(&b);
    }
}

TEST(store_tcp_frames_header_and_caps, 10)
{
    tdist__wire_limits_t lim = {.max_key = 4, .max_value = 8, .max_keys = 2, .max_frame = 100};
    uint8_t h8[8] = {0, 0, 0, 10, TDIST_WIRE_SET, 0, 0, 0};
    tdist__wire_header_t h;
    const char *why = NULL;
    ASSERT_EQ(tdist__wire_header_decode(h8, 8, lim.max_frame, false, &h, &why), 1);
    h8[0] = 1; /* body of 16 MiB > cap */
    ASSERT_EQ(tdist__wire_header_decode(h8, 8, lim.max_frame, false, &h, &why), -1);
    ASSERT_CONTAINS(why, "cap");
    h8[0] = 0;
    h8[4] = 0; /* op 0 */
    ASSERT_EQ(tdist__wire_header_decode(h8, 8, lim.max_frame, false, &h, &why), -1);
    h8[4] = 99;
    ASSERT_EQ(tdist__wire_header_decode(h8, 8, lim.max_frame, false, &h, &why), -1);
    h8[4] = TDIST_WIRE_GET;
    h8[5] = 1; /* status in a request */
    ASSERT_EQ(tdist__wire_header_decode(h8, 8, lim.max_frame, false, &h, &why), -1);
    ASSERT_EQ(tdist__wire_header_decode(h8, 8, lim.max_frame, true, &h, &why), 1);
    h8[5] = 0;
    h8[7] = 1; /* reserved */
    ASSERT_EQ(tdist__wire_header_decode(h8, 8, lim.max_frame, false, &h, &why), -1);

    struct {
        const char *key;
        uint32_t klen;
        uint32_t vlen;
        const char *want;
    } bad[] = {
        {"", 0, 1, "empty key"},
        {"toolong", 7, 1, "key longer"},
        {"a\0b", 3, 1, "NUL"},
        {"k", 1, 9, "value longer"},
    };
    for (size_t i = 0; i < TDIST_ARRAY_SIZE(bad); i++) {
        tdist__wbuf_t b = {0};
        tdist__wbuf_put_bytes(&b, bad[i].key, bad[i].klen);
        uint8_t val[16] = {0};
        tdist__wbuf_put_bytes(&b, val, bad[i].vlen);
        tdist__wire_request_t r;
        ASSERT_EQ(tdist__wire_request_decode(TDIST_WIRE_SET, b.data, b.len, &lim, &r, &why), -1);
        ASSERT_CONTAINS(why, bad[i].want);
        tdist__wbuf_free(&b);
    }
    /* too many keys; a count larger than the body can hold */
    tdist__wbuf_t b = {0};
    tdist__wbuf_put_u32(&b, 3);
    for (int i = 0; i < 3; i++) tdist__wbuf_put_bytes(&b, "k", 1);
    tdist__wire_request_t r;
    ASSERT_EQ(tdist__wire_request_decode(TDIST_WIRE_CHECK, b.data, b.len, &lim, &r, &why), -1);
    ASSERT_CONTAINS(why, "too many keys");
    tdist__wbuf_clear(&b);
    tdist__wbuf_put_u32(&b, 0xFFFFFFFFu);
    lim.max_keys = 0xFFFFFFFFu;
    ASSERT_EQ(tdist__wire_request_decode(TDIST_WIRE_CHECK, b.data, b.len, &lim, &r, &why), -1);
    ASSERT_CONTAINS(why, "truncated");
    tdist__wbuf_free(&b);
}

TEST(store_tcp_frames_reply_decode, 10)
{
    tdist__wire_limits_t lim = tdist__wire_default_limits();
    tdist__wbuf_t b = {0};
    tdist__wire_put_error(&b, TDIST_WIRE_GET, TDIST_WIRE_ETIMEOUT, "timed out");
    tdist__wire_header_t h;
    const char *why = NULL;
    ASSERT_EQ(tdist__wire_header_decode(b.data, b.len, lim.max_frame, true, &h, &why), 1);
    tdist__wire_reply_t rep;
    ASSERT_EQ(tdist__wire_reply_decode(h.op, h.status, b.data + 8, h.body_len, &lim, &rep, &why), 0);
    ASSERT_EQ(rep.status, TDIST_WIRE_ETIMEOUT);
    ASSERT_EQ(rep.message.len, 9);
    ASSERT_MEMEQ(rep.message.ptr, "timed out", 9);
    tdist__wire_reply_free(&rep);

    tdist__wbuf_clear(&b);
    tdist__wbuf_put_u32(&b, 2);
    tdist__wbuf_put_bytes(&b, "x", 1);
    tdist__wbuf_put_bytes(&b, "", 0);
    ASSERT_EQ(tdist__wire_reply_decode(TDIST_WIRE_MULTI_GET, 0, b.data, b.len, &lim, &rep, &why), 0);
    ASSERT_EQ(rep.n, 2);
    ASSERT_EQ(rep.values[0].len, 1);
    ASSERT_EQ(rep.values[1].len, 0);
    tdist__wire_reply_free(&rep);
    for (size_t k = 0; k < b.len; k++)
        ASSERT_EQ(tdist__wire_reply_decode(TDIST_WIRE_MULTI_GET, 0, b.data, k, &lim, &rep, &why), -1);
    uint8_t flag = 2;
    ASSERT_EQ(tdist__wire_reply_decode(TDIST_WIRE_CHECK, 0, &flag, 1, &lim, &rep, &why), -1);
    tdist__wbuf_free(&b);
}

/* --------------------------------------------------- against a server */

/* A raw blocking TCP connection to 127.0.0.1:port. */
static int raw_connect(uint16_t port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ASSERT_TRUE(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

static void raw_send(int fd, const void *p, size_t n)
{
    const uint8_t *q = p;
    while (n > 0) {
        ssize_t w = send(fd, q, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) return; /* the server may already have closed: fine */
        q += w;
        n -= (size_t)w;
    }
}

/* Wait (bounded) until the server closes fd; discards anything it sends.
 * true if closed. */
static bool wait_closed(int fd)
{
    double end = tdist_test_now_ms() + 5000 * tdist_test_timeout_mult();
    uint8_t buf[4096];
    while (tdist_test_now_ms() < end) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 100) <= 0) continue;
        ssize_t r = recv(fd, buf, sizeof buf, 0);
        if (r == 0) return true;
        if (r < 0 && errno != EINTR && errno != EAGAIN) return true; /* reset */
    }
    return false;
}

/* Send a valid HELLO on fd and check the OK reply. */
static void raw_hello(int fd)
{
    tdist__wbuf_t b = {0};
    size_t off = tdist__wbuf_begin_frame(&b, TDIST_WIRE_HELLO, 0);
    tdist__wbuf_put_u32(&b, TDIST_WIRE_MAGIC);
    tdist__wbuf_put_u32(&b, TDIST_WIRE_VERSION);
    tdist__wbuf_put_bytes(&b, NULL, 0);
    tdist__wbuf_end_frame(&b, off);
    raw_send(fd, b.data, b.len);
    tdist__wbuf_free(&b);
    uint8_t rep[8];
    size_t got = 0;
    while (got < sizeof rep) {
        ssize_t r = recv(fd, rep + got, sizeof rep - got, 0);
        ASSERT_TRUE(r > 0);
        got += (size_t)r;
    }
    ASSERT_EQ(rep[4], TDIST_WIRE_HELLO);
    ASSERT_EQ(rep[5], TDIST_WIRE_OK);
    ASSERT_EQ(tdist__wire_get_u32(rep), 0);
}

/* A bad-frame case: what to send after (optionally) a HELLO. */
typedef struct bad_case {
    const char *name;
    bool hello_first;
    void (*build)(tdist__wbuf_t *b);
    bool then_close; /* the client disconnects right after sending */
} bad_case_t;

static void b_trunc_header(tdist__wbuf_t *b) { tdist__wbuf_put_raw(b, "\0\0\0", 3); }
static void b_trunc_body_declared(tdist__wbuf_t *b)
{
    /* header promises 100 bytes; only 10 arrive before the client leaves */
    size_t off = tdist__wbuf_begin_frame(b, TDIST_WIRE_SET, 0);
    tdist__wbuf_put_raw(b, "0123456789", 10);
    tdist__wire_set_u32(b->data + off, 100);
}
static void b_body_inner_truncated(tdist__wbuf_t *b)
{
    /* a complete frame whose key length runs past the body */
    size_t off = tdist__wbuf_begin_frame(b, TDIST_WIRE_SET, 0);
    tdist__wbuf_put_u32(b, 50);
    tdist__wbuf_put_raw(b, "abc", 3);
    tdist__wbuf_end_frame(b, off);
}
static void b_beyond_cap(tdist__wbuf_t *b)
{
    size_t off = tdist__wbuf_begin_frame(b, TDIST_WIRE_SET, 0);
    tdist__wire_set_u32(b->data + off, 0xFFFFFFF0u);
}
static void b_unknown_op(tdist__wbuf_t *b)
{
    size_t off = tdist__wbuf_begin_frame(b, 99, 0);
    tdist__wbuf_put_bytes(b, "k", 1);
    tdist__wbuf_end_frame(b, off);
}
static void b_key_too_long(tdist__wbuf_t *b)
{
    char key[65];
    memset(key, 'k', sizeof key);
    size_t off = tdist__wbuf_begin_frame(b, TDIST_WIRE_SET, 0);
    tdist__wbuf_put_bytes(b, key, sizeof key); /* the server's max_key is 64 */
    tdist__wbuf_put_bytes(b, "v", 1);
    tdist__wbuf_end_frame(b, off);
}
static void b_value_too_long(tdist__wbuf_t *b)
{
    static uint8_t val[2000];
    size_t off = tdist__wbuf_begin_frame(b, TDIST_WIRE_SET, 0);
    tdist__wbuf_put_bytes(b, "k", 1);
    tdist__wbuf_put_bytes(b, val, sizeof val); /* the server's max_value is 1024 */
    tdist__wbuf_end_frame(b, off);
}
static void b_garbage(tdist__wbuf_t *b)
{
    uint32_t x = 12345;
    for (int i = 0; i < 4096; i++) {
        x = x * 1103515245u + 12345u;
        tdist__wbuf_put_u8(b, (uint8_t)(x >> 16));
    }
    b->data[7] = 0xAB; /* make sure the reserved header bytes are not zero */
}
static void b_no_hello(tdist__wbuf_t *b)
{
    size_t off = tdist__wbuf_begin_frame(b, TDIST_WIRE_SET, 0);
    fill_set(b);
    tdist__wbuf_end_frame(b, off);
}
static void b_bad_magic(tdist__wbuf_t *b)
{
    size_t off = tdist__wbuf_begin_frame(b, TDIST_WIRE_HELLO, 0);
    tdist__wbuf_put_u32(b, 0xDEADBEEFu);
    tdist__wbuf_put_u32(b, TDIST_WIRE_VERSION);
    tdist__wbuf_put_bytes(b, NULL, 0);
    tdist__wbuf_end_frame(b, off);
}
static void b_bad_version(tdist__wbuf_t *b)
{
    size_t off = tdist__wbuf_begin_frame(b, TDIST_WIRE_HELLO, 0);
    tdist__wbuf_put_u32(b, TDIST_WIRE_MAGIC);
    tdist__wbuf_put_u32(b, 999);
    tdist__wbuf_put_bytes(b, NULL, 0);
    tdist__wbuf_end_frame(b, off);
}
static void b_trailing(tdist__wbuf_t *b)
{
    size_t off = tdist__wbuf_begin_frame(b, TDIST_WIRE_DELETE, 0);
    tdist__wbuf_put_bytes(b, "k", 1);
    tdist__wbuf_put_u8(b, 0);
    tdist__wbuf_end_frame(b, off);
}
static void b_status_in_request(tdist__wbuf_t *b)
{
    size_t off = tdist__wbuf_begin_frame(b, TDIST_WIRE_NUM_KEYS, 3);
    tdist__wbuf_end_frame(b, off);
}
static void b_zero_keys(tdist__wbuf_t *b)
{
    size_t off = tdist__wbuf_begin_frame(b, TDIST_WIRE_WAIT, 0);
    tdist__wbuf_put_i64(b, 10);
    tdist__wbuf_put_u32(b, 0);
    tdist__wbuf_end_frame(b, off);
}
static void b_second_hello(tdist__wbuf_t *b)
{
    size_t off = tdist__wbuf_begin_frame(b, TDIST_WIRE_HELLO, 0);
    fill_hello(b);
    tdist__wbuf_end_frame(b, off);
}

/* A client that checks the server still serves others. */
static void still_serving(tdist_store_t *good, int i)
{
    char key[32];
    snprintf(key, sizeof key, "good%d", i);
    ASSERT_OK(tdist_store_set(good, key, key, strlen(key)));
    void *v = NULL;
    size_t n = 0;
    ASSERT_OK(tdist_store_get(good, key, &v, &n));
    ASSERT_EQ(n, strlen(key));
    ASSERT_MEMEQ(v, key, n);
    free(v);
}

static tdist_store_server_t *small_caps_server(void)
{
    tdist_store_server_opts_t so;
    tdist_store_server_opts_init(&so);
    so.max_key = 64;
    so.max_value = 1024;
    tdist_store_server_t *srv = NULL;
    ASSERT_OK(tdist_store_server_create("127.0.0.1", 0, &so, &srv));
    return srv;
}

static tdist_store_t *good_client(uint16_t port)
{
    tdist_store_opts_t o;
    tdist_store_opts_init(&o);
    o.timeout_ms = (int64_t)(10000 * tdist_test_timeout_mult());
    tdist_store_t *s = NULL;
    ASSERT_OK(tdist_store_tcp_connect("127.0.0.1", port, &o, &s));
    return s;
}

TEST(store_tcp_bad_frames_close_only_that_connection, 60)
{
    bad_case_t cases[] = {
        {"truncated header, then disconnect", false, b_trunc_header, true},
        {"truncated header (no hello), then disconnect", true, b_trunc_header, true},
        {"half a frame, then disconnect", true, b_trunc_body_declared, true},
        {"body shorter than its fields", true, b_body_inner_truncated, false},
        {"length beyond the cap", true, b_beyond_cap, false},
        {"length beyond the cap before hello", false, b_beyond_cap, false},
        {"unknown opcode", true, b_unknown_op, false},
        {"key too long", true, b_key_too_long, false},
        {"value too long", true, b_value_too_long, false},
        {"garbage bytes", false, b_garbage, false},
        {"garbage bytes after hello", true, b_garbage, false},
        {"request before hello", false, b_no_hello, false},
        {"hello with bad magic", false, b_bad_magic, false},
        {"hello with unknown version", false, b_bad_version, false},
        {"trailing bytes", true, b_trailing, false},
        {"status byte in a request", true, b_status_in_request, false},
        {"zero keys", true, b_zero_keys, false},
        {"second hello", true, b_second_hello, false},
    };
    tdist_store_server_t *srv = small_caps_server();
    uint16_t port = tdist_store_server_port(srv);
    tdist_store_t *good = good_client(port);
    const int baseline = 1;
    ASSERT_EQ(tdist_store_server_num_clients(srv), baseline);
    for (size_t i = 0; i < TDIST_ARRAY_SIZE(cases); i++) {
        int fd = raw_connect(port);
        if (cases[i].hello_first) raw_hello(fd);
        tdist__wbuf_t b = {0};
        cases[i].build(&b);
        raw_send(fd, b.data, b.len);
        tdist__wbuf_free(&b);
        if (cases[i].then_close) {
            close(fd);
        } else {
            if (!wait_closed(fd)) FAIL("case \"%s\": the server kept the connection open", cases[i].name);
            close(fd);
        }
        wait_clients(srv, baseline);
        still_serving(good, (int)i);
    }
    tdist_store_destroy(good);
    wait_clients(srv, 0);
    tdist_store_server_destroy(srv);
}

/* A connection that never completes its HELLO is closed at the server's
 * hello deadline (not before); authenticated idle clients stay. */
TEST(store_tcp_silent_connection_dropped_at_hello_deadline, 30)
{
    tdist_store_server_opts_t so;
    tdist_store_server_opts_init(&so);
    so.hello_timeout_ms = 500;
    tdist_store_server_t *srv = NULL;
    ASSERT_OK(tdist_store_server_create("127.0.0.1", 0, &so, &srv));
    uint16_t port = tdist_store_server_port(srv);
    tdist_store_t *good = good_client(port);
    int silent = raw_connect(port);
    double start = tdist_test_now_ms();
    wait_clients(srv, 2);
    if (!wait_closed(silent)) FAIL("the server kept a silent connection open");
    double took = tdist_test_now_ms() - start;
    close(silent);
    ASSERT_GE(took, 450); /* the deadline counts from accept, just after start */
    ASSERT_LE(took, 500 + 1000 * tdist_test_timeout_mult());
    wait_clients(srv, 1);
    usleep(600 * 1000); /* past the deadline: the authenticated client stays */
    ASSERT_EQ(tdist_store_server_num_clients(srv), 1);
    still_serving(good, 99);
    tdist_store_destroy(good);
    tdist_store_server_destroy(srv);
}

/* A client that sends requests but never reads the replies is dropped once
 * its unsent replies pass the cap; the server and others go on. */
TEST(store_tcp_client_that_never_reads_is_dropped, 60)
{
    tdist_store_server_t *srv = small_caps_server();
    uint16_t port = tdist_store_server_port(srv);
    tdist_store_t *good = good_client(port);
    /* a 1000-byte value: each get's reply is ~1 KB */
    uint8_t val[1000];
    memset(val, 'v', sizeof val);
    ASSERT_OK(tdist_store_set(good, "big", val, sizeof val));

    int fd = raw_connect(port);
    raw_hello(fd);
    int small = 4096;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
    tdist__wbuf_t b = {0};
    for (int i = 0; i < 256; i++) {
        size_t off = tdist__wbuf_begin_frame(&b, TDIST_WIRE_GET, 0);
        tdist__wbuf_put_i64(&b, 0);
        tdist__wbuf_put_bytes(&b, "big", 3);
        tdist__wbuf_end_frame(&b, off);
    }
    /* 256 x ~1 KB = 256 KB of replies per batch; send batches until the
     * server gives up on us (bounded: 64 batches = 16 MB of replies) */
    bool dropped = false;
    for (int batch = 0; batch < 64 && !dropped; batch++) {
        raw_send(fd, b.data, b.len);
        still_serving(good, batch);
        dropped = tdist_store_server_num_clients(srv) == 1;
    }
    tdist__wbuf_free(&b);
    wait_clients(srv, 1);
    close(fd);
    still_serving(good, 1000);
    tdist_store_destroy(good);
    wait_clients(srv, 0);
    tdist_store_server_destroy(srv);
}

/* Too many clients: the extra one is refused with a clear error; the
 * others go on. */
TEST(store_tcp_max_clients_refuses_extra, 30)
{
    tdist_store_server_opts_t so;
    tdist_store_server_opts_init(&so);
    so.max_clients = 2;
    tdist_store_server_t *srv = NULL;
    ASSERT_OK(tdist_store_server_create("127.0.0.1", 0, &so, &srv));
    uint16_t port = tdist_store_server_port(srv);
    tdist_store_t *a = good_client(port), *b = good_client(port);
    tdist_store_opts_t o;
    tdist_store_opts_init(&o);
    o.timeout_ms = 2000;
    o.connect_timeout_ms = 0;
    tdist_store_t *c = NULL;
    ASSERT_STATUS(tdist_store_tcp_connect("127.0.0.1", port, &o, &c), TDIST_ERR_CONNECTION);
    ASSERT_CONTAINS(tdist_last_error(), "127.0.0.1:");
    still_serving(a, 1);
    still_serving(b, 2);
    tdist_store_destroy(a);
    tdist_store_destroy(b);
    wait_clients(srv, 0);
    tdist_store_server_destroy(srv);
}

/* Read one whole reply frame from a raw blocking fd into b (header and
 * body). */
static void raw_read_frame(int fd, tdist__wbuf_t *b)
{
    tdist__wbuf_clear(b);
    ASSERT_EQ(tdist__wbuf_reserve(b, TDIST_WIRE_HEADER_SIZE), 0);
    size_t need = TDIST_WIRE_HEADER_SIZE;
    while (b->len < need) {
        ssize_t r = recv(fd, b->data + b->len, need - b->len, 0);
        ASSERT_TRUE(r > 0);
        b->len += (size_t)r;
        if (b->len == TDIST_WIRE_HEADER_SIZE && need == TDIST_WIRE_HEADER_SIZE) {
            need += tdist__wire_get_u32(b->data);
            ASSERT_EQ(tdist__wbuf_reserve(b, need - b->len), 0);
        }
    }
}

/* Requests pipelined behind a parked get are answered in order once the
 * get completes. */
TEST(store_tcp_pipelined_requests_behind_a_parked_get, 30)
{
    tdist_store_server_t *srv = small_caps_server();
    uint16_t port = tdist_store_server_port(srv);
    int fd = raw_connect(port);
    raw_hello(fd);
    tdist__wbuf_t b = {0};
    size_t off = tdist__wbuf_begin_frame(&b, TDIST_WIRE_GET, 0);
    tdist__wbuf_put_i64(&b, 20000);
    tdist__wbuf_put_bytes(&b, "later", 5);
    tdist__wbuf_end_frame(&b, off);
    off = tdist__wbuf_begin_frame(&b, TDIST_WIRE_SET, 0);
    tdist__wbuf_put_bytes(&b, "after", 5);
    tdist__wbuf_put_bytes(&b, "x", 1);
    tdist__wbuf_end_frame(&b, off);
    off = tdist__wbuf_begin_frame(&b, TDIST_WIRE_ADD, 0);
    tdist__wbuf_put_bytes(&b, "n", 1);
    tdist__wbuf_put_i64(&b, 41);
    tdist__wbuf_end_frame(&b, off);
    raw_send(fd, b.data, b.len);

    /* nothing is answered while the get is parked */
    tdist_store_t *good = good_client(port);
    bool ok = true;
    ASSERT_OK(tdist_store_check(good, (const char *[]){"after"}, 1, &ok));
    ASSERT_FALSE(ok);
    struct pollfd p = {.fd = fd, .events = POLLIN};
    ASSERT_EQ(poll(&p, 1, 200), 0);

    ASSERT_OK(tdist_store_set(good, "later", "L", 1));
    raw_read_frame(fd, &b);
    ASSERT_EQ(b.data[4], TDIST_WIRE_GET);
    ASSERT_EQ(b.data[5], TDIST_WIRE_OK);
    ASSERT_EQ(b.len, TDIST_WIRE_HEADER_SIZE + 4 + 1);
    ASSERT_EQ(b.data[12], 'L');
    raw_read_frame(fd, &b);
    ASSERT_EQ(b.data[4], TDIST_WIRE_SET);
    raw_read_frame(fd, &b);
    ASSERT_EQ(b.data[4], TDIST_WIRE_ADD);
    ASSERT_EQ(b.data[5], TDIST_WIRE_OK);
    ASSERT_EQ(b.data[15], 41);
    tdist__wbuf_free(&b);
    ASSERT_OK(tdist_store_check(good, (const char *[]){"after"}, 1, &ok));
    ASSERT_TRUE(ok);
    close(fd);
    tdist_store_destroy(good);
    wait_clients(srv, 0);
    tdist_store_server_destroy(srv);
}
