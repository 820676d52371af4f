/*
 * shm transport, initiator side: connections and leases.
 *
 * A connection shakes hands (HELLO, probe check) and then carries
 * requests whose replies come back in order; the connection remembers
 * which reply it owes next (the expect ring), so a worker can send the
 * BEGIN of its next lease before it copies the current one and read the
 * GRANT later: the round trip hides behind the copy. kvf_shm_pump() reads
 * replies in order and applies the GRANTs it meets until the reply its
 * caller waits for.
 *
 * A lease's life: BEGIN (entries) -> GRANT (target's verdicts and the
 * shareable allocations holding the entries) -> prepare (MAP the
 * allocations not mapped yet: fd over the socket) -> copy
 * (memcpy straight to or from the mapping; STAGE for entries the target
 * moves itself) -> END. The results count when the copy ended within the
 * validity the GRANT announced (measured on this side from before BEGIN,
 * so it never overestimates) and the connection shows no hang-up after
 * the copy (the target alive, the lease not revoked): no round trip.
 *
 * Mappings are the ep's, shared by its workers: read-locked while
 * copying, write-locked to add or drop one. A mapping that view leases
 * point into (shm_view.c) is not unmapped while one does: it is marked
 * dead and unmapped when the last of them is released.
 */
#include "transport/shm/shm.h"
#include "core/alloc.h"
#include "core/log.h"
#include "core/time.h"

#include <fcntl.h>
#include <poll.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* ---- mappings ----------------------------------------------------------- */

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

/*
 * Page tables of a fresh mapping of the target's allocation. Huge pages
 * first: the target's shmem pages are 2 MiB folios when it asked for
 * them (shm_mem.c) and shmem_enabled allows it, but this mapping maps
 * them with 2 MiB entries only if it asks too, before anything touches
 * it: random 8 KiB blocks spread over gigabytes then cost a TLB miss per
 * block instead of two. Filling the page tables ahead keeps page faults
 * out of later copies, but with 4 KiB pages (shmem_enabled "never") a
 * 16 GiB pool takes seconds, so no copy waits for it: copies fault in
 * the pages they touch, and the ep's populator thread fills the rest in
 * steps while no copy runs. Filling beside running copies slows them
 * several-fold (their faults and the fill contend in the kernel), so
 * the populator waits until the ep has seen no copy and no new request
 * for KVF_SHM_POPULATOR_QUIET_MS, and a copy that starts meanwhile waits
 * for one step at most. One step per hold of map_lock's read side (a mapping
 * added or dropped waits one step at most). Without MADV_POPULATE_WRITE
 * (kernels < 5.14) pages fault in as copies touch them.
 */
#define KVF_SHM_POPULATE_STEP      (4ul << 20)
#define KVF_SHM_POPULATOR_NAP_MS   1000 /* longest sleep between checks */
#define KVF_SHM_POPULATOR_QUIET_MS 10

static int kvf_shm_stopping(kvf_tl_ep_t *ep)
{
    return __atomic_load_n(&ep->stop, __ATOMIC_RELAXED);
}

/* One step of the first mapping still short of page tables; 1 when
 * there was one. */
static int kvf_shm_populate_step(kvf_tl_ep_t *ep)
{
    kvf_shm_map_t *m;
    uint64_t n;
    size_t i;
    int did = 0;

    pthread_rwlock_rdlock(&ep->map_lock);
    for (i = 0; i < ep->nmaps && !did; i++) {
        m = &ep->maps[i];
        if (m->dead || m->filled >= m->len) {
            continue;
        }
        n = m->len - m->filled < KVF_SHM_POPULATE_STEP ? m->len - m->filled
                                                       : KVF_SHM_POPULATE_STEP;
        if (madvise(m->ptr + m->filled, n, MADV_POPULATE_WRITE) != 0) {
            kvf_debug("shm: MADV_POPULATE_WRITE: %m; pages fault in lazily");
            n = m->len - m->filled; /* give this mapping up */
        }
        m->filled += n;
        did = 1;
    }
    pthread_rwlock_unlock(&ep->map_lock);
    return did;
}

/* Sleeps until a mapping comes, the ep stops, or ms pass. */
static void kvf_shm_populator_nap(kvf_tl_ep_t *ep, unsigned ms)
{
    struct timespec ts;

    pthread_mutex_lock(&ep->pop_lock);
    kvf_time_abs_after(&ts, ms);
    while (!ep->pop_work && !kvf_shm_stopping(ep)) {
        if (pthread_cond_timedwait(&ep->pop_cond, &ep->pop_lock, &ts) != 0) {
            break;
        }
    }
    ep->pop_work = 0;
    pthread_mutex_unlock(&ep->pop_lock);
}

void kvf_shm_copy_stamp(kvf_tl_ep_t *ep)
{
    __atomic_store_n(&ep->copy_ms, kvf_time_ms(), __ATOMIC_RELAXED);
}

/* ms until copies (and posts) have been quiet long enough for a step;
 * 0: now */
static unsigned kvf_shm_quiet_left(kvf_tl_ep_t *ep)
{
    uint64_t since;

    if (__atomic_exchange_n(&ep->posted, 0, __ATOMIC_RELAXED)) {
        kvf_shm_copy_stamp(ep);
    }
    since = kvf_time_ms() - __atomic_load_n(&ep->copy_ms, __ATOMIC_RELAXED);

    return since >= KVF_SHM_POPULATOR_QUIET_MS
               ? 0
               : (unsigned)(KVF_SHM_POPULATOR_QUIET_MS - since);
}

