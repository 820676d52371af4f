/*
 * What one address may hold of the door, and what a connection may hold
 * before it has given the password:
 *
 * - connections are counted per address (resp_conns_per_addr) and in all
 *   (resp_max_clients);
 * - unauthenticated connections are listed oldest first and counted per
 *   address (resp_unauth_per_addr). When an address is at its cap, or
 *   the door at resp_max_clients, the oldest unauthenticated connection
 *   (of that address, else of any) is shut down to make room, so
 *   connections that never authenticate cannot keep a client that does
 *   out; only when no unauthenticated connection is left is a new one
 *   refused. The loops close them before resp_auth_timeout_ms too
 *   (conn.c);
 * - wrong AUTHs are counted per network (an IPv4 address, all of
 *   127.0.0.0/8 as one, an IPv6 /64) in a token bucket: KVF_RESP_AUTH_RATE
 *   a second; an empty bucket refuses AUTH unchecked;
 * - GET values sent from store views are counted while they are sent
 *   (resp_slow_mem): a reader too slow to take a value before its view's
 *   lease ends gets a copy, so this bounds the copies slow readers hold.
 *
 * The address table is the master's shape (store/master/limits.c):
 * buckets of chained entries under one mutex (gmu), an entry freed when
 * nothing counts on it. An eviction shuts the socket down under gmu; the
 * owner unlists a connection under gmu before it closes its descriptor,
 * so the descriptor shut down is always the connection's own.
 */
#include "store/resp/resp_int.h"

#include "core/log.h"
#include "core/time.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

/* An address (key[0] 4 or 6) or a network of AUTH attempts (key[0]
 * 'n'): its connections, and its AUTH token bucket in thousandths. */
struct kvf_resp_peer {
    unsigned char key[17];
    unsigned total, unauth;
    uint64_t tokens_m, at_ms;
    struct kvf_resp_peer *next;
};

/* Networks kept for their AUTH bucket once no connection counts on them:
 * at most this many (an attacker cycling addresses then only meets the
 * per-connection limit for the rest). */
#define KVF_RESP_NETS_MAX 65536u
#define KVF_RESP_BURST_M  (KVF_RESP_AUTH_RATE * 1000ull)

static size_t kvf_resp_peer_slot(const unsigned char key[17])
{
    uint64_t h = 1469598103934665603ull;
    size_t i;

    for (i = 0; i < 17; i++) {
        h = (h ^ key[i]) * 1099511628211ull;
    }
    return (size_t)(h & (KVF_RESP_PEER_BUCKETS - 1));
}

/* The address of sa as a key and a printable name (a socket of another
 * family has no address: all of them are one key). */
static void kvf_resp_addr_key(const struct sockaddr *sa, unsigned char key[17],
                              char *name, size_t nlen)
{
    memset(key, 0, 17);
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)sa;

        key[0] = 4;
        memcpy(key + 1, &in->sin_addr, 4);
        inet_ntop(AF_INET, &in->sin_addr, name, (socklen_t)nlen);
        return;
    }
    if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;

        key[0] = 6;
        memcpy(key + 1, &in6->sin6_addr, 16);
        inet_ntop(AF_INET6, &in6->sin6_addr, name, (socklen_t)nlen);
        return;
    }
    snprintf(name, nlen, "local");
}

/* The network an address's AUTH attempts are counted under. */
static void kvf_resp_net_key(const unsigned char addr[17],
                             unsigned char key[17])
{
    memcpy(key, addr, 17);
    key[0] = 'n';
    if (addr[0] == 4 && addr[1] == 127) {
        memset(key + 2, 0, 15); /* 127.0.0.0/8: this host */
    } else if (addr[0] == 6) {
        memset(key + 9, 0, 8); /* the /64 */
    }
}

/* Whether a network entry with no connections may go: its bucket is full
 * again. */
static int kvf_resp_peer_idle(const kvf_resp_peer_t *p, uint64_t now)
{
    return p->total == 0 && p->unauth == 0 &&
           p->tokens_m + (now - p->at_ms) * KVF_RESP_AUTH_RATE >=
               KVF_RESP_BURST_M;
}

/* The entry of key (gmu held), made when create and absent; entries of
 * the bucket that may go are freed on the way. */
