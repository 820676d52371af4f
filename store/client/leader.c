/*
 * The client following the master leader. A handle given several
 * masters (config `master` = "h1:p1,h2:p2") or etcd (`metadata` =
 * etcd://...) sends a request that failed because its master is gone
 * (connect refused, reset, closed) or is not the leader (a standby, a
 * deposed leader: KVF_ERR_NOT_LEADER) to the next candidate: etcd's
 * leader when etcd names one, else the next of the list. Switching
 * bumps master_gen (connections to the old master are closed, not
 * pooled) and peer_epoch (reservations made with the old master are
 * not used). Every call keeps its deadline: the retries stop when it
 * has passed (base.c). Each switch also picks the link to the new
 * master: its abstract unix socket when it is on this host and the
 * engine may use a same-host transport, else tcp.
 *
 * Part of the client base: calls nothing else of store/client.
 */
#include "store/client/client_int.h"
#include "core/alloc.h"
#include "core/log.h"
#include "core/time.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

int kvf__sfollow_worth(kvf_store_h st, kvf_status_t status)
{
    if (!kvf_sp_masters_many(&st->masters)) {
        return 0;
    }
    return status == KVF_ERR_NOT_LEADER || status == KVF_ERR_CONNECT ||
           status == KVF_ERR_CONN_RESET || status == KVF_ERR_PEER_CLOSED ||
           status == KVF_ERR_PEER_UNREACHABLE;
}

/* Sleeps up to ms, not past deadline_ms. */
static void kvf_store_pause(unsigned ms, uint64_t deadline_ms)
{
    uint64_t now = kvf_time_ms();

    if (now < deadline_ms) {
        usleep((useconds_t)((deadline_ms - now < ms ? deadline_ms - now : ms) *
                            1000));
    }
}

/* May the engine use a same-host transport? ("auto", or any name but
 * tcp in its list.) If not, the master RPC stays on tcp as well. */
static int kvf_store_same_host_ok(const char *transports)
{
    char list[128], *tok, *save;

    if (transports == NULL || strcmp(transports, "auto") == 0) {
        return 1;
    }
    snprintf(list, sizeof(list), "%s", transports);
    for (tok = strtok_r(list, ", ", &save); tok != NULL;
         tok = strtok_r(NULL, ", ", &save)) {
        if (strcmp(tok, "tcp") != 0) {
            return 1;
        }
    }
    return 0;
}

kvf_status_t kvf__spick_link(kvf_store_h st)
{
    kvf_status_t status;
    uint64_t v;

    st->unix_name[0] = '\0';
    status = kvf_config_u64(&kvf_store_config, "master_unix", &v);
    if (status != KVF_OK) {
        return status;
    }
    if (v != 0 && kvf_store_same_host_ok(kvf_engine_transports(st->engine)) &&
        !kvf_sp_unix_name(st->host, st->port, 0, st->unix_name,
                          sizeof(st->unix_name))) {
        st->unix_name[0] = '\0';
    }
    return KVF_OK;
}

/* kvf__spick_link, and tcp alone if the config cannot be read. */
static void kvf_store_pick_unix(kvf_store_h st)
{
    if (kvf__spick_link(st) != KVF_OK) {
        st->unix_name[0] = '\0';
    }
}

kvf_status_t kvf__sfollow(kvf_store_h st, const char *why)
{
    return kvf__sfollow_by(st, why, kvf_time_ms() + st->timeout_ms);
}

kvf_status_t kvf__sfollow_by(kvf_store_h st, const char *why,
                             uint64_t deadline_ms)
{
    char addr[KVF_HOST_MAX + 8], host[KVF_HOST_MAX];
    uint64_t now = kvf_time_ms();
    unsigned lookup_ms = st->timeout_ms / 4 + 1;
    kvf_sconn_t *idle, *c;
    kvf_status_t status;
    uint16_t port;

    /* the etcd look-up is bounded by a fraction of the call's time, and
     * by what is left of it */
    if (now >= deadline_ms) {
        return KVF_ERR_TIMEOUT;
    }
    if (deadline_ms - now < lookup_ms) {
        lookup_ms = (unsigned)(deadline_ms - now);
    }
    status =
        kvf_sp_masters_pick(&st->masters, lookup_ms, addr, sizeof(addr), NULL);
    if (status == KVF_OK) {
        status = kvf_sock_parse_addr(addr, host, sizeof(host), &port);
    }
    if (status != KVF_OK) {
        kvf_store_pause(20, deadline_ms); /* no leader yet: do not spin */
        return status;
    }
    pthread_mutex_lock(&st->lock);
    if (strcmp(host, st->host) == 0 && port == st->port && why != NULL &&
        st->masters.n <= 1) {
        /* etcd still names the master that failed: wait a little */
        pthread_mutex_unlock(&st->lock);
        kvf_store_pause(20, deadline_ms);
        return KVF_OK;
    }
    memcpy(st->host, host, sizeof(st->host));
    st->port = port;
    kvf_store_pick_unix(st);
    st->master_gen++;
    idle = st->idle;
    st->idle = NULL;
    pthread_mutex_unlock(&st->lock);
    __atomic_add_fetch(&st->peer_epoch, 1, __ATOMIC_RELEASE);
    while ((c = idle) != NULL) {
        idle = c->next;
        close(c->fd);
        kvf_wire_mac_free(&c->mac);
        kvf_sp_frame_free(&c->f);
        kvf_free(c);
    }
    if (why != NULL) {
        kvf_log_rl(KVF_LOG_WARN, "store: master now %s (%s)", addr, why);
    }
    return KVF_OK;
}
