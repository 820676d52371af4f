/*
 * The RESP2 front door of the store (`kvferry resp`): a Redis-protocol
 * server answering AUTH, PING, GET, SET, EXISTS, DEL (and the few
 * handshake commands redis-cli, redis-py and redis-benchmark send) on the
 * kvferry store, so Redis clients such as LMCache's resp:// connector use
 * the store with no plugin code. Requests are parsed with hiredis's
 * redisReader; values live in a buffer pool registered with the store
 * client's engine, so bytes move socket -> pool -> node and back without
 * further copies. The public entry points are in kvferry/server.h.
 */
#ifndef KVF_STORE_RESP_H
#define KVF_STORE_RESP_H

#include <kvferry/server.h>

#include <stddef.h>
#include <stdint.h>

/* Allocation unit of the value pool. */
#define KVF_RESP_GRANULE (64u << 10)
/* Values at most this long are copied into a connection's output buffer;
 * longer ones are sent from the pool. */
#define KVF_RESP_INLINE_MAX 4096u
/* A connection stops reading and parsing while this much output waits. */
#define KVF_RESP_OUT_HIGH (32u << 10)
/* Longest request line (array or bulk header) accepted. */
#define KVF_RESP_LINE_MAX (64u << 10)
/* Most arguments of one command. */
#define KVF_RESP_ARGS_MAX 4096

#endif
