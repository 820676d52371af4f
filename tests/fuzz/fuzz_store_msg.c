/*
 * libFuzzer target of the store RPC codec (store/proto/msg.c). An input
 * is a message type (1 byte), an entry count (u16, little-endian) and a
 * body; every decoder of the codec reads the body: the request check the
 * master runs before serving, the inventory check, each keyed request and reply
 * entry decoder until the body ends or fails, and each whole-body decoder. None
 * may read outside the body or crash; a check that accepts a body must have
 * consumed it exactly.
 */
#include "store/proto/msg.h"

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Reads entries of schema s until the body ends or fails. */
static void kvf_fz_objs(const uint8_t *body, size_t len,
                        const kvf_sm_schema_t *s)
{
    static kvf_sm_obj_t o;
    kvf_rd_t r;
    unsigned i;

    kvf_rd_init(&r, body, len);
    for (i = 0; i < KVF_STORE_BATCH_MAX && kvf_rd_left(&r) > 0; i++) {
        kvf_sm_dec(&r, s, &o);
        if (kvf_rd_status(&r) != KVF_OK) {
            break;
        }
        if (o.nrep > KVF_STORE_REPLICA_MAX) {
            abort();
        }
    }
}

static void kvf_fz_reqs(const uint8_t *body, size_t len, uint8_t type)
{
    static kvf_sm_req_t q;
    kvf_rd_t r;
    unsigned i;

    kvf_rd_init(&r, body, len);
    for (i = 0; i < KVF_STORE_BATCH_MAX && kvf_rd_left(&r) > 0; i++) {
        if (kvf_sm_req_dec(&r, type, &q) != KVF_OK ||
            kvf_rd_status(&r) != KVF_OK) {
            break;
        }
        if (q.key_status == KVF_OK && q.key[0] == '\0') {
            abort(); /* a key accepted must not be empty */
        }
    }
}

static void kvf_fz_statuses(const uint8_t *body, size_t len)
{
    kvf_rd_t r;

    kvf_rd_init(&r, body, len);
    while (kvf_rd_left(&r) > 0 && kvf_rd_status(&r) == KVF_OK) {
        (void)kvf_sm_status_dec(&r);
    }
}

static void kvf_fz_whole(const uint8_t *body, size_t len)
{
    static kvf_sm_node_reg_t reg;
    static kvf_sm_node_reg_rep_t rep;
    static kvf_sm_heartbeat_t hb;
    static kvf_sm_list_t list;
    static kvf_sm_list_ent_t ent;
    static kvf_sm_node_ent_t node;
    kvf_rd_t r;

    kvf_rd_init(&r, body, len);
    kvf_sm_node_reg_dec(&r, &reg);
    kvf_rd_init(&r, body, len);
    kvf_sm_node_reg_rep_dec(&r, &rep);
    kvf_rd_init(&r, body, len);
    kvf_sm_heartbeat_dec(&r, &hb);
    kvf_rd_init(&r, body, len);
    kvf_sm_list_dec(&r, &list);
    kvf_rd_init(&r, body, len);
    while (kvf_rd_left(&r) > 0 && kvf_rd_status(&r) == KVF_OK) {
        kvf_sm_list_ent_dec(&r, &ent);
    }
    kvf_rd_init(&r, body, len);
    while (kvf_rd_left(&r) > 0 && kvf_rd_status(&r) == KVF_OK) {
        kvf_sm_node_ent_dec(&r, &node);
    }
}

/* Inventory entries until the body ends or fails; an accepted body
 * holds exactly count non-empty keys. */
static void kvf_fz_inv(const uint8_t *body, size_t len, uint32_t count)
{
    static kvf_sm_inv_ent_t e;
    kvf_rd_t r;
    uint32_t i, n = 0;

    kvf_rd_init(&r, body, len);
    for (i = 0; i < KVF_STORE_BATCH_MAX && kvf_rd_left(&r) > 0; i++) {
        kvf_sm_inv_ent_dec(&r, &e);
        if (kvf_rd_status(&r) != KVF_OK) {
            break;
        }
        n++;
    }
    if (kvf_sm_inv_check(KVF_SP_INV_ADD, count, body, len) == KVF_OK &&
        (n != count || kvf_rd_left(&r) != 0)) {
        abort();
    }
}

/* Tier operations until the body ends or fails; an accepted TIER_OP
 * body holds exactly count of them, each of a known op. */
static void kvf_fz_tier(const uint8_t *body, size_t len, uint32_t count)
{
    static kvf_sm_tier_op_t o;
    kvf_rd_t r;
    uint32_t i, n = 0;
    int known = 1;

    kvf_rd_init(&r, body, len);
    for (i = 0; i < KVF_STORE_BATCH_MAX && kvf_rd_left(&r) > 0; i++) {
        kvf_sm_tier_op_dec(&r, &o);
        if (kvf_rd_status(&r) != KVF_OK) {
            break;
        }
        known &= o.op >= KVF_TIER_WRITE && o.op <= KVF_TIER_DROP;
        n++;
    }
    if (kvf_sm_tier_check(count, body, len) == KVF_OK &&
        (n != count || kvf_rd_left(&r) != 0 || !known)) {
        abort();
    }
}

/* A keyed body the check accepted holds exactly count entries. */
static void kvf_fz_accepted(const uint8_t *body, size_t len, uint8_t type,
                            uint32_t count)
{
    static kvf_sm_req_t q;
    kvf_rd_t r;
    uint32_t i;

    kvf_rd_init(&r, NULL, 0);
    if (kvf_sm_req_dec(&r, type, &q) != KVF_OK) {
        return; /* a whole-body type */
    }
    kvf_rd_init(&r, body, len);
    for (i = 0; i < count; i++) {
        (void)kvf_sm_req_dec(&r, type, &q);
    }
    if (kvf_rd_status(&r) != KVF_OK || kvf_rd_left(&r) != 0) {
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const uint8_t keyed[] = {KVF_SP_PUT_START, KVF_SP_PUT_END,
                                    KVF_SP_COMMIT, KVF_SP_GET};
    const uint8_t *body = data + 3;
    size_t len, i;
    uint32_t count;
    uint8_t type;

    if (size < 3) {
        return 0;
    }
    type = data[0];
    count = (uint32_t)data[1] | (uint32_t)data[2] << 8;
    len = size - 3;
    if (kvf_sm_req_check(type, count, body, len) == KVF_OK) {
        kvf_fz_accepted(body, len, type, count);
    }
    for (i = 0; i < sizeof(keyed); i++) {
        kvf_fz_reqs(body, len, keyed[i]);
    }
    kvf_fz_objs(body, len, &kvf_sm_s_put_start_rep);
    kvf_fz_objs(body, len, &kvf_sm_s_get_rep);
    kvf_fz_objs(body, len, &kvf_sm_s_commit_rep);
    kvf_fz_statuses(body, len);
    kvf_fz_whole(body, len);
    kvf_fz_inv(body, len, count);
    kvf_fz_tier(body, len, count);
    return 0;
}
