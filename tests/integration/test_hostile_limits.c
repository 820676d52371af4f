/*
 * An insider (a holder of the cluster secret) against the master's
 * per-client limits, with real processes on 127.0.0.1 and raw frames
 * through store/proto. A client is every connection of one peer (a tcp
 * address, or a uid over the unix socket), so opening more connections
 * buys nothing:
 * - eviction: 3 connections from one address each start a put of a
 *   quarter of the pool; the third is refused (KVF_ERR_QUOTA) and the
 *   victim's objects that survive read back byte for byte; a connection
 *   from another address is still served;
 * - pending puts: 6 connections from one address are held to one
 *   client's client_max_pending together, and every client together to
 *   pending_max; with the default limits, 393,216 attempts leave at most
 *   65,536 pending puts and the master's memory bounded;
 * - read leases: a client that reads every object with a long lease and
 *   never lets go leases at most client_max_leased_pct of the capacity;
 *   the rest stays evictable, so another client's puts still find room.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "test_store_harness.h"
#include "store/proto/msg.h"
#include "store/proto/proto.h"
#include "core/auth.h"
#include "core/sock.h"
#include "core/time.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define KiB 1024
#define MiB (1024 * 1024)

static uint64_t g_id = 1;

static kvf_status_t call(int fd, uint8_t type, uint32_t count, kvf_wr_t *w,
                         kvf_sp_frame_t *f)
{
    kvf_status_t st = kvf_sp_call(fd, kvf_test_mac(fd), type, g_id++, count, w,
                                  f, kvf_time_ms() + 10000);

    return st != KVF_OK ? st : (kvf_status_t)f->hdr.status;
}

/* count PUT_STARTs of size bytes named prefix/base..; the number
 * accepted, every other one refused with KVF_ERR_QUOTA. */
static unsigned put_starts(int fd, const char *prefix, unsigned base,
                           unsigned count, uint64_t size)
{
    char key[64];
    kvf_sp_frame_t f = {0};
    kvf_sm_req_t q = {0};
    kvf_sm_obj_t o;
    unsigned i, ok = 0;
    kvf_rd_t r;
    kvf_wr_t w;

    kvf_wr_init(&w);
    q.key = key;
    q.size = size;
    q.replicas = 1;
    for (i = 0; i < count; i++) {
        snprintf(key, sizeof(key), "%s/%u", prefix, base + i);
        kvf_sm_put_start_enc(&w, &q);
    }
    assert_int_equal(call(fd, KVF_SP_PUT_START, count, &w, &f), KVF_OK);
    assert_int_equal(f.hdr.count, count);
    kvf_rd_init(&r, f.body, f.hdr.meta_len);
    for (i = 0; i < count; i++) {
        kvf_sm_put_start_rep_dec(&r, &o);
        if (o.status == KVF_OK) {
            ok++;
        } else {
            assert_int_equal(o.status, KVF_ERR_QUOTA);
        }
    }
    kvf_wr_free(&w);
    kvf_sp_frame_free(&f);
    return ok;
}

/* GET of one key on fd: its status; *lease_ms_p the lease granted. */
static kvf_status_t get_lease(int fd, const char *key, uint32_t *lease_ms_p)
{
    kvf_sp_frame_t f = {0};
    kvf_sm_obj_t o;
    kvf_rd_t r;
    kvf_wr_t w;

    kvf_wr_init(&w);
    kvf_sm_key_enc(&w, key);
    assert_int_equal(call(fd, KVF_SP_GET, 1, &w, &f), KVF_OK);
    kvf_rd_init(&r, f.body, f.hdr.meta_len);
    kvf_sm_get_rep_dec(&r, &o);
    *lease_ms_p = o.lease_ms;
    kvf_wr_free(&w);
    kvf_sp_frame_free(&f);
    return o.status;
}

/* The master's resident set, KiB. */
static long rss_kib(pid_t pid)
{
    char path[64], line[256];
    long v = -1;
    FILE *fp;

    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    fp = fopen(path, "r");
    if (fp == NULL) {
        return -1;
    }
    while (fgets(line, sizeof(line), fp) != NULL) {
        if (sscanf(line, "VmRSS: %ld", &v) == 1) {
            break;
        }
    }
    fclose(fp);
    return v;
}

/* Puts n objects of len bytes named prefix/i (seeded by i). */
static void put_objects(kvs_client_t *c, const char *prefix, int n, size_t len)
{
    char key[64];
    int i;

    for (i = 0; i < n; i++) {
        snprintf(key, sizeof(key), "%s/%d", prefix, i);
        kvs_fill(c->buf, len, (uint64_t)i + 1);
        assert_int_equal(kvf_store_put(c->st, key, c->buf, len, NULL), KVF_OK);
    }
}

