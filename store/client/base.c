/*
 * Store client base: the layer every operation and strategy stands on,
 * calling nothing above it. A pool of master connections (a call takes
 * an idle one or opens a new one, so concurrent calls on one handle
 * never wait for each other), the round trip with a single retry on a
 * fresh connection when a pooled one turns out dead (e.g. the master
 * restarted), leader following (leader.c) within each call's deadline,
 * the GET round trip, and the cache of opened peers with reference
 * counts so a peer that fails is closed only when its last user lets go.
 * handle.c opens the base first and closes it last.
 *
 * A master on a loopback address is reached over its abstract unix
 * socket (same framed protocol, no TCP stack on either side of every
 * round trip) when master_unix is on and the engine may use a same-host
 * transport; any failure there falls back to tcp (leader.c picks). An
 * engine forced onto tcp keeps the master on tcp too, so "tcp forced"
 * stays tcp end to end.
 *
 * The engine a handle creates is shaped for many threads sharing it
 * (node_conns connections per node, so callers of small gets each find an
 * idle one) and, on a host with cores to spare, for large objects
 * (node_chunk: a 1 MiB read or write is cut into requests moved on
 * several connections at once; on a host of few cores that only adds
 * work, so auto keeps whole objects there).
 */
#include "store/client/client_int.h"
#include "core/auth.h"
#include "core/alloc.h"
#include "core/log.h"
#include "core/time.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

__thread kvf_store_timing_t kvf__stl_timing;

/* Milliseconds left until deadline_ms (at least 1). */
static int kvf_sconn_left(uint64_t deadline_ms)
{
    uint64_t now = kvf_time_ms();

    return now + 1 < deadline_ms ? (int)(deadline_ms - now) : 1;
}

