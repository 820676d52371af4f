/*
 * The master's dispatcher: one table, message type -> its route. A route
 * names the schema of the request's entries and of the reply's, and the
 * handler that applies one decoded entry to the state (under the lock)
 * and fills its reply entry; or, for a whole-body message, the handler
 * of the decoded body. The loop of decoding, locking, applying and
 * encoding is written once (kvf_m_serve_entries); so is the check of
 * every request body against its schema before it is served (store/
 * proto, kvf_sm_req_check). The table also says which requests a worker
 * serves (they wait on a node: a registration, an elected leader's
 * commits and removes, a get of an object on a disk tier).
 *
 * An unknown type or a body that does not parse (count and body disagree,
 * truncated entries, trailing bytes) gets an error status and counts in
 * `errors`; the connection goes on, since the frame was read whole.
 */
#include "store/master/master_int.h"
#include "store/proto/msg.h"
#include "core/log.h"

#include <stdio.h>
#include <string.h>

/* A keyed request's entry: applied under the lock, reply entry filled. */
typedef void (*kvf_m_entry_fn)(kvf_master_t *m, kvf_mclient_t *cl, uint8_t type,
                               const kvf_sm_req_t *q, void *rep);
/* A whole-body request: the decoded body; its reply written to w. */
typedef kvf_status_t (*kvf_m_body_fn)(kvf_master_t *m, const void *req,
                                      const kvf_sp_frame_t *f, kvf_wr_t *w,
                                      uint32_t *count_p, uint16_t *flags_p);

/* Who serves a route: the event loop, a worker always, or a worker when
 * nodes keep inventories (an elected leader). */
enum { KVF_MR_LOOP = 0, KVF_MR_WORKER = 1, KVF_MR_WORKER_HA = 2 };

typedef struct kvf_m_route {
    uint8_t type;
    uint8_t who;                /* KVF_MR_* */
    const kvf_sm_schema_t *req; /* keyed: an entry; whole: the body */
    const kvf_sm_schema_t *rep; /* keyed: a reply entry */
    kvf_m_entry_fn entry;       /* keyed requests */
    kvf_m_body_fn body;         /* whole-body requests */
    void (*before)(kvf_master_t *m, const kvf_sp_frame_t *f); /* unlocked */
} kvf_m_route_t;

/* ---- keyed requests: one entry each ---- */

/* An object's replicas in a pool, as the codec encodes them (replicas
 * on disk only, or being loaded, are not named). */
static void kvf_m_obj_reps(const kvf_mobj_t *o, kvf_sm_obj_t *out)
{
    const char *seg;
    unsigned i, k = 0;
    size_t n;

    for (i = 0; i < o->nrep; i++) {
        if (o->rep[i].blk == NULL || o->rep[i].loading) {
            continue;
        }
        seg = o->rep[i].node->segment;
        n = strnlen(seg, sizeof(out->seg[k]) - 1);
        memcpy(out->seg[k], seg, n);
        out->seg[k][n] = '\0';
        out->addr[k] = o->rep[i].node->base + o->rep[i].blk->off;
        k++;
    }
    out->nrep = k;
}

static void kvf_m_e_put_start(kvf_master_t *m, kvf_mclient_t *cl, uint8_t type,
                              const kvf_sm_req_t *q, void *rep)
{
    kvf_sm_obj_t *o = rep;
    kvf_mobj_t *obj;

    (void)type;
    o->status =
        kvf_m_put_start(m, cl, q->key, q->size, q->replicas, q->flags, &obj);
    if (o->status == KVF_OK) {
        o->put_id = obj->put_id;
        kvf_m_obj_reps(obj, o);
    }
}

static void kvf_m_e_put_end(kvf_master_t *m, kvf_mclient_t *cl, uint8_t type,
                            const kvf_sm_req_t *q, void *rep)
{
    (void)cl;
    (void)type;
    ((kvf_sm_status_t *)rep)->status =
        kvf_m_put_end(m, q->key, q->put_id, q->checksum, q->mask);
}

/* COMMIT: commits a pending put or a reservation under its key and, on
 * success, reserves space for the client's next put when asked. */
static void kvf_m_e_commit(kvf_master_t *m, kvf_mclient_t *cl, uint8_t type,
                           const kvf_sm_req_t *q, void *rep)
{
    kvf_sm_obj_t *o = rep;
    kvf_mobj_t *obj;

    (void)type;
    o->status = kvf_m_commit(m, q->key, q->put_id, q->size, q->checksum,
                             q->mask, q->flags);
    if (o->status == KVF_OK && q->mask != 0 && q->next_size > 0 &&
        kvf_m_reserve(m, cl, q->next_size, q->next_replicas, &obj) == KVF_OK) {
        o->put_id = obj->put_id;
        kvf_m_obj_reps(obj, o);
    }
}

