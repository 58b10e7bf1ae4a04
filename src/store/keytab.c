/* store/keytab.c — the in-memory stores' key table (see keytab.h). */
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "store/keytab.h"

#define INITIAL_BUCKETS 64u

static uint64_t hash_key(const void *key, size_t klen)
{
    return tdist__fnv1a(TDIST__FNV_INIT, key, klen);
}

int tdist__keytab_init(tdist__keytab_t *t)
{
    t->buckets = calloc(INITIAL_BUCKETS, sizeof *t->buckets);
    t->nbuckets = t->buckets ? INITIAL_BUCKETS : 0;
    t->count = 0;
    return t->buckets ? 0 : -1;
}

void tdist__keytab_fini(tdist__keytab_t *t, void (*free_entry)(tdist__keynode_t *n))
{
    for (size_t i = 0; i < t->nbuckets; i++) {
        tdist__keynode_t *n = t->buckets[i];
        while (n) {
            tdist__keynode_t *next = n->next;
            if (free_entry) free_entry(n);
            n = next;
        }
    }
    free(t->buckets);
    t->buckets = NULL;
    t->nbuckets = t->count = 0;
}

tdist__keynode_t *tdist__keytab_find(const tdist__keytab_t *t, const void *key, size_t klen)
{
    uint64_t h = hash_key(key, klen);
    for (tdist__keynode_t *n = t->buckets[h & (t->nbuckets - 1)]; n; n = n->next)
        if (n->hash == h && n->klen == klen && memcmp(n->key, key, klen) == 0) return n;
    return NULL;
}

/* Double the bucket array. A failed allocation is not an error: the
 * table just stays denser. */
static void grow(tdist__keytab_t *t)
{
    size_t nb = t->nbuckets * 2;
    tdist__keynode_t **b = calloc(nb, sizeof *b);
    if (!b) return;
    for (size_t i = 0; i < t->nbuckets; i++) {
        tdist__keynode_t *n = t->buckets[i];
        while (n) {
            tdist__keynode_t *next = n->next;
            n->next = b[n->hash & (nb - 1)];
            b[n->hash & (nb - 1)] = n;
            n = next;
        }
    }
    free(t->buckets);
    t->buckets = b;
    t->nbuckets = nb;
}

void tdist__keytab_add(tdist__keytab_t *t, tdist__keynode_t *n)
{
    if (t->count >= t->nbuckets) grow(t);
    n->hash = hash_key(n->key, n->klen);
    tdist__keynode_t **head = &t->buckets[n->hash & (t->nbuckets - 1)];
    n->next = *head;
    *head = n;
    t->count++;
}

void tdist__keytab_remove(tdist__keytab_t *t, tdist__keynode_t *n)
{
    tdist__keynode_t **pp = &t->buckets[n->hash & (t->nbuckets - 1)];
    while (*pp && *pp != n) pp = &(*pp)->next;
    if (!*pp) return;
    *pp = n->next;
    t->count--;
}
