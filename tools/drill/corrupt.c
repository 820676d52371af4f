/*
 * corruption: bytes of stored objects are flipped inside the nodes'
 * pools, behind the master's back, with process_vm_readv/writev into the
 * node processes (the replica addresses are those the master hands out,
 * i.e. addresses in the node's own memory). Eight objects lose one of
 * their two replicas, four lose both.
 *
 * Expected: a get verifies the checksum and never returns the bad bytes:
 * an object with one good replica is served from it, byte for byte; one
 * with none fails with KVF_ERR_CHECKSUM. The clients, whose policy on a
 * checksum error is to remove the key and put it again, heal the objects
 * that lost both replicas; afterwards every damaged key reads back right.
 */
#include "tools/drill/store.h"

#include <kvferry/store.h>

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "core/time.h"

#define KVF_CORRUPT_KEYS   12
#define KVF_CORRUPT_DOUBLE 4 /* the last ones lose both replicas */

typedef struct kvf_corrupt_probe {
    char master[64];
    unsigned timeout_ms;
    int mode; /* 0: query locations, 1: get and check, 2: get, heal */
    char key[KVF_CORRUPT_KEYS][128];
    unsigned nrep[KVF_CORRUPT_KEYS];
    char seg[KVF_CORRUPT_KEYS][2][KVF_DRILL_ADDR];
    uint64_t addr[KVF_CORRUPT_KEYS][2];
    uint64_t size[KVF_CORRUPT_KEYS];
    int status[KVF_CORRUPT_KEYS];
    uint64_t wrong[KVF_CORRUPT_KEYS];
    int healed[KVF_CORRUPT_KEYS];
} kvf_corrupt_probe_t;

static int kvf_corrupt_helper(kvf_drill_t *d, void *arg)
{
    kvf_corrupt_probe_t *p = arg;
    kvf_store_params_t sp = {0};
    kvf_store_put_opts_t po = {2, 0};
    unsigned char *buf, *scratch;
    kvf_store_info_t info;
    size_t cap = 1u << 20, len;
    kvf_region_h reg;
    kvf_store_h st;
    kvf_status_t s;
    unsigned i, j;

    (void)d;
    buf = aligned_alloc(4096, 2 * cap);
    if (buf == NULL) {
        return 1;
    }
    scratch = buf + cap;
    sp.field_mask = KVF_STORE_PARAM_MASTER | KVF_STORE_PARAM_TIMEOUT;
    sp.master = p->master;
    sp.timeout_ms = p->timeout_ms;
    if (kvf_store_connect(&sp, &st) != KVF_OK) {
        return 1;
    }
    if (kvf_engine_reg(kvf_store_engine(st), buf, cap, KVF_MEM_HOST, 0, &reg) !=
        KVF_OK) {
        return 1;
    }
    for (i = 0; i < KVF_CORRUPT_KEYS; i++) {
        if (p->mode == 0) {
            s = kvf_store_query(st, p->key[i], &info);
            p->status[i] = s;
            if (s != KVF_OK) {
                continue;
            }
            p->size[i] = info.size;
            p->nrep[i] = info.replicas > 2 ? 2 : info.replicas;
            for (j = 0; j < p->nrep[i]; j++) {
                snprintf(p->seg[i][j], sizeof(p->seg[i][j]), "%s",
                         info.segment[j]);
                p->addr[i][j] = info.addr[j];
            }
            continue;
        }
        s = kvf_store_get(st, p->key[i], buf, cap, &len, 0);
        if (s == KVF_ERR_CHECKSUM && p->mode == 2) {
            /* the clients' policy: drop the damaged object (once the
             * lease this get took has passed), store it again */
            uint64_t end = kvf_time_ms() + KVF_DRILL_LEASE_MS + 500;

            while (kvf_store_remove(st, p->key[i]) == KVF_ERR_LEASED &&
                   kvf_time_ms() < end) {
                usleep(50000);
            }
            len = kvf_drill_obj_size(p->key[i], 8, 64);
            kvf_drill_obj_fill(buf, p->key[i], 7, len);
            if (kvf_store_put(st, p->key[i], buf, len, &po) == KVF_OK) {
                p->healed[i] = 1;
            }
            s = kvf_store_get(st, p->key[i], buf, cap, &len, 0);
        }
        p->status[i] = s;
        p->wrong[i] = (s == KVF_OK)
                          ? kvf_drill_obj_check(buf, len, p->key[i], 0, scratch)
                          : 0;
    }
    kvf_engine_dereg(kvf_store_engine(st), reg);
    kvf_store_disconnect(st);
    free(buf);
    return 0;
}

