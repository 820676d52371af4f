/*
 * Cluster authentication: the shared secret (config key `secret_file`, or
 * one created at $HOME/.kvferry/secret when every address is loopback),
 * and the mutual HMAC-SHA256 challenge-response that every connection
 * which can read or change data runs right after connect/accept, before
 * any protocol message. Four fixed-size messages:
 *
 *   client -> server  HELLO      nonce_c
 *   server -> client  CHALLENGE  nonce_s, MAC("server", nonce_c, nonce_s)
 *   client -> server  PROOF      MAC("client", nonce_c, nonce_s)
 *   server -> client  RESULT     flags bit 0: accepted
 *
 * The MAC input is domain separated (exchange name, protocol name, role,
 * both nonces); comparisons are constant time. A blocking form serves
 * thread-per-connection servers and clients; a non-blocking step function
 * serves the master's event loop. With `insecure=1` and no secret file,
 * authentication is off (both sides must agree).
 */
#ifndef KVF_CORE_AUTH_H
#define KVF_CORE_AUTH_H
#if !defined(KVF_INTERNAL) && !defined(KVF_TEST_INTERNALS)
#error "core/auth.h is internal to kvferry: use <kvferry/*.h>"
#endif

#include <kvferry/auth.h>
#include "core/config.h"

#include <kvferry/status.h>

#include <stddef.h>
#include <stdint.h>

#define KVF_AUTH_MAGIC     0x4146564bu /* "KVFA" */
#define KVF_AUTH_VERSION   1
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

#define KVF_AUTH_F_ACCEPTED 1u

typedef struct kvf_auth_msg {
    uint8_t type;
    uint16_t flags;
    unsigned char nonce[KVF_AUTH_NONCE_LEN]; /* zero where unused */
    unsigned char mac[KVF_AUTH_MAC_LEN];     /* zero where unused */
} kvf_auth_msg_t;

/* Keys `secret_file` and `insecure` (user group). */
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

/* For a server about to listen on host: refuses (KVF_ERR_AUTH, one error
 * line) a non-loopback address without a secret unless insecure=1, in
 * which case it warns. Also loads the secret. */
kvf_status_t kvf_auth_check_bind(const char *host);

/* Blocking exchange on a connected socket, bounded by deadline_ms. host
 * is the address bound or dialled (decides the secret, see prepare);
 * proto names the protocol ("tcp", "shm", "store"); peer is for the log.
 * The client logs and returns KVF_ERR_AUTH when the peer does not prove
 * the secret or refuses ours; the server logs one rate-limited line and
 * returns KVF_ERR_AUTH (the caller closes). */
kvf_status_t kvf_auth_client(int fd, const char *host, const char *proto,
                             const char *peer, uint64_t deadline_ms);
kvf_status_t kvf_auth_server(int fd, const char *host, const char *proto,
                             const char *peer, uint64_t deadline_ms);

/* kvf_sock_connect, then kvf_auth_client within the same timeout. */
kvf_status_t kvf_auth_connect(const char *host, uint16_t port, int timeout_ms,
                              const char *proto, int *fd_p);

/* Non-blocking server side for an event loop. */
typedef struct kvf_auth_srv {
    int state;
    int on;
    size_t off;
    const char *proto;
    unsigned char buf[KVF_AUTH_MSG_LEN];
    unsigned char nc[KVF_AUTH_NONCE_LEN];
    unsigned char ns[KVF_AUTH_NONCE_LEN];
} kvf_auth_srv_t;

/* Prepares the exchange for a connection accepted on host. */
kvf_status_t kvf_auth_srv_init(kvf_auth_srv_t *a, const char *host,
                               const char *proto);
/* Advances the exchange on a non-blocking fd: KVF_OK when the peer is
 * authenticated, KVF_INPROGRESS with *events_p (POLLIN or POLLOUT) to
 * wait for, or an error (close the connection; logged rate-limited). */
kvf_status_t kvf_auth_srv_step(kvf_auth_srv_t *a, int fd, const char *peer,
                               uint32_t *events_p);

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

/* Forgets the loaded secret (tests that switch secret files). */
void kvf_auth_reset(void);

#endif
