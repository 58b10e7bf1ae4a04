/* tests/transport/test_tcp_transport.c — the TCP transport on real
 * processes: full-mesh exchange at several world sizes with every byte
 * checked, a 16 MiB ring, ordering of many small messages, 64 MiB
 * sendrecv both ways, handshake rejection, set-up deadlines, peers that
 * are killed, exit or stop, abort from another thread, fd leaks, IPv6.
 *
 * Ranks exchange transport addresses through the harness's store:
 * tdist_init("env://"), set "tp/<rank>", multi_get every rank's key. */
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <arpa/inet.h>
#include <unistd.h>

#include "core/auth.h"
#include "mesh.h"

#define TAG 0x7464697374303031ull

/* This file's mesh: tcp. */
static void tp_open(tp_rank_t *t, int rank, int n, const char *bind, uint64_t tag)
{
    mesh_open(t, TDIST__TP_TCP, rank, n, bind, tag);
}

/* Wait until every rank has set "<name>/<rank>". */
static void store_barrier(tp_rank_t *t, const char *name) { mesh_barrier(t, name, t->n); }

/* ---------------------------------------------- every pair, every size */

static const size_t pair_sizes[] = {0, 1, 7, 4096, (1u << 20) + 3};
#define NSIZES ((int)(sizeof pair_sizes / sizeof pair_sizes[0]))

static void pairs_body(int rank, int n, void *arg)
{
    (void)arg;
    int fds_before = tdist_test_count_fds();
    tp_rank_t t;
    tp_open(&t, rank, n, "127.0.0.1", TAG);
    tp_connect(&t);
    int nreq = 2 * NSIZES * (n - 1), k = 0;
    tdist__tp_req_t *reqs = calloc((size_t)TDIST_MAX(nreq, 1), sizeof *reqs);
    tdist__tp_req_t **rp = calloc((size_t)TDIST_MAX(nreq, 1), sizeof *rp);
    uint8_t **bufs = calloc((size_t)TDIST_MAX(nreq, 1), sizeof *bufs);
    ASSERT_TRUE(reqs && rp && bufs);
    /* Post everything, sends and receives interleaved, then wait once. */
    for (int i = 0; i < NSIZES; i++) {
        for (int d = 1; d < n; d++) {
            int to = (rank + d) % n, from = (rank - d + n) % n;
            size_t len = pair_sizes[i];
            bufs[k] = malloc(len + 1);
            ASSERT_TRUE(bufs[k] != NULL);
            mesh_fill(bufs[k], len, rank, to, i);
            ASSERT_OK(tdist__tp_post_send(t.tp, &reqs[k], to, bufs[k], len));
            rp[k] = &reqs[k];
            k++;
            bufs[k] = malloc(len + 1);
            ASSERT_TRUE(bufs[k] != NULL);
            memset(bufs[k], 0xee, len + 1);
            ASSERT_OK(tdist__tp_post_recv(t.tp, &reqs[k], from, bufs[k], len));
            rp[k] = &reqs[k];
            k++;
        }
    }
    ASSERT_EQ(k, nreq);
    ASSERT_OK(tdist__tp_wait(t.tp, rp, (size_t)nreq, deadline_in(20000)));
    k = 0;
    for (int i = 0; i < NSIZES; i++) {
        for (int d = 1; d < n; d++) {
            int from = (rank - d + n) % n;
            ASSERT_TRUE(tdist__tp_req_done(&reqs[k]));
            ASSERT_OK(tdist__tp_req_status(&reqs[k]));
            k++;
            ASSERT_TRUE(tdist__tp_req_done(&reqs[k]));
            ASSERT_OK(tdist__tp_req_status(&reqs[k]));
            mesh_check(bufs[k], pair_sizes[i], from, rank, i);
            ASSERT_EQ(bufs[k][pair_sizes[i]], 0xee); /* nothing past len */
            k++;
        }
    }
    for (int i = 0; i < nreq; i++) free(bufs[i]);
    free(bufs);
    free(reqs);
    free(rp);
    store_barrier(&t, "pairs-done"); /* nobody closes while others still read */
    tp_close(&t);
    ASSERT_EQ(tdist_test_count_fds(), fds_before);
}

TEST(transport_tcp_pairs_w1, 30) { tdist_test_run_ranks(1, pairs_body, NULL); }
TEST(transport_tcp_pairs_w2, 30) { tdist_test_run_ranks(2, pairs_body, NULL); }
TEST(transport_tcp_pairs_w3, 30) { tdist_test_run_ranks(3, pairs_body, NULL); }
TEST(transport_tcp_pairs_w5, 40) { tdist_test_run_ranks(5, pairs_body, NULL); }
TEST(transport_tcp_pairs_w8, 60) { tdist_test_run_ranks(8, pairs_body, NULL); }

/* ------------------------------------------------------ 16 MiB ring */

#define RING_BYTES (16u << 20)

static uint8_t ring_byte(int origin, size_t off)
{
    return (uint8_t)((unsigned)origin * 29u + off * 7u + (off >> 12) * 13u);
}

static uint64_t fnv(const uint8_t *b, size_t len)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < len; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

static uint64_t ring_expected(int origin)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < RING_BYTES; i++) h = (h ^ ring_byte(origin, i)) * 1099511628211ull;
    return h;
}

static void ring_body(int rank, int n, void *arg)
{
    (void)arg;
    tp_rank_t t;
    tp_open(&t, rank, n, "127.0.0.1", TAG);
    tp_connect(&t);
    uint8_t *cur = malloc(RING_BYTES), *nxt = malloc(RING_BYTES);
    ASSERT_TRUE(cur && nxt);
    for (size_t i = 0; i < RING_BYTES; i++) cur[i] = ring_byte(rank, i);
    int right = (rank + 1) % n, left = (rank - 1 + n) % n;
    /* n-1 steps: each rank forwards what it got, so every block visits
     * every rank; the checksum says whose block arrived intact. */
    for (int step = 0; step < n - 1; step++) {
        ASSERT_OK(tdist__tp_sendrecv(t.tp, right, cur, RING_BYTES, left, nxt, RING_BYTES,
                                     deadline_in(20000)));
        int origin = (rank - step - 1 + 2 * n) % n;
        uint64_t got = fnv(nxt, RING_BYTES), want = ring_expected(origin);
        if (got != want)
            FAIL("ring step %d: block of rank %d has checksum %016llx, expected %016llx", step,
                 origin, (unsigned long long)got, (unsigned long long)want);
        uint8_t *tmp = cur;
        cur = nxt;
        nxt = tmp;
    }
    free(cur);
    free(nxt);
    store_barrier(&t, "ring-done");
    tp_close(&t);
}

TEST(transport_tcp_ring_16mib_4_ranks, 60) { tdist_test_run_ranks(4, ring_body, NULL); }

/* -------------------------------------------- 64 MiB sendrecv both ways */

#define BIG_BYTES (64u << 20)

