/*
 * Segment descriptors: encode this engine's (name, host identity, pid,
 * transports with their addresses, regions, CUDA IPC handles of its GPU
 * regions) and decode a peer's, with every length checked. The host
 * identity (boot id + network namespace) lets same-host transports know
 * they really share a kernel; the IPC handles let a same-host peer map
 * the GPU regions (transport/cuda_ipc/).
 *
 * Layout (version 2, little-endian): u32 version, str name, str
 * hostname, u64 host id, u32 pid, u16 ntl, ntl x (str name, str
 * address), u32 nregions, nregions x (u64 addr, u64 len, u8 type, u8
 * device), u32 nipc, nipc x (u32 region index, u64 offset in the
 * allocation, 64 bytes handle) — each index names a distinct
 * KVF_MEM_CUDA region, and nothing follows.
 */
#include "engine/engine_int.h"
#include "core/alloc.h"
#include "core/checksum.h"
#include "core/log.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define KVF_DESC_VERSION      2
#define KVF_DESC_REGION_BYTES 18
#define KVF_DESC_IPC_BYTES    (4 + 8 + KVF_DESC_IPC_HANDLE)

uint64_t kvf_seg_host_id(void)
{
    char boot[64] = "", buf[160];
    struct stat st;
    FILE *f;
    size_t n;

    f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f != NULL) {
        n = fread(boot, 1, sizeof(boot) - 1, f);
        boot[n] = '\0';
        fclose(f);
    }
    if (stat("/proc/self/ns/net", &st) != 0) {
        st.st_ino = 0;
    }
    n = (size_t)snprintf(buf, sizeof(buf), "%s/%lu", boot,
                         (unsigned long)st.st_ino);
    return kvf_hash64(buf, n, 0x6b7666);
}

kvf_status_t kvf_seg_desc_encode(kvf_engine_h engine, kvf_wr_t *w)
{
    char hostname[KVF_HOST_MAX] = "";
    uint32_t nipc = 0;
    unsigned i;
    size_t r;

    gethostname(hostname, sizeof(hostname) - 1);
    kvf_wr_u32(w, KVF_DESC_VERSION);
    kvf_wr_str(w, engine->name);
    kvf_wr_str(w, hostname);
    kvf_wr_u64(w, kvf_seg_host_id());
    kvf_wr_u32(w, (uint32_t)getpid());
    kvf_wr_u16(w, (uint16_t)engine->ntl);
    for (i = 0; i < engine->ntl; i++) {
        const char *addr =
            engine->tl[i].ops->iface_address(engine->tl[i].iface);

        kvf_wr_str(w, engine->tl[i].ops->name);
        kvf_wr_str(w, addr ? addr : "");
    }
    pthread_rwlock_rdlock(&engine->regions_lock);
    kvf_wr_u32(w, (uint32_t)engine->nregions);
    for (r = 0; r < engine->nregions; r++) {
        kvf_wr_u64(w, engine->regions[r]->addr);
        kvf_wr_u64(w, engine->regions[r]->len);
        kvf_wr_u8(w, (uint8_t)engine->regions[r]->type);
        kvf_wr_u8(w, (uint8_t)engine->regions[r]->device);
        nipc += (engine->regions[r]->ipc != 0);
    }
    kvf_wr_u32(w, nipc);
    for (r = 0; r < engine->nregions; r++) {
        if (engine->regions[r]->ipc) {
            kvf_wr_u32(w, (uint32_t)r);
            kvf_wr_u64(w, engine->regions[r]->ipc_off);
            kvf_wr_bytes(w, engine->regions[r]->ipc_handle,
                         KVF_DESC_IPC_HANDLE);
        }
    }
    pthread_rwlock_unlock(&engine->regions_lock);
    return kvf_wr_status(w);
}

kvf_status_t kvf_seg_desc_decode(const void *buf, size_t len,
                                 kvf_seg_desc_t *desc)
{
    const unsigned char *h;
    uint32_t version, i, nipc, idx;
    kvf_rd_t r;

    memset(desc, 0, sizeof(*desc));
    kvf_rd_init(&r, buf, len);
    version = kvf_rd_u32(&r);
    if (kvf_rd_status(&r) == KVF_OK && version != KVF_DESC_VERSION) {
        kvf_error("segment descriptor version %u, expected %u", version,
                  KVF_DESC_VERSION);
        return KVF_ERR_VERSION;
    }
    kvf_rd_str(&r, desc->name, sizeof(desc->name));
    kvf_rd_str(&r, desc->hostname, sizeof(desc->hostname));
    desc->host_id = kvf_rd_u64(&r);
    desc->pid = kvf_rd_u32(&r);
    desc->ntl = kvf_rd_u16(&r);
    if (desc->ntl > KVF_ENGINE_TL_MAX) {
        return KVF_ERR_PROTOCOL;
    }
    for (i = 0; i < desc->ntl; i++) {
        kvf_rd_str(&r, desc->tl[i].name, sizeof(desc->tl[i].name));
        kvf_rd_str(&r, desc->tl[i].address, sizeof(desc->tl[i].address));
    }
    desc->nregions = kvf_rd_u32(&r);
    if (kvf_rd_status(&r) != KVF_OK || desc->nregions > KVF_DESC_REGION_MAX ||
        (size_t)desc->nregions * KVF_DESC_REGION_BYTES + 4 > kvf_rd_left(&r)) {
        kvf_error("malformed segment descriptor (%zu bytes)", len);
        return KVF_ERR_PROTOCOL;
    }
    if (desc->nregions > 0) {
        desc->regions = kvf_calloc(desc->nregions, sizeof(*desc->regions));
        if (desc->regions == NULL) {
            return KVF_ERR_NO_MEMORY;
        }
    }
    for (i = 0; i < desc->nregions; i++) {
        desc->regions[i].addr = kvf_rd_u64(&r);
        desc->regions[i].len = kvf_rd_u64(&r);
        desc->regions[i].type = (kvf_mem_type_t)kvf_rd_u8(&r);
        desc->regions[i].device = kvf_rd_u8(&r);
    }
    nipc = kvf_rd_u32(&r);
    if (kvf_rd_status(&r) != KVF_OK || nipc > desc->nregions ||
        (size_t)nipc * KVF_DESC_IPC_BYTES != kvf_rd_left(&r)) {
        kvf_error("malformed segment descriptor (%zu bytes, %u IPC handles)",
                  len, nipc);
        return KVF_ERR_PROTOCOL;
    }
    for (i = 0; i < nipc; i++) {
        idx = kvf_rd_u32(&r);
        if (idx >= desc->nregions || desc->regions[idx].ipc ||
            desc->regions[idx].type != KVF_MEM_CUDA) {
            kvf_error("segment descriptor: bad IPC entry for region %u", idx);
            return KVF_ERR_PROTOCOL;
        }
        desc->regions[idx].ipc_off = kvf_rd_u64(&r);
        h = kvf_rd_bytes(&r, KVF_DESC_IPC_HANDLE);
        if (h == NULL) {
            return KVF_ERR_PROTOCOL;
        }
        memcpy(desc->regions[idx].ipc_handle, h, KVF_DESC_IPC_HANDLE);
        desc->regions[idx].ipc = 1;
    }
    return kvf_rd_status(&r);
}

void kvf_seg_desc_release(kvf_seg_desc_t *desc)
{
    kvf_free(desc->regions);
    desc->regions = NULL;
    desc->nregions = 0;
}
