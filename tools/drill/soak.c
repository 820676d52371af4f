/*
 * soak: a master, two nodes (two replicas per object) and four store
 * clients run a mixed load (random keys, 4 KiB to 1 MiB objects, gets,
 * puts, removes; every get checked byte for byte, see store.c: an object
 * is derived from (key, version), so a client restarted from nothing
 * still checks what an earlier incarnation wrote) for --duration. After
 * a warm-up (the first 20 % of the run) the conductor SIGKILLs and
 * restarts node 0 and one client in turn, and a hostile process bound to
 * 127.0.0.2 attacks the master and node 1 the whole time: garbage frames,
 * bursts of connections, idle connections and half-sent frames. Every
 * second it samples the RSS and open descriptors of the master and of
 * both nodes; the master and node 1 (never killed) must be flat: the last
 * 20 % of the run within 5 % (or a small absolute slack) of the 20 % just
 * after warm-up, RSS by the windows' means, fds by their lower quartiles.
 * Kills stop for the last 15 % (recovery): every client must be served
 * again. Also required: no wrong byte, every call within its bound, every
 * garbage connection refused.
 * The samples go to LOGDIR/soak-samples.csv.
 */
#include "tools/drill/soak.h"
#include "tools/drill/store.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/time.h"
#include "core/sock.h"
#include "tools/cli/net.h"
#include "core/rng.h"

unsigned kvf_drill_soak_ms = 60000;

#define KVF_SOAK_CLIENTS   4
#define KVF_SOAK_PERIOD_MS 8000 /* between two kills of the same kind */
#define KVF_SOAK_DOWN_MS   2000 /* a killed node stays down this long */
#define KVF_SOAK_IDLE      16   /* idle connections held per server */
#define KVF_SOAK_HALF      8    /* half-sent frames held per server */
#define KVF_SOAK_BURST     32   /* connections of one burst */
#define KVF_SOAK_RSS_SLACK 2048 /* KiB */
#define KVF_SOAK_FD_SLACK  8

/* --- the hostile client --------------------------------------------------- */

typedef struct kvf_soak_hostile {
    char addr[2][KVF_DRILL_ADDR]; /* master, node 1 */
    uint64_t opened, connect_failed;
    uint64_t garbage, garbage_refused, garbage_held;
    uint64_t idle_closed, half_closed, rounds;
} kvf_soak_hostile_t;

/* Non-blocking connect from 127.0.0.2 to addr; -1 when refused or not
 * done within 500 ms. */
static int kvf_soak_connect(kvf_soak_hostile_t *h, const char *addr)
{
    struct sockaddr_in src = {0}, dst = {0};
    char host[KVF_HOST_MAX];
    struct pollfd p;
    uint16_t port;
    int fd, err = 0;
    socklen_t el = sizeof(err);

    if (kvf_sock_parse_addr(addr, host, sizeof(host), &port) != KVF_OK) {
        return -1;
    }
    fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        return -1;
    }
    src.sin_family = AF_INET;
    inet_pton(AF_INET, "127.0.0.2", &src.sin_addr);
    dst.sin_family = AF_INET;
    dst.sin_port = htons(port);
    if (inet_pton(AF_INET, host, &dst.sin_addr) != 1) {
        inet_pton(AF_INET, "127.0.0.1", &dst.sin_addr);
    }
    bind(fd, (struct sockaddr *)&src, sizeof(src));
    if (connect(fd, (struct sockaddr *)&dst, sizeof(dst)) < 0 &&
        errno != EINPROGRESS) {
        close(fd);
        h->connect_failed++;
        return -1;
    }
    p.fd = fd;
    p.events = POLLOUT;
    if (poll(&p, 1, 500) != 1 ||
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0 || err != 0) {
        close(fd);
        h->connect_failed++;
        return -1;
    }
    h->opened++;
    return fd;
}

/* 1 when the server closed fd (or reset it); waits at most ms. */
static int kvf_soak_closed(int fd, int ms)
{
    uint64_t end = kvf_time_ms() + (uint64_t)ms;
    struct pollfd p = {fd, POLLIN, 0};
    char buf[512];
    ssize_t r;

    do {
        if (poll(&p, 1, ms) < 1) {
            return 0;
        }
        r = read(fd, buf, sizeof(buf));
        if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) {
            return 1;
        }
    } while (kvf_time_ms() < end);
    return 0;
}

