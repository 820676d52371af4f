/*
 * Private header of the RESP2 front door (`kvferry resp`): its limits, the
 * server, loop and connection structures, and the calls its modules make
 * of one another. Nothing outside store/resp/ includes it; the public
 * entry points are in kvferry/server.h.
 *
 * The modules: pool.c (the registered value pool and shared GET values),
 * reader.c (the objects hiredis's redisReader builds, the limits on
 * requests, and long bulks received straight into the pool), reply.c
 * (replies and sending them), cmd.c (the commands), multi.c (MULTI/EXEC,
 * HELLO, INFO), batch.c (the GETs and SETs of a loop run as store
 * batches), conn.c (connections and event loops), guard.c (what one
 * address may hold: connection caps, unauthenticated connections, AUTH
 * attempts, memory held for slow readers), resp.c (configuration, AUTH
 * password, start and stop).
 */
#ifndef KVF_STORE_RESP_INT_H
#define KVF_STORE_RESP_INT_H
#if !defined(KVF_LAYER_STORE) && !defined(KVF_TEST_INTERNALS)
#error "store/resp/resp_int.h is private to store/: use <kvferry/store.h>"
#endif

#include "core/sock.h"

#include <kvferry/server.h>
#include <kvferry/store.h>

#include <hiredis/hiredis.h>
#include <hiredis/read.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

/* Allocation unit of the value pool. */
#define KVF_RESP_GRANULE (64u << 10)
/* Values at most this long are copied into a connection's output buffer;
 * longer ones are sent from the pool. */
#define KVF_RESP_INLINE_MAX 4096u
/* A connection stops reading and parsing while this much output waits. */
#define KVF_RESP_OUT_HIGH (32u << 10)
/* Longest request line (array or bulk header) accepted. */
#define KVF_RESP_LINE_MAX (64u << 10)
/* Most arguments of one command. */
#define KVF_RESP_ARGS_MAX 4096

#define KVF_RESP_LOOPS_MAX 64
/* Accepted sockets waiting to be taken over by their loop. */
#define KVF_RESP_HAND_MAX 64
/* Label of the AUTH password derived from the cluster secret. */
#define KVF_RESP_TOKEN_LABEL "kvferry-resp-v1"
#define KVF_RESP_PW_MAX      512
#define KVF_RESP_OUT_CAP     (KVF_RESP_OUT_HIGH + KVF_RESP_INLINE_MAX + 1024)
/* One receive into the reader: small, so that most of a long value is
 * received straight into the pool (see kvf_resp_direct_start) rather
 * than copied through the reader. */
#define KVF_RESP_RECV        (8u << 10)
#define KVF_RESP_SET_STRIPES 64
/* Bulks this long are received straight into the pool. */
#define KVF_RESP_DIRECT_MIN (16u << 10)
/* GETs read into a buffer of the last size read up to this size. */
#define KVF_RESP_HINT_MAX (8u << 20)
/* Strings up to this long are parsed into memory of their own; longer
 * ones (of an authenticated connection) into the pool. */
#define KVF_RESP_SMALL_STR 1024u

/* Before AUTH (Redis's rule): at most this many arguments, each at most
 * this long, and this much unparsed input held at once. */
#define KVF_RESP_UNAUTH_ARGS 10
#define KVF_RESP_UNAUTH_BULK 16384u
#define KVF_RESP_UNAUTH_HELD (KVF_RESP_UNAUTH_BULK + 1024u)
/* Wrong AUTHs: a connection is closed after this many; one network (an
 * IPv4 address, 127.0.0.0/8 as one, an IPv6 /64) may make this many a
 * second (a burst of as many), further AUTHs from it are refused
 * unchecked until it has tokens again. */
#define KVF_RESP_AUTH_TRIES 3u
#define KVF_RESP_AUTH_RATE  10u
/* MULTI: most commands queued, and bytes of their arguments held outside
 * the pool. */
