/*
 * The master's side of the nodes' disk tiers (store/node/tier.h). A node
 * with a tier announces its size at registration; the master keeps an
 * allocator of the tier's file next to the pool's (4 KiB units, so every
 * place is aligned for O_DIRECT) and decides, as for the pool, what goes
 * where. The node only executes (TIER_OP batches on a channel of their
 * own, inventory.c).
 *
 *  - Write-through: a committed object is copied to the tier of each of
 *    its nodes, in the background (a WRITE nobody waits for); while the
 *    copy runs the object stays in the pool. At most tier_write_max
 *    bytes are in flight per node; past that an object stays in memory
 *    only, and is copied when it reaches the cold end of the pool.
 *  - Eviction order memory -> disk -> gone: an object evicted from the
 *    pool with a copy on disk keeps that copy (its pool blocks go; it
 *    moves to the disk LRU list, kvf_master.dlru); without one it goes.
 *    When a tier's file is full, the coldest disk-only objects on that
 *    node go for good, then the disk copies of objects still in a pool.
 *  - A get of an object on disk only is served by a worker thread (the
 *    event loop hands the frame over, kvf_m_tier_wanted): it takes pool
 *    space on a node holding a copy (evicting as for a put), asks the
 *    node to READ the object into it (the node checks the checksum), and
 *    answers once the bytes are in; the object is then back in the pool
 *    at the hot end of the LRU list (tier_promote=1) or at its cold end
 *    (0: read through, first to go again).
 *  - A tier that fails or fills (the node answers KVF_ERR_UNAVAILABLE or
 *    KVF_ERR_IO) is turned off: its copies are forgotten, objects left
 *    without any replica are lost; the node's pool serves on. A READ
 *    whose bytes fail their checksum drops that copy (a miss, counted).
 * Everything here runs with the master's lock held.
 */
#include "store/master/master_int.h"
#include "core/alloc.h"
#include "core/log.h"
#include "core/time.h"

#include <string.h>

#define KVF_TIER_UNIT 4096u
/* a node's bound on one tier request (store/node/tier_int.h) */
#define KVF_M_TIER_IO_MS 30000

static uint64_t kvf_mt_round(uint64_t size)
{
    return (size + KVF_TIER_UNIT - 1) & ~(uint64_t)(KVF_TIER_UNIT - 1);
}

kvf_status_t kvf_m_tier_node_init(kvf_master_t *m, kvf_mnode_t *n,
                                  uint64_t disk_len, const char *inv_addr)
{
    kvf_status_t st;

    (void)m;
    disk_len &= ~(uint64_t)(KVF_TIER_UNIT - 1);
    if (disk_len == 0) {
        return KVF_OK;
    }
    if (inv_addr[0] == '\0') {
        kvf_log_rl(KVF_LOG_WARN, "node %s announces a disk tier without a "
                                 "server: tier ignored",
                   n->segment);
        return KVF_OK;
    }
    st = kvf_pa_init(&n->dpa, disk_len);
    if (st == KVF_OK) {
        n->tier_on = 1;
    }
    return st;
}

int kvf_m_tier_usable(const kvf_mobj_t *o)
{
    unsigned i;

    for (i = 0; i < o->nrep; i++) {
        if (o->rep[i].blk != NULL && !o->rep[i].loading) {
            return 1;
        }
    }
    return 0;
}

int kvf_m_tier_uncopied(const kvf_mobj_t *o)
{
    unsigned i, tier = 0;

    for (i = 0; i < o->nrep; i++) {
        if (o->rep[i].dstate == KVF_D_STORED && o->rep[i].node->tier_on) {
            return 0;
        }
        tier |= o->rep[i].node->tier_on;
    }
    return tier;
}

static int kvf_mt_loading(const kvf_mobj_t *o)
{
    unsigned i;

    for (i = 0; i < o->nrep; i++) {
        if (o->rep[i].loading) {
            return 1;
        }
    }
    return 0;
}

