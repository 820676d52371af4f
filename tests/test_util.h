/*
 * Helpers shared by integration tests: spawn `kvferry target` (path from
 * $KVF_BIN) and read its segment line, regenerate a target pool's bytes
 * from its seed, pick random block indices, count open file descriptors,
 * and give every test binary (and the processes it starts) a cluster
 * secret of its own: unless KVF_SECRET_FILE is set, a 0600 temporary
 * file is created at load time, named in KVF_SECRET_FILE and removed at
 * exit, so tests never read or create the user's $HOME/.kvferry/secret.
 */
#ifndef KVF_TEST_UTIL_H
#define KVF_TEST_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "core/rng.h"
#include "core/wire.h"

typedef struct kvf_test_target {
    pid_t pid;
    char segment[128];
    uint64_t pool_addr;
    uint64_t pool_len;
} kvf_test_target_t;

/* Starts `kvferry target --listen 127.0.0.1:0 --pool LEN --seed SEED
 * [extra...]` and waits (at most 30 s) for its segment line. */
int kvf_test_target_start(kvf_test_target_t *t, uint64_t pool_len,
                          uint64_t seed, const char *extra1,
                          const char *extra2);
/* SIGTERM then wait (SIGKILL after 5 s). Returns the exit status. */
int kvf_test_target_stop(kvf_test_target_t *t);

/* The bytes `kvferry target --seed SEED` filled its pool with. */
void kvf_test_pool_bytes(void *buf, size_t len, uint64_t seed);

int kvf_test_fd_count(void);

/* The frame tag state of the authenticated connection fd that a test
 * opened itself (kvf_test_connect, kvs_raw_connect), for the framing
 * calls (kvf_sp_call(fd, kvf_test_mac(fd), ...)); a table by fd, so the
 * state of a closed fd is replaced when its number is used again. */
kvf_wire_mac_t *kvf_test_mac(int fd);
/* kvf_auth_connect to host:port for proto, its tag state kept for
 * kvf_test_mac(fd). Returns the status; *fd_p on success. */
int kvf_test_connect(const char *host, uint16_t port, int timeout_ms,
                     const char *proto, int *fd_p);

/* kvf_auth_client as a store client on fd, a socket the test connected
 * itself to host (addr is for the log), within 5 s; the tag state kept
 * for kvf_test_mac(fd). Returns the status. */
int kvf_test_auth_client(int fd, const char *host, const char *addr);

/* A tcp connection bound to address src (127.0.0.x: another client's
 * address) to addr "host:port"; the fd, or -1. */
int kvf_test_connect_from(const char *src, const char *addr);
/* kvf_test_connect_from, then kvf_test_auth_client as a store client. */
int kvf_test_auth_from(const char *src, const char *addr);

/* n distinct random block indices among nslots (malloc'd). */
uint32_t *kvf_test_pick(kvf_rng_t *rng, uint32_t nslots, uint32_t n);

/* Writes a fresh 0600 secret file of 32 random bytes at a temporary
 * path (out, outlen). 0, or -1. */
int kvf_test_secret_new(char *out, size_t outlen);

#endif
