/*
 * The master's HTTP endpoint: GET /metrics (Prometheus text format 0.0.4)
 * and GET /status (JSON) with nodes, capacity, used, objects, hits,
 * misses, evictions, errors and the rest of the counters. One thread
 * serves one request per connection (HTTP/1.0, Connection: close), each
 * read and write bounded by a deadline; anything else gets 404 or 400.
 */
#include "store/master/master_int.h"
#include "core/alloc.h"
#include "core/log.h"
#include "core/time.h"

#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define KVF_HTTP_REQ_MAX 4096
#define KVF_HTTP_IO_MS   1000

typedef struct kvf_m_snap {
    kvf_master_stats_t st;
    uint64_t capacity, used, reserved, epoch;
    size_t nodes, objects, pending, removing, reservations;
    unsigned conns_tcp, conns_unix;
} kvf_m_snap_t;

/* Growable text buffer for the response body. */
typedef struct kvf_hbuf {
    char *p;
    size_t len, cap;
    int failed;
} kvf_hbuf_t;

static void kvf_hbuf_printf(kvf_hbuf_t *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void kvf_hbuf_printf(kvf_hbuf_t *b, const char *fmt, ...)
{
    va_list ap;
    size_t cap;
    char *np;
    int n;

    for (;;) {
        if (b->failed) {
            return;
        }
        va_start(ap, fmt);
        n = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? b->cap - b->len : 0,
                      fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->failed = 1;
            return;
        }
        if (b->p != NULL && (size_t)n < b->cap - b->len) {
            b->len += (size_t)n;
            return;
        }
        cap = b->cap ? b->cap * 2 : 4096;
        while (cap < b->len + (size_t)n + 1) {
            cap *= 2;
        }
        np = kvf_realloc(b->p, cap);
        if (np == NULL) {
            b->failed = 1;
            return;
        }
        b->p = np;
        b->cap = cap;
    }
}

/* A segment name made safe inside a JSON string (names are host:port,
 * checked at registration; this is belt and braces). */
static void kvf_m_json_safe(const char *in, char *out, size_t cap)
{
    size_t i;

    for (i = 0; in[i] != '\0' && i + 1 < cap; i++) {
        out[i] = (in[i] == '"' || in[i] == '\\' || (unsigned char)in[i] < 0x20)
                     ? '?'
                     : in[i];
    }
    out[i] = '\0';
}

static void kvf_m_snapshot(kvf_master_t *m, kvf_m_snap_t *s,
                           kvf_hbuf_t *nodes_json)
{
    char seg[KVF_STORE_SEG_MAX];
    const kvf_mnode_t *n;
    uint64_t now;
    int first = 1;

    pthread_mutex_lock(&m->lock);
    now = kvf_time_ms();
    s->st = m->st;
    s->capacity = kvf_m_capacity(m);
    s->used = kvf_m_used(m);
    s->nodes = m->nnodes;
    s->objects = m->nobjs;
    s->pending = kvf_m_pending(m);
    s->removing = kvf_m_removing(m);
    s->reserved = m->reserved;
    s->reservations = kvf_m_reservations(m);
    s->epoch = m->epoch;
    /* owned by the loop thread: read as they stand */
    s->conns_unix = __atomic_load_n(&m->nconns_unix, __ATOMIC_RELAXED);
    s->conns_tcp = __atomic_load_n(&m->nconns, __ATOMIC_RELAXED);
    s->conns_tcp =
        s->conns_tcp >= s->conns_unix ? s->conns_tcp - s->conns_unix : 0;
    if (nodes_json != NULL) {
        for (n = m->nodes; n != NULL; n = n->next) {
            kvf_m_json_safe(n->segment, seg, sizeof(seg));
            kvf_hbuf_printf(nodes_json,
                            "%s{\"segment\":\"%s\",\"gen\":%lu,"
                            "\"capacity\":%lu,\"used\":%lu,"
                            "\"largest_free\":%lu,\"free_blocks\":%zu,"
                            "\"heartbeat_age_ms\":%lu}",
                            first ? "" : ",", seg, (unsigned long)n->gen,
                            (unsigned long)n->pa.len, (unsigned long)n->pa.used,
                            (unsigned long)kvf_pa_largest_free(&n->pa),
                            n->pa.nfree, (unsigned long)(now - n->last_hb_ms));
            first = 0;
        }
    }
    pthread_mutex_unlock(&m->lock);
}