static void sendrecv_big_body(int rank, int n, void *arg)
{
    (void)arg;
    tp_rank_t t;
    tp_open(&t, rank, n, "127.0.0.1", TAG);
    tp_connect(&t);
    int peer = 1 - rank;
    uint8_t *s = malloc(BIG_BYTES), *r = malloc(BIG_BYTES);
    ASSERT_TRUE(s && r);
    mesh_fill(s, BIG_BYTES, rank, peer, 5);
    /* to == from, both ranks at once: no deadlock however large. */
    ASSERT_OK(tdist__tp_sendrecv(t.tp, peer, s, BIG_BYTES, peer, r, BIG_BYTES, deadline_in(30000)));
    mesh_check(r, BIG_BYTES, peer, rank, 5);
    /* Uneven halves: one sends 64 MiB, the other 1 byte. */
    size_t slen = rank == 0 ? BIG_BYTES : 1, rlen = rank == 0 ? 1 : BIG_BYTES;
    mesh_fill(s, slen, rank, peer, 6);
    ASSERT_OK(tdist__tp_sendrecv(t.tp, peer, s, slen, peer, r, rlen, deadline_in(30000)));
    mesh_check(r, rlen, peer, rank, 6);
    free(s);
    free(r);
    store_barrier(&t, "big-done");
    tp_close(&t);
}

TEST(transport_tcp_sendrecv_64mib_both_ways, 60) { tdist_test_run_ranks(2, sendrecv_big_body, NULL); }

/* ------------------------------------------ many small messages in order */

#define NSMALL 10000
#define BATCH 1000

static void small_body(int rank, int n, void *arg)
{
    (void)arg;
    tp_rank_t t;
    tp_open(&t, rank, n, "127.0.0.1", TAG);
    tp_connect(&t);
    uint64_t *vals = calloc(NSMALL, sizeof *vals);
    tdist__tp_req_t *reqs = calloc(NSMALL, sizeof *reqs);
    tdist__tp_req_t **rp = calloc(NSMALL, sizeof *rp);
    ASSERT_TRUE(vals && reqs && rp);
    for (int i = 0; i < NSMALL; i++) rp[i] = &reqs[i];
    if (rank == 0) {
        /* All 10k sends posted at once; rank 1 receives in batches, so
         * most bytes wait in the kernel with no receive posted. */
        for (int i = 0; i < NSMALL; i++) {
            vals[i] = 0x5eed000000000000ull + (uint64_t)i * 2654435761u;
            ASSERT_OK(tdist__tp_post_send(t.tp, &reqs[i], 1, &vals[i], 8));
        }
        ASSERT_OK(tdist__tp_wait(t.tp, rp, NSMALL, deadline_in(20000)));
        /* The way back: blocking one-by-one receives. */
        for (int i = 0; i < BATCH; i++) {
            uint64_t v = 0;
            ASSERT_OK(tdist__tp_recv(t.tp, 1, &v, 8, deadline_in(10000)));
            ASSERT_EQ(v, (uint64_t)i * 3 + 1);
        }
    } else {
        for (int b = 0; b < NSMALL / BATCH; b++) {
            for (int i = b * BATCH; i < (b + 1) * BATCH; i++)
                ASSERT_OK(tdist__tp_post_recv(t.tp, &reqs[i], 0, &vals[i], 8));
            ASSERT_OK(tdist__tp_wait(t.tp, rp + b * BATCH, BATCH, deadline_in(20000)));
            if (b == 0) tdist__sleep_ms(20); /* let the sender fill the socket */
        }
        for (int i = 0; i < NSMALL; i++)
            if (vals[i] != 0x5eed000000000000ull + (uint64_t)i * 2654435761u)
                FAIL("small message %d arrived out of order or corrupt: %016llx", i,
                     (unsigned long long)vals[i]);
        for (int i = 0; i < BATCH; i++) {
            uint64_t v = (uint64_t)i * 3 + 1;
            ASSERT_OK(tdist__tp_send(t.tp, 0, &v, 8, deadline_in(10000)));
        }
    }
    free(vals);
    free(reqs);
    free(rp);
    store_barrier(&t, "small-done");
    tp_close(&t);
}

TEST(transport_tcp_small_messages_in_order, 40) { tdist_test_run_ranks(2, small_body, NULL); }

/* ------------------------- read-ahead across receives of mixed sizes */

/* Sizes around the transport's read-ahead limits (a receive with less
 * than 16 KiB left reads up to 64 KiB ahead): a message that ends inside
 * what was read ahead, one that starts there and goes on in the socket,
 * and large ones that read straight into their buffer. */
static const size_t mixed_sizes[] = {1,     3,     16383, 16384, 16385,  65535, 65536,
                                     65537, 8,     7,     40000, 200000, 1,     12};
#define NMIXED ((int)(sizeof mixed_sizes / sizeof mixed_sizes[0]))

static uint8_t mixed_byte(int pass, int msg, size_t off)
{
    return (uint8_t)(pass * 97 + msg * 131 + off * 7 + (off >> 8));
}

static void mixed_body(int rank, int n, void *arg)
{
    (void)arg;
    (void)n;
    tp_rank_t t;
    tp_open(&t, rank, n, "127.0.0.1", TAG);
    tp_connect(&t);
    size_t total = 0;
    for (int i = 0; i < NMIXED; i++) total += mixed_sizes[i];
    uint8_t *buf = malloc(total);
    tdist__tp_req_t reqs[NMIXED], *rp[NMIXED];
    ASSERT_TRUE(buf != NULL);
    /* pass 0: the receiver posts one receive at a time, after the sender
     * has sent everything it can; pass 1: every receive posted at once */
    for (int pass = 0; pass < 2; pass++) {
        size_t off = 0;
        if (rank == 0) {
            for (int i = 0; i < NMIXED; i++) {
                for (size_t j = 0; j < mixed_sizes[i]; j++) buf[off + j] = mixed_byte(pass, i, j);
                ASSERT_OK(tdist__tp_post_send(t.tp, &reqs[i], 1, buf + off, mixed_sizes[i]));
                rp[i] = &reqs[i];
                off += mixed_sizes[i];
            }
            ASSERT_OK(tdist__tp_wait(t.tp, rp, NMIXED, deadline_in(20000)));
        } else {
            memset(buf, 0, total);
            if (pass == 0) tdist__sleep_ms(50); /* the messages wait in the socket */
            for (int i = 0; i < NMIXED; i++) {
                ASSERT_OK(tdist__tp_post_recv(t.tp, &reqs[i], 0, buf + off, mixed_sizes[i]));
                rp[i] = &reqs[i];
                if (pass == 0) ASSERT_OK(tdist__tp_wait(t.tp, &rp[i], 1, deadline_in(20000)));
                off += mixed_sizes[i];
            }
            if (pass == 1) ASSERT_OK(tdist__tp_wait(t.tp, rp, NMIXED, deadline_in(20000)));
            off = 0;
            for (int i = 0; i < NMIXED; i++) {
                for (size_t j = 0; j < mixed_sizes[i]; j++)
                    if (buf[off + j] != mixed_byte(pass, i, j))
                        FAIL("pass %d: message %d (%zu bytes), byte %zu: %u, expected %u", pass,
                             i, mixed_sizes[i], j, buf[off + j], mixed_byte(pass, i, j));
                off += mixed_sizes[i];
            }
        }
        store_barrier(&t, pass == 0 ? "mixed-0" : "mixed-1");
    }
    free(buf);
    tp_close(&t);
}