/* A frame of random bytes; the server must close the connection. */
static void kvf_soak_garbage(kvf_soak_hostile_t *h, const char *addr,
                             kvf_rng_t *rng)
{
    unsigned char buf[4096];
    size_t len = 512 + (size_t)kvf_rng_below(rng, sizeof(buf) - 512);
    int fd = kvf_soak_connect(h, addr);

    if (fd < 0) {
        return;
    }
    kvf_rng_fill(rng, buf, len);
    if (send(fd, buf, len, MSG_NOSIGNAL) > 0) {
        h->garbage++;
        if (kvf_soak_closed(fd, 3000)) {
            h->garbage_refused++;
        } else {
            h->garbage_held++;
        }
    }
    close(fd);
}

/* Keeps n connections per server open; a half-sent one carries the first
 * bytes of a frame. Connections the server closed are counted and
 * replaced. */
static void kvf_soak_hold(kvf_soak_hostile_t *h, const char *addr, int *fds,
                          unsigned n, int half, uint64_t *closed)
{
    static const unsigned char head[5] = {0x4b, 0x56, 0x46, 0x00, 0x7f};
    unsigned i;

    for (i = 0; i < n; i++) {
        if (fds[i] >= 0 && kvf_soak_closed(fds[i], 0)) {
            close(fds[i]);
            fds[i] = -1;
            (*closed)++;
        }
        if (fds[i] < 0) {
            fds[i] = kvf_soak_connect(h, addr);
            if (fds[i] >= 0 && half) {
                (void)!send(fds[i], head, sizeof(head), MSG_NOSIGNAL);
            }
        }
    }
}

static void kvf_soak_burst(kvf_soak_hostile_t *h, const char *addr)
{
    int fds[KVF_SOAK_BURST];
    unsigned i;

    for (i = 0; i < KVF_SOAK_BURST; i++) {
        fds[i] = kvf_soak_connect(h, addr);
    }
    for (i = 0; i < KVF_SOAK_BURST; i++) {
        if (fds[i] >= 0) {
            close(fds[i]);
        }
    }
}

static void kvf_soak_hostile_main(kvf_soak_hostile_t *h, uint64_t seed)
{
    int idle[2][KVF_SOAK_IDLE], half[2][KVF_SOAK_HALF];
    kvf_rng_t rng;
    unsigned t;

    memset(idle, 0xff, sizeof(idle));
    memset(half, 0xff, sizeof(half));
    kvf_rng_seed(&rng, seed);
    for (;;) {
        for (t = 0; t < 2; t++) {
            kvf_soak_garbage(h, h->addr[t], &rng);
            kvf_soak_burst(h, h->addr[t]);
            kvf_soak_hold(h, h->addr[t], idle[t], KVF_SOAK_IDLE, 0,
                          &h->idle_closed);
            kvf_soak_hold(h, h->addr[t], half[t], KVF_SOAK_HALF, 1,
                          &h->half_closed);
        }
        h->rounds++;
        usleep(200000);
    }
}

/* --- samples -------------------------------------------------------------- */

enum { KVF_SOAK_MASTER, KVF_SOAK_NODE1, KVF_SOAK_NODE0, KVF_SOAK_PROCS };

static const char *const kvf_soak_names[KVF_SOAK_PROCS] = {"master", "node 1",
                                                           "node 0"};

typedef struct kvf_soak_samples {
    unsigned n, cap;
    double *t_s;                 /* seconds since the start */
    double *rss[KVF_SOAK_PROCS]; /* KiB */
    double *fds[KVF_SOAK_PROCS];
} kvf_soak_samples_t;

static int kvf_soak_samples_init(kvf_soak_samples_t *s, unsigned cap)
{
    unsigned p;

    memset(s, 0, sizeof(*s));
    s->cap = cap;
    s->t_s = calloc(cap, sizeof(double));
    for (p = 0; p < KVF_SOAK_PROCS; p++) {
        s->rss[p] = calloc(cap, sizeof(double));
        s->fds[p] = calloc(cap, sizeof(double));
        if (s->rss[p] == NULL || s->fds[p] == NULL) {
            return -1;
        }
    }
    return s->t_s != NULL ? 0 : -1;
}

static void kvf_soak_samples_free(kvf_soak_samples_t *s)
{
    unsigned p;

    for (p = 0; p < KVF_SOAK_PROCS; p++) {
        free(s->rss[p]);
        free(s->fds[p]);
    }
    free(s->t_s);
}

