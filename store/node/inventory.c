/*
 * A storage node's inventory server (see inventory.h): one thread polls
 * the listening socket and a few leader connections, authenticates each
 * new one, and applies INV_ADD / INV_DEL frames to the inventory under
 * its lock, answering one status per entry.
 */
#include "store/node/inventory.h"
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

#define KVF_NI_CONNS 4   /* leaders at a time: the new one, a deposed one */
#define KVF_NI_PAGE  256 /* entries per INV_REPORT page */

struct kvf_node_inv {
    kvf_inv_t inv;
    pthread_mutex_t lock;
    int lfd;
    int conns[KVF_NI_CONNS];
    kvf_wire_mac_t macs[KVF_NI_CONNS]; /* their frame tags */
    char host[KVF_HOST_MAX];
    char addr[KVF_SM_INV_ADDR_MAX];
    unsigned timeout_ms;
    int stop;
    pthread_t thread;
    kvf_sp_frame_t f;
};

static void kvf_ni_accept(kvf_node_inv_t *ni)
{
    char peer[64];
    int fd = accept4(ni->lfd, NULL, NULL, SOCK_CLOEXEC);
    kvf_wire_mac_t mac;
    unsigned i;
    int one = 1;

    if (fd < 0) {
        return;
    }
    /* answers go out at once: a leader sends ADDs and DELs back to back
     * and waits for both */
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    kvf_auth_peer_name(fd, peer, sizeof(peer));
    if (kvf_auth_server(fd, ni->host, "store", peer,
                        kvf_time_ms() + ni->timeout_ms, &mac) != KVF_OK) {
        close(fd);
        return;
    }
    for (i = 0; i < KVF_NI_CONNS; i++) {
        if (ni->conns[i] < 0) {
            ni->conns[i] = fd;
            ni->macs[i] = mac;
            return;
        }
    }
    kvf_log_rl(KVF_LOG_WARN,
               "node inventory: %u leader connections "
               "already: refusing %s",
               KVF_NI_CONNS, peer);
    kvf_wire_mac_free(&mac);
    close(fd);
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

/* Serves one frame of connection fd; -1 to close it. */
static int kvf_ni_serve(kvf_node_inv_t *ni, int fd, kvf_wire_mac_t *mac)
{
    uint64_t deadline = kvf_time_ms() + ni->timeout_ms;
    kvf_sm_inv_ent_t e;
    kvf_status_t st;
    kvf_wr_t w;
    kvf_rd_t r;
    uint32_t i;

    if (kvf_sp_recv(fd, mac, &ni->f, deadline, deadline) != KVF_OK) {
        return -1;
    }
    st = kvf_sm_inv_check(ni->f.hdr.type, ni->f.hdr.count, ni->f.body,
                          ni->f.hdr.meta_len);
    if (st == KVF_OK && ni->f.hdr.type == KVF_SP_INV_REPORT) {
        st = KVF_ERR_PROTOCOL;
    }
    kvf_wr_init(&w);
    if (st == KVF_OK) {
        kvf_rd_init(&r, ni->f.body, ni->f.hdr.meta_len);
        pthread_mutex_lock(&ni->lock);
        for (i = 0; i < ni->f.hdr.count; i++) {
            kvf_sm_inv_ent_dec(&r, &e);
            kvf_sm_status_enc(&w, kvf_ni_apply(ni, ni->f.hdr.type, &e));
        }
        pthread_mutex_unlock(&ni->lock);
    } else {
        kvf_log_rl(KVF_LOG_WARN, "node inventory: bad %s frame: closing",
                   kvf_sp_msg_name(ni->f.hdr.type));
    }
    st = kvf_sp_send(fd, mac, ni->f.hdr.type | KVF_SP_REPLY, ni->f.hdr.id, st,
                     st == KVF_OK ? ni->f.hdr.count : 0, 0,
                     st == KVF_OK ? &w : NULL, deadline);
    kvf_wr_free(&w);
    return st == KVF_OK ? 0 : -1;
}

static void *kvf_ni_main(void *arg)
{
    kvf_node_inv_t *ni = arg;
    struct pollfd pfd[KVF_NI_CONNS + 1];
    unsigned i;

    while (!__atomic_load_n(&ni->stop, __ATOMIC_ACQUIRE)) {
        pfd[0].fd = ni->lfd;
        pfd[0].events = POLLIN;
        for (i = 0; i < KVF_NI_CONNS; i++) {
            pfd[i + 1].fd = ni->conns[i];
            pfd[i + 1].events = POLLIN;
            pfd[i + 1].revents = 0;
        }
        if (poll(pfd, KVF_NI_CONNS + 1, 100) <= 0) {
            continue;
        }
        for (i = 0; i < KVF_NI_CONNS; i++) {
            if (ni->conns[i] >= 0 && pfd[i + 1].revents != 0 &&
                kvf_ni_serve(ni, ni->conns[i], &ni->macs[i]) != 0) {
                close(ni->conns[i]);
                ni->conns[i] = -1;
                kvf_wire_mac_free(&ni->macs[i]);
            }
        }
        if (pfd[0].revents & POLLIN) {
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
    for (i = 0; i < KVF_NI_CONNS; i++) {
        ni->conns[i] = -1;
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
    for (i = 0; i < KVF_NI_CONNS; i++) {
        kvf_wire_mac_free(&ni->macs[i]);
        if (ni->conns[i] >= 0) {
            close(ni->conns[i]);
        }
    }
    kvf_sp_frame_free(&ni->f);
    kvf_inv_fini(&ni->inv);
    pthread_mutex_destroy(&ni->lock);
    kvf_free(ni);
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

kvf_status_t kvf_node_inv_report(kvf_node_inv_t *ni, int fd,
                                 kvf_wire_mac_t *mac, uint64_t uid,
                                 uint64_t gen, uint64_t *next_id,
                                 kvf_sp_frame_t *f, unsigned timeout_ms)
{
    uint64_t from = 0;
    kvf_status_t st;
    uint32_t n;
    kvf_wr_t w;

    do {
        kvf_wr_init(&w);
        kvf_wr_u64(&w, uid);
        kvf_wr_u64(&w, gen);
        n = kvf_ni_page(ni, &w, &from);
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
