/*
 * Configuration tables, resolution from file and environment (the only
 * place of the library that reads the environment), the unknown-key
 * checks, and the size/duration parsers used by every command-line flag.
 */
#include "core/config.h"
#include "core/log.h"

#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define KVF_CONFIG_TABLES_MAX 32
#define KVF_CONFIG_FILE_MAX   128

extern char **environ;

static const kvf_config_entry_t kvf_core_config_entries[] = {
    {"log_level", "warn",
     "messages the library logs to stderr: error, warn, info, debug, trace",
     KVF_CONFIG_USER},
    {"log_file", "",
     "append the library's log lines to this file instead of stderr",
     KVF_CONFIG_USER},
    {"drill_selftest", "",
     "wrong or leak: `drill engine` reports a wrong byte or a leak of its "
     "own making, so tests see that the drill catches them",
     KVF_CONFIG_DEBUG},
    {"drill_rounds", "3",
     "rounds of `drill master-partition` (each cuts the leader off etcd, "
     "then the roles swap)",
     KVF_CONFIG_DEBUG},
};

KVF_CONFIG_TABLE(kvf_core_config, "core", kvf_core_config_entries)

/* Keys the Python package reads (kvferry.config.get): declared here so
 * that one table lists them with the library's. */
static const kvf_config_entry_t kvf_python_config_entries[] = {
    {"gpu_sum", "auto",
     "kvferry.kv: how GPU loads and saves checksum their blocks: auto, "
     "fused (by the copy kernel), after (a kernel after the copy), "
     "engines (the copy engines move, a kernel sums)",
     KVF_CONFIG_TUNING},
    {"kv_views", "1",
     "kvferry.kv: 1 = loads from a store node of this host read its "
     "memory in place (store views); 0 = always through a staging buffer",
     KVF_CONFIG_DEBUG},
};

KVF_CONFIG_TABLE(kvf_python_config, "python", kvf_python_config_entries)

/* Environment variables that are not keys (kvf_config_var); a KVF_ one
 * of them is not warned about as an unknown key. */
static const kvf_config_var_t kvf_config_var_list[] = {
    {"KVF_CONFIG", "", "a file of 'key = value' lines read for every key "
     "(the environment and flags override it)", "library"},
    {"KVF_NO_HOST_TUNING", "",
     "1: scripts/setup.sh leaves the host's transparent huge page setting "
     "for shared memory alone", "scripts/setup.sh"},
    {"KVF_BIN", "", "the kvferry command a test starts (CTest sets it)",
     "tests"},
    {"KVF_SRC", "", "the source tree a test reads (CTest sets it)", "tests"},
    {"KVF_TEST_OUT", "", "where the HTML page tests write their pages",
     "tests"},
    {"KVF_ELECT_RUNS", "3", "rounds of test_election's partition core",
     "tests"},
    {"KVF_ENGINE_VENVS", "build-py/engines",
     "where python/integrations/install.sh puts its virtual environments",
     "python/integrations/install.sh"},
    {"KVF_ENGINE_NO_TEST", "",
     "1: python/integrations/install.sh installs without testing",
     "python/integrations/install.sh"},
    {"KVFERRY", "build/kvferry", "the command scripts/main-job.sh runs",
     "scripts/main-job.sh"},
    {"KVFERRY_LIB", "", "the libkvferry.so the Python package loads when "
     "none is bundled with it", "python"},
    {"KVFERRY_BIN", "", "the kvferry command the Python package starts when "
     "none is bundled with it (else the one on PATH)", "python"},
    {"KVFERRY_FIRST_SLICE", "256", "operations of a Python list submitted "
     "before the rest is converted (16..65536), so the engine starts moving "
     "early", "python"},
    {"KVFERRY_PYOPS", "1", "0: the Python package converts operation lists "
     "in Python, without its compiled helper", "python"},
    {"KVFERRY_PYTHON", "python3", "the interpreter `kvferry bench e2e` runs "
     "(one whose kvferry package matches the command)", "command"},
};

#define KVF_CONFIG_NVARS (sizeof(kvf_config_var_list) / sizeof(kvf_config_var_list[0]))

static const kvf_config_table_t *kvf_config_tables[KVF_CONFIG_TABLES_MAX];
static size_t kvf_config_ntables;
static pthread_mutex_t kvf_config_lock = PTHREAD_MUTEX_INITIALIZER;

static struct {
    char key[64];
    char value[256];
} kvf_config_file[KVF_CONFIG_FILE_MAX];
static size_t kvf_config_nfile;
static int kvf_config_file_loaded;

void kvf_config_register(const kvf_config_table_t *table)
{
    size_t i;

    pthread_mutex_lock(&kvf_config_lock);
    for (i = 0; i < kvf_config_ntables; i++) {
        if (kvf_config_tables[i] == table) {
            goto out;
        }
    }
    if (kvf_config_ntables < KVF_CONFIG_TABLES_MAX) {
        kvf_config_tables[kvf_config_ntables++] = table;
    }
out:
    pthread_mutex_unlock(&kvf_config_lock);
}

