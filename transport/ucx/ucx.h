/*
 * ucx transport, private: the structures shared by the context and
 * resource queries (ucx_ctx.c), the target side (ucx_server.c: the
 * authenticated side channel that hands out the workers' addresses and
 * remote keys, the target workers' progress threads, the memory
 * mappings), the initiator side (ucx_ep.c: ucx_workers lanes per
 * peer, each a worker, an endpoint and a progress thread) and the ops
 * table (ucx_ops.c), and READs served by the target's pushes and WRITEs
 * by active message where UCP has no hardware RMA (ucx_push.c).
 *
 * Threads: every UCP call on a worker is made by that worker's progress
 * thread (UCS_THREAD_MODE_SINGLE), except creation and destruction,
 * which happen while no progress thread runs. The context is shared by
 * the workers of one iface and maps memory from the side channel's
 * threads (mt_workers_shared).
 */
#ifndef KVF_UCX_H
#define KVF_UCX_H
#if !defined(KVF_LAYER_TRANSPORT) && !defined(KVF_TEST_INTERNALS)
#error "transport/ucx/ucx.h is private to transport/"
#endif

#include "transport/transport.h"
#include "transport/limits.h"
#include "transport/ucx/msg.h"
#include "core/sock.h"

#include <pthread.h>
#include <ucp/api/ucp.h>

/* One registered region mapped for peers: its memory handle and its
 * packed remote key. */
typedef struct kvf_ucx_map {
    uint64_t base;
    uint64_t len;
    ucp_mem_h memh;
    void *rkey_buf;
    size_t rkey_len;
} kvf_ucx_map_t;

/* The iface's side channel: listener, one thread per connection. */
typedef struct kvf_ucx_server kvf_ucx_server_t;

/* A progress thread's polling before it sleeps (ucx_spin_us). */
typedef struct kvf_ucx_spin {
    uint64_t ns;      /* 0: sleep as soon as idle */
    uint64_t busy_ns; /* last progress that found events */
} kvf_ucx_spin_t;

/* One target worker: peers' endpoints connect to it (HELLO names which);
 * its progress thread moves the bytes of UCX's software RMA. */
typedef struct kvf_ucx_tworker {
    kvf_tl_iface_t *iface;
    ucp_worker_h worker;
    void *addr; /* ucp_worker_get_address */
    size_t addr_len;
    pthread_t thread;
    int thread_on;
    int efd;  /* epoll: the worker's fd and wake */
    int wake; /* eventfd: stop */
    volatile int stop;
    kvf_ucx_spin_t spin;
} kvf_ucx_tworker_t;

struct kvf_tl_iface {
    kvf_tl_config_t cfg;
    kvf_tl_target_t target;
    char host[KVF_HOST_MAX];
    char address[KVF_HOST_MAX + 8];
    ucp_context_h ctx;
    unsigned nworkers;   /* ucx_workers: lanes per ep, target workers */
    unsigned read_mode;  /* ucx_read_mode: KVF_UCX_MODE_* */
    unsigned write_mode; /* ucx_write_mode: KVF_UCX_MODE_* */
    uint64_t spin_ns;    /* ucx_spin_us */
    /* target side (NULL when no_listen) */
    kvf_ucx_server_t *server;
    kvf_ucx_tworker_t *tw; /* nworkers of them */
    pthread_mutex_t maps_lock;
    kvf_ucx_map_t *maps;
    size_t nmaps, maps_cap;
};

/* An initiator's cached remote key of one region. */
typedef struct kvf_ucx_rkey {
    uint64_t base;
    uint64_t len;
    ucp_rkey_h rkey;
} kvf_ucx_rkey_t;

typedef struct kvf_ucx_rctx kvf_ucx_rctx_t;
/* A lane's pinned buffers and GPU copy contexts (ucx_stage.c). */
typedef struct kvf_ucx_stage kvf_ucx_stage_t;
typedef struct kvf_ucx_push kvf_ucx_push_t;

/* One UCP call (or the flush): the segments it covers. */
typedef struct kvf_ucx_op {
    kvf_ucx_rctx_t *rc;
    uint32_t first;
    uint32_t count;
} kvf_ucx_op_t;

/* A request in flight on a lane (progress thread's). */
struct kvf_ucx_rctx {
    kvf_tl_req_t *req;
    struct kvf_ucx_lane *ln;
    unsigned pending;
    kvf_status_t err;
    int zombie; /* completed by force: late callbacks only count down */
    kvf_ucx_rctx_t *prev, *next;
    kvf_ucx_push_t *pushes; /* READ requests a target serves (push mode) */
    kvf_ucx_op_t ops[];     /* nsegs + 1 (the flush) */
};

/* How a lane reads and writes: ucp_get_nbx / ucp_put_nbx per block, or
 * one active message per request (the target pushes a READ's blocks, a
 * WRITE's blocks travel in the request); ucx_read_mode and
 * ucx_write_mode; auto: push where the endpoint has no RMA lane, i.e.
 * UCX would emulate gets and puts in software. */
