/*
 * Node inventories, with real sockets: a node's inventory server
 * (store/node/inventory.c) records entries from a leader over an
 * authenticated connection and answers one status per entry; an entry
 * of an epoch older than the newest it has seen (a deposed leader) is
 * refused with KVF_ERR_STALE, one outside the pool with
 * KVF_ERR_INVALID_PARAM, and neither changes what it holds; a newer
 * leader's entry over an older one replaces it; an entry flagged
 * KVF_SM_INV_FORGET deletes the entry of its key at its offset; a frame
 * it does not
 * serve closes that connection only, and the server goes on. Peers that
 * connect and stay silent hold up neither the accept loop nor a leader. A real
 * master refuses an inventory report from a node it does not know
 * (KVF_ERR_STALE) and a malformed one (KVF_ERR_PROTOCOL), and goes on.
 */
#include "core/auth.h"
#include "core/sock.h"
#include "core/time.h"
#include "store/node/inventory.h"
#include "test_store_harness.h"
#include "test_util.h"

#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#define E_OLD ((1ull << 63) | 5)
#define E_NEW ((1ull << 63) | 9)

static int conn(const kvf_node_inv_t *ni)
{
    char host[KVF_HOST_MAX];
    uint16_t port;
    int fd = -1;

    assert_int_equal(
        kvf_sock_parse_addr(kvf_node_inv_addr(ni), host, sizeof(host), &port),
        KVF_OK);
    assert_int_equal(kvf_test_connect(host, port, 2000, "store", &fd), KVF_OK);
    return fd;
}

/* One INV_ADD entry (flags: KVF_SM_INV_FORGET for a delete); its
 * status. */
static kvf_status_t add_fl(int fd, const char *key, uint64_t off, uint64_t size,
                           uint64_t epoch, uint8_t flags)
{
    kvf_sm_inv_ent_t e = {.key = key,
                          .off = off,
                          .size = size,
                          .checksum = 7,
                          .epoch = epoch,
                          .seq = 1,
                          .flags = flags};
    kvf_sp_frame_t f = {0};
    kvf_status_t st;
    kvf_wr_t w;
    kvf_rd_t r;

    kvf_wr_init(&w);
    kvf_sm_inv_ent_enc(&w, &e);
    st = kvf_sp_call(fd, kvf_test_mac(fd), KVF_SP_INV_ADD, 1, 1, &w, &f,
                     kvf_time_ms() + 2000);
    kvf_wr_free(&w);
    assert_int_equal(st, KVF_OK);
    assert_int_equal(f.hdr.status, KVF_OK);
    assert_int_equal(f.hdr.count, 1);
    kvf_rd_init(&r, f.body, f.hdr.meta_len);
    st = kvf_sm_status_dec(&r);
    assert_int_equal(kvf_rd_status(&r), KVF_OK);
    kvf_sp_frame_free(&f);
    return st;
}

static kvf_status_t add(int fd, const char *key, uint64_t off, uint64_t size,
                        uint64_t epoch)
{
    return add_fl(fd, key, off, size, epoch, 0);
}

static void test_node_server(void **state)
{
    kvf_node_inv_t *ni;
    kvf_sp_frame_t f = {0};
    kvf_wr_t w;
    int fd;

    (void)state;
    assert_int_equal(
        kvf_node_inv_start("127.0.0.1", "127.0.0.1", 1 << 20, 2000, &ni),
        KVF_OK);
    fd = conn(ni);
    assert_int_equal(add(fd, "a", 0, 4096, E_OLD), KVF_OK);
    assert_int_equal(add(fd, "b", 8192, 4096, E_OLD), KVF_OK);
    assert_int_equal(kvf_node_inv_count(ni), 2);
    /* bad entries: outside the pool, wrapping around */
    assert_int_equal(add(fd, "c", (1 << 20) - 64, 128, E_OLD),
                     KVF_ERR_INVALID_PARAM);
    assert_int_equal(add(fd, "c", 64, UINT64_MAX - 8, E_OLD),
                     KVF_ERR_INVALID_PARAM);
    /* a new leader reuses the space of a */
    assert_int_equal(add(fd, "d", 0, 128, E_NEW), KVF_OK);
    assert_int_equal(kvf_node_inv_count(ni), 2);
    /* the deposed leader, on its connection: refused by status */
    assert_int_equal(add(fd, "e", 65536, 64, E_OLD), KVF_ERR_STALE);
    assert_int_equal(kvf_node_inv_count(ni), 2);
    assert_int_equal(kvf_node_inv_fence(ni, E_OLD), KVF_ERR_STALE);
    /* a frame the server does not serve: an error, then that
     * connection closes; the server takes a new one */
    kvf_wr_init(&w);
    kvf_wr_u64(&w, 1);
    kvf_wr_u64(&w, 1);
    assert_int_equal(kvf_sp_call(fd, kvf_test_mac(fd), KVF_SP_INV_REPORT, 2, 0,
                                 &w, &f, kvf_time_ms() + 2000),
                     KVF_OK);
    assert_int_equal(f.hdr.status, KVF_ERR_PROTOCOL);
    kvf_wr_free(&w);
    kvf_sp_frame_free(&f);
    close(fd);
    fd = conn(ni);
    assert_int_equal(add(fd, "f", 65536, 64, E_NEW), KVF_OK);
    assert_int_equal(kvf_node_inv_count(ni), 3);
    /* a delete in an INV_ADD frame: only the entry of that key at that
     * offset goes; a deposed leader's is refused */
    assert_int_equal(add_fl(fd, "x", 65536, 64, E_NEW, KVF_SM_INV_FORGET),
                     KVF_ERR_NOT_FOUND);
    assert_int_equal(add_fl(fd, "f", 65536, 64, E_OLD, KVF_SM_INV_FORGET),
                     KVF_ERR_STALE);
    assert_int_equal(kvf_node_inv_count(ni), 3);
    assert_int_equal(add_fl(fd, "f", 65536, 64, E_NEW, KVF_SM_INV_FORGET),
                     KVF_OK);
    assert_int_equal(kvf_node_inv_count(ni), 2);
    close(fd);
    kvf_node_inv_stop(ni);
}

