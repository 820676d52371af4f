/*
 * kvferry store client: a key -> bytes cache spread over storage nodes.
 * The master holds metadata only (where each object lives, its size and
 * checksum); the bytes move between the caller's registered memory and
 * the nodes' pools through the transfer engine, zero-copy.
 *
 *   kvf_store_params_t p = {.field_mask = KVF_STORE_PARAM_MASTER,
 *                           .master = "127.0.0.1:17800"};
 *   kvf_store_h st;
 *   kvf_store_connect(&p, &st);
 *   kvf_engine_reg(kvf_store_engine(st), buf, len, KVF_MEM_HOST, 0, &r);
 *   kvf_store_put(st, "layer0/blk42", buf, 65536, NULL);
 *   kvf_store_get(st, "layer0/blk42", buf, len, &got, 0);
 *
 * put: allocate on the master -> write every replica -> commit with the
 * checksum. get: look up (takes a read lease) -> read one replica ->
 * verify the checksum; on a mismatch or a failed read the next replica is
 * tried, and when none is good the get fails with KVF_ERR_CHECKSUM (or the
 * read's error): a get never hands back wrong bytes.
 *
 * Buffers must lie inside memory registered with kvf_store_engine(): host,
 * pinned or GPU (KVF_MEM_CUDA). For memory the CPU cannot read (GPU), pass
 * KVF_STORE_DEVICE_MEM: checksums are then computed by the node.
 *
 * A handle is safe to use from several threads at once (it keeps a pool of
 * master connections and shares its engine and peers).
 */
#ifndef KVFERRY_STORE_H
#define KVFERRY_STORE_H

#include <kvferry/engine.h>

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KVF_STORE_KEY_MAX     1024 /* bytes of a key, NUL excluded */
#define KVF_STORE_REPLICA_MAX 8
#define KVF_STORE_BATCH_MAX   4096 /* keys in one batch call */
#define KVF_STORE_SEG_MAX     272  /* segment name, NUL included */

typedef struct kvf_store *kvf_store_h;

enum kvf_store_params_field {
    KVF_STORE_PARAM_MASTER = 1u << 0,
    KVF_STORE_PARAM_ENGINE = 1u << 1,
    KVF_STORE_PARAM_TIMEOUT = 1u << 2,
    KVF_STORE_PARAM_TRANSPORTS = 1u << 3
};

typedef struct kvf_store_params {
    uint64_t field_mask;
    const char *master;     /* "host:port"; default: config key `master` */
    kvf_engine_h engine;    /* borrowed, outlives the handle; NULL: the
                               client creates its own (initiator only) */
    unsigned timeout_ms;    /* bound on every wait (default 5000) */
    const char *transports; /* for the client's own engine (NULL = auto) */
} kvf_store_params_t;

/* Flags of puts and gets. */
#define KVF_STORE_PIN        (1u << 0) /* put: never evicted */
#define KVF_STORE_DEVICE_MEM (1u << 1) /* buffer is not CPU-readable (GPU) */
/* put: an existing key is replaced at commit, atomically: until the
 * commit its readers get the old value, after it the new one (never a
 * miss, never a mix); the old object's space is freed once its read
 * leases end. Without it a put of an existing key is KVF_ERR_EXISTS. */
#define KVF_STORE_REPLACE (1u << 2)

typedef struct kvf_store_put_opts {
    unsigned replicas; /* 0 = the master's default; distinct nodes */
    unsigned flags; /* KVF_STORE_PIN, KVF_STORE_DEVICE_MEM, KVF_STORE_REPLACE */
} kvf_store_put_opts_t;

/* What the master knows of one object. */
typedef struct kvf_store_info {
    uint64_t size;
    uint64_t checksum; /* kvf_checksum() of the bytes */
    unsigned replicas;
    unsigned lease_ms; /* read lease granted by kvf_store_query */
    char segment[KVF_STORE_REPLICA_MAX][KVF_STORE_SEG_MAX];
    uint64_t addr[KVF_STORE_REPLICA_MAX];
} kvf_store_info_t;

