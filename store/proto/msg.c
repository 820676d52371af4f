/*
 * Store RPC messages: the schema of every struct of msg.h, declared once
 * (the fields in wire order, schema.h), and the table of requests: which
 * entries a request body holds and how many. The one codec (codec.c)
 * reads and writes them all; the functions of msg.h are its schemas
 * named.
 */
#include "store/proto/msg.h"
#include "store/proto/schema.h"

#include <string.h>

/* ---- keyed requests (kvf_sm_req_t) ---- */

#define REQ_KEY KVF_SMF_KEYFIELD(kvf_sm_req_t, key, keybuf, key_status)

static const kvf_sm_field_t kvf_smf_key[] = {REQ_KEY};
static const kvf_sm_field_t kvf_smf_put_start[] = {
    REQ_KEY, KVF_SMF(KVF_SMF_U64, kvf_sm_req_t, size),
    KVF_SMF(KVF_SMF_U8, kvf_sm_req_t, replicas),
    KVF_SMF(KVF_SMF_U8, kvf_sm_req_t, flags)};
static const kvf_sm_field_t kvf_smf_put_end[] = {
    REQ_KEY, KVF_SMF(KVF_SMF_U64, kvf_sm_req_t, put_id),
    KVF_SMF(KVF_SMF_U64, kvf_sm_req_t, checksum),
    KVF_SMF(KVF_SMF_U8, kvf_sm_req_t, mask)};
static const kvf_sm_field_t kvf_smf_commit[] = {
    REQ_KEY,
    KVF_SMF(KVF_SMF_U64, kvf_sm_req_t, put_id),
    KVF_SMF(KVF_SMF_U64, kvf_sm_req_t, size),
    KVF_SMF(KVF_SMF_U64, kvf_sm_req_t, checksum),
    KVF_SMF(KVF_SMF_U8, kvf_sm_req_t, mask),
    KVF_SMF(KVF_SMF_U8, kvf_sm_req_t, flags),
    KVF_SMF(KVF_SMF_U64, kvf_sm_req_t, next_size),
    KVF_SMF(KVF_SMF_U8, kvf_sm_req_t, next_replicas)};

const kvf_sm_schema_t kvf_sm_s_key = KVF_SM_SCHEMA("key", kvf_smf_key, NULL);
const kvf_sm_schema_t kvf_sm_s_put_start =
    KVF_SM_SCHEMA("put-start", kvf_smf_put_start, NULL);
const kvf_sm_schema_t kvf_sm_s_put_end =
    KVF_SM_SCHEMA("put-end", kvf_smf_put_end, NULL);
const kvf_sm_schema_t kvf_sm_s_commit =
    KVF_SM_SCHEMA("commit", kvf_smf_commit, NULL);

/* ---- keyed replies (kvf_sm_obj_t) ---- */

#define OBJ(kind, f) KVF_SMF(kind, kvf_sm_obj_t, f)
#define OBJ_REPS     {KVF_SMF_REPS, 0, 0, 0, 0, 0, 0, 0}

static const kvf_sm_field_t kvf_smf_put_start_rep[] = {
    OBJ(KVF_SMF_STATUS, status), OBJ(KVF_SMF_U64, put_id), OBJ_REPS};
static const kvf_sm_field_t kvf_smf_get_rep[] = {
    OBJ(KVF_SMF_STATUS, status), OBJ(KVF_SMF_U64, size),
    OBJ(KVF_SMF_U64, checksum), OBJ(KVF_SMF_U32, lease_ms), OBJ_REPS};
static const kvf_sm_field_t kvf_smf_commit_rep[] = {
    OBJ(KVF_SMF_STATUS, status), OBJ(KVF_SMF_U32, put_timeout_ms),
    OBJ(KVF_SMF_U64, put_id), OBJ_REPS};

/* A GET answer naming no replica cannot be read: not found. */
static void kvf_sm_get_rep_fix(void *msg)
{
    kvf_sm_obj_t *o = msg;

    if (o->status == KVF_OK && o->nrep == 0) {
        o->status = KVF_ERR_NOT_FOUND;
    }
}

const kvf_sm_schema_t kvf_sm_s_put_start_rep =
    KVF_SM_SCHEMA("put-start reply", kvf_smf_put_start_rep, NULL);
