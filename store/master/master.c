/*
 * Store master, serving side: options, start/stop, the reaper thread that
 * runs the periodic tick, and the RPC handlers that decode a request,
 * apply it to the metadata under the lock (a whole batch at once) and
 * encode the reply. Connections are served by the event loop (loop.c).
 *
 * An unknown type or a body that does not parse (count and body disagree,
 * truncated entries, trailing bytes) gets an error status and counts in
 * `errors`; the connection goes on, since the frame was read whole.
 */
#include "store/master/master_int.h"
#include "store/proto/msg.h"
#include "core/auth.h"
#include "core/alloc.h"
#include "core/checksum.h"
#include "core/log.h"
#include "core/time.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* The limits of docs/security.md, from the `store` config table. */
static kvf_status_t kvf_master_limits_default(kvf_master_opts_t *o)
{
    static const char *const pct_keys[] = {"client_max_reserved_pct",
                                           "max_put_share_pct"};
    const kvf_config_table_t *t = &kvf_store_config;
    uint64_t v[7];
    kvf_status_t st;
    unsigned i;

    if ((st = kvf_config_u64(t, "client_max_pending",
                             &o->client_max_pending)) != KVF_OK ||
        (st = kvf_config_u64(t, pct_keys[0], &v[0])) != KVF_OK ||
        (st = kvf_config_u64(t, pct_keys[1], &v[1])) != KVF_OK ||
        (st = kvf_config_u64(t, "master_idle_ms", &o->idle_timeout_ms)) !=
            KVF_OK ||
        (st = kvf_config_u64(t, "conn_max_per_peer", &v[2])) != KVF_OK ||
        (st = kvf_config_u64(t, "conn_max_tcp", &v[3])) != KVF_OK ||
        (st = kvf_config_u64(t, "conn_max_unix", &v[4])) != KVF_OK ||
        (st = kvf_config_u64(t, "reg_workers", &v[5])) != KVF_OK) {
        return st;
    }
    for (i = 0; i < 2; i++) {
        if (v[i] == 0 || v[i] > 100) {
            kvf_error("store %s=%lu: 1 to 100", pct_keys[i],
                      (unsigned long)v[i]);
            return KVF_ERR_INVALID_PARAM;
        }
    }
    for (i = 2; i < 6; i++) {
        if (v[i] == 0 || v[i] > 1000000) {
            kvf_error("store connection limits and reg_workers: 1 to 1000000");
            return KVF_ERR_INVALID_PARAM;
        }
    }
    o->client_max_reserved_pct = (unsigned)v[0];
    o->max_put_share_pct = (unsigned)v[1];
    o->conn_max_per_peer = (unsigned)v[2];
    o->conn_max_tcp = (unsigned)v[3];
    o->conn_max_unix = (unsigned)v[4];
    o->reg_workers = (unsigned)v[5];
    return KVF_OK;
}

kvf_status_t kvf_master_opts_default(kvf_master_opts_t *o)
{
    const kvf_config_table_t *t = &kvf_store_config;
    uint64_t hi, lo, rep, io, loops;
    kvf_status_t st;

    memset(o, 0, sizeof(*o));
    o->listen = kvf_config_str(t, "master");
    o->http = kvf_config_str(t, "master_http");
    if ((st = kvf_config_u64(t, "lease_ms", &o->lease_ms)) != KVF_OK ||
        (st = kvf_config_u64(t, "put_timeout_ms", &o->put_timeout_ms)) !=
            KVF_OK ||
        (st = kvf_config_u64(t, "node_ttl_ms", &o->node_ttl_ms)) != KVF_OK ||
        (st = kvf_config_u64(t, "heartbeat_ms", &o->heartbeat_ms)) != KVF_OK ||
        (st = kvf_config_u64(t, "high_watermark_pct", &hi)) != KVF_OK ||
        (st = kvf_config_u64(t, "low_watermark_pct", &lo)) != KVF_OK ||
        (st = kvf_config_u64(t, "replicas", &rep)) != KVF_OK ||
        (st = kvf_config_u64(t, "store_timeout_ms", &io)) != KVF_OK ||
        (st = kvf_config_u64(t, "master_loops", &loops)) != KVF_OK) {
        return st;
    }
    if (loops > KVF_MASTER_LOOPS_MAX) {
        kvf_error("store master_loops=%lu: at most %u", (unsigned long)loops,
                  KVF_MASTER_LOOPS_MAX);
        return KVF_ERR_INVALID_PARAM;
    }
    o->loops = (unsigned)loops;
    st = kvf_master_limits_default(o);
    if (st != KVF_OK) {
        return st;
    }
    o->high_watermark = (double)hi / 100.0;
    o->low_watermark = (double)lo / 100.0;
    o->replicas = (unsigned)rep;
    o->io_timeout_ms = (unsigned)io;
    return KVF_OK;
}