/* Does the server close fd within ms (whatever it sent first)? */
static int closed_within(int fd, unsigned ms)
{
    uint64_t deadline = kvf_time_ms() + ms;
    char buf[256];
    ssize_t n;

    while (kvf_sock_wait(fd, POLLIN, deadline) == KVF_OK) {
        n = recv(fd, buf, sizeof(buf), 0);
        if (n <= 0) {
            return 1;
        }
    }
    return 0;
}

/* Peers that connect and say nothing hold up neither the accept loop nor
 * a leader: each handshake has a thread of its own and at most 2 s (not
 * the node's 10 s timeout); past 4 under way a connection is closed at
 * once, and the slots of authenticated connections stay theirs. */
static void test_silent_peers(void **state)
{
    char host[KVF_HOST_MAX];
    kvf_node_inv_t *ni;
    uint64_t t0;
    uint16_t port;
    int silent[5], fd, fd2, i;

    (void)state;
    assert_int_equal(
        kvf_node_inv_start("127.0.0.1", "127.0.0.1", 1 << 20, 10000, &ni),
        KVF_OK);
    assert_int_equal(
        kvf_sock_parse_addr(kvf_node_inv_addr(ni), host, sizeof(host), &port),
        KVF_OK);
    for (i = 0; i < 3; i++) {
        assert_int_equal(kvf_sock_connect(host, port, 2000, &silent[i]),
                         KVF_OK);
    }
    /* three handshakes hang: a leader is served at once all the same */
    t0 = kvf_time_ms();
    assert_int_equal(kvf_test_connect(host, port, 2000, "store", &fd), KVF_OK);
    assert_int_equal(add(fd, "a", 0, 4096, E_NEW), KVF_OK);
    assert_true(kvf_time_ms() - t0 < 1000);
    for (i = 3; i < 5; i++) {
        kvs_sleep_ms(50); /* accepted in order */
        assert_int_equal(kvf_sock_connect(host, port, 2000, &silent[i]),
                         KVF_OK);
    }
    /* the fifth is past the budget of 4: closed at once */
    assert_true(closed_within(silent[4], 1000));
    for (i = 0; i < 4; i++) { /* each closed by its 2 s deadline */
        assert_true(closed_within(silent[i], 2500));
        close(silent[i]);
    }
    close(silent[4]);
    /* the authenticated connection went on meanwhile; another comes in */
    assert_int_equal(add(fd, "b", 8192, 4096, E_NEW), KVF_OK);
    assert_int_equal(kvf_test_connect(host, port, 2000, "store", &fd2), KVF_OK);
    assert_int_equal(add(fd2, "c", 16384, 4096, E_NEW), KVF_OK);
    assert_int_equal(kvf_node_inv_count(ni), 3);
    close(fd);
    close(fd2);
    kvf_node_inv_stop(ni);
}

static void test_master_refuses_report(void **state)
{
    kvf_sm_inv_ent_t e = {
        .key = "x", .off = 0, .size = 64, .checksum = 1, .epoch = E_NEW};
    kvf_sp_frame_t f = {0};
    kvs_proc_t m;
    kvf_wr_t w;
    int fd;

    (void)state;
    assert_int_equal(kvs_master(&m, 0, NULL), 0);
    fd = kvs_raw_connect(m.addr);
    assert_true(fd >= 0);
    /* a node the master does not know */
    kvf_wr_init(&w);
    kvf_wr_u64(&w, 12345);
    kvf_wr_u64(&w, 1);
    kvf_sm_inv_ent_enc(&w, &e);
    assert_int_equal(kvf_sp_call(fd, kvf_test_mac(fd), KVF_SP_INV_REPORT, 1, 1,
                                 &w, &f, kvf_time_ms() + 2000),
                     KVF_OK);
    assert_int_equal(f.hdr.status, KVF_ERR_STALE);
    /* one entry announced, none there */
    w.len = 16;
    assert_int_equal(kvf_sp_call(fd, kvf_test_mac(fd), KVF_SP_INV_REPORT, 2, 1,
                                 &w, &f, kvf_time_ms() + 2000),
                     KVF_OK);
    assert_int_equal(f.hdr.status, KVF_ERR_PROTOCOL);
    kvf_wr_free(&w);
    kvf_sp_frame_free(&f);
    close(fd);
    /* the master goes on */
    fd = kvs_raw_connect(m.addr);
    assert_true(fd >= 0);
    close(fd);
    kvs_stop(&m, SIGTERM);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_node_server),
        cmocka_unit_test(test_silent_peers),
        cmocka_unit_test(test_master_refuses_report),
    };

    kvs_bin();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
