/*
 * A leader's side of the node inventories (see inventory.h of the node):
 * after a COMMIT or PUT_END frame is served, a worker sends each object
 * committed by it (key, offset, size, checksum, the leader's epoch) to
 * the inventory server of every node holding a replica, one INV_ADD
 * frame per node, and only then lets the reply go to the client. The
 * connections to the nodes are the worker thread's own (a small cache),
 * so no lock is held and no event loop waits while a node answers. A
 * node that does not record an entry (unreachable, or refusing the epoch
 * as older than a leader it has seen) fails the frame: its objects are
 * removed and the client gets an error, never an acknowledgement of an
 * object a new leader could not rebuild.
 */
#include "store/master/master_int.h"
#include "core/alloc.h"
#include "core/auth.h"
#include "core/log.h"
#include "core/time.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define KVF_MI_CONNS 8  /* connections a worker keeps */
#define KVF_MI_NODES 64 /* nodes one frame may touch */

typedef struct kvf_mi_conn {
    char addr[KVF_SM_INV_ADDR_MAX];
    int fd;
} kvf_mi_conn_t;

static __thread kvf_mi_conn_t kvf_mi_conns[KVF_MI_CONNS];
static __thread unsigned kvf_mi_nconns;
static __thread uint64_t kvf_mi_next_id;

/* One node's share of a frame: its INV_ADD body and which entries of
 * the frame each of its lines is. */
typedef struct kvf_mi_batch {
    char addr[KVF_SM_INV_ADDR_MAX];
    kvf_wr_t w;
    uint32_t n;
    uint32_t *ent;
} kvf_mi_batch_t;

void kvf_m_inv_thread_end(void)
{
    unsigned i;

    for (i = 0; i < kvf_mi_nconns; i++) {
        close(kvf_mi_conns[i].fd);
    }
    kvf_mi_nconns = 0;
}

static void kvf_mi_drop(unsigned i)
{
    close(kvf_mi_conns[i].fd);
    kvf_mi_conns[i] = kvf_mi_conns[--kvf_mi_nconns];
}

/* The worker's connection to addr (made now if need be), or -1. */
static int kvf_mi_conn(const char *addr, unsigned timeout_ms)
{
    char host[KVF_HOST_MAX];
    uint16_t port;
    unsigned i;
    int fd;

    for (i = 0; i < kvf_mi_nconns; i++) {
        if (strcmp(kvf_mi_conns[i].addr, addr) == 0) {
            return kvf_mi_conns[i].fd;
        }
    }
    if (kvf_sock_parse_addr(addr, host, sizeof(host), &port) != KVF_OK ||
        kvf_auth_connect(host, port, (int)timeout_ms, "store", &fd) != KVF_OK) {
        return -1;
    }
    if (kvf_mi_nconns == KVF_MI_CONNS) {
        kvf_mi_drop(0);
    }
    snprintf(kvf_mi_conns[kvf_mi_nconns].addr, KVF_SM_INV_ADDR_MAX, "%s", addr);
    kvf_mi_conns[kvf_mi_nconns++].fd = fd;
    return fd;
}

static void kvf_mi_forget(int fd)
{
    unsigned i;

    for (i = 0; i < kvf_mi_nconns; i++) {
        if (kvf_mi_conns[i].fd == fd) {
            kvf_mi_drop(i);
            return;
        }
    }
}

/* Sends batch b; marks in failed[] each entry the node did not record
 * (all of them if it cannot be reached). Returns KVF_ERR_STALE if the
 * node refused this leader's epoch, else KVF_OK. */
