/*
 * transport/shm.c — the shared-memory transport, for ranks on one host
 * (see transport.h and docs/transport.md, "Shared memory").
 *
 * Every rank owns one inbound segment (shm_open "/tdist-<pid>-<random>"):
 * a header (magic, owner, tag, a mapped counter, a futex doorbell) and
 * one single-producer single-consumer byte ring per sender. Its address
 * is "shm:<name>:<pid>". connect maps every peer's segment, writes this
 * rank's handshake (tag, size, rank, pid) into its slot there and bumps
 * that segment's mapped counter; once every peer has mapped this rank's
 * segment, the owner shm_unlinks it, so nothing stays in /dev/shm even if
 * a rank is killed later.
 *
 * Rings: head (written by the sender) and tail (written by the receiver)
 * are ever-increasing 64-bit counters in separate cache lines, C11
 * acquire/release. No syscall on the data path: a waiter spins, yields,
 * then sleeps on its doorbell word, and whoever changes a ring wakes the
 * other side only if it announced it sleeps. A peer that dies closes
 * nothing, so waiters poll a pidfd per peer every few milliseconds.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "transport/ops.h"

#define SEG_MAGIC 0x6d68737470647474ull /* "ttdptshm" */
#define SEG_VERSION 4
#define HDR_BYTES 512
#define CPU_WORDS 16 /* affinity masks in headers: CPUs 0..1023 */
#define SLOT_HDR_BYTES 256
#define DEFAULT_RING (1u << 20)
#define MIN_RING 4096u
#define MAX_RING (1ull << 30)
#define NAME_LEN 64
#define PROBLEM_LEN 160
#define ERRMSG_LEN 1024
#define SPIN_ROUNDS 64           /* pause rounds before yielding */
#define COLL_SPIN_NS 20000ull    /* collective waits: spin this long when every rank has a CPU */
#define YIELD_NS 1000000ull      /* then sched_yield for up to 1 ms */
#define ELSEWHERE_SPIN_NS 3000ull /* oversubscribed: spin this long while the awaited ranks run elsewhere */
#define SLEEP_MAX_MS 4           /* one futex sleep, at most */
#define LIVENESS_NS 2000000ull   /* check peers' pids at least this often while waiting */
#define SETUP_SLEEP_MS 1

/* The owner's header, at offset 0 of its segment. */
typedef struct seg_hdr {
    _Alignas(64) uint64_t magic;
    uint32_t version, size, owner, pid;
    uint64_t tag, ring_bytes;
    uint64_t coll_bytes; /* collective area at coll_offset() */
    uint64_t pidns;      /* inode of the owner's pid namespace (the sweep's check) */
    atomic_uint closed; /* the owner destroyed its transport */
    _Alignas(64) atomic_uint mapped; /* peers that mapped this segment and wrote their hello */
    _Alignas(64) atomic_uint bell;   /* futex word: bumped to wake the owner */
    atomic_uint sleeping;            /* the owner is (about to be) asleep on bell */
    /* the owner's CPU affinity (bit c of word c / 64: it may run on CPU c);
     * all zero when it may run on a CPU >= 64 * CPU_WORDS */
    _Alignas(64) uint64_t cpus[CPU_WORDS];
    /* the CPU the owner ran on when it last posted or waited (-1: not
     * known yet); oversubscribed waits read it, see needed_here() */
    _Alignas(64) atomic_int cpu;
} seg_hdr_t;

/* One ring's control lines, followed by ring_bytes of data. */
typedef struct slot {
    _Alignas(64) atomic_uint hello; /* 1 once the sender's fields below are written */
    uint32_t size, rank, pid;
    uint64_t tag;
    atomic_uint closed; /* the sender destroyed its transport */
    _Alignas(64) atomic_uint_least64_t head; /* bytes written, by the sender */
    _Alignas(64) atomic_uint_least64_t tail; /* bytes read, by the receiver (the owner) */
} slot_t;

_Static_assert(sizeof(seg_hdr_t) <= HDR_BYTES, "header too big");
_Static_assert(sizeof(slot_t) <= SLOT_HDR_BYTES, "slot header too big");

typedef struct peer {
    char name[NAME_LEN]; /* its segment */
    int pid, pidfd;
    uint8_t *seg;        /* its segment, mapped (NULL until connect maps it) */
    size_t seg_len;
    seg_hdr_t *hdr;      /* its header: its doorbell */
    slot_t *out;         /* my ring in its segment */
    uint8_t *out_data;
    uint64_t out_mask, out_head;
    slot_t *in;          /* its ring in my segment */
    uint8_t *in_data;
    uint64_t in_tail;
    tdist__tp_req_t *sq_head, *sq_tail;
    tdist__tp_req_t *rq_head, *rq_tail;
    bool verified; /* its hello in my segment checked */
    bool dead;     /* its process exited */
    bool closed;   /* it destroyed its transport */
    char problem[PROBLEM_LEN];
} peer_t;

typedef struct shm_tp {
    tdist__tp_kind_t kind; /* first: transport.c dispatches on it */
    int rank, size;
    uint64_t tag;
    char name[NAME_LEN];
    char addr[NAME_LEN + 24];
    uint8_t *seg; /* my inbound segment */
    size_t seg_len;
    uint64_t ring_bytes;
    uint64_t coll_bytes; /* collective area of every segment of the mesh */
    seg_hdr_t *hdr;
    atomic_bool unlinked;
    peer_t *pe;          /* size entries, pe[rank] unused */
    struct pollfd *pfd;  /* size entries, for liveness polls */
    int *pfd_peer;
    bool connected;
    bool oversubscribed; /* more ranks than the CPUs they may run on, together */
    int cpu;             /* what hdr->cpu says (this process's copy) */
    uint64_t last_check_ns;
    atomic_bool aborted;
    tdist_status_t err;
    char errmsg[ERRMSG_LEN];
} shm_tp_t;

#define TP(t) ((shm_tp_t *)(void *)(t))

/* ------------------------------------------------------------- helpers */

/* This process's affinity into h->cpus (all zero: unknown, or a CPU beyond
 * the mask's reach). */
static void put_affinity(seg_hdr_t *h, const cpu_set_t *cpus)
{
    memset(h->cpus, 0, sizeof h->cpus);
    if (!cpus) return;
    for (int c = 0; c < CPU_SETSIZE; c++) {
        if (!CPU_ISSET(c, cpus)) continue;
        if (c >= 64 * CPU_WORDS) {
            memset(h->cpus, 0, sizeof h->cpus);
            return;
        }
        h->cpus[c / 64] |= 1ull << (c % 64);
    }
}

static size_t slot_stride(uint64_t ring) { return SLOT_HDR_BYTES + (size_t)ring; }

static size_t rings_end(int size, uint64_t ring)
{
    return HDR_BYTES + (size_t)(size > 1 ? size - 1 : 0) * slot_stride(ring);
}

