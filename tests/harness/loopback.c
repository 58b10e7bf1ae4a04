/* tests/harness/loopback.c — see loopback.h. */
#include <errno.h>
#include <net/if.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "harness.h"
#include "loopback.h"

bool tdist_test_private_loopback(const char *test)
{
    if (unshare(CLONE_NEWNET) != 0) {
        SKIP("cannot create a network namespace (%s)", strerror(errno));
    }
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    if (fd < 0) FAIL("socket: %s", strerror(errno));
    struct ifreq ifr;
    memset(&ifr, 0, sizeof ifr);
    memcpy(ifr.ifr_name, "lo", 3);
    if (ioctl(fd, SIOCGIFFLAGS, &ifr) != 0) FAIL("SIOCGIFFLAGS lo: %s", strerror(errno));
    ifr.ifr_flags |= IFF_UP;
    if (ioctl(fd, SIOCSIFFLAGS, &ifr) != 0) FAIL("SIOCSIFFLAGS lo: %s", strerror(errno));
    close(fd);
    return true;
}

uint64_t tdist_test_lo_tx_bytes(void)
{
    FILE *f = fopen("/proc/net/dev", "r");
    if (!f) FAIL("/proc/net/dev: %s", strerror(errno));
    char line[512];
    unsigned long long v[9];
    bool found = false;
    while (!found && fgets(line, sizeof line, f)) {
        char *colon = strchr(line, ':');
        if (!colon) continue;
        *colon = '\0';
        const char *name = line + strspn(line, " ");
        found = strcmp(name, "lo") == 0 &&
                sscanf(colon + 1, "%llu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1],
                       &v[2], &v[3], &v[4], &v[5], &v[6], &v[7], &v[8]) == 9;
    }
    fclose(f);
    if (!found) FAIL("no lo line in /proc/net/dev");
    return v[8];
}
