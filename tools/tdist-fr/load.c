/*
 * tools/tdist-fr/load.c — read a directory's flight records: every ring
 * (the mapping's file, whether its process is alive, stopped or dead) and
 * every JSON dump that has no ring beside it; then sort them into groups
 * by uid and group rank.
 */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "frtool.h"

static uint64_t mono_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int64_t frt_real_ns(const rec_t *r, uint64_t mono)
{
    return (int64_t)r->hdr.real0_ns + ((int64_t)mono - (int64_t)r->hdr.mono0_ns);
}

static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *b = malloc(cap + 1);
    while (b) {
        size_t k = fread(b + n, 1, cap - n, f);
        n += k;
        if (k == 0) break;
        if (n == cap) {
            char *nb = realloc(b, cap * 2 + 1);
            if (!nb) {
                free(b);
                b = NULL;
                break;
            }
            b = nb;
            cap *= 2;
        }
    }
    fclose(f);
    if (b) b[n] = '\0';
    *len = n;
    return b;
}

/* What became of the process that wrote r (only knowable on its host). */
static int proc_state(const tdist__fr_header_t *h)
{
    if (h->closed) return PROC_CLOSED;
    char host[64] = "";
    if (gethostname(host, sizeof host - 1) != 0 || strncmp(host, h->host, sizeof host) != 0)
        return PROC_UNKNOWN;
    if (kill(h->pid, 0) != 0 && errno == ESRCH) return PROC_GONE;
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/stat", h->pid);
    size_t len = 0;
    char *s = slurp(path, &len);
    if (!s) return PROC_GONE;
    const char *p = strrchr(s, ')');
    int st = PROC_RUNNING;
    if (p && p[1] == ' ' && (p[2] == 'T' || p[2] == 't')) st = PROC_STOPPED;
    if (p && p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X')) st = PROC_GONE;
    free(s);
    return st;
}

static int load_ring(const char *path, rec_t *r)
{
    size_t len = 0;
    char *b = slurp(path, &len);
    if (!b) return -1;
    const tdist__fr_header_t *h = (const void *)b;
    if (len < sizeof *h || memcmp(h->magic, TDIST__FR_MAGIC, sizeof TDIST__FR_MAGIC) != 0 ||
        h->version != TDIST__FR_VERSION || h->entry_size != sizeof(tdist__fr_slot_t) ||
        len < sizeof *h + 2 * (size_t)h->capacity * sizeof(tdist__fr_slot_t) ||
        h->capacity == 0) {
        free(b);
        return -1;
    }
    memset(r, 0, sizeof *r);
    r->hdr = *h;
    const tdist__fr_slot_t *ring = (const void *)(b + sizeof *h);
    r->e = calloc(2 * (size_t)h->capacity + 1, sizeof *r->e);
    if (!r->e) {
        free(b);
        return -1;
    }
    r->n = tdist__fr_collect(h, ring, r->e);
    uint64_t tsc_now = tdist__fr_rdtsc(), mono = mono_now();
    for (size_t i = 0; i < r->n; i++) {
        tdist__fr_entry_t *c = &r->e[i];
        for (int s = TDIST__FR_QUEUED; s <= TDIST__FR_FAILED; s++)
            c->t_ns[s] = tdist__fr_to_ns(h, c->t_ns[s], tsc_now, mono);
        if (tdist__fr_waited(c) && c->wait.t_ns)
            c->wait.t_ns = tdist__fr_to_ns(h, c->wait.t_ns, tsc_now, mono);
    }
    free(b);
    r->proc = proc_state(&r->hdr);
    r->now_mono = mono_now();
    return 0;
}

/* ------------------------------------------------------------ JSON dumps */

/* The value after "key": on line s (up to its end), or NULL. */
static const char *jval(const char *s, const char *end, const char *key)
{
    char k[48];
    snprintf(k, sizeof k, "\"%s\":", key);
    size_t kl = strlen(k);
    for (const char *p = s; p + kl <= end; p++)
        if (memcmp(p, k, kl) == 0) return p + kl;
    return NULL;
}

static uint64_t jnum(const char *s, const char *end, const char *key)
{
    const char *v = jval(s, end, key);
    return v ? strtoull(v, NULL, 10) : 0;
}

static int64_t jint(const char *s, const char *end, const char *key)
{
    const char *v = jval(s, end, key);
    return v ? strtoll(v, NULL, 10) : -1;
}

static void jstr(const char *s, const char *end, const char *key, char *out, size_t n)
{
    out[0] = '\0';
    const char *v = jval(s, end, key);
    if (!v || *v != '"') return;
    size_t i = 0;
    for (v++; v < end && *v != '"' && i + 1 < n; v++) {
        if (*v == '\\' && v + 1 < end) v++;
        out[i++] = *v;
    }
    out[i] = '\0';
}

static int lookup(const char *const *tab, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(tab[i], name) == 0) return (int)i;
    return -1;
}
#define LOOKUP(tab, name) lookup(tab, sizeof(tab) / sizeof(tab[0]), name)

