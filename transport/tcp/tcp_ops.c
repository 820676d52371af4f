/*
 * tcp transport ops table, plus the two side channels that use their own
 * short-lived connections: remote checksums (SUM) for verification and
 * the raw link test (LINK_WRITE / LINK_READ), one contiguous stream per
 * connection, which `bench link` reports as the ceiling of the path.
 */
#include "transport/tcp/tcp.h"
#include "core/alloc.h"
#include "core/auth.h"
#include "core/log.h"
#include "core/time.h"

#include <string.h>
#include <unistd.h>

static int kvf_tcp_available(void)
{
    return 1;
}

static kvf_status_t kvf_tcp_iface_open(const kvf_tl_config_t *cfg,
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
    if (!cfg->no_listen) {
        status = kvf_tcp_server_start(iface);
        if (status != KVF_OK) {
            kvf_free(iface);
            return status;
        }
    }
    *iface_p = iface;
    return KVF_OK;
}

static void kvf_tcp_iface_close(kvf_tl_iface_t *iface)
{
    kvf_tcp_server_stop(iface);
    kvf_free(iface);
}

static const char *kvf_tcp_iface_address(kvf_tl_iface_t *iface)
{
    return iface->address;
}

static kvf_status_t kvf_tcp_sum_some(int fd, kvf_wire_mac_t *mac,
                                     const uint64_t *remote,
                                     const size_t *lengths, size_t count,
                                     uint64_t *sums, uint64_t deadline)
{
    kvf_frame_hdr_t h;
    kvf_status_t status;
    kvf_wr_t w;
    kvf_rd_t r;
    size_t i;

    kvf_wr_init(&w);
    for (i = 0; i < count; i++) {
        kvf_tcp_entry_enc(&w, remote[i], lengths[i]);
    }
    status = kvf_wr_status(&w);
    if (status == KVF_OK) {
        status =
            kvf_tcp_send_frame(fd, mac, KVF_TCP_SUM, 1, KVF_OK, (uint32_t)count,
                               w.buf, (uint32_t)w.len, 0, deadline);
    }
    if (status == KVF_OK) {
        status = kvf_tcp_recv_hdr(fd, &h, deadline);
    }
    if (status != KVF_OK) {
        goto out;
    }
    if (h.type != KVF_TCP_SUM_RESP || h.meta_len > w.len) {
        status = KVF_ERR_PROTOCOL;
        goto out;
    }
    /* the checksums come back in the entries' buffer (same or less) */
    status = kvf_tcp_recv_meta(fd, mac, &h, w.buf, deadline, "tcp checksums");
    if (status != KVF_OK) {
        goto out;
    }
    if (h.status != KVF_OK) {
        status = (kvf_status_t)h.status;
        goto out;
    }
    if (h.count != count) {
        status = KVF_ERR_PROTOCOL;
        goto out;
    }
    kvf_rd_init(&r, w.buf, h.meta_len);
    for (i = 0; status == KVF_OK && i < count; i++) {
        sums[i] = kvf_tcp_sum_dec(&r);
    }
    if (status == KVF_OK) {
        status = kvf_rd_end(&r);
    }
out:
    kvf_wr_free(&w);
    return status;
}

kvf_status_t kvf_tcp_ep_checksum(kvf_tl_ep_t *ep, const uint64_t *remote,
                                 const size_t *lengths, size_t count,
                                 uint64_t *sums)
{
    kvf_tl_ep_t *v = ep;
    kvf_wire_mac_t mac;
    kvf_status_t status;
    uint64_t deadline;
    size_t done, n;
    int fd;

    status = kvf_auth_connect(v->host, v->port, (int)v->iface->cfg.timeout_ms,
                              "tcp", &fd, &mac);
    if (status != KVF_OK) {
        return KVF_ERR_PEER_UNREACHABLE;
    }
    for (done = 0; done < count && status == KVF_OK; done += n) {
        n = kvf_tl_sum_batch(lengths + done, count - done);
        deadline = kvf_time_ms() + v->iface->cfg.timeout_ms;
        status = kvf_tcp_sum_some(fd, &mac, remote + done, lengths + done, n,
                                  sums + done, deadline);
    }
    kvf_wire_mac_free(&mac);
    close(fd);
    return status;
}

