/*
 * shm transport, target side: an accept thread on the abstract unix
 * socket and one thread per connection, like tcp. A connection must open
 * with HELLO (the nonce of this iface and the same host id), answered
 * with the probe memfd that proves to the initiator it reached this very
 * process through memory it can map.
 *
 * Leases: BEGIN checks every entry against the registered regions under
 * the engine's region read lock (acquire), which the connection holds
 * while any of its leases is open (an initiator pipelines a few); END
 * closes the oldest. A lease that outlives the timeout is revoked: the
 * lock is released and the connection closed. Deregistration takes the
 * write lock, so it waits for every lease in flight, and later leases no
 * longer grant the range. Of an allocation holding a granted range,
 * only the window of the registered range (its pages, at the memfd
 * offset: shm_trust.c) is handed out (MAP, in the lease that granted
 * it); a deregistration bumps the epoch, and SYNC then names the windows
 * that no longer stand, which the initiator unmaps. HELLO is answered
 * only to a peer whose credentials are allowed. Ranges that are
 * registered but not inside a shareable allocation (plain malloc memory,
 * GPU memory) are moved by this thread itself between its memory and the
 * initiator's staging buffer (STAGE), still under the lease.
 */
#include "transport/shm/shm.h"
#include "core/alloc.h"
#include "core/auth.h"
#include "core/checksum.h"
#include "core/log.h"
#include "core/time.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#define KVF_SHM_IDLE_POLL_MS  250
#define KVF_SHM_GATE_NS       (10 * 1000000ull) /* no writer_waiting hook */
#define KVF_SHM_GATE_PAUSE_US 100

#define KVF_SHM_OPEN_MAX (KVF_SHM_PIPE + 1)

/* An open lease: its deadline and the allocations it granted. */
typedef struct kvf_shm_slease {
    uint64_t deadline;
    uint64_t ids[KVF_SHM_LEASE_ALLOCS];
    unsigned nids;
} kvf_shm_slease_t;

typedef struct kvf_shm_sconn {
    struct kvf_shm_server *srv;
    int fd;
    pthread_t thread;
    int done;
    struct kvf_shm_sconn *next;
    kvf_shm_buf_t in;
    kvf_shm_buf_t out;
    kvf_shm_buf_t exc; /* kvf_shm_exc_t of the GRANT being built */
    int hello;
    /* open leases, oldest first; the region read lock is held while
     * there is one (an initiator pipelines up to KVF_SHM_PIPE) */
    kvf_shm_slease_t open[KVF_SHM_OPEN_MAX];
    unsigned ohead, nopen;
    unsigned char *stage;    /* the initiator's staging buffer */
    kvf_mem_stage_t *cstage; /* checksums of GPU ranges */
    pid_t peer_pid;          /* for the per-peer cap */
    uint64_t starve_since;   /* a writer or a stop waits on our leases */
} kvf_shm_sconn_t;

struct kvf_shm_server {
    kvf_tl_iface_t *iface;
    int lfd;
    int probe_fd;
    pthread_t thread;
    pthread_mutex_t lock;
    kvf_shm_wintab_t wins; /* windows handed out (shm_trust.c) */
    kvf_shm_sconn_t *conns;
    unsigned nconns;
    int stop;
    /* connections holding the region read lock, since when */
    pthread_mutex_t gate_lock;
    pthread_cond_t gate_cond;
    unsigned holders;
    uint64_t hold_since_ns;
    kvf_tl_limits_t lim;
};

static int kvf_shm_stopping(kvf_shm_server_t *s)
{
    return __atomic_load_n(&s->stop, __ATOMIC_ACQUIRE);
}

/*
 * The region read lock, taken for the connection (when its first lease
 * opens, or around one STAGE or SUM). Connections that overlap would keep
 * it held without a gap and starve a (de)registration (a writer) for as
 * long as a stream lasts. So while a writer waits (the engine's
 * writer_waiting hook), a new taker waits until every holder let go
 * (their leases are short) and pauses, which lets the writer in:
 * deregistration under traffic waits milliseconds.
 *
 * Only while one waits: a gate that closed whenever the lock had been
 * held for KVF_SHM_GATE_NS, writer or not, made overlapping leases of a
 * stream wait for each other (docs/decisions/shm-copy-path.md). A target
 * without the hook keeps the timed gate.
 */
static void kvf_shm_hold(kvf_shm_sconn_t *c)
{
    kvf_shm_server_t *s = c->srv;
    const kvf_tl_target_t *t = &s->iface->target;
    struct timespec ts;
    int gate;

    pthread_mutex_lock(&s->gate_lock);
    gate = t->writer_waiting != NULL
               ? t->writer_waiting(t->arg)
               : (s->holders > 0 &&
                  kvf_time_ns() - s->hold_since_ns > KVF_SHM_GATE_NS);
    if (gate) {
        while (s->holders > 0 && !kvf_shm_stopping(s)) {
            kvf_time_abs_after(&ts, KVF_SHM_IDLE_POLL_MS);
            pthread_cond_timedwait(&s->gate_cond, &s->gate_lock, &ts);
        }
        pthread_mutex_unlock(&s->gate_lock);
        usleep(KVF_SHM_GATE_PAUSE_US);
        pthread_mutex_lock(&s->gate_lock);
    }
    if (s->holders++ == 0) {
        s->hold_since_ns = kvf_time_ns();
    }
    pthread_mutex_unlock(&s->gate_lock);
    t->acquire(t->arg);
}

