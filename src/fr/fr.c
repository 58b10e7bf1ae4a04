/*
 * fr/fr.c — the flight recorder's rings: configuration, the file-backed
 * mappings, the registry of open recorders, and SIGUSR1.
 *
 * A ring is a file of its own (format.h), mapped shared: every store into
 * it is a store into the page cache, so a process killed by SIGKILL or
 * the OOM killer leaves its last entries for tdist-fr to read. Without
 * TDIST_FR_DIR the files go to a directory of this process
 * (${TMPDIR:-/tmp}/tdist-fr.<pid>), removed again at a clean close.
 *
 * SIGUSR1 (unless TDIST_FR_SIGNAL=0, or the program has its own handler):
 * the handler only posts a semaphore (async-signal-safe); a thread of the
 * recorder, running while any recorder is open, dumps every ring, so the
 * process goes on as it was. SIGTERM (with TDIST_FR_DIR set, unless
 * TDIST_FR_SIGTERM=0 or the program has its own handler): the same
 * thread dumps, then the process dies of SIGTERM as it would have
 * without the handler, within TERM_WAIT_MS at the latest.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "fr/fr.h"
#include "fr/internal.h"

/* 64-byte entries: 128 KiB, 32 pages, for the collectives. A call's entry
 * is a page's every 64th write; where the TLB keeps the ring's pages that
 * costs nothing more than a smaller ring (the project's machine: +5.4 ns
 * an 8-byte all_reduce with 2048 entries, +6.0 with 512). On a machine
 * whose page walks are slow it is up to +40 ns (a VM whose CPUs were far
 * apart: 2.4 us a walk), and TDIST_FR_SIZE=512 keeps the ring in 8 pages
 * (docs/debugging.md, "Cost"). */
#define FR_DEFAULT_SIZE 2048
#define FR_MAX_SIZE (1 << 22)

static pthread_once_t cfg_once = PTHREAD_ONCE_INIT;
static uint32_t cfg_size;
static char cfg_dir[512];
static bool cfg_user_dir;
static bool cfg_signal;
static bool cfg_term;

pthread_mutex_t tdist__fr_lock = PTHREAD_MUTEX_INITIALIZER;
tdist__fr_t *tdist__fr_open_list;
static atomic_bool disabled;

void tdist__fr_enable(bool on) { atomic_store(&disabled, !on); }

bool tdist__fr_use_tsc;

/* Whether every CPU's time-stamp counter runs at one rate, always. */
static bool tsc_usable(void)
{
#if defined(__x86_64__)
    FILE *f = fopen("/proc/cpuinfo", "re");
    if (!f) return false;
    char line[4096];
    bool constant = false, nonstop = false;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "flags", 5) != 0) continue;
        constant = strstr(line, " constant_tsc") != NULL;
        nonstop = strstr(line, " nonstop_tsc") != NULL;
        break;
    }
    fclose(f);
    return constant && nonstop;
#else
    return false;
#endif
}

static void read_config(void)
{
    int64_t n = FR_DEFAULT_SIZE;
    if (tdist__env_int("TDIST_FR_SIZE", 0, FR_MAX_SIZE, &n) != TDIST_OK) n = FR_DEFAULT_SIZE;
    /* a power of two: the ring's slot is a mask, not a division, on every
     * collective's path */
    uint32_t pow2 = 1;
    while (n > 0 && pow2 < (uint64_t)n) pow2 <<= 1;
    cfg_size = n > 0 ? pow2 : 0;
    const char *d = getenv("TDIST_FR_DIR");
    if (d && d[0]) {
        snprintf(cfg_dir, sizeof cfg_dir, "%s", d);
        cfg_user_dir = true;
    } else {
        const char *t = getenv("TMPDIR");
        snprintf(cfg_dir, sizeof cfg_dir, "%s/tdist-fr.%d", t && t[0] ? t : "/tmp", (int)getpid());
    }
    int64_t s = 1;
    if (tdist__env_int("TDIST_FR_SIGNAL", 0, 1, &s) != TDIST_OK) s = 1;
    cfg_signal = s != 0;
    /* SIGTERM dumps only where dumps are kept (TDIST_FR_DIR) */
    s = 1;
    if (tdist__env_int("TDIST_FR_SIGTERM", 0, 1, &s) != TDIST_OK) s = 1;
    cfg_term = s != 0 && cfg_user_dir;
    tdist__fr_use_tsc = tsc_usable();
    tdist_clear_error();
}

