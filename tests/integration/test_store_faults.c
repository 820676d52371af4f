/*
 * Integration test of the store's rules and failure handling, with real
 * processes on 127.0.0.1: LRU eviction order and the watermark, read
 * leases and pins protecting objects (a removed leased object keeps its
 * space until the lease ends), a node killed (SIGKILL) and dropped
 * after its TTL, a put whose client vanished reclaimed (and its late
 * commit refused), garbage and cut frames to the master (a stalled one
 * closed after the master's bound), oversized keys
 * and values, a node lying about its pool, a master restart that must
 * not serve locations from before it, and replicas corrupted on their
 * node (a good replica is used; with none, KVF_ERR_CHECKSUM), by single
 * gets and by batches hashed while their reads land, over shm and tcp.
 * After each fault the master must still serve.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "test_store_harness.h"
#include "store/proto/proto.h"
#include "core/sock.h"
#include "core/time.h"

#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MiB (1024 * 1024)

static void put_n(kvs_client_t *c, const char *fmt, int from, int to,
                  size_t len, unsigned flags)
{
    kvf_store_put_opts_t po = {.flags = flags};
    char key[64];
    int i;

    for (i = from; i < to; i++) {
        snprintf(key, sizeof(key), fmt, i);
        kvs_fill(c->buf, len, (uint64_t)i);
        assert_int_equal(kvf_store_put(c->st, key, c->buf, len, &po), KVF_OK);
    }
}

static kvf_status_t exists_fmt(kvs_client_t *c, const char *fmt, int i)
{
    char key[64];

    snprintf(key, sizeof(key), fmt, i);
    return kvf_store_exists(c->st, key);
}

static void test_eviction_order(void **state)
{
    static const char *const mopt[] = {"--high-watermark",
                                       "100",
                                       "--low-watermark",
                                       "100",
                                       "--lease",
                                       "50ms",
                                       NULL};
    kvs_proc_t m, n;
    kvs_client_t c;
    size_t got;
    int i;

    (void)state;
    assert_int_equal(kvs_master(&m, 0, mopt), 0);
    assert_int_equal(kvs_node(&n, m.addr, "8M", NULL), 0);
    assert_int_equal(kvs_client_open(&c, m.addr, 2 * MiB), 0);
    put_n(&c, "ev/%d", 0, 8, MiB, 0); /* the pool is full */
    kvs_sleep_ms(100);
    assert_int_equal(kvf_store_get(c.st, "ev/0", c.buf, MiB, &got, 0), KVF_OK);
    kvs_sleep_ms(100); /* lease over: only LRU order matters */
    put_n(&c, "ev/%d", 8, 10, MiB, 0);
    assert_int_equal(exists_fmt(&c, "ev/%d", 0), KVF_OK);
    assert_int_equal(exists_fmt(&c, "ev/%d", 1), KVF_ERR_NO_KEY);
    assert_int_equal(exists_fmt(&c, "ev/%d", 2), KVF_ERR_NO_KEY);
    for (i = 3; i < 10; i++) {
        assert_int_equal(exists_fmt(&c, "ev/%d", i), KVF_OK);
    }
    assert_int_equal(kvs_metric(m.http, "evictions_total"), 2);
    /* what is left is intact */
    assert_int_equal(kvf_store_get(c.st, "ev/5", c.buf, MiB, &got, 0), KVF_OK);
    kvs_fill(c.buf + MiB, MiB, 5);
    assert_memory_equal(c.buf, c.buf + MiB, MiB);
    kvs_client_close(&c);
    kvs_stop(&n, 0);
    kvs_stop(&m, 0);
}

/* A hold is a look-up for a read to come: what it found is leased (not
 * evicted however full the pool) and becomes the most recently used; an
 * exists changes neither. */
