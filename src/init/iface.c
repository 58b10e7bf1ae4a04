/*
 * init/iface.c — which local address a multi-host process group's TCP
 * transports listen on: TDIST_SOCKET_IFNAME (NCCL_SOCKET_IFNAME's syntax),
 * else the address that routes to the store, else the first non-loopback
 * interface. The policy is described in init/internal.h and
 * docs/multihost.md.
 *
 * Parsing and choosing are pure functions over a list of interfaces
 * (tests/init/test_iface.c feeds them made-up lists); only
 * tdist__iface_list and tdist__iface_route_to ask the kernel.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "init/internal.h"

#define VAR "TDIST_SOCKET_IFNAME"

/* ---------------------------------------------------------------- parse */

static bool is_blank(char c) { return c == ' ' || c == '\t'; }

tdist_status_t tdist__ifspec_parse(const char *var, const char *spec, tdist__ifspec_t *out)
{
    if (!var) var = VAR;
    if (!spec || !out)
        return tdist__error(TDIST_ERR_INVALID_ARG, "%s: no interface list given (NULL)", var);
    tdist__ifspec_t s;
    memset(&s, 0, sizeof s);
    const char *p = spec;
    while (is_blank(*p)) p++;
    if (*p == '^') {
        s.exclude = true;
        p++;
    }
    if (*p == '=') {
        s.exact = true;
        p++;
    }
    for (;;) {
        while (is_blank(*p)) p++;
        const char *start = p;
        while (*p && *p != ',') p++;
        const char *end = p;
        while (end > start && is_blank(end[-1])) end--;
        size_t len = (size_t)(end - start);
        if (len == 0)
            return tdist__error(TDIST_ERR_INVALID_ARG,
                                "%s=\"%.200s\": empty interface name (expected a comma-separated "
                                "list such as \"eth0\", \"=eth0,eth1\" or \"^docker,lo\")",
                                var, spec);
        for (const char *q = start; q < end; q++)
            if (*q == '^' || *q == '=' || *q == '/' || is_blank(*q))
                return tdist__error(TDIST_ERR_INVALID_ARG,
                                    "%s=\"%.200s\": invalid character '%c' in interface name "
                                    "\"%.*s\" ('^' and '=' may only start the whole list)",
                                    var, spec, *q, (int)TDIST_MIN(len, 64), start);
        if (len >= TDIST__IFNAME_MAX)
            return tdist__error(TDIST_ERR_INVALID_ARG,
                                "%s=\"%.200s\": interface name \"%.*s\" is longer than %d bytes",
                                var, spec, (int)TDIST_MIN(len, 64), start, TDIST__IFNAME_MAX - 1);
        if (s.n == TDIST__IFSPEC_MAX)
            return tdist__error(TDIST_ERR_INVALID_ARG, "%s=\"%.200s\": more than %d interface names",
                                var, spec, TDIST__IFSPEC_MAX);
        memcpy(s.names[s.n], start, len);
        s.names[s.n][len] = '\0';
        s.n++;
        if (*p == '\0') break;
        p++; /* ',' */
    }
    *out = s;
    return TDIST_OK;
}

/* Does ifname match entry k of spec (ignoring '^')? exact_only: whole names. */
static bool entry_match(const tdist__ifspec_t *s, int k, const char *ifname, bool exact_only)
{
    if (s->exact || exact_only) return strcmp(ifname, s->names[k]) == 0;
    return strncmp(ifname, s->names[k], strlen(s->names[k])) == 0;
}

bool tdist__ifspec_match(const tdist__ifspec_t *spec, const char *ifname)
{
    if (!spec || !ifname) return false;
    bool hit = false;
    for (int k = 0; k < spec->n && !hit; k++) hit = entry_match(spec, k, ifname, false);
    return spec->exclude ? !hit : hit;
}

/* --------------------------------------------------------------- choose */

static bool usable(const tdist__ifaddr_t *e)
{
    return e->up && (e->family == AF_INET || (e->family == AF_INET6 && !e->link_local));
}