const char *tdist__fr_dir(void)
{
    pthread_once(&cfg_once, read_config);
    return cfg_dir;
}

bool tdist__fr_dir_named(void)
{
    pthread_once(&cfg_once, read_config);
    return cfg_user_dir;
}

/* ----------------------------------------------------- SIGUSR1, SIGTERM */

/* Each handler posts a semaphore (async-signal-safe, and no descriptor);
 * the recorder's thread, which runs while any recorder is open, waits on
 * it and dumps. The handlers stay installed; the thread is joined when
 * the last recorder closes, so a process without groups holds nothing.
 *
 * SIGTERM: the thread dumps (as a failure does: not over a failure's
 * dump), then restores the default disposition and raises SIGTERM again,
 * so the process dies of it as it would have without tdist. A watchdog
 * started with the dump does the same after TERM_WAIT_MS, so a dump that
 * cannot finish never keeps the process alive; a second SIGTERM, or one
 * that comes while no recorder thread runs in this process (no group
 * open, or a child forked from the process), ends it at once. */
#define TERM_WAIT_MS 2000

static sem_t sig_sem;
static bool sig_installed; /* either handler */
static pthread_mutex_t th_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_t sig_th;
static bool th_running;
static atomic_bool th_stop;
static atomic_int th_pid;      /* the process whose recorder thread runs (0: none) */
static atomic_bool term_got;   /* a SIGTERM came */

static void on_sigusr1(int sig)
{
    (void)sig;
    int saved = errno;
    (void)sem_post(&sig_sem);
    errno = saved;
}

/* SIGTERM's default disposition, and the signal again: the process dies
 * of it once the handler returns (from a handler: SIGTERM is blocked
 * until then), or at once (from a thread, which unblocks it).
 * Async-signal-safe. */
static void die_of_sigterm(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = SIG_DFL;
    sigemptyset(&sa.sa_mask);
    (void)sigaction(SIGTERM, &sa, NULL);
    (void)raise(SIGTERM);
}

static void on_sigterm(int sig)
{
    (void)sig;
    int saved = errno;
    bool again = atomic_exchange(&term_got, true);
    /* term_got before th_pid: thread_stop_if_idle clears th_pid, then
     * reads term_got */
    if (!again && atomic_load(&th_pid) == (int)getpid())
        (void)sem_post(&sig_sem);
    else
        die_of_sigterm();
    errno = saved;
}

/* From a thread of the recorder: die of SIGTERM now. */
static _Noreturn void thread_dies_of_sigterm(void)
{
    sigset_t term;
    sigemptyset(&term);
    sigaddset(&term, SIGTERM);
    for (;;) {
        die_of_sigterm();
        pthread_sigmask(SIG_UNBLOCK, &term, NULL);
        pause();
    }
}

static void *term_watchdog(void *arg)
{
    (void)arg;
    tdist__sleep_ms(TERM_WAIT_MS);
    thread_dies_of_sigterm();
}

/* The recorder's thread got a SIGTERM: dump, bounded by the watchdog. */
static _Noreturn void dump_and_die(void)
{
    pthread_t wd;
    pthread_attr_t at;
    if (pthread_attr_init(&at) == 0) {
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        (void)pthread_create(&wd, &at, term_watchdog, NULL);
        pthread_attr_destroy(&at);
    }
    (void)tdist__fr_dump_all("SIGTERM", false);
    /* a failure's dump (the peer whose death brought the SIGTERM was seen
     * first) ends before the process does; the watchdog bounds it */
    (void)tdist__fr_dump_settle(TERM_WAIT_MS);
    thread_dies_of_sigterm();
}

static void *sig_thread(void *arg)
{
    (void)arg;
    for (;;) {
        if (sem_wait(&sig_sem) != 0) continue; /* EINTR */
        if (atomic_load(&term_got)) dump_and_die();
        if (atomic_load(&th_stop)) return NULL;
        (void)tdist__fr_dump_all("SIGUSR1", true);
    }
}

/* Install handler for sig unless the program has its own (or ignores
 * it); whether it did. */
static bool install(int sig, void (*handler)(int))
{
    struct sigaction old, sa;
    if (sigaction(sig, NULL, &old) != 0 || (old.sa_flags & SA_SIGINFO) ||
        old.sa_handler != SIG_DFL)
        return false;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = handler;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    return sigaction(sig, &sa, NULL) == 0;
}