static void test_hold(void **state)
{
    static const char *const mopt[] = {
        "--high-watermark", "100", "--low-watermark", "100", "--lease",
        "1500ms",           NULL};
    const char *keys[3] = {"hd/0", "hd/1", "hd/none"};
    kvf_status_t s[3];
    unsigned lease_ms = 0;
    kvs_proc_t m, n;
    kvs_client_t c;
    size_t got;
    int i;

    (void)state;
    assert_int_equal(kvs_master(&m, 0, mopt), 0);
    assert_int_equal(kvs_node(&n, m.addr, "8M", NULL), 0);
    assert_int_equal(kvs_client_open(&c, m.addr, 2 * MiB), 0);
    put_n(&c, "hd/%d", 0, 8, MiB, 0); /* the pool is full, hd/0 the coldest */
    assert_int_equal(kvf_store_exists(c.st, "hd/2"), KVF_OK);
    assert_int_equal(kvf_store_hold_batch(c.st, 3, keys, s, &lease_ms),
                     KVF_ERR_NO_KEY);
    assert_int_equal(s[0], KVF_OK);
    assert_int_equal(s[1], KVF_OK);
    assert_int_equal(s[2], KVF_ERR_NO_KEY);
    assert_int_equal(lease_ms, 1500);
    /* two puts evict two: not the held hd/0 and hd/1, but hd/2 (its
     * exists did not warm it) and hd/3 */
    put_n(&c, "hd/%d", 8, 10, MiB, 0);
    assert_int_equal(exists_fmt(&c, "hd/%d", 2), KVF_ERR_NO_KEY);
    assert_int_equal(exists_fmt(&c, "hd/%d", 3), KVF_ERR_NO_KEY);
    for (i = 0; i < 10; i++) {
        if (i != 2 && i != 3) {
            assert_int_equal(exists_fmt(&c, "hd/%d", i), KVF_OK);
        }
    }
    assert_int_equal(kvf_store_get(c.st, "hd/0", c.buf, MiB, &got, 0), KVF_OK);
    kvs_fill(c.buf + MiB, MiB, 0);
    assert_memory_equal(c.buf, c.buf + MiB, MiB);
    assert_int_equal(kvf_store_hold_batch(c.st, 0, keys, s, NULL),
                     KVF_ERR_INVALID_PARAM);
    assert_int_equal(kvf_store_hold_batch(c.st, 1, keys, NULL, NULL),
                     KVF_ERR_INVALID_PARAM);
    kvs_client_close(&c);
    kvs_stop(&n, 0);
    kvs_stop(&m, 0);
}

static void test_watermark(void **state)
{
    static const char *const mopt[] = {"--high-watermark",
                                       "50",
                                       "--low-watermark",
                                       "25",
                                       "--lease",
                                       "1ms",
                                       NULL};
    kvs_proc_t m, n;
    kvs_client_t c;

    (void)state;
    assert_int_equal(kvs_master(&m, 0, mopt), 0);
    assert_int_equal(kvs_node(&n, m.addr, "8M", NULL), 0);
    assert_int_equal(kvs_client_open(&c, m.addr, MiB), 0);
    put_n(&c, "wm/%d", 0, 4, MiB, 0); /* 50 %: not above */
    assert_int_equal(kvs_metric(m.http, "evictions_total"), 0);
    kvs_sleep_ms(10);
    put_n(&c, "wm/%d", 4, 5, MiB, 0); /* 62.5 % -> down to 25 % */
    assert_int_equal(kvs_metric(m.http, "evictions_total"), 3);
    assert_int_equal(kvs_metric(m.http, "used_bytes"), 2 * MiB);
    assert_int_equal(exists_fmt(&c, "wm/%d", 2), KVF_ERR_NO_KEY);
    assert_int_equal(exists_fmt(&c, "wm/%d", 3), KVF_OK);
    assert_int_equal(exists_fmt(&c, "wm/%d", 4), KVF_OK);
    kvs_client_close(&c);
    kvs_stop(&n, 0);
    kvs_stop(&m, 0);
}

static void test_lease_and_pin(void **state)
{
    static const char *const mopt[] = {"--high-watermark", "100", "--lease",
                                       "1500ms", NULL};
    kvs_proc_t m, n;
    kvs_client_t c;
    size_t got;

    (void)state;
    /* one client leases 3 of 4 MiB here: past the default lease budget
     * of a client (half the capacity, tested in test_hostile_limits) */
    setenv("KVF_CLIENT_MAX_LEASED_PCT", "100", 1);
    assert_int_equal(kvs_master(&m, 0, mopt), 0);
    unsetenv("KVF_CLIENT_MAX_LEASED_PCT");
    assert_int_equal(kvs_node(&n, m.addr, "4M", NULL), 0);
    assert_int_equal(kvs_client_open(&c, m.addr, MiB), 0);
    put_n(&c, "pin/%d", 0, 1, MiB, KVF_STORE_PIN);
    put_n(&c, "ls/%d", 0, 3, MiB, 0); /* full */
    assert_int_equal(kvf_store_get(c.st, "ls/1", c.buf, MiB, &got, 0), KVF_OK);
    assert_int_equal(kvf_store_get(c.st, "ls/2", c.buf, MiB, &got, 0), KVF_OK);
    assert_int_equal(kvf_store_get(c.st, "ls/0", c.buf, MiB, &got, 0), KVF_OK);
    /* everything is leased or pinned: nothing may be evicted */
    assert_int_equal(kvf_store_put(c.st, "ls/new", c.buf, MiB, NULL),
                     KVF_ERR_NO_SPACE);
    /* a leased object removed: its key goes, its space stays until the
     * lease ends (the reader's bytes are never reused under it) */
    assert_int_equal(kvf_store_remove(c.st, "ls/0"), KVF_OK);
    assert_int_equal(kvf_store_exists(c.st, "ls/0"), KVF_ERR_NO_KEY);
    assert_int_equal(kvs_metric(m.http, "removing"), 1);
    assert_int_equal(kvs_metric(m.http, "used_bytes"), 4 * MiB);
    assert_int_equal(kvf_store_put(c.st, "ls/new", c.buf, MiB, NULL),
                     KVF_ERR_NO_SPACE);
    assert_int_equal(kvs_metric(m.http, "evictions_total"), 0);
    /* the lease ends: the space comes back */
    assert_true(kvs_metric_wait(m.http, "removing", 0, 3000));
    assert_int_equal(kvs_metric(m.http, "used_bytes"), 3 * MiB);
    assert_int_equal(kvf_store_put(c.st, "ls/new", c.buf, MiB, NULL), KVF_OK);
    /* the coldest unpinned object goes, the pinned one stays */
    assert_int_equal(kvf_store_put(c.st, "ls/new2", c.buf, MiB, NULL), KVF_OK);
    assert_int_equal(kvf_store_exists(c.st, "ls/1"), KVF_ERR_NO_KEY);
    assert_int_equal(kvf_store_exists(c.st, "ls/2"), KVF_OK);
    assert_int_equal(kvf_store_exists(c.st, "pin/0"), KVF_OK);
    assert_int_equal(kvs_metric(m.http, "evictions_total"), 1);
    kvs_client_close(&c);
    kvs_stop(&n, 0);
    kvs_stop(&m, 0);
}

