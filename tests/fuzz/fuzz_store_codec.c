/*
 * libFuzzer target of the store's table-driven codec (store/proto/
 * codec.c): an input is a schema number (1 byte, modulo the schemas) and
 * a body. The body is decoded by that schema; when it parses, what it
 * decoded is encoded again, and that encoding must decode to itself
 * (encode(decode(x)) is a fixed point: no field lost, none invented).
 * The decoder never reads outside the body (ASan) and never writes
 * outside the struct (the struct sits between guard bytes that must stay
 * untouched).
 */
#include "store/proto/msg.h"
#include "store/proto/schema.h"

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const kvf_sm_schema_t *const kvf_fz_schemas[] = {
    &kvf_sm_s_key,          &kvf_sm_s_put_start, &kvf_sm_s_put_end,
    &kvf_sm_s_commit,       &kvf_sm_s_put_start_rep,
    &kvf_sm_s_get_rep,      &kvf_sm_s_commit_rep, &kvf_sm_s_node_reg,
    &kvf_sm_s_node_reg_rep, &kvf_sm_s_heartbeat,  &kvf_sm_s_list,
    &kvf_sm_s_list_ent,     &kvf_sm_s_node_ent,   &kvf_sm_s_inv_ent,
    &kvf_sm_s_inv_head,     &kvf_sm_s_tier_op,    &kvf_sm_s_status,
};

#define KVF_FZ_N     (sizeof(kvf_fz_schemas) / sizeof(kvf_fz_schemas[0]))
#define KVF_FZ_GUARD 64

/* The largest struct a schema decodes, between two guard areas. */
typedef struct kvf_fz_room {
    unsigned char pre[KVF_FZ_GUARD];
    union {
        kvf_sm_req_t req;
        kvf_sm_obj_t obj;
        kvf_sm_node_reg_t reg;
        kvf_sm_list_t list;
        kvf_sm_list_ent_t lent;
        kvf_sm_inv_ent_t inv;
        kvf_sm_tier_op_t tier;
    } u;
    unsigned char post[KVF_FZ_GUARD];
} kvf_fz_room_t;

static int kvf_fz_guards_ok(const kvf_fz_room_t *r)
{
    size_t i;

    for (i = 0; i < KVF_FZ_GUARD; i++) {
        if (r->pre[i] != 0xa5 || r->post[i] != 0xa5) {
            return 0;
        }
    }
    return 1;
}

/* Decodes buf by s into room; 1 if it parsed. */
static int kvf_fz_dec(const kvf_sm_schema_t *s, const void *buf, size_t len,
                      kvf_fz_room_t *room)
{
    kvf_rd_t r;

    memset(room, 0xa5, sizeof(*room));
    kvf_rd_init(&r, buf, len);
    kvf_sm_dec(&r, s, &room->u);
    if (!kvf_fz_guards_ok(room)) {
        abort(); /* a field written outside its struct */
    }
    return kvf_rd_status(&r) == KVF_OK;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static kvf_fz_room_t a, b;
    const kvf_sm_schema_t *s;
    kvf_wr_t w1, w2;

    if (size < 1) {
        return 0;
    }
    s = kvf_fz_schemas[data[0] % KVF_FZ_N];
    if (!kvf_fz_dec(s, data + 1, size - 1, &a)) {
        return 0;
    }
    kvf_wr_init(&w1);
    kvf_sm_enc(&w1, s, &a.u);
    if (kvf_wr_status(&w1) == KVF_OK && kvf_fz_dec(s, w1.buf, w1.len, &b)) {
        kvf_wr_init(&w2);
        kvf_sm_enc(&w2, s, &b.u);
        if (kvf_wr_status(&w2) != KVF_OK || w2.len != w1.len ||
            memcmp(w1.buf, w2.buf, w1.len) != 0) {
            abort(); /* not a fixed point */
        }
        kvf_wr_free(&w2);
    } else if (kvf_wr_status(&w1) == KVF_OK) {
        abort(); /* what was decoded does not decode once encoded */
    }
    kvf_wr_free(&w1);
    return 0;
}