/* ---- RPC handlers: body checked first (kvf_m_serve), apply, encode ---- */

typedef kvf_status_t (*kvf_m_handler_t)(kvf_master_t *m, kvf_mclient_t *cl,
                                        const kvf_sp_frame_t *f, kvf_wr_t *w,
                                        uint32_t *count_p, uint16_t *flags_p);

/* An object's replicas as the codec encodes them. */
static void kvf_m_obj_reps(const kvf_mobj_t *o, kvf_sm_obj_t *out)
{
    const char *seg;
    unsigned i;
    size_t n;

    out->nrep = o->nrep;
    for (i = 0; i < o->nrep; i++) {
        seg = o->rep[i].node->segment;
        n = strnlen(seg, sizeof(out->seg[i]) - 1);
        memcpy(out->seg[i], seg, n);
        out->seg[i][n] = '\0';
        out->addr[i] = o->rep[i].node->base + o->rep[i].blk->off;
    }
}

static kvf_status_t kvf_m_h_put_start(kvf_master_t *m, kvf_mclient_t *cl,
                                      const kvf_sp_frame_t *f, kvf_wr_t *w,
                                      uint32_t *count_p, uint16_t *flags_p)
{
    kvf_sm_obj_t rep;
    kvf_sm_req_t q;
    kvf_mobj_t *o;
    kvf_rd_t r;
    uint32_t i;

    (void)flags_p;
    kvf_rd_init(&r, f->body, f->hdr.meta_len);
    pthread_mutex_lock(&m->lock);
    for (i = 0; i < f->hdr.count; i++) {
        kvf_sm_put_start_dec(&r, &q);
        rep.status = q.key_status;
        if (rep.status == KVF_OK) {
            rep.status =
                kvf_m_put_start(m, cl, q.key, q.size, q.replicas, q.flags, &o);
        }
        rep.put_id = 0;
        rep.nrep = 0;
        if (rep.status == KVF_OK) {
            rep.put_id = o->put_id;
            kvf_m_obj_reps(o, &rep);
        }
        kvf_sm_put_start_rep_enc(w, &rep);
    }
    pthread_mutex_unlock(&m->lock);
    *count_p = f->hdr.count;
    return KVF_OK;
}

static kvf_status_t kvf_m_h_put_end(kvf_master_t *m, kvf_mclient_t *cl,
                                    const kvf_sp_frame_t *f, kvf_wr_t *w,
                                    uint32_t *count_p, uint16_t *flags_p)
{
    kvf_status_t st;
    kvf_sm_req_t q;
    kvf_rd_t r;
    uint32_t i;

    (void)flags_p;
    (void)cl;
    kvf_rd_init(&r, f->body, f->hdr.meta_len);
    pthread_mutex_lock(&m->lock);
    for (i = 0; i < f->hdr.count; i++) {
        kvf_sm_put_end_dec(&r, &q);
        st = q.key_status;
        if (st == KVF_OK) {
            st = kvf_m_put_end(m, q.key, q.put_id, q.checksum, q.mask);
        }
        kvf_sm_status_enc(w, st);
    }
    pthread_mutex_unlock(&m->lock);
    *count_p = f->hdr.count;
    return KVF_OK;
}