static void *kvf_shm_populator_main(void *arg)
{
    kvf_tl_ep_t *ep = arg;
    unsigned wait;

    while (!kvf_shm_stopping(ep)) {
        wait = kvf_shm_quiet_left(ep);
        if (wait > 0) {
            kvf_shm_populator_nap(ep, wait);
        } else if (!kvf_shm_populate_step(ep)) {
            kvf_shm_populator_nap(ep, KVF_SHM_POPULATOR_NAP_MS);
        }
    }
    return NULL;
}

static void kvf_shm_populator_wake(kvf_tl_ep_t *ep)
{
    if (!ep->populator_on) {
        return;
    }
    pthread_mutex_lock(&ep->pop_lock);
    ep->pop_work = 1;
    pthread_cond_signal(&ep->pop_cond);
    pthread_mutex_unlock(&ep->pop_lock);
}

void kvf_shm_populator_start(kvf_tl_ep_t *ep)
{
    pthread_mutex_init(&ep->pop_lock, NULL);
    kvf_cond_init(&ep->pop_cond);
    ep->populator_on =
        pthread_create(&ep->populator, NULL, kvf_shm_populator_main, ep) == 0;
    if (!ep->populator_on) {
        kvf_debug("shm: no populator thread; pages fault in lazily");
    }
}

void kvf_shm_populator_stop(kvf_tl_ep_t *ep)
{
    if (ep->populator_on) {
        pthread_mutex_lock(&ep->pop_lock);
        pthread_cond_broadcast(&ep->pop_cond); /* ep->stop is set */
        pthread_mutex_unlock(&ep->pop_lock);
        pthread_join(ep->populator, NULL);
        ep->populator_on = 0;
    }
    pthread_cond_destroy(&ep->pop_cond);
    pthread_mutex_destroy(&ep->pop_lock);
}

unsigned char *kvf_shm_map_ptr(kvf_tl_ep_t *ep, uint64_t id)
{
    size_t i;

    for (i = 0; i < ep->nmaps; i++) {
        if (ep->maps[i].id == id && !ep->maps[i].dead) {
            return ep->maps[i].ptr;
        }
    }
    return NULL;
}

/* Unmaps mapping i, or, while views lie in it, marks it dead (unmapped
 * at its last view: kvf_shm_map_unview). 1 when it left the table.
 * Caller holds map_lock's write side. */
static int kvf_shm_map_drop(kvf_tl_ep_t *ep, size_t i)
{
    kvf_shm_map_t *m = &ep->maps[i];

    if (m->views > 0) {
        m->dead = 1;
        return 0;
    }
    kvf_tl_unmap_notify(m->ptr, m->len); /* e.g. a GPU registration */
    munmap(m->ptr, m->len);
    ep->maps[i] = ep->maps[ep->nmaps - 1];
    __atomic_store_n(&ep->nmaps, ep->nmaps - 1, __ATOMIC_RELAXED);
    return 1;
}

void kvf_shm_map_unview(kvf_tl_ep_t *ep, uint64_t id)
{
    size_t i;

    for (i = 0; i < ep->nmaps; i++) {
        if (ep->maps[i].id == id && ep->maps[i].views > 0) {
            if (--ep->maps[i].views == 0 && ep->maps[i].dead) {
                kvf_shm_map_drop(ep, i);
            }
            return;
        }
    }
}

void kvf_shm_drop_maps(kvf_tl_ep_t *ep)
{
    size_t i, n;

    pthread_rwlock_wrlock(&ep->map_lock);
    n = ep->nmaps;
    for (i = ep->nmaps; i-- > 0;) {
        ep->maps[i].dead = 1; /* whatever is viewed goes at its last view */
        kvf_shm_map_drop(ep, i);
    }
    if (n > 0) {
        kvf_debug("shm: dropped %zu mapping(s) of a target, %zu kept for "
                  "views",
                  n - ep->nmaps, ep->nmaps);
    }
    if (ep->nmaps == 0) {
        kvf_free(ep->maps);
        ep->maps = NULL;
        ep->maps_cap = 0;
    }
    pthread_rwlock_unlock(&ep->map_lock);
}

static kvf_status_t kvf_shm_map_add(kvf_tl_ep_t *ep, uint64_t id, uint64_t base,
                                    uint64_t len, void *p)
{
    kvf_shm_map_t *grown;

    pthread_rwlock_wrlock(&ep->map_lock);
    if (kvf_shm_map_ptr(ep, id) != NULL) { /* another worker was faster */
        pthread_rwlock_unlock(&ep->map_lock);
        munmap(p, len);
        return KVF_OK;
    }
    if (ep->nmaps == ep->maps_cap) {
        size_t cap = ep->maps_cap ? ep->maps_cap * 2 : 8;

        grown = kvf_realloc(ep->maps, cap * sizeof(*grown));
        if (grown == NULL) {
            pthread_rwlock_unlock(&ep->map_lock);
            munmap(p, len);
            return KVF_ERR_NO_MEMORY;
        }
        ep->maps = grown;
        ep->maps_cap = cap;
    }
    ep->maps[ep->nmaps].id = id;
    ep->maps[ep->nmaps].base = base;
    ep->maps[ep->nmaps].len = len;
    ep->maps[ep->nmaps].ptr = p;
    ep->maps[ep->nmaps].views = 0;
    ep->maps[ep->nmaps].dead = 0;
    ep->maps[ep->nmaps].filled = 0;
    __atomic_store_n(&ep->nmaps, ep->nmaps + 1, __ATOMIC_RELAXED);
    pthread_rwlock_unlock(&ep->map_lock);
    kvf_shm_populator_wake(ep);
    kvf_debug("shm: mapped target allocation %lu (%lu bytes)",
              (unsigned long)id, (unsigned long)len);
    return KVF_OK;
}

