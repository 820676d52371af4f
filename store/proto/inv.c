/*
 * Object inventory of a node's pool (see inv.h): a sorted array of
 * non-overlapping entries, binary search by offset, fencing by epoch.
 */
#include "store/proto/inv.h"
#include "core/alloc.h"
#include "core/log.h"

#include <string.h>

void kvf_inv_init(kvf_inv_t *inv, uint64_t pool_len)
{
    memset(inv, 0, sizeof(*inv));
    inv->pool_len = pool_len;
}

void kvf_inv_fini(kvf_inv_t *inv)
{
    size_t i;

    for (i = 0; i < inv->n; i++) {
        kvf_free(inv->ent[i].key);
    }
    kvf_free(inv->ent);
    memset(inv, 0, sizeof(*inv));
}

kvf_status_t kvf_inv_fence(kvf_inv_t *inv, uint64_t epoch)
{
    if (epoch < inv->max_epoch) {
        return KVF_ERR_STALE;
    }
    inv->max_epoch = epoch;
    return KVF_OK;
}

size_t kvf_inv_seek(const kvf_inv_t *inv, uint64_t from)
{
    size_t lo = 0, hi = inv->n, mid;

    while (lo < hi) {
        mid = lo + (hi - lo) / 2;
        if (inv->ent[mid].off < from) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    return lo;
}

/* Entries [*first_p, *end_p) overlapping [off, off + size). */
static void kvf_inv_overlaps(const kvf_inv_t *inv, uint64_t off, uint64_t size,
                             size_t *first_p, size_t *end_p)
{
    size_t i = kvf_inv_seek(inv, off), j;

    if (i > 0 && inv->ent[i - 1].off + inv->ent[i - 1].size > off) {
        i--;
    }
    for (j = i; j < inv->n && inv->ent[j].off < off + size; j++) {
    }
    *first_p = i;
    *end_p = j;
}

static kvf_status_t kvf_inv_check(const kvf_inv_t *inv, const char *key,
                                  uint64_t off, uint64_t size)
{
    size_t klen = key != NULL ? strnlen(key, KVF_STORE_KEY_MAX + 1) : 0;

    if (klen == 0 || klen > KVF_STORE_KEY_MAX || size == 0 ||
        off > inv->pool_len || size > inv->pool_len - off) {
        return KVF_ERR_INVALID_PARAM;
    }
    return KVF_OK;
}

/* Whether entries [i, j) let an entry of (epoch, seq) in under mode. */
static kvf_status_t kvf_inv_may_replace(const kvf_inv_t *inv, int mode,
                                        size_t i, size_t j, uint64_t epoch,
                                        uint64_t seq)
{
    const kvf_inv_ent_t *e;

    for (; i < j; i++) {
        e = &inv->ent[i];
        if (mode == KVF_INV_REPORT
                ? (e->epoch > epoch || (e->epoch == epoch && e->seq >= seq))
                : e->epoch > epoch) {
            return KVF_ERR_EXISTS;
        }
    }
    return KVF_OK;
}

kvf_status_t kvf_inv_put(kvf_inv_t *inv, int mode, const char *key,
                         uint64_t off, uint64_t size, uint64_t checksum,
                         uint64_t epoch, uint64_t seq, uint8_t flags)
{
    kvf_inv_ent_t *grown, e;
    size_t i, j, k;
    kvf_status_t st = kvf_inv_check(inv, key, off, size);

    if (st != KVF_OK) {
        return st;
    }
    if (mode == KVF_INV_RECORD && kvf_inv_fence(inv, epoch) != KVF_OK) {
        return KVF_ERR_STALE;
    }
    kvf_inv_overlaps(inv, off, size, &i, &j);
    st = kvf_inv_may_replace(inv, mode, i, j, epoch, seq);
    if (st != KVF_OK) {
        return st;
    }
    if (j == i && inv->n == inv->cap) {
        grown = kvf_realloc(inv->ent,
                            (inv->cap ? inv->cap * 2 : 64) * sizeof(*grown));
        if (grown == NULL) {
            return KVF_ERR_NO_MEMORY;
        }
        inv->ent = grown;
        inv->cap = inv->cap ? inv->cap * 2 : 64;
    }
    e.key = kvf_strdup(key);
    if (e.key == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    e.off = off;
    e.size = size;
    e.checksum = checksum;
    e.epoch = epoch;
    e.seq = seq;
    e.flags = flags;
    for (k = i; k < j; k++) {
        kvf_free(inv->ent[k].key);
        inv->dropped++;
    }
    if (j > i) {
        /* the new entry takes slot i; the rest of [i, j) closes up */
        memmove(&inv->ent[i + 1], &inv->ent[j],
                (inv->n - j) * sizeof(*inv->ent));
        inv->n -= j - i - 1;
    } else {
        memmove(&inv->ent[i + 1], &inv->ent[i],
                (inv->n - i) * sizeof(*inv->ent));
        inv->n++;
    }
    inv->ent[i] = e;
    return KVF_OK;
}

kvf_status_t kvf_inv_del(kvf_inv_t *inv, const char *key, uint64_t off,
                         uint64_t epoch)
{
    size_t i;

    if (kvf_inv_fence(inv, epoch) != KVF_OK) {
        return KVF_ERR_STALE;
    }
    i = kvf_inv_seek(inv, off);
    if (i == inv->n || inv->ent[i].off != off || key == NULL ||
        strcmp(inv->ent[i].key, key) != 0) {
        return KVF_ERR_NOT_FOUND;
    }
    kvf_free(inv->ent[i].key);
    memmove(&inv->ent[i], &inv->ent[i + 1],
            (inv->n - i - 1) * sizeof(*inv->ent));
    inv->n--;
    return KVF_OK;
}
