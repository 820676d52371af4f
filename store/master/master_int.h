/*
 * Store master, private: nodes, objects, counters, and the functions the
 * master's files share (objects.c: metadata and its rules; master.c:
 * RPC serving; http.c: /metrics and /status). Every field below the
 * server part is guarded by kvf_master.lock.
 */
#ifndef KVF_STORE_MASTER_INT_H
#define KVF_STORE_MASTER_INT_H
#if !defined(KVF_LAYER_STORE) && !defined(KVF_TEST_INTERNALS)
#error "store/master/master_int.h is private to store/: use <kvferry/store.h>"
#endif

#include "store/master/opts.h"
#include "store/master/pool_alloc.h"
#include "store/proto/msg.h"
#include "store/proto/proto.h"
#include "core/sock.h"

#include <pthread.h>
#include <sys/socket.h>

enum { KVF_OBJ_PENDING = 0, KVF_OBJ_COMMITTED = 1 };

#define KVF_M_RCHANS 3 /* read channels per disk tier */

typedef struct kvf_mnode {
    uint64_t uid; /* chosen by the node process at start */
    unsigned char instance[KVF_SM_INSTANCE_LEN]; /* random, per process */
    uint64_t gen; /* given by the master at each registration */
    char segment[KVF_STORE_SEG_MAX];
    uint64_t base; /* pool address in the node's engine */
    kvf_pool_alloc_t pa;
    uint64_t last_hb_ms;
    /* its inventory server ("" = none: commits are not recorded) */
    char inv_addr[KVF_SM_INV_ADDR_MAX];
    /* its report (inventory, disk tier) has not ended, so nothing new is
     * placed on it (its space may hold objects not rebuilt yet) */
    int rebuilding;
    struct kvf_mi_chan *chan; /* to its inventory (inventory.c), or NULL */
    /* to its disk tier (the same server): WRITEs and DROPs in order on
     * one, READs on KVF_M_RCHANS others taken in turn (several batches
     * of loads in flight: the next one's I/O starts while the node
     * checks the last and the master answers it) */
    struct kvf_mi_chan *tchan;
    struct kvf_mi_chan *rchan[KVF_M_RCHANS];
    unsigned rnext;
    /* its disk tier (tier.c): the file's space, in 4 KiB units */
    kvf_pool_alloc_t dpa;
    int tier_on;           /* a disk tier that works (off after a failure) */
    uint64_t tier_writing; /* bytes of WRITEs in flight */
    struct kvf_mnode *next;
} kvf_mnode_t;

/* Where a replica's bytes are: in the pool (blk), in the node's disk
 * tier (dblk, dstate), or both. */
enum { KVF_D_NONE = 0, KVF_D_WRITING = 1, KVF_D_STORED = 2 };

typedef struct kvf_mrep {
    kvf_mnode_t *node;
    kvf_pa_block_t *blk;  /* its place in the pool, or NULL: disk only */
    kvf_pa_block_t *dblk; /* its place in the disk tier, or NULL */
    uint8_t dstate;       /* KVF_D_*: of dblk */
    uint8_t loading;      /* blk is being filled from the disk tier */
} kvf_mrep_t;

/* The length of a client identity: kind (4, 6, 'u') + address or uid. */
#define KVF_M_PEER_KEY_LEN 17

typedef struct kvf_mlease kvf_mlease_t;

/* A client identity: every connection from one tcp address, or of one
 * local uid over the unix socket (limits.c). What it holds in pending
 * puts, reservations and read leases counts against the per-client
 * limits, whatever the number of its connections. Freed once no
 * connection, pending object or lease refers to it. */
typedef struct kvf_mclient {
    unsigned char key[KVF_M_PEER_KEY_LEN];
    uint64_t pending;            /* pending puts and reservations */
    uint64_t bytes;              /* their bytes, every replica */
    uint64_t leased;             /* bytes under its read leases */
    uint64_t nleases;            /* its lease records */
    kvf_mlease_t *lhead, *ltail; /* its leases, the first to end first */
    unsigned refs;               /* connections, pending objects, leases */
    struct kvf_mclient *next;    /* chain of the identity table */
} kvf_mclient_t;

