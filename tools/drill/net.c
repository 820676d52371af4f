/*
 * Network drills (root): the clients run in one network namespace, the
 * service in another, joined by a veth pair with addresses of a private
 * /30 that exist only inside those two namespaces. Nothing is sent
 * anywhere else, and the namespaces (with the veth) are removed at the
 * end, also when the drill fails or is interrupted. Everything is forced
 * onto tcp: a same-host transport would bypass the link under test. The
 * store clients' master RPC crosses the veth as well: the master's
 * address is the service side's 10.213.77.x (no loopback, so no unix
 * socket), the clients' transports are tcp (which keeps the master on
 * tcp too), and an abstract unix name would not reach across namespaces
 * anyway.
 *
 * The service is the store (`partition`, `slow-link`: a master and a node
 * in the service namespace, store clients reading through the cache in
 * the client namespace) or a bare engine target (`engine-partition`,
 * `engine-slow-link`: blocks workers of verified READ/WRITE batches).
 *
 * partition: under traffic the link is cut silently (an nft table in the
 * service namespace drops everything from and to the client; `ip link
 * set down` when nft is missing), held past the clients' timeouts and
 * until every client has seen a call fail, then healed. Expected: calls fail
 * within their bound while cut, none hands back wrong bytes, traffic resumes by
 * itself after the heal (within one bound), nothing is lost on the service side
 * (store: same objects and bytes, no pending put) and the clients' resources
 * return to baseline.
 *
 * slow-link: the same link throttled with tc tbf on both ends. Expected:
 * throughput drops, every call still ends within its bound (slow calls
 * may time out: that is the designed degradation), no wrong bytes, and
 * throughput comes back once the qdisc is removed.
 */
#include "tools/drill/store.h"

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/time.h"

#define KVF_TBF_RATE "16mbit"

typedef struct kvf_net_svc {
    int store;
    kvf_drill_net_t net;
    pid_t target;          /* engine */
    kvf_drill_cluster_t c; /* store */
    kvf_kv_arg_t a;
    uint64_t bound;
    kvf_drill_res_t mbase, mafter;
} kvf_net_svc_t;

/* Namespaces, the service on the service side, 2 workers on the client
 * side. Returns 0, or -1 (d->skipped tells a skip). */
static int kvf_net_start(kvf_drill_t *d, kvf_net_svc_t *v)
{
    char listen[48], seg[KVF_DRILL_ADDR];

    if (!kvf_drill_have("ip")) {
        kvf_drill_skip(d, "iproute2 (ip) is not installed");
        return -1;
    }
    if (kvf_drill_net_up(d, &v->net) != 0) {
        kvf_drill_fail(d, "cannot create the namespaces and veth pair");
        return -1;
    }
    snprintf(listen, sizeof(listen), "%s:0", v->net.ip[1]);
    kvf_record_config(d->rec, "client namespace", v->net.ns[0]);
    kvf_record_config(d->rec, "service namespace", v->net.ns[1]);
    kvf_record_config(d->rec, "link",
                      "veth, 10.213.77.0/30 inside the namespaces only, tcp");
    if (!v->store) {
        v->bound = d->call_ms + d->timeout_ms;
        v->target =
            kvf_drill_start_target(d, v->net.ns[1], listen, seg, sizeof(seg));
        if (v->target < 0) {
            return -1;
        }
        kvf_record_config(d->rec, "service", "engine target");
        return kvf_drill_blocks_workers(d, v->net.ns[0], seg, 2);
    }
    v->bound = kvf_drill_store_bound(d, 1);
    v->c.replicas = 1;
    v->c.netns = v->net.ns[1];
    snprintf(v->c.master_listen, sizeof(v->c.master_listen), "%s", listen);
    snprintf(v->c.http_listen, sizeof(v->c.http_listen), "%s", listen);
    snprintf(v->c.node_listen, sizeof(v->c.node_listen), "%s", listen);
    /* read-through over fixed keys: the objects stand still once filled */
    v->a.keys = 100;
    v->a.min_kb = 8;
    v->a.max_kb = 64;
    v->a.get_pct = 100;
    kvf_record_config(d->rec, "service", "store master + 1 node");
    if (kvf_drill_cluster_start(d, &v->c, 1) != 0) {
        return -1;
    }
    return kvf_drill_kv_workers(d, &v->c, v->net.ns[0], &v->a, 2);
}

