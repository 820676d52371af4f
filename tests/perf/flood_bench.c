/*
 * Connection-flood probe (run by scripts/bench-flood.sh, not by ctest):
 * against one server (an engine target or the store master) it opens
 * --conns idle and --conns slow connections (one byte every 2 s) from
 * 127.0.0.2 (two child processes, one each), reopening what the server
 * closes (at most 1000 a tick of 100 ms per child), for --hold-s
 * seconds, and meanwhile times a real client from 127.0.0.1: for a
 * target, an engine peer open (tcp) plus one 8 KiB read checked against
 * the target's seeded pool; for the master, a store connect, an 8 KiB
 * put and a get checked byte for byte. It samples the server's RSS,
 * threads and descriptors before, during and after the flood, and
 * prints one JSON object of figures on stdout.
 *
 *   flood_bench target SEGMENT SEED PID [--conns N] [--hold-s S]
 *   flood_bench master ADDR PID [--conns N] [--hold-s S]
 */
#include <kvferry/engine.h>
#include <kvferry/store.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/rng.h"

#define FB_BLOCK 8192
#define FB_OFF   (1u << 20) /* pool offset of the probe's read */

typedef struct fb_proc {
    double rss_kb, threads, fds;
} fb_proc_t;

typedef struct fb {
    int target; /* 1: engine target, 0: master */
    const char *addr;
    uint64_t seed;
    int pid;
    unsigned conns, hold_s;
    struct sockaddr_in dst;
    uint64_t opened, closed_by_server, connect_failed, slow_bytes;
    unsigned open_max; /* most connections open at one time */
    double probe_ms[64];
    unsigned nprobe, probe_fail;
    fb_proc_t before, during_max, after;
    double probe_before_ms, probe_after_ms;
} fb_t;

static double fb_now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void fb_proc(int pid, fb_proc_t *p)
{
    char path[64], line[256];
    struct dirent *de;
    DIR *dir;
    FILE *f;

    memset(p, 0, sizeof(*p));
    snprintf(path, sizeof(path), "/proc/%d/status", pid);
    f = fopen(path, "r");
    if (f != NULL) {
        while (fgets(line, sizeof(line), f) != NULL) {
            if (strncmp(line, "VmRSS:", 6) == 0) {
                p->rss_kb = strtod(line + 6, NULL);
            } else if (strncmp(line, "Threads:", 8) == 0) {
                p->threads = strtod(line + 8, NULL);
            }
        }
        fclose(f);
    }
    snprintf(path, sizeof(path), "/proc/%d/fd", pid);
    dir = opendir(path);
    if (dir != NULL) {
        while ((de = readdir(dir)) != NULL) {
            p->fds += (de->d_name[0] != '.');
        }
        closedir(dir);
    }
}

static void fb_proc_max(fb_proc_t *m, const fb_proc_t *p)
{
    m->rss_kb = p->rss_kb > m->rss_kb ? p->rss_kb : m->rss_kb;
    m->threads = p->threads > m->threads ? p->threads : m->threads;
    m->fds = p->fds > m->fds ? p->fds : m->fds;
}

/* --- the real client ------------------------------------------------------ */