static void test_node_death(void **state)
{
    static const char *const mopt[] = {"--node-ttl", "1000ms", "--heartbeat",
                                       "200ms", NULL};
    kvf_store_put_opts_t two = {.replicas = 2};
    kvf_store_info_t info;
    kvs_proc_t m, n[2];
    kvs_client_t c;
    int on_a[8], lost = 0, i;
    size_t got;
    char key[32];

    (void)state;
    assert_int_equal(kvs_master(&m, 0, mopt), 0);
    assert_int_equal(kvs_node(&n[0], m.addr, "16M", NULL), 0);
    assert_int_equal(kvs_node(&n[1], m.addr, "16M", NULL), 0);
    assert_int_equal(kvs_client_open(&c, m.addr, 2 * MiB), 0);
    kvs_fill(c.buf, MiB, 42);
    assert_int_equal(kvf_store_put(c.st, "nd/x", c.buf, MiB, &two), KVF_OK);
    put_n(&c, "nd/y%d", 0, 8, 100000, 0);
    for (i = 0; i < 8; i++) {
        snprintf(key, sizeof(key), "nd/y%d", i);
        assert_int_equal(kvf_store_query(c.st, key, &info), KVF_OK);
        on_a[i] = strcmp(info.segment[0], n[0].addr) == 0;
        lost += on_a[i];
    }
    assert_true(lost > 0 && lost < 8); /* spread over both nodes */
    kvs_sleep_ms(1600);                /* leases from the queries end */
    kvs_stop(&n[0], SIGKILL);
    /* at once: the replica on the dead node fails, the other serves */
    memset(c.buf, 0, MiB);
    assert_int_equal(kvf_store_get(c.st, "nd/x", c.buf, 2 * MiB, &got, 0),
                     KVF_OK);
    kvs_fill(c.buf + MiB, MiB, 42);
    assert_memory_equal(c.buf, c.buf + MiB, MiB);
    /* puts before the TTL: one replica lands on the dead node (its write
     * fails, then its peer cannot even be opened), the other is written
     * and committed with the right checksum */
    for (i = 0; i < 3; i++) {
        snprintf(key, sizeof(key), "nd/during%d", i);
        kvs_fill(c.buf, MiB, 43 + (uint64_t)i);
        assert_int_equal(kvf_store_put(c.st, key, c.buf, MiB, &two), KVF_OK);
        assert_int_equal(kvf_store_query(c.st, key, &info), KVF_OK);
        assert_int_equal(info.replicas, 1);
        assert_int_equal(info.checksum, kvf_checksum(c.buf, MiB));
        memset(c.buf + MiB, 0, MiB);
        assert_int_equal(kvf_store_get(c.st, key, c.buf + MiB, MiB, &got, 0),
                         KVF_OK);
        assert_memory_equal(c.buf, c.buf + MiB, MiB);
    }
    /* after the TTL the master forgets the node */
    assert_true(kvs_metric_wait(m.http, "nodes", 1, 4000));
    assert_int_equal(kvs_metric(m.http, "nodes_lost_total"), 1);
    assert_int_equal(kvs_metric(m.http, "objects_lost_total"), lost);
    assert_int_equal(kvs_metric(m.http, "capacity_bytes"), 16 * MiB);
    for (i = 0; i < 8; i++) {
        assert_int_equal(exists_fmt(&c, "nd/y%d", i),
                         on_a[i] ? KVF_ERR_NO_KEY : KVF_OK);
    }
    assert_int_equal(kvf_store_query(c.st, "nd/x", &info), KVF_OK);
    assert_int_equal(info.replicas, 1);
    assert_string_equal(info.segment[0], n[1].addr);
    /* still serving: new puts land on the live node */
    put_n(&c, "nd/after%d", 0, 3, 50000, 0);
    kvs_client_close(&c);
    kvs_stop(&n[1], 0);
    kvs_stop(&m, 0);
}