static void kvf_net_stop(kvf_drill_t *d, kvf_net_svc_t *v)
{
    kvf_drill_workers_stop(d);
    if (v->target > 0) {
        kvf_drill_kill(v->target, SIGTERM);
        v->target = 0;
    }
    kvf_drill_cluster_stop(&v->c);
    kvf_drill_net_down(&v->net);
}

/* Baseline phase, then clients' (and the master's) resources. */
static void kvf_net_baseline(kvf_drill_t *d, kvf_net_svc_t *v,
                             kvf_drill_res_t *base)
{
    kvf_drill_phase(d, KVF_DRILL_BASE);
    kvf_drill_sleep(d, d->phase_ms);
    kvf_drill_workers_pause(d, base, 0);
    if (v->store) {
        kvf_drill_master_res(d, &v->c, &v->mbase);
    }
    kvf_drill_workers_pause(d, NULL, 1);
    d->phase_secs[KVF_DRILL_BASE] = d->phase_ms / 1000.0;
}

/* After recovery: store puts cut off mid-way are reclaimed first. */
static void kvf_net_after(kvf_drill_t *d, kvf_net_svc_t *v,
                          kvf_drill_res_t *after)
{
    uint64_t end = kvf_time_ms() + 3000 + 2000;
    kvf_drill_mstatus_t s;
    double settle;

    memset(&s, 0, sizeof(s));
    kvf_drill_workers_pause(d, after, 0);
    if (!v->store) {
        return;
    }
    while (kvf_drill_status(d, &v->c, &s) == 0 && s.pending > 0 &&
           kvf_time_ms() < end) {
        usleep(50000);
    }
    settle = kvf_drill_node_settle(d, &v->c, 15000);
    kvf_record_figure(d->rec, "node connections of cut clients closed after",
                      settle, "ms", NAN, NAN);
    kvf_drill_master_res(d, &v->c, &v->mafter);
    kvf_drill_store_report(d, &v->c, &v->mbase, &v->mafter);
    kvf_drill_check(d, s.pending == 0, "%.0f puts still pending", s.pending);
    kvf_drill_check(d,
                    v->mafter.objects == v->mbase.objects &&
                        v->mafter.alloc_bytes == v->mbase.alloc_bytes,
                    "master objects %.0f -> %.0f, used %.0f -> %.0f",
                    v->mbase.objects, v->mafter.objects, v->mbase.alloc_bytes,
                    v->mafter.alloc_bytes);
}

static int kvf_drill_nft(kvf_drill_t *d, kvf_drill_net_t *net, int cut)
{
    char path[640];
    FILE *f;

    if (!cut) {
        return kvf_drill_run(d, net->ns[1],
                             (const char *const[]){"nft", "delete", "table",
                                                   "inet", "kvfdrill", NULL});
    }
    snprintf(path, sizeof(path), "%s/%s-cut.nft", d->logdir, d->name);
    f = fopen(path, "w");
    if (f == NULL) {
        return -1;
    }
    fprintf(f,
            "table inet kvfdrill {\n"
            "  chain in { type filter hook input priority 0; policy accept;\n"
            "    ip saddr %s drop\n  }\n"
            "  chain out { type filter hook output priority 0; policy "
            "accept;\n"
            "    ip daddr %s drop\n  }\n"
            "}\n",
            net->ip[0], net->ip[0]);
    fclose(f);
    return kvf_drill_run(d, net->ns[1],
                         (const char *const[]){"nft", "-f", path, NULL});
}

static int kvf_drill_link(kvf_drill_t *d, kvf_drill_net_t *net, int up)
{
    return kvf_drill_run(d, net->ns[1],
                         (const char *const[]){"ip", "link", "set",
                                               net->ifname[1],
                                               up ? "up" : "down", NULL});
}