const kvf_sm_schema_t kvf_sm_s_get_rep =
    KVF_SM_SCHEMA("get reply", kvf_smf_get_rep, kvf_sm_get_rep_fix);
const kvf_sm_schema_t kvf_sm_s_commit_rep =
    KVF_SM_SCHEMA("commit reply", kvf_smf_commit_rep, NULL);

/* ---- whole-body messages and the other entries ---- */

static const kvf_sm_field_t kvf_smf_node_reg[] = {
    KVF_SMF_STRING(kvf_sm_node_reg_t, segment, 0),
    KVF_SMF(KVF_SMF_U64, kvf_sm_node_reg_t, uid),
    KVF_SMF(KVF_SMF_U64, kvf_sm_node_reg_t, pool_addr),
    KVF_SMF(KVF_SMF_U64, kvf_sm_node_reg_t, pool_len),
    /* absent in the older format, which the master refuses */
    KVF_SMF_RAW(kvf_sm_node_reg_t, instance, KVF_SMF_OPT, has_instance),
    /* absent: a node without an inventory server, without a disk tier */
    KVF_SMF_STRING(kvf_sm_node_reg_t, inv_addr, KVF_SMF_OPT),
    KVF_SMF_OPTIONAL(KVF_SMF_U64, kvf_sm_node_reg_t, disk_len)};
static const kvf_sm_field_t kvf_smf_node_reg_rep[] = {
    KVF_SMF(KVF_SMF_U64, kvf_sm_node_reg_rep_t, master_epoch),
    KVF_SMF(KVF_SMF_U64, kvf_sm_node_reg_rep_t, node_gen),
    KVF_SMF(KVF_SMF_U32, kvf_sm_node_reg_rep_t, heartbeat_ms),
    KVF_SMF(KVF_SMF_U32, kvf_sm_node_reg_rep_t, ttl_ms)};
static const kvf_sm_field_t kvf_smf_heartbeat[] = {
    KVF_SMF(KVF_SMF_U64, kvf_sm_heartbeat_t, uid),
    KVF_SMF(KVF_SMF_U64, kvf_sm_heartbeat_t, node_gen),
    KVF_SMF(KVF_SMF_U64, kvf_sm_heartbeat_t, master_epoch)};
static const kvf_sm_field_t kvf_smf_list[] = {
    KVF_SMF_STRING(kvf_sm_list_t, prefix, 0),
    KVF_SMF(KVF_SMF_U32, kvf_sm_list_t, max)};
static const kvf_sm_field_t kvf_smf_list_ent[] = {
    KVF_SMF_STRPTR(kvf_sm_list_ent_t, key, keybuf, 0),
    KVF_SMF(KVF_SMF_U64, kvf_sm_list_ent_t, size),
    KVF_SMF(KVF_SMF_U8, kvf_sm_list_ent_t, committed),
    KVF_SMF(KVF_SMF_U8, kvf_sm_list_ent_t, nrep)};
static const kvf_sm_field_t kvf_smf_node_ent[] = {
    KVF_SMF_STRING(kvf_sm_node_ent_t, segment, 0),
    KVF_SMF(KVF_SMF_U64, kvf_sm_node_ent_t, pool_addr),
    KVF_SMF(KVF_SMF_U64, kvf_sm_node_ent_t, pool_len)};
static const kvf_sm_field_t kvf_smf_inv_ent[] = {
    KVF_SMF_STRPTR(kvf_sm_inv_ent_t, key, keybuf, KVF_SMF_NONEMPTY),
    KVF_SMF(KVF_SMF_U64, kvf_sm_inv_ent_t, off),
    KVF_SMF(KVF_SMF_U64, kvf_sm_inv_ent_t, size),
    KVF_SMF(KVF_SMF_U64, kvf_sm_inv_ent_t, checksum),
    KVF_SMF(KVF_SMF_U64, kvf_sm_inv_ent_t, epoch),
    KVF_SMF(KVF_SMF_U64, kvf_sm_inv_ent_t, seq),
    KVF_SMF(KVF_SMF_U8, kvf_sm_inv_ent_t, flags)};