/* The collective area starts on a page after the rings. */
static size_t coll_offset(int size, uint64_t ring) { return (rings_end(size, ring) + 4095) & ~(size_t)4095; }

static size_t seg_bytes(int size, uint64_t ring, uint64_t coll)
{
    return coll ? coll_offset(size, ring) + (size_t)coll : rings_end(size, ring);
}

/* Index of sender s's slot in owner o's segment. */
static int slot_index(int owner, int sender) { return sender < owner ? sender : sender - 1; }

static slot_t *slot_at(uint8_t *seg, uint64_t ring, int owner, int sender)
{
    return (slot_t *)(void *)(seg + HDR_BYTES + (size_t)slot_index(owner, sender) * slot_stride(ring));
}

static void futex_wake(atomic_uint *w)
{
    syscall(SYS_futex, (uint32_t *)(void *)w, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

static void futex_wait(atomic_uint *w, unsigned val, int ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    syscall(SYS_futex, (uint32_t *)(void *)w, FUTEX_WAIT, val, &ts, NULL, 0);
}

/* Wake the owner of h if it announced it sleeps (no syscall otherwise). */
static void ring_bell(seg_hdr_t *h)
{
    atomic_thread_fence(memory_order_seq_cst);
    if (atomic_load_explicit(&h->sleeping, memory_order_relaxed)) {
        atomic_fetch_add(&h->bell, 1);
        futex_wake(&h->bell);
    }
}

static tdist_status_t sticky(const shm_tp_t *tp) { return tdist__error(tp->err, "%s", tp->errmsg); }

static void finish(tdist__tp_req_t *req, tdist_status_t st) { tdist__tp_req_finish(req, st); }

static tdist_status_t fail(shm_tp_t *tp, tdist_status_t st, const char *fmt, ...) TDIST_PRINTF(3, 4);
static tdist_status_t fail(shm_tp_t *tp, tdist_status_t st, const char *fmt, ...)
{
    if (tp->err == TDIST_OK) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(tp->errmsg, sizeof tp->errmsg, fmt, ap);
        va_end(ap);
        tp->err = st;
        TDIST_LOGW("%s", tp->errmsg);
        for (int p = 0; p < tp->size; p++) {
            peer_t *c = &tp->pe[p];
            for (tdist__tp_req_t *r = c->sq_head, *nx; r; r = nx) {
                nx = r->next;
                finish(r, st);
            }
            for (tdist__tp_req_t *r = c->rq_head, *nx; r; r = nx) {
                nx = r->next;
                finish(r, st);
            }
            c->sq_head = c->sq_tail = c->rq_head = c->rq_tail = NULL;
        }
    }
    return sticky(tp);
}

static tdist_status_t fail_aborted(shm_tp_t *tp)
{
    return fail(tp, TDIST_ERR_ABORTED, "rank %d: transport aborted", tp->rank);
}

static void unlink_own(shm_tp_t *tp)
{
    if (tp->name[0] && !atomic_exchange(&tp->unlinked, true)) shm_unlink(tp->name);
}

/* ------------------------------------------------------------- listen */

/* ------------------------------------------------------ the stale sweep */

/* The inode of this process's pid namespace (0 if unknown). */
static uint64_t pid_ns(void)
{
    struct stat st;
    return stat("/proc/self/ns/pid", &st) == 0 ? (uint64_t)st.st_ino : 0;
}

/* A segment outlives its owner only if every rank of a job was killed
 * before all of them had mapped it (it is unlinked once they have). Once
 * per process, before creating its own segment, remove the segments whose
 * owner is gone: named /tdist-<pid>-<16 hex>, owned by this user, whose
 * header names that pid in this pid namespace, and no process <pid>
 * exists. A segment cut off before its header was written goes after a
 * minute. Best effort: errors are ignored. */
static void sweep_stale(void)
{
    static atomic_bool done;
    if (atomic_exchange(&done, true)) return;
    DIR *d = opendir("/dev/shm");
    if (!d) return;
    uint64_t ns = pid_ns();
    struct dirent *e;
    for (int n = 0; n < 100000 && (e = readdir(d)) != NULL; n++) {
        int pid = 0, end = 0;
        if (sscanf(e->d_name, "tdist-%d-%*16[0-9a-f]%n", &pid, &end) != 1 || end == 0 ||
            e->d_name[end] != '\0' || pid <= 0 || pid == (int)getpid())
            continue;
        if (kill(pid, 0) == 0 || errno != ESRCH) continue; /* alive (or not ours to ask) */
        char name[NAME_LEN];
        size_t nl = strlen(e->d_name);
        if (nl + 2 > sizeof name) continue;
        name[0] = '/';
        memcpy(name + 1, e->d_name, nl + 1);
        int fd = shm_open(name, O_RDONLY | O_CLOEXEC, 0);
        if (fd < 0) continue;
        struct stat st;
        bool stale = false;
        if (fstat(fd, &st) == 0 && st.st_uid == geteuid()) {
            bool old = time(NULL) - st.st_mtime > 60;
            if ((size_t)st.st_size >= sizeof(seg_hdr_t)) {
                seg_hdr_t *h = mmap(NULL, sizeof(seg_hdr_t), PROT_READ, MAP_SHARED, fd, 0);
                if (h != MAP_FAILED) {
                    uint64_t magic = __atomic_load_n(&h->magic, __ATOMIC_ACQUIRE);
                    stale = (magic == SEG_MAGIC && h->pid == (uint32_t)pid && ns &&
                             h->pidns == ns) ||
                            (magic == 0 && old); /* cut off before its header was done */
                    munmap(h, sizeof(seg_hdr_t));
                }
            } else {
                stale = old;
            }
        }
        close(fd);
        if (stale) shm_unlink(name);
    }
    closedir(d);
}

tdist_status_t tdist__shm_listen(tdist__tp_kind_t kind, int rank, int size,
                                 const tdist__tp_opts_t *opts, tdist__tp_t **out)
{
    static const char fn[] = "tdist__tp_listen";
    TDIST_ARG_CHECK(out != NULL, fn);
    TDIST_ARG_CHECK(opts != NULL, fn);
    if (kind != TDIST__TP_SHM)
        return tdist__error(TDIST_ERR_NOT_SUPPORTED, "%s: transport kind %d is not supported", fn,
                            (int)kind);
    if (size < 1 || size > 4096 || rank < 0 || rank >= size)
        return tdist__error(TDIST_ERR_INVALID_ARG, "%s: rank %d of size %d is out of range", fn,
                            rank, size);
    sweep_stale();
    uint64_t ring = opts->shm_ring_bytes ? opts->shm_ring_bytes : DEFAULT_RING;
    if (ring > MAX_RING)
        return tdist__error(TDIST_ERR_INVALID_ARG, "%s: rank %d: shm_ring_bytes %zu is above %llu",
                            fn, rank, opts->shm_ring_bytes, (unsigned long long)MAX_RING);
    uint64_t r2 = MIN_RING;
    while (r2 < ring) r2 <<= 1;
    ring = r2;
    if (opts->shm_coll_bytes > MAX_RING)
        return tdist__error(TDIST_ERR_INVALID_ARG, "%s: rank %d: shm_coll_bytes %zu is above %llu",
                            fn, rank, opts->shm_coll_bytes, (unsigned long long)MAX_RING);
    uint64_t coll = ((uint64_t)opts->shm_coll_bytes + 4095) & ~(uint64_t)4095;

    shm_tp_t *tp = calloc(1, sizeof *tp);
    peer_t *pe = calloc((size_t)size, sizeof *pe);
    struct pollfd *pfd = calloc((size_t)size, sizeof *pfd);
    int *pfd_peer = calloc((size_t)size, sizeof *pfd_peer);
    if (!tp || !pe || !pfd || !pfd_peer) {
        free(tp);
        free(pe);
        free(pfd);
        free(pfd_peer);
        return tdist__error(TDIST_ERR_NO_MEMORY, "%s: rank %d: out of memory for %d peers", fn,
                            rank, size);
    }
    tp->kind = kind;
    tp->rank = rank;
    tp->size = size;
    tp->tag = opts->tag;
    tp->ring_bytes = ring;
    tp->coll_bytes = coll;
    /* Until connect has seen the peers' affinities (see oversubscribed()):
     * more ranks than CPUs this process may run on. */
    cpu_set_t cpus;
    bool have_cpus = sched_getaffinity(0, sizeof cpus, &cpus) == 0;
    tp->oversubscribed = size > (have_cpus ? CPU_COUNT(&cpus) : 1);
    tp->pe = pe;
    tp->pfd = pfd;
    tp->pfd_peer = pfd_peer;
    atomic_init(&tp->aborted, false);
    atomic_init(&tp->unlinked, true); /* nothing to unlink yet */
    for (int p = 0; p < size; p++) pe[p].pidfd = -1;

    tdist_status_t st;
    tp->seg_len = seg_bytes(size, ring, coll);
    int fd = -1;
    for (int attempt = 0; attempt < 16 && fd < 0; attempt++) {
        uint64_t rnd = 0;
        if (getrandom(&rnd, sizeof rnd, GRND_NONBLOCK) != (ssize_t)sizeof rnd)
            rnd = tdist__now_ns() ^ ((uint64_t)(uintptr_t)tp << 16) ^ (uint64_t)attempt;
        snprintf(tp->name, sizeof tp->name, "/tdist-%d-%016llx", (int)getpid(),
                 (unsigned long long)rnd);
        fd = shm_open(tp->name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (fd < 0 && errno != EEXIST) break;
    }
    if (fd < 0) {
        st = tdist__error_errno(errno, "rank %d: shm transport: shm_open(%s)", rank, tp->name);
        tp->name[0] = '\0';
        goto fail;
    }
    atomic_store(&tp->unlinked, false);
    if (ftruncate(fd, (off_t)tp->seg_len) != 0) {
        st = tdist__error_errno(errno, "rank %d: shm transport: ftruncate(%s, %zu)", rank,
                                tp->name, tp->seg_len);
        close(fd);
        goto fail;
    }
    void *m = mmap(NULL, tp->seg_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    int merr = errno;
    close(fd);
    if (m == MAP_FAILED) {
        st = tdist__error_errno(merr, "rank %d: shm transport: mmap(%s, %zu)", rank, tp->name,
                                tp->seg_len);
        goto fail;
    }
    tp->seg = m;
    tp->hdr = (seg_hdr_t *)m;
    tp->hdr->version = SEG_VERSION;
    tp->hdr->size = (uint32_t)size;
    tp->hdr->owner = (uint32_t)rank;
    tp->hdr->pid = (uint32_t)getpid();
    tp->hdr->pidns = pid_ns();
    tp->hdr->tag = tp->tag;
    tp->hdr->ring_bytes = ring;
    tp->hdr->coll_bytes = coll;
    put_affinity(tp->hdr, have_cpus ? &cpus : NULL);
    tp->cpu = -1;
    atomic_store(&tp->hdr->cpu, -1);
    atomic_thread_fence(memory_order_release);
    __atomic_store_n(&tp->hdr->magic, SEG_MAGIC, __ATOMIC_RELEASE);
    snprintf(tp->addr, sizeof tp->addr, "shm:%s:%d", tp->name, (int)getpid());
    TDIST_LOGD("rank %d: shm transport segment %s (%zu bytes, rings of %llu)", rank, tp->name,
               tp->seg_len, (unsigned long long)ring);
    *out = (tdist__tp_t *)(void *)tp;
    return TDIST_OK;
fail:
    tdist__shm_destroy((tdist__tp_t *)(void *)tp);
    return st;
}

const char *tdist__shm_address(const tdist__tp_t *t)
{
    return t ? ((const shm_tp_t *)(const void *)t)->addr : NULL;
}

/* ------------------------------------------------------------ liveness */

static void describe_loss(const shm_tp_t *tp, int p, const tdist__tp_req_t *req, char *what,
                          size_t n)
{
    (void)tp;
    (void)p;
    what[0] = '\0';
    if (req)
        snprintf(what, n, " (%s %zu bytes, %zu done)", req->is_send ? "sending" : "receiving",
                 req->len, req->done);
}

static tdist_status_t peer_lost(shm_tp_t *tp, int p, const tdist__tp_req_t *req)
{
    peer_t *c = &tp->pe[p];
    char what[96];
    describe_loss(tp, p, req, what, sizeof what);
    if (c->dead)
        return fail(tp, TDIST_ERR_CONNECTION, "rank %d: peer rank %d (pid %d) exited%s", tp->rank,
                    p, c->pid, what);
    return fail(tp, TDIST_ERR_CONNECTION, "rank %d: peer rank %d (pid %d) closed its transport%s",
                tp->rank, p, c->pid, what);
}

/* Note peers whose process exited or who destroyed their transport (one
 * poll over the pidfds, timeout 0). Returns whether a peer was newly lost. */
static bool check_peers(shm_tp_t *tp)
{
    tp->last_check_ns = tdist__now_ns();
    bool news = false;
    int n = 0;
    for (int p = 0; p < tp->size; p++) {
        peer_t *c = &tp->pe[p];
        if (p == tp->rank || c->dead) continue;
        if (!c->closed && ((c->hdr && atomic_load_explicit(&c->hdr->closed, memory_order_acquire)) ||
                           (c->in && atomic_load_explicit(&c->in->closed, memory_order_acquire)))) {
            c->closed = true;
            news = true;
            TDIST_LOGD("rank %d: peer rank %d (pid %d) closed its transport", tp->rank, p, c->pid);
        }
        if (c->pidfd >= 0) {
            tp->pfd[n] = (struct pollfd){.fd = c->pidfd, .events = POLLIN};
            tp->pfd_peer[n++] = p;
        } else if (c->pid > 0 && kill(c->pid, 0) != 0 && errno == ESRCH) {
            c->dead = true;
            news = true;
        }
    }
    if (n > 0 && poll(tp->pfd, (nfds_t)n, 0) > 0) {
        for (int i = 0; i < n; i++) {
            if (!tp->pfd[i].revents) continue;
            peer_t *c = &tp->pe[tp->pfd_peer[i]];
            c->dead = true;
            news = true;
            TDIST_LOGD("rank %d: peer rank %d (pid %d) exited", tp->rank, tp->pfd_peer[i], c->pid);
        }
    }
    return news;
}

/* ------------------------------------------------------------ connect */

/* Parse "shm:<name>:<pid>". */
static bool parse_addr(const char *s, char *name, size_t nlen, int *pid)
{
    if (strncmp(s, "shm:/", 5) != 0) return false;
    const char *colon = strrchr(s, ':');
    if (colon == s + 3) return false;
    size_t len = (size_t)(colon - (s + 4));
    if (len < 2 || len >= nlen) return false;
    int64_t v;
    if (tdist__parse_int(colon + 1, 1, INT_MAX, &v) != 0) return false;
    memcpy(name, s + 4, len);
    name[len] = '\0';
    if (strchr(name + 1, '/')) return false;
    *pid = (int)v;
    return true;
}

static void set_problem(peer_t *c, const char *fmt, ...) TDIST_PRINTF(2, 3);
static void set_problem(peer_t *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->problem, sizeof c->problem, fmt, ap);
    va_end(ap);
}

/* Try to map peer p's segment and write this rank's hello into it.
 * Returns 1 when done, 0 to retry later, or a failure (-1, tp failed). */
static int map_peer(shm_tp_t *tp, int p)
{
    peer_t *c = &tp->pe[p];
    int fd = shm_open(c->name, O_RDWR | O_CLOEXEC, 0);
    if (fd < 0) {
        set_problem(c, "its segment %s cannot be opened yet: %s", c->name, strerror(errno));
        if (errno == ENOENT || errno == EINTR) return 0;
        fail(tp, TDIST_ERR_SYSTEM, "rank %d: shm transport set-up: peer rank %d (pid %d): "
             "shm_open(%s): %s", tp->rank, p, c->pid, c->name, strerror(errno));
        return -1;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0 || (size_t)sb.st_size < HDR_BYTES) {
        close(fd);
        set_problem(c, "its segment %s is not sized yet", c->name);
        return 0;
    }
    void *m = mmap(NULL, (size_t)sb.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    int merr = errno;
    close(fd);
    if (m == MAP_FAILED) {
        fail(tp, TDIST_ERR_SYSTEM, "rank %d: shm transport set-up: peer rank %d (pid %d): "
             "mmap(%s): %s", tp->rank, p, c->pid, c->name, strerror(merr));
        return -1;
    }
    seg_hdr_t *h = m;
    const char *why = NULL;
    char wb[PROBLEM_LEN];
    if (__atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) != SEG_MAGIC) {
        munmap(m, (size_t)sb.st_size);
        set_problem(c, "its segment %s is not initialised yet", c->name);
        return 0;
    }
    if (h->version != SEG_VERSION) {
        snprintf(wb, sizeof wb, "version %u, expected %u", h->version, SEG_VERSION);
        why = wb;
    } else if (h->tag != tp->tag) {
        snprintf(wb, sizeof wb, "tag 0x%016llx, expected 0x%016llx (another job, group or "
                 "generation)", (unsigned long long)h->tag, (unsigned long long)tp->tag);
        why = wb;
    } else if (h->size != (uint32_t)tp->size || h->owner != (uint32_t)p ||
               h->pid != (uint32_t)c->pid) {
        snprintf(wb, sizeof wb, "rank %u of %u (pid %u), expected rank %d of %d (pid %d)",
                 h->owner, h->size, h->pid, p, tp->size, c->pid);
        why = wb;
    } else if (h->ring_bytes < MIN_RING || h->ring_bytes > MAX_RING ||
               (h->ring_bytes & (h->ring_bytes - 1)) ||
               (size_t)sb.st_size < seg_bytes(tp->size, h->ring_bytes, h->coll_bytes)) {
        snprintf(wb, sizeof wb, "ring size %llu does not fit a segment of %lld bytes",
                 (unsigned long long)h->ring_bytes, (long long)sb.st_size);
        why = wb;
    } else if (h->coll_bytes != tp->coll_bytes) {
        snprintf(wb, sizeof wb, "a collective area of %llu bytes, expected %llu",
                 (unsigned long long)h->coll_bytes, (unsigned long long)tp->coll_bytes);
        why = wb;
    }
    if (why) {
        munmap(m, (size_t)sb.st_size);
        fail(tp, TDIST_ERR_CONNECTION, "rank %d: shm transport set-up: the segment %s of peer "
             "rank %d says %s", tp->rank, c->name, p, why);
        return -1;
    }
    c->seg = m;
    c->seg_len = (size_t)sb.st_size;
    c->hdr = h;
    c->out = slot_at(c->seg, h->ring_bytes, p, tp->rank);
    c->out_data = (uint8_t *)c->out + SLOT_HDR_BYTES;
    c->out_mask = h->ring_bytes - 1;
    c->out_head = atomic_load(&c->out->head);
    c->out->size = (uint32_t)tp->size;
    c->out->rank = (uint32_t)tp->rank;
    c->out->pid = (uint32_t)getpid();
    c->out->tag = tp->tag;
    atomic_store_explicit(&c->out->hello, 1, memory_order_release);
    atomic_fetch_add(&h->mapped, 1);
    ring_bell(h);
    return 1;
}

/* Check peer p's hello in this rank's segment. 1 ok, 0 not yet, -1 failed. */
static int verify_peer(shm_tp_t *tp, int p)
{
    peer_t *c = &tp->pe[p];
    slot_t *s = c->in;
    if (!atomic_load_explicit(&s->hello, memory_order_acquire)) {
        set_problem(c, "has not mapped this rank's segment yet (has it called connect?)");
        return 0;
    }
    if (s->tag != tp->tag || s->size != (uint32_t)tp->size || s->rank != (uint32_t)p ||
        s->pid != (uint32_t)c->pid) {
        fail(tp, TDIST_ERR_CONNECTION,
             "rank %d: shm transport set-up: the hello in peer rank %d's slot says rank %u of %u "
             "(pid %u, tag 0x%016llx), expected rank %d of %d (pid %d, tag 0x%016llx)",
             tp->rank, p, s->rank, s->size, s->pid, (unsigned long long)s->tag, p, tp->size,
             c->pid, (unsigned long long)tp->tag);
        return -1;
    }
    c->verified = true;
    return 1;
}

/* Whether the mesh's ranks are more than the CPUs they may run on, all
 * together (the union of their affinities, read from every header once all
 * are mapped). Waiters then yield at once: a spinning waiter only delays
 * the peer it waits for. Ranks bound one per CPU (tdistrun --bind-to core,
 * mpirun's default) are not oversubscribed, though each sees one CPU.
 * Every rank must get the same answer (the shm collectives pick their
 * small-message path by it), so an unknown mask falls back to the host's
 * CPU count, not to this rank's own affinity. */
static bool oversubscribed(const shm_tp_t *tp)
{
    uint64_t all[CPU_WORDS] = {0};
    for (int p = 0; p < tp->size; p++) {
        const seg_hdr_t *h = p == tp->rank ? tp->hdr : tp->pe[p].hdr;
        uint64_t any = 0;
        for (int i = 0; h && i < CPU_WORDS; i++) any |= h->cpus[i];
        if (!any) {
            long conf = sysconf(_SC_NPROCESSORS_CONF);
            return tp->size > (conf > 0 ? conf : 1);
        }
        for (int i = 0; i < CPU_WORDS; i++) all[i] |= h->cpus[i];
    }
    int n = 0;
    for (int i = 0; i < CPU_WORDS; i++) n += __builtin_popcountll(all[i]);
    return tp->size > n;
}

tdist_status_t tdist__shm_connect(tdist__tp_t *t, const char *const *addrs, int64_t deadline_ms)
{
    static const char fn[] = "tdist__tp_connect";
    TDIST_ARG_CHECK(t != NULL, fn);
    TDIST_ARG_CHECK(addrs != NULL, fn);
    shm_tp_t *tp = TP(t);
    if (tp->err != TDIST_OK) return sticky(tp);
    if (tp->connected)
        return tdist__error(TDIST_ERR_INVALID_ARG, "%s: rank %d: already connected", fn, tp->rank);
    for (int p = 0; p < tp->size; p++) {
        if (p == tp->rank) continue;
        peer_t *c = &tp->pe[p];
        if (!addrs[p] || !parse_addr(addrs[p], c->name, sizeof c->name, &c->pid))
            return tdist__error(TDIST_ERR_INVALID_ARG,
                                "%s: rank %d: address of peer rank %d (\"%.80s\") is not "
                                "\"shm:/<name>:<pid>\"",
                                fn, tp->rank, p, addrs[p] ? addrs[p] : "(null)");
    }
    int64_t start = tdist__now_ms();
    for (int p = 0; p < tp->size; p++) {
        if (p == tp->rank) continue;
        peer_t *c = &tp->pe[p];
        c->in = slot_at(tp->seg, tp->ring_bytes, tp->rank, p);
        c->in_data = (uint8_t *)c->in + SLOT_HDR_BYTES;
        c->in_tail = atomic_load(&c->in->tail);
        c->pidfd = (int)syscall(SYS_pidfd_open, (pid_t)c->pid, 0u);
        if (c->pidfd < 0 && errno == ESRCH) c->dead = true;
        if (c->pidfd >= 0) fcntl(c->pidfd, F_SETFD, FD_CLOEXEC);
        set_problem(c, "not mapped yet");
    }
    int missing = tp->size - 1;
    while (tp->err == TDIST_OK) {
        if (atomic_load(&tp->aborted)) {
            fail_aborted(tp);
            break;
        }
        check_peers(tp);
        missing = 0;
        for (int p = 0; p < tp->size && tp->err == TDIST_OK; p++) {
            if (p == tp->rank) continue;
            peer_t *c = &tp->pe[p];
            /* Set-up with p is done once each has mapped the other (its
             * hello in this rank's segment). A peer that got there first
             * may already have closed again (a group created and destroyed
             * at once): that is no set-up failure, the mapped segments
             * stay valid, and later calls see the closed peer. */
            bool done = (c->seg || map_peer(tp, p) > 0) && (c->verified || verify_peer(tp, p) > 0);
            if (tp->err != TDIST_OK || done) continue;
            if (c->dead || c->closed) {
                shm_unlink(c->name); /* it cannot unlink it any more */
                fail(tp, TDIST_ERR_CONNECTION,
                     "rank %d: shm transport set-up: peer rank %d (pid %d) %s", tp->rank, p,
                     c->pid, c->dead ? "exited" : "closed its transport");
                break;
            }
            missing++;
        }
        if (tp->err != TDIST_OK) break;
        if (atomic_load(&tp->hdr->mapped) >= (unsigned)(tp->size - 1)) unlink_own(tp);
        if (missing == 0) break;
        int64_t now = tdist__now_ms();
        if (now >= deadline_ms) {
            char msg[ERRMSG_LEN];
            size_t used = (size_t)snprintf(msg, sizeof msg,
                                           "rank %d: shm transport set-up timed out after %lld "
                                           "ms; missing peer ranks:",
                                           tp->rank, (long long)(now - start));
            int listed = 0;
            for (int p = 0; p < tp->size && used < sizeof msg; p++) {
                peer_t *c = &tp->pe[p];
                if (p == tp->rank || (c->seg && c->verified)) continue;
                used += (size_t)snprintf(msg + used, sizeof msg - used, "%s peer rank %d (pid %d): %s",
                                         listed++ ? ";" : "", p, c->pid, c->problem);
            }
            fail(tp, TDIST_ERR_TIMEOUT, "%s", msg);
            break;
        }
        /* Sleep on the doorbell: a peer's hello rings it. */
        atomic_store(&tp->hdr->sleeping, 1);
        atomic_thread_fence(memory_order_seq_cst);
        unsigned b = atomic_load(&tp->hdr->bell);
        if (atomic_load(&tp->hdr->mapped) < (unsigned)(tp->size - 1) || missing > 0)
            futex_wait(&tp->hdr->bell, b, (int)TDIST_MIN(SETUP_SLEEP_MS, deadline_ms - now));
        atomic_store(&tp->hdr->sleeping, 0);
    }
    if (tp->err != TDIST_OK) {
        unlink_own(tp);
        return sticky(tp);
    }
    tp->connected = true;
    tp->oversubscribed = oversubscribed(tp);
    TDIST_LOGD("rank %d: shm transport mesh of %d ranks up in %lld ms", tp->rank, tp->size,
               (long long)(tdist__now_ms() - start));
    return TDIST_OK;
}

/* --------------------------------------------------------------- data */

static tdist_status_t post(shm_tp_t *tp, tdist__tp_req_t *req, int peer, void *buf, size_t len,
                           bool is_send, const char *fn)
{
    TDIST_ARG_CHECK(tp != NULL, fn);
    TDIST_CHECK(tdist__tp_check_post(tp->rank, tp->size, req != NULL, peer, buf, len, fn));
    if (tp->err != TDIST_OK) return sticky(tp);
    if (atomic_load(&tp->aborted)) return fail_aborted(tp);
    if (!tp->connected)
        return tdist__error(TDIST_ERR_INVALID_ARG, "%s: rank %d: transport is not connected", fn,
                            tp->rank);
    peer_t *c = &tp->pe[peer];
    if (is_send)
        tdist__tp_req_enqueue(req, peer, buf, len, true, &c->sq_head, &c->sq_tail);
    else
        tdist__tp_req_enqueue(req, peer, buf, len, false, &c->rq_head, &c->rq_tail);
    return TDIST_OK;
}

tdist_status_t tdist__shm_post_send(tdist__tp_t *tp, tdist__tp_req_t *req, int peer,
                                    const void *buf, size_t len)
{
    return post(TP(tp), req, peer, (void *)buf, len, true, "tdist__tp_post_send");
}

tdist_status_t tdist__shm_post_recv(tdist__tp_t *tp, tdist__tp_req_t *req, int peer, void *buf,
                                    size_t len)
{
    return post(TP(tp), req, peer, buf, len, false, "tdist__tp_post_recv");
}

/* Largest copy between two publications, so the other side can start on
 * a part while this side copies the next. */
static uint64_t chunk_of(uint64_t ring) { return ring >= (1u << 18) ? ring / 4 : ring; }

/* Copy queued sends into peer p's ring as space allows. Returns whether a
 * byte moved. */
static bool drive_send(shm_tp_t *tp, int p)
{
    peer_t *c = &tp->pe[p];
    bool moved = false;
    uint64_t ring = c->out_mask + 1, chunk = chunk_of(ring);
    while (c->sq_head && tp->err == TDIST_OK) {
        tdist__tp_req_t *req = c->sq_head;
        if (c->dead || c->closed) {
            peer_lost(tp, p, req);
            break;
        }
        uint64_t head = c->out_head;
        uint64_t tail = atomic_load_explicit(&c->out->tail, memory_order_acquire);
        uint64_t space = ring - (head - tail);
        if (space == 0) break;
        size_t n = req->len - req->done;
        if (n > space) n = (size_t)space;
        if (n > chunk) n = (size_t)chunk;
        size_t off = (size_t)(head & c->out_mask);
        size_t first = TDIST_MIN(n, (size_t)ring - off);
        memcpy(c->out_data + off, req->buf + req->done, first);
        if (n > first) memcpy(c->out_data, req->buf + req->done + first, n - first);
        c->out_head = head + n;
        atomic_store_explicit(&c->out->head, head + n, memory_order_release);
        moved = true;
        req->done += n;
        if (req->done == req->len) {
            c->sq_head = req->next;
            if (!c->sq_head) c->sq_tail = NULL;
            finish(req, TDIST_OK);
        }
        ring_bell(c->hdr);
    }
    return moved;
}

/* Fill queued receives from peer p's ring in this rank's segment. */
static bool drive_recv(shm_tp_t *tp, int p)
{
    peer_t *c = &tp->pe[p];
    bool moved = false;
    uint64_t ring = tp->ring_bytes, mask = ring - 1, chunk = chunk_of(ring);
    while (c->rq_head && tp->err == TDIST_OK) {
        tdist__tp_req_t *req = c->rq_head;
        uint64_t tail = c->in_tail;
        uint64_t head = atomic_load_explicit(&c->in->head, memory_order_acquire);
        uint64_t avail = head - tail;
        if (avail == 0) {
            if (c->dead || c->closed) peer_lost(tp, p, req); /* drained: nothing more comes */
            break;
        }
        size_t n = req->len - req->done;
        if (n > avail) n = (size_t)avail;
        if (n > chunk) n = (size_t)chunk;
        size_t off = (size_t)(tail & mask);
        size_t first = TDIST_MIN(n, (size_t)ring - off);
        memcpy(req->buf + req->done, c->in_data + off, first);
        if (n > first) memcpy(req->buf + req->done + first, c->in_data, n - first);
        c->in_tail = tail + n;
        atomic_store_explicit(&c->in->tail, tail + n, memory_order_release);
        moved = true;
        req->done += n;
        if (req->done == req->len) {
            c->rq_head = req->next;
            if (!c->rq_head) c->rq_tail = NULL;
            finish(req, TDIST_OK);
        }
        ring_bell(c->hdr);
    }
    return moved;
}

static bool sweep(shm_tp_t *tp)
{
    bool moved = false;
    for (int p = 0; p < tp->size && tp->err == TDIST_OK; p++) {
        if (tp->pe[p].sq_head) moved |= drive_send(tp, p);
        if (tp->pe[p].rq_head) moved |= drive_recv(tp, p);
    }
    return moved;
}

tdist_status_t tdist__shm_progress(tdist__tp_t *t, int timeout_ms)
{
    TDIST_ARG_CHECK(t != NULL, "tdist__tp_progress");
    shm_tp_t *tp = TP(t);
    if (tp->err != TDIST_OK) return sticky(tp);
    if (atomic_load(&tp->aborted)) return fail_aborted(tp);
    if (!tp->connected)
        return tdist__error(TDIST_ERR_INVALID_ARG, "tdist__tp_progress: rank %d: transport is not "
                            "connected", tp->rank);
    bool moved = sweep(tp);
    uint64_t now = tdist__now_ns();
    if (now - tp->last_check_ns >= LIVENESS_NS && check_peers(tp)) moved |= sweep(tp);
    if (tp->err != TDIST_OK) return sticky(tp);
    if (moved || timeout_ms == 0) return TDIST_OK;

    uint64_t start = now;
    uint64_t end = timeout_ms < 0 ? UINT64_MAX : start + (uint64_t)timeout_ms * 1000000ull;
    /* 1: spin briefly with a pause instruction. */
    for (int i = 0; i < SPIN_ROUNDS; i++) {
        tdist__cpu_relax();
        if (sweep(tp) || tp->err != TDIST_OK) goto out;
        if (atomic_load_explicit(&tp->aborted, memory_order_relaxed)) goto out;
    }
    /* 2: yield the CPU (a peer sharing this core may be the one we wait
     * for) for up to ~1 ms. */
    for (;;) {
        now = tdist__now_ns();
        if (now - start >= YIELD_NS || now >= end) break;
        sched_yield();
        if (sweep(tp) || tp->err != TDIST_OK) goto out;
        if (atomic_load_explicit(&tp->aborted, memory_order_relaxed)) goto out;
    }
    /* 3: sleep on the doorbell, a few ms at a time, checking peers'
     * liveness before every sleep. */
    for (;;) {
        now = tdist__now_ns();
        if (now >= end) break;
        if (now - tp->last_check_ns >= LIVENESS_NS && check_peers(tp)) {
            sweep(tp);
            break;
        }
        atomic_store(&tp->hdr->sleeping, 1);
        atomic_thread_fence(memory_order_seq_cst);
        unsigned b = atomic_load(&tp->hdr->bell);
        if (sweep(tp) || tp->err != TDIST_OK || atomic_load(&tp->aborted)) {
            atomic_store(&tp->hdr->sleeping, 0);
            break;
        }
        uint64_t left_ms = end == UINT64_MAX ? SLEEP_MAX_MS : (end - now + 999999) / 1000000;
        futex_wait(&tp->hdr->bell, b, (int)TDIST_MIN(left_ms, (uint64_t)SLEEP_MAX_MS));
        atomic_store(&tp->hdr->sleeping, 0);
        if (sweep(tp) || tp->err != TDIST_OK || atomic_load(&tp->aborted)) break;
    }
out:
    if (tp->err != TDIST_OK) return sticky(tp);
    if (atomic_load(&tp->aborted)) return fail_aborted(tp);
    return TDIST_OK;
}

static tdist_status_t wait_timeout(shm_tp_t *tp, tdist__tp_req_t *const *reqs, size_t n,
                                   int64_t start)
{
    char msg[ERRMSG_LEN];
    size_t used = (size_t)snprintf(msg, sizeof msg,
                                   "rank %d: transport wait timed out after %lld ms; still owed:",
                                   tp->rank, (long long)(tdist__now_ms() - start));
    size_t listed = 0, open = 0;
    for (size_t i = 0; i < n; i++) {
        const tdist__tp_req_t *r = reqs[i];
        if (r->finished) continue;
        open++;
        if (listed == 8 || used >= sizeof msg) continue;
        used += (size_t)snprintf(msg + used, sizeof msg - used,
                                 "%s %s peer rank %d (pid %d) %zu/%zu bytes", listed ? ";" : "",
                                 r->is_send ? "send to" : "receive from", r->peer,
                                 tp->pe[r->peer].pid, r->done, r->len);
        listed++;
    }
    if (open > listed && used < sizeof msg)
        snprintf(msg + used, sizeof msg - used, "; and %zu more", open - listed);
    return tdist__error(TDIST_ERR_TIMEOUT, "%s", msg);
}

tdist_status_t tdist__shm_wait(tdist__tp_t *t, tdist__tp_req_t *const *reqs, size_t n,
                               int64_t deadline_ms)
{
    static const char fn[] = "tdist__tp_wait";
    TDIST_ARG_CHECK(t != NULL, fn);
    TDIST_ARG_CHECK(reqs != NULL || n == 0, fn);
    shm_tp_t *tp = TP(t);
    for (size_t i = 0; i < n; i++)
        if (!reqs[i])
            return tdist__error(TDIST_ERR_INVALID_ARG, "%s: rank %d: request %zu is NULL", fn,
                                tp->rank, i);
    int64_t start = tdist__now_ms();
    for (;;) {
        size_t open = 0;
        tdist_status_t worst = TDIST_OK;
        for (size_t i = 0; i < n; i++) {
            if (!reqs[i]->finished)
                open++;
            else if (reqs[i]->status != TDIST_OK)
                worst = reqs[i]->status;
        }
        if (worst != TDIST_OK)
            return tp->err != TDIST_OK ? sticky(tp)
                                       : tdist__error(worst, "rank %d: a request failed", tp->rank);
        if (open == 0) return TDIST_OK;
        if (tp->err != TDIST_OK) return sticky(tp);
        int64_t now = tdist__now_ms();
        bool late = now >= deadline_ms;
        TDIST_CHECK(tdist__shm_progress(t, late ? 0 : tdist__ms_left(deadline_ms)));
        if (late) {
            bool all = true;
            for (size_t i = 0; i < n; i++) all = all && reqs[i]->finished;
            if (!all) return wait_timeout(tp, reqs, n, start);
        }
    }
}

static tdist_status_t wait_blocking(shm_tp_t *tp, tdist__tp_req_t *const *reqs, size_t n,
                                    int64_t deadline_ms)
{
    tdist_status_t st = tdist__shm_wait((tdist__tp_t *)(void *)tp, reqs, n, deadline_ms);
    if (st == TDIST_ERR_TIMEOUT)
        return fail(tp, TDIST_ERR_TIMEOUT, "%s (a blocking call timed out: the transport is failed)",
                    tdist_last_error());
    return st;
}

tdist_status_t tdist__shm_send(tdist__tp_t *tp, int peer, const void *buf, size_t len,
                               int64_t deadline_ms)
{
    tdist__tp_req_t req, *r = &req;
    TDIST_CHECK(tdist__shm_post_send(tp, &req, peer, buf, len));
    return wait_blocking(TP(tp), &r, 1, deadline_ms);
}

tdist_status_t tdist__shm_recv(tdist__tp_t *tp, int peer, void *buf, size_t len,
                               int64_t deadline_ms)
{
    tdist__tp_req_t req, *r = &req;
    TDIST_CHECK(tdist__shm_post_recv(tp, &req, peer, buf, len));
    return wait_blocking(TP(tp), &r, 1, deadline_ms);
}

tdist_status_t tdist__shm_sendrecv(tdist__tp_t *tp, int to, const void *sbuf, size_t slen,
                                   int from, void *rbuf, size_t rlen, int64_t deadline_ms)
{
    tdist__tp_req_t sreq, rreq, *rs[2] = {&sreq, &rreq};
    TDIST_CHECK(tdist__shm_post_send(tp, &sreq, to, sbuf, slen));
    tdist_status_t st = tdist__shm_post_recv(tp, &rreq, from, rbuf, rlen);
    if (st != TDIST_OK) {
        if (!sreq.finished)
            return fail(TP(tp), st, "%s (the send half was posted: the transport is failed)",
                        tdist_last_error());
        return st;
    }
    return wait_blocking(TP(tp), rs, 2, deadline_ms);
}

/* ------------------------------------------------- collective area */

void *tdist__shm_area(tdist__tp_t *t, int r, size_t *bytes)
{
    if (!t) return NULL;
    shm_tp_t *tp = TP(t);
    if (!tp->connected || !tp->coll_bytes || r < 0 || r >= tp->size) return NULL;
    if (bytes) *bytes = (size_t)tp->coll_bytes;
    if (r == tp->rank) return tp->seg + coll_offset(tp->size, tp->ring_bytes);
    peer_t *c = &tp->pe[r];
    return c->seg + coll_offset(tp->size, c->hdr->ring_bytes);
}

/* Oversubscribed meshes: where this rank runs, for needed_here() on the
 * peers. sched_getcpu reads the rseq area (glibc >= 2.35), and the shared
 * line is written only when the CPU changed. */
static int note_cpu(shm_tp_t *tp)
{
    int c = sched_getcpu();
    if (c != tp->cpu) {
        tp->cpu = c;
        atomic_store_explicit(&tp->hdr->cpu, c, memory_order_relaxed);
    }
    return c;
}

/* Whether a rank this wait still needs may need this rank's CPU: it last
 * ran here, or nobody knows where (no needs callback, a CPU not known).
 * When every needed rank last ran on another CPU, it is running there or
 * queued behind ranks there: yielding this CPU would only hand it to a
 * rank that waits too (with 4 ranks on 2 CPUs, one wasted switch per call
 * when the two CPUs' turns fall out of step). */
static int peer_cpu(const shm_tp_t *tp, int p)
{
    const seg_hdr_t *h = tp->pe[p].hdr;
    return h ? atomic_load_explicit(&h->cpu, memory_order_relaxed) : -1;
}

static bool needed_here(shm_tp_t *tp, int me, bool (*needs)(void *arg, int peer), void *arg)
{
    if (!needs || me < 0) return true;
    for (int p = 0; p < tp->size; p++) {
        if (p == tp->rank || !needs(arg, p)) continue;
        int c = peer_cpu(tp, p);
        if (c < 0 || c == me) return true;
    }
    return false;
}

/* Spin on cond for up to ns; true once it holds. */
static bool spin_for(bool (*cond)(void *arg), void *arg, uint64_t ns)
{
    for (uint64_t end = 0;;) {
        for (int i = 0; i < SPIN_ROUNDS; i++) {
            tdist__cpu_relax();
            if (cond(arg)) return true;
        }
        uint64_t now = tdist__now_ns();
        if (!end)
            end = now + ns;
        else if (now >= end)
            return false;
    }
}

void tdist__shm_notify(tdist__tp_t *t)
{
    shm_tp_t *tp = TP(t);
    if (tp->oversubscribed) note_cpu(tp);
    atomic_thread_fence(memory_order_seq_cst);
    for (int p = 0; p < tp->size; p++) {
        if (p == tp->rank || !tp->pe[p].hdr) continue;
        seg_hdr_t *h = tp->pe[p].hdr;
        if (atomic_load_explicit(&h->sleeping, memory_order_relaxed)) {
            atomic_fetch_add(&h->bell, 1);
            futex_wake(&h->bell);
        }
    }
}

/* A lost peer fails a collective wait if the wait still needs it (it may
 * have done its part and left). */
static tdist_status_t check_lost(shm_tp_t *tp, bool (*needs)(void *arg, int peer), void *arg)
{
    check_peers(tp);
    for (int p = 0; p < tp->size; p++) {
        if (p == tp->rank) continue;
        if (!tp->pe[p].dead && !tp->pe[p].closed) continue;
        if (!needs || needs(arg, p)) return peer_lost(tp, p, NULL);
    }
    return TDIST_OK;
}

tdist_status_t tdist__shm_wait_until(tdist__tp_t *t, bool (*cond)(void *arg),
                                     bool (*needs)(void *arg, int peer), void *arg,
                                     int64_t deadline_ms, unsigned flags)
{
    shm_tp_t *tp = TP(t);
    if (tp->err != TDIST_OK) return sticky(tp);
    if (cond(arg)) return TDIST_OK;
    /* Every rank has a CPU: the peers are running, spin a little while
     * (sched_yield would return at once anyway, adding a syscall to the
     * latency). More ranks than CPUs: yield at once, the peer we wait for
     * may need this CPU — unless, for an exchange, every awaited rank last
     * ran on another CPU (needed_here). */
    /* the clock (~20 ns) is read only after the first round: a peer a few
     * hundred ns behind arrives within it */
    if ((flags & TDIST__WAIT_SPIN) && !tp->oversubscribed && spin_for(cond, arg, COLL_SPIN_NS))
        return TDIST_OK;
    /* not from a background thread: its spinning would take the CPU from
     * the caller's own computation */
    bool elsewhere = (flags & TDIST__WAIT_SPIN) && (flags & TDIST__WAIT_SELF_MADE) &&
                     tp->oversubscribed;
    uint64_t start = tdist__now_ns();
    uint64_t end;
    if (flags & TDIST__WAIT_TIMEOUT)
        end = deadline_ms < 0 || (uint64_t)deadline_ms > (UINT64_MAX - start) / 1000000ull
                  ? UINT64_MAX
                  : start + (uint64_t)deadline_ms * 1000000ull;
    else
        end = deadline_ms == INT64_MAX ? UINT64_MAX
              : deadline_ms <= 0        ? 0
                                        : (uint64_t)deadline_ms * 1000000ull;
    for (unsigned i = 0;; i++) {
        if (atomic_load_explicit(&tp->aborted, memory_order_relaxed)) return fail_aborted(tp);
        uint64_t now = tdist__now_ns();
        if (now - tp->last_check_ns >= LIVENESS_NS) TDIST_CHECK(check_lost(tp, needs, arg));
        if (now >= end) return TDIST_ERR_TIMEOUT;
        if (now - start < YIELD_NS) {
            if (elsewhere && !needed_here(tp, note_cpu(tp), needs, arg) &&
                spin_for(cond, arg, ELSEWHERE_SPIN_NS))
                return TDIST_OK;
            sched_yield();
        } else {
            atomic_store(&tp->hdr->sleeping, 1);
            atomic_thread_fence(memory_order_seq_cst);
            unsigned b = atomic_load(&tp->hdr->bell);
            if (!cond(arg) && !atomic_load(&tp->aborted)) {
                uint64_t left_ms = end == UINT64_MAX ? SLEEP_MAX_MS : (end - now + 999999) / 1000000;
                futex_wait(&tp->hdr->bell, b, (int)TDIST_MIN(left_ms, (uint64_t)SLEEP_MAX_MS));
            }
            atomic_store(&tp->hdr->sleeping, 0);
        }
        if (cond(arg)) return TDIST_OK;
        (void)i;
    }
}

bool tdist__shm_oversubscribed(tdist__tp_t *t) { return TP(t)->oversubscribed; }

int tdist__shm_cpu_of(tdist__tp_t *t, int r)
{
    shm_tp_t *tp = TP(t);
    if (!tp->oversubscribed || r < 0 || r >= tp->size) return -1;
    return r == tp->rank ? note_cpu(tp) : peer_cpu(tp, r);
}

/* Any thread, also a signal handler: atomics and one futex wake (both
 * async-signal-safe). The segment is unlinked by connect's failure path
 * (an abort during set-up fails it) or by destroy, not here: shm_unlink is
 * not async-signal-safe. */
void tdist__shm_abort(tdist__tp_t *t)
{
    if (!t) return;
    shm_tp_t *tp = TP(t);
    atomic_store(&tp->aborted, true);
    if (tp->hdr) {
        atomic_fetch_add(&tp->hdr->bell, 1);
        futex_wake(&tp->hdr->bell);
    }
}

void tdist__shm_destroy(tdist__tp_t *t)
{
    if (!t) return;
    shm_tp_t *tp = TP(t);
    for (int p = 0; p < tp->size; p++) {
        peer_t *c = &tp->pe[p];
        if (c->seg) {
            atomic_store_explicit(&c->out->closed, 1, memory_order_release);
            ring_bell(c->hdr);
            munmap(c->seg, c->seg_len);
        }
        if (c->pidfd >= 0) close(c->pidfd);
    }
    if (tp->hdr) {
        atomic_store_explicit(&tp->hdr->closed, 1, memory_order_release);
        munmap(tp->seg, tp->seg_len);
    }
    unlink_own(tp);
    free(tp->pe);
    free(tp->pfd);
    free(tp->pfd_peer);
    free(tp);
}
