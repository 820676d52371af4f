/*
 * The master's HTTP endpoint: GET /metrics (Prometheus text format 0.0.4)
 * and GET /status (JSON) with nodes, capacity, used, objects, hits,
 * misses, evictions, errors and the rest of the counters; other paths get
 * 404, other methods 405. /metrics and /status need the header
 * `Authorization: Bearer <token>` (core/auth kvf_auth_http_token, derived
 * from the cluster secret), else 401; GET /health answers "ok" to anyone.
 * With authentication off (insecure=1, no secret) nothing needs the
 * token, and /status leaves out the node list (node addresses are for
 * authenticated callers only). libmicrohttpd serves it from one internal
 * thread polling every connection, so idle or slow clients do not hold
 * up others (docs/decisions/config-http.md). Connections idle for
 * KVF_HTTP_IDLE_S are closed, at most KVF_HTTP_PER_ADDR are open from
 * one address (more are closed at once) and KVF_HTTP_CONNS in all, so
 * idle connections from a few hosts cannot make a scrape wait.
 *
 * Unless --http (config master_http) names one, the address is the RPC
 * address's host with the RPC port + 1 (a free port when that is 0), so
 * masters on one host with different --listen ports never collide.
 */
#include "store/master/master_int.h"
#include "core/alloc.h"
#include "core/auth.h"
#include "core/log.h"
#include "core/time.h"

#include <microhttpd.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define KVF_HTTP_IDLE_S   3   /* an idle connection is closed after this */
#define KVF_HTTP_CONNS    256 /* connections open at once, at most */
#define KVF_HTTP_PER_ADDR 8   /* ... from one address */

typedef struct kvf_m_snap {
    kvf_master_stats_t st;
    uint64_t capacity, used, reserved, epoch;
    size_t nodes, objects, pending, removing, reservations;
    unsigned conns_tcp, conns_unix;
    /* disk tiers: objects on disk only, the tiers' bytes, tiers off */
    size_t disk_only;
    uint64_t disk_capacity, disk_used;
    size_t tiers, tiers_off;
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
    s->disk_only = m->ndisk_only;
    s->disk_capacity = s->disk_used = 0;
    s->tiers = s->tiers_off = 0;
    for (n = m->nodes; n != NULL; n = n->next) {
        s->tiers += n->dpa.len > 0;
        s->tiers_off += n->dpa.len > 0 && !n->tier_on;
        s->disk_capacity += n->tier_on ? n->dpa.len : 0;
        s->disk_used += n->tier_on ? n->dpa.used : 0;
    }
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
                            "\"heartbeat_age_ms\":%lu,\"disk\":{\"capacity\":"
                            "%lu,\"used\":%lu,\"on\":%d}}",
                            first ? "" : ",", seg, (unsigned long)n->gen,
                            (unsigned long)n->pa.len, (unsigned long)n->pa.used,
                            (unsigned long)kvf_pa_largest_free(&n->pa),
                            n->pa.nfree, (unsigned long)(now - n->last_hb_ms),
                            (unsigned long)n->dpa.len,
                            (unsigned long)n->dpa.used, n->tier_on);
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

/* The disk tiers' part of /metrics (store/master/tier.c). */
static void kvf_m_tier_metrics(kvf_hbuf_t *b, const kvf_m_snap_t *s)
{
    kvf_m_metric(b, "objects_disk_only", "gauge",
                 "objects whose replicas are all on disk tiers", s->disk_only);
    kvf_m_metric(b, "objects_in_memory", "gauge",
                 "objects with a replica in a pool", s->objects - s->disk_only);
    kvf_m_metric(b, "disk_capacity_bytes", "gauge",
                 "bytes of the disk tiers that are on", s->disk_capacity);
    kvf_m_metric(b, "disk_used_bytes", "gauge",
                 "bytes of the disk tiers holding objects", s->disk_used);
    kvf_m_metric(b, "disk_tiers", "gauge", "nodes with a disk tier", s->tiers);
    kvf_m_metric(b, "disk_tiers_off", "gauge",
                 "disk tiers turned off after a failure", s->tiers_off);
    kvf_m_metric(b, "tier_writes_total", "counter",
                 "objects copied to a disk tier", s->st.tier_writes);
    kvf_m_metric(b, "tier_write_bytes_total", "counter",
                 "bytes copied to disk tiers", s->st.tier_write_bytes);
    kvf_m_metric(b, "tier_reads_total", "counter",
                 "gets served from a disk tier (loaded into a pool)",
                 s->st.tier_reads);
    kvf_m_metric(b, "tier_read_bytes_total", "counter",
                 "bytes loaded from disk tiers", s->st.tier_read_bytes);
    kvf_m_metric(b, "tier_corrupt_total", "counter",
                 "disk copies whose bytes failed their checksum (dropped)",
                 s->st.tier_corrupt);
    kvf_m_metric(b, "tier_errors_total", "counter",
                 "tier operations that failed", s->st.tier_errors);
    kvf_m_metric(b, "tier_demotions_total", "counter",
                 "objects evicted from a pool that stayed on disk",
                 s->st.tier_demotions);
    kvf_m_metric(b, "tier_evictions_total", "counter",
                 "objects evicted from a full disk tier for good",
                 s->st.tier_evictions);
    kvf_m_metric(b, "unleased_total", "counter",
                 "gets served without a read lease (client over its budget)",
                 s->st.unleased);
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
    kvf_m_tier_metrics(b, &s);
}