/* Sends one store frame on fd and reads the reply (2 s). */
static kvf_status_t raw_call(int fd, uint8_t type, uint32_t count, kvf_wr_t *w,
                             kvf_sp_frame_t *f)
{
    return kvf_sp_call(fd, kvf_test_mac(fd), type, 7, count, w, f,
                       kvf_time_ms() + 2000);
}

static uint64_t raw_put_start(const char *addr, const char *key, size_t len,
                              int *fd_p)
{
    kvf_sp_frame_t f = {0};
    uint64_t put_id;
    kvf_wr_t w;
    kvf_rd_t r;
    int fd;

    fd = kvs_raw_connect(addr);
    assert_true(fd >= 0);
    kvf_wr_init(&w);
    kvf_wr_str(&w, key);
    kvf_wr_u64(&w, len);
    kvf_wr_u8(&w, 1);
    kvf_wr_u8(&w, 0);
    assert_int_equal(raw_call(fd, KVF_SP_PUT_START, 1, &w, &f), KVF_OK);
    kvf_rd_init(&r, f.body, f.hdr.meta_len);
    assert_int_equal((int32_t)kvf_rd_u32(&r), KVF_OK);
    put_id = kvf_rd_u64(&r);
    kvf_wr_free(&w);
    kvf_sp_frame_free(&f);
    *fd_p = fd;
    return put_id;
}

static void test_zombie_put(void **state)
{
    static const char *const mopt[] = {"--put-timeout", "500ms", NULL};
    kvf_sp_frame_t f = {0};
    kvs_proc_t m, n;
    kvs_client_t c;
    uint64_t put_id;
    size_t got;
    kvf_wr_t w;
    kvf_rd_t r;
    int fd;

    (void)state;
    assert_int_equal(kvs_master(&m, 0, mopt), 0);
    assert_int_equal(kvs_node(&n, m.addr, "16M", NULL), 0);
    assert_int_equal(kvs_client_open(&c, m.addr, MiB), 0);
    /* a client allocates, then vanishes */
    raw_put_start(m.addr, "zombie", MiB, &fd);
    close(fd);
    assert_int_equal(kvf_store_exists(c.st, "zombie"), KVF_ERR_NOT_READY);
    assert_int_equal(kvf_store_get(c.st, "zombie", c.buf, MiB, &got, 0),
                     KVF_ERR_NOT_READY);
    assert_int_equal(kvf_store_put(c.st, "zombie", c.buf, MiB, NULL),
                     KVF_ERR_BUSY);
    assert_int_equal(kvs_metric(m.http, "used_bytes"), MiB);
    assert_true(kvs_metric_wait(m.http, "reclaimed_total", 1, 3000));
    assert_int_equal(kvs_metric(m.http, "used_bytes"), 0);
    assert_int_equal(kvs_metric(m.http, "pending_puts"), 0);
    /* a commit arriving after the reclaim is refused, nothing committed */
    put_id = raw_put_start(m.addr, "late", 4096, &fd);
    kvs_sleep_ms(900);
    kvf_wr_init(&w);
    kvf_wr_str(&w, "late");
    kvf_wr_u64(&w, put_id);
    kvf_wr_u64(&w, 1234);
    kvf_wr_u8(&w, 1);
    assert_int_equal(raw_call(fd, KVF_SP_PUT_END, 1, &w, &f), KVF_OK);
    kvf_rd_init(&r, f.body, f.hdr.meta_len);
    assert_int_equal((int32_t)kvf_rd_u32(&r), KVF_ERR_STALE);
    kvf_wr_free(&w);
    kvf_sp_frame_free(&f);
    close(fd);
    assert_int_equal(kvf_store_exists(c.st, "late"), KVF_ERR_NO_KEY);
    /* the key is free again */
    kvs_fill(c.buf, MiB, 8);
    assert_int_equal(kvf_store_put(c.st, "zombie", c.buf, MiB, NULL), KVF_OK);
    assert_int_equal(kvf_store_get(c.st, "zombie", c.buf, MiB, &got, 0),
                     KVF_OK);
    kvs_client_close(&c);
    kvs_stop(&n, 0);
    kvs_stop(&m, 0);
}

/* The reply on fd (closed after): its status, 1 when the master closed
 * without one, 0 with close_early (closed at once). */