static void kvf_m_metric(kvf_hbuf_t *b, const char *name, const char *type,
                         const char *help, uint64_t v)
{
    kvf_hbuf_printf(b,
                    "# HELP kvferry_store_%s %s\n# TYPE kvferry_store_%s "
                    "%s\nkvferry_store_%s %lu\n",
                    name, help, name, type, name, (unsigned long)v);
}

static void kvf_m_metrics(kvf_master_t *m, kvf_hbuf_t *b)
{
    kvf_m_snap_t s;

    kvf_m_snapshot(m, &s, NULL);
    kvf_m_metric(b, "nodes", "gauge", "storage nodes alive", s.nodes);
    kvf_m_metric(b, "capacity_bytes", "gauge", "bytes of all node pools",
                 s.capacity);
    kvf_m_metric(b, "used_bytes", "gauge", "bytes allocated to objects",
                 s.used);
    kvf_m_metric(b, "objects", "gauge", "objects (committed and pending)",
                 s.objects);
    kvf_m_metric(b, "pending_puts", "gauge", "puts not yet committed",
                 s.pending);
    kvf_m_metric(b, "removing", "gauge",
                 "objects removed, space kept until their read lease ends",
                 s.removing);
    kvf_m_metric(b, "reserved_bytes", "gauge",
                 "bytes reserved for clients' next puts (not in used_bytes)",
                 s.reserved);
    kvf_m_metric(b, "reservations", "gauge",
                 "reservations held by clients for their next put",
                 s.reservations);
    kvf_m_metric(b, "connections_tcp", "gauge", "RPC connections open over tcp",
                 s.conns_tcp);
    kvf_m_metric(b, "connections_unix", "gauge",
                 "RPC connections open over the abstract unix socket",
                 s.conns_unix);
    kvf_m_metric(b, "hits_total", "counter", "gets that found the key",
                 s.st.hits);
    kvf_m_metric(b, "misses_total", "counter", "gets that did not",
                 s.st.misses);
    kvf_m_metric(b, "evictions_total", "counter", "objects evicted",
                 s.st.evictions);
    kvf_m_metric(b, "errors_total", "counter", "bad frames, failed allocations",
                 s.st.errors);
    kvf_m_metric(b, "puts_total", "counter", "puts committed", s.st.puts);
    kvf_m_metric(b, "removes_total", "counter", "objects removed",
                 s.st.removes);
    kvf_m_metric(b, "reclaimed_total", "counter",
                 "puts never committed, reclaimed", s.st.reclaimed);
    kvf_m_metric(b, "aborted_total", "counter", "puts aborted by clients",
                 s.st.aborted);
    kvf_m_metric(b, "nodes_lost_total", "counter", "nodes dropped",
                 s.st.nodes_lost);
    kvf_m_metric(b, "objects_lost_total", "counter",
                 "objects lost with their last replica", s.st.objects_lost);
}

static void kvf_m_status(kvf_master_t *m, kvf_hbuf_t *b)
{
    kvf_hbuf_t nodes = {0};
    kvf_m_snap_t s;

    kvf_m_snapshot(m, &s, &nodes);
    kvf_hbuf_printf(
        b,
        "{\"epoch\":\"%016lx\",\"nodes\":%zu,\"capacity\":%lu,"
        "\"used\":%lu,\"objects\":%zu,\"pending\":%zu,\"removing\":%zu,"
        "\"reserved\":%lu,\"reservations\":%zu,"
        "\"connections\":{\"tcp\":%u,\"unix\":%u},\"unix_socket\":\"%s\","
        "\"hits\":%lu,\"misses\":%lu,\"evictions\":%lu,"
        "\"errors\":%lu,\"puts\":%lu,\"removes\":%lu,"
        "\"reclaimed\":%lu,\"aborted\":%lu,\"nodes_lost\":%lu,"
        "\"objects_lost\":%lu,\"node_list\":[%s]}\n",
        (unsigned long)s.epoch, s.nodes, (unsigned long)s.capacity,
        (unsigned long)s.used, s.objects, s.pending, s.removing,
        (unsigned long)s.reserved, s.reservations, s.conns_tcp, s.conns_unix,
        m->ufd >= 0 ? m->unix_name : "", (unsigned long)s.st.hits,
        (unsigned long)s.st.misses, (unsigned long)s.st.evictions,
        (unsigned long)s.st.errors, (unsigned long)s.st.puts,
        (unsigned long)s.st.removes, (unsigned long)s.st.reclaimed,
        (unsigned long)s.st.aborted, (unsigned long)s.st.nodes_lost,
        (unsigned long)s.st.objects_lost, nodes.p ? nodes.p : "");
    kvf_free(nodes.p);
}

