/*
 * ucx transport: UCP contexts and workers. A context asks for RMA,
 * active messages (READs served by the target) and wake-ups; on a loopback
 * iface its network devices are limited to lo, so UCX's own tcp listener is not
 * reachable from other hosts. UCX's tcp transport accepts connections without
 * any authentication, and its software RMA reaches any address of the target
 * process whatever the key: a context that would use tcp, loopback included
 * (any local user reaches it there), is refused unless ucx_tcp=1 or
 * insecure=1 (RDMA transports check remote keys in the NIC).
 *
 * The resource list (what `bench env` shows and what decides whether an
 * RDMA device exists) is read from ucp_context_print_info's "resource"
 * lines, the one place UCX 1.13 names its transports.
 */
#include "transport/ucx/ucx.h"
#include "core/auth.h"
#include "core/config.h"
#include "core/log.h"
#include "core/time.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

static const kvf_config_entry_t kvf_ucx_config_entries[] = {
    {"ucx_workers", "2",
     "ucx: UCX workers per peer on an initiator (each with its own "
     "endpoint and progress thread; a batch's requests are spread over "
     "them) and serving on a target, 1..16",
     KVF_CONFIG_TUNING},
    {"ucx_tcp_seg", "9K",
     "ucx: segment size kvferry gives UCX's tcp transport "
     "(TCP_TX_SEG_SIZE): over tcp every put and get is a message, and a "
     "block with its headers must fit one or it costs two messages and "
     "two acknowledgements; block size + 1K (0: UCX's own; "
     "UCX_TCP_TX_SEG_SIZE, when set, wins)",
     KVF_CONFIG_TUNING},
    {"ucx_read_mode", "auto",
     "ucx: how READs move: get (one-sided ucp_get_nbx per block), push "
     "(the target answers one message per request with the blocks "
     "gathered), or auto: push where UCP has no RMA lane to the peer "
     "(UCX's tcp emulates gets with a message per block), get otherwise",
     KVF_CONFIG_TUNING},
    {"ucx_write_mode", "auto",
     "ucx: how WRITEs move: put (one-sided ucp_put_nbx per block and a "
     "flush), push (one active message per request carrying the blocks, "
     "which the target checks, writes into place and acknowledges), or "
     "auto: push where UCP has no RMA lane to the peer, put otherwise",
     KVF_CONFIG_TUNING},
    {"ucx_tcp", "0",
     "ucx: 1 lets the ucx transport run where UCX would use its tcp "
     "transport, whose listener takes peers without the cluster secret: "
     "any local user (on loopback) or any host that reaches the address "
     "can then read and write every byte of this process through it; 0 "
     "refuses to start there (UCX_TLS without tcp: rc,ud,sm,self on RDMA, "
     "sm,self on one host)",
     KVF_CONFIG_USER},
};

KVF_CONFIG_TABLE(kvf_ucx_config, "ucx", kvf_ucx_config_entries)

kvf_status_t kvf_ucx_tuning(unsigned workers, unsigned *n_p,
                            uint64_t *spin_ns_p)
{
    kvf_status_t status;
    uint64_t v;

    status = kvf_config_u64(&kvf_ucx_config, "ucx_workers", &v);
    if (status != KVF_OK) {
        return status;
    }
    if (workers != 0) {
        v = workers;
    }
    /* a progress thread sleeps at once after its last event: polling
     * longer saved wake-ups but moved no figure (docs/ucx.md) */
    *spin_ns_p = 0;
    if (v == 0 || v > KVF_UCX_WORKERS_MAX) {
        kvf_error("ucx: ucx_workers %lu out of range (1..%u)", (unsigned long)v,
                  KVF_UCX_WORKERS_MAX);
        return KVF_ERR_INVALID_PARAM;
    }
    *n_p = (unsigned)v;
    return KVF_OK;
}

/* A mode key whose names are, in order, KVF_UCX_MODE_AUTO, the
 * one-sided mode and KVF_UCX_MODE_PUSH. */
