/*
 * Storage node: pool, engine target, registration and heartbeats.
 *
 * The pool (shareable memory from kvf_mem_alloc, or private anonymous
 * memory with huge pages; faulted in at start) is registered with the
 * node's engine. The master checks the claimed range against the
 * engine's descriptor, and the engine refuses any remote access outside
 * registered regions, so a node cannot make the master hand out space it
 * does not have.
 *
 * One thread keeps the node known to the master: it heartbeats every
 * heartbeat_ms on its own connection; a KVF_ERR_STALE reply (the master
 * restarted or dropped the node after its TTL) or a broken connection
 * leads to a new registration, retried every heartbeat interval while the
 * master is unreachable.
 *
 * With several masters (a list, etcd) the node also keeps an inventory
 * of its committed objects (inventory.h): the leader records each entry
 * there before it acknowledges the commit, and after each registration
 * with a leader the node reports it, so a new leader rebuilds the
 * objects this node holds.
 *
 * With a disk tier (tier.h, `--disk DIR`) the same server applies the
 * master's TIER_OP batches, and after every registration the node
 * reports the tier's entries, so a restarted master (or this node,
 * restarted on the same directory) gets its objects on disk back.
 */
#include "store/node/node.h"
#include "store/node/inventory.h"
#include "store/node/tier.h"
#include "store/proto/masters.h"
#include "store/proto/msg.h"
#include "core/auth.h"
#include "core/alloc.h"
#include "core/checksum.h"
#include "core/log.h"
#include "core/sock.h"
#include "core/time.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

struct kvf_node {
    kvf_node_opts_t opts;
    kvf_sp_masters_t masters;      /* where the master may be */
    char master[KVF_HOST_MAX + 8]; /* the one registered with (or tried) */
    uint64_t max_epoch; /* newest leader epoch seen (KVF_SM_HA_EPOCH) */
    kvf_engine_h engine;
    kvf_region_h region;
    kvf_node_inv_t *inv; /* NULL with a single master and no disk tier */
    kvf_tier_t *tier;    /* the disk tier, or NULL */
    void *pool;
    int shared; /* pool from kvf_mem_alloc */
    uint64_t uid;
    unsigned char instance[KVF_SM_INSTANCE_LEN]; /* random, this process */
    /* registration, owned by the node thread */
    int fd;
    kvf_wire_mac_t mac; /* fd's frame tags */
    uint64_t epoch;
    uint64_t gen;
    unsigned hb_ms;
    uint64_t next_id;
    unsigned registrations;
    kvf_sp_frame_t f;
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int stop;
};

static void kvf_node_disconnect(kvf_node_t *n)
{
    if (n->fd >= 0) {
        close(n->fd);
        n->fd = -1;
    }
    kvf_wire_mac_free(&n->mac);
}