static kvf_resp_peer_t *kvf_resp_peer_get(struct kvf_resp *s,
                                          const unsigned char key[17],
                                          int create)
{
    kvf_resp_peer_t **pp = &s->peers[kvf_resp_peer_slot(key)], *p;
    uint64_t now = kvf_time_ms();

    while ((p = *pp) != NULL) {
        if (memcmp(p->key, key, 17) == 0) {
            return p;
        }
        if (kvf_resp_peer_idle(p, now)) {
            *pp = p->next;
            s->npeers--;
            free(p);
            continue;
        }
        pp = &p->next;
    }
    if (!create || (key[0] == 'n' && s->npeers >= KVF_RESP_NETS_MAX) ||
        (p = calloc(1, sizeof(*p))) == NULL) {
        return NULL;
    }
    memcpy(p->key, key, 17);
    p->tokens_m = KVF_RESP_BURST_M;
    p->at_ms = now;
    p->next = s->peers[kvf_resp_peer_slot(key)];
    s->peers[kvf_resp_peer_slot(key)] = p;
    s->npeers++;
    return p;
}

/* Frees p if nothing counts on it (gmu held). */
static void kvf_resp_peer_put(struct kvf_resp *s, kvf_resp_peer_t *p)
{
    kvf_resp_peer_t **pp;

    if (p->total > 0 || p->unauth > 0) {
        return;
    }
    for (pp = &s->peers[kvf_resp_peer_slot(p->key)]; *pp != NULL;
         pp = &(*pp)->next) {
        if (*pp == p) {
            *pp = p->next;
            s->npeers--;
            free(p);
            return;
        }
    }
}

static void kvf_resp_unlist(struct kvf_resp *s, kvf_resp_conn_t *c)
{
    if (c->uprev != NULL) {
        c->uprev->unext = c->unext;
    } else {
        s->uhead = c->unext;
    }
    if (c->unext != NULL) {
        c->unext->uprev = c->uprev;
    } else {
        s->utail = c->uprev;
    }
    c->uprev = c->unext = NULL;
    c->ulisted = 0;
    s->nunauth--;
    c->peer->unauth--;
}

/* Shuts the oldest unauthenticated connection (of peer p, or of any when
 * p is NULL) down and gives its counts back (keep is not freed); 0 when
 * there is none. */
static int kvf_resp_evict(struct kvf_resp *s, const kvf_resp_peer_t *p,
                          const kvf_resp_peer_t *keep)
{
    kvf_resp_conn_t *v;

    for (v = s->uhead; v != NULL && p != NULL && v->peer != p; v = v->unext) {
    }
    if (v == NULL) {
        return 0;
    }
    kvf_resp_unlist(s, v);
    v->evicted = 1;
    v->peer->total--;
    s->nclients--;
    if (v->peer != keep) {
        kvf_resp_peer_put(s, v->peer);
    }
    v->peer = NULL;
    shutdown(v->fd, SHUT_RDWR); /* its loop sees the end and closes it */
    atomic_fetch_add(&s->stats.evicted, 1);
    return 1;
}

/* Makes room for one more connection of peer p; the cap it is over, or
 * NULL. */
static const char *kvf_resp_room(struct kvf_resp *s, kvf_resp_peer_t *p,
                                 int unauth)
{
    if (p->total >= s->lim.per_addr && !kvf_resp_evict(s, p, p)) {
        return "resp_conns_per_addr";
    }
    if (unauth && p->unauth >= s->lim.unauth_per_addr) {
        (void)kvf_resp_evict(s, p, p); /* p has one: p->unauth > 0 */
    }
    if (s->nclients >= s->p.max_clients && !kvf_resp_evict(s, NULL, p)) {
        return "resp_max_clients";
    }
    return NULL;
}

int kvf_resp_guard_admit(struct kvf_resp *s, kvf_resp_conn_t *c,
                         const struct sockaddr *sa, const char **why_p)
{
    const char *why = NULL;
    kvf_resp_peer_t *p;
    int unauth = !c->authed;

    kvf_resp_addr_key(sa, c->akey, c->aname, sizeof(c->aname));
    pthread_mutex_lock(&s->gmu);
    p = kvf_resp_peer_get(s, c->akey, 1);
    why = p == NULL ? "memory" : kvf_resp_room(s, p, unauth);
    if (why == NULL) {
        p->total++;
        s->nclients++;
        c->peer = p;
        if (unauth) {
            p->unauth++;
            s->nunauth++;
            c->ulisted = 1;
            c->uprev = s->utail;
            if (s->utail != NULL) {
                s->utail->unext = c;
            } else {
                s->uhead = c;
            }
            s->utail = c;
        }
    } else if (p != NULL) {
        kvf_resp_peer_put(s, p);
    }
    pthread_mutex_unlock(&s->gmu);
    if (why != NULL) {
        atomic_fetch_add(strcmp(why, "resp_conns_per_addr") == 0
                             ? &s->stats.refused_addr
                             : &s->stats.refused_max,
                         1);
        kvf_log_rl(KVF_LOG_WARN, "resp: refused a connection from %s: over %s",
                   c->aname, why);
        *why_p = why;
        return -1;
    }
    return 0;
}

