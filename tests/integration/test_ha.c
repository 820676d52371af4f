/*
 * Master high availability with real processes: a real etcd, two
 * `kvferry master` processes (metadata = etcd, lease 1 s), one node and
 * an in-process client given both masters. One master leads (etcd's key
 * names it), the standby answers KVF_ERR_NOT_LEADER; SIGKILL of the
 * leader: the standby takes over with a larger epoch, the node
 * registers with it, the client's puts and gets succeed again (the time
 * is printed and bounded), no call waits past its deadline, and every
 * get returns the right bytes or an error, never wrong bytes, and every
 * object committed before the SIGKILL is read back byte for byte from
 * the new leader (rebuilt from the node's inventory: 0 lost). Removes
 * and overwrites before a SIGKILL: exactly the expected keys exist after
 * it, byte for byte (the nodes forgot the removed ones); the same for
 * keys evicted by the watermark. etcd
 * SIGSTOPped: no master leads, and gets still end by their deadline.
 * SIGSTOP of
 * a leader until it is replaced: once resumed it is deposed and refuses
 * everything (fencing). A leader record written by someone without the
 * cluster secret (no MAC, a zero MAC, the real leader's MAC on another
 * address) is refused: no client goes to the address it names. Skips
 * (77) when etcd is not installed.
 */
#include "coord/election.h"
#include "coord/etcd.h"
#include "core/time.h"
#include "etcd_harness.h"
#include "store/proto/msg.h"
#include "test_store_harness.h"
#include "test_util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/socket.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#define OBJ       4096
#define CALL_MS   3000
#define LEADER_MS 1000

static kvf_test_etcd_t g_etcd;
static char g_key[256];

/* Who leads now: 0 or 1 (index into m), -1 none. */
static int leader_of(kvs_proc_t *m, uint64_t *epoch_p)
{
    char val[128];
    uint64_t epoch = 0;
    int i;

    if (kvf_elect_lookup(g_etcd.endpoint, 500, g_key, val, sizeof(val),
                         &epoch) != KVF_OK) {
        return -1;
    }
    for (i = 0; i < 2; i++) {
        if (strcmp(val, m[i].addr) == 0) {
            if (epoch_p != NULL) {
                *epoch_p = epoch;
            }
            return i;
        }
    }
    return -1;
}

static int wait_leader_proc(kvs_proc_t *m, int not, unsigned ms,
                            uint64_t *epoch_p)
{
    uint64_t t0 = kvf_time_ms();
    int l;

    while (kvf_time_ms() - t0 < ms) {
        l = leader_of(m, epoch_p);
        if (l >= 0 && l != not ) {
            return l;
        }
        kvs_sleep_ms(20);
    }
    return -1;
}

/* A raw EXISTS to addr: the frame status. */
static kvf_status_t raw_status(const char *addr)
{
    kvf_sp_frame_t f = {0};
    kvf_status_t st;
    int fd = kvs_raw_connect(addr);

    if (fd < 0) {
        return KVF_ERR_CONNECT;
    }
    st = kvf_sp_call(fd, kvf_test_mac(fd), KVF_SP_EXISTS, 1, 0, NULL, &f,
                     kvf_time_ms() + 2000);
    if (st == KVF_OK) {
        st = (kvf_status_t)f.hdr.status;
    }
    kvf_sp_frame_free(&f);
    close(fd);
    return st;
}

typedef struct ha {
    kvs_proc_t m[2];
    kvs_proc_t node;
    kvs_client_t c;
    char list[300];
} ha_t;

static void ha_up(ha_t *h)
{
    char pool[] = "16M";
    int l;

    memset(h, 0, sizeof(*h));
    assert_int_equal(kvs_master(&h->m[0], 0, NULL), 0);
    assert_true(wait_leader_proc(h->m, -1, 5000, NULL) == 0);
    assert_int_equal(kvs_master(&h->m[1], 0, NULL), 0);
    snprintf(h->list, sizeof(h->list), "%s,%s", h->m[0].addr, h->m[1].addr);
    assert_int_equal(kvs_node(&h->node, h->list, pool, NULL), 0);
    assert_int_equal(kvs_client_open(&h->c, h->list, OBJ), 0);
    l = leader_of(h->m, NULL);
    assert_int_equal(l, 0);
    assert_int_equal(raw_status(h->m[1].addr), KVF_ERR_NOT_LEADER);
}