static kvf_status_t kvf_node_register_at(kvf_node_t *n)
{
    uint64_t deadline = kvf_time_ms() + n->opts.timeout_ms;
    char host[KVF_HOST_MAX];
    kvf_sm_node_reg_rep_t rep;
    kvf_sm_node_reg_t q;
    kvf_status_t st;
    uint16_t port;
    kvf_wr_t w;
    kvf_rd_t r;

    kvf_node_disconnect(n);
    st = kvf_sock_parse_addr(n->master, host, sizeof(host), &port);
    if (st != KVF_OK) {
        return st;
    }
    st = kvf_auth_connect(host, port, (int)n->opts.timeout_ms, "store", &n->fd,
                          &n->mac);
    if (st != KVF_OK) {
        return st;
    }
    snprintf(q.segment, sizeof(q.segment), "%s",
             kvf_engine_segment_name(n->engine));
    q.uid = n->uid;
    q.pool_addr = (uint64_t)(uintptr_t)n->pool;
    q.pool_len = n->opts.claim ? n->opts.claim : n->opts.pool;
    memcpy(q.instance, n->instance, sizeof(q.instance));
    snprintf(q.inv_addr, sizeof(q.inv_addr), "%s",
             n->inv != NULL ? kvf_node_inv_addr(n->inv) : "");
    q.disk_len = n->tier != NULL ? kvf_tier_len(n->tier) : 0;
    kvf_wr_init(&w);
    kvf_sm_node_reg_enc(&w, &q);
    st = kvf_sp_call(n->fd, &n->mac, KVF_SP_NODE_REG, ++n->next_id, 0, &w,
                     &n->f, deadline);
    kvf_wr_free(&w);
    if (st == KVF_OK) {
        st = (kvf_status_t)n->f.hdr.status;
    }
    if (st != KVF_OK) {
        kvf_node_disconnect(n);
        return st;
    }
    kvf_rd_init(&r, n->f.body, n->f.hdr.meta_len);
    kvf_sm_node_reg_rep_dec(&r, &rep);
    if ((rep.master_epoch & KVF_SM_HA_EPOCH) &&
        rep.master_epoch < n->max_epoch) {
        /* fencing: a deposed leader never gets this node back */
        kvf_warn("node: master %s has epoch %lu, older than %lu: refused",
                 n->master,
                 (unsigned long)(rep.master_epoch & ~KVF_SM_HA_EPOCH),
                 (unsigned long)(n->max_epoch & ~KVF_SM_HA_EPOCH));
        kvf_node_disconnect(n);
        return KVF_ERR_STALE;
    }
    if ((rep.master_epoch & KVF_SM_HA_EPOCH) &&
        rep.master_epoch > n->max_epoch) {
        n->max_epoch = rep.master_epoch;
    }
    n->epoch = rep.master_epoch;
    n->gen = rep.node_gen;
    n->hb_ms = rep.heartbeat_ms;
    if (kvf_rd_status(&r) != KVF_OK || n->hb_ms == 0) {
        kvf_node_disconnect(n);
        return KVF_ERR_PROTOCOL;
    }
    if (n->inv != NULL && ((n->epoch & KVF_SM_HA_EPOCH) || n->tier)) {
        int ha = (n->epoch & KVF_SM_HA_EPOCH) != 0;

        st = ha ? kvf_node_inv_fence(n->inv, n->epoch) : KVF_OK;
        if (st == KVF_OK) {
            st = kvf_node_inv_report(n->inv, ha, n->fd, &n->mac, n->uid, n->gen,
                                     &n->next_id, &n->f, n->opts.timeout_ms);
        }
        if (st != KVF_OK) {
            kvf_warn("node %s: inventory report to master %s: %s",
                     kvf_engine_segment_name(n->engine), n->master,
                     kvf_status_str(st));
            kvf_node_disconnect(n);
            return st;
        }
    }
    n->registrations++;
    kvf_info("node %s registered with master %s: epoch %016lx, gen %lu",
             kvf_engine_segment_name(n->engine), n->master,
             (unsigned long)n->epoch, (unsigned long)n->gen);
    return KVF_OK;
}

/* Registers with the master: the one given, or, with a list or etcd,
 * the leader (each candidate once; a standby answers NOT_LEADER). */
static kvf_status_t kvf_node_register(kvf_node_t *n)
{
    unsigned tries = kvf_sp_masters_many(&n->masters) ? n->masters.n + 1 : 1;
    kvf_status_t st = KVF_ERR_NOT_LEADER;
    unsigned i;

    for (i = 0; i < tries; i++) {
        if (kvf_sp_masters_many(&n->masters) &&
            kvf_sp_masters_pick(&n->masters, n->opts.timeout_ms, n->master,
                                sizeof(n->master), NULL) != KVF_OK) {
            continue;
        }
        st = kvf_node_register_at(n);
        if (st == KVF_OK) {
            return st;
        }
    }
    return st;
}

static kvf_status_t kvf_node_heartbeat(kvf_node_t *n)
{
    kvf_sm_heartbeat_t q;
    kvf_status_t st;
    kvf_wr_t w;

    if (n->fd < 0) {
        return KVF_ERR_CONN_RESET;
    }
    q.uid = n->uid;
    q.node_gen = n->gen;
    q.master_epoch = n->epoch;
    kvf_wr_init(&w);
    kvf_sm_heartbeat_enc(&w, &q);
    st = kvf_sp_call(n->fd, &n->mac, KVF_SP_HEARTBEAT, ++n->next_id, 0, &w,
                     &n->f, kvf_time_ms() + n->opts.timeout_ms);
    kvf_wr_free(&w);
    if (st != KVF_OK) {
        kvf_node_disconnect(n);
        return st;
    }
    return (kvf_status_t)n->f.hdr.status;
}