static void kvf_m_e_get(kvf_master_t *m, kvf_mclient_t *cl, uint8_t type,
                        const kvf_sm_req_t *q, void *rep)
{
    kvf_sm_obj_t *o = rep;
    kvf_mobj_t *obj;
    int leased = 0;

    (void)type;
    o->status = kvf_m_get(m, cl, q->key, &obj, &leased);
    if (o->status == KVF_OK) {
        o->size = obj->size;
        o->checksum = obj->checksum;
        o->lease_ms = leased ? (uint32_t)m->opts.lease_ms : 0;
        kvf_m_obj_reps(obj, o);
    }
}

static void kvf_m_e_keys(kvf_master_t *m, kvf_mclient_t *cl, uint8_t type,
                         const kvf_sm_req_t *q, void *rep)
{
    (void)cl;
    ((kvf_sm_status_t *)rep)->status = (type == KVF_SP_REMOVE)
                                           ? kvf_m_remove(m, q->key)
                                           : kvf_m_exists(m, q->key);
}

/* Every entry of a keyed request: decoded (the only one: given decoded
 * in one), applied under the lock (a key the codec refused answers its
 * verdict), its reply entry encoded. */
static kvf_status_t kvf_m_serve_entries(kvf_master_t *m, kvf_mclient_t *cl,
                                        const kvf_m_route_t *rt,
                                        const kvf_sp_frame_t *f,
                                        const kvf_sm_req_t *one, kvf_wr_t *w,
                                        uint32_t *count_p)
{
    union {
        kvf_sm_obj_t obj;
        kvf_sm_status_t st;
    } rep;
    const kvf_sm_req_t *qp = one;
    kvf_sm_req_t q;
    kvf_rd_t r;
    uint32_t i;

    kvf_rd_init(&r, f->body, f->hdr.meta_len);
    pthread_mutex_lock(&m->lock);
    for (i = 0; i < f->hdr.count; i++) {
        if (one == NULL) {
            kvf_sm_dec(&r, rt->req, &q);
            qp = &q;
        }
        memset(&rep.obj, 0, offsetof(kvf_sm_obj_t, seg));
        rep.obj.status = qp->key_status;
        /* every COMMIT reply names the put timeout, refused keys too */
        rep.obj.put_timeout_ms = (uint32_t)m->opts.put_timeout_ms;
        if (qp->key_status == KVF_OK) {
            rt->entry(m, cl, f->hdr.type, qp, &rep);
        }
        kvf_sm_enc(w, rt->rep, &rep);
    }
    pthread_mutex_unlock(&m->lock);
    *count_p = f->hdr.count;
    return KVF_OK;
}

/* ---- whole-body requests ---- */

static kvf_status_t kvf_m_b_list(kvf_master_t *m, const void *req,
                                 const kvf_sp_frame_t *f, kvf_wr_t *w,
                                 uint32_t *count_p, uint16_t *flags_p)
{
    const kvf_sm_list_t *q = req;
    size_t plen = strlen(q->prefix), b;
    kvf_sm_list_ent_t ent;
    uint32_t n = 0;
    kvf_mobj_t *o;

    (void)f;
    pthread_mutex_lock(&m->lock);
    for (b = 0; b < m->nbuckets; b++) {
        for (o = m->table[b]; o != NULL; o = o->hnext) {
            if (o->keylen < plen || memcmp(o->key, q->prefix, plen) != 0) {
                continue;
            }
            if ((q->max != 0 && n >= q->max) ||
                w->len + o->keylen + KVF_SM_LIST_ENT_FIXED > KVF_SP_BODY_MAX) {
                *flags_p |= KVF_SP_TRUNCATED;
                goto out;
            }
            ent.key = o->key;
            ent.size = o->size;
            ent.committed = (o->state == KVF_OBJ_COMMITTED);
            ent.nrep = o->nrep;
            kvf_sm_list_ent_enc(w, &ent);
            n++;
        }
    }
out:
    pthread_mutex_unlock(&m->lock);
    *count_p = n;
    return KVF_OK;
}

/* NODES: every node and its pool (a client maps them ahead of its
 * views), as many as one reply holds (then KVF_SP_TRUNCATED). */