static const kvf_sm_field_t kvf_smf_inv_head[] = {
    KVF_SMF(KVF_SMF_U64, kvf_sm_inv_head_t, uid),
    KVF_SMF(KVF_SMF_U64, kvf_sm_inv_head_t, node_gen)};
static const kvf_sm_field_t kvf_smf_tier_op[] = {
    KVF_SMF_RANGE(kvf_sm_tier_op_t, op, KVF_TIER_WRITE, KVF_TIER_DROP),
    KVF_SMF_STRPTR(kvf_sm_tier_op_t, key, keybuf, KVF_SMF_NONEMPTY),
    KVF_SMF(KVF_SMF_U64, kvf_sm_tier_op_t, pool_off),
    KVF_SMF(KVF_SMF_U64, kvf_sm_tier_op_t, disk_off),
    KVF_SMF(KVF_SMF_U64, kvf_sm_tier_op_t, size),
    KVF_SMF(KVF_SMF_U64, kvf_sm_tier_op_t, checksum),
    KVF_SMF(KVF_SMF_U64, kvf_sm_tier_op_t, seq),
    KVF_SMF(KVF_SMF_U8, kvf_sm_tier_op_t, flags)};
static const kvf_sm_field_t kvf_smf_status[] = {
    KVF_SMF(KVF_SMF_STATUS, kvf_sm_status_t, status)};

const kvf_sm_schema_t kvf_sm_s_node_reg =
    KVF_SM_SCHEMA("node-register", kvf_smf_node_reg, NULL);
const kvf_sm_schema_t kvf_sm_s_node_reg_rep =
    KVF_SM_SCHEMA("node-register reply", kvf_smf_node_reg_rep, NULL);
const kvf_sm_schema_t kvf_sm_s_heartbeat =
    KVF_SM_SCHEMA("heartbeat", kvf_smf_heartbeat, NULL);
const kvf_sm_schema_t kvf_sm_s_list = KVF_SM_SCHEMA("list", kvf_smf_list, NULL);
const kvf_sm_schema_t kvf_sm_s_list_ent =
    KVF_SM_SCHEMA("list entry", kvf_smf_list_ent, NULL);
const kvf_sm_schema_t kvf_sm_s_node_ent =
    KVF_SM_SCHEMA("node entry", kvf_smf_node_ent, NULL);
const kvf_sm_schema_t kvf_sm_s_inv_ent =
    KVF_SM_SCHEMA("inventory entry", kvf_smf_inv_ent, NULL);
const kvf_sm_schema_t kvf_sm_s_inv_head =
    KVF_SM_SCHEMA("inventory report", kvf_smf_inv_head, NULL);
const kvf_sm_schema_t kvf_sm_s_tier_op =
    KVF_SM_SCHEMA("tier operation", kvf_smf_tier_op, NULL);
const kvf_sm_schema_t kvf_sm_s_status =
    KVF_SM_SCHEMA("status", kvf_smf_status, NULL);

/* ---- requests: what each body holds ---- */

typedef struct kvf_sm_msg {
    uint8_t type;
    const kvf_sm_schema_t *head;  /* once, first (NULL: none) */
    const kvf_sm_schema_t *entry; /* `count` of them (NULL: none) */
    uint32_t min;                 /* entries at least */
} kvf_sm_msg_t;

static const kvf_sm_msg_t kvf_sm_msgs[] = {
    {KVF_SP_NODE_REG, &kvf_sm_s_node_reg, NULL, 0},
    {KVF_SP_HEARTBEAT, &kvf_sm_s_heartbeat, NULL, 0},
    {KVF_SP_PUT_START, NULL, &kvf_sm_s_put_start, 0},
    {KVF_SP_PUT_END, NULL, &kvf_sm_s_put_end, 0},
    {KVF_SP_GET, NULL, &kvf_sm_s_key, 0},
    {KVF_SP_REMOVE, NULL, &kvf_sm_s_key, 0},
    {KVF_SP_EXISTS, NULL, &kvf_sm_s_key, 0},
    {KVF_SP_LIST, &kvf_sm_s_list, NULL, 0},
    {KVF_SP_COMMIT, NULL, &kvf_sm_s_commit, 0},
    {KVF_SP_INV_ADD, NULL, &kvf_sm_s_inv_ent, 1},
    {KVF_SP_INV_DEL, NULL, &kvf_sm_s_inv_ent, 1},
    {KVF_SP_INV_REPORT, &kvf_sm_s_inv_head, &kvf_sm_s_inv_ent, 0},
    {KVF_SP_NODES, NULL, NULL, 0},
    {KVF_SP_TIER_OP, NULL, &kvf_sm_s_tier_op, 1},
};