static void kvf_shm_unhold(kvf_shm_sconn_t *c)
{
    kvf_shm_server_t *s = c->srv;
    const kvf_tl_target_t *t = &s->iface->target;

    t->release(t->arg);
    pthread_mutex_lock(&s->gate_lock);
    if (--s->holders == 0) {
        pthread_cond_broadcast(&s->gate_cond);
    }
    pthread_mutex_unlock(&s->gate_lock);
}

/* The probe: a sealed, read-only page holding magic, nonce, host id. */
static int kvf_shm_probe_create(const kvf_tl_iface_t *iface)
{
    unsigned char page[KVF_SHM_PROBE_LEN];
    int fd;

    fd = memfd_create("kvferry-probe", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) {
        kvf_warn("shm: memfd_create: %m");
        return -1;
    }
    kvf_shm_probe_enc(page, sizeof(page), iface->nonce, iface->host_id);
    if (pwrite(fd, page, sizeof(page), 0) != (ssize_t)sizeof(page) ||
        fcntl(fd, F_ADD_SEALS,
              F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) != 0) {
        kvf_warn("shm: probe memfd: %m");
        close(fd);
        return -1;
    }
    return fd;
}

static kvf_status_t kvf_shm_reply(kvf_shm_sconn_t *c, uint8_t type,
                                  kvf_status_t status, const void *meta,
                                  uint32_t meta_len, uint32_t count,
                                  int pass_fd)
{
    return kvf_shm_send(c->fd, type, 0, status, meta, meta_len, count, pass_fd,
                        kvf_time_ms() + c->srv->iface->cfg.timeout_ms);
}

static kvf_status_t kvf_shm_on_hello(kvf_shm_sconn_t *c,
                                     const kvf_frame_hdr_t *h)
{
    const kvf_tl_iface_t *iface = c->srv->iface;
    kvf_shm_hello_ack_t ack;
    kvf_shm_hello_t hello;
    unsigned char meta[KVF_SHM_HELLO_ACK_LEN];
    kvf_wr_t w;

    if (kvf_shm_hello_dec(c->in.p, h->meta_len, &hello) != KVF_OK) {
        return KVF_ERR_PROTOCOL;
    }
    if (kvf_shm_peer_check(c->fd, "initiator") != KVF_OK) {
        kvf_shm_reply(c, KVF_SHM_HELLO_ACK, KVF_ERR_PEER_CREDS, NULL, 0, 0, -1);
        return KVF_ERR_PEER_CREDS;
    }
    if (hello.version != KVF_SHM_PROTO) {
        kvf_warn("shm: peer speaks protocol %u, this is %u", hello.version,
                 KVF_SHM_PROTO);
        kvf_shm_reply(c, KVF_SHM_HELLO_ACK, KVF_ERR_VERSION, NULL, 0, 0, -1);
        return KVF_ERR_VERSION;
    }
    if (memcmp(hello.nonce, iface->nonce, KVF_SHM_NONCE_LEN) != 0 ||
        hello.host_id != iface->host_id) {
        kvf_warn("shm: hello with a foreign nonce or host id, refused");
        kvf_shm_reply(c, KVF_SHM_HELLO_ACK, KVF_ERR_UNAVAILABLE, NULL, 0, 0,
                      -1);
        return KVF_ERR_UNAVAILABLE;
    }
    ack.pid = (uint32_t)getpid();
    ack.epoch = kvf_shm_mem_epoch();
    kvf_wr_init_fixed(&w, meta, sizeof(meta));
    kvf_shm_hello_ack_enc(&w, &ack);
    c->hello = 1;
    return kvf_shm_reply(c, KVF_SHM_HELLO_ACK, KVF_OK, meta, (uint32_t)w.len, 0,
                         c->srv->probe_fd);
}

/* Points r at the entry list of the request h (BEGIN, STAGE, SUM). */
static kvf_status_t kvf_shm_entries_in(const kvf_shm_sconn_t *c,
                                       const kvf_frame_hdr_t *h, kvf_rd_t *r)
{
    if (kvf_shm_entries_open(r, h, c->in.p) != KVF_OK) {
        kvf_warn("shm: %u entries in %u bytes of metadata", h->count,
                 h->meta_len);
        return KVF_ERR_PROTOCOL;
    }
    return KVF_OK;
}

/* Index of id among the lease's allocations, adding it if room; -1 when
 * the lease already names KVF_SHM_LEASE_ALLOCS others. */
static int kvf_shm_lease_id(kvf_shm_slease_t *l, uint64_t id)
{
    unsigned i;

    for (i = 0; i < l->nids; i++) {
        if (l->ids[i] == id) {
            return (int)i;
        }
    }
    if (l->nids == KVF_SHM_LEASE_ALLOCS) {
        return -1;
    }
    l->ids[l->nids] = id;
    return (int)l->nids++;
}