/* COMMIT: commits a pending put or a reservation under its key and, on
 * success, reserves space for the client's next put when asked. */
static kvf_status_t kvf_m_h_commit(kvf_master_t *m, kvf_mclient_t *cl,
                                   const kvf_sp_frame_t *f, kvf_wr_t *w,
                                   uint32_t *count_p, uint16_t *flags_p)
{
    kvf_sm_obj_t rep;
    kvf_sm_req_t q;
    kvf_status_t rst;
    kvf_mobj_t *o;
    kvf_rd_t r;
    uint32_t i;

    (void)flags_p;
    kvf_rd_init(&r, f->body, f->hdr.meta_len);
    pthread_mutex_lock(&m->lock);
    for (i = 0; i < f->hdr.count; i++) {
        kvf_sm_commit_dec(&r, &q);
        rep.status = q.key_status;
        if (rep.status == KVF_OK) {
            rep.status = kvf_m_commit(m, q.key, q.put_id, q.size, q.checksum,
                                      q.mask, q.flags);
        }
        rep.put_timeout_ms = (uint32_t)m->opts.put_timeout_ms;
        rst = KVF_ERR_NOT_FOUND;
        if (rep.status == KVF_OK && q.mask != 0 && q.next_size > 0) {
            rst = kvf_m_reserve(m, cl, q.next_size, q.next_replicas, &o);
        }
        rep.put_id = 0;
        rep.nrep = 0;
        if (rst == KVF_OK) {
            rep.put_id = o->put_id;
            kvf_m_obj_reps(o, &rep);
        }
        kvf_sm_commit_rep_enc(w, &rep);
    }
    pthread_mutex_unlock(&m->lock);
    *count_p = f->hdr.count;
    return KVF_OK;
}

static kvf_status_t kvf_m_h_get(kvf_master_t *m, kvf_mclient_t *cl,
                                const kvf_sp_frame_t *f, kvf_wr_t *w,
                                uint32_t *count_p, uint16_t *flags_p)
{
    kvf_sm_obj_t rep;
    kvf_sm_req_t q;
    kvf_mobj_t *o;
    kvf_rd_t r;
    uint32_t i;

    (void)flags_p;
    (void)cl;
    kvf_rd_init(&r, f->body, f->hdr.meta_len);
    pthread_mutex_lock(&m->lock);
    for (i = 0; i < f->hdr.count; i++) {
        kvf_sm_key_dec(&r, &q);
        rep.status = q.key_status;
        if (rep.status == KVF_OK) {
            rep.status = kvf_m_get(m, q.key, &o);
        }
        rep.size = rep.checksum = 0;
        rep.lease_ms = 0;
        rep.nrep = 0;
        if (rep.status == KVF_OK) {
            rep.size = o->size;
            rep.checksum = o->checksum;
            rep.lease_ms = (uint32_t)m->opts.lease_ms;
            kvf_m_obj_reps(o, &rep);
        }
        kvf_sm_get_rep_enc(w, &rep);
    }
    pthread_mutex_unlock(&m->lock);
    *count_p = f->hdr.count;
    return KVF_OK;
}

static kvf_status_t kvf_m_h_keys(kvf_master_t *m, kvf_mclient_t *cl,
                                 const kvf_sp_frame_t *f, kvf_wr_t *w,
                                 uint32_t *count_p, uint16_t *flags_p)
{
    kvf_status_t st;
    kvf_sm_req_t q;
    kvf_rd_t r;
    uint32_t i;

    (void)flags_p;
    (void)cl;
    kvf_rd_init(&r, f->body, f->hdr.meta_len);
    pthread_mutex_lock(&m->lock);
    for (i = 0; i < f->hdr.count; i++) {
        kvf_sm_key_dec(&r, &q);
        st = q.key_status;
        if (st == KVF_OK) {
            st = (f->hdr.type == KVF_SP_REMOVE) ? kvf_m_remove(m, q.key)
                                                : kvf_m_exists(m, q.key);
        }
        kvf_sm_status_enc(w, st);
    }
    pthread_mutex_unlock(&m->lock);
    *count_p = f->hdr.count;
    return KVF_OK;
}