static kvf_status_t kvf_m_b_nodes(kvf_master_t *m, const void *req,
                                  const kvf_sp_frame_t *f, kvf_wr_t *w,
                                  uint32_t *count_p, uint16_t *flags_p)
{
    kvf_sm_node_ent_t e;
    kvf_mnode_t *n;
    uint32_t cnt = 0;

    (void)req;
    if (f->hdr.count != 0) {
        return KVF_ERR_PROTOCOL;
    }
    pthread_mutex_lock(&m->lock);
    for (n = m->nodes; n != NULL; n = n->next) {
        if (w->len + strlen(n->segment) + KVF_SM_NODE_ENT_FIXED >
            KVF_SP_BODY_MAX) {
            *flags_p |= KVF_SP_TRUNCATED;
            break;
        }
        snprintf(e.segment, sizeof(e.segment), "%s", n->segment);
        e.pool_addr = n->base;
        e.pool_len = n->pa.len;
        kvf_sm_node_ent_enc(w, &e);
        cnt++;
    }
    pthread_mutex_unlock(&m->lock);
    *count_p = cnt;
    return KVF_OK;
}

static kvf_status_t kvf_m_b_node_reg(kvf_master_t *m, const void *req,
                                     const kvf_sp_frame_t *f, kvf_wr_t *w,
                                     uint32_t *count_p, uint16_t *flags_p)
{
    const kvf_sm_node_reg_t *q = req;
    kvf_sm_node_reg_rep_t rep;
    uint64_t gen = 0;
    kvf_status_t st;

    (void)f;
    (void)count_p;
    (void)flags_p;
    st = kvf_m_node_claim(m, q);
    if (st != KVF_OK) {
        return st;
    }
    pthread_mutex_lock(&m->lock);
    st = kvf_m_node_register(m, q->segment, q->uid, q->instance, q->pool_addr,
                             q->pool_len, q->inv_addr, q->disk_len, &gen);
    pthread_mutex_unlock(&m->lock);
    if (st != KVF_OK) {
        return st;
    }
    rep.master_epoch = m->epoch;
    rep.node_gen = gen;
    rep.heartbeat_ms = (uint32_t)m->opts.heartbeat_ms;
    rep.ttl_ms = (uint32_t)m->opts.node_ttl_ms;
    kvf_sm_node_reg_rep_enc(w, &rep);
    return KVF_OK;
}

static kvf_status_t kvf_m_b_heartbeat(kvf_master_t *m, const void *req,
                                      const kvf_sp_frame_t *f, kvf_wr_t *w,
                                      uint32_t *count_p, uint16_t *flags_p)
{
    const kvf_sm_heartbeat_t *q = req;
    kvf_status_t st;

    (void)f;
    (void)w;
    (void)count_p;
    (void)flags_p;
    pthread_mutex_lock(&m->lock);
    st = kvf_m_heartbeat(m, q->uid, q->node_gen, q->master_epoch);
    pthread_mutex_unlock(&m->lock);
    return st;
}

/* A page of a node's report (inventory, disk tier): each entry rebuilt
 * (or refused, logged); the empty page ends the report and the node
 * takes new objects. */
static kvf_status_t kvf_m_b_inv_report(kvf_master_t *m, const void *req,
                                       const kvf_sp_frame_t *f, kvf_wr_t *w,
                                       uint32_t *count_p, uint16_t *flags_p)
{
    const kvf_sm_inv_head_t *head = req;
    kvf_pa_block_t *hint = NULL;
    kvf_sm_inv_head_t skip;
    kvf_sm_inv_ent_t e;
    kvf_mnode_t *n;
    size_t refused = 0;
    kvf_rd_t r;
    uint32_t i;

    (void)w;
    (void)count_p;
    (void)flags_p;
    kvf_rd_init(&r, f->body, f->hdr.meta_len);
    kvf_sm_inv_head_dec(&r, &skip); /* decoded already: req */
    pthread_mutex_lock(&m->lock);
    n = kvf_m_node_find(m, head->uid, head->node_gen);
    if (n == NULL) {
        pthread_mutex_unlock(&m->lock);
        return KVF_ERR_STALE;
    }
    for (i = 0; i < f->hdr.count; i++) {
        kvf_sm_inv_ent_dec(&r, &e);
        refused += kvf_m_rebuild_add(m, n, &e, &hint) != KVF_OK;
    }
    kvf_m_report_page(m, n, f->hdr.count, refused);
    pthread_mutex_unlock(&m->lock);
    return KVF_OK;
}

/* ---- the table ---- */

