/* tests/harness/harness.c — registry, runner with deadlines, multi-rank spawner. */
#include "harness.h"

#include <dirent.h>
#include <link.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_TESTS 2048

static const tdist_test_entry_t *registry[MAX_TESTS];
static int num_tests;
int tdist_test_rank = -1;
static char tmpdir[256];
static const char *current_test = "?";

void tdist_test_register(const tdist_test_entry_t *e)
{
    if (num_tests < MAX_TESTS) registry[num_tests++] = e;
}

void tdist_test_fail(const char *file, int line, const char *fmt, ...)
{
    char msg[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (tdist_test_rank >= 0)
        fprintf(stderr, "[rank %d] %s:%d: %s\n", tdist_test_rank, file, line, msg);
    else
        fprintf(stderr, "%s:%d: %s\n", file, line, msg);
    fflush(stderr);
    _exit(1);
}

void tdist_test_skip(const char *fmt, ...)
{
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    printf("SKIP %s: %s\n", current_test, msg);
    fflush(stdout);
    fflush(stderr);
    _exit(TDIST_TEST_SKIP_CODE);
}

/* The multiplier in environment variable name when it is a positive
 * number, else dflt. */
static double env_mult(const char *name, double dflt)
{
    const char *v = getenv(name);
    double m = v ? atof(v) : 0;
    return m > 0 ? m : dflt;
}

double tdist_test_timeout_mult(void)
{
#ifdef TDIST_SANITIZED
    return env_mult("TDIST_TEST_TIMEOUT_MULT", 3.0);
#else
    return env_mult("TDIST_TEST_TIMEOUT_MULT", 1.0);
#endif
}

#ifdef TDIST_TEST_ASAN
#include <sanitizer/lsan_interface.h>
#endif

void tdist_test_leak_check_now(void)
{
#ifdef TDIST_TEST_ASAN
    __lsan_do_leak_check(); /* ends the process on a leak; no second check at exit */
#endif
}

/* How a process the harness forked (a test, a rank, the store helper)
 * ends when its work is done: the leak check (not in the store helper),
 * then exit(0), which runs the
 * exit handlers the process registered (the library's among them) and
 * then end_here, which the runner registered before anything else a test
 * can register, so it runs after those. end_here leaves at once: what
 * would follow is the C library's and the sanitizer runtimes' own
 * teardown — unregistering every global (redzones of some 30 MB of them
 * under AddressSanitizer, a few ms a process) — and their leak check at
 * exit, which already ran. A process that ends any other way (exit(n) in a
 * test, a failed assertion, a signal) keeps the usual exit and its check.
 * Other builds exit in full: ThreadSanitizer sets the exit status of a
 * process that reported a race in its teardown. */
static bool ending_done;

static void end_here(void)
{
#ifdef TDIST_TEST_ASAN
    if (!ending_done) return;
    fflush(NULL);
    _exit(0);
#endif
}

static _Noreturn void exit_done(bool leak_check)
{
    fflush(stdout);
    fflush(stderr);
    if (leak_check) tdist_test_leak_check_now();
    ending_done = true;
    exit(0);
}

double tdist_test_latency_mult(void)
{
#ifdef TDIST_TEST_TSAN
    return env_mult("TDIST_TEST_LATENCY_MULT", 4.0);
#else
    return env_mult("TDIST_TEST_LATENCY_MULT", 1.0);
#endif
}

double tdist_test_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

double tdist_test_cpu_wait_ms(void)
{
    FILE *f = fopen("/proc/thread-self/schedstat", "r");
    if (!f) return 0;
    unsigned long long on_cpu = 0, waited = 0;
    int got = fscanf(f, "%llu %llu", &on_cpu, &waited);
    fclose(f);
    return got == 2 ? (double)waited / 1e6 : 0;
}

const char *tdist_test_tmpdir(void) { return tmpdir; }

/* Entries of directory path, without . and .. */
static int count_entries(const char *path)
{
    DIR *d = opendir(path);
    if (!d) FAIL("opendir %s: %s", path, strerror(errno));
    int n = 0;
    for (struct dirent *e = readdir(d); e; e = readdir(d))
        if (e->d_name[0] != '.') n++;
    closedir(d);
    return n;
}

int tdist_test_count_fds(void) { return count_entries("/proc/self/fd") - 1; }

int tdist_test_count_threads(void) { return count_entries("/proc/self/task"); }

int tdist_test_threads_settled(int want)
{
    int n = tdist_test_count_threads();
    for (int i = 0; i < 200 && n > want; i++) {
        usleep(10 * 1000);
        n = tdist_test_count_threads();
    }
    return n;
}

const char *tdist_test_describe(const tdist_rank_result_t *r, char *buf, size_t n)
{
    if (r->exited)
        snprintf(buf, n, "exited with status %d", r->code);
    else if (r->signaled)
        snprintf(buf, n, "killed by signal %d (%s)", r->sig, strsignal(r->sig));
    else
        snprintf(buf, n, "did not finish");
    return buf;
}

/* ------------------------------------------------------------- ranks */

void tdist_ranks_opts_init(tdist_ranks_opts_t *o, int world_size)
{
    memset(o, 0, sizeof *o);
    o->world_size = world_size;
    o->with_store = true;
    o->timeout_ms = (int)(60000 * tdist_test_timeout_mult());
    o->kill_others_after_ms = 0;
    o->env = NULL;
}

static void die_with_parent(pid_t parent)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(99);
}

