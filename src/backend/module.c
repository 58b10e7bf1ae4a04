/*
 * backend/module.c — finds, loads and checks the MPI module (see
 * backend/module.h for the host table and the search order).
 *
 * The module is loaded once per process (pthread_once) and never
 * unloaded: MPI libraries do not survive being unloaded, and a group may
 * outlive any one caller. A failed load is remembered with its message, so
 * every later request fails the same way without touching the disk again.
 */
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/module.h"

#ifndef TDIST_MODULE_INSTALL_DIR
#define TDIST_MODULE_INSTALL_DIR ""
#endif
#ifndef TDIST_MODULE_BUILD_DIR
#define TDIST_MODULE_BUILD_DIR ""
#endif
#ifndef TDIST_MODULE_LIBDIR_NAME
#define TDIST_MODULE_LIBDIR_NAME "lib"
#endif

static const tdist__host_t host = {
    .host_size = sizeof(tdist__host_t),
    .ctx_size = sizeof(tdist__coll_ctx_t),
    .args_size = sizeof(tdist__coll_args_t),
    .p2p_size = sizeof(tdist__be_p2p_t),
    .version = TDIST_VERSION_STRING,
    .tdist__error = tdist__error,
    .tdist__error_errno = tdist__error_errno,
    .tdist__error_context = tdist__error_context,
    .tdist__log = tdist__log,
    .tdist__asprintf = tdist__asprintf,
    .tdist__strdup = tdist__strdup,
    .tdist__now_ms = tdist__now_ms,
    .tdist__deadline_ms = tdist__deadline_ms,
    .tdist__default_timeout_ms = tdist__default_timeout_ms,
    .tdist__sleep_ms = tdist__sleep_ms,
    .tdist__env_int = tdist__env_int,
    .tdist_last_error = tdist_last_error,
    .tdist_clear_error = tdist_clear_error,
    .tdist_log_level = tdist_log_level,
    .tdist_dtype_name = tdist_dtype_name,
    .tdist_dtype_size = tdist_dtype_size,
    .tdist_redop_name = tdist_redop_name,
    .tdist_reduce = tdist_reduce,
    .tdist_scale = tdist_scale,
    .tdist_divide = tdist_divide,
    .tdist_init = tdist_init,
    .tdist_init_opts_init = tdist_init_opts_init,
    .tdist_world_rank = tdist_world_rank,
    .tdist_world_size = tdist_world_size,
    .tdist_world_store = tdist_world_store,
    .tdist__iface_select = tdist__iface_select,
    .tdist__op_name = tdist__op_name,
    .tdist__coll_mb_verdict = tdist__coll_mb_verdict,
    .tdist__net_parse_ip = tdist__net_parse_ip,
    .tdist__net_listen_fd = tdist__net_listen_fd,
    .tdist__net_sockaddr_port = tdist__net_sockaddr_port,
};

static pthread_once_t once = PTHREAD_ONCE_INIT;
static const tdist__mpi_module_t *loaded;
static char why[2048]; /* the failed load's reason */

/* Append "path: reason" to the list of places tried. */
static void tried(char *list, size_t n, const char *path, const char *reason)
{
    size_t len = strlen(list);
    if (len + 1 >= n) return;
    snprintf(list + len, n - len, "%s%s (%s)", len ? "; " : "", path, reason);
}

/* Whether path names an existing file (any kind: dlopen judges it). */
static bool exists(const char *path) { return access(path, F_OK) == 0; }

/* dlopen path and run its entry; false with the reason in list. */
static bool load_from(const char *path, char *list, size_t n)
{
    /* RTLD_GLOBAL: MPI libraries load their own plugins, which expect to
     * find MPI's symbols globally. The module exports nothing else. */
    void *h = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
    if (!h) {
        const char *e = dlerror();
        tried(list, n, path, e ? e : "dlopen failed");
        return false;
    }
    tdist__mpi_module_entry_t entry;
    void *sym = dlsym(h, TDIST__MPI_MODULE_ENTRY);
    memcpy(&entry, &sym, sizeof entry); /* object pointer -> function pointer */
    if (!entry) {
        tried(list, n, path, "not a tdist module: no " TDIST__MPI_MODULE_ENTRY);
        return false;
    }
    char err[256] = "";
    const tdist__mpi_module_t *m = NULL;
    if (entry(&host, &m, err, sizeof err) != 0 || !m) {
        tried(list, n, path, err[0] ? err : "refused by the module");
        return false;
    }
    __atomic_store_n(&loaded, m, __ATOMIC_RELEASE);
    TDIST_LOGI("loaded the MPI backend's module %s", path);
    return true;
}

