/*
 * kvferry status codes.
 *
 * KVF_OK is zero, KVF_INPROGRESS is positive, every error is negative and
 * grouped in ranges: generic (-1..-19), link (-20..-39), peer/node
 * (-40..-59), metadata/master (-60..-79), data integrity (-80..-99).
 */
#ifndef KVFERRY_STATUS_H
#define KVFERRY_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

#ifndef KVF_API
#define KVF_API __attribute__((visibility("default")))
#endif

typedef enum kvf_status {
    KVF_OK = 0,
    KVF_INPROGRESS = 1,

    /* generic */
    KVF_ERR_INVALID_PARAM = -1,
    KVF_ERR_NO_MEMORY = -2,
    KVF_ERR_NO_RESOURCE = -3,
    KVF_ERR_UNSUPPORTED = -4,
    KVF_ERR_BUSY = -5,
    KVF_ERR_TIMEOUT = -6,
    KVF_ERR_CANCELED = -7,
    KVF_ERR_IO = -8,
    KVF_ERR_NOT_FOUND = -9,
    KVF_ERR_EXISTS = -10,
    KVF_ERR_UNAVAILABLE = -11,
    KVF_ERR_INTERNAL = -12,

    /* link */
    KVF_ERR_CONNECT = -20,
    KVF_ERR_CONN_RESET = -21,
    KVF_ERR_PROTOCOL = -22,
    KVF_ERR_VERSION = -23,
    KVF_ERR_MSG_TOO_LARGE = -24,

    /* peer / node */
    KVF_ERR_PEER_UNREACHABLE = -40,
    KVF_ERR_OUT_OF_BOUNDS = -41,
    KVF_ERR_NOT_REGISTERED = -42,
    KVF_ERR_PEER_CLOSED = -43,
    KVF_ERR_NO_TRANSPORT = -44,
    KVF_ERR_AUTH = -45,
    KVF_ERR_PEER_CREDS = -47,    /* local peer's uid/gid not allowed */
    KVF_ERR_UNSAFE_MEMORY = -48, /* shared memory unsealed or too small */

    /* metadata / master */
    KVF_ERR_NO_KEY = -60,
    KVF_ERR_KEY_TOO_LARGE = -61,
    KVF_ERR_NO_SPACE = -62,
    KVF_ERR_LEASED = -63,
    KVF_ERR_NOT_READY = -64,
    KVF_ERR_STALE = -65,
    KVF_ERR_QUOTA = -66,      /* over a per-client or per-request limit */
    KVF_ERR_NOT_LEADER = -67, /* a standby master: ask the leader */

    /* data integrity */
    KVF_ERR_CHECKSUM = -80,
    KVF_ERR_SHORT_DATA = -81,

    KVF_ERR_LAST = -100
} kvf_status_t;

/* Returns a static, lowercase description of a status code. */
KVF_API const char *kvf_status_str(kvf_status_t status);

/* Returns the symbolic name ("KVF_ERR_TIMEOUT") of a status code. */
KVF_API const char *kvf_status_name(kvf_status_t status);

#ifdef __cplusplus
}
#endif

#endif