static int raw_reply(int fd, int close_early)
{
    kvf_sp_frame_t f = {0};
    kvf_status_t st;
    int rc;

    if (close_early) {
        close(fd);
        return 0;
    }
    st = kvf_sp_recv(fd, kvf_test_mac(fd), &f, kvf_time_ms() + 3000,
                     kvf_time_ms() + 3000);
    rc = (st == KVF_OK) ? f.hdr.status : 1;
    kvf_sp_frame_free(&f);
    close(fd);
    return rc;
}

/* Sends raw bytes on a fresh connection; returns the reply's status, or
 * 1 when the master closed without a reply. */
static int raw_bytes(const char *addr, const void *buf, size_t len,
                     int close_early)
{
    int fd;

    fd = kvs_raw_connect(addr);
    assert_true(fd >= 0);
    assert_int_equal(kvf_sock_send_all(fd, buf, len, kvf_time_ms() + 2000),
                     KVF_OK);
    return raw_reply(fd, close_early);
}

/* A whole frame (header and body in buf) with its tag, as a holder of
 * the secret sends it; the reply's status, or 1. */
static int raw_sealed(const char *addr, const unsigned char *buf, size_t len)
{
    unsigned char tag[KVF_WIRE_TAG_LEN];
    int fd;

    fd = kvs_raw_connect(addr);
    assert_true(fd >= 0);
    kvf_wire_mac_seal(kvf_test_mac(fd), buf, buf + KVF_WIRE_HDR_LEN,
                      len - KVF_WIRE_HDR_LEN, tag);
    assert_int_equal(kvf_sock_send_all(fd, buf, len, kvf_time_ms() + 2000),
                     KVF_OK);
    assert_int_equal(
        kvf_sock_send_all(fd, tag, sizeof(tag), kvf_time_ms() + 2000), KVF_OK);
    return raw_reply(fd, 0);
}

static void hdr_bytes(unsigned char out[KVF_WIRE_HDR_LEN], uint8_t version,
                      uint8_t type, uint32_t meta, uint32_t count,
                      uint64_t data)
{
    kvf_frame_hdr_t h = {0};

    h.magic = KVF_WIRE_MAGIC;
    h.version = version;
    h.type = type;
    h.meta_len = meta;
    h.count = count;
    h.data_len = data;
    h.id = 1;
    kvf_frame_pack(&h, out);
}

