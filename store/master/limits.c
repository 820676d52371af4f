/*
 * The master's limits per peer. A peer is a tcp address, or a local uid
 * over the unix socket (told by SO_PEERCRED).
 *
 * Connection caps: connections are counted per peer and in all, tcp and
 * unix apart, so a flood from one address or one local user cannot take
 * every slot and lock the others out. The caps are config keys
 * (conn_max_per_peer, conn_max_tcp, conn_max_unix); a connection over
 * one is closed at accept, with one rate-limited line.
 *
 * Client identities: every connection of one peer shares one record
 * (kvf_mclient_t), which counts what the peer holds in pending puts,
 * reservations and read leases, so opening more connections buys no
 * more of the pool. A record lives while a connection, a pending object
 * or a lease refers to it, so closing and reopening connections does not
 * reset it either.
 *
 * Read leases: each lease a client holds on an object is a record, on
 * the object's list and on the client's list in the order they end (every
 * lease lasts lease_ms, so a renewed one moves to the tail). A client's
 * live leases may cover at most client_max_leased_pct of the capacity and
 * client_max_leases records; a get past that is served without a lease,
 * so a client that reads everything over and over cannot keep the whole
 * store unevictable.
 */
#include "store/master/master_int.h"
#include "core/alloc.h"
#include "core/log.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#define KVF_PEER_BUCKETS 1024

struct kvf_mpeer {
    unsigned char key[KVF_M_PEER_KEY_LEN]; /* kind + address or uid */
    unsigned n;            /* its connections */
    struct kvf_mpeer *next;
};

struct kvf_mcaps {
    pthread_mutex_t lock;
    unsigned ntcp, nunix;
    kvf_mpeer_t *peers[KVF_PEER_BUCKETS];
};

/* The client identities, guarded by the master's lock. */
struct kvf_mclients {
    kvf_mclient_t *b[KVF_PEER_BUCKETS];
};

struct kvf_mlease {
    kvf_mobj_t *obj;
    kvf_mclient_t *cl;
    uint64_t until_ms;
    uint64_t bytes;
    struct kvf_mlease *onext;         /* the object's leases */
    struct kvf_mlease *cprev, *cnext; /* the client's, by end */
};

kvf_status_t kvf_m_caps_init(kvf_master_t *m)
{
    m->caps = kvf_calloc(1, sizeof(*m->caps));
    if (m->caps == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    pthread_mutex_init(&m->caps->lock, NULL);
    return KVF_OK;
}

void kvf_m_caps_fini(kvf_master_t *m)
{
    kvf_mpeer_t *p;
    size_t i;

    if (m->caps == NULL) {
        return;
    }
    for (i = 0; i < KVF_PEER_BUCKETS; i++) {
        while ((p = m->caps->peers[i]) != NULL) {
            m->caps->peers[i] = p->next;
            kvf_free(p);
        }
    }
    pthread_mutex_destroy(&m->caps->lock);
    kvf_free(m->caps);
    m->caps = NULL;
}

/* The peer's key and a printable name of it. 0, or -1 if unknown. */
static int kvf_m_peer_key(int fd, int is_unix, const struct sockaddr *sa,
                          unsigned char key[KVF_M_PEER_KEY_LEN], char *name, size_t nlen)
{
    struct ucred cr;
    socklen_t cl = sizeof(cr);

    memset(key, 0, KVF_M_PEER_KEY_LEN);
    if (is_unix) {
        if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &cl) != 0) {
            return -1;
        }
        key[0] = 'u';
        memcpy(key + 1, &cr.uid, sizeof(cr.uid));
        snprintf(name, nlen, "unix uid %u", (unsigned)cr.uid);
        return 0;
    }
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)sa;

        key[0] = 4;
        memcpy(key + 1, &in->sin_addr, 4);
        inet_ntop(AF_INET, &in->sin_addr, name, (socklen_t)nlen);
        return 0;
    }
    if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;

        key[0] = 6;
        memcpy(key + 1, &in6->sin6_addr, 16);
        inet_ntop(AF_INET6, &in6->sin6_addr, name, (socklen_t)nlen);
        return 0;
    }
    return -1;
}

static size_t kvf_m_peer_slot(const unsigned char key[KVF_M_PEER_KEY_LEN])
{
    uint64_t h = 1469598103934665603ull;
    size_t i;

    for (i = 0; i < KVF_M_PEER_KEY_LEN; i++) {
        h = (h ^ key[i]) * 1099511628211ull;
    }
    return (size_t)(h & (KVF_PEER_BUCKETS - 1));
}

