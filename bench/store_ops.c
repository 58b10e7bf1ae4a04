/*
 * bench/store_ops.c — TCP store throughput: set and get ops/s with one
 * client and with 64 concurrent clients (threads, each with its own
 * connection), against a server in this process on 127.0.0.1:0.
 *
 * Usage: bench_store_ops [ops_per_client_1] [ops_per_client_64] [reps]
 * Each measurement is repeated reps times (default 5); the median is
 * printed as a RESULT line.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tdist/tdist.h"

#define MAX_CLIENTS 64
#define VALUE_LEN 16

typedef struct worker {
    tdist_store_t *s;
    int id;
    int ops;
    int do_get;
    pthread_barrier_t *start;
    int failed;
} worker_t;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Run ops sets or gets on this worker's connection. */
static void *work(void *p)
{
    worker_t *w = p;
    char key[32], val[VALUE_LEN];
    memset(val, 'v', sizeof val);
    pthread_barrier_wait(w->start);
    for (int i = 0; i < w->ops; i++) {
        snprintf(key, sizeof key, "k%d-%d", w->id, i % 128);
        tdist_status_t st;
        if (w->do_get) {
            void *v = NULL;
            size_t n = 0;
            st = tdist_store_get(w->s, key, &v, &n);
            free(v);
        } else {
            st = tdist_store_set(w->s, key, val, sizeof val);
        }
        if (st != TDIST_OK) {
            fprintf(stderr, "client %d: %s\n", w->id, tdist_last_error());
            w->failed = 1;
            return NULL;
        }
    }
    return NULL;
}

/* ops/s of nclients threads each doing ops sets (or gets). */
static double measure(tdist_store_t **clients, int nclients, int ops, int do_get)
{
    pthread_t th[MAX_CLIENTS];
    worker_t w[MAX_CLIENTS];
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, (unsigned)nclients + 1);
    for (int i = 0; i < nclients; i++) {
        w[i] = (worker_t){.s = clients[i], .id = i, .ops = ops, .do_get = do_get, .start = &start};
        if (pthread_create(&th[i], NULL, work, &w[i]) != 0) {
            fprintf(stderr, "pthread_create failed\n");
            exit(1);
        }
    }
    pthread_barrier_wait(&start);
    double t0 = now_s();
    for (int i = 0; i < nclients; i++) pthread_join(th[i], NULL);
    double el = now_s() - t0;
    pthread_barrier_destroy(&start);
    for (int i = 0; i < nclients; i++)
        if (w[i].failed) exit(1);
    return (double)nclients * ops / el;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median of reps measurements; prints each. */
static double median_of(const char *name, tdist_store_t **clients, int nclients, int ops,
                        int do_get, int reps)
{
    double r[32];
    for (int i = 0; i < reps; i++) {
        r[i] = measure(clients, nclients, ops, do_get);
        printf("  %-22s rep %d: %12.0f ops/s\n", name, i, r[i]);
    }
    qsort(r, (size_t)reps, sizeof r[0], cmp_double);
    return r[reps / 2];
}

int main(int argc, char **argv)
{
    int ops1 = argc > 1 ? atoi(argv[1]) : 20000;
    int ops64 = argc > 2 ? atoi(argv[2]) : 1000;
    int reps = argc > 3 ? atoi(argv[3]) : 5;
    if (ops1 <= 0 || ops64 <= 0 || reps <= 0 || reps > 32) {
        fprintf(stderr, "usage: %s [ops_1client] [ops_per_client_64] [reps<=32]\n", argv[0]);
        return 2;
    }
    tdist_store_server_t *srv = NULL;
    if (tdist_store_server_create("127.0.0.1", 0, NULL, &srv) != TDIST_OK) {
        fprintf(stderr, "server: %s\n", tdist_last_error());
        return 1;
    }
    uint16_t port = tdist_store_server_port(srv);
    tdist_store_opts_t o;
    tdist_store_opts_init(&o);
    o.timeout_ms = 60000;
    tdist_store_t *clients[MAX_CLIENTS];
    for (int i = 0; i < MAX_CLIENTS; i++) {
        if (tdist_store_tcp_connect("127.0.0.1", port, &o, &clients[i]) != TDIST_OK) {
            fprintf(stderr, "connect: %s\n", tdist_last_error());
            return 1;
        }
    }
    printf("store_ops: server 127.0.0.1:%u, %d-byte values, %d reps\n", (unsigned)port, VALUE_LEN,
           reps);
    /* set first so that every get finds its key */
    double set1 = median_of("set, 1 client", clients, 1, ops1, 0, reps);
    double get1 = median_of("get, 1 client", clients, 1, ops1, 1, reps);
    double set64 = median_of("set, 64 clients", clients, MAX_CLIENTS, ops64, 0, reps);
    double get64 = median_of("get, 64 clients", clients, MAX_CLIENTS, ops64, 1, reps);
    for (int i = 0; i < MAX_CLIENTS; i++) tdist_store_destroy(clients[i]);
    tdist_store_server_destroy(srv);
    printf("RESULT store_set_1client %.0f ops/s\n", set1);
    printf("RESULT store_get_1client %.0f ops/s\n", get1);
    printf("RESULT store_set_64clients %.0f ops/s\n", set64);
    printf("RESULT store_get_64clients %.0f ops/s\n", get64);
    return 0;
}