#define KVF_RESP_MULTI_MAX       10000u
#define KVF_RESP_MULTI_MAX_BYTES (4u << 20)

/* The type of the item the reader is in (its task stack changed form in
 * hiredis 1.0). The reader's public fields used here (buf, pos, len,
 * ridx) are the same in 0.14 (Debian 12) and 1.x. */
#if HIREDIS_MAJOR >= 1
#define KVF_RESP_TASK_TYPE(rd) ((rd)->task[(rd)->ridx]->type)
#else
#define KVF_RESP_TASK_TYPE(rd) ((rd)->rstack[(rd)->ridx].type)
#endif

/* Objects the redisReader builds for us. */
enum { KVF_RO_STR = 1, KVF_RO_ARR, KVF_RO_OTHER };

typedef struct kvf_ro_str {
    int kind;
    int pooled; /* p lies in the value pool */
    int nomem;  /* the pool had no room: p is NULL */
    int heap;   /* p is malloc'd (a long string before AUTH) */
    size_t len;
    char *p;
} kvf_ro_str_t;

typedef struct kvf_ro_arr {
    int kind;
    int argc;
    void *argv[];
} kvf_ro_arr_t;

typedef struct kvf_resp_pool {
    char *base;
    size_t len;
    size_t granules;
    uint8_t *used; /* one byte per granule */
    size_t low;    /* no free granule below */
    size_t nused;  /* granules in use */
    pthread_mutex_t mu;
    kvf_region_h region;
} kvf_resp_pool_t;

typedef struct kvf_resp_loop kvf_resp_loop_t;

typedef struct kvf_resp_vlease kvf_resp_vlease_t;

/* A value read by a GET, shared by every connection of one batch that
 * asked for its key (one loop thread: plain reference count). Its bytes
 * lie in the pool, or in a store view (vl set: the node's memory, held
 * under vl's lease), or in memory of its own (heap: a view's bytes
 * copied before its lease ran out). */
typedef struct kvf_resp_val {
    char *p;
    size_t cap, len;
    unsigned refs;
    kvf_resp_vlease_t *vl; /* the view's lease, or NULL */
    size_t vidx;           /* its slot in vl->vals */
    uint64_t sum;          /* a view's recorded checksum */
    int heap;              /* p is malloc'd */
    int broken;            /* its bytes were lost: connections close */
} kvf_resp_val_t;

/* The views of one batch's GETs (one kvf_store_view_get), held while
 * their values are sent; released when the last is, or copied out of
 * the views and released before the lease runs out. */
struct kvf_resp_vlease {
    kvf_store_view_lease_h h;
    kvf_resp_loop_t *lp;
    unsigned refs; /* values still in views */
    size_t nvals;
    kvf_resp_val_t **vals;          /* NULL once a value left the view */
    kvf_resp_vlease_t *prev, *next; /* lp->vleases */
};

/* The store command a connection waits on (at most one). */
enum { KVF_RESP_OP_NONE = 0, KVF_RESP_OP_GET, KVF_RESP_OP_SET };

/* A SET a loop is storing while it holds the key's stripe lock. A SET of
 * the same key on another loop, received meanwhile, can be answered with
 * its outcome instead of being stored after it: the two are concurrent,
 * and Redis could have run the other one first. */
typedef struct kvf_resp_flight {
    uint64_t gen; /* which store this is (0: none yet) */
    uint64_t hash;
    int active; /* being stored now */
    int ok;     /* once done: it was stored */
    char key[KVF_STORE_KEY_MAX + 1];
} kvf_resp_flight_t;

typedef struct kvf_resp_peer kvf_resp_peer_t;