void kvf_m_tier_relist(kvf_master_t *m, kvf_mobj_t *o)
{
    int in_pool = kvf_m_tier_usable(o) || kvf_mt_loading(o);

    if (o->state != KVF_OBJ_COMMITTED || o->released || o->shadow ||
        o->lnext == NULL) {
        return;
    }
    if (!in_pool && !o->on_disk_list) {
        kvf_m_list_unlink(o);
        kvf_m_list_push(&m->dlru, o);
        o->on_disk_list = 1;
        m->ndisk_only++;
    } else if (in_pool && o->on_disk_list) {
        kvf_m_obj_unlist(m, o);
        kvf_m_list_push(&m->lru, o);
    }
}

/* Frees replica i's disk copy; DROP: tell the node to forget it (it is
 * queued behind any operation on the same place, so the node applies
 * them in order). */
static void kvf_mt_free_disk(kvf_master_t *m, kvf_mobj_t *o, unsigned i,
                             int drop)
{
    kvf_mrep_t *r = &o->rep[i];

    if (r->dblk == NULL) {
        return;
    }
    if (drop && r->node->tier_on) {
        (void)kvf_m_inv_tier(m, o, i, KVF_TIER_DROP, 0);
    }
    if (r->dstate == KVF_D_WRITING && r->node->tier_writing >= o->size) {
        r->node->tier_writing -= o->size;
    }
    kvf_pa_free(&r->node->dpa, r->dblk);
    r->dblk = NULL;
    r->dstate = KVF_D_NONE;
}

/* Drops replica i (neither pool nor disk left); the array stays dense. */
static void kvf_mt_rep_remove(kvf_mobj_t *o, unsigned i)
{
    memmove(&o->rep[i], &o->rep[i + 1], (o->nrep - i - 1) * sizeof(o->rep[0]));
    o->nrep--;
}

void kvf_m_tier_forget(kvf_master_t *m, kvf_mobj_t *o)
{
    unsigned i;

    for (i = 0; i < o->nrep; i++) {
        kvf_mt_free_disk(m, o, i, 1);
    }
}

/* Space for size bytes in n's tier: the coldest disk-only objects on n
 * go for good, then the disk copies of objects still in a pool. NULL
 * when nothing more may go. */
static kvf_pa_block_t *kvf_mt_dalloc(kvf_master_t *m, kvf_mnode_t *n,
                                     uint64_t size)
{
    uint64_t need = kvf_mt_round(size), now = kvf_time_ms();
    kvf_pa_block_t *b = kvf_pa_alloc(&n->dpa, need);
    kvf_mobj_t *o, *prev;
    unsigned i;
    int pass;

    for (pass = 0; pass < 2 && b == NULL && need <= n->dpa.len; pass++) {
        kvf_mobj_t *list = pass == 0 ? &m->dlru : &m->lru;

        for (o = list->lprev; o != list && b == NULL; o = prev) {
            prev = o->lprev;
            if (o->tier_busy > 0 || o->lease_until_ms > now) {
                continue;
            }
            for (i = 0; i < o->nrep; i++) {
                if (o->rep[i].node == n && o->rep[i].dstate == KVF_D_STORED) {
                    break;
                }
            }
            if (i == o->nrep) {
                continue;
            }
            kvf_mt_free_disk(m, o, i, 1);
            if (o->rep[i].blk == NULL) {
                kvf_mt_rep_remove(o, i);
            }
            if (o->nrep == 0) {
                m->st.tier_evictions++;
                kvf_m_release(m, o, 0);
            }
            b = kvf_pa_alloc(&n->dpa, need);
        }
    }
    return b;
}

/* Starts the copy of replica i to its node's tier; 1 if started. */
static int kvf_mt_write(kvf_master_t *m, kvf_mobj_t *o, unsigned i)
{
    kvf_mrep_t *r = &o->rep[i];
    kvf_mnode_t *n = r->node;
    uint64_t cap = m->opts.tier_write_max;

    if (!n->tier_on || n->rebuilding || r->dblk != NULL || r->blk == NULL ||
        r->loading) {
        return 0;
    }
    if (cap > n->pa.len / 4) {
        cap = n->pa.len / 4; /* what may stay unevictable meanwhile */
    }
    if (n->tier_writing + o->size > cap) {
        return 0;
    }
    r->dblk = kvf_mt_dalloc(m, n, o->size);
    if (r->dblk == NULL) {
        return 0;
    }
    r->dstate = KVF_D_WRITING;
    if (kvf_m_inv_tier(m, o, i, KVF_TIER_WRITE, 0) != KVF_OK) {
        kvf_pa_free(&n->dpa, r->dblk);
        r->dblk = NULL;
        r->dstate = KVF_D_NONE;
        return 0;
    }
    n->tier_writing += o->size;
    return 1;
}

