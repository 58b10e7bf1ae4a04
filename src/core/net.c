/* core/net.c — socket helpers for every layer (see net.h). */
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/net.h"

#define RETRY_INTERVAL_MS 50

/* ------------------------------------------------------------ addresses */

const char *tdist__net_addr_str(const char *host, uint16_t port, char *buf, size_t n)
{
    if (host && strchr(host, ':'))
        snprintf(buf, n, "[%s]:%u", host, (unsigned)port);
    else
        snprintf(buf, n, "%s:%u", host ? host : "(null)", (unsigned)port);
    return buf;
}

void tdist__net_sockaddr_str(const struct sockaddr_storage *ss, char *buf, size_t n)
{
    char ip[INET6_ADDRSTRLEN] = "?";
    if (ss->ss_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)ss;
        inet_ntop(AF_INET6, &a->sin6_addr, ip, sizeof ip);
        snprintf(buf, n, "[%s]:%u", ip, (unsigned)ntohs(a->sin6_port));
    } else {
        const struct sockaddr_in *a = (const struct sockaddr_in *)ss;
        inet_ntop(AF_INET, &a->sin_addr, ip, sizeof ip);
        snprintf(buf, n, "%s:%u", ip, (unsigned)ntohs(a->sin_port));
    }
}

uint16_t tdist__net_sockaddr_port(const struct sockaddr_storage *ss)
{
    return ss->ss_family == AF_INET6 ? ntohs(((const struct sockaddr_in6 *)ss)->sin6_port)
                                     : ntohs(((const struct sockaddr_in *)ss)->sin_port);
}

bool tdist__net_parse_ip(const char *s, size_t len, uint16_t port, struct sockaddr_storage *ss,
                         socklen_t *sl)
{
    char ip[INET6_ADDRSTRLEN + 2];
    if (len >= 2 && s[0] == '[' && s[len - 1] == ']') {
        s++;
        len -= 2;
    }
    if (len == 0 || len >= sizeof ip) return false;
    memcpy(ip, s, len);
    ip[len] = '\0';
    memset(ss, 0, sizeof *ss);
    struct sockaddr_in *a4 = (struct sockaddr_in *)ss;
    struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)ss;
    if (inet_pton(AF_INET, ip, &a4->sin_addr) == 1) {
        a4->sin_family = AF_INET;
        a4->sin_port = htons(port);
        *sl = sizeof *a4;
        return true;
    }
    if (inet_pton(AF_INET6, ip, &a6->sin6_addr) == 1) {
        a6->sin6_family = AF_INET6;
        a6->sin6_port = htons(port);
        *sl = sizeof *a6;
        return true;
    }
    return false;
}

bool tdist__net_parse_ip_port(const char *s, struct sockaddr_storage *ss, socklen_t *sl)
{
    const char *colon = strrchr(s, ':');
    if (!colon || colon == s) return false;
    /* more than one ':' is an IPv6 literal, which needs its brackets */
    if (strchr(s, ':') != colon && !(s[0] == '[' && colon[-1] == ']')) return false;
    int64_t port;
    if (tdist__parse_int(colon + 1, 1, 65535, &port) != 0) return false;
    return tdist__net_parse_ip(s, (size_t)(colon - s), (uint16_t)port, ss, sl);
}

/* --------------------------------------------------------------- sockets */

void tdist__net_nodelay(int fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/* Close fd keeping errno; returns -1. */
static int close_keep_errno(int fd)
{
    int e = errno;
    close(fd);
    errno = e;
    return -1;
}

int tdist__net_listen_fd(struct sockaddr_storage *ss, socklen_t sl, int backlog, unsigned flags,
                         const char **failed)
{
    int fd = socket(ss->ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        *failed = "socket";
        return -1;
    }
    int one = 1;
    if (flags & TDIST__NET_REUSEADDR) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (ss->ss_family == AF_INET6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
    if (bind(fd, (struct sockaddr *)ss, sl) != 0) {
        *failed = "bind";
        return close_keep_errno(fd);
    }
    if (listen(fd, backlog) != 0) {
        *failed = "listen";
        return close_keep_errno(fd);
    }
    socklen_t len = sizeof *ss;
    if (getsockname(fd, (struct sockaddr *)ss, &len) != 0) {
        *failed = "getsockname";
        return close_keep_errno(fd);
    }
    return fd;
}

int tdist__net_connect_start(const struct sockaddr *sa, socklen_t sl, bool *pending,
                             const char **failed)
{
    int fd = socket(sa->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        *failed = "socket";
        return -1;
    }
    tdist__net_nodelay(fd);
    int rc;
    TDIST_SYSCALL(rc, connect(fd, sa, sl));
    if (rc != 0 && errno != EINPROGRESS) {
        *failed = "connect";
        return close_keep_errno(fd);
    }
    *pending = rc != 0;
    return fd;
}

int tdist__net_connect_result(int fd)
{
    int err = 0;
    socklen_t sl = sizeof err;
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &sl) != 0) return errno;
    return err;
}

