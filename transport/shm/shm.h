/*
 * shm transport, private: the protocol on the local channel and the
 * structures shared by the target side (shm_server.c), the initiator side
 * (shm_lease.c: connections and leases, shm_ep.c: the ep and its
 * workers, shm_view.c: leases whose ranges are read in place), the ops and side
 * channels (shm_ops.c) and the socket and identity helpers (shm_sock.c). See
 * shm_ops.c for the design and the measurements behind it.
 *
 * Local channel: a unix stream socket in the abstract namespace, named
 * after a 128-bit random nonce, so it is reachable only from the same
 * network namespace of the same kernel. The iface address published in
 * the segment descriptor is "shm:<host id, 16 hex>:<nonce, 32 hex>".
 *
 * The messages and their fields are in msg.h. What they do: HELLO
 * proves the initiator reached this very iface (the probe memfd). BEGIN
 * has the target check every entry under its region read lock
 * (acquire), held while any lease of the connection is open: this opens
 * a *lease*; up to KVF_SHM_PIPE leases may be open (pipelining). GRANT
 * says which windows the entries lie in (the pages of a registered
 * range in a shareable allocation; MAP fetches the allocation's memfd,
 * within the lease), which ranges may be used again without asking
 * while the lease is open, and which entries the target moves itself
 * (STAGE, through the initiator's staging memfd of STAGE_SETUP) or
 * refuses. left_ms: the lease is revoked that long after the GRANT. END
 * closes the oldest open lease; no reply. A lease past its time is
 * revoked and its connection closed; the initiator counts a lease valid
 * when its copy ended before left_ms (own clock, counted from before
 * BEGIN) and the connection shows no hang-up after. SYNC lists the
 * windows the initiator maps; SYNC_ACK names those that no longer stand
 * (allocation freed, range deregistered).
 * SUM returns checksums the target computes over its own memory.
 */
#ifndef KVF_SHM_H
#define KVF_SHM_H
#if !defined(KVF_LAYER_TRANSPORT) && !defined(KVF_TEST_INTERNALS)
#error "transport/shm/shm.h is private to transport/"
#endif

#include "transport/transport.h"
#include "transport/limits.h"

#include <pthread.h>

#include "transport/shm/msg.h"

#define KVF_SHM_RIDE_MS                                                        \
    20 /* a lease carries later requests                                       \
          (inside its range grants) for                                        \
          at most this long ... */
#define KVF_SHM_LINGER_US                                                      \
    300 /* ... and stays open this long                                        \
           for more work when idle */
#define KVF_SHM_WARM_MS                                                        \
    200 /* a worker that moved requests this recently keeps a lease open       \
           while idle, renewed every KVF_SHM_RIDE_MS (key shm_warm_ms) */
#define KVF_SHM_STAGE_LEN    (4u << 20) /* staging buffer per connection */
#define KVF_SHM_LEASE_BYTES  (8u << 20) /* a lease covers at most this */
#define KVF_SHM_LEASE_MIN    (1u << 19) /* ... and takes its share above this */
#define KVF_SHM_LEASE_SEGS   4096       /* ... and this many entries */
#define KVF_SHM_STREAM_MIN   (1u << 20) /* leases from this size stream */
#define KVF_SHM_PREFETCH_LEN 1024       /* WRITEs, see kvf_shm_lease_copy */
#define KVF_SHM_ADDR_MAX     64

/* Growable scratch buffer. */
typedef struct kvf_shm_buf {
    unsigned char *p;
    size_t cap;
} kvf_shm_buf_t;

kvf_status_t kvf_shm_buf_reserve(kvf_shm_buf_t *b, size_t len);
void kvf_shm_buf_free(kvf_shm_buf_t *b);

/* ---- identity and sockets (shm_sock.c) -------------------------------- */

/* Hash of (boot id, network namespace): equal on both sides is required
 * before trying shm, never sufficient (the handshake decides). */
uint64_t kvf_shm_host_id(void);
kvf_status_t kvf_shm_nonce(unsigned char nonce[KVF_SHM_NONCE_LEN]);
void kvf_shm_format_address(char *out, size_t outlen, uint64_t host_id,
                            const unsigned char nonce[KVF_SHM_NONCE_LEN]);
