/* tests/init/test_iface.c — interface selection for process groups that
 * span hosts (init/iface.c): the TDIST_SOCKET_IFNAME parser, the choice
 * over made-up interface lists, the real list (loopback "lo" is always
 * there), the route to the store (127.0.0.1 only: a connected UDP socket,
 * nothing sent), and pick_bind through tdist_pg_create_world on two
 * simulated hosts. The two-namespace runs are in tests/net/. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include "harness.h"
#include "init/internal.h"

#define VARN "TDIST_SOCKET_IFNAME"

static tdist__ifspec_t parse_ok(const char *s)
{
    tdist__ifspec_t sp;
    ASSERT_OK(tdist__ifspec_parse(VARN, s, &sp));
    return sp;
}

static void parse_bad(const char *s, const char *why)
{
    tdist__ifspec_t sp;
    memset(&sp, 0x5a, sizeof sp);
    tdist__ifspec_t before = sp;
    ASSERT_STATUS(tdist__ifspec_parse(VARN, s, &sp), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), VARN "=\"");
    ASSERT_CONTAINS(tdist_last_error(), why);
    ASSERT_MEMEQ(&sp, &before, sizeof sp); /* out untouched on failure */
}

TEST(init_iface_parse, 10)
{
    tdist__ifspec_t s = parse_ok("eth0");
    ASSERT_FALSE(s.exclude);
    ASSERT_FALSE(s.exact);
    ASSERT_EQ(s.n, 1);
    ASSERT_STREQ(s.names[0], "eth0");

    s = parse_ok(" ^docker , lo ");
    ASSERT_TRUE(s.exclude);
    ASSERT_FALSE(s.exact);
    ASSERT_EQ(s.n, 2);
    ASSERT_STREQ(s.names[0], "docker");
    ASSERT_STREQ(s.names[1], "lo");

    s = parse_ok("=eth0,eth1");
    ASSERT_FALSE(s.exclude);
    ASSERT_TRUE(s.exact);
    ASSERT_EQ(s.n, 2);
    ASSERT_STREQ(s.names[1], "eth1");

    s = parse_ok("^=lo");
    ASSERT_TRUE(s.exclude && s.exact);
    ASSERT_EQ(s.n, 1);
    ASSERT_STREQ(s.names[0], "lo");

    s = parse_ok("abcdefghijklmno"); /* 15 bytes: the longest Linux name */
    ASSERT_STREQ(s.names[0], "abcdefghijklmno");
    char many[16 * 4 + 1] = "";
    for (int i = 0; i < 16; i++) snprintf(many + strlen(many), sizeof many - strlen(many), "%se%x", i ? "," : "", i);
    s = parse_ok(many);
    ASSERT_EQ(s.n, 16);
    ASSERT_STREQ(s.names[15], "ef");

    parse_bad("", "empty interface name");
    parse_bad("  ", "empty interface name");
    parse_bad("^", "empty interface name");
    parse_bad("=", "empty interface name");
    parse_bad("eth0,", "empty interface name");
    parse_bad("eth0,,eth1", "empty interface name");
    parse_bad("eth0,^lo", "'^' and '=' may only start the whole list");
    parse_bad("^^lo", "invalid character '^'");
    parse_bad("eth 0", "invalid character ' '");
    parse_bad("abcdefghijklmnop", "longer than 15 bytes");
    char more[17 * 4 + 1] = "";
    for (int i = 0; i < 17; i++) snprintf(more + strlen(more), sizeof more - strlen(more), "%se%x", i ? "," : "", i);
    parse_bad(more, "more than 16 interface names");
    ASSERT_STATUS(tdist__ifspec_parse(VARN, NULL, &s), TDIST_ERR_INVALID_ARG);
}

