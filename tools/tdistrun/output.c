/* tools/tdistrun/output.c — forwarding worker output line by line.
 *
 * Each worker's stdout and stderr arrive on a pipe. With prefixing on,
 * bytes are collected into lines and every line goes to the launcher's
 * matching stream (through its sink, sink.c) as "[rank R] line\n" in one
 * record, so lines of different workers never mix; --timestamps puts the
 * time the line was read in front. A partial line waits for its newline or
 * for end of file; a line longer than TDR_LINE_MAX bytes is forwarded in
 * pieces of that size. With prefixing and timestamps off, bytes are passed
 * through as they come.
 *
 * Besides the console, a stream may feed the worker's --log-dir file (its
 * stdout and stderr lines as they arrive, without the rank prefix) and its
 * --tee file (raw bytes). A stream whose local rank is filtered out
 * (--local-ranks-filter) has no console but is still logged. The last
 * TDR_TAIL_LINES lines of stderr are remembered (each cut to
 * TDR_TAIL_LINE_MAX bytes) for the failure report.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "core/internal.h"
#include "tdistrun.h"

#define PREFIX_MAX 32  /* "[rank 65535] " and then some */
#define STAMP_MAX 48   /* "YYYY-MM-DD HH:MM:SS.mmm " and then some */
#define CHUNK 16384    /* bytes read from a pipe at once */
#define DRAIN_READS 256 /* at most this many reads when draining (4 MiB) */

static void write_all(int fd, const char *p, size_t n)
{
    for (int guard = 0; guard < 1024 && n > 0; guard++) {
        ssize_t w;
        TDIST_SYSCALL(w, write(fd, p, n));
        if (w <= 0) return; /* a full disk: the log stays short, the job goes on */
        p += w;
        n -= (size_t)w;
    }
}

static bool raw_console(const tdr_stream_t *s)
{
    return s->console && !s->prefix && !s->timestamps;
}

static bool lines_mode(const tdr_stream_t *s)
{
    return s->log_fd >= 0 || (s->console && !raw_console(s));
}

int tdr_stream_init(tdr_stream_t *s, int fd, const tdr_stream_dest_t *d)
{
    memset(s, 0, sizeof *s);
    s->fd = fd;
    s->console = d->console;
    s->log_fd = d->log_fd;
    s->tee_fd = d->tee_fd;
    s->rank = d->rank;
    s->prefix = d->prefix;
    s->timestamps = d->timestamps;
    s->keep_tail = d->keep_tail;
    if (lines_mode(s)) {
        s->line = malloc(TDR_LINE_MAX);
        s->obuf = malloc(STAMP_MAX + PREFIX_MAX + TDR_LINE_MAX + 1);
        if (!s->line || !s->obuf) goto oom;
    }
    if (s->keep_tail) {
        s->tail = calloc(TDR_TAIL_LINES, TDR_TAIL_LINE_MAX);
        if (!s->tail) goto oom;
    }
    return 0;
oom:
    tdr_stream_fini(s);
    return -1;
}

/* Send the assembled line to the log and the console; start a new one. */
static void emit_line(tdr_stream_t *s)
{
    char ts[STAMP_MAX];
    size_t tl = s->timestamps ? tdr_timestamp(ts, sizeof ts) : 0;
    if (s->log_fd >= 0) {
        struct iovec iov[3] = {{ts, tl}, {s->line, s->line_len}, {(void *)"\n", 1}};
        ssize_t w;
        TDIST_SYSCALL(w, writev(s->log_fd, iov, 3));
        size_t want = tl + s->line_len + 1;
        if (w >= 0 && (size_t)w < want) { /* rare short write to a file: finish it plainly */
            char *rest = s->obuf;
            memcpy(rest, ts, tl);
            memcpy(rest + tl, s->line, s->line_len);
            rest[tl + s->line_len] = '\n';
            write_all(s->log_fd, rest + w, want - (size_t)w);
        }
    }
    if (s->console && !raw_console(s)) {
        size_t n = tl;
        memcpy(s->obuf, ts, tl);
        if (s->prefix) {
            int k = snprintf(s->obuf + n, PREFIX_MAX, "[rank %d] ", s->rank);
            if (k > 0 && k < PREFIX_MAX) n += (size_t)k;
        }
        memcpy(s->obuf + n, s->line, s->line_len);
        n += s->line_len;
        s->obuf[n++] = '\n';
        tdr_sink_put(s->console, s->obuf, n);
    }
    s->line_len = 0;
}

