/*
 * Master high-availability drills: a real etcd (the `etcd` program,
 * started here on free loopback ports; the drills skip without it), two
 * `kvferry master` processes with metadata = etcd and a 1 s leader lease,
 * one node, two store clients under traffic. The clients and the node
 * find the leader through etcd.
 *
 *   master-failover   SIGKILL of the leader: the standby takes over
 *   etcd-leader-stop  SIGSTOP of etcd (held 2 s): the leader steps down
 *                     within half its lease, calls fail within their
 *                     bound (nothing hangs); after SIGCONT the standby
 *                     leads
 *   etcd-down         etcd stopped (SIGTERM) for 2 s and started again:
 *                     the same, through a restart
 *
 * Recorded: time to the new leader, first successful call after the
 * fault, the epochs, objects the old leader held and how many the new
 * one serves (rebuilt from the node's inventory), wrong bytes (must be
 * 0), the longest call (within its bound), and the clients' hit rate over
 * time (hits.c): after the leader's death it must be back to 90 % of its
 * level before within 10 s. Before the fault a helper
 * puts KVF_HA_PROBES objects of its own; after it every one must read
 * back byte for byte from the new leader: "committed objects lost" is
 * checked to be 0.
 */
#include "tools/drill/drill.h"
#include "tools/drill/ha.h"

#define KVF_HA_PROBES 100
#include "tools/drill/store.h"

#include <kvferry/store.h>

#include <arpa/inet.h>
#include <math.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/time.h"
#include "core/sock.h"
#include "tools/cli/net.h"

int kvf_ha_which(const char *name, char *out, size_t len)
{
    const char *path = getenv("PATH"), *p, *e;
    size_t n;

    for (p = path ? path : "/usr/bin"; *p != '\0'; p = *e ? e + 1 : e) {
        e = strchr(p, ':');
        e = e ? e : p + strlen(p);
        n = (size_t)(e - p);
        snprintf(out, len, "%.*s/%s", (int)n, p, name);
        if (access(out, X_OK) == 0) {
            return 0;
        }
    }
    return -1;
}

unsigned kvf_ha_free_port(void)
{
    struct sockaddr_in sa = {.sin_family = AF_INET};
    socklen_t sl = sizeof(sa);
    unsigned port = 0;
    int fd = socket(AF_INET, SOCK_STREAM, 0);

    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 &&
        getsockname(fd, (struct sockaddr *)&sa, &sl) == 0) {
        port = ntohs(sa.sin_port);
    }
    if (fd >= 0) {
        close(fd);
    }
    return port;
}

/* Starts etcd (again, on the same ports and data after a stop). */
int kvf_ha_etcd_start(kvf_drill_t *d, kvf_ha_t *h)
{
    char curl[64], purl[64], cluster[96], data[700];
    uint64_t t0;
    int fd;

    snprintf(curl, sizeof(curl), "http://127.0.0.1:%u", h->cport);
    snprintf(purl, sizeof(purl), "http://127.0.0.1:%u", h->pport);
    snprintf(cluster, sizeof(cluster), "kvf-drill=%s", purl);
    snprintf(data, sizeof(data), "%s/data", h->etcd_dir);
    h->etcd = kvf_drill_fork(NULL);
    if (h->etcd == 0) {
        kvf_drill_log_to(d, "etcd");
        execl(h->etcd_bin, "etcd", "--name", "kvf-drill", "--data-dir", data,
              "--listen-client-urls", curl, "--advertise-client-urls", curl,
              "--listen-peer-urls", purl, "--initial-advertise-peer-urls", purl,
              "--initial-cluster", cluster, "--heartbeat-interval", "20",
              "--election-timeout", "200", "--log-level", "error",
              (char *)NULL);
        _exit(127);
    }
    if (h->etcd < 0) {
        return -1;
    }
    for (t0 = kvf_time_ms(); kvf_time_ms() - t0 < 10000; usleep(50000)) {
        if (kvf_sock_connect("127.0.0.1", (uint16_t)h->cport, 500, &fd) ==
            KVF_OK) {
            close(fd);
            return 0;
        }
    }
    kvf_drill_fail(d, "etcd did not start (log in %s)", d->logdir);
    return -1;
}

int kvf_ha_status(kvf_drill_t *d, kvf_ha_t *h, int i, kvf_drill_mstatus_t *s)
{
    snprintf(h->c.http_addr, sizeof(h->c.http_addr), "%s", h->http[i]);
    return kvf_drill_status(d, &h->c, s);
}