typedef struct kvf_resp_conn {
    int fd;
    uint32_t events; /* epoll interest now */
    kvf_resp_loop_t *lp;
    redisReader *rd;
    char *out;
    size_t out_len, out_off;
    kvf_resp_val_t *big; /* GET value being sent, then "\r\n" */
    size_t big_off;
    int op;               /* KVF_RESP_OP_*: queued in the loop's batch */
    kvf_ro_str_t *oval;   /* SET: the value, owned by the op */
    kvf_status_t ost;     /* the op's outcome */
    kvf_resp_val_t *oget; /* GET: the value read */
    uint64_t ohash;
    char okey[KVF_STORE_KEY_MAX + 1];
    char *dbuf; /* a long bulk received straight into the pool */
    size_t dlen, dgot;
    int dready; /* dbuf is whole: the reader's next (empty) bulk is it */
    int ddrop;  /* the pool had no room: the bulk's bytes are dropped */
    const char *perr; /* a request broke a limit: the error, then close */
    size_t big_resv;  /* bytes of big counted in slow_held */
    uint64_t last_ms;
    uint64_t born_ms;
    int authed;
    unsigned auth_fails;
    int closing; /* close once the output is flushed */
    /* MULTI: the commands queued (parsed requests), then run at EXEC */
    int multi, mdirty;
    void **mq;
    size_t mn, mcap, mbytes, mrun; /* mrun: next to run after EXEC */
    int mreplay;
    /* guard.c (under the server's gmu): this connection's address, its
     * place in the list of unauthenticated connections, evicted: shut
     * down to make room (its counts are already given back) */
    unsigned char akey[17];
    char aname[48];
    kvf_resp_peer_t *peer;
    int ulisted, evicted;
    struct kvf_resp_conn *uprev, *unext;
    struct kvf_resp_conn *prev, *next;
} kvf_resp_conn_t;

struct kvf_resp_loop {
    struct kvf_resp *srv;
    int ep;
    pthread_t thr;
    kvf_resp_conn_t *conns;
    char *rbuf;
    /* connections whose GET or SET waits for the next store batch */
    kvf_resp_conn_t **q;
    size_t nq, qcap;
    /* sockets another loop accepted for this one (under hmu); wakefd
     * tells the loop they are there */
    int wakefd;
    kvf_resp_vlease_t *vleases; /* views being sent from */
    uint64_t trim_ms;           /* shared views trimmed last (view.c) */
    pthread_mutex_t hmu;
    kvf_resp_conn_t *hand[KVF_RESP_HAND_MAX];
    unsigned nhand;
};

/* Limits beyond the public parameters (config keys read at start). */
typedef struct kvf_resp_limits {
    uint64_t auth_timeout_ms; /* resp_auth_timeout_ms */
    unsigned per_addr;        /* resp_conns_per_addr */
    unsigned unauth_per_addr; /* resp_unauth_per_addr */
    size_t slow_mem;          /* resp_slow_mem */
} kvf_resp_limits_t;

/* Counters shown by INFO and logged at stop. */
typedef struct kvf_resp_stats {
    atomic_uint_fast64_t refused_max, refused_addr, evicted, auth_timeouts;
    atomic_uint_fast64_t auth_ok, auth_wrong, auth_throttled, auth_closed;
    atomic_uint_fast64_t noauth, proto_errors, pool_full;
    atomic_uint_fast64_t slow_refused, slow_copies;
} kvf_resp_stats_t;

#define KVF_RESP_PEER_BUCKETS 1024