static void ha_down(ha_t *h)
{
    kvs_client_close(&h->c);
    kvs_stop(&h->node, SIGTERM);
    kvs_stop(&h->m[0], SIGKILL);
    kvs_stop(&h->m[1], SIGKILL);
}

/* A put then a get of key with bytes from seed; the get's bytes are
 * checked (wrong bytes fail the test at once). */
static kvf_status_t put_get(ha_t *h, const char *key, uint64_t seed,
                            uint64_t *longest_p)
{
    unsigned char want[OBJ];
    uint64_t t0 = kvf_time_ms(), dt;
    kvf_status_t st;
    size_t got = 0;

    kvs_fill(want, OBJ, seed);
    memcpy(h->c.buf, want, OBJ);
    st = kvf_store_put(h->c.st, key, h->c.buf, OBJ, NULL);
    if (st == KVF_ERR_NOT_LEADER) {
        /* a leader change (a loaded machine can make a leader step down
         * on its own): the write failed cleanly, the next goes to the
         * new leader */
        st = kvf_store_put(h->c.st, key, h->c.buf, OBJ, NULL);
    }
    if (st == KVF_OK) {
        memset(h->c.buf, 0, OBJ);
        st = kvf_store_get(h->c.st, key, h->c.buf, OBJ, &got, 0);
        if (st == KVF_OK) {
            assert_int_equal(got, OBJ);
            assert_memory_equal(h->c.buf, want, OBJ);
        }
    }
    dt = kvf_time_ms() - t0;
    *longest_p = dt > *longest_p ? dt : *longest_p;
    return st;
}

/* Reads back objects before/0 .. before/n-1 byte for byte; returns how
 * many are lost (a miss); wrong bytes fail the test. */
static int read_back(ha_t *h, int n)
{
    unsigned char want[OBJ];
    kvf_status_t st;
    char key[64];
    int i, lost = 0;
    size_t got;

    for (i = 0; i < n; i++) {
        snprintf(key, sizeof(key), "before/%d", i);
        kvs_fill(want, OBJ, (uint64_t)i);
        memset(h->c.buf, 0, OBJ);
        got = 0;
        st = kvf_store_get(h->c.st, key, h->c.buf, OBJ, &got, 0);
        if (st != KVF_OK) {
            printf("%s: %s\n", key, kvf_status_str(st));
            lost++;
            continue;
        }
        assert_int_equal(got, OBJ);
        assert_memory_equal(h->c.buf, want, OBJ);
    }
    return lost;
}

static void test_failover(void **state)
{
    uint64_t e0 = 0, e1 = 0, longest = 0, t_kill, t_ok = 0;
    char key[64];
    int lost;
    ha_t h;
    int i, l;

    (void)state;
    ha_up(&h);
    leader_of(h.m, &e0);
    for (i = 0; i < 20; i++) {
        snprintf(key, sizeof(key), "before/%d", i);
        assert_int_equal(put_get(&h, key, (uint64_t)i, &longest), KVF_OK);
    }
    t_kill = kvf_time_ms();
    kvs_stop(&h.m[0], SIGKILL);
    for (i = 0; kvf_time_ms() - t_kill < 15000; i++) {
        snprintf(key, sizeof(key), "after/%d", i);
        if (put_get(&h, key, 1000 + (uint64_t)i, &longest) == KVF_OK) {
            t_ok = kvf_time_ms();
            break;
        }
    }
    assert_true(t_ok != 0);
    l = leader_of(h.m, &e1);
    assert_int_equal(l, 1);
    assert_true(e1 > e0);
    printf("leader SIGKILLed (lease %d ms): put+get succeed again after %lu "
           "ms; epochs %lu -> %lu; longest call %lu ms (deadline %d)\n",
           LEADER_MS, (unsigned long)(t_ok - t_kill), (unsigned long)e0,
           (unsigned long)e1, (unsigned long)longest, CALL_MS);
    assert_true(longest <= 2 * CALL_MS + 500); /* a put and a get */
    lost = read_back(&h, 20);
    printf("objects committed before the SIGKILL: 20, lost: %d\n", lost);
    assert_int_equal(lost, 0);
    ha_down(&h);
}

/* Expected contents after a failover: 0 removed (a miss), else the
 * seed of its bytes. */
static uint64_t churn_seed(int i)
{
    return (i % 4 == 1)   ? 0
           : (i % 4 == 2) ? 5000 + (uint64_t)i
                          : 100 + (uint64_t)i;
}

/* Checks key churn/i against churn_seed byte for byte: 0 if it holds,
 * 1 if not (printed); wrong bytes fail the test at once. */
