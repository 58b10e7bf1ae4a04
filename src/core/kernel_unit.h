/*
 * core/kernel_unit.h — the head of each of core's kernel files (reduce.c,
 * half.c, wire16.c), included before anything else of the project and by
 * nothing else: the x86 intrinsics (HAVE_X86 when they are there), the
 * optimisation level that keeps Debug (-O0) builds' kernels vectorised
 * (it applies to the rest of the including file, which is why no other
 * file may include this), and core's internal headers.
 */
#ifndef TDIST_CORE_KERNEL_UNIT_H
#define TDIST_CORE_KERNEL_UNIT_H

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_X86 1
#endif

#if defined(__GNUC__) && !defined(__clang__) && !defined(__OPTIMIZE__)
#pragma GCC optimize("O3")
#endif

#include "core/internal.h"
#include "core/kernels.h"

#endif