static void test_garbage(void **state)
{
    static const char *const mopt[] = {"--put-timeout", "500ms", NULL};
    unsigned char junk[64], hdr[KVF_WIRE_HDR_LEN], frame[256];
    char bigkey[KVF_STORE_KEY_MAX + 2];
    kvf_sp_frame_t f = {0};
    kvs_proc_t m, n;
    kvs_client_t c;
    unsigned char *huge;
    kvf_region_h hreg;
    size_t got;
    kvf_wr_t w;
    kvf_rd_t r;
    long errors;
    int fd;

    (void)state;
    setenv("KVF_STORE_TIMEOUT_MS", "1000", 1); /* the master's frame bound */
    assert_int_equal(kvs_master(&m, 0, mopt), 0);
    unsetenv("KVF_STORE_TIMEOUT_MS");
    assert_int_equal(kvs_node(&n, m.addr, "16M", NULL), 0);
    kvs_fill(junk, sizeof(junk), 77);
    assert_int_equal(raw_bytes(m.addr, junk, sizeof(junk), 0),
                     KVF_ERR_PROTOCOL);
    hdr_bytes(hdr, 9, KVF_SP_GET, 0, 0, 0);
    assert_int_equal(raw_bytes(m.addr, hdr, sizeof(hdr), 0), KVF_ERR_VERSION);
    hdr_bytes(hdr, KVF_WIRE_VERSION, KVF_SP_GET, 100u << 20, 1, 0);
    assert_int_equal(raw_bytes(m.addr, hdr, sizeof(hdr), 0),
                     KVF_ERR_MSG_TOO_LARGE);
    hdr_bytes(hdr, KVF_WIRE_VERSION, KVF_SP_GET, 0, 0, 4096);
    assert_int_equal(raw_bytes(m.addr, hdr, sizeof(hdr), 0),
                     KVF_ERR_MSG_TOO_LARGE);
    /* a GET announcing 5 keys with an empty body */
    hdr_bytes(hdr, KVF_WIRE_VERSION, KVF_SP_GET, 0, 5, 0);
    assert_int_equal(raw_sealed(m.addr, hdr, sizeof(hdr)), KVF_ERR_PROTOCOL);
    /* cut short: 100 bytes announced, 10 sent, then gone */
    hdr_bytes(frame, KVF_WIRE_VERSION, KVF_SP_GET, 100, 1, 0);
    assert_int_equal(raw_bytes(m.addr, frame, KVF_WIRE_HDR_LEN + 10, 1), 0);
    /* cut short and left open: the master closes it after its bound */
    fd = kvs_raw_connect(m.addr);
    assert_true(fd >= 0);
    assert_int_equal(kvf_sock_send_all(fd, frame, KVF_WIRE_HDR_LEN + 10,
                                       kvf_time_ms() + 2000),
                     KVF_OK);
    assert_int_equal(kvf_sock_wait(fd, POLLIN, kvf_time_ms() + 4000), KVF_OK);
    assert_true(recv(fd, junk, sizeof(junk), 0) <= 0);
    close(fd);
    /* unknown type: an error reply, and the connection goes on */
    fd = kvs_raw_connect(m.addr);
    assert_true(fd >= 0);
    assert_int_equal(raw_call(fd, 0x30, 0, NULL, &f), KVF_ERR_PROTOCOL);
    kvf_wr_init(&w);
    kvf_wr_str(&w, "nothing");
    assert_int_equal(raw_call(fd, KVF_SP_EXISTS, 1, &w, &f), KVF_OK);
    kvf_rd_init(&r, f.body, f.hdr.meta_len);
    assert_int_equal((int32_t)kvf_rd_u32(&r), KVF_ERR_NO_KEY);
    /* an oversized key in a raw PUT_START: refused per key */
    memset(bigkey, 'k', sizeof(bigkey) - 1);
    bigkey[sizeof(bigkey) - 1] = '\0';
    w.len = 0;
    kvf_wr_str(&w, bigkey);
    kvf_wr_u64(&w, 4096);
    kvf_wr_u8(&w, 1);
    kvf_wr_u8(&w, 0);
    assert_int_equal(raw_call(fd, KVF_SP_PUT_START, 1, &w, &f), KVF_OK);
    kvf_rd_init(&r, f.body, f.hdr.meta_len);
    assert_int_equal((int32_t)kvf_rd_u32(&r), KVF_ERR_KEY_TOO_LARGE);
    kvf_wr_free(&w);
    kvf_sp_frame_free(&f);
    close(fd);
    errors = kvs_metric(m.http, "errors_total");
    assert_true(errors >= 8);
    /* the client API refuses the same before sending */
    assert_int_equal(kvs_client_open(&c, m.addr, MiB), 0);
    assert_int_equal(kvf_store_put(c.st, bigkey, c.buf, 10, NULL),
                     KVF_ERR_KEY_TOO_LARGE);
    assert_int_equal(kvf_store_put(c.st, "", c.buf, 10, NULL),
                     KVF_ERR_INVALID_PARAM);
    /* a value larger than any pool */
    huge = malloc(64 * MiB);
    assert_non_null(huge);
    assert_int_equal(kvf_engine_reg(kvf_store_engine(c.st), huge, 64 * MiB,
                                    KVF_MEM_HOST, 0, &hreg),
                     KVF_OK);
    assert_int_equal(kvf_store_put(c.st, "huge", huge, 32 * MiB, NULL),
                     KVF_ERR_MSG_TOO_LARGE);
    kvf_engine_dereg(kvf_store_engine(c.st), hreg);
    free(huge);
    /* and after all that the master serves */
    kvs_fill(c.buf, 65536, 1);
    assert_int_equal(kvf_store_put(c.st, "ok", c.buf, 65536, NULL), KVF_OK);
    assert_int_equal(kvf_store_get(c.st, "ok", c.buf + 65536, 65536, &got, 0),
                     KVF_OK);
    assert_memory_equal(c.buf, c.buf + 65536, 65536);
    assert_int_equal(kvs_metric(m.http, "nodes"), 1);
    kvs_client_close(&c);
    kvs_stop(&n, 0);
    kvs_stop(&m, 0);
}

static void test_lying_node(void **state)
{
    static const char *const lie[] = {"--claim", "64M", NULL};
    kvs_proc_t m, n;
    kvs_client_t c;
    size_t got;

    (void)state;
    assert_int_equal(kvs_master(&m, 0, NULL), 0);
    /* claims 64 MiB over an 8 MiB region: refused, the node exits */
    assert_true(kvs_node(&n, m.addr, "8M", lie) > 0);
    assert_int_equal(kvs_metric(m.http, "nodes"), 0);
    assert_int_equal(kvs_metric(m.http, "capacity_bytes"), 0);
    assert_int_equal(kvs_node(&n, m.addr, "8M", NULL), 0);
    assert_int_equal(kvs_metric(m.http, "capacity_bytes"), 8 * MiB);
    assert_int_equal(kvs_client_open(&c, m.addr, MiB), 0);
    kvs_fill(c.buf, MiB, 2);
    assert_int_equal(kvf_store_put(c.st, "honest", c.buf, MiB, NULL), KVF_OK);
    assert_int_equal(kvf_store_get(c.st, "honest", c.buf, MiB, &got, 0),
                     KVF_OK);
    kvs_client_close(&c);
    kvs_stop(&n, 0);
    kvs_stop(&m, 0);
}