static void *kvf_node_main(void *arg)
{
    kvf_node_t *n = arg;
    struct timespec ts;
    kvf_status_t st;
    int wait_ms;

    pthread_mutex_lock(&n->lock);
    while (!n->stop) {
        wait_ms = (int)n->hb_ms;
        pthread_mutex_unlock(&n->lock);
        st = kvf_node_heartbeat(n);
        if (st != KVF_OK) {
            kvf_warn("node %s: heartbeat: %s; registering again",
                     kvf_engine_segment_name(n->engine), kvf_status_str(st));
            st = kvf_node_register(n);
            if (st != KVF_OK) {
                kvf_log_rl(KVF_LOG_WARN, "node %s: master %s: %s",
                           kvf_engine_segment_name(n->engine), n->master,
                           kvf_status_str(st));
            }
        }
        pthread_mutex_lock(&n->lock);
        if (n->stop) {
            break;
        }
        kvf_time_abs_after(&ts, wait_ms);
        pthread_cond_timedwait(&n->cond, &n->lock, &ts);
    }
    pthread_mutex_unlock(&n->lock);
    return NULL;
}

/* Maps the pool. By default it comes from kvf_mem_alloc(): memfd-backed
 * shareable memory, so a client on the same host reaches it through the
 * shm transport without copies by the node (and tcp serves it as well as
 * private memory); --anon takes private anonymous memory with huge pages
 * instead. Unless lazy, every page is faulted in now, so the first write
 * of each byte does not pay a page fault and the node's memory is
 * committed at start. */
static void *kvf_node_map_pool(kvf_node_t *n)
{
    uint64_t len = n->opts.pool;
    kvf_status_t st;
    void *p;

    if (!n->opts.anon) {
        st = kvf_mem_alloc(len, KVF_MEM_HOST, 0, &p);
        if (st != KVF_OK) {
            kvf_error("node cannot allocate a pool of %lu bytes: %s",
                      (unsigned long)len, kvf_status_str(st));
            return NULL;
        }
        n->shared = 1;
    } else {
        p = mmap(NULL, len, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED) {
            kvf_error("node cannot map a pool of %lu bytes: %m",
                      (unsigned long)len);
            return NULL;
        }
        madvise(p, len, MADV_HUGEPAGE);
    }
    if (!n->opts.lazy) {
        madvise(p, len, MADV_POPULATE_WRITE);
    }
    return p;
}

static void kvf_node_unmap_pool(kvf_node_t *n)
{
    if (n->shared) {
        kvf_mem_free(n->pool);
    } else {
        munmap(n->pool, n->opts.pool);
    }
}

/* The inventory server, on the host the engine listens on, named by the
 * host of the engine's segment (how masters reach this node). */
static kvf_status_t kvf_node_inv_listen(kvf_node_t *n)
{
    const char *listen = n->opts.listen ? n->opts.listen : "127.0.0.1:0";
    char host[KVF_HOST_MAX], adv[KVF_HOST_MAX];
    uint16_t port;
    kvf_status_t st;

    st = kvf_sock_parse_addr(listen, host, sizeof(host), &port);
    if (st == KVF_OK) {
        st = kvf_sock_parse_addr(kvf_engine_segment_name(n->engine), adv,
                                 sizeof(adv), &port);
    }
    if (st != KVF_OK) {
        return st;
    }
    st = kvf_node_inv_start(host, adv,
                            n->opts.claim ? n->opts.claim : n->opts.pool,
                            n->opts.timeout_ms, &n->inv);
    if (st != KVF_OK) {
        kvf_error("node: inventory server on %s: %s", host, kvf_status_str(st));
    }
    return st;
}

/* The disk tier (--disk) and the inventory server (several masters, or
 * a tier: it also serves the tier's operations). */
static kvf_status_t kvf_node_servers(kvf_node_t *n)
{
    const kvf_node_opts_t *o = &n->opts;
    kvf_status_t st;

    if (o->disk != NULL && o->disk[0] != '\0') {
        st = kvf_tier_open(o->disk, o->disk_size, n->pool, o->pool, 1,
                           &n->tier);
        if (st != KVF_OK) {
            return st;
        }
    }
    if (kvf_sp_masters_many(&n->masters) || n->tier != NULL) {
        st = kvf_node_inv_listen(n);
        if (st != KVF_OK) {
            return st;
        }
        kvf_node_inv_set_tier(n->inv, n->tier);
    }
    return KVF_OK;
}

