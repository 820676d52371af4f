/*
 * Request parsing: hiredis's redisReader parses the RESP2 stream and
 * builds the door's own objects (kvf_ro_*): a request is one array of
 * bulk strings (anything else, nested arrays included, is refused as it
 * is read, so a request never costs more than one array), where a string
 * longer than 1 KiB lies in the value pool. A long bulk the reader waits
 * for is taken out of its hands (kvf_resp_direct_start): its bytes are
 * received straight into a pool buffer, or dropped as they come when the
 * pool has no room, and once they are in the reader is fed a length of
 * "0" and the empty string it then builds stands for that buffer. The
 * checks here refuse a bulk length over the limit or not a number, and an
 * over-long line, before the reader grows. Before AUTH, Redis's rule
 * for unauthenticated clients holds: at most 10 arguments of at most
 * 16 KiB each, kept on the heap (never in the pool), and no more than
 * that held unparsed.
 */
#include "store/resp/resp_int.h"

#include <hiredis/sds.h>
#include <stdlib.h>
#include <string.h>

__thread kvf_resp_conn_t *kvf_resp_cur;

static void kvf_ro_attach(const redisReadTask *t, void *obj)
{
    kvf_ro_arr_t *parent;

    if (t->parent == NULL || t->parent->obj == NULL) {
        return;
    }
    parent = t->parent->obj;
    if (parent->kind == KVF_RO_ARR && t->idx >= 0 && t->idx < parent->argc) {
        parent->argv[t->idx] = obj;
    }
}

/* A request breaks a limit: the connection answers why and closes. The
 * reader stops here (the callback returns NULL). */
static void *kvf_ro_refuse(kvf_resp_conn_t *c, const char *why)
{
    if (c != NULL && c->perr == NULL) {
        c->perr = why;
    }
    return NULL;
}

/* Why an item of type t cannot stand where it is (NULL: it can): a
 * request is one array of bulk strings, as Redis reads them. */
static const char *kvf_ro_misplaced(const redisReadTask *t)
{
    if (t->parent == NULL) {
        return t->type == REDIS_REPLY_ARRAY
                   ? NULL
                   : "protocol error: expected a command (an array of bulk strings)";
    }
    switch (t->type) {
    case REDIS_REPLY_STRING:
        return NULL;
    case REDIS_REPLY_ARRAY:
        return "Protocol error: expected '$', got '*'";
    case REDIS_REPLY_INTEGER:
        return "Protocol error: expected '$', got ':'";
    case REDIS_REPLY_STATUS:
        return "Protocol error: expected '$', got '+'";
    case REDIS_REPLY_ERROR:
        return "Protocol error: expected '$', got '-'";
    default:
        return "Protocol error: invalid bulk length";
    }
}

/* Where a string of len bytes goes: in the object (short), the heap
 * (before AUTH: bounded by KVF_RESP_UNAUTH_BULK), else the pool. */
static void kvf_ro_place(kvf_resp_conn_t *c, kvf_ro_str_t *o, size_t len)
{
    if (len <= KVF_RESP_SMALL_STR) {
        o->p = (char *)(o + 1);
    } else if (c != NULL && !c->authed) {
        o->p = malloc(len);
        o->heap = o->p != NULL;
        o->nomem = o->p == NULL;
    } else if (c != NULL) {
        o->p = kvf_resp_pool_alloc(&c->lp->srv->pool, len);
        o->pooled = o->p != NULL;
        o->nomem = o->p == NULL;
    }
}

static void *kvf_ro_string(const redisReadTask *t, char *str, size_t len)
{
    kvf_resp_conn_t *c = kvf_resp_cur;
    const char *bad = kvf_ro_misplaced(t);
    kvf_ro_str_t *o;

    if (bad != NULL) {
        return kvf_ro_refuse(c, bad);
    }
    if (c != NULL && !c->authed && len > KVF_RESP_UNAUTH_BULK) {
        return kvf_ro_refuse(c, "Protocol error: unauthenticated bulk length");
    }
    o = calloc(1, sizeof(*o) + (len <= KVF_RESP_SMALL_STR ? len + 1 : 0));
    if (o == NULL) {
        return NULL;
    }
    o->kind = KVF_RO_STR;
    o->len = len;
    if (c != NULL && c->dready && len == 0) {
        o->p = c->dbuf; /* the bulk kvf_resp_direct_start took over */
        o->len = c->dlen;
        o->pooled = o->p != NULL;
        o->nomem = c->ddrop; /* its bytes were dropped: pool full */
        c->dbuf = NULL;
        c->dready = c->ddrop = 0;
    } else {
        kvf_ro_place(c, o, len);
    }
    if (o->p != NULL && len > 0) {
        memcpy(o->p, str, len);
    }
    kvf_ro_attach(t, o);
    return o;
}

