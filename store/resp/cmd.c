/*
 * The commands the door answers: GET and SET (queued for the loop's store
 * batch), EXISTS, DEL and UNLINK (run at once), AUTH (constant-time
 * compare, limited per connection and per network: guard.c), PING, ECHO,
 * QUIT, INFO (the door's counters), MULTI/EXEC/DISCARD (txn.c), and the
 * handshake commands redis-cli, redis-py and redis-benchmark send (HELLO
 * as a RESP2-only Redis answers it, COMMAND, CONFIG GET, CLIENT, SELECT).
 * Before AUTH only AUTH, PING, QUIT and HELLO are answered when a
 * password is set.
 */
#include "store/resp/resp_int.h"

#include "core/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

int kvf_resp_is(const kvf_ro_str_t *a, const char *name)
{
    return a->len == strlen(name) && strncasecmp(a->p, name, a->len) == 0;
}

/* The key as a C string in kb; 0 when it is not a valid store key. */
static int kvf_resp_key(const kvf_ro_str_t *a, char *kb)
{
    if (a->len == 0 || a->len > KVF_STORE_KEY_MAX ||
        memchr(a->p, 0, a->len) != NULL) {
        return 0;
    }
    memcpy(kb, a->p, a->len);
    kb[a->len] = 0;
    return 1;
}

static void kvf_resp_cmd_get(kvf_resp_cmd_t *m)
{
    char key[KVF_STORE_KEY_MAX + 1];

    if (!kvf_resp_key(m->argv[1], key)) {
        kvf_resp_outs(m->c, "$-1\r\n");
        return;
    }
    kvf_resp_enqueue(m->c, KVF_RESP_OP_GET, key, NULL);
}

static void kvf_resp_cmd_set(kvf_resp_cmd_t *m)
{
    char key[KVF_STORE_KEY_MAX + 1];
    kvf_ro_str_t *v = m->argv[2];
    int i;

    /* EX/PX/EXAT/PXAT/KEEPTTL are accepted and ignored (no expiry) */
    for (i = 3; i < m->argc; i++) {
        if (kvf_resp_is(m->argv[i], "EX") || kvf_resp_is(m->argv[i], "PX") ||
            kvf_resp_is(m->argv[i], "EXAT") ||
            kvf_resp_is(m->argv[i], "PXAT")) {
            i++;
        } else if (!kvf_resp_is(m->argv[i], "KEEPTTL")) {
            kvf_resp_outs(m->c, "-ERR syntax error\r\n");
            return;
        }
    }
    if (i > m->argc) {
        kvf_resp_outs(m->c, "-ERR syntax error\r\n");
    } else if (!kvf_resp_key(m->argv[1], key)) {
        kvf_resp_outs(m->c, "-ERR invalid key\r\n");
    } else if (v->nomem) {
        kvf_resp_outs(m->c, "-ERR value pool full, try again\r\n");
    } else {
        m->argv[2] = NULL; /* the op owns the value now */
        kvf_resp_enqueue(m->c, KVF_RESP_OP_SET, key, v);
        if (m->c->op == KVF_RESP_OP_NONE) {
            m->argv[2] = v;
        }
    }
}
/* EXISTS and DEL: the count of keys present (removed). */
static void kvf_resp_cmd_keys(kvf_resp_cmd_t *m, int del)
{
    char key[KVF_STORE_KEY_MAX + 1];
    long long n = 0;
    kvf_status_t st;
    int i;

    for (i = 1; i < m->argc; i++) {
        if (!kvf_resp_key(m->argv[i], key)) {
            continue;
        }
        st = del ? kvf_store_remove(m->s->st, key)
                 : kvf_store_exists(m->s->st, key);
        if (st == KVF_OK) {
            n++;
        } else if (st != KVF_ERR_NO_KEY && st != KVF_ERR_NOT_READY) {
            kvf_resp_store_err(m->c, st);
            return;
        }
    }
    kvf_resp_int(m->c, n);
}

static int kvf_resp_pw_equal(const struct kvf_resp *s, const kvf_ro_str_t *a)
{
    unsigned char d = (unsigned char)(a->len != s->pwlen);
    size_t i;

    for (i = 0; i < s->pwlen; i++) {
        d |= (unsigned char)(s->password[i] ^ (i < a->len ? a->p[i] : 0));
    }
    return d == 0;
}

