/*
 * core/auth.h — what the store and the transport need to authenticate a
 * job's processes to each other: SHA-256 and HMAC-SHA256 (FIPS 180-4,
 * RFC 2104), fresh random nonces, a comparison whose time does not depend
 * on the bytes, and the job's secret from the environment.
 *
 * The proof a side gives is HMAC-SHA256(secret, label | challenge...): the
 * secret itself never leaves the process. Everything here is pure or
 * thread-safe as noted; nothing allocates.
 */
#ifndef TDIST_CORE_AUTH_H
#define TDIST_CORE_AUTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TDIST_SHA256_LEN 32u
#define TDIST_NONCE_LEN 32u
/* Longest secret accepted (bytes, without the terminator). */
#define TDIST_SECRET_MAX 1024u

typedef struct tdist__sha256 {
    uint32_t h[8];
    uint64_t bytes;     /* message length so far */
    uint8_t buf[64];
    size_t buf_len;
} tdist__sha256_t;

void tdist__sha256_init(tdist__sha256_t *c);
void tdist__sha256_update(tdist__sha256_t *c, const void *data, size_t len);
void tdist__sha256_final(tdist__sha256_t *c, uint8_t out[TDIST_SHA256_LEN]);
/* One-shot digest of len bytes. */
void tdist__sha256(const void *data, size_t len, uint8_t out[TDIST_SHA256_LEN]);

/* HMAC-SHA256 over the concatenation of n parts (parts[i], lens[i]),
 * keyed with key/klen (any length). Pure; thread-safe. */
void tdist__hmac_sha256(const void *key, size_t klen, const void *const *parts,
                        const size_t *lens, size_t n, uint8_t out[TDIST_SHA256_LEN]);

/* Fill buf with len bytes from the kernel's random source (getrandom).
 * 0 on success, -1 (errno set) if the kernel gives none. Thread-safe. */
int tdist__random_bytes(void *buf, size_t len);

/* Whether a[0..len) equals b[0..len), in time that depends only on len. */
bool tdist__const_time_eq(const void *a, const void *b, size_t len);

/* The job's secret from the environment: TDIST_JOB_SECRET, else (the older
 * name) TDIST_STORE_TOKEN; NULL when neither is set or it is empty.
 * Points into the environment: read it once, copy what you keep. */
const char *tdist__env_job_secret(void);

#endif /* TDIST_CORE_AUTH_H */
