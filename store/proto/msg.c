/*
 * Store RPC messages: encoders and decoders of every body msg.h
 * describes, over core/wire.h's reader and writer. Each function follows
 * its message's schema field by field, in order; checking a body's
 * shape is the decoders run over it (kvf_sm_req_check).
 */
#include "store/proto/msg.h"

#include <string.h>

/* ---- shared pieces ---- */

static void kvf_sm_reps_enc(kvf_wr_t *w, const kvf_sm_obj_t *o)
{
    unsigned i;

    kvf_wr_u8(w, (uint8_t)o->nrep);
    for (i = 0; i < o->nrep; i++) {
        kvf_wr_str(w, o->seg[i]);
        kvf_wr_u64(w, o->addr[i]);
    }
}

static void kvf_sm_reps_dec(kvf_rd_t *r, kvf_sm_obj_t *o)
{
    unsigned i;

    o->nrep = kvf_rd_u8(r);
    if (o->nrep > KVF_STORE_REPLICA_MAX) {
        r->failed = 1;
        o->nrep = 0;
    }
    for (i = 0; i < o->nrep; i++) {
        kvf_rd_str(r, o->seg[i], sizeof(o->seg[i]));
        o->addr[i] = kvf_rd_u64(r);
    }
}

static void kvf_sm_req_key_dec(kvf_rd_t *r, kvf_sm_req_t *q)
{
    q->key_status = kvf_sp_rd_key(r, q->keybuf);
    q->key = q->keybuf;
}

void kvf_sm_status_enc(kvf_wr_t *w, kvf_status_t status)
{
    kvf_wr_u32(w, (uint32_t)status);
}

kvf_status_t kvf_sm_status_dec(kvf_rd_t *r)
{
    return (kvf_status_t)(int32_t)kvf_rd_u32(r);
}

/* ---- keyed requests ---- */

void kvf_sm_key_enc(kvf_wr_t *w, const char *key)
{
    kvf_wr_str(w, key);
}

void kvf_sm_key_dec(kvf_rd_t *r, kvf_sm_req_t *q)
{
    kvf_sm_req_key_dec(r, q);
}

void kvf_sm_put_start_enc(kvf_wr_t *w, const kvf_sm_req_t *q)
{
    kvf_wr_str(w, q->key);
    kvf_wr_u64(w, q->size);
    kvf_wr_u8(w, q->replicas);
    kvf_wr_u8(w, q->flags);
}

void kvf_sm_put_start_dec(kvf_rd_t *r, kvf_sm_req_t *q)
{
    kvf_sm_req_key_dec(r, q);
    q->size = kvf_rd_u64(r);
    q->replicas = kvf_rd_u8(r);
    q->flags = kvf_rd_u8(r);
}

void kvf_sm_put_end_enc(kvf_wr_t *w, const kvf_sm_req_t *q)
{
    kvf_wr_str(w, q->key);
    kvf_wr_u64(w, q->put_id);
    kvf_wr_u64(w, q->checksum);
    kvf_wr_u8(w, q->mask);
}

void kvf_sm_put_end_dec(kvf_rd_t *r, kvf_sm_req_t *q)
{
    kvf_sm_req_key_dec(r, q);
    q->put_id = kvf_rd_u64(r);
    q->checksum = kvf_rd_u64(r);
    q->mask = kvf_rd_u8(r);
}

void kvf_sm_commit_enc(kvf_wr_t *w, const kvf_sm_req_t *q)
{
    kvf_wr_str(w, q->key);
    kvf_wr_u64(w, q->put_id);
    kvf_wr_u64(w, q->size);
    kvf_wr_u64(w, q->checksum);
    kvf_wr_u8(w, q->mask);
    kvf_wr_u8(w, q->flags);
    kvf_wr_u64(w, q->next_size);
    kvf_wr_u8(w, q->next_replicas);
}

void kvf_sm_commit_dec(kvf_rd_t *r, kvf_sm_req_t *q)
{
    kvf_sm_req_key_dec(r, q);
    q->put_id = kvf_rd_u64(r);
    q->size = kvf_rd_u64(r);
    q->checksum = kvf_rd_u64(r);
    q->mask = kvf_rd_u8(r);
    q->flags = kvf_rd_u8(r);
    q->next_size = kvf_rd_u64(r);
    q->next_replicas = kvf_rd_u8(r);
}

