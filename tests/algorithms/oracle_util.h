/*
 * tests/algorithms/oracle_util.h — what the tests against PyTorch's
 * recordings share: f32 values to and from their bit patterns, and Gloo's
 * ring all_reduce (SUM) order (rule R0.1 of the recordings' README).
 * Header-only (static inline).
 */
#ifndef TDIST_TEST_ORACLE_UTIL_H
#define TDIST_TEST_ORACLE_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

static inline uint32_t bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Gloo's ring all_reduce (SUM) of element i of w ranks' n-element
 * vectors, rank r's at v + r * stride: chunk c = i / (2s), s = ceil(n /
 * 2w), summed as v_c + (v_{c+1} + (... + (v_{c-2} + v_{c-1}))), ranks
 * mod w. */
static inline float ring_sum(const float *v, size_t stride, int w, size_t n, size_t i)
{
    size_t s = (n + 2 * (size_t)w - 1) / (2 * (size_t)w);
    int c = (int)(i / (2 * s));
    float acc = v[(size_t)((c + w - 1) % w) * stride + i];
    for (int j = w - 2; j >= 0; j--) acc = v[(size_t)((c + j) % w) * stride + i] + acc;
    return acc;
}

#endif /* TDIST_TEST_ORACLE_UTIL_H */
