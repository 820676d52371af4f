/*
 * Store drills where a process of the data path dies.
 *
 * node-kill: three nodes, two replicas per object; one node is SIGKILLed
 * while two clients get, put (read-through) and remove. A get whose first
 * replica is gone reads the other one; a put still commits the replica it
 * could write; after the TTL the master drops the node and stops handing
 * out its locations, and loses no object (each had a second replica). A
 * replacement node then joins and takes new objects.
 *
 * client-kill: a client is SIGKILLed in the middle of a put of 4 MiB (its
 * writes held 400 ms by the fault wrapper, so the kill lands between the
 * master's allocation and the commit). The master must reclaim the
 * allocation when the put timeout passes: pending puts back to 0, used
 * bytes and objects back to exactly what they were, the key never
 * readable; the other clients are not disturbed.
 */
#include "tools/drill/store.h"

#include <kvferry/store.h>

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/time.h"

int kvf_drill_node_kill(kvf_drill_t *d)
{
    kvf_drill_cluster_t c = {.replicas = 2};
    kvf_kv_arg_t a = {
        .keys = 200, .min_kb = 8, .max_kb = 64, .get_pct = 75, .remove_pct = 5};
    kvf_drill_res_t base, after, mbase, mafter;
    kvf_drill_mstatus_t s0, s1;
    uint64_t bound = kvf_drill_store_bound(d, 2), t_kill, t_join, t_end;
    double detect, rec;
    char text[640];

    snprintf(text, sizeof(text),
             "with 2 replicas on 3 nodes, a node SIGKILLed under gets, "
             "puts and removes costs no object and no wrong byte: gets "
             "fall back to the other replica, every call ends within its "
             "bound (%lu ms), the master drops the node within its TTL "
             "(%u ms + a heartbeat); a replacement node joins and calls "
             "after that see no error; pending puts back to 0, client "
             "fds, sockets and memory back to the baseline",
             (unsigned long)bound, 1500u);
    kvf_drill_expect(d, text);
    if (kvf_drill_store_begin(d, &c, 3, &a, 2) != 0) {
        return -1;
    }
    kvf_drill_store_baseline(d, &c, &base, &mbase, &s0, 0);

    kvf_drill_phase(d, KVF_DRILL_FAULT);
    t_kill = kvf_time_ms();
    kvf_drill_kill(c.node[0], SIGKILL);
    c.node[0] = 0;
    kvf_drill_log(d, "node 0 (%s) SIGKILLed", c.node_seg[0]);
    snprintf(text, sizeof(text),
             "SIGKILL to node 0 (%s) of 3, holding about a third of %.0f "
             "objects, while 2 clients ran",
             c.node_seg[0], s0.objects);
    kvf_drill_injected(d, text);
    detect = kvf_drill_wait_nodes(d, &c, 2, c.node_ttl_ms + 5000);
    kvf_record_figure(d->rec, "master dropped the dead node after", detect,
                      "ms", NAN, NAN);
    kvf_drill_check(d, detect >= 0 && detect <= c.node_ttl_ms + 1000,
                    "the master dropped the dead node after %.0f ms (TTL "
                    "%u ms)",
                    detect, c.node_ttl_ms);
    kvf_drill_sleep(d, d->phase_ms / 2);

    if (kvf_drill_node_start(d, &c, 0) != 0 ||
        kvf_drill_wait_nodes(d, &c, 3, 10000) < 0) {
        kvf_drill_fail(d, "the replacement node did not join");
        kvf_drill_cluster_stop(&c);
        return -1;
    }
    t_join = kvf_time_ms();
    d->phase_secs[KVF_DRILL_FAULT] = (double)(t_join - t_kill) / 1000.0;
    kvf_drill_phase(d, KVF_DRILL_RECOVER);
    rec = kvf_drill_wait_recovered(d, t_join, (unsigned)bound * 2);
    d->time_to_recover_ms = detect;
    kvf_drill_check(d, rec >= 0, "no successful call after the replacement");
    kvf_drill_sleep(d, d->phase_ms);
    kvf_drill_workers_pause(d, &after, 0);
    kvf_drill_master_res(d, &c, &mafter);
    kvf_drill_status(d, &c, &s1);
    t_end = kvf_time_ms();
    d->phase_secs[KVF_DRILL_RECOVER] = (double)(t_end - t_join) / 1000.0;
    kvf_drill_workers_stop(d);
    kvf_drill_store_report(d, &c, &mbase, &mafter);
    kvf_drill_resources(d, "clients", &base, &after);
    kvf_drill_traffic_report(d, bound);
    kvf_drill_check(d, s1.objects_lost == 0,
                    "%.0f objects lost with 2 replicas", s1.objects_lost);
    kvf_drill_check(d, s1.pending == 0, "%.0f puts left pending", s1.pending);
    kvf_drill_check(d, d->err_calls[KVF_DRILL_RECOVER] == 0,
                    "%lu calls failed after the replacement joined",
                    (unsigned long)d->err_calls[KVF_DRILL_RECOVER]);
    snprintf(text, sizeof(text),
             "%lu calls failed while the node was dead, %lu succeeded; the "
             "master dropped it after %.0f ms; objects lost %.0f; %lu "
             "wrong bytes; longest call %.0f ms (bound %lu)",
             (unsigned long)d->err_calls[KVF_DRILL_FAULT],
             (unsigned long)d->ok_calls[KVF_DRILL_FAULT], detect,
             s1.objects_lost, (unsigned long)d->wrong_bytes, d->max_wait_ms,
             (unsigned long)bound);
    kvf_record_drill_text(d->rec, "observed", text);
    snprintf(text, sizeof(text),
             "the master stopped handing out the dead node's locations "
             "%.0f ms after the kill (time to recover); a replacement node "
             "joined and the first call after it succeeded in %.0f ms",
             detect, rec);
    kvf_record_drill_text(d->rec, "recovery", text);
    kvf_record_not_verified(d->rec, "re-replication of objects left with "
                                    "one replica (the master does not "
                                    "re-replicate)");
    kvf_drill_cluster_stop(&c);
    return 0;
}

