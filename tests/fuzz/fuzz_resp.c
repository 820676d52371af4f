/*
 * libFuzzer target of the RESP door's request path (store/resp: reader.c,
 * cmd.c, txn.c, reply.c, guard.c), the part a client reaches before AUTH.
 * An input is a flags byte and a byte stream. The stream goes to one
 * connection of a door built as kvferry resp builds it (a password set, a
 * small value pool, the limits of an unauthenticated client) over a
 * socketpair, written in pieces whose sizes the flags choose, the door
 * serving it after each piece as its loop would; its replies are read and
 * dropped. Seeds: tests/fuzz/corpus/fuzz_resp/ (gen_corpus.c). Flag bit 0 sends the password's AUTH first, so the commands
 * behind it (GET, SET, MULTI, INFO ...) are reached too: their store
 * calls run against no store (each answers an error), the rest is the
 * door's own code. After each input the connection is closed and the door
 * must hold nothing of it: no pool granule, no count of a connection or
 * of memory for slow readers (LeakSanitizer sees the heap).
 */
#include "store/resp/resp_int.h"

#include "core/log.h"

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define KVF_FZ_PW   "fuzz-password"
/* four granules: a few queued values fill it ("pool full" is reached) */
#define KVF_FZ_POOL (4u * KVF_RESP_GRANULE)

static struct kvf_resp *kvf_fz_door;

/* A door with no store and no threads: its one loop is run by hand. */
static struct kvf_resp *kvf_fz_door_make(void)
{
    struct kvf_resp *s = calloc(1, sizeof(*s));
    kvf_resp_pool_t *pl = &s->pool;
    kvf_resp_loop_t *lp = &s->loops[0];

    kvf_log_set_level(KVF_LOG_ERROR); /* the door's warnings are expected */
    s->p.max_value = KVF_FZ_POOL / 2;
    s->p.max_clients = 16;
    s->p.timeout_ms = 100;
    s->lim.per_addr = 16;
    s->lim.unauth_per_addr = 16;
    s->lim.slow_mem = 1u << 20;
    s->nloops = 1;
    memcpy(s->password, KVF_FZ_PW, sizeof(KVF_FZ_PW) - 1);
    s->pwlen = sizeof(KVF_FZ_PW) - 1;
    pthread_mutex_init(&s->gmu, NULL);
    pthread_mutex_init(&s->fmu, NULL);
    pthread_cond_init(&s->fend, NULL);
    for (int i = 0; i < KVF_RESP_SET_STRIPES; i++) {
        pthread_mutex_init(&s->set_mu[i], NULL);
    }
    pthread_mutex_init(&pl->mu, NULL);
    pl->granules = KVF_FZ_POOL / KVF_RESP_GRANULE;
    pl->len = KVF_FZ_POOL;
    pl->base = aligned_alloc(KVF_RESP_GRANULE, KVF_FZ_POOL);
    pl->used = calloc(pl->granules, 1);
    lp->srv = s;
    lp->ep = epoll_create1(EPOLL_CLOEXEC);
    lp->wakefd = -1;
    lp->rbuf = malloc(KVF_RESP_RECV);
    pthread_mutex_init(&lp->hmu, NULL);
    if (pl->base == NULL || pl->used == NULL || lp->ep < 0 ||
        lp->rbuf == NULL) {
        abort();
    }
    return s;
}

/* Reads and drops what the door sent; 0 once the door closed its end. */
static int kvf_fz_drain(int fd)
{
    static char buf[65536];
    ssize_t n;

    while ((n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT)) > 0) {
    }
    return n == 0 ? 0 : 1;
}

/* Serves the connection as its loop would (its queued GET or SET run as
 * a store batch) until it waits for input; 0 once it is closed. Its
 * replies are read only when they back up (fewer system calls a run). */
static int kvf_fz_serve(kvf_resp_loop_t *lp, kvf_resp_conn_t *c, int peer)
{
    int rounds;

    kvf_resp_serve(c, EPOLLIN | EPOLLOUT);
    for (rounds = 0; rounds < 64; rounds++) {
        if (lp->conns == NULL) {
            return 0;
        }
        if (lp->nq > 0) {
            kvf_resp_batch_serve(lp);
        } else if (c->out_len == c->out_off && c->big == NULL &&
                   !c->mreplay) {
            break;
        } else {
            (void)kvf_fz_drain(peer);
            kvf_resp_serve(c, EPOLLOUT);
        }
    }
    return lp->conns != NULL;
}

/* The size of piece i of the stream: the first KVF_FZ_FINE bytes go in
 * pieces of 1 to 64 bytes that flags bits 1-3 choose (so requests are
 * cut at every kind of boundary), the rest in pieces of 4 KiB. */
#define KVF_FZ_FINE 32u
static size_t kvf_fz_piece(uint8_t flags, size_t off, size_t i)
{
    static const size_t sizes[] = {1, 2, 3, 5, 8, 13, 32, 64};

    if (off >= KVF_FZ_FINE) {
        return 4096;
    }
    return (flags & 0x10) ? sizes[((flags >> 1) ^ i) & 7]
                          : sizes[(flags >> 1) & 7];
}

/* The client goes: the door must close its end (its queued command
 * answered first); abort when it does not. */
static void kvf_fz_finish(kvf_resp_loop_t *lp, int peer)
{
    int i;

    close(peer);
    for (i = 0; i < 1000 && lp->conns != NULL; i++) {
        if (lp->nq > 0) {
            kvf_resp_batch_serve(lp);
        } else {
            kvf_resp_serve(lp->conns, EPOLLIN | EPOLLHUP);
        }
    }
    if (lp->conns != NULL) {
        abort(); /* a connection whose client left was never closed */
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char auth[] = "*2\r\n$4\r\nAUTH\r\n$13\r\n" KVF_FZ_PW "\r\n";
    struct sockaddr_storage sa = {.ss_family = AF_UNIX};
    struct kvf_resp *s;
    kvf_resp_loop_t *lp;
    kvf_resp_conn_t *c;
    size_t off = 0, i = 0, n;
    int sv[2], open_ = 1, stuck = 0;
    ssize_t w;
    uint8_t flags;

    if (size < 1) {
        return 0;
    }
    if (kvf_fz_door == NULL) {
        kvf_fz_door = kvf_fz_door_make();
    }
    s = kvf_fz_door;
    lp = &s->loops[0];
    flags = data[0];
    data++;
    size--;
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0,
                   sv) != 0) {
        abort();
    }
    c = kvf_resp_conn_attach(lp, sv[0], (struct sockaddr *)&sa);
    if (c == NULL) {
        abort(); /* the door holds no other connection */
    }
    if (flags & 1) {
        (void)!send(sv[1], auth, sizeof(auth) - 1, MSG_NOSIGNAL);
        open_ = kvf_fz_serve(lp, c, sv[1]);
    }
    while (open_ && off < size && stuck < 64) {
        n = kvf_fz_piece(flags, off, i++);
        n = n < size - off ? n : size - off;
        w = send(sv[1], data + off, n, MSG_NOSIGNAL);
        stuck = w > 0 ? 0 : stuck + 1; /* full: the door reads first */
        off += w > 0 ? (size_t)w : 0;
        open_ = kvf_fz_serve(lp, c, sv[1]);
    }
    kvf_fz_finish(lp, sv[1]);
    if (s->pool.nused != 0 || s->nclients != 0 || s->nunauth != 0 ||
        atomic_load(&s->slow_held) != 0) {
        abort(); /* the closed connection left something held */
    }
    return 0;
}
