/*
 * tests/harness/tbuf.h — large test buffers a process reuses instead of
 * mapping anew.
 *
 * Under AddressSanitizer every block above 128 KiB is a fresh mmap, so a
 * test that allocates, fills and frees megabyte buffers in a loop pays a
 * page fault per 4 KiB each round (and as many for the shadow); on a
 * paravirtualised VM those faults were most of such a test's time.
 * tbuf_alloc keeps freed blocks and hands them out again. Checking stays
 * as tight as malloc's: only [p, p + bytes) of a block handed out is
 * addressable under AddressSanitizer, the rest of it and every block in
 * the pool are poisoned, so an overrun or a use after tbuf_free reports.
 *
 * Per process (a forked rank starts with its parent's pool, which it owns
 * from then on); thread-safe.
 */
#ifndef TDIST_TEST_TBUF_H
#define TDIST_TEST_TBUF_H

#include <stddef.h>

/* A block of at least `bytes` (at least 1), 64-byte aligned, contents
 * unspecified. Fails the test when out of memory. Release it with
 * tbuf_free, never free(). */
void *tbuf_alloc(size_t bytes);

/* Give back a block from tbuf_alloc (NULL: nothing). */
void tbuf_free(void *p);

#endif /* TDIST_TEST_TBUF_H */