static kvf_status_t kvf_mi_send(kvf_master_t *m, kvf_mi_batch_t *b,
                                uint8_t *failed)
{
    uint64_t deadline = kvf_time_ms() + m->opts.io_timeout_ms;
    kvf_sp_frame_t f = {0};
    kvf_status_t st = KVF_ERR_CONN_RESET, est, ret = KVF_OK;
    int fd, tries;
    kvf_rd_t r;
    uint32_t i;

    for (tries = 0; tries < 2 && st != KVF_OK; tries++) {
        fd = kvf_mi_conn(b->addr, m->opts.io_timeout_ms);
        if (fd < 0) {
            break;
        }
        st = kvf_sp_call(fd, KVF_SP_INV_ADD, ++kvf_mi_next_id, b->n, &b->w, &f,
                         deadline);
        if (st == KVF_OK && f.hdr.status == KVF_OK && f.hdr.count != b->n) {
            st = KVF_ERR_PROTOCOL;
        }
        if (st != KVF_OK) {
            kvf_mi_forget(fd); /* a new one on the second try */
        }
    }
    if (st != KVF_OK || f.hdr.status != KVF_OK) {
        kvf_log_rl(KVF_LOG_WARN, "leader: node inventory %s: %s", b->addr,
                   kvf_status_str(st != KVF_OK ? st : f.hdr.status));
        for (i = 0; i < b->n; i++) {
            failed[b->ent[i]] = 1;
        }
        kvf_sp_frame_free(&f);
        return KVF_OK;
    }
    kvf_rd_init(&r, f.body, f.hdr.meta_len);
    for (i = 0; i < b->n; i++) {
        est = kvf_sm_status_dec(&r);
        if (est != KVF_OK || kvf_rd_status(&r) != KVF_OK) {
            failed[b->ent[i]] = 1;
            ret = (est == KVF_ERR_STALE) ? est : ret;
        }
    }
    kvf_sp_frame_free(&f);
    return ret;
}

/* The batch of node n (added to *nb if new), or NULL past the limit. */
static kvf_mi_batch_t *kvf_mi_batch(kvf_mi_batch_t *bs, unsigned *nb,
                                    const kvf_mnode_t *n, uint32_t count)
{
    unsigned i;

    for (i = 0; i < *nb; i++) {
        if (strcmp(bs[i].addr, n->inv_addr) == 0) {
            return &bs[i];
        }
    }
    if (*nb == KVF_MI_NODES) {
        return NULL;
    }
    bs[*nb].ent = kvf_calloc(count, sizeof(uint32_t));
    if (bs[*nb].ent == NULL) {
        return NULL;
    }
    snprintf(bs[*nb].addr, sizeof(bs[*nb].addr), "%s", n->inv_addr);
    kvf_wr_init(&bs[*nb].w);
    bs[*nb].n = 0;
    return &bs[(*nb)++];
}

/* Adds the replicas of committed object `key` to the batches (lock
 * held); 0, or -1 if it could not be (the entry fails). */
static int kvf_mi_add(kvf_master_t *m, kvf_mi_batch_t *bs, unsigned *nb,
                      const kvf_sm_req_t *q, uint32_t idx, uint32_t count)
{
    kvf_mobj_t *o = kvf_m_find(m, q->key);
    kvf_sm_inv_ent_t e;
    kvf_mi_batch_t *b;
    unsigned i;

    if (o == NULL || o->state != KVF_OBJ_COMMITTED || o->put_id != q->put_id) {
        return 0; /* gone already (removed, evicted): nothing to record */
    }
    o->inv_epoch = m->epoch;
    o->inv_seq = ++m->inv_seq;
    for (i = 0; i < o->nrep; i++) {
        if (o->rep[i].node->inv_addr[0] == '\0') {
            continue; /* a node without an inventory */
        }
        b = kvf_mi_batch(bs, nb, o->rep[i].node, count);
        if (b == NULL) {
            return -1;
        }
        e.key = q->key;
        e.off = o->rep[i].blk->off;
        e.size = o->size;
        e.checksum = o->checksum;
        e.epoch = o->inv_epoch;
        e.seq = o->inv_seq;
        e.flags = o->flags;
        kvf_sm_inv_ent_enc(&b->w, &e);
        b->ent[b->n++] = idx;
    }
    return 0;
}

/* Which entries of f committed an object: their keys in q[], ok[i] set.
 * Returns the number of entries decoded. */