TEST(init_iface_match, 10)
{
    tdist__ifspec_t s = parse_ok("eth,ib");
    ASSERT_TRUE(tdist__ifspec_match(&s, "eth0"));
    ASSERT_TRUE(tdist__ifspec_match(&s, "eth"));
    ASSERT_TRUE(tdist__ifspec_match(&s, "ib1"));
    ASSERT_FALSE(tdist__ifspec_match(&s, "veth0"));
    ASSERT_FALSE(tdist__ifspec_match(&s, "et"));
    s = parse_ok("=eth0");
    ASSERT_TRUE(tdist__ifspec_match(&s, "eth0"));
    ASSERT_FALSE(tdist__ifspec_match(&s, "eth01"));
    s = parse_ok("^docker,lo");
    ASSERT_FALSE(tdist__ifspec_match(&s, "docker0"));
    ASSERT_FALSE(tdist__ifspec_match(&s, "lo"));
    ASSERT_TRUE(tdist__ifspec_match(&s, "eth0"));
    s = parse_ok("^=lo");
    ASSERT_FALSE(tdist__ifspec_match(&s, "lo"));
    ASSERT_TRUE(tdist__ifspec_match(&s, "lo2"));
    ASSERT_FALSE(tdist__ifspec_match(NULL, "lo"));
    ASSERT_FALSE(tdist__ifspec_match(&s, NULL));
}

/* A made-up host: the kernel order is the array order. */
static const tdist__ifaddr_t fake[] = {
    {.name = "lo", .family = AF_INET, .addr = "127.0.0.1", .up = true, .loopback = true},
    {.name = "eth10", .family = AF_INET, .addr = "10.10.0.1", .up = true},
    {.name = "eth0", .family = AF_INET, .addr = "10.0.0.1", .up = false},
    {.name = "eth1", .family = AF_INET6, .addr = "fe80::1", .up = true, .link_local = true},
    {.name = "eth1", .family = AF_INET, .addr = "10.1.0.1", .up = true},
    {.name = "ib0", .family = AF_INET6, .addr = "2001:db8::5", .up = true},
    {.name = "docker0", .family = AF_INET, .addr = "172.17.0.1", .up = true},
    {.name = "veth9", .family = 0, .addr = "", .up = true},
    {.name = "lo", .family = AF_INET6, .addr = "::1", .up = true, .loopback = true},
};
#define NFAKE ((int)(sizeof fake / sizeof fake[0]))

static const char *choose(const char *spec)
{
    static tdist__ifaddr_t out;
    tdist__ifspec_t s = parse_ok(spec);
    ASSERT_OK(tdist__iface_choose(VARN, spec, &s, fake, NFAKE, &out));
    static char buf[96];
    snprintf(buf, sizeof buf, "%s %s", out.name, out.addr);
    return buf;
}

static const char *choose_fails(const char *spec)
{
    tdist__ifaddr_t out;
    memset(&out, 0, sizeof out);
    tdist__ifspec_t s = parse_ok(spec);
    ASSERT_STATUS(tdist__iface_choose(VARN, spec, &s, fake, NFAKE, &out), TDIST_ERR_INVALID_ARG);
    ASSERT_STREQ(out.name, ""); /* untouched */
    const char *m = tdist_last_error();
    ASSERT_CONTAINS(m, VARN "=\"");
    ASSERT_CONTAINS(m, spec);
    /* every interface is listed, with what is wrong with it */
    ASSERT_CONTAINS(m, "interfaces here: lo 127.0.0.1, eth10 10.10.0.1, eth0 10.0.0.1 (down), "
                       "eth1 fe80::1 (link-local), eth1 10.1.0.1, ib0 2001:db8::5, docker0 "
                       "172.17.0.1, veth9 (no address), lo ::1");
    return m;
}

