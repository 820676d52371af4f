/*
 * Store integration tests, shared harness: spawns `kvferry master` and
 * `kvferry node` processes on 127.0.0.1 (they die with the test), reads
 * the line each prints to learn its address, scrapes the master's HTTP
 * endpoint, connects clients with registered buffers, and sends raw
 * frames. Every wait is bounded.
 */
#ifndef KVF_TEST_STORE_HARNESS_H
#define KVF_TEST_STORE_HARNESS_H

#include <kvferry/kvferry.h>
#include <kvferry/store.h>

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "test_util.h"

typedef struct kvs_proc {
    pid_t pid;
    char addr[128];               /* master RPC address or node segment */
    char http[128];               /* master HTTP address */
    uint64_t pool_addr, pool_len; /* a node's pool, as it printed it */
} kvs_proc_t;

/* Skips the test (exit 77) when KVF_BIN is not set. */
const char *kvs_bin(void);

/* `kvferry master --listen 127.0.0.1:PORT --http 127.0.0.1:0 EXTRA...`
 * (port 0 = any; no --http of its own when extra has one); extra is
 * NULL-terminated. Returns 0 on success. */
int kvs_master(kvs_proc_t *p, unsigned port, const char *const *extra);
/* `kvferry node --pool POOL --master MASTER EXTRA...`; returns the exit
 * status (>= 0) if it exits before printing its line, -1 on a spawn
 * failure, 0 once running (p filled). */
int kvs_node(kvs_proc_t *p, const char *master, const char *pool,
             const char *const *extra);
/* SIGTERM (or sig), then waits at most 5 s, then SIGKILL. */
void kvs_stop(kvs_proc_t *p, int sig);

/* GET http://addr/path with the bearer token of the cluster secret;
 * returns the HTTP code, body in buf. */
int kvs_http(const char *addr, const char *path, char *buf, size_t cap);
/* The same with the Authorization header given (NULL: none). */
int kvs_http_auth(const char *addr, const char *path, const char *auth,
                  char *buf, size_t cap);
/* A value from /metrics (kvferry_store_NAME), or -1. */
long kvs_metric(const char *http, const char *name);
/* Polls metric until it equals want or timeout_ms passes. */
int kvs_metric_wait(const char *http, const char *name, long want,
                    int timeout_ms);
/* Polls metric until it is at most max or timeout_ms passes (a count
 * back to where it was: one still falling from before the baseline was
 * read ends lower). */
int kvs_metric_wait_le(const char *http, const char *name, long max,
                       int timeout_ms);

/* A client and one registered buffer of len bytes. */
typedef struct kvs_client {
    kvf_store_h st;
    kvf_region_h reg;
    unsigned char *buf;
    size_t len;
} kvs_client_t;

int kvs_client_open(kvs_client_t *c, const char *master, size_t len);
void kvs_client_close(kvs_client_t *c);

/* Fills buf with bytes derived from seed. */
void kvs_fill(void *buf, size_t len, uint64_t seed);

/* Raw store RPC connection to addr, authenticated (the exchange of
 * core/auth done, no frame sent); -1 on failure. */
int kvs_raw_connect(const char *addr);
/* Plain tcp connection to addr (HTTP, or unauthenticated bytes); -1 on
 * failure. */
int kvs_plain_connect(const char *addr);

void kvs_sleep_ms(int ms);

#endif
