/*
 * A leader's side of the node inventories (see inventory.h of the node):
 * every change of what a node holds goes to that node's inventory
 * server, in the order the master made it, through one channel per node
 * (a queue and a sender thread):
 *  - a commit queues an ADD entry for each replica (key, offset, size,
 *    checksum, the leader's epoch and commit number);
 *  - a release of a recorded object's space (remove, eviction, an older
 *    commit dropped by a rebuild, an undone commit) queues a DEL entry
 *    for each replica, and the space stays taken until the node has
 *    forgotten the entry (kvf_m_released), so no new put writes over
 *    bytes a node could still report.
 * Whoever sends takes everything queued at once and sends it as one
 * INV_ADD frame, in queue order (a DEL is an entry flagged
 * KVF_SM_INV_FORGET): group commit, one round trip carries the commits
 * of a store batch and of every client that committed while the
 * previous batch was on its way. The sender is a worker waiting for its
 * own entries when the channel is idle (no hand-off to another thread),
 * else the next waiting worker once the batch on its way is answered;
 * the channel's thread sends only the entries nobody waits for
 * (evictions, DELs of a rebuild).
 *
 * A worker serving a COMMIT, PUT_END or REMOVE frame waits until every
 * entry the frame queued is answered before it replies (kvf_m_inv_frame,
 * for dispatch.c): a commit is acknowledged only once each replica's
 * inventory holds it, a remove only once each has forgotten it. An entry a node does not take
 * (unreachable within io_timeout_ms, or refusing the epoch as older than
 * a leader it has seen) fails the frame: committed objects are removed
 * again, and the client gets KVF_ERR_UNAVAILABLE or KVF_ERR_NOT_LEADER.
 * Channels live as long as the master; the master's lock guards their
 * queues. The answers reach the objects through the master's hooks
 * (released, tier_answer): this file calls nothing above it.
 */
#include "store/master/master_int.h"
#include "core/alloc.h"
#include "core/auth.h"
#include "core/log.h"
#include "core/time.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define KVF_MI_CHANS 256 /* channels: an inventory and 1 + KVF_M_RCHANS for
                            a disk tier per node */

/* What a worker's frame waits for: entries not answered yet, the worst
 * answer, and the commits that a node did not record (to undo). */
typedef struct kvf_mi_wait {
    pthread_cond_t cond; /* signalled when left is 0 or it should send */
    unsigned left;
    kvf_status_t st;
    int stale;
    struct kvf_mi_rec *failed;
    size_t nfailed, capfailed;
} kvf_mi_wait_t;

/* One queued entry: an inventory ADD or DEL, or a tier operation. */
typedef struct kvf_mi_rec {
    uint8_t del;
    uint8_t flags;
    uint8_t tier; /* a TIER_OP entry (op, pool_off, disk_off below) */
    uint8_t op;
    uint64_t pool_off, disk_off;
    uint64_t uid, gen; /* tier: the node whose replica it is */
    char *key; /* owned */
    uint64_t off, size, checksum, epoch, seq;
    uint64_t put_id;  /* ADD: the commit's, for an undo */
    kvf_mobj_t *obj;  /* DEL: the object whose space waits for it;
                         tier WRITE, READ: the object it names */
    uint64_t term;    /* m->inv->term when queued: obj still valid? */
    kvf_mi_wait_t *w; /* who waits (NULL: nobody) */
    kvf_status_t st;  /* the node's answer */
} kvf_mi_rec_t;

typedef struct kvf_mi_q {
    kvf_mi_rec_t *r;
    size_t n, cap;
} kvf_mi_q_t;

typedef struct kvf_mi_chan {
    kvf_master_t *m;
    char addr[KVF_SM_INV_ADDR_MAX];
    int tier; /* 0: INV_ADD frames; 1: TIER_OP writes, drops; 2..: reads */
    kvf_mi_q_t q;  /* queued, under m->lock */
    size_t nowait; /* of q, entries nobody waits for */
    int busy;      /* a batch is on its way: fd is in use */
    pthread_cond_t cond;
    pthread_t thread;
    int fd;
    kvf_wire_mac_t mac; /* fd's frame tags */
    uint64_t next_id;
} kvf_mi_chan_t;