static char *kvf_config_trim(char *s)
{
    char *e;

    while (isspace((unsigned char)*s)) {
        s++;
    }
    e = s + strlen(s);
    while (e > s && isspace((unsigned char)e[-1])) {
        *--e = '\0';
    }
    return s;
}

/* Loads KVF_CONFIG once; malformed lines are reported and skipped. */
static void kvf_config_load_file(void)
{
    const char *path = getenv("KVF_CONFIG");
    char line[512], *eq, *k, *v;
    FILE *f;
    int lineno = 0;

    if (kvf_config_file_loaded) {
        return;
    }
    kvf_config_file_loaded = 1;
    if (path == NULL || *path == '\0') {
        return;
    }
    f = fopen(path, "r");
    if (f == NULL) {
        kvf_error("cannot open config file %s: %m", path);
        return;
    }
    while (fgets(line, sizeof(line), f) != NULL) {
        lineno++;
        k = kvf_config_trim(line);
        if (*k == '#' || *k == '\0') {
            continue;
        }
        eq = strchr(k, '=');
        if (eq == NULL || kvf_config_nfile >= KVF_CONFIG_FILE_MAX) {
            kvf_error("%s:%d: expected 'key = value'", path, lineno);
            continue;
        }
        *eq = '\0';
        k = kvf_config_trim(k);
        v = kvf_config_trim(eq + 1);
        snprintf(kvf_config_file[kvf_config_nfile].key,
                 sizeof(kvf_config_file[0].key), "%s", k);
        snprintf(kvf_config_file[kvf_config_nfile].value,
                 sizeof(kvf_config_file[0].value), "%s", v);
        kvf_config_nfile++;
    }
    fclose(f);
}

static const kvf_config_entry_t *kvf_config_find(const kvf_config_table_t *t,
                                                 const char *name)
{
    size_t i;

    for (i = 0; i < t->count; i++) {
        if (strcmp(t->entries[i].name, name) == 0) {
            return &t->entries[i];
        }
    }
    return NULL;
}

/* The table that declares name, or NULL. */
static const kvf_config_table_t *kvf_config_owner(const char *name)
{
    const kvf_config_table_t *t = NULL;
    size_t i;

    pthread_mutex_lock(&kvf_config_lock);
    for (i = 0; i < kvf_config_ntables && t == NULL; i++) {
        if (kvf_config_find(kvf_config_tables[i], name) != NULL) {
            t = kvf_config_tables[i];
        }
    }
    pthread_mutex_unlock(&kvf_config_lock);
    return t;
}

/* file < env < default, without the environment check. */
static const char *kvf_config_resolve(const kvf_config_table_t *table,
                                      const char *name)
{
    const kvf_config_entry_t *e;
    char env[96];
    const char *v = NULL;
    size_t i;

    snprintf(env, sizeof(env), "KVF_%s", name);
    for (i = 4; env[i] != '\0'; i++) {
        env[i] = (char)toupper((unsigned char)env[i]);
    }
    v = getenv(env);
    if (v != NULL && *v != '\0') {
        return v;
    }
    pthread_mutex_lock(&kvf_config_lock);
    kvf_config_load_file();
    for (i = 0, v = NULL; i < kvf_config_nfile && v == NULL; i++) {
        if (strcmp(kvf_config_file[i].key, name) == 0) {
            v = kvf_config_file[i].value;
        }
    }
    pthread_mutex_unlock(&kvf_config_lock);
    if (v != NULL) {
        return v;
    }
    e = kvf_config_find(table, name);
    return e != NULL ? e->defval : NULL;
}

const char *kvf_config_home(void)
{
    return getenv("HOME");
}

const char *kvf_config_var(const char *name)
{
    const char *v;
    size_t i;

    for (i = 0; name != NULL && i < KVF_CONFIG_NVARS; i++) {
        if (strcmp(kvf_config_var_list[i].name, name) == 0) {
            v = getenv(name);
            return (v != NULL && *v != '\0') ? v : kvf_config_var_list[i].defval;
        }
    }
    return NULL;
}

void kvf_config_vars(void (*fn)(const kvf_config_var_t *var, void *arg),
                     void *arg)
{
    size_t i;

    for (i = 0; i < KVF_CONFIG_NVARS; i++) {
        fn(&kvf_config_var_list[i], arg);
    }
}

const char *kvf_config_str(const kvf_config_table_t *table, const char *name)
{
    const char *v;

    kvf_config_register(table);
    v = kvf_config_resolve(table, name);
    kvf_config_check_env();
    return v;
}