/* ------------------------------------------ the store's blocking client */

/* Resolve host:port (numeric port) for a stream socket. passive: for
 * bind. Returns TDIST_OK with *res to release with freeaddrinfo.
 * A numeric address resolves at once; a name asks the system resolver,
 * which has its own timeout (resolv.conf), not the caller's deadline. */
static tdist_status_t resolve(const char *host, uint16_t port, bool passive, struct addrinfo **res)
{
    char portstr[8], addr[320];
    if (strnlen(host, 256) > 255)
        return tdist__error(TDIST_ERR_INVALID_ARG, "host name \"%.40s...\" is longer than 255 bytes",
                            host);
    snprintf(portstr, sizeof portstr, "%u", (unsigned)port);
    struct addrinfo hints;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
    int rc = getaddrinfo(host, portstr, &hints, res);
    if (rc != 0) {
        tdist__net_addr_str(host, port, addr, sizeof addr);
        if (rc == EAI_SYSTEM)
            return tdist__error_errno(errno, "cannot resolve %s", addr);
        return tdist__error(TDIST_ERR_CONNECTION, "cannot resolve %s: %s", addr, gai_strerror(rc));
    }
    return TDIST_OK;
}

tdist_status_t tdist__net_listen_error(int err, const char *failed, const char *who,
                                      const char *addr)
{
    if (strcmp(failed, "socket") == 0)
        return tdist__error_errno(err, "%slisten on %s: socket", who, addr);
    if (strcmp(failed, "bind") == 0) return tdist__error_errno(err, "%scannot bind %s", who, addr);
    if (strcmp(failed, "listen") == 0) return tdist__error_errno(err, "%slisten on %s", who, addr);
    return tdist__error_errno(err, "%sgetsockname for %s", who, addr);
}

tdist_status_t tdist__net_listen(const char *host, uint16_t port, int backlog, int *fd_out,
                                 uint16_t *port_out)
{
    char addr[320];
    tdist__net_addr_str(host, port, addr, sizeof addr);
    struct addrinfo *res = NULL;
    TDIST_CHECK(resolve(host, port, true, &res));
    tdist_status_t st = TDIST_OK; /* the last failure, once there is one */
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        struct sockaddr_storage ss;
        if (ai->ai_addrlen > sizeof ss) continue;
        memcpy(&ss, ai->ai_addr, ai->ai_addrlen);
        const char *failed = "";
        int fd = tdist__net_listen_fd(&ss, ai->ai_addrlen, backlog, TDIST__NET_REUSEADDR, &failed);
        if (fd >= 0) {
            freeaddrinfo(res);
            *fd_out = fd;
            *port_out = tdist__net_sockaddr_port(&ss);
            return TDIST_OK;
        }
        int e = errno;
        bool in_use = e == EADDRINUSE;
        if (in_use && strcmp(failed, "bind") == 0) {
            /* another address of the name will not do better */
            freeaddrinfo(res);
            return tdist__error_errno(e, "cannot bind %s: address already in use", addr);
        }
        st = tdist__net_listen_error(e, failed, "", addr);
        if (in_use) break;
    }
    freeaddrinfo(res);
    if (st == TDIST_OK) st = tdist__error(TDIST_ERR_SYSTEM, "listen on %s: no usable address", addr);
    return st;
}

/* Wait until fd is ready for events or deadline passes. Returns 1 ready,
 * 0 deadline passed, -1 poll failed (errno set). */
static int wait_fd(int fd, short events, int64_t deadline_ms)
{
    for (;;) {
        struct pollfd p = {.fd = fd, .events = events};
        int rc = poll(&p, 1, tdist__ms_left(deadline_ms));
        if (rc > 0) return 1;
        if (rc == 0) {
            if (tdist__ms_left(deadline_ms) == 0) return 0;
            continue;
        }
        if (errno != EINTR) return -1;
    }
}