kvf_status_t kvf_shm_parse_address(const char *addr, uint64_t *host_id_p,
                                   unsigned char nonce[KVF_SHM_NONCE_LEN]);

kvf_status_t kvf_shm_listen(const unsigned char nonce[KVF_SHM_NONCE_LEN],
                            int *fd_p);
kvf_status_t kvf_shm_connect(const unsigned char nonce[KVF_SHM_NONCE_LEN],
                             uint64_t deadline_ms, int *fd_p);

/* Sends one frame (header + meta), pass_fd attached when >= 0. */
kvf_status_t kvf_shm_send(int fd, uint8_t type, uint16_t flags,
                          kvf_status_t status, const void *meta,
                          uint32_t meta_len, uint32_t count, int pass_fd,
                          uint64_t deadline_ms);
/* Receives one frame: header into *hdr, meta into buf (grown), and a
 * passed fd into *rfd_p (-1 when none; any fd is closed when rfd_p is
 * NULL). Frames with payload or oversized metadata: KVF_ERR_PROTOCOL. */
kvf_status_t kvf_shm_recv(int fd, kvf_frame_hdr_t *hdr, kvf_shm_buf_t *buf,
                          int *rfd_p, uint64_t deadline_ms);

/* memcpy when both sides are host memory; through the memory layer when
 * one side lies in a registered GPU region. */
kvf_status_t kvf_shm_copy(void *dst, const void *src, size_t len);
/* The same with non-temporal stores (large leases); kvf_shm_fence()
 * orders them before anything that follows. */
kvf_status_t kvf_shm_copy_stream(void *dst, const void *src, size_t len);
void kvf_shm_fence(void);
/* Two streaming copies of len bytes at once (host memory, destinations
 * 32-byte aligned, len a multiple of 128 and >= 512, AVX2); 0 when they
 * do not qualify and nothing was copied. */
int kvf_shm_copy_stream2(void *d0, const void *s0, void *d1, const void *s1,
                         size_t len);
/* Asks for the first bytes of a block about to be copied (the next
 * entry of a WRITE lease); see kvf_shm_lease_copy. */
void kvf_shm_prefetch(const void *p, size_t len);
/* Bytes of the next entry kvf_shm_lease_copy prefetches (0: none). */
size_t kvf_shm_prefetch_len(void);
/* A knob of the shm config table (key name, e.g. "shm_warm_ms"; default
 * def, clamped to [0, max]), read once into *cache (which starts at -1). */
int64_t kvf_shm_env_knob(int64_t *cache, const char *name, int64_t def,
                         int64_t max);

/* ---- trust (shm_trust.c) ----------------------------------------------- */

/* KVF_OK when the process at the other end of local socket fd (who: "
 * initiator" or "target", for the log) runs as this process's uid, or
 * as the uid of key shm_allow_uid, or the gid of key shm_allow_gid;
 * else KVF_ERR_PEER_CREDS (logged, rate-limited). */
kvf_status_t kvf_shm_peer_check(int fd, const char *who);
/* KVF_OK when memfd fd is sealed against shrinking and holds at least
 * off + len bytes: mapping [off, off+len) of it can never fault with
 * SIGBUS. Else KVF_ERR_UNSAFE_MEMORY. */
kvf_status_t kvf_shm_memfd_check(int fd, uint64_t off, uint64_t len);

/* The pages of one registered range inside one shareable allocation:
 * what a target hands out by fd (never the whole allocation). */
typedef struct kvf_shm_window {
    uint64_t id;       /* window id: what GRANT, MAP and SYNC name */
    uint64_t alloc;    /* allocation id (shm_mem.h) */
    uint64_t base;     /* first page, in the target */
    uint64_t len;      /* whole pages (of the allocation's unit) */
    uint64_t off;      /* of base in the allocation's memfd */
    uint64_t reg_base; /* the registered range inside the allocation */
    uint64_t reg_len;
} kvf_shm_window_t;

/* Fills *w (all but id) with the window of allocation a for the
 * registered region mem describes (its base and len); -1 when mem names
 * no region or the region misses the allocation. */
int kvf_shm_window(const kvf_shm_alloc_info_t *a, const kvf_tl_mem_t *mem,
                   kvf_shm_window_t *w);

/* A target's windows, ids never reused (the initiators' map tables key
 * on them). */