/* "name addr", "name addr (down)", "name (no address, down)" appended to buf. */
static void describe(const tdist__ifaddr_t *e, char *buf, size_t cap)
{
    size_t l = strlen(buf);
    if (l + 96 >= cap) {
        if (l + 5 < cap && strcmp(buf + l - 3, "...") != 0) snprintf(buf + l, cap - l, ", ...");
        return;
    }
    const char *sep = l ? ", " : "";
    if (!e->family) {
        snprintf(buf + l, cap - l, "%s%s (no address%s)", sep, e->name, e->up ? "" : ", down");
        return;
    }
    const char *flags = !e->up ? (e->link_local ? " (down, link-local)" : " (down)")
                               : (e->link_local ? " (link-local)" : "");
    snprintf(buf + l, cap - l, "%s%s %s%s", sep, e->name, e->addr, flags);
}

/* A comma list of every interface in list (each interface named once per
 * address), truncated to fit. */
static void list_all(const tdist__ifaddr_t *list, int n, char *buf, size_t cap)
{
    buf[0] = '\0';
    for (int i = 0; i < n; i++) describe(&list[i], buf, cap);
    if (n == 0) snprintf(buf, cap, "none");
}

tdist_status_t tdist__iface_choose(const char *var, const char *value, const tdist__ifspec_t *spec,
                                   const tdist__ifaddr_t *list, int n, tdist__ifaddr_t *out)
{
    if (!var) var = VAR;
    if (!spec || !out || (n > 0 && !list) || n < 0)
        return tdist__error(TDIST_ERR_INVALID_ARG, "%s: interface choice without a spec or list",
                            var);
    static const int fams[2] = {AF_INET, AF_INET6};
    if (!spec->exclude) {
        /* entry by entry; an exact name before longer names it prefixes */
        for (int k = 0; k < spec->n; k++)
            for (int exact_pass = 1; exact_pass >= 0; exact_pass--)
                for (int f = 0; f < 2; f++)
                    for (int i = 0; i < n; i++) {
                        const tdist__ifaddr_t *e = &list[i];
                        if (e->family != fams[f] || !usable(e)) continue;
                        if (!entry_match(spec, k, e->name, exact_pass == 1)) continue;
                        *out = *e;
                        return TDIST_OK;
                    }
    } else {
        /* every interface not excluded, in order; loopback only last */
        for (int lo_pass = 0; lo_pass < 2; lo_pass++)
            for (int f = 0; f < 2; f++)
                for (int i = 0; i < n; i++) {
                    const tdist__ifaddr_t *e = &list[i];
                    if (e->family != fams[f] || !usable(e) || e->loopback != (lo_pass == 1))
                        continue;
                    if (!tdist__ifspec_match(spec, e->name)) continue;
                    *out = *e;
                    return TDIST_OK;
                }
    }
    /* Nothing usable: say which interfaces matched and why they cannot
     * be used, and list what exists. */
    char matched[512] = "", all[1024];
    for (int i = 0; i < n; i++)
        if (tdist__ifspec_match(spec, list[i].name)) describe(&list[i], matched, sizeof matched);
    list_all(list, n, all, sizeof all);
    if (spec->n == 0 && spec->exclude)
        return tdist__error(TDIST_ERR_INVALID_ARG,
                            "no network interface is up with an IPv4 or IPv6 address; "
                            "interfaces here: %s",
                            all);
    if (matched[0])
        return tdist__error(TDIST_ERR_INVALID_ARG,
                            "%s=\"%.200s\": no matching interface is up with an IPv4 or "
                            "(not link-local) IPv6 address (matching: %s); interfaces here: %s",
                            var, value ? value : "", matched, all);
    return tdist__error(TDIST_ERR_INVALID_ARG,
                        "%s=\"%.200s\": no interface %s; interfaces here: %s", var,
                        value ? value : "",
                        spec->exclude ? "is left after the exclusions" : "matches", all);
}

/* ----------------------------------------------------------------- list */

typedef struct lister {
    tdist__ifaddr_t *v;
    int n, cap;
} lister_t;

static tdist__ifaddr_t *push(lister_t *l)
{
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 16;
        tdist__ifaddr_t *v = realloc(l->v, (size_t)cap * sizeof *v);
        if (!v) return NULL;
        l->v = v;
        l->cap = cap;
    }
    tdist__ifaddr_t *e = &l->v[l->n++];
    memset(e, 0, sizeof *e);
    return e;
}

/* Interface index for sorting (0 if gone meanwhile: sorts first, harmless). */
static unsigned if_index(const char *name) { return if_nametoindex(name); }