/* 1 if an open lease granted allocation id. */
static int kvf_shm_granted(const kvf_shm_sconn_t *c, uint64_t id)
{
    unsigned i, k;

    for (i = 0; i < c->nopen; i++) {
        const kvf_shm_slease_t *l = &c->open[(c->ohead + i) % KVF_SHM_OPEN_MAX];

        for (k = 0; k < l->nids; k++) {
            if (l->ids[k] == id) {
                return 1;
            }
        }
    }
    return 0;
}

/* The window of the shareable allocation holding [addr, addr+len) for
 * the registered region mem, listed in lease l (index k); -1 when the
 * range is not shareable (or the lease names too many windows). */
static int kvf_shm_begin_window(const kvf_shm_sconn_t *c, kvf_shm_slease_t *l,
                                uint64_t addr, uint64_t len,
                                const kvf_tl_mem_t *mem, kvf_shm_window_t *win)
{
    kvf_shm_alloc_info_t info;
    int k;

    if (kvf_shm_mem_find(addr, len, &info) != 0 ||
        kvf_shm_window(&info, mem, win) != 0 ||
        kvf_shm_wintab_id(&c->srv->wins, win) == 0 ||
        (k = kvf_shm_lease_id(l, win->id)) < 0) {
        return -1;
    }
    return k;
}

/* The verdict on one BEGIN entry: KVF_OK when it lies in a window the
 * lease lists (added to wins when new; *last caches the latest),
 * KVF_INPROGRESS when this side moves it (STAGE), else the refusal. */
static kvf_status_t kvf_shm_begin_entry(const kvf_shm_sconn_t *c,
                                        kvf_shm_slease_t *l,
                                        const kvf_shm_entry_t *e,
                                        kvf_shm_window_t *wins,
                                        kvf_shm_window_t *last, int *have_last)
{
    const kvf_tl_target_t *t = &c->srv->iface->target;
    uint64_t addr = e->addr, len = e->len;
    kvf_tl_mem_t mem = {0};
    kvf_status_t st;
    int k;

    st =
        (len == 0) ? KVF_ERR_INVALID_PARAM : t->access(t->arg, addr, len, &mem);
    if (st != KVF_OK) {
        kvf_log_rl(KVF_LOG_WARN, "shm: refused remote access 0x%lx+%lu: %s",
                   (unsigned long)addr, (unsigned long)len, kvf_status_str(st));
        return st;
    }
    if (mem.type != KVF_MEM_HOST) {
        return KVF_INPROGRESS; /* GPU / pinned: moved by this side */
    }
    /* the registered range of the last window: same window */
    if (*have_last && addr >= last->reg_base &&
        addr - last->reg_base < last->reg_len &&
        len <= last->reg_len - (addr - last->reg_base)) {
        return KVF_OK;
    }
    k = kvf_shm_begin_window(c, l, addr, len, &mem, last);
    if (k >= 0) {
        wins[k] = *last;
        *have_last = 1;
        return KVF_OK;
    }
    *have_last = 0;
    return KVF_INPROGRESS; /* not shareable: moved by this side */
}

/* The GRANT's windows, each with a range grant of its registered range
 * when that starts on the window's first page (a pool registered
 * whole, the common case): requests inside it then ride on the lease. */
static void kvf_shm_grant_allocs(const kvf_shm_slease_t *l,
                                 const kvf_shm_window_t *wins,
                                 kvf_shm_grant_t *g)
{
    unsigned i;

    g->nallocs = l->nids;
    for (i = 0; i < l->nids; i++) {
        g->allocs[i].id = wins[i].id;
        g->allocs[i].base = wins[i].base;
        g->allocs[i].len = wins[i].len;
        g->allocs[i].range =
            (wins[i].reg_base == wins[i].base) ? wins[i].reg_len : 0;
        g->allocs[i].off = 0;
    }
}

static kvf_status_t kvf_shm_on_begin(kvf_shm_sconn_t *c,
                                     const kvf_frame_hdr_t *h)
{
    kvf_shm_window_t wins[KVF_SHM_LEASE_ALLOCS], last = {0};
    kvf_shm_grant_t g;
    kvf_shm_exc_t *excs;
    kvf_shm_slease_t *l;
    kvf_shm_entry_t e;
    kvf_status_t st;
    uint32_t i, nexc = 0;
    int have_last = 0;
    kvf_wr_t w;
    kvf_rd_t r;

    if (c->nopen == KVF_SHM_OPEN_MAX ||
        kvf_shm_entries_in(c, h, &r) != KVF_OK) {
        return KVF_ERR_PROTOCOL;
    }
    /* worst case: every entry an exception, every allocation listed */
    st = kvf_shm_buf_reserve(&c->exc, (size_t)h->count * sizeof(*excs) + 1);
    if (st == KVF_OK) {
        st = kvf_shm_buf_reserve(&c->out, sizeof(g) + (size_t)h->count *
                                                          KVF_SHM_EXC_LEN);
    }
    if (st != KVF_OK) {
        return st;
    }
    excs = (kvf_shm_exc_t *)(void *)c->exc.p;
    if (c->nopen == 0) {
        kvf_shm_hold(c);
    }
    l = &c->open[(c->ohead + c->nopen) % KVF_SHM_OPEN_MAX];
    c->nopen++;
    l->nids = 0;
    l->deadline = kvf_time_ms() + c->srv->iface->cfg.timeout_ms;
    for (i = 0; i < h->count; i++) {
        kvf_shm_entry_dec(&r, &e);
        st = kvf_shm_begin_entry(c, l, &e, wins, &last, &have_last);
        if (st != KVF_OK) {
            excs[nexc].index = i;
            excs[nexc].status = st;
            nexc++;
        }
    }
    g.epoch = kvf_shm_mem_epoch();
    g.left_ms = (uint32_t)kvf_time_left_ms(l->deadline);
    g.nexc = nexc;
    kvf_shm_grant_allocs(l, wins, &g);
    kvf_wr_init_fixed(&w, c->out.p, c->out.cap);
    kvf_shm_grant_enc(&w, &g, excs);
    return kvf_shm_reply(c, KVF_SHM_GRANT, KVF_OK, c->out.p, (uint32_t)w.len,
                         nexc, -1);
}