struct kvf_resp {
    kvf_server_resp_params_t p;
    kvf_store_h st;
    kvf_resp_pool_t pool;
    kvf_resp_limits_t lim;
    kvf_resp_stats_t stats;
    int lfd;
    int stopfd;
    atomic_int stop;
    /* guard.c: connections admitted (not evicted), per address and per
     * network, and the unauthenticated ones oldest first (under gmu) */
    pthread_mutex_t gmu;
    unsigned nclients, nunauth, npeers;
    kvf_resp_peer_t *peers[KVF_RESP_PEER_BUCKETS];
    kvf_resp_conn_t *uhead, *utail;
    /* bytes of GET values from store views being sent (slow readers'
     * copies included), and of those copied out of their views */
    atomic_size_t slow_held, slow_copied;
    atomic_uint next_loop; /* the loop the next connection goes to */
    int spread; /* resp_spread: connections go to the loops in turn */
    atomic_size_t get_hint; /* size of the last value read */
    int views;              /* resp_views: GETs sent from store views */
    /* no views tried before this (kvf_time_ms): the last batch had no
     * node reached over shm */
    atomic_uint_fast64_t views_off_until;
    /* GETs sent from views, values copied out of a view whose lease was
     * ending, GETs read through the copy path (logged at stop) */
    atomic_uint_fast64_t nview, nrescue, ncopy;
    /* SETs stored, and SETs answered by another loop's store of their
     * key (kvf_resp_flight_t; logged at stop) */
    atomic_uint_fast64_t nstored, ncovered;
    /* SETs of one key run one at a time (by stripe), so they do not race
     * one another's puts (refused as busy) and one being stored can
     * answer the others (kvf_resp_flight_t) */
    pthread_mutex_t set_mu[KVF_RESP_SET_STRIPES];
    /* per stripe, one key its lock holder is storing (under fmu) */
    pthread_mutex_t fmu;
    pthread_cond_t fend; /* a flight ended (broadcast, under fmu) */
    uint64_t fgen;
    kvf_resp_flight_t flight[KVF_RESP_SET_STRIPES];
    unsigned nloops;
    kvf_resp_loop_t loops[KVF_RESP_LOOPS_MAX];
    char password[KVF_RESP_PW_MAX];
    size_t pwlen;
    char addr[KVF_HOST_MAX + 8];
};

/* The connection whose reader is parsing (objects go to its pool). */
extern __thread kvf_resp_conn_t *kvf_resp_cur;

/* One command being run: its connection, server and arguments. */
typedef struct kvf_resp_cmd {
    kvf_resp_conn_t *c;
    struct kvf_resp *s;
    int argc;
    kvf_ro_str_t **argv;
} kvf_resp_cmd_t;

/* ---- pool.c: the value pool and shared GET values ------------------ */

/* Maps the pool (s->p.pool bytes) and registers it with the store
 * client's engine; kvf_resp_pool_fini undoes what was done. */
kvf_status_t kvf_resp_pool_init(struct kvf_resp *s);
void kvf_resp_pool_fini(struct kvf_resp *s);
/* A buffer of len bytes (whole granules) or NULL when the pool is full;
 * any thread. */
char *kvf_resp_pool_alloc(kvf_resp_pool_t *pl, size_t len);
void kvf_resp_pool_free(kvf_resp_pool_t *pl, char *p, size_t len);
/* A value of cap bytes in the pool, one reference; NULL when full. */
kvf_resp_val_t *kvf_resp_val_new(struct kvf_resp *s, size_t cap);
void kvf_resp_val_unref(struct kvf_resp *s, kvf_resp_val_t *v);

/* ---- reader.c: request parsing ------------------------------------- */

/* A redisReader building the door's request objects. */
redisReader *kvf_resp_reader_new(void);
/* Frees a request object (its pooled value goes back to the pool of
 * kvf_resp_cur's server). */
void kvf_ro_free(void *obj);
/* Checks what the reader holds unparsed; 0 = the connection must close. */
int kvf_resp_check_pending(kvf_resp_conn_t *c);
/* Takes a long bulk the reader waits for out of its hands (see reader.c);
 * 1 when the bulk is already whole and the reader can go on. */
int kvf_resp_direct_start(kvf_resp_conn_t *c);
/* The direct bulk is whole: the reader sees its length line as "0"; -1
 * when the reader had no memory for it. */
int kvf_resp_direct_done(kvf_resp_conn_t *c);
/* Whether the connection is receiving (or dropping) a direct bulk. */
int kvf_resp_in_direct(const kvf_resp_conn_t *c);
/* Skips empty lines between requests, as Redis does. */
void kvf_resp_skip_blank(redisReader *rd);

/* ---- reply.c: replies and sending ---------------------------------- */

