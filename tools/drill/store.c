/*
 * Store drills, shared part: a small store cluster started as child
 * processes (`kvferry master` with short TTLs on 127.0.0.1 port 0, and
 * `kvferry node`s), the master's /status read over HTTP for the
 * service-side resources, and the store traffic worker.
 *
 * The worker runs a real store client over its own key space. Every
 * object describes itself: a 32-byte header {magic, hash of the key,
 * version, size} then a body generated from (key hash, version), where
 * the version carries the store epoch the conductor announced (bumped
 * when the master restarts) in its upper half. A get that succeeds must
 * return an object whose header names this key, whose body matches, and
 * whose epoch is not older than the epoch when the get began (after a
 * master restart, nothing stored before may be served); anything else
 * counts as wrong bytes. Gets that miss (NO_KEY, NOT_READY) re-put the
 * key (read-through, as a KV cache does), puts that find the key
 * (EXISTS, BUSY) and removes that race (NO_KEY, LEASED, BUSY) are clean
 * outcomes; every other status is an error the client saw.
 */
#include "tools/drill/drill.h"
#include "tools/drill/store.h"

#include <kvferry/store.h>

#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/rng.h"
#include "core/sock.h"
#include "tools/cli/net.h"
#include "core/time.h"

#include <kvferry/auth.h>

#define KVF_OBJ_MAGIC 0x4c4c495244465640ull /* "@VFDRILL" */
#define KVF_OBJ_HDR   32

/* --- cluster -------------------------------------------------------------- */

int kvf_drill_master_start(kvf_drill_t *d, kvf_drill_cluster_t *c,
                           const char *listen)
{
    char line[512], ttl[32], put_to[32], repl[16], hw[16], lw[16];
    const char *args[32];
    int n = 0;

    snprintf(ttl, sizeof(ttl), "%ums", c->node_ttl_ms);
    snprintf(put_to, sizeof(put_to), "%ums", c->put_timeout_ms);
    snprintf(repl, sizeof(repl), "%u", c->replicas ? c->replicas : 1);
    snprintf(hw, sizeof(hw), "%u", c->high_pct ? c->high_pct : 90);
    snprintf(lw, sizeof(lw), "%u", c->low_pct ? c->low_pct : 80);
    args[n++] = "master";
    args[n++] = "--listen";
    args[n++] = listen;
    args[n++] = "--http";
    args[n++] = c->http_listen[0] ? c->http_listen : "127.0.0.1:0";
    args[n++] = "--node-ttl";
    args[n++] = ttl;
    args[n++] = "--heartbeat";
    args[n++] = "200ms";
    args[n++] = "--put-timeout";
    args[n++] = put_to;
    args[n++] = "--lease";
    args[n++] = KVF_DRILL_LEASE_ARG;
    args[n++] = "--replicas";
    args[n++] = repl;
    args[n++] = "--high-watermark";
    args[n++] = hw;
    args[n++] = "--low-watermark";
    args[n++] = lw;
    args[n] = NULL;
    c->master =
        kvf_drill_spawn(d, c->netns, "master", line, sizeof(line), args);
    if (c->master < 0 ||
        kvf_drill_field(line, "master", c->master_addr,
                        sizeof(c->master_addr)) != 0 ||
        kvf_drill_field(line, "http", c->http_addr, sizeof(c->http_addr)) !=
            0) {
        kvf_drill_fail(d, "the master did not start ('%s')", line);
        kvf_drill_kill(c->master, SIGKILL);
        c->master = 0;
        return -1;
    }
    /* a restart must come back where the clients and nodes look */
    snprintf(c->http_listen, sizeof(c->http_listen), "%s", c->http_addr);
    return 0;
}