void kvf_m_tier_commit(kvf_master_t *m, kvf_mobj_t *o)
{
    unsigned i;

    for (i = 0; i < o->nrep; i++) {
        (void)kvf_mt_write(m, o, i);
    }
}

/* The pool blocks of o (stored on disk) are released: at once, or, where
 * nodes keep inventories, once they forgot them (a shadow object holds
 * the blocks until then, as a removed object does). */
static void kvf_mt_free_pool(kvf_master_t *m, kvf_mobj_t *o)
{
    kvf_mobj_t *sh = NULL;
    unsigned i;

    if (m->elect != NULL && o->inv_epoch != 0 &&
        (sh = kvf_calloc(1, sizeof(*sh))) != NULL &&
        (sh->key = kvf_strdup(o->key)) == NULL) {
        kvf_free(sh);
        sh = NULL;
    }
    for (i = 0; i < o->nrep; i++) {
        if (o->rep[i].blk == NULL) {
            continue;
        }
        if (sh != NULL) {
            sh->rep[sh->nrep++] =
                (kvf_mrep_t){.node = o->rep[i].node, .blk = o->rep[i].blk};
        } else {
            kvf_pa_free(&o->rep[i].node->pa, o->rep[i].blk);
        }
        o->rep[i].blk = NULL;
    }
    if (sh != NULL) {
        sh->shadow = 1;
        sh->state = KVF_OBJ_COMMITTED;
        sh->size = o->size;
        sh->inv_epoch = o->inv_epoch;
        sh->inv_seq = o->inv_seq;
        kvf_m_release(m, sh, 0);
    }
}

int kvf_m_tier_demote(kvf_master_t *m, kvf_mobj_t *o)
{
    unsigned i, stored = 0;

    for (i = 0; i < o->nrep; i++) {
        stored += o->rep[i].dstate == KVF_D_STORED && o->rep[i].node->tier_on;
    }
    if (stored == 0) {
        /* a copy may still be made (write-through was skipped) */
        for (i = 0; i < o->nrep; i++) {
            if (kvf_mt_write(m, o, i)) {
                return 1; /* stays in the pool until the copy is done */
            }
        }
        return 0;
    }
    kvf_mt_free_pool(m, o);
    for (i = o->nrep; i-- > 0;) {
        if (o->rep[i].dstate != KVF_D_STORED || !o->rep[i].node->tier_on) {
            kvf_mt_free_disk(m, o, i, 1);
            kvf_mt_rep_remove(o, i);
        }
    }
    m->st.tier_demotions++;
    kvf_m_tier_relist(m, o);
    return 1;
}

/* Starts loading o (on disk only) into a pool; 1 if a load is under way
 * (started now or by someone else), 0 if none can be. */
static int kvf_mt_load(kvf_master_t *m, kvf_mobj_t *o)
{
    kvf_pa_block_t *b;
    kvf_mrep_t *r;
    unsigned i;

    if (kvf_mt_loading(o)) {
        return 1;
    }
    for (i = 0; i < o->nrep; i++) {
        r = &o->rep[i];
        if (r->dstate != KVF_D_STORED || !r->node->tier_on ||
            r->node->rebuilding || r->blk != NULL) {
            continue;
        }
        b = kvf_m_alloc_on(m, r->node, o->size, 1, kvf_time_ms());
        if (b == NULL) {
            continue;
        }
        r->blk = b;
        r->loading = 1;
        if (kvf_m_inv_tier(m, o, i, KVF_TIER_READ, 1) != KVF_OK) {
            kvf_pa_free(&r->node->pa, b);
            r->blk = NULL;
            r->loading = 0;
            continue;
        }
        return 1;
    }
    return 0;
}

