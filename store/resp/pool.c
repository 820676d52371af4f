/*
 * The door's value pool: one anonymous mapping registered with the store
 * client's engine, cut in granules of KVF_RESP_GRANULE handed out first
 * fit from the start (so buffers stay in pages already touched). SET
 * values are parsed or received into it and GETs read into it, so the
 * store moves bytes between it and the nodes without copies. A GET's
 * value (kvf_resp_val_t) is shared by every connection of a batch that
 * asked for its key, by reference count.
 */
#include "store/resp/resp_int.h"

#include <kvferry/store.h>

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

kvf_status_t kvf_resp_pool_init(struct kvf_resp *s)
{
    kvf_resp_pool_t *pl = &s->pool;
    kvf_status_t st;

    pthread_mutex_init(&pl->mu, NULL);
    pl->granules = (s->p.pool + KVF_RESP_GRANULE - 1) / KVF_RESP_GRANULE;
    pl->len = pl->granules * KVF_RESP_GRANULE;
    pl->base = mmap(NULL, pl->len, PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (pl->base == MAP_FAILED) {
        pl->base = NULL;
        return KVF_ERR_NO_MEMORY;
    }
    pl->used = calloc(pl->granules, 1);
    if (pl->used == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    st = kvf_engine_reg(kvf_store_engine(s->st), pl->base, pl->len,
                        KVF_MEM_HOST, 0, &pl->region);
    if (st != KVF_OK) {
        pl->region = NULL;
    }
    return st;
}

void kvf_resp_pool_fini(struct kvf_resp *s)
{
    kvf_resp_pool_t *pl = &s->pool;

    if (pl->region != NULL) {
        kvf_engine_dereg(kvf_store_engine(s->st), pl->region);
    }
    if (pl->base != NULL) {
        munmap(pl->base, pl->len);
    }
    free(pl->used);
    pthread_mutex_destroy(&pl->mu);
}

/* First fit of n free granules from i; returns the start or SIZE_MAX. */
static size_t kvf_resp_pool_fit(const kvf_resp_pool_t *pl, size_t i, size_t end,
                                size_t n)
{
    size_t run = 0;

    for (; i < end; i++) {
        run = pl->used[i] ? 0 : run + 1;
        if (run == n) {
            return i + 1 - n;
        }
    }
    return SIZE_MAX;
}

char *kvf_resp_pool_alloc(kvf_resp_pool_t *pl, size_t len)
{
    size_t n = (len + KVF_RESP_GRANULE - 1) / KVF_RESP_GRANULE, at;

    if (n == 0) {
        n = 1;
    }
    if (n > pl->granules) {
        return NULL;
    }
    pthread_mutex_lock(&pl->mu);
    /* first fit from the start: buffers stay in the few pages (and cache
     * lines) already touched */
    at = kvf_resp_pool_fit(pl, pl->low, pl->granules, n);
    if (at != SIZE_MAX) {
        memset(pl->used + at, 1, n);
        pl->nused += n;
        if (at == pl->low) {
            pl->low = at + n;
        }
    }
    pthread_mutex_unlock(&pl->mu);
    return at == SIZE_MAX ? NULL : pl->base + at * KVF_RESP_GRANULE;
}

void kvf_resp_pool_free(kvf_resp_pool_t *pl, char *p, size_t len)
{
    size_t n = (len + KVF_RESP_GRANULE - 1) / KVF_RESP_GRANULE, at;

    if (p == NULL) {
        return;
    }
    at = (size_t)(p - pl->base) / KVF_RESP_GRANULE;
    pthread_mutex_lock(&pl->mu);
    memset(pl->used + at, 0, n ? n : 1);
    pl->nused -= n ? n : 1;
    if (at < pl->low) {
        pl->low = at;
    }
    pthread_mutex_unlock(&pl->mu);
}

kvf_resp_val_t *kvf_resp_val_new(struct kvf_resp *s, size_t cap)
{
    kvf_resp_val_t *v = calloc(1, sizeof(*v));

    if (v == NULL) {
        return NULL;
    }
    v->p = kvf_resp_pool_alloc(&s->pool, cap ? cap : 1);
    if (v->p == NULL) {
        free(v);
        return NULL;
    }
    v->cap = cap ? cap : 1;
    v->len = 0;
    v->refs = 1;
    return v;
}

void kvf_resp_val_unref(struct kvf_resp *s, kvf_resp_val_t *v)
{
    if (v == NULL || --v->refs > 0) {
        return;
    }
    if (v->vl != NULL) {
        kvf_resp_vlease_drop(v->vl, v);
    } else if (v->heap) {
        atomic_fetch_sub(&s->slow_copied, v->len);
        free(v->p);
    } else {
        kvf_resp_pool_free(&s->pool, v->p, v->cap);
    }
    free(v);
}
