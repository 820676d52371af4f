/*
 * libFuzzer target: the authentication exchange's message codec
 * (core/auth.c). The input is one message as it arrives. Whatever
 * decodes must be a known type and re-encode to the same bytes; the
 * server's non-blocking step is not fed here (it only moves these
 * fixed-size messages).
 */
#include "core/auth.h"
#include "core/log.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    unsigned char out[KVF_AUTH_MSG_LEN];
    kvf_auth_msg_t m;

    kvf_log_set_level(KVF_LOG_ERROR);
    if (kvf_auth_msg_dec(data, size, &m) != KVF_OK) {
        return 0;
    }
    if (size != KVF_AUTH_MSG_LEN || m.type < KVF_AUTH_HELLO ||
        m.type > KVF_AUTH_RESULT) {
        abort(); /* accepted a message of the wrong size or type */
    }
    kvf_auth_msg_enc(&m, out);
    if (memcmp(out, data, sizeof(out)) != 0) {
        abort();
    }
    return 0;
}