/* Waits until master i (or, i < 0, any) leads with n nodes: its index,
 * and the ms waited in *ms_p; -1 after max_ms. */
int kvf_ha_wait_leader(kvf_drill_t *d, kvf_ha_t *h, int i, unsigned n,
                       unsigned max_ms, double *ms_p)
{
    uint64_t t0 = kvf_time_ms();
    kvf_drill_mstatus_t s;
    int k;

    do {
        for (k = 0; k < 2; k++) {
            if ((i < 0 || k == i) && h->m[k] > 0 &&
                kvf_ha_status(d, h, k, &s) == 0 && s.leader == 1 &&
                s.nodes == n) {
                *ms_p = (double)(kvf_time_ms() - t0);
                return k;
            }
        }
        kvf_drill_sleep(d, 20);
    } while (kvf_time_ms() - t0 < max_ms);
    return -1;
}

/* Finds etcd (a skip when absent), picks its dir and ports, and points
 * KVF_METADATA at it: -1 after the skip. */
int kvf_ha_etcd_env(kvf_drill_t *d, kvf_ha_t *h)
{
    if (kvf_ha_which("etcd", h->etcd_bin, sizeof(h->etcd_bin)) != 0) {
        kvf_drill_skip(d, "etcd is not installed (scripts/setup.sh)");
        return -1;
    }
    snprintf(h->etcd_dir, sizeof(h->etcd_dir), "%s/etcd-%d", d->logdir,
             (int)getpid());
    h->cport = kvf_ha_free_port();
    h->pport = kvf_ha_free_port();
    snprintf(h->uri, sizeof(h->uri), "etcd://127.0.0.1:%u", h->cport);
    /* inherited by every process the drill starts */
    setenv("KVF_METADATA", h->uri, 1);
    setenv("KVF_MASTER_LEASE_MS", "1000", 1);
    return 0;
}

/* etcd, the masters, the node; the first master leads. */
static int kvf_ha_up(kvf_drill_t *d, kvf_ha_t *h)
{
    double ms;

    if (kvf_ha_etcd_env(d, h) != 0 || kvf_ha_etcd_start(d, h) != 0) {
        return -1;
    }
    h->c.replicas = 1;
    if (kvf_drill_cluster_start(d, &h->c, 1) != 0) {
        return -1;
    }
    h->m[0] = h->c.master;
    snprintf(h->addr[0], sizeof(h->addr[0]), "%s", h->c.master_addr);
    snprintf(h->http[0], sizeof(h->http[0]), "%s", h->c.http_addr);
    h->c.http_listen[0] = '\0'; /* the second master: ports of its own */
    if (kvf_drill_master_start(d, &h->c, "127.0.0.1:0") != 0) {
        return -1;
    }
    h->m[1] = h->c.master;
    snprintf(h->addr[1], sizeof(h->addr[1]), "%s", h->c.master_addr);
    snprintf(h->http[1], sizeof(h->http[1]), "%s", h->c.http_addr);
    h->c.master = h->m[0];
    snprintf(h->c.master_addr, sizeof(h->c.master_addr), "%s", h->addr[0]);
    if (kvf_ha_wait_leader(d, h, 0, 1, 10000, &ms) != 0) {
        kvf_drill_fail(d, "the first master did not lead with the node");
        return -1;
    }
    kvf_record_config(d->rec, "etcd", h->uri);
    kvf_record_config(d->rec, "masters", h->addr[1]);
    kvf_record_config_num(d->rec, "leader lease ms", KVF_HA_LEASE_MS);
    return 0;
}

void kvf_ha_down(kvf_ha_t *h)
{
    char cmd[700];
    int i;

    h->c.master = 0; /* the masters are killed below */
    kvf_drill_cluster_stop(&h->c);
    for (i = 0; i < 2; i++) {
        if (h->m[i] > 0) {
            kvf_drill_kill(h->m[i], SIGKILL);
        }
        if (h->proxy[i] > 0) {
            kill(h->proxy[i], SIGCONT);
            kvf_drill_kill(h->proxy[i], SIGKILL);
        }
    }
    if (h->etcd > 0) {
        kill(h->etcd, SIGCONT);
        kvf_drill_kill(h->etcd, SIGTERM);
    }
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", h->etcd_dir);
    if (h->etcd_dir[0] != '\0' && system(cmd) != 0) {
        fprintf(stderr, "drill: could not remove %s\n", h->etcd_dir);
    }
    unsetenv("KVF_METADATA");
    unsetenv("KVF_MASTER_LEASE_MS");
}