static const char kvf_resp_wrongpass[] =
    "-WRONGPASS invalid username-password pair or user is disabled.\r\n";

/* Checks a password (and user, or NULL) for AUTH and HELLO ... AUTH;
 * 1 when the connection is now authenticated, else 0 with the error
 * written. Wrong passwords cost the network's AUTH tokens (guard.c); a
 * connection is closed after KVF_RESP_AUTH_TRIES of them. */
static int kvf_resp_auth_check(kvf_resp_cmd_t *m, const kvf_ro_str_t *user,
                               const kvf_ro_str_t *pw)
{
    kvf_resp_conn_t *c = m->c;
    struct kvf_resp *s = m->s;

    if (!kvf_resp_auth_allow(c)) {
        atomic_fetch_add(&s->stats.auth_throttled, 1);
        kvf_log_rl(KVF_LOG_WARN, "resp: AUTH from %s refused unchecked: over "
                   "%u wrong AUTHs a second from its network", c->aname,
                   KVF_RESP_AUTH_RATE);
        kvf_resp_outs(c, "-ERR too many wrong AUTH attempts from this "
                         "address, try again later\r\n");
        c->closing = 1;
        return 0;
    }
    if ((user == NULL || kvf_resp_is(user, "default")) &&
        kvf_resp_pw_equal(s, pw)) {
        if (!c->authed) {
            c->authed = 1;
            kvf_resp_guard_authed(c);
        }
        atomic_fetch_add(&s->stats.auth_ok, 1);
        return 1;
    }
    kvf_resp_auth_failed(c);
    atomic_fetch_add(&s->stats.auth_wrong, 1);
    kvf_log_rl(KVF_LOG_WARN, "resp: wrong AUTH password from %s (the "
               "password is kvferry resp --print-password's, or the "
               "resp_password_file's)", c->aname);
    kvf_resp_outs(c, kvf_resp_wrongpass);
    if (++c->auth_fails >= KVF_RESP_AUTH_TRIES) {
        atomic_fetch_add(&s->stats.auth_closed, 1);
        c->closing = 1;
    }
    return 0;
}

static void kvf_resp_cmd_auth(kvf_resp_cmd_t *m)
{
    if (m->s->pwlen == 0) {
        kvf_resp_outs(m->c, "-ERR AUTH <password> called without any "
                            "password configured for the default user. "
                            "Are you sure your configuration is correct?\r\n");
    } else if (m->argc > 3) {
        kvf_resp_outs(m->c, "-ERR syntax error\r\n");
    } else if (kvf_resp_auth_check(m, m->argc == 3 ? m->argv[1] : NULL,
                                   m->argv[m->argc - 1])) {
        kvf_resp_outs(m->c, "+OK\r\n");
    }
}

/* HELLO's options after the version: AUTH user pass, SETNAME name; 0
 * when one is wrong (answered) or AUTH failed. */
static int kvf_resp_hello_opts(kvf_resp_cmd_t *m)
{
    int i;

    for (i = 2; i < m->argc; i++) {
        int more = m->argc - i - 1;

        if (kvf_resp_is(m->argv[i], "AUTH") && more >= 2) {
            if (m->s->pwlen > 0 &&
                !kvf_resp_auth_check(m, m->argv[i + 1], m->argv[i + 2])) {
                return 0;
            }
            i += 2;
        } else if (kvf_resp_is(m->argv[i], "SETNAME") && more >= 1) {
            i++;
        } else {
            kvf_resp_err(m->c, "-ERR Syntax error in HELLO option '%.64s'",
                         m->argv[i]->p);
            return 0;
        }
    }
    return 1;
}

/* HELLO [protover [AUTH user pass] [SETNAME name]], as a Redis that
 * speaks RESP2 only: version 2 (or none) gets the server's facts as an
 * array, any other -NOPROTO; before AUTH it must carry AUTH. */
