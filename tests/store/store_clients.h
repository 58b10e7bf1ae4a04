/*
 * tests/store/store_clients.h — a bounded wait for a TCP store server's
 * client count, shared by the store's TCP tests.
 */
#ifndef TDIST_TESTS_STORE_CLIENTS_H
#define TDIST_TESTS_STORE_CLIENTS_H

#include <unistd.h>

#include "harness.h"
#include "tdist/store.h"

/* Wait (bounded) until srv has want clients. The count is read once a
 * round and the last one read is checked: a connection the server
 * accepts between two reads (one that closes at once may be accepted
 * after the first) must not fail a wait that saw the count it wanted. */
static inline void wait_clients(tdist_store_server_t *srv, int want)
{
    double end = tdist_test_now_ms() + 5000 * tdist_test_timeout_mult();
    int n = tdist_store_server_num_clients(srv);
    while (n != want && tdist_test_now_ms() < end) {
        usleep(2000);
        n = tdist_store_server_num_clients(srv);
    }
    ASSERT_EQ(n, want);
}

#endif /* TDIST_TESTS_STORE_CLIENTS_H */