static void kvf_m_status(kvf_master_t *m, kvf_hbuf_t *b)
{
    kvf_hbuf_t nodes = {0};
    kvf_m_snap_t s;
    uint64_t term;
    /* -1: the only master; 0: standby or deposed; 1: the leader */
    int leader = kvf_m_leader_state(m, &term);

    kvf_m_snapshot(m, &s, &nodes);
    if (m->http_token[0] == '\0' && nodes.p != NULL) {
        nodes.p[0] = '\0'; /* no authenticated caller: no addresses */
    }
    kvf_hbuf_printf(
        b,
        "{\"epoch\":\"%016lx\",\"leader\":%d,\"term\":%lu,"
        "\"nodes\":%zu,\"capacity\":%lu,"
        "\"used\":%lu,\"objects\":%zu,\"pending\":%zu,\"removing\":%zu,"
        "\"reserved\":%lu,\"reservations\":%zu,"
        "\"connections\":{\"tcp\":%u,\"unix\":%u},\"unix_socket\":\"%s\","
        "\"hits\":%lu,\"misses\":%lu,\"evictions\":%lu,"
        "\"errors\":%lu,\"puts\":%lu,\"removes\":%lu,"
        "\"reclaimed\":%lu,\"aborted\":%lu,\"nodes_lost\":%lu,"
        "\"objects_lost\":%lu,\"objects_disk_only\":%zu,"
        "\"disk_capacity\":%lu,\"disk_used\":%lu,\"disk_tiers_off\":%zu,"
        "\"tier_reads\":%lu,\"tier_writes\":%lu,\"tier_corrupt\":%lu,"
        "\"node_list\":[%s]}\n",
        (unsigned long)s.epoch, leader, (unsigned long)term, s.nodes,
        (unsigned long)s.capacity, (unsigned long)s.used, s.objects, s.pending,
        s.removing, (unsigned long)s.reserved, s.reservations, s.conns_tcp,
        s.conns_unix, m->ufd >= 0 ? m->unix_name : "", (unsigned long)s.st.hits,
        (unsigned long)s.st.misses, (unsigned long)s.st.evictions,
        (unsigned long)s.st.errors, (unsigned long)s.st.puts,
        (unsigned long)s.st.removes, (unsigned long)s.st.reclaimed,
        (unsigned long)s.st.aborted, (unsigned long)s.st.nodes_lost,
        (unsigned long)s.st.objects_lost, s.disk_only,
        (unsigned long)s.disk_capacity, (unsigned long)s.disk_used,
        s.tiers_off, (unsigned long)s.st.tier_reads, (unsigned long)s.st.tier_writes,
        (unsigned long)s.st.tier_corrupt, nodes.p ? nodes.p : "");
    kvf_free(nodes.p);
}