static kvf_status_t kvf_shm_on_map(kvf_shm_sconn_t *c, const kvf_frame_hdr_t *h)
{
    kvf_shm_alloc_info_t info;
    unsigned char meta[KVF_SHM_MAP_ACK_LEN];
    kvf_shm_window_t win;
    kvf_shm_alloc_t a;
    kvf_status_t st;
    uint64_t id;
    kvf_wr_t w;
    int fd;

    if (c->nopen == 0 || kvf_shm_map_dec(c->in.p, h->meta_len, &id) != KVF_OK) {
        return KVF_ERR_PROTOCOL;
    }
    if (!kvf_shm_granted(c, id) ||
        kvf_shm_wintab_get(&c->srv->wins, id, &win) != 0) {
        kvf_warn("shm: map of window %lu not granted by this lease",
                 (unsigned long)id);
        return kvf_shm_reply(c, KVF_SHM_MAP_ACK, KVF_ERR_NOT_REGISTERED, NULL,
                             0, 0, -1);
    }
    fd = kvf_shm_mem_dup_fd(win.alloc, &info);
    if (fd < 0) {
        return kvf_shm_reply(c, KVF_SHM_MAP_ACK, KVF_ERR_NOT_FOUND, NULL, 0, 0,
                             -1);
    }
    /* only the window's pages: the memfd offset of its first one */
    a = (kvf_shm_alloc_t){
        .id = win.id, .base = win.base, .len = win.len, .off = win.off};
    kvf_wr_init_fixed(&w, meta, sizeof(meta));
    kvf_shm_map_ack_enc(&w, &a);
    st =
        kvf_shm_reply(c, KVF_SHM_MAP_ACK, KVF_OK, meta, (uint32_t)w.len, 0, fd);
    close(fd);
    return st;
}

static kvf_status_t kvf_shm_on_stage_setup(kvf_shm_sconn_t *c, int rfd)
{
    struct stat st;
    int seals;
    void *p;

    if (rfd < 0 || c->stage != NULL) {
        return KVF_ERR_PROTOCOL;
    }
    seals = fcntl(rfd, F_GET_SEALS);
    /* an unsealed buffer could be truncated under us (SIGBUS) */
    if (seals < 0 || !(seals & F_SEAL_SHRINK) || fstat(rfd, &st) != 0 ||
        (uint64_t)st.st_size < KVF_SHM_STAGE_LEN) {
        kvf_warn("shm: staging buffer refused (unsealed or too small)");
        return kvf_shm_reply(c, KVF_SHM_STAGE_SETUP_ACK, KVF_ERR_INVALID_PARAM,
                             NULL, 0, 0, -1);
    }
    p = mmap(NULL, KVF_SHM_STAGE_LEN, PROT_READ | PROT_WRITE, MAP_SHARED, rfd,
             0);
    if (p == MAP_FAILED) {
        kvf_error("shm: map staging buffer: %m");
        return kvf_shm_reply(c, KVF_SHM_STAGE_SETUP_ACK, KVF_ERR_NO_RESOURCE,
                             NULL, 0, 0, -1);
    }
    c->stage = p;
    return kvf_shm_reply(c, KVF_SHM_STAGE_SETUP_ACK, KVF_OK, NULL, 0, 0, -1);
}

static kvf_status_t kvf_shm_on_stage(kvf_shm_sconn_t *c,
                                     const kvf_frame_hdr_t *h)
{
    const kvf_tl_target_t *t = &c->srv->iface->target;
    uint64_t addr, len, off = 0;
    kvf_status_t st = KVF_OK;
    kvf_shm_entry_t e;
    kvf_tl_mem_t mem;
    kvf_rd_t r;
    void *p;
    uint32_t i;
    int w = (h->flags == KVF_OP_WRITE);

    if (c->stage == NULL || kvf_shm_entries_in(c, h, &r) != KVF_OK) {
        return KVF_ERR_PROTOCOL;
    }
    if (c->nopen == 0) {
        kvf_shm_hold(c);
    }
    for (i = 0; i < h->count && st == KVF_OK; i++) {
        kvf_shm_entry_dec(&r, &e);
        addr = e.addr;
        len = e.len;
        if (len > KVF_SHM_STAGE_LEN - off) {
            st = KVF_ERR_MSG_TOO_LARGE;
            break;
        }
        st = t->access(t->arg, addr, len, &mem);
        if (st != KVF_OK) {
            break;
        }
        p = (void *)(uintptr_t)addr;
        st = w ? kvf_mem_copy(p, c->stage + off, len, KVF_MEM_BIT(mem.type))
               : kvf_mem_copy(c->stage + off, p, len, KVF_MEM_BIT(mem.type));
        off += len;
    }
    if (c->nopen == 0) {
        kvf_shm_unhold(c);
    }
    return kvf_shm_reply(c, KVF_SHM_STAGE_ACK, st, NULL, 0, 0, -1);
}

