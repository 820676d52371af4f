/*
 * Store client: the move stage every operation shares. Ops are gathered
 * per batch (one per replica a put writes or a get reads), run as one
 * engine batch, and checksummed: on the CPU for host memory, by the node
 * for memory the CPU cannot read. Each batch's arrays come from one
 * arena allocation.
 */
#include "store/client/client_int.h"
#include "core/alloc.h"
#include "core/checksum.h"
#include "core/time.h"

#include <string.h>

#define KVF_SARENA_ALIGN 16

static const char kvf_store_empty[1];

void *kvf__sarena_take(kvf_sarena_t *a, size_t size)
{
    void *p = (a->base != NULL) ? a->base + a->off : NULL;

    a->off += (size + KVF_SARENA_ALIGN - 1) & ~(size_t)(KVF_SARENA_ALIGN - 1);
    return p;
}

kvf_status_t kvf__sarena_alloc(kvf_sarena_t *a)
{
    a->base = kvf_calloc(1, a->off ? a->off : 1);
    a->off = 0;
    return (a->base != NULL) ? KVF_OK : KVF_ERR_NO_MEMORY;
}

void kvf__sarena_free(kvf_sarena_t *a)
{
    kvf_free(a->base);
    a->base = NULL;
}

kvf_status_t kvf__sfirst_error(const kvf_status_t *s, size_t n)
{
    size_t i;

    for (i = 0; i < n; i++) {
        if (s[i] != KVF_OK) {
            return s[i];
        }
    }
    return KVF_OK;
}

kvf_status_t kvf__smove_add(kvf_store_h st, kvf_smove_t *mv, kvf_op_type_t type,
                            void *local, const kvf_sreps_t *e, unsigned k,
                            size_t len, uint32_t key)
{
    kvf_status_t status;
    kvf_op_t *op = &mv->ops[mv->n];

    status = kvf__speer_ref(st, e->seg[k], &mv->sps[mv->n]);
    if (status != KVF_OK) {
        return status;
    }
    memset(op, 0, sizeof(*op));
    op->type = type;
    op->local = local;
    op->peer = mv->sps[mv->n]->peer;
    op->remote = e->addr[k];
    op->length = len;
    mv->key[mv->n] = key;
    mv->rep[mv->n] = k;
    mv->n++;
    return KVF_OK;
}

/* Peers that failed leave the cache. */
void kvf__smove_run(kvf_store_h st, kvf_smove_t *mv, void (*during)(void *arg),
                    void *arg)
{
    uint64_t t0 = kvf_time_ms(), spent;
    kvf_status_t status;
    size_t i, n = mv->n;
    kvf_batch_h b;

    status = (n > 0) ? kvf_batch_submit_ex(st->engine, mv->ops, n,
                                           KVF_BATCH_INLINE, &b)
                     : KVF_OK;
    mv->batch = (n > 0 && status == KVF_OK) ? b : NULL;
    if (during != NULL) {
        during(arg);
    }
    mv->batch = NULL;
    if (n > 0 && status == KVF_OK) {
        /* one timeout for the whole move, the time during() took included */
        spent = kvf_time_ms() - t0;
        status = kvf_batch_wait(
            b, spent < st->timeout_ms ? (int)(st->timeout_ms - spent) : 0);
        for (i = 0; i < n; i++) {
            mv->st[i] = (status == KVF_ERR_TIMEOUT)
                            ? KVF_ERR_TIMEOUT
                            : kvf_batch_op_status(b, i, NULL);
        }
        kvf_batch_destroy(b);
    } else {
        for (i = 0; i < n; i++) {
            mv->st[i] = status;
        }
    }
    for (i = 0; i < n; i++) {
        kvf__speer_unref(st, mv->sps[i], kvf__speer_error(mv->st[i]));
    }
}

kvf_status_t kvf__ssum(kvf_store_h st, const void *buf, size_t len, int device,
                       const kvf_sreps_t *e, unsigned k, uint64_t *sum_p)
{
    uint64_t addr = e->addr[k];
    kvf_status_t status;
    kvf_speer_t *sp;

    if (!device) {
        *sum_p = kvf_checksum(len ? buf : kvf_store_empty, len);
        return KVF_OK;
    }
    status = kvf__speer_ref(st, e->seg[k], &sp);
    if (status == KVF_OK) {
        status = kvf_peer_checksum(sp->peer, &addr, &len, 1, sum_p);
        kvf__speer_unref(st, sp, 0);
    }
    return status;
}