/* ---- messages ----------------------------------------------------------- */

static kvf_status_t kvf_shm_post(kvf_tl_ep_t *ep, kvf_shm_conn_t *c,
                                 uint8_t type, uint16_t flags, const void *meta,
                                 uint32_t meta_len, uint32_t count, int pass_fd,
                                 uint8_t reply, kvf_shm_lease_t *l)
{
    kvf_status_t st;
    unsigned slot;

    if (c->fd < 0) {
        return KVF_ERR_CONN_RESET;
    }
    if (reply != 0 && c->ecount == KVF_SHM_EXPECT_MAX) {
        return KVF_ERR_INTERNAL;
    }
    st = kvf_shm_send(c->fd, type, flags, KVF_OK, meta, meta_len, count,
                      pass_fd, kvf_time_ms() + ep->timeout_ms);
    if (st == KVF_OK && reply != 0) {
        slot = (c->ehead + c->ecount) % KVF_SHM_EXPECT_MAX;
        c->expect[slot].type = reply;
        c->expect[slot].lease = l;
        c->ecount++;
    }
    return st;
}

/* A GRANT that opened no lease, or could not be read: every entry gets
 * the verdict st. */
static void kvf_shm_grant_refused(kvf_shm_lease_t *l, kvf_status_t st)
{
    size_t i;

    l->nallocs = 0;
    for (i = 0; i < l->n; i++) {
        l->excs[i] = st;
    }
}

/* GRANT (msg.h): the lease's allocations and the entries' verdicts. */
static void kvf_shm_on_grant(kvf_tl_ep_t *ep, kvf_shm_lease_t *l,
                             const kvf_frame_hdr_t *h, const unsigned char *r)
{
    kvf_shm_grant_t g;
    kvf_shm_exc_t e;
    kvf_rd_t rd;
    uint32_t k;
    size_t i;

    l->state = KVF_SHM_L_GRANTED;
    if (h->status != KVF_OK) { /* no lease was opened */
        kvf_shm_grant_refused(l, (kvf_status_t)h->status);
        l->end_status = (kvf_status_t)h->status;
        l->state = KVF_SHM_L_DONE;
        return;
    }
    if (kvf_shm_grant_dec(&rd, r, h->meta_len, &g) != KVF_OK || g.nexc > l->n) {
        kvf_warn("shm: malformed grant (%u bytes)", h->meta_len);
        kvf_shm_grant_refused(l, KVF_ERR_PROTOCOL);
        return;
    }
    if (g.epoch != __atomic_load_n(&ep->epoch_seen, __ATOMIC_RELAXED)) {
        __atomic_store_n(&ep->need_sync, 1, __ATOMIC_RELAXED);
    }
    l->valid_until_ms = l->begin_ms + g.left_ms;
    l->nallocs = g.nallocs;
    for (k = 0; k < g.nallocs; k++) {
        l->ids[k] = g.allocs[k].id;
        l->bases[k] = g.allocs[k].base;
        l->alens[k] = g.allocs[k].len;
        l->ranges[k] = g.allocs[k].range;
    }
    for (i = 0; i < l->n; i++) {
        l->excs[i] = KVF_OK;
    }
    for (k = 0; k < g.nexc; k++) {
        kvf_shm_exc_dec(&rd, &e);
        if (e.index < l->n) {
            l->excs[e.index] = e.status;
        }
    }
}

kvf_status_t kvf_shm_pump(kvf_tl_ep_t *ep, kvf_shm_conn_t *c, uint8_t want,
                          kvf_frame_hdr_t *h, int *rfd)
{
    kvf_shm_expect_t e;
    kvf_frame_hdr_t hh;
    kvf_status_t st;
    int fd;

    if (rfd != NULL) {
        *rfd = -1;
    }
    for (;;) {
        if (c->ecount == 0 || c->fd < 0) {
            return c->fd < 0 ? KVF_ERR_CONN_RESET : KVF_ERR_INTERNAL;
        }
        st = kvf_shm_recv(c->fd, &hh, &c->reply, &fd,
                          kvf_time_ms() + ep->timeout_ms);
        if (st != KVF_OK) {
            return st;
        }
        e = c->expect[c->ehead];
        c->ehead = (c->ehead + 1) % KVF_SHM_EXPECT_MAX;
        c->ecount--;
        if (hh.type != e.type) {
            kvf_error("shm: reply type %u where %u was due", hh.type, e.type);
            if (fd >= 0) {
                close(fd);
            }
            return KVF_ERR_PROTOCOL;
        }
        if (e.type == KVF_SHM_GRANT && e.lease != NULL) {
            kvf_shm_on_grant(ep, e.lease, &hh, c->reply.p);
        }
        if (want == 0 || hh.type == want) {
            if (h != NULL) {
                *h = hh;
            }
            if (rfd != NULL) {
                *rfd = fd;
            } else if (fd >= 0) {
                close(fd);
            }
            return KVF_OK;
        }
        if (fd >= 0) {
            close(fd);
        }
    }
}

/* ---- connections --------------------------------------------------------- */