static void kvf_soak_sample(kvf_soak_samples_t *s, const kvf_drill_cluster_t *c,
                            double t_s)
{
    const pid_t pids[KVF_SOAK_PROCS] = {c->master, c->node[1], c->node[0]};
    kvf_drill_res_t r;
    unsigned p;

    if (s->n >= s->cap) {
        return;
    }
    s->t_s[s->n] = t_s;
    for (p = 0; p < KVF_SOAK_PROCS; p++) {
        if (pids[p] > 0) {
            kvf_drill_proc_res(pids[p], &r);
            s->rss[p][s->n] = r.rss_kb;
            s->fds[p][s->n] = r.fds;
        } else {
            s->rss[p][s->n] = NAN;
            s->fds[p][s->n] = NAN;
        }
    }
    s->n++;
}

static int kvf_soak_cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;

    return (x > y) - (x < y);
}

/* Lower quartile of v over samples with t in [from, to) seconds, NAN if
 * none: a window's floor, which one sample caught between the hostile
 * client's bursts (far below the rest) does not set. */
static double kvf_soak_floor(const kvf_soak_samples_t *s, const double *v,
                             double from, double to)
{
    double *w = malloc(s->n * sizeof(*w) + 1), q = NAN;
    unsigned i, n = 0;

    if (w == NULL) {
        return NAN;
    }
    for (i = 0; i < s->n; i++) {
        if (s->t_s[i] >= from && s->t_s[i] < to && !isnan(v[i])) {
            w[n++] = v[i];
        }
    }
    if (n > 0) {
        qsort(w, n, sizeof(*w), kvf_soak_cmp);
        q = w[n / 4];
    }
    free(w);
    return q;
}

/* Mean of v over samples with t in [from, to) seconds, NAN if none. */
static double kvf_soak_mean(const kvf_soak_samples_t *s, const double *v,
                            double from, double to)
{
    double sum = 0;
    unsigned i, n = 0;

    for (i = 0; i < s->n; i++) {
        if (s->t_s[i] >= from && s->t_s[i] < to && !isnan(v[i])) {
            sum += v[i];
            n++;
        }
    }
    return n ? sum / n : NAN;
}

static void kvf_soak_csv(kvf_drill_t *d, const kvf_soak_samples_t *s)
{
    char path[600];
    unsigned i, p;
    FILE *f;

    snprintf(path, sizeof(path), "%s/soak-samples.csv", d->logdir);
    f = fopen(path, "w");
    if (f == NULL) {
        return;
    }
    fprintf(f, "t_s,master_rss_kb,master_fds,node1_rss_kb,node1_fds,"
               "node0_rss_kb,node0_fds\n");
    for (i = 0; i < s->n; i++) {
        fprintf(f, "%.1f", s->t_s[i]);
        for (p = 0; p < KVF_SOAK_PROCS; p++) {
            fprintf(f, ",%.0f,%.0f", s->rss[p][i], s->fds[p][i]);
        }
        fputc('\n', f);
    }
    fclose(f);
    kvf_record_config(d->rec, "samples", path);
}

/* One figure flat: the last 20 % against the 20 % after the warm-up,
 * RSS by its mean, fds by their lower quartile (the hostile client's
 * bursts of 32 connections come and go within a sample or two and moved
 * a mean by ten; a leak raises the floor). Returns the drift in percent. */
static double kvf_soak_flat(kvf_drill_t *d, const kvf_soak_samples_t *s,
                            unsigned p, int rss, double total_s)
{
    const double *v = rss ? s->rss[p] : s->fds[p];
    double (*stat)(const kvf_soak_samples_t *, const double *, double, double) =
        rss ? kvf_soak_mean : kvf_soak_floor;
    double early = stat(s, v, 0.2 * total_s, 0.4 * total_s);
    double late = stat(s, v, 0.8 * total_s, total_s + 5);
    double slack = rss ? KVF_SOAK_RSS_SLACK : KVF_SOAK_FD_SLACK;
    double drift = (late - early) / early * 100.0;
    char name[96];

    snprintf(name, sizeof(name), "%s %s (%s 20-40 %% / last 20 %%)",
             kvf_soak_names[p], rss ? "RSS KiB" : "fds",
             rss ? "mean" : "lower quartile");
    kvf_record_drill_resource(d->rec, name, early, late);
    snprintf(name, sizeof(name), "%s %s drift", kvf_soak_names[p],
             rss ? "RSS" : "fds");
    kvf_record_figure(d->rec, name, drift, "%", NAN, NAN);
    /* growth is what a leak looks like; a fall (connections of killed
     * clients or of the hostile client closed) is recorded, not failed.
     * Node 0 restarts, so it is not one process: recorded only. */
    if (p != KVF_SOAK_NODE0) {
        kvf_drill_check(
            d, !isnan(drift) && (drift <= 5.0 || late - early <= slack),
            "%s %s not flat: %.0f -> %.0f (%+.1f %%)", kvf_soak_names[p],
            rss ? "RSS KiB" : "fds", early, late, drift);
    }
    return drift;
}

