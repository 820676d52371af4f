/*
 * A storage node's inventory server (see inventory.h): one thread polls
 * the listening socket and gives each new connection a thread of its
 * own, which authenticates it first. Connections not yet authenticated
 * have a budget of their own (KVF_NI_PENDING at once, each at most
 * KVF_NI_AUTH_MS), so peers without the secret never hold up the accept
 * loop nor take the slots of authenticated ones (at most KVF_NI_CONNS: a
 * leader's inventory and tier channels, a deposed leader's). Each
 * authenticated connection applies INV_ADD / INV_DEL frames to
 * the inventory under its lock, answering one status per entry, and
 * TIER_OP frames to the node's disk tier (tier.h), so a batch of disk
 * I/O never holds up a commit's inventory entry.
 */
#include "store/node/inventory.h"
#include "store/node/tier.h"
#include "core/alloc.h"
#include "core/auth.h"
#include "core/log.h"
#include "core/sock.h"
#include "core/time.h"

#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#define KVF_NI_CONNS   8     /* a leader's two channels, a deposed one's, ... */
#define KVF_NI_PENDING 4     /* handshakes under way at once */
#define KVF_NI_AUTH_MS 2000u /* longest a handshake may take */
#define KVF_NI_SLOTS   (KVF_NI_CONNS + KVF_NI_PENDING)
#define KVF_NI_PAGE    256 /* entries per INV_REPORT page */
#define KVF_NI_POLL_MS 100 /* how soon a stop is seen */

typedef struct kvf_ni_conn {
    struct kvf_node_inv *ni;
    int fd;      /* -1: the slot is free */
    int running; /* its thread has not ended (atomic) */
    char peer[64];
    pthread_t thread;
    kvf_wire_mac_t mac; /* fd's frame tags */
    kvf_sp_frame_t f;
} kvf_ni_conn_t;

struct kvf_node_inv {
    kvf_inv_t inv;
    pthread_mutex_t lock;
    int lfd;
    kvf_ni_conn_t conns[KVF_NI_SLOTS];
    unsigned pending; /* connections in their handshake (atomic) */
    unsigned authed;  /* authenticated connections (atomic) */
    char host[KVF_HOST_MAX];
    char addr[KVF_SM_INV_ADDR_MAX];
    unsigned timeout_ms;
    int stop;
    pthread_t thread;
    kvf_tier_t *tier; /* the node's disk tier, or NULL */
};

static void *kvf_ni_conn_main(void *arg);

/* A free slot (its thread joined), or NULL. */
static kvf_ni_conn_t *kvf_ni_slot(kvf_node_inv_t *ni)
{
    kvf_ni_conn_t *c;
    unsigned i;

    for (i = 0; i < KVF_NI_SLOTS; i++) {
        c = &ni->conns[i];
        if (c->fd >= 0 && !__atomic_load_n(&c->running, __ATOMIC_ACQUIRE)) {
            pthread_join(c->thread, NULL);
            close(c->fd);
            c->fd = -1;
            kvf_wire_mac_free(&c->mac);
        }
        if (c->fd < 0) {
            return c;
        }
    }
    return NULL;
}

/* A new connection to a thread of its own, which authenticates it;
 * refused at once past the unauthenticated budget. */
static void kvf_ni_accept(kvf_node_inv_t *ni)
{
    int fd = accept4(ni->lfd, NULL, NULL, SOCK_CLOEXEC);
    kvf_ni_conn_t *c = NULL;
    char peer[64];
    int one = 1;

    if (fd < 0) {
        return;
    }
    /* answers go out at once: a leader sends ADDs and DELs back to back
     * and waits for both */
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    kvf_auth_peer_name(fd, peer, sizeof(peer));
    if (__atomic_load_n(&ni->pending, __ATOMIC_ACQUIRE) < KVF_NI_PENDING) {
        c = kvf_ni_slot(ni);
    }
    if (c != NULL) {
        c->ni = ni;
        c->fd = fd;
        memset(&c->mac, 0, sizeof(c->mac));
        snprintf(c->peer, sizeof(c->peer), "%s", peer);
        __atomic_add_fetch(&ni->pending, 1, __ATOMIC_ACQ_REL);
        __atomic_store_n(&c->running, 1, __ATOMIC_RELEASE);
        if (pthread_create(&c->thread, NULL, kvf_ni_conn_main, c) == 0) {
            return;
        }
        __atomic_store_n(&c->running, 0, __ATOMIC_RELEASE);
        __atomic_sub_fetch(&ni->pending, 1, __ATOMIC_ACQ_REL);
        c->fd = -1;
    }
    kvf_log_rl(KVF_LOG_WARN,
               "node inventory: %u handshakes under way already: "
               "refusing %s",
               KVF_NI_PENDING, peer);
    close(fd);
}

