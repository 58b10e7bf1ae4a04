/*
 * tests/harness/gen.h — what the collective tests share: seeded inputs
 * that every rank can compute for every rank, and the reference result of
 * a reduction over ranks computed locally from them.
 *
 * Inputs are small integers (exact in every dtype and any summation
 * order); PROD draws from {1, -1, 2, -2} (1, 2 for u8); bitwise ops use
 * full-width patterns.
 */
#ifndef TDIST_TEST_GEN_H
#define TDIST_TEST_GEN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tdist/core.h"

/* A 64-bit mixer (splitmix's finaliser). */
uint64_t tgen_mix(uint64_t x);

/* Store v as element i of buf in dtype dt. */
void tgen_put(void *buf, size_t i, tdist_dtype_t dt, double v);

/* Rank `rank`'s count elements for a case (op picks the value range). */
void tgen_fill(void *buf, size_t count, tdist_dtype_t dt, tdist_redop_t op, int rank,
               uint64_t seed);

/* Elements [first, first + count) of the same sequence, into buf[0..count):
 * tgen_fill is tgen_fill_part with first 0. */
void tgen_fill_part(void *buf, size_t first, size_t count, tdist_dtype_t dt, tdist_redop_t op,
                    int rank, uint64_t seed);

/* out = op over ranks [0, n) of their tgen_fill inputs, reduced in rank
 * order (PREMUL_SUM: each scaled by premul first; AVG: divided by n).
 * Fails the test on error. */
void tgen_reference(void *out, size_t count, tdist_dtype_t dt, tdist_redop_t op, int n,
                    uint64_t seed, double premul);

/* Elements [first, first + count) of that reduction (it is element-wise:
 * the same bits as the whole one's), into out[0..count). */
void tgen_reference_part(void *out, size_t first, size_t count, tdist_dtype_t dt,
                         tdist_redop_t op, int n, uint64_t seed, double premul);

/* Whether op applies to dt (PREMUL_SUM: floating dtypes only). */
bool tgen_op_valid(tdist_redop_t op, tdist_dtype_t dt);

#endif /* TDIST_TEST_GEN_H */