static void *kvf_ro_array(const redisReadTask *t, int elements)
{
    kvf_resp_conn_t *c = kvf_resp_cur;
    const char *bad = kvf_ro_misplaced(t);
    kvf_ro_arr_t *o;

    if (bad != NULL) {
        return kvf_ro_refuse(c, bad);
    }
    if (elements < 0 || elements > KVF_RESP_ARGS_MAX) {
        return kvf_ro_refuse(c, "Protocol error: invalid multibulk length");
    }
    if (c != NULL && !c->authed && elements > KVF_RESP_UNAUTH_ARGS) {
        return kvf_ro_refuse(c,
                             "Protocol error: unauthenticated multibulk length");
    }
    o = calloc(1, sizeof(*o) + (size_t)elements * sizeof(void *));
    if (o == NULL) {
        return NULL;
    }
    o->kind = KVF_RO_ARR;
    o->argc = elements;
    kvf_ro_attach(t, o);
    return o;
}

/* Integers, nils, status and error lines: never part of a request. */
static void *kvf_ro_other(const redisReadTask *t)
{
    const char *bad = kvf_ro_misplaced(t);

    return kvf_ro_refuse(kvf_resp_cur, bad != NULL ? bad
                                                   : "Protocol error: "
                                                     "invalid bulk length");
}

static void *kvf_ro_integer(const redisReadTask *t, long long v)
{
    (void)v;
    return kvf_ro_other(t);
}

void kvf_ro_free(void *obj)
{
    int *kind = obj;
    kvf_ro_arr_t *a;
    kvf_ro_str_t *s;
    int i;

    if (obj == NULL) {
        return;
    }
    if (*kind == KVF_RO_ARR) {
        a = obj;
        for (i = 0; i < a->argc; i++) {
            kvf_ro_free(a->argv[i]);
        }
    } else {
        s = obj;
        if (s->pooled && kvf_resp_cur != NULL) {
            kvf_resp_pool_free(&kvf_resp_cur->lp->srv->pool, s->p, s->len);
        } else if (s->heap) {
            free(s->p);
        }
    }
    free(obj);
}

static redisReplyObjectFunctions kvf_ro_fns = {
    kvf_ro_string, kvf_ro_array, kvf_ro_integer, kvf_ro_other, kvf_ro_free,
};

redisReader *kvf_resp_reader_new(void)
{
    return redisReaderCreateWithFunctions(&kvf_ro_fns);
}

/* The direct bulk is whole: the reader sees its length line as "0";
 * -1 when the reader had no memory for it. */
int kvf_resp_direct_done(kvf_resp_conn_t *c)
{
    redisReader *rd = c->rd;
    size_t rest = rd->len - rd->pos;
    char tail[2];

    /* "0\r\n" goes before the bytes that followed the bulk (at most 1) */
    memcpy(tail, rd->buf + rd->pos, rest < 2 ? rest : 2);
    rd->len = rd->pos;
    sdssetlen(rd->buf, rd->len);
    c->dready = 1;
    if (redisReaderFeed(rd, "0\r\n", 3) != REDIS_OK ||
        (rest > 0 &&
         redisReaderFeed(rd, tail, rest < 2 ? rest : 2) != REDIS_OK)) {
        return -1;
    }
    return 0;
}

int kvf_resp_in_direct(const kvf_resp_conn_t *c)
{
    return (c->dbuf != NULL || c->ddrop) && !c->dready;
}

/* Bulk length at the reader's cursor when it waits inside a bulk, else -1;
 * -2 when that length is not a number. */
