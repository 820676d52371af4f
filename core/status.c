/*
 * Status code strings: one table maps every kvf_status_t to its symbolic
 * name and a lowercase description.
 */
#include <kvferry/status.h>

#include <stddef.h>

typedef struct {
    kvf_status_t status;
    const char *name;
    const char *text;
} kvf_status_entry_t;

static const kvf_status_entry_t kvf_status_table[] = {
    {KVF_OK, "KVF_OK", "success"},
    {KVF_INPROGRESS, "KVF_INPROGRESS", "operation in progress"},
    {KVF_ERR_INVALID_PARAM, "KVF_ERR_INVALID_PARAM", "invalid parameter"},
    {KVF_ERR_NO_MEMORY, "KVF_ERR_NO_MEMORY", "out of memory"},
    {KVF_ERR_NO_RESOURCE, "KVF_ERR_NO_RESOURCE", "resource exhausted"},
    {KVF_ERR_UNSUPPORTED, "KVF_ERR_UNSUPPORTED", "operation not supported"},
    {KVF_ERR_BUSY, "KVF_ERR_BUSY", "resource busy"},
    {KVF_ERR_TIMEOUT, "KVF_ERR_TIMEOUT", "timed out"},
    {KVF_ERR_CANCELED, "KVF_ERR_CANCELED", "canceled"},
    {KVF_ERR_IO, "KVF_ERR_IO", "input/output error"},
    {KVF_ERR_NOT_FOUND, "KVF_ERR_NOT_FOUND", "not found"},
    {KVF_ERR_EXISTS, "KVF_ERR_EXISTS", "already exists"},
    {KVF_ERR_UNAVAILABLE, "KVF_ERR_UNAVAILABLE", "feature unavailable"},
    {KVF_ERR_INTERNAL, "KVF_ERR_INTERNAL", "internal error"},
    {KVF_ERR_CONNECT, "KVF_ERR_CONNECT", "connection failed"},
    {KVF_ERR_CONN_RESET, "KVF_ERR_CONN_RESET", "connection reset"},
    {KVF_ERR_PROTOCOL, "KVF_ERR_PROTOCOL", "protocol error"},
    {KVF_ERR_VERSION, "KVF_ERR_VERSION", "unsupported protocol version"},
    {KVF_ERR_MSG_TOO_LARGE, "KVF_ERR_MSG_TOO_LARGE", "message too large"},
    {KVF_ERR_PEER_UNREACHABLE, "KVF_ERR_PEER_UNREACHABLE", "peer unreachable"},
    {KVF_ERR_OUT_OF_BOUNDS, "KVF_ERR_OUT_OF_BOUNDS",
     "address outside registered memory"},
    {KVF_ERR_NOT_REGISTERED, "KVF_ERR_NOT_REGISTERED", "memory not registered"},
    {KVF_ERR_PEER_CLOSED, "KVF_ERR_PEER_CLOSED", "peer closed"},
    {KVF_ERR_NO_TRANSPORT, "KVF_ERR_NO_TRANSPORT",
     "no transport reaches the peer"},
    {KVF_ERR_AUTH, "KVF_ERR_AUTH",
     "authentication failed (cluster secret missing or not the same)"},
    {KVF_ERR_PEER_CREDS, "KVF_ERR_PEER_CREDS",
     "local peer's user or group not allowed (shm_allow_uid, shm_allow_gid)"},
    {KVF_ERR_UNSAFE_MEMORY, "KVF_ERR_UNSAFE_MEMORY",
     "shared memory refused: not sealed or smaller than announced"},
    {KVF_ERR_NO_KEY, "KVF_ERR_NO_KEY", "no such key"},
    {KVF_ERR_KEY_TOO_LARGE, "KVF_ERR_KEY_TOO_LARGE", "key too large"},
    {KVF_ERR_NO_SPACE, "KVF_ERR_NO_SPACE", "no space left"},
    {KVF_ERR_LEASED, "KVF_ERR_LEASED", "object is leased"},
    {KVF_ERR_NOT_READY, "KVF_ERR_NOT_READY", "object not committed"},
    {KVF_ERR_STALE, "KVF_ERR_STALE", "stale location"},
    {KVF_ERR_QUOTA, "KVF_ERR_QUOTA",
     "over a per-client or per-request limit of the store"},
    {KVF_ERR_NOT_LEADER, "KVF_ERR_NOT_LEADER",
     "this master is not the leader (a standby or a deposed leader)"},
    {KVF_ERR_CHECKSUM, "KVF_ERR_CHECKSUM", "checksum mismatch"},
    {KVF_ERR_SHORT_DATA, "KVF_ERR_SHORT_DATA", "short data"},
};

static const kvf_status_entry_t *kvf_status_find(kvf_status_t status)
{
    size_t i;

    for (i = 0; i < sizeof(kvf_status_table) / sizeof(kvf_status_table[0]);
         i++) {
        if (kvf_status_table[i].status == status) {
            return &kvf_status_table[i];
        }
    }
    return NULL;
}

const char *kvf_status_str(kvf_status_t status)
{
    const kvf_status_entry_t *e = kvf_status_find(status);

    return (e != NULL) ? e->text : "unknown status";
}

const char *kvf_status_name(kvf_status_t status)
{
    const kvf_status_entry_t *e = kvf_status_find(status);

    return (e != NULL) ? e->name : "KVF_ERR_UNKNOWN";
}