kvf_status_t kvf_sm_req_dec(kvf_rd_t *r, uint8_t type, kvf_sm_req_t *q)
{
    switch (type) {
    case KVF_SP_PUT_START:
        kvf_sm_put_start_dec(r, q);
        return KVF_OK;
    case KVF_SP_PUT_END:
        kvf_sm_put_end_dec(r, q);
        return KVF_OK;
    case KVF_SP_COMMIT:
        kvf_sm_commit_dec(r, q);
        return KVF_OK;
    case KVF_SP_GET:
    case KVF_SP_REMOVE:
    case KVF_SP_EXISTS:
        kvf_sm_key_dec(r, q);
        return KVF_OK;
    default:
        return KVF_ERR_PROTOCOL;
    }
}

/* ---- keyed replies ---- */

void kvf_sm_put_start_rep_enc(kvf_wr_t *w, const kvf_sm_obj_t *o)
{
    kvf_sm_status_enc(w, o->status);
    kvf_wr_u64(w, o->put_id);
    kvf_sm_reps_enc(w, o);
}

void kvf_sm_put_start_rep_dec(kvf_rd_t *r, kvf_sm_obj_t *o)
{
    o->status = kvf_sm_status_dec(r);
    o->put_id = kvf_rd_u64(r);
    kvf_sm_reps_dec(r, o);
}

void kvf_sm_get_rep_enc(kvf_wr_t *w, const kvf_sm_obj_t *o)
{
    kvf_sm_status_enc(w, o->status);
    kvf_wr_u64(w, o->size);
    kvf_wr_u64(w, o->checksum);
    kvf_wr_u32(w, o->lease_ms);
    kvf_sm_reps_enc(w, o);
}

void kvf_sm_get_rep_dec(kvf_rd_t *r, kvf_sm_obj_t *o)
{
    o->status = kvf_sm_status_dec(r);
    o->size = kvf_rd_u64(r);
    o->checksum = kvf_rd_u64(r);
    o->lease_ms = kvf_rd_u32(r);
    kvf_sm_reps_dec(r, o);
    if (o->status == KVF_OK && o->nrep == 0) {
        o->status = KVF_ERR_NOT_FOUND;
    }
}

void kvf_sm_commit_rep_enc(kvf_wr_t *w, const kvf_sm_obj_t *o)
{
    kvf_sm_status_enc(w, o->status);
    kvf_wr_u32(w, o->put_timeout_ms);
    kvf_wr_u64(w, o->put_id);
    kvf_sm_reps_enc(w, o);
}

void kvf_sm_commit_rep_dec(kvf_rd_t *r, kvf_sm_obj_t *o)
{
    o->status = kvf_sm_status_dec(r);
    o->put_timeout_ms = kvf_rd_u32(r);
    o->put_id = kvf_rd_u64(r);
    kvf_sm_reps_dec(r, o);
}

/* ---- whole-body messages ---- */

void kvf_sm_node_reg_enc(kvf_wr_t *w, const kvf_sm_node_reg_t *m)
{
    kvf_wr_str(w, m->segment);
    kvf_wr_u64(w, m->uid);
    kvf_wr_u64(w, m->pool_addr);
    kvf_wr_u64(w, m->pool_len);
    kvf_wr_bytes(w, m->instance, KVF_SM_INSTANCE_LEN);
    if (m->inv_addr[0] != '\0' || m->disk_len > 0) {
        kvf_wr_str(w, m->inv_addr);
    }
    if (m->disk_len > 0) {
        kvf_wr_u64(w, m->disk_len);
    }
}

void kvf_sm_node_reg_dec(kvf_rd_t *r, kvf_sm_node_reg_t *m)
{
    const void *inst;

    kvf_rd_str(r, m->segment, sizeof(m->segment));
    m->uid = kvf_rd_u64(r);
    m->pool_addr = kvf_rd_u64(r);
    m->pool_len = kvf_rd_u64(r);
    m->has_instance = 0;
    memset(m->instance, 0, sizeof(m->instance));
    if (kvf_rd_left(r) > 0) { /* absent in the older format */
        inst = kvf_rd_bytes(r, KVF_SM_INSTANCE_LEN);
        if (inst != NULL) {
            memcpy(m->instance, inst, KVF_SM_INSTANCE_LEN);
            m->has_instance = 1;
        }
    }
    m->inv_addr[0] = '\0';
    if (kvf_rd_left(r) > 0) { /* absent: a node without an inventory */
        kvf_rd_str(r, m->inv_addr, sizeof(m->inv_addr));
    }
    m->disk_len = 0;
    if (kvf_rd_left(r) > 0) { /* absent: a node without a disk tier */
        m->disk_len = kvf_rd_u64(r);
    }
}

void kvf_sm_node_reg_rep_enc(kvf_wr_t *w, const kvf_sm_node_reg_rep_t *m)
{
    kvf_wr_u64(w, m->master_epoch);
    kvf_wr_u64(w, m->node_gen);
    kvf_wr_u32(w, m->heartbeat_ms);
    kvf_wr_u32(w, m->ttl_ms);
}