enum {
    KVF_UCX_MODE_AUTO = 0,
    KVF_UCX_MODE_ONE_SIDED = 1, /* get, put */
    KVF_UCX_MODE_PUSH = 2,
};
/* Active message ids: a READ request to a target worker, its reply
 * (the blocks, or a WRITE's status), a WRITE request with its blocks. */
#define KVF_UCX_AM_READ  1
#define KVF_UCX_AM_BLOCK 2
#define KVF_UCX_AM_WRITE 3
/* Most (address, length) entries and bytes in one READ or WRITE
 * request (the initiator cuts larger ones, the target refuses them). */
#define KVF_UCX_PUSH_MAX   1024
#define KVF_UCX_PUSH_MAGIC 0x4b564650u /* "KVFP": both headers' first u32 */
#define KVF_UCX_PUSH_HDR   16          /* u32 magic, u32 count|status, u64 id */
#define KVF_UCX_PUSH_ENT   16          /* u64 addr, u64 len */
#define KVF_UCX_PUSH_BYTES (4ull << 20)
/* A request whose deadline_ms (the transport's field) is this moves by
 * one-sided gets or puts in every mode: the link test's contiguous
 * ceiling does not change with the mode it is compared with. */
#define KVF_UCX_REQ_ONE_SIDED UINT64_MAX

/* Bytes of requests an ep keeps in flight in UCP, shared by its lanes. */
#define KVF_UCX_WINDOW (64ull << 20)
/* Most workers (lanes) per ep and per target. */
#define KVF_UCX_WORKERS_MAX 16

/* One lane of an ep: a UCX worker, its endpoint to one target worker,
 * its progress thread and the requests posted to it. */
typedef struct kvf_ucx_lane {
    kvf_tl_ep_t *ep;
    unsigned idx;
    ucp_worker_h worker;
    ucp_ep_h uep;
    pthread_t thread;
    int thread_on;
    int efd, wake;
    volatile int stop;
    pthread_mutex_t lock; /* the posted queue */
    kvf_tl_req_t *head, *tail;
    /* progress thread's own */
    kvf_ucx_rctx_t *active;  /* requests in flight */
    kvf_ucx_rctx_t *zombies; /* failed by force, freed at close */
    unsigned nactive;
    uint64_t inflight; /* bytes of the active requests */
    uint64_t last_ms;  /* last completion while requests were in flight */
    uint64_t peer_ms;  /* last look at the side channel */
    kvf_ucx_spin_t spin;
    kvf_status_t failed; /* KVF_OK, or why the lane is dead */
    kvf_ucx_rkey_t *rkeys;
    size_t nrkeys, rkeys_cap;
    kvf_ucx_stage_t *stage; /* GPU requests' buffers (NULL: none yet) */
    int push;               /* READs served by the target (push mode) */
    int wpush;              /* WRITEs by active message (push mode) */
    uint64_t push_seq;      /* id of the next READ request */
} kvf_ucx_lane_t;

struct kvf_tl_ep {
    kvf_tl_iface_t *iface;
    char host[KVF_HOST_MAX];
    uint16_t port;
    int fd; /* side channel (remote keys, checksums); fd_lock */
    kvf_wire_mac_t mac; /* the side channel's frame tags; fd_lock */
    pthread_mutex_t fd_lock;
    uint64_t side_ms;    /* last call on the side channel (fd_lock) */
    kvf_status_t failed; /* atomic: set once by the first lane that fails */
    unsigned next;       /* atomic: round-robin lane of the next post */
    unsigned nlanes;
    kvf_ucx_lane_t *lanes;
};

/* ---- ucx_ctx.c ---------------------------------------------------------- */

/* A context for an iface serving or reaching host (loopback: UCX's
 * network devices limited to lo, see docs/ucx.md). Refuses (KVF_ERR_AUTH)
 * a context that would use UCX's tcp transport, loopback or not, unless
 * ucx_tcp=1 or insecure=1: its listener accepts unauthenticated peers,
 * and UCX's software RMA over it reads and writes any address. */
kvf_status_t kvf_ucx_ctx_create(const char *host, ucp_context_h *ctx_p);
/* UCX's resources ("tl/dev" words separated by spaces) of a context
 * created from the environment; "" if UCX cannot start. */
const char *kvf_ucx_resources(void);
int kvf_ucx_has_rdma(const char *resources);
/* The worker count (workers, the engine's parameter, or else the
 * ucx_workers key; 1..KVF_UCX_WORKERS_MAX) and the progress threads'
 * polling before they sleep (0: they sleep at once). */
kvf_status_t kvf_ucx_tuning(unsigned workers, unsigned *n_p,
                            uint64_t *spin_ns_p);
/* The ucx_read_mode and ucx_write_mode keys: KVF_UCX_MODE_*. */
kvf_status_t kvf_ucx_read_mode(unsigned *mode_p);
kvf_status_t kvf_ucx_write_mode(unsigned *mode_p);
/* A worker with a wake-up fd; *efd_p: an epoll fd watching it and
 * *wake_p (an eventfd created here). */
kvf_status_t kvf_ucx_worker_create(ucp_context_h ctx, ucp_worker_h *worker_p,
                                   int *efd_p, int *wake_p);
