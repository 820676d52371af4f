/*
 * The commands' HTTP GET (the master's /metrics and /status, with the
 * cluster secret's token), over core/sock.h.
 */
#ifndef KVF_TOOLS_NET_H
#define KVF_TOOLS_NET_H
#if !defined(KVF_LAYER_TOOLS) && !defined(KVF_TEST_INTERNALS)
#error "tools/cli/net.h is private to tools/"
#endif

#include <kvferry/status.h>

#include <stddef.h>

/* GET path from the HTTP server at addr ("HOST:PORT") within timeout_ms;
 * the body of a 200 reply, NUL-terminated, in buf. */
kvf_status_t kvf_net_http_get(const char *addr, const char *path, char *buf,
                              size_t len, int timeout_ms);

#endif
