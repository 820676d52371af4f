/*
 * The RESP2 front door of the store (`kvferry resp`): a Redis-protocol
 * server answering AUTH, PING, GET, SET, EXISTS, DEL, MULTI/EXEC, INFO
 * (and the few handshake commands redis-cli, redis-py and
 * redis-benchmark send) on the kvferry store, so Redis clients such as
 * LMCache's resp:// connector use the store with no plugin code. This
 * file holds its configuration keys, the AUTH password (derived from the
 * cluster secret unless a password file gives one), and start and stop:
 * a store client (checked with one call: a master that refuses this door
 * is told at start), the value pool, the listening socket and
 * resp_threads event loops. The other modules are listed in resp_int.h.
 */
#include "store/resp/resp_int.h"
#include "core/time.h"

#include "core/auth.h"
#include "core/config.h"
#include "core/log.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <unistd.h>

static const kvf_config_entry_t kvf_resp_config_entries[] = {
    {"resp_listen", "127.0.0.1:6379", "kvferry resp: address served",
     KVF_CONFIG_USER},
    {"resp_password_file", "",
     "kvferry resp: a 0600 file holding the password AUTH must give "
     "(empty: the password derived from the cluster secret, printed by "
     "kvferry resp --print-password)",
     KVF_CONFIG_USER},
    {"resp_max_value", "512M", "kvferry resp: longest value accepted",
     KVF_CONFIG_TUNING},
    {"resp_pool", "1G",
     "kvferry resp: registered pool holding values in flight",
     KVF_CONFIG_TUNING},
    {"resp_max_clients", "1024", "kvferry resp: connections served at once",
     KVF_CONFIG_TUNING},
    {"resp_idle_ms", "300000",
     "kvferry resp: idle connections are closed after this (0 = never)",
     KVF_CONFIG_TUNING},
    {"resp_threads", "1", "kvferry resp: event loops (threads)",
     KVF_CONFIG_TUNING},
    {"resp_spread", "1",
     "kvferry resp: 1 = connections are given to the loops in turn; 0 = "
     "each stays on the loop the kernel woke to accept it (uneven: more "
     "clients share one loop's batches, which can win on two cores)",
     KVF_CONFIG_TUNING},
    {"resp_auth_timeout_ms", "5000",
     "kvferry resp: a connection that has not given the password this long "
     "after it connected is closed (0 = never)",
     KVF_CONFIG_TUNING},
    {"resp_conns_per_addr", "512",
     "kvferry resp: connections from one address at once; past it the "
     "oldest connection of that address that has not authenticated is "
     "closed, else the new one refused",
     KVF_CONFIG_TUNING},
    {"resp_unauth_per_addr", "32",
     "kvferry resp: connections from one address that have not given the "
     "password yet; one more closes the oldest of them",
     KVF_CONFIG_TUNING},
    {"resp_slow_mem", "256M",
     "kvferry resp: GET values sent from store views that may be held at "
     "once for clients still reading them (a slow reader's value is copied "
     "before its view's lease ends); a GET past it is refused with an error",
     KVF_CONFIG_TUNING},
    {"resp_views", "1",
     "kvferry resp: 1 = a GET's value is sent straight from the node's "
     "memory when the node is reached over shm (a store view, checked "
     "against its checksum); 0 = always copied into the door's pool first",
     KVF_CONFIG_TUNING},
};
KVF_CONFIG_TABLE(kvf_resp_config, "resp", kvf_resp_config_entries)

kvf_status_t kvf_server_resp_defaults(kvf_server_resp_params_t *p)
{
    const kvf_config_table_t *t = &kvf_resp_config;
    uint64_t threads, clients, tmo;
    kvf_status_t st;
    const char *v;

    if (p == NULL) {
        return KVF_ERR_INVALID_PARAM;
    }
    memset(p, 0, sizeof(*p));
    p->listen = kvf_config_str(t, "resp_listen");
    p->master = kvf_config_get("master");
    p->password_file = kvf_config_str(t, "resp_password_file");
    if ((st = kvf_parse_size(kvf_config_str(t, "resp_max_value"),
                             &p->max_value)) != KVF_OK ||
        (st = kvf_parse_size(kvf_config_str(t, "resp_pool"), &p->pool)) !=
            KVF_OK ||
        (st = kvf_config_u64(t, "resp_max_clients", &clients)) != KVF_OK ||
        (st = kvf_config_u64(t, "resp_idle_ms", &p->idle_ms)) != KVF_OK ||
        (st = kvf_config_u64(t, "resp_threads", &threads)) != KVF_OK) {
        return st;
    }
    v = kvf_config_get("store_timeout_ms");
    tmo = v != NULL ? strtoull(v, NULL, 10) : 5000;
    p->max_clients = (unsigned)clients;
    p->threads = (unsigned)threads;
    p->timeout_ms = (unsigned)tmo;
    return KVF_OK;
}