int kvf_drill_node_start(kvf_drill_t *d, kvf_drill_cluster_t *c, unsigned i)
{
    char line[512], tag[16], pool[32], to[32], addr[40], dir[600], dsz[32];
    const char *args[20] = {
        "node", "--pool", pool, "--master", c->master_addr, "--listen",
        c->node_listen[0] ? c->node_listen : "127.0.0.1:0", "--timeout", to,
        /* in a namespace the drill is about the network: tcp only */
        "--transports", c->netns != NULL ? "tcp" : "auto", NULL};

    snprintf(tag, sizeof(tag), "node%u", i);
    snprintf(pool, sizeof(pool), "%lu", (unsigned long)c->node_pool);
    snprintf(to, sizeof(to), "%ums", d->timeout_ms);
    if (c->disk_dir != NULL) {
        snprintf(dir, sizeof(dir), "%s/node%u", c->disk_dir, i);
        snprintf(dsz, sizeof(dsz), "%lu",
                 (unsigned long)(c->disk_size ? c->disk_size
                                              : 4 * c->node_pool));
        args[11] = "--disk";
        args[12] = dir;
        args[13] = "--disk-size";
        args[14] = dsz;
        args[15] = NULL;
    }
    c->node[i] = kvf_drill_spawn(d, c->netns, tag, line, sizeof(line), args);
    if (c->node[i] < 0 ||
        kvf_drill_field(line, "node", c->node_seg[i], sizeof(c->node_seg[i])) !=
            0 ||
        kvf_drill_field(line, "pool", addr, sizeof(addr)) != 0) {
        kvf_drill_fail(d, "node %u did not start ('%s')", i, line);
        kvf_drill_kill(c->node[i], SIGKILL);
        c->node[i] = 0;
        return -1;
    }
    c->node_base[i] = strtoull(addr, NULL, 16);
    return 0;
}

int kvf_drill_cluster_start(kvf_drill_t *d, kvf_drill_cluster_t *c,
                            unsigned nnodes)
{
    unsigned i;

    if (c->node_ttl_ms == 0) {
        c->node_ttl_ms = 1500;
    }
    if (c->put_timeout_ms == 0) {
        c->put_timeout_ms = 3000;
    }
    if (c->node_pool == 0) {
        c->node_pool = 32u << 20;
    }
    if (kvf_drill_master_start(d, c,
                               c->master_listen[0] ? c->master_listen
                                                   : "127.0.0.1:0") != 0) {
        return -1;
    }
    c->nnodes = nnodes;
    for (i = 0; i < nnodes; i++) {
        if (kvf_drill_node_start(d, c, i) != 0) {
            return -1;
        }
    }
    if (kvf_drill_wait_nodes(d, c, nnodes, 10000) < 0) {
        kvf_drill_fail(d, "%u nodes did not register", nnodes);
        return -1;
    }
    kvf_record_config(d->rec, "master", c->master_addr);
    kvf_record_config_num(d->rec, "nodes", nnodes);
    kvf_record_config_num(d->rec, "node pool bytes", (double)c->node_pool);
    kvf_record_config_num(d->rec, "replicas", c->replicas ? c->replicas : 1);
    kvf_record_config_num(d->rec, "node ttl_ms", c->node_ttl_ms);
    kvf_record_config_num(d->rec, "put timeout_ms", c->put_timeout_ms);
    return 0;
}

void kvf_drill_cluster_stop(kvf_drill_cluster_t *c)
{
    unsigned i;

    for (i = 0; i < KVF_DRILL_NODES_MAX; i++) {
        if (c->node[i] > 0) {
            kvf_drill_kill(c->node[i], SIGTERM);
            c->node[i] = 0;
        }
    }
    if (c->master > 0) {
        kvf_drill_kill(c->master, SIGTERM);
        c->master = 0;
    }
}

static double kvf_drill_json_num(const char *body, const char *key)
{
    char pat[64];
    const char *p;

    snprintf(pat, sizeof(pat), "\"%s\":", key);
    p = strstr(body, pat);
    return p ? strtod(p + strlen(pat), NULL) : NAN;
}

static int kvf_drill_status_here(const char *http, kvf_drill_mstatus_t *s);

typedef struct kvf_status_job {
    char http[64];
    kvf_drill_mstatus_t s;
    int rc;
} kvf_status_job_t;

static int kvf_drill_status_helper(kvf_drill_t *d, void *arg)
{
    kvf_status_job_t *j = arg;

    (void)d;
    j->rc = kvf_drill_status_here(j->http, &j->s);
    return 0;
}

int kvf_drill_status(kvf_drill_t *d, kvf_drill_cluster_t *c,
                     kvf_drill_mstatus_t *s)
{
    static kvf_status_job_t *job;

    if (c->netns == NULL) {
        return kvf_drill_status_here(c->http_addr, s);
    }
    /* the master listens inside the namespace: ask from in there */
    if (job == NULL && (job = kvf_drill_shared_alloc(sizeof(*job))) == NULL) {
        return -1;
    }
    snprintf(job->http, sizeof(job->http), "%s", c->http_addr);
    job->rc = -1;
    if (kvf_drill_oneshot(d, c->netns, kvf_drill_status_helper, job, 5000) !=
        0) {
        return -1;
    }
    *s = job->s;
    return job->rc;
}