/* --- kills ---------------------------------------------------------------- */

/* Starts client i again in its slot (same key space, counters kept). */
static int kvf_soak_respawn(kvf_drill_t *d, unsigned i, kvf_kv_arg_t *a)
{
    kvf_drill_shared_t *sh = d->sh[i];
    pid_t pid;

    __atomic_store_n(&sh->ready, 0, __ATOMIC_RELEASE);
    __atomic_store_n(&sh->in_put, 0, __ATOMIC_RELEASE);
    sh->note[0] = '\0';
    pid = kvf_drill_fork(NULL);
    if (pid < 0) {
        return -1;
    }
    if (pid == 0) {
        char tag[32];

        snprintf(tag, sizeof(tag), "worker%u", i);
        kvf_drill_log_to(d, tag);
        _exit(kvf_drill_kv_main(d, sh, a));
    }
    d->wpid[i] = pid;
    __atomic_store_n(&sh->gone, 0, __ATOMIC_RELEASE);
    return 0;
}

typedef struct kvf_soak_run {
    kvf_drill_cluster_t c;
    kvf_kv_arg_t a;
    kvf_soak_samples_t s;
    uint64_t t0, next_node_kill, node_down_at, next_client_kill;
    unsigned node_kills, client_kills;
} kvf_soak_run_t;

/* One tick of the kill schedule: a node down long enough (or any down
 * node once faults is 0) is restarted; with faults, kills that are due. */
static void kvf_soak_kills(kvf_drill_t *d, kvf_soak_run_t *r, uint64_t now,
                           int faults)
{
    unsigned victim;

    if (r->c.node[0] == 0 &&
        (now >= r->node_down_at + KVF_SOAK_DOWN_MS || !faults)) {
        if (kvf_drill_node_start(d, &r->c, 0) != 0) {
            return; /* failed the drill */
        }
        r->next_node_kill = now + KVF_SOAK_PERIOD_MS;
    }
    if (!faults) {
        return;
    }
    if (r->c.node[0] > 0 && now >= r->next_node_kill) {
        kvf_drill_kill(r->c.node[0], SIGKILL);
        r->c.node[0] = 0;
        r->node_down_at = now;
        r->node_kills++;
        kvf_drill_log(d, "node 0 SIGKILLed (kill %u)", r->node_kills);
    }
    if (now >= r->next_client_kill) {
        victim = r->client_kills % KVF_SOAK_CLIENTS;
        kvf_drill_worker_kill(d, victim);
        if (kvf_soak_respawn(d, victim, &r->a) != 0) {
            kvf_drill_fail(d, "cannot restart client %u", victim);
        }
        r->client_kills++;
        r->next_client_kill = now + KVF_SOAK_PERIOD_MS;
        kvf_drill_log(d, "client %u SIGKILLed and restarted", victim);
    }
}

/* The timeline: warm-up, faults, recovery; a sample every second. */
static void kvf_soak_loop(kvf_drill_t *d, kvf_soak_run_t *r)
{
    uint64_t total = kvf_drill_soak_ms, warm = total / 5;
    uint64_t rec_at = total - total * 15 / 100, next_sample = 0, now, el;
    int phase = KVF_DRILL_BASE;

    r->t0 = kvf_time_ms();
    r->next_node_kill = r->t0 + warm;
    r->next_client_kill = r->t0 + warm + KVF_SOAK_PERIOD_MS / 2;
    kvf_drill_phase(d, KVF_DRILL_BASE);
    while (!d->failed && (el = (now = kvf_time_ms()) - r->t0) < total) {
        if (el >= next_sample) {
            kvf_soak_sample(&r->s, &r->c, (double)el / 1000.0);
            next_sample = (el / 1000 + 1) * 1000;
        }
        if (phase == KVF_DRILL_BASE && el >= warm) {
            phase = KVF_DRILL_FAULT;
            kvf_drill_phase(d, phase);
            d->phase_secs[KVF_DRILL_BASE] = (double)el / 1000.0;
        } else if (phase == KVF_DRILL_FAULT && el >= rec_at) {
            phase = KVF_DRILL_RECOVER;
            kvf_drill_phase(d, phase);
            d->phase_secs[KVF_DRILL_FAULT] = (double)(rec_at - warm) / 1000.0;
            kvf_soak_kills(d, r, now, 0);
            d->time_to_recover_ms =
                kvf_drill_wait_recovered(d, now, (unsigned)(total - rec_at));
            kvf_drill_check(d, d->time_to_recover_ms >= 0,
                            "a client was not served again after the "
                            "last kill");
            continue;
        }
        if (phase == KVF_DRILL_FAULT) {
            kvf_soak_kills(d, r, now, 1);
        }
        kvf_drill_sleep(d, 50);
    }
    d->phase_secs[KVF_DRILL_RECOVER] = (double)(total - rec_at) / 1000.0;
}