/* How many of prefix/0..n-1 are still there; each one there must read
 * back byte for byte. */
static int survivors(kvs_client_t *c, const char *prefix, int n, size_t len)
{
    char key[64];
    size_t got;
    kvf_status_t st;
    int i, alive = 0;

    for (i = 0; i < n; i++) {
        snprintf(key, sizeof(key), "%s/%d", prefix, i);
        kvs_fill(c->buf, len, (uint64_t)i + 1);
        st = kvf_store_get(c->st, key, c->buf + len, len, &got, 0);
        if (st == KVF_ERR_NO_KEY) {
            continue;
        }
        assert_int_equal(st, KVF_OK);
        assert_int_equal(got, len);
        assert_memory_equal(c->buf, c->buf + len, len);
        alive++;
    }
    return alive;
}

static int setup(void **state)
{
    (void)state;
    kvs_bin();
    return 0;
}

/* Three connections from one address, each a put of a quarter of the
 * pool: the pool share of one client holds across its connections. */
static void test_evict_insider(void **state)
{
    enum { N = 28, CONNS = 3 };
    kvs_proc_t m, n;
    kvs_client_t c;
    unsigned ok = 0;
    int fd[CONNS], other, i, alive;

    (void)state;
    assert_int_equal(kvs_master(&m, 0, NULL), 0);
    assert_int_equal(kvs_node(&n, m.addr, "32M", NULL), 0);
    assert_int_equal(kvs_client_open(&c, m.addr, 2 * MiB), 0);
    put_objects(&c, "victim", N, MiB); /* 28 of 32 MiB, below 90 % */
    for (i = 0; i < CONNS; i++) {
        fd[i] = kvs_raw_connect(m.addr);
        assert_true(fd[i] >= 0);
        ok += put_starts(fd[i], "evil", (unsigned)i, 1, 7 * MiB);
    }
    kvs_sleep_ms(300); /* a reaper tick: the watermark's eviction too */
    alive = survivors(&c, "victim", N, MiB);
    print_message("puts of a quarter of the pool from %d connections of one "
                  "address: %u accepted, %d of %d victim objects left\n",
                  CONNS, ok, alive, N);
    /* 50 % of 32 MiB per client: two, never three */
    assert_int_equal(ok, 2);
    /* the client holds 14 MiB, so eviction to the low watermark (80 %)
     * leaves the victim about 11 MiB (all three: at most 4) */
    assert_true(alive >= 10);
    /* a client of another address has its own share */
    other = kvf_test_auth_from("127.0.0.2", m.addr);
    assert_true(other >= 0);
    assert_int_equal(put_starts(other, "other", 0, 1, 64 * KiB), 1);
    close(other);
    for (i = 0; i < CONNS; i++) {
        close(fd[i]);
    }
    kvs_client_close(&c);
    kvs_stop(&n, 0);
    kvs_stop(&m, 0);
}

/* The pending limit of one client across its connections, and of every
 * client together. */
static void test_pending_caps(void **state)
{
    enum { CONNS = 6, PER = 1000 };
    kvs_proc_t m, n;
    unsigned ok = 0;
    int fd[CONNS], other, i;

    (void)state;
    setenv("KVF_CLIENT_MAX_PENDING", "1000", 1);
    setenv("KVF_PENDING_MAX", "1500", 1);
    assert_int_equal(kvs_master(&m, 0, NULL), 0);
    unsetenv("KVF_CLIENT_MAX_PENDING");
    unsetenv("KVF_PENDING_MAX");
    assert_int_equal(kvs_node(&n, m.addr, "16M", NULL), 0);
    for (i = 0; i < CONNS; i++) {
        char pfx[16];

        fd[i] = kvs_raw_connect(m.addr);
        assert_true(fd[i] >= 0);
        snprintf(pfx, sizeof(pfx), "c%d", i);
        ok += put_starts(fd[i], pfx, 0, PER, 64);
    }
    print_message("%d connections of one address, %d puts each: %u pending\n",
                  CONNS, PER, ok);
    assert_int_equal(ok, 1000);
    /* another address: its own 1000, but only 500 left of pending_max */
    other = kvf_test_auth_from("127.0.0.2", m.addr);
    assert_true(other >= 0);
    assert_int_equal(put_starts(other, "o", 0, PER, 64), 500);
    assert_int_equal(kvs_metric(m.http, "pending_puts"), 1500);
    close(other);
    /* closing and reopening the connections buys no more: the client's
     * record lives while its puts are pending */
    for (i = 0; i < CONNS; i++) {
        close(fd[i]);
    }
    fd[0] = kvf_test_auth_from("127.0.0.3", m.addr);
    assert_true(fd[0] >= 0);
    assert_int_equal(put_starts(fd[0], "late", 0, 10, 64), 0);
    close(fd[0]);
    fd[0] = kvs_raw_connect(m.addr);
    assert_true(fd[0] >= 0);
    assert_int_equal(put_starts(fd[0], "again", 0, 10, 64), 0);
    close(fd[0]);
    kvs_stop(&n, 0);
    kvs_stop(&m, 0);
}