static int churn_check(ha_t *h, int i)
{
    unsigned char want[OBJ];
    kvf_status_t st;
    char key[64];
    size_t got = 0;

    snprintf(key, sizeof(key), "churn/%d", i);
    memset(h->c.buf, 0, OBJ);
    st = kvf_store_get(h->c.st, key, h->c.buf, OBJ, &got, 0);
    if (churn_seed(i) == 0) {
        if (st != KVF_ERR_NO_KEY) {
            printf("%s: removed, but the get says %s\n", key,
                   kvf_status_str(st));
            return 1;
        }
        return 0;
    }
    if (st != KVF_OK) {
        printf("%s: %s\n", key, kvf_status_str(st));
        return 1;
    }
    kvs_fill(want, OBJ, churn_seed(i));
    assert_int_equal(got, OBJ);
    assert_memory_equal(h->c.buf, want, OBJ);
    return 0;
}

/* Removes and overwrites survive a failover: N objects put, a quarter
 * removed, a quarter removed and put again with other bytes; after the
 * leader's SIGKILL exactly the expected set exists, byte for byte. */
static void test_churn(void **state)
{
    uint64_t longest = 0, t_kill;
    int i, bad = 0, n = 40;
    char key[64];
    ha_t h;

    (void)state;
    ha_up(&h);
    for (i = 0; i < n; i++) {
        snprintf(key, sizeof(key), "churn/%d", i);
        kvs_fill(h.c.buf, OBJ, 100 + (uint64_t)i);
        assert_int_equal(kvf_store_put(h.c.st, key, h.c.buf, OBJ, NULL),
                         KVF_OK);
    }
    for (i = 0; i < n; i++) {
        snprintf(key, sizeof(key), "churn/%d", i);
        if (i % 4 == 1 || i % 4 == 2) {
            assert_int_equal(kvf_store_remove(h.c.st, key), KVF_OK);
        }
        if (i % 4 == 2) {
            kvs_fill(h.c.buf, OBJ, churn_seed(i));
            assert_int_equal(kvf_store_put(h.c.st, key, h.c.buf, OBJ, NULL),
                             KVF_OK);
        }
    }
    for (i = 0; i < n; i++) {
        assert_int_equal(churn_check(&h, i), 0);
    }
    t_kill = kvf_time_ms();
    kvs_stop(&h.m[0], SIGKILL);
    for (i = 0; kvf_time_ms() - t_kill < 15000; i++) {
        snprintf(key, sizeof(key), "after-churn/%d", i);
        if (put_get(&h, key, 9000 + (uint64_t)i, &longest) == KVF_OK) {
            break;
        }
    }
    assert_int_equal(leader_of(h.m, NULL), 1);
    for (i = 0; i < n; i++) {
        bad += churn_check(&h, i);
    }
    printf("after the failover: %d of %d keys not as expected (%d removed, "
           "%d overwritten, %d kept)\n",
           bad, n, n / 4, n / 4, n / 2);
    assert_int_equal(bad, 0);
    ha_down(&h);
}

static void test_deposed(void **state)
{
    uint64_t longest = 0, e0 = 0, e1 = 0;
    kvf_status_t st;
    ha_t h;

    (void)state;
    ha_up(&h);
    leader_of(h.m, &e0);
    kill(h.m[0].pid, SIGSTOP);
    assert_int_equal(wait_leader_proc(h.m, 0, 10000, &e1), 1);
    kill(h.m[0].pid, SIGCONT);
    kvs_sleep_ms(100);
    /* the old leader answers, and refuses: deposed */
    assert_int_equal(raw_status(h.m[0].addr), KVF_ERR_NOT_LEADER);
    assert_int_equal(raw_status(h.m[1].addr), KVF_OK);
    assert_true(e1 > e0);
    /* a write to the deposed master fails cleanly and switches the
     * handle: put_get's second try goes to the leader */
    st = put_get(&h, "after-stop", 7, &longest);
    assert_int_equal(st, KVF_OK);
    ha_down(&h);
}

/* Evictions survive a failover: 1 MiB objects put into the 16 MiB pool
 * until the watermark evicts the oldest; after the leader's SIGKILL
 * every key the old leader had evicted stays a miss, and every key it
 * held reads back byte for byte. */