static int kvf_drill_status_here(const char *http, kvf_drill_mstatus_t *s)
{
    char host[KVF_HOST_MAX], buf[16384], *body, tok[KVF_HTTP_TOKEN_LEN + 1];
    char req[160];
    uint64_t deadline = kvf_time_ms() + 2000;
    size_t got = 0;
    uint16_t port;
    ssize_t r;
    int fd;

    memset(s, 0, sizeof(*s));
    s->objects = NAN;
    if (kvf_sock_parse_addr(http, host, sizeof(host), &port) != KVF_OK ||
        kvf_sock_connect(host, port, 2000, &fd) != KVF_OK) {
        return -1;
    }
    kvf_auth_http_token(host, tok, sizeof(tok)); /* "" when auth is off */
    snprintf(req, sizeof(req), "GET /status HTTP/1.0\r\n%s%s%s\r\n",
             tok[0] ? "Authorization: Bearer " : "", tok, tok[0] ? "\r\n" : "");
    if (kvf_sock_send_all(fd, req, strlen(req), deadline) != KVF_OK) {
        close(fd);
        return -1;
    }
    while (got + 1 < sizeof(buf) &&
           kvf_sock_wait(fd, POLLIN, deadline) == KVF_OK) {
        r = read(fd, buf + got, sizeof(buf) - 1 - got);
        if (r <= 0) {
            break;
        }
        got += (size_t)r;
    }
    close(fd);
    buf[got] = '\0';
    body = strstr(buf, "\r\n\r\n");
    if (strncmp(buf, "HTTP/1.0 200", 12) != 0 || body == NULL) {
        return -1;
    }
    s->nodes = kvf_drill_json_num(body, "nodes");
    s->capacity = kvf_drill_json_num(body, "capacity");
    s->used = kvf_drill_json_num(body, "used");
    s->objects = kvf_drill_json_num(body, "objects");
    s->pending = kvf_drill_json_num(body, "pending");
    s->evictions = kvf_drill_json_num(body, "evictions");
    s->reclaimed = kvf_drill_json_num(body, "reclaimed");
    s->nodes_lost = kvf_drill_json_num(body, "nodes_lost");
    s->objects_lost = kvf_drill_json_num(body, "objects_lost");
    s->puts = kvf_drill_json_num(body, "puts");
    s->hits = kvf_drill_json_num(body, "hits");
    s->misses = kvf_drill_json_num(body, "misses");
    s->leader = kvf_drill_json_num(body, "leader");
    s->term = kvf_drill_json_num(body, "term");
    s->disk_only = kvf_drill_json_num(body, "objects_disk_only");
    s->disk_capacity = kvf_drill_json_num(body, "disk_capacity");
    s->tier_reads = kvf_drill_json_num(body, "tier_reads");
    s->tier_writes = kvf_drill_json_num(body, "tier_writes");
    s->tier_corrupt = kvf_drill_json_num(body, "tier_corrupt");
    s->tiers_off = kvf_drill_json_num(body, "disk_tiers_off");
    return isnan(s->objects) ? -1 : 0;
}

double kvf_drill_wait_nodes(kvf_drill_t *d, kvf_drill_cluster_t *c, unsigned n,
                            unsigned max_ms)
{
    uint64_t t0 = kvf_time_ms(), end = t0 + max_ms;
    kvf_drill_mstatus_t s;

    do {
        if (kvf_drill_status(d, c, &s) == 0 && s.nodes == n) {
            return (double)(kvf_time_ms() - t0);
        }
        usleep(20000);
    } while (kvf_time_ms() < end);
    return -1.0;
}

void kvf_drill_master_res(kvf_drill_t *d, kvf_drill_cluster_t *c,
                          kvf_drill_res_t *res)
{
    kvf_drill_mstatus_t s;

    kvf_drill_proc_res(c->master, res);
    if (kvf_drill_status(d, c, &s) == 0) {
        res->objects = s.objects;
        res->alloc_bytes = s.used; /* bytes allocated in the node pools */
    }
    if (c->nnodes > 0 && c->node[c->nnodes - 1] > 0) {
        kvf_drill_proc_res(c->node[c->nnodes - 1],
                           &c->node_snap[c->nsnaps > 0 ? 1 : 0]);
        c->nsnaps++;
    }
}

