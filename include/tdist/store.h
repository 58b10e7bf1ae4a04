/*
 * tdist/store.h — the key-value store that ranks use to find each other.
 *
 * One API over four implementations:
 *   - TCP: a server (one epoll event loop on its own thread) and clients;
 *   - file: a file on a shared file system, safe across processes;
 *   - hash: in-process, for threads of one process;
 *   - prefix: a view of another store with every key prefixed.
 *
 * Keys are non-empty strings of at most TDIST_STORE_MAX_KEY bytes; values
 * are byte strings of at most TDIST_STORE_MAX_VALUE bytes (may be empty).
 *
 * Values returned by the store are allocated with malloc(); the caller owns
 * them and releases them with free().
 *
 * Thread safety: a tdist_store_t may be used by several threads at once
 * (calls on one TCP client are serialised internally, so a thread blocked
 * in get on a client holds up other threads' calls on that client: give
 * each waiting thread its own client). Blocking calls (get, wait, and every
 * TCP client call) wait at most the store's timeout or the timeout given
 * (a TCP client's get/wait/multi_get: plus 1 s of grace for the server's
 * own "timed out" reply), then fail with TDIST_ERR_TIMEOUT.
 */
#ifndef TDIST_STORE_H
#define TDIST_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tdist/core.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TDIST_STORE_MAX_KEY 4096u                 /* bytes, without terminator */
#define TDIST_STORE_MAX_VALUE (64u * 1024u * 1024u) /* bytes */
#define TDIST_STORE_MAX_KEYS 65536u               /* keys in one multi_get/multi_set/wait/check */
#define TDIST_STORE_DEFAULT_TIMEOUT_MS 300000      /* 5 minutes, as torch.distributed's store */

typedef struct tdist_store tdist_store_t;
typedef struct tdist_store_server tdist_store_server_t;

/* Options for stores and clients. Fill with tdist_store_opts_init(). */
typedef struct tdist_store_opts {
    /* Deadline in ms for each blocking call; < 0 waits forever (not
     * recommended). Default TDIST_STORE_DEFAULT_TIMEOUT_MS, or
     * TDIST_TIMEOUT_MS from the environment. */
    int64_t timeout_ms;
    /* TCP client: the job's secret, proved on connect by challenge-response
     * (it is never sent). NULL: TDIST_JOB_SECRET from the environment, else
     * TDIST_STORE_TOKEN, if set; "" means none. Copied. */
    const char *token;
    /* TCP client: how long to keep retrying a refused connection while
     * the server is starting. < 0: the same as timeout_ms. */
    int64_t connect_timeout_ms;
} tdist_store_opts_t;

/* Fill *opts with defaults. Reads TDIST_TIMEOUT_MS. Thread-safe. */
TDIST_API void tdist_store_opts_init(tdist_store_opts_t *opts);

/* Options for the TCP server. Fill with tdist_store_server_opts_init(). */
typedef struct tdist_store_server_opts {
    /* The job's secret clients must prove they know (challenge-response,
     * never sent). NULL: TDIST_JOB_SECRET, else TDIST_STORE_TOKEN from the
     * environment if set, else no secret; "" means none. Copied. */
    const char *token;
    /* Most authenticated clients connected at once; more are refused. */
    int max_clients;
    /* Caps enforced on every frame; default TDIST_STORE_MAX_KEY / _VALUE. */
    uint32_t max_key;
    uint32_t max_value;
    /* listen() backlog. */
    int backlog;
    /* A connection that has not completed its HELLO (version and shared
     * secret) this many ms after it was accepted is closed, so idle or
     * hostile connections cannot hold client slots. Default 30000. */
    int hello_timeout_ms;
    /* Most connections at once that have not yet authenticated; when one
     * more arrives the oldest of them is closed, so strangers cannot lock
     * clients out. Default 256. */
    int max_unauthenticated;
    /* Caps on what the store holds: bytes of keys plus values, and keys
     * with a value. A write beyond either fails with TDIST_ERR_INVALID_ARG
     * and changes nothing; the server goes on. Defaults 1 GiB and 1048576,
     * or TDIST_STORE_MAX_BYTES / TDIST_STORE_MAX_NUM_KEYS. */
    uint64_t max_total_bytes;
    uint64_t max_total_keys;
} tdist_store_server_opts_t;

