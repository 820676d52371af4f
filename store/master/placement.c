/*
 * The master's placement of replicas: on distinct nodes, on distinct
 * hosts while there are hosts left (a node's host is the address part of
 * its segment name, host:port), the host with the most free space first,
 * then its node with the most free space; only when the hosts run out do
 * two replicas share a host. Lock held.
 */
#include "store/master/master_int.h"
#include "core/alloc.h"
#include "core/log.h"
#include "core/time.h"

#include <stdio.h>
#include <string.h>

/* The length of the host part of a segment name: the address before
 * its ":port" ("10.0.0.2:7000", "[::1]:7000"); a name without a port is
 * a host of its own. */
static size_t kvf_m_host_len(const char *seg)
{
    const char *colon = strrchr(seg, ':');

    if (colon == NULL || colon == seg ||
        (strchr(seg, ':') != colon && seg[0] != '[')) {
        return strlen(seg);
    }
    return (size_t)(colon - seg);
}

static int kvf_m_same_host(const kvf_mnode_t *a, const kvf_mnode_t *b)
{
    size_t la = kvf_m_host_len(a->segment);

    return la == kvf_m_host_len(b->segment) &&
           memcmp(a->segment, b->segment, la) == 0;
}

/* Free bytes of every node on n's host. */
static uint64_t kvf_m_host_free(const kvf_master_t *m, const kvf_mnode_t *n)
{
    const kvf_mnode_t *x;
    uint64_t free_b = 0;

    for (x = m->nodes; x != NULL; x = x->next) {
        if (x == n || kvf_m_same_host(x, n)) {
            free_b += x->pa.len - x->pa.used;
        }
    }
    return free_b;
}

/* Orders the candidates: the host with the most free space first, within
 * a host the node with the most free space first. */
void kvf_m_place_order(const kvf_master_t *m, kvf_mnode_t **cand, size_t ncand)
{
    uint64_t hfree[64], hf;
    kvf_mnode_t *t;
    size_t i, j;

    for (i = 0; i < ncand; i++) {
        hfree[i] = kvf_m_host_free(m, cand[i]);
    }
    for (i = 1; i < ncand; i++) {
        for (j = i; j > 0; j--) {
            if (hfree[j - 1] > hfree[j] ||
                (hfree[j - 1] == hfree[j] &&
                 cand[j - 1]->pa.len - cand[j - 1]->pa.used >=
                     cand[j]->pa.len - cand[j]->pa.used)) {
                break;
            }
            t = cand[j];
            cand[j] = cand[j - 1];
            cand[j - 1] = t;
            hf = hfree[j];
            hfree[j] = hfree[j - 1];
            hfree[j - 1] = hf;
        }
    }
}

/* Is a replica of o already on n's host? */
static int kvf_m_host_taken(const kvf_mobj_t *o, const kvf_mnode_t *n)
{
    unsigned i;

    for (i = 0; i < o->nrep; i++) {
        if (kvf_m_same_host(o->rep[i].node, n)) {
            return 1;
        }
    }
    return 0;
}

/* Takes space for o's replicas from the ordered candidates: first on
 * hosts without a replica of o (without evicting, then evicting), then
 * on any node left (likewise). A reservation never evicts. */
void kvf_m_place(kvf_master_t *m, kvf_mobj_t *o, kvf_mnode_t **cand,
                 size_t ncand, uint64_t size, unsigned replicas, int may_evict,
                 uint64_t now)
{
    kvf_pa_block_t *b;
    int pass, evict, spread;
    size_t i;

    for (pass = 0; pass < 4 && o->nrep < replicas; pass++) {
        spread = pass < 2;
        evict = pass & 1;
        if (evict && !may_evict) {
            continue;
        }
        for (i = 0; i < ncand && o->nrep < replicas; i++) {
            if (cand[i] == NULL || (spread && kvf_m_host_taken(o, cand[i]))) {
                continue;
            }
            b = kvf_m_alloc_on(m, cand[i], size, evict, now);
            if (b != NULL) {
                o->rep[o->nrep] = (kvf_mrep_t){.node = cand[i], .blk = b};
                o->nrep++;
                cand[i] = NULL;
            }
        }
    }
}