int kvf_m_tier_wanted(kvf_master_t *m, const kvf_sp_frame_t *f)
{
    kvf_sm_req_t q;
    kvf_mobj_t *o;
    kvf_rd_t r;
    uint32_t i;
    int want = 0;

    if (m->ndisk_only == 0 || f->hdr.type != KVF_SP_GET ||
        kvf_sm_req_check(f->hdr.type, f->hdr.count, f->body,
                         f->hdr.meta_len) != KVF_OK) {
        return 0;
    }
    kvf_rd_init(&r, f->body, f->hdr.meta_len);
    pthread_mutex_lock(&m->lock);
    for (i = 0; i < f->hdr.count && !want; i++) {
        kvf_sm_key_dec(&r, &q);
        o = q.key_status == KVF_OK ? kvf_m_find(m, q.key) : NULL;
        want = o != NULL && o->state == KVF_OBJ_COMMITTED &&
               !kvf_m_tier_usable(o);
    }
    pthread_mutex_unlock(&m->lock);
    return want;
}

/* Is any key of the frame loading (started by this frame or another)? */
static int kvf_mt_any_loading(kvf_master_t *m, const kvf_sp_frame_t *f)
{
    kvf_sm_req_t q;
    kvf_mobj_t *o;
    kvf_rd_t r;
    uint32_t i;

    kvf_rd_init(&r, f->body, f->hdr.meta_len);
    for (i = 0; i < f->hdr.count; i++) {
        kvf_sm_key_dec(&r, &q);
        o = q.key_status == KVF_OK ? kvf_m_find(m, q.key) : NULL;
        if (o != NULL && kvf_mt_loading(o)) {
            return 1;
        }
    }
    return 0;
}

void kvf_m_tier_prefetch(kvf_master_t *m, const kvf_sp_frame_t *f)
{
    uint64_t deadline = kvf_time_ms() + m->opts.io_timeout_ms;
    struct timespec ts;
    kvf_sm_req_t q;
    kvf_mobj_t *o;
    kvf_rd_t r;
    uint32_t i;
    unsigned started = 0;

    if (!kvf_m_inv_in_worker()) {
        return; /* an event loop: kvf_m_tier_wanted sent it elsewhere */
    }
    kvf_rd_init(&r, f->body, f->hdr.meta_len);
    pthread_mutex_lock(&m->lock);
    for (i = 0; i < f->hdr.count; i++) {
        kvf_sm_key_dec(&r, &q);
        o = q.key_status == KVF_OK ? kvf_m_find(m, q.key) : NULL;
        if (o != NULL && o->state == KVF_OBJ_COMMITTED &&
            !kvf_m_tier_usable(o)) {
            started += kvf_mt_load(m, o);
        }
    }
    m->st.tier_load_waits += started > 0;
    kvf_m_inv_wait(m); /* this frame's READs */
    /* loads other frames started: wait for their end too */
    while (kvf_mt_any_loading(m, f) && kvf_time_ms() < deadline) {
        kvf_time_abs_after(&ts, 50);
        pthread_cond_timedwait(&m->tier_cond, &m->lock, &ts);
    }
    pthread_mutex_unlock(&m->lock);
}

/* An answer the node gave (it ran the operation, or refused it): else
 * the connection failed and the node may still run it. */
static int kvf_mt_definite(kvf_status_t st)
{
    return st == KVF_OK || st == KVF_ERR_CHECKSUM || st == KVF_ERR_IO ||
           st == KVF_ERR_OUT_OF_BOUNDS || st == KVF_ERR_UNSUPPORTED ||
           st == KVF_ERR_NO_MEMORY;
}

/* Replica of o on the node (uid, gen), or -1. */
static int kvf_mt_rep_of(const kvf_mobj_t *o, uint64_t uid, uint64_t gen)
{
    unsigned i;

    for (i = 0; i < o->nrep; i++) {
        if (o->rep[i].node->uid == uid && o->rep[i].node->gen == gen) {
            return (int)i;
        }
    }
    return -1;
}