/* Fork a process that runs a TCP store server on 127.0.0.1:0 until its
 * control pipe closes. Returns its pid; writes the port and the pipe's
 * write end (close it to stop the server). */
static pid_t start_store(uint16_t *port, int *ctl_fd)
{
    int up[2], ctl[2];
    if (pipe(up) != 0 || pipe(ctl) != 0) FAIL("pipe: %s", strerror(errno));
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) FAIL("fork: %s", strerror(errno));
    if (pid == 0) {
        die_with_parent(parent);
        close(up[0]);
        close(ctl[1]);
        tdist_store_server_t *srv = NULL;
        tdist_status_t st = tdist_store_server_create("127.0.0.1", 0, NULL, &srv);
        uint16_t p = st == TDIST_OK ? tdist_store_server_port(srv) : 0;
        if (st != TDIST_OK) fprintf(stderr, "harness store: %s\n", tdist_last_error());
        if (write(up[1], &p, sizeof p) != (ssize_t)sizeof p) _exit(3);
        close(up[1]);
        char c;
        while (read(ctl[0], &c, 1) < 0 && errno == EINTR) {
        }
        tdist_store_server_destroy(srv);
        /* no leak check here: the server is the store tests' subject,
         * and they check it in their own processes; a check at every
         * spawn of this helper was a tenth of the ddp tests' time */
        exit_done(false);
    }
    close(up[1]);
    close(ctl[0]);
    uint16_t p = 0;
    ssize_t r;
    do {
        r = read(up[0], &p, sizeof p);
    } while (r < 0 && errno == EINTR);
    close(up[0]);
    if (r != (ssize_t)sizeof p || p == 0) FAIL("harness: store server did not start");
    *port = p;
    *ctl_fd = ctl[1];
    return pid;
}

