/* tests/harness/mesh.c — test meshes over the transport (see mesh.h). */
#include "mesh.h"

#include "coll/coll.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

int64_t deadline_in(double ms) { return tdist__now_ms() + (int64_t)(ms * tdist_test_timeout_mult()); }

void *shared_alloc(size_t len)
{
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) FAIL("mmap: %s", strerror(errno));
    memset(p, 0, len);
    return p;
}

void mesh_barrier(tp_rank_t *t, const char *name, int upto)
{
    tdist_store_t *s = tdist_world_store(t->w);
    char kb[MAXR][48];
    const char *keys[MAXR];
    void *vals[MAXR];
    size_t lens[MAXR];
    for (int r = 0; r < upto; r++) {
        snprintf(kb[r], sizeof kb[r], "%s/%d", name, r);
        keys[r] = kb[r];
    }
    ASSERT_OK(tdist_store_set(s, kb[t->rank], "1", 1));
    ASSERT_OK(tdist_store_multi_get(s, keys, (size_t)upto, vals, lens));
    for (int r = 0; r < upto; r++) free(vals[r]);
}

void mesh_open(tp_rank_t *t, tdist__tp_kind_t kind, int rank, int n, const char *bind,
               uint64_t tag)
{
    memset(t, 0, sizeof *t);
    if (n > MAXR) FAIL("world size %d > %d", n, MAXR);
    t->rank = rank;
    t->n = n;
    ASSERT_OK(tdist_init("env://", NULL, &t->w));
    /* shm meshes carry a collective area, so coll tests can run the
     * shared-memory collectives over them (transport tests ignore it). */
    tdist__tp_opts_t o = {.bind_addr = bind, .tag = tag,
                          .shm_coll_bytes = kind == TDIST__TP_SHM ? tdist__shmc_area_bytes() : 0};
    ASSERT_OK(tdist__tp_listen(kind, rank, n, &o, &t->tp));
    const char *me = tdist__tp_address(t->tp);
    ASSERT_TRUE(me != NULL);
    tdist_store_t *s = tdist_world_store(t->w);
    char kb[MAXR][32];
    const char *keys[MAXR];
    void *vals[MAXR];
    size_t lens[MAXR];
    for (int r = 0; r < n; r++) {
        snprintf(kb[r], sizeof kb[r], "tp/%d", r);
        keys[r] = kb[r];
    }
    ASSERT_OK(tdist_store_set(s, kb[rank], me, strlen(me)));
    ASSERT_OK(tdist_store_multi_get(s, keys, (size_t)n, vals, lens));
    for (int r = 0; r < n; r++) {
        ASSERT_TRUE(lens[r] > 0 && lens[r] < ADDR_MAX);
        memcpy(t->addrs[r], vals[r], lens[r]);
        t->addrs[r][lens[r]] = '\0';
        t->ap[r] = t->addrs[r];
        free(vals[r]);
    }
    ASSERT_STREQ(t->addrs[rank], me);
}

void tp_connect(tp_rank_t *t) { ASSERT_OK(tdist__tp_connect(t->tp, t->ap, deadline_in(15000))); }

void tp_close(tp_rank_t *t)
{
    tdist__tp_destroy(t->tp);
    t->tp = NULL;
    tdist_world_destroy(t->w);
    t->w = NULL;
}

uint8_t mesh_pat(int from, int to, int idx, size_t off)
{
    return (uint8_t)(off * 131u + (off >> 9) * 7u + (unsigned)from * 37u + (unsigned)to * 11u +
                     (unsigned)idx * 73u + 1u);
}

void mesh_fill(uint8_t *b, size_t len, int from, int to, int idx)
{
    for (size_t i = 0; i < len; i++) b[i] = mesh_pat(from, to, idx, i);
}

void mesh_check(const uint8_t *b, size_t len, int from, int to, int idx)
{
    for (size_t i = 0; i < len; i++)
        if (b[i] != mesh_pat(from, to, idx, i))
            FAIL("message %d from rank %d to rank %d: byte %zu of %zu is %u, expected %u", idx,
                 from, to, i, len, b[i], mesh_pat(from, to, idx, i));
}
