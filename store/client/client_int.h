/*
 * Store client, private: the handle and what the client's files share,
 * in layers, each calling only those below it:
 *
 *   handle.c   connect/disconnect: the base, then the strategies
 *   put.c get.c keys.c view.c put_view.c view_maps.c
 *              the operations; none calls another, and each reaches
 *              the strategies only through the handle's table
 *   lease.c loc.c
 *              get strategies (kvf__sstrat_ops_t), on loctab.c
 *   loctab.c   the location table both strategies read
 *   move.c     engine batches, the per-batch arena, checksums
 *   base.c leader.c
 *              the base: master connections, RPC, retry, leader
 *              following, the GET round trip, the peer cache
 *
 * Names shared between files start kvf__ (internal); the public API is
 * <kvferry/store.h>.
 */
#ifndef KVF_STORE_CLIENT_INT_H
#define KVF_STORE_CLIENT_INT_H
#if !defined(KVF_LAYER_STORE) && !defined(KVF_TEST_INTERNALS)
#error "store/client/client_int.h is private to store/: use <kvferry/store.h>"
#endif

#include <kvferry/perf.h>
#include <kvferry/store.h>

#include "store/proto/masters.h"
#include "store/proto/msg.h"
#include "core/sock.h"

#include <pthread.h>

/* One key's replicas as the master returned them (or a reservation's). */
typedef kvf_sm_obj_t kvf_sreps_t;

/* Space the master reserved for this connection's next put (COMMIT). */
typedef struct kvf_sresv {
    kvf_sreps_t r;       /* put_id 0 = none; size, replicas */
    unsigned replicas;   /* as asked (0 = the master's default) */
    uint64_t until_ms;   /* used only before (250 ms, half the put timeout) */
    uint64_t peer_epoch; /* the handle's peer_epoch when granted */
} kvf_sresv_t;

/* One connection to the master; used by one call at a time. */
typedef struct kvf_sconn {
    int fd;
    kvf_wire_mac_t mac; /* fd's frame tags */
    int is_unix;        /* over the master's abstract unix socket */
    uint64_t next_id;
    kvf_sp_frame_t f; /* the last reply */
    kvf_sresv_t resv;
    uint64_t gen; /* the handle's master_gen when opened */
    struct kvf_sconn *next;
} kvf_sconn_t;

/* An opened peer (a node's segment), shared by the handle's calls. */
typedef struct kvf_speer {
    char name[KVF_STORE_SEG_MAX];
    kvf_peer_h peer;
    int refs;
    int dead; /* out of the cache; closed at the last release */
    struct kvf_speer *next;
} kvf_speer_t;

/* The engine a handle creates (base.c): node_conns at most this; a
 * node_chunk of 0 (auto) cuts large transfers into requests of
 * KVF_STORE_STRIPE_CHUNK on hosts of at least KVF_STORE_STRIPE_CPUS. */
#define KVF_STORE_NODE_CONNS_MAX 64
#define KVF_STORE_STRIPE_CPUS    8
#define KVF_STORE_STRIPE_CHUNK   (256u << 10)

/* Where a key was last seen: one slot of the location cache. */
typedef struct kvf_sloc_ent {
    uint64_t tag; /* hash of the key; 0 = empty */
    uint64_t addr;
    uint64_t size;
    uint64_t checksum;     /* the master's, when learnt from a get */
    uint64_t lease_end_ns; /* lease reads: trusted alone until then; 0 = no */
    unsigned seg;          /* index into kvf_sloc_t.segs */
} kvf_sloc_ent_t;

#define KVF_SLOC_LOCKS 64
#define KVF_SLOC_SEGS  64

/* The location cache: a direct-mapped table filled by this handle's
 * puts and gets, read by a single-key get to start its read while the
 * GET round trip is in flight (loc.c). Not trusted alone: the
 * master's answer and the checksum decide; with lease_reads, an entry
 * learnt from a get is trusted with the master's checksum until the read
 * lease that get was granted ends. */
typedef struct kvf_sloc {
    kvf_sloc_ent_t *ents; /* NULL: off */
    size_t mask;
    pthread_mutex_t locks[KVF_SLOC_LOCKS];
    pthread_mutex_t seg_lock;
    int lease_reads;            /* store config `lease_reads` */
    uint64_t gets, used, lease; /* kvf_store_loc_stats (atomic) */
    unsigned nseg;
    char segs[KVF_SLOC_SEGS][KVF_STORE_SEG_MAX];
} kvf_sloc_t;

