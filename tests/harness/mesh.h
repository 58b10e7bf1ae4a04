/*
 * tests/harness/mesh.h — what tests of the transport and of coll/ share:
 * joining the job, listening, publishing this rank's transport address
 * through the job's store, gathering every rank's, connecting; patterned
 * payloads; fd counting; memory shared by the ranks of one test.
 */
#ifndef TDIST_TEST_MESH_H
#define TDIST_TEST_MESH_H

#include <stddef.h>
#include <stdint.h>

#include "harness.h"
#include "transport/transport.h"

#define MAXR 8
#define ADDR_MAX 80

/* One rank's end of a test mesh. */
typedef struct tp_rank {
    tdist_world_t *w;
    tdist__tp_t *tp;
    int rank, n;
    char addrs[MAXR][ADDR_MAX];
    const char *ap[MAXR];
} tp_rank_t;

/* An absolute deadline ms from now (tdist__now_ms clock), scaled for
 * sanitizer builds. */
int64_t deadline_in(double ms);

/* Memory shared by the ranks of one test (map it before the fork). */
void *shared_alloc(size_t len);

/* Join the job (env://), listen with kind, publish this rank's address
 * under "tp/<rank>" and gather all n. Fails the test on any error. */
void mesh_open(tp_rank_t *t, tdist__tp_kind_t kind, int rank, int n, const char *bind,
               uint64_t tag);

/* Connect the mesh (15 s x multiplier). */
void tp_connect(tp_rank_t *t);

/* Destroy the transport and leave the job. */
void tp_close(tp_rank_t *t);

/* Wait until every rank in [0, upto) has set "<name>/<rank>". */
void mesh_barrier(tp_rank_t *t, const char *name, int upto);

/* Payload byte at offset off of message idx from rank `from` to rank
 * `to`; fill a buffer with it; check one (fails the test naming the byte). */
uint8_t mesh_pat(int from, int to, int idx, size_t off);
void mesh_fill(uint8_t *b, size_t len, int from, int to, int idx);
void mesh_check(const uint8_t *b, size_t len, int from, int to, int idx);

#endif /* TDIST_TEST_MESH_H */