/* 1 while window id still stands: its allocation alive and its range
 * registered as when it was handed out; a window that no longer stands
 * is forgotten (no lease can hold it: they hold the region lock too).
 * Region lock held. */
static int kvf_shm_window_alive(const kvf_shm_sconn_t *c, uint64_t id)
{
    const kvf_tl_target_t *t = &c->srv->iface->target;
    kvf_shm_alloc_info_t info;
    kvf_shm_window_t win, now;
    kvf_tl_mem_t mem = {0};

    if (kvf_shm_wintab_get(&c->srv->wins, id, &win) != 0) {
        return 0;
    }
    if (t->access(t->arg, win.reg_base, win.reg_len, &mem) == KVF_OK &&
        mem.type == KVF_MEM_HOST &&
        kvf_shm_mem_find(win.reg_base, win.reg_len, &info) == 0 &&
        info.id == win.alloc && kvf_shm_window(&info, &mem, &now) == 0 &&
        now.base == win.base && now.len == win.len &&
        now.reg_base == win.reg_base && now.reg_len == win.reg_len) {
        return 1;
    }
    kvf_shm_wintab_drop(&c->srv->wins, id);
    return 0;
}

static kvf_status_t kvf_shm_on_sync(kvf_shm_sconn_t *c,
                                    const kvf_frame_hdr_t *h)
{
    uint32_t i, ndead = 0;
    uint64_t id, *dead;
    kvf_status_t st;
    kvf_wr_t w;
    kvf_rd_t r;

    if (kvf_shm_ids_open(&r, h, c->in.p) != KVF_OK) {
        return KVF_ERR_PROTOCOL;
    }
    /* the released ids, then the reply encoded after them */
    st = kvf_shm_buf_reserve(&c->out, 8 + (size_t)h->count * 16);
    if (st != KVF_OK) {
        return st;
    }
    dead = (uint64_t *)(void *)c->out.p;
    if (c->nopen == 0) {
        kvf_shm_hold(c);
    }
    for (i = 0; i < h->count; i++) {
        id = kvf_shm_id_dec(&r);
        if (!kvf_shm_window_alive(c, id)) {
            dead[ndead++] = id;
        }
    }
    if (c->nopen == 0) {
        kvf_shm_unhold(c);
    }
    kvf_wr_init_fixed(&w, c->out.p + (size_t)h->count * 8,
                      8 + (size_t)h->count * 8);
    kvf_shm_sync_ack_enc(&w, kvf_shm_mem_epoch(), dead, ndead);
    return kvf_shm_reply(c, KVF_SHM_SYNC_ACK, KVF_OK, w.buf, (uint32_t)w.len,
                         ndead, -1);
}

/* Checks a SUM against the limits before any work. */
static kvf_status_t kvf_shm_sum_check(const kvf_shm_sconn_t *c,
                                      const kvf_frame_hdr_t *h, kvf_rd_t r)
{
    const kvf_tl_limits_t *lim = &c->srv->lim;
    uint64_t bytes = 0;
    kvf_shm_entry_t e;
    uint32_t i;

    if (h->count > lim->sum_max_entries) {
        kvf_log_rl(KVF_LOG_WARN,
                   "shm: refused a checksum request of %u entries "
                   "(sum_max_entries=%lu)",
                   h->count, (unsigned long)lim->sum_max_entries);
        return KVF_ERR_MSG_TOO_LARGE;
    }
    for (i = 0; i < h->count && bytes <= lim->sum_max_bytes; i++) {
        kvf_shm_entry_dec(&r, &e);
        bytes = (e.len > UINT64_MAX - bytes) ? UINT64_MAX : bytes + e.len;
    }
    if (bytes > lim->sum_max_bytes) {
        kvf_log_rl(KVF_LOG_WARN,
                   "shm: refused a checksum request over %lu bytes "
                   "(sum_max_bytes)",
                   (unsigned long)lim->sum_max_bytes);
        return KVF_ERR_MSG_TOO_LARGE;
    }
    return KVF_OK;
}

/* 1 when a request in progress should stop: the server stops or the
 * peer went away. */
static int kvf_shm_abandoned(const kvf_shm_sconn_t *c)
{
    return kvf_shm_stopping(c->srv) || kvf_tl_peer_gone(c->fd);
}

/*
 * Checksums of the entries, the region lock taken per entry (an entry is
 * at most sum_max_bytes), and between entries a look for a stop or a
 * peer that went away: then the request is dropped (KVF_ERR_CANCELED).
 */