void kvf_m_tier_off(kvf_master_t *m, kvf_mnode_t *n, kvf_status_t why)
{
    kvf_mobj_t *o, *next;
    size_t i, lost = 0;
    int k;

    if (!n->tier_on) {
        return;
    }
    n->tier_on = 0;
    for (i = 0; i < m->nbuckets; i++) {
        for (o = m->table[i]; o != NULL; o = next) {
            next = o->hnext;
            k = kvf_mt_rep_of(o, n->uid, n->gen);
            if (k < 0 || o->rep[k].dblk == NULL) {
                continue;
            }
            kvf_mt_free_disk(m, o, (unsigned)k, 0);
            if (o->rep[k].blk == NULL) {
                kvf_mt_rep_remove(o, (unsigned)k);
            }
            if (o->nrep == 0) {
                lost++;
                kvf_m_release(m, o, 0);
            }
        }
    }
    n->tier_writing = 0;
    m->st.objects_lost += lost;
    kvf_error("master: the disk tier of node %s is off (%s): its copies "
              "are forgotten, %zu object(s) lost; its pool serves on",
              n->segment, kvf_status_str(why), lost);
}

/* Room for writes on n again: copies of the objects that skipped their
 * write-through start, the coldest first (they leave the pool first);
 * the walk is bounded. */
static void kvf_mt_write_more(kvf_master_t *m, kvf_mnode_t *n)
{
    unsigned i, walked = 0;
    kvf_mobj_t *o;

    for (o = m->lru.lprev; o != &m->lru && walked < 1024; o = o->lprev) {
        walked++;
        if (!kvf_m_tier_uncopied(o)) {
            continue;
        }
        for (i = 0; i < o->nrep; i++) {
            if (o->rep[i].node == n && !kvf_mt_write(m, o, i) &&
                n->tier_writing > 0) {
                return; /* full again */
            }
        }
    }
}

/* A WRITE ended. */
static void kvf_mt_wrote(kvf_master_t *m, kvf_mobj_t *o, unsigned i,
                         kvf_status_t st)
{
    kvf_mrep_t *r = &o->rep[i];
    kvf_mnode_t *n = r->node;

    if (r->dstate != KVF_D_WRITING) {
        return; /* dropped meanwhile */
    }
    if (n->tier_writing >= o->size) {
        n->tier_writing -= o->size;
    }
    if (st == KVF_OK) {
        r->dstate = KVF_D_STORED;
        m->st.tier_writes++;
        m->st.tier_write_bytes += o->size;
        if (n->tier_on) {
            kvf_mt_write_more(m, n);
        }
        return;
    }
    kvf_pa_free(&n->dpa, r->dblk);
    r->dblk = NULL;
    r->dstate = KVF_D_NONE;
}

/* A pool block a node may still write into (a READ whose answer did not
 * come: the node may yet run it): kept off the allocator, as a removed
 * object's space, until the node's own bound on a request is well over. */
static void kvf_mt_quarantine(kvf_master_t *m, kvf_mnode_t *n,
                              kvf_pa_block_t *blk)
{
    kvf_mobj_t *sh = kvf_calloc(1, sizeof(*sh));

    if (sh == NULL) {
        return; /* the block stays taken for good: never reused */
    }
    sh->shadow = 1;
    sh->state = KVF_OBJ_COMMITTED;
    sh->nrep = 1;
    sh->rep[0] = (kvf_mrep_t){.node = n, .blk = blk};
    sh->lease_until_ms = kvf_time_ms() + 2 * KVF_M_TIER_IO_MS;
    kvf_m_release(m, sh, 0);
}

/* A READ ended: the replica serves from its pool block, or it is
 * dropped (the checksum failed: its disk copy too). */
