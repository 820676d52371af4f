/*
 * The RESP2 front door: epoll event loops (one thread each) sharing one
 * listening socket and one store client. Each connection owns a hiredis
 * redisReader whose objects are built here: a long bulk goes straight into
 * the registered value pool, so a SET moves pool -> node and a GET node ->
 * pool -> socket. A connection stops reading while its output waits, so a
 * long pipeline is served with bounded memory; a protocol error, an
 * oversize bulk length or an over-long line gets an error reply and the
 * connection is closed. The GETs and SETs of the clients a loop finds
 * ready run together as store batches on the loop's thread (one master
 * round trip per phase); each connection has one in flight. AUTH's
 * password is derived from the cluster secret unless a password file
 * gives one.
 */
#include "store/resp/resp.h"

#include "core/auth.h"
#include "core/config.h"
#include "core/log.h"
#include "core/sock.h"
#include "core/time.h"

#include <kvferry/store.h>

#include <errno.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <hiredis/read.h>
#include <hiredis/sds.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

/* The type of the item the reader is in (its task stack changed form in
 * hiredis 1.0). The reader's public fields used here (buf, pos, len,
 * ridx) are the same in 0.14 (Debian 12) and 1.x. */
#if HIREDIS_MAJOR >= 1
#define KVF_RESP_TASK_TYPE(rd) ((rd)->task[(rd)->ridx]->type)
#else
#define KVF_RESP_TASK_TYPE(rd) ((rd)->rstack[(rd)->ridx].type)
#endif

static const kvf_config_entry_t kvf_resp_config_entries[] = {
    {"resp_listen", "127.0.0.1:6379", "kvferry resp: address served",
     KVF_CONFIG_USER},
    {"resp_password_file", "",
     "kvferry resp: a 0600 file holding the password AUTH must give "
     "(empty: the password derived from the cluster secret, printed by "
     "kvferry resp --print-password)",
     KVF_CONFIG_USER},
    {"resp_max_value", "512M", "kvferry resp: longest value accepted",
     KVF_CONFIG_TUNING},
    {"resp_pool", "1G",
     "kvferry resp: registered pool holding values in flight",
     KVF_CONFIG_TUNING},
    {"resp_max_clients", "1024", "kvferry resp: connections served at once",
     KVF_CONFIG_TUNING},
    {"resp_idle_ms", "300000",
     "kvferry resp: idle connections are closed after this (0 = never)",
     KVF_CONFIG_TUNING},
    {"resp_threads", "1", "kvferry resp: event loops (threads)",
     KVF_CONFIG_TUNING},
};
KVF_CONFIG_TABLE(kvf_resp_config, "resp", kvf_resp_config_entries)

#define KVF_RESP_LOOPS_MAX 64
/* Label of the AUTH password derived from the cluster secret. */
#define KVF_RESP_TOKEN_LABEL "kvferry-resp-v1"
#define KVF_RESP_PW_MAX      512
#define KVF_RESP_OUT_CAP     (KVF_RESP_OUT_HIGH + KVF_RESP_INLINE_MAX + 1024)
/* One receive into the reader: small, so that most of a long value is
 * received straight into the pool (see kvf_resp_direct_start) rather
 * than copied through the reader. */
#define KVF_RESP_RECV        (8u << 10)
#define KVF_RESP_SET_STRIPES 64
#define KVF_RESP_RECENT      4096 /* a multiple of the stripes */
/* Bulks this long are received straight into the pool. */
#define KVF_RESP_DIRECT_MIN (16u << 10)
/* GETs read into a buffer of the last size read up to this size. */
#define KVF_RESP_HINT_MAX (8u << 20)

/* Objects the redisReader builds for us. */
enum { KVF_RO_STR = 1, KVF_RO_ARR, KVF_RO_OTHER };

typedef struct kvf_ro_str {
    int kind;
    int pooled; /* p lies in the value pool */
    int nomem;  /* the pool had no room: p is NULL */
    size_t len;
    char *p;
} kvf_ro_str_t;

typedef struct kvf_ro_arr {
    int kind;
    int argc;
    void *argv[];
} kvf_ro_arr_t;

typedef struct kvf_resp_pool {
    char *base;
    size_t len;
    size_t granules;
    uint8_t *used; /* one byte per granule */
    size_t low;    /* no free granule below */
    pthread_mutex_t mu;
    kvf_region_h region;
} kvf_resp_pool_t;

typedef struct kvf_resp_loop kvf_resp_loop_t;

/* A value read by a GET, shared by every connection of one batch that
 * asked for its key (one loop thread: plain reference count). */
typedef struct kvf_resp_val {
    char *p; /* in the pool */
    size_t cap, len;
    unsigned refs;
} kvf_resp_val_t;

/* The store command a connection waits on (at most one). */
enum { KVF_RESP_OP_NONE = 0, KVF_RESP_OP_GET, KVF_RESP_OP_SET };

typedef struct kvf_resp_conn {
    int fd;
    uint32_t events; /* epoll interest now */
    kvf_resp_loop_t *lp;
    redisReader *rd;
    char *out;
    size_t out_len, out_off;
    kvf_resp_val_t *big; /* GET value being sent, then "\r\n" */
    size_t big_off;
    int op;               /* KVF_RESP_OP_*: queued in the loop's batch */
    kvf_ro_str_t *oval;   /* SET: the value, owned by the op */
    kvf_status_t ost;     /* the op's outcome */
    kvf_resp_val_t *oget; /* GET: the value read */
    uint64_t ohash;
    char okey[KVF_STORE_KEY_MAX + 1];
    char *dbuf; /* a long bulk received straight into the pool */
    size_t dlen, dgot;
    int dready; /* dbuf is whole: the reader's next (empty) bulk is it */
    uint64_t last_ms;
    int authed;
    int closing; /* close once the output is flushed */
    struct kvf_resp_conn *prev, *next;
} kvf_resp_conn_t;

struct kvf_resp_loop {
    struct kvf_resp *srv;
    int ep;
    pthread_t thr;
    kvf_resp_conn_t *conns;
    char *rbuf;
    /* connections whose GET or SET waits for the next store batch */
    kvf_resp_conn_t **q;
    size_t nq, qcap;
};

struct kvf_resp {
    kvf_server_resp_params_t p;
    kvf_store_h st;
    kvf_resp_pool_t pool;
    int lfd;
    int stopfd;
    atomic_int stop;
    atomic_uint nclients;
    atomic_size_t get_hint; /* size of the last value read */
    /* SETs of one key run one at a time (by stripe), so an overwrite's
     * remove and put do not race another SET of this door */
    pthread_mutex_t set_mu[KVF_RESP_SET_STRIPES];
    /* hashes of keys this door stored lately (slot = hash % size, under
     * the stripe's lock): a SET of one of them removes before it puts,
     * one master round trip fewer than a put refused with "exists" */
    uint64_t set_recent[KVF_RESP_RECENT];
    unsigned nloops;
    kvf_resp_loop_t loops[KVF_RESP_LOOPS_MAX];
    char password[KVF_RESP_PW_MAX];
    size_t pwlen;
    char addr[KVF_HOST_MAX + 8];
};

/* The connection whose reader is parsing (objects go to its pool). */
static __thread kvf_resp_conn_t *kvf_resp_cur;

/* ---- value pool ---------------------------------------------------- */

