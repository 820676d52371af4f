/*
 * A node's disk tier with real files (O_DIRECT through io_uring, or
 * pread/pwrite where io_uring is not allowed), real processes on
 * 127.0.0.1, every byte checked:
 * - three pools' worth of objects through one pool: every one read back
 *   byte for byte, most of them loaded from the disk tier;
 * - bytes flipped in the tier's file: gets are misses, never wrong data;
 *   the damaged copies are dropped and counted;
 * - the tier's file system fills up: the tier turns off with one clear
 *   line, the node serves its pool on, no wrong byte;
 * - a node killed and restarted on its directory: its objects served
 *   again;
 * - a single master killed and started again: its index rebuilt from the
 *   node's disk tier within seconds, every object served again.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "test_store_harness.h"
#include "core/time.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#define MiB (1024 * 1024)

static char g_dir[256];

/* A fresh tier directory under /tmp (removed by the next test). */
static const char *tier_dir(const char *name)
{
    char cmd[512];

    snprintf(g_dir, sizeof(g_dir), "/tmp/kvf-test-tier-%d-%s", (int)getpid(),
             name);
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", g_dir);
    if (system(cmd) != 0) {
        fail_msg("cannot clear %s", g_dir);
    }
    return g_dir;
}

static void put_n(kvs_client_t *c, const char *pfx, int n, size_t len)
{
    char key[64];
    int i;

    for (i = 0; i < n; i++) {
        snprintf(key, sizeof(key), "%s/%d", pfx, i);
        kvs_fill(c->buf, len, (uint64_t)i * 7 + 1);
        assert_int_equal(kvf_store_put(c->st, key, c->buf, len, NULL), KVF_OK);
    }
}

/* Puts as put_n, 8 at a time, each 8 once the tier has copied them (a
 * client faster than the disk would see the coldest objects not copied
 * yet evicted for good). */
static void put_paced(kvs_client_t *c, const char *http, const char *pfx,
                      int n, size_t len)
{
    uint64_t deadline;
    long base = kvs_metric(http, "tier_writes_total");
    char key[64];
    int i;

    for (i = 0; i < n; i++) {
        snprintf(key, sizeof(key), "%s/%d", pfx, i);
        kvs_fill(c->buf, len, (uint64_t)i * 7 + 1);
        assert_int_equal(kvf_store_put(c->st, key, c->buf, len, NULL), KVF_OK);
        if (i % 8 != 7 && i != n - 1) {
            continue;
        }
        deadline = kvf_time_ms() + 10000;
        while (kvs_metric(http, "tier_writes_total") < base + i + 1 &&
               kvf_time_ms() < deadline) {
            kvs_sleep_ms(5);
        }
    }
}

/* Gets pfx/0..n-1: each one is byte for byte right or a miss (never
 * wrong bytes, never another error); returns the hits. */
static int get_n(kvs_client_t *c, const char *pfx, int n, size_t len)
{
    char key[64];
    size_t got;
    kvf_status_t st;
    int i, hits = 0;

    for (i = 0; i < n; i++) {
        snprintf(key, sizeof(key), "%s/%d", pfx, i);
        kvs_fill(c->buf, len, (uint64_t)i * 7 + 1);
        memset(c->buf + len, 0xee, len);
        st = kvf_store_get(c->st, key, c->buf + len, len, &got, 0);
        if (st == KVF_ERR_NO_KEY) {
            continue;
        }
        if (st != KVF_OK) {
            fail_msg("get %s: %s", key, kvf_status_str(st));
        }
        assert_int_equal(got, len);
        assert_memory_equal(c->buf, c->buf + len, len);
        hits++;
    }
    return hits;
}

/* Waits until metric reaches at least want (10 s). */
static long metric_at_least(const char *http, const char *name, long want)
{
    uint64_t deadline = kvf_time_ms() + 10000;
    long v;

    while ((v = kvs_metric(http, name)) < want && kvf_time_ms() < deadline) {
        kvs_sleep_ms(50);
    }
    return v;
}

