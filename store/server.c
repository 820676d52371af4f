/*
 * The public face of the store daemons (kvferry/server.h): thin wrappers
 * over the master's and the node's own start and stop calls, so programs
 * (the kvferry command) need no private header.
 */
#include <kvferry/server.h>

#include "store/master/master.h"
#include "store/node/node.h"
#include "store/proto/proto.h"

_Static_assert(KVF_SERVER_LOOPS_MAX == KVF_MASTER_LOOPS_MAX,
               "server.h and master.h agree on the loop limit");

kvf_status_t kvf_server_master_defaults(kvf_server_master_params_t *params)
{
    kvf_master_opts_t o;
    kvf_status_t st;

    if (params == NULL) {
        return KVF_ERR_INVALID_PARAM;
    }
    st = kvf_master_opts_default(&o);
    if (st != KVF_OK) {
        return st;
    }
    params->listen = o.listen;
    params->http = o.http;
    params->lease_ms = o.lease_ms;
    params->put_timeout_ms = o.put_timeout_ms;
    params->node_ttl_ms = o.node_ttl_ms;
    params->heartbeat_ms = o.heartbeat_ms;
    params->high_watermark = o.high_watermark;
    params->low_watermark = o.low_watermark;
    params->replicas = o.replicas;
    params->loops = o.loops;
    return KVF_OK;
}

kvf_status_t kvf_server_master_start(const kvf_server_master_params_t *params,
                                     kvf_master_h *master_p)
{
    kvf_master_opts_t o;
    kvf_status_t st;

    if (params == NULL || master_p == NULL) {
        return KVF_ERR_INVALID_PARAM;
    }
    /* fields the public params do not carry keep their configured value */
    st = kvf_master_opts_default(&o);
    if (st != KVF_OK) {
        return st;
    }
    o.listen = params->listen;
    o.http = params->http;
    o.lease_ms = params->lease_ms;
    o.put_timeout_ms = params->put_timeout_ms;
    o.node_ttl_ms = params->node_ttl_ms;
    o.heartbeat_ms = params->heartbeat_ms;
    o.high_watermark = params->high_watermark;
    o.low_watermark = params->low_watermark;
    o.replicas = params->replicas;
    o.loops = params->loops;
    return kvf_master_start(&o, master_p);
}

void kvf_server_master_stop(kvf_master_h master)
{
    kvf_master_stop(master);
}

const char *kvf_server_master_address(kvf_master_h master)
{
    return kvf_master_address(master);
}

const char *kvf_server_master_http(kvf_master_h master)
{
    return kvf_master_http_address(master);
}

kvf_status_t kvf_server_node_defaults(kvf_server_node_params_t *params)
{
    uint64_t v;
    kvf_status_t st;

    if (params == NULL) {
        return KVF_ERR_INVALID_PARAM;
    }
    st = kvf_config_u64(&kvf_store_config, "store_timeout_ms", &v);
    if (st != KVF_OK) {
        return st;
    }
    *params = (kvf_server_node_params_t){0};
    params->master = kvf_config_str(&kvf_store_config, "master");
    params->listen = "127.0.0.1:0";
    params->pool = 1ull << 30;
    params->timeout_ms = (unsigned)v;
    return KVF_OK;
}

kvf_status_t kvf_server_node_start(const kvf_server_node_params_t *params,
                                   kvf_node_h *node_p)
{
    kvf_node_opts_t o = {0};

    if (params == NULL || node_p == NULL) {
        return KVF_ERR_INVALID_PARAM;
    }
    o.master = params->master;
    o.listen = params->listen;
    o.pool = params->pool;
    o.claim = params->claim;
    o.transports = params->transports;
    o.anon = params->anon;
    o.lazy = params->lazy;
    o.timeout_ms = params->timeout_ms;
    o.disk = params->disk;
    o.disk_size = params->disk_size;
    return kvf_node_start(&o, node_p);
}

void kvf_server_node_stop(kvf_node_h node)
{
    kvf_node_stop(node);
}

const char *kvf_server_node_segment(kvf_node_h node)
{
    return kvf_node_segment(node);
}

void *kvf_server_node_pool(kvf_node_h node)
{
    return kvf_node_pool(node);
}