const char *kvf_config_override(const kvf_config_table_t *table,
                                const char *name)
{
    const kvf_config_entry_t *e = kvf_config_find(table, name);
    const char *v = kvf_config_str(table, name);

    return (e != NULL && v == e->defval) ? NULL : v;
}

const char *kvf_config_get(const char *name)
{
    const kvf_config_table_t *t = kvf_config_owner(name);

    return t != NULL ? kvf_config_str(t, name) : NULL;
}

kvf_status_t kvf_config_u64(const kvf_config_table_t *table, const char *name,
                            uint64_t *value_p)
{
    const char *v = kvf_config_str(table, name);

    if (v == NULL) {
        kvf_error("unknown config key '%s'", name);
        return KVF_ERR_INVALID_PARAM;
    }
    if (kvf_parse_size(v, value_p) != KVF_OK) {
        kvf_error("config key '%s' has bad value '%s'", name, v);
        return KVF_ERR_INVALID_PARAM;
    }
    return KVF_OK;
}

/* Listing order of the components; others follow in registration order. */
static int kvf_config_rank(const char *component)
{
    static const char *const order[] = {
        "core", "engine", "tcp", "shm", "cuda", "fault", "store", "resp",
        "auth", "target", "etcd", "ha",  "ucx", "python"};
    size_t i;

    for (i = 0; i < sizeof(order) / sizeof(order[0]); i++) {
        if (strcmp(order[i], component) == 0) {
            return (int)i;
        }
    }
    return (int)(sizeof(order) / sizeof(order[0]));
}

void kvf_config_keys(void (*fn)(const kvf_config_key_t *key, void *arg),
                     void *arg)
{
    const kvf_config_table_t *tabs[KVF_CONFIG_TABLES_MAX], *t;
    size_t n, i, j;
    kvf_config_key_t k;

    pthread_mutex_lock(&kvf_config_lock);
    n = kvf_config_ntables;
    memcpy(tabs, kvf_config_tables, n * sizeof(tabs[0]));
    pthread_mutex_unlock(&kvf_config_lock);
    for (i = 1; i < n; i++) { /* stable insertion sort by rank */
        t = tabs[i];
        for (j = i; j > 0 && kvf_config_rank(tabs[j - 1]->component) >
                                 kvf_config_rank(t->component);
             j--) {
            tabs[j] = tabs[j - 1];
        }
        tabs[j] = t;
    }
    for (i = 0; i < n; i++) {
        for (j = 0; j < tabs[i]->count; j++) {
            const kvf_config_entry_t *e = &tabs[i]->entries[j];

            k.component = tabs[i]->component;
            k.name = e->name;
            k.value = kvf_config_str(tabs[i], e->name);
            k.defval = e->defval;
            k.help = e->help;
            k.group = e->group;
            fn(&k, arg);
        }
    }
}

unsigned kvf_edit_distance(const char *a, const char *b)
{
    unsigned row[64], prev, cur, best;
    size_t la = strlen(a), lb = strlen(b), i, j;

    if (la >= 64 || lb >= 64) {
        return 255;
    }
    for (j = 0; j <= lb; j++) {
        row[j] = (unsigned)j;
    }
    for (i = 1; i <= la; i++) {
        prev = row[0];
        row[0] = (unsigned)i;
        for (j = 1; j <= lb; j++) {
            cur = row[j];
            best = prev + (a[i - 1] != b[j - 1]);
            best = row[j] + 1 < best ? row[j] + 1 : best;
            best = row[j - 1] + 1 < best ? row[j - 1] + 1 : best;
            row[j] = best;
            prev = cur;
        }
    }
    return row[lb] < 255 ? row[lb] : 255;
}

/* The registered key nearest to name by edit distance, or NULL. */
static const char *kvf_config_nearest(const char *name)
{
    const char *best = NULL;
    unsigned d, dist = 256;
    size_t t, i;

    pthread_mutex_lock(&kvf_config_lock);
    for (t = 0; t < kvf_config_ntables; t++) {
        for (i = 0; i < kvf_config_tables[t]->count; i++) {
            d = kvf_edit_distance(name, kvf_config_tables[t]->entries[i].name);
            if (d < dist) {
                dist = d;
                best = kvf_config_tables[t]->entries[i].name;
            }
        }
    }
    pthread_mutex_unlock(&kvf_config_lock);
    return best;
}