/* Engine peer open over tcp plus one verified 8 KiB read; 0 = served. */
static int fb_probe_target(fb_t *b)
{
    static unsigned char buf[FB_BLOCK], *want;
    kvf_engine_params_t p = {0};
    kvf_engine_h eng = NULL;
    kvf_region_h reg = NULL;
    kvf_peer_h peer = NULL;
    kvf_op_t op;
    uint64_t addr = 0;
    size_t len = 0;
    kvf_mem_type_t type;
    kvf_rng_t rng;
    int rc = 1;

    if (want == NULL) {
        want = malloc(FB_OFF + FB_BLOCK);
        kvf_rng_seed(&rng, b->seed);
        kvf_rng_fill(&rng, want, FB_OFF + FB_BLOCK);
    }
    p.field_mask = KVF_ENGINE_PARAM_TRANSPORTS | KVF_ENGINE_PARAM_TIMEOUT |
                   KVF_ENGINE_PARAM_NO_LISTEN;
    p.transports = "tcp";
    p.timeout_ms = 5000;
    p.no_listen = 1;
    if (kvf_engine_create(&p, &eng) != KVF_OK ||
        kvf_engine_reg(eng, buf, sizeof(buf), KVF_MEM_HOST, 0, &reg) !=
            KVF_OK ||
        kvf_peer_open(eng, b->addr, &peer) != KVF_OK ||
        kvf_peer_region(peer, 0, &addr, &len, &type) != KVF_OK) {
        goto out;
    }
    memset(buf, 0xA5, sizeof(buf));
    op = (kvf_op_t){KVF_OP_READ, buf, peer, addr + FB_OFF, FB_BLOCK};
    if (kvf_transfer_sync(eng, &op, 1, 5000) == KVF_OK &&
        memcmp(buf, want + FB_OFF, FB_BLOCK) == 0) {
        rc = 0;
    }
out:
    if (peer != NULL) {
        kvf_peer_close(peer);
    }
    if (reg != NULL) {
        kvf_engine_dereg(eng, reg);
    }
    if (eng != NULL) {
        kvf_engine_destroy(eng);
    }
    return rc;
}

/* Store connect, 8 KiB put, get checked byte for byte; 0 = served. */
static int fb_probe_master(fb_t *b)
{
    static unsigned char buf[2 * FB_BLOCK];
    static unsigned n;
    kvf_store_params_t p = {0};
    kvf_store_h st;
    kvf_region_h reg;
    char key[64];
    size_t got = 0;
    unsigned i;
    int rc = 1;

    p.field_mask = KVF_STORE_PARAM_MASTER | KVF_STORE_PARAM_TIMEOUT;
    p.master = b->addr;
    p.timeout_ms = 5000;
    if (kvf_store_connect(&p, &st) != KVF_OK) {
        return 1;
    }
    snprintf(key, sizeof(key), "flood/probe/%d/%u", (int)getpid(), n++);
    for (i = 0; i < FB_BLOCK; i++) {
        buf[i] = (unsigned char)(i * 31u + n);
    }
    memset(buf + FB_BLOCK, 0, FB_BLOCK);
    if (kvf_engine_reg(kvf_store_engine(st), buf, sizeof(buf), KVF_MEM_HOST, 0,
                       &reg) == KVF_OK) {
        if (kvf_store_put(st, key, buf, FB_BLOCK, NULL) == KVF_OK &&
            kvf_store_get(st, key, buf + FB_BLOCK, FB_BLOCK, &got, 0) ==
                KVF_OK &&
            got == FB_BLOCK && memcmp(buf, buf + FB_BLOCK, FB_BLOCK) == 0) {
            rc = 0;
        }
        kvf_store_remove(st, key);
        kvf_engine_dereg(kvf_store_engine(st), reg);
    }
    kvf_store_disconnect(st);
    return rc;
}

/* Time of one probe in ms, negative when it was not served. */
static double fb_probe(fb_t *b)
{
    double t0 = fb_now_ms();
    int rc = b->target ? fb_probe_target(b) : fb_probe_master(b);
    double ms = fb_now_ms() - t0;

    return rc == 0 ? ms : -ms;
}

/* --- the flood ------------------------------------------------------------ */

static int fb_open(fb_t *b)
{
    struct sockaddr_in src = {0};
    int fd;

    fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        return -1;
    }
    src.sin_family = AF_INET;
    inet_pton(AF_INET, "127.0.0.2", &src.sin_addr);
    if (bind(fd, (struct sockaddr *)&src, sizeof(src)) < 0 ||
        (connect(fd, (struct sockaddr *)&b->dst, sizeof(b->dst)) < 0 &&
         errno != EINPROGRESS)) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Counters of one flooding child, shared with the parent. */
typedef struct fb_counts {
    uint64_t opened, closed_by_server, connect_failed, slow_bytes;
    unsigned open_max;
} fb_counts_t;

