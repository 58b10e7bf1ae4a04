/*
 * examples/example_util.h — what the training examples share: dying with a
 * message that names the program and the rank, checking a tdist call, a
 * monotonic clock, the splitmix64 generator, and a hash of a float buffer
 * (to compare the ranks' parameters). Define EXAMPLE_NAME before including
 * it; set example_rank once the rank is known.
 */
#ifndef TDIST_EXAMPLE_UTIL_H
#define TDIST_EXAMPLE_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <tdist/tdist.h>

static int example_rank = -1;

#define DIE(...)                                                                                   \
    do {                                                                                           \
        fprintf(stderr, EXAMPLE_NAME ": rank %d: ", example_rank);                                \
        fprintf(stderr, __VA_ARGS__);                                                              \
        fputc('\n', stderr);                                                                       \
        exit(1);                                                                                   \
    } while (0)

#define CHECK(call)                                                                                \
    do {                                                                                           \
        tdist_status_t st_ = (call);                                                               \
        if (st_ != TDIST_OK) DIE("%s: %s: %s", #call, tdist_status_str(st_), tdist_last_error()); \
    } while (0)

static inline double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* splitmix64: the next value of the generator whose state is *s. */
static inline uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* FNV-1a over the bytes of n floats. */
static inline uint64_t hash_floats(const float *p, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    const unsigned char *b = (const unsigned char *)p;
    for (size_t i = 0; i < n * sizeof(float); i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

#endif /* TDIST_EXAMPLE_UTIL_H */
