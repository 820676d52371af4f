/*
 * The store RPC codec: one encoder and one decoder for every message,
 * driven by the message's schema (schema.h), over core/wire.h's bounded
 * reader and writer. A field is read or written by its kind at its place
 * in the struct; nothing here knows a message.
 */
#include "store/proto/schema.h"
#include "store/proto/msg.h"

#include <string.h>

#define KVF_SM_AT(msg, off) ((unsigned char *)(msg) + (off))

/* ---- encode ---- */

/* Is field f of msg set (an optional field is written only then)? */
static int kvf_sm_set(const kvf_sm_field_t *f, const void *msg)
{
    const unsigned char *p = KVF_SM_AT(msg, f->off);

    switch (f->kind) {
    case KVF_SMF_U8:
        return *p != 0;
    case KVF_SMF_U32:
    case KVF_SMF_STATUS:
        return *(const uint32_t *)(const void *)p != 0;
    case KVF_SMF_U64:
        return *(const uint64_t *)(const void *)p != 0;
    case KVF_SMF_STR:
        return p[0] != '\0';
    case KVF_SMF_STRP:
    case KVF_SMF_KEY: {
        const char *s = *(const char *const *)(const void *)p;

        return s != NULL && s[0] != '\0';
    }
    default:
        return 1; /* BYTES, REPS */
    }
}

static void kvf_sm_reps_enc(kvf_wr_t *w, const kvf_sm_obj_t *o)
{
    unsigned i;

    kvf_wr_u8(w, (uint8_t)o->nrep);
    for (i = 0; i < o->nrep; i++) {
        kvf_wr_str(w, o->seg[i]);
        kvf_wr_u64(w, o->addr[i]);
    }
}

static void kvf_sm_field_enc(kvf_wr_t *w, const kvf_sm_field_t *f,
                             const void *msg)
{
    const unsigned char *p = KVF_SM_AT(msg, f->off);

    switch (f->kind) {
    case KVF_SMF_U8:
        kvf_wr_u8(w, *p);
        break;
    case KVF_SMF_U32:
    case KVF_SMF_STATUS:
        kvf_wr_u32(w, *(const uint32_t *)(const void *)p);
        break;
    case KVF_SMF_U64:
        kvf_wr_u64(w, *(const uint64_t *)(const void *)p);
        break;
    case KVF_SMF_STR:
        kvf_wr_str(w, (const char *)p);
        break;
    case KVF_SMF_STRP:
    case KVF_SMF_KEY:
        kvf_wr_str(w, *(const char *const *)(const void *)p);
        break;
    case KVF_SMF_BYTES:
        kvf_wr_bytes(w, p, f->cap);
        break;
    case KVF_SMF_REPS:
        kvf_sm_reps_enc(w, msg);
        break;
    default:
        w->failed = 1;
    }
}

void kvf_sm_enc(kvf_wr_t *w, const kvf_sm_schema_t *s, const void *msg)
{
    unsigned i, last = s->nfields, j;

    /* optional fields: up to the last one that is set */
    for (i = 0; i < s->nfields && !(s->fields[i].flags & KVF_SMF_OPT); i++) {
    }
    if (i < s->nfields) {
        for (last = i, j = i; j < s->nfields; j++) {
            if (kvf_sm_set(&s->fields[j], msg)) {
                last = j + 1;
            }
        }
    }
    for (i = 0; i < last; i++) {
        kvf_sm_field_enc(w, &s->fields[i], msg);
    }
}

/* ---- decode ---- */

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

/* A string field into its buffer (STRP: the pointer set to it). */
static void kvf_sm_str_dec(kvf_rd_t *r, const kvf_sm_field_t *f, void *msg)
{
    char *buf = (char *)KVF_SM_AT(msg, f->kind == KVF_SMF_STR ? f->off
                                                                : f->off2);

    if (f->kind == KVF_SMF_KEY) {
        *(kvf_status_t *)(void *)KVF_SM_AT(msg, f->off3) =
            kvf_sp_rd_key(r, buf);
    } else {
        kvf_rd_str(r, buf, f->cap);
    }
    if (f->kind != KVF_SMF_STR) {
        *(const char **)(void *)KVF_SM_AT(msg, f->off) = buf;
    }
    if ((f->flags & KVF_SMF_NONEMPTY) && buf[0] == '\0') {
        r->failed = 1;
    }
}

static void kvf_sm_field_dec(kvf_rd_t *r, const kvf_sm_field_t *f, void *msg)
{
    unsigned char *p = KVF_SM_AT(msg, f->off);
    const void *b;

    switch (f->kind) {
    case KVF_SMF_U8:
        *p = kvf_rd_u8(r);
        if (f->hi != 0 && (*p < f->lo || *p > f->hi)) {
            r->failed = 1;
        }
        break;
    case KVF_SMF_U32:
    case KVF_SMF_STATUS:
        *(uint32_t *)(void *)p = kvf_rd_u32(r);
        break;
    case KVF_SMF_U64:
        *(uint64_t *)(void *)p = kvf_rd_u64(r);
        break;
    case KVF_SMF_BYTES:
        b = kvf_rd_bytes(r, f->cap);
        if (b != NULL) {
            memcpy(p, b, f->cap);
            if (f->off2 != KVF_SMF_NONE) {
                *(int *)(void *)KVF_SM_AT(msg, f->off2) = 1;
            }
        }
        break;
    case KVF_SMF_REPS:
        kvf_sm_reps_dec(r, msg);
        break;
    default:
        kvf_sm_str_dec(r, f, msg);
    }
}

/* An optional field left out: zero (a string: empty; BYTES: absent). */
static void kvf_sm_field_absent(const kvf_sm_field_t *f, void *msg)
{
    unsigned char *p = KVF_SM_AT(msg, f->off);

    switch (f->kind) {
    case KVF_SMF_U8:
        *p = 0;
        break;
    case KVF_SMF_U32:
    case KVF_SMF_STATUS:
        *(uint32_t *)(void *)p = 0;
        break;
    case KVF_SMF_U64:
        *(uint64_t *)(void *)p = 0;
        break;
    case KVF_SMF_STR:
        p[0] = '\0';
        break;
    case KVF_SMF_BYTES:
        memset(p, 0, f->cap);
        if (f->off2 != KVF_SMF_NONE) {
            *(int *)(void *)KVF_SM_AT(msg, f->off2) = 0;
        }
        break;
    default:
        break;
    }
}

void kvf_sm_dec(kvf_rd_t *r, const kvf_sm_schema_t *s, void *msg)
{
    unsigned i;
    int opt = 0;

    for (i = 0; i < s->nfields; i++) {
        opt |= s->fields[i].flags & KVF_SMF_OPT;
        if (opt && kvf_rd_left(r) == 0) {
            kvf_sm_field_absent(&s->fields[i], msg);
        } else {
            kvf_sm_field_dec(r, &s->fields[i], msg);
        }
    }
    if (s->fix != NULL && kvf_rd_status(r) == KVF_OK) {
        s->fix(msg);
    }
}

kvf_status_t kvf_sm_check(const kvf_sm_schema_t *s, uint32_t count,
                          const void *body, size_t len, void *scratch)
{
    uint32_t i, n = count ? count : 1;
    kvf_rd_t r;

    kvf_rd_init(&r, body, len);
    for (i = 0; i < n && kvf_rd_status(&r) == KVF_OK; i++) {
        kvf_sm_dec(&r, s, scratch);
    }
    return kvf_rd_end(&r) == KVF_OK ? KVF_OK : KVF_ERR_PROTOCOL;
}
