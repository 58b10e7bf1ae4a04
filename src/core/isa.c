/* core/isa.c — which instruction set the conversion and reduction kernels use. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "core/kernels.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#endif

static _Atomic int current_isa = -1; /* -1: not chosen yet */

tdist__isa_t tdist__best_isa(void)
{
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
    int avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                 __builtin_cpu_supports("avx512vl");
    if (avx512) return TDIST__ISA_AVX512;
    if (avx2) return TDIST__ISA_AVX2;
#endif
    return TDIST__ISA_GENERIC;
}

const char *tdist__isa_name(tdist__isa_t isa)
{
    switch (isa) {
    case TDIST__ISA_GENERIC: return "generic";
    case TDIST__ISA_AVX2: return "avx2";
    case TDIST__ISA_AVX512: return "avx512";
    case TDIST__ISA_COUNT: break;
    }
    return "invalid";
}

tdist__isa_t tdist__set_isa(tdist__isa_t isa)
{
    tdist__isa_t best = tdist__best_isa();
    if ((int)isa < 0 || isa >= TDIST__ISA_COUNT || isa > best) isa = best;
    atomic_store(&current_isa, (int)isa);
    return isa;
}

tdist__isa_t tdist__get_isa(void)
{
    int isa = atomic_load_explicit(&current_isa, memory_order_relaxed);
    if (isa >= 0) return (tdist__isa_t)isa;
    tdist__isa_t best = tdist__best_isa();
    tdist__isa_t want = best;
    const char *env = getenv("TDIST_KERNELS");
    if (env && *env) {
        if (strcmp(env, "generic") == 0) want = TDIST__ISA_GENERIC;
        else if (strcmp(env, "avx2") == 0) want = TDIST__ISA_AVX2;
        else if (strcmp(env, "avx512") == 0) want = TDIST__ISA_AVX512;
        else TDIST_LOGW("TDIST_KERNELS=\"%s\" is not generic|avx2|avx512; using %s", env,
                        tdist__isa_name(best));
        if (want > best) {
            TDIST_LOGW("TDIST_KERNELS=%s: this CPU lacks it; using %s", env, tdist__isa_name(best));
            want = best;
        }
    }
    int expected = -1;
    /* first caller wins; a racing tdist__set_isa() is kept */
    if (!atomic_compare_exchange_strong(&current_isa, &expected, (int)want)) return (tdist__isa_t)expected;
    TDIST_LOGD("reduction kernels: %s", tdist__isa_name(want));
    return want;
}

bool tdist__cpu_has_prefetchw(void)
{
#if defined(__x86_64__) && defined(__GNUC__)
    unsigned a, b, c, d;
    return __get_cpuid(0x80000001u, &a, &b, &c, &d) && (c & (1u << 8)); /* 3DNowPrefetch */
#else
    return false;
#endif
}
