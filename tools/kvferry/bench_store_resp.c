/*
 * A second Redis client for `kvferry bench store --vs-redis`, timed the
 * way the store's clients are. redis-benchmark runs every client on one
 * event-loop thread and times a request from its write to the first read
 * event of its reply: the rest of a large reply, and the wait of a reply
 * behind the other clients' on that thread, fall outside its latency.
 * The store's bench times each call on its own thread from the call to
 * the last byte (and the checksum). Here CLIENTS threads, each with its
 * own connection to the same redis-server, send SET and then GET of the
 * same keys as the store's phases (RESP over blocking sockets, 5 s
 * timeouts) for a phase's duration and time each from before the send to
 * the last byte of the reply; a GET counts only if its reply is the value
 * (length and bytes). Rows: system "redis-thr", ops SET and GET; CPU per
 * operation = the threads' CPU plus the server's. These rows are printed
 * and recorded beside redis-benchmark's; the verdict stays with
 * redis-benchmark's.
 */
#include "tools/kvferry/bench_store.h"

#include "core/hash.h"
#include "core/sock.h"
#include "core/time.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <unistd.h>

#define KVF_RESP_TIMEOUT_MS 5000
#define KVF_RESP_LAT_FIRST  4096 /* samples room at start; doubles */

typedef struct kvf_resp_th {
    unsigned port, id, keys;
    uint64_t size;
    int get; /* 0: SET phase, 1: GET phase */
    uint64_t stop_ns;
    int fd;
    unsigned char *val, *rbuf;
    double *lat;
    size_t nlat, cap;
    long ops, errors;
    double cpu_s;
} kvf_resp_th_t;

static double kvf_resp_thread_cpu(void)
{
    struct rusage ru;

    if (getrusage(RUSAGE_THREAD, &ru) != 0) {
        return 0;
    }
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
}

/* Blocking sockets (one system call per wake-up, as a plain client
 * has), each wait bounded by SO_RCVTIMEO / SO_SNDTIMEO. */
