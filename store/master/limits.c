/*
 * The master's connection caps: connections are counted per peer (a tcp
 * address, or a local uid over the unix socket, told by SO_PEERCRED) and
 * in all, tcp and unix apart, so a flood from one address or one local
 * user cannot take every slot and lock the others out. The caps are
 * config keys (conn_max_per_peer, conn_max_tcp, conn_max_unix); a
 * connection over one is closed at accept, with one rate-limited line.
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
    unsigned char key[17]; /* kind (4, 6, 'u') + address or uid */
    unsigned n;            /* its connections */
    struct kvf_mpeer *next;
};

struct kvf_mcaps {
    pthread_mutex_t lock;
    unsigned ntcp, nunix;
    kvf_mpeer_t *peers[KVF_PEER_BUCKETS];
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
                          unsigned char key[17], char *name, size_t nlen)
{
    struct ucred cr;
    socklen_t cl = sizeof(cr);

    memset(key, 0, 17);
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

static size_t kvf_m_peer_slot(const unsigned char key[17])
{
    uint64_t h = 1469598103934665603ull;
    size_t i;

    for (i = 0; i < 17; i++) {
        h = (h ^ key[i]) * 1099511628211ull;
    }
    return (size_t)(h & (KVF_PEER_BUCKETS - 1));
}

kvf_status_t kvf_m_caps_admit(kvf_master_t *m, int fd, int is_unix,
                              const struct sockaddr *sa, kvf_mpeer_t **peer_p)
{
    struct kvf_mcaps *k = m->caps;
    unsigned char key[17];
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