static void tail_end_line(tdr_stream_t *s)
{
    char *slot = s->tail + (size_t)s->tail_next * TDR_TAIL_LINE_MAX;
    slot[s->tail_cur] = '\0';
    s->tail_next = (s->tail_next + 1) % TDR_TAIL_LINES;
    if (s->tail_count < TDR_TAIL_LINES) s->tail_count++;
    s->tail_cur = 0;
    s->tail_partial = false;
}

static void tail_feed(tdr_stream_t *s, const char *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (p[i] == '\n') {
            tail_end_line(s);
            continue;
        }
        s->tail_partial = true;
        if (s->tail_cur < TDR_TAIL_LINE_MAX - 1) {
            s->tail[(size_t)s->tail_next * TDR_TAIL_LINE_MAX + s->tail_cur] = p[i];
            s->tail_cur++;
        }
    }
}

static void lines_feed(tdr_stream_t *s, const char *p, size_t n)
{
    while (n > 0) {
        const char *nl = memchr(p, '\n', n);
        size_t seg = nl ? (size_t)(nl - p) : n;
        size_t room = TDR_LINE_MAX - s->line_len;
        if (seg >= room) { /* the line is too long: forward what fits as a line */
            memcpy(s->line + s->line_len, p, room);
            s->line_len += room;
            emit_line(s);
            p += room;
            n -= room;
            continue;
        }
        memcpy(s->line + s->line_len, p, seg);
        s->line_len += seg;
        p += seg;
        n -= seg;
        if (nl) {
            emit_line(s);
            p++;
            n--;
        }
    }
}

/* One read: 1 when bytes were forwarded, 0 at end of file (the stream is
 * closed), -1 when the pipe is empty for now. */
static int pump_once(tdr_stream_t *s)
{
    if (s->fd < 0) return 0;
    char chunk[CHUNK];
    ssize_t n;
    TDIST_SYSCALL(n, read(s->fd, chunk, sizeof chunk));
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return -1;
    if (n <= 0) { /* end of file, or an error that ends the stream all the same */
        tdr_stream_close(s);
        return 0;
    }
    size_t len = (size_t)n;
    if (s->tee_fd >= 0) write_all(s->tee_fd, chunk, len);
    if (lines_mode(s)) lines_feed(s, chunk, len);
    if (raw_console(s)) tdr_sink_put(s->console, chunk, len);
    if (s->keep_tail) tail_feed(s, chunk, len);
    return 1;
}

int tdr_stream_pump(tdr_stream_t *s)
{
    return pump_once(s) != 0;
}

void tdr_stream_drain(tdr_stream_t *s)
{
    for (int i = 0; i < DRAIN_READS; i++)
        if (pump_once(s) <= 0) return;
}

void tdr_stream_close(tdr_stream_t *s)
{
    if (s->fd < 0) return;
    close(s->fd);
    s->fd = -1;
    if (s->line && s->line_len > 0) emit_line(s);
    if (s->keep_tail && s->tail_partial) tail_end_line(s);
}

int tdr_stream_print_tail(const tdr_stream_t *s)
{
    if (!s->tail) return 0;
    int first = (s->tail_next - s->tail_count + TDR_TAIL_LINES) % TDR_TAIL_LINES;
    for (int i = 0; i < s->tail_count; i++) {
        const char *line = s->tail + (size_t)((first + i) % TDR_TAIL_LINES) * TDR_TAIL_LINE_MAX;
        tdr_eprintf("    | %s\n", line);
    }
    return s->tail_count;
}

void tdr_stream_fini(tdr_stream_t *s)
{
    free(s->line);
    free(s->obuf);
    free(s->tail);
    s->line = s->obuf = s->tail = NULL;
}