tdist_status_t tdist__iface_list(tdist__ifaddr_t **out, int *n)
{
    if (!out || !n) return tdist__error(TDIST_ERR_INVALID_ARG, "tdist__iface_list: NULL output");
    struct ifaddrs *ifs = NULL;
    if (getifaddrs(&ifs) != 0) return tdist__error_errno(errno, "listing network interfaces (getifaddrs)");
    lister_t l = {0};
    unsigned *idx = NULL;
    tdist_status_t st = TDIST_OK;
    /* addresses first, then the interfaces that have none */
    for (int pass = 0; pass < 2 && st == TDIST_OK; pass++) {
        for (struct ifaddrs *a = ifs; a; a = a->ifa_next) {
            if (!a->ifa_name || strlen(a->ifa_name) >= TDIST__IFNAME_MAX) continue;
            int fam = a->ifa_addr ? a->ifa_addr->sa_family : 0;
            bool ip = fam == AF_INET || fam == AF_INET6;
            if (pass == 0 && !ip) continue;
            if (pass == 1) {
                if (ip) continue;
                bool seen = false;
                for (int i = 0; i < l.n && !seen; i++) seen = strcmp(l.v[i].name, a->ifa_name) == 0;
                if (seen) continue;
                fam = 0;
            }
            tdist__ifaddr_t *e = push(&l);
            if (!e) {
                st = tdist__error(TDIST_ERR_NO_MEMORY, "listing network interfaces: out of memory");
                break;
            }
            snprintf(e->name, sizeof e->name, "%s", a->ifa_name);
            e->family = fam;
            e->up = (a->ifa_flags & IFF_UP) != 0;
            e->loopback = (a->ifa_flags & IFF_LOOPBACK) != 0;
            if (fam == AF_INET) {
                const struct sockaddr_in *s4 = (const void *)a->ifa_addr;
                inet_ntop(AF_INET, &s4->sin_addr, e->addr, sizeof e->addr);
            } else if (fam == AF_INET6) {
                const struct sockaddr_in6 *s6 = (const void *)a->ifa_addr;
                inet_ntop(AF_INET6, &s6->sin6_addr, e->addr, sizeof e->addr);
                e->link_local = IN6_IS_ADDR_LINKLOCAL(&s6->sin6_addr);
            }
        }
    }
    freeifaddrs(ifs);
    if (st == TDIST_OK && l.n > 0) {
        idx = malloc((size_t)l.n * sizeof *idx);
        if (!idx) st = tdist__error(TDIST_ERR_NO_MEMORY, "listing network interfaces: out of memory");
    }
    if (st != TDIST_OK) {
        free(l.v);
        free(idx);
        return st;
    }
    /* kernel (interface index) order, stable: an interface's IPv4
     * addresses stay before its IPv6 ones */
    for (int i = 0; i < l.n; i++) idx[i] = if_index(l.v[i].name);
    for (int i = 1; i < l.n; i++) {
        tdist__ifaddr_t e = l.v[i];
        unsigned k = idx[i];
        int j = i - 1;
        while (j >= 0 && idx[j] > k) {
            l.v[j + 1] = l.v[j];
            idx[j + 1] = idx[j];
            j--;
        }
        l.v[j + 1] = e;
        idx[j + 1] = k;
    }
    free(idx);
    *out = l.v;
    *n = l.n;
    return TDIST_OK;
}

/* ---------------------------------------------------------------- route */

