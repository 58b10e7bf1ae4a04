/* tools/tdistrun/sink.c — the launcher's own stdout and stderr.
 *
 * Everything the launcher prints (worker lines and its own messages) goes
 * through two bounded queues, one per stream, written without ever
 * blocking: a reader that stops reading (a paused pager, a full pipe) must
 * not stop the launcher from noticing failures and signals. When a queue is
 * full, whole records are dropped and counted; a note saying how much was
 * lost is queued as soon as there is room again.
 *
 * How a stream is written without blocking depends on what it is:
 *   a pipe, FIFO or terminal: reopened through /proc/self/fd/N with
 *     O_NONBLOCK, so that the flag stays off the description the launcher
 *     shares with its parent (a shell would get EAGAIN on its own terminal
 *     otherwise); if that fails, each write waits for poll() to say the
 *     stream is writable and is at most PIPE_BUF bytes, which a pipe takes
 *     whole or not at all;
 *   a socket: send() with MSG_DONTWAIT;
 *   a regular file (or anything else): plain write(), which never waits
 *     for a reader.
 * Each write is at most PIPE_BUF bytes and ends at a newline where there is
 * one. When both streams are the same file (2>&1) and one of them stopped
 * in the middle of a line, the other waits until that line is out, so
 * lines never mix.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/internal.h"
#include "tdistrun.h"

#define SINK_CAP (1u << 20) /* bytes queued per stream before dropping */
#define NOTE_ROOM 192       /* kept free for the "dropped" note */

enum sink_mode {
    MODE_WRITE,    /* plain write(): files */
    MODE_NONBLOCK, /* our own O_NONBLOCK description */
    MODE_POLL,     /* poll() first, then at most PIPE_BUF bytes */
    MODE_SEND,     /* send(MSG_DONTWAIT): sockets */
    MODE_NONE      /* closed fd: discard */
};

struct tdr_sink {
    int fd;
    bool own_fd;             /* fd is the reopened description: close it */
    enum sink_mode mode;
    const char *name;        /* "stdout" / "stderr", for the note */
    char *buf;               /* ring of SINK_CAP bytes */
    size_t head, len;
    uint64_t dropped;        /* bytes dropped since the last note */
    uint64_t dropped_total;  /* bytes dropped in all */
    bool broken;             /* the reader is gone: discard from now on */
};

static char out_ring[SINK_CAP], err_ring[SINK_CAP];
static struct tdr_sink sinks[2] = {{.fd = STDOUT_FILENO, .buf = out_ring, .name = "stdout"},
                                   {.fd = STDERR_FILENO, .buf = err_ring, .name = "stderr"}};
tdr_sink_t *const tdr_out = &sinks[0];
tdr_sink_t *const tdr_err = &sinks[1];

static bool inited;
static bool stamp;           /* --timestamps: launcher messages get one too */
static bool same_file;       /* fd 1 and fd 2 are one file */
static tdr_sink_t *mid_line; /* with same_file: the sink that stopped inside a line */

static void sink_open(tdr_sink_t *s, int fd)
{
    struct stat sb;
    s->fd = fd;
    if (fstat(fd, &sb) != 0) {
        s->mode = MODE_NONE;
        return;
    }
    if (S_ISSOCK(sb.st_mode)) {
        s->mode = MODE_SEND;
        return;
    }
    if (!S_ISFIFO(sb.st_mode) && !S_ISCHR(sb.st_mode)) {
        s->mode = MODE_WRITE;
        return;
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0 && (fl & O_NONBLOCK)) {
        s->mode = MODE_NONBLOCK;
        return;
    }
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    int nfd = open(path, O_WRONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY | (fl >= 0 ? fl & O_APPEND : 0));
    if (nfd >= 0) {
        s->fd = nfd;
        s->own_fd = true;
        s->mode = MODE_NONBLOCK;
    } else {
        s->mode = MODE_POLL;
    }
}

void tdr_sinks_init(bool timestamps)
{
    if (inited) return;
    struct stat a, b;
    same_file = fstat(STDOUT_FILENO, &a) == 0 && fstat(STDERR_FILENO, &b) == 0 &&
                a.st_dev == b.st_dev && a.st_ino == b.st_ino;
    sink_open(tdr_out, STDOUT_FILENO);
    sink_open(tdr_err, STDERR_FILENO);
    stamp = timestamps;
    inited = true;
}

/* Bytes of the queue's front that one write may take: contiguous, at most
 * PIPE_BUF (all of it for files), ending at a newline when there is one. */
static size_t chunk_len(const tdr_sink_t *s)
{
    size_t n = TDIST_MIN(s->len, SINK_CAP - s->head);
    if (s->mode == MODE_WRITE) return n;
    if (n > PIPE_BUF) n = PIPE_BUF;
    const char *p = s->buf + s->head;
    const char *nl = memrchr(p, '\n', n);
    return nl ? (size_t)(nl - p) + 1 : n;
}

/* One write without blocking: bytes written, 0 if the stream takes nothing
 * now, -1 if the reader is gone. */
static ssize_t write_some(tdr_sink_t *s)
{
    const char *p = s->buf + s->head;
    size_t n = chunk_len(s);
    if (s->mode == MODE_POLL) {
        struct pollfd pf = {.fd = s->fd, .events = POLLOUT};
        int r;
        TDIST_SYSCALL(r, poll(&pf, 1, 0));
        if (r == 0) return 0;
        if (r < 0 || (pf.revents & (POLLERR | POLLNVAL))) return -1;
    }
    ssize_t w;
    if (s->mode == MODE_SEND)
        TDIST_SYSCALL(w, send(s->fd, p, n, MSG_DONTWAIT | MSG_NOSIGNAL));
    else
        TDIST_SYSCALL(w, write(s->fd, p, n));
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
    return w < 0 ? -1 : w;
}