void kvf_sm_node_reg_rep_dec(kvf_rd_t *r, kvf_sm_node_reg_rep_t *m)
{
    m->master_epoch = kvf_rd_u64(r);
    m->node_gen = kvf_rd_u64(r);
    m->heartbeat_ms = kvf_rd_u32(r);
    m->ttl_ms = kvf_rd_u32(r);
}

void kvf_sm_heartbeat_enc(kvf_wr_t *w, const kvf_sm_heartbeat_t *m)
{
    kvf_wr_u64(w, m->uid);
    kvf_wr_u64(w, m->node_gen);
    kvf_wr_u64(w, m->master_epoch);
}

void kvf_sm_heartbeat_dec(kvf_rd_t *r, kvf_sm_heartbeat_t *m)
{
    m->uid = kvf_rd_u64(r);
    m->node_gen = kvf_rd_u64(r);
    m->master_epoch = kvf_rd_u64(r);
}

void kvf_sm_list_enc(kvf_wr_t *w, const kvf_sm_list_t *m)
{
    kvf_wr_str(w, m->prefix);
    kvf_wr_u32(w, m->max);
}

void kvf_sm_list_dec(kvf_rd_t *r, kvf_sm_list_t *m)
{
    kvf_rd_str(r, m->prefix, sizeof(m->prefix));
    m->max = kvf_rd_u32(r);
}

void kvf_sm_list_ent_enc(kvf_wr_t *w, const kvf_sm_list_ent_t *e)
{
    kvf_wr_str(w, e->key);
    kvf_wr_u64(w, e->size);
    kvf_wr_u8(w, e->committed);
    kvf_wr_u8(w, e->nrep);
}

void kvf_sm_list_ent_dec(kvf_rd_t *r, kvf_sm_list_ent_t *e)
{
    kvf_rd_str(r, e->keybuf, sizeof(e->keybuf));
    e->key = e->keybuf;
    e->size = kvf_rd_u64(r);
    e->committed = kvf_rd_u8(r);
    e->nrep = kvf_rd_u8(r);
}

void kvf_sm_node_ent_enc(kvf_wr_t *w, const kvf_sm_node_ent_t *e)
{
    kvf_wr_str(w, e->segment);
    kvf_wr_u64(w, e->pool_addr);
    kvf_wr_u64(w, e->pool_len);
}

void kvf_sm_node_ent_dec(kvf_rd_t *r, kvf_sm_node_ent_t *e)
{
    kvf_rd_str(r, e->segment, sizeof(e->segment));
    e->pool_addr = kvf_rd_u64(r);
    e->pool_len = kvf_rd_u64(r);
}

void kvf_sm_inv_ent_enc(kvf_wr_t *w, const kvf_sm_inv_ent_t *e)
{
    kvf_wr_str(w, e->key);
    kvf_wr_u64(w, e->off);
    kvf_wr_u64(w, e->size);
    kvf_wr_u64(w, e->checksum);
    kvf_wr_u64(w, e->epoch);
    kvf_wr_u64(w, e->seq);
    kvf_wr_u8(w, e->flags);
}

void kvf_sm_inv_ent_dec(kvf_rd_t *r, kvf_sm_inv_ent_t *e)
{
    kvf_rd_str(r, e->keybuf, sizeof(e->keybuf));
    e->key = e->keybuf;
    e->off = kvf_rd_u64(r);
    e->size = kvf_rd_u64(r);
    e->checksum = kvf_rd_u64(r);
    e->epoch = kvf_rd_u64(r);
    e->seq = kvf_rd_u64(r);
    e->flags = kvf_rd_u8(r);
}

kvf_status_t kvf_sm_inv_check(uint8_t type, uint32_t count, const void *body,
                              size_t len)
{
    kvf_sm_inv_ent_t e;
    kvf_rd_t r;
    uint32_t i;

    if (count > KVF_STORE_BATCH_MAX ||
        (type != KVF_SP_INV_ADD && type != KVF_SP_INV_DEL &&
         type != KVF_SP_INV_REPORT) ||
        (count == 0 && type != KVF_SP_INV_REPORT)) {
        return KVF_ERR_PROTOCOL;
    }
    kvf_rd_init(&r, body, len);
    if (type == KVF_SP_INV_REPORT) {
        (void)kvf_rd_u64(&r); /* uid */
        (void)kvf_rd_u64(&r); /* node_gen */
        if (kvf_rd_status(&r) != KVF_OK) {
            return KVF_ERR_PROTOCOL;
        }
    }
    for (i = 0; i < count; i++) {
        kvf_sm_inv_ent_dec(&r, &e);
        if (kvf_rd_status(&r) != KVF_OK || e.keybuf[0] == '\0') {
            return KVF_ERR_PROTOCOL;
        }
    }
    return kvf_rd_left(&r) == 0 ? KVF_OK : KVF_ERR_PROTOCOL;
}