kvf_status_t kvf_node_start(const kvf_node_opts_t *opts, kvf_node_t **node_p)
{
    uint64_t t_start = kvf_time_ms();
    kvf_engine_params_t ep = {0};
    kvf_status_t st;
    kvf_node_t *n;

    if (opts->master == NULL || opts->pool < 4096 || opts->timeout_ms == 0) {
        return KVF_ERR_INVALID_PARAM;
    }
    n = kvf_calloc(1, sizeof(*n));
    if (n == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    n->opts = *opts;
    n->fd = -1;
    st = kvf_sp_masters_init(&n->masters, opts->master);
    if (st != KVF_OK) {
        kvf_free(n);
        return st;
    }
    snprintf(n->master, sizeof(n->master), "%s", n->masters.addr[0]);
    n->uid = kvf_hash64(&n, sizeof(n), kvf_time_ns() ^ (uint64_t)getpid());
    st = kvf_auth_random(n->instance, sizeof(n->instance));
    if (st != KVF_OK) {
        kvf_free(n);
        return st;
    }
    pthread_mutex_init(&n->lock, NULL);
    kvf_cond_init(&n->cond);
    n->pool = kvf_node_map_pool(n);
    if (n->pool == NULL) {
        st = KVF_ERR_NO_MEMORY;
        goto err_free;
    }
    ep.field_mask = KVF_ENGINE_PARAM_LISTEN | KVF_ENGINE_PARAM_TIMEOUT;
    ep.listen = opts->listen ? opts->listen : "127.0.0.1:0";
    ep.timeout_ms = opts->timeout_ms;
    if (opts->transports != NULL) {
        ep.field_mask |= KVF_ENGINE_PARAM_TRANSPORTS;
        ep.transports = opts->transports;
    }
    st = kvf_engine_create(&ep, &n->engine);
    if (st != KVF_OK) {
        goto err_unmap;
    }
    st = kvf_engine_reg(n->engine, n->pool, opts->pool, KVF_MEM_HOST, 0,
                        &n->region);
    if (st != KVF_OK) {
        goto err_engine;
    }
    st = kvf_node_servers(n);
    if (st != KVF_OK) {
        goto err_dereg;
    }
    st = kvf_node_register(n);
    /* with several masters (a list, etcd) a leader may be in the making:
     * keep trying for 10 s (or the timeout, when longer) */
    while (st != KVF_OK && kvf_sp_masters_many(&n->masters) &&
           kvf_time_ms() <
               t_start +
                   (opts->timeout_ms > 10000 ? opts->timeout_ms : 10000)) {
        usleep(100 * 1000); /* the masters may be electing their leader */
        st = kvf_node_register(n);
    }
    if (st != KVF_OK) {
        kvf_error("node %s: registration with master %s failed: %s",
                  kvf_engine_segment_name(n->engine), n->master,
                  kvf_status_str(st));
        goto err_dereg;
    }
    if (pthread_create(&n->thread, NULL, kvf_node_main, n) != 0) {
        st = KVF_ERR_NO_RESOURCE;
        goto err_dereg;
    }
    *node_p = n;
    return KVF_OK;

err_dereg:
    kvf_node_disconnect(n);
    kvf_node_inv_stop(n->inv);
    kvf_tier_close(n->tier);
    kvf_engine_dereg(n->engine, n->region);
err_engine:
    kvf_engine_destroy(n->engine);
err_unmap:
    kvf_node_unmap_pool(n);
err_free:
    kvf_sp_frame_free(&n->f);
    pthread_cond_destroy(&n->cond);
    pthread_mutex_destroy(&n->lock);
    kvf_free(n);
    return st;
}

void kvf_node_stop(kvf_node_t *n)
{
    if (n == NULL) {
        return;
    }
    pthread_mutex_lock(&n->lock);
    n->stop = 1;
    pthread_cond_broadcast(&n->cond);
    pthread_mutex_unlock(&n->lock);
    pthread_join(n->thread, NULL);
    kvf_node_disconnect(n);
    kvf_node_inv_stop(n->inv); /* no tier operation runs after this */
    kvf_tier_close(n->tier);
    kvf_engine_dereg(n->engine, n->region);
    kvf_engine_destroy(n->engine);
    kvf_node_unmap_pool(n);
    kvf_sp_frame_free(&n->f);
    pthread_cond_destroy(&n->cond);
    pthread_mutex_destroy(&n->lock);
    kvf_free(n);
}

const char *kvf_node_segment(const kvf_node_t *n)
{
    return kvf_engine_segment_name(n->engine);
}

void *kvf_node_pool(const kvf_node_t *n)
{
    return n->pool;
}

kvf_tier_t *kvf_node_tier(const kvf_node_t *n)
{
    return n->tier;
}

size_t kvf_node_inventory(const kvf_node_t *n)
{
    return n->inv != NULL ? kvf_node_inv_count(n->inv) : 0;
}

unsigned kvf_node_registrations(const kvf_node_t *n)
{
    return __atomic_load_n(&n->registrations, __ATOMIC_RELAXED);
}