TEST(transport_tcp_mixed_sizes_across_read_ahead, 40) { tdist_test_run_ranks(2, mixed_body, NULL); }

/* ---------------------------- large sends in slices, both ways at once */

/* Sizes around the transport's send slice (a send goes into the socket
 * 256 KiB a call, and the peer's receives run after each whole slice):
 * one under, at and over it, several slices and a remainder, and small
 * ones between them. Both ranks post all their sends and receives at
 * once, so the slices of one side interleave with the receives of the
 * other; every byte must come out in stream order. */
static const size_t slice_sizes[] = {(256u << 10) - 1, 256u << 10,       (256u << 10) + 1, 3,
                                     (768u << 10) + 5, 1,                (1u << 20),       17};
#define NSLICE ((int)(sizeof slice_sizes / sizeof slice_sizes[0]))

static uint8_t slice_byte(int from, int msg, size_t off)
{
    return (uint8_t)(from * 61 + msg * 29 + off * 13 + (off >> 9));
}

static void slices_body(int rank, int n, void *arg)
{
    (void)arg;
    tp_rank_t t;
    tp_open(&t, rank, n, "127.0.0.1", TAG);
    tp_connect(&t);
    int peer = 1 - rank;
    size_t total = 0;
    for (int i = 0; i < NSLICE; i++) total += slice_sizes[i];
    uint8_t *out = malloc(total), *in = calloc(1, total);
    ASSERT_TRUE(out && in);
    tdist__tp_req_t reqs[2 * NSLICE], *rp[2 * NSLICE];
    size_t off = 0;
    for (int i = 0; i < NSLICE; i++) {
        for (size_t j = 0; j < slice_sizes[i]; j++) out[off + j] = slice_byte(rank, i, j);
        ASSERT_OK(tdist__tp_post_send(t.tp, &reqs[2 * i], peer, out + off, slice_sizes[i]));
        ASSERT_OK(tdist__tp_post_recv(t.tp, &reqs[2 * i + 1], peer, in + off, slice_sizes[i]));
        rp[2 * i] = &reqs[2 * i];
        rp[2 * i + 1] = &reqs[2 * i + 1];
        off += slice_sizes[i];
    }
    ASSERT_OK(tdist__tp_wait(t.tp, rp, 2 * NSLICE, deadline_in(20000)));
    off = 0;
    for (int i = 0; i < NSLICE; i++) {
        for (size_t j = 0; j < slice_sizes[i]; j++)
            if (in[off + j] != slice_byte(peer, i, j))
                FAIL("message %d (%zu bytes), byte %zu: %u, expected %u", i, slice_sizes[i], j,
                     in[off + j], slice_byte(peer, i, j));
        off += slice_sizes[i];
    }
    free(out);
    free(in);
    store_barrier(&t, "slices-done");
    tp_close(&t);
}

TEST(transport_tcp_sliced_sends_both_ways_in_order, 40) { tdist_test_run_ranks(2, slices_body, NULL); }

/* --------------------------------------------------- handshake rejection */

/* The wire format of a handshake frame (transport/tcp.c): 96 bytes LE,
 * a 32-byte header, a nonce (here 0x5a...), a mac. */
#define FRAME 96
static void frame(uint8_t *f, uint32_t magic, uint16_t type, uint64_t tag, uint32_t size,
                  uint32_t from, uint32_t to)
{
    memset(f, 0, FRAME);
    if (type != 3) memset(f + 32, 0x5a, 32);
    for (int i = 0; i < 4; i++) f[i] = (uint8_t)(magic >> (8 * i));
    f[4] = 2; /* version */
    f[6] = (uint8_t)type;
    for (int i = 0; i < 8; i++) f[8 + i] = (uint8_t)(tag >> (8 * i));
    for (int i = 0; i < 4; i++) {
        f[16 + i] = (uint8_t)(size >> (8 * i));
        f[20 + i] = (uint8_t)(from >> (8 * i));
        f[24 + i] = (uint8_t)(to >> (8 * i));
    }
}

#define MAGIC 0x70746474u

