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
#define SPIN_ROUNDS 64           /* pause rounds before yielding */
#define COLL_SPIN_NS 20000ull    /* collective waits: spin this long when every rank has a CPU */
#define YIELD_NS 1000000ull      /* then sched_yield for up to 1 ms */
#define ELSEWHERE_SPIN_NS 3000ull /* oversubscribed: spin this long while the awaited ranks run elsewhere */
#define SLEEP_MAX_MS 4           /* one futex sleep, at most */
#define LIVENESS_NS 2000000ull   /* check peers' pids at least this often while waiting */
#define SETUP_SLEEP_MS 1
/* Segments up to this size are mapped with their pages in (MAP_POPULATE),
 * by the owner and by every peer: otherwise each page costs its first
 * writer a fault (about 1.5 us a page here: a 32 KiB gather's first pass
 * through a fresh ring cost 14 us a call instead of 1), which a job's
 * first thousand calls, and every short benchmark, pay. Larger segments
 * (about 16 ranks or more on one host, whose segments together would
 * take a GiB at once) stay lazy: pairs that never talk keep their rings
 * unallocated. */
#define POPULATE_MAX (16ull << 20)

/* The owner's header, at offset 0 of its segment. */
typedef struct seg_hdr {
    _Alignas(64) uint64_t magic;
    uint32_t version, size, owner, pid;
    uint64_t tag, ring_bytes;
    uint64_t coll_bytes; /* collective area at coll_offset() */
    uint64_t pidns;      /* inode of the owner's pid namespace (the sweep's check) */
    atomic_uint closed; /* the owner destroyed its transport */
    _Alignas(64) atomic_uint mapped; /* peers that mapped this segment (each before its hello) */
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
    bool verified; /* its hello in my segment checked */
    bool dead;     /* its process exited */
    bool closed;   /* it destroyed its transport */
} peer_t;

typedef struct shm_tp {
    struct tdist__tp b; /* first: the shared part (ops.h) */
    char name[NAME_LEN];
    uint8_t *seg; /* my inbound segment */
    size_t seg_len;
    uint64_t ring_bytes;
    uint64_t coll_bytes; /* collective area of every segment of the mesh */
    seg_hdr_t *hdr;
    atomic_bool unlinked;
    peer_t *pe;          /* size entries, pe[rank] unused */
    bool oversubscribed; /* more ranks than the CPUs they may run on, together */
    int cpu;             /* what hdr->cpu says (this process's copy) */
    bool any_dead;       /* a peer's process exited: sweep serves it first */
    uint64_t last_check_ns;
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

/* Sleep on this rank's doorbell for at most ms, unless ready(arg) (NULL:
 * never ready) holds or the transport is aborted once this rank has
 * announced that it sleeps: whoever changes a ring or an area after that
 * sees the announcement and rings. Returns whether it did not sleep for
 * that reason. */
static bool doze(shm_tp_t *tp, bool (*ready)(void *arg), void *arg, int ms)
{
    seg_hdr_t *h = tp->hdr;
    atomic_store(&h->sleeping, 1);
    atomic_thread_fence(memory_order_seq_cst);
    unsigned b = atomic_load(&h->bell);
    bool skip = (ready && ready(arg)) || atomic_load(&tp->b.aborted);
    if (!skip) futex_wait(&h->bell, b, ms);
    atomic_store(&h->sleeping, 0);
    return skip;
}

/* One sleep of a wait that ends at end (ns; UINT64_MAX: never), now being
 * now: the time left, rounded up to ms, at most SLEEP_MAX_MS. */
static int nap_ms(uint64_t now, uint64_t end)
{
    uint64_t left_ms = end == UINT64_MAX ? SLEEP_MAX_MS : (end - now + 999999) / 1000000;
    return (int)TDIST_MIN(left_ms, (uint64_t)SLEEP_MAX_MS);
}

static void unlink_own(shm_tp_t *tp)
{
    if (tp->name[0] && !atomic_exchange(&tp->unlinked, true)) shm_unlink(tp->name);
}

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

/* ------------------------------------------------------------- listen */

/* The ring and collective-area sizes opts asks for, checked and rounded:
 * rings to a power of two >= MIN_RING, the area to whole pages. */
static tdist_status_t ring_sizes(const tdist__tp_opts_t *opts, int rank, uint64_t *ring,
                                 uint64_t *coll)
{
    static const char fn[] = "tdist__tp_listen";
    uint64_t want = opts->shm_ring_bytes ? opts->shm_ring_bytes : DEFAULT_RING;
    if (want > MAX_RING)
        return tdist__error(TDIST_ERR_INVALID_ARG, "%s: rank %d: shm_ring_bytes %zu is above %llu",
                            fn, rank, opts->shm_ring_bytes, (unsigned long long)MAX_RING);
    uint64_t r2 = MIN_RING;
    while (r2 < want) r2 <<= 1;
    if (opts->shm_coll_bytes > MAX_RING)
        return tdist__error(TDIST_ERR_INVALID_ARG, "%s: rank %d: shm_coll_bytes %zu is above %llu",
                            fn, rank, opts->shm_coll_bytes, (unsigned long long)MAX_RING);
    *ring = r2;
    *coll = ((uint64_t)opts->shm_coll_bytes + 4095) & ~(uint64_t)4095;
    return TDIST_OK;
}

/* Create, size and map this rank's segment under a fresh random name. */
static tdist_status_t create_segment(shm_tp_t *tp)
{
    int rank = tp->b.rank;
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
        tdist_status_t st = tdist__error_errno(errno, "rank %d: shm transport: shm_open(%s)",
                                               rank, tp->name);
        tp->name[0] = '\0';
        return st;
    }
    atomic_store(&tp->unlinked, false);
    if (ftruncate(fd, (off_t)tp->seg_len) != 0) {
        tdist_status_t st = tdist__error_errno(errno, "rank %d: shm transport: ftruncate(%s, %zu)",
                                               rank, tp->name, tp->seg_len);
        close(fd);
        return st;
    }
    void *m = mmap(NULL, tp->seg_len, PROT_READ | PROT_WRITE,
                   MAP_SHARED | (tp->seg_len <= POPULATE_MAX ? MAP_POPULATE : 0), fd, 0);
    int merr = errno;
    close(fd);
    if (m == MAP_FAILED)
        return tdist__error_errno(merr, "rank %d: shm transport: mmap(%s, %zu)", rank, tp->name,
                                  tp->seg_len);
    tp->seg = m;
    tp->hdr = (seg_hdr_t *)m;
    return TDIST_OK;
}