TEST(init_iface_choose, 10)
{
    /* prefixes: eth0 is down, eth1's IPv4 wins over its link-local IPv6;
     * an exact name beats a longer name it is a prefix of (eth1, eth10) */
    ASSERT_STREQ(choose("eth"), "eth10 10.10.0.1");
    ASSERT_STREQ(choose("eth1"), "eth1 10.1.0.1");
    ASSERT_STREQ(choose("=eth10"), "eth10 10.10.0.1");
    /* list order, not kernel order */
    ASSERT_STREQ(choose("docker,eth1"), "docker0 172.17.0.1");
    ASSERT_STREQ(choose("nope,eth1"), "eth1 10.1.0.1");
    /* IPv6 only when no matching interface has IPv4 */
    ASSERT_STREQ(choose("ib"), "ib0 2001:db8::5");
    ASSERT_STREQ(choose("ib,eth"), "ib0 2001:db8::5"); /* the list order first */
    ASSERT_STREQ(choose("eth,ib"), "eth10 10.10.0.1");
    ASSERT_STREQ(choose("lo"), "lo 127.0.0.1");
    /* exclusions: first non-excluded in kernel order, loopback last */
    ASSERT_STREQ(choose("^lo"), "eth10 10.10.0.1");
    ASSERT_STREQ(choose("^=eth10"), "eth1 10.1.0.1");
    ASSERT_STREQ(choose("^eth,docker"), "ib0 2001:db8::5");
    ASSERT_STREQ(choose("^eth,docker,ib"), "lo 127.0.0.1");

    const char *m = choose_fails("wlan");
    ASSERT_CONTAINS(m, "no interface matches");
    m = choose_fails("=eth");
    ASSERT_CONTAINS(m, "no interface matches");
    m = choose_fails("eth0");
    ASSERT_CONTAINS(m, "no matching interface is up with an IPv4 or (not link-local) IPv6 "
                       "address (matching: eth0 10.0.0.1 (down))");
    m = choose_fails("veth9");
    ASSERT_CONTAINS(m, "(matching: veth9 (no address))");
    m = choose_fails("^eth,docker,ib,veth,lo");
    ASSERT_CONTAINS(m, "no interface is left after the exclusions");

    tdist__ifaddr_t out;
    tdist__ifspec_t s = parse_ok("lo");
    ASSERT_STATUS(tdist__iface_choose(VARN, "lo", &s, NULL, 3, &out), TDIST_ERR_INVALID_ARG);
    ASSERT_STATUS(tdist__iface_choose(VARN, "lo", &s, fake, 0, &out), TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "interfaces here: none");
}

/* The real interfaces: "lo" is always there with 127.0.0.1. */
TEST(init_iface_real_loopback, 10)
{
    tdist__ifaddr_t *list = NULL;
    int n = 0;
    ASSERT_OK(tdist__iface_list(&list, &n));
    bool lo4 = false;
    for (int i = 0; i < n; i++) {
        if (strcmp(list[i].name, "lo") == 0 && list[i].family == AF_INET) {
            ASSERT_STREQ(list[i].addr, "127.0.0.1");
            ASSERT_TRUE(list[i].loopback);
            ASSERT_TRUE(list[i].up);
            lo4 = true;
        }
        ASSERT_TRUE(list[i].name[0] != '\0');
    }
    free(list);
    ASSERT_TRUE(lo4);

    char addr[TDIST__IFADDR_MAX], ifname[TDIST__IFNAME_MAX];
    const char *how = NULL;
    setenv(VARN, "lo", 1);
    ASSERT_OK(tdist__iface_select("127.0.0.1", 29500, addr, sizeof addr, ifname, sizeof ifname, &how));
    ASSERT_STREQ(addr, "127.0.0.1");
    ASSERT_STREQ(ifname, "lo");
    ASSERT_STREQ(how, VARN);
    setenv(VARN, "=lo", 1); /* the variable wins over the route to the store */
    ASSERT_OK(tdist__iface_select(NULL, 0, addr, sizeof addr, ifname, sizeof ifname, &how));
    ASSERT_STREQ(addr, "127.0.0.1");
    setenv(VARN, "tdist-no-such", 1);
    strcpy(addr, "unchanged");
    ASSERT_STATUS(tdist__iface_select("127.0.0.1", 29500, addr, sizeof addr, ifname, sizeof ifname, &how),
                  TDIST_ERR_INVALID_ARG);
    ASSERT_STREQ(addr, "unchanged");
    ASSERT_CONTAINS(tdist_last_error(), VARN "=\"tdist-no-such\": no interface matches; "
                                        "interfaces here: lo 127.0.0.1");
    setenv(VARN, "lo,", 1);
    ASSERT_STATUS(tdist__iface_select("127.0.0.1", 29500, addr, sizeof addr, NULL, 0, NULL),
                  TDIST_ERR_INVALID_ARG);
    ASSERT_CONTAINS(tdist_last_error(), "empty interface name");
    setenv(VARN, "lo", 1);
    ASSERT_STATUS(tdist__iface_select("127.0.0.1", 29500, addr, 4, NULL, 0, NULL),
                  TDIST_ERR_INVALID_ARG); /* buffer too small for 127.0.0.1 */
    unsetenv(VARN);
}