/* Strategies a handle may hold (handle.c's table). */
#define KVF__SSTRAT_MAX 8

struct kvf_store {
    /* the master now (host, port, unix_name: changed under lock by
     * kvf__sfollow when the leader moves) */
    char host[KVF_HOST_MAX];
    uint16_t port;
    kvf_sp_masters_t masters; /* where the master may be (leader.c) */
    uint64_t master_gen;      /* bumped at each switch */
    int follow_due;           /* a call saw its master fail: the next one looks
                               * for the leader first, within its own deadline */
    char unix_name[96];       /* the master's unix socket to try first, or "" */
    int last_unix;            /* the last connection opened went over unix */
    unsigned timeout_ms;
    kvf_engine_h engine;
    int own_engine;
    int reserve; /* single puts keep a reservation (put_reserve) */
    pthread_mutex_t lock;
    kvf_sconn_t *idle;
    kvf_speer_t *peers;
    pthread_mutex_t peers_lock;
    uint64_t peer_epoch; /* bumped when a peer fails: reservations from
                            before are not used (its node may be new) */
    char self_host[64];  /* the address this client reaches the master
                            from over tcp ("" over unix): gets prefer
                            replicas on a node of this address */
    kvf_sloc_t loc;
    struct kvf_store_view_lease *vleases; /* open view leases (view.c),
                                             under lock */
    struct kvf_svshare *vshares;          /* nodes' leases kept for shared views
                                             (view.c), under lock */
    struct kvf_store_put_view *pviews;    /* open put views (put_view.c),
                                             under lock */
    const struct kvf__sstrat_ops *strat[KVF__SSTRAT_MAX]; /* handle.c */
    unsigned nstrat;
};

/* ---- the base: leader.c ---- */

/* leader.c: the master to use now, chosen among st->masters (the given
 * one, the list's next, or etcd's leader); switches st's address, drops
 * idle connections to the old one and reservations. KVF_OK when an
 * address was set (it may still be down). */
kvf_status_t kvf__sfollow(kvf_store_h st, const char *why);
/* The same, its etcd look-up and pauses ending by deadline_ms. */
kvf_status_t kvf__sfollow_by(kvf_store_h st, const char *why,
                             uint64_t deadline_ms);
/* Whether status, from a master call, means "try the leader elsewhere". */
int kvf__sfollow_worth(kvf_store_h st, kvf_status_t status);
/* Picks the link to st->host:port: its unix socket to try first, or ""
 * (tcp). */
kvf_status_t kvf__spick_link(kvf_store_h st);

/* ---- the base: base.c ---- */

/* Opens the base of a zeroed handle: master addresses, settings, the
 * engine, the first connection (to the leader). On failure nothing is
 * left open. */
kvf_status_t kvf__sbase_open(kvf_store_h st, const kvf_store_params_t *p);
/* Closes connections (handing reservations back), peers and the engine. */
void kvf__sbase_close(kvf_store_h st);

/* One request/reply round trip with the master on a pooled connection.
 * On KVF_OK the caller reads (*conn_p)->f, then kvf__srelease()s it;
 * a reply's whole-frame status is returned as the error. */
kvf_status_t kvf__srpc(kvf_store_h st, uint8_t type, uint32_t count,
                       const kvf_wr_t *w, kvf_sconn_t **conn_p);
void kvf__srelease(kvf_store_h st, kvf_sconn_t *c);
/* kvf__srpc in two halves, so that other work overlaps the round
 * trip: a pooled (or new) connection with the request sent, then its
 * reply (a transport failure closes c: *closed_p = 1). */
kvf_status_t kvf__srpc_send(kvf_store_h st, uint8_t type, uint32_t count,
                            const kvf_wr_t *w, kvf_sconn_t **conn_p);
kvf_status_t kvf__srpc_recv(kvf_store_h st, kvf_sconn_t *c, uint8_t type,
                            int *closed_p);