/* c's handshake, within KVF_NI_AUTH_MS; then it counts as one of the
 * KVF_NI_CONNS authenticated connections, if there is room. */
static int kvf_ni_authenticate(kvf_ni_conn_t *c)
{
    kvf_node_inv_t *ni = c->ni;
    unsigned ms =
        ni->timeout_ms < KVF_NI_AUTH_MS ? ni->timeout_ms : KVF_NI_AUTH_MS;
    kvf_status_t st;

    st = kvf_auth_server(c->fd, ni->host, "store", c->peer, kvf_time_ms() + ms,
                         &c->mac);
    __atomic_sub_fetch(&ni->pending, 1, __ATOMIC_ACQ_REL);
    if (st != KVF_OK) {
        return 0;
    }
    if (__atomic_add_fetch(&ni->authed, 1, __ATOMIC_ACQ_REL) > KVF_NI_CONNS) {
        __atomic_sub_fetch(&ni->authed, 1, __ATOMIC_ACQ_REL);
        kvf_log_rl(KVF_LOG_WARN,
                   "node inventory: %u leader connections already: "
                   "refusing %s",
                   KVF_NI_CONNS, c->peer);
        return 0;
    }
    return 1;
}

/* Applies one INV_ADD / INV_DEL entry; logs what it refuses. */
static kvf_status_t kvf_ni_apply(kvf_node_inv_t *ni, uint8_t type,
                                 const kvf_sm_inv_ent_t *e)
{
    kvf_status_t st;

    if (type == KVF_SP_INV_ADD && !(e->flags & KVF_SM_INV_FORGET)) {
        st = kvf_inv_put(&ni->inv, KVF_INV_RECORD, e->key, e->off, e->size,
                         e->checksum, e->epoch, e->seq, e->flags);
    } else {
        st = kvf_inv_del(&ni->inv, e->key, e->off, e->epoch);
    }
    if (st == KVF_ERR_STALE) {
        kvf_log_rl(KVF_LOG_WARN,
                   "node inventory: entry of epoch %lu older than %lu: "
                   "refused (a deposed leader)",
                   (unsigned long)(e->epoch & ~KVF_SM_HA_EPOCH),
                   (unsigned long)(ni->inv.max_epoch & ~KVF_SM_HA_EPOCH));
    } else if (st == KVF_ERR_INVALID_PARAM) {
        kvf_log_rl(KVF_LOG_WARN,
                   "node inventory: entry at %lu+%lu outside the pool of "
                   "%lu bytes: refused",
                   (unsigned long)e->off, (unsigned long)e->size,
                   (unsigned long)ni->inv.pool_len);
    }
    return st;
}