/* The figures with the default limits: 6 connections, 65,536
 * puts each, in batches; the master holds at most one client's 65,536. */
static void test_pending_default(void **state)
{
    enum { CONNS = 6, PER = 65536, BATCH = 4096 };
    kvs_proc_t m, n;
    unsigned ok = 0;
    long rss0, rss1;
    int fd[CONNS], i, k;

    (void)state;
    setenv("KVF_PUT_TIMEOUT_MS", "60000", 1);
    assert_int_equal(kvs_master(&m, 0, NULL), 0);
    unsetenv("KVF_PUT_TIMEOUT_MS");
    assert_int_equal(kvs_node(&n, m.addr, "64M", NULL), 0);
    rss0 = rss_kib(m.pid);
    for (i = 0; i < CONNS; i++) {
        char pfx[16];

        fd[i] = kvs_raw_connect(m.addr);
        assert_true(fd[i] >= 0);
        snprintf(pfx, sizeof(pfx), "c%d", i);
        for (k = 0; k < PER / BATCH; k++) {
            ok += put_starts(fd[i], pfx, (unsigned)k * BATCH, BATCH, 64);
        }
    }
    rss1 = rss_kib(m.pid);
    print_message("%d connections x %d puts: %u pending; master RSS %ld -> "
                  "%ld KiB\n",
                  CONNS, PER, ok, rss0, rss1);
    assert_int_equal(ok, 65536);
    assert_int_equal(kvs_metric(m.http, "pending_puts"), 65536);
    /* one client's pending puts only, not six */
    assert_true(rss1 - rss0 < 160 * 1024);
    for (i = 0; i < CONNS; i++) {
        close(fd[i]);
    }
    kvs_stop(&n, 0);
    kvs_stop(&m, 0);
}

/* A reader that leases everything and never lets go: its leases cover at
 * most its share, and another client's puts still find room. */
static void test_lease_hog(void **state)
{
    enum { N = 14, NEW = 10 };
    kvs_proc_t m, n;
    kvs_client_t c;
    uint32_t lease;
    char key[64];
    int fd, i, leased = 0, alive;

    (void)state;
    setenv("KVF_LEASE_MS", "120000", 1);
    assert_int_equal(kvs_master(&m, 0, NULL), 0);
    unsetenv("KVF_LEASE_MS");
    assert_int_equal(kvs_node(&n, m.addr, "16M", NULL), 0);
    assert_int_equal(kvs_client_open(&c, m.addr, 2 * MiB), 0);
    put_objects(&c, "old", N, MiB); /* 14 of 16 MiB */
    fd = kvs_raw_connect(m.addr);
    assert_true(fd >= 0);
    for (i = 0; i < N; i++) {
        snprintf(key, sizeof(key), "old/%d", i);
        assert_int_equal(get_lease(fd, key, &lease), KVF_OK);
        leased += (lease > 0);
    }
    print_message("a reader of %d objects of 1 MiB in a 16 MiB pool holds "
                  "%d leases\n",
                  N, leased);
    assert_int_equal(leased, 8); /* 50 % of the capacity */
    /* another client's puts: room comes from the unleased objects */
    put_objects(&c, "new", NEW, MiB);
    alive = survivors(&c, "new", NEW, MiB);
    print_message("%d new objects put, %d still there\n", NEW, alive);
    assert_true(alive >= 4);
    close(fd);
    kvs_client_close(&c);
    kvs_stop(&n, 0);
    kvs_stop(&m, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_evict_insider),
        cmocka_unit_test(test_pending_caps),
        cmocka_unit_test(test_pending_default),
        cmocka_unit_test(test_lease_hog),
    };

    return cmocka_run_group_tests(tests, setup, NULL);
}