static kvf_status_t kvf_ucx_mode(const char *key, const char *one_sided,
                                 unsigned *mode_p)
{
    const char *names[] = {"auto", one_sided, "push"};
    const char *v = kvf_config_str(&kvf_ucx_config, key);
    unsigned i;

    for (i = 0; v != NULL && i < sizeof(names) / sizeof(names[0]); i++) {
        if (strcmp(v, names[i]) == 0) {
            *mode_p = i;
            return KVF_OK;
        }
    }
    kvf_error("ucx: %s '%s' is not one of auto, %s, push", key,
              v != NULL ? v : "", one_sided);
    return KVF_ERR_INVALID_PARAM;
}

kvf_status_t kvf_ucx_read_mode(unsigned *mode_p)
{
    return kvf_ucx_mode("ucx_read_mode", "get", mode_p);
}

kvf_status_t kvf_ucx_write_mode(unsigned *mode_p)
{
    return kvf_ucx_mode("ucx_write_mode", "put", mode_p);
}

kvf_status_t kvf_ucx_status(ucs_status_t s)
{
    switch (s) {
    case UCS_OK:
        return KVF_OK;
    case UCS_INPROGRESS:
        return KVF_INPROGRESS;
    case UCS_ERR_NO_MEMORY:
        return KVF_ERR_NO_MEMORY;
    case UCS_ERR_CANCELED:
        return KVF_ERR_CANCELED;
    case UCS_ERR_TIMED_OUT:
    case UCS_ERR_ENDPOINT_TIMEOUT:
        return KVF_ERR_TIMEOUT;
    case UCS_ERR_UNREACHABLE:
        return KVF_ERR_PEER_UNREACHABLE;
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_NOT_CONNECTED:
        return KVF_ERR_PEER_CLOSED;
    case UCS_ERR_NO_DEVICE:
    case UCS_ERR_UNSUPPORTED:
        return KVF_ERR_UNAVAILABLE;
    default:
        return KVF_ERR_IO;
    }
}

/* The "tl/dev" names of a context's resources, space separated. */
static void kvf_ucx_ctx_resources(ucp_context_h ctx, char *out, size_t outlen)
{
    char *text = NULL, *line, *save, *p;
    size_t len = 0, n = 0;
    FILE *f;

    out[0] = '\0';
    f = open_memstream(&text, &len);
    if (f == NULL) {
        return;
    }
    ucp_context_print_info(ctx, f);
    fclose(f);
    for (line = strtok_r(text, "\n", &save); line != NULL;
         line = strtok_r(NULL, "\n", &save)) {
        p = strstr(line, "flags -- ");
        if (strstr(line, "resource") == NULL || p == NULL || n >= outlen) {
            continue;
        }
        p += strlen("flags -- ");
        p[strcspn(p, " \t")] = '\0';
        n += (size_t)snprintf(out + n, outlen - n, "%s%s", n ? " " : "", p);
    }
    free(text);
}

int kvf_ucx_has_rdma(const char *res)
{
    static const char *const rdma[] = {" rc_", " dc_", " ud_", " srd"};
    char buf[1024];
    size_t i;

    snprintf(buf, sizeof(buf), " %s", res);
    for (i = 0; i < sizeof(rdma) / sizeof(rdma[0]); i++) {
        if (strstr(buf, rdma[i]) != NULL) {
            return 1;
        }
    }
    return 0;
}

static char kvf_ucx_res[1024];
static int kvf_ucx_res_ok;
static pthread_once_t kvf_ucx_res_once = PTHREAD_ONCE_INIT;

/* Whether UCX's configuration (UCX_TLS) lets it use its tcp transport:
 * "all" (the default), a list naming tcp, or an exclusion list that does
 * not. */
static int kvf_ucx_tls_tcp(void)
{
    char *text = NULL, *p, *end;
    ucp_config_t *config;
    size_t len = 0;
    int tcp = 0;
    FILE *f;

    if (ucp_config_read(NULL, NULL, &config) != UCS_OK) {
        return 0;
    }
    f = open_memstream(&text, &len);
    if (f != NULL) {
        ucp_config_print(config, f, NULL, UCS_CONFIG_PRINT_CONFIG);
        fclose(f);
    }
    ucp_config_release(config);
    p = text != NULL ? strstr(text, "UCX_TLS=") : NULL;
    if (p != NULL) {
        p += strlen("UCX_TLS=");
        end = p + strcspn(p, "\n");
        *end = '\0';
        if (*p == '^') {
            tcp = strstr(p, "tcp") == NULL;
        } else {
            tcp = strstr(p, "all") != NULL || strstr(p, "tcp") != NULL;
        }
    }
    free(text);
    return tcp;
}