void kvf_ha_epoch_bump(kvf_drill_t *d)
{
    unsigned i;

    for (i = 0; i < d->nworkers; i++) {
        __atomic_add_fetch(&d->sh[i]->epoch, 1, __ATOMIC_RELEASE);
    }
}

/* The fault; returns the master that must not lead afterwards. */
static int kvf_ha_inject(kvf_drill_t *d, kvf_ha_t *h, int fault,
                         double *stepdown_ms)
{
    kvf_drill_mstatus_t s;
    uint64_t t0 = kvf_time_ms();

    *stepdown_ms = NAN;
    if (fault == KVF_HA_KILL_LEADER) {
        kvf_drill_kill(h->m[0], SIGKILL);
        h->m[0] = 0;
        h->c.master = 0;
        kvf_drill_injected(d, "SIGKILL to the leading master under traffic "
                              "of 2 clients");
        return 0;
    }
    if (fault == KVF_HA_STOP_ETCD) {
        kill(h->etcd, SIGSTOP);
        kvf_drill_injected(d, "SIGSTOP to etcd for 2 s under traffic");
    } else {
        kvf_drill_kill(h->etcd, SIGTERM);
        h->etcd = 0;
        kvf_drill_injected(d, "etcd stopped (SIGTERM) for 2 s under "
                              "traffic, then started again");
    }
    while (kvf_time_ms() - t0 < 2000) {
        if (isnan(*stepdown_ms) && kvf_ha_status(d, h, 0, &s) == 0 &&
            s.leader == 0) {
            *stepdown_ms = (double)(kvf_time_ms() - t0);
        }
        kvf_drill_sleep(d, 10);
    }
    /* the old leader stopped serving half a lease in; what it committed
     * before is in the node's inventory and survives into the new term */
    if (fault == KVF_HA_STOP_ETCD) {
        kill(h->etcd, SIGCONT);
    } else if (kvf_ha_etcd_start(d, h) != 0) {
        return -1;
    }
    return 0;
}

static void kvf_ha_expect(kvf_drill_t *d, int fault, uint64_t bound)
{
    char text[768];

    snprintf(text, sizeof(text),
             "%s; a master leads again within about a lease (%d ms) plus "
             "its poll (after a kill the standby; after an etcd outage "
             "either, a new term rebuilt from the node's inventory); the node "
             "and the clients "
             "follow it through etcd with "
             "no restart; every call ends within its bound (%lu ms); no "
             "wrong bytes; the objects of the old leader are rebuilt from "
             "the node's inventory: 0 committed objects lost%s",
             fault == KVF_HA_KILL_LEADER
                 ? "the leader dies"
                 : "the leader cannot reach etcd and steps down within half "
                   "its lease, saying so (KVF_ERR_NOT_LEADER); calls fail "
                   "fast meanwhile, nothing hangs",
             KVF_HA_LEASE_MS, (unsigned long)bound,
             fault == KVF_HA_KILL_LEADER
                 ? "; the clients' hit rate is back to 90 % of its level "
                   "before the kill within 10 s"
                 : "");
    kvf_drill_expect(d, text);
}

