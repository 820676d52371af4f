/*
 * Limits of the engine's targets (tcp and shm servers): how much work one
 * request may ask for, how long a connection may sit idle, how many
 * connections one peer and all peers may hold, how long a shm lease may
 * keep a (de)registration or a stop waiting. Read once per server from
 * the "target" configuration table; docs/security.md explains each key.
 * Also the accept loop's back-off when the process is out of descriptors.
 */
#ifndef KVF_TL_LIMITS_H
#define KVF_TL_LIMITS_H
#if !defined(KVF_LAYER_TRANSPORT) && !defined(KVF_TEST_INTERNALS)
#error "transport/limits.h is private to transport/"
#endif

#include <kvferry/status.h>

#include <stddef.h>
#include <stdint.h>

typedef struct kvf_tl_limits {
    uint64_t sum_max_entries; /* checksums one SUM may ask for */
    uint64_t sum_max_bytes;   /* bytes one SUM may hash */
    unsigned idle_timeout_ms; /* a connection idle this long is closed */
    unsigned conns_per_addr;  /* open connections per peer address */
    unsigned conns_max;       /* authenticated connections in all */
    unsigned lease_break_ms;  /* longest a lease holder delays a writer */
    unsigned unauth_max;      /* connections still authenticating, in all */
    unsigned unauth_per_addr; /* the same from one peer address */
    unsigned auth_timeout_ms; /* to finish the authentication exchange */
} kvf_tl_limits_t;

/* The shortest idle_timeout_ms a target takes. An initiator looks at a
 * pooled connection before using it (kvf_tl_peer_gone) only when it has
 * been quiet longer than KVF_TL_QUIET_MS, which must stay below this:
 * a connection a target closed for idleness is always looked at. */
#define KVF_TL_IDLE_MIN_MS 100
#define KVF_TL_QUIET_MS    10

/* Bytes hashed between two checks for a stop or a gone peer. */
#define KVF_TL_SUM_CHUNK (4u << 20)

/* What an initiator puts in one checksum request: well under the
 * targets' default limits, so a default target never refuses it. */
#define KVF_TL_SUM_REQ_ENTRIES 1024
#define KVF_TL_SUM_REQ_BYTES   (256ull << 20)

/* How many of the count entries (lengths) go in the next checksum
 * request: at least one, at most KVF_TL_SUM_REQ_ENTRIES, and no more
 * than KVF_TL_SUM_REQ_BYTES unless the first alone is larger. */
size_t kvf_tl_sum_batch(const size_t *lengths, size_t count);

/* Reads the limits from the configuration (defaults when unset). */
kvf_status_t kvf_tl_limits_load(kvf_tl_limits_t *l);

/* After accept(2) failed with errno err: when out of descriptors or
 * memory (EMFILE, ENFILE, ENOMEM, ENOBUFS) the pending connection stays
 * queued and poll(2) reports it again at once, so this logs (rate-
 * limited) and sleeps a little instead of letting the loop spin, and
 * returns 1; other errors return 0 at once. */
int kvf_tl_accept_backoff(int err);

/* 1 if the peer of fd has closed its side or reset the connection (a
 * non-blocking look, nothing consumed). */
int kvf_tl_peer_gone(int fd);

#endif