/* Fill this rank's header (cpus: its affinity, NULL if unknown) and
 * publish it: the magic goes last, so a peer that sees it sees the rest. */
static void write_header(shm_tp_t *tp, const cpu_set_t *cpus)
{
    seg_hdr_t *h = tp->hdr;
    h->version = SEG_VERSION;
    h->size = (uint32_t)tp->b.size;
    h->owner = (uint32_t)tp->b.rank;
    h->pid = (uint32_t)getpid();
    h->pidns = pid_ns();
    h->tag = tp->b.tag;
    h->ring_bytes = tp->ring_bytes;
    h->coll_bytes = tp->coll_bytes;
    put_affinity(h, cpus);
    tp->cpu = -1;
    atomic_store(&h->cpu, -1);
    atomic_thread_fence(memory_order_release);
    __atomic_store_n(&h->magic, SEG_MAGIC, __ATOMIC_RELEASE);
}

tdist_status_t tdist__shm_listen(tdist__tp_kind_t kind, int rank, int size,
                                 const tdist__tp_opts_t *opts, tdist__tp_t **out)
{
    static const char fn[] = "tdist__tp_listen";
    TDIST_ARG_CHECK(out != NULL, fn);
    TDIST_ARG_CHECK(opts != NULL, fn);
    if (size < 1 || size > 4096 || rank < 0 || rank >= size)
        return tdist__error(TDIST_ERR_INVALID_ARG, "%s: rank %d of size %d is out of range", fn,
                            rank, size);
    sweep_stale();
    uint64_t ring = 0, coll = 0;
    TDIST_CHECK(ring_sizes(opts, rank, &ring, &coll));

    shm_tp_t *tp = calloc(1, sizeof *tp);
    if (!tp)
        return tdist__error(TDIST_ERR_NO_MEMORY, "%s: rank %d: out of memory for %d peers", fn,
                            rank, size);
    atomic_init(&tp->unlinked, true); /* nothing to unlink yet */
    tdist_status_t st = tdist__tp_base_init(&tp->b, kind, rank, size, opts->tag);
    if (st == TDIST_OK && !(tp->pe = calloc((size_t)size, sizeof *tp->pe)))
        st = tdist__error(TDIST_ERR_NO_MEMORY, "%s: rank %d: out of memory for %d peers", fn,
                          rank, size);
    if (st != TDIST_OK) {
        tdist__shm_destroy(&tp->b);
        return st;
    }
    for (int p = 0; p < size; p++) tp->pe[p].pidfd = -1;
    tp->ring_bytes = ring;
    tp->coll_bytes = coll;
    tp->seg_len = seg_bytes(size, ring, coll);
    /* Until connect has seen the peers' affinities (see oversubscribed()):
     * more ranks than CPUs this process may run on. */
    cpu_set_t cpus;
    bool have_cpus = sched_getaffinity(0, sizeof cpus, &cpus) == 0;
    tp->oversubscribed = size > (have_cpus ? CPU_COUNT(&cpus) : 1);
    st = create_segment(tp);
    if (st != TDIST_OK) {
        tdist__shm_destroy(&tp->b);
        return st;
    }
    write_header(tp, have_cpus ? &cpus : NULL);
    snprintf(tp->b.addr, sizeof tp->b.addr, "shm:%s:%d", tp->name, (int)getpid());
    TDIST_LOGD("rank %d: shm transport segment %s (%zu bytes, rings of %llu)", rank, tp->name,
               tp->seg_len, (unsigned long long)ring);
    *out = &tp->b;
    return TDIST_OK;
}