/* Does the test log (the spawned processes' stderr) hold text? */
static int log_has(const char *text)
{
    char path[64], line[1024];
    int found = 0;
    FILE *fp;

    snprintf(path, sizeof(path), "/tmp/kvf-test-store-%d.log", (int)getpid());
    fp = fopen(path, "r");
    while (fp != NULL && !found && fgets(line, sizeof(line), fp) != NULL) {
        found = strstr(line, text) != NULL;
    }
    if (fp != NULL) {
        fclose(fp);
    }
    return found;
}

static int setup(void **state)
{
    (void)state;
    kvs_bin();
    return 0;
}

/* 48 MiB through a 16 MiB pool: all of it comes back, mostly from disk. */
static void test_tier_roundtrip(void **state)
{
    enum { N = 48 };
    const char *extra[] = {"--disk", tier_dir("rt"), "--disk-size", "96M",
                           NULL};
    kvs_proc_t m, n;
    kvs_client_t c;
    struct stat sb;
    char path[300];
    int hits;

    (void)state;
    assert_int_equal(kvs_master(&m, 0, NULL), 0);
    setenv("KVF_LOG_LEVEL", "info", 1); /* the node's line about its tier */
    assert_int_equal(kvs_node(&n, m.addr, "16M", extra), 0);
    unsetenv("KVF_LOG_LEVEL");
    snprintf(path, sizeof(path), "%s/tier.data", g_dir);
    assert_int_equal(stat(path, &sb), 0);
    assert_int_equal(sb.st_size, 96 * MiB);
    assert_true(log_has("O_DIRECT through"));
    assert_int_equal(kvs_metric(m.http, "disk_tiers"), 1);
    assert_int_equal(kvs_client_open(&c, m.addr, 2 * MiB), 0);
    put_paced(&c, m.http, "rt", N, MiB);
    assert_int_equal(kvs_metric(m.http, "tier_writes_total"), N);
    assert_true(kvs_metric(m.http, "objects_disk_only") > N / 2);
    hits = get_n(&c, "rt", N, MiB);
    print_message("%d of %d objects read back through a pool of a third of "
                  "them; %ld loaded from disk, %ld evicted for good\n",
                  hits, N, kvs_metric(m.http, "tier_reads_total"),
                  kvs_metric(m.http, "evictions_total"));
    assert_int_equal(hits, N);
    assert_int_equal(kvs_metric(m.http, "evictions_total"), 0);
    assert_true(kvs_metric(m.http, "tier_reads_total") >= N / 2);
    assert_int_equal(kvs_metric(m.http, "tier_corrupt_total"), 0);
    /* a second pass: every object again, loaded back in turn */
    assert_int_equal(get_n(&c, "rt", N, MiB), N);
    /* unpaced: what the client outruns is counted, never wrong */
    put_n(&c, "fast", N, MiB);
    hits = get_n(&c, "fast", N, MiB);
    print_message("unpaced: %d of %d read back, %ld evicted for good\n",
                  hits, N, kvs_metric(m.http, "evictions_total"));
    assert_true(hits + kvs_metric(m.http, "evictions_total") >= N);
    kvs_client_close(&c);
    kvs_stop(&n, 0);
    kvs_stop(&m, 0);
}

/* Flips one byte in every 4 KiB of the first 32 MiB of a file. */
static void flip_bytes(const char *path)
{
    unsigned char b;
    off_t off;
    int fd = open(path, O_RDWR);

    assert_true(fd >= 0);
    for (off = 100; off < 32 * MiB; off += 4096) {
        assert_int_equal(pread(fd, &b, 1, off), 1);
        b ^= 0x5a;
        assert_int_equal(pwrite(fd, &b, 1, off), 1);
    }
    assert_int_equal(fsync(fd), 0);
    close(fd);
}