/* Maps the probe the target sent and checks it names this very iface. */
static kvf_status_t kvf_shm_check_probe(kvf_tl_ep_t *ep, int fd)
{
    unsigned char nonce[KVF_SHM_NONCE_LEN];
    const unsigned char *p;
    kvf_status_t st;
    uint64_t host_id;

    st = kvf_shm_memfd_check(fd, 0, KVF_SHM_PROBE_LEN);
    if (st != KVF_OK) {
        return st;
    }
    p = mmap(NULL, KVF_SHM_PROBE_LEN, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        kvf_info("shm: cannot map the target's probe: %m");
        return KVF_ERR_UNAVAILABLE;
    }
    if (kvf_shm_probe_dec(p, KVF_SHM_PROBE_LEN, nonce, &host_id) != KVF_OK ||
        memcmp(nonce, ep->nonce, KVF_SHM_NONCE_LEN) != 0 ||
        host_id != ep->iface->host_id) {
        kvf_warn("shm: the target's probe does not match its descriptor");
        st = KVF_ERR_UNAVAILABLE;
    }
    munmap((void *)p, KVF_SHM_PROBE_LEN);
    return st;
}

kvf_status_t kvf_shm_conn_open(kvf_tl_ep_t *ep, kvf_shm_conn_t *c)
{
    uint64_t deadline = kvf_time_ms() + ep->timeout_ms;
    kvf_shm_hello_t hello = {.version = KVF_SHM_PROTO};
    kvf_shm_hello_ack_t ack;
    kvf_frame_hdr_t h;
    kvf_status_t st;
    kvf_wr_t w;
    int pfd = -1;

    c->fd = -1;
    c->ehead = c->ecount = 0;
    st = kvf_shm_connect(ep->nonce, deadline, &c->fd);
    if (st != KVF_OK) {
        return st;
    }
    st = kvf_shm_peer_check(c->fd, "target");
    if (st != KVF_OK) {
        kvf_shm_conn_close(c);
        return st;
    }
    memcpy(hello.nonce, ep->nonce, KVF_SHM_NONCE_LEN);
    hello.host_id = ep->iface->host_id;
    kvf_wr_init(&w);
    kvf_shm_hello_enc(&w, &hello);
    st = kvf_wr_status(&w);
    if (st == KVF_OK) {
        st = kvf_shm_post(ep, c, KVF_SHM_HELLO, 0, w.buf, (uint32_t)w.len, 0,
                          -1, KVF_SHM_HELLO_ACK, NULL);
    }
    kvf_wr_free(&w);
    if (st == KVF_OK) {
        st = kvf_shm_pump(ep, c, KVF_SHM_HELLO_ACK, &h, &pfd);
    }
    if (st == KVF_OK && h.status != KVF_OK) {
        st = (kvf_status_t)h.status;
    } else if (st == KVF_OK && pfd < 0) {
        st = KVF_ERR_PROTOCOL;
    } else if (st == KVF_OK) {
        st = kvf_shm_hello_ack_dec(c->reply.p, h.meta_len, &ack);
    }
    if (st == KVF_OK) {
        st = kvf_shm_check_probe(ep, pfd);
    }
    if (pfd >= 0) {
        close(pfd);
    }
    if (st != KVF_OK) {
        kvf_info("shm: handshake with the target failed: %s",
                 kvf_status_str(st));
        kvf_shm_conn_close(c);
    }
    return st;
}

void kvf_shm_conn_close(kvf_shm_conn_t *c)
{
    if (c->fd >= 0) {
        close(c->fd);
        c->fd = -1;
    }
    if (c->stage != NULL) {
        munmap(c->stage, KVF_SHM_STAGE_LEN);
        c->stage = NULL;
    }
    c->ehead = c->ecount = 0;
}

void kvf_shm_conn_free(kvf_shm_conn_t *c)
{
    kvf_shm_conn_close(c);
    kvf_shm_buf_free(&c->meta);
    kvf_shm_buf_free(&c->reply);
}

/* ---- leases ------------------------------------------------------------ */

kvf_status_t kvf_shm_lease_reserve(kvf_shm_lease_t *l, size_t n)
{
    size_t cap = l->cap ? l->cap : 256;

    if (n <= l->cap) {
        return KVF_OK;
    }
    while (cap < n) {
        cap *= 2;
    }
#define KVF_SHM_GROW(_f)                                                       \
    do {                                                                       \
        void *_p = kvf_realloc(l->_f, cap * sizeof(*l->_f));                   \
        if (_p == NULL) {                                                      \
            return KVF_ERR_NO_MEMORY;                                          \
        }                                                                      \
        l->_f = _p;                                                            \
    } while (0)
    KVF_SHM_GROW(local);
    KVF_SHM_GROW(remote);
    KVF_SHM_GROW(lens);
    KVF_SHM_GROW(st);
    KVF_SHM_GROW(excs);
    KVF_SHM_GROW(ptrs);
    KVF_SHM_GROW(owner);
    KVF_SHM_GROW(segi);
    KVF_SHM_GROW(staged);
#undef KVF_SHM_GROW
    l->cap = cap;
    return KVF_OK;
}

void kvf_shm_lease_free(kvf_shm_lease_t *l)
{
    kvf_free(l->reqs);
    kvf_free(l->local);
    kvf_free(l->remote);
    kvf_free(l->lens);
    kvf_free(l->st);
    kvf_free(l->excs);
    kvf_free(l->ptrs);
    kvf_free(l->owner);
    kvf_free(l->segi);
    kvf_free(l->staged);
    memset(l, 0, sizeof(*l));
}