static void kvf_m_http_reply(int fd, int code, const char *ctype,
                             const char *body, size_t len)
{
    char hdr[256];
    int n;

    n = snprintf(hdr, sizeof(hdr),
                 "HTTP/1.0 %d %s\r\nContent-Type: %s\r\n"
                 "Content-Length: %zu\r\nConnection: close\r\n\r\n",
                 code,
                 code == 200   ? "OK"
                 : code == 404 ? "Not Found"
                 : code == 405 ? "Method Not Allowed"
                               : "Bad Request",
                 ctype, len);
    if (kvf_sock_send_all(fd, hdr, (size_t)n, kvf_time_ms() + KVF_HTTP_IO_MS) ==
            KVF_OK &&
        len > 0) {
        kvf_sock_send_all(fd, body, len, kvf_time_ms() + KVF_HTTP_IO_MS);
    }
}

static void kvf_m_http_serve(kvf_master_t *m, int fd)
{
    uint64_t deadline = kvf_time_ms() + KVF_HTTP_IO_MS;
    char req[KVF_HTTP_REQ_MAX + 1], *sp, *path, *end;
    kvf_hbuf_t b = {0};
    size_t len = 0;
    ssize_t n;

    while (len < KVF_HTTP_REQ_MAX) {
        if (kvf_sock_wait(fd, POLLIN, deadline) != KVF_OK) {
            return;
        }
        n = recv(fd, req + len, KVF_HTTP_REQ_MAX - len, MSG_DONTWAIT);
        if (n <= 0) {
            return;
        }
        len += (size_t)n;
        req[len] = '\0';
        if (strstr(req, "\r\n\r\n") != NULL || strstr(req, "\n\n") != NULL) {
            break;
        }
    }
    req[len] = '\0';
    sp = strchr(req, ' ');
    if (sp == NULL) {
        kvf_m_http_reply(fd, 400, "text/plain", "bad request\n", 12);
        return;
    }
    *sp = '\0';
    path = sp + 1;
    end = strpbrk(path, " \r\n?");
    if (end != NULL) {
        *end = '\0';
    }
    if (strcmp(req, "GET") != 0) {
        kvf_m_http_reply(fd, 405, "text/plain", "only GET\n", 9);
        return;
    }
    if (strcmp(path, "/metrics") == 0) {
        kvf_m_metrics(m, &b);
        if (!b.failed) {
            kvf_m_http_reply(fd, 200, "text/plain; version=0.0.4", b.p, b.len);
        }
    } else if (strcmp(path, "/status") == 0) {
        kvf_m_status(m, &b);
        if (!b.failed) {
            kvf_m_http_reply(fd, 200, "application/json", b.p, b.len);
        }
    } else {
        kvf_m_http_reply(fd, 404, "text/plain", "try /metrics or /status\n",
                         24);
    }
    kvf_free(b.p);
}

static void *kvf_m_http_main(void *arg)
{
    kvf_master_t *m = arg;
    int fd;

    while (!__atomic_load_n(&m->stop, __ATOMIC_ACQUIRE)) {
        if (kvf_sock_wait(m->hfd, POLLIN, kvf_time_ms() + 250) != KVF_OK) {
            continue;
        }
        fd = accept4(m->hfd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0) {
            continue;
        }
        kvf_m_http_serve(m, fd);
        close(fd);
    }
    return NULL;
}

kvf_status_t kvf_m_http_start(kvf_master_t *m, const char *listen)
{
    char host[KVF_HOST_MAX];
    kvf_status_t st;
    uint16_t port;

    st = kvf_sock_parse_addr(listen, host, sizeof(host), &port);
    if (st == KVF_OK) {
        st = kvf_sock_listen(host, port, 64, &m->hfd, &port);
    }
    if (st != KVF_OK) {
        kvf_error("master cannot serve http on %s", listen);
        return st;
    }
    snprintf(m->http_address, sizeof(m->http_address), "%s:%u", host, port);
    if (pthread_create(&m->http_thread, NULL, kvf_m_http_main, m) != 0) {
        close(m->hfd);
        m->hfd = -1;
        return KVF_ERR_NO_RESOURCE;
    }
    m->have_http = 1;
    return KVF_OK;
}

void kvf_m_http_stop(kvf_master_t *m)
{
    if (!m->have_http) {
        return;
    }
    __atomic_store_n(&m->stop, 1, __ATOMIC_RELEASE);
    pthread_join(m->http_thread, NULL);
    close(m->hfd);
    m->have_http = 0;
}