static const kvf_sm_msg_t *kvf_sm_msg(uint8_t type)
{
    size_t i;

    for (i = 0; i < sizeof(kvf_sm_msgs) / sizeof(kvf_sm_msgs[0]); i++) {
        if (kvf_sm_msgs[i].type == type) {
            return &kvf_sm_msgs[i];
        }
    }
    return NULL;
}

/* Room for any struct a schema decodes. */
typedef union kvf_sm_any {
    kvf_sm_req_t req;
    kvf_sm_node_reg_t reg;
    kvf_sm_heartbeat_t hb;
    kvf_sm_list_t list;
    kvf_sm_inv_ent_t inv;
    kvf_sm_inv_head_t head;
    kvf_sm_tier_op_t tier;
} kvf_sm_any_t;

kvf_status_t kvf_sm_req_check(uint8_t type, uint32_t count, const void *body,
                              size_t len)
{
    const kvf_sm_msg_t *m = kvf_sm_msg(type);
    kvf_sm_any_t *u;
    uint32_t i;
    kvf_rd_t r;

    if (m == NULL || (m->entry != NULL && (count < m->min ||
                                           count > KVF_STORE_BATCH_MAX))) {
        return KVF_ERR_PROTOCOL;
    }
    u = __builtin_alloca(sizeof(*u)); /* not zeroed: the decoder fills */
    kvf_rd_init(&r, body, len);
    if (m->head != NULL) {
        kvf_sm_dec(&r, m->head, u);
    }
    for (i = 0; m->entry != NULL && i < count && kvf_rd_status(&r) == KVF_OK;
         i++) {
        kvf_sm_dec(&r, m->entry, u);
    }
    return kvf_rd_end(&r) == KVF_OK ? KVF_OK : KVF_ERR_PROTOCOL;
}

kvf_status_t kvf_sm_inv_check(uint8_t type, uint32_t count, const void *body,
                              size_t len)
{
    if (type != KVF_SP_INV_ADD && type != KVF_SP_INV_DEL &&
        type != KVF_SP_INV_REPORT) {
        return KVF_ERR_PROTOCOL;
    }
    return kvf_sm_req_check(type, count, body, len);
}

kvf_status_t kvf_sm_tier_check(uint32_t count, const void *body, size_t len)
{
    return kvf_sm_req_check(KVF_SP_TIER_OP, count, body, len);
}

kvf_status_t kvf_sm_req_dec(kvf_rd_t *r, uint8_t type, kvf_sm_req_t *q)
{
    const kvf_sm_msg_t *m = kvf_sm_msg(type);

    if (m == NULL || m->head != NULL || m->entry == NULL ||
        (m->entry != &kvf_sm_s_key && m->entry != &kvf_sm_s_put_start &&
         m->entry != &kvf_sm_s_put_end && m->entry != &kvf_sm_s_commit)) {
        return KVF_ERR_PROTOCOL; /* no keyed type */
    }
    kvf_sm_dec(r, m->entry, q);
    return KVF_OK;
}

void kvf_sm_key_enc(kvf_wr_t *w, const char *key)
{
    kvf_sm_req_t q;

    q.key = key;
    kvf_sm_enc(w, &kvf_sm_s_key, &q);
}

void kvf_sm_status_enc(kvf_wr_t *w, kvf_status_t status)
{
    kvf_sm_status_t s = {status};

    kvf_sm_enc(w, &kvf_sm_s_status, &s);
}

kvf_status_t kvf_sm_status_dec(kvf_rd_t *r)
{
    kvf_sm_status_t s = {KVF_OK};

    kvf_sm_dec(r, &kvf_sm_s_status, &s);
    return s.status;
}

kvf_status_t kvf_sm_rep_end(const kvf_rd_t *r, uint32_t count, uint32_t want)
{
    if (count != want) {
        return KVF_ERR_PROTOCOL;
    }
    return kvf_rd_status(r);
}
