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
 * This file: the ops table, the iface, checksums and the link test (the
 * whole range inside one lease, cut into one contiguous piece per worker
 * and copied by as many threads as the ep has workers, with the copy its
 * workers use for large leases: the ceiling `bench link` and `bench
 * blocks` report for shm).
 */
#include "transport/shm/shm.h"
#include "core/alloc.h"
#include "core/log.h"
#include "core/time.h"

#define KVF_SHM_LINK_MAX 64 /* copying threads of the link test */

#include <pthread.h>
#include <sched.h>
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

/* The start gate of the link test's threads: go 1 copies, -1 quits. */
typedef struct kvf_shm_link_gate {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int go;
    unsigned ready; /* threads waiting at the gate */
} kvf_shm_link_gate_t;

/* One copying thread of the link test: entry i of the lease. */
typedef struct kvf_shm_link_job {
    kvf_shm_lease_t *l;
    size_t i;
    kvf_shm_link_gate_t *gate;
} kvf_shm_link_job_t;

static void kvf_shm_link_piece(kvf_shm_lease_t *l, size_t i)
{
    l->st[i] = (l->type == KVF_OP_WRITE)
                   ? kvf_shm_copy_stream(l->ptrs[i], l->local[i], l->lens[i])
                   : kvf_shm_copy_stream(l->local[i], l->ptrs[i], l->lens[i]);
    kvf_shm_fence(); /* this thread's streaming stores are done */
}

static void *kvf_shm_link_main(void *arg)
{
    kvf_shm_link_job_t *j = arg;
    kvf_shm_link_gate_t *g = j->gate;
    int go;

    pthread_mutex_lock(&g->lock);
    g->ready++;
    pthread_cond_broadcast(&g->cond);
    while (g->go == 0) {
        pthread_cond_wait(&g->cond, &g->lock);
    }
    go = g->go;
    pthread_mutex_unlock(&g->lock);
    if (go > 0) {
        kvf_shm_link_piece(j->l, j->i);
    }
    return NULL;
}

/* Opens the gate (go 1 or -1) once `want` threads wait at it; bounded by
 * the ep's timeout. */
static void kvf_shm_link_open(kvf_shm_link_gate_t *g, unsigned want, int go,
                              unsigned timeout_ms)
{
    uint64_t end = kvf_time_ms() + timeout_ms;

    pthread_mutex_lock(&g->lock);
    while (go > 0 && g->ready < want && kvf_time_ms() < end) {
        pthread_mutex_unlock(&g->lock);
        sched_yield();
        pthread_mutex_lock(&g->lock);
    }
    g->go = go;
    pthread_cond_broadcast(&g->cond);
    pthread_mutex_unlock(&g->lock);
}

/* The copy of a granted link lease, timed: entries 1..n-1 on threads of
 * their own, entry 0 on this one, all started together once every
 * thread waits. With an entry that is not mapped (staging), the lease
 * copy on one thread. Unlocks the map lock, as kvf_shm_lease_copy does. */
static kvf_status_t kvf_shm_link_copy(kvf_tl_ep_t *ep, kvf_shm_conn_t *c,
                                      kvf_shm_lease_t *l, uint64_t *ns_p)
{
    kvf_shm_link_job_t jobs[KVF_SHM_LINK_MAX];
    pthread_t th[KVF_SHM_LINK_MAX];
    kvf_shm_link_gate_t g = {.go = 0};
    size_t i, started = 0;
    uint64_t t0;
    int direct = 1;
    kvf_status_t st = KVF_OK;

    for (i = 0; i < l->n; i++) {
        direct &= (l->excs[i] == KVF_OK);
    }
    if (!direct || l->n < 2) {
        t0 = kvf_time_ns();
        st = kvf_shm_lease_copy(ep, c, l, 1);
        *ns_p = kvf_time_ns() - t0;
        return st;
    }
    pthread_mutex_init(&g.lock, NULL);
    pthread_cond_init(&g.cond, NULL);
    for (i = 1; i < l->n; i++) {
        jobs[i] = (kvf_shm_link_job_t){l, i, &g};
        if (pthread_create(&th[i], NULL, kvf_shm_link_main, &jobs[i]) != 0) {
            st = KVF_ERR_NO_RESOURCE;
            break;
        }
        started++;
    }
    kvf_shm_link_open(&g, (unsigned)started, st == KVF_OK ? 1 : -1,
                      ep->timeout_ms);
    t0 = kvf_time_ns();
    if (st == KVF_OK) {
        kvf_shm_link_piece(l, 0);
    }
    for (i = 1; i <= started; i++) {
        pthread_join(th[i], NULL);
    }
    *ns_p = kvf_time_ns() - t0;
    pthread_mutex_destroy(&g.lock);
    pthread_cond_destroy(&g.cond);
    pthread_rwlock_unlock(&ep->map_lock);
    return st;
}

/* The ceiling of the path, on a connection of its own: one lease over
 * the whole range, cut into one contiguous piece per worker of the ep
 * (the parallelism of the transport's own copies), the pieces copied at
 * once by as many threads with the transport's large-lease copy. Only
 * the copy is timed. */
static kvf_status_t kvf_shm_ep_link_test(kvf_tl_ep_t *ep, kvf_op_type_t type,
                                         void *local, uint64_t remote,
                                         size_t length, double *seconds_p)
{
    kvf_shm_conn_t c = {.fd = -1};
    kvf_shm_lease_t l;
    size_t n = ep->nworkers, i, per, off = 0;
    uint64_t ns = 0;
    kvf_status_t st;

    n = n < 1 ? 1 : n > KVF_SHM_LINK_MAX ? KVF_SHM_LINK_MAX : n;
    per = (length / n) & ~(size_t)4095;
    if (per == 0) {
        n = 1;
        per = length;
    }
    memset(&l, 0, sizeof(l));
    st = kvf_shm_conn_open(ep, &c);
    if (st != KVF_OK) {
        kvf_shm_conn_free(&c);
        return KVF_ERR_PEER_UNREACHABLE;
    }
    st = kvf_shm_lease_reserve(&l, n);
    if (st == KVF_OK) {
        l.type = type;
        l.n = n;
        for (i = 0; i < n; i++, off += per) {
            l.local[i] = (char *)local + off;
            l.remote[i] = remote + off;
            l.lens[i] = (i == n - 1) ? length - off : per;
        }
        st = kvf_shm_post_begin(ep, &c, &l);
    }
    if (st == KVF_OK) {
        st = kvf_shm_pump(ep, &c, KVF_SHM_GRANT, NULL, NULL);
    }
    if (st == KVF_OK && l.state == KVF_SHM_L_GRANTED) {
        st = kvf_shm_lease_prepare(ep, &c, &l);
        if (st == KVF_OK) {
            st = kvf_shm_link_copy(ep, &c, &l, &ns);
        }
        if (st == KVF_OK) {
            st = kvf_shm_post_end(ep, &c, &l);
        }
        for (i = 0; st == KVF_OK && i < l.n; i++) {
            st = (l.st[i] != KVF_OK) ? l.st[i] : l.end_status;
        }
    } else if (st == KVF_OK) {
        st = l.end_status;
    }
    kvf_shm_lease_free(&l);
    kvf_shm_conn_free(&c);
    if (st == KVF_OK) {
        *seconds_p = (double)ns / 1e9;
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