/* A blocking connection to 127.0.0.1:port with a receive timeout. */
static int raw_connect(uint16_t port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    struct timeval tv = {.tv_sec = (time_t)(5 * tdist_test_timeout_mult())};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static uint16_t port_of(const char *addr)
{
    const char *c = strrchr(addr, ':');
    return c ? (uint16_t)atoi(c + 1) : 0;
}

/* The mac of an ACK (ack) or PROOF over a HELLO and an ACK, keyed with
 * secret, as transport/tcp.c computes it. */
static void hs_mac(const char *secret, bool ack, const uint8_t *hello, const uint8_t *ackf,
                   uint8_t *out)
{
    const char *label = ack ? "tdist transport ack" : "tdist transport proof";
    const void *parts[3] = {label, hello, ackf};
    size_t lens[3] = {strlen(label) + 1, 64, 64};
    tdist__hmac_sha256(secret, strlen(secret), parts, lens, 3, out);
}

/* Send a frame; return what came back: 96 (a full reply, in reply), 0
 * (closed without reply), -1 (error/timeout). */
static int raw_try(uint16_t port, const uint8_t *f, size_t flen, uint8_t *reply, int *fd_keep)
{
    int fd = raw_connect(port);
    if (fd < 0) return -2;
    if (send(fd, f, flen, MSG_NOSIGNAL) != (ssize_t)flen) {
        close(fd);
        return -3;
    }
    size_t got = 0;
    while (got < FRAME) {
        ssize_t n = recv(fd, reply + got, FRAME - got, 0);
        if (n == 0) break;
        if (n < 0) {
            int e = errno;
            close(fd);
            return e == ECONNRESET ? 0 : -1;
        }
        got += (size_t)n;
    }
    if (fd_keep && got == FRAME)
        *fd_keep = fd;
    else
        close(fd);
    return (int)got;
}

/* Whether the listener closes fd (EOF or reset) without sending more. */
static bool closed_by_peer(int fd)
{
    uint8_t b[FRAME];
    ssize_t n = recv(fd, b, sizeof b, 0);
    return n == 0 || (n < 0 && errno == ECONNRESET);
}

/* Claim rank 1 with a HELLO, check the ACK's header and its mac under
 * secret, then send a PROOF made with proof_key. Returns the connection
 * (kept open), or a negative step on failure. */
static int claim_rank1(uint16_t port, const char *secret, const char *proof_key)
{
    uint8_t f[FRAME], reply[FRAME], want[FRAME], mac[32];
    int keep = -1;
    frame(f, MAGIC, 1, TAG, 3, 1, 0);
    if (raw_try(port, f, FRAME, reply, &keep) != FRAME) return -1;
    frame(want, MAGIC, 2, TAG, 3, 0, 1);
    if (memcmp(reply, want, 32) != 0) return -2;
    hs_mac(secret, true, f, reply, mac);
    if (memcmp(reply + 64, mac, 32) != 0) return -3;
    uint8_t proof[FRAME];
    frame(proof, MAGIC, 3, TAG, 3, 1, 0);
    hs_mac(proof_key, false, f, reply, proof + 64);
    if (send(keep, proof, FRAME, MSG_NOSIGNAL) != FRAME) return -4;
    return keep;
}

/* The child plays a fake rank 1 and strangers against a rank-0 listener of
 * a 3-rank group whose job secret is secret; rank 2 never comes. */
static int handshake_child(uint16_t port, const char *secret)
{
    uint8_t f[FRAME], reply[FRAME];
    /* garbage */
    memset(f, 0xab, sizeof f);
    if (raw_try(port, f, FRAME, reply, NULL) != 0) return 10;
    /* wrong tag */
    frame(f, MAGIC, 1, TAG ^ 1, 3, 1, 0);
    if (raw_try(port, f, FRAME, reply, NULL) != 0) return 11;
    /* wrong size */
    frame(f, MAGIC, 1, TAG, 4, 1, 0);
    if (raw_try(port, f, FRAME, reply, NULL) != 0) return 12;
    /* wrong to-rank */
    frame(f, MAGIC, 1, TAG, 3, 1, 2);
    if (raw_try(port, f, FRAME, reply, NULL) != 0) return 13;
    /* wrong direction (rank 0 claims to connect to itself) */
    frame(f, MAGIC, 1, TAG, 3, 0, 0);
    if (raw_try(port, f, FRAME, reply, NULL) != 0) return 14;
    /* out-of-range from-rank */
    frame(f, MAGIC, 1, TAG, 3, 7, 0);
    if (raw_try(port, f, FRAME, reply, NULL) != 0) return 15;
    /* an ACK where a HELLO belongs */
    frame(f, MAGIC, 2, TAG, 3, 1, 0);
    if (raw_try(port, f, FRAME, reply, NULL) != 0) return 16;
    /* a short frame, then close */
    int fd = raw_connect(port);
    if (fd < 0) return 17;
    if (send(fd, f, 5, MSG_NOSIGNAL) != 5) return 18;
    close(fd);
    /* a silent connection, kept open, and 100 more: more than the 64
     * handshakes a listener keeps pending, so the oldest make room */
    int silent = raw_connect(port);
    if (silent < 0) return 19;
    int flood[100];
    for (int i = 0; i < 100; i++)
        if ((flood[i] = raw_connect(port)) < 0) return 24;
    /* a stranger without the secret: gets a challenge, its proof is refused */
    int stranger = claim_rank1(port, secret, "not the secret");
    if (stranger < 0) return 30 - stranger;
    if (!closed_by_peer(stranger)) return 20;
    close(stranger);
    /* rank 1 with the secret: its channel comes up (the listener keeps it) */
    int keep = claim_rank1(port, secret, secret);
    if (keep < 0) return 40 - keep;
    /* a second rank 1, even with the secret: closed, at its HELLO or at
     * its proof (whichever rank 0 reads after the first one's proof) */
    frame(f, MAGIC, 1, TAG, 3, 1, 0);
    int second = -1;
    int got = raw_try(port, f, FRAME, reply, &second);
    if (got == FRAME) {
        uint8_t proof[FRAME];
        frame(proof, MAGIC, 3, TAG, 3, 1, 0);
        hs_mac(secret, false, f, reply, proof + 64);
        if (send(second, proof, FRAME, MSG_NOSIGNAL) != FRAME) return 21;
        if (!closed_by_peer(second)) return 22;
        close(second);
    } else if (got != 0) {
        return 23;
    }
    close(silent);
    for (int i = 0; i < 100; i++) close(flood[i]);
    close(keep);
    return 0;
}

TEST(transport_tcp_handshake_rejects_bad_frames, 30)
{
    int fds_before = tdist_test_count_fds();
    const char *secret = "transport-test-secret";
    setenv("TDIST_JOB_SECRET", secret, 1);
    tdist__tp_opts_t o = {.bind_addr = "127.0.0.1", .tag = TAG};
    tdist__tp_t *tp = NULL;
    ASSERT_OK(tdist__tp_listen(TDIST__TP_TCP, 0, 3, &o, &tp));
    uint16_t port = port_of(tdist__tp_address(tp));
    ASSERT_TRUE(port != 0);
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    ASSERT_TRUE(pid >= 0);
    if (pid == 0) {
        tdist__tp_destroy(tp); /* the child's copy of the fds */
        exit(handshake_child(port, secret));
    }
    /* Rank 0 only accepts, so these addresses are never dialled. */
    const char *addrs[3] = {NULL, "127.0.0.1:9", "127.0.0.1:9"};
    int64_t t0 = tdist__now_ms();
    tdist_status_t st = tdist__tp_connect(tp, addrs, t0 + (int64_t)(1000 * tdist_test_timeout_mult()));
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        FAIL("handshake child failed at step %d (status 0x%x)", WEXITSTATUS(status), status);
    /* Rank 1's channel came up (from the child); rank 2 never came. */
    ASSERT_STATUS(st, TDIST_ERR_TIMEOUT);
    ASSERT_CONTAINS(tdist_last_error(), "rank 0: transport set-up timed out");
    ASSERT_CONTAINS(tdist_last_error(), "peer rank 2 (127.0.0.1:9)");
    if (strstr(tdist_last_error(), "peer rank 1"))
        FAIL("rank 1 reported missing: %s", tdist_last_error());
    /* Sticky: later calls fail at once. */
    tdist__tp_req_t req;
    char b = 0;
    ASSERT_STATUS(tdist__tp_post_send(tp, &req, 1, &b, 1), TDIST_ERR_TIMEOUT);
    tdist__tp_destroy(tp);
    ASSERT_EQ(tdist_test_count_fds(), fds_before);
}

/* Stray connections to a real rank's listener do not break set-up. */
static void stray_body(int rank, int n, void *arg)
{
    (void)arg;
    tp_rank_t t;
    tp_open(&t, rank, n, "127.0.0.1", TAG);
    int silent = -1;
    if (rank == 1) {
        uint16_t port = port_of(t.addrs[0]);
        uint8_t f[FRAME], reply[FRAME];
        memset(f, 0x11, sizeof f);
        ASSERT_EQ(raw_try(port, f, FRAME, reply, NULL), 0);
        frame(f, MAGIC, 1, TAG + 1, 2, 1, 0); /* a stale job's tag */
        ASSERT_EQ(raw_try(port, f, FRAME, reply, NULL), 0);
        silent = raw_connect(port);
        ASSERT_TRUE(silent >= 0);
    }
    tp_connect(&t);
    uint8_t s[4096], r[4096];
    mesh_fill(s, sizeof s, rank, 1 - rank, 9);
    ASSERT_OK(tdist__tp_sendrecv(t.tp, 1 - rank, s, sizeof s, 1 - rank, r, sizeof r,
                                 deadline_in(10000)));
    mesh_check(r, sizeof r, 1 - rank, rank, 9);
    if (silent >= 0) close(silent);
    store_barrier(&t, "stray-done");
    tp_close(&t);
}

TEST(transport_tcp_stray_connections_do_not_break_setup, 30)
{
    tdist_test_run_ranks(2, stray_body, NULL);
}

/* ------------------------------------------- set-up deadline, missing peer */

#define SETUP_MS 1000

static void missing_body(int rank, int n, void *arg)
{
    int missing = *(const int *)arg;
    tp_rank_t t;
    tp_open(&t, rank, n, "127.0.0.1", TAG);
    if (rank == missing) {
        /* Listens and publishes, but never calls connect. */
        store_barrier(&t, "missing-done");
        tp_close(&t);
        return;
    }
    double t0 = tdist_test_now_ms();
    tdist_status_t st = tdist__tp_connect(t.tp, t.ap, tdist__now_ms() + SETUP_MS);
    double took = tdist_test_now_ms() - t0;
    ASSERT_STATUS(st, TDIST_ERR_TIMEOUT);
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", tdist_last_error());
    char want[160];
    snprintf(want, sizeof want, "peer rank %d (%s): %s", missing, t.addrs[missing],
             missing < rank ? "connected, but no handshake reply yet"
                            : "it has not connected to this rank");
    ASSERT_CONTAINS(msg, want);
    for (int r = 0; r < n; r++) {
        snprintf(want, sizeof want, "peer rank %d", r);
        if (r != missing && strstr(msg, want))
            FAIL("rank %d names a peer that did connect: %s", rank, msg);
    }
    ASSERT_GE(took, SETUP_MS - 5);
    ASSERT_LE(took, SETUP_MS + 1000 * tdist_test_timeout_mult());
    printf("rank %d: %s (after %.0f ms)\n", rank, msg, took);
    store_barrier(&t, "missing-done");
    tp_close(&t);
}

TEST(transport_tcp_setup_deadline_names_missing_peers, 30)
{
    int missing = 2; /* it would connect to the others */
    tdist_test_run_ranks(3, missing_body, &missing);
}

TEST(transport_tcp_setup_deadline_names_missing_rank_0, 30)
{
    int missing = 0; /* the others connect to it; it never answers */
    tdist_test_run_ranks(3, missing_body, &missing);
}

/* A peer that finished and left is not an error until a request needs it. */
static void departed_body(int rank, int n, void *arg)
{
    (void)arg;
    tp_rank_t t;
    tp_open(&t, rank, n, "127.0.0.1", TAG);
    tp_connect(&t);
    uint8_t s[MAXR][64], r[MAXR][64];
    tdist__tp_req_t reqs[2 * MAXR], *rp[2 * MAXR];
    int k = 0;
    for (int p = 0; p < n; p++) {
        if (p == rank) continue;
        mesh_fill(s[p], 64, rank, p, 1);
        ASSERT_OK(tdist__tp_post_send(t.tp, &reqs[k], p, s[p], 64));
        rp[k] = &reqs[k];
        k++;
        ASSERT_OK(tdist__tp_post_recv(t.tp, &reqs[k], p, r[p], 64));
        rp[k] = &reqs[k];
        k++;
    }
    ASSERT_OK(tdist__tp_wait(t.tp, rp, (size_t)k, deadline_in(10000)));
    for (int p = 0; p < n; p++)
        if (p != rank) mesh_check(r[p], 64, p, rank, 1);
    if (rank == 2) {
        tdist__tp_destroy(t.tp); /* leaves; then tells the others */
        t.tp = NULL;
        store_barrier(&t, "left");
        tp_close(&t);
        return;
    }
    store_barrier(&t, "left");
    /* Ranks 0 and 1 go on; progress sees rank 2's channel close. */
    ASSERT_OK(tdist__tp_progress(t.tp, 100));
    ASSERT_OK(tdist__tp_progress(t.tp, 100));
    int other = 1 - rank;
    mesh_fill(s[other], 64, rank, other, 2);
    ASSERT_OK(tdist__tp_sendrecv(t.tp, other, s[other], 64, other, r[other], 64,
                                 deadline_in(10000)));
    mesh_check(r[other], 64, other, rank, 2);
    /* Now one of them needs rank 2: a send (rank 0) or a receive (rank 1). */
    char want[160];
    snprintf(want, sizeof want, "rank %d: peer rank 2 (%s) closed the connection", rank,
             t.addrs[2]);
    tdist_status_t st = rank == 0 ? tdist__tp_send(t.tp, 2, s[0], 64, deadline_in(10000))
                                  : tdist__tp_recv(t.tp, 2, r[0], 64, deadline_in(10000));
    ASSERT_STATUS(st, TDIST_ERR_CONNECTION);
    ASSERT_CONTAINS(tdist_last_error(), want);
    tp_close(&t);
}

TEST(transport_tcp_departed_peer_fails_only_when_needed, 30)
{
    tdist_test_run_ranks(3, departed_body, NULL);
}

/* ------------------------------------------------ peers that die or stop */

typedef struct death {
    atomic_int waiting;   /* survivors blocked in wait */
    double died_ms;       /* when the victim went (tdist_test_now_ms) */
    double latency[MAXR]; /* survivor's error time - died_ms */
    int pid[MAXR];
    atomic_int stopping;
    atomic_int failed;    /* survivors whose wait has returned */
} death_t;

#define DEATH_BYTES (4u << 20)
static tdist__tp_t *g_keep_tp;       /* the exiting victim's, for LSan */
static tdist_world_t *g_keep_world;
static void *g_keep_bufs[2 * MAXR];

enum { DIE_KILL, DIE_EXIT };

typedef struct death_arg {
    death_t *d;
    int victim;
    int how;
} death_arg_t;

static void death_body(int rank, int n, void *argp)
{
    death_arg_t *a = argp;
    death_t *d = a->d;
    tp_rank_t t;
    tp_open(&t, rank, n, "127.0.0.1", TAG);
    tp_connect(&t);
    if (rank == a->victim) {
        /* Send half of every message, wait until the survivors are
         * blocked, then die mid-transfer. */
        tdist__tp_req_t *reqs = calloc((size_t)n, sizeof *reqs);
        tdist__tp_req_t **rp = calloc((size_t)n, sizeof *rp);
        uint8_t *b = malloc(DEATH_BYTES / 2);
        ASSERT_TRUE(reqs && rp && b);
        g_keep_bufs[0] = reqs;
        g_keep_bufs[1] = rp;
        g_keep_bufs[2] = b;
        mesh_fill(b, DEATH_BYTES / 2, rank, 0, 0);
        int k = 0;
        for (int p = 0; p < n; p++) {
            if (p == rank) continue;
            ASSERT_OK(tdist__tp_post_send(t.tp, &reqs[k], p, b, DEATH_BYTES / 2));
            rp[k] = &reqs[k];
            k++;
        }
        for (int i = 0; i < 20000 && atomic_load(&d->waiting) < n - 1; i++) tdist__sleep_ms(1);
        ASSERT_OK(tdist__tp_wait(t.tp, rp, (size_t)k, deadline_in(10000)));
        tdist__sleep_ms(100); /* the survivors are asleep in poll */
        g_keep_tp = t.tp;
        g_keep_world = t.w;
        fflush(stdout);
        if (a->how != DIE_KILL) tdist_test_leak_check_now(); /* not inside the timed exit */
        d->died_ms = tdist_test_now_ms();
        if (a->how == DIE_KILL) raise(SIGKILL);
        exit(0);
    }
    /* Survivors: a full exchange with everyone, the victim included. */
    int nreq = 2 * (n - 1), k = 0;
    tdist__tp_req_t *reqs = calloc((size_t)nreq, sizeof *reqs);
    tdist__tp_req_t **rp = calloc((size_t)nreq, sizeof *rp);
    uint8_t **bufs = calloc((size_t)nreq, sizeof *bufs);
    ASSERT_TRUE(reqs && rp && bufs);
    for (int p = 0; p < n; p++) {
        if (p == rank) continue;
        bufs[k] = malloc(DEATH_BYTES);
        ASSERT_TRUE(bufs[k] != NULL);
        mesh_fill(bufs[k], DEATH_BYTES, rank, p, 0);
        ASSERT_OK(tdist__tp_post_send(t.tp, &reqs[k], p, bufs[k], DEATH_BYTES));
        rp[k] = &reqs[k];
        k++;
        bufs[k] = malloc(DEATH_BYTES);
        ASSERT_TRUE(bufs[k] != NULL);
        ASSERT_OK(tdist__tp_post_recv(t.tp, &reqs[k], p, bufs[k], DEATH_BYTES));
        rp[k] = &reqs[k];
        k++;
    }
    atomic_fetch_add(&d->waiting, 1);
    tdist_status_t st = tdist__tp_wait(t.tp, rp, (size_t)nreq, deadline_in(15000));
    double seen = tdist_test_now_ms();
    atomic_fetch_add(&d->failed, 1);
    ASSERT_STATUS(st, TDIST_ERR_CONNECTION);
    char want[160];
    snprintf(want, sizeof want, "rank %d: peer rank %d (%s) closed the connection", rank,
             a->victim, t.addrs[a->victim]);
    ASSERT_CONTAINS(tdist_last_error(), want);
    ASSERT_TRUE(d->died_ms > 0);
    d->latency[rank] = seen - d->died_ms;
    printf("rank %d: %.1f ms after the victim %s: %s\n", rank, d->latency[rank],
           a->how == DIE_KILL ? "was killed" : "exited", tdist_last_error());
    ASSERT_LE(d->latency[rank], 1000);
    /* Every request has finished with the error; later posts fail at once. */
    for (int i = 0; i < nreq; i++) {
        ASSERT_TRUE(tdist__tp_req_done(&reqs[i]));
        tdist_status_t rs = tdist__tp_req_status(&reqs[i]);
        if (rs != TDIST_OK) ASSERT_STATUS(rs, TDIST_ERR_CONNECTION);
    }
    tdist__tp_req_t late;
    ASSERT_STATUS(tdist__tp_post_recv(t.tp, &late, (rank + 1) % n == a->victim ? (rank + 2) % n
                                                                                : (rank + 1) % n,
                                      bufs[0], 1),
                  TDIST_ERR_CONNECTION);
    ASSERT_CONTAINS(tdist_last_error(), want);
    ASSERT_STATUS(tdist__tp_progress(t.tp, 10), TDIST_ERR_CONNECTION);
    for (int i = 0; i < nreq; i++) free(bufs[i]);
    free(bufs);
    free(reqs);
    free(rp);
    /* Leave only once every survivor has seen the death: a survivor that
     * closes its transport earlier is one more lost peer for a survivor
     * still waiting, which may then rightly name it instead of the victim. */
    for (int i = 0; i < 20000 && atomic_load(&d->failed) < n - 1; i++) tdist__sleep_ms(1);
    tp_close(&t);
}

static void run_death(int n, int victim, int how)
{
    death_t *d = shared_alloc(sizeof *d);
    death_arg_t a = {d, victim, how};
    tdist_ranks_opts_t o;
    tdist_ranks_opts_init(&o, n);
    o.kill_others_after_ms = -1; /* the victim's end is expected */
    tdist_rank_result_t res[MAXR];
    tdist_test_spawn_ranks(&o, death_body, &a, res);
    char buf[128];
    for (int r = 0; r < n; r++) {
        if (r == victim) {
            if (how == DIE_KILL && !(res[r].signaled && res[r].sig == SIGKILL))
                FAIL("victim rank %d: %s", r, tdist_test_describe(&res[r], buf, sizeof buf));
            if (how == DIE_EXIT && !(res[r].exited && res[r].code == 0))
                FAIL("victim rank %d: %s", r, tdist_test_describe(&res[r], buf, sizeof buf));
            continue;
        }
        if (!(res[r].exited && res[r].code == 0))
            FAIL("survivor rank %d: %s", r, tdist_test_describe(&res[r], buf, sizeof buf));
        printf("%s: rank %d failed %.1f ms after the victim's end\n",
               how == DIE_KILL ? "SIGKILL" : "exit(0)", r, d->latency[r]);
    }
    munmap(d, sizeof *d);
}

TEST(transport_tcp_peer_sigkill_fails_others_fast, 40) { run_death(4, 2, DIE_KILL); }
TEST(transport_tcp_peer_exit0_fails_others_fast, 40) { run_death(3, 1, DIE_EXIT); }

#define STOP_MS 1500
#define STOP_BYTES ((1u << 20) + 3)

/* Whether process pid is stopped (state T in /proc/pid/stat). */
static bool is_stopped(int pid)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f) return false;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')');
    return p && p[1] == ' ' && (p[2] == 'T' || p[2] == 't');
}

