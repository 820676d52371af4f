/*
 * Shared by the master high-availability drills (ha.c, ha_part.c): the
 * etcd they start, the two masters, and the helpers around them.
 */
#ifndef KVF_DRILL_HA_H
#define KVF_DRILL_HA_H
#if !defined(KVF_LAYER_TOOLS) && !defined(KVF_TEST_INTERNALS)
#error "tools/drill/ha.h is private to tools/"
#endif

#include "tools/drill/drill.h"
#include "tools/drill/store.h"

enum { KVF_HA_KILL_LEADER, KVF_HA_STOP_ETCD, KVF_HA_DOWN_ETCD };

#define KVF_HA_LEASE_MS 1000

typedef struct kvf_ha {
    char etcd_bin[256];
    char etcd_dir[600];
    unsigned cport, pport;
    pid_t etcd;
    char uri[64];
    kvf_drill_cluster_t c;
    pid_t m[2];
    char addr[2][64];
    char http[2][64];
    pid_t proxy[2]; /* master-partition: each master's way to etcd */
    unsigned proxy_port[2];
} kvf_ha_t;

int kvf_ha_which(const char *name, char *out, size_t len);
unsigned kvf_ha_free_port(void);
/* Finds etcd (a skip when absent), picks its dir and ports, and points
 * KVF_METADATA at it: -1 after the skip. */
int kvf_ha_etcd_env(kvf_drill_t *d, kvf_ha_t *h);
/* Starts etcd (again, on the same ports and data after a stop). */
int kvf_ha_etcd_start(kvf_drill_t *d, kvf_ha_t *h);
/* Master i's /status. */
int kvf_ha_status(kvf_drill_t *d, kvf_ha_t *h, int i, kvf_drill_mstatus_t *s);
/* Waits until master i (or, i < 0, any) leads with n nodes: its index,
 * and the ms waited in *ms_p; -1 after max_ms. */
int kvf_ha_wait_leader(kvf_drill_t *d, kvf_ha_t *h, int i, unsigned n,
                       unsigned max_ms, double *ms_p);
/* Objects written from now on belong to a new leader. */
void kvf_ha_epoch_bump(kvf_drill_t *d);
/* Stops everything kvf_ha_up or ha_part.c started. */
void kvf_ha_down(kvf_ha_t *h);

#endif