/* Holds the cut at least min_ms, then on until every client has seen a
 * call fail while cut (a call under way at the cut may end only after
 * min_ms, and it must not end after the heal for lack of time), at most
 * max_ms. Returns how long the link stayed cut so far, in ms. */
static uint64_t kvf_drill_hold_cut(kvf_drill_t *d, uint64_t t_cut,
                                   unsigned min_ms, unsigned max_ms)
{
    kvf_drill_sleep(d, min_ms);
    while (kvf_drill_first_error_after(d, KVF_DRILL_FAULT, t_cut) < 0 &&
           kvf_time_ms() < t_cut + max_ms) {
        kvf_drill_sleep(d, 10);
    }
    return kvf_time_ms() - t_cut;
}

static int kvf_drill_partition_run(kvf_drill_t *d, int store)
{
    uint64_t t_cut, t_heal, t_end, held, hold = 3ull * d->timeout_ms;
    int use_nft = kvf_drill_have("nft"), rc;
    kvf_drill_res_t base, after;
    kvf_net_svc_t v;
    char text[640];
    double rec;

    memset(&v, 0, sizeof(v));
    v.store = store;
    snprintf(text, sizeof(text),
             "while the link between the clients and the %s is cut, every "
             "call fails within its bound and none hands back wrong bytes; "
             "after the heal the clients' next calls succeed without any "
             "restart, within one bound; %sfds, sockets, allocations and "
             "RSS of the clients back to the baseline",
             store ? "store (master and node)" : "engine target",
             store ? "the store holds the same objects and bytes, no "
                     "pending put; "
                   : "");
    kvf_drill_expect(d, text);
    if (kvf_net_start(d, &v) != 0) {
        kvf_net_stop(d, &v);
        return d->skipped ? 0 : -1;
    }
    kvf_net_baseline(d, &v, &base);

    kvf_drill_phase(d, KVF_DRILL_FAULT);
    t_cut = kvf_time_ms();
    rc = use_nft ? kvf_drill_nft(d, &v.net, 1) : kvf_drill_link(d, &v.net, 0);
    if (!kvf_drill_check(d, rc == 0, "could not cut the link")) {
        kvf_net_stop(d, &v);
        return 0;
    }
    snprintf(text, sizeof(text),
             "%s for at least %lu ms, and on until each of the 2 client "
             "processes under traffic saw a call fail (at most %lu ms)",
             use_nft ? "nft table in the service namespace dropping every "
                       "packet from and to the client (silent loss)"
                     : "service side veth set down",
             (unsigned long)hold, (unsigned long)(2 * v.bound));
    kvf_drill_injected(d, text);
    held = kvf_drill_hold_cut(d, t_cut, (unsigned)hold, 2 * (unsigned)v.bound);
    kvf_record_figure(d->rec, "link cut for", (double)held, "ms", NAN, NAN);
    rc = use_nft ? kvf_drill_nft(d, &v.net, 0) : kvf_drill_link(d, &v.net, 1);
    if (!kvf_drill_check(d, rc == 0, "could not heal the link")) {
        kvf_net_stop(d, &v);
        return 0;
    }
    t_heal = kvf_time_ms();
    kvf_drill_log(d, "link healed");
    d->phase_secs[KVF_DRILL_FAULT] = (double)(t_heal - t_cut) / 1000.0;
    kvf_drill_phase(d, KVF_DRILL_RECOVER);
    rec = kvf_drill_wait_recovered(d, t_heal, 4 * (unsigned)v.bound);
    d->time_to_recover_ms = rec;
    kvf_drill_check(d, rec >= 0 && rec <= (double)v.bound + KVF_DRILL_SLACK_MS,
                    "traffic resumed %.0f ms after the heal (bound %lu)", rec,
                    (unsigned long)v.bound);
    kvf_drill_sleep(d, d->phase_ms);
    kvf_net_after(d, &v, &after);
    t_end = kvf_time_ms();
    d->phase_secs[KVF_DRILL_RECOVER] = (double)(t_end - t_heal) / 1000.0;
    kvf_drill_workers_stop(d);
    kvf_drill_resources(d, "clients", &base, &after);
    kvf_drill_traffic_report(d, v.bound);
    kvf_drill_check(d, d->err_calls[KVF_DRILL_FAULT] > 0,
                    "no call failed while the link was cut");
    snprintf(text, sizeof(text),
             "%lu calls failed while cut (%lu succeeded before the cut was "
             "noticed); %lu wrong bytes; longest call %.0f ms (bound %lu)",
             (unsigned long)d->err_calls[KVF_DRILL_FAULT],
             (unsigned long)d->ok_calls[KVF_DRILL_FAULT],
             (unsigned long)d->wrong_bytes, d->max_wait_ms,
             (unsigned long)v.bound);
    kvf_record_drill_text(d->rec, "observed", text);
    snprintf(text, sizeof(text),
             "%s; every client served again %.0f ms after the heal, with no "
             "restart (%s)",
             use_nft ? "nft table deleted" : "veth set up", rec,
             store ? "master connections and node peers reopened"
                   : "the engine reconnected its peer");
    kvf_record_drill_text(d->rec, "recovery", text);
    kvf_net_stop(d, &v);
    return 0;
}