/* Warns about one KVF_ variable `var` ("KVF_NAME=value") naming no key. */
static void kvf_config_check_var(const char *var)
{
    const char *best;
    char name[64], up[96];
    size_t i, len = strcspn(var, "=");

    for (i = 0; i < KVF_CONFIG_NVARS; i++) {
        if (strlen(kvf_config_var_list[i].name) == len &&
            strncmp(var, kvf_config_var_list[i].name, len) == 0) {
            return;
        }
    }
    if (len <= 4 || len - 4 >= sizeof(name)) {
        return;
    }
    for (i = 0; i < len - 4; i++) {
        name[i] = (char)tolower((unsigned char)var[4 + i]);
    }
    name[i] = '\0';
    if (kvf_config_owner(name) != NULL) {
        return;
    }
    best = kvf_config_nearest(name);
    if (best == NULL) {
        kvf_warn("environment: %.*s is not a kvferry key and is ignored",
                 (int)len, var);
        return;
    }
    snprintf(up, sizeof(up), "KVF_%s", best);
    for (i = 4; up[i] != '\0'; i++) {
        up[i] = (char)toupper((unsigned char)up[i]);
    }
    kvf_warn("environment: %.*s is not a kvferry key and is ignored; did "
             "you mean %s? ('kvferry config --all' lists every key)",
             (int)len, var, up);
}

void kvf_config_check_env(void)
{
    static int checked;
    char **e;

    if (__atomic_exchange_n(&checked, 1, __ATOMIC_ACQ_REL)) {
        return;
    }
    kvf_log_init(); /* the level a user set applies to these warnings */
    for (e = environ; e != NULL && *e != NULL; e++) {
        if (strncmp(*e, "KVF_", 4) == 0) {
            kvf_config_check_var(*e);
        }
    }
}

int kvf_config_check_file(void)
{
    const char *best;
    size_t f;
    int unknown = 0;

    kvf_config_check_env();
    pthread_mutex_lock(&kvf_config_lock);
    kvf_config_load_file(); /* the entries stay as loaded from here on */
    pthread_mutex_unlock(&kvf_config_lock);
    for (f = 0; f < kvf_config_nfile; f++) {
        if (kvf_config_owner(kvf_config_file[f].key) != NULL) {
            continue;
        }
        best = kvf_config_nearest(kvf_config_file[f].key);
        kvf_error("config file %s: unknown key '%s'%s%s%s ('kvferry config "
                  "--all' lists every key)",
                  getenv("KVF_CONFIG"), kvf_config_file[f].key,
                  best ? "; did you mean '" : "", best ? best : "",
                  best ? "'?" : "");
        unknown++;
    }
    return unknown;
}

int kvf_config_check(void)
{
    return kvf_config_check_file();
}

kvf_status_t kvf_parse_size(const char *text, uint64_t *bytes_p)
{
    char *end;
    double v;
    uint64_t mult = 1;

    if (text == NULL || *text == '\0') {
        return KVF_ERR_INVALID_PARAM;
    }
    errno = 0;
    v = strtod(text, &end);
    if (errno != 0 || end == text || v < 0) {
        return KVF_ERR_INVALID_PARAM;
    }
    while (*end == ' ') {
        end++;
    }
    switch (toupper((unsigned char)*end)) {
    case '\0':
        break;
    case 'K':
        mult = 1ull << 10;
        end++;
        break;
    case 'M':
        mult = 1ull << 20;
        end++;
        break;
    case 'G':
        mult = 1ull << 30;
        end++;
        break;
    case 'T':
        mult = 1ull << 40;
        end++;
        break;
    case 'B':
        break;
    default:
        return KVF_ERR_INVALID_PARAM;
    }
    if (strcasecmp(end, "") != 0 && strcasecmp(end, "B") != 0 &&
        strcasecmp(end, "iB") != 0) {
        return KVF_ERR_INVALID_PARAM;
    }
    if (v * (double)mult > 1.8e19) {
        return KVF_ERR_INVALID_PARAM;
    }
    *bytes_p = (uint64_t)(v * (double)mult + 0.5);
    return KVF_OK;
}

kvf_status_t kvf_parse_ms(const char *text, uint64_t *ms_p)
{
    char *end;
    double v;

    if (text == NULL || *text == '\0') {
        return KVF_ERR_INVALID_PARAM;
    }
    errno = 0;
    v = strtod(text, &end);
    if (errno != 0 || end == text || v < 0) {
        return KVF_ERR_INVALID_PARAM;
    }
    if (*end == '\0' || strcmp(end, "ms") == 0) {
        *ms_p = (uint64_t)v;
    } else if (strcmp(end, "s") == 0) {
        *ms_p = (uint64_t)(v * 1000.0);
    } else if (strcmp(end, "m") == 0 || strcmp(end, "min") == 0) {
        *ms_p = (uint64_t)(v * 60000.0);
    } else {
        return KVF_ERR_INVALID_PARAM;
    }
    return KVF_OK;
}

void kvf_fmt_size(uint64_t bytes, char *out, size_t outlen)
{
    static const char *units[] = {"B", "KB", "MB", "GB", "TB"};
    double v = (double)bytes;
    int u = 0;

    while (v >= 1024.0 && u < 4) {
        v /= 1024.0;
        u++;
    }
    snprintf(out, outlen, "%.1f %s", v, units[u]);
}