/* --- the drill ------------------------------------------------------------ */

static void kvf_soak_expect(kvf_drill_t *d, uint64_t bound)
{
    char text[900];

    snprintf(text, sizeof(text),
             "for %.0f s a master, 2 nodes (2 replicas) and %d clients "
             "under a mixed put/get/remove load of 4 KiB to 1 MiB objects, "
             "with node 0 and one client SIGKILLed and restarted every "
             "%d s after the warm-up and a hostile client (garbage frames, "
             "connection bursts, idle and half-sent connections from "
             "127.0.0.2) against the master and node 1 the whole time: no "
             "wrong byte, every call within its bound (%lu ms), every "
             "garbage connection refused, the master's and node 1's RSS "
             "and fds flat after warm-up (the last 20 %% within 5 %% of "
             "the 20 %% just after warm-up, RSS by mean and fds by lower "
             "quartile, or within %d KiB / %d fds), and every client served "
             "again "
             "once the kills stop",
             kvf_drill_soak_ms / 1000.0, KVF_SOAK_CLIENTS,
             KVF_SOAK_PERIOD_MS / 1000, (unsigned long)bound,
             KVF_SOAK_RSS_SLACK, KVF_SOAK_FD_SLACK);
    kvf_drill_expect(d, text);
}

static pid_t kvf_soak_hostile_start(kvf_drill_t *d, kvf_soak_hostile_t *h,
                                    const kvf_drill_cluster_t *c)
{
    pid_t pid;

    snprintf(h->addr[0], sizeof(h->addr[0]), "%s", c->master_addr);
    snprintf(h->addr[1], sizeof(h->addr[1]), "%s", c->node_seg[1]);
    pid = kvf_drill_fork(NULL);
    if (pid == 0) {
        kvf_drill_log_to(d, "hostile");
        kvf_soak_hostile_main(h, d->seed * 31u + 7u);
        _exit(0);
    }
    return pid;
}