/* One entry of kvf_store_list. */
typedef struct kvf_store_entry {
    const char *key; /* valid during the callback only */
    uint64_t size;
    unsigned replicas;
    int committed; /* 0 while its put is in progress */
} kvf_store_entry_t;

/* Connects to the master (fails with KVF_ERR_CONNECT within the timeout). */
KVF_API kvf_status_t kvf_store_connect(const kvf_store_params_t *params,
                                       kvf_store_h *store_p);
/* Closes connections and peers; destroys the engine if the client made it.
 * No call may be in progress on the handle. */
KVF_API void kvf_store_disconnect(kvf_store_h store);

/* The engine the client moves data with: register buffers there. */
KVF_API kvf_engine_h kvf_store_engine(kvf_store_h store);

/* How the handle's last opened master connection goes: "unix" (the
 * master's abstract unix socket: master on a loopback address, same
 * network namespace, master_unix on, engine not forced onto tcp) or
 * "tcp". */
KVF_API const char *kvf_store_master_link(kvf_store_h store);

/* Stores len bytes at buf (inside registered memory) under key. A key
 * already stored gives KVF_ERR_EXISTS; one being written KVF_ERR_BUSY.
 * opts may be NULL. */
KVF_API kvf_status_t kvf_store_put(kvf_store_h store, const char *key,
                                   const void *buf, size_t len,
                                   const kvf_store_put_opts_t *opts);

/* Reads the object into buf (capacity cap, inside registered memory) and
 * sets *len_p to its size. KVF_ERR_NO_KEY if absent, KVF_ERR_NOT_READY if
 * its put is not committed, KVF_ERR_NO_RESOURCE if cap is too small,
 * KVF_ERR_CHECKSUM if no replica holds the right bytes. flags:
 * KVF_STORE_DEVICE_MEM. A get that fails may leave any bytes in buf. */
KVF_API kvf_status_t kvf_store_get(kvf_store_h store, const char *key,
                                   void *buf, size_t cap, size_t *len_p,
                                   unsigned flags);

/* Removes the object: the key is gone at once (gets miss, a put may store
 * it again). An object a reader holds under a read lease keeps its space
 * until that lease ends, so the reader's bytes stay intact. KVF_ERR_BUSY
 * while its put is in progress, KVF_ERR_NO_KEY if absent. */
KVF_API kvf_status_t kvf_store_remove(kvf_store_h store, const char *key);

/* KVF_OK if the key is stored and committed, KVF_ERR_NOT_READY while its
 * put is in progress, else KVF_ERR_NO_KEY. */
KVF_API kvf_status_t kvf_store_exists(kvf_store_h store, const char *key);

/* Size, checksum and replicas of a committed object; takes a read lease
 * of info->lease_ms during which the replicas stay where they are. */
KVF_API kvf_status_t kvf_store_query(kvf_store_h store, const char *key,
                                     kvf_store_info_t *info_p);

/* Reads the object a kvf_store_query of key described (info, as it
 * returned it) into buf (capacity cap, inside registered memory), from
 * the replicas info names, without asking the master again; verified
 * against info->checksum as kvf_store_get verifies. For a caller that
 * sizes its buffer from the object: query, then read, is one master
 * round trip. Within info->lease_ms of the query the replicas stay where
 * they are; a later read may find their space reused and fail
 * (KVF_ERR_CHECKSUM), never hand back wrong bytes. */
KVF_API kvf_status_t kvf_store_read(kvf_store_h store, const char *key,
                                    const kvf_store_info_t *info, void *buf,
                                    size_t cap, size_t *len_p, unsigned flags);

/* Batch forms: count keys at once (one master round trip per phase, one
 * engine batch). statuses[i] gets each key's result; the return value is
 * KVF_OK when all succeeded, else the first error. */
KVF_API kvf_status_t kvf_store_put_batch(kvf_store_h store, size_t count,
                                         const char *const *keys,
                                         const void *const *bufs,
                                         const size_t *lens,
                                         const kvf_store_put_opts_t *opts,
                                         kvf_status_t *statuses);
