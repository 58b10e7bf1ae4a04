/* tests/core/test_auth.c — SHA-256 against FIPS 180-4's examples and
 * HMAC-SHA256 against RFC 4231's test cases; nonces differ. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/auth.h"
#include "harness.h"

static void hex(const uint8_t *p, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++) snprintf(out + 2 * i, 3, "%02x", p[i]);
}

static void check_sha(const void *msg, size_t len, const char *want)
{
    uint8_t d[TDIST_SHA256_LEN];
    char h[2 * TDIST_SHA256_LEN + 1];
    tdist__sha256(msg, len, d);
    hex(d, sizeof d, h);
    ASSERT_STREQ(h, want);
}

TEST(core_sha256_fips_vectors, 30)
{
    check_sha("abc", 3, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    check_sha("", 0, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    const char *m2 = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    check_sha(m2, strlen(m2), "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    const char *m3 = "abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu";
    check_sha(m3, strlen(m3), "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
    /* one million 'a', fed in uneven pieces through the streaming API */
    tdist__sha256_t c;
    tdist__sha256_init(&c);
    char chunk[997];
    memset(chunk, 'a', sizeof chunk);
    size_t left = 1000000;
    for (size_t piece = 1; left > 0; piece = piece % 983 + 13) {
        size_t n = piece < left ? piece : left;
        tdist__sha256_update(&c, chunk, n);
        left -= n;
    }
    uint8_t d[TDIST_SHA256_LEN];
    char h[65];
    tdist__sha256_final(&c, d);
    hex(d, sizeof d, h);
    ASSERT_STREQ(h, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

static void check_hmac(const uint8_t *key, size_t klen, const char *data, size_t dlen,
                       const char *want)
{
    uint8_t d[TDIST_SHA256_LEN];
    char h[65];
    /* the data split in two parts gives the same MAC as in one */
    const void *parts[2] = {data, data + dlen / 2};
    size_t lens[2] = {dlen / 2, dlen - dlen / 2};
    tdist__hmac_sha256(key, klen, parts, lens, 2, d);
    hex(d, sizeof d, h);
    ASSERT_EQ(strncmp(h, want, strlen(want)), 0);
}

TEST(core_hmac_sha256_rfc4231_vectors, 30)
{
    uint8_t k[131];
    char data[64];
    memset(k, 0x0b, 20);
    check_hmac(k, 20, "Hi There", 8,
               "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
    check_hmac((const uint8_t *)"Jefe", 4, "what do ya want for nothing?", 28,
               "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
    memset(k, 0xaa, 20);
    memset(data, 0xdd, 50);
    check_hmac(k, 20, data, 50, "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe");
    for (int i = 0; i < 25; i++) k[i] = (uint8_t)(i + 1);
    memset(data, 0xcd, 50);
    check_hmac(k, 25, data, 50, "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b");
    memset(k, 0x0c, 20);
    check_hmac(k, 20, "Test With Truncation", 20, "a3b6167473100ee06e0c796c2955552b");
    memset(k, 0xaa, 131);
    const char *d6 = "Test Using Larger Than Block-Size Key - Hash Key First";
    check_hmac(k, 131, d6, strlen(d6),
               "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
    const char *d7 = "This is a test using a larger than block-size key and a larger than "
                     "block-size data. The key needs to be hashed before being used by the "
                     "HMAC algorithm.";
    check_hmac(k, 131, d7, strlen(d7),
               "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2");
}

TEST(core_random_nonces_differ_and_secret_env, 10)
{
    uint8_t a[TDIST_NONCE_LEN], b[TDIST_NONCE_LEN];
    ASSERT_EQ(tdist__random_bytes(a, sizeof a), 0);
    ASSERT_EQ(tdist__random_bytes(b, sizeof b), 0);
    ASSERT_TRUE(!tdist__const_time_eq(a, b, sizeof a));
    ASSERT_TRUE(tdist__const_time_eq(a, a, sizeof a));
    unsetenv("TDIST_JOB_SECRET");
    unsetenv("TDIST_STORE_TOKEN");
    ASSERT_TRUE(tdist__env_job_secret() == NULL);
    setenv("TDIST_STORE_TOKEN", "old", 1);
    ASSERT_STREQ(tdist__env_job_secret(), "old");
    setenv("TDIST_JOB_SECRET", "new", 1);
    ASSERT_STREQ(tdist__env_job_secret(), "new");
    setenv("TDIST_JOB_SECRET", "", 1);
    ASSERT_STREQ(tdist__env_job_secret(), "old");
    unsetenv("TDIST_JOB_SECRET");
    unsetenv("TDIST_STORE_TOKEN");
}