static void kvf_resp_cmd_hello(kvf_resp_cmd_t *m)
{
    static const char reply[] =
        "*14\r\n$6\r\nserver\r\n$5\r\nredis\r\n$7\r\nversion\r\n"
        "$5\r\n7.0.0\r\n$5\r\nproto\r\n:2\r\n$2\r\nid\r\n:1\r\n"
        "$4\r\nmode\r\n$10\r\nstandalone\r\n$4\r\nrole\r\n$6\r\nmaster\r\n"
        "$7\r\nmodules\r\n*0\r\n";
    char v[24];
    long ver = 2;

    if (m->argc > 1) {
        size_t n = m->argv[1]->len < sizeof(v) - 1 ? m->argv[1]->len
                                                    : sizeof(v) - 1;
        char *end;

        memcpy(v, m->argv[1]->p, n);
        v[n] = 0;
        ver = strtol(v, &end, 10);
        if (n == 0 || *end != 0 || m->argv[1]->len >= sizeof(v) - 1) {
            kvf_resp_outs(m->c, "-ERR Protocol version is not an integer or "
                                "out of range\r\n");
            return;
        }
    }
    if (ver != 2) {
        kvf_resp_outs(m->c, "-NOPROTO sorry, this protocol version is not "
                            "supported.\r\n");
    } else if (kvf_resp_hello_opts(m)) {
        if (!m->c->authed) {
            kvf_resp_outs(m->c,
                          "-NOAUTH HELLO must be called with the client "
                          "already authenticated, otherwise the HELLO "
                          "<proto> AUTH <user> <pass> option can be used to "
                          "authenticate the client and select the RESP "
                          "protocol version at the same time\r\n");
        } else {
            kvf_resp_out(m->c, reply, sizeof(reply) - 1);
        }
    }
}

/* Commands answered before AUTH. */
static int kvf_resp_open_cmd(const kvf_ro_str_t *name)
{
    return kvf_resp_is(name, "AUTH") || kvf_resp_is(name, "PING") ||
           kvf_resp_is(name, "QUIT") || kvf_resp_is(name, "HELLO");
}

static void kvf_resp_cmd_ping(kvf_resp_cmd_t *m)
{
    if (m->argc > 1) {
        kvf_resp_bulk(m->c, m->argv[1]->p, m->argv[1]->len);
    } else {
        kvf_resp_outs(m->c, "+PONG\r\n");
    }
}

/* ECHO: redis-cli --pipe ends its stream with one to know it is done. */
static void kvf_resp_cmd_echo(kvf_resp_cmd_t *m)
{
    kvf_resp_bulk(m->c, m->argv[1]->p, m->argv[1]->len);
}

static void kvf_resp_cmd_exists(kvf_resp_cmd_t *m)
{
    kvf_resp_cmd_keys(m, 0);
}

static void kvf_resp_cmd_del(kvf_resp_cmd_t *m)
{
    kvf_resp_cmd_keys(m, 1);
}

static void kvf_resp_cmd_quit(kvf_resp_cmd_t *m)
{
    kvf_resp_outs(m->c, "+OK\r\n");
    m->c->closing = 1;
}

static void kvf_resp_cmd_ok(kvf_resp_cmd_t *m)
{
    kvf_resp_outs(m->c, "+OK\r\n");
}

/* COMMAND: an empty list (clients only probe it). */
static void kvf_resp_cmd_empty(kvf_resp_cmd_t *m)
{
    kvf_resp_outs(m->c, "*0\r\n");
}

/* CONFIG GET name: the name with an empty value (no persistence). */
static void kvf_resp_cmd_config(kvf_resp_cmd_t *m)
{
    if (m->argc != 3 || !kvf_resp_is(m->argv[1], "GET") ||
        m->argv[2]->len > 64) {
        kvf_resp_outs(m->c, "*0\r\n");
        return;
    }
    kvf_resp_outs(m->c, "*2\r\n");
    kvf_resp_bulk(m->c, m->argv[2]->p, m->argv[2]->len);
    kvf_resp_outs(m->c, kvf_resp_is(m->argv[2], "appendonly") ? "$2\r\nno\r\n"
                                                              : "$0\r\n\r\n");
}

#define KVF_RESP_U(x) ((unsigned long long)atomic_load(&(x)))

/* INFO [section]: Redis's server and clients facts, and the door's own
 * counters (section kvferry): what the limits refused and what memory
 * is held. The section argument is accepted and ignored. */