KVF_API kvf_status_t kvf_store_get_batch(kvf_store_h store, size_t count,
                                         const char *const *keys,
                                         void *const *bufs, const size_t *caps,
                                         size_t *lens, unsigned flags,
                                         kvf_status_t *statuses);
/* kvf_store_get_batch without the host's verification: the bytes are
 * read into bufs and NOT hashed by the client; sums[i] gets the checksum
 * the store recorded at put (kvf_checksum() of the object's bytes). The
 * caller MUST verify each object against sums[i] before using it (e.g.
 * with kvf_gpu_copy_blocks_sum's expect while moving it to the GPU, which
 * checks it at no CPU cost) and treat a mismatch as a miss. A read that
 * fails tries the next replica; a replica holding wrong bytes is not
 * noticed here. For memory the CPU could hash but should not (a pinned
 * stage whose bytes the GPU verifies anyway). */
KVF_API kvf_status_t kvf_store_get_batch_sums(kvf_store_h store, size_t count,
                                              const char *const *keys,
                                              void *const *bufs,
                                              const size_t *caps, size_t *lens,
                                              unsigned flags, uint64_t *sums,
                                              kvf_status_t *statuses);
KVF_API kvf_status_t kvf_store_remove_batch(kvf_store_h store, size_t count,
                                            const char *const *keys,
                                            kvf_status_t *statuses);
KVF_API kvf_status_t kvf_store_exists_batch(kvf_store_h store, size_t count,
                                            const char *const *keys,
                                            kvf_status_t *statuses);

/* exists_batch for keys about to be read: each committed object found
 * (KVF_OK) is also held under a read lease, as a get's look-up holds it
 * (not evicted, its space not reused, for *lease_ms_p ms; 0 where the
 * client's lease budget is spent), and counts as just used for eviction.
 * For a cache's look-up ahead of its load: what it found stays until
 * the load, however full the pool. One master round trip. lease_ms_p
 * may be NULL. */
KVF_API kvf_status_t kvf_store_hold_batch(kvf_store_h store, size_t count,
                                          const char *const *keys,
                                          kvf_status_t *statuses,
                                          unsigned *lease_ms_p);

/* ---- views: objects read in place, without a copy ----------------------
 *
 * A view is an object's bytes where they lie: inside this process's
 * mapping of a node's pool (a node of this host reached over shm). The
 * caller reads them in place (e.g. a GPU kernel through one
 * cudaHostRegister of the whole mapping), instead of having them copied
 * into its buffer.
 *
 *   kvf_store_view_t v[2];
 *   kvf_store_view_lease_h lease;
 *   const char *keys[2] = {"a", "b"};
 *   if (kvf_store_view_get(st, 2, keys, v, &lease) == KVF_OK) {
 *       for each i: v[i].status == KVF_OK ? use v[i].ptr, v[i].len and
 *                   check v[i].checksum : copy it with kvf_store_get
 *       kvf_store_view_release(lease);    // KVF_OK: the views held
 *   }
 *
 * Lifetime: one look-up on the master takes each key's read lease
 * (config key lease_ms, 2 s by default: the object's space is not reused
 * meanwhile, even if it is removed), and each node involved grants the
 * ranges under a shm lease (its timeout_ms, 5 s by default: the node's
 * pool stays registered; its deregistration waits for the lease, at most
 * its lease_break_ms, 500 ms by default, before it breaks it). The views
 * are valid until kvf_store_view_left_ms() reaches 0 or the release,
 * whichever comes first. Holding views longer is the caller's error:
 * reads after that may see the space reused by another object (never a
 * fault: the mapping stays until the release), which verifying the
 * bytes against checksum catches. So verify every view you use, and
 * release as soon as its bytes are consumed (a GPU kernel reading a view
 * must have finished before the release).
 *
 * Mappings: a view's pointer lies in [map_base, map_base + map_len), one
 * mapping of a node's pool window, the same for every view of that pool
 * while it stays mapped. It stays mapped at least until every view into
 * it is released; afterwards it may be unmapped at any time (the node
 * freed or deregistered its pool, the node went away, the store
 * disconnected). kvf_store_view_unmap_hook() tells a caller that
 * registered a mapping elsewhere (cudaHostRegister) when to undo it. */

