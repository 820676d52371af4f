/*
 * Store batches: the GETs and SETs a loop queued while it served its
 * ready connections run together on the loop's thread, one store batch
 * per kind, so one master round trip per phase serves them all. SETs of
 * one key are serialised across loops by striped locks; a SET's put
 * replaces an existing key at commit (KVF_STORE_REPLACE), as Redis's SET
 * overwrites.
 */
#include "store/resp/resp_int.h"
#include "core/time.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

/* FNV-1a of the key (never 0). */
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
void kvf_resp_enqueue(kvf_resp_conn_t *c, int op, const char *key,
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
/* The GETs and SETs queued while a loop served its ready connections run
 * as store batches: one master round trip per phase for all of them
 * instead of one or two per command. Commands of one key are served
 * once: the GETs share one read; of the SETs, the last queued is stored
 * and the others answer with its outcome (they are concurrent, so the
 * store's state is one Redis could reach by running them in some order
 * with the last one last). */

void kvf_resp_oval_free(struct kvf_resp *s, kvf_ro_str_t *v)
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
    kvf_store_put_opts_t opts = {.flags = KVF_STORE_REPLACE};
    int i;

    for (i = 0; i < 4 && (st == KVF_ERR_EXISTS || st == KVF_ERR_BUSY); i++) {
        if (st == KVF_ERR_BUSY) {
            usleep(200u << i);
        }
        st = (st == KVF_ERR_EXISTS) ? kvf_store_remove(s->st, key) : KVF_OK;
        if (st == KVF_OK || st == KVF_ERR_NO_KEY) {
            st = kvf_store_put(s->st, key, buf, len, &opts);
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

/* Stores n keys (their stripes locked) in one put batch that replaces
 * existing keys at commit (SET overwrites: readers see the old value or
 * the new, never a miss); keys refused as existing (a master without
 * replacing puts) or busy go one by one. */
static void kvf_resp_put_keys(struct kvf_resp *s, kvf_resp_putset_t *p)
{
    kvf_store_put_opts_t opts = {.flags = KVF_STORE_REPLACE};
    size_t i;

    for (i = 0; i < p->n; i++) {
        p->st[i] = KVF_ERR_IO;
    }
    if (p->n == 1) { /* one key: the client's reservation path */
        p->st[0] =
            kvf_store_put(s->st, p->keys[0], p->bufs[0], p->lens[0], &opts);
    } else {
        (void)kvf_store_put_batch(s->st, p->n, p->keys, p->bufs, p->lens, &opts,
                                  p->st);
    }
    for (i = 0; i < p->n; i++) {
        p->st[i] =
            kvf_resp_put_again(s, p->keys[i], p->bufs[i], p->lens[i], p->st[i]);
    }
}

/* Scratch of one SET batch: the put set (see kvf_resp_put_keys), and per
 * op its short value's pool copy, the in-flight store it watches, and its
 * index in the put set. */
typedef struct kvf_resp_setjob {
    kvf_resp_putset_t p;
    char **copy;
    uint64_t *watch;
    size_t *own;
    size_t fidx[KVF_RESP_SET_STRIPES]; /* put-set index of a flight */
    uint64_t claimed;                  /* stripes whose flight is ours */
} kvf_resp_setjob_t;

#define KVF_RESP_NOT_OWN SIZE_MAX

static void *kvf_resp_setjob_init(kvf_resp_setjob_t *j, size_t n)
{
    void *mem =
        calloc(n, 2 * sizeof(char *) + sizeof(void *) + sizeof(size_t) +
                      2 * sizeof(kvf_status_t) + sizeof(uint64_t) +
                      sizeof(char *) + sizeof(uint64_t) + sizeof(size_t));

    if (mem == NULL) {
        return NULL;
    }
    memset(j, 0, sizeof(*j));
    j->p.keys = mem;
    j->p.bufs = (const void **)(j->p.keys + 2 * n);
    j->copy = (char **)(j->p.bufs + n);
    j->p.lens = (size_t *)(j->copy + n);
    j->p.hash = (uint64_t *)(j->p.lens + n);
    j->watch = j->p.hash + n;
    j->own = (size_t *)(j->watch + n);
    j->p.st = (kvf_status_t *)(j->own + n);
    return mem;
}

/* Copies the short values (parsed outside the pool) into the pool, since
 * the store moves bytes from registered memory; returns the stripes of
 * the ops that can go on. */
static uint64_t kvf_resp_set_prepare(struct kvf_resp *s, kvf_resp_conn_t **u,
                                     size_t n, kvf_resp_setjob_t *j)
{
    uint64_t stripes = 0;
    size_t i;

    for (i = 0; i < n; i++) {
        kvf_ro_str_t *v = u[i]->oval;

        u[i]->ost = KVF_OK;
        j->own[i] = KVF_RESP_NOT_OWN;
        if (!v->pooled) {
            j->copy[i] = kvf_resp_pool_alloc(&s->pool, v->len);
            if (j->copy[i] == NULL) {
                u[i]->ost = KVF_ERR_NO_RESOURCE;
                continue;
            }
            memcpy(j->copy[i], v->p, v->len);
        }
        stripes |= 1ull << (u[i]->ohash % KVF_RESP_SET_STRIPES);
    }
    return stripes;
}

/* Notes, for each op, the store of its key another loop has in flight. */
static void kvf_resp_flight_watch(struct kvf_resp *s, kvf_resp_conn_t **u,
                                  size_t n, kvf_resp_setjob_t *j)
{
    const kvf_resp_flight_t *f;
    size_t i;

    pthread_mutex_lock(&s->fmu);
    for (i = 0; i < n; i++) {
        f = &s->flight[u[i]->ohash % KVF_RESP_SET_STRIPES];
        j->watch[i] =
            (u[i]->ost == KVF_OK && f->active && f->hash == u[i]->ohash &&
             strcmp(f->key, u[i]->okey) == 0)
                ? f->gen
                : 0;
    }
    pthread_mutex_unlock(&s->fmu);
}

/* With the key's stripe locked: whether the watched store, or a later
 * store of the same key (begun after it ended, so also after this SET
 * came), stored the key. Such a SET can be answered OK unstored: Redis
 * could have run it just before that store. */
static int kvf_resp_flight_covers(const kvf_resp_flight_t *f, uint64_t watch,
                                  const kvf_resp_conn_t *c)
{
    return watch != 0 && f->gen >= watch && !f->active && f->ok &&
           f->hash == c->ohash && strcmp(f->key, c->okey) == 0;
}

/* With the stripes locked (so the watched stores are done): an op whose
 * watched store succeeded is answered OK; the others join the put set,
 * and the first key of each stripe becomes that stripe's flight. */
static void kvf_resp_flight_begin(struct kvf_resp *s, kvf_resp_conn_t **u,
                                  size_t n, kvf_resp_setjob_t *j)
{
    kvf_resp_flight_t *f;
    unsigned stripe;
    size_t i, m = 0;

    pthread_mutex_lock(&s->fmu);
    for (i = 0; i < n; i++) {
        stripe = (unsigned)(u[i]->ohash % KVF_RESP_SET_STRIPES);
        f = &s->flight[stripe];
        if (u[i]->ost != KVF_OK) {
            continue;
        }
        if (kvf_resp_flight_covers(f, j->watch[i], u[i])) {
            atomic_fetch_add(&s->ncovered, 1);
            continue;
        }
        j->own[i] = m;
        j->p.keys[m] = u[i]->okey;
        j->p.bufs[m] = u[i]->oval->pooled ? u[i]->oval->p : j->copy[i];
        j->p.lens[m] = u[i]->oval->len;
        j->p.hash[m] = u[i]->ohash;
        if (!(j->claimed & (1ull << stripe))) {
            j->claimed |= 1ull << stripe;
            j->fidx[stripe] = m;
            f->gen = ++s->fgen;
            f->hash = u[i]->ohash;
            f->active = 1;
            f->ok = 0;
            strcpy(f->key, u[i]->okey);
        }
        m++;
    }
    j->p.n = m;
    pthread_mutex_unlock(&s->fmu);
    atomic_fetch_add(&s->nstored, m);
}

/* Publishes the outcome of this batch's flights. */
static void kvf_resp_flight_end(struct kvf_resp *s, kvf_resp_setjob_t *j)
{
    unsigned i;

    pthread_mutex_lock(&s->fmu);
    for (i = 0; i < KVF_RESP_SET_STRIPES; i++) {
        if (j->claimed & (1ull << i)) {
            s->flight[i].ok = j->p.st[j->fidx[i]] == KVF_OK;
            s->flight[i].active = 0;
        }
    }
    if (j->claimed != 0) {
        pthread_cond_broadcast(&s->fend);
    }
    pthread_mutex_unlock(&s->fmu);
}

/*
 * When every op of the batch watches a store of its key under way on
 * another loop (one key written from every loop): waits for those stores
 * to end, without taking their stripe locks, and answers the ops they
 * cover. Waiting on the locks instead woke the waiting loops one at a
 * time, each taking and giving back the lock just to read the outcome.
 * Returns 1 when every op was answered so; 0 leaves the batch to the
 * locked path (a store failed, another began, or the wait ran past the
 * store timeout).
 */
static int kvf_resp_flight_join(struct kvf_resp *s, kvf_resp_conn_t **u,
                                size_t n, const kvf_resp_setjob_t *j)
{
    const kvf_resp_flight_t *f;
    struct timespec until;
    size_t i, busy;
    int rc = 0;

    for (i = 0; i < n; i++) {
        if (u[i]->ost != KVF_OK || j->watch[i] == 0) {
            return 0;
        }
    }
    kvf_time_abs_after(&until, (int)s->p.timeout_ms);
    pthread_mutex_lock(&s->fmu);
    for (;;) {
        for (i = 0, busy = 0; i < n; i++) {
            f = &s->flight[u[i]->ohash % KVF_RESP_SET_STRIPES];
            busy += f->active && f->gen == j->watch[i];
        }
        if (busy == 0 || rc != 0) {
            break;
        }
        rc = pthread_cond_timedwait(&s->fend, &s->fmu, &until);
    }
    for (i = 0; busy == 0 && i < n; i++) {
        f = &s->flight[u[i]->ohash % KVF_RESP_SET_STRIPES];
        if (!kvf_resp_flight_covers(f, j->watch[i], u[i])) {
            busy = 1;
        }
    }
    if (busy == 0) {
        atomic_fetch_add(&s->ncovered, n);
    }
    pthread_mutex_unlock(&s->fmu);
    return busy == 0;
}

/* Stores the values of u[0..n) (one SET per distinct key) and sets each
 * op's ost. A key another loop is storing meanwhile is not stored again
 * when that store succeeds (see kvf_resp_flight_t). */
static void kvf_resp_set_batch(struct kvf_resp *s, kvf_resp_conn_t **u,
                               size_t n)
{
    kvf_resp_setjob_t j;
    uint64_t stripes;
    size_t i;
    void *mem;

    if ((mem = kvf_resp_setjob_init(&j, n)) == NULL) {
        for (i = 0; i < n; i++) {
            u[i]->ost = KVF_ERR_NO_MEMORY;
        }
        return;
    }
    stripes = kvf_resp_set_prepare(s, u, n, &j);
    if (stripes != 0) {
        kvf_resp_flight_watch(s, u, n, &j);
    }
    if (stripes != 0 && !kvf_resp_flight_join(s, u, n, &j)) {
        kvf_resp_stripes(s, stripes, 1);
        kvf_resp_flight_begin(s, u, n, &j);
        if (j.p.n > 0) {
            kvf_resp_put_keys(s, &j.p);
        }
        kvf_resp_flight_end(s, &j);
        kvf_resp_stripes(s, stripes, 0);
    }
    for (i = 0; i < n; i++) {
        if (u[i]->ost == KVF_OK && j.own[i] != KVF_RESP_NOT_OWN) {
            u[i]->ost = j.p.st[j.own[i]];
        }
        kvf_resp_pool_free(&s->pool, j.copy[i], u[i]->oval->len);
    }
    free(mem);
}

/* Reads u[0..n) (one GET per distinct key) into fresh values: one get
 * batch into buffers of the last size read; a key that does not fit
 * (or a size never read yet) is read alone by kvf_resp_fetch. */
static void kvf_resp_get_copy(struct kvf_resp *s, kvf_resp_conn_t **u, size_t n)
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
        if (keys == NULL || bufs == NULL || caps == NULL || lens == NULL ||
            st == NULL) {
            free(st); /* no batch: each key is read alone below */
            st = NULL;
        }
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

/* Serves u[0..n) from store views where their nodes are reached over
 * shm (view.c), and reads the others into the pool. */
static void kvf_resp_get_batch(struct kvf_resp *s, kvf_resp_conn_t **u,
                               size_t n)
{
    kvf_resp_conn_t **rest;
    size_t i, m = 0;

    kvf_resp_view_batch(s, u, n);
    for (i = 0; i < n; i++) {
        m += u[i]->ost == KVF_INPROGRESS;
    }
    if (m == 0) {
        return;
    }
    if (m == n) {
        kvf_resp_get_copy(s, u, n);
        atomic_fetch_add(&s->ncopy, n);
        return;
    }
    rest = malloc(m * sizeof(*rest));
    for (i = 0, m = 0; i < n; i++) {
        if (u[i]->ost != KVF_INPROGRESS) {
            continue;
        }
        if (rest == NULL) {
            u[i]->ost = KVF_ERR_NO_MEMORY;
        } else {
            rest[m++] = u[i];
        }
    }
    if (rest != NULL) {
        kvf_resp_get_copy(s, rest, m);
    }
    atomic_fetch_add(&s->ncopy, m);
    free(rest);
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

kvf_resp_conn_t **kvf_resp_batch_run(kvf_resp_loop_t *lp, size_t *n_p)
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
    *n_p = n;
    return ops;
}