typedef struct kvf_mobj {
    char *key;
    size_t keylen;
    uint64_t hash;
    uint64_t size;
    uint64_t checksum;
    uint64_t put_id;
    uint64_t deadline_ms;        /* PENDING: reclaimed after */
    uint64_t lease_until_ms;     /* neither evicted nor removed before */
    uint64_t inv_epoch, inv_seq; /* as recorded in node inventories */
    /* released: INV_DELs not answered yet; its space stays taken until
     * they are (the bytes, counted in kvf_master.releasing) */
    unsigned inv_rel;
    uint64_t rel_bytes;
    uint8_t released; /* off the table, on the doomed list */
    uint8_t state;
    uint8_t flags; /* KVF_STORE_PIN */
    uint8_t nrep;
    uint8_t on_disk_list; /* on kvf_master.dlru: no replica in a pool */
    uint8_t shadow;       /* the pool blocks of a demoted object */
    unsigned tier_busy;   /* tier operations in flight naming it */
    kvf_mrep_t rep[KVF_STORE_REPLICA_MAX];
    kvf_mclient_t *owner;           /* PENDING: the client that started it */
    kvf_mlease_t *leases;           /* the clients' leases on it */
    uint64_t owner_bytes;           /* PENDING: counted in owner->bytes */
    struct kvf_mobj *pnext;         /* PENDING: chain of the put id index */
    struct kvf_mobj *hnext;         /* hash chain */
    struct kvf_mobj *lprev, *lnext; /* LRU, pending or doomed list */
} kvf_mobj_t;

typedef struct kvf_master_stats {
    uint64_t hits, misses, evictions, errors, puts, removes;
    uint64_t reclaimed, nodes_lost, objects_lost, aborted;
    uint64_t unleased; /* gets served without a lease (over the budget) */
    /* disk tiers (tier.c) */
    uint64_t tier_writes, tier_write_bytes, tier_reads, tier_read_bytes;
    uint64_t tier_corrupt, tier_errors, tier_demotions, tier_evictions;
    uint64_t tier_load_waits;
} kvf_master_stats_t;

typedef struct kvf_mconn kvf_mconn_t;
typedef struct kvf_mpeer kvf_mpeer_t;
typedef struct kvf_mloop kvf_mloop_t;

/* What the object rules and the node channels call above them, through
 * pointers master.c sets at start (so no file calls up): the disk tier's
 * policy (tier.c) and the answers of the channels (objects.c, tier.c). */
typedef struct kvf_m_hooks {
    void (*tier_commit)(kvf_master_t *m, kvf_mobj_t *o);
    int (*tier_demote)(kvf_master_t *m, kvf_mobj_t *o);
    void (*tier_forget)(kvf_master_t *m, kvf_mobj_t *o);
    int (*tier_uncopied)(const kvf_mobj_t *o);
    int (*tier_usable)(const kvf_mobj_t *o);
    void (*released)(kvf_master_t *m, kvf_mobj_t *o);
    void (*tier_answer)(kvf_master_t *m, kvf_mobj_t *o, uint64_t uid,
                        uint64_t gen, uint8_t op, kvf_status_t st);
} kvf_m_hooks_t;

struct kvf_master {
    kvf_master_opts_t opts;
    kvf_m_hooks_t hooks;
    uint64_t epoch;
    pthread_mutex_t lock;
    /* metadata */
    kvf_mobj_t **table;
    size_t nbuckets;
    size_t nobjs;
    kvf_mobj_t lru;           /* sentinel: lnext most recent, lprev least */
    kvf_mobj_t dlru;          /* the same, of objects on disk tiers only */
    size_t ndisk_only;        /* objects on dlru */
    pthread_cond_t tier_cond; /* a tier load ended (tier.c) */
    kvf_mobj_t pending;       /* sentinel of uncommitted puts, oldest last */
    kvf_mobj_t **ptable;      /* pending objects by put id */
    size_t npbuckets;
    size_t npend;
    kvf_mobj_t doomed; /* removed, space kept until their lease ends */
    kvf_mnode_t *nodes;
    size_t nnodes;
    uint64_t next_gen;
    uint64_t next_put_id;
    uint64_t reserved; /* bytes in reservations' blocks */
    kvf_master_stats_t st;
    /* server */
    kvf_engine_h engine; /* initiator: checks what nodes claim */
    int lfd;
    int ufd;            /* abstract unix socket (same host), or -1 */
    char unix_name[96]; /* its name ("" = none) */
    int hfd;
    char address[KVF_HOST_MAX + 8];
    char http_address[KVF_HOST_MAX + 8];
    pthread_t reaper_thread;
    struct MHD_Daemon *httpd; /* http.c's server (libmicrohttpd) */
    int have_http;
    char http_token[72]; /* "Bearer <hex>", "" when auth is off */
    int stop;
    pthread_cond_t stop_cond;
    kvf_mloop_t *loops; /* connection event loops (loop.c) */
    unsigned nloops;
    unsigned next_loop;     /* the first loop's: where the next goes */
    unsigned nconns;        /* of all loops (atomic) */
    unsigned nconns_unix;   /* of nconns, over the unix socket (atomic) */
    int helpers;            /* node registrations in flight (atomic) */
    struct kvf_mcaps *caps; /* connection counts per peer (limits.c) */
    struct kvf_mreg *reg;   /* registration workers (loop.c) */
    /* high availability (leader.c) */
    struct kvf_elect *elect;      /* NULL: the only master */
    uint64_t term_epoch;          /* etcd revision of this leader's term */
    int deposed;                  /* its term ended: refuses everything */
    uint64_t inv_seq;             /* commits recorded in node inventories */
    struct kvf_minv *inv;         /* inventory channels (NULL: none) */
    uint64_t releasing;           /* bytes waiting for nodes' INV_DELs */
    struct kvf_mclients *clients; /* client identities (limits.c) */
};

