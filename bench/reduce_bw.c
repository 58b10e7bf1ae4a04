/*
 * bench/reduce_bw.c — reduction-kernel bandwidth against memcpy.
 *
 *   bench_reduce_bw [MiB per buffer ...]     (default: 64 256)
 *
 * Buffers are far larger than the caches. Bytes counted: memcpy reads n and
 * writes n (2n); dst = a + b reads a and b and writes dst (3n); a += b
 * likewise (3n). Each figure is the median of several repetitions. f32 SUM
 * is also measured on each kernel instruction set the CPU has, and with
 * non-temporal stores switched off (dst >= last-level cache streams). The RESULT
 * lines use the largest size.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/kernels.h"
#include "tdist/core.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof v[0], cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

enum { MEMCPY, SUM_OOP, SUM_INPLACE };

/* GB/s (1e9 bytes) of one kind of pass, median of reps. */
static double measure(int kind, void *d, void *a, void *b, size_t bytes, tdist_dtype_t dt, int reps)
{
    double gbs[16];
    size_t count = bytes / tdist_dtype_size(dt);
    for (int r = 0; r < reps; r++) {
        double t0 = now_s();
        tdist_status_t st = TDIST_OK;
        switch (kind) {
        case MEMCPY: memcpy(d, a, bytes); break;
        case SUM_OOP: st = tdist_reduce(d, a, b, count, dt, TDIST_SUM); break;
        case SUM_INPLACE: st = tdist_reduce(a, a, b, count, dt, TDIST_SUM); break;
        default: break;
        }
        double t = now_s() - t0;
        if (st != TDIST_OK) {
            fprintf(stderr, "tdist_reduce: %s\n", tdist_last_error());
            exit(1);
        }
        double moved = kind == MEMCPY ? 2.0 * (double)bytes : 3.0 * (double)bytes;
        gbs[r] = moved / t / 1e9;
    }
    return median(gbs, reps);
}

/* Small values so repeated in-place sums stay finite and ordinary. */
static void fill(void *p, size_t bytes, tdist_dtype_t dt)
{
    size_t n = bytes / tdist_dtype_size(dt);
    for (size_t i = 0; i < n; i++) {
        float v = (float)(i % 1000) * 1e-6f;
        if (dt == TDIST_F32) ((float *)p)[i] = v;
        else if (dt == TDIST_F16) ((uint16_t *)p)[i] = tdist_f32_to_f16(v);
        else ((uint16_t *)p)[i] = tdist_f32_to_bf16(v);
    }
}

int main(int argc, char **argv)
{
    size_t mibs[8] = {64, 256};
    int nsizes = 2;
    if (argc > 1) {
        nsizes = 0;
        for (int i = 1; i < argc && nsizes < 8; i++) mibs[nsizes++] = (size_t)strtoul(argv[i], NULL, 10);
    }
    tdist__isa_t best = tdist__get_isa();
    printf("kernels: %s (best on this CPU: %s)\n", tdist__isa_name(best), tdist__isa_name(tdist__best_isa()));
    double last_memcpy = 0, last_sum = 0, last_inplace = 0, last_f16 = 0, last_bf16 = 0;
    size_t last_mib = 0;
    for (int s = 0; s < nsizes; s++) {
        size_t bytes = mibs[s] << 20;
        if (bytes == 0) continue;
        int reps = bytes >= (256u << 20) ? 5 : 9;
        void *a = aligned_alloc(64, bytes), *b = aligned_alloc(64, bytes), *d = aligned_alloc(64, bytes);
        if (!a || !b || !d) {
            fprintf(stderr, "cannot allocate 3 x %zu MiB\n", mibs[s]);
            return 1;
        }
        memset(d, 0, bytes); /* fault every page in before timing */
        fill(a, bytes, TDIST_F32);
        fill(b, bytes, TDIST_F32);
        measure(MEMCPY, d, a, b, bytes, TDIST_F32, 1); /* warm-up */
        double mc = measure(MEMCPY, d, a, b, bytes, TDIST_F32, reps);
        printf("%4zu MiB  memcpy                 %7.2f GB/s\n", mibs[s], mc);
        double isa_gbs[TDIST__ISA_COUNT] = {0};
        for (int isa = 0; isa <= (int)tdist__best_isa(); isa++) {
            tdist__set_isa((tdist__isa_t)isa);
            isa_gbs[isa] = measure(SUM_OOP, d, a, b, bytes, TDIST_F32, reps);
            printf("%4zu MiB  f32 sum d=a+b  %-7s %7.2f GB/s\n", mibs[s], tdist__isa_name((tdist__isa_t)isa),
                   isa_gbs[isa]);
        }
        tdist__set_isa(best);
        double sum = isa_gbs[best];
        size_t nt = tdist__reduce_nt_threshold();
        tdist__reduce_set_nt_threshold(0); /* plain stores, for comparison */
        double plain = measure(SUM_OOP, d, a, b, bytes, TDIST_F32, reps);
        tdist__reduce_set_nt_threshold(nt);
        printf("%4zu MiB  f32 sum d=a+b  %-7s %7.2f GB/s  (plain stores; streaming from %zu MiB)\n", mibs[s],
               tdist__isa_name(best), plain, nt >> 20);
        double inplace = measure(SUM_INPLACE, d, a, b, bytes, TDIST_F32, reps);
        printf("%4zu MiB  f32 sum a+=b   %-7s %7.2f GB/s\n", mibs[s], tdist__isa_name(best), inplace);
        fill(a, bytes, TDIST_F16);
        fill(b, bytes, TDIST_F16);
        double f16 = measure(SUM_OOP, d, a, b, bytes, TDIST_F16, reps);
        printf("%4zu MiB  f16 sum d=a+b  %-7s %7.2f GB/s\n", mibs[s], tdist__isa_name(best), f16);
        fill(a, bytes, TDIST_BF16);
        fill(b, bytes, TDIST_BF16);
        double bf16 = measure(SUM_OOP, d, a, b, bytes, TDIST_BF16, reps);
        printf("%4zu MiB  bf16 sum d=a+b %-7s %7.2f GB/s\n", mibs[s], tdist__isa_name(best), bf16);
        last_memcpy = mc;
        last_sum = sum;
        last_inplace = inplace;
        last_f16 = f16;
        last_bf16 = bf16;
        last_mib = mibs[s];
        free(a);
        free(b);
        free(d);
    }
    if (last_mib == 0) return 1;
    printf("RESULT buffer_size %zu MiB\n", last_mib);
    printf("RESULT memcpy_bw %.2f GB/s\n", last_memcpy);
    printf("RESULT reduce_f32_sum_bw %.2f GB/s\n", last_sum);
    printf("RESULT reduce_f32_sum_inplace_bw %.2f GB/s\n", last_inplace);
    printf("RESULT reduce_f16_sum_bw %.2f GB/s\n", last_f16);
    printf("RESULT reduce_bf16_sum_bw %.2f GB/s\n", last_bf16);
    printf("RESULT reduce_vs_memcpy %.2f x\n", last_sum / last_memcpy);
    return 0;
}