static void stop_body(int rank, int n, void *arg)
{
    death_t *d = arg;
    tp_rank_t t;
    tp_open(&t, rank, n, "127.0.0.1", TAG);
    tp_connect(&t);
    uint8_t *b = malloc(STOP_BYTES);
    ASSERT_TRUE(b != NULL);
    if (rank == 1) {
        d->pid[1] = getpid();
        atomic_store(&d->stopping, 1);
        raise(SIGSTOP); /* rank 0 continues us after its deadline */
        mesh_fill(b, STOP_BYTES, 1, 0, 3);
        ASSERT_OK(tdist__tp_send(t.tp, 0, b, STOP_BYTES, deadline_in(10000)));
        char c = 0;
        ASSERT_OK(tdist__tp_recv(t.tp, 0, &c, 1, deadline_in(10000)));
        ASSERT_EQ(c, 'k');
    } else {
        tdist__tp_req_t req, *rp = &req;
        ASSERT_OK(tdist__tp_post_recv(t.tp, &req, 1, b, STOP_BYTES));
        double t0 = tdist_test_now_ms();
        tdist_status_t st = tdist__tp_wait(t.tp, &rp, 1, tdist__now_ms() + STOP_MS);
        double took = tdist_test_now_ms() - t0;
        ASSERT_STATUS(st, TDIST_ERR_TIMEOUT);
        printf("rank 0: %s (after %.0f ms)\n", tdist_last_error(), took);
        char want[160];
        snprintf(want, sizeof want, "receive from peer rank 1 (%s) 0/%u bytes", t.addrs[1],
                 STOP_BYTES);
        ASSERT_CONTAINS(tdist_last_error(), want);
        ASSERT_GE(took, STOP_MS - 5);
        ASSERT_LE(took, STOP_MS + 1000 * tdist_test_timeout_mult());
        ASSERT_FALSE(tdist__tp_req_done(&req));
        ASSERT_STATUS(tdist__tp_req_status(&req), TDIST_INPROGRESS);
        /* Continue the stopped peer: the request stayed posted and
         * completes now. */
        for (int i = 0; i < 5000 && !(atomic_load(&d->stopping) && is_stopped(d->pid[1])); i++)
            tdist__sleep_ms(1);
        ASSERT_TRUE(is_stopped(d->pid[1]));
        ASSERT_EQ(kill(d->pid[1], SIGCONT), 0);
        ASSERT_OK(tdist__tp_wait(t.tp, &rp, 1, deadline_in(10000)));
        mesh_check(b, STOP_BYTES, 1, 0, 3);
        char c = 'k';
        ASSERT_OK(tdist__tp_send(t.tp, 1, &c, 1, deadline_in(10000)));
    }
    free(b);
    store_barrier(&t, "stop-done");
    tp_close(&t);
}

