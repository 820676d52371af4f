/*
 * Limits of the engine's targets: the "target" configuration table and
 * the helpers the tcp and shm servers share (accept back-off when out of
 * descriptors, a cheap look for a peer that went away).
 */
#include "transport/limits.h"
#include "core/config.h"
#include "core/log.h"

#include <errno.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#define KVF_TL_BACKOFF_US (50 * 1000)

static const kvf_config_entry_t kvf_target_config_entries[] = {
    {"sum_max_entries", "4096",
     "most checksums one request may ask a target for (more: refused)",
     KVF_CONFIG_TUNING},
    {"sum_max_bytes", "1G",
     "most bytes one checksum request may ask a target to hash",
     KVF_CONFIG_TUNING},
    {"idle_timeout_ms", "60000",
     "a target closes a connection idle this long (clients reconnect; at "
     "least 100)",
     KVF_CONFIG_TUNING},
    {"conns_per_addr", "256",
     "most connections a target keeps open from one peer address",
     KVF_CONFIG_TUNING},
    {"conns_max", "1024",
     "most authenticated connections a target keeps open in all (a "
     "thread each)",
     KVF_CONFIG_TUNING},
    {"conns_unauth_max", "128",
     "most connections a target keeps in the authentication exchange, in "
     "all (a budget apart from conns_max); past it the oldest is dropped",
     KVF_CONFIG_TUNING},
    {"conns_unauth_per_addr", "16",
     "most connections in the authentication exchange from one peer "
     "address",
     KVF_CONFIG_TUNING},
    {"auth_timeout_ms", "3000",
     "a connection that has not finished the authentication exchange "
     "this long after accept is closed",
     KVF_CONFIG_TUNING},
    {"lease_break_ms", "500",
     "longest a shm peer's leases may delay a deregistration or a stop "
     "before they are broken",
     KVF_CONFIG_TUNING},
};

KVF_CONFIG_TABLE(kvf_target_config, "target", kvf_target_config_entries)

static kvf_status_t kvf_tl_limit_uint(const char *name, unsigned lo,
                                      unsigned *out)
{
    uint64_t v;
    kvf_status_t st = kvf_config_u64(&kvf_target_config, name, &v);

    if (st != KVF_OK) {
        return st;
    }
    if (v < lo || v > 0x7fffffffu) {
        kvf_error("%s=%lu is out of range (%u..%u)", name, (unsigned long)v, lo,
                  0x7fffffffu);
        return KVF_ERR_INVALID_PARAM;
    }
    *out = (unsigned)v;
    return KVF_OK;
}

kvf_status_t kvf_tl_limits_load(kvf_tl_limits_t *l)
{
    kvf_status_t st;

    st = kvf_config_u64(&kvf_target_config, "sum_max_entries",
                        &l->sum_max_entries);
    if (st == KVF_OK) {
        st = kvf_config_u64(&kvf_target_config, "sum_max_bytes",
                            &l->sum_max_bytes);
    }
    if (st == KVF_OK) {
        st = kvf_tl_limit_uint("idle_timeout_ms", KVF_TL_IDLE_MIN_MS,
                               &l->idle_timeout_ms);
    }
    if (st == KVF_OK) {
        st = kvf_tl_limit_uint("conns_per_addr", 1, &l->conns_per_addr);
    }
    if (st == KVF_OK) {
        st = kvf_tl_limit_uint("conns_max", 1, &l->conns_max);
    }
    if (st == KVF_OK) {
        st = kvf_tl_limit_uint("lease_break_ms", 1, &l->lease_break_ms);
    }
    if (st == KVF_OK) {
        st = kvf_tl_limit_uint("conns_unauth_max", 1, &l->unauth_max);
    }
    if (st == KVF_OK) {
        st = kvf_tl_limit_uint("conns_unauth_per_addr", 1, &l->unauth_per_addr);
    }
    if (st == KVF_OK) {
        st = kvf_tl_limit_uint("auth_timeout_ms", 1, &l->auth_timeout_ms);
    }
    return st;
}

size_t kvf_tl_sum_batch(const size_t *lengths, size_t count)
{
    uint64_t bytes = 0;
    size_t n;

    for (n = 0; n < count && n < KVF_TL_SUM_REQ_ENTRIES; n++) {
        if (n > 0 && bytes + lengths[n] > KVF_TL_SUM_REQ_BYTES) {
            break;
        }
        bytes += lengths[n];
    }
    return n;
}

int kvf_tl_accept_backoff(int err)
{
    if (err != EMFILE && err != ENFILE && err != ENOMEM && err != ENOBUFS) {
        return 0;
    }
    kvf_log_rl(KVF_LOG_WARN, "accept: %s; backing off",
               (err == EMFILE || err == ENFILE) ? "out of file descriptors"
                                                : "out of memory");
    usleep(KVF_TL_BACKOFF_US);
    return 1;
}

int kvf_tl_peer_gone(int fd)
{
    struct pollfd pfd = {.fd = fd, .events = POLLIN | POLLRDHUP};
    char b;

    if (poll(&pfd, 1, 0) <= 0) {
        return 0;
    }
    if (pfd.revents & (POLLERR | POLLHUP | POLLRDHUP)) {
        return 1;
    }
    /* readable: data (a pipelined request) or an orderly close */
    return recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}