struct kvf_minv {
    kvf_mi_chan_t *chans[KVF_MI_CHANS];
    unsigned nchans;
    uint64_t term; /* bumped by kvf_m_inv_clear */
    int stop;
};

/* The waiter of the frame this thread serves (NULL: nobody waits, as on
 * an event loop). */
static __thread kvf_mi_wait_t *kvf_mi_cur;

static void kvf_mi_q_free(kvf_mi_q_t *q)
{
    size_t i;

    for (i = 0; i < q->n; i++) {
        kvf_free(q->r[i].key);
    }
    kvf_free(q->r);
    q->r = NULL;
    q->n = q->cap = 0;
}

static kvf_mi_rec_t *kvf_mi_q_push(kvf_mi_q_t *q)
{
    kvf_mi_rec_t *r;
    size_t cap;

    if (q->n == q->cap) {
        cap = q->cap ? q->cap * 2 : 64;
        r = kvf_realloc(q->r, cap * sizeof(*r));
        if (r == NULL) {
            return NULL;
        }
        q->r = r;
        q->cap = cap;
    }
    r = &q->r[q->n];
    memset(r, 0, sizeof(*r));
    return r;
}

/* ---- the sender ---- */

/* One frame of a batch: its entries (indexes into the batch). */
typedef struct kvf_mi_frame {
    uint8_t type;
    uint32_t n;
    size_t *idx;
    kvf_wr_t w;
    uint64_t id;
} kvf_mi_frame_t;

/* Splits batch b into INV_ADD frames, in queue order (a DEL as an entry
 * flagged KVF_SM_INV_FORGET), each at most KVF_STORE_BATCH_MAX entries
 * and KVF_SP_BODY_MAX bytes. Returns the number of frames (in fr[], at
 * most b->n). */
/* Encodes tier record r. */
static void kvf_mi_tier_enc(kvf_wr_t *w, const kvf_mi_rec_t *r)
{
    kvf_sm_tier_op_t o;

    o.op = r->op;
    o.key = r->key;
    o.pool_off = r->pool_off;
    o.disk_off = r->disk_off;
    o.size = r->size;
    o.checksum = r->checksum;
    o.seq = r->seq;
    o.flags = r->flags;
    kvf_sm_tier_op_enc(w, &o);
}

static size_t kvf_mi_frames(kvf_mi_q_t *b, kvf_mi_frame_t *fr, size_t *idx)
{
    kvf_sm_inv_ent_t e;
    size_t i, nf = 0, bytes = 0, len;
    uint8_t type;

    for (i = 0; i < b->n; i++) {
        type = b->r[i].tier ? KVF_SP_TIER_OP : KVF_SP_INV_ADD;
        len = (b->r[i].tier ? KVF_SM_TIER_OP_FIXED : KVF_SM_INV_ENT_FIXED) +
              strlen(b->r[i].key);
        if (nf == 0 || fr[nf - 1].n == KVF_STORE_BATCH_MAX ||
            fr[nf - 1].type != type || bytes + len > KVF_SP_BODY_MAX) {
            fr[nf].type = type;
            fr[nf].n = 0;
            fr[nf].idx = &idx[i];
            kvf_wr_init(&fr[nf].w);
            nf++;
            bytes = 0;
        }
        if (b->r[i].tier) {
            kvf_mi_tier_enc(&fr[nf - 1].w, &b->r[i]);
            fr[nf - 1].idx[fr[nf - 1].n++] = i;
            bytes += len;
            continue;
        }
        e.key = b->r[i].key;
        e.off = b->r[i].off;
        e.size = b->r[i].size;
        e.checksum = b->r[i].checksum;
        e.epoch = b->r[i].epoch;
        e.seq = b->r[i].seq;
        e.flags = b->r[i].flags | (b->r[i].del ? KVF_SM_INV_FORGET : 0);
        kvf_sm_inv_ent_enc(&fr[nf - 1].w, &e);
        fr[nf - 1].idx[fr[nf - 1].n++] = i; /* idx[i] */
        bytes += len;
    }
    return nf;
}