/* A leader's epoch: the top bit set, the etcd revision below (a single
 * master's epochs have it clear; nodes order only epochs with it). */
#define KVF_M_HA_EPOCH KVF_SM_HA_EPOCH

/* objects.c -- all called with the lock held */
kvf_status_t kvf_m_init(kvf_master_t *m);
void kvf_m_fini(kvf_master_t *m);
/* Drops every object, reservation and node (a new leader's term starts
 * empty); the tables stay. */
void kvf_m_clear(kvf_master_t *m);
/* cl: the client that asks (its limits apply; NULL: none) */
kvf_status_t kvf_m_put_start(kvf_master_t *m, kvf_mclient_t *cl,
                             const char *key, uint64_t size, unsigned replicas,
                             unsigned flags, kvf_mobj_t **obj_p);
kvf_status_t kvf_m_put_end(kvf_master_t *m, const char *key, uint64_t put_id,
                           uint64_t checksum, unsigned mask);
/* Space for a client's next put, key unknown yet (a keyless pending
 * object, reclaimed at the put deadline unless committed). */
kvf_status_t kvf_m_reserve(kvf_master_t *m, kvf_mclient_t *cl, uint64_t size,
                           unsigned replicas, kvf_mobj_t **obj_p);
/* Commits pending put put_id (keyed: as PUT_END; a reservation: under
 * key, whose size must be the reserved size; a refused key leaves the
 * reservation as it was). mask 0 aborts. */
kvf_status_t kvf_m_commit(kvf_master_t *m, const char *key, uint64_t put_id,
                          uint64_t size, uint64_t checksum, unsigned mask,
                          unsigned flags);
/* A get by client cl: *leased_p 1 when it was granted a read lease, 0
 * when cl is over its lease budget (the object stays evictable). */
kvf_status_t kvf_m_get(kvf_master_t *m, kvf_mclient_t *cl, const char *key,
                       kvf_mobj_t **obj_p, int *leased_p);
kvf_status_t kvf_m_remove(kvf_master_t *m, const char *key);
/* A node answered one INV_DEL of released object o: once all have and
 * its lease is over, its space is free. */
void kvf_m_released(kvf_master_t *m, kvf_mobj_t *o);
kvf_status_t kvf_m_exists(kvf_master_t *m, const char *key);
kvf_mobj_t *kvf_m_find(kvf_master_t *m, const char *key);
/* nodes.c: a registration's claim (format, pool, and the node's engine
 * registers that pool: asked over the network, no lock), and the end of
 * a report page (count 0: the report ended). */
kvf_status_t kvf_m_node_claim(kvf_master_t *m, const kvf_sm_node_reg_t *q);
void kvf_m_report_page(kvf_master_t *m, kvf_mnode_t *n, uint32_t count,
                       size_t refused);
kvf_status_t kvf_m_node_register(kvf_master_t *m, const char *segment,
                                 uint64_t uid, const unsigned char *instance,
                                 uint64_t base, uint64_t len,
                                 const char *inv_addr, uint64_t disk_len,
                                 uint64_t *gen_p);