/* Once per process, with the first recorder: the handlers. */
static void signal_setup(void)
{
    if (!cfg_signal && !cfg_term) return;
    if (sem_init(&sig_sem, 0, 0) != 0) return;
    if (cfg_signal && install(SIGUSR1, on_sigusr1)) sig_installed = true;
    if (cfg_term && install(SIGTERM, on_sigterm)) sig_installed = true;
}

static pthread_once_t sig_once = PTHREAD_ONCE_INIT;

/* A recorder opened: the dump thread runs (it takes no signal itself). */
static void thread_start(void)
{
    pthread_mutex_lock(&th_mu);
    if (sig_installed && !th_running) {
        /* a SIGUSR1 posted since the last thread stopped (while this
         * recorder was being opened, say) is answered by the new thread */
        atomic_store(&th_stop, false);
        sigset_t all, prev;
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &prev);
        th_running = pthread_create(&sig_th, NULL, sig_thread, NULL) == 0;
        pthread_sigmask(SIG_SETMASK, &prev, NULL);
        if (th_running) atomic_store(&th_pid, (int)getpid());
    }
    pthread_mutex_unlock(&th_mu);
}

/* A recorder closed: the thread ends when none is left. */
static void thread_stop_if_idle(void)
{
    pthread_mutex_lock(&th_mu);
    pthread_mutex_lock(&tdist__fr_lock);
    bool idle = tdist__fr_open_list == NULL;
    pthread_mutex_unlock(&tdist__fr_lock);
    if (idle && th_running) {
        atomic_store(&th_pid, 0);
        atomic_store(&th_stop, true);
        (void)sem_post(&sig_sem);
        pthread_join(sig_th, NULL);
        th_running = false;
        /* what is still posted (the stop's own post, if the thread left
         * on an earlier one; a SIGUSR1 of the last moment) has no
         * recorder left to answer it */
        while (sem_trywait(&sig_sem) == 0) {
        }
        /* a SIGTERM that came as the thread left: it posted, nobody took it */
        if (atomic_load(&term_got)) thread_dies_of_sigterm();
    }
    pthread_mutex_unlock(&th_mu);
}

/* --------------------------------------------------------------- rings */

/* "world~1" -> "world~1"; anything but [A-Za-z0-9._~-] becomes '_'. */
void tdist__fr_file_safe(const char *in, char *out, size_t n)
{
    size_t i = 0;
    for (; in[i] && i + 1 < n; i++) {
        char c = in[i];
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '.' || c == '_' || c == '~' || c == '-';
        out[i] = ok ? c : '_';
    }
    out[i] = '\0';
}

static void fill_header(tdist__fr_header_t *h, const tdist__fr_ident_t *id, uint32_t cap)
{
    memcpy(h->magic, TDIST__FR_MAGIC, sizeof TDIST__FR_MAGIC);
    h->version = TDIST__FR_VERSION;
    h->entry_size = sizeof(tdist__fr_slot_t);
    h->capacity = cap;
    h->rank = id->rank;
    h->size = id->size;
    h->world_rank = id->world_rank;
    h->pid = (int32_t)getpid();
    h->transport = id->transport;
    struct timespec m, r;
    uint64_t t0 = tdist__fr_rdtsc();
    clock_gettime(CLOCK_MONOTONIC, &m);
    uint64_t t1 = tdist__fr_rdtsc();
    clock_gettime(CLOCK_REALTIME, &r);
    h->clock = tdist__fr_use_tsc ? 1 : 0;
    h->tsc0 = t0 + (t1 - t0) / 2;
    h->mono0_ns = (uint64_t)m.tv_sec * 1000000000ull + (uint64_t)m.tv_nsec;
    h->real0_ns = (uint64_t)r.tv_sec * 1000000000ull + (uint64_t)r.tv_nsec;
    snprintf(h->group, sizeof h->group, "%s", id->group);
    snprintf(h->uid, sizeof h->uid, "%s", id->uid);
    snprintf(h->backend, sizeof h->backend, "%s", id->backend ? id->backend : "native");
    if (gethostname(h->host, sizeof h->host - 1) != 0) snprintf(h->host, sizeof h->host, "?");
}

/* Map a new ring file at path; NULL (and why, logged) on failure. The
 * file is made under a name of its own and then renamed over path: a
 * process that still maps an older file of that name (another job in the
 * same directory) keeps its own inode and is never cut short. */
