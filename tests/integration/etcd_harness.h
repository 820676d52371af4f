/*
 * A real etcd for tests: started with scripts/etcd.sh in a temporary
 * folder (free ports), stopped at the end; and small fake HTTP servers
 * (silent, garbage, not-etcd) for the client's error paths.
 */
#ifndef KVF_TEST_ETCD_HARNESS_H
#define KVF_TEST_ETCD_HARNESS_H

#include <stddef.h>

typedef struct kvf_test_etcd {
    char dir[256];
    char endpoint[64]; /* "127.0.0.1:PORT" */
} kvf_test_etcd_t;

/* 0 started, 77 etcd is not installed, -1 failure. */
int kvf_test_etcd_start(kvf_test_etcd_t *t);
/* The same over https with client certificates and etcd's auth on
 * (scripts/etcd.sh start-tls): t->dir/tls is an etcd_tls_dir that logs
 * in as root, t->dir/tls-nobody one with a good certificate and no etcd
 * user. */
int kvf_test_etcd_start_tls(kvf_test_etcd_t *t);
/* kvf_test_etcd_start for a test's main: 0 started, else the exit code
 * (77 skipped, 1 failure) after saying why. */
int kvf_test_etcd_up(kvf_test_etcd_t *t);
void kvf_test_etcd_stop(kvf_test_etcd_t *t);
/* SIGSTOP / SIGCONT of the etcd process. */
int kvf_test_etcd_signal(kvf_test_etcd_t *t, int sig);

enum kvf_test_http_mode {
    KVF_TEST_HTTP_SILENT,  /* accepts, reads, never answers */
    KVF_TEST_HTTP_GARBAGE, /* HTTP 200 with a body that is not JSON */
    KVF_TEST_HTTP_NOTETCD  /* HTTP 404 with an HTML page */
};

typedef struct kvf_test_http kvf_test_http_t;

/* Starts a fake server on 127.0.0.1; its address goes to addr. */
kvf_test_http_t *kvf_test_http_start(int mode, char *addr, size_t len);
void kvf_test_http_stop(kvf_test_http_t *h);

/* A TCP proxy in front of etcd (one thread, poll): freeze stops it
 * forwarding (a partition: requests wait, then time out), thaw drops
 * the connections it held and forwards again. */
typedef struct kvf_test_proxy kvf_test_proxy_t;

kvf_test_proxy_t *kvf_test_proxy_start(const char *upstream, char *addr,
                                       size_t len);
void kvf_test_proxy_freeze(kvf_test_proxy_t *p, int frozen);
void kvf_test_proxy_stop(kvf_test_proxy_t *p);
#endif