/* The node (uid, gen), or NULL. */
kvf_mnode_t *kvf_m_node_find(kvf_master_t *m, uint64_t uid, uint64_t gen);
/* Rebuilds one entry of node n's inventory report: the block at its
 * offset, and the committed object (a replica merged into the object of
 * the same key, size and checksum). KVF_ERR_EXISTS: the space or the key
 * is taken otherwise (logged, refused). *hint: a block of n at or before
 * e's offset where the search starts (NULL: the lowest); set to the
 * block taken (or NULL when a block was freed), so that a page in
 * offset order costs one walk. */
kvf_status_t kvf_m_rebuild_add(kvf_master_t *m, kvf_mnode_t *n,
                               const kvf_sm_inv_ent_t *e,
                               kvf_pa_block_t **hint);
kvf_status_t kvf_m_heartbeat(kvf_master_t *m, uint64_t uid, uint64_t gen,
                             uint64_t epoch);
/* Reaps zombie puts and dead nodes, evicts above the watermark. */
void kvf_m_tick(kvf_master_t *m);
uint64_t kvf_m_capacity(const kvf_master_t *m);
uint64_t kvf_m_used(const kvf_master_t *m);
size_t kvf_m_pending(const kvf_master_t *m); /* reservations not included */
size_t kvf_m_reservations(const kvf_master_t *m);
/* kvf_m_used: space of objects and pending puts, reservations not
 * included (they are `reserved`). */
size_t kvf_m_removing(const kvf_master_t *m);

/* state.c (lock held): the object table's hash and look-up, the lists,
 * the sums. */
uint64_t kvf_m_hash(const char *key, size_t len);
void kvf_m_list_init(kvf_mobj_t *s);
void kvf_m_list_unlink(kvf_mobj_t *o);
void kvf_m_list_push(kvf_mobj_t *s, kvf_mobj_t *o);
void kvf_m_obj_unlist(kvf_master_t *m, kvf_mobj_t *o);
uint64_t kvf_m_obj_bytes(const kvf_mobj_t *o);
uint64_t kvf_m_held(const kvf_master_t *m); /* reservations included */

/* table.c (lock held): the object table and the pending index,
 * written. pend_add: o becomes pending (listed, indexed by put id,
 * counted against cl); pend_del: it stops being pending; pfind: the
 * pending object of a put id; obj_name: a pending object takes its key
 * (into the table); obj_free: out of the table, lists and leases, its
 * space freed, itself freed. */
void kvf_m_pend_add(kvf_master_t *m, kvf_mobj_t *o, kvf_mclient_t *cl);
void kvf_m_pend_del(kvf_master_t *m, kvf_mobj_t *o);
kvf_mobj_t *kvf_m_pfind(kvf_master_t *m, uint64_t put_id);
kvf_status_t kvf_m_obj_name(kvf_master_t *m, kvf_mobj_t *o, const char *key);
void kvf_m_obj_free(kvf_master_t *m, kvf_mobj_t *o);

/* leases.c (lock held): release: o's key goes now, its space once no
 * lease, tier operation or node inventory refers to it (wait: the frame
 * is answered once the nodes forgot it); doomed_done: may a released o
 * be freed now. kvf_m_released (above) counts a node's answer. */
void kvf_m_release(kvf_master_t *m, kvf_mobj_t *o, int wait);
int kvf_m_doomed_done(const kvf_mobj_t *o, uint64_t now);

/* eviction.c (lock held): alloc_on: size bytes on n, evicting n's cold
 * objects when evict is set (NULL: none); evict_watermark: down to the
 * low watermark once used space passes the high one. */
kvf_pa_block_t *kvf_m_alloc_on(kvf_master_t *m, kvf_mnode_t *n, uint64_t size,
                               int evict, uint64_t now);
void kvf_m_evict_watermark(kvf_master_t *m, uint64_t now);

/* placement.c (lock held): place_order: sorts the ncand candidates in
 * the order replicas go (host with the most free space first, then its
 * nodes);
 * place: space for o's replicas from those candidates, first on hosts
 * without one of o's replicas (without evicting, then evicting unless
 * !may_evict), then on any node left. */
void kvf_m_place_order(const kvf_master_t *m, kvf_mnode_t **cand, size_t ncand);
void kvf_m_place(kvf_master_t *m, kvf_mobj_t *o, kvf_mnode_t **cand,
                 size_t ncand, uint64_t size, unsigned replicas, int may_evict,
                 uint64_t now);

