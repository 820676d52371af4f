/*
 * Leader election over etcd: candidates race to create one key bound to
 * a lease (create-if-absent transaction); the winner keeps the lease
 * alive and is leader while it can prove it. The key holds the leader's
 * address; its create revision is the leader's epoch, which only grows,
 * so anyone can order two leaders.
 *
 * Step-down rule (what makes a deposed leader harmless): the leader
 * counts itself leader only until half its lease after the last
 * keepalive that etcd acknowledged, measured from the moment that
 * keepalive was sent. etcd cannot expire the lease, and so no rival can
 * create the key, before a full lease after that moment; so a leader cut
 * off from etcd stops (kvf_elect_is_leader turns false) at least half a
 * lease before any successor exists, whatever the network does.
 * Standbys poll the key every poll_ms and race for it when it is gone.
 */
#ifndef KVF_COORD_ELECTION_H
#define KVF_COORD_ELECTION_H
#if !defined(KVF_LAYER_COORD) && !defined(KVF_LAYER_ENGINE) && \
    !defined(KVF_LAYER_STORE) && !defined(KVF_TEST_INTERNALS)
#error "coord/election.h: the etcd client of coord/, for the engine and the store"
#endif

#include <kvferry/status.h>

#include <stddef.h>
#include <stdint.h>

typedef struct kvf_elect kvf_elect_t;

typedef struct kvf_elect_opts {
    const char *endpoints; /* etcd "host:port[,host:port]" */
    const char *key;       /* the leader key */
    const char *value;     /* what the leader writes there (its address) */
    unsigned lease_ms;     /* at least 1000; etcd leases are whole seconds */
    unsigned poll_ms;      /* standby's look at the key; 0 = lease_ms / 5 */
    int one_term;          /* after its first term ends, stop campaigning (a
                              deposed leader whose state may be stale stays out) */
} kvf_elect_opts_t;

/* Starts campaigning in a thread. Fails only on bad options. */
kvf_status_t kvf_elect_start(const kvf_elect_opts_t *opts,
                             kvf_elect_t **elect_p);
/* Stops; a leader resigns (its key goes at once). */
void kvf_elect_stop(kvf_elect_t *elect);

/* 1 while this candidate is the leader and can prove it (*epoch_p: its
 * epoch), else 0. Cheap (two atomic loads and a clock read). */
int kvf_elect_is_leader(kvf_elect_t *elect, uint64_t *epoch_p);

/* Times this candidate became leader, and stepped down. */
unsigned kvf_elect_terms(kvf_elect_t *elect);
unsigned kvf_elect_stepdowns(kvf_elect_t *elect);

/* The current leader as etcd has it: its value (address) and epoch.
 * KVF_ERR_NOT_FOUND when there is none. */
kvf_status_t kvf_elect_lookup(const char *endpoints, unsigned timeout_ms,
                              const char *key, char *value, size_t len,
                              uint64_t *epoch_p);

#endif