/* The round trip on connection c (taken from the pool by the caller).
 * On KVF_OK the reply is in c->f; a transport failure closes c (it must
 * not be used again: *closed_p = 1); a reply's whole-frame status is
 * returned with c still the caller's. */
kvf_status_t kvf__srpc_on(kvf_store_h st, kvf_sconn_t *c, uint8_t type,
                          uint32_t count, const kvf_wr_t *w, int *closed_p);
/* An idle connection for a COMMIT, out of the pool: one holding no
 * reservation (or only one too old to use, handed back on the way),
 * else any idle one (*may_reserve_p = 0: it keeps its reservation and
 * asks for none), else a new one; NULL if the master cannot be
 * reached. */
kvf_sconn_t *kvf__stake_plain(kvf_store_h st, int *may_reserve_p);
/* An idle connection holding a usable reservation of exactly size bytes
 * asked with `replicas`, taken out of the pool; NULL if none. A
 * reservation found stale, or on a connection the master closed, is
 * dropped on the way. */
kvf_sconn_t *kvf__stake_resv(kvf_store_h st, uint64_t size, unsigned replicas);

/* The GET round trip for count keys: e[i] per key (key verdicts
 * included). */
kvf_status_t kvf__slookup(kvf_store_h st, size_t count, const char *const *keys,
                          kvf_sreps_t *e);

/* Takes a reference on the peer for a segment, opening it if needed. */
kvf_status_t kvf__speer_ref(kvf_store_h st, const char *segment,
                            kvf_speer_t **sp_p);
/* Drops the reference; bad != 0 evicts the peer from the cache (its
 * connection broke, or its node restarted). */
void kvf__speer_unref(kvf_store_h st, kvf_speer_t *sp, int bad);

/* Is this data-path error one that condemns the peer? */
int kvf__speer_error(kvf_status_t status);

/* ---- move.c: engine batches ---- */

/* Ops of one engine batch, with the key and replica each moves. */
typedef struct kvf_smove {
    kvf_op_t *ops;
    kvf_speer_t **sps;
    kvf_status_t *st;
    uint32_t *key;
    unsigned *rep;
    size_t n;
    kvf_batch_h batch; /* the engine batch while during() runs, or NULL */
} kvf_smove_t;

/* Adds an op moving len bytes between local and replica k of e (for key
 * index key); fails when the replica's node cannot be opened. */
kvf_status_t kvf__smove_add(kvf_store_h st, kvf_smove_t *mv, kvf_op_type_t type,
                            void *local, const kvf_sreps_t *e, unsigned k,
                            size_t len, uint32_t key);
/* Runs mv's ops as one engine batch (inline where the transport can),
 * within the store's timeout in all; mv->st gets each op's status;
 * during(arg), when given, runs while the batch is in flight (mv->batch
 * is the batch then, NULL when the submit failed). Drops the peers'
 * references. */
void kvf__smove_run(kvf_store_h st, kvf_smove_t *mv, void (*during)(void *arg),
                    void *arg);
/* *sum_p: the checksum of len bytes at buf; device != 0: the node's
 * checksum of replica k of e instead (memory the CPU cannot read). */
kvf_status_t kvf__ssum(kvf_store_h st, const void *buf, size_t len, int device,
                       const kvf_sreps_t *e, unsigned k, uint64_t *sum_p);
kvf_status_t kvf__sfirst_error(const kvf_status_t *s, size_t n);

/* A per-batch arena: one allocation holding a batch's arrays. A layout
 * function takes every array from it twice: first with base NULL, which
 * only sizes it (takes give NULL), then after kvf__sarena_alloc. */
typedef struct kvf_sarena {
    char *base;
    size_t off;
} kvf_sarena_t;

void *kvf__sarena_take(kvf_sarena_t *a, size_t size);
/* Allocates the bytes the sizing pass counted (zeroed) and rewinds. */
kvf_status_t kvf__sarena_alloc(kvf_sarena_t *a);
void kvf__sarena_free(kvf_sarena_t *a);

/* ---- loctab.c: the location table ---- */

/* entries: a power of two, 0 = off; loc is zeroed (the handle's calloc),
 * lease_reads may already be set. */
kvf_status_t kvf__sloc_init(kvf_sloc_t *loc, size_t entries);
void kvf__sloc_fini(kvf_sloc_t *loc);
/* Remembers where key's bytes are (replica k of e); lease_end_ns from
 * kvf__sloc_lease_end() for a get's answer, 0 for a put's. */