static long long kvf_resp_pending_bulk(const redisReader *rd)
{
    const char *p = rd->buf + rd->pos;
    size_t n = rd->len - rd->pos, i;
    long long v = 0;

    if (rd->ridx < 0 || KVF_RESP_TASK_TYPE(rd) != REDIS_REPLY_STRING) {
        return -1;
    }
    for (i = 0; i < n && p[i] != '\r'; i++) {
        if (p[i] < '0' || p[i] > '9' || i >= 18) {
            return (i == 0 && p[i] == '-') ? -1 : -2;
        }
        v = v * 10 + (p[i] - '0');
    }
    return v;
}

/* Checks what the reader holds unparsed; 0 = the connection must close
 * (told why). Before AUTH a bulk and what is held are bounded by
 * Redis's rule for unauthenticated clients. */
int kvf_resp_check_pending(kvf_resp_conn_t *c)
{
    const redisReader *rd = c->rd;
    long long bulk = kvf_resp_pending_bulk(rd);
    size_t held = rd->len - rd->pos;

    if (bulk == -2 || (bulk >= 0 && (uint64_t)bulk > c->lp->srv->p.max_value)) {
        kvf_resp_bad(c, "Protocol error: invalid bulk length");
        return 0;
    }
    if (bulk >= 0 && rd->ridx == 0) { /* a bulk where a command begins */
        kvf_resp_bad(c, "protocol error: expected a command (an array of bulk strings)");
        return 0;
    }
    if (!c->authed && bulk > (long long)KVF_RESP_UNAUTH_BULK) {
        kvf_resp_bad(c, "Protocol error: unauthenticated bulk length");
        return 0;
    }
    if (!c->authed && held > KVF_RESP_UNAUTH_HELD) {
        kvf_resp_bad(c, "Protocol error: unauthenticated request too long");
        return 0;
    }
    if (held > KVF_RESP_LINE_MAX &&
        (bulk < 0 || held > (size_t)bulk + 2 * KVF_RESP_LINE_MAX)) {
        kvf_resp_bad(c, "Protocol error: too big request line");
        return 0;
    }
    return 1;
}

/* Takes a long bulk the reader waits for out of its hands: its bytes so far
 * move into a pool buffer and the rest is received there directly (no
 * copies through the reader's growing buffer); the reader is left at the
 * bulk's length, to be told "0" once the bytes are in. */
int kvf_resp_direct_start(kvf_resp_conn_t *c)
{
    redisReader *rd = c->rd;
    long long bulk = kvf_resp_pending_bulk(rd);
    const char *eol;
    size_t have, take;

    if (c->dbuf != NULL || c->dready || c->ddrop || !c->authed ||
        bulk < (long long)KVF_RESP_DIRECT_MIN) {
        return 0;
    }
    eol = memchr(rd->buf + rd->pos, '\n', rd->len - rd->pos);
    if (eol == NULL) {
        return 0; /* the length line is not whole yet */
    }
    c->dbuf = kvf_resp_pool_alloc(&c->lp->srv->pool, (size_t)bulk);
    if (c->dbuf == NULL) {
        /* no room: the bytes are dropped as they come (never held
         * anywhere), and the command is answered "pool full" */
        c->ddrop = 1;
        atomic_fetch_add(&c->lp->srv->stats.pool_full, 1);
    }
    c->dlen = (size_t)bulk;
    have = rd->len - (size_t)(eol + 1 - rd->buf);
    take = have < c->dlen ? have : c->dlen;
    if (c->dbuf != NULL) {
        memcpy(c->dbuf, eol + 1, take);
    }
    c->dgot = take;
    /* what followed the bytes (part of "\r\n") stays for the reader */
    memmove(rd->buf + rd->pos, eol + 1 + take, have - take);
    rd->len = rd->pos + (have - take);
    sdssetlen(rd->buf, rd->len);
    rd->buf[rd->len] = 0;
    if (c->dgot < c->dlen) {
        return 0;
    }
    if (kvf_resp_direct_done(c) != 0) {
        kvf_resp_bad(c, "out of memory");
        return 0;
    }
    return 1;
}

/* Skips empty lines between requests, as Redis does (redis-cli --pipe
 * sends one before its closing ECHO). */
void kvf_resp_skip_blank(redisReader *rd)
{
    while (rd->ridx == -1 && rd->pos < rd->len &&
           (rd->buf[rd->pos] == '\r' || rd->buf[rd->pos] == '\n')) {
        rd->pos++;
    }
}