kvf_status_t kvf_server_resp_password(const char *listen, char *out,
                                      size_t outlen)
{
    char host[KVF_HOST_MAX];
    uint16_t port;
    kvf_status_t st;

    if (listen == NULL || out == NULL) {
        return KVF_ERR_INVALID_PARAM;
    }
    st = kvf_sock_parse_addr(listen, host, sizeof(host), &port);
    return st != KVF_OK
               ? st
               : kvf_auth_token(host, KVF_RESP_TOKEN_LABEL, out, outlen);
}

/* Reads the password of a private file: a regular file of this user
 * with no group or other permission, not a symbolic link (core/auth
 * kvf_auth_read_private says what is wrong and the fix). */
static kvf_status_t kvf_resp_load_password_file(struct kvf_resp *s,
                                                const char *path)
{
    size_t n = 0;

    if (kvf_auth_read_private(path, s->password, 1, sizeof(s->password) - 1,
                              &n) != KVF_OK) {
        kvf_error("resp: password file %s refused", path);
        return KVF_ERR_INVALID_PARAM;
    }
    while (n > 0 &&
           (s->password[n - 1] == '\n' || s->password[n - 1] == '\r')) {
        n--;
    }
    s->password[n] = 0;
    s->pwlen = n;
    return n > 0 ? KVF_OK : KVF_ERR_INVALID_PARAM;
}

/* The password AUTH must give: the password file's when one is set, else
 * the one derived from the cluster secret (none when authentication is
 * off: insecure=1 without a secret file). */
static kvf_status_t kvf_resp_load_password(struct kvf_resp *s)
{
    const char *path = s->p.password_file;
    kvf_status_t st;

    if (path != NULL && path[0] != 0) {
        return kvf_resp_load_password_file(s, path);
    }
    st =
        kvf_server_resp_password(s->p.listen, s->password, sizeof(s->password));
    s->pwlen = st == KVF_OK ? strlen(s->password) : 0;
    if (st == KVF_OK && s->pwlen == 0) {
        kvf_warn("resp: %s serves without AUTH (insecure=1, no secret_file)",
                 s->p.listen);
    }
    return st;
}

static kvf_status_t kvf_resp_listen(struct kvf_resp *s)
{
    char host[KVF_HOST_MAX];
    uint16_t port;
    kvf_status_t st;
    int fl;

    st = kvf_sock_parse_addr(s->p.listen, host, sizeof(host), &port);
    if (st == KVF_OK) {
        st = kvf_auth_check_bind(host);
    }
    if (st == KVF_OK) {
        st = kvf_sock_listen(host, port, 511, &s->lfd, &port);
    }
    if (st != KVF_OK) {
        return st;
    }
    fl = fcntl(s->lfd, F_GETFL);
    fcntl(s->lfd, F_SETFL, fl | O_NONBLOCK);
    snprintf(s->addr, sizeof(s->addr), "%s:%u", host, (unsigned)port);
    return KVF_OK;
}

/* Sets every loop up, then starts their threads (a loop may hand a
 * connection to any other as soon as it runs). */
static kvf_status_t kvf_resp_start_loops(struct kvf_resp *s)
{
    struct epoll_event e;
    unsigned i;

    for (i = 0; i < s->nloops; i++) {
        kvf_resp_loop_t *lp = &s->loops[i];

        lp->rbuf = malloc(KVF_RESP_RECV);
        lp->ep = epoll_create1(EPOLL_CLOEXEC);
        lp->wakefd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        if (lp->rbuf == NULL || lp->ep < 0 || lp->wakefd < 0) {
            return KVF_ERR_NO_MEMORY;
        }
        e.events = EPOLLIN | EPOLLEXCLUSIVE;
        e.data.ptr = &s->lfd;
        epoll_ctl(lp->ep, EPOLL_CTL_ADD, s->lfd, &e);
        e.events = EPOLLIN;
        e.data.ptr = &s->stopfd;
        epoll_ctl(lp->ep, EPOLL_CTL_ADD, s->stopfd, &e);
        e.data.ptr = &lp->wakefd;
        epoll_ctl(lp->ep, EPOLL_CTL_ADD, lp->wakefd, &e);
    }
    for (i = 0; i < s->nloops; i++) {
        kvf_resp_loop_t *lp = &s->loops[i];

        if (pthread_create(&lp->thr, NULL, kvf_resp_loop_main, lp) != 0) {
            lp->thr = 0;
            return KVF_ERR_NO_MEMORY;
        }
    }
    return KVF_OK;
}

