/*
 * The commands the door answers: GET and SET (queued for the loop's store
 * batch), EXISTS, DEL and UNLINK (run at once), AUTH (constant-time
 * compare), PING, ECHO, QUIT, and the handshake commands redis-cli,
 * redis-py and redis-benchmark send (HELLO 2, COMMAND, CONFIG GET,
 * CLIENT, SELECT). Before AUTH only AUTH, PING, QUIT and HELLO are
 * answered when a password is set.
 */
#include "store/resp/resp_int.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

static int kvf_resp_is(const kvf_ro_str_t *a, const char *name)
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

static void kvf_resp_cmd_auth(kvf_resp_cmd_t *m)
{
    kvf_ro_str_t *pw = m->argv[m->argc - 1];

    if (m->s->pwlen == 0) {
        kvf_resp_outs(m->c, "-ERR AUTH <password> called without any "
                            "password configured for the default user. "
                            "Are you sure your configuration is correct?\r\n");
    } else if (m->argc > 3 ||
               (m->argc == 3 && !kvf_resp_is(m->argv[1], "default"))) {
        kvf_resp_outs(m->c, "-WRONGPASS invalid username-password pair or "
                            "user is disabled.\r\n");
    } else if (kvf_resp_pw_equal(m->s, pw)) {
        m->c->authed = 1;
        kvf_resp_outs(m->c, "+OK\r\n");
    } else {
        kvf_resp_outs(m->c, "-WRONGPASS invalid username-password pair or "
                            "user is disabled.\r\n");
    }
}

static void kvf_resp_cmd_hello(kvf_resp_cmd_t *m)
{
    static const char reply[] =
        "*14\r\n$6\r\nserver\r\n$5\r\nredis\r\n$7\r\nversion\r\n"
        "$5\r\n7.0.0\r\n$5\r\nproto\r\n:2\r\n$2\r\nid\r\n:1\r\n"
        "$4\r\nmode\r\n$10\r\nstandalone\r\n$4\r\nrole\r\n$6\r\nmaster\r\n"
        "$7\r\nmodules\r\n*0\r\n";

    if (m->argc > 1 && !kvf_resp_is(m->argv[1], "2")) {
        kvf_resp_outs(m->c, "-NOPROTO unsupported protocol version\r\n");
    } else {
        kvf_resp_out(m->c, reply, sizeof(reply) - 1);
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

typedef struct kvf_resp_def {
    const char *name;
    int min, max; /* argc bounds, command name included (max 0 = any) */
    void (*fn)(kvf_resp_cmd_t *m);
} kvf_resp_def_t;

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
    {"COMMAND", 1, 0, kvf_resp_cmd_empty},
    {"CONFIG", 2, 0, kvf_resp_cmd_config},
    {"CLIENT", 2, 0, kvf_resp_cmd_ok},
    {"SELECT", 2, 2, kvf_resp_cmd_ok},
    {NULL, 0, 0, NULL},
};

/* Runs one parsed request; 0 when it is not a command (protocol error). */
int kvf_resp_dispatch(kvf_resp_conn_t *c, void *obj)
{
    kvf_ro_arr_t *a = obj;
    kvf_resp_cmd_t m = {c, c->lp->srv, 0, NULL};
    const kvf_resp_def_t *d;
    int i;

    if (a->kind != KVF_RO_ARR) {
        return 0;
    }
    for (i = 0; i < a->argc; i++) {
        if (a->argv[i] == NULL || *(int *)a->argv[i] != KVF_RO_STR) {
            return 0;
        }
    }
    if (a->argc == 0) {
        return 1; /* an empty request is ignored, as Redis does */
    }
    m.argc = a->argc;
    m.argv = (kvf_ro_str_t **)a->argv;
    if (m.s->pwlen > 0 && !c->authed && !kvf_resp_open_cmd(m.argv[0])) {
        kvf_resp_outs(c, "-NOAUTH Authentication required.\r\n");
        return 1;
    }
    for (d = kvf_resp_defs; d->name != NULL; d++) {
        if (kvf_resp_is(m.argv[0], d->name)) {
            break;
        }
    }
    if (d->name == NULL) {
        char name[64];
        size_t n = m.argv[0]->len < 63 ? m.argv[0]->len : 63;

        memcpy(name, m.argv[0]->p != NULL ? m.argv[0]->p : "", n);
        name[n] = 0;
        kvf_resp_err(c, "-ERR unknown command '%s'", name);
    } else if (m.argc < d->min || (d->max > 0 && m.argc > d->max)) {
        kvf_resp_err(c, "-ERR wrong number of arguments for '%s' command",
                     d->name);
    } else {
        d->fn(&m);
    }
    return 1;
}