/* Reopens (at most FB_REOPEN a tick) what the server closed; the slow
 * connections get one byte when `drip`. */
#define FB_REOPEN 1000
static void fb_tick(fb_t *b, struct pollfd *pfd, int slow, int drip,
                    fb_counts_t *k)
{
    unsigned i, n = b->conns, open = 0, reopened = 0;
    char c = 'x', sink[256];

    for (i = 0; i < n; i++) {
        pfd[i].events = POLLIN;
        pfd[i].revents = 0;
    }
    poll(pfd, n, 0);
    for (i = 0; i < n; i++) {
        struct pollfd *p = &pfd[i];

        if (p->fd >= 0 && (p->revents & (POLLIN | POLLHUP | POLLERR))) {
            ssize_t r = read(p->fd, sink, sizeof(sink));

            if (r == 0 || (r < 0 && errno != EAGAIN)) {
                close(p->fd);
                p->fd = -1;
                k->closed_by_server++;
            }
        }
        if (p->fd < 0 && reopened < FB_REOPEN) {
            reopened++;
            p->fd = fb_open(b);
            k->opened += (p->fd >= 0);
            k->connect_failed += (p->fd < 0);
        } else if (p->fd >= 0 && drip && slow &&
                   send(p->fd, &c, 1, MSG_NOSIGNAL) == 1) {
            k->slow_bytes++;
        }
        open += (p->fd >= 0);
    }
    k->open_max = open > k->open_max ? open : k->open_max;
}

/* A flooding child: conns connections (slow or idle) for hold_s. */
static void fb_flooder(fb_t *b, int slow, fb_counts_t *k)
{
    struct pollfd *pfd = calloc(b->conns, sizeof(*pfd));
    double end, next_drip;
    unsigned i;

    if (pfd == NULL) {
        _exit(1);
    }
    for (i = 0; i < b->conns; i++) {
        pfd[i].fd = fb_open(b);
        k->opened += (pfd[i].fd >= 0);
        k->connect_failed += (pfd[i].fd < 0);
    }
    end = fb_now_ms() + b->hold_s * 1000.0;
    next_drip = fb_now_ms() + 2000;
    while (fb_now_ms() < end) {
        int drip = fb_now_ms() >= next_drip;

        fb_tick(b, pfd, slow, drip, k);
        if (drip) {
            next_drip += 2000;
        }
        usleep(100000);
    }
    _exit(0);
}