/* Flips 64 bytes in the middle of a replica inside the node's memory. */
static int kvf_corrupt_replica(pid_t pid, uint64_t addr, uint64_t size)
{
    unsigned char bytes[64];
    struct iovec local = {bytes, sizeof(bytes)};
    struct iovec remote = {(void *)(uintptr_t)(addr + size / 2), sizeof(bytes)};
    size_t i;

    if (size < 2 * sizeof(bytes) ||
        process_vm_readv(pid, &local, 1, &remote, 1, 0) !=
            (ssize_t)sizeof(bytes)) {
        return -1;
    }
    for (i = 0; i < sizeof(bytes); i++) {
        bytes[i] ^= 0x5a;
    }
    return process_vm_writev(pid, &local, 1, &remote, 1, 0) ==
                   (ssize_t)sizeof(bytes)
               ? 0
               : -1;
}

static pid_t kvf_corrupt_node_pid(kvf_drill_cluster_t *c, const char *seg)
{
    unsigned i;

    for (i = 0; i < c->nnodes; i++) {
        if (strcmp(c->node_seg[i], seg) == 0) {
            return c->node[i];
        }
    }
    return -1;
}

int kvf_drill_corruption(kvf_drill_t *d)
{
    kvf_drill_cluster_t c = {.replicas = 2};
    kvf_kv_arg_t a = {.keys = 60,
                      .min_kb = 8,
                      .max_kb = 64,
                      .get_pct = 95,
                      .heal_checksum = 1};
    kvf_drill_res_t base, after, mbase, mafter;
    kvf_corrupt_probe_t *p;
    uint64_t bound = kvf_drill_store_bound(d, 2), t0, t_heal, wrong = 0;
    unsigned i, j, flipped = 0, single_ok = 0, double_sum = 0, good = 0;
    char text[700];

    snprintf(text, sizeof(text),
             "bytes flipped in the node pools behind the master's back "
             "are never handed back: of %d objects, the %d with one good "
             "replica read right, the %d with none fail with "
             "KVF_ERR_CHECKSUM; the clients then remove and put them "
             "again, after which all %d read right",
             KVF_CORRUPT_KEYS, KVF_CORRUPT_KEYS - KVF_CORRUPT_DOUBLE,
             KVF_CORRUPT_DOUBLE, KVF_CORRUPT_KEYS);
    kvf_drill_expect(d, text);
    p = kvf_drill_shared_alloc(sizeof(*p));
    if (p == NULL || kvf_drill_store_begin(d, &c, 2, &a, 2) != 0) {
        return -1;
    }
    /* clients stay paused: the keys stand still */
    kvf_drill_store_baseline(d, &c, &base, &mbase, NULL, 1);

    snprintf(p->master, sizeof(p->master), "%s", c.master_addr);
    p->timeout_ms = d->timeout_ms;
    for (i = 0; i < KVF_CORRUPT_KEYS; i++) {
        kvf_drill_kv_key(p->key[i], sizeof(p->key[i]), d, &a, 0, i);
    }
    p->mode = 0;
    kvf_drill_oneshot(d, NULL, kvf_corrupt_helper, p, 20000);
    for (i = 0; i < KVF_CORRUPT_KEYS; i++) {
        unsigned n = (i >= KVF_CORRUPT_KEYS - KVF_CORRUPT_DOUBLE) ? 2 : 1;

        if (p->status[i] != KVF_OK || p->nrep[i] < 2) {
            kvf_drill_fail(d, "%s: query %s, %u replicas", p->key[i],
                           kvf_status_name((kvf_status_t)p->status[i]),
                           p->nrep[i]);
            continue;
        }
        for (j = 0; j < n; j++) {
            pid_t pid = kvf_corrupt_node_pid(&c, p->seg[i][j]);

            if (pid > 0 &&
                kvf_corrupt_replica(pid, p->addr[i][j], p->size[i]) == 0) {
                flipped++;
            } else {
                kvf_drill_fail(d, "could not flip bytes of %s in %s", p->key[i],
                               p->seg[i][j]);
            }
        }
    }
    snprintf(text, sizeof(text),
             "64 bytes XOR 0x5a in the middle of %u replicas "
             "(process_vm_writev into the node processes): one replica of "
             "%d objects, both of %d",
             flipped, KVF_CORRUPT_KEYS - KVF_CORRUPT_DOUBLE,
             KVF_CORRUPT_DOUBLE);
    kvf_drill_injected(d, text);

    /* a client reads every damaged key once, before anyone heals */
    p->mode = 1;
    kvf_drill_oneshot(d, NULL, kvf_corrupt_helper, p, 30000);
    for (i = 0; i < KVF_CORRUPT_KEYS; i++) {
        wrong += p->wrong[i];
        if (i < KVF_CORRUPT_KEYS - KVF_CORRUPT_DOUBLE) {
            single_ok += (p->status[i] == KVF_OK && p->wrong[i] == 0);
        } else {
            double_sum += (p->status[i] == KVF_ERR_CHECKSUM);
        }
    }
    kvf_record_figure(d->rec, "one replica damaged: served right", single_ok,
                      "objects", NAN, NAN);
    kvf_record_figure(d->rec, "both damaged: KVF_ERR_CHECKSUM", double_sum,
                      "objects", NAN, NAN);
    kvf_drill_check(d, single_ok == KVF_CORRUPT_KEYS - KVF_CORRUPT_DOUBLE,
                    "%u of %d objects with a good replica read right",
                    single_ok, KVF_CORRUPT_KEYS - KVF_CORRUPT_DOUBLE);
    kvf_drill_check(d, double_sum == KVF_CORRUPT_DOUBLE,
                    "%u of %d objects without a good replica failed with "
                    "KVF_ERR_CHECKSUM",
                    double_sum, KVF_CORRUPT_DOUBLE);

    /* the clients run on the damaged store, healing what they find */
    t0 = kvf_time_ms();
    kvf_drill_phase(d, KVF_DRILL_FAULT);
    kvf_drill_workers_pause(d, NULL, 1);
    kvf_drill_sleep(d, d->phase_ms);
    t_heal = kvf_time_ms();
    d->phase_secs[KVF_DRILL_FAULT] = (double)(t_heal - t0) / 1000.0;
    kvf_drill_phase(d, KVF_DRILL_RECOVER);
    kvf_drill_sleep(d, d->phase_ms);
    kvf_drill_workers_pause(d, &after, 0);
    kvf_drill_master_res(d, &c, &mafter);
    d->phase_secs[KVF_DRILL_RECOVER] = (double)(kvf_time_ms() - t_heal) / 1e3;
    p->mode = 2;
    memset(p->healed, 0, sizeof(p->healed));
    kvf_drill_oneshot(d, NULL, kvf_corrupt_helper, p, 30000);
    for (i = 0; i < KVF_CORRUPT_KEYS; i++) {
        wrong += p->wrong[i];
        good += (p->status[i] == KVF_OK && p->wrong[i] == 0);
    }
    d->time_to_recover_ms = (double)(kvf_time_ms() - t0);
    kvf_drill_workers_stop(d);
    kvf_drill_store_report(d, &c, &mbase, &mafter);
    kvf_drill_resources(d, "clients", &base, &after);
    kvf_drill_traffic_report(d, bound);
    kvf_record_drill_num(d->rec, "wrong bytes in the probes", (double)wrong);
    kvf_drill_check(d, wrong == 0, "%lu wrong bytes handed to the probe",
                    (unsigned long)wrong);
    kvf_drill_check(d, good == KVF_CORRUPT_KEYS,
                    "%u of %d damaged keys read right after healing", good,
                    KVF_CORRUPT_KEYS);
    snprintf(text, sizeof(text),
             "probe: %u/%d single-damaged read right, %u/%d double-damaged "
             "KVF_ERR_CHECKSUM; clients under traffic: %lu wrong bytes, "
             "errors by status in the table; longest call %.0f ms (bound "
             "%lu)",
             single_ok, KVF_CORRUPT_KEYS - KVF_CORRUPT_DOUBLE, double_sum,
             KVF_CORRUPT_DOUBLE, (unsigned long)d->wrong_bytes, d->max_wait_ms,
             (unsigned long)bound);
    kvf_record_drill_text(d->rec, "observed", text);
    snprintf(text, sizeof(text),
             "clients removed and stored again the objects they found "
             "damaged; afterwards %u/%d damaged keys read right (%.0f ms "
             "after the damage was first exposed to traffic)",
             good, KVF_CORRUPT_KEYS, d->time_to_recover_ms);
    kvf_record_drill_text(d->rec, "recovery", text);
    kvf_record_not_verified(d->rec, "scrubbing: a replica damaged while "
                                    "another is good stays damaged (no "
                                    "repair by the store)");
    kvf_drill_cluster_stop(&c);
    return 0;
}
