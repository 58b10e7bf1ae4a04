/* tests/tools/test_tdistrun_helpers.h — what the launcher's tests
 * (tests/tools/test_tdistrun*.c) share: where the programs are, checking
 * how a run ended, and watching worker pids (test_tdistrun_helpers.c). */
#ifndef TDIST_TEST_TDISTRUN_HELPERS_H
#define TDIST_TEST_TDISTRUN_HELPERS_H

#include <stdbool.h>
#include <sys/types.h>

#include "proc.h"

#define TDISTRUN TDIST_BIN_DIR "/tools/tdistrun/tdistrun"
#define HELLO TDIST_BIN_DIR "/examples/launcher_hello"
/* tools/tdistrun/test_worker.c: linked with libtdist, no tdist_init */
#define TEST_WORKER TDIST_BIN_DIR "/tools/tdistrun/tdistrun_test_worker"

#define ASSERT_EXIT(r, want)                                                   \
    do {                                                                       \
        if (!(r).exited || (r).code != (want))                                 \
            FAIL("tdistrun: expected exit %d, got %s %d\n--- stdout:\n%s\n--- stderr:\n%s", \
                 (want), (r).exited ? "exit" : "signal", (r).exited ? (r).code : (r).sig, \
                 (r).out, (r).err);                                            \
    } while (0)

/* Occurrences of needle in hay. */
int trun_count_of(const char *hay, const char *needle);

/* The pids workers wrote to <tmpdir>/pid.<rank> for rank in [0, n). */
void trun_read_pids(int n, pid_t *pids);

/* The same from <tmpdir>/<stem>.<rank>. */
void trun_read_pid_files(const char *stem, int n, pid_t *pids);

/* Wait (bounded) until the n files <tmpdir>/<stem>.<rank> have content. */
void trun_wait_files(const char *stem, int n, double timeout_ms);

/* Whether pid is gone: no such process, or a zombie nobody reaped yet. */
bool trun_pid_gone(pid_t pid);

/* Poll (bounded) until every pid is gone, reaping orphans we inherited as
 * a subreaper. Fails naming a survivor. */
void trun_assert_all_gone(const pid_t *pids, int n, double timeout_ms);

/* T_DIR=<tmpdir> in the environment, for worker shell snippets. */
void trun_set_dir_env(void);

/* A worker shell snippet: wait until $T_DIR/<file> exists (file: a shell
 * word, "go" or "go.$RANK"), bounded at 30 s. */
#define TRUN_SH_AWAIT(file)                                                                        \
    "i=0; while [ ! -e $T_DIR/" file " ] && [ $i -lt 3000 ]; do sleep 0.01; i=$((i+1)); done;"

/* Create the empty file <tmpdir>/<name> (a worker's go-ahead). */
void trun_touch(const char *name);

#endif /* TDIST_TEST_TDISTRUN_HELPERS_H */