TEST(transport_tcp_stopped_peer_times_out_at_deadline, 30)
{
    death_t *d = shared_alloc(sizeof *d);
    tdist_test_run_ranks(2, stop_body, d);
    munmap(d, sizeof *d);
}

/* ---------------------------------------------------------------- abort */

typedef struct aborter {
    tdist__tp_t *tp;
    double at;
} aborter_t;

static void *abort_later(void *p)
{
    aborter_t *a = p;
    tdist__sleep_ms(300);
    a->at = tdist_test_now_ms();
    tdist__tp_abort(a->tp);
    tdist__tp_abort(a->tp); /* idempotent */
    return NULL;
}

static void abort_body(int rank, int n, void *arg)
{
    (void)arg;
    tp_rank_t t;
    tp_open(&t, rank, n, "127.0.0.1", TAG);
    tp_connect(&t);
    char buf[16];
    tdist__tp_req_t req, *rp = &req;
    if (rank == 0) {
        aborter_t a = {t.tp, 0};
        pthread_t th;
        ASSERT_OK(tdist__tp_post_recv(t.tp, &req, 1, buf, sizeof buf)); /* never sent */
        ASSERT_EQ(pthread_create(&th, NULL, abort_later, &a), 0);
        tdist_status_t st = tdist__tp_wait(t.tp, &rp, 1, deadline_in(10000));
        double woke = tdist_test_now_ms();
        ASSERT_EQ(pthread_join(th, NULL), 0);
        ASSERT_STATUS(st, TDIST_ERR_ABORTED);
        ASSERT_CONTAINS(tdist_last_error(), "rank 0: transport aborted");
        printf("rank 0: wait woke %.2f ms after tdist__tp_abort\n", woke - a.at);
        ASSERT_TRUE(a.at > 0);
        ASSERT_LE(woke - a.at, 100);
        ASSERT_TRUE(tdist__tp_req_done(&req));
        ASSERT_STATUS(tdist__tp_req_status(&req), TDIST_ERR_ABORTED);
        ASSERT_STATUS(tdist__tp_post_send(t.tp, &req, 1, buf, 1), TDIST_ERR_ABORTED);
        ASSERT_STATUS(tdist__tp_progress(t.tp, 0), TDIST_ERR_ABORTED);
        ASSERT_STATUS(tdist__tp_send(t.tp, 1, buf, 1, deadline_in(1000)), TDIST_ERR_ABORTED);
        tdist__tp_destroy(t.tp); /* closes rank 1's channel */
        t.tp = NULL;
    } else {
        /* Rank 0 closes its end without sending: a receive that is owed
         * bytes fails naming it. */
        ASSERT_OK(tdist__tp_post_recv(t.tp, &req, 0, buf, 1));
        ASSERT_STATUS(tdist__tp_wait(t.tp, &rp, 1, deadline_in(10000)), TDIST_ERR_CONNECTION);
        char want[160];
        snprintf(want, sizeof want, "rank 1: peer rank 0 (%s) closed the connection", t.addrs[0]);
        ASSERT_CONTAINS(tdist_last_error(), want);
    }
    tp_close(&t);
}