/* ------------------------------------------------------------ liveness */

/* Peer p exited or destroyed its transport: fail the transport naming it
 * and what req (may be NULL) was doing. */
static tdist_status_t peer_lost(shm_tp_t *tp, int p, const tdist__tp_req_t *req)
{
    return tdist__tp_fail_peer(&tp->b, TDIST_ERR_CONNECTION, p, req,
                               tp->pe[p].dead ? " exited" : " closed its transport");
}

/* Note peers whose process exited or who destroyed their transport (one
 * poll over the pidfds, timeout 0). Returns whether a peer was newly lost. */
static bool check_peers(shm_tp_t *tp)
{
    tp->last_check_ns = tdist__now_ns();
    bool news = false;
    int n = 0;
    for (int p = 0; p < tp->b.size; p++) {
        peer_t *c = &tp->pe[p];
        if (p == tp->b.rank || c->dead) continue;
        if (!c->closed &&
            ((c->hdr && atomic_load_explicit(&c->hdr->closed, memory_order_acquire)) ||
             (c->in && atomic_load_explicit(&c->in->closed, memory_order_acquire)))) {
            c->closed = true;
            news = true;
            TDIST_LOGD("rank %d: peer rank %d (pid %d) closed its transport", tp->b.rank, p,
                       c->pid);
        }
        if (c->pidfd >= 0) {
            tp->b.pfd[n] = (struct pollfd){.fd = c->pidfd, .events = POLLIN};
            tp->b.pfd_peer[n++] = p;
        } else if (c->pid > 0 && kill(c->pid, 0) != 0 && errno == ESRCH) {
            c->dead = tp->any_dead = true;
            news = true;
        }
    }
    if (n > 0 && poll(tp->b.pfd, (nfds_t)n, 0) > 0) {
        for (int i = 0; i < n; i++) {
            if (!tp->b.pfd[i].revents) continue;
            peer_t *c = &tp->pe[tp->b.pfd_peer[i]];
            c->dead = tp->any_dead = true;
            news = true;
            TDIST_LOGD("rank %d: peer rank %d (pid %d) exited", tp->b.rank, tp->b.pfd_peer[i],
                       c->pid);
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

/* Whether peer p's header h, in a segment of seg_len bytes, is what this
 * mesh expects (the magic is checked already); if not, why says how not. */
static bool header_fits(const shm_tp_t *tp, int p, const seg_hdr_t *h, size_t seg_len, char *why,
                        size_t n)
{
    const peer_t *c = &tp->pe[p];
    if (h->version != SEG_VERSION) {
        snprintf(why, n, "version %u, expected %u", h->version, SEG_VERSION);
    } else if (h->tag != tp->b.tag) {
        snprintf(why, n, "tag 0x%016llx, expected 0x%016llx (another job, group or generation)",
                 (unsigned long long)h->tag, (unsigned long long)tp->b.tag);
    } else if (h->size != (uint32_t)tp->b.size || h->owner != (uint32_t)p ||
               h->pid != (uint32_t)c->pid) {
        snprintf(why, n, "rank %u of %u (pid %u), expected rank %d of %d (pid %d)", h->owner,
                 h->size, h->pid, p, tp->b.size, c->pid);
    } else if (h->ring_bytes < MIN_RING || h->ring_bytes > MAX_RING ||
               (h->ring_bytes & (h->ring_bytes - 1)) ||
               seg_len < seg_bytes(tp->b.size, h->ring_bytes, h->coll_bytes)) {
        snprintf(why, n, "ring size %llu does not fit a segment of %lld bytes",
                 (unsigned long long)h->ring_bytes, (long long)seg_len);
    } else if (h->coll_bytes != tp->coll_bytes) {
        snprintf(why, n, "a collective area of %llu bytes, expected %llu",
                 (unsigned long long)h->coll_bytes, (unsigned long long)tp->coll_bytes);
    } else {
        return true;
    }
    return false;
}

/* Try to map peer p's segment and write this rank's hello into it.
 * Returns 1 when done, 0 to retry later, or a failure (-1, tp failed). */
static int map_peer(shm_tp_t *tp, int p)
{
    peer_t *c = &tp->pe[p];
    int fd = shm_open(c->name, O_RDWR | O_CLOEXEC, 0);
    if (fd < 0) {
        tdist__tp_set_problem(&tp->b, p, "its segment %s cannot be opened yet: %s", c->name,
                              strerror(errno));
        if (errno == ENOENT || errno == EINTR) return 0;
        tdist__tp_fail(&tp->b, TDIST_ERR_SYSTEM, "rank %d: shm transport set-up: peer rank %d "
                       "(pid %d): shm_open(%s): %s", tp->b.rank, p, c->pid, c->name,
                       strerror(errno));
        return -1;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0 || (size_t)sb.st_size < HDR_BYTES) {
        close(fd);
        tdist__tp_set_problem(&tp->b, p, "its segment %s is not sized yet", c->name);
        return 0;
    }
    void *m = mmap(NULL, (size_t)sb.st_size, PROT_READ | PROT_WRITE,
                   MAP_SHARED | ((uint64_t)sb.st_size <= POPULATE_MAX ? MAP_POPULATE : 0), fd, 0);
    int merr = errno;
    close(fd);
    if (m == MAP_FAILED) {
        tdist__tp_fail(&tp->b, TDIST_ERR_SYSTEM, "rank %d: shm transport set-up: peer rank %d "
                       "(pid %d): mmap(%s): %s", tp->b.rank, p, c->pid, c->name, strerror(merr));
        return -1;
    }
    seg_hdr_t *h = m;
    if (__atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) != SEG_MAGIC) {
        munmap(m, (size_t)sb.st_size);
        tdist__tp_set_problem(&tp->b, p, "its segment %s is not initialised yet", c->name);
        return 0;
    }
    char why[TDIST__TP_PROBLEM_LEN];
    if (!header_fits(tp, p, h, (size_t)sb.st_size, why, sizeof why)) {
        munmap(m, (size_t)sb.st_size);
        tdist__tp_fail(&tp->b, TDIST_ERR_CONNECTION, "rank %d: shm transport set-up: the segment "
                       "%s of peer rank %d says %s", tp->b.rank, c->name, p, why);
        return -1;
    }
    c->seg = m;
    c->seg_len = (size_t)sb.st_size;
    c->hdr = h;
    c->out = slot_at(c->seg, h->ring_bytes, p, tp->b.rank);
    c->out_data = (uint8_t *)c->out + SLOT_HDR_BYTES;
    c->out_mask = h->ring_bytes - 1;
    c->out_head = atomic_load(&c->out->head);
    c->out->size = (uint32_t)tp->b.size;
    c->out->rank = (uint32_t)tp->b.rank;
    c->out->pid = (uint32_t)getpid();
    c->out->tag = tp->b.tag;
    /* mapped before the hello: an owner that has every peer's hello
     * also sees its mapped count complete, and unlinks before it leaves
     * connect */
    atomic_fetch_add(&h->mapped, 1);
    atomic_store_explicit(&c->out->hello, 1, memory_order_release);
    ring_bell(h);
    return 1;
}

/* Check peer p's hello in this rank's segment. 1 ok, 0 not yet, -1 failed. */
static int verify_peer(shm_tp_t *tp, int p)
{
    peer_t *c = &tp->pe[p];
    slot_t *s = c->in;
    if (!atomic_load_explicit(&s->hello, memory_order_acquire)) {
        tdist__tp_set_problem(&tp->b, p, "has not mapped this rank's segment yet (has it called "
                              "connect?)");
        return 0;
    }
    if (s->tag != tp->b.tag || s->size != (uint32_t)tp->b.size || s->rank != (uint32_t)p ||
        s->pid != (uint32_t)c->pid) {
        tdist__tp_fail(&tp->b, TDIST_ERR_CONNECTION,
                       "rank %d: shm transport set-up: the hello in peer rank %d's slot says rank "
                       "%u of %u (pid %u, tag 0x%016llx), expected rank %d of %d (pid %d, tag "
                       "0x%016llx)",
                       tp->b.rank, p, s->rank, s->size, s->pid, (unsigned long long)s->tag, p,
                       tp->b.size, c->pid, (unsigned long long)tp->b.tag);
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
    for (int p = 0; p < tp->b.size; p++) {
        const seg_hdr_t *h = p == tp->b.rank ? tp->hdr : tp->pe[p].hdr;
        uint64_t any = 0;
        for (int i = 0; h && i < CPU_WORDS; i++) any |= h->cpus[i];
        if (!any) {
            long conf = sysconf(_SC_NPROCESSORS_CONF);
            return tp->b.size > (conf > 0 ? conf : 1);
        }
        for (int i = 0; i < CPU_WORDS; i++) all[i] |= h->cpus[i];
    }
    int n = 0;
    for (int i = 0; i < CPU_WORDS; i++) n += __builtin_popcountll(all[i]);
    return tp->b.size > n;
}

/* Check every peer's address and take its segment's name and its pid
 * (which names it in messages). */
static tdist_status_t take_addrs(shm_tp_t *tp, const char *const *addrs)
{
    for (int p = 0; p < tp->b.size; p++) {
        if (p == tp->b.rank) continue;
        peer_t *c = &tp->pe[p];
        if (!addrs[p] || !parse_addr(addrs[p], c->name, sizeof c->name, &c->pid))
            return tdist__error(TDIST_ERR_INVALID_ARG,
                                "tdist__tp_connect: rank %d: address of peer rank %d (\"%.80s\") "
                                "is not \"shm:/<name>:<pid>\"",
                                tp->b.rank, p, addrs[p] ? addrs[p] : "(null)");
        snprintf(tp->b.chan[p].label, sizeof tp->b.chan[p].label, "pid %d", c->pid);
    }
    return TDIST_OK;
}

/* Find each peer's ring in this rank's segment, and open a pidfd per
 * peer to see it exit. */
static void watch_peers(shm_tp_t *tp)
{
    for (int p = 0; p < tp->b.size; p++) {
        if (p == tp->b.rank) continue;
        peer_t *c = &tp->pe[p];
        c->in = slot_at(tp->seg, tp->ring_bytes, tp->b.rank, p);
        c->in_data = (uint8_t *)c->in + SLOT_HDR_BYTES;
        c->in_tail = atomic_load(&c->in->tail);
        c->pidfd = (int)syscall(SYS_pidfd_open, (pid_t)c->pid, 0u);
        if (c->pidfd < 0 && errno == ESRCH) c->dead = tp->any_dead = true;
        if (c->pidfd >= 0) fcntl(c->pidfd, F_SETFD, FD_CLOEXEC);
        tdist__tp_set_problem(&tp->b, p, "not mapped yet");
    }
}

/* One round of set-up: map and check every peer not up yet. Returns how
 * many are still missing; a lost peer or a bad segment fails tp. */
static int setup_round(shm_tp_t *tp)
{
    check_peers(tp);
    int missing = 0;
    for (int p = 0; p < tp->b.size; p++) {
        if (p == tp->b.rank) continue;
        peer_t *c = &tp->pe[p];
        /* Set-up with p is done once each has mapped the other (its
         * hello in this rank's segment). A peer that got there first
         * may already have closed again (a group created and destroyed
         * at once): that is no set-up failure, the mapped segments
         * stay valid, and later calls see the closed peer. */
        bool done = (c->seg || map_peer(tp, p) > 0) && (c->verified || verify_peer(tp, p) > 0);
        if (tp->b.err != TDIST_OK) break;
        if (done) {
            tp->b.chan[p].up = true;
            continue;
        }
        if (c->dead || c->closed) {
            shm_unlink(c->name); /* it cannot unlink it any more */
            tdist__tp_fail(&tp->b, TDIST_ERR_CONNECTION,
                           "rank %d: shm transport set-up: peer rank %d (pid %d) %s", tp->b.rank,
                           p, c->pid, c->dead ? "exited" : "closed its transport");
            break;
        }
        missing++;
    }
    return missing;
}

tdist_status_t tdist__shm_connect(tdist__tp_t *t, const char *const *addrs, int64_t deadline_ms)
{
    shm_tp_t *tp = TP(t);
    TDIST_CHECK(take_addrs(tp, addrs));
    int64_t start = tdist__now_ms();
    watch_peers(tp);
    while (tp->b.err == TDIST_OK) {
        if (atomic_load(&tp->b.aborted)) {
            tdist__tp_fail_aborted(&tp->b);
            break;
        }
        int missing = setup_round(tp);
        if (tp->b.err != TDIST_OK) break;
        if (atomic_load(&tp->hdr->mapped) >= (unsigned)(tp->b.size - 1)) unlink_own(tp);
        if (missing == 0) break;
        int64_t now = tdist__now_ms();
        if (now >= deadline_ms) {
            tdist__tp_setup_timeout(&tp->b, "shm transport", start);
            break;
        }
        /* a peer's hello rings the doorbell */
        doze(tp, NULL, NULL, (int)TDIST_MIN(SETUP_SLEEP_MS, deadline_ms - now));
    }
    if (tp->b.err != TDIST_OK) {
        unlink_own(tp);
        return tdist__tp_sticky(&tp->b);
    }
    tp->b.connected = true;
    tp->oversubscribed = oversubscribed(tp);
    TDIST_LOGD("rank %d: shm transport mesh of %d ranks up in %lld ms", tp->b.rank, tp->b.size,
               (long long)(tdist__now_ms() - start));
    return TDIST_OK;
}

/* --------------------------------------------------------------- data */

/* Largest copy between two publications, so the other side can start on
 * a part while this side copies the next. */
static uint64_t chunk_of(uint64_t ring) { return ring >= (1u << 18) ? ring / 4 : ring; }

/* How many bytes req moves in one step: what it still needs, at most
 * avail (what the ring has room or data for) and chunk. */
static inline size_t step_len(const tdist__tp_req_t *req, uint64_t avail, uint64_t chunk)
{
    size_t n = req->len - req->done;
    if (n > avail) n = (size_t)avail;
    if (n > chunk) n = (size_t)chunk;
    return n;
}

/* Copy n bytes from src into a ring of ring bytes at data, from offset off
 * on, wrapping at its end. */
static inline void ring_put(uint8_t *data, uint64_t ring, size_t off, const uint8_t *src, size_t n)
{
    size_t first = TDIST_MIN(n, (size_t)ring - off);
    memcpy(data + off, src, first);
    if (n > first) memcpy(data, src + first, n - first);
}

/* Copy n bytes out of a ring of ring bytes at data, from offset off on,
 * wrapping at its end, to dst. */
static inline void ring_get(uint8_t *dst, const uint8_t *data, uint64_t ring, size_t off, size_t n)
{
    size_t first = TDIST_MIN(n, (size_t)ring - off);
    memcpy(dst, data + off, first);
    if (n > first) memcpy(dst + first, data, n - first);
}

/* Copy queued sends into peer p's ring as space allows. Returns whether a
 * byte moved. */
static bool drive_send(shm_tp_t *tp, int p)
{
    peer_t *c = &tp->pe[p];
    tdist__tp_chan_t *q = &tp->b.chan[p];
    bool moved = false;
    uint64_t ring = c->out_mask + 1, chunk = chunk_of(ring);
    while (q->sq_head && tp->b.err == TDIST_OK) {
        tdist__tp_req_t *req = q->sq_head;
        if (c->dead || c->closed) {
            peer_lost(tp, p, req);
            break;
        }
        uint64_t head = c->out_head;
        uint64_t tail = atomic_load_explicit(&c->out->tail, memory_order_acquire);
        uint64_t space = ring - (head - tail);
        if (space == 0) break;
        size_t n = step_len(req, space, chunk);
        ring_put(c->out_data, ring, (size_t)(head & c->out_mask), req->buf + req->done, n);
        c->out_head = head + n;
        atomic_store_explicit(&c->out->head, head + n, memory_order_release);
        moved = true;
        tdist__tp_req_moved(req, n, &q->sq_head, &q->sq_tail);
        ring_bell(c->hdr);
    }
    return moved;
}

/* Fill queued receives from peer p's ring in this rank's segment. */
static bool drive_recv(shm_tp_t *tp, int p)
{
    peer_t *c = &tp->pe[p];
    tdist__tp_chan_t *q = &tp->b.chan[p];
    bool moved = false;
    uint64_t ring = tp->ring_bytes, mask = ring - 1, chunk = chunk_of(ring);
    while (q->rq_head && tp->b.err == TDIST_OK) {
        tdist__tp_req_t *req = q->rq_head;
        uint64_t tail = c->in_tail;
        uint64_t head = atomic_load_explicit(&c->in->head, memory_order_acquire);
        uint64_t avail = head - tail;
        if (avail == 0) {
            if (c->dead || c->closed) peer_lost(tp, p, req); /* drained: nothing more comes */
            break;
        }
        size_t n = step_len(req, avail, chunk);
        ring_get(req->buf + req->done, c->in_data, ring, (size_t)(tail & mask), n);
        c->in_tail = tail + n;
        atomic_store_explicit(&c->in->tail, tail + n, memory_order_release);
        moved = true;
        tdist__tp_req_moved(req, n, &q->rq_head, &q->rq_tail);
        ring_bell(c->hdr);
    }
    return moved;
}

/* Move what can move on peer p's channels. Returns whether a byte moved. */
static bool sweep_peer(shm_tp_t *tp, int p)
{
    bool moved = false;
    if (tp->b.chan[p].sq_head) moved |= drive_send(tp, p);
    if (tp->b.chan[p].rq_head && tp->b.err == TDIST_OK) moved |= drive_recv(tp, p);
    return moved;
}

/* How much of a failure's cause peer c is, for the order in which lost
 * peers are named: 0 exited with its transport still open (killed,
 * crashed), 1 exited after closing it (a survivor of that failure that
 * finished and left before this rank looked), 2 only closed it, 3 not
 * lost. */
static int lost_order(const peer_t *c)
{
    return c->dead ? (c->closed ? 1 : 0) : c->closed ? 2 : 3;
}

/* Move what can move on every channel with work. Returns whether a byte
 * moved. Once a peer has exited, the channels of the exited peers go
 * first, those that exited with their transport open before those that
 * closed it: the error names the first lost peer a channel meets, and
 * that should be the cause. */
static bool sweep(shm_tp_t *tp)
{
    bool moved = false;
    for (int order = 0; tp->any_dead && order < 2; order++)
        for (int p = 0; p < tp->b.size && tp->b.err == TDIST_OK; p++)
            if (lost_order(&tp->pe[p]) == order) moved |= sweep_peer(tp, p);
    for (int p = 0; p < tp->b.size && tp->b.err == TDIST_OK; p++) moved |= sweep_peer(tp, p);
    return moved;
}

/* progress's reason not to sleep (arg: the transport): a byte moved, or
 * the transport failed. */
static bool moved_or_failed(void *arg)
{
    shm_tp_t *tp = arg;
    return sweep(tp) || tp->b.err != TDIST_OK;
}

tdist_status_t tdist__shm_progress(tdist__tp_t *t, int timeout_ms)
{
    shm_tp_t *tp = TP(t);
    bool moved = sweep(tp);
    uint64_t now = tdist__now_ns();
    if (now - tp->last_check_ns >= LIVENESS_NS && check_peers(tp)) moved |= sweep(tp);
    if (tp->b.err != TDIST_OK) return tdist__tp_sticky(&tp->b);
    if (moved || timeout_ms == 0) return TDIST_OK;

    uint64_t start = now;
    uint64_t end = timeout_ms < 0 ? UINT64_MAX : start + (uint64_t)timeout_ms * 1000000ull;
    /* 1: spin briefly with a pause instruction. */
    for (int i = 0; i < SPIN_ROUNDS; i++) {
        tdist__cpu_relax();
        if (sweep(tp) || tp->b.err != TDIST_OK) goto out;
        if (atomic_load_explicit(&tp->b.aborted, memory_order_relaxed)) goto out;
    }
    tdist__tp_waiting_on(&tp->b, -1); /* done spinning: say on whom */
    /* 2: yield the CPU (a peer sharing this core may be the one we wait
     * for) for up to ~1 ms. */
    for (;;) {
        now = tdist__now_ns();
        if (now - start >= YIELD_NS || now >= end) break;
        sched_yield();
        if (sweep(tp) || tp->b.err != TDIST_OK) goto out;
        if (atomic_load_explicit(&tp->b.aborted, memory_order_relaxed)) goto out;
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
        if (doze(tp, moved_or_failed, tp, nap_ms(now, end))) break;
        if (sweep(tp) || tp->b.err != TDIST_OK || atomic_load(&tp->b.aborted)) break;
    }
out:
    if (tp->b.err != TDIST_OK) return tdist__tp_sticky(&tp->b);
    if (atomic_load(&tp->b.aborted)) return tdist__tp_fail_aborted(&tp->b);
    return TDIST_OK;
}

/* ------------------------------------------------- collective area */

void *tdist__shm_area(tdist__tp_t *t, int r, size_t *bytes)
{
    if (!t) return NULL;
    shm_tp_t *tp = TP(t);
    if (!tp->b.connected || !tp->coll_bytes || r < 0 || r >= tp->b.size) return NULL;
    if (bytes) *bytes = (size_t)tp->coll_bytes;
    if (r == tp->b.rank) return tp->seg + coll_offset(tp->b.size, tp->ring_bytes);
    peer_t *c = &tp->pe[r];
    return c->seg + coll_offset(tp->b.size, c->hdr->ring_bytes);
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
    for (int p = 0; p < tp->b.size; p++) {
        if (p == tp->b.rank || !needs(arg, p)) continue;
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
    for (int p = 0; p < tp->b.size; p++) {
        if (p == tp->b.rank || !tp->pe[p].hdr) continue;
        seg_hdr_t *h = tp->pe[p].hdr;
        if (atomic_load_explicit(&h->sleeping, memory_order_relaxed)) {
            atomic_fetch_add(&h->bell, 1);
            futex_wake(&h->bell);
        }
    }
}

/* A collective wait stopped spinning: tell the hook (tdist__tp_on_wait)
 * the first rank it still needs, if that is not told already; that rank
 * (-1: none). */
static int note_waiting(shm_tp_t *tp, bool (*needs)(void *arg, int peer), void *arg, int told)
{
    if (!tp->b.on_wait || !needs) return -1;
    for (int p = 0; p < tp->b.size; p++)
        if (p != tp->b.rank && needs(arg, p)) {
            if (p != told) tdist__tp_waiting_on(&tp->b, p);
            return p;
        }
    return -1;
}

/* A lost peer fails a collective wait if the wait still needs it (it may
 * have done its part and left). */
static tdist_status_t check_lost(shm_tp_t *tp, bool (*needs)(void *arg, int peer), void *arg)
{
    check_peers(tp);
    /* the cause first, as sweep names it (lost_order) */
    for (int order = 0; order < 3; order++)
        for (int p = 0; p < tp->b.size; p++) {
            if (p == tp->b.rank || lost_order(&tp->pe[p]) != order) continue;
            if (!needs || needs(arg, p)) return peer_lost(tp, p, NULL);
        }
    return TDIST_OK;
}

tdist_status_t tdist__shm_wait_until(tdist__tp_t *t, bool (*cond)(void *arg),
                                     bool (*needs)(void *arg, int peer), void *arg,
                                     int64_t deadline_ms, unsigned flags)
{
    shm_tp_t *tp = TP(t);
    if (tp->b.err != TDIST_OK) return tdist__tp_sticky(&tp->b);
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
    int told = note_waiting(tp, needs, arg, -1);
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
        if (atomic_load_explicit(&tp->b.aborted, memory_order_relaxed))
            return tdist__tp_fail_aborted(&tp->b);
        uint64_t now = tdist__now_ns();
        if (now - tp->last_check_ns >= LIVENESS_NS) {
            TDIST_CHECK(check_lost(tp, needs, arg));
            told = note_waiting(tp, needs, arg, told); /* the one awaited may have come */
        }
        if (now >= end) return TDIST_ERR_TIMEOUT;
        if (now - start < YIELD_NS) {
            if (elsewhere && !needed_here(tp, note_cpu(tp), needs, arg) &&
                spin_for(cond, arg, ELSEWHERE_SPIN_NS))
                return TDIST_OK;
            sched_yield();
        } else {
            doze(tp, cond, arg, nap_ms(now, end));
        }
        if (cond(arg)) return TDIST_OK;
        (void)i;
    }
}

bool tdist__shm_oversubscribed(tdist__tp_t *t) { return TP(t)->oversubscribed; }

int tdist__shm_cpu_of(tdist__tp_t *t, int r)
{
    shm_tp_t *tp = TP(t);
    if (!tp->oversubscribed || r < 0 || r >= tp->b.size) return -1;
    return r == tp->b.rank ? note_cpu(tp) : peer_cpu(tp, r);
}

/* Any thread, also a signal handler: one atomic and one futex wake (both
 * async-signal-safe). The segment is unlinked by connect's failure path
 * (an abort during set-up fails it) or by destroy, not here: shm_unlink is
 * not async-signal-safe. */
void tdist__shm_wake(tdist__tp_t *t)
{
    shm_tp_t *tp = TP(t);
    if (tp->hdr) {
        atomic_fetch_add(&tp->hdr->bell, 1);
        futex_wake(&tp->hdr->bell);
    }
}

void tdist__shm_destroy(tdist__tp_t *t)
{
    shm_tp_t *tp = TP(t);
    for (int p = 0; tp->pe && p < tp->b.size; p++) {
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
    tdist__tp_base_fini(&tp->b);
    free(tp);
}
