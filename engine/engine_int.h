/*
 * Transfer engine, private: the engine, region, peer and batch structures
 * shared by the files of this folder.
 */
#ifndef KVF_ENGINE_INT_H
#define KVF_ENGINE_INT_H
#if !defined(KVF_LAYER_ENGINE) && !defined(KVF_TEST_INTERNALS)
#error "engine/engine_int.h is private to engine/: use <kvferry/engine.h>"
#endif

#include <kvferry/kvferry.h>
#include <kvferry/engine_perf.h>

#include "transport/transport.h"
#include "mem/mem.h"
#include "engine/meta.h"
#include "core/sock.h"

#include <pthread.h>

#define KVF_ENGINE_TL_MAX   8
#define KVF_SEG_NAME_MAX    272
#define KVF_DESC_REGION_MAX 65536
#define KVF_DESC_IPC_HANDLE KVF_MEM_IPC_HANDLE

/* struct kvf_region (a registered range) is the memory layer's
 * kvf_mem_region_t (mem/mem.h). */

typedef struct kvf_engine_tl {
    const kvf_transport_ops_t *ops;
    kvf_tl_iface_t *iface;
} kvf_engine_tl_t;

struct kvf_engine {
    kvf_tl_config_t cfg;
    char listen[KVF_SEG_NAME_MAX];
    char transports[128];
    char metadata[256];
    char name[KVF_SEG_NAME_MAX];
    pthread_rwlock_t regions_lock;
    unsigned regions_writers;    /* reg/dereg calls waiting for the lock */
    struct kvf_region **regions; /* sorted by addr, non-overlapping */
    size_t nregions;
    size_t regions_cap;
    kvf_engine_tl_t tl[KVF_ENGINE_TL_MAX];
    unsigned ntl;
    kvf_meta_t *meta;
    pthread_mutex_t peers_lock;
    struct kvf_peer *peers;
    unsigned batches_live; /* submitted, not yet destroyed (batch.c) */
};

struct kvf_peer {
    kvf_engine_h engine;
    char name[KVF_SEG_NAME_MAX];
    const kvf_transport_ops_t *ops;
    kvf_tl_ep_t *ep;
    uint32_t nregions;
    struct kvf_region *regions; /* from the descriptor, owned */
    struct kvf_peer *next;
};

/* Segment descriptor: what a target tells a peer about itself. */
typedef struct kvf_seg_desc {
    char name[KVF_SEG_NAME_MAX];
    char hostname[KVF_HOST_MAX];
    uint64_t host_id;
    uint32_t pid;
    unsigned ntl;
    struct {
        char name[32];
        char address[KVF_SEG_NAME_MAX];
    } tl[KVF_ENGINE_TL_MAX];
    uint32_t nregions;
    struct kvf_region *regions; /* owned, kvf_free */
} kvf_seg_desc_t;

kvf_status_t kvf_seg_desc_encode(kvf_engine_h engine, kvf_wr_t *w);
kvf_status_t kvf_seg_desc_decode(const void *buf, size_t len,
                                 kvf_seg_desc_t *desc);
void kvf_seg_desc_release(kvf_seg_desc_t *desc);
uint64_t kvf_seg_host_id(void);

/* Region lookup; caller holds regions_lock. NULL if [addr, addr+len) is
 * not inside one region. */
struct kvf_region *kvf_region_find(kvf_engine_h engine, uint64_t addr,
                                   uint64_t len);

#endif