void kvf_resp_guard_authed(kvf_resp_conn_t *c)
{
    struct kvf_resp *s = c->lp->srv;

    pthread_mutex_lock(&s->gmu);
    if (c->ulisted) {
        kvf_resp_unlist(s, c);
    }
    pthread_mutex_unlock(&s->gmu);
}

void kvf_resp_guard_release(kvf_resp_conn_t *c)
{
    struct kvf_resp *s = c->lp->srv;

    pthread_mutex_lock(&s->gmu);
    if (c->ulisted) {
        kvf_resp_unlist(s, c);
    }
    if (!c->evicted && c->peer != NULL) {
        c->peer->total--;
        s->nclients--;
        kvf_resp_peer_put(s, c->peer);
    }
    c->peer = NULL;
    pthread_mutex_unlock(&s->gmu);
}

unsigned kvf_resp_guard_counts(struct kvf_resp *s, unsigned *unauth_p)
{
    unsigned n;

    pthread_mutex_lock(&s->gmu);
    n = s->nclients;
    *unauth_p = s->nunauth;
    pthread_mutex_unlock(&s->gmu);
    return n;
}

/* The network entry of c's AUTH attempts with its bucket refilled to now
 * (gmu held), or NULL when none could be kept. */
static kvf_resp_peer_t *kvf_resp_auth_net(struct kvf_resp *s,
                                          const kvf_resp_conn_t *c)
{
    unsigned char key[17];
    kvf_resp_peer_t *n;
    uint64_t now = kvf_time_ms();

    kvf_resp_net_key(c->akey, key);
    n = kvf_resp_peer_get(s, key, 1);
    if (n != NULL) {
        n->tokens_m += (now - n->at_ms) * KVF_RESP_AUTH_RATE;
        if (n->tokens_m > KVF_RESP_BURST_M) {
            n->tokens_m = KVF_RESP_BURST_M;
        }
        n->at_ms = now;
    }
    return n;
}

int kvf_resp_auth_allow(kvf_resp_conn_t *c)
{
    struct kvf_resp *s = c->lp->srv;
    kvf_resp_peer_t *n;
    int ok;

    pthread_mutex_lock(&s->gmu);
    n = kvf_resp_auth_net(s, c);
    ok = n == NULL || n->tokens_m >= 1000;
    pthread_mutex_unlock(&s->gmu);
    return ok;
}

void kvf_resp_auth_failed(kvf_resp_conn_t *c)
{
    struct kvf_resp *s = c->lp->srv;
    kvf_resp_peer_t *n;

    pthread_mutex_lock(&s->gmu);
    n = kvf_resp_auth_net(s, c);
    if (n != NULL) {
        n->tokens_m = n->tokens_m >= 1000 ? n->tokens_m - 1000 : 0;
    }
    pthread_mutex_unlock(&s->gmu);
}

void kvf_resp_guard_fini(struct kvf_resp *s)
{
    kvf_resp_peer_t *p;
    size_t i;

    for (i = 0; i < KVF_RESP_PEER_BUCKETS; i++) {
        while ((p = s->peers[i]) != NULL) {
            s->peers[i] = p->next;
            free(p);
        }
    }
}

int kvf_resp_slow_take(struct kvf_resp *s, size_t n)
{
    size_t held = atomic_fetch_add(&s->slow_held, n);

    if (held + n > s->lim.slow_mem) {
        atomic_fetch_sub(&s->slow_held, n);
        atomic_fetch_add(&s->stats.slow_refused, 1);
        return 0;
    }
    return 1;
}

void kvf_resp_slow_give(struct kvf_resp *s, size_t n)
{
    if (n > 0) {
        atomic_fetch_sub(&s->slow_held, n);
    }
}
