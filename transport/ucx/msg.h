/*
 * ucx transport, side channel codec: the messages an initiator and a
 * target exchange over the authenticated tcp connection that sets up the
 * UCX data path. Each is a core/wire frame header, then its metadata:
 *
 *   HELLO       (initiator) nothing
 *   HELLO_RESP  the target worker's UCX address (bytes)
 *   RKEY        u64 addr, u64 len: the range the initiator wants to reach
 *   RKEY_RESP   u64 base, u64 len, u32 n, n bytes: the registered region
 *               holding the range and its packed UCX remote key
 *   SUM         count x (u64 addr, u64 len)
 *   SUM_RESP    count x u64 checksum
 *
 * Every size is bounded here, before UCX sees a byte: a worker address
 * of at most KVF_UCX_ADDR_MAX bytes, a remote key of at most
 * KVF_UCX_RKEY_MAX, a region that does not wrap and holds the asked
 * range. Replies carry the status in the header; an error has no body.
 */
#ifndef KVF_UCX_MSG_H
#define KVF_UCX_MSG_H
#if !defined(KVF_LAYER_TRANSPORT) && !defined(KVF_TEST_INTERNALS)
#error "transport/ucx/msg.h is private to transport/"
#endif

#include "core/wire.h"

#include <stddef.h>
#include <stdint.h>

#define KVF_UCX_ADDR_MAX  (64u << 10)
#define KVF_UCX_RKEY_MAX  (16u << 10)
#define KVF_UCX_SUM_MAX   4096 /* entries in one SUM */
#define KVF_UCX_RANGE_LEN 16

enum {
    KVF_UCX_HELLO = 1,
    KVF_UCX_HELLO_RESP = 2,
    KVF_UCX_RKEY = 3,
    KVF_UCX_RKEY_RESP = 4,
    KVF_UCX_SUM = 5,
    KVF_UCX_SUM_RESP = 6,
};

/* A target's answer to RKEY: the region and its key (borrowed from the
 * decoded buffer). */
typedef struct kvf_ucx_rkey_msg {
    uint64_t base;
    uint64_t len;
    const void *rkey;
    uint32_t rkey_len;
} kvf_ucx_rkey_msg_t;

/* Checks a received header against the schema of its type: known type,
 * metadata length bounded and consistent with count. */
kvf_status_t kvf_ucx_hdr_check(const kvf_frame_hdr_t *h);

void kvf_ucx_range_enc(kvf_wr_t *w, uint64_t addr, uint64_t len);
/* A range (RKEY body or one SUM entry); KVF_ERR_PROTOCOL on a wrap or a
 * zero length. */
kvf_status_t kvf_ucx_range_dec(kvf_rd_t *r, uint64_t *addr_p, uint64_t *len_p);

void kvf_ucx_rkey_enc(kvf_wr_t *w, uint64_t base, uint64_t len,
                      const void *rkey, uint32_t rkey_len);
/* Decodes RKEY_RESP's body and checks that the region holds [addr,
 * addr+len): KVF_ERR_PROTOCOL otherwise, with one error line. */
kvf_status_t kvf_ucx_rkey_dec(const void *buf, size_t n, uint64_t addr,
                              uint64_t len, kvf_ucx_rkey_msg_t *m_p);

/* HELLO_RESP: the worker address must be 1..KVF_UCX_ADDR_MAX bytes. */
kvf_status_t kvf_ucx_addr_check(size_t len);

#endif