static void kvf_ha_report(kvf_drill_t *d, int fault, double lead_ms,
                          double rec_ms, double stepdown_ms,
                          const kvf_drill_mstatus_t *s0,
                          const kvf_drill_mstatus_t *s1, uint64_t bound,
                          int lost)
{
    char text[768];

    kvf_record_figure(d->rec, "time to the new leader", lead_ms, "ms", NAN,
                      NAN);
    kvf_record_figure(d->rec, "first successful call of every client", rec_ms,
                      "ms", NAN, NAN);
    if (fault != KVF_HA_KILL_LEADER) {
        kvf_record_figure(d->rec, "old leader stepped down after", stepdown_ms,
                          "ms", NAN, NAN);
        /* seen through /status polls (each one a round trip on a busy
         * machine): the bound is the etcd outage, the order is checked
         * by the epochs and test_election's sampler */
        kvf_drill_check(d, !isnan(stepdown_ms) && stepdown_ms < 2000,
                        "the leader did not step down while etcd was away");
    }
    kvf_record_figure(d->rec, "objects of the old leader", s0->objects, "", NAN,
                      NAN);
    kvf_record_figure(d->rec, "epoch of the old leader", s0->term, "", NAN,
                      NAN);
    kvf_record_figure(d->rec, "epoch of the new leader", s1->term, "", NAN,
                      NAN);
    kvf_drill_check(d, s1->term > s0->term, "the new epoch is not larger");
    kvf_record_figure(d->rec, "objects served by the new leader", s1->objects,
                      "", NAN, NAN);
    kvf_record_figure(d->rec, "committed objects lost", lost, "", NAN, NAN);
    kvf_drill_check(d, lost == 0, "%d of %d committed objects lost", lost,
                    KVF_HA_PROBES);
    kvf_drill_traffic_report(d, bound);
    snprintf(text, sizeof(text),
             "new leader after %.0f ms (epoch %.0f -> %.0f); every client "
             "served again after %.0f ms; %.0f objects of the old leader, "
             "%.0f served by the new one; %d of %d probe objects lost; %lu "
             "wrong bytes; longest call %.0f ms (bound %lu)",
             lead_ms, s0->term, s1->term, rec_ms, s0->objects, s1->objects,
             lost, KVF_HA_PROBES, (unsigned long)d->wrong_bytes, d->max_wait_ms,
             (unsigned long)bound);
    kvf_record_drill_text(d->rec, "observed", text);
    kvf_record_drill_text(d->rec, "recovery",
                          "no action: the standby took the leader key, the "
                          "node registered with it, the clients followed");
    kvf_record_not_verified(d->rec,
                            "removed keys staying removed across the kill: "
                            "this drill checks committed probes; test_ha "
                            "(test_churn, test_evict) checks removes and "
                            "evictions");
}

/* The probe objects: put (phase 0) or read back (phase 1) by a helper
 * process, in memory shared with the conductor. */
typedef struct kvf_ha_probe {
    char masters[200];
    unsigned timeout_ms;
    int phase;
    int put, lost, wrong;
    int status; /* the last failure's */
} kvf_ha_probe_t;

#define KVF_HA_PROBE_SIZE (16 * 1024)

static int kvf_ha_probe_run(kvf_drill_t *d, void *arg)
{
    static unsigned char buf[KVF_HA_PROBE_SIZE], scratch[KVF_HA_PROBE_SIZE];
    kvf_ha_probe_t *p = arg;
    kvf_store_params_t sp = {0};
    /* pinned: the traffic's evictions must not take them */
    kvf_store_put_opts_t po = {1, KVF_STORE_PIN};
    kvf_region_h reg;
    kvf_status_t s;
    kvf_store_h st;
    char key[64];
    size_t len;
    int i;

    (void)d;
    sp.field_mask = KVF_STORE_PARAM_MASTER | KVF_STORE_PARAM_TIMEOUT;
    sp.master = p->masters;
    sp.timeout_ms = p->timeout_ms;
    if (kvf_store_connect(&sp, &st) != KVF_OK) {
        return 1;
    }
    /* the buffers registered, as every drill client's */
    if (kvf_engine_reg(kvf_store_engine(st), buf, sizeof(buf), KVF_MEM_HOST, 0,
                       &reg) != KVF_OK) {
        kvf_store_disconnect(st);
        return 1;
    }
    for (i = 0; i < KVF_HA_PROBES; i++) {
        snprintf(key, sizeof(key), "ha-probe/%d", i);
        if (p->phase == 0) {
            kvf_drill_obj_fill(buf, key, 1, sizeof(buf));
            s = kvf_store_put(st, key, buf, sizeof(buf), &po);
            p->put += s == KVF_OK;
            p->status = s != KVF_OK ? s : p->status;
            continue;
        }
        len = 0;
        s = kvf_store_get(st, key, buf, sizeof(buf), &len, 0);
        if (s != KVF_OK) {
            p->lost++;
            p->status = s;
        } else if (kvf_drill_obj_check(buf, len, key, 0, scratch) != 0) {
            p->wrong++;
        }
    }
    kvf_engine_dereg(kvf_store_engine(st), reg);
    kvf_store_disconnect(st);
    return 0;
}

/* Puts (phase 0) or reads back (phase 1) the probe objects. */
static void kvf_ha_probe(kvf_drill_t *d, kvf_ha_t *h, kvf_ha_probe_t *p,
                         int phase)
{
    snprintf(p->masters, sizeof(p->masters), "%s,%s", h->addr[0], h->addr[1]);
    p->timeout_ms = d->timeout_ms;
    p->phase = phase;
    if (kvf_drill_oneshot(d, NULL, kvf_ha_probe_run, p, 30000) != 0) {
        kvf_drill_fail(d, "the probe client failed (phase %d)", phase);
    }
}

