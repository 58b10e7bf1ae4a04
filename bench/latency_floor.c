/*
 * bench/latency_floor.c — the least an 8-byte all_reduce over shared memory
 * can cost on this machine, with no library at all: the floor that
 * tdist-bench's and Open MPI's 8-byte figures (bench/compare/run.sh) are
 * measured against (their latency targets: docs/bench-compare.md).
 *
 *   bench_latency_floor [ITERS] [RUNS]      (defaults 1000000 and 5)
 *
 * Each rank is a process, pinned to a CPU; each owns one 128-byte line of a
 * shared mapping holding (sequence, value). One all_reduce = write the own
 * value, publish the sequence number, wait until every other line shows it,
 * add the values in rank order. Two rounds of lines alternate, so a fast
 * rank's next write never lands on a line a slow one still reads.
 *
 *   spin2    2 ranks on 2 CPUs, waiting by spinning (pause): the cache-line
 *            round trip between the two CPUs, nothing else
 *   yield4   4 ranks, 2 per CPU on 2 CPUs, waiting with sched_yield (a
 *            spinning waiter would only delay the rank it waits for): every
 *            rank must run once per call, so each CPU switches at least
 *            twice per call
 *   smart4   the same 4 ranks, but a waiter yields only while a rank it
 *            still waits for shares its CPU, and spins while all of them
 *            are on the other CPU (yielding then would hand the CPU to a
 *            rank that waits too): no wasted switch when the two CPUs'
 *            turns fall out of step. What tdist's shared-memory waits do.
 *
 * yield4 and smart4 run ITERS / 10 calls. Figures are per call: the median over RUNS
 * of (time for the last 90% of the calls) / calls, on rank 0. Every loop is
 * bounded in count, and every wait gives up after 10 s (the run is then
 * reported as failed). Needs 2 CPUs; prints a SKIP line otherwise.
 */
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define WAIT_LIMIT_NS 10000000000ull

typedef struct line {
    _Alignas(128) _Atomic uint64_t seq;
    double val;
} line_t;

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int cmp_double(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

/* Median of v[0..n) (sorts v). */
static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof v[0], cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

enum { SPIN, YIELD, SMART };

/* Rank me of n: iters all_reduces over lines[2][n]. Returns ns per call of
 * the last 90%, or -1 when a wait gave up. Rank r runs on CPU r % 2. */
static double ranks_loop(line_t (*lines)[8], int me, int n, long iters, int mode)
{
    uint64_t t0 = 0;
    double sum = 0;
    for (long i = 1; i <= iters; i++) {
        if (i == iters / 10 + 1) t0 = now_ns();
        line_t *round = lines[i & 1];
        round[me].val = me + 1;
        atomic_store_explicit(&round[me].seq, (uint64_t)i, memory_order_release);
        uint64_t start = 0;
        for (int r = 0; r < n; r++) {
            for (unsigned k = 0; atomic_load_explicit(&round[r].seq, memory_order_acquire) <
                                 (uint64_t)i;
                 k++) {
                /* ranks r.. are the ones still missing; r itself is */
                bool here = false;
                for (int q = r; q < n && mode == SMART && !here; q++)
                    here = q != me && q % 2 == me % 2 &&
                           atomic_load_explicit(&round[q].seq, memory_order_acquire) <
                               (uint64_t)i;
                if (mode == YIELD || here)
                    sched_yield();
                else
                    cpu_relax();
                if ((k & 1023) == 1023) {
                    if (!start) start = now_ns();
                    else if (now_ns() - start > WAIT_LIMIT_NS) return -1;
                }
            }
        }
        sum = 0;
        for (int r = 0; r < n; r++) sum += round[r].val;
    }
    if (sum != n * (n + 1) / 2.0) return -1;
    return (double)(now_ns() - t0) / (double)(iters - iters / 10);
}

/* One run of n ranks (rank r on CPU cpus[r % 2]); ns per call on rank 0. */
static double run(int n, const int cpus[2], long iters, int mode)
{
    line_t(*lines)[8] = mmap(NULL, sizeof(line_t[2][8]), PROT_READ | PROT_WRITE,
                             MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (lines == MAP_FAILED) return -1;
    pid_t kids[8];
    int me = 0, made = 0;
    for (int r = 1; r < n; r++) {
        pid_t p = fork();
        if (p == 0) {
            me = r;
            break;
        }
        if (p < 0) break;
        kids[made++] = p;
    }
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpus[me % 2], &one);
    sched_setaffinity(0, sizeof one, &one);
    double t = (me == 0 && made < n - 1) ? -1 : ranks_loop(lines, me, n, iters, mode);
    if (me != 0) _exit(t < 0 ? 1 : 0);
    for (int k = 0; k < made; k++) {
        int st = 0;
        if (waitpid(kids[k], &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) t = -1;
    }
    munmap(lines, sizeof(line_t[2][8]));
    return t;
}

int main(int argc, char **argv)
{
    long iters = argc > 1 ? atol(argv[1]) : 1000000;
    int runs = argc > 2 ? atoi(argv[2]) : 5;
    if (iters < 100 || runs < 1 || runs > 99) {
        fprintf(stderr, "usage: %s [ITERS >= 100] [RUNS 1..99]\n", argv[0]);
        return 2;
    }
    cpu_set_t all;
    int cpus[2] = {-1, -1}, k = 0;
    if (sched_getaffinity(0, sizeof all, &all) == 0)
        for (int c = 0; c < CPU_SETSIZE && k < 2; c++)
            if (CPU_ISSET(c, &all)) cpus[k++] = c;
    if (k < 2) {
        printf("SKIP: this process may run on fewer than 2 CPUs\n");
        return 0;
    }
    double spin[99], yield[99], smart[99];
    int failed = 0;
    for (int r = 0; r < runs; r++) {
        spin[r] = run(2, cpus, iters, SPIN);
        yield[r] = run(4, cpus, iters / 10, YIELD);
        smart[r] = run(4, cpus, iters / 10, SMART);
        if (spin[r] < 0 || yield[r] < 0 || smart[r] < 0) failed++;
        printf("run %d: spin2 %.1f ns, yield4 %.2f us, smart4 %.2f us per 8-byte all_reduce "
               "(CPUs %d, %d)\n",
               r + 1, spin[r], yield[r] / 1000, smart[r] / 1000, cpus[0], cpus[1]);
    }
    double ms = median(spin, runs), my = median(yield, runs), mm = median(smart, runs);
    printf("RESULT floor_allreduce_8B_2r_spin_ns %.1f ns\n", ms);
    printf("RESULT floor_allreduce_8B_4r_on_2cpus_yield_us %.2f us\n", my / 1000);
    printf("RESULT floor_allreduce_8B_4r_on_2cpus_smart_us %.2f us\n", mm / 1000);
    printf("RESULT floor_failed_runs %d count\n", failed);
    return failed ? 1 : 0;
}