void kvf_resp_out(kvf_resp_conn_t *c, const void *p, size_t len);
void kvf_resp_outs(kvf_resp_conn_t *c, const char *s);
void kvf_resp_int(kvf_resp_conn_t *c, long long v);
void kvf_resp_bulk(kvf_resp_conn_t *c, const void *p, size_t len);
/* An error line from fmt and a (CR and LF replaced by spaces). */
void kvf_resp_err(kvf_resp_conn_t *c, const char *fmt, const char *a);
void kvf_resp_store_err(kvf_resp_conn_t *c, kvf_status_t st);
/* "-ERR why" for a request that broke the protocol or a limit; the
 * connection closes once it is sent. */
void kvf_resp_bad(kvf_resp_conn_t *c, const char *why);
/* 1 while the connection must not parse more (output backed up, a store
 * op or a long GET value in flight, closing). */
int kvf_resp_blocked(const kvf_resp_conn_t *c);
/* A GET's (SET's) answer once its batch ran. */
void kvf_resp_get_reply(kvf_resp_conn_t *c);
void kvf_resp_set_reply(kvf_resp_conn_t *c);
/* Sends what it can; -1 on a broken connection. */
int kvf_resp_flush(kvf_resp_conn_t *c);

/* ---- cmd.c: commands ----------------------------------------------- */

typedef struct kvf_resp_def {
    const char *name;
    int min, max; /* argc bounds, command name included (max 0 = any) */
    void (*fn)(kvf_resp_cmd_t *m);
} kvf_resp_def_t;

/* What kvf_resp_dispatch did with a request. */
enum { KVF_RESP_NOT_CMD = 0, KVF_RESP_DONE, KVF_RESP_KEPT };

/* Runs one parsed request: KVF_RESP_NOT_CMD when it is not a command
 * (protocol error), KVF_RESP_KEPT when MULTI queued it (the connection
 * owns it now), else KVF_RESP_DONE (the caller frees it). */
int kvf_resp_dispatch(kvf_resp_conn_t *c, void *obj);
/* Whether argument a is name (ASCII case-insensitive). */
int kvf_resp_is(const kvf_ro_str_t *a, const char *name);
/* The command called name, or NULL. */
const kvf_resp_def_t *kvf_resp_def_find(const kvf_ro_str_t *name);
/* Answers an unknown command (d NULL) or a wrong argument count; 0 when
 * the command may run. */
int kvf_resp_def_check(kvf_resp_cmd_t *m, const kvf_resp_def_t *d);

/* ---- txn.c: MULTI, EXEC, DISCARD ----------------------------------- */

void kvf_resp_cmd_multi(kvf_resp_cmd_t *m);
void kvf_resp_cmd_exec(kvf_resp_cmd_t *m);
void kvf_resp_cmd_discard(kvf_resp_cmd_t *m);
/* Whether d runs at once inside MULTI (EXEC, DISCARD, MULTI, QUIT). */
int kvf_resp_txn_ctl(const kvf_resp_def_t *d);
/* Inside MULTI: checks and queues the request obj (KVF_RESP_KEPT) or
 * answers why not and marks the transaction failed (KVF_RESP_DONE). */
int kvf_resp_txn_queue(kvf_resp_cmd_t *m, const kvf_resp_def_t *d, void *obj);
/* After EXEC: the next queued request to run (the caller frees it after
 * running it), or NULL when there is none. */
void *kvf_resp_txn_next(kvf_resp_conn_t *c);
/* Frees what MULTI queued and not yet ran. */
void kvf_resp_txn_free(kvf_resp_conn_t *c);

/* ---- guard.c: caps per address, AUTH attempts, slow readers -------- */

/* Admits a new connection c (its akey and aname set from sa), making
 * room by shutting down the oldest unauthenticated connection where a
 * cap is reached; -1 (with the cap's key in *why_p) when refused. */