kvf_status_t kvf_shm_post_begin(kvf_tl_ep_t *ep, kvf_shm_conn_t *c,
                                kvf_shm_lease_t *l)
{
    kvf_status_t st;
    kvf_wr_t w;
    size_t i;

    st = kvf_shm_buf_reserve(&c->meta, l->n * KVF_SHM_ENTRY_LEN + 1);
    if (st != KVF_OK) {
        return st;
    }
    kvf_wr_init_fixed(&w, c->meta.p, c->meta.cap);
    for (i = 0; i < l->n; i++) {
        kvf_shm_entry_enc(&w, l->remote[i], l->lens[i]);
    }
    l->nallocs = 0;
    l->end_status = KVF_OK;
    l->valid_until_ms = 0;
    l->begin_ms = kvf_time_ms();
    l->state = KVF_SHM_L_BEGUN;
    return kvf_shm_post(ep, c, KVF_SHM_BEGIN, (uint16_t)l->type, c->meta.p,
                        (uint32_t)w.len, (uint32_t)l->n, -1, KVF_SHM_GRANT, l);
}

kvf_status_t kvf_shm_lease_held(kvf_shm_conn_t *c, const kvf_shm_lease_t *l)
{
    struct pollfd pfd = {.fd = c->fd, .events = POLLRDHUP};

    /* the copy is over (and fenced): was the lease still valid? */
    if (kvf_time_ms() + 1 >= l->valid_until_ms) {
        kvf_log_rl(KVF_LOG_ERROR, "shm: a copy outlived its lease (%lu ms)",
                   (unsigned long)(l->valid_until_ms - l->begin_ms));
        return KVF_ERR_TIMEOUT; /* the target closes this connection */
    }
    if (c->fd < 0 || (poll(&pfd, 1, 0) > 0 &&
                      (pfd.revents & (POLLHUP | POLLRDHUP | POLLERR)))) {
        return KVF_ERR_CONN_RESET; /* target gone or lease revoked */
    }
    return KVF_OK;
}

kvf_status_t kvf_shm_post_end(kvf_tl_ep_t *ep, kvf_shm_conn_t *c,
                              kvf_shm_lease_t *l)
{
    kvf_status_t st;

    if (l->state != KVF_SHM_L_OPEN) { /* an open one was judged already */
        l->end_status = kvf_shm_lease_held(c, l);
    }
    l->state = KVF_SHM_L_DONE;
    if (l->end_status != KVF_OK) {
        return l->end_status;
    }
    st = kvf_shm_post(ep, c, KVF_SHM_END, 0, NULL, 0, 0, -1, 0, NULL);
    l->end_status = st;
    return st;
}

kvf_status_t kvf_shm_lease_ride(kvf_tl_ep_t *ep, const kvf_shm_lease_t *open,
                                kvf_shm_lease_t *l)
{
    unsigned k = 0;
    size_t i;

    unsigned char *mptr[KVF_SHM_LEASE_ALLOCS];

    if (l->n == 0 || l->n > KVF_SHM_ENTRIES_MAX || open->nallocs == 0 ||
        kvf_time_ms() >= open->begin_ms + KVF_SHM_RIDE_MS) {
        return KVF_ERR_NOT_FOUND;
    }
    pthread_rwlock_rdlock(&ep->map_lock);
    /* the mappings as they are now (a dropped target leaves none) */
    for (k = 0; k < open->nallocs; k++) {
        mptr[k] = open->ranges[k] ? kvf_shm_map_ptr(ep, open->ids[k]) : NULL;
    }
    for (i = 0, k = 0; i < l->n; i++) {
        uint64_t r = l->remote[i], n = l->lens[i];

        if (!(r >= open->bases[k] && r - open->bases[k] < open->ranges[k] &&
              n <= open->ranges[k] - (r - open->bases[k]))) {
            for (k = 0; k < open->nallocs; k++) {
                if (r >= open->bases[k] &&
                    r - open->bases[k] < open->ranges[k] &&
                    n <= open->ranges[k] - (r - open->bases[k])) {
                    break;
                }
            }
            if (k == open->nallocs) {
                k = 0;
                pthread_rwlock_unlock(&ep->map_lock);
                return KVF_ERR_NOT_FOUND; /* needs the target's word */
            }
        }
        if (mptr[k] == NULL) {
            pthread_rwlock_unlock(&ep->map_lock);
            return KVF_ERR_NOT_FOUND;
        }
        l->excs[i] = KVF_OK;
        l->ptrs[i] = mptr[k] + (r - open->bases[k]);
    }
    l->nallocs = 0;
    l->begin_ms = open->begin_ms;
    l->valid_until_ms = open->valid_until_ms;
    l->state = KVF_SHM_L_GRANTED;
    return KVF_OK;
}

/* Maps window k of a granted lease, asking for its memfd (MAP), once
 * the memfd is proven to hold it for good (kvf_shm_memfd_check). */