/* Queue the "dropped" note once there is room for it. */
static void maybe_note(tdr_sink_t *s);

static void sink_flush(tdr_sink_t *s)
{
    for (int guard = 0; guard < 4096 && s->len > 0 && !s->broken; guard++) {
        if (same_file && mid_line && mid_line != s) return;
        ssize_t w = write_some(s);
        if (w < 0) { /* EPIPE and friends: nobody will read this any more */
            s->broken = true;
            s->len = 0;
            if (mid_line == s) mid_line = NULL;
            return;
        }
        if (w == 0) break;
        char last = s->buf[s->head + (size_t)w - 1];
        s->head = (s->head + (size_t)w) % SINK_CAP;
        s->len -= (size_t)w;
        if (same_file) mid_line = last == '\n' ? NULL : s;
    }
    if (s->dropped) maybe_note(s);
}

static void ring_push(tdr_sink_t *s, const char *p, size_t n)
{
    size_t tail = (s->head + s->len) % SINK_CAP;
    size_t first = TDIST_MIN(n, SINK_CAP - tail);
    memcpy(s->buf + tail, p, first);
    memcpy(s->buf, p + first, n - first);
    s->len += n;
}

static void maybe_note(tdr_sink_t *s)
{
    char note[NOTE_ROOM];
    size_t off = stamp ? tdr_timestamp(note, sizeof note) : 0;
    int n = snprintf(note + off, sizeof note - off,
                     "tdistrun: %llu bytes of output were dropped here: %s was not read fast "
                     "enough\n", (unsigned long long)s->dropped, s->name);
    size_t len = off + (size_t)TDIST_MAX(n, 0);
    if (len > sizeof note - 1 || len > SINK_CAP - s->len) return;
    ring_push(s, note, len);
    s->dropped = 0;
}

/* Before tdr_sinks_init: straight to the fd (blocking, as stdio would). */
static void write_direct(const tdr_sink_t *s, const char *p, size_t n)
{
    for (int guard = 0; guard < 1024 && n > 0; guard++) {
        ssize_t w;
        TDIST_SYSCALL(w, write(s->fd, p, n));
        if (w <= 0) return;
        p += w;
        n -= (size_t)w;
    }
}

bool tdr_sink_put(tdr_sink_t *s, const void *p, size_t n)
{
    if (!inited) {
        write_direct(s, p, n);
        return true;
    }
    if (s->mode == MODE_NONE || s->broken) return false;
    sink_flush(s);
    if (n + NOTE_ROOM > SINK_CAP - s->len) {
        if (s == tdr_out && s->dropped_total == 0)
            tdr_eprintf("tdistrun: stdout is not being read fast enough: dropping output until "
                        "it is\n");
        s->dropped += n;
        s->dropped_total += n;
        return false;
    }
    ring_push(s, p, n);
    sink_flush(s);
    return true;
}

void tdr_sinks_flush(void)
{
    if (!inited) return;
    sink_flush(tdr_out);
    sink_flush(tdr_err);
}

static bool pending(const tdr_sink_t *s)
{
    return s->len > 0 && !s->broken && s->mode != MODE_NONE;
}

int tdr_sinks_pollfds(struct pollfd *p)
{
    int k = 0;
    for (int i = 0; inited && i < 2; i++) {
        if (!pending(&sinks[i]) || sinks[i].mode == MODE_WRITE) continue;
        p[k].fd = sinks[i].fd;
        p[k].events = POLLOUT;
        p[k].revents = 0;
        k++;
    }
    return k;
}

void tdr_sinks_finish(void)
{
    if (!inited) return;
    for (int guard = 0; guard < 10000000; guard++) {
        tdr_sinks_flush();
        if (!pending(tdr_out) && !pending(tdr_err)) break;
        if (tdr_stop_signal()) break; /* asked to stop: what is left is dropped */
        struct pollfd p[3];
        int np = tdr_sinks_pollfds(p);
        int sfd = tdr_signal_fd();
        if (sfd >= 0) p[np++] = (struct pollfd){.fd = sfd, .events = POLLIN};
        int r = poll(p, (nfds_t)np, 1000);
        if (r > 0 && sfd >= 0 && (p[np - 1].revents & POLLIN)) {
            char junk[256]; /* child exits (the guard's): nothing to do any more */
            ssize_t k = read(sfd, junk, sizeof junk);
            (void)k;
        }
    }
    uint64_t lost = tdr_out->dropped_total + (pending(tdr_out) ? tdr_out->len : 0);
    if (lost) {
        tdr_eprintf("tdistrun: %llu bytes of output to stdout were dropped: it was not read "
                    "fast enough\n", (unsigned long long)lost);
        sink_flush(tdr_err);
    }
    for (int i = 0; i < 2; i++)
        if (sinks[i].own_fd) close(sinks[i].fd);
    inited = false;
}

size_t tdr_timestamp(char *buf, size_t n)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    localtime_r(&ts.tv_sec, &tm);
    size_t k = strftime(buf, n, "%Y-%m-%d %H:%M:%S", &tm);
    int m = snprintf(buf + k, n - k, ".%03ld ", (long)(ts.tv_nsec / 1000000));
    return k + (size_t)TDIST_MAX(m, 0);
}

void tdr_eprintf(const char *fmt, ...)
{
    char buf[2048];
    size_t off = stamp ? tdr_timestamp(buf, sizeof buf) : 0;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf + off, sizeof buf - off, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    size_t len = off + (size_t)n;
    if (len >= sizeof buf) { /* cut: keep the line whole */
        len = sizeof buf - 1;
        buf[len - 1] = '\n';
    }
    tdr_sink_put(tdr_err, buf, len);
}
