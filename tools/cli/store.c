/*
 * Store client commands: `kvferry put KEY FILE|-`, `get KEY [FILE]`,
 * `rm KEY`, `exists KEY`, `ls [PREFIX]`, each with --master HOST:PORT
 * (default: config key `master`). put and get register their buffer with
 * the client's engine, so the bytes go straight between it and the node.
 * Exit status: 0 done, 1 failed (or `exists`: absent), 2 usage.
 */
#include "tools/cli/cli.h"
#include "core/sock.h"
#include "tools/cli/net.h"
#include "tools/cli/opts.h"

#include <kvferry/config.h>

#include <kvferry/store.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

typedef struct kvf_scli {
    const char *master;
    unsigned replicas;
    unsigned flags;
    int pin;
    int argi;     /* first positional argument */
    char cmd[16]; /* "put", for the messages */
} kvf_scli_t;

/* The master the command talks to: --master, or the config's. */
static const char *kvf_scli_master(const kvf_scli_t *o)
{
    const char *m = o->master != NULL ? o->master : kvf_config_get("master");

    return m != NULL ? m : "127.0.0.1:17800";
}

/* Is anything listening at the master's address? */
static kvf_status_t kvf_scli_probe(const char *master)
{
    char host[KVF_HOST_MAX];
    uint16_t port;
    kvf_status_t s;
    int fd;

    if (strchr(master, ',') != NULL ||
        kvf_sock_parse_addr(master, host, sizeof(host), &port) != KVF_OK) {
        return KVF_OK; /* a list of masters, or wrong: the library's */
    }
    s = kvf_sock_connect(host, port, 2000, &fd);
    if (s == KVF_OK) {
        close(fd);
    }
    return s;
}

/* usage: "kvferry CMD [options] ARGS\nwhat it does"; split into a spec. */
static void kvf_scli_spec(const char *usage, char *line, size_t len,
                          kvf_cmd_spec_t *spec)
{
    const char *nl = strchr(usage, '\n');

    snprintf(line, len, "%.*s", nl ? (int)(nl - usage) : (int)strlen(usage),
             usage);
    spec->usage = line;
    spec->about = (nl && nl[1]) ? nl + 1 : NULL;
    spec->in_order = 1;
}

static int kvf_scli_parse(int argc, char **argv, kvf_scli_t *o,
                          const char *usage)
{
    const kvf_opt_t opts[] = {
        {"master", 0, KVF_OPT_STR, &o->master, "HOST:PORT", "the store master",
         "config `master`, 127.0.0.1:17800"},
        {"replicas", 0, KVF_OPT_UINT, &o->replicas, "N",
         "copies on distinct nodes", "the master's", .min = 1,
         .max = KVF_STORE_REPLICA_MAX},
        {"pin", 0, KVF_OPT_FLAG, &o->pin, NULL, "never evict the object"},
        {0},
    };
    const kvf_opt_t master_only[] = {opts[0], {0}};
    char line[256];
    kvf_cmd_spec_t spec = {0};
    int rc;

    memset(o, 0, sizeof(*o));
    sscanf(usage, "kvferry %15s", o->cmd);
    kvf_scli_spec(usage, line, sizeof(line), &spec);
    /* --replicas and --pin are put's */
    spec.opts = strncmp(line, "kvferry put ", 12) == 0 ? opts : master_only;
    rc = kvf_opts_parse(&spec, argc, argv, &o->argi);
    if (o->pin) {
        o->flags |= KVF_STORE_PIN;
    }
    return rc;
}

/* Wrong positional arguments: one line naming the usage; returns 2. */
static int kvf_scli_args(const char *usage)
{
    char line[256];
    kvf_cmd_spec_t spec = {0};

    kvf_scli_spec(usage, line, sizeof(line), &spec);
    return kvf_opts_error(&spec, "usage: %s", line);
}

static kvf_store_h kvf_scli_connect(const kvf_scli_t *o)
{
    kvf_store_params_t p = {0};
    kvf_store_h st;
    kvf_status_t s;

    if (o->master != NULL) {
        p.field_mask = KVF_STORE_PARAM_MASTER;
        p.master = o->master;
    }
    /* a master that is not running: one line, before the library's */
    if (kvf_scli_probe(kvf_scli_master(o)) != KVF_OK) {
        kvf_cli_store_error(o->cmd, "", KVF_ERR_CONNECT, kvf_scli_master(o));
        return NULL;
    }
    s = kvf_store_connect(&p, &st);
    if (s != KVF_OK) {
        kvf_cli_store_error(o->cmd, "", s, kvf_scli_master(o));
        return NULL;
    }
    return st;
}