/* Fill *opts with defaults (max_clients 4096, backlog 1024,
 * hello_timeout_ms 30000, max_unauthenticated 256, max_total_bytes and
 * max_total_keys from the environment or 1 GiB and 1048576). Thread-safe. */
TDIST_API void tdist_store_server_opts_init(tdist_store_server_opts_t *opts);

/* ---------------------------------------------------------------- server */

/* Start a TCP store server listening on host:port (numeric IPv4/IPv6
 * address or a name resolving to one; only that address is bound, never
 * the wildcard unless host is "0.0.0.0" or "::"). port 0 picks a free port:
 * read it with tdist_store_server_port(). The server runs its event loop on
 * a thread of its own until destroyed. Fails with TDIST_ERR_ADDR_IN_USE
 * naming host:port if the address is taken. opts may be NULL.
 * On success the caller owns *out and releases it with
 * tdist_store_server_destroy(). Does not block beyond start-up. */
TDIST_API tdist_status_t tdist_store_server_create(const char *host, uint16_t port,
                                                   const tdist_store_server_opts_t *opts,
                                                   tdist_store_server_t **out);

/* Like tdist_store_server_create, but serve on listen_fd, a socket that is
 * already bound and listening (handed over by a launcher or a test that
 * asked the kernel for a free port). The server takes ownership of
 * listen_fd on success and closes it on destroy; on failure the caller
 * still owns it. Does not block beyond start-up. */
TDIST_API tdist_status_t tdist_store_server_adopt(int listen_fd,
                                                  const tdist_store_server_opts_t *opts,
                                                  tdist_store_server_t **out);

/* The port the server listens on (0 if srv is NULL). Thread-safe. */
TDIST_API uint16_t tdist_store_server_port(const tdist_store_server_t *srv);

/* Number of clients currently connected (for tests and monitoring); 0 if
 * srv is NULL. */
TDIST_API int tdist_store_server_num_clients(const tdist_store_server_t *srv);

/* Stop the event loop, close every connection and free the server.
 * Blocks until the loop thread has exited. NULL does nothing. */
TDIST_API void tdist_store_server_destroy(tdist_store_server_t *srv);

/* ---------------------------------------------------------------- stores */

/* Connect a TCP client to host:port. Retries refused connections until
 * opts->connect_timeout_ms; client and server prove to each other that
 * they know the job's secret (opts->token) by challenge-response when the
 * server has one. Fails with TDIST_ERR_TIMEOUT / TDIST_ERR_CONNECTION
 * naming host:port, TDIST_ERR_AUTH if the secrets differ (or only one side
 * has one), or TDIST_ERR_MISMATCH if it speaks another protocol version.
 * Once connected, a call that finds the connection refused or reset fails
 * at once with TDIST_ERR_CONNECTION ("lost the store host:port"); the
 * next call tries one reconnect. Blocks. opts may be NULL.
 * The caller owns *out (tdist_store_destroy). */
TDIST_API tdist_status_t tdist_store_tcp_connect(const char *host, uint16_t port,
                                                 const tdist_store_opts_t *opts,
                                                 tdist_store_t **out);

/* Open (creating if needed) a file store at path. Several processes may
 * open the same path; every operation locks the file (flock), so they are
 * atomic across processes. Blocking calls poll the file until their
 * deadline. The file is left in place on destroy (the caller removes it).
 * The caller owns *out (tdist_store_destroy). */
TDIST_API tdist_status_t tdist_store_file_create(const char *path, const tdist_store_opts_t *opts,
                                                 tdist_store_t **out);

/* Create an in-process store for threads of one process. The caller owns
 * *out (tdist_store_destroy). */
TDIST_API tdist_status_t tdist_store_hash_create(const tdist_store_opts_t *opts, tdist_store_t **out);

/* A view of base in which every key k is stored as "<prefix>/<k>".
 * The prefix store borrows base: base must outlive it, and destroying the
 * prefix store does not destroy base. num_keys counts every key of base.
 * Its timeout (the deadline of get, multi_get and of wait without one) is
 * opts->timeout_ms, or base's at the time of creation when opts is NULL;
 * every other call runs with base's own deadline. The caller owns *out. */
TDIST_API tdist_status_t tdist_store_prefix_create(const char *prefix, tdist_store_t *base,
                                                   const tdist_store_opts_t *opts,
                                                   tdist_store_t **out);