typedef struct kvf_tcp_link_job {
    kvf_tl_ep_t *v;
    int fd;
    kvf_wire_mac_t mac;
    kvf_op_type_t type;
    char *local;
    uint64_t remote;
    uint64_t len;
    struct kvf_tcp_link_start *start;
    kvf_status_t status;
} kvf_tcp_link_job_t;

/* Start gate: workers wait until go is 1 (run) or -1 (abort). */
typedef struct kvf_tcp_link_start {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int go;
} kvf_tcp_link_start_t;

static int kvf_tcp_link_wait(kvf_tcp_link_start_t *s)
{
    int go;

    pthread_mutex_lock(&s->lock);
    while (s->go == 0) {
        pthread_cond_wait(&s->cond, &s->lock);
    }
    go = s->go;
    pthread_mutex_unlock(&s->lock);
    return go;
}

static void kvf_tcp_link_go(kvf_tcp_link_start_t *s, int go)
{
    pthread_mutex_lock(&s->lock);
    s->go = go;
    pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->lock);
}

/* One link stream: the request, the payload (WRITE), the reply and its
 * payload (READ), each payload with its tag when payload tags are on. */
static kvf_status_t kvf_tcp_link_run(kvf_tcp_link_job_t *j, uint64_t deadline)
{
    unsigned char meta[KVF_TCP_ENTRY_LEN], ptag[KVF_WIRE_TAG_LEN];
    struct iovec iov = {j->local, j->len};
    int w = (j->type == KVF_OP_WRITE), pm = j->mac.payload && j->len > 0;
    kvf_frame_hdr_t h;
    kvf_wr_t mw;
    kvf_status_t status;

    kvf_wr_init_fixed(&mw, meta, sizeof(meta));
    kvf_tcp_entry_enc(&mw, j->remote, j->len);
    status = kvf_tcp_send_frame(
        j->fd, &j->mac, w ? KVF_TCP_LINK_WRITE : KVF_TCP_LINK_READ, 1, KVF_OK,
        1, meta, sizeof(meta), w ? j->len : 0, deadline);
    if (status == KVF_OK && w) {
        status = kvf_sock_send_all(j->fd, j->local, j->len, deadline);
        if (status == KVF_OK && pm) {
            kvf_tcp_ptag(&j->mac, 1, &iov, 1, ptag);
            status = kvf_sock_send_all(j->fd, ptag, sizeof(ptag), deadline);
        }
    }
    if (status == KVF_OK) {
        status = kvf_tcp_recv_hdr(j->fd, &h, deadline);
    }
    if (status == KVF_OK && (h.type != KVF_TCP_LINK_RESP || h.meta_len != 0)) {
        status = KVF_ERR_PROTOCOL;
    }
    if (status == KVF_OK) {
        status =
            kvf_tcp_recv_meta(j->fd, &j->mac, &h, NULL, deadline, "tcp link");
    }
    if (status == KVF_OK && h.status != KVF_OK) {
        status = (kvf_status_t)h.status;
    }
    if (status == KVF_OK && !w) {
        status = (h.data_len == j->len)
                     ? kvf_sock_recv_all(j->fd, j->local, j->len, deadline)
                     : KVF_ERR_PROTOCOL;
        if (status == KVF_OK && pm) {
            status = kvf_tcp_recv_ptag(j->fd, &j->mac, &iov, 1, deadline,
                                       "tcp link");
        }
    }
    return status;
}