double kvf_drill_node_settle(kvf_drill_t *d, kvf_drill_cluster_t *c,
                             unsigned max_ms)
{
    uint64_t t0 = kvf_time_ms(), end = t0 + max_ms;
    pid_t pid = c->nnodes > 0 ? c->node[c->nnodes - 1] : 0;
    kvf_drill_res_t r;

    (void)d;
    if (c->nsnaps == 0 || pid <= 0) {
        return NAN;
    }
    do {
        kvf_drill_proc_res(pid, &r);
        if (r.fds <= c->node_snap[0].fds + 2) {
            return (double)(kvf_time_ms() - t0);
        }
        usleep(50000);
    } while (kvf_time_ms() < end);
    return -1.0;
}

/* --- objects -------------------------------------------------------------- */

static void kvf_obj_put64(unsigned char *p, uint64_t v)
{
    memcpy(p, &v, sizeof(v));
}

static uint64_t kvf_obj_get64(const unsigned char *p)
{
    uint64_t v;

    memcpy(&v, p, sizeof(v));
    return v;
}

uint64_t kvf_drill_obj_size(const char *key, unsigned min_kb, unsigned max_kb)
{
    uint64_t h = kvf_checksum(key, strlen(key));
    unsigned span = (max_kb > min_kb) ? max_kb - min_kb + 1 : 1;

    return ((uint64_t)min_kb + h % span) * 1024u;
}

void kvf_drill_obj_fill(unsigned char *buf, const char *key, uint64_t version,
                        uint64_t size)
{
    uint64_t kh = kvf_checksum(key, strlen(key));
    kvf_rng_t rng;

    kvf_obj_put64(buf, KVF_OBJ_MAGIC);
    kvf_obj_put64(buf + 8, kh);
    kvf_obj_put64(buf + 16, version);
    kvf_obj_put64(buf + 24, size);
    kvf_rng_seed(&rng, kh ^ (version * 0x9e3779b97f4a7c15ull));
    kvf_rng_fill(&rng, buf + KVF_OBJ_HDR, size - KVF_OBJ_HDR);
}

uint64_t kvf_drill_obj_check(const unsigned char *buf, size_t len,
                             const char *key, unsigned min_epoch,
                             unsigned char *scratch)
{
    uint64_t kh = kvf_checksum(key, strlen(key)), version, diff = 0;
    size_t i;

    if (len < KVF_OBJ_HDR || kvf_obj_get64(buf) != KVF_OBJ_MAGIC ||
        kvf_obj_get64(buf + 8) != kh || kvf_obj_get64(buf + 24) != len) {
        return len ? len : 1; /* not this key's object at all */
    }
    version = kvf_obj_get64(buf + 16);
    if ((unsigned)(version >> 32) < min_epoch) {
        return len; /* stored before the master restarted: stale */
    }
    kvf_drill_obj_fill(scratch, key, version, len);
    if (memcmp(buf, scratch, len) == 0) {
        return 0;
    }
    for (i = 0; i < len; i++) {
        diff += (buf[i] != scratch[i]);
    }
    return diff;
}

/* --- the store worker ----------------------------------------------------- */

typedef struct kvf_kvw {
    kvf_drill_t *d;
    kvf_drill_shared_t *sh;
    const kvf_kv_arg_t *a;
    kvf_store_h st;
    kvf_region_h reg;
    unsigned char *put_buf, *get_buf, *scratch;
    size_t cap;
    kvf_rng_t rng;
    uint64_t counter;
} kvf_kvw_t;

static int kvf_kvw_clean(kvf_status_t s, int op)
{
    switch (op) {
    case 0: /* get */
        return s == KVF_ERR_NO_KEY || s == KVF_ERR_NOT_READY;
    case 1: /* put */
        return s == KVF_ERR_EXISTS || s == KVF_ERR_BUSY;
    default: /* remove */
        return s == KVF_ERR_NO_KEY || s == KVF_ERR_LEASED || s == KVF_ERR_BUSY;
    }
}