static kvf_status_t kvf_resp_pool_init(struct kvf_resp *s)
{
    kvf_resp_pool_t *pl = &s->pool;
    kvf_status_t st;

    pthread_mutex_init(&pl->mu, NULL);
    pl->granules = (s->p.pool + KVF_RESP_GRANULE - 1) / KVF_RESP_GRANULE;
    pl->len = pl->granules * KVF_RESP_GRANULE;
    pl->base = mmap(NULL, pl->len, PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (pl->base == MAP_FAILED) {
        pl->base = NULL;
        return KVF_ERR_NO_MEMORY;
    }
    pl->used = calloc(pl->granules, 1);
    if (pl->used == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    st = kvf_engine_reg(kvf_store_engine(s->st), pl->base, pl->len,
                        KVF_MEM_HOST, 0, &pl->region);
    if (st != KVF_OK) {
        pl->region = NULL;
    }
    return st;
}

static void kvf_resp_pool_fini(struct kvf_resp *s)
{
    kvf_resp_pool_t *pl = &s->pool;

    if (pl->region != NULL) {
        kvf_engine_dereg(kvf_store_engine(s->st), pl->region);
    }
    if (pl->base != NULL) {
        munmap(pl->base, pl->len);
    }
    free(pl->used);
    pthread_mutex_destroy(&pl->mu);
}

/* First fit of n free granules from i; returns the start or SIZE_MAX. */
static size_t kvf_resp_pool_fit(const kvf_resp_pool_t *pl, size_t i, size_t end,
                                size_t n)
{
    size_t run = 0;

    for (; i < end; i++) {
        run = pl->used[i] ? 0 : run + 1;
        if (run == n) {
            return i + 1 - n;
        }
    }
    return SIZE_MAX;
}

static char *kvf_resp_pool_alloc(kvf_resp_pool_t *pl, size_t len)
{
    size_t n = (len + KVF_RESP_GRANULE - 1) / KVF_RESP_GRANULE, at;

    if (n == 0) {
        n = 1;
    }
    if (n > pl->granules) {
        return NULL;
    }
    pthread_mutex_lock(&pl->mu);
    /* first fit from the start: buffers stay in the few pages (and cache
     * lines) already touched */
    at = kvf_resp_pool_fit(pl, pl->low, pl->granules, n);
    if (at != SIZE_MAX) {
        memset(pl->used + at, 1, n);
        if (at == pl->low) {
            pl->low = at + n;
        }
    }
    pthread_mutex_unlock(&pl->mu);
    return at == SIZE_MAX ? NULL : pl->base + at * KVF_RESP_GRANULE;
}

static void kvf_resp_pool_free(kvf_resp_pool_t *pl, char *p, size_t len)
{
    size_t n = (len + KVF_RESP_GRANULE - 1) / KVF_RESP_GRANULE, at;

    if (p == NULL) {
        return;
    }
    at = (size_t)(p - pl->base) / KVF_RESP_GRANULE;
    pthread_mutex_lock(&pl->mu);
    memset(pl->used + at, 0, n ? n : 1);
    if (at < pl->low) {
        pl->low = at;
    }
    pthread_mutex_unlock(&pl->mu);
}

/* ---- redisReader objects ------------------------------------------- */

static void kvf_ro_attach(const redisReadTask *t, void *obj)
{
    kvf_ro_arr_t *parent;

    if (t->parent == NULL || t->parent->obj == NULL) {
        return;
    }
    parent = t->parent->obj;
    if (parent->kind == KVF_RO_ARR && t->idx >= 0 && t->idx < parent->argc) {
        parent->argv[t->idx] = obj;
    }
}

static void *kvf_ro_string(const redisReadTask *t, char *str, size_t len)
{
    kvf_resp_conn_t *c = kvf_resp_cur;
    kvf_ro_str_t *o = calloc(1, sizeof(*o) + (len <= 1024 ? len + 1 : 0));

    if (o == NULL) {
        return NULL;
    }
    o->kind = (t->type == REDIS_REPLY_STRING) ? KVF_RO_STR : KVF_RO_OTHER;
    o->len = len;
    if (c != NULL && c->dready && len == 0) {
        o->p = c->dbuf; /* the bulk kvf_resp_direct_start took over */
        o->len = c->dlen;
        o->pooled = 1;
        c->dbuf = NULL;
        c->dready = 0;
        len = 0;
    } else if (len <= 1024) {
        o->p = (char *)(o + 1);
    } else if (c != NULL) {
        o->p = kvf_resp_pool_alloc(&c->lp->srv->pool, len);
        o->pooled = o->p != NULL;
        o->nomem = o->p == NULL;
    }
    if (o->p != NULL && len > 0) {
        memcpy(o->p, str, len);
    }
    kvf_ro_attach(t, o);
    return o;
}

static void *kvf_ro_array(const redisReadTask *t, int elements)
{
    kvf_ro_arr_t *o;

    if (elements < 0 || elements > KVF_RESP_ARGS_MAX) {
        return NULL; /* the reader reports out of memory: we close */
    }
    o = calloc(1, sizeof(*o) + (size_t)elements * sizeof(void *));
    if (o == NULL) {
        return NULL;
    }
    o->kind = KVF_RO_ARR;
    o->argc = elements;
    kvf_ro_attach(t, o);
    return o;
}

static void *kvf_ro_other(const redisReadTask *t)
{
    int *o = calloc(1, sizeof(kvf_ro_str_t));

    if (o != NULL) {
        *o = KVF_RO_OTHER;
        kvf_ro_attach(t, o);
    }
    return o;
}

static void *kvf_ro_integer(const redisReadTask *t, long long v)
{
    (void)v;
    return kvf_ro_other(t);
}

static void kvf_ro_free(void *obj)
{
    int *kind = obj;
    kvf_ro_arr_t *a;
    kvf_ro_str_t *s;
    int i;

    if (obj == NULL) {
        return;
    }
    if (*kind == KVF_RO_ARR) {
        a = obj;
        for (i = 0; i < a->argc; i++) {
            kvf_ro_free(a->argv[i]);
        }
    } else {
        s = obj;
        if (s->pooled && kvf_resp_cur != NULL) {
            kvf_resp_pool_free(&kvf_resp_cur->lp->srv->pool, s->p, s->len);
        }
    }
    free(obj);
}

static redisReplyObjectFunctions kvf_ro_fns = {
    kvf_ro_string, kvf_ro_array, kvf_ro_integer, kvf_ro_other, kvf_ro_free,
};

/* ---- output -------------------------------------------------------- */

static void kvf_resp_out(kvf_resp_conn_t *c, const void *p, size_t len)
{
    if (c->out_off > 0 && c->out_len + len > KVF_RESP_OUT_CAP) {
        memmove(c->out, c->out + c->out_off, c->out_len - c->out_off);
        c->out_len -= c->out_off;
        c->out_off = 0;
    }
    if (c->out_len + len > KVF_RESP_OUT_CAP) {
        c->closing = 1; /* cannot happen: callers stop at OUT_HIGH */
        return;
    }
    memcpy(c->out + c->out_len, p, len);
    c->out_len += len;
}

static void kvf_resp_outs(kvf_resp_conn_t *c, const char *s)
{
    kvf_resp_out(c, s, strlen(s));
}

static void kvf_resp_int(kvf_resp_conn_t *c, long long v)
{
    char b[32];

    kvf_resp_out(c, b, (size_t)snprintf(b, sizeof(b), ":%lld\r\n", v));
}

static void kvf_resp_bulk(kvf_resp_conn_t *c, const void *p, size_t len)
{
    char b[32];

    kvf_resp_out(c, b, (size_t)snprintf(b, sizeof(b), "$%zu\r\n", len));
    kvf_resp_out(c, p, len);
    kvf_resp_out(c, "\r\n", 2);
}

static void kvf_resp_err(kvf_resp_conn_t *c, const char *fmt, const char *a)
{
    char b[256];
    size_t n = (size_t)snprintf(b, sizeof(b) - 2, fmt, a);

    if (n > sizeof(b) - 3) {
        n = sizeof(b) - 3;
    }
    for (size_t i = 0; i < n; i++) {
        if (b[i] == '\r' || b[i] == '\n') {
            b[i] = ' ';
        }
    }
    memcpy(b + n, "\r\n", 2);
    kvf_resp_out(c, b, n + 2);
}

static int kvf_resp_blocked(const kvf_resp_conn_t *c)
{
    return c->big != NULL || c->closing || c->op != KVF_RESP_OP_NONE ||
           c->out_len - c->out_off > KVF_RESP_OUT_HIGH;
}

/* ---- commands ------------------------------------------------------ */

typedef struct kvf_resp_cmd {
    kvf_resp_conn_t *c;
    struct kvf_resp *s;
    int argc;
    kvf_ro_str_t **argv;
} kvf_resp_cmd_t;

static int kvf_resp_is(const kvf_ro_str_t *a, const char *name)
{
    return a->len == strlen(name) && strncasecmp(a->p, name, a->len) == 0;
}

/* The key as a C string in kb; 0 when it is not a valid store key. */
static int kvf_resp_key(const kvf_ro_str_t *a, char *kb)
{
    if (a->len == 0 || a->len > KVF_STORE_KEY_MAX ||
        memchr(a->p, 0, a->len) != NULL) {
        return 0;
    }
    memcpy(kb, a->p, a->len);
    kb[a->len] = 0;
    return 1;
}

static void kvf_resp_store_err(kvf_resp_conn_t *c, kvf_status_t st)
{
    kvf_resp_err(c, "-ERR store: %s", kvf_status_str(st));
}

static kvf_resp_val_t *kvf_resp_val_new(struct kvf_resp *s, size_t cap)
{
    kvf_resp_val_t *v = malloc(sizeof(*v));

    if (v == NULL) {
        return NULL;
    }
    v->p = kvf_resp_pool_alloc(&s->pool, cap ? cap : 1);
    if (v->p == NULL) {
        free(v);
        return NULL;
    }
    v->cap = cap ? cap : 1;
    v->len = 0;
    v->refs = 1;
    return v;
}

static void kvf_resp_val_unref(struct kvf_resp *s, kvf_resp_val_t *v)
{
    if (v != NULL && --v->refs == 0) {
        kvf_resp_pool_free(&s->pool, v->p, v->cap);
        free(v);
    }
}

/* Reads key into a fresh value: one kvf_store_get (a single round trip,
 * or none through the location cache) into a buffer of the last size
 * read, which fits the fixed-size values of KV caches; when the object
 * is larger (or that size is large), its size is asked first. */
static kvf_status_t kvf_resp_fetch(struct kvf_resp *s, const char *key,
                                   kvf_resp_val_t **val_p)
{
    size_t cap = atomic_load(&s->get_hint);
    kvf_store_info_t info;
    kvf_status_t st = KVF_ERR_NO_RESOURCE;
    kvf_resp_val_t *v = NULL;

    if (cap <= KVF_RESP_HINT_MAX) {
        if ((v = kvf_resp_val_new(s, cap)) == NULL) {
            return KVF_ERR_NO_MEMORY;
        }
        st = kvf_store_get(s->st, key, v->p, v->cap, &v->len, 0);
    }
    if (st == KVF_ERR_NO_RESOURCE) {
        kvf_resp_val_unref(s, v);
        v = NULL;
        st = kvf_store_query(s->st, key, &info);
        if (st != KVF_OK) {
            return st;
        }
        if ((v = kvf_resp_val_new(s, info.size)) == NULL) {
            return KVF_ERR_NO_MEMORY;
        }
        st = kvf_store_read(s->st, key, &info, v->p, v->cap, &v->len, 0);
    }
    if (st != KVF_OK) {
        kvf_resp_val_unref(s, v);
        return st;
    }
    atomic_store(&s->get_hint, v->len);
    *val_p = v;
    return KVF_OK;
}

/* FNV-1a of the key (never 0: 0 marks an empty slot of set_recent). */
static uint64_t kvf_resp_hash(const char *key)
{
    uint64_t h = 14695981039346656037ull;

    for (; *key != 0; key++) {
        h = (h ^ (unsigned char)*key) * 1099511628211ull;
    }
    return h | 1;
}

/* Queues the connection's GET or SET for the loop's next store batch;
 * the connection parses nothing more until it is answered. */
static void kvf_resp_enqueue(kvf_resp_conn_t *c, int op, const char *key,
                             kvf_ro_str_t *val)
{
    kvf_resp_loop_t *lp = c->lp;
    kvf_resp_conn_t **q;
    size_t cap;

    if (lp->nq == lp->qcap) {
        cap = lp->qcap ? 2 * lp->qcap : 64;
        q = realloc(lp->q, cap * sizeof(*q));
        if (q == NULL) {
            kvf_resp_outs(c, "-ERR out of memory\r\n");
            return; /* val stays with the request, freed with it */
        }
        lp->q = q;
        lp->qcap = cap;
    }
    c->op = op;
    c->oval = val;
    c->oget = NULL;
    c->ost = KVF_OK;
    c->ohash = kvf_resp_hash(key);
    strcpy(c->okey, key);
    lp->q[lp->nq++] = c;
}

static void kvf_resp_cmd_get(kvf_resp_cmd_t *m)
{
    char key[KVF_STORE_KEY_MAX + 1];

    if (!kvf_resp_key(m->argv[1], key)) {
        kvf_resp_outs(m->c, "$-1\r\n");
        return;
    }
    kvf_resp_enqueue(m->c, KVF_RESP_OP_GET, key, NULL);
}

/* A GET's answer once its batch ran. */
static void kvf_resp_get_reply(kvf_resp_conn_t *c)
{
    kvf_resp_val_t *v = c->oget;
    kvf_status_t st = c->ost;
    char hdr[32];

    c->oget = NULL;
    if (st == KVF_ERR_NO_KEY || st == KVF_ERR_NOT_READY) {
        kvf_resp_outs(c, "$-1\r\n");
    } else if (st == KVF_ERR_NO_MEMORY) {
        kvf_resp_outs(c, "-ERR value pool full, try again\r\n");
    } else if (st != KVF_OK || v == NULL) {
        kvf_resp_store_err(c, st != KVF_OK ? st : KVF_ERR_IO);
    } else if (v->len <= KVF_RESP_INLINE_MAX) {
        kvf_resp_bulk(c, v->p, v->len);
    } else {
        kvf_resp_out(c, hdr,
                     (size_t)snprintf(hdr, sizeof(hdr), "$%zu\r\n", v->len));
        v->refs++;
        c->big = v;
        c->big_off = 0;
    }
    kvf_resp_val_unref(c->lp->srv, v);
}

static void kvf_resp_cmd_set(kvf_resp_cmd_t *m)
{
    char key[KVF_STORE_KEY_MAX + 1];
    kvf_ro_str_t *v = m->argv[2];
    int i;

    /* EX/PX/EXAT/PXAT/KEEPTTL are accepted and ignored (no expiry) */
    for (i = 3; i < m->argc; i++) {
        if (kvf_resp_is(m->argv[i], "EX") || kvf_resp_is(m->argv[i], "PX") ||
            kvf_resp_is(m->argv[i], "EXAT") ||
            kvf_resp_is(m->argv[i], "PXAT")) {
            i++;
        } else if (!kvf_resp_is(m->argv[i], "KEEPTTL")) {
            kvf_resp_outs(m->c, "-ERR syntax error\r\n");
            return;
        }
    }
    if (i > m->argc) {
        kvf_resp_outs(m->c, "-ERR syntax error\r\n");
    } else if (!kvf_resp_key(m->argv[1], key)) {
        kvf_resp_outs(m->c, "-ERR invalid key\r\n");
    } else if (v->nomem) {
        kvf_resp_outs(m->c, "-ERR value pool full, try again\r\n");
    } else {
        m->argv[2] = NULL; /* the op owns the value now */
        kvf_resp_enqueue(m->c, KVF_RESP_OP_SET, key, v);
        if (m->c->op == KVF_RESP_OP_NONE) {
            m->argv[2] = v;
        }
    }
}

static void kvf_resp_set_reply(kvf_resp_conn_t *c)
{
    if (c->ost == KVF_ERR_NO_RESOURCE) {
        kvf_resp_outs(c, "-ERR value pool full, try again\r\n");
    } else if (c->ost != KVF_OK) {
        kvf_resp_store_err(c, c->ost);
    } else {
        kvf_resp_outs(c, "+OK\r\n");
    }
}

/* A key about to be removed is no longer one this door stored. */
static void kvf_resp_forget(struct kvf_resp *s, const char *key)
{
    uint64_t h = kvf_resp_hash(key);
    pthread_mutex_t *mu = &s->set_mu[h % KVF_RESP_SET_STRIPES];

    pthread_mutex_lock(mu);
    if (s->set_recent[h % KVF_RESP_RECENT] == h) {
        s->set_recent[h % KVF_RESP_RECENT] = 0;
    }
    pthread_mutex_unlock(mu);
}

/* EXISTS and DEL: the count of keys present (removed). */
static void kvf_resp_cmd_keys(kvf_resp_cmd_t *m, int del)
{
    char key[KVF_STORE_KEY_MAX + 1];
    long long n = 0;
    kvf_status_t st;
    int i;

    for (i = 1; i < m->argc; i++) {
        if (!kvf_resp_key(m->argv[i], key)) {
            continue;
        }
        if (del) {
            kvf_resp_forget(m->s, key);
        }
        st = del ? kvf_store_remove(m->s->st, key)
                 : kvf_store_exists(m->s->st, key);
        if (st == KVF_OK) {
            n++;
        } else if (st != KVF_ERR_NO_KEY && st != KVF_ERR_NOT_READY) {
            kvf_resp_store_err(m->c, st);
            return;
        }
    }
    kvf_resp_int(m->c, n);
}

static int kvf_resp_pw_equal(const struct kvf_resp *s, const kvf_ro_str_t *a)
{
    unsigned char d = (unsigned char)(a->len != s->pwlen);
    size_t i;

    for (i = 0; i < s->pwlen; i++) {
        d |= (unsigned char)(s->password[i] ^ (i < a->len ? a->p[i] : 0));
    }
    return d == 0;
}

static void kvf_resp_cmd_auth(kvf_resp_cmd_t *m)
{
    kvf_ro_str_t *pw = m->argv[m->argc - 1];

    if (m->s->pwlen == 0) {
        kvf_resp_outs(m->c, "-ERR AUTH <password> called without any "
                            "password configured for the default user. "
                            "Are you sure your configuration is correct?\r\n");
    } else if (m->argc > 3 ||
               (m->argc == 3 && !kvf_resp_is(m->argv[1], "default"))) {
        kvf_resp_outs(m->c, "-WRONGPASS invalid username-password pair or "
                            "user is disabled.\r\n");
    } else if (kvf_resp_pw_equal(m->s, pw)) {
        m->c->authed = 1;
        kvf_resp_outs(m->c, "+OK\r\n");
    } else {
        kvf_resp_outs(m->c, "-WRONGPASS invalid username-password pair or "
                            "user is disabled.\r\n");
    }
}

static void kvf_resp_cmd_hello(kvf_resp_cmd_t *m)
{
    static const char reply[] =
        "*14\r\n$6\r\nserver\r\n$5\r\nredis\r\n$7\r\nversion\r\n"
        "$5\r\n7.0.0\r\n$5\r\nproto\r\n:2\r\n$2\r\nid\r\n:1\r\n"
        "$4\r\nmode\r\n$10\r\nstandalone\r\n$4\r\nrole\r\n$6\r\nmaster\r\n"
        "$7\r\nmodules\r\n*0\r\n";

    if (m->argc > 1 && !kvf_resp_is(m->argv[1], "2")) {
        kvf_resp_outs(m->c, "-NOPROTO unsupported protocol version\r\n");
    } else {
        kvf_resp_out(m->c, reply, sizeof(reply) - 1);
    }
}

/* Commands answered before AUTH. */
static int kvf_resp_open_cmd(const kvf_ro_str_t *name)
{
    return kvf_resp_is(name, "AUTH") || kvf_resp_is(name, "PING") ||
           kvf_resp_is(name, "QUIT") || kvf_resp_is(name, "HELLO");
}

static void kvf_resp_cmd_ping(kvf_resp_cmd_t *m)
{
    if (m->argc > 1) {
        kvf_resp_bulk(m->c, m->argv[1]->p, m->argv[1]->len);
    } else {
        kvf_resp_outs(m->c, "+PONG\r\n");
    }
}

/* ECHO: redis-cli --pipe ends its stream with one to know it is done. */
static void kvf_resp_cmd_echo(kvf_resp_cmd_t *m)
{
    kvf_resp_bulk(m->c, m->argv[1]->p, m->argv[1]->len);
}

typedef struct kvf_resp_def {
    const char *name;
    int min, max; /* argc bounds, command name included (max 0 = any) */
    void (*fn)(kvf_resp_cmd_t *m);
} kvf_resp_def_t;

static void kvf_resp_cmd_exists(kvf_resp_cmd_t *m)
{
    kvf_resp_cmd_keys(m, 0);
}

static void kvf_resp_cmd_del(kvf_resp_cmd_t *m)
{
    kvf_resp_cmd_keys(m, 1);
}

static void kvf_resp_cmd_quit(kvf_resp_cmd_t *m)
{
    kvf_resp_outs(m->c, "+OK\r\n");
    m->c->closing = 1;
}

static void kvf_resp_cmd_ok(kvf_resp_cmd_t *m)
{
    kvf_resp_outs(m->c, "+OK\r\n");
}

/* COMMAND: an empty list (clients only probe it). */
static void kvf_resp_cmd_empty(kvf_resp_cmd_t *m)
{
    kvf_resp_outs(m->c, "*0\r\n");
}

/* CONFIG GET name: the name with an empty value (no persistence). */
static void kvf_resp_cmd_config(kvf_resp_cmd_t *m)
{
    if (m->argc != 3 || !kvf_resp_is(m->argv[1], "GET") ||
        m->argv[2]->len > 64) {
        kvf_resp_outs(m->c, "*0\r\n");
        return;
    }
    kvf_resp_outs(m->c, "*2\r\n");
    kvf_resp_bulk(m->c, m->argv[2]->p, m->argv[2]->len);
    kvf_resp_outs(m->c, kvf_resp_is(m->argv[2], "appendonly") ? "$2\r\nno\r\n"
                                                              : "$0\r\n\r\n");
}

static const kvf_resp_def_t kvf_resp_defs[] = {
    {"GET", 2, 2, kvf_resp_cmd_get},
    {"SET", 3, 0, kvf_resp_cmd_set},
    {"EXISTS", 2, 0, kvf_resp_cmd_exists},
    {"DEL", 2, 0, kvf_resp_cmd_del},
    {"UNLINK", 2, 0, kvf_resp_cmd_del},
    {"PING", 1, 2, kvf_resp_cmd_ping},
    {"ECHO", 2, 2, kvf_resp_cmd_echo},
    {"AUTH", 2, 3, kvf_resp_cmd_auth},
    {"QUIT", 1, 0, kvf_resp_cmd_quit},
    {"HELLO", 1, 0, kvf_resp_cmd_hello},
    {"COMMAND", 1, 0, kvf_resp_cmd_empty},
    {"CONFIG", 2, 0, kvf_resp_cmd_config},
    {"CLIENT", 2, 0, kvf_resp_cmd_ok},
    {"SELECT", 2, 2, kvf_resp_cmd_ok},
    {NULL, 0, 0, NULL},
};

/* Runs one parsed request; 0 when it is not a command (protocol error). */
static int kvf_resp_dispatch(kvf_resp_conn_t *c, void *obj)
{
    kvf_ro_arr_t *a = obj;
    kvf_resp_cmd_t m = {c, c->lp->srv, 0, NULL};
    const kvf_resp_def_t *d;
    int i;

    if (a->kind != KVF_RO_ARR) {
        return 0;
    }
    for (i = 0; i < a->argc; i++) {
        if (a->argv[i] == NULL || *(int *)a->argv[i] != KVF_RO_STR) {
            return 0;
        }
    }
    if (a->argc == 0) {
        return 1; /* an empty request is ignored, as Redis does */
    }
    m.argc = a->argc;
    m.argv = (kvf_ro_str_t **)a->argv;
    if (m.s->pwlen > 0 && !c->authed && !kvf_resp_open_cmd(m.argv[0])) {
        kvf_resp_outs(c, "-NOAUTH Authentication required.\r\n");
        return 1;
    }
    for (d = kvf_resp_defs; d->name != NULL; d++) {
        if (kvf_resp_is(m.argv[0], d->name)) {
            break;
        }
    }
    if (d->name == NULL) {
        char name[64];
        size_t n = m.argv[0]->len < 63 ? m.argv[0]->len : 63;

        memcpy(name, m.argv[0]->p != NULL ? m.argv[0]->p : "", n);
        name[n] = 0;
        kvf_resp_err(c, "-ERR unknown command '%s'", name);
    } else if (m.argc < d->min || (d->max > 0 && m.argc > d->max)) {
        kvf_resp_err(c, "-ERR wrong number of arguments for '%s' command",
                     d->name);
    } else {
        d->fn(&m);
    }
    return 1;
}

/* ---- store batches ------------------------------------------------- */

/* The GETs and SETs queued while a loop served its ready connections run
 * as store batches: one master round trip per phase for all of them
 * instead of one or two per command. Commands of one key are served
 * once: the GETs share one read; of the SETs, the last queued is stored
 * and the others answer with its outcome (they are concurrent, so the
 * store's state is one Redis could reach by running them in some order
 * with the last one last). */

static void kvf_resp_oval_free(struct kvf_resp *s, kvf_ro_str_t *v)
{
    if (v != NULL) {
        if (v->pooled) {
            kvf_resp_pool_free(&s->pool, v->p, v->len);
        }
        free(v);
    }
}

/* Distinct keys of the ops of one kind: u[k] is the op acting for key k
 * (for SETs the last queued), owner[i] the key of op i. Returns how many
 * keys (0 when no memory: every op then fails). */
static size_t kvf_resp_distinct(kvf_resp_conn_t **ops, size_t n, int kind,
                                kvf_resp_conn_t **u, size_t *owner)
{
    size_t tsize = 16, nu = 0, i, j, k;
    uint32_t *tab;
    int found;

    while (tsize < 2 * n) {
        tsize *= 2;
    }
    if ((tab = calloc(tsize, sizeof(*tab))) == NULL) {
        return 0;
    }
    for (i = 0; i < n; i++) {
        if (ops[i] == NULL || ops[i]->op != kind) {
            continue;
        }
        for (j = ops[i]->ohash & (tsize - 1); tab[j] != 0;
             j = (j + 1) & (tsize - 1)) {
            k = tab[j] - 1;
            if (u[k]->ohash == ops[i]->ohash &&
                strcmp(u[k]->okey, ops[i]->okey) == 0) {
                break;
            }
        }
        found = tab[j] != 0;
        if (!found) {
            k = nu++;
            tab[j] = (uint32_t)(k + 1);
        }
        owner[i] = k;
        if (!found || kind == KVF_RESP_OP_SET) {
            u[k] = ops[i];
        }
    }
    free(tab);
    return nu;
}

/* Locks (or unlocks) the SET stripes of the keys, in stripe order. */
static void kvf_resp_stripes(struct kvf_resp *s, uint64_t mask, int lock)
{
    unsigned i;

    for (i = 0; i < KVF_RESP_SET_STRIPES; i++) {
        if (mask & (1ull << i)) {
            if (lock) {
                pthread_mutex_lock(&s->set_mu[i]);
            } else {
                pthread_mutex_unlock(&s->set_mu[i]);
            }
        }
    }
}

/* One key the batch could not store at once (stored by another client
 * meanwhile, or its put raced one): remove and put again, a few times. */
static kvf_status_t kvf_resp_put_again(struct kvf_resp *s, const char *key,
                                       const void *buf, size_t len,
                                       kvf_status_t st)
{
    int i;

    for (i = 0; i < 4 && (st == KVF_ERR_EXISTS || st == KVF_ERR_BUSY); i++) {
        if (st == KVF_ERR_BUSY) {
            usleep(200u << i);
        }
        st = kvf_store_remove(s->st, key);
        if (st == KVF_OK || st == KVF_ERR_NO_KEY) {
            st = kvf_store_put(s->st, key, buf, len, NULL);
        }
    }
    return st;
}

typedef struct kvf_resp_putset {
    size_t n;
    const char **keys;
    const void **bufs;
    size_t *lens;
    kvf_status_t *st;
    uint64_t *hash;
} kvf_resp_putset_t;

/* Stores n keys (their stripes locked): the ones this door stored lately
 * are removed first, in one batch (SET overwrites); then one put batch;
 * keys refused as existing or busy go one by one. */
static void kvf_resp_put_keys(struct kvf_resp *s, kvf_resp_putset_t *p)
{
    size_t i, nrm = 0;

    for (i = 0; i < p->n; i++) {
        if (s->set_recent[p->hash[i] % KVF_RESP_RECENT] == p->hash[i]) {
            p->keys[p->n + nrm++] = p->keys[i]; /* scratch past n */
        }
    }
    if (nrm > 0) {
        (void)kvf_store_remove_batch(s->st, nrm, p->keys + p->n, p->st + p->n);
    }
    for (i = 0; i < p->n; i++) {
        p->st[i] = KVF_ERR_IO;
    }
    if (p->n == 1) { /* one key: the client's reservation path */
        p->st[0] =
            kvf_store_put(s->st, p->keys[0], p->bufs[0], p->lens[0], NULL);
    } else {
        (void)kvf_store_put_batch(s->st, p->n, p->keys, p->bufs, p->lens, NULL,
                                  p->st);
    }
    for (i = 0; i < p->n; i++) {
        p->st[i] =
            kvf_resp_put_again(s, p->keys[i], p->bufs[i], p->lens[i], p->st[i]);
        s->set_recent[p->hash[i] % KVF_RESP_RECENT] =
            (p->st[i] == KVF_OK) ? p->hash[i] : 0;
    }
}

/* Stores the values of u[0..n) (one SET per distinct key); a short value
 * (parsed outside the pool) is copied into the pool first, since the
 * store moves bytes from registered memory. Sets each op's ost. */
static void kvf_resp_set_batch(struct kvf_resp *s, kvf_resp_conn_t **u,
                               size_t n)
{
    kvf_resp_putset_t p = {0};
    uint64_t stripes = 0;
    size_t i, m = 0;
    char **copy;
    void *mem;

    mem = calloc(n, 2 * sizeof(char *) + sizeof(void *) + sizeof(size_t) +
                        2 * sizeof(kvf_status_t) + sizeof(uint64_t) +
                        sizeof(char *));
    if (mem == NULL) {
        for (i = 0; i < n; i++) {
            u[i]->ost = KVF_ERR_NO_MEMORY;
        }
        return;
    }
    p.keys = mem;
    p.bufs = (const void **)(p.keys + 2 * n);
    copy = (char **)(p.bufs + n);
    p.lens = (size_t *)(copy + n);
    p.hash = (uint64_t *)(p.lens + n);
    p.st = (kvf_status_t *)(p.hash + n);
    for (i = 0; i < n; i++) {
        kvf_ro_str_t *v = u[i]->oval;

        copy[i] = NULL;
        u[i]->ost = KVF_OK;
        if (!v->pooled) {
            copy[i] = kvf_resp_pool_alloc(&s->pool, v->len);
            if (copy[i] == NULL) {
                u[i]->ost = KVF_ERR_NO_RESOURCE;
                continue;
            }
            memcpy(copy[i], v->p, v->len);
        }
        p.keys[m] = u[i]->okey;
        p.bufs[m] = v->pooled ? v->p : copy[i];
        p.lens[m] = v->len;
        p.hash[m] = u[i]->ohash;
        stripes |= 1ull << (u[i]->ohash % KVF_RESP_SET_STRIPES);
        m++;
    }
    p.n = m;
    if (m > 0) {
        kvf_resp_stripes(s, stripes, 1);
        kvf_resp_put_keys(s, &p);
        kvf_resp_stripes(s, stripes, 0);
    }
    for (i = 0, m = 0; i < n; i++) {
        if (u[i]->ost == KVF_OK) {
            u[i]->ost = p.st[m++];
        }
        kvf_resp_pool_free(&s->pool, copy[i], u[i]->oval->len);
    }
    free(mem);
}

/* Reads u[0..n) (one GET per distinct key) into fresh values: one get
 * batch into buffers of the last size read; a key that does not fit
 * (or a size never read yet) is read alone by kvf_resp_fetch. */
static void kvf_resp_get_batch(struct kvf_resp *s, kvf_resp_conn_t **u,
                               size_t n)
{
    size_t cap = atomic_load(&s->get_hint), i, m = 0;
    const char **keys = NULL;
    void **bufs = NULL;
    size_t *caps = NULL, *lens = NULL;
    kvf_status_t *st = NULL;

    if (n > 1 && cap > 0 && cap <= KVF_RESP_HINT_MAX) {
        keys = calloc(n, sizeof(*keys));
        bufs = calloc(n, sizeof(*bufs));
        caps = calloc(n, sizeof(*caps));
        lens = calloc(n, sizeof(*lens));
        st = calloc(n, sizeof(*st));
    }
    for (i = 0; st != NULL && i < n; i++) {
        u[i]->ost = KVF_ERR_NO_RESOURCE;
        if ((u[i]->oget = kvf_resp_val_new(s, cap)) != NULL) {
            keys[m] = u[i]->okey;
            bufs[m] = u[i]->oget->p;
            caps[m] = cap;
            st[m++] = KVF_ERR_IO;
        }
    }
    if (m > 0) {
        (void)kvf_store_get_batch(s->st, m, keys, bufs, caps, lens, 0, st);
    }
    for (i = 0, m = 0; st != NULL && i < n; i++) {
        if (u[i]->oget != NULL) {
            u[i]->ost = st[m];
            u[i]->oget->len = lens[m++];
        }
        if (u[i]->ost != KVF_OK) {
            kvf_resp_val_unref(s, u[i]->oget);
            u[i]->oget = NULL;
        } else {
            atomic_store(&s->get_hint, u[i]->oget->len);
        }
    }
    for (i = 0; i < n; i++) {
        if (st == NULL || u[i]->ost == KVF_ERR_NO_RESOURCE) {
            u[i]->ost = kvf_resp_fetch(s, u[i]->okey, &u[i]->oget);
        }
    }
    free(keys);
    free(bufs);
    free(caps);
    free(lens);
    free(st);
}

/* Runs one kind of the queued ops and gives each op its outcome. */
static void kvf_resp_batch_kind(struct kvf_resp *s, kvf_resp_conn_t **ops,
                                size_t n, int kind)
{
    kvf_resp_conn_t **u = calloc(n, sizeof(*u));
    size_t *owner = calloc(n, sizeof(*owner)), nu = 0, i;

    if (u != NULL && owner != NULL) {
        nu = kvf_resp_distinct(ops, n, kind, u, owner);
    }
    for (i = 0; i < nu; i += KVF_STORE_BATCH_MAX) { /* a store batch's cap */
        size_t k = nu - i < KVF_STORE_BATCH_MAX ? nu - i : KVF_STORE_BATCH_MAX;

        if (kind == KVF_RESP_OP_SET) {
            kvf_resp_set_batch(s, u + i, k);
        } else {
            kvf_resp_get_batch(s, u + i, k);
        }
    }
    for (i = 0; i < n; i++) {
        if (ops[i] == NULL || ops[i]->op != kind) {
            continue;
        }
        if (nu == 0) {
            ops[i]->ost = KVF_ERR_NO_MEMORY;
        } else if (ops[i] != u[owner[i]]) {
            ops[i]->ost = u[owner[i]]->ost;
            ops[i]->oget = u[owner[i]]->oget;
            if (ops[i]->oget != NULL) {
                ops[i]->oget->refs++;
            }
        }
    }
    free(u);
    free(owner);
}

static void kvf_resp_serve(kvf_resp_conn_t *c, uint32_t ev);

/* Runs the loop's queued GETs and SETs, answers them, and serves their
 * connections again (what they had pipelined may queue the next batch). */
static void kvf_resp_batch_run(kvf_resp_loop_t *lp)
{
    struct kvf_resp *s = lp->srv;
    kvf_resp_conn_t **ops = lp->q, *c;
    size_t n = lp->nq, i;

    lp->q = NULL;
    lp->nq = lp->qcap = 0;
    kvf_resp_batch_kind(s, ops, n, KVF_RESP_OP_SET);
    kvf_resp_batch_kind(s, ops, n, KVF_RESP_OP_GET);
    kvf_resp_cur = NULL;
    for (i = 0; i < n; i++) {
        if ((c = ops[i]) == NULL) {
            continue;
        }
        if (c->op == KVF_RESP_OP_SET) {
            kvf_resp_set_reply(c);
        } else {
            kvf_resp_get_reply(c);
        }
        kvf_resp_oval_free(s, c->oval);
        c->oval = NULL;
        c->op = KVF_RESP_OP_NONE;
    }
    for (i = 0; i < n; i++) {
        if (ops[i] != NULL) {
            kvf_resp_serve(ops[i], 0);
        }
    }
    free(ops);
}

/* ---- connections --------------------------------------------------- */

static void kvf_resp_close(kvf_resp_conn_t *c)
{
    kvf_resp_loop_t *lp = c->lp;

    kvf_resp_cur = c;
    redisReaderFree(c->rd);
    kvf_resp_cur = NULL;
    kvf_resp_val_unref(lp->srv, c->big);
    if (c->op != KVF_RESP_OP_NONE) { /* leave the batch */
        for (size_t i = 0; i < lp->nq; i++) {
            lp->q[i] = (lp->q[i] == c) ? NULL : lp->q[i];
        }
        kvf_resp_oval_free(lp->srv, c->oval);
        kvf_resp_val_unref(lp->srv, c->oget);
    }
    if (c->dbuf != NULL) {
        kvf_resp_pool_free(&lp->srv->pool, c->dbuf, c->dlen);
    }
    epoll_ctl(lp->ep, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    if (c->prev != NULL) {
        c->prev->next = c->next;
    } else {
        lp->conns = c->next;
    }
    if (c->next != NULL) {
        c->next->prev = c->prev;
    }
    atomic_fetch_sub(&lp->srv->nclients, 1);
    free(c->out);
    free(c);
}

/* The direct bulk is whole: the reader sees its length line as "0". */
static void kvf_resp_direct_done(kvf_resp_conn_t *c)
{
    redisReader *rd = c->rd;
    size_t rest = rd->len - rd->pos;
    char tail[2];

    /* "0\r\n" goes before the bytes that followed the bulk (at most 1) */
    memcpy(tail, rd->buf + rd->pos, rest < 2 ? rest : 2);
    rd->len = rd->pos;
    sdssetlen(rd->buf, rd->len);
    c->dready = 1;
    redisReaderFeed(rd, "0\r\n", 3);
    if (rest > 0) {
        redisReaderFeed(rd, tail, rest < 2 ? rest : 2);
    }
}

/* Bulk length at the reader's cursor when it waits inside a bulk, else -1;
 * -2 when that length is not a number. */
static long long kvf_resp_pending_bulk(const redisReader *rd)
{
    const char *p = rd->buf + rd->pos;
    size_t n = rd->len - rd->pos, i;
    long long v = 0;

    if (rd->ridx < 0 || KVF_RESP_TASK_TYPE(rd) != REDIS_REPLY_STRING) {
        return -1;
    }
    for (i = 0; i < n && p[i] != '\r'; i++) {
        if (p[i] < '0' || p[i] > '9' || i >= 18) {
            return (i == 0 && p[i] == '-') ? -1 : -2;
        }
        v = v * 10 + (p[i] - '0');
    }
    return v;
}

/* Checks what the reader holds unparsed; 0 = the connection must close. */
static int kvf_resp_check_pending(kvf_resp_conn_t *c)
{
    const redisReader *rd = c->rd;
    long long bulk = kvf_resp_pending_bulk(rd);
    size_t held = rd->len - rd->pos;

    if (bulk == -2 || (bulk >= 0 && (uint64_t)bulk > c->lp->srv->p.max_value)) {
        kvf_resp_outs(c, "-ERR Protocol error: invalid bulk length\r\n");
        return 0;
    }
    if (held > KVF_RESP_LINE_MAX &&
        (bulk < 0 || held > (size_t)bulk + 2 * KVF_RESP_LINE_MAX)) {
        kvf_resp_outs(c, "-ERR Protocol error: too big request line\r\n");
        return 0;
    }
    return 1;
}

/* Takes a long bulk the reader waits for out of its hands: its bytes so far
 * move into a pool buffer and the rest is received there directly (no
 * copies through the reader's growing buffer); the reader is left at the
 * bulk's length, to be told "0" once the bytes are in. */
static int kvf_resp_direct_start(kvf_resp_conn_t *c)
{
    redisReader *rd = c->rd;
    long long bulk = kvf_resp_pending_bulk(rd);
    const char *eol;
    size_t have, take;

    if (c->dbuf != NULL || c->dready || bulk < (long long)KVF_RESP_DIRECT_MIN) {
        return 0;
    }
    eol = memchr(rd->buf + rd->pos, '\n', rd->len - rd->pos);
    if (eol == NULL) {
        return 0; /* the length line is not whole yet */
    }
    c->dbuf = kvf_resp_pool_alloc(&c->lp->srv->pool, (size_t)bulk);
    if (c->dbuf == NULL) {
        return 0; /* the reader takes it, and SET answers "pool full" */
    }
    c->dlen = (size_t)bulk;
    have = rd->len - (size_t)(eol + 1 - rd->buf);
    take = have < c->dlen ? have : c->dlen;
    memcpy(c->dbuf, eol + 1, take);
    c->dgot = take;
    /* what followed the bytes (part of "\r\n") stays for the reader */
    memmove(rd->buf + rd->pos, eol + 1 + take, have - take);
    rd->len = rd->pos + (have - take);
    sdssetlen(rd->buf, rd->len);
    rd->buf[rd->len] = 0;
    if (c->dgot < c->dlen) {
        return 0;
    }
    kvf_resp_direct_done(c);
    return 1;
}

/* Skips empty lines between requests, as Redis does (redis-cli --pipe
 * sends one before its closing ECHO). */
static void kvf_resp_skip_blank(redisReader *rd)
{
    while (rd->ridx == -1 && rd->pos < rd->len &&
           (rd->buf[rd->pos] == '\r' || rd->buf[rd->pos] == '\n')) {
        rd->pos++;
    }
}

/* Parses and runs requests until input runs out or output backs up. */
static void kvf_resp_process(kvf_resp_conn_t *c)
{
    void *obj = NULL;
    int ok;

    kvf_resp_cur = c;
    while (!kvf_resp_blocked(c)) {
        kvf_resp_skip_blank(c->rd);
        if (redisReaderGetReply(c->rd, &obj) != REDIS_OK) {
            kvf_resp_err(c, "-ERR protocol error: %s", c->rd->errstr);
            c->closing = 1;
            break;
        }
        if (obj == NULL) {
            c->closing = !kvf_resp_check_pending(c);
            if (!c->closing && kvf_resp_direct_start(c)) {
                continue;
            }
            break;
        }
        ok = kvf_resp_dispatch(c, obj);
        kvf_ro_free(obj);
        if (!ok) {
            kvf_resp_outs(c, "-ERR protocol error: expected a command "
                             "(an array of bulk strings)\r\n");
            c->closing = 1;
        }
    }
    kvf_resp_cur = NULL;
}

/* Sends what it can; -1 on a broken connection. */
static int kvf_resp_flush(kvf_resp_conn_t *c)
{
    static const char crlf[] = "\r\n";
    struct msghdr msg = {0};
    struct iovec iov[3];
    ssize_t n;
    size_t k, out, blen = 0, tail;

    for (;;) {
        out = c->out_len - c->out_off;
        k = 0;
        if (out > 0) {
            iov[k++] = (struct iovec){c->out + c->out_off, out};
        }
        if (c->big != NULL) { /* the value, then its "\r\n": one send */
            blen = c->big->len;
            if (c->big_off < blen) {
                iov[k++] =
                    (struct iovec){c->big->p + c->big_off, blen - c->big_off};
            }
            tail = c->big_off > blen ? c->big_off - blen : 0;
            iov[k++] = (struct iovec){(char *)crlf + tail, 2 - tail};
        }
        if (k == 0) {
            c->out_len = c->out_off = 0;
            return 0;
        }
        msg.msg_iov = iov;
        msg.msg_iovlen = k;
        n = sendmsg(c->fd, &msg, MSG_NOSIGNAL);
        if (n < 0) {
            return (errno == EAGAIN || errno == EINTR) ? 0 : -1;
        }
        k = (size_t)n < out ? (size_t)n : out;
        c->out_off += k;
        n -= (ssize_t)k;
        if (c->big != NULL) {
            c->big_off += (size_t)n;
            if (c->big_off == blen + 2) {
                kvf_resp_val_unref(c->lp->srv, c->big);
                c->big = NULL;
            }
        }
        if (c->out_off == c->out_len && c->big == NULL) {
            c->out_len = c->out_off = 0;
            return 0;
        }
    }
}

/* Reads once (unless blocked) and feeds the reader; -1 = EOF or error. */
static int kvf_resp_read(kvf_resp_conn_t *c)
{
    ssize_t n;

    if (kvf_resp_blocked(c)) {
        return 0;
    }
    if (c->dbuf != NULL && !c->dready) {
        n = recv(c->fd, c->dbuf + c->dgot, c->dlen - c->dgot, 0);
        if (n > 0) {
            c->last_ms = kvf_time_ms();
            c->dgot += (size_t)n;
            if (c->dgot == c->dlen) {
                kvf_resp_direct_done(c);
            }
            return 0;
        }
        return (n < 0 && (errno == EAGAIN || errno == EINTR)) ? 0 : -1;
    }
    n = recv(c->fd, c->lp->rbuf, KVF_RESP_RECV, 0);
    if (n == 0) {
        return -1;
    }
    if (n < 0) {
        return (errno == EAGAIN || errno == EINTR) ? 0 : -1;
    }
    c->last_ms = kvf_time_ms();
    if (redisReaderFeed(c->rd, c->lp->rbuf, (size_t)n) != REDIS_OK) {
        return -1;
    }
    return 0;
}

/* Runs a connection after an event; closes it when done with it. */
/* Parses, runs and flushes until the connection waits; 0 = closed. */
static int kvf_resp_run(kvf_resp_conn_t *c)
{
    int was_blocked;

    for (;;) {
        kvf_resp_process(c);
        was_blocked = kvf_resp_blocked(c);
        if (kvf_resp_flush(c) < 0) {
            kvf_resp_close(c);
            return 0;
        }
        /* output drained: parse what the reader still holds */
        if (!was_blocked || kvf_resp_blocked(c)) {
            return 1;
        }
    }
}

/* Runs a connection after an event (0: after its batch); closes it when
 * done with it. */
static void kvf_resp_serve(kvf_resp_conn_t *c, uint32_t ev)
{
    struct epoll_event e;
    uint32_t want;

    if ((ev & (EPOLLERR | EPOLLHUP)) && !(ev & EPOLLIN)) {
        kvf_resp_close(c);
        return;
    }
    if ((ev & EPOLLIN) && kvf_resp_read(c) < 0) {
        kvf_resp_close(c);
        return;
    }
    if (!kvf_resp_run(c)) {
        return;
    }
    /* a long bulk just began: the rest of it has likely arrived too */
    if ((ev & EPOLLIN) && c->dbuf != NULL && !c->dready) {
        if (kvf_resp_read(c) < 0) {
            kvf_resp_close(c);
            return;
        }
        if (!kvf_resp_run(c)) {
            return;
        }
    }
    if (c->op != KVF_RESP_OP_NONE) {
        return; /* the loop's batch answers it, then serves it again */
    }
    if (c->closing && c->out_len == c->out_off && c->big == NULL) {
        kvf_resp_close(c);
        return;
    }
    want = (kvf_resp_blocked(c) ? 0 : EPOLLIN) |
           (c->out_len > c->out_off || c->big != NULL ? EPOLLOUT : 0);
    if (want != c->events) {
        e.events = want;
        e.data.ptr = c;
        epoll_ctl(c->lp->ep, EPOLL_CTL_MOD, c->fd, &e);
        c->events = want;
    }
}

static void kvf_resp_accept(kvf_resp_loop_t *lp)
{
    static const char full[] = "-ERR max number of clients reached\r\n";
    struct epoll_event e;
    kvf_resp_conn_t *c;
    int fd, one = 1;

    fd = accept4(lp->srv->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
        return;
    }
    if (atomic_fetch_add(&lp->srv->nclients, 1) >= lp->srv->p.max_clients) {
        atomic_fetch_sub(&lp->srv->nclients, 1);
        (void)!write(fd, full, sizeof(full) - 1);
        close(fd);
        return;
    }
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    c = calloc(1, sizeof(*c));
    if (c != NULL) {
        c->out = malloc(KVF_RESP_OUT_CAP);
        c->rd = redisReaderCreateWithFunctions(&kvf_ro_fns);
    }
    if (c == NULL || c->out == NULL || c->rd == NULL) {
        atomic_fetch_sub(&lp->srv->nclients, 1);
        if (c != NULL) {
            free(c->out);
            if (c->rd != NULL) {
                redisReaderFree(c->rd);
            }
        }
        free(c);
        close(fd);
        return;
    }
    c->fd = fd;
    c->lp = lp;
    c->last_ms = kvf_time_ms();
    c->events = EPOLLIN;
    c->next = lp->conns;
    if (lp->conns != NULL) {
        lp->conns->prev = c;
    }
    lp->conns = c;
    e.events = EPOLLIN;
    e.data.ptr = c;
    epoll_ctl(lp->ep, EPOLL_CTL_ADD, fd, &e);
}

static void kvf_resp_reap_idle(kvf_resp_loop_t *lp)
{
    uint64_t now = kvf_time_ms(), idle = lp->srv->p.idle_ms;
    kvf_resp_conn_t *c = lp->conns, *next;

    if (idle == 0) {
        return;
    }
    for (; c != NULL; c = next) {
        next = c->next;
        if (now - c->last_ms > idle) {
            kvf_resp_close(c);
        }
    }
}

/* Serves the connections epoll_wait found ready (waiting wait_ms). */
static void kvf_resp_poll(kvf_resp_loop_t *lp, int wait_ms)
{
    struct epoll_event ev[64];
    int n, i;

    n = epoll_wait(lp->ep, ev, 64, wait_ms);
    for (i = 0; i < n; i++) {
        if (ev[i].data.ptr == &lp->srv->lfd) {
            kvf_resp_accept(lp);
        } else if (ev[i].data.ptr != &lp->srv->stopfd) {
            kvf_resp_serve(ev[i].data.ptr, ev[i].events);
        }
    }
}

static void *kvf_resp_loop_main(void *arg)
{
    kvf_resp_loop_t *lp = arg;
    int wait_ms;

    wait_ms = (lp->srv->p.idle_ms > 0 && lp->srv->p.idle_ms < 1000)
                  ? (int)lp->srv->p.idle_ms
                  : 1000;
    while (!atomic_load(&lp->srv->stop)) {
        kvf_resp_poll(lp, wait_ms);
        while (lp->nq > 0) {
            /* commands that arrived meanwhile join the batch */
            kvf_resp_poll(lp, 0);
            kvf_resp_batch_run(lp);
        }
        kvf_resp_reap_idle(lp);
    }
    while (lp->conns != NULL) {
        kvf_resp_close(lp->conns);
    }
    free(lp->q);
    return NULL;
}

/* ---- start and stop ------------------------------------------------ */

kvf_status_t kvf_server_resp_defaults(kvf_server_resp_params_t *p)
{
    const kvf_config_table_t *t = &kvf_resp_config;
    uint64_t threads, clients, tmo;
    kvf_status_t st;
    const char *v;

    if (p == NULL) {
        return KVF_ERR_INVALID_PARAM;
    }
    memset(p, 0, sizeof(*p));
    p->listen = kvf_config_str(t, "resp_listen");
    p->master = kvf_config_get("master");
    p->password_file = kvf_config_str(t, "resp_password_file");
    if ((st = kvf_parse_size(kvf_config_str(t, "resp_max_value"),
                             &p->max_value)) != KVF_OK ||
        (st = kvf_parse_size(kvf_config_str(t, "resp_pool"), &p->pool)) !=
            KVF_OK ||
        (st = kvf_config_u64(t, "resp_max_clients", &clients)) != KVF_OK ||
        (st = kvf_config_u64(t, "resp_idle_ms", &p->idle_ms)) != KVF_OK ||
        (st = kvf_config_u64(t, "resp_threads", &threads)) != KVF_OK) {
        return st;
    }
    v = kvf_config_get("store_timeout_ms");
    tmo = v != NULL ? strtoull(v, NULL, 10) : 5000;
    p->max_clients = (unsigned)clients;
    p->threads = (unsigned)threads;
    p->timeout_ms = (unsigned)tmo;
    return KVF_OK;
}

kvf_status_t kvf_server_resp_password(const char *listen, char *out,
                                      size_t outlen)
{
    char host[KVF_HOST_MAX];
    uint16_t port;
    kvf_status_t st;

    if (listen == NULL || out == NULL) {
        return KVF_ERR_INVALID_PARAM;
    }
    st = kvf_sock_parse_addr(listen, host, sizeof(host), &port);
    return st != KVF_OK
               ? st
               : kvf_auth_token(host, KVF_RESP_TOKEN_LABEL, out, outlen);
}

/* Reads the password of a 0600 (or stricter) file. */
static kvf_status_t kvf_resp_load_password_file(struct kvf_resp *s,
                                                const char *path)
{
    struct stat sb;
    ssize_t n;
    int fd;

    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0 || fstat(fd, &sb) != 0 || (sb.st_mode & 077) != 0) {
        kvf_error("resp: password file %s: %s", path,
                  fd < 0 ? strerror(errno)
                         : "must not be readable by others "
                           "(chmod 600)");
        if (fd >= 0) {
            close(fd);
        }
        return KVF_ERR_INVALID_PARAM;
    }
    n = read(fd, s->password, sizeof(s->password) - 1);
    close(fd);
    if (n < 0) {
        return KVF_ERR_INVALID_PARAM;
    }
    while (n > 0 &&
           (s->password[n - 1] == '\n' || s->password[n - 1] == '\r')) {
        n--;
    }
    s->password[n] = 0;
    s->pwlen = (size_t)n;
    return n > 0 ? KVF_OK : KVF_ERR_INVALID_PARAM;
}

/* The password AUTH must give: the password file's when one is set, else
 * the one derived from the cluster secret (none when authentication is
 * off: insecure=1 without a secret file). */
static kvf_status_t kvf_resp_load_password(struct kvf_resp *s)
{
    const char *path = s->p.password_file;
    kvf_status_t st;

    if (path != NULL && path[0] != 0) {
        return kvf_resp_load_password_file(s, path);
    }
    st =
        kvf_server_resp_password(s->p.listen, s->password, sizeof(s->password));
    s->pwlen = st == KVF_OK ? strlen(s->password) : 0;
    if (st == KVF_OK && s->pwlen == 0) {
        kvf_warn("resp: %s serves without AUTH (insecure=1, no secret_file)",
                 s->p.listen);
    }
    return st;
}

static kvf_status_t kvf_resp_listen(struct kvf_resp *s)
{
    char host[KVF_HOST_MAX];
    uint16_t port;
    kvf_status_t st;
    int fl;

    st = kvf_sock_parse_addr(s->p.listen, host, sizeof(host), &port);
    if (st == KVF_OK) {
        st = kvf_auth_check_bind(host);
    }
    if (st == KVF_OK) {
        st = kvf_sock_listen(host, port, 511, &s->lfd, &port);
    }
    if (st != KVF_OK) {
        return st;
    }
    fl = fcntl(s->lfd, F_GETFL);
    fcntl(s->lfd, F_SETFL, fl | O_NONBLOCK);
    snprintf(s->addr, sizeof(s->addr), "%s:%u", host, (unsigned)port);
    return KVF_OK;
}

static kvf_status_t kvf_resp_start_loops(struct kvf_resp *s)
{
    struct epoll_event e;
    unsigned i;

    for (i = 0; i < s->nloops; i++) {
        kvf_resp_loop_t *lp = &s->loops[i];

        lp->srv = s;
        lp->rbuf = malloc(KVF_RESP_RECV);
        lp->ep = epoll_create1(EPOLL_CLOEXEC);
        if (lp->rbuf == NULL || lp->ep < 0) {
            return KVF_ERR_NO_MEMORY;
        }
        e.events = EPOLLIN | EPOLLEXCLUSIVE;
        e.data.ptr = &s->lfd;
        epoll_ctl(lp->ep, EPOLL_CTL_ADD, s->lfd, &e);
        e.events = EPOLLIN;
        e.data.ptr = &s->stopfd;
        epoll_ctl(lp->ep, EPOLL_CTL_ADD, s->stopfd, &e);
        if (pthread_create(&lp->thr, NULL, kvf_resp_loop_main, lp) != 0) {
            lp->thr = 0;
            return KVF_ERR_NO_MEMORY;
        }
    }
    return KVF_OK;
}

static kvf_status_t kvf_resp_open(struct kvf_resp *s)
{
    kvf_store_params_t sp = {.field_mask = KVF_STORE_PARAM_MASTER |
                                           KVF_STORE_PARAM_TIMEOUT,
                             .master = s->p.master,
                             .timeout_ms = s->p.timeout_ms};
    kvf_status_t st;

    if ((st = kvf_resp_load_password(s)) != KVF_OK ||
        (st = kvf_store_connect(&sp, &s->st)) != KVF_OK) {
        return st;
    }
    if ((st = kvf_resp_pool_init(s)) != KVF_OK ||
        (st = kvf_resp_listen(s)) != KVF_OK) {
        return st;
    }
    if (s->p.max_value > s->pool.len) {
        s->p.max_value = s->pool.len; /* a value must fit the pool */
    }
    s->stopfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (s->stopfd < 0) {
        return KVF_ERR_NO_MEMORY;
    }
    return kvf_resp_start_loops(s);
}

kvf_status_t kvf_server_resp_start(const kvf_server_resp_params_t *params,
                                   kvf_resp_h *resp_p)
{
    struct kvf_resp *s;
    kvf_status_t st;

    if (params == NULL || resp_p == NULL || params->listen == NULL ||
        params->master == NULL || params->pool == 0) {
        return KVF_ERR_INVALID_PARAM;
    }
    s = calloc(1, sizeof(*s));
    if (s == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    s->p = *params;
    s->lfd = s->stopfd = -1;
    for (int i = 0; i < KVF_RESP_SET_STRIPES; i++) {
        pthread_mutex_init(&s->set_mu[i], NULL);
    }
    s->nloops = params->threads == 0 ? 1 : params->threads;
    if (s->nloops > KVF_RESP_LOOPS_MAX) {
        s->nloops = KVF_RESP_LOOPS_MAX;
    }
    if (s->p.max_clients == 0) {
        s->p.max_clients = 1;
    }
    st = kvf_resp_open(s);
    if (st != KVF_OK) {
        kvf_server_resp_stop(s);
        return st;
    }
    *resp_p = s;
    return KVF_OK;
}

void kvf_server_resp_stop(kvf_resp_h s)
{
    uint64_t one = 1;
    unsigned i;

    if (s == NULL) {
        return;
    }
    atomic_store(&s->stop, 1);
    if (s->stopfd >= 0) {
        (void)!write(s->stopfd, &one, sizeof(one));
    }
    for (i = 0; i < s->nloops; i++) {
        if (s->loops[i].thr != 0) {
            pthread_join(s->loops[i].thr, NULL);
        }
        if (s->loops[i].ep > 0) {
            close(s->loops[i].ep);
        }
        free(s->loops[i].rbuf);
    }
    if (s->stopfd >= 0) {
        close(s->stopfd);
    }
    if (s->lfd >= 0) {
        close(s->lfd);
    }
    if (s->st != NULL) {
        kvf_resp_pool_fini(s);
        kvf_store_disconnect(s->st);
    }
    explicit_bzero(s->password, sizeof(s->password));
    for (i = 0; i < KVF_RESP_SET_STRIPES; i++) {
        pthread_mutex_destroy(&s->set_mu[i]);
    }
    free(s);
}

const char *kvf_server_resp_address(kvf_resp_h s)
{
    return s->addr;
}