static kvf_status_t kvf_m_h_list(kvf_master_t *m, kvf_mclient_t *cl,
                                 const kvf_sp_frame_t *f, kvf_wr_t *w,
                                 uint32_t *count_p, uint16_t *flags_p)
{
    kvf_sm_list_ent_t ent;
    kvf_sm_list_t q;
    uint32_t n = 0;
    kvf_mobj_t *o;
    size_t plen, b;
    kvf_rd_t r;

    (void)cl;
    kvf_rd_init(&r, f->body, f->hdr.meta_len);
    kvf_sm_list_dec(&r, &q);
    plen = strlen(q.prefix);
    pthread_mutex_lock(&m->lock);
    for (b = 0; b < m->nbuckets; b++) {
        for (o = m->table[b]; o != NULL; o = o->hnext) {
            if (o->keylen < plen || memcmp(o->key, q.prefix, plen) != 0) {
                continue;
            }
            if ((q.max != 0 && n >= q.max) ||
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

/* Is [base, base+len) inside one region the node's engine registered? */
static kvf_status_t kvf_m_verify_node(kvf_master_t *m, const char *segment,
                                      uint64_t base, uint64_t len)
{
    char esc[KVF_LOG_KEY_MAX];
    kvf_status_t st;
    kvf_peer_h peer;
    uint64_t addr;
    size_t rlen, i;

    st = kvf_peer_open(m->engine, segment, &peer);
    if (st != KVF_OK) {
        kvf_log_rl(KVF_LOG_WARN, "node %s: cannot reach its segment: %s",
                   kvf_log_key(esc, sizeof(esc), segment), kvf_status_str(st));
        return st;
    }
    st = KVF_ERR_OUT_OF_BOUNDS;
    for (i = 0; kvf_peer_region(peer, i, &addr, &rlen, NULL) == KVF_OK; i++) {
        if (base >= addr && base - addr <= rlen &&
            len <= rlen - (base - addr)) {
            st = KVF_OK;
            break;
        }
    }
    kvf_peer_close(peer);
    if (st != KVF_OK) {
        kvf_log_rl(KVF_LOG_ERROR,
                   "node %s claims pool 0x%lx+%lu, which its segment does "
                   "not register: refused",
                   kvf_log_key(esc, sizeof(esc), segment), (unsigned long)base,
                   (unsigned long)len);
    }
    return st;
}

static kvf_status_t kvf_m_h_node_reg(kvf_master_t *m, kvf_mclient_t *cl,
                                     const kvf_sp_frame_t *f, kvf_wr_t *w,
                                     uint32_t *count_p, uint16_t *flags_p)
{
    kvf_sm_node_reg_rep_t rep;
    kvf_sm_node_reg_t q;
    uint64_t gen = 0;
    kvf_status_t st;
    kvf_rd_t r;

    (void)count_p;
    (void)flags_p;
    (void)cl;
    kvf_rd_init(&r, f->body, f->hdr.meta_len);
    kvf_sm_node_reg_dec(&r, &q);
    if (!q.has_instance) {
        kvf_log_rl(KVF_LOG_ERROR,
                   "node %s registers in the older format (no instance "
                   "id): refused; upgrade the node",
                   q.segment);
        return KVF_ERR_VERSION;
    }
    if (q.pool_len < KVF_PA_GRANULE || q.pool_addr + q.pool_len < q.pool_addr) {
        return KVF_ERR_INVALID_PARAM;
    }
    st = kvf_m_verify_node(m, q.segment, q.pool_addr, q.pool_len);
    if (st != KVF_OK) {
        return st;
    }
    pthread_mutex_lock(&m->lock);
    st = kvf_m_node_register(m, q.segment, q.uid, q.instance, q.pool_addr,
                             q.pool_len, q.inv_addr, &gen);
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

static kvf_status_t kvf_m_h_heartbeat(kvf_master_t *m, kvf_mclient_t *cl,
                                      const kvf_sp_frame_t *f, kvf_wr_t *w,
                                      uint32_t *count_p, uint16_t *flags_p)
{
    kvf_sm_heartbeat_t q;
    kvf_status_t st;
    kvf_rd_t r;

    (void)w;
    (void)count_p;
    (void)flags_p;
    (void)cl;
    kvf_rd_init(&r, f->body, f->hdr.meta_len);
    kvf_sm_heartbeat_dec(&r, &q);
    pthread_mutex_lock(&m->lock);
    st = kvf_m_heartbeat(m, q.uid, q.node_gen, q.master_epoch);
    pthread_mutex_unlock(&m->lock);
    return st;
}

/* A page of a node's inventory report: each entry rebuilt (or refused,
 * logged); the empty page ends the report and the node takes new puts. */
static kvf_status_t kvf_m_h_inv_report(kvf_master_t *m, kvf_mclient_t *cl,
                                       const kvf_sp_frame_t *f, kvf_wr_t *w,
                                       uint32_t *count_p, uint16_t *flags_p)
{
    kvf_pa_block_t *hint = NULL;
    kvf_sm_inv_ent_t e;
    kvf_mnode_t *n;
    uint64_t uid, gen;
    size_t refused = 0;
    kvf_rd_t r;
    uint32_t i;

    (void)cl;
    (void)w;
    (void)count_p;
    (void)flags_p;
    kvf_rd_init(&r, f->body, f->hdr.meta_len);
    uid = kvf_rd_u64(&r);
    gen = kvf_rd_u64(&r);
    pthread_mutex_lock(&m->lock);
    n = kvf_m_node_find(m, uid, gen);
    if (n == NULL) {
        pthread_mutex_unlock(&m->lock);
        return KVF_ERR_STALE;
    }
    for (i = 0; i < f->hdr.count; i++) {
        kvf_sm_inv_ent_dec(&r, &e);
        refused += kvf_m_rebuild_add(m, n, &e, &hint) != KVF_OK;
    }
    if (f->hdr.count == 0 && n->rebuilding) {
        n->rebuilding = 0;
        kvf_info("node %s: inventory rebuilt, %zu object(s) in all", n->segment,
                 m->nobjs);
    }
    if (refused > 0) {
        kvf_warn("node %s: %zu inventory entr%s refused", n->segment, refused,
                 refused == 1 ? "y" : "ies");
    }
    pthread_mutex_unlock(&m->lock);
    return KVF_OK;
}

static kvf_m_handler_t kvf_m_handler(uint8_t type)
{
    switch (type) {
    case KVF_SP_NODE_REG:
        return kvf_m_h_node_reg;
    case KVF_SP_HEARTBEAT:
        return kvf_m_h_heartbeat;
    case KVF_SP_PUT_START:
        return kvf_m_h_put_start;
    case KVF_SP_PUT_END:
        return kvf_m_h_put_end;
    case KVF_SP_COMMIT:
        return kvf_m_h_commit;
    case KVF_SP_GET:
        return kvf_m_h_get;
    case KVF_SP_REMOVE:
    case KVF_SP_EXISTS:
        return kvf_m_h_keys;
    case KVF_SP_LIST:
        return kvf_m_h_list;
    case KVF_SP_INV_REPORT:
        return kvf_m_h_inv_report;
    default:
        return NULL;
    }
}

void kvf_m_count_error(kvf_master_t *m)
{
    pthread_mutex_lock(&m->lock);
    m->st.errors++;
    pthread_mutex_unlock(&m->lock);
}

kvf_status_t kvf_m_serve(kvf_master_t *m, kvf_mclient_t *cl,
                         const kvf_sp_frame_t *f, kvf_wr_t *w,
                         uint32_t *count_p, uint16_t *flags_p, uint8_t *rtype_p)
{
    kvf_m_handler_t h = kvf_m_handler(f->hdr.type);
    kvf_status_t st;

    w->len = 0;
    w->failed = 0;
    *count_p = 0;
    *flags_p = 0;
    if (h == NULL) {
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
    st = kvf_sm_req_check(f->hdr.type, f->hdr.count, f->body, f->hdr.meta_len);
    if (st == KVF_OK) {
        st = h(m, cl, f, w, count_p, flags_p);
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

static void *kvf_m_reaper_main(void *arg)
{
    kvf_master_t *m = arg;
    struct timespec ts;
    int tick = 100;

    if (m->opts.put_timeout_ms / 4 < (uint64_t)tick) {
        tick = (int)(m->opts.put_timeout_ms / 4) + 1;
    }
    pthread_mutex_lock(&m->lock);
    while (!m->stop) {
        kvf_m_tick(m);
        kvf_time_abs_after(&ts, tick);
        pthread_cond_timedwait(&m->stop_cond, &m->lock, &ts);
    }
    pthread_mutex_unlock(&m->lock);
    return NULL;
}

/* The RPC listeners: tcp at `listen`, and the same framed protocol over
 * an abstract unix socket for clients on this host (no TCP stack on
 * either side); tcp alone if that fails. */
static kvf_status_t kvf_m_listen(kvf_master_t *m, const char *listen)
{
    char host[KVF_HOST_MAX];
    kvf_status_t st;
    uint16_t port;

    st = kvf_sock_parse_addr(listen, host, sizeof(host), &port);
    if (st == KVF_OK) {
        st = kvf_auth_check_bind(host);
    }
    if (st == KVF_OK) {
        st = kvf_sock_listen(host, port, 256, &m->lfd, &port);
    }
    if (st != KVF_OK) {
        kvf_error("master cannot listen on %s", listen);
        return st;
    }
    snprintf(m->address, sizeof(m->address), "%s:%u", host, port);
    if (kvf_sp_unix_name(host, port, 1, m->unix_name, sizeof(m->unix_name)) &&
        kvf_sp_unix_listen(m->unix_name, 256, &m->ufd) != KVF_OK) {
        m->unix_name[0] = '\0';
    }
    /* with etcd: stand for leader at the address just bound */
    st = kvf_m_leader_start(m);
    if (st != KVF_OK) {
        close(m->lfd);
        if (m->ufd >= 0) {
            close(m->ufd);
        }
    }
    return st;
}

/* A single master's epoch: random, the leader bit clear (leader.c sets
 * a leader's); put ids start from it so they differ across restarts. */
static void kvf_m_first_epoch(kvf_master_t *m)
{
    m->epoch = kvf_hash64(&m, sizeof(m), kvf_time_ns() ^ (uint64_t)getpid());
    m->epoch = (m->epoch | 1) & ~KVF_M_HA_EPOCH;
    m->next_put_id = (m->epoch & 0xffffffffull) << 32;
}

/* The connection caps, the inventory channels and the event loops. */
static kvf_status_t kvf_m_serving_start(kvf_master_t *m)
{
    kvf_status_t st = kvf_m_caps_init(m);

    if (st == KVF_OK) {
        st = kvf_m_inv_start(m);
    }
    if (st == KVF_OK) {
        st = kvf_m_loop_start(m);
    }
    if (st != KVF_OK) {
        kvf_m_inv_stop(m);
        kvf_m_caps_fini(m);
    }
    return st;
}

kvf_status_t kvf_master_start(const kvf_master_opts_t *opts,
                              kvf_master_t **master_p)
{
    kvf_engine_params_t ep = {0};
    kvf_master_t *m;
    kvf_status_t st;

    if (opts->high_watermark <= 0 || opts->high_watermark > 1 ||
        opts->low_watermark > opts->high_watermark ||
        opts->replicas > KVF_STORE_REPLICA_MAX || opts->node_ttl_ms == 0 ||
        opts->heartbeat_ms == 0 || opts->io_timeout_ms == 0 ||
        opts->loops > KVF_MASTER_LOOPS_MAX) {
        kvf_error("bad master options: watermarks %.2f/%.2f, replicas %u, "
                  "ttl %lu ms, heartbeat %lu ms, loops %u",
                  opts->low_watermark, opts->high_watermark, opts->replicas,
                  (unsigned long)opts->node_ttl_ms,
                  (unsigned long)opts->heartbeat_ms, opts->loops);
        return KVF_ERR_INVALID_PARAM;
    }
    m = kvf_calloc(1, sizeof(*m));
    if (m == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    m->opts = *opts;
    m->opts.http = NULL;
    m->opts.listen = NULL;
    m->lfd = m->hfd = m->ufd = -1;
    kvf_m_first_epoch(m);
    pthread_mutex_init(&m->lock, NULL);
    kvf_cond_init(&m->stop_cond);
    st = kvf_m_init(m);
    if (st != KVF_OK) {
        goto err_free;
    }
    ep.field_mask = KVF_ENGINE_PARAM_NO_LISTEN | KVF_ENGINE_PARAM_TIMEOUT |
                    KVF_ENGINE_PARAM_CONNS | KVF_ENGINE_PARAM_TRANSPORTS;
    ep.no_listen = 1;
    ep.conns = 1;
    ep.transports = "tcp";
    ep.timeout_ms = opts->io_timeout_ms;
    st = kvf_engine_create(&ep, &m->engine);
    if (st != KVF_OK) {
        goto err_meta;
    }
    st = kvf_m_listen(m, opts->listen);
    if (st != KVF_OK) {
        goto err_engine;
    }
    if (opts->http != NULL && opts->http[0] != '\0' &&
        strcmp(opts->http, "off") != 0) {
        st = kvf_m_http_start(m, opts->http);
        if (st != KVF_OK) {
            goto err_leader;
        }
    }
    if (pthread_create(&m->reaper_thread, NULL, kvf_m_reaper_main, m) != 0) {
        st = KVF_ERR_NO_RESOURCE;
        goto err_http;
    }
    st = kvf_m_serving_start(m);
    if (st != KVF_OK) {
        goto err_reaper;
    }
    kvf_info("store master on %s (unix %s%s, http %s), %u loop(s), epoch "
             "%016lx",
             m->address, m->ufd >= 0 ? "@" : "",
             m->ufd >= 0 ? m->unix_name : "off",
             m->have_http ? m->http_address : "off", m->nloops,
             (unsigned long)m->epoch);
    *master_p = m;
    return KVF_OK;

err_reaper:
    pthread_mutex_lock(&m->lock);
    m->stop = 1;
    pthread_cond_broadcast(&m->stop_cond);
    pthread_mutex_unlock(&m->lock);
    pthread_join(m->reaper_thread, NULL);
err_http:
    kvf_m_http_stop(m);
err_leader:
    kvf_m_leader_stop(m);
    close(m->lfd);
    if (m->ufd >= 0) {
        close(m->ufd);
    }
err_engine:
    kvf_engine_destroy(m->engine);
err_meta:
    kvf_m_fini(m);
err_free:
    pthread_cond_destroy(&m->stop_cond);
    pthread_mutex_destroy(&m->lock);
    kvf_free(m);
    return st;
}

void kvf_master_stop(kvf_master_t *m)
{
    if (m == NULL) {
        return;
    }
    kvf_m_leader_stop(m); /* resign first: a standby takes over */
    pthread_mutex_lock(&m->lock);
    __atomic_store_n(&m->stop, 1, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&m->stop_cond);
    pthread_mutex_unlock(&m->lock);
    pthread_join(m->reaper_thread, NULL);
    kvf_m_loop_stop(m);
    kvf_m_inv_stop(m); /* after the workers: they wait on it */
    kvf_m_caps_fini(m);
    kvf_m_http_stop(m);
    close(m->lfd);
    if (m->ufd >= 0) {
        close(m->ufd);
    }
    kvf_engine_destroy(m->engine);
    pthread_mutex_lock(&m->lock);
    kvf_m_fini(m);
    pthread_mutex_unlock(&m->lock);
    pthread_cond_destroy(&m->stop_cond);
    pthread_mutex_destroy(&m->lock);
    kvf_free(m);
}

const char *kvf_master_address(const kvf_master_t *m)
{
    return m->address;
}

const char *kvf_master_http_address(const kvf_master_t *m)
{
    return m->have_http ? m->http_address : "";
}