static void test_master_restart(void **state)
{
    static const char *const mopt[] = {"--heartbeat", "100ms", NULL};
    char port_s[16], *colon;
    kvs_proc_t m, n;
    kvs_client_t c;
    unsigned port;
    size_t got;
    int i, rc = -1;

    (void)state;
    assert_int_equal(kvs_master(&m, 0, mopt), 0);
    colon = strrchr(m.addr, ':');
    assert_non_null(colon);
    snprintf(port_s, sizeof(port_s), "%s", colon + 1);
    port = (unsigned)atoi(port_s);
    assert_int_equal(kvs_node(&n, m.addr, "8M", NULL), 0);
    assert_int_equal(kvs_client_open(&c, m.addr, 2 * MiB), 0);
    kvs_fill(c.buf, MiB, 3);
    assert_int_equal(kvf_store_put(c.st, "before", c.buf, MiB, NULL), KVF_OK);
    kvs_stop(&m, SIGKILL);
    for (i = 0; i < 50 && rc != 0; i++) {
        rc = kvs_master(&m, port, mopt);
        if (rc != 0) {
            kvs_sleep_ms(100);
        }
    }
    assert_int_equal(rc, 0);
    /* the node notices (stale epoch / broken connection) and registers */
    assert_true(kvs_metric_wait(m.http, "nodes", 1, 5000));
    /* nothing from before the restart is served */
    assert_int_equal(kvf_store_get(c.st, "before", c.buf, MiB, &got, 0),
                     KVF_ERR_NO_KEY);
    kvs_fill(c.buf, MiB, 4);
    assert_int_equal(kvf_store_put(c.st, "after", c.buf, MiB, NULL), KVF_OK);
    memset(c.buf, 0, MiB);
    assert_int_equal(kvf_store_get(c.st, "after", c.buf, MiB, &got, 0), KVF_OK);
    kvs_fill(c.buf + MiB, MiB, 4);
    assert_memory_equal(c.buf, c.buf + MiB, MiB);
    kvs_client_close(&c);
    kvs_stop(&n, 0);
    kvs_stop(&m, 0);
}

/* Overwrites a replica's bytes on its node through the engine. */
static void corrupt(kvs_client_t *c, const char *segment, uint64_t addr,
                    size_t len)
{
    kvf_peer_h peer;
    kvf_op_t op;

    assert_int_equal(kvf_peer_open(kvf_store_engine(c->st), segment, &peer),
                     KVF_OK);
    memset(c->buf + 2 * MiB, 0x5a, len);
    op.type = KVF_OP_WRITE;
    op.local = c->buf + 2 * MiB;
    op.peer = peer;
    op.remote = addr;
    op.length = len;
    assert_int_equal(kvf_transfer_sync(kvf_store_engine(c->st), &op, 1, 3000),
                     KVF_OK);
    kvf_peer_close(peer);
}

static void test_corruption(void **state)
{
    kvf_store_put_opts_t two = {.replicas = 2};
    kvf_store_info_t info;
    kvs_proc_t m, n[2];
    kvs_client_t c;
    size_t got;
    int i;

    (void)state;
    assert_int_equal(kvs_master(&m, 0, NULL), 0);
    assert_int_equal(kvs_node(&n[0], m.addr, "16M", NULL), 0);
    assert_int_equal(kvs_node(&n[1], m.addr, "16M", NULL), 0);
    assert_int_equal(kvs_client_open(&c, m.addr, 3 * MiB), 0);
    kvs_fill(c.buf + MiB, MiB, 11); /* the truth, kept at buf + 1 MiB */
    memcpy(c.buf, c.buf + MiB, MiB);
    assert_int_equal(kvf_store_put(c.st, "cs/two", c.buf, MiB, &two), KVF_OK);
    assert_int_equal(kvf_store_put(c.st, "cs/one", c.buf, MiB, NULL), KVF_OK);
    assert_int_equal(kvf_store_query(c.st, "cs/two", &info), KVF_OK);
    assert_int_equal(info.replicas, 2);
    /* one bad replica: every get still returns the right bytes */
    corrupt(&c, info.segment[0], info.addr[0] + 4096, 100);
    for (i = 0; i < 4; i++) {
        memset(c.buf, 0, MiB);
        assert_int_equal(kvf_store_get(c.st, "cs/two", c.buf, MiB, &got, 0),
                         KVF_OK);
        assert_memory_equal(c.buf, c.buf + MiB, MiB);
    }
    /* both bad: a clear error, never the bytes */
    corrupt(&c, info.segment[1], info.addr[1] + MiB - 1, 1);
    assert_int_equal(kvf_store_get(c.st, "cs/two", c.buf, MiB, &got, 0),
                     KVF_ERR_CHECKSUM);
    assert_int_equal(kvf_store_query(c.st, "cs/one", &info), KVF_OK);
    corrupt(&c, info.segment[0], info.addr[0], 1);
    assert_int_equal(kvf_store_get(c.st, "cs/one", c.buf, MiB, &got, 0),
                     KVF_ERR_CHECKSUM);
    kvs_client_close(&c);
    kvs_stop(&n[0], 0);
    kvs_stop(&n[1], 0);
    kvs_stop(&m, 0);
}