static kvf_status_t kvf_shm_sum_entries(kvf_shm_sconn_t *c,
                                        const kvf_frame_hdr_t *h, kvf_rd_t *r,
                                        kvf_wr_t *w)
{
    const kvf_tl_target_t *t = &c->srv->iface->target;
    uint64_t sum, deadline, since = 0;
    kvf_status_t st = KVF_OK;
    kvf_shm_entry_t e;
    kvf_tl_mem_t mem;
    uint32_t i;

    deadline = kvf_time_ms() + c->srv->iface->cfg.timeout_ms;
    for (i = 0; i < h->count && st == KVF_OK; i++) {
        kvf_shm_entry_dec(r, &e);
        if (since >= KVF_TL_SUM_CHUNK) {
            since = 0;
            if (kvf_shm_abandoned(c)) {
                return KVF_ERR_CANCELED;
            }
        }
        since += e.len + 4096; /* many tiny entries cost too */
        kvf_shm_hold(c);
        st = t->access(t->arg, e.addr, e.len, &mem);
        if (st == KVF_OK) {
            st = kvf_mem_hash(&c->cstage, mem.type, e.addr, e.len, &sum,
                              deadline);
            kvf_shm_id_enc(w, sum);
        }
        kvf_shm_unhold(c);
    }
    return st;
}

static kvf_status_t kvf_shm_on_sum(kvf_shm_sconn_t *c, const kvf_frame_hdr_t *h)
{
    kvf_status_t st;
    kvf_wr_t w;
    kvf_rd_t r;

    if (c->nopen > 0 || kvf_shm_entries_in(c, h, &r) != KVF_OK) {
        return KVF_ERR_PROTOCOL;
    }
    st = kvf_shm_sum_check(c, h, r);
    if (st != KVF_OK) {
        return kvf_shm_reply(c, KVF_SHM_SUM_ACK, st, NULL, 0, 0, -1);
    }
    st = kvf_shm_buf_reserve(&c->out, (size_t)h->count * KVF_SHM_ID_LEN + 1);
    if (st != KVF_OK) {
        return st;
    }
    kvf_wr_init_fixed(&w, c->out.p, c->out.cap);
    st = kvf_shm_sum_entries(c, h, &r, &w);
    if (st == KVF_ERR_CANCELED) {
        return st; /* ends the connection */
    }
    if (st != KVF_OK) {
        return kvf_shm_reply(c, KVF_SHM_SUM_ACK, st, NULL, 0, 0, -1);
    }
    return kvf_shm_reply(c, KVF_SHM_SUM_ACK, KVF_OK, c->out.p, (uint32_t)w.len,
                         h->count, -1);
}

static kvf_status_t kvf_shm_dispatch(kvf_shm_sconn_t *c,
                                     const kvf_frame_hdr_t *h, int rfd)
{

    if (!c->hello) {
        return h->type == KVF_SHM_HELLO ? kvf_shm_on_hello(c, h)
                                        : KVF_ERR_PROTOCOL;
    }
    switch (h->type) {
    case KVF_SHM_BEGIN:
        return kvf_shm_on_begin(c, h);
    case KVF_SHM_MAP:
        return kvf_shm_on_map(c, h);
    case KVF_SHM_STAGE_SETUP:
        return kvf_shm_on_stage_setup(c, rfd);
    case KVF_SHM_STAGE:
        return kvf_shm_on_stage(c, h);
    case KVF_SHM_END: /* closes the oldest open lease */
        if (c->nopen == 0) {
            return KVF_ERR_PROTOCOL;
        }
        c->ohead = (c->ohead + 1) % KVF_SHM_OPEN_MAX;
        if (--c->nopen == 0) {
            kvf_shm_unhold(c);
        }
        return KVF_OK;
    case KVF_SHM_SYNC:
        return kvf_shm_on_sync(c, h);
    case KVF_SHM_SUM:
        return kvf_shm_on_sum(c, h);
    default:
        kvf_warn("shm: unknown message type %u", h->type);
        return KVF_ERR_PROTOCOL;
    }
}

/*
 * KVF_ERR_TIMEOUT when this connection's leases have kept a waiting
 * (de)registration out for lease_break_ms: a peer whose leases overlap
 * without a gap would hold the region lock for as long as it likes, so
 * its leases are broken (the connection closed; its next operation fails
 * with a status).
 */
static kvf_status_t kvf_shm_lease_fair(kvf_shm_sconn_t *c)
{
    const kvf_tl_target_t *t = &c->srv->iface->target;
    uint64_t now;

    if (c->nopen == 0 || t->writer_waiting == NULL ||
        !t->writer_waiting(t->arg)) {
        c->starve_since = 0;
        return KVF_OK;
    }
    now = kvf_time_ms();
    if (c->starve_since == 0) {
        c->starve_since = now;
    } else if (now - c->starve_since >= c->srv->lim.lease_break_ms) {
        kvf_log_rl(KVF_LOG_WARN,
                   "shm: leases of pid %d kept a deregistration waiting %u "
                   "ms (lease_break_ms); broken, connection closed",
                   (int)c->peer_pid, c->srv->lim.lease_break_ms);
        return KVF_ERR_TIMEOUT;
    }
    return KVF_OK;
}