static tdist__fr_t *map_ring(const char *path, uint32_t cap)
{
    static atomic_uint serial;
    size_t len = sizeof(tdist__fr_header_t) + 2 * (size_t)cap * sizeof(tdist__fr_slot_t);
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s.new.%d.%u", path, (int)getpid(), atomic_fetch_add(&serial, 1));
    int fd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) {
        TDIST_LOGD("flight recorder: cannot create %s: %s", tmp, strerror(errno));
        return NULL;
    }
    void *p = MAP_FAILED;
    if (ftruncate(fd, (off_t)len) == 0)
        p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    int err = errno;
    close(fd);
    if (p != MAP_FAILED && rename(tmp, path) != 0) {
        err = errno;
        munmap(p, len);
        p = MAP_FAILED;
    }
    if (p == MAP_FAILED) {
        TDIST_LOGD("flight recorder: cannot map %s: %s", path, strerror(err));
        unlink(tmp);
        return NULL;
    }
    /* Fault every page in now, while the group is being created, not on
     * the first pass of the collectives through the ring: a page fault
     * in a file mapping costs tens of microseconds on a VM, one per 64
     * calls. The file is new, so it holds zeros already. */
    long page = sysconf(_SC_PAGESIZE);
    if (page <= 0) page = 4096;
    for (size_t off = 0; off < len; off += (size_t)page) ((volatile char *)p)[off] = 0;
    tdist__fr_t *fr = calloc(1, sizeof *fr);
    if (!fr) {
        munmap(p, len);
        unlink(path);
        return NULL;
    }
    fr->hdr = p;
    fr->ring = (tdist__fr_slot_t *)((char *)p + sizeof(tdist__fr_header_t));
    fr->cap = cap;
    fr->map_len = len;
    return fr;
}

tdist__fr_t *tdist__fr_open(const tdist__fr_ident_t *id)
{
    pthread_once(&cfg_once, read_config);
    if (cfg_size == 0 || atomic_load(&disabled)) return NULL;
    if (mkdir(cfg_dir, 0700) != 0 && errno != EEXIST) {
        TDIST_LOGD("flight recorder: cannot make %s: %s", cfg_dir, strerror(errno));
        return NULL;
    }
    char uid[128];
    tdist__fr_file_safe(id->uid, uid, sizeof uid);
    char *path = tdist__asprintf("%s/tdist-fr.r%d.%s.ring", cfg_dir, id->world_rank, uid);
    if (!path) return NULL;
    /* the handlers before the ring's file appears: whoever sees the file
     * (tdistrun, a test) may signal the process at once */
    pthread_once(&sig_once, signal_setup);
    tdist__fr_t *fr = map_ring(path, cfg_size);
    if (!fr) {
        free(path);
        return NULL;
    }
    fill_header(fr->hdr, id, cfg_size);
    fr->path = path;
    fr->unlink_at_close = !cfg_user_dir;
    pthread_mutex_lock(&tdist__fr_lock);
    fr->next = tdist__fr_open_list;
    tdist__fr_open_list = fr;
    pthread_mutex_unlock(&tdist__fr_lock);
    thread_start();
    tdist__fr_timeline_opened(fr);
    return fr;
}

void tdist__fr_close(tdist__fr_t *fr)
{
    if (!fr) return;
    pthread_mutex_lock(&tdist__fr_lock);
    for (tdist__fr_t **p = &tdist__fr_open_list; *p; p = &(*p)->next)
        if (*p == fr) {
            *p = fr->next;
            break;
        }
    bool last = tdist__fr_open_list == NULL;
    pthread_mutex_unlock(&tdist__fr_lock);
    tdist__fr_timeline_closing(fr, last);
    atomic_store_explicit((_Atomic int32_t *)&fr->hdr->closed, 1, memory_order_release);
    munmap(fr->hdr, fr->map_len);
    if (fr->unlink_at_close) {
        unlink(fr->path);
        if (last) (void)rmdir(cfg_dir); /* fails, and stays, if dumps are in it */
    }
    free(fr->path);
    free(fr);
    if (last) thread_stop_if_idle();
}

void tdist__fr_event(tdist__fr_t *fr, const char *what, uint64_t a, uint64_t b)
{
    uint64_t id = tdist__fr_begin(fr, TDIST__FR_EVENT, 0, a, b, -1, -1, -1);
    tdist__fr_slot_t *e = tdist__fr_at(fr, id);
    if (!e) return;
    strncpy(e->what, what, sizeof e->what); /* not terminated when it fills the field */
    atomic_store_explicit((_Atomic uint8_t *)&e->state, TDIST__FR_COMPLETED, memory_order_release);
}