/* objects.c (lock held): an object rebuilt from an inventory entry
 * (committed, no replica yet). */
kvf_mobj_t *kvf_m_rebuild_obj(kvf_master_t *m, const kvf_sm_inv_ent_t *e);

/* tier.c: the nodes' disk tiers (lock held unless said). node_init: a
 * registering node's tier of disk_len bytes; usable: o has a replica in
 * a pool to serve; relist: o moves between the pool's and the disk's LRU
 * lists as its replicas say; forget: o's disk copies go (a release);
 * commit: write-through of a committed object; demote: o leaves the
 * pool, 1 if it stays on disk (or waits for its copy), 0 if it must go;
 * wanted (takes the lock): does a GET frame need a load (a worker serves
 * it then); prefetch (takes the lock, a worker): loads the frame's
 * objects on disk only and waits for them; answer: a node's answer to a
 * WRITE or READ of o; off: a failed tier; rebuild: an INV_REPORT entry
 * flagged KVF_SM_INV_DISK. */
kvf_status_t kvf_m_tier_node_init(kvf_master_t *m, kvf_mnode_t *n,
                                  uint64_t disk_len, const char *inv_addr);
int kvf_m_tier_usable(const kvf_mobj_t *o);
/* o has no disk copy yet but a node of its with a tier (evicting it now
 * would lose it). */
int kvf_m_tier_uncopied(const kvf_mobj_t *o);
void kvf_m_tier_relist(kvf_master_t *m, kvf_mobj_t *o);
void kvf_m_tier_forget(kvf_master_t *m, kvf_mobj_t *o);
void kvf_m_tier_commit(kvf_master_t *m, kvf_mobj_t *o);
int kvf_m_tier_demote(kvf_master_t *m, kvf_mobj_t *o);
int kvf_m_tier_wanted(kvf_master_t *m, const kvf_sp_frame_t *f);
void kvf_m_tier_prefetch(kvf_master_t *m, const kvf_sp_frame_t *f);
void kvf_m_tier_answer(kvf_master_t *m, kvf_mobj_t *o, uint64_t uid,
                       uint64_t gen, uint8_t op, kvf_status_t st);
void kvf_m_tier_off(kvf_master_t *m, kvf_mnode_t *n, kvf_status_t why);
kvf_status_t kvf_m_tier_rebuild(kvf_master_t *m, kvf_mnode_t *n,
                                const kvf_sm_inv_ent_t *e,
                                kvf_pa_block_t **hint);

/* dispatch.c: serves one whole frame of client cl: runs its handler,
 * encodes the reply body in w; returns the reply's status, *rtype_p its
 * type. to_worker: is f served by a worker (it waits on a node)? */
int kvf_m_to_worker(kvf_master_t *m, const kvf_sp_frame_t *f);
/* The same on a worker: the frame then waits until the nodes answered
 * what it queued (inventory entries, tier loads); a commit or remove a
 * node did not apply fails the whole reply. */
kvf_status_t kvf_m_serve_worker(kvf_master_t *m, kvf_mclient_t *cl,
                                const kvf_sp_frame_t *f, kvf_wr_t *w,
                                uint32_t *count_p, uint16_t *flags_p,
                                uint8_t *rtype_p);
kvf_status_t kvf_m_serve(kvf_master_t *m, kvf_mclient_t *cl,
                         const kvf_sp_frame_t *f, kvf_wr_t *w,
                         uint32_t *count_p, uint16_t *flags_p,
                         uint8_t *rtype_p);
void kvf_m_count_error(kvf_master_t *m);

/* inventory.c: a leader's side of the node inventories (NULL m->inv:
 * none, as with a single master; then these do nothing). Lock held:
 * kvf_m_inv_add records committed object o (its epoch and commit
 * number set now) in its nodes' inventories; kvf_m_inv_del makes them
 * forget released object o (wait: the frame served waits for it, as a
 * remove; else not, as an eviction), returns the number of answers its
 * space waits for (kvf_m_released is called as each comes);
 * kvf_m_inv_clear forgets the objects of the term that ends. */