/* Waits for the next frame: until idle_timeout_ms when idle (checking
 * stop), until the lease deadline inside a lease. */
static kvf_status_t kvf_shm_wait_frame(kvf_shm_sconn_t *c)
{
    struct pollfd pfd = {.fd = c->fd, .events = POLLIN};
    uint64_t idle_end = kvf_time_ms() + c->srv->lim.idle_timeout_ms;
    int wait_ms, left, ret;

    for (;;) {
        if (kvf_shm_stopping(c->srv)) {
            return KVF_ERR_CANCELED;
        }
        if (kvf_shm_lease_fair(c) != KVF_OK) {
            return KVF_ERR_TIMEOUT;
        }
        wait_ms = KVF_SHM_IDLE_POLL_MS;
        left = kvf_time_left_ms(c->nopen > 0 ? c->open[c->ohead].deadline
                                             : idle_end);
        if (left == 0) {
            if (c->nopen == 0) {
                kvf_debug("shm: closing a connection idle for %u ms",
                          c->srv->lim.idle_timeout_ms);
                return KVF_ERR_CANCELED;
            }
            return KVF_ERR_TIMEOUT;
        }
        wait_ms = left < wait_ms ? left : wait_ms;
        if (c->starve_since != 0 && wait_ms > 10) {
            wait_ms = 10; /* the break is due soon */
        }
        ret = poll(&pfd, 1, wait_ms);
        if (ret > 0) {
            return KVF_OK;
        }
        if (ret < 0 && errno != EINTR) {
            return KVF_ERR_IO;
        }
    }
}

/* The authentication exchange, before any frame is read. Its frames
 * carry no tags: nobody can inject into a unix socket, and its peer is
 * checked by kernel credentials (docs/security.md). */
static kvf_status_t kvf_shm_sconn_auth(kvf_shm_sconn_t *c)
{
    return kvf_auth_server(c->fd, NULL, "shm", "local",
                           kvf_time_ms() + c->srv->iface->cfg.timeout_ms, NULL);
}

static void *kvf_shm_sconn_main(void *arg)
{
    kvf_shm_sconn_t *c = arg;
    kvf_frame_hdr_t h;
    kvf_status_t st;
    int rfd;

    st = kvf_shm_sconn_auth(c);
    while (st == KVF_OK) {
        st = kvf_shm_wait_frame(c);
        if (st == KVF_OK) {
            st = kvf_shm_recv(c->fd, &h, &c->in, &rfd,
                              c->nopen > 0 ? c->open[c->ohead].deadline
                                           : kvf_time_ms() +
                                                 c->srv->iface->cfg.timeout_ms);
        }
        if (st == KVF_OK) {
            st = kvf_shm_dispatch(c, &h, rfd);
            if (rfd >= 0) {
                close(rfd);
            }
        }
        if (st != KVF_OK) {
            if (st == KVF_ERR_TIMEOUT && c->starve_since != 0) {
                /* broken for a waiting writer: logged already */
            } else if (st == KVF_ERR_TIMEOUT && c->nopen > 0) {
                kvf_error("shm: a lease outlived %u ms; revoked, connection "
                          "closed",
                          c->srv->iface->cfg.timeout_ms);
            } else if (st != KVF_ERR_CONN_RESET && st != KVF_ERR_CANCELED) {
                kvf_warn("shm: connection closed: %s", kvf_status_str(st));
            }
            break;
        }
    }
    if (c->nopen > 0) {
        /* hang up before the region lock goes: an initiator that finds
         * no hang-up after its copy (or at a view's release) knows its
         * lease held, no deregistration got in meanwhile */
        shutdown(c->fd, SHUT_RDWR);
        c->nopen = 0;
        kvf_shm_unhold(c);
    }
    if (c->stage != NULL) {
        munmap(c->stage, KVF_SHM_STAGE_LEN);
        c->stage = NULL;
    }
    kvf_mem_stage_free(c->cstage);
    c->cstage = NULL;
    close(c->fd);
    c->fd = -1;
    __atomic_store_n(&c->done, 1, __ATOMIC_RELEASE);
    return NULL;
}

static void kvf_shm_sconn_free(kvf_shm_sconn_t *c)
{
    kvf_shm_buf_free(&c->in);
    kvf_shm_buf_free(&c->out);
    kvf_shm_buf_free(&c->exc);
    kvf_free(c);
}

/* Joins and frees finished connections. Caller holds the lock. */
static void kvf_shm_reap(kvf_shm_server_t *s, int all)
{
    kvf_shm_sconn_t **pp = &s->conns, *c;

    while ((c = *pp) != NULL) {
        if (all || __atomic_load_n(&c->done, __ATOMIC_ACQUIRE)) {
            *pp = c->next;
            pthread_join(c->thread, NULL);
            kvf_shm_sconn_free(c);
            s->nconns--;
        } else {
            pp = &c->next;
        }
    }
}

/* Whether a new connection from process pid fits under the caps (the
 * global one, then the per-peer one); logs a refusal, rate-limited.
 * Caller holds s->lock. */