void kvf__sloc_note(kvf_sloc_t *loc, const char *key, const kvf_sreps_t *e,
                    unsigned k, uint64_t lease_end_ns);
/* Until when a location a GET sent at sent_ns answered may be read
 * without the master (lease reads on, a lease granted), else 0. */
uint64_t kvf__sloc_lease_end(const kvf_sloc_t *loc, uint64_t sent_ns,
                             unsigned lease_ms);
/* Forgets key (removed, or the master no longer has it there). */
void kvf__sloc_forget(kvf_sloc_t *loc, const char *key);

/* The entry of key, if any (a copy). */
int kvf__sloc_find(kvf_sloc_t *loc, const char *key, kvf_sloc_ent_t *out);
/* Reads the location l into buf; its checksum into *sum_p. */
kvf_status_t kvf__sloc_read(kvf_store_h st, const kvf_sloc_ent_t *l, void *buf,
                            uint64_t *sum_p);

/* ---- strategies: the handle's table ---- */

/* What a strategy did for a single-key get. */
typedef enum kvf__sget_res {
    KVF__SGET_NONE,   /* nothing known (or the GET failed): the next
                       * strategy, else the plain look-up */
    KVF__SGET_LOOKED, /* e holds the master's answer; read its replicas */
    KVF__SGET_DONE    /* buf holds the object; e says what it is */
} kvf__sget_res_t;

/* A strategy: a way of serving the operations faster or of keeping
 * something open across them, installed on a handle at connect
 * (handle.c). Every hook may be NULL. */
typedef struct kvf__sstrat_ops {
    const char *name;
    /* at connect, after the base: its state (from the config) */
    kvf_status_t (*init)(kvf_store_h st);
    /* at disconnect, before the base closes: ends what is open */
    void (*fini)(kvf_store_h st);
    /* the look-up of a single-key host get (key valid, cap > 0 or not);
     * *sent_ns_p: when a GET it sent left (for the lease) */
    kvf__sget_res_t (*get)(kvf_store_h st, const char *key, void *buf,
                           size_t cap, kvf_sreps_t *e, uint64_t *sent_ns_p);
    /* a put wrote (sent_ns 0), or a get whose GET left at sent_ns read,
     * key's bytes at replica k of e */
    void (*seen)(kvf_store_h st, const char *key, const kvf_sreps_t *e,
                 unsigned k, uint64_t sent_ns);
    /* key was removed, or a put of it failed */
    void (*gone)(kvf_store_h st, const char *key);
} kvf__sstrat_ops_t;

extern const kvf__sstrat_ops_t kvf__slease_ops, kvf__sloc_ops, kvf__sview_ops,
    kvf__spview_ops;

extern __thread kvf_store_timing_t kvf__stl_timing;

/* The first strategy that serves a single-key get, in table order. */
static inline kvf__sget_res_t kvf__strat_get(kvf_store_h st, const char *key,
                                             void *buf, size_t cap,
                                             kvf_sreps_t *e,
                                             uint64_t *sent_ns_p)
{
    kvf__sget_res_t res;
    unsigned i;

    for (i = 0; i < st->nstrat; i++) {
        if (st->strat[i]->get != NULL &&
            (res = st->strat[i]->get(st, key, buf, cap, e, sent_ns_p)) !=
                KVF__SGET_NONE) {
            return res;
        }
    }
    return KVF__SGET_NONE;
}

/* Every strategy learns where key's bytes are (see .seen). */
static inline void kvf__strat_seen(kvf_store_h st, const char *key,
                                   const kvf_sreps_t *e, unsigned k,
                                   uint64_t sent_ns)
{
    unsigned i;

    for (i = 0; i < st->nstrat; i++) {
        if (st->strat[i]->seen != NULL) {
            st->strat[i]->seen(st, key, e, k, sent_ns);
        }
    }
}

/* Every strategy forgets key. */
static inline void kvf__strat_gone(kvf_store_h st, const char *key)
{
    unsigned i;

    for (i = 0; i < st->nstrat; i++) {
        if (st->strat[i]->gone != NULL) {
            st->strat[i]->gone(st, key);
        }
    }
}

#endif