static int kvf_ha_drill(kvf_drill_t *d, int fault)
{
    kvf_kv_arg_t a = {
        .keys = 150, .min_kb = 8, .max_kb = 64, .get_pct = 80, .remove_pct = 5};
    uint64_t bound = kvf_drill_store_bound(d, 1), t_fault;
    kvf_drill_mstatus_t s0, s1;
    double lead = -1, rec, stepdown;
    kvf_ha_probe_t *probe = kvf_drill_shared_alloc(sizeof(*probe));
    kvf_drill_hits_t hits;
    uint64_t since;
    kvf_ha_t h;
    int rc = -1, nl;

    memset(&h, 0, sizeof(h));
    if (probe == NULL) {
        kvf_drill_fail(d, "no shared memory for the probe");
        return -1;
    }
    kvf_ha_expect(d, fault, bound);
    if (kvf_ha_up(d, &h) != 0 || kvf_drill_kv_workers(d, &h.c, NULL, &a, 2)) {
        goto out;
    }
    kvf_drill_phase(d, KVF_DRILL_BASE);
    kvf_ha_probe(d, &h, probe, 0);
    kvf_drill_check(d, probe->put == KVF_HA_PROBES,
                    "%d of %d probe puts failed before the fault (%s)",
                    KVF_HA_PROBES - probe->put, KVF_HA_PROBES,
                    kvf_status_name((kvf_status_t)probe->status));
    kvf_drill_hits_begin(d, &hits);
    kvf_drill_hits_sleep(d, &hits, d->phase_ms);
    kvf_ha_status(d, &h, 0, &s0);
    d->phase_secs[KVF_DRILL_BASE] = d->phase_ms / 1000.0;
    kvf_drill_phase(d, KVF_DRILL_FAULT);
    kvf_drill_hits_fault(d, &hits);
    t_fault = kvf_time_ms();
    /* after a kill the standby leads; after an etcd outage either
     * master may (the old one stands again, its term starting empty) */
    if (kvf_ha_inject(d, &h, fault, &stepdown) != 0 ||
        (nl = kvf_ha_wait_leader(d, &h, -1, 1, 15000, &lead)) < 0) {
        kvf_drill_fail(d, "no master led with the node after the fault");
        goto out;
    }
    lead = (double)(kvf_time_ms() - t_fault);
    d->phase_secs[KVF_DRILL_FAULT] = lead / 1000.0;
    kvf_drill_phase(d, KVF_DRILL_RECOVER);
    rec = kvf_drill_wait_recovered(d, t_fault, 15000);
    d->time_to_recover_ms = rec;
    kvf_drill_check(d, rec >= 0, "the clients did not come back");
    /* the hit rate over time: at least 11 s from the fault */
    since = kvf_time_ms() - t_fault;
    kvf_drill_hits_sleep(d, &hits,
                         since + d->phase_ms < 11000 ? (unsigned)(11000 - since)
                                                     : d->phase_ms);
    kvf_ha_status(d, &h, nl, &s1);
    d->phase_secs[KVF_DRILL_RECOVER] = d->phase_ms / 1000.0 + rec / 1000.0;
    kvf_drill_workers_stop(d);
    kvf_ha_probe(d, &h, probe, 1);
    if (probe->lost > 0) {
        kvf_drill_log(d, "a probe get failed: %s",
                      kvf_status_name((kvf_status_t)probe->status));
    }
    kvf_drill_check(d, probe->wrong == 0,
                    "%d probe objects read back with wrong bytes",
                    probe->wrong);
    kvf_ha_report(d, fault, lead, rec, stepdown, &s0, &s1, bound, probe->lost);
    /* after a leader's death its objects are rebuilt from the node's
     * inventory within seconds: the hit rate comes back with them */
    kvf_drill_hits_report(d, &hits, fault == KVF_HA_KILL_LEADER ? 10000 : 0);
    rc = 0;
out:
    kvf_ha_down(&h);
    munmap(probe, sizeof(*probe));
    return rc;
}

int kvf_drill_master_failover(kvf_drill_t *d)
{
    return kvf_ha_drill(d, KVF_HA_KILL_LEADER);
}

int kvf_drill_etcd_leader_stop(kvf_drill_t *d)
{
    return kvf_ha_drill(d, KVF_HA_STOP_ETCD);
}

int kvf_drill_etcd_down(kvf_drill_t *d)
{
    return kvf_ha_drill(d, KVF_HA_DOWN_ETCD);
}
