/*
 * core/net.h — socket helpers every layer uses (store, transport, the MPI
 * module through its host table): numeric address parsing and formatting,
 * a listening socket on one address (port 0: the kernel picks), a
 * nonblocking connect, and — for the store's blocking client — connect
 * with retries and a deadline and whole-buffer send/recv with a deadline.
 *
 * Every socket made here is nonblocking and close-on-exec; IPv6 sockets
 * are IPv6-only, so "::" never also claims the IPv4 port. The low-level
 * calls (tdist__net_listen_fd, tdist__net_connect_start) set no error
 * message: they return -1 with errno and name the system call that failed,
 * so each caller words the error (or the set-up note) in its own terms.
 * The others set the thread's last error (tdist__error*), naming host:port.
 *
 * Thread safety: every function is safe to call from any thread; none
 * keeps state between calls.
 */
#ifndef TDIST_CORE_NET_H
#define TDIST_CORE_NET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "core/internal.h"

/* ------------------------------------------------------------ addresses */

/* Format "host:port" (a host with a ':' — an IPv6 literal — in brackets)
 * into buf (n bytes). Returns buf. Never blocks. */
const char *tdist__net_addr_str(const char *host, uint16_t port, char *buf, size_t n);

/* Format a socket address as "ip:port" or "[ip6]:port" into buf (n
 * bytes). Never blocks. */
void tdist__net_sockaddr_str(const struct sockaddr_storage *ss, char *buf, size_t n);

/* The port of an IPv4 or IPv6 socket address, in host order. */
uint16_t tdist__net_sockaddr_port(const struct sockaddr_storage *ss);

/* Parse the len bytes at s as a numeric IPv4 or IPv6 literal (brackets
 * allowed around IPv6: "10.0.0.2", "::1", "[::1]") with the given port into
 * *ss and its length into *sl. Returns false (ss, sl unspecified) if s is
 * not one; never resolves a name, never blocks. */
bool tdist__net_parse_ip(const char *s, size_t len, uint16_t port, struct sockaddr_storage *ss,
                         socklen_t *sl);

/* Parse "ip:port" or "[ip6]:port" (numeric; port 1..65535), as
 * tdist__net_parse_ip. */
bool tdist__net_parse_ip_port(const char *s, struct sockaddr_storage *ss, socklen_t *sl);

/* --------------------------------------------------------------- sockets */

/* Turn off Nagle's algorithm on a TCP socket (best effort: a failure is
 * ignored, the socket still works). */
void tdist__net_nodelay(int fd);

/* tdist__net_listen_fd's flags. */
#define TDIST__NET_REUSEADDR 1u /* SO_REUSEADDR: a restarted server may take its port at once */

/* Open a stream socket listening on *ss (sl bytes; port 0: the kernel
 * picks a free one) with the given backlog, and write the address it is
 * bound to (with its port) back into *ss. Returns the socket (nonblocking,
 * close-on-exec; the caller owns and closes it), or -1 with errno set and
 * *failed naming the call that failed ("socket", "bind", "listen",
 * "getsockname"); then nothing is left open. Sets no error message. Never
 * blocks. */
int tdist__net_listen_fd(struct sockaddr_storage *ss, socklen_t sl, int backlog, unsigned flags,
                         const char **failed);

/* Set and return the error of a tdist__net_listen_fd that failed in the
 * call `failed` with errno err, for the address addr (as text): "<who>cannot
 * bind <addr>: <strerror>", "<who>listen on <addr>: socket: ...", and so on.
 * who prefixes the message ("" or e.g. "rank 3: transport "). */
tdist_status_t tdist__net_listen_error(int err, const char *failed, const char *who,
                                      const char *addr);

/* Start a nonblocking connect to sa (sl bytes) from a new nonblocking,
 * close-on-exec socket with TCP_NODELAY. Returns the socket (the caller
 * owns it) with *pending set when the connection is still being made
 * (EINPROGRESS: wait for POLLOUT, then ask tdist__net_connect_result), or
 * -1 with errno set and *failed naming the call ("socket", "connect"); then
 * nothing is left open. Sets no error message. Never blocks; EINTR is
 * retried. */
int tdist__net_connect_start(const struct sockaddr *sa, socklen_t sl, bool *pending,
                             const char **failed);

/* The outcome of a nonblocking connect on fd, once poll says POLLOUT: 0
 * connected, EINPROGRESS or EALREADY still under way, else the errno it
 * failed with (SO_ERROR, or getsockopt's own failure). Never blocks. */
int tdist__net_connect_result(int fd);

/* ------------------------------------------ the store's blocking client */

/* Create a socket listening on host:port (a name or a numeric address;
 * only that address; port 0 picks a free one) with the given backlog and
 * SO_REUSEADDR. Writes the fd (the caller owns it) and the bound port.
 * EADDRINUSE -> TDIST_ERR_ADDR_IN_USE naming host:port. Blocks only while
 * the system resolver looks a name up. */
tdist_status_t tdist__net_listen(const char *host, uint16_t port, int backlog, int *fd_out,
                                 uint16_t *port_out);

/* Connect to host:port: a blocking-mode (for the caller) socket made with a
 * nonblocking connect. Refused (or reset) attempts are retried every
 * ~50 ms until retry_deadline_ms; no attempt runs past deadline_ms
 * (absolute tdist__now_ms() values; INT64_MAX = none). The socket (the
 * caller owns it) is left nonblocking, close-on-exec, with TCP_NODELAY.
 * Errors name host:port: TDIST_ERR_CONNECTION (refused, unreachable) or
 * TDIST_ERR_TIMEOUT. Blocks until connected or a deadline. */
tdist_status_t tdist__net_connect(const char *host, uint16_t port, int64_t retry_deadline_ms,
                                  int64_t deadline_ms, int *fd_out);

/* Send all len bytes on a nonblocking fd before deadline_ms (absolute).
 * Handles EINTR, EAGAIN (poll) and partial writes; never raises SIGPIPE.
 * Returns TDIST_OK, or TDIST_ERR_TIMEOUT / TDIST_ERR_CONNECTION /
 * TDIST_ERR_SYSTEM with a message that starts with what (e.g. the
 * address and operation). Blocks until sent or the deadline. */
tdist_status_t tdist__net_send_all(int fd, const void *buf, size_t len, int64_t deadline_ms,
                                   const char *what);

/* Receive exactly len bytes on a nonblocking fd before deadline_ms. A
 * closed connection is TDIST_ERR_CONNECTION ("connection closed by peer").
 * Same conventions as tdist__net_send_all. */
tdist_status_t tdist__net_recv_all(int fd, void *buf, size_t len, int64_t deadline_ms,
                                   const char *what);

#endif /* TDIST_CORE_NET_H */