int tdist_test_spawn_ranks(const tdist_ranks_opts_t *o, tdist_rank_fn body, void *arg,
                           tdist_rank_result_t *results)
{
    int n = o->world_size;
    if (n <= 0 || n > 1024) FAIL("harness: bad world size %d", n);
    tdist_rank_result_t *res = calloc((size_t)n, sizeof *res);
    pid_t *pids = calloc((size_t)n, sizeof *pids);
    if (!res || !pids) FAIL("harness: out of memory");

    uint16_t port = 0;
    int ctl_fd = -1;
    pid_t store_pid = -1;
    if (o->with_store) store_pid = start_store(&port, &ctl_fd);

    fflush(stdout);
    fflush(stderr);
    pid_t parent = getpid();
    for (int r = 0; r < n; r++) {
        pid_t pid = fork();
        if (pid < 0) FAIL("fork: %s", strerror(errno));
        if (pid == 0) {
            die_with_parent(parent);
            if (ctl_fd >= 0) close(ctl_fd);
            /* The parent's bookkeeping: a rank that kept it would leave it
             * to the leak checker, unreferenced once optimised code holds
             * the pointers in registers only. */
            free(res);
            free(pids);
            tdist_test_rank = r;
            char buf[32];
            if (o->with_store) {
                setenv("MASTER_ADDR", "127.0.0.1", 1);
                snprintf(buf, sizeof buf, "%u", (unsigned)port);
                setenv("MASTER_PORT", buf, 1);
                setenv("TDIST_LAUNCHER_STORE", "1", 1);
            }
            snprintf(buf, sizeof buf, "%d", r);
            setenv("RANK", buf, 1);
            setenv("LOCAL_RANK", buf, 1);
            snprintf(buf, sizeof buf, "%d", n);
            setenv("WORLD_SIZE", buf, 1);
            setenv("LOCAL_WORLD_SIZE", buf, 1);
            /* flight-recorder rings (and the rings of ranks a test kills)
             * stay in the test's directory, which the runner removes */
            char frdir[600];
            snprintf(frdir, sizeof frdir, "%s/tdist-fr", tmpdir);
            setenv("TDIST_FR_DIR", frdir, 0);
            for (const char *const *e = o->env; e && *e; e++) putenv((char *)*e);
            body(r, n, arg);
            exit_done(true);
        }
        pids[r] = pid;
        res[r].pid = pid;
    }

    double start = tdist_test_now_ms();
    double kill_at = o->timeout_ms > 0 ? start + o->timeout_ms : 1e300;
    int remaining = n, failed = 0;
    bool killed_others = false;
    while (remaining > 0) {
        int status;
        pid_t w = waitpid(-1, &status, WNOHANG);
        if (w > 0) {
            for (int r = 0; r < n; r++) {
                if (pids[r] != w) continue;
                res[r].exited = WIFEXITED(status);
                res[r].code = res[r].exited ? WEXITSTATUS(status) : 0;
                res[r].signaled = WIFSIGNALED(status);
                res[r].sig = res[r].signaled ? WTERMSIG(status) : 0;
                res[r].end_ms = tdist_test_now_ms();
                pids[r] = 0;
                remaining--;
                if (!(res[r].exited && res[r].code == 0)) {
                    failed++;
                    if (o->kill_others_after_ms >= 0) {
                        double at = res[r].end_ms + o->kill_others_after_ms;
                        if (at < kill_at) kill_at = at;
                    }
                }
            }
            continue; /* w may also be the store process: ignore */
        }
        if (w < 0 && errno == ECHILD) break;
        if (!killed_others && tdist_test_now_ms() >= kill_at) {
            for (int r = 0; r < n; r++) {
                if (pids[r] <= 0) continue;
                kill(pids[r], SIGKILL);
                res[r].killed_by_harness = true;
            }
            killed_others = true;
        }
        struct timespec ts = {0, 2 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    if (store_pid > 0) {
        close(ctl_fd);
        int status;
        for (int i = 0; i < 2000; i++) { /* up to 4 s, then kill */
            pid_t w = waitpid(store_pid, &status, WNOHANG);
            if (w == store_pid || (w < 0 && errno == ECHILD)) {
                store_pid = -1;
                break;
            }
            struct timespec ts = {0, 2 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
        if (store_pid > 0) {
            kill(store_pid, SIGKILL);
            waitpid(store_pid, &status, 0);
        }
    }
    if (results) memcpy(results, res, (size_t)n * sizeof *res);
    free(res);
    free(pids);
    return failed;
}

void tdist_test_run_ranks(int n, tdist_rank_fn body, void *arg)
{
    tdist_test_run_ranks_env(n, body, arg, NULL);
}

void tdist_test_run_ranks_env(int n, tdist_rank_fn body, void *arg, const char *const *env)
{
    tdist_ranks_opts_t o;
    tdist_ranks_opts_init(&o, n);
    o.env = env;
    tdist_rank_result_t *res = calloc((size_t)n, sizeof *res);
    if (!res) FAIL("harness: out of memory");
    int failed = tdist_test_spawn_ranks(&o, body, arg, res);
    if (failed == 0) {
        free(res);
        return;
    }
    /* Name the rank that failed first; ranks the harness stopped because
     * of it are counted apart. */
    int first = -1, own = 0;
    for (int r = 0; r < n; r++) {
        bool ok = res[r].exited && res[r].code == 0;
        if (ok || res[r].killed_by_harness) continue;
        own++;
        if (first < 0 || res[r].end_ms < res[first].end_ms) first = r;
    }
    if (first >= 0 && res[first].exited && res[first].code == TDIST_TEST_SKIP_CODE) {
        free(res);
        tdist_test_skip("rank %d skipped (its reason is above)", first);
    }
    char buf[128];
    if (first < 0) {
        free(res);
        FAIL("%d of %d ranks failed: all were killed by the harness at the %d ms deadline", failed,
             n, o.timeout_ms);
    }
    tdist_test_describe(&res[first], buf, sizeof buf);
    free(res);
    FAIL("%d of %d ranks failed; first: rank %d %s (%d more stopped by the harness)", own, n, first,
         buf, failed - own);
}

/* ------------------------------------------------------------- runner */

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static const tdist_test_entry_t *find_test(const char *name)
{
    for (int i = 0; i < num_tests; i++)
        if (strcmp(registry[i]->name, name) == 0) return registry[i];
    return NULL;
}

/* The writable segments (data, bss) of every loaded module, mapped in now.
 * Every process of a test is forked from this one, and each exits through
 * the leak checker, which reads all of those segments (some 18 MB under
 * AddressSanitizer: the test binary's globals with their redzones and the
 * sanitizer runtimes' own tables). Pages the parent never touched were
 * faulted in again by every child, one fault per page, which on a
 * paravirtualised VM made leak checks most of a many-rank test's time.
 * Mapped here, once, the children inherit the page tables. The whole
 * 2 MiB blocks inside a segment are asked for as huge pages first: a
 * child's first read of a page costs on such a VM even with the page table
 * inherited, and a huge page costs it once for 512 pages (the sanitizer
 * runtimes' tables are some 12 MB). Reads only; a kernel without
 * MADV_POPULATE_READ (before Linux 5.14) leaves the segments alone. */
#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif
#define HUGE_PAGE ((uintptr_t)2 << 20)
static int populate_segment(struct dl_phdr_info *info, size_t size, void *arg)
{
    (void)size;
    (void)arg;
    long page = sysconf(_SC_PAGESIZE);
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD || !(ph->p_flags & PF_W) || ph->p_memsz == 0) continue;
        uintptr_t lo = (uintptr_t)(info->dlpi_addr + ph->p_vaddr) & ~(uintptr_t)(page - 1);
        uintptr_t hi = (uintptr_t)(info->dlpi_addr + ph->p_vaddr + ph->p_memsz);
        uintptr_t hlo = (lo + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1), hhi = hi & ~(HUGE_PAGE - 1);
        if (hhi > hlo) (void)madvise((void *)hlo, hhi - hlo, MADV_HUGEPAGE);
        (void)madvise((void *)lo, hi - lo, MADV_POPULATE_READ);
    }
    return 0;
}

/* Run one test in a child process group; kill the group at the deadline. */
static int run_one(const tdist_test_entry_t *t)
{
    double mult = tdist_test_timeout_mult();
    double deadline_ms = t->timeout_s * 1000.0 * mult;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/tdist-test-%s-XXXXXX", t->name);
    if (!mkdtemp(tmpdir)) {
        fprintf(stderr, "cannot make temporary directory: %s\n", strerror(errno));
        return 1;
    }
    fflush(stdout);
    fflush(stderr);
    current_test = t->name;
    double start = tdist_test_now_ms();
    pid_t runner = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "fork: %s\n", strerror(errno));
        return 1;
    }
    if (pid == 0) {
        setpgid(0, 0);
        die_with_parent(runner);
        t->fn();
        exit_done(true);
    }
    setpgid(pid, pid);
    int status = 0, rc = 1;
    bool done = false;
    while (!done) {
        pid_t w = waitpid(pid, &status, WNOHANG);
        if (w == pid) {
            done = true;
            break;
        }
        if (tdist_test_now_ms() - start > deadline_ms) break;
        struct timespec ts = {0, 5 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    double took = (tdist_test_now_ms() - start) / 1000.0;
    if (!done) {
        kill(-pid, SIGKILL);
        waitpid(pid, &status, 0);
        fprintf(stderr, "FAIL %s: deadline of %.0f s passed (%d s x %.1f); process group killed\n",
                t->name, deadline_ms / 1000.0, t->timeout_s, mult);
    } else if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
        printf("PASS %s (%.2f s)\n", t->name, took);
        rc = 0;
    } else if (WIFEXITED(status) && WEXITSTATUS(status) == TDIST_TEST_SKIP_CODE) {
        printf("SKIPPED %s (%.2f s)\n", t->name, took);
        rc = TDIST_TEST_SKIP_CODE;
    } else if (WIFEXITED(status)) {
        fprintf(stderr, "FAIL %s: exited with status %d after %.2f s\n", t->name,
                WEXITSTATUS(status), took);
    } else if (WIFSIGNALED(status)) {
        fprintf(stderr, "FAIL %s: killed by signal %d (%s) after %.2f s\n", t->name,
                WTERMSIG(status), strsignal(WTERMSIG(status)), took);
    }
    /* Stray processes of the test (ranks, servers) go with it. */
    kill(-pid, SIGKILL);
    nftw(tmpdir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    return rc;
}

#ifdef TDIST_TEST_TSAN
static void *idle_thread(void *arg)
{
    return arg;
}
#endif

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc >= 2 && strcmp(argv[1], "--list") == 0) {
        for (int i = 0; i < num_tests; i++) printf("%s %d\n", registry[i]->name, registry[i]->timeout_s);
        return 0;
    }
    dl_iterate_phdr(populate_segment, NULL);
#ifdef TDIST_TEST_TSAN
    /* ThreadSanitizer starts a thread of its own at a process's first
     * pthread_create, and a forked process inherits "started" but not the
     * thread. Started here, before any test forks, so it never appears
     * later in the middle of a test counting its threads. */
    pthread_t first;
    if (pthread_create(&first, NULL, idle_thread, NULL) == 0) pthread_join(first, NULL);
#endif
    atexit(end_here); /* before any test's own: it runs after them */
    int failed = 0, ran = 0, skipped = 0;
    if (argc < 2) {
        for (int i = 0; i < num_tests; i++, ran++) {
            int rc = run_one(registry[i]);
            failed += rc != 0 && rc != TDIST_TEST_SKIP_CODE;
            skipped += rc == TDIST_TEST_SKIP_CODE;
        }
    } else {
        for (int a = 1; a < argc; a++) {
            const tdist_test_entry_t *t = find_test(argv[a]);
            if (!t) {
                fprintf(stderr, "no test named %s (see --list)\n", argv[a]);
                failed++;
                continue;
            }
            int rc = run_one(t);
            failed += rc != 0 && rc != TDIST_TEST_SKIP_CODE;
            skipped += rc == TDIST_TEST_SKIP_CODE;
            ran++;
        }
    }
    printf("%d passed, %d failed, %d skipped\n", ran - failed - skipped, failed, skipped);
    fflush(stdout);
    fflush(stderr);
    /* Everything that ran skipped: say so to ctest (SKIP_RETURN_CODE).
     * _exit: the runner itself only forks and waits (every test ran in a
     * child, which had its leak check); a leak check of this process would
     * scan the sanitizer runtimes' tables once more per test for nothing. */
    if (failed) _exit(1);
    _exit(ran > 0 && skipped == ran ? TDIST_TEST_SKIP_CODE : 0);
}

void tdist_test_open_world(tdist_world_t **w, tdist_pg_t **pg, int64_t timeout_ms)
{
    ASSERT_OK(tdist_init("env://", NULL, w));
    tdist_pg_opts_t o;
    tdist_pg_opts_init(&o);
    o.timeout_ms = timeout_ms;
    ASSERT_OK(tdist_pg_create_world(*w, &o, pg));
}
