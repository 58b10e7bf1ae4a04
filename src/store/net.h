/*
 * store/net.h — small socket helpers for the TCP store: address
 * resolution, a listening socket bound to exactly one address, a
 * nonblocking connect with a deadline that retries refused connections,
 * and send/recv of whole buffers with a deadline (EINTR and partial I/O
 * handled). Every error is set with tdist__error*() naming host:port.
 */
#ifndef TDIST_STORE_NET_H
#define TDIST_STORE_NET_H

#include <stddef.h>
#include <stdint.h>

#include "core/internal.h"

/* Format "host:port" (IPv6 literals in brackets) into buf. Returns buf. */
const char *tdist__net_addr_str(const char *host, uint16_t port, char *buf, size_t n);

/* Create a nonblocking, close-on-exec socket listening on host:port (only
 * that address; port 0 picks a free one) with the given backlog. Writes the
 * fd and the bound port. EADDRINUSE -> TDIST_ERR_ADDR_IN_USE naming
 * host:port. Does not block. */
tdist_status_t tdist__net_listen(const char *host, uint16_t port, int backlog, int *fd_out,
                                 uint16_t *port_out);

/* Connect to host:port: a blocking-mode (for the caller) socket made with a
 * nonblocking connect. Refused (or reset) attempts are retried every
 * ~50 ms until retry_deadline_ms; no attempt runs past deadline_ms
 * (absolute tdist__now_ms() values; INT64_MAX = none). The socket is
 * left nonblocking, close-on-exec, with TCP_NODELAY. Errors name host:port:
 * TDIST_ERR_CONNECTION (refused, unreachable) or TDIST_ERR_TIMEOUT. */
tdist_status_t tdist__net_connect(const char *host, uint16_t port, int64_t retry_deadline_ms,
                                  int64_t deadline_ms, int *fd_out);

/* Send all len bytes on a nonblocking fd before deadline_ms (absolute).
 * Handles EINTR, EAGAIN (poll) and partial writes; never raises SIGPIPE.
 * Returns TDIST_OK, or TDIST_ERR_TIMEOUT / TDIST_ERR_CONNECTION /
 * TDIST_ERR_SYSTEM with a message that starts with what (e.g. the
 * address and operation). */
tdist_status_t tdist__net_send_all(int fd, const void *buf, size_t len, int64_t deadline_ms,
                                   const char *what);

/* Receive exactly len bytes on a nonblocking fd before deadline_ms. A
 * closed connection is TDIST_ERR_CONNECTION ("connection closed by peer").
 * Same conventions as tdist__net_send_all. */
tdist_status_t tdist__net_recv_all(int fd, void *buf, size_t len, int64_t deadline_ms,
                                   const char *what);

#endif /* TDIST_STORE_NET_H */
