/*
 * Store client: the operations on keys that move no bytes. remove,
 * exists, hold (exists under a read lease), list and query are one
 * master round trip each; a remove also drops the key from the handle's
 * location cache.
 */
#include "store/client/client_int.h"
#include "core/alloc.h"
#include "core/log.h"

#include <stdio.h>
#include <string.h>

/* REMOVE or EXISTS for count keys: one status each. */
static kvf_status_t kvf_keys_call(kvf_store_h st, uint8_t type, size_t count,
                                  const char *const *keys, kvf_status_t *s)
{
    kvf_status_t status = KVF_OK;
    size_t i, nsent = 0;
    kvf_sconn_t *c;
    kvf_wr_t w;
    kvf_rd_t r;

    kvf_wr_init(&w);
    for (i = 0; i < count; i++) {
        s[i] = kvf_sp_key_check(keys[i]);
        if (s[i] == KVF_OK) {
            kvf_sm_key_enc(&w, keys[i]);
            nsent++;
        }
    }
    if (nsent > 0) {
        status = kvf__srpc(st, type, (uint32_t)nsent, &w, &c);
    }
    kvf_wr_free(&w);
    if (nsent > 0 && status == KVF_OK) {
        kvf_rd_init(&r, c->f.body, c->f.hdr.meta_len);
        for (i = 0; i < count && c->f.hdr.count == nsent; i++) {
            if (s[i] == KVF_OK) {
                s[i] = kvf_sm_status_dec(&r);
            }
        }
        status = kvf_sm_rep_end(&r, c->f.hdr.count, (uint32_t)nsent);
        kvf__srelease(st, c);
    }
    for (i = 0; i < count && status != KVF_OK; i++) {
        s[i] = (s[i] == KVF_OK) ? status : s[i];
    }
    return kvf__sfirst_error(s, count);
}

static kvf_status_t kvf_keys_batch(kvf_store_h st, uint8_t type, size_t count,
                                   const char *const *keys,
                                   kvf_status_t *statuses)
{
    kvf_status_t status, *s = statuses, *own = NULL;

    if (st == NULL || keys == NULL || count == 0 ||
        count > KVF_STORE_BATCH_MAX) {
        return KVF_ERR_INVALID_PARAM;
    }
    if (s == NULL && (s = own = kvf_calloc(count, sizeof(*s))) == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    status = kvf_keys_call(st, type, count, keys, s);
    kvf_free(own);
    return status;
}

kvf_status_t kvf_store_remove_batch(kvf_store_h st, size_t count,
                                    const char *const *keys,
                                    kvf_status_t *statuses)
{
    size_t i;

    for (i = 0;
         st != NULL && keys != NULL && i < count && i <= KVF_STORE_BATCH_MAX;
         i++) {
        if (keys[i] != NULL) {
            kvf__strat_gone(st, keys[i]);
        }
    }
    return kvf_keys_batch(st, KVF_SP_REMOVE, count, keys, statuses);
}

kvf_status_t kvf_store_exists_batch(kvf_store_h st, size_t count,
                                    const char *const *keys,
                                    kvf_status_t *statuses)
{
    return kvf_keys_batch(st, KVF_SP_EXISTS, count, keys, statuses);
}

kvf_status_t kvf_store_hold_batch(kvf_store_h st, size_t count,
                                  const char *const *keys,
                                  kvf_status_t *statuses, unsigned *lease_ms_p)
{
    unsigned lease_ms = ~0u;
    kvf_status_t status;
    kvf_sreps_t *e;
    size_t i;

    if (st == NULL || keys == NULL || statuses == NULL || count == 0 ||
        count > KVF_STORE_BATCH_MAX) {
        return KVF_ERR_INVALID_PARAM;
    }
    if ((e = kvf_calloc(count, sizeof(*e))) == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    status = kvf__slookup(st, count, keys, e);
    for (i = 0; i < count; i++) {
        statuses[i] =
            (status != KVF_OK && e[i].status == KVF_OK) ? status : e[i].status;
        if (statuses[i] == KVF_OK && e[i].lease_ms < lease_ms) {
            lease_ms = e[i].lease_ms;
        }
    }
    kvf_free(e);
    if (lease_ms_p != NULL) {
        *lease_ms_p = (lease_ms == ~0u) ? 0 : lease_ms;
    }
    return kvf__sfirst_error(statuses, count);
}

kvf_status_t kvf_store_remove(kvf_store_h st, const char *key)
{
    return kvf_store_remove_batch(st, 1, &key, NULL);
}

kvf_status_t kvf_store_exists(kvf_store_h st, const char *key)
{
    return kvf_keys_batch(st, KVF_SP_EXISTS, 1, &key, NULL);
}

kvf_status_t kvf_store_query(kvf_store_h st, const char *key,
                             kvf_store_info_t *info_p)
{
    kvf_status_t status;
    kvf_sreps_t *e;
    unsigned i;

    if (st == NULL || info_p == NULL) {
        return KVF_ERR_INVALID_PARAM;
    }
    e = kvf_calloc(1, sizeof(*e));
    if (e == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    status = kvf__slookup(st, 1, &key, e);
    if (status == KVF_OK) {
        status = e->status;
    }
    if (status == KVF_OK) {
        memset(info_p, 0, sizeof(*info_p));
        info_p->size = e->size;
        info_p->checksum = e->checksum;
        info_p->replicas = e->nrep;
        info_p->lease_ms = e->lease_ms;
        for (i = 0; i < e->nrep; i++) {
            memcpy(info_p->segment[i], e->seg[i], KVF_STORE_SEG_MAX);
            info_p->addr[i] = e->addr[i];
        }
    }
    kvf_free(e);
    return status;
}

kvf_status_t kvf_store_list(kvf_store_h st, const char *prefix, size_t max,
                            void (*fn)(const kvf_store_entry_t *e, void *arg),
                            void *arg)
{
    kvf_store_entry_t ent;
    kvf_sm_list_ent_t le;
    kvf_sm_list_t q;
    kvf_status_t status;
    kvf_sconn_t *c;
    uint32_t i;
    kvf_wr_t w;
    kvf_rd_t r;

    if (st == NULL || fn == NULL ||
        (prefix != NULL && strlen(prefix) > KVF_STORE_KEY_MAX)) {
        return KVF_ERR_INVALID_PARAM;
    }
    snprintf(q.prefix, sizeof(q.prefix), "%s", prefix ? prefix : "");
    q.max = (uint32_t)(max > UINT32_MAX ? UINT32_MAX : max);
    kvf_wr_init(&w);
    kvf_sm_list_enc(&w, &q);
    status = kvf__srpc(st, KVF_SP_LIST, 0, &w, &c);
    kvf_wr_free(&w);
    if (status != KVF_OK) {
        return status;
    }
    kvf_rd_init(&r, c->f.body, c->f.hdr.meta_len);
    for (i = 0; i < c->f.hdr.count; i++) {
        kvf_sm_list_ent_dec(&r, &le);
        if (kvf_rd_status(&r) != KVF_OK) {
            break;
        }
        ent.key = le.key;
        ent.size = le.size;
        ent.committed = le.committed;
        ent.replicas = le.nrep;
        fn(&ent, arg);
    }
    status = kvf_rd_status(&r);
    if (status == KVF_OK && (c->f.hdr.flags & KVF_SP_TRUNCATED)) {
        kvf_info("store list: reply truncated (more keys match)");
    }
    kvf__srelease(st, c);
    return status;
}