static void *kvf_scli_map(size_t len)
{
    void *p = mmap(NULL, len ? len : 1, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

    return (p == MAP_FAILED) ? NULL : p;
}

/* Reads a whole file (or stdin for "-") into a fresh mapping. */
static void *kvf_scli_slurp(const char *path, size_t *len_p, size_t *cap_p)
{
    size_t cap = 1 << 20, len = 0;
    FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
    void *buf, *nb;
    size_t n;

    if (f == NULL) {
        fprintf(stderr, "kvferry put: %s: %s\n", path, strerror(errno));
        return NULL;
    }
    buf = kvf_scli_map(cap);
    while (buf != NULL) {
        n = fread((char *)buf + len, 1, cap - len, f);
        len += n;
        if (n == 0) {
            break;
        }
        if (len == cap) {
            nb = mremap(buf, cap, cap * 2, MREMAP_MAYMOVE);
            buf = (nb == MAP_FAILED) ? NULL : nb;
            cap *= 2;
        }
    }
    if (f != stdin) {
        fclose(f);
    }
    if (buf == NULL) {
        fprintf(stderr, "kvferry put: out of memory reading %s\n", path);
        return NULL;
    }
    *len_p = len;
    *cap_p = cap;
    return buf;
}

int kvf_cmd_put(int argc, char **argv)
{
    static const char usage[] = "kvferry put [options] KEY FILE|-\n"
                                "Stores FILE (or stdin for -) under KEY.";
    kvf_store_put_opts_t po = {0};
    size_t len = 0, cap = 0;
    kvf_region_h reg;
    kvf_store_h st;
    kvf_scli_t o;
    kvf_status_t s;
    void *buf;
    int rc;

    if ((rc = kvf_scli_parse(argc, argv, &o, usage)) >= 0) {
        return rc;
    }
    if (argc - o.argi != 2) {
        return kvf_scli_args(usage);
    }
    buf = kvf_scli_slurp(argv[o.argi + 1], &len, &cap);
    if (buf == NULL) {
        return KVF_CLI_FAIL;
    }
    st = kvf_scli_connect(&o);
    if (st == NULL) {
        munmap(buf, cap);
        return KVF_CLI_FAIL;
    }
    po.replicas = o.replicas;
    po.flags = o.flags;
    s = kvf_engine_reg(kvf_store_engine(st), buf, cap, KVF_MEM_HOST, 0, &reg);
    if (s == KVF_OK) {
        s = kvf_store_put(st, argv[o.argi], buf, len, &po);
        kvf_engine_dereg(kvf_store_engine(st), reg);
    }
    kvf_store_disconnect(st);
    munmap(buf, cap);
    if (s != KVF_OK) {
        kvf_cli_store_error("put", argv[o.argi], s, kvf_scli_master(&o));
        return KVF_CLI_FAIL;
    }
    return KVF_CLI_OK;
}

int kvf_cmd_get(int argc, char **argv)
{
    static const char usage[] = "kvferry get [options] KEY [FILE]\n"
                                "Writes the object to FILE, or to stdout.";
    kvf_store_info_t info;
    kvf_region_h reg;
    size_t got = 0, cap;
    kvf_store_h st;
    kvf_scli_t o;
    kvf_status_t s;
    void *buf = NULL;
    FILE *f;
    int rc;

    if ((rc = kvf_scli_parse(argc, argv, &o, usage)) >= 0) {
        return rc;
    }
    if (argc - o.argi < 1 || argc - o.argi > 2) {
        return kvf_scli_args(usage);
    }
    st = kvf_scli_connect(&o);
    if (st == NULL) {
        return KVF_CLI_FAIL;
    }
    s = kvf_store_query(st, argv[o.argi], &info);
    cap = (s == KVF_OK) ? (size_t)info.size : 0;
    if (s == KVF_OK && (buf = kvf_scli_map(cap)) == NULL) {
        s = KVF_ERR_NO_MEMORY;
    }
    if (s == KVF_OK) {
        s = kvf_engine_reg(kvf_store_engine(st), buf, cap ? cap : 1,
                           KVF_MEM_HOST, 0, &reg);
        if (s == KVF_OK) {
            s = kvf_store_read(st, argv[o.argi], &info, buf, cap, &got, 0);
            kvf_engine_dereg(kvf_store_engine(st), reg);
        }
    }
    kvf_store_disconnect(st);
    if (s == KVF_OK) {
        f = (argc - o.argi == 2) ? fopen(argv[o.argi + 1], "wb") : stdout;
        if (f == NULL || fwrite(buf, 1, got, f) != got || fflush(f) != 0) {
            fprintf(stderr, "kvferry get: cannot write the output: %s\n",
                    strerror(errno));
            s = KVF_ERR_IO;
        }
        if (f != NULL && f != stdout) {
            fclose(f);
        }
    } else {
        kvf_cli_store_error("get", argv[o.argi], s, kvf_scli_master(&o));
    }
    if (buf != NULL) {
        munmap(buf, cap ? cap : 1);
    }
    return (s == KVF_OK) ? KVF_CLI_OK : KVF_CLI_FAIL;
}

int kvf_cmd_rm(int argc, char **argv)
{
    static const char usage[] =
        "kvferry rm [options] KEY...\n"
        "Removes keys: a key being read goes at once, its space when the "
        "read ends.";
    kvf_store_h st;
    kvf_scli_t o;
    kvf_status_t s;
    int rc, i, fail = 0;

    if ((rc = kvf_scli_parse(argc, argv, &o, usage)) >= 0) {
        return rc;
    }
    if (argc - o.argi < 1) {
        return kvf_scli_args(usage);
    }
    st = kvf_scli_connect(&o);
    if (st == NULL) {
        return KVF_CLI_FAIL;
    }
    for (i = o.argi; i < argc; i++) {
        s = kvf_store_remove(st, argv[i]);
        if (s != KVF_OK) {
            fprintf(stderr, "kvferry rm %s: %s (%s)\n", argv[i],
                    kvf_status_str(s), kvf_status_name(s));
            fail = 1;
        }
    }
    kvf_store_disconnect(st);
    return fail ? KVF_CLI_FAIL : KVF_CLI_OK;
}

int kvf_cmd_exists(int argc, char **argv)
{
    static const char usage[] =
        "kvferry exists [options] KEY\n"
        "Prints yes or no; exit status 0 when the key is stored.";
    kvf_store_h st;
    kvf_scli_t o;
    kvf_status_t s;
    int rc;

    if ((rc = kvf_scli_parse(argc, argv, &o, usage)) >= 0) {
        return rc;
    }
    if (argc - o.argi != 1) {
        return kvf_scli_args(usage);
    }
    st = kvf_scli_connect(&o);
    if (st == NULL) {
        return KVF_CLI_FAIL;
    }
    s = kvf_store_exists(st, argv[o.argi]);
    kvf_store_disconnect(st);
    if (s != KVF_OK && s != KVF_ERR_NO_KEY && s != KVF_ERR_NOT_READY) {
        fprintf(stderr, "kvferry exists: %s\n", kvf_status_str(s));
        return KVF_CLI_FAIL;
    }
    printf("%s\n", s == KVF_OK ? "yes" : "no");
    return s == KVF_OK ? KVF_CLI_OK : KVF_CLI_FAIL;
}

static void kvf_scli_ls_one(const kvf_store_entry_t *e, void *arg)
{
    (*(size_t *)arg)++;
    printf("%12lu %3u %-9s %s\n", (unsigned long)e->size, e->replicas,
           e->committed ? "committed" : "pending", e->key);
}

int kvf_cmd_ls(int argc, char **argv)
{
    static const char usage[] =
        "kvferry ls [options] [PREFIX]\n"
        "Lists stored keys; columns: size, replicas, state, key.";
    kvf_store_h st;
    kvf_scli_t o;
    kvf_status_t s;
    size_t n = 0;
    int rc;

    if ((rc = kvf_scli_parse(argc, argv, &o, usage)) >= 0) {
        return rc;
    }
    if (argc - o.argi > 1) {
        return kvf_scli_args(usage);
    }
    st = kvf_scli_connect(&o);
    if (st == NULL) {
        return KVF_CLI_FAIL;
    }
    s = kvf_store_list(st, argc - o.argi == 1 ? argv[o.argi] : NULL, 0,
                       kvf_scli_ls_one, &n);
    kvf_store_disconnect(st);
    if (s != KVF_OK) {
        fprintf(stderr, "kvferry ls: %s\n", kvf_status_str(s));
        return KVF_CLI_FAIL;
    }
    return KVF_CLI_OK;
}