static kvf_status_t kvf_shm_map_in(kvf_tl_ep_t *ep, kvf_shm_conn_t *c,
                                   const kvf_shm_lease_t *l, unsigned k)
{
    unsigned char meta[KVF_SHM_MAP_LEN];
    kvf_shm_alloc_t a;
    kvf_frame_hdr_t h;
    kvf_status_t st;
    kvf_wr_t w;
    void *p;
    int fd = -1;

    kvf_wr_init_fixed(&w, meta, sizeof(meta));
    kvf_shm_map_enc(&w, l->ids[k]);
    st = kvf_shm_post(ep, c, KVF_SHM_MAP, 0, meta, (uint32_t)w.len, 0, -1,
                      KVF_SHM_MAP_ACK, NULL);
    if (st == KVF_OK) {
        st = kvf_shm_pump(ep, c, KVF_SHM_MAP_ACK, &h, &fd);
    }
    if (st != KVF_OK) {
        return st;
    }
    if (h.status != KVF_OK) {
        st = (kvf_status_t)h.status;
    } else if (fd < 0 ||
               kvf_shm_map_ack_dec(c->reply.p, h.meta_len, &a) != KVF_OK ||
               a.id != l->ids[k] || a.base != l->bases[k] ||
               a.len != l->alens[k]) {
        st = KVF_ERR_PROTOCOL;
    }
    if (st == KVF_OK) {
        st = kvf_shm_memfd_check(fd, a.off, a.len); /* never SIGBUS */
    }
    if (st != KVF_OK) {
        if (fd >= 0) {
            close(fd);
        }
        return st;
    }
    p = mmap(NULL, l->alens[k], PROT_READ | PROT_WRITE, MAP_SHARED, fd,
             (off_t)a.off);
    close(fd);
    if (p == MAP_FAILED) {
        kvf_error("shm: cannot map %lu bytes of the target: %m",
                  (unsigned long)l->alens[k]);
        return KVF_ERR_NO_RESOURCE;
    }
    madvise(p, l->alens[k], MADV_HUGEPAGE); /* before any touch */
    return kvf_shm_map_add(ep, l->ids[k], l->bases[k], l->alens[k], p);
}

kvf_status_t kvf_shm_lease_prepare(kvf_tl_ep_t *ep, kvf_shm_conn_t *c,
                                   kvf_shm_lease_t *l)
{
    kvf_status_t mst[KVF_SHM_LEASE_ALLOCS];
    unsigned char *mptr[KVF_SHM_LEASE_ALLOCS];
    unsigned k = 0;
    size_t i;
    int have;

    for (k = 0; k < l->nallocs; k++) {
        pthread_rwlock_rdlock(&ep->map_lock);
        have = kvf_shm_map_ptr(ep, l->ids[k]) != NULL;
        pthread_rwlock_unlock(&ep->map_lock);
        mst[k] = have ? KVF_OK : kvf_shm_map_in(ep, c, l, k);
        if (mst[k] == KVF_ERR_CONN_RESET || mst[k] == KVF_ERR_TIMEOUT ||
            mst[k] == KVF_ERR_IO) {
            return mst[k];
        }
    }
    /* held until lease_copy is done with the pointers: no mapping goes
     * away under them (a dropped target, a SYNC) */
    pthread_rwlock_rdlock(&ep->map_lock);
    for (k = 0; k < l->nallocs; k++) {
        mptr[k] = (mst[k] == KVF_OK) ? kvf_shm_map_ptr(ep, l->ids[k]) : NULL;
        if (mst[k] == KVF_OK && mptr[k] == NULL) {
            mst[k] = KVF_ERR_INTERNAL;
        }
    }
    for (i = 0, k = 0; i < l->n; i++) {
        uint64_t r = l->remote[i], n = l->lens[i];

        if (l->excs[i] != KVF_OK) {
            continue;
        }
        if (l->nallocs == 0) {
            l->excs[i] = KVF_ERR_PROTOCOL;
            continue;
        }
        if (!(r >= l->bases[k] && r - l->bases[k] < l->alens[k] &&
              n <= l->alens[k] - (r - l->bases[k]))) {
            for (k = 0; k < l->nallocs; k++) {
                if (r >= l->bases[k] && r - l->bases[k] < l->alens[k] &&
                    n <= l->alens[k] - (r - l->bases[k])) {
                    break;
                }
            }
            if (k == l->nallocs) {
                k = 0;
                l->excs[i] = KVF_ERR_PROTOCOL; /* the target named no home */
                continue;
            }
        }
        if (mst[k] != KVF_OK) {
            l->excs[i] = mst[k];
            continue;
        }
        l->ptrs[i] = mptr[k] + (r - l->bases[k]);
    }
    return KVF_OK;
}

static kvf_status_t kvf_shm_stage_setup(kvf_tl_ep_t *ep, kvf_shm_conn_t *c)
{
    kvf_frame_hdr_t h;
    kvf_status_t st;
    void *p;
    int fd;

    fd = memfd_create("kvferry-stage", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0 || ftruncate(fd, KVF_SHM_STAGE_LEN) != 0 ||
        fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) !=
            0) {
        kvf_error("shm: staging buffer: %m");
        if (fd >= 0) {
            close(fd);
        }
        return KVF_ERR_NO_RESOURCE;
    }
    p = mmap(NULL, KVF_SHM_STAGE_LEN, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
             0);
    if (p == MAP_FAILED) {
        close(fd);
        return KVF_ERR_NO_RESOURCE;
    }
    st = kvf_shm_post(ep, c, KVF_SHM_STAGE_SETUP, 0, NULL, 0, 0, fd,
                      KVF_SHM_STAGE_SETUP_ACK, NULL);
    close(fd);
    if (st == KVF_OK) {
        st = kvf_shm_pump(ep, c, KVF_SHM_STAGE_SETUP_ACK, &h, NULL);
    }
    if (st == KVF_OK && h.status != KVF_OK) {
        kvf_error("shm: the target refused the staging buffer: %s",
                  kvf_status_str((kvf_status_t)h.status));
        st = KVF_ERR_NO_RESOURCE;
    }
    if (st != KVF_OK) {
        munmap(p, KVF_SHM_STAGE_LEN);
        return st;
    }
    c->stage = p;
    return KVF_OK;
}