static void kvf_resp_cmd_info(kvf_resp_cmd_t *m)
{
    struct kvf_resp *s = m->s;
    const kvf_resp_stats_t *st = &s->stats;
    unsigned unauth, n = kvf_resp_guard_counts(s, &unauth);
    char b[2048];
    int k;

    pthread_mutex_lock(&s->pool.mu);
    k = snprintf(b, sizeof(b),
                 "# Server\r\nredis_version:7.0.0\r\nredis_mode:standalone\r\n"
                 "# Clients\r\nconnected_clients:%u\r\nmaxclients:%u\r\n"
                 "# kvferry\r\nunauthenticated_clients:%u\r\n"
                 "pool_bytes:%zu\r\npool_used_bytes:%zu\r\n",
                 n, s->p.max_clients, unauth, s->pool.len,
                 s->pool.nused * (size_t)KVF_RESP_GRANULE);
    pthread_mutex_unlock(&s->pool.mu);
    k += snprintf(b + k, sizeof(b) - (size_t)k,
                  "slow_mem_max:%zu\r\nslow_mem_held:%zu\r\n"
                  "slow_mem_copied:%zu\r\nslow_refused:%llu\r\n"
                  "refused_max_clients:%llu\r\nrefused_per_addr:%llu\r\n"
                  "unauth_evicted:%llu\r\nauth_timeouts:%llu\r\n",
                  s->lim.slow_mem, atomic_load(&s->slow_held),
                  atomic_load(&s->slow_copied), KVF_RESP_U(st->slow_refused),
                  KVF_RESP_U(st->refused_max), KVF_RESP_U(st->refused_addr),
                  KVF_RESP_U(st->evicted), KVF_RESP_U(st->auth_timeouts));
    k += snprintf(b + k, sizeof(b) - (size_t)k,
                  "auth_ok:%llu\r\nauth_wrong:%llu\r\nauth_throttled:%llu\r\n"
                  "auth_closed:%llu\r\nnoauth_replies:%llu\r\n"
                  "protocol_errors:%llu\r\npool_full_replies:%llu\r\n"
                  "gets_from_views:%llu\r\ngets_rescued:%llu\r\n"
                  "gets_copied:%llu\r\nsets_stored:%llu\r\n",
                  KVF_RESP_U(st->auth_ok), KVF_RESP_U(st->auth_wrong),
                  KVF_RESP_U(st->auth_throttled), KVF_RESP_U(st->auth_closed),
                  KVF_RESP_U(st->noauth), KVF_RESP_U(st->proto_errors),
                  KVF_RESP_U(st->pool_full), KVF_RESP_U(s->nview),
                  KVF_RESP_U(s->nrescue), KVF_RESP_U(s->ncopy),
                  KVF_RESP_U(s->nstored));
    kvf_resp_bulk(m->c, b, (size_t)k < sizeof(b) ? (size_t)k : sizeof(b) - 1);
}

static const kvf_resp_def_t kvf_resp_defs[] = {
    {"GET", 2, 2, kvf_resp_cmd_get},
    {"SET", 3, 0, kvf_resp_cmd_set},
    {"EXISTS", 2, 0, kvf_resp_cmd_exists},
    {"DEL", 2, 0, kvf_resp_cmd_del},
    {"UNLINK", 2, 0, kvf_resp_cmd_del},
    {"PING", 1, 2, kvf_resp_cmd_ping},
    {"ECHO", 2, 2, kvf_resp_cmd_echo},
    {"AUTH", 2, 3, kvf_resp_cmd_auth},
    {"QUIT", 1, 0, kvf_resp_cmd_quit},
    {"HELLO", 1, 0, kvf_resp_cmd_hello},
    {"INFO", 1, 0, kvf_resp_cmd_info},
    {"MULTI", 1, 1, kvf_resp_cmd_multi},
    {"EXEC", 1, 1, kvf_resp_cmd_exec},
    {"DISCARD", 1, 1, kvf_resp_cmd_discard},
    {"COMMAND", 1, 0, kvf_resp_cmd_empty},
    {"CONFIG", 2, 0, kvf_resp_cmd_config},
    {"CLIENT", 2, 0, kvf_resp_cmd_ok},
    {"SELECT", 2, 2, kvf_resp_cmd_ok},
    {NULL, 0, 0, NULL},
};

const kvf_resp_def_t *kvf_resp_def_find(const kvf_ro_str_t *name)
{
    const kvf_resp_def_t *d;

    for (d = kvf_resp_defs; d->name != NULL; d++) {
        if (kvf_resp_is(name, d->name)) {
            return d;
        }
    }
    return NULL;
}