/* The answer to frame fr (reply f, or st when there is none) into its
 * entries of b. */
static void kvf_mi_answer(kvf_mi_q_t *b, const kvf_mi_frame_t *fr,
                          const kvf_sp_frame_t *f, kvf_status_t st)
{
    kvf_rd_t rd;
    uint32_t i;

    if (st == KVF_OK && f->hdr.status == KVF_OK && f->hdr.count != fr->n) {
        st = KVF_ERR_PROTOCOL;
    }
    if (st == KVF_OK) {
        st = f->hdr.status;
    }
    kvf_rd_init(&rd, f->body, f->hdr.meta_len);
    for (i = 0; i < fr->n; i++) {
        b->r[fr->idx[i]].st = st != KVF_OK ? st : kvf_sm_status_dec(&rd);
        if (st == KVF_OK && kvf_rd_status(&rd) != KVF_OK) {
            b->r[fr->idx[i]].st = KVF_ERR_PROTOCOL;
        }
    }
}

/* Sends frames fr[0..nf) on c's connection, all before reading the
 * first answer (one round trip for a batch larger than a frame);
 * answers into b. KVF_OK, or why the connection failed. */
static kvf_status_t kvf_mi_pipe(kvf_mi_chan_t *c, kvf_mi_q_t *b,
                                kvf_mi_frame_t *fr, size_t nf)
{
    kvf_master_t *m = c->m;
    uint64_t deadline = kvf_time_ms() + m->opts.io_timeout_ms;
    kvf_sp_frame_t f = {0};
    kvf_status_t st = KVF_OK;
    size_t i;

    if (c->fd < 0) {
        char host[KVF_HOST_MAX];
        uint16_t port;

        if (kvf_sock_parse_addr(c->addr, host, sizeof(host), &port) != KVF_OK ||
            kvf_auth_connect(host, port, (int)m->opts.io_timeout_ms, "store",
                             &c->fd, &c->mac) != KVF_OK) {
            c->fd = -1;
            return KVF_ERR_UNAVAILABLE;
        }
    }
    for (i = 0; i < nf && st == KVF_OK; i++) {
        fr[i].id = ++c->next_id;
        st = kvf_sp_send(c->fd, &c->mac, fr[i].type, fr[i].id, KVF_OK, fr[i].n,
                         0, &fr[i].w, deadline);
    }
    /* exact reads (kvf_sp_recv): the next answer may follow in the same
     * segment */
    for (i = 0; i < nf && st == KVF_OK; i++) {
        st = kvf_sp_recv(c->fd, &c->mac, &f, deadline, deadline);
        if (st == KVF_OK && (f.hdr.type != (fr[i].type | KVF_SP_REPLY) ||
                             f.hdr.id != fr[i].id)) {
            st = KVF_ERR_PROTOCOL;
        }
        if (st == KVF_OK) {
            kvf_mi_answer(b, &fr[i], &f, KVF_OK);
        }
    }
    kvf_sp_frame_free(&f);
    if (st != KVF_OK) {
        close(c->fd);
        c->fd = -1;
        kvf_wire_mac_free(&c->mac);
    }
    return st;
}

/* Sends batch b and sets each entry's st. A pooled
 * connection that fails is replaced once: the node applies an entry
 * sent twice the same way (an ADD replaces its own entry, a DEL of a
 * gone entry is NOT_FOUND, which counts as done). */