static void json_entry(const char *s, const char *end, tdist__fr_entry_t *e)
{
    static const char *const kinds[] = {"?", "coll", "send", "recv", "event"};
    char b[32];
    memset(e, 0, sizeof *e);
    e->id = jnum(s, end, "id");
    e->seq = jnum(s, end, "seq");
    jstr(s, end, "kind", b, sizeof b);
    e->kind = (uint32_t)(LOOKUP(kinds, b) < 0 ? 0 : LOOKUP(kinds, b));
    jstr(s, end, "state", b, sizeof b);
    e->state = (uint32_t)(LOOKUP(tdist__fr_state_names, b) < 0 ? 0 : LOOKUP(tdist__fr_state_names, b));
    e->status = (int32_t)jint(s, end, "status");
    if (e->kind == TDIST__FR_EVENT) {
        jstr(s, end, "what", e->what, sizeof e->what);
        e->count = jnum(s, end, "arg");
    } else {
        jstr(s, end, "op", b, sizeof b);
        e->op = LOOKUP(tdist__fr_op_names, b);
        jstr(s, end, "dtype", b, sizeof b);
        e->dtype = LOOKUP(tdist__fr_dtype_names, b);
        jstr(s, end, "redop", b, sizeof b);
        e->redop = LOOKUP(tdist__fr_redop_names, b);
        jstr(s, end, "route", b, sizeof b);
        int route = LOOKUP(tdist__fr_route_names, b);
        e->route = (uint8_t)(route < 0 ? 255 : route);
        jstr(s, end, "algo", b, sizeof b);
        e->algo = (uint8_t)(LOOKUP(tdist__fr_algo_names, b) < 0 ? 0 : LOOKUP(tdist__fr_algo_names, b));
        e->count = jnum(s, end, "count");
        e->root = (int32_t)jint(s, end, "root");
        e->splits_hash = jnum(s, end, "splits_hash");
        if (jval(s, end, "ended_in_spin")) e->flags |= TDIST__FR_ENDED_IN_SPIN;
        if (jval(s, end, "wait_peer")) {
            e->wait.tag = e->id + 1;
            e->wait.peer = (int32_t)jint(s, end, "wait_peer");
            e->wait.t_ns = jnum(s, end, "wait_ns");
        }
    }
    for (uint32_t st = TDIST__FR_QUEUED; st <= TDIST__FR_FAILED; st++)
        e->t_ns[st] = jnum(s, end, tdist__fr_state_names[st]);
}

/* A dump tdist wrote (fr/dump.c: its header on the first line, one entry
 * per line after it). */
static int load_json(const char *path, rec_t *r)
{
    size_t len = 0;
    char *b = slurp(path, &len);
    if (!b) return -1;
    char *nl = strchr(b, '\n');
    char head[32];
    snprintf(head, sizeof head, "{\"version\":%u,", TDIST__FR_JSON_VERSION);
    if (strncmp(b, head, strlen(head)) != 0 || !nl) {
        free(b);
        return -1;
    }
    memset(r, 0, sizeof *r);
    tdist__fr_header_t *h = &r->hdr;
    jstr(b, nl, "group", h->group, sizeof h->group);
    jstr(b, nl, "uid", h->uid, sizeof h->uid);
    jstr(b, nl, "host", h->host, sizeof h->host);
    jstr(b, nl, "reason", r->reason, sizeof r->reason);
    h->rank = (int32_t)jint(b, nl, "rank");
    h->size = (int32_t)jint(b, nl, "size");
    h->world_rank = (int32_t)jint(b, nl, "world_rank");
    h->pid = (int32_t)jint(b, nl, "pid");
    h->mono0_ns = jnum(b, nl, "mono0_ns");
    h->real0_ns = jnum(b, nl, "real0_ns");
    r->now_mono = jnum(b, nl, "dump_mono_ns");
    size_t lines = 0;
    for (char *p = nl; p; p = strchr(p + 1, '\n')) lines++;
    r->e = calloc(lines + 1, sizeof *r->e);
    for (char *s = nl + 1; r->e && *s;) {
        char *end = strchr(s, '\n');
        if (!end) end = s + strlen(s);
        if (jval(s, end, "id")) json_entry(s, end, &r->e[r->n++]);
        s = *end ? end + 1 : end;
    }
    free(b);
    if (!r->e || h->size <= 0 || h->rank < 0 || h->rank >= h->size) return -1;
    r->from_dump = true;
    r->proc = proc_state(h);
    return 0;
}

