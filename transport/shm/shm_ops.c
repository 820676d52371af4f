/*
 * shm transport: processes of the same host move blocks with one memcpy
 * each, straight between the initiator's buffer and the target's
 * registered memory, mapped into the initiator.
 *
 * Design, chosen by measurement (docs/decisions/shm-copy-path.md has
 * the figures): (a) memfd regions mapped by the initiator (fd over a
 * unix socket), one memcpy per block; (b) process_vm_readv/writev; (c)
 * two-sided, the target gathers into a shared staging buffer and the
 * initiator scatters.
 *
 * (a) wins: it is memcpy, it needs no ptrace permission (process_vm_*
 * does: Yama and container seccomp profiles deny it), and a stale access
 * can only touch pages of a shared allocation, never memory the target
 * reused after freeing it. (c) costs a second copy of every byte and the
 * target's CPU. So kvf_mem_alloc(KVF_MEM_HOST) returns memfd memory
 * (engine/memory.c, shm_mem.c), and memory that is not (plain malloc,
 * GPU) goes the (c) way, through a staging buffer, moved by the target.
 *
 * Safety. Same host = equal host id (boot id + network namespace) AND a
 * handshake over the abstract unix socket named by the nonce of the
 * descriptor, answered with a sealed probe memfd holding that nonce,
 * which the initiator maps and checks: it proves one kernel, one
 * namespace, fd passing and shared mappings all work. Any failure makes
 * ep_open fail, and the engine falls back to tcp. The target checks
 * every access itself (BEGIN under its region read lock, see
 * shm_server.c) and hands out the fd of an allocation only inside a
 * lease that granted a registered range in it. Guarantee: while no lease
 * is open, the initiator's library touches nothing; deregistration waits
 * for open leases and no later lease grants the range. What the
 * initiator *process* could still reach, if it misbehaved, is the
 * allocations it was ever granted (the granularity is one kvf_mem_alloc
 * call: keep data you never register out of them), until it unmaps them
 * after the target frees them. A dead target turns every pending or new
 * request into an error within the timeout (socket closed or silent).
 *
 * This file: the ops table, the iface, checksums and the link test (one
 * single-thread memcpy of the whole range inside one lease: the ceiling
 * `bench link` reports for shm).
 */
#include "transport/shm/shm.h"
#include "core/alloc.h"
#include "core/log.h"
#include "core/time.h"

#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

static int kvf_shm_available(void)
{
    static int cached = -1;
    int fd, s;

    if (__atomic_load_n(&cached, __ATOMIC_RELAXED) >= 0) {
        return cached;
    }
    fd = memfd_create("kvferry-check", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || s < 0) {
        kvf_info("shm transport unavailable: %m");
    }
    __atomic_store_n(&cached, fd >= 0 && s >= 0, __ATOMIC_RELAXED);
    if (fd >= 0) {
        close(fd);
    }
    if (s >= 0) {
        close(s);
    }
    return cached;
}