static void test_evict(void **state)
{
    enum { BIG = 1 << 20, N = 28 };
    int present[N], i, n_evicted = 0, bad = 0, tries;
    uint64_t longest = 0, t_kill;
    unsigned char *want;
    kvs_client_t big;
    kvf_status_t st;
    char key[64];
    size_t got;
    ha_t h;

    (void)state;
    ha_up(&h);
    assert_int_equal(kvs_client_open(&big, h.list, BIG), 0);
    want = malloc(BIG);
    assert_non_null(want);
    for (i = 0; i < N; i++) {
        snprintf(key, sizeof(key), "big/%d", i);
        kvs_fill(big.buf, BIG, 300 + (uint64_t)i);
        /* room comes back once the node forgot what was evicted */
        for (tries = 0; tries < 50; tries++) {
            st = kvf_store_put(big.st, key, big.buf, BIG, NULL);
            if (st != KVF_ERR_NO_SPACE) {
                break;
            }
            kvs_sleep_ms(20);
        }
        assert_int_equal(st, KVF_OK);
    }
    kvs_sleep_ms(300); /* every delete answered */
    for (i = 0; i < N; i++) {
        snprintf(key, sizeof(key), "big/%d", i);
        present[i] = kvf_store_exists(big.st, key) == KVF_OK;
        n_evicted += !present[i];
    }
    assert_true(n_evicted > 0);
    t_kill = kvf_time_ms();
    kvs_stop(&h.m[0], SIGKILL);
    for (i = 0; kvf_time_ms() - t_kill < 15000; i++) {
        snprintf(key, sizeof(key), "after-evict/%d", i);
        if (put_get(&h, key, 9500 + (uint64_t)i, &longest) == KVF_OK) {
            break;
        }
    }
    assert_int_equal(leader_of(h.m, NULL), 1);
    for (i = 0; i < N; i++) {
        snprintf(key, sizeof(key), "big/%d", i);
        got = 0;
        st = kvf_store_get(big.st, key, big.buf, BIG, &got, 0);
        if (!present[i]) {
            bad += st != KVF_ERR_NO_KEY;
            continue;
        }
        kvs_fill(want, BIG, 300 + (uint64_t)i);
        if (st != KVF_OK) {
            printf("%s: %s\n", key, kvf_status_str(st));
            bad++;
            continue;
        }
        assert_int_equal(got, BIG);
        assert_memory_equal(big.buf, want, BIG);
    }
    printf("evictions: %d of %d keys evicted before the SIGKILL; after the "
           "failover %d key(s) not as expected\n",
           n_evicted, N, bad);
    assert_int_equal(bad, 0);
    free(want);
    kvs_client_close(&big);
    ha_down(&h);
}

/* etcd SIGSTOPped: the leader steps down within half a lease and no
 * master leads; each get sent again from master to master while the
 * look-ups of the leader in etcd time out still ends by its deadline
 * (an error, never wrong bytes). */
static void test_etcd_stopped(void **state)
{
    uint64_t t0, dt, longest = 0;
    kvf_status_t st = KVF_OK;
    size_t got;
    ha_t h;
    int i;

    (void)state;
    ha_up(&h);
    kvs_fill(h.c.buf, OBJ, 77);
    assert_int_equal(kvf_store_put(h.c.st, "kept", h.c.buf, OBJ, NULL), KVF_OK);
    assert_int_equal(kvf_test_etcd_signal(&g_etcd, SIGSTOP), 0);
    kvs_sleep_ms(LEADER_MS); /* past the step-down at half a lease */
    for (i = 0; i < 3; i++) {
        t0 = kvf_time_ms();
        st = kvf_store_get(h.c.st, "kept", h.c.buf, OBJ, &got, 0);
        dt = kvf_time_ms() - t0;
        longest = dt > longest ? dt : longest;
        if (st == KVF_OK) {
            unsigned char want[OBJ];

            kvs_fill(want, OBJ, 77);
            assert_int_equal(got, OBJ);
            assert_memory_equal(h.c.buf, want, OBJ);
            break; /* a loaded machine: etcd answered a look-up before */
        }
    }
    assert_int_equal(kvf_test_etcd_signal(&g_etcd, SIGCONT), 0);
    printf("etcd SIGSTOPped: gets end with %s; longest %lu ms (deadline "
           "%d)\n",
           kvf_status_str(st), (unsigned long)longest, CALL_MS);
    assert_true(longest <= CALL_MS + 250);
    ha_down(&h);
}

/* A listener on 127.0.0.2 (another host, for the client): where a forged
 * leader record points. *port_p gets its port. */