/* A place in the staged entries: staged[i], done bytes into it. */
typedef struct kvf_shm_stage_pos {
    size_t i;
    uint64_t done;
} kvf_shm_stage_pos_t;

/* Packs (pieces of) staged entries from *pos into one STAGE: entries
 * into w, and for a WRITE their bytes into the staging buffer (the first
 * copy failure in *vst). Advances *pos; returns the bytes packed. */
static uint64_t kvf_shm_stage_pack(kvf_shm_conn_t *c, kvf_shm_lease_t *l,
                                   size_t ns, kvf_shm_stage_pos_t *pos,
                                   kvf_wr_t *w, uint32_t *count_p,
                                   kvf_status_t *vst)
{
    const uint32_t cap_entries = KVF_SHM_STAGE_LEN / 4096;
    uint64_t off = 0, piece;
    uint32_t count = 0;
    size_t e;

    while (pos->i < ns && off < KVF_SHM_STAGE_LEN && count < cap_entries) {
        e = l->staged[pos->i];
        piece = l->lens[e] - pos->done;
        if (piece > KVF_SHM_STAGE_LEN - off) {
            piece = KVF_SHM_STAGE_LEN - off;
        }
        kvf_shm_entry_enc(w, l->remote[e] + pos->done, piece);
        if (l->type == KVF_OP_WRITE && *vst == KVF_OK) {
            *vst = kvf_shm_copy(c->stage + off, (char *)l->local[e] + pos->done,
                                piece);
        }
        off += piece;
        pos->done += piece;
        count++;
        if (pos->done == l->lens[e]) {
            pos->i++;
            pos->done = 0;
        }
    }
    *count_p = count;
    return off;
}

/* READ: unpacks the off bytes of one STAGE from the staging buffer into
 * the same pieces, in the same order, from pos on. */
static kvf_status_t kvf_shm_stage_unpack(kvf_shm_conn_t *c, kvf_shm_lease_t *l,
                                         kvf_shm_stage_pos_t pos, uint64_t off)
{
    kvf_status_t vst = KVF_OK;
    uint64_t piece, o = 0;
    size_t e;

    while (vst == KVF_OK && o < off) {
        e = l->staged[pos.i];
        piece = l->lens[e] - pos.done;
        if (piece > off - o) {
            piece = off - o;
        }
        vst = kvf_shm_copy((char *)l->local[e] + pos.done, c->stage + o, piece);
        o += piece;
        pos.done += piece;
        if (pos.done == l->lens[e]) {
            pos.i++;
            pos.done = 0;
        }
    }
    return vst;
}

/* One STAGE exchange from *pos on; the verdict goes to every entry it
 * touched. Returns a connection error. */
static kvf_status_t kvf_shm_stage_one(kvf_tl_ep_t *ep, kvf_shm_conn_t *c,
                                      kvf_shm_lease_t *l, size_t ns,
                                      kvf_shm_stage_pos_t *pos)
{
    kvf_shm_stage_pos_t first = *pos;
    kvf_status_t st, vst = KVF_OK;
    kvf_frame_hdr_t h;
    uint32_t count;
    uint64_t off;
    kvf_wr_t w;
    size_t j;

    kvf_wr_init_fixed(&w, c->meta.p, c->meta.cap);
    off = kvf_shm_stage_pack(c, l, ns, pos, &w, &count, &vst);
    st = kvf_shm_post(ep, c, KVF_SHM_STAGE, (uint16_t)l->type, c->meta.p,
                      (uint32_t)w.len, count, -1, KVF_SHM_STAGE_ACK, NULL);
    if (st == KVF_OK) {
        st = kvf_shm_pump(ep, c, KVF_SHM_STAGE_ACK, &h, NULL);
    }
    if (st != KVF_OK) {
        return st;
    }
    if (vst == KVF_OK) {
        vst = (kvf_status_t)h.status;
    }
    if (vst == KVF_OK && l->type == KVF_OP_READ) {
        vst = kvf_shm_stage_unpack(c, l, first, off);
    }
    /* every entry touched by this exchange shares its verdict */
    for (j = first.i;
         j < pos->i || (j == pos->i && pos->i < ns && pos->done > 0); j++) {
        if (l->st[l->staged[j]] == KVF_OK || vst != KVF_OK) {
            l->st[l->staged[j]] = vst;
        }
    }
    return KVF_OK;
}

/* Moves the entries listed in l->staged[0..ns) through the staging
 * buffer, packing (pieces of) as many as it holds per STAGE. Returns a
 * connection error; the target's verdict per STAGE goes to st[]. */
static kvf_status_t kvf_shm_stage_move(kvf_tl_ep_t *ep, kvf_shm_conn_t *c,
                                       kvf_shm_lease_t *l, size_t ns)
{
    kvf_shm_stage_pos_t pos = {0, 0};
    kvf_status_t st;
    size_t e;

    if (c->stage == NULL) {
        st = kvf_shm_stage_setup(ep, c);
        if (st != KVF_OK) {
            for (e = 0; e < ns; e++) {
                l->st[l->staged[e]] = st;
            }
            return (st == KVF_ERR_NO_RESOURCE) ? KVF_OK : st;
        }
    }
    st = kvf_shm_buf_reserve(&c->meta,
                             (KVF_SHM_STAGE_LEN / 4096) * KVF_SHM_ENTRY_LEN);
    while (st == KVF_OK && pos.i < ns) {
        st = kvf_shm_stage_one(ep, c, l, ns, &pos);
    }
    return st;
}

