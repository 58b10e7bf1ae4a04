/*
 * examples/launcher_hello.c — the smallest tdist job: join through env://,
 * say hello, and check in through the job's store.
 *
 * Run it with the launcher, which sets the env:// variables and hosts the
 * store:
 *
 *     tdistrun --nproc-per-node 4 ./launcher_hello
 *
 * Every rank prints "rank R/N local L/LN on host H" and stores the value
 * "hello from rank R" under the key "hello/R". Rank 0 reads every rank's
 * key, checks each value, prints "all N ranks checked in" and sets
 * "hello/checked", which the other ranks wait for before they leave.
 * Exit status 0 on success; 1 with tdist_last_error() printed on any failure.
 */
#define _POSIX_C_SOURCE 200809L

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <tdist/tdist.h>

static int fail(const char *what, tdist_status_t st)
{
    fprintf(stderr, "launcher_hello: %s failed: %s: %s\n", what, tdist_status_str(st),
            tdist_last_error());
    return 1;
}

/* Rank 0: read every rank's key and check its value. */
static int gather_and_check(tdist_store_t *store, int world_size)
{
    for (int r = 0; r < world_size; r++) {
        char key[64], want[64];
        snprintf(key, sizeof key, "hello/%d", r);
        snprintf(want, sizeof want, "hello from rank %d", r);
        void *value = NULL;
        size_t len = 0;
        tdist_status_t st = tdist_store_get(store, key, &value, &len);
        if (st != TDIST_OK) return fail(key, st);
        int ok = len == strlen(want) && memcmp(value, want, len) == 0;
        if (!ok)
            fprintf(stderr, "launcher_hello: key %s holds \"%.*s\", expected \"%s\"\n", key,
                    (int)(len < 200 ? len : 200), (const char *)value, want);
        free(value);
        if (!ok) return 1;
    }
    return 0;
}

int main(void)
{
    tdist_world_t *world = NULL;
    tdist_status_t st = tdist_init("env://", NULL, &world);
    if (st != TDIST_OK) return fail("tdist_init(env://)", st);

    int rank = tdist_world_rank(world);
    int size = tdist_world_size(world);
    char host[256] = "unknown";
    if (gethostname(host, sizeof host) != 0) strcpy(host, "unknown");
    host[sizeof host - 1] = '\0';
    printf("rank %d/%d local %d/%d on host %s\n", rank, size, tdist_world_local_rank(world),
           tdist_world_local_size(world), host);
    fflush(stdout);

    tdist_store_t *store = tdist_world_store(world);
    char key[64], value[64];
    snprintf(key, sizeof key, "hello/%d", rank);
    snprintf(value, sizeof value, "hello from rank %d", rank);
    int rc = 0;
    st = tdist_store_set(store, key, value, strlen(value));
    if (st != TDIST_OK) {
        rc = fail(key, st);
    } else if (rank == 0) {
        rc = gather_and_check(store, size);
        if (rc == 0) {
            st = tdist_store_set(store, "hello/checked", "1", 1);
            if (st != TDIST_OK) rc = fail("hello/checked", st);
        }
        if (rc == 0) printf("all %d ranks checked in\n", size);
    } else {
        const char *keys[] = {"hello/checked"};
        st = tdist_store_wait(store, keys, 1, -1);
        if (st != TDIST_OK) rc = fail("waiting for hello/checked", st);
    }
    fflush(stdout);
    tdist_world_destroy(world);
    return rc;
}