static void kvf_soak_report(kvf_drill_t *d, kvf_soak_run_t *r,
                            const kvf_soak_hostile_t *h,
                            const kvf_drill_mstatus_t *st)
{
    double total_s = kvf_drill_soak_ms / 1000.0, drift[2][2];
    unsigned p;
    char text[900];

    for (p = 0; p < KVF_SOAK_PROCS; p++) {
#if KVF_BUILD_SANITIZE
        /* ASan quarantines freed memory: RSS only grows */
        if (p == 0) {
            kvf_record_not_verified(d->rec, "RSS flat: sanitizer build "
                                            "(freed memory is quarantined)");
        }
        drift[p % 2][0] = NAN;
#else
        if (p < 2) {
            drift[p][0] = kvf_soak_flat(d, &r->s, p, 1, total_s);
        } else {
            kvf_soak_flat(d, &r->s, p, 1, total_s);
        }
#endif
        if (p < 2) {
            drift[p][1] = kvf_soak_flat(d, &r->s, p, 0, total_s);
        } else {
            kvf_soak_flat(d, &r->s, p, 0, total_s);
        }
    }
    kvf_soak_csv(d, &r->s);
    kvf_record_drill_num(d->rec, "node kills", r->node_kills);
    kvf_record_drill_num(d->rec, "client kills", r->client_kills);
    kvf_record_drill_num(d->rec, "hostile connections opened",
                         (double)h->opened);
    kvf_record_drill_num(d->rec, "hostile connects refused",
                         (double)h->connect_failed);
    kvf_record_drill_num(d->rec, "garbage frames sent", (double)h->garbage);
    kvf_record_drill_num(d->rec, "garbage connections closed by the server",
                         (double)h->garbage_refused);
    kvf_record_drill_num(d->rec, "idle connections closed by the servers",
                         (double)h->idle_closed);
    kvf_record_drill_num(d->rec, "half-sent connections closed by the servers",
                         (double)h->half_closed);
    kvf_record_drill_num(d->rec, "master objects lost", st->objects_lost);
    kvf_drill_check(d, h->garbage > 0, "the hostile client sent no garbage");
    kvf_drill_check(d, h->garbage_held == 0,
                    "%lu of %lu garbage connections not closed by the "
                    "server within 3 s",
                    (unsigned long)h->garbage_held, (unsigned long)h->garbage);
    kvf_drill_check(d, r->node_kills > 0 && r->client_kills > 0,
                    "no kill within the run (--duration too short)");
    snprintf(text, sizeof(text),
             "%u node kills and %u client kills; hostile: %lu connections "
             "(%lu garbage frames, all %lu closed by the server; %lu idle "
             "and %lu half-sent connections closed by the servers); %lu "
             "wrong bytes, longest call %.0f ms; drift master RSS %+.1f %% "
             "fds %+.1f %%, node 1 RSS %+.1f %% fds %+.1f %%",
             r->node_kills, r->client_kills, (unsigned long)h->opened,
             (unsigned long)h->garbage, (unsigned long)h->garbage_refused,
             (unsigned long)h->idle_closed, (unsigned long)h->half_closed,
             (unsigned long)d->wrong_bytes, d->max_wait_ms, drift[0][0],
             drift[0][1], drift[1][0], drift[1][1]);
    kvf_record_drill_text(d->rec, "observed", text);
    snprintf(text, sizeof(text),
             "kills stopped for the last 15 %% of the run; node 0 restarted "
             "and every client served again %.0f ms later",
             d->time_to_recover_ms);
    kvf_record_drill_text(d->rec, "recovery", text);
    kvf_record_not_verified(d->rec, "node 0's memory over the whole run: it "
                                    "is a new process after each kill");
}

int kvf_drill_soak(kvf_drill_t *d)
{
    kvf_soak_run_t *r = calloc(1, sizeof(*r));
    kvf_soak_hostile_t *h = kvf_drill_shared_alloc(sizeof(*h));
    uint64_t bound = kvf_drill_store_bound(d, 2);
    kvf_drill_mstatus_t st = {0};
    char text[1024];
    pid_t hpid;
    int rc = -1;

    if (r == NULL || h == NULL || kvf_drill_soak_ms < 10000 ||
        kvf_soak_samples_init(&r->s, kvf_drill_soak_ms / 1000 + 16) != 0) {
        kvf_drill_fail(d, "--duration below 10 s, or out of memory");
        free(r);
        return -1;
    }
    kvf_soak_expect(d, bound);
    r->c.replicas = 2;
    r->c.node_pool = 64u << 20;
    r->a = (kvf_kv_arg_t){.keys = 24,
                          .min_kb = 4,
                          .max_kb = 1024,
                          .replicas = 2,
                          .get_pct = 60,
                          .remove_pct = 10};
    kvf_record_config_num(d->rec, "duration_ms", kvf_drill_soak_ms);
    if (kvf_drill_cluster_start(d, &r->c, 2) != 0 ||
        kvf_drill_kv_workers(d, &r->c, NULL, &r->a, KVF_SOAK_CLIENTS) != 0) {
        goto out;
    }
    hpid = kvf_soak_hostile_start(d, h, &r->c);
    snprintf(text, sizeof(text),
             "every %d s after the warm-up: SIGKILL to node 0 (restarted "
             "%d s later) and, offset by half that, to one client "
             "(restarted at once); a hostile client against %s and %s",
             KVF_SOAK_PERIOD_MS / 1000, KVF_SOAK_DOWN_MS / 1000,
             r->c.master_addr, r->c.node_seg[1]);
    kvf_drill_injected(d, text);
    kvf_soak_loop(d, r);
    if (hpid > 0) {
        kvf_drill_kill(hpid, SIGKILL);
    }
    kvf_drill_status(d, &r->c, &st);
    kvf_drill_workers_stop(d);
    kvf_drill_traffic_report(d, bound);
    kvf_soak_report(d, r, h, &st);
    rc = 0;
out:
    kvf_drill_cluster_stop(&r->c);
    kvf_soak_samples_free(&r->s);
    free(r);
    return rc;
}