/* Bytes flipped under the node: misses, never wrong data. */
static void test_tier_corrupt(void **state)
{
    enum { N = 32 };
    const char *extra[] = {"--disk", tier_dir("corrupt"), "--disk-size",
                           "64M", NULL};
    kvs_proc_t m, n;
    kvs_client_t c;
    char path[300];
    int hits;

    (void)state;
    assert_int_equal(kvs_master(&m, 0, NULL), 0);
    assert_int_equal(kvs_node(&n, m.addr, "16M", extra), 0);
    assert_int_equal(kvs_client_open(&c, m.addr, 2 * MiB), 0);
    put_paced(&c, m.http, "c", N, MiB);
    assert_true(kvs_metric(m.http, "objects_disk_only") >= N / 2);
    snprintf(path, sizeof(path), "%s/tier.data", g_dir);
    flip_bytes(path);
    hits = get_n(&c, "c", N, MiB);
    print_message("after flipping bytes in the tier: %d of %d hits, %ld "
                  "damaged copies dropped\n",
                  hits, N, kvs_metric(m.http, "tier_corrupt_total"));
    assert_true(hits < N);
    assert_true(kvs_metric(m.http, "tier_corrupt_total") >= N / 2 - 2);
    assert_true(log_has("fails its checksum: dropped"));
    /* the store goes on: the keys can be put again and read back */
    put_n(&c, "c2", 8, MiB);
    assert_int_equal(get_n(&c, "c2", 8, MiB), 8);
    kvs_client_close(&c);
    kvs_stop(&n, 0);
    kvs_stop(&m, 0);
}

/* The tier's file system fills: the tier goes off, the pool serves. */
static void test_tier_full(void **state)
{
    enum { N = 40 };
    const char *dir = tier_dir("full");
    const char *extra[] = {"--disk", dir, "--disk-size", "64M", NULL};
    const char *const mopt[] = {"--lease", "300ms", NULL};
    kvs_proc_t m, n;
    kvs_client_t c;
    char mnt[300];
    int hits;

    (void)state;
    snprintf(mnt, sizeof(mnt), "%s", dir);
    mkdir(mnt, 0700);
    if (mount("tmpfs", mnt, "tmpfs", 0, "size=8m") != 0) {
        rmdir(mnt);
        skip(); /* not root, or no mount allowed here */
    }
    assert_int_equal(kvs_master(&m, 0, mopt), 0);
    assert_int_equal(kvs_node(&n, m.addr, "16M", extra), 0);
    assert_int_equal(kvs_client_open(&c, m.addr, 2 * MiB), 0);
    put_n(&c, "f", N, MiB);
    assert_int_equal(metric_at_least(m.http, "disk_tiers_off", 1), 1);
    assert_true(log_has("(the disk is full)"));
    assert_true(log_has("disk tier of node"));
    hits = get_n(&c, "f", N, MiB);
    print_message("tier on an 8 MiB file system: off after %ld writes; %d "
                  "of %d objects still served (from the pool)\n",
                  kvs_metric(m.http, "tier_writes_total"), hits, N);
    assert_true(hits >= 8);
    /* puts and gets go on in memory (once the reads' leases end) */
    kvs_sleep_ms(400);
    put_n(&c, "f2", 8, MiB);
    assert_int_equal(get_n(&c, "f2", 8, MiB), 8);
    kvs_client_close(&c);
    kvs_stop(&n, 0);
    kvs_stop(&m, 0);
    umount(mnt);
    rmdir(mnt);
}

/* Flips the byte at off of a file. */
static void flip_at(const char *path, off_t off)
{
    unsigned char b;
    int fd = open(path, O_RDWR);

    assert_true(fd >= 0);
    assert_int_equal(pread(fd, &b, 1, off), 1);
    b ^= 0xa5;
    assert_int_equal(pwrite(fd, &b, 1, off), 1);
    assert_int_equal(fsync(fd), 0);
    close(fd);
}

/* A node killed and restarted on its directory offers its objects again;
 * a damaged manifest record and a damaged object are dropped, counted. */
