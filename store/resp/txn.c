/*
 * MULTI, EXEC and DISCARD over the door's commands, as redis-py's
 * default pipeline() sends them: after MULTI each command is checked
 * (name, argument count) and queued, answered +QUEUED; EXEC answers the
 * array header and then runs the queued commands in order, each
 * answered as it would be alone (a GET or SET still waits for its store
 * batch, so their replies keep their order); DISCARD drops the queue. A
 * command refused while queueing makes EXEC answer -EXECABORT, as Redis
 * does. The commands run one after another on this connection, but other
 * clients' commands may run between them: the door has no isolation
 * between keys, and WATCH is not offered.
 *
 * The queue holds the parsed requests (their long values in the pool) and
 * is bounded: KVF_RESP_MULTI_MAX commands, KVF_RESP_MULTI_MAX_BYTES of
 * arguments outside the pool.
 */
#include "store/resp/resp_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int kvf_resp_txn_ctl(const kvf_resp_def_t *d)
{
    return d != NULL && (strcmp(d->name, "EXEC") == 0 ||
                         strcmp(d->name, "DISCARD") == 0 ||
                         strcmp(d->name, "MULTI") == 0 ||
                         strcmp(d->name, "QUIT") == 0);
}

/* Bytes a queued request holds outside the pool. */
static size_t kvf_resp_txn_bytes(const kvf_resp_cmd_t *m)
{
    size_t n = sizeof(kvf_ro_arr_t) + (size_t)m->argc * sizeof(void *);
    int i;

    for (i = 0; i < m->argc; i++) {
        n += sizeof(kvf_ro_str_t) + (m->argv[i]->pooled ? 0 : m->argv[i]->len);
    }
    return n;
}

int kvf_resp_txn_queue(kvf_resp_cmd_t *m, const kvf_resp_def_t *d, void *obj)
{
    kvf_resp_conn_t *c = m->c;
    size_t bytes = kvf_resp_txn_bytes(m), cap;
    void **q;

    if (kvf_resp_def_check(m, d) != 0) {
        c->mdirty = 1;
        return KVF_RESP_DONE;
    }
    if (c->mn >= KVF_RESP_MULTI_MAX ||
        c->mbytes + bytes > KVF_RESP_MULTI_MAX_BYTES) {
        kvf_resp_outs(c, "-ERR too many commands in this transaction\r\n");
        c->mdirty = 1;
        return KVF_RESP_DONE;
    }
    if (c->mn == c->mcap) {
        cap = c->mcap ? 2 * c->mcap : 16;
        q = realloc(c->mq, cap * sizeof(*q));
        if (q == NULL) {
            kvf_resp_outs(c, "-ERR out of memory\r\n");
            c->mdirty = 1;
            return KVF_RESP_DONE;
        }
        c->mq = q;
        c->mcap = cap;
    }
    c->mq[c->mn++] = obj;
    c->mbytes += bytes;
    kvf_resp_outs(c, "+QUEUED\r\n");
    return KVF_RESP_KEPT;
}

/* Frees the queued requests from i on. */
static void kvf_resp_txn_drop(kvf_resp_conn_t *c, size_t i)
{
    for (; i < c->mn; i++) {
        kvf_ro_free(c->mq[i]);
    }
    free(c->mq);
    c->mq = NULL;
    c->mn = c->mcap = c->mbytes = c->mrun = 0;
    c->mreplay = 0;
}

void kvf_resp_txn_free(kvf_resp_conn_t *c)
{
    kvf_resp_txn_drop(c, c->mreplay ? c->mrun : 0);
    c->multi = c->mdirty = 0;
}

void *kvf_resp_txn_next(kvf_resp_conn_t *c)
{
    if (!c->mreplay) {
        return NULL;
    }
    if (c->mrun < c->mn) {
        return c->mq[c->mrun++];
    }
    kvf_resp_txn_drop(c, c->mn); /* all run: each was freed after it */
    return NULL;
}

void kvf_resp_cmd_multi(kvf_resp_cmd_t *m)
{
    if (m->c->multi) {
        kvf_resp_outs(m->c, "-ERR MULTI calls can not be nested\r\n");
        return;
    }
    m->c->multi = 1;
    m->c->mdirty = 0;
    kvf_resp_outs(m->c, "+OK\r\n");
}

void kvf_resp_cmd_exec(kvf_resp_cmd_t *m)
{
    kvf_resp_conn_t *c = m->c;
    char hdr[32];

    if (!c->multi) {
        kvf_resp_outs(c, "-ERR EXEC without MULTI\r\n");
        return;
    }
    c->multi = 0;
    if (c->mdirty) {
        kvf_resp_txn_drop(c, 0);
        c->mdirty = 0;
        kvf_resp_outs(c, "-EXECABORT Transaction discarded because of "
                         "previous errors.\r\n");
        return;
    }
    kvf_resp_out(c, hdr, (size_t)snprintf(hdr, sizeof(hdr), "*%zu\r\n", c->mn));
    c->mreplay = 1; /* the connection's loop runs them next */
    c->mrun = 0;
}

void kvf_resp_cmd_discard(kvf_resp_cmd_t *m)
{
    if (!m->c->multi) {
        kvf_resp_outs(m->c, "-ERR DISCARD without MULTI\r\n");
        return;
    }
    kvf_resp_txn_free(m->c);
    kvf_resp_outs(m->c, "+OK\r\n");
}