/* One connect attempt to ai before deadline. Returns fd, or -1 with errno
 * (ETIMEDOUT when the deadline passed). */
static int connect_once(const struct addrinfo *ai, int64_t deadline_ms)
{
    bool pending = false;
    const char *failed;
    int fd = tdist__net_connect_start(ai->ai_addr, ai->ai_addrlen, &pending, &failed);
    if (fd < 0 || !pending) return fd;
    int w = wait_fd(fd, POLLOUT, deadline_ms);
    if (w == 0) errno = ETIMEDOUT;
    if (w <= 0) return close_keep_errno(fd);
    int err = tdist__net_connect_result(fd);
    if (err != 0) {
        errno = err;
        return close_keep_errno(fd);
    }
    return fd;
}

tdist_status_t tdist__net_connect(const char *host, uint16_t port, int64_t retry_deadline_ms,
                                  int64_t deadline_ms, int *fd_out)
{
    char addr[320];
    tdist__net_addr_str(host, port, addr, sizeof addr);
    if (retry_deadline_ms > deadline_ms) retry_deadline_ms = deadline_ms;
    struct addrinfo *res = NULL;
    TDIST_CHECK(resolve(host, port, false, &res));
    int64_t start = tdist__now_ms();
    int attempts = 0, last_err = 0;
    for (;;) {
        attempts++;
        for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
            int fd = connect_once(ai, deadline_ms);
            if (fd >= 0) {
                freeaddrinfo(res);
                *fd_out = fd;
                return TDIST_OK;
            }
            last_err = errno;
        }
        bool retryable = last_err == ECONNREFUSED || last_err == ECONNRESET ||
                         last_err == ECONNABORTED || last_err == EAGAIN;
        int64_t now = tdist__now_ms();
        if (!retryable || now >= retry_deadline_ms) break;
        int64_t nap = TDIST_MIN((int64_t)RETRY_INTERVAL_MS, retry_deadline_ms - now);
        tdist__sleep_ms((int)nap);
    }
    freeaddrinfo(res);
    int64_t spent = tdist__now_ms() - start;
    if (last_err == ETIMEDOUT)
        return tdist__error(TDIST_ERR_TIMEOUT,
                            "connect to %s: timed out after %lld ms (%d attempt%s)", addr,
                            (long long)spent, attempts, attempts == 1 ? "" : "s");
    tdist_status_t st = tdist__error_errno(last_err, "connect to %s failed after %lld ms (%d attempt%s)",
                                           addr, (long long)spent, attempts,
                                           attempts == 1 ? "" : "s");
    /* every connect failure is a connection problem for the caller */
    return st == TDIST_ERR_SYSTEM ? TDIST_ERR_CONNECTION : st;
}

tdist_status_t tdist__net_send_all(int fd, const void *buf, size_t len, int64_t deadline_ms,
                                   const char *what)
{
    const uint8_t *p = buf;
    while (len > 0) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            int w = wait_fd(fd, POLLOUT, deadline_ms);
            if (w == 0) return tdist__error(TDIST_ERR_TIMEOUT, "%s: send timed out", what);
            if (w < 0) return tdist__error_errno(errno, "%s: poll", what);
            continue;
        }
        int e = n < 0 ? errno : EPIPE;
        tdist_status_t st = tdist__error_errno(e, "%s: send failed", what);
        return st == TDIST_ERR_SYSTEM ? TDIST_ERR_CONNECTION : st;
    }
    return TDIST_OK;
}

tdist_status_t tdist__net_recv_all(int fd, void *buf, size_t len, int64_t deadline_ms,
                                   const char *what)
{
    uint8_t *p = buf;
    while (len > 0) {
        ssize_t n = recv(fd, p, len, 0);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
            continue;
        }
        if (n == 0)
            return tdist__error(TDIST_ERR_CONNECTION, "%s: connection closed by peer", what);
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            int w = wait_fd(fd, POLLIN, deadline_ms);
            if (w == 0) return tdist__error(TDIST_ERR_TIMEOUT, "%s: no reply before the deadline", what);
            if (w < 0) return tdist__error_errno(errno, "%s: poll", what);
            continue;
        }
        tdist_status_t st = tdist__error_errno(errno, "%s: recv failed", what);
        return st == TDIST_ERR_SYSTEM ? TDIST_ERR_CONNECTION : st;
    }
    return TDIST_OK;
}