static void kvf_mt_read(kvf_master_t *m, kvf_mobj_t *o, unsigned i,
                        kvf_status_t st)
{
    kvf_mrep_t *r = &o->rep[i];

    if (!r->loading) {
        return;
    }
    r->loading = 0;
    if (st == KVF_OK) {
        m->st.tier_reads++;
        m->st.tier_read_bytes += o->size;
        if (!o->released && o->on_disk_list) {
            kvf_m_obj_unlist(m, o);
            if (m->opts.tier_promote) {
                kvf_m_list_push(&m->lru, o);
            } else {
                kvf_m_list_push(m->lru.lprev, o); /* the cold end */
            }
        }
        return;
    }
    if (kvf_mt_definite(st)) {
        kvf_pa_free(&r->node->pa, r->blk);
    } else {
        kvf_mt_quarantine(m, r->node, r->blk);
    }
    r->blk = NULL;
    if (st == KVF_ERR_CHECKSUM) {
        m->st.tier_corrupt++;
        kvf_mt_free_disk(m, o, i, 0); /* the node dropped it already */
        kvf_mt_rep_remove(o, i);
    }
    if (o->nrep == 0 && !o->released) {
        kvf_m_release(m, o, 0); /* a miss from now on */
    }
}

void kvf_m_tier_answer(kvf_master_t *m, kvf_mobj_t *o, uint64_t uid,
                       uint64_t gen, uint8_t op, kvf_status_t st)
{
    int k = kvf_mt_rep_of(o, uid, gen);

    /* o->tier_busy still counts this operation: a release below keeps o
     * on the doomed list, freed at the end */
    if (st != KVF_OK && st != KVF_ERR_CHECKSUM) {
        m->st.tier_errors++;
    }
    if (k >= 0 && op == KVF_TIER_WRITE) {
        kvf_mt_wrote(m, o, (unsigned)k, st);
    } else if (k >= 0 && op == KVF_TIER_READ) {
        kvf_mt_read(m, o, (unsigned)k, st);
    }
    /* the node says its tier failed, or has none */
    k = kvf_mt_rep_of(o, uid, gen);
    if (k >= 0 && (st == KVF_ERR_IO || st == KVF_ERR_UNSUPPORTED)) {
        kvf_m_tier_off(m, o->rep[k].node, st);
    }
    if (op == KVF_TIER_READ) {
        pthread_cond_broadcast(&m->tier_cond);
    }
    if (o->tier_busy > 0) {
        o->tier_busy--;
    }
    if (o->released && kvf_m_doomed_done(o, kvf_time_ms())) {
        kvf_m_obj_free(m, o);
    }
}

kvf_status_t kvf_m_tier_rebuild(kvf_master_t *m, kvf_mnode_t *n,
                                const kvf_sm_inv_ent_t *e,
                                kvf_pa_block_t **hint)
{
    kvf_mobj_t *o = kvf_m_find(m, e->key);
    kvf_pa_block_t *b;
    int k = -1;

    if (!n->tier_on) {
        return KVF_ERR_UNSUPPORTED;
    }
    if (o != NULL) {
        k = kvf_mt_rep_of(o, n->uid, n->gen);
        if (o->state != KVF_OBJ_COMMITTED || o->size != e->size ||
            o->checksum != e->checksum ||
            (k < 0 && o->nrep >= KVF_STORE_REPLICA_MAX) ||
            (k >= 0 && o->rep[k].dblk != NULL)) {
            return (k >= 0 && o->rep[k].dblk != NULL &&
                    o->rep[k].dblk->off == e->off)
                       ? KVF_OK /* a report sent again */
                       : KVF_ERR_EXISTS;
        }
    }
    b = kvf_pa_alloc_at(&n->dpa, *hint, e->off, kvf_mt_round(e->size));
    if (b == NULL) {
        return KVF_ERR_EXISTS;
    }
    *hint = b;
    if (o == NULL) {
        o = kvf_m_rebuild_obj(m, e);
        if (o == NULL) {
            kvf_pa_free(&n->dpa, b);
            *hint = NULL;
            return KVF_ERR_NO_MEMORY;
        }
    }
    if (k < 0) {
        k = o->nrep++;
        o->rep[k] = (kvf_mrep_t){.node = n};
    }
    o->rep[k].dblk = b;
    o->rep[k].dstate = KVF_D_STORED;
    kvf_m_tier_relist(m, o);
    return KVF_OK;
}