typedef struct kvf_shm_wintab {
    pthread_mutex_t lock;
    kvf_shm_window_t *w;
    size_t n, cap;
    uint64_t next_id;
} kvf_shm_wintab_t;

void kvf_shm_wintab_init(kvf_shm_wintab_t *t);
void kvf_shm_wintab_free(kvf_shm_wintab_t *t);
/* The id of window *w (found or added; w->id is set); 0 when out of
 * memory. */
uint64_t kvf_shm_wintab_id(kvf_shm_wintab_t *t, kvf_shm_window_t *w);
/* 0 and *w filled when window id is known. */
int kvf_shm_wintab_get(kvf_shm_wintab_t *t, uint64_t id, kvf_shm_window_t *w);
/* Forgets window id (no longer standing; a later grant of the same
 * pages gets a new id). */
void kvf_shm_wintab_drop(kvf_shm_wintab_t *t, uint64_t id);

/* ---- iface (target side) ---------------------------------------------- */

typedef struct kvf_shm_server kvf_shm_server_t;

struct kvf_tl_iface {
    kvf_tl_config_t cfg;
    kvf_tl_target_t target;
    uint64_t host_id;
    unsigned char nonce[KVF_SHM_NONCE_LEN];
    char address[KVF_SHM_ADDR_MAX];
    kvf_shm_server_t *server; /* NULL when no_listen */
};

kvf_status_t kvf_shm_server_start(kvf_tl_iface_t *iface);
void kvf_shm_server_stop(kvf_tl_iface_t *iface);

/* ---- ep (initiator side) ---------------------------------------------- */

/* A window of a target allocation mapped into this process. */
typedef struct kvf_shm_map {
    uint64_t id;
    uint64_t base; /* in the target */
    uint64_t len;
    unsigned char *ptr;
    unsigned views;  /* view leases pointing into it (atomic under the
                        read side of map_lock): it stays mapped */
    int dead;        /* no longer stands: unmapped at its last view */
    uint64_t filled; /* bytes from ptr whose page tables the populator
                        has filled (it alone writes it, under the read
                        side of map_lock) */
} kvf_shm_map_t;

typedef struct kvf_shm_lease kvf_shm_lease_t;

/* A reply a connection still expects: replies come in request order. */
typedef struct kvf_shm_expect {
    uint8_t type;
    kvf_shm_lease_t *lease;
} kvf_shm_expect_t;

#define KVF_SHM_EXPECT_MAX 16
#define KVF_SHM_PIPE       2 /* leases per worker: copying, being granted */

/* One connection: HELLO done, optional staging buffer, replies owed. */
typedef struct kvf_shm_conn {
    int fd;
    unsigned char *stage; /* KVF_SHM_STAGE_LEN, shared with the target */
    kvf_shm_buf_t meta;
    kvf_shm_buf_t reply;
    kvf_shm_expect_t expect[KVF_SHM_EXPECT_MAX];
    unsigned ehead, ecount;
} kvf_shm_conn_t;

enum kvf_shm_lease_state {
    KVF_SHM_L_FREE = 0,
    KVF_SHM_L_BEGUN,   /* BEGIN sent */
    KVF_SHM_L_GRANTED, /* GRANT read: copy, then END */
    KVF_SHM_L_OPEN,    /* copied and completed, kept open: later requests
                          inside its range grants ride on it */
    KVF_SHM_L_DONE     /* ended (or failed): results final */
};

/* A lease: entries (non-empty segments) of one type, the requests they
 * come from, and the target's verdicts. */
struct kvf_shm_lease {
    int state;
    int warm; /* no requests: renewed only to stay open (shm_ep.c) */
    kvf_op_type_t type;
    kvf_status_t end_status; /* KVF_OK: the lease was valid to its end */
    uint64_t begin_ms;       /* own clock, just before BEGIN was sent */
    uint64_t valid_until_ms; /* begin_ms + the GRANT's left_ms */
    kvf_tl_req_t **reqs;
    size_t nreqs, reqs_cap;
    size_t n, cap;
    void **local;
    uint64_t *remote;
    uint64_t *lens;
    kvf_status_t *st;   /* result per entry */
    kvf_status_t *excs; /* verdict per entry (see lease_prepare) */
    unsigned char **ptrs;
    uint32_t *owner; /* request index of each entry */
    uint32_t *segi;  /* segment index in that request */
    size_t *staged;
    uint64_t bytes;
    unsigned nallocs;
    uint64_t ids[KVF_SHM_LEASE_ALLOCS];
    uint64_t bases[KVF_SHM_LEASE_ALLOCS];
    uint64_t alens[KVF_SHM_LEASE_ALLOCS];
    uint64_t ranges[KVF_SHM_LEASE_ALLOCS]; /* range grants, 0 = none */
};

