/*
 * Cluster authentication: the shared secret (config key `secret_file`, or
 * one created at $HOME/.kvferry/secret when every address is loopback),
 * the mutual challenge-response that every connection which can read or
 * change data runs right after connect/accept (core/handshake.c), the
 * session key it derives for the connection's frame tags (core/wire.h),
 * and the MACs of records kvferry keeps in etcd. The exchange is four
 * fixed-size messages:
 *
 *   client -> server  HELLO      nonce_c, H(name), flags
 *   server -> client  CHALLENGE  nonce_s, MAC("server", transcript), flags
 *   client -> server  PROOF      MAC("client", transcript)
 *   server -> client  RESULT     flags bit 0: accepted
 *
 * name is the endpoint the client reached, as its socket sees it (the
 * peer address of a tcp connection, the name of a unix socket); the
 * server accepts it only when it is its own (the local address of the
 * accepted socket, or one of `auth_names`), so a relay that forwards
 * the messages between a client and a server it connected to itself
 * fails: the client reached the relay, not the server. The transcript
 * is the protocol name, both nonces, H(name) and both messages' flags;
 * roles keep a MAC from being reflected. Both sides then derive one
 * key per direction (HKDF-SHA256 over the secret, the nonces and the
 * transcript) that tags every later frame of the connection.
 * Comparisons are constant time. A blocking form serves
 * thread-per-connection servers and clients; a non-blocking step
 * function serves the master's event loop. With `insecure=1` and no
 * secret file, authentication is off (both sides must agree).
 */
#ifndef KVF_CORE_AUTH_H
#define KVF_CORE_AUTH_H
#if !defined(KVF_INTERNAL) && !defined(KVF_TEST_INTERNALS)
#error "core/auth.h is internal to kvferry: use <kvferry/*.h>"
#endif

#include <kvferry/auth.h>
#include "core/config.h"
#include "core/wire.h"

#include <kvferry/status.h>

#include <stddef.h>
#include <stdint.h>

#define KVF_AUTH_MAGIC     0x4146564bu /* "KVFA" */
#define KVF_AUTH_VERSION   2
#define KVF_AUTH_NONCE_LEN 32
#define KVF_AUTH_MAC_LEN   32
#define KVF_AUTH_MSG_LEN   (8 + KVF_AUTH_NONCE_LEN + KVF_AUTH_MAC_LEN)
#define KVF_AUTH_TOKEN_LEN KVF_HTTP_TOKEN_LEN /* hex, without NUL */
_Static_assert(KVF_HTTP_TOKEN_LEN == 2 * KVF_AUTH_MAC_LEN,
               "token is hex of a MAC");
#define KVF_AUTH_SECRET_MIN 32
#define KVF_AUTH_SECRET_MAX 4096

/* Message types of the exchange. */
enum {
    KVF_AUTH_HELLO = 1,
    KVF_AUTH_CHALLENGE = 2,
    KVF_AUTH_PROOF = 3,
    KVF_AUTH_RESULT = 4
};

#define KVF_AUTH_F_ACCEPTED 1u /* RESULT */
#define KVF_AUTH_F_PAYLOAD  2u /* HELLO, CHALLENGE: tag payloads too */
#define KVF_AUTH_F_NAME     4u /* CHALLENGE without a MAC: the server
                                  refuses the name the client reached */

typedef struct kvf_auth_msg {
    uint8_t type;
    uint16_t flags;
    unsigned char nonce[KVF_AUTH_NONCE_LEN]; /* zero where unused */
    unsigned char mac[KVF_AUTH_MAC_LEN];     /* HELLO: H(name); else the
                                                MAC; zero where unused */
} kvf_auth_msg_t;

/* Keys `secret_file`, `insecure`, `auth_names`, `auth_payload_mac`. */
extern const kvf_config_table_t kvf_auth_config;

void kvf_auth_msg_enc(const kvf_auth_msg_t *m,
                      unsigned char out[KVF_AUTH_MSG_LEN]);
/* KVF_ERR_PROTOCOL on a wrong length, magic or type; KVF_ERR_VERSION on
 * another version. */
kvf_status_t kvf_auth_msg_dec(const void *in, size_t len, kvf_auth_msg_t *m_p);

/* Whether host is a loopback address ("localhost", 127/8, ::1). NULL
 * stands for a local (unix) socket: loopback. */
int kvf_auth_is_loopback(const char *host);

/* Decides whether connections bound to or made to host authenticate:
 * loads the secret (or creates the automatic one for a loopback host).
 * *on_p = 0 when auth is off (insecure=1 and no secret_file). Fails with
 * KVF_ERR_AUTH and one error line when no usable secret exists. */
kvf_status_t kvf_auth_prepare(const char *host, int *on_p);

/* Reads a private file (a secret, a password): opened without following
 * a symbolic link, it must be a regular file owned by this process's
 * user with no group or other permission bits, of min to max bytes;
 * otherwise KVF_ERR_AUTH and one error line naming the file, what is
 * wrong and the fix. buf holds max bytes; *len_p gets the size. The _at
 * form opens name relative to the directory dfd (shown is the path for
 * the log). */
kvf_status_t kvf_auth_read_private(const char *path, void *buf, size_t min,
                                   size_t max, size_t *len_p);
kvf_status_t kvf_auth_read_private_at(int dfd, const char *name,
                                      const char *shown, void *buf, size_t min,
                                      size_t max, size_t *len_p);

/* For a server about to listen on host: refuses (KVF_ERR_AUTH, one error
 * line) a non-loopback address without a secret unless insecure=1, in
 * which case it warns. Also loads the secret. */
kvf_status_t kvf_auth_check_bind(const char *host);