/* One key's view. */
typedef struct kvf_store_view {
    const void *ptr;      /* the object's first byte here; NULL unless
                             status is KVF_OK (or the object is empty) */
    uint64_t len;         /* the object's size (when the key was found) */
    uint64_t checksum;    /* kvf_checksum() of its bytes, recorded at put */
    kvf_status_t status;  /* see kvf_store_view_get */
    const void *map_base; /* the whole mapping ptr lies in (NULL: none) */
    uint64_t map_len;
} kvf_store_view_t;

/* The leases the views of one kvf_store_view_get hold. */
typedef struct kvf_store_view_lease *kvf_store_view_lease_h;

/* Looks count keys up (one master round trip, taking the read leases)
 * and views each through a replica on a node reached over shm. Returns
 * KVF_OK when the look-up worked; then *lease_p is set (release it, even
 * when no view is usable) and views[i].status says, per key:
 * KVF_OK (ptr, len, checksum, map_base, map_len set), KVF_ERR_NO_KEY
 * (absent), KVF_ERR_NOT_READY (its put is not committed),
 * KVF_ERR_UNSUPPORTED (no replica can be viewed: its nodes are reached
 * over tcp or do not share that memory; len and checksum are set: copy
 * it with kvf_store_get), KVF_ERR_INVALID_PARAM or
 * KVF_ERR_KEY_TOO_LARGE (a bad key), or the error of its nodes
 * (KVF_ERR_PEER_UNREACHABLE ...). Any other return: no lease, and every
 * views[i].status holds that error: KVF_ERR_INVALID_PARAM (store, keys,
 * views or lease_p NULL, count 0 or over KVF_STORE_BATCH_MAX: then views
 * is left untouched), or the master's failure. An empty object gets KVF_OK with
 * ptr NULL, len 0. */
KVF_API kvf_status_t kvf_store_view_get(kvf_store_h store, size_t count,
                                        const char *const *keys,
                                        kvf_store_view_t *views,
                                        kvf_store_view_lease_h *lease_p);
/* Flags of kvf_store_view_get_flags. KVF_STORE_VIEW_SHARED: the views
 * may lie under a node's lease shared with other views of this handle
 * (kept open and renewed before it ends: a view call then costs the
 * master's look-up alone, no node round trip). Their lifetime is the
 * same (kvf_store_view_left_ms); a node's revocation of a shared lease
 * is reported by the release that ends it, not by every release. */
#define KVF_STORE_VIEW_SHARED 1u
/* kvf_store_view_get with flags (0: the same call). */
KVF_API kvf_status_t kvf_store_view_get_flags(kvf_store_h store, size_t count,
                                              const char *const *keys,
                                              unsigned flags,
                                              kvf_store_view_t *views,
                                              kvf_store_view_lease_h *lease_p);
/* Milliseconds the views of lease stay valid (0: expired). */
KVF_API unsigned kvf_store_view_left_ms(kvf_store_view_lease_h lease);
/* Ends the leases; the views are gone (their pointers must not be read
 * any more). KVF_OK when every lease held until now, so reads made
 * through the views before this call saw the objects' bytes (still:
 * verify them); KVF_ERR_TIMEOUT when released after the views expired,
 * KVF_ERR_CONN_RESET when a node revoked its lease (it deregistered its
 * pool or stopped). NULL: KVF_ERR_INVALID_PARAM. Release every lease
 * before kvf_store_disconnect (which ends leases still open, logging an
 * error: their handles are then invalid). */