static kvf_status_t kvf_shm_iface_open(const kvf_tl_config_t *cfg,
                                       const kvf_tl_target_t *target,
                                       kvf_tl_iface_t **iface_p)
{
    kvf_tl_iface_t *iface;
    kvf_status_t status;

    iface = kvf_calloc(1, sizeof(*iface));
    if (iface == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    iface->cfg = *cfg;
    iface->target = *target;
    iface->host_id = kvf_shm_host_id();
    status = kvf_shm_nonce(iface->nonce);
    if (status != KVF_OK) {
        kvf_free(iface);
        return status;
    }
    kvf_shm_format_address(iface->address, sizeof(iface->address),
                           iface->host_id, iface->nonce);
    if (!cfg->no_listen) {
        status = kvf_shm_server_start(iface);
        if (status != KVF_OK) {
            kvf_free(iface);
            return status;
        }
    }
    *iface_p = iface;
    return KVF_OK;
}

static void kvf_shm_iface_close(kvf_tl_iface_t *iface)
{
    kvf_shm_server_stop(iface);
    kvf_free(iface);
}

static const char *kvf_shm_iface_address(kvf_tl_iface_t *iface)
{
    /* an initiator-only iface serves nothing: publish no address */
    return iface->server != NULL ? iface->address : NULL;
}

static kvf_status_t kvf_shm_sum_some(kvf_tl_ep_t *ep, kvf_shm_conn_t *c,
                                     const uint64_t *remote,
                                     const size_t *lengths, size_t n,
                                     uint64_t *sums)
{
    kvf_frame_hdr_t h;
    kvf_status_t st;
    kvf_wr_t w;
    kvf_rd_t r;
    size_t i;

    st = kvf_shm_buf_reserve(&c->meta, n * KVF_SHM_ENTRY_LEN);
    if (st != KVF_OK) {
        return st;
    }
    kvf_wr_init_fixed(&w, c->meta.p, c->meta.cap);
    for (i = 0; i < n; i++) {
        kvf_shm_entry_enc(&w, remote[i], lengths[i]);
    }
    st = kvf_shm_send(c->fd, KVF_SHM_SUM, 0, KVF_OK, c->meta.p, (uint32_t)w.len,
                      (uint32_t)n, -1, kvf_time_ms() + ep->timeout_ms);
    if (st == KVF_OK) {
        st = kvf_shm_recv(c->fd, &h, &c->reply, NULL,
                          kvf_time_ms() + ep->timeout_ms);
    }
    if (st != KVF_OK) {
        return st;
    }
    if (h.type != KVF_SHM_SUM_ACK) {
        return KVF_ERR_PROTOCOL;
    }
    if (h.status != KVF_OK) {
        return (kvf_status_t)h.status;
    }
    if (h.count != n || kvf_shm_ids_open(&r, &h, c->reply.p) != KVF_OK) {
        return KVF_ERR_PROTOCOL;
    }
    for (i = 0; i < n; i++) {
        sums[i] = kvf_shm_id_dec(&r);
    }
    return KVF_OK;
}

/* Checksums computed by the target over its own memory, on a connection
 * of their own. */
static kvf_status_t kvf_shm_ep_checksum(kvf_tl_ep_t *ep, const uint64_t *remote,
                                        const size_t *lengths, size_t count,
                                        uint64_t *sums)
{
    kvf_shm_conn_t c = {.fd = -1};
    kvf_status_t st;
    size_t done, n;

    st = kvf_shm_conn_open(ep, &c);
    if (st != KVF_OK) {
        kvf_shm_conn_free(&c);
        return KVF_ERR_PEER_UNREACHABLE;
    }
    for (done = 0; done < count && st == KVF_OK; done += n) {
        n = kvf_tl_sum_batch(lengths + done, count - done);
        st = kvf_shm_sum_some(ep, &c, remote + done, lengths + done, n,
                              sums + done);
    }
    kvf_shm_conn_free(&c);
    return st;
}

/* The ceiling of the path, on a connection of its own: one lease over
 * the whole range, one single-thread memcpy (or the staging path when
 * the target cannot share the range). Only the copy is timed. */
static kvf_status_t kvf_shm_ep_link_test(kvf_tl_ep_t *ep, kvf_op_type_t type,
                                         void *local, uint64_t remote,
                                         size_t length, double *seconds_p)
{
    kvf_shm_conn_t c = {.fd = -1};
    kvf_shm_lease_t l;
    uint64_t t0 = 0, t1 = 0;
    kvf_status_t st;

    memset(&l, 0, sizeof(l));
    st = kvf_shm_conn_open(ep, &c);
    if (st != KVF_OK) {
        kvf_shm_conn_free(&c);
        return KVF_ERR_PEER_UNREACHABLE;
    }
    st = kvf_shm_lease_reserve(&l, 1);
    if (st == KVF_OK) {
        l.type = type;
        l.n = 1;
        l.local[0] = local;
        l.remote[0] = remote;
        l.lens[0] = length;
        st = kvf_shm_post_begin(ep, &c, &l);
    }
    if (st == KVF_OK) {
        st = kvf_shm_pump(ep, &c, KVF_SHM_GRANT, NULL, NULL);
    }
    if (st == KVF_OK && l.state == KVF_SHM_L_GRANTED) {
        st = kvf_shm_lease_prepare(ep, &c, &l);
        if (st == KVF_OK) {
            t0 = kvf_time_ns();
            st = kvf_shm_lease_copy(ep, &c, &l, 0);
            t1 = kvf_time_ns();
        }
        if (st == KVF_OK) {
            st = kvf_shm_post_end(ep, &c, &l);
        }
        if (st == KVF_OK) {
            st = (l.st[0] != KVF_OK) ? l.st[0] : l.end_status;
        }
    } else if (st == KVF_OK) {
        st = l.end_status;
    }
    kvf_shm_lease_free(&l);
    kvf_shm_conn_free(&c);
    if (st == KVF_OK) {
        *seconds_p = (double)(t1 - t0) / 1e9;
    }
    return st;
}

const kvf_transport_ops_t kvf_shm_ops = {
    .name = "shm",
    .available = kvf_shm_available,
    .iface_open = kvf_shm_iface_open,
    .iface_close = kvf_shm_iface_close,
    .iface_address = kvf_shm_iface_address,
    .ep_open = kvf_shm_ep_open,
    .ep_close = kvf_shm_ep_close,
    .ep_post = kvf_shm_ep_post,
    .ep_post_inline = kvf_shm_ep_post_inline,
    .inline_batch = 1,
    .ep_checksum = kvf_shm_ep_checksum,
    .ep_link_test = kvf_shm_ep_link_test,
    .ep_view_open = kvf_shm_view_open,
    .ep_view_close = kvf_shm_view_close,
};
