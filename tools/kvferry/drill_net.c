/*
 * Network drills (root): the clients run in one network namespace, the
 * service in another, joined by a veth pair with addresses of a private
 * /30 that exist only inside those two namespaces. Nothing is sent
 * anywhere else, and the namespaces (with the veth) are removed at the
 * end, also when the drill fails or is interrupted.
 *
 * partition: under traffic the link is cut silently (an nft table in the
 * service namespace drops everything from and to the client; `ip link
 * set down` when nft is missing), held past the clients' timeouts, then
 * healed. Expected: calls fail within their bound while cut, none hands
 * back wrong bytes, traffic resumes by itself after the heal (the engine
 * reconnects), and the clients' resources return to the baseline.
 *
 * slow-link: the same link throttled with tc tbf on both ends. Expected:
 * throughput drops, every call still ends within its bound (slow calls
 * may time out: that is the designed degradation), no wrong bytes, and
 * throughput comes back once the qdisc is removed.
 */
#include "tools/kvferry/drill.h"

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/time.h"

#define KVF_TBF_RATE "16mbit"

/* Namespaces, the target in the service side, 2 workers in the client
 * side. Returns the target's pid or -1. */
static pid_t kvf_drill_net_start(kvf_drill_t *d, kvf_drill_net_t *net)
{
    char listen[48], seg[KVF_DRILL_ADDR];
    pid_t target;

    if (!kvf_drill_have("ip")) {
        kvf_drill_skip(d, "iproute2 (ip) is not installed");
        return -1;
    }
    if (kvf_drill_net_up(d, net) != 0) {
        kvf_drill_fail(d, "cannot create the namespaces and veth pair");
        return -1;
    }
    snprintf(listen, sizeof(listen), "%s:0", net->ip[1]);
    target = kvf_drill_start_target(d, net->ns[1], listen, seg, sizeof(seg));
    if (target < 0) {
        return -1;
    }
    if (kvf_drill_blocks_workers(d, net->ns[0], seg, 2) != 0) {
        return -1;
    }
    kvf_record_config(d->rec, "client namespace", net->ns[0]);
    kvf_record_config(d->rec, "service namespace", net->ns[1]);
    kvf_record_config(d->rec, "link",
                      "veth, 10.213.77.0/30 inside the "
                      "namespaces only");
    kvf_record_config(d->rec, "target", seg);
    return target;
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
            "  chain out { type filter hook output priority 0; policy accept;\n"
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

int kvf_drill_partition(kvf_drill_t *d)
{
    uint64_t bound = d->call_ms + d->timeout_ms, t_cut, t_heal, t_end;
    int use_nft = kvf_drill_have("nft"), rc;
    kvf_drill_res_t base, after;
    kvf_drill_net_t net;
    char text[512];
    double rec;
    pid_t target;

    memset(&net, 0, sizeof(net));
    snprintf(text, sizeof(text),
             "while the link is cut every call fails within its bound "
             "(%lu ms) and none hands back wrong bytes; after the heal the "
             "clients' next calls succeed without any restart, within one "
             "bound; fds, sockets, allocations and RSS back to baseline",
             (unsigned long)bound);
    kvf_drill_expect(d, text);
    target = kvf_drill_net_start(d, &net);
    if (target < 0) {
        kvf_drill_net_down(&net);
        return d->skipped ? 0 : -1;
    }
    kvf_drill_phase(d, KVF_DRILL_BASE);
    kvf_drill_sleep(d, d->phase_ms);
    kvf_drill_workers_pause(d, &base, 1);
    d->phase_secs[KVF_DRILL_BASE] = d->phase_ms / 1000.0;

    kvf_drill_phase(d, KVF_DRILL_FAULT);
    t_cut = kvf_time_ms();
    rc = use_nft ? kvf_drill_nft(d, &net, 1) : kvf_drill_link(d, &net, 0);
    if (!kvf_drill_check(d, rc == 0, "could not cut the link")) {
        goto out;
    }
    snprintf(text, sizeof(text),
             "%s for %lu ms under traffic of 2 client processes",
             use_nft ? "nft table in the service namespace dropping every "
                       "packet from and to the client (silent loss)"
                     : "service side veth set down",
             (unsigned long)(bound + 1000));
    kvf_record_drill_text(d->rec, "injected", text);
    kvf_drill_log(d, "link cut (%s)", use_nft ? "nft drop" : "link down");
    kvf_drill_sleep(d, (unsigned)bound + 1000);
    rc = use_nft ? kvf_drill_nft(d, &net, 0) : kvf_drill_link(d, &net, 1);
    if (!kvf_drill_check(d, rc == 0, "could not heal the link")) {
        goto out;
    }
    t_heal = kvf_time_ms();
    kvf_drill_log(d, "link healed");
    d->phase_secs[KVF_DRILL_FAULT] = (double)(t_heal - t_cut) / 1000.0;
    kvf_drill_phase(d, KVF_DRILL_RECOVER);
    rec = kvf_drill_wait_recovered(d, t_heal, 4 * (unsigned)bound);
    d->time_to_recover_ms = rec;
    kvf_drill_check(d, rec >= 0 && rec <= (double)bound + KVF_DRILL_SLACK_MS,
                    "traffic resumed %.0f ms after the heal (bound %lu)", rec,
                    (unsigned long)bound);
    kvf_drill_sleep(d, d->phase_ms);
    kvf_drill_workers_pause(d, &after, 1);
    t_end = kvf_time_ms();
    d->phase_secs[KVF_DRILL_RECOVER] = (double)(t_end - t_heal) / 1000.0;
    kvf_drill_workers_stop(d);
    kvf_drill_resources(d, "clients", &base, &after);
    kvf_drill_traffic_report(d, bound);
    kvf_drill_check(d, d->err_calls[KVF_DRILL_FAULT] > 0,
                    "no call failed while the link was cut");
    snprintf(text, sizeof(text),
             "%lu calls failed while cut (%lu succeeded before the cut was "
             "noticed); %lu wrong bytes; longest call %.0f ms (bound %lu)",
             (unsigned long)d->err_calls[KVF_DRILL_FAULT],
             (unsigned long)d->ok_calls[KVF_DRILL_FAULT],
             (unsigned long)d->wrong_bytes, d->max_wait_ms,
             (unsigned long)bound);
    kvf_record_drill_text(d->rec, "observed", text);
    snprintf(text, sizeof(text),
             "%s; every client served again %.0f ms after the heal, on the "
             "same peer (the engine reconnected)",
             use_nft ? "nft table deleted" : "veth set up", rec);
    kvf_record_drill_text(d->rec, "recovery", text);
out:
    kvf_drill_workers_stop(d);
    kvf_drill_kill(target, SIGTERM);
    kvf_drill_net_down(&net);
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

int kvf_drill_slow_link(kvf_drill_t *d)
{
    uint64_t bound = d->call_ms + d->timeout_ms, t0, t_heal, t_end, t1, b1;
    double after_tput;
    kvf_drill_res_t base, after;
    kvf_drill_net_t net;
    char text[512];
    double rec;
    pid_t target;

    memset(&net, 0, sizeof(net));
    snprintf(text, sizeof(text),
             "throttled to %s, throughput falls well below the baseline "
             "while every call still ends within its bound (%lu ms; slow "
             "calls may time out: that is the designed degradation) and "
             "none hands back wrong bytes; unthrottled, throughput returns "
             "to at least a third of the baseline",
             KVF_TBF_RATE, (unsigned long)bound);
    kvf_drill_expect(d, text);
    if (!kvf_drill_have("tc")) {
        kvf_drill_skip(d, "tc (iproute2) is not installed");
        return 0;
    }
    target = kvf_drill_net_start(d, &net);
    if (target < 0) {
        kvf_drill_net_down(&net);
        return d->skipped ? 0 : -1;
    }
    kvf_drill_phase(d, KVF_DRILL_BASE);
    kvf_drill_sleep(d, d->phase_ms);
    kvf_drill_workers_pause(d, &base, 1);
    d->phase_secs[KVF_DRILL_BASE] = d->phase_ms / 1000.0;

    kvf_drill_phase(d, KVF_DRILL_FAULT);
    t0 = kvf_time_ms();
    if (!kvf_drill_check(d, kvf_drill_tbf(d, &net, 1) == 0,
                         "could not add the tbf qdisc")) {
        goto out;
    }
    snprintf(text, sizeof(text),
             "tc qdisc tbf rate %s burst 32kbit latency 400ms on both veth "
             "ends for %u ms",
             KVF_TBF_RATE, 2 * d->phase_ms);
    kvf_record_drill_text(d->rec, "injected", text);
    kvf_drill_sleep(d, 2 * d->phase_ms);
    kvf_drill_tbf(d, &net, 0);
    t_heal = kvf_time_ms();
    d->phase_secs[KVF_DRILL_FAULT] = (double)(t_heal - t0) / 1000.0;
    kvf_drill_phase(d, KVF_DRILL_RECOVER);
    rec = kvf_drill_wait_recovered(d, t_heal, 4 * (unsigned)bound);
    d->time_to_recover_ms = rec;
    kvf_drill_check(d, rec >= 0, "traffic did not resume unthrottled");
    /* recovered throughput: a window after the queues drained */
    kvf_drill_sleep(d, 300);
    t1 = kvf_time_ms();
    b1 = kvf_drill_bytes(d, KVF_DRILL_RECOVER);
    kvf_drill_sleep(d, d->phase_ms);
    after_tput = (double)(kvf_drill_bytes(d, KVF_DRILL_RECOVER) - b1) / 1e6 /
                 ((double)(kvf_time_ms() - t1) / 1000.0);
    kvf_drill_workers_pause(d, &after, 1);
    t_end = kvf_time_ms();
    d->phase_secs[KVF_DRILL_RECOVER] = (double)(t_end - t_heal) / 1000.0;
    kvf_drill_workers_stop(d);
    kvf_drill_resources(d, "clients", &base, &after);
    kvf_drill_traffic_report(d, bound);
    kvf_record_figure(d->rec, "throughput throttled / baseline",
                      d->tput[KVF_DRILL_FAULT] / d->tput[KVF_DRILL_BASE],
                      "ratio", NAN, NAN);
    kvf_record_figure(d->rec, "recovered throughput (window after drain)",
                      after_tput, "MB/s", NAN, NAN);
    kvf_record_figure(d->rec, "throughput after / baseline",
                      after_tput / d->tput[KVF_DRILL_BASE], "ratio", NAN, NAN);
    kvf_drill_check(d,
                    d->tput[KVF_DRILL_FAULT] < 0.25 * d->tput[KVF_DRILL_BASE],
                    "throttled throughput %.1f MB/s is not below a quarter "
                    "of the baseline %.1f MB/s",
                    d->tput[KVF_DRILL_FAULT], d->tput[KVF_DRILL_BASE]);
    /* a 2-core machine shared with other jobs: back to a third of the
     * baseline and ten times the throttled rate counts as recovered */
    kvf_drill_check(d,
                    after_tput >= 0.33 * d->tput[KVF_DRILL_BASE] &&
                        after_tput >= 10 * d->tput[KVF_DRILL_FAULT],
                    "throughput after %.1f MB/s: not back (baseline %.1f, "
                    "throttled %.2f MB/s)",
                    after_tput, d->tput[KVF_DRILL_BASE],
                    d->tput[KVF_DRILL_FAULT]);
    snprintf(text, sizeof(text),
             "throughput %.1f -> %.2f -> %.1f MB/s (baseline, throttled, "
             "after); %lu calls failed throttled; longest call %.0f ms "
             "(bound %lu); %lu wrong bytes",
             d->tput[KVF_DRILL_BASE], d->tput[KVF_DRILL_FAULT], after_tput,
             (unsigned long)d->err_calls[KVF_DRILL_FAULT], d->max_wait_ms,
             (unsigned long)bound, (unsigned long)d->wrong_bytes);
    kvf_record_drill_text(d->rec, "observed", text);
    kvf_record_drill_text(d->rec, "recovery",
                          "qdisc removed; the same peers carried on");
out:
    kvf_drill_workers_stop(d);
    kvf_drill_kill(target, SIGTERM);
    kvf_drill_net_down(&net);
    return 0;
}