/* The ucx_tcp_seg key for UCX's tcp transport, once, before the first
 * context. UCX 1.13 reads a transport's settings from the environment
 * only (ucp_config_modify does not reach them: it answers "invalid
 * configuration"), so this sets UCX_TCP_TX_SEG_SIZE for the process when
 * UCX may use tcp (elsewhere UCX warns of an unused variable), unless
 * the user set it. */
static void kvf_ucx_tcp_seg(void)
{
    uint64_t seg = 0;
    char text[32];

    if (kvf_config_u64(&kvf_ucx_config, "ucx_tcp_seg", &seg) != KVF_OK ||
        seg == 0 || !kvf_ucx_tls_tcp()) {
        return;
    }
    snprintf(text, sizeof(text), "%lu", (unsigned long)seg);
    if (setenv("UCX_TCP_TX_SEG_SIZE", text, 0) != 0) {
        kvf_warn("ucx: cannot set UCX_TCP_TX_SEG_SIZE: %m");
    }
}

static pthread_once_t kvf_ucx_seg_once = PTHREAD_ONCE_INIT;

static kvf_status_t kvf_ucx_init(const char *net_devices, ucp_context_h *ctx_p)
{
    ucp_params_t p = {0};
    ucp_config_t *config;
    ucs_status_t s;

    pthread_once(&kvf_ucx_seg_once, kvf_ucx_tcp_seg);
    s = ucp_config_read(NULL, NULL, &config);
    if (s != UCS_OK) {
        kvf_error("ucx: cannot read UCX's configuration: %s",
                  ucs_status_string(s));
        return KVF_ERR_UNAVAILABLE;
    }
    if (net_devices != NULL) {
        ucp_config_modify(config, "NET_DEVICES", net_devices);
    }
    p.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
    p.features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
    p.mt_workers_shared = 1;
    s = ucp_init(&p, config, ctx_p);
    ucp_config_release(config);
    if (s != UCS_OK) {
        kvf_error("ucx: ucp_init failed: %s", ucs_status_string(s));
        return KVF_ERR_UNAVAILABLE;
    }
    return KVF_OK;
}

static void kvf_ucx_res_probe(void)
{
    ucp_context_h ctx;

    if (kvf_ucx_init(NULL, &ctx) != KVF_OK) {
        return;
    }
    kvf_ucx_ctx_resources(ctx, kvf_ucx_res, sizeof(kvf_ucx_res));
    ucp_cleanup(ctx);
    kvf_ucx_res_ok = 1;
}

const char *kvf_ucx_resources(void)
{
    pthread_once(&kvf_ucx_res_once, kvf_ucx_res_probe);
    return kvf_ucx_res_ok ? kvf_ucx_res : "";
}

kvf_status_t kvf_ucx_ctx_create(const char *host, ucp_context_h *ctx_p)
{
    int loop = kvf_auth_is_loopback(host);
    char res[1024], buf[1030];
    ucp_context_h ctx;
    kvf_status_t status;
    uint64_t insecure = 0, allow = 0;

    status = kvf_ucx_init(loop ? "lo" : NULL, &ctx);
    if (status != KVF_OK) {
        return status;
    }
    kvf_ucx_ctx_resources(ctx, res, sizeof(res));
    snprintf(buf, sizeof(buf), " %s", res);
    kvf_config_u64(&kvf_auth_config, "insecure", &insecure);
    kvf_config_u64(&kvf_ucx_config, "ucx_tcp", &allow);
    if (strstr(buf, " tcp/") != NULL && !allow && !insecure) {
        kvf_error("ucx: refusing to start: UCX would use its tcp transport "
                  "on %s (%s), whose listener takes peers without the "
                  "cluster secret: %s could read and write any memory of "
                  "this process through it (tests/integration/"
                  "test_hostile_ucx.c shows it); leave tcp out (UCX_TLS="
                  "rc,ud,sm,self on RDMA, UCX_TLS=sm,self on one host) or "
                  "accept that with ucx_tcp=1 (KVF_UCX_TCP=1)",
                  host, res,
                  loop ? "any local user" : "any host that reaches it");
        ucp_cleanup(ctx);
        return KVF_ERR_AUTH;
    }
    kvf_debug("ucx: context for %s with %s", host, res);
    *ctx_p = ctx;
    return KVF_OK;
}