typedef struct kvf_shm_worker kvf_shm_worker_t;

#define KVF_SHM_VIDLE_MAX 4 /* idle view connections an ep keeps */

struct kvf_tl_ep {
    kvf_tl_iface_t *iface;
    unsigned char nonce[KVF_SHM_NONCE_LEN];
    unsigned timeout_ms;
    /* request queue shared by the workers */
    pthread_mutex_t lock;
    pthread_cond_t cond;
    kvf_tl_req_t *head, *tail;
    uint64_t qbytes; /* bytes of the queued requests */
    int stop;
    unsigned nworkers;
    kvf_shm_worker_t *workers;
    /* target windows mapped here; read-held while copying */
    pthread_rwlock_t map_lock;
    kvf_shm_map_t *maps;
    size_t nmaps, maps_cap;
    /* the populator (shm_lease.c): fills new mappings' page tables in the
     * background, so no copy waits for a whole pool's */
    pthread_t populator;
    int populator_on;
    pthread_mutex_t pop_lock;
    pthread_cond_t pop_cond;
    int pop_work;     /* a mapping came since the populator last looked */
    uint64_t copy_ms; /* when a copy last started or ended (atomic): the
                         populator keeps off while copies run */
    int posted;       /* a request came since the populator looked (atomic; set
                         by a post without reading the clock) */
    uint64_t down_until; /* after a connection failure: fail fast */
    uint64_t epoch_seen; /* target's epoch (frees, deregistrations) at the
                            last SYNC */
    int need_sync;       /* a GRANT showed another epoch */
    /* the open lease callers may copy inside on their own thread
     * (shm_inline.c): read-held by such a caller while it copies and
     * judges, write-held by the worker to publish or withdraw it */
    pthread_rwlock_t ride_lock;
    const kvf_shm_lease_t *ride; /* NULL: none */
    int ride_fd;                 /* its connection */
    unsigned ride_owner;         /* its worker */
    uint64_t ride_used_ns;       /* last inline copy in it */
    /* views (shm_view.c): idle connections of closed view leases (under
     * lock), view leases open */
    kvf_shm_conn_t *vidle[KVF_SHM_VIDLE_MAX];
    unsigned nvidle;
    unsigned nvleases;
};

kvf_status_t kvf_shm_ep_open(kvf_tl_iface_t *iface, const char *address,
                             kvf_tl_ep_t **ep_p);
void kvf_shm_ep_close(kvf_tl_ep_t *ep);
/* The ep's populator thread (shm_lease.c): started once the ep stands
 * (none if it cannot start: pages then fault in as copies touch them),
 * stopped and joined before the mappings go. */
void kvf_shm_populator_start(kvf_tl_ep_t *ep);
void kvf_shm_populator_stop(kvf_tl_ep_t *ep);
/* A copy into or out of the ep's mappings starts or ends now. */
void kvf_shm_copy_stamp(kvf_tl_ep_t *ep);
kvf_status_t kvf_shm_ep_post(kvf_tl_ep_t *ep, kvf_tl_req_t *req);

/* ---- requests moved on the caller's thread (shm_inline.c) -------------- */

kvf_status_t kvf_shm_ep_post_inline(kvf_tl_ep_t *ep, kvf_tl_req_t *req);
/* The worker's open lease, offered to inline callers / taken back (waits
 * for inline copies in it to end). */
void kvf_shm_ride_publish(kvf_tl_ep_t *ep, unsigned owner,
                          const kvf_shm_lease_t *l, int fd);
void kvf_shm_ride_withdraw(kvf_tl_ep_t *ep, unsigned owner);
/* 1 if an inline copy used the open lease within KVF_SHM_LINGER_US. */
int kvf_shm_ride_busy(kvf_tl_ep_t *ep);

/* ---- connections and leases (shm_lease.c) ------------------------------ */

/* Pointer of the ep's mapping of target window id, or NULL. Caller
 * holds map_lock. */