static void kvf_mi_send_all(kvf_mi_chan_t *c, kvf_mi_q_t *b)
{
    kvf_mi_frame_t *fr = kvf_calloc(b->n, sizeof(*fr));
    size_t *idx = kvf_calloc(b->n, sizeof(*idx));
    kvf_status_t st = KVF_ERR_NO_MEMORY;
    size_t i, nf = 0;
    int tries;

    if (fr != NULL && idx != NULL) {
        nf = kvf_mi_frames(b, fr, idx);
        for (tries = 0; tries < 2; tries++) {
            st = kvf_mi_pipe(c, b, fr, nf);
            if (st == KVF_OK || st == KVF_ERR_UNAVAILABLE) {
                break;
            }
        }
    }
    if (st != KVF_OK) {
        kvf_log_rl(KVF_LOG_WARN, "leader: node inventory %s: %s", c->addr,
                   kvf_status_str(st));
        for (i = 0; i < b->n; i++) {
            b->r[i].st = st;
        }
    }
    for (i = 0; i < nf; i++) {
        kvf_wr_free(&fr[i].w);
    }
    kvf_free(idx);
    kvf_free(fr);
}

/* A commit of w's frame that a node did not record: kept for the undo
 * (r's key becomes the waiter's). */
static void kvf_mi_fail(kvf_mi_wait_t *w, kvf_mi_rec_t *r)
{
    kvf_mi_rec_t *fr;
    size_t cap;

    if (w->nfailed == w->capfailed) {
        cap = w->capfailed ? w->capfailed * 2 : 8;
        fr = kvf_realloc(w->failed, cap * sizeof(*fr));
        if (fr == NULL) {
            return; /* the frame fails; this object is not undone */
        }
        w->failed = fr;
        w->capfailed = cap;
    }
    w->failed[w->nfailed++] = *r;
    r->key = NULL;
}

/* The answers of batch b reach their waiters and objects (lock held). */
static void kvf_mi_finish(kvf_master_t *m, kvf_mi_q_t *b)
{
    kvf_mi_rec_t *r;
    kvf_mi_wait_t *w;
    size_t i;

    for (i = 0; i < b->n; i++) {
        r = &b->r[i];
        if (r->tier) {
            if (r->obj != NULL && r->term == m->inv->term) {
                m->hooks.tier_answer(m, r->obj, r->uid, r->gen, r->op,
                                     r->st);
            }
            if (r->w != NULL && --r->w->left == 0) {
                pthread_cond_signal(&r->w->cond);
            }
            continue; /* its outcome is the object's, not the frame's */
        }
        if (r->del && r->st == KVF_ERR_NOT_FOUND) {
            r->st = KVF_OK; /* forgotten already */
        }
        if (r->del && r->obj != NULL && r->term == m->inv->term) {
            m->hooks.released(m, r->obj);
        }
        w = r->w;
        if (w == NULL) {
            continue;
        }
        if (--w->left == 0) {
            pthread_cond_signal(&w->cond);
        }
        if (r->st == KVF_OK) {
            continue;
        }
        w->stale |= r->st == KVF_ERR_STALE;
        w->st = r->st;
        if (!r->del) {
            kvf_mi_fail(w, r);
        }
    }
}

/* What c queued while a batch was on its way goes next: its first
 * waiting worker sends it, else c's thread (lock held). */
static void kvf_mi_next(kvf_mi_chan_t *c)
{
    size_t i;

    for (i = 0; i < c->q.n; i++) {
        if (c->q.r[i].w != NULL) {
            pthread_cond_signal(&c->q.r[i].w->cond);
            return;
        }
    }
    if (c->nowait > 0) {
        pthread_cond_signal(&c->cond);
    }
}

/* Sends everything c has queued as one batch (lock held, dropped
 * meanwhile). Run by a worker waiting for answers from c (so a commit
 * costs no hand-off to another thread, and the commits queued while a
 * batch was on its way go together in the next), or by c's thread for
 * entries nobody waits for. */
static void kvf_mi_run(kvf_master_t *m, kvf_mi_chan_t *c)
{
    kvf_mi_q_t b = c->q;

    memset(&c->q, 0, sizeof(c->q));
    c->nowait = 0;
    c->busy = 1;
    pthread_mutex_unlock(&m->lock);
    kvf_mi_send_all(c, &b);
    pthread_mutex_lock(&m->lock);
    c->busy = 0;
    kvf_mi_finish(m, &b);
    kvf_mi_q_free(&b);
    kvf_mi_next(c);
}