kvf_status_t kvf_ucx_worker_create(ucp_context_h ctx, ucp_worker_h *worker_p,
                                   int *efd_p, int *wake_p)
{
    ucp_worker_params_t wp = {0};
    struct epoll_event ev = {.events = EPOLLIN};
    kvf_status_t status = KVF_ERR_NO_RESOURCE;
    ucp_worker_h worker;
    int ufd, efd = -1, wake = -1;
    ucs_status_t s;

    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SINGLE;
    s = ucp_worker_create(ctx, &wp, &worker);
    if (s != UCS_OK) {
        kvf_error("ucx: ucp_worker_create: %s", ucs_status_string(s));
        return kvf_ucx_status(s);
    }
    s = ucp_worker_get_efd(worker, &ufd);
    if (s != UCS_OK) {
        kvf_error("ucx: ucp_worker_get_efd: %s", ucs_status_string(s));
        status = kvf_ucx_status(s);
        goto err_worker;
    }
    efd = epoll_create1(EPOLL_CLOEXEC);
    wake = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (efd < 0 || wake < 0) {
        kvf_error("ucx: epoll/eventfd: %m");
        goto err_fds;
    }
    ev.data.fd = ufd;
    if (epoll_ctl(efd, EPOLL_CTL_ADD, ufd, &ev) != 0) {
        goto err_fds;
    }
    ev.data.fd = wake;
    if (epoll_ctl(efd, EPOLL_CTL_ADD, wake, &ev) != 0) {
        goto err_fds;
    }
    *worker_p = worker;
    *efd_p = efd;
    *wake_p = wake;
    return KVF_OK;

err_fds:
    if (efd >= 0) {
        close(efd);
    }
    if (wake >= 0) {
        close(wake);
    }
err_worker:
    ucp_worker_destroy(worker);
    return status;
}

void kvf_ucx_worker_destroy(ucp_worker_h worker, int efd, int wake)
{
    ucp_worker_destroy(worker);
    close(efd);
    close(wake);
}

void kvf_ucx_wake(int wake)
{
    uint64_t one = 1;

    if (write(wake, &one, sizeof(one)) < 0) {
        /* the counter is full: the thread is awake anyway */
    }
}

/* Longest a worker_wait with a busy hook keeps progressing (a lane's
 * peer checks, timeouts and keepalive run between calls). */
#define KVF_UCX_BUSY_NS (10 * 1000000ull)

void kvf_ucx_worker_wait(ucp_worker_h worker, int efd, int wake, int timeout_ms,
                         const kvf_tl_target_t *target, kvf_ucx_spin_t *spin,
                         void (*busy)(void *arg), void *arg)
{
    struct epoll_event ev[2];
    uint64_t v, now, t0 = kvf_time_ns();
    unsigned n = 0, c;
    ucs_status_t s;
    int more = 0;

    if (target != NULL) {
        target->acquire(target->arg);
    }
    while (!more && (c = ucp_worker_progress(worker)) != 0) {
        n += c;
        if (busy != NULL) {
            busy(arg);
            more = kvf_time_ns() - t0 > KVF_UCX_BUSY_NS;
        }
    }
    if (target != NULL) {
        target->release(target->arg);
    }
    if (more) {
        return; /* the caller's checks run, then it comes back */
    }
    if (spin->ns > 0) {
        now = kvf_time_ns();
        if (n > 0) {
            spin->busy_ns = now;
        }
        if (now - spin->busy_ns < spin->ns) {
            return; /* busy lately: poll again instead of sleeping */
        }
    }
    s = ucp_worker_arm(worker);
    if (s == UCS_ERR_BUSY) {
        return; /* events arrived meanwhile: progress again */
    }
    if (epoll_wait(efd, ev, 2, timeout_ms) > 0) {
        if (read(wake, &v, sizeof(v)) < 0) {
            /* nothing to read: the wake-up was the worker's */
        }
    }
}