static kvf_status_t kvf_kvw_put(kvf_kvw_t *w, const char *key, size_t size)
{
    kvf_store_put_opts_t po = {w->a->replicas, 0};
    uint64_t version, t0;
    kvf_status_t s;

    version =
        ((uint64_t)__atomic_load_n(&w->sh->epoch, __ATOMIC_ACQUIRE) << 32) |
        (++w->counter & 0xffffffffu);
    kvf_drill_obj_fill(w->put_buf, key, version, size);
    __atomic_store_n(&w->sh->in_put, 1, __ATOMIC_RELEASE);
    t0 = kvf_time_ns();
    s = kvf_store_put(w->st, key, w->put_buf, size, &po);
    __atomic_store_n(&w->sh->in_put, 0, __ATOMIC_RELEASE);
    kvf_drill_count(w->sh, s, (kvf_time_ns() - t0) / 1000,
                    s == KVF_OK ? size : 0, kvf_kvw_clean(s, 1));
    return s;
}

static kvf_status_t kvf_kvw_get(kvf_kvw_t *w, const char *key)
{
    unsigned epoch = (unsigned)__atomic_load_n(&w->sh->epoch, __ATOMIC_ACQUIRE);
    uint64_t t0 = kvf_time_ns(), wrong;
    size_t len = 0;
    kvf_status_t s;

    s = kvf_store_get(w->st, key, w->get_buf, w->cap, &len, 0);
    kvf_drill_count(w->sh, s, (kvf_time_ns() - t0) / 1000,
                    s == KVF_OK ? len : 0, kvf_kvw_clean(s, 0));
    __atomic_add_fetch(s == KVF_OK              ? &w->sh->get_hits
                       : kvf_kvw_clean(s, 0) ? &w->sh->get_misses
                                             : &w->sh->get_errs,
                       1, __ATOMIC_RELAXED);
    if (s == KVF_OK) {
        wrong = kvf_drill_obj_check(w->get_buf, len, key, epoch, w->scratch);
        if (wrong > 0) {
            kvf_drill_wrong(w->sh, wrong);
        }
        __atomic_add_fetch(&w->sh->checked_bytes, len, __ATOMIC_RELAXED);
    }
    return s;
}

static kvf_status_t kvf_kvw_remove(kvf_kvw_t *w, const char *key)
{
    uint64_t t0 = kvf_time_ns();
    kvf_status_t s = kvf_store_remove(w->st, key);

    kvf_drill_count(w->sh, s, (kvf_time_ns() - t0) / 1000, 0,
                    kvf_kvw_clean(s, 2));
    return s;
}

/* A damaged object: the failed get took a read lease too, so the remove
 * waits it out (this client reads nothing meanwhile), then puts again. */
static void kvf_kvw_heal(kvf_kvw_t *w, const char *key, size_t size)
{
    uint64_t end = kvf_time_ms() + KVF_DRILL_LEASE_MS + 500;
    kvf_status_t s;

    while ((s = kvf_kvw_remove(w, key)) == KVF_ERR_LEASED &&
           kvf_time_ms() < end) {
        usleep(50000);
    }
    if (s == KVF_OK || s == KVF_ERR_NO_KEY) {
        kvf_kvw_put(w, key, size);
    }
}

void kvf_drill_kv_key(char *out, size_t len, const kvf_drill_t *d,
                      const kvf_kv_arg_t *a, int worker, unsigned k)
{
    snprintf(out, len, "dr/%s/%s%d/k%u", d->name, a->prefix ? a->prefix : "w",
             worker, k);
}

static void kvf_kvw_step(kvf_kvw_t *w)
{
    const kvf_kv_arg_t *a = w->a;
    char key[128];
    unsigned k, r;
    kvf_status_t s;
    size_t size;

    unsigned keys = __atomic_load_n(&w->sh->keys_now, __ATOMIC_ACQUIRE);

    if (a->sequential) {
        k = (unsigned)w->counter; /* every put a new key */
    } else {
        k = (unsigned)kvf_rng_below(&w->rng, keys ? keys : a->keys);
    }
    kvf_drill_kv_key(key, sizeof(key), w->d, a, w->sh->index, k);
    size = kvf_drill_obj_size(key, a->min_kb, a->max_kb);
    r = (unsigned)kvf_rng_below(&w->rng, 100);
    if (a->sequential) {
        kvf_kvw_put(w, key, size);
    } else if (r < a->remove_pct) {
        kvf_kvw_remove(w, key);
    } else if (r < a->remove_pct + a->get_pct) {
        s = kvf_kvw_get(w, key);
        if (s == KVF_ERR_NO_KEY) {
            kvf_kvw_put(w, key, size); /* read-through */
        } else if (s == KVF_ERR_CHECKSUM && a->heal_checksum) {
            kvf_kvw_heal(w, key, size);
        }
    } else {
        kvf_kvw_put(w, key, size);
    }
}