tdist_status_t tdist__iface_route_to(const char *host, int port, char *addr, size_t n)
{
    if (!host || !*host || !addr || n == 0)
        return tdist__error(TDIST_ERR_INVALID_ARG, "tdist__iface_route_to: no host or output");
    if (port <= 0 || port > 65535) port = 9; /* any port will do: nothing is sent */
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_DGRAM;
    hints.ai_flags = AI_NUMERICSERV;
    int g = getaddrinfo(host, ps, &hints, &res);
    if (g != 0)
        return tdist__error(TDIST_ERR_INVALID_ARG,
                            "cannot resolve the store's host \"%.200s\" to choose a network "
                            "interface: %s (set " VAR " to name the interface)",
                            host, g == EAI_SYSTEM ? strerror(errno) : gai_strerror(g));
    int err = 0;
    for (struct addrinfo *a = res; a; a = a->ai_next) {
        int fd = socket(a->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            err = errno;
            continue;
        }
        struct sockaddr_storage me;
        socklen_t ml = sizeof me;
        /* connect() on a datagram socket only picks the route and the
         * source address: no packet leaves this host */
        if (connect(fd, a->ai_addr, a->ai_addrlen) != 0 ||
            getsockname(fd, (struct sockaddr *)&me, &ml) != 0)
        {
            err = errno;
            close(fd);
            continue;
        }
        close(fd);
        char buf[TDIST__IFADDR_MAX] = "";
        if (me.ss_family == AF_INET) {
            inet_ntop(AF_INET, &((struct sockaddr_in *)&me)->sin_addr, buf, sizeof buf);
        } else if (me.ss_family == AF_INET6) {
            const struct in6_addr *a6 = &((struct sockaddr_in6 *)&me)->sin6_addr;
            if (IN6_IS_ADDR_V4MAPPED(a6))
                inet_ntop(AF_INET, &a6->s6_addr[12], buf, sizeof buf);
            else
                inet_ntop(AF_INET6, a6, buf, sizeof buf);
        }
        if (!buf[0]) {
            err = EAFNOSUPPORT;
            continue;
        }
        if (strlen(buf) >= n) {
            freeaddrinfo(res);
            return tdist__error(TDIST_ERR_INVALID_ARG,
                                "tdist__iface_route_to: %zu bytes are too few for address %s", n, buf);
        }
        memcpy(addr, buf, strlen(buf) + 1);
        freeaddrinfo(res);
        return TDIST_OK;
    }
    freeaddrinfo(res);
    return tdist__error(TDIST_ERR_SYSTEM,
                        "no route from this host to the store's host \"%.200s\" to choose a network "
                        "interface: %s (set " VAR " to name the interface)",
                        host, strerror(err ? err : EHOSTUNREACH));
}

/* --------------------------------------------------------------- select */

static void copy_out(char *dst, size_t n, const char *src)
{
    if (dst && n) snprintf(dst, n, "%s", src);
}

tdist_status_t tdist__iface_select(const char *master_host, int master_port, char *addr,
                                   size_t addr_n, char *ifname, size_t ifname_n, const char **how)
{
    if (!addr || addr_n == 0)
        return tdist__error(TDIST_ERR_INVALID_ARG, "tdist__iface_select: no output buffer");
    const char *value = getenv(VAR);
    const char *h = "first interface";
    tdist__ifspec_t spec;
    memset(&spec, 0, sizeof spec);
    bool by_var = value && *value;
    if (by_var) TDIST_CHECK(tdist__ifspec_parse(VAR, value, &spec));

    char routed[TDIST__IFADDR_MAX] = "";
    if (!by_var && master_host && *master_host) {
        TDIST_CHECK(tdist__iface_route_to(master_host, master_port, routed, sizeof routed));
        h = "route to the store";
    }
    tdist__ifaddr_t *list = NULL;
    int n = 0;
    tdist_status_t st = tdist__iface_list(&list, &n);
    if (st != TDIST_OK) {
        if (!routed[0]) return st;
        /* the route alone is enough; the name is only for the log */
        copy_out(addr, addr_n, routed);
        copy_out(ifname, ifname_n, "");
        if (how) *how = h;
        return TDIST_OK;
    }
    if (routed[0]) {
        if (strlen(routed) >= addr_n) {
            free(list);
            return tdist__error(TDIST_ERR_INVALID_ARG, "tdist__iface_select: address buffer too small");
        }
        copy_out(addr, addr_n, routed);
        copy_out(ifname, ifname_n, "");
        for (int i = 0; i < n; i++)
            if (list[i].family && strcmp(list[i].addr, routed) == 0) {
                copy_out(ifname, ifname_n, list[i].name);
                break;
            }
        free(list);
        if (how) *how = h;
        return TDIST_OK;
    }
    if (by_var) {
        h = VAR;
    } else {
        spec.exclude = true; /* nothing excluded: the first interface, loopback last */
        spec.n = 0;
    }
    tdist__ifaddr_t pick;
    st = tdist__iface_choose(VAR, value, &spec, list, n, &pick);
    free(list);
    if (st != TDIST_OK) return st;
    if (strlen(pick.addr) >= addr_n)
        return tdist__error(TDIST_ERR_INVALID_ARG, "tdist__iface_select: address buffer too small");
    copy_out(addr, addr_n, pick.addr);
    copy_out(ifname, ifname_n, pick.name);
    if (how) *how = h;
    return TDIST_OK;
}