static void test_tier_restart(void **state)
{
    enum { N = 32 };
    const char *const mopt[] = {"--node-ttl", "1000ms", "--heartbeat",
                                "200ms", NULL};
    const char *extra[] = {"--disk", tier_dir("restart"), "--disk-size",
                           "64M", NULL};
    char path[300];
    struct stat sb;
    kvs_proc_t m, n;
    kvs_client_t c;
    int hits;

    (void)state;
    assert_int_equal(kvs_master(&m, 0, mopt), 0);
    assert_int_equal(kvs_node(&n, m.addr, "16M", extra), 0);
    assert_int_equal(kvs_client_open(&c, m.addr, 2 * MiB), 0);
    put_paced(&c, m.http, "r", N, MiB);
    assert_int_equal(kvs_metric(m.http, "tier_writes_total"), N);
    kvs_stop(&n, SIGKILL);
    assert_true(kvs_metric_wait(m.http, "nodes", 0, 5000));
    /* damage while it is down: a byte of a manifest record (the middle
     * of the log) and a byte of the object at the start of the file */
    snprintf(path, sizeof(path), "%s/tier.manifest", g_dir);
    assert_int_equal(stat(path, &sb), 0);
    flip_at(path, sb.st_size / 2);
    snprintf(path, sizeof(path), "%s/tier.data", g_dir);
    flip_at(path, 100);
    setenv("KVF_LOG_LEVEL", "info", 1); /* the node's line of what it restored */
    assert_int_equal(kvs_node(&n, m.addr, "16M", extra), 0);
    unsetenv("KVF_LOG_LEVEL");
    assert_true(metric_at_least(m.http, "objects", N - 2) >= N - 2);
    hits = get_n(&c, "r", N, MiB);
    print_message("after the node's restart: %d of %d objects served again\n",
                  hits, N);
    /* the two damaged ones are misses, every other one is back */
    assert_int_equal(hits, N - 2);
    assert_true(log_has("30 object(s) restored, 1 damaged manifest record(s) "
                        "and 1 damaged object(s) dropped"));
    kvs_client_close(&c);
    kvs_stop(&n, 0);
    kvs_stop(&m, 0);
}

/* A single master killed and started again on its address: the node
 * registers again and reports its disk tier, the master rebuilds its
 * index from it and serves the objects again within seconds. */
static void test_tier_master_restart(void **state)
{
    enum { N = 32 };
    const char *extra[] = {"--disk", tier_dir("mrestart"), "--disk-size",
                           "64M", NULL};
    char port[16], *colon;
    kvs_proc_t m, n;
    kvs_client_t c;
    uint64_t t0;
    long objs;
    int hits;

    (void)state;
    assert_int_equal(kvs_master(&m, 0, NULL), 0);
    assert_int_equal(kvs_node(&n, m.addr, "16M", extra), 0);
    assert_int_equal(kvs_client_open(&c, m.addr, 2 * MiB), 0);
    put_paced(&c, m.http, "mr", N, MiB);
    assert_int_equal(kvs_metric(m.http, "tier_writes_total"), N);
    colon = strrchr(m.addr, ':');
    snprintf(port, sizeof(port), "%s", colon + 1);
    kvs_stop(&m, SIGKILL);
    assert_int_equal(kvs_master(&m, (unsigned)atoi(port), NULL), 0);
    t0 = kvf_time_ms();
    objs = metric_at_least(m.http, "objects", N);
    print_message("master restarted: %ld objects rebuilt from the node's "
                  "disk tier in %lu ms\n",
                  objs, (unsigned long)(kvf_time_ms() - t0));
    assert_int_equal(objs, N);
    assert_true(kvf_time_ms() - t0 < 5000);
    hits = get_n(&c, "mr", N, MiB);
    assert_int_equal(hits, N);
    kvs_client_close(&c);
    kvs_stop(&n, 0);
    kvs_stop(&m, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tier_roundtrip),
        cmocka_unit_test(test_tier_corrupt),
        cmocka_unit_test(test_tier_full),
        cmocka_unit_test(test_tier_restart),
        cmocka_unit_test(test_tier_master_restart),
    };

    return cmocka_run_group_tests(tests, setup, NULL);
}