static void kvf_resp_timeouts(int fd)
{
    struct timeval tv = {.tv_sec = KVF_RESP_TIMEOUT_MS / 1000,
                         .tv_usec = (KVF_RESP_TIMEOUT_MS % 1000) * 1000};

    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

static int kvf_resp_send(int fd, struct iovec *iov, int n)
{
    struct msghdr mh;
    ssize_t w;

    while (n > 0) {
        memset(&mh, 0, sizeof(mh));
        mh.msg_iov = iov;
        mh.msg_iovlen = (size_t)n;
        w = sendmsg(fd, &mh, MSG_NOSIGNAL);
        if (w <= 0) {
            return -1;
        }
        while (n > 0 && (size_t)w >= iov->iov_len) {
            w -= (ssize_t)iov->iov_len;
            iov++;
            n--;
        }
        if (n > 0) {
            iov->iov_base = (char *)iov->iov_base + w;
            iov->iov_len -= (size_t)w;
        }
    }
    return 0;
}

/* Reads exactly len bytes. */
static int kvf_resp_recv_all(int fd, unsigned char *buf, size_t len)
{
    ssize_t r;

    while (len > 0) {
        r = recv(fd, buf, len, 0);
        if (r <= 0) {
            return -1;
        }
        buf += r;
        len -= (size_t)r;
    }
    return 0;
}

/* Reads a reply line ending in \r\n into line (NUL-terminated); bytes
 * after it that arrived with it go to extra (*nextra). */
static int kvf_resp_line(int fd, char *line, size_t cap, unsigned char *extra,
                         size_t *nextra)
{
    size_t have = 0, i;
    ssize_t r;

    for (;;) {
        r = recv(fd, line + have, cap - 1 - have, 0);
        if (r <= 0) {
            return -1;
        }
        have += (size_t)r;
        for (i = 0; i + 1 < have; i++) {
            if (line[i] == '\r' && line[i + 1] == '\n') {
                *nextra = have - (i + 2);
                memcpy(extra, line + i + 2, *nextra);
                line[i] = '\0';
                return 0;
            }
        }
        if (have >= cap - 1) {
            return -1;
        }
    }
}

/* One SET or GET of key; 0 when the reply is the expected one. */
static int kvf_resp_op(kvf_resp_th_t *t, const char *key)
{
    char hdr[160], line[128];
    unsigned char extra[128];
    struct iovec iov[3];
    size_t klen = strlen(key), nextra = 0, want;
    int n;

    if (t->get) {
        n = snprintf(hdr, sizeof(hdr), "*2\r\n$3\r\nGET\r\n$%zu\r\n%s\r\n",
                     klen, key);
        iov[0].iov_base = hdr;
        iov[0].iov_len = (size_t)n;
        if (kvf_resp_send(t->fd, iov, 1) != 0 ||
            kvf_resp_line(t->fd, line, sizeof(line), extra, &nextra) != 0) {
            return -1;
        }
        if (line[0] != '$' || strtoull(line + 1, NULL, 10) != t->size) {
            return 1; /* a miss or another value: not counted */
        }
        want = (size_t)t->size + 2;
        if (nextra > want) {
            return -1;
        }
        memcpy(t->rbuf, extra, nextra);
        if (kvf_resp_recv_all(t->fd, t->rbuf + nextra, want - nextra) != 0) {
            return -1;
        }
        return memcmp(t->rbuf, t->val, (size_t)t->size) != 0 ? 1 : 0;
    }
    n = snprintf(hdr, sizeof(hdr), "*3\r\n$3\r\nSET\r\n$%zu\r\n%s\r\n$%lu\r\n",
                 klen, key, (unsigned long)t->size);
    iov[0].iov_base = hdr;
    iov[0].iov_len = (size_t)n;
    iov[1].iov_base = t->val;
    iov[1].iov_len = (size_t)t->size;
    iov[2].iov_base = (void *)"\r\n";
    iov[2].iov_len = 2;
    if (kvf_resp_send(t->fd, iov, 3) != 0 ||
        kvf_resp_line(t->fd, line, sizeof(line), extra, &nextra) != 0) {
        return -1;
    }
    return (strcmp(line, "+OK") == 0 && nextra == 0) ? 0 : 1;
}

/* Room for one more latency sample; 0 when there is. */
static int kvf_resp_room(kvf_resp_th_t *t)
{
    double *nv;

    if (t->nlat < t->cap) {
        return 0;
    }
    nv = realloc(t->lat, 2 * t->cap * sizeof(*nv));
    if (nv == NULL) {
        return -1;
    }
    t->lat = nv;
    t->cap *= 2;
    return 0;
}

static void *kvf_resp_thread(void *arg)
{
    kvf_resp_th_t *t = arg;
    double cpu0 = kvf_resp_thread_cpu();
    char key[64];
    uint64_t t0, t1;
    unsigned i = 0;
    int st;

    while (kvf_time_ns() < t->stop_ns) {
        snprintf(key, sizeof(key), "kvfr:%u:%u", t->id, i++ % t->keys);
        t0 = kvf_time_ns();
        st = kvf_resp_op(t, key);
        t1 = kvf_time_ns();
        if (st < 0) {
            t->errors++;
            break; /* the connection is gone or timed out */
        }
        if (st > 0) {
            t->errors++;
            continue;
        }
        if (kvf_resp_room(t) != 0) {
            t->errors++; /* out of memory: a sample lost is an error */
            break;
        }
        t->lat[t->nlat++] = (double)(t1 - t0) / 1e3;
        t->ops++;
    }
    t->cpu_s = kvf_resp_thread_cpu() - cpu0;
    return NULL;
}

static void kvf_resp_row(kvf_bs_row_t *r, const char *op, uint64_t size,
                         unsigned clients, kvf_resp_th_t *th, double secs,
                         double srv_cpu_s)
{
    size_t n = 0, k = 0;
    double cpu = 0, *all;
    unsigned i;

    memset(r, 0, sizeof(*r));
    for (i = 0; i < clients; i++) {
        n += th[i].nlat;
        r->ops += th[i].ops;
        r->errors += th[i].errors;
        cpu += th[i].cpu_s;
    }
    all = malloc((n ? n : 1) * sizeof(*all));
    if (all != NULL) {
        for (i = 0; i < clients; i++) {
            memcpy(all + k, th[i].lat, th[i].nlat * sizeof(*all));
            k += th[i].nlat;
        }
        r->p50_us = kvf_bench_quantile(all, n, 0.5);
        r->p99_us = kvf_bench_quantile(all, n, 0.99);
        r->p999_us = kvf_bench_quantile(all, n, 0.999);
        free(all);
    }
    snprintf(r->op, sizeof(r->op), "%s", op);
    snprintf(r->system, sizeof(r->system), "redis-thr");
    r->size = size;
    r->clients = clients;
    r->seconds = secs;
    r->ops_s = secs > 0 ? (double)r->ops / secs : 0;
    r->gb_s = r->ops_s * (double)size / 1e9;
    r->cpu_us_op = (r->ops > 0 && srv_cpu_s >= 0)
                       ? (cpu + srv_cpu_s) * 1e6 / (double)r->ops
                       : -1;
}

int kvf_bs_resp(unsigned port, pid_t srv, uint64_t size, unsigned clients,
                unsigned keys_per_thread, double seconds, kvf_bs_row_t *set_row,
                kvf_bs_row_t *get_row)
{
    kvf_resp_th_t *th = calloc(clients, sizeof(*th));
    pthread_t *tid = calloc(clients, sizeof(*tid));
    kvf_bs_row_t *rows[2] = {set_row, get_row};
    static const char *const ops[2] = {"SET", "GET"};
    double srv0, srv1, secs;
    unsigned i, started;
    kvf_rng_t rng;
    int phase, rc = -1;
    uint64_t t0;

    if (th == NULL || tid == NULL || clients == 0) {
        goto out;
    }
    for (i = 0; i < clients; i++) {
        th[i].fd = -1;
        th[i].port = port;
        th[i].id = i;
        th[i].keys = keys_per_thread ? keys_per_thread : 1;
        th[i].size = size;
        th[i].val = malloc((size_t)size + 1);
        th[i].rbuf = malloc((size_t)size + 2);
        th[i].cap = KVF_RESP_LAT_FIRST;
        th[i].lat = malloc(th[i].cap * sizeof(*th[i].lat));
        if (th[i].val == NULL || th[i].rbuf == NULL || th[i].lat == NULL ||
            kvf_sock_connect("127.0.0.1", (uint16_t)port, KVF_RESP_TIMEOUT_MS,
                             &th[i].fd) != KVF_OK) {
            goto out;
        }
        kvf_resp_timeouts(th[i].fd);
        kvf_rng_seed(&rng, 0x7265646973ull + i);
        kvf_rng_fill(&rng, th[i].val, (size_t)size);
    }
    for (phase = 0; phase < 2; phase++) {
        srv0 = kvf_bs_proc_cpu_s(srv);
        t0 = kvf_time_ns();
        for (i = 0; i < clients; i++) {
            th[i].get = phase;
            th[i].stop_ns = t0 + (uint64_t)(seconds * 1e9);
            th[i].nlat = 0;
            th[i].ops = th[i].errors = 0;
        }
        for (started = 0; started < clients; started++) {
            if (pthread_create(&tid[started], NULL, kvf_resp_thread,
                               &th[started]) != 0) {
                break;
            }
        }
        for (i = 0; i < started; i++) {
            pthread_join(tid[i], NULL);
        }
        secs = (double)(kvf_time_ns() - t0) / 1e9;
        srv1 = kvf_bs_proc_cpu_s(srv);
        if (started < clients) {
            goto out;
        }
        kvf_resp_row(rows[phase], ops[phase], size, clients, th, secs,
                     (srv0 >= 0 && srv1 >= srv0) ? srv1 - srv0 : -1);
    }
    rc = (set_row->ops > 0 && get_row->ops > 0) ? 0 : -1;
out:
    for (i = 0; th != NULL && i < clients; i++) {
        if (th[i].fd >= 0) {
            close(th[i].fd);
        }
        free(th[i].val);
        free(th[i].rbuf);
        free(th[i].lat);
    }
    free(th);
    free(tid);
    if (rc != 0) {
        fprintf(stderr, "kvferry: the per-call Redis client failed\n");
    }
    return rc;
}