/* client-kill: the victim's key, probed by a helper process. */
typedef struct kvf_victim_probe {
    char master[64];
    char key[128];
    unsigned timeout_ms;
    int status; /* of kvf_store_exists */
} kvf_victim_probe_t;

static int kvf_victim_probe(kvf_drill_t *d, void *arg)
{
    kvf_victim_probe_t *p = arg;
    kvf_store_params_t sp = {0};
    kvf_store_h st;
    kvf_status_t s;

    (void)d;
    sp.field_mask = KVF_STORE_PARAM_MASTER | KVF_STORE_PARAM_TIMEOUT;
    sp.master = p->master;
    sp.timeout_ms = p->timeout_ms;
    s = kvf_store_connect(&sp, &st);
    if (s != KVF_OK) {
        p->status = s;
        return 1;
    }
    p->status = kvf_store_exists(st, p->key);
    kvf_store_disconnect(st);
    return 0;
}

int kvf_drill_client_kill(kvf_drill_t *d)
{
    kvf_drill_cluster_t c = {.replicas = 1, .put_timeout_ms = 2000};
    kvf_kv_arg_t a = {.keys = 100, .min_kb = 8, .max_kb = 64, .get_pct = 100};
    kvf_kv_arg_t v = {.prefix = "victim",
                      .min_kb = 4096,
                      .max_kb = 4096,
                      .sequential = 1,
                      .fault = "delay_ms=400"};
    kvf_drill_res_t base, after, mbase, mafter;
    kvf_drill_mstatus_t s0, s, s1;
    kvf_victim_probe_t *probe;
    uint64_t bound = kvf_drill_store_bound(d, 1), t_kill, t_rec = 0, end;
    uint64_t t_end;
    int victim, pending_seen = 0;
    char text[640];

    snprintf(text, sizeof(text),
             "a client SIGKILLed between the master's allocation and its "
             "commit leaves a pending put that the master reclaims once "
             "the put timeout (%u ms) passes: pending back to 0, used "
             "bytes and objects back to exactly the values before, the "
             "key never readable; the other clients see no error and no "
             "wrong byte, and their resources stay at the baseline",
             c.put_timeout_ms);
    kvf_drill_expect(d, text);
    probe = kvf_drill_shared_alloc(sizeof(*probe));
    if (probe == NULL || kvf_drill_store_begin(d, &c, 2, &a, 2) != 0) {
        return -1;
    }
    /* read-through fills every key */
    kvf_drill_store_baseline(d, &c, &base, &mbase, &s0, 0);

    kvf_drill_phase(d, KVF_DRILL_FAULT);
    victim = kvf_drill_worker(d, NULL, kvf_drill_kv_main, &v, c.master_addr);
    if (victim < 0 || kvf_drill_workers_ready(d, 15000) != 0) {
        kvf_drill_cluster_stop(&c);
        return -1;
    }
    /* wait until the master holds the victim's allocation */
    end = kvf_time_ms() + 5000;
    while (kvf_time_ms() < end && !pending_seen) {
        pending_seen =
            (__atomic_load_n(&d->sh[victim]->in_put, __ATOMIC_ACQUIRE) &&
             kvf_drill_status(d, &c, &s) == 0 && s.pending >= 1);
        usleep(5000);
    }
    if (!kvf_drill_check(d, pending_seen,
                         "the victim's put never became pending")) {
        kvf_drill_cluster_stop(&c);
        return -1;
    }
    usleep(100000);
    t_kill = kvf_time_ms();
    kvf_drill_worker_kill(d, (unsigned)victim);
    kvf_drill_log(d, "client SIGKILLed mid-put");
    kvf_drill_status(d, &c, &s);
    snprintf(text, sizeof(text),
             "SIGKILL to a client 100 ms into a put of 4 MiB (its writes "
             "held 400 ms by KVF_FAULT=delay_ms=400); the master then had "
             "%.0f pending put(s), %.0f bytes used (%.0f before)",
             s.pending, s.used, s0.used);
    kvf_drill_injected(d, text);

    /* reclaim: pending 0, used and objects exactly as before */
    end = t_kill + c.put_timeout_ms + 5000;
    while (kvf_time_ms() < end) {
        if (kvf_drill_status(d, &c, &s) == 0 && s.pending == 0 &&
            s.used == s0.used && s.objects == s0.objects) {
            t_rec = kvf_time_ms();
            break;
        }
        usleep(20000);
    }
    d->time_to_recover_ms = t_rec ? (double)(t_rec - t_kill) : -1.0;
    kvf_drill_check(d, t_rec != 0 && t_rec - t_kill <= c.put_timeout_ms + 1500,
                    "allocation not reclaimed within the put timeout "
                    "(%u ms) + 1.5 s: pending %.0f, used %.0f (before "
                    "%.0f), objects %.0f (before %.0f)",
                    c.put_timeout_ms, s.pending, s.used, s0.used, s.objects,
                    s0.objects);
    snprintf(probe->master, sizeof(probe->master), "%s", c.master_addr);
    kvf_drill_kv_key(probe->key, sizeof(probe->key), d, &v, victim, 0);
    probe->timeout_ms = d->timeout_ms;
    kvf_drill_oneshot(d, NULL, kvf_victim_probe, probe, 10000);
    kvf_drill_check(d, probe->status == KVF_ERR_NO_KEY,
                    "the killed client's key answers %s, not KVF_ERR_NO_KEY",
                    kvf_status_name((kvf_status_t)probe->status));

    kvf_drill_phase(d, KVF_DRILL_RECOVER);
    d->phase_secs[KVF_DRILL_FAULT] = (double)(kvf_time_ms() - t_kill) / 1000;
    t_end = kvf_time_ms();
    kvf_drill_sleep(d, d->phase_ms);
    kvf_drill_workers_pause(d, &after, 0);
    kvf_drill_master_res(d, &c, &mafter);
    kvf_drill_status(d, &c, &s1);
    d->phase_secs[KVF_DRILL_RECOVER] = (double)(kvf_time_ms() - t_end) / 1000;
    kvf_drill_workers_stop(d);
    kvf_drill_store_report(d, &c, &mbase, &mafter);
    kvf_drill_resources(d, "surviving clients", &base, &after);
    kvf_drill_traffic_report(d, bound);
    kvf_drill_check(d, s1.reclaimed >= s0.reclaimed + 1,
                    "the master counted no reclaimed put");
    kvf_drill_check(d,
                    mafter.objects == mbase.objects &&
                        mafter.alloc_bytes == mbase.alloc_bytes,
                    "master objects %.0f -> %.0f, used %.0f -> %.0f",
                    mbase.objects, mafter.objects, mbase.alloc_bytes,
                    mafter.alloc_bytes);
    kvf_drill_check(d,
                    d->err_calls[KVF_DRILL_FAULT] == 0 &&
                        d->err_calls[KVF_DRILL_RECOVER] == 0,
                    "the other clients saw %lu errors",
                    (unsigned long)(d->err_calls[KVF_DRILL_FAULT] +
                                    d->err_calls[KVF_DRILL_RECOVER]));
    snprintf(text, sizeof(text),
             "the master reclaimed the dead client's allocation %.0f ms "
             "after the kill (put timeout %u ms); its key answers %s; the "
             "other clients: %lu errors, %lu wrong bytes",
             d->time_to_recover_ms, c.put_timeout_ms,
             kvf_status_name((kvf_status_t)probe->status),
             (unsigned long)(d->err_calls[KVF_DRILL_FAULT] +
                             d->err_calls[KVF_DRILL_RECOVER]),
             (unsigned long)d->wrong_bytes);
    kvf_record_drill_text(d->rec, "observed", text);
    kvf_record_drill_text(d->rec, "recovery",
                          "nothing to do by hand: the master's put timeout "
                          "undid the allocation");
    kvf_drill_cluster_stop(&c);
    return 0;
}