int kvf_resp_guard_admit(struct kvf_resp *s, kvf_resp_conn_t *c,
                         const struct sockaddr *sa, const char **why_p);
/* c gave the password: it leaves the unauthenticated list. */
void kvf_resp_guard_authed(kvf_resp_conn_t *c);
/* c is closing: its counts are given back (before its fd is closed). */
void kvf_resp_guard_release(kvf_resp_conn_t *c);
/* Connections admitted now (and, in *unauth_p, not yet authenticated). */
unsigned kvf_resp_guard_counts(struct kvf_resp *s, unsigned *unauth_p);
/* 0 when c's network has no AUTH tokens left (AUTH refused unchecked). */
int kvf_resp_auth_allow(kvf_resp_conn_t *c);
/* A wrong password from c: one token of its network. */
void kvf_resp_auth_failed(kvf_resp_conn_t *c);
void kvf_resp_guard_fini(struct kvf_resp *s);
/* Counts n bytes of values being sent from views in resp_slow_mem; 0
 * (nothing counted) when they do not fit. */
int kvf_resp_slow_take(struct kvf_resp *s, size_t n);
void kvf_resp_slow_give(struct kvf_resp *s, size_t n);

/* ---- batch.c: store batches ---------------------------------------- */

/* Queues the connection's GET or SET for the loop's next store batch;
 * the connection parses nothing more until it is answered. */
void kvf_resp_enqueue(kvf_resp_conn_t *c, int op, const char *key,
                      kvf_ro_str_t *val);
/* Frees a SET's value (and its pool buffer). */
void kvf_resp_oval_free(struct kvf_resp *s, kvf_ro_str_t *v);
/* Runs the loop's queued GETs and SETs and answers them; returns their
 * connections (*n_p of them, NULL entries skipped), for the caller to
 * serve again (what they had pipelined may queue the next batch) and
 * free. */
kvf_resp_conn_t **kvf_resp_batch_run(kvf_resp_loop_t *lp, size_t *n_p);
/* kvf_resp_batch_run, then each of its connections served again (what
 * they had pipelined may queue the next batch). */
void kvf_resp_batch_serve(kvf_resp_loop_t *lp);

/* ---- view.c: GETs sent from store views -------------------------- */

/* Serves the GETs of u[0..n) it can from store views (one
 * kvf_store_view_get): those get ost and oget; the others are left with
 * ost KVF_INPROGRESS, for the copy path. */
void kvf_resp_view_batch(struct kvf_resp *s, kvf_resp_conn_t **u, size_t n);
/* A value of lease vl is freed (its last reference went). */
void kvf_resp_vlease_drop(kvf_resp_vlease_t *vl, kvf_resp_val_t *v);
/* Copies the values still in views whose leases end within the margin
 * and releases those leases; returns how long (ms) the loop may wait,
 * at most wait_ms, before the next check is due. */
int kvf_resp_views_tick(kvf_resp_loop_t *lp, int wait_ms);
/* 0 when the value's bytes may be sent now (copied out of its view
 * first if its lease is about to end); -1 when they were lost. */
int kvf_resp_val_ready(kvf_resp_val_t *v);

/* ---- conn.c: connections and event loops --------------------------- */

/* Runs a connection after an event (0: after its batch); closes it when
 * done with it. */
void kvf_resp_serve(kvf_resp_conn_t *c, uint32_t ev);
/* Makes the accepted socket fd (peer address sa) a connection: admitted
 * (guard.c) and given to a loop (resp_spread) or to lp; NULL when refused
 * (told why, fd closed). */
kvf_resp_conn_t *kvf_resp_conn_attach(kvf_resp_loop_t *lp, int fd,
                                      const struct sockaddr *sa);
/* A loop's thread: serves its connections until the server stops. */
void *kvf_resp_loop_main(void *arg);
/* Closes the sockets handed to a loop that it never took over (after
 * its thread ended). */
void kvf_resp_loop_drop_hand(kvf_resp_loop_t *lp);

#endif