/* The limits of kvf_resp_limits_t from their config keys. */
static kvf_status_t kvf_resp_read_limits(struct kvf_resp *s)
{
    const kvf_config_table_t *t = &kvf_resp_config;
    uint64_t per, unauth, slow;
    kvf_status_t st;

    if ((st = kvf_config_u64(t, "resp_auth_timeout_ms",
                             &s->lim.auth_timeout_ms)) != KVF_OK ||
        (st = kvf_config_u64(t, "resp_conns_per_addr", &per)) != KVF_OK ||
        (st = kvf_config_u64(t, "resp_unauth_per_addr", &unauth)) != KVF_OK ||
        (st = kvf_parse_size(kvf_config_str(t, "resp_slow_mem"), &slow)) !=
            KVF_OK) {
        return st;
    }
    s->lim.per_addr = per == 0 ? 1 : (per > UINT32_MAX ? UINT32_MAX : (unsigned)per);
    s->lim.unauth_per_addr =
        unauth == 0 ? 1 : (unauth > UINT32_MAX ? UINT32_MAX : (unsigned)unauth);
    s->lim.slow_mem = (size_t)slow;
    return KVF_OK;
}

/* One call to the master before serving: a master that closes this
 * client's connections (it requires the cluster secret, which this door
 * lacks or holds another of) is told now, not by every command. */
static kvf_status_t kvf_resp_probe(struct kvf_resp *s)
{
    kvf_status_t st = kvf_store_exists(s->st, "kvferry-resp-start-probe");

    if (st == KVF_OK || st == KVF_ERR_NO_KEY || st == KVF_ERR_NOT_READY) {
        return KVF_OK;
    }
    if (st == KVF_ERR_CONN_RESET || st == KVF_ERR_AUTH) {
        kvf_error("resp: the master at %s closed this door's connection: it "
                  "requires the cluster secret, which this door does not "
                  "hold (insecure=1 with no secret_file?) or holds another "
                  "of; give the door the master's secret_file (see "
                  "docs/security.md)",
                  s->p.master);
        return KVF_ERR_AUTH;
    }
    kvf_error("resp: the master at %s did not answer: %s", s->p.master,
              kvf_status_str(st));
    return st;
}

static kvf_status_t kvf_resp_open(struct kvf_resp *s)
{
    kvf_store_params_t sp = {.field_mask = KVF_STORE_PARAM_MASTER |
                                           KVF_STORE_PARAM_TIMEOUT,
                             .master = s->p.master,
                             .timeout_ms = s->p.timeout_ms};
    uint64_t spread;
    kvf_status_t st;

    if ((st = kvf_resp_read_limits(s)) != KVF_OK ||
        (st = kvf_resp_load_password(s)) != KVF_OK ||
        (st = kvf_store_connect(&sp, &s->st)) != KVF_OK ||
        (st = kvf_resp_probe(s)) != KVF_OK) {
        return st;
    }
    if ((st = kvf_resp_pool_init(s)) != KVF_OK ||
        (st = kvf_resp_listen(s)) != KVF_OK) {
        return st;
    }
    if ((st = kvf_config_u64(&kvf_resp_config, "resp_spread", &spread)) !=
        KVF_OK) {
        return st;
    }
    s->spread = spread != 0;
    if ((st = kvf_config_u64(&kvf_resp_config, "resp_views", &spread)) !=
        KVF_OK) {
        return st;
    }
    s->views = spread != 0;
    if (s->p.max_value > s->pool.len) {
        s->p.max_value = s->pool.len; /* a value must fit the pool */
    }
    s->stopfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (s->stopfd < 0) {
        return KVF_ERR_NO_MEMORY;
    }
    return kvf_resp_start_loops(s);
}