static int decoy_listen(uint16_t *port_p)
{
    struct sockaddr_in a = {.sin_family = AF_INET};
    socklen_t len = sizeof(a);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);

    assert_true(fd >= 0);
    inet_pton(AF_INET, "127.0.0.2", &a.sin_addr);
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    assert_int_equal(listen(fd, 16), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    *port_p = ntohs(a.sin_port);
    return fd;
}

/* Writes rec as the leader key's value (the lease kept), then checks
 * that a look-up refuses it and that a client given only etcd connects
 * nowhere: nothing reaches the decoy. */
static void forged_refused(kvf_etcd_t *e, int64_t lease, const char *rec,
                           int decoy)
{
    kvf_store_params_t p = {0};
    uint64_t epoch;
    kvf_store_h st;
    char val[256];

    assert_int_equal(kvf_etcd_put(e, g_key, rec, strlen(rec), lease, NULL),
                     KVF_OK);
    assert_int_equal(kvf_elect_lookup(g_etcd.endpoint, 1000, g_key, val,
                                      sizeof(val), &epoch),
                     KVF_ERR_AUTH);
    p.field_mask = KVF_STORE_PARAM_MASTER | KVF_STORE_PARAM_TIMEOUT;
    p.master = ""; /* etcd only */
    p.timeout_ms = 1500;
    if (kvf_store_connect(&p, &st) == KVF_OK) {
        assert_int_not_equal(kvf_store_exists(st, "x"), KVF_ERR_NO_KEY);
        kvf_store_disconnect(st);
    }
    assert_int_equal(accept(decoy, NULL, NULL), -1);
    assert_true(errno == EAGAIN || errno == EWOULDBLOCK);
}

static void test_forged_leader(void **state)
{
    kvf_etcd_t *e = NULL;
    kvf_etcd_kv_t *kv;
    char rec[512], *mac;
    kvs_proc_t m[2];
    kvs_client_t c;
    uint16_t port;
    int decoy;

    (void)state;
    memset(m, 0, sizeof(m));
    assert_int_equal(kvs_master(&m[0], 0, NULL), 0);
    assert_true(wait_leader_proc(m, -1, 5000, NULL) == 0);
    decoy = decoy_listen(&port);
    assert_int_equal(kvf_etcd_open(g_etcd.endpoint, 2000, &e), KVF_OK);
    assert_int_equal(kvf_etcd_get(e, g_key, &kv), KVF_OK);
    mac = strstr((char *)kv->val, " mac=");
    assert_non_null(mac); /* the genuine record carries its MAC */
    /* no MAC, a zero MAC, the genuine MAC on the decoy's address */
    snprintf(rec, sizeof(rec), "127.0.0.2:%u", port);
    forged_refused(e, kv->lease, rec, decoy);
    snprintf(rec, sizeof(rec), "127.0.0.2:%u mac=%064d", port, 0);
    forged_refused(e, kv->lease, rec, decoy);
    snprintf(rec, sizeof(rec), "127.0.0.2:%u%s", port, mac);
    forged_refused(e, kv->lease, rec, decoy);
    /* the genuine record back: clients find the leader again */
    assert_int_equal(kvf_etcd_put(e, g_key, kv->val, kv->len, kv->lease, NULL),
                     KVF_OK);
    assert_int_equal(kvs_client_open(&c, "", OBJ), 0);
    assert_int_equal(kvf_store_exists(c.st, "nothing"), KVF_ERR_NO_KEY);
    kvs_client_close(&c);
    kvf_etcd_kvs_free(kv, 1);
    kvf_etcd_close(e);
    close(decoy);
    kvs_stop(&m[0], SIGKILL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_failover),
        cmocka_unit_test(test_churn),
        cmocka_unit_test(test_evict),
        cmocka_unit_test(test_deposed),
        cmocka_unit_test(test_etcd_stopped),
        cmocka_unit_test(test_forged_leader),
    };
    char uri[128];
    int rc;

    kvs_bin();
    rc = kvf_test_etcd_up(&g_etcd);
    if (rc != 0) {
        return rc;
    }
    snprintf(uri, sizeof(uri), "etcd://%s", g_etcd.endpoint);
    setenv("KVF_METADATA", uri, 1);
    setenv("KVF_MASTER_LEASE_MS", "1000", 1);
    setenv("KVF_HEARTBEAT_MS", "200", 1);
    snprintf(g_key, sizeof(g_key), "/kvferry/master/leader");
    rc = cmocka_run_group_tests(tests, NULL, NULL);
    kvf_test_etcd_stop(&g_etcd);
    return rc;
}
