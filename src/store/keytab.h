/*
 * store/keytab.h — the key table of the in-memory stores: the hash store
 * (hash_store.c) and the TCP store's server (tcp_server.c).
 *
 * A chained hash table of byte-string keys: FNV-1a hashes (core's
 * tdist__fnv1a), a power-of-two bucket array that doubles once the keys
 * outnumber the buckets. It is intrusive: each store's entry struct starts
 * with a tdist__keynode_t and owns its key bytes, which must not change
 * while the entry is in the table; the table never allocates or frees an
 * entry. What an entry holds beside its key (a value; the server's
 * waiters and "present" flag) is the store's.
 *
 * Not thread-safe: the hash store calls it under its mutex, the server
 * from its one thread. No call blocks.
 */
#ifndef TDIST_STORE_KEYTAB_H
#define TDIST_STORE_KEYTAB_H

#include <stddef.h>
#include <stdint.h>

typedef struct tdist__keynode {
    struct tdist__keynode *next; /* bucket chain (the table's) */
    uint64_t hash;               /* the table's */
    const void *key;             /* klen bytes, owned by the entry */
    size_t klen;
} tdist__keynode_t;

typedef struct tdist__keytab {
    tdist__keynode_t **buckets;
    size_t nbuckets; /* a power of two */
    size_t count;    /* entries in the table */
} tdist__keytab_t;

/* Make t an empty table with its first buckets. Returns 0, or -1 when out
 * of memory (t then holds nothing to free). */
int tdist__keytab_init(tdist__keytab_t *t);

/* Hand every entry to free_entry (which owns it from then on; may be NULL
 * when the entries live elsewhere) and free the buckets. t is empty and
 * must be initialised again before further use. */
void tdist__keytab_fini(tdist__keytab_t *t, void (*free_entry)(tdist__keynode_t *n));

/* The entry whose key is the klen bytes at key, or NULL. */
tdist__keynode_t *tdist__keytab_find(const tdist__keytab_t *t, const void *key, size_t klen);

/* Add the entry n (n->key and n->klen set; no entry with that key in t).
 * Doubles the buckets when the entries outnumber them; a failed allocation
 * there only leaves the chains longer, so adding never fails. */
void tdist__keytab_add(tdist__keytab_t *t, tdist__keynode_t *n);

/* Take the entry n, which is in t, out of t (n itself is the caller's). */
void tdist__keytab_remove(tdist__keytab_t *t, tdist__keynode_t *n);

#endif /* TDIST_STORE_KEYTAB_H */