kvf_status_t kvf_m_caps_admit(kvf_master_t *m, int fd, int is_unix,
                              const struct sockaddr *sa, kvf_mpeer_t **peer_p)
{
    struct kvf_mcaps *k = m->caps;
    unsigned char key[KVF_M_PEER_KEY_LEN];
    char name[INET6_ADDRSTRLEN + 16] = "?";
    unsigned *all = is_unix ? &k->nunix : &k->ntcp;
    unsigned max = is_unix ? m->opts.conn_max_unix : m->opts.conn_max_tcp;
    const char *why = NULL;
    kvf_mpeer_t *p = NULL;
    size_t b;

    if (kvf_m_peer_key(fd, is_unix, sa, key, name, sizeof(name)) != 0) {
        return KVF_ERR_INVALID_PARAM;
    }
    b = kvf_m_peer_slot(key);
    pthread_mutex_lock(&k->lock);
    for (p = k->peers[b]; p != NULL; p = p->next) {
        if (memcmp(p->key, key, sizeof(key)) == 0) {
            break;
        }
    }
    if (*all >= max) {
        why = is_unix ? "conn_max_unix" : "conn_max_tcp";
    } else if (p != NULL && p->n >= m->opts.conn_max_per_peer) {
        why = "conn_max_per_peer";
    } else if (p == NULL && (p = kvf_calloc(1, sizeof(*p))) != NULL) {
        memcpy(p->key, key, sizeof(key));
        p->next = k->peers[b];
        k->peers[b] = p;
    }
    if (why == NULL && p != NULL) {
        p->n++;
        (*all)++;
    }
    pthread_mutex_unlock(&k->lock);
    if (why != NULL) {
        kvf_log_rl(
            KVF_LOG_WARN, "master refuses a connection from %s: over %s (%u)",
            name, why,
            strcmp(why, "conn_max_per_peer") == 0 ? m->opts.conn_max_per_peer
                                                  : max);
        return KVF_ERR_QUOTA;
    }
    if (p == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    *peer_p = p;
    return KVF_OK;
}

void kvf_m_caps_release(kvf_master_t *m, kvf_mpeer_t *p, int is_unix)
{
    struct kvf_mcaps *k = m->caps;
    kvf_mpeer_t **pp;

    if (p == NULL) {
        return;
    }
    pthread_mutex_lock(&k->lock);
    (*(is_unix ? &k->nunix : &k->ntcp))--;
    if (--p->n == 0) {
        for (pp = &k->peers[kvf_m_peer_slot(p->key)]; *pp != NULL;
             pp = &(*pp)->next) {
            if (*pp == p) {
                *pp = p->next;
                kvf_free(p);
                break;
            }
        }
    }
    pthread_mutex_unlock(&k->lock);
}

/* ---- client identities ---- */

kvf_status_t kvf_m_clients_init(kvf_master_t *m)
{
    m->clients = kvf_calloc(1, sizeof(*m->clients));
    return (m->clients != NULL) ? KVF_OK : KVF_ERR_NO_MEMORY;
}

void kvf_m_clients_fini(kvf_master_t *m)
{
    kvf_mclient_t *cl;
    size_t i;

    if (m->clients == NULL) {
        return;
    }
    /* the objects and connections that referred to them are gone */
    for (i = 0; i < KVF_PEER_BUCKETS; i++) {
        while ((cl = m->clients->b[i]) != NULL) {
            m->clients->b[i] = cl->next;
            kvf_free(cl);
        }
    }
    kvf_free(m->clients);
    m->clients = NULL;
}

kvf_mclient_t *kvf_m_client_get(kvf_master_t *m, const kvf_mpeer_t *peer)
{
    size_t b = kvf_m_peer_slot(peer->key);
    kvf_mclient_t *cl;

    pthread_mutex_lock(&m->lock);
    for (cl = m->clients->b[b]; cl != NULL; cl = cl->next) {
        if (memcmp(cl->key, peer->key, KVF_M_PEER_KEY_LEN) == 0) {
            break;
        }
    }
    if (cl == NULL && (cl = kvf_calloc(1, sizeof(*cl))) != NULL) {
        memcpy(cl->key, peer->key, KVF_M_PEER_KEY_LEN);
        cl->next = m->clients->b[b];
        m->clients->b[b] = cl;
    }
    if (cl != NULL) {
        cl->refs++;
    }
    pthread_mutex_unlock(&m->lock);
    return cl;
}

void kvf_m_client_ref(kvf_mclient_t *cl)
{
    cl->refs++;
}

void kvf_m_client_unref(kvf_master_t *m, kvf_mclient_t *cl)
{
    kvf_mclient_t **pp;

    if (cl == NULL || --cl->refs > 0) {
        return;
    }
    for (pp = &m->clients->b[kvf_m_peer_slot(cl->key)]; *pp != NULL;
         pp = &(*pp)->next) {
        if (*pp == cl) {
            *pp = cl->next;
            break;
        }
    }
    kvf_free(cl);
}

void kvf_m_client_put(kvf_master_t *m, kvf_mclient_t *cl)
{
    pthread_mutex_lock(&m->lock);
    kvf_m_client_unref(m, cl);
    pthread_mutex_unlock(&m->lock);
}

/* ---- read leases ---- */

static void kvf_m_lease_unlink_client(kvf_mlease_t *l)
{
    kvf_mclient_t *cl = l->cl;

    if (l->cprev != NULL) {
        l->cprev->cnext = l->cnext;
    } else {
        cl->lhead = l->cnext;
    }
    if (l->cnext != NULL) {
        l->cnext->cprev = l->cprev;
    } else {
        cl->ltail = l->cprev;
    }
    l->cprev = l->cnext = NULL;
}

static void kvf_m_lease_append(kvf_mlease_t *l)
{
    kvf_mclient_t *cl = l->cl;

    l->cnext = NULL;
    l->cprev = cl->ltail;
    if (cl->ltail != NULL) {
        cl->ltail->cnext = l;
    } else {
        cl->lhead = l;
    }
    cl->ltail = l;
}

/* Ends lease record l: off both lists, uncounted, freed. */
static void kvf_m_lease_end(kvf_master_t *m, kvf_mlease_t *l)
{
    kvf_mlease_t **pp;
    kvf_mclient_t *cl = l->cl;

    for (pp = &l->obj->leases; *pp != NULL; pp = &(*pp)->onext) {
        if (*pp == l) {
            *pp = l->onext;
            break;
        }
    }
    kvf_m_lease_unlink_client(l);
    cl->leased -= l->bytes;
    cl->nleases--;
    kvf_free(l);
    kvf_m_client_unref(m, cl);
}

/* Ends cl's leases due by now (the oldest first). */
static void kvf_m_lease_expire_client(kvf_master_t *m, kvf_mclient_t *cl,
                                      uint64_t now)
{
    kvf_mlease_t *l;

    cl->refs++; /* the last lease's end must not free it under us */
    while ((l = cl->lhead) != NULL && l->until_ms <= now) {
        kvf_m_lease_end(m, l);
    }
    kvf_m_client_unref(m, cl);
}

void kvf_m_lease_expire(kvf_master_t *m, uint64_t now)
{
    kvf_mclient_t *cl, *next;
    size_t i;

    for (i = 0; i < KVF_PEER_BUCKETS; i++) {
        for (cl = m->clients->b[i]; cl != NULL; cl = next) {
            next = cl->next;
            if (cl->lhead != NULL && cl->lhead->until_ms <= now) {
                /* may free cl, never another record of the chain */
                kvf_m_lease_expire_client(m, cl, now);
            }
        }
    }
}

/* cl's lease budget in bytes. */
static uint64_t kvf_m_lease_budget(const kvf_master_t *m)
{
    uint64_t cap = kvf_m_capacity(m);
    unsigned pct = m->opts.client_max_leased_pct;

    return cap / 100 * pct + cap % 100 * pct / 100;
}

int kvf_m_lease_grant(kvf_master_t *m, kvf_mclient_t *cl, kvf_mobj_t *o,
                      uint64_t bytes, uint64_t now)
{
    uint64_t until = now + m->opts.lease_ms;
    kvf_mlease_t *l;

    if (cl != NULL) {
        kvf_m_lease_expire_client(m, cl, now);
        for (l = o->leases; l != NULL && l->cl != cl; l = l->onext) {
        }
        if (l != NULL) { /* renewed: now the last of cl's to end */
            l->until_ms = until;
            kvf_m_lease_unlink_client(l);
            kvf_m_lease_append(l);
        } else {
            if (cl->leased + bytes > kvf_m_lease_budget(m) ||
                cl->nleases >= m->opts.client_max_leases ||
                (l = kvf_calloc(1, sizeof(*l))) == NULL) {
                return 0;
            }
            l->obj = o;
            l->cl = cl;
            l->until_ms = until;
            l->bytes = bytes;
            l->onext = o->leases;
            o->leases = l;
            kvf_m_lease_append(l);
            cl->leased += bytes;
            cl->nleases++;
            cl->refs++;
        }
    }
    if (until > o->lease_until_ms) {
        o->lease_until_ms = until;
    }
    return 1;
}

void kvf_m_lease_drop(kvf_master_t *m, kvf_mobj_t *o)
{
    while (o->leases != NULL) {
        kvf_m_lease_end(m, o->leases);
    }
}