static const kvf_m_route_t kvf_m_routes[] = {
    {KVF_SP_NODE_REG, KVF_MR_WORKER, &kvf_sm_s_node_reg, NULL, NULL,
     kvf_m_b_node_reg, NULL},
    {KVF_SP_HEARTBEAT, KVF_MR_LOOP, &kvf_sm_s_heartbeat, NULL, NULL,
     kvf_m_b_heartbeat, NULL},
    {KVF_SP_PUT_START, KVF_MR_LOOP, &kvf_sm_s_put_start,
     &kvf_sm_s_put_start_rep, kvf_m_e_put_start, NULL, NULL},
    {KVF_SP_PUT_END, KVF_MR_WORKER_HA, &kvf_sm_s_put_end, &kvf_sm_s_status,
     kvf_m_e_put_end, NULL, NULL},
    {KVF_SP_COMMIT, KVF_MR_WORKER_HA, &kvf_sm_s_commit, &kvf_sm_s_commit_rep,
     kvf_m_e_commit, NULL, NULL},
    {KVF_SP_GET, KVF_MR_LOOP, &kvf_sm_s_key, &kvf_sm_s_get_rep, kvf_m_e_get,
     NULL, kvf_m_tier_prefetch},
    {KVF_SP_REMOVE, KVF_MR_WORKER_HA, &kvf_sm_s_key, &kvf_sm_s_status,
     kvf_m_e_keys, NULL, NULL},
    {KVF_SP_EXISTS, KVF_MR_LOOP, &kvf_sm_s_key, &kvf_sm_s_status, kvf_m_e_keys,
     NULL, NULL},
    {KVF_SP_LIST, KVF_MR_LOOP, &kvf_sm_s_list, NULL, NULL, kvf_m_b_list, NULL},
    {KVF_SP_NODES, KVF_MR_LOOP, NULL, NULL, NULL, kvf_m_b_nodes, NULL},
    {KVF_SP_INV_REPORT, KVF_MR_LOOP, &kvf_sm_s_inv_head, NULL, NULL,
     kvf_m_b_inv_report, NULL},
};

static const kvf_m_route_t *kvf_m_route(uint8_t type)
{
    size_t i;

    for (i = 0; i < sizeof(kvf_m_routes) / sizeof(kvf_m_routes[0]); i++) {
        if (kvf_m_routes[i].type == type) {
            return &kvf_m_routes[i];
        }
    }
    return NULL;
}

int kvf_m_to_worker(kvf_master_t *m, const kvf_sp_frame_t *f)
{
    const kvf_m_route_t *rt = kvf_m_route(f->hdr.type);

    if (rt == NULL) {
        return 0;
    }
    return rt->who == KVF_MR_WORKER ||
           (rt->who == KVF_MR_WORKER_HA && m->elect != NULL) ||
           (rt->before == kvf_m_tier_prefetch && kvf_m_tier_wanted(m, f));
}

void kvf_m_count_error(kvf_master_t *m)
{
    pthread_mutex_lock(&m->lock);
    m->st.errors++;
    pthread_mutex_unlock(&m->lock);
}

/* The route of f, its body decoded and served. */
static kvf_status_t kvf_m_route_serve(kvf_master_t *m, kvf_mclient_t *cl,
                                      const kvf_m_route_t *rt,
                                      const kvf_sp_frame_t *f,
                                      const kvf_sm_req_t *one, kvf_wr_t *w,
                                      uint32_t *count_p, uint16_t *flags_p)
{
    union {
        kvf_sm_node_reg_t reg;
        kvf_sm_heartbeat_t hb;
        kvf_sm_list_t list;
        kvf_sm_inv_head_t head;
    } req;
    kvf_rd_t r;

    if (rt->before != NULL) {
        rt->before(m, f);
    }
    if (rt->entry != NULL) {
        return kvf_m_serve_entries(m, cl, rt, f, one, w, count_p);
    }
    if (rt->req != NULL) {
        kvf_rd_init(&r, f->body, f->hdr.meta_len);
        kvf_sm_dec(&r, rt->req, &req);
    }
    return rt->body(m, &req, f, w, count_p, flags_p);
}

/* Whether f's body parses whole, before anything is applied. A keyed
 * request of one entry (most of them) is decoded once, into *one_p,
 * and served from there; anything else is parsed here and again as it
 * is served. */