/* Applies a TIER_OP frame to the node's disk tier; the statuses in w. */
static kvf_status_t kvf_ni_tier(kvf_node_inv_t *ni, const kvf_sp_frame_t *f,
                                kvf_wr_t *w)
{
    kvf_sm_tier_op_t *ops;
    kvf_rd_t r;
    uint32_t i;

    if (ni->tier == NULL) {
        return KVF_ERR_UNSUPPORTED;
    }
    ops = kvf_calloc(f->hdr.count, sizeof(*ops));
    if (ops == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    kvf_rd_init(&r, f->body, f->hdr.meta_len);
    for (i = 0; i < f->hdr.count; i++) {
        kvf_sm_tier_op_dec(&r, &ops[i]);
    }
    kvf_tier_run(ni->tier, ops, f->hdr.count);
    for (i = 0; i < f->hdr.count; i++) {
        kvf_sm_status_enc(w, ops[i].status);
    }
    kvf_free(ops);
    return KVF_OK;
}

/* Applies an INV_ADD / INV_DEL frame; the statuses in w. */
static void kvf_ni_entries(kvf_node_inv_t *ni, const kvf_sp_frame_t *f,
                           kvf_wr_t *w)
{
    kvf_sm_inv_ent_t e;
    kvf_rd_t r;
    uint32_t i;

    kvf_rd_init(&r, f->body, f->hdr.meta_len);
    pthread_mutex_lock(&ni->lock);
    for (i = 0; i < f->hdr.count; i++) {
        kvf_sm_inv_ent_dec(&r, &e);
        kvf_sm_status_enc(w, kvf_ni_apply(ni, f->hdr.type, &e));
    }
    pthread_mutex_unlock(&ni->lock);
}

/* Serves one frame of connection c; -1 to close it, 1 when none came in
 * the poll period. */
static int kvf_ni_serve(kvf_ni_conn_t *c)
{
    kvf_node_inv_t *ni = c->ni;
    uint64_t now = kvf_time_ms(), deadline = now + ni->timeout_ms;
    kvf_sp_frame_t *f = &c->f;
    kvf_status_t st;
    kvf_wr_t w;

    st = kvf_sp_recv(c->fd, &c->mac, f, now + KVF_NI_POLL_MS, deadline);
    if (st == KVF_ERR_TIMEOUT && !f->partial) {
        return 1;
    }
    if (st != KVF_OK) {
        return -1;
    }
    st = f->hdr.type == KVF_SP_TIER_OP
             ? kvf_sm_tier_check(f->hdr.count, f->body, f->hdr.meta_len)
             : kvf_sm_inv_check(f->hdr.type, f->hdr.count, f->body,
                                f->hdr.meta_len);
    if (st == KVF_OK && f->hdr.type == KVF_SP_INV_REPORT) {
        st = KVF_ERR_PROTOCOL;
    }
    kvf_wr_init(&w);
    if (st == KVF_OK && f->hdr.type == KVF_SP_TIER_OP) {
        st = kvf_ni_tier(ni, f, &w);
    } else if (st == KVF_OK) {
        kvf_ni_entries(ni, f, &w);
    } else {
        kvf_log_rl(KVF_LOG_WARN, "node inventory: bad %s frame: closing",
                   kvf_sp_msg_name(f->hdr.type));
    }
    st = kvf_sp_send(c->fd, &c->mac, f->hdr.type | KVF_SP_REPLY, f->hdr.id, st,
                     st == KVF_OK ? f->hdr.count : 0, 0,
                     st == KVF_OK ? &w : NULL, kvf_time_ms() + ni->timeout_ms);
    kvf_wr_free(&w);
    return st == KVF_OK ? 0 : -1;
}

static void *kvf_ni_conn_main(void *arg)
{
    kvf_ni_conn_t *c = arg;

    if (kvf_ni_authenticate(c)) {
        while (!__atomic_load_n(&c->ni->stop, __ATOMIC_ACQUIRE) &&
               kvf_ni_serve(c) >= 0) {
        }
        __atomic_sub_fetch(&c->ni->authed, 1, __ATOMIC_ACQ_REL);
    }
    shutdown(c->fd, SHUT_RDWR); /* the peer sees the end now; the fd is
                                   closed when its slot is taken again */
    kvf_sp_frame_free(&c->f);
    __atomic_store_n(&c->running, 0, __ATOMIC_RELEASE);
    return NULL;
}

static void *kvf_ni_main(void *arg)
{
    kvf_node_inv_t *ni = arg;
    struct pollfd pfd;

    while (!__atomic_load_n(&ni->stop, __ATOMIC_ACQUIRE)) {
        pfd.fd = ni->lfd;
        pfd.events = POLLIN;
        if (poll(&pfd, 1, KVF_NI_POLL_MS) == 1 && (pfd.revents & POLLIN)) {
            kvf_ni_accept(ni);
        }
    }
    return NULL;
}

kvf_status_t kvf_node_inv_start(const char *host, const char *adv_host,
                                uint64_t pool_len, unsigned timeout_ms,
                                kvf_node_inv_t **inv_p)
{
    kvf_node_inv_t *ni = kvf_calloc(1, sizeof(*ni));
    kvf_status_t st;
    uint16_t port;
    unsigned i;

    if (ni == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    kvf_inv_init(&ni->inv, pool_len);
    pthread_mutex_init(&ni->lock, NULL);
    ni->timeout_ms = timeout_ms;
    snprintf(ni->host, sizeof(ni->host), "%s", host);
    for (i = 0; i < KVF_NI_SLOTS; i++) {
        ni->conns[i].fd = -1;
    }
    st = kvf_auth_check_bind(host);
    if (st == KVF_OK) {
        st = kvf_sock_listen(host, 0, 16, &ni->lfd, &port);
    }
    if (st != KVF_OK) {
        pthread_mutex_destroy(&ni->lock);
        kvf_free(ni);
        return st;
    }
    snprintf(ni->addr, sizeof(ni->addr), "%s:%u", adv_host, port);
    if (pthread_create(&ni->thread, NULL, kvf_ni_main, ni) != 0) {
        close(ni->lfd);
        pthread_mutex_destroy(&ni->lock);
        kvf_free(ni);
        return KVF_ERR_NO_RESOURCE;
    }
    *inv_p = ni;
    return KVF_OK;
}

void kvf_node_inv_stop(kvf_node_inv_t *ni)
{
    unsigned i;

    if (ni == NULL) {
        return;
    }
    __atomic_store_n(&ni->stop, 1, __ATOMIC_RELEASE);
    pthread_join(ni->thread, NULL);
    close(ni->lfd);
    for (i = 0; i < KVF_NI_SLOTS; i++) {
        if (ni->conns[i].fd >= 0) {
            pthread_join(ni->conns[i].thread, NULL);
            close(ni->conns[i].fd);
        }
        kvf_wire_mac_free(&ni->conns[i].mac);
    }
    kvf_inv_fini(&ni->inv);
    pthread_mutex_destroy(&ni->lock);
    kvf_free(ni);
}

void kvf_node_inv_set_tier(kvf_node_inv_t *ni, kvf_tier_t *tier)
{
    ni->tier = tier;
}

const char *kvf_node_inv_addr(const kvf_node_inv_t *ni)
{
    return ni->addr;
}

kvf_status_t kvf_node_inv_fence(kvf_node_inv_t *ni, uint64_t epoch)
{
    kvf_status_t st;

    pthread_mutex_lock(&ni->lock);
    st = kvf_inv_fence(&ni->inv, epoch);
    pthread_mutex_unlock(&ni->lock);
    return st;
}

size_t kvf_node_inv_count(kvf_node_inv_t *ni)
{
    size_t n;

    pthread_mutex_lock(&ni->lock);
    n = ni->inv.n;
    pthread_mutex_unlock(&ni->lock);
    return n;
}

/* Encodes the page of entries from offset *from on; returns its count
 * and moves *from past it. */
static uint32_t kvf_ni_page(kvf_node_inv_t *ni, kvf_wr_t *w, uint64_t *from)
{
    kvf_sm_inv_ent_t e;
    uint32_t n = 0;
    size_t i;

    pthread_mutex_lock(&ni->lock);
    for (i = kvf_inv_seek(&ni->inv, *from); i < ni->inv.n && n < KVF_NI_PAGE;
         i++, n++) {
        e.key = ni->inv.ent[i].key;
        e.off = ni->inv.ent[i].off;
        e.size = ni->inv.ent[i].size;
        e.checksum = ni->inv.ent[i].checksum;
        e.epoch = ni->inv.ent[i].epoch;
        e.seq = ni->inv.ent[i].seq;
        e.flags = ni->inv.ent[i].flags;
        kvf_sm_inv_ent_enc(w, &e);
        *from = e.off + 1;
    }
    pthread_mutex_unlock(&ni->lock);
    return n;
}

kvf_status_t kvf_node_inv_report(kvf_node_inv_t *ni, int inv_on, int fd,
                                 kvf_wire_mac_t *mac, uint64_t uid,
                                 uint64_t gen, uint64_t *next_id,
                                 kvf_sp_frame_t *f, unsigned timeout_ms)
{
    kvf_sm_inv_head_t head = {uid, gen};
    uint64_t from = 0;
    int disk = !inv_on;
    kvf_status_t st;
    uint32_t n;
    kvf_wr_t w;

    /* the pool's entries (with several masters), then the disk tier's,
     * then the empty page that ends the report */
    do {
        kvf_wr_init(&w);
        kvf_sm_inv_head_enc(&w, &head);
        n = disk ? 0 : kvf_ni_page(ni, &w, &from);
        if (n == 0 && !disk) {
            disk = 1;
            from = 0;
        }
        if (n == 0 && disk && ni->tier != NULL) {
            n = kvf_tier_page(ni->tier, &w, &from, KVF_NI_PAGE);
        }
        st = kvf_wr_status(&w);
        if (st == KVF_OK) {
            st = kvf_sp_call(fd, mac, KVF_SP_INV_REPORT, ++*next_id, n, &w, f,
                             kvf_time_ms() + timeout_ms);
        }
        kvf_wr_free(&w);
        if (st == KVF_OK) {
            st = (kvf_status_t)f->hdr.status;
        }
    } while (st == KVF_OK && n > 0);
    return st;
}