kvf_status_t kvf_m_inv_start(kvf_master_t *m);
void kvf_m_inv_stop(kvf_master_t *m);
void kvf_m_inv_add(kvf_master_t *m, kvf_mobj_t *o);
unsigned kvf_m_inv_del(kvf_master_t *m, kvf_mobj_t *o, int wait);
void kvf_m_inv_clear(kvf_master_t *m);
/* A worker's frame (not an event loop): runs run(arg) (it serves the
 * frame; what it queues is this frame's), then waits until the nodes
 * answered every entry it queued. Where a node did not record a commit,
 * undo(m, key, put_id) is called for each (lock held) and the worst
 * answer is returned (*stale_p: a node has seen a newer leader). */
typedef void (*kvf_m_undo_fn)(kvf_master_t *m, const char *key,
                              uint64_t put_id);
kvf_status_t kvf_m_inv_frame(kvf_master_t *m, void (*run)(void *arg), void *arg,
                             kvf_m_undo_fn undo, int *stale_p);
/* Tier operations go on the same channels' machinery, on a channel of
 * their own per node (lock held): queues op on replica i of o (wait: the
 * frame this worker serves waits for the answer; WRITE and READ count in
 * o->tier_busy until answered); in_worker: does this thread serve a
 * frame that may wait; wait: waits (lock dropped meanwhile) until every
 * entry this worker's frame queued is answered. */
kvf_status_t kvf_m_inv_tier(kvf_master_t *m, kvf_mobj_t *o, unsigned i,
                            uint8_t op, int wait);
int kvf_m_inv_in_worker(void);
void kvf_m_inv_wait(kvf_master_t *m);

/* loop.c: the connection event loop */
kvf_status_t kvf_m_loop_start(kvf_master_t *m);
void kvf_m_loop_stop(kvf_master_t *m);

/* limits.c: connection caps per peer and in all. admit counts a new
 * connection (KVF_ERR_QUOTA: over a cap, close it), release uncounts. */
kvf_status_t kvf_m_caps_init(kvf_master_t *m);
void kvf_m_caps_fini(kvf_master_t *m);
kvf_status_t kvf_m_caps_admit(kvf_master_t *m, int fd, int is_unix,
                              const struct sockaddr *sa, kvf_mpeer_t **peer_p);
void kvf_m_caps_release(kvf_master_t *m, kvf_mpeer_t *p, int is_unix);
/* limits.c: client identities (kvf_mclient_t). init/fini with the
 * metadata; get takes a reference for a new connection of peer (the
 * identity shared by its address or uid; takes the lock), put drops it
 * (takes the lock). With the lock held: ref/unref for pending objects. */
kvf_status_t kvf_m_clients_init(kvf_master_t *m);
void kvf_m_clients_fini(kvf_master_t *m);
kvf_mclient_t *kvf_m_client_get(kvf_master_t *m, const kvf_mpeer_t *peer);
void kvf_m_client_put(kvf_master_t *m, kvf_mclient_t *cl);
void kvf_m_client_ref(kvf_mclient_t *cl);
void kvf_m_client_unref(kvf_master_t *m, kvf_mclient_t *cl);
/* Read leases, lock held. grant: a lease of lease_ms on o (bytes of
 * space) for cl, counted against its budget (client_max_leased_pct of
 * the capacity, client_max_leases records); 0 when over it (nothing
 * granted). drop: o goes, its records with it. expire: ends the
 * records due by now. */
int kvf_m_lease_grant(kvf_master_t *m, kvf_mclient_t *cl, kvf_mobj_t *o,
                      uint64_t bytes, uint64_t now);
void kvf_m_lease_drop(kvf_master_t *m, kvf_mobj_t *o);
void kvf_m_lease_expire(kvf_master_t *m, uint64_t now);

/* leader.c: campaign when `metadata` is etcd (else nothing); check
 * before serving a request (KVF_ERR_NOT_LEADER from a standby or a
 * deposed leader); the state for /status (-1 no HA, 0 standby, 1
 * leader; *epoch_p the term's). */
kvf_status_t kvf_m_leader_start(kvf_master_t *m);
void kvf_m_leader_stop(kvf_master_t *m);
kvf_status_t kvf_m_leader_check(kvf_master_t *m);
int kvf_m_leader_state(kvf_master_t *m, uint64_t *epoch_p);

/* http.c */
kvf_status_t kvf_m_http_start(kvf_master_t *m, const char *listen);
void kvf_m_http_stop(kvf_master_t *m);

#endif
