/*
 * kvferry's cluster secret as seen by programs that talk to a master's
 * HTTP endpoint: the bearer token that /metrics and /status ask for.
 * Every kvferry connection authenticates itself with the cluster secret
 * (docs/security.md); this is the one piece a program needs to build an
 * HTTP request of its own.
 */
#ifndef KVFERRY_AUTH_H
#define KVFERRY_AUTH_H

#include <kvferry/status.h>

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bytes of a token, without the terminating NUL. */
#define KVF_HTTP_TOKEN_LEN 64

/* Writes the bearer token for a master reached at host (a name or an
 * address) into out, NUL-terminated; out holds at least
 * KVF_HTTP_TOKEN_LEN + 1 bytes. The token is empty when authentication
 * is off (insecure=1 without a secret file). Errors: the secret file
 * refused (mode, owner, size), KVF_ERR_INVALID_PARAM for a short out. */
KVF_API kvf_status_t kvf_auth_http_token(const char *host, char *out,
                                         size_t outlen);

#ifdef __cplusplus
}
#endif

#endif