/* Queues one reply; an HTTP/1.0 request gets an HTTP/1.0 status line. */
static enum MHD_Result kvf_m_http_reply(struct MHD_Connection *c, int http10,
                                        unsigned code, const char *ctype,
                                        const char *body, size_t len)
{
    struct MHD_Response *r;
    enum MHD_Result ret;

    r = MHD_create_response_from_buffer(len, (void *)(uintptr_t)body,
                                        MHD_RESPMEM_MUST_COPY);
    if (r == NULL) {
        return MHD_NO;
    }
    if (http10) {
        MHD_set_response_options(r, MHD_RF_HTTP_1_0_SERVER, MHD_RO_END);
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    ret = MHD_queue_response(c, code, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result kvf_m_http_serve(void *cls, struct MHD_Connection *c,
                                        const char *url, const char *method,
                                        const char *version,
                                        const char *upload_data,
                                        size_t *upload_size, void **con_cls)
{
    static const char *const bad = "try /metrics or /status\n";
    int http10 = strcmp(version, MHD_HTTP_VERSION_1_0) == 0;
    kvf_master_t *m = cls;
    kvf_hbuf_t b = {0};
    enum MHD_Result ret;

    (void)upload_data;
    if (strcmp(method, MHD_HTTP_METHOD_GET) != 0) {
        *upload_size = 0; /* a body is not read */
        return kvf_m_http_reply(c, http10, MHD_HTTP_METHOD_NOT_ALLOWED,
                                "text/plain", "only GET\n", 9);
    }
    if (*con_cls == NULL) { /* headers only: answer on the next call */
        *con_cls = m;
        return MHD_YES;
    }
    if (strcmp(url, "/health") == 0) {
        return kvf_m_http_reply(c, http10, MHD_HTTP_OK, "text/plain", "ok\n",
                                3);
    }
    if (m->http_token[0] != '\0' &&
        !kvf_auth_bearer_ok(
            MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization"),
            m->http_token)) {
        return kvf_m_http_reply(c, http10, MHD_HTTP_UNAUTHORIZED, "text/plain",
                                "authorization required\n", 23);
    }
    if (strcmp(url, "/metrics") == 0) {
        kvf_m_metrics(m, &b);
        ret = b.failed
                  ? MHD_NO
                  : kvf_m_http_reply(c, http10, MHD_HTTP_OK,
                                     "text/plain; version=0.0.4", b.p, b.len);
    } else if (strcmp(url, "/status") == 0) {
        kvf_m_status(m, &b);
        ret = b.failed ? MHD_NO
                       : kvf_m_http_reply(c, http10, MHD_HTTP_OK,
                                          "application/json", b.p, b.len);
    } else {
        ret = kvf_m_http_reply(c, http10, MHD_HTTP_NOT_FOUND, "text/plain", bad,
                               strlen(bad));
    }
    kvf_free(b.p);
    return ret;
}

/* The expected Authorization value, or "" when authentication is off. */
static kvf_status_t kvf_m_http_auth_init(kvf_master_t *m, const char *host)
{
    char token[KVF_AUTH_TOKEN_LEN + 1];
    kvf_status_t st;

    st = kvf_auth_check_bind(host);
    if (st == KVF_OK) {
        st = kvf_auth_http_token(host, token, sizeof(token));
    }
    if (st == KVF_OK) {
        snprintf(m->http_token, sizeof(m->http_token), "%s%s",
                 token[0] ? "Bearer " : "", token);
    }
    return st;
}

/* The listening socket: host:port, or for "auto" the RPC address's
 * host and port + 1 (a free port when that port is taken or the RPC
 * port is the last). */
static kvf_status_t kvf_m_http_listen(kvf_master_t *m, const char *listen,
                                      char *host, size_t hostlen,
                                      uint16_t *port_p)
{
    int derived = strcmp(listen, "auto") == 0;
    kvf_status_t st;
    uint16_t port;

    st = kvf_sock_parse_addr(derived ? m->address : listen, host, hostlen,
                             &port);
    if (st == KVF_OK && derived) {
        port = port < 65535 ? port + 1 : 0;
    }
    if (st == KVF_OK) {
        st = kvf_m_http_auth_init(m, host);
    }
    if (st == KVF_OK) {
        st = kvf_sock_listen(host, port, 64, &m->hfd, port_p);
    }
    if (st != KVF_OK && derived && port != 0) {
        kvf_warn("master: http port %u (the RPC port + 1) is taken; serving "
                 "http on a free port (set --http to choose)",
                 port);
        st = kvf_sock_listen(host, 0, 64, &m->hfd, port_p);
    }
    return st;
}

kvf_status_t kvf_m_http_start(kvf_master_t *m, const char *listen)
{
    char host[KVF_HOST_MAX];
    kvf_status_t st;
    uint16_t port;

    st = kvf_m_http_listen(m, listen, host, sizeof(host), &port);
    if (st != KVF_OK) {
        kvf_error("master cannot serve http on %s", listen);
        return st;
    }
    snprintf(m->http_address, sizeof(m->http_address), "%s:%u", host, port);
    m->httpd = MHD_start_daemon(
        MHD_USE_POLL_INTERNAL_THREAD | MHD_USE_ITC, 0, NULL, NULL,
        kvf_m_http_serve, m, MHD_OPTION_LISTEN_SOCKET, m->hfd,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)KVF_HTTP_IDLE_S,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)KVF_HTTP_CONNS,
        MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)KVF_HTTP_PER_ADDR,
        MHD_OPTION_END);
    if (m->httpd == NULL) {
        kvf_error("master cannot start its http server on %s", m->http_address);
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
    MHD_stop_daemon(m->httpd); /* closes the listening socket too */
    m->httpd = NULL;
    m->hfd = -1;
    m->have_http = 0;
}
