/* tests/harness/tbuf.c — a small per-process pool of large test buffers. */
#include "tbuf.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include "harness.h"

#ifdef TDIST_TEST_ASAN
#include <sanitizer/asan_interface.h>
#define POISON(p, n)   ASAN_POISON_MEMORY_REGION((p), (n))
#define UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION((p), (n))
#else
#define POISON(p, n)   ((void)(p), (void)(n))
#define UNPOISON(p, n) ((void)(p), (void)(n))
#endif

/* Smaller blocks come from the allocator's size classes, which reuse
 * memory already: plain malloc. */
#define TBUF_MIN   (64u * 1024u)
#define TBUF_SLOTS 64

typedef struct slot {
    void *p;    /* NULL: empty slot */
    size_t cap; /* bytes of the block */
    bool used;  /* handed out */
} slot_t;

static slot_t slots[TBUF_SLOTS];
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static size_t round_cap(size_t bytes)
{
    size_t cap = TBUF_MIN;
    while (cap < bytes && cap < SIZE_MAX / 2) cap *= 2;
    return cap < bytes ? bytes : cap;
}

void *tbuf_alloc(size_t bytes)
{
    if (bytes == 0) bytes = 1;
    if (bytes < TBUF_MIN) {
        void *p = malloc(bytes);
        ASSERT_TRUE(p != NULL);
        return p;
    }
    /* the smallest free block that fits; else a free slot to (re)fill */
    slot_t *fit = NULL, *spare = NULL;
    pthread_mutex_lock(&mu);
    for (size_t i = 0; i < TBUF_SLOTS; i++) {
        slot_t *s = &slots[i];
        if (s->used) continue;
        if (s->p && s->cap >= bytes && (!fit || s->cap < fit->cap)) fit = s;
        if (!spare || (spare->p && !s->p)) spare = s;
    }
    if (!fit && spare) {
        if (spare->p) {
            UNPOISON(spare->p, spare->cap);
            free(spare->p);
        }
        spare->cap = round_cap(bytes);
        spare->p = aligned_alloc(64, spare->cap);
        if (spare->p) fit = spare;
    }
    if (fit) {
        fit->used = true;
        POISON(fit->p, fit->cap);
        UNPOISON(fit->p, bytes);
    }
    pthread_mutex_unlock(&mu);
    if (!fit) { /* every slot handed out (or no memory): an ordinary block */
        void *p = malloc(bytes);
        ASSERT_TRUE(p != NULL);
        return p;
    }
    return fit->p;
}

void tbuf_free(void *p)
{
    if (!p) return;
    pthread_mutex_lock(&mu);
    for (size_t i = 0; i < TBUF_SLOTS; i++) {
        if (slots[i].p != p) continue;
        bool was_used = slots[i].used;
        slots[i].used = false;
        POISON(p, slots[i].cap);
        pthread_mutex_unlock(&mu);
        ASSERT_TRUE(was_used); /* freed twice */
        return;
    }
    pthread_mutex_unlock(&mu);
    free(p);
}
