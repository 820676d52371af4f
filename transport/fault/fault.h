/*
 * fault: a transport wrapper for drills and tests (libfabric hook-provider
 * style). It sits between the engine and any transport's ep and injects,
 * reproducibly from a seed:
 *
 *   delay_ms=N     every request is held N ms (+ up to jitter_ms) first
 *   drop=P         a request is lost with probability P: it never reaches
 *                  the transport and fails with KVF_ERR_TIMEOUT when the
 *                  engine timeout expires, as a silent peer would
 *   fail_after=N   request N+1 and every later one fails (KVF_ERR_IO):
 *                  a link that dies for good
 *   reset_after=N  every Nth request fails with KVF_ERR_CONN_RESET, and so
 *                  does every request in flight then; the inner ep is
 *                  closed and opened again (a real reconnect)
 *   seed=S         the fault of the k-th request posted to the i-th
 *                  wrapped ep of the process depends only on (S, i, k)
 *
 * Turned on by the `fault` configuration key, i.e. the environment
 * variable KVF_FAULT="seed=1,delay_ms=5,drop=0.01,fail_after=100"
 * (empty or "off" = no wrapper). Registered as a hook (transport/hook.h)
 * the engine offers every ep it opens; tests may call kvf_fault_wrap()
 * directly.
 */
#ifndef KVF_TRANSPORT_FAULT_H
#define KVF_TRANSPORT_FAULT_H
#if !defined(KVF_LAYER_TRANSPORT) && !defined(KVF_TEST_INTERNALS)
#error "transport/fault/fault.h is private to transport/"
#endif

#include "transport/hook.h"
#include "core/config.h"

typedef struct kvf_fault_spec {
    uint64_t seed;
    unsigned delay_ms;
    unsigned jitter_ms;
    double drop;          /* 0..1 */
    uint64_t fail_after;  /* 0 = never */
    uint64_t reset_after; /* 0 = never */
} kvf_fault_spec_t;

/* Totals of injected faults in this process (all wrapped eps). */
typedef struct kvf_fault_stats {
    uint64_t posted; /* requests seen by wrappers */
    uint64_t passed; /* handed to the inner transport */
    uint64_t delayed;
    uint64_t dropped;
    uint64_t failed; /* fail_after */
    uint64_t resets;
    uint64_t reset_failed; /* requests failed by a reset */
} kvf_fault_stats_t;

/* Parses "key=value,..." (keys above). "" and "off" give an all-zero
 * spec and *active_p = 0. Unknown keys or bad values: INVALID_PARAM. */
kvf_status_t kvf_fault_parse(const char *text, kvf_fault_spec_t *spec,
                             int *active_p);

/* Wraps an open ep. On success *ops_p / *ep_p name the wrapper, which
 * owns the inner ep (closing the wrapper closes it). iface and address
 * are the ones the inner ep was opened with (used to reopen it on a
 * reset; the iface must outlive the wrapper). On failure nothing
 * changes and the inner ep stays the caller's. */
kvf_status_t kvf_fault_wrap(const kvf_fault_spec_t *spec, unsigned timeout_ms,
                            kvf_tl_iface_t *iface, const char *address,
                            const kvf_transport_ops_t **ops_p,
                            kvf_tl_ep_t **ep_p);

void kvf_fault_stats(kvf_fault_stats_t *stats);

extern const kvf_config_table_t kvf_fault_config;
extern const kvf_tl_hook_t kvf_fault_hook;

#endif
