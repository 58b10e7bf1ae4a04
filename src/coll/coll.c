/*
 * coll/coll.c — helpers shared by the collective algorithms (select.c
 * chooses among them): scratch, waits, send/recv, input and finish.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll/coll_internal.h"

/* ------------------------------------------------------------ helpers */

tdist_status_t tdist__coll_alloc(const tdist__coll_ctx_t *c, size_t bytes, const char *what,
                                 void **out)
{
    void *p = malloc(bytes ? bytes : 1);
    if (!p)
        return tdist__error(TDIST_ERR_NO_MEMORY, "rank %d: collective scratch for %s: cannot "
                            "allocate %zu bytes", c->rank, what, bytes);
    *out = p;
    return TDIST_OK;
}

tdist_status_t tdist__coll_scratch_get(const tdist__coll_ctx_t *c, size_t bytes, const char *what,
                                       void **out)
{
    tdist__coll_scratch_t *s = c->scratch;
    if (!s) return tdist__coll_alloc(c, bytes, what, out);
    if (s->len < bytes) {
        void *p = malloc(bytes);
        if (!p)
            return tdist__error(TDIST_ERR_NO_MEMORY, "rank %d: collective scratch for %s: cannot "
                                "allocate %zu bytes", c->rank, what, bytes);
        free(s->p);
        s->p = p;
        s->len = bytes;
    }
    *out = s->p;
    return TDIST_OK;
}

void tdist__coll_scratch_done(const tdist__coll_ctx_t *c, void *p)
{
    if (!c->scratch || p != c->scratch->p) free(p);
}

void tdist__coll_scratch_release(tdist__coll_scratch_t *s)
{
    if (!s) return;
    free(s->p);
    s->p = NULL;
    s->len = 0;
}

void tdist__coll_copy(void *dst, const void *src, size_t bytes)
{
    if (bytes && dst != src) memmove(dst, src, bytes);
}

/* Unlink every request that is still posted by aborting the transport
 * (its pending requests all finish). */
void tdist__coll_abandon(const tdist__coll_ctx_t *c, tdist__tp_req_t *const *reqs, size_t n)
{
    bool pending = false;
    for (size_t i = 0; i < n; i++) pending = pending || !tdist__tp_req_done(reqs[i]);
    if (!pending) return;
    char msg[512];
    snprintf(msg, sizeof msg, "%s", tdist_last_error());
    tdist__tp_abort(c->tp);
    (void)tdist__tp_progress(c->tp, 0); /* finishes every request with ABORTED */
    (void)tdist__error(TDIST_ERR_ABORTED, "%s", msg); /* restore the message */
}

tdist_status_t tdist__coll_wait(const tdist__coll_ctx_t *c, tdist__tp_req_t *const *reqs,
                                size_t n)
{
    tdist_status_t st = tdist__tp_wait(c->tp, reqs, n, c->deadline_ms);
    if (st == TDIST_OK) return st;
    bool pending = false;
    for (size_t i = 0; i < n; i++) pending = pending || !tdist__tp_req_done(reqs[i]);
    if (!pending) return st;
    char msg[512];
    snprintf(msg, sizeof msg, "%s", tdist_last_error());
    tdist__coll_abandon(c, reqs, n);
    return tdist__error(st, "%s (collective abandoned: transport aborted)", msg);
}

tdist_status_t tdist__coll_sendrecv(const tdist__coll_ctx_t *c, int to, const void *sbuf,
                                    size_t slen, int from, void *rbuf, size_t rlen)
{
    tdist__tp_req_t rq, sq;
    tdist__tp_req_t *reqs[2];
    size_t n = 0;
    if (from >= 0) {
        TDIST_CHECK(tdist__tp_post_recv(c->tp, &rq, from, rbuf, rlen));
        reqs[n++] = &rq;
    }
    if (to >= 0) {
        tdist_status_t st = tdist__tp_post_send(c->tp, &sq, to, sbuf, slen);
        if (st != TDIST_OK) {
            tdist__coll_abandon(c, reqs, n);
            return st;
        }
        reqs[n++] = &sq;
    }
    return tdist__coll_wait(c, reqs, n);
}

tdist_status_t tdist__coll_send(const tdist__coll_ctx_t *c, int to, const void *buf, size_t len)
{
    return tdist__coll_sendrecv(c, to, buf, len, -1, NULL, 0);
}

tdist_status_t tdist__coll_recv(const tdist__coll_ctx_t *c, int from, void *buf, size_t len)
{
    return tdist__coll_sendrecv(c, -1, NULL, 0, from, buf, len);
}

tdist_status_t tdist__coll_load(void *buf, const void *sendbuf, size_t count, tdist_dtype_t dtype,
                                tdist_redop_t op, double premul)
{
    if (count == 0) return TDIST_OK;
    tdist__coll_copy(buf, sendbuf, tdist__coll_bytes(count, dtype));
    if (op == TDIST_PREMUL_SUM) return tdist_scale(buf, count, dtype, premul);
    return TDIST_OK;
}

tdist_status_t tdist__coll_input(void *buf, const void *sendbuf, size_t count,
                                 tdist_dtype_t dtype, tdist_redop_t op, double premul,
                                 const void **src)
{
    *src = sendbuf;
    if (op != TDIST_PREMUL_SUM) return TDIST_OK;
    *src = buf;
    return tdist__coll_load(buf, sendbuf, count, dtype, op, premul);
}

tdist_status_t tdist__coll_finish(const tdist__coll_ctx_t *c, void *buf, size_t count,
                                  tdist_dtype_t dtype, tdist_redop_t op)
{
    if (op != TDIST_AVG || count == 0) return TDIST_OK;
    return tdist_divide(buf, count, dtype, c->size);
}

void tdist__coll_split(size_t count, int size, size_t *counts, size_t *displs)
{
    size_t base = count / (size_t)size, extra = count % (size_t)size, off = 0;
    for (int r = 0; r < size; r++) {
        counts[r] = base + ((size_t)r < extra ? 1 : 0);
        displs[r] = off;
        off += counts[r];
    }
}