static int kvf_kvw_fail(kvf_kvw_t *w, const char *what, kvf_status_t s)
{
    snprintf(w->sh->note, sizeof(w->sh->note), "%s: %s", what,
             kvf_status_name(s));
    __atomic_store_n(&w->sh->failed, 1, __ATOMIC_RELEASE);
    return 1;
}

static uint64_t kvf_kvw_errors(const kvf_drill_shared_t *sh)
{
    uint64_t n = 0;
    int p;

    for (p = 0; p < KVF_DRILL_PHASES; p++) {
        n += __atomic_load_n(&sh->ph[p].calls_err, __ATOMIC_RELAXED);
    }
    return n;
}

int kvf_drill_kv_main(kvf_drill_t *d, kvf_drill_shared_t *sh, void *arg)
{
    kvf_store_params_t p = {0};
    kvf_kvw_t w;
    kvf_status_t s;
    size_t len;

    memset(&w, 0, sizeof(w));
    w.d = d;
    w.sh = sh;
    w.a = arg;
    kvf_rng_seed(&w.rng, d->seed * 7919u + (uint64_t)sh->index + 1);
    if (w.a->fault != NULL) {
        setenv("KVF_FAULT", w.a->fault, 1);
    }
    w.cap = (size_t)w.a->max_kb * 1024u;
    len = 3 * w.cap;
    w.put_buf = mmap(NULL, len, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (w.put_buf == MAP_FAILED) {
        return kvf_kvw_fail(&w, "buffer", KVF_ERR_NO_MEMORY);
    }
    w.get_buf = w.put_buf + w.cap;
    w.scratch = w.get_buf + w.cap;
    p.field_mask = KVF_STORE_PARAM_MASTER | KVF_STORE_PARAM_TIMEOUT;
    p.master = sh->addr;
    p.timeout_ms = d->timeout_ms;
    if (sh->tcp_only) {
        p.transports = "tcp";
        p.field_mask |= KVF_STORE_PARAM_TRANSPORTS;
    }
    s = kvf_store_connect(&p, &w.st);
    if (s != KVF_OK) {
        return kvf_kvw_fail(&w, "store connect", s);
    }
    s = kvf_engine_reg(kvf_store_engine(w.st), w.put_buf, 2 * w.cap,
                       KVF_MEM_HOST, 0, &w.reg);
    if (s != KVF_OK) {
        return kvf_kvw_fail(&w, "register", s);
    }
    __atomic_store_n(&sh->ready, 1, __ATOMIC_RELEASE);
    while (!kvf_drill_worker_poll(sh)) {
        uint64_t errs = kvf_kvw_errors(sh);

        kvf_kvw_step(&w);
        if (kvf_kvw_errors(sh) != errs) {
            usleep(KVF_DRILL_BACKOFF_US); /* a client backs off on errors */
        } else if (w.a->pace_us > 0) {
            usleep(w.a->pace_us);
        }
    }
    kvf_engine_dereg(kvf_store_engine(w.st), w.reg);
    kvf_store_disconnect(w.st);
    munmap(w.put_buf, len);
    return 0;
}

int kvf_drill_kv_workers(kvf_drill_t *d, kvf_drill_cluster_t *c,
                         const char *netns, const kvf_kv_arg_t *a, unsigned n)
{
    unsigned i;

    for (i = 0; i < n; i++) {
        if (kvf_drill_worker(d, netns, kvf_drill_kv_main, (void *)a,
                             c->master_addr) < 0) {
            kvf_drill_fail(d, "cannot start store worker %u", i);
            return -1;
        }
    }
    return kvf_drill_workers_ready(d, 15000);
}

/* Bound of one store call: rpc stages (1 for a get, 2 for a put), one
 * peer open, and per replica read an engine wait plus its cancel, each
 * bounded by the client timeout. */
uint64_t kvf_drill_store_bound(const kvf_drill_t *d, unsigned replicas)
{
    return (uint64_t)d->timeout_ms * (3 + 2 * (replicas ? replicas : 1));
}

/* --- one-shot helpers ----------------------------------------------------- */

int kvf_drill_oneshot(kvf_drill_t *d, const char *netns,
                      int (*fn)(kvf_drill_t *d, void *arg), void *arg,
                      unsigned max_ms)
{
    uint64_t end = kvf_time_ms() + max_ms;
    int st = 0;
    pid_t pid, w;

    pid = kvf_drill_fork(netns);
    if (pid < 0) {
        return -1;
    }
    if (pid == 0) {
        kvf_drill_log_to(d, "helper");
        _exit(fn(d, arg));
    }
    while ((w = waitpid(pid, &st, WNOHANG)) == 0 && kvf_time_ms() < end) {
        usleep(2000);
    }
    if (w == 0) {
        kvf_drill_kill(pid, SIGKILL);
        return -1;
    }
    kvf_drill_untrack_pid(pid);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

void *kvf_drill_shared_alloc(size_t len)
{
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_ANONYMOUS, -1, 0);

    if (p == MAP_FAILED) {
        return NULL;
    }
    memset(p, 0, len);
    return p;
}

void kvf_drill_store_report(kvf_drill_t *d, kvf_drill_cluster_t *c,
                            const kvf_drill_res_t *mbase,
                            const kvf_drill_res_t *mafter)
{
    kvf_drill_mstatus_t s;

    kvf_record_drill_resource(d->rec, "master objects", mbase->objects,
                              mafter->objects);
    kvf_record_drill_resource(d->rec, "master allocated bytes (node pools)",
                              mbase->alloc_bytes, mafter->alloc_bytes);
    kvf_record_drill_resource(d->rec, "master sockets", mbase->conns,
                              mafter->conns);
    kvf_record_drill_resource(d->rec, "master fds", mbase->fds, mafter->fds);
    kvf_record_drill_resource(d->rec, "master RSS KiB", mbase->rss_kb,
                              mafter->rss_kb);
    kvf_drill_check(d, mafter->fds <= mbase->fds + 2, "master fds %.0f -> %.0f",
                    mbase->fds, mafter->fds);
    if (c->nsnaps >= 2) {
        const kvf_drill_res_t *nb = &c->node_snap[0], *na = &c->node_snap[1];

        kvf_record_drill_resource(d->rec, "node sockets", nb->conns, na->conns);
        kvf_record_drill_resource(d->rec, "node fds", nb->fds, na->fds);
        kvf_record_drill_resource(d->rec, "node RSS KiB", nb->rss_kb,
                                  na->rss_kb);
        kvf_drill_check(d, na->fds <= nb->fds + 2,
                        "node fds %.0f -> %.0f (connections of gone "
                        "clients kept open?)",
                        nb->fds, na->fds);
    }
    if (kvf_drill_status(d, c, &s) == 0) {
        kvf_record_drill_num(d->rec, "master pending puts at end", s.pending);
        kvf_record_drill_num(d->rec, "master evictions", s.evictions);
        kvf_record_drill_num(d->rec, "master reclaimed puts", s.reclaimed);
        kvf_record_drill_num(d->rec, "master objects lost", s.objects_lost);
        kvf_record_drill_num(d->rec, "master nodes lost", s.nodes_lost);
    }
}

int kvf_drill_store_begin(kvf_drill_t *d, kvf_drill_cluster_t *c,
                          unsigned nnodes, const kvf_kv_arg_t *a, unsigned n)
{
    if (kvf_drill_cluster_start(d, c, nnodes) != 0 ||
        kvf_drill_kv_workers(d, c, NULL, a, n) != 0) {
        kvf_drill_cluster_stop(c);
        return -1;
    }
    return 0;
}

void kvf_drill_store_baseline(kvf_drill_t *d, kvf_drill_cluster_t *c,
                              kvf_drill_res_t *base, kvf_drill_res_t *mbase,
                              kvf_drill_mstatus_t *s_p, int keep_paused)
{
    kvf_drill_phase(d, KVF_DRILL_BASE);
    kvf_drill_sleep(d, d->phase_ms);
    kvf_drill_workers_pause(d, base, 0);
    kvf_drill_master_res(d, c, mbase);
    if (s_p != NULL) {
        kvf_drill_status(d, c, s_p);
    }
    if (!keep_paused) {
        kvf_drill_workers_pause(d, NULL, 1);
    }
    d->phase_secs[KVF_DRILL_BASE] = d->phase_ms / 1000.0;
}
