/*
 * libFuzzer target: the engine's segment descriptor parser
 * (engine/segment.c), which reads what a peer sends in answer to HELLO.
 * Any input must decode or fail with a status, never read past the end,
 * and leave nothing allocated after release.
 */
#include "engine/engine_int.h"
#include "core/log.h"

#include <stdint.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kvf_seg_desc_t desc;
    kvf_status_t st;
    uint32_t i;

    kvf_log_set_level((kvf_log_level_t)-1);
    st = kvf_seg_desc_decode(data, size, &desc);
    if (st == KVF_OK) {
        if (desc.ntl > KVF_ENGINE_TL_MAX ||
            (desc.nregions > 0 && desc.regions == NULL)) {
            abort();
        }
        for (i = 0; i < desc.nregions; i++) {
            if (desc.regions[i].ipc && desc.regions[i].type != KVF_MEM_CUDA) {
                abort();
            }
        }
    }
    kvf_seg_desc_release(&desc);
    return 0;
}