void kvf_sm_tier_op_enc(kvf_wr_t *w, const kvf_sm_tier_op_t *o)
{
    kvf_wr_u8(w, o->op);
    kvf_wr_str(w, o->key);
    kvf_wr_u64(w, o->pool_off);
    kvf_wr_u64(w, o->disk_off);
    kvf_wr_u64(w, o->size);
    kvf_wr_u64(w, o->checksum);
    kvf_wr_u64(w, o->seq);
    kvf_wr_u8(w, o->flags);
}

void kvf_sm_tier_op_dec(kvf_rd_t *r, kvf_sm_tier_op_t *o)
{
    o->op = kvf_rd_u8(r);
    kvf_rd_str(r, o->keybuf, sizeof(o->keybuf));
    o->key = o->keybuf;
    o->pool_off = kvf_rd_u64(r);
    o->disk_off = kvf_rd_u64(r);
    o->size = kvf_rd_u64(r);
    o->checksum = kvf_rd_u64(r);
    o->seq = kvf_rd_u64(r);
    o->flags = kvf_rd_u8(r);
    o->status = KVF_OK;
}

kvf_status_t kvf_sm_tier_check(uint32_t count, const void *body, size_t len)
{
    kvf_sm_tier_op_t o;
    kvf_rd_t r;
    uint32_t i;

    if (count == 0 || count > KVF_STORE_BATCH_MAX) {
        return KVF_ERR_PROTOCOL;
    }
    kvf_rd_init(&r, body, len);
    for (i = 0; i < count; i++) {
        kvf_sm_tier_op_dec(&r, &o);
        if (kvf_rd_status(&r) != KVF_OK || o.keybuf[0] == '\0' ||
            o.op < KVF_TIER_WRITE || o.op > KVF_TIER_DROP) {
            return KVF_ERR_PROTOCOL;
        }
    }
    return kvf_rd_left(&r) == 0 ? KVF_OK : KVF_ERR_PROTOCOL;
}

/* ---- shape checks ---- */

/* Decodes one whole-body request into scratch space; 0 if type has
 * none. */
static int kvf_sm_whole_dec(kvf_rd_t *r, uint8_t type)
{
    union {
        kvf_sm_node_reg_t reg;
        kvf_sm_heartbeat_t hb;
        kvf_sm_list_t list;
    } u;

    switch (type) {
    case KVF_SP_NODE_REG:
        kvf_sm_node_reg_dec(r, &u.reg);
        return 1;
    case KVF_SP_HEARTBEAT:
        kvf_sm_heartbeat_dec(r, &u.hb);
        return 1;
    case KVF_SP_LIST:
        kvf_sm_list_dec(r, &u.list);
        return 1;
    case KVF_SP_NODES: /* an empty body */
        return 1;
    default:
        return 0;
    }
}

kvf_status_t kvf_sm_req_check(uint8_t type, uint32_t count, const void *body,
                              size_t len)
{
    kvf_sm_req_t q;
    kvf_status_t st = KVF_OK;
    kvf_rd_t r;
    uint32_t i;

    if (type >= KVF_SP_INV_ADD && type <= KVF_SP_INV_REPORT) {
        return kvf_sm_inv_check(type, count, body, len);
    }
    if (type == KVF_SP_TIER_OP) {
        return kvf_sm_tier_check(count, body, len);
    }
    kvf_rd_init(&r, body, len);
    if (!kvf_sm_whole_dec(&r, type)) {
        if (count > KVF_STORE_BATCH_MAX ||
            kvf_sm_req_dec(&r, type, &q) != KVF_OK) {
            return KVF_ERR_PROTOCOL; /* no keyed type either */
        }
        kvf_rd_init(&r, body, len);
        for (i = 0; i < count && st == KVF_OK; i++) {
            st = kvf_sm_req_dec(&r, type, &q);
        }
    }
    if (st != KVF_OK || kvf_rd_status(&r) != KVF_OK || kvf_rd_left(&r) != 0) {
        return KVF_ERR_PROTOCOL;
    }
    return KVF_OK;
}

kvf_status_t kvf_sm_rep_end(const kvf_rd_t *r, uint32_t count, uint32_t want)
{
    if (count != want) {
        return KVF_ERR_PROTOCOL;
    }
    return kvf_rd_status(r);
}
