/*
 * core/auth.c — SHA-256 (FIPS 180-4), HMAC-SHA256 (RFC 2104), nonces and
 * the job secret. Plain portable C: the messages hashed here are handshake
 * challenges of a few dozen bytes, so speed does not matter.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "core/auth.h"

static const uint32_t K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

static uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

/* Process one 64-byte block. */
static void compress(uint32_t h[8], const uint8_t *p)
{
    uint32_t w[64];
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 |
               (uint32_t)p[4 * i + 2] << 8 | (uint32_t)p[4 * i + 3];
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], k = h[7];
    for (int i = 0; i < 64; i++) {
        uint32_t t1 = k + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + K[i] + w[i];
        uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        k = g;
        g = f;
        f = e;
        e = d + t1;
        d = c;
        c = b;
        b = a;
        a = t1 + t2;
    }
    h[0] += a;
    h[1] += b;
    h[2] += c;
    h[3] += d;
    h[4] += e;
    h[5] += f;
    h[6] += g;
    h[7] += k;
}

void tdist__sha256_init(tdist__sha256_t *c)
{
    static const uint32_t init[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                     0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(c->h, init, sizeof init);
    c->bytes = 0;
    c->buf_len = 0;
}

void tdist__sha256_update(tdist__sha256_t *c, const void *data, size_t len)
{
    const uint8_t *p = data;
    c->bytes += len;
    while (len > 0) {
        if (c->buf_len == 0 && len >= 64) {
            compress(c->h, p);
            p += 64;
            len -= 64;
            continue;
        }
        size_t take = 64 - c->buf_len < len ? 64 - c->buf_len : len;
        memcpy(c->buf + c->buf_len, p, take);
        c->buf_len += take;
        p += take;
        len -= take;
        if (c->buf_len == 64) {
            compress(c->h, c->buf);
            c->buf_len = 0;
        }
    }
}

void tdist__sha256_final(tdist__sha256_t *c, uint8_t out[TDIST_SHA256_LEN])
{
    uint64_t bits = c->bytes * 8u;
    uint8_t pad[72] = {0x80};
    size_t padlen = c->buf_len < 56 ? 56 - c->buf_len : 120 - c->buf_len;
    for (int i = 0; i < 8; i++) pad[padlen + (size_t)i] = (uint8_t)(bits >> (56 - 8 * i));
    tdist__sha256_update(c, pad, padlen + 8);
    for (int i = 0; i < 8; i++) {
        out[4 * i] = (uint8_t)(c->h[i] >> 24);
        out[4 * i + 1] = (uint8_t)(c->h[i] >> 16);
        out[4 * i + 2] = (uint8_t)(c->h[i] >> 8);
        out[4 * i + 3] = (uint8_t)c->h[i];
    }
    memset(c, 0, sizeof *c);
}

void tdist__sha256(const void *data, size_t len, uint8_t out[TDIST_SHA256_LEN])
{
    tdist__sha256_t c;
    tdist__sha256_init(&c);
    tdist__sha256_update(&c, data, len);
    tdist__sha256_final(&c, out);
}

void tdist__hmac_sha256(const void *key, size_t klen, const void *const *parts,
                        const size_t *lens, size_t n, uint8_t out[TDIST_SHA256_LEN])
{
    uint8_t k[64] = {0}, pad[64], inner[TDIST_SHA256_LEN];
    if (klen > 64)
        tdist__sha256(key, klen, k);
    else if (klen > 0)
        memcpy(k, key, klen);
    tdist__sha256_t c;
    for (int i = 0; i < 64; i++) pad[i] = k[i] ^ 0x36;
    tdist__sha256_init(&c);
    tdist__sha256_update(&c, pad, 64);
    for (size_t i = 0; i < n; i++) tdist__sha256_update(&c, parts[i], lens[i]);
    tdist__sha256_final(&c, inner);
    for (int i = 0; i < 64; i++) pad[i] = k[i] ^ 0x5c;
    tdist__sha256_init(&c);
    tdist__sha256_update(&c, pad, 64);
    tdist__sha256_update(&c, inner, sizeof inner);
    tdist__sha256_final(&c, out);
    memset(k, 0, sizeof k);
    memset(pad, 0, sizeof pad);
}

int tdist__random_bytes(void *buf, size_t len)
{
    uint8_t *p = buf;
    for (int tries = 0; len > 0 && tries < 64; tries++) {
        ssize_t r = getrandom(p, len, 0);
        if (r < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        p += r;
        len -= (size_t)r;
    }
    if (len > 0) {
        errno = EIO;
        return -1;
    }
    return 0;
}

bool tdist__const_time_eq(const void *a, const void *b, size_t len)
{
    const volatile uint8_t *x = a, *y = b;
    uint8_t diff = 0;
    for (size_t i = 0; i < len; i++) diff |= (uint8_t)(x[i] ^ y[i]);
    return diff == 0;
}

const char *tdist__env_job_secret(void)
{
    const char *s = getenv("TDIST_JOB_SECRET");
    if (s && *s) return s;
    s = getenv("TDIST_STORE_TOKEN");
    return s && *s ? s : NULL;
}