TEST(transport_tcp_abort_wakes_blocked_wait, 30) { tdist_test_run_ranks(2, abort_body, NULL); }

/* ------------------------------------------------- fds, arguments, IPv6 */

TEST(transport_tcp_no_fd_leak_on_any_path, 30)
{
    int before = tdist_test_count_fds();
    tdist__tp_opts_t o = {.bind_addr = "127.0.0.1", .tag = TAG};
    tdist__tp_t *tp = NULL;
    /* listen, destroy */
    ASSERT_OK(tdist__tp_listen(TDIST__TP_TCP, 0, 4, &o, &tp));
    ASSERT_TRUE(tdist_test_count_fds() > before);
    tdist__tp_destroy(tp);
    ASSERT_EQ(tdist_test_count_fds(), before);
    /* world of one: connect, destroy */
    ASSERT_OK(tdist__tp_listen(TDIST__TP_TCP, 0, 1, &o, &tp));
    const char *self[1] = {NULL};
    ASSERT_OK(tdist__tp_connect(tp, self, tdist__now_ms() + 1000));
    ASSERT_OK(tdist__tp_wait(tp, NULL, 0, tdist__now_ms()));
    tdist__tp_destroy(tp);
    ASSERT_EQ(tdist_test_count_fds(), before);
    /* rank 1 of 2 dials a port nobody listens on: refused, retried until
     * the deadline, which names the peer and why. */
    int probe = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t sl = sizeof a;
    ASSERT_EQ(bind(probe, (struct sockaddr *)&a, sl), 0);
    ASSERT_EQ(getsockname(probe, (struct sockaddr *)&a, &sl), 0);
    char dead[64];
    snprintf(dead, sizeof dead, "127.0.0.1:%u", (unsigned)ntohs(a.sin_port));
    close(probe);
    ASSERT_OK(tdist__tp_listen(TDIST__TP_TCP, 1, 2, &o, &tp));
    const char *addrs[2] = {dead, NULL};
    int64_t t0 = tdist__now_ms();
    ASSERT_STATUS(tdist__tp_connect(tp, addrs, t0 + 400), TDIST_ERR_TIMEOUT);
    ASSERT_GE(tdist__now_ms() - t0, 400);
    ASSERT_CONTAINS(tdist_last_error(), "peer rank 0");
    ASSERT_CONTAINS(tdist_last_error(), dead);
    ASSERT_CONTAINS(tdist_last_error(), "refused");
    tdist__tp_destroy(tp);
    ASSERT_EQ(tdist_test_count_fds(), before);
    /* abort during set-up */
    ASSERT_OK(tdist__tp_listen(TDIST__TP_TCP, 0, 2, &o, &tp));
    tdist__tp_abort(tp);
    const char *addrs2[2] = {NULL, dead};
    ASSERT_STATUS(tdist__tp_connect(tp, addrs2, deadline_in(5000)), TDIST_ERR_ABORTED);
    tdist__tp_destroy(tp);
    ASSERT_EQ(tdist_test_count_fds(), before);
    tdist__tp_destroy(NULL);
}

