/*
 * Store client handle: a base (base.c: connections, RPC, retry, leader
 * following) and the strategies installed on it, in the order of the
 * table below. The operations (put.c, get.c, keys.c, view.c,
 * put_view.c) stand on the base and reach the strategies only through
 * the handle's table (kvf__strat_get/seen/gone in client_int.h), so no
 * file below calls one above it: a connect opens the base, then each
 * strategy; a disconnect closes them in the reverse order.
 */
#include "store/client/client_int.h"
#include "core/alloc.h"

/* get tries them in this order: a lease read needs no master, the
 * location cache overlaps the master's round trip. */
static const kvf__sstrat_ops_t *const kvf_handle_strats[] = {
    &kvf__slease_ops, /* before loc: sets the table's lease keeping */
    &kvf__sloc_ops,
    &kvf__sview_ops,
    &kvf__spview_ops,
};

#define KVF_HANDLE_NSTRAT                                                      \
    (sizeof(kvf_handle_strats) / sizeof(kvf_handle_strats[0]))

_Static_assert(KVF_HANDLE_NSTRAT <= KVF__SSTRAT_MAX, "strategy table size");

/* Closes the strategies opened (the last first), then the base. */
static void kvf_handle_close(kvf_store_h st)
{
    const kvf__sstrat_ops_t *ops;

    while (st->nstrat > 0) {
        ops = st->strat[--st->nstrat];
        if (ops->fini != NULL) {
            ops->fini(st);
        }
    }
    kvf__sbase_close(st);
}

kvf_status_t kvf_store_connect(const kvf_store_params_t *p,
                               kvf_store_h *store_p)
{
    const kvf__sstrat_ops_t *ops;
    kvf_status_t status;
    kvf_store_h st;
    size_t i;

    if (store_p == NULL) {
        return KVF_ERR_INVALID_PARAM;
    }
    st = kvf_calloc(1, sizeof(*st));
    if (st == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    status = kvf__sbase_open(st, p);
    if (status != KVF_OK) {
        kvf_free(st);
        return status;
    }
    for (i = 0; i < KVF_HANDLE_NSTRAT; i++) {
        ops = kvf_handle_strats[i];
        status = (ops->init != NULL) ? ops->init(st) : KVF_OK;
        if (status != KVF_OK) {
            kvf_handle_close(st);
            kvf_free(st);
            return status;
        }
        st->strat[st->nstrat++] = ops;
    }
    *store_p = st;
    return KVF_OK;
}

void kvf_store_disconnect(kvf_store_h st)
{
    if (st == NULL) {
        return;
    }
    kvf_handle_close(st);
    kvf_free(st);
}
