/*
 * init/internal.h — the rendezvous protocol shared by init.c (URL parsing,
 * environment, who hosts the store) and rendezvous.c (registration, the
 * wait for every rank, leaving).
 *
 * Every key below lives in the store view given to the rendezvous, which
 * init.c makes as prefix "tdist/g<restart generation>/rdzv" over the job's
 * base store (the user's view of the world is "tdist/g<gen>/user"):
 *
 *   rank/<r>      "<world_size> <pid> <nonce> <netns> <host>" of the process
 *                 that owns rank r (compare_set: the first claim wins);
 *                 netns is the inode of its /proc/self/ns/net in hex
 *                 (0: unknown)
 *   world_size    "<world_size> <rank> <pid> <host>" of the first rank to
 *                 register (compare_set); every later rank must agree
 *   joined        "<r>," appended by every rank that registered cleanly
 *   arrived       counter; the rendezvous is complete at world_size
 *   dup/<r>       the losing claim of rank r ("<ws> <pid> <nonce> <netns> <host>")
 *   abort         "<status> <message>": the first failure; every waiting
 *                 rank fails with it at once (compare_set: first wins)
 *   left          counter of ranks that have left (tdist_world_destroy, or
 *                 a failed rendezvous after registering)
 */
#ifndef TDIST_INIT_INTERNAL_H
#define TDIST_INIT_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "core/internal.h"
#include "tdist/init.h"

/* Poll interval of every rendezvous wait (ms). */
#define TDIST__RDZV_POLL_MS 10
/* How long rank 0, when it hosts the store, waits for the others to see a
 * failed rendezvous before it stops the server (ms, capped by the timeout). */
#define TDIST__RDZV_FAIL_LINGER_MS 3000

typedef struct tdist__rdzv {
    /* inputs (borrowed) */
    tdist_store_t *store;   /* the generation's rendezvous view */
    int rank;
    int world_size;
    const char *host;       /* this process's host name */
    /* This process's network namespace (inode of /proc/self/ns/net, 0 if
     * unknown). Ranks share a host when both the host name and the
     * namespace agree: processes in different network namespaces of one
     * machine (containers, the netns tests) are different hosts. */
    uint64_t netns;
    int64_t timeout_ms;     /* for messages */
    /* outputs of tdist__rdzv_join */
    bool registered;        /* appended to "joined": must record leaving */
    int local_rank;
    int local_size;
} tdist__rdzv_t;

/* Register r->rank in r->store and wait until every rank has registered,
 * an abort is posted, or deadline_ms (absolute tdist__now_ms()) passes.
 * Polls every TDIST__RDZV_POLL_MS. On success fills local_rank/local_size
 * from the host names of all ranks. Errors: TDIST_ERR_DUPLICATE,
 * TDIST_ERR_MISMATCH, TDIST_ERR_TIMEOUT (the message lists the missing
 * ranks), or the store's error. Sets r->registered either way. */
tdist_status_t tdist__rdzv_join(tdist__rdzv_t *r, int64_t deadline_ms);

/* Record that this rank left (if it registered). If wait_for > 0, then
 * wait (polling, at most bound_ms) until "left" reaches wait_for — rank 0
 * does this before stopping the store server it hosts. If cleanup and this
 * rank is the last of world_size to leave, delete the rendezvous keys.
 * Never fails (errors are logged); keeps the caller's last error. */
void tdist__rdzv_leave(tdist__rdzv_t *r, int64_t wait_for, int64_t bound_ms, bool cleanup);

/* Number of ranks that registered cleanly (entries of "joined"); 0 on
 * error. Used by rank 0 to know how many to wait for after a failure. */
int64_t tdist__rdzv_num_joined(tdist__rdzv_t *r);

/* The prefix of restart generation's rendezvous keys in the job's base
 * store ("tdist/g<generation>/rdzv"), into buf (cap bytes). */
void tdist__rdzv_prefix(int64_t generation, char *buf, size_t cap);

/* From outside the rendezvous (a launcher asked what its workers are
 * doing): which of world_size ranks have registered in generation's
 * rendezvous in base, the job's base store (joined[r], world_size
 * entries, the caller's; *n_joined of them), and whether it was aborted
 * (*aborted: its "abort" key is set). Two or three store round trips,
 * under base's timeout; a store error is returned as it is. Thread-safe
 * as base is. */
tdist_status_t tdist__rdzv_peek(tdist_store_t *base, int64_t generation, int world_size,
                                bool *joined, int *n_joined, bool *aborted);

/* ------------------------------------------------ interface selection */
/*
 * iface.c: which local address the TCP transports of a multi-host process
 * group listen on (and publish). See docs/multihost.md.
 *
 *   TDIST_SOCKET_IFNAME set and not empty: a list of interface names, as
 *   NCCL_SOCKET_IFNAME: "eth0", "eth,ib" (prefixes), "=eth0" (exact
 *   names), "^docker,lo" (any interface except those prefixes), "^=lo"
 *   (except exactly these). The first list entry that matches an
 *   interface which is up and has a usable address wins (for one entry:
 *   an exact name before longer names it is a prefix of, IPv4 before
 *   IPv6, never link-local IPv6); with '^', the first such interface in
 *   the kernel's order that is not excluded, IPv4 first, loopback last.
 *   Otherwise: the local address the kernel would use to reach the
 *   store (master) address: a UDP socket connect()ed to it, then
 *   getsockname() (connecting a datagram socket sends nothing).
 *   Without a master address (file://): as "^" with nothing excluded
 *   (the first interface that is up, IPv4 first, loopback last).
 */