KVF_API kvf_status_t kvf_store_view_release(kvf_store_view_lease_h lease);
/* Ends the nodes' leases kept open for shared views
 * (KVF_STORE_VIEW_SHARED) that no view uses and that end within two
 * seconds, so that an idle share is ended before its time rather than
 * revoked by its node. A process that takes shared views calls it at
 * least once a second while it holds any (kvferry resp does, on its
 * loops' timer); it costs one pass over the handle's shares. */
KVF_API void kvf_store_view_trim(kvf_store_h store);

/* The process's hook told just before a mapping that views were handed
 * out of is unmapped (no view into it is held any more): base and len
 * are a map_base and map_len views carried. Called from whichever
 * kvferry thread unmaps it, under that ep's mapping lock: it must return
 * quickly and call no kvferry function (cudaHostUnregister is fine). One
 * per process; a later call replaces it; fn NULL removes it. */
typedef void (*kvf_store_unmap_fn)(void *arg, const void *base, uint64_t len);
KVF_API void kvf_store_view_unmap_hook(kvf_store_unmap_fn fn, void *arg);

/* ---- put views: objects written in place -----------------------------
 *
 * The write side of views: kvf_store_view_put allocates objects on the
 * master (as kvf_store_put_batch does) and hands out each one's space
 * where it lies, inside this process's mapping of a node's pool (a node
 * of this host reached over shm). The caller writes the bytes there
 * itself (a GPU copy kernel through one cudaHostRegister of the mapping,
 * threads, anything), then commits them: no copy through a buffer of
 * its own.
 *
 *   kvf_store_view_t v[2];
 *   kvf_store_put_view_h pv;
 *   const char *keys[2] = {"a", "b"};
 *   size_t lens[2] = {65536, 65536};
 *   if (kvf_store_view_put(st, 2, keys, lens, NULL, v, &pv) == KVF_OK) {
 *       for each i: v[i].status == KVF_OK ? write v[i].len bytes at
 *                   (void *)v[i].ptr : put it with kvf_store_put_batch
 *       kvf_store_view_put_commit(pv, NULL, NULL, statuses);
 *   }
 *
 * Lifetime: each node involved grants the keys' ranges under one write
 * lease (its shm timeout_ms, 5 s by default; its deregistration waits
 * for the lease at most its lease_break_ms, then breaks it), and the
 * master undoes a put not committed within its put_timeout_ms (10 s by
 * default; the client counts it with its own `put_timeout_ms` key, from
 * before the allocation). kvf_store_view_put_left_ms() says how long
 * both still run: every write must be over (a GPU kernel synchronized)
 * and the commit made before it reaches 0. A commit after a lease ended
 * commits nothing of that node: its keys fail with KVF_ERR_TIMEOUT
 * (held too long) or KVF_ERR_CONN_RESET (the node revoked it) and are
 * aborted; an object is never committed from a lease that did not hold.
 * Until its commit an object is not found by anyone (a get gets
 * KVF_ERR_NOT_READY, as during any put). A disconnect aborts the put
 * views still open (logging an error). The mappings are those of read
 * views (map_base, map_len): they stay mapped while a put view into
 * them is open, and kvf_store_view_unmap_hook() is told before they go.
 *
 * Checksums: a commit records the checksum the caller gives (kvf_checksum
 * of the bytes it wrote, computed where it likes: threads, a GPU's
 * kvf_gpu_copy_blocks_sum) or, with sums NULL, computes it here from the
 * mapping. A wrong checksum is not noticed at commit: every later get of
 * the object fails with KVF_ERR_CHECKSUM (never wrong bytes). */

/* The allocations and write leases of one kvf_store_view_put. */
typedef struct kvf_store_put_view *kvf_store_put_view_h;