/* Unset or empty variable: the source address of the route to the store. */
TEST(init_iface_route_to_store, 10)
{
    char addr[TDIST__IFADDR_MAX], ifname[TDIST__IFNAME_MAX];
    const char *how = NULL;
    ASSERT_OK(tdist__iface_route_to("127.0.0.1", 29500, addr, sizeof addr));
    ASSERT_STREQ(addr, "127.0.0.1");
    ASSERT_OK(tdist__iface_route_to("127.0.0.1", 0, addr, sizeof addr)); /* any port */
    ASSERT_STREQ(addr, "127.0.0.1");
    unsetenv(VARN);
    ASSERT_OK(tdist__iface_select("127.0.0.1", 1234, addr, sizeof addr, ifname, sizeof ifname, &how));
    ASSERT_STREQ(addr, "127.0.0.1");
    ASSERT_STREQ(ifname, "lo");
    ASSERT_STREQ(how, "route to the store");
    setenv(VARN, "", 1); /* empty: as unset */
    ASSERT_OK(tdist__iface_select("127.0.0.1", 1234, addr, sizeof addr, ifname, sizeof ifname, &how));
    ASSERT_STREQ(how, "route to the store");
    unsetenv(VARN);
    /* no store address (file://): the first interface that is up, loopback last */
    ASSERT_OK(tdist__iface_select("", 0, addr, sizeof addr, ifname, sizeof ifname, &how));
    ASSERT_STREQ(how, "first interface");
    unsigned char bin[16];
    ASSERT_TRUE(inet_pton(AF_INET, addr, bin) == 1 || inet_pton(AF_INET6, addr, bin) == 1);
    ASSERT_TRUE(ifname[0] != '\0');
    ASSERT_STATUS(tdist__iface_route_to("", 1, addr, sizeof addr), TDIST_ERR_INVALID_ARG);
    ASSERT_STATUS(tdist__iface_route_to("127.0.0.1", 1, addr, 4), TDIST_ERR_INVALID_ARG);
}

/* pick_bind on two simulated hosts (one per TDIST_HOSTNAME): the default
 * binds to the route to the store (127.0.0.1 here); TDIST_SOCKET_IFNAME
 * is honoured and a bad value fails group creation naming it. */