/* ------------------------------------------------------------ the groups */

static rec_t *find_rec(model_t *m, const char *uid, int world_rank)
{
    for (size_t i = 0; i < m->nrecs; i++)
        if (m->recs[i].hdr.world_rank == world_rank && strcmp(m->recs[i].hdr.uid, uid) == 0)
            return &m->recs[i];
    return NULL;
}

static bool has_suffix(const char *s, const char *suf)
{
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && strcmp(s + a - b, suf) == 0;
}

/* Rings first; then dumps (a dump with a ring only gives its reason). */
static int read_files(const char *dir, model_t *m)
{
    for (int pass = 0; pass < 2; pass++) {
        DIR *d = opendir(dir);
        if (!d) return -1;
        struct dirent *de;
        while ((de = readdir(d))) {
            if (strncmp(de->d_name, "tdist-fr.", 9) != 0) continue;
            if (!has_suffix(de->d_name, pass == 0 ? ".ring" : ".json")) continue;
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
            rec_t r;
            if ((pass == 0 ? load_ring(path, &r) : load_json(path, &r)) != 0) {
                fprintf(stderr, "tdist-fr: skipping %s: not a flight record\n", path);
                continue;
            }
            rec_t *had = pass ? find_rec(m, r.hdr.uid, r.hdr.world_rank) : NULL;
            if (had) {
                snprintf(had->reason, sizeof had->reason, "%s", r.reason);
                free(r.e);
                continue;
            }
            rec_t *nr = realloc(m->recs, (m->nrecs + 1) * sizeof *nr);
            if (!nr) {
                free(r.e);
                closedir(d);
                return -1;
            }
            m->recs = nr;
            m->recs[m->nrecs++] = r;
        }
        closedir(d);
    }
    return 0;
}

static grp_t *group_of(model_t *m, const rec_t *r)
{
    for (size_t i = 0; i < m->ngrps; i++)
        if (strcmp(m->grps[i].uid, r->hdr.uid) == 0) return &m->grps[i];
    grp_t *ng = realloc(m->grps, (m->ngrps + 1) * sizeof *ng);
    if (!ng) return NULL;
    m->grps = ng;
    grp_t *g = &m->grps[m->ngrps++];
    memset(g, 0, sizeof *g);
    snprintf(g->uid, sizeof g->uid, "%s", r->hdr.uid);
    snprintf(g->name, sizeof g->name, "%s", r->hdr.group);
    g->size = r->hdr.size;
    g->rank = calloc((size_t)g->size, sizeof *g->rank);
    return g->rank ? g : NULL;
}

int frt_load_dir(const char *dir, model_t *m)
{
    memset(m, 0, sizeof *m);
    if (read_files(dir, m) != 0) return -1;
    for (size_t i = 0; i < m->nrecs; i++) {
        rec_t *r = &m->recs[i];
        if (r->hdr.size <= 0 || r->hdr.rank < 0 || r->hdr.rank >= r->hdr.size) continue;
        grp_t *g = group_of(m, r);
        if (!g) return -1;
        if (r->hdr.size == g->size) g->rank[r->hdr.rank] = r;
    }
    return 0;
}

void frt_free(model_t *m)
{
    for (size_t i = 0; i < m->nrecs; i++) free(m->recs[i].e);
    for (size_t i = 0; i < m->ngrps; i++) free(m->grps[i].rank);
    free(m->recs);
    free(m->grps);
}