/* Allocates count objects of lens[i] bytes under keys[i] (one master
 * round trip, PUT_START as kvf_store_put_batch; opts as there, NULL for
 * none, but one replica: opts->replicas 1, or 0 where the master's
 * default is 1) and opens write views on them: one write lease per node.
 * views[i] per key (checksum 0): status KVF_OK (ptr writable for len
 * bytes, cast from const; map_base, map_len: the mapping it lies in; an
 * empty object has ptr NULL), KVF_ERR_EXISTS (stored; unless
 * KVF_STORE_REPLACE), KVF_ERR_BUSY (being put), KVF_ERR_NO_SPACE (the
 * pools are full), KVF_ERR_UNSUPPORTED (the object cannot be written in
 * place: its node is reached over tcp or its pool is not shareable
 * memory, or it has more than one replica; it is NOT allocated then:
 * put it with kvf_store_put_batch), KVF_ERR_INVALID_PARAM or
 * KVF_ERR_KEY_TOO_LARGE (a bad key), or the error of its node. Keys other
 * than KVF_OK are not allocated. Returns KVF_OK when the allocation
 * worked: then *pv_p is set and must be committed or aborted (even when
 * no view is usable). Any other return: no handle, no object, every
 * views[i].status holds that error: KVF_ERR_INVALID_PARAM (store, keys,
 * lens, views or pv_p NULL, count 0 or over KVF_STORE_BATCH_MAX:
 * then views is left untouched; opts->replicas over
 * KVF_STORE_REPLICA_MAX), or the master's failure. */
KVF_API kvf_status_t kvf_store_view_put(kvf_store_h store, size_t count,
                                        const char *const *keys,
                                        const size_t *lens,
                                        const kvf_store_put_opts_t *opts,
                                        kvf_store_view_t *views,
                                        kvf_store_put_view_h *pv_p);
/* Milliseconds left to write and commit (0: expired, or pv NULL): until
 * the first of its write leases or of the master's put deadlines ends. */
KVF_API unsigned kvf_store_view_put_left_ms(kvf_store_put_view_h pv);
/* Ends the write leases and commits (PUT_END, one round trip) every key
 * whose view was KVF_OK and whose keep[i] is nonzero (keep NULL: all),
 * with checksum sums[i] (sums NULL: computed here from the mapping); the
 * others are aborted. statuses[i] (statuses may be NULL) per key: KVF_OK
 * (committed), KVF_ERR_CANCELED (keep[i] 0: aborted), the view's status
 * (not allocated), KVF_ERR_TIMEOUT (past kvf_store_view_put_left_ms) or
 * KVF_ERR_CONN_RESET (the node revoked its lease): aborted, or the
 * master's verdict (KVF_ERR_STALE: the master undid the put). Returns
 * KVF_OK when every key kept committed, else the first error of one (or
 * the commit round trip's failure: its keys are then undone by the
 * master at its put timeout). Frees pv (NULL: KVF_ERR_INVALID_PARAM). */
KVF_API kvf_status_t kvf_store_view_put_commit(kvf_store_put_view_h pv,
                                               const int *keep,
                                               const uint64_t *sums,
                                               kvf_status_t *statuses);
/* Ends the write leases and aborts every key (no object is left of
 * them), and frees pv (NULL: nothing). */
KVF_API void kvf_store_view_put_abort(kvf_store_put_view_h pv);

/* Maps now, for views and put views to come, every pool window of every
 * node the master knows that this client reaches over shm, and calls
 * fn(arg, base, len) for each mapping (a view or put view into that
 * pool later lies in it while it stays mapped: until its node
 * deregisters its pool or goes away, or the store disconnects;
 * kvf_store_view_unmap_hook() tells when). For a caller that registers
 * the mappings elsewhere ahead of time (cudaHostRegister takes about a
 * second per few GiB, better not paid by the first transfer). Nodes
 * reached over tcp are skipped. Returns KVF_OK, or the master's failure
 * to list its nodes (fn may have been called for some before). */
KVF_API kvf_status_t kvf_store_view_maps(kvf_store_h store,
                                         kvf_store_unmap_fn fn, void *arg);

/* Calls fn for each object whose key starts with prefix (NULL = all), at
 * most max of them (0 = no limit other than one reply's size). */
KVF_API kvf_status_t
kvf_store_list(kvf_store_h store, const char *prefix, size_t max,
               void (*fn)(const kvf_store_entry_t *e, void *arg), void *arg);

#ifdef __cplusplus
}
#endif

#endif
