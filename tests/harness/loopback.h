/*
 * tests/harness/loopback.h — counting the bytes a test puts on the wire:
 * a network namespace of the test's own, whose loopback counters count
 * that test's traffic and nobody else's.
 */
#ifndef TDIST_TEST_LOOPBACK_H
#define TDIST_TEST_LOOPBACK_H

#include <stdbool.h>
#include <stdint.h>

/* Move the calling process (and the ranks it forks later) into a new
 * network namespace with lo up and return true; when the namespace cannot
 * be made (no privileges) the test ends with SKIP; any other failure fails
 * the test. */
bool tdist_test_private_loopback(const char *test);

/* Bytes sent on lo so far (its tx_bytes in /proc/net/dev). */
uint64_t tdist_test_lo_tx_bytes(void);

#endif /* TDIST_TEST_LOOPBACK_H */