#define TDIST__IFSPEC_MAX 16   /* names in one TDIST_SOCKET_IFNAME */
#define TDIST__IFNAME_MAX 16   /* IF_NAMESIZE, terminating NUL included */
#define TDIST__IFADDR_MAX 64   /* INET6_ADDRSTRLEN and then some */

/* A parsed TDIST_SOCKET_IFNAME. */
typedef struct tdist__ifspec {
    bool exclude; /* leading '^': every interface except these */
    bool exact;   /* '=' (after the optional '^'): whole names, not prefixes */
    int n;        /* entries in names (1..TDIST__IFSPEC_MAX) */
    char names[TDIST__IFSPEC_MAX][TDIST__IFNAME_MAX];
} tdist__ifspec_t;

/* One address of a local interface (or, family 0, an interface with no
 * IPv4/IPv6 address, listed so that errors can name it). */
typedef struct tdist__ifaddr {
    char name[TDIST__IFNAME_MAX];
    int family;                   /* AF_INET, AF_INET6 or 0 */
    char addr[TDIST__IFADDR_MAX]; /* numeric, "" for family 0 */
    bool up;                      /* IFF_UP */
    bool loopback;                /* IFF_LOOPBACK */
    bool link_local;              /* IPv6 fe80::/10 (not usable: no scope id) */
} tdist__ifaddr_t;

/* Parse spec (the value of the variable named var, used in messages) into
 * *out. Surrounding blanks of each name are ignored. Errors
 * (TDIST_ERR_INVALID_ARG naming var): an empty list or an empty name,
 * a name longer than 15 bytes, more than TDIST__IFSPEC_MAX names.
 * Pure; thread-safe. */
tdist_status_t tdist__ifspec_parse(const char *var, const char *spec, tdist__ifspec_t *out);

/* Does interface name ifname pass spec (prefix or exact match, inverted
 * by '^')? Pure. */
bool tdist__ifspec_match(const tdist__ifspec_t *spec, const char *ifname);

/* The local interfaces and their addresses (getifaddrs), in the kernel's
 * order; *out is malloc'd (caller frees). Thread-safe. */
tdist_status_t tdist__iface_list(tdist__ifaddr_t **out, int *n);

/* Choose the interface address spec selects from list[0..n) (see above);
 * copy it to *out. No usable match: TDIST_ERR_INVALID_ARG with a message
 * naming var, its value and every interface in list (and why a matching
 * one cannot be used: down, no address). Pure; thread-safe. */
tdist_status_t tdist__iface_choose(const char *var, const char *value, const tdist__ifspec_t *spec,
                                   const tdist__ifaddr_t *list, int n, tdist__ifaddr_t *out);

/* The local address (numeric, into addr[0..n)) the kernel would use to
 * reach host:port (host: a name or a numeric address). Nothing is sent.
 * Errors: TDIST_ERR_INVALID_ARG (host does not resolve),
 * TDIST_ERR_SYSTEM (no route), naming host. Thread-safe. */
tdist_status_t tdist__iface_route_to(const char *host, int port, char *addr, size_t n);

/* The whole policy (see above): TDIST_SOCKET_IFNAME, else the route to
 * master_host:master_port (master_host NULL or "" for none), else the
 * first interface that is up (loopback last). Writes the numeric address, the
 * interface's name ("" if unknown) and how it was chosen (a static
 * string: "TDIST_SOCKET_IFNAME", "route to the store", "first interface").
 * Thread-safe. */
tdist_status_t tdist__iface_select(const char *master_host, int master_port, char *addr,
                                   size_t addr_n, char *ifname, size_t ifname_n,
                                   const char **how);

/* init.c: the address this rank's TCP transports bind to when its world
 * spans hosts (tdist__iface_select with the world's store address),
 * computed on the first call and kept for the life of the world.
 * *addr is owned by the world. Thread-safe. */
tdist_status_t tdist__world_bind_addr(tdist_world_t *w, const char **addr);

/* init.c: the number of the next world group created on w (0, 1, ...).
 * Every rank creates its world groups in the same order, so the n-th one
 * gets the same number on every rank of w, whatever other worlds the
 * process holds or held. Thread-safe, never blocks. */
int tdist__world_next_group(tdist_world_t *w);
/* A group of w has failed (pg's failure path): rank 0's
 * tdist_world_destroy then waits for the others to leave 1 s at most,
 * and every rank's leaving calls to the store end within 1 s.
 * Thread-safe, never blocks. */
void tdist__world_note_failure(tdist_world_t *w);

/* init.c: Slurm's environment for env:// (docs/init.md). Pure, thread-safe.
 * The first host of a Slurm host list ("node[01-04,07],gpu3" -> "node01"),
 * into host (n bytes); TDIST_ERR_INVALID_ARG naming var when malformed. */
tdist_status_t tdist__slurm_first_host(const char *var, const char *list, char *host, size_t n);
/* Tasks on node index `node` of a tasks-per-node list ("2(x3),1"); errors
 * name var. */
tdist_status_t tdist__slurm_tasks_on_node(const char *var, const char *list, int64_t node,
                                          int64_t *out);
/* The store's port derived from SLURM_JOB_ID: 10000 + job_id % 50000. */
int tdist__slurm_port(int64_t job_id);

#endif /* TDIST_INIT_INTERNAL_H */