static void two_hosts_body(int rank, int n, void *arg)
{
    (void)n;
    (void)arg;
    unsetenv("LOCAL_RANK");
    unsetenv("LOCAL_WORLD_SIZE");
    setenv("TDIST_HOSTNAME", rank % 2 ? "iface-host-b" : "iface-host-a", 1);
    tdist_world_t *w;
    ASSERT_OK(tdist_init("env://", NULL, &w));
    ASSERT_EQ(tdist_world_local_size(w), 1);
    ASSERT_EQ(tdist_world_local_rank(w), 0);
    const char *a1 = NULL, *a2 = NULL;
    ASSERT_OK(tdist__world_bind_addr(w, &a1));
    ASSERT_STREQ(a1, "127.0.0.1");
    ASSERT_OK(tdist__world_bind_addr(w, &a2));
    ASSERT_TRUE(a1 == a2); /* kept by the world */

    tdist_pg_opts_t o;
    tdist_pg_opts_init(&o);
    o.timeout_ms = (int64_t)(20000 * tdist_test_timeout_mult());
    tdist_pg_t *pg = NULL;
    ASSERT_OK(tdist_pg_create_world(w, &o, &pg));
    int32_t v = rank + 1, out = 0;
    ASSERT_OK(tdist_all_reduce(pg, &v, &out, 1, TDIST_I32, TDIST_SUM, NULL, NULL));
    ASSERT_EQ(out, 3);
    /* a subgroup inherits the address */
    tdist_pg_t *sub = NULL;
    int both[2] = {1, 0};
    ASSERT_OK(tdist_pg_new_group(pg, both, 2, NULL, &sub));
    ASSERT_OK(tdist_all_reduce(sub, &v, &out, 1, TDIST_I32, TDIST_MAX, NULL, NULL));
    ASSERT_EQ(out, 2);
    tdist_pg_destroy(sub);
    tdist_pg_destroy(pg);
    tdist_world_destroy(w);

    /* a fresh world (fresh rendezvous keys) reads TDIST_SOCKET_IFNAME */
    setenv(VARN, "tdist-no-such", 1);
    setenv("TDIST_RESTART_COUNT", "1", 1);
    ASSERT_OK(tdist_init("env://", NULL, &w));
    pg = NULL;
    ASSERT_STATUS(tdist_pg_create_world(w, &o, &pg), TDIST_ERR_INVALID_ARG);
    ASSERT_TRUE(pg == NULL);
    ASSERT_CONTAINS(tdist_last_error(), "choosing the network interface for process groups that "
                                        "span hosts");
    ASSERT_CONTAINS(tdist_last_error(), VARN "=\"tdist-no-such\": no interface matches");
    tdist_world_destroy(w);

    setenv(VARN, "=lo", 1);
    setenv("TDIST_RESTART_COUNT", "2", 1);
    ASSERT_OK(tdist_init("env://", NULL, &w));
    ASSERT_OK(tdist_pg_create_world(w, &o, &pg));
    ASSERT_OK(tdist_all_reduce(pg, &v, &out, 1, TDIST_I32, TDIST_SUM, NULL, NULL));
    ASSERT_EQ(out, 3);
    tdist_pg_destroy(pg);
    tdist_world_destroy(w);
    unsetenv(VARN);
}

TEST(init_iface_pick_bind_two_hosts, 60) { tdist_test_run_ranks(2, two_hosts_body, NULL); }

/* The host identity includes the network namespace (ranks in two
 * namespaces are two hosts: tests/net checks that with real namespaces).
 * Here, one namespace: the grouping by host name is unchanged, and each
 * rank's claim carries its namespace inode. */
static void same_ns_body(int rank, int n, void *arg)
{
    (void)arg;
    unsetenv("LOCAL_RANK");
    unsetenv("LOCAL_WORLD_SIZE");
    setenv("TDIST_HOSTNAME", "iface-one-host", 1);
    tdist_world_t *w;
    ASSERT_OK(tdist_init("env://", NULL, &w));
    ASSERT_EQ(tdist_world_local_size(w), n);
    ASSERT_EQ(tdist_world_local_rank(w), rank);
    /* the claim carries the namespace inode */
    tdist_store_t *raw = NULL;
    ASSERT_OK(tdist_store_tcp_connect(getenv("MASTER_ADDR"), (uint16_t)atoi(getenv("MASTER_PORT")),
                                      NULL, &raw));
    char key[64];
    snprintf(key, sizeof key, "tdist/g0/rdzv/rank/%d", rank);
    void *v = NULL;
    size_t len = 0;
    ASSERT_OK(tdist_store_get(raw, key, &v, &len));
    char claim[600];
    ASSERT_TRUE(len < sizeof claim);
    memcpy(claim, v, len);
    claim[len] = '\0';
    free(v);
    struct stat sb;
    ASSERT_EQ(stat("/proc/self/ns/net", &sb), 0);
    char want[64];
    snprintf(want, sizeof want, " %llx iface-one-host", (unsigned long long)sb.st_ino);
    ASSERT_CONTAINS(claim, want);
    tdist_store_destroy(raw);
    tdist_world_destroy(w);
}

TEST(init_iface_colocation_same_netns, 30) { tdist_test_run_ranks(3, same_ns_body, NULL); }