/* A channel with entries queued and no batch on its way, or NULL. */
static kvf_mi_chan_t *kvf_mi_idle(kvf_master_t *m)
{
    unsigned i;

    for (i = 0; i < m->inv->nchans; i++) {
        if (m->inv->chans[i]->q.n > 0 && !m->inv->chans[i]->busy) {
            return m->inv->chans[i];
        }
    }
    return NULL;
}

static void *kvf_mi_main(void *arg)
{
    kvf_mi_chan_t *c = arg;
    kvf_master_t *m = c->m;

    pthread_mutex_lock(&m->lock);
    while (!m->inv->stop) {
        if (c->nowait > 0 && !c->busy) {
            kvf_mi_run(m, c);
        } else {
            pthread_cond_wait(&c->cond, &m->lock);
        }
    }
    pthread_mutex_unlock(&m->lock);
    if (c->fd >= 0) {
        close(c->fd);
    }
    kvf_wire_mac_free(&c->mac);
    return NULL;
}

/* ---- queueing (lock held) ---- */

/* Does node n use channel c? */
static int kvf_mi_uses(const kvf_mnode_t *n, const kvf_mi_chan_t *c)
{
    unsigned i;

    for (i = 0; i < KVF_M_RCHANS; i++) {
        if (n->rchan[i] == c) {
            return 1;
        }
    }
    return n->chan == c || n->tchan == c;
}

/* A channel no node uses any more, with nothing queued or on its way
 * (a node that went, or came back with another inventory address), to
 * serve another address; or NULL. */
static kvf_mi_chan_t *kvf_mi_spare(kvf_master_t *m)
{
    kvf_mi_chan_t *c;
    kvf_mnode_t *n;
    unsigned i;

    for (i = 0; i < m->inv->nchans; i++) {
        c = m->inv->chans[i];
        for (n = m->nodes; n != NULL && !kvf_mi_uses(n, c); n = n->next) {
        }
        if (n == NULL && c->q.n == 0 && !c->busy) {
            if (c->fd >= 0) {
                close(c->fd);
                c->fd = -1;
            }
            return c;
        }
    }
    return NULL;
}

/* The channel of node n of a kind (0 inventory, 1 tier writes and drops,
 * 2.. tier reads), started now if need be, or NULL. */
static kvf_mi_chan_t *kvf_mi_chan(kvf_master_t *m, kvf_mnode_t *n, int tier)
{
    struct kvf_minv *inv = m->inv;
    kvf_mi_chan_t **slot = tier == 0   ? &n->chan
                           : tier == 1 ? &n->tchan
                                       : &n->rchan[tier - 2];
    kvf_mi_chan_t *c;
    unsigned i;

    if (*slot != NULL) {
        return *slot;
    }
    for (i = 0; i < inv->nchans; i++) {
        if (inv->chans[i]->tier == tier &&
            strcmp(inv->chans[i]->addr, n->inv_addr) == 0) {
            *slot = inv->chans[i];
            return *slot;
        }
    }
    if (inv->nchans == KVF_MI_CHANS && (c = kvf_mi_spare(m)) != NULL) {
        snprintf(c->addr, sizeof(c->addr), "%s", n->inv_addr);
        c->tier = tier;
        *slot = c;
        return c;
    }
    if (inv->nchans == KVF_MI_CHANS || inv->stop ||
        (c = kvf_calloc(1, sizeof(*c))) == NULL) {
        kvf_log_rl(KVF_LOG_WARN,
                   "leader: no channel to the inventory of node %s",
                   n->segment);
        return NULL;
    }
    c->m = m;
    c->fd = -1;
    c->tier = tier;
    snprintf(c->addr, sizeof(c->addr), "%s", n->inv_addr);
    kvf_cond_init(&c->cond);
    if (pthread_create(&c->thread, NULL, kvf_mi_main, c) != 0) {
        pthread_cond_destroy(&c->cond);
        kvf_free(c);
        kvf_log_rl(KVF_LOG_WARN, "leader: cannot start an inventory sender");
        return NULL;
    }
    inv->chans[inv->nchans++] = c;
    *slot = c;
    return c;
}