kvf_status_t kvf_server_resp_start(const kvf_server_resp_params_t *params,
                                   kvf_resp_h *resp_p)
{
    struct kvf_resp *s;
    kvf_status_t st;

    if (params == NULL || resp_p == NULL || params->listen == NULL ||
        params->master == NULL || params->pool == 0) {
        return KVF_ERR_INVALID_PARAM;
    }
    s = calloc(1, sizeof(*s));
    if (s == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    s->p = *params;
    s->lfd = s->stopfd = -1;
    for (int i = 0; i < KVF_RESP_SET_STRIPES; i++) {
        pthread_mutex_init(&s->set_mu[i], NULL);
    }
    pthread_mutex_init(&s->fmu, NULL);
    pthread_mutex_init(&s->gmu, NULL);
    kvf_cond_init(&s->fend);
    s->nloops = params->threads == 0 ? 1 : params->threads;
    if (s->nloops > KVF_RESP_LOOPS_MAX) {
        s->nloops = KVF_RESP_LOOPS_MAX;
    }
    if (s->p.max_clients == 0) {
        s->p.max_clients = 1;
    }
    for (unsigned i = 0; i < s->nloops; i++) {
        s->loops[i].srv = s;
        s->loops[i].ep = s->loops[i].wakefd = -1;
        pthread_mutex_init(&s->loops[i].hmu, NULL);
    }
    st = kvf_resp_open(s);
    if (st != KVF_OK) {
        kvf_server_resp_stop(s);
        return st;
    }
    *resp_p = s;
    return KVF_OK;
}

/* What the limits refused, logged at stop (INFO shows it live). */
static void kvf_resp_log_limits(struct kvf_resp *s)
{
    const kvf_resp_stats_t *t = &s->stats;

    kvf_info("resp: refused at max clients %llu, per address %llu; "
             "unauthenticated connections closed for room %llu, past the "
             "AUTH deadline %llu; AUTH ok %llu, wrong %llu, refused "
             "unchecked %llu; protocol errors %llu; GETs refused over "
             "resp_slow_mem %llu",
             (unsigned long long)atomic_load(&t->refused_max),
             (unsigned long long)atomic_load(&t->refused_addr),
             (unsigned long long)atomic_load(&t->evicted),
             (unsigned long long)atomic_load(&t->auth_timeouts),
             (unsigned long long)atomic_load(&t->auth_ok),
             (unsigned long long)atomic_load(&t->auth_wrong),
             (unsigned long long)atomic_load(&t->auth_throttled),
             (unsigned long long)atomic_load(&t->proto_errors),
             (unsigned long long)atomic_load(&t->slow_refused));
}

void kvf_server_resp_stop(kvf_resp_h s)
{
    uint64_t one = 1;
    unsigned i;

    if (s == NULL) {
        return;
    }
    atomic_store(&s->stop, 1);
    if (s->stopfd >= 0) {
        (void)!write(s->stopfd, &one, sizeof(one));
    }
    for (i = 0; i < s->nloops; i++) {
        if (s->loops[i].thr != 0) {
            pthread_join(s->loops[i].thr, NULL);
        }
    }
    for (i = 0; i < s->nloops; i++) {
        kvf_resp_loop_t *lp = &s->loops[i];

        kvf_resp_loop_drop_hand(lp);
        if (lp->ep >= 0) {
            close(lp->ep);
        }
        if (lp->wakefd >= 0) {
            close(lp->wakefd);
        }
        free(lp->rbuf);
        pthread_mutex_destroy(&lp->hmu);
    }
    if (s->stopfd >= 0) {
        close(s->stopfd);
    }
    if (s->lfd >= 0) {
        close(s->lfd);
    }
    if (s->st != NULL) {
        kvf_info("resp: GETs sent from store views %llu (copied out of "
                 "views whose lease was ending %llu), read through the "
                 "copy path %llu",
                 (unsigned long long)atomic_load(&s->nview),
                 (unsigned long long)atomic_load(&s->nrescue),
                 (unsigned long long)atomic_load(&s->ncopy));
        kvf_info("resp: SETs stored %llu, answered by another loop's "
                 "store of their key %llu",
                 (unsigned long long)atomic_load(&s->nstored),
                 (unsigned long long)atomic_load(&s->ncovered));
        kvf_resp_log_limits(s);
        kvf_resp_pool_fini(s);
        kvf_store_disconnect(s->st);
    }
    explicit_bzero(s->password, sizeof(s->password));
    for (i = 0; i < KVF_RESP_SET_STRIPES; i++) {
        pthread_mutex_destroy(&s->set_mu[i]);
    }
    pthread_mutex_destroy(&s->fmu);
    kvf_resp_guard_fini(s);
    pthread_mutex_destroy(&s->gmu);
    pthread_cond_destroy(&s->fend);
    free(s);
}

const char *kvf_server_resp_address(kvf_resp_h s)
{
    return s->addr;
}
