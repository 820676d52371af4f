/*
 * The Redis comparison of `kvferry bench store --vs-redis`: starts
 * redis-server (Debian package) on 127.0.0.1 on a free port of its own,
 * without persistence (--save "" --appendonly no), runs redis-benchmark
 * with the same value size, number of clients and number of distinct keys
 * as the store's phases (-t set, then -t get; -d SIZE -c CLIENTS -r KEYS
 * -n REQUESTS --csv), parses its CSV (rps and latency percentiles), takes
 * the CPU the server and the benchmark used in each (/proc/PID/stat,
 * wait4), and stops the server. redis-benchmark stops after a count, not a
 * time: a short probe of each test gives its rate, and the measured run
 * asks for the requests of the store's phase duration at that rate, so
 * both systems' percentiles come from about as long a run (and as many
 * samples per second). SET runs at least 4 requests per key, so that GET
 * finds nearly every key (a missing key's reply is a few bytes: it could
 * only flatter Redis). After them, on the same server, the per-call
 * client of store_redis.c (timed like the store's clients). Redis is
 * what many users would
 * put in the store's place (LMCache ships a redis:// backend), so it is the bar
 * the store is measured against, in the same run.
 */
#include "tools/bench/store.h"

#include "core/sock.h"
#include "tools/cli/net.h"
#include "core/time.h"
#include "core/rng.h"

#include <hiredis/hiredis.h>

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

static unsigned kvf_bs_free_port(void)
{
    uint16_t port = 0;
    int fd;

    if (kvf_sock_listen("127.0.0.1", 0, 1, &fd, &port) != KVF_OK) {
        return 0;
    }
    close(fd);
    return port;
}

static pid_t kvf_bs_spawn_quiet(char *const argv[], int out_fd)
{
    pid_t pid = fork();
    int null;

    if (pid != 0) {
        return pid;
    }
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    null = open("/dev/null", O_RDWR);
    dup2(out_fd >= 0 ? out_fd : null, STDOUT_FILENO);
    dup2(null, STDERR_FILENO);
    dup2(null, STDIN_FILENO);
    execvp(argv[0], argv);
    _exit(127);
}

/* Parses one CSV row: "NAME","rps","avg","min","p50","p95","p99","max". */
static int kvf_bs_redis_row(const char *line, const char *name,
                            kvf_bs_row_t *row)
{
    char want[32];
    double v[7];
    const char *p;
    int i;

    snprintf(want, sizeof(want), "\"%s\",", name);
    if (strncmp(line, want, strlen(want)) != 0) {
        return -1;
    }
    p = line + strlen(want);
    for (i = 0; i < 7; i++) {
        while (*p == '"' || *p == ',') {
            p++;
        }
        v[i] = strtod(p, (char **)&p);
    }
    row->ops_s = v[0];
    row->p50_us = v[3] * 1000.0;
    row->p99_us = v[5] * 1000.0;
    row->p999_us = v[6] * 1000.0; /* redis-benchmark's CSV stops at max */
    return 0;
}

double kvf_bs_proc_cpu_s(pid_t pid)
{
    char path[64], buf[1024], *p;
    unsigned long ut, st;
    ssize_t n;
    int fd;

    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    fd = open(path, O_RDONLY);
    if (fd < 0) {
        return -1;
    }
    n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0) {
        return -1;
    }
    buf[n] = '\0';
    /* after "(comm)": state is field 3, utime and stime fields 14, 15 */
    p = strrchr(buf, ')');
    if (p == NULL || sscanf(p + 2,
                            "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u "
                            "%lu %lu",
                            &ut, &st) != 2) {
        return -1;
    }
    return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

/* One redis-benchmark run of one test (set or get) against the server on
 * port; its CSV output goes to buf, *cpu_p gets the CPU seconds it used.
 * Bounded: it ends by itself, 10 minutes at most. */