static int kvf_drill_tbf(kvf_drill_t *d, kvf_drill_net_t *net, int on)
{
    int i, rc = 0;

    for (i = 0; i < 2 && rc == 0; i++) {
        if (on) {
            rc = kvf_drill_run(d, net->ns[i],
                               (const char *const[]){
                                   "tc", "qdisc", "add", "dev", net->ifname[i],
                                   "root", "tbf", "rate", KVF_TBF_RATE, "burst",
                                   "32kbit", "latency", "400ms", NULL});
        } else {
            rc = kvf_drill_run(d, net->ns[i],
                               (const char *const[]){"tc", "qdisc", "del",
                                                     "dev", net->ifname[i],
                                                     "root", NULL});
        }
    }
    return rc;
}

/* MB/s the workers moved in phase over the next ms milliseconds. */
static double kvf_drill_window_mbs(kvf_drill_t *d, int phase, unsigned ms)
{
    uint64_t t1 = kvf_time_ms(), b1 = kvf_drill_bytes(d, phase);

    kvf_drill_sleep(d, ms);
    return (double)(kvf_drill_bytes(d, phase) - b1) / 1e6 /
           ((double)(kvf_time_ms() - t1) / 1000.0);
}

static int kvf_drill_slow_run(kvf_drill_t *d, int store)
{
    uint64_t t0, t_heal, t_end;
    kvf_drill_res_t base, after;
    double after_tput, fault_tput, rec;
    kvf_net_svc_t v;
    char text[640];

    memset(&v, 0, sizeof(v));
    v.store = store;
    snprintf(text, sizeof(text),
             "the link to the %s throttled to %s: throughput falls well "
             "below the baseline while every call still ends within its "
             "bound (slow calls may time out: that is the designed "
             "degradation) and none hands back wrong bytes; unthrottled, "
             "throughput returns to at least a third of the baseline",
             store ? "store" : "engine target", KVF_TBF_RATE);
    kvf_drill_expect(d, text);
    if (!kvf_drill_have("tc")) {
        kvf_drill_skip(d, "tc (iproute2) is not installed");
        return 0;
    }
    if (kvf_net_start(d, &v) != 0) {
        kvf_net_stop(d, &v);
        return d->skipped ? 0 : -1;
    }
    kvf_net_baseline(d, &v, &base);

    kvf_drill_phase(d, KVF_DRILL_FAULT);
    t0 = kvf_time_ms();
    if (!kvf_drill_check(d, kvf_drill_tbf(d, &v.net, 1) == 0,
                         "could not add the tbf qdisc")) {
        kvf_net_stop(d, &v);
        return 0;
    }
    snprintf(text, sizeof(text),
             "tc qdisc tbf rate %s burst 32kbit latency 400ms on both veth "
             "ends for %u ms",
             KVF_TBF_RATE, 2 * d->phase_ms);
    kvf_drill_injected(d, text);
    /* the throttled rate: a window from when both qdiscs are in place
     * (what moved while tc ran, which can take a second on a loaded
     * machine, moved at the baseline's rate) */
    fault_tput = kvf_drill_window_mbs(d, KVF_DRILL_FAULT, 2 * d->phase_ms);
    kvf_drill_tbf(d, &v.net, 0);
    t_heal = kvf_time_ms();
    d->phase_secs[KVF_DRILL_FAULT] = (double)(t_heal - t0) / 1000.0;
    kvf_drill_phase(d, KVF_DRILL_RECOVER);
    rec = kvf_drill_wait_recovered(d, t_heal, 4 * (unsigned)v.bound);
    d->time_to_recover_ms = rec;
    kvf_drill_check(d, rec >= 0, "traffic did not resume unthrottled");
    /* recovered throughput: a window after the queues drained */
    kvf_drill_sleep(d, 300);
    after_tput = kvf_drill_window_mbs(d, KVF_DRILL_RECOVER, d->phase_ms);
    kvf_net_after(d, &v, &after);
    t_end = kvf_time_ms();
    d->phase_secs[KVF_DRILL_RECOVER] = (double)(t_end - t_heal) / 1000.0;
    kvf_drill_workers_stop(d);
    kvf_drill_resources(d, "clients", &base, &after);
    kvf_drill_traffic_report(d, v.bound);
    kvf_record_figure(d->rec,
                      "throttled throughput (window with the qdiscs in place)",
                      fault_tput, "MB/s", NAN, NAN);
    kvf_record_figure(d->rec, "throughput throttled / baseline",
                      fault_tput / d->tput[KVF_DRILL_BASE], "ratio", NAN, NAN);
    kvf_record_figure(d->rec, "recovered throughput (window after drain)",
                      after_tput, "MB/s", NAN, NAN);
    kvf_record_figure(d->rec, "throughput after / baseline",
                      after_tput / d->tput[KVF_DRILL_BASE], "ratio", NAN, NAN);
    kvf_drill_check(d, fault_tput < 0.25 * d->tput[KVF_DRILL_BASE],
                    "throttled throughput %.1f MB/s is not below a quarter "
                    "of the baseline %.1f MB/s",
                    fault_tput, d->tput[KVF_DRILL_BASE]);
    /* a 2-core machine shared with other jobs: back to a third of the
     * baseline and ten times the throttled rate counts as recovered */
    kvf_drill_check(d,
                    after_tput >= 0.33 * d->tput[KVF_DRILL_BASE] &&
                        after_tput >= 10 * fault_tput,
                    "throughput after %.1f MB/s: not back (baseline %.1f, "
                    "throttled %.2f MB/s)",
                    after_tput, d->tput[KVF_DRILL_BASE], fault_tput);
    snprintf(text, sizeof(text),
             "throughput %.1f -> %.2f -> %.1f MB/s (baseline, throttled, "
             "after); %lu calls failed throttled; longest call %.0f ms "
             "(bound %lu); %lu wrong bytes",
             d->tput[KVF_DRILL_BASE], fault_tput, after_tput,
             (unsigned long)d->err_calls[KVF_DRILL_FAULT], d->max_wait_ms,
             (unsigned long)v.bound, (unsigned long)d->wrong_bytes);
    kvf_record_drill_text(d->rec, "observed", text);
    kvf_record_drill_text(d->rec, "recovery",
                          "qdisc removed; the same clients carried on");
    kvf_net_stop(d, &v);
    return 0;
}

int kvf_drill_partition(kvf_drill_t *d)
{
    return kvf_drill_partition_run(d, 0);
}

int kvf_drill_store_partition(kvf_drill_t *d)
{
    return kvf_drill_partition_run(d, 1);
}

int kvf_drill_slow_link(kvf_drill_t *d)
{
    return kvf_drill_slow_run(d, 0);
}

int kvf_drill_store_slow_link(kvf_drill_t *d)
{
    return kvf_drill_slow_run(d, 1);
}