static uint32_t kvf_mi_committed(const kvf_sp_frame_t *f, const kvf_wr_t *w,
                                 kvf_sm_req_t *q, uint8_t *ok)
{
    static __thread kvf_sm_obj_t o;
    kvf_rd_t rq, rr;
    kvf_status_t st;
    uint32_t i;

    kvf_rd_init(&rq, f->body, f->hdr.meta_len);
    kvf_rd_init(&rr, w->buf, w->len);
    for (i = 0; i < f->hdr.count; i++) {
        (void)kvf_sm_req_dec(&rq, f->hdr.type, &q[i]);
        if (f->hdr.type == KVF_SP_COMMIT) {
            kvf_sm_commit_rep_dec(&rr, &o);
            st = o.status;
        } else {
            st = kvf_sm_status_dec(&rr);
        }
        ok[i] = st == KVF_OK && q[i].key_status == KVF_OK && q[i].mask != 0 &&
                kvf_rd_status(&rr) == KVF_OK;
    }
    return i;
}

/* Removes the objects of the failed entries (lock taken here). */
static void kvf_mi_undo(kvf_master_t *m, const kvf_sm_req_t *q,
                        const uint8_t *ok, const uint8_t *failed, uint32_t n)
{
    uint32_t i;

    pthread_mutex_lock(&m->lock);
    for (i = 0; i < n; i++) {
        if (ok[i] && failed[i]) {
            (void)kvf_m_remove(m, q[i].key);
        }
    }
    pthread_mutex_unlock(&m->lock);
}

void kvf_m_inv_record(kvf_master_t *m, const kvf_sp_frame_t *f, kvf_wr_t *w,
                      uint32_t *count_p, kvf_status_t *st_p)
{
    kvf_mi_batch_t *bs = NULL;
    kvf_sm_req_t *q = NULL;
    uint8_t *ok = NULL, *failed = NULL;
    kvf_status_t stale = KVF_OK;
    unsigned nb = 0, i;
    uint32_t n = 0, k, nfail = 0;

    if (m->elect == NULL || *st_p != KVF_OK ||
        (f->hdr.type != KVF_SP_COMMIT && f->hdr.type != KVF_SP_PUT_END) ||
        f->hdr.count == 0) {
        return;
    }
    q = kvf_calloc(f->hdr.count, sizeof(*q));
    ok = kvf_calloc(f->hdr.count, 2);
    bs = kvf_calloc(KVF_MI_NODES, sizeof(*bs));
    if (q == NULL || ok == NULL || bs == NULL) {
        *st_p = KVF_ERR_NO_MEMORY;
        goto out;
    }
    failed = ok + f->hdr.count;
    n = kvf_mi_committed(f, w, q, ok);
    pthread_mutex_lock(&m->lock);
    for (k = 0; k < n; k++) {
        if (ok[k] && kvf_mi_add(m, bs, &nb, &q[k], k, f->hdr.count) != 0) {
            failed[k] = 1;
        }
    }
    pthread_mutex_unlock(&m->lock);
    for (i = 0; i < nb; i++) {
        if (kvf_mi_send(m, &bs[i], failed) == KVF_ERR_STALE) {
            stale = KVF_ERR_STALE;
        }
    }
    for (k = 0; k < n; k++) {
        nfail += ok[k] && failed[k];
    }
    if (nfail > 0) {
        kvf_mi_undo(m, q, ok, failed, n);
        kvf_log_rl(KVF_LOG_WARN,
                   "leader: %u object(s) not recorded by their nodes: "
                   "removed, the %s fails%s",
                   nfail, kvf_sp_msg_name(f->hdr.type),
                   stale != KVF_OK ? " (a node has seen a newer leader)" : "");
        /* a node that has seen a newer leader: send the client there */
        *st_p = stale != KVF_OK ? KVF_ERR_NOT_LEADER : KVF_ERR_UNAVAILABLE;
        w->len = 0;
        *count_p = 0;
    }
out:
    for (i = 0; i < nb; i++) {
        kvf_wr_free(&bs[i].w);
        kvf_free(bs[i].ent);
    }
    kvf_free(bs);
    kvf_free(ok);
    kvf_free(q);
}