unsigned char *kvf_shm_map_ptr(kvf_tl_ep_t *ep, uint64_t id);

kvf_status_t kvf_shm_conn_open(kvf_tl_ep_t *ep, kvf_shm_conn_t *c);
void kvf_shm_conn_close(kvf_shm_conn_t *c);
void kvf_shm_conn_free(kvf_shm_conn_t *c);

kvf_status_t kvf_shm_lease_reserve(kvf_shm_lease_t *l, size_t n);
void kvf_shm_lease_free(kvf_shm_lease_t *l);

/* Sends BEGIN for the lease's n entries (state BEGUN). */
kvf_status_t kvf_shm_post_begin(kvf_tl_ep_t *ep, kvf_shm_conn_t *c,
                                kvf_shm_lease_t *l);
/* Whether lease l held until now: within the validity its GRANT
 * announced and no hang-up on the connection. */
kvf_status_t kvf_shm_lease_held(kvf_shm_conn_t *c, const kvf_shm_lease_t *l);
/* Decides whether the lease held to the end of its copy (end_status),
 * then sends END (state DONE). */
kvf_status_t kvf_shm_post_end(kvf_tl_ep_t *ep, kvf_shm_conn_t *c,
                              kvf_shm_lease_t *l);
/* Lets the entries of l ride on the open lease `open`: when every entry
 * lies inside one of open's range grants (and open is young enough),
 * sets l's verdicts and pointers and returns KVF_OK holding map_lock's
 * read side (kvf_shm_lease_copy() releases it); else KVF_ERR_NOT_FOUND
 * and nothing held. */
kvf_status_t kvf_shm_lease_ride(kvf_tl_ep_t *ep, const kvf_shm_lease_t *open,
                                kvf_shm_lease_t *l);
/* Reads replies in order, handling the GRANT (-> GRANTED) of any lease,
 * until one of type `want` (its header in *h,
 * its fd in *rfd, its metadata in c->reply); want 0 = one reply. An
 * error means the connection is lost. */
kvf_status_t kvf_shm_pump(kvf_tl_ep_t *ep, kvf_shm_conn_t *c, uint8_t want,
                          kvf_frame_hdr_t *h, int *rfd);
/* For a GRANTED lease: maps what it needs (MAP), then sets excs[i]:
 * KVF_OK with ptrs[i] = local view of the entry, KVF_INPROGRESS = moved
 * by the target (STAGE), or the refusal. On KVF_OK it returns holding
 * map_lock's read side, which kvf_shm_lease_copy() releases: call it
 * next. */
kvf_status_t kvf_shm_lease_prepare(kvf_tl_ep_t *ep, kvf_shm_conn_t *c,
                                   kvf_shm_lease_t *l);
/* Copies the mapped entries (streaming stores when stream), releases
 * map_lock, and moves the staged ones; results in st[]. Connection errors
 * are returned. */
kvf_status_t kvf_shm_lease_copy(kvf_tl_ep_t *ep, kvf_shm_conn_t *c,
                                kvf_shm_lease_t *l, int stream);
/* SYNC: unmaps windows that no longer stand. Nothing else in flight. */
kvf_status_t kvf_shm_sync(kvf_tl_ep_t *ep, kvf_shm_conn_t *c);
/* Unmaps everything (target gone, ep closing); a mapping views lie in
 * stays until its last view is released. */
void kvf_shm_drop_maps(kvf_tl_ep_t *ep);
/* Drops a view lease's reference on mapping id, unmapping it when it no
 * longer stands and this was the last. Caller holds map_lock's write
 * side. */
void kvf_shm_map_unview(kvf_tl_ep_t *ep, uint64_t id);

/* ---- views (shm_view.c) ------------------------------------------------ */

kvf_status_t kvf_shm_view_open(kvf_tl_ep_t *ep, kvf_op_type_t type,
                               size_t count, const uint64_t *remote,
                               const uint64_t *lens, kvf_tl_view_t *views,
                               uint64_t *until_ms_p, kvf_tl_vlease_t **lease_p);
kvf_status_t kvf_shm_view_close(kvf_tl_vlease_t *vl);
/* Frees the ep's idle view connections (ep closing). */
void kvf_shm_view_fini(kvf_tl_ep_t *ep);

#endif