/* Entries i and i + 1 copied together (kvf_shm_copy_stream2); 0 when
 * they do not qualify and neither was copied. */
static int kvf_shm_lease_pair(kvf_shm_lease_t *l, size_t i)
{
    int w = (l->type == KVF_OP_WRITE);
    void *d0 = w ? l->ptrs[i] : l->local[i];
    void *d1 = w ? l->ptrs[i + 1] : l->local[i + 1];
    const void *s0 = w ? l->local[i] : l->ptrs[i];
    const void *s1 = w ? l->local[i + 1] : l->ptrs[i + 1];

    if (!kvf_shm_copy_stream2(d0, s0, d1, s1, l->lens[i])) {
        return 0;
    }
    l->st[i] = KVF_OK;
    l->st[i + 1] = KVF_OK;
    return 1;
}

kvf_status_t kvf_shm_lease_copy(kvf_tl_ep_t *ep, kvf_shm_conn_t *c,
                                kvf_shm_lease_t *l, int stream)
{
    kvf_status_t (*copy)(void *, const void *, size_t);
    size_t i, ns = 0, pf;

    /*
     * WRITEs ask for the first KVF_SHM_PREFETCH_LEN bytes of the next
     * block before copying this one: its first lines are on the way
     * while this block streams, before the hardware prefetcher has seen
     * the new block. Reads (the source is the target's mapping) do not
     * gain, so they do not prefetch. The key shm_prefetch sets the bytes
     * (docs/decisions/shm-copy-path.md).
     */
    kvf_shm_copy_stamp(ep);
    pf = l->type == KVF_OP_WRITE ? kvf_shm_prefetch_len() : 0;
    copy = stream ? kvf_shm_copy_stream : kvf_shm_copy;
    for (i = 0; i < l->n; i++) {
        if (stream && i + 1 < l->n && l->excs[i] == KVF_OK &&
            l->excs[i + 1] == KVF_OK && l->lens[i] == l->lens[i + 1] &&
            kvf_shm_lease_pair(l, i)) {
            i++; /* both moved */
            continue;
        }
        if (pf > 0 && i + 1 < l->n && l->excs[i + 1] == KVF_OK) {
            kvf_shm_prefetch(l->local[i + 1],
                             l->lens[i + 1] < pf ? l->lens[i + 1] : pf);
        }
        if (l->excs[i] == KVF_OK) {
            l->st[i] = (l->type == KVF_OP_WRITE)
                           ? copy(l->ptrs[i], l->local[i], l->lens[i])
                           : copy(l->local[i], l->ptrs[i], l->lens[i]);
        } else if (l->excs[i] == KVF_INPROGRESS) {
            l->st[i] = KVF_OK;
            l->staged[ns++] = i;
        } else {
            l->st[i] = l->excs[i];
        }
    }
    if (stream) {
        kvf_shm_fence(); /* streaming stores done before the unlock */
    }
    kvf_shm_copy_stamp(ep);
    pthread_rwlock_unlock(&ep->map_lock);
    return ns > 0 ? kvf_shm_stage_move(ep, c, l, ns) : KVF_OK;
}

kvf_status_t kvf_shm_sync(kvf_tl_ep_t *ep, kvf_shm_conn_t *c)
{
    kvf_frame_hdr_t h;
    kvf_status_t st;
    uint64_t id, epoch;
    size_t i, j, n;
    int dropped;
    kvf_wr_t w;
    kvf_rd_t r;

    pthread_rwlock_rdlock(&ep->map_lock);
    n = ep->nmaps;
    st = kvf_shm_buf_reserve(&c->meta, n * KVF_SHM_ID_LEN + 1);
    kvf_wr_init_fixed(&w, c->meta.p, c->meta.cap);
    for (i = 0; st == KVF_OK && i < n; i++) {
        kvf_shm_id_enc(&w, ep->maps[i].id);
    }
    pthread_rwlock_unlock(&ep->map_lock);
    if (st == KVF_OK) {
        st = kvf_shm_post(ep, c, KVF_SHM_SYNC, 0, c->meta.p, (uint32_t)w.len,
                          (uint32_t)n, -1, KVF_SHM_SYNC_ACK, NULL);
    }
    if (st == KVF_OK) {
        st = kvf_shm_pump(ep, c, KVF_SHM_SYNC_ACK, &h, NULL);
    }
    if (st != KVF_OK) {
        return st;
    }
    if (h.status != KVF_OK ||
        kvf_shm_sync_ack_open(&r, &h, c->reply.p, &epoch) != KVF_OK) {
        return KVF_ERR_PROTOCOL;
    }
    pthread_rwlock_wrlock(&ep->map_lock);
    for (i = 0; i < h.count; i++) {
        id = kvf_shm_id_dec(&r);
        for (j = 0; j < ep->nmaps; j++) {
            if (ep->maps[j].id == id && !ep->maps[j].dead) {
                ep->maps[j].dead = 1;
                dropped = kvf_shm_map_drop(ep, j);
                kvf_debug("shm: target released allocation %lu, %s",
                          (unsigned long)id,
                          dropped ? "unmapped" : "kept for its views");
                break;
            }
        }
    }
    __atomic_store_n(&ep->epoch_seen, epoch, __ATOMIC_RELAXED);
    pthread_rwlock_unlock(&ep->map_lock);
    return KVF_OK;
}