static int kvf_shm_admit(const kvf_shm_server_t *s, pid_t pid)
{
    const kvf_shm_sconn_t *c;
    unsigned same = 0;

    if (s->nconns >= s->lim.conns_max) {
        kvf_log_rl(KVF_LOG_WARN,
                   "shm: %u connections, refusing more "
                   "(conns_max)",
                   s->nconns);
        return 0;
    }
    for (c = s->conns; c != NULL; c = c->next) {
        if (c->peer_pid == pid &&
            !__atomic_load_n(&c->done, __ATOMIC_ACQUIRE)) {
            same++;
        }
    }
    if (same >= s->lim.conns_per_addr) {
        kvf_log_rl(KVF_LOG_WARN,
                   "shm: refusing a connection from pid %d: %u already open "
                   "(conns_per_addr)",
                   (int)pid, same);
        return 0;
    }
    return 1;
}

static void kvf_shm_accept_one(kvf_shm_server_t *s)
{
    kvf_shm_sconn_t *c;
    struct ucred cred;
    socklen_t clen = sizeof(cred);
    int fd;

    fd = accept4(s->lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
        if (errno != EAGAIN && errno != EINTR &&
            !kvf_tl_accept_backoff(errno)) {
            kvf_log_rl(KVF_LOG_WARN, "shm: accept: %m");
        }
        return;
    }
    memset(&cred, 0, sizeof(cred));
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) == 0) {
        kvf_debug("shm: connection from pid %d uid %u", (int)cred.pid,
                  (unsigned)cred.uid);
    }
    pthread_mutex_lock(&s->lock);
    kvf_shm_reap(s, 0);
    if (!kvf_shm_admit(s, cred.pid)) {
        pthread_mutex_unlock(&s->lock);
        close(fd);
        return;
    }
    c = kvf_calloc(1, sizeof(*c));
    if (c == NULL) {
        pthread_mutex_unlock(&s->lock);
        close(fd);
        return;
    }
    c->srv = s;
    c->fd = fd;
    c->peer_pid = cred.pid;
    if (pthread_create(&c->thread, NULL, kvf_shm_sconn_main, c) != 0) {
        pthread_mutex_unlock(&s->lock);
        kvf_log_rl(KVF_LOG_WARN, "shm: no thread for a connection");
        close(fd);
        kvf_shm_sconn_free(c);
        return;
    }
    c->next = s->conns;
    s->conns = c;
    s->nconns++;
    pthread_mutex_unlock(&s->lock);
}

static void *kvf_shm_accept_main(void *arg)
{
    kvf_shm_server_t *s = arg;
    struct pollfd pfd = {.fd = s->lfd, .events = POLLIN};

    while (!kvf_shm_stopping(s)) {
        if (poll(&pfd, 1, KVF_SHM_IDLE_POLL_MS) > 0) {
            kvf_shm_accept_one(s);
        }
    }
    return NULL;
}

kvf_status_t kvf_shm_server_start(kvf_tl_iface_t *iface)
{
    kvf_shm_server_t *s;
    kvf_status_t status;

    s = kvf_calloc(1, sizeof(*s));
    if (s == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    s->iface = iface;
    s->lfd = -1;
    status = kvf_tl_limits_load(&s->lim);
    if (status != KVF_OK) {
        goto err_free;
    }
    s->probe_fd = kvf_shm_probe_create(iface);
    if (s->probe_fd < 0) {
        status = KVF_ERR_UNAVAILABLE;
        goto err_free;
    }
    status = kvf_shm_listen(iface->nonce, &s->lfd);
    if (status != KVF_OK) {
        goto err_probe;
    }
    pthread_mutex_init(&s->lock, NULL);
    kvf_shm_wintab_init(&s->wins);
    pthread_mutex_init(&s->gate_lock, NULL);
    kvf_cond_init(&s->gate_cond);
    if (pthread_create(&s->thread, NULL, kvf_shm_accept_main, s) != 0) {
        status = KVF_ERR_NO_RESOURCE;
        goto err_listen;
    }
    iface->server = s;
    return KVF_OK;

err_listen:
    kvf_shm_wintab_free(&s->wins);
    pthread_cond_destroy(&s->gate_cond);
    pthread_mutex_destroy(&s->gate_lock);
    pthread_mutex_destroy(&s->lock);
    close(s->lfd);
err_probe:
    close(s->probe_fd);
err_free:
    kvf_free(s);
    return status;
}

void kvf_shm_server_stop(kvf_tl_iface_t *iface)
{
    kvf_shm_server_t *s = iface->server;

    if (s == NULL) {
        return;
    }
    __atomic_store_n(&s->stop, 1, __ATOMIC_RELEASE);
    pthread_join(s->thread, NULL);
    close(s->lfd);
    pthread_mutex_lock(&s->lock);
    kvf_shm_reap(s, 1);
    pthread_mutex_unlock(&s->lock);
    pthread_mutex_destroy(&s->lock);
    kvf_shm_wintab_free(&s->wins);
    pthread_cond_destroy(&s->gate_cond);
    pthread_mutex_destroy(&s->gate_lock);
    close(s->probe_fd);
    kvf_free(s);
    iface->server = NULL;
}