/* A new connection to the master, made by deadline_ms. */
static kvf_status_t kvf_sconn_open_by(kvf_store_h st, kvf_sconn_t **c_p,
                                      uint64_t deadline_ms)
{
    char host[KVF_HOST_MAX], uname[96];
    kvf_status_t status;
    kvf_sconn_t *c;
    uint16_t port;

    c = kvf_calloc(1, sizeof(*c));
    if (c == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    pthread_mutex_lock(&st->lock); /* the address moves with the leader */
    memcpy(host, st->host, sizeof(host));
    memcpy(uname, st->unix_name, sizeof(uname));
    port = st->port;
    c->gen = st->master_gen;
    pthread_mutex_unlock(&st->lock);
    if (uname[0] != '\0' && kvf_sp_unix_connect(uname, &c->fd) == KVF_OK) {
        status = kvf_auth_client(c->fd, host, "store", "master (local)",
                                 deadline_ms, &c->mac);
        if (status == KVF_OK) {
            c->is_unix = 1;
            __atomic_store_n(&st->last_unix, 1, __ATOMIC_RELAXED);
            *c_p = c;
            return KVF_OK;
        }
        close(c->fd);
        if (status == KVF_ERR_AUTH) {
            kvf_free(c);
            return status;
        }
    }
    status = kvf_auth_connect(host, port, kvf_sconn_left(deadline_ms), "store",
                              &c->fd, &c->mac);
    if (status != KVF_OK) {
        kvf_free(c);
        return status;
    }
    __atomic_store_n(&st->last_unix, 0, __ATOMIC_RELAXED);
    *c_p = c;
    return KVF_OK;
}

static kvf_status_t kvf_sconn_open(kvf_store_h st, kvf_sconn_t **c_p)
{
    return kvf_sconn_open_by(st, c_p, kvf_time_ms() + st->timeout_ms);
}

/* Whether an idle connection is still clean: nothing to read, no
 * hang-up (a master that went away, e.g. restarted, closed it). */
static int kvf_sconn_clean(kvf_sconn_t *c)
{
    struct pollfd pfd = {.fd = c->fd, .events = POLLIN | POLLRDHUP};

    return poll(&pfd, 1, 0) == 0;
}

/* Hands a reservation back to the master at once (best effort: the
 * master reclaims it at its deadline anyway). */
static void kvf_sconn_drop_resv(kvf_sconn_t *c, unsigned timeout_ms)
{
    kvf_sm_req_t q = {0};
    kvf_wr_t w;

    if (c->resv.r.put_id == 0 || !kvf_sconn_clean(c)) {
        c->resv.r.put_id = 0;
        return;
    }
    q.key = "-";
    q.put_id = c->resv.r.put_id;
    q.size = c->resv.r.size;
    q.mask = 0; /* abort */
    kvf_wr_init(&w);
    kvf_sm_commit_enc(&w, &q);
    /* bounded short: a master that froze must not hold up a disconnect */
    (void)kvf_sp_call(c->fd, &c->mac, KVF_SP_COMMIT, ++c->next_id, 1, &w, &c->f,
                      kvf_time_ms() + (timeout_ms < 200 ? timeout_ms : 200));
    kvf_wr_free(&w);
    c->resv.r.put_id = 0;
}

static void kvf_sconn_close(kvf_sconn_t *c)
{
    close(c->fd);
    kvf_wire_mac_free(&c->mac);
    kvf_sp_frame_free(&c->f);
    kvf_free(c);
}

/* A round trip on c ended with status: a transport failure closes c
 * (*closed_p = 1), else the reply's whole-frame status is the result; a
 * master gone or not the leader makes the next call look for the
 * leader, within its own time. */
static kvf_status_t kvf_sconn_ended(kvf_store_h st, kvf_sconn_t *c,
                                    kvf_status_t status, int *closed_p)
{
    *closed_p = (status != KVF_OK);
    if (status != KVF_OK) {
        kvf_sconn_close(c);
    } else {
        status = (kvf_status_t)c->f.hdr.status;
    }
    if (kvf__sfollow_worth(st, status)) {
        __atomic_store_n(&st->follow_due, 1, __ATOMIC_RELEASE);
    }
    return status;
}

void kvf__srelease(kvf_store_h st, kvf_sconn_t *c)
{
    pthread_mutex_lock(&st->lock);
    if (c->gen != st->master_gen) {
        /* to a master this handle left: not pooled */
        pthread_mutex_unlock(&st->lock);
        kvf_sconn_close(c);
        return;
    }
    c->next = st->idle;
    st->idle = c;
    pthread_mutex_unlock(&st->lock);
}

kvf_status_t kvf__srpc_on(kvf_store_h st, kvf_sconn_t *c, uint8_t type,
                          uint32_t count, const kvf_wr_t *w, int *closed_p)
{
    kvf_status_t status;

    status = kvf_sp_call(c->fd, &c->mac, type, ++c->next_id, count, w, &c->f,
                         kvf_time_ms() + st->timeout_ms);
    if (status != KVF_OK) {
        kvf_log_rl(KVF_LOG_ERROR, "store %s request to %s:%u failed: %s",
                   kvf_sp_msg_name(type), st->host, st->port,
                   kvf_status_str(status));
    }
    return kvf_sconn_ended(st, c, status, closed_p);
}

kvf_sconn_t *kvf__stake_resv(kvf_store_h st, uint64_t size, unsigned replicas)
{
    kvf_sconn_t **pp, *c = NULL;
    uint64_t now = kvf_time_ms();

    pthread_mutex_lock(&st->lock);
    for (pp = &st->idle; *pp != NULL; pp = &(*pp)->next) {
        kvf_sresv_t *r = &(*pp)->resv;

        if (r->r.put_id != 0 && r->r.size == size && r->replicas == replicas) {
            c = *pp;
            *pp = c->next;
            c->next = NULL;
            break;
        }
    }
    pthread_mutex_unlock(&st->lock);
    if (c == NULL) {
        return NULL;
    }
    if (!kvf_sconn_clean(c)) {
        kvf_sconn_close(c); /* its reservation died with the master's end */
        return NULL;
    }
    if (now >= c->resv.until_ms ||
        c->resv.peer_epoch !=
            __atomic_load_n(&st->peer_epoch, __ATOMIC_ACQUIRE)) {
        kvf_sconn_drop_resv(c, st->timeout_ms);
        kvf__srelease(st, c);
        return NULL;
    }
    return c;
}

kvf_sconn_t *kvf__stake_plain(kvf_store_h st, int *may_reserve_p)
{
    kvf_sconn_t **pp, **pick, *c;
    uint64_t now;

    for (;;) {
        now = kvf_time_ms();
        pthread_mutex_lock(&st->lock);
        /* one without a reservation, else one whose reservation is too
         * old to use, else any: connections stay as many as concurrent
         * calls, never one per reservation */
        pick = NULL;
        for (pp = &st->idle; *pp != NULL; pp = &(*pp)->next) {
            if ((*pp)->resv.r.put_id == 0) {
                pick = pp;
                break;
            }
            if (now >= (*pp)->resv.until_ms && pick == NULL) {
                pick = pp;
            }
        }
        if (pick == NULL && st->idle != NULL) {
            pick = &st->idle;
        }
        c = (pick != NULL) ? *pick : NULL;
        if (c != NULL) {
            *pick = c->next;
            c->next = NULL;
        }
        pthread_mutex_unlock(&st->lock);
        if (c == NULL) {
            *may_reserve_p = 1;
            return kvf_sconn_open(st, &c) == KVF_OK ? c : NULL;
        }
        if (!kvf_sconn_clean(c)) {
            kvf_sconn_close(c); /* the master closed it: try the next */
            continue;
        }
        if (c->resv.r.put_id != 0 && now >= c->resv.until_ms) {
            kvf_sconn_drop_resv(c, st->timeout_ms);
        }
        *may_reserve_p = (c->resv.r.put_id == 0);
        return c;
    }
}

/* An idle connection of the pool, else a new one (*fresh_p = 1) made by
 * deadline_ms. */
static kvf_status_t kvf_sconn_take(kvf_store_h st, kvf_sconn_t **c_p,
                                   int *fresh_p, uint64_t deadline_ms)
{
    kvf_sconn_t *c;

    pthread_mutex_lock(&st->lock);
    c = st->idle;
    if (c != NULL) {
        st->idle = c->next;
    }
    pthread_mutex_unlock(&st->lock);
    *fresh_p = (c == NULL);
    if (c == NULL) {
        return kvf_sconn_open_by(st, c_p, deadline_ms);
    }
    *c_p = c;
    return KVF_OK;
}

/* Sends a request on a pooled (or new) connection and, when wait, reads
 * its reply, both by deadline_ms. A pooled connection that fails (it may
 * have died with an earlier master) is closed and the request tried once
 * more on another; a fresh one that fails, or a timeout, ends it. */
static kvf_status_t kvf_store_rpc_once(kvf_store_h st, uint8_t type,
                                       uint32_t count, const kvf_wr_t *w,
                                       int wait, kvf_sconn_t **conn_p,
                                       uint64_t deadline_ms)
{
    kvf_status_t status;
    kvf_sconn_t *c;
    int fresh, attempt;

    for (attempt = 0; attempt < 2; attempt++) {
        status = kvf_sconn_take(st, &c, &fresh, deadline_ms);
        if (status != KVF_OK) {
            if (wait) {
                kvf_log_rl(KVF_LOG_ERROR, "store master %s:%u unreachable: %s",
                           st->host, st->port, kvf_status_str(status));
            }
            return status;
        }
        status = wait ? kvf_sp_call(c->fd, &c->mac, type, ++c->next_id, count,
                                    w, &c->f, deadline_ms)
                      : kvf_sp_send(c->fd, &c->mac, type, ++c->next_id, KVF_OK,
                                    count, 0, w, deadline_ms);
        if (status == KVF_OK) {
            if (wait && c->f.hdr.status != KVF_OK) {
                status = (kvf_status_t)c->f.hdr.status;
                kvf__srelease(st, c);
                return status;
            }
            *conn_p = c;
            return KVF_OK;
        }
        kvf_sconn_close(c);
        if (fresh || status == KVF_ERR_TIMEOUT) {
            break;
        }
    }
    if (wait) {
        kvf_log_rl(KVF_LOG_ERROR, "store %s request to %s:%u failed: %s",
                   kvf_sp_msg_name(type), st->host, st->port,
                   kvf_status_str(status));
    }
    return status;
}

/* Sends a request on a pooled (or new) connection and, when wait, reads
 * its reply. A pooled connection that fails (it may have died with an
 * earlier master) is closed and the request tried once more on another;
 * a fresh one that fails, or a timeout, ends it. With several masters
 * (a list, etcd), a master that is gone or not the leader makes the
 * handle switch to the leader found next; a read is sent there again
 * while the call's time lasts. Every attempt and every look-up of the
 * leader ends by the call's deadline, so a leader change (or a slow
 * etcd) never makes the call wait longer than its timeout. */
static kvf_status_t kvf_store_rpc_go(kvf_store_h st, uint8_t type,
                                     uint32_t count, const kvf_wr_t *w,
                                     int wait, kvf_sconn_t **conn_p)
{
    uint64_t deadline = kvf_time_ms() + st->timeout_ms;
    /* reads are sent again to the new leader; a write fails cleanly
     * (the next call goes to the new leader): a put is never finished by
     * a master other than the one that started it */
    int read = (type == KVF_SP_GET || type == KVF_SP_EXISTS ||
                type == KVF_SP_LIST || type == KVF_SP_NODES);
    kvf_status_t status;

    if (__atomic_exchange_n(&st->follow_due, 0, __ATOMIC_ACQ_REL)) {
        (void)kvf__sfollow_by(st, "an earlier call found it gone", deadline);
    }
    for (;;) {
        status = kvf_store_rpc_once(st, type, count, w, wait, conn_p, deadline);
        if (!kvf__sfollow_worth(st, status)) {
            return status;
        }
        if (kvf_time_ms() >= deadline) {
            __atomic_store_n(&st->follow_due, 1, __ATOMIC_RELEASE);
            return status;
        }
        if (kvf__sfollow_by(st, kvf_status_str(status), deadline) != KVF_OK ||
            !read || kvf_time_ms() >= deadline) {
            return status;
        }
    }
}

kvf_status_t kvf__srpc(kvf_store_h st, uint8_t type, uint32_t count,
                       const kvf_wr_t *w, kvf_sconn_t **conn_p)
{
    return kvf_store_rpc_go(st, type, count, w, 1, conn_p);
}

kvf_status_t kvf__srpc_send(kvf_store_h st, uint8_t type, uint32_t count,
                            const kvf_wr_t *w, kvf_sconn_t **conn_p)
{
    return kvf_store_rpc_go(st, type, count, w, 0, conn_p);
}

kvf_status_t kvf__srpc_recv(kvf_store_h st, kvf_sconn_t *c, uint8_t type,
                            int *closed_p)
{
    kvf_status_t status;

    status = kvf_sp_call_end(c->fd, &c->mac, type, c->next_id, &c->f,
                             kvf_time_ms() + st->timeout_ms);
    return kvf_sconn_ended(st, c, status, closed_p);
}

/* Learns this client's host address from its tcp connection fd to the
 * master (gets prefer replicas on that host). */
static void kvf_sbase_learn_host(kvf_store_h st, int fd)
{
    struct sockaddr_storage sa;
    socklen_t len = sizeof(sa);
    const void *a = NULL;

    if (getsockname(fd, (struct sockaddr *)&sa, &len) != 0) {
        return;
    }
    if (sa.ss_family == AF_INET) {
        a = &((struct sockaddr_in *)&sa)->sin_addr;
    } else if (sa.ss_family == AF_INET6) {
        a = &((struct sockaddr_in6 *)&sa)->sin6_addr;
    }
    if (a == NULL || inet_ntop(sa.ss_family, a, st->self_host,
                               sizeof(st->self_host)) == NULL) {
        st->self_host[0] = '\0';
    }
}

kvf_status_t kvf__slookup(kvf_store_h st, size_t count, const char *const *keys,
                          kvf_sreps_t *e)
{
    kvf_status_t status;
    size_t i, nsent = 0;
    kvf_sconn_t *c;
    kvf_wr_t w;
    kvf_rd_t r;

    kvf_wr_init(&w);
    for (i = 0; i < count; i++) {
        e[i].status = kvf_sp_key_check(keys[i]);
        if (e[i].status == KVF_OK) {
            kvf_sm_key_enc(&w, keys[i]);
            nsent++;
        }
    }
    status = (nsent > 0) ? kvf__srpc(st, KVF_SP_GET, (uint32_t)nsent, &w, &c)
                         : KVF_OK;
    kvf_wr_free(&w);
    if (nsent == 0 || status != KVF_OK) {
        return status;
    }
    kvf_rd_init(&r, c->f.body, c->f.hdr.meta_len);
    for (i = 0; i < count && c->f.hdr.count == nsent; i++) {
        if (e[i].status == KVF_OK) {
            kvf_sm_get_rep_dec(&r, &e[i]);
        }
    }
    status = kvf_sm_rep_end(&r, c->f.hdr.count, (uint32_t)nsent);
    kvf__srelease(st, c);
    return status;
}

int kvf__speer_error(kvf_status_t s)
{
    return s == KVF_ERR_CONNECT || s == KVF_ERR_CONN_RESET ||
           s == KVF_ERR_PEER_UNREACHABLE || s == KVF_ERR_PEER_CLOSED ||
           s == KVF_ERR_NO_TRANSPORT || s == KVF_ERR_OUT_OF_BOUNDS ||
           s == KVF_ERR_TIMEOUT || s == KVF_ERR_PROTOCOL;
}

kvf_status_t kvf__speer_ref(kvf_store_h st, const char *segment,
                            kvf_speer_t **sp_p)
{
    kvf_status_t status;
    kvf_speer_t *sp;

    pthread_mutex_lock(&st->peers_lock);
    for (sp = st->peers; sp != NULL; sp = sp->next) {
        if (strcmp(sp->name, segment) == 0) {
            sp->refs++;
            pthread_mutex_unlock(&st->peers_lock);
            *sp_p = sp;
            return KVF_OK;
        }
    }
    sp = kvf_calloc(1, sizeof(*sp));
    if (sp == NULL) {
        pthread_mutex_unlock(&st->peers_lock);
        return KVF_ERR_NO_MEMORY;
    }
    /* opened under the lock: concurrent users of a new node wait for one
     * open (bounded by the engine's timeout) rather than open several */
    status = kvf_peer_open(st->engine, segment, &sp->peer);
    if (status != KVF_OK) {
        pthread_mutex_unlock(&st->peers_lock);
        kvf_free(sp);
        kvf_log_rl(KVF_LOG_WARN, "store node %s unreachable: %s",
                   KVF_LOG_KEY(segment), kvf_status_str(status));
        return status;
    }
    snprintf(sp->name, sizeof(sp->name), "%s", segment);
    sp->refs = 1;
    sp->next = st->peers;
    st->peers = sp;
    pthread_mutex_unlock(&st->peers_lock);
    *sp_p = sp;
    return KVF_OK;
}

void kvf__speer_unref(kvf_store_h st, kvf_speer_t *sp, int bad)
{
    kvf_speer_t **pp;
    int close_it;

    pthread_mutex_lock(&st->peers_lock);
    if (bad && !sp->dead) {
        __atomic_add_fetch(&st->peer_epoch, 1, __ATOMIC_RELEASE);
        for (pp = &st->peers; *pp != NULL; pp = &(*pp)->next) {
            if (*pp == sp) {
                *pp = sp->next;
                break;
            }
        }
        sp->dead = 1;
    }
    close_it = (--sp->refs == 0 && sp->dead);
    pthread_mutex_unlock(&st->peers_lock);
    if (close_it) {
        kvf_peer_close(sp->peer);
        kvf_free(sp);
    }
}

/* Usable CPUs of this process (its affinity mask). */
static unsigned kvf_store_cpus(void)
{
    cpu_set_t set;
    long n;

    if (sched_getaffinity(0, sizeof(set), &set) == 0) {
        return (unsigned)CPU_COUNT(&set);
    }
    n = sysconf(_SC_NPROCESSORS_ONLN);
    return (n > 0) ? (unsigned)n : 1;
}

/* node_conns and node_chunk (store config) into the engine's params. */
static kvf_status_t kvf_store_engine_shape(kvf_engine_params_t *ep)
{
    kvf_status_t status;
    uint64_t conns, chunk;

    if ((status = kvf_config_u64(&kvf_store_config, "node_conns", &conns)) !=
            KVF_OK ||
        (status = kvf_config_u64(&kvf_store_config, "node_chunk", &chunk)) !=
            KVF_OK) {
        return status;
    }
    if (conns > KVF_STORE_NODE_CONNS_MAX) {
        kvf_error("store node_conns=%lu: at most %u", (unsigned long)conns,
                  KVF_STORE_NODE_CONNS_MAX);
        return KVF_ERR_INVALID_PARAM;
    }
    if (conns != 0) {
        ep->field_mask |= KVF_ENGINE_PARAM_CONNS;
        ep->conns = (unsigned)conns;
    }
    if (chunk == 0) { /* auto */
        chunk = (kvf_store_cpus() >= KVF_STORE_STRIPE_CPUS)
                    ? KVF_STORE_STRIPE_CHUNK
                    : 0;
    }
    if (chunk != 0) {
        ep->field_mask |= KVF_ENGINE_PARAM_CHUNK;
        ep->chunk_bytes = (size_t)chunk;
    }
    return KVF_OK;
}

/* The base's settings: timeout, and whether single puts keep a
 * reservation (put_reserve). */
static kvf_status_t kvf_store_settings(kvf_store_h st,
                                       const kvf_store_params_t *p)
{
    const kvf_config_table_t *t = &kvf_store_config;
    kvf_status_t status;
    uint64_t v = 0;

    if (p && (p->field_mask & KVF_STORE_PARAM_TIMEOUT) && p->timeout_ms) {
        st->timeout_ms = p->timeout_ms;
    } else {
        status = kvf_config_u64(t, "store_timeout_ms", &v);
        if (status != KVF_OK) {
            return status;
        }
        st->timeout_ms = (unsigned)v;
    }
    status = kvf_config_u64(t, "put_reserve", &v);
    if (status != KVF_OK) {
        return status;
    }
    st->reserve = (v != 0);
    return KVF_OK;
}

/* The caller's engine, or one of the handle's own. */
static kvf_status_t kvf_store_open_engine(kvf_store_h st,
                                          const kvf_store_params_t *p)
{
    kvf_engine_params_t ep = {0};
    kvf_status_t status;

    if (p && (p->field_mask & KVF_STORE_PARAM_ENGINE) && p->engine) {
        st->engine = p->engine;
        return KVF_OK;
    }
    ep.field_mask = KVF_ENGINE_PARAM_NO_LISTEN | KVF_ENGINE_PARAM_TIMEOUT;
    ep.no_listen = 1;
    ep.timeout_ms = st->timeout_ms;
    status = kvf_store_engine_shape(&ep);
    if (status != KVF_OK) {
        return status;
    }
    if (p && (p->field_mask & KVF_STORE_PARAM_TRANSPORTS) && p->transports) {
        ep.field_mask |= KVF_ENGINE_PARAM_TRANSPORTS;
        ep.transports = p->transports;
    }
    status = kvf_engine_create(&ep, &st->engine);
    st->own_engine = (status == KVF_OK);
    return status;
}

/* The first connection: to the one master, or to the leader among
 * several (a standby answers a HEARTBEAT-free probe, an empty EXISTS,
 * with NOT_LEADER). */
static kvf_status_t kvf_store_connect_leader(kvf_store_h st, kvf_sconn_t **c_p)
{
    unsigned i, tries = st->masters.n + 2;
    kvf_status_t status = KVF_ERR_NOT_LEADER;
    kvf_sconn_t *c;

    if (!kvf_sp_masters_many(&st->masters)) {
        return kvf_sconn_open(st, c_p);
    }
    for (i = 0; i < tries; i++) {
        if (kvf__sfollow(st, NULL) != KVF_OK) {
            continue;
        }
        status = kvf_sconn_open(st, &c);
        if (status == KVF_OK) {
            status = kvf_sp_call(c->fd, &c->mac, KVF_SP_EXISTS, ++c->next_id, 0,
                                 NULL, &c->f, kvf_time_ms() + st->timeout_ms);
            if (status == KVF_OK) {
                status = (kvf_status_t)c->f.hdr.status;
            }
            if (status == KVF_OK) {
                *c_p = c;
                return KVF_OK;
            }
            kvf_sconn_close(c);
        }
    }
    return status;
}

kvf_status_t kvf__sbase_open(kvf_store_h st, const kvf_store_params_t *p)
{
    const char *master;
    kvf_status_t status;
    kvf_sconn_t *c;

    master = (p && (p->field_mask & KVF_STORE_PARAM_MASTER) && p->master)
                 ? p->master
                 : kvf_config_str(&kvf_store_config, "master");
    status = kvf_sp_masters_init(&st->masters, master);
    if (status == KVF_OK && st->masters.n > 0) {
        status = kvf_sock_parse_addr(st->masters.addr[0], st->host,
                                     sizeof(st->host), &st->port);
    }
    if (status == KVF_OK) {
        status = kvf_store_settings(st, p);
    }
    if (status != KVF_OK) {
        return status;
    }
    pthread_mutex_init(&st->lock, NULL);
    pthread_mutex_init(&st->peers_lock, NULL);
    status = kvf_store_open_engine(st, p);
    if (status != KVF_OK) {
        goto err_locks;
    }
    status = kvf__spick_link(st);
    if (status != KVF_OK) {
        goto err_engine;
    }
    status = kvf_store_connect_leader(st, &c);
    if (status != KVF_OK) {
        kvf_error("store master %s unreachable: %s", master,
                  kvf_status_str(status));
        goto err_engine;
    }
    if (!c->is_unix) {
        kvf_sbase_learn_host(st, c->fd);
    }
    st->idle = c;
    return KVF_OK;

err_engine:
    if (st->own_engine) {
        kvf_engine_destroy(st->engine);
    }
err_locks:
    pthread_mutex_destroy(&st->peers_lock);
    pthread_mutex_destroy(&st->lock);
    return status;
}

void kvf__sbase_close(kvf_store_h st)
{
    kvf_sconn_t *c;
    kvf_speer_t *sp;

    while ((c = st->idle) != NULL) {
        st->idle = c->next;
        kvf_sconn_drop_resv(c, st->timeout_ms);
        kvf_sconn_close(c);
    }
    while ((sp = st->peers) != NULL) {
        st->peers = sp->next;
        if (sp->refs != 0) {
            kvf_warn("store peer %s still in use at disconnect", sp->name);
        }
        kvf_peer_close(sp->peer);
        kvf_free(sp);
    }
    if (st->own_engine) {
        kvf_engine_destroy(st->engine);
    }
    pthread_mutex_destroy(&st->peers_lock);
    pthread_mutex_destroy(&st->lock);
}

kvf_engine_h kvf_store_engine(kvf_store_h st)
{
    return st->engine;
}

const char *kvf_store_master_link(kvf_store_h st)
{
    return __atomic_load_n(&st->last_unix, __ATOMIC_RELAXED) ? "unix" : "tcp";
}

void kvf_store_last_timing(kvf_store_timing_t *t)
{
    if (t != NULL) {
        *t = kvf__stl_timing;
    }
}
