/*
 * kvferry store daemons inside a process: the master (metadata, leases,
 * eviction; RPC and an HTTP /metrics endpoint) and a storage node (a
 * memory pool registered with the transfer engine and the master).
 * `kvferry master` and `kvferry node` are these calls plus a wait for
 * SIGINT/SIGTERM.
 *
 *   kvf_server_master_params_t mp;
 *   kvf_master_h m;
 *   kvf_server_master_defaults(&mp);          // from the store config
 *   mp.listen = "127.0.0.1:0";
 *   kvf_server_master_start(&mp, &m);
 *   printf("%s\n", kvf_server_master_address(m));
 *   kvf_server_master_stop(m);
 */
#ifndef KVFERRY_SERVER_H
#define KVFERRY_SERVER_H

#include <kvferry/status.h>

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvf_master *kvf_master_h;
typedef struct kvf_node *kvf_node_h;

/* Most connection event loops a master runs. */
#define KVF_SERVER_LOOPS_MAX 64

typedef struct kvf_server_master_params {
    const char *listen;      /* RPC "host:port" (port 0 = any) */
    const char *http;        /* HTTP "host:port", NULL = none */
    uint64_t lease_ms;       /* read lease granted by a get */
    uint64_t put_timeout_ms; /* a put not committed by then is undone */
    uint64_t node_ttl_ms;    /* a node silent this long is dropped */
    uint64_t heartbeat_ms;   /* interval asked of nodes */
    double high_watermark;   /* evict when used / capacity exceeds this */
    double low_watermark;    /* ... down to this */
    unsigned replicas;       /* default replicas of a put */
    unsigned loops;          /* connection event loops; 0 = by CPUs */
} kvf_server_master_params_t;

/* Fills params from the store configuration (defaults, file, env). */
KVF_API kvf_status_t
kvf_server_master_defaults(kvf_server_master_params_t *params);
KVF_API kvf_status_t kvf_server_master_start(
    const kvf_server_master_params_t *params, kvf_master_h *master_p);
/* Stops serving, closes every connection, frees all metadata. */
KVF_API void kvf_server_master_stop(kvf_master_h master);
/* The RPC and HTTP addresses bound ("" for HTTP when off). */
KVF_API const char *kvf_server_master_address(kvf_master_h master);
KVF_API const char *kvf_server_master_http(kvf_master_h master);

typedef struct kvf_server_node_params {
    const char *master;     /* master "host:port" */
    const char *listen;     /* engine "host:port" (port 0 = any) */
    uint64_t pool;          /* pool bytes */
    uint64_t claim;         /* bytes told to the master; 0 = pool (tests) */
    const char *transports; /* engine transports (NULL = auto) */
    int anon;               /* private anonymous pool (else shareable) */
    int lazy;               /* do not fault the pool in at start */
    unsigned timeout_ms;    /* bound on every wait */
    const char *disk;       /* disk tier directory (NULL: none) */
    uint64_t disk_size;     /* bytes of the disk tier's file */
} kvf_server_node_params_t;

/* Fills params: master and timeout from the store configuration, listen
 * on 127.0.0.1:0, a 1 GiB pool. */
KVF_API kvf_status_t kvf_server_node_defaults(kvf_server_node_params_t *params);
/* Maps and registers the pool, starts the engine and registers with the
 * master; fails when that first registration fails. */
KVF_API kvf_status_t kvf_server_node_start(
    const kvf_server_node_params_t *params, kvf_node_h *node_p);
KVF_API void kvf_server_node_stop(kvf_node_h node);
/* The node's engine segment name and its pool's address. */
KVF_API const char *kvf_server_node_segment(kvf_node_h node);
KVF_API void *kvf_server_node_pool(kvf_node_h node);

/* The RESP2 front door (`kvferry resp`): a Redis-protocol server on the
 * store for Redis clients (LMCache resp://, redis-py, redis-cli). */
typedef struct kvf_resp *kvf_resp_h;

typedef struct kvf_server_resp_params {
    const char *listen;        /* "host:port" (port 0 = any) */
    const char *master;        /* the store master "host:port" */
    unsigned threads;          /* event loops (0 = 1) */
    unsigned max_clients;      /* connections served at once */
    uint64_t max_value;        /* longest value (bulk) accepted */
    uint64_t pool;             /* registered value pool bytes */
    uint64_t idle_ms;          /* idle connections closed (0 = never) */
    const char *password_file; /* 0600 file with AUTH's password; NULL/""
                                  = derived from the cluster secret */
    unsigned timeout_ms;       /* bound on every store wait */
} kvf_server_resp_params_t;

/* Fills params from the configuration (keys resp_*, master,
 * store_timeout_ms). */
KVF_API kvf_status_t kvf_server_resp_defaults(kvf_server_resp_params_t *params);
/* Connects to the master, registers the pool and starts serving. */
KVF_API kvf_status_t kvf_server_resp_start(
    const kvf_server_resp_params_t *params, kvf_resp_h *resp_p);
/* Stops serving and closes every connection. */
KVF_API void kvf_server_resp_stop(kvf_resp_h resp);
/* The address bound ("host:port"). */
KVF_API const char *kvf_server_resp_address(kvf_resp_h resp);
/* The password AUTH must give to a door listening on listen ("host:port")
 * without a password file: hex HMAC-SHA256 of the cluster secret under a
 * label of its own (so it reveals neither the secret nor the master's
 * HTTP token), into out (at least 65 bytes); empty when authentication is
 * off (insecure=1 without secret_file). */
KVF_API kvf_status_t kvf_server_resp_password(const char *listen, char *out,
                                              size_t outlen);

#ifdef __cplusplus
}
#endif

#endif