/* Close and free a store (a TCP client closes its connection). NULL does
 * nothing. Not to be called while another thread uses the store. */
TDIST_API void tdist_store_destroy(tdist_store_t *s);

/* Bound every store call the calling thread makes from now on, on every
 * store, to end within timeout_ms of this call (a call still waiting then
 * fails with TDIST_ERR_TIMEOUT, and a TCP client reconnects on its next
 * call); timeout_ms < 0 lifts the bound (the default). For failure paths
 * that must not wait a store's whole timeout on a stopped or unreachable
 * store host: tdist bounds its own announcement of a failed collective
 * this way. Per thread; never blocks. */
TDIST_API void tdist_store_bound_thread(int64_t timeout_ms);

/* The store's default timeout for blocking calls (-1 if s is NULL), and a
 * setter. Thread-safe. */
TDIST_API int64_t tdist_store_timeout(const tdist_store_t *s);
TDIST_API tdist_status_t tdist_store_set_timeout(tdist_store_t *s, int64_t timeout_ms);

/* ------------------------------------------------------------ operations */

/* Set key to value (len bytes; value may be NULL when len is 0).
 * Wakes every waiter on key. */
TDIST_API tdist_status_t tdist_store_set(tdist_store_t *s, const char *key, const void *value,
                                         size_t len);

/* Get key's value; blocks until the key exists or the store's timeout
 * passes (TDIST_ERR_TIMEOUT naming the key). *value is malloc'd (never NULL
 * on success, even for an empty value); caller frees it. */
TDIST_API tdist_status_t tdist_store_get(tdist_store_t *s, const char *key, void **value,
                                         size_t *len);

/* Atomically add delta to the integer stored at key (a missing key counts
 * as 0; the value is kept as decimal text) and write the new value to
 * *result (may be NULL). A key holding non-numeric text is
 * TDIST_ERR_INVALID_ARG. */
TDIST_API tdist_status_t tdist_store_add(tdist_store_t *s, const char *key, int64_t delta,
                                         int64_t *result);

/* Atomically: if key is missing and expected_len is 0, or key's value
 * equals expected, set it to desired. *current receives the value after the
 * operation (desired if swapped, the existing value if not, or expected if
 * the key is missing and expected is non-empty — torch.distributed's rule);
 * malloc'd, caller frees. current/current_len may be NULL. */
TDIST_API tdist_status_t tdist_store_compare_set(tdist_store_t *s, const char *key,
                                                 const void *expected, size_t expected_len,
                                                 const void *desired, size_t desired_len,
                                                 void **current, size_t *current_len);

/* Block until every one of the n keys exists, or timeout_ms passes
 * (TDIST_ERR_TIMEOUT naming the first missing key). timeout_ms < 0 uses the
 * store's timeout. */
TDIST_API tdist_status_t tdist_store_wait(tdist_store_t *s, const char *const *keys, size_t n,
                                          int64_t timeout_ms);

/* *all_exist = whether every one of the n keys exists. Does not wait for
 * keys (a TCP call still has the store's deadline). */
TDIST_API tdist_status_t tdist_store_check(tdist_store_t *s, const char *const *keys, size_t n,
                                           bool *all_exist);

/* Delete key; *deleted (may be NULL) says whether it existed. */
TDIST_API tdist_status_t tdist_store_delete_key(tdist_store_t *s, const char *key, bool *deleted);

/* Number of keys in the store. */
TDIST_API tdist_status_t tdist_store_num_keys(tdist_store_t *s, int64_t *count);

/* Append value to key's value (creating the key if missing). Atomic. */
TDIST_API tdist_status_t tdist_store_append(tdist_store_t *s, const char *key, const void *value,
                                            size_t len);

/* Get n keys at once; blocks until all exist or the store's timeout
 * passes. On success values[i] (malloc'd, caller frees each) and lens[i]
 * hold key i's value. On failure nothing is written. */
TDIST_API tdist_status_t tdist_store_multi_get(tdist_store_t *s, const char *const *keys, size_t n,
                                               void **values, size_t *lens);

/* Set n keys at once (atomically with respect to other calls). */
TDIST_API tdist_status_t tdist_store_multi_set(tdist_store_t *s, const char *const *keys,
                                               const void *const *values, const size_t *lens,
                                               size_t n);

#ifdef __cplusplus
}
#endif
#endif /* TDIST_STORE_H */
