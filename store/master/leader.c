/*
 * The master as one of several (high availability over etcd). When the
 * `metadata` key names etcd, the master campaigns for the leader key
 * (<etcd_prefix>master/leader, value: its RPC address) through
 * coord/election.h with a lease of master_lease_ms, and serves only
 * while it is the leader and can prove it: every request is checked
 * (kvf_m_leader_check), so a standby, and a leader cut off from etcd
 * for half a lease, answer KVF_ERR_NOT_LEADER and change nothing.
 *
 * Epochs: a term's epoch is the leader key's create revision in etcd,
 * which only grows; the master's epoch becomes KVF_M_HA_EPOCH | revision
 * so nodes can order masters and refuse an older one. A master that
 * stepped down stands for leader again; each term it wins starts with
 * no metadata (what it held before may be stale).
 */
#include "store/master/master_int.h"
#include "coord/election.h"
#include <kvferry/config.h>
#include "store/proto/masters.h"
#include "core/alloc.h"
#include "core/log.h"

#include <stdio.h>
#include <string.h>

static const kvf_config_entry_t kvf_ha_config_entries[] = {
    {"master_lease_ms", "2000",
     "etcd lease of the master leader (metadata = etcd): a dead leader is "
     "replaced about this long after its last keepalive; a leader cut off "
     "from etcd stops serving after half of it",
     KVF_CONFIG_TUNING},
};

KVF_CONFIG_TABLE(kvf_ha_config, "ha", kvf_ha_config_entries)

kvf_status_t kvf_m_leader_start(kvf_master_t *m)
{
    const char *meta = kvf_config_get("metadata");
    kvf_elect_opts_t o = {0};
    char key[256];
    kvf_status_t st;
    uint64_t v;

    if (meta == NULL || strncmp(meta, "etcd://", 7) != 0) {
        return KVF_OK; /* the only master */
    }
    st = kvf_config_u64(&kvf_ha_config, "master_lease_ms", &v);
    if (st != KVF_OK || v < 1000 || v > 600000) {
        kvf_error("master_lease_ms must be 1000..600000");
        return KVF_ERR_INVALID_PARAM;
    }
    kvf_sp_leader_key(key, sizeof(key));
    o.endpoints = meta;
    o.key = key;
    o.value = m->address;
    o.lease_ms = (unsigned)v;
    o.poll_ms = (unsigned)(v / 10);
    o.one_term = 0; /* a new term starts empty (kvf_m_leader_term) */
    st = kvf_elect_start(&o, &m->elect);
    if (st == KVF_OK) {
        kvf_info("master %s: standing for leader at %s (%s, lease %lu ms)",
                 m->address, key, meta, (unsigned long)v);
    }
    return st;
}

void kvf_m_leader_stop(kvf_master_t *m)
{
    kvf_elect_stop(m->elect);
    m->elect = NULL;
}

/* A new term begins: this master's epoch becomes the term's, and it
 * starts empty: whatever it held in an earlier term may be stale (the
 * nodes register again, their pools count empty; every object of before
 * is a miss, never a stale location). */
static void kvf_m_leader_term(kvf_master_t *m, uint64_t epoch)
{
    pthread_mutex_lock(&m->lock);
    if (m->term_epoch != epoch) {
        if (m->term_epoch != 0) {
            kvf_info("master %s: leader again: metadata of epoch %lu "
                     "dropped",
                     m->address, (unsigned long)m->term_epoch);
        }
        kvf_m_clear(m);
        m->term_epoch = epoch;
        m->epoch = KVF_M_HA_EPOCH | epoch;
        __atomic_store_n(&m->deposed, 0, __ATOMIC_RELAXED);
        kvf_info("master %s: leader, epoch %lu", m->address,
                 (unsigned long)epoch);
    }
    pthread_mutex_unlock(&m->lock);
}

kvf_status_t kvf_m_leader_check(kvf_master_t *m)
{
    uint64_t epoch;

    if (m->elect == NULL) {
        return KVF_OK;
    }
    if (kvf_elect_is_leader(m->elect, &epoch)) {
        if (__atomic_load_n(&m->term_epoch, __ATOMIC_RELAXED) != epoch) {
            kvf_m_leader_term(m, epoch);
        }
        return KVF_OK;
    }
    if (__atomic_load_n(&m->term_epoch, __ATOMIC_RELAXED) != 0 &&
        !__atomic_exchange_n(&m->deposed, 1, __ATOMIC_RELAXED)) {
        kvf_error("master %s: no longer the leader (epoch %lu ended); it "
                  "refuses every request and stands for leader again",
                  m->address, (unsigned long)m->term_epoch);
    }
    return KVF_ERR_NOT_LEADER;
}

int kvf_m_leader_state(kvf_master_t *m, uint64_t *epoch_p)
{
    *epoch_p = __atomic_load_n(&m->term_epoch, __ATOMIC_RELAXED);
    if (m->elect == NULL) {
        return -1;
    }
    return kvf_elect_is_leader(m->elect, NULL);
}