static void fb_flood(fb_t *b)
{
    fb_counts_t *k = mmap(NULL, 2 * sizeof(*k), PROT_READ | PROT_WRITE,
                          MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    double end, next_probe, ms;
    pid_t kid[2];
    fb_proc_t p;
    int i, st;

    if (k == MAP_FAILED) {
        return;
    }
    memset(k, 0, 2 * sizeof(*k));
    for (i = 0; i < 2; i++) {
        kid[i] = fork();
        if (kid[i] == 0) {
            fb_flooder(b, i, &k[i]);
        }
    }
    end = fb_now_ms() + b->hold_s * 1000.0;
    next_probe = fb_now_ms() + 1000;
    while (fb_now_ms() < end) {
        fb_proc(b->pid, &p);
        fb_proc_max(&b->during_max, &p);
        if (fb_now_ms() >= next_probe && b->nprobe < 64) {
            ms = fb_probe(b);
            b->probe_ms[b->nprobe++] = ms < 0 ? -ms : ms;
            b->probe_fail += (ms < 0);
            next_probe = fb_now_ms() + 1000;
        }
        usleep(100000);
    }
    for (i = 0; i < 2; i++) {
        if (kid[i] > 0) {
            waitpid(kid[i], &st, 0);
        }
        b->opened += k[i].opened;
        b->closed_by_server += k[i].closed_by_server;
        b->connect_failed += k[i].connect_failed;
        b->slow_bytes += k[i].slow_bytes;
        b->open_max += k[i].open_max;
    }
}

static void fb_print(const fb_t *b)
{
    double max = 0, sum = 0;
    unsigned i;

    for (i = 0; i < b->nprobe; i++) {
        max = b->probe_ms[i] > max ? b->probe_ms[i] : max;
        sum += b->probe_ms[i];
    }
    printf("{\"server\":\"%s\",\"addr\":\"%s\",\"conns_idle\":%u,"
           "\"conns_slow\":%u,\"hold_s\":%u,\"opened\":%lu,"
           "\"closed_by_server\":%lu,\"connect_failed\":%lu,"
           "\"open_max\":%u,\"slow_bytes\":%lu,"
           "\"probe_before_ms\":%.1f,\"probes_during\":%u,"
           "\"probes_during_failed\":%u,\"probe_during_mean_ms\":%.1f,"
           "\"probe_during_max_ms\":%.1f,\"probe_after_ms\":%.1f,"
           "\"rss_kb\":[%.0f,%.0f,%.0f],\"threads\":[%.0f,%.0f,%.0f],"
           "\"fds\":[%.0f,%.0f,%.0f]}\n",
           b->target ? "target" : "master", b->addr, b->conns, b->conns,
           b->hold_s, (unsigned long)b->opened,
           (unsigned long)b->closed_by_server, (unsigned long)b->connect_failed,
           b->open_max, (unsigned long)b->slow_bytes, b->probe_before_ms,
           b->nprobe, b->probe_fail, b->nprobe ? sum / b->nprobe : 0.0, max,
           b->probe_after_ms, b->before.rss_kb, b->during_max.rss_kb,
           b->after.rss_kb, b->before.threads, b->during_max.threads,
           b->after.threads, b->before.fds, b->during_max.fds, b->after.fds);
}

static int fb_args(fb_t *b, int argc, char **argv)
{
    char host[256];
    const char *colon;
    int i = 2;

    b->conns = 10000;
    b->hold_s = 12;
    b->target = argc > 1 && strcmp(argv[1], "target") == 0;
    if (argc < (b->target ? 5 : 4)) {
        return -1;
    }
    b->addr = argv[i++];
    if (b->target) {
        b->seed = strtoull(argv[i++], NULL, 0);
    }
    b->pid = atoi(argv[i++]);
    for (; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--conns") == 0) {
            b->conns = (unsigned)atoi(argv[i + 1]);
        } else if (strcmp(argv[i], "--hold-s") == 0) {
            b->hold_s = (unsigned)atoi(argv[i + 1]);
        }
    }
    colon = strrchr(b->addr, ':');
    if (colon == NULL || (size_t)(colon - b->addr) >= sizeof(host)) {
        return -1;
    }
    memcpy(host, b->addr, (size_t)(colon - b->addr));
    host[colon - b->addr] = '\0';
    b->dst.sin_family = AF_INET;
    b->dst.sin_port = htons((uint16_t)atoi(colon + 1));
    return inet_pton(AF_INET, host, &b->dst.sin_addr) == 1 ? 0 : -1;
}

int main(int argc, char **argv)
{
    struct rlimit rl;
    fb_t b;
    double ms;

    memset(&b, 0, sizeof(b));
    if (fb_args(&b, argc, argv) != 0) {
        fprintf(stderr, "usage: flood_bench target SEGMENT SEED PID | master "
                        "ADDR PID [--conns N] [--hold-s S]\n");
        return 2;
    }
    rl.rlim_cur = rl.rlim_max = b.conns + 1024; /* each flooder: conns */
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0) {
        getrlimit(RLIMIT_NOFILE, &rl);
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
        fprintf(stderr, "flood_bench: descriptors limited to %lu\n",
                (unsigned long)rl.rlim_cur);
    }
    ms = fb_probe(&b);
    b.probe_before_ms = ms;
    fb_proc(b.pid, &b.before);
    b.during_max = b.before;
    fb_flood(&b);
    sleep(3);
    b.probe_after_ms = fb_probe(&b);
    fb_proc(b.pid, &b.after);
    fb_print(&b);
    return (ms < 0 || b.probe_after_ms < 0) ? 1 : 0;
}
