/*
 * Store RPC message schemas, declared once, and the one codec that reads
 * and writes every body by its schema (codec.c). A schema is the list of
 * a struct's fields in wire order: each field's kind, where it lies in
 * the struct (offsetof), and its bounds. msg.c declares the schema of
 * every message of msg.h; nothing else in the store encodes or decodes
 * a body field by field.
 *
 * Kinds (little-endian on the wire):
 *   U8, U32, U64  integers; U8 may carry a range [lo, hi] (hi 0: any)
 *   STATUS        i32 (kvf_status_t)
 *   STR           u16 length + bytes, no NUL, in a char array of the
 *                 struct (cap bytes with the NUL)
 *   STRP          the same; encoded from a `const char *` (off), decoded
 *                 into a char array (off2) the pointer is set to
 *   KEY           a STRP that is a store key: the decoder gives a per-key
 *                 verdict (off3, kvf_status_t; kvf_sp_rd_key) and keeps
 *                 the reader usable for a key too long
 *   BYTES         cap raw bytes; off2: an int set to 1 when decoded
 *                 (0xffff: none)
 *   REPS          u8 n, n x {str segment, u64 addr} of a kvf_sm_obj_t
 * Flags:
 *   OPT           this field and every one after it may be absent: the
 *                 decoder stops where the body ends; the encoder writes
 *                 them up to the last one that is set (BYTES always is)
 *   NONEMPTY      a STR/STRP/KEY of length 0 does not parse
 * A body that does not parse latches the reader's error (kvf_rd_status);
 * decoded fields are then not to be used.
 */
#ifndef KVF_STORE_PROTO_SCHEMA_H
#define KVF_STORE_PROTO_SCHEMA_H
#if !defined(KVF_LAYER_STORE) && !defined(KVF_TEST_INTERNALS)
#error "store/proto/schema.h is private to store/: use <kvferry/store.h>"
#endif

#include "core/wire.h"

#include <stddef.h>
#include <stdint.h>

enum {
    KVF_SMF_U8 = 1,
    KVF_SMF_U32,
    KVF_SMF_U64,
    KVF_SMF_STATUS,
    KVF_SMF_STR,
    KVF_SMF_STRP,
    KVF_SMF_KEY,
    KVF_SMF_BYTES,
    KVF_SMF_REPS
};

#define KVF_SMF_OPT      0x1
#define KVF_SMF_NONEMPTY 0x2
#define KVF_SMF_NONE     0xffff

typedef struct kvf_sm_field {
    uint8_t kind;
    uint8_t flags;
    uint8_t lo, hi; /* U8: the range (hi 0: any) */
    uint16_t cap;   /* STR, STRP, KEY: the buffer's bytes; BYTES: length */
    uint16_t off;   /* the field in the struct */
    uint16_t off2;  /* STRP, KEY: the buffer; BYTES: the presence flag */
    uint16_t off3;  /* KEY: the verdict */
} kvf_sm_field_t;

typedef struct kvf_sm_schema {
    const char *name;
    const kvf_sm_field_t *fields;
    unsigned nfields;
    /* after a decode that parsed (NULL: none), e.g. a GET reply naming no
     * replica becomes KVF_ERR_NOT_FOUND */
    void (*fix)(void *msg);
} kvf_sm_schema_t;

/* Writes msg by its schema. */
void kvf_sm_enc(kvf_wr_t *w, const kvf_sm_schema_t *s, const void *msg);
/* Reads msg by its schema (the reader's error latches on bad input). */
void kvf_sm_dec(kvf_rd_t *r, const kvf_sm_schema_t *s, void *msg);
/* A body of `count` entries of schema s (a whole-body message: one, with
 * count 0 on the wire): each parses, and not a byte is left.
 * KVF_ERR_PROTOCOL otherwise. scratch: room for one struct of s. */
kvf_status_t kvf_sm_check(const kvf_sm_schema_t *s, uint32_t count,
                          const void *body, size_t len, void *scratch);

/* Field declarations (f: the member, T: the struct type). */
#define KVF_SMF(kind_, T, f)                                                   \
    {(kind_), 0, 0, 0, 0, (uint16_t)offsetof(T, f), 0, 0}
#define KVF_SMF_RANGE(T, f, lo_, hi_)                                          \
    {KVF_SMF_U8, 0, (lo_), (hi_), 0, (uint16_t)offsetof(T, f), 0, 0}
#define KVF_SMF_OPTIONAL(kind_, T, f)                                          \
    {(kind_), KVF_SMF_OPT, 0, 0, 0, (uint16_t)offsetof(T, f), 0, 0}
#define KVF_SMF_STRING(T, f, flags_)                                           \
    {KVF_SMF_STR, (flags_), 0, 0, (uint16_t)sizeof(((T *)0)->f),              \
     (uint16_t)offsetof(T, f), 0, 0}
#define KVF_SMF_STRPTR(T, ptr, buf, flags_)                                    \
    {KVF_SMF_STRP, (flags_), 0, 0, (uint16_t)sizeof(((T *)0)->buf),           \
     (uint16_t)offsetof(T, ptr), (uint16_t)offsetof(T, buf), 0}
#define KVF_SMF_KEYFIELD(T, ptr, buf, verdict)                                 \
    {KVF_SMF_KEY, 0, 0, 0, (uint16_t)sizeof(((T *)0)->buf),                   \
     (uint16_t)offsetof(T, ptr), (uint16_t)offsetof(T, buf),                  \
     (uint16_t)offsetof(T, verdict)}
#define KVF_SMF_RAW(T, f, flags_, present)                                     \
    {KVF_SMF_BYTES, (flags_), 0, 0, (uint16_t)sizeof(((T *)0)->f),            \
     (uint16_t)offsetof(T, f), (uint16_t)offsetof(T, present), 0}

#define KVF_SM_SCHEMA(name_, fields_, fix_)                                    \
    {(name_), (fields_), sizeof(fields_) / sizeof((fields_)[0]), (fix_)}

#endif
