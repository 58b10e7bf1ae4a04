/* tests/init/init_env.h — what the init tests share: a clean environment
 * (no launcher, Slurm or MPI variable left from the caller's) and a
 * listening socket on a port the kernel picked. */
#ifndef TDIST_TESTS_INIT_ENV_H
#define TDIST_TESTS_INIT_ENV_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* Every variable tdist_init reads, so a test sees only what it sets (the
 * suite may itself run under tdistrun, srun or mpirun). */
static inline void clear_init_env(void)
{
    static const char *const vars[] = {
        "MASTER_ADDR",          "MASTER_PORT",           "RANK",
        "WORLD_SIZE",           "LOCAL_RANK",            "LOCAL_WORLD_SIZE",
        "TDIST_LAUNCHER_STORE", "TDIST_STORE_LISTEN_FD", "TDIST_RESTART_COUNT",
        "TDIST_HOSTNAME",       "TDIST_STORE_TOKEN",     "TDIST_TIMEOUT_MS",
        "TDIST_BACKEND",        "SLURM_PROCID",          "SLURM_NTASKS",
        "SLURM_LOCALID",        "SLURM_NODEID",          "SLURM_STEP_TASKS_PER_NODE",
        "SLURM_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE", "SLURM_STEP_NODELIST",
        "SLURM_JOB_NODELIST",   "SLURM_JOB_ID",          "OMPI_COMM_WORLD_SIZE",
        "PMI_SIZE",             "PMIX_RANK",             "TDIST_JOB_SECRET"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) unsetenv(vars[i]);
}

/* A socket listening on 127.0.0.1 (or ::1), port chosen by the kernel;
 * -1 on failure. */
static inline int listen_local(int family, uint16_t *port)
{
    int fd = socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof ss);
    socklen_t len;
    if (family == AF_INET6) {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
        a->sin6_family = AF_INET6;
        a->sin6_addr = in6addr_loopback;
        len = sizeof *a;
    } else {
        struct sockaddr_in *a = (struct sockaddr_in *)&ss;
        a->sin_family = AF_INET;
        a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        len = sizeof *a;
    }
    if (bind(fd, (struct sockaddr *)&ss, len) != 0 || listen(fd, 128) != 0 ||
        getsockname(fd, (struct sockaddr *)&ss, &len) != 0) {
        close(fd);
        return -1;
    }
    *port = ntohs(family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                     : ((struct sockaddr_in *)&ss)->sin_port);
    return fd;
}

#endif /* TDIST_TESTS_INIT_ENV_H */
