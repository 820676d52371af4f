/*
 * Where the store master is, for clients and nodes: one address, a
 * static list of masters ("h1:p1,h2:p2": try each; a standby answers
 * KVF_ERR_NOT_LEADER), or, when the `metadata` key names etcd, the
 * leader that etcd's leader key (<etcd_prefix>master/leader) names,
 * with the list as the fallback when etcd has no leader key.
 */
#ifndef KVF_STORE_MASTERS_H
#define KVF_STORE_MASTERS_H
#if !defined(KVF_LAYER_STORE) && !defined(KVF_TEST_INTERNALS)
#error "store/proto/masters.h is private to store/: use <kvferry/store.h>"
#endif

#include <kvferry/status.h>

#include "core/sock.h"

#include <stddef.h>
#include <stdint.h>

#define KVF_SP_MASTERS_MAX 8

typedef struct kvf_sp_masters {
    char etcd[512]; /* endpoints, "" = none */
    char key[256];  /* the leader key */
    unsigned n;
    unsigned next; /* the list entry to try next */
    char addr[KVF_SP_MASTERS_MAX][KVF_HOST_MAX + 8];
} kvf_sp_masters_t;

/* The leader key under prefix (the master's and its followers'). */
void kvf_sp_leader_key(char *buf, size_t len);

/* Parses list ("host:port[,host:port...]") and reads `metadata`. */
kvf_status_t kvf_sp_masters_init(kvf_sp_masters_t *ms, const char *list);

/* More than one place the master can be (a list, or etcd). */
int kvf_sp_masters_many(const kvf_sp_masters_t *ms);

/* The address to try now: etcd's leader if etcd has one, else the next
 * entry of the list (round robin). *epoch_p (may be NULL): the leader's
 * epoch from etcd, 0 when it came from the list. */
kvf_status_t kvf_sp_masters_pick(kvf_sp_masters_t *ms, unsigned timeout_ms,
                                 char *addr, size_t len, uint64_t *epoch_p);

#endif
