/*
 * Finding the store master (masters.h): a static list, or etcd's leader
 * key with the list as the fallback.
 */
#include "store/proto/masters.h"
#include "coord/election.h"
#include "coord/etcd.h"
#include <kvferry/config.h>
#include "core/log.h"

#include <stdio.h>
#include <string.h>

void kvf_sp_leader_key(char *buf, size_t len)
{
    snprintf(buf, len, "%smaster/leader",
             kvf_config_str(&kvf_etcd_config, "etcd_prefix"));
}

kvf_status_t kvf_sp_masters_init(kvf_sp_masters_t *ms, const char *list)
{
    const char *p = list ? list : "", *end, *meta;
    char host[KVF_HOST_MAX];
    uint16_t port;
    size_t n;

    memset(ms, 0, sizeof(*ms));
    while (*p != '\0') {
        end = strchr(p, ',');
        n = end ? (size_t)(end - p) : strlen(p);
        if (n == 0 || n >= sizeof(ms->addr[0]) || ms->n == KVF_SP_MASTERS_MAX) {
            kvf_error("master list '%s': an empty entry, or more than %d", list,
                      KVF_SP_MASTERS_MAX);
            return KVF_ERR_INVALID_PARAM;
        }
        memcpy(ms->addr[ms->n], p, n);
        ms->addr[ms->n][n] = '\0';
        if (kvf_sock_parse_addr(ms->addr[ms->n], host, sizeof(host), &port) !=
            KVF_OK) {
            return KVF_ERR_INVALID_PARAM;
        }
        ms->n++;
        p += n + (end != NULL);
    }
    meta = kvf_config_get("metadata");
    if (meta != NULL && strncmp(meta, "etcd://", 7) == 0) {
        snprintf(ms->etcd, sizeof(ms->etcd), "%s", meta);
        kvf_sp_leader_key(ms->key, sizeof(ms->key));
    }
    if (ms->n == 0 && ms->etcd[0] == '\0') {
        kvf_error("no master given (config `master`, or `metadata` = etcd)");
        return KVF_ERR_INVALID_PARAM;
    }
    return KVF_OK;
}

int kvf_sp_masters_many(const kvf_sp_masters_t *ms)
{
    return ms->n > 1 || ms->etcd[0] != '\0';
}

kvf_status_t kvf_sp_masters_pick(kvf_sp_masters_t *ms, unsigned timeout_ms,
                                 char *addr, size_t len, uint64_t *epoch_p)
{
    uint64_t epoch = 0;
    kvf_status_t st = KVF_ERR_NOT_FOUND;

    if (ms->etcd[0] != '\0') {
        st = kvf_elect_lookup(ms->etcd, timeout_ms, ms->key, addr, len, &epoch);
        if (st == KVF_OK) {
            if (epoch_p != NULL) {
                *epoch_p = epoch;
            }
            return KVF_OK;
        }
    }
    if (ms->n == 0) {
        kvf_log_rl(KVF_LOG_WARN, "no master leader in etcd (%s): %s", ms->key,
                   kvf_status_str(st));
        return st == KVF_ERR_NOT_FOUND ? KVF_ERR_NOT_LEADER : st;
    }
    snprintf(addr, len, "%s", ms->addr[ms->next % ms->n]);
    ms->next = (ms->next + 1) % ms->n;
    if (epoch_p != NULL) {
        *epoch_p = 0;
    }
    return KVF_OK;
}