/* Answers an unknown command or a wrong argument count; 0 when the
 * command may run. */
int kvf_resp_def_check(kvf_resp_cmd_t *m, const kvf_resp_def_t *d)
{
    char name[64];
    size_t n;

    if (d == NULL) {
        n = m->argv[0]->len < 63 ? m->argv[0]->len : 63;
        memcpy(name, m->argv[0]->p, n);
        name[n] = 0;
        kvf_resp_err(m->c, "-ERR unknown command '%s'", name);
        return -1;
    }
    if (m->argc < d->min || (d->max > 0 && m->argc > d->max)) {
        kvf_resp_err(m->c, "-ERR wrong number of arguments for '%s' command",
                     d->name);
        return -1;
    }
    return 0;
}

/* A command before AUTH that needs it: answered as Redis does, and the
 * door says why in its log (a client with no password set, as LMCache's
 * resp:// without one, only shows that the reply was not what it
 * expected). */
static void kvf_resp_noauth(kvf_resp_cmd_t *m)
{
    char name[24];
    size_t n = m->argv[0]->len < sizeof(name) - 1 ? m->argv[0]->len
                                                   : sizeof(name) - 1;

    memcpy(name, m->argv[0]->p, n);
    name[n] = 0;
    for (size_t i = 0; i < n; i++) {
        name[i] = (name[i] < 0x20 || name[i] > 0x7e) ? '?' : name[i];
    }
    atomic_fetch_add(&m->s->stats.noauth, 1);
    kvf_log_rl(KVF_LOG_WARN, "resp: %s sent %s before AUTH: answered -NOAUTH "
               "(the client has no password set: give it kvferry resp "
               "--print-password's, see docs/resp.md)", m->c->aname, name);
    kvf_resp_outs(m->c, "-NOAUTH Authentication required.\r\n");
}

/* The request's arguments, checked: 0 when it is not a command. */
static int kvf_resp_args(kvf_resp_cmd_t *m, kvf_ro_arr_t *a)
{
    int i;

    if (a->kind != KVF_RO_ARR) {
        return 0;
    }
    for (i = 0; i < a->argc; i++) {
        if (a->argv[i] == NULL || *(int *)a->argv[i] != KVF_RO_STR) {
            return 0;
        }
    }
    m->argc = a->argc;
    m->argv = (kvf_ro_str_t **)a->argv;
    return 1;
}

/* Whether an argument could not be kept (the pool had no room). */
static int kvf_resp_nomem(const kvf_resp_cmd_t *m)
{
    int i;

    for (i = 0; i < m->argc; i++) {
        if (m->argv[i]->nomem) {
            return 1;
        }
    }
    return 0;
}

/* Runs one parsed request: KVF_RESP_NOT_CMD when it is not a command
 * (protocol error), KVF_RESP_KEPT when MULTI queued it (obj is the
 * connection's now), else KVF_RESP_DONE. */
int kvf_resp_dispatch(kvf_resp_conn_t *c, void *obj)
{
    kvf_resp_cmd_t m = {c, c->lp->srv, 0, NULL};
    const kvf_resp_def_t *d;

    if (!kvf_resp_args(&m, obj)) {
        return KVF_RESP_NOT_CMD;
    }
    if (m.argc == 0) {
        return KVF_RESP_DONE; /* an empty request is ignored, as Redis does */
    }
    if (kvf_resp_nomem(&m)) {
        atomic_fetch_add(&m.s->stats.pool_full, 1);
        kvf_resp_outs(c, "-ERR value pool full, try again\r\n");
        c->mdirty |= c->multi;
        return KVF_RESP_DONE;
    }
    if (m.s->pwlen > 0 && !c->authed && !kvf_resp_open_cmd(m.argv[0])) {
        kvf_resp_noauth(&m);
        return KVF_RESP_DONE;
    }
    d = kvf_resp_def_find(m.argv[0]);
    if (c->multi && !kvf_resp_txn_ctl(d)) {
        return kvf_resp_txn_queue(&m, d, obj);
    }
    if (kvf_resp_def_check(&m, d) == 0) {
        d->fn(&m);
    }
    return KVF_RESP_DONE;
}