/* Queues record r (filled but for its waiter) on c: the worker that
 * waits sends it, else c's thread. */
static void kvf_mi_enqueue(kvf_mi_chan_t *c, kvf_mi_rec_t *r, int wait)
{
    r->w = wait ? kvf_mi_cur : NULL;
    c->q.n++;
    if (r->w != NULL) {
        r->w->left++; /* that worker sends it */
    } else {
        c->nowait++; /* c's thread sends it */
        pthread_cond_signal(&c->cond);
    }
}

/* Queues one entry for replica i of o; KVF_OK, or why not. */
static kvf_status_t kvf_mi_queue(kvf_master_t *m, kvf_mobj_t *o, unsigned i,
                                 int del)
{
    kvf_mnode_t *n = o->rep[i].node;
    kvf_mi_chan_t *c = kvf_mi_chan(m, n, 0);
    kvf_mi_rec_t *r;

    if (c == NULL || (r = kvf_mi_q_push(&c->q)) == NULL) {
        return KVF_ERR_NO_RESOURCE;
    }
    r->key = kvf_strdup(o->key);
    if (r->key == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    r->del = (uint8_t)del;
    r->off = o->rep[i].blk->off;
    r->size = o->size;
    r->checksum = o->checksum;
    r->flags = o->flags;
    r->epoch = del ? m->epoch : o->inv_epoch;
    r->seq = del ? 0 : o->inv_seq;
    r->put_id = o->put_id;
    r->obj = del ? o : NULL;
    r->term = m->inv->term;
    kvf_mi_enqueue(c, r, 1);
    return KVF_OK;
}

kvf_status_t kvf_m_inv_tier(kvf_master_t *m, kvf_mobj_t *o, unsigned i,
                            uint8_t op, int wait)
{
    kvf_mrep_t *rep = &o->rep[i];
    kvf_mi_chan_t *c = kvf_mi_chan(
        m, rep->node,
        op == KVF_TIER_READ ? 2 + (int)(rep->node->rnext++ % KVF_M_RCHANS) : 1);
    kvf_mi_rec_t *r;

    if (c == NULL || (r = kvf_mi_q_push(&c->q)) == NULL) {
        return KVF_ERR_NO_RESOURCE;
    }
    r->key = kvf_strdup(o->key);
    if (r->key == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    r->tier = 1;
    r->op = op;
    r->pool_off = rep->blk != NULL ? rep->blk->off : 0;
    r->disk_off = rep->dblk->off;
    r->size = o->size;
    r->checksum = o->checksum;
    r->seq = ++m->inv_seq;
    r->flags = o->flags & KVF_STORE_PIN;
    r->uid = rep->node->uid;
    r->gen = rep->node->gen;
    /* a DROP names no object: o may be freed before it is answered */
    r->obj = op == KVF_TIER_DROP ? NULL : o;
    r->term = m->inv->term;
    if (r->obj != NULL) {
        o->tier_busy++;
    }
    kvf_mi_enqueue(c, r, wait && kvf_mi_cur != NULL);
    return KVF_OK;
}

int kvf_m_inv_in_worker(void)
{
    return kvf_mi_cur != NULL;
}

void kvf_m_inv_add(kvf_master_t *m, kvf_mobj_t *o)
{
    kvf_mi_rec_t r = {0};
    unsigned i;

    if (m->inv == NULL || m->elect == NULL) {
        return; /* a single master: no inventories */
    }
    o->inv_epoch = m->epoch;
    o->inv_seq = ++m->inv_seq;
    for (i = 0; i < o->nrep; i++) {
        if (o->rep[i].node->inv_addr[0] == '\0' ||
            kvf_mi_queue(m, o, i, 0) == KVF_OK || kvf_mi_cur == NULL) {
            continue;
        }
        /* not recorded: the frame fails and the object is undone */
        r.key = kvf_strdup(o->key);
        r.put_id = o->put_id;
        kvf_mi_cur->st = KVF_ERR_NO_RESOURCE;
        if (r.key != NULL) {
            kvf_mi_fail(kvf_mi_cur, &r);
        }
        kvf_free(r.key);
    }
}

unsigned kvf_m_inv_del(kvf_master_t *m, kvf_mobj_t *o, int wait)
{
    kvf_mi_wait_t *cur = kvf_mi_cur;
    unsigned i, n = 0;

    if (m->inv == NULL || m->elect == NULL || o->inv_epoch == 0) {
        return 0;
    }
    if (!wait) {
        kvf_mi_cur = NULL; /* the frame served does not wait for these */
    }
    for (i = 0; i < o->nrep; i++) {
        if (o->rep[i].node->inv_addr[0] == '\0' || o->rep[i].blk == NULL) {
            continue; /* no inventory, or on disk only (not recorded) */
        }
        if (kvf_mi_queue(m, o, i, 1) == KVF_OK) {
            n++;
        } else if (kvf_mi_cur != NULL) {
            kvf_mi_cur->st = KVF_ERR_NO_RESOURCE;
        }
    }
    kvf_mi_cur = cur;
    return n;
}

void kvf_m_inv_clear(kvf_master_t *m)
{
    if (m->inv != NULL) {
        m->inv->term++; /* queued DELs no longer name live objects */
    }
}

/* ---- a worker's frame ---- */

void kvf_m_inv_wait(kvf_master_t *m)
{
    kvf_mi_wait_t *wt = kvf_mi_cur;
    kvf_mi_chan_t *c;

    while (wt != NULL && wt->left > 0) {
        c = kvf_mi_idle(m);
        if (c != NULL) {
            kvf_mi_run(m, c); /* ours, and whatever else is queued */
        } else {
            pthread_cond_wait(&wt->cond, &m->lock);
        }
    }
}

kvf_status_t kvf_m_inv_frame(kvf_master_t *m, void (*run)(void *arg),
                             void *arg, kvf_m_undo_fn undo, int *stale_p)
{
    kvf_mi_wait_t wt = {0};
    size_t i;

    pthread_cond_init(&wt.cond, NULL);
    kvf_mi_cur = &wt;
    run(arg);
    pthread_mutex_lock(&m->lock);
    kvf_m_inv_wait(m);
    kvf_mi_cur = NULL;
    for (i = 0; i < wt.nfailed; i++) {
        if (wt.st != KVF_OK) {
            undo(m, wt.failed[i].key, wt.failed[i].put_id);
        }
        kvf_free(wt.failed[i].key);
    }
    pthread_mutex_unlock(&m->lock);
    kvf_free(wt.failed);
    pthread_cond_destroy(&wt.cond);
    *stale_p = wt.stale;
    return wt.st;
}

/* ---- start, stop ---- */

kvf_status_t kvf_m_inv_start(kvf_master_t *m)
{
    /* a single master keeps no inventories, but its channels carry the
     * nodes' disk tier operations */
    m->inv = kvf_calloc(1, sizeof(*m->inv));
    if (m->inv == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    return KVF_OK;
}

void kvf_m_inv_stop(kvf_master_t *m)
{
    struct kvf_minv *inv = m->inv;
    kvf_mnode_t *n;
    unsigned i;

    if (inv == NULL) {
        return;
    }
    pthread_mutex_lock(&m->lock);
    inv->stop = 1;
    for (i = 0; i < inv->nchans; i++) {
        pthread_cond_signal(&inv->chans[i]->cond);
    }
    pthread_mutex_unlock(&m->lock);
    for (i = 0; i < inv->nchans; i++) {
        pthread_join(inv->chans[i]->thread, NULL);
        kvf_mi_q_free(&inv->chans[i]->q);
        pthread_cond_destroy(&inv->chans[i]->cond);
        kvf_free(inv->chans[i]);
    }
    pthread_mutex_lock(&m->lock);
    for (n = m->nodes; n != NULL; n = n->next) {
        n->chan = NULL;
        n->tchan = NULL;
        memset(n->rchan, 0, sizeof(n->rchan));
    }
    m->inv = NULL;
    pthread_mutex_unlock(&m->lock);
    kvf_free(inv);
}
