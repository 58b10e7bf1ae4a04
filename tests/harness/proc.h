/*
 * tests/harness/proc.h — run a program (the launcher, a tool) from a test:
 * its stdout and stderr go to <tmpdir>/<tag>.out / .err and are read back
 * when it ends; a program that outlives its time is killed and the test
 * fails.
 */
#ifndef TDIST_TEST_PROC_H
#define TDIST_TEST_PROC_H

#include <stdbool.h>
#include <sys/types.h>

#include "harness.h"

typedef struct run {
    bool exited;     /* exited normally (code) — else killed (sig) */
    int code;
    int sig;
    double ms;       /* wall time until reaped */
    char *out;       /* its stdout and stderr (malloc'd) */
    char *err;
} run_t;

/* A file's whole contents, NUL-terminated (malloc'd); fails the test if
 * it cannot be read. */
char *slurp(const char *path);

/* Offset of the first line of text at or after offset from that holds
 * both a and b (a JSON dump's entry is one line), or -1. */
long find_line(const char *text, long from, const char *a, const char *b);

/* <tmpdir>/<name> in one of 16 rotating static buffers. */
char *tmp_path(const char *name);

/* Start argv[0] (a path) with stdout/stderr going to <tag>.out / <tag>.err. */
pid_t spawn(const char *const argv[], const char *tag);

/* Wait for pid until start + timeout_ms; on timeout kill it (SIGKILL) and
 * fail. Fills r (out and err read back). */
void wait_for(pid_t pid, double timeout_ms, const char *tag, double start, run_t *r);

/* spawn + wait_for with timeout_s x the deadline multiplier. */
void run(const char *const argv[], double timeout_s, const char *tag, run_t *r);

/* Free r's output. */
void run_free(run_t *r);

#endif /* TDIST_TEST_PROC_H */