/*
 * Corruption met by batch gets, whose checksums are computed while their
 * reads land: 32 objects of 256 KiB with two replicas (a batch of several
 * engine requests, moved by the transport's threads), read over shm and
 * over tcp; one replica of every other object overwritten (8 bytes),
 * both of object 5: each object with a good replica comes back whole and
 * right, object 5 fails with KVF_ERR_CHECKSUM and is not reported filled.
 */
static void get_corrupt_batch(kvs_client_t *c, const char *const *keys, int n,
                              size_t sz, int bad)
{
    kvf_status_t sts[32];
    void *bufs[32];
    size_t caps[32], lens[32];
    int i;

    memset(c->buf, 0, (size_t)n * sz);
    for (i = 0; i < n; i++) {
        bufs[i] = c->buf + (size_t)i * sz;
        caps[i] = sz;
        lens[i] = 0;
    }
    assert_int_equal(
        kvf_store_get_batch(c->st, (size_t)n, keys, bufs, caps, lens, 0, sts),
        KVF_ERR_CHECKSUM);
    for (i = 0; i < n; i++) {
        if (i == bad) {
            assert_int_equal(sts[i], KVF_ERR_CHECKSUM);
            assert_int_equal(lens[i], 0);
            continue;
        }
        assert_int_equal(sts[i], KVF_OK);
        assert_int_equal(lens[i], sz);
        assert_memory_equal(bufs[i], c->buf + 8 * MiB + (size_t)i * sz, sz);
    }
}

static void test_corruption_batch(void **state)
{
    enum { N = 32, SZ = 256 << 10 };
    kvf_store_put_opts_t two = {.replicas = 2};
    kvf_store_info_t info;
    char names[N][16];
    const char *keys[N];
    kvs_proc_t m, n[2];
    kvs_client_t c, ctcp;
    int i, k, round;

    (void)state;
    assert_int_equal(kvs_master(&m, 0, NULL), 0);
    assert_int_equal(kvs_node(&n[0], m.addr, "16M", NULL), 0);
    assert_int_equal(kvs_node(&n[1], m.addr, "16M", NULL), 0);
    assert_int_equal(kvs_client_open(&c, m.addr, 17 * MiB), 0);
    setenv("KVF_TRANSPORTS", "tcp", 1);
    assert_int_equal(kvs_client_open(&ctcp, m.addr, 17 * MiB), 0);
    unsetenv("KVF_TRANSPORTS");
    kvs_fill(c.buf + 8 * MiB, N * SZ, 12); /* the truth, at buf + 8 MiB */
    memcpy(ctcp.buf + 8 * MiB, c.buf + 8 * MiB, N * SZ);
    for (i = 0; i < N; i++) {
        snprintf(names[i], sizeof(names[i]), "cb/%d", i);
        keys[i] = names[i];
        assert_int_equal(kvf_store_put(c.st, keys[i],
                                       c.buf + 8 * MiB + (size_t)i * SZ, SZ,
                                       &two),
                         KVF_OK);
        assert_int_equal(kvf_store_query(c.st, keys[i], &info), KVF_OK);
        assert_int_equal(info.replicas, 2);
        for (k = 0; k < 2; k++) {
            if ((i % 2 == 1 && k == i / 2 % 2) || i == 5) {
                corrupt(&c, info.segment[k],
                        info.addr[k] + (uint64_t)(i * 4099 % (SZ - 8)), 8);
            }
        }
    }
    for (round = 0; round < 3; round++) {
        get_corrupt_batch(&c, keys, N, SZ, 5);
        get_corrupt_batch(&ctcp, keys, N, SZ, 5);
    }
    kvs_client_close(&ctcp);
    kvs_client_close(&c);
    kvs_stop(&n[0], 0);
    kvs_stop(&n[1], 0);
    kvs_stop(&m, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_eviction_order),
        cmocka_unit_test(test_hold),
        cmocka_unit_test(test_watermark),
        cmocka_unit_test(test_lease_and_pin),
        cmocka_unit_test(test_node_death),
        cmocka_unit_test(test_zombie_put),
        cmocka_unit_test(test_garbage),
        cmocka_unit_test(test_lying_node),
        cmocka_unit_test(test_master_restart),
        cmocka_unit_test(test_corruption),
        cmocka_unit_test(test_corruption_batch),
    };

    kvs_bin();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
