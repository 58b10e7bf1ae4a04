/* tools/tdistrun/output.c — forwarding worker output line by line.
 *
 * Each worker's stdout and stderr arrive on a pipe. With prefixing on,
 * bytes are collected into lines and every line is written to the
 * launcher's matching stream as "[rank R] line\n" in one write(), so lines
 * of different workers never mix. A partial line waits for its newline or
 * for end of file; a line longer than TDR_LINE_MAX bytes is forwarded in
 * pieces of that size. With prefixing off, bytes are passed through as they
 * come. The last TDR_TAIL_LINES lines of stderr are remembered (each cut to
 * TDR_TAIL_LINE_MAX bytes) for the failure report.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/internal.h"
#include "tdistrun.h"

#define PREFIX_MAX 32 /* "[rank 65535] " and then some */

void tdr_write_all(int fd, const void *buf, size_t len)
{
    const char *p = buf;
    while (len > 0) {
        ssize_t n = write(fd, p, len);
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN) { /* a non-blocking terminal or pipe: wait a little */
                tdist__sleep_ms(1);
                continue;
            }
            return; /* EPIPE and friends: the reader is gone; drop the output */
        }
        p += n;
        len -= (size_t)n;
    }
}

int tdr_stream_init(tdr_stream_t *s, int fd, int out_fd, int tee_fd, int rank, bool prefix,
                    bool keep_tail)
{
    memset(s, 0, sizeof *s);
    s->fd = fd;
    s->out_fd = out_fd;
    s->tee_fd = tee_fd;
    s->rank = rank;
    s->prefix = prefix;
    s->keep_tail = keep_tail;
    if (prefix) {
        s->line = malloc(TDR_LINE_MAX);
        s->obuf = malloc(PREFIX_MAX + TDR_LINE_MAX + 1);
        if (!s->line || !s->obuf) goto oom;
    }
    if (keep_tail) {
        s->tail = calloc(TDR_TAIL_LINES, TDR_TAIL_LINE_MAX);
        if (!s->tail) goto oom;
    }
    return 0;
oom:
    tdr_stream_fini(s);
    return -1;
}

/* Write the assembled line as "[rank R] line\n" and start a new one. */
static void emit_line(tdr_stream_t *s)
{
    int n = snprintf(s->obuf, PREFIX_MAX, "[rank %d] ", s->rank);
    if (n < 0 || n >= PREFIX_MAX) n = 0;
    memcpy(s->obuf + n, s->line, s->line_len);
    s->obuf[(size_t)n + s->line_len] = '\n';
    tdr_write_all(s->out_fd, s->obuf, (size_t)n + s->line_len + 1);
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

int tdr_stream_pump(tdr_stream_t *s)
{
    if (s->fd < 0) return 0;
    char chunk[16384];
    ssize_t n;
    TDIST_SYSCALL(n, read(s->fd, chunk, sizeof chunk));
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 1;
    if (n <= 0) { /* end of file, or an error that ends the stream all the same */
        tdr_stream_close(s);
        return 0;
    }
    size_t len = (size_t)n;
    if (s->tee_fd >= 0) tdr_write_all(s->tee_fd, chunk, len);
    if (s->prefix)
        lines_feed(s, chunk, len);
    else
        tdr_write_all(s->out_fd, chunk, len);
    if (s->keep_tail) tail_feed(s, chunk, len);
    return 1;
}

void tdr_stream_close(tdr_stream_t *s)
{
    if (s->fd < 0) return;
    close(s->fd);
    s->fd = -1;
    if (s->prefix && s->line_len > 0) emit_line(s);
    if (s->keep_tail && s->tail_partial) tail_end_line(s);
}

int tdr_stream_print_tail(const tdr_stream_t *s, FILE *f)
{
    if (!s->tail) return 0;
    int first = (s->tail_next - s->tail_count + TDR_TAIL_LINES) % TDR_TAIL_LINES;
    for (int i = 0; i < s->tail_count; i++) {
        const char *line = s->tail + (size_t)((first + i) % TDR_TAIL_LINES) * TDR_TAIL_LINE_MAX;
        fprintf(f, "    | %s\n", line);
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