static kvf_status_t kvf_m_req_check(const kvf_m_route_t *rt,
                                    const kvf_sp_frame_t *f, kvf_sm_req_t *one,
                                    const kvf_sm_req_t **one_p)
{
    kvf_rd_t r;

    *one_p = NULL;
    if (rt->entry == NULL || f->hdr.count != 1) {
        return kvf_sm_req_check(f->hdr.type, f->hdr.count, f->body,
                                f->hdr.meta_len);
    }
    kvf_rd_init(&r, f->body, f->hdr.meta_len);
    kvf_sm_dec(&r, rt->req, one);
    if (kvf_rd_end(&r) != KVF_OK) {
        return KVF_ERR_PROTOCOL;
    }
    *one_p = one;
    return KVF_OK;
}

kvf_status_t kvf_m_serve(kvf_master_t *m, kvf_mclient_t *cl,
                         const kvf_sp_frame_t *f, kvf_wr_t *w,
                         uint32_t *count_p, uint16_t *flags_p, uint8_t *rtype_p)
{
    const kvf_m_route_t *rt = kvf_m_route(f->hdr.type);
    const kvf_sm_req_t *one;
    kvf_sm_req_t q;
    kvf_status_t st;

    w->len = 0;
    w->failed = 0;
    *count_p = 0;
    *flags_p = 0;
    if (rt == NULL) {
        kvf_m_count_error(m);
        kvf_log_rl(KVF_LOG_WARN, "store message of unknown type 0x%x",
                   f->hdr.type);
        *rtype_p = KVF_SP_ERROR | KVF_SP_REPLY;
        return KVF_ERR_PROTOCOL;
    }
    *rtype_p = f->hdr.type | KVF_SP_REPLY;
    st = kvf_m_leader_check(m);
    if (st != KVF_OK) {
        return st;
    }
    st = kvf_m_req_check(rt, f, &q, &one);
    if (st == KVF_OK) {
        st = kvf_m_route_serve(m, cl, rt, f, one, w, count_p, flags_p);
    }
    if (st == KVF_ERR_PROTOCOL) {
        kvf_m_count_error(m);
        kvf_log_rl(KVF_LOG_WARN, "store %s request does not parse",
                   kvf_sp_msg_name(f->hdr.type));
    }
    if (st != KVF_OK || kvf_wr_status(w) != KVF_OK) {
        w->len = 0;
        w->failed = 0;
        *count_p = 0;
        *flags_p = 0;
        st = (st != KVF_OK) ? st : KVF_ERR_NO_MEMORY;
    }
    return st;
}

/* ---- a worker's frame ---- */

typedef struct kvf_m_work {
    kvf_master_t *m;
    kvf_mclient_t *cl;
    const kvf_sp_frame_t *f;
    kvf_wr_t *w;
    uint32_t *count_p;
    uint16_t *flags_p;
    uint8_t *rtype_p;
    kvf_status_t st;
} kvf_m_work_t;

static void kvf_m_work_run(void *arg)
{
    kvf_m_work_t *k = arg;

    k->st = kvf_m_serve(k->m, k->cl, k->f, k->w, k->count_p, k->flags_p,
                        k->rtype_p);
}

/* A commit a node did not record: its object is removed again. */
static void kvf_m_undo(kvf_master_t *m, const char *key, uint64_t put_id)
{
    kvf_mobj_t *o = kvf_m_find(m, key);

    if (o != NULL && o->state == KVF_OBJ_COMMITTED && o->put_id == put_id) {
        (void)kvf_m_remove(m, key);
    }
}

kvf_status_t kvf_m_serve_worker(kvf_master_t *m, kvf_mclient_t *cl,
                                const kvf_sp_frame_t *f, kvf_wr_t *w,
                                uint32_t *count_p, uint16_t *flags_p,
                                uint8_t *rtype_p)
{
    kvf_m_work_t k = {m, cl, f, w, count_p, flags_p, rtype_p, KVF_OK};
    kvf_status_t nodes;
    int stale = 0;

    nodes = kvf_m_inv_frame(m, kvf_m_work_run, &k, kvf_m_undo, &stale);
    if (nodes != KVF_OK && k.st == KVF_OK) {
        kvf_log_rl(KVF_LOG_WARN,
                   "leader: a node did not apply a %s to its inventory "
                   "(%s): the %s fails%s",
                   f->hdr.type == KVF_SP_REMOVE ? "remove" : "commit",
                   kvf_status_str(nodes), kvf_sp_msg_name(f->hdr.type),
                   stale ? " (a node has seen a newer leader)" : "");
        /* a node that has seen a newer leader: send the client there */
        k.st = stale ? KVF_ERR_NOT_LEADER : KVF_ERR_UNAVAILABLE;
        w->len = 0;
        *count_p = 0;
    }
    return k.st;
}