/* Blocking exchange on a connected socket, bounded by deadline_ms. host
 * is the address bound or dialled (decides the secret, see prepare);
 * proto names the protocol ("tcp", "shm", "store", "ucx"); peer is for
 * the log. On success *mac_p (may be NULL: the caller sends no frames)
 * holds the connection's frame tag keys, off when authentication is
 * off; the caller frees it (kvf_wire_mac_free) with the connection.
 * The client logs and returns KVF_ERR_AUTH when the peer does not prove
 * the secret or refuses ours (it sends no PROOF to a server that did
 * not prove the secret); the server logs one rate-limited line and
 * returns KVF_ERR_AUTH (the caller closes). */
kvf_status_t kvf_auth_client(int fd, const char *host, const char *proto,
                             const char *peer, uint64_t deadline_ms,
                             kvf_wire_mac_t *mac_p);
kvf_status_t kvf_auth_server(int fd, const char *host, const char *proto,
                             const char *peer, uint64_t deadline_ms,
                             kvf_wire_mac_t *mac_p);

/* kvf_sock_connect, then kvf_auth_client within the same timeout. */
kvf_status_t kvf_auth_connect(const char *host, uint16_t port, int timeout_ms,
                              const char *proto, int *fd_p,
                              kvf_wire_mac_t *mac_p);

/* Non-blocking server side for an event loop. */
typedef struct kvf_auth_srv {
    int state;
    int on;
    int payload;     /* this server asks for payload tags */
    uint16_t hflags; /* HELLO's flags */
    size_t off;
    const char *proto;
    unsigned char buf[KVF_AUTH_MSG_LEN];
    unsigned char nc[KVF_AUTH_NONCE_LEN];
    unsigned char ns[KVF_AUTH_NONCE_LEN];
    unsigned char name[KVF_AUTH_MAC_LEN]; /* H(name) the client sent */
} kvf_auth_srv_t;

/* Prepares the exchange for a connection accepted on host. */
kvf_status_t kvf_auth_srv_init(kvf_auth_srv_t *a, const char *host,
                               const char *proto);
/* Advances the exchange on a non-blocking fd: KVF_OK when the peer is
 * authenticated, KVF_INPROGRESS with *events_p (POLLIN or POLLOUT) to
 * wait for, or an error (close the connection; logged rate-limited). */
kvf_status_t kvf_auth_srv_step(kvf_auth_srv_t *a, int fd, const char *peer,
                               uint32_t *events_p);
/* After kvf_auth_srv_step returned KVF_OK: the connection's frame tag
 * keys into *mac_p (off when authentication is off). */
kvf_status_t kvf_auth_srv_mac(const kvf_auth_srv_t *a, kvf_wire_mac_t *mac_p);
/* Whether the exchange has received anything yet (a peer that closes
 * before its first byte only probed the port). */
static inline int kvf_auth_srv_started(const kvf_auth_srv_t *a)
{
    return a->state != 0 || a->off > 0;
}

/* H(name) of a socket's endpoint: the peer's (peer = 1, what a client
 * reached) or its own (peer = 0, what a server was reached at). -1 when
 * the socket has no such address. */
int kvf_auth_sock_name(int fd, int peer, unsigned char out[KVF_AUTH_MAC_LEN]);

/* Internal to core (handshake.c): HMAC-SHA256 under the loaded secret,
 * and HKDF-SHA256 with the secret as input key. */
void kvf_auth_hmac(const void *in, size_t len,
                   unsigned char out[KVF_AUTH_MAC_LEN]);
kvf_status_t kvf_auth_hkdf(const void *salt, size_t saltlen, const void *info,
                           size_t infolen, unsigned char *out, size_t outlen);

/* kvf_auth_http_token (public, <kvferry/auth.h>): the HTTP bearer
 * token, hex HMAC-SHA256(secret, "kvferry-http-v1"). */

/* A token for one purpose: hex HMAC-SHA256(secret, label) into out (at
 * least KVF_AUTH_TOKEN_LEN + 1 bytes), empty when auth is off for host;
 * distinct labels give unrelated tokens, so holding one reveals no
 * other. Errors as kvf_auth_http_token. */
kvf_status_t kvf_auth_token(const char *host, const char *label, char *out,
                            size_t outlen);

/* "ip:port" of the peer of fd, or "local" for a unix socket. */
void kvf_auth_peer_name(int fd, char *out, size_t outlen);

/* Fills buf with cryptographically random bytes. */
kvf_status_t kvf_auth_random(void *buf, size_t len);

/* Whether an HTTP Authorization header value equals want (both
 * NUL-terminated; constant time in the length of want). */
int kvf_auth_bearer_ok(const char *got, const char *want);

/* Records kvferry keeps in etcd (the master leader key, segment
 * descriptors): a MAC under a key derived from the secret (label
 * "kvferry-etcd-v1") over the etcd key name and the value, so a value
 * written by someone without the secret, or moved from another key, is
 * refused. host decides the secret as for prepare (the etcd endpoint).
 * *on_p = 0 (and no MAC) when authentication is off. */
kvf_status_t kvf_auth_record_mac(const char *host, const char *key,
                                 const void *val, size_t len,
                                 unsigned char out[KVF_AUTH_MAC_LEN],
                                 int *on_p);
/* KVF_OK when mac is the record's MAC (or authentication is off);
 * KVF_ERR_AUTH, with one error line naming key, otherwise. */
kvf_status_t kvf_auth_record_check(const char *host, const char *key,
                                   const void *val, size_t len,
                                   const unsigned char mac[KVF_AUTH_MAC_LEN]);

/* Forgets the loaded secret (tests that switch secret files). */
void kvf_auth_reset(void);

#endif