static int kvf_bs_redis_bench(const char *port_s, const char *test,
                              const char *size_s, const char *cl_s,
                              const char *keys_s, long requests, char *buf,
                              size_t cap, double *cpu_p)
{
    char n_s[32];
    char *argv[] = {"redis-benchmark",
                    "-h",
                    "127.0.0.1",
                    "-p",
                    (char *)port_s,
                    "-t",
                    (char *)test,
                    "-d",
                    (char *)size_s,
                    "-c",
                    (char *)cl_s,
                    "-n",
                    n_s,
                    "--csv",
                    "-r",
                    (char *)keys_s,
                    NULL};
    uint64_t deadline = kvf_time_ms() + 600000;
    struct rusage ru;
    size_t len = 0;
    int fds[2], st;
    pid_t bench;
    ssize_t n;

    *cpu_p = -1;
    snprintf(n_s, sizeof(n_s), "%ld", requests);
    if (keys_s == NULL) {
        argv[14] = NULL; /* one key, redis-benchmark's default */
    }
    if (pipe(fds) < 0) {
        return -1;
    }
    bench = kvf_bs_spawn_quiet(argv, fds[1]);
    close(fds[1]);
    while (len + 1 < cap && kvf_sock_wait(fds[0], POLLIN, deadline) == KVF_OK) {
        n = read(fds[0], buf + len, cap - 1 - len);
        if (n <= 0) {
            break;
        }
        len += (size_t)n;
    }
    buf[len] = '\0';
    close(fds[0]);
    if (bench <= 0) {
        return -1;
    }
    if (kvf_time_ms() >= deadline) {
        kill(bench, SIGTERM);
    }
    if (wait4(bench, &st, 0, &ru) == bench && WIFEXITED(st) &&
        WEXITSTATUS(st) == 0) {
        *cpu_p = (double)ru.ru_utime.tv_sec +
                 (double)ru.ru_utime.tv_usec / 1e6 +
                 (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
    }
    return 0;
}

/* One test's row from a run's CSV; the CPU per request with srv_s, the
 * server's CPU seconds in the run. 0, or -1 if the CSV has no row. */
static int kvf_bs_redis_parse(char *buf, const char *name, long requests,
                              double srv_s, double bench_s, kvf_bs_row_t *row)
{
    char *line, *save;

    for (line = strtok_r(buf, "\r\n", &save); line != NULL;
         line = strtok_r(NULL, "\r\n", &save)) {
        if (kvf_bs_redis_row(line, name, row) == 0) {
            row->cpu_us_op = (srv_s >= 0 && bench_s >= 0)
                                 ? (srv_s + bench_s) * 1e6 / (double)requests
                                 : -1;
            row->ops = requests;
            return 0;
        }
    }
    return -1;
}

/* The requests of a measured run: the probe's rate x seconds. */
static long kvf_bs_redis_requests(const kvf_bs_row_t *probe, long requests,
                                  double seconds)
{
    double n = probe->ops_s * seconds;

    if (seconds <= 0 || probe->ops_s <= 0) {
        return requests;
    }
    return n < 2000 ? 2000 : n > 5e6 ? 5000000 : (long)n;
}

int kvf_bs_redis(uint64_t size, unsigned clients, unsigned keys, long requests,
                 double seconds, kvf_bs_row_t *set_row, kvf_bs_row_t *get_row)
{
    return kvf_bs_redis_both(size, clients, keys, requests, seconds, set_row,
                             get_row, NULL, NULL);
}

int kvf_bs_redis_both(uint64_t size, unsigned clients, unsigned keys,
                      long requests, double seconds, kvf_bs_row_t *set_row,
                      kvf_bs_row_t *get_row, kvf_bs_row_t *thr_rows,
                      unsigned *nthr_p)
{
    char port_s[16], size_s[32], cl_s[16], keys_s[16], buf[4096];
    static const char *const tests[2] = {"set", "get"};
    static const char *const names[2] = {"SET", "GET"};
    kvf_bs_row_t *rows[2] = {set_row, get_row}, probe;
    unsigned port = kvf_bs_free_port();
    double cpu_b, srv0, srv1;
    long n, probe_n;
    uint64_t deadline;
    int fd, st, i, ok = 0;
    pid_t srv;

    if (port == 0) {
        return -1;
    }
    snprintf(port_s, sizeof(port_s), "%u", port);
    {
        char *argv[] = {"redis-server", "--port",      port_s, "--bind",
                        "127.0.0.1",    "--save",      "",     "--appendonly",
                        "no",           "--daemonize", "no",   NULL};

        srv = kvf_bs_spawn_quiet(argv, -1);
    }
    if (srv < 0) {
        return -1;
    }
    deadline = kvf_time_ms() + 5000;
    while (kvf_sock_connect("127.0.0.1", (uint16_t)port, 200, &fd) != KVF_OK) {
        if (kvf_time_ms() > deadline || waitpid(srv, &st, WNOHANG) == srv) {
            fprintf(stderr, "kvferry: redis-server did not start (is the "
                            "redis-server package installed?)\n");
            kill(srv, SIGKILL);
            waitpid(srv, NULL, 0);
            return -1;
        }
        usleep(50000);
    }
    close(fd);
    snprintf(size_s, sizeof(size_s), "%lu", (unsigned long)size);
    snprintf(cl_s, sizeof(cl_s), "%u", clients);
    snprintf(keys_s, sizeof(keys_s), "%u", keys);
    memset(set_row, 0, sizeof(*set_row));
    memset(get_row, 0, sizeof(*get_row));
    probe_n = requests < 2000 ? requests : 2000;
    /* SET, then GET of the keys SET wrote: one test per run, so that
     * each one's CPU (server and benchmark) is its own */
    for (i = 0; i < 2; i++) {
        n = requests;
        if (seconds > 0) {
            memset(&probe, 0, sizeof(probe));
            if (kvf_bs_redis_bench(port_s, tests[i], size_s, cl_s,
                                   keys ? keys_s : NULL, probe_n, buf,
                                   sizeof(buf), &cpu_b) != 0 ||
                kvf_bs_redis_parse(buf, names[i], probe_n, 0, 0, &probe) != 0) {
                continue;
            }
            n = kvf_bs_redis_requests(&probe, requests, seconds);
        }
        if (i == 0 && n < 4l * (long)keys) {
            n = 4l * (long)keys;
        }
        srv0 = kvf_bs_proc_cpu_s(srv);
        if (kvf_bs_redis_bench(port_s, tests[i], size_s, cl_s,
                               keys ? keys_s : NULL, n, buf, sizeof(buf),
                               &cpu_b) != 0) {
            continue;
        }
        srv1 = kvf_bs_proc_cpu_s(srv);
        if (kvf_bs_redis_parse(buf, names[i], n,
                               (srv0 >= 0 && srv1 >= srv0) ? srv1 - srv0 : -1,
                               cpu_b, rows[i]) == 0) {
            ok++;
        }
    }
    if (nthr_p != NULL) {
        *nthr_p = 0;
    }
    if (thr_rows != NULL && ok == 2 && seconds > 0 &&
        kvf_bs_resp(port, srv, size, clients,
                    clients ? (keys + clients - 1) / clients : keys, seconds,
                    &thr_rows[0], &thr_rows[1]) == 0) {
        *nthr_p = 2;
    }
    kill(srv, SIGTERM);
    waitpid(srv, NULL, 0);
    if (ok != 2) {
        fprintf(stderr, "kvferry: redis-benchmark gave no SET/GET results "
                        "(is redis-tools installed?)\n");
        return -1;
    }
    for (i = 0; i < 2; i++) {
        snprintf(rows[i]->op, sizeof(rows[i]->op), "%s", names[i]);
        snprintf(rows[i]->system, sizeof(rows[i]->system), "redis");
        rows[i]->size = size;
        rows[i]->clients = clients;
        rows[i]->seconds = (double)rows[i]->ops / (rows[i]->ops_s + 1e-9);
        rows[i]->gb_s = rows[i]->ops_s * (double)size / 1e9;
    }
    return 0;
}

/*
 * A second Redis client for `kvferry bench store --vs-redis`, timed the
 * way the store's clients are. redis-benchmark runs every client on one
 * event-loop thread and times a request from its write to the first read
 * event of its reply: the rest of a large reply, and the wait of a reply
 * behind the other clients' on that thread, fall outside its latency.
 * The store's bench times each call on its own thread from the call to
 * the last byte (and the checksum). Here CLIENTS threads, each with its
 * own connection to the same redis-server, send SET and then GET of the
 * same keys as the store's phases (hiredis, blocking, 5 s timeouts) for
 * a phase's duration and time each call from before the send to the
 * whole reply; a GET counts only if its reply is the value (length and
 * bytes). Rows: system "redis-thr", ops SET and GET; CPU per
 * operation = the threads' CPU plus the server's. These rows are printed
 * and recorded beside redis-benchmark's; the verdict stays with
 * redis-benchmark's.
 */

#define KVF_RESP_TIMEOUT_MS 5000
#define KVF_RESP_LAT_FIRST  4096 /* samples room at start; doubles */

typedef struct kvf_resp_th {
    unsigned port, id, keys;
    uint64_t size;
    int get; /* 0: SET phase, 1: GET phase */
    uint64_t stop_ns;
    redisContext *c;
    unsigned char *val;
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

/* Sends a SET of key with the value in place: the request's head, the
 * value and its trailer in one sendmsg, so a large value is not copied
 * into a request buffer first (which would slow the client down, not
 * Redis). 0, or -1 when the connection failed. */
static int kvf_resp_send_set(kvf_resp_th_t *t, const char *key)
{
    char head[160];
    struct iovec iov[3], *v = iov;
    struct msghdr mh;
    size_t n = 3;
    ssize_t w;
    int len;

    len = snprintf(head, sizeof(head),
                   "*3\r\n$3\r\nSET\r\n$%zu\r\n%s\r\n$%lu\r\n", strlen(key),
                   key, (unsigned long)t->size);
    iov[0] = (struct iovec){head, (size_t)len};
    iov[1] = (struct iovec){t->val, (size_t)t->size};
    iov[2] = (struct iovec){(void *)"\r\n", 2};
    while (n > 0) {
        memset(&mh, 0, sizeof(mh));
        mh.msg_iov = v;
        mh.msg_iovlen = n;
        w = sendmsg(t->c->fd, &mh, MSG_NOSIGNAL);
        if (w <= 0) {
            return -1;
        }
        while (n > 0 && (size_t)w >= v->iov_len) {
            w -= (ssize_t)v->iov_len;
            v++;
            n--;
        }
        if (n > 0) {
            v->iov_base = (char *)v->iov_base + w;
            v->iov_len -= (size_t)w;
        }
    }
    return 0;
}

/* One SET or GET of key; 0 when the reply is the expected one, 1 when
 * it is another (a miss), -1 when the connection failed. hiredis reads
 * and parses every reply. */
static int kvf_resp_op(kvf_resp_th_t *t, const char *key)
{
    redisReply *r = NULL;
    int rc;

    if (t->get) {
        r = redisCommand(t->c, "GET %s", key);
    } else if (kvf_resp_send_set(t, key) == 0 &&
               redisGetReply(t->c, (void **)&r) != REDIS_OK) {
        r = NULL;
    }
    if (r == NULL) {
        return -1;
    }
    if (t->get) {
        rc = (r->type == REDIS_REPLY_STRING && r->len == (size_t)t->size &&
              memcmp(r->str, t->val, (size_t)t->size) == 0)
                 ? 0
                 : 1;
    } else {
        rc = (r->type == REDIS_REPLY_STATUS && strcmp(r->str, "OK") == 0) ? 0
                                                                          : 1;
    }
    freeReplyObject(r);
    return rc;
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
    const struct timeval tv = {.tv_sec = KVF_RESP_TIMEOUT_MS / 1000,
                               .tv_usec = (KVF_RESP_TIMEOUT_MS % 1000) * 1000};
    double srv0, srv1, secs;
    unsigned i, started;
    kvf_rng_t rng;
    int phase, rc = -1;
    uint64_t t0;

    if (th == NULL || tid == NULL || clients == 0) {
        goto out;
    }
    for (i = 0; i < clients; i++) {
        th[i].port = port;
        th[i].id = i;
        th[i].keys = keys_per_thread ? keys_per_thread : 1;
        th[i].size = size;
        th[i].val = malloc((size_t)size + 1);
        th[i].cap = KVF_RESP_LAT_FIRST;
        th[i].lat = malloc(th[i].cap * sizeof(*th[i].lat));
        th[i].c = redisConnectWithTimeout("127.0.0.1", (int)port, tv);
        if (th[i].val == NULL || th[i].lat == NULL || th[i].c == NULL ||
            th[i].c->err != 0 || redisSetTimeout(th[i].c, tv) != REDIS_OK) {
            goto out;
        }
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
        if (th[i].c != NULL) {
            redisFree(th[i].c);
        }
        free(th[i].val);
        free(th[i].lat);
    }
    free(th);
    free(tid);
    if (rc != 0) {
        fprintf(stderr, "kvferry: the per-call Redis client failed\n");
    }
    return rc;
}