/* The directory of the file holding this code (libtdist.so, or the program
 * linked with libtdist.a); "" when unknown. */
static void self_dir(char *dir, size_t n)
{
    Dl_info info;
    dir[0] = '\0';
    if (!dladdr((void *)&tdist__mpi_module_loaded, &info) || !info.dli_fname) return;
    char real[PATH_MAX];
    if (!realpath(info.dli_fname, real)) return;
    char *slash = strrchr(real, '/');
    if (!slash) return;
    *slash = '\0';
    snprintf(dir, n, "%s", real);
}

static void load_once(void)
{
    char list[1536] = "";
    char path[PATH_MAX + 64];
    const char *env = getenv("TDIST_MPI_MODULE");
    if (env && *env) {
        if (load_from(env, list, sizeof list)) return;
    } else {
        char dir[PATH_MAX];
        self_dir(dir, sizeof dir);
        const char *cands[4] = {NULL, NULL, NULL, NULL};
        char c0[sizeof path], c1[sizeof path], c2[sizeof path], c3[sizeof path];
        int nc = 0;
        if (dir[0]) {
            snprintf(c0, sizeof c0, "%s/tdist/%s", dir, TDIST__MPI_MODULE_FILE);
            snprintf(c1, sizeof c1, "%s/../%s/tdist/%s", dir, TDIST_MODULE_LIBDIR_NAME,
                     TDIST__MPI_MODULE_FILE);
            cands[nc++] = c0;
            cands[nc++] = c1;
        }
        if (TDIST_MODULE_INSTALL_DIR[0]) {
            snprintf(c2, sizeof c2, "%s/%s", TDIST_MODULE_INSTALL_DIR, TDIST__MPI_MODULE_FILE);
            cands[nc++] = c2;
        }
        size_t blen = strlen(TDIST_MODULE_BUILD_DIR);
        if (blen && dir[0] && strncmp(dir, TDIST_MODULE_BUILD_DIR, blen) == 0 &&
            (dir[blen] == '/' || dir[blen] == '\0')) {
            snprintf(c3, sizeof c3, "%s/tdist/%s", TDIST_MODULE_BUILD_DIR, TDIST__MPI_MODULE_FILE);
            cands[nc++] = c3;
        }
        for (int i = 0; i < nc; i++) {
            char real[PATH_MAX];
            if (!exists(cands[i]) || !realpath(cands[i], real)) {
                tried(list, sizeof list, cands[i], "no such file");
                continue;
            }
            if (load_from(real, list, sizeof list)) return;
        }
    }
#ifdef TDIST_MPI_MODULE_BUILT
    const char *hint = "the module was built with this tdist: is it installed beside the "
                       "library (cmake --install), and is the MPI it was built with installed "
                       "(Debian: openmpi-bin, libopenmpi3)? TDIST_MPI_MODULE=/path/to/" TDIST__MPI_MODULE_FILE
                       " names it directly";
#else
    const char *hint = "this tdist was configured without MPI: install an MPI (Debian: "
                       "libopenmpi-dev openmpi-bin) and configure tdist again with "
                       "TDIST_WITH_MPI=AUTO or ON, which builds " TDIST__MPI_MODULE_FILE;
#endif
    snprintf(why, sizeof why, "the MPI backend's module %s could not be loaded (%s); %s",
             TDIST__MPI_MODULE_FILE, list[0] ? list : "nowhere to look", hint);
}

tdist_status_t tdist__mpi_module(const char *who, const tdist__mpi_module_t **out)
{
    pthread_once(&once, load_once);
    if (!loaded) return tdist__error(TDIST_ERR_NOT_SUPPORTED, "%s: %s", who, why);
    *out = loaded;
    return TDIST_OK;
}

const tdist__mpi_module_t *tdist__mpi_module_loaded(void)
{
    /* loaded is written once, inside pthread_once; a thread that has not
     * been through it may only see NULL, which callers treat as "never
     * loaded here" */
    return __atomic_load_n(&loaded, __ATOMIC_ACQUIRE);
}