TEST(transport_tcp_rejects_bad_arguments, 10)
{
    tdist__tp_opts_t o = {.bind_addr = "127.0.0.1", .tag = TAG};
    tdist__tp_t *tp = NULL;
    ASSERT_STATUS(tdist__tp_listen(TDIST__TP_TCP, 0, 2, &o, NULL), TDIST_ERR_INVALID_ARG);
    ASSERT_STATUS(tdist__tp_listen(TDIST__TP_TCP, 0, 2, NULL, &tp), TDIST_ERR_INVALID_ARG);
    ASSERT_STATUS(tdist__tp_listen(TDIST__TP_TCP, 2, 2, &o, &tp), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "rank 2 of size 2");
    ASSERT_STATUS(tdist__tp_listen(TDIST__TP_TCP, -1, 2, &o, &tp), TDIST_ERR_INVALID_ARG);
    ASSERT_STATUS(tdist__tp_listen(TDIST__TP_TCP, 0, 0, &o, &tp), TDIST_ERR_INVALID_ARG);
    ASSERT_STATUS(tdist__tp_listen((tdist__tp_kind_t)7, 0, 2, &o, &tp), TDIST_ERR_NOT_SUPPORTED);
    tdist__tp_opts_t bad = {.bind_addr = "localhost", .tag = TAG};
    ASSERT_STATUS(tdist__tp_listen(TDIST__TP_TCP, 0, 2, &bad, &tp), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "\"localhost\" is not a numeric");
    ASSERT_TRUE(tp == NULL);
    ASSERT_TRUE(tdist__tp_address(NULL) == NULL);

    ASSERT_OK(tdist__tp_listen(TDIST__TP_TCP, 0, 2, &o, &tp));
    ASSERT_TRUE(strncmp(tdist__tp_address(tp), "127.0.0.1:", 10) == 0);
    tdist__tp_req_t req;
    char b[4] = {0};
    /* not connected yet */
    ASSERT_STATUS(tdist__tp_post_send(tp, &req, 1, b, 1), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "not connected");
    ASSERT_STATUS(tdist__tp_progress(tp, 0), TDIST_ERR_INVALID_ARG);
    /* bad peers, buffers, requests */
    ASSERT_STATUS(tdist__tp_post_send(tp, &req, 0, b, 1), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "peer 0 is not another rank");
    ASSERT_STATUS(tdist__tp_post_recv(tp, &req, 2, b, 1), TDIST_ERR_INVALID_ARG);
    ASSERT_STATUS(tdist__tp_post_recv(tp, &req, -1, b, 1), TDIST_ERR_INVALID_ARG);
    ASSERT_STATUS(tdist__tp_post_recv(tp, NULL, 1, b, 1), TDIST_ERR_INVALID_ARG);
    ASSERT_STATUS(tdist__tp_post_recv(tp, &req, 1, NULL, 1), TDIST_ERR_INVALID_ARG);
    ASSERT_STATUS(tdist__tp_post_recv(NULL, &req, 1, b, 1), TDIST_ERR_INVALID_ARG);
    ASSERT_STATUS(tdist__tp_wait(NULL, NULL, 0, 0), TDIST_ERR_INVALID_ARG);
    tdist__tp_req_t *nullreq = NULL;
    ASSERT_STATUS(tdist__tp_wait(tp, &nullreq, 1, 0), TDIST_ERR_INVALID_ARG);
    ASSERT_STATUS(tdist__tp_req_status(NULL), TDIST_ERR_INVALID_ARG);
    ASSERT_FALSE(tdist__tp_req_done(NULL));
    /* bad addresses */
    const char *a1[2] = {"127.0.0.1:5", "nonsense"};
    const char *a2[2] = {"127.0.0.1:5", "127.0.0.1:0"};
    const char *a3[2] = {"127.0.0.1:5", "::1:5"};
    const char *a4[2] = {"127.0.0.1:5", NULL};
    ASSERT_STATUS(tdist__tp_connect(tp, NULL, 0), TDIST_ERR_INVALID_ARG);
    ASSERT_STATUS(tdist__tp_connect(tp, (const char *const *)a4, 0), TDIST_ERR_INVALID_ARG);
    ASSERT_STATUS(tdist__tp_connect(tp, (const char *const *)a1, 0), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "address of peer rank 1 \"nonsense\"");
    ASSERT_STATUS(tdist__tp_connect(tp, (const char *const *)a2, 0), TDIST_ERR_INVALID_ARG);
    ASSERT_STATUS(tdist__tp_connect(tp, (const char *const *)a3, 0), TDIST_ERR_INVALID_ARG);
    ASSERT_STATUS(tdist__tp_connect(NULL, (const char *const *)a2, 0), TDIST_ERR_INVALID_ARG);
    tdist__tp_abort(NULL);
    tdist__tp_destroy(tp);
}

/* ---------------------------------------------------------------- IPv6 */

static bool ipv6_loopback_works(void)
{
    int fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return false;
    struct sockaddr_in6 a = {.sin6_family = AF_INET6, .sin6_addr = IN6ADDR_LOOPBACK_INIT};
    bool ok = bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
    close(fd);
    return ok;
}

static void ipv6_body(int rank, int n, void *arg)
{
    (void)arg;
    tp_rank_t t;
    tp_open(&t, rank, n, "::1", TAG);
    for (int r = 0; r < n; r++)
        if (strncmp(t.addrs[r], "[::1]:", 6) != 0) FAIL("rank %d published \"%s\"", r, t.addrs[r]);
    tp_connect(&t);
    size_t len = (1u << 20) + 3;
    uint8_t *s = malloc(len), *r = malloc(len);
    ASSERT_TRUE(s && r);
    int right = (rank + 1) % n, left = (rank - 1 + n) % n;
    mesh_fill(s, len, rank, right, 4);
    ASSERT_OK(tdist__tp_sendrecv(t.tp, right, s, len, left, r, len, deadline_in(10000)));
    mesh_check(r, len, left, rank, 4);
    free(s);
    free(r);
    store_barrier(&t, "v6-done");
    tp_close(&t);
}

TEST(transport_tcp_ipv6_loopback, 30)
{
    if (!ipv6_loopback_works()) {
        SKIP("::1 is not available on this host");
    }
    tdist_test_run_ranks(3, ipv6_body, NULL);
}