static void *kvf_tcp_link_main(void *arg)
{
    kvf_tcp_link_job_t *j = arg;
    uint64_t deadline;

    if (kvf_tcp_link_wait(j->start) < 0) {
        j->status = KVF_ERR_CANCELED;
        return NULL;
    }
    deadline = kvf_time_ms() + j->v->iface->cfg.timeout_ms +
               j->len / (1u << 20); /* plus 1 ms per MiB */
    j->status = kvf_tcp_link_run(j, deadline);
    return NULL;
}

kvf_status_t kvf_tcp_ep_link_test(kvf_tl_ep_t *ep, kvf_op_type_t type,
                                  void *local, uint64_t remote, size_t length,
                                  double *seconds_p)
{
    kvf_tl_ep_t *v = ep;
    unsigned n = v->nconns, i, started = 0;
    kvf_tcp_link_start_t start = {.go = 0};
    kvf_tcp_link_job_t *jobs;
    pthread_t *threads;
    kvf_status_t status = KVF_OK;
    uint64_t per, t0, off = 0;

    jobs = kvf_calloc(n, sizeof(*jobs));
    threads = kvf_calloc(n, sizeof(*threads));
    if (jobs == NULL || threads == NULL) {
        kvf_free(jobs);
        kvf_free(threads);
        return KVF_ERR_NO_MEMORY;
    }
    pthread_mutex_init(&start.lock, NULL);
    pthread_cond_init(&start.cond, NULL);
    per = (length / n) & ~(uint64_t)4095;
    for (i = 0; i < n; i++) {
        jobs[i].fd = -1;
    }
    for (i = 0; i < n && status == KVF_OK; i++) {
        jobs[i].v = v;
        jobs[i].type = type;
        jobs[i].local = (char *)local + off;
        jobs[i].remote = remote + off;
        jobs[i].len = (i == n - 1) ? length - off : per;
        jobs[i].start = &start;
        off += per;
        status =
            kvf_auth_connect(v->host, v->port, (int)v->iface->cfg.timeout_ms,
                             "tcp", &jobs[i].fd, &jobs[i].mac);
        if (status == KVF_OK) {
            kvf_sock_set_bufs(jobs[i].fd, KVF_TCP_SOCKBUF);
        }
    }
    for (i = 0; i < n && status == KVF_OK; i++) {
        if (pthread_create(&threads[i], NULL, kvf_tcp_link_main, &jobs[i]) !=
            0) {
            status = KVF_ERR_NO_RESOURCE;
            break;
        }
        started++;
    }
    t0 = kvf_time_ns();
    kvf_tcp_link_go(&start, (status == KVF_OK) ? 1 : -1);
    for (i = 0; i < started; i++) {
        pthread_join(threads[i], NULL);
        if (jobs[i].status != KVF_OK && status == KVF_OK) {
            status = jobs[i].status;
        }
    }
    if (status == KVF_OK) {
        *seconds_p = (double)(kvf_time_ns() - t0) / 1e9;
    }
    for (i = 0; i < n; i++) {
        if (jobs[i].fd >= 0) {
            close(jobs[i].fd);
        }
        kvf_wire_mac_free(&jobs[i].mac);
    }
    pthread_mutex_destroy(&start.lock);
    pthread_cond_destroy(&start.cond);
    kvf_free(jobs);
    kvf_free(threads);
    return status;
}

const kvf_transport_ops_t kvf_tcp_ops = {
    .name = "tcp",
    .available = kvf_tcp_available,
    .iface_open = kvf_tcp_iface_open,
    .iface_close = kvf_tcp_iface_close,
    .iface_address = kvf_tcp_iface_address,
    .ep_open = kvf_tcp_ep_open,
    .ep_close = kvf_tcp_ep_close,
    .ep_post = kvf_tcp_ep_post,
    .ep_post_inline = kvf_tcp_ep_post_inline,
    .ep_checksum = kvf_tcp_ep_checksum,
    .ep_link_test = kvf_tcp_ep_link_test,
    .fetch_descriptor = kvf_tcp_fetch_descriptor,
};