void kvf_ucx_worker_destroy(ucp_worker_h worker, int efd, int wake);
/* Progress until idle, then arm and sleep at most timeout_ms (-1: until
 * an event), unless the worker had events less than spin->ns ago: then
 * return at once (the caller polls again). With a target, progress runs
 * holding its region set, so a deregistration never overlaps a software
 * RMA writing into the range. busy (optional) runs after each progress
 * call that found events: a lane refills its window there, so requests
 * completed while replies keep streaming in are replaced at once, not
 * when the worker falls idle. */
void kvf_ucx_worker_wait(ucp_worker_h worker, int efd, int wake, int timeout_ms,
                         const kvf_tl_target_t *target, kvf_ucx_spin_t *spin,
                         void (*busy)(void *arg), void *arg);
void kvf_ucx_wake(int wake);
kvf_status_t kvf_ucx_status(ucs_status_t s);

/* ---- ucx_server.c ------------------------------------------------------- */

kvf_status_t kvf_ucx_server_start(kvf_tl_iface_t *iface);
void kvf_ucx_server_stop(kvf_tl_iface_t *iface);
void kvf_ucx_mem_dereg(kvf_tl_iface_t *iface, uint64_t addr, uint64_t len);
/* Side channel helpers, both sides: a frame is header | meta | tag
 * (core/wire.h; no tag when mac is off). */
kvf_status_t kvf_ucx_send(int fd, kvf_wire_mac_t *mac, uint8_t type,
                          kvf_status_t status, uint32_t count, const void *meta,
                          size_t len, uint64_t deadline_ms);
kvf_status_t kvf_ucx_recv_hdr(int fd, kvf_frame_hdr_t *h, uint64_t deadline);
/* The meta (h->meta_len bytes into meta) and tag of frame h, the tag
 * checked (KVF_ERR_AUTH when it does not match). */
kvf_status_t kvf_ucx_recv_meta(int fd, kvf_wire_mac_t *mac,
                               const kvf_frame_hdr_t *h, void *meta,
                               uint64_t deadline);

/* ---- ucx_ep.c ----------------------------------------------------------- */

kvf_status_t kvf_ucx_ep_open(kvf_tl_iface_t *iface, const char *address,
                             kvf_tl_ep_t **ep_p);
void kvf_ucx_ep_close(kvf_tl_ep_t *ep);
kvf_status_t kvf_ucx_ep_post(kvf_tl_ep_t *ep, kvf_tl_req_t *req);
/* Queues req on one lane (lane < ep->nlanes). */
kvf_status_t kvf_ucx_lane_post(kvf_tl_ep_t *ep, unsigned lane,
                               kvf_tl_req_t *req);
/* Side channel round trip (fd_lock held by the caller): sends type with
 * meta, receives the reply into *reply_p (kvf_free) after checking it. */
kvf_status_t kvf_ucx_ep_call(kvf_tl_ep_t *ep, uint8_t type, uint32_t count,
                             const void *meta, size_t len, kvf_frame_hdr_t *h,
                             void **reply_p);

/* Fails segments [first, first+count) of rc with status (the first
 * failure is the request's). */
void kvf_ucx_segs_fail(kvf_ucx_rctx_t *rc, uint32_t first, uint32_t count,
                       kvf_status_t status);
/* Completes rc once nothing of it is pending (progress thread). */
void kvf_ucx_rctx_finish(kvf_ucx_rctx_t *rc);

/* ---- ucx_stage.c -------------------------------------------------------- */

/* A request with local GPU memory, on its lane's progress thread: the
 * host request (over a pinned buffer) to move in its place, a WRITE's
 * bytes already gathered into it; req completes when that one does (a
 * READ after its scatter to the GPU). NULL: req was failed. */
kvf_tl_req_t *kvf_ucx_stage(kvf_ucx_lane_t *ln, kvf_tl_req_t *req);
/* Frees the lane's buffers and contexts (after its worker is gone). */
void kvf_ucx_stage_fini(kvf_ucx_lane_t *ln);

/* ---- ucx_push.c --------------------------------------------------------- */

/* Target: serve READ and WRITE requests on a target worker (before its
 * thread). */
kvf_status_t kvf_ucx_push_serve(kvf_ucx_tworker_t *tw);
/* Initiator: receive replies on a lane's worker; and whether the lane
 * reads and writes by push (the modes, and for auto the endpoint's
 * lanes). */
kvf_status_t kvf_ucx_push_lane_init(kvf_ucx_lane_t *ln, unsigned read_mode,
                                    unsigned write_mode);
/* Adds segments [first, first+count) of rc's request, merged into one
 * entry (len bytes, contiguous on both sides), to rc's request being
 * built, sending it when full; push_send sends what is built. */
void kvf_ucx_push_add(kvf_ucx_rctx_t *rc, uint32_t first, uint32_t count,
                      void *local, uint64_t remote, uint64_t len);
void kvf_ucx_push_send(kvf_ucx_rctx_t *rc);
/* Frees rc's push records (rctx freed, or a zombie at lane destroy). */
void kvf_ucx_push_free(kvf_ucx_rctx_t *rc);

#endif
